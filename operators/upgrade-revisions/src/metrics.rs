//! The upgrade-revisions operator's Prometheus metrics: proxies per injecting revision, restarts
//! started and in flight, the issuance budget (tokens, observed and background issuance, the
//! budget and the headroom it leaves), wave progress, phase, and whether the old revision may be
//! retired.
//!
//! Owns metric names (all `sluice_upgrade_*`), help texts and label sets. Every series carries
//! `upgrade` (the RevisionUpgrade's name; the kind is cluster-scoped), so two upgrades in one
//! cluster never overwrite each other; the other labels come from fixed or operator-bounded
//! sets (phase, result, restart mode, injecting revision, wave name — at most 16 per upgrade).
//! Never a pod name or a message.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex, atomic::AtomicU64},
};

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

/// Labels naming the upgrade.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct UpgradeLabels {
    /// The RevisionUpgrade's name.
    pub upgrade: String,
}

/// Labels naming an injecting revision.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct RevisionLabels {
    /// The RevisionUpgrade's name.
    pub upgrade: String,
    /// Revision recorded by the injector (`sidecar.istio.io/status`).
    pub revision: String,
}

/// Labels naming a wave.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct WaveLabels {
    /// The RevisionUpgrade's name.
    pub upgrade: String,
    /// Wave name from the spec.
    pub wave: String,
}

/// Labels naming a phase.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct PhaseLabels {
    /// The RevisionUpgrade's name.
    pub upgrade: String,
    /// Pending, Progressing, Soaking, Paused, RollingBack, Aborted, Complete or Invalid.
    pub phase: String,
}

/// Labels of a restart attempt.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct RestartLabels {
    /// The RevisionUpgrade's name.
    pub upgrade: String,
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
    in_flight: Family<UpgradeLabels, Gauge>,
    tokens: Family<UpgradeLabels, FloatGauge>,
    observed: Family<UpgradeLabels, FloatGauge>,
    background: Family<UpgradeLabels, FloatGauge>,
    budget: Family<UpgradeLabels, FloatGauge>,
    headroom: Family<UpgradeLabels, FloatGauge>,
    throttled: Family<UpgradeLabels, Gauge>,
    wave_namespaces: Family<WaveLabels, Gauge>,
    wave_moved: Family<WaveLabels, Gauge>,
    phase: Family<PhaseLabels, Gauge>,
    retirable: Family<UpgradeLabels, Gauge>,
    /// Per upgrade, the revisions and waves it has series for (removed when they go away).
    labelled: Arc<Mutex<HashMap<String, Labelled>>>,
}

/// The revisions and waves one upgrade has series for.
type Labelled = (Vec<String>, Vec<String>);

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

/// The `mode` values of restart attempts.
pub const RESTART_MODES: [&str; 2] = ["evict", "rollout_restart"];
/// The `result` values of restart attempts.
pub const RESTART_RESULTS: [&str; 4] = ["started", "blocked", "gone", "error"];

impl UpgradeMetrics {
    /// Records one restart attempt of upgrade `upgrade`.
    pub fn restart(&self, upgrade: &str, mode: &str, result: &str) {
        self.restarts
            .get_or_create(&RestartLabels {
                upgrade: upgrade.into(),
                mode: mode.into(),
                result: result.into(),
            })
            .inc();
    }

    /// Restarts of upgrade `upgrade` attempted so far with `mode` and `result`.
    pub fn restarts(&self, upgrade: &str, mode: &str, result: &str) -> u64 {
        self.restarts
            .get_or_create(&RestartLabels {
                upgrade: upgrade.into(),
                mode: mode.into(),
                result: result.into(),
            })
            .get()
    }

    /// The upgrades that have series.
    pub fn upgrades(&self) -> std::collections::BTreeSet<String> {
        self.labelled
            .lock()
            .expect("metrics labels lock")
            .keys()
            .cloned()
            .collect()
    }

    /// Removes the series of every upgrade the leader's store (`objects`, the runtime's
    /// per-object series) does not hold: a deleted one, and all of them once this replica stops
    /// leading (it then holds none), so a dashboard shows the leader's figures only, never a
    /// former leader's last phase beside them. Called periodically; returns how many it removed.
    pub fn follow(&self, objects: &sluice_runtime::metrics::ObjectSignals) -> usize {
        let live: std::collections::BTreeSet<String> = objects
            .objects_of(OBJECT_KIND)
            .into_iter()
            .map(|(_, name)| name)
            .collect();
        let gone: Vec<String> = self.upgrades().difference(&live).cloned().collect();
        for upgrade in &gone {
            self.forget(upgrade);
        }
        gone.len()
    }

    /// Removes every series of upgrade `upgrade` (it was deleted): a dashboard shows what
    /// exists, not the last value of an upgrade that is gone.
    pub fn forget(&self, upgrade: &str) {
        let me = UpgradeLabels {
            upgrade: upgrade.to_owned(),
        };
        let (revisions, waves) = self
            .labelled
            .lock()
            .expect("metrics labels lock")
            .remove(upgrade)
            .unwrap_or_default();
        for r in revisions {
            self.proxies.remove(&RevisionLabels {
                upgrade: upgrade.to_owned(),
                revision: r,
            });
        }
        for w in waves {
            let l = WaveLabels {
                upgrade: upgrade.to_owned(),
                wave: w,
            };
            self.wave_namespaces.remove(&l);
            self.wave_moved.remove(&l);
        }
        for mode in RESTART_MODES {
            for result in RESTART_RESULTS {
                self.restarts.remove(&RestartLabels {
                    upgrade: upgrade.to_owned(),
                    mode: mode.to_owned(),
                    result: result.to_owned(),
                });
            }
        }
        for f in [&self.in_flight, &self.throttled, &self.retirable] {
            f.remove(&me);
        }
        for f in [
            &self.tokens,
            &self.observed,
            &self.background,
            &self.budget,
            &self.headroom,
        ] {
            f.remove(&me);
        }
        for p in PHASES {
            self.phase.remove(&PhaseLabels {
                upgrade: upgrade.to_owned(),
                phase: format!("{p:?}"),
            });
        }
    }

    /// Updates upgrade `upgrade`'s gauges from a status just written.
    pub fn observe(
        &self,
        upgrade: &str,
        spec: &RevisionUpgradeSpec,
        status: &RevisionUpgradeStatus,
        proxies: &std::collections::BTreeMap<String, u64>,
        in_flight: u64,
    ) {
        let me = UpgradeLabels {
            upgrade: upgrade.to_owned(),
        };
        let revision = |r: &str| RevisionLabels {
            upgrade: upgrade.to_owned(),
            revision: r.to_owned(),
        };
        let wave = |w: &str| WaveLabels {
            upgrade: upgrade.to_owned(),
            wave: w.to_owned(),
        };
        {
            // Series of revisions and waves this upgrade no longer has are removed.
            let mut labelled = self.labelled.lock().expect("metrics labels lock");
            let (revisions, waves) = labelled.entry(upgrade.to_owned()).or_default();
            for r in revisions.iter().filter(|r| !proxies.contains_key(*r)) {
                self.proxies.remove(&revision(r));
            }
            for w in waves
                .iter()
                .filter(|w| !status.waves.iter().any(|x| &x.name == *w))
            {
                self.wave_namespaces.remove(&wave(w));
                self.wave_moved.remove(&wave(w));
            }
            *revisions = proxies.keys().cloned().collect();
            *waves = status.waves.iter().map(|w| w.name.clone()).collect();
        }
        for (r, n) in proxies {
            self.proxies.get_or_create(&revision(r)).set(*n as i64);
        }
        self.in_flight.get_or_create(&me).set(in_flight as i64);
        if let Some(b) = &status.issuance_budget {
            self.tokens.get_or_create(&me).set(b.tokens);
            self.observed.get_or_create(&me).set(b.observed_rate);
            self.background.get_or_create(&me).set(b.background_rate);
            self.headroom
                .get_or_create(&me)
                .set(pacing::headroom(&spec.issuance_budget, b.background_rate));
            self.throttled
                .get_or_create(&me)
                .set(i64::from(b.throttled));
        }
        self.budget
            .get_or_create(&me)
            .set(f64::from(spec.issuance_budget.rate));
        for w in &status.waves {
            let l = wave(&w.name);
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
                    upgrade: upgrade.to_owned(),
                    phase: format!("{p:?}"),
                })
                .set(i64::from(p == status.phase));
        }
        self.retirable
            .get_or_create(&me)
            .set(i64::from(status.completed_at.is_some()));
    }
}

/// The `kind` label of a RevisionUpgrade's per-object series.
pub const OBJECT_KIND: &str = "RevisionUpgrade";

/// Says how a scrape reads the RevisionUpgrades the leader's store holds: each one's signal
/// ([`object_signal`]). The operator calls it once at start-up.
pub fn read_at_scrape(objects: &sluice_runtime::metrics::ObjectSignals) {
    objects.decided_by(|u: &sluice_api::v1alpha1::RevisionUpgrade, _now| {
        u.status.as_ref().map(object_signal)
    });
}

/// What the per-object series (`sluice_object_*`, `sluice_runtime::metrics::ObjectSignals`)
/// say about a RevisionUpgrade, from its status alone: its phase; the reason of a Ready
/// condition that is False, else the Progressing condition's reason (why it is paused, soaking
/// or rolling back); and when it last progressed (the latest of its conditions' transitions,
/// its waves' starts, soaks and ends, its abort and its completion).
pub fn object_signal(status: &RevisionUpgradeStatus) -> sluice_runtime::metrics::ObjectSignal {
    let signal = sluice_runtime::metrics::ObjectSignal::from_conditions(
        &format!("{:?}", status.phase),
        &status.conditions,
        None,
    );
    let moments = status
        .waves
        .iter()
        .flat_map(|w| {
            [
                w.started_at.as_ref(),
                w.soak_started_at.as_ref(),
                w.finished_at.as_ref(),
            ]
        })
        .chain([status.aborted_at.as_ref(), status.completed_at.as_ref()]);
    signal.progressed_by(moments)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_upgrades_signal_names_its_phase_reason_and_last_progress() {
        let status: RevisionUpgradeStatus = serde_json::from_value(serde_json::json!({
            "phase": "Paused",
            "waves": [{"name": "first", "startedAt": "2026-12-01T10:00:00Z",
                "soakStartedAt": "2026-12-01T10:03:00Z"}],
            "conditions": [
                {"type": "Ready", "status": "True", "reason": "Valid", "message": "m",
                    "lastTransitionTime": "2026-12-01T09:00:00Z"},
                {"type": "Progressing", "status": "False", "reason": "PausedBySpec", "message": "m",
                    "lastTransitionTime": "2026-12-01T10:01:00Z"}
            ]
        }))
        .expect("status fixture");
        let s = object_signal(&status);
        assert_eq!(
            (s.phase.as_str(), s.reason.as_str()),
            ("Paused", "PausedBySpec")
        );
        assert_eq!(s.progressed_at, Some(1_796_119_380));
    }

    fn status(phase: RevisionUpgradePhase, waves: &[&str]) -> RevisionUpgradeStatus {
        RevisionUpgradeStatus {
            phase,
            completed_at: (phase == RevisionUpgradePhase::Complete).then_some(
                k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                    k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
                ),
            ),
            waves: waves
                .iter()
                .map(
                    |w| sluice_api::v1alpha1::revision_upgrade::UpgradeWaveStatus {
                        name: (*w).to_owned(),
                        namespaces: 2,
                        ..Default::default()
                    },
                )
                .collect(),
            ..RevisionUpgradeStatus::default()
        }
    }

    /// An upgrade from 1-27 (tag `stable`) to 1-28 (tag `canary`).
    fn spec() -> RevisionUpgradeSpec {
        serde_json::from_value(serde_json::json!({
            "fromTag": "stable", "fromRevision": "1-27", "toTag": "canary", "toRevision": "1-28"
        }))
        .unwrap()
    }

    #[test]
    fn every_series_is_prefixed_and_names_its_upgrade_so_two_never_overwrite() {
        let mut registry = Registry::default();
        let m = register(&mut registry);
        let spec = spec();
        m.restart("a", "evict", "started");
        m.observe(
            "a",
            &spec,
            &status(RevisionUpgradePhase::Complete, &["tier-1"]),
            &[("1-28".to_owned(), 3)].into_iter().collect(),
            0,
        );
        m.observe(
            "b",
            &spec,
            &status(RevisionUpgradePhase::Progressing, &["tier-1"]),
            &[("1-27".to_owned(), 5), ("1-28".to_owned(), 1)]
                .into_iter()
                .collect(),
            1,
        );
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &registry).unwrap();
        for line in out.lines().filter(|l| !l.starts_with('#')) {
            assert!(line.starts_with("sluice_upgrade_"), "{line}");
            assert!(
                line.contains("upgrade=\"a\"") || line.contains("upgrade=\"b\""),
                "{line}"
            );
        }
        for want in [
            "sluice_upgrade_proxies{upgrade=\"a\",revision=\"1-28\"} 3",
            "sluice_upgrade_proxies{upgrade=\"b\",revision=\"1-28\"} 1",
            "sluice_upgrade_proxies{upgrade=\"b\",revision=\"1-27\"} 5",
            "sluice_upgrade_old_revision_retirable{upgrade=\"a\"} 1",
            "sluice_upgrade_old_revision_retirable{upgrade=\"b\"} 0",
            "sluice_upgrade_phase{upgrade=\"a\",phase=\"Complete\"} 1",
            "sluice_upgrade_phase{upgrade=\"b\",phase=\"Progressing\"} 1",
            "sluice_upgrade_restarts_total{upgrade=\"a\",mode=\"evict\",result=\"started\"} 1",
            "sluice_upgrade_wave_namespaces{upgrade=\"b\",wave=\"tier-1\"} 2",
        ] {
            assert!(out.contains(want), "missing {want} in\n{out}");
        }
        assert_eq!(m.restarts("a", "evict", "started"), 1);
        assert_eq!(m.restarts("b", "evict", "started"), 0);
    }

    #[test]
    fn series_of_revisions_and_waves_that_went_away_are_removed() {
        let mut registry = Registry::default();
        let m = register(&mut registry);
        let spec = spec();
        let both = [("1-27".to_owned(), 2), ("1-28".to_owned(), 2)];
        m.observe(
            "a",
            &spec,
            &status(RevisionUpgradePhase::Progressing, &["w1", "w2"]),
            &both.into_iter().collect(),
            0,
        );
        m.observe(
            "b",
            &spec,
            &status(RevisionUpgradePhase::Progressing, &["w1"]),
            &[("1-27".to_owned(), 7)].into_iter().collect(),
            0,
        );
        m.observe(
            "a",
            &spec,
            &status(RevisionUpgradePhase::Progressing, &["w1"]),
            &[("1-28".to_owned(), 4)].into_iter().collect(),
            0,
        );
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &registry).unwrap();
        assert!(!out.contains("upgrade=\"a\",revision=\"1-27\""), "{out}");
        assert!(!out.contains("upgrade=\"a\",wave=\"w2\""), "{out}");
        assert!(
            out.contains("sluice_upgrade_proxies{upgrade=\"b\",revision=\"1-27\"} 7"),
            "another upgrade's series stay: {out}"
        );
    }

    #[test]
    fn only_the_upgrades_the_leaders_store_holds_keep_series_and_none_once_it_steps_down() {
        use kube::runtime::{reflector, watcher};
        let mut registry = Registry::default();
        let m = register(&mut registry);
        for name in ["a", "b"] {
            m.observe(
                name,
                &spec(),
                &status(RevisionUpgradePhase::Progressing, &["w1"]),
                &[("1-27".to_owned(), 3)].into_iter().collect(),
                1,
            );
        }
        let text = |registry: &Registry| {
            let mut out = String::new();
            prometheus_client::encoding::text::encode(&mut out, registry).unwrap();
            out
        };
        // Leading over a store that holds only `a` (`b` was deleted while the watch was down).
        let objects = sluice_runtime::metrics::ObjectSignals::default();
        let (store, mut writer) = reflector::store();
        let a = sluice_api::v1alpha1::RevisionUpgrade::new("a", spec());
        writer.apply_watcher_event(&watcher::Event::Apply(a));
        objects.lead(store);
        assert_eq!(m.follow(&objects), 1);
        let out = text(&registry);
        assert!(
            out.contains("sluice_upgrade_phase{upgrade=\"a\",phase=\"Progressing\"} 1"),
            "{out}"
        );
        assert!(
            !out.contains("upgrade=\"b\""),
            "a deleted upgrade keeps series:\n{out}"
        );
        assert_eq!(m.follow(&objects), 0, "nothing more to remove");

        // This replica stops leading: its last figures go, so a dashboard's phase of `a` is the
        // new leader's alone.
        objects.step_down();
        assert_eq!(m.follow(&objects), 1);
        let out = text(&registry);
        assert!(
            !out.contains("upgrade=\"a\""),
            "a former leader's series stay:\n{out}"
        );
    }

    #[test]
    fn a_deleted_upgrade_leaves_no_series_and_others_keep_theirs() {
        let mut registry = Registry::default();
        let m = register(&mut registry);
        let spec = spec();
        for name in ["a", "b"] {
            m.observe(
                name,
                &spec,
                &status(RevisionUpgradePhase::Progressing, &["w1"]),
                &[("1-27".to_owned(), 3)].into_iter().collect(),
                1,
            );
            m.restart(name, "evict", "started");
            m.restart(name, "rollout_restart", "blocked");
        }
        m.forget("a");
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &registry).unwrap();
        assert!(!out.contains("upgrade=\"a\""), "a's series are gone: {out}");
        for want in [
            "sluice_upgrade_proxies{upgrade=\"b\",revision=\"1-27\"} 3",
            "sluice_upgrade_wave_namespaces{upgrade=\"b\",wave=\"w1\"}",
            "upgrade=\"b\",mode=\"rollout_restart\",result=\"blocked\"",
        ] {
            assert!(out.contains(want), "missing {want} in\n{out}");
        }
    }
}
