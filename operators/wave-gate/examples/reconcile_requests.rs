//! Benchmark (not a test, not in CI): the API requests one wave-gate reconcile sends at a site's
//! size. On the API emulator, a site of `clusters × apps` Argo CD Applications owned by one
//! ApplicationSet and a WaveGate governing them; the operator's client counts every request
//! (method and resource, watches apart). Prints what starting the caches cost (the first
//! reconcile) and the requests per reconcile after it, in total and by kind.
//!
//! `cargo run -p sluice-wave-gate --example reconcile_requests -- [clusters] [apps per cluster]
//! [reconciles]` (defaults 20 × 100 = 2,000 Applications, 20 reconciles).

#[path = "../tests/support/requests.rs"]
mod requests;

use std::{sync::Arc, time::Instant};

use kube::Api;
use requests::{Counts, NS, counting_client};
use sluice_api::v1alpha1::WaveGate;
use sluice_runtime::events::EventRecorder;
use sluice_wave_gate::{OPERATOR, reconcile};

fn arg(i: usize, default: usize) -> usize {
    std::env::args()
        .nth(i)
        .and_then(|a| a.parse().ok())
        .unwrap_or(default)
}

#[tokio::main]
async fn main() {
    let clusters = arg(1, 20);
    let apps = arg(2, 100);
    let n = arg(3, 20).max(1);
    let Some(argocd) = sluice_testkit::prereq::or_skip(sluice_testkit::prereq::upstream_dir(
        sluice_testkit::prereq::Upstream::ArgoCd,
    )) else {
        eprintln!("Argo CD's CRDs are missing: bash scripts/install-tools.sh");
        std::process::exit(2);
    };
    let emu = kube_emulator::Emulator::start().await;
    let at = format!("sha256:{}", "a".repeat(64));
    requests::site(&emu, &argocd, clusters, apps, &at).await;
    let counts = Counts::default();
    let client = counting_client(&emu, &counts);
    let ctx = Arc::new(reconcile::Context::new(
        client.clone(),
        EventRecorder::new(client.clone(), OPERATOR),
    ));
    let plain: Api<WaveGate> = Api::namespaced(emu.client(), NS);
    let once = async || {
        let obj = plain.get("site").await.unwrap();
        reconcile::reconcile(Arc::new(obj), ctx.clone())
            .await
            .expect("the reconcile succeeds");
    };
    let started = Instant::now();
    once().await;
    let first = counts.snapshot();
    let first_took = started.elapsed();
    counts.reset();
    let started = Instant::now();
    for _ in 0..n {
        once().await;
    }
    let took = started.elapsed();
    let after = counts.snapshot();
    let total: u64 = after.values().sum();
    println!(
        "applications={} clusters={clusters} reconciles={n}",
        clusters * apps
    );
    println!(
        "first_reconcile requests={} ({first:?}) {:.1} ms",
        first.values().sum::<u64>(),
        first_took.as_secs_f64() * 1e3
    );
    println!(
        "requests_per_reconcile={:.2} reconcile_ms={:.1}",
        total as f64 / n as f64,
        took.as_secs_f64() * 1e3 / n as f64
    );
    for (k, v) in &after {
        println!("  {k}: {:.2} per reconcile", *v as f64 / n as f64);
    }
    emu.shutdown().await;
}
