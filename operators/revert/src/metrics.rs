//! revert's metrics, all prefixed `sluice_revert_`: pins by phase, the age of the oldest active
//! pin (the BundlePins dashboard's; the 2-hour page reads each pin's `sluice_object_*` series),
//! time from BundlePin creation to every object applied, objects applied and pruned, refusals
//! and releases by reason, git reverts by result.
//!
//! Owns the metric names. Labels carry only bounded values (phases, reasons, results), never a
//! pin's name or a digest. The pins by phase and the oldest pin's age are read from the
//! leader's store at each scrape ([`fleet`]): a pin in force ages between its reconciles, and a
//! deleted one counts for nothing at the next scrape.

use std::sync::Arc;

use jiff::Timestamp;

use prometheus_client::{
    encoding::EncodeLabelSet,
    metrics::{
        counter::Counter,
        family::Family,
        histogram::{Histogram, exponential_buckets},
    },
    registry::Registry,
};
use sluice_api::v1alpha1::{BundlePin, BundlePinPhase, BundlePinStatus};
use sluice_runtime::metrics::{FleetGauge, ObjectSignal, ObjectSignals};

use crate::decide;

/// A reason label (condition reasons: bounded).
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct ReasonLabels {
    /// CamelCase reason.
    pub reason: String,
}

/// A result label.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct ResultLabels {
    /// `pushed`, `existing` or a bounded error category.
    pub result: String,
}

/// Every metric revert exports.
#[derive(Debug, Clone)]
pub struct RevertMetrics {
    /// `sluice_revert_pin_duration_seconds`: BundlePin created → every object applied.
    pub pin_duration_seconds: Histogram,
    /// `sluice_revert_objects_applied_total`.
    pub objects_applied: Counter,
    /// `sluice_revert_objects_pruned_total`.
    pub objects_pruned: Counter,
    /// `sluice_revert_fields_removed_total`: fields the bad change added outside atomic lists
    /// (owned by Argo CD's manager, absent from the pinned bundle) that an exact restore removed.
    pub fields_removed: Counter,
    /// `sluice_revert_refusals_total{reason}`.
    pub refusals: Family<ReasonLabels, Counter>,
    /// `sluice_revert_releases_total{reason}`.
    pub releases: Family<ReasonLabels, Counter>,
    /// `sluice_revert_git_reverts_total{result}`.
    pub git_reverts: Family<ResultLabels, Counter>,
}

/// Registers revert's metrics in `registry`.
pub fn register(registry: &mut Registry) -> RevertMetrics {
    let m = RevertMetrics {
        // 50 ms .. ~27 min.
        pin_duration_seconds: Histogram::new(exponential_buckets(0.05, 2.0, 16)),
        objects_applied: Counter::default(),
        objects_pruned: Counter::default(),
        fields_removed: Counter::default(),
        refusals: Family::default(),
        releases: Family::default(),
        git_reverts: Family::default(),
    };
    let sub = registry.sub_registry_with_prefix("sluice_revert");
    sub.register(
        "pin_duration_seconds",
        "Seconds from BundlePin creation to every object applied, signature verification included",
        m.pin_duration_seconds.clone(),
    );
    sub.register(
        "objects_applied",
        "Objects server-side applied to destination clusters",
        m.objects_applied.clone(),
    );
    sub.register(
        "objects_pruned",
        "Objects pruned from destination clusters",
        m.objects_pruned.clone(),
    );
    sub.register(
        "fields_removed",
        "Fields removed from pinned objects because Argo CD's manager owned them and the pinned bundle lacks them",
        m.fields_removed.clone(),
    );
    sub.register(
        "refusals",
        "BundlePins refused, by reason",
        m.refusals.clone(),
    );
    sub.register(
        "releases",
        "BundlePins released, by reason",
        m.releases.clone(),
    );
    sub.register(
        "git_reverts",
        "Git revert branch pushes, by result",
        m.git_reverts.clone(),
    );
    m
}

fn phase_name(p: BundlePinPhase) -> &'static str {
    match p {
        BundlePinPhase::Verifying => "Verifying",
        BundlePinPhase::Refused => "Refused",
        BundlePinPhase::Pinning => "Pinning",
        BundlePinPhase::Pinned => "Pinned",
        BundlePinPhase::Releasing => "Releasing",
        BundlePinPhase::Released => "Released",
        BundlePinPhase::Failed => "Failed",
    }
}

const PHASES: [BundlePinPhase; 7] = [
    BundlePinPhase::Verifying,
    BundlePinPhase::Refused,
    BundlePinPhase::Pinning,
    BundlePinPhase::Pinned,
    BundlePinPhase::Releasing,
    BundlePinPhase::Released,
    BundlePinPhase::Failed,
];

/// Says how a scrape reads the BundlePins the leader's store holds: each one's signal
/// ([`object_signal`]) and [`fleet`]. The operator calls it once at start-up.
pub fn read_at_scrape(objects: &ObjectSignals) {
    objects.decided_by(|p: &BundlePin, _now| p.status.as_ref().map(object_signal));
    objects.fleet_by(fleet);
}

/// Still in force: Pinning, Pinned, or Failed while holding a suspended Application (its
/// release, explicit or by deletion, restores it).
fn in_force(status: Option<&BundlePinStatus>) -> bool {
    match status.map(|s| s.phase) {
        Some(BundlePinPhase::Pinning | BundlePinPhase::Pinned) => true,
        Some(BundlePinPhase::Failed) => !decide::is_over(status),
        _ => false,
    }
}

/// `sluice_revert_pins{phase}` (every phase exported, at 0 when none is in it; a pin without a
/// status yet is `Verifying`) and `sluice_revert_oldest_pin_age_seconds`: the age at `now` of
/// the oldest pin in force, from its creation, 0 when none (the BundlePins dashboard's "oldest
/// pin").
pub fn fleet(pins: &[Arc<BundlePin>], now: Timestamp) -> Vec<FleetGauge> {
    let phases = pins
        .iter()
        .map(|p| phase_name(p.status.as_ref().map(|s| s.phase).unwrap_or_default()));
    let oldest = pins
        .iter()
        .filter(|p| in_force(p.status.as_ref()))
        .filter_map(|p| p.metadata.creation_timestamp.as_ref())
        .map(|created| created.0.as_second())
        .min()
        .map_or(0, |since| (now.as_second() - since).max(0));
    vec![
        FleetGauge::count_by_phase(
            "revert_pins",
            "BundlePins by phase, from the leader's store at the scrape's time (0 on other replicas)",
            &PHASES.map(phase_name),
            phases,
        ),
        FleetGauge::single(
            "revert_oldest_pin_age_seconds",
            "Age in seconds of the oldest BundlePin still in force (Pinning, Pinned, or Failed while holding a suspended Application); 0 when none",
            oldest as f64,
        ),
    ]
}

/// What the per-object series (`sluice_object_*`, `sluice_runtime::metrics::ObjectSignals`)
/// say about a BundlePin, from its status alone: its phase; the reason of a Ready condition that
/// is False (why it was refused or failed), else its Progressing reason, else empty; and when it
/// last progressed: its `pinnedAt` while Pinned (so `time() -` it is how long the pin has held
/// its Applications), its `releasedAt` once Released, else the latest condition transition.
pub fn object_signal(status: &BundlePinStatus) -> ObjectSignal {
    let mut signal =
        ObjectSignal::from_conditions(&format!("{:?}", status.phase), &status.conditions, None);
    let at = match status.phase {
        BundlePinPhase::Pinned => status.pinned_at.as_ref(),
        BundlePinPhase::Released => status.released_at.as_ref(),
        _ => None,
    };
    if let Some(at) = at {
        signal.progressed_at = Some(at.0.as_second());
    }
    signal
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pins_signal_dates_a_pinned_pin_from_its_pinned_at() {
        let status: sluice_api::v1alpha1::BundlePinStatus =
            serde_json::from_value(serde_json::json!({
                "phase": "Pinned",
                "pinnedAt": "2026-12-01T10:00:00Z",
                "conditions": [{"type": "Ready", "status": "True", "reason": "Valid",
                    "message": "m", "lastTransitionTime": "2026-12-01T10:20:00Z"}]
            }))
            .expect("status fixture");
        let s = object_signal(&status);
        assert_eq!((s.phase.as_str(), s.reason.as_str()), ("Pinned", ""));
        assert_eq!(s.progressed_at, Some(1_796_119_200));

        let refused: sluice_api::v1alpha1::BundlePinStatus =
            serde_json::from_value(serde_json::json!({
                "phase": "Refused",
                "conditions": [{"type": "Ready", "status": "False", "reason": "Unsigned",
                    "message": "m", "lastTransitionTime": "2026-12-01T10:20:00Z"}]
            }))
            .expect("status fixture");
        let s = object_signal(&refused);
        assert_eq!(
            (s.phase.as_str(), s.reason.as_str()),
            ("Refused", "Unsigned")
        );
        assert_eq!(s.progressed_at, Some(1_796_120_400));
    }

    /// A BundlePin created at `created` (Unix seconds) in `phase` (`None`: no status yet),
    /// whose one Application is `app` (its state; `None`: no Application).
    fn pin(created: i64, phase: Option<&str>, app: Option<&str>) -> Arc<BundlePin> {
        let spec = serde_json::json!({
            "targets": [{"name": "shop", "namespace": "argocd"}],
            "bundle": {"repository": "oci://registry.local:5000/shop/config", "digest": "sha256:1111"},
            "publicKeysSecretRef": {"name": "cosign"},
            "reason": "5xx after change 42",
        });
        let mut p = BundlePin::new("p", serde_json::from_value(spec).expect("spec fixture"));
        p.metadata.creation_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
            Timestamp::from_second(created).unwrap(),
        ));
        p.status = phase.map(|phase| {
            let apps: Vec<serde_json::Value> = app
                .map(|state| serde_json::json!({"name": "shop", "namespace": "argocd", "state": state}))
                .into_iter()
                .collect();
            serde_json::from_value(serde_json::json!({"phase": phase, "applications": apps}))
                .expect("status fixture")
        });
        Arc::new(p)
    }

    /// The fleet's oldest pin age at `now`, and its count of pins in `phase`.
    fn read(pins: &[Arc<BundlePin>], now: i64, phase: &str) -> (f64, f64) {
        let gauges = fleet(pins, Timestamp::from_second(now).unwrap());
        let count = gauges[0]
            .series
            .iter()
            .find(|(labels, _)| labels == &vec![("phase", phase.to_owned())])
            .map_or(-1.0, |(_, n)| *n);
        (gauges[1].series[0].1, count)
    }

    #[test]
    fn the_oldest_pin_age_counts_only_pins_in_force_from_their_creation() {
        // (pins, now, want oldest age)
        let table: [(Vec<Arc<BundlePin>>, i64, f64); 6] = [
            (vec![pin(0, Some("Verifying"), None)], 10, 0.0),
            (vec![pin(0, Some("Pinned"), Some("Pinned"))], 20, 20.0),
            (
                vec![
                    pin(0, Some("Pinned"), Some("Pinned")),
                    pin(15, Some("Pinning"), None),
                ],
                30,
                30.0,
            ),
            (
                vec![
                    pin(0, Some("Released"), Some("Released")),
                    pin(15, Some("Pinned"), None),
                ],
                40,
                25.0,
            ),
            (
                vec![pin(0, Some("Refused"), None), pin(15, None, None)],
                50,
                0.0,
            ),
            (vec![], 60, 0.0),
        ];
        for (pins, now, want) in table {
            assert_eq!(read(&pins, now, "Pinned").0, want, "{now}");
        }
    }

    #[test]
    fn the_oldest_age_covers_a_stuck_pinning_and_a_failed_pin_still_holding_without_a_reconcile() {
        // A pin stuck in Pinning since 0, beside a fresh one: at 7,300 s it is 7,300 s old,
        // whenever it was last reconciled.
        let pins = [
            pin(0, Some("Pinning"), None),
            pin(7000, Some("Pinned"), None),
        ];
        assert_eq!(read(&pins, 7300, "Pinning"), (7300.0, 1.0));
        // A Failed pin holding a suspended Application counts; one holding nothing does not.
        let holding = [pin(0, Some("Failed"), Some("Suspended"))];
        assert_eq!(read(&holding, 7300, "Failed"), (7300.0, 1.0));
        let over = [pin(0, Some("Failed"), Some("Released"))];
        assert_eq!(read(&over, 7300, "Failed"), (0.0, 1.0));
    }

    #[test]
    fn every_phase_is_exported_at_zero_without_pins_and_a_pin_without_status_is_verifying() {
        let gauges = fleet(&[], Timestamp::from_second(10).unwrap());
        assert_eq!(
            (gauges[0].name, gauges[1].name),
            ("revert_pins", "revert_oldest_pin_age_seconds")
        );
        let phases: Vec<&str> = gauges[0]
            .series
            .iter()
            .map(|(l, _)| l[0].1.as_str())
            .collect();
        assert_eq!(phases, PHASES.map(phase_name));
        assert!(gauges[0].series.iter().all(|(_, n)| *n == 0.0));
        assert_eq!(read(&[pin(0, None, None)], 10, "Verifying"), (0.0, 1.0));
    }

    #[test]
    fn the_operators_own_metrics_are_prefixed() {
        let mut registry = Registry::default();
        let m = register(&mut registry);
        m.objects_applied.inc();
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        for name in [
            "sluice_revert_pin_duration_seconds_bucket",
            "sluice_revert_objects_applied_total",
            "sluice_revert_objects_pruned_total",
            "sluice_revert_fields_removed_total",
        ] {
            assert!(text.contains(name), "{name} missing from:\n{text}");
        }
    }
}
