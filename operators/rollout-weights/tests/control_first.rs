//! End to end: manual controls come before analysis, and GateTemplates come from a watch.
//!
//! - A metrics source that stops answering (a Thanos brownout: connections accepted, nothing
//!   returned) does not hold up `spec.abort`: the route is reverted within about a second of the
//!   edit, not after the queries' timeouts and retries (3 × 10 s by default).
//! - A GateTemplate created or edited while a Rollout uses it reaches that Rollout: a missing
//!   template, then a locked one the Rollout overrides, then the lock lifted, each shows in the
//!   Rollout's Ready condition within a few analysis intervals.

mod common;

use std::{
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, Instant},
};

use common::*;
use kube::{
    Api,
    api::{Patch, PatchParams, PostParams},
};
use serde_json::json;
use sluice_api::v1alpha1::{
    GateTemplate,
    rollout::{AbortReason, conditions, reasons},
};
use sluice_runtime::conditions::find;
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::{TcpListener, TcpStream},
};

/// Copies `from` to `to`, holding every chunk while `hang` is set.
async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    hang: Arc<AtomicBool>,
) {
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        while hang.load(Ordering::SeqCst) {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}

/// A proxy on 127.0.0.1 in front of `upstream` (host:port) that, while `hang` is set, accepts
/// requests and answers nothing, on new and kept-alive connections alike. Returns its URL.
async fn brownout_proxy(upstream: String, hang: Arc<AtomicBool>) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move {
        while let Ok((client, _)) = listener.accept().await {
            let upstream = upstream.clone();
            let hang = hang.clone();
            tokio::spawn(async move {
                let Ok(server) = TcpStream::connect(&upstream).await else {
                    return;
                };
                let (cr, cw) = client.into_split();
                let (sr, sw) = server.into_split();
                tokio::join!(pump(cr, sw, hang.clone()), pump(sr, cw, hang));
            });
        }
    });
    url
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_manual_abort_is_not_held_up_by_a_metrics_source_that_never_answers() {
    let budget = Duration::from_secs(100);
    let mut s = scenario("canary-abort", 4000.0);
    s.events.clear();
    let Some(g) = given(s).await else {
        return;
    };
    let prom = g.prometheus.as_ref().unwrap().url().to_owned();
    let hang = Arc::new(AtomicBool::new(false));
    let upstream = prom.trim_start_matches("http://").trim_end_matches('/');
    let proxy = brownout_proxy(upstream.to_owned(), hang.clone()).await;
    let ctl = Controller::start(&g.client, &proxy);

    // Given a canary live at 1%, its share confirmed through the proxy.
    let steps = json!([{"setWeight": {"weight": 1, "duration": "600s"}}, {"promote": {}}]);
    rollouts(&g.client)
        .create(&PostParams::default(), &rollout(steps, json!({})))
        .await
        .unwrap();
    share_confirmed_at_step(&g.client, "1% confirmed by telemetry", 0, budget).await;

    // When the metrics source stops answering, and an analysis is waiting on it.
    hang.store(true, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(
        weights(&routes(&g.client).get("checkout").await.unwrap()),
        (99, 1)
    );

    // And a release engineer aborts.
    rollouts(&g.client)
        .patch(
            "checkout",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"abort": true}})),
        )
        .await
        .unwrap();
    let asked = Instant::now();

    // Then the route is reverted within about a second, the source still silent.
    eventually("route reverted", Duration::from_secs(40), async || {
        let r = routes(&g.client)
            .get("checkout")
            .await
            .map_err(|e| e.to_string())?;
        (weights(&r) == (100, 0))
            .then_some(())
            .ok_or(format!("{:?}", weights(&r)))
    })
    .await;
    let took = asked.elapsed();
    println!(
        "spec.abort -> route reverted with the metrics source hanging: {} ms",
        took.as_millis()
    );
    assert!(
        took < Duration::from_millis(1500),
        "the abort waited on the hanging metrics source: {took:?}"
    );
    let status = abort_recorded(&g.client, budget).await;
    assert_eq!(status.abort.unwrap().reason, AbortReason::Manual);
    hang.store(false, Ordering::SeqCst);
    ctl.stop().await;
}

fn ready_of(r: &sluice_api::v1alpha1::Rollout) -> (String, String, String) {
    r.status
        .as_ref()
        .and_then(|s| find(&s.conditions, conditions::READY))
        .map(|c| (c.status.clone(), c.reason.clone(), c.message.clone()))
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gate_template_edit_reaches_the_rollouts_that_use_it() {
    let budget = Duration::from_secs(60);
    let mut s = scenario("canary-abort", 4000.0);
    s.events.clear();
    let Some(g) = given(s).await else {
        return;
    };
    let prom = g.prometheus.as_ref().unwrap().url().to_owned();
    let ctl = Controller::start(&g.client, &prom);
    let templates: Api<GateTemplate> = Api::all(g.client.clone());

    // Given a Rollout at 1% whose `errors` gate references a GateTemplate not created yet, and
    // sets its own window.
    let steps = json!([{"setWeight": {"weight": 1, "duration": "600s"}}, {"promote": {}}]);
    let gates = json!({"gates": [
        {"name": "applied-share", "builtin": "AppliedShare", "window": "4s", "consecutiveFailures": 3},
        {"name": "errors", "templateRef": "platform-errors", "window": "8s"}
    ]});
    rollouts(&g.client)
        .create(&PostParams::default(), &rollout(steps, gates))
        .await
        .unwrap();
    let missing = rollout_until(&g.client, "the missing template reported", budget, |r| {
        ready_of(r).1 == reasons::GATE_MISCONFIGURED
    })
    .await;
    let (status, _, message) = ready_of(&missing);
    assert_eq!(status, "False");
    assert!(
        message.contains("GateTemplate \"platform-errors\", which does not exist"),
        "{message}"
    );

    // When the platform creates it locked.
    let template: GateTemplate = serde_json::from_value(json!({
        "apiVersion": "sluice.dev/v1alpha1",
        "kind": "GateTemplate",
        "metadata": {"name": "platform-errors"},
        "spec": {"builtin": "ErrorRatioVsStable", "window": "4s", "locked": true}
    }))
    .unwrap();
    templates
        .create(&PostParams::default(), &template)
        .await
        .unwrap();

    // Then the Rollout's override is refused, naming the gate, the template and the field.
    let locked = rollout_until(&g.client, "the locked template reported", budget, |r| {
        ready_of(r).2.contains("is locked")
    })
    .await;
    assert_eq!(
        ready_of(&locked),
        (
            "False".to_owned(),
            reasons::GATE_MISCONFIGURED.to_owned(),
            "spec.gates errors: GateTemplate platform-errors is locked: window cannot be \
             overridden (the template's values apply)"
                .to_owned()
        )
    );

    // When the lock is lifted, Then the refusal goes.
    templates
        .patch(
            "platform-errors",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"locked": false}})),
        )
        .await
        .unwrap();
    rollout_until(&g.client, "the refusal cleared", budget, |r| {
        ready_of(r).1 != reasons::GATE_MISCONFIGURED
    })
    .await;
    ctl.stop().await;
}
