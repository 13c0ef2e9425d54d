//! Human-written durations in scenario files and configuration (`"250ms"`, `"30s"`, `"2m"`, `"1h"`).
//! Owns parsing and (de)serialising them; never reads a clock.

use std::time::Duration;

/// A duration that could not be parsed.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error(
    "invalid duration {input:?}: expected a number followed by ms, s, m or h (for example \"30s\")"
)]
pub struct DurationError {
    /// The text that was given.
    pub input: String,
}

impl DurationError {
    /// Bounded error category for metrics and logs.
    pub fn category(&self) -> &'static str {
        "InvalidDuration"
    }
}

/// Parses `"250ms"`, `"1.5s"`, `"30s"`, `"2m"` or `"1h"`; a bare number means seconds.
pub fn parse(input: &str) -> Result<Duration, DurationError> {
    let err = || DurationError {
        input: input.to_string(),
    };
    let s = input.trim();
    let split = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    let (number, unit) = s.split_at(split);
    let value: f64 = number.parse().map_err(|_| err())?;
    let seconds = match unit.trim() {
        "ms" => value / 1000.0,
        "" | "s" => value,
        "m" => value * 60.0,
        "h" => value * 3600.0,
        _ => return Err(err()),
    };
    if !seconds.is_finite() || seconds < 0.0 {
        return Err(err());
    }
    Ok(Duration::from_secs_f64(seconds))
}

/// Serde adapter for `Duration` fields written as human durations.
pub mod serde_human {
    use serde::{Deserialize, Deserializer, Serializer};
    use std::time::Duration;

    /// Serialises as milliseconds with an `ms` suffix, which [`super::parse`] reads back exactly.
    pub fn serialize<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&format!("{}ms", d.as_millis()))
    }

    /// Reads a string such as `"30s"` or a bare number of seconds.
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Text(String),
            Seconds(f64),
        }
        match Raw::deserialize(d)? {
            Raw::Text(t) => super::parse(&t).map_err(serde::de::Error::custom),
            Raw::Seconds(n) if n >= 0.0 && n.is_finite() => Ok(Duration::from_secs_f64(n)),
            Raw::Seconds(n) => Err(serde::de::Error::custom(format!(
                "invalid duration {n}: must be a non-negative number of seconds"
            ))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_table() {
        let cases: &[(&str, Option<u64>)] = &[
            ("250ms", Some(250)),
            ("30s", Some(30_000)),
            ("1.5s", Some(1_500)),
            ("2m", Some(120_000)),
            ("1h", Some(3_600_000)),
            ("7", Some(7_000)),
            (" 3s ", Some(3_000)),
            ("", None),
            ("s", None),
            ("3 days", None),
            ("-1s", None),
        ];
        for (input, want) in cases {
            let got = parse(input).ok().map(|d| d.as_millis() as u64);
            assert_eq!(got, *want, "input {input:?}");
        }
    }
}
