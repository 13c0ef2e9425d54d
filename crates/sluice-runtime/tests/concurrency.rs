//! The controller's reconcile bound against the Kubernetes API emulator: with
//! `max_concurrent_reconciles` = n, never more than n reconciles run at once, every object is
//! still reconciled, and a larger bound does let more run together (so the bound, not the
//! machine, is what holds them back).

use std::{
    collections::BTreeSet,
    sync::{
        Arc, Mutex,
        atomic::{AtomicUsize, Ordering},
    },
    time::Duration,
};

use k8s_openapi::api::core::v1::ConfigMap;
use kube::Api;
use sluice_runtime::{
    Action, Categorized, Category,
    leader::Leadership,
    operator::{Hooks, drive},
};
use tokio::time::{Instant, timeout};
use tokio_util::sync::CancellationToken;

const OBJECTS: usize = 24;
const HOLD: Duration = Duration::from_millis(150);

#[derive(Debug, thiserror::Error)]
#[error("never returned")]
struct Never;

impl Categorized for Never {
    fn category(&self) -> Category {
        Category::Internal
    }
}

/// Counts reconciles in flight and remembers the most seen at once.
#[derive(Debug, Default)]
struct Probe {
    running: AtomicUsize,
    peak: AtomicUsize,
    seen: Mutex<BTreeSet<String>>,
}

async fn hold(obj: Arc<ConfigMap>, probe: Arc<Probe>) -> Result<Action, Never> {
    let now = probe.running.fetch_add(1, Ordering::SeqCst) + 1;
    probe.peak.fetch_max(now, Ordering::SeqCst);
    tokio::time::sleep(HOLD).await;
    probe.running.fetch_sub(1, Ordering::SeqCst);
    probe
        .seen
        .lock()
        .unwrap()
        .insert(obj.metadata.name.clone().unwrap_or_default());
    Ok(Action::await_change())
}

/// Runs a controller over `OBJECTS` ConfigMaps with bound `bound`; returns the peak of
/// reconciles in flight once every object was reconciled.
async fn peak_with(bound: u16) -> usize {
    let emu = kube_emulator::Emulator::start().await;
    let mut yaml = String::new();
    for i in 0..OBJECTS {
        yaml.push_str(&format!(
            "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: c{i}\n  namespace: bound\n---\n"
        ));
    }
    emu.load_yaml("apiVersion: v1\nkind: Namespace\nmetadata:\n  name: bound\n")
        .expect("namespace loads");
    emu.load_yaml(&yaml).expect("config maps load");
    let probe = Arc::new(Probe::default());
    let (hooks, _registry) = Hooks::standalone();
    let shutdown = CancellationToken::new();
    let task = tokio::spawn(drive(
        Api::<ConfigMap>::namespaced(emu.client(), "bound"),
        kube::runtime::watcher::Config::default(),
        probe.clone(),
        hold,
        Leadership::always(),
        shutdown.clone(),
        hooks.with_max_concurrent_reconciles(bound),
    ));
    let deadline = Instant::now() + Duration::from_secs(30);
    while probe.seen.lock().unwrap().len() < OBJECTS {
        assert!(
            Instant::now() < deadline,
            "bound {bound}: only {} of {OBJECTS} ConfigMaps reconciled within 30 s",
            probe.seen.lock().unwrap().len()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    shutdown.cancel();
    timeout(Duration::from_secs(10), task)
        .await
        .expect("controller stops within 10 s of shutdown")
        .expect("controller task");
    emu.shutdown().await;
    probe.peak.load(Ordering::SeqCst)
}

#[tokio::test]
async fn reconciles_in_flight_never_exceed_the_bound() {
    for bound in [1u16, 4] {
        let peak = peak_with(bound).await;
        assert!(
            (1..=usize::from(bound)).contains(&peak),
            "bound {bound}: {peak} reconciles ran at once"
        );
    }
    // Without a tight bound the same objects do run together.
    let peak = peak_with(64).await;
    assert!(
        peak > 4,
        "bound 64: only {peak} reconciles ran at once; the test cannot tell a bound from a slow machine"
    );
}
