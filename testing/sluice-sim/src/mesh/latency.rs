//! Latency distributions: a log-normal fitted to a version's p50 and p99, bucketed with the
//! bounds Istio uses for `istio_request_duration_milliseconds`. Pure.

/// Istio's default `istio_request_duration_milliseconds` bucket bounds (ms); `+Inf` follows.
pub const ISTIO_BUCKETS_MS: [f64; 19] = [
    0.5, 1.0, 5.0, 10.0, 25.0, 50.0, 100.0, 250.0, 500.0, 1000.0, 2500.0, 5000.0, 10000.0, 30000.0,
    60000.0, 300000.0, 600000.0, 1800000.0, 3600000.0,
];

/// z of the 99th percentile of the standard normal distribution.
const Z99: f64 = 2.326_347_874;

/// A log-normal latency distribution.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LogNormal {
    mu: f64,
    sigma: f64,
}

impl LogNormal {
    /// The log-normal with this median and 99th percentile (ms; p99 >= p50 > 0).
    pub fn from_p50_p99(p50: f64, p99: f64) -> Self {
        let mu = p50.max(1e-6).ln();
        let sigma = ((p99.max(p50).max(1e-6)).ln() - mu) / Z99;
        Self { mu, sigma }
    }

    /// Share of requests at or below `ms`.
    pub fn cdf(&self, ms: f64) -> f64 {
        if ms <= 0.0 {
            return 0.0;
        }
        if self.sigma <= 1e-12 {
            return if ms.ln() >= self.mu { 1.0 } else { 0.0 };
        }
        normal_cdf((ms.ln() - self.mu) / self.sigma)
    }

    /// Mean latency (ms), for `_sum`.
    pub fn mean(&self) -> f64 {
        (self.mu + self.sigma * self.sigma / 2.0).exp()
    }
}

/// Standard normal CDF via erf (Abramowitz–Stegun 7.1.26, |error| < 1.5e-7).
fn normal_cdf(z: f64) -> f64 {
    let x = z / std::f64::consts::SQRT_2;
    let t = 1.0 / (1.0 + 0.327_591_1 * x.abs());
    let poly = t
        * (0.254_829_592
            + t * (-0.284_496_736
                + t * (1.421_413_741 + t * (-1.453_152_027 + t * 1.061_405_429))));
    let erf = 1.0 - poly * (-x * x).exp();
    let erf = if x >= 0.0 { erf } else { -erf };
    0.5 * (1.0 + erf)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_round_trip_table() {
        // (p50, p99)
        for (p50, p99) in [(20.0, 80.0), (5.0, 5.0), (100.0, 1000.0), (1.0, 3.0)] {
            let d = LogNormal::from_p50_p99(p50, p99);
            if p99 > p50 {
                assert!(
                    (d.cdf(p50) - 0.5).abs() < 1e-3,
                    "p50 {p50}/{p99}: {}",
                    d.cdf(p50)
                );
                assert!(
                    (d.cdf(p99) - 0.99).abs() < 1e-3,
                    "p99 {p50}/{p99}: {}",
                    d.cdf(p99)
                );
            } else {
                // A point mass: everything at exactly p50.
                assert_eq!((d.cdf(p50 * 0.99), d.cdf(p50)), (0.0, 1.0));
            }
            let mut last = 0.0;
            for b in ISTIO_BUCKETS_MS {
                let c = d.cdf(b);
                assert!(c >= last, "cdf must not decrease");
                last = c;
            }
            assert!(d.mean() >= p50 * 0.999);
        }
    }

    #[test]
    fn normal_cdf_known_points() {
        for (z, want) in [
            (0.0, 0.5),
            (1.0, 0.841_344_7),
            (-1.96, 0.024_997_9),
            (Z99, 0.99),
        ] {
            assert!((normal_cdf(z) - want).abs() < 1e-6, "z={z}");
        }
    }
}
