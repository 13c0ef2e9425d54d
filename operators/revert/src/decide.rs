//! The pure heart of sluice-revert: (spec, current status, observations, now) → (actions, next
//! status).
//!
//! Status is the state machine: Verifying → Pinning → Pinned → Released, or Refused. Each step
//! is decided from what the status recorded and what the reconcile observed, so a restarted
//! operator reaches the same decision: the original sync policy is recorded in the status
//! before any Application is touched, effects are idempotent (suspend, server-side apply, prune,
//! restore), and the git revert is asked for until the status records it (the git client never
//! pushes a branch twice, nor reports a branch another pin pushed): a failure that may pass is
//! asked again after a growing back-off, one that cannot ([`record_git_outcome`] tells them
//! apart) waits for a change of the spec. Must never do I/O or read the clock; never emits an effect before the
//! bundle's signature and kinds are verified and every target is found suitable.

use std::time::Duration;

use k8s_openapi::{apimachinery::pkg::apis::meta::v1::Time, jiff::Timestamp};
use serde_json::Value;
use sluice_api::v1alpha1::{
    BundlePinPhase, BundlePinSpec, BundlePinStatus,
    bundle_pin::{
        ApplicationPinState, BundleRef, GitRevertStatus, GroupKind, PinHistoryEntry,
        PinnedApplication, PinnedObject, ReleasePolicy, conditions, reasons,
    },
};
use sluice_runtime::{
    conditions::{self as cond, Status},
    events::Severity,
};

use crate::{binding, validity};

/// How often a pinned BundlePin looks at its Applications without being woken: a safety net.
/// A change to a target Application wakes its pins at once (see [`crate::controller`]).
pub const POLL: Duration = Duration::from_secs(30);
/// How soon a step that waits on something outside (a terminating sync) looks again.
pub const SHORT: Duration = Duration::from_millis(500);
/// How soon a transient verification failure (registry down, keys absent) is retried.
pub const RETRY: Duration = Duration::from_secs(10);

/// Prefix of the revert branch: `sluice/revert/<namespace>/<name>-<uid8>` ([`branch_name`]).
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
    fn same_object(&self, other: &ObjectKey) -> bool {
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
    fn sync_running(&self) -> bool {
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
    Event {
        /// Normal or Warning.
        severity: Severity,
        /// CamelCase reason.
        reason: &'static str,
        /// CamelCase action.
        action: &'static str,
        /// Human-readable note.
        note: String,
    },
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
        !matches!(self, Action::Event { .. } | Action::Audit { .. })
    }
}

/// When to look at the object again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Requeue {
    /// Only when the object (or something it watches) changes.
    AwaitChange,
    /// After this long, even without a change.
    After(Duration),
}

/// The outcome of [`decide`].
#[derive(Debug, Clone, PartialEq)]
pub struct Decision {
    /// Effects (and Events) to carry out.
    pub actions: Vec<Action>,
    /// The status to write once every effect succeeded (equal to the current one when nothing
    /// changed).
    pub status: BundlePinStatus,
    /// When to reconcile again.
    pub requeue: Requeue,
}

/// The Event action name of validation outcomes.
pub const VALIDATE: &str = "Validate";
/// The Event action name of verification outcomes.
pub const VERIFY: &str = "Verify";
/// The Event action name of pinning.
pub const PIN: &str = "Pin";
/// The Event action name of releasing.
pub const RELEASE: &str = "Release";

/// The revert branch of a pin: `sluice/revert/<namespace>/<name>-<uid8>`. The first 8 hex
/// digits of the pin's UID make a name reused later (`pin-<app>-<digest12>` months on) a
/// different branch, so an old branch or pull request is never reported as this pin's.
pub fn branch_name(namespace: &str, name: &str, uid: &str) -> String {
    let short: String = uid
        .chars()
        .filter(char::is_ascii_hexdigit)
        .take(8)
        .collect::<String>()
        .to_ascii_lowercase();
    if short.is_empty() {
        format!("{BRANCH_PREFIX}/{namespace}/{name}")
    } else {
        format!("{BRANCH_PREFIX}/{namespace}/{name}-{short}")
    }
}

/// How long to wait after `failed_attempts` failures in a row that may pass: [`GIT_RETRY_MIN`]
/// doubling per attempt, at most [`GIT_RETRY_MAX`].
pub fn git_retry_after(failed_attempts: u32) -> Duration {
    let doublings = failed_attempts.saturating_sub(1).min(16);
    GIT_RETRY_MIN
        .saturating_mul(1 << doublings)
        .min(GIT_RETRY_MAX)
}

/// What an attempt at the git revert came to (the reconcile's I/O result).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GitOutcome {
    /// The branch is in the repository (and the pull request open, when asked).
    Pushed(GitRevertStatus),
    /// It failed.
    Failed {
        /// Bounded CamelCase kind of the failure (`RevertConflict`, `ForgeUnavailable`, ...).
        reason: &'static str,
        /// What failed, where, and what to do.
        message: String,
        /// Whether it may pass without a change of the spec (the forge or the repository was
        /// unreachable); otherwise it waits for the spec to change.
        retryable: bool,
    },
}

/// Records an attempt at the git revert in the status: the branch once pushed; otherwise the
/// failure, whether it is retried (and when) or waits for a change of the spec, with the
/// `GitRevert` condition saying so. [`git_revert`] reads it back to decide the next attempt.
pub fn record_git_outcome(
    status: &mut BundlePinStatus,
    outcome: GitOutcome,
    generation: Option<i64>,
    now: Timestamp,
) {
    let (condition_status, reason, message) = match outcome {
        GitOutcome::Pushed(revert) => {
            let note = format!(
                "revert branch {} at {}{}",
                revert.branch.as_deref().unwrap_or_default(),
                revert.commit.as_deref().unwrap_or_default(),
                revert
                    .pull_request_url
                    .as_deref()
                    .map(|u| format!(", pull request {u}"))
                    .unwrap_or_default()
            );
            status.git_revert = Some(GitRevertStatus {
                pushed_at: Some(Time(now)),
                attempted_generation: generation,
                failure: None,
                failure_reason: None,
                retryable: false,
                failed_attempts: 0,
                last_attempt_at: None,
                ..revert
            });
            (Status::True, reasons::REVERT_PUSHED, note)
        }
        GitOutcome::Failed {
            reason,
            message,
            retryable,
        } => {
            let previous = status.git_revert.take().unwrap_or_default();
            let attempts = if previous.attempted_generation == generation {
                previous.failed_attempts.saturating_add(1)
            } else {
                1
            };
            let (condition_reason, message) = if retryable {
                (
                    reasons::GIT_REVERT_FAILED,
                    format!(
                        "{message}; attempt {attempts} failed, tried again in {} s",
                        git_retry_after(attempts).as_secs()
                    ),
                )
            } else {
                (
                    reasons::GIT_REVERT_NOT_POSSIBLE,
                    format!(
                        "{message}; not tried again until the spec changes: revert the change in Git by hand, or correct spec.gitRevert"
                    ),
                )
            };
            status.git_revert = Some(GitRevertStatus {
                failure: Some(message.chars().take(1024).collect()),
                failure_reason: Some(reason.to_owned()),
                retryable,
                failed_attempts: attempts,
                last_attempt_at: Some(Time(now)),
                attempted_generation: generation,
                ..GitRevertStatus::default()
            });
            (Status::False, condition_reason, message)
        }
    };
    cond::set(
        &mut status.conditions,
        cond::new(
            conditions::GIT_REVERT,
            condition_status,
            reason,
            message,
            generation,
            now,
        ),
    );
}

/// Whether an Application of this pin may still have its automated sync suspended by revert:
/// Suspended or Pinned, or Failed after its original sync policy was recorded. A Failed pin that
/// holds one still restores it on release or deletion.
fn holds_application(app: &PinnedApplication) -> bool {
    match app.state {
        ApplicationPinState::Suspended | ApplicationPinState::Pinned => true,
        ApplicationPinState::Failed => app.original_sync_policy_saved,
        _ => false,
    }
}

/// Whether the pin is over: Released or Refused, or Failed with no Application left suspended.
/// A Failed pin that still holds an Application waits for a release (explicit or by deletion).
pub fn is_over(status: Option<&BundlePinStatus>) -> bool {
    let Some(s) = status else { return false };
    match s.phase {
        BundlePinPhase::Released | BundlePinPhase::Refused => true,
        BundlePinPhase::Failed => !s.applications.iter().any(holds_application),
        _ => false,
    }
}

/// Whether the reconcile must verify the bundle for this status (it needs the objects to
/// apply them). Release never does: it needs only what verification recorded, so a rotated
/// key, a garbage-collected digest or a registry outage never keeps automation suspended.
pub fn needs_verification(status: Option<&BundlePinStatus>) -> bool {
    matches!(
        status.map(|s| s.phase).unwrap_or_default(),
        BundlePinPhase::Verifying | BundlePinPhase::Pinning
    )
}

/// What release sets `automated.enabled` back to: `None` when the original policy had no
/// `automated` (nothing was suspended there), else its original `enabled` (`None`: absent).
fn original_enabled(app: &PinnedApplication) -> Option<Option<bool>> {
    let automated = app.original_sync_policy.as_ref()?.get("automated")?;
    Some(automated.get("enabled").and_then(Value::as_bool))
}

/// The live pin (other than this one) that took this pin's Applications over with
/// `spec.supersedes`, once it verified.
fn superseded_by<'a>(obs: &'a Observations, status: &BundlePinStatus) -> Option<&'a OtherPin> {
    obs.other_pins.iter().find(|o| {
        o.verified
            && o.supersedes.as_deref() == Some(obs.pin.1.as_str())
            && o.applications.iter().any(|a| {
                a.inherited_from.as_deref() == Some(obs.pin.1.as_str())
                    && status
                        .applications
                        .iter()
                        .any(|m| m.namespace == a.namespace && m.name == a.name)
            })
    })
}

/// When the pin's deadline passes (verification + `spec.pinDeadlineSeconds`).
fn deadline_left(
    spec: &BundlePinSpec,
    status: &BundlePinStatus,
    now: Timestamp,
) -> Option<Duration> {
    let verified = status.verified_at.as_ref()?.0;
    let end = verified.as_second() + i64::from(spec.pin_deadline_seconds);
    Some(Duration::from_secs(
        end.saturating_sub(now.as_second()).max(0) as u64,
    ))
}

/// The longest one apply-and-prune of an Application may take, whatever the pin's deadline.
pub const MAX_APPLY: Duration = Duration::from_secs(600);

/// How long one apply-and-prune may take: until the pin's deadline, at most [`MAX_APPLY`], at
/// least a second.
pub fn apply_budget(spec: &BundlePinSpec, status: &BundlePinStatus, now: Timestamp) -> Duration {
    deadline_left(spec, status, now)
        .unwrap_or(MAX_APPLY)
        .clamp(Duration::from_secs(1), MAX_APPLY)
}

/// Back-off before the next re-suspension after `n` of them: 1 s, doubling, at most
/// [`MAX_RESUSPEND_BACKOFF`].
pub fn resuspend_backoff(n: u32) -> Duration {
    Duration::from_secs(1u64 << n.min(6)).min(MAX_RESUSPEND_BACKOFF)
}

/// The bundle the reconcile verifies and acts on: the one the status recorded as verified once
/// there is one (so a changed `spec.bundle` is never pulled, applied or released by mistake),
/// else `spec.bundle`.
pub fn bundle_to_verify(spec: &BundlePinSpec, status: Option<&BundlePinStatus>) -> BundleRef {
    match status.and_then(|s| s.to_digest.clone()) {
        Some(digest) => BundleRef {
            repository: status
                .and_then(|s| s.to_repository.clone())
                .unwrap_or_else(|| spec.bundle.repository.clone()),
            digest,
        },
        None => spec.bundle.clone(),
    }
}

/// The Applications the reconcile observes: the ones the status recorded once verification
/// passed (the pin acts on those only), else `spec.targets` (namespace defaulted to `pin_ns`).
pub fn targets_to_observe(
    spec: &BundlePinSpec,
    status: Option<&BundlePinStatus>,
    pin_ns: &str,
) -> Vec<AppKey> {
    match status {
        Some(s) if s.to_digest.is_some() && !s.applications.is_empty() => {
            s.applications.iter().map(app_key).collect()
        }
        _ => spec_targets(spec, pin_ns),
    }
}

fn spec_targets(spec: &BundlePinSpec, pin_ns: &str) -> Vec<AppKey> {
    spec.targets
        .iter()
        .map(|t| AppKey {
            namespace: t.namespace.clone().unwrap_or_else(|| pin_ns.to_owned()),
            name: t.name.clone(),
        })
        .collect()
}

/// How the spec differs from what the pin verified and holds (empty: it does not, or nothing
/// is recorded yet): (reason, message). The CRD makes `spec.bundle` and `spec.targets`
/// immutable; this is the defence for a store that did not enforce it.
pub fn spec_drift(
    spec: &BundlePinSpec,
    status: Option<&BundlePinStatus>,
    pin_ns: &str,
) -> Vec<(&'static str, String)> {
    let Some(status) = status else {
        return Vec::new();
    };
    let Some(held) = status.to_digest.as_deref() else {
        return Vec::new();
    };
    let mut drift = Vec::new();
    let repo_changed = status
        .to_repository
        .as_deref()
        .is_some_and(|r| r != spec.bundle.repository);
    if held != spec.bundle.digest || repo_changed {
        drift.push((
            reasons::BUNDLE_CHANGED,
            format!(
                "spec.bundle is now {} but this pin verified and holds {}@{held}; nothing of the new bundle is applied. Restore spec.bundle, or create a new BundlePin for the new bundle and release this one (spec.release: true)",
                spec.bundle.reference(),
                status
                    .to_repository
                    .as_deref()
                    .unwrap_or(&spec.bundle.repository)
                    .trim_start_matches("oci://"),
            ),
        ));
    }
    if !status.applications.is_empty() {
        let mut want: Vec<String> = spec_targets(spec, pin_ns)
            .iter()
            .map(|k| format!("{}/{}", k.namespace, k.name))
            .collect();
        let mut held: Vec<String> = status
            .applications
            .iter()
            .map(|a| format!("{}/{}", a.namespace, a.name))
            .collect();
        want.sort();
        held.sort();
        if want != held {
            drift.push((
                reasons::TARGETS_CHANGED,
                format!(
                    "spec.targets now lists {} but this pin verified and holds {}; no other Application is touched. Restore spec.targets, or create a new BundlePin for the other Applications",
                    want.join(", "),
                    held.join(", ")
                ),
            ));
        }
    }
    drift
}

/// Whether the reconcile should fetch the content digest of each target's synced revision.
pub fn needs_revision_content(spec: &BundlePinSpec, status: Option<&BundlePinStatus>) -> bool {
    spec.release_policy == ReleasePolicy::OnMatchingContent
        && status.is_some_and(|s| s.phase == BundlePinPhase::Pinned)
}

/// The sync policy with automation turned off, every other setting kept (`enabled: false`).
pub fn suspended_policy(policy: Option<&Value>) -> Option<Value> {
    let mut policy = policy.cloned()?;
    if let Some(automated) = policy.get_mut("automated").and_then(Value::as_object_mut) {
        automated.insert("enabled".into(), Value::Bool(false));
    }
    Some(policy)
}

/// Decides the next status of a BundlePin.
pub fn decide(
    spec: &BundlePinSpec,
    status: Option<&BundlePinStatus>,
    obs: &Observations,
    now: Timestamp,
) -> Decision {
    let mut problems = validity::problems(spec);
    problems.extend(validity::unreachable_targets(
        spec,
        &obs.pin.0,
        obs.application_namespace.as_deref(),
    ));
    let validity = decide_validity(&problems, status, obs, now);
    if validity.status.phase == BundlePinPhase::Refused
        && cond::find(&validity.status.conditions, conditions::READY)
            .is_some_and(|c| c.status == "False")
    {
        return validity;
    }
    let mut d = validity;
    let before = d.status.phase;
    if d.status.created_by.is_none() {
        d.status.created_by = obs.created_by.clone();
    }
    step(spec, obs, now, &mut d);
    if d.status.phase != before {
        record(&mut d, now);
    }
    d
}

/// Appends the phase just entered to the status history (bounded), with the reason and
/// message of the condition that decided it.
fn record(d: &mut Decision, now: Timestamp) {
    let phase = d.status.phase;
    let by_type = match phase {
        BundlePinPhase::Pinned | BundlePinPhase::Failed => conditions::PINNED,
        BundlePinPhase::Released => conditions::RELEASED,
        _ => conditions::VERIFIED,
    };
    let c = cond::find(&d.status.conditions, by_type)
        .or_else(|| cond::find(&d.status.conditions, conditions::READY));
    let message = c.map(|c| c.message.chars().take(1024).collect::<String>());
    d.status.history.push(PinHistoryEntry {
        at: Time(now),
        phase,
        reason: c.map(|c| c.reason.clone()).unwrap_or_default(),
        from_digest: d.status.from_digest.clone(),
        to_digest: d.status.to_digest.clone(),
        created_by: d.status.created_by.clone(),
        message,
    });
    let excess = d.status.history.len().saturating_sub(MAX_HISTORY);
    d.status.history.drain(..excess);
}

fn event(severity: Severity, reason: &'static str, action: &'static str, note: String) -> Action {
    Action::Event {
        severity,
        reason,
        action,
        note,
    }
}

fn app_key(a: &PinnedApplication) -> AppKey {
    AppKey {
        namespace: a.namespace.clone(),
        name: a.name.clone(),
    }
}

fn view<'a>(obs: &'a Observations, a: &PinnedApplication) -> Option<&'a AppView> {
    obs.applications
        .iter()
        .find(|o| o.namespace == a.namespace && o.name == a.name)
        .and_then(|o| o.view.as_ref())
}

/// Sets a condition and, when it changed, queues an Event.
#[allow(clippy::too_many_arguments)]
fn condition(
    d: &mut Decision,
    type_: &str,
    status: Status,
    reason: &'static str,
    message: String,
    generation: Option<i64>,
    now: Timestamp,
    action: &'static str,
) {
    let severity = if status == Status::False && reason != reasons::FORWARD_FIX_WAITING {
        Severity::Warning
    } else {
        Severity::Normal
    };
    let changed = cond::set(
        &mut d.status.conditions,
        cond::new(type_, status, reason, message.clone(), generation, now),
    );
    if changed {
        d.actions.push(event(severity, reason, action, message));
    }
}

/// Reports a spec that no longer matches what the pin verified (condition + Warning Event),
/// or that it matches again. Returns whether it differs.
fn check_drift(spec: &BundlePinSpec, obs: &Observations, now: Timestamp, d: &mut Decision) -> bool {
    let before = d.status.clone();
    let drift = spec_drift(spec, Some(&before), &obs.pin.0);
    if let Some((reason, _)) = drift.first() {
        let message = drift
            .iter()
            .map(|(_, m)| m.as_str())
            .collect::<Vec<_>>()
            .join("; ");
        condition(
            d,
            conditions::VERIFIED,
            Status::False,
            reason,
            message,
            obs.generation,
            now,
            VERIFY,
        );
        return true;
    }
    if cond::find(&d.status.conditions, conditions::VERIFIED).is_some_and(|c| {
        c.reason == reasons::BUNDLE_CHANGED || c.reason == reasons::TARGETS_CHANGED
    }) {
        condition(
            d,
            conditions::VERIFIED,
            Status::True,
            reasons::SIGNATURE_VERIFIED,
            format!(
                "spec.bundle and spec.targets match the verified pin again ({})",
                before.to_digest.as_deref().unwrap_or_default()
            ),
            obs.generation,
            now,
            VERIFY,
        );
    }
    false
}

/// The state machine after validation.
fn step(spec: &BundlePinSpec, obs: &Observations, now: Timestamp, d: &mut Decision) {
    let gen_ = obs.generation;
    if !matches!(
        d.status.phase,
        BundlePinPhase::Released | BundlePinPhase::Refused
    ) && let Some(by) = superseded_by(obs, &d.status)
    {
        handed_over(by.name.clone(), now, gen_, d);
        return;
    }
    if d.status.phase == BundlePinPhase::Failed && spec.release && !is_over(Some(&d.status)) {
        // A failed pin may have suspended some Applications: a release gives them back.
        release(
            spec,
            obs,
            now,
            d,
            reasons::RELEASED_EXPLICITLY,
            format!(
                "released after a failure: {}",
                spec.release_reason.as_deref().unwrap_or("no reason given")
            ),
        );
        return;
    }
    if matches!(
        d.status.phase,
        BundlePinPhase::Released | BundlePinPhase::Refused | BundlePinPhase::Failed
    ) {
        d.requeue = Requeue::AwaitChange;
        return;
    }
    // A changed spec never redirects a pin: it keeps holding what it verified, applies nothing
    // new, and still releases (explicitly, on deletion, or on matching content).
    let drifted = check_drift(spec, obs, now, d);
    match d.status.phase {
        BundlePinPhase::Released | BundlePinPhase::Refused | BundlePinPhase::Failed => {
            d.requeue = Requeue::AwaitChange;
        }
        _ if spec.release => release(
            spec,
            obs,
            now,
            d,
            reasons::RELEASED_EXPLICITLY,
            format!(
                "released explicitly: {}",
                spec.release_reason.as_deref().unwrap_or("no reason given")
            ),
        ),
        BundlePinPhase::Verifying => verifying(spec, obs, now, d, gen_),
        BundlePinPhase::Pinning
            if deadline_left(spec, &d.status, now).is_some_and(|l| l.is_zero()) =>
        {
            give_back(spec, obs, now, d)
        }
        // Waits for the spec to be restored, or for a release; the object's change wakes it
        // (and the deadline, which gives automation back).
        BundlePinPhase::Pinning if drifted => {
            d.requeue =
                deadline_left(spec, &d.status, now).map_or(Requeue::AwaitChange, Requeue::After)
        }
        BundlePinPhase::Pinning => pinning(spec, obs, now, d, gen_),
        BundlePinPhase::Pinned => pinned(spec, obs, now, d, gen_),
        BundlePinPhase::Releasing => release(
            spec,
            obs,
            now,
            d,
            reasons::CONTENT_MATCHED,
            "Argo CD reports the pinned content".into(),
        ),
    }
}

fn verifying(
    spec: &BundlePinSpec,
    obs: &Observations,
    now: Timestamp,
    d: &mut Decision,
    gen_: Option<i64>,
) {
    let summary = match &obs.verification {
        None => {
            d.requeue = Requeue::After(SHORT);
            return;
        }
        Some(Verification::Refused { reason, message })
            if *reason == reasons::UNSIGNED
                && obs.created_at.is_some_and(|c| {
                    now.as_second() - c.as_second() < obs.signature_grace.as_secs() as i64
                }) =>
        {
            condition(
                d,
                conditions::VERIFIED,
                Status::Unknown,
                reasons::SIGNATURE_PENDING,
                format!(
                    "no signature found yet, retried for {} s after the pin's creation before it is refused: {message}",
                    obs.signature_grace.as_secs()
                ),
                gen_,
                now,
                VERIFY,
            );
            d.requeue = Requeue::After(RETRY);
            return;
        }
        Some(Verification::Refused { reason, message }) => {
            d.status.phase = BundlePinPhase::Refused;
            condition(
                d,
                conditions::VERIFIED,
                Status::False,
                reason,
                format!("refused, nothing applied: {message}"),
                gen_,
                now,
                VERIFY,
            );
            d.requeue = Requeue::AwaitChange;
            return;
        }
        Some(Verification::Unavailable { reason, message }) => {
            condition(
                d,
                conditions::VERIFIED,
                Status::Unknown,
                reason,
                format!("cannot verify yet, nothing applied: {message}"),
                gen_,
                now,
                VERIFY,
            );
            d.requeue = Requeue::After(RETRY);
            return;
        }
        Some(Verification::Verified(s)) => s,
    };
    if summary.digest != spec.bundle.digest {
        d.status.phase = BundlePinPhase::Refused;
        condition(
            d,
            conditions::VERIFIED,
            Status::False,
            reasons::TAMPERED,
            format!(
                "refused, nothing applied: verified digest {} is not spec.bundle.digest {}",
                summary.digest, spec.bundle.digest
            ),
            gen_,
            now,
            VERIFY,
        );
        return;
    }
    if summary.objects.len() > MAX_OBJECTS {
        d.status.phase = BundlePinPhase::Refused;
        condition(
            d,
            conditions::VERIFIED,
            Status::False,
            reasons::TOO_MANY_OBJECTS,
            format!(
                "refused, nothing applied: the bundle holds {} objects, more than the {MAX_OBJECTS} a pin records; split the Application's configuration",
                summary.objects.len()
            ),
            gen_,
            now,
            VERIFY,
        );
        d.requeue = Requeue::AwaitChange;
        return;
    }
    // Every target must be pinnable before any is touched.
    let mut refusals: Vec<(&'static str, String)> = Vec::new();
    let mut apps = Vec::new();
    for o in &obs.applications {
        let mut app = PinnedApplication {
            name: o.name.clone(),
            namespace: o.namespace.clone(),
            ..PinnedApplication::default()
        };
        let who = format!("Application {}/{}", o.namespace, o.name);
        match &o.view {
            None => {
                let m = format!("{who} not found; create it or fix spec.targets");
                refusals.push((reasons::APPLICATION_NOT_FOUND, m.clone()));
                app.state = ApplicationPinState::Refused;
                app.message = Some(m);
            }
            Some(v) if !v.oci_sourced => {
                let m = format!(
                    "{who} is not OCI-sourced (repoURL must start with oci://); pins apply to OCI-sourced Applications only — revert Git-sourced ones in Git"
                );
                refusals.push((reasons::NOT_OCI_SOURCED, m.clone()));
                app.state = ApplicationPinState::Refused;
                app.message = Some(m);
            }
            Some(AppView {
                application_set: Some(set),
                ..
            }) if !set.covers_sync_policy => {
                let m = format!(
                    "{who} is generated by ApplicationSet {} whose spec.ignoreApplicationDifferences does not cover /spec/syncPolicy, so it would undo the suspension; add {{jsonPointers: [/spec/syncPolicy]}} there",
                    set.name
                );
                refusals.push((reasons::APPLICATION_SET_WOULD_REVERT, m.clone()));
                app.state = ApplicationPinState::Refused;
                app.message = Some(m);
            }
            Some(v) => {
                app.state = ApplicationPinState::Pending;
                app.original_sync_policy = v.sync_policy.clone();
                app.original_sync_policy_saved = true;
                app.from_digest = v.revision.clone();
                app.destination = v.destination.clone();
                app.destination_namespace = v.destination_namespace.clone();
                let holders: Vec<&OtherPin> = obs
                    .other_pins
                    .iter()
                    .filter(|p| {
                        p.targets
                            .iter()
                            .any(|k| k.namespace == o.namespace && k.name == o.name)
                    })
                    .collect();
                for holder in holders {
                    if spec.supersedes.as_deref() == Some(holder.name.as_str()) {
                        // An explicit hand-over: the policy before the first pin, not its
                        // suspension.
                        if let Some(held) = holder.applications.iter().find(|a| {
                            a.namespace == o.namespace && a.name == o.name && holds_application(a)
                        }) {
                            app.original_sync_policy = held.original_sync_policy.clone();
                            app.inherited_from = Some(holder.name.clone());
                        }
                        continue;
                    }
                    let m = format!(
                        "{who} is held by BundlePin {}/{}; release that pin first, or hand over from it with spec.supersedes: {}",
                        obs.pin.0, holder.name, holder.name
                    );
                    refusals.push((reasons::TARGET_ALREADY_PINNED, m.clone()));
                    app.state = ApplicationPinState::Refused;
                    app.message = Some(m);
                }
                for (reason, m) in binding_problems(spec, obs, summary, v, &who) {
                    refusals.push((reason, m.clone()));
                    app.state = ApplicationPinState::Refused;
                    app.message = Some(m);
                }
                if spec.allow_any_revision && !v.history.contains(&summary.digest) {
                    d.actions.push(event(
                        Severity::Warning,
                        reasons::ANY_REVISION_ALLOWED,
                        VERIFY,
                        format!(
                            "{who}: pinning {}, a digest Argo CD never deployed for it (spec.allowAnyRevision)",
                            summary.digest
                        ),
                    ));
                }
            }
        }
        apps.push(app);
    }
    d.status.applications = apps;
    if let Some((reason, _)) = refusals.first() {
        d.status.phase = BundlePinPhase::Refused;
        let message = refusals
            .iter()
            .map(|(_, m)| m.as_str())
            .collect::<Vec<_>>()
            .join("; ");
        condition(
            d,
            conditions::VERIFIED,
            Status::False,
            reason,
            format!("refused, nothing applied: {message}"),
            gen_,
            now,
            VERIFY,
        );
        d.requeue = Requeue::AwaitChange;
        return;
    }
    let froms: Vec<&str> = d
        .status
        .applications
        .iter()
        .filter_map(|a| a.from_digest.as_deref())
        .collect();
    d.status.from_digest = match froms.first() {
        Some(f) if froms.len() == d.status.applications.len() && froms.iter().all(|x| x == f) => {
            Some((*f).to_owned())
        }
        _ => None,
    };
    d.status.objects = summary
        .objects
        .iter()
        .map(|o| PinnedObject {
            group: o.group.clone(),
            version: o.version.clone(),
            kind: o.kind.clone(),
            namespace: o.namespace.clone(),
            name: o.name.clone(),
        })
        .collect();
    d.status.to_digest = Some(summary.digest.clone());
    d.status.to_repository = Some(spec.bundle.repository.clone());
    d.status.content_digest = Some(summary.content_digest.clone());
    d.status.verified_at = Some(Time(now));
    d.status.phase = BundlePinPhase::Pinning;
    condition(
        d,
        conditions::VERIFIED,
        Status::True,
        reasons::SIGNATURE_VERIFIED,
        format!(
            "signature on {} verified with key {}; {} objects, all of allowed kinds",
            summary.digest,
            summary.key_fingerprint,
            summary.objects.len()
        ),
        gen_,
        now,
        VERIFY,
    );
    // The original policies are now recorded; the next reconcile (from this status) touches
    // the Applications.
    d.requeue = Requeue::After(Duration::ZERO);
}

/// Why a verified bundle may not be pinned to this Application: not its repository, a
/// digest it never ran, several sources, namespaces it may not write, too large a prune.
fn binding_problems(
    spec: &BundlePinSpec,
    obs: &Observations,
    summary: &BundleSummary,
    v: &AppView,
    who: &str,
) -> Vec<(&'static str, String)> {
    let mut out = Vec::new();
    if v.multi_source {
        out.push((
            reasons::NOT_SINGLE_SOURCE,
            format!("{who} has several sources; a pin replaces one bundle and would prune the others' objects — pin it per source or revert in Git"),
        ));
        return out;
    }
    let repo = v.repo_url.as_deref().unwrap_or_default();
    if binding::normalise_repository(repo) != binding::normalise_repository(&spec.bundle.repository)
    {
        out.push((
            reasons::REPOSITORY_MISMATCH,
            format!(
                "{who} syncs {repo}, not {}: a pin applies a bundle of the Application's own repository only",
                spec.bundle.repository
            ),
        ));
    }
    if !spec.allow_any_revision && !v.history.contains(&summary.digest) {
        out.push((
            reasons::REVISION_NOT_DEPLOYED,
            format!(
                "Argo CD never deployed {} for {who} (not in status.history); pin a revision it ran, or set spec.allowAnyRevision (audited)",
                summary.digest
            ),
        ));
    }
    let dest_ns = v.destination_namespace.clone().unwrap_or_default();
    let mut namespaces: Vec<String> = summary
        .objects
        .iter()
        .map(|o| {
            if o.namespace.is_empty() {
                dest_ns.clone()
            } else {
                o.namespace.clone()
            }
        })
        .collect();
    namespaces.sort();
    namespaces.dedup();
    for ns in namespaces {
        let known = ns == dest_ns || v.tracked.iter().any(|t| t.namespace == ns);
        let (name, server) = &v.destination_name_server;
        let permitted = v
            .project_destinations
            .as_ref()
            .is_none_or(|d| binding::destination_matched(d, name, server, &ns));
        if !known || !permitted {
            out.push((
                reasons::NAMESPACE_NOT_ALLOWED,
                format!(
                    "the bundle writes namespace {ns:?}, which {}",
                    if known {
                        format!("{who}'s AppProject does not permit")
                    } else {
                        format!("is neither {who}'s destination namespace nor one Argo CD tracks objects in for it")
                    }
                ),
            ));
        }
    }
    let allowed = allowed_kinds(spec, obs.platform_kinds.as_deref());
    let tracked = v
        .tracked
        .iter()
        .filter(|t| {
            allowed
                .iter()
                .any(|a| a.group == t.group && a.kind == t.kind)
        })
        .count();
    let prune = if policy_prunes(v.sync_policy.as_ref()) {
        to_prune(&allowed, summary, v, &dest_ns).len()
    } else {
        0
    };
    if spec.max_prune_percent < 100 && prune * 100 > spec.max_prune_percent as usize * tracked {
        out.push((
            reasons::PRUNE_TOO_LARGE,
            format!(
                "the pin would delete {prune} of the {tracked} objects Argo CD tracks for {who}, more than spec.maxPrunePercent ({}%): likely the wrong bundle; raise it if this is meant",
                spec.max_prune_percent
            ),
        ));
    }
    out
}

/// Tracked objects of allowed kinds the bundle lacks.
fn to_prune(
    allowed: &[GroupKind],
    bundle: &BundleSummary,
    v: &AppView,
    default_ns: &str,
) -> Vec<ObjectKey> {
    let in_bundle: Vec<ObjectKey> = bundle
        .objects
        .iter()
        .map(|o| ObjectKey {
            namespace: if o.namespace.is_empty() {
                default_ns.to_owned()
            } else {
                o.namespace.clone()
            },
            ..o.clone()
        })
        .collect();
    let mut out: Vec<ObjectKey> = v
        .tracked
        .iter()
        .filter(|t| {
            allowed
                .iter()
                .any(|a| a.group == t.group && a.kind == t.kind)
        })
        .filter(|t| !in_bundle.iter().any(|b| b.same_object(t)))
        .cloned()
        .collect();
    out.sort();
    out.dedup();
    out
}

fn pinning(
    spec: &BundlePinSpec,
    obs: &Observations,
    now: Timestamp,
    d: &mut Decision,
    gen_: Option<i64>,
) {
    let held = bundle_to_verify(spec, Some(&d.status)).digest;
    let bundle = match &obs.verification {
        Some(Verification::Verified(b)) if b.digest == held => b.clone(),
        Some(Verification::Refused { reason, message }) => {
            // The registry now serves something else under the signed digest: stop.
            d.status.phase = BundlePinPhase::Failed;
            condition(
                d,
                conditions::PINNED,
                Status::False,
                reason,
                format!("verification failed while pinning: {message}"),
                gen_,
                now,
                PIN,
            );
            d.requeue = Requeue::AwaitChange;
            return;
        }
        _ => {
            d.requeue = Requeue::After(RETRY);
            return;
        }
    };
    let allowed = allowed_kinds(spec, obs.platform_kinds.as_deref());
    let mut waiting = false;
    let mut actions = Vec::new();
    let mut apps = d.status.applications.clone();
    for app in &mut apps {
        let key = app_key(app);
        let Some(v) = view(obs, app) else {
            app.state = ApplicationPinState::Failed;
            app.message = Some(format!(
                "Application {}/{} disappeared while pinning",
                app.namespace, app.name
            ));
            continue;
        };
        match app.state {
            ApplicationPinState::Pending => {
                // Record first, touch after: only a status that already holds the original
                // policy lets an Application be suspended.
                if !app.original_sync_policy_saved {
                    app.original_sync_policy = v.sync_policy.clone();
                    app.original_sync_policy_saved = true;
                    waiting = true;
                    continue;
                }
                // revert's identity, the destination's kinds and a dry-run of every write
                // succeed before automation is suspended; a failure is retried until the
                // deadline, with nothing suspended.
                if !app.preflight_passed {
                    let Some(destination) = app.destination.clone().or(v.destination.clone())
                    else {
                        app.state = ApplicationPinState::Failed;
                        app.message = Some("the Application names no destination cluster".into());
                        continue;
                    };
                    let default_ns = app
                        .destination_namespace
                        .clone()
                        .or(v.destination_namespace.clone());
                    actions.push(Action::Preflight {
                        app: key,
                        destination,
                        prune: if policy_prunes(app.original_sync_policy.as_ref()) {
                            to_prune(
                                &allowed,
                                &bundle,
                                v,
                                default_ns.as_deref().unwrap_or_default(),
                            )
                        } else {
                            Vec::new()
                        },
                        default_namespace: default_ns,
                    });
                    app.preflight_passed = true;
                    waiting = true;
                    continue;
                }
                if v.operation_phase.as_deref() == Some("Running") {
                    actions.push(Action::TerminateSync { app: key.clone() });
                    app.sync_terminated = true;
                }
                if v.automated {
                    actions.push(Action::SetAutomation {
                        app: key.clone(),
                        enabled: Some(false),
                    });
                }
                if v.operation_requested && !v.sync_running() {
                    actions.push(Action::ClearOperation { app: key });
                }
                app.state = ApplicationPinState::Suspended;
                waiting = true;
            }
            ApplicationPinState::Suspended => {
                if v.sync_running() || v.automated {
                    // Terminating, or something turned automation back on: suspend again.
                    if v.automated {
                        actions.push(Action::SetAutomation {
                            app: key,
                            enabled: Some(false),
                        });
                    }
                    waiting = true;
                    continue;
                }
                let default_ns = app
                    .destination_namespace
                    .clone()
                    .or(v.destination_namespace.clone());
                // Only what Argo CD's own sync under the recorded policy would delete.
                let lacking = to_prune(
                    &allowed,
                    &bundle,
                    v,
                    default_ns.as_deref().unwrap_or_default(),
                );
                let (prune, kept) = if policy_prunes(app.original_sync_policy.as_ref()) {
                    (lacking, None)
                } else {
                    let kept = (!lacking.is_empty()).then(|| format!(
                        "kept {} object(s) the bundle lacks: the Application's sync policy does not prune (automated.prune is not true), as Argo CD's sync would keep them",
                        lacking.len()
                    ));
                    (Vec::new(), kept)
                };
                let Some(destination) = app.destination.clone().or(v.destination.clone()) else {
                    app.state = ApplicationPinState::Failed;
                    app.message = Some("the Application names no destination cluster".into());
                    continue;
                };
                app.applied_objects = bundle.objects.len() as u32;
                app.pruned_objects = prune.len() as u32;
                app.pinned_at = Some(Time(now));
                app.state = ApplicationPinState::Pinned;
                app.message = kept;
                actions.push(Action::Apply {
                    app: key,
                    destination,
                    default_namespace: default_ns,
                    prune,
                });
            }
            _ => {}
        }
    }
    d.status.applications = apps;
    d.actions.splice(0..0, actions);
    let failed: Vec<String> = d
        .status
        .applications
        .iter()
        .filter(|a| a.state == ApplicationPinState::Failed)
        .filter_map(|a| a.message.clone())
        .collect();
    if !failed.is_empty() {
        condition(
            d,
            conditions::PINNED,
            Status::False,
            reasons::APPLY_FAILED,
            failed.join("; "),
            gen_,
            now,
            PIN,
        );
    }
    let all_pinned = d
        .status
        .applications
        .iter()
        .all(|a| a.state == ApplicationPinState::Pinned);
    if !all_pinned {
        let wait = if waiting { SHORT } else { RETRY };
        d.requeue = Requeue::After(
            deadline_left(spec, &d.status, now).map_or(wait, |left| wait.min(left.max(SHORT))),
        );
        return;
    }
    d.status.phase = BundlePinPhase::Pinned;
    d.status.pinned_at = Some(Time(now));
    d.status.applied_objects = d
        .status
        .applications
        .iter()
        .map(|a| a.applied_objects)
        .sum();
    d.status.pruned_objects = d.status.applications.iter().map(|a| a.pruned_objects).sum();
    let note = format!(
        "pinned {} Application(s) from {} to {} (content {}): {} objects applied, {} pruned; reason: {}",
        d.status.applications.len(),
        d.status.from_digest.as_deref().unwrap_or("mixed revisions"),
        held,
        bundle.content_digest,
        d.status.applied_objects,
        d.status.pruned_objects,
        spec.reason
    );
    cond::set(
        &mut d.status.conditions,
        cond::new(
            conditions::PINNED,
            Status::True,
            reasons::ALL_PINNED,
            note.clone(),
            gen_,
            now,
        ),
    );
    d.actions.push(Action::Audit {
        reason: reasons::ALL_PINNED,
        from_digest: d.status.from_digest.clone(),
        to_digest: d.status.to_digest.clone(),
        note,
    });
    // The git revert follows in the next reconcile, so the pin is recorded as soon as every
    // object is applied.
    d.requeue = Requeue::After(if spec.git_revert.is_some() {
        Duration::ZERO
    } else {
        POLL
    });
}

/// Asks for the git revert until the status records its branch: at once for a spec not tried
/// yet, after [`git_retry_after`] for a failure that may pass, never again for one that cannot
/// until the spec changes (a new generation).
fn git_revert(
    spec: &BundlePinSpec,
    obs: &Observations,
    now: Timestamp,
    d: &mut Decision,
    gen_: Option<i64>,
) {
    let Some(git) = &spec.git_revert else { return };
    if let Some(done) = &d.status.git_revert
        && done.failure.is_some()
        && done.attempted_generation == gen_
    {
        if !done.retryable {
            return;
        }
        let due = done
            .last_attempt_at
            .as_ref()
            .map(|t| t.0.as_second() + git_retry_after(done.failed_attempts).as_secs() as i64);
        if let Some(due) = due
            && now.as_second() < due
        {
            let wait = Duration::from_secs((due - now.as_second()) as u64);
            if let Requeue::After(current) = d.requeue
                && wait < current
            {
                d.requeue = Requeue::After(wait);
            }
            return;
        }
    } else if d
        .status
        .git_revert
        .as_ref()
        .is_some_and(|g| g.failure.is_none() || g.branch.is_some())
    {
        // Pushed (a status written before failures were recorded counts as pushed too).
        return;
    }
    if !obs.git_configured {
        condition(
            d,
            conditions::GIT_REVERT,
            Status::False,
            reasons::GIT_NOT_CONFIGURED,
            "spec.gitRevert is set but the operator has no intent repository configured (--git-url); revert the change in Git by hand".into(),
            gen_,
            now,
            PIN,
        );
        return;
    }
    let (ns, name) = &obs.pin;
    // The effect runs before the status write; its result is recorded by the reconcile.
    d.actions.push(Action::PushRevert {
        commit: git.commit.clone(),
        base: git.base_branch.clone(),
        branch: branch_name(ns, name, &obs.uid),
        message: format!(
            "Revert {} (BundlePin {ns}/{name})\n\n{}\n\nPinned to {}.",
            &git.commit,
            spec.reason,
            bundle_to_verify(spec, Some(&d.status)).reference()
        ),
        pull_request: git.pull_request,
        owner: obs.uid.clone(),
    });
}

fn pinned(
    spec: &BundlePinSpec,
    obs: &Observations,
    now: Timestamp,
    d: &mut Decision,
    gen_: Option<i64>,
) {
    d.requeue = Requeue::After(POLL);
    git_revert(spec, obs, now, d, gen_);
    // Something turned automation back on (a person, a controller): suspend again, each time
    // after a longer wait, and after MAX_RESUSPENSIONS within FIGHT_WINDOW stop and say so
    // instead of fighting at API speed.
    let mut resuspend = Vec::new();
    let mut fighting = Vec::new();
    for app in &mut d.status.applications {
        let Some(v) = view(obs, app) else { continue };
        if !v.automated || app.state != ApplicationPinState::Pinned {
            continue;
        }
        let last = app.last_resuspended_at.as_ref().map(|t| t.0.as_second());
        if last.is_some_and(|l| now.as_second() - l > FIGHT_WINDOW.as_secs() as i64) {
            app.resuspensions = 0;
        }
        let who = format!("{}/{}", app.namespace, app.name);
        if app.resuspensions >= MAX_RESUSPENSIONS {
            fighting.push(who);
            continue;
        }
        let due = last.map_or(0, |l| {
            l + resuspend_backoff(app.resuspensions).as_secs() as i64
        });
        if now.as_second() < due {
            d.requeue = Requeue::After(Duration::from_secs((due - now.as_second()) as u64));
            continue;
        }
        app.resuspensions += 1;
        app.last_resuspended_at = Some(Time(now));
        resuspend.push((
            Action::SetAutomation {
                app: app_key(app),
                enabled: Some(false),
            },
            who,
        ));
    }
    if !resuspend.is_empty() {
        let names: Vec<String> = resuspend.iter().map(|(_, w)| w.clone()).collect();
        d.actions.push(event(
            Severity::Warning,
            reasons::RESUSPENDED,
            PIN,
            format!(
                "automated sync was turned back on for {} while pinned; suspended again",
                names.join(", ")
            ),
        ));
        d.actions
            .splice(0..0, resuspend.into_iter().map(|(a, _)| a));
    }
    if !fighting.is_empty() {
        condition(
            d,
            conditions::SUSPENDED,
            Status::False,
            reasons::FIGHTING,
            format!(
                "automated sync of {} was turned back on {MAX_RESUSPENSIONS} times within {} min while pinned; revert stopped suspending it again. Fix what turns it on (an ApplicationSet without ignoreApplicationDifferences on /spec/syncPolicy, a person, a tool), then suspend it by hand or release this pin",
                fighting.join(", "),
                FIGHT_WINDOW.as_secs() / 60
            ),
            gen_,
            now,
            PIN,
        );
    }
    if spec.release_policy == ReleasePolicy::Explicit {
        return;
    }
    let Some(content) = d.status.content_digest.clone() else {
        return;
    };
    let mut matched = true;
    let mut forward = Vec::new();
    for app in &d.status.applications {
        let Some(v) = view(obs, app) else {
            matched = false;
            continue;
        };
        // Argo CD reports Synced; or OutOfSync only by objects that need pruning while the
        // recorded policy does not prune — Argo CD's auto-sync skips exactly that case ("need
        // to prune extra resources only but automated prune is disabled"), so giving automation
        // back changes nothing. Extraneous objects annotated
        // `argocd.argoproj.io/compare-options: IgnoreExtraneous` never make Argo CD report
        // OutOfSync (`controller/state.go`), so they already read Synced here.
        let synced = v.sync_status.as_deref() == Some("Synced")
            || (v.out_of_sync_only_by_pruning && !policy_prunes(app.original_sync_policy.as_ref()));
        let same = v.revision_content.as_deref() == Some(content.as_str());
        if !(synced && same) {
            matched = false;
        }
        if let (Some(rev), Some(c)) = (&v.revision, &v.revision_content)
            && *c != content
            && Some(rev) != app.from_digest.as_ref()
        {
            forward.push(format!(
                "{}/{} at {rev} (content {c})",
                app.namespace, app.name
            ));
        }
    }
    if matched {
        release(
            spec,
            obs,
            now,
            d,
            reasons::CONTENT_MATCHED,
            format!("Argo CD reports every Application Synced at the pinned content {content}"),
        );
        return;
    }
    if !forward.is_empty() {
        condition(
            d,
            conditions::RELEASED,
            Status::False,
            reasons::FORWARD_FIX_WAITING,
            format!(
                "Argo CD now targets different content than the pin ({}); if this forward fix is wanted, set spec.release: true with spec.releaseReason",
                forward.join(", ")
            ),
            gen_,
            now,
            RELEASE,
        );
    }
}

fn release(
    _spec: &BundlePinSpec,
    obs: &Observations,
    now: Timestamp,
    d: &mut Decision,
    reason: &'static str,
    note: String,
) {
    let gen_ = obs.generation;
    // Sync policies first, from what verification recorded: never waits on the registry or the
    // key. Then revert's field ownership of the recorded objects.
    d.status.released_at = Some(Time(now));
    let mut effects = give_back_effects(obs, d);
    effects.sort_by_key(|a| matches!(a, Action::DropOwnership { .. }));
    d.actions.splice(0..0, effects);
    d.status.phase = BundlePinPhase::Released;
    cond::set(
        &mut d.status.conditions,
        cond::new(
            conditions::RELEASED,
            Status::True,
            reason,
            note.clone(),
            gen_,
            now,
        ),
    );
    d.actions.push(Action::Audit {
        reason,
        from_digest: d.status.to_digest.clone(),
        to_digest: None,
        note,
    });
    d.requeue = Requeue::AwaitChange;
}

/// The effects that give every held Application its automation back (`automated.enabled` as
/// recorded, nothing else of the policy) and drop revert's field ownership of the objects it
/// applied; marks those Applications Released.
fn give_back_effects(obs: &Observations, d: &mut Decision) -> Vec<Action> {
    let now_released = d.status.released_at.clone();
    let mut effects = Vec::new();
    for app in &mut d.status.applications {
        // A Failed Application is given back only while it still exists.
        let touched = holds_application(app)
            && (app.state != ApplicationPinState::Failed || view(obs, app).is_some());
        if touched
            && app.original_sync_policy_saved
            && let Some(enabled) = original_enabled(app)
            && view(obs, app).is_some()
        {
            effects.push(Action::SetAutomation {
                app: app_key(app),
                enabled,
            });
        }
        if app.state == ApplicationPinState::Pinned
            && let Some(destination) = &app.destination
        {
            effects.push(Action::DropOwnership {
                app: app_key(app),
                destination: destination.clone(),
                default_namespace: app
                    .destination_namespace
                    .clone()
                    .or_else(|| view(obs, app).and_then(|v| v.destination_namespace.clone())),
            });
        }
        if touched || app.state == ApplicationPinState::Pending {
            app.state = ApplicationPinState::Released;
            app.released_at = now_released.clone();
        }
    }
    effects
}

/// The pin's deadline passed before every object was restored: every Application it suspended
/// gets its automation back and the pin ends Failed, holding nothing.
fn give_back(spec: &BundlePinSpec, obs: &Observations, now: Timestamp, d: &mut Decision) {
    d.status.released_at = Some(Time(now));
    let mut effects = give_back_effects(obs, d);
    effects.sort_by_key(|a| matches!(a, Action::DropOwnership { .. }));
    d.actions.splice(0..0, effects);
    d.status.phase = BundlePinPhase::Failed;
    let note = format!(
        "the pin did not restore every object within spec.pinDeadlineSeconds ({} s); every Application it suspended has its automation back. The last failure is in this pin's Events and revert's log",
        spec.pin_deadline_seconds
    );
    condition(
        d,
        conditions::PINNED,
        Status::False,
        reasons::DEADLINE_EXCEEDED,
        note.clone(),
        obs.generation,
        now,
        PIN,
    );
    d.actions.push(Action::Audit {
        reason: reasons::DEADLINE_EXCEEDED,
        from_digest: d.status.to_digest.clone(),
        to_digest: None,
        note,
    });
    d.requeue = Requeue::AwaitChange;
}

/// A pin that supersedes this one took its Applications over (with their original policies):
/// this one lets go without restoring anything or dropping ownership (the same field manager
/// now holds the successor's objects).
fn handed_over(by: String, now: Timestamp, gen_: Option<i64>, d: &mut Decision) {
    for app in &mut d.status.applications {
        if holds_application(app) || app.state == ApplicationPinState::Pending {
            app.state = ApplicationPinState::Released;
            app.released_at = Some(Time(now));
        }
    }
    d.status.phase = BundlePinPhase::Released;
    d.status.released_at = Some(Time(now));
    let note = format!("BundlePin {by} superseded this pin and holds its Applications now");
    cond::set(
        &mut d.status.conditions,
        cond::new(
            conditions::RELEASED,
            Status::True,
            reasons::SUPERSEDED,
            note.clone(),
            gen_,
            now,
        ),
    );
    d.actions.push(Action::Audit {
        reason: reasons::SUPERSEDED,
        from_digest: d.status.to_digest.clone(),
        to_digest: None,
        note,
    });
    d.requeue = Requeue::AwaitChange;
}

/// The validity part of [`decide`], given the spec's problems (empty when valid).
pub fn decide_validity(
    problems: &[String],
    status: Option<&BundlePinStatus>,
    obs: &Observations,
    now: Timestamp,
) -> Decision {
    let mut next = status.cloned().unwrap_or_default();
    next.observed_generation = obs.generation;
    let validity = cond::set_validity(&mut next.conditions, problems, obs.generation, now);
    let was_refused_for_spec = validity.was_invalid && next.phase == BundlePinPhase::Refused;
    if !validity.valid {
        // Only a pin that has not touched anything may be refused for its spec.
        if matches!(
            next.phase,
            BundlePinPhase::Verifying | BundlePinPhase::Refused
        ) {
            next.phase = BundlePinPhase::Refused;
        }
    } else if was_refused_for_spec {
        next.phase = BundlePinPhase::Verifying;
    }
    let note = validity.message;

    let mut actions = Vec::new();
    if validity.transitioned {
        actions.push(if validity.valid {
            Action::Event {
                severity: Severity::Normal,
                reason: reasons::VALID,
                action: VALIDATE,
                note: "spec accepted".to_owned(),
            }
        } else {
            Action::Event {
                severity: Severity::Warning,
                reason: reasons::INVALID_SPEC,
                action: VALIDATE,
                note,
            }
        });
    }
    Decision {
        actions,
        status: next,
        // An invalid spec is waited on (no requeue loop).
        requeue: Requeue::AwaitChange,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use sluice_api::v1alpha1::bundle_pin::conditions;

    const BAD: &str = "sha256:bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb";
    const GOOD: &str = "sha256:aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";
    const FIX: &str = "sha256:cccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccc";
    const GOOD_CONTENT: &str = "sha256:1111";
    const BAD_CONTENT: &str = "sha256:2222";
    const FIX_CONTENT: &str = "sha256:3333";

    fn t(secs: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + secs).unwrap()
    }

    fn spec(patch: Value) -> BundlePinSpec {
        let mut base = json!({
            "targets": [{"name": "mesh-c1", "namespace": "argocd"}],
            "bundle": {"repository": "oci://registry.local:5000/mesh/config", "digest": GOOD},
            "publicKeysSecretRef": {"name": "cosign"},
            "reason": "5xx after change 42",
            "gitRevert": {"commit": "abcdef1"},
        });
        for (k, v) in patch.as_object().unwrap() {
            base[k] = v.clone();
        }
        serde_json::from_value(base).unwrap()
    }

    fn key(kind: &str, name: &str) -> ObjectKey {
        ObjectKey {
            group: "gateway.networking.k8s.io".into(),
            kind: kind.into(),
            namespace: "shop".into(),
            name: name.into(),
            version: "v1".into(),
        }
    }

    fn summary() -> BundleSummary {
        BundleSummary {
            digest: GOOD.into(),
            content_digest: GOOD_CONTENT.into(),
            key_fingerprint: "SHA256:k".into(),
            objects: vec![key("HTTPRoute", "checkout")],
        }
    }

    fn original_policy() -> Value {
        json!({"automated": {"prune": true, "selfHeal": true, "future": 1}, "syncOptions": ["ServerSideApply=true"], "retry": {"limit": 2}})
    }

    /// A tiny Argo CD: one Application the effects act on.
    #[derive(Clone, Debug)]
    struct World {
        app: AppView,
        applied: u32,
        pruned: Vec<ObjectKey>,
        pushes: u32,
        dropped: u32,
        preflights: u32,
    }

    impl World {
        fn new() -> Self {
            World {
                app: AppView {
                    oci_sourced: true,
                    application_set: None,
                    sync_policy: Some(original_policy()),
                    automated: true,
                    operation_phase: Some("Running".into()),
                    operation_requested: true,
                    sync_status: Some("Synced".into()),
                    revision: Some(BAD.into()),
                    revision_content: Some(BAD_CONTENT.into()),
                    destination: Some("c1".into()),
                    destination_namespace: Some("shop".into()),
                    out_of_sync_only_by_pruning: false,
                    tracked: vec![
                        key("HTTPRoute", "checkout"),
                        key("HTTPRoute", "added-by-bad-change"),
                        ObjectKey {
                            group: "apps".into(),
                            kind: "Deployment".into(),
                            ..key("Deployment", "checkout")
                        },
                    ],
                    repo_url: Some("oci://registry.local:5000/mesh/config".into()),
                    multi_source: false,
                    history: vec![GOOD.into(), BAD.into()],
                    destination_name_server: ("c1".into(), String::new()),
                    project_destinations: None,
                },
                applied: 0,
                pruned: vec![],
                pushes: 0,
                dropped: 0,
                preflights: 0,
            }
        }

        fn obs(&self, verification: Option<Verification>) -> Observations {
            Observations {
                generation: Some(1),
                pin: ("argocd".into(), "pin-1".into()),
                uid: PIN_UID.into(),
                verification,
                applications: vec![AppObservation {
                    namespace: "argocd".into(),
                    name: "mesh-c1".into(),
                    view: Some(self.app.clone()),
                }],
                git_configured: true,
                other_pins: vec![],
                platform_kinds: None,
                created_at: None,
                created_by: Some("kubectl-client-side-apply".into()),
                signature_grace: SIGNATURE_GRACE,
                application_namespace: Some("argocd".into()),
            }
        }

        /// Carries out the effects; returns how many there were.
        fn act(&mut self, d: &Decision) -> usize {
            let mut n = 0;
            for a in &d.actions {
                match a {
                    Action::TerminateSync { .. } => {
                        self.app.operation_phase = Some("Terminating".into())
                    }
                    Action::SetAutomation { enabled, .. } => {
                        if let Some(automated) = self
                            .app
                            .sync_policy
                            .as_mut()
                            .and_then(|p| p.get_mut("automated"))
                            .and_then(Value::as_object_mut)
                        {
                            match enabled {
                                Some(b) => {
                                    automated.insert("enabled".into(), json!(b));
                                }
                                None => {
                                    automated.remove("enabled");
                                }
                            }
                        }
                        self.app.automated = self
                            .app
                            .sync_policy
                            .as_ref()
                            .and_then(|p| p.get("automated"))
                            .is_some_and(|a| a.get("enabled") != Some(&json!(false)));
                    }
                    Action::ClearOperation { .. } => self.app.operation_requested = false,
                    Action::Preflight { .. } => self.preflights += 1,
                    Action::Apply { prune, .. } => {
                        self.applied += 1;
                        self.pruned.extend(prune.iter().cloned());
                        self.app.tracked.retain(|t| !prune.contains(t));
                    }
                    Action::DropOwnership { .. } => self.dropped += 1,
                    Action::PushRevert { .. } => self.pushes += 1,
                    Action::Event { .. } | Action::Audit { .. } => continue,
                }
                n += 1;
            }
            n
        }

        /// Argo CD finishing the terminated sync.
        fn sync_ends(&mut self) {
            if self.app.operation_phase.as_deref() == Some("Terminating") {
                self.app.operation_phase = Some("Failed".into());
                self.app.operation_requested = false;
            }
        }
    }

    const PIN_UID: &str = "3F2A9C1E-77b0-4c1d-9e2f-0123456789ab";

    /// The reconcile's bookkeeping of a pushed revert (what the I/O side records).
    fn record_git(d: &mut Decision) {
        if d.actions
            .iter()
            .any(|a| matches!(a, Action::PushRevert { .. }))
        {
            record_git_outcome(
                &mut d.status,
                GitOutcome::Pushed(GitRevertStatus {
                    branch: Some("sluice/revert/argocd/pin-1-3f2a9c1e".into()),
                    commit: Some("f00".into()),
                    ..Default::default()
                }),
                Some(1),
                t(0),
            );
        }
    }

    /// `Ready=False InvalidSpec`, its message containing `message`.
    fn assert_invalid_spec(d: &Decision, message: &str) {
        let ready = cond::find(&d.status.conditions, conditions::READY).unwrap();
        assert_eq!(
            (ready.status.as_str(), ready.reason.as_str()),
            ("False", reasons::INVALID_SPEC)
        );
        assert!(ready.message.contains(message), "{}", ready.message);
    }

    fn verified() -> Option<Verification> {
        Some(Verification::Verified(summary()))
    }

    fn effects(d: &Decision) -> Vec<&Action> {
        d.actions.iter().filter(|a| a.is_effect()).collect()
    }

    fn reasons_of(d: &Decision) -> Vec<&'static str> {
        d.actions
            .iter()
            .filter_map(|a| match a {
                Action::Event { reason, .. } | Action::Audit { reason, .. } => Some(*reason),
                _ => None,
            })
            .collect()
    }

    /// Runs the pin to Pinned; `crash_at` skips the status write after that many reconciles
    /// (the operator died after its effects), so the next reconcile starts from the old status.
    fn pin(spec: &BundlePinSpec, world: &mut World, crash_at: Option<usize>) -> BundlePinStatus {
        let mut status: Option<BundlePinStatus> = None;
        for i in 0..12 {
            let mut d = decide(spec, status.as_ref(), &world.obs(verified()), t(i as i64));
            world.act(&d);
            world.sync_ends();
            if crash_at == Some(i) {
                continue;
            }
            record_git(&mut d);
            status = Some(d.status.clone());
            if d.status.phase == BundlePinPhase::Pinned && d.status.git_revert.is_some() {
                return d.status;
            }
        }
        panic!("never pinned: {status:#?}");
    }

    #[test]
    fn verification_outcomes_before_anything_is_touched() {
        struct Row {
            name: &'static str,
            verification: Option<Verification>,
            app: Option<AppView>,
            want_phase: BundlePinPhase,
            want_reason: &'static str,
            want_requeue: Requeue,
        }
        let ok = World::new().app;
        let refused = |reason| {
            Some(Verification::Refused {
                reason,
                message: "because".into(),
            })
        };
        let table = vec![
            Row {
                name: "unsigned",
                verification: refused(reasons::UNSIGNED),
                app: Some(ok.clone()),
                want_phase: BundlePinPhase::Refused,
                want_reason: reasons::UNSIGNED,
                want_requeue: Requeue::AwaitChange,
            },
            Row {
                name: "wrong key",
                verification: refused(reasons::WRONG_KEY),
                app: Some(ok.clone()),
                want_phase: BundlePinPhase::Refused,
                want_reason: reasons::WRONG_KEY,
                want_requeue: Requeue::AwaitChange,
            },
            Row {
                name: "tampered",
                verification: refused(reasons::TAMPERED),
                app: Some(ok.clone()),
                want_phase: BundlePinPhase::Refused,
                want_reason: reasons::TAMPERED,
                want_requeue: Requeue::AwaitChange,
            },
            Row {
                name: "disallowed kind",
                verification: refused(reasons::DISALLOWED_KIND),
                app: Some(ok.clone()),
                want_phase: BundlePinPhase::Refused,
                want_reason: reasons::DISALLOWED_KIND,
                want_requeue: Requeue::AwaitChange,
            },
            Row {
                name: "registry down",
                verification: Some(Verification::Unavailable {
                    reason: reasons::BUNDLE_UNAVAILABLE,
                    message: "down".into(),
                }),
                app: Some(ok.clone()),
                want_phase: BundlePinPhase::Verifying,
                want_reason: reasons::BUNDLE_UNAVAILABLE,
                want_requeue: Requeue::After(RETRY),
            },
            Row {
                name: "git-sourced",
                verification: verified(),
                app: Some(AppView {
                    oci_sourced: false,
                    ..ok.clone()
                }),
                want_phase: BundlePinPhase::Refused,
                want_reason: reasons::NOT_OCI_SOURCED,
                want_requeue: Requeue::AwaitChange,
            },
            Row {
                name: "not found",
                verification: verified(),
                app: None,
                want_phase: BundlePinPhase::Refused,
                want_reason: reasons::APPLICATION_NOT_FOUND,
                want_requeue: Requeue::AwaitChange,
            },
            Row {
                name: "ApplicationSet would revert",
                verification: verified(),
                app: Some(AppView {
                    application_set: Some(OwningApplicationSet {
                        name: "mesh".into(),
                        covers_sync_policy: false,
                    }),
                    ..ok.clone()
                }),
                want_phase: BundlePinPhase::Refused,
                want_reason: reasons::APPLICATION_SET_WOULD_REVERT,
                want_requeue: Requeue::AwaitChange,
            },
            Row {
                name: "ApplicationSet ignores syncPolicy",
                verification: verified(),
                app: Some(AppView {
                    application_set: Some(OwningApplicationSet {
                        name: "mesh".into(),
                        covers_sync_policy: true,
                    }),
                    ..ok.clone()
                }),
                want_phase: BundlePinPhase::Pinning,
                want_reason: reasons::SIGNATURE_VERIFIED,
                want_requeue: Requeue::After(Duration::ZERO),
            },
            Row {
                name: "verified",
                verification: verified(),
                app: Some(ok.clone()),
                want_phase: BundlePinPhase::Pinning,
                want_reason: reasons::SIGNATURE_VERIFIED,
                want_requeue: Requeue::After(Duration::ZERO),
            },
        ];
        for row in table {
            let mut obs = World::new().obs(row.verification);
            obs.applications[0].view = row.app;
            let d = decide(&spec(json!({})), None, &obs, t(0));
            assert_eq!(d.status.phase, row.want_phase, "{}", row.name);
            assert!(
                effects(&d).is_empty(),
                "{}: nothing touched while verifying",
                row.name
            );
            let verified_cond = cond::find(&d.status.conditions, conditions::VERIFIED)
                .unwrap_or_else(|| panic!("{}: no Verified condition", row.name));
            assert_eq!(verified_cond.reason, row.want_reason, "{}", row.name);
            assert!(
                reasons_of(&d).contains(&row.want_reason),
                "{}: an Event names the cause",
                row.name
            );
            assert_eq!(d.requeue, row.want_requeue, "{}", row.name);
            if row.want_phase == BundlePinPhase::Pinning {
                let app = &d.status.applications[0];
                assert!(app.original_sync_policy_saved, "{}", row.name);
                assert_eq!(
                    app.original_sync_policy,
                    Some(original_policy()),
                    "{}",
                    row.name
                );
                assert_eq!(app.from_digest.as_deref(), Some(BAD), "{}", row.name);
                assert_eq!(d.status.to_digest.as_deref(), Some(GOOD), "{}", row.name);
                assert_eq!(
                    d.status.content_digest.as_deref(),
                    Some(GOOD_CONTENT),
                    "{}",
                    row.name
                );
            }
        }
    }

    #[test]
    fn a_pin_terminates_suspends_applies_prunes_and_pushes_git_once() {
        let spec = spec(json!({}));
        let mut world = World::new();
        let status = pin(&spec, &mut world, None);
        // Terminated the running sync, suspended automation keeping every other setting.
        assert!(status.applications[0].sync_terminated);
        assert!(!world.app.automated);
        let mut want = original_policy();
        want["automated"]["enabled"] = json!(false);
        assert_eq!(world.app.sync_policy, Some(want));
        assert!(
            !world.app.operation_requested,
            "the terminated sync is gone"
        );
        // Applied once, pruned the allowed object the bundle lacks, never the Deployment.
        assert_eq!(world.applied, 1);
        assert_eq!(world.pruned, vec![key("HTTPRoute", "added-by-bad-change")]);
        assert_eq!(status.applied_objects, 1);
        assert_eq!(status.pruned_objects, 1);
        assert_eq!(world.pushes, 1);
        assert_eq!(status.from_digest.as_deref(), Some(BAD));
        assert_eq!(status.to_digest.as_deref(), Some(GOOD));
        assert!(status.pinned_at.is_some());
        // While pinned and Argo CD still at the bad revision: nothing more happens.
        let d = decide(&spec, Some(&status), &world.obs(verified()), t(100));
        assert!(effects(&d).is_empty(), "{:?}", d.actions);
        assert_eq!(d.status.phase, BundlePinPhase::Pinned);
        assert_eq!(d.requeue, Requeue::After(POLL));
    }

    #[test]
    fn restart_at_every_point_finishes_the_same_pin_without_a_second_push() {
        let spec = spec(json!({}));
        let mut clean_world = World::new();
        let clean = pin(&spec, &mut clean_world, None);
        for crash_at in 0..6 {
            let mut world = World::new();
            let status = pin(&spec, &mut world, Some(crash_at));
            let a = &status.applications[0];
            assert_eq!(
                a.original_sync_policy,
                Some(original_policy()),
                "crash after reconcile {crash_at}: the original policy survives"
            );
            assert_eq!(status.phase, BundlePinPhase::Pinned, "crash {crash_at}");
            assert_eq!(world.pruned, clean_world.pruned, "crash {crash_at}");
            assert_eq!(
                world.app.sync_policy, clean_world.app.sync_policy,
                "crash {crash_at}"
            );
            assert_eq!(
                status.applied_objects, clean.applied_objects,
                "crash {crash_at}"
            );
            // The git client is asked again only if the status never recorded the push; it
            // then reports the existing branch (see sluice-gitops), so the branch exists once.
            assert!(world.pushes <= 2, "crash {crash_at}: {}", world.pushes);
            // From the recorded status nothing is ever asked twice.
            let d = decide(&spec, Some(&status), &world.obs(verified()), t(200));
            assert!(effects(&d).is_empty(), "crash {crash_at}: {:?}", d.actions);
        }
    }

    #[test]
    fn release_on_matching_content_restores_the_policy_exactly() {
        let spec = spec(json!({}));
        let mut world = World::new();
        let status = pin(&spec, &mut world, None);
        struct Row {
            name: &'static str,
            sync_status: &'static str,
            revision: &'static str,
            content: &'static str,
            want_phase: BundlePinPhase,
            want_reason: Option<&'static str>,
        }
        let table = [
            Row {
                name: "still the bad revision, OutOfSync",
                sync_status: "OutOfSync",
                revision: BAD,
                content: BAD_CONTENT,
                want_phase: BundlePinPhase::Pinned,
                want_reason: None,
            },
            Row {
                name: "forward fix, OutOfSync",
                sync_status: "OutOfSync",
                revision: FIX,
                content: FIX_CONTENT,
                want_phase: BundlePinPhase::Pinned,
                want_reason: Some(reasons::FORWARD_FIX_WAITING),
            },
            Row {
                name: "pinned content, but OutOfSync",
                sync_status: "OutOfSync",
                revision: FIX,
                content: GOOD_CONTENT,
                want_phase: BundlePinPhase::Pinned,
                want_reason: None,
            },
            Row {
                name: "Synced at equal content (new digest)",
                sync_status: "Synced",
                revision: FIX,
                content: GOOD_CONTENT,
                want_phase: BundlePinPhase::Released,
                want_reason: Some(reasons::CONTENT_MATCHED),
            },
        ];
        for row in table {
            let mut w = world.clone();
            w.app.sync_status = Some(row.sync_status.into());
            w.app.revision = Some(row.revision.into());
            w.app.revision_content = Some(row.content.into());
            let d = decide(&spec, Some(&status), &w.obs(verified()), t(300));
            assert_eq!(d.status.phase, row.want_phase, "{}", row.name);
            if let Some(reason) = row.want_reason {
                assert!(
                    reasons_of(&d).contains(&reason),
                    "{}: {:?}",
                    row.name,
                    d.actions
                );
            }
            if row.want_phase == BundlePinPhase::Released {
                w.act(&d);
                assert_eq!(
                    w.app.sync_policy,
                    Some(original_policy()),
                    "{}: restored exactly",
                    row.name
                );
                assert!(w.app.automated, "{}", row.name);
                assert_eq!(
                    w.dropped, 1,
                    "{}: revert's field ownership dropped",
                    row.name
                );
                assert_eq!(
                    d.status.applications[0].state,
                    ApplicationPinState::Released
                );
                assert_eq!(d.requeue, Requeue::AwaitChange);
            } else {
                assert!(effects(&d).is_empty(), "{}: {:?}", row.name, d.actions);
            }
        }
    }

    #[test]
    fn an_application_whose_policy_does_not_prune_keeps_what_the_bundle_lacks_and_releases() {
        let spec = spec(json!({}));
        for (name, prunes) in [("prune: true", true), ("prune: false", false)] {
            let mut world = World::new();
            world.app.sync_policy = Some(json!({"automated": {"prune": prunes, "selfHeal": true}}));
            let status = pin(&spec, &mut world, None);
            if prunes {
                assert_eq!(
                    world.pruned,
                    vec![key("HTTPRoute", "added-by-bad-change")],
                    "{name}"
                );
                assert_eq!(status.pruned_objects, 1, "{name}");
                continue;
            }
            // As Argo CD's sync under that policy: nothing deleted, and said so.
            assert!(world.pruned.is_empty(), "{name}: {:?}", world.pruned);
            assert_eq!(status.pruned_objects, 0, "{name}");
            assert_eq!(
                status.applications[0].message.as_deref(),
                Some(
                    "kept 1 object(s) the bundle lacks: the Application's sync policy does not prune (automated.prune is not true), as Argo CD's sync would keep them"
                ),
                "{name}"
            );
            // Git reverted: Argo CD targets the pinned content and reports OutOfSync only by
            // the object that needs pruning, which its own auto-sync would skip too.
            let mut w = world.clone();
            w.app.revision = Some(FIX.into());
            w.app.revision_content = Some(GOOD_CONTENT.into());
            w.app.sync_status = Some("OutOfSync".into());
            w.app.out_of_sync_only_by_pruning = true;
            let d = decide(&spec, Some(&status), &w.obs(verified()), t(300));
            assert_eq!(d.status.phase, BundlePinPhase::Released, "{name}");
            // Something else OutOfSync: still pinned.
            w.app.out_of_sync_only_by_pruning = false;
            let d = decide(&spec, Some(&status), &w.obs(verified()), t(300));
            assert_eq!(d.status.phase, BundlePinPhase::Pinned, "{name}");
        }
        // A policy that prunes releases only on Synced (Argo CD would prune, then report it).
        let mut world = World::new();
        let status = pin(&spec, &mut world, None);
        world.app.revision = Some(FIX.into());
        world.app.revision_content = Some(GOOD_CONTENT.into());
        world.app.sync_status = Some("OutOfSync".into());
        world.app.out_of_sync_only_by_pruning = true;
        let d = decide(&spec, Some(&status), &world.obs(verified()), t(300));
        assert_eq!(d.status.phase, BundlePinPhase::Pinned);
    }

    #[test]
    fn a_spec_changed_after_verification_applies_nothing_new_and_is_reported() {
        struct Row {
            name: &'static str,
            /// Reconciles run from a fresh status before the change (1: Pinning, None: Pinned).
            reconciles: Option<usize>,
            change: Value,
            want_reason: &'static str,
        }
        let two_targets = json!({"targets": [
            {"name": "mesh-c1", "namespace": "argocd"},
            {"name": "mesh-c2", "namespace": "argocd"}
        ]});
        let table = [
            Row {
                name: "digest changed while pinning",
                reconciles: Some(1),
                change: json!({"bundle": {"repository": "oci://registry.local:5000/mesh/config", "digest": FIX}}),
                want_reason: reasons::BUNDLE_CHANGED,
            },
            Row {
                name: "repository changed while pinning",
                reconciles: Some(1),
                change: json!({"bundle": {"repository": "oci://registry.local:5000/mesh/other", "digest": GOOD}}),
                want_reason: reasons::BUNDLE_CHANGED,
            },
            Row {
                name: "target added while pinning",
                reconciles: Some(1),
                change: two_targets.clone(),
                want_reason: reasons::TARGETS_CHANGED,
            },
            Row {
                name: "digest changed while pinned",
                reconciles: None,
                change: json!({"bundle": {"repository": "oci://registry.local:5000/mesh/config", "digest": FIX}}),
                want_reason: reasons::BUNDLE_CHANGED,
            },
            Row {
                name: "target replaced while pinned",
                reconciles: None,
                change: json!({"targets": [{"name": "mesh-c2", "namespace": "argocd"}]}),
                want_reason: reasons::TARGETS_CHANGED,
            },
            Row {
                name: "target added while pinned",
                reconciles: None,
                change: two_targets.clone(),
                want_reason: reasons::TARGETS_CHANGED,
            },
        ];
        let original = spec(json!({}));
        for row in table {
            let mut world = World::new();
            let status = match row.reconciles {
                Some(n) => {
                    let mut status = None;
                    for i in 0..n {
                        let d = decide(
                            &original,
                            status.as_ref(),
                            &world.obs(verified()),
                            t(i as i64),
                        );
                        world.act(&d);
                        status = Some(d.status);
                    }
                    status.unwrap()
                }
                None => pin(&original, &mut world, None),
            };
            let phase = status.phase;
            let changed = spec(row.change.clone());
            // The reconcile verifies and observes what the status recorded, not the new spec.
            assert_eq!(
                bundle_to_verify(&changed, Some(&status)),
                original.bundle,
                "{}",
                row.name
            );
            assert_eq!(
                targets_to_observe(&changed, Some(&status), "argocd"),
                vec![AppKey {
                    namespace: "argocd".into(),
                    name: "mesh-c1".into()
                }],
                "{}",
                row.name
            );
            let d = decide(&changed, Some(&status), &world.obs(verified()), t(50));
            assert!(effects(&d).is_empty(), "{}: {:?}", row.name, d.actions);
            assert_eq!(d.status.phase, phase, "{}", row.name);
            assert_eq!(d.status.to_digest.as_deref(), Some(GOOD), "{}", row.name);
            let c = cond::find(&d.status.conditions, conditions::VERIFIED).unwrap();
            assert_eq!(
                (c.status.as_str(), c.reason.as_str()),
                ("False", row.want_reason),
                "{}",
                row.name
            );
            assert!(
                c.message.contains("create a new BundlePin"),
                "{}: {}",
                row.name,
                c.message
            );
            assert!(
                d.actions.iter().any(|a| matches!(a, Action::Event { severity: Severity::Warning, reason, .. } if *reason == row.want_reason)),
                "{}: a Warning Event names it",
                row.name
            );
            // Asked again: the same status, no second Event.
            let again = decide(&changed, Some(&d.status), &world.obs(verified()), t(51));
            assert_eq!(again.status, d.status, "{}", row.name);
            assert!(reasons_of(&again).is_empty(), "{}", row.name);

            // Restored: the pin goes on from where it was, Verified again.
            let back = decide(&original, Some(&d.status), &world.obs(verified()), t(52));
            let c = cond::find(&back.status.conditions, conditions::VERIFIED).unwrap();
            assert_eq!(
                (c.status.as_str(), c.reason.as_str()),
                ("True", reasons::SIGNATURE_VERIFIED),
                "{}",
                row.name
            );
            if phase == BundlePinPhase::Pinning {
                assert!(!effects(&back).is_empty(), "{}: pinning resumes", row.name);
            }

            // Released while changed: the verified pin is undone exactly.
            let mut release = row.change.clone();
            release["release"] = json!(true);
            release["releaseReason"] = json!("pinned the wrong bundle");
            let r = decide(
                &spec(release),
                Some(&d.status),
                &world.obs(verified()),
                t(53),
            );
            assert_eq!(r.status.phase, BundlePinPhase::Released, "{}", row.name);
            world.act(&r);
            assert_eq!(
                world.app.sync_policy,
                Some(original_policy()),
                "{}",
                row.name
            );
        }
    }

    #[test]
    fn explicit_policy_and_explicit_release() {
        let spec_explicit = spec(json!({"releasePolicy": "Explicit"}));
        let mut world = World::new();
        let status = pin(&spec_explicit, &mut world, None);
        world.app.revision = Some(FIX.into());
        world.app.revision_content = Some(GOOD_CONTENT.into());
        let d = decide(
            &spec_explicit,
            Some(&status),
            &world.obs(verified()),
            t(300),
        );
        assert_eq!(
            d.status.phase,
            BundlePinPhase::Pinned,
            "matching content does not release an Explicit pin"
        );
        let released = spec(
            json!({"releasePolicy": "Explicit", "release": true, "releaseReason": "forward fix 43 verified"}),
        );
        let d = decide(&released, Some(&status), &world.obs(verified()), t(301));
        assert_eq!(d.status.phase, BundlePinPhase::Released);
        assert!(reasons_of(&d).contains(&reasons::RELEASED_EXPLICITLY));
        world.act(&d);
        assert_eq!(world.app.sync_policy, Some(original_policy()));
        // A release asked for before anything was touched releases with no effect.
        let d = decide(&released, None, &world.obs(None), t(0));
        assert_eq!(d.status.phase, BundlePinPhase::Released);
        assert!(effects(&d).is_empty());
    }

    #[test]
    fn a_failed_pin_gives_suspended_applications_back_on_release() {
        let pin_spec = spec(json!({}));
        let mut world = World::new();
        // Pin until the Application's automation is suspended, not yet applied.
        let mut status: Option<BundlePinStatus> = None;
        for i in 0..6 {
            let d = decide(&pin_spec, status.as_ref(), &world.obs(verified()), t(i));
            world.act(&d);
            status = Some(d.status);
            if !world.app.automated {
                break;
            }
        }
        assert!(!world.app.automated, "suspended before the failure");
        // The registry now serves something else under the signed digest: the pin fails.
        let refused = Some(Verification::Refused {
            reason: reasons::TAMPERED,
            message: "no signature verifies with the configured keys".into(),
        });
        let failed = decide(
            &pin_spec,
            status.as_ref(),
            &world.obs(refused.clone()),
            t(10),
        );
        assert_eq!(failed.status.phase, BundlePinPhase::Failed);
        assert!(
            !is_over(Some(&failed.status)),
            "a failed pin holding a suspended Application is not over"
        );
        let idle = decide(
            &pin_spec,
            Some(&failed.status),
            &world.obs(refused.clone()),
            t(11),
        );
        assert!(effects(&idle).is_empty(), "nothing happens until a release");
        // A release (explicit, or by deletion) restores the policy even though the bundle no
        // longer verifies; ownership is kept (no object list to drop it from).
        let released = spec(json!({"release": true, "releaseReason": "registry repaired"}));
        let d = decide(&released, Some(&failed.status), &world.obs(refused), t(12));
        assert_eq!(d.status.phase, BundlePinPhase::Released);
        assert!(reasons_of(&d).contains(&reasons::RELEASED_EXPLICITLY));
        world.act(&d);
        assert_eq!(world.app.sync_policy, Some(original_policy()));
        assert!(world.app.automated);
        assert_eq!(world.dropped, 0);
        assert!(is_over(Some(&d.status)));
        // A Failed pin that never touched an Application is over.
        let mut untouched = failed.status.clone();
        untouched.applications.iter_mut().for_each(|a| {
            a.state = ApplicationPinState::Failed;
            a.original_sync_policy_saved = false;
        });
        assert!(is_over(Some(&untouched)));
    }

    #[test]
    fn a_pin_is_tied_to_its_application() {
        type Edit = fn(&mut AppView, &mut Value);
        let rows: [(&str, Edit, Option<&str>); 9] = [
            ("its own repository, a revision it ran", |_, _| {}, None),
            (
                "another repository's signed bundle (a typo in --bundle)",
                |v, _| v.repo_url = Some("oci://registry.local:5000/security/policies".into()),
                Some(reasons::REPOSITORY_MISMATCH),
            ),
            (
                "a digest Argo CD never deployed for it",
                |v, _| v.history = vec![BAD.into()],
                Some(reasons::REVISION_NOT_DEPLOYED),
            ),
            (
                "allowAnyRevision, audited",
                |v, spec| {
                    v.history = vec![BAD.into()];
                    spec["allowAnyRevision"] = json!(true);
                },
                None,
            ),
            (
                "several sources",
                |v, _| v.multi_source = true,
                Some(reasons::NOT_SINGLE_SOURCE),
            ),
            (
                "a namespace the Application neither targets nor tracks",
                |v, _| {
                    v.destination_namespace = Some("payments".into());
                    v.tracked.retain(|t| t.kind == "Deployment");
                    v.tracked
                        .iter_mut()
                        .for_each(|t| t.namespace = "payments".into());
                },
                Some(reasons::NAMESPACE_NOT_ALLOWED),
            ),
            (
                "a namespace its AppProject does not permit",
                |v, _| {
                    v.project_destinations = Some(vec![binding::ProjectDestination {
                        server: String::new(),
                        name: "c1".into(),
                        namespace: "payments".into(),
                    }])
                },
                Some(reasons::NAMESPACE_NOT_ALLOWED),
            ),
            (
                "a prune of most of what it tracks",
                |v, _| {
                    v.tracked
                        .extend(["a", "b", "c"].map(|n| key("HTTPRoute", &format!("extra-{n}"))))
                },
                Some(reasons::PRUNE_TOO_LARGE),
            ),
            (
                "the same prune, allowed",
                |v, spec| {
                    v.tracked
                        .extend(["a", "b", "c"].map(|n| key("HTTPRoute", &format!("extra-{n}"))));
                    spec["maxPrunePercent"] = json!(100);
                },
                None,
            ),
        ];
        for (name, edit, refused) in rows {
            let mut world = World::new();
            let mut spec_json = json!({});
            edit(&mut world.app, &mut spec_json);
            let d = decide(&spec(spec_json.clone()), None, &world.obs(verified()), t(0));
            assert!(effects(&d).is_empty(), "{name}: nothing touched");
            match refused {
                Some(reason) => {
                    assert_eq!(d.status.phase, BundlePinPhase::Refused, "{name}");
                    let c = cond::find(&d.status.conditions, conditions::VERIFIED).unwrap();
                    assert_eq!(c.reason, reason, "{name}: {}", c.message);
                }
                None => assert_eq!(d.status.phase, BundlePinPhase::Pinning, "{name}"),
            }
            if spec_json.get("allowAnyRevision").is_some() {
                assert!(
                    reasons_of(&d).contains(&reasons::ANY_REVISION_ALLOWED),
                    "{name}"
                );
            }
        }
    }

    #[test]
    fn the_platform_kinds_bound_what_a_pin_prunes() {
        let platform = vec![GroupKind {
            group: "networking.istio.io".into(),
            kind: "VirtualService".into(),
        }];
        let kinds = allowed_kinds(&spec(json!({})), Some(&platform));
        assert_eq!(
            kinds, platform,
            "the default list narrowed to the platform's"
        );
        let world = World::new();
        assert!(to_prune(&kinds, &summary(), &world.app, "shop").is_empty());
    }

    #[test]
    fn the_status_keeps_who_pinned_what_from_where_to_where_and_how_it_ended() {
        let pin_spec = spec(json!({"releasePolicy": "Explicit"}));
        let mut world = World::new();
        let pinned = pin(&pin_spec, &mut world, None);
        let released = spec(
            json!({"releasePolicy": "Explicit", "release": true, "releaseReason": "fixed forward"}),
        );
        let d = decide(&released, Some(&pinned), &world.obs(None), t(500));
        let h = &d.status.history;
        let phases: Vec<BundlePinPhase> = h.iter().map(|e| e.phase).collect();
        assert_eq!(
            phases,
            vec![
                BundlePinPhase::Pinning,
                BundlePinPhase::Pinned,
                BundlePinPhase::Released
            ]
        );
        let reasons: Vec<&str> = h.iter().map(|e| e.reason.as_str()).collect();
        assert_eq!(
            reasons,
            vec![
                reasons::SIGNATURE_VERIFIED,
                reasons::ALL_PINNED,
                reasons::RELEASED_EXPLICITLY
            ]
        );
        for e in h {
            assert_eq!(e.from_digest.as_deref(), Some(BAD));
            assert_eq!(e.to_digest.as_deref(), Some(GOOD));
            assert_eq!(e.created_by.as_deref(), Some("kubectl-client-side-apply"));
        }
        assert!(h[2].message.as_deref().unwrap().contains("fixed forward"));
        // Bounded: the oldest go first.
        let mut d = Decision {
            actions: vec![],
            status: d.status.clone(),
            requeue: Requeue::AwaitChange,
        };
        for i in 0..40 {
            record(&mut d, t(1000 + i));
        }
        assert_eq!(d.status.history.len(), MAX_HISTORY);
        assert_eq!(d.status.history.last().unwrap().at, Time(t(1039)));
    }

    #[test]
    fn a_missing_signature_just_after_creation_is_retried_then_refused() {
        let unsigned = Some(Verification::Refused {
            reason: reasons::UNSIGNED,
            message: "no signature for the digest (404)".into(),
        });
        let world = World::new();
        let mut obs = world.obs(unsigned);
        obs.created_at = Some(t(0));
        let d = decide(&spec(json!({})), None, &obs, t(30));
        assert_eq!(d.status.phase, BundlePinPhase::Verifying);
        let c = cond::find(&d.status.conditions, conditions::VERIFIED).unwrap();
        assert_eq!(
            (c.status.as_str(), c.reason.as_str()),
            ("Unknown", reasons::SIGNATURE_PENDING)
        );
        assert_eq!(d.requeue, Requeue::After(RETRY));
        let d = decide(&spec(json!({})), Some(&d.status), &obs, t(121));
        assert_eq!(d.status.phase, BundlePinPhase::Refused);
        assert_eq!(
            cond::find(&d.status.conditions, conditions::VERIFIED)
                .unwrap()
                .reason,
            reasons::UNSIGNED
        );
    }

    /// Runs the pin until automation is suspended (not yet applied); returns the status.
    fn until_suspended(spec: &BundlePinSpec, world: &mut World) -> BundlePinStatus {
        let mut status: Option<BundlePinStatus> = None;
        for i in 0..8 {
            let d = decide(spec, status.as_ref(), &world.obs(verified()), t(i));
            world.act(&d);
            world.sync_ends();
            status = Some(d.status);
            if !world.app.automated {
                return status.unwrap();
            }
        }
        panic!("never suspended: {status:#?}");
    }

    #[test]
    fn nothing_is_suspended_before_the_preflight_passed() {
        let spec = spec(json!({}));
        let mut world = World::new();
        let mut status: Option<BundlePinStatus> = None;
        for i in 0..8 {
            let d = decide(&spec, status.as_ref(), &world.obs(verified()), t(i));
            if d.actions.iter().any(|a| {
                matches!(
                    a,
                    Action::SetAutomation { .. }
                        | Action::TerminateSync { .. }
                        | Action::Apply { .. }
                )
            }) {
                assert_eq!(world.preflights, 1, "preflight first: {:?}", d.actions);
                return;
            }
            // The preflight fails (identity missing, 403, kind not served): its status is never
            // written, so the next reconcile asks for it again and suspends nothing.
            if d.actions
                .iter()
                .any(|a| matches!(a, Action::Preflight { .. }))
                && i < 4
            {
                continue;
            }
            world.act(&d);
            status = Some(d.status);
        }
        panic!("never got past the preflight");
    }

    #[test]
    fn a_pin_that_cannot_apply_within_its_deadline_gives_automation_back() {
        let spec = spec(json!({"pinDeadlineSeconds": 60}));
        let mut world = World::new();
        let suspended = until_suspended(&spec, &mut world);
        // Every apply fails (403, CRD gone, conflict): the status stays where it was.
        let before = decide(&spec, Some(&suspended), &world.obs(verified()), t(30));
        assert!(
            before
                .actions
                .iter()
                .any(|a| matches!(a, Action::Apply { .. }))
        );
        assert!(
            matches!(before.requeue, Requeue::After(d) if d <= Duration::from_secs(60)),
            "looks again before the deadline: {:?}",
            before.requeue
        );
        let d = decide(&spec, Some(&suspended), &world.obs(verified()), t(61));
        assert_eq!(d.status.phase, BundlePinPhase::Failed);
        let c = cond::find(&d.status.conditions, conditions::PINNED).unwrap();
        assert_eq!(c.reason, reasons::DEADLINE_EXCEEDED);
        assert!(c.message.contains("60 s"), "{}", c.message);
        assert!(
            !d.actions.iter().any(|a| matches!(a, Action::Apply { .. })),
            "{:?}",
            d.actions
        );
        world.act(&d);
        assert_eq!(world.app.sync_policy, Some(original_policy()));
        assert!(world.app.automated);
        assert!(
            is_over(Some(&d.status)),
            "holds nothing: the finalizer goes"
        );
    }

    #[test]
    fn one_apply_may_take_only_the_time_left_before_the_deadline() {
        let spec = spec(json!({"pinDeadlineSeconds": 60}));
        let mut world = World::new();
        let suspended = until_suspended(&spec, &mut world);
        let verified = suspended.verified_at.as_ref().unwrap().0.as_second();
        let at = |s: i64| Timestamp::from_second(verified + s).unwrap();
        assert_eq!(
            apply_budget(&spec, &suspended, at(20)),
            Duration::from_secs(40)
        );
        assert_eq!(
            apply_budget(&spec, &suspended, at(75)),
            Duration::from_secs(1),
            "past the deadline an apply still gets a second, never zero"
        );
        let long = spec_with_deadline(3600);
        assert_eq!(apply_budget(&long, &suspended, at(0)), MAX_APPLY);
        assert_eq!(
            apply_budget(&spec, &BundlePinStatus::default(), at(0)),
            MAX_APPLY,
            "not verified: bounded by MAX_APPLY alone"
        );
    }

    fn spec_with_deadline(seconds: u32) -> BundlePinSpec {
        spec(json!({ "pinDeadlineSeconds": seconds }))
    }

    #[test]
    fn release_needs_neither_the_registry_nor_the_key() {
        let pin_spec = spec(json!({"releasePolicy": "Explicit"}));
        let mut world = World::new();
        let pinned = pin(&pin_spec, &mut world, None);
        assert_eq!(pinned.objects.len(), 1, "the objects are recorded");
        // The key was rotated out and the digest garbage-collected: nothing verifies.
        let released = spec(
            json!({"releasePolicy": "Explicit", "release": true, "releaseReason": "incident over"}),
        );
        for verification in [
            None,
            Some(Verification::Refused {
                reason: reasons::WRONG_KEY,
                message: "rotated".into(),
            }),
            Some(Verification::Unavailable {
                reason: reasons::BUNDLE_UNAVAILABLE,
                message: "manifest unknown".into(),
            }),
        ] {
            let mut w = world.clone();
            let d = decide(&released, Some(&pinned), &w.obs(verification), t(200));
            assert_eq!(d.status.phase, BundlePinPhase::Released);
            w.act(&d);
            assert_eq!(w.app.sync_policy, Some(original_policy()));
            assert_eq!(w.dropped, 1, "ownership dropped from the recorded objects");
            let first = effects(&d)[0];
            assert!(
                matches!(first, Action::SetAutomation { .. }),
                "automation first: {first:?}"
            );
        }
    }

    #[test]
    fn release_turns_automation_back_on_and_keeps_what_changed_meanwhile() {
        let pin_spec = spec(json!({"releasePolicy": "Explicit"}));
        for (name, original) in [
            ("enabled absent", original_policy()),
            (
                "enabled true",
                json!({"automated": {"enabled": true, "prune": false}}),
            ),
        ] {
            let mut world = World::new();
            world.app.sync_policy = Some(original.clone());
            let pinned = pin(&pin_spec, &mut world, None);
            // While pinned someone adds a sync option.
            world.app.sync_policy.as_mut().unwrap()["syncOptions"] = json!(["Validate=false"]);
            let released = spec(
                json!({"releasePolicy": "Explicit", "release": true, "releaseReason": "done"}),
            );
            let d = decide(&released, Some(&pinned), &world.obs(None), t(300));
            world.act(&d);
            let mut want = original.clone();
            want["syncOptions"] = json!(["Validate=false"]);
            assert_eq!(world.app.sync_policy, Some(want), "{name}");
        }
    }

    fn holder(name: &str, status: &BundlePinStatus, supersedes: Option<&str>) -> OtherPin {
        OtherPin {
            name: name.into(),
            supersedes: supersedes.map(str::to_owned),
            targets: vec![AppKey {
                namespace: "argocd".into(),
                name: "mesh-c1".into(),
            }],
            applications: status.applications.clone(),
            verified: status.to_digest.is_some(),
        }
    }

    #[test]
    fn a_second_pin_on_an_application_is_refused_unless_it_supersedes_the_first() {
        // The first pin (a wave-gate halt) suspended the Application.
        let first_spec = spec(json!({}));
        let mut world = World::new();
        let first = pin(&first_spec, &mut world, None);
        assert!(!world.app.automated);

        // A second pin (the on-call's) on the same Application: refused, naming the first.
        let mut obs = world.obs(verified());
        obs.pin.1 = "pin-2".into();
        obs.other_pins = vec![holder("pin-1", &first, None)];
        let d = decide(&spec(json!({})), None, &obs, t(100));
        assert_eq!(d.status.phase, BundlePinPhase::Refused);
        let c = cond::find(&d.status.conditions, conditions::VERIFIED).unwrap();
        assert_eq!(c.reason, reasons::TARGET_ALREADY_PINNED);
        assert!(
            c.message.contains("pin-1") && c.message.contains("supersedes"),
            "{}",
            c.message
        );
        assert!(effects(&d).is_empty());

        // Saying it supersedes the first: it inherits the policy before the first pin.
        let second_spec = spec(json!({"supersedes": "pin-1"}));
        let d = decide(&second_spec, None, &obs, t(101));
        assert_eq!(d.status.phase, BundlePinPhase::Pinning);
        let app = &d.status.applications[0];
        assert_eq!(app.original_sync_policy, Some(original_policy()));
        assert_eq!(app.inherited_from.as_deref(), Some("pin-1"));

        // The first pin then lets go without restoring anything.
        let mut first_obs = world.obs(None);
        first_obs.other_pins = vec![holder("pin-2", &d.status, Some("pin-1"))];
        let handed = decide(&first_spec, Some(&first), &first_obs, t(102));
        assert_eq!(handed.status.phase, BundlePinPhase::Released);
        assert!(effects(&handed).is_empty(), "{:?}", handed.actions);
        assert_eq!(
            cond::find(&handed.status.conditions, conditions::RELEASED)
                .unwrap()
                .reason,
            reasons::SUPERSEDED
        );
        assert!(
            !world.app.automated,
            "still suspended: the second pin holds it"
        );

        // The second pin, released, gives back the original automation.
        let mut second = d.status.clone();
        for a in &mut second.applications {
            a.state = ApplicationPinState::Pinned;
        }
        second.phase = BundlePinPhase::Pinned;
        let released =
            spec(json!({"supersedes": "pin-1", "release": true, "releaseReason": "done"}));
        let mut obs2 = world.obs(None);
        obs2.pin.1 = "pin-2".into();
        let d = decide(&released, Some(&second), &obs2, t(200));
        world.act(&d);
        assert!(world.app.automated, "automation back after both pins");
        assert_eq!(world.app.sync_policy, Some(original_policy()));
    }

    #[test]
    fn a_write_war_over_the_suspension_backs_off_then_stops_and_says_so() {
        let spec = spec(json!({"releasePolicy": "Explicit"}));
        let mut world = World::new();
        let mut status = pin(&spec, &mut world, None);
        let mut resuspended_at = Vec::new();
        // Something turns automation back on at once, every time, for 3 minutes.
        for now in 100..280 {
            world.app.automated = true;
            world.app.sync_policy.as_mut().unwrap()["automated"]["enabled"] = json!(true);
            let d = decide(&spec, Some(&status), &world.obs(None), t(now));
            if d.actions
                .iter()
                .any(|a| matches!(a, Action::SetAutomation { .. }))
            {
                resuspended_at.push(now);
            }
            world.act(&d);
            status = d.status;
        }
        assert_eq!(
            resuspended_at.len() as u32,
            MAX_RESUSPENSIONS,
            "{resuspended_at:?}"
        );
        let gaps: Vec<i64> = resuspended_at.windows(2).map(|w| w[1] - w[0]).collect();
        assert!(
            gaps.windows(2).all(|g| g[1] >= g[0]) && gaps.iter().all(|g| *g >= 1),
            "backs off: {gaps:?}"
        );
        let c = cond::find(&status.conditions, conditions::SUSPENDED).unwrap();
        assert_eq!(c.reason, reasons::FIGHTING);
        assert!(c.message.contains("argocd/mesh-c1"), "{}", c.message);
        assert_eq!(status.phase, BundlePinPhase::Pinned);
    }

    #[test]
    fn automation_turned_back_on_while_pinned_is_suspended_again() {
        let spec = spec(json!({}));
        let mut world = World::new();
        let status = pin(&spec, &mut world, None);
        world.app.automated = true;
        world.app.sync_policy = Some(original_policy());
        let d = decide(&spec, Some(&status), &world.obs(verified()), t(400));
        assert!(reasons_of(&d).contains(&reasons::RESUSPENDED));
        world.act(&d);
        assert!(!world.app.automated);
        // And the original policy in status is still the one from before the pin.
        assert_eq!(
            d.status.applications[0].original_sync_policy,
            Some(original_policy())
        );
    }

    fn pushes(d: &Decision) -> Vec<&Action> {
        d.actions
            .iter()
            .filter(|a| matches!(a, Action::PushRevert { .. }))
            .collect()
    }

    /// A pinned pin whose git revert was never recorded (the first push pending).
    fn pinned_without_git(spec: &BundlePinSpec, world: &mut World) -> BundlePinStatus {
        let mut status = pin(spec, world, None);
        status.git_revert = None;
        status
    }

    fn fail(
        status: &mut BundlePinStatus,
        reason: &'static str,
        retryable: bool,
        generation: i64,
        at: i64,
    ) {
        record_git_outcome(
            status,
            GitOutcome::Failed {
                reason,
                message: format!("{reason} happened"),
                retryable,
            },
            Some(generation),
            t(at),
        );
    }

    #[test]
    fn the_revert_branch_is_unique_to_the_pin_instance_and_owned_by_it() {
        let spec = spec(json!({}));
        let mut world = World::new();
        let status = pinned_without_git(&spec, &mut world);
        let d = decide(&spec, Some(&status), &world.obs(verified()), t(100));
        let [Action::PushRevert { branch, owner, .. }] = pushes(&d)[..] else {
            panic!("one push: {:?}", d.actions);
        };
        assert_eq!(branch, "sluice/revert/argocd/pin-1-3f2a9c1e");
        assert_eq!(owner, PIN_UID);
        // The same name reused months later by another pin (another UID): another branch.
        let mut later = world.obs(verified());
        later.uid = "0b7d55e2-1111-2222-3333-444455556666".into();
        let d = decide(&spec, Some(&status), &later, t(100));
        let [Action::PushRevert { branch, owner, .. }] = pushes(&d)[..] else {
            panic!("one push: {:?}", d.actions);
        };
        assert_eq!(branch, "sluice/revert/argocd/pin-1-0b7d55e2");
        assert_eq!(owner, &later.uid);
        assert_eq!(
            branch_name("argocd", "pin-1", ""),
            "sluice/revert/argocd/pin-1",
            "no UID known: the plain name"
        );
    }

    #[test]
    fn a_permanent_git_failure_is_not_tried_again_until_the_spec_changes() {
        for reason in [
            "RevertConflict",
            "CommitNotOnBase",
            "BranchTaken",
            "ForgeUnauthorized",
        ] {
            let spec = spec(json!({}));
            let mut world = World::new();
            let mut status = pinned_without_git(&spec, &mut world);
            assert_eq!(
                pushes(&decide(
                    &spec,
                    Some(&status),
                    &world.obs(verified()),
                    t(100)
                ))
                .len(),
                1
            );
            fail(&mut status, reason, false, 1, 100);
            let git = status.git_revert.clone().unwrap();
            assert_eq!(
                (
                    git.failure_reason.as_deref(),
                    git.retryable,
                    git.failed_attempts
                ),
                (Some(reason), false, 1)
            );
            let c = cond::find(&status.conditions, conditions::GIT_REVERT).unwrap();
            assert_eq!(
                (c.status.as_str(), c.reason.as_str()),
                ("False", reasons::GIT_REVERT_NOT_POSSIBLE),
                "{reason}"
            );
            assert!(
                c.message.contains(&format!("{reason} happened"))
                    && c.message.contains(
                        "not tried again until the spec changes: revert the change in Git by hand"
                    ),
                "{}",
                c.message
            );
            // A day of polls (the pin stays Pinned and keeps its 30 s safety net): no push.
            for at in (130..86_400).step_by(30) {
                let d = decide(&spec, Some(&status), &world.obs(verified()), t(at));
                assert!(pushes(&d).is_empty(), "{reason} at {at}: {:?}", d.actions);
                assert_eq!(d.status.git_revert, status.git_revert, "recorded once");
                assert_eq!(d.status.phase, BundlePinPhase::Pinned);
            }
            // The spec changes (a corrected commit or base branch): tried once more, at once.
            let mut edited = world.obs(verified());
            edited.generation = Some(2);
            let d = decide(&spec, Some(&status), &edited, t(86_400));
            assert_eq!(pushes(&d).len(), 1, "{reason}: {:?}", d.actions);
            let mut again = d.status.clone();
            fail(&mut again, reason, false, 2, 86_400);
            assert_eq!(
                again.git_revert.as_ref().unwrap().failed_attempts,
                1,
                "counted afresh for the new spec"
            );
        }
    }

    #[test]
    fn a_git_failure_that_may_pass_is_retried_with_a_growing_back_off_to_a_cap() {
        let table = [
            (1, 30),
            (2, 60),
            (3, 120),
            (4, 240),
            (6, 960),
            (7, 1800),
            (8, 1800),
            (40, 1800),
        ];
        for (attempts, secs) in table {
            assert_eq!(git_retry_after(attempts).as_secs(), secs, "{attempts}");
        }

        let spec = spec(json!({}));
        let mut world = World::new();
        let mut status = pinned_without_git(&spec, &mut world);
        let mut at = 100;
        let mut tries = Vec::new();
        // Two hours of an unreachable forge, reconciled every 10 s.
        while at < 100 + 7200 {
            let d = decide(&spec, Some(&status), &world.obs(verified()), t(at));
            if !pushes(&d).is_empty() {
                tries.push(at - 100);
                status = d.status;
                fail(&mut status, "ForgeUnavailable", true, 1, at);
                let c = cond::find(&status.conditions, conditions::GIT_REVERT).unwrap();
                assert_eq!(c.reason, reasons::GIT_REVERT_FAILED);
                let n = status.git_revert.as_ref().unwrap().failed_attempts;
                assert!(
                    c.message.contains(&format!(
                        "attempt {n} failed, tried again in {} s",
                        git_retry_after(n).as_secs()
                    )),
                    "{}",
                    c.message
                );
            } else if let Requeue::After(wait) = d.requeue {
                assert!(wait <= POLL, "{wait:?}");
            }
            at += 10;
        }
        assert_eq!(
            tries,
            vec![0, 30, 90, 210, 450, 930, 1890, 3690, 5490],
            "30 s doubling to 30 min"
        );
        // Once it passes, the branch is recorded and never asked for again.
        let d = decide(&spec, Some(&status), &world.obs(verified()), t(100 + 7290));
        let mut d = d;
        assert_eq!(pushes(&d).len(), 1);
        record_git(&mut d);
        let git = d.status.git_revert.clone().unwrap();
        assert_eq!(
            (git.failure, git.failed_attempts, git.branch.is_some()),
            (None, 0, true)
        );
        let c = cond::find(&d.status.conditions, conditions::GIT_REVERT).unwrap();
        assert_eq!(c.reason, reasons::REVERT_PUSHED);
        let next = decide(
            &spec,
            Some(&d.status),
            &world.obs(verified()),
            t(100 + 9000),
        );
        assert!(pushes(&next).is_empty());
    }

    #[test]
    fn a_base_branch_git_would_refuse_is_an_invalid_spec_naming_the_field() {
        let spec = spec(json!({"gitRevert": {"commit": "abcdef1", "baseBranch": "release..1"}}));
        let world = World::new();
        let d = decide(&spec, None, &world.obs(verified()), t(0));
        assert_eq!(d.status.phase, BundlePinPhase::Refused);
        assert_invalid_spec(
            &d,
            "spec.gitRevert.baseBranch: \"release..1\" is not a git branch name: it contains '..'",
        );
        assert!(d.actions.iter().all(|a| !a.is_effect()), "{:?}", d.actions);
    }

    #[test]
    fn git_not_configured_is_reported_and_nothing_is_pushed() {
        let spec = spec(json!({}));
        let mut world = World::new();
        let mut status: Option<BundlePinStatus> = None;
        for i in 0..6 {
            let mut obs = world.obs(verified());
            obs.git_configured = false;
            let d = decide(&spec, status.as_ref(), &obs, t(i));
            world.act(&d);
            world.sync_ends();
            status = Some(d.status);
        }
        let status = status.unwrap();
        assert_eq!(status.phase, BundlePinPhase::Pinned);
        assert_eq!(world.pushes, 0);
        let c = cond::find(&status.conditions, conditions::GIT_REVERT).unwrap();
        assert_eq!(c.reason, reasons::GIT_NOT_CONFIGURED);
    }

    #[test]
    fn a_requested_sync_not_yet_started_is_dropped_with_the_suspension() {
        let spec = spec(json!({}));
        let mut world = World::new();
        world.app.operation_phase = Some("Succeeded".into());
        world.app.operation_requested = true;
        let verifying = decide(&spec, None, &world.obs(verified()), t(0));
        let preflight = decide(&spec, Some(&verifying.status), &world.obs(verified()), t(1));
        assert!(
            preflight
                .actions
                .iter()
                .all(|a| !a.is_effect() || matches!(a, Action::Preflight { .. })),
            "nothing is touched before the preflight: {:?}",
            preflight.actions
        );
        let d = decide(&spec, Some(&preflight.status), &world.obs(verified()), t(2));
        let clear = d
            .actions
            .iter()
            .any(|a| matches!(a, Action::ClearOperation { .. }));
        assert!(clear, "{:?}", d.actions);
        assert!(
            !d.actions
                .iter()
                .any(|a| matches!(a, Action::TerminateSync { .. })),
            "nothing runs, nothing to terminate"
        );
        world.act(&d);
        assert!(!world.app.operation_requested);
        assert!(!d.status.applications[0].sync_terminated);
    }

    #[test]
    fn suspended_policy_keeps_every_other_setting() {
        let table = [
            (None, None),
            (
                Some(json!({"syncOptions": ["A"]})),
                Some(json!({"syncOptions": ["A"]})),
            ),
            (
                Some(json!({"automated": {"prune": true}, "x": 1})),
                Some(json!({"automated": {"prune": true, "enabled": false}, "x": 1})),
            ),
            (
                Some(json!({"automated": {"enabled": true, "selfHeal": true}})),
                Some(json!({"automated": {"enabled": false, "selfHeal": true}})),
            ),
        ];
        for (input, want) in table {
            assert_eq!(suspended_policy(input.as_ref()), want, "{input:?}");
        }
    }
}

#[cfg(test)]
mod validity_tests {
    use super::*;
    use sluice_api::v1alpha1::bundle_pin::conditions;

    fn t(secs: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + secs).unwrap()
    }

    fn obs(generation: i64) -> Observations {
        Observations {
            generation: Some(generation),
            ..Observations::default()
        }
    }

    fn problem() -> Vec<String> {
        vec!["spec.bundle.digest: example problem".to_owned()]
    }

    #[test]
    fn a_target_outside_the_application_namespace_is_refused() {
        let spec: BundlePinSpec = serde_json::from_value(serde_json::json!({
            "targets": [{"name": "mesh-c1"}, {"name": "mesh-c2", "namespace": "team-a"}],
            "bundle": {"repository": "oci://registry.local:5000/mesh/config", "digest": format!("sha256:{}", "c".repeat(64))},
            "publicKeysSecretRef": {"name": "cosign"},
            "reason": "5xx after change 42",
        }))
        .unwrap();
        let obs = Observations {
            generation: Some(1),
            pin: ("argocd".into(), "pin-1".into()),
            application_namespace: Some("argocd".into()),
            ..Observations::default()
        };
        let d = decide(&spec, None, &obs, t(0));
        assert_eq!(d.status.phase, BundlePinPhase::Refused);
        let ready = cond::find(&d.status.conditions, conditions::READY).unwrap();
        assert_eq!(
            (ready.status.as_str(), ready.reason.as_str()),
            ("False", reasons::INVALID_SPEC)
        );
        assert!(
            ready.message.contains(
                "spec.targets[1].namespace: revert may patch Applications only in namespace argocd"
            ),
            "{}",
            ready.message
        );
        assert!(
            !ready.message.contains("spec.targets[0]"),
            "{}",
            ready.message
        );
        assert!(
            d.actions.iter().all(|a| matches!(a, Action::Event { .. })),
            "a refused pin touches nothing: {:?}",
            d.actions
        );

        // Revert watching every namespace refuses none.
        let everywhere = Observations {
            application_namespace: None,
            ..obs
        };
        let d = decide(&spec, None, &everywhere, t(0));
        assert_ne!(d.status.phase, BundlePinPhase::Refused);
    }

    struct Row {
        name: &'static str,
        problems: Vec<String>,
        status: Option<BundlePinStatus>,
        generation: i64,
        now: i64,
        want_phase: BundlePinPhase,
        want_ready: (&'static str, &'static str),
        want_transition: i64,
        want_events: Vec<&'static str>,
    }

    fn run(row: &Row) -> Decision {
        decide_validity(
            &row.problems,
            row.status.as_ref(),
            &obs(row.generation),
            t(row.now),
        )
    }

    #[test]
    fn validity_transitions() {
        let invalid_at_0 = decide_validity(&problem(), None, &obs(1), t(0)).status;
        let valid_at_0 = decide_validity(&[], None, &obs(1), t(0)).status;
        let table = vec![
            Row {
                name: "new valid object",
                problems: vec![],
                status: None,
                generation: 1,
                now: 0,
                want_phase: BundlePinPhase::Verifying,
                want_ready: ("True", reasons::VALID),
                want_transition: 0,
                want_events: vec![reasons::VALID],
            },
            Row {
                name: "new invalid object",
                problems: problem(),
                status: None,
                generation: 1,
                now: 0,
                want_phase: BundlePinPhase::Refused,
                want_ready: ("False", reasons::INVALID_SPEC),
                want_transition: 0,
                want_events: vec![reasons::INVALID_SPEC],
            },
            Row {
                name: "identical reconcile of an invalid object",
                problems: problem(),
                status: Some(invalid_at_0.clone()),
                generation: 1,
                now: 60,
                want_phase: BundlePinPhase::Refused,
                want_ready: ("False", reasons::INVALID_SPEC),
                want_transition: 0,
                want_events: vec![],
            },
            Row {
                name: "invalid object fixed",
                problems: vec![],
                status: Some(invalid_at_0),
                generation: 2,
                now: 60,
                want_phase: BundlePinPhase::Verifying,
                want_ready: ("True", reasons::VALID),
                want_transition: 60,
                want_events: vec![reasons::VALID],
            },
            Row {
                name: "valid object, new generation, still valid",
                problems: vec![],
                status: Some(valid_at_0.clone()),
                generation: 2,
                now: 60,
                want_phase: BundlePinPhase::Verifying,
                want_ready: ("True", reasons::VALID),
                want_transition: 0,
                want_events: vec![],
            },
            Row {
                name: "valid object broken by an edit",
                problems: problem(),
                status: Some(valid_at_0),
                generation: 2,
                now: 60,
                want_phase: BundlePinPhase::Refused,
                want_ready: ("False", reasons::INVALID_SPEC),
                want_transition: 60,
                want_events: vec![reasons::INVALID_SPEC],
            },
        ];
        for row in &table {
            let d = run(row);
            let ready = cond::find(&d.status.conditions, conditions::READY)
                .unwrap_or_else(|| panic!("{}: no Ready condition", row.name));
            assert_eq!(d.status.phase, row.want_phase, "{}", row.name);
            assert_eq!(
                d.status.observed_generation,
                Some(row.generation),
                "{}",
                row.name
            );
            assert_eq!(
                ready.observed_generation,
                Some(row.generation),
                "{}",
                row.name
            );
            assert_eq!(
                (ready.status.as_str(), ready.reason.as_str()),
                row.want_ready,
                "{}",
                row.name
            );
            assert_eq!(
                ready.last_transition_time.0,
                t(row.want_transition),
                "{}",
                row.name
            );
            let events: Vec<_> = d
                .actions
                .iter()
                .filter_map(|a| match a {
                    Action::Event { reason, .. } => Some(*reason),
                    _ => None,
                })
                .collect();
            assert_eq!(events, row.want_events, "{}", row.name);
            assert_eq!(
                d.requeue,
                Requeue::AwaitChange,
                "{}: never a hot requeue",
                row.name
            );
            if row.want_ready.0 == "False" {
                assert!(
                    ready.message.contains("spec.bundle.digest"),
                    "{}: message names the field",
                    row.name
                );
            }
        }
    }

    #[test]
    fn identical_reconcile_produces_an_identical_status() {
        let first = decide_validity(&problem(), None, &obs(3), t(0));
        let second = decide_validity(&problem(), Some(&first.status), &obs(3), t(120));
        assert_eq!(
            first.status, second.status,
            "no status write on an identical reconcile"
        );
        assert!(second.actions.is_empty());
    }
}
