//! End to end, `canary-abort`: a canary whose 5xx ratio (then, separately, whose p99) breaches
//! its gate while at 1% is aborted in one route write — canary weight 0 and the kept mirror rule
//! removed together — and the revert is then verified from telemetry. Prints
//! `abort_latency_ms` (fault injected → route reverted), `detect_to_revert_ms` (the abort
//! decision on the failing verdict → route reverted, the controller's own delay) and
//! `revert_verified_ms` (route reverted → telemetry shows ~0).

mod common;

use std::{
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use common::*;
use kube::api::PostParams;
use serde_json::json;
use sluice_api::v1alpha1::{
    RolloutPhase,
    rollout::{AbortReason, conditions, reasons},
};
use sluice_runtime::conditions::find;
use sluice_sim::Scenario;

/// Route states seen by a fast poller: (resourceVersion, (stable, canary), rule names).
type Seen = Arc<Mutex<Vec<(String, (i32, i32), Vec<String>)>>>;

fn watch_route(client: &kube::Client) -> (Seen, tokio::task::JoinHandle<()>) {
    let seen: Seen = Arc::default();
    let api = routes(client);
    let out = seen.clone();
    let task = tokio::spawn(async move {
        loop {
            if let Ok(r) = api.get("checkout").await {
                let rv = r.metadata.resource_version.clone().unwrap_or_default();
                let mut s = out.lock().unwrap_or_else(|e| e.into_inner());
                if s.last().map(|l| &l.0) != Some(&rv) {
                    s.push((rv, weights(&r), rule_names(&r)));
                }
            }
            tokio::time::sleep(Duration::from_millis(15)).await;
        }
    });
    (seen, task)
}

fn histogram_sum(metrics: &str, name: &str) -> Option<f64> {
    metrics
        .lines()
        .find(|l| l.starts_with(&format!("{name}_sum ")))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
}

async fn abort_scenario(scenario: Scenario, fault_at: Duration, want_gate: &str) {
    let budget = Duration::from_secs(100);
    let Some(g) = given(scenario).await else {
        return;
    };
    let prom = g.prometheus.as_ref().unwrap().url().to_owned();
    let ctl = Controller::start(&g.client, &prom);
    let (seen, poller) = watch_route(&g.client);

    // Given a Rollout that keeps its mirror rule into the weight steps and holds 1% long.
    let steps = json!([
        {"mirror": {"percent": 100, "duration": "1s"}},
        {"setWeight": {"weight": 1, "duration": "120s"}},
        {"setWeight": {"weight": 50}},
        {"promote": {}}
    ]);
    rollouts(&g.client)
        .create(
            &PostParams::default(),
            &rollout(steps, json!({"keepMirror": true})),
        )
        .await
        .unwrap();
    share_confirmed_at_step(&g.client, "1% confirmed by telemetry", 1, budget).await;
    let at_one = routes(&g.client).get("checkout").await.unwrap();
    assert_eq!(weights(&at_one), (99, 1));
    assert!(rule_names(&at_one).contains(&"sluice-mirror".to_owned()));

    // When the fault starts (the scenario's event), Then the route is reverted.
    let fault = g.started + fault_at;
    let reverted_seen = eventually("route reverted", budget, async || {
        let s = seen.lock().unwrap_or_else(|e| e.into_inner());
        s.iter()
            .skip_while(|(_, w, _)| w.1 != 1)
            .position(|(_, w, _)| w.1 == 0)
            .map(|_| Instant::now())
            .ok_or(format!("{:?}", s.last()))
    })
    .await;
    let abort_latency = reverted_seen.saturating_duration_since(fault);

    // In one write: no state with weight 0 and the mirror still there, or the reverse.
    {
        let s = seen.lock().unwrap_or_else(|e| e.into_inner());
        let at_one = s.iter().position(|(_, w, _)| w.1 == 1).unwrap();
        let first_zero = at_one + s[at_one..].iter().position(|(_, w, _)| w.1 == 0).unwrap();
        let (_, w, names) = &s[first_zero];
        assert_eq!(*w, (100, 0));
        assert_eq!(
            names,
            &vec!["admin".to_owned(), "main".to_owned()],
            "mirror removed in the same write"
        );
        assert!(
            s[..first_zero]
                .last()
                .is_some_and(|(_, w, names)| w.1 == 1 && names.len() == 3),
            "the write before the revert had the canary at 1% with the mirror: {s:?}"
        );
    }

    // Then the status keeps the failing gate and the timeline, and telemetry confirms ~0.
    let reverted_at = Instant::now();
    let aborted = rollout_until(&g.client, "revert verified from telemetry", budget, |r| {
        r.status
            .as_ref()
            .and_then(|s| s.abort.as_ref())
            .is_some_and(|a| a.revert_verified_at.is_some())
    })
    .await;
    let revert_verified = reverted_at.elapsed();
    let status = aborted.status.unwrap();
    assert_eq!(status.phase, RolloutPhase::Aborted);
    let abort = status.abort.unwrap();
    assert_eq!(abort.reason, AbortReason::GateFailed);
    let gate = abort.gate.expect("failing gate kept");
    assert_eq!(gate.gate, want_gate);
    assert!(
        gate.value.is_some() && gate.baseline.is_some() && gate.threshold.is_some(),
        "{gate:?}"
    );
    assert!(abort.first_failed_at.is_some() && abort.route_reverted_at.is_some());
    let progressing = find(&status.conditions, conditions::PROGRESSING).unwrap();
    assert_eq!(progressing.reason, reasons::GATE_FAILED);
    assert!(
        !events(&g.client, reasons::GATE_FAILED).await.is_empty(),
        "a Warning Event"
    );

    let metrics = ctl.metrics();
    let detect = histogram_sum(&metrics, "sluice_rollout_detect_to_revert_seconds")
        .expect("detect-to-revert observed");
    println!(
        "{want_gate}: abort_latency_ms={} detect_to_revert_ms={} revert_verified_ms={}",
        abort_latency.as_millis(),
        (detect * 1000.0).round(),
        revert_verified.as_millis()
    );
    assert!(
        detect < 1.0,
        "the controller reverts well under a second after deciding: {detect}s"
    );
    // The status carries the same figure to the millisecond (one abort in this controller).
    let stored_ms = status
        .abort_detect_to_revert_ms
        .expect("status.abortDetectToRevertMs set with routeRevertedAt");
    assert!(
        (stored_ms as f64 - detect * 1000.0).abs() <= 1.0,
        "status says {stored_ms} ms, the histogram {detect} s"
    );

    poller.abort();
    ctl.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn error_ratio_breach_aborts_in_one_write_and_the_revert_is_verified() {
    abort_scenario(
        scenario("canary-abort", 4000.0),
        Duration::from_secs(30),
        "error-ratio",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn p99_breach_aborts() {
    let mut s = scenario("canary-abort", 4000.0);
    s.events =
        serde_yaml::from_str("[{at: 20s, service: checkout, version: v2.14, latency_factor: 4.0}]")
            .expect("event parses");
    abort_scenario(s, Duration::from_secs(20), "latency-p99").await;
}

/// Stored versions of objects in the order written: (resourceVersion, object).
type Log<K> = Arc<Mutex<Vec<(u64, K)>>>;

/// Every stored version of `api`'s objects from now on, in the order written. The emulator's
/// resourceVersions are one counter across kinds, so two logs compare.
fn log_writes<K>(api: kube::Api<K>) -> (Log<K>, tokio::task::JoinHandle<()>)
where
    K: kube::Resource
        + Clone
        + k8s_openapi::serde::de::DeserializeOwned
        + std::fmt::Debug
        + Send
        + 'static,
{
    use futures::StreamExt;
    let log: Log<K> = Arc::default();
    let out = log.clone();
    let task = tokio::spawn(async move {
        let mut stream = api
            .watch(&kube::api::WatchParams::default(), "0")
            .await
            .expect("watch starts")
            .boxed();
        while let Some(Ok(event)) = stream.next().await {
            if let kube::api::WatchEvent::Added(o) | kube::api::WatchEvent::Modified(o) = event {
                let rv = o.meta().resource_version.as_deref().unwrap_or("0");
                let rv = rv.parse().expect("a numeric resourceVersion");
                out.lock().unwrap_or_else(|e| e.into_inner()).push((rv, o));
            }
        }
    });
    (log, task)
}

/// An abort's route write is the first write of the reconcile that decides it: the first stored
/// status that says Aborted already records when the route was reverted (decision and revert in
/// one status write, after the route), so the revert waits for no other request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_route_is_reverted_before_the_abort_is_recorded() {
    let budget = Duration::from_secs(100);
    let mut s = scenario("canary-abort", 4000.0);
    s.events.clear();
    let Some(g) = given(s).await else {
        return;
    };
    let prom = g.prometheus.as_ref().unwrap().url().to_owned();
    let ctl = Controller::start(&g.client, &prom);
    let steps = json!([
        {"setWeight": {"weight": 1, "duration": "600s"}},
        {"promote": {}}
    ]);
    rollouts(&g.client)
        .create(&PostParams::default(), &rollout(steps, json!({})))
        .await
        .unwrap();
    share_confirmed_at_step(&g.client, "1% confirmed by telemetry", 0, budget).await;
    let (statuses, watch_rollouts) = log_writes(rollouts(&g.client));
    let (route_versions, watch_routes) = log_writes(routes(&g.client));

    g.canary_errors_at(3.0);
    rollout_until(&g.client, "aborted and recorded", budget, |r| {
        r.status
            .as_ref()
            .and_then(|s| s.abort.as_ref())
            .is_some_and(|a| a.route_reverted_at.is_some())
    })
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    watch_rollouts.abort();
    watch_routes.abort();
    ctl.stop().await;

    let statuses = statuses.lock().unwrap().clone();
    let (aborted_rv, first_aborted) = statuses
        .iter()
        .find(|(_, r)| {
            r.status
                .as_ref()
                .is_some_and(|s| s.phase == RolloutPhase::Aborted)
        })
        .cloned()
        .expect("an Aborted status was stored");
    let st = first_aborted.status.unwrap();
    let abort = st.abort.expect("an Aborted status says why");
    assert!(
        abort.route_reverted_at.is_some() && st.abort_detect_to_revert_ms.is_some(),
        "the first status saying Aborted was written before the route was reverted: {abort:?}"
    );
    let reverted_rv = route_versions
        .lock()
        .unwrap()
        .iter()
        .find(|(_, r)| weights(r).1 == 0)
        .map(|(rv, _)| *rv)
        .expect("the route was reverted to canary weight 0");
    assert!(
        reverted_rv < aborted_rv,
        "route reverted at resourceVersion {reverted_rv}, after the abort was recorded at {aborted_rv}"
    );
}
