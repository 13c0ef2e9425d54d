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

use kube_emulator::{ADMIN_TOKEN, Emulator};
use sluice_runtime::config::LeaseSettings;
use sluice_runtime::leader::{self, Leadership};
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
    // The operators' request clients bound a request like this; the Lease loop bounds its own.
    c.connect_timeout = Some(Duration::from_secs(5));
    c.read_timeout = Some(Duration::from_secs(30));
    kube::Client::try_from(c).unwrap()
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
