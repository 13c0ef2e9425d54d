//! Kubernetes resource quantities (`100m`, `1.5Gi`, `2e3`) as exact decimal values, for the CEL
//! quantity library and `x-kubernetes-int-or-string`-style checks.
//!
//! Owns: parsing and exact arithmetic/comparison. Must never: round a value silently — results
//! that do not fit are reported as `None`.

use std::cmp::Ordering;
use std::fmt;

/// An exact quantity: `mantissa × 10^exp10`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Quantity {
    mantissa: i128,
    exp10: i32,
}

/// Why a string is not a quantity.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum QuantityError {
    /// The number part is missing or malformed.
    #[error(
        "quantities must match the regular expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'"
    )]
    Format,
    /// The suffix is not one Kubernetes knows.
    #[error("unable to parse quantity's suffix")]
    Suffix,
    /// The value does not fit.
    #[error("quantity is too large")]
    TooLarge,
}

impl Quantity {
    /// Parses a quantity as `resource.ParseQuantity` does.
    pub fn parse(s: &str) -> Result<Quantity, QuantityError> {
        let (negative, body) = match s.as_bytes().first() {
            Some(b'-') => (true, &s[1..]),
            Some(b'+') => (false, &s[1..]),
            _ => (false, s),
        };
        let num_end = body
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(body.len());
        let (num, suffix) = body.split_at(num_end);
        if num.is_empty() || num == "." || num.matches('.').count() > 1 {
            return Err(QuantityError::Format);
        }
        let (int_part, frac_part) = num.split_once('.').unwrap_or((num, ""));
        let mut mantissa: i128 = 0;
        for c in int_part.chars().chain(frac_part.chars()) {
            mantissa = mantissa
                .checked_mul(10)
                .and_then(|m| m.checked_add(i128::from(c as u8 - b'0')))
                .ok_or(QuantityError::TooLarge)?;
        }
        let mut exp10 = -(frac_part.len() as i32);
        let binary: u32 = match suffix {
            "Ki" => 1,
            "Mi" => 2,
            "Gi" => 3,
            "Ti" => 4,
            "Pi" => 5,
            "Ei" => 6,
            _ => 0,
        };
        if binary > 0 {
            mantissa = mantissa
                .checked_mul(1024_i128.pow(binary))
                .ok_or(QuantityError::TooLarge)?;
        } else {
            exp10 += match suffix {
                "" => 0,
                "n" => -9,
                "u" => -6,
                "m" => -3,
                "k" => 3,
                "M" => 6,
                "G" => 9,
                "T" => 12,
                "P" => 15,
                "E" => 18,
                s if s.starts_with(['e', 'E']) => {
                    let digits = &s[1..];
                    let unsigned = digits.trim_start_matches(['+', '-']);
                    if unsigned.is_empty()
                        || digits.len() - unsigned.len() > 1
                        || !unsigned.chars().all(|c| c.is_ascii_digit())
                    {
                        return Err(QuantityError::Suffix);
                    }
                    digits.parse::<i32>().map_err(|_| QuantityError::TooLarge)?
                }
                _ => return Err(QuantityError::Suffix),
            };
        }
        if negative {
            mantissa = -mantissa;
        }
        Ok(Quantity { mantissa, exp10 }.normalized())
    }

    /// An integer quantity.
    pub fn from_i64(v: i64) -> Quantity {
        Quantity {
            mantissa: i128::from(v),
            exp10: 0,
        }
        .normalized()
    }

    fn normalized(mut self) -> Quantity {
        if self.mantissa == 0 {
            self.exp10 = 0;
            return self;
        }
        while self.mantissa % 10 == 0 {
            self.mantissa /= 10;
            self.exp10 += 1;
        }
        self
    }

    /// The value as an `i64`, when it is an integer that fits.
    pub fn as_i64(&self) -> Option<i64> {
        if self.exp10 < 0 {
            return None;
        }
        let scale = 10_i128.checked_pow(self.exp10 as u32)?;
        i64::try_from(self.mantissa.checked_mul(scale)?).ok()
    }

    /// The value as an `f64` (approximate).
    pub fn as_f64(&self) -> f64 {
        self.mantissa as f64 * 10f64.powi(self.exp10)
    }

    /// -1, 0 or 1.
    pub fn sign(&self) -> i64 {
        self.mantissa.signum() as i64
    }

    /// The negated value.
    pub fn negate(&self) -> Quantity {
        Quantity {
            mantissa: -self.mantissa,
            exp10: self.exp10,
        }
    }

    /// Both mantissas scaled to the smaller exponent, or `None` on overflow.
    fn aligned(&self, other: &Quantity) -> Option<(i128, i128, i32)> {
        let exp = self.exp10.min(other.exp10);
        let a = self
            .mantissa
            .checked_mul(10_i128.checked_pow((self.exp10 - exp) as u32)?)?;
        let b = other
            .mantissa
            .checked_mul(10_i128.checked_pow((other.exp10 - exp) as u32)?)?;
        Some((a, b, exp))
    }

    /// The exact sum, or `None` on overflow.
    pub fn add(&self, other: &Quantity) -> Option<Quantity> {
        let (a, b, exp10) = self.aligned(other)?;
        Some(
            Quantity {
                mantissa: a.checked_add(b)?,
                exp10,
            }
            .normalized(),
        )
    }

    /// Orders two quantities by value.
    pub fn cmp_value(&self, other: &Quantity) -> Ordering {
        match self.aligned(other) {
            Some((a, b, _)) => a.cmp(&b),
            None => self.as_f64().total_cmp(&other.as_f64()),
        }
    }
}

impl fmt::Display for Quantity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.exp10 >= 0 {
            match self.as_i64() {
                Some(v) => write!(f, "{v}"),
                None => write!(f, "{}e{}", self.mantissa, self.exp10),
            }
        } else {
            // Canonical Kubernetes form for fractions: the smallest of m/u/n that is exact.
            for (suffix, exp) in [("m", -3), ("u", -6), ("n", -9)] {
                if self.exp10 >= exp {
                    let scaled = self.mantissa * 10_i128.pow((self.exp10 - exp) as u32);
                    return write!(f, "{scaled}{suffix}");
                }
            }
            write!(f, "{}e{}", self.mantissa, self.exp10)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_like_kubernetes() {
        let cases: &[(&str, Option<f64>)] = &[
            ("1", Some(1.0)),
            ("100m", Some(0.1)),
            ("1.5Gi", Some(1.5 * 1024.0 * 1024.0 * 1024.0)),
            ("2k", Some(2000.0)),
            ("-3M", Some(-3e6)),
            ("1e3", Some(1000.0)),
            ("1E-3", Some(0.001)),
            ("+5", Some(5.0)),
            ("", None),
            ("abc", None),
            ("1Zi", None),
            ("1.2.3", None),
            ("1e", None),
        ];
        for (s, want) in cases {
            let got = Quantity::parse(s).ok().map(|q| q.as_f64());
            match (got, want) {
                (Some(g), Some(w)) => {
                    assert!((g - w).abs() < 1e-9 * w.abs().max(1.0), "{s}: {g} != {w}")
                }
                (None, None) => {}
                _ => panic!("{s}: got {got:?}, want {want:?}"),
            }
        }
    }

    #[test]
    fn compares_and_adds_exactly() {
        let q = |s| Quantity::parse(s).unwrap();
        assert_eq!(q("1Ki").cmp_value(&q("1024")), Ordering::Equal);
        assert_eq!(q("1G").cmp_value(&q("1Gi")), Ordering::Less);
        assert_eq!(
            q("1").add(&q("500m")).unwrap().cmp_value(&q("1.5")),
            Ordering::Equal
        );
        assert_eq!(q("2k").as_i64(), Some(2000));
        assert_eq!(q("1.5").as_i64(), None);
        assert_eq!(q("1500m").to_string(), "1500m");
        assert_eq!(q("3k").to_string(), "3000");
    }
}
