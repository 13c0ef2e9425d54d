//! `RevisionUpgrade`: moves a cluster's namespaces from one Istio revision tag to another in
//! waves, restarting pods paced by the certificate-issuance budget.
//!
//! Owns the kind's wire shape, its defaults, and its condition types and reasons. Never relabels,
//! evicts or restarts anything; upgrade-revisions does.

// Repeated `printcolumn(type_ = ...)` entries are distinct columns, not duplicates.
#![allow(clippy::duplicated_attributes)]

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, LabelSelector, Time};
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::common::DurationString;
use super::gate::{BuiltinGate, CapturedBaseline, Gate, GateVerdict, InconclusivePolicy};

/// Default sustained issuance rate, SVIDs per second (seed: 200/s sustained).
pub const DEFAULT_ISSUANCE_RATE: u32 = 200;
/// Default token-bucket depth, SVIDs.
pub const DEFAULT_ISSUANCE_DEPTH: u32 = 2_000;
/// Default cap on issuance in any one second (seed: 2,000/s burst).
pub const DEFAULT_ISSUANCE_PEAK_PER_SECOND: u32 = 2_000;
/// Default soak of each wave.
pub const DEFAULT_WAVE_SOAK: &str = "15m";
/// Default analysis interval.
pub const DEFAULT_ANALYSIS_INTERVAL: &str = "30s";
/// Namespace label the default waves select on.
pub const RISK_TIER_LABEL: &str = "sluice.dev/risk-tier";
/// Namespace label selecting the injecting revision (or tag).
pub const REV_LABEL: &str = "istio.io/rev";
/// Namespace label of legacy injection, which ignores `istio.io/rev`.
pub const INJECTION_LABEL: &str = "istio-injection";

/// Moves namespaces between Istio revision tags in waves, never upgrading in place.
#[derive(CustomResource, Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "sluice.dev",
    version = "v1alpha1",
    kind = "RevisionUpgrade",
    plural = "revisionupgrades",
    status = "RevisionUpgradeStatus",
    shortname = "sru",
    category = "sluice",
    doc = "Moves a cluster's namespaces from one Istio revision tag to another in waves, restarting pods paced by the SVID issuance budget.",
    printcolumn(name = "From", type_ = "string", json_path = ".spec.fromRevision"),
    printcolumn(name = "To", type_ = "string", json_path = ".spec.toRevision"),
    printcolumn(name = "Wave", type_ = "string", json_path = ".status.currentWave"),
    printcolumn(
        name = "Old",
        type_ = "integer",
        json_path = ".status.proxies.old",
        description = "Proxies on the old revision"
    ),
    printcolumn(
        name = "New",
        type_ = "integer",
        json_path = ".status.proxies.new",
        description = "Proxies on the new revision"
    ),
    printcolumn(name = "Phase", type_ = "string", json_path = ".status.phase"),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [
    {"rule": "self.fromTag != self.toTag", "message": "fromTag and toTag must differ", "fieldPath": ".toTag"},
    {"rule": "self.fromRevision != self.toRevision", "message": "fromRevision and toRevision must differ", "fieldPath": ".toRevision"},
    {"rule": "self.fromTag == oldSelf.fromTag && self.fromRevision == oldSelf.fromRevision", "message": "fromTag and fromRevision are immutable: namespaces already moved were chosen by them; create a new RevisionUpgrade for another move", "fieldPath": ".fromTag"},
    {"rule": "self.toTag == oldSelf.toTag && self.toRevision == oldSelf.toRevision", "message": "toTag and toRevision are immutable: pods already restarted run that revision; create a new RevisionUpgrade for another move", "fieldPath": ".toTag"}
]))]
pub struct RevisionUpgradeSpec {
    /// Revision tag namespaces move from (e.g. `stable`).
    #[schemars(
        length(min = 1, max = 63),
        regex(pattern = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
    )]
    pub from_tag: String,
    /// Istio revision the from tag points to (e.g. `1-27`); proxies injected by it are "old".
    #[schemars(
        length(min = 1, max = 63),
        regex(pattern = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
    )]
    pub from_revision: String,
    /// Revision tag namespaces move to (e.g. `canary`).
    #[schemars(
        length(min = 1, max = 63),
        regex(pattern = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
    )]
    pub to_tag: String,
    /// Istio revision the to tag points to (e.g. `1-28`); proxies injected by it are "new".
    #[schemars(
        length(min = 1, max = 63),
        regex(pattern = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
    )]
    pub to_revision: String,
    /// Waves of namespaces, in order; a namespace belongs to the first wave whose selector
    /// matches it. Default: low-risk (`sluice.dev/risk-tier=low`, ≈5% of proxies), tier-2
    /// (`sluice.dev/risk-tier=tier-2`, ≈30%), tier-1 (every remaining namespace on the from tag).
    /// 1..16; names unique.
    #[serde(default = "default_waves")]
    #[schemars(length(min = 1, max = 16))]
    #[schemars(extend("x-kubernetes-validations" = [
        {"rule": "size(self) >= 1", "message": "at least one wave is required"},
        {"rule": "self.all(a, self.filter(b, b.name == a.name).size() == 1)", "message": "wave names must be unique"}
    ]))]
    pub waves: Vec<NamespaceWave>,
    /// How pods are restarted. Default: Evict.
    #[serde(default)]
    pub restart: RestartMode,
    /// The availability floor of workloads no PodDisruptionBudget covers (the Eviction API
    /// honours PodDisruptionBudgets only). Default: each such workload's own
    /// `rollingUpdate.maxUnavailable`, else 1; single-replica workloads by rollout restart.
    #[serde(default)]
    pub disruption: WorkloadDisruption,
    /// The SVID issuance budget restarts must stay within. Default: 200/s, depth 2000, peak 2000/s.
    #[serde(default)]
    pub issuance_budget: IssuanceBudget,
    /// Gates judged during each wave's soak. Absent or empty: `mesh-error-ratio` (the
    /// mesh-attributed error ratio of requests to each namespace the wave moved, at most 1%,
    /// per namespace; a namespace without traffic is no news) and `xds-nack-increase` (no xDS
    /// NACK in the cluster). A gate whose PromQL names `{{namespace}}` is judged once per
    /// namespace of the wave; the worst verdict counts. At most 16; names unique.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16))]
    #[schemars(extend("x-kubernetes-validations" = [
        {"rule": "self.all(a, self.filter(b, b.name == a.name).size() == 1)", "message": "gate names must be unique"}
    ]))]
    pub gates: Vec<Gate>,
    /// Time between two analyses. Default: 30s.
    #[serde(default = "default_analysis_interval")]
    pub analysis_interval: DurationString,
    /// What a sustained Inconclusive verdict does when a gate sets no policy. Default: Pause
    /// after 5m. A gate that cannot be evaluated as configured (a missing GateTemplate, an
    /// unknown `{{variable}}`, a query that does not parse) is Inconclusive under this policy.
    #[serde(default)]
    pub inconclusive: InconclusivePolicy,
    /// Control: set true to abort: moved namespaces are retagged back and restarted (paced).
    /// Default: false.
    #[serde(default)]
    pub abort: bool,
    /// Control: set true to stop starting restarts and waves; false resumes. Default: false.
    #[serde(default)]
    pub paused: bool,
    /// Control: increase to resume after an abort (with `abort` false); the operator records
    /// the value it acted on in `status.resumesHandled`. Default: 0.
    #[serde(default)]
    pub resume: u32,
}

fn default_analysis_interval() -> DurationString {
    DurationString::new(DEFAULT_ANALYSIS_INTERVAL)
}

fn tier_wave(name: &str, tier: Option<&str>) -> NamespaceWave {
    NamespaceWave {
        name: name.into(),
        namespace_selector: LabelSelector {
            match_labels: tier
                .map(|t| BTreeMap::from([(RISK_TIER_LABEL.to_owned(), t.to_owned())])),
            match_expressions: None,
        },
        soak: None,
    }
}

/// The default waves: low-risk, tier-2, then every remaining namespace.
pub fn default_waves() -> Vec<NamespaceWave> {
    vec![
        tier_wave("low-risk", Some("low")),
        tier_wave("tier-2", Some("tier-2")),
        tier_wave("tier-1", None),
    ]
}

impl RevisionUpgradeSpec {
    /// The soak of wave `index`: its own, else 15m. `None` for an index out of range.
    pub fn soak_of(&self, index: usize) -> Option<DurationString> {
        let wave = self.waves.get(index)?;
        Some(
            wave.soak
                .clone()
                .unwrap_or_else(|| DurationString::new(DEFAULT_WAVE_SOAK)),
        )
    }

    /// The gates to judge: `spec.gates`, or the upgrade's defaults when empty
    /// ([`default_gates`]).
    pub fn effective_gates(&self) -> Vec<Gate> {
        if !self.gates.is_empty() {
            return self.gates.clone();
        }
        default_gates()
    }
}

/// The default gates' mesh error ratio, per namespace of the wave: requests to the namespace's
/// services (as their sources report them) that the mesh failed — an Envoy response flag other
/// than none (`-`) and downstream disconnect (`DC`) — over all of them, and the request count as
/// samples. Scoped to one namespace so a regression of the moved proxies is not diluted by the
/// rest of the cluster.
pub const UPGRADE_MESH_ERROR_RATIO: &str = concat!(
    "label_replace((sum by ({{by}}) (increase(istio_requests_total{reporter=\"source\", cluster=\"{{cluster}}\", destination_service_namespace=\"{{namespace}}\", response_flags!~\"-|DC\"}[{{window}}]))",
    " or sum by ({{by}}) (increase(istio_requests_total{reporter=\"source\", cluster=\"{{cluster}}\", destination_service_namespace=\"{{namespace}}\"}[{{window}}])) * 0)",
    " / sum by ({{by}}) (increase(istio_requests_total{reporter=\"source\", cluster=\"{{cluster}}\", destination_service_namespace=\"{{namespace}}\"}[{{window}}])), \"sluice_part\", \"value\", \"\", \"\")",
    " or label_replace(sum by ({{by}}) (increase(istio_requests_total{reporter=\"source\", cluster=\"{{cluster}}\", destination_service_namespace=\"{{namespace}}\"}[{{window}}])), \"sluice_part\", \"samples\", \"\", \"\")"
);

/// The default gates' p99 latency, per namespace of the wave: the 99th percentile (ms) of the
/// requests to the namespace's services as their sources report them, and the request count as
/// samples. Judged against the same query over the window that ends when the wave started
/// (before its first restart), captured once and kept in `status.capturedBaselines`.
pub const UPGRADE_LATENCY_P99: &str = concat!(
    "label_replace(histogram_quantile(0.99, sum by (le, {{by}}) (rate(istio_request_duration_milliseconds_bucket{reporter=\"source\", cluster=\"{{cluster}}\", destination_service_namespace=\"{{namespace}}\"}[{{window}}]))), \"sluice_part\", \"value\", \"\", \"\")",
    " or label_replace(sum by ({{by}}) (increase(istio_requests_total{reporter=\"source\", cluster=\"{{cluster}}\", destination_service_namespace=\"{{namespace}}\"}[{{window}}])), \"sluice_part\", \"samples\", \"\", \"\")"
);

/// The default p99 gate's allowed rise: at most this many times the namespace's pre-wave p99…
pub const UPGRADE_LATENCY_P99_FACTOR: f64 = 1.5;
/// …plus this many milliseconds.
pub const UPGRADE_LATENCY_P99_SLACK_MS: f64 = 25.0;

/// The gates a RevisionUpgrade judges when it names none:
/// - the mesh error ratio of each moved namespace (at most 1%, at least 20 requests, two failing
///   evaluations in a row; Inconclusive for 2m continues: a namespace with too little traffic is
///   no news);
/// - the p99 latency of each moved namespace against its own p99 before the wave started: at
///   most 1.5 × baseline + 25 ms, at least 200 requests in the 2m window and in the baseline's
///   (two in the 1% tail), two failing evaluations in a row, Inconclusive for 2m continues. A
///   new sidecar adds about a millisecond; a rise of half the service's own tail is a
///   regression, not noise. The 25 ms floor keeps a fast service (p99 of a few ms) from failing
///   on a handful of requests crossing Istio's coarse buckets (10, 25, 50 ms);
/// - no xDS NACK increase in the cluster (any NACK of the new revision's config fails; a
///   cluster-wide count is not diluted).
///
/// All need only the variables the upgrade supplies.
pub fn default_gates() -> Vec<Gate> {
    let mut errors = Gate {
        name: "mesh-error-ratio".into(),
        template_ref: None,
        definition: super::gate::GateDefinition {
            promql: Some(UPGRADE_MESH_ERROR_RATIO.into()),
            comparison: Some(super::gate::Comparison::absolute(
                super::gate::ComparisonOp::LessOrEqual,
                0.01,
            )),
            min_samples: Some(20),
            consecutive_failures: Some(2),
            inconclusive: Some(InconclusivePolicy {
                action: super::gate::InconclusiveAction::Continue,
                after: DurationString::new("2m"),
            }),
            ..Default::default()
        },
        variables: BTreeMap::new(),
    };
    errors.definition.window = Some(DurationString::new("2m"));
    let mut comparison = super::gate::Comparison::relative(
        super::gate::BaselineSource::PreChangeWindow,
        UPGRADE_LATENCY_P99_FACTOR,
    );
    if let Some(r) = comparison.relative.as_mut() {
        r.slack = Some(UPGRADE_LATENCY_P99_SLACK_MS);
    }
    let latency = Gate {
        name: "latency-p99".into(),
        template_ref: None,
        definition: super::gate::GateDefinition {
            promql: Some(UPGRADE_LATENCY_P99.into()),
            comparison: Some(comparison),
            window: Some(DurationString::new("2m")),
            min_samples: Some(200),
            consecutive_failures: Some(2),
            inconclusive: Some(InconclusivePolicy {
                action: super::gate::InconclusiveAction::Continue,
                after: DurationString::new("2m"),
            }),
            ..Default::default()
        },
        variables: BTreeMap::new(),
    };
    vec![
        errors,
        latency,
        Gate::builtin("xds-nack-increase", BuiltinGate::XdsNackIncrease),
    ]
}

/// A wave of namespaces.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NamespaceWave {
    /// Name of the wave, unique in the upgrade.
    #[schemars(
        length(min = 1, max = 63),
        regex(pattern = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
    )]
    pub name: String,
    /// Namespaces of this wave (among those labelled `istio.io/rev=<fromTag>` not taken by an
    /// earlier wave). An empty selector matches every remaining namespace. At most 16
    /// `matchLabels`, at most 16 `matchExpressions` of at most 32 values each.
    #[schemars(transform = super::common::bounded_label_selector)]
    pub namespace_selector: LabelSelector,
    /// How long the wave soaks with gates green after its last restart. Default: 15m.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub soak: Option<DurationString>,
}

/// How meshed pods are restarted.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[schemars(transform = super::common::drop_type_description)]
pub enum RestartMode {
    /// Evict pods one by one through the Eviction API (honours PodDisruptionBudgets, works for
    /// pods of any controller). The default.
    #[default]
    Evict,
    /// Patch the owning Deployment/StatefulSet/DaemonSet's pod template restart annotation, for
    /// workloads that must surge.
    RolloutRestart,
}

/// The floor kept for workloads without a PodDisruptionBudget: a workload of `replicas` pods
/// may have at most `maxUnavailable` of them unavailable (not Available, missing, terminating
/// or being evicted) at any time; its next pod is evicted only when that still holds.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct WorkloadDisruption {
    /// Pods of a workload without a PodDisruptionBudget that may be unavailable at once when
    /// the workload declares no `rollingUpdate.maxUnavailable` of its own. At least 1.
    /// Default: 1.
    #[serde(default = "default_max_unavailable")]
    #[schemars(range(min = 1, max = 10000))]
    pub default_max_unavailable: u32,
    /// How a workload whose floor allows no eviction is restarted: one replica, or its own
    /// `maxUnavailable` resolving to 0. `RolloutRestart` (the default) sets its pod template's
    /// restart annotation so its controller surges a new pod before removing the old one;
    /// `Evict` evicts it anyway (the workload is unavailable until its replacement is Ready).
    #[serde(default)]
    pub no_eviction_allowed: NoEvictionAllowed,
}

/// Default for [`WorkloadDisruption::default_max_unavailable`].
pub const DEFAULT_MAX_UNAVAILABLE: u32 = 1;

fn default_max_unavailable() -> u32 {
    DEFAULT_MAX_UNAVAILABLE
}

impl Default for WorkloadDisruption {
    fn default() -> Self {
        Self {
            default_max_unavailable: DEFAULT_MAX_UNAVAILABLE,
            no_eviction_allowed: NoEvictionAllowed::default(),
        }
    }
}

/// What restarts a workload whose availability floor allows no eviction.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[schemars(transform = super::common::drop_type_description)]
pub enum NoEvictionAllowed {
    /// Rollout restart (Deployment, StatefulSet, DaemonSet): the controller surges within its
    /// own strategy. Pods of other controllers are left on the old revision and reported.
    #[default]
    RolloutRestart,
    /// Evict anyway, one pod at a time (an outage for a single-replica workload).
    Evict,
}

/// A token bucket on SVID issuance (one restarted pod costs one SVID), shrunk by the background
/// issuance observed in the metrics.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [
    {"rule": "self.rate > 0", "message": "rate must be greater than 0", "fieldPath": ".rate"},
    {"rule": "self.depth > 0", "message": "depth must be greater than 0", "fieldPath": ".depth"},
    {"rule": "self.peakPerSecond >= self.rate", "message": "peakPerSecond must be at least rate", "fieldPath": ".peakPerSecond"}
]))]
pub struct IssuanceBudget {
    /// Sustained SVID issuance allowed, per second (including background issuance). Default: 200.
    #[serde(default = "default_rate")]
    #[schemars(range(min = 1, max = 100000))]
    pub rate: u32,
    /// Bucket depth: SVIDs that may be issued in a burst. Default: 2000.
    #[serde(default = "default_depth")]
    #[schemars(range(min = 1, max = 1000000))]
    pub depth: u32,
    /// Cap on SVIDs issued in any one second. Default: 2000.
    #[serde(default = "default_peak")]
    #[schemars(range(min = 1, max = 1000000))]
    pub peak_per_second: u32,
}

fn default_rate() -> u32 {
    DEFAULT_ISSUANCE_RATE
}
fn default_depth() -> u32 {
    DEFAULT_ISSUANCE_DEPTH
}
fn default_peak() -> u32 {
    DEFAULT_ISSUANCE_PEAK_PER_SECOND
}

impl Default for IssuanceBudget {
    fn default() -> Self {
        Self {
            rate: DEFAULT_ISSUANCE_RATE,
            depth: DEFAULT_ISSUANCE_DEPTH,
            peak_per_second: DEFAULT_ISSUANCE_PEAK_PER_SECOND,
        }
    }
}

/// Lifecycle phase of a RevisionUpgrade.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[schemars(transform = super::common::drop_type_description)]
pub enum RevisionUpgradePhase {
    /// Not started.
    #[default]
    Pending,
    /// Relabelling and restarting a wave.
    Progressing,
    /// A wave's restarts are done; soaking with gates evaluated.
    Soaking,
    /// Held by spec.paused, a sustained Inconclusive verdict or the issuance budget.
    Paused,
    /// Retagging moved namespaces back and restarting them.
    RollingBack,
    /// Rolled back (a mixed fleet is a valid stopping point); resume is explicit.
    Aborted,
    /// Zero proxies run the old revision.
    Complete,
    /// The spec is invalid; see the Ready condition.
    Invalid,
}

/// Proxy counts by injecting revision (from each pod's `sidecar.istio.io/status`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ProxyCounts {
    /// Proxies injected by spec.fromRevision.
    pub old: u32,
    /// Proxies injected by spec.toRevision.
    pub new: u32,
    /// Proxies injected by any other revision.
    pub other: u32,
    /// When counted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_at: Option<Time>,
}

/// State of one namespace in the upgrade.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[schemars(transform = super::common::drop_type_description)]
pub enum NamespaceState {
    /// Not yet relabelled.
    #[default]
    Pending,
    /// Relabelled to the new tag; pods restarting.
    Restarting,
    /// Every meshed pod runs the new revision.
    Moved,
    /// Relabelled back to the old tag; pods restarting.
    RollingBack,
    /// Back on the old revision.
    RolledBack,
}

/// Progress of one namespace.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NamespaceProgress {
    /// Namespace name.
    pub name: String,
    /// Name of its wave.
    pub wave: String,
    /// Pending, Restarting, Moved, RollingBack or RolledBack.
    #[serde(default)]
    pub state: NamespaceState,
    /// Meshed pods in the namespace.
    #[serde(default)]
    pub pods: u32,
    /// Pods whose injector-recorded revision is the target of the current direction.
    #[serde(default)]
    pub pods_done: u32,
    /// Pods with no controller (restarted by eviction only, reported).
    #[serde(default)]
    pub bare_pods: u32,
    /// When the namespace was relabelled.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub relabelled_at: Option<Time>,
    /// When every pod was done.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub done_at: Option<Time>,
}

/// A namespace relabelled back by someone else.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RelabelDetection {
    /// Namespace name.
    pub namespace: String,
    /// The `istio.io/rev` value found.
    pub found: String,
    /// When it was detected.
    pub detected_at: Time,
}

/// A workload whose replacement pod came back on the revision it was moved away from: sluice
/// stops restarting it (it would be evicted again for ever) and reports it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct WorkloadReport {
    /// Namespace.
    #[schemars(length(max = 63))]
    pub namespace: String,
    /// Controller kind (Deployment, StatefulSet, DaemonSet, ...).
    #[schemars(length(max = 63))]
    pub kind: String,
    /// Controller name.
    #[schemars(length(max = 253))]
    pub name: String,
    /// The pod that showed it.
    #[schemars(length(max = 253))]
    pub pod: String,
    /// The revision (or, for a pod-level override, the `istio.io/rev` value) found.
    #[schemars(length(max = 63))]
    pub found: String,
    /// When it was detected.
    pub detected_at: Time,
}

/// Live state of the issuance budget.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct IssuanceBudgetStatus {
    /// Tokens in the bucket, SVIDs.
    pub tokens: f64,
    /// Background issuance observed (all issuance minus sluice's own restarts), per second.
    pub background_rate: f64,
    /// Total issuance observed, per second.
    pub observed_rate: f64,
    /// Restarts started by sluice in the last second.
    #[serde(default)]
    pub own_restarts_last_second: u32,
    /// Whether restarts are held because observed issuance is over budget.
    #[serde(default)]
    pub throttled: bool,
    /// When updated.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub updated_at: Option<Time>,
}

/// State of one wave.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[schemars(transform = super::common::drop_type_description)]
pub enum UpgradeWaveState {
    /// Not started.
    #[default]
    Pending,
    /// Relabelling and restarting.
    Restarting,
    /// Soaking.
    Soaking,
    /// Soak ended with every gate green.
    Passed,
    /// A gate failed during the soak.
    Failed,
    /// Rolled back.
    RolledBack,
}

/// Per-wave state and readings.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct UpgradeWaveStatus {
    /// Name of the wave.
    pub name: String,
    /// Pending, Restarting, Soaking, Passed, Failed or RolledBack.
    #[serde(default)]
    pub state: UpgradeWaveState,
    /// Namespaces in the wave.
    #[serde(default)]
    pub namespaces: u32,
    /// When the wave started.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_at: Option<Time>,
    /// When its soak started.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub soak_started_at: Option<Time>,
    /// When it passed or failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finished_at: Option<Time>,
    /// Latest verdict per gate.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub gates: Vec<GateVerdict>,
}

/// Observed state of a RevisionUpgrade; the operator's state machine.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RevisionUpgradeStatus {
    /// The metadata.generation the status reflects.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// Pending, Progressing, Soaking, Paused, RollingBack, Aborted, Complete or Invalid.
    #[serde(default)]
    pub phase: RevisionUpgradePhase,
    /// Name of the wave in progress.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub current_wave: Option<String>,
    /// Index of that wave in spec.waves.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub current_wave_index: Option<u32>,
    /// Proxies per revision, counted from the injector-recorded revision of each pod.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub proxies: Option<ProxyCounts>,
    /// Namespaces touched by the upgrade and their progress.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub namespaces: Vec<NamespaceProgress>,
    /// Namespaces relabelled back to the old tag by someone else.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub relabelled_back: Vec<RelabelDetection>,
    /// Namespaces using `istio-injection=enabled` (ignores `istio.io/rev`; not moved).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub injection_enabled_namespaces: Vec<String>,
    /// Workloads whose replacement came back on the revision they were moved away from
    /// (stopped, never evicted again; at most 64 listed).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64))]
    pub reinjected_by_old_revision: Vec<WorkloadReport>,
    /// Workloads of namespaces in the upgrade whose pods carry their own `istio.io/rev` label
    /// naming another revision than the target (relabelling the namespace cannot move them;
    /// they are not restarted; at most 64 listed).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64))]
    pub pod_revision_overrides: Vec<WorkloadReport>,
    /// Namespaces on the from tag (or in the upgrade) whose labels Argo CD manages: a
    /// self-healing Application would put `istio.io/rev` back (at most 64 listed).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64))]
    pub argo_cd_managed_namespaces: Vec<String>,
    /// The issuance budget's live state.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub issuance_budget: Option<IssuanceBudgetStatus>,
    /// Per-wave state and readings.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub waves: Vec<UpgradeWaveStatus>,
    /// Baselines captured once from a pre-change window.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub captured_baselines: Vec<CapturedBaseline>,
    /// The spec.resume value last acted on.
    #[serde(default)]
    pub resumes_handled: u32,
    /// When the upgrade aborted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub aborted_at: Option<Time>,
    /// When zero proxies remained on the old revision.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub completed_at: Option<Time>,
    /// Conditions (Ready, Progressing, OldRevisionRetirable, BudgetThrottled, RelabelledBack,
    /// InjectionLabelFound), one per type.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,
}

/// Condition types of a RevisionUpgrade.
pub mod conditions {
    /// The spec is valid and the operator acts on it.
    pub const READY: &str = "Ready";
    /// Namespaces are being moved.
    pub const PROGRESSING: &str = "Progressing";
    /// Zero proxies run the old revision; its control plane may be removed.
    pub const OLD_REVISION_RETIRABLE: &str = "OldRevisionRetirable";
    /// Restarts are held by the issuance budget.
    pub const BUDGET_THROTTLED: &str = "BudgetThrottled";
    /// A moved namespace was relabelled back by someone else.
    pub const RELABELLED_BACK: &str = "RelabelledBack";
    /// Namespaces use `istio-injection=enabled`.
    pub const INJECTION_LABEL_FOUND: &str = "InjectionLabelFound";
    /// A replacement pod came back on the revision it was moved away from.
    pub const REINJECTED_BY_OLD_REVISION: &str = "ReinjectedByOldRevision";
    /// Pods of the upgrade's namespaces pin their revision with their own label.
    pub const POD_REVISION_OVERRIDE: &str = "PodRevisionOverride";
    /// Namespaces of the upgrade have labels Argo CD manages.
    pub const ARGO_CD_MANAGED_NAMESPACES: &str = "ArgoCDManagedNamespaces";
}

/// Condition reasons of a RevisionUpgrade.
pub mod reasons {
    /// The spec is invalid; the message names the field.
    pub const INVALID_SPEC: &str = "InvalidSpec";
    /// The spec is valid.
    pub const VALID: &str = "Valid";
    /// A tag's webhook is missing or points at another revision.
    pub const TAG_MISMATCH: &str = "TagMismatch";
    /// A wave is restarting.
    pub const WAVE_RESTARTING: &str = "WaveRestarting";
    /// A wave is soaking.
    pub const SOAKING: &str = "Soaking";
    /// A gate failed.
    pub const GATE_FAILED: &str = "GateFailed";
    /// `Ready=False` while a gate of the current wave cannot be evaluated as configured (a
    /// missing GateTemplate, an unknown `{{variable}}`, a query that does not parse); the message
    /// names the gate and the field. The same reason a Rollout reports.
    pub const GATE_MISCONFIGURED: &str = "GateMisconfigured";
    /// Aborted by spec.abort.
    pub const ABORTED_MANUALLY: &str = "AbortedManually";
    /// Rolled back.
    pub const ROLLED_BACK: &str = "RolledBack";
    /// Held by spec.paused.
    pub const PAUSED: &str = "Paused";
    /// Observed issuance is over budget.
    pub const OVER_BUDGET: &str = "OverBudget";
    /// Issuance is within budget.
    pub const WITHIN_BUDGET: &str = "WithinBudget";
    /// A PodDisruptionBudget blocks an eviction.
    pub const DISRUPTION_BUDGET_BLOCKED: &str = "DisruptionBudgetBlocked";
    /// Proxies still run the old revision.
    pub const OLD_PROXIES_REMAIN: &str = "OldProxiesRemain";
    /// Zero proxies run the old revision.
    pub const NO_OLD_PROXIES: &str = "NoOldProxies";
    /// A namespace was relabelled back.
    pub const NAMESPACE_RELABELLED_BACK: &str = "NamespaceRelabelledBack";
    /// Namespaces use the legacy injection label.
    pub const LEGACY_INJECTION_LABEL: &str = "LegacyInjectionLabel";
    /// A workload's replacement came back on the old revision; the workload is stopped.
    pub const REINJECTED_BY_OLD_REVISION: &str = "ReinjectedByOldRevision";
    /// No replacement came back on the old revision.
    pub const NO_REINJECTION: &str = "NoReinjection";
    /// Pods carry their own `istio.io/rev` label.
    pub const POD_REVISION_OVERRIDE: &str = "PodRevisionOverride";
    /// No pod overrides its namespace's revision.
    pub const NO_POD_OVERRIDE: &str = "NoPodOverride";
    /// Argo CD tracks namespaces of the upgrade.
    pub const ARGO_CD_MANAGES_NAMESPACE_LABELS: &str = "ArgoCDManagesNamespaceLabels";
    /// No namespace of the upgrade is tracked by Argo CD.
    pub const NO_ARGO_CD_NAMESPACES: &str = "NoArgoCDNamespaces";
    /// A workload without a PodDisruptionBudget is at its availability floor.
    pub const AT_AVAILABILITY_FLOOR: &str = "AtAvailabilityFloor";
    /// An earlier RevisionUpgrade of the cluster is in progress; this one waits.
    pub const WAITING_FOR_UPGRADE: &str = "WaitingForUpgrade";
    /// A wave that started was removed from the spec; the upgrade holds.
    pub const STARTED_WAVE_REMOVED: &str = "StartedWaveRemoved";
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_apply() {
        let spec: RevisionUpgradeSpec = serde_json::from_value(serde_json::json!({
            "fromTag": "stable", "fromRevision": "1-27", "toTag": "canary", "toRevision": "1-28"
        }))
        .unwrap();
        assert_eq!(spec.waves.len(), 3);
        assert_eq!(spec.waves[0].name, "low-risk");
        assert!(spec.waves[2].namespace_selector.match_labels.is_none());
        assert_eq!(spec.issuance_budget, IssuanceBudget::default());
        assert_eq!(spec.issuance_budget.rate, 200);
        assert_eq!(spec.issuance_budget.depth, 2000);
        assert_eq!(spec.issuance_budget.peak_per_second, 2000);
        assert_eq!(spec.restart, RestartMode::Evict);
        assert_eq!(spec.soak_of(1).unwrap().as_str(), "15m");
        assert_eq!(spec.soak_of(3), None);
        assert_eq!(spec.effective_gates().len(), 3);
    }
}
