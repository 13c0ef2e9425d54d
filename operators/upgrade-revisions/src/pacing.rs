//! The issuance budget: how many restarts may start now, so that SVID issuance (one certificate
//! per restarted pod, plus the background issuance of the rest of the cluster) stays within a
//! token bucket (rate, depth) and a cap on any one second (seed ADR-26: 200/s sustained, 2,000/s
//! burst).
//!
//! Owns the bucket arithmetic and the reading of background issuance; pure, never reads the clock
//! or the metrics itself. Must never grant more than the bucket holds, never grant twice within
//! one pacing tick, and never count sluice's own restarts as background.
//!
//! Why the bound holds: restarts are granted at ticks at least [`TICK`] apart. The bucket refills
//! at `rate × SAFETY − background × BACKGROUND_MARGIN` and holds at most `depth × SAFETY`, so over any window `w`
//! sluice issues at most `depth + (rate − background) × w`, and with the background the total is
//! at most `depth + rate × w`. Each grant is capped by the peak (less the background) and its
//! restarts are spread over [`SPREAD`], so a one-second window sees at most the larger of two
//! consecutive grants plus one restart at the seam, for which each grant leaves room.

use std::time::Duration;

use k8s_openapi::{apimachinery::pkg::apis::meta::v1::Time, jiff::Timestamp};
use sluice_api::v1alpha1::revision_upgrade::{IssuanceBudget, IssuanceBudgetStatus};

/// Least time between two pacing ticks (grants).
pub const TICK: Duration = Duration::from_secs(1);

/// The restarts of one grant are started evenly over this part of the tick, so issuance flows
/// instead of bursting: a one-second window then holds at most the larger of two consecutive
/// grants (plus one restart at the seam), and the peak cap bounds each grant.
pub const SPREAD: Duration = Duration::from_millis(800);

/// When the `i`-th of `n` restarts of a grant starts, after the grant.
pub fn spread_offset(i: usize, n: usize) -> Duration {
    if n == 0 {
        return Duration::ZERO;
    }
    SPREAD.mul_f64((i as f64 + 0.5) / n as f64)
}

/// Share of the budget sluice plans with, leaving room for the delay between an eviction and
/// the new pod's certificate and for error in the background reading.
pub const SAFETY: f64 = 0.95;

/// Factor on the observed background issuance when reserving room for it: background arrives in
/// bursts the window's average hides, so sluice leaves it half as much again as its mean.
pub const BACKGROUND_MARGIN: f64 = 1.5;

/// Total issuance observed in a window (from the certificate authority's counter).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct IssuanceReading {
    /// Length of the window between the two counter samples, seconds.
    pub window_seconds: f64,
    /// SVIDs issued in the window, all sources.
    pub issued: f64,
    /// Restarts sluice started in the same window (its own issuance, counted once).
    pub own: f64,
}

impl IssuanceReading {
    /// Observed issuance per second.
    pub fn observed_rate(&self) -> f64 {
        if self.window_seconds <= 0.0 {
            return 0.0;
        }
        self.issued / self.window_seconds
    }

    /// Issuance not caused by sluice, per second (never negative: sluice's restarts near the
    /// window's edges can land on either side of a sample).
    pub fn background_rate(&self) -> f64 {
        if self.window_seconds <= 0.0 {
            return 0.0;
        }
        ((self.issued - self.own) / self.window_seconds).max(0.0)
    }
}

/// What the bucket allows this tick.
#[derive(Debug, Clone, PartialEq)]
pub struct Grant {
    /// Restarts that may start now.
    pub restarts: u32,
    /// The bucket after the grant (write it to status).
    pub state: IssuanceBudgetStatus,
    /// Why fewer than wanted were granted, when that is so.
    pub held_by: Option<Hold>,
}

/// Why the budget held restarts back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Hold {
    /// The previous grant was less than a tick ago.
    NotDue,
    /// No issuance reading yet: no data is not zero.
    NoReading,
    /// Observed issuance is over what the budget allows, or the background leaves no headroom.
    OverBudget,
    /// The bucket is empty.
    Tokens,
    /// The peak cap of one second is used up.
    Peak,
}

/// Restarts per second the budget leaves sluice with `background` SVIDs/s issued elsewhere.
pub fn headroom(budget: &IssuanceBudget, background: f64) -> f64 {
    (f64::from(budget.rate) * SAFETY - background * BACKGROUND_MARGIN).max(0.0)
}

/// Whether observed issuance is over budget: the background alone uses the whole rate, or the
/// window saw more than the bucket allows in it.
pub fn over_budget(budget: &IssuanceBudget, reading: &IssuanceReading) -> bool {
    let allowed = f64::from(budget.depth) + f64::from(budget.rate) * reading.window_seconds;
    reading.background_rate() >= f64::from(budget.rate) || reading.issued > allowed
}

fn seconds_between(from: &Option<Time>, now: Timestamp) -> Option<f64> {
    let from = from.as_ref()?.0;
    Some((now.as_millisecond() - from.as_millisecond()) as f64 / 1000.0)
}

/// Decides how many of `wanted` restarts may start at `now`, from the bucket in `previous`
/// (none: a full bucket) and the latest issuance `reading` (none: hold — no data is not zero).
pub fn grant(
    budget: &IssuanceBudget,
    previous: Option<&IssuanceBudgetStatus>,
    reading: Option<&IssuanceReading>,
    wanted: u32,
    now: Timestamp,
) -> Grant {
    let depth = f64::from(budget.depth) * SAFETY;
    let since = previous.and_then(|p| seconds_between(&p.updated_at, now));
    if let (Some(p), Some(since)) = (previous, since)
        && since < TICK.as_secs_f64()
    {
        return Grant {
            restarts: 0,
            state: p.clone(),
            held_by: Some(Hold::NotDue),
        };
    }
    let Some(reading) = reading else {
        // No reading: keep the bucket as it was (it refills once readings return).
        let mut state = previous.cloned().unwrap_or(IssuanceBudgetStatus {
            tokens: depth,
            ..IssuanceBudgetStatus::default()
        });
        state.updated_at = Some(Time(now));
        state.own_restarts_last_second = 0;
        return Grant {
            restarts: 0,
            state,
            held_by: Some(Hold::NoReading),
        };
    };
    let background = reading.background_rate();
    let rate = headroom(budget, background);
    let peak =
        (f64::from(budget.peak_per_second) * SAFETY - background * BACKGROUND_MARGIN).max(0.0);
    let mut tokens = match (previous, since) {
        (Some(p), Some(since)) => (p.tokens + rate * since).min(depth),
        _ => depth,
    };
    let over = over_budget(budget, reading);
    let (restarts, held_by) = if over {
        // Over budget: start nothing and empty the bucket, so restarts resume at the sustained
        // pace once issuance recovers rather than with a burst.
        tokens = 0.0;
        (0, Some(Hold::OverBudget))
    } else {
        let by_tokens = tokens.max(0.0).floor() as u64;
        // One restart of room for the seam between two consecutive spreads.
        let by_peak = (peak - 1.0).max(0.0).floor() as u64;
        let n = u64::from(wanted).min(by_tokens).min(by_peak) as u32;
        let held = if n >= wanted {
            None
        } else if by_peak < by_tokens {
            Some(Hold::Peak)
        } else {
            Some(Hold::Tokens)
        };
        tokens -= f64::from(n);
        (n, held)
    };
    Grant {
        restarts,
        state: IssuanceBudgetStatus {
            tokens: (tokens * 1000.0).round() / 1000.0,
            background_rate: (background * 1000.0).round() / 1000.0,
            observed_rate: (reading.observed_rate() * 1000.0).round() / 1000.0,
            own_restarts_last_second: restarts,
            throttled: over,
            updated_at: Some(Time(now)),
        },
        held_by,
    }
}

/// Gives back tokens for granted restarts that did not happen (a PodDisruptionBudget refused
/// the eviction, the pod was already gone): they issued no certificate.
pub fn refund(state: &mut IssuanceBudgetStatus, budget: &IssuanceBudget, unused: u32) {
    let depth = f64::from(budget.depth) * SAFETY;
    state.tokens = (state.tokens + f64::from(unused)).min(depth);
    state.own_restarts_last_second = state.own_restarts_last_second.saturating_sub(unused);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(ms: i64) -> Timestamp {
        Timestamp::from_millisecond(1_800_000_000_000 + ms).unwrap()
    }

    fn budget(rate: u32, depth: u32, peak: u32) -> IssuanceBudget {
        IssuanceBudget {
            rate,
            depth,
            peak_per_second: peak,
        }
    }

    fn reading(issued: f64, own: f64) -> IssuanceReading {
        IssuanceReading {
            window_seconds: 10.0,
            issued,
            own,
        }
    }

    #[test]
    fn grants_follow_the_bucket_the_peak_and_the_background() {
        let b = budget(200, 2000, 2000);
        let quiet = reading(0.0, 0.0);
        struct Row {
            name: &'static str,
            previous: Option<IssuanceBudgetStatus>,
            reading: Option<IssuanceReading>,
            wanted: u32,
            now: i64,
            want: u32,
            held: Option<Hold>,
        }
        let prev = |tokens: f64, own: u32, at: i64| IssuanceBudgetStatus {
            tokens,
            own_restarts_last_second: own,
            updated_at: Some(Time(t(at))),
            ..IssuanceBudgetStatus::default()
        };
        let table = vec![
            Row {
                name: "fresh bucket is full (depth with the safety margin, peak less the seam)",
                previous: None,
                reading: Some(quiet),
                wanted: 5000,
                now: 0,
                want: 1899,
                held: Some(Hold::Peak),
            },
            Row {
                name: "no reading holds: no data is not zero",
                previous: None,
                reading: None,
                wanted: 10,
                now: 0,
                want: 0,
                held: Some(Hold::NoReading),
            },
            Row {
                name: "a second tick within a tick grants nothing",
                previous: Some(prev(1000.0, 0, 0)),
                reading: Some(quiet),
                wanted: 10,
                now: 500,
                want: 0,
                held: Some(Hold::NotDue),
            },
            Row {
                name: "refill at the rate with the margin",
                previous: Some(prev(0.0, 0, 0)),
                reading: Some(quiet),
                wanted: 5000,
                now: 3000,
                want: 570,
                held: Some(Hold::Tokens),
            },
            Row {
                name: "background shrinks the refill",
                previous: Some(prev(0.0, 0, 0)),
                reading: Some(reading(1000.0, 0.0)),
                wanted: 5000,
                now: 2000,
                want: 80,
                held: Some(Hold::Tokens),
            },
            Row {
                name: "own restarts are not background",
                previous: Some(prev(0.0, 0, 0)),
                reading: Some(reading(1900.0, 1900.0)),
                wanted: 5000,
                now: 2000,
                want: 380,
                held: Some(Hold::Tokens),
            },
            Row {
                name: "background at the full rate is over budget",
                previous: Some(prev(1900.0, 0, 0)),
                reading: Some(reading(2100.0, 0.0)),
                wanted: 5,
                now: 2000,
                want: 0,
                held: Some(Hold::OverBudget),
            },
            Row {
                name: "a window over depth + rate x window is over budget",
                previous: Some(prev(1900.0, 0, 0)),
                reading: Some(reading(4001.0, 3000.0)),
                wanted: 5,
                now: 2000,
                want: 0,
                held: Some(Hold::OverBudget),
            },
            Row {
                name: "wanted fewer than allowed",
                previous: Some(prev(100.0, 0, 0)),
                reading: Some(quiet),
                wanted: 7,
                now: 1000,
                want: 7,
                held: None,
            },
        ];
        for row in table {
            let g = grant(
                &b,
                row.previous.as_ref(),
                row.reading.as_ref(),
                row.wanted,
                t(row.now),
            );
            assert_eq!(g.restarts, row.want, "{}", row.name);
            assert_eq!(g.held_by, row.held, "{}", row.name);
            if row.held == Some(Hold::OverBudget) {
                assert!(g.state.throttled, "{}", row.name);
                assert_eq!(g.state.tokens, 0.0, "{}: bucket emptied", row.name);
            }
            if row.held != Some(Hold::NotDue) && row.held != Some(Hold::NoReading) {
                assert_eq!(g.state.own_restarts_last_second, row.want, "{}", row.name);
            }
        }
    }

    /// Simulates the operator granting once per tick against a constant background, and checks
    /// the budget's promise on every window the simulation produced.
    #[test]
    fn every_window_stays_within_depth_plus_rate_times_length_and_the_peak() {
        for (rate, depth, peak, background) in [
            (200, 2000, 2000, 0.0),
            (200, 2000, 2000, 80.0),
            (5, 10, 10, 0.0),
            (5, 10, 10, 2.0),
            (50, 20, 60, 10.0),
        ] {
            let b = budget(rate, depth, peak);
            let mut state: Option<IssuanceBudgetStatus> = None;
            // (time ms, count) of every issuance, sluice's and the background's.
            let mut events: Vec<(i64, f64)> = Vec::new();
            let mut now = 0_i64;
            while now < 60_000 {
                let g = grant(
                    &b,
                    state.as_ref(),
                    Some(&IssuanceReading {
                        window_seconds: 10.0,
                        issued: background * 10.0,
                        own: 0.0,
                    }),
                    u32::MAX,
                    t(now),
                );
                let n = g.restarts as usize;
                for i in 0..n {
                    events.push((now + spread_offset(i, n).as_millis() as i64, 1.0));
                }
                state = Some(g.state);
                now += 1000 + (now / 1000 % 3) * 150; // ticks 1.0-1.3 s apart
            }
            for ms in (0..60_000).step_by(100) {
                events.push((ms, background / 10.0));
            }
            events.sort_by_key(|e| e.0);
            for (i, &(start, _)) in events.iter().enumerate() {
                let mut sum = 0.0;
                for &(end, n) in &events[i..] {
                    sum += n;
                    let w = (end - start) as f64 / 1000.0;
                    let allowed = f64::from(depth) + f64::from(rate) * w;
                    assert!(
                        sum <= allowed + 1e-6,
                        "rate {rate} depth {depth} bg {background}: {sum} in {w}s > {allowed}"
                    );
                    if w < 1.0 {
                        assert!(
                            sum <= f64::from(peak) + 1e-6,
                            "rate {rate} peak {peak} bg {background}: {sum} in {w}s"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn the_peak_cap_bounds_one_grant_less_the_background() {
        let b = budget(200, 2000, 500);
        let g = grant(&b, None, Some(&reading(0.0, 0.0)), 5000, t(0));
        assert_eq!((g.restarts, g.held_by), (474, Some(Hold::Peak)));
        let g = grant(&b, None, Some(&reading(1000.0, 0.0)), 5000, t(0));
        assert_eq!(
            g.restarts, 324,
            "475 less 1.5 x 100/s of background, less the seam"
        );
    }

    #[test]
    fn spread_offsets_stay_within_the_spread() {
        assert_eq!(spread_offset(0, 0), Duration::ZERO);
        let offsets: Vec<Duration> = (0..4).map(|i| spread_offset(i, 4)).collect();
        assert_eq!(offsets[0], Duration::from_millis(100));
        assert_eq!(offsets[3], Duration::from_millis(700));
        assert!(offsets.windows(2).all(|w| w[0] < w[1]));
    }

    #[test]
    fn refund_returns_unused_tokens_up_to_depth() {
        let b = budget(200, 2000, 2000);
        let mut s = IssuanceBudgetStatus {
            tokens: 1890.0,
            own_restarts_last_second: 30,
            ..IssuanceBudgetStatus::default()
        };
        refund(&mut s, &b, 20);
        assert_eq!(s.tokens, 1900.0);
        assert_eq!(s.own_restarts_last_second, 10);
    }
}
