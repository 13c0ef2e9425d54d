//! The contract every sluice operator binary keeps, checked against the Kubernetes API emulator:
//! it starts, takes its Lease, serves `/metrics`, `/healthz` and `/readyz`, and on SIGTERM stops
//! reconciling, releases the Lease and exits 0. Never starts anything it does not stop.

use std::{
    io::{Read, Write},
    net::{SocketAddr, TcpListener, TcpStream},
    path::Path,
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use k8s_openapi::api::coordination::v1::Lease;
use kube::Api;

fn free_addr() -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap()
}

/// A blocking HTTP GET on loopback: (status code, body).
fn get(addr: SocketAddr, path: &str) -> Option<(u16, String)> {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(1)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n"
    )
    .ok()?;
    let mut out = String::new();
    s.read_to_string(&mut out).ok()?;
    let code = out.split_whitespace().nth(1)?.parse().ok()?;
    let body = out.split("\r\n\r\n").nth(1).unwrap_or_default().to_owned();
    Some((code, body))
}

/// Kills the child if the test fails before it exits.
struct Guard(Option<Child>);
impl Drop for Guard {
    fn drop(&mut self) {
        if let Some(c) = self.0.as_mut() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

async fn until<T>(what: &str, within: Duration, mut f: impl AsyncFnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + within;
    loop {
        if let Some(v) = f().await {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Runs an operator binary against a fresh emulator holding its CRD and checks the contract every
/// sluice binary keeps: it takes its Lease (named like the binary), serves `/metrics`, `/healthz`
/// and `/readyz` (200 once leading with synced caches), and on SIGTERM releases the Lease and
/// exits 0. Panics with what went wrong.
pub async fn check_operator_binary(binary: &str, crd_file: &Path, lease_name: &str) {
    let emu = kube_emulator::Emulator::start().await;
    emu.load_manifest_file(crd_file).expect("CRD installs");
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    emu.write_kubeconfig(&kubeconfig).unwrap();
    let addr = free_addr();

    let child = Command::new(binary)
        .args(["--kubeconfig", kubeconfig.to_str().unwrap()])
        .args(["--metrics-addr", &addr.to_string()])
        .args(["--lease-namespace", "default", "--identity", "replica-a"])
        .args([
            "--lease-duration-seconds",
            "4",
            "--lease-renew-seconds",
            "2",
            "--lease-retry-seconds",
            "1",
        ])
        .args(["--log-format", "text", "--log-level", "info"])
        .env_remove("KUBERNETES_SERVICE_HOST")
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("binary starts");
    let pid = child.id();
    let mut guard = Guard(Some(child));

    let started = Instant::now();
    until("/readyz 200 ready", Duration::from_secs(20), async || {
        get(addr, "/readyz").filter(|(code, body)| *code == 200 && body == "ready")
    })
    .await;
    println!(
        "binary ready (leader, caches synced) after {:?}",
        started.elapsed()
    );
    assert_eq!(get(addr, "/healthz").map(|r| r.0), Some(200));
    let (_, metrics) = get(addr, "/metrics").unwrap();
    assert!(metrics.contains("sluice_leader 1"), "{metrics}");

    let leases: Api<Lease> = Api::namespaced(emu.client(), "default");
    let lease = leases.get(lease_name).await.expect("Lease created");
    let holder = lease.spec.and_then(|s| s.holder_identity);
    assert_eq!(holder.as_deref(), Some("replica-a"));

    // SIGTERM: stop reconciling, release the Lease, exit 0.
    let status = Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let mut child = guard.0.take().unwrap();
    let code = until("exit after SIGTERM", Duration::from_secs(15), async || {
        child.try_wait().unwrap()
    })
    .await;
    assert!(code.success(), "exit status {code:?}");
    let lease = leases.get(lease_name).await.unwrap();
    let holder = lease.spec.and_then(|s| s.holder_identity);
    assert_eq!(holder, None, "Lease released on shutdown");
    emu.shutdown().await;
}
