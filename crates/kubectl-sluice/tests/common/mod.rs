//! What the CLI tests share: the Kubernetes API emulator started with the generated sluice
//! CRDs, an admin kubeconfig for it, the sluice kinds' dynamic APIs and the plugin binary run
//! against a kubeconfig; for the bundle tests, a one-route manifest and paths as arguments.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::time::Duration;

use kube::api::{Api, DynamicObject};
use kube::core::{ApiResource, GroupVersionKind};
use kube_emulator::{Emulator, Options};

/// Every scenario stops by itself within this budget.
pub const BUDGET: Duration = Duration::from_secs(60);

/// The generated CRD files under `crds/`, in name order.
pub fn crds() -> Vec<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../crds");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}: run crdgen", dir.display()))
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "yaml"))
        .collect();
    files.sort();
    files
}

/// An emulator serving the sluice CRDs (with RBAC enforced when `rbac`), holding `objects`.
pub async fn emulator(rbac: bool, objects: &str) -> Emulator {
    let emu = Emulator::start_with(Options {
        rbac,
        manifests: crds(),
        ..Options::default()
    })
    .await
    .expect("emulator starts with the sluice CRDs");
    emu.load_yaml(objects).expect("fixture objects are valid");
    emu
}

/// Writes the emulator's admin kubeconfig as `dir/file`; returns its path.
pub fn admin_kubeconfig(emu: &Emulator, dir: &Path, file: &str) -> PathBuf {
    let path = dir.join(file);
    emu.write_kubeconfig(&path).unwrap();
    path
}

/// The dynamic API of a sluice kind, namespaced or across all namespaces.
pub fn sluice_api(
    emu: &Emulator,
    kind: &str,
    plural: &str,
    namespace: Option<&str>,
) -> Api<DynamicObject> {
    let ar = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("sluice.dev", "v1alpha1", kind),
        plural,
    );
    match namespace {
        Some(ns) => Api::namespaced_with(emu.client(), ns, &ar),
        None => Api::all_with(emu.client(), &ar),
    }
}

/// Runs the plugin with a kubeconfig; returns (exit code, stdout, stderr).
pub async fn run(kubeconfig: &Path, args: &[&str]) -> (i32, String, String) {
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_kubectl-sluice"))
        .args(args)
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .env_remove("KUBECONFIG")
        .kill_on_drop(true)
        .output()
        .await
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Runs the plugin and asserts it succeeds; returns its stdout.
pub async fn ok(kubeconfig: &Path, args: &[&str]) -> String {
    let (code, out, err) = run(kubeconfig, args).await;
    assert_eq!(code, 0, "kubectl sluice {args:?} failed: {err}{out}");
    out
}

/// A manifest of one HTTPRoute, for the bundle commands.
pub const ROUTE: &str = "\
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata:
  name: checkout
  namespace: shop
spec:
  rules:
  - backendRefs:
    - name: checkout-v1
      weight: 100
";

/// `path` as a command-line argument.
pub fn p(path: &Path) -> &str {
    path.to_str().unwrap()
}
