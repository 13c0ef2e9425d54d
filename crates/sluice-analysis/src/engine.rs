//! The tick: plans one grouped query per (template, window, shared variables) across every
//! active gate instance, runs those queries, splits each answer back per object, and decides.
//!
//! Owns batching and policy. Queries per tick depend on the distinct templates and windows in
//! use, never on how many objects use them: the objects' label values are unioned into one
//! escaped `=~` matcher per key label and the answer, grouped `by` those labels, is split back
//! by them. It refuses free-form PromQL on namespaced objects unless the platform enabled it
//! (`EngineOptions::allow_inline_promql_in_namespaced`), because that query would run with the
//! operator's view of every team's metrics. It never writes status: it returns verdicts.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::channel::oneshot;
use futures::future::{FutureExt, Shared};

use jiff::Timestamp;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use sluice_api::v1alpha1::gate::KNOWN_VARIABLES;
use sluice_api::v1alpha1::{
    BaselineSource, BuiltinGate, CapturedBaseline, ComparisonOp, GateQuery, GateVerdict,
    ResolvedGate, VerdictReason,
};

use crate::builtin::{self, PART_LABEL, Parts, Reading, ServiceScope, VALUE_PART};
use crate::decide::{
    self, BaselineReading, DistributionTest, Observation, OwnerContext, RateScope, SequentialKind,
};
use crate::mann_whitney::{Worse, mann_whitney_u};
use crate::sequential::{self as seq, IntervalCounts};
use crate::source::{MetricsSource, RangeValues, SeriesValue, SourceError};
use crate::template::{Template, TemplateError};

/// Variables of one binding (label values by variable name).
pub type Vars = BTreeMap<String, String>;

/// Platform settings of the engine.
#[derive(Clone, Debug, PartialEq)]
pub struct EngineOptions {
    /// Allow inline `promql` (not from a GateTemplate) on namespaced objects. Default false:
    /// such a query would run with the operator's view of every team's metrics.
    pub allow_inline_promql_in_namespaced: bool,
    /// The label scoping a series to one cluster (Thanos external label). Default `cluster`.
    pub cluster_label: String,
    /// Relative tolerance of share checks whose gate sets none. Default 0.2 (±20%).
    pub share_tolerance: f64,
    /// Optional Mann–Whitney comparison of canary and stable per-interval samples for relative
    /// gates against `StableNow`. Default off (`None`).
    pub mann_whitney: Option<MannWhitneyOptions>,
    /// How far back a sequential test reaches (checks with a [`SequentialScope`]): counts older
    /// than this are dropped, which bounds the range query and how long a healthy history can
    /// weigh against a later fault. Default 1h.
    pub sequential_lookback: Duration,
}

impl Default for EngineOptions {
    fn default() -> Self {
        Self {
            allow_inline_promql_in_namespaced: false,
            cluster_label: "cluster".into(),
            share_tolerance: 0.2,
            mann_whitney: None,
            sequential_lookback: Duration::from_secs(3600),
        }
    }
}

/// Settings of the optional Mann–Whitney comparison. Each tick it adds one range query per
/// group of relative gates (still independent of the number of objects).
#[derive(Clone, Debug, PartialEq)]
pub struct MannWhitneyOptions {
    /// How far back the per-interval samples reach. Default 10m.
    pub lookback: Duration,
    /// Length of one interval (the query's window and the range step, so intervals do not
    /// overlap). Default 1m.
    pub interval: Duration,
    /// Significance level. Default 0.05.
    pub alpha: f64,
    /// Fewest intervals per side for a test; fewer and the test is skipped. Default 5.
    pub min_intervals: usize,
}

impl Default for MannWhitneyOptions {
    fn default() -> Self {
        Self {
            lookback: Duration::from_secs(600),
            interval: Duration::from_secs(60),
            alpha: 0.05,
            min_intervals: 5,
        }
    }
}

/// A gate instance of one owner object, as the operator hands it to the engine each tick.
#[derive(Clone, Debug, PartialEq)]
pub struct GateCheck {
    /// The owner, for messages and logs (e.g. `Rollout shop/checkout`).
    pub owner: String,
    /// Whether the owner is a namespaced object (free-form PromQL policy).
    pub owner_namespaced: bool,
    /// The gate, resolved against its template.
    pub gate: ResolvedGate,
    /// Variables shared by every binding: cluster, namespace, canaryService, stableService, ...
    pub vars: Vars,
    /// Overrides per subject binding. Empty: one binding with `service = canaryService` and
    /// `version = canaryVersion` when those are set.
    pub subject: Vec<Vars>,
    /// Overrides per baseline binding (relative to stable; the rest of the route for a share).
    /// Empty: one binding with `service = stableService`, `version = stableVersion` when set.
    pub baseline: Vec<Vars>,
    /// Target share (0..1) for share checks.
    pub share_target: Option<f64>,
    /// Baseline captured before the change, for `PreChangeWindow` comparisons.
    pub captured_baseline: Option<CapturedBaseline>,
    /// The verdict in the owner's status from the previous evaluation.
    pub previous: Option<GateVerdict>,
    /// For the built-in canary gates (see [`decide::sequential_kind`]): judge them by the
    /// sequential test on the counts accumulated since `since`. `None`: the threshold rule on the
    /// gate's window.
    pub sequential: Option<SequentialScope>,
    /// How the built-in service gates read Istio's request metrics: the reporter (the
    /// destination's, keyed on `canaryWorkload` / `stableWorkload`, for a mirror step's canary)
    /// and the clients counted. Default: the source reporter, every client.
    pub scope: ServiceScope,
}

/// Where a sequential test accumulates its counts: from the aligned intervals (each `interval`
/// long, on the grid of multiples of `interval` since the Unix epoch) that end after `since`
/// (for the share: that lie entirely after it), up to the last one ended at the tick.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SequentialScope {
    /// Start of the accumulation: the step's start.
    pub since: Timestamp,
    /// The aligned interval: the owner's analysis interval.
    pub interval: Duration,
    /// The test's false-abort rate (see [`crate::sequential::per_test_alpha`]).
    pub alpha: f64,
}

impl GateCheck {
    /// A check with shared variables only (roles derived from them).
    pub fn new(owner: impl Into<String>, gate: ResolvedGate, vars: Vars) -> Self {
        Self {
            owner: owner.into(),
            owner_namespaced: true,
            gate,
            vars,
            subject: Vec::new(),
            baseline: Vec::new(),
            share_target: None,
            captured_baseline: None,
            previous: None,
            sequential: None,
            scope: ServiceScope::default(),
        }
    }
}

/// Why a check could not be planned: a configuration problem of the gate or its owner.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error, strum::IntoStaticStr)]
pub enum CheckError {
    /// The template does not parse or a variable is missing.
    #[error("gate {gate:?} of {owner}: {source}")]
    Template {
        /// The owner.
        owner: String,
        /// The gate.
        gate: String,
        /// The template problem.
        source: TemplateError,
    },
    /// Inline PromQL on a namespaced object while the platform does not allow it.
    #[error(
        "gate {gate:?} of {owner} uses inline promql, which is disabled for namespaced objects; reference a \
         GateTemplate (templateRef) or use a builtin gate"
    )]
    InlinePromqlRefused {
        /// The owner.
        owner: String,
        /// The gate.
        gate: String,
    },
}

impl CheckError {
    /// Bounded category, usable as a metric label or Event reason: a template's own category,
    /// else the variant's name.
    pub fn category(&self) -> &'static str {
        match self {
            CheckError::Template { source, .. } => source.category(),
            other => other.into(),
        }
    }
}

/// The result of one check in a tick.
#[derive(Clone, Debug, PartialEq)]
pub struct CheckOutcome {
    /// What the engine saw (absent when the check could not be planned).
    pub observation: Option<Observation>,
    /// The next verdict, or why the gate cannot be evaluated.
    pub verdict: Result<GateVerdict, CheckError>,
}

/// What a tick did.
#[derive(Clone, Debug, PartialEq)]
pub struct TickReport {
    /// One outcome per check, in input order.
    pub outcomes: Vec<CheckOutcome>,
    /// Queries sent (one per group), independent of the number of objects.
    pub queries: usize,
    /// Queries that failed.
    pub failed_queries: usize,
    /// Wall time of the tick.
    pub elapsed: Duration,
    /// Part of `elapsed` spent waiting for the metrics source (the rest is planning and deciding).
    pub query_time: Duration,
}

#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct GroupKey {
    source: String,
    window: Duration,
    constants: Vec<(String, String)>,
}

#[derive(Debug)]
struct Group {
    key: GroupKey,
    template: Arc<Template>,
    tuples: BTreeSet<Vec<String>>,
}

/// Where one binding's answer will be found: group index and key tuple.
type Slot = (usize, Vec<String>);

#[derive(Debug)]
struct CheckPlan {
    subject: Vec<Slot>,
    baseline: Vec<Slot>,
}

/// The grouped queries of a tick and where each check finds its answers. Pure.
#[derive(Debug)]
pub struct Plan {
    groups: Vec<Group>,
    checks: Vec<Result<CheckPlan, CheckError>>,
}

impl Plan {
    /// The rendered queries, one per group.
    pub fn queries(&self) -> Result<Vec<String>, TemplateError> {
        self.groups
            .iter()
            .map(|g| {
                g.template.render(
                    &g.tuples,
                    &g.key.constants.iter().cloned().collect(),
                    g.key.window,
                )
            })
            .collect()
    }
}

fn role_overrides(vars: &Vars, prefix: &str) -> Option<Vars> {
    let mut out = Vars::new();
    if let Some(s) = vars.get(&format!("{prefix}Service")) {
        out.insert("service".into(), s.clone());
    }
    if let Some(v) = vars.get(&format!("{prefix}Version")) {
        out.insert("version".into(), v.clone());
    }
    if let Some(w) = vars.get(&format!("{prefix}Workload")) {
        out.insert(builtin::WORKLOAD_VARIABLE.into(), w.clone());
    }
    (!out.is_empty()).then_some(out)
}

fn is_share(gate: &ResolvedGate) -> bool {
    gate.comparison.share.is_some()
}

fn baseline_queried(gate: &ResolvedGate) -> bool {
    matches!(gate.query, GateQuery::Builtin(BuiltinGate::AppliedShare))
        || gate
            .comparison
            .relative
            .as_ref()
            .is_some_and(|r| r.baseline == BaselineSource::StableNow)
}

/// A valid Prometheus label name.
pub fn is_label_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// Plans a tick: groups every binding of every check by (template, window, shared variables).
pub fn plan(checks: &[GateCheck], options: &EngineOptions, subject_only: bool) -> Plan {
    type ParseKey = (String, Vec<String>, bool);
    let mut parsed: HashMap<ParseKey, Result<Arc<Template>, TemplateError>> = HashMap::new();
    let mut index: BTreeMap<GroupKey, usize> = BTreeMap::new();
    let mut groups: Vec<Group> = Vec::new();
    let mut out = Vec::with_capacity(checks.len());
    for check in checks {
        let gate = &check.gate;
        let template_error = |source| CheckError::Template {
            owner: check.owner.clone(),
            gate: gate.name.clone(),
            source,
        };
        let source = match &gate.query {
            GateQuery::Builtin(b) => builtin::template_in(*b, &options.cluster_label, &check.scope),
            GateQuery::PromQl(q) => {
                if gate.template.is_none()
                    && check.owner_namespaced
                    && !options.allow_inline_promql_in_namespaced
                {
                    out.push(Err(CheckError::InlinePromqlRefused {
                        owner: check.owner.clone(),
                        gate: gate.name.clone(),
                    }));
                    continue;
                }
                q.clone()
            }
        };
        let declared: Vec<String> = gate.variables.keys().cloned().collect();
        // The destination view keys bindings on the engine's own `{{workload}}`.
        let workloads = check.scope.keys_workloads();
        let template = parsed
            .entry((source.clone(), declared.clone(), workloads))
            .or_insert_with(|| {
                let allowed: BTreeSet<String> = KNOWN_VARIABLES
                    .iter()
                    .map(|s| s.to_string())
                    .chain(declared.iter().cloned())
                    .chain(workloads.then(|| builtin::WORKLOAD_VARIABLE.to_owned()))
                    .collect();
                Template::parse(&source, &allowed).map(Arc::new)
            })
            .clone();
        let template = match template {
            Ok(t) => t,
            Err(e) => {
                out.push(Err(template_error(e)));
                continue;
            }
        };
        let mut shared: Vars = gate.variables.clone();
        shared.extend(check.vars.clone());
        let subject_roles: Vec<Vars> = if check.subject.is_empty() {
            vec![role_overrides(&shared, "canary").unwrap_or_default()]
        } else {
            check.subject.clone()
        };
        let queried = !subject_only && baseline_queried(gate);
        let baseline_roles: Vec<Vars> = if !queried {
            Vec::new()
        } else if check.baseline.is_empty() {
            role_overrides(&shared, "stable").into_iter().collect()
        } else {
            check.baseline.clone()
        };
        let mut slot = |role: &Vars| -> Result<Slot, CheckError> {
            let mut vars = shared.clone();
            vars.extend(role.clone());
            let tuple = template.key_tuple(&vars).map_err(template_error)?;
            let constants = template.constants(&vars).map_err(template_error)?;
            let key = GroupKey {
                source: source.clone(),
                window: gate.window,
                constants,
            };
            let idx = *index.entry(key.clone()).or_insert_with(|| {
                groups.push(Group {
                    key,
                    template: template.clone(),
                    tuples: BTreeSet::new(),
                });
                groups.len() - 1
            });
            groups[idx].tuples.insert(tuple.clone());
            Ok((idx, tuple))
        };
        let planned = (|| {
            Ok(CheckPlan {
                subject: subject_roles
                    .iter()
                    .map(&mut slot)
                    .collect::<Result<_, _>>()?,
                baseline: baseline_roles
                    .iter()
                    .map(&mut slot)
                    .collect::<Result<_, _>>()?,
            })
        })();
        out.push(planned);
    }
    Plan {
        groups,
        checks: out,
    }
}

/// Splits an answer by key tuple: tuple → part → value (summed over series with the same key).
/// Series missing a key label cannot be attributed to an object and are ignored.
pub fn split(series: &[SeriesValue], key_labels: &[String]) -> HashMap<Vec<String>, Parts> {
    let mut out: HashMap<Vec<String>, Parts> = HashMap::new();
    for s in series {
        let tuple: Option<Vec<String>> = key_labels
            .iter()
            .map(|l| s.labels.get(l).cloned())
            .collect();
        let Some(tuple) = tuple else { continue };
        let part = s
            .labels
            .get(PART_LABEL)
            .map_or(VALUE_PART, String::as_str)
            .to_string();
        *out.entry(tuple).or_default().entry(part).or_insert(0.0) += s.value;
    }
    out
}

type Answers = Vec<Result<HashMap<Vec<String>, Parts>, Arc<SourceError>>>;

fn failure(error: &SourceError) -> Observation {
    let reason = if error.is_timeout() {
        VerdictReason::Timeout
    } else {
        VerdictReason::QueryError
    };
    Observation::Failed {
        reason,
        message: error.to_string(),
    }
}

/// Collects the parts of a role's slots, or the first query failure among them.
fn gather(answers: &Answers, slots: &[Slot]) -> Result<Vec<Parts>, Arc<SourceError>> {
    slots
        .iter()
        .map(|(group, tuple)| match &answers[*group] {
            Ok(map) => Ok(map.get(tuple).cloned().unwrap_or_default()),
            Err(e) => Err(e.clone()),
        })
        .collect()
}

fn reading(gate: &ResolvedGate, parts: &[Parts]) -> Reading {
    match gate.query {
        GateQuery::Builtin(b) => builtin::reduce(b, parts),
        GateQuery::PromQl(_) => builtin::reduce_custom(parts),
    }
}

fn observe(check: &GateCheck, plan: &CheckPlan, answers: &Answers) -> Observation {
    let gate = &check.gate;
    let subject = match gather(answers, &plan.subject) {
        Ok(p) => p,
        Err(e) => return failure(&e),
    };
    let baseline_parts = match gather(answers, &plan.baseline) {
        Ok(p) => p,
        Err(e) => return failure(&e),
    };
    // The applied share is canary ÷ (canary + stable) under a share or an absolute comparison
    // alike ("the share fell to about 0" is `absolute: LessOrEqual 0.01`), never the count.
    if matches!(gate.query, GateQuery::Builtin(BuiltinGate::AppliedShare))
        && (is_share(gate) || gate.comparison.absolute.is_some())
    {
        let r = builtin::applied_share(&subject, &baseline_parts);
        return Observation::Measured {
            value: r.value,
            samples: r.samples,
            baseline: None,
            distribution: None,
        };
    }
    let r = reading(gate, &subject);
    let baseline = match gate.comparison.relative.as_ref().map(|rel| rel.baseline) {
        Some(BaselineSource::StableNow) if !plan.baseline.is_empty() => {
            let b = reading(gate, &baseline_parts);
            Some(BaselineReading {
                value: b.value,
                samples: b.samples,
            })
        }
        Some(BaselineSource::PreChangeWindow) => {
            check.captured_baseline.as_ref().map(|c| BaselineReading {
                value: Some(c.value),
                samples: c.samples.map(|s| s as f64),
            })
        }
        _ => None,
    };
    Observation::Measured {
        value: r.value,
        samples: r.samples,
        baseline,
        distribution: None,
    }
}

fn uses_stable_now(gate: &ResolvedGate) -> bool {
    gate.comparison
        .relative
        .as_ref()
        .is_some_and(|r| r.baseline == BaselineSource::StableNow)
}

/// Per-timestamp answers of one range query: timestamp → key tuple → parts.
type RangeAnswer = BTreeMap<i64, HashMap<Vec<String>, Parts>>;

fn split_range(series: &[RangeValues], key_labels: &[String]) -> RangeAnswer {
    let mut by_time: BTreeMap<i64, Vec<SeriesValue>> = BTreeMap::new();
    for s in series {
        for &(t, value) in &s.points {
            by_time.entry(t).or_default().push(SeriesValue {
                labels: s.labels.clone(),
                value,
            });
        }
    }
    by_time
        .into_iter()
        .map(|(t, v)| (t, split(&v, key_labels)))
        .collect()
}

/// The finite per-interval values of one role.
fn interval_values(
    gate: &ResolvedGate,
    answers: &[Option<RangeAnswer>],
    slots: &[Slot],
) -> Vec<f64> {
    let times: BTreeSet<i64> = slots
        .iter()
        .filter_map(|(g, _)| answers[*g].as_ref())
        .flat_map(|a| a.keys().copied())
        .collect();
    times
        .into_iter()
        .filter_map(|t| {
            let parts: Vec<Parts> = slots
                .iter()
                .map(|(g, tuple)| {
                    answers[*g]
                        .as_ref()
                        .and_then(|a| a.get(&t))
                        .and_then(|m| m.get(tuple))
                        .cloned()
                        .unwrap_or_default()
                })
                .collect();
            reading(gate, &parts).value.filter(|v| v.is_finite())
        })
        .collect()
}

/// The aligned points of a sequential check: every `step` ms from `first` to `end` (Unix ms).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Span {
    first: i64,
    end: i64,
    step: i64,
}

/// The sequential test a check is judged by, if any: a scope set by the owner and a built-in
/// canary gate.
fn sequential_of(check: &GateCheck) -> Option<(SequentialKind, SequentialScope)> {
    let scope = check.sequential?;
    if scope.interval.is_zero() {
        return None;
    }
    decide::sequential_kind(&check.gate).map(|k| (k, scope))
}

/// The points of a check: intervals ending after `since` (for the share, lying entirely after
/// it, so a previous step's weight never counts), at most `lookback` back, up to the last one
/// ended at `now`. `None` when none has ended yet.
fn span(
    kind: SequentialKind,
    scope: SequentialScope,
    lookback: Duration,
    now: Timestamp,
) -> Option<Span> {
    let step = i64::try_from(scope.interval.as_millis()).ok()?.max(1);
    let end = now.as_millisecond().div_euclid(step) * step;
    let since = scope.since.as_millisecond();
    let mut first = match kind {
        SequentialKind::Share => (since + step - 1).div_euclid(step) * step + step,
        _ => since.div_euclid(step) * step + step,
    };
    let back = i64::try_from(lookback.as_millis()).unwrap_or(i64::MAX) / step;
    first = first.max(end - (back.max(1) - 1) * step);
    (first <= end).then_some(Span { first, end, step })
}

/// The counts of one interval from the canary's and the stable's parts.
fn counts(kind: SequentialKind, canary: &[Parts], stable: &[Parts]) -> IntervalCounts {
    let sum = |parts: &[Parts], name: &str| -> f64 {
        parts
            .iter()
            .filter_map(|p| p.get(name))
            .filter(|v| v.is_finite())
            .sum()
    };
    match kind {
        SequentialKind::Errors | SequentialKind::Share => IntervalCounts {
            canary_requests: sum(canary, "requests"),
            canary_bad: sum(canary, "errors"),
            stable_requests: sum(stable, "requests"),
            stable_bad: sum(stable, "errors"),
        },
        SequentialKind::SlowRequests => {
            let (c, s) = (builtin::buckets(canary), builtin::buckets(stable));
            match seq::p99_bound(&s) {
                // Without stable requests there is no bound to count against.
                None => IntervalCounts::default(),
                Some(bound) => {
                    let (canary_bad, canary_requests) = seq::above(&c, bound);
                    let (stable_bad, stable_requests) = seq::above(&s, bound);
                    IntervalCounts {
                        canary_requests,
                        canary_bad,
                        stable_requests,
                        stable_bad,
                    }
                }
            }
        }
    }
}

/// The gate engine over a metrics source.
#[derive(Debug)]
pub struct Engine<S> {
    source: S,
    options: EngineOptions,
    intervals: Mutex<IntervalCache>,
}

/// The sequential range answers of the interval last ended, per group of queries (template,
/// window, constants) and interval length, the queries in flight, and the counts each check
/// has already accumulated. Ticks are driven by their owners' reconciles, so one interval can
/// hold many ticks: the first asks once for every object asking in this interval or the one
/// before, the later ticks of the interval read that answer (or wait for it while it is in
/// flight) instead of asking again. An object whose earlier intervals are counted reads only
/// the newest ones; one counted for the first time (a new step, a restarted process) reads from
/// the step's start, in a query of its own so the others' stays short. Query load per interval
/// therefore stays one query per group whatever the number of objects (one more when an object
/// asks for the first time), and each object's share of it is a fixed number of points.
#[derive(Debug, Default)]
struct IntervalCache {
    groups: BTreeMap<(GroupKey, i64), CachedGroup>,
    counted: BTreeMap<CountKey, Arc<Counted>>,
    next_id: u64,
}

/// The answer of one range query: the tuples it was asked for and the first interval it covers
/// (it also holds the reading one interval before).
#[derive(Debug)]
struct Answer {
    first: i64,
    tuples: BTreeSet<Vec<String>>,
    values: RangeAnswer,
}

type AnswerResult = Result<Arc<Answer>, Arc<SourceError>>;

/// Tuples of a group waiting for a query in flight.
type Waiting = (
    usize,
    Vec<Vec<String>>,
    Shared<oneshot::Receiver<AnswerResult>>,
);

/// A query to send: group, id, span, tuples, and where its answer is published.
type Sending = (
    usize,
    u64,
    Span,
    BTreeSet<Vec<String>>,
    oneshot::Sender<AnswerResult>,
);

/// A range query sent and not yet answered: the ticks that need what it covers wait for it.
struct InFlight {
    id: u64,
    first: i64,
    tuples: BTreeSet<Vec<String>>,
    answer: Shared<oneshot::Receiver<AnswerResult>>,
}

impl std::fmt::Debug for InFlight {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("InFlight")
            .field("id", &self.id)
            .field("first", &self.first)
            .field("tuples", &self.tuples.len())
            .finish_non_exhaustive()
    }
}

impl InFlight {
    fn covers(&self, tuple: &[String], first: i64) -> bool {
        self.first <= first && self.tuples.contains(tuple)
    }
}

impl Answer {
    fn covers(&self, tuple: &[String], first: i64) -> bool {
        self.first <= first && self.tuples.contains(tuple)
    }
}

#[derive(Debug, Default)]
struct CachedGroup {
    /// The end (Unix ms) of the interval the answers are for.
    end: i64,
    /// The answers for that interval.
    answers: Vec<Arc<Answer>>,
    /// The queries for that interval in flight.
    inflight: Vec<InFlight>,
    /// Every tuple asked for, with the end of the last interval it was asked at.
    asked: BTreeMap<Vec<String>, i64>,
}

/// What one check's counts are accumulated for: the owner, the gate, the start of the
/// accumulation and the interval, and the queries and bindings they are read from (a change of
/// any of them counts afresh).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct CountKey {
    owner: String,
    gate: String,
    since: i64,
    step: i64,
    slots: Vec<(GroupKey, Vec<String>, bool)>,
}

/// The counts a check accumulated: one per aligned interval up to `through` (Unix ms, the end
/// of the last one counted), and whether any reading was seen.
#[derive(Clone, Debug)]
struct Counted {
    through: i64,
    intervals: BTreeMap<i64, IntervalCounts>,
    seen: bool,
}

/// Why an engine could not be built.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error, strum::IntoStaticStr)]
pub enum EngineError {
    /// The cluster label is not a valid label name.
    #[error(
        "cluster label {0:?} is not a Prometheus label name ([a-zA-Z_][a-zA-Z0-9_]*); fix the engine setting"
    )]
    BadClusterLabel(String),
}

impl EngineError {
    /// Bounded category.
    pub fn category(&self) -> &'static str {
        self.into()
    }
}

impl<S: MetricsSource> Engine<S> {
    /// An engine over `source`.
    pub fn new(source: S, options: EngineOptions) -> Result<Self, EngineError> {
        if !is_label_name(&options.cluster_label) {
            return Err(EngineError::BadClusterLabel(options.cluster_label));
        }
        Ok(Self {
            source,
            options,
            intervals: Mutex::default(),
        })
    }

    /// The metrics source.
    pub fn source(&self) -> &S {
        &self.source
    }

    /// The engine's settings.
    pub fn options(&self) -> &EngineOptions {
        &self.options
    }

    async fn run(&self, plan: &Plan, at: Timestamp) -> (Answers, usize) {
        let queries = match plan.queries() {
            Ok(q) => q,
            // Every template was validated while planning; rendering a planned group cannot fail.
            Err(e) => {
                let err = Arc::new(SourceError::Decode {
                    url: String::new(),
                    message: e.to_string(),
                });
                return (
                    plan.groups.iter().map(|_| Err(err.clone())).collect(),
                    plan.groups.len(),
                );
            }
        };
        let futures = queries.iter().map(|q| self.source.query(q, at));
        let results = futures::future::join_all(futures).await;
        let mut failed = 0;
        let answers = results
            .into_iter()
            .zip(&plan.groups)
            .map(|(result, group)| match result {
                Ok(series) => Ok(split(&series, &group.template.key_labels())),
                Err(e) => {
                    failed += 1;
                    tracing::warn!(category = e.category(), error = %e, "gate query failed");
                    Err(Arc::new(e))
                }
            })
            .collect();
        (answers, failed)
    }

    /// One analysis tick at `now`: one query per group, then a verdict per check. Checks judged
    /// by a sequential test (a [`SequentialScope`] on a built-in canary gate) are read from one
    /// range query per group over their aligned intervals instead.
    pub async fn tick(&self, checks: &[GateCheck], now: Timestamp) -> TickReport {
        let started = Instant::now();
        let mut instant_at = Vec::new();
        let mut sequential = Vec::new();
        for (i, c) in checks.iter().enumerate() {
            match sequential_of(c) {
                Some((kind, scope)) => sequential.push((i, kind, scope)),
                None => instant_at.push(i),
            }
        }
        let instant: Vec<GateCheck> = instant_at.iter().map(|&i| checks[i].clone()).collect();
        let plan = plan(&instant, &self.options, false);
        let query_started = Instant::now();
        let (
            (answers, mut failed_queries),
            (distributions, range_queries, range_failed),
            (sequential_outcomes, sequential_queries, sequential_failed),
        ) = futures::join!(
            self.run(&plan, now),
            self.compare_distributions(&instant, &plan, now),
            self.run_sequential(checks, &sequential, now)
        );
        failed_queries += range_failed + sequential_failed;
        let query_time = query_started.elapsed();
        let mut outcomes: Vec<Option<CheckOutcome>> = vec![None; checks.len()];
        for (((&at, check), planned), distribution) in instant_at
            .iter()
            .zip(&instant)
            .zip(plan.checks.iter())
            .zip(distributions)
        {
            outcomes[at] = Some(match planned {
                Err(e) => CheckOutcome {
                    observation: None,
                    verdict: Err(e.clone()),
                },
                Ok(p) => {
                    let mut observation = observe(check, p, &answers);
                    if let Observation::Measured {
                        distribution: d, ..
                    } = &mut observation
                    {
                        *d = distribution;
                    }
                    let owner = OwnerContext {
                        share_target: check.share_target,
                        share_tolerance: self.options.share_tolerance,
                    };
                    let verdict = decide::decide(
                        &check.gate,
                        &observation,
                        check.previous.as_ref(),
                        owner,
                        now,
                    );
                    CheckOutcome {
                        observation: Some(observation),
                        verdict: Ok(verdict),
                    }
                }
            });
        }
        for ((at, _, _), outcome) in sequential.iter().zip(sequential_outcomes) {
            outcomes[*at] = Some(outcome);
        }
        TickReport {
            outcomes: outcomes.into_iter().flatten().collect(),
            queries: plan.groups.len() + range_queries + sequential_queries,
            failed_queries,
            elapsed: started.elapsed(),
            query_time,
        }
    }

    /// The sequential checks of a tick: one range query per group (template, interval, shared
    /// variables) from the earliest interval any of its checks needs to the last interval ended
    /// at `now`, with the interval as both the `increase` window and the step, so every request
    /// is counted in exactly one aligned interval. Returns one outcome per entry of `which`, the
    /// queries sent and how many failed.
    async fn run_sequential(
        &self,
        checks: &[GateCheck],
        which: &[(usize, SequentialKind, SequentialScope)],
        now: Timestamp,
    ) -> (Vec<CheckOutcome>, usize, usize) {
        if which.is_empty() {
            return (Vec::new(), 0, 0);
        }
        let per_interval: Vec<GateCheck> = which
            .iter()
            .map(|&(i, kind, scope)| {
                // The counters at the aligned instants, canary and stable (the share's planning
                // marks the stable as a baseline like a relative gate's): the errors and the share
                // of one Rollout share a query.
                let mut c = checks[i].clone();
                c.gate.window = scope.interval;
                // The share counts live requests: the source reporter whatever the view.
                if kind == SequentialKind::Share {
                    c.scope = c.scope.live();
                }
                c.gate.query = GateQuery::PromQl(builtin::counters_in(
                    kind == SequentialKind::SlowRequests,
                    &self.options.cluster_label,
                    &c.scope,
                ));
                c.gate.template = Some(format!("builtin counters of {}", c.gate.name));
                c.gate.comparison =
                    sluice_api::v1alpha1::Comparison::relative(BaselineSource::StableNow, 1.0);
                c
            })
            .collect();
        let plan = plan(&per_interval, &self.options, false);
        let spans: Vec<Option<Span>> = which
            .iter()
            .map(|&(_, kind, scope)| span(kind, scope, self.options.sequential_lookback, now))
            .collect();
        let now_ms = now.as_millisecond();
        let lookback =
            i64::try_from(self.options.sequential_lookback.as_millis()).unwrap_or(i64::MAX);
        // Per check: the key of its accumulated counts, and the first interval it reads (the
        // last one counted is counted again, so a reading that arrived late is taken in).
        let mut keys: Vec<Option<CountKey>> = vec![None; which.len()];
        let mut from: Vec<Option<i64>> = vec![None; which.len()];
        let mut counted: Vec<Option<Arc<Counted>>> = vec![None; which.len()];
        // Per group: every tuple needed, with the first interval it is needed from.
        let mut needs: BTreeMap<usize, BTreeMap<Vec<String>, i64>> = BTreeMap::new();
        {
            let mut cache = self.intervals.lock().unwrap_or_else(|e| e.into_inner());
            cache
                .counted
                .retain(|k, c| c.through >= now_ms.saturating_sub(lookback).saturating_sub(k.step));
            for (n, ((&(i, _, scope), planned), span)) in
                which.iter().zip(&plan.checks).zip(&spans).enumerate()
            {
                let (Ok(p), Some(span)) = (planned, span) else {
                    continue;
                };
                let slot = |&(g, ref tuple): &Slot, baseline: bool| {
                    (plan.groups[g].key.clone(), tuple.clone(), baseline)
                };
                let key = CountKey {
                    owner: checks[i].owner.clone(),
                    gate: checks[i].gate.name.clone(),
                    since: scope.since.as_millisecond(),
                    step: span.step,
                    slots: p
                        .subject
                        .iter()
                        .map(|s| slot(s, false))
                        .chain(p.baseline.iter().map(|s| slot(s, true)))
                        .collect(),
                };
                let earlier = cache
                    .counted
                    .get(&key)
                    .filter(|c| c.through >= span.first && c.through <= span.end)
                    .cloned();
                let first = earlier.as_ref().map_or(span.first, |c| c.through);
                counted[n] = earlier;
                for (g, tuple) in p.subject.iter().chain(&p.baseline) {
                    let need = needs
                        .entry(*g)
                        .or_default()
                        .entry(tuple.clone())
                        .or_insert(first);
                    *need = (*need).min(first);
                }
                keys[n] = Some(key);
                from[n] = Some(first);
            }
        }
        // Per group: the end and step of its intervals (one window, one step per group).
        let mut group_span: BTreeMap<usize, Span> = BTreeMap::new();
        for (planned, span) in plan.checks.iter().zip(&spans) {
            if let (Ok(p), Some(span)) = (planned, span) {
                for (g, _) in p.subject.iter().chain(&p.baseline) {
                    group_span.insert(*g, *span);
                }
            }
        }
        // Where each needed tuple is read: an answer of this interval, a query in flight, or a
        // query sent now (one for the objects reading the newest intervals, one for those
        // reading from further back).
        let mut found: HashMap<(usize, Vec<String>), AnswerResult> = HashMap::new();
        let mut waits: Vec<Waiting> = Vec::new();
        let mut to_send: Vec<Sending> = Vec::new();
        {
            let mut cache = self.intervals.lock().unwrap_or_else(|e| e.into_inner());
            for (&g, need) in &needs {
                let s = group_span[&g];
                let mut id = cache.next_id;
                let entry = cache
                    .groups
                    .entry((plan.groups[g].key.clone(), s.step))
                    .or_default();
                if entry.end < s.end {
                    entry.end = s.end;
                    entry.answers.clear();
                    entry.inflight.clear();
                }
                let current = entry.end == s.end;
                let mut newest = BTreeSet::new();
                let mut older = BTreeSet::new();
                let mut older_first = s.end;
                let mut waiting: BTreeMap<usize, Vec<Vec<String>>> = BTreeMap::new();
                for (tuple, &first) in need {
                    if current {
                        if let Some(a) = entry.answers.iter().find(|a| a.covers(tuple, first)) {
                            found.insert((g, tuple.clone()), Ok(a.clone()));
                            continue;
                        }
                        if let Some(w) = entry.inflight.iter().position(|f| f.covers(tuple, first))
                        {
                            waiting.entry(w).or_default().push(tuple.clone());
                            continue;
                        }
                    }
                    if first >= s.end - s.step {
                        newest.insert(tuple.clone());
                    } else {
                        older.insert(tuple.clone());
                        older_first = older_first.min(first);
                    }
                }
                for (w, tuples) in waiting {
                    waits.push((g, tuples, entry.inflight[w].answer.clone()));
                }
                if !newest.is_empty() {
                    // Objects that asked recently, so the later ticks of this interval find
                    // their answer here.
                    entry.asked.retain(|_, at| *at >= s.end - s.step);
                    let covered = |t: &Vec<String>| {
                        current
                            && (entry.answers.iter().any(|a| a.covers(t, s.end - s.step))
                                || entry.inflight.iter().any(|f| f.covers(t, s.end - s.step)))
                    };
                    let recent: Vec<Vec<String>> = entry
                        .asked
                        .keys()
                        .filter(|t| !covered(t))
                        .cloned()
                        .collect();
                    newest.extend(recent);
                }
                for (tuples, first) in [(newest, s.end - s.step), (older, older_first)] {
                    if tuples.is_empty() {
                        continue;
                    }
                    let (tx, rx) = oneshot::channel();
                    id += 1;
                    if current {
                        entry.inflight.push(InFlight {
                            id,
                            first,
                            tuples: tuples.clone(),
                            answer: rx.shared(),
                        });
                    }
                    to_send.push((g, id, Span { first, ..s }, tuples, tx));
                }
                for tuple in need.keys() {
                    let at = entry.asked.entry(tuple.clone()).or_insert(s.end);
                    *at = (*at).max(s.end);
                }
                cache.next_id = id;
            }
        }
        let ask = |g: usize, s: Span, tuples: BTreeSet<Vec<String>>| {
            let group = &plan.groups[g];
            let query = group
                .template
                .render(
                    &tuples,
                    &group.key.constants.iter().cloned().collect(),
                    group.key.window,
                )
                .ok();
            async move {
                let at = |ms: i64| Timestamp::from_millisecond(ms).unwrap_or(now);
                // One reading before the first interval: its counts are the difference.
                let result = match query {
                    Some(q) => {
                        self.source
                            .query_range(
                                &q,
                                at(s.first - s.step),
                                at(s.end),
                                Duration::from_millis(s.step as u64),
                            )
                            .await
                    }
                    None => Err(SourceError::Decode {
                        url: String::new(),
                        message: "a planned query did not render".into(),
                    }),
                };
                match result {
                    Ok(series) => Ok(Arc::new(Answer {
                        first: s.first,
                        tuples,
                        values: split_range(&series, &group.template.key_labels()),
                    })),
                    Err(e) => {
                        tracing::warn!(category = e.category(), error = %e, "sequential gate query failed");
                        Err(Arc::new(e))
                    }
                }
            }
        };
        // Each answer is published the moment it arrives: a tick waiting for it never waits
        // for the rest of the tick that sent it.
        let groups = &plan.groups;
        let publish = |g: usize,
                       id: u64,
                       s: Span,
                       tuples: BTreeSet<Vec<String>>,
                       tx: oneshot::Sender<AnswerResult>| {
            let asked = ask(g, s, tuples.clone());
            async move {
                let result = asked.await;
                {
                    let mut cache = self.intervals.lock().unwrap_or_else(|e| e.into_inner());
                    if let Some(entry) = cache.groups.get_mut(&(groups[g].key.clone(), s.step)) {
                        entry.inflight.retain(|f| f.id != id);
                        if entry.end == s.end
                            && let Ok(a) = &result
                        {
                            entry.answers.push(a.clone());
                        }
                    }
                }
                let _ = tx.send(result.clone());
                (g, tuples, result)
            }
        };
        let mut sent = to_send.len();
        let mut failed = 0;
        let (results, waited) = futures::join!(
            futures::future::join_all(
                to_send
                    .into_iter()
                    .map(|(g, id, s, tuples, tx)| publish(g, id, s, tuples, tx))
            ),
            futures::future::join_all(waits.iter().map(|(_, _, rx)| rx.clone()))
        );
        for (g, tuples, result) in results {
            if result.is_err() {
                failed += 1;
            }
            for t in tuples {
                if needs.get(&g).is_some_and(|n| n.contains_key(&t)) {
                    found.entry((g, t)).or_insert_with(|| result.clone());
                }
            }
        }
        // A query waited for that was abandoned (its tick stopped): asked again here.
        let mut again = Vec::new();
        for ((g, tuples, _), result) in waits.into_iter().zip(waited) {
            match result {
                Ok(r) => {
                    for t in tuples {
                        found.insert((g, t), r.clone());
                    }
                }
                Err(oneshot::Canceled) => {
                    let s = group_span[&g];
                    let first = tuples
                        .iter()
                        .filter_map(|t| needs.get(&g).and_then(|n| n.get(t)).copied())
                        .min()
                        .unwrap_or(s.first);
                    again.push((g, Span { first, ..s }, tuples));
                }
            }
        }
        if !again.is_empty() {
            sent += again.len();
            let results = futures::future::join_all(
                again
                    .iter()
                    .map(|(g, s, tuples)| ask(*g, *s, tuples.iter().cloned().collect())),
            )
            .await;
            for ((g, _, tuples), result) in again.into_iter().zip(results) {
                if result.is_err() {
                    failed += 1;
                }
                for t in tuples {
                    found.insert((g, t), result.clone());
                }
            }
        }
        let outcomes = which
            .iter()
            .zip(&per_interval)
            .zip(plan.checks.iter().zip(&spans))
            .enumerate()
            .map(|(n, ((&(i, kind, scope), per), (planned, span)))| {
                let check = &checks[i];
                let p = match planned {
                    Err(e) => {
                        return CheckOutcome {
                            observation: None,
                            verdict: Err(e.clone()),
                        };
                    }
                    Ok(p) => p,
                };
                let owner = OwnerContext {
                    share_target: check.share_target,
                    share_tolerance: self.options.share_tolerance,
                };
                let max_intervals = (self.options.sequential_lookback.as_millis()
                    / scope.interval.as_millis().max(1))
                .max(1) as usize;
                let judge = |intervals: &[IntervalCounts], first: Timestamp| match kind {
                    SequentialKind::Share => {
                        let (c, t) = intervals.iter().fold((0.0, 0.0), |(c, t), i| {
                            (
                                c + i.canary_requests,
                                t + i.canary_requests + i.stable_requests,
                            )
                        });
                        let v = decide::decide_share(
                            &check.gate,
                            c,
                            t,
                            owner,
                            check.previous.as_ref(),
                            now,
                        );
                        let observation = Observation::Measured {
                            value: (t > 0.0).then(|| c / t),
                            samples: Some(t),
                            baseline: None,
                            distribution: None,
                        };
                        (observation, v)
                    }
                    _ => {
                        let v = decide::decide_rate(
                            &check.gate,
                            kind,
                            intervals,
                            first,
                            scope.interval,
                            RateScope {
                                alpha: scope.alpha,
                                max_intervals,
                            },
                            check.previous.as_ref(),
                            now,
                        );
                        let observation = Observation::Measured {
                            value: v.value,
                            samples: v.samples.map(|s| s as f64),
                            baseline: Some(BaselineReading {
                                value: v.baseline,
                                samples: Some(intervals.iter().map(|i| i.stable_requests).sum()),
                            }),
                            distribution: None,
                        };
                        (observation, v)
                    }
                };
                let Some(span) = span else {
                    // No interval has ended since the accumulation began.
                    let (observation, verdict) = judge(&[], scope.since);
                    return CheckOutcome {
                        observation: Some(observation),
                        verdict: Ok(verdict),
                    };
                };
                // The intervals read now; the earlier ones are counted already.
                let from = from[n].unwrap_or(span.first);
                let earlier = counted[n].as_deref();
                let read =
                    |slots: &[Slot]| -> Result<Vec<BTreeMap<i64, Vec<Parts>>>, Arc<SourceError>> {
                        slots
                            .iter()
                            .map(|(g, tuple)| match found.get(&(*g, tuple.clone())) {
                                Some(Ok(a)) => Ok(a
                                    .values
                                    .range(from - span.step..=span.end)
                                    .filter_map(|(t, m)| {
                                        m.get(tuple).map(|p| (*t, vec![p.clone()]))
                                    })
                                    .collect()),
                                Some(Err(e)) => Err(e.clone()),
                                None => Ok(BTreeMap::new()),
                            })
                            .collect()
                    };
                let (subject, baseline) = match (read(&p.subject), read(&p.baseline)) {
                    (Ok(s), Ok(b)) => (s, b),
                    (Err(e), _) | (_, Err(e)) => {
                        let observation = failure(&e);
                        let verdict = decide::decide(
                            &check.gate,
                            &observation,
                            check.previous.as_ref(),
                            owner,
                            now,
                        );
                        return CheckOutcome {
                            observation: Some(observation),
                            verdict: Ok(verdict),
                        };
                    }
                };
                // The counts of the interval ending at `t`: per binding, the increase of each part
                // since the reading one interval before (a counter reset counts 0; a series
                // that appears counts from 0).
                let at_time = |side: &[BTreeMap<i64, Vec<Parts>>], t: i64| -> Vec<Parts> {
                    side.iter()
                        .filter_map(|m| {
                            let cur = m.get(&t)?.first()?;
                            let prev = m.get(&(t - span.step)).and_then(|p| p.first());
                            Some(
                                cur.iter()
                                    .map(|(name, v)| {
                                        let before = prev.and_then(|p| p.get(name)).copied();
                                        (name.clone(), (v - before.unwrap_or(0.0)).max(0.0))
                                    })
                                    .collect::<Parts>(),
                            )
                        })
                        .collect()
                };
                let seen = earlier.is_some_and(|c| c.seen)
                    || subject.iter().chain(&baseline).any(|m| !m.is_empty());
                let mut intervals = Vec::new();
                let mut t = span.first;
                while t <= span.end {
                    intervals.push(if t < from {
                        earlier
                            .and_then(|c| c.intervals.get(&t))
                            .copied()
                            .unwrap_or_default()
                    } else {
                        let (c, s) = (at_time(&subject, t), at_time(&baseline, t));
                        counts(kind, &c, &s)
                    });
                    t += span.step;
                }
                if let Some(key) = keys[n].take() {
                    let mut cache = self.intervals.lock().unwrap_or_else(|e| e.into_inner());
                    let stale = cache
                        .counted
                        .get(&key)
                        .is_some_and(|c| c.through > span.end);
                    if !stale {
                        let mut t = span.first;
                        let intervals = intervals
                            .iter()
                            .map(|c| {
                                t += span.step;
                                (t - span.step, *c)
                            })
                            .collect();
                        cache.counted.insert(
                            key,
                            Arc::new(Counted {
                                through: span.end,
                                intervals,
                                seen,
                            }),
                        );
                    }
                }
                if !seen {
                    let observation = Observation::Measured {
                        value: None,
                        samples: None,
                        baseline: None,
                        distribution: None,
                    };
                    let verdict = decide::decide(
                        &per.gate,
                        &observation,
                        check.previous.as_ref(),
                        owner,
                        now,
                    );
                    return CheckOutcome {
                        observation: Some(observation),
                        verdict: Ok(verdict),
                    };
                }
                let first = Timestamp::from_millisecond(span.first - span.step).unwrap_or(now);
                let (observation, verdict) = judge(&intervals, first);
                CheckOutcome {
                    observation: Some(observation),
                    verdict: Ok(verdict),
                }
            })
            .collect();
        (outcomes, sent, failed)
    }

    /// The optional Mann–Whitney comparison: for every planned relative gate against
    /// `StableNow`, the canary's and the stable's per-interval values over the lookback, from one
    /// range query per group. Returns one entry per check (None: off, not applicable, too few
    /// intervals, or the range query failed, in which case the instant check decides alone),
    /// the number of range queries and how many failed.
    async fn compare_distributions(
        &self,
        checks: &[GateCheck],
        instant: &Plan,
        now: Timestamp,
    ) -> (Vec<Option<DistributionTest>>, usize, usize) {
        let mut out = vec![None; checks.len()];
        let Some(mw) = &self.options.mann_whitney else {
            return (out, 0, 0);
        };
        let eligible: Vec<usize> = (0..checks.len())
            .filter(|&i| instant.checks[i].is_ok() && uses_stable_now(&checks[i].gate))
            .collect();
        if eligible.is_empty() {
            return (out, 0, 0);
        }
        let per_interval: Vec<GateCheck> = eligible
            .iter()
            .map(|&i| {
                let mut c = checks[i].clone();
                c.gate.window = mw.interval;
                c
            })
            .collect();
        let plan = plan(&per_interval, &self.options, false);
        let Ok(queries) = plan.queries() else {
            return (out, 0, 0);
        };
        let lookback =
            jiff::SignedDuration::try_from(mw.lookback).unwrap_or(jiff::SignedDuration::ZERO);
        let start = now.checked_sub(lookback).unwrap_or(now);
        let results = futures::future::join_all(
            queries
                .iter()
                .map(|q| self.source.query_range(q, start, now, mw.interval)),
        )
        .await;
        let mut failed = 0;
        let answers: Vec<Option<RangeAnswer>> = results
            .into_iter()
            .zip(&plan.groups)
            .map(|(r, g)| match r {
                Ok(series) => Some(split_range(&series, &g.template.key_labels())),
                Err(e) => {
                    failed += 1;
                    tracing::warn!(category = e.category(), error = %e, "range query for Mann-Whitney failed");
                    None
                }
            })
            .collect();
        for ((&i, check), planned) in eligible.iter().zip(&per_interval).zip(&plan.checks) {
            let Ok(p) = planned else { continue };
            let canary = interval_values(&check.gate, &answers, &p.subject);
            let stable = interval_values(&check.gate, &answers, &p.baseline);
            if canary.len() < mw.min_intervals || stable.len() < mw.min_intervals {
                continue;
            }
            let worse = match check.gate.comparison.relative.as_ref().map(|r| r.op) {
                Some(ComparisonOp::GreaterThan | ComparisonOp::GreaterOrEqual) => Worse::Lower,
                _ => Worse::Higher,
            };
            out[i] = mann_whitney_u(&canary, &stable, worse).map(|test| DistributionTest {
                test,
                alpha: mw.alpha,
            });
        }
        (out, queries.len(), failed)
    }

    /// Captures pre-change baselines: the subject reading of each check over the window ending at
    /// `change_start` (one grouped query per template and window, like a tick). A check whose
    /// query failed or returned no data gets an error naming why; nothing is captured for it.
    pub async fn capture_baselines(
        &self,
        checks: &[GateCheck],
        change_start: Timestamp,
        now: Timestamp,
    ) -> Vec<Result<CapturedBaseline, String>> {
        let plan = plan(checks, &self.options, true);
        let (answers, _) = self.run(&plan, change_start).await;
        checks
            .iter()
            .zip(plan.checks.iter())
            .map(|(check, planned)| {
                let planned = planned.as_ref().map_err(ToString::to_string)?;
                let parts = gather(&answers, &planned.subject).map_err(|e| e.to_string())?;
                let r = reading(&check.gate, &parts);
                let value = r.value.filter(|v| !v.is_nan()).ok_or_else(|| {
                    format!(
                        "gate {:?} of {}: the pre-change window has no data",
                        check.gate.name, check.owner
                    )
                })?;
                let window = jiff::SignedDuration::try_from(check.gate.window)
                    .unwrap_or(jiff::SignedDuration::ZERO);
                Ok(CapturedBaseline {
                    gate: check.gate.name.clone(),
                    scope: None,
                    value,
                    samples: r.samples.map(|s| s.max(0.0).round() as u64),
                    window_start: Time(change_start.checked_sub(window).unwrap_or(change_start)),
                    window_end: Time(change_start),
                    captured_at: Time(now),
                })
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use sluice_api::v1alpha1::{Comparison, ComparisonOp, Gate, GateDefinition, Verdict};

    use super::*;

    fn vars(pairs: &[(&str, &str)]) -> Vars {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn service_check(i: usize, gate: BuiltinGate) -> GateCheck {
        let mut g = Gate::builtin("g", gate).resolve(None).unwrap();
        if g.comparison.share.is_none() && g.comparison.relative.is_none() {
            g.comparison = Comparison::absolute(ComparisonOp::LessOrEqual, 0.0);
        }
        GateCheck::new(
            format!("Rollout shop/r{i}"),
            g,
            vars(&[
                ("cluster", &format!("c{}", i % 3)),
                ("namespace", "shop"),
                ("canaryService", &format!("svc{i}-canary")),
                ("stableService", &format!("svc{i}-stable")),
                ("commit", "abc"),
                ("revision", "1-28"),
            ]),
        )
    }

    #[test]
    fn query_count_does_not_grow_with_objects() {
        let options = EngineOptions::default();
        let gates = [
            BuiltinGate::AppliedShare,
            BuiltinGate::ErrorRatioVsStable,
            BuiltinGate::LatencyP99VsStable,
            BuiltinGate::MeshErrorRatio,
        ];
        for n in [1, 10, 1000] {
            let checks: Vec<GateCheck> = (0..n)
                .flat_map(|i| gates.iter().map(move |g| service_check(i, *g)))
                .collect();
            let p = plan(&checks, &options, false);
            assert_eq!(p.groups.len(), gates.len(), "{n} objects");
            assert!(p.checks.iter().all(Result::is_ok));
        }
    }

    #[test]
    fn the_destination_view_binds_the_canary_and_stable_workloads_in_one_query() {
        let options = EngineOptions::default();
        let mirror = |i: usize, gate| {
            let mut c = service_check(i, gate);
            c.vars
                .insert("canaryWorkload".into(), format!("deploy{i}-canary"));
            c.vars
                .insert("stableWorkload".into(), format!("deploy{i}-stable"));
            c.scope.reporter = builtin::Reporter::Destination;
            c
        };
        let checks: Vec<GateCheck> = (0..3)
            .map(|i| mirror(i * 3, BuiltinGate::ErrorRatioVsStable))
            .collect();
        let p = plan(&checks, &options, false);
        assert!(p.checks.iter().all(Result::is_ok), "{:?}", p.checks);
        let queries = p.queries().unwrap();
        assert_eq!(queries.len(), 1, "{queries:?}");
        let q = &queries[0];
        assert!(q.contains(r#"reporter="destination""#), "{q}");
        assert!(!q.contains("reporter=\"source\""), "{q}");
        for w in ["deploy0-canary", "deploy0-stable", "deploy6-stable"] {
            assert!(q.contains(w), "{w} in {q}");
        }
        assert!(
            q.contains(r#"destination_workload_namespace="shop""#),
            "{q}"
        );
        assert!(
            !q.contains("svc0-canary"),
            "keyed on workloads, not Services: {q}"
        );
        // Without the workload names the check cannot be planned: a configuration error.
        let mut bare = service_check(0, BuiltinGate::LatencyP99VsStable);
        bare.scope.reporter = builtin::Reporter::Destination;
        let p = plan(&[bare], &options, false);
        assert!(
            matches!(&p.checks[0], Err(CheckError::Template { source: TemplateError::MissingVariable { name }, .. }) if name == "workload"),
            "{:?}",
            p.checks[0]
        );
        // The share reads the source reporter in the destination view too.
        let share = mirror(0, BuiltinGate::AppliedShare);
        let q = plan(&[share], &options, false).queries().unwrap();
        assert!(q[0].contains(r#"reporter="source""#) && q[0].contains("svc0-canary"));
    }

    #[test]
    fn different_windows_and_constants_are_separate_groups() {
        let options = EngineOptions::default();
        let mut a = service_check(0, BuiltinGate::ErrorRatioVsStable);
        let mut b = service_check(1, BuiltinGate::ErrorRatioVsStable);
        b.gate.window = Duration::from_secs(300);
        let p = plan(&[a.clone(), b.clone()], &options, false);
        assert_eq!(p.groups.len(), 2);

        // A template whose variable sits inside a larger string is batched per value.
        let custom = |check: &mut GateCheck| {
            check.gate.query = GateQuery::PromQl(
                r#"sum by ({{by}}) (m{cluster="{{cluster}}", job="{{service}}-x"})"#.into(),
            );
            check.gate.template = Some("t".into());
        };
        custom(&mut a);
        custom(&mut b);
        // Absolute comparisons: only the subject binding is queried.
        a.gate.comparison = Comparison::absolute(ComparisonOp::LessThan, 1.0);
        b.gate.comparison = a.gate.comparison.clone();
        b.gate.window = a.gate.window;
        let p = plan(&[a, b], &options, false);
        assert_eq!(p.groups.len(), 2, "job constant differs: two queries");
    }

    #[test]
    fn inline_promql_policy() {
        let inline = |namespaced: bool| {
            let g = Gate {
                name: "g".into(),
                template_ref: None,
                definition: GateDefinition {
                    promql: Some(r#"sum(m{cluster="{{cluster}}"})"#.into()),
                    comparison: Some(Comparison::absolute(ComparisonOp::LessThan, 1.0)),
                    ..GateDefinition::default()
                },
                variables: BTreeMap::new(),
            };
            let mut c = GateCheck::new(
                "WaveGate argocd/site-a",
                g.resolve(None).unwrap(),
                vars(&[("cluster", "c1")]),
            );
            c.owner_namespaced = namespaced;
            c
        };
        let cases = [
            (true, false, Some("InlinePromqlRefused")),
            (true, true, None),
            (false, false, None),
        ];
        for (namespaced, allow, want) in cases {
            let options = EngineOptions {
                allow_inline_promql_in_namespaced: allow,
                ..EngineOptions::default()
            };
            let p = plan(&[inline(namespaced)], &options, false);
            assert_eq!(
                p.checks[0].as_ref().err().map(CheckError::category),
                want,
                "{namespaced} {allow}"
            );
        }
    }

    #[test]
    fn planning_errors_name_the_gate_and_owner() {
        let mut c = service_check(0, BuiltinGate::ErrorRatioVsStable);
        c.vars.remove("namespace");
        let p = plan(&[c], &EngineOptions::default(), false);
        let err = p.checks[0].as_ref().unwrap_err();
        assert_eq!(err.category(), "MissingVariable");
        assert!(
            err.to_string().contains("Rollout shop/r0") && err.to_string().contains("namespace"),
            "{err}"
        );
    }

    /// A source answering range queries with counters growing by fixed per-interval counts per Service (the canary
    /// `svc<i>-canary` serves `canary` requests with `errors` 5xx, the stable 100× the requests
    /// with 1% 5xx), recording every range query.
    struct Counts {
        canary: f64,
        errors: f64,
        calls: std::sync::Mutex<Vec<(String, Timestamp, Timestamp, Duration)>>,
    }

    impl MetricsSource for Counts {
        async fn query(&self, _: &str, _: Timestamp) -> Result<Vec<SeriesValue>, SourceError> {
            Ok(Vec::new())
        }
        async fn query_range(
            &self,
            q: &str,
            start: Timestamp,
            end: Timestamp,
            step: Duration,
        ) -> Result<Vec<RangeValues>, SourceError> {
            self.calls
                .lock()
                .unwrap()
                .push((q.to_owned(), start, end, step));
            let step_ms = step.as_millis() as i64;
            let points = |v: f64| {
                let mut out = Vec::new();
                let mut t = start.as_millisecond();
                while t <= end.as_millisecond() {
                    // Counters: `v` per interval since the epoch.
                    out.push((t, v * (t / step_ms) as f64));
                    t += step_ms;
                }
                out
            };
            let mut series = Vec::new();
            for i in 0..3 {
                for (svc, requests, errors) in [
                    (format!("svc{i}-canary"), self.canary, self.errors),
                    (format!("svc{i}-stable"), self.canary * 100.0, self.canary),
                ] {
                    for (part, v) in [("requests", requests), ("errors", errors)] {
                        series.push(RangeValues {
                            labels: vars(&[
                                ("cluster", &format!("c{}", i % 3)),
                                ("destination_service_namespace", "shop"),
                                ("destination_service_name", &svc),
                                ("sluice_part", part),
                            ]),
                            points: points(v),
                        });
                    }
                }
            }
            Ok(series)
        }
    }

    fn ts(secs: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + secs).unwrap()
    }

    #[tokio::test]
    async fn sequential_checks_count_aligned_intervals_since_the_step_in_one_range_query() {
        let interval = Duration::from_secs(30);
        // The step began at +10 s; the tick is at +615 s: the intervals ending at +30 .. +600.
        let sequential = |mut c: GateCheck| {
            c.sequential = Some(SequentialScope {
                since: ts(10),
                interval,
                alpha: 0.0005,
            });
            c
        };
        let cases = [
            // (canary requests and 5xx per interval, verdict)
            ("healthy", 600.0, 6.0, Verdict::Pass),
            ("3x stable", 600.0, 18.0, Verdict::Fail),
            // B6: stable has 1% here, but one canary 5xx in 20 intervals is never a Fail.
            ("one canary 5xx", 600.0, 0.05, Verdict::Pass),
        ];
        for (name, canary, errors, want) in cases {
            let engine = Engine::new(
                Counts {
                    canary,
                    errors,
                    calls: Default::default(),
                },
                EngineOptions::default(),
            )
            .unwrap();
            let checks: Vec<GateCheck> = (0..3)
                .map(|i| sequential(service_check(i, BuiltinGate::ErrorRatioVsStable)))
                .collect();
            let report = engine.tick(&checks, ts(615)).await;
            assert_eq!(report.queries, 1, "{name}: one query for three Rollouts");
            let calls = engine.source().calls.lock().unwrap().clone();
            assert_eq!(calls.len(), 1);
            let (q, start, end, step) = &calls[0];
            assert!(
                !q.contains("increase"),
                "{name}: counters, read at instants: {q}"
            );
            assert_eq!(*step, interval);
            // Aligned on the 30 s grid (the epoch offset 1_800_000_000 is a multiple of 30), from
            // the reading before the first interval that ends in the step.
            assert_eq!((*start, *end), (ts(0), ts(600)), "{name}");
            for o in &report.outcomes {
                let v = o.verdict.as_ref().unwrap();
                assert_eq!(v.verdict, want, "{name}: {:?}", v.message);
                let m = v.message.as_ref().unwrap();
                let said = if want == Verdict::Fail {
                    "(detection delay 60s)"
                } else {
                    "over 20 intervals of 30s"
                };
                assert!(m.contains(said), "{name}: {m}");
            }
        }
    }

    #[tokio::test]
    async fn the_ticks_of_one_interval_share_one_range_query() {
        let interval = Duration::from_secs(30);
        let sequential = |mut c: GateCheck| {
            c.sequential = Some(SequentialScope {
                since: ts(10),
                interval,
                alpha: 0.0005,
            });
            c
        };
        let engine = Engine::new(
            Counts {
                canary: 600.0,
                errors: 18.0,
                calls: Default::default(),
            },
            EngineOptions::default(),
        )
        .unwrap();
        // Two Rollouts of one cluster: one group of queries.
        let check = |i| {
            let mut c = sequential(service_check(i, BuiltinGate::ErrorRatioVsStable));
            c.vars.insert("cluster".into(), "c0".into());
            c
        };
        let calls = || engine.source().calls.lock().unwrap().len();
        // Interval ending at +600: Rollouts 0 and 1 come in two ticks; each asks once.
        let first = engine.tick(&[check(0)], ts(605)).await;
        assert_eq!((first.queries, calls()), (1, 1));
        let second = engine.tick(&[check(1)], ts(606)).await;
        assert_eq!((second.queries, calls()), (1, 2), "a new Rollout asks once");
        // Its own Rollout again, later in the same interval: read from the first answer.
        let again = engine.tick(&[check(0), check(1)], ts(610)).await;
        assert_eq!((again.queries, calls()), (0, 2), "no query: same interval");
        let verdicts = |r: &TickReport| -> Vec<(Verdict, Option<f64>)> {
            r.outcomes
                .iter()
                .map(|o| {
                    let v = o.verdict.as_ref().unwrap();
                    (v.verdict, v.value)
                })
                .collect()
        };
        let mut both = verdicts(&first);
        both.extend(verdicts(&second));
        assert_eq!(verdicts(&again), both);
        // Next interval (ending at +630): the first tick asks for both Rollouts seen in the
        // interval before, so the second tick of that interval asks nothing.
        let next = engine.tick(&[check(1)], ts(631)).await;
        assert_eq!((next.queries, calls()), (1, 3));
        let q = engine.source().calls.lock().unwrap()[2].0.clone();
        assert!(
            q.contains("svc0-canary") && q.contains("svc1-canary"),
            "the interval's query covers every Rollout that asked in the one before: {q}"
        );
        let later = engine.tick(&[check(0)], ts(640)).await;
        assert_eq!((later.queries, calls()), (0, 3));
        assert_eq!(
            later.outcomes[0].verdict.as_ref().unwrap().verdict,
            Verdict::Fail
        );
    }

    /// A source of counters growing by fixed counts per interval (the canary `svc<i>-canary`
    /// 600 requests with 6 5xx, the stable 100× that), recording every range query. The
    /// readings at `late` (Unix ms) miss half of their last interval until it is cleared (a
    /// sample ingested after the first read of that instant); `yields` makes every answer
    /// arrive after the caller yielded once, so two ticks overlap.
    #[derive(Default)]
    struct Growing {
        late: std::sync::Mutex<Option<i64>>,
        yields: bool,
        calls: std::sync::Mutex<Vec<(Timestamp, Timestamp)>>,
    }

    impl MetricsSource for Growing {
        async fn query(&self, _: &str, _: Timestamp) -> Result<Vec<SeriesValue>, SourceError> {
            Ok(Vec::new())
        }
        async fn query_range(
            &self,
            q: &str,
            start: Timestamp,
            end: Timestamp,
            step: Duration,
        ) -> Result<Vec<RangeValues>, SourceError> {
            self.calls.lock().unwrap().push((start, end));
            if self.yields {
                tokio::task::yield_now().await;
            }
            let late = *self.late.lock().unwrap();
            let step_ms = step.as_millis() as i64;
            let points = |v: f64| {
                let mut out = Vec::new();
                let mut t = start.as_millisecond();
                while t <= end.as_millisecond() {
                    let missing = if late == Some(t) { 0.5 } else { 0.0 };
                    out.push((t, v * ((t / step_ms) as f64 - missing)));
                    t += step_ms;
                }
                out
            };
            let mut series = Vec::new();
            for i in 0..3 {
                for (svc, requests, errors) in [
                    (format!("svc{i}-canary"), 600.0, 6.0 + i as f64),
                    (format!("svc{i}-stable"), 60_000.0, 600.0),
                ] {
                    if !q.contains(&svc) {
                        continue;
                    }
                    for (part, v) in [("requests", requests), ("errors", errors)] {
                        series.push(RangeValues {
                            labels: vars(&[
                                ("cluster", &format!("c{}", i % 3)),
                                ("destination_service_namespace", "shop"),
                                ("destination_service_name", &svc),
                                ("sluice_part", part),
                            ]),
                            points: points(v),
                        });
                    }
                }
            }
            Ok(series)
        }
    }

    fn counted_check(i: usize, since: i64) -> GateCheck {
        let mut c = service_check(i, BuiltinGate::ErrorRatioVsStable);
        c.sequential = Some(SequentialScope {
            since: ts(since),
            interval: Duration::from_secs(30),
            alpha: 0.0005,
        });
        c
    }

    /// A verdict, value, baseline, samples and message.
    type Said = (
        Verdict,
        Option<f64>,
        Option<f64>,
        Option<u64>,
        Option<String>,
    );

    /// What a verdict says, without the time it was made.
    fn said(r: &TickReport) -> Vec<Said> {
        r.outcomes
            .iter()
            .map(|o| {
                let v = o.verdict.as_ref().unwrap();
                (v.verdict, v.value, v.baseline, v.samples, v.message.clone())
            })
            .collect()
    }

    /// The counts of a fresh engine reading the whole step at `now`.
    async fn full_read(checks: &[GateCheck], now: Timestamp) -> TickReport {
        let engine = Engine::new(Growing::default(), EngineOptions::default()).unwrap();
        let report = engine.tick(checks, now).await;
        let calls = engine.source().calls.lock().unwrap().clone();
        assert_eq!(calls.len(), 1);
        report
    }

    #[tokio::test]
    async fn a_later_tick_of_the_step_reads_only_the_intervals_not_yet_counted() {
        let engine = Engine::new(Growing::default(), EngineOptions::default()).unwrap();
        let calls = || engine.source().calls.lock().unwrap().clone();
        let checks = [counted_check(0, 10)];
        // First read of the step (begun at +10 s): every interval since, from the reading at +0.
        let first = engine.tick(&checks, ts(615)).await;
        assert_eq!(calls(), [(ts(0), ts(600))]);
        assert_eq!(said(&first), said(&full_read(&checks, ts(615)).await));
        // One interval later: the new interval and the last one counted again, nothing before.
        let second = engine.tick(&checks, ts(645)).await;
        assert_eq!(calls()[1], (ts(570), ts(630)));
        assert_eq!(said(&second), said(&full_read(&checks, ts(645)).await));
        // Two intervals later (a tick skipped): the two new ones and the last one counted.
        let third = engine.tick(&checks, ts(705)).await;
        assert_eq!(calls()[2], (ts(600), ts(690)));
        assert_eq!(said(&third), said(&full_read(&checks, ts(705)).await));
        assert!(
            said(&third)[0]
                .4
                .as_deref()
                .unwrap()
                .contains("over 23 intervals of 30s"),
            "{:?}",
            said(&third)
        );
    }

    #[tokio::test]
    async fn a_new_step_or_a_restarted_process_reads_from_the_step_start() {
        let engine = Engine::new(Growing::default(), EngineOptions::default()).unwrap();
        let calls = || engine.source().calls.lock().unwrap().clone();
        engine.tick(&[counted_check(0, 10)], ts(615)).await;
        engine.tick(&[counted_check(0, 10)], ts(645)).await;
        assert_eq!(calls()[1], (ts(570), ts(630)));
        // The next step began at +500: its counts start there, not where the last step's ended.
        let next_step = [counted_check(0, 500)];
        let report = engine.tick(&next_step, ts(675)).await;
        assert_eq!(calls()[2], (ts(480), ts(660)));
        assert_eq!(said(&report), said(&full_read(&next_step, ts(675)).await));
        // A new Rollout counted for the first time reads from its step's start in a query of its
        // own; the Rollout already counted keeps reading only the newest intervals.
        let both = [counted_check(0, 500), counted_check(1, 10)];
        let report = engine.tick(&both, ts(705)).await;
        let mut sent = calls()[3..].to_vec();
        sent.sort();
        assert_eq!(sent, [(ts(0), ts(690)), (ts(630), ts(690))]);
        assert_eq!(said(&report), said(&full_read(&both, ts(705)).await));
        // A restarted process remembers nothing: it reads from the step's start once.
        let restarted = Engine::new(Growing::default(), EngineOptions::default()).unwrap();
        restarted.tick(&next_step, ts(705)).await;
        restarted.tick(&next_step, ts(735)).await;
        assert_eq!(
            restarted.source().calls.lock().unwrap().clone(),
            [(ts(480), ts(690)), (ts(660), ts(720))]
        );
    }

    #[tokio::test]
    async fn a_reading_that_arrives_late_is_counted_as_a_full_read_counts_it() {
        let engine = Engine::new(Growing::default(), EngineOptions::default()).unwrap();
        let checks = [counted_check(0, 10)];
        // The reading at +600 misses half its interval when first read...
        *engine.source().late.lock().unwrap() = Some(ts(600).as_millisecond());
        let first = engine.tick(&checks, ts(615)).await;
        let short = said(&first)[0].3.unwrap();
        assert_eq!(short, 600 * 20 - 300, "{:?}", said(&first));
        // ...and is complete by the next tick: the interval ending there is counted again.
        *engine.source().late.lock().unwrap() = None;
        let second = engine.tick(&checks, ts(645)).await;
        assert_eq!(said(&second), said(&full_read(&checks, ts(645)).await));
        assert_eq!(said(&second)[0].3, Some(600 * 21));
    }

    #[tokio::test]
    async fn a_tick_overlapping_a_query_in_flight_waits_for_its_answer() {
        let engine = Engine::new(
            Growing {
                yields: true,
                ..Default::default()
            },
            EngineOptions::default(),
        )
        .unwrap();
        let one = [counted_check(0, 10)];
        let (a, b) = futures::join!(engine.tick(&one, ts(605)), engine.tick(&one, ts(606)));
        assert_eq!(engine.source().calls.lock().unwrap().len(), 1);
        assert_eq!((a.queries, b.queries), (1, 0));
        assert_eq!(said(&a), said(&b));
        // A tick needing more than the query in flight covers asks for the rest itself.
        let two = [counted_check(0, 10), counted_check(2, 10)];
        let (c, d) = futures::join!(engine.tick(&one, ts(635)), engine.tick(&two, ts(636)));
        assert_eq!(engine.source().calls.lock().unwrap().len(), 3);
        assert_eq!((c.queries, d.queries), (1, 1));
        assert_eq!(said(&c)[0], said(&d)[0]);
    }

    #[tokio::test]
    async fn without_a_scope_or_for_custom_templates_the_threshold_rule_applies() {
        let engine = Engine::new(
            Counts {
                canary: 600.0,
                errors: 6.0,
                calls: Default::default(),
            },
            EngineOptions::default(),
        )
        .unwrap();
        let plain = service_check(0, BuiltinGate::ErrorRatioVsStable);
        let mut absolute = service_check(1, BuiltinGate::ErrorRatioVsStable);
        absolute.gate.comparison = Comparison::absolute(ComparisonOp::LessOrEqual, 0.05);
        absolute.sequential = Some(SequentialScope {
            since: ts(0),
            interval: Duration::from_secs(30),
            alpha: 0.001,
        });
        let report = engine.tick(&[plain, absolute], ts(615)).await;
        assert!(engine.source().calls.lock().unwrap().is_empty());
        assert_eq!(report.outcomes.len(), 2);
        for o in &report.outcomes {
            // The instant query answers nothing here: the threshold rule says NoData.
            assert_eq!(
                o.verdict.as_ref().unwrap().reason,
                VerdictReason::NoData,
                "{o:?}"
            );
        }
    }

    /// Answers instant queries with the request counts of one canary and one stable Service.
    struct Shares;

    impl MetricsSource for Shares {
        async fn query(&self, _: &str, _: Timestamp) -> Result<Vec<SeriesValue>, SourceError> {
            Ok([("svc0-canary", 3.0), ("svc0-stable", 997.0)]
                .into_iter()
                .map(|(svc, v)| SeriesValue {
                    labels: vars(&[
                        ("cluster", "c0"),
                        ("destination_service_namespace", "shop"),
                        ("destination_service_name", svc),
                        ("sluice_part", "requests"),
                    ]),
                    value: v,
                })
                .collect())
        }
        async fn query_range(
            &self,
            _: &str,
            _: Timestamp,
            _: Timestamp,
            _: Duration,
        ) -> Result<Vec<RangeValues>, SourceError> {
            Ok(Vec::new())
        }
    }

    #[tokio::test]
    async fn an_absolute_comparison_on_the_applied_share_judges_the_share_not_the_count() {
        // B19: "the share fell to about 0" (≤ 1%) passed only on zero canary requests, and
        // "at least 4%" always passed on a count.
        let engine = Engine::new(Shares, EngineOptions::default()).unwrap();
        for (op, value, want) in [
            (ComparisonOp::LessOrEqual, 0.01, Verdict::Pass),
            (ComparisonOp::GreaterOrEqual, 0.04, Verdict::Inconclusive),
        ] {
            let mut c = service_check(0, BuiltinGate::AppliedShare);
            c.gate.comparison = Comparison::absolute(op, value);
            c.gate.consecutive_failures = 2;
            let report = engine.tick(&[c], ts(615)).await;
            let v = report.outcomes[0].verdict.as_ref().unwrap();
            assert_eq!(v.verdict, want, "{op:?} {value}: {:?}", v.message);
            assert_eq!(v.value, Some(0.003), "{op:?} {value}");
        }
    }

    #[test]
    fn split_table() {
        let s = |pairs: &[(&str, &str)], value: f64| SeriesValue {
            labels: vars(pairs),
            value,
        };
        let series = vec![
            s(&[("cluster", "a"), ("sluice_part", "requests")], 10.0),
            s(&[("cluster", "a"), ("sluice_part", "errors")], 1.0),
            s(&[("cluster", "b")], 5.0),
            s(&[("cluster", "b")], 2.0),
            s(&[("other", "x")], 99.0),
        ];
        let got = split(&series, &["cluster".to_string()]);
        assert_eq!(got.len(), 2);
        assert_eq!(got[&vec!["a".to_string()]]["requests"], 10.0);
        assert_eq!(got[&vec!["a".to_string()]]["errors"], 1.0);
        assert_eq!(got[&vec!["b".to_string()]]["value"], 7.0);
    }

    #[test]
    fn bad_cluster_label_is_refused() {
        struct Never;
        impl MetricsSource for Never {
            async fn query(&self, _: &str, _: Timestamp) -> Result<Vec<SeriesValue>, SourceError> {
                Ok(Vec::new())
            }
            async fn query_range(
                &self,
                _: &str,
                _: Timestamp,
                _: Timestamp,
                _: Duration,
            ) -> Result<Vec<RangeValues>, SourceError> {
                Ok(Vec::new())
            }
        }
        for (label, ok) in [
            ("cluster", true),
            ("k8s_cluster", true),
            ("9x", false),
            ("a-b", false),
            ("", false),
        ] {
            let options = EngineOptions {
                cluster_label: label.into(),
                ..EngineOptions::default()
            };
            assert_eq!(Engine::new(Never, options).is_ok(), ok, "{label}");
        }
    }
}
