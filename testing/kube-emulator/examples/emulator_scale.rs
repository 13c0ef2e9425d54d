//! Scale benchmark: one emulator holding 10,000 Rollouts, 10,000 HTTPRoutes and 40,000 pods
//! (counts overridable) with several watchers open, printing memory, write throughput, list
//! latency and watch delivery latency.
//!
//! Run: `cargo run --release -p kube-emulator --example emulator_scale [-- ROLLOUTS ROUTES PODS]`.
//! A benchmark binary, not a test: it prints figures and asserts nothing about time.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use futures::{StreamExt, TryStreamExt};
use kube::api::{
    Api, ApiResource, DynamicObject, GroupVersionKind, ListParams, Patch, PatchParams, PostParams,
};
use kube_emulator::Emulator;
use serde_json::{Value, json};

/// A minimal HTTPRoute CRD, used when the released one is not available.
const FALLBACK_ROUTE_CRD: &str = r#"
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata: {name: httproutes.gateway.networking.k8s.io}
spec:
  group: gateway.networking.k8s.io
  scope: Namespaced
  names: {plural: httproutes, singular: httproute, kind: HTTPRoute}
  versions:
  - name: v1
    served: true
    storage: true
    subresources: {status: {}}
    schema:
      openAPIV3Schema: {type: object, x-kubernetes-preserve-unknown-fields: true}
"#;

fn rss_mib() -> f64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        .map(|kb| kb / 1024.0)
        .unwrap_or(0.0)
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v.get(v.len() / 2).copied().unwrap_or_default()
}

fn p99(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v.get((v.len() * 99 / 100).min(v.len().saturating_sub(1)))
        .copied()
        .unwrap_or_default()
}

fn dynamic(
    client: &kube::Client,
    ns: &str,
    group: &str,
    version: &str,
    kind: &str,
    plural: &str,
) -> Api<DynamicObject> {
    Api::namespaced_with(
        client.clone(),
        ns,
        &ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(group, version, kind), plural),
    )
}

/// Creates `n` objects with at most `concurrency` requests in flight; returns the wall time.
async fn create_all(
    api: &Api<DynamicObject>,
    n: usize,
    concurrency: usize,
    make: impl Fn(usize) -> Value,
) -> Duration {
    let start = Instant::now();
    let objs: Vec<DynamicObject> = (0..n)
        .map(|i| serde_json::from_value(make(i)).expect("object"))
        .collect();
    futures::stream::iter(objs)
        .map(|o| {
            let api = api.clone();
            async move { api.create(&PostParams::default(), &o).await.map(|_| ()) }
        })
        .buffer_unordered(concurrency)
        .try_collect::<Vec<()>>()
        .await
        .unwrap_or_else(|e| panic!("create failed: {e}"));
    start.elapsed()
}

#[tokio::main(flavor = "multi_thread")]
async fn main() {
    let args: Vec<usize> = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .collect();
    let (n_rollouts, n_routes, n_pods) = (
        args.first().copied().unwrap_or(10_000),
        args.get(1).copied().unwrap_or(10_000),
        args.get(2).copied().unwrap_or(40_000),
    );
    let rss0 = rss_mib();
    let emu = Emulator::start().await;
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    emu.load_manifest_file(root.join("crds/rollouts.sluice.dev.yaml"))
        .expect("Rollout CRD loads");
    let upstream =
        root.join(".tools/crds/gateway-api-v1.6.1/gateway.networking.k8s.io_httproutes.yaml");
    let route_schema = if upstream.exists() {
        emu.load_manifest_file(&upstream)
            .expect("HTTPRoute CRD loads");
        "released Gateway API v1.6.1 schema (with its CEL rules)"
    } else {
        emu.load_yaml(FALLBACK_ROUTE_CRD)
            .expect("fallback HTTPRoute CRD loads");
        "schemaless fallback (released CRD absent)"
    };
    let client = emu.client();
    let namespaces = 20;
    let core: Api<DynamicObject> = Api::all_with(
        client.clone(),
        &ApiResource::from_gvk(&GroupVersionKind::gvk("", "v1", "Namespace")),
    );
    for i in 0..namespaces {
        let ns: DynamicObject =
            serde_json::from_value(json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": format!("team-{i}")}})).unwrap();
        core.create(&PostParams::default(), &ns)
            .await
            .expect("namespace");
    }
    println!(
        "kube-emulator scale benchmark: {n_rollouts} Rollouts, {n_routes} HTTPRoutes ({route_schema}), {n_pods} pods in {namespaces} namespaces"
    );

    // Watchers open during the load: they must keep up with every event.
    let seen = Arc::new(AtomicU64::new(0));
    let mut watchers = Vec::new();
    for (group, version, kind, plural, selector) in [
        ("", "v1", "Pod", "pods", None),
        ("", "v1", "Pod", "pods", Some("app=app-3")),
        ("sluice.dev", "v1alpha1", "Rollout", "rollouts", None),
        (
            "gateway.networking.k8s.io",
            "v1",
            "HTTPRoute",
            "httproutes",
            None,
        ),
    ] {
        let api: Api<DynamicObject> = Api::all_with(
            client.clone(),
            &ApiResource::from_gvk_with_plural(
                &GroupVersionKind::gvk(group, version, kind),
                plural,
            ),
        );
        let mut cfg = kube::runtime::watcher::Config::default();
        if let Some(s) = selector {
            cfg = cfg.labels(s);
        }
        let seen = seen.clone();
        watchers.push(tokio::spawn(async move {
            let stream = kube::runtime::watcher(api, cfg);
            futures::pin_mut!(stream);
            while let Some(ev) = stream.next().await {
                if let Ok(kube::runtime::watcher::Event::Apply(_)) = ev {
                    seen.fetch_add(1, Ordering::Relaxed);
                }
            }
        }));
    }
    tokio::time::sleep(Duration::from_millis(300)).await;

    // Bulk load straight into the API layer (same write path as HTTP: defaulting, validation,
    // managedFields, watch events), then measure HTTP writes on a sample.
    let state = emu.state().clone();
    let pod = |ns: &str, i: usize| {
        json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": format!("pod-{i}"), "namespace": ns, "labels": {"app": format!("app-{}", i % 50)},
            "annotations": {"sidecar.istio.io/status": "{\"revision\":\"1-24-0\"}"}},
            "spec": {"containers": [{"name": "app", "image": "registry.example/app:1"}, {"name": "istio-proxy", "image": "proxyv2:1.24.0"}]},
            "status": {"phase": "Running"}})
    };
    let route = |ns: &str, i: usize| {
        json!({"apiVersion": "gateway.networking.k8s.io/v1", "kind": "HTTPRoute", "metadata": {"name": format!("route-{i}"), "namespace": ns},
            "spec": {"parentRefs": [{"name": "mesh-gw"}], "hostnames": [format!("svc-{i}.example")],
            "rules": [{"backendRefs": [{"name": format!("svc-{i}-stable"), "port": 80, "weight": 90}, {"name": format!("svc-{i}-canary"), "port": 80, "weight": 10}]}]}})
    };
    let rollout = |ns: &str, i: usize| {
        json!({"apiVersion": "sluice.dev/v1alpha1", "kind": "Rollout", "metadata": {"name": format!("rollout-{i}"), "namespace": ns},
            "spec": {"routeRef": {"name": format!("route-{i}")}, "stableService": {"name": format!("svc-{i}-stable")},
            "canaryService": {"name": format!("svc-{i}-canary")}, "canaryWorkload": {"name": format!("app-{i}-canary")},
            "steps": [{"setWeight": {"weight": 10}}, {"setWeight": {"weight": 50}}]}})
    };
    type Make<'a> = &'a dyn Fn(&str, usize) -> Value;
    let kinds: [(&str, &str, &str, &str, usize, Make); 3] = [
        ("pods", "", "v1", "pods", n_pods, &pod),
        (
            "HTTPRoutes",
            "gateway.networking.k8s.io",
            "v1",
            "httproutes",
            n_routes,
            &route,
        ),
        (
            "Rollouts",
            "sluice.dev",
            "v1alpha1",
            "rollouts",
            n_rollouts,
            &rollout,
        ),
    ];
    for (label, group, version, plural, n, make) in kinds {
        let t = Instant::now();
        tokio::task::block_in_place(|| {
            for i in 0..n {
                let ns = format!("team-{}", i % namespaces);
                state
                    .create_as_admin(group, version, plural, make(&ns, i))
                    .unwrap_or_else(|e| panic!("{label} {i}: {e}"));
            }
        });
        let el = t.elapsed();
        println!(
            "load {n:>6} {label:<11} {el:>9.2?} ({:.0}/s, in process)",
            n as f64 / el.as_secs_f64()
        );
    }
    let sample = 2_000.min(n_pods.max(1));
    let api = dynamic(&client, "team-0", "", "v1", "Pod", "pods");
    let t = create_all(&api, sample, 32, |i| pod("team-0", 1_000_000 + i)).await;
    println!(
        "create {sample:>5} pods over HTTP  {t:>9.2?} ({:.0}/s, 32 in flight)",
        sample as f64 / t.as_secs_f64()
    );
    let n_pods = n_pods + sample;
    tokio::time::sleep(Duration::from_secs(1)).await;
    println!(
        "watch events delivered:     {} (4 watchers; expected at least {})",
        seen.load(Ordering::Relaxed),
        n_pods + n_pods / 50 + n_routes + n_rollouts
    );
    let rss = rss_mib();
    println!(
        "resident memory:            {rss:.0} MiB (before start {rss0:.0} MiB; {:.1} KiB per object)",
        (rss - rss0) * 1024.0 / (n_pods + n_routes + n_rollouts) as f64
    );

    // List latency.
    for (label, api, lp) in [
        (
            "list all pods",
            Api::<DynamicObject>::all_with(
                client.clone(),
                &ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk("", "v1", "Pod"), "pods"),
            ),
            ListParams::default(),
        ),
        (
            "list pods app=app-3",
            Api::all_with(
                client.clone(),
                &ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk("", "v1", "Pod"), "pods"),
            ),
            ListParams::default().labels("app=app-3"),
        ),
        (
            "list pods, 500 per page",
            Api::all_with(
                client.clone(),
                &ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk("", "v1", "Pod"), "pods"),
            ),
            ListParams::default().limit(500),
        ),
        (
            "list all Rollouts",
            Api::all_with(
                client.clone(),
                &ApiResource::from_gvk_with_plural(
                    &GroupVersionKind::gvk("sluice.dev", "v1alpha1", "Rollout"),
                    "rollouts",
                ),
            ),
            ListParams::default(),
        ),
        (
            "list HTTPRoutes in one ns",
            dynamic(
                &client,
                "team-0",
                "gateway.networking.k8s.io",
                "v1",
                "HTTPRoute",
                "httproutes",
            ),
            ListParams::default(),
        ),
    ] {
        let mut samples = Vec::new();
        let mut count = 0;
        for _ in 0..3 {
            let t = Instant::now();
            let mut lp = lp.clone();
            count = 0;
            loop {
                let page = api.list(&lp).await.expect("list");
                count += page.items.len();
                match page.metadata.continue_ {
                    Some(c) if lp.limit.is_some() => lp = lp.continue_token(&c),
                    _ => break,
                }
            }
            samples.push(t.elapsed());
        }
        println!(
            "{label:<27} {count:>6} items, median {:>8.2?}",
            median(samples)
        );
    }

    // Watch latency: a patch until every relevant watcher has seen it.
    let rollouts = dynamic(
        &client,
        "team-0",
        "sluice.dev",
        "v1alpha1",
        "Rollout",
        "rollouts",
    );
    let watch = Api::<DynamicObject>::all_with(
        client.clone(),
        &ApiResource::from_gvk_with_plural(
            &GroupVersionKind::gvk("sluice.dev", "v1alpha1", "Rollout"),
            "rollouts",
        ),
    );
    let mut samples = Vec::new();
    let stream = watch
        .watch(&kube::api::WatchParams::default().timeout(120), "0")
        .await
        .expect("watch");
    futures::pin_mut!(stream);
    // Drain the initial ADDED events.
    let mut initial = 0;
    while initial < n_rollouts {
        if let Ok(Some(_)) = stream.try_next().await {
            initial += 1;
        }
    }
    for i in 0..50 {
        let t = Instant::now();
        rollouts
            .patch(
                "rollout-0",
                &PatchParams::default(),
                &Patch::Merge(json!({"metadata": {"annotations": {"bench": i.to_string()}}})),
            )
            .await
            .expect("patch");
        loop {
            match stream.try_next().await {
                Ok(Some(kube::api::WatchEvent::Modified(o)))
                    if o.metadata.annotations.as_ref().and_then(|a| a.get("bench"))
                        == Some(&i.to_string()) =>
                {
                    break;
                }
                Ok(Some(_)) => continue,
                other => panic!("watch ended: {other:?}"),
            }
        }
        samples.push(t.elapsed());
    }
    println!(
        "patch→watch event (50x):    median {:>8.2?}, p99 {:>8.2?}",
        median(samples.clone()),
        p99(samples)
    );
    for w in watchers {
        w.abort();
    }
    emu.shutdown().await;
}
