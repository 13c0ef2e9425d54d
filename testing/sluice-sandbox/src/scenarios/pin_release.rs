//! Scenario `pin-release`: a bad mesh change is undone in seconds with a `BundlePin`, ahead of
//! Git, and the pin lets go once Git and Argo CD agree. In order:
//! 1. The good checkout route (all traffic to v2.13) is published as a signed bundle and an
//!    Argo CD Application in `east-mgmt` with automated sync, prune and self-heal applies it to
//!    `east-1`.
//! 2. A bad change (half of checkout to v2.14, plus a debug route) is committed, published the
//!    same way and the Application pointed at it, as CI does; Argo CD syncs it.
//! 3. A human applies a `BundlePin` naming the good bundle by digest and the bad commit. revert
//!    verifies the signature, suspends Argo CD's automation, applies the good route and prunes
//!    the debug route. Figure `pin_ms`: BundlePin created → phase Pinned (every object applied,
//!    signature verification included), measured by watching the pin every 20 ms (the status
//!    timestamps are whole seconds).
//! 4. For [`HOLD`] (several of Argo CD's 1 s resyncs) the objects are checked: the bad revision
//!    must not come back.
//! 5. revert pushes its revert branch; the scenario merges it into the intent repository's main
//!    branch, CI publishes the merge (same content as the good bundle, new digest) and points the
//!    Application at it; Argo CD reports it Synced and the pin releases (figure `release_ms`),
//!    with Argo CD's automation restored exactly.
//!
//! Never writes the destination's objects itself: Argo CD and revert do. Judged by the objects
//! in `east-1`, the Application's reported state and the pin's phase.

use std::time::{Duration, Instant};

use futures::FutureExt;
use futures::future::BoxFuture;
use kube::Api;
use kube::api::{Patch, PatchParams, PostParams};
use serde_json::{Map, Value, json};
use sluice_api::external::argocd::Application;
use sluice_api::external::http_route::HttpRoute;
use sluice_api::v1alpha1::{BundlePin, BundlePinPhase, BundlePinStatus};

use super::bundles::{self, Published};
use super::canary_abort::{ms, weights};
use super::{Outcome, ScenarioDef, ScenarioError};
use crate::baseline::{self, ROUTE, SHOP, STABLE};
use crate::operators::ARGOCD_NAMESPACE;
use crate::sandbox::{PUBLIC_KEYS_SECRET, Sandbox};

/// The workload cluster the change reaches.
pub const CLUSTER: &str = "east-1";
/// The management cluster whose Argo CD and revert act.
pub const MANAGEMENT: &str = "east-mgmt";
/// The Application that syncs the checkout configuration.
pub const APPLICATION_NAME: &str = "east-1-checkout-config";
/// The BundlePin the human applies.
pub const PIN_NAME: &str = "checkout-bad-split";
/// Where the checkout configuration lives in the intent repository.
pub const CONFIG_DIR: &str = "clusters/east-1/checkout-config";
/// The registry repository CI publishes it to.
pub const REPOSITORY: &str = "mesh/east-1-checkout-config";
/// The route the bad change adds (pruned by the pin).
pub const DEBUG_ROUTE: &str = "checkout-debug";
/// Route weights (stable, canary) of the good configuration.
pub const GOOD: (u32, u32) = (100, 0);
/// Route weights (stable, canary) of the bad change.
pub const BAD: (u32, u32) = (50, 50);
/// How long the pin is watched holding against Argo CD (its resync is 1 s).
pub const HOLD: Duration = Duration::from_secs(4);
/// How often objects and the pin are read while waiting.
const POLL: Duration = Duration::from_millis(20);

/// The registry entry.
pub const SCENARIO: ScenarioDef = ScenarioDef {
    name: "pin-release",
    description: "a bad checkout change synced by Argo CD into east-1 is pinned back to the \
                  previous signed bundle with a BundlePin; pass when every object is back \
                  (pin_ms), Argo CD does not re-apply the bad revision while pinned, revert's \
                  branch merged in Git reaches Argo CD with equal content and the pin releases \
                  (release_ms)",
    budget: Duration::from_secs(90),
    run: start,
};

fn start(sandbox: &Sandbox) -> BoxFuture<'_, Result<Outcome, ScenarioError>> {
    run(sandbox).boxed()
}

/// The debug route the bad change adds: all of checkout to v2.13 for requests carrying a
/// debug header.
pub fn debug_route() -> String {
    format!(
        "apiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata:\n  name: {DEBUG_ROUTE}\n  namespace: {SHOP}\n\
         spec:\n  parentRefs:\n  - name: gateway\n    namespace: istio-ingress\n  rules:\n  - matches:\n    \
         - headers:\n      - name: x-debug\n        value: \"1\"\n    backendRefs:\n    - name: {STABLE}\n      port: 80\n"
    )
}

fn route_path() -> String {
    format!("{CONFIG_DIR}/route-{ROUTE}.yaml")
}

fn debug_path() -> String {
    format!("{CONFIG_DIR}/route-{DEBUG_ROUTE}.yaml")
}

/// What the scenario saw, judged by [`judge`].
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Evidence {
    /// Checkout weights once the pin reported Pinned.
    pub pinned_weights: (i32, i32),
    /// Whether the debug route existed once the pin reported Pinned.
    pub debug_after_pin: bool,
    /// Checkout weights seen during the hold that were not the good ones.
    pub hold_violations: Vec<(i32, i32)>,
    /// Whether the debug route came back during the hold.
    pub debug_during_hold: bool,
    /// Whether, at the end of the hold, Argo CD reported the bad revision OutOfSync: it compared
    /// the pinned objects with the bad revision and left them (its status still says Synced for a
    /// moment after the pin, from before it).
    pub argocd_out_of_sync_after_hold: bool,
    /// The revert branch revert reported pushed, when it exists in the intent repository.
    pub revert_branch: Option<String>,
    /// Whether the merged revert renders the pinned content.
    pub content_matches: bool,
    /// Whether the pin reached Released.
    pub released: bool,
    /// Whether the Application's sync policy after release equals the one before the pin.
    pub policy_restored: bool,
    /// Checkout weights after release.
    pub released_weights: (i32, i32),
}

fn good_weights() -> (i32, i32) {
    (GOOD.0 as i32, GOOD.1 as i32)
}

/// The verdict: the good objects back at Pinned and held while pinned, the revert in Git and
/// Argo CD with equal content, the pin released with automation restored.
pub fn judge(e: &Evidence) -> (bool, String) {
    let good = good_weights();
    if e.pinned_weights != good || e.debug_after_pin {
        return (
            false,
            format!(
                "at Pinned the checkout route was at {}/{} and the debug route {}; the pin did not restore the previous bundle",
                e.pinned_weights.0,
                e.pinned_weights.1,
                if e.debug_after_pin {
                    "still existed"
                } else {
                    "was gone"
                }
            ),
        );
    }
    if !e.hold_violations.is_empty() || e.debug_during_hold {
        return (
            false,
            format!(
                "while pinned the bad revision came back: checkout weights seen {:?}, debug route back {}",
                e.hold_violations, e.debug_during_hold
            ),
        );
    }
    if !e.argocd_out_of_sync_after_hold {
        return (
            false,
            "after the hold Argo CD did not report the bad revision OutOfSync, so it had not compared the pinned objects with it; the hold proves nothing".into(),
        );
    }
    let Some(branch) = &e.revert_branch else {
        return (
            false,
            "revert pushed no revert branch to the intent repository".into(),
        );
    };
    if !e.content_matches {
        return (
            false,
            format!(
                "the merged revert branch {branch} does not render the pinned content; Argo CD cannot agree with the pin"
            ),
        );
    }
    if !e.released {
        return (
            false,
            "the pin did not release after Argo CD reported the pinned content".into(),
        );
    }
    if !e.policy_restored || e.released_weights != good {
        return (
            false,
            format!(
                "released, but Argo CD's sync policy restored {} and the route at {}/{}",
                e.policy_restored, e.released_weights.0, e.released_weights.1
            ),
        );
    }
    (
        true,
        format!(
            "the pin put the previous bundle back and held it against Argo CD; revert's branch {branch} merged in Git reached Argo CD with equal content and the pin released with automation restored"
        ),
    )
}

fn short(digest: &str) -> String {
    digest.chars().take(7 + 12).collect()
}

fn api_error(action: String, cluster: &str) -> impl FnOnce(kube::Error) -> ScenarioError {
    let cluster = cluster.to_string();
    move |source| ScenarioError::Api {
        action,
        cluster,
        source,
    }
}

fn git_error(step: &'static str) -> impl FnOnce(sluice_testkit::git::GitError) -> ScenarioError {
    move |e| ScenarioError::Bundle {
        step,
        message: e.to_string(),
    }
}

struct Apis {
    apps: Api<Application>,
    pins: Api<BundlePin>,
    routes: Api<HttpRoute>,
}

impl Apis {
    fn new(sandbox: &Sandbox) -> Result<Self, ScenarioError> {
        let mgmt = sandbox
            .client(MANAGEMENT)
            .ok_or_else(|| ScenarioError::Missing(format!("cluster {MANAGEMENT}")))?;
        let workload = sandbox
            .client(CLUSTER)
            .ok_or_else(|| ScenarioError::Missing(format!("cluster {CLUSTER}")))?;
        Ok(Self {
            apps: Api::namespaced(mgmt.clone(), ARGOCD_NAMESPACE),
            pins: Api::namespaced(mgmt, ARGOCD_NAMESPACE),
            routes: Api::namespaced(workload, SHOP),
        })
    }

    /// (checkout weights, whether the debug route exists).
    async fn objects(&self) -> Result<((i32, i32), bool), ScenarioError> {
        let checkout = self
            .routes
            .get(ROUTE)
            .await
            .map_err(api_error(format!("reading route {SHOP}/{ROUTE}"), CLUSTER))?;
        let debug = self.routes.get_opt(DEBUG_ROUTE).await.map_err(api_error(
            format!("reading route {SHOP}/{DEBUG_ROUTE}"),
            CLUSTER,
        ))?;
        Ok((weights(&checkout), debug.is_some()))
    }

    async fn app(&self) -> Result<Application, ScenarioError> {
        self.apps.get(APPLICATION_NAME).await.map_err(api_error(
            format!("reading Application {APPLICATION_NAME}"),
            MANAGEMENT,
        ))
    }

    /// Waits until Argo CD reports the Application Synced at `digest` and the objects are
    /// `want`; returns the time it took.
    async fn synced(
        &self,
        digest: &str,
        want: ((i32, i32), bool),
    ) -> Result<Duration, ScenarioError> {
        let begun = Instant::now();
        loop {
            if self.app().await?.is_synced_at(digest) && self.objects().await? == want {
                return Ok(begun.elapsed());
            }
            tokio::time::sleep(POLL).await;
        }
    }

    async fn point_at(&self, digest: &str) -> Result<(), ScenarioError> {
        let patch = json!({"spec": {"source": {"targetRevision": digest}}});
        self.apps
            .patch(
                APPLICATION_NAME,
                &PatchParams::default(),
                &Patch::Merge(&patch),
            )
            .await
            .map_err(api_error(
                format!(
                    "pointing Application {APPLICATION_NAME} at {}",
                    short(digest)
                ),
                MANAGEMENT,
            ))?;
        Ok(())
    }

    /// Waits until the pin reaches `want` or ends in another phase (Refused, Failed,
    /// Released); returns its status then.
    async fn pin_until(&self, want: BundlePinPhase) -> Result<BundlePinStatus, ScenarioError> {
        loop {
            let pin = self.pins.get(PIN_NAME).await.map_err(api_error(
                format!("reading BundlePin {PIN_NAME}"),
                MANAGEMENT,
            ))?;
            if let Some(status) = pin.status
                && (status.phase == want
                    || matches!(
                        status.phase,
                        BundlePinPhase::Refused | BundlePinPhase::Failed | BundlePinPhase::Released
                    ))
            {
                return Ok(status);
            }
            tokio::time::sleep(POLL).await;
        }
    }
}

/// The outcome when the pin ended in a phase other than the one waited for.
fn ended(status: &BundlePinStatus, want: BundlePinPhase, figures: Map<String, Value>) -> Outcome {
    let why = status
        .conditions
        .iter()
        .filter(|c| c.status != "True")
        .map(|c| format!("{} {}: {}", c.type_, c.reason, c.message))
        .collect::<Vec<_>>()
        .join("; ");
    Outcome {
        pass: false,
        figures,
        summary: format!(
            "BundlePin {ARGOCD_NAMESPACE}/{PIN_NAME} ended {:?} instead of reaching {want:?}: {why}",
            status.phase
        ),
    }
}

/// The Application syncing the configuration bundle at `digest` into east-1.
pub fn application(repository: &str, digest: &str) -> Result<Application, ScenarioError> {
    serde_json::from_value(json!({
        "apiVersion": "argoproj.io/v1alpha1",
        "kind": "Application",
        "metadata": {"name": APPLICATION_NAME, "namespace": ARGOCD_NAMESPACE},
        "spec": {
            "project": "default",
            "source": {"repoURL": format!("oci://{repository}"), "path": ".", "targetRevision": digest},
            "destination": {"name": CLUSTER, "namespace": SHOP},
            "syncPolicy": original_policy(),
        }
    }))
    .map_err(|e| ScenarioError::Missing(format!("a valid Application ({e})")))
}

/// The Application's sync policy before the pin (release must restore exactly this).
pub fn original_policy() -> Value {
    json!({"automated": {"prune": true, "selfHeal": true}})
}

/// The BundlePin a human applies: the Application pinned to `good`, the bad commit reverted in
/// Git.
pub fn pin(good: &Published, bad_commit: &str) -> Result<BundlePin, ScenarioError> {
    serde_json::from_value(json!({
        "apiVersion": "sluice.dev/v1alpha1",
        "kind": "BundlePin",
        "metadata": {"name": PIN_NAME, "namespace": ARGOCD_NAMESPACE},
        "spec": {
            "targets": [{"name": APPLICATION_NAME}],
            "bundle": {"repository": format!("oci://{}", good.repository), "digest": good.manifest_digest},
            "publicKeysSecretRef": {"name": PUBLIC_KEYS_SECRET},
            "reason": "checkout was split 50/50 onto v2.14 and a debug route added by mistake",
            "gitRevert": {"commit": bad_commit},
        }
    }))
    .map_err(|e| ScenarioError::Missing(format!("a valid BundlePin ({e})")))
}

async fn run(sandbox: &Sandbox) -> Result<Outcome, ScenarioError> {
    let apis = Apis::new(sandbox)?;
    let mut figures = Map::new();
    let mut evidence = Evidence::default();
    let (route_file, debug_file) = (route_path(), debug_path());

    // 1. The good configuration, synced by Argo CD.
    let good_route = baseline::route(GOOD.0, GOOD.1);
    let good = bundles::publish_bundle(
        sandbox,
        &bundles::Change {
            files: &[(route_file.as_str(), good_route.as_str())],
            message: "mesh: checkout configuration, all traffic to v2.13",
            dir: CONFIG_DIR,
            repository: REPOSITORY,
        },
    )
    .await?;
    sandbox.say(format!(
        "pin-release: the good checkout configuration (commit {}) published as {} and signed; Application {MANAGEMENT}/{APPLICATION_NAME} syncs it into {CLUSTER} with prune and self-heal",
        good.tag, good.reference
    ));
    apis.apps
        .create(
            &PostParams::default(),
            &application(&good.repository, &good.manifest_digest)?,
        )
        .await
        .map_err(api_error(
            format!("creating Application {APPLICATION_NAME}"),
            MANAGEMENT,
        ))?;
    apis.synced(&good.manifest_digest, (good_weights(), false))
        .await?;

    // 2. The bad change, published and synced.
    let bad_route = baseline::route(BAD.0, BAD.1);
    let debug = debug_route();
    let bad = bundles::publish_bundle(
        sandbox,
        &bundles::Change {
            files: &[
                (route_file.as_str(), bad_route.as_str()),
                (debug_file.as_str(), debug.as_str()),
            ],
            message: "mesh: checkout 50/50 onto v2.14, debug route",
            dir: CONFIG_DIR,
            repository: REPOSITORY,
        },
    )
    .await?;
    sandbox.say(format!(
        "pin-release: a bad change (commit {}: checkout {}/{} onto v2.14 and a debug route) published as {}; CI points the Application at it",
        bad.tag, BAD.0, BAD.1, bad.reference
    ));
    apis.point_at(&bad.manifest_digest).await?;
    let bad_sync = apis
        .synced(&bad.manifest_digest, ((BAD.0 as i32, BAD.1 as i32), true))
        .await?;
    sandbox.say(format!(
        "pin-release: Argo CD synced the bad revision in {} ms: {CLUSTER}'s checkout at {}/{}, route {DEBUG_ROUTE} added",
        ms(bad_sync),
        BAD.0,
        BAD.1
    ));

    // 3. A human pins the previous bundle.
    sandbox.say(format!(
        "pin-release: a human applies BundlePin {ARGOCD_NAMESPACE}/{PIN_NAME}: Application {APPLICATION_NAME} back to {} (commit {}), revert commit {} in Git",
        short(&good.manifest_digest),
        good.tag,
        bad.tag
    ));
    let created = Instant::now();
    apis.pins
        .create(&PostParams::default(), &pin(&good, &bad.commit)?)
        .await
        .map_err(api_error(
            format!("creating BundlePin {PIN_NAME}"),
            MANAGEMENT,
        ))?;
    let pinned = apis.pin_until(BundlePinPhase::Pinned).await?;
    let pin_ms = ms(created.elapsed());
    if pinned.phase != BundlePinPhase::Pinned {
        return Ok(ended(&pinned, BundlePinPhase::Pinned, figures));
    }
    let (weights_now, debug_now) = apis.objects().await?;
    evidence.pinned_weights = weights_now;
    evidence.debug_after_pin = debug_now;
    sandbox.say(format!(
        "pin-release: Pinned {pin_ms} ms after the BundlePin was created (signature verified, {} object(s) applied, {} pruned); {CLUSTER}'s checkout at {}/{}, route {DEBUG_ROUTE} {}",
        pinned.applied_objects,
        pinned.pruned_objects,
        weights_now.0,
        weights_now.1,
        if debug_now { "still there" } else { "gone" }
    ));
    figures.insert("pin_ms".into(), Value::from(pin_ms));
    figures.insert(
        "pin_applied_objects".into(),
        Value::from(pinned.applied_objects),
    );
    figures.insert(
        "pin_pruned_objects".into(),
        Value::from(pinned.pruned_objects),
    );
    figures.insert("bad_sync_ms".into(), Value::from(ms(bad_sync)));

    // 4. Argo CD must not re-apply the bad revision while pinned.
    sandbox.say(format!(
        "pin-release: watching for {HOLD:?} ({} of Argo CD's resyncs) that the bad revision does not come back",
        HOLD.as_secs()
    ));
    let hold_end = Instant::now() + HOLD;
    let mut argocd_status = String::new();
    let mut last = (good_weights(), false);
    while Instant::now() < hold_end {
        let (w, d) = apis.objects().await?;
        last = (w, d);
        if w != good_weights() && !evidence.hold_violations.contains(&w) {
            evidence.hold_violations.push(w);
        }
        evidence.debug_during_hold |= d;
        let sync = apis
            .app()
            .await?
            .status
            .and_then(|s| s.sync)
            .unwrap_or_default();
        evidence.argocd_out_of_sync_after_hold = sync.status.as_deref() == Some("OutOfSync")
            && sync.revision.as_deref() == Some(bad.manifest_digest.as_str());
        argocd_status = format!(
            "{} at {}",
            sync.status.unwrap_or_default(),
            short(&sync.revision.unwrap_or_default())
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    sandbox.say(format!(
        "pin-release: after {HOLD:?} Argo CD reports {argocd_status}; {CLUSTER}'s checkout at {}/{}, route {DEBUG_ROUTE} {}",
        last.0.0,
        last.0.1,
        if last.1 { "back" } else { "absent" }
    ));
    figures.insert("hold_s".into(), Value::from(HOLD.as_secs()));
    figures.insert(
        "argocd_while_pinned".into(),
        Value::from(argocd_status.clone()),
    );

    // 5. The revert reaches Git and Argo CD.
    sandbox.say(format!(
        "pin-release: waiting for revert to push its revert branch of commit {} to the intent repository",
        bad.tag
    ));
    let (branch, revert_commit) = loop {
        let status = apis.pin_until(BundlePinPhase::Pinned).await?;
        if status.phase != BundlePinPhase::Pinned {
            return Ok(ended(&status, BundlePinPhase::Pinned, figures));
        }
        if let Some(g) = status.git_revert
            && let (Some(branch), Some(commit)) = (g.branch, g.commit)
        {
            break (branch, commit);
        }
        tokio::time::sleep(POLL).await;
    };
    let git = sandbox.git();
    let in_repo = git
        .branch_sha(&branch)
        .map_err(git_error("read revert branch"))?;
    if in_repo.as_deref() == Some(revert_commit.as_str()) {
        evidence.revert_branch = Some(branch.clone());
    }
    sandbox.say(format!(
        "pin-release: revert pushed branch {branch} (commit {}); merging it into main as a reviewer would",
        bundles::tag_of(&revert_commit)
    ));
    git.git(&["fetch", "--quiet", "origin", &branch])
        .map_err(git_error("fetch revert branch"))?;
    git.git(&[
        "merge",
        "--quiet",
        "--no-ff",
        "-m",
        &format!("Merge {branch}: revert the bad checkout change"),
        "FETCH_HEAD",
    ])
    .map_err(git_error("merge revert branch"))?;
    git.push().map_err(git_error("push merge"))?;
    let merged = git.head().map_err(git_error("read merge commit"))?;
    let reverted = bundles::publish_commit(sandbox, &merged, CONFIG_DIR, REPOSITORY).await?;
    evidence.content_matches = reverted.content_digest == good.content_digest
        && pinned.content_digest.as_deref() == Some(good.content_digest.as_str());
    sandbox.say(format!(
        "pin-release: CI published the merge (commit {}) as {}: content {} the pinned bundle's; the Application is pointed at it",
        reverted.tag,
        reverted.reference,
        if evidence.content_matches {
            "equal to"
        } else {
            "different from"
        }
    ));
    let pointed = Instant::now();
    apis.point_at(&reverted.manifest_digest).await?;
    let released = apis.pin_until(BundlePinPhase::Released).await?;
    let release_ms = ms(pointed.elapsed());
    if released.phase != BundlePinPhase::Released {
        return Ok(ended(&released, BundlePinPhase::Released, figures));
    }
    evidence.released = true;
    let app = apis.app().await?;
    let policy = app
        .spec
        .sync_policy
        .as_ref()
        .and_then(|p| serde_json::to_value(p).ok())
        .unwrap_or(Value::Null);
    evidence.policy_restored = policy == original_policy();
    apis.synced(&reverted.manifest_digest, (good_weights(), false))
        .await?;
    evidence.released_weights = apis.objects().await?.0;
    sandbox.say(format!(
        "pin-release: released {release_ms} ms after the Application was pointed at the merged revert; Argo CD Synced at {}, automation {}",
        short(&reverted.manifest_digest),
        if evidence.policy_restored {
            "restored as it was"
        } else {
            "NOT restored as it was"
        }
    ));
    figures.insert("release_ms".into(), Value::from(release_ms));
    figures.insert("revert_branch".into(), Value::from(branch));
    figures.insert(
        "revert_commit".into(),
        Value::from(bundles::tag_of(&revert_commit)),
    );
    figures.insert(
        "pinned_digest".into(),
        Value::from(good.manifest_digest.clone()),
    );
    figures.insert(
        "released_at_digest".into(),
        Value::from(reverted.manifest_digest.clone()),
    );

    let (pass, summary) = judge(&evidence);
    let summary = format!("{summary}; pin_ms {pin_ms}, release_ms {release_ms}");
    sandbox.say(format!("pin-release: {summary}"));
    Ok(Outcome {
        pass,
        figures,
        summary,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn passing() -> Evidence {
        Evidence {
            pinned_weights: (100, 0),
            debug_after_pin: false,
            hold_violations: Vec::new(),
            debug_during_hold: false,
            argocd_out_of_sync_after_hold: true,
            revert_branch: Some("sluice/revert/argocd/checkout-bad-split".into()),
            content_matches: true,
            released: true,
            policy_restored: true,
            released_weights: (100, 0),
        }
    }

    #[test]
    fn passes_only_when_pinned_held_reverted_in_git_and_released() {
        type Edit = fn(&mut Evidence);
        let cases: [(&str, Edit, bool); 11] = [
            ("all good", |_| {}, true),
            ("route not restored", |e| e.pinned_weights = (50, 50), false),
            (
                "debug route not pruned",
                |e| e.debug_after_pin = true,
                false,
            ),
            (
                "bad weights back while pinned",
                |e| e.hold_violations = vec![(50, 50)],
                false,
            ),
            ("debug route back", |e| e.debug_during_hold = true, false),
            (
                "Argo CD never compared",
                |e| e.argocd_out_of_sync_after_hold = false,
                false,
            ),
            ("no revert branch", |e| e.revert_branch = None, false),
            ("content differs", |e| e.content_matches = false, false),
            ("not released", |e| e.released = false, false),
            ("policy not restored", |e| e.policy_restored = false, false),
            (
                "route moved after release",
                |e| e.released_weights = (50, 50),
                false,
            ),
        ];
        for (name, edit, want) in cases {
            let mut e = passing();
            edit(&mut e);
            let (pass, why) = judge(&e);
            assert_eq!(pass, want, "{name}: {why}");
        }
    }

    #[test]
    fn the_pin_names_the_good_bundle_by_digest_and_the_bad_commit() {
        let good = Published {
            commit: "a".repeat(40),
            tag: "a".repeat(12),
            repository: "127.0.0.1:5000/mesh/east-1-checkout-config".into(),
            reference: String::new(),
            manifest_digest: format!("sha256:{}", "b".repeat(64)),
            content_digest: format!("sha256:{}", "c".repeat(64)),
        };
        let bad_commit = "d".repeat(40);
        let p = pin(&good, &bad_commit).unwrap();
        assert_eq!(
            p.spec.bundle.repository,
            "oci://127.0.0.1:5000/mesh/east-1-checkout-config"
        );
        assert_eq!(p.spec.bundle.digest, good.manifest_digest);
        assert_eq!(p.spec.targets[0].name, APPLICATION_NAME);
        assert_eq!(p.spec.public_keys_secret_ref.name, PUBLIC_KEYS_SECRET);
        assert_eq!(
            p.spec.git_revert.as_ref().map(|g| g.commit.as_str()),
            Some(bad_commit.as_str())
        );
    }

    #[test]
    fn the_application_syncs_the_digest_with_the_policy_release_restores() {
        let app = application("127.0.0.1:5000/mesh/x", "sha256:aa").unwrap();
        let source = app.spec.source.as_ref().unwrap();
        assert_eq!(source.repo_url, "oci://127.0.0.1:5000/mesh/x");
        assert_eq!(source.target_revision.as_deref(), Some("sha256:aa"));
        assert!(app.is_oci_sourced());
        assert_eq!(
            serde_json::to_value(app.spec.sync_policy.unwrap()).unwrap(),
            original_policy()
        );
    }

    #[test]
    fn the_bad_change_adds_an_httproute_the_default_allowlist_accepts() {
        let v: Value = serde_yaml::from_str(&debug_route()).unwrap();
        assert_eq!(v["kind"], "HTTPRoute");
        assert_eq!(v["metadata"]["name"], DEBUG_ROUTE);
        assert_eq!(v["metadata"]["namespace"], SHOP);
        assert!(
            sluice_api::v1alpha1::bundle_pin::DEFAULT_ALLOWED_KINDS
                .contains(&("gateway.networking.k8s.io", "HTTPRoute"))
        );
    }
}
