//! The issuance budget: when each restart may start, so that SVID issuance (one certificate per
//! restarted pod, plus the background issuance of the rest of the cluster) stays within a token
//! bucket (rate, depth) and a cap on any one second (seed ADR-26: 200/s sustained, 2,000/s
//! burst).
//!
//! Owns the bucket arithmetic, the schedule of a grant and the reading of background issuance;
//! pure, never reads the clock or the metrics itself. Must never schedule a restart before the
//! bucket holds its token, never start two restarts closer than the peak allows, never grant twice
//! within a tick of a grant that started restarts, and never count sluice's own restarts as
//! background.
//!
//! Why the bound holds: a grant at a tick schedules restarts over the coming horizon ([`Window`])
//! instead of starting them at once: slot `j` starts when the bucket holds its token (`(j + 1 −
//! tokens) / headroom` after the tick) and no sooner than `j / peak` after the previous
//! schedule's last slot. The bucket refills at `rate × SAFETY − background × BACKGROUND_MARGIN`
//! and holds at most `depth × SAFETY`; the status records the tokens left after every granted
//! slot (negative while slots ahead of the refill are pending), so the next tick continues
//! from the debt. Over any window `w` sluice therefore starts at most `depth × SAFETY +
//! headroom × w + 1` restarts, and with the background the total stays within `depth + rate ×
//! w`. Consecutive starts are at least `1 / peak` apart (peak = `peakPerSecond × SAFETY −
//! background × BACKGROUND_MARGIN − 1`), so a one-second window holds at most `peak + 1`.
//! Restarts flow as tokens accrue, whatever the time between ticks.

use std::time::Duration;

use k8s_openapi::{apimachinery::pkg::apis::meta::v1::Time, jiff::Timestamp};
use sluice_api::v1alpha1::revision_upgrade::{IssuanceBudget, IssuanceBudgetStatus};

/// Least time between two pacing ticks (grants).
pub const TICK: Duration = Duration::from_secs(1);

/// How far ahead of its tick a grant schedules restarts when the reconcile does not say
/// (twice the tick, so the next tick extends the schedule before it runs dry).
pub const DEFAULT_HORIZON: Duration = Duration::from_secs(2);

/// The longest horizon a grant may schedule over (restarts prepaid but not yet started are
/// lost, not repeated, when the operator stops).
pub const MAX_HORIZON: Duration = Duration::from_secs(5);

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
    /// Restarts granted (SVIDs the granted units cost together).
    pub restarts: u32,
    /// When each unit of work starts, after the tick, in the order asked (`None`: not granted
    /// this tick).
    pub starts: Vec<Option<Duration>>,
    /// Time after the tick when the next grant's first restart may start (the last granted
    /// slot plus one peak spacing); zero when nothing was granted.
    pub busy_for: Duration,
    /// The bucket after the grant (write it to status).
    pub state: IssuanceBudgetStatus,
    /// Why fewer than wanted were granted, when that is so.
    pub held_by: Option<Hold>,
}

/// Where a grant's schedule may lie, after the tick.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Window {
    /// Until when the previous grant's schedule still runs (its next free slot).
    pub busy_for: Duration,
    /// How far ahead this grant may schedule (at most [`MAX_HORIZON`]).
    pub horizon: Duration,
}

impl Default for Window {
    fn default() -> Self {
        Self {
            busy_for: Duration::ZERO,
            horizon: DEFAULT_HORIZON,
        }
    }
}

/// Why the budget held restarts back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Hold {
    /// The previous grant started restarts less than a tick ago.
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

/// Restarts per second the peak cap leaves sluice (consecutive starts are at least its
/// inverse apart): `peakPerSecond × SAFETY − background × BACKGROUND_MARGIN`, less one restart
/// for a window that catches both ends of a spacing.
pub fn peak_rate(budget: &IssuanceBudget, background: f64) -> f64 {
    (f64::from(budget.peak_per_second) * SAFETY - background * BACKGROUND_MARGIN - 1.0).max(0.0)
}

/// Schedules the units of work `costs` (a pod costs 1, a rollout restart its replicas) at
/// `now`, from the bucket in `previous` (none: a full bucket) and the latest issuance `reading`
/// (none: hold — no data is not zero), within `window`. Units are taken in order; one that
/// does not fit the window is skipped and a later, smaller one may still fit.
pub fn grant(
    budget: &IssuanceBudget,
    previous: Option<&IssuanceBudgetStatus>,
    reading: Option<&IssuanceReading>,
    costs: &[u32],
    window: Window,
    now: Timestamp,
) -> Grant {
    let depth = f64::from(budget.depth) * SAFETY;
    let none = vec![None; costs.len()];
    let since = previous.and_then(|p| seconds_between(&p.updated_at, now));
    if let (Some(p), Some(since)) = (previous, since)
        && since < TICK.as_secs_f64()
        && p.own_restarts_last_second > 0
    {
        return Grant {
            restarts: 0,
            starts: none,
            busy_for: Duration::ZERO,
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
            starts: none,
            busy_for: Duration::ZERO,
            state,
            held_by: Some(Hold::NoReading),
        };
    };
    let background = reading.background_rate();
    let rate = headroom(budget, background);
    let peak = peak_rate(budget, background);
    let mut tokens = match (previous, since) {
        (Some(p), Some(since)) => (p.tokens + rate * since).min(depth),
        _ => depth,
    };
    let over = over_budget(budget, reading);
    let mut starts = none;
    let mut slots = 0u32;
    let mut last_slot = None;
    let held_by = if over {
        // Over budget: start nothing and empty the bucket, so restarts resume at the sustained
        // pace once issuance recovers rather than with a burst.
        tokens = 0.0;
        Some(Hold::OverBudget)
    } else {
        let begin = window.busy_for.as_secs_f64();
        let end = window.horizon.min(MAX_HORIZON).as_secs_f64();
        // When slot `j` (0-based, counted from this grant) has its token, after the tick.
        let token_at = |j: u32| {
            let need = f64::from(j) + 1.0 - tokens;
            if need <= 0.0 {
                0.0
            } else if rate > 0.0 {
                need / rate
            } else {
                f64::INFINITY
            }
        };
        let spaced_at = |j: u32| {
            if peak > 0.0 {
                begin + f64::from(j) / peak
            } else {
                f64::INFINITY
            }
        };
        let mut held = None;
        for (i, &cost) in costs.iter().enumerate() {
            let cost = cost.max(1);
            let last = slots + cost - 1;
            let (by_tokens, by_peak) = (token_at(last), spaced_at(last));
            let at = by_tokens.max(by_peak);
            if at < end {
                starts[i] = Some(Duration::from_secs_f64(at));
                slots += cost;
                last_slot = Some(at);
            } else if held.is_none() {
                held = Some(if by_peak > by_tokens {
                    Hold::Peak
                } else {
                    Hold::Tokens
                });
            }
        }
        tokens -= f64::from(slots);
        held
    };
    let busy_for = match last_slot {
        Some(at) if peak > 0.0 => Duration::from_secs_f64(at + 1.0 / peak),
        _ => Duration::ZERO,
    };
    Grant {
        restarts: slots,
        starts,
        busy_for,
        state: IssuanceBudgetStatus {
            tokens: (tokens * 1000.0).round() / 1000.0,
            background_rate: (background * 1000.0).round() / 1000.0,
            observed_rate: (reading.observed_rate() * 1000.0).round() / 1000.0,
            own_restarts_last_second: slots,
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

    fn secs(s: f64) -> Duration {
        Duration::from_secs_f64(s)
    }

    #[test]
    fn grants_follow_the_bucket_the_peak_and_the_background() {
        let b = budget(200, 2000, 2000);
        let quiet = reading(0.0, 0.0);
        struct Row {
            name: &'static str,
            previous: Option<IssuanceBudgetStatus>,
            reading: Option<IssuanceReading>,
            costs: Vec<u32>,
            window: Window,
            now: i64,
            want: u32,
            held: Option<Hold>,
        }
        let prev = |tokens: f64, at: i64| IssuanceBudgetStatus {
            tokens,
            updated_at: Some(Time(t(at))),
            ..IssuanceBudgetStatus::default()
        };
        let ones = |n: usize| vec![1; n];
        let two_s = Window::default();
        let table = vec![
            Row {
                // 1,900 tokens spaced at 1,899/s, then the refill of 190/s until the horizon.
                name: "a fresh bucket: the depth (with the safety margin) then the refill",
                previous: None,
                reading: Some(quiet),
                costs: ones(5000),
                window: two_s,
                now: 0,
                want: 2279,
                held: Some(Hold::Tokens),
            },
            Row {
                name: "no reading holds: no data is not zero",
                previous: None,
                reading: None,
                costs: ones(10),
                window: two_s,
                now: 0,
                want: 0,
                held: Some(Hold::NoReading),
            },
            Row {
                name: "a second tick within a tick of a grant grants nothing",
                previous: Some(IssuanceBudgetStatus {
                    own_restarts_last_second: 5,
                    ..prev(1000.0, 0)
                }),
                reading: Some(quiet),
                costs: ones(10),
                window: two_s,
                now: 500,
                want: 0,
                held: Some(Hold::NotDue),
            },
            Row {
                name: "refill at the rate with the margin, prepaid up to the horizon",
                previous: Some(prev(0.0, 0)),
                reading: Some(quiet),
                costs: ones(5000),
                window: two_s,
                now: 3000,
                want: 949,
                held: Some(Hold::Tokens),
            },
            Row {
                name: "a debt left by the previous grant is paid first",
                previous: Some(prev(-100.0, 0)),
                reading: Some(quiet),
                costs: ones(5000),
                window: two_s,
                now: 1000,
                want: 469,
                held: Some(Hold::Tokens),
            },
            Row {
                name: "background shrinks the refill",
                previous: Some(prev(0.0, 0)),
                reading: Some(reading(1000.0, 0.0)),
                costs: ones(5000),
                window: two_s,
                now: 2000,
                want: 159,
                held: Some(Hold::Tokens),
            },
            Row {
                name: "own restarts are not background",
                previous: Some(prev(0.0, 0)),
                reading: Some(reading(1900.0, 1900.0)),
                costs: ones(5000),
                window: two_s,
                now: 2000,
                want: 759,
                held: Some(Hold::Tokens),
            },
            Row {
                name: "background at the full rate is over budget",
                previous: Some(prev(1900.0, 0)),
                reading: Some(reading(2100.0, 0.0)),
                costs: ones(5),
                window: two_s,
                now: 2000,
                want: 0,
                held: Some(Hold::OverBudget),
            },
            Row {
                name: "a window over depth + rate x window is over budget",
                previous: Some(prev(1900.0, 0)),
                reading: Some(reading(4001.0, 3000.0)),
                costs: ones(5),
                window: two_s,
                now: 2000,
                want: 0,
                held: Some(Hold::OverBudget),
            },
            Row {
                name: "a tick that granted nothing does not hold the next one",
                previous: Some(prev(1000.0, 0)),
                reading: Some(quiet),
                costs: ones(10),
                window: two_s,
                now: 500,
                want: 10,
                held: None,
            },
            Row {
                name: "wanted fewer than allowed",
                previous: Some(prev(100.0, 0)),
                reading: Some(quiet),
                costs: ones(7),
                window: two_s,
                now: 1000,
                want: 7,
                held: None,
            },
            Row {
                name: "the previous schedule still runs: slots only after it, within the horizon",
                previous: None,
                reading: Some(quiet),
                costs: ones(5000),
                window: Window {
                    busy_for: secs(1.5),
                    horizon: secs(2.0),
                },
                now: 0,
                want: 950,
                held: Some(Hold::Peak),
            },
            Row {
                name: "a unit too dear for the window is skipped; a cheaper one after it fits",
                previous: Some(prev(5.0, 0)),
                reading: Some(quiet),
                costs: vec![1000, 1],
                window: two_s,
                now: 1000,
                want: 1,
                held: Some(Hold::Tokens),
            },
        ];
        for row in table {
            let g = grant(
                &b,
                row.previous.as_ref(),
                row.reading.as_ref(),
                &row.costs,
                row.window,
                t(row.now),
            );
            assert_eq!(g.restarts, row.want, "{}", row.name);
            assert_eq!(g.held_by, row.held, "{}", row.name);
            assert_eq!(g.starts.len(), row.costs.len(), "{}", row.name);
            let granted: u32 = g
                .starts
                .iter()
                .zip(&row.costs)
                .filter(|(s, _)| s.is_some())
                .map(|(_, c)| c)
                .sum();
            assert_eq!(
                granted, row.want,
                "{}: starts agree with the count",
                row.name
            );
            assert!(
                g.starts
                    .iter()
                    .flatten()
                    .all(|s| *s >= row.window.busy_for && *s < row.window.horizon),
                "{}: every start within the window",
                row.name
            );
            if row.held == Some(Hold::OverBudget) {
                assert!(g.state.throttled, "{}", row.name);
                assert_eq!(g.state.tokens, 0.0, "{}: bucket emptied", row.name);
            }
            if row.held != Some(Hold::NotDue) && row.held != Some(Hold::NoReading) {
                assert_eq!(g.state.own_restarts_last_second, row.want, "{}", row.name);
            }
        }
    }

    /// Simulates the operator granting at ticks `gap` apart (each grant scheduling after the
    /// previous one's last slot) against a constant background, checks the budget's promise on
    /// every window the simulation produced, and returns the starts (ms) and the largest gap
    /// between two consecutive starts once the first bucket was spent.
    fn simulate(b: &IssuanceBudget, background: f64, gap: impl Fn(i64) -> i64) -> Vec<i64> {
        let (rate, depth, peak) = (b.rate, b.depth, b.peak_per_second);
        let mut state: Option<IssuanceBudgetStatus> = None;
        // (time ms, count) of every issuance, sluice's and the background's.
        let mut events: Vec<(i64, f64)> = Vec::new();
        let mut starts = Vec::new();
        let mut busy_until = 0_i64;
        let mut now = 0_i64;
        // The reconcile's estimate of the time to the next tick: the last interval.
        let mut last_gap = gap(0);
        while now < 60_000 {
            let costs = vec![1; 100_000];
            let g = grant(
                b,
                state.as_ref(),
                Some(&IssuanceReading {
                    window_seconds: 10.0,
                    issued: background * 10.0,
                    own: 0.0,
                }),
                &costs,
                Window {
                    busy_for: Duration::from_millis((busy_until - now).max(0) as u64),
                    horizon: Duration::from_millis((last_gap * 3 / 2).max(2000) as u64),
                },
                t(now),
            );
            for s in g.starts.iter().flatten() {
                let at = now + s.as_millis() as i64;
                events.push((at, 1.0));
                starts.push(at);
            }
            if g.restarts > 0 {
                busy_until = now + g.busy_for.as_millis() as i64;
            }
            state = Some(g.state);
            last_gap = gap(now);
            now += last_gap;
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
                if w > 15.0 {
                    break; // longer windows are further from the bound (the refill is 95%)
                }
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
        starts.sort();
        starts
    }

    #[test]
    fn every_window_stays_within_depth_plus_rate_times_length_and_the_peak() {
        for (rate, depth, peak, background) in [
            (200, 2000, 2000, 0.0),
            (200, 2000, 2000, 80.0),
            (5, 10, 10, 0.0),
            (5, 10, 10, 2.0),
            (50, 20, 60, 10.0),
            (8, 8, 10, 0.0),
        ] {
            let b = budget(rate, depth, peak);
            // Ticks 1.0-1.3 s apart, and slow ticks 2.5-3.4 s apart.
            simulate(&b, background, |now| 1000 + (now / 1000 % 3) * 150);
            simulate(&b, background, |now| 2500 + (now / 1000 % 4) * 300);
        }
    }

    #[test]
    fn restarts_flow_at_the_headroom_whatever_the_time_between_ticks() {
        let b = budget(10, 100, 100);
        let h = headroom(&b, 0.0);
        for (name, gap) in [
            (
                "ticks 1 s apart",
                Box::new(|_| 1000_i64) as Box<dyn Fn(i64) -> i64>,
            ),
            (
                "slow ticks 2.5-3.4 s apart",
                Box::new(|now| 2500 + (now / 1000 % 4) * 300),
            ),
        ] {
            let starts = simulate(&b, 0.0, gap);
            // Once the first bucket is spent, restarts start one by one as tokens accrue.
            let drained = starts[(f64::from(b.depth) * SAFETY) as usize];
            let later: Vec<i64> = starts.iter().copied().filter(|s| *s > drained).collect();
            let widest = later.windows(2).map(|w| w[1] - w[0]).max().unwrap();
            assert!(
                widest as f64 <= 1000.0 / h + 1.0,
                "{name}: a gap of {widest} ms between restarts (tokens accrue every {:.0} ms)",
                1000.0 / h
            );
            let span = (later.last().unwrap() - drained) as f64 / 1000.0;
            let pace = later.len() as f64 / span;
            assert!(
                pace >= h * 0.97,
                "{name}: {pace:.2}/s of a headroom of {h}/s"
            );
        }
    }

    #[test]
    fn the_peak_cap_spaces_restarts_less_the_background() {
        let b = budget(200, 2000, 500);
        let one_s = Window {
            busy_for: Duration::ZERO,
            horizon: Duration::from_secs(1),
        };
        let g = grant(&b, None, Some(&reading(0.0, 0.0)), &[1; 5000], one_s, t(0));
        assert_eq!((g.restarts, g.held_by), (474, Some(Hold::Peak)));
        let g = grant(
            &b,
            None,
            Some(&reading(1000.0, 0.0)),
            &[1; 5000],
            one_s,
            t(0),
        );
        assert_eq!(
            g.restarts, 324,
            "475 less 1.5 x 100/s of background, less one for the spacing's ends"
        );
        let starts: Vec<Duration> = g.starts.iter().flatten().copied().collect();
        assert!(
            starts
                .windows(2)
                .all(|w| w[1] - w[0] >= Duration::from_secs_f64(1.0 / 324.0 - 1e-9))
        );
        assert!(
            (g.busy_for.as_secs_f64() - 1.0).abs() < 1e-6,
            "the next grant starts one spacing after the last slot: {:?}",
            g.busy_for
        );
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
