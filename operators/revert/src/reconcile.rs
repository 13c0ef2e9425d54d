//! The I/O side of sluice-revert: gathers what `decide` needs (the verified bundle, the target
//! Applications and their ApplicationSets, the content of the revision Argo CD reports), carries
//! out the decision's effects in order, each reporting an [`Outcome`] that the pure
//! [`record::record`] folds into the status the decision returned, then writes that status
//! (server-side apply fenced by resourceVersion), then publishes Events and audit lines.
//!
//! Owns the order of effects and what a failed effect leaves behind (a condition naming it,
//! folded by [`record::record`] into the status the pin had; the reconcile is retried with
//! back-off; every effect is idempotent). Must never decide anything, never edit a status by
//! hand, never apply a bundle that did not verify in this process, and never use Argo CD's
//! cluster credentials (destinations are reached through [`crate::clusters`]).
//!
//! The finalizer is revert's own (`set_finalizer`), not `kube::runtime::finalizer`, which adds it
//! to every object at once and removes it only on deletion, after one cleanup call: a pin takes it
//! lazily, before its first effect on an Application, and lets it go only once the pin is over
//! (deleted or not), having restored what it holds, which a release does over several reconciles.

use std::{
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use k8s_openapi::{api::core::v1::ConfigMap, jiff::Timestamp};
use kube::{
    Api, Client, ResourceExt,
    api::{Patch, PatchParams},
    runtime::controller::Action as ControllerAction,
};
use serde_json::{Value, json};
use sluice_api::{
    external::argocd::{Application, ApplicationSet},
    v1alpha1::{
        BundlePin, BundlePinPhase, BundlePinSpec, BundlePinStatus,
        bundle_pin::{GitRevertStatus, conditions, reasons},
    },
};
use sluice_bundle::{BundleRef, ByteLru, RegistryOptions, VerifiedObjects};
use sluice_gitops::{ForgeClient, GitConfig, PullRequestRequest, RevertBranch};
use sluice_runtime::{
    Categorized, Category, conditions as cond,
    error::ReconcileFailure,
    events::{EventRecorder, Severity},
    leader::Leadership,
    write,
};

use crate::{
    FIELD_MANAGER,
    apply::{self, Kinds},
    clusters::Clusters,
    decide::{
        self, Action, AppKey, AppObservation, AppView, EventAction, ObjectKey, Observations,
        OwningApplicationSet,
    },
    metrics::RevertMetrics,
    record::{self, GitOutcome, Outcome},
    registry::Registries,
    tracking::{self, Tracking},
    verify::Verifier,
};

/// How revert reaches registries, git and the forge, and where its cluster identities live.
#[derive(Debug, Clone, Default)]
pub struct Settings {
    /// Namespace of the per-cluster identity Secrets (the operator's namespace).
    pub cluster_namespace: String,
    /// Registry options (plain-HTTP hosts, CA, allowlist).
    pub registry: RegistryOptions,
    /// The Docker config Secret (`namespace`, `name`) holding registry credentials
    /// (`--registry-credentials-secret`), read on every registry use; `None`: anonymous.
    pub registry_credentials: Option<(String, String)>,
    /// The ConfigMap (`namespace`, `name`) whose `ca.crt` registries' TLS is trusted with
    /// (`--registry-ca-configmap`), read on every registry use; `None`: the system roots and
    /// `registry.ca_bundle`.
    pub registry_ca_config_map: Option<(String, String)>,
    /// The intent repository, when git reverts are enabled.
    pub git: Option<GitConfig>,
    /// The forge, when pull requests are enabled.
    pub forge: Option<sluice_gitops::ForgeConfig>,
    /// The kinds any pin may apply (`--allowed-kinds`); `None`: the default mesh kinds.
    pub allowed_kinds: Option<Vec<sluice_api::v1alpha1::bundle_pin::GroupKind>>,
    /// How long after a pin's creation a missing signature is retried
    /// (`--signature-grace-seconds`); `None`: [`decide::SIGNATURE_GRACE`].
    pub signature_grace: Option<Duration>,
    /// Most bytes the cache of verified bundles holds (`--verified-cache-bytes`); `None`:
    /// [`DEFAULT_VERIFIED_CACHE_BYTES`]. The least recently used bundle is evicted first and
    /// pulled and verified again when a pin needs it.
    pub verified_cache_bytes: Option<u64>,
    /// The one namespace revert may patch Applications in (its `--namespace`, where the chart
    /// grants its Role): a pin naming an Application elsewhere is refused (`InvalidSpec`)
    /// instead of retrying forbidden requests. `None`: every namespace.
    pub application_namespace: Option<String>,
    /// sigstore `trusted_root.json` for keyless signatures (`--trusted-root`), read at each
    /// verification of a pin with `spec.keyless` (so a rotated root is used without a restart);
    /// `None`: keyless signatures are refused.
    pub trusted_root: Option<std::path::PathBuf>,
}

pub use crate::verify::DEFAULT_VERIFIED_CACHE_BYTES;

/// Bound of the cache of revision content digests (small entries).
const CONTENTS_CACHE_BYTES: u64 = 1 << 20;

/// What every reconcile shares.
pub struct Context {
    /// The Kubernetes client (management cluster).
    pub client: Client,
    /// The operator's Event recorder.
    pub recorder: EventRecorder,
    /// The clock; tests pin it.
    pub clock: fn() -> Timestamp,
    /// revert's metrics.
    pub metrics: RevertMetrics,
    /// Webhook notifications of pins and releases (`main` shares the runtime's).
    pub notifier: sluice_runtime::notify::Notifier,
    /// Whether this replica leads: checked right before every effect (Application patches,
    /// remote applies and prunes, git pushes).
    pub leadership: Leadership,
    bundles: Registries,
    verifier: Verifier,
    contents: Mutex<ByteLru<String>>,
    clusters: Clusters,
    kinds: Kinds,
    git: Option<GitConfig>,
    forge: Option<ForgeClient>,
    signature_grace: Duration,
    application_namespace: Option<String>,
}

sluice_runtime::opaque_debug!(Context);

impl Context {
    /// A context reading the system clock.
    pub fn new(
        client: Client,
        recorder: EventRecorder,
        settings: Settings,
        metrics: RevertMetrics,
    ) -> Result<Self, ReconcileError> {
        let forge = settings
            .forge
            .map(ForgeClient::new)
            .transpose()
            .map_err(|e| ReconcileError::Config(e.to_string()))?;
        let bundles = Registries::new(
            client.clone(),
            settings.registry,
            settings.registry_credentials,
        )
        .with_ca_config_map(settings.registry_ca_config_map);
        Ok(Self {
            clusters: Clusters::new(client.clone(), settings.cluster_namespace),
            client,
            recorder,
            clock: Timestamp::now,
            metrics,
            notifier: sluice_runtime::notify::Notifier::disabled(),
            bundles,
            leadership: Leadership::always(),
            verifier: Verifier::new(
                settings
                    .verified_cache_bytes
                    .unwrap_or(DEFAULT_VERIFIED_CACHE_BYTES),
                settings.allowed_kinds,
                settings.trusted_root,
            ),
            contents: Mutex::new(ByteLru::new(CONTENTS_CACHE_BYTES)),
            kinds: Kinds::default(),
            git: settings.git,
            forge,
            signature_grace: settings.signature_grace.unwrap_or(decide::SIGNATURE_GRACE),
            application_namespace: settings.application_namespace,
        })
    }
}

/// A reconcile that did not complete; retried with back-off.
#[derive(Debug, thiserror::Error)]
pub enum ReconcileError {
    /// Leadership lost before a side effect, the BundlePin without a namespace, or its status
    /// write failed.
    #[error(transparent)]
    Failure(ReconcileFailure),
    /// Reading an object the decision needs failed.
    #[error("reading {what}: {source}")]
    Read {
        /// What was read.
        what: String,
        /// The API error.
        source: kube::Error,
    },
    /// An effect failed; the status carries a condition naming it.
    #[error("{0}")]
    Effect(String, Category),
    /// A pinned object still differs from the bundle after the restore; the status carries a
    /// condition (`Pinned=False NotRestored`) naming the fields.
    #[error("{0}")]
    NotRestored(String),
    /// The preflight (identity, kinds, dry-run of every write) failed before any Application
    /// was suspended; the status carries `Pinned=False PreflightFailed`.
    #[error("preflight before suspending anything: {0}")]
    Preflight(String),
    /// The operator's configuration is unusable.
    #[error("configuration: {0}")]
    Config(String),
    /// An effect failed with the pin's deadline `left` away: retried no later than the
    /// deadline, whatever the back-off, so a pin that cannot apply gives automation back on
    /// time.
    #[error("{error}")]
    BeforeDeadline {
        /// The effect's failure.
        error: Box<ReconcileError>,
        /// Time left until the pin's deadline.
        left: Duration,
    },
}

sluice_runtime::reconcile_failures!(ReconcileError::Failure, status of BundlePin);

impl Categorized for ReconcileError {
    fn category(&self) -> Category {
        match self {
            ReconcileError::Failure(e) => e.category(),
            ReconcileError::Read { source, .. } => Category::of_kube(source),
            ReconcileError::Effect(_, c) => *c,
            ReconcileError::NotRestored(_) => Category::Conflict,
            ReconcileError::Preflight(_) => Category::Rejected,
            ReconcileError::Config(_) => Category::Config,
            ReconcileError::BeforeDeadline { error, .. } => error.category(),
        }
    }

    fn retry_within(&self) -> Option<Duration> {
        match self {
            ReconcileError::BeforeDeadline { left, .. } => Some(*left),
            _ => None,
        }
    }
}

/// A failed effect of a pin whose deadline is `left` away, retried no later than the deadline
/// (at least [`decide::SHORT`] from now, so a pin past it is not retried in a tight loop).
fn before_deadline(error: ReconcileError, left: Option<Duration>) -> ReconcileError {
    match left {
        Some(left) => ReconcileError::BeforeDeadline {
            error: Box::new(error),
            left: left.max(decide::SHORT),
        },
        None => error,
    }
}

impl Context {
    /// The content digest of an OCI revision (cached: a digest names immutable content).
    async fn revision_content(&self, repo_url: &str, revision: &str) -> Option<String> {
        let reference = BundleRef::from_oci_source(repo_url, revision)
            .ok()?
            .digest_ref()
            .ok()?;
        if let Some(c) = self.contents.lock().expect("cache lock").get(&reference) {
            return Some(c.as_ref().clone());
        }
        match self.bundles.pull(&reference).await {
            Ok(artifact) => {
                let c = artifact.content_digest().to_owned();
                let bytes = (reference.len() + c.len() + 64) as u64;
                self.contents.lock().expect("cache lock").insert(
                    reference,
                    Arc::new(c.clone()),
                    bytes,
                );
                Some(c)
            }
            Err(e) => {
                tracing::warn!(error = %e, revision, "cannot read the content of the revision Argo CD reports; release waits");
                None
            }
        }
    }

    async fn observe_app(
        &self,
        namespace: &str,
        name: &str,
        want_content: bool,
    ) -> Result<Option<AppView>, ReconcileError> {
        let api: Api<Application> = Api::namespaced(self.client.clone(), namespace);
        let Some(app) = api
            .get_opt(name)
            .await
            .map_err(|source| ReconcileError::Read {
                what: format!("Application {namespace}/{name}"),
                source,
            })?
        else {
            return Ok(None);
        };
        let mut application_set = None;
        for owner in app.owner_references() {
            if owner.kind != "ApplicationSet" {
                continue;
            }
            let sets: Api<ApplicationSet> = Api::namespaced(self.client.clone(), namespace);
            let set = sets
                .get_opt(&owner.name)
                .await
                .map_err(|source| ReconcileError::Read {
                    what: format!("ApplicationSet {namespace}/{}", owner.name),
                    source,
                })?;
            if let Some(set) = set {
                application_set = Some(OwningApplicationSet {
                    name: owner.name.clone(),
                    covers_sync_policy: set.ignores_sync_policy(name),
                });
            }
        }
        let status = app.status.clone().unwrap_or_default();
        let sync = status.sync.clone().unwrap_or_default();
        let revision = sync.revision.clone();
        let revision_content = match (&revision, want_content, app.sources().first()) {
            (Some(rev), true, Some(source)) if source.is_oci() => {
                self.revision_content(&source.repo_url, rev).await
            }
            _ => None,
        };
        let destination = app.spec.destination.clone().unwrap_or_default();
        let history: Vec<String> = status
            .extra
            .get("history")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(|h| h.get("revision").and_then(Value::as_str))
            .map(str::to_owned)
            .collect();
        let project = app.spec.project.clone().unwrap_or_else(|| "default".into());
        let project_destinations = self.project_destinations(namespace, &project).await;
        Ok(Some(AppView {
            repo_url: app.sources().first().map(|s| s.repo_url.clone()),
            multi_source: app.spec.sources.as_ref().is_some_and(|s| s.len() > 1),
            history,
            destination_name_server: (
                destination.name.clone().unwrap_or_default(),
                destination.server.clone().unwrap_or_default(),
            ),
            project_destinations,
            oci_sourced: app.is_oci_sourced(),
            application_set,
            sync_policy: app
                .spec
                .sync_policy
                .as_ref()
                .map(|p| serde_json::to_value(p).unwrap_or(Value::Null)),
            automated: app
                .spec
                .sync_policy
                .as_ref()
                .is_some_and(|p| p.is_automated()),
            operation_phase: status
                .operation_state
                .as_ref()
                .and_then(|o| o.phase.clone()),
            operation_requested: app.operation.is_some(),
            sync_status: sync.status.clone(),
            revision,
            revision_content,
            destination: destination.name.clone().or(destination.server.clone()),
            destination_namespace: destination.namespace.clone(),
            out_of_sync_only_by_pruning: sync.status.as_deref() == Some("OutOfSync")
                && status.resources.as_deref().is_some_and(|rs| {
                    let prune = |r: &sluice_api::external::argocd::ResourceStatus| {
                        r.extra.get("requiresPruning").and_then(Value::as_bool) == Some(true)
                    };
                    rs.iter().any(prune)
                        && rs
                            .iter()
                            .all(|r| r.status.as_deref() == Some("Synced") || prune(r))
                }),
            tracked: status
                .resources
                .unwrap_or_default()
                .into_iter()
                .map(|r| ObjectKey {
                    group: r.group.unwrap_or_default(),
                    kind: r.kind.unwrap_or_default(),
                    namespace: r.namespace.unwrap_or_default(),
                    name: r.name.unwrap_or_default(),
                    version: r.version.unwrap_or_default(),
                })
                .collect(),
        }))
    }

    async fn patch_app(&self, app: &AppKey, patch: Patch<Value>) -> Result<(), ReconcileError> {
        let api: Api<Application> = Api::namespaced(self.client.clone(), &app.namespace);
        api.patch(
            &app.name,
            &PatchParams {
                field_manager: Some(FIELD_MANAGER.as_str().to_owned()),
                ..PatchParams::default()
            },
            &patch,
        )
        .await
        .map(|_| ())
        .map_err(|e| {
            let c = Category::of_kube(&e);
            ReconcileError::Effect(
                format!("patching Application {}/{}: {e}", app.namespace, app.name),
                c,
            )
        })
    }

    /// The destinations of AppProject `namespace/name`; `None` when it cannot be read (absent,
    /// or revert may not read it): the namespace check then covers the Application's own
    /// namespaces only (logged).
    async fn project_destinations(
        &self,
        namespace: &str,
        name: &str,
    ) -> Option<Vec<crate::binding::ProjectDestination>> {
        let ar = kube::core::ApiResource::from_gvk_with_plural(
            &kube::core::GroupVersionKind::gvk("argoproj.io", "v1alpha1", "AppProject"),
            "appprojects",
        );
        let api: Api<kube::core::DynamicObject> =
            Api::namespaced_with(self.client.clone(), namespace, &ar);
        let project = match api.get_opt(name).await {
            Ok(p) => p?,
            Err(e) => {
                tracing::warn!(error = %e, project = name, "cannot read the AppProject; its destinations are not checked");
                return None;
            }
        };
        Some(
            project
                .data
                .pointer("/spec/destinations")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .map(|d| {
                    let f = |k: &str| {
                        d.get(k)
                            .and_then(Value::as_str)
                            .unwrap_or_default()
                            .to_owned()
                    };
                    crate::binding::ProjectDestination {
                        server: f("server"),
                        name: f("name"),
                        namespace: f("namespace"),
                    }
                })
                .collect(),
        )
    }

    /// Argo CD's tracking settings, from `argocd-cm` beside the pin (Argo CD's namespace);
    /// Argo CD's defaults when it is absent or unreadable (logged).
    async fn tracking(&self, pin: &BundlePin) -> Tracking {
        let ns = pin.namespace().unwrap_or_default();
        let maps: Api<ConfigMap> = Api::namespaced(self.client.clone(), &ns);
        let data = match maps.get_opt(tracking::ARGOCD_CM).await {
            Ok(cm) => cm.and_then(|c| c.data),
            Err(e) => {
                tracing::warn!(error = %e, namespace = ns, "cannot read argocd-cm; annotation tracking (Argo CD's default) is assumed");
                None
            }
        };
        Tracking::from_config(data.as_ref(), &ns)
    }

    /// Carries out one effect of the decision whose status is `status`; returns what the
    /// status must record of it, if anything (folded in by [`record::record`]).
    async fn effect(
        &self,
        action: &Action,
        pin: &BundlePin,
        bundle: Option<&VerifiedObjects>,
        status: &BundlePinStatus,
        now: Timestamp,
    ) -> Result<Option<Outcome>, ReconcileError> {
        let need_bundle = || {
            bundle.ok_or_else(|| {
                ReconcileError::Effect(
                    "the bundle is not verified in this process; retrying".into(),
                    Category::Internal,
                )
            })
        };
        let dest_err = |e: String, c: Category| ReconcileError::Effect(e, c);
        if !matches!(action, Action::Event(_) | Action::Audit { .. }) {
            // Right before the side effect: a deposed leader neither patches, applies, prunes
            // nor pushes (and a reconcile in flight is dropped, killing its git, on the loss).
            self.leadership.ensure()?;
        }
        match action {
            Action::Event(_) | Action::Audit { .. } => {}
            Action::TerminateSync { app } => {
                self.patch_app(
                    app,
                    Patch::Merge(json!({"status": {"operationState": {"phase": "Terminating"}}})),
                )
                .await?;
                tracing::info!(application = %format!("{}/{}", app.namespace, app.name), "terminating the running sync");
            }
            Action::SetAutomation { app, enabled } => {
                let op = match enabled {
                    Some(b) => {
                        json!([{"op": "add", "path": "/spec/syncPolicy/automated/enabled", "value": b}])
                    }
                    None => json!([{"op": "remove", "path": "/spec/syncPolicy/automated/enabled"}]),
                };
                let patch = Patch::Json(serde_json::from_value(op).expect("a JSON patch"));
                match self.patch_app(app, patch).await {
                    // Nothing to remove (already absent, or automation itself removed meanwhile).
                    Err(ReconcileError::Effect(_, Category::Rejected)) if enabled.is_none() => {}
                    other => other?,
                }
                tracing::info!(application = %format!("{}/{}", app.namespace, app.name), enabled = ?enabled, "automated sync set");
            }
            Action::ClearOperation { app } => {
                self.patch_app(app, Patch::Merge(json!({"operation": null})))
                    .await?;
            }
            Action::Preflight {
                app,
                destination,
                default_namespace,
                prune,
            } => {
                let bundle = need_bundle()?;
                let client = self
                    .clusters
                    .client(destination)
                    .await
                    .map_err(|e| ReconcileError::Preflight(format!("{e}")))?;
                let tracking = self.tracking(pin).await;
                apply::preflight(
                    &self.kinds,
                    &client,
                    destination,
                    bundle.objects(),
                    default_namespace.as_deref(),
                    prune,
                    FIELD_MANAGER.as_str(),
                    Some(apply::Track {
                        tracking: &tracking,
                        app,
                    }),
                )
                .await
                .map_err(|e| ReconcileError::Preflight(e.to_string()))?;
                tracing::info!(application = %format!("{}/{}", app.namespace, app.name), destination, "preflight passed: identity, kinds and a dry-run of every write");
            }
            Action::Apply {
                app,
                destination,
                default_namespace,
                prune,
            } => {
                let bundle = need_bundle()?;
                let client = self
                    .clusters
                    .client(destination)
                    .await
                    .map_err(|e| dest_err(e.to_string(), Category::Config))?;
                let started = Instant::now();
                let tracking = self.tracking(pin).await;
                // One bound around the whole apply and prune (each request has its own): the
                // reconcile returns by the pin's deadline, so the next decision can give
                // automation back on time however many objects are still in flight.
                let budget = crate::decide::apply_budget(&pin.spec, status, now);
                let work = async {
                    let applied = apply::apply_objects(
                        &self.kinds,
                        &client,
                        destination,
                        bundle.objects(),
                        default_namespace.as_deref(),
                        FIELD_MANAGER.as_str(),
                        Some(apply::Track {
                            tracking: &tracking,
                            app,
                        }),
                    )
                    .await
                    .map_err(|e| match e {
                        apply::ApplyError::NotRestored { .. } => {
                            ReconcileError::NotRestored(e.to_string())
                        }
                        e => dest_err(e.to_string(), e.category()),
                    })?;
                    let pruned = apply::prune_objects(&self.kinds, &client, destination, prune)
                        .await
                        .map_err(|e| dest_err(e.to_string(), e.category()))?;
                    Ok::<_, ReconcileError>((applied, pruned))
                };
                let (applied, pruned) = tokio::time::timeout(budget, work).await.map_err(|_| {
                    dest_err(
                        format!(
                            "applying and pruning the bundle in destination {destination} did not finish within {} s (the time left before spec.pinDeadlineSeconds, at most {} s); the writes in flight were abandoned, and at the deadline every suspended Application gets its automation back",
                            budget.as_secs(),
                            crate::decide::MAX_APPLY.as_secs()
                        ),
                        Category::ApiUnavailable,
                    )
                })??;
                self.metrics.objects_applied.inc_by(applied.objects as u64);
                self.metrics
                    .fields_removed
                    .inc_by(applied.removed_fields as u64);
                self.metrics.objects_pruned.inc_by(pruned as u64);
                tracing::info!(
                    application = %format!("{}/{}", app.namespace, app.name),
                    destination,
                    applied = applied.objects,
                    removed_fields = applied.removed_fields,
                    pruned,
                    apply_ms = started.elapsed().as_millis() as u64,
                    "bundle applied"
                );
            }
            Action::DropOwnership {
                app,
                destination,
                default_namespace,
            } => {
                let objects: Vec<ObjectKey> = status
                    .objects
                    .iter()
                    .map(|o| ObjectKey {
                        group: o.group.clone(),
                        kind: o.kind.clone(),
                        namespace: o.namespace.clone(),
                        name: o.name.clone(),
                        version: o.version.clone(),
                    })
                    .collect();
                let client = self
                    .clusters
                    .client(destination)
                    .await
                    .map_err(|e| dest_err(e.to_string(), Category::Config))?;
                let dropped = apply::drop_ownership(
                    &self.kinds,
                    &client,
                    destination,
                    &objects,
                    default_namespace.as_deref(),
                    FIELD_MANAGER.as_str(),
                )
                .await
                .map_err(|e| dest_err(e.to_string(), e.category()))?;
                tracing::info!(application = %format!("{}/{}", app.namespace, app.name), destination, dropped, "field ownership dropped");
            }
            Action::PushRevert {
                commit,
                base,
                branch,
                message,
                pull_request,
                owner,
            } => {
                // Not fatal: the pin holds either way; the decision says when to ask again.
                let result = match self
                    .push_revert(commit, base, branch, message, *pull_request, owner, pin)
                    .await
                {
                    Ok((git, created)) => {
                        self.metrics
                            .git_reverts
                            .get_or_create(&crate::metrics::ResultLabels {
                                result: if created { "pushed" } else { "existing" }.into(),
                            })
                            .inc();
                        GitOutcome::Pushed(git)
                    }
                    Err(err) => {
                        let (reason, message, retryable) = match err {
                            PushError::Gitops(e) => (e.category(), e.to_string(), e.is_transient()),
                            PushError::NotConfigured => (
                                reasons::GIT_NOT_CONFIGURED,
                                "no intent repository configured (--git-url)".to_owned(),
                                false,
                            ),
                        };
                        self.metrics
                            .git_reverts
                            .get_or_create(&crate::metrics::ResultLabels {
                                result: reason.into(),
                            })
                            .inc();
                        tracing::warn!(error = %message, reason, retryable, "git revert failed");
                        GitOutcome::Failed {
                            reason,
                            message,
                            retryable,
                        }
                    }
                };
                return Ok(Some(Outcome::GitRevert {
                    result,
                    generation: pin.metadata.generation,
                    at: now,
                }));
            }
        }
        Ok(None)
    }

    #[allow(clippy::too_many_arguments)]
    async fn push_revert(
        &self,
        commit: &str,
        base: &str,
        branch: &str,
        message: &str,
        pull_request: bool,
        owner: &str,
        pin: &BundlePin,
    ) -> Result<(GitRevertStatus, bool), PushError> {
        let git = self.git.as_ref().ok_or(PushError::NotConfigured)?;
        let pushed = RevertBranch {
            commit: commit.into(),
            base: base.into(),
            branch: branch.into(),
            message: message.into(),
            owner: (!owner.is_empty()).then(|| owner.to_owned()),
        }
        .push(git)
        .await
        .map_err(PushError::Gitops)?;
        let mut status = GitRevertStatus {
            branch: Some(pushed.branch.clone()),
            commit: Some(pushed.commit.clone()),
            ..GitRevertStatus::default()
        };
        if pull_request && let Some(forge) = &self.forge {
            let title = message.lines().next().unwrap_or(message).to_owned();
            let pr = forge
                .open_pull_request(&PullRequestRequest {
                    head: branch.into(),
                    base: base.into(),
                    title,
                    body: format!(
                        "{message}\n\nOpened by sluice-revert for BundlePin {}/{} (reason: {}).",
                        pin.namespace().unwrap_or_default(),
                        pin.name_any(),
                        pin.spec.reason
                    ),
                })
                .await
                .map_err(PushError::Gitops)?;
            status.pull_request_url = Some(pr.url);
        }
        Ok((status, pushed.created))
    }
}

/// Why the git revert could not be pushed.
enum PushError {
    /// No intent repository is configured.
    NotConfigured,
    /// Git or the forge failed.
    Gitops(sluice_gitops::GitopsError),
}

/// Adds or removes [`crate::FINALIZER`] (JSON patch with a `test` of the list read, so a
/// concurrent finalizer edit fails the write instead of being lost).
async fn set_finalizer(
    api: &Api<BundlePin>,
    obj: &BundlePin,
    present: bool,
) -> Result<(), ReconcileError> {
    let current: Vec<String> = obj.finalizers().to_vec();
    let mut next: Vec<String> = current
        .iter()
        .filter(|f| *f != crate::FINALIZER)
        .cloned()
        .collect();
    if present {
        next.push(crate::FINALIZER.to_owned());
    }
    if next == current {
        return Ok(());
    }
    let ops = if obj.metadata.finalizers.is_some() {
        json!([
            {"op": "test", "path": "/metadata/finalizers", "value": current},
            {"op": "replace", "path": "/metadata/finalizers", "value": next},
        ])
    } else {
        json!([{"op": "add", "path": "/metadata/finalizers", "value": next}])
    };
    match api
        .patch(
            &obj.name_any(),
            &PatchParams {
                field_manager: Some(FIELD_MANAGER.as_str().to_owned()),
                ..PatchParams::default()
            },
            &Patch::<()>::Json(serde_json::from_value(ops).expect("a JSON patch")),
        )
        .await
    {
        Ok(_) => Ok(()),
        // Already gone: nothing left to hold.
        Err(kube::Error::Api(s)) if s.code == 404 && !present => Ok(()),
        Err(source) => Err(ReconcileError::Read {
            what: format!("finalizer of BundlePin {}", obj.name_any()),
            source,
        }),
    }
}

/// Who or what created a pin: its controlling owner (`WaveGate/<name>`), else the field
/// manager that wrote its spec first (by managedFields time).
pub fn created_by(pin: &BundlePin) -> Option<String> {
    if let Some(owner) = pin.owner_references().first() {
        return Some(format!("{}/{}", owner.kind, owner.name));
    }
    pin.metadata
        .managed_fields
        .iter()
        .flatten()
        .filter(|m| m.subresource.as_deref().is_none_or(str::is_empty))
        .min_by_key(|m| m.time.as_ref().map(|t| t.0))
        .and_then(|m| m.manager.clone())
}

/// The other BundlePins of the namespace that are not over.
async fn other_pins(
    api: &Api<BundlePin>,
    name: &str,
    ns: &str,
) -> Result<Vec<decide::OtherPin>, ReconcileError> {
    let list = api
        .list(&Default::default())
        .await
        .map_err(|source| ReconcileError::Read {
            what: format!("BundlePins in {ns}"),
            source,
        })?;
    Ok(list
        .items
        .into_iter()
        .filter(|p| p.name_any() != name)
        .filter(|p| {
            !decide::is_over(p.status.as_ref())
                && p.status
                    .as_ref()
                    .is_none_or(|s| s.phase != BundlePinPhase::Refused)
        })
        .map(|p| {
            let status = p.status.clone().unwrap_or_default();
            decide::OtherPin {
                name: p.name_any(),
                supersedes: p.spec.supersedes.clone(),
                targets: decide::targets_to_observe(&p.spec, p.status.as_ref(), ns),
                verified: status.to_digest.is_some() && !status.applications.is_empty(),
                applications: status.applications,
            }
        })
        .collect())
}

/// Reconciles one BundlePin.
#[tracing::instrument(skip_all, fields(kind = "BundlePin", namespace = obj.namespace().unwrap_or_default(), name = obj.name_any()))]
pub async fn reconcile(
    obj: Arc<BundlePin>,
    ctx: Arc<Context>,
) -> Result<ControllerAction, ReconcileError> {
    let ns = ReconcileFailure::namespace_of(obj.as_ref())?;
    let name = obj.name_any();
    let api: Api<BundlePin> = Api::namespaced(ctx.client.clone(), &ns);
    let status = obj.status.as_ref();
    let phase_before = status.map(|s| s.phase).unwrap_or_default();
    // A Failed pin that still holds Applications suspended is not over: its release (explicit or
    // by deletion) restores them.
    let terminal = decide::is_over(status);
    // A deleted pin releases like an explicit release (sync restored, ownership dropped), then
    // lets go of its finalizer.
    let deleting = obj.metadata.deletion_timestamp.is_some();
    let has_finalizer = obj.finalizers().iter().any(|f| f == crate::FINALIZER);
    if deleting && (terminal || !has_finalizer) {
        if has_finalizer {
            set_finalizer(&api, &obj, false).await?;
        }
        return Ok(ControllerAction::await_change());
    }
    let spec = if deleting {
        let mut spec = obj.spec.clone();
        spec.release = true;
        spec.release_reason = Some("the BundlePin was deleted".into());
        spec
    } else {
        obj.spec.clone()
    };

    // Observe: once verified, the recorded bundle and Applications, never a changed spec's.
    let (verification, bundle) = if !terminal && !spec.release && decide::needs_verification(status)
    {
        let verify_spec = BundlePinSpec {
            bundle: decide::bundle_to_verify(&spec, status),
            ..spec.clone()
        };
        let (v, b) = ctx
            .verifier
            .verify(&ctx.client, &ctx.bundles, &verify_spec, &ns)
            .await;
        (Some(v), b)
    } else {
        (None, None)
    };
    let want_content = decide::needs_revision_content(&spec, status);
    let mut applications = Vec::new();
    if !terminal {
        for t in decide::targets_to_observe(&spec, status, &ns) {
            // An Application out of revert's reach is not read by a pin that has touched
            // nothing yet (the request would be forbidden on every retry); decide refuses the
            // pin for it.
            let reachable = !matches!(
                phase_before,
                BundlePinPhase::Verifying | BundlePinPhase::Refused
            ) || ctx
                .application_namespace
                .as_deref()
                .is_none_or(|allowed| allowed == t.namespace);
            let view = if reachable {
                ctx.observe_app(&t.namespace, &t.name, want_content).await?
            } else {
                None
            };
            applications.push(AppObservation {
                namespace: t.namespace,
                name: t.name,
                view,
            });
        }
    }
    let other_pins = if terminal {
        Vec::new()
    } else {
        other_pins(&api, &name, &ns).await?
    };
    let obs = Observations {
        generation: obj.metadata.generation,
        pin: (ns.clone(), name.clone()),
        uid: obj.metadata.uid.clone().unwrap_or_default(),
        verification,
        applications,
        git_configured: ctx.git.is_some(),
        other_pins,
        platform_kinds: ctx.verifier.platform_kinds(),
        created_at: obj.metadata.creation_timestamp.as_ref().map(|t| t.0),
        created_by: created_by(&obj),
        signature_grace: ctx.signature_grace,
        application_namespace: ctx.application_namespace.clone(),
    };
    let now = (ctx.clock)();
    let mut decision = decide::decide(&spec, status, &obs, now);

    // Before the first effect on an Application, the finalizer that restores it if the pin is
    // deleted.
    // The write changes the resourceVersion this decision was made from, so the next reconcile
    // (from the new version) carries out the effects.
    if !deleting && !has_finalizer && decision.actions.iter().any(Action::is_effect) {
        set_finalizer(&api, &obj, true).await?;
        return Ok(ControllerAction::requeue(Duration::ZERO));
    }

    // Act: effects first, in order, what each reports folded into the decided status as it
    // comes; a failure is recorded on the current status and retried.
    for action in decision.actions.iter().filter(|a| a.is_effect()) {
        let err = match ctx
            .effect(action, &obj, bundle.as_deref(), &decision.status, now)
            .await
        {
            Ok(outcome) => {
                if let Some(outcome) = outcome {
                    record::record(&mut decision.status, &outcome);
                }
                continue;
            }
            Err(err) => err,
        };
        let mut failed = obj.status.clone().unwrap_or_default();
        let message = err.to_string();
        let reason = match err {
            ReconcileError::NotRestored(_) => reasons::NOT_RESTORED,
            ReconcileError::Preflight(_) => reasons::PREFLIGHT_FAILED,
            _ => reasons::APPLY_FAILED,
        };
        let changed = record::record(
            &mut failed,
            &Outcome::EffectFailed {
                reason,
                message: message.clone(),
                generation: obj.metadata.generation,
                at: now,
            },
        );
        if changed {
            write::apply_status(&api, FIELD_MANAGER, obj.as_ref(), &failed).await?;
            ctx.recorder
                .publish(
                    obj.as_ref(),
                    Severity::Warning,
                    reason,
                    EventAction::Pin.into(),
                    &message,
                )
                .await;
        }
        tracing::warn!(error = %message, "effect failed; retrying with back-off");
        return Err(before_deadline(
            err,
            decide::deadline_left(&spec, &decision.status, now),
        ));
    }

    // Write the status.
    if obj.status.as_ref() != Some(&decision.status) {
        write::apply_status(&api, FIELD_MANAGER, obj.as_ref(), &decision.status).await?;
        tracing::info!(phase = ?decision.status.phase, "status written");
        if let Some(n) = crate::notice::notice(obj.status.as_ref(), &decision.status) {
            ctx.notifier.notify(obj.as_ref(), n);
        }
    }
    let seen = status.map_or(0, |s| s.history.len());
    if decision.status.history.len() != seen
        && let Some(entry) = decision.status.history.last()
    {
        tracing::info!(
            audit = true,
            phase = ?entry.phase,
            reason = %entry.reason,
            from_digest = entry.from_digest.as_deref().unwrap_or_default(),
            to_digest = entry.to_digest.as_deref().unwrap_or_default(),
            created_by = entry.created_by.as_deref().unwrap_or_default(),
            "{}",
            entry.message.as_deref().unwrap_or_default()
        );
    }
    // A Failed pin that still holds Applications keeps its finalizer: deleting it then gives
    // them back.
    let done = decide::is_over(Some(&decision.status));
    if done && (has_finalizer || deleting) {
        set_finalizer(&api, &obj, false).await?;
    }

    // Tell.
    let phase = decision.status.phase;
    if phase != phase_before {
        let created = obj.metadata.creation_timestamp.as_ref().map(|t| t.0);
        match phase {
            BundlePinPhase::Pinned => {
                if let Some(created) = created {
                    let secs = now.duration_since(created).as_secs_f64().max(0.0);
                    ctx.metrics.pin_duration_seconds.observe(secs);
                    tracing::info!(pin_ms = (secs * 1000.0) as u64, "pin in force");
                }
            }
            BundlePinPhase::Refused => {
                let reason = cond::find(&decision.status.conditions, conditions::VERIFIED)
                    .or_else(|| cond::find(&decision.status.conditions, conditions::READY))
                    .map(|c| c.reason.clone())
                    .unwrap_or_default();
                ctx.metrics
                    .refusals
                    .get_or_create(&crate::metrics::ReasonLabels { reason })
                    .inc();
            }
            BundlePinPhase::Released => {
                let reason = cond::find(&decision.status.conditions, conditions::RELEASED)
                    .map(|c| c.reason.clone())
                    .unwrap_or_default();
                ctx.metrics
                    .releases
                    .get_or_create(&crate::metrics::ReasonLabels { reason })
                    .inc();
            }
            _ => {}
        }
    }
    for action in &decision.actions {
        match action {
            Action::Event(notice) => ctx.recorder.announce(obj.as_ref(), notice).await,
            Action::Audit {
                reason,
                from_digest,
                to_digest,
                note,
            } => {
                tracing::info!(
                    audit = true,
                    reason,
                    from_digest = from_digest.as_deref().unwrap_or_default(),
                    to_digest = to_digest.as_deref().unwrap_or_default(),
                    pin_reason = %obj.spec.reason,
                    "{note}"
                );
                ctx.recorder
                    .publish(
                        obj.as_ref(),
                        Severity::Normal,
                        reason,
                        if *reason == reasons::ALL_PINNED {
                            EventAction::Pin
                        } else {
                            EventAction::Release
                        }
                        .into(),
                        note,
                    )
                    .await
            }
            _ => {}
        }
    }
    Ok(decision.requeue.action(Duration::ZERO, Duration::ZERO))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failed_effect_is_retried_by_the_pins_deadline() {
        let s = Duration::from_secs;
        let late = before_deadline(ReconcileError::Preflight("no identity".into()), Some(s(4)));
        assert_eq!(late.retry_within(), Some(s(4)));
        assert_eq!(late.category(), Category::Rejected, "the effect's category");
        assert_eq!(
            late.to_string(),
            "preflight before suspending anything: no identity",
            "the effect's message"
        );
        let past = before_deadline(ReconcileError::Preflight("x".into()), Some(Duration::ZERO));
        assert_eq!(
            past.retry_within(),
            Some(decide::SHORT),
            "never a tight loop"
        );
        let none = before_deadline(ReconcileError::Preflight("x".into()), None);
        assert_eq!(
            none.retry_within(),
            None,
            "no deadline yet: the back-off alone"
        );
    }
}
