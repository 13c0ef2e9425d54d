//! Mann–Whitney U test of canary against baseline per-interval samples (off by default).
//!
//! Owns the statistics only: ranks with ties averaged, the normal approximation with tie and
//! continuity corrections, and a one-sided p-value for "the canary is worse". Kayenta's judge
//! uses the same test over raw samples; sluice applies it over minutes of per-interval values
//! (one value per interval, intervals not overlapping), so each sample is an interval's rate or
//! ratio rather than a single request. Never performs I/O and never reads the clock.

/// Which side of the distribution is worse for the canary.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Worse {
    /// Larger values are worse (error ratios, latency).
    Higher,
    /// Smaller values are worse (throughput, success ratios).
    Lower,
}

/// The outcome of one test.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct UTest {
    /// U statistic of the canary sample.
    pub u: f64,
    /// Standardised U (continuity and tie corrected), positive when the canary ranks higher.
    pub z: f64,
    /// One-sided p-value that the canary is not worse than the baseline.
    pub p_worse: f64,
    /// Canary sample size.
    pub n_canary: usize,
    /// Baseline sample size.
    pub n_baseline: usize,
    /// Median of the canary sample.
    pub canary_median: f64,
    /// Median of the baseline sample.
    pub baseline_median: f64,
}

/// Standard normal cumulative distribution (Abramowitz–Stegun 7.1.26 for erf, |error| < 1.5e-7).
pub fn normal_cdf(x: f64) -> f64 {
    let t = 1.0 / (1.0 + 0.327_591_1 * (x.abs() / std::f64::consts::SQRT_2));
    let poly = t
        * (0.254_829_592
            + t * (-0.284_496_736
                + t * (1.421_413_741 + t * (-1.453_152_027 + t * 1.061_405_429))));
    let erf = 1.0 - poly * (-(x * x) / 2.0).exp();
    if x >= 0.0 {
        0.5 * (1.0 + erf)
    } else {
        0.5 * (1.0 - erf)
    }
}

fn median(values: &[f64]) -> f64 {
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// Tests whether `canary` is stochastically worse than `baseline`. NaN and infinite values are
/// dropped. Returns `None` when either sample is empty or every value is tied (no information).
pub fn mann_whitney_u(canary: &[f64], baseline: &[f64], worse: Worse) -> Option<UTest> {
    let a: Vec<f64> = canary.iter().copied().filter(|v| v.is_finite()).collect();
    let b: Vec<f64> = baseline.iter().copied().filter(|v| v.is_finite()).collect();
    let (n1, n2) = (a.len(), b.len());
    if n1 == 0 || n2 == 0 {
        return None;
    }
    let mut all: Vec<(f64, bool)> = a
        .iter()
        .map(|&v| (v, true))
        .chain(b.iter().map(|&v| (v, false)))
        .collect();
    all.sort_by(|x, y| x.0.total_cmp(&y.0));
    let n = all.len();
    let mut rank_sum_canary = 0.0;
    let mut tie_term = 0.0;
    let mut i = 0;
    while i < n {
        let mut j = i;
        while j + 1 < n && all[j + 1].0 == all[i].0 {
            j += 1;
        }
        // Positions i..=j share the average rank.
        let rank = (i + j) as f64 / 2.0 + 1.0;
        let tied = (j - i + 1) as f64;
        tie_term += tied * tied * tied - tied;
        rank_sum_canary += rank * all[i..=j].iter().filter(|(_, c)| *c).count() as f64;
        i = j + 1;
    }
    let (n1f, n2f, nf) = (n1 as f64, n2 as f64, n as f64);
    let u = rank_sum_canary - n1f * (n1f + 1.0) / 2.0;
    let mean = n1f * n2f / 2.0;
    let variance = n1f * n2f / 12.0 * ((nf + 1.0) - tie_term / (nf * (nf - 1.0)));
    if variance.is_nan() || variance <= 0.0 {
        return None;
    }
    let diff = u - mean;
    let corrected = if diff > 0.0 {
        diff - 0.5
    } else if diff < 0.0 {
        diff + 0.5
    } else {
        0.0
    };
    let z = corrected / variance.sqrt();
    let p_worse = match worse {
        Worse::Higher => 1.0 - normal_cdf(z),
        Worse::Lower => normal_cdf(z),
    };
    Some(UTest {
        u,
        z,
        p_worse,
        n_canary: n1,
        n_baseline: n2,
        canary_median: median(&a),
        baseline_median: median(&b),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn normal_cdf_matches_tables() {
        let cases = [
            (0.0, 0.5),
            (1.0, 0.841_344_7),
            (1.96, 0.975_002_1),
            (-1.645, 0.049_984_6),
            (3.0, 0.998_650_1),
        ];
        for (x, want) in cases {
            assert!(
                (normal_cdf(x) - want).abs() < 1e-6,
                "Φ({x}) = {}",
                normal_cdf(x)
            );
        }
    }

    #[test]
    fn u_statistic_and_p_values() {
        // Textbook example: no overlap, canary all higher. U = n1·n2 = 25.
        let high = [6.0, 7.0, 8.0, 9.0, 10.0];
        let low = [1.0, 2.0, 3.0, 4.0, 5.0];
        let t = mann_whitney_u(&high, &low, Worse::Higher).unwrap();
        assert_eq!(t.u, 25.0);
        assert!(t.p_worse < 0.01, "{t:?}");
        let t = mann_whitney_u(&high, &low, Worse::Lower).unwrap();
        assert!(t.p_worse > 0.99, "{t:?}");

        // Same distribution interleaved: no evidence either way.
        let a = [1.0, 3.0, 5.0, 7.0, 9.0, 11.0];
        let b = [2.0, 4.0, 6.0, 8.0, 10.0, 12.0];
        let t = mann_whitney_u(&a, &b, Worse::Higher).unwrap();
        assert!(t.p_worse > 0.2, "{t:?}");

        // Ties count one half: U for [1,2,2] vs [2,3] is 1 (each canary 2 ties one baseline 2).
        let t = mann_whitney_u(&[1.0, 2.0, 2.0], &[2.0, 3.0], Worse::Higher).unwrap();
        assert_eq!(t.u, 1.0);
        assert_eq!((t.canary_median, t.baseline_median), (2.0, 2.5));
    }

    #[test]
    fn degenerate_samples_give_no_result() {
        let cases: [(&[f64], &[f64]); 4] = [
            (&[], &[1.0]),
            (&[1.0], &[]),
            (&[2.0, 2.0], &[2.0, 2.0]),
            (&[f64::NAN], &[1.0, 2.0]),
        ];
        for (a, b) in cases {
            assert!(mann_whitney_u(a, b, Worse::Higher).is_none(), "{a:?} {b:?}");
        }
    }
}
