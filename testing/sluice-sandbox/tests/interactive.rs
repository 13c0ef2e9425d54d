//! Interactive mode: the sandbox prints `export KUBECONFIG=...`; real kubectl sees one context
//! per cluster and can list sluice objects and the checkout route; SIGTERM stops it with exit 0,
//! leaving no process, port or file behind. It starts the sandbox as the README does, on the API
//! emulator, whatever `SLUICE_E2E_CONTROL_PLANE` says.

mod common;

use std::path::PathBuf;
use std::process::Command;
use std::sync::OnceLock;
use std::time::Duration;

/// The kubectl the tests run (`.tools/bin` first, then PATH).
static KUBECTL: OnceLock<PathBuf> = OnceLock::new();

const START_BUDGET: Duration = Duration::from_secs(90);
const STOP_BUDGET: Duration = Duration::from_secs(25);

fn kubectl(kubeconfig: &str, args: &[&str]) -> (bool, String) {
    let out = Command::new(KUBECTL.get().expect("kubectl found"))
        .args(args)
        .args(["--request-timeout=10s"])
        .env("KUBECONFIG", kubeconfig)
        .output()
        .expect("kubectl runs");
    (
        out.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

#[test]
fn kubectl_sees_every_cluster_and_sigterm_stops_everything() {
    if !common::prerequisites() {
        return;
    }
    let Some(bin) = sluice_testkit::prereq::require_binary("kubectl") else {
        return;
    };
    KUBECTL.set(bin).unwrap();
    let mut run = common::start(&["--base-port", "0"]);
    let export = run.wait_line(START_BUDGET, |l| l.starts_with("export KUBECONFIG="));
    let kubeconfig = export.trim_start_matches("export KUBECONFIG=").to_string();

    let (ok, contexts) = kubectl(&kubeconfig, &["config", "get-contexts", "-o", "name"]);
    assert!(ok, "{contexts}");
    let mut names: Vec<&str> = contexts
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect();
    names.sort();
    assert_eq!(
        names,
        [
            "east-1",
            "east-2",
            "east-mgmt",
            "west-1",
            "west-2",
            "west-mgmt"
        ]
    );

    // Real kubectl refuses `-w` on a category (`get sluice -A -w`: "you may only specify a single
    // resource type"), so the sandbox tells users to watch one kind; that watch keeps running (it
    // would exit at once on an API error).
    let mut watch = Command::new(KUBECTL.get().expect("kubectl found"))
        .args(["--context", "east-1", "get", "rollouts", "-A", "-w"])
        .env("KUBECONFIG", &kubeconfig)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("kubectl runs");
    std::thread::sleep(Duration::from_secs(3));
    let early = watch.try_wait().unwrap();
    let _ = watch.kill();
    let out = watch.wait_with_output().unwrap();
    assert!(
        early.is_none(),
        "kubectl get rollouts -A -w exited early ({early:?}): {}",
        String::from_utf8_lossy(&out.stderr)
    );

    for context in ["east-1", "west-mgmt"] {
        let (ok, out) = kubectl(&kubeconfig, &["--context", context, "get", "sluice", "-A"]);
        assert!(ok, "kubectl get sluice -A in {context}: {out}");
    }
    let (ok, out) = kubectl(
        &kubeconfig,
        &[
            "--context",
            "west-2",
            "get",
            "httproutes",
            "-n",
            "shop",
            "-o",
            "name",
        ],
    );
    assert!(
        ok && out.contains("httproute.gateway.networking.k8s.io/checkout"),
        "{out}"
    );
    let (ok, out) = kubectl(
        &kubeconfig,
        &[
            "--context",
            "east-mgmt",
            "get",
            "configmap",
            "sluice-wavegate-decisions",
            "-n",
            "argocd",
            "-o",
            "jsonpath={.data.kind}",
        ],
    );
    assert!(ok && out.trim() == "wavegates", "{out}");
    let (ok, out) = kubectl(
        &kubeconfig,
        &[
            "--context",
            "west-mgmt",
            "get",
            "secrets",
            "-n",
            "argocd",
            "-l",
            "argocd.argoproj.io/secret-type=cluster",
            "-o",
            "jsonpath={.items[*].metadata.name}",
        ],
    );
    assert!(ok, "{out}");
    let mut secrets: Vec<&str> = out.split_whitespace().collect();
    secrets.sort();
    assert_eq!(
        secrets,
        ["cluster-west-1", "cluster-west-2"],
        "Argo CD's cluster Secrets in west-mgmt"
    );

    // The operators run where the chart puts them and keep running (the sandbox warns within
    // 2 s when one exits).
    run.read_for(Duration::from_secs(4));
    let exited: Vec<&String> = run
        .seen
        .iter()
        .filter(|l| l.contains(" exited ("))
        .collect();
    assert!(
        exited.is_empty(),
        "operators exited on their own: {exited:?}"
    );
    if run
        .seen
        .iter()
        .any(|l| l.contains("sluice-rollout-weights started"))
    {
        assert!(
            run.descendants.len() >= 14,
            "expected Prometheus, the registry and 12 operator processes, saw {}",
            run.descendants.len()
        );
    }

    let status = Command::new("kill")
        .args(["-TERM", &run.child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let status = run.wait_exit(STOP_BUDGET);
    assert!(status.success(), "exit after SIGTERM: {status:?}");
    let left = run.leftovers();
    assert!(left.is_empty(), "processes left behind: {left:?}");
    let open = run.open_ports(&run.printed_ports());
    assert!(
        open.is_empty(),
        "ports still listening after exit: {open:?}"
    );
    assert!(
        !std::path::Path::new(&kubeconfig).exists(),
        "kubeconfig {kubeconfig} (in the work directory) was not removed"
    );
}
