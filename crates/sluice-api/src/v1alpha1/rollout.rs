//! `Rollout`: a canary of one Service version on a Gateway API HTTPRoute, stepped through mirror,
//! header cohort and weights, judged on what the mesh reports.
//!
//! Owns the kind's wire shape, its defaults, and its condition types and reasons. Never decides a
//! step and never writes a route; rollout-weights does.

// Repeated `printcolumn(type_ = ...)` entries are distinct columns, not duplicates.
#![allow(clippy::duplicated_attributes)]

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::common::DurationString;
use super::gate::{BuiltinGate, CapturedBaseline, Gate, GateVerdict, InconclusivePolicy};

/// Default analysis interval (the seed's figure).
pub const DEFAULT_ANALYSIS_INTERVAL: &str = "30s";
/// Default applied-share tolerance, percent of the target.
pub const DEFAULT_APPLIED_SHARE_TOLERANCE_PERCENT: u32 = 20;
/// Default time a step may wait for its weight to show in telemetry before the rollout fails.
pub const DEFAULT_APPLIED_SHARE_DEADLINE: &str = "10m";
/// Default duration of a mirror, cohort or weight step.
pub const DEFAULT_STEP_DURATION: &str = "5m";
/// Default time the canary workload has to become ready.
pub const DEFAULT_CANARY_READY_DEADLINE: &str = "10m";
/// Default time a Promoted rollout may wait for the Git change that hands the route back.
pub const DEFAULT_HAND_BACK_DEADLINE: &str = "24h";
/// Annotation placed on an HTTPRoute while a Rollout owns it; its value is `<namespace>/<name>`
/// of the owning Rollout.
pub const ROUTE_OWNER_ANNOTATION: &str = "sluice.dev/owned-by-rollout";
/// Field manager of rollout-weights' route writes.
pub const FIELD_MANAGER: &str = "sluice-rollout-weights";

/// Canary rollout of a Service version on a Gateway API HTTPRoute.
#[derive(CustomResource, Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "sluice.dev",
    version = "v1alpha1",
    kind = "Rollout",
    plural = "rollouts",
    namespaced,
    status = "RolloutStatus",
    shortname = "srol",
    shortname = "srollout",
    category = "sluice",
    doc = "A canary rollout on a Gateway API HTTPRoute: mirror, header cohort and weight steps, each judged on the applied share and gates the mesh reports.",
    printcolumn(name = "Phase", type_ = "string", json_path = ".status.phase"),
    printcolumn(
        name = "Step",
        type_ = "integer",
        json_path = ".status.currentStepIndex"
    ),
    printcolumn(
        name = "Desired",
        type_ = "integer",
        json_path = ".status.desiredWeight",
        description = "Canary weight written to the route, percent"
    ),
    printcolumn(
        name = "Applied",
        type_ = "number",
        json_path = ".status.appliedShare",
        description = "Canary share reported by the mesh, percent"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [
    {"rule": "self.stableService.name != self.canaryService.name", "message": "stableService and canaryService must name different Services", "fieldPath": ".canaryService.name"},
    {"rule": "!has(self.promoteThroughStep) || self.promoteThroughStep < size(self.steps)", "message": "promoteThroughStep must be an index into spec.steps", "fieldPath": ".promoteThroughStep"},
    {"rule": "!has(self.additionalRoutes) || self.additionalRoutes.all(a, (has(a.kind) ? a.kind : 'HTTPRoute') != (has(self.routeRef.kind) ? self.routeRef.kind : 'HTTPRoute') || a.name != self.routeRef.name)", "message": "additionalRoutes must not name the route of routeRef", "fieldPath": ".additionalRoutes"}
]))]
pub struct RolloutSpec {
    /// The Gateway API route (same namespace) whose weights this rollout governs.
    pub route_ref: RouteRef,
    /// More routes (same namespace) that carry the same Service: the ingress route's east-west
    /// (GAMMA) twin whose parentRef is the Service, or the route on a second Gateway. Every
    /// route gets the same canary weight at each step, from one plan; a problem on any of them
    /// blocks the rollout as it would on `routeRef`. There is no atomic write across routes: an
    /// abort reverts each route on its own (a failed one is retried) and
    /// `status.abortDetectToRevertMs` runs to the last route reverted. Mirror and header-cohort
    /// steps add their rules to every route (a mirror step only when every route is of
    /// `routeRef`'s kind: its methods are named for one kind). A route removed from the list
    /// mid-rollout is aborted on and handed back (once Promoted, handed back as it stands). At
    /// most 7; unique by kind and name, none equal to `routeRef`. Default: none.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 7))]
    #[schemars(extend("x-kubernetes-validations" = [
        {"rule": "self.all(a, self.filter(b, (has(b.kind) ? b.kind : 'HTTPRoute') == (has(a.kind) ? a.kind : 'HTTPRoute') && b.name == a.name).size() == 1)", "message": "additionalRoutes must be unique by kind and name"}
    ]))]
    pub additional_routes: Vec<RouteRef>,
    /// The backend Service of the current (stable) version; it must be a backendRef of the route.
    pub stable_service: BackendService,
    /// The backend Service of the new (canary) version; added to the managed rule if absent.
    pub canary_service: BackendService,
    /// The canary workload; no live weight is set before it reports ready. Its name is also the
    /// `destination_workload` the gates of a mirror step read (mirrored copies are reported only
    /// by the receiving workload's proxy).
    pub canary_workload: WorkloadRef,
    /// The stable workload: only its name is used, as the `destination_workload` whose
    /// destination-reported requests are the baseline of a mirror step's ErrorRatioVsStable and
    /// LatencyP99VsStable (the canary's mirrored copies are compared with what the stable's own
    /// proxies report). Absent: a workload named like `stableService`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stable_workload: Option<WorkloadRef>,
    /// The clients whose requests the applied share and the built-in gates ErrorRatioVsStable
    /// and LatencyP99VsStable count, by Istio's `source_workload` (and
    /// `source_workload_namespace`) labels: for a north-south route, the gateway's workload, so
    /// east-west callers of the stable Service do not dilute the share and requests sent straight
    /// to the canary Service (smoke tests) do not inflate it. Absent: requests from every
    /// source in the mesh to the stable and canary Services, wherever they entered.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub traffic_source: Option<TrafficSource>,
    /// Steps, executed in order. At least one, at most 32. Each step sets exactly one of
    /// mirror, headerCohort, setWeight, pause or promote. setWeight weights must strictly increase.
    #[schemars(length(min = 1, max = 32))]
    #[schemars(extend("x-kubernetes-validations" = [
        {"rule": "self.filter(s, has(s.setWeight)).map(s, s.setWeight.weight).isSorted() && self.filter(s, has(s.setWeight)).all(a, self.filter(b, has(b.setWeight) && b.setWeight.weight == a.setWeight.weight).size() == 1)", "message": "setWeight steps must be strictly increasing"},
        {"rule": "self.filter(s, has(s.promote)).size() <= 1 && (!self.exists(s, has(s.promote)) || has(self[size(self) - 1].promote))", "message": "promote may appear once, as the last step"}
    ]))]
    pub steps: Vec<RolloutStep>,
    /// Keep the header-cohort rule after the first setWeight step (its traffic, measured during
    /// the cohort step, then counts in the expected share). Default: false.
    #[serde(default)]
    pub keep_cohort: bool,
    /// Set the weight of every other backend of the managed rule to 0 with each live weight (a
    /// previous canary an earlier Rollout left behind). Default: false — a managed rule whose
    /// other backends carry weight is refused (`RouteOwned=False`, `OtherBackendWeighted`) and
    /// left as it is.
    #[serde(default)]
    pub zero_other_backends: bool,
    /// Keep the mirror rule after the first setWeight step. Default: false.
    #[serde(default)]
    pub keep_mirror: bool,
    /// Gates judged on every weight step. Absent or empty: the built-ins AppliedShare (within
    /// tolerance), ErrorRatioVsStable (≤ 1.5× stable) and LatencyP99VsStable (≤ 1.3× stable).
    /// At most 16; names unique.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16))]
    #[schemars(extend("x-kubernetes-validations" = [
        {"rule": "self.all(a, self.filter(b, b.name == a.name).size() == 1)", "message": "gate names must be unique"}
    ]))]
    pub gates: Vec<Gate>,
    /// Time between two analyses of the current step. Default: 30s.
    #[serde(default = "default_analysis_interval")]
    pub analysis_interval: DurationString,
    /// Tolerance of the applied-share check, percent of the target (20 = a 5% target passes
    /// between 4% and 6%). Default: 20.
    #[serde(default = "default_tolerance")]
    #[schemars(range(min = 1, max = 100))]
    pub applied_share_tolerance_percent: u32,
    /// How long a weight may stay unconfirmed by telemetry before the rollout aborts. Default: 10m.
    #[serde(default = "default_applied_share_deadline")]
    pub applied_share_deadline: DurationString,
    /// Duration of mirror, headerCohort and setWeight steps that set none. Default: 5m.
    #[serde(default = "default_step_duration")]
    pub step_duration: DurationString,
    /// How long the canary workload has to become ready before the rollout aborts. Default: 10m.
    #[serde(default = "default_canary_ready_deadline")]
    pub canary_ready_deadline: DurationString,
    /// After promotion, how long the route may stay owned before the condition HandBackOverdue
    /// is raised (the Git change making the canary stable should delete this Rollout). Default: 24h.
    #[serde(default = "default_hand_back_deadline")]
    pub hand_back_deadline: DurationString,
    /// What a sustained Inconclusive verdict does when a gate sets no policy. Default: Pause
    /// after 5m.
    #[serde(default)]
    pub inconclusive: InconclusivePolicy,
    /// Control: set true to abort now (canary weight 0, cohort and mirror removed). Default: false.
    #[serde(default)]
    pub abort: bool,
    /// Control: set true to hold at the current step; false resumes. Holds progress, never
    /// safety: the live canary is still judged and a Fail aborts. Default: false.
    #[serde(default)]
    pub paused: bool,
    /// Control: treat every step up to and including this index as complete (skips its
    /// remaining analysis and releases `pause.untilPromoted`). Absent: no manual promotion.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 31))]
    pub promote_through_step: Option<u32>,
    /// Control: set true to promote fully now (canary weight 100). Default: false.
    #[serde(default)]
    pub promote_full: bool,
    /// Control: increase to retry an aborted rollout from the first step (with `abort` false).
    /// The operator records the value it acted on in `status.retriesHandled`. Default: 0.
    #[serde(default)]
    pub retry: u32,
}

fn default_analysis_interval() -> DurationString {
    DurationString::new(DEFAULT_ANALYSIS_INTERVAL)
}
fn default_tolerance() -> u32 {
    DEFAULT_APPLIED_SHARE_TOLERANCE_PERCENT
}
fn default_applied_share_deadline() -> DurationString {
    DurationString::new(DEFAULT_APPLIED_SHARE_DEADLINE)
}
fn default_step_duration() -> DurationString {
    DurationString::new(DEFAULT_STEP_DURATION)
}
fn default_canary_ready_deadline() -> DurationString {
    DurationString::new(DEFAULT_CANARY_READY_DEADLINE)
}
fn default_hand_back_deadline() -> DurationString {
    DurationString::new(DEFAULT_HAND_BACK_DEADLINE)
}

impl RolloutSpec {
    /// The gates to judge: `spec.gates`, or the built-in defaults when it is empty.
    pub fn effective_gates(&self) -> Vec<Gate> {
        if !self.gates.is_empty() {
            return self.gates.clone();
        }
        vec![
            Gate::builtin("applied-share", BuiltinGate::AppliedShare),
            Gate::builtin("error-ratio", BuiltinGate::ErrorRatioVsStable),
            Gate::builtin("latency-p99", BuiltinGate::LatencyP99VsStable),
        ]
    }

    /// The duration of step `index`: its own `duration`, else `spec.stepDuration`. `None` for
    /// pause-until-promoted and promote steps, and for an index out of range.
    pub fn step_duration_of(&self, index: usize) -> Option<DurationString> {
        let step = self.steps.get(index)?;
        let own = if let Some(m) = &step.mirror {
            m.duration.clone()
        } else if let Some(c) = &step.header_cohort {
            c.duration.clone()
        } else if let Some(w) = &step.set_weight {
            w.duration.clone()
        } else if let Some(p) = &step.pause {
            return p.duration.clone();
        } else {
            return None;
        };
        Some(own.unwrap_or_else(|| self.step_duration.clone()))
    }
}

/// The Gateway API route a Rollout governs.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RouteRef {
    /// Kind of the route (gateway.networking.k8s.io/v1): `HTTPRoute` or `GRPCRoute`. Default:
    /// HTTPRoute. A GRPCRoute takes weight steps, header-cohort steps (the header is matched
    /// as gRPC metadata) and mirror steps that name their `grpcMethods`.
    #[serde(default, skip_serializing_if = "RouteKindName::is_http")]
    pub kind: RouteKindName,
    /// Name of the route, in the Rollout's namespace.
    #[schemars(length(min = 1, max = 253))]
    pub name: String,
    /// Name of the rule to manage (`spec.rules[].name`). Absent: the single rule whose
    /// backendRefs include the stable Service (more than one such rule is an error).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253))]
    pub rule_name: Option<String>,
}

/// The kinds of Gateway API route a Rollout can govern.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[schemars(transform = super::common::drop_type_description)]
pub enum RouteKindName {
    /// HTTPRoute (every step form).
    #[default]
    #[serde(rename = "HTTPRoute")]
    HttpRoute,
    /// GRPCRoute (weight and header-cohort steps, and mirror steps naming their gRPC methods).
    #[serde(rename = "GRPCRoute")]
    GrpcRoute,
}

impl RouteKindName {
    /// Whether this is the default kind, HTTPRoute.
    pub fn is_http(&self) -> bool {
        *self == RouteKindName::HttpRoute
    }

    /// The kind as written in `kind:` and in messages.
    pub fn as_str(&self) -> &'static str {
        match self {
            RouteKindName::HttpRoute => "HTTPRoute",
            RouteKindName::GrpcRoute => "GRPCRoute",
        }
    }
}

/// A backend Service of the route.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct BackendService {
    /// Name of the Service, in the Rollout's namespace.
    #[schemars(length(min = 1, max = 63))]
    pub name: String,
    /// Port of the Service used in the backendRef. Absent: the port the route already uses for
    /// the stable Service.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 65535))]
    pub port: Option<u16>,
}

/// A workload whose readiness gates live traffic.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct WorkloadRef {
    /// API version of the workload. Default: apps/v1.
    #[serde(default = "default_workload_api_version")]
    #[schemars(length(max = 253))]
    pub api_version: String,
    /// Kind of the workload: Deployment, StatefulSet or another kind with a status. Default:
    /// Deployment.
    #[serde(default = "default_workload_kind")]
    #[schemars(length(max = 63))]
    pub kind: String,
    /// Name of the workload, in the Rollout's namespace.
    #[schemars(length(min = 1, max = 253))]
    pub name: String,
}

/// The source workloads a Rollout's traffic comes from (Istio's `source_workload` labels).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [
    {"rule": "self.workloads.all(w, size(w) > 0)", "message": "trafficSource.workloads: a workload name must not be empty (name the client workload, e.g. the gateway's Deployment)", "fieldPath": ".workloads"}
]))]
pub struct TrafficSource {
    /// Names of the client workloads, as Istio reports them in `source_workload` (for a
    /// Deployment, its name; e.g. `istio-ingressgateway`). Requests from any of them count. At
    /// least one, at most 16; none empty.
    #[schemars(length(min = 1, max = 16), inner(length(min = 1, max = 253)))]
    pub workloads: Vec<String>,
    /// Namespace of those workloads (`source_workload_namespace`, e.g. `istio-system`). Absent:
    /// workloads of those names in any namespace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 63))]
    pub namespace: Option<String>,
}

/// A Kubernetes object name: at most 253 lowercase letters, digits, '-' and '.', starting and
/// ending with a letter or digit.
fn is_object_name(name: &str) -> bool {
    let b = name.as_bytes();
    !b.is_empty()
        && b.len() <= 253
        && b.iter()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-' || *c == b'.')
        && b[0].is_ascii_alphanumeric()
        && b[b.len() - 1].is_ascii_alphanumeric()
}

impl TrafficSource {
    /// What is wrong with the field at `path` (e.g. `spec.trafficSource`), each naming its
    /// subfield; empty when it is valid. Besides what the CRD's schema refuses, a name must be a
    /// Kubernetes object name, since nothing else can appear in `source_workload`.
    pub fn problems(&self, path: &str) -> Vec<crate::validation::FieldError> {
        let mut out = Vec::new();
        let mut push = |path: String, message: String| {
            out.push(crate::validation::FieldError { path, message })
        };
        if self.workloads.is_empty() {
            push(
                format!("{path}.workloads"),
                "name at least one client workload (e.g. the gateway's Deployment); omit trafficSource to count every source"
                    .into(),
            );
        }
        if self.workloads.len() > 16 {
            push(format!("{path}.workloads"), "at most 16 workloads".into());
        }
        for (i, w) in self.workloads.iter().enumerate() {
            if w.is_empty() {
                push(
                    format!("{path}.workloads[{i}]"),
                    "must not be empty: name the client workload as Istio reports it in source_workload (e.g. istio-ingressgateway)".into(),
                );
            } else if !is_object_name(w) {
                push(
                    format!("{path}.workloads[{i}]"),
                    format!(
                        "{w:?} is not a workload name (lowercase letters, digits, '-' and '.', at most 253)"
                    ),
                );
            } else if self.workloads[..i].contains(w) {
                push(
                    format!("{path}.workloads[{i}]"),
                    format!("{w:?} is listed twice"),
                );
            }
        }
        if let Some(ns) = &self.namespace {
            if ns.is_empty() {
                push(
                    format!("{path}.namespace"),
                    "must not be empty: name the workloads' namespace, or omit it for any namespace".into(),
                );
            } else if ns.len() > 63 || ns.contains('.') || !is_object_name(ns) {
                push(
                    format!("{path}.namespace"),
                    format!(
                        "{ns:?} is not a namespace name (lowercase letters, digits and '-', at most 63)"
                    ),
                );
            }
        }
        out
    }
}

impl RolloutSpec {
    /// The name of the stable workload (`spec.stableWorkload.name`, else the stable Service's).
    pub fn stable_workload_name(&self) -> &str {
        self.stable_workload
            .as_ref()
            .map_or(self.stable_service.name.as_str(), |w| w.name.as_str())
    }

    /// Problems of the fields that scope the mirror and source telemetry (`stableWorkload`,
    /// `trafficSource`), each naming its field; empty when they are valid.
    pub fn telemetry_problems(&self) -> Vec<crate::validation::FieldError> {
        let mut out = Vec::new();
        if let Some(w) = &self.stable_workload
            && w.name.is_empty()
        {
            out.push(crate::validation::FieldError {
                path: "spec.stableWorkload.name".into(),
                message: "must not be empty: name the stable workload, or omit stableWorkload to use the stable Service's name".into(),
            });
        }
        if let Some(t) = &self.traffic_source {
            out.extend(t.problems("spec.trafficSource"));
        }
        out
    }
}

fn default_workload_api_version() -> String {
    "apps/v1".into()
}
fn default_workload_kind() -> String {
    "Deployment".into()
}

/// One step of a Rollout. Exactly one field is set.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [{
    "rule": "(has(self.mirror) ? 1 : 0) + (has(self.headerCohort) ? 1 : 0) + (has(self.setWeight) ? 1 : 0) + (has(self.pause) ? 1 : 0) + (has(self.promote) ? 1 : 0) == 1",
    "message": "a step sets exactly one of mirror, headerCohort, setWeight, pause or promote"
}]))]
pub struct RolloutStep {
    /// Mirror a percentage of idempotent requests to the canary (responses discarded).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mirror: Option<MirrorStep>,
    /// Route requests carrying a header to the canary only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub header_cohort: Option<HeaderCohortStep>,
    /// Set the canary backend weight.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub set_weight: Option<SetWeightStep>,
    /// Hold for a duration or until promoted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pause: Option<PauseStep>,
    /// Promote: canary weight 100, phase Promoted (the route stays owned until hand-back).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub promote: Option<PromoteStep>,
}

/// The kind of a step, for status and history.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[schemars(transform = super::common::drop_type_description)]
pub enum StepKind {
    /// A mirror step.
    Mirror,
    /// A header-cohort step.
    HeaderCohort,
    /// A set-weight step.
    SetWeight,
    /// A pause step.
    Pause,
    /// A promote step.
    Promote,
}

impl RolloutStep {
    /// Which kind of step this is (`None` when no field or several are set; CEL refuses those).
    pub fn kind(&self) -> Option<StepKind> {
        let kinds = [
            (self.mirror.is_some(), StepKind::Mirror),
            (self.header_cohort.is_some(), StepKind::HeaderCohort),
            (self.set_weight.is_some(), StepKind::SetWeight),
            (self.pause.is_some(), StepKind::Pause),
            (self.promote.is_some(), StepKind::Promote),
        ];
        let mut set = kinds.iter().filter(|(on, _)| *on);
        match (set.next(), set.next()) {
            (Some((_, k)), None) => Some(*k),
            _ => None,
        }
    }
}

/// HTTP methods a mirror step may name.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "UPPERCASE")]
#[schemars(transform = super::common::drop_type_description)]
#[schemars(extend("maxLength" = 7))]
pub enum HttpMethod {
    /// GET (idempotent).
    Get,
    /// HEAD (idempotent).
    Head,
    /// OPTIONS (idempotent).
    Options,
    /// TRACE (idempotent).
    Trace,
    /// POST (not idempotent: refused for mirroring).
    Post,
    /// PUT (refused for mirroring: a mirrored write would be applied twice).
    Put,
    /// PATCH (not idempotent: refused for mirroring).
    Patch,
    /// DELETE (refused for mirroring: a mirrored write would be applied twice).
    Delete,
    /// CONNECT (refused for mirroring).
    Connect,
}

impl HttpMethod {
    /// Whether mirroring this method is safe (GET, HEAD, OPTIONS, TRACE).
    pub fn is_idempotent_read(self) -> bool {
        matches!(
            self,
            HttpMethod::Get | HttpMethod::Head | HttpMethod::Options | HttpMethod::Trace
        )
    }

    /// The method as written on the wire.
    pub fn as_str(self) -> &'static str {
        match self {
            HttpMethod::Get => "GET",
            HttpMethod::Head => "HEAD",
            HttpMethod::Options => "OPTIONS",
            HttpMethod::Trace => "TRACE",
            HttpMethod::Post => "POST",
            HttpMethod::Put => "PUT",
            HttpMethod::Patch => "PATCH",
            HttpMethod::Delete => "DELETE",
            HttpMethod::Connect => "CONNECT",
        }
    }
}

/// A gRPC method, named in full (a Gateway API GRPCMethodMatch of type Exact with both parts).
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct GrpcMethod {
    /// The fully qualified service, e.g. `payments.v1.Ledger`.
    #[schemars(
        length(min = 1, max = 1024),
        regex(pattern = r"^\.?[A-Za-z_][A-Za-z_0-9]*(\.[A-Za-z_][A-Za-z_0-9]*)*$")
    )]
    pub service: String,
    /// The method of that service, e.g. `GetBalance`.
    #[schemars(
        length(min = 1, max = 1024),
        regex(pattern = r"^[A-Za-z_][A-Za-z_0-9]*$")
    )]
    pub method: String,
}

/// Mirror requests that are safe to receive twice to the canary.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MirrorStep {
    /// Percentage of matching requests mirrored, 1..100. Default: 100.
    #[serde(default = "default_mirror_percent")]
    #[schemars(range(min = 1, max = 100))]
    pub percent: u32,
    /// Methods mirrored; only GET, HEAD, OPTIONS and TRACE are allowed (a mirrored write would
    /// be applied twice). Default: [GET, HEAD].
    #[serde(default = "default_mirror_methods")]
    #[schemars(length(min = 1, max = 4))]
    #[schemars(extend("x-kubernetes-validations" = [
        {"rule": "self.all(m, m in ['GET', 'HEAD', 'OPTIONS', 'TRACE'])", "message": "mirroring is only allowed for idempotent methods: GET, HEAD, OPTIONS, TRACE"},
        {"rule": "self.all(a, self.filter(b, b == a).size() == 1)", "message": "methods must be unique"}
    ]))]
    pub methods: Vec<HttpMethod>,
    /// The gRPC methods mirrored on a GRPCRoute, each named in full: only methods the owner
    /// declares safe to receive twice (reads without side effects), since gRPC has no
    /// idempotent verb to mirror by. Required for a mirror step on a GRPCRoute, where `methods`
    /// is not used; refused on an HTTPRoute. At most 16, unique.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16))]
    #[schemars(extend("x-kubernetes-validations" = [
        {"rule": "self.all(a, self.filter(b, b.service == a.service && b.method == a.method).size() == 1)", "message": "grpcMethods must be unique"}
    ]))]
    pub grpc_methods: Vec<GrpcMethod>,
    /// How long to mirror before the next step. Default: spec.stepDuration (5m).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub duration: Option<DurationString>,
}

fn default_mirror_percent() -> u32 {
    100
}
fn default_mirror_methods() -> Vec<HttpMethod> {
    vec![HttpMethod::Get, HttpMethod::Head]
}

/// How a header value is matched.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[schemars(transform = super::common::drop_type_description)]
pub enum HeaderMatchType {
    /// The header value equals `value` (the default).
    #[default]
    Exact,
    /// The header value matches the regular expression `value`.
    RegularExpression,
}

/// A request-header match (Gateway API HTTPHeaderMatch).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct HeaderMatch {
    /// Header name, case-insensitive (e.g. `x-cohort`).
    #[schemars(
        length(min = 1, max = 256),
        regex(pattern = r"^[A-Za-z0-9!#$%&'*+\-.^_`|~]+$")
    )]
    pub name: String,
    /// Header value to match (e.g. `staff`).
    #[schemars(length(min = 1, max = 4096))]
    pub value: String,
    /// Exact (default) or RegularExpression.
    #[serde(default, rename = "type")]
    pub match_type: HeaderMatchType,
}

/// Send requests with a header to the canary only.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct HeaderCohortStep {
    /// The header that selects the cohort.
    pub header: HeaderMatch,
    /// How long the cohort step lasts. Default: spec.stepDuration (5m).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub duration: Option<DurationString>,
}

/// Set the canary weight on the managed rule.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SetWeightStep {
    /// Canary weight, percent of the rule's traffic, 0..100 (stable gets 100 − weight).
    #[schemars(range(min = 0, max = 100))]
    pub weight: u32,
    /// How long the weight is analysed (after the applied share is confirmed) before the next
    /// step. Default: spec.stepDuration (5m).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub duration: Option<DurationString>,
}

/// Hold the rollout.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [{
    "rule": "has(self.duration) != (has(self.untilPromoted) && self.untilPromoted)",
    "message": "a pause sets either duration or untilPromoted: true"
}]))]
pub struct PauseStep {
    /// Hold for this long.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub duration: Option<DurationString>,
    /// Hold until a person promotes (spec.promoteThroughStep or spec.promoteFull); the live
    /// canary is still judged meanwhile and a Fail aborts. Default: false.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub until_promoted: Option<bool>,
}

/// Promote the canary to 100%.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PromoteStep {}

/// Lifecycle phase of a Rollout.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[schemars(transform = super::common::drop_type_description)]
pub enum RolloutPhase {
    /// Accepted, not started.
    #[default]
    Pending,
    /// Waiting for the canary workload to be ready.
    WaitingForCanary,
    /// Executing steps.
    Progressing,
    /// Held: by a pause step, `spec.paused`, or a sustained Inconclusive verdict. Holds progress,
    /// never safety: the gates still judge the live canary and a Fail aborts.
    Paused,
    /// At 100% canary, route still owned, waiting for hand-back.
    Promoted,
    /// Aborted: canary weight 0, cohort and mirror removed.
    Aborted,
    /// The spec is invalid and the Rollout never started; see the Ready condition. A Rollout
    /// that already started keeps its phase while invalid (`Ready=False`): a live canary is
    /// still judged (or aborted), never left unjudged.
    Invalid,
}

/// Why a Rollout aborted.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[schemars(transform = super::common::drop_type_description)]
pub enum AbortReason {
    /// A gate's verdict was Fail.
    GateFailed,
    /// A gate stayed Inconclusive and its policy is Abort.
    InconclusiveTimeout,
    /// The applied share never matched the weight within the deadline.
    AppliedShareNotConfirmed,
    /// The canary workload did not become ready within the deadline.
    CanaryNotReady,
    /// `spec.abort` was set.
    Manual,
    /// A BundlePin rewrote the owned route; the pin wins.
    PinnedByBundlePin,
    /// The spec became invalid while the canary received traffic, in a part the gates need
    /// (gates, interval, route or Services): the canary cannot be judged, so it is aborted.
    InvalidSpec,
}

/// The abort decision and its timeline.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AbortStatus {
    /// Why the rollout aborted.
    pub reason: AbortReason,
    /// Detail, at most 1024 characters.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// The failing gate's verdict with the values seen, when a gate caused the abort.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gate: Option<GateVerdict>,
    /// Index of the step during which the rollout aborted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub step_index: Option<u32>,
    /// When the failing gate first failed (start of its consecutive failures).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub first_failed_at: Option<Time>,
    /// When the abort was decided.
    pub decided_at: Time,
    /// When the route write (canary 0, extra rules removed) succeeded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub route_reverted_at: Option<Time>,
    /// When telemetry confirmed the canary share fell to ~0.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revert_verified_at: Option<Time>,
}

/// What the Rollout owns on its route.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct OwnedRouteStatus {
    /// Name of the owned route.
    pub name: String,
    /// Kind of the owned route (absent in a status written before the kind was recorded). A
    /// different `spec.routeRef.kind` mid-rollout aborts on this route and hands it back before
    /// starting over, even when the new route has the same name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<RouteKindName>,
    /// Name of the managed rule, when it has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rule_name: Option<String>,
    /// When ownership was taken.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owned_since: Option<Time>,
    /// resourceVersion of the route after the operator's last write.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_written_resource_version: Option<String>,
    /// Canary weight written by the last write, percent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub written_weight: Option<u32>,
    /// When the API server accepted the route write that put `writtenWeight` in force (absent
    /// until then). A weight step counts requests toward its applied share from one analysis
    /// interval after this instant, so the seconds the mesh takes to apply the weight never read
    /// as a low share.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub weight_written_at: Option<Time>,
    /// Name of the header-cohort rule the operator added, while present.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cohort_rule_name: Option<String>,
    /// Name of the mirror rule the operator added, while present.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mirror_rule_name: Option<String>,
    /// The stable Service the weights were written for. A different `spec.stableService`
    /// mid-rollout aborts on this route and hands it back before starting over.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stable_service: Option<String>,
    /// The canary Service the weights were written for. A different `spec.canaryService`
    /// mid-rollout aborts on this route (this canary at 0) and hands it back before starting
    /// over.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub canary_service: Option<String>,
}

/// How a step ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[schemars(transform = super::common::drop_type_description)]
pub enum StepOutcome {
    /// The step's duration elapsed with every gate passing.
    Passed,
    /// A person promoted past it.
    Promoted,
    /// The rollout aborted during it.
    Aborted,
    /// The plan restarted during it: `spec.steps` changed (the plan resumes at the step that
    /// matches the current weight) or a new canary version appeared (from step 0, at weight 0).
    Restarted,
}

/// One step in the rollout's history.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct StepRecord {
    /// Index into spec.steps.
    pub index: u32,
    /// Kind of step.
    pub kind: StepKind,
    /// Canary weight of a setWeight step, percent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub weight: Option<u32>,
    /// When the step started.
    pub started_at: Time,
    /// When the applied share was confirmed (weight steps).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub share_confirmed_at: Option<Time>,
    /// When the step ended; absent while it runs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finished_at: Option<Time>,
    /// How it ended; absent while it runs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub outcome: Option<StepOutcome>,
}

/// Observed state of a Rollout; the operator's state machine.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RolloutStatus {
    /// The metadata.generation the status reflects.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// Pending, WaitingForCanary, Progressing, Paused, Promoted, Aborted or Invalid.
    #[serde(default)]
    pub phase: RolloutPhase,
    /// Index of the current step in spec.steps.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub current_step_index: Option<u32>,
    /// When the current step started.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub current_step_started_at: Option<Time>,
    /// Canary weight the operator wants on the route, percent 0..100.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub desired_weight: Option<u32>,
    /// Canary share of the route's requests as reported by the mesh (source or gateway
    /// reporter), percent 0..100.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub applied_share: Option<f64>,
    /// When appliedShare was measured.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub applied_share_observed_at: Option<Time>,
    /// Canary share measured during the header-cohort step, percent (the cohort's share of the
    /// route's requests). With keepCohort it is counted in the expected share of later weight
    /// steps: cohort + (100 − cohort) × weight / 100.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cohort_share: Option<f64>,
    /// Whether the header-cohort rule is on the route.
    #[serde(default)]
    pub cohort_active: bool,
    /// Whether the mirror rule is on the route.
    #[serde(default)]
    pub mirror_active: bool,
    /// Latest verdict per gate in the current step.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub gates: Vec<GateVerdict>,
    /// Baselines captured once from a pre-change window.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub captured_baselines: Vec<CapturedBaseline>,
    /// The abort decision and its timeline, when aborted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub abort: Option<AbortStatus>,
    /// Milliseconds from the abort decision (taken the moment the failing verdict comes back)
    /// to the route write that reverted the canary, measured by the operator: exact where
    /// `abort.decidedAt` and `abort.routeRevertedAt` are kept to the second. Set with
    /// `abort.routeRevertedAt`, cleared with `abort`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub abort_detect_to_revert_ms: Option<u64>,
    /// Hash of the `spec.steps` the current plan runs (FNV-1a, hex). When the steps change
    /// mid-rollout the plan restarts at the step that matches the current weight, never further.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub steps_hash: Option<String>,
    /// The canary version the rollout judges: a hash (FNV-1a, hex) of the canary workload's pod
    /// template, ignoring `kubectl.kubernetes.io/restartedAt` and the sidecar injector's
    /// annotations and labels (an Istio revision upgrade's restart is not a new version). A new
    /// version mid-rollout (or after promotion) sets the canary weight to 0 and restarts from
    /// step 0.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub canary_version: Option<String>,
    /// The route ownership held by this Rollout.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owned_route: Option<OwnedRouteStatus>,
    /// The ownership held on each of `spec.additionalRoutes` (one entry per route this Rollout
    /// wrote to, kept until it is handed back), with the same fields as `ownedRoute`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16))]
    pub additional_owned_routes: Vec<OwnedRouteStatus>,
    /// When the rollout reached Promoted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub promoted_at: Option<Time>,
    /// The spec.retry value last acted on.
    #[serde(default)]
    pub retries_handled: u32,
    /// Steps executed, oldest first (the operator keeps the most recent 64).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub history: Vec<StepRecord>,
    /// Conditions (Ready, Progressing, CanaryReady, AppliedShareConfirmed, RouteOwned,
    /// HandBackOverdue), one per type.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,
}

/// Condition types of a Rollout.
pub mod conditions {
    /// The spec is valid and the operator acts on it.
    pub const READY: &str = "Ready";
    /// The rollout is moving through its steps.
    pub const PROGRESSING: &str = "Progressing";
    /// The canary workload is ready.
    pub const CANARY_READY: &str = "CanaryReady";
    /// The mesh reports the desired weight within tolerance.
    pub const APPLIED_SHARE_CONFIRMED: &str = "AppliedShareConfirmed";
    /// The route carries this Rollout's ownership annotation.
    pub const ROUTE_OWNED: &str = "RouteOwned";
    /// Promoted longer than spec.handBackDeadline without hand-back.
    pub const HAND_BACK_OVERDUE: &str = "HandBackOverdue";
}

/// Condition reasons of a Rollout.
pub mod reasons {
    /// The spec is invalid; the message names the field.
    pub const INVALID_SPEC: &str = "InvalidSpec";
    /// The spec is valid.
    pub const VALID: &str = "Valid";
    /// A gate cannot be evaluated as configured (a missing GateTemplate, a variable the Rollout
    /// cannot supply, refused inline PromQL); the message names the gate and field.
    pub const GATE_MISCONFIGURED: &str = "GateMisconfigured";
    /// The route cannot hold the extra rules (16 rules, 128 matches).
    pub const ROUTE_FULL: &str = "RouteFull";
    /// The installed HTTPRoute CRD would prune a field a step needs.
    pub const ROUTE_FIELD_PRUNED: &str = "RouteFieldPruned";
    /// Another backend of the managed rule carries weight and `spec.zeroOtherBackends` is false:
    /// no live weight is written.
    pub const OTHER_BACKEND_WEIGHTED: &str = "OtherBackendWeighted";
    /// Another rule of the route matches the managed rule's path without a method: the mirror
    /// rule would take its requests, so the mirror step is refused.
    pub const MIRROR_WOULD_CAPTURE: &str = "MirrorWouldCapture";
    /// The route or the managed rule was not found.
    pub const ROUTE_NOT_FOUND: &str = "RouteNotFound";
    /// Another Rollout owns the route.
    pub const ROUTE_OWNED_BY_OTHER: &str = "RouteOwnedByOther";
    /// A foreign edit of owned weights was detected and restored.
    pub const FOREIGN_EDIT_RESTORED: &str = "ForeignEditRestored";
    /// Waiting for the canary workload.
    pub const WAITING_FOR_CANARY: &str = "WaitingForCanary";
    /// Executing a step.
    pub const STEP_IN_PROGRESS: &str = "StepInProgress";
    /// The weight has not yet shown in telemetry.
    pub const SHARE_NOT_YET_APPLIED: &str = "ShareNotYetApplied";
    /// The share is within tolerance.
    pub const SHARE_WITHIN_TOLERANCE: &str = "ShareWithinTolerance";
    /// Held by a pause step or spec.paused.
    pub const PAUSED: &str = "Paused";
    /// Held by a sustained Inconclusive verdict.
    pub const INCONCLUSIVE: &str = "Inconclusive";
    /// Promoted to 100%.
    pub const PROMOTED: &str = "Promoted";
    /// Aborted after a gate failed.
    pub const GATE_FAILED: &str = "GateFailed";
    /// Aborted by spec.abort.
    pub const ABORTED_MANUALLY: &str = "AbortedManually";
    /// A new canary version (pod template) appeared: canary weight 0, restart from step 0.
    pub const CANARY_VERSION_CHANGED: &str = "CanaryVersionChanged";
    /// `spec.routeRef`, `spec.stableService` or `spec.canaryService` changed mid-rollout: the
    /// canary was aborted on the route it was written to, that route handed back, and the
    /// rollout starts over on the new one.
    pub const TARGET_CHANGED: &str = "TargetChanged";
    /// `spec.steps` changed mid-rollout: the plan restarted at the step matching the weight.
    pub const STEPS_CHANGED: &str = "StepsChanged";
    /// The canary Service does not exist: the canary is held at weight 0 (its share of
    /// requests would get 500s) and its step restarts once the Service is back.
    pub const CANARY_SERVICE_MISSING: &str = "CanaryServiceMissing";
    /// The metrics source gave no data for the applied share past its deadline: held, never
    /// aborted on missing data.
    pub const METRICS_UNAVAILABLE: &str = "MetricsUnavailable";
    /// Deleted before promotion: the canary was aborted, then the route handed back.
    pub const ABORTED_ON_DELETE: &str = "AbortedOnDelete";
    /// Aborted because a BundlePin rewrote the route.
    pub const PINNED_BY_BUNDLE_PIN: &str = "PinnedByBundlePin";
    /// Route handed back after promotion is overdue.
    pub const HAND_BACK_OVERDUE: &str = "HandBackOverdue";
}

#[cfg(test)]
mod tests {
    use super::*;

    fn minimal() -> serde_json::Value {
        serde_json::json!({
            "routeRef": {"name": "checkout"},
            "stableService": {"name": "checkout-v1"},
            "canaryService": {"name": "checkout-v2"},
            "canaryWorkload": {"name": "checkout-v2"},
            "steps": [
                {"mirror": {}},
                {"headerCohort": {"header": {"name": "x-cohort", "value": "staff"}}},
                {"setWeight": {"weight": 1}},
                {"pause": {"untilPromoted": true}},
                {"setWeight": {"weight": 50, "duration": "1m"}},
                {"promote": {}}
            ]
        })
    }

    #[test]
    fn traffic_source_and_stable_workload_are_optional_and_refused_when_empty() {
        let spec: RolloutSpec = serde_json::from_value(minimal()).unwrap();
        assert_eq!(
            spec.traffic_source, None,
            "default: every source in the mesh"
        );
        assert_eq!(spec.stable_workload_name(), "checkout-v1");
        assert!(spec.telemetry_problems().is_empty());
        let with = |patch: serde_json::Value| {
            let mut v = minimal();
            for (k, x) in patch.as_object().unwrap() {
                v[k] = x.clone();
            }
            serde_json::from_value::<RolloutSpec>(v).unwrap()
        };
        let spec = with(serde_json::json!({
            "stableWorkload": {"name": "checkout-v1-deploy"},
            "trafficSource": {"workloads": ["istio-ingressgateway"], "namespace": "istio-system"},
        }));
        assert_eq!(spec.stable_workload_name(), "checkout-v1-deploy");
        assert!(spec.telemetry_problems().is_empty());
        // (patch, [(path, message starts with)])
        let table = [
            (
                serde_json::json!({"trafficSource": {"workloads": ["gw", ""]}}),
                vec![(
                    "spec.trafficSource.workloads[1]",
                    "must not be empty: name the client workload as Istio reports it in source_workload",
                )],
            ),
            (
                serde_json::json!({"trafficSource": {"workloads": []}}),
                vec![(
                    "spec.trafficSource.workloads",
                    "name at least one client workload",
                )],
            ),
            (
                serde_json::json!({"trafficSource": {"workloads": ["gw", "Gw|x", "gw"], "namespace": ""}}),
                vec![
                    (
                        "spec.trafficSource.workloads[1]",
                        "\"Gw|x\" is not a workload name",
                    ),
                    ("spec.trafficSource.workloads[2]", "\"gw\" is listed twice"),
                    ("spec.trafficSource.namespace", "must not be empty"),
                ],
            ),
            (
                serde_json::json!({"stableWorkload": {"name": ""}}),
                vec![("spec.stableWorkload.name", "must not be empty")],
            ),
        ];
        for (patch, want) in table {
            let got = with(patch.clone()).telemetry_problems();
            assert_eq!(got.len(), want.len(), "{patch}: {got:?}");
            for (g, (path, msg)) in got.iter().zip(want) {
                assert_eq!(g.path, path, "{patch}");
                assert!(g.message.starts_with(msg), "{patch}: {}", g.message);
            }
        }
    }

    #[test]
    fn defaults_apply_on_deserialise() {
        let spec: RolloutSpec = serde_json::from_value(minimal()).unwrap();
        assert_eq!(spec.analysis_interval.as_str(), "30s");
        assert_eq!(spec.applied_share_tolerance_percent, 20);
        assert_eq!(spec.canary_workload.kind, "Deployment");
        assert_eq!(spec.canary_workload.api_version, "apps/v1");
        let mirror = spec.steps[0].mirror.as_ref().unwrap();
        assert_eq!(mirror.percent, 100);
        assert_eq!(mirror.methods, vec![HttpMethod::Get, HttpMethod::Head]);
        assert_eq!(
            spec.steps[1]
                .header_cohort
                .as_ref()
                .unwrap()
                .header
                .match_type,
            HeaderMatchType::Exact
        );
        assert_eq!(spec.effective_gates().len(), 3);
    }

    #[test]
    fn step_kind_and_duration_table() {
        let spec: RolloutSpec = serde_json::from_value(minimal()).unwrap();
        let cases: &[(usize, Option<StepKind>, Option<&str>)] = &[
            (0, Some(StepKind::Mirror), Some("5m")),
            (1, Some(StepKind::HeaderCohort), Some("5m")),
            (2, Some(StepKind::SetWeight), Some("5m")),
            (3, Some(StepKind::Pause), None),
            (4, Some(StepKind::SetWeight), Some("1m")),
            (5, Some(StepKind::Promote), None),
            (6, None, None),
        ];
        for &(i, kind, dur) in cases {
            assert_eq!(
                spec.steps.get(i).and_then(RolloutStep::kind),
                kind,
                "step {i}"
            );
            assert_eq!(
                spec.step_duration_of(i)
                    .as_ref()
                    .map(DurationString::as_str),
                dur,
                "step {i}"
            );
        }
        let two = RolloutStep {
            set_weight: Some(SetWeightStep {
                weight: 1,
                duration: None,
            }),
            promote: Some(PromoteStep {}),
            ..RolloutStep::default()
        };
        assert_eq!(two.kind(), None);
    }

    #[test]
    fn methods_serialise_uppercase() {
        assert_eq!(
            serde_json::to_value(HttpMethod::Options).unwrap(),
            serde_json::json!("OPTIONS")
        );
        assert!(HttpMethod::Trace.is_idempotent_read());
        assert!(!HttpMethod::Post.is_idempotent_read());
    }
}
