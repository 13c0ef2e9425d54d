//! Operator bootstrap: parse config, install tracing, build the client, serve metrics and
//! health, run leader election, and run a kube-runtime `Controller` for one kind only while
//! this replica leads; shut down gracefully on SIGTERM/SIGINT.
//!
//! Owns the order of startup and shutdown, the per-object retry back-off and the bound on
//! reconciles running at once. Must never contain reconcile logic: operators pass their
//! reconcile function in.

use std::{
    collections::HashMap,
    fmt::Debug,
    future::Future,
    hash::Hash,
    process::ExitCode,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use futures::StreamExt;
use kube::{
    Api, Client, Resource,
    runtime::{
        Controller,
        controller::{Action, Config as ControllerConfig, Error as ControllerError},
        reflector::{self, ObjectRef, Store, reflector},
        watcher,
    },
};
use prometheus_client::registry::Registry;
use serde::de::DeserializeOwned;
use tokio_util::sync::CancellationToken;

use crate::{
    changes::{Change, PrimaryChanges, classify, control_fingerprint},
    client::ClientError,
    config::{ConfigError, DEFAULT_MAX_CONCURRENT_RECONCILES, RuntimeArgs},
    error::{Categorized, Category},
    events::EventRecorder,
    leader::{self, Leadership},
    metrics::Metrics,
    notify::{Notifier, NotifierOptions, NotifyMetrics, RetryPolicy},
    server::{Health, Server, ServerError},
    telemetry::TelemetryError,
};

/// Startup failed.
#[derive(Debug, thiserror::Error)]
pub enum BootError {
    /// A flag is wrong.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// Logging could not be set up.
    #[error(transparent)]
    Telemetry(#[from] TelemetryError),
    /// No Kubernetes client.
    #[error(transparent)]
    Client(#[from] ClientError),
    /// The HTTP server could not bind.
    #[error(transparent)]
    Server(#[from] ServerError),
}

impl Categorized for BootError {
    fn category(&self) -> Category {
        Category::Config
    }
}

/// Per-object exponential back-off for failed reconciles: `base × 2^(failures-1)`, capped, and
/// jittered (see [`jitter`]) so objects that failed together (an API outage) do not retry in
/// lock-step. A success resets the object's count; counts of objects that stopped failing
/// without a success (deleted while failing) are forgotten after twice the cap.
#[derive(Debug)]
pub struct Backoff {
    base: Duration,
    max: Duration,
    failures: Mutex<HashMap<String, (u32, Instant)>>,
}

/// The process's exit code for an operator binary's start-up and run: success, or the error
/// printed to stderr and logged as `<operator> failed to start`, and failure.
pub fn exit_code<E: std::fmt::Display>(operator: &str, result: Result<(), E>) -> ExitCode {
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("{operator}: {err}");
            tracing::error!(error = %err, "{operator} failed to start");
            ExitCode::FAILURE
        }
    }
}

/// A random delay in `[d/2, d]` ("equal jitter"): retries spread out, yet never sooner than half
/// the back-off.
pub fn jitter(d: Duration) -> Duration {
    use std::hash::{BuildHasher, Hasher};
    // A fresh RandomState is randomly keyed: enough randomness for spreading retries.
    let r = std::collections::hash_map::RandomState::new()
        .build_hasher()
        .finish();
    let half = d / 2;
    half + half.mul_f64((r >> 11) as f64 / (1u64 << 53) as f64)
}

impl Backoff {
    /// A back-off from `base` doubling up to `max`.
    pub fn new(base: Duration, max: Duration) -> Self {
        Self {
            base,
            max,
            failures: Mutex::default(),
        }
    }

    /// Pure delay after `failures` consecutive failures (≥ 1), before jitter.
    pub fn delay(&self, failures: u32) -> Duration {
        let exp = failures.saturating_sub(1).min(20);
        self.base.saturating_mul(1u32 << exp).min(self.max)
    }

    /// Records a failure of `key` and returns the (jittered) delay before its retry.
    pub fn fail(&self, key: &str) -> Duration {
        let now = Instant::now();
        let mut map = self.failures.lock().unwrap_or_else(|e| e.into_inner());
        // An object whose last failure is older than twice the cap was retried long ago and did
        // not fail again: it succeeded elsewhere or is gone.
        let stale = self.max.saturating_mul(2);
        map.retain(|_, (_, at)| now.saturating_duration_since(*at) <= stale);
        let (n, at) = map.entry(key.to_owned()).or_insert((0, now));
        *n = n.saturating_add(1);
        *at = now;
        jitter(self.delay(*n))
    }

    /// How many objects have a failure count (a bounded map, for tests and metrics).
    pub fn tracked(&self) -> usize {
        self.failures
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .len()
    }

    /// Forgets the failures of `key`.
    pub fn succeed(&self, key: &str) {
        self.failures
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(key);
    }
}

impl Default for Backoff {
    fn default() -> Self {
        Self::new(Duration::from_millis(500), Duration::from_secs(300))
    }
}

/// The shared pieces a controller run needs besides the reconcile function.
#[derive(Debug, Clone)]
pub struct Hooks {
    /// Metrics to record reconciles into.
    pub metrics: Metrics,
    /// Health flags to report cache sync on.
    pub health: Health,
    /// Per-object back-off for failures.
    pub backoff: Arc<Backoff>,
    /// Most reconciles running at once (`--max-concurrent-reconciles`); at least 1.
    pub max_concurrent_reconciles: u16,
    /// What happens when a deposed controller does not stop in time.
    pub step_down: StepDownWatchdog,
    /// Which changes of the operator's own objects start a reconcile.
    pub primary_changes: PrimaryChanges,
}

/// Exit status of an operator whose controller did not stop within the step-down limit after it
/// lost leadership (`EX_SOFTWARE`): the kubelet restarts the container, and the restart is the
/// stop.
pub const STALLED_STEP_DOWN_EXIT: i32 = 70;

/// Guards the step-down: once leadership is lost, every reconcile must have stopped within
/// `limit`, the margin between the leader's own deadline and the earliest moment a standby may
/// take the Lease. A reconcile stuck in blocking code never reaches the await at which it would
/// be dropped; then `on_stall` runs, on its own OS thread so a blocked async runtime cannot
/// delay it. In the operators it ends the process.
#[derive(Clone)]
pub struct StepDownWatchdog {
    /// How long the controller has, from the loss of leadership, to stop every reconcile;
    /// `None` arms no watchdog.
    pub limit: Option<Duration>,
    /// Called with `limit` when the controller has not stopped in time.
    pub on_stall: Arc<dyn Fn(Duration) + Send + Sync>,
}

impl StepDownWatchdog {
    /// No watchdog (tests, and a single replica without leader election).
    pub fn off() -> Self {
        Self {
            limit: None,
            on_stall: Arc::new(|_| {}),
        }
    }

    /// Ends the process with [`STALLED_STEP_DOWN_EXIT`] when the controller has not stopped
    /// within `limit` of the loss of leadership.
    pub fn exit_process(limit: Duration) -> Self {
        Self {
            limit: Some(limit),
            on_stall: Arc::new(|limit| {
                tracing::error!(
                    ?limit,
                    exit_status = STALLED_STEP_DOWN_EXIT,
                    "lost leadership, but a reconcile did not stop within the step-down limit \
                     (it is blocked outside an await): exiting before a standby may take over"
                );
                std::process::exit(STALLED_STEP_DOWN_EXIT);
            }),
        }
    }

    /// Starts the watch for one step-down: the controller drops the sender of `stopped` once it
    /// stopped, which disarms it.
    fn arm(&self, stopped: std::sync::mpsc::Receiver<()>) {
        let Some(limit) = self.limit else { return };
        let on_stall = self.on_stall.clone();
        let spawned = std::thread::Builder::new()
            .name("step-down-watchdog".into())
            .spawn(move || {
                if let Err(std::sync::mpsc::RecvTimeoutError::Timeout) = stopped.recv_timeout(limit)
                {
                    on_stall(limit);
                }
            });
        if let Err(err) = spawned {
            tracing::error!(error = %err, "could not start the step-down watchdog");
        }
    }
}

impl Debug for StepDownWatchdog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StepDownWatchdog")
            .field("limit", &self.limit)
            .finish_non_exhaustive()
    }
}

impl Hooks {
    /// Hooks with their own registry (tests).
    pub fn standalone() -> (Self, Registry) {
        let mut registry = Registry::default();
        let metrics = Metrics::register(&mut registry);
        (
            Self {
                metrics,
                health: Health::default(),
                backoff: Arc::new(Backoff::default()),
                max_concurrent_reconciles: DEFAULT_MAX_CONCURRENT_RECONCILES,
                step_down: StepDownWatchdog::off(),
                primary_changes: PrimaryChanges::Every,
            },
            registry,
        )
    }

    /// The same hooks starting reconciles only on the changes `changes` names.
    pub fn with_primary_changes(mut self, changes: PrimaryChanges) -> Self {
        self.primary_changes = changes;
        self
    }

    /// The same hooks running at most `n` reconciles at once (0 is taken as 1: kube-runtime
    /// reads 0 as unbounded).
    pub fn with_max_concurrent_reconciles(mut self, n: u16) -> Self {
        self.max_concurrent_reconciles = n.max(1);
        self
    }

    /// The kube-runtime controller settings these hooks ask for (the reconcile bound); an
    /// operator that builds its own `Controller` passes them to `Controller::with_config`.
    pub fn controller_config(&self) -> ControllerConfig {
        ControllerConfig::default().concurrency(self.max_concurrent_reconciles.max(1))
    }
}

fn object_key<K: Resource>(obj: &K) -> String {
    let m = obj.meta();
    format!(
        "{}/{}",
        m.namespace.as_deref().unwrap_or_default(),
        m.name.as_deref().unwrap_or_default()
    )
}

/// Runs a controller for `api`'s kind whenever `leadership` holds, until `shutdown` is
/// cancelled. At most `hooks.max_concurrent_reconciles` reconciles run at once (never two of
/// the same object); the rest wait in the controller's queue. Every reconcile is timed and
/// counted; an error is counted by category, logged and retried with per-object back-off.
/// Losing leadership stops the controller gracefully (reconciles in flight finish; their
/// writes are fenced by resourceVersion); regaining it starts a fresh one with fresh caches.
pub async fn drive<K, Ctx, F, Fut, E>(
    api: Api<K>,
    watcher_config: watcher::Config,
    ctx: Arc<Ctx>,
    reconcile: F,
    leadership: Leadership,
    shutdown: CancellationToken,
    hooks: Hooks,
) where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
    K::DynamicType: Eq + Hash + Clone + Debug + Unpin,
    Ctx: Send + Sync + 'static,
    F: Fn(Arc<K>, Arc<Ctx>) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<Action, E>> + Send + 'static,
    E: std::error::Error + Categorized + Send + Sync + 'static,
{
    drive_with(
        api,
        watcher_config,
        ctx,
        reconcile,
        leadership,
        shutdown,
        hooks,
        |controller| controller,
    )
    .await;
}

/// The watch of the operator's own kind as the controller's trigger and store: every event is
/// reflected into the store (so a reconcile always reads the newest object) and counted by what it
/// changed; an event starts a reconcile when `mode` says so.
fn primary_trigger<K>(
    api: Api<K>,
    config: watcher::Config,
    mode: PrimaryChanges,
    metrics: Metrics,
    kind: String,
) -> (
    Store<K>,
    impl futures::Stream<Item = Result<K, watcher::Error>> + Send + 'static,
)
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
{
    let (reader, writer) = reflector::store();
    // The fingerprint of each object as last seen, to tell a status-only change from the rest.
    let mut seen: HashMap<ObjectRef<K>, u64> = HashMap::new();
    let trigger = reflector(writer, watcher(api, config)).filter_map(move |event| {
        let out = match event {
            Err(e) => Some(Err(e)),
            Ok(watcher::Event::Init) => {
                seen.clear();
                None
            }
            Ok(watcher::Event::InitDone) => None,
            Ok(watcher::Event::Delete(obj)) => {
                seen.remove(&ObjectRef::from_obj(&obj));
                None
            }
            Ok(watcher::Event::InitApply(obj)) => {
                seen.insert(ObjectRef::from_obj(&obj), control_fingerprint(obj.meta()));
                metrics.watch_change(&kind, Change::Listed, true);
                Some(Ok(obj))
            }
            Ok(watcher::Event::Apply(obj)) => {
                let now = control_fingerprint(obj.meta());
                let change = classify(seen.insert(ObjectRef::from_obj(&obj), now), now);
                let reconciles = mode.reconciles(change);
                metrics.watch_change(&kind, change, reconciles);
                reconciles.then_some(Ok(obj))
            }
        };
        std::future::ready(out)
    });
    (reader, trigger)
}

/// [`drive`], with `extend` applied to each new controller before it runs: an operator adds
/// its second triggers there (`Controller::watches`, `owns`), reading the controller's own
/// store if it maps by what the primary objects say.
#[allow(clippy::too_many_arguments)]
pub async fn drive_with<K, Ctx, F, Fut, E, X>(
    api: Api<K>,
    watcher_config: watcher::Config,
    ctx: Arc<Ctx>,
    reconcile: F,
    mut leadership: Leadership,
    shutdown: CancellationToken,
    hooks: Hooks,
    extend: X,
) where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
    K::DynamicType: Eq + Hash + Clone + Debug + Unpin,
    Ctx: Send + Sync + 'static,
    F: Fn(Arc<K>, Arc<Ctx>) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<Action, E>> + Send + 'static,
    E: std::error::Error + Categorized + Send + Sync + 'static,
    X: Fn(Controller<K>) -> Controller<K>,
{
    let kind = K::kind(&()).into_owned();
    let reconcile = Arc::new(reconcile);
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => break,
            got = leadership.acquired() => if !got { break },
        }
        tracing::info!(%kind, "leading: starting controller");
        hooks.metrics.set_leader(true);

        let stop = CancellationToken::new();
        // Cancelled only when leadership is lost: in-flight reconciles are dropped at their next
        // await, before their next side effect. A shutdown (SIGTERM) lets them finish instead.
        let deposed = CancellationToken::new();
        // Dropped once the controller stopped: disarms the step-down watchdog.
        let (stopped_tx, stopped_rx) = std::sync::mpsc::channel::<()>();
        let stopper = {
            let stop = stop.clone();
            let deposed = deposed.clone();
            let shutdown = shutdown.clone();
            let mut leadership = leadership.clone();
            let watchdog = hooks.step_down.clone();
            tokio::spawn(async move {
                tokio::select! {
                    _ = shutdown.cancelled() => {},
                    _ = leadership.lost() => {
                        tracing::warn!("lost leadership: cancelling in-flight reconciles");
                        watchdog.arm(stopped_rx);
                        deposed.cancel();
                    }
                }
                stop.cancel();
            })
        };

        let (reader, trigger) = primary_trigger(
            api.clone(),
            watcher_config.clone(),
            hooks.primary_changes,
            hooks.metrics.clone(),
            kind.clone(),
        );
        let controller = extend(
            Controller::for_stream(trigger, reader)
                .with_config(hooks.controller_config())
                .graceful_shutdown_on(stop.clone().cancelled_owned()),
        );
        let store = controller.store();
        // Scrapes read the per-object series from this store while this controller runs.
        hooks.metrics.objects().lead(store.clone());
        let sync_task = {
            let health = hooks.health.clone();
            let stop = stop.clone();
            tokio::spawn(async move {
                // The store's readiness signal wakes only one waiter, and the controller waits
                // on it too: re-poll on a short period instead of relying on the wake-up.
                loop {
                    let poll =
                        tokio::time::timeout(Duration::from_millis(200), store.wait_until_ready());
                    tokio::select! {
                        _ = stop.cancelled() => break,
                        ready = poll => match ready {
                            Ok(Ok(())) => {
                                health.set_synced(true);
                                tracing::info!("caches synced");
                                break;
                            }
                            Ok(Err(_)) => return,
                            Err(_) => {}
                        },
                    }
                }
            })
        };

        let run_hooks = hooks.clone();
        let run_reconcile = reconcile.clone();
        let run_kind = kind.clone();
        let run_deposed = deposed.clone();
        let wrapped = move |obj: Arc<K>, ctx: Arc<Ctx>| {
            let hooks = run_hooks.clone();
            let kind = run_kind.clone();
            let key = object_key(obj.as_ref());
            let fut = run_reconcile(obj, ctx);
            let deposed = run_deposed.clone();
            async move {
                let started = Instant::now();
                let result = tokio::select! {
                    r = fut => r,
                    _ = deposed.cancelled() => {
                        tracing::warn!(object = %key, "reconcile cancelled: this replica no longer leads");
                        return Ok(Action::await_change());
                    }
                };
                let category = result.as_ref().err().map(Categorized::category);
                hooks.metrics.observe(&kind, started.elapsed(), category);
                if result.is_ok() {
                    hooks.backoff.succeed(&key);
                }
                result
            }
        };
        let error_hooks = hooks.clone();
        let error_policy = move |obj: Arc<K>, err: &E, _ctx: Arc<Ctx>| {
            let key = object_key(obj.as_ref());
            let delay = crate::error::retry_delay(error_hooks.backoff.fail(&key), err);
            let category = err.category();
            tracing::warn!(
                object = %key,
                category = category.label(),
                retry_in = ?delay,
                error = %err,
                "reconcile failed"
            );
            Action::requeue(delay)
        };

        controller
            .run(wrapped, error_policy, ctx.clone())
            .for_each(|res| async move {
                match res {
                    Ok((obj, _)) => tracing::debug!(object = %obj, "reconciled"),
                    Err(ControllerError::ReconcilerFailed(..)) => {} // logged by the error policy
                    Err(ControllerError::ObjectNotFound(obj)) => {
                        tracing::debug!(object = %obj, "object gone before reconcile")
                    }
                    Err(err) => tracing::warn!(error = %err, "controller error"),
                }
            })
            .await;
        drop(stopped_tx);

        stop.cancel();
        let _ = stopper.await;
        let _ = sync_task.await;
        hooks.health.set_synced(false);
        hooks.metrics.set_leader(false);
        tracing::info!(%kind, "controller stopped");
        if shutdown.is_cancelled() {
            break;
        }
    }
}

/// Everything an operator binary sets up before it reconciles.
pub struct Runtime {
    /// The operator's name (`sluice-<operator>`): Lease name default, Event reporter.
    pub name: &'static str,
    /// The parsed flags.
    pub args: RuntimeArgs,
    /// The Kubernetes client for requests (reads and writes; connect and read timeouts, see
    /// [`crate::client::for_requests`]). Never watch with it: use [`Runtime::watch_client`].
    pub client: Client,
    /// The Kubernetes client for watches and reflectors (no read timeout).
    pub watch_client: Client,
    /// The operator's Event recorder.
    pub recorder: EventRecorder,
    /// Metrics registry; operators may register more metrics before [`Runtime::run`].
    pub registry: Registry,
    /// Shared metrics.
    pub metrics: Metrics,
    /// Health flags.
    pub health: Health,
    /// Webhook notifications (disabled without `--notifications-secret`); operators call
    /// [`Notifier::notify`] after a status write that made a transition worth a notice.
    pub notifier: Notifier,
    /// Which changes of the operator's own objects start a reconcile (default: every one).
    pub primary_changes: PrimaryChanges,
    /// The leader election, once started by [`Runtime::leadership`] or [`Runtime::run`].
    election: Option<Election>,
}

/// A started leader election: its view, its stop token and its task (none when disabled).
struct Election {
    leadership: Leadership,
    stop: CancellationToken,
    task: Option<tokio::task::JoinHandle<()>>,
}

impl Debug for Runtime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Runtime")
            .field("name", &self.name)
            .field("args", &self.args)
            .finish_non_exhaustive()
    }
}

/// Resolves on SIGTERM or SIGINT.
pub async fn termination_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = term.recv() => {},
                    _ = tokio::signal::ctrl_c() => {},
                }
            }
            Err(_) => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}

/// The notifier `args` ask for, its Secret watched (in the pod's namespace) for as long as the
/// process runs; its metrics are registered either way.
fn start_notifier(
    name: &'static str,
    args: &RuntimeArgs,
    watch_client: &Client,
    registry: &mut Registry,
    recorder: &EventRecorder,
) -> Result<Notifier, BootError> {
    let metrics = NotifyMetrics::register(registry);
    let secret = args.notify.notifications_secret.trim();
    if secret.is_empty() {
        return Ok(Notifier::disabled());
    }
    let namespace = std::env::var("POD_NAMESPACE")
        .ok()
        .filter(|s| !s.is_empty())
        .map_or_else(|| args.lease_settings(name).map(|l| l.namespace), Ok)?;
    let notifier = Notifier::start(
        NotifierOptions {
            operator: name.to_owned(),
            cluster: args.notify.notifications_cluster.trim().to_owned(),
            retry: RetryPolicy::default(),
        },
        metrics,
        Some(recorder.clone()),
    );
    tracing::info!(secret, %namespace, "notifications: targets from Secret");
    tokio::spawn(notifier.clone().watch_secret(
        Api::namespaced(watch_client.clone(), &namespace),
        secret.to_owned(),
        CancellationToken::new(),
    ));
    Ok(notifier)
}

impl Runtime {
    /// Installs tracing, validates the flags and builds the client.
    pub async fn init(name: &'static str, args: RuntimeArgs) -> Result<Self, BootError> {
        crate::telemetry::init(args.log_format, &args.log_level)?;
        args.lease_settings(name)?;
        let clients = crate::client::clients(&args).await?;
        let mut registry = Registry::default();
        let metrics = Metrics::register(&mut registry);
        let recorder = EventRecorder::new(clients.requests.clone(), name);
        let notifier = start_notifier(name, &args, &clients.watches, &mut registry, &recorder)?;
        Ok(Self {
            name,
            notifier,
            recorder,
            args,
            client: clients.requests,
            watch_client: clients.watches,
            registry,
            metrics,
            health: Health::default(),
            primary_changes: PrimaryChanges::Every,
            election: None,
        })
    }

    /// This replica's leadership, starting the leader election if it has not started yet. Put it
    /// in the operator's context: every side effect calls [`Leadership::ensure`] right before it,
    /// and background tasks stop at [`Leadership::lost`].
    pub fn leadership(&mut self) -> Result<Leadership, BootError> {
        if let Some(e) = &self.election {
            return Ok(e.leadership.clone());
        }
        let stop = CancellationToken::new();
        let election = if self.args.leader_election_disabled {
            tracing::warn!("leader election disabled: run a single replica only");
            Election {
                leadership: Leadership::always(),
                stop,
                task: None,
            }
        } else {
            let settings = self.args.lease_settings(self.name)?;
            let (leadership, task) = leader::spawn(self.client.clone(), settings, stop.clone());
            Election {
                leadership,
                stop,
                task: Some(task),
            }
        };
        let leadership = election.leadership.clone();
        self.election = Some(election);
        Ok(leadership)
    }

    /// The step-down watchdog of this replica: with leader election, the controller must stop
    /// within the renew margin (`--lease-renew-seconds`), the time between this replica's own
    /// deadline and the earliest takeover by a standby, or the process exits.
    fn step_down_watchdog(&self) -> StepDownWatchdog {
        if self.args.leader_election_disabled {
            return StepDownWatchdog::off();
        }
        StepDownWatchdog::exit_process(Duration::from_secs(self.args.lease_renew_seconds.max(1)))
    }

    /// Serves metrics and health, runs leader election, and reconciles `api`'s kind with
    /// `reconcile` while leading, until SIGTERM/SIGINT. Shutdown order: stop reconciling, then
    /// release the Lease, then stop the server.
    pub async fn run<K, Ctx, F, Fut, E>(
        self,
        api: Api<K>,
        ctx: Arc<Ctx>,
        reconcile: F,
    ) -> Result<(), BootError>
    where
        K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
        Ctx: Send + Sync + 'static,
        F: Fn(Arc<K>, Arc<Ctx>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<Action, E>> + Send + 'static,
        E: std::error::Error + Categorized + Send + Sync + 'static,
    {
        self.run_with(api, ctx, reconcile, |controller| controller)
            .await
    }

    /// [`Runtime::run`], with `extend` applied to each new controller (see [`drive_with`]).
    pub async fn run_with<K, Ctx, F, Fut, E, X>(
        mut self,
        api: Api<K>,
        ctx: Arc<Ctx>,
        reconcile: F,
        extend: X,
    ) -> Result<(), BootError>
    where
        K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
        Ctx: Send + Sync + 'static,
        F: Fn(Arc<K>, Arc<Ctx>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<Action, E>> + Send + 'static,
        E: std::error::Error + Categorized + Send + Sync + 'static,
        X: Fn(Controller<K>) -> Controller<K>,
    {
        self.leadership()?;
        let Election {
            leadership,
            stop: lease_stop,
            task: lease_task,
        } = self.election.take().expect("started just above");
        let step_down = self.step_down_watchdog();
        let server_stop = CancellationToken::new();
        let server = Server::bind(
            self.args.metrics_addr,
            Arc::new(self.registry),
            self.health.clone(),
        )
        .await?;
        tracing::info!(operator = self.name, addr = ?server.local_addr(), "serving /metrics, /healthz, /readyz");
        let server_task = server.spawn(server_stop.clone());

        let health_task = {
            let health = self.health.clone();
            let mut l = leadership.clone();
            if lease_task.is_none() {
                health.set_leader(true);
            }
            // Until the Lease first answers, the replica is Starting (not ready), not Standby.
            tokio::spawn(async move {
                while let Some(leader) = l.changed().await {
                    health.set_leader(leader);
                }
            })
        };

        let shutdown = CancellationToken::new();
        tokio::spawn({
            let shutdown = shutdown.clone();
            let health = self.health.clone();
            async move {
                termination_signal().await;
                tracing::info!("termination signal received: shutting down");
                health.set_shutting_down();
                shutdown.cancel();
            }
        });

        let hooks = Hooks {
            metrics: self.metrics.clone(),
            health: self.health.clone(),
            backoff: Arc::new(Backoff::default()),
            max_concurrent_reconciles: self.args.max_concurrent_reconciles,
            step_down,
            primary_changes: self.primary_changes,
        };
        tracing::info!(
            max_concurrent_reconciles = hooks.max_concurrent_reconciles,
            "reconciles bounded"
        );
        // The namespace scope is in `api` (see `namespaced_api`).
        let watcher_config = watcher::Config::default().any_semantic();
        drive_with(
            api,
            watcher_config,
            ctx,
            reconcile,
            leadership,
            shutdown.clone(),
            hooks,
            extend,
        )
        .await;

        lease_stop.cancel();
        if let Some(t) = lease_task {
            let _ = tokio::time::timeout(Duration::from_secs(5), t).await;
        }
        health_task.abort();
        server_stop.cancel();
        let _ = tokio::time::timeout(Duration::from_secs(5), server_task).await;
        tracing::info!(operator = self.name, "stopped");
        Ok(())
    }

    /// An `Api` to watch a namespaced kind, honouring `--namespace` (all namespaces when empty).
    /// It uses the watch client: for requests, build the `Api` on [`Runtime::client`].
    pub fn namespaced_api<K>(&self) -> Api<K>
    where
        K: Resource<DynamicType = (), Scope = k8s_openapi::NamespaceResourceScope>,
    {
        match self.args.namespace_scope() {
            Some(ns) => Api::namespaced(self.watch_client.clone(), ns),
            None => Api::all(self.watch_client.clone()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_caps_and_resets() {
        let b = Backoff::new(Duration::from_millis(100), Duration::from_secs(1));
        let table = [
            (1, 100),
            (2, 200),
            (3, 400),
            (4, 800),
            (5, 1000),
            (40, 1000),
        ];
        for (failures, want_ms) in table {
            assert_eq!(
                b.delay(failures),
                Duration::from_millis(want_ms),
                "failures {failures}"
            );
        }
        let within = |d: Duration, ms: u64| {
            d >= Duration::from_millis(ms / 2) && d <= Duration::from_millis(ms)
        };
        assert!(within(b.fail("ns/a"), 100));
        assert!(within(b.fail("ns/a"), 200));
        assert!(
            within(b.fail("ns/b"), 100),
            "objects back off independently"
        );
        b.succeed("ns/a");
        assert!(within(b.fail("ns/a"), 100));
    }

    #[test]
    fn retries_of_objects_that_failed_together_spread_out() {
        let b = Backoff::new(Duration::from_secs(1), Duration::from_secs(300));
        let delays: std::collections::BTreeSet<Duration> =
            (0..100).map(|i| b.fail(&format!("ns/r{i}"))).collect();
        assert!(
            delays.len() > 90,
            "100 objects failing at once retry at {} distinct times",
            delays.len()
        );
        assert!(
            delays
                .iter()
                .all(|d| *d >= Duration::from_millis(500) && *d <= Duration::from_secs(1))
        );
    }

    #[test]
    fn failure_counts_of_objects_gone_while_failing_are_forgotten() {
        let b = Backoff::new(Duration::from_millis(1), Duration::from_millis(5));
        b.fail("ns/deleted-while-failing");
        std::thread::sleep(Duration::from_millis(20));
        b.fail("ns/other");
        assert_eq!(b.tracked(), 1, "the deleted object's count was pruned");
    }
}
