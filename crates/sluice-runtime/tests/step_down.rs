//! The step-down watchdog against the Kubernetes API emulator: a deposed controller whose
//! reconcile is stuck in blocking code (never reaching the await at which it would be dropped)
//! trips the watchdog within its limit, so the operator exits before a standby may take over;
//! a controller whose reconciles stop normally never trips it.

use std::{
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

use k8s_openapi::api::core::v1::ConfigMap;
use kube::Api;
use sluice_runtime::{
    Action, Categorized, Category,
    leader::Leadership,
    operator::{Hooks, StepDownWatchdog, drive},
};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

const LIMIT: Duration = Duration::from_millis(600);

/// A watchdog with [`LIMIT`] that records when it tripped.
fn recording(tripped: Arc<Mutex<Option<std::time::Instant>>>) -> StepDownWatchdog {
    StepDownWatchdog {
        limit: Some(LIMIT),
        on_stall: Arc::new(move |_| *tripped.lock().unwrap() = Some(std::time::Instant::now())),
    }
}

#[derive(Debug, thiserror::Error)]
#[error("never returned")]
struct Never;

impl Categorized for Never {
    fn category(&self) -> Category {
        Category::Internal
    }
}

/// How the reconcile behaves once it started, and whether it did.
#[derive(Debug)]
struct Probe {
    blocking: bool,
    started: AtomicBool,
}

async fn reconcile(_: Arc<ConfigMap>, probe: Arc<Probe>) -> Result<Action, Never> {
    probe.started.store(true, Ordering::SeqCst);
    if probe.blocking {
        // Blocking code: the thread is held and the future is never polled to an await.
        std::thread::sleep(Duration::from_secs(4));
    } else {
        tokio::time::sleep(Duration::from_secs(4)).await;
    }
    Ok(Action::await_change())
}

/// Leads, lets one reconcile start, then loses leadership; returns when (after the loss) the
/// watchdog made by `watchdog` tripped, if it did within `wait`.
async fn step_down_with(
    blocking: bool,
    wait: Duration,
    watchdog: impl FnOnce(Arc<Mutex<Option<std::time::Instant>>>) -> StepDownWatchdog,
) -> Option<Duration> {
    let emu = kube_emulator::Emulator::start().await;
    emu.load_yaml(
        "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: held\n---\n\
         apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: c\n  namespace: held\n",
    )
    .expect("objects load");
    let tripped: Arc<Mutex<Option<std::time::Instant>>> = Arc::default();
    let (hooks, _registry) = Hooks::standalone();
    let hooks = Hooks {
        step_down: watchdog(tripped.clone()),
        ..hooks
    };
    let probe = Arc::new(Probe {
        blocking,
        started: AtomicBool::new(false),
    });
    let (tx, rx) = tokio::sync::watch::channel(true);
    let shutdown = CancellationToken::new();
    let task = tokio::spawn(drive(
        Api::<ConfigMap>::namespaced(emu.client(), "held"),
        kube::runtime::watcher::Config::default(),
        probe.clone(),
        reconcile,
        Leadership::from_receiver(rx),
        shutdown.clone(),
        hooks,
    ));
    let deadline = Instant::now() + Duration::from_secs(20);
    while !probe.started.load(Ordering::SeqCst) {
        assert!(Instant::now() < deadline, "the reconcile never started");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let lost = std::time::Instant::now();
    tx.send_replace(false);
    tokio::time::sleep(wait).await;
    let result = tripped.lock().unwrap().map(|t| t.duration_since(lost));
    shutdown.cancel();
    let _ = tokio::time::timeout(Duration::from_secs(10), task).await;
    emu.shutdown().await;
    result
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reconcile_blocked_outside_an_await_trips_the_watchdog_within_its_limit() {
    let tripped = step_down_with(true, Duration::from_secs(2), recording)
        .await
        .expect("the watchdog must trip when a deposed reconcile cannot be dropped");
    assert!(
        tripped >= LIMIT && tripped < LIMIT + Duration::from_millis(900),
        "tripped {tripped:?} after the loss; the limit is {LIMIT:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_controller_that_stops_never_trips_the_watchdog() {
    let tripped = step_down_with(false, 3 * LIMIT, recording).await;
    assert_eq!(
        tripped, None,
        "the reconcile was dropped at its await; nothing may trip"
    );
}

/// Run in a child process by [`the_operator_process_exits_when_its_step_down_stalls`].
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stalled_step_down_child() {
    if std::env::var_os(CHILD).is_none() {
        return;
    }
    step_down_with(true, Duration::from_secs(5), |_| {
        StepDownWatchdog::exit_process(LIMIT)
    })
    .await;
    unreachable!("the watchdog must have ended the process");
}

const CHILD: &str = "SLUICE_STEP_DOWN_CHILD";

#[test]
fn the_operator_process_exits_when_its_step_down_stalls() {
    let started = std::time::Instant::now();
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "stalled_step_down_child", "--nocapture"])
        .env(CHILD, "1")
        .output()
        .expect("the test binary runs");
    assert_eq!(
        out.status.code(),
        Some(sluice_runtime::operator::STALLED_STEP_DOWN_EXIT),
        "the operator must exit with the stalled step-down status; stderr:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "the child ran {:?}",
        started.elapsed()
    );
}
