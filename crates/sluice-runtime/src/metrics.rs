//! The operator's Prometheus metrics: reconciles, reconcile durations, errors by bounded
//! category, whether this replica leads, and the platform's one per-object scheme
//! ([`ObjectSignals`]).
//!
//! Owns metric names, help texts and label sets. The fleet series never carry an object's name,
//! a message or anything else unbounded: `kind` and `category` come from fixed sets. The
//! per-object series (`sluice_object_*`) are the one exception, bounded by the number of objects:
//! one state series, one progress timestamp and at most one series per passed deadline per
//! object. They are read at scrape time from the objects the controller's store holds, so a
//! deleted object has none, and only while this replica leads (only the leader exports them);
//! nothing records or removes them one by one. Their labels are `kind`, `object_namespace` and
//! `object_name`, never a bare `namespace` or `name`, which a scrape's own target labels would
//! overwrite.
//!
//! An operator's fleet gauges over its own kind (e.g. `sluice_rollouts{phase}`, the age of the
//! oldest BundlePin in force) are read from the same store at the same moment
//! ([`ObjectSignals::fleet_by`]): the leader's figures are never those of its last reconcile, a
//! deleted object counts for nothing at the next scrape, and a replica that does not lead
//! exports them as over no object (every phase at 0).

use std::{
    any::Any,
    collections::BTreeSet,
    sync::{Arc, RwLock, atomic::AtomicU64},
    time::Duration,
};

use jiff::Timestamp;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::{Resource, runtime::reflector::Store};
use prometheus_client::{
    collector::Collector,
    encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric},
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

/// How an operator decides the signal of one object of its kind `K` at a scrape's time: `None`
/// when the object says nothing yet (no status written).
pub type SignalOf<K> = Arc<dyn Fn(&K, Timestamp) -> Option<ObjectSignal> + Send + Sync>;

/// One gauge family an operator reads over every object of its kind at a scrape's time
/// ([`ObjectSignals::fleet_by`]). Its labels come from fixed sets, as every fleet series'.
#[derive(Debug, Clone, PartialEq)]
pub struct FleetGauge {
    /// The family's name under the `sluice_` prefix, e.g. `rollouts`.
    pub name: &'static str,
    /// Its help text, without the final period.
    pub help: &'static str,
    /// Each series: its labels (name, bounded value) and its value.
    pub series: Vec<(Vec<(&'static str, String)>, f64)>,
}

impl FleetGauge {
    /// How many objects are in each of `phases`, from the phase of each object (`objects`):
    /// one series per phase labelled `phase`, 0 when no object is in it, so a dashboard's count
    /// reads 0 rather than "no data" before the first one. A phase outside `phases` gets its
    /// own series.
    pub fn count_by_phase<'a>(
        name: &'static str,
        help: &'static str,
        phases: &[&str],
        objects: impl IntoIterator<Item = &'a str>,
    ) -> Self {
        let mut counts: Vec<(String, f64)> =
            phases.iter().map(|p| ((*p).to_owned(), 0.0)).collect();
        for phase in objects {
            match counts.iter_mut().find(|(p, _)| p == phase) {
                Some((_, n)) => *n += 1.0,
                None => counts.push((phase.to_owned(), 1.0)),
            }
        }
        FleetGauge {
            name,
            help,
            series: counts
                .into_iter()
                .map(|(phase, n)| (vec![("phase", phase)], n))
                .collect(),
        }
    }

    /// One series without labels.
    pub fn single(name: &'static str, help: &'static str, value: f64) -> Self {
        FleetGauge {
            name,
            help,
            series: vec![(Vec::new(), value)],
        }
    }
}

/// How an operator reads its fleet gauges over all the objects of its kind `K` (`now`: the
/// scrape's time); a replica that does not lead reads them over no object.
pub type FleetOf<K> = Arc<dyn Fn(&[Arc<K>], Timestamp) -> Vec<FleetGauge> + Send + Sync>;

/// An operator's fleet gauges of its kind, as [`ObjectSignals::fleet_by`] was given them.
#[derive(Clone)]
struct Fleet {
    /// The [`FleetOf`] the kind, behind `Any` (the kind is known where the store is made).
    of: Arc<dyn Any + Send + Sync>,
    /// The same read over no object, for a replica that does not lead.
    over_none: Arc<dyn Fn(Timestamp) -> Vec<FleetGauge> + Send + Sync>,
}

/// The objects a scrape reads the per-object series from: the leader's store of the operator's
/// kind and the operator's signal for it.
trait LedObjects: Send + Sync {
    /// The kind's name (the `kind` label).
    fn kind(&self) -> &str;
    /// `(namespace, name)` of every object the store holds.
    fn names(&self) -> Vec<(String, String)>;
    /// Every object's signal at `now`, with its labels.
    fn signals(&self, now: Timestamp) -> Vec<(ObjectLabels, ObjectSignal)>;
    /// The operator's fleet gauges over every object at `now` (none when it reads none).
    fn fleet(&self, now: Timestamp) -> Vec<FleetGauge>;
}

struct Led<K: Resource<DynamicType = ()> + Clone + 'static> {
    kind: String,
    store: Store<K>,
    signal: SignalOf<K>,
    fleet: Option<FleetOf<K>>,
}

impl<K: Resource<DynamicType = ()> + Clone + Send + Sync + 'static> Led<K> {
    fn labels(&self, obj: &K) -> ObjectLabels {
        ObjectLabels {
            kind: self.kind.clone(),
            object_namespace: obj.meta().namespace.clone().unwrap_or_default(),
            object_name: obj.meta().name.clone().unwrap_or_default(),
        }
    }
}

impl<K: Resource<DynamicType = ()> + Clone + Send + Sync + 'static> LedObjects for Led<K> {
    fn kind(&self) -> &str {
        &self.kind
    }

    fn names(&self) -> Vec<(String, String)> {
        let mut out: Vec<(String, String)> = self
            .store
            .state()
            .iter()
            .map(|o| {
                let l = self.labels(o);
                (l.object_namespace, l.object_name)
            })
            .collect();
        out.sort();
        out
    }

    fn signals(&self, now: Timestamp) -> Vec<(ObjectLabels, ObjectSignal)> {
        self.store
            .state()
            .iter()
            .filter_map(|o| (self.signal)(o, now).map(|s| (self.labels(o), s)))
            .collect()
    }

    fn fleet(&self, now: Timestamp) -> Vec<FleetGauge> {
        self.fleet
            .as_ref()
            .map(|f| f(&self.store.state(), now))
            .unwrap_or_default()
    }
}

/// The platform's per-object series, shared by every operator: `sluice_object_state` (1 with
/// the object's phase and reason), `sluice_object_progressed_timestamp_seconds` and
/// `sluice_object_overdue` (1 per deadline passed). Read at each scrape from the controller's
/// store of the operator's own kind while this replica leads ([`ObjectSignals::lead`]), each
/// object's signal decided then ([`ObjectSignals::decided_by`]): a deleted object has no series
/// at the next scrape, a deadline is judged at the scrape's time, and a replica that does not
/// lead exports none. Cheap to clone; clones share the store.
#[derive(Clone)]
pub struct ObjectSignals {
    /// The scrape's time.
    clock: fn() -> Timestamp,
    /// The operator's [`SignalOf`] of its kind, behind `Any` (the kind is known where the store is
    /// made, not here).
    decide: Arc<RwLock<Option<Arc<dyn Any + Send + Sync>>>>,
    /// The operator's fleet gauges of its kind ([`ObjectSignals::fleet_by`]).
    fleet: Arc<RwLock<Option<Fleet>>>,
    /// What a scrape reads while this replica leads.
    led: Arc<RwLock<Option<Arc<dyn LedObjects>>>>,
}

impl Default for ObjectSignals {
    fn default() -> Self {
        Self {
            clock: Timestamp::now,
            decide: Arc::default(),
            fleet: Arc::default(),
            led: Arc::default(),
        }
    }
}

impl std::fmt::Debug for ObjectSignals {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let led = read(&self.led).as_ref().map(|l| l.kind().to_owned());
        f.debug_struct("ObjectSignals")
            .field("led", &led)
            .finish_non_exhaustive()
    }
}

fn read<T>(lock: &RwLock<T>) -> std::sync::RwLockReadGuard<'_, T> {
    lock.read().unwrap_or_else(|e| e.into_inner())
}

fn write<T>(lock: &RwLock<T>) -> std::sync::RwLockWriteGuard<'_, T> {
    lock.write().unwrap_or_else(|e| e.into_inner())
}

/// Name and help text of each per-object family (the registry adds the `sluice_` prefix).
const OBJECT_STATE: (&str, &str) = (
    "object_state",
    "1 per object with its phase and reason (kind, object_namespace, object_name); leader only",
);
const OBJECT_PROGRESSED: (&str, &str) = (
    "object_progressed_timestamp_seconds",
    "When the object last made progress (entered its step, phase or state), Unix seconds; leader only",
);
const OBJECT_OVERDUE: (&str, &str) = (
    "object_overdue",
    "1 per object and deadline it is past (e.g. HandBack); leader only",
);

impl ObjectSignals {
    /// Decides each object's signal of kind `K` with `signal` at every scrape (`now`: the
    /// scrape's time). The operator calls it once at start-up, for the kind its controller
    /// reconciles.
    pub fn decided_by<K>(
        &self,
        signal: impl Fn(&K, Timestamp) -> Option<ObjectSignal> + Send + Sync + 'static,
    ) where
        K: Resource<DynamicType = ()> + Clone + Send + Sync + 'static,
    {
        let signal: SignalOf<K> = Arc::new(signal);
        *write(&self.decide) = Some(Arc::new(signal));
    }

    /// Reads the operator's fleet gauges of kind `K` with `fleet` at every scrape: over every
    /// object the leader's store holds, over none on a replica that does not lead. The operator
    /// calls it once at start-up, beside [`ObjectSignals::decided_by`].
    pub fn fleet_by<K>(
        &self,
        fleet: impl Fn(&[Arc<K>], Timestamp) -> Vec<FleetGauge> + Send + Sync + 'static,
    ) where
        K: Resource<DynamicType = ()> + Clone + Send + Sync + 'static,
    {
        let fleet: FleetOf<K> = Arc::new(fleet);
        let over_none = {
            let fleet = fleet.clone();
            Arc::new(move |now| fleet(&[], now))
        };
        *write(&self.fleet) = Some(Fleet {
            of: Arc::new(fleet),
            over_none,
        });
    }

    /// This replica leads over the objects `store` holds: scrapes read their series from it
    /// until [`ObjectSignals::step_down`]. The controller loop calls it with its store each
    /// time it starts. An object has series only when the signal of `K`
    /// ([`ObjectSignals::decided_by`]) says something about it.
    pub fn lead<K>(&self, store: Store<K>)
    where
        K: Resource<DynamicType = ()> + Clone + Send + Sync + 'static,
    {
        let signal = read(&self.decide)
            .as_ref()
            .and_then(|d| d.downcast_ref::<SignalOf<K>>().cloned())
            .unwrap_or_else(|| Arc::new(|_: &K, _| None));
        let fleet = read(&self.fleet)
            .as_ref()
            .and_then(|f| f.of.downcast_ref::<FleetOf<K>>().cloned());
        *write(&self.led) = Some(Arc::new(Led {
            kind: K::kind(&()).into_owned(),
            store,
            signal,
            fleet,
        }));
    }

    /// This replica stopped leading: scrapes export no per-object series.
    pub fn step_down(&self) {
        *write(&self.led) = None;
    }

    /// Calls `follow` with these signals every `period` (the first time after one period): an
    /// operator's own series kept per object follow the leader's store with it, removed when
    /// their object is deleted and all of them once this replica stops leading, so a dashboard
    /// never shows a former leader's last figures beside the leader's.
    pub fn follow_every(
        &self,
        period: Duration,
        follow: impl Fn(&ObjectSignals) + Send + 'static,
    ) -> tokio::task::JoinHandle<()> {
        let objects = self.clone();
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(period).await;
                follow(&objects);
            }
        })
    }

    /// `(namespace, name)` of every object of `kind` the leader's store holds (none while this
    /// replica does not lead).
    pub fn objects_of(&self, kind: &str) -> Vec<(String, String)> {
        match read(&self.led).as_ref() {
            Some(led) if led.kind() == kind => led.names(),
            _ => Vec::new(),
        }
    }

    /// The three families as they read at `now`.
    fn families(
        &self,
        now: Timestamp,
    ) -> (
        Family<ObjectStateLabels, Gauge>,
        Family<ObjectLabels, Gauge>,
        Family<ObjectDeadlineLabels, Gauge>,
    ) {
        let state = Family::<ObjectStateLabels, Gauge>::default();
        let progressed = Family::<ObjectLabels, Gauge>::default();
        let overdue = Family::<ObjectDeadlineLabels, Gauge>::default();
        let led = read(&self.led).clone();
        for (key, signal) in led.map(|l| l.signals(now)).unwrap_or_default() {
            state.get_or_create(&state_labels(&key, &signal)).set(1);
            if let Some(at) = signal.progressed_at {
                progressed.get_or_create(&key).set(at);
            }
            for deadline in &signal.overdue {
                overdue
                    .get_or_create(&deadline_labels(&key, deadline))
                    .set(1);
            }
        }
        (state, progressed, overdue)
    }
}

/// Encodes `family` under `name` with `help` (ended with a period, as the registry does for
/// the metrics registered in it).
fn encode_gauges<L, G>(
    encoder: &mut DescriptorEncoder,
    (name, help): (&str, &str),
    family: &Family<L, G>,
) -> Result<(), std::fmt::Error>
where
    L: EncodeLabelSet + Clone + std::hash::Hash + Eq + std::fmt::Debug + Send + Sync + 'static,
    G: EncodeMetric + prometheus_client::metrics::TypedMetric,
{
    let metric =
        encoder.encode_descriptor(name, &format!("{help}."), None, family.metric_type())?;
    family.encode(metric)
}

impl ObjectSignals {
    /// The fleet gauges at `now`: over the leader's objects, or over none.
    fn fleet(&self, now: Timestamp) -> Vec<FleetGauge> {
        if let Some(led) = read(&self.led).clone() {
            return led.fleet(now);
        }
        let over_none = read(&self.fleet).as_ref().map(|f| f.over_none.clone());
        over_none.map(|f| f(now)).unwrap_or_default()
    }
}

impl Collector for ObjectSignals {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let now = (self.clock)();
        let (state, progressed, overdue) = self.families(now);
        encode_gauges(&mut encoder, OBJECT_STATE, &state)?;
        encode_gauges(&mut encoder, OBJECT_PROGRESSED, &progressed)?;
        encode_gauges(&mut encoder, OBJECT_OVERDUE, &overdue)?;
        for gauge in self.fleet(now) {
            let family = Family::<Vec<(&'static str, String)>, Gauge<f64, AtomicU64>>::default();
            for (labels, value) in gauge.series {
                family.get_or_create(&labels).set(value);
            }
            encode_gauges(&mut encoder, (gauge.name, gauge.help), &family)?;
        }
        Ok(())
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
        sub.register_collector(Box::new(m.objects.clone()));
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

    /// Sets the leader gauge; a replica that stops leading exports no per-object series.
    pub fn set_leader(&self, leader: bool) {
        self.leader.set(i64::from(leader));
        if !leader {
            self.objects.step_down();
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

    use k8s_openapi::api::core::v1::ConfigMap;
    use kube::runtime::{reflector, watcher};
    use std::sync::atomic::{AtomicI64, Ordering};

    /// An object whose data says its phase, reason, progress (`at`) and hand-back deadline.
    fn object(ns: &str, name: &str, fields: &[(&str, &str)]) -> ConfigMap {
        let mut cm = ConfigMap::default();
        cm.metadata.namespace = Some(ns.into());
        cm.metadata.name = Some(name.into());
        cm.data = Some(
            fields
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        );
        cm
    }

    /// The test kind's signal: none without a phase; `HandBack` once `now` passes `deadline`.
    fn decide(cm: &ConfigMap, now: Timestamp) -> Option<ObjectSignal> {
        let data = cm.data.as_ref()?;
        let field = |k: &str| data.get(k).cloned().unwrap_or_default();
        let deadline = data.get("deadline").and_then(|d| d.parse::<i64>().ok());
        Some(ObjectSignal {
            phase: data.get("phase")?.clone(),
            reason: field("reason"),
            progressed_at: data.get("at").and_then(|a| a.parse().ok()),
            overdue: deadline
                .filter(|d| now.as_second() >= *d)
                .map(|_| "HandBack".to_owned())
                .into_iter()
                .collect(),
        })
    }

    /// The scrapes' time in the tests, Unix seconds.
    static SCRAPE_AT: AtomicI64 = AtomicI64::new(1_000);

    fn scrape_at() -> Timestamp {
        Timestamp::from_second(SCRAPE_AT.load(Ordering::SeqCst)).unwrap()
    }

    /// A registry with the shared metrics, the per-object series decided by [`decide`] at
    /// [`scrape_at`], and a store writer for the leader's objects.
    fn leading() -> (Registry, Metrics, reflector::store::Writer<ConfigMap>) {
        leading_at(scrape_at)
    }

    /// [`leading`] with scrapes at `clock`'s time.
    fn leading_at(
        clock: fn() -> Timestamp,
    ) -> (Registry, Metrics, reflector::store::Writer<ConfigMap>) {
        let mut registry = Registry::default();
        let mut m = Metrics::register(&mut Registry::default());
        m.objects = ObjectSignals {
            clock,
            ..ObjectSignals::default()
        };
        registry
            .sub_registry_with_prefix("sluice")
            .register_collector(Box::new(m.objects.clone()));
        m.objects().decided_by(decide);
        let (store, writer) = reflector::store();
        m.set_leader(true);
        m.objects().lead(store);
        (registry, m, writer)
    }

    fn apply(writer: &mut reflector::store::Writer<ConfigMap>, cm: ConfigMap) {
        writer.apply_watcher_event(&watcher::Event::Apply(cm));
    }

    #[test]
    fn the_leaders_objects_have_one_state_series_each_read_from_its_store_at_scrape_time() {
        let (registry, m, mut w) = leading();
        apply(
            &mut w,
            object(
                "shop",
                "checkout",
                &[
                    ("phase", "Progressing"),
                    ("reason", "StepInProgress"),
                    ("at", "100"),
                ],
            ),
        );
        apply(
            &mut w,
            object(
                "shop",
                "cart",
                &[
                    ("phase", "Promoted"),
                    ("reason", "Promoted"),
                    ("at", "50"),
                    ("deadline", "10"),
                ],
            ),
        );
        apply(&mut w, object("shop", "undecided", &[]));
        let text = encode(&registry);
        let want = [
            r#"sluice_object_state{kind="ConfigMap",object_namespace="shop",object_name="checkout",phase="Progressing",reason="StepInProgress"} 1"#,
            r#"sluice_object_progressed_timestamp_seconds{kind="ConfigMap",object_namespace="shop",object_name="checkout"} 100"#,
            r#"sluice_object_overdue{kind="ConfigMap",object_namespace="shop",object_name="cart",deadline="HandBack"} 1"#,
            "# HELP sluice_object_state 1 per object with its phase and reason (kind, object_namespace, object_name); leader only.",
            "# TYPE sluice_object_progressed_timestamp_seconds gauge",
        ];
        for w in want {
            assert!(text.contains(w), "missing {w} in\n{text}");
        }
        assert_eq!(text.matches("sluice_object_state{").count(), 2, "{text}");
        assert!(
            !text.contains("undecided"),
            "an object without a signal has series:\n{text}"
        );

        // The object changed in the store: its old state is gone, with no call to say so.
        apply(
            &mut w,
            object(
                "shop",
                "checkout",
                &[
                    ("phase", "Aborted"),
                    ("reason", "GateFailed"),
                    ("at", "160"),
                ],
            ),
        );
        let text = encode(&registry);
        assert!(
            text.contains(r#"object_name="checkout",phase="Aborted",reason="GateFailed"} 1"#),
            "{text}"
        );
        assert!(
            !text.contains("Progressing"),
            "the old state stays:\n{text}"
        );

        // Deleted: the store no longer holds it, and the next scrape has none of its series.
        w.apply_watcher_event(&watcher::Event::Delete(object("shop", "checkout", &[])));
        let text = encode(&registry);
        assert!(
            !text.contains("checkout"),
            "a deleted object keeps series:\n{text}"
        );
        assert!(text.contains(r#"object_name="cart""#), "{text}");

        // Only the leader exports them, though the store still holds its objects.
        m.set_leader(false);
        let text = encode(&registry);
        assert!(
            !text.contains("cart"),
            "a replica that stopped leading exports:\n{text}"
        );
        assert!(!text.contains("sluice_object_state{"), "{text}");
    }

    #[test]
    fn a_replica_that_never_led_or_has_no_signal_for_the_kind_exports_no_object() {
        let (store, mut w) = reflector::store::<ConfigMap>();
        apply(&mut w, object("shop", "cart", &[("phase", "Promoted")]));

        let mut registry = Registry::default();
        let m = Metrics::register(&mut registry);
        m.objects().decided_by(decide);
        assert!(!encode(&registry).contains("cart"), "{}", encode(&registry));
        assert!(m.objects().objects_of("ConfigMap").is_empty());

        // Led over a kind it decides no signal for (a signal of another kind).
        let mut registry = Registry::default();
        let m = Metrics::register(&mut registry);
        m.objects()
            .decided_by(|_: &k8s_openapi::api::core::v1::Secret, _| Some(ObjectSignal::default()));
        m.objects().lead(store.clone());
        assert!(!encode(&registry).contains("cart"), "{}", encode(&registry));

        // The same store, its kind decided: exported.
        m.objects().decided_by(decide);
        m.objects().lead(store);
        assert!(encode(&registry).contains(r#"object_name="cart""#));
    }

    #[test]
    fn a_deadline_is_overdue_from_the_first_scrape_after_it() {
        let (registry, _m, mut w) = leading();
        SCRAPE_AT.store(1_000, Ordering::SeqCst);
        apply(
            &mut w,
            object(
                "shop",
                "cart",
                &[("phase", "Promoted"), ("deadline", "1060")],
            ),
        );
        let overdue = r#"sluice_object_overdue{kind="ConfigMap",object_namespace="shop",object_name="cart",deadline="HandBack"} 1"#;
        assert!(
            !encode(&registry).contains(overdue),
            "{}",
            encode(&registry)
        );
        SCRAPE_AT.store(1_059, Ordering::SeqCst);
        assert!(!encode(&registry).contains(overdue));
        // No reconcile, no store change: the scrape's own time passed the deadline.
        SCRAPE_AT.store(1_060, Ordering::SeqCst);
        assert!(encode(&registry).contains(overdue), "{}", encode(&registry));
    }

    /// The test kind's fleet: its objects by phase (those without one as `Pending`) and the
    /// age at `now` of the oldest one `Pinned` (its `since`), 0 when none.
    fn fleet(objects: &[Arc<ConfigMap>], now: Timestamp) -> Vec<FleetGauge> {
        let field = |cm: &ConfigMap, k: &str| cm.data.as_ref().and_then(|d| d.get(k).cloned());
        let phases: Vec<String> = objects
            .iter()
            .map(|cm| field(cm, "phase").unwrap_or_else(|| "Pending".into()))
            .collect();
        let oldest = objects
            .iter()
            .filter(|cm| field(cm, "phase").as_deref() == Some("Pinned"))
            .filter_map(|cm| field(cm, "since")?.parse::<i64>().ok())
            .min()
            .map_or(0, |since| now.as_second() - since);
        vec![
            FleetGauge::count_by_phase(
                "things",
                "Things by phase",
                &["Pending", "Pinned", "Released"],
                phases.iter().map(String::as_str),
            ),
            FleetGauge::single(
                "oldest_pinned_seconds",
                "Oldest pinned thing",
                oldest as f64,
            ),
        ]
    }

    #[test]
    fn fleet_gauges_are_read_over_the_leaders_objects_at_scrape_time_and_over_none_elsewhere() {
        static FLEET_AT: AtomicI64 = AtomicI64::new(5_000);
        let (registry, m, _before) =
            leading_at(|| Timestamp::from_second(FLEET_AT.load(Ordering::SeqCst)).unwrap());
        // Led before the fleet was given: the next lead (the controller's next start) reads it.
        m.objects().fleet_by(fleet);
        let (store, mut w) = reflector::store();
        m.objects().lead(store);
        apply(
            &mut w,
            object("ops", "a", &[("phase", "Pinned"), ("since", "1000")]),
        );
        apply(
            &mut w,
            object("ops", "b", &[("phase", "Pinned"), ("since", "4000")]),
        );
        apply(&mut w, object("ops", "c", &[]));
        apply(&mut w, object("ops", "d", &[("phase", "Refused")]));
        let text = encode(&registry);
        let want = [
            "# HELP sluice_things Things by phase.",
            "# TYPE sluice_things gauge",
            r#"sluice_things{phase="Pinned"} 2.0"#,
            r#"sluice_things{phase="Pending"} 1.0"#,
            r#"sluice_things{phase="Released"} 0.0"#,
            r#"sluice_things{phase="Refused"} 1.0"#,
            "sluice_oldest_pinned_seconds 4000.0",
        ];
        for line in want {
            assert!(text.contains(line), "missing {line} in\n{text}");
        }

        // No reconcile: the scrape's time ages the oldest, a deletion leaves its count at once.
        FLEET_AT.store(5_060, Ordering::SeqCst);
        w.apply_watcher_event(&watcher::Event::Delete(object("ops", "d", &[])));
        let text = encode(&registry);
        assert!(
            text.contains("sluice_oldest_pinned_seconds 4060.0"),
            "{text}"
        );
        assert!(
            !text.contains("Refused"),
            "a deleted object still counts:\n{text}"
        );
        w.apply_watcher_event(&watcher::Event::Delete(object("ops", "a", &[])));
        assert!(encode(&registry).contains("sluice_oldest_pinned_seconds 1060.0"));

        // A replica that stopped leading reads them over no object: every phase at 0.
        m.set_leader(false);
        let text = encode(&registry);
        for line in [
            r#"sluice_things{phase="Pinned"} 0.0"#,
            r#"sluice_things{phase="Pending"} 0.0"#,
            "sluice_oldest_pinned_seconds 0.0",
        ] {
            assert!(text.contains(line), "missing {line} in\n{text}");
        }
    }

    #[test]
    fn the_objects_of_a_kind_are_those_its_leaders_store_holds() {
        let (_registry, m, mut w) = leading();
        apply(&mut w, object("fleet", "west", &[("phase", "Soaking")]));
        apply(&mut w, object("fleet", "east", &[]));
        let o = m.objects();
        assert_eq!(
            o.objects_of("ConfigMap"),
            vec![
                ("fleet".into(), "east".into()),
                ("fleet".into(), "west".into())
            ]
        );
        assert!(
            o.objects_of("WaveGate").is_empty(),
            "another kind's objects"
        );
        w.apply_watcher_event(&watcher::Event::Delete(object("fleet", "east", &[])));
        assert_eq!(
            o.objects_of("ConfigMap"),
            vec![("fleet".into(), "west".into())]
        );
        m.set_leader(false);
        assert!(
            o.objects_of("ConfigMap").is_empty(),
            "a replica that stopped leading"
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
