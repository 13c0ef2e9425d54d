//! Gates read metrics through Thanos Query in production, over one Prometheus per cluster (each
//! with a Thanos sidecar and external labels `cluster` and `site`), with every store a
//! strict endpoint of `--endpoint.sd-config`. When one cluster's store is down, Thanos Query answers a query that does
//! not forbid it with the data of the stores left (a partial response, HTTP 200 with a warning):
//! a gate summing the fleet's errors would then judge on the clusters that still answer and could
//! pass. The source must never accept that: a query while a store is down is an error, which no
//! gate turns into a pass. Runs on real Prometheus and real Thanos
//! (`bash scripts/install-control-plane.sh` builds it).

use std::time::Duration;

use jiff::Timestamp;
use sluice_analysis::source::{MetricsSource, PrometheusConfig, PrometheusSource};
use sluice_testkit::prereq;
use sluice_testkit::prometheus::{Prometheus, now_ms};
use sluice_testkit::remote_write::Series;
use sluice_testkit::thanos;

async fn cluster(name: &str) -> Prometheus {
    let p = Prometheus::start_with_external_labels(&[("cluster", name), ("site", "east")])
        .await
        .expect("prometheus starts");
    let now = now_ms();
    p.write(&[Series::new("checkout_errors_total")
        .label("service", "checkout")
        .sample(now - 1_000, 1.0)])
        .await
        .expect("remote write");
    p
}

/// The fleet's errors as Thanos Query sums them, through the source the gates use.
async fn fleet_errors(source: &PrometheusSource) -> Result<f64, String> {
    let answer = source
        .query("sum(checkout_errors_total)", Timestamp::now())
        .await
        .map_err(|e| e.to_string())?;
    Ok(answer.iter().map(|s| s.value).sum())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_down_store_fails_the_query_instead_of_answering_from_the_rest() {
    if prereq::or_skip(thanos::binary()).is_none() {
        return;
    }
    // Given two clusters' Prometheus, each with a sidecar, under Thanos Query (strict endpoints).
    let a = cluster("east-1").await;
    let b = cluster("east-2").await;
    let sidecar_a = thanos::sidecar(&a).await.expect("sidecar a");
    let sidecar_b = thanos::sidecar(&b).await.expect("sidecar b");
    let query = thanos::query(&[sidecar_a.grpc_address(), sidecar_b.grpc_address()])
        .await
        .expect("thanos query");
    let mut config = PrometheusConfig::new(query.url());
    config.retries = 0;
    config.deadline = Duration::from_secs(10);
    let source = PrometheusSource::new(config.clone());
    // A source set to allow partial responses (as Thanos Query's own default does): Thanos then
    // answers from the stores left, with a warning naming the one that is down.
    let mut allowing = config;
    allowing.partial_response = Some(true);
    let allowing = PrometheusSource::new(allowing);

    // Both stores answer: the sum covers both clusters.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        match fleet_errors(&source).await {
            Ok(2.0) => break,
            other if std::time::Instant::now() > deadline => {
                panic!("Thanos Query never summed both stores: {other:?}")
            }
            _ => tokio::time::sleep(Duration::from_millis(250)).await,
        }
    }

    // When east-2's store goes down.
    sidecar_b.stop();

    // Then no query answers from east-1 alone: each one fails, for as long as the store is down.
    let until = std::time::Instant::now() + Duration::from_secs(15);
    let mut failures = 0;
    while std::time::Instant::now() < until {
        match fleet_errors(&source).await {
            Ok(v) => panic!(
                "a query answered {v} with east-2's store down (a partial response): a gate would judge on east-1 alone"
            ),
            Err(e) => {
                failures += 1;
                if failures == 1 {
                    println!("with a store down: {e}");
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    assert!(failures > 0);

    // Even where partial responses are allowed, an answer that carries Thanos' warning is not
    // used: the error names the warning, which reaches the gate's verdict message.
    let err = allowing
        .query("sum(checkout_errors_total)", Timestamp::now())
        .await
        .expect_err("a partial answer (east-1 alone) must not be used");
    println!("partial response allowed, a store down: {err}");
    assert_eq!(err.category(), "warnings", "{err}");
    assert!(
        err.to_string()
            .contains("answered with warnings, so the answer may be incomplete and is not used:"),
        "{err}"
    );
    drop(query);
    drop(sidecar_a);
}
