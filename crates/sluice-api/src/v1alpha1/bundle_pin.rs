//! `BundlePin`: pins Argo CD Applications to a verified, signed bundle by digest, ahead of Git,
//! and releases the pin when Argo CD agrees.
//!
//! Owns the kind's wire shape, the default kind allowlist, and its condition types and reasons.
//! Never verifies, applies or prunes anything; revert does.

// Repeated `printcolumn(type_ = ...)` entries are distinct columns, not duplicates.
#![allow(clippy::duplicated_attributes)]

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::common::{SecretKeysRef, preserved_json_schema};

/// Field manager of revert's writes (Applications and pinned objects).
pub const FIELD_MANAGER: &str = "sluice-revert";

/// Mesh kinds a bundle may contain when `spec.allowedKinds` is empty: (group, kind).
pub const DEFAULT_ALLOWED_KINDS: &[(&str, &str)] = &[
    ("gateway.networking.k8s.io", "HTTPRoute"),
    ("gateway.networking.k8s.io", "GRPCRoute"),
    ("networking.istio.io", "VirtualService"),
    ("networking.istio.io", "DestinationRule"),
    ("networking.istio.io", "ServiceEntry"),
    ("networking.istio.io", "Sidecar"),
    ("networking.istio.io", "EnvoyFilter"),
    ("security.istio.io", "AuthorizationPolicy"),
    ("security.istio.io", "PeerAuthentication"),
    ("security.istio.io", "RequestAuthentication"),
    ("telemetry.istio.io", "Telemetry"),
];

/// Pins Argo CD Applications to a signed configuration bundle.
#[derive(CustomResource, Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "sluice.dev",
    version = "v1alpha1",
    kind = "BundlePin",
    plural = "bundlepins",
    namespaced,
    status = "BundlePinStatus",
    shortname = "spin",
    category = "sluice",
    doc = "Pins Argo CD Applications to a cosign-signed OCI bundle by digest (revert ahead of Git) and releases the pin when Argo CD reports the same content.",
    printcolumn(name = "Digest", type_ = "string", json_path = ".spec.bundle.digest"),
    printcolumn(name = "Phase", type_ = "string", json_path = ".status.phase"),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [
    {"rule": "!self.release || has(self.releaseReason)", "message": "releaseReason is required when release is true", "fieldPath": ".releaseReason"},
    {"rule": "self.bundle == oldSelf.bundle", "message": "spec.bundle is immutable: a pin holds the bundle it verified; to pin a different bundle, create a new BundlePin (and release this one with spec.release)", "fieldPath": ".bundle"},
    {"rule": "self.targets == oldSelf.targets", "message": "spec.targets is immutable: a pin holds the Applications it verified; to pin other Applications, create a new BundlePin", "fieldPath": ".targets"}
]))]
pub struct BundlePinSpec {
    /// Argo CD Applications to pin (OCI-sourced only). 1..64, unique. Immutable: to pin other
    /// Applications, create a new BundlePin.
    #[schemars(length(min = 1, max = 64))]
    #[schemars(extend("x-kubernetes-validations" = [
        {"rule": "self.all(a, self.filter(b, b.name == a.name && (has(b.__namespace__) ? b.__namespace__ : '') == (has(a.__namespace__) ? a.__namespace__ : '')).size() == 1)", "message": "targets must be unique"}
    ]))]
    pub targets: Vec<ApplicationTarget>,
    /// The bundle to pin to, by digest. Immutable: to pin a different bundle, create a new
    /// BundlePin.
    pub bundle: BundleRef,
    /// Secret (same namespace) holding the cosign public key(s) (PEM) the signature must
    /// verify with.
    pub public_keys_secret_ref: SecretKeysRef,
    /// Keyless (certificate) signers this pin trusts, judged offline against the trusted root
    /// revert is installed with (chart value `revert.trustedRoot`). Absent: a keyless signature
    /// is refused, whoever made it; a key of `publicKeysSecretRef` must have signed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub keyless: Option<KeylessPolicy>,
    /// Require a legacy (`.sig` tag) signature to name this pin's own repository in its payload
    /// (`docker-reference`); a signature made for another repository is then refused
    /// (`UntrustedSignature`). Default false, as `cosign verify`: a bundle copied to a mirror keeps
    /// its signature. The bundle format names no repository, so this binds legacy signatures only.
    #[serde(default)]
    pub require_signed_repository: bool,
    /// Kinds the bundle may contain. Empty: the mesh kinds HTTPRoute, GRPCRoute, VirtualService,
    /// DestinationRule, ServiceEntry, Sidecar, EnvoyFilter, AuthorizationPolicy,
    /// PeerAuthentication, RequestAuthentication, Telemetry. At most 64.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64))]
    pub allowed_kinds: Vec<GroupKind>,
    /// When the pin releases: OnMatchingContent (default: when Argo CD reports the Application
    /// Synced at a revision with the pinned content digest) or Explicit (only via `release`).
    #[serde(default)]
    pub release_policy: ReleasePolicy,
    /// Set true to release the pin now (restores sync; audited with `releaseReason`). Default:
    /// false.
    #[serde(default)]
    pub release: bool,
    /// Why the pin is released explicitly; required when `release` is true. At most 1024.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 1024))]
    pub release_reason: Option<String>,
    /// Why the pin exists (audit Event, log, Git commit message). Required, at most 1024.
    #[schemars(length(min = 1, max = 1024))]
    pub reason: String,
    /// Push a revert branch (and optionally open a pull request) for the offending change.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub git_revert: Option<GitRevertSpec>,
    /// Name of a live BundlePin in this namespace that this one takes over from (an explicit
    /// hand-over): its Applications' recorded sync policies are inherited (not their suspended
    /// ones) and that pin lets go without restoring them. Without it, a pin naming an
    /// Application another live pin holds is refused (`TargetAlreadyPinned`). At most 253.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253))]
    pub supersedes: Option<String>,
    /// Seconds the pin may take from verification to every object restored. Past it, revert
    /// gives every Application it suspended its sync policy back and the pin ends Failed
    /// (`Pinned=False DeadlineExceeded`), so automation is never stranded by a pin that cannot
    /// apply. Default 300, 10..3600.
    #[serde(default = "default_pin_deadline_seconds")]
    #[schemars(range(min = 10, max = 3600))]
    pub pin_deadline_seconds: u32,
    /// Pin a digest Argo CD never deployed for the Application (not in its `status.history`).
    /// Default false: a pin goes back to a revision the Application actually ran. Audited
    /// (Warning Event `AnyRevisionAllowed`) when used.
    #[serde(default)]
    pub allow_any_revision: bool,
    /// The largest share (percent) of the objects of allowed kinds Argo CD tracks for an
    /// Application that the pin may delete; a larger prune is refused (`PruneTooLarge`), as a
    /// sign of the wrong bundle. Default 50, 0..100 (100: no limit).
    #[serde(default = "default_max_prune_percent")]
    #[schemars(range(max = 100))]
    pub max_prune_percent: u32,
}

fn default_max_prune_percent() -> u32 {
    50
}

fn default_pin_deadline_seconds() -> u32 {
    300
}

/// Keyless signers a pin trusts.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct KeylessPolicy {
    /// Certificate identities that may sign, any one suffices. 1..16.
    #[schemars(length(min = 1, max = 16))]
    pub identities: Vec<KeylessIdentity>,
}

/// One keyless signer: the certificate identity (an email or URI subject alternative name, as
/// Fulcio writes it) and the OIDC issuer that vouched for it. Each is given exactly, or as a
/// regular expression (RE2 syntax) that must match the whole value.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [
    {"rule": "has(self.subject) != has(self.subjectRegExp)", "message": "give exactly one of subject or subjectRegExp"},
    {"rule": "has(self.issuer) != has(self.issuerRegExp)", "message": "give exactly one of issuer or issuerRegExp"}
]))]
pub struct KeylessIdentity {
    /// The exact certificate identity, e.g.
    /// `https://github.com/acme/mesh/.github/workflows/sign.yml@refs/heads/main` or
    /// `release@acme.example`. At most 1024.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 1024))]
    pub subject: Option<String>,
    /// A regular expression the whole certificate identity must match. At most 1024.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 1024))]
    pub subject_reg_exp: Option<String>,
    /// The exact OIDC issuer, e.g. `https://token.actions.githubusercontent.com`. At most 1024.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 1024))]
    pub issuer: Option<String>,
    /// A regular expression the whole OIDC issuer must match. At most 1024.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 1024))]
    pub issuer_reg_exp: Option<String>,
}

/// An Argo CD Application to pin.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ApplicationTarget {
    /// Name of the Application.
    #[schemars(length(min = 1, max = 253))]
    pub name: String,
    /// Namespace of the Application. Absent: the BundlePin's namespace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 63))]
    pub namespace: Option<String>,
}

/// An OCI bundle named by digest.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct BundleRef {
    /// OCI repository (`oci://host[:port]/path`), without tag or digest.
    #[schemars(
        length(min = 1, max = 512),
        regex(pattern = r"^(oci://)?[a-zA-Z0-9.-]+(:[0-9]+)?(/[a-z0-9._-]+)+$")
    )]
    pub repository: String,
    /// Manifest digest (`sha256:` + 64 lowercase hex). A tag is refused: a signature is checked
    /// on a digest, never a tag.
    #[schemars(length(min = 71, max = 71), regex(pattern = r"^sha256:[a-f0-9]{64}$"))]
    pub digest: String,
}

impl BundleRef {
    /// The repository without its `oci://` scheme.
    pub fn repository_path(&self) -> &str {
        self.repository
            .strip_prefix("oci://")
            .unwrap_or(&self.repository)
    }

    /// `host/path@sha256:...`, the reference to pull.
    pub fn reference(&self) -> String {
        format!("{}@{}", self.repository_path(), self.digest)
    }
}

/// An API group and kind.
#[derive(
    Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize, JsonSchema,
)]
#[serde(rename_all = "camelCase")]
pub struct GroupKind {
    /// API group (empty for the core group).
    #[serde(default)]
    #[schemars(length(max = 253))]
    pub group: String,
    /// Kind.
    #[schemars(length(min = 1, max = 63))]
    pub kind: String,
}

impl BundlePinSpec {
    /// The kinds a bundle may contain: `allowedKinds`, or [`DEFAULT_ALLOWED_KINDS`] when empty.
    pub fn effective_allowed_kinds(&self) -> Vec<GroupKind> {
        if !self.allowed_kinds.is_empty() {
            return self.allowed_kinds.clone();
        }
        Self::default_allowed_kinds()
    }

    /// [`DEFAULT_ALLOWED_KINDS`] as group-kinds.
    pub fn default_allowed_kinds() -> Vec<GroupKind> {
        DEFAULT_ALLOWED_KINDS
            .iter()
            .map(|(g, k)| GroupKind {
                group: (*g).into(),
                kind: (*k).into(),
            })
            .collect()
    }
}

/// When a pin releases.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[schemars(transform = super::common::drop_type_description)]
pub enum ReleasePolicy {
    /// Release when Argo CD reports Synced at a revision whose content digest equals the
    /// pinned content (the default).
    #[default]
    OnMatchingContent,
    /// Release only when `spec.release` is set.
    Explicit,
}

/// Git revert options.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct GitRevertSpec {
    /// The commit to revert in the intent repository (hex sha, 7..64 characters).
    #[schemars(length(min = 7, max = 64), regex(pattern = r"^[a-f0-9]+$"))]
    pub commit: String,
    /// Branch the revert is based on and the pull request targets: letters, digits, `.`, `_`,
    /// `/` and `-`, not starting with `-` (never read as a git option). Default: main.
    #[serde(default = "default_base_branch")]
    #[schemars(
        length(min = 1, max = 255),
        regex(pattern = r"^[A-Za-z0-9._/][A-Za-z0-9._/-]*$")
    )]
    pub base_branch: String,
    /// Open a pull request when the platform configures a forge. Default: true.
    #[serde(default = "default_true")]
    pub pull_request: bool,
}

fn default_base_branch() -> String {
    "main".into()
}
fn default_true() -> bool {
    true
}

/// Lifecycle phase of a BundlePin.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[schemars(transform = super::common::drop_type_description)]
pub enum BundlePinPhase {
    /// Checking the signature and the bundle's kinds.
    #[default]
    Verifying,
    /// Verification failed or a target is unsuitable; nothing was applied.
    Refused,
    /// Suspending sync, applying and pruning.
    Pinning,
    /// Every target is pinned.
    Pinned,
    /// Restoring sync and dropping field ownership.
    Releasing,
    /// Released.
    Released,
    /// Pinning failed after something was applied; see conditions.
    Failed,
}

/// State of one pinned Application.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[schemars(transform = super::common::drop_type_description)]
pub enum ApplicationPinState {
    /// Not yet touched.
    #[default]
    Pending,
    /// Running sync terminated and automated sync suspended.
    Suspended,
    /// Bundle applied and extra objects pruned.
    Pinned,
    /// Sync policy restored.
    Released,
    /// Refused (not OCI-sourced, or ApplicationSet would revert the suspension).
    Refused,
    /// Failed; see message.
    Failed,
}

/// Per-Application pin state, including what release restores.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PinnedApplication {
    /// Name of the Application.
    pub name: String,
    /// Namespace of the Application.
    pub namespace: String,
    /// Pending, Suspended, Pinned, Released, Refused or Failed.
    #[serde(default)]
    pub state: ApplicationPinState,
    /// The Application's `spec.syncPolicy` before the pin, saved verbatim (restored on release).
    /// Absent: the Application had none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "preserved_json_schema")]
    pub original_sync_policy: Option<serde_json::Value>,
    /// Whether the original policy has been saved (distinguishes "had none" from "not yet saved").
    #[serde(default)]
    pub original_sync_policy_saved: bool,
    /// Destination cluster (Argo CD cluster name or server URL).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub destination: Option<String>,
    /// Revision (digest) the Application was synced at before the pin.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from_digest: Option<String>,
    /// Whether a running sync operation was terminated.
    #[serde(default)]
    pub sync_terminated: bool,
    /// Objects applied to the destination.
    #[serde(default)]
    pub applied_objects: u32,
    /// Objects pruned from the destination.
    #[serde(default)]
    pub pruned_objects: u32,
    /// When this Application was pinned.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pinned_at: Option<Time>,
    /// When this Application was released.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub released_at: Option<Time>,
    /// Detail (why refused or failed), at most 1024 characters.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// The Application's `destination.namespace` at verification (where bundle objects that
    /// name no namespace go; release needs it even if the Application is gone).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub destination_namespace: Option<String>,
    /// Whether revert's identity in the destination passed the preflight (server-side dry-run
    /// of every bundle object and of every prune) before the Application was suspended.
    #[serde(default)]
    pub preflight_passed: bool,
    /// Times automation was turned back on by someone else while pinned and suspended again.
    #[serde(default)]
    pub resuspensions: u32,
    /// When automation was last suspended again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_resuspended_at: Option<Time>,
    /// The pin this Application was handed over from (`spec.supersedes`), when inherited.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub inherited_from: Option<String>,
}

/// One object of the pinned bundle, recorded at verification so release (dropping revert's
/// field ownership) needs neither the registry nor the signing key.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PinnedObject {
    /// API group (empty for the core group).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub group: String,
    /// API version (without the group).
    pub version: String,
    /// Kind.
    pub kind: String,
    /// Namespace as the bundle writes it; absent: the Application's destination namespace.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub namespace: String,
    /// Name.
    pub name: String,
}

/// One phase change of a pin, kept in its status.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PinHistoryEntry {
    /// When.
    pub at: Time,
    /// The phase entered.
    pub phase: BundlePinPhase,
    /// The reason of the condition that decided it (CamelCase).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub reason: String,
    /// Digest the targets ran before the pin.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from_digest: Option<String>,
    /// Digest pinned to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub to_digest: Option<String>,
    /// Who or what created the pin.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub created_by: Option<String>,
    /// What happened, at most 1024 characters.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 1024))]
    pub message: Option<String>,
}

/// The Git revert pushed for the pin.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct GitRevertStatus {
    /// Branch pushed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub branch: Option<String>,
    /// Commit of the revert.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub commit: Option<String>,
    /// URL of the pull request, when opened.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pull_request_url: Option<String>,
    /// When the branch was pushed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pushed_at: Option<Time>,
    /// Why the last attempt failed, when no branch is recorded yet. At most 1024 characters.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 1024))]
    pub failure: Option<String>,
    /// The kind of the last failure (CamelCase, e.g. `RevertConflict`, `CommitNotOnBase`,
    /// `BranchTaken`, `ForgeUnavailable`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 63))]
    pub failure_reason: Option<String>,
    /// Whether the last failure is retried: true (the forge or the repository was unreachable)
    /// retries with a back-off doubling from 30 s to at most 30 min; false (the revert conflicts
    /// with later changes, the commit is not on the base branch, the branch belongs to another
    /// pin, the token is refused) waits until the spec changes (a new `metadata.generation`).
    #[serde(default)]
    pub retryable: bool,
    /// Failed attempts in a row (the back-off grows with it).
    #[serde(default)]
    pub failed_attempts: u32,
    /// When the last attempt failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_attempt_at: Option<Time>,
    /// The `metadata.generation` the last attempt was made for; a spec change is tried at once.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attempted_generation: Option<i64>,
}

/// Observed state of a BundlePin.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct BundlePinStatus {
    /// The metadata.generation the status reflects.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// Verifying, Refused, Pinning, Pinned, Releasing, Released or Failed.
    #[serde(default)]
    pub phase: BundlePinPhase,
    /// Digest the targets ran before the pin (when they agree; per Application in
    /// `applications[].fromDigest`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from_digest: Option<String>,
    /// Digest pinned to (spec.bundle.digest once verified).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub to_digest: Option<String>,
    /// Repository the pinned digest was verified in (spec.bundle.repository once verified).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub to_repository: Option<String>,
    /// Content digest of the pinned manifests (same manifests → same digest); release compares
    /// Argo CD's synced content against it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content_digest: Option<String>,
    /// When the signature was verified.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub verified_at: Option<Time>,
    /// When every target was pinned.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pinned_at: Option<Time>,
    /// When the pin was released.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub released_at: Option<Time>,
    /// Objects applied, over all targets.
    #[serde(default)]
    pub applied_objects: u32,
    /// Objects pruned, over all targets.
    #[serde(default)]
    pub pruned_objects: u32,
    /// Per-Application state.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub applications: Vec<PinnedApplication>,
    /// The pinned bundle's objects, recorded at verification (release drops revert's field
    /// ownership from these without pulling or verifying the bundle again). At most 2048.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 2048))]
    pub objects: Vec<PinnedObject>,
    /// The Git revert, once pushed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub git_revert: Option<GitRevertStatus>,
    /// Who or what created the pin: its owner (`WaveGate/<name>`) or else the field manager
    /// that wrote its spec first (`kubectl-client-side-apply`, `kubectl-sluice`, ...).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub created_by: Option<String>,
    /// The pin's audit trail, oldest first: one entry per phase change (from/to digests, who
    /// created it, the outcome). Kept in the object, unlike Events (which expire); at most 32,
    /// the oldest dropped first.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 32))]
    pub history: Vec<PinHistoryEntry>,
    /// Conditions (Ready, Verified, Pinned, Released), one per type.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,
}

/// Condition types of a BundlePin.
pub mod conditions {
    /// The spec is valid and the operator acts on it.
    pub const READY: &str = "Ready";
    /// Signature and content verified.
    pub const VERIFIED: &str = "Verified";
    /// Every target is pinned.
    pub const PINNED: &str = "Pinned";
    /// The pin is released.
    pub const RELEASED: &str = "Released";
    /// The git revert branch (and pull request) for the offending change.
    pub const GIT_REVERT: &str = "GitRevert";
    /// Automation of every pinned Application stays suspended (False: something keeps turning
    /// it back on and revert stopped suspending it again).
    pub const SUSPENDED: &str = "Suspended";
}

/// Condition reasons of a BundlePin.
pub mod reasons {
    /// The spec is invalid; the message names the field.
    pub const INVALID_SPEC: &str = "InvalidSpec";
    /// The spec is valid.
    pub const VALID: &str = "Valid";
    /// The bundle has no signature.
    pub const UNSIGNED: &str = "Unsigned";
    /// The signature does not verify with the configured keys.
    pub const WRONG_KEY: &str = "WrongKey";
    /// The bundle's content does not match its signed digest.
    pub const TAMPERED: &str = "Tampered";
    /// An authentic signature exists, but by a signer the pin does not name (a keyless identity
    /// or issuer not in `spec.keyless`, a certificate outside the trusted root, log evidence that
    /// does not verify, a legacy signature made for another repository).
    pub const UNTRUSTED_SIGNER: &str = "UntrustedSigner";
    /// The bundle holds a kind outside the allowlist.
    pub const DISALLOWED_KIND: &str = "DisallowedKind";
    /// The public keys Secret is missing or empty.
    pub const KEYS_MISSING: &str = "KeysMissing";
    /// The bundle could not be fetched.
    pub const BUNDLE_UNAVAILABLE: &str = "BundleUnavailable";
    /// A target is not OCI-sourced.
    pub const NOT_OCI_SOURCED: &str = "NotOciSourced";
    /// A target's ApplicationSet would undo the sync suspension.
    pub const APPLICATION_SET_WOULD_REVERT: &str = "ApplicationSetWouldRevert";
    /// A target Application was not found.
    pub const APPLICATION_NOT_FOUND: &str = "ApplicationNotFound";
    /// Signature and kinds verified.
    pub const SIGNATURE_VERIFIED: &str = "SignatureVerified";
    /// Every target is pinned.
    pub const ALL_PINNED: &str = "AllPinned";
    /// Applying to a destination failed.
    pub const APPLY_FAILED: &str = "ApplyFailed";
    /// A pinned object still differs from the bundle after the restore (a field another
    /// manager than Argo CD set); the pin is not declared until it equals the bundle.
    pub const NOT_RESTORED: &str = "NotRestored";
    /// Argo CD reports the pinned content; released.
    pub const CONTENT_MATCHED: &str = "ContentMatched";
    /// Argo CD reports different content (a forward fix); waiting for explicit release.
    pub const FORWARD_FIX_WAITING: &str = "ForwardFixWaiting";
    /// Released through spec.release.
    pub const RELEASED_EXPLICITLY: &str = "ReleasedExplicitly";
    /// The revert branch was pushed (and the pull request opened when configured).
    pub const REVERT_PUSHED: &str = "RevertPushed";
    /// Pushing the revert branch or opening the pull request failed for a reason that may pass
    /// (the forge or the repository unreachable); retried with back-off.
    pub const GIT_REVERT_FAILED: &str = "GitRevertFailed";
    /// The revert cannot be made as the spec stands (it conflicts with later changes, the commit
    /// is not on the base branch, the branch belongs to another pin, the token is refused); not
    /// tried again until the spec changes.
    pub const GIT_REVERT_NOT_POSSIBLE: &str = "GitRevertNotPossible";
    /// spec.gitRevert is set but the operator has no intent repository configured.
    pub const GIT_NOT_CONFIGURED: &str = "GitNotConfigured";
    /// spec.bundle differs from the bundle the pin verified and holds; nothing new is applied.
    pub const BUNDLE_CHANGED: &str = "BundleChanged";
    /// spec.targets differs from the Applications the pin verified and holds; nothing new is
    /// applied.
    pub const TARGETS_CHANGED: &str = "TargetsChanged";
    /// Automated sync was turned back on while pinned and was suspended again.
    pub const RESUSPENDED: &str = "Resuspended";
    /// Something keeps turning automation back on while pinned; revert stopped suspending it
    /// again (each time sooner would be a write war) and says so.
    pub const FIGHTING: &str = "Fighting";
    /// Another live BundlePin holds a target Application and this pin does not supersede it.
    pub const TARGET_ALREADY_PINNED: &str = "TargetAlreadyPinned";
    /// A pin that superseded this one took its Applications over; released without restoring.
    pub const SUPERSEDED: &str = "Superseded";
    /// revert's identity, the destination's kinds or a server-side dry-run of the bundle failed
    /// before any Application was suspended; retried until the deadline.
    pub const PREFLIGHT_FAILED: &str = "PreflightFailed";
    /// The pin did not restore every object within `spec.pinDeadlineSeconds`; every suspended
    /// Application got its sync policy back.
    pub const DEADLINE_EXCEEDED: &str = "DeadlineExceeded";
    /// No signature was found for the digest yet; within a grace period after the pin's creation
    /// (a replicated registry may answer 404 just after a push) this is retried, not refused.
    pub const SIGNATURE_PENDING: &str = "SignaturePending";
    /// The bundle holds more objects than a pin records (2048).
    pub const TOO_MANY_OBJECTS: &str = "TooManyObjects";
    /// The bundle's repository is not the Application's OCI `source.repoURL`.
    pub const REPOSITORY_MISMATCH: &str = "RepositoryMismatch";
    /// Argo CD never deployed the digest for the Application (not in its history).
    pub const REVISION_NOT_DEPLOYED: &str = "RevisionNotDeployed";
    /// A digest Argo CD never deployed was pinned with `spec.allowAnyRevision` (audited).
    pub const ANY_REVISION_ALLOWED: &str = "AnyRevisionAllowed";
    /// The Application has several sources; a pin replaces one bundle only.
    pub const NOT_SINGLE_SOURCE: &str = "NotSingleSource";
    /// A bundle object's namespace is outside the Application's destination namespace, the
    /// namespaces of what Argo CD tracks for it, or its AppProject's destinations.
    pub const NAMESPACE_NOT_ALLOWED: &str = "NamespaceNotAllowed";
    /// The pin would delete more than `spec.maxPrunePercent` of the tracked objects.
    pub const PRUNE_TOO_LARGE: &str = "PruneTooLarge";
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_and_reference() {
        let spec: BundlePinSpec = serde_json::from_value(serde_json::json!({
            "targets": [{"name": "mesh-eu-west-1"}],
            "bundle": {"repository": "oci://registry.local:5000/mesh/config", "digest": format!("sha256:{}", "c".repeat(64))},
            "publicKeysSecretRef": {"name": "cosign"},
            "reason": "5xx spike after change 42",
            "gitRevert": {"commit": "abcdef1"}
        }))
        .unwrap();
        assert_eq!(spec.release_policy, ReleasePolicy::OnMatchingContent);
        assert!(!spec.release);
        assert_eq!(
            spec.effective_allowed_kinds().len(),
            DEFAULT_ALLOWED_KINDS.len()
        );
        let git = spec.git_revert.as_ref().unwrap();
        assert_eq!(git.base_branch, "main");
        assert!(git.pull_request);
        assert_eq!(
            spec.bundle.reference(),
            format!("registry.local:5000/mesh/config@sha256:{}", "c".repeat(64))
        );
    }

    #[test]
    fn original_sync_policy_kept_verbatim() {
        let policy = serde_json::json!({
            "automated": {"enabled": true, "prune": true, "selfHeal": true, "futureField": {"x": 1}},
            "syncOptions": ["RespectIgnoreDifferences=true"],
            "unknownTopLevel": [1, 2, 3]
        });
        let app = PinnedApplication {
            name: "a".into(),
            namespace: "argocd".into(),
            original_sync_policy: Some(policy.clone()),
            original_sync_policy_saved: true,
            ..PinnedApplication::default()
        };
        let back: PinnedApplication =
            serde_json::from_value(serde_json::to_value(&app).unwrap()).unwrap();
        assert_eq!(back.original_sync_policy, Some(policy));
    }
}
