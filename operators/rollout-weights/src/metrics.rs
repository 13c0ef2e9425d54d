//! The rollout-weights operator's Prometheus metrics: Rollouts per phase, weights written,
//! applied shares measured, gate verdicts, aborts and their latencies, analysis ticks and route
//! writes.
//!
//! Owns metric names (all `sluice_rollout_*` or `sluice_rollouts`), help texts and label sets.
//! Must never label a series with an object's name, a gate's name, a message or anything else
//! unbounded: labels come from fixed sets (phase, verdict, reason, result). Which Rollout is in
//! trouble is said by the platform's per-object series (`sluice_object_*` of
//! `sluice_runtime::metrics::ObjectSignals`), whose Rollout signal [`object_signal`] decides.

use std::{sync::Arc, time::Duration};

use prometheus_client::{
    encoding::EncodeLabelSet,
    metrics::{
        counter::Counter,
        family::Family,
        gauge::Gauge,
        histogram::{Histogram, exponential_buckets},
    },
    registry::Registry,
};
use sluice_api::v1alpha1::{
    Rollout, RolloutPhase, RolloutStatus, Verdict, VerdictReason,
    rollout::{conditions, reasons},
};
use sluice_runtime::metrics::{FleetGauge, ObjectSignal, ObjectSignals};

use crate::analysis::TickFigures;

/// Labels of a gate verdict.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct VerdictLabels {
    /// Pass, Fail or Inconclusive.
    pub verdict: String,
    /// The verdict's bounded reason (ThresholdMet, NoData, QueryError, ...).
    pub reason: String,
}

/// Labels with one bounded reason or result.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct ReasonLabels {
    /// A CamelCase reason or result from a fixed set.
    pub reason: String,
}

/// Handles to the operator's metrics; cheap to clone.
#[derive(Debug, Clone)]
pub struct RolloutMetrics {
    desired_weight: Histogram,
    applied_share: Histogram,
    verdicts: Family<VerdictLabels, Counter>,
    aborts: Family<ReasonLabels, Counter>,
    abort_latency: Histogram,
    detect_to_revert: Histogram,
    revert_verified: Histogram,
    ticks: Counter,
    queries: Counter,
    failed_queries: Counter,
    queries_per_tick: Gauge,
    rollouts_per_tick: Gauge,
    route_writes: Family<ReasonLabels, Counter>,
}

/// Registers every metric of the operator in `registry` under the `sluice_` prefix.
pub fn register(registry: &mut Registry) -> RolloutMetrics {
    let percent = || Histogram::new([0.5, 1.0, 2.5, 5.0, 10.0, 25.0, 50.0, 75.0, 100.0]);
    // 10 ms .. ~5.5 min: a controller revert takes milliseconds, a verified one a rate window.
    let latency = || Histogram::new(exponential_buckets(0.01, 2.0, 16));
    let m = RolloutMetrics {
        desired_weight: percent(),
        applied_share: percent(),
        verdicts: Family::default(),
        aborts: Family::default(),
        abort_latency: latency(),
        // 2 ms .. ~50 s in steps of 1.5×: the controller's own delay is meant to be well under
        // a second, and its percentiles are read from these buckets.
        detect_to_revert: Histogram::new(exponential_buckets(0.002, 1.5, 26)),
        revert_verified: latency(),
        ticks: Counter::default(),
        queries: Counter::default(),
        failed_queries: Counter::default(),
        queries_per_tick: Gauge::default(),
        rollouts_per_tick: Gauge::default(),
        route_writes: Family::default(),
    };
    let sub = registry.sub_registry_with_prefix("sluice");
    sub.register(
        "rollout_desired_weight_percent",
        "Canary weights written to routes, percent",
        m.desired_weight.clone(),
    );
    sub.register(
        "rollout_applied_share_percent",
        "Canary shares the mesh reported at each analysis, percent",
        m.applied_share.clone(),
    );
    sub.register(
        "rollout_gate_verdicts",
        "Gate verdicts judged, by verdict and reason",
        m.verdicts.clone(),
    );
    sub.register(
        "rollout_aborts",
        "Rollouts aborted, by reason",
        m.aborts.clone(),
    );
    sub.register(
        "rollout_abort_latency_seconds",
        "From the failing gate's first failure to the route reverted, seconds",
        m.abort_latency.clone(),
    );
    sub.register(
        "rollout_detect_to_revert_seconds",
        "From the abort decision (the Fail verdict) to the route reverted, seconds",
        m.detect_to_revert.clone(),
    );
    sub.register(
        "rollout_revert_verified_seconds",
        "From the route reverted to telemetry showing the canary share at about 0, seconds",
        m.revert_verified.clone(),
    );
    sub.register(
        "rollout_analysis_ticks",
        "Batched analysis ticks run",
        m.ticks.clone(),
    );
    sub.register(
        "rollout_analysis_queries",
        "Metrics queries sent by analysis ticks",
        m.queries.clone(),
    );
    sub.register(
        "rollout_analysis_failed_queries",
        "Metrics queries that failed",
        m.failed_queries.clone(),
    );
    sub.register(
        "rollout_analysis_queries_per_tick",
        "Queries sent by the latest analysis tick",
        m.queries_per_tick.clone(),
    );
    sub.register(
        "rollout_analysis_rollouts_per_tick",
        "Rollouts evaluated by the latest analysis tick",
        m.rollouts_per_tick.clone(),
    );
    sub.register(
        "rollout_route_writes",
        "HTTPRoute writes, by result (Written, Unchanged, Failed)",
        m.route_writes.clone(),
    );
    m
}

fn phase_name(p: RolloutPhase) -> String {
    format!("{p:?}")
}

/// Every Rollout phase, in the order of its lifecycle.
const PHASES: [RolloutPhase; 7] = [
    RolloutPhase::Pending,
    RolloutPhase::WaitingForCanary,
    RolloutPhase::Progressing,
    RolloutPhase::Paused,
    RolloutPhase::Promoted,
    RolloutPhase::Aborted,
    RolloutPhase::Invalid,
];

/// Says how a scrape reads the Rollouts the leader's store holds: each one's signal
/// ([`object_signal`]) and [`fleet`]. The operator calls it once at start-up.
pub fn read_at_scrape(objects: &ObjectSignals) {
    objects.decided_by(|r: &Rollout, _now| r.status.as_ref().map(object_signal));
    objects.fleet_by(|rollouts: &[Arc<Rollout>], _now| vec![fleet(rollouts)]);
}

/// `sluice_rollouts{phase}`: the Rollouts in each phase (one not yet reconciled is `Pending`),
/// every phase exported, at 0 when none is in it.
pub fn fleet(rollouts: &[Arc<Rollout>]) -> FleetGauge {
    let every = PHASES.map(phase_name);
    let phases: Vec<String> = rollouts
        .iter()
        .map(|r| phase_name(r.status.as_ref().map(|s| s.phase).unwrap_or_default()))
        .collect();
    FleetGauge::count_by_phase(
        "rollouts",
        "Rollouts by phase, from the leader's store at the scrape's time (0 on other replicas)",
        &every.each_ref().map(String::as_str),
        phases.iter().map(String::as_str),
    )
}

impl RolloutMetrics {
    /// Records a canary weight written to a route.
    pub fn weight_written(&self, weight: u32) {
        self.desired_weight.observe(f64::from(weight));
    }

    /// Records an applied share measured, percent.
    pub fn share(&self, percent: f64) {
        self.applied_share.observe(percent);
    }

    /// Records a judged verdict.
    pub fn verdict(&self, verdict: Verdict, reason: VerdictReason) {
        self.verdicts
            .get_or_create(&VerdictLabels {
                verdict: format!("{verdict:?}"),
                reason: reason.as_str().to_owned(),
            })
            .inc();
    }

    /// Records an abort with its bounded reason.
    pub fn abort(&self, reason: &str) {
        self.aborts
            .get_or_create(&ReasonLabels {
                reason: reason.to_owned(),
            })
            .inc();
    }

    /// Records the latencies of a reverted route: from the first failure and from the decision.
    pub fn reverted(&self, from_first_failure: Option<Duration>, from_decision: Duration) {
        if let Some(d) = from_first_failure {
            self.abort_latency.observe(d.as_secs_f64());
        }
        self.detect_to_revert.observe(from_decision.as_secs_f64());
    }

    /// Records the time from the route reverted to telemetry confirming it.
    pub fn revert_verified(&self, took: Duration) {
        self.revert_verified.observe(took.as_secs_f64());
    }

    /// Records one batched analysis tick.
    pub fn tick(&self, t: TickFigures) {
        self.ticks.inc();
        self.queries.inc_by(t.queries as u64);
        self.failed_queries.inc_by(t.failed_queries as u64);
        self.queries_per_tick
            .set(i64::try_from(t.queries).unwrap_or(i64::MAX));
        self.rollouts_per_tick
            .set(i64::try_from(t.rollouts).unwrap_or(i64::MAX));
    }

    /// Records a route write's result: `Written`, `Unchanged` or `Failed`.
    pub fn route_write(&self, result: &'static str) {
        self.route_writes
            .get_or_create(&ReasonLabels {
                reason: result.to_owned(),
            })
            .inc();
    }
}

/// The deadline a Promoted Rollout is past when its hand-back is overdue.
pub const DEADLINE_HAND_BACK: &str = "HandBack";

/// What the per-object series say about a Rollout, from its status alone: its phase; the reason
/// (the abort's reason when Aborted, `GateMisconfigured` or `InvalidSpec` while not Ready,
/// otherwise the Progressing condition's reason, e.g. `Inconclusive` for a hold); when it last
/// progressed (its step's start, its promotion or its abort decision); and `HandBack` when the
/// hand-back is overdue. Every value comes from a fixed set.
pub fn object_signal(status: &RolloutStatus) -> ObjectSignal {
    let condition = |t: &str| status.conditions.iter().find(|c| c.type_ == t);
    let not_ready = condition(conditions::READY).filter(|c| c.status == "False");
    let reason = match (&status.abort, status.phase, not_ready) {
        (Some(a), RolloutPhase::Aborted, _) => format!("{:?}", a.reason),
        (_, _, Some(c)) => c.reason.clone(),
        _ => condition(conditions::PROGRESSING)
            .map(|c| c.reason.clone())
            .unwrap_or_default(),
    };
    let progressed = match status.phase {
        RolloutPhase::Aborted => status.abort.as_ref().map(|a| &a.decided_at),
        RolloutPhase::Promoted => status.promoted_at.as_ref(),
        _ => status.current_step_started_at.as_ref().or(status
            .owned_route
            .as_ref()
            .and_then(|o| o.owned_since.as_ref())),
    };
    let overdue = condition(conditions::HAND_BACK_OVERDUE)
        .filter(|c| c.status == "True" && c.reason == reasons::HAND_BACK_OVERDUE)
        .map(|_| DEADLINE_HAND_BACK.to_owned())
        .into_iter()
        .collect();
    ObjectSignal {
        phase: phase_name(status.phase),
        reason,
        progressed_at: progressed.map(|t| t.0.as_second()),
        overdue,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(v: serde_json::Value) -> RolloutStatus {
        serde_json::from_value(v).expect("status fixture")
    }

    #[test]
    fn a_rollouts_signal_names_its_phase_reason_progress_and_overdue_hand_back() {
        let cond = |t: &str, s: &str, r: &str| {
            serde_json::json!({"type": t, "status": s, "reason": r, "message": "m",
                "lastTransitionTime": "2026-12-01T10:00:00Z"})
        };
        let table = [
            (
                serde_json::json!({"phase": "Progressing", "currentStepStartedAt": "2026-12-01T10:00:00Z",
                    "conditions": [cond("Ready", "True", "Valid"), cond("Progressing", "True", "StepInProgress")]}),
                ("Progressing", "StepInProgress", Some(1_796_119_200), vec![]),
            ),
            (
                serde_json::json!({"phase": "Paused", "currentStepStartedAt": "2026-12-01T10:00:00Z",
                    "conditions": [cond("Ready", "True", "Valid"), cond("Progressing", "False", "Inconclusive")]}),
                ("Paused", "Inconclusive", Some(1_796_119_200), vec![]),
            ),
            (
                serde_json::json!({"phase": "Progressing", "currentStepStartedAt": "2026-12-01T10:00:00Z",
                    "conditions": [cond("Ready", "False", "GateMisconfigured"), cond("Progressing", "True", "StepInProgress")]}),
                (
                    "Progressing",
                    "GateMisconfigured",
                    Some(1_796_119_200),
                    vec![],
                ),
            ),
            (
                serde_json::json!({"phase": "Aborted", "currentStepStartedAt": "2026-12-01T10:00:00Z",
                    "abort": {"reason": "GateFailed", "stepIndex": 0, "decidedAt": "2026-12-01T10:01:00Z"},
                    "conditions": [cond("Ready", "True", "Valid"), cond("Progressing", "False", "GateFailed")]}),
                ("Aborted", "GateFailed", Some(1_796_119_260), vec![]),
            ),
            (
                serde_json::json!({"phase": "Promoted", "promotedAt": "2026-12-01T11:00:00Z",
                    "conditions": [cond("Ready", "True", "Valid"), cond("Progressing", "False", "Promoted"),
                        cond("HandBackOverdue", "True", "HandBackOverdue")]}),
                (
                    "Promoted",
                    "Promoted",
                    Some(1_796_122_800),
                    vec!["HandBack"],
                ),
            ),
            (
                serde_json::json!({"phase": "Promoted", "promotedAt": "2026-12-01T11:00:00Z",
                    "conditions": [cond("HandBackOverdue", "False", "WithinDeadline")]}),
                ("Promoted", "", Some(1_796_122_800), vec![]),
            ),
        ];
        for (v, (phase, reason, at, overdue)) in table {
            let got = object_signal(&status(v.clone()));
            assert_eq!(got.phase, phase, "{v}");
            assert_eq!(got.reason, reason, "{v}");
            assert_eq!(got.progressed_at, at, "{v}");
            let overdue: std::collections::BTreeSet<String> =
                overdue.into_iter().map(String::from).collect();
            assert_eq!(got.overdue, overdue, "{v}");
        }
    }

    fn rollout(phase: Option<&str>) -> Arc<Rollout> {
        let spec = serde_json::json!({
            "routeRef": {"name": "checkout"},
            "stableService": {"name": "v1"},
            "canaryService": {"name": "v2"},
            "canaryWorkload": {"name": "v2"},
            "steps": [{"setWeight": {"weight": 1}}]
        });
        let mut r = Rollout::new(
            "checkout",
            serde_json::from_value(spec).expect("spec fixture"),
        );
        r.status = phase.map(|p| status(serde_json::json!({ "phase": p })));
        Arc::new(r)
    }

    #[test]
    fn rollouts_are_counted_by_phase_with_every_phase_exported() {
        let count = |rollouts: &[Arc<Rollout>]| -> Vec<(String, f64)> {
            fleet(rollouts)
                .series
                .into_iter()
                .filter(|(_, n)| *n > 0.0)
                .map(|(labels, n)| (labels[0].1.clone(), n))
                .collect()
        };
        // Before the first Rollout (and on a replica that does not lead): every phase at 0.
        let none = fleet(&[]);
        assert_eq!(none.name, "rollouts");
        let phases: Vec<&str> = none.series.iter().map(|(l, _)| l[0].1.as_str()).collect();
        assert_eq!(
            phases,
            [
                "Pending",
                "WaitingForCanary",
                "Progressing",
                "Paused",
                "Promoted",
                "Aborted",
                "Invalid"
            ]
        );
        assert!(none.series.iter().all(|(_, n)| *n == 0.0));

        let rollouts = [
            rollout(Some("Progressing")),
            rollout(Some("Progressing")),
            rollout(Some("Aborted")),
            rollout(None),
        ];
        assert_eq!(
            count(&rollouts),
            vec![
                ("Pending".into(), 1.0),
                ("Progressing".into(), 2.0),
                ("Aborted".into(), 1.0)
            ]
        );
    }

    #[test]
    fn every_metric_is_prefixed() {
        let mut registry = Registry::default();
        let m = register(&mut registry);
        m.weight_written(5);
        m.share(4.8);
        m.verdict(Verdict::Fail, VerdictReason::ThresholdBreached);
        m.abort("GateFailed");
        m.reverted(Some(Duration::from_secs(3)), Duration::from_millis(40));
        m.revert_verified(Duration::from_secs(4));
        m.tick(TickFigures {
            rollouts: 3,
            checks: 9,
            queries: 3,
            failed_queries: 0,
        });
        m.route_write("Written");
        let text = sluice_runtime::metrics::encode(&registry);
        let names: Vec<&str> = text
            .lines()
            .filter(|l| l.starts_with("# TYPE "))
            .filter_map(|l| l.split_whitespace().nth(2))
            .collect();
        assert_eq!(names.len(), 13, "{text}");
        assert!(names.iter().all(|n| n.starts_with("sluice_")), "{names:?}");
        assert!(
            text.contains("sluice_rollout_analysis_queries_per_tick 3"),
            "{text}"
        );
        assert!(
            text.contains("sluice_rollout_gate_verdicts_total{verdict=\"Fail\",reason=\"ThresholdBreached\"} 1"),
            "{text}"
        );
    }
}
