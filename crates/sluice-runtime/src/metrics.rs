//! The operator's Prometheus metrics: reconciles, reconcile durations, errors by bounded
//! category, whether this replica leads, and the platform's one per-object scheme
//! ([`ObjectSignals`]).
//!
//! Owns metric names, help texts and label sets. The fleet series never carry an object's name,
//! a message or anything else unbounded: `kind` and `category` come from fixed sets. The
//! per-object series (`sluice_object_*`) are the one exception, bounded by the number of objects:
//! one state series, one progress timestamp and at most one series per passed deadline per
//! object, removed when the object is deleted and all dropped when this replica stops leading
//! (only the leader exports them). Their labels are `kind`, `object_namespace` and `object_name`,
//! never a bare `namespace` or `name`, which a scrape's own target labels would overwrite.

use std::{
    collections::{BTreeSet, HashMap},
    sync::{Arc, Mutex},
    time::Duration,
};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
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

use crate::{changes::Change, error::Category};

/// Labels of reconcile series: the kind reconciled.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct KindLabels {
    /// The reconciled kind, e.g. `Rollout`.
    pub kind: String,
}

/// Labels of the watch-change series.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct ChangeLabels {
    /// The watched kind, e.g. `Rollout`.
    pub kind: String,
    /// What the event changed ([`Change::label`]).
    pub change: &'static str,
    /// `true` when the event started a reconcile.
    pub reconciled: &'static str,
}

/// Labels of the error series.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct ErrorLabels {
    /// The reconciled kind.
    pub kind: String,
    /// The bounded error category ([`Category::label`]).
    pub category: String,
}

/// Labels naming one object.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct ObjectLabels {
    /// The object's kind, e.g. `Rollout`.
    pub kind: String,
    /// The object's namespace (empty for a cluster-scoped kind).
    pub object_namespace: String,
    /// The object's name.
    pub object_name: String,
}

/// Labels of an object's state series.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct ObjectStateLabels {
    /// The object's kind.
    pub kind: String,
    /// The object's namespace.
    pub object_namespace: String,
    /// The object's name.
    pub object_name: String,
    /// The phase in its status (a fixed set per kind).
    pub phase: String,
    /// Why it is in that phase: a CamelCase reason from a fixed set (e.g. the abort reason), or
    /// empty.
    pub reason: String,
}

/// Labels of an object's overdue series.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct ObjectDeadlineLabels {
    /// The object's kind.
    pub kind: String,
    /// The object's namespace.
    pub object_namespace: String,
    /// The object's name.
    pub object_name: String,
    /// The deadline it is past, from a fixed set per kind (e.g. `HandBack`).
    pub deadline: String,
}

/// What an operator says about one object, decided from its status (pure, per kind).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ObjectSignal {
    /// The phase in the object's status.
    pub phase: String,
    /// Why it is in that phase (bounded CamelCase), or empty.
    pub reason: String,
    /// When the object last made progress (entered its step, phase or state), Unix seconds.
    pub progressed_at: Option<i64>,
    /// The deadlines it is past (bounded names).
    pub overdue: BTreeSet<String>,
}

impl ObjectSignal {
    /// The signal of a kind whose status is a phase and Kubernetes conditions: `reason` when
    /// given (e.g. a halt's reason), else the reason of a `Ready` condition that is `False`,
    /// else the `Progressing` condition's reason, else empty; progress is the latest condition
    /// transition (the object last changed state then). Condition reasons are CamelCase words
    /// from each kind's fixed set.
    pub fn from_conditions(phase: &str, conditions: &[Condition], reason: Option<String>) -> Self {
        let find = |t: &str| conditions.iter().find(|c| c.type_ == t);
        let reason = reason
            .or_else(|| {
                find("Ready")
                    .filter(|c| c.status == "False")
                    .map(|c| c.reason.clone())
            })
            .or_else(|| find("Progressing").map(|c| c.reason.clone()))
            .unwrap_or_default();
        let progressed_at = conditions
            .iter()
            .map(|c| c.last_transition_time.0.as_second())
            .max();
        ObjectSignal {
            phase: phase.to_owned(),
            reason,
            progressed_at,
            overdue: BTreeSet::new(),
        }
    }

    /// The signal with its progress moved to the latest of its own and `moments`, the times
    /// the status records besides its conditions (a wave's start, a halt, a completion); a
    /// moment not yet reached (`None`) counts for nothing.
    pub fn progressed_by<'a>(
        mut self,
        moments: impl IntoIterator<Item = Option<&'a Time>>,
    ) -> Self {
        let moments = moments.into_iter().flatten().map(|t| t.0.as_second());
        self.progressed_at = self.progressed_at.into_iter().chain(moments).max();
        self
    }
}

/// The platform's per-object series, shared by every operator: `sluice_object_state` (1 with
/// the object's phase and reason), `sluice_object_progressed_timestamp_seconds` and
/// `sluice_object_overdue` (1 per deadline passed). Cheap to clone; clones share the series.
#[derive(Debug, Clone, Default)]
pub struct ObjectSignals {
    state: Family<ObjectStateLabels, Gauge>,
    progressed: Family<ObjectLabels, Gauge>,
    overdue: Family<ObjectDeadlineLabels, Gauge>,
    current: Arc<Mutex<HashMap<ObjectLabels, ObjectSignal>>>,
}

impl ObjectSignals {
    fn register(&self, sub: &mut Registry) {
        sub.register(
            "object_state",
            "1 per object with its phase and reason (kind, object_namespace, object_name); leader only",
            self.state.clone(),
        );
        sub.register(
            "object_progressed_timestamp_seconds",
            "When the object last made progress (entered its step, phase or state), Unix seconds; leader only",
            self.progressed.clone(),
        );
        sub.register(
            "object_overdue",
            "1 per object and deadline it is past (e.g. HandBack); leader only",
            self.overdue.clone(),
        );
    }

    /// Records `signal` for the object, replacing the series of its previous signal.
    pub fn set(&self, kind: &str, namespace: &str, name: &str, signal: ObjectSignal) {
        let key = ObjectLabels {
            kind: kind.to_owned(),
            object_namespace: namespace.to_owned(),
            object_name: name.to_owned(),
        };
        let mut current = self.current.lock().unwrap_or_else(|e| e.into_inner());
        if current.get(&key) == Some(&signal) {
            return;
        }
        if let Some(before) = current.remove(&key) {
            self.drop_series(&key, &before);
        }
        self.state
            .get_or_create(&state_labels(&key, &signal))
            .set(1);
        if let Some(at) = signal.progressed_at {
            self.progressed.get_or_create(&key).set(at);
        }
        for deadline in &signal.overdue {
            self.overdue
                .get_or_create(&deadline_labels(&key, deadline))
                .set(1);
        }
        current.insert(key, signal);
    }

    /// Removes every series of the object (it was deleted).
    pub fn remove(&self, kind: &str, namespace: &str, name: &str) {
        let key = ObjectLabels {
            kind: kind.to_owned(),
            object_namespace: namespace.to_owned(),
            object_name: name.to_owned(),
        };
        let mut current = self.current.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(before) = current.remove(&key) {
            self.drop_series(&key, &before);
        }
    }

    /// Removes every object's series (this replica stopped leading).
    pub fn clear(&self) {
        let mut current = self.current.lock().unwrap_or_else(|e| e.into_inner());
        current.clear();
        self.state.clear();
        self.progressed.clear();
        self.overdue.clear();
    }

    /// `(namespace, name)` of every object of `kind` that has series.
    pub fn objects_of(&self, kind: &str) -> Vec<(String, String)> {
        let current = self.current.lock().unwrap_or_else(|e| e.into_inner());
        let mut out: Vec<(String, String)> = current
            .keys()
            .filter(|k| k.kind == kind)
            .map(|k| (k.object_namespace.clone(), k.object_name.clone()))
            .collect();
        out.sort();
        out
    }

    /// Removes the series of every object of `kind` for which `exists(namespace, name)` says
    /// no (the controller's cache no longer holds it: deleted, with or without a finalizer).
    /// Returns how many objects were removed.
    pub fn sweep(&self, kind: &str, exists: impl Fn(&str, &str) -> bool) -> usize {
        let gone: Vec<(String, String)> = self
            .objects_of(kind)
            .into_iter()
            .filter(|(ns, name)| !exists(ns, name))
            .collect();
        for (ns, name) in &gone {
            self.remove(kind, ns, name);
        }
        gone.len()
    }

    /// How many objects have series.
    pub fn len(&self) -> usize {
        self.current.lock().unwrap_or_else(|e| e.into_inner()).len()
    }

    /// Whether no object has series.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn drop_series(&self, key: &ObjectLabels, before: &ObjectSignal) {
        self.state.remove(&state_labels(key, before));
        self.progressed.remove(key);
        for deadline in &before.overdue {
            self.overdue.remove(&deadline_labels(key, deadline));
        }
    }
}

fn state_labels(key: &ObjectLabels, signal: &ObjectSignal) -> ObjectStateLabels {
    ObjectStateLabels {
        kind: key.kind.clone(),
        object_namespace: key.object_namespace.clone(),
        object_name: key.object_name.clone(),
        phase: signal.phase.clone(),
        reason: signal.reason.clone(),
    }
}

fn deadline_labels(key: &ObjectLabels, deadline: &str) -> ObjectDeadlineLabels {
    ObjectDeadlineLabels {
        kind: key.kind.clone(),
        object_namespace: key.object_namespace.clone(),
        object_name: key.object_name.clone(),
        deadline: deadline.to_owned(),
    }
}

/// Handles to the shared metrics; cheap to clone.
#[derive(Debug, Clone)]
pub struct Metrics {
    reconciles: Family<KindLabels, Counter>,
    changes: Family<ChangeLabels, Counter>,
    durations: Family<KindLabels, Histogram>,
    errors: Family<ErrorLabels, Counter>,
    leader: Gauge,
    objects: ObjectSignals,
}

fn duration_histogram() -> Histogram {
    // 1 ms .. ~33 s: a reconcile is API round trips, a slow one waits on a metrics query.
    Histogram::new(exponential_buckets(0.001, 2.0, 16))
}

impl Metrics {
    /// Registers the metrics under the `sluice_` prefix in `registry`.
    pub fn register(registry: &mut Registry) -> Self {
        let m = Self {
            reconciles: Family::default(),
            changes: Family::default(),
            durations: Family::new_with_constructor(duration_histogram as fn() -> Histogram),
            errors: Family::default(),
            leader: Gauge::default(),
            objects: ObjectSignals::default(),
        };
        let sub = registry.sub_registry_with_prefix("sluice");
        m.objects.register(sub);
        sub.register(
            "reconciles",
            "Reconciles run, by kind",
            m.reconciles.clone(),
        );
        sub.register(
            "watch_changes",
            "Events of an operator's watch on its own kind, by what they changed (listed, control: \
             spec, labels, annotations, finalizers or deletion; status_only) and whether they \
             started a reconcile",
            m.changes.clone(),
        );
        sub.register(
            "reconcile_duration_seconds",
            "Duration of one reconcile in seconds, by kind",
            m.durations.clone(),
        );
        sub.register(
            "reconcile_errors",
            "Reconciles that failed, by kind and bounded error category",
            m.errors.clone(),
        );
        sub.register(
            "leader",
            "1 while this replica holds the leader-election Lease and reconciles, else 0",
            m.leader.clone(),
        );
        m
    }

    /// Records one reconcile of `kind` that took `took` and failed with `error` if any.
    pub fn observe(&self, kind: &str, took: Duration, error: Option<Category>) {
        let labels = KindLabels {
            kind: kind.to_owned(),
        };
        self.reconciles.get_or_create(&labels).inc();
        self.durations
            .get_or_create(&labels)
            .observe(took.as_secs_f64());
        if let Some(category) = error {
            self.errors
                .get_or_create(&ErrorLabels {
                    kind: kind.to_owned(),
                    category: category.label().to_owned(),
                })
                .inc();
        }
    }

    /// Records one event of the watch on `kind` itself: what it changed and whether it started
    /// a reconcile.
    pub fn watch_change(&self, kind: &str, change: Change, reconciled: bool) {
        self.changes
            .get_or_create(&ChangeLabels {
                kind: kind.to_owned(),
                change: change.label(),
                reconciled: if reconciled { "true" } else { "false" },
            })
            .inc();
    }

    /// Sets the leader gauge; a replica that stops leading drops every per-object series.
    pub fn set_leader(&self, leader: bool) {
        self.leader.set(i64::from(leader));
        if !leader {
            self.objects.clear();
        }
    }

    /// The per-object series (shared by clones).
    pub fn objects(&self) -> ObjectSignals {
        self.objects.clone()
    }
}

/// Encodes `registry` in the OpenMetrics text format.
pub fn encode(registry: &Registry) -> String {
    let mut out = String::new();
    // Writing into a String cannot fail.
    let _ = prometheus_client::encoding::text::encode(&mut out, registry);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn progress_is_the_latest_of_the_conditions_and_the_moments_reached() {
        let at = |secs| Time(jiff::Timestamp::from_second(secs).unwrap());
        let signal = ObjectSignal {
            progressed_at: Some(100),
            ..ObjectSignal::default()
        };
        let moments = [Some(&at(50)), None, Some(&at(300)), Some(&at(200))];
        assert_eq!(
            signal.clone().progressed_by(moments).progressed_at,
            Some(300)
        );
        assert_eq!(
            signal.clone().progressed_by([None]).progressed_at,
            Some(100)
        );
        let none = ObjectSignal::default().progressed_by([Some(&at(7))]);
        assert_eq!(none.progressed_at, Some(7));
    }

    #[test]
    fn observations_show_up_with_bounded_labels() {
        let mut registry = Registry::default();
        let m = Metrics::register(&mut registry);
        m.observe("Rollout", Duration::from_millis(3), None);
        m.observe(
            "Rollout",
            Duration::from_millis(5),
            Some(Category::Conflict),
        );
        m.set_leader(true);
        let text = encode(&registry);
        let table = [
            "sluice_reconciles_total{kind=\"Rollout\"} 2",
            "sluice_reconcile_errors_total{kind=\"Rollout\",category=\"conflict\"} 1",
            "sluice_reconcile_duration_seconds_count{kind=\"Rollout\"} 2",
            "sluice_leader 1",
            "# EOF",
        ];
        for want in table {
            assert!(text.contains(want), "missing {want:?} in\n{text}");
        }
        m.set_leader(false);
        assert!(encode(&registry).contains("sluice_leader 0"));
    }

    fn signal(phase: &str, reason: &str, at: i64, overdue: &[&str]) -> ObjectSignal {
        ObjectSignal {
            phase: phase.into(),
            reason: reason.into(),
            progressed_at: Some(at),
            overdue: overdue.iter().map(|s| s.to_string()).collect(),
        }
    }

    #[test]
    fn one_state_series_per_object_replaced_on_change_and_removed_on_delete() {
        let mut registry = Registry::default();
        let m = Metrics::register(&mut registry);
        m.set_leader(true);
        let o = m.objects();
        o.set(
            "Rollout",
            "shop",
            "checkout",
            signal("Progressing", "StepInProgress", 100, &[]),
        );
        o.set(
            "Rollout",
            "shop",
            "cart",
            signal("Promoted", "Promoted", 50, &["HandBack"]),
        );
        o.set(
            "Rollout",
            "shop",
            "checkout",
            signal("Aborted", "GateFailed", 160, &[]),
        );
        let text = encode(&registry);
        let want = [
            r#"sluice_object_state{kind="Rollout",object_namespace="shop",object_name="checkout",phase="Aborted",reason="GateFailed"} 1"#,
            r#"sluice_object_progressed_timestamp_seconds{kind="Rollout",object_namespace="shop",object_name="checkout"} 160"#,
            r#"sluice_object_overdue{kind="Rollout",object_namespace="shop",object_name="cart",deadline="HandBack"} 1"#,
        ];
        for w in want {
            assert!(text.contains(w), "missing {w} in\n{text}");
        }
        assert!(
            !text.contains("Progressing"),
            "the old state stays:\n{text}"
        );
        assert_eq!(text.matches("sluice_object_state{").count(), 2, "{text}");

        o.set(
            "Rollout",
            "shop",
            "cart",
            signal("Promoted", "Promoted", 50, &[]),
        );
        o.remove("Rollout", "shop", "checkout");
        let text = encode(&registry);
        assert!(
            !text.contains("checkout"),
            "a deleted object keeps series:\n{text}"
        );
        assert!(!text.contains("sluice_object_overdue{"), "{text}");
        assert_eq!(o.len(), 1);

        // Only the leader exports them.
        m.set_leader(false);
        let text = encode(&registry);
        assert!(
            !text.contains("cart"),
            "a replica that stopped leading exports:\n{text}"
        );
        assert!(o.is_empty());
    }

    #[test]
    fn objects_the_cache_no_longer_holds_are_swept_per_kind() {
        let mut registry = Registry::default();
        let m = Metrics::register(&mut registry);
        let o = m.objects();
        o.set(
            "WaveGate",
            "fleet",
            "east",
            signal("Halted", "GateFailed", 1, &[]),
        );
        o.set(
            "WaveGate",
            "fleet",
            "west",
            signal("Soaking", "Soaking", 2, &[]),
        );
        o.set(
            "BundlePin",
            "fleet",
            "east",
            signal("Pinned", "Pinned", 3, &[]),
        );
        let removed = o.sweep("WaveGate", |ns, name| ns == "fleet" && name == "west");
        assert_eq!(removed, 1);
        assert_eq!(
            o.objects_of("WaveGate"),
            vec![("fleet".into(), "west".into())]
        );
        let text = encode(&registry);
        assert!(
            !text.contains(r#"kind="WaveGate",object_namespace="fleet",object_name="east""#),
            "a deleted WaveGate keeps series:\n{text}"
        );
        assert!(
            text.contains(r#"kind="BundlePin",object_namespace="fleet",object_name="east""#),
            "another kind's object of the same name was swept:\n{text}"
        );
    }

    #[test]
    fn a_signal_from_conditions_prefers_the_given_reason_then_not_ready_then_progressing() {
        use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
        let cond = |t: &str, status: &str, reason: &str, at: i64| Condition {
            type_: t.into(),
            status: status.into(),
            reason: reason.into(),
            message: "m".into(),
            last_transition_time: Time(jiff::Timestamp::from_second(at).unwrap()),
            observed_generation: None,
        };
        let conditions = [
            cond("Ready", "True", "Valid", 100),
            cond("Progressing", "True", "Soaking", 300),
        ];
        let s = ObjectSignal::from_conditions("Soaking", &conditions, None);
        assert_eq!(
            (s.phase.as_str(), s.reason.as_str(), s.progressed_at),
            ("Soaking", "Soaking", Some(300))
        );
        let s = ObjectSignal::from_conditions("Halted", &conditions, Some("GateFailed".into()));
        assert_eq!(s.reason, "GateFailed");
        let refused = [cond("Ready", "False", "InvalidSpec", 50)];
        let s = ObjectSignal::from_conditions("Refused", &refused, None);
        assert_eq!(
            (s.reason.as_str(), s.progressed_at),
            ("InvalidSpec", Some(50))
        );
        let s = ObjectSignal::from_conditions("Pending", &[], None);
        assert_eq!((s.reason.as_str(), s.progressed_at), ("", None));
    }
}
