//! Sequential tests on counts accumulated since a step began: the default judgement of the
//! built-in canary gates (errors, slow requests, applied share) at production settings.
//!
//! Owns the statistics only: per-interval counts in, a [`SequentialOutcome`] out. Never performs
//! I/O and never reads the clock; the engine feeds it one aligned per-interval reading per
//! analysis interval (`increase(...[interval])` at the interval grid, fetched for the whole step
//! in one range query per template and tick).
//!
//! # Errors and slow requests: a one-sided SPRT on the canary's bad-request count
//!
//! In interval `i` the canary served `n_c` requests of which `x_c` were bad (5xx or a gRPC server
//! error, or slower than the stable's p99 bucket bound); the stable served `n_s` with `x_s` bad.
//! The stable's rate, accumulated since the step began, is taken as
//! `r = max((X_s + √X_s + 1) / N_s, floor)`: an
//! upper bound of the stable's rate (its noise early in a step never counts against the canary),
//! and at least the floor, so a stable with no bad requests at all never turns one canary error
//! into a verdict. The canary's bad
//! requests are Poisson with mean `θ · r · n_c`; the test weighs H0 `θ = 1` (as good as stable)
//! against H1 `θ = θ1`:
//!
//! ```text
//! LLR_i = x_c · ln θ1 − (θ1 − 1) · r · n_c          S_i = max(F, S_{i−1} + LLR_i),  S_0 = 0
//! Fail when S ≥ U = ln(1/α);   Pass once S has reached L = ln β and while S ≤ 0
//! ```
//!
//! `θ1` is chosen so that the statistic drifts up exactly when the canary is worse than the
//! gate's `factor` × stable: the drift `θ ln θ1 − (θ1 − 1)` is zero at `θ = (θ1 − 1)/ln θ1`,
//! which is solved for `θ1` with that point at `factor` (1.5 → θ1 ≈ 2.15). By Ville's inequality
//! a healthy canary (θ ≤ 1) reaches `U` with probability at most `α` from the start; the floor
//! at `L` (a CUSUM restart) keeps a long healthy history from hiding a fault that starts later,
//! at the price of a false-alarm rate that grows with the length of the step, which is why the
//! operator spends its per-rollout budget over every step and gate and the simulation in
//! `tests/sequential.rs` measures the result. There is no fixed window and no consecutive-failure
//! count: every request is counted once.
//!
//! # Applied share: confirmation on enough requests, failure on overwhelming evidence
//!
//! With `C` canary requests of `T` route requests since the step's first full interval, the share
//! `C/T` is confirmed (Pass) when `T` reaches the ≈95% minimum of
//! [`share_min_samples`](sluice_api::v1alpha1::gate::share_min_samples) and the share is within
//! the tolerance, and fails only when it is outside the tolerance with `T` at least the minimum
//! for `z = 4` (a healthy share fails one look in ~16,000, so a step of 120 looks stays under
//! 1%). In between it is Inconclusive (TooFewSamples) and the step lengthens.

use sluice_api::v1alpha1::gate::share_min_samples;

/// Default false-abort budget of one rollout for a healthy canary (spent over its tests).
pub const DEFAULT_FALSE_ABORT_RATE: f64 = 0.01;
/// Default probability of passing a canary exactly at `θ1` (sets the Pass boundary `ln β`).
pub const DEFAULT_PASS_ERROR: f64 = 0.05;
/// Default floor of the stable's bad-request rate (0.5 percentage points).
pub const DEFAULT_RATE_FLOOR: f64 = 0.005;
/// z of the share check's failing side (a healthy share fails one look in ~16,000).
pub const SHARE_FAIL_Z: f64 = 4.0;

/// The counts of one aligned interval.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct IntervalCounts {
    /// Requests the canary served.
    pub canary_requests: f64,
    /// Bad canary requests (5xx or gRPC server errors, or slower than the stable's p99 bound).
    pub canary_bad: f64,
    /// Requests the stable served.
    pub stable_requests: f64,
    /// Bad stable requests.
    pub stable_bad: f64,
}

/// Settings of the bad-request test.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RateTest {
    /// Probability that a healthy canary fails this test (sets `U = ln(1/α)`).
    pub alpha: f64,
    /// Probability of passing a canary at `θ1` (sets `L = ln β`).
    pub beta: f64,
    /// The canary may be at most this many times worse than stable (the gate's `factor`).
    pub factor: f64,
    /// Floor of the stable's rate.
    pub rate_floor: f64,
    /// Fewest canary requests before a Pass.
    pub min_samples: u64,
    /// Most intervals the test looks back over (the engine's lookback ÷ the interval); sets the
    /// floor of the statistic.
    pub max_intervals: usize,
}

impl RateTest {
    /// The defaults for a gate's `factor`, `minSamples` and a per-test `alpha`.
    pub fn new(factor: f64, min_samples: u64, alpha: f64, max_intervals: usize) -> Self {
        Self {
            alpha,
            beta: DEFAULT_PASS_ERROR,
            factor,
            rate_floor: DEFAULT_RATE_FLOOR,
            min_samples,
            max_intervals,
        }
    }

    /// `θ1`: the alternative whose indifference point `(θ1 − 1)/ln θ1` is the factor.
    pub fn theta1(&self) -> f64 {
        theta_for_factor(self.factor)
    }

    /// The Fail boundary `ln(1/α)`.
    pub fn upper(&self) -> f64 {
        (1.0 / self.alpha.clamp(1e-12, 0.5)).ln()
    }

    /// The Pass boundary `ln β` (negative).
    pub fn lower(&self) -> f64 {
        self.beta.clamp(1e-6, 0.5).ln()
    }

    /// The floor of the statistic: `−ln(max_intervals)`, or the Pass boundary if lower. Each
    /// restart from the floor reaches the Fail boundary with probability at most
    /// `e^(floor − U) = α / max_intervals`, so all restarts together add at most `α`: a healthy
    /// canary fails one test with probability at most `2α`.
    pub fn floor(&self) -> f64 {
        (-(self.max_intervals.max(1) as f64).ln()).min(self.lower())
    }
}

/// `θ1 > 1` with `(θ1 − 1)/ln θ1 = factor` (the factor is clamped to at least 1.05).
pub fn theta_for_factor(factor: f64) -> f64 {
    let target = if factor.is_finite() {
        factor.max(1.05)
    } else {
        1.05
    };
    let indifference = |t: f64| (t - 1.0) / t.ln();
    // indifference() increases from 1 (t → 1) without bound: bisect.
    let (mut lo, mut hi) = (1.000_001, 2.0);
    while indifference(hi) < target {
        hi *= 2.0;
    }
    for _ in 0..100 {
        let mid = (lo + hi) / 2.0;
        if indifference(mid) < target {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    (lo + hi) / 2.0
}

/// Where a sequential test stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SequentialState {
    /// The evidence says the canary is worse than allowed.
    Fail,
    /// The evidence says the canary is healthy (enough of it, and nothing against it since).
    Pass,
    /// Not enough evidence either way yet.
    Collecting,
}

/// The result of a bad-request test over the intervals since the step began.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SequentialOutcome {
    /// Where the test stands.
    pub state: SequentialState,
    /// The statistic after the last interval (after the Fail crossing, it stays there).
    pub statistic: f64,
    /// The Fail boundary.
    pub upper: f64,
    /// The Pass boundary.
    pub lower: f64,
    /// Intervals used.
    pub intervals: usize,
    /// Index of the interval where the statistic crossed the Fail boundary.
    pub crossed_at: Option<usize>,
    /// Index of the first interval of the rise that crossed (the statistic was at its floor or
    /// its start just before): the estimated start of the fault.
    pub rising_since: Option<usize>,
    /// Canary requests and bad requests, summed.
    pub canary: (f64, f64),
    /// Stable requests and bad requests, summed.
    pub stable: (f64, f64),
}

impl SequentialOutcome {
    /// The canary's bad-request ratio (NaN without requests).
    pub fn canary_ratio(&self) -> f64 {
        ratio(self.canary.1, self.canary.0)
    }

    /// The stable's bad-request ratio (NaN without requests).
    pub fn stable_ratio(&self) -> f64 {
        ratio(self.stable.1, self.stable.0)
    }
}

fn ratio(a: f64, b: f64) -> f64 {
    if b > 0.0 { a / b } else { f64::NAN }
}

fn clean(v: f64) -> f64 {
    if v.is_finite() { v.max(0.0) } else { 0.0 }
}

/// The stable's rate the canary is held to: a one-standard-error upper bound of the stable's rate
/// from its counts so far, `(X_s + √X_s + 1) / N_s`, and at least `floor`. Using the estimate itself
/// would let its noise early in a step (a few stable errors at low traffic) push a healthy
/// canary's statistic up; the bound tightens as the stable's requests accumulate.
pub fn stable_rate((requests, bad): (f64, f64), floor: f64) -> f64 {
    if requests <= 0.0 {
        return floor;
    }
    ((bad + bad.sqrt() + 1.0) / requests).max(floor)
}

/// Runs the bad-request test over `intervals` (oldest first). Stops at the first Fail crossing:
/// a Fail stays a Fail for the step.
pub fn rate_test(intervals: &[IntervalCounts], test: &RateTest) -> SequentialOutcome {
    let theta1 = test.theta1();
    let ln_theta1 = theta1.ln();
    let (upper, lower, floor) = (test.upper(), test.lower(), test.floor());
    let mut s = 0.0_f64;
    let mut accepted = false;
    let mut rising_since = 0usize;
    let mut out = SequentialOutcome {
        state: SequentialState::Collecting,
        statistic: 0.0,
        upper,
        lower,
        intervals: 0,
        crossed_at: None,
        rising_since: None,
        canary: (0.0, 0.0),
        stable: (0.0, 0.0),
    };
    for (i, c) in intervals.iter().enumerate() {
        let (nc, xc) = (
            clean(c.canary_requests),
            clean(c.canary_bad).min(clean(c.canary_requests)),
        );
        let (ns, xs) = (
            clean(c.stable_requests),
            clean(c.stable_bad).min(clean(c.stable_requests)),
        );
        out.canary.0 += nc;
        out.canary.1 += xc;
        out.stable.0 += ns;
        out.stable.1 += xs;
        out.intervals = i + 1;
        let r = stable_rate(out.stable, test.rate_floor);
        if s <= 0.0 {
            // The statistic is at its start or its floor: a rise begins here.
            rising_since = i;
        }
        s += xc * ln_theta1 - (theta1 - 1.0) * r * nc;
        if s <= lower {
            accepted = true;
        }
        s = s.max(floor);
        if s >= upper {
            out.statistic = s;
            out.state = SequentialState::Fail;
            out.crossed_at = Some(i);
            out.rising_since = Some(rising_since.min(i));
            return out;
        }
    }
    out.statistic = s;
    out.state = if accepted && s <= 0.0 && out.canary.0 >= test.min_samples as f64 {
        SequentialState::Pass
    } else {
        SequentialState::Collecting
    };
    out
}

/// The result of a share check over the intervals since the step began.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ShareOutcome {
    /// Where the check stands.
    pub state: SequentialState,
    /// Canary ÷ (canary + stable) route requests (NaN without requests).
    pub share: f64,
    /// Route requests counted.
    pub requests: f64,
    /// Requests needed to confirm (≈95%).
    pub confirm_at: u64,
    /// Requests needed before a share outside the tolerance fails.
    pub fail_at: u64,
}

/// The share check on `canary` of `total` route requests for `target` ± `tolerance`·`target`.
pub fn share_test(
    canary: f64,
    total: f64,
    target: f64,
    tolerance: f64,
    min_samples: u64,
) -> ShareOutcome {
    let (canary, total) = (clean(canary), clean(total));
    let share = ratio(canary.min(total), total);
    let confirm_at = share_min_samples(target, tolerance).max(min_samples);
    let scale = (SHARE_FAIL_Z / sluice_api::v1alpha1::gate::SHARE_CONFIDENCE_Z).powi(2);
    let fail_at = if confirm_at == u64::MAX {
        u64::MAX
    } else {
        ((share_min_samples(target, tolerance) as f64) * scale).ceil() as u64
    }
    .max(min_samples);
    let within = !share.is_nan() && (share - target).abs() <= tolerance * target;
    let state = if share.is_nan() {
        SequentialState::Collecting
    } else if within && total >= confirm_at as f64 {
        SequentialState::Pass
    } else if !within && total >= fail_at as f64 {
        SequentialState::Fail
    } else {
        SequentialState::Collecting
    };
    ShareOutcome {
        state,
        share,
        requests: total,
        confirm_at,
        fail_at,
    }
}

/// The per-test `α` when a rollout's `budget` is spent over `tests` tests (steps × gates): a
/// test fails a healthy canary with probability at most `2α` (see [`RateTest::floor`]), so the
/// union over the tests stays within the budget.
pub fn per_test_alpha(budget: f64, tests: usize) -> f64 {
    budget / (2 * tests.max(1)) as f64
}

/// From cumulative histogram buckets `(upper bound, count)` of the stable side, the smallest
/// bound that holds at least 99% of its requests (the bucket of its p99); `None` without
/// requests or buckets.
pub fn p99_bound(buckets: &[(f64, f64)]) -> Option<f64> {
    let mut b: Vec<(f64, f64)> = buckets
        .iter()
        .copied()
        .filter(|(le, n)| !le.is_nan() && n.is_finite())
        .collect();
    b.sort_by(|x, y| x.0.total_cmp(&y.0));
    let total = b.iter().find(|(le, _)| le.is_infinite())?.1;
    if total <= 0.0 {
        return None;
    }
    b.iter()
        .find(|(_, n)| *n >= 0.99 * total)
        .map(|(le, _)| *le)
}

/// Requests above `bound` in cumulative buckets, and the total (the `+Inf` bucket).
pub fn above(buckets: &[(f64, f64)], bound: f64) -> (f64, f64) {
    let total = buckets
        .iter()
        .find(|(le, _)| le.is_infinite())
        .map_or(0.0, |b| b.1);
    let within = buckets
        .iter()
        .filter(|(le, _)| *le <= bound)
        .map(|b| b.1)
        .fold(0.0_f64, f64::max);
    ((total - within).max(0.0), total)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn iv(nc: f64, xc: f64, ns: f64, xs: f64) -> IntervalCounts {
        IntervalCounts {
            canary_requests: nc,
            canary_bad: xc,
            stable_requests: ns,
            stable_bad: xs,
        }
    }

    #[test]
    fn theta1_puts_the_indifference_point_at_the_factor() {
        for factor in [1.3, 1.5, 2.0, 3.0] {
            let t = theta_for_factor(factor);
            assert!(t > factor, "{factor}: {t}");
            assert!(((t - 1.0) / t.ln() - factor).abs() < 1e-9, "{factor}");
        }
        assert!((theta_for_factor(1.5) - 2.15).abs() < 0.02);
    }

    #[test]
    fn one_canary_error_against_a_stable_without_errors_is_no_verdict() {
        // B6: 1.5 × 0 made the threshold 0, so one 5xx failed (and was seen by four windows).
        let test = RateTest::new(1.5, 100, 0.01 / 24.0, 120);
        let mut intervals = vec![iv(60.0, 1.0, 6000.0, 0.0)];
        intervals.extend(std::iter::repeat_n(iv(60.0, 0.0, 6000.0, 0.0), 8));
        for n in 1..=intervals.len() {
            let o = rate_test(&intervals[..n], &test);
            assert_ne!(o.state, SequentialState::Fail, "after {n} intervals: {o:?}");
        }
    }

    #[test]
    fn states_table() {
        let test = RateTest::new(1.5, 100, 0.001, 120);
        // (name, intervals, want)
        let cases = [
            ("nothing yet", vec![], SequentialState::Collecting),
            (
                "healthy, little traffic",
                vec![iv(10.0, 0.0, 1000.0, 10.0)],
                SequentialState::Collecting,
            ),
            (
                "healthy, plenty",
                vec![iv(600.0, 6.0, 60_000.0, 600.0); 20],
                SequentialState::Pass,
            ),
            (
                "3x stable, plenty",
                vec![iv(600.0, 18.0, 60_000.0, 600.0); 20],
                SequentialState::Fail,
            ),
            (
                "1.2x stable: within the factor, passes",
                vec![iv(600.0, 7.2, 60_000.0, 600.0); 40],
                SequentialState::Pass,
            ),
        ];
        for (name, intervals, want) in cases {
            let o = rate_test(&intervals, &test);
            assert_eq!(o.state, want, "{name}: {o:?}");
        }
    }

    #[test]
    fn a_fault_after_a_long_healthy_history_is_still_found_and_its_start_estimated() {
        let test = RateTest::new(1.5, 100, 0.001, 120);
        let mut intervals = vec![iv(600.0, 6.0, 60_000.0, 600.0); 100];
        intervals.extend(vec![iv(600.0, 18.0, 60_000.0, 600.0); 10]);
        let o = rate_test(&intervals, &test);
        assert_eq!(o.state, SequentialState::Fail, "{o:?}");
        let crossed = o.crossed_at.unwrap();
        assert!(crossed > 100 && crossed < 105, "{o:?}");
        assert!(o.rising_since.unwrap() >= 99, "{o:?}");
    }

    #[test]
    fn share_table() {
        // 1% ±20%: confirmation needs ~9,500 route requests, failure ~39,000.
        let cases = [
            ("no traffic", 0.0, 0.0, SequentialState::Collecting),
            ("too few", 10.0, 1000.0, SequentialState::Collecting),
            ("confirmed", 100.0, 10_000.0, SequentialState::Pass),
            (
                "outside, too few to fail",
                150.0,
                10_000.0,
                SequentialState::Collecting,
            ),
            ("outside, enough", 600.0, 40_000.0, SequentialState::Fail),
        ];
        for (name, c, t, want) in cases {
            let o = share_test(c, t, 0.01, 0.2, 100);
            assert_eq!(o.state, want, "{name}: {o:?}");
        }
    }

    #[test]
    fn p99_bound_and_slow_counts() {
        let stable = [
            (50.0, 900.0),
            (100.0, 985.0),
            (250.0, 995.0),
            (f64::INFINITY, 1000.0),
        ];
        assert_eq!(p99_bound(&stable), Some(250.0));
        let canary = [
            (50.0, 5.0),
            (100.0, 7.0),
            (250.0, 8.0),
            (f64::INFINITY, 10.0),
        ];
        assert_eq!(above(&canary, 250.0), (2.0, 10.0));
        assert_eq!(p99_bound(&[(f64::INFINITY, 0.0)]), None);
    }
}
