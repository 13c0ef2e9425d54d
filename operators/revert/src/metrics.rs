//! revert's metrics, all prefixed `sluice_revert_`: pins by phase, the age of the oldest active
//! pin (the chart pages when it passes 2 h), time from BundlePin creation to every object
//! applied, objects applied and pruned, refusals and releases by reason, git reverts by result.
//!
//! Owns the metric names and the bookkeeping of active pins. Labels carry only bounded values
//! (phases, reasons, results), never a pin's name or a digest.

use std::{
    collections::BTreeMap,
    sync::{
        Arc, Mutex,
        atomic::{AtomicU64, Ordering},
    },
};

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
use sluice_api::v1alpha1::BundlePinPhase;

/// A phase label.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct PhaseLabels {
    /// BundlePin phase.
    pub phase: String,
}

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
    /// `sluice_revert_pins{phase}`: BundlePins by phase (as last reconciled).
    pub pins: Family<PhaseLabels, Gauge>,
    /// `sluice_revert_oldest_pin_age_seconds`: age of the oldest pin still in force (Pinning,
    /// Pinned, or Failed while holding a suspended Application), 0 when none.
    pub oldest_pin_age_seconds: Gauge<f64, AtomicU64>,
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
    active: Arc<Mutex<BTreeMap<String, Entry>>>,
}

#[derive(Debug, Clone)]
struct Entry {
    phase: BundlePinPhase,
    holding: bool,
    since: Option<i64>,
    seen: i64,
}

/// How long an active pin's entry survives without a reconcile: longer than the runtime's
/// longest back-off (300 s) between two attempts of a pin whose effects keep failing, so a pin
/// stuck in Pinning stays counted (a deleted pin is forgotten at once).
const FORGET_AFTER_SECONDS: i64 = 900;

impl Entry {
    /// Still in force: Pinning, Pinned, or Failed while holding a suspended Application.
    fn in_force(&self) -> bool {
        matches!(self.phase, BundlePinPhase::Pinning | BundlePinPhase::Pinned)
            || (self.phase == BundlePinPhase::Failed && self.holding)
    }
}

/// Registers revert's metrics in `registry`.
pub fn register(registry: &mut Registry) -> RevertMetrics {
    let m = RevertMetrics {
        pins: Family::default(),
        oldest_pin_age_seconds: Gauge::default(),
        // 50 ms .. ~27 min.
        pin_duration_seconds: Histogram::new(exponential_buckets(0.05, 2.0, 16)),
        objects_applied: Counter::default(),
        objects_pruned: Counter::default(),
        fields_removed: Counter::default(),
        refusals: Family::default(),
        releases: Family::default(),
        git_reverts: Family::default(),
        active: Arc::default(),
    };
    let sub = registry.sub_registry_with_prefix("sluice_revert");
    sub.register("pins", "BundlePins by phase", m.pins.clone());
    sub.register(
        "oldest_pin_age_seconds",
        "Age in seconds of the oldest BundlePin still in force (Pinning, Pinned, or Failed while holding a suspended Application); 0 when none",
        m.oldest_pin_age_seconds.clone(),
    );
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

impl RevertMetrics {
    /// Records a pin's phase after a reconcile; `created` is its creation time (seconds), `now`
    /// the clock (seconds). Recomputes the phase gauges and the oldest pin age.
    pub fn observe(&self, key: &str, phase: BundlePinPhase, created: Option<i64>, now: i64) {
        self.observe_holding(key, phase, false, created, now);
    }

    /// [`RevertMetrics::observe`], saying whether the pin still holds an Application suspended
    /// (a Failed pin that does is still in force: the 2-hour page covers it).
    pub fn observe_holding(
        &self,
        key: &str,
        phase: BundlePinPhase,
        holding: bool,
        created: Option<i64>,
        now: i64,
    ) {
        let mut active = self.active.lock().expect("metrics lock");
        active.insert(
            key.to_owned(),
            Entry {
                phase,
                holding,
                since: created,
                seen: now,
            },
        );
        self.publish(&mut active, now);
    }

    /// Forgets a pin that was deleted (`now`: the clock, seconds): it no longer counts in any
    /// phase, nor as the oldest pin.
    pub fn forget(&self, key: &str, now: i64) {
        let mut active = self.active.lock().expect("metrics lock");
        active.remove(key);
        self.publish(&mut active, now);
    }

    /// Drops pins in force that stopped being reconciled, then sets the phase gauges and the
    /// oldest pin age from what remains.
    fn publish(&self, active: &mut BTreeMap<String, Entry>, now: i64) {
        active.retain(|_, e| !e.in_force() || now - e.seen <= FORGET_AFTER_SECONDS);
        for p in PHASES {
            let n = active.values().filter(|e| e.phase == p).count();
            self.pins
                .get_or_create(&PhaseLabels {
                    phase: phase_name(p).into(),
                })
                .set(n as i64);
        }
        let oldest = active
            .values()
            .filter(|e| e.in_force())
            .filter_map(|e| e.since)
            .min()
            .map_or(0, |since| (now - since).max(0));
        self.oldest_pin_age_seconds.set(oldest as f64);
    }

    /// The current oldest-pin age (tests).
    pub fn oldest_pin_age(&self) -> f64 {
        f64::from_bits(self.oldest_pin_age_seconds.inner().load(Ordering::Relaxed))
    }
}

/// What the per-object series (`sluice_object_*`, `sluice_runtime::metrics::ObjectSignals`)
/// say about a BundlePin, from its status alone: its phase; the reason of a Ready condition that
/// is False (why it was refused or failed), else its Progressing reason, else empty; and when it
/// last progressed: its `pinnedAt` while Pinned (so `time() -` it is how long the pin has held
/// its Applications), its `releasedAt` once Released, else the latest condition transition.
pub fn object_signal(
    status: &sluice_api::v1alpha1::BundlePinStatus,
) -> sluice_runtime::metrics::ObjectSignal {
    let mut signal = sluice_runtime::metrics::ObjectSignal::from_conditions(
        &format!("{:?}", status.phase),
        &status.conditions,
        None,
    );
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

    #[test]
    fn oldest_pin_age_counts_only_pins_in_force() {
        let mut registry = Registry::default();
        let m = register(&mut registry);
        // (key, phase, created, now, want oldest age)
        let table = [
            ("a", BundlePinPhase::Verifying, 0, 10, 0.0),
            ("a", BundlePinPhase::Pinned, 0, 20, 20.0),
            ("b", BundlePinPhase::Pinned, 15, 30, 30.0),
            ("a", BundlePinPhase::Released, 0, 40, 25.0),
            ("b", BundlePinPhase::Released, 15, 50, 0.0),
        ];
        for (key, phase, created, now, want) in table {
            m.observe(key, phase, Some(created), now);
            assert_eq!(m.oldest_pin_age(), want, "{key} {phase:?} at {now}");
        }
        // A pin in force that stops being reconciled (deleted) is forgotten.
        m.observe("c", BundlePinPhase::Pinned, Some(100), 100);
        m.observe(
            "d",
            BundlePinPhase::Released,
            Some(0),
            100 + FORGET_AFTER_SECONDS + 1,
        );
        assert_eq!(m.oldest_pin_age(), 0.0);
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        for name in [
            "sluice_revert_pins{phase=\"Released\"}",
            "sluice_revert_oldest_pin_age_seconds",
            "sluice_revert_pin_duration_seconds_bucket",
            "sluice_revert_objects_applied_total",
            "sluice_revert_objects_pruned_total",
            "sluice_revert_fields_removed_total",
        ] {
            assert!(text.contains(name), "{name} missing from:\n{text}");
        }
    }

    #[test]
    fn the_page_covers_stuck_pinning_and_failed_pins_still_holding() {
        let mut registry = Registry::default();
        let m = register(&mut registry);
        // A pin stuck in Pinning, retried at the longest back-off, beside a healthy one.
        m.observe("stuck", BundlePinPhase::Pinning, Some(0), 10);
        m.observe("fresh", BundlePinPhase::Pinned, Some(7000), 7000);
        for now in (310..7300).step_by(300) {
            m.observe("stuck", BundlePinPhase::Pinning, Some(0), now);
        }
        m.observe("fresh", BundlePinPhase::Pinned, Some(7000), 7300);
        assert!(m.oldest_pin_age() >= 7200.0, "{}", m.oldest_pin_age());
        // A Failed pin holding a suspended Application counts; one holding nothing does not.
        let m = register(&mut Registry::default());
        m.observe_holding("failed", BundlePinPhase::Failed, true, Some(0), 7300);
        assert_eq!(m.oldest_pin_age(), 7300.0);
        m.observe_holding("failed", BundlePinPhase::Failed, false, Some(0), 7301);
        assert_eq!(m.oldest_pin_age(), 0.0);
    }

    #[test]
    fn a_deleted_pin_leaves_every_phase_and_the_oldest_age() {
        let mut registry = Registry::default();
        let m = register(&mut registry);
        m.observe("ns/a", BundlePinPhase::Pinned, Some(0), 10);
        m.observe("ns/b", BundlePinPhase::Released, Some(0), 10);
        assert_eq!(m.oldest_pin_age(), 10.0);
        m.forget("ns/a", 11);
        m.forget("ns/b", 11);
        assert_eq!(m.oldest_pin_age(), 0.0);
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        for phase in ["Pinned", "Released"] {
            let line = format!("sluice_revert_pins{{phase=\"{phase}\"}} 0");
            assert!(text.contains(&line), "{line} missing from:\n{text}");
        }
    }
}
