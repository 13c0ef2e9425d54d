//! End to end, a canary abort notified: a 1% canary whose 5xx ratio breaches its gate
//! (`canary-abort`) is aborted while one webhook target answers at once and another never
//! answers. The abort is reverted on the route without waiting for either; the answering target
//! gets one JSON notice naming the Rollout, the transition, the reason and the failing gate's
//! observed value against its threshold; the silent one is given up on after its retries,
//! counted in `sluice_notification_failures_total` and reported as a Warning Event on the
//! Rollout. Run with `--nocapture` to see the payload.

mod common;

use std::{
    sync::{Arc, Mutex},
    time::Duration,
};

use common::*;
use kube::{Api, api::PostParams, runtime::watcher};
use prometheus_client::registry::Registry;
use serde_json::{Value, json};
use sluice_api::v1alpha1::{Rollout, RolloutPhase};
use sluice_rollout_weights::{OPERATOR, metrics, reconcile, triggers};
use sluice_runtime::{
    events::EventRecorder,
    leader::Leadership,
    notify::{
        NoticeEvent, Notifier, NotifierOptions, NotifyMetrics, REASON_FAILED, RetryPolicy,
        parse_targets,
    },
    operator::{Hooks, drive_with},
};
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::TcpListener,
};
use tokio_util::sync::CancellationToken;

type Got = Arc<Mutex<Vec<Value>>>;

/// A webhook receiver on 127.0.0.1 speaking just enough HTTP/1.1: records each JSON body, then
/// answers 200 — or, when `hang`, never answers. Returns its URL and what it got.
async fn receiver(hang: bool) -> (String, Got) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/hook", listener.local_addr().unwrap());
    let got = Got::default();
    let out = got.clone();
    tokio::spawn(async move {
        while let Ok((mut conn, _)) = listener.accept().await {
            let out = out.clone();
            tokio::spawn(async move {
                let mut buf = Vec::new();
                let mut chunk = [0u8; 4096];
                let body = loop {
                    let Ok(n) = conn.read(&mut chunk).await else {
                        return;
                    };
                    if n == 0 {
                        return;
                    }
                    buf.extend_from_slice(&chunk[..n]);
                    let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") else {
                        continue;
                    };
                    let head = String::from_utf8_lossy(&buf[..end]).to_lowercase();
                    let len: usize = head
                        .lines()
                        .find_map(|l| l.strip_prefix("content-length:"))
                        .and_then(|v| v.trim().parse().ok())
                        .unwrap_or(0);
                    if buf.len() >= end + 4 + len {
                        break buf[end + 4..end + 4 + len].to_vec();
                    }
                };
                out.lock()
                    .unwrap()
                    .push(serde_json::from_slice(&body).unwrap_or(Value::Null));
                if hang {
                    tokio::time::sleep(Duration::from_secs(3600)).await;
                }
                let _ = conn
                    .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\nconnection: close\r\n\r\n")
                    .await;
            });
        }
    });
    (url, got)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gate_abort_is_notified_once_and_a_dead_target_does_not_hold_the_revert() {
    let budget = Duration::from_secs(100);
    let Some(g) = given(scenario("canary-abort", 4000.0)).await else {
        return;
    };
    let (ok_url, ok_got) = receiver(false).await;
    let (hung_url, hung_got) = receiver(true).await;

    // The controller in-process, with notifications to both targets.
    let mut registry = Registry::default();
    let m = metrics::register(&mut registry);
    let notify_metrics = NotifyMetrics::register(&mut registry);
    let recorder = EventRecorder::new(g.client.clone(), OPERATOR);
    let notifier = Notifier::start(
        NotifierOptions {
            operator: OPERATOR.into(),
            cluster: "east-1".into(),
            retry: RetryPolicy {
                attempts: 3,
                base: Duration::from_millis(100),
                max: Duration::from_millis(400),
                timeout: Duration::from_millis(500),
            },
        },
        notify_metrics.clone(),
        Some(recorder.clone()),
    );
    notifier.set_targets(
        parse_targets(
            serde_json::to_string(&json!([
                {"name": "platform", "url": ok_url, "events": ["abort", "promotion"]},
                {"name": "silent", "url": hung_url, "format": "slack"},
            ]))
            .unwrap()
            .as_bytes(),
        )
        .unwrap(),
    );
    let mut ctx = reconcile::Context::new(g.client.clone(), recorder)
        .with_analysis(g.prometheus.as_ref().unwrap().url(), CLUSTER, m)
        .expect("engine starts");
    ctx.notifier = notifier;
    let (hooks, _) = Hooks::standalone();
    let hooks = hooks.with_primary_changes(sluice_rollout_weights::PRIMARY_CHANGES);
    let shutdown = CancellationToken::new();
    let task = tokio::spawn(drive_with(
        Api::<Rollout>::all(g.client.clone()),
        watcher::Config::default(),
        Arc::new(ctx),
        reconcile::reconcile,
        Leadership::always(),
        shutdown.clone(),
        hooks,
        triggers::with_triggers(
            triggers::Watched::new(&g.client, None),
            watcher::Config::default(),
        ),
    ));

    // Given a canary held at 1% until the fault (at 30 s in the scenario).
    let steps = json!([
        {"setWeight": {"weight": 1, "duration": "120s"}},
        {"promote": {}}
    ]);
    rollouts(&g.client)
        .create(&PostParams::default(), &rollout(steps, json!({})))
        .await
        .unwrap();

    // When the error gate fails, Then the route is reverted while the silent target still
    // holds its first attempt: the reconcile never waited on it.
    let aborted = rollout_until(&g.client, "aborted and reverted", budget, |r| {
        r.status.as_ref().is_some_and(|s| {
            s.phase == RolloutPhase::Aborted
                && s.abort
                    .as_ref()
                    .is_some_and(|a| a.route_reverted_at.is_some())
        })
    })
    .await;
    assert_eq!(
        weights(&routes(&g.client).get("checkout").await.unwrap()),
        (100, 0)
    );
    assert!(
        notify_metrics.failures("silent", "Rollout", NoticeEvent::Abort) == 0,
        "the route was reverted before the silent target was given up on"
    );

    // The answering target gets the abort once, with the figures the status holds.
    let payload = eventually("the abort notice", budget, async || {
        let got = ok_got.lock().unwrap().clone();
        got.first().cloned().ok_or("none yet".to_owned())
    })
    .await;
    println!(
        "notification of the abort, as the webhook got it:\n{}",
        serde_json::to_string_pretty(&payload).unwrap()
    );
    let abort = aborted.status.as_ref().unwrap().abort.clone().unwrap();
    let gate = abort.gate.expect("the failing gate");
    assert_eq!(payload["event"], "abort");
    assert_eq!(payload["kind"], "Rollout");
    assert_eq!(payload["namespace"], NS);
    assert_eq!(payload["name"], "checkout");
    assert_eq!(payload["cluster"], "east-1");
    assert_eq!(payload["transition"]["to"], "Aborted");
    assert!(
        ["Progressing", "Paused"].contains(&payload["transition"]["from"].as_str().unwrap()),
        "{payload}"
    );
    assert_eq!(payload["reason"], "GateFailed");
    assert_eq!(payload["figures"]["canaryWeight"], 1);
    assert_eq!(payload["figures"]["gate"], gate.gate);
    assert_eq!(payload["figures"]["observed"], json!(gate.value.unwrap()));
    assert_eq!(
        payload["figures"]["threshold"],
        json!(gate.threshold.unwrap())
    );

    // The silent target: three attempts, then a failure counted and an Event on the Rollout.
    eventually("the silent target given up on", budget, async || {
        if notify_metrics.failures("silent", "Rollout", NoticeEvent::Abort) == 1 {
            Ok(())
        } else {
            Err(format!(
                "{} attempts so far",
                hung_got.lock().unwrap().len()
            ))
        }
    })
    .await;
    assert_eq!(hung_got.lock().unwrap().len(), 3);
    let failed = eventually("the NotificationFailed Event", budget, async || {
        let e = events(&g.client, REASON_FAILED).await;
        e.into_iter()
            .next()
            .and_then(|e| e.note)
            .ok_or("none yet".to_owned())
    })
    .await;
    assert!(
        failed.starts_with("notifying target \"silent\" of abort ("),
        "{failed}"
    );
    let text = sluice_runtime::metrics::encode(&registry);
    assert!(
        text.contains(
            r#"sluice_notification_failures_total{target="silent",kind="Rollout",event="abort"} 1"#
        ),
        "{text}"
    );

    // Reconciles after the abort (revert verification) notify nothing more.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(
        ok_got.lock().unwrap().len(),
        1,
        "{:?}",
        ok_got.lock().unwrap()
    );
    assert_eq!(
        notify_metrics.sent("platform", "Rollout", NoticeEvent::Abort),
        1
    );

    shutdown.cancel();
    let _ = tokio::time::timeout(Duration::from_secs(10), task).await;
}
