//! The pure verdict logic: (resolved gate, observation, previous verdict, now) → next verdict,
//! (gate, verdict, now) → what the owner should do, and several gates' actions → the one the
//! owner takes ([`combined_action`]).
//!
//! Owns the rules every operator shares: an error, an empty result or a NaN is never a Pass;
//! below the minimum sample count the verdict is Inconclusive; a breach becomes Fail only after
//! `consecutiveFailures` breaches in a row; a gate Inconclusive for longer than its policy's
//! `after` triggers the policy's action. Never performs I/O and never reads the clock.
//!
//! The share check's minimum follows from the target share `p` and the relative tolerance `t`:
//! with `n` requests the observed share has binomial standard error `sqrt(p(1-p)/n)`; requiring
//! it to be at most `t·p / z` (so the tolerance band is `z` standard errors wide, z = 1.96 for
//! ≈95%) gives `n ≥ z²(1-p) / (p·t²)` — about 9,500 requests at 1% ±20%, 100 at 50% ±20%
//! ([`sluice_api::v1alpha1::gate::share_min_samples`]). The effective minimum is the larger of
//! that and the gate's `minSamples`.

use jiff::Timestamp;

use crate::mann_whitney::UTest;
use crate::sequential::{IntervalCounts, RateTest, SequentialState, rate_test, share_test};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use sluice_api::v1alpha1::gate::share_min_samples;
use sluice_api::v1alpha1::{
    BaselineSource, GateVerdict, InconclusiveAction, InconclusivePolicy, ResolvedGate, Verdict,
    VerdictReason,
};

/// Longest message kept in a verdict (the CRD bounds it at 1024 characters).
const MAX_MESSAGE: usize = 1024;

/// What the engine saw for one gate instance.
#[derive(Clone, Debug, PartialEq)]
pub enum Observation {
    /// The query answered.
    Measured {
        /// The value (`None`: the query returned nothing for this object).
        value: Option<f64>,
        /// Samples behind the value (`None`: unknown).
        samples: Option<f64>,
        /// The baseline reading, for relative comparisons (`None`: none available).
        baseline: Option<BaselineReading>,
        /// The optional Mann–Whitney comparison of per-interval samples (relative gates only).
        distribution: Option<DistributionTest>,
    },
    /// The provider failed (reason `QueryError` or `Timeout`).
    Failed {
        /// `QueryError` or `Timeout`.
        reason: VerdictReason,
        /// What went wrong.
        message: String,
    },
}

/// A baseline value and the samples behind it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BaselineReading {
    /// The baseline value (`None`: no data).
    pub value: Option<f64>,
    /// Samples behind it.
    pub samples: Option<f64>,
}

/// A Mann–Whitney test result and the significance level it is judged at.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct DistributionTest {
    /// The test over canary and baseline per-interval values.
    pub test: UTest,
    /// Significance level: the canary is significantly worse when `p_worse < alpha`.
    pub alpha: f64,
}

/// Inputs of [`decide`] that come from the owner rather than the gate.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct OwnerContext {
    /// Target share (0..1) for share checks, e.g. a Rollout's desired weight ÷ 100.
    pub share_target: Option<f64>,
    /// Relative tolerance (0..1) used when the gate's share comparison sets none.
    pub share_tolerance: f64,
}

/// What the owner should do with a gate's verdict. Declared from the mildest to the most severe,
/// which is the order [`combined_action`] compares them in.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum GateAction {
    /// The gate passed (or a sustained Inconclusive with policy Continue).
    Proceed,
    /// Not yet judgeable, keep waiting (Inconclusive, not yet sustained).
    Wait,
    /// Sustained Inconclusive with policy Pause: hold until a person acts or the gate passes.
    Pause,
    /// Fail, or sustained Inconclusive with policy Abort.
    Abort,
}

fn time(now: Timestamp) -> Time {
    Time(now)
}

fn truncate(mut message: String) -> String {
    if message.len() > MAX_MESSAGE {
        let mut cut = MAX_MESSAGE - 3;
        while !message.is_char_boundary(cut) {
            cut -= 1;
        }
        message.truncate(cut);
        message.push_str("...");
    }
    message
}

/// The judgement of one evaluation before the consecutive-failure rule.
struct Judgement {
    passed: Option<bool>,
    reason: VerdictReason,
    message: String,
    value: Option<f64>,
    baseline: Option<f64>,
    threshold: Option<f64>,
    samples: Option<u64>,
    min_samples: Option<u64>,
}

fn inconclusive(reason: VerdictReason, message: String) -> Judgement {
    Judgement {
        passed: None,
        reason,
        message,
        value: None,
        baseline: None,
        threshold: None,
        samples: None,
        min_samples: None,
    }
}

fn judge(gate: &ResolvedGate, observation: &Observation, owner: OwnerContext) -> Judgement {
    let (value, samples, baseline, distribution) = match observation {
        Observation::Failed { reason, message } => return inconclusive(*reason, message.clone()),
        Observation::Measured {
            value,
            samples,
            baseline,
            distribution,
        } => (*value, *samples, *baseline, *distribution),
    };
    let Some(value) = value else {
        return inconclusive(
            VerdictReason::NoData,
            "the query returned no series for this object".into(),
        );
    };
    let share = gate.comparison.share.as_ref();
    let tolerance = share
        .and_then(|s| s.tolerance_percent)
        .map_or(owner.share_tolerance, |p| f64::from(p) / 100.0);
    let min_samples = match (share, owner.share_target) {
        (Some(_), Some(target)) => gate.min_samples.max(share_min_samples(target, tolerance)),
        _ => gate.min_samples,
    };
    let seen = samples
        .filter(|s| s.is_finite())
        .map(|s| s.max(0.0).round() as u64);
    let mut j = inconclusive(VerdictReason::TooFewSamples, String::new());
    j.value = Some(value).filter(|v| !v.is_nan());
    j.samples = seen;
    j.min_samples = Some(min_samples);
    match seen {
        None if min_samples > 0 => {
            j.message = format!(
                "the query reports no sample count and {min_samples} samples are required; a custom template reports \
                 its count as a series labelled sluice_part=\"samples\", or set minSamples: 0"
            );
            return j;
        }
        Some(n) if n < min_samples => {
            j.message = format!("{n} samples in the window, {min_samples} required");
            return j;
        }
        _ => {}
    }
    if value.is_nan() {
        j.reason = VerdictReason::NoData;
        j.message = "the value is undefined (NaN: no traffic in the window)".into();
        return j;
    }
    if let Some(abs) = &gate.comparison.absolute {
        let passed = abs.op.passes(value, abs.value);
        j.threshold = Some(abs.value);
        j.passed = Some(passed);
        j.reason = if passed {
            VerdictReason::ThresholdMet
        } else {
            VerdictReason::ThresholdBreached
        };
        j.message = format!(
            "value {value} {:?} {}: {}",
            abs.op,
            abs.value,
            if passed { "held" } else { "breached" }
        );
        return j;
    }
    if let Some(rel) = &gate.comparison.relative {
        let source = match rel.baseline {
            BaselineSource::StableNow => "stable baseline",
            BaselineSource::PreChangeWindow => "pre-change baseline",
        };
        let Some(base) = baseline else {
            j.reason = VerdictReason::BaselineMissing;
            j.message = format!("no {source} available (not bound or not captured)");
            return j;
        };
        let Some(base_value) = base.value.filter(|v| !v.is_nan()) else {
            j.reason = VerdictReason::BaselineMissing;
            j.message = format!("the {source} query returned no data");
            return j;
        };
        if let Some(base_samples) = base.samples
            && base_samples.round() < gate.min_samples as f64
        {
            j.reason = VerdictReason::TooFewSamples;
            j.message = format!(
                "{source} has {base_samples} samples, {} required",
                gate.min_samples
            );
            return j;
        }
        let threshold = rel.factor * base_value + rel.slack.unwrap_or(0.0);
        let mut passed = rel.op.passes(value, threshold);
        let mut note = String::new();
        if let Some(d) = distribution {
            // Kayenta-style: a significant difference fails only when its size (the medians of
            // the per-interval samples) also breaches the allowed factor. It never turns a breach
            // into a pass.
            let t = d.test;
            let median_threshold = rel.factor * t.baseline_median + rel.slack.unwrap_or(0.0);
            let significant = t.p_worse < d.alpha;
            let large = !rel.op.passes(t.canary_median, median_threshold);
            note = format!(
                "; Mann-Whitney over {} and {} intervals: p={:.4}, medians {} vs {}",
                t.n_canary, t.n_baseline, t.p_worse, t.canary_median, t.baseline_median
            );
            if passed && significant && large {
                passed = false;
                note.push_str(": canary significantly worse");
            }
        }
        j.baseline = Some(base_value);
        j.threshold = Some(threshold);
        j.passed = Some(passed);
        j.reason = if passed {
            VerdictReason::ThresholdMet
        } else {
            VerdictReason::ThresholdBreached
        };
        j.message = format!(
            "value {value} {:?} {threshold} ({} × {source} {base_value} + {}): {}",
            rel.op,
            rel.factor,
            rel.slack.unwrap_or(0.0),
            if passed { "held" } else { "breached" }
        ) + &note;
        return j;
    }
    if share.is_some() {
        let Some(target) = owner.share_target else {
            j.reason = VerdictReason::QueryError;
            j.message = "share check without a target share from the owner".into();
            return j;
        };
        let passed = (value - target).abs() <= tolerance * target;
        j.threshold = Some(target);
        j.passed = Some(passed);
        j.reason = if passed {
            VerdictReason::WithinTolerance
        } else {
            VerdictReason::OutsideTolerance
        };
        j.message = format!(
            "applied share {value:.4} vs target {target:.4} ±{:.0}%: {}",
            tolerance * 100.0,
            if passed { "within" } else { "outside" }
        );
        return j;
    }
    j.reason = VerdictReason::QueryError;
    j.message = "the gate has no comparison".into();
    j
}

/// The next verdict of a gate. `previous` is the verdict recorded in the owner's status (its
/// `consecutiveFailures` and `inconclusiveSince` carry the state across restarts).
pub fn decide(
    gate: &ResolvedGate,
    observation: &Observation,
    previous: Option<&GateVerdict>,
    owner: OwnerContext,
    now: Timestamp,
) -> GateVerdict {
    let j = judge(gate, observation, owner);
    let prev_failures = previous.map_or(0, |p| p.consecutive_failures);
    let prev_since = previous.and_then(|p| p.inconclusive_since.clone());
    let (verdict, failures, message) = match j.passed {
        Some(true) => (Verdict::Pass, 0, j.message),
        Some(false) => {
            let failures = prev_failures.saturating_add(1);
            if failures >= gate.consecutive_failures {
                (Verdict::Fail, failures, j.message)
            } else {
                let message = format!(
                    "{} (breach {failures} of {} before Fail)",
                    j.message, gate.consecutive_failures
                );
                (Verdict::Inconclusive, failures, message)
            }
        }
        // Not judgeable: the failure streak is neither extended nor reset.
        None => (Verdict::Inconclusive, prev_failures, j.message),
    };
    let inconclusive_since = match verdict {
        Verdict::Inconclusive => Some(prev_since.unwrap_or_else(|| time(now))),
        _ => None,
    };
    GateVerdict {
        gate: gate.name.clone(),
        verdict,
        reason: j.reason,
        message: Some(truncate(message)),
        value: j.value,
        baseline: j.baseline,
        threshold: j.threshold,
        samples: j.samples,
        min_samples: j.min_samples,
        consecutive_failures: failures,
        inconclusive_since,
        evaluated_at: time(now),
    }
}

/// Which sequential test judges a gate by default (see [`crate::sequential`]): the built-in
/// canary gates compared with `StableNow` (errors, p99 latency as slow requests) and the applied
/// share. Every other gate (custom templates, absolute thresholds, pre-change baselines) keeps
/// the threshold rule.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SequentialKind {
    /// ErrorRatioVsStable: error counts (5xx and gRPC server errors), canary vs stable.
    Errors,
    /// LatencyP99VsStable: requests slower than the stable's p99 bucket bound, canary vs stable.
    SlowRequests,
    /// AppliedShare: canary of route requests since the step's first full interval.
    Share,
}

/// The sequential test a gate uses by default, if any.
pub fn sequential_kind(gate: &ResolvedGate) -> Option<SequentialKind> {
    use sluice_api::v1alpha1::{BuiltinGate, GateQuery};
    let stable_now = gate
        .comparison
        .relative
        .as_ref()
        .is_some_and(|r| r.baseline == BaselineSource::StableNow);
    match gate.query {
        GateQuery::Builtin(BuiltinGate::ErrorRatioVsStable) if stable_now => {
            Some(SequentialKind::Errors)
        }
        GateQuery::Builtin(BuiltinGate::LatencyP99VsStable) if stable_now => {
            Some(SequentialKind::SlowRequests)
        }
        GateQuery::Builtin(BuiltinGate::AppliedShare) if gate.comparison.share.is_some() => {
            Some(SequentialKind::Share)
        }
        _ => None,
    }
}

/// The bad-request test of a gate: its `factor`, its `minSamples`, a rate floor from its `slack`
/// (errors only; default 0.5 percentage points) and `alpha`.
pub fn rate_test_of(
    gate: &ResolvedGate,
    kind: SequentialKind,
    alpha: f64,
    max_intervals: usize,
) -> RateTest {
    let rel = gate.comparison.relative.as_ref();
    let mut test = RateTest::new(
        rel.map_or(1.5, |r| r.factor),
        gate.min_samples,
        alpha,
        max_intervals,
    );
    if kind == SequentialKind::Errors
        && let Some(slack) = rel.and_then(|r| r.slack)
        && slack > 0.0
    {
        test.rate_floor = slack;
    }
    test
}

fn seconds(d: std::time::Duration) -> u64 {
    d.as_secs().max(u64::from(d.subsec_millis() > 0))
}

/// The budget and reach of one bad-request test.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RateScope {
    /// The test's `α` (see [`crate::sequential::per_test_alpha`]).
    pub alpha: f64,
    /// Most intervals looked back over.
    pub max_intervals: usize,
}

/// The verdict of a bad-request test over the aligned intervals since the step began
/// (`first` is the start of the first one, each `interval` long). Fail is immediate (the test
/// has its own boundary; `consecutiveFailures` does not apply), Pass once the canary is shown
/// healthy with at least `minSamples` requests, Inconclusive (TooFewSamples) while the evidence
/// is still collecting: the step lengthens.
#[allow(clippy::too_many_arguments)]
pub fn decide_rate(
    gate: &ResolvedGate,
    kind: SequentialKind,
    intervals: &[IntervalCounts],
    first: Timestamp,
    interval: std::time::Duration,
    scope: RateScope,
    previous: Option<&GateVerdict>,
    now: Timestamp,
) -> GateVerdict {
    let test = rate_test_of(gate, kind, scope.alpha, scope.max_intervals);
    let o = rate_test(intervals, &test);
    let what = match kind {
        SequentialKind::Errors => "errors (5xx, gRPC server errors)",
        _ => "requests slower than the stable's p99 bucket",
    };
    let at = |i: usize| {
        let offset = jiff::SignedDuration::try_from(interval * i as u32).unwrap_or_default();
        first.checked_add(offset).unwrap_or(first)
    };
    let summary = format!(
        "sequential test over {} intervals of {}s since {}: canary {} {what} of {} requests ({:.4}), stable {} of {} ({:.4}); statistic {:.2} (Fail at {:.2}, Pass at {:.2}; factor {}, floor {})",
        o.intervals,
        seconds(interval),
        first,
        o.canary.1.round(),
        o.canary.0.round(),
        o.canary_ratio(),
        o.stable.1.round(),
        o.stable.0.round(),
        o.stable_ratio(),
        o.statistic,
        o.upper,
        o.lower,
        test.factor,
        test.rate_floor,
    );
    let (verdict, reason, message) = if o.stable.0 <= 0.0 && o.intervals > 0 {
        (
            Verdict::Inconclusive,
            VerdictReason::BaselineMissing,
            format!("the stable served no requests since the step began; {summary}"),
        )
    } else {
        match o.state {
            SequentialState::Fail => {
                let crossed = o.crossed_at.unwrap_or(0);
                let rising = o.rising_since.unwrap_or(0);
                let end = at(crossed + 1);
                let delay = end.duration_since(at(rising)).as_secs();
                (
                    Verdict::Fail,
                    VerdictReason::ThresholdBreached,
                    format!(
                        "canary worse than {} × stable: evidence crossed the Fail boundary with the interval ending {end}, rising since {} (detection delay {delay}s); {summary}",
                        test.factor,
                        at(rising)
                    ),
                )
            }
            SequentialState::Pass => (
                Verdict::Pass,
                VerdictReason::ThresholdMet,
                format!("canary not worse than {} × stable; {summary}", test.factor),
            ),
            SequentialState::Collecting => {
                let need = if o.canary.0 < test.min_samples as f64 {
                    format!(
                        "{} canary requests, {} required",
                        o.canary.0.round(),
                        test.min_samples
                    )
                } else {
                    "not yet enough evidence either way".to_owned()
                };
                (
                    Verdict::Inconclusive,
                    VerdictReason::TooFewSamples,
                    format!("collecting evidence, the step lengthens ({need}); {summary}"),
                )
            }
        }
    };
    let canary_ratio = o.canary_ratio();
    let stable_ratio = o.stable_ratio();
    finish(
        gate,
        verdict,
        reason,
        message,
        Numbers {
            value: Some(canary_ratio).filter(|v| !v.is_nan()),
            baseline: Some(stable_ratio).filter(|v| !v.is_nan()),
            threshold: Some(stable_ratio.max(test.rate_floor) * test.factor)
                .filter(|v| !v.is_nan()),
            samples: Some(o.canary.0.round() as u64),
            min_samples: Some(test.min_samples),
        },
        previous,
        now,
    )
}

/// The verdict of the share check on the route requests since the step's first full interval:
/// Pass (WithinTolerance) on enough requests, Fail (OutsideTolerance) only on overwhelming
/// evidence, Inconclusive (TooFewSamples) in between.
pub fn decide_share(
    gate: &ResolvedGate,
    canary: f64,
    total: f64,
    owner: OwnerContext,
    previous: Option<&GateVerdict>,
    now: Timestamp,
) -> GateVerdict {
    let Some(target) = owner.share_target else {
        return finish(
            gate,
            Verdict::Inconclusive,
            VerdictReason::QueryError,
            "share check without a target share from the owner".into(),
            Numbers::default(),
            previous,
            now,
        );
    };
    let tolerance = gate
        .comparison
        .share
        .as_ref()
        .and_then(|s| s.tolerance_percent)
        .map_or(owner.share_tolerance, |p| f64::from(p) / 100.0);
    let o = share_test(canary, total, target, tolerance, gate.min_samples);
    let summary = format!(
        "applied share {:.4} of {} route requests since the step began vs target {target:.4} ±{:.0}% (confirmed from {} requests, failed from {})",
        o.share,
        o.requests.round(),
        tolerance * 100.0,
        o.confirm_at,
        o.fail_at
    );
    let (verdict, reason) = match o.state {
        SequentialState::Pass => (Verdict::Pass, VerdictReason::WithinTolerance),
        SequentialState::Fail => (Verdict::Fail, VerdictReason::OutsideTolerance),
        SequentialState::Collecting if o.share.is_nan() => {
            (Verdict::Inconclusive, VerdictReason::NoData)
        }
        SequentialState::Collecting => (Verdict::Inconclusive, VerdictReason::TooFewSamples),
    };
    let message = match o.state {
        SequentialState::Collecting => {
            format!("collecting requests, the step lengthens: {summary}")
        }
        _ => summary,
    };
    finish(
        gate,
        verdict,
        reason,
        message,
        Numbers {
            value: Some(o.share).filter(|v| !v.is_nan()),
            baseline: None,
            threshold: Some(target),
            samples: Some(o.requests.round() as u64),
            min_samples: Some(o.confirm_at),
        },
        previous,
        now,
    )
}

#[derive(Default)]
struct Numbers {
    value: Option<f64>,
    baseline: Option<f64>,
    threshold: Option<f64>,
    samples: Option<u64>,
    min_samples: Option<u64>,
}

fn finish(
    gate: &ResolvedGate,
    verdict: Verdict,
    reason: VerdictReason,
    message: String,
    n: Numbers,
    previous: Option<&GateVerdict>,
    now: Timestamp,
) -> GateVerdict {
    let inconclusive_since = match verdict {
        Verdict::Inconclusive => Some(
            previous
                .and_then(|p| p.inconclusive_since.clone())
                .unwrap_or_else(|| time(now)),
        ),
        _ => None,
    };
    GateVerdict {
        gate: gate.name.clone(),
        verdict,
        reason,
        message: Some(truncate(message)),
        value: n.value,
        baseline: n.baseline,
        threshold: n.threshold,
        samples: n.samples,
        min_samples: n.min_samples,
        consecutive_failures: u32::from(verdict == Verdict::Fail),
        inconclusive_since,
        evaluated_at: time(now),
    }
}

/// The verdict of a gate that could not be evaluated as configured (a missing GateTemplate, a
/// variable its owner cannot supply, a query that cannot be built or run): Inconclusive, never a
/// pass, with why in the message (at most 1,024 characters, cut on a character boundary) and the
/// gate's name cut to the 63 characters a status' verdict holds. The Inconclusive streak and the
/// Fail count carry over from `previous`, so the gate's sustained-Inconclusive policy applies
/// after its deadline as for a metrics outage. Every operator that gates records such a gate
/// through this one function.
pub fn unevaluated(
    gate: &str,
    message: &str,
    previous: Option<&GateVerdict>,
    now: Timestamp,
) -> GateVerdict {
    GateVerdict {
        message: Some(message.chars().take(1024).collect()),
        consecutive_failures: previous.map_or(0, |p| p.consecutive_failures),
        inconclusive_since: Some(
            previous
                .filter(|p| p.verdict == Verdict::Inconclusive)
                .and_then(|p| p.inconclusive_since.clone())
                .unwrap_or_else(|| time(now)),
        ),
        ..GateVerdict::new(
            gate.chars().take(63).collect::<String>(),
            Verdict::Inconclusive,
            VerdictReason::QueryError,
            time(now),
        )
    }
}

/// The action an Inconclusive verdict of a gate that has no resolved policy of its own (it could
/// not be resolved) calls for under its owner's `policy`: Wait until the Inconclusive streak has
/// lasted `policy.after` (5 minutes when that does not parse), then Pause, Abort or Continue
/// (Proceed). A streak that starts in the future (a skewed clock) has not lasted at all.
pub fn policy_action(
    policy: &InconclusivePolicy,
    verdict: &GateVerdict,
    now: Timestamp,
) -> GateAction {
    let since = verdict.inconclusive_since.as_ref().map_or(now, |t| t.0);
    let after: std::time::Duration = policy
        .after
        .parse()
        .unwrap_or(std::time::Duration::from_secs(300));
    let after = jiff::SignedDuration::try_from(after).unwrap_or(jiff::SignedDuration::MAX);
    if now.duration_since(since) < after {
        return GateAction::Wait;
    }
    match policy.action {
        InconclusiveAction::Pause => GateAction::Pause,
        InconclusiveAction::Abort => GateAction::Abort,
        InconclusiveAction::Continue => GateAction::Proceed,
    }
}

/// What several gates call for together: the most severe of their actions (Abort over Pause
/// over Wait over Proceed; Proceed when there is none) and the position of the first gate that
/// calls for it (`None` when there is none), so that an owner halted by a gate can name it. One
/// Abort stops the owner whatever the others say; it goes on only when every gate says Proceed.
pub fn combined_action(
    actions: impl IntoIterator<Item = GateAction>,
) -> (GateAction, Option<usize>) {
    let mut combined = (GateAction::Proceed, None);
    for (i, action) in actions.into_iter().enumerate() {
        if combined.1.is_none() || action > combined.0 {
            combined = (action, Some(i));
        }
    }
    combined
}

/// What the owner should do: Pass → Proceed, Fail → Abort, Inconclusive → Wait until it has
/// lasted the policy's `after`, then the policy's action (Pause, Abort, or Continue = Proceed).
pub fn action(gate: &ResolvedGate, verdict: &GateVerdict, now: Timestamp) -> GateAction {
    match verdict.verdict {
        Verdict::Pass => GateAction::Proceed,
        Verdict::Fail => GateAction::Abort,
        Verdict::Inconclusive => {
            let since = verdict.inconclusive_since.as_ref().map_or(now, |t| t.0);
            let lasted = now.duration_since(since);
            let after = jiff::SignedDuration::try_from(gate.inconclusive_after)
                .unwrap_or(jiff::SignedDuration::MAX);
            if lasted < after {
                return GateAction::Wait;
            }
            match gate.inconclusive_action {
                InconclusiveAction::Pause => GateAction::Pause,
                InconclusiveAction::Abort => GateAction::Abort,
                InconclusiveAction::Continue => GateAction::Proceed,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use sluice_api::v1alpha1::{BuiltinGate, Comparison, ComparisonOp, Gate};

    use super::*;

    fn t(secs: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + secs).unwrap()
    }

    fn gate(comparison: Comparison) -> ResolvedGate {
        let mut g = Gate::builtin("g", BuiltinGate::ErrorRatioVsStable)
            .resolve(None)
            .unwrap();
        g.comparison = comparison;
        g.min_samples = 100;
        g.consecutive_failures = 2;
        g
    }

    fn measured(
        value: Option<f64>,
        samples: Option<f64>,
        baseline: Option<(Option<f64>, Option<f64>)>,
    ) -> Observation {
        Observation::Measured {
            value,
            samples,
            baseline: baseline.map(|(value, samples)| BaselineReading { value, samples }),
            distribution: None,
        }
    }

    const OWNER: OwnerContext = OwnerContext {
        share_target: None,
        share_tolerance: 0.2,
    };

    #[test]
    fn decide_table() {
        let abs = Comparison::absolute(ComparisonOp::LessOrEqual, 0.01);
        let rel = Comparison::relative(BaselineSource::StableNow, 1.5);
        let share = Comparison::share();
        let share_owner = |target| OwnerContext {
            share_target: Some(target),
            share_tolerance: 0.2,
        };
        let failed = |reason| Observation::Failed {
            reason,
            message: "boom".into(),
        };
        #[rustfmt::skip]
        type Case = (&'static str, Comparison, Observation, OwnerContext, u32, Verdict, VerdictReason, u32);
        let cases: Vec<Case> = vec![
            // name, comparison, observation, owner, previous failures, verdict, reason, next failures
            (
                "pass",
                abs.clone(),
                measured(Some(0.001), Some(500.0), None),
                OWNER,
                0,
                Verdict::Pass,
                VerdictReason::ThresholdMet,
                0,
            ),
            (
                "pass resets streak",
                abs.clone(),
                measured(Some(0.001), Some(500.0), None),
                OWNER,
                1,
                Verdict::Pass,
                VerdictReason::ThresholdMet,
                0,
            ),
            (
                "first breach waits",
                abs.clone(),
                measured(Some(0.2), Some(500.0), None),
                OWNER,
                0,
                Verdict::Inconclusive,
                VerdictReason::ThresholdBreached,
                1,
            ),
            (
                "second breach fails",
                abs.clone(),
                measured(Some(0.2), Some(500.0), None),
                OWNER,
                1,
                Verdict::Fail,
                VerdictReason::ThresholdBreached,
                2,
            ),
            (
                "no data",
                abs.clone(),
                measured(None, None, None),
                OWNER,
                1,
                Verdict::Inconclusive,
                VerdictReason::NoData,
                1,
            ),
            (
                "NaN is no data",
                abs.clone(),
                measured(Some(f64::NAN), Some(500.0), None),
                OWNER,
                0,
                Verdict::Inconclusive,
                VerdictReason::NoData,
                0,
            ),
            (
                "too few samples",
                abs.clone(),
                measured(Some(0.0), Some(99.0), None),
                OWNER,
                0,
                Verdict::Inconclusive,
                VerdictReason::TooFewSamples,
                0,
            ),
            (
                "unknown samples",
                abs.clone(),
                measured(Some(0.0), None, None),
                OWNER,
                0,
                Verdict::Inconclusive,
                VerdictReason::TooFewSamples,
                0,
            ),
            (
                "query error",
                abs.clone(),
                failed(VerdictReason::QueryError),
                OWNER,
                1,
                Verdict::Inconclusive,
                VerdictReason::QueryError,
                1,
            ),
            (
                "timeout",
                abs.clone(),
                failed(VerdictReason::Timeout),
                OWNER,
                0,
                Verdict::Inconclusive,
                VerdictReason::Timeout,
                0,
            ),
            (
                "relative pass",
                rel.clone(),
                measured(Some(0.014), Some(500.0), Some((Some(0.01), Some(500.0)))),
                OWNER,
                0,
                Verdict::Pass,
                VerdictReason::ThresholdMet,
                0,
            ),
            (
                "relative breach",
                rel.clone(),
                measured(Some(0.05), Some(500.0), Some((Some(0.01), Some(500.0)))),
                OWNER,
                1,
                Verdict::Fail,
                VerdictReason::ThresholdBreached,
                2,
            ),
            (
                "relative without baseline",
                rel.clone(),
                measured(Some(0.0), Some(500.0), None),
                OWNER,
                0,
                Verdict::Inconclusive,
                VerdictReason::BaselineMissing,
                0,
            ),
            (
                "relative baseline no data",
                rel.clone(),
                measured(Some(0.0), Some(500.0), Some((None, None))),
                OWNER,
                0,
                Verdict::Inconclusive,
                VerdictReason::BaselineMissing,
                0,
            ),
            (
                "relative baseline too few",
                rel.clone(),
                measured(Some(0.0), Some(500.0), Some((Some(0.0), Some(10.0)))),
                OWNER,
                0,
                Verdict::Inconclusive,
                VerdictReason::TooFewSamples,
                0,
            ),
            (
                "share within",
                share.clone(),
                measured(Some(0.27), Some(2000.0), None),
                share_owner(0.25),
                0,
                Verdict::Pass,
                VerdictReason::WithinTolerance,
                0,
            ),
            (
                "share outside",
                share.clone(),
                measured(Some(0.35), Some(2000.0), None),
                share_owner(0.25),
                1,
                Verdict::Fail,
                VerdictReason::OutsideTolerance,
                2,
            ),
            // 1% at ±20% needs ~9,500 requests: 5,000 is too few even though minSamples is 100.
            (
                "share 1% needs more traffic",
                share.clone(),
                measured(Some(0.01), Some(5000.0), None),
                share_owner(0.01),
                0,
                Verdict::Inconclusive,
                VerdictReason::TooFewSamples,
                0,
            ),
            (
                "share 1% with enough",
                share.clone(),
                measured(Some(0.011), Some(10_000.0), None),
                share_owner(0.01),
                0,
                Verdict::Pass,
                VerdictReason::WithinTolerance,
                0,
            ),
            (
                "share without target",
                share.clone(),
                measured(Some(0.5), Some(2000.0), None),
                OWNER,
                0,
                Verdict::Inconclusive,
                VerdictReason::QueryError,
                0,
            ),
        ];
        for (name, comparison, observation, owner, prev_failures, want, reason, failures) in cases {
            let g = gate(comparison);
            let previous = GateVerdict {
                consecutive_failures: prev_failures,
                ..GateVerdict::new(
                    "g",
                    Verdict::Inconclusive,
                    VerdictReason::Pending,
                    time(t(0)),
                )
            };
            let v = decide(&g, &observation, Some(&previous), owner, t(30));
            assert_eq!(
                (v.verdict, v.reason, v.consecutive_failures),
                (want, reason, failures),
                "{name}: {:?}",
                v.message
            );
            assert_ne!(
                v.verdict == Verdict::Pass,
                v.inconclusive_since.is_some() || v.verdict == Verdict::Fail,
                "{name}"
            );
        }
    }

    #[test]
    fn empty_or_failed_observations_never_pass_whatever_the_comparison() {
        let comparisons = [
            Comparison::absolute(ComparisonOp::GreaterOrEqual, 0.0),
            Comparison::absolute(ComparisonOp::LessOrEqual, f64::INFINITY),
            Comparison::relative(BaselineSource::StableNow, 1e9),
            Comparison::share(),
        ];
        let observations = [
            measured(None, None, None),
            measured(None, Some(1e9), Some((Some(1.0), Some(1e9)))),
            measured(Some(f64::NAN), Some(1e9), Some((Some(1.0), Some(1e9)))),
            Observation::Failed {
                reason: VerdictReason::QueryError,
                message: String::new(),
            },
            Observation::Failed {
                reason: VerdictReason::Timeout,
                message: String::new(),
            },
        ];
        for c in &comparisons {
            for o in &observations {
                let mut g = gate(c.clone());
                g.min_samples = 0;
                let owner = OwnerContext {
                    share_target: Some(0.5),
                    share_tolerance: 1.0,
                };
                let v = decide(&g, o, None, owner, t(0));
                assert_ne!(v.verdict, Verdict::Pass, "{c:?} {o:?}");
            }
        }
    }

    #[test]
    fn an_owners_inconclusive_policy_waits_its_after_then_acts_and_a_future_streak_waits() {
        let v = unevaluated("g", "GateTemplate absent", None, t(0));
        let policy = |action, after: &str| InconclusivePolicy {
            action,
            after: after.into(),
        };
        let table = [
            (
                policy(InconclusiveAction::Pause, "2m"),
                119,
                GateAction::Wait,
            ),
            (
                policy(InconclusiveAction::Pause, "2m"),
                120,
                GateAction::Pause,
            ),
            (
                policy(InconclusiveAction::Abort, "2m"),
                120,
                GateAction::Abort,
            ),
            (
                policy(InconclusiveAction::Continue, "2m"),
                120,
                GateAction::Proceed,
            ),
            (
                policy(InconclusiveAction::Abort, "2m"),
                -600,
                GateAction::Wait,
            ),
        ];
        for (p, at, want) in table {
            assert_eq!(policy_action(&p, &v, t(at)), want, "{p:?} at {at} s");
        }
    }

    #[test]
    fn a_gate_that_cannot_be_evaluated_is_inconclusive_its_streak_carried_and_never_a_pass() {
        let g = gate(Comparison::absolute(ComparisonOp::LessOrEqual, 0.05));
        // A message longer than the status allows, with a multi-byte character astride the cut.
        let long = format!("{}→ GateTemplate absent", "x".repeat(1023));
        let first = unevaluated("g", &long, None, t(0));
        assert_eq!(first.verdict, Verdict::Inconclusive);
        assert_eq!(first.reason, VerdictReason::QueryError);
        assert_eq!(
            first.message.as_deref().map(|m| m.chars().count()),
            Some(1024)
        );
        assert!(first.message.as_deref().unwrap().ends_with('→'));
        // A name longer than a verdict holds (a built-in gate's with a long suffix) is cut.
        let named = unevaluated(&"g".repeat(70), "GateTemplate absent", None, t(0));
        assert_eq!(named.gate, "g".repeat(63));
        assert_eq!(first.inconclusive_since, Some(time(t(0))));
        assert_eq!(action(&g, &first, t(0)), GateAction::Wait);

        let mut failing = first.clone();
        failing.verdict = Verdict::Fail;
        failing.consecutive_failures = 1;
        failing.inconclusive_since = None;
        let after_fail = unevaluated("g", "query refused", Some(&failing), t(30));
        assert_eq!(after_fail.consecutive_failures, 1, "the Fail count carries");
        assert_eq!(
            after_fail.inconclusive_since,
            Some(time(t(30))),
            "a new Inconclusive streak starts after a Fail"
        );

        let later = unevaluated("g", "query refused", Some(&first), t(3600));
        assert_eq!(
            later.inconclusive_since,
            Some(time(t(0))),
            "the streak carries"
        );
        assert_ne!(
            action(&g, &later, t(3600)),
            GateAction::Proceed,
            "an unevaluated gate never passes unless its policy says Continue"
        );
    }

    #[test]
    fn inconclusive_since_is_kept_across_evaluations_and_cleared_on_pass() {
        let g = gate(Comparison::absolute(ComparisonOp::LessOrEqual, 0.01));
        let first = decide(&g, &measured(None, None, None), None, OWNER, t(0));
        assert_eq!(first.inconclusive_since, Some(time(t(0))));
        let second = decide(
            &g,
            &measured(Some(0.5), Some(10.0), None),
            Some(&first),
            OWNER,
            t(30),
        );
        assert_eq!(second.inconclusive_since, Some(time(t(0))));
        let third = decide(
            &g,
            &measured(Some(0.0), Some(500.0), None),
            Some(&second),
            OWNER,
            t(60),
        );
        assert_eq!(third.verdict, Verdict::Pass);
        assert_eq!(third.inconclusive_since, None);
    }

    #[test]
    fn action_table() {
        let cases = [
            (
                Verdict::Pass,
                InconclusiveAction::Pause,
                0,
                GateAction::Proceed,
            ),
            (
                Verdict::Fail,
                InconclusiveAction::Continue,
                0,
                GateAction::Abort,
            ),
            (
                Verdict::Inconclusive,
                InconclusiveAction::Pause,
                299,
                GateAction::Wait,
            ),
            (
                Verdict::Inconclusive,
                InconclusiveAction::Pause,
                300,
                GateAction::Pause,
            ),
            (
                Verdict::Inconclusive,
                InconclusiveAction::Abort,
                300,
                GateAction::Abort,
            ),
            (
                Verdict::Inconclusive,
                InconclusiveAction::Continue,
                299,
                GateAction::Wait,
            ),
            (
                Verdict::Inconclusive,
                InconclusiveAction::Continue,
                300,
                GateAction::Proceed,
            ),
        ];
        for (verdict, policy, lasted, want) in cases {
            let mut g = gate(Comparison::absolute(ComparisonOp::LessOrEqual, 0.01));
            g.inconclusive_action = policy;
            g.inconclusive_after = Duration::from_secs(300);
            let v = GateVerdict {
                inconclusive_since: (verdict == Verdict::Inconclusive).then(|| time(t(0))),
                ..GateVerdict::new("g", verdict, VerdictReason::NoData, time(t(lasted)))
            };
            assert_eq!(
                action(&g, &v, t(lasted)),
                want,
                "{verdict:?} {policy:?} after {lasted}s"
            );
        }
    }

    #[test]
    fn mann_whitney_adds_a_breach_only_when_significant_and_large() {
        let g = gate(Comparison::relative(BaselineSource::StableNow, 1.5));
        let with = |p_worse: f64, canary_median: f64| Observation::Measured {
            value: Some(0.012),
            samples: Some(500.0),
            baseline: Some(BaselineReading {
                value: Some(0.01),
                samples: Some(500.0),
            }),
            distribution: Some(DistributionTest {
                test: UTest {
                    u: 0.0,
                    z: 0.0,
                    p_worse,
                    n_canary: 10,
                    n_baseline: 10,
                    canary_median,
                    baseline_median: 0.01,
                },
                alpha: 0.05,
            }),
        };
        let cases = [
            (0.5, 0.03, VerdictReason::ThresholdMet),
            (0.01, 0.012, VerdictReason::ThresholdMet),
            (0.01, 0.03, VerdictReason::ThresholdBreached),
        ];
        for (p, median, want) in cases {
            let mut g = g.clone();
            g.consecutive_failures = 1;
            let v = decide(&g, &with(p, median), None, OWNER, t(0));
            assert_eq!(v.reason, want, "p={p} median={median}: {:?}", v.message);
            assert!(v.message.unwrap().contains("Mann-Whitney"));
        }
    }

    #[test]
    fn combined_action_table() {
        use GateAction::{Abort, Pause, Proceed, Wait};
        type Case = (&'static [GateAction], (GateAction, Option<usize>));
        let cases: &[Case] = &[
            (&[], (Proceed, None)),
            (&[Proceed], (Proceed, Some(0))),
            (&[Proceed, Proceed], (Proceed, Some(0))),
            (&[Proceed, Wait], (Wait, Some(1))),
            (&[Wait, Proceed, Wait], (Wait, Some(0))),
            (&[Wait, Pause, Proceed], (Pause, Some(1))),
            (&[Pause, Wait], (Pause, Some(0))),
            (&[Proceed, Abort, Pause, Abort], (Abort, Some(1))),
            (&[Abort, Proceed], (Abort, Some(0))),
            (&[Pause, Wait, Proceed, Abort], (Abort, Some(3))),
        ];
        for (actions, want) in cases {
            assert_eq!(
                combined_action(actions.iter().copied()),
                *want,
                "{actions:?}"
            );
        }
    }

    #[test]
    fn long_messages_are_bounded() {
        let g = gate(Comparison::absolute(ComparisonOp::LessOrEqual, 0.01));
        let o = Observation::Failed {
            reason: VerdictReason::QueryError,
            message: "é".repeat(2000),
        };
        let v = decide(&g, &o, None, OWNER, t(0));
        assert!(v.message.unwrap().len() <= MAX_MESSAGE);
    }
}
