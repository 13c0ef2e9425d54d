//! Narration: one plain line per thing that happened ("east-1: route shop/checkout 90/10 ..."),
//! from watching the clusters (routes, sluice objects, Argo CD Applications, Events) and from the
//! mesh's own telemetry (the canary share Prometheus reports). The line texts are pure functions
//! of an object ([`route_line`], [`status_line`], [`application_line`], [`event_line`]);
//! [`Narrator`] only watches and prints. Never writes to a cluster.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use kube::api::{ApiResource, DynamicObject, GroupVersionKind};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client};
use serde_json::Value;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

fn meta_name(obj: &Value) -> String {
    let name = obj
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or("?");
    match obj.pointer("/metadata/namespace").and_then(Value::as_str) {
        Some(ns) => format!("{ns}/{name}"),
        None => name.to_string(),
    }
}

fn short_digest(revision: &str) -> String {
    match revision.strip_prefix("sha256:") {
        Some(hex) if hex.len() > 12 => format!("sha256:{}", &hex[..12]),
        _ => revision.to_string(),
    }
}

/// The weights of an HTTPRoute's rules, e.g. `route shop/checkout 90/10 (checkout-v2-13 90,
/// checkout-v2-14 10)`. A backendRef without a weight has Gateway API's default weight 1; rules
/// without backendRefs are left out; several rules are separated by `; `.
pub fn route_line(route: &Value) -> String {
    let mut rules = Vec::new();
    let empty = Vec::new();
    let all = route
        .pointer("/spec/rules")
        .and_then(Value::as_array)
        .unwrap_or(&empty);
    for rule in all {
        let refs = rule
            .get("backendRefs")
            .and_then(Value::as_array)
            .unwrap_or(&empty);
        if refs.is_empty() {
            continue;
        }
        let weights: Vec<(String, i64)> = refs
            .iter()
            .map(|r| {
                (
                    r.get("name")
                        .and_then(Value::as_str)
                        .unwrap_or("?")
                        .to_string(),
                    r.get("weight").and_then(Value::as_i64).unwrap_or(1),
                )
            })
            .collect();
        let split = weights
            .iter()
            .map(|(_, w)| w.to_string())
            .collect::<Vec<_>>()
            .join("/");
        let named = weights
            .iter()
            .map(|(n, w)| format!("{n} {w}"))
            .collect::<Vec<_>>()
            .join(", ");
        let label = rule
            .get("name")
            .and_then(Value::as_str)
            .map(|n| format!("{n}: "))
            .unwrap_or_default();
        let matches = rule
            .get("matches")
            .and_then(Value::as_array)
            .map(|m| {
                m.iter()
                    .any(|m| m.get("headers").is_some() || m.get("method").is_some())
            })
            .unwrap_or(false);
        let kind = if matches { " matched" } else { "" };
        rules.push(format!("{label}{split} ({named}){kind}"));
    }
    let owned = route
        .pointer("/metadata/annotations/sluice.dev~1owned-by-rollout")
        .and_then(Value::as_str)
        .map(|r| format!(", owned by rollout {r}"))
        .unwrap_or_default();
    if rules.is_empty() {
        format!("route {} has no backends{owned}", meta_name(route))
    } else {
        format!("route {} {}{owned}", meta_name(route), rules.join("; "))
    }
}

/// A sluice object's state: kind, name, `status.phase` and the `Ready` condition, e.g.
/// `Rollout shop/checkout: Progressing; Ready=True StepPassed`. `None` before it has a status.
pub fn status_line(kind: &str, obj: &Value) -> Option<String> {
    let status = obj.get("status")?;
    let mut parts = Vec::new();
    if let Some(phase) = status.get("phase").and_then(Value::as_str) {
        parts.push(phase.to_string());
    }
    if let Some(ready) = status
        .get("conditions")
        .and_then(Value::as_array)
        .and_then(|cs| {
            cs.iter()
                .find(|c| c.get("type").and_then(Value::as_str) == Some("Ready"))
        })
    {
        let s = ready.get("status").and_then(Value::as_str).unwrap_or("?");
        let reason = ready.get("reason").and_then(Value::as_str).unwrap_or("");
        let message = ready.get("message").and_then(Value::as_str).unwrap_or("");
        let mut text = format!("Ready={s} {reason}");
        if s != "True" && !message.is_empty() {
            text.push_str(&format!(" ({message})"));
        }
        parts.push(text.trim_end().to_string());
    }
    if parts.is_empty() {
        return None;
    }
    Some(format!("{kind} {}: {}", meta_name(obj), parts.join("; ")))
}

/// An Argo CD Application's sync and health, e.g. `application argocd/east-1-mesh Synced at
/// sha256:0123456789ab, Healthy`. `None` before Argo CD reported anything.
pub fn application_line(app: &Value) -> Option<String> {
    let sync = app.pointer("/status/sync/status").and_then(Value::as_str)?;
    let revision = app
        .pointer("/status/sync/revision")
        .and_then(Value::as_str)
        .map(|r| format!(" at {}", short_digest(r)))
        .unwrap_or_default();
    let health = app
        .pointer("/status/health/status")
        .and_then(Value::as_str)
        .map(|h| format!(", {h}"))
        .unwrap_or_default();
    let op = app
        .pointer("/status/operationState/phase")
        .and_then(Value::as_str)
        .map(|p| format!(", last sync {p}"))
        .unwrap_or_default();
    Some(format!(
        "application {} {sync}{revision}{health}{op}",
        meta_name(app)
    ))
}

/// A Kubernetes Event (`events.k8s.io/v1`) an operator recorded, e.g. `Rollout shop/checkout
/// StepStarted: weight 5`. Only Events about sluice kinds are narrated.
pub fn event_line(event: &Value) -> Option<String> {
    let regarding = event.get("regarding")?;
    let api_version = regarding.get("apiVersion").and_then(Value::as_str)?;
    if !api_version.starts_with("sluice.dev/") {
        return None;
    }
    let kind = regarding.get("kind").and_then(Value::as_str).unwrap_or("?");
    let name = regarding.get("name").and_then(Value::as_str).unwrap_or("?");
    let ns = regarding
        .get("namespace")
        .and_then(Value::as_str)
        .map(|n| format!("{n}/"))
        .unwrap_or_default();
    let reason = event.get("reason").and_then(Value::as_str).unwrap_or("?");
    let note = event.get("note").and_then(Value::as_str).unwrap_or("");
    let warn = if event.get("type").and_then(Value::as_str) == Some("Warning") {
        "warning: "
    } else {
        ""
    };
    Some(
        format!("{warn}{kind} {ns}{name} {reason}: {note}")
            .trim_end()
            .to_string(),
    )
}

/// Whether a new measured share differs enough from the last one narrated to say it again
/// (half a percentage point).
pub fn share_changed(last: Option<f64>, now: f64) -> bool {
    last.is_none_or(|l| (l - now).abs() >= 0.005)
}

/// What a watched resource is narrated as.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Gateway API HTTPRoute.
    Route,
    /// sluice Rollout.
    Rollout,
    /// sluice WaveGate.
    WaveGate,
    /// sluice BundlePin.
    BundlePin,
    /// sluice RevisionUpgrade.
    RevisionUpgrade,
    /// Argo CD Application.
    Application,
    /// events.k8s.io Event.
    Event,
}

impl Kind {
    /// The line for an object of this kind (`None`: nothing to say yet).
    pub fn line(self, obj: &Value) -> Option<String> {
        match self {
            Kind::Route => Some(route_line(obj)),
            Kind::Rollout | Kind::WaveGate | Kind::BundlePin | Kind::RevisionUpgrade => {
                status_line(self.kind_name(), obj)
            }
            Kind::Application => application_line(obj),
            Kind::Event => event_line(obj),
        }
    }

    /// The Kubernetes kind name.
    pub fn kind_name(self) -> &'static str {
        match self {
            Kind::Route => "HTTPRoute",
            Kind::Rollout => "Rollout",
            Kind::WaveGate => "WaveGate",
            Kind::BundlePin => "BundlePin",
            Kind::RevisionUpgrade => "RevisionUpgrade",
            Kind::Application => "Application",
            Kind::Event => "Event",
        }
    }

    fn resource(self) -> ApiResource {
        let (g, v, k, plural) = match self {
            Kind::Route => ("gateway.networking.k8s.io", "v1", "HTTPRoute", "httproutes"),
            Kind::Rollout => ("sluice.dev", "v1alpha1", "Rollout", "rollouts"),
            Kind::WaveGate => ("sluice.dev", "v1alpha1", "WaveGate", "wavegates"),
            Kind::BundlePin => ("sluice.dev", "v1alpha1", "BundlePin", "bundlepins"),
            Kind::RevisionUpgrade => (
                "sluice.dev",
                "v1alpha1",
                "RevisionUpgrade",
                "revisionupgrades",
            ),
            Kind::Application => ("argoproj.io", "v1alpha1", "Application", "applications"),
            Kind::Event => ("events.k8s.io", "v1", "Event", "events"),
        };
        ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(g, v, k), plural)
    }
}

/// What to watch in a management cluster.
pub const MANAGEMENT_KINDS: &[Kind] = &[
    Kind::WaveGate,
    Kind::BundlePin,
    Kind::Application,
    Kind::Event,
];
/// What to watch in a workload cluster.
pub const WORKLOAD_KINDS: &[Kind] = &[
    Kind::Route,
    Kind::Rollout,
    Kind::RevisionUpgrade,
    Kind::Event,
];

/// Prints narration lines and runs the watches that produce them.
#[derive(Debug)]
pub struct Narrator {
    tx: mpsc::UnboundedSender<String>,
    printer: JoinHandle<()>,
    watches: Mutex<Vec<JoinHandle<()>>>,
    transcript: Arc<Mutex<Vec<String>>>,
}

impl Narrator {
    /// Starts the printer (stdout, one line each, flushed).
    pub fn start() -> Self {
        let (tx, mut rx) = mpsc::unbounded_channel::<String>();
        let transcript = Arc::new(Mutex::new(Vec::new()));
        let kept = transcript.clone();
        let printer = tokio::spawn(async move {
            use std::io::Write;
            while let Some(line) = rx.recv().await {
                let mut out = std::io::stdout().lock();
                let _ = writeln!(out, "{line}");
                let _ = out.flush();
                if let Ok(mut t) = kept.lock() {
                    t.push(line);
                }
            }
        });
        Self {
            tx,
            printer,
            watches: Mutex::new(Vec::new()),
            transcript,
        }
    }

    /// Says one line.
    pub fn say(&self, line: impl Into<String>) {
        let _ = self.tx.send(line.into());
    }

    /// A sender scenarios and tasks may keep.
    pub fn sender(&self) -> mpsc::UnboundedSender<String> {
        self.tx.clone()
    }

    /// Every line said so far.
    pub fn transcript(&self) -> Vec<String> {
        self.transcript
            .lock()
            .map(|t| t.clone())
            .unwrap_or_default()
    }

    /// Watches `kind` in a cluster and narrates each change of its line, prefixed with the
    /// cluster name. A deleted object is narrated as deleted.
    pub fn watch(&self, cluster: &str, client: Client, kind: Kind) {
        let tx = self.tx.clone();
        let cluster = cluster.to_string();
        let handle = tokio::spawn(async move {
            let api: Api<DynamicObject> = Api::all_with(client, &kind.resource());
            let config = watcher::Config::default();
            let stream = watcher::watcher(api, config).default_backoff();
            futures::pin_mut!(stream);
            let mut last: BTreeMap<String, String> = BTreeMap::new();
            let mut initial = true;
            while let Some(event) = stream.next().await {
                let Ok(event) = event else { continue };
                match event {
                    watcher::Event::Init => initial = true,
                    watcher::Event::InitDone => initial = false,
                    watcher::Event::InitApply(obj) | watcher::Event::Apply(obj) => {
                        let Ok(value) = serde_json::to_value(&obj) else {
                            continue;
                        };
                        let key = meta_name(&value);
                        // Events narrate once, when they are new; objects on each change.
                        if kind == Kind::Event && initial {
                            last.insert(key, String::new());
                            continue;
                        }
                        let Some(line) = kind.line(&value) else {
                            continue;
                        };
                        if last.get(&key) != Some(&line) {
                            last.insert(key, line.clone());
                            let _ = tx.send(format!("{cluster}: {line}"));
                        }
                    }
                    watcher::Event::Delete(obj) => {
                        let Ok(value) = serde_json::to_value(&obj) else {
                            continue;
                        };
                        let key = meta_name(&value);
                        if last.remove(&key).is_some() && kind != Kind::Event {
                            let what = match kind {
                                Kind::Route => "route",
                                Kind::Application => "application",
                                Kind::Event => continue,
                                other => other.kind_name(),
                            };
                            let _ = tx.send(format!("{cluster}: {what} {key} deleted"));
                        }
                    }
                }
            }
        });
        if let Ok(mut w) = self.watches.lock() {
            w.push(handle);
        }
    }

    /// Adds a task that belongs to the narration (stopped with it).
    pub fn adopt(&self, handle: JoinHandle<()>) {
        if let Ok(mut w) = self.watches.lock() {
            w.push(handle);
        }
    }

    /// Stops every watch, prints what was queued and ends the printer.
    pub async fn stop(self) {
        let handles = self
            .watches
            .lock()
            .map(|mut w| std::mem::take(&mut *w))
            .unwrap_or_default();
        for h in &handles {
            h.abort();
        }
        for h in handles {
            let _ = h.await;
        }
        drop(self.tx);
        let _ = tokio::time::timeout(Duration::from_secs(5), self.printer).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn route_lines_say_the_split_of_every_rule_with_backends() {
        let cases = [
            (
                json!({"metadata": {"name": "checkout", "namespace": "shop"}, "spec": {"rules": [
                    {"backendRefs": [{"name": "checkout-v2-13", "weight": 90}, {"name": "checkout-v2-14", "weight": 10}]}
                ]}}),
                "route shop/checkout 90/10 (checkout-v2-13 90, checkout-v2-14 10)",
            ),
            (
                json!({"metadata": {"name": "checkout", "namespace": "shop",
                        "annotations": {"sluice.dev/owned-by-rollout": "checkout"}},
                       "spec": {"rules": [
                    {"name": "cohort", "matches": [{"headers": [{"name": "x-cohort", "value": "staff"}]}],
                     "backendRefs": [{"name": "checkout-v2-14"}]},
                    {"backendRefs": [{"name": "checkout-v2-13", "weight": 95}, {"name": "checkout-v2-14", "weight": 5}]}
                ]}}),
                "route shop/checkout cohort: 1 (checkout-v2-14 1) matched; 95/5 (checkout-v2-13 95, checkout-v2-14 5), owned by rollout checkout",
            ),
            (
                json!({"metadata": {"name": "r", "namespace": "n"}, "spec": {"rules": [{"filters": []}]}}),
                "route n/r has no backends",
            ),
        ];
        for (route, want) in cases {
            assert_eq!(route_line(&route), want);
        }
    }

    #[test]
    fn status_lines_show_phase_and_ready_with_the_message_only_when_not_ready() {
        let cases = [
            (
                json!({"metadata": {"name": "c", "namespace": "shop"}}),
                None,
            ),
            (
                json!({"metadata": {"name": "c", "namespace": "shop"}, "status": {"phase": "Progressing",
                    "conditions": [{"type": "Ready", "status": "True", "reason": "Valid", "message": "ok"}]}}),
                Some("Rollout shop/c: Progressing; Ready=True Valid"),
            ),
            (
                json!({"metadata": {"name": "c", "namespace": "shop"}, "status": {
                    "conditions": [{"type": "Ready", "status": "False", "reason": "InvalidSpec", "message": "route missing"}]}}),
                Some("Rollout shop/c: Ready=False InvalidSpec (route missing)"),
            ),
        ];
        for (obj, want) in cases {
            assert_eq!(status_line("Rollout", &obj).as_deref(), want);
        }
    }

    #[test]
    fn application_lines_show_sync_revision_and_health() {
        let app = json!({"metadata": {"name": "east-1-mesh", "namespace": "argocd"}, "status": {
            "sync": {"status": "Synced", "revision": "sha256:0123456789abcdef0123"},
            "health": {"status": "Healthy"}, "operationState": {"phase": "Succeeded"}}});
        assert_eq!(
            application_line(&app).as_deref(),
            Some(
                "application argocd/east-1-mesh Synced at sha256:0123456789ab, Healthy, last sync Succeeded"
            )
        );
        assert_eq!(application_line(&json!({"metadata": {"name": "a"}})), None);
    }

    #[test]
    fn event_lines_only_for_sluice_kinds() {
        let ev = |api: &str, ty: &str| {
            json!({"regarding": {"apiVersion": api, "kind": "Rollout", "namespace": "shop", "name": "checkout"},
                   "reason": "StepStarted", "note": "weight 5", "type": ty})
        };
        assert_eq!(
            event_line(&ev("sluice.dev/v1alpha1", "Normal")).as_deref(),
            Some("Rollout shop/checkout StepStarted: weight 5")
        );
        assert_eq!(
            event_line(&ev("sluice.dev/v1alpha1", "Warning")).as_deref(),
            Some("warning: Rollout shop/checkout StepStarted: weight 5")
        );
        assert_eq!(event_line(&ev("apps/v1", "Normal")), None);
    }

    #[test]
    fn share_is_said_again_only_after_half_a_point() {
        let cases = [
            (None, 0.1, true),
            (Some(0.1), 0.103, false),
            (Some(0.1), 0.106, true),
            (Some(0.1), 0.094, true),
        ];
        for (last, now, want) in cases {
            assert_eq!(share_changed(last, now), want, "{last:?} -> {now}");
        }
    }
}
