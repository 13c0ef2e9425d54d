//! Scenario `pin-exact`: a pin restores the previous bundle exactly, also what the bad change
//! added outside atomic lists. Server-side apply of the previous bundle alone would leave those
//! fields (only the manager that applied a field removes it by omitting it); revert removes the
//! fields Argo CD's manager owns that the pinned bundle lacks and compares each object with the
//! bundle before it declares the pin. In order:
//! 1. `east-1` gets Istio's released DestinationRule CRD (v1.28.0, fetched by
//!    `scripts/install-tools.sh`, read through `sluice_testkit::prereq::destination_rule_crd`), as
//!    an Istio install provides it.
//! 2. The good checkout configuration (the route, all traffic to v2.13, and a DestinationRule
//!    with a round-robin load balancer) is published as a signed bundle; an Argo CD Application
//!    in `east-mgmt` with automated sync, prune and self-heal applies it to `east-1`.
//! 3. A bad change adds a connection pool of one connection to the DestinationRule
//!    (`spec.trafficPolicy.connectionPool`) and an annotation to the route (neither inside an
//!    atomic list); Argo CD syncs it.
//! 4. A human applies a `BundlePin` naming the good bundle by digest. Figure `pin_ms`: BundlePin
//!    created → Pinned. At Pinned, and for [`HOLD`] after, neither the connection pool nor the
//!    annotation may be live (figure `bad_fields_at_pinned`, must be 0).
//! 5. CI publishes the good content again (a new commit, so a new digest, same content) and
//!    points the Application at it; Argo CD reports it Synced and the pin releases (figure
//!    `release_ms`) with automation restored exactly; the bad fields stay gone.
//!
//! Never writes the destination's mesh objects itself: Argo CD and revert do. Judged by the
//! objects in `east-1`, the Application's reported state and the pin's phase.

use std::time::{Duration, Instant};

use futures::FutureExt;
use futures::future::BoxFuture;
use kube::api::{DynamicObject, Patch, PatchParams, PostParams};
use kube::core::{ApiResource, GroupVersionKind};
use kube::{Api, Client};
use serde_json::{Map, Value, json};
use sluice_api::external::argocd::Application;
use sluice_api::external::http_route::HttpRoute;
use sluice_api::v1alpha1::{BundlePin, BundlePinPhase, BundlePinStatus};

use super::bundles::{self, Published};
use super::canary_abort::ms;
use super::{Outcome, ScenarioDef, ScenarioError};
use crate::baseline::{self, ROUTE, SHOP, STABLE};
use crate::operators::ARGOCD_NAMESPACE;
use crate::sandbox::{PUBLIC_KEYS_SECRET, Sandbox};

/// The workload cluster the change reaches.
pub const CLUSTER: &str = "east-1";
/// The management cluster whose Argo CD and revert act.
pub const MANAGEMENT: &str = "east-mgmt";
/// The Application that syncs the checkout traffic configuration.
pub const APPLICATION_NAME: &str = "east-1-checkout-traffic";
/// The BundlePin the human applies.
pub const PIN_NAME: &str = "checkout-connection-pool";
/// Where the configuration lives in the intent repository.
pub const CONFIG_DIR: &str = "clusters/east-1/checkout-traffic";
/// The registry repository CI publishes it to.
pub const REPOSITORY: &str = "mesh/east-1-checkout-traffic";
/// The annotation the bad change adds to the route.
pub const DEBUG_ANNOTATION: &str = "shop.example/debug-headers";
/// How long the pin is watched holding against Argo CD (its resync is 1 s).
pub const HOLD: Duration = Duration::from_secs(4);
/// How often objects and the pin are read while waiting.
const POLL: Duration = Duration::from_millis(20);

/// The registry entry.
pub const SCENARIO: ScenarioDef = ScenarioDef {
    name: "pin-exact",
    description: "a bad change adds a DestinationRule connectionPool and a route annotation \
                  (outside atomic lists) in east-1; a BundlePin to the previous signed bundle \
                  must leave neither live at Pinned nor while pinned (bad_fields_at_pinned 0, \
                  pin_ms), and release once Argo CD reports the same content Synced \
                  (release_ms)",
    budget: Duration::from_secs(90),
    run: start,
};

fn start(sandbox: &Sandbox) -> BoxFuture<'_, Result<Outcome, ScenarioError>> {
    run(sandbox).boxed()
}

/// The checkout DestinationRule; the bad change adds a connection pool of one connection.
pub fn destination_rule(bad: bool) -> String {
    let pool = if bad {
        "\n    connectionPool:\n      tcp:\n        maxConnections: 1\n      http:\n        http1MaxPendingRequests: 1"
    } else {
        ""
    };
    format!(
        "apiVersion: networking.istio.io/v1\nkind: DestinationRule\nmetadata:\n  name: {ROUTE}\n  namespace: {SHOP}\n\
         spec:\n  host: {STABLE}\n  subsets:\n  - name: stable\n    labels: {{version: v2-13}}\n  trafficPolicy:\n    \
         loadBalancer:\n      simple: ROUND_ROBIN{pool}\n"
    )
}

/// The checkout route, all traffic to v2.13; the bad change adds [`DEBUG_ANNOTATION`].
pub fn route(bad: bool) -> String {
    let text = baseline::route(100, 0);
    if bad {
        text.replacen(
            "metadata:\n",
            &format!("metadata:\n  annotations:\n    {DEBUG_ANNOTATION}: \"on\"\n"),
            1,
        )
    } else {
        text
    }
}

/// What of the bad change is live: the DestinationRule's connection pool, the route's
/// annotation.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BadFields {
    /// `spec.trafficPolicy.connectionPool` exists.
    pub connection_pool: bool,
    /// The route carries [`DEBUG_ANNOTATION`].
    pub annotation: bool,
}

impl BadFields {
    /// How many of the bad fields are live.
    pub fn count(self) -> u32 {
        u32::from(self.connection_pool) + u32::from(self.annotation)
    }
}

/// What the scenario saw, judged by [`judge`].
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Evidence {
    /// What of the bad change was live once Argo CD synced it (both, or the scenario proves
    /// nothing).
    pub bad_synced: BadFields,
    /// What of it was live once the pin reported Pinned.
    pub at_pinned: BadFields,
    /// What of it came back during the hold.
    pub during_hold: BadFields,
    /// Whether the pin reached Released.
    pub released: bool,
    /// Whether the Application's sync policy after release equals the one before the pin.
    pub policy_restored: bool,
    /// What of the bad change was live after release, once Argo CD reported Synced.
    pub after_release: BadFields,
}

/// The verdict: the bad change's fields live before the pin, gone at Pinned and while pinned,
/// the pin released with automation restored and nothing of the bad change back.
pub fn judge(e: &Evidence) -> (bool, String) {
    if e.bad_synced.count() != 2 {
        return (
            false,
            format!(
                "the bad change was not live before the pin ({:?}); the scenario proves nothing",
                e.bad_synced
            ),
        );
    }
    if e.at_pinned.count() != 0 {
        return (
            false,
            format!(
                "the pin reported Pinned while the bad change was still live ({:?}): not an exact restore",
                e.at_pinned
            ),
        );
    }
    if e.during_hold.count() != 0 {
        return (
            false,
            format!(
                "while pinned the bad change came back ({:?})",
                e.during_hold
            ),
        );
    }
    if !e.released || !e.policy_restored {
        return (
            false,
            format!(
                "the pin released {}, Argo CD's sync policy restored {}",
                e.released, e.policy_restored
            ),
        );
    }
    if e.after_release.count() != 0 {
        return (
            false,
            format!(
                "after release the bad change was live again ({:?})",
                e.after_release
            ),
        );
    }
    (
        true,
        "the pin removed the connection pool and the annotation the bad change added outside atomic lists, held them off against Argo CD and released once Argo CD reported the same content".into(),
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

struct Apis {
    apps: Api<Application>,
    pins: Api<BundlePin>,
    routes: Api<HttpRoute>,
    rules: Api<DynamicObject>,
}

impl Apis {
    fn new(mgmt: Client, workload: Client) -> Self {
        let dr = ApiResource::from_gvk_with_plural(
            &GroupVersionKind::gvk("networking.istio.io", "v1", "DestinationRule"),
            "destinationrules",
        );
        Self {
            apps: Api::namespaced(mgmt.clone(), ARGOCD_NAMESPACE),
            pins: Api::namespaced(mgmt, ARGOCD_NAMESPACE),
            routes: Api::namespaced(workload.clone(), SHOP),
            rules: Api::namespaced_with(workload, SHOP, &dr),
        }
    }

    async fn bad_fields(&self) -> Result<BadFields, ScenarioError> {
        let rule = self.rules.get_opt(ROUTE).await.map_err(api_error(
            format!("reading DestinationRule {SHOP}/{ROUTE}"),
            CLUSTER,
        ))?;
        let route = self
            .routes
            .get(ROUTE)
            .await
            .map_err(api_error(format!("reading route {SHOP}/{ROUTE}"), CLUSTER))?;
        Ok(BadFields {
            connection_pool: rule.is_some_and(|r| {
                r.data
                    .pointer("/spec/trafficPolicy/connectionPool")
                    .is_some()
            }),
            annotation: route
                .metadata
                .annotations
                .is_some_and(|a| a.contains_key(DEBUG_ANNOTATION)),
        })
    }

    async fn app(&self) -> Result<Application, ScenarioError> {
        self.apps.get(APPLICATION_NAME).await.map_err(api_error(
            format!("reading Application {APPLICATION_NAME}"),
            MANAGEMENT,
        ))
    }

    /// Waits until Argo CD reports the Application Synced at `digest`; returns the time it took.
    async fn synced(&self, digest: &str) -> Result<Duration, ScenarioError> {
        let begun = Instant::now();
        while !self.app().await?.is_synced_at(digest) {
            tokio::time::sleep(POLL).await;
        }
        Ok(begun.elapsed())
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

/// The Application's sync policy before the pin (release must restore exactly this).
pub fn original_policy() -> Value {
    json!({"automated": {"prune": true, "selfHeal": true}})
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

/// The BundlePin a human applies: the Application pinned to `good`.
pub fn pin(good: &Published) -> Result<BundlePin, ScenarioError> {
    serde_json::from_value(json!({
        "apiVersion": "sluice.dev/v1alpha1",
        "kind": "BundlePin",
        "metadata": {"name": PIN_NAME, "namespace": ARGOCD_NAMESPACE},
        "spec": {
            "targets": [{"name": APPLICATION_NAME}],
            "bundle": {"repository": format!("oci://{}", good.repository), "digest": good.manifest_digest},
            "publicKeysSecretRef": {"name": PUBLIC_KEYS_SECRET},
            "reason": "checkout's connection pool was cut to one connection by mistake",
        }
    }))
    .map_err(|e| ScenarioError::Missing(format!("a valid BundlePin ({e})")))
}

async fn run(sandbox: &Sandbox) -> Result<Outcome, ScenarioError> {
    let mgmt = sandbox
        .client(MANAGEMENT)
        .ok_or_else(|| ScenarioError::Missing(format!("cluster {MANAGEMENT}")))?;
    let workload = sandbox
        .client(CLUSTER)
        .ok_or_else(|| ScenarioError::Missing(format!("cluster {CLUSTER}")))?;
    let apis = Apis::new(mgmt, workload);
    let mut figures = Map::new();
    let mut evidence = Evidence::default();
    let route_file = format!("{CONFIG_DIR}/route-{ROUTE}.yaml");
    let rule_file = format!("{CONFIG_DIR}/destinationrule-{ROUTE}.yaml");

    // 1. The DestinationRule kind, as an Istio install provides it.
    let crd = sluice_testkit::prereq::destination_rule_crd()
        .map_err(|e| ScenarioError::Missing(format!("Istio's DestinationRule CRD: {e}")))?;
    sandbox
        .cluster(CLUSTER)
        .ok_or_else(|| ScenarioError::Missing(format!("cluster {CLUSTER}")))?
        .api
        .load_yaml(&crd)
        .await
        .map_err(|e| {
            ScenarioError::Missing(format!("the DestinationRule CRD in {CLUSTER} ({e})"))
        })?;

    // 2. The good configuration, synced by Argo CD.
    let (good_route, good_rule) = (route(false), destination_rule(false));
    let good = bundles::publish_bundle(
        sandbox,
        &bundles::Change {
            files: &[
                (route_file.as_str(), good_route.as_str()),
                (rule_file.as_str(), good_rule.as_str()),
            ],
            message: "mesh: checkout traffic, round-robin to v2.13",
            dir: CONFIG_DIR,
            repository: REPOSITORY,
        },
    )
    .await?;
    sandbox.say(format!(
        "pin-exact: the good checkout traffic configuration (commit {}: route and DestinationRule) published as {}; Application {MANAGEMENT}/{APPLICATION_NAME} syncs it into {CLUSTER}",
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
    apis.synced(&good.manifest_digest).await?;

    // 3. The bad change, published and synced.
    let (bad_route, bad_rule) = (route(true), destination_rule(true));
    let bad = bundles::publish_bundle(
        sandbox,
        &bundles::Change {
            files: &[
                (route_file.as_str(), bad_route.as_str()),
                (rule_file.as_str(), bad_rule.as_str()),
            ],
            message: "mesh: checkout connection pool of one, debug headers",
            dir: CONFIG_DIR,
            repository: REPOSITORY,
        },
    )
    .await?;
    apis.point_at(&bad.manifest_digest).await?;
    let bad_sync = apis.synced(&bad.manifest_digest).await?;
    evidence.bad_synced = apis.bad_fields().await?;
    sandbox.say(format!(
        "pin-exact: Argo CD synced the bad change (commit {}) in {} ms: DestinationRule {SHOP}/{ROUTE} connectionPool {}, route annotation {DEBUG_ANNOTATION} {}",
        bad.tag,
        ms(bad_sync),
        if evidence.bad_synced.connection_pool { "set" } else { "absent" },
        if evidence.bad_synced.annotation { "set" } else { "absent" },
    ));

    // 4. A human pins the previous bundle.
    let created = Instant::now();
    apis.pins
        .create(&PostParams::default(), &pin(&good)?)
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
    evidence.at_pinned = apis.bad_fields().await?;
    figures.insert("pin_ms".into(), Value::from(pin_ms));
    figures.insert(
        "bad_fields_at_pinned".into(),
        Value::from(evidence.at_pinned.count()),
    );
    sandbox.say(format!(
        "pin-exact: Pinned {pin_ms} ms after the BundlePin was created; {} of the bad change's 2 fields live",
        evidence.at_pinned.count()
    ));
    let hold_end = Instant::now() + HOLD;
    while Instant::now() < hold_end {
        let seen = apis.bad_fields().await?;
        evidence.during_hold.connection_pool |= seen.connection_pool;
        evidence.during_hold.annotation |= seen.annotation;
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    // 5. The good content again from Git: Argo CD agrees and the pin releases.
    let again = bundles::publish_bundle(
        sandbox,
        &bundles::Change {
            files: &[
                (route_file.as_str(), good_route.as_str()),
                (rule_file.as_str(), good_rule.as_str()),
            ],
            message: "mesh: revert checkout connection pool and debug headers",
            dir: CONFIG_DIR,
            repository: REPOSITORY,
        },
    )
    .await?;
    let pointed = Instant::now();
    apis.point_at(&again.manifest_digest).await?;
    let released = apis.pin_until(BundlePinPhase::Released).await?;
    let release_ms = ms(pointed.elapsed());
    if released.phase != BundlePinPhase::Released {
        return Ok(ended(&released, BundlePinPhase::Released, figures));
    }
    evidence.released = true;
    let policy = apis
        .app()
        .await?
        .spec
        .sync_policy
        .as_ref()
        .and_then(|p| serde_json::to_value(p).ok())
        .unwrap_or(Value::Null);
    evidence.policy_restored = policy == original_policy();
    apis.synced(&again.manifest_digest).await?;
    evidence.after_release = apis.bad_fields().await?;
    figures.insert("release_ms".into(), Value::from(release_ms));
    figures.insert(
        "pinned_digest".into(),
        Value::from(good.manifest_digest.clone()),
    );

    let (pass, summary) = judge(&evidence);
    let summary = format!("{summary}; pin_ms {pin_ms}, release_ms {release_ms}");
    sandbox.say(format!("pin-exact: {summary}"));
    Ok(Outcome {
        pass,
        figures,
        summary,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const BOTH: BadFields = BadFields {
        connection_pool: true,
        annotation: true,
    };

    fn passing() -> Evidence {
        Evidence {
            bad_synced: BOTH,
            released: true,
            policy_restored: true,
            ..Evidence::default()
        }
    }

    #[test]
    fn passes_only_when_the_bad_fields_are_gone_at_pinned_held_and_released() {
        type Edit = fn(&mut Evidence);
        let cases: [(&str, Edit, bool); 7] = [
            ("all good", |_| {}, true),
            (
                "bad change never live",
                |e| e.bad_synced = BadFields::default(),
                false,
            ),
            (
                "connection pool left at Pinned",
                |e| e.at_pinned.connection_pool = true,
                false,
            ),
            (
                "annotation left at Pinned",
                |e| e.at_pinned.annotation = true,
                false,
            ),
            (
                "came back while pinned",
                |e| e.during_hold.connection_pool = true,
                false,
            ),
            ("policy not restored", |e| e.policy_restored = false, false),
            (
                "back after release",
                |e| e.after_release.annotation = true,
                false,
            ),
        ];
        for (name, edit, want) in cases {
            let mut e = passing();
            edit(&mut e);
            assert_eq!(judge(&e).0, want, "{name}: {}", judge(&e).1);
        }
    }

    #[test]
    fn the_bad_change_differs_only_outside_atomic_lists() {
        let good: Value = serde_yaml::from_str(&destination_rule(false)).unwrap();
        let bad: Value = serde_yaml::from_str(&destination_rule(true)).unwrap();
        assert!(good.pointer("/spec/trafficPolicy/connectionPool").is_none());
        assert_eq!(
            bad.pointer("/spec/trafficPolicy/connectionPool/tcp/maxConnections"),
            Some(&json!(1))
        );
        assert_eq!(good["spec"]["subsets"], bad["spec"]["subsets"]);
        let good_route: Value = serde_yaml::from_str(&route(false)).unwrap();
        let bad_route: Value = serde_yaml::from_str(&route(true)).unwrap();
        assert_eq!(good_route["spec"], bad_route["spec"]);
        assert_eq!(bad_route["metadata"]["annotations"][DEBUG_ANNOTATION], "on");
        for kind in [
            ("networking.istio.io", "DestinationRule"),
            ("gateway.networking.k8s.io", "HTTPRoute"),
        ] {
            assert!(sluice_api::v1alpha1::bundle_pin::DEFAULT_ALLOWED_KINDS.contains(&kind));
        }
    }

    #[test]
    fn the_released_crd_serves_the_kind_the_bundle_holds() {
        let Some(text) =
            sluice_testkit::prereq::or_skip(sluice_testkit::prereq::destination_rule_crd())
        else {
            return;
        };
        let crd: Value = serde_yaml::from_str(&text).unwrap();
        assert_eq!(crd["spec"]["group"], "networking.istio.io");
        assert_eq!(crd["spec"]["names"]["kind"], "DestinationRule");
        let versions = crd["spec"]["versions"].as_array().unwrap();
        assert!(
            versions
                .iter()
                .any(|v| v["name"] == "v1" && v["served"] == true),
            "{versions:?}"
        );
    }
}
