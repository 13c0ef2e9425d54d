//! End to end: the mesh simulator reads the HTTPRoute weights stored in the API emulator and a
//! real Prometheus returns the share they imply — only after the propagation delay.

use kube::api::{ApiResource, DynamicObject, GroupVersionKind, Patch, PatchParams, PostParams};
use kube::{Api, Client};
use kube_emulator::Emulator;
use serde_json::json;
use sluice_sim::{ClusterConfig, Scenario, World};
use sluice_testkit::eventually::eventually_every;
use sluice_testkit::prometheus::{Prometheus, now_ms};
use std::collections::BTreeMap;
use std::time::Duration;

const NS: &str = "shop";
const STABLE: &str = "checkout-v2-13";
const CANARY: &str = "checkout-v2-14";
const DELAY: Duration = Duration::from_secs(3);

fn routes(client: &Client) -> Api<DynamicObject> {
    Api::namespaced_with(
        client.clone(),
        NS,
        &ApiResource::from_gvk_with_plural(
            &GroupVersionKind::gvk("gateway.networking.k8s.io", "v1", "HTTPRoute"),
            "httproutes",
        ),
    )
}

fn rules(stable: u32, canary: u32) -> serde_json::Value {
    json!([{"backendRefs": [
        {"name": STABLE, "port": 80, "weight": stable},
        {"name": CANARY, "port": 80, "weight": canary}
    ]}])
}

/// Given: an emulator serving the released HTTPRoute CRD with route `shop/checkout` at 90/10, a
/// real Prometheus, and a world playing the shipped `world` scenario (1 s interval, 3 s delay).
/// None when a prerequisite is missing (the reason is printed).
async fn given_a_world_at_90_10() -> Option<(Emulator, Prometheus, World)> {
    let upstream = sluice_testkit::prereq::or_skip(sluice_testkit::prereq::httproute_crd())?;
    let prometheus = Prometheus::start_or_skip().await?;
    let emu = Emulator::start().await;
    emu.load_manifest_file(&upstream).unwrap();
    emu.load_yaml(&format!(
        "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: {NS}\n"
    ))
    .unwrap();
    let route: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "gateway.networking.k8s.io/v1", "kind": "HTTPRoute",
        "metadata": {"name": "checkout", "namespace": NS},
        "spec": {"parentRefs": [{"name": "gateway"}], "rules": rules(90, 10)}
    }))
    .unwrap();
    routes(&emu.client())
        .create(&PostParams::default(), &route)
        .await
        .unwrap();
    let mut scenario = Scenario::shipped("world").unwrap();
    scenario.propagation_delay = DELAY;
    let world = World::builder()
        .cluster_with(ClusterConfig::new("cluster-1"), emu.client())
        .telemetry(prometheus.url(), scenario, Duration::from_secs(1))
        .start()
        .unwrap();
    Some((emu, prometheus, world))
}

/// Requests per backend Service (source reporter) increased over `window` ending now.
async fn source_increase(prometheus: &Prometheus, window: &str) -> BTreeMap<String, f64> {
    let q = format!(
        r#"sum by (destination_service_name) (increase(istio_requests_total{{reporter="source", cluster="cluster-1", destination_service_namespace="{NS}"}}[{window}]))"#
    );
    prometheus
        .query(&q, None)
        .await
        .unwrap()
        .into_iter()
        .map(|s| (s.labels["destination_service_name"].clone(), s.value))
        .collect()
}

fn canary_share(by_service: &BTreeMap<String, f64>) -> f64 {
    let canary = by_service.get(CANARY).copied().unwrap_or(0.0);
    let stable = by_service.get(STABLE).copied().unwrap_or(0.0);
    canary / (canary + stable)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prometheus_returns_the_canary_share_of_the_stored_weights() {
    let Some((_emu, prometheus, world)) = given_a_world_at_90_10().await else {
        return;
    };
    tokio::time::sleep(Duration::from_secs(7)).await;
    let by_service = source_increase(&prometheus, "5s").await;
    let share = canary_share(&by_service);
    println!("canary share measured in Prometheus: {share:.4} (requests {by_service:?})");
    assert!(
        (share - 0.10).abs() < 0.01,
        "canary share {share} not within 0.10 ± 0.01"
    );
    let total: f64 = by_service.values().sum();
    assert!(
        total > 500.0,
        "expected ~1000 requests in 5 s at 200/s, got {total}"
    );
    let stats = world.mesh().unwrap().stats();
    assert_eq!(stats.write_errors, 0, "{:?}", stats.last_error);
    // Without mirror rules the destination reporter sees exactly what the source sent.
    let dest = prometheus
        .query(r#"sum(istio_requests_total{reporter="destination", cluster="cluster-1"}) - sum(istio_requests_total{reporter="source", cluster="cluster-1"})"#, None)
        .await
        .unwrap();
    assert!(
        dest[0].value.abs() < 1e-6,
        "destination and source differ without mirroring: {dest:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_route_change_shows_in_the_measured_share_only_after_the_propagation_delay() {
    let Some((emu, prometheus, _world)) = given_a_world_at_90_10().await else {
        return;
    };
    tokio::time::sleep(Duration::from_secs(5)).await;
    // When: the stored weights change to 50/50 at `written`.
    let written = now_ms();
    routes(&emu.client())
        .patch(
            "checkout",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"rules": rules(50, 50)}})),
        )
        .await
        .unwrap();
    tokio::time::sleep(DELAY + Duration::from_secs(6)).await;

    // Then: per-second shares from the raw counters: 0.1 until the delay has passed, 0.5 after.
    let start = written - 4_000;
    let end = now_ms();
    let q = format!(
        r#"istio_requests_total{{reporter="source", cluster="cluster-1", destination_service_namespace="{NS}", response_code="200"}}"#
    );
    let series = prometheus
        .query_range(&q, start, end, Duration::from_secs(1))
        .await
        .unwrap();
    let points = |svc: &str| -> Vec<(f64, f64)> {
        series
            .iter()
            .filter(|s| s.labels["destination_service_name"] == svc)
            .flat_map(|s| s.points.clone())
            .collect()
    };
    let (stable, canary) = (points(STABLE), points(CANARY));
    assert_eq!(stable.len(), canary.len(), "both series cover the range");
    let delay_ms = DELAY.as_millis() as f64;
    let (mut before, mut after) = (Vec::new(), Vec::new());
    for i in 1..stable.len() {
        let t_ms = stable[i].0 * 1000.0;
        let ds = stable[i].1 - stable[i - 1].1;
        let dc = canary[i].1 - canary[i - 1].1;
        if ds + dc <= 0.0 {
            continue;
        }
        let share = dc / (ds + dc);
        let since = t_ms - written as f64;
        if since <= delay_ms - 100.0 {
            before.push((since, share));
        } else if since - 1000.0 >= delay_ms + 2_500.0 {
            after.push((since, share));
        }
    }
    println!("before the delay (ms since write, share): {before:?}");
    println!("after the delay: {after:?}");
    assert!(
        before.len() >= 3 && after.len() >= 2,
        "too few intervals measured: {before:?} {after:?}"
    );
    for (since, share) in &before {
        assert!(
            (share - 0.10).abs() < 0.01,
            "{since} ms after the write, before the {DELAY:?} delay, share was {share}"
        );
    }
    for (since, share) in &after {
        assert!(
            (share - 0.50).abs() < 0.01,
            "{since} ms after the write the share was {share}, expected 0.5"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn proxies_per_revision_svids_nacks_and_drift_reach_prometheus() {
    let Some((emu, prometheus, world)) = given_a_world_at_90_10().await else {
        return;
    };
    // Given: namespace `shop` injected through tag `stable` → 1-27, and a 2-replica Deployment.
    emu.load_yaml(
        "apiVersion: admissionregistration.k8s.io/v1\nkind: MutatingWebhookConfiguration\nmetadata:\n  name: istio-revision-tag-stable\n  labels: {istio.io/tag: stable, istio.io/rev: 1-27}\n",
    )
    .unwrap();
    let client = emu.client();
    let nss: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(client.clone());
    nss.patch(
        NS,
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"labels": {"istio.io/rev": "stable"}}})),
    )
    .await
    .unwrap();
    let deploy: k8s_openapi::api::apps::v1::Deployment = serde_json::from_value(json!({
        "metadata": {"name": "checkout-v2-13", "namespace": NS},
        "spec": {"replicas": 2, "selector": {"matchLabels": {"app": "checkout"}},
                 "template": {"metadata": {"labels": {"app": "checkout"}}, "spec": {"containers": [{"name": "app", "image": "checkout:2.13"}]}}}
    }))
    .unwrap();
    Api::<k8s_openapi::api::apps::v1::Deployment>::namespaced(client.clone(), NS)
        .create(&PostParams::default(), &deploy)
        .await
        .unwrap();
    // When: a config commit is applied in the cluster.
    world.mesh().unwrap().config_applied("cluster-1", "abc123");

    // Then: Prometheus shows the proxies by injecting revision, the SVIDs, and drift converging.
    let value = |q: String| {
        let prometheus = &prometheus;
        async move {
            prometheus
                .query(&q, None)
                .await
                .unwrap()
                .first()
                .map(|s| s.value)
        }
    };
    eventually_every(
        "2 proxies and 2 SVIDs in cluster-1",
        Duration::from_secs(20),
        Duration::from_millis(500),
        async || {
            let proxies = value(r#"pilot_xds{cluster="cluster-1", revision="1-27"}"#.into()).await;
            let svids = value(
                r#"sum(citadel_server_success_cert_issuance_count{cluster="cluster-1"})"#.into(),
            )
            .await;
            if proxies == Some(2.0) && svids == Some(2.0) {
                Ok(())
            } else {
                Err(format!("proxies {proxies:?} svids {svids:?}"))
            }
        },
    )
    .await;
    let behind_max = value(
        r#"max_over_time(sluice_drift_proxies_behind{cluster="cluster-1", commit="abc123"}[1m])"#
            .into(),
    )
    .await;
    assert!(
        behind_max.is_some_and(|v| v >= 1.0),
        "drift never showed proxies behind: {behind_max:?}"
    );
    // The scenario's default convergence is 5 s.
    tokio::time::sleep(Duration::from_secs(7)).await;
    let behind =
        value(r#"sluice_drift_proxies_behind{cluster="cluster-1", commit="abc123"}"#.into()).await;
    let evaluated =
        value(r#"sluice_drift_proxies{cluster="cluster-1", commit="abc123"}"#.into()).await;
    assert_eq!((behind, evaluated), (Some(0.0), Some(2.0)));
    let pushes = value(r#"increase(pilot_xds_pushes{cluster="cluster-1"}[5s])"#.into()).await;
    assert!(
        pushes.is_some_and(|v| v > 2.0),
        "xDS pushes from the scenario: {pushes:?}"
    );
    let rejects = value(r#"pilot_total_xds_rejects{cluster="cluster-1"}"#.into()).await;
    assert_eq!(rejects, Some(0.0), "the world scenario has no NACKs");
}

/// A mesh fault injected at run time: Prometheus returns the share MeshErrorRatio reads
/// (`failure_origin="mesh"` over all source requests, crates/sluice-analysis/GATES.md), the
/// flagged-without-origin part stays empty, and the destination never sees the failed requests.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mesh_fault_shows_as_mesh_attributed_failures() {
    let Some((_emu, prometheus, world)) = given_a_world_at_90_10().await else {
        return;
    };
    tokio::time::sleep(Duration::from_secs(2)).await;
    world.mesh().unwrap().apply_now(sluice_sim::mesh::Event {
        cluster: Some("cluster-1".into()),
        mesh_failure_ratio: Some(0.2),
        mesh_failure_flag: Some(sluice_sim::mesh::scenario::ResponseFlag::URX),
        ..Default::default()
    });
    tokio::time::sleep(Duration::from_secs(8)).await;
    // Every query reads one instant, a little in the past, so a tick written
    // between two queries cannot make them disagree.
    let at = Some(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis() as i64
            - 2_000,
    );
    let one = |q: String| {
        let prometheus = &prometheus;
        async move {
            let v = prometheus.query(&q, at).await.unwrap();
            v.first().map_or(0.0, |s| s.value)
        }
    };
    let sel = r#"reporter="source", cluster="cluster-1""#;
    let requests = one(format!("sum(increase(istio_requests_total{{{sel}}}[5s]))")).await;
    let origin = one(format!(
        r#"sum(increase(istio_requests_total{{{sel}, failure_origin="mesh"}}[5s]))"#
    ))
    .await;
    let flagged = one(format!(
        r#"sum(increase(istio_requests_total{{{sel}, failure_origin="", response_flags!~"-|DC"}}[5s]))"#
    ))
    .await;
    let share = origin / requests;
    println!("mesh-attributed share measured in Prometheus: {share:.4} ({origin} of {requests})");
    assert!(
        requests > 500.0,
        "expected ~1000 requests in 5 s, got {requests}"
    );
    assert!(
        (share - 0.2).abs() < 0.01,
        "mesh-attributed share {share} not within 0.20 ± 0.01"
    );
    assert_eq!(
        flagged, 0.0,
        "failures carry their origin, so none counts as flagged"
    );
    let labels = prometheus
        .query(
            r#"istio_requests_total{reporter="source", cluster="cluster-1", failure_origin="mesh"}"#,
            None,
        )
        .await
        .unwrap();
    assert!(!labels.is_empty());
    for s in &labels {
        assert_eq!(
            (
                s.labels["response_flags"].as_str(),
                s.labels["response_code"].as_str()
            ),
            ("URX", "503"),
            "{s:?}"
        );
    }
    // The destination proxy never saw the failed requests.
    let missing = one(
        r#"sum(istio_requests_total{reporter="source", cluster="cluster-1"}) - sum(istio_requests_total{reporter="destination", cluster="cluster-1"})"#
            .to_string(),
    )
    .await;
    let failed = one(
        r#"sum(istio_requests_total{reporter="source", cluster="cluster-1", failure_origin="mesh"})"#
            .to_string(),
    )
    .await;
    assert!(
        failed > 0.0 && (missing - failed).abs() < 1e-6,
        "destination misses exactly the failed requests: {missing} vs {failed}"
    );
}
