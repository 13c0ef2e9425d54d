//! The wave-gate metrics: current wave, phase, gate verdicts, time per wave, halts, and each
//! site's progress for the global metrics view (what other sites' cross-site waits read).
//!
//! Owns the metric names (all `sluice_wavegate_*`), help texts and label sets. Series are keyed
//! by `site` (one WaveGate per site), never by a message; the only other label values are fixed
//! enums, gate names from the spec, wave names and the revision of the change in progress (its
//! series are removed when the revision changes). Gate verdicts also name their WaveGate with the
//! per-object labels (`object_namespace`, `object_name`, as `sluice_object_*`) so an alert can say
//! which object to look at. A WaveGate's series, its verdicts and every series keyed by its site
//! (current wave, phase, wave and decision times, halts, waves passed), are removed with the
//! object's per-object series ([`WaveGateMetrics::retain_objects`]): a deleted WaveGate leaves
//! nothing behind, and a WaveGate whose `spec.site` changed leaves nothing under the old site.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};

use jiff::Timestamp;
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
    Verdict, WaveGatePhase, WaveGateSpec, WaveGateStatus, wave_gate::WaveState,
};

/// The metric the global metrics view carries between sites: 1 for every wave a site passed
/// (or admitted by an emergency) at a revision. Cross-site waits query it by this name.
pub const WAVE_PASSED_METRIC: &str = "sluice_wavegate_wave_passed";
/// Completed revisions whose passed waves stay exported for other sites' waits.
pub const COMPLETED_REVISIONS_EXPORTED: usize = 8;

/// Labels keyed by site.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct SiteLabels {
    /// The WaveGate's `spec.site`.
    pub site: String,
}

/// Labels of the phase gauge.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct PhaseLabels {
    /// Site.
    pub site: String,
    /// One of the WaveGate phases.
    pub phase: String,
}

/// Labels of the gate verdict gauge.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, EncodeLabelSet)]
pub struct VerdictLabels {
    /// Site.
    pub site: String,
    /// The WaveGate's namespace.
    pub object_namespace: String,
    /// The WaveGate's name.
    pub object_name: String,
    /// Gate name (from the spec or a built-in).
    pub gate: String,
    /// Pass, Fail or Inconclusive.
    pub verdict: String,
}

/// Labels of the halt counter.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct HaltLabels {
    /// Site.
    pub site: String,
    /// GateFailed, InconclusiveTimeout or ConvergenceTimeout.
    pub reason: String,
}

/// Labels of a site's progress.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, EncodeLabelSet)]
pub struct ProgressLabels {
    /// Site.
    pub site: String,
    /// The revision of the change.
    pub revision: String,
    /// A wave the site passed at that revision.
    pub wave: String,
}

const PHASES: [WaveGatePhase; 7] = [
    WaveGatePhase::Pending,
    WaveGatePhase::Progressing,
    WaveGatePhase::Soaking,
    WaveGatePhase::WaitingForSite,
    WaveGatePhase::Complete,
    WaveGatePhase::Halted,
    WaveGatePhase::Refused,
];

fn phase_name(p: WaveGatePhase) -> &'static str {
    match p {
        WaveGatePhase::Pending => "Pending",
        WaveGatePhase::Progressing => "Progressing",
        WaveGatePhase::Soaking => "Soaking",
        WaveGatePhase::WaitingForSite => "WaitingForSite",
        WaveGatePhase::Complete => "Complete",
        WaveGatePhase::Halted => "Halted",
        WaveGatePhase::Refused => "Refused",
    }
}

fn verdict_name(v: Verdict) -> &'static str {
    match v {
        Verdict::Pass => "Pass",
        Verdict::Fail => "Fail",
        Verdict::Inconclusive => "Inconclusive",
    }
}

/// The verdict series exported per WaveGate (namespace, name).
type VerdictsByObject = BTreeMap<(String, String), BTreeSet<VerdictLabels>>;

/// Handles to the wave-gate metrics; cheap to clone.
#[derive(Debug, Clone)]
pub struct WaveGateMetrics {
    current_wave: Family<SiteLabels, Gauge>,
    phase: Family<PhaseLabels, Gauge>,
    verdicts: Family<VerdictLabels, Gauge>,
    wave_seconds: Family<SiteLabels, Histogram>,
    decision_seconds: Family<SiteLabels, Histogram>,
    halts: Family<HaltLabels, Counter>,
    passed: Family<ProgressLabels, Gauge>,
    exported: Arc<Mutex<BTreeMap<String, BTreeSet<ProgressLabels>>>>,
    verdicts_exported: Arc<Mutex<VerdictsByObject>>,
    /// The site each WaveGate (namespace, name) was last recorded with.
    sites: Arc<Mutex<BTreeMap<(String, String), String>>>,
    /// The halt reasons counted, by site.
    halt_reasons: Arc<Mutex<BTreeMap<String, BTreeSet<String>>>>,
}

/// Registers every wave-gate metric under the `sluice_` prefix.
pub fn register(registry: &mut Registry) -> WaveGateMetrics {
    let m = WaveGateMetrics {
        current_wave: Family::default(),
        phase: Family::default(),
        verdicts: Family::default(),
        // 1 s .. ~9 h: a wave is convergence plus a soak of minutes.
        wave_seconds: Family::new_with_constructor(
            (|| Histogram::new(exponential_buckets(1.0, 2.0, 16))) as fn() -> Histogram,
        ),
        // 1 ms .. ~65 s.
        decision_seconds: Family::new_with_constructor(
            (|| Histogram::new(exponential_buckets(0.001, 2.0, 17))) as fn() -> Histogram,
        ),
        halts: Family::default(),
        passed: Family::default(),
        exported: Arc::default(),
        verdicts_exported: Arc::default(),
        sites: Arc::default(),
        halt_reasons: Arc::default(),
    };
    let sub = registry.sub_registry_with_prefix("sluice_wavegate");
    sub.register(
        "current_wave",
        "Index in spec.waves of the wave in progress (or the last one), by site",
        m.current_wave.clone(),
    );
    sub.register(
        "phase",
        "1 for the WaveGate's current phase, 0 for the others, by site",
        m.phase.clone(),
    );
    sub.register(
        "gate_verdict",
        "1 for each gate's latest verdict in the wave in progress, by site, WaveGate (object_namespace, object_name), gate and verdict",
        m.verdicts.clone(),
    );
    sub.register(
        "wave_duration_seconds",
        "Time from a wave's admission to its pass, by site",
        m.wave_seconds.clone(),
    );
    sub.register(
        "soak_decision_seconds",
        "Time from the end of a wave's soak to the decision that it passed, by site",
        m.decision_seconds.clone(),
    );
    sub.register(
        "halts",
        "Changes halted, by site and reason",
        m.halts.clone(),
    );
    sub.register(
        "wave_passed",
        "1 for every wave a site passed at a revision (cross-site waits read it through the global metrics view)",
        m.passed.clone(),
    );
    m
}

impl WaveGateMetrics {
    /// Records `next` (the status just written to WaveGate `namespace`/`name`) and the
    /// transitions from `previous`.
    pub fn record(
        &self,
        namespace: &str,
        name: &str,
        spec: &WaveGateSpec,
        previous: Option<&WaveGateStatus>,
        next: &WaveGateStatus,
        now: Timestamp,
    ) {
        let site = spec.site.clone();
        let sl = SiteLabels { site: site.clone() };
        let moved_from = {
            let mut sites = self.sites.lock().unwrap_or_else(|e| e.into_inner());
            let old = sites.insert((namespace.to_owned(), name.to_owned()), site.clone());
            old.filter(|o| *o != site && !sites.values().any(|s| s == o))
        };
        if let Some(old) = moved_from {
            self.remove_site(&old);
        }
        self.current_wave
            .get_or_create(&sl)
            .set(next.current_wave_index.map_or(0, i64::from));
        for p in PHASES {
            self.phase
                .get_or_create(&PhaseLabels {
                    site: site.clone(),
                    phase: phase_name(p).into(),
                })
                .set(i64::from(p == next.phase));
        }

        // Gate verdicts of the wave in progress.
        let active = next
            .current_wave_index
            .and_then(|i| next.waves.get(i as usize));
        let gates: BTreeMap<String, Verdict> = active
            .map(|w| {
                w.gates
                    .iter()
                    .map(|g| (g.gate.clone(), g.verdict))
                    .collect()
            })
            .unwrap_or_default();
        {
            let mut now_exported = BTreeSet::new();
            for (g, verdict) in &gates {
                for v in [Verdict::Pass, Verdict::Fail, Verdict::Inconclusive] {
                    let labels = VerdictLabels {
                        site: site.clone(),
                        object_namespace: namespace.to_owned(),
                        object_name: name.to_owned(),
                        gate: g.clone(),
                        verdict: verdict_name(v).into(),
                    };
                    self.verdicts
                        .get_or_create(&labels)
                        .set(i64::from(*verdict == v));
                    now_exported.insert(labels);
                }
            }
            let mut exported = self
                .verdicts_exported
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            let old = exported
                .entry((namespace.to_owned(), name.to_owned()))
                .or_default();
            // Gates that left the wave, or an old site name, leave no series behind.
            for l in old.difference(&now_exported) {
                self.verdicts.remove(l);
            }
            *old = now_exported;
        }

        // Transitions: waves passed, halts.
        let before = |name: &str| {
            previous
                .filter(|p| p.current_revision == next.current_revision)
                .and_then(|p| p.waves.iter().find(|w| w.name == name))
                .map(|w| w.state)
        };
        for (i, w) in next.waves.iter().enumerate() {
            if w.state == WaveState::Passed && before(&w.name) != Some(WaveState::Passed) {
                if let (Some(a), Some(f)) = (&w.admitted_at, &w.finished_at) {
                    let secs = f.0.duration_since(a.0).as_secs_f64().max(0.0);
                    self.wave_seconds.get_or_create(&sl).observe(secs);
                }
                if let Some(end) = crate::decide::soak_end(spec, next, i) {
                    let secs = now.duration_since(end).as_secs_f64().max(0.0);
                    self.decision_seconds.get_or_create(&sl).observe(secs);
                }
            }
        }
        if let Some(h) = &next.halt
            && previous.and_then(|p| p.halt.as_ref()).map(|p| &p.halted_at) != Some(&h.halted_at)
        {
            let reason = format!("{:?}", h.reason);
            self.halt_reasons
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .entry(site.clone())
                .or_default()
                .insert(reason.clone());
            self.halts
                .get_or_create(&HaltLabels {
                    site: site.clone(),
                    reason,
                })
                .inc();
        }

        // Progress for other sites.
        let mut now_passed = BTreeSet::new();
        if let Some(rev) = &next.current_revision {
            for w in &next.waves {
                if matches!(w.state, WaveState::Passed | WaveState::Skipped) {
                    now_passed.insert(ProgressLabels {
                        site: site.clone(),
                        revision: rev.clone(),
                        wave: w.name.clone(),
                    });
                }
            }
        }
        // Revisions this site completed stay exported as passed in every wave (the last
        // [`COMPLETED_REVISIONS_EXPORTED`]): a site that lags behind may still be waiting for
        // one after this site moved on to a newer revision.
        for h in next
            .history
            .iter()
            .rev()
            .filter(|h| h.outcome == Some(sluice_api::v1alpha1::wave_gate::ChangeOutcome::Complete))
            .take(COMPLETED_REVISIONS_EXPORTED)
        {
            for w in &spec.waves {
                now_passed.insert(ProgressLabels {
                    site: site.clone(),
                    revision: h.revision.clone(),
                    wave: w.name.clone(),
                });
            }
        }
        let mut exported = self.exported.lock().unwrap_or_else(|e| e.into_inner());
        let old = exported.entry(site).or_default();
        for l in old.difference(&now_passed) {
            self.passed.remove(l);
        }
        for l in &now_passed {
            self.passed.get_or_create(l).set(1);
        }
        *old = now_passed;
    }
}

impl WaveGateMetrics {
    /// Removes the series of every WaveGate not in `live` (namespace, name): the WaveGates the
    /// leader's store holds, none once the object is deleted or this replica stops leading. Its verdicts go, and every series of its site unless another live WaveGate has
    /// that site. Returns how many WaveGates were removed.
    pub fn retain_objects(&self, live: &[(String, String)]) -> usize {
        let gone: BTreeSet<(String, String)> = {
            let mut exported = self
                .verdicts_exported
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            let sites = self.sites.lock().unwrap_or_else(|e| e.into_inner());
            let gone: BTreeSet<(String, String)> = exported
                .keys()
                .chain(sites.keys())
                .filter(|k| !live.contains(k))
                .cloned()
                .collect();
            for key in &gone {
                for l in exported.remove(key).unwrap_or_default() {
                    self.verdicts.remove(&l);
                }
            }
            gone
        };
        let orphaned: BTreeSet<String> = {
            let mut sites = self.sites.lock().unwrap_or_else(|e| e.into_inner());
            let left: Vec<String> = gone.iter().filter_map(|k| sites.remove(k)).collect();
            left.into_iter()
                .filter(|site| !sites.values().any(|s| s == site))
                .collect()
        };
        for site in &orphaned {
            self.remove_site(site);
        }
        gone.len()
    }

    /// Removes every series keyed by `site`: current wave, phase, wave and decision times,
    /// halts and waves passed.
    fn remove_site(&self, site: &str) {
        let sl = SiteLabels {
            site: site.to_owned(),
        };
        self.current_wave.remove(&sl);
        self.wave_seconds.remove(&sl);
        self.decision_seconds.remove(&sl);
        for p in PHASES {
            self.phase.remove(&PhaseLabels {
                site: site.to_owned(),
                phase: phase_name(p).into(),
            });
        }
        let reasons = self
            .halt_reasons
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(site)
            .unwrap_or_default();
        for reason in reasons {
            self.halts.remove(&HaltLabels {
                site: site.to_owned(),
                reason,
            });
        }
        let passed = self
            .exported
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(site)
            .unwrap_or_default();
        for l in passed {
            self.passed.remove(&l);
        }
    }

    /// [`Self::retain_objects`] for the WaveGates the leader's store holds (`objects`, the
    /// runtime's per-object series): called periodically, so a WaveGate's series go when it is
    /// deleted and all go when this replica stops leading (it then holds none).
    pub fn follow(&self, objects: &sluice_runtime::metrics::ObjectSignals) -> usize {
        self.retain_objects(&objects.objects_of(OBJECT_KIND))
    }
}

/// The `kind` label of a WaveGate's per-object series.
pub const OBJECT_KIND: &str = "WaveGate";

/// Says how a scrape reads the WaveGates the leader's store holds: each one's signal
/// ([`object_signal`]). The operator calls it once at start-up.
pub fn read_at_scrape(objects: &sluice_runtime::metrics::ObjectSignals) {
    objects.decided_by(|w: &sluice_api::v1alpha1::WaveGate, _now| {
        w.status.as_ref().map(object_signal)
    });
}

/// What the per-object series (`sluice_object_*`, `sluice_runtime::metrics::ObjectSignals`)
/// say about a WaveGate, from its status alone: its phase; the halt's reason when Halted, else
/// the reason of a Ready condition that is False, else the Progressing condition's reason; and
/// when it last progressed (the latest of its conditions' transitions, its waves' admissions and
/// ends, and its halt).
pub fn object_signal(status: &WaveGateStatus) -> sluice_runtime::metrics::ObjectSignal {
    let halt = status
        .halt
        .as_ref()
        .filter(|_| status.phase == WaveGatePhase::Halted)
        .map(|h| format!("{:?}", h.reason));
    let signal = sluice_runtime::metrics::ObjectSignal::from_conditions(
        &format!("{:?}", status.phase),
        &status.conditions,
        halt,
    );
    let moments = status
        .waves
        .iter()
        .flat_map(|w| [w.admitted_at.as_ref(), w.finished_at.as_ref()])
        .chain([status.halt.as_ref().map(|h| &h.halted_at)]);
    signal.progressed_by(moments)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_wave_gates_signal_names_its_phase_halt_reason_and_last_progress() {
        let status: WaveGateStatus = serde_json::from_value(serde_json::json!({
            "phase": "Halted",
            "waves": [{"name": "canary", "state": "Failed", "admittedAt": "2026-12-01T10:00:00Z"}],
            "halt": {"reason": "GateFailed", "wave": "canary", "haltedAt": "2026-12-01T10:05:00Z"},
            "conditions": [{"type": "Ready", "status": "True", "reason": "Valid", "message": "m",
                "lastTransitionTime": "2026-12-01T09:00:00Z"}]
        }))
        .expect("status fixture");
        let s = object_signal(&status);
        assert_eq!(s.phase, "Halted");
        assert_eq!(s.reason, "GateFailed");
        assert_eq!(s.progressed_at, Some(1_796_119_500));
        assert!(s.overdue.is_empty());

        let soaking: WaveGateStatus = serde_json::from_value(serde_json::json!({
            "phase": "Soaking",
            "conditions": [{"type": "Progressing", "status": "True", "reason": "Soaking",
                "message": "m", "lastTransitionTime": "2026-12-01T10:00:00Z"}]
        }))
        .expect("status fixture");
        let s = object_signal(&soaking);
        assert_eq!(
            (s.phase.as_str(), s.reason.as_str()),
            ("Soaking", "Soaking")
        );
    }
    use kube::runtime::{reflector, watcher};
    use prometheus_client::encoding::text::encode;
    use sluice_api::v1alpha1::WaveGate;

    /// The runtime's per-object series, leading over a store of WaveGates the returned writer
    /// changes.
    fn leading() -> (
        sluice_runtime::metrics::ObjectSignals,
        reflector::store::Writer<WaveGate>,
    ) {
        let objects = sluice_runtime::metrics::ObjectSignals::default();
        let (store, writer) = reflector::store();
        objects.lead(store);
        (objects, writer)
    }

    /// WaveGate `fleet`/`name` of `site` with `status`.
    fn wave_gate(name: &str, site: &str, status: &WaveGateStatus) -> WaveGate {
        let mut w = WaveGate::new(name, spec(site));
        w.metadata.namespace = Some("fleet".into());
        w.status = Some(status.clone());
        w
    }

    /// A one-wave WaveGate of `site`.
    fn spec(site: &str) -> WaveGateSpec {
        serde_json::from_value(serde_json::json!({
            "site": site,
            "applicationSetRef": {"name": "mesh"},
            "repository": "oci://registry.local/mesh",
            "revision": format!("sha256:{}", "b".repeat(64)),
            "waves": [{"name": "canary", "clusters": ["c1"]}],
            "driftGate": {"exporter": "None"},
            "pin": {"publicKeysSecretRef": {"name": "keys"}},
        }))
        .unwrap()
    }

    #[test]
    fn every_metric_is_registered_with_the_prefix() {
        let mut r = Registry::default();
        let m = register(&mut r);
        let spec = spec("eu");
        let status: WaveGateStatus = serde_json::from_value(serde_json::json!({
            "phase": "Halted",
            "currentRevision": spec.revision,
            "currentWaveIndex": 0,
            "waves": [{
                "name": "canary", "state": "Passed",
                "admittedAt": "2027-01-15T08:00:00Z", "convergedAt": "2027-01-15T08:01:00Z", "finishedAt": "2027-01-15T08:12:00Z",
                "gates": [{"gate": "mesh-error-ratio", "verdict": "Pass", "reason": "ThresholdMet", "evaluatedAt": "2027-01-15T08:12:00Z"}]
            }],
            "halt": {"reason": "GateFailed", "wave": "canary", "haltedAt": "2027-01-15T08:12:00Z"},
        }))
        .unwrap();
        m.record(
            "fleet",
            "west",
            &spec,
            None,
            &status,
            "2027-01-15T08:12:01Z".parse().unwrap(),
        );
        let mut out = String::new();
        encode(&mut out, &r).unwrap();
        for name in [
            "sluice_wavegate_current_wave",
            "sluice_wavegate_phase",
            "sluice_wavegate_gate_verdict",
            "sluice_wavegate_wave_duration_seconds",
            "sluice_wavegate_soak_decision_seconds",
            "sluice_wavegate_halts",
            WAVE_PASSED_METRIC,
        ] {
            assert!(
                out.contains(&format!("# TYPE {name} ")),
                "{name} missing:\n{out}"
            );
        }
        assert!(
            out.contains(&format!(
                "{WAVE_PASSED_METRIC}{{site=\"eu\",revision=\"{}\",wave=\"canary\"}} 1",
                spec.revision
            )),
            "{out}"
        );
        // A new revision removes the old revision's progress.
        let mut next = status.clone();
        next.current_revision = Some(format!("sha256:{}", "c".repeat(64)));
        next.waves[0].state = WaveState::Converging;
        m.record(
            "fleet",
            "west",
            &spec,
            Some(&status),
            &next,
            Timestamp::UNIX_EPOCH,
        );
        let mut out = String::new();
        encode(&mut out, &r).unwrap();
        assert!(!out.contains("wave=\"canary\"} 1"), "{out}");
        // A revision this site completed stays passed while it runs a newer one: a lagging
        // site waiting for it is never left waiting for ever (B-14).
        let mut later = next.clone();
        later
            .history
            .push(sluice_api::v1alpha1::wave_gate::ChangeRecord {
                revision: spec.revision.clone(),
                previous_revision: None,
                started_at: k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                    Timestamp::UNIX_EPOCH,
                ),
                finished_at: None,
                outcome: Some(sluice_api::v1alpha1::wave_gate::ChangeOutcome::Complete),
                reason: None,
            });
        m.record(
            "fleet",
            "west",
            &spec,
            Some(&next),
            &later,
            Timestamp::UNIX_EPOCH,
        );
        let mut out = String::new();
        encode(&mut out, &r).unwrap();
        assert!(
            out.contains(&format!(
                "{WAVE_PASSED_METRIC}{{site=\"eu\",revision=\"{}\",wave=\"canary\"}} 1",
                spec.revision
            )),
            "{out}"
        );
    }

    #[test]
    fn gate_verdicts_name_the_wave_gate_and_are_removed_with_it() {
        let mut r = Registry::default();
        let m = register(&mut r);
        let status = |gate: &str, verdict: &str| -> WaveGateStatus {
            serde_json::from_value(serde_json::json!({
                "phase": "Soaking",
                "currentWaveIndex": 0,
                "waves": [{"name": "canary", "state": "Soaking",
                    "gates": [{"gate": gate, "verdict": verdict, "reason": "NoData",
                        "evaluatedAt": "2027-01-15T08:12:00Z"}]}],
            }))
            .unwrap()
        };
        let text = || {
            let mut out = String::new();
            encode(&mut out, &r).unwrap();
            out
        };
        let series = |ns: &str, name: &str, site: &str, gate: &str, verdict: &str, v: u8| {
            format!(
                "sluice_wavegate_gate_verdict{{site=\"{site}\",object_namespace=\"{ns}\",\
                 object_name=\"{name}\",gate=\"{gate}\",verdict=\"{verdict}\"}} {v}"
            )
        };
        let t = Timestamp::UNIX_EPOCH;
        m.record(
            "fleet",
            "west",
            &spec("eu"),
            None,
            &status("drift", "Inconclusive"),
            t,
        );
        m.record(
            "fleet",
            "east",
            &spec("us"),
            None,
            &status("drift", "Pass"),
            t,
        );
        let out = text();
        for want in [
            series("fleet", "west", "eu", "drift", "Inconclusive", 1),
            series("fleet", "west", "eu", "drift", "Pass", 0),
            series("fleet", "east", "us", "drift", "Pass", 1),
        ] {
            assert!(out.contains(&want), "{want} missing:\n{out}");
        }

        // A gate that left the wave, or a site that changed, leaves no series behind.
        let before = status("drift", "Inconclusive");
        m.record(
            "fleet",
            "west",
            &spec("eu-1"),
            Some(&before),
            &status("errors", "Pass"),
            t,
        );
        let out = text();
        assert!(
            !out.contains("gate=\"drift\",verdict=\"Inconclusive\"} 1"),
            "{out}"
        );
        assert!(
            !out.contains("sluice_wavegate_gate_verdict{site=\"eu\","),
            "{out}"
        );
        assert!(
            out.contains(&series("fleet", "west", "eu-1", "errors", "Pass", 1)),
            "{out}"
        );

        // Deleted (no longer live): its verdicts go too, the other's stay.
        let removed = m.retain_objects(&[("fleet".to_string(), "east".to_string())]);
        assert_eq!(removed, 1);
        let out = text();
        assert!(!out.contains("object_name=\"west\""), "{out}");
        assert!(
            out.contains(&series("fleet", "east", "us", "drift", "Pass", 1)),
            "{out}"
        );
        assert_eq!(m.retain_objects(&[]), 1);
        assert!(
            !text().contains("sluice_wavegate_gate_verdict{"),
            "{}",
            text()
        );

        // Following the leader's store of WaveGates: a WaveGate it no longer holds (deleted)
        // loses its verdicts; all go when this replica stops leading.
        let (objects, mut store) = leading();
        for (name, site) in [("west", "eu"), ("east", "us")] {
            let st = status("drift", "Inconclusive");
            store.apply_watcher_event(&watcher::Event::Apply(wave_gate(name, site, &st)));
            m.record("fleet", name, &spec(site), None, &st, t);
        }
        assert_eq!(m.follow(&objects), 0);
        let west = wave_gate("west", "eu", &status("drift", "Inconclusive"));
        store.apply_watcher_event(&watcher::Event::Delete(west));
        assert_eq!(m.follow(&objects), 1);
        let out = text();
        assert!(!out.contains("object_name=\"west\""), "{out}");
        assert!(
            out.contains(&series("fleet", "east", "us", "drift", "Inconclusive", 1)),
            "{out}"
        );
        objects.step_down();
        assert_eq!(m.follow(&objects), 1);
        assert!(
            !text().contains("sluice_wavegate_gate_verdict{"),
            "{}",
            text()
        );
    }

    #[test]
    fn a_deleted_wave_gates_site_series_go_with_it() {
        let mut r = Registry::default();
        let m = register(&mut r);
        let (objects, mut store) = leading();
        // Two sites, each one WaveGate that passed its wave at a revision and halted once.
        for (name, site) in [("west", "eu"), ("east", "us")] {
            let spec = spec(site);
            let status: WaveGateStatus = serde_json::from_value(serde_json::json!({
                "phase": "Halted",
                "currentRevision": spec.revision,
                "currentWaveIndex": 0,
                "waves": [{
                    "name": "canary", "state": "Passed",
                    "admittedAt": "2027-01-15T08:00:00Z", "finishedAt": "2027-01-15T08:12:00Z",
                    "gates": [{"gate": "drift", "verdict": "Pass", "reason": "ThresholdMet",
                        "evaluatedAt": "2027-01-15T08:12:00Z"}]
                }],
                "halt": {"reason": "GateFailed", "wave": "canary", "haltedAt": "2027-01-15T08:12:00Z"},
            }))
            .unwrap();
            store.apply_watcher_event(&watcher::Event::Apply(wave_gate(name, site, &status)));
            m.record(
                "fleet",
                name,
                &spec,
                None,
                &status,
                "2027-01-15T08:12:01Z".parse().unwrap(),
            );
        }
        let text = || {
            let mut out = String::new();
            encode(&mut out, &r).unwrap();
            out
        };
        let families = [
            "sluice_wavegate_current_wave",
            "sluice_wavegate_phase",
            "sluice_wavegate_gate_verdict",
            "sluice_wavegate_wave_duration_seconds_count",
            "sluice_wavegate_halts_total",
            WAVE_PASSED_METRIC,
        ];
        let out = text();
        for family in families {
            for site in ["eu", "us"] {
                let series = format!("{family}{{site=\"{site}\"");
                assert!(out.contains(&series), "{series} missing:\n{out}");
            }
        }

        // West is deleted (the leader's store no longer holds it): no series of its site is
        // left, east's all stay.
        let west = wave_gate("west", "eu", &WaveGateStatus::default());
        store.apply_watcher_event(&watcher::Event::Delete(west));
        assert_eq!(m.follow(&objects), 1);
        let out = text();
        for family in families {
            let gone = format!("{family}{{site=\"eu\"");
            assert!(!out.contains(&gone), "{gone} outlived its WaveGate:\n{out}");
            let kept = format!("{family}{{site=\"us\"");
            assert!(
                out.contains(&kept),
                "{kept} went with another WaveGate:\n{out}"
            );
        }

        // This replica stops leading: every site's series go.
        objects.step_down();
        assert_eq!(m.follow(&objects), 1);
        let out = text();
        assert!(!out.contains("{site=\"us\""), "{out}");
    }

    #[test]
    fn a_wave_gate_moved_to_another_site_leaves_nothing_under_the_old_one() {
        let mut r = Registry::default();
        let m = register(&mut r);
        let status: WaveGateStatus = serde_json::from_value(serde_json::json!({
            "phase": "Soaking", "currentWaveIndex": 0,
            "waves": [{"name": "canary", "state": "Soaking"}],
        }))
        .unwrap();
        m.record(
            "fleet",
            "west",
            &spec("eu"),
            None,
            &status,
            Timestamp::UNIX_EPOCH,
        );
        m.record(
            "fleet",
            "east",
            &spec("us"),
            None,
            &status,
            Timestamp::UNIX_EPOCH,
        );
        m.record(
            "fleet",
            "west",
            &spec("eu-1"),
            Some(&status),
            &status,
            Timestamp::UNIX_EPOCH,
        );
        let mut out = String::new();
        encode(&mut out, &r).unwrap();
        assert!(!out.contains("site=\"eu\""), "{out}");
        for site in ["eu-1", "us"] {
            let want = format!("sluice_wavegate_current_wave{{site=\"{site}\"}} 0");
            assert!(out.contains(&want), "{want} missing:\n{out}");
        }
    }
}
