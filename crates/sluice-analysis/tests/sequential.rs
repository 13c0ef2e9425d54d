//! The trade-off of the default error gate at production settings (30 s interval, 2 m window,
//! 1%→5%→25%→50% weight steps of at least 5 m), simulated with seeded Poisson traffic: the
//! false-abort rate of a healthy canary over a whole rollout, and the detection delay of a 1%
//! canary whose 5xx ratio turns 2.3× stable's, at 20, 200 and 2,000 requests/s, for the old rule
//! (ratio over a sliding 2 m window, ≤ 1.5× stable, 2 consecutive breaches, ≥ 100 requests in
//! the window) and the new default (the sequential test on counts since the step began).
//!
//! Print the table: `cargo test -p sluice-analysis --test sequential -- --nocapture`.

use std::time::Duration;

use jiff::Timestamp;
use sluice_analysis::decide::{self, RateScope, SequentialKind, decide_rate, sequential_kind};
use sluice_analysis::sequential::{DEFAULT_FALSE_ABORT_RATE, IntervalCounts, per_test_alpha};
use sluice_analysis::{BaselineReading, Observation, OwnerContext};
use sluice_api::v1alpha1::{BuiltinGate, Gate, GateVerdict, ResolvedGate, Verdict};

const INTERVAL_S: u64 = 30;
const WINDOW_INTERVALS: usize = 4; // 2 m
const STEPS: [f64; 4] = [0.01, 0.05, 0.25, 0.5];
const STEP_MIN_INTERVALS: usize = 10; // 5 m
const GIVE_UP_INTERVALS: usize = 120; // 60 m in one step: counted as stalled
const STABLE_ERROR_RATIO: f64 = 0.01;
const FAULT_FACTOR: f64 = 2.3;
const FAULT_AFTER_INTERVALS: usize = 4; // the fault starts 2 m into the 1% step
/// Sequential tests of one rollout: 4 weight steps × 3 default gates share the 1% budget.
const TESTS_PER_ROLLOUT: usize = 12;

/// splitmix64: a small deterministic generator, so the table is the same on every run.
struct Rng(u64);

impl Rng {
    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn uniform(&mut self) -> f64 {
        ((self.next_u64() >> 11) as f64 + 0.5) / (1u64 << 53) as f64
    }

    /// Poisson(λ): exact (Knuth) below 30, normal approximation above.
    fn poisson(&mut self, lambda: f64) -> f64 {
        if lambda <= 0.0 {
            return 0.0;
        }
        if lambda < 30.0 {
            let limit = (-lambda).exp();
            let mut k = 0.0;
            let mut p = self.uniform();
            while p > limit {
                k += 1.0;
                p *= self.uniform();
            }
            return k;
        }
        let (u1, u2) = (self.uniform(), self.uniform());
        let z = (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos();
        (lambda + z * lambda.sqrt()).round().max(0.0)
    }
}

/// One 30 s interval of traffic at `rps` with the canary at `share` and its 5xx ratio at
/// `canary_ratio` (stable at 1%): requests are Poisson, and so are their 5xx (thinning).
fn traffic(rng: &mut Rng, rps: f64, share: f64, canary_ratio: f64) -> IntervalCounts {
    let n = rps * INTERVAL_S as f64;
    let (nc, ns) = (n * share, n * (1.0 - share));
    let canary_bad = rng.poisson(nc * canary_ratio);
    let canary_ok = rng.poisson(nc * (1.0 - canary_ratio));
    let stable_bad = rng.poisson(ns * STABLE_ERROR_RATIO);
    let stable_ok = rng.poisson(ns * (1.0 - STABLE_ERROR_RATIO));
    IntervalCounts {
        canary_requests: canary_bad + canary_ok,
        canary_bad,
        stable_requests: stable_bad + stable_ok,
        stable_bad,
    }
}

fn at(i: usize) -> Timestamp {
    Timestamp::from_second(1_800_000_000 + (i as u64 * INTERVAL_S) as i64).unwrap()
}

fn error_gate() -> ResolvedGate {
    Gate::builtin("error-ratio", BuiltinGate::ErrorRatioVsStable)
        .resolve(None)
        .unwrap()
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Rule {
    Old,
    New,
}

/// How one simulated rollout ended.
#[derive(Clone, Copy, Debug, PartialEq)]
enum End {
    /// Every step passed.
    Promoted,
    /// The gate failed, at this interval (counted from the rollout's start).
    Aborted(usize),
    /// A step did not pass within an hour.
    Stalled,
}

/// The old rule, evaluated at the end of interval `i` of the whole stream (the window slides
/// across steps, as it did), with the previous verdict carried like the status does.
fn old_verdict(
    gate: &ResolvedGate,
    stream: &[IntervalCounts],
    previous: Option<&GateVerdict>,
    now: Timestamp,
) -> GateVerdict {
    let from = stream.len().saturating_sub(WINDOW_INTERVALS);
    let w = stream[from..]
        .iter()
        .fold(IntervalCounts::default(), |a, c| IntervalCounts {
            canary_requests: a.canary_requests + c.canary_requests,
            canary_bad: a.canary_bad + c.canary_bad,
            stable_requests: a.stable_requests + c.stable_requests,
            stable_bad: a.stable_bad + c.stable_bad,
        });
    let ratio = |bad: f64, n: f64| if n > 0.0 { bad / n } else { f64::NAN };
    let observation = Observation::Measured {
        value: (w.canary_requests > 0.0).then(|| ratio(w.canary_bad, w.canary_requests)),
        samples: Some(w.canary_requests),
        baseline: Some(BaselineReading {
            value: (w.stable_requests > 0.0).then(|| ratio(w.stable_bad, w.stable_requests)),
            samples: Some(w.stable_requests),
        }),
        distribution: None,
    };
    let owner = OwnerContext {
        share_target: None,
        share_tolerance: 0.2,
    };
    decide::decide(gate, &observation, previous, owner, now)
}

/// One rollout through the four weight steps; the canary's 5xx ratio turns `fault` × stable's
/// `FAULT_AFTER_INTERVALS` into the first step when `fault` is set.
fn rollout(rule: Rule, rng: &mut Rng, rps: f64, fault: Option<f64>) -> End {
    let gate = error_gate();
    let scope = RateScope {
        alpha: per_test_alpha(DEFAULT_FALSE_ABORT_RATE, TESTS_PER_ROLLOUT),
        max_intervals: GIVE_UP_INTERVALS,
    };
    let interval = Duration::from_secs(INTERVAL_S);
    let mut stream: Vec<IntervalCounts> = Vec::new();
    let mut previous: Option<GateVerdict> = None;
    for share in STEPS {
        let step_start = stream.len();
        loop {
            let i = stream.len();
            let ratio = match fault {
                Some(f) if i >= FAULT_AFTER_INTERVALS => STABLE_ERROR_RATIO * f,
                _ => STABLE_ERROR_RATIO,
            };
            stream.push(traffic(rng, rps, share, ratio));
            let now = at(i + 1);
            let v = match rule {
                Rule::Old => old_verdict(&gate, &stream, previous.as_ref(), now),
                Rule::New => decide_rate(
                    &gate,
                    SequentialKind::Errors,
                    &stream[step_start..],
                    at(step_start),
                    interval,
                    scope,
                    previous.as_ref(),
                    now,
                ),
            };
            let passed = v.verdict == Verdict::Pass;
            if v.verdict == Verdict::Fail {
                return End::Aborted(i + 1);
            }
            previous = Some(v);
            let in_step = stream.len() - step_start;
            if passed && in_step >= STEP_MIN_INTERVALS {
                break;
            }
            if in_step >= GIVE_UP_INTERVALS {
                return End::Stalled;
            }
        }
    }
    End::Promoted
}

struct Row {
    rps: f64,
    rule: Rule,
    false_aborts: f64,
    healthy_stalled: f64,
    median_delay_s: Option<f64>,
    p90_delay_s: Option<f64>,
    faulty_held: f64,
    aborted_before_fault: f64,
    escaped: f64,
}

fn quantile(sorted: &[f64], q: f64) -> Option<f64> {
    (!sorted.is_empty()).then(|| sorted[((sorted.len() - 1) as f64 * q).round() as usize])
}

fn row(rule: Rule, rps: f64, healthy_runs: usize, faulty_runs: usize) -> Row {
    let mut rng = Rng(0x5EED ^ rps.to_bits() ^ (rule == Rule::New) as u64);
    let mut aborted = 0;
    let mut stalled = 0;
    for _ in 0..healthy_runs {
        match rollout(rule, &mut rng, rps, None) {
            End::Aborted(_) => aborted += 1,
            End::Stalled => stalled += 1,
            End::Promoted => {}
        }
    }
    let mut delays = Vec::new();
    let (mut held, mut before, mut escaped) = (0, 0, 0);
    for _ in 0..faulty_runs {
        match rollout(rule, &mut rng, rps, Some(FAULT_FACTOR)) {
            End::Aborted(i) if i > FAULT_AFTER_INTERVALS => {
                delays.push(((i - FAULT_AFTER_INTERVALS) as u64 * INTERVAL_S) as f64)
            }
            // Aborted before the fault: a false abort, not a detection.
            End::Aborted(_) => before += 1,
            End::Promoted => escaped += 1,
            End::Stalled => held += 1,
        }
    }
    delays.sort_by(f64::total_cmp);
    Row {
        rps,
        rule,
        false_aborts: aborted as f64 / healthy_runs as f64,
        healthy_stalled: stalled as f64 / healthy_runs as f64,
        median_delay_s: quantile(&delays, 0.5),
        p90_delay_s: quantile(&delays, 0.9),
        faulty_held: held as f64 / faulty_runs as f64,
        aborted_before_fault: before as f64 / faulty_runs as f64,
        escaped: escaped as f64 / faulty_runs as f64,
    }
}

fn show(v: Option<f64>) -> String {
    v.map_or("-".into(), |s| format!("{s:.0} s"))
}

#[test]
fn trade_off_table_of_the_default_error_gate() {
    // The default built-in error gate is judged by the sequential test.
    assert_eq!(
        sequential_kind(&error_gate()),
        Some(SequentialKind::Errors),
        "the default ErrorRatioVsStable gate must use the sequential test"
    );
    let healthy_runs = 2000;
    let faulty_runs = 400;
    let mut rows = Vec::new();
    for rps in [20.0, 200.0, 2000.0] {
        for rule in [Rule::Old, Rule::New] {
            rows.push(row(rule, rps, healthy_runs, faulty_runs));
        }
    }
    println!(
        "\nDefault error gate, 30 s interval, steps 1/5/25/50% of >= 5 m, stable 5xx 1%, {healthy_runs} healthy and {faulty_runs} faulty rollouts per row"
    );
    println!(
        "| requests/s | rule | false aborts (healthy rollouts) | healthy rollouts held (a step not passed in 60 m) | 2.3x canary: detection delay, median | p90 | held undetected (60 m) | aborted before the fault | promoted undetected |"
    );
    println!("|---|---|---|---|---|---|---|---|---|");
    for r in &rows {
        println!(
            "| {} | {} | {:.2}% | {:.1}% | {} | {} | {:.1}% | {:.1}% | {:.1}% |",
            r.rps,
            match r.rule {
                Rule::Old => "old: 2 m window ≤ 1.5× stable, 2 consecutive",
                Rule::New => "new: sequential test since the step began",
            },
            r.false_aborts * 100.0,
            r.healthy_stalled * 100.0,
            show(r.median_delay_s),
            show(r.p90_delay_s),
            r.faulty_held * 100.0,
            r.aborted_before_fault * 100.0,
            r.escaped * 100.0
        );
    }
    for r in rows.iter().filter(|r| r.rule == Rule::New) {
        assert!(
            r.false_aborts <= DEFAULT_FALSE_ABORT_RATE,
            "new gate at {} requests/s aborts {:.2}% of healthy rollouts, above the 1% target",
            r.rps,
            r.false_aborts * 100.0
        );
        assert!(
            r.escaped < 0.01,
            "new gate at {} requests/s promotes {:.1}% of 2.3x canaries",
            r.rps,
            r.escaped * 100.0
        );
    }
    // At 2,000 requests/s the traffic allows a fast verdict: within a few minutes.
    let fast = rows
        .iter()
        .find(|r| r.rule == Rule::New && r.rps == 2000.0)
        .unwrap();
    assert!(
        fast.median_delay_s.unwrap() <= 300.0,
        "{:?}",
        fast.median_delay_s
    );
}
