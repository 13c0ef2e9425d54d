//! A deposed leader cannot act: the leader's connection to the API server is frozen (a proxy that
//! drops every byte, not one that buffers them) while a standby with a working connection waits.
//! The frozen leader must stop acting on its own clock — every side effect checks
//! `Leadership::ensure` — before the standby may take the Lease, and the standby must then take
//! it. Lease timings are the chart's ratios scaled down (duration 3 s, renew margin 1 s, retry 1 s).

use std::net::SocketAddr;
use std::sync::{
    Arc, Mutex,
    atomic::{AtomicBool, Ordering},
};
use std::time::Duration;

use k8s_openapi::api::core::v1::ConfigMap;
use kube_emulator::{ADMIN_TOKEN, Emulator};
use sluice_runtime::Action;
use sluice_runtime::config::LeaseSettings;
use sluice_runtime::leader::{self, Leadership};
use sluice_runtime::operator::{Hooks, drive};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// A TCP proxy to `upstream` that, once frozen, drops every byte in both directions and
/// accepts no new connection: the leader sees a connection that hangs, as on a partition.
struct FreezingProxy {
    addr: SocketAddr,
    frozen: Arc<AtomicBool>,
}

impl FreezingProxy {
    async fn start(upstream: SocketAddr) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let frozen = Arc::new(AtomicBool::new(false));
        let f = frozen.clone();
        tokio::spawn(async move {
            loop {
                let Ok((client, _)) = listener.accept().await else {
                    return;
                };
                if f.load(Ordering::SeqCst) {
                    // Held open, never answered.
                    tokio::spawn(async move {
                        let _held = client;
                        tokio::time::sleep(Duration::from_secs(3600)).await;
                    });
                    continue;
                }
                let Ok(server) = TcpStream::connect(upstream).await else {
                    continue;
                };
                let (cr, cw) = client.into_split();
                let (sr, sw) = server.into_split();
                tokio::spawn(pump(cr, sw, f.clone()));
                tokio::spawn(pump(sr, cw, f.clone()));
            }
        });
        Self { addr, frozen }
    }

    fn freeze(&self) {
        self.frozen.store(true, Ordering::SeqCst);
    }
}

/// Copies bytes until frozen; frozen bytes are read and dropped.
async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    frozen: Arc<AtomicBool>,
) {
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        if frozen.load(Ordering::SeqCst) {
            continue;
        }
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}

fn settings(identity: &str) -> LeaseSettings {
    LeaseSettings {
        name: "sluice-test".into(),
        namespace: "default".into(),
        identity: identity.into(),
        duration_seconds: 3,
        renew_seconds: 1,
        retry: Duration::from_secs(1),
    }
}

fn client_via(url: &str) -> kube::Client {
    let mut c = kube::Config::new(url.parse().unwrap());
    c.default_namespace = "default".into();
    c.auth_info.token = Some(ADMIN_TOKEN.to_string().into());
    // The operators' request clients (the Lease loop bounds its own rounds besides).
    kube::Client::try_from(sluice_runtime::client::for_requests(c)).unwrap()
}

async fn wait_leading(l: &mut Leadership, budget: Duration) {
    tokio::time::timeout(budget, l.acquired())
        .await
        .expect("leads within the budget");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_leader_stops_acting_before_the_standby_takes_over() {
    let emu = Emulator::start().await;
    let upstream: SocketAddr = format!("127.0.0.1:{}", emu.port()).parse().unwrap();
    let proxy = FreezingProxy::start(upstream).await;

    // Given replica a leading through the proxy, and replica b standing by on a direct link.
    let stop = CancellationToken::new();
    let (mut a, a_task) = leader::spawn(
        client_via(&format!("http://{}", proxy.addr)),
        settings("a"),
        stop.clone(),
    );
    wait_leading(&mut a, Duration::from_secs(10)).await;
    let (mut b, b_task) = leader::spawn(emu.client(), settings("b"), stop.clone());
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(a.is_leader() && !b.is_leader(), "a leads, b stands by");

    // a's side effects: every 20 ms it acts if ensure() allows it; each act is timestamped.
    let acts: Arc<Mutex<Vec<Instant>>> = Arc::default();
    let actor = {
        let a = a.clone();
        let acts = acts.clone();
        tokio::spawn(async move {
            loop {
                if a.ensure().is_ok() {
                    acts.lock().unwrap().push(Instant::now());
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
    };

    // When a's connection freezes.
    let frozen_at = Instant::now();
    proxy.freeze();

    // Then a steps down on its own clock and b takes over, in that order.
    let mut a_watch = a.clone();
    tokio::time::timeout(Duration::from_secs(6), a_watch.lost())
        .await
        .expect("the frozen leader steps down within the renew deadline");
    let a_lost = Instant::now();
    wait_leading(&mut b, Duration::from_secs(10)).await;
    let b_leads = Instant::now();
    actor.abort();

    let last_act = *acts.lock().unwrap().last().expect("a acted while leading");
    assert!(
        last_act < b_leads,
        "the deposed leader acted {:?} after the standby took over",
        last_act - b_leads
    );
    assert!(
        a_lost < b_leads,
        "a stepped down {:?} after b took over",
        a_lost - b_leads
    );
    // The renew deadline is 2 s from the last renewal sent (at most 1 s before the freeze).
    assert!(
        a_lost - frozen_at <= Duration::from_millis(2500),
        "a kept leading {:?} after its connection froze",
        a_lost - frozen_at
    );
    // b takes over once it saw the record unrenewed for the whole duration (3 s) plus a round.
    assert!(
        b_leads - frozen_at <= Duration::from_secs(6),
        "b took {:?} to take over",
        b_leads - frozen_at
    );
    assert!(
        b_leads - a_lost >= Duration::from_millis(500),
        "the margin between a stepping down and b taking over is {:?}, expected about the renew margin (1 s)",
        b_leads - a_lost
    );
    println!(
        "frozen leader stepped down after {:?}; standby took over after {:?}; last act {:?} before the takeover",
        a_lost - frozen_at,
        b_leads - frozen_at,
        b_leads - last_act
    );

    stop.cancel();
    let _ = tokio::time::timeout(Duration::from_secs(3), b_task).await;
    a_task.abort();
    emu.shutdown().await;
}

/// Records, on the API server's side, when each write of one writer landed: a watch on the
/// writer's ConfigMaps, the arrival of each ADDED event timestamped (an event arrives after its
/// write was committed, so the recorded time is never earlier than the write).
fn record_writes(client: kube::Client, writer: &str) -> Arc<Mutex<Vec<(String, Instant)>>> {
    use futures::StreamExt;
    use kube::runtime::{WatchStreamExt, watcher};
    let writes: Arc<Mutex<Vec<(String, Instant)>>> = Arc::default();
    let api: kube::Api<ConfigMap> = kube::Api::namespaced(client, "default");
    let cfg = watcher::Config::default().labels(&format!("writer={writer}"));
    let out = writes.clone();
    tokio::spawn(async move {
        // Backed off on errors: once the test shuts its emulator down, an unbacked watcher
        // retries in a hot loop that never yields, and the runtime can never shut down.
        let mut stream = watcher(api, cfg).default_backoff().boxed();
        while let Some(event) = stream.next().await {
            if let Ok(watcher::Event::Apply(cm) | watcher::Event::InitApply(cm)) = event {
                let name = cm.metadata.name.unwrap_or_default();
                out.lock().unwrap().push((name, Instant::now()));
            }
        }
    });
    writes
}

fn marker(name: String, writer: &str) -> ConfigMap {
    serde_json::from_value(serde_json::json!({
        "metadata": {"name": name, "namespace": "default", "labels": {"writer": writer}},
    }))
    .unwrap()
}

#[derive(Debug, thiserror::Error)]
enum ActError {
    #[error(transparent)]
    NotLeader(#[from] sluice_runtime::leader::NotLeader),
    #[error(transparent)]
    Kube(#[from] kube::Error),
}

impl sluice_runtime::Categorized for ActError {
    fn category(&self) -> sluice_runtime::Category {
        sluice_runtime::Category::ApiUnavailable
    }
}

struct Workload {
    client: kube::Client,
    leadership: Leadership,
    seq: std::sync::atomic::AtomicU64,
}

/// A reconcile that keeps acting on a workload cluster, as revert's applies do: one write every
/// 20 ms, each after `ensure()`, until the controller cancels it.
async fn keep_applying(_trigger: Arc<ConfigMap>, w: Arc<Workload>) -> Result<Action, ActError> {
    let api: kube::Api<ConfigMap> = kube::Api::namespaced(w.client.clone(), "default");
    loop {
        w.leadership.ensure()?;
        let n = w.seq.fetch_add(1, Ordering::SeqCst);
        api.create(&Default::default(), &marker(format!("apply-{n}"), "a"))
            .await?;
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A background schedule, as upgrade-revisions' eviction pacer: it acts every 20 ms after
/// `ensure()` and ends when leadership is lost.
fn spawn_schedule(client: kube::Client, leadership: Leadership, prefix: &'static str) {
    tokio::spawn(async move {
        let api: kube::Api<ConfigMap> = kube::Api::namespaced(client, "default");
        let mut lost = std::pin::pin!({
            let mut l = leadership.clone();
            async move { l.lost().await }
        });
        for n in 0.. {
            tokio::select! {
                _ = &mut lost => return,
                _ = tokio::time::sleep(Duration::from_millis(20)) => {}
            }
            if leadership.ensure().is_err() {
                return;
            }
            let _ = api
                .create(&Default::default(), &marker(format!("{prefix}-{n}"), "a"))
                .await;
        }
    });
}

/// The frozen leader runs a controller whose reconcile keeps applying to a workload cluster (a
/// second API server it reaches directly, as revert reaches its destinations) and a background
/// schedule writing to the workload cluster and to the management cluster. Both API servers
/// record when each of its writes landed: none landed after the standby took over.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_leader_writes_nothing_anywhere_after_the_standby_takes_over() {
    let emu = Emulator::start().await;
    let workload = Emulator::start().await;
    let upstream: SocketAddr = format!("127.0.0.1:{}", emu.port()).parse().unwrap();
    let proxy = FreezingProxy::start(upstream).await;
    let to_management = client_via(&format!("http://{}", proxy.addr));
    let workload_writes = record_writes(workload.client(), "a");
    let management_writes = record_writes(emu.client(), "a");

    let stop = CancellationToken::new();
    let (mut a, a_task) = leader::spawn(to_management.clone(), settings("a"), stop.clone());
    wait_leading(&mut a, Duration::from_secs(10)).await;
    let (mut b, b_task) = leader::spawn(emu.client(), settings("b"), stop.clone());

    // a's controller (watching through the proxy) reconciles the trigger by applying forever.
    let cms: kube::Api<ConfigMap> = kube::Api::namespaced(emu.client(), "default");
    cms.create(&Default::default(), &marker("trigger".into(), "trigger"))
        .await
        .unwrap();
    let ctx = Arc::new(Workload {
        client: workload.client(),
        leadership: a.clone(),
        seq: Default::default(),
    });
    let (hooks, _registry) = Hooks::standalone();
    let controller_stop = CancellationToken::new();
    let controller = tokio::spawn(drive(
        kube::Api::<ConfigMap>::namespaced(to_management.clone(), "default"),
        kube::runtime::watcher::Config::default().labels("writer=trigger"),
        ctx,
        keep_applying,
        a.clone(),
        controller_stop.clone(),
        hooks,
    ));
    spawn_schedule(workload.client(), a.clone(), "evict");
    spawn_schedule(to_management.clone(), a.clone(), "mgmt");
    // Until every kind of write has landed at least once.
    let ready = Instant::now();
    loop {
        let w = workload_writes.lock().unwrap().clone();
        let m = management_writes.lock().unwrap().len();
        if w.iter().any(|(n, _)| n.starts_with("apply-"))
            && w.iter().any(|(n, _)| n.starts_with("evict-"))
            && m > 0
        {
            break;
        }
        assert!(
            ready.elapsed() < Duration::from_secs(10),
            "a's writes did not start"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(!b.is_leader());

    let frozen_at = Instant::now();
    proxy.freeze();
    let mut a_watch = a.clone();
    tokio::time::timeout(Duration::from_secs(6), a_watch.lost())
        .await
        .expect("the frozen leader steps down within the renew deadline");
    let a_lost = Instant::now();
    wait_leading(&mut b, Duration::from_secs(10)).await;
    let b_leads = Instant::now();
    // Anything still in flight has had time to land.
    tokio::time::sleep(Duration::from_secs(1)).await;

    let w = workload_writes.lock().unwrap().clone();
    let m = management_writes.lock().unwrap().clone();
    let last = |prefix: &str, ws: &[(String, Instant)]| {
        ws.iter()
            .filter(|(n, _)| n.starts_with(prefix))
            .map(|(_, t)| *t)
            .max()
            .unwrap_or_else(|| panic!("no {prefix} write recorded"))
    };
    let last_apply = last("apply-", &w);
    let last_evict = last("evict-", &w);
    let last_mgmt = last("mgmt-", &m);
    for (what, t) in [
        ("remote apply (reconcile)", last_apply),
        ("workload write (background schedule)", last_evict),
        ("management-cluster write", last_mgmt),
    ] {
        assert!(
            t < b_leads,
            "the deposed leader's {what} landed {:?} after the standby took over",
            t - b_leads
        );
        assert!(
            t <= a_lost + Duration::from_millis(200),
            "the deposed leader's {what} landed {:?} after it stepped down",
            t - a_lost
        );
    }
    println!(
        "frozen leader stepped down {:?} after the freeze; standby took over {:?} after it; last \
         workload apply {:?}, last background workload write {:?}, last management write {:?} \
         before the takeover ({} workload writes in all)",
        a_lost - frozen_at,
        b_leads - frozen_at,
        b_leads - last_apply,
        b_leads - last_evict,
        b_leads - last_mgmt,
        w.len()
    );

    controller_stop.cancel();
    let _ = tokio::time::timeout(Duration::from_secs(3), controller).await;
    stop.cancel();
    let _ = tokio::time::timeout(Duration::from_secs(3), b_task).await;
    a_task.abort();
    workload.shutdown().await;
    emu.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_released_lease_is_taken_at_once() {
    let emu = Emulator::start().await;
    let stop_a = CancellationToken::new();
    let (mut a, a_task) = leader::spawn(emu.client(), settings("a"), stop_a.clone());
    wait_leading(&mut a, Duration::from_secs(10)).await;
    let stop_b = CancellationToken::new();
    let (mut b, b_task) = leader::spawn(emu.client(), settings("b"), stop_b.clone());
    tokio::time::sleep(Duration::from_millis(1200)).await;
    assert!(!b.is_leader());

    // When a shuts down, it releases the Lease; b takes it within a retry interval or two,
    // without waiting for the duration.
    let released = Instant::now();
    stop_a.cancel();
    a_task.await.unwrap();
    assert!(!a.is_leader());
    wait_leading(&mut b, Duration::from_secs(10)).await;
    assert!(
        released.elapsed() < Duration::from_millis(2500),
        "b took {:?} after the release",
        released.elapsed()
    );
    stop_b.cancel();
    b_task.await.unwrap();
    emu.shutdown().await;
}
