//! End-to-end gate scenarios against a real Prometheus fed with synthetic Istio series:
//! every verdict path, batching equivalence, query counts per tick, and injection attempts.

use std::collections::BTreeMap;
use std::time::Duration;

use jiff::Timestamp;
use sluice_analysis::builtin;
use sluice_analysis::{
    CheckOutcome, Engine, EngineOptions, GateCheck, MannWhitneyOptions, Observation,
    PrometheusConfig, PrometheusSource, TickReport, Vars,
};
use sluice_api::v1alpha1::{
    BaselineSource, BuiltinGate, Comparison, ComparisonOp, Gate, GateDefinition, GateTemplateSpec,
    GateVerdict, ResolvedGate, Verdict, VerdictReason,
};
use sluice_testkit::prometheus::{Prometheus, now_ms};
use sluice_testkit::remote_write::Series;

const STEP: Duration = Duration::from_secs(15);
const HISTORY_MS: i64 = 10 * 60_000;

/// Given: a real Prometheus and a clock fixed at the moment the synthetic series end.
struct World {
    prom: Prometheus,
    now_ms: i64,
}

impl World {
    async fn start() -> Self {
        let prom = Prometheus::start()
            .await
            .expect("the Prometheus fixture starts (apt package `prometheus`)");
        Self {
            prom,
            now_ms: now_ms(),
        }
    }

    fn now(&self) -> Timestamp {
        Timestamp::from_millisecond(self.now_ms).unwrap()
    }

    fn engine(&self) -> Engine<PrometheusSource> {
        self.engine_with(EngineOptions::default())
    }

    fn engine_with(&self, options: EngineOptions) -> Engine<PrometheusSource> {
        let mut config = PrometheusConfig::new(self.prom.url());
        config.timeout = Duration::from_secs(20);
        Engine::new(PrometheusSource::new(config), options).unwrap()
    }

    async fn write(&self, series: Vec<Series>) {
        self.prom.write(&series).await.expect("remote write");
    }

    async fn query_requests(&self) -> u64 {
        self.prom.http_requests("/api/v1/query").await.unwrap()
    }
}

/// A source-reported request counter for one service, response code and flag, at `rps`.
fn requests(now: i64, cluster: &str, service: &str, code: &str, flags: &str, rps: f64) -> Series {
    Series::new("istio_requests_total")
        .label("reporter", "source")
        .label("cluster", cluster)
        .label("destination_service_namespace", "shop")
        .label("destination_service_name", service)
        .label(
            "destination_version",
            if service.ends_with("canary") {
                "v2"
            } else {
                "v1"
            },
        )
        .label("response_code", code)
        .label("response_flags", flags)
        .counter(now - HISTORY_MS, now, STEP, 0.0, rps)
}

/// Traffic of one service: `rps` requests per second of which `error_ratio` are 503s.
fn traffic(now: i64, cluster: &str, service: &str, rps: f64, error_ratio: f64) -> Vec<Series> {
    let mut out = vec![requests(
        now,
        cluster,
        service,
        "200",
        "-",
        rps * (1.0 - error_ratio),
    )];
    if error_ratio > 0.0 {
        out.push(requests(
            now,
            cluster,
            service,
            "503",
            "-",
            rps * error_ratio,
        ));
    }
    out
}

fn vars(pairs: &[(&str, &str)]) -> Vars {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn rollout_vars(cluster: &str, name: &str) -> Vars {
    vars(&[
        ("cluster", cluster),
        ("namespace", "shop"),
        ("canaryService", &format!("{name}-canary")),
        ("stableService", &format!("{name}-stable")),
    ])
}

fn builtin_gate(gate: BuiltinGate, tune: impl FnOnce(&mut ResolvedGate)) -> ResolvedGate {
    let mut spec = Gate::builtin(gate.as_str().to_lowercase(), gate);
    if gate.default_comparison().is_none() {
        // Readings have no default judgement; tests that use them set their own below.
        spec.definition.comparison = Some(Comparison::absolute(ComparisonOp::GreaterOrEqual, 0.0));
    }
    let mut g = spec.resolve(None).unwrap();
    tune(&mut g);
    g
}

fn check(owner: &str, gate: ResolvedGate, vars: Vars) -> GateCheck {
    GateCheck::new(owner, gate, vars)
}

fn verdict(outcome: &CheckOutcome) -> &GateVerdict {
    outcome
        .verdict
        .as_ref()
        .unwrap_or_else(|e| panic!("check could not be planned: {e}"))
}

fn summary(report: &TickReport) -> Vec<(Verdict, VerdictReason)> {
    report
        .outcomes
        .iter()
        .map(verdict)
        .map(|v| (v.verdict, v.reason))
        .collect()
}

#[tokio::test]
async fn error_ratio_vs_stable_passes_then_fails_after_consecutive_breaches() {
    let w = World::start().await;
    let n = w.now_ms;
    let mut series = Vec::new();
    // good: canary 1% 5xx, stable 1%; bad: canary 10% 5xx, stable 1%.
    series.extend(traffic(n, "c1", "good-canary", 5.0, 0.01));
    series.extend(traffic(n, "c1", "good-stable", 5.0, 0.01));
    series.extend(traffic(n, "c1", "bad-canary", 5.0, 0.10));
    series.extend(traffic(n, "c1", "bad-stable", 5.0, 0.01));
    w.write(series).await;
    let gate = builtin_gate(BuiltinGate::ErrorRatioVsStable, |_| {});
    let mut checks = vec![
        check(
            "Rollout shop/good",
            gate.clone(),
            rollout_vars("c1", "good"),
        ),
        check("Rollout shop/bad", gate, rollout_vars("c1", "bad")),
    ];
    let engine = w.engine();

    // When: the first tick.
    let first = engine.tick(&checks, w.now()).await;
    // Then: good passes; bad has breached once (Inconclusive until the second breach).
    assert_eq!(
        summary(&first),
        [
            (Verdict::Pass, VerdictReason::ThresholdMet),
            (Verdict::Inconclusive, VerdictReason::ThresholdBreached)
        ]
    );
    let bad = verdict(&first.outcomes[1]);
    assert!(
        (bad.value.unwrap() - 0.10).abs() < 0.005,
        "canary ratio {:?}",
        bad.value
    );
    assert!(
        (bad.baseline.unwrap() - 0.01).abs() < 0.002,
        "stable ratio {:?}",
        bad.baseline
    );
    assert!((bad.threshold.unwrap() - 0.015).abs() < 0.003);
    assert!(
        bad.samples.unwrap() >= 500,
        "about 600 requests in 2m: {:?}",
        bad.samples
    );

    // When: the second tick, carrying the verdicts as the owner's status would.
    for (c, o) in checks.iter_mut().zip(&first.outcomes) {
        c.previous = Some(verdict(o).clone());
    }
    let second = engine.tick(&checks, w.now()).await;
    assert_eq!(
        summary(&second),
        [
            (Verdict::Pass, VerdictReason::ThresholdMet),
            (Verdict::Fail, VerdictReason::ThresholdBreached)
        ]
    );
    assert_eq!(verdict(&second.outcomes[1]).consecutive_failures, 2);
    assert_eq!(
        second.queries, 1,
        "both objects and both roles share one query"
    );
}

/// A gRPC request counter as Istio reports it: `request_protocol="grpc"`, the HTTP status in
/// `response_code` (200 for every answer that reached the application) and the gRPC status code
/// in `grpc_response_status`.
fn grpc_requests(
    now: i64,
    cluster: &str,
    service: &str,
    http_code: &str,
    grpc_status: &str,
    rps: f64,
) -> Series {
    requests(now, cluster, service, http_code, "-", rps)
        .label("request_protocol", "grpc")
        .label("grpc_response_status", grpc_status)
}

#[tokio::test]
async fn a_grpc_canary_answering_unavailable_on_http_200_fails_error_ratio_vs_stable() {
    let w = World::start().await;
    let n = w.now_ms;
    let series = vec![
        // bad: the canary answers 10% UNAVAILABLE (14) on HTTP 200, the stable 1%.
        grpc_requests(n, "c1", "bad-canary", "200", "0", 4.5),
        grpc_requests(n, "c1", "bad-canary", "200", "14", 0.5),
        grpc_requests(n, "c1", "bad-stable", "200", "0", 4.95),
        grpc_requests(n, "c1", "bad-stable", "200", "14", 0.05),
        // good: 20% NOT_FOUND (5) is the clients' business, not an error; Envoy's own UNAVAILABLE
        // (HTTP 503 carrying grpc-status 14) counts once, on each side at 1%.
        grpc_requests(n, "c1", "good-canary", "200", "0", 3.95),
        grpc_requests(n, "c1", "good-canary", "200", "5", 1.0),
        grpc_requests(n, "c1", "good-canary", "503", "14", 0.05),
        grpc_requests(n, "c1", "good-stable", "200", "0", 4.95),
        grpc_requests(n, "c1", "good-stable", "503", "14", 0.05),
    ];
    w.write(series).await;
    let gate = builtin_gate(BuiltinGate::ErrorRatioVsStable, |_| {});
    let mut checks = vec![
        check(
            "Rollout shop/good",
            gate.clone(),
            rollout_vars("c1", "good"),
        ),
        check("Rollout shop/bad", gate, rollout_vars("c1", "bad")),
    ];
    let engine = w.engine();

    let first = engine.tick(&checks, w.now()).await;
    let good = verdict(&first.outcomes[0]);
    assert!(
        (good.value.unwrap() - 0.01).abs() < 0.003,
        "NOT_FOUND is no error and a 503 is counted once: {:?}",
        good.value
    );
    let bad = verdict(&first.outcomes[1]);
    assert!(
        (bad.value.unwrap() - 0.10).abs() < 0.01,
        "UNAVAILABLE on HTTP 200 is an error: {:?}",
        bad.value
    );
    assert!(
        (bad.baseline.unwrap() - 0.01).abs() < 0.003,
        "stable ratio {:?}",
        bad.baseline
    );
    for (c, o) in checks.iter_mut().zip(&first.outcomes) {
        c.previous = Some(verdict(o).clone());
    }
    let second = engine.tick(&checks, w.now()).await;
    assert_eq!(
        summary(&second),
        [
            (Verdict::Pass, VerdictReason::ThresholdMet),
            (Verdict::Fail, VerdictReason::ThresholdBreached)
        ]
    );
    assert_eq!(second.queries, 1, "gRPC and HTTP errors share one query");
}

#[tokio::test]
async fn too_few_samples_and_no_data_are_inconclusive_never_pass() {
    let w = World::start().await;
    let n = w.now_ms;
    let mut series = traffic(n, "c1", "quiet-canary", 0.1, 0.0);
    series.extend(traffic(n, "c1", "quiet-stable", 0.1, 0.0));
    w.write(series).await;
    // A comparison any value would meet, so only the sample rules can stop a Pass.
    let lenient = builtin_gate(BuiltinGate::ErrorRatioVsStable, |g| {
        g.comparison = Comparison::absolute(ComparisonOp::GreaterOrEqual, 0.0);
    });
    let checks = vec![
        check(
            "Rollout shop/quiet",
            lenient.clone(),
            rollout_vars("c1", "quiet"),
        ),
        check(
            "Rollout shop/absent",
            lenient.clone(),
            rollout_vars("c1", "absent"),
        ),
        check(
            "Rollout shop/other-cluster",
            lenient,
            rollout_vars("c9", "quiet"),
        ),
    ];
    let report = w.engine().tick(&checks, w.now()).await;
    assert_eq!(
        summary(&report),
        [
            (Verdict::Inconclusive, VerdictReason::TooFewSamples),
            (Verdict::Inconclusive, VerdictReason::NoData),
            (Verdict::Inconclusive, VerdictReason::NoData),
        ]
    );
    let quiet = verdict(&report.outcomes[0]);
    assert_eq!(quiet.min_samples, Some(100));
    assert!(
        quiet.samples.unwrap() < 20,
        "12 requests in 2m: {:?}",
        quiet.samples
    );
}

#[tokio::test]
async fn applied_share_within_twenty_percent_and_mirrored_copies_do_not_count() {
    let w = World::start().await;
    let n = w.now_ms;
    let mut series = Vec::new();
    // 25% of 40 rps to the canary, as the source reporter sees it.
    series.extend(traffic(n, "c1", "pay-canary", 10.0, 0.0));
    series.extend(traffic(n, "c1", "pay-stable", 30.0, 0.0));
    // Mirrored copies arrive at the canary and are reported by the destination only.
    series.push(
        Series::new("istio_requests_total")
            .label("reporter", "destination")
            .label("cluster", "c1")
            .label("destination_service_namespace", "shop")
            .label("destination_service_name", "pay-canary")
            .label("response_code", "200")
            .label("response_flags", "-")
            .counter(n - HISTORY_MS, n, STEP, 0.0, 30.0),
    );
    w.write(series).await;
    let gate = builtin_gate(BuiltinGate::AppliedShare, |g| g.consecutive_failures = 1);
    let with_target = |target: f64| {
        let mut c = check("Rollout shop/pay", gate.clone(), rollout_vars("c1", "pay"));
        c.share_target = Some(target);
        c
    };
    let checks = vec![
        with_target(0.25),
        with_target(0.29),
        with_target(0.40),
        with_target(0.05),
        with_target(0.001),
    ];
    let report = w.engine().tick(&checks, w.now()).await;
    assert_eq!(
        summary(&report),
        [
            (Verdict::Pass, VerdictReason::WithinTolerance),
            (Verdict::Pass, VerdictReason::WithinTolerance),
            (Verdict::Fail, VerdictReason::OutsideTolerance),
            (Verdict::Fail, VerdictReason::OutsideTolerance),
            // 0.1% at ±20% needs ~96,000 requests; 4,800 were seen.
            (Verdict::Inconclusive, VerdictReason::TooFewSamples),
        ]
    );
    let share = verdict(&report.outcomes[0]).value.unwrap();
    assert!(
        (share - 0.25).abs() < 0.01,
        "share {share} must ignore the mirrored copies"
    );
    assert_eq!(report.queries, 1);
}

/// A request counter with every label given (`reporter` first), at `rps`.
fn counter(now: i64, labels: &[(&str, &str)], rps: f64) -> Series {
    let mut s = Series::new("istio_requests_total");
    for (k, v) in labels {
        s = s.label(*k, *v);
    }
    s.counter(now - HISTORY_MS, now, STEP, 0.0, rps)
}

#[tokio::test]
async fn scoped_service_gates_count_the_named_clients_and_the_mirror_at_its_destination() {
    let w = World::start().await;
    let n = w.now_ms;
    let source = |service: &str, client: &str, ns: &str, code: &str, rps: f64| {
        counter(
            n,
            &[
                ("reporter", "source"),
                ("cluster", "c1"),
                ("source_workload", client),
                ("source_workload_namespace", ns),
                ("destination_service_namespace", "shop"),
                ("destination_service_name", service),
                ("response_code", code),
            ],
            rps,
        )
    };
    let destination = |workload: &str, host: &str, code: &str, rps: f64| {
        counter(
            n,
            &[
                ("reporter", "destination"),
                ("cluster", "c1"),
                ("source_workload", "gw"),
                ("source_workload_namespace", "istio-system"),
                ("destination_service_namespace", "shop"),
                ("destination_service_name", host),
                ("destination_workload", workload),
                ("destination_workload_namespace", "shop"),
                ("response_code", code),
            ],
            rps,
        )
    };
    w.write(vec![
        // Through the gateway: 25% to the canary. East-west callers add 60 rps to the stable.
        source("pay-canary", "gw", "istio-system", "200", 10.0),
        source("pay-stable", "gw", "istio-system", "200", 30.0),
        source("pay-stable", "orders", "shop", "200", 60.0),
        // A client named like the gateway in another namespace is not the gateway.
        source("pay-canary", "gw", "shop", "200", 40.0),
        // The stable's own proxies: 2% 5xx; the canary's mirrored copies (shadow host): 10% 5xx.
        destination("pay-v1", "pay-stable", "200", 29.4),
        destination("pay-v1", "pay-stable", "503", 0.6),
        destination("pay-v2", "pay.shop.svc.cluster.local-shadow", "200", 27.0),
        destination("pay-v2", "pay.shop.svc.cluster.local-shadow", "503", 3.0),
    ])
    .await;
    let gateway = builtin::SourceWorkloads {
        workloads: vec!["gw".into()],
        namespace: Some("istio-system".into()),
    };
    let mut vars = rollout_vars("c1", "pay");
    vars.insert("canaryWorkload".into(), "pay-v2".into());
    vars.insert("stableWorkload".into(), "pay-v1".into());
    let share = builtin_gate(BuiltinGate::AppliedShare, |g| g.consecutive_failures = 1);
    let errors = builtin_gate(BuiltinGate::ErrorRatioVsStable, |g| {
        g.consecutive_failures = 1
    });
    let scoped = |gate: &ResolvedGate, scope: builtin::ServiceScope| {
        let mut c = check("Rollout shop/pay", gate.clone(), vars.clone());
        c.share_target = Some(0.25);
        c.scope = scope;
        c
    };
    let everyone = builtin::ServiceScope::default();
    let through_gateway = builtin::ServiceScope {
        reporter: builtin::Reporter::Source,
        sources: Some(gateway.clone()),
    };
    let mirror = builtin::ServiceScope {
        reporter: builtin::Reporter::Destination,
        sources: Some(gateway),
    };
    let checks = vec![
        scoped(&share, everyone.clone()),
        scoped(&share, through_gateway),
        scoped(&errors, everyone),
        scoped(&errors, mirror.clone()),
        scoped(&share, mirror),
    ];
    let report = w.engine().tick(&checks, w.now()).await;
    let value = |i: usize| verdict(&report.outcomes[i]).value.unwrap();
    // Every source: (10 + 40) of 140 rps; through the gateway only: 10 of 40.
    assert!((value(0) - 50.0 / 140.0).abs() < 0.01, "{}", value(0));
    assert_eq!(verdict(&report.outcomes[0]).verdict, Verdict::Fail);
    assert!((value(1) - 0.25).abs() < 0.01, "{}", value(1));
    assert_eq!(
        verdict(&report.outcomes[1]).verdict,
        Verdict::Pass,
        "{:?}",
        verdict(&report.outcomes[1])
    );
    // On the source reporter the mirrored canary has no 5xx to show; at its destination it has
    // 10% against the stable's 2%.
    assert_eq!(verdict(&report.outcomes[2]).value, Some(0.0));
    let mirrored = verdict(&report.outcomes[3]);
    assert!(
        (mirrored.value.unwrap() - 0.1).abs() < 0.005,
        "{mirrored:?}"
    );
    assert!(
        (mirrored.baseline.unwrap() - 0.02).abs() < 0.002,
        "{mirrored:?}"
    );
    assert_eq!(mirrored.verdict, Verdict::Fail, "{mirrored:?}");
    // The share never counts mirrored copies, whatever the view.
    assert!((value(4) - 0.25).abs() < 0.01, "{}", value(4));
}

#[tokio::test]
async fn query_error_provider_down_and_slow_provider_are_inconclusive() {
    let w = World::start().await;
    w.write(traffic(w.now_ms, "c1", "api-canary", 5.0, 0.0))
        .await;
    // A cluster-scoped template with a syntax error: Prometheus rejects it with bad_data.
    let template = GateTemplateSpec {
        description: None,
        definition: GateDefinition {
            promql: Some(
                r#"sum by ({{by}}) (rate(istio_requests_total{cluster="{{cluster}}"}[{{window}}])"#
                    .into(),
            ),
            comparison: Some(Comparison::absolute(ComparisonOp::GreaterOrEqual, 0.0)),
            min_samples: Some(0),
            ..GateDefinition::default()
        },
        variables: BTreeMap::new(),
        locked: false,
    };
    let gate = Gate {
        name: "broken".into(),
        template_ref: Some("broken".into()),
        definition: GateDefinition::default(),
        variables: BTreeMap::new(),
    }
    .resolve(Some(&template))
    .unwrap();
    let report = w
        .engine()
        .tick(
            &[check("WaveGate argocd/a", gate, vars(&[("cluster", "c1")]))],
            w.now(),
        )
        .await;
    let v = verdict(&report.outcomes[0]);
    assert_eq!(
        (v.verdict, v.reason),
        (Verdict::Inconclusive, VerdictReason::QueryError)
    );
    assert!(
        v.message.as_deref().unwrap().contains("bad_data"),
        "{:?}",
        v.message
    );
    assert_eq!(report.failed_queries, 1);

    let lenient = builtin_gate(BuiltinGate::ErrorRatioVsStable, |g| {
        g.comparison = Comparison::absolute(ComparisonOp::GreaterOrEqual, 0.0);
        g.min_samples = 0;
    });
    let checks = [check(
        "Rollout shop/api",
        lenient,
        rollout_vars("c1", "api"),
    )];

    // Provider down: nothing listens on the port.
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let down_url = format!("http://{}", closed.local_addr().unwrap());
    drop(closed);
    let mut config = PrometheusConfig::new(down_url);
    config.retries = 2;
    config.backoff = Duration::from_millis(10);
    let down = Engine::new(PrometheusSource::new(config), EngineOptions::default()).unwrap();
    let report = down.tick(&checks, w.now()).await;
    let v = verdict(&report.outcomes[0]);
    assert_eq!(
        (v.verdict, v.reason),
        (Verdict::Inconclusive, VerdictReason::QueryError)
    );
    assert_eq!(
        down.source().requests_sent(),
        3,
        "one attempt and two retries"
    );

    // Provider slow: accepts connections and never answers.
    let slow = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let slow_url = format!("http://{}", slow.local_addr().unwrap());
    let hold = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((socket, _)) = slow.accept().await {
            held.push(socket);
        }
    });
    let mut config = PrometheusConfig::new(slow_url);
    config.timeout = Duration::from_millis(300);
    config.retries = 1;
    config.backoff = Duration::from_millis(10);
    let slow_engine = Engine::new(PrometheusSource::new(config), EngineOptions::default()).unwrap();
    let started = std::time::Instant::now();
    let report = slow_engine.tick(&checks, w.now()).await;
    let v = verdict(&report.outcomes[0]);
    assert_eq!(
        (v.verdict, v.reason),
        (Verdict::Inconclusive, VerdictReason::Timeout)
    );
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "the tick gave up after its timeouts"
    );
    hold.abort();
}

#[tokio::test]
async fn batched_result_equals_per_object_result() {
    let w = World::start().await;
    let n = w.now_ms;
    let mut series = Vec::new();
    for i in 0..20 {
        let cluster = format!("c{}", i % 3);
        let rps = 1.0 + i as f64;
        series.extend(traffic(
            n,
            &cluster,
            &format!("s{i}-canary"),
            rps,
            0.002 * i as f64,
        ));
        series.extend(traffic(
            n,
            &cluster,
            &format!("s{i}-stable"),
            2.0 * rps,
            0.01,
        ));
    }
    w.write(series).await;
    let gates = [
        builtin_gate(BuiltinGate::ErrorRatioVsStable, |_| {}),
        builtin_gate(BuiltinGate::AppliedShare, |_| {}),
        builtin_gate(BuiltinGate::MeshErrorRatio, |_| {}),
    ];
    let checks: Vec<GateCheck> = (0..20)
        .flat_map(|i| {
            gates.iter().map(move |g| {
                let mut c = check(
                    &format!("Rollout shop/s{i}"),
                    g.clone(),
                    rollout_vars(&format!("c{}", i % 3), &format!("s{i}")),
                );
                c.share_target = Some(1.0 / 3.0);
                c
            })
        })
        .collect();
    let engine = w.engine();
    let batched = engine.tick(&checks, w.now()).await;
    assert_eq!(batched.queries, gates.len());
    let mut distinct = std::collections::BTreeSet::new();
    for (c, b) in checks.iter().zip(&batched.outcomes) {
        let alone = engine.tick(std::slice::from_ref(c), w.now()).await;
        assert_eq!(alone.outcomes[0], *b, "{} {}", c.owner, c.gate.name);
        distinct.insert((verdict(b).verdict as u8, verdict(b).reason.as_str()));
    }
    assert!(
        distinct.len() >= 2,
        "the scenario exercises more than one verdict: {distinct:?}"
    );
}

#[tokio::test]
async fn queries_per_tick_do_not_grow_with_active_objects() {
    let w = World::start().await;
    let n = w.now_ms;
    let mut series = Vec::new();
    for i in 0..500 {
        series.extend(traffic(
            n,
            &format!("c{}", i % 5),
            &format!("o{i}-canary"),
            2.0,
            0.0,
        ));
        series.extend(traffic(
            n,
            &format!("c{}", i % 5),
            &format!("o{i}-stable"),
            2.0,
            0.0,
        ));
    }
    w.write(series).await;
    let gates = [
        builtin_gate(BuiltinGate::ErrorRatioVsStable, |_| {}),
        builtin_gate(BuiltinGate::AppliedShare, |_| {}),
        builtin_gate(BuiltinGate::LatencyP99VsStable, |_| {}),
    ];
    let engine = w.engine();
    for objects in [1usize, 10, 500] {
        let checks: Vec<GateCheck> = (0..objects)
            .flat_map(|i| {
                gates.iter().map(move |g| {
                    let mut c = check(
                        &format!("Rollout shop/o{i}"),
                        g.clone(),
                        rollout_vars(&format!("c{}", i % 5), &format!("o{i}")),
                    );
                    c.share_target = Some(0.5);
                    c
                })
            })
            .collect();
        let before = w.query_requests().await;
        let report = engine.tick(&checks, w.now()).await;
        let sent = w.query_requests().await - before;
        assert_eq!(
            sent,
            gates.len() as u64,
            "{objects} objects: queries counted by Prometheus"
        );
        assert_eq!(report.queries, gates.len());
        assert_eq!(report.failed_queries, 0);
        let shares: Vec<&GateVerdict> = report
            .outcomes
            .iter()
            .map(verdict)
            .filter(|v| v.gate == "appliedshare")
            .collect();
        assert_eq!(shares.len(), objects);
        assert!(
            shares.iter().all(|v| v.verdict == Verdict::Pass),
            "every object got its own answer back"
        );
    }
}

#[tokio::test]
async fn an_injected_label_value_cannot_change_the_query() {
    let w = World::start().await;
    let n = w.now_ms;
    let mut series = traffic(n, "c1", "real-canary", 5.0, 0.0);
    series.extend(traffic(n, "c1", "real-stable", 5.0, 0.0));
    w.write(series).await;
    let lenient = builtin_gate(BuiltinGate::ErrorRatioVsStable, |g| {
        g.comparison = Comparison::absolute(ComparisonOp::GreaterOrEqual, 0.0);
        g.min_samples = 0;
    });
    let hostile = [
        r#"x"} or vector(1) #"#,
        r#"real-canary"} or on() vector(1) or x{a=""#,
        ".*",
        "real-.*",
        "real-canary|x",
        "real-canary\\",
    ];
    let mut checks: Vec<GateCheck> = hostile
        .iter()
        .map(|value| {
            let mut v = rollout_vars("c1", "real");
            v.insert("canaryService".into(), value.to_string());
            check("Rollout shop/evil", lenient.clone(), v)
        })
        .collect();
    // The genuine object in the same batch still gets its own answer.
    checks.push(check(
        "Rollout shop/real",
        lenient,
        rollout_vars("c1", "real"),
    ));
    let report = w.engine().tick(&checks, w.now()).await;
    let got = summary(&report);
    for (value, (v, reason)) in hostile.iter().zip(&got) {
        assert_eq!(
            (*v, *reason),
            (Verdict::Inconclusive, VerdictReason::NoData),
            "value {value:?} matched something"
        );
    }
    assert_eq!(
        got.last(),
        Some(&(Verdict::Pass, VerdictReason::ThresholdMet))
    );
    assert_eq!(
        report.failed_queries, 0,
        "every hostile value still made a valid query"
    );
}

#[tokio::test]
async fn pre_change_baseline_is_captured_once_and_compared() {
    let w = World::start().await;
    let n = w.now_ms;
    let change = n - 30 * 60_000;
    // Before the change (written second, in the past): 1% errors. After: 4% errors.
    w.write(traffic(n, "c1", "cart-canary", 5.0, 0.04)).await;
    let before: Vec<Series> = vec![
        requests(change, "c1", "cart-canary", "200", "-", 4.95),
        requests(change, "c1", "cart-canary", "503", "-", 0.05),
    ];
    w.write(before).await;
    let gate = builtin_gate(BuiltinGate::ErrorRatioVsStable, |g| {
        g.comparison = Comparison::relative(BaselineSource::PreChangeWindow, 2.0);
        g.consecutive_failures = 1;
    });
    let mut c = check("Rollout shop/cart", gate, rollout_vars("c1", "cart"));
    let engine = w.engine();
    let before_capture = engine.tick(std::slice::from_ref(&c), w.now()).await;
    assert_eq!(
        summary(&before_capture),
        [(Verdict::Inconclusive, VerdictReason::BaselineMissing)]
    );

    let change_ts = Timestamp::from_millisecond(change).unwrap();
    let captured = engine
        .capture_baselines(std::slice::from_ref(&c), change_ts, w.now())
        .await;
    let baseline = captured
        .into_iter()
        .next()
        .unwrap()
        .expect("baseline captured");
    assert!(
        (baseline.value - 0.01).abs() < 0.002,
        "pre-change ratio {}",
        baseline.value
    );
    assert_eq!(baseline.window_end.0, change_ts);
    c.captured_baseline = Some(baseline);
    let report = engine.tick(std::slice::from_ref(&c), w.now()).await;
    let v = verdict(&report.outcomes[0]);
    assert_eq!(
        (v.verdict, v.reason),
        (Verdict::Fail, VerdictReason::ThresholdBreached),
        "{:?}",
        v.message
    );
    assert_eq!(
        report.queries, 1,
        "the captured baseline is not queried again"
    );
}

#[tokio::test]
async fn every_builtin_query_runs_on_real_prometheus() {
    let w = World::start().await;
    let n = w.now_ms;
    let from = n - HISTORY_MS;
    let counter = |name: &str, labels: &[(&str, &str)], rps: f64| {
        labels
            .iter()
            .fold(Series::new(name), |s, (k, v)| s.label(*k, *v))
            .counter(from, n, STEP, 0.0, rps)
    };
    let gauge = |name: &str, labels: &[(&str, &str)], value: f64| {
        labels
            .iter()
            .fold(Series::new(name), |s, (k, v)| s.label(*k, *v))
            .gauge(from, n, STEP, value)
    };
    let mut series = traffic(n, "c1", "web-canary", 10.0, 0.0);
    series.extend(traffic(n, "c1", "web-stable", 10.0, 0.0));
    // Mesh errors: 1 rps flagged UF without failure_origin, 1 rps failure_origin=mesh, 1 rps
    // application errors (not counted), 1 rps client went away (DC, not counted).
    series.push(requests(n, "c1", "web-stable", "503", "UF", 1.0));
    series.push(requests(n, "c1", "web-stable", "503", "-", 1.0).label("failure_origin", "mesh"));
    series.push(
        requests(n, "c1", "web-stable", "500", "-", 1.0).label("failure_origin", "application"),
    );
    series.push(requests(n, "c1", "web-stable", "0", "DC", 1.0));
    for (le, share) in [
        ("50", 0.5),
        ("100", 0.9),
        ("250", 0.99),
        ("1000", 1.0),
        ("+Inf", 1.0),
    ] {
        for (svc, scale) in [("web-canary", 1.0), ("web-stable", 1.0)] {
            series.push(counter(
                "istio_request_duration_milliseconds_bucket",
                &[
                    ("reporter", "source"),
                    ("cluster", "c1"),
                    ("destination_service_namespace", "shop"),
                    ("destination_service_name", svc),
                    ("le", le),
                ],
                10.0 * share * scale,
            ));
        }
    }
    for svc in ["web-canary", "web-stable"] {
        series.push(counter(
            "istio_request_duration_milliseconds_count",
            &[
                ("reporter", "source"),
                ("cluster", "c1"),
                ("destination_service_namespace", "shop"),
                ("destination_service_name", svc),
            ],
            10.0,
        ));
    }
    series.push(counter(
        "pilot_xds_pushes",
        &[("cluster", "c1"), ("type", "eds")],
        2.0,
    ));
    series.push(counter(
        "pilot_total_xds_rejects",
        &[("cluster", "c1"), ("type", "rds")],
        0.05,
    ));
    series.push(gauge(
        builtin::DRIFT_BEHIND_METRIC,
        &[("cluster", "c1"), ("commit", "abc123")],
        3.0,
    ));
    series.push(gauge(
        builtin::DRIFT_PROXIES_METRIC,
        &[("cluster", "c1"), ("commit", "abc123")],
        400.0,
    ));
    series.push(gauge(
        "pilot_xds",
        &[("cluster", "c1"), ("revision", "1-27"), ("pod", "istiod-a")],
        120.0,
    ));
    series.push(gauge(
        "pilot_xds",
        &[("cluster", "c1"), ("revision", "1-27"), ("pod", "istiod-b")],
        80.0,
    ));
    series.push(gauge(
        "pilot_xds",
        &[("cluster", "c1"), ("revision", "1-28"), ("pod", "istiod-c")],
        50.0,
    ));
    series.push(counter(
        "citadel_server_success_cert_issuance_count",
        &[("cluster", "c1")],
        4.0,
    ));
    series.push(counter(
        "citadel_server_csr_count",
        &[("cluster", "c1")],
        4.0,
    ));
    w.write(series).await;

    let any = Comparison::absolute(ComparisonOp::GreaterOrEqual, 0.0);
    let mut base = rollout_vars("c1", "web");
    base.insert("commit".into(), "abc123".into());
    base.insert("revision".into(), "1-27".into());
    let cases: Vec<(BuiltinGate, f64, f64)> = vec![
        // gate, expected value, tolerance
        (BuiltinGate::AppliedShare, 10.0 / 24.0, 0.01),
        (BuiltinGate::ErrorRatioVsStable, 0.0, 1e-9),
        (BuiltinGate::LatencyP99VsStable, 250.0, 1.0),
        (BuiltinGate::MeshErrorRatio, 2.0 / 24.0, 0.005),
        (BuiltinGate::XdsNackIncrease, 6.0, 0.5),
        (BuiltinGate::ProxiesBehind, 3.0, 0.0),
        (BuiltinGate::ProxiesPerRevision, 200.0, 0.0),
        (BuiltinGate::SvidIssuanceRate, 4.0, 0.01),
    ];
    let checks: Vec<GateCheck> = cases
        .iter()
        .map(|(gate, _, _)| {
            let g = builtin_gate(*gate, |g| {
                if *gate != BuiltinGate::AppliedShare {
                    g.comparison = any.clone();
                }
                g.min_samples = 0;
            });
            let mut c = check("Rollout shop/web", g, base.clone());
            c.share_target = Some(10.0 / 24.0);
            c
        })
        .collect();
    let report = w.engine().tick(&checks, w.now()).await;
    assert_eq!(report.failed_queries, 0);
    assert_eq!(report.queries, cases.len());
    for ((gate, want, tolerance), outcome) in cases.iter().zip(&report.outcomes) {
        let Some(Observation::Measured {
            value: Some(value), ..
        }) = &outcome.observation
        else {
            panic!("{gate}: no value: {outcome:?}");
        };
        assert!(
            (value - want).abs() <= *tolerance,
            "{gate}: value {value}, want {want} ± {tolerance}"
        );
        assert_eq!(
            verdict(outcome).verdict,
            Verdict::Pass,
            "{gate}: {:?}",
            verdict(outcome).message
        );
    }
}

#[tokio::test]
async fn the_documented_gate_template_batches_by_version() {
    let w = World::start().await;
    let n = w.now_ms;
    let versioned = |version: &str, code: &str, rps: f64| {
        Series::new("istio_requests_total")
            .label("reporter", "source")
            .label("cluster", "c1")
            .label("destination_service_name", "books")
            .label("destination_version", version)
            .label("response_code", code)
            .counter(n - HISTORY_MS, n, STEP, 0.0, rps)
    };
    w.write(vec![
        versioned("v1", "200", 9.9),
        versioned("v1", "503", 0.1),
        versioned("v2", "200", 9.0),
        versioned("v2", "503", 1.0),
        versioned("v3", "200", 10.0),
    ])
    .await;
    // The example GateTemplate of GATES.md, exactly as documented.
    let doc = include_str!("../GATES.md");
    let block = doc
        .split("  promql: |\n")
        .nth(1)
        .unwrap()
        .split("  comparison:")
        .next()
        .unwrap();
    let promql: String = block.lines().map(str::trim).collect::<Vec<_>>().join("\n");
    let template = GateTemplateSpec {
        description: None,
        definition: GateDefinition {
            promql: Some(promql),
            comparison: Some(Comparison::relative(BaselineSource::StableNow, 1.5)),
            ..GateDefinition::default()
        },
        variables: BTreeMap::new(),
        locked: false,
    };
    let gate = Gate {
        name: "errors".into(),
        template_ref: Some("error-ratio-by-version".into()),
        definition: GateDefinition {
            consecutive_failures: Some(1),
            ..GateDefinition::default()
        },
        variables: BTreeMap::new(),
    }
    .resolve(Some(&template))
    .unwrap();
    let object = |canary: &str| {
        check(
            "Rollout shop/books",
            gate.clone(),
            vars(&[
                ("cluster", "c1"),
                ("service", "books"),
                ("stableVersion", "v1"),
                ("canaryVersion", canary),
            ]),
        )
    };
    let report = w
        .engine()
        .tick(&[object("v2"), object("v3")], w.now())
        .await;
    assert_eq!(
        summary(&report),
        [
            (Verdict::Fail, VerdictReason::ThresholdBreached),
            (Verdict::Pass, VerdictReason::ThresholdMet)
        ]
    );
    let v3 = verdict(&report.outcomes[1]);
    assert_eq!(
        v3.value,
        Some(0.0),
        "a version without 5xx is a ratio of 0, not no data"
    );
    assert_eq!(report.queries, 1);
}

/// A counter whose rate changes: `segments` are (duration in ms, requests per second), oldest
/// first, ending at `now`.
fn piecewise(name_labels: Series, now: i64, segments: &[(i64, f64)]) -> Series {
    let total: i64 = segments.iter().map(|(d, _)| d).sum();
    let step = STEP.as_millis() as i64;
    let mut series = name_labels;
    let (mut t, mut value) = (now - total, 0.0);
    for &(duration, rps) in segments {
        let end = t + duration;
        while t < end {
            series = series.sample(t, value);
            value += rps * step as f64 / 1000.0;
            t += step;
        }
    }
    series.sample(t, value)
}

#[tokio::test]
async fn mann_whitney_catches_a_sustained_regression_a_good_last_window_hides() {
    let w = World::start().await;
    let n = w.now_ms;
    let base = |service: &str, code: &str| {
        Series::new("istio_requests_total")
            .label("reporter", "source")
            .label("cluster", "c1")
            .label("destination_service_namespace", "shop")
            .label("destination_service_name", service)
            .label("response_code", code)
            .label("response_flags", "-")
    };
    // Stable: 1% errors throughout. Canary: 3% for eight minutes, then 1% for the last two.
    w.write(vec![
        piecewise(base("cart-stable", "200"), n, &[(600_000, 9.9)]),
        piecewise(base("cart-stable", "503"), n, &[(600_000, 0.1)]),
        piecewise(
            base("cart-canary", "200"),
            n,
            &[(480_000, 9.7), (120_000, 9.9)],
        ),
        piecewise(
            base("cart-canary", "503"),
            n,
            &[(480_000, 0.3), (120_000, 0.1)],
        ),
    ])
    .await;
    let gate = builtin_gate(BuiltinGate::ErrorRatioVsStable, |g| {
        g.consecutive_failures = 1
    });
    let checks = [check("Rollout shop/cart", gate, rollout_vars("c1", "cart"))];

    // Off by default: the last two-minute window looks as good as stable.
    let plain = w.engine().tick(&checks, w.now()).await;
    assert_eq!(
        summary(&plain),
        [(Verdict::Pass, VerdictReason::ThresholdMet)]
    );
    assert_eq!(plain.queries, 1);

    // On: per-minute samples over ten minutes show the canary significantly and largely worse.
    let options = EngineOptions {
        mann_whitney: Some(MannWhitneyOptions::default()),
        ..EngineOptions::default()
    };
    let report = w.engine_with(options).tick(&checks, w.now()).await;
    let v = verdict(&report.outcomes[0]);
    assert_eq!(
        (v.verdict, v.reason),
        (Verdict::Fail, VerdictReason::ThresholdBreached),
        "{:?}",
        v.message
    );
    assert!(
        v.message
            .as_deref()
            .unwrap()
            .contains("significantly worse"),
        "{:?}",
        v.message
    );
    let Some(Observation::Measured {
        distribution: Some(d),
        ..
    }) = &report.outcomes[0].observation
    else {
        panic!("no distribution test: {:?}", report.outcomes[0]);
    };
    assert!(d.test.p_worse < 0.01 && d.test.n_canary >= 8, "{d:?}");
    assert_eq!(report.queries, 2, "one instant and one range query");
}

#[tokio::test]
async fn inline_promql_on_a_namespaced_object_is_refused_unless_enabled() {
    let w = World::start().await;
    w.write(traffic(w.now_ms, "c1", "inline-canary", 5.0, 0.0))
        .await;
    let gate = Gate {
        name: "inline".into(),
        template_ref: None,
        definition: GateDefinition {
            promql: Some(
                r#"sum by ({{by}}) (increase(istio_requests_total{cluster="{{cluster}}"}[{{window}}]))"#
                    .into(),
            ),
            comparison: Some(Comparison::absolute(ComparisonOp::GreaterOrEqual, 0.0)),
            min_samples: Some(0),
            ..GateDefinition::default()
        },
        variables: BTreeMap::new(),
    }
    .resolve(None)
    .unwrap();
    let checks = [check(
        "Rollout shop/inline",
        gate,
        vars(&[("cluster", "c1")]),
    )];

    let before = w.query_requests().await;
    let refused = w.engine().tick(&checks, w.now()).await;
    let err = refused.outcomes[0].verdict.as_ref().unwrap_err();
    assert_eq!(err.category(), "InlinePromqlRefused");
    assert!(err.to_string().contains("GateTemplate"), "{err}");
    assert_eq!(refused.queries, 0);
    assert_eq!(
        w.query_requests().await,
        before,
        "a refused gate sends nothing"
    );

    let options = EngineOptions {
        allow_inline_promql_in_namespaced: true,
        ..EngineOptions::default()
    };
    let allowed = w.engine_with(options).tick(&checks, w.now()).await;
    assert_eq!(
        summary(&allowed),
        [(Verdict::Pass, VerdictReason::ThresholdMet)]
    );
}
