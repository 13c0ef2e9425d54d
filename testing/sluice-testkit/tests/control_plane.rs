//! The real control-plane fixture: it starts, serves the pinned Kubernetes version with its
//! identities (administrator certificate, ServiceAccount tokens under RBAC), shares an etcd
//! between API servers, runs the controllers, and leaves no process, port or directory behind —
//! when dropped, when a test panics, and when the test process dies without unwinding.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet};
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use serde_json::json;
use sluice_testkit::control_plane::{self, ControlPlane, Etcd, Options};
use sluice_testkit::eventually::eventually;

/// What a fixture left that must be gone afterwards.
#[derive(Debug, Default, serde::Serialize, serde::Deserialize)]
struct Footprint {
    pids: Vec<u32>,
    ports: Vec<u16>,
    dirs: Vec<PathBuf>,
}

impl Footprint {
    fn of(cp: &ControlPlane) -> Self {
        let mut f = Footprint {
            pids: cp.pids(),
            ports: cp.ports(),
            dirs: vec![cp.dir().to_path_buf()],
        };
        f.pids.extend(cp.etcd().pids());
        f.ports.extend(cp.etcd().ports());
        f.dirs.push(cp.etcd().dir().to_path_buf());
        f
    }

    /// Waits up to `timeout` for every process, port and directory to be gone; panics naming
    /// what is left.
    fn assert_gone_within(&self, timeout: Duration) {
        let start = Instant::now();
        loop {
            let left = self.left();
            if left.is_empty() {
                return;
            }
            if start.elapsed() > timeout {
                panic!("left behind after {timeout:?}: {left:?}");
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn left(&self) -> Vec<String> {
        let mut left = Vec::new();
        for pid in &self.pids {
            if alive(*pid) {
                left.push(format!("process {pid}"));
            }
        }
        for port in &self.ports {
            if std::net::TcpStream::connect(("127.0.0.1", *port)).is_ok() {
                left.push(format!("port {port}"));
            }
        }
        for dir in &self.dirs {
            if dir.exists() {
                left.push(format!("directory {}", dir.display()));
            }
        }
        left
    }
}

/// Whether a process runs (a zombie waiting for its reaper does not).
fn alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => {
            // `pid (comm) S ...`: the state follows the last ')'.
            let state = stat
                .rsplit_once(')')
                .and_then(|(_, rest)| rest.split_whitespace().next());
            !matches!(state, Some("Z" | "X"))
        }
        Err(_) => false,
    }
}

#[tokio::test]
async fn serves_the_pinned_version_with_admin_and_service_account_identities() {
    let Some(bins) = control_plane::require() else {
        return;
    };
    let cp = ControlPlane::start().await.unwrap();
    let client = cp.client().await.unwrap();

    let version = client.apiserver_version().await.unwrap();
    assert_eq!(version.git_version, control_plane::KUBERNETES_VERSION);
    assert_eq!(
        (version.major.as_str(), version.minor.as_str()),
        ("1", "37")
    );

    let ns = cp.namespace("identities").await.unwrap();
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &ns);
    secrets.list(&ListParams::default()).await.unwrap();

    // A ServiceAccount with no role is authenticated and refused by RBAC.
    let sa = cp.service_account_client(&ns, "operator").await.unwrap();
    let err = Api::<Secret>::namespaced(sa, &ns)
        .list(&ListParams::default())
        .await
        .unwrap_err();
    let kube::Error::Api(status) = err else {
        panic!("expected a 403, got {err}");
    };
    assert_eq!(status.code, 403, "{status:?}");
    assert!(
        status
            .message
            .contains(&format!("system:serviceaccount:{ns}:operator")),
        "{}",
        status.message
    );

    // The written kubeconfig works for the kubectl of the same build.
    let kubeconfig = cp.dir().join("test.kubeconfig");
    cp.write_kubeconfig(&kubeconfig).unwrap();
    let out = std::process::Command::new(&bins.kubectl)
        .arg("--kubeconfig")
        .arg(&kubeconfig)
        .args(["get", "namespace", &ns, "-o", "name"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        format!("namespace/{ns}")
    );
}

#[tokio::test]
async fn api_servers_sharing_one_etcd_see_only_their_own_objects() {
    if control_plane::require().is_none() {
        return;
    }
    let etcd = std::sync::Arc::new(Etcd::start().await.unwrap());
    let options = Options {
        etcd: Some(etcd.clone()),
        ..Options::default()
    };
    let (a, b) = tokio::join!(
        ControlPlane::start_with(options.clone()),
        ControlPlane::start_with(options)
    );
    let (a, b) = (a.unwrap(), b.unwrap());
    let cm: ConfigMap = serde_json::from_value(json!({
        "metadata": {"name": "only-in-a"}, "data": {"k": "v"}
    }))
    .unwrap();
    Api::<ConfigMap>::namespaced(a.client().await.unwrap(), "default")
        .create(&PostParams::default(), &cm)
        .await
        .unwrap();
    let in_b = Api::<ConfigMap>::namespaced(b.client().await.unwrap(), "default")
        .get_opt("only-in-a")
        .await
        .unwrap();
    assert!(in_b.is_none());
    let footprint = Footprint::of(&a);
    drop((a, b));
    // The etcd lives on while shared.
    assert!(std::net::TcpStream::connect(("127.0.0.1", etcd.ports()[0])).is_ok());
    drop(etcd);
    footprint.assert_gone_within(Duration::from_secs(10));
}

#[tokio::test]
async fn controllers_roll_out_deployments_and_collect_garbage() {
    if control_plane::require().is_none() {
        return;
    }
    let cp = ControlPlane::start_with(Options {
        controller_manager: true,
        ..Options::default()
    })
    .await
    .unwrap();
    let ns = cp.namespace("controllers").await.unwrap();
    let client = cp.client().await.unwrap();
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), &ns);
    let deployment: Deployment = serde_json::from_value(json!({
        "metadata": {"name": "web"},
        "spec": {
            "replicas": 2,
            "selector": {"matchLabels": {"app": "web"}},
            "template": {
                "metadata": {"labels": {"app": "web"}},
                "spec": {"containers": [{"name": "web", "image": "web:1"}]}
            }
        }
    }))
    .unwrap();
    deployments
        .create(&PostParams::default(), &deployment)
        .await
        .unwrap();
    let replicasets: Api<ReplicaSet> = Api::namespaced(client.clone(), &ns);
    let pods: Api<k8s_openapi::api::core::v1::Pod> = Api::namespaced(client.clone(), &ns);
    eventually("a ReplicaSet with two pods", BUDGET, async || {
        listed(&replicasets, &pods, (1, 2)).await
    })
    .await;

    // The garbage collector removes the ReplicaSet and its pods with the Deployment.
    deployments
        .delete("web", &DeleteParams::background())
        .await
        .unwrap();
    eventually("the ReplicaSet and pods collected", BUDGET, async || {
        listed(&replicasets, &pods, (0, 0)).await
    })
    .await;
}

/// How long the controllers get to converge.
const BUDGET: Duration = Duration::from_secs(60);

/// `Ok` once `sets` and `pods` list `want` (ReplicaSets, pods), else what they list.
async fn listed(
    sets: &Api<ReplicaSet>,
    pods: &Api<k8s_openapi::api::core::v1::Pod>,
    want: (usize, usize),
) -> Result<(), String> {
    let seen = (
        sets.list(&ListParams::default()).await.unwrap().items.len(),
        pods.list(&ListParams::default()).await.unwrap().items.len(),
    );
    if seen == want {
        Ok(())
    } else {
        Err(format!("{} ReplicaSets, {} pods", seen.0, seen.1))
    }
}

#[tokio::test]
async fn nothing_is_left_after_drop() {
    if control_plane::require().is_none() {
        return;
    }
    let cp = ControlPlane::start_with(Options {
        controller_manager: true,
        ..Options::default()
    })
    .await
    .unwrap();
    let footprint = Footprint::of(&cp);
    assert!(footprint.left().len() >= 6, "{footprint:?}");
    drop(cp);
    footprint.assert_gone_within(Duration::from_secs(10));
}

#[test]
fn nothing_is_left_when_a_test_panics() {
    if control_plane::require().is_none() {
        return;
    }
    let (tx, rx) = std::sync::mpsc::channel();
    let joined = std::thread::spawn(move || {
        let rt = tokio::runtime::Runtime::new().unwrap();
        rt.block_on(async move {
            let cp = ControlPlane::start().await.unwrap();
            tx.send(Footprint::of(&cp)).unwrap();
            panic!("a failing test");
        })
    })
    .join();
    assert!(joined.is_err(), "the thread must have panicked");
    let footprint = rx.recv().unwrap();
    footprint.assert_gone_within(Duration::from_secs(10));
}

/// Set in the child process of [`nothing_is_left_when_the_test_process_dies`]: where the child
/// writes its footprint before it aborts.
const CHILD_REPORT: &str = "SLUICE_CONTROL_PLANE_CHILD_REPORT";

#[test]
fn nothing_is_left_when_the_test_process_dies() {
    if control_plane::require().is_none() {
        return;
    }
    let report = tempfile::NamedTempFile::new().unwrap();
    let status = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "dying_child_process",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_REPORT, report.path())
        .status()
        .unwrap();
    assert!(!status.success(), "the child must die by abort");
    let footprint: Footprint =
        serde_json::from_str(&std::fs::read_to_string(report.path()).unwrap())
            .expect("the child wrote its footprint before dying");
    assert!(footprint.pids.len() >= 4, "{footprint:?}");
    footprint.assert_gone_within(Duration::from_secs(15));
}

/// Run only as the child of [`nothing_is_left_when_the_test_process_dies`]: starts a shared
/// control plane with the controller manager (a static, never dropped), reports what it started
/// and aborts, so no destructor runs.
#[tokio::test]
#[ignore = "the child process of nothing_is_left_when_the_test_process_dies"]
async fn dying_child_process() {
    let Some(path) = std::env::var_os(CHILD_REPORT) else {
        return;
    };
    let cp = control_plane::shared_with_controllers().await.unwrap();
    let footprint = Footprint::of(cp);
    std::fs::write(Path::new(&path), serde_json::to_vec(&footprint).unwrap()).unwrap();
    std::process::abort();
}
