//! The shared model of the BundlePin decision, below its phases: what the reconcile observed
//! (`Observations`), what it must do (`Action`), the `Decision` every phase writes into, the
//! timing constants, and the helpers every phase uses to set a condition and queue an Event.
//! Must never do I/O or read the clock.

use std::time::Duration;

use k8s_openapi::jiff::Timestamp;
use serde_json::Value;
use sluice_api::v1alpha1::{
    BundlePinSpec, BundlePinStatus,
    bundle_pin::{ApplicationPinState, GroupKind, PinnedApplication, reasons},
};
use sluice_runtime::{
    conditions::{self as cond, Status},
    events::{Notice, Severity},
};

use crate::binding;

/// How often a pinned BundlePin looks at its Applications without being woken: a safety net.
/// A change to a target Application wakes its pins at once (see [`crate::controller`]).
pub const POLL: Duration = Duration::from_secs(30);
/// How soon a step that waits on something outside (a terminating sync) looks again.
pub const SHORT: Duration = Duration::from_millis(500);
/// How soon a transient verification failure (registry down, keys absent) is retried.
pub const RETRY: Duration = Duration::from_secs(10);

/// Prefix of the revert branch: `sluice/revert/<namespace>/<name>-<uid8>` ([`branch_name`](super::branch_name)).
pub const BRANCH_PREFIX: &str = "sluice/revert";
/// The first wait after a git revert failed for a reason that may pass; it doubles per failed
/// attempt up to [`GIT_RETRY_MAX`] (each attempt is a clone of the intent repository).
pub const GIT_RETRY_MIN: Duration = Duration::from_secs(30);
/// The longest wait between two attempts at a git revert.
pub const GIT_RETRY_MAX: Duration = Duration::from_secs(30 * 60);
/// Most objects a pin records (and so pins).
pub const MAX_OBJECTS: usize = 2048;
/// Entries a pin's status history keeps (the oldest go first).
pub const MAX_HISTORY: usize = 32;
/// How long after a pin's creation a missing signature is retried rather than refused, by
/// default: a replicated or eventually consistent registry may answer 404 just after the push.
pub const SIGNATURE_GRACE: Duration = Duration::from_secs(120);
/// Re-suspensions (automation turned back on by someone else while pinned) within
/// [`FIGHT_WINDOW`] after which revert stops suspending again and reports `Fighting`.
pub const MAX_RESUSPENSIONS: u32 = 5;
/// The window [`MAX_RESUSPENSIONS`] counts in; a quieter Application starts counting afresh.
pub const FIGHT_WINDOW: Duration = Duration::from_secs(600);
/// The longest wait between two re-suspensions (the wait doubles from 1 s).
pub const MAX_RESUSPEND_BACKOFF: Duration = Duration::from_secs(60);

/// One object by identity.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ObjectKey {
    /// API group ("" for core).
    pub group: String,
    /// Kind.
    pub kind: String,
    /// Namespace ("" for cluster-scoped or "the Application's destination namespace").
    pub namespace: String,
    /// Name.
    pub name: String,
    /// API version (without group), when known.
    pub version: String,
}

impl ObjectKey {
    pub(super) fn same_object(&self, other: &ObjectKey) -> bool {
        self.group == other.group
            && self.kind == other.kind
            && self.namespace == other.namespace
            && self.name == other.name
    }

    /// `Kind.group namespace/name`.
    pub fn display(&self) -> String {
        let gk = if self.group.is_empty() {
            self.kind.clone()
        } else {
            format!("{}.{}", self.kind, self.group)
        };
        if self.namespace.is_empty() {
            format!("{gk} {}", self.name)
        } else {
            format!("{gk} {}/{}", self.namespace, self.name)
        }
    }
}

/// What the verified bundle holds (the reconcile keeps the objects themselves).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BundleSummary {
    /// Manifest digest verified.
    pub digest: String,
    /// Content digest of the manifests.
    pub content_digest: String,
    /// Fingerprint of the key the signature verified with.
    pub key_fingerprint: String,
    /// The objects (namespace as written; empty when the bundle leaves it to the destination).
    pub objects: Vec<ObjectKey>,
}

/// The outcome of verifying the pinned bundle.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verification {
    /// Signature verified with a configured key, every object of an allowed kind.
    Verified(BundleSummary),
    /// Refused for good: unsigned, wrong key, tampered, disallowed kind. Nothing may be applied.
    Refused {
        /// One of the `reasons` constants.
        reason: &'static str,
        /// What was wrong and what to do.
        message: String,
    },
    /// Not decidable now (registry unreachable, keys Secret absent); retried.
    Unavailable {
        /// One of the `reasons` constants.
        reason: &'static str,
        /// What was wrong and what to do.
        message: String,
    },
}

/// The ApplicationSet that generated an Application.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OwningApplicationSet {
    /// Its name.
    pub name: String,
    /// Whether its `ignoreApplicationDifferences` covers this Application's sync policy.
    pub covers_sync_policy: bool,
}

/// What the reconcile saw of one target Application.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct AppView {
    /// Every source is `oci://`.
    pub oci_sourced: bool,
    /// The owning ApplicationSet, when generated by one.
    pub application_set: Option<OwningApplicationSet>,
    /// `spec.syncPolicy` verbatim (`None`: absent).
    pub sync_policy: Option<Value>,
    /// Whether automation is active (`automated` present and not `enabled: false`).
    pub automated: bool,
    /// `status.operationState.phase`.
    pub operation_phase: Option<String>,
    /// Whether `operation` (a requested sync) is set.
    pub operation_requested: bool,
    /// `status.sync.status`.
    pub sync_status: Option<String>,
    /// `status.sync.revision`.
    pub revision: Option<String>,
    /// Content digest of `status.sync.revision`, when the reconcile fetched it.
    pub revision_content: Option<String>,
    /// Destination cluster (`destination.name`, else `destination.server`).
    pub destination: Option<String>,
    /// `destination.namespace`.
    pub destination_namespace: Option<String>,
    /// Resources Argo CD tracks for the Application.
    pub tracked: Vec<ObjectKey>,
    /// Whether Argo CD reports the Application OutOfSync only by resources that require
    /// pruning (every other resource Synced): what an Application whose policy does not prune
    /// shows once a pin left the objects the bundle lacks.
    pub out_of_sync_only_by_pruning: bool,
    /// The OCI `repoURL` of its single source.
    pub repo_url: Option<String>,
    /// Whether it has several sources (`spec.sources` with more than one).
    pub multi_source: bool,
    /// Revisions Argo CD deployed for it (`status.history[].revision`).
    pub history: Vec<String>,
    /// `destination.name` and `destination.server` as written.
    pub destination_name_server: (String, String),
    /// Its AppProject's `spec.destinations`; `None` when the AppProject could not be read (not
    /// checked then).
    pub project_destinations: Option<Vec<binding::ProjectDestination>>,
}

impl AppView {
    pub(super) fn sync_running(&self) -> bool {
        matches!(
            self.operation_phase.as_deref(),
            Some("Running") | Some("Terminating")
        )
    }
}

/// One target as observed: its key and, when it exists, its view.
#[derive(Debug, Clone, PartialEq)]
pub struct AppObservation {
    /// Namespace of the Application.
    pub namespace: String,
    /// Name of the Application.
    pub name: String,
    /// `None`: not found.
    pub view: Option<AppView>,
}

/// What the reconcile saw besides the object's spec and status.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Observations {
    /// `metadata.generation` of the object.
    pub generation: Option<i64>,
    /// `metadata.namespace` and `metadata.name` (branch name, messages).
    pub pin: (String, String),
    /// `metadata.uid`: tells this pin from an earlier one of the same name (branch name, owner
    /// of the revert branch). Empty: unknown.
    pub uid: String,
    /// The bundle verification; `None` when the reconcile did not verify (phase does not need it).
    pub verification: Option<Verification>,
    /// The targets, in `spec.targets` order.
    pub applications: Vec<AppObservation>,
    /// Whether an intent repository is configured for git reverts.
    pub git_configured: bool,
    /// The other BundlePins of this namespace that are not over (a second pin on one of this
    /// pin's Applications is refused unless it supersedes that one).
    pub other_pins: Vec<OtherPin>,
    /// The kinds the platform allows (the operator's `--allowed-kinds`): an upper bound on
    /// `spec.allowedKinds`; `None`: the default list.
    pub platform_kinds: Option<Vec<GroupKind>>,
    /// When the pin was created.
    pub created_at: Option<Timestamp>,
    /// Who or what created it (its owner, else the field manager that wrote its spec first).
    pub created_by: Option<String>,
    /// How long after creation a missing signature is retried ([`SIGNATURE_GRACE`] unless the
    /// operator says otherwise).
    pub signature_grace: Duration,
    /// The one namespace revert may patch Applications in (its `--namespace`, where the chart
    /// grants its Role); `None`: revert watches every namespace and refuses none.
    pub application_namespace: Option<String>,
}

/// The kinds this pin may apply and prune: `spec.allowedKinds` (or the default list) within
/// the platform's.
pub fn allowed_kinds(spec: &BundlePinSpec, platform: Option<&[GroupKind]>) -> Vec<GroupKind> {
    let mut kinds = spec.effective_allowed_kinds();
    if let Some(platform) = platform {
        kinds.retain(|k| platform.contains(k));
    }
    kinds
}

/// Whether a sync policy prunes: Argo CD's automated sync passes `automated.prune` as the sync's
/// prune flag (`controller/appcontroller.go` `autoSync`), so an Application whose policy does not
/// prune keeps what its source no longer holds; a pin does the same.
pub fn policy_prunes(policy: Option<&Value>) -> bool {
    policy
        .and_then(|p| p.pointer("/automated/prune"))
        .and_then(Value::as_bool)
        .unwrap_or(false)
}

/// Another live BundlePin, as far as a pin needs to know it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct OtherPin {
    /// Its name (same namespace).
    pub name: String,
    /// Its `spec.supersedes`.
    pub supersedes: Option<String>,
    /// The Applications it targets (recorded ones once verified, else `spec.targets`).
    pub targets: Vec<AppKey>,
    /// Its per-Application state (recorded original sync policies), once verified.
    pub applications: Vec<PinnedApplication>,
    /// Whether it has verified (recorded what it inherited) and so took over.
    pub verified: bool,
}

/// An Application by namespace and name.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AppKey {
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
}

/// Something the reconcile must do. Effects run in order before the status is written; Events
/// and audit lines only after it.
#[derive(Debug, Clone, PartialEq)]
pub enum Action {
    /// Publish a Kubernetes Event about the BundlePin.
    Event(Notice),
    /// Terminate the Application's running sync (`status.operationState.phase: Terminating`).
    TerminateSync {
        /// The Application.
        app: AppKey,
    },
    /// Set `spec.syncPolicy.automated.enabled` (`None`: remove the field, as the original had
    /// none), touching nothing else of the sync policy; optionally drop a
    /// requested-but-not-started `operation`.
    SetAutomation {
        /// The Application.
        app: AppKey,
        /// `Some(false)` suspends; on release the original value.
        enabled: Option<bool>,
    },
    /// Drop a requested-but-not-started `operation` of the Application.
    ClearOperation {
        /// The Application.
        app: AppKey,
    },
    /// Before any Application is touched: resolve revert's identity for the destination and
    /// server-side dry-run (`dryRun=All`) every bundle object and every prune there, so a 403,
    /// a kind not served or an invalid object shows before automation is suspended.
    Preflight {
        /// The Application (for messages).
        app: AppKey,
        /// Destination cluster name or server.
        destination: String,
        /// Namespace for bundle objects that name none.
        default_namespace: Option<String>,
        /// Objects the apply would delete.
        prune: Vec<ObjectKey>,
    },
    /// Server-side apply every bundle object to the destination and delete `prune`.
    Apply {
        /// The Application (for messages).
        app: AppKey,
        /// Destination cluster name or server.
        destination: String,
        /// Namespace for bundle objects that name none.
        default_namespace: Option<String>,
        /// Objects to delete: tracked, allowed, not in the bundle.
        prune: Vec<ObjectKey>,
    },
    /// Drop revert's managedFields entries from the pinned objects (`status.objects`) in the
    /// destination; needs neither the registry nor the key.
    DropOwnership {
        /// The Application.
        app: AppKey,
        /// Destination cluster name or server.
        destination: String,
        /// Namespace for bundle objects that name none.
        default_namespace: Option<String>,
    },
    /// Push the revert branch (and open the pull request when asked and configured).
    PushRevert {
        /// Commit to revert.
        commit: String,
        /// Base branch.
        base: String,
        /// Branch to push.
        branch: String,
        /// Commit message.
        message: String,
        /// Open a pull request.
        pull_request: bool,
        /// Who the branch belongs to (the pin's UID): an existing branch is reported only when
        /// it was pushed for this owner. Empty: any existing branch.
        owner: String,
    },
    /// The audit record of a pin or release: an Event and one structured log line.
    Audit {
        /// CamelCase reason (AllPinned, ContentMatched, ReleasedExplicitly).
        reason: &'static str,
        /// Digest before the pin.
        from_digest: Option<String>,
        /// Digest pinned to.
        to_digest: Option<String>,
        /// The note.
        note: String,
    },
}

impl Action {
    /// Whether this action changes something outside the BundlePin.
    pub fn is_effect(&self) -> bool {
        !matches!(self, Action::Event(_) | Action::Audit { .. })
    }
}

sluice_runtime::decision_types! {
    /// The outcome of [`decide`](super::decide): the status is written once every effect succeeded.
    BundlePinStatus, Action
}

/// What an Event of this operator is about: its `action`, as the Events API shows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, strum::IntoStaticStr)]
pub enum EventAction {
    /// Verification outcomes.
    Verify,
    /// Pinning.
    Pin,
    /// Releasing.
    Release,
}

/// Whether an Application of this pin may still have its automated sync suspended by revert:
/// Suspended or Pinned, or Failed after its original sync policy was recorded. A Failed pin that
/// holds one still restores it on release or deletion.
pub(super) fn holds_application(app: &PinnedApplication) -> bool {
    match app.state {
        ApplicationPinState::Suspended | ApplicationPinState::Pinned => true,
        ApplicationPinState::Failed => app.original_sync_policy_saved,
        _ => false,
    }
}

/// The sync policy with automation turned off, every other setting kept (`enabled: false`).
pub fn suspended_policy(policy: Option<&Value>) -> Option<Value> {
    let mut policy = policy.cloned()?;
    if let Some(automated) = policy.get_mut("automated").and_then(Value::as_object_mut) {
        automated.insert("enabled".into(), Value::Bool(false));
    }
    Some(policy)
}

pub(super) fn app_key(a: &PinnedApplication) -> AppKey {
    AppKey {
        namespace: a.namespace.clone(),
        name: a.name.clone(),
    }
}

pub(super) fn view<'a>(obs: &'a Observations, a: &PinnedApplication) -> Option<&'a AppView> {
    obs.applications
        .iter()
        .find(|o| o.namespace == a.namespace && o.name == a.name)
        .and_then(|o| o.view.as_ref())
}

/// Sets a condition and, when it changed, queues an Event.
#[allow(clippy::too_many_arguments)]
pub(super) fn condition(
    d: &mut Decision,
    type_: &str,
    status: Status,
    reason: &'static str,
    message: String,
    generation: Option<i64>,
    now: Timestamp,
    action: EventAction,
) {
    let severity = if status == Status::False && reason != reasons::FORWARD_FIX_WAITING {
        Severity::Warning
    } else {
        Severity::Normal
    };
    let stamp = cond::Stamp::new(generation, now);
    let changed = d.condition(stamp, type_, status, reason, message.clone());
    if changed {
        d.event(Notice {
            severity,
            reason,
            action: action.into(),
            note: message,
        });
    }
}
