//! `WaveGate`: one per site; gates the site's ApplicationSet across cluster waves by publishing
//! `status.decisions`, the list Argo CD's clusterDecisionResource generator reads.
//!
//! Owns the kind's wire shape, its defaults, and its condition types and reasons. Never decides
//! a wave and never touches Argo CD objects; wave-gate does.

// Repeated `printcolumn(type_ = ...)` entries are distinct columns, not duplicates.
#![allow(clippy::duplicated_attributes)]

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::common::{DurationString, NamespacedObjectRef, SecretKeysRef};
use super::gate::{BuiltinGate, CapturedBaseline, Gate, GateVerdict, InconclusivePolicy};

/// Soak of the first wave when it sets none (seed: 10 minutes on the canary cluster).
pub const DEFAULT_FIRST_WAVE_SOAK: &str = "10m";
/// Soak of later waves when neither they nor `spec.defaultSoak` set one (seed: 15 minutes).
pub const DEFAULT_SOAK: &str = "15m";
/// Default time a wave may take to converge (Synced, Healthy, drift ~0) before the change halts.
pub const DEFAULT_CONVERGENCE_TIMEOUT: &str = "30m";
/// Default analysis interval.
pub const DEFAULT_ANALYSIS_INTERVAL: &str = "30s";
/// Label on the drift exporter's metric naming the cluster (the contract's default).
pub const DEFAULT_DRIFT_CLUSTER_LABEL: &str = "cluster";
/// Label on the drift exporter's metric naming the bundle's source commit (the contract's default).
pub const DEFAULT_DRIFT_COMMIT_LABEL: &str = "commit";

/// `statusListKey` of the duck-type ConfigMap Argo CD's clusterDecisionResource generator reads:
/// the decisions live in `status.decisions`.
pub const DUCK_STATUS_LIST_KEY: &str = "decisions";
/// `matchKey` of the duck-type ConfigMap: each decision names its cluster in `clusterName`.
pub const DUCK_MATCH_KEY: &str = "clusterName";
/// `kind` of the duck-type ConfigMap: Argo CD expects the plural resource name.
pub const DUCK_RESOURCE: &str = "wavegates";

/// A site's wave gate for mesh configuration changes, and Argo CD's Cluster Decision Resource.
#[derive(CustomResource, Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "sluice.dev",
    version = "v1alpha1",
    kind = "WaveGate",
    plural = "wavegates",
    namespaced,
    status = "WaveGateStatus",
    shortname = "swg",
    category = "sluice",
    doc = "Gates one site's ApplicationSet across cluster waves: status.decisions lists every cluster of the site with the bundle revision admitted for it.",
    printcolumn(name = "Revision", type_ = "string", json_path = ".spec.revision"),
    printcolumn(name = "Wave", type_ = "string", json_path = ".status.currentWave"),
    printcolumn(name = "Phase", type_ = "string", json_path = ".status.phase"),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [
    {"rule": "!has(self.previousRevision) || self.previousRevision != self.revision", "message": "previousRevision must differ from revision", "fieldPath": ".previousRevision"},
    {"rule": "!has(self.emergency) || self.emergency.revision == self.revision || (oldSelf.hasValue() && has(oldSelf.value().emergency) && oldSelf.value().emergency == self.emergency)", "optionalOldSelf": true, "message": "emergency.revision must equal spec.revision (an emergency applies to one change; one kept unchanged from an earlier revision is ignored)", "fieldPath": ".emergency.revision"}
]))]
pub struct WaveGateSpec {
    /// Name of the site this WaveGate governs (e.g. `eu-west`); used in metrics and cross-site
    /// waits.
    #[schemars(
        length(min = 1, max = 63),
        regex(pattern = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
    )]
    pub site: String,
    /// The ApplicationSet whose clusterDecisionResource generator reads this WaveGate. It must
    /// use `applicationsSync: create-update` and `preserveResourcesOnDeletion: true`.
    pub application_set_ref: NamespacedObjectRef,
    /// OCI repository of the configuration bundles (`oci://host[:port]/path`, no tag or digest).
    #[schemars(
        length(min = 1, max = 512),
        regex(pattern = r"^(oci://)?[a-zA-Z0-9.-]+(:[0-9]+)?(/[a-z0-9._-]+)+$")
    )]
    pub repository: String,
    /// The bundle revision to roll out: its manifest digest (`sha256:` + 64 hex), as Argo CD
    /// reports the synced revision of an OCI source.
    #[schemars(length(min = 71, max = 71), regex(pattern = r"^sha256:[a-f0-9]{64}$"))]
    pub revision: String,
    /// The revision clusters run before this change, pinned back to on a breach. Absent: the
    /// operator's `status.previousRevision` (the last revision that completed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 71, max = 71), regex(pattern = r"^sha256:[a-f0-9]{64}$"))]
    pub previous_revision: Option<String>,
    /// Source commit sha of the bundle at `revision` (its `org.opencontainers.image.revision`
    /// annotation): the value of the drift exporter's commit label. Required when
    /// `driftGate.exporter` is Platform (the operator refuses the spec otherwise).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 7, max = 64), regex(pattern = r"^[a-f0-9]+$"))]
    pub source_commit: Option<String>,
    /// Waves in order. Every cluster of the site is named in exactly one wave. 1..16 waves.
    #[schemars(length(min = 1, max = 16))]
    #[schemars(extend("x-kubernetes-validations" = [
        {"rule": "size(self) >= 1", "message": "at least one wave is required"},
        {"rule": "self.all(w, w.clusters.all(c, self.filter(v, c in v.clusters).size() == 1))", "message": "a cluster may appear in at most one wave"},
        {"rule": "self.all(w, w.clusters.all(c, w.clusters.filter(d, d == c).size() == 1))", "message": "a cluster may appear only once in a wave"},
        {"rule": "self.all(a, self.filter(b, b.name == a.name).size() == 1)", "message": "wave names must be unique"}
    ]))]
    pub waves: Vec<Wave>,
    /// Soak of waves after the first that set none. Default: 15m (the first wave: 10m).
    #[serde(default = "default_soak")]
    pub default_soak: DurationString,
    /// Time a wave may take to converge (Applications Synced at the revision and Healthy, drift
    /// ~0) before the change halts. Default: 30m.
    #[serde(default = "default_convergence_timeout")]
    pub convergence_timeout: DurationString,
    /// Gates judged during each wave's soak. Absent or empty: the built-ins MeshErrorRatio,
    /// XdsNackIncrease and ProxiesBehind. At most 16; names unique.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16))]
    #[schemars(extend("x-kubernetes-validations" = [
        {"rule": "self.all(a, self.filter(b, b.name == a.name).size() == 1)", "message": "gate names must be unique"}
    ]))]
    pub gates: Vec<Gate>,
    /// The drift signal (proxies not yet on the new config). Required: either the platform's
    /// drift exporter metric contract, or `exporter: None` to skip the drift gate and report it.
    pub drift_gate: DriftGate,
    /// Time between two analyses. Default: 30s.
    #[serde(default = "default_analysis_interval")]
    pub analysis_interval: DurationString,
    /// What a sustained Inconclusive verdict does when a gate sets no policy. Default: Pause
    /// after 5m.
    #[serde(default)]
    pub inconclusive: InconclusivePolicy,
    /// How pins created on a breach verify the previous bundle.
    pub pin: WavePinSpec,
    /// Emergency change: admit every wave at once for this revision (audited: Event, status).
    /// Written with spec.revision; an emergency left unchanged when spec.revision moves (Argo CD
    /// keeps it across a Git sync) stays allowed and is ignored.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub emergency: Option<EmergencyChange>,
    /// When true, a new spec.revision replaces a halted change and starts again from the first
    /// wave. Default: false (a halted change blocks new revisions).
    #[serde(default)]
    pub supersede_halted: bool,
    /// Explicit releases of cross-site waits, for a site cut off from the others (audited).
    /// At most 16.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16))]
    pub wait_releases: Vec<WaitRelease>,
    /// The API server URL of clusters whose Applications the ApplicationSet addresses by
    /// `destination.server` instead of `destination.name`: an Application is matched to the
    /// cluster whose server equals its destination (`https://kubernetes.default.svc` is
    /// `in-cluster` unless listed). At most 1024.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 1024))]
    pub cluster_servers: Vec<ClusterServer>,
}

/// A cluster's name (as in `spec.waves[].clusters`) and its API server URL (as in an
/// Application's `destination.server`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ClusterServer {
    /// Argo CD cluster name.
    #[schemars(length(min = 1, max = 253))]
    pub cluster: String,
    /// Its API server URL, exactly as Applications name it.
    #[schemars(length(min = 1, max = 2048))]
    pub server: String,
}

/// The server URL of Argo CD's own cluster, named `in-cluster`.
pub const IN_CLUSTER_SERVER: &str = "https://kubernetes.default.svc";

impl WaveGateSpec {
    /// The cluster an Application addresses: its `destination.name`, else the cluster whose
    /// server (`spec.clusterServers`, or `in-cluster` for Argo CD's own) is its
    /// `destination.server`.
    pub fn cluster_of_destination(
        &self,
        name: Option<&str>,
        server: Option<&str>,
    ) -> Option<String> {
        if let Some(n) = name.filter(|n| !n.is_empty()) {
            return Some(n.to_owned());
        }
        let server = server?.trim_end_matches('/');
        self.cluster_servers
            .iter()
            .find(|c| c.server.trim_end_matches('/') == server)
            .map(|c| c.cluster.clone())
            .or_else(|| (server == IN_CLUSTER_SERVER).then(|| "in-cluster".to_owned()))
    }
}

fn default_soak() -> DurationString {
    DurationString::new(DEFAULT_SOAK)
}
fn default_convergence_timeout() -> DurationString {
    DurationString::new(DEFAULT_CONVERGENCE_TIMEOUT)
}
fn default_analysis_interval() -> DurationString {
    DurationString::new(DEFAULT_ANALYSIS_INTERVAL)
}

impl WaveGateSpec {
    /// The soak of wave `index`: its own, else 10m for the first wave and `defaultSoak` for the
    /// others. `None` for an index out of range.
    pub fn soak_of(&self, index: usize) -> Option<DurationString> {
        let wave = self.waves.get(index)?;
        Some(match (&wave.soak, index) {
            (Some(s), _) => s.clone(),
            (None, 0) => DurationString::new(DEFAULT_FIRST_WAVE_SOAK),
            (None, _) => self.default_soak.clone(),
        })
    }

    /// The gates to judge: `spec.gates`, or the built-in defaults when empty.
    pub fn effective_gates(&self) -> Vec<Gate> {
        if !self.gates.is_empty() {
            return self.gates.clone();
        }
        vec![
            Gate::builtin("mesh-error-ratio", BuiltinGate::MeshErrorRatio),
            Gate::builtin("xds-nack-increase", BuiltinGate::XdsNackIncrease),
            Gate::builtin("proxies-behind", BuiltinGate::ProxiesBehind),
        ]
    }

    /// The wave a cluster belongs to, by index.
    pub fn wave_of_cluster(&self, cluster: &str) -> Option<usize> {
        self.waves
            .iter()
            .position(|w| w.clusters.iter().any(|c| c == cluster))
    }

    /// Every cluster of the site, in wave order.
    pub fn all_clusters(&self) -> impl Iterator<Item = &str> {
        self.waves
            .iter()
            .flat_map(|w| w.clusters.iter().map(String::as_str))
    }
}

/// A wave of clusters admitted together.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Wave {
    /// Name of the wave, unique in the WaveGate (e.g. `canary`, `one-per-site`, `rest`).
    #[schemars(
        length(min = 1, max = 63),
        regex(pattern = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
    )]
    pub name: String,
    /// Argo CD cluster names in this wave (the `name` the cluster generator passes). 1..64.
    #[schemars(length(min = 1, max = 64), inner(length(min = 1, max = 253)))]
    pub clusters: Vec<String>,
    /// How long the wave soaks with gates green after converging. Default: 10m for the first
    /// wave, spec.defaultSoak (15m) for the others.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub soak: Option<DurationString>,
    /// Other sites this wave waits for: each must report the same revision past the named wave
    /// (observed through the global metrics view). At most 8.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 8))]
    pub wait_for: Vec<SiteWait>,
}

/// A wait on another site's progress.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SiteWait {
    /// The other site's name (its WaveGate's spec.site).
    #[schemars(length(min = 1, max = 63))]
    pub site: String,
    /// Name of the wave the other site must have passed with the same revision.
    #[schemars(length(min = 1, max = 63))]
    pub wave: String,
}

/// An explicit, audited release of cross-site waits for one revision.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct WaitRelease {
    /// The site whose progress no longer needs to be waited for.
    #[schemars(length(min = 1, max = 63))]
    pub site: String,
    /// The revision this release applies to (`sha256:` + 64 hex).
    #[schemars(length(min = 71, max = 71), regex(pattern = r"^sha256:[a-f0-9]{64}$"))]
    pub revision: String,
    /// Why (recorded in status and an Event). Required, at most 1024 characters.
    #[schemars(length(min = 1, max = 1024))]
    pub reason: String,
}

/// An emergency change that skips waves.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct EmergencyChange {
    /// The revision the emergency applies to; must equal spec.revision when the emergency is
    /// written or changed (an unchanged one from an earlier revision is ignored).
    #[schemars(length(min = 71, max = 71), regex(pattern = r"^sha256:[a-f0-9]{64}$"))]
    pub revision: String,
    /// Why waves are skipped (recorded in status and an Event). Required, at most 1024 characters.
    #[schemars(length(min = 1, max = 1024))]
    pub reason: String,
}

/// Whether the platform runs the drift exporter sluice reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[schemars(transform = super::common::drop_type_description)]
pub enum DriftExporter {
    /// The platform's drift exporter publishes the metric described by this contract.
    Platform,
    /// No drift exporter: the drift gate is skipped and reported (never a pass).
    None,
}

/// The drift metric contract: a gauge of proxies behind, labelled by cluster and by the
/// bundle's source commit (seed ADR-31).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [
    {"rule": "self.exporter == 'None' ? !has(self.metric) : has(self.metric)", "message": "set metric when exporter is Platform, and omit it when exporter is None"}
]))]
pub struct DriftGate {
    /// Platform or None. Required: a platform without an exporter must say so.
    pub exporter: DriftExporter,
    /// Name of the gauge (value: proxies not yet on the config of `commit`). Required with
    /// exporter Platform.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(
        length(min = 1, max = 256),
        regex(pattern = r"^[a-zA-Z_:][a-zA-Z0-9_:]*$")
    )]
    pub metric: Option<String>,
    /// Label naming the cluster. Default: cluster.
    #[serde(default = "default_drift_cluster_label")]
    #[schemars(length(min = 1, max = 128))]
    pub cluster_label: String,
    /// Label naming the bundle's source commit sha. Default: commit.
    #[serde(default = "default_drift_commit_label")]
    #[schemars(length(min = 1, max = 128))]
    pub commit_label: String,
    /// Most proxies behind that still counts as converged. Default: 0.
    #[serde(default)]
    pub max_proxies_behind: u32,
    /// Scrape job the gauge must come from (its `job` label). Set it to the exporter's job so
    /// that a workload exporting a gauge of the same name cannot stand in for the exporter; the
    /// drift query then reads the gauge alone (no proxies-evaluated count). 1..128 characters of
    /// `a-zA-Z0-9_.:/-`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 128), regex(pattern = r"^[a-zA-Z0-9_.:/-]+$"))]
    pub job: Option<String>,
}

fn default_drift_cluster_label() -> String {
    DEFAULT_DRIFT_CLUSTER_LABEL.into()
}
fn default_drift_commit_label() -> String {
    DEFAULT_DRIFT_COMMIT_LABEL.into()
}

/// Settings of the BundlePins a WaveGate creates on a breach.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct WavePinSpec {
    /// Secret (same namespace) holding the cosign public keys the pins verify with.
    pub public_keys_secret_ref: SecretKeysRef,
}

/// One entry of `status.decisions`: every value a string, as the clusterDecisionResource
/// generator passes each key to the ApplicationSet template.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ClusterDecision {
    /// Argo CD cluster name (the match key of the duck ConfigMap).
    pub cluster_name: String,
    /// Revision admitted for the cluster (`sha256:` + 64 hex); never empty.
    pub revision: String,
    /// Name of the cluster's wave.
    pub wave: String,
}

/// Lifecycle phase of a WaveGate.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[schemars(transform = super::common::drop_type_description)]
pub enum WaveGatePhase {
    /// Not yet adopted: no decisions published.
    #[default]
    Pending,
    /// A wave is admitted and converging.
    Progressing,
    /// A converged wave is soaking with gates evaluated.
    Soaking,
    /// A wave waits for another site.
    WaitingForSite,
    /// Every wave runs spec.revision.
    Complete,
    /// A breach or timeout halted the change; admitted clusters were pinned back.
    Halted,
    /// The ApplicationSet is unsafe (not create-update, or not preserving resources) or the
    /// spec is invalid; nothing is published.
    Refused,
}

/// State of one wave for the current change.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[schemars(transform = super::common::drop_type_description)]
pub enum WaveState {
    /// Not yet admitted.
    #[default]
    Pending,
    /// Waiting for other sites before admission.
    Waiting,
    /// Admitted; Applications converging.
    Converging,
    /// Converged; soaking.
    Soaking,
    /// Soak ended with every gate green.
    Passed,
    /// A gate failed or convergence timed out.
    Failed,
    /// Pinned back to the previous revision.
    Reverted,
    /// Admitted by an emergency change without soak.
    Skipped,
}

/// Application counts of a wave.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ApplicationCounts {
    /// Applications of the wave's clusters.
    pub total: u32,
    /// Applications Synced at the admitted revision.
    pub synced: u32,
    /// Applications Healthy.
    pub healthy: u32,
}

/// Per-wave state and readings.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct WaveStatus {
    /// Name of the wave.
    pub name: String,
    /// Pending, Waiting, Converging, Soaking, Passed, Failed, Reverted or Skipped.
    #[serde(default)]
    pub state: WaveState,
    /// Revision admitted for the wave.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revision: Option<String>,
    /// When the wave was admitted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub admitted_at: Option<Time>,
    /// When the wave converged (soak start).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub converged_at: Option<Time>,
    /// When the wave passed or failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finished_at: Option<Time>,
    /// Application counts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub applications: Option<ApplicationCounts>,
    /// Proxies behind the admitted config, as the drift exporter reports.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub proxies_behind: Option<f64>,
    /// Latest verdict per gate.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub gates: Vec<GateVerdict>,
    /// What the wave waits for, when state is Waiting.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub waiting_for: Option<String>,
}

/// Why a change halted.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[schemars(transform = super::common::drop_type_description)]
pub enum HaltReason {
    /// A gate's verdict was Fail.
    GateFailed,
    /// A gate stayed Inconclusive and its policy is Abort.
    InconclusiveTimeout,
    /// The wave did not converge within spec.convergenceTimeout.
    ConvergenceTimeout,
}

/// The halt decision and its consequences.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct HaltStatus {
    /// Why.
    pub reason: HaltReason,
    /// Detail.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// The wave that failed.
    pub wave: String,
    /// The failing gate with the values seen.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gate: Option<GateVerdict>,
    /// When the halt was decided.
    pub halted_at: Time,
    /// Names of the BundlePins created for the admitted clusters.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pins: Vec<String>,
    /// Clusters set back to the previous revision.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub reverted_clusters: Vec<String>,
    /// When the pins were created.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pinned_at: Option<Time>,
}

/// How a change ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[schemars(transform = super::common::drop_type_description)]
pub enum ChangeOutcome {
    /// Every wave passed.
    Complete,
    /// Halted and pinned back.
    Halted,
    /// Replaced by a newer revision.
    Superseded,
    /// Admitted everywhere by an emergency change.
    Emergency,
}

/// One change in the WaveGate's history.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ChangeRecord {
    /// The revision rolled out.
    pub revision: String,
    /// The revision it replaced.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub previous_revision: Option<String>,
    /// When wave 0 was admitted.
    pub started_at: Time,
    /// When the change ended; absent while it runs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finished_at: Option<Time>,
    /// How it ended; absent while it runs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub outcome: Option<ChangeOutcome>,
    /// Audit reason (emergency or wait release), when one applied.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// Observed state of a WaveGate; the operator's state machine and the decision list.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct WaveGateStatus {
    /// The metadata.generation the status reflects.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// Pending, Progressing, Soaking, WaitingForSite, Complete, Halted or Refused.
    #[serde(default)]
    pub phase: WaveGatePhase,
    /// Name of the wave in progress (or the last one, when Complete or Halted).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub current_wave: Option<String>,
    /// Index of that wave in spec.waves.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub current_wave_index: Option<u32>,
    /// The revision being rolled out (or last rolled out).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub current_revision: Option<String>,
    /// The revision before it (what a breach pins back to).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub previous_revision: Option<String>,
    /// The `spec.sourceCommit` the current revision's change started with: drift is read for
    /// it, and a new revision with the same commit is refused (a forgotten sourceCommit would
    /// read drift for the old commit, about 0, and converge at once).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 64))]
    pub source_commit: Option<String>,
    /// Every cluster of the site with its admitted revision and wave. Published only complete:
    /// an absent or empty list makes Argo CD delete the site's Applications.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub decisions: Vec<ClusterDecision>,
    /// Per-wave state and readings for the current change.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub waves: Vec<WaveStatus>,
    /// Baselines captured once from a pre-change window.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub captured_baselines: Vec<CapturedBaseline>,
    /// The halt, when halted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub halt: Option<HaltStatus>,
    /// Past changes, oldest first (the operator keeps the most recent 32).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub history: Vec<ChangeRecord>,
    /// Conditions (Ready, Progressing, ApplicationSetSafe, DriftSignal, Halted), one per type.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,
}

/// Condition types of a WaveGate.
pub mod conditions {
    /// The spec is valid and the operator acts on it.
    pub const READY: &str = "Ready";
    /// A change is moving through waves.
    pub const PROGRESSING: &str = "Progressing";
    /// The ApplicationSet uses create-update, preserves resources on deletion, and keeps its
    /// controller off every generated Application's sync policy.
    pub const APPLICATION_SET_SAFE: &str = "ApplicationSetSafe";
    /// The drift signal is present (False with reason DriftExporterAbsent when skipped).
    pub const DRIFT_SIGNAL: &str = "DriftSignal";
    /// The change halted.
    pub const HALTED: &str = "Halted";
}

/// Condition reasons of a WaveGate.
pub mod reasons {
    /// The spec is invalid; the message names the field.
    pub const INVALID_SPEC: &str = "InvalidSpec";
    /// The spec is valid.
    pub const VALID: &str = "Valid";
    /// The ApplicationSet does not use `applicationsSync: create-update`.
    pub const APPLICATIONS_SYNC_UNSAFE: &str = "ApplicationsSyncUnsafe";
    /// The ApplicationSet does not set `preserveResourcesOnDeletion: true`.
    pub const RESOURCES_NOT_PRESERVED: &str = "ResourcesNotPreserved";
    /// The ApplicationSet has no `ignoreApplicationDifferences` entry without a name covering
    /// `/spec/syncPolicy`, so revert would refuse every pin of a halt.
    pub const SYNC_POLICY_NOT_IGNORED: &str = "SyncPolicyNotIgnored";
    /// The ApplicationSet's clusterDecisionResource generator reads another resource.
    pub const NOT_THIS_WAVE_GATE: &str = "NotThisWaveGate";
    /// The Applications the ApplicationSet renders would not follow the decisions (template
    /// revision or destination, templatePatch, RollingSync).
    pub const TEMPLATE_NOT_FROM_DECISIONS: &str = "TemplateNotFromDecisions";
    /// The ApplicationSet was not found.
    pub const APPLICATION_SET_NOT_FOUND: &str = "ApplicationSetNotFound";
    /// The ApplicationSet is safe.
    pub const APPLICATION_SET_OK: &str = "ApplicationSetOk";
    /// Decisions published for every cluster at the current revision.
    pub const ADOPTED: &str = "Adopted";
    /// Not adopted yet: the revision the site runs is not known (set spec.previousRevision, or
    /// wait until every Application reports Synced at one revision).
    pub const ADOPTION_PENDING: &str = "AdoptionPending";
    /// A wave was admitted.
    pub const WAVE_ADMITTED: &str = "WaveAdmitted";
    /// A wave is soaking.
    pub const SOAKING: &str = "Soaking";
    /// A wave passed.
    pub const WAVE_PASSED: &str = "WavePassed";
    /// Waiting for another site.
    pub const WAITING_FOR_SITE: &str = "WaitingForSite";
    /// A cross-site wait was released explicitly.
    pub const WAIT_RELEASED: &str = "WaitReleased";
    /// Every wave passed.
    pub const COMPLETE: &str = "Complete";
    /// A gate failed.
    pub const GATE_FAILED: &str = "GateFailed";
    /// Convergence timed out.
    pub const CONVERGENCE_TIMEOUT: &str = "ConvergenceTimeout";
    /// Pins created and decisions set back.
    pub const PINNED_BACK: &str = "PinnedBack";
    /// A new revision waits because a halted change is not superseded.
    pub const BLOCKED_BY_HALT: &str = "BlockedByHalt";
    /// A new revision waits because `spec.sourceCommit` is the previous revision's.
    pub const SOURCE_COMMIT_UNCHANGED: &str = "SourceCommitUnchanged";
    /// A halted change was superseded.
    pub const SUPERSEDED: &str = "Superseded";
    /// An emergency change admitted every wave.
    pub const EMERGENCY: &str = "Emergency";
    /// The platform has no drift exporter; the drift gate is skipped and reported.
    pub const DRIFT_EXPORTER_ABSENT: &str = "DriftExporterAbsent";
    /// The drift metric is present.
    pub const DRIFT_SIGNAL_PRESENT: &str = "DriftSignalPresent";
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec() -> WaveGateSpec {
        let d = format!("sha256:{}", "a".repeat(64));
        serde_json::from_value(serde_json::json!({
            "site": "eu-west",
            "applicationSetRef": {"name": "mesh-config"},
            "repository": "oci://registry.local:5000/mesh/config",
            "revision": d,
            "waves": [
                {"name": "canary", "clusters": ["eu-west-1"]},
                {"name": "rest", "clusters": ["eu-west-2", "eu-west-3"], "waitFor": [{"site": "us-east", "wave": "canary"}]},
                {"name": "last", "clusters": ["eu-west-4"], "soak": "1h"}
            ],
            "driftGate": {"exporter": "None"},
            "pin": {"publicKeysSecretRef": {"name": "cosign-keys"}}
        }))
        .unwrap()
    }

    #[test]
    fn soak_defaults_table() {
        let s = spec();
        let cases: &[(usize, Option<&str>)] = &[
            (0, Some("10m")),
            (1, Some("15m")),
            (2, Some("1h")),
            (3, None),
        ];
        for &(i, want) in cases {
            assert_eq!(
                s.soak_of(i).as_ref().map(DurationString::as_str),
                want,
                "wave {i}"
            );
        }
    }

    #[test]
    fn cluster_lookup_and_defaults() {
        let s = spec();
        assert_eq!(s.wave_of_cluster("eu-west-3"), Some(1));
        assert_eq!(s.wave_of_cluster("nowhere"), None);
        assert_eq!(s.all_clusters().count(), 4);
        assert_eq!(s.drift_gate.cluster_label, "cluster");
        assert_eq!(s.drift_gate.exporter, DriftExporter::None);
        assert_eq!(s.effective_gates().len(), 3);
        assert_eq!(s.convergence_timeout.as_str(), "30m");
    }

    #[test]
    fn duck_keys_match_the_wire_names() {
        let status = WaveGateStatus {
            decisions: vec![ClusterDecision {
                cluster_name: "eu-west-1".into(),
                revision: format!("sha256:{}", "b".repeat(64)),
                wave: "canary".into(),
            }],
            ..WaveGateStatus::default()
        };
        let v = serde_json::to_value(&status).unwrap();
        assert!(v[DUCK_STATUS_LIST_KEY][0][DUCK_MATCH_KEY].is_string());
        let crd = <WaveGate as kube::CustomResourceExt>::crd();
        assert_eq!(crd.spec.names.plural, DUCK_RESOURCE);
    }

    #[test]
    fn decisions_are_all_strings() {
        let d = ClusterDecision {
            cluster_name: "eu-west-1".into(),
            revision: format!("sha256:{}", "b".repeat(64)),
            wave: "canary".into(),
        };
        let v = serde_json::to_value(&d).unwrap();
        let obj = v.as_object().unwrap();
        assert_eq!(obj.len(), 3);
        assert!(obj.values().all(serde_json::Value::is_string));
        assert!(obj.contains_key("clusterName"));
    }

    #[test]
    fn applications_by_server_are_matched_to_their_cluster() {
        let mut s = spec();
        s.cluster_servers = vec![ClusterServer {
            cluster: "east-1".into(),
            server: "https://east-1.example:6443".into(),
        }];
        let table = [
            (
                Some("west-2"),
                Some("https://east-1.example:6443"),
                Some("west-2"),
            ),
            (None, Some("https://east-1.example:6443/"), Some("east-1")),
            (
                Some(""),
                Some("https://east-1.example:6443"),
                Some("east-1"),
            ),
            (None, Some(IN_CLUSTER_SERVER), Some("in-cluster")),
            (None, Some("https://unknown:6443"), None),
            (None, None, None),
        ];
        for (name, server, want) in table {
            assert_eq!(
                s.cluster_of_destination(name, server).as_deref(),
                want,
                "{name:?} {server:?}"
            );
        }
    }
}
