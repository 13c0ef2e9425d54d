//! Scenario `world`: the local world works end to end, in two parts run side by side.
//! - Mesh: the checkout route in `east-1` is set to 90/10 and the canary share is read back from
//!   Prometheus, as the mesh simulator reports it from the weights stored in the API (figure
//!   `canary_share`; pass within ±0.02 of 0.10). Never judged by the route written.
//! - Argo CD: a mesh change committed to the git intent repository is rendered into a bundle,
//!   pushed to the registry and signed; an Application in `east-mgmt` syncs it by digest into
//!   `east-1` (figure `bundle_sync_ms`; pass when Argo CD reports Synced at that digest and the
//!   object is in `east-1`, carrying Argo CD's tracking annotation).

use std::time::{Duration, Instant};

use futures::FutureExt;
use futures::future::BoxFuture;
use kube::Api;
use kube::api::{ApiResource, DynamicObject, GroupVersionKind, Patch, PatchParams};
use serde_json::{Map, Value, json};

use sluice_bundle::{BundleClient, RegistryOptions};

use super::{Outcome, ScenarioDef, ScenarioError, bundles};
use crate::baseline::{CANARY, ROUTE, SHOP, STABLE};
use crate::sandbox::Sandbox;
use crate::share;

/// The workload cluster the scenario uses.
pub const CLUSTER: &str = "east-1";
/// Canary weight written (of 100).
pub const CANARY_WEIGHT: u32 = 10;
/// Allowed distance of the measured share from the written one.
pub const TOLERANCE: f64 = 0.02;
/// The window the share is measured over (≥ 4 telemetry intervals of 1 s).
pub const WINDOW_S: u64 = 5;
/// Wait after the write before measuring: the mesh's propagation delay (2 s), a full window and
/// two telemetry intervals, so the window holds only traffic split by the new weights.
pub const SETTLE: Duration = Duration::from_secs(2 + WINDOW_S + 2);

// A rate window needs at least 4 telemetry intervals (1 s each).
const _: () = assert!(WINDOW_S >= 4);

/// The registry entry.
pub const SCENARIO: ScenarioDef = ScenarioDef {
    name: "world",
    description: "east-1's checkout route at 90/10, pass when Prometheus reports a canary share \
                  within 0.10 ± 0.02 (canary_share); and a signed bundle synced by an Argo CD \
                  Application into east-1, pass when Synced at its digest (bundle_sync_ms)",
    budget: Duration::from_secs(90),
    run: start,
};

fn start(sandbox: &Sandbox) -> BoxFuture<'_, Result<Outcome, ScenarioError>> {
    run(sandbox).boxed()
}

/// The verdict on a measured share.
pub fn judge(measured: Option<f64>, target: f64, tolerance: f64) -> (bool, String) {
    match measured {
        None => (
            false,
            "Prometheus reported no checkout requests; no data is never a pass".to_string(),
        ),
        Some(s) if (s - target).abs() <= tolerance => (
            true,
            format!("the mesh reports a canary share of {s:.4}, the {target:.2} written"),
        ),
        Some(s) => (
            false,
            format!("the mesh reports a canary share of {s:.4}, not {target:.2} ± {tolerance}"),
        ),
    }
}

fn dynamic(
    sandbox: &Sandbox,
    cluster: &str,
    namespace: &str,
    (group, version, kind, plural): (&str, &str, &str, &str),
) -> Result<Api<DynamicObject>, ScenarioError> {
    let client = sandbox
        .client(cluster)
        .ok_or_else(|| ScenarioError::Missing(format!("cluster {cluster}")))?;
    let resource =
        ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(group, version, kind), plural);
    Ok(Api::namespaced_with(client, namespace, &resource))
}

const HTTPROUTE: (&str, &str, &str, &str) =
    ("gateway.networking.k8s.io", "v1", "HTTPRoute", "httproutes");
const APPLICATION: (&str, &str, &str, &str) =
    ("argoproj.io", "v1alpha1", "Application", "applications");

fn routes(sandbox: &Sandbox) -> Result<Api<DynamicObject>, ScenarioError> {
    dynamic(sandbox, CLUSTER, SHOP, HTTPROUTE)
}

/// Runs both parts side by side; passes only when both pass.
async fn run(sandbox: &Sandbox) -> Result<Outcome, ScenarioError> {
    let (mesh, bundle) = tokio::join!(mesh_part(sandbox), bundle_part(sandbox));
    let (mesh, bundle) = (mesh?, bundle?);
    let mut figures = mesh.figures;
    figures.extend(bundle.figures);
    Ok(Outcome {
        pass: mesh.pass && bundle.pass,
        figures,
        summary: format!("{}; {}", mesh.summary, bundle.summary),
    })
}

/// The management cluster whose Argo CD syncs the bundle.
pub const MANAGEMENT: &str = "east-mgmt";
/// The Application that syncs the bundle.
pub const APPLICATION_NAME: &str = "east-1-mesh";
/// The route the bundle carries.
pub const BUNDLE_ROUTE: &str = "checkout-internal";
/// Where the bundle's manifests live in the intent repository.
pub const BUNDLE_DIR: &str = "clusters/east-1/bundle";

fn bundle_route() -> String {
    format!(
        "apiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata:\n  name: {BUNDLE_ROUTE}\n  namespace: {SHOP}\n\
         spec:\n  parentRefs:\n  - name: mesh\n    namespace: istio-system\n  rules:\n  - backendRefs:\n    \
         - name: {STABLE}\n      port: 80\n"
    )
}

/// Whether an Application reports Synced at `digest`.
pub fn synced_at(app: &serde_json::Value, digest: &str) -> bool {
    app.pointer("/status/sync/status").and_then(Value::as_str) == Some("Synced")
        && app.pointer("/status/sync/revision").and_then(Value::as_str) == Some(digest)
}

async fn bundle_part(sandbox: &Sandbox) -> Result<Outcome, ScenarioError> {
    // Commit the change to the intent repository, then render, push and sign it.
    let path = format!("{BUNDLE_DIR}/route-{BUNDLE_ROUTE}.yaml");
    let route = bundle_route();
    let pushed = bundles::publish_bundle(
        sandbox,
        &bundles::Change {
            files: &[(path.as_str(), route.as_str())],
            message: "mesh: internal checkout route in east-1",
            dir: BUNDLE_DIR,
            repository: "mesh/east-1",
        },
    )
    .await?;
    let repository = pushed.repository.clone();
    let tag = &pushed.tag;
    let verified = BundleClient::new(RegistryOptions::default())
        .verify(
            &pushed.reference,
            std::slice::from_ref(sandbox.signing_key().public_key()),
        )
        .await
        .is_ok();
    let digest = pushed.manifest_digest.clone();
    sandbox.say(format!(
        "world: bundle of commit {tag} pushed as {} and signed; Application {MANAGEMENT}/{APPLICATION_NAME} syncs it into {CLUSTER}",
        pushed.reference
    ));

    // An Application syncs it by digest into east-1.
    let app: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "argoproj.io/v1alpha1",
        "kind": "Application",
        "metadata": {"name": APPLICATION_NAME, "namespace": crate::operators::ARGOCD_NAMESPACE},
        "spec": {
            "project": "default",
            "source": {"repoURL": format!("oci://{repository}"), "path": ".", "targetRevision": digest},
            "destination": {"name": CLUSTER, "namespace": SHOP},
            "syncPolicy": {"automated": {"prune": true, "selfHeal": true}},
        }
    }))
    .map_err(|e| ScenarioError::Missing(format!("a valid Application ({e})")))?;
    let apps = dynamic(
        sandbox,
        MANAGEMENT,
        crate::operators::ARGOCD_NAMESPACE,
        APPLICATION,
    )?;
    let created = Instant::now();
    apps.create(&kube::api::PostParams::default(), &app)
        .await
        .map_err(|source| ScenarioError::Api {
            action: format!("creating Application {APPLICATION_NAME}"),
            cluster: MANAGEMENT.into(),
            source,
        })?;
    let routes = routes(sandbox)?;
    let (tracking, sync_ms) = loop {
        let app = apps.get(APPLICATION_NAME).await.ok();
        let synced = app
            .and_then(|a| serde_json::to_value(a).ok())
            .is_some_and(|a| synced_at(&a, &digest));
        if synced && let Ok(route) = routes.get(BUNDLE_ROUTE).await {
            let ms = u64::try_from(created.elapsed().as_millis()).unwrap_or(u64::MAX);
            let tracking = route
                .metadata
                .annotations
                .unwrap_or_default()
                .get("argocd.argoproj.io/tracking-id")
                .cloned();
            break (tracking, ms);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let pass = verified && tracking.is_some();
    let summary = if pass {
        format!(
            "Argo CD synced the signed bundle {} into {CLUSTER} in {sync_ms} ms",
            short(&digest)
        )
    } else if !verified {
        "the pushed bundle's signature did not verify".to_string()
    } else {
        format!("route {SHOP}/{BUNDLE_ROUTE} in {CLUSTER} lacks Argo CD's tracking annotation")
    };
    sandbox.say(format!("world: {summary}"));
    let mut figures = Map::new();
    figures.insert("bundle_sync_ms".into(), Value::from(sync_ms));
    figures.insert("bundle_digest".into(), Value::from(digest));
    figures.insert(
        "bundle_content_digest".into(),
        Value::from(pushed.content_digest),
    );
    figures.insert("bundle_signature_verified".into(), Value::from(verified));
    Ok(Outcome {
        pass,
        figures,
        summary,
    })
}

fn short(digest: &str) -> String {
    digest.chars().take(7 + 12).collect()
}

async fn mesh_part(sandbox: &Sandbox) -> Result<Outcome, ScenarioError> {
    let stable_weight = 100 - CANARY_WEIGHT;
    sandbox.say(format!(
        "world: setting {CLUSTER}'s route {SHOP}/{ROUTE} to {stable_weight}/{CANARY_WEIGHT}, then reading the canary share back from Prometheus"
    ));
    let patch = json!({"spec": {"rules": [{"backendRefs": [
        {"name": STABLE, "port": 80, "weight": stable_weight},
        {"name": CANARY, "port": 80, "weight": CANARY_WEIGHT},
    ]}]}});
    routes(sandbox)?
        .patch(ROUTE, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .map_err(|source| ScenarioError::Api {
            action: format!("setting route {SHOP}/{ROUTE} to {stable_weight}/{CANARY_WEIGHT}"),
            cluster: CLUSTER.into(),
            source,
        })?;
    let written = Instant::now();
    tokio::time::sleep(SETTLE).await;
    // Telemetry may lag a tick on a loaded machine: read until there is data.
    let measured = loop {
        let m = share::measure(sandbox.prometheus(), CLUSTER, SHOP, WINDOW_S).await?;
        if m.total() > 0.0 {
            break m;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    };
    let share = share::canary_share(&measured, STABLE, CANARY);
    let target = f64::from(CANARY_WEIGHT) / 100.0;
    let (pass, summary) = judge(share, target, TOLERANCE);
    sandbox.say(format!("world: {summary}"));
    let mut figures = Map::new();
    let round = |v: f64| (v * 10_000.0).round() / 10_000.0;
    figures.insert(
        "canary_share".into(),
        share.map(round).map(Value::from).unwrap_or(Value::Null),
    );
    figures.insert(
        "canary_requests".into(),
        Value::from(measured.requests(CANARY).round()),
    );
    figures.insert(
        "stable_requests".into(),
        Value::from(measured.requests(STABLE).round()),
    );
    figures.insert("share_window_s".into(), Value::from(WINDOW_S));
    figures.insert(
        "measured_after_ms".into(),
        Value::from(u64::try_from(written.elapsed().as_millis()).unwrap_or(u64::MAX)),
    );
    Ok(Outcome {
        pass,
        figures,
        summary,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn synced_only_at_the_bundle_digest() {
        let app = |status: &str, revision: &str| json!({"status": {"sync": {"status": status, "revision": revision}}});
        let cases = [
            (app("Synced", "sha256:aa"), true),
            (app("Synced", "sha256:bb"), false),
            (app("OutOfSync", "sha256:aa"), false),
            (json!({"status": {}}), false),
        ];
        for (a, want) in cases {
            assert_eq!(synced_at(&a, "sha256:aa"), want, "{a}");
        }
    }

    #[test]
    fn the_bundle_route_is_an_httproute_in_the_shop_namespace() {
        let v: Value = serde_yaml::from_str(&bundle_route()).unwrap();
        assert_eq!(v["kind"], "HTTPRoute");
        assert_eq!(v["metadata"]["namespace"], SHOP);
        assert_eq!(v["spec"]["rules"][0]["backendRefs"][0]["name"], STABLE);
    }

    #[test]
    fn judged_by_the_measured_share_only() {
        let cases = [
            (Some(0.10), true),
            (Some(0.119), true),
            (Some(0.081), true),
            (Some(0.125), false),
            (Some(0.0), false),
            (None, false),
        ];
        for (measured, want) in cases {
            let (pass, why) = judge(measured, 0.10, TOLERANCE);
            assert_eq!(pass, want, "{measured:?}: {why}");
        }
    }
}
