//! Batch benchmark: tick latency and queries per tick at 10, 100 and 1,000 active objects, each
//! with the three Rollout gates (applied share, 5xx vs stable, p99 vs stable), against a real
//! Prometheus fed with synthetic Istio series. Prints figures; asserts nothing about time.
//!
//! Run: `cargo run --release -p sluice-analysis --example batch_bench` (needs the Debian package
//! `prometheus`). Optional argument: ticks per size (default 10).

use std::time::{Duration, Instant};

use jiff::Timestamp;
use sluice_analysis::{Engine, EngineOptions, GateCheck, PrometheusConfig, PrometheusSource, Vars};
use sluice_api::v1alpha1::{BuiltinGate, Gate, Verdict};
use sluice_testkit::prometheus::{Prometheus, now_ms};
use sluice_testkit::remote_write::Series;

const MAX_OBJECTS: usize = 1_000;
const CLUSTERS: usize = 20;

fn requests(now: i64, cluster: &str, service: &str, code: &str, rps: f64) -> Series {
    Series::new("istio_requests_total")
        .label("reporter", "source")
        .label("cluster", cluster)
        .label("destination_service_namespace", "shop")
        .label("destination_service_name", service)
        .label("response_code", code)
        .label("response_flags", "-")
        .counter(now - 5 * 60_000, now, Duration::from_secs(15), 0.0, rps)
}

fn latency(now: i64, cluster: &str, service: &str) -> Vec<Series> {
    let mut out = Vec::new();
    for (le, share) in [("50", 0.6), ("100", 0.9), ("250", 0.99), ("+Inf", 1.0)] {
        out.push(
            Series::new("istio_request_duration_milliseconds_bucket")
                .label("reporter", "source")
                .label("cluster", cluster)
                .label("destination_service_namespace", "shop")
                .label("destination_service_name", service)
                .label("le", le)
                .counter(
                    now - 5 * 60_000,
                    now,
                    Duration::from_secs(15),
                    0.0,
                    10.0 * share,
                ),
        );
    }
    out.push(
        Series::new("istio_request_duration_milliseconds_count")
            .label("reporter", "source")
            .label("cluster", cluster)
            .label("destination_service_namespace", "shop")
            .label("destination_service_name", service)
            .counter(now - 5 * 60_000, now, Duration::from_secs(15), 0.0, 10.0),
    );
    out
}

fn checks(objects: usize) -> Vec<GateCheck> {
    let gates: Vec<_> = [
        BuiltinGate::AppliedShare,
        BuiltinGate::ErrorRatioVsStable,
        BuiltinGate::LatencyP99VsStable,
    ]
    .into_iter()
    .map(|b| {
        Gate::builtin(b.as_str().to_lowercase(), b)
            .resolve(None)
            .expect("built-in gates resolve")
    })
    .collect();
    (0..objects)
        .flat_map(|i| {
            let vars: Vars = [
                ("cluster", format!("c{}", i % CLUSTERS)),
                ("namespace", "shop".to_string()),
                ("canaryService", format!("svc{i}-canary")),
                ("stableService", format!("svc{i}-stable")),
            ]
            .into_iter()
            .map(|(k, v)| (k.to_string(), v))
            .collect();
            gates.iter().map(move |g| {
                let mut c = GateCheck::new(format!("Rollout shop/r{i}"), g.clone(), vars.clone());
                c.share_target = Some(0.25);
                c
            })
        })
        .collect()
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

#[tokio::main]
async fn main() {
    let ticks: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(10)
        .max(1);
    let prom = Prometheus::start().await.unwrap_or_else(|e| panic!("{e}"));
    let now = now_ms();
    let started = Instant::now();
    let mut series = Vec::new();
    for i in 0..MAX_OBJECTS {
        let cluster = format!("c{}", i % CLUSTERS);
        let canary = format!("svc{i}-canary");
        let stable = format!("svc{i}-stable");
        series.push(requests(now, &cluster, &canary, "200", 2.5));
        series.push(requests(now, &cluster, &stable, "200", 7.4));
        series.push(requests(now, &cluster, &stable, "503", 0.1));
        series.extend(latency(now, &cluster, &canary));
        series.extend(latency(now, &cluster, &stable));
    }
    let series_count = series.len();
    prom.write(&series).await.unwrap_or_else(|e| panic!("{e}"));
    println!(
        "prometheus {} loaded with {series_count} synthetic series in {:?}",
        prom.url(),
        started.elapsed()
    );

    let mut config = PrometheusConfig::new(prom.url());
    config.timeout = Duration::from_secs(30);
    let engine = Engine::new(PrometheusSource::new(config), EngineOptions::default())
        .expect("default options are valid");
    let at = Timestamp::from_millisecond(now).expect("now is a valid timestamp");
    println!(
        "{:>8} {:>8} {:>16} {:>14} {:>14} {:>16} {:>10}",
        "objects",
        "checks",
        "queries/tick",
        "median tick",
        "max tick",
        "median in query",
        "passing"
    );
    for objects in [10, 100, MAX_OBJECTS] {
        let checks = checks(objects);
        // One warm-up tick so the first size does not pay for cold caches.
        engine.tick(&checks, at).await;
        let before = prom
            .http_requests("/api/v1/query")
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        let mut times = Vec::with_capacity(ticks);
        let mut query_times = Vec::with_capacity(ticks);
        let mut passing = 0;
        let mut queries = 0;
        for _ in 0..ticks {
            let report = engine.tick(&checks, at).await;
            times.push(report.elapsed);
            query_times.push(report.query_time);
            queries = report.queries;
            passing = report
                .outcomes
                .iter()
                .filter(|o| o.verdict.as_ref().is_ok_and(|v| v.verdict == Verdict::Pass))
                .count();
        }
        let served = prom
            .http_requests("/api/v1/query")
            .await
            .unwrap_or_else(|e| panic!("{e}"))
            - before;
        println!(
            "{objects:>8} {:>8} {:>16} {:>14?} {:>14?} {:>16?} {:>10}",
            checks.len(),
            format!("{queries} ({:.1} seen)", served as f64 / ticks as f64),
            median(times.clone()),
            times.iter().max().copied().unwrap_or_default(),
            median(query_times),
            format!("{passing}/{}", checks.len()),
        );
    }
}
