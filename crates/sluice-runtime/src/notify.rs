//! Webhook notifications of the transitions people act on: a canary aborted or promoted, a wave
//! halted, a bundle pinned or released, a fleet upgrade completed, aborted or held.
//!
//! Owns the targets (read from one Secret, re-read when it changes), the payloads (generic JSON
//! and a Slack-compatible `text`/`blocks` body), deduplication, and delivery on a background
//! task with a bounded queue and jittered, capped exponential back-off. A delivery that fails
//! for good counts in `sluice_notification_failures_total{target,kind,event}` and becomes a
//! Warning Event (`NotificationFailed`) on the object.
//!
//! Operators decide *what* is worth a notice (a pure function of the status before and after
//! their status write, per kind) and call [`Notifier::notify`] right after the write succeeded;
//! only the leader reconciles, so only the leader notifies. `notify` never waits: it hands the
//! notice to the queue, or counts a failure when the queue is full. Must never block a
//! reconcile, never log or put into an Event a target's URL, headers or token (a Slack webhook
//! URL is itself a credential), and never follow a redirect with a target's credentials.

pub mod checks;

use std::{
    collections::{BTreeMap, HashMap, HashSet, VecDeque},
    sync::{
        Arc, Mutex, RwLock,
        atomic::{AtomicUsize, Ordering},
    },
    time::Duration,
};

use clap::Args;
use k8s_openapi::{
    api::core::v1::{ObjectReference, Secret},
    apimachinery::pkg::apis::meta::v1::Condition,
};
use kube::{
    Api, Resource,
    api::{WatchEvent, WatchParams},
};
use prometheus_client::{
    encoding::EncodeLabelSet,
    metrics::{counter::Counter, family::Family, gauge::Gauge},
    registry::Registry,
};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};
use tokio::sync::{Semaphore, mpsc};
use tokio_util::sync::CancellationToken;

use crate::{
    events::{EventRecorder, Severity},
    operator::jitter,
};

/// The key of the notifications Secret that holds the targets (a JSON list).
pub const SECRET_KEY: &str = "targets.json";
/// Event reason of a notification that could not be delivered.
pub const REASON_FAILED: &str = "NotificationFailed";
/// Notices waiting for delivery at most; beyond it a notice is dropped and counted as failed.
pub const QUEUE_CAPACITY: usize = 1024;
/// Transitions remembered for deduplication; the oldest is forgotten first.
pub const SEEN_CAPACITY: usize = 16_384;
/// Deliveries to one target in flight at once.
pub const TARGET_IN_FLIGHT: usize = 4;
/// Notices for one target waiting or in flight at most; beyond it a notice for that target is
/// dropped and counted as failed.
pub const TARGET_BACKLOG: usize = 256;

/// Flags of the notifier, part of every operator's [`crate::RuntimeArgs`].
#[derive(Debug, Clone, Args)]
pub struct NotifyArgs {
    /// Name of the Secret in the operator's namespace whose `targets.json` lists the webhook
    /// targets; re-read when it changes. Empty: no notifications.
    #[arg(long, env = "SLUICE_NOTIFICATIONS_SECRET", default_value = "")]
    pub notifications_secret: String,
    /// The cluster's name as notifications report it, e.g. `east-1`.
    #[arg(long, env = "SLUICE_NOTIFICATIONS_CLUSTER", default_value = "")]
    pub notifications_cluster: String,
}

/// What happened, as targets subscribe to it (`events` in a target).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum NoticeEvent {
    /// A canary (Rollout) or a fleet upgrade (RevisionUpgrade) was aborted.
    Abort,
    /// A canary was promoted to 100%.
    Promotion,
    /// A configuration wave (WaveGate) halted.
    Halt,
    /// A BundlePin holds its Applications on the signed bundle.
    Pin,
    /// A BundlePin handed its Applications back to Git.
    Release,
    /// A fleet upgrade (RevisionUpgrade) completed.
    Complete,
    /// A fleet upgrade is held (paused, inconclusive gates, issuance budget).
    Hold,
}

impl NoticeEvent {
    /// The stable name (metric label, `events` entry, payload `event`).
    pub fn label(self) -> &'static str {
        match self {
            NoticeEvent::Abort => "abort",
            NoticeEvent::Promotion => "promotion",
            NoticeEvent::Halt => "halt",
            NoticeEvent::Pin => "pin",
            NoticeEvent::Release => "release",
            NoticeEvent::Complete => "complete",
            NoticeEvent::Hold => "hold",
        }
    }
}

/// One transition worth telling people about, decided by the operator from its status.
#[derive(Debug, Clone, PartialEq)]
pub struct Notice {
    /// What happened.
    pub event: NoticeEvent,
    /// The phase before the transition (empty for a new object).
    pub from: String,
    /// The phase after it.
    pub to: String,
    /// Why, as a stable CamelCase reason from the status (e.g. `GateFailed`).
    pub reason: String,
    /// The status's human-readable explanation, or empty.
    pub message: String,
    /// Whatever figures the status holds about it (weight, observed value vs threshold, wave,
    /// digest, counts), by name.
    pub figures: Map<String, Value>,
}

impl Notice {
    /// A notice of `event` from phase `from` to `to`, with no reason, message or figures yet.
    pub fn new(event: NoticeEvent, from: &str, to: &str) -> Self {
        Self {
            event,
            from: from.to_owned(),
            to: to.to_owned(),
            reason: String::new(),
            message: String::new(),
            figures: Map::new(),
        }
    }

    /// The notice of a status write that moved the phase from `from` (`None`: a new object) to
    /// `to`, when `event` says `to` is worth one, with `reason` (the object's signal reason).
    /// `None` when the phase did not change: a status read back after a restart or a requeue is
    /// no transition. Phases are named by their `Debug` form.
    pub fn of_transition<P: Copy + PartialEq + std::fmt::Debug>(
        from: Option<P>,
        to: P,
        event: impl FnOnce(P) -> Option<NoticeEvent>,
        reason: impl Into<String>,
    ) -> Option<Self> {
        if from == Some(to) {
            return None;
        }
        let from_name = from.map(|p| format!("{p:?}")).unwrap_or_default();
        let mut n = Notice::new(event(to)?, &from_name, &format!("{to:?}"));
        n.reason = reason.into();
        Some(n)
    }

    /// Sets the message to that of the condition carrying the notice's reason (empty when no
    /// condition does).
    pub fn message_from(&mut self, conditions: &[Condition]) -> &mut Self {
        self.message = conditions
            .iter()
            .find(|c| c.reason == self.reason)
            .map(|c| c.message.clone())
            .unwrap_or_default();
        self
    }

    /// Adds figure `name` when `value` is known (not `None`, not null).
    pub fn figure(&mut self, name: &str, value: impl Serialize) -> &mut Self {
        if let Ok(v) = serde_json::to_value(value)
            && !v.is_null()
        {
            self.figures.insert(name.to_owned(), v);
        }
        self
    }

    /// Adds the figures of a gate's verdict (a serialized `GateVerdict`): `gate`, `verdict`,
    /// `observed` (its value), `baseline`, `threshold`, `samples`.
    pub fn gate(&mut self, verdict: impl Serialize) -> &mut Self {
        let Ok(Value::Object(v)) = serde_json::to_value(verdict) else {
            return self;
        };
        for (from, to) in [
            ("gate", "gate"),
            ("verdict", "verdict"),
            ("value", "observed"),
            ("baseline", "baseline"),
            ("threshold", "threshold"),
            ("samples", "samples"),
        ] {
            if let Some(x) = v.get(from).filter(|x| !x.is_null()) {
                self.figures.insert(to.to_owned(), x.clone());
            }
        }
        self
    }
}

/// Payload format of a target.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Format {
    /// The generic JSON document ([`Payload`]).
    #[default]
    Json,
    /// A Slack-compatible incoming-webhook body (`text` plus `blocks`); Mattermost and Rocket.Chat
    /// accept it too.
    Slack,
}

/// One webhook target as written in the Secret's `targets.json`.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct TargetSpec {
    name: String,
    url: String,
    #[serde(default)]
    format: Format,
    #[serde(default)]
    headers: BTreeMap<String, String>,
    #[serde(default)]
    bearer_token: Option<String>,
    #[serde(default)]
    events: Vec<NoticeEvent>,
    #[serde(default)]
    kinds: Vec<String>,
}

/// A validated target. Its URL, headers and token are never logged.
#[derive(Clone)]
pub struct Target {
    /// The target's name: the `target` label of the metrics and the name in Events.
    pub name: String,
    url: reqwest::Url,
    /// The payload format.
    pub format: Format,
    headers: reqwest::header::HeaderMap,
    /// The events it wants (empty: all).
    pub events: Vec<NoticeEvent>,
    /// The kinds it wants (empty: all).
    pub kinds: Vec<String>,
}

impl std::fmt::Debug for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Target")
            .field("name", &self.name)
            .field("format", &self.format)
            .field("events", &self.events)
            .field("kinds", &self.kinds)
            .finish_non_exhaustive()
    }
}

impl Target {
    fn wants(&self, kind: &str, event: NoticeEvent) -> bool {
        (self.events.is_empty() || self.events.contains(&event))
            && (self.kinds.is_empty() || self.kinds.iter().any(|k| k == kind))
    }
}

/// The targets could not be read; the previous targets stay in force.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum TargetsError {
    /// The Secret has no `targets.json`.
    #[error("Secret {secret} has no key {SECRET_KEY}; put the JSON list of targets there")]
    MissingKey {
        /// The Secret's namespace/name.
        secret: String,
    },
    /// `targets.json` is not a JSON list of targets.
    #[error("{SECRET_KEY}: {0}")]
    Syntax(String),
    /// A target is unusable.
    #[error("{SECRET_KEY}: targets[{index}] ({name:?}): {problem}")]
    Target {
        /// Its position in the list.
        index: usize,
        /// Its name.
        name: String,
        /// What is wrong and how to fix it.
        problem: String,
    },
}

/// Parses and validates `targets.json`: a JSON list of `{name, url, format?, headers?,
/// bearerToken?, events?, kinds?}`. Names must be unique (they label metrics), URLs http(s).
pub fn parse_targets(bytes: &[u8]) -> Result<Vec<Target>, TargetsError> {
    let specs: Vec<TargetSpec> =
        serde_json::from_slice(bytes).map_err(|e| TargetsError::Syntax(e.to_string()))?;
    let mut names = HashSet::new();
    let mut out = Vec::with_capacity(specs.len());
    for (index, spec) in specs.into_iter().enumerate() {
        let bad = |problem: String| TargetsError::Target {
            index,
            name: spec.name.clone(),
            problem,
        };
        if spec.name.is_empty()
            || spec.name.len() > 63
            || !spec
                .name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_' || c == '.')
        {
            return Err(bad(
                "name must be 1 to 63 letters, digits, '-', '_' or '.' (it labels metrics)".into(),
            ));
        }
        if !names.insert(spec.name.clone()) {
            return Err(bad(
                "name is used by an earlier target; names must be unique".into(),
            ));
        }
        // The URL is a credential for Slack: say what is wrong without echoing it.
        let url =
            reqwest::Url::parse(&spec.url).map_err(|e| bad(format!("url is not a URL ({e})")))?;
        if !matches!(url.scheme(), "http" | "https") || url.host_str().is_none() {
            return Err(bad(format!(
                "url must be http:// or https:// with a host, not {}:",
                url.scheme()
            )));
        }
        let mut headers = reqwest::header::HeaderMap::new();
        for (k, v) in &spec.headers {
            let name = reqwest::header::HeaderName::from_bytes(k.as_bytes())
                .map_err(|_| bad(format!("headers: {k:?} is not a valid header name")))?;
            let mut value = reqwest::header::HeaderValue::from_str(v).map_err(|_| {
                bad(format!(
                    "headers: the value of {k:?} is not a valid header value"
                ))
            })?;
            value.set_sensitive(true);
            headers.insert(name, value);
        }
        if let Some(token) = spec.bearer_token.as_deref() {
            if headers.contains_key(reqwest::header::AUTHORIZATION) {
                return Err(bad(
                    "both bearerToken and an Authorization header are set; keep one".into(),
                ));
            }
            let mut value =
                reqwest::header::HeaderValue::from_str(&format!("Bearer {}", token.trim()))
                    .map_err(
                        |_| bad("bearerToken holds characters a header cannot carry".into()),
                    )?;
            value.set_sensitive(true);
            headers.insert(reqwest::header::AUTHORIZATION, value);
        }
        out.push(Target {
            name: spec.name,
            url,
            format: spec.format,
            headers,
            events: spec.events,
            kinds: spec.kinds,
        });
    }
    Ok(out)
}

/// The phase change a notification reports.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Transition {
    /// The phase before (empty for a new object).
    pub from: String,
    /// The phase after.
    pub to: String,
}

/// The generic JSON body (`format: json`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Payload {
    /// What happened (`abort`, `promotion`, `halt`, `pin`, `release`, `complete`, `hold`).
    pub event: NoticeEvent,
    /// The object's kind, e.g. `Rollout`.
    pub kind: String,
    /// The object's namespace.
    pub namespace: String,
    /// The object's name.
    pub name: String,
    /// The cluster's name (`--notifications-cluster`), or empty.
    pub cluster: String,
    /// The operator that saw the transition.
    pub operator: String,
    /// The object's `metadata.generation` the transition was decided at.
    pub generation: Option<i64>,
    /// From which phase to which.
    pub transition: Transition,
    /// Why (a stable CamelCase reason).
    pub reason: String,
    /// The status's explanation, or empty.
    pub message: String,
    /// The figures the status holds.
    pub figures: Map<String, Value>,
    /// When the operator recorded the transition (RFC 3339).
    pub observed_at: String,
}

impl Payload {
    /// `kind namespace/name`, as people read it.
    pub fn object(&self) -> String {
        if self.namespace.is_empty() {
            format!("{} {}", self.kind, self.name)
        } else {
            format!("{} {}/{}", self.kind, self.namespace, self.name)
        }
    }
}

fn mrkdwn_escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

fn cut(s: &str, max_chars: usize) -> String {
    if s.chars().count() <= max_chars {
        return s.to_owned();
    }
    let mut out: String = s.chars().take(max_chars.saturating_sub(1)).collect();
    out.push('…');
    out
}

fn figure_text(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Number(n) => n.to_string(),
        Value::Bool(b) => b.to_string(),
        Value::Null => "-".into(),
        other => other.to_string(),
    }
}

/// The Slack-compatible body (`format: slack`): a one-line `text` (shown in notifications and by
/// clients without blocks) and `blocks` with the transition, the reason and up to 10 figures,
/// within Slack's block limits.
pub fn slack_body(p: &Payload) -> Value {
    let verb = match p.event {
        NoticeEvent::Abort => "aborted",
        NoticeEvent::Promotion => "promoted",
        NoticeEvent::Halt => "halted",
        NoticeEvent::Pin => "pinned",
        NoticeEvent::Release => "released",
        NoticeEvent::Complete => "completed",
        NoticeEvent::Hold => "held",
    };
    let where_ = if p.cluster.is_empty() {
        String::new()
    } else {
        format!(" on {}", p.cluster)
    };
    let reason = if p.reason.is_empty() {
        String::new()
    } else {
        format!(": {}", p.reason)
    };
    let text = cut(&format!("{} {verb}{where_}{reason}", p.object()), 3000);
    let header = cut(
        &format!("{} {} → {}", p.object(), p.transition.from, p.transition.to),
        150,
    );
    let mut detail = format!("*Reason:* {}", mrkdwn_escape(&p.reason));
    if !p.message.is_empty() {
        detail.push('\n');
        detail.push_str(&mrkdwn_escape(&p.message));
    }
    let mut blocks = vec![
        json!({"type": "header", "text": {"type": "plain_text", "text": header}}),
        json!({"type": "section", "text": {"type": "mrkdwn", "text": cut(&detail, 3000)}}),
    ];
    let fields: Vec<Value> = p
        .figures
        .iter()
        .take(10)
        .map(|(k, v)| {
            json!({"type": "mrkdwn", "text": cut(&format!("*{}*\n{}", mrkdwn_escape(k), mrkdwn_escape(&figure_text(v))), 2000)})
        })
        .collect();
    if !fields.is_empty() {
        blocks.push(json!({"type": "section", "fields": fields}));
    }
    let mut context = vec![p.operator.clone()];
    if !p.cluster.is_empty() {
        context.insert(0, format!("cluster {}", p.cluster));
    }
    if let Some(g) = p.generation {
        context.push(format!("generation {g}"));
    }
    context.push(p.observed_at.clone());
    blocks.push(json!({
        "type": "context",
        "elements": [{"type": "mrkdwn", "text": cut(&mrkdwn_escape(&context.join(" · ")), 3000)}],
    }));
    json!({"text": text, "blocks": blocks})
}

/// The body sent to a target of `format`.
pub fn body(format: Format, p: &Payload) -> Value {
    match format {
        Format::Json => serde_json::to_value(p).unwrap_or(Value::Null),
        Format::Slack => slack_body(p),
    }
}

/// Labels of the delivery series.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
pub struct DeliveryLabels {
    /// The target's name (from the Secret: a bounded, operator-chosen set).
    pub target: String,
    /// The object's kind.
    pub kind: String,
    /// The event (`abort`, `halt`, ...).
    pub event: String,
}

/// The notifier's metrics. Cheap to clone.
#[derive(Debug, Clone, Default)]
pub struct NotifyMetrics {
    sent: Family<DeliveryLabels, Counter>,
    failures: Family<DeliveryLabels, Counter>,
    targets: Gauge,
    config_errors: Counter,
}

impl NotifyMetrics {
    /// Registers the series under `sluice_notification*` in `registry`.
    pub fn register(registry: &mut Registry) -> Self {
        let m = Self::default();
        let sub = registry.sub_registry_with_prefix("sluice");
        sub.register(
            "notifications_sent",
            "Notifications a webhook target accepted (2xx), by target, kind and event",
            m.sent.clone(),
        );
        sub.register(
            "notification_failures",
            "Notifications given up on (retries exhausted, refused, or the queue was full), by target, kind and event",
            m.failures.clone(),
        );
        sub.register(
            "notification_targets",
            "Webhook targets in force from the notifications Secret",
            m.targets.clone(),
        );
        sub.register(
            "notification_config_errors",
            "Reads of the notifications Secret that were refused (the previous targets stay in force)",
            m.config_errors.clone(),
        );
        m
    }

    /// Notifications delivered to `target` for `kind`/`event` (tests).
    pub fn sent(&self, target: &str, kind: &str, event: NoticeEvent) -> u64 {
        self.sent.get_or_create(&labels(target, kind, event)).get()
    }

    /// Notifications given up on for `target`, `kind`, `event` (tests).
    pub fn failures(&self, target: &str, kind: &str, event: NoticeEvent) -> u64 {
        self.failures
            .get_or_create(&labels(target, kind, event))
            .get()
    }
}

fn labels(target: &str, kind: &str, event: NoticeEvent) -> DeliveryLabels {
    DeliveryLabels {
        target: target.to_owned(),
        kind: kind.to_owned(),
        event: event.label().to_owned(),
    }
}

/// How a delivery is retried.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Attempts in all, the first included (at least 1).
    pub attempts: u32,
    /// Delay before the first retry; doubles per retry, jittered to `[d/2, d]`.
    pub base: Duration,
    /// Longest delay between attempts.
    pub max: Duration,
    /// Time one attempt may take (connect, send, response headers).
    pub timeout: Duration,
}

impl Default for RetryPolicy {
    /// 6 attempts over about a minute and a half (1, 2, 4, 8, 16 s before jitter): a target that
    /// restarts or rate-limits is waited out, a dead one is given up on soon enough to show.
    fn default() -> Self {
        Self {
            attempts: 6,
            base: Duration::from_secs(1),
            max: Duration::from_secs(60),
            timeout: Duration::from_secs(10),
        }
    }
}

impl RetryPolicy {
    /// The delay after the `n`-th failed attempt (n ≥ 1), before jitter.
    pub fn delay(&self, n: u32) -> Duration {
        self.base
            .saturating_mul(1u32 << n.saturating_sub(1).min(20))
            .min(self.max)
    }
}

/// Who is notifying and how.
#[derive(Debug, Clone)]
pub struct NotifierOptions {
    /// The operator's name (`sluice-<operator>`).
    pub operator: String,
    /// The cluster's name as payloads report it.
    pub cluster: String,
    /// Retries of one delivery.
    pub retry: RetryPolicy,
}

/// One notice on its way: the payload, who it is about, and the targets it goes to.
struct Job {
    payload: Arc<Payload>,
    reference: ObjectReference,
}

/// The transitions already notified, bounded: the oldest is forgotten first.
#[derive(Debug, Default)]
struct Seen {
    set: HashSet<(String, i64, String)>,
    order: VecDeque<(String, i64, String)>,
}

impl Seen {
    /// Records `key`; false if it was already recorded.
    fn first(&mut self, key: (String, i64, String)) -> bool {
        if !self.set.insert(key.clone()) {
            return false;
        }
        self.order.push_back(key);
        while self.order.len() > SEEN_CAPACITY {
            if let Some(old) = self.order.pop_front() {
                self.set.remove(&old);
            }
        }
        true
    }
}

struct Inner {
    options: NotifierOptions,
    targets: RwLock<Arc<Vec<Target>>>,
    seen: Mutex<Seen>,
    queue: mpsc::Sender<Job>,
    metrics: NotifyMetrics,
    recorder: Option<EventRecorder>,
}

/// Sends notices to the configured webhook targets. Cheap to clone; clones share the queue, the
/// targets and the record of what was notified. [`Notifier::disabled`] drops every notice.
#[derive(Clone, Default)]
pub struct Notifier {
    inner: Option<Arc<Inner>>,
}

impl std::fmt::Debug for Notifier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Notifier")
            .field("enabled", &self.inner.is_some())
            .finish_non_exhaustive()
    }
}

impl Notifier {
    /// A notifier that sends nothing (no Secret configured; tests).
    pub fn disabled() -> Self {
        Self::default()
    }

    /// Starts the delivery task (needs a Tokio runtime). No targets until [`Notifier::set_targets`]
    /// or [`Notifier::watch_secret`]; Events about failed deliveries go through `recorder`.
    pub fn start(
        options: NotifierOptions,
        metrics: NotifyMetrics,
        recorder: Option<EventRecorder>,
    ) -> Self {
        let (tx, rx) = mpsc::channel(QUEUE_CAPACITY);
        let inner = Arc::new(Inner {
            options,
            targets: RwLock::new(Arc::new(Vec::new())),
            seen: Mutex::default(),
            queue: tx,
            metrics,
            recorder,
        });
        tokio::spawn(deliver_all(Arc::downgrade(&inner), rx));
        Self { inner: Some(inner) }
    }

    /// Whether notices go anywhere.
    pub fn is_enabled(&self) -> bool {
        self.inner.is_some()
    }

    /// Replaces the targets.
    pub fn set_targets(&self, targets: Vec<Target>) {
        let Some(inner) = &self.inner else { return };
        inner.metrics.targets.set(targets.len() as i64);
        *inner.targets.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(targets);
    }

    /// The names of the targets in force.
    pub fn target_names(&self) -> Vec<String> {
        let Some(inner) = &self.inner else {
            return Vec::new();
        };
        let targets = inner.targets.read().unwrap_or_else(|e| e.into_inner());
        targets.iter().map(|t| t.name.clone()).collect()
    }

    /// Queues `notice` about `obj` for every target that wants it, once per object, generation
    /// and phase reached (a transition decided again, after a conflict or by a new leader that
    /// saw it in this process, is not sent twice). Never waits: a full queue drops the notice
    /// and counts a failure per target. Call it only after the status write that made the
    /// transition succeeded, so a restart (which reads the phase back from status, with no
    /// transition) does not notify again.
    pub fn notify<K>(&self, obj: &K, notice: Notice)
    where
        K: Resource<DynamicType = ()>,
    {
        let Some(inner) = &self.inner else { return };
        if notice.from == notice.to {
            return;
        }
        let meta = obj.meta();
        let kind = K::kind(&()).into_owned();
        let namespace = meta.namespace.clone().unwrap_or_default();
        let name = meta.name.clone().unwrap_or_default();
        let generation = meta.generation;
        let identity = meta
            .uid
            .clone()
            .unwrap_or_else(|| format!("{kind}/{namespace}/{name}"));
        let first = inner.seen.lock().unwrap_or_else(|e| e.into_inner()).first((
            identity,
            generation.unwrap_or(0),
            notice.to.clone(),
        ));
        if !first {
            return;
        }
        let payload = Arc::new(Payload {
            event: notice.event,
            kind,
            namespace,
            name,
            cluster: inner.options.cluster.clone(),
            operator: inner.options.operator.clone(),
            generation,
            transition: Transition {
                from: notice.from,
                to: notice.to,
            },
            reason: notice.reason,
            message: notice.message,
            figures: notice.figures,
            observed_at: jiff::Timestamp::now().to_string(),
        });
        let job = Job {
            payload,
            reference: obj.object_ref(&()),
        };
        if let Err(mpsc::error::TrySendError::Full(job) | mpsc::error::TrySendError::Closed(job)) =
            inner.queue.try_send(job)
        {
            let p = &job.payload;
            tracing::warn!(
                kind = %p.kind, namespace = %p.namespace, name = %p.name, event = p.event.label(),
                "notification queue full ({QUEUE_CAPACITY}): notice dropped"
            );
            let targets = inner
                .targets
                .read()
                .unwrap_or_else(|e| e.into_inner())
                .clone();
            for t in targets.iter().filter(|t| t.wants(&p.kind, p.event)) {
                dropped(inner, &job, &t.name, "the notification queue was full");
            }
        }
    }

    /// Reads the targets from Secret `name` through `api` (the operator's namespace) and again
    /// whenever it changes, until `stop`. A Secret that is missing means no targets; one that
    /// does not parse is refused with its error logged and counted, and the previous targets
    /// stay in force. Needs only `get` and `watch` on that one Secret.
    pub async fn watch_secret(self, api: Api<Secret>, name: String, stop: CancellationToken) {
        let Some(inner) = self.inner.clone() else {
            return;
        };
        let fields = format!("metadata.name={name}");
        let mut failures: u32 = 0;
        loop {
            let read = tokio::select! {
                _ = stop.cancelled() => return,
                r = api.get_opt(&name) => r,
            };
            let rv = match read {
                Ok(Some(secret)) => {
                    failures = 0;
                    self.apply_secret(&secret, &name);
                    secret
                        .metadata
                        .resource_version
                        .unwrap_or_else(|| "0".into())
                }
                Ok(None) => {
                    failures = 0;
                    if !inner
                        .targets
                        .read()
                        .unwrap_or_else(|e| e.into_inner())
                        .is_empty()
                    {
                        tracing::warn!(secret = %name, "notifications Secret is gone: no notifications until it is back");
                    }
                    self.set_targets(Vec::new());
                    "0".into()
                }
                Err(err) => {
                    failures = failures.saturating_add(1);
                    let delay = jitter(
                        RetryPolicy::default()
                            .delay(failures)
                            .min(Duration::from_secs(30)),
                    );
                    tracing::warn!(secret = %name, error = %err, retry_in = ?delay, "could not read the notifications Secret; check get/watch on it in the operator's Role");
                    tokio::select! {
                        _ = stop.cancelled() => return,
                        _ = tokio::time::sleep(delay) => continue,
                    }
                }
            };
            let params = WatchParams::default().fields(&fields).timeout(290);
            let stream = tokio::select! {
                _ = stop.cancelled() => return,
                s = api.watch(&params, &rv) => s,
            };
            let mut stream = match stream {
                Ok(s) => Box::pin(s),
                Err(err) => {
                    tracing::warn!(secret = %name, error = %err, "could not watch the notifications Secret; reading it again");
                    tokio::select! {
                        _ = stop.cancelled() => return,
                        _ = tokio::time::sleep(jitter(Duration::from_secs(5))) => continue,
                    }
                }
            };
            loop {
                let next = tokio::select! {
                    _ = stop.cancelled() => return,
                    n = futures::StreamExt::next(&mut stream) => n,
                };
                match next {
                    Some(Ok(WatchEvent::Added(s) | WatchEvent::Modified(s))) => {
                        self.apply_secret(&s, &name)
                    }
                    Some(Ok(WatchEvent::Deleted(_))) => {
                        tracing::warn!(secret = %name, "notifications Secret deleted: no notifications until it is back");
                        self.set_targets(Vec::new());
                    }
                    Some(Ok(WatchEvent::Bookmark(_))) => {}
                    // Expired resourceVersion, a dropped connection or the watch's timeout: read
                    // the Secret again and watch from there.
                    Some(Ok(WatchEvent::Error(_))) | Some(Err(_)) | None => break,
                }
            }
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tokio::time::sleep(Duration::from_millis(200)) => {}
            }
        }
    }

    fn apply_secret(&self, secret: &Secret, name: &str) {
        let Some(inner) = &self.inner else { return };
        let ns = secret.metadata.namespace.clone().unwrap_or_default();
        let parsed = match secret.data.as_ref().and_then(|d| d.get(SECRET_KEY)) {
            Some(bytes) => parse_targets(&bytes.0),
            None => Err(TargetsError::MissingKey {
                secret: format!("{ns}/{name}"),
            }),
        };
        match parsed {
            Ok(targets) => {
                tracing::info!(
                    secret = %name,
                    targets = ?targets.iter().map(|t| t.name.as_str()).collect::<Vec<_>>(),
                    "notification targets read"
                );
                self.set_targets(targets);
            }
            Err(err) => {
                inner.metrics.config_errors.inc();
                tracing::error!(secret = %name, error = %err, "notification targets refused; the previous targets stay in force");
            }
        }
    }
}

/// The delivery task: takes jobs off the queue and hands each to the lane of every target that
/// wants it, where at most [`TARGET_IN_FLIGHT`] deliveries run at once and at most
/// [`TARGET_BACKLOG`] wait; beyond that a notice for that target is dropped and counted. Never
/// waits on a target, so a dead one cannot delay the others. Ends when every [`Notifier`] is
/// dropped.
async fn deliver_all(inner: std::sync::Weak<Inner>, mut rx: mpsc::Receiver<Job>) {
    let client = match reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
    {
        Ok(c) => c,
        Err(err) => {
            tracing::error!(error = %err, "no HTTP client for notifications: none will be sent");
            return;
        }
    };
    let mut lanes: HashMap<String, Lane> = HashMap::new();
    while let Some(job) = rx.recv().await {
        let Some(inner) = inner.upgrade() else { return };
        let job = Arc::new(job);
        let targets = inner
            .targets
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        // Lanes of targets no longer configured go once their last delivery ended.
        lanes.retain(|name, lane| {
            targets.iter().any(|t| &t.name == name) || lane.waiting.load(Ordering::Relaxed) > 0
        });
        for target in targets
            .iter()
            .filter(|t| t.wants(&job.payload.kind, job.payload.event))
        {
            let lane = lanes
                .entry(target.name.clone())
                .or_insert_with(Lane::new)
                .clone();
            if lane.waiting.load(Ordering::Relaxed) >= TARGET_BACKLOG {
                dropped(
                    &inner,
                    &job,
                    &target.name,
                    &format!("{TARGET_BACKLOG} notices for it were already waiting"),
                );
                continue;
            }
            lane.waiting.fetch_add(1, Ordering::Relaxed);
            let (inner, client, job, target) =
                (inner.clone(), client.clone(), job.clone(), target.clone());
            tokio::spawn(async move {
                if let Ok(_slot) = lane.slots.acquire().await {
                    deliver(&inner, &client, &job, &target).await;
                }
                lane.waiting.fetch_sub(1, Ordering::Relaxed);
            });
        }
    }
}

/// Counts a notice for `target` that was not even attempted (`why`) and reports it as a Warning
/// Event on the object, in the background.
fn dropped(inner: &Inner, job: &Job, target: &str, why: &str) {
    let p = &job.payload;
    inner
        .metrics
        .failures
        .get_or_create(&labels(target, &p.kind, p.event))
        .inc();
    let note = format!(
        "notifying target {target:?} of {} ({} → {}) failed: {why}",
        p.event.label(),
        p.transition.from,
        p.transition.to
    );
    tracing::warn!(target, kind = %p.kind, namespace = %p.namespace, name = %p.name, "{note}");
    if let Some(recorder) = inner.recorder.clone() {
        let reference = job.reference.clone();
        let action = action(target);
        tokio::spawn(async move {
            recorder
                .publish_ref(&reference, Severity::Warning, REASON_FAILED, &action, &note)
                .await;
        });
    }
}

/// One target's share of the delivery task: its deliveries in flight and those waiting for a
/// place, so a slow or dead target never holds back the others.
#[derive(Clone)]
struct Lane {
    slots: Arc<Semaphore>,
    waiting: Arc<AtomicUsize>,
}

impl Lane {
    fn new() -> Self {
        Self {
            slots: Arc::new(Semaphore::new(TARGET_IN_FLIGHT)),
            waiting: Arc::default(),
        }
    }
}

/// The Event action of a notification to `target`.
fn action(target: &str) -> String {
    format!("Notify {target}")
}

/// Why one attempt failed, without the URL.
fn attempt(result: Result<reqwest::Response, reqwest::Error>) -> Result<(), (bool, String)> {
    match result {
        Ok(resp) if resp.status().is_success() => Ok(()),
        Ok(resp) => {
            let s = resp.status();
            // 4xx other than timeout and rate limiting will not get better by asking again.
            let retry = s.is_server_error()
                || s == reqwest::StatusCode::REQUEST_TIMEOUT
                || s == reqwest::StatusCode::TOO_MANY_REQUESTS;
            Err((retry, format!("HTTP {s}")))
        }
        Err(err) => {
            // The URL is a credential: leave it out, keep the causes (refused, timed out, TLS).
            let timed_out = err.is_timeout();
            let err = err.without_url();
            let mut why = err.to_string();
            let mut source = std::error::Error::source(&err);
            while let Some(s) = source {
                why.push_str(": ");
                why.push_str(&s.to_string());
                source = s.source();
            }
            if timed_out && !why.contains("timed out") {
                why.push_str(" (timed out)");
            }
            Err((true, why))
        }
    }
}

async fn deliver(inner: &Inner, client: &reqwest::Client, job: &Job, target: &Target) {
    let p = &job.payload;
    let retry = inner.options.retry;
    let body = body(target.format, p);
    let mut last = String::new();
    let mut tries = 0;
    for n in 1..=retry.attempts.max(1) {
        tries = n;
        let sent = client
            .post(target.url.clone())
            .headers(target.headers.clone())
            .json(&body)
            .timeout(retry.timeout)
            .send()
            .await;
        match attempt(sent) {
            Ok(()) => {
                inner
                    .metrics
                    .sent
                    .get_or_create(&labels(&target.name, &p.kind, p.event))
                    .inc();
                tracing::info!(target = %target.name, kind = %p.kind, namespace = %p.namespace, name = %p.name, event = p.event.label(), attempts = n, "notification delivered");
                return;
            }
            Err((again, why)) => {
                last = why;
                if !again || n == retry.attempts.max(1) {
                    break;
                }
                let delay = jitter(retry.delay(n));
                tracing::debug!(target = %target.name, attempt = n, error = %last, retry_in = ?delay, "notification not delivered; retrying");
                tokio::time::sleep(delay).await;
            }
        }
    }
    inner
        .metrics
        .failures
        .get_or_create(&labels(&target.name, &p.kind, p.event))
        .inc();
    let note = format!(
        "notifying target {:?} of {} ({} → {}) failed after {tries} attempt(s): {last}; check the target's URL and credentials in the notifications Secret",
        target.name,
        p.event.label(),
        p.transition.from,
        p.transition.to,
    );
    tracing::warn!(target = %target.name, kind = %p.kind, namespace = %p.namespace, name = %p.name, "{note}");
    if let Some(recorder) = &inner.recorder {
        // One Event series per target: the recorder folds Events of the same object, reason
        // and action into one.
        recorder
            .publish_ref(
                &job.reference,
                Severity::Warning,
                REASON_FAILED,
                &action(&target.name),
                &note,
            )
            .await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, Clone, Copy, PartialEq)]
    enum Phase {
        Running,
        Done,
    }

    #[test]
    fn a_transition_is_noticed_once_with_its_phases_reason_and_message() {
        let done = |p| (p == Phase::Done).then_some(NoticeEvent::Complete);
        let n = Notice::of_transition(Some(Phase::Running), Phase::Done, done, "Finished")
            .expect("a transition");
        assert_eq!(
            (n.event, n.from.as_str(), n.to.as_str(), n.reason.as_str()),
            (NoticeEvent::Complete, "Running", "Done", "Finished")
        );
        let new = Notice::of_transition(None, Phase::Done, done, "Finished").expect("new");
        assert_eq!(new.from, "");
        assert_eq!(
            Notice::of_transition(Some(Phase::Done), Phase::Done, done, "Finished"),
            None
        );
        assert_eq!(
            Notice::of_transition(None, Phase::Running, done, "Started"),
            None
        );

        let mut n = n;
        let c = |reason: &str, message: &str| {
            let at = k8s_openapi::jiff::Timestamp::UNIX_EPOCH;
            crate::conditions::new(
                "Done",
                crate::conditions::Status::True,
                reason,
                message,
                None,
                at,
            )
        };
        n.message_from(&[c("Started", "no"), c("Finished", "all done")]);
        assert_eq!(n.message, "all done");
        n.message_from(&[c("Started", "no")]);
        assert_eq!(n.message, "");
    }

    #[test]
    fn targets_parse_and_bad_ones_say_what_is_wrong() {
        let ok = br#"[
          {"name": "ops-slack", "url": "https://hooks.example.test/T1/B2/x", "format": "slack", "events": ["abort", "halt"]},
          {"name": "pager", "url": "http://127.0.0.1:9/hook", "headers": {"X-Team": "mesh"}, "bearerToken": "s3cret", "kinds": ["Rollout"]}
        ]"#;
        let t = parse_targets(ok).unwrap();
        assert_eq!(t.len(), 2);
        assert_eq!(t[0].format, Format::Slack);
        assert!(t[0].wants("WaveGate", NoticeEvent::Halt));
        assert!(!t[0].wants("BundlePin", NoticeEvent::Pin));
        assert!(t[1].wants("Rollout", NoticeEvent::Pin));
        assert!(!t[1].wants("WaveGate", NoticeEvent::Halt));
        assert_eq!(
            t[1].headers.get("authorization").unwrap().to_str().unwrap(),
            "Bearer s3cret"
        );
        let debug = format!("{t:?}");
        assert!(
            !debug.contains("s3cret") && !debug.contains("hooks.example"),
            "{debug}"
        );

        let table: [(&str, &str); 7] = [
            (
                r#"{"name":"a"}"#,
                "targets.json: invalid type: map, expected a sequence",
            ),
            (
                r#"[{"name":"a","url":"ftp://h/x"}]"#,
                "targets[0] (\"a\"): url must be http:// or https:// with a host, not ftp:",
            ),
            (
                r#"[{"name":"a","url":"https://h/1"},{"name":"a","url":"https://h/2"}]"#,
                "targets[1] (\"a\"): name is used by an earlier target",
            ),
            (
                r#"[{"name":"a b","url":"https://h/1"}]"#,
                "targets[0] (\"a b\"): name must be 1 to 63 letters",
            ),
            (
                r#"[{"name":"a","url":"https://h/1","events":["explode"]}]"#,
                "unknown variant `explode`",
            ),
            (
                r#"[{"name":"a","url":"https://h/1","bearerToken":"t","headers":{"Authorization":"Basic x"}}]"#,
                "both bearerToken and an Authorization header are set",
            ),
            (
                r#"[{"name":"a","url":"https://h/1","token":"t"}]"#,
                "unknown field `token`",
            ),
        ];
        for (input, want) in table {
            let err = parse_targets(input.as_bytes()).unwrap_err().to_string();
            assert!(err.contains(want), "{input}: {err}");
        }
        // A malformed URL is named by position and name, never echoed.
        let err = parse_targets(br#"[{"name":"a","url":"https//hooks.slack.test/SECRET"}]"#)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("targets[0] (\"a\"): url is not a URL"),
            "{err}"
        );
        assert!(!err.contains("SECRET"), "{err}");
    }

    fn payload() -> Payload {
        let mut figures = Map::new();
        figures.insert("canaryWeight".into(), json!(10));
        figures.insert("gate".into(), json!("error-rate"));
        figures.insert("observed".into(), json!(0.21));
        figures.insert("threshold".into(), json!(0.05));
        Payload {
            event: NoticeEvent::Abort,
            kind: "Rollout".into(),
            namespace: "shop".into(),
            name: "checkout".into(),
            cluster: "east-1".into(),
            operator: "sluice-rollout-weights".into(),
            generation: Some(3),
            transition: Transition {
                from: "Progressing".into(),
                to: "Aborted".into(),
            },
            reason: "GateFailed".into(),
            message: "gate error-rate failed: 0.21 > 0.05 <at step 1>".into(),
            figures,
            observed_at: "2026-12-02T05:00:00Z".into(),
        }
    }

    #[test]
    fn slack_body_has_text_and_blocks_within_limits() {
        let b = slack_body(&payload());
        assert_eq!(
            b["text"],
            "Rollout shop/checkout aborted on east-1: GateFailed"
        );
        let blocks = b["blocks"].as_array().unwrap();
        assert_eq!(blocks[0]["type"], "header");
        assert_eq!(
            blocks[0]["text"]["text"],
            "Rollout shop/checkout Progressing → Aborted"
        );
        assert!(
            blocks[1]["text"]["text"]
                .as_str()
                .unwrap()
                .contains("0.21 &gt; 0.05 &lt;at step 1&gt;"),
            "mrkdwn is escaped: {b}"
        );
        let fields = blocks[2]["fields"].as_array().unwrap();
        assert!(fields.contains(&json!({"type": "mrkdwn", "text": "*observed*\n0.21"})));
        assert!(
            blocks[3]["elements"][0]["text"]
                .as_str()
                .unwrap()
                .starts_with("cluster east-1 · sluice-rollout-weights · generation 3")
        );

        let mut long = payload();
        long.name = "n".repeat(300);
        for i in 0..30 {
            long.figures.insert(format!("f{i:02}"), json!(i));
        }
        let b = slack_body(&long);
        assert_eq!(
            b["blocks"][0]["text"]["text"]
                .as_str()
                .unwrap()
                .chars()
                .count(),
            150
        );
        assert_eq!(b["blocks"][2]["fields"].as_array().unwrap().len(), 10);
    }

    #[test]
    fn json_body_is_the_payload() {
        let p = payload();
        let v = body(Format::Json, &p);
        assert_eq!(v["event"], "abort");
        assert_eq!(
            v["transition"],
            json!({"from": "Progressing", "to": "Aborted"})
        );
        assert_eq!(v["observedAt"], "2026-12-02T05:00:00Z");
        let back: Payload = serde_json::from_value(v).unwrap();
        assert_eq!(back, p);
    }

    #[test]
    fn retry_delays_double_up_to_the_cap() {
        let r = RetryPolicy {
            attempts: 8,
            base: Duration::from_millis(100),
            max: Duration::from_millis(500),
            timeout: Duration::from_secs(1),
        };
        let got: Vec<u128> = (1..=5).map(|n| r.delay(n).as_millis()).collect();
        assert_eq!(got, [100, 200, 400, 500, 500]);
    }

    #[test]
    fn seen_is_bounded_and_forgets_the_oldest() {
        let mut s = Seen::default();
        assert!(s.first(("u".into(), 1, "Aborted".into())));
        assert!(!s.first(("u".into(), 1, "Aborted".into())));
        assert!(
            s.first(("u".into(), 2, "Aborted".into())),
            "a new generation notifies again"
        );
        for i in 0..SEEN_CAPACITY {
            s.first((format!("x{i}"), 1, "Aborted".into()));
        }
        assert_eq!(s.order.len(), SEEN_CAPACITY);
        assert!(
            s.first(("u".into(), 1, "Aborted".into())),
            "the oldest was forgotten"
        );
    }
}
