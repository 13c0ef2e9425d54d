//! Pin time for bundles of 50 and 500 objects (not in CI): BundlePin created → Pinned (every
//! object applied), signature verification and the Application's suspension included, on the
//! emulator with the real registry. Prints the median of a few runs per size.
//!
//! `cargo run --release -p sluice-revert --example pin_bench -- [sizes...] [--runs N]`

#[path = "../tests/support/mod.rs"]
mod support;

use std::time::{Duration, Instant};

use serde_json::json;
use sluice_api::v1alpha1::BundlePinPhase;
use support::*;

async fn one(n: usize, run: usize) -> Option<Duration> {
    let mut w = World::start().await?;
    let bad: Vec<String> = (0..n)
        .map(|i| route(&format!("route-{i:04}"), 90))
        .collect();
    let good: Vec<String> = (0..n)
        .map(|i| route(&format!("route-{i:04}"), 10))
        .collect();
    let (bad, _) = w.bundle(&bad, &format!("bad{run}"), Some(&w.signer)).await;
    let (good, _) = w
        .bundle(&good, &format!("good{run}"), Some(&w.signer))
        .await;
    w.application(APP, &bad.digest, json!({})).await;
    w.argo(APP);
    let apps = w.apps();
    let bad_digest = bad.digest.clone();
    eventually(Duration::from_secs(120), "the bad bundle synced", || {
        let apps = apps.clone();
        let bad_digest = bad_digest.clone();
        async move {
            apps.get(APP)
                .await
                .ok()?
                .is_synced_at(&bad_digest)
                .then_some(())
        }
    })
    .await;
    w.start_revert();
    // Let the controller's watch start before the clock does.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let started = Instant::now();
    // The bench pins a bundle Argo CD never ran for the Application.
    w.create_pin("bench", &good.digest, json!({"allowAnyRevision": true}))
        .await;
    let pins = w.pins();
    let status = eventually(Duration::from_secs(120), "Pinned", || {
        let pins = pins.clone();
        async move {
            let s = pins.get("bench").await.ok()?.status?;
            (s.phase == BundlePinPhase::Pinned).then_some(s)
        }
    })
    .await;
    let took = started.elapsed();
    // The stand-in Argo CD may still be finishing a stale sync tick, so the count the pin
    // recorded, not a live weight, is checked.
    assert_eq!(status.applied_objects as usize, n);
    Some(took)
}

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut runs = 3;
    let mut sizes = Vec::new();
    let mut it = args.iter();
    while let Some(a) = it.next() {
        if a == "--runs" {
            runs = it.next().and_then(|v| v.parse().ok()).unwrap_or(3);
        } else if let Ok(n) = a.parse() {
            sizes.push(n);
        }
    }
    if sizes.is_empty() {
        sizes = vec![50, 500];
    }
    for n in sizes {
        let mut times = Vec::new();
        for run in 0..runs {
            match one(n, run).await {
                Some(t) => times.push(t),
                None => return,
            }
        }
        times.sort();
        let median = times[times.len() / 2];
        println!(
            "objects={n} runs={runs} pin_ms median={} min={} max={}",
            median.as_millis(),
            times[0].as_millis(),
            times[times.len() - 1].as_millis()
        );
    }
}
