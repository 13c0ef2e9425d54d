//! Webhook notifications against local receivers (HTTP on 127.0.0.1): the generic JSON and the
//! Slack-compatible body of a canary abort arrive with the object, transition, reason and
//! figures; a receiver answering 500 then 200 gets the message once; a dead receiver is given up
//! on after the retries, counted in `sluice_notification_failures_total` and reported as a
//! Warning Event on the object, while `notify` returns at once; a transition is notified once;
//! the targets follow their Secret.
//!
//! Run with `--nocapture` to see one payload as a receiver got it.

use std::{
    borrow::Cow,
    collections::VecDeque,
    sync::{Arc, Mutex},
    time::Duration,
};

use axum::{Json, Router, extract::State, http::HeaderMap, http::StatusCode, routing::post};
use k8s_openapi::{
    ByteString, NamespaceResourceScope,
    api::{
        core::v1::{Namespace, Secret},
        events::v1::Event,
    },
    apimachinery::pkg::apis::meta::v1::ObjectMeta,
};
use kube::{
    Api, Resource,
    api::{DeleteParams, ListParams, PostParams},
};
use prometheus_client::registry::Registry;
use serde_json::{Map, Value, json};
use sluice_runtime::{
    events::EventRecorder,
    metrics::encode,
    notify::{
        Notice, NoticeEvent, Notifier, NotifierOptions, NotifyMetrics, RetryPolicy, parse_targets,
    },
};
use tokio::time::{Instant, sleep, timeout};
use tokio_util::sync::CancellationToken;

/// A Rollout as far as the notifier looks at it: its metadata.
#[derive(Debug, Clone, Default)]
struct Rollout {
    metadata: ObjectMeta,
}

impl Resource for Rollout {
    type DynamicType = ();
    type Scope = NamespaceResourceScope;
    fn kind(_: &()) -> Cow<'_, str> {
        "Rollout".into()
    }
    fn group(_: &()) -> Cow<'_, str> {
        "sluice.dev".into()
    }
    fn version(_: &()) -> Cow<'_, str> {
        "v1alpha1".into()
    }
    fn plural(_: &()) -> Cow<'_, str> {
        "rollouts".into()
    }
    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }
    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

fn rollout(name: &str, generation: i64) -> Rollout {
    Rollout {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some("shop".into()),
            uid: Some(format!("uid-{name}")),
            generation: Some(generation),
            ..ObjectMeta::default()
        },
    }
}

/// The abort rollout-weights records when the error gate fails at the 10% step.
fn abort() -> Notice {
    let mut figures = Map::new();
    figures.insert("step".into(), json!(1));
    figures.insert("canaryWeight".into(), json!(10));
    figures.insert("appliedShare".into(), json!(0.098));
    figures.insert("gate".into(), json!("error-rate"));
    figures.insert("observed".into(), json!(0.21));
    figures.insert("threshold".into(), json!(0.05));
    Notice {
        event: NoticeEvent::Abort,
        from: "Progressing".into(),
        to: "Aborted".into(),
        reason: "GateFailed".into(),
        message: "gate error-rate: 5xx ratio 0.21 above 0.05".into(),
        figures,
    }
}

/// What one receiver got: the Authorization header and the body.
type Got = Arc<Mutex<Vec<(Option<String>, Value)>>>;

#[derive(Clone)]
struct Receiver {
    got: Got,
    /// Statuses to answer, in order; 200 once empty.
    script: Arc<Mutex<VecDeque<u16>>>,
    /// Never answer.
    hang: bool,
}

async fn hook(
    State(r): State<Receiver>,
    headers: HeaderMap,
    Json(body): Json<Value>,
) -> StatusCode {
    let auth = headers
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    r.got.lock().unwrap().push((auth, body));
    if r.hang {
        sleep(Duration::from_secs(3600)).await;
    }
    let code = r.script.lock().unwrap().pop_front().unwrap_or(200);
    StatusCode::from_u16(code).unwrap()
}

/// Serves a receiver on 127.0.0.1; returns its URL and what it gets. Stops with the test.
async fn receiver(script: &[u16], hang: bool) -> (String, Got) {
    let got = Got::default();
    let state = Receiver {
        got: got.clone(),
        script: Arc::new(Mutex::new(script.iter().copied().collect())),
        hang,
    };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let app = Router::new().route("/hook", post(hook)).with_state(state);
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    (format!("http://{addr}/hook"), got)
}

fn fast_retry() -> RetryPolicy {
    RetryPolicy {
        attempts: 3,
        base: Duration::from_millis(50),
        max: Duration::from_millis(200),
        timeout: Duration::from_millis(300),
    }
}

fn notifier(recorder: Option<EventRecorder>) -> (Notifier, NotifyMetrics, Registry) {
    notifier_with(recorder, fast_retry())
}

fn notifier_with(
    recorder: Option<EventRecorder>,
    retry: RetryPolicy,
) -> (Notifier, NotifyMetrics, Registry) {
    let mut registry = Registry::default();
    let metrics = NotifyMetrics::register(&mut registry);
    let n = Notifier::start(
        NotifierOptions {
            operator: "sluice-rollout-weights".into(),
            cluster: "east-1".into(),
            retry,
        },
        metrics.clone(),
        recorder,
    );
    (n, metrics, registry)
}

async fn wait_for(what: &str, within: Duration, mut ok: impl FnMut() -> bool) {
    let start = Instant::now();
    while !ok() {
        assert!(start.elapsed() < within, "{what}: not within {within:?}");
        sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn an_abort_reaches_a_json_and_a_slack_receiver_once() {
    let (json_url, json_got) = receiver(&[], false).await;
    let (slack_url, slack_got) = receiver(&[], false).await;
    let (n, metrics, _registry) = notifier(None);
    n.set_targets(
        parse_targets(
            serde_json::to_string(&json!([
                {"name": "platform-webhook", "url": json_url, "bearerToken": "tok-1"},
                {"name": "mesh-slack", "url": slack_url, "format": "slack", "events": ["abort", "halt"]},
            ]))
            .unwrap()
            .as_bytes(),
        )
        .unwrap(),
    );
    let obj = rollout("checkout", 3);
    n.notify(&obj, abort());
    // The same transition decided again (a retried reconcile) is not sent again.
    n.notify(&obj, abort());
    // Neither is a reconcile that read the phase back from status (no transition).
    n.notify(
        &obj,
        Notice {
            from: "Aborted".into(),
            ..abort()
        },
    );
    // A promotion goes to the generic target only: the Slack one wants aborts and halts.
    n.notify(
        &rollout("cart", 7),
        Notice {
            event: NoticeEvent::Promotion,
            from: "Progressing".into(),
            to: "Promoted".into(),
            reason: "Promoted".into(),
            message: String::new(),
            figures: Map::new(),
        },
    );

    wait_for(
        "both notices at the JSON receiver",
        Duration::from_secs(10),
        || json_got.lock().unwrap().len() == 2,
    )
    .await;
    wait_for(
        "the abort at the Slack receiver",
        Duration::from_secs(10),
        || !slack_got.lock().unwrap().is_empty(),
    )
    .await;
    sleep(Duration::from_millis(300)).await;

    let json_bodies = json_got.lock().unwrap().clone();
    assert_eq!(json_bodies.len(), 2, "{json_bodies:?}");
    let (auth, aborted) = json_bodies
        .iter()
        .find(|(_, b)| b["event"] == "abort")
        .cloned()
        .expect("the abort");
    assert_eq!(auth.as_deref(), Some("Bearer tok-1"));
    println!(
        "generic JSON payload of a canary abort:\n{}",
        serde_json::to_string_pretty(&aborted).unwrap()
    );
    let want = [
        ("kind", json!("Rollout")),
        ("namespace", json!("shop")),
        ("name", json!("checkout")),
        ("cluster", json!("east-1")),
        ("operator", json!("sluice-rollout-weights")),
        ("generation", json!(3)),
        (
            "transition",
            json!({"from": "Progressing", "to": "Aborted"}),
        ),
        ("reason", json!("GateFailed")),
        (
            "message",
            json!("gate error-rate: 5xx ratio 0.21 above 0.05"),
        ),
    ];
    for (field, value) in want {
        assert_eq!(aborted[field], value, "{field} in {aborted}");
    }
    assert_eq!(aborted["figures"]["observed"], 0.21);
    assert_eq!(aborted["figures"]["threshold"], 0.05);
    assert_eq!(aborted["figures"]["canaryWeight"], 10);
    assert!(aborted["observedAt"].as_str().unwrap().ends_with('Z'));

    let slack = slack_got.lock().unwrap().clone();
    assert_eq!(
        slack.len(),
        1,
        "the promotion is not for the Slack target: {slack:?}"
    );
    let (auth, body) = &slack[0];
    assert_eq!(auth, &None);
    println!(
        "Slack payload of the same abort:\n{}",
        serde_json::to_string_pretty(body).unwrap()
    );
    assert_eq!(
        body["text"],
        "Rollout shop/checkout aborted on east-1: GateFailed"
    );
    assert_eq!(
        body["blocks"][0]["text"]["text"],
        "Rollout shop/checkout Progressing → Aborted"
    );
    let fields = body["blocks"][2]["fields"].as_array().unwrap();
    assert!(
        fields.contains(&json!({"type": "mrkdwn", "text": "*observed*\n0.21"})),
        "{body}"
    );
    assert!(
        fields.contains(&json!({"type": "mrkdwn", "text": "*threshold*\n0.05"})),
        "{body}"
    );

    // A receiver holds a notice before the notifier has read its answer and counted it sent.
    wait_for("every notice counted sent", Duration::from_secs(10), || {
        metrics.sent("platform-webhook", "Rollout", NoticeEvent::Abort) == 1
            && metrics.sent("platform-webhook", "Rollout", NoticeEvent::Promotion) == 1
            && metrics.sent("mesh-slack", "Rollout", NoticeEvent::Abort) == 1
    })
    .await;
    assert_eq!(
        metrics.sent("platform-webhook", "Rollout", NoticeEvent::Abort),
        1
    );
    assert_eq!(
        metrics.sent("platform-webhook", "Rollout", NoticeEvent::Promotion),
        1
    );
    assert_eq!(metrics.sent("mesh-slack", "Rollout", NoticeEvent::Abort), 1);

    // A new generation that aborts again is a new transition.
    n.notify(&rollout("checkout", 4), abort());
    wait_for("the second abort", Duration::from_secs(10), || {
        json_got.lock().unwrap().len() == 3
    })
    .await;
}

#[tokio::test]
async fn a_receiver_answering_500_then_200_gets_the_message_once() {
    let (url, got) = receiver(&[500], false).await;
    let (n, metrics, registry) = notifier(None);
    n.set_targets(
        parse_targets(format!(r#"[{{"name": "flaky", "url": "{url}"}}]"#).as_bytes()).unwrap(),
    );
    n.notify(&rollout("checkout", 3), abort());
    wait_for("the delivery", Duration::from_secs(10), || {
        metrics.sent("flaky", "Rollout", NoticeEvent::Abort) == 1
    })
    .await;
    sleep(Duration::from_millis(400)).await;
    let got = got.lock().unwrap().clone();
    assert_eq!(got.len(), 2, "one refused attempt, one accepted: {got:?}");
    assert_eq!(got[0].1, got[1].1, "the retry sends the same message");
    assert_eq!(metrics.failures("flaky", "Rollout", NoticeEvent::Abort), 0);
    let text = encode(&registry);
    assert!(
        text.contains(
            r#"sluice_notifications_sent_total{target="flaky",kind="Rollout",event="abort"} 1"#
        ),
        "{text}"
    );
}

#[tokio::test]
async fn a_dead_receiver_is_counted_and_reported_on_the_object_without_delaying_the_caller() {
    let emu = emulator(&["shop"]).await;
    let client = emu.client();
    let recorder = EventRecorder::new(client.clone(), "sluice-rollout-weights");
    let (hung_url, hung_got) = receiver(&[], true).await;
    // A port nobody listens on: connections are refused.
    let refused = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap()
    };
    let (n, metrics, registry) = notifier(Some(recorder));
    n.set_targets(
        parse_targets(
            serde_json::to_string(&json!([
                {"name": "hung", "url": hung_url},
                {"name": "refused", "url": format!("http://{refused}/hook"), "format": "slack"},
            ]))
            .unwrap()
            .as_bytes(),
        )
        .unwrap(),
    );
    let obj = rollout("checkout", 3);
    let start = std::time::Instant::now();
    n.notify(&obj, abort());
    let took = start.elapsed();
    assert!(took < Duration::from_millis(50), "notify waited {took:?}");

    wait_for("both failures counted", Duration::from_secs(15), || {
        metrics.failures("hung", "Rollout", NoticeEvent::Abort) == 1
            && metrics.failures("refused", "Rollout", NoticeEvent::Abort) == 1
    })
    .await;
    assert_eq!(
        hung_got.lock().unwrap().len(),
        3,
        "three attempts, each timed out"
    );
    let text = encode(&registry);
    assert!(
        text.contains(
            r#"sluice_notification_failures_total{target="hung",kind="Rollout",event="abort"} 1"#
        ),
        "{text}"
    );

    let events: Api<Event> = Api::namespaced(client, "shop");
    let mut notes = Vec::new();
    let start = Instant::now();
    while notes.len() < 2 && start.elapsed() < Duration::from_secs(10) {
        notes = events
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .into_iter()
            .filter(|e| {
                e.reason.as_deref() == Some("NotificationFailed")
                    && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some("checkout")
                    && e.type_.as_deref() == Some("Warning")
            })
            .filter_map(|e| e.note)
            .collect();
        sleep(Duration::from_millis(50)).await;
    }
    notes.sort();
    assert_eq!(notes.len(), 2, "{notes:?}");
    assert!(
        notes[0].starts_with(
            "notifying target \"hung\" of abort (Progressing → Aborted) failed after 3 attempt(s): "
        ),
        "{notes:?}"
    );
    assert!(
        notes[1].starts_with(
            "notifying target \"refused\" of abort (Progressing → Aborted) failed after 3 attempt(s): "
        ),
        "{notes:?}"
    );
    assert!(notes[1].contains("onnection refused"), "{notes:?}");
    for note in &notes {
        assert!(
            !note.contains("127.0.0.1"),
            "a target's URL is never shown: {note}"
        );
    }
    emu.shutdown().await;
}

/// The emulator with `namespaces` created.
async fn emulator(namespaces: &[&str]) -> kube_emulator::Emulator {
    let emu = kube_emulator::Emulator::start().await;
    let api: Api<Namespace> = Api::all(emu.client());
    for ns in namespaces {
        let obj = Namespace {
            metadata: ObjectMeta {
                name: Some((*ns).into()),
                ..ObjectMeta::default()
            },
            ..Namespace::default()
        };
        api.create(&PostParams::default(), &obj).await.unwrap();
    }
    emu
}

#[tokio::test]
async fn a_dead_target_does_not_hold_back_the_others() {
    let (ok_url, ok_got) = receiver(&[], false).await;
    let (hung_url, hung_got) = receiver(&[], true).await;
    // Each attempt at the dead target holds a connection for 5 s.
    let (n, metrics, _registry) = notifier_with(
        None,
        RetryPolicy {
            attempts: 2,
            base: Duration::from_millis(50),
            max: Duration::from_millis(50),
            timeout: Duration::from_secs(5),
        },
    );
    n.set_targets(
        parse_targets(
            serde_json::to_string(&json!([
                {"name": "hung", "url": hung_url},
                {"name": "answering", "url": ok_url},
            ]))
            .unwrap()
            .as_bytes(),
        )
        .unwrap(),
    );
    // Twenty Rollouts abort at once (a fleet-wide bad metric).
    for i in 0..20 {
        n.notify(&rollout(&format!("r{i}"), 1), abort());
    }
    // Held back by the hung target, 20 notices would wait out its 5 s timeout a round of
    // in-flight requests at a time (25 s and more); 15 s leaves room for a loaded machine.
    // The receiver holds a notice before the notifier has read its answer and counted it sent,
    // so both are waited for.
    wait_for(
        "every abort at the answering target, and counted sent, while the other hangs",
        Duration::from_secs(15),
        || {
            ok_got.lock().unwrap().len() == 20
                && metrics.sent("answering", "Rollout", NoticeEvent::Abort) == 20
        },
    )
    .await;
    let held = hung_got.lock().unwrap().len();
    assert!(
        held <= sluice_runtime::notify::TARGET_IN_FLIGHT,
        "the dead target holds at most its own {} connections: {held}",
        sluice_runtime::notify::TARGET_IN_FLIGHT
    );
}

fn secret(targets: &Value) -> Secret {
    Secret {
        metadata: ObjectMeta {
            name: Some("sluice-notifications".into()),
            namespace: Some("sluice-system".into()),
            ..ObjectMeta::default()
        },
        data: Some(
            [(
                "targets.json".to_owned(),
                ByteString(serde_json::to_vec(targets).unwrap()),
            )]
            .into(),
        ),
        ..Secret::default()
    }
}

#[tokio::test]
async fn targets_follow_their_secret() {
    let emu = emulator(&["sluice-system"]).await;
    let secrets: Api<Secret> = Api::namespaced(emu.client(), "sluice-system");
    let (url_a, got_a) = receiver(&[], false).await;
    let (url_b, got_b) = receiver(&[], false).await;
    secrets
        .create(
            &PostParams::default(),
            &secret(&json!([{"name": "a", "url": url_a}])),
        )
        .await
        .unwrap();
    let (n, _metrics, registry) = notifier(None);
    let stop = CancellationToken::new();
    let watching = tokio::spawn(n.clone().watch_secret(
        secrets.clone(),
        "sluice-notifications".into(),
        stop.clone(),
    ));
    let names = |n: &Notifier| n.target_names();
    wait_for("target a read", Duration::from_secs(10), || {
        names(&n) == ["a"]
    })
    .await;

    // Rotated: the next notice goes to the new target.
    let mut s = secrets.get("sluice-notifications").await.unwrap();
    s.data = secret(&json!([{"name": "b", "url": url_b}])).data;
    secrets
        .replace("sluice-notifications", &PostParams::default(), &s)
        .await
        .unwrap();
    wait_for("target b read", Duration::from_secs(10), || {
        names(&n) == ["b"]
    })
    .await;
    n.notify(&rollout("checkout", 3), abort());
    wait_for("the abort at b", Duration::from_secs(10), || {
        got_b.lock().unwrap().len() == 1
    })
    .await;
    assert!(got_a.lock().unwrap().is_empty());

    // A bad edit is refused and loses nothing: b stays in force.
    let mut s = secrets.get("sluice-notifications").await.unwrap();
    s.data = secret(&json!([{"name": "c", "url": "ftp://x/y"}])).data;
    secrets
        .replace("sluice-notifications", &PostParams::default(), &s)
        .await
        .unwrap();
    wait_for("the refusal counted", Duration::from_secs(10), || {
        encode(&registry).contains("sluice_notification_config_errors_total 1")
    })
    .await;
    assert_eq!(names(&n), ["b"]);

    // Deleted: no targets.
    secrets
        .delete("sluice-notifications", &DeleteParams::default())
        .await
        .unwrap();
    wait_for("no targets", Duration::from_secs(10), || {
        names(&n).is_empty()
    })
    .await;

    stop.cancel();
    timeout(Duration::from_secs(5), watching)
        .await
        .expect("the watch stops")
        .unwrap();
    emu.shutdown().await;
}
