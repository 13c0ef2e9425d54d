//! The gate model: how an owner object (Rollout, WaveGate, RevisionUpgrade) declares a metric
//! check, and the verdicts and captured baselines the operators record in status.
//!
//! Owns the wire shape of gates, verdicts and baselines plus pure helpers (template resolution,
//! `{{variable}}` discovery, the share-check sample minimum). Never queries a metrics provider,
//! never renders PromQL with values, and never reads the clock: the analysis engine does that.

use std::collections::BTreeMap;
use std::fmt;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::common::DurationString;
use super::gate_template::GateTemplateSpec;

/// Template variables the operators fill in from the owner object. Any other `{{name}}` in a
/// PromQL template must be supplied in the gate's `variables`.
pub const KNOWN_VARIABLES: &[&str] = &[
    "service",
    "namespace",
    "cluster",
    "version",
    "route",
    "revision",
    "stableService",
    "canaryService",
    "stableVersion",
    "canaryVersion",
    "site",
    "wave",
    "tag",
    "commit",
    "window",
];

/// Default evaluation window of a gate (`rate()` range): 2m, at least four 30 s scrapes.
pub const DEFAULT_WINDOW: &str = "2m";
/// Default interval between two evaluations of a gate.
pub const DEFAULT_INTERVAL: &str = "30s";
/// Default minimum number of samples (requests, proxies, ...) in the window.
pub const DEFAULT_MIN_SAMPLES: u64 = 100;
/// Default number of consecutive failing evaluations before the verdict is Fail.
pub const DEFAULT_CONSECUTIVE_FAILURES: u32 = 2;
/// Default time after which a continuously Inconclusive gate is "sustained".
pub const DEFAULT_INCONCLUSIVE_AFTER: &str = "5m";
/// Default relative tolerance of a share check (0.2 = ±20% of the target share).
pub const DEFAULT_SHARE_TOLERANCE: f64 = 0.2;
/// z-score used by [`share_min_samples`] (≈95% two-sided confidence).
pub const SHARE_CONFIDENCE_Z: f64 = 1.96;

/// A built-in gate: a PromQL query on Istio's standard metrics shipped with sluice.
///
/// The analysis engine owns the PromQL of each; the variant names are stable API.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize, JsonSchema,
)]
#[schemars(transform = super::common::drop_type_description)]
pub enum BuiltinGate {
    /// Share of the route's requests that reached the canary backend, as seen by the source or
    /// gateway reporter (mirrored copies never count). Use with a `share` comparison.
    AppliedShare,
    /// 5xx ratio of the canary version relative to the stable version.
    ErrorRatioVsStable,
    /// p99 request duration of the canary version relative to the stable version (histogram).
    LatencyP99VsStable,
    /// Mesh-attributed error ratio (Envoy response flags, `failure_origin` when present).
    MeshErrorRatio,
    /// Increase of xDS NACKs reported by istiod over the window.
    XdsNackIncrease,
    /// Number of proxies still on the previous configuration revision (drift exporter).
    ProxiesBehind,
    /// Number of proxies per Istio revision (injector-recorded revision).
    ProxiesPerRevision,
    /// Rate of workload certificate (SVID) issuance, per second.
    SvidIssuanceRate,
}

impl BuiltinGate {
    /// Every built-in gate, in declaration order.
    pub const ALL: [BuiltinGate; 8] = [
        BuiltinGate::AppliedShare,
        BuiltinGate::ErrorRatioVsStable,
        BuiltinGate::LatencyP99VsStable,
        BuiltinGate::MeshErrorRatio,
        BuiltinGate::XdsNackIncrease,
        BuiltinGate::ProxiesBehind,
        BuiltinGate::ProxiesPerRevision,
        BuiltinGate::SvidIssuanceRate,
    ];

    /// The stable wire name (also the metric label value).
    pub fn as_str(self) -> &'static str {
        match self {
            BuiltinGate::AppliedShare => "AppliedShare",
            BuiltinGate::ErrorRatioVsStable => "ErrorRatioVsStable",
            BuiltinGate::LatencyP99VsStable => "LatencyP99VsStable",
            BuiltinGate::MeshErrorRatio => "MeshErrorRatio",
            BuiltinGate::XdsNackIncrease => "XdsNackIncrease",
            BuiltinGate::ProxiesBehind => "ProxiesBehind",
            BuiltinGate::ProxiesPerRevision => "ProxiesPerRevision",
            BuiltinGate::SvidIssuanceRate => "SvidIssuanceRate",
        }
    }
}

impl fmt::Display for BuiltinGate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// How a value is compared to a threshold. The value passes when `value <op> threshold` holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[schemars(transform = super::common::drop_type_description)]
pub enum ComparisonOp {
    /// Pass when the value is strictly below the threshold.
    LessThan,
    /// Pass when the value is below or equal to the threshold.
    LessOrEqual,
    /// Pass when the value is strictly above the threshold.
    GreaterThan,
    /// Pass when the value is above or equal to the threshold.
    GreaterOrEqual,
}

impl ComparisonOp {
    /// Whether `value <op> threshold` holds (false for NaN).
    pub fn passes(self, value: f64, threshold: f64) -> bool {
        match self {
            ComparisonOp::LessThan => value < threshold,
            ComparisonOp::LessOrEqual => value <= threshold,
            ComparisonOp::GreaterThan => value > threshold,
            ComparisonOp::GreaterOrEqual => value >= threshold,
        }
    }
}

/// Where the baseline of a relative comparison comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[schemars(transform = super::common::drop_type_description)]
pub enum BaselineSource {
    /// The same series for the stable version, over the same window, now.
    StableNow,
    /// The same series over a window ending when the change started, captured once into the
    /// owner's status (`capturedBaselines`) so it survives restarts and can be batched.
    PreChangeWindow,
}

/// An absolute threshold: pass when `value <op> value`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AbsoluteComparison {
    /// Comparison operator: LessThan, LessOrEqual, GreaterThan or GreaterOrEqual.
    pub op: ComparisonOp,
    /// Threshold, in the unit of the query's result (a ratio 0..1, seconds, a count, per second).
    pub value: f64,
}

/// A threshold relative to a baseline: pass when `value <op> factor × baseline`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RelativeComparison {
    /// Comparison operator. Default: LessOrEqual (the canary may be at most `factor` times worse).
    #[serde(default = "default_relative_op")]
    pub op: ComparisonOp,
    /// Baseline source: StableNow or PreChangeWindow. Default: StableNow.
    #[serde(default = "default_baseline_source")]
    pub baseline: BaselineSource,
    /// Multiplier applied to the baseline (e.g. 1.5 for "at most 1.5× stable"). Default: 1.0.
    #[serde(default = "default_factor")]
    #[schemars(range(min = 0.0))]
    pub factor: f64,
    /// Absolute floor added to the threshold so a near-zero baseline does not fail on noise,
    /// in the query's unit: threshold = factor × baseline + slack. Default: 0.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0.0))]
    pub slack: Option<f64>,
}

fn default_relative_op() -> ComparisonOp {
    ComparisonOp::LessOrEqual
}
fn default_baseline_source() -> BaselineSource {
    BaselineSource::StableNow
}
fn default_factor() -> f64 {
    1.0
}

/// A share check: pass when the observed share is within a relative tolerance of the target the
/// owner supplies (a Rollout's desired weight). The minimum sample count follows from the
/// target and the tolerance (see [`share_min_samples`]).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ShareComparison {
    /// Relative tolerance around the target share, in percent of the target (20 = ±20%).
    /// Absent: the owner's setting (a Rollout's `appliedShareTolerancePercent`, default 20).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 100))]
    pub tolerance_percent: Option<u32>,
}

/// How a gate's value is judged. Exactly one of `absolute`, `relative` or `share` is set.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [{
    "rule": "(has(self.absolute) ? 1 : 0) + (has(self.relative) ? 1 : 0) + (has(self.share) ? 1 : 0) == 1",
    "message": "set exactly one of absolute, relative or share"
}]))]
pub struct Comparison {
    /// Absolute threshold: pass when value <op> threshold.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub absolute: Option<AbsoluteComparison>,
    /// Threshold relative to a baseline: pass when value <op> factor × baseline (+ slack).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub relative: Option<RelativeComparison>,
    /// Share check: pass when the share is within the tolerance of the owner's target.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub share: Option<ShareComparison>,
}

impl Comparison {
    /// An absolute comparison.
    pub fn absolute(op: ComparisonOp, value: f64) -> Self {
        Self {
            absolute: Some(AbsoluteComparison { op, value }),
            relative: None,
            share: None,
        }
    }

    /// A relative comparison (`value <= factor × baseline`).
    pub fn relative(baseline: BaselineSource, factor: f64) -> Self {
        Self {
            absolute: None,
            relative: Some(RelativeComparison {
                op: ComparisonOp::LessOrEqual,
                baseline,
                factor,
                slack: None,
            }),
            share: None,
        }
    }

    /// A share comparison with the owner's tolerance.
    pub fn share() -> Self {
        Self {
            absolute: None,
            relative: None,
            share: Some(ShareComparison {
                tolerance_percent: None,
            }),
        }
    }
}

/// What a sustained Inconclusive verdict does.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[schemars(transform = super::common::drop_type_description)]
pub enum InconclusiveAction {
    /// Hold the current step or wave until the gate passes or a person acts (the default).
    #[default]
    Pause,
    /// Abort, as on a Fail.
    Abort,
    /// Treat the gate as passed once it has been Inconclusive for `after` (use for gates on
    /// low-traffic services where "no news" is acceptable after a bound).
    Continue,
}

/// The policy for a gate that stays Inconclusive (no data, too few samples, query errors).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct InconclusivePolicy {
    /// What to do: Pause (default), Abort, or Continue.
    #[serde(default)]
    pub action: InconclusiveAction,
    /// How long a gate must stay continuously Inconclusive before `action` applies. Default: 5m.
    #[serde(default = "default_inconclusive_after")]
    pub after: DurationString,
}

fn default_inconclusive_after() -> DurationString {
    DurationString::new(DEFAULT_INCONCLUSIVE_AFTER)
}

impl Default for InconclusivePolicy {
    fn default() -> Self {
        Self {
            action: InconclusiveAction::Pause,
            after: default_inconclusive_after(),
        }
    }
}

/// The definition of a check: what to query and how to judge it. Shared by inline gates and
/// `GateTemplate`s. Every field is optional so that a gate referencing a template can override
/// only what it needs; defaults apply after resolution ([`Gate::resolve`]).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct GateDefinition {
    /// PromQL template. `{{name}}` placeholders are replaced by escaped label values (service,
    /// namespace, cluster, version, route, revision, stableService, canaryService, site, wave,
    /// tag, commit, window, or a key of `variables`). Must return one series (or one per
    /// batched object). Free-form PromQL in namespaced objects is refused unless the platform
    /// enables it; prefer a GateTemplate. Exclusive with `builtin`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 4096))]
    pub promql: Option<String>,
    /// A built-in gate on Istio's standard metrics. Exclusive with `promql`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub builtin: Option<BuiltinGate>,
    /// How the value is judged. Default for built-in gates: see each gate's documentation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub comparison: Option<Comparison>,
    /// Range of the query (`rate()` window); at least four scrape intervals. Default: 2m.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub window: Option<DurationString>,
    /// Minimum number of samples (requests, proxies) in the window; below it the verdict is
    /// Inconclusive (TooFewSamples). For share checks the effective minimum is the larger of this
    /// and the one derived from target and tolerance. Default: 100.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub min_samples: Option<u64>,
    /// Number of consecutive failing evaluations before the verdict is Fail. Default: 2.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 100))]
    pub consecutive_failures: Option<u32>,
    /// What a sustained Inconclusive does. Default: Pause after 5m.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub inconclusive: Option<InconclusivePolicy>,
    /// Time between evaluations. Default: the owner's analysis interval (30s).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interval: Option<DurationString>,
}

/// A gate on an owner object: references a cluster-scoped GateTemplate by name, or is defined
/// inline (`promql` or `builtin`). Fields set beside `templateRef` override the template's.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [{
    "rule": "(has(self.templateRef) ? 1 : 0) + (has(self.promql) ? 1 : 0) + (has(self.builtin) ? 1 : 0) == 1",
    "message": "set exactly one of templateRef, promql or builtin"
}]))]
pub struct Gate {
    /// Name of the gate, unique within the owner; verdicts in status are keyed by it.
    #[schemars(
        length(min = 1, max = 63),
        regex(pattern = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
    )]
    pub name: String,
    /// Name of a cluster-scoped GateTemplate to use. Exclusive with `promql` and `builtin`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253))]
    pub template_ref: Option<String>,
    /// The inline definition, or overrides of the template's.
    #[serde(flatten)]
    pub definition: GateDefinition,
    /// Extra static template variables (`{{key}}`), escaped like every other value.
    /// At most 16 entries; keys are lowerCamelCase identifiers.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(schema_with = "super::common::variables_schema")]
    pub variables: BTreeMap<String, String>,
}

/// What a resolved gate queries.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum GateQuery {
    /// A PromQL template with `{{variable}}` placeholders.
    PromQl(String),
    /// A built-in gate.
    Builtin(BuiltinGate),
}

/// A gate with its template applied and every default filled in: what the engine evaluates.
#[derive(Clone, Debug, PartialEq)]
pub struct ResolvedGate {
    /// The gate's name in its owner.
    pub name: String,
    /// Name of the template it came from, if any (used for batching).
    pub template: Option<String>,
    /// What to query.
    pub query: GateQuery,
    /// How to judge the value.
    pub comparison: Comparison,
    /// Query range.
    pub window: std::time::Duration,
    /// Minimum samples below which the verdict is Inconclusive.
    pub min_samples: u64,
    /// Consecutive failures before Fail.
    pub consecutive_failures: u32,
    /// What a sustained Inconclusive does.
    pub inconclusive_action: InconclusiveAction,
    /// How long Inconclusive must last to be sustained.
    pub inconclusive_after: std::time::Duration,
    /// Interval between evaluations; `None` means the owner's interval.
    pub interval: Option<std::time::Duration>,
    /// Extra static variables.
    pub variables: BTreeMap<String, String>,
}

/// Why a gate could not be resolved.
#[derive(Clone, Debug, PartialEq, Eq, strum::IntoStaticStr)]
pub enum GateResolveError {
    /// `templateRef` names a template that was not supplied.
    TemplateMissing {
        /// The gate.
        gate: String,
        /// The template it names.
        template: String,
    },
    /// Neither the gate nor its template says what to query.
    NoQuery {
        /// The gate.
        gate: String,
    },
    /// Both `promql` and `builtin` are set.
    AmbiguousQuery {
        /// The gate.
        gate: String,
    },
    /// No comparison and the built-in gate has no default one.
    NoComparison {
        /// The gate.
        gate: String,
    },
    /// A duration field does not parse.
    BadDuration {
        /// The gate.
        gate: String,
        /// The field (`window`, `interval`, `inconclusive.after`).
        field: &'static str,
        /// The parser's message.
        message: String,
    },
}

impl GateResolveError {
    /// A bounded category for metrics labels and Event reasons.
    pub fn category(&self) -> &'static str {
        self.into()
    }
}

impl fmt::Display for GateResolveError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            GateResolveError::TemplateMissing { gate, template } => write!(
                f,
                "gate {gate:?} references GateTemplate {template:?}, which does not exist; create it or fix templateRef"
            ),
            GateResolveError::NoQuery { gate } => write!(
                f,
                "gate {gate:?} has no query: set promql or builtin on the gate or its template"
            ),
            GateResolveError::AmbiguousQuery { gate } => {
                write!(f, "gate {gate:?} sets both promql and builtin; keep one")
            }
            GateResolveError::NoComparison { gate } => write!(
                f,
                "gate {gate:?} has no comparison and its query has no default one; set comparison"
            ),
            GateResolveError::BadDuration {
                gate,
                field,
                message,
            } => write!(f, "gate {gate:?} field {field}: {message}"),
        }
    }
}

impl std::error::Error for GateResolveError {}

impl BuiltinGate {
    /// The comparison a built-in gate uses when the gate sets none (the design's figures:
    /// share within tolerance; 5xx ≤ 1.5× stable; p99 ≤ 1.3× stable; mesh error ratio ≤ 1%;
    /// no NACK increase; no proxy behind). `ProxiesPerRevision` and `SvidIssuanceRate` are
    /// readings without a default judgement.
    pub fn default_comparison(self) -> Option<Comparison> {
        match self {
            BuiltinGate::AppliedShare => Some(Comparison::share()),
            BuiltinGate::ErrorRatioVsStable => {
                Some(Comparison::relative(BaselineSource::StableNow, 1.5))
            }
            BuiltinGate::LatencyP99VsStable => {
                Some(Comparison::relative(BaselineSource::StableNow, 1.3))
            }
            BuiltinGate::MeshErrorRatio => {
                Some(Comparison::absolute(ComparisonOp::LessOrEqual, 0.01))
            }
            BuiltinGate::XdsNackIncrease => {
                Some(Comparison::absolute(ComparisonOp::LessOrEqual, 0.0))
            }
            BuiltinGate::ProxiesBehind => {
                Some(Comparison::absolute(ComparisonOp::LessOrEqual, 0.0))
            }
            BuiltinGate::ProxiesPerRevision | BuiltinGate::SvidIssuanceRate => None,
        }
    }
}

fn parse_field(
    gate: &str,
    field: &'static str,
    d: &DurationString,
) -> Result<std::time::Duration, GateResolveError> {
    d.parse().map_err(|e| GateResolveError::BadDuration {
        gate: gate.to_owned(),
        field,
        message: e.to_string(),
    })
}

impl Gate {
    /// An inline built-in gate with its default comparison.
    pub fn builtin(name: impl Into<String>, builtin: BuiltinGate) -> Self {
        Self {
            name: name.into(),
            template_ref: None,
            definition: GateDefinition {
                builtin: Some(builtin),
                ..GateDefinition::default()
            },
            variables: BTreeMap::new(),
        }
    }

    /// The fields this gate sets beside `templateRef` that `template` refuses because it is
    /// `locked` (empty when it is not locked, or the gate names no template), in the API's
    /// spelling.
    pub fn locked_overrides(&self, template: Option<&GateTemplateSpec>) -> Vec<&'static str> {
        if self.template_ref.is_none() || !template.is_some_and(|t| t.locked) {
            return Vec::new();
        }
        let d = &self.definition;
        [
            ("promql", d.promql.is_some()),
            ("builtin", d.builtin.is_some()),
            ("comparison", d.comparison.is_some()),
            ("window", d.window.is_some()),
            ("minSamples", d.min_samples.is_some()),
            ("consecutiveFailures", d.consecutive_failures.is_some()),
            ("inconclusive", d.inconclusive.is_some()),
            ("interval", d.interval.is_some()),
            ("variables", !self.variables.is_empty()),
        ]
        .into_iter()
        .filter_map(|(field, set)| set.then_some(field))
        .collect()
    }

    /// Applies `template` (the GateTemplate named by `templateRef`, looked up by the caller) and
    /// fills in defaults; a `locked` template's fields apply as they are, whatever the gate sets.
    /// Pure: the caller supplies the template.
    pub fn resolve(
        &self,
        template: Option<&GateTemplateSpec>,
    ) -> Result<ResolvedGate, GateResolveError> {
        let base: GateDefinition = match (&self.template_ref, template) {
            (Some(name), None) => {
                return Err(GateResolveError::TemplateMissing {
                    gate: self.name.clone(),
                    template: name.clone(),
                });
            }
            (Some(_), Some(t)) => t.definition.clone(),
            (None, _) => GateDefinition::default(),
        };
        // A locked template is the platform's gate: nothing the gate sets beside `templateRef`
        // applies (see `locked_overrides`, which the owner reports).
        let locked = template.is_some_and(|t| t.locked) && self.template_ref.is_some();
        let none = GateDefinition::default();
        let d = if locked { &none } else { &self.definition };
        let promql = if d.promql.is_some() || d.builtin.is_some() {
            d.promql.clone()
        } else {
            base.promql.clone()
        };
        let builtin = if d.promql.is_some() || d.builtin.is_some() {
            d.builtin
        } else {
            base.builtin
        };
        let query = match (promql, builtin) {
            (Some(_), Some(_)) => {
                return Err(GateResolveError::AmbiguousQuery {
                    gate: self.name.clone(),
                });
            }
            (Some(q), None) => GateQuery::PromQl(q),
            (None, Some(b)) => GateQuery::Builtin(b),
            (None, None) => {
                return Err(GateResolveError::NoQuery {
                    gate: self.name.clone(),
                });
            }
        };
        let comparison = d
            .comparison
            .clone()
            .or(base.comparison.clone())
            .or_else(|| match &query {
                GateQuery::Builtin(b) => b.default_comparison(),
                GateQuery::PromQl(_) => None,
            })
            .ok_or_else(|| GateResolveError::NoComparison {
                gate: self.name.clone(),
            })?;
        let window = d
            .window
            .clone()
            .or(base.window.clone())
            .unwrap_or_else(|| DurationString::new(DEFAULT_WINDOW));
        let window = parse_field(&self.name, "window", &window)?;
        let interval = match d.interval.as_ref().or(base.interval.as_ref()) {
            Some(i) => Some(parse_field(&self.name, "interval", i)?),
            None => None,
        };
        let policy = d
            .inconclusive
            .clone()
            .or(base.inconclusive.clone())
            .unwrap_or_default();
        let inconclusive_after = parse_field(&self.name, "inconclusive.after", &policy.after)?;
        let mut variables = template.map(|t| t.variables.clone()).unwrap_or_default();
        if !locked {
            variables.extend(self.variables.clone());
        }
        Ok(ResolvedGate {
            name: self.name.clone(),
            template: self.template_ref.clone(),
            query,
            comparison,
            window,
            min_samples: d
                .min_samples
                .or(base.min_samples)
                .unwrap_or(DEFAULT_MIN_SAMPLES),
            consecutive_failures: d
                .consecutive_failures
                .or(base.consecutive_failures)
                .unwrap_or(DEFAULT_CONSECUTIVE_FAILURES),
            inconclusive_action: policy.action,
            inconclusive_after,
            interval,
            variables,
        })
    }
}

/// The smallest number of requests in a window for which a share estimate is within a relative
/// `tolerance` of `target` with ≈95% confidence (normal approximation of a binomial):
/// `n ≥ z² (1 − p) / (p t²)`. A 1% target at ±20% needs ~9,500 requests; 50% needs ~100.
/// Returns `u64::MAX` for a target of 0 (a zero share cannot be estimated relatively) and 0 for
/// a target of 1 or more.
pub fn share_min_samples(target: f64, tolerance: f64) -> u64 {
    if target.is_nan() || tolerance.is_nan() || target <= 0.0 || tolerance <= 0.0 {
        return u64::MAX;
    }
    if target >= 1.0 {
        return 0;
    }
    let n =
        SHARE_CONFIDENCE_Z * SHARE_CONFIDENCE_Z * (1.0 - target) / (target * tolerance * tolerance);
    n.ceil() as u64
}

/// Every distinct `{{name}}` placeholder in a PromQL template, in order of first appearance.
/// Whitespace inside the braces is ignored (`{{ service }}` is `service`).
pub fn template_variables(promql: &str) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    let mut rest = promql;
    while let Some(start) = rest.find("{{") {
        let after = &rest[start + 2..];
        let Some(end) = after.find("}}") else { break };
        let name = after[..end].trim().to_owned();
        if !out.contains(&name) {
            out.push(name);
        }
        rest = &after[end + 2..];
    }
    out
}

/// The outcome of one gate evaluation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[schemars(transform = super::common::drop_type_description)]
pub enum Verdict {
    /// The check held with enough samples.
    Pass,
    /// The check was breached for `consecutiveFailures` evaluations in a row.
    Fail,
    /// No judgement possible: no data, too few samples, a query error or timeout. Never a Pass.
    Inconclusive,
}

/// Why a gate has its verdict. Stable CamelCase values: dashboards and alerts key on them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[schemars(transform = super::common::drop_type_description)]
pub enum VerdictReason {
    /// The value met the threshold (Pass).
    ThresholdMet,
    /// The value breached the threshold (Fail, or Inconclusive while consecutive failures are
    /// still below the limit).
    ThresholdBreached,
    /// The share was within tolerance of the target (Pass).
    WithinTolerance,
    /// The share was outside the tolerance of the target.
    OutsideTolerance,
    /// The query returned an empty result.
    NoData,
    /// Fewer samples than the minimum were seen in the window.
    TooFewSamples,
    /// The provider returned an error or an unusable result.
    QueryError,
    /// The provider did not answer in time.
    Timeout,
    /// The baseline series had no data, so a relative comparison was impossible.
    BaselineMissing,
    /// The gate is not evaluated: its signal is declared absent (e.g. `exporter: None`).
    /// Reported, never counted as a Pass by the operators.
    Skipped,
    /// The gate has not been evaluated yet in this step or wave.
    Pending,
}

impl VerdictReason {
    /// The stable wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            VerdictReason::ThresholdMet => "ThresholdMet",
            VerdictReason::ThresholdBreached => "ThresholdBreached",
            VerdictReason::WithinTolerance => "WithinTolerance",
            VerdictReason::OutsideTolerance => "OutsideTolerance",
            VerdictReason::NoData => "NoData",
            VerdictReason::TooFewSamples => "TooFewSamples",
            VerdictReason::QueryError => "QueryError",
            VerdictReason::Timeout => "Timeout",
            VerdictReason::BaselineMissing => "BaselineMissing",
            VerdictReason::Skipped => "Skipped",
            VerdictReason::Pending => "Pending",
        }
    }
}

/// The latest verdict of one gate, as recorded in the owner's status.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct GateVerdict {
    /// Name of the gate (matches `spec.gates[].name`, or a built-in gate the operator adds).
    #[schemars(length(max = 63))]
    pub gate: String,
    /// Pass, Fail or Inconclusive.
    pub verdict: Verdict,
    /// Why: ThresholdMet, ThresholdBreached, WithinTolerance, OutsideTolerance, NoData,
    /// TooFewSamples, QueryError, Timeout, BaselineMissing, Skipped or Pending.
    pub reason: VerdictReason,
    /// Human-readable detail (values, the query error), at most 1024 characters.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 1024))]
    pub message: Option<String>,
    /// The value seen, in the query's unit (ratio, seconds, count, per second).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<f64>,
    /// The baseline value for relative comparisons, in the same unit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub baseline: Option<f64>,
    /// The effective threshold the value was compared to (absolute, or factor × baseline, or
    /// the share target).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub threshold: Option<f64>,
    /// Samples (requests, proxies) seen in the window.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub samples: Option<u64>,
    /// Minimum samples required for a judgement (for share checks, derived from the target).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_samples: Option<u64>,
    /// Number of consecutive failing evaluations so far.
    #[serde(default)]
    pub consecutive_failures: u32,
    /// When the gate became continuously Inconclusive (absent when it is not).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub inconclusive_since: Option<Time>,
    /// When this verdict was computed.
    pub evaluated_at: Time,
}

impl GateVerdict {
    /// The verdict `verdict` of `gate` for `reason` at `evaluated_at`, with no message, figures
    /// or streak yet: what a judgement fills in, field by field.
    pub fn new(
        gate: impl Into<String>,
        verdict: Verdict,
        reason: VerdictReason,
        evaluated_at: Time,
    ) -> Self {
        GateVerdict {
            gate: gate.into(),
            verdict,
            reason,
            message: None,
            value: None,
            baseline: None,
            threshold: None,
            samples: None,
            min_samples: None,
            consecutive_failures: 0,
            inconclusive_since: None,
            evaluated_at,
        }
    }
}

/// A baseline captured once from a pre-change window, kept in status so it survives restarts
/// and can be batched.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CapturedBaseline {
    /// Name of the gate the baseline belongs to.
    #[schemars(length(max = 63))]
    pub gate: String,
    /// The part of the owner the gate judges separately, when it judges several (a
    /// RevisionUpgrade's gate naming `{{namespace}}`: the namespace). `None`: the whole owner.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 253))]
    pub scope: Option<String>,
    /// The baseline value, in the query's unit.
    pub value: f64,
    /// Samples seen in the baseline window.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub samples: Option<u64>,
    /// Start of the baseline window.
    pub window_start: Time,
    /// End of the baseline window (the change's start).
    pub window_end: Time,
    /// When the baseline was captured.
    pub captured_at: Time,
}

/// Returns the verdict for `gate` in a list of verdicts.
pub fn find_verdict<'a>(verdicts: &'a [GateVerdict], gate: &str) -> Option<&'a GateVerdict> {
    verdicts.iter().find(|v| v.gate == gate)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn template_def() -> GateDefinition {
        GateDefinition {
            promql: Some("sum(rate(x{svc=\"{{service}}\"}[{{window}}]))".into()),
            comparison: Some(Comparison::absolute(ComparisonOp::LessThan, 0.5)),
            window: Some("5m".into()),
            min_samples: Some(10),
            consecutive_failures: Some(3),
            ..GateDefinition::default()
        }
    }

    #[test]
    fn a_locked_template_applies_as_it_is_and_names_each_refused_override() {
        let locked = GateTemplateSpec {
            description: None,
            definition: template_def(),
            variables: [("job".to_owned(), "mesh".to_owned())].into(),
            locked: true,
        };
        let weakened = Gate {
            name: "platform-errors".into(),
            template_ref: Some("platform-5xx".into()),
            definition: GateDefinition {
                comparison: Some(Comparison::absolute(ComparisonOp::LessThan, 50.0)),
                window: Some("1h".into()),
                min_samples: Some(1_000_000),
                inconclusive: Some(InconclusivePolicy {
                    action: InconclusiveAction::Continue,
                    after: DurationString::new("1s"),
                }),
                ..GateDefinition::default()
            },
            variables: [("job".to_owned(), "other".to_owned())].into(),
        };
        assert_eq!(
            weakened.locked_overrides(Some(&locked)),
            vec![
                "comparison",
                "window",
                "minSamples",
                "inconclusive",
                "variables"
            ]
        );
        let r = weakened.resolve(Some(&locked)).unwrap();
        assert_eq!(
            r.comparison,
            Comparison::absolute(ComparisonOp::LessThan, 0.5)
        );
        assert_eq!(r.window, std::time::Duration::from_secs(300));
        assert_eq!(r.min_samples, 10);
        assert_eq!(r.consecutive_failures, 3);
        assert_eq!(r.inconclusive_action, InconclusiveAction::Pause);
        assert_eq!(r.variables.get("job").map(String::as_str), Some("mesh"));
        // Unlocked, the same gate overrides; a gate setting only its name and templateRef
        // overrides nothing.
        let open = GateTemplateSpec {
            locked: false,
            ..locked.clone()
        };
        assert!(weakened.locked_overrides(Some(&open)).is_empty());
        assert_eq!(
            weakened.resolve(Some(&open)).unwrap().min_samples,
            1_000_000
        );
        let plain = Gate {
            definition: GateDefinition::default(),
            variables: BTreeMap::new(),
            ..weakened
        };
        assert!(plain.locked_overrides(Some(&locked)).is_empty());
    }

    #[test]
    fn resolve_table() {
        let tdef = template_def();
        let tvars: BTreeMap<String, String> = [("job".to_owned(), "mesh".to_owned())].into();
        let tview = GateTemplateSpec {
            description: None,
            definition: tdef,
            variables: tvars,
            locked: false,
        };
        let by_ref = Gate {
            name: "g".into(),
            template_ref: Some("t".into()),
            definition: GateDefinition {
                window: Some("1m".into()),
                ..GateDefinition::default()
            },
            variables: BTreeMap::new(),
        };
        // Template supplies query, comparison, minimum; the gate overrides window.
        let r = by_ref.resolve(Some(&tview)).unwrap();
        assert_eq!(r.window, std::time::Duration::from_secs(60));
        assert_eq!(r.min_samples, 10);
        assert_eq!(r.consecutive_failures, 3);
        assert!(matches!(r.query, GateQuery::PromQl(_)));
        assert_eq!(r.variables.get("job").map(String::as_str), Some("mesh"));
        assert_eq!(r.template.as_deref(), Some("t"));
        // A missing template is an error naming it.
        let e = by_ref.resolve(None).unwrap_err();
        assert_eq!(e.category(), "TemplateMissing");
        assert!(e.to_string().contains("\"t\""));

        // Built-in gate gets defaults.
        let b = Gate::builtin("err", BuiltinGate::ErrorRatioVsStable)
            .resolve(None)
            .unwrap();
        assert_eq!(b.window, std::time::Duration::from_secs(120));
        assert_eq!(b.min_samples, DEFAULT_MIN_SAMPLES);
        assert_eq!(b.consecutive_failures, DEFAULT_CONSECUTIVE_FAILURES);
        assert_eq!(b.inconclusive_action, InconclusiveAction::Pause);
        assert_eq!(b.inconclusive_after, std::time::Duration::from_secs(300));
        assert_eq!(b.comparison.relative.as_ref().map(|r| r.factor), Some(1.5));

        // Readings without a default comparison need one.
        let e = Gate::builtin("p", BuiltinGate::ProxiesPerRevision)
            .resolve(None)
            .unwrap_err();
        assert_eq!(e.category(), "NoComparison");

        // Both promql and builtin is ambiguous; neither is no query.
        let mut both = Gate::builtin("x", BuiltinGate::MeshErrorRatio);
        both.definition.promql = Some("up".into());
        assert_eq!(both.resolve(None).unwrap_err().category(), "AmbiguousQuery");
        let mut none = Gate::builtin("x", BuiltinGate::MeshErrorRatio);
        none.definition.builtin = None;
        assert_eq!(none.resolve(None).unwrap_err().category(), "NoQuery");

        // A bad duration names the field.
        let mut bad = Gate::builtin("x", BuiltinGate::MeshErrorRatio);
        bad.definition.window = Some("5 minutes".into());
        let e = bad.resolve(None).unwrap_err();
        assert_eq!(e.category(), "BadDuration");
        assert!(e.to_string().contains("window"));
    }

    #[test]
    fn share_min_samples_scales_with_target() {
        let cases: &[(f64, f64, u64, u64)] = &[
            // target, tolerance, at least, at most
            (0.01, 0.2, 9_000, 10_000),
            (0.05, 0.2, 1_700, 1_900),
            (0.5, 0.2, 90, 100),
            (1.0, 0.2, 0, 0),
            (0.0, 0.2, u64::MAX, u64::MAX),
            (0.5, 0.0, u64::MAX, u64::MAX),
        ];
        for &(t, tol, lo, hi) in cases {
            let n = share_min_samples(t, tol);
            assert!(n >= lo && n <= hi, "target {t} tol {tol}: {n}");
        }
        assert!(share_min_samples(0.01, 0.2) > share_min_samples(0.25, 0.2));
    }

    #[test]
    fn template_variables_table() {
        let cases: &[(&str, &[&str])] = &[
            ("up", &[]),
            ("x{a=\"{{service}}\"}", &["service"]),
            (
                "{{ service }} {{namespace}} {{service}}",
                &["service", "namespace"],
            ),
            ("x{{unterminated", &[]),
        ];
        for (q, want) in cases {
            let got = template_variables(q);
            assert_eq!(
                got,
                want.iter().map(|s| s.to_string()).collect::<Vec<_>>(),
                "{q}"
            );
        }
    }

    #[test]
    fn comparison_op_never_passes_nan() {
        for op in [
            ComparisonOp::LessThan,
            ComparisonOp::LessOrEqual,
            ComparisonOp::GreaterThan,
            ComparisonOp::GreaterOrEqual,
        ] {
            assert!(!op.passes(f64::NAN, 1.0), "{op:?}");
        }
        assert!(ComparisonOp::LessOrEqual.passes(1.0, 1.0));
        assert!(!ComparisonOp::LessThan.passes(1.0, 1.0));
    }

    #[test]
    fn gate_wire_shape() {
        let g: Gate = serde_json::from_value(serde_json::json!({
            "name": "errors",
            "builtin": "ErrorRatioVsStable",
            "comparison": {"relative": {"baseline": "PreChangeWindow", "factor": 2.0}},
            "window": "1m"
        }))
        .unwrap();
        assert_eq!(g.definition.builtin, Some(BuiltinGate::ErrorRatioVsStable));
        let rel = g
            .definition
            .comparison
            .as_ref()
            .unwrap()
            .relative
            .as_ref()
            .unwrap();
        assert_eq!(rel.baseline, BaselineSource::PreChangeWindow);
        assert_eq!(rel.op, ComparisonOp::LessOrEqual);
        let back = serde_json::to_value(&g).unwrap();
        assert_eq!(back["builtin"], "ErrorRatioVsStable");
        assert!(back.get("variables").is_none());
        assert!(back.get("promql").is_none());
    }
}
