//! The upgrade-revisions operator's Prometheus metrics: proxies per injecting revision, restarts
//! started and in flight, the issuance budget (tokens, observed and background issuance, the
//! budget and the headroom it leaves), wave progress, phase, and whether the old revision may be
//! retired.
//!
//! Owns metric names (all `sluice_upgrade_*`), help texts and label sets. Labels come from fixed
//! or operator-bounded sets (phase, result, restart mode, injecting revision, wave name — at most
//! 16 per upgrade); never an object name, pod name or message. One RevisionUpgrade runs per
//! cluster at a time, so the gauges describe it.

use std::sync::atomic::AtomicU64;

use prometheus_client::{
    encoding::EncodeLabelSet,
    metrics::{counter::Counter, family::Family, gauge::Gauge},
    registry::Registry,
};
use sluice_api::v1alpha1::{
    RevisionUpgradePhase, RevisionUpgradeSpec, RevisionUpgradeStatus,
    revision_upgrade::NamespaceState,
};

use crate::pacing;

/// Labels naming an injecting revision.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct RevisionLabels {
    /// Revision recorded by the injector (`sidecar.istio.io/status`).
    pub revision: String,
}

/// Labels naming a wave.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct WaveLabels {
    /// Wave name from the spec.
    pub wave: String,
}

/// Labels naming a phase.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct PhaseLabels {
    /// Pending, Progressing, Soaking, Paused, RollingBack, Aborted, Complete or Invalid.
    pub phase: String,
}

/// Labels of a restart attempt.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct RestartLabels {
    /// `evict` or `rollout_restart`.
    pub mode: String,
    /// `started`, `blocked` (a PodDisruptionBudget refused it), `gone` (the pod no longer
    /// existed) or `error`.
    pub result: String,
}

type FloatGauge = Gauge<f64, AtomicU64>;

/// Handles to the operator's metrics; cheap to clone.
#[derive(Debug, Clone, Default)]
pub struct UpgradeMetrics {
    proxies: Family<RevisionLabels, Gauge>,
    restarts: Family<RestartLabels, Counter>,
    in_flight: Gauge,
    tokens: FloatGauge,
    observed: FloatGauge,
    background: FloatGauge,
    budget: FloatGauge,
    headroom: FloatGauge,
    throttled: Gauge,
    wave_namespaces: Family<WaveLabels, Gauge>,
    wave_moved: Family<WaveLabels, Gauge>,
    phase: Family<PhaseLabels, Gauge>,
    retirable: Gauge,
}

/// Registers every metric of the operator in `registry`.
pub fn register(registry: &mut Registry) -> UpgradeMetrics {
    let m = UpgradeMetrics::default();
    registry.register(
        "sluice_upgrade_proxies",
        "Meshed pods per injecting revision (from sidecar.istio.io/status)",
        m.proxies.clone(),
    );
    registry.register(
        "sluice_upgrade_restarts",
        "Pod restarts attempted, by mode and result",
        m.restarts.clone(),
    );
    registry.register(
        "sluice_upgrade_restarts_in_flight",
        "Pods of moving namespaces not yet Ready on the target revision",
        m.in_flight.clone(),
    );
    registry.register(
        "sluice_upgrade_issuance_tokens",
        "Tokens in the issuance bucket (SVIDs that may be issued now)",
        m.tokens.clone(),
    );
    registry.register(
        "sluice_upgrade_issuance_observed_per_second",
        "SVID issuance observed in the metrics source, all sources",
        m.observed.clone(),
    );
    registry.register(
        "sluice_upgrade_issuance_background_per_second",
        "SVID issuance observed minus sluice's own restarts",
        m.background.clone(),
    );
    registry.register(
        "sluice_upgrade_issuance_budget_per_second",
        "The issuance budget's sustained rate (spec.issuanceBudget.rate)",
        m.budget.clone(),
    );
    registry.register(
        "sluice_upgrade_issuance_headroom_per_second",
        "Restarts per second the budget leaves after background issuance",
        m.headroom.clone(),
    );
    registry.register(
        "sluice_upgrade_issuance_throttled",
        "1 while observed issuance is over budget and restarts are held",
        m.throttled.clone(),
    );
    registry.register(
        "sluice_upgrade_wave_namespaces",
        "Namespaces in each wave",
        m.wave_namespaces.clone(),
    );
    registry.register(
        "sluice_upgrade_wave_namespaces_moved",
        "Namespaces of each wave whose every restartable pod runs the new revision",
        m.wave_moved.clone(),
    );
    registry.register(
        "sluice_upgrade_phase",
        "1 for the upgrade's current phase",
        m.phase.clone(),
    );
    registry.register(
        "sluice_upgrade_old_revision_retirable",
        "1 once zero proxies run the old revision (its control plane may be removed)",
        m.retirable.clone(),
    );
    m
}

const PHASES: [RevisionUpgradePhase; 8] = [
    RevisionUpgradePhase::Pending,
    RevisionUpgradePhase::Progressing,
    RevisionUpgradePhase::Soaking,
    RevisionUpgradePhase::Paused,
    RevisionUpgradePhase::RollingBack,
    RevisionUpgradePhase::Aborted,
    RevisionUpgradePhase::Complete,
    RevisionUpgradePhase::Invalid,
];

impl UpgradeMetrics {
    /// Records one restart attempt.
    pub fn restart(&self, mode: &str, result: &str) {
        self.restarts
            .get_or_create(&RestartLabels {
                mode: mode.into(),
                result: result.into(),
            })
            .inc();
    }

    /// Restarts attempted so far with `mode` and `result`.
    pub fn restarts(&self, mode: &str, result: &str) -> u64 {
        self.restarts
            .get_or_create(&RestartLabels {
                mode: mode.into(),
                result: result.into(),
            })
            .get()
    }

    /// Updates the gauges from a status just written.
    pub fn observe(
        &self,
        spec: &RevisionUpgradeSpec,
        status: &RevisionUpgradeStatus,
        proxies: &std::collections::BTreeMap<String, u64>,
        in_flight: u64,
    ) {
        self.proxies.clear();
        for (revision, n) in proxies {
            self.proxies
                .get_or_create(&RevisionLabels {
                    revision: revision.clone(),
                })
                .set(*n as i64);
        }
        self.in_flight.set(in_flight as i64);
        if let Some(b) = &status.issuance_budget {
            self.tokens.set(b.tokens);
            self.observed.set(b.observed_rate);
            self.background.set(b.background_rate);
            self.headroom
                .set(pacing::headroom(&spec.issuance_budget, b.background_rate));
            self.throttled.set(i64::from(b.throttled));
        }
        self.budget.set(f64::from(spec.issuance_budget.rate));
        self.wave_namespaces.clear();
        self.wave_moved.clear();
        for w in &status.waves {
            let l = WaveLabels {
                wave: w.name.clone(),
            };
            self.wave_namespaces
                .get_or_create(&l)
                .set(i64::from(w.namespaces));
            let moved = status
                .namespaces
                .iter()
                .filter(|n| n.wave == w.name && n.state == NamespaceState::Moved)
                .count();
            self.wave_moved.get_or_create(&l).set(moved as i64);
        }
        for p in PHASES {
            self.phase
                .get_or_create(&PhaseLabels {
                    phase: format!("{p:?}"),
                })
                .set(i64::from(p == status.phase));
        }
        self.retirable.set(i64::from(status.completed_at.is_some()));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_metric_is_registered_with_the_sluice_prefix() {
        let mut registry = Registry::default();
        let m = register(&mut registry);
        m.restart("evict", "started");
        let spec: RevisionUpgradeSpec = serde_json::from_value(serde_json::json!({
            "fromTag": "stable", "fromRevision": "1-27", "toTag": "canary", "toRevision": "1-28"
        }))
        .unwrap();
        let status = RevisionUpgradeStatus {
            phase: RevisionUpgradePhase::Complete,
            completed_at: Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
            )),
            ..RevisionUpgradeStatus::default()
        };
        m.observe(
            &spec,
            &status,
            &[("1-28".to_owned(), 3)].into_iter().collect(),
            0,
        );
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &registry).unwrap();
        for line in out.lines().filter(|l| !l.starts_with('#')) {
            assert!(line.starts_with("sluice_upgrade_"), "{line}");
        }
        assert!(
            out.contains("sluice_upgrade_proxies{revision=\"1-28\"} 3"),
            "{out}"
        );
        assert!(
            out.contains("sluice_upgrade_old_revision_retirable 1"),
            "{out}"
        );
        assert!(
            out.contains("sluice_upgrade_phase{phase=\"Complete\"} 1"),
            "{out}"
        );
        assert!(
            out.contains("sluice_upgrade_restarts_total{mode=\"evict\",result=\"started\"} 1"),
            "{out}"
        );
    }
}
