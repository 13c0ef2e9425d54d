//! Test prerequisites: the one place a test learns that something it needs is missing.
//!
//! A test that needs a binary (prometheus, docker-registry, git, helm, kubectl, kube-apiserver),
//! the released upstream CRDs or another tool asks here. When it is there, the test gets its path.
//! When it is missing:
//! - under CI (`CI=true`) or with `SLUICE_REQUIRE_ALL=1` (strict mode, which `.ci/run` and
//!   `scripts/test.sh` set) the test **fails**, naming what is missing and the command that
//!   installs it;
//! - otherwise (a developer's machine) the test is skipped: it prints `SKIPPED: ...` and the skip
//!   is recorded in `$SLUICE_SKIP_LOG` when set, so `scripts/test.sh` counts it as skipped, never
//!   as passed.
//!
//! Components that genuinely cannot run on the project's machines are named once, in
//! [`UNAVAILABLE`], with the reason; tests that need them are excluded by that name and reported
//! as not run ([`unavailable`]), never silently.
//!
//! This module never reads anything outside the repository: the upstream CRDs come from
//! `.tools/crds/`, where `scripts/install-tools.sh` puts them.

use std::fmt;
use std::io::Write;
use std::path::{Path, PathBuf};

/// The command that installs every tool and file the tests need.
pub const INSTALL_TOOLS: &str = "bash scripts/install-tools.sh";

/// Components that cannot be had on the project's machines, with the reason. A test that needs
/// one of them calls [`unavailable`] with its name and is reported as not run.
pub const UNAVAILABLE: &[(&str, &str)] = &[
    (
        "kind-cluster",
        "a kind cluster needs a container engine, which the project's machines do not run; \
         e2e/kind runs the same scenarios when KUBECONFIG points at a real cluster",
    ),
    (
        "argo-cd",
        "Argo CD needs a container runtime and its Redis/repo-server images; its behaviour is \
         simulated by sluice-argocd, checked against its source",
    ),
    (
        "istio",
        "istiod and Envoy need container images and a kubelet; the injector and the mesh \
         telemetry are simulated by sluice-sim, checked against their source",
    ),
    (
        "spire",
        "SPIRE's server and agents need a kubelet and node attestation; issuance is counted by \
         the simulator",
    ),
];

/// Whether a missing prerequisite fails the test (CI) instead of skipping it.
pub fn strict() -> bool {
    let on = |name: &str| {
        std::env::var(name)
            .map(|v| {
                let v = v.trim().to_ascii_lowercase();
                !(v.is_empty() || v == "0" || v == "false" || v == "no")
            })
            .unwrap_or(false)
    };
    on("CI") || on("SLUICE_REQUIRE_ALL")
}

/// The repository root (this crate lives at `testing/sluice-testkit`).
pub fn repo_root() -> PathBuf {
    let here = Path::new(env!("CARGO_MANIFEST_DIR"));
    here.join("../..")
        .canonicalize()
        .unwrap_or_else(|_| here.join("../.."))
}

/// `.tools/` at the repository root: what `scripts/install-tools.sh` installs.
pub fn tools_dir() -> PathBuf {
    repo_root().join(".tools")
}

/// A prerequisite that is not there: what it is and how to install it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Missing {
    /// What is missing, e.g. "the `prometheus` binary (not in .tools/bin or on PATH)".
    pub what: String,
    /// The command that installs it.
    pub install: String,
}

impl fmt::Display for Missing {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}; install it with `{}`", self.what, self.install)
    }
}

impl std::error::Error for Missing {}

impl Missing {
    /// A missing prerequisite with the command that installs it.
    pub fn new(what: impl Into<String>, install: impl Into<String>) -> Self {
        Self {
            what: what.into(),
            install: install.into(),
        }
    }

    /// Fails the calling test in strict mode; otherwise prints and records the skip. The caller
    /// returns right after (`let Some(x) = ... else { return };`).
    #[track_caller]
    pub fn skip(&self) {
        let test = current_test();
        if strict() {
            panic!(
                "missing prerequisite for {test}: {self} (CI=true / SLUICE_REQUIRE_ALL=1: a test \
                 never passes by skipping)"
            );
        }
        println!("SKIPPED: {test}: {self}");
        eprintln!("SKIPPED: {test}: {self}");
        record_skip(&test, &self.what);
    }
}

/// The test running on this thread (libtest names the thread after the test).
fn current_test() -> String {
    std::thread::current()
        .name()
        .filter(|n| *n != "main")
        .unwrap_or("<unnamed test>")
        .to_string()
}

/// Appends `<test>\t<what>` to `$SLUICE_SKIP_LOG` (one short `write` with O_APPEND, so lines of
/// parallel test processes do not interleave).
fn record_skip(test: &str, what: &str) {
    let Ok(path) = std::env::var("SLUICE_SKIP_LOG") else {
        return;
    };
    if path.is_empty() {
        return;
    }
    let line = format!(
        "{}\t{}\t{}\n",
        crate_name(),
        test,
        what.replace(['\n', '\t'], " ")
    );
    if let Ok(mut f) = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path)
    {
        let _ = f.write_all(line.as_bytes());
    }
}

/// The test binary's name without cargo's hash suffix, to tell apart tests of the same name in
/// different binaries.
fn crate_name() -> String {
    let stem = std::env::current_exe()
        .ok()
        .and_then(|p| p.file_stem().map(|s| s.to_string_lossy().into_owned()))
        .unwrap_or_default();
    match stem.rsplit_once('-') {
        Some((name, hash)) if hash.len() == 16 && hash.bytes().all(|b| b.is_ascii_hexdigit()) => {
            name.to_string()
        }
        _ => stem,
    }
}

/// `Some(value)` when present; otherwise skips (or fails in strict mode) and gives `None`.
#[track_caller]
pub fn or_skip<T>(found: Result<T, Missing>) -> Option<T> {
    match found {
        Ok(v) => Some(v),
        Err(missing) => {
            missing.skip();
            None
        }
    }
}

/// Where a binary is: `.tools/bin/<name>` first, then `PATH`. The error names the binary and
/// the command that installs it (`install`, or the install script when `None`).
pub fn binary(name: &str) -> Result<PathBuf, Missing> {
    binary_with(name, INSTALL_TOOLS)
}

/// [`binary`] with the command that installs this binary.
pub fn binary_with(name: &str, install: &str) -> Result<PathBuf, Missing> {
    let local = tools_dir().join("bin").join(name);
    if is_executable(&local) {
        return Ok(local);
    }
    if let Some(paths) = std::env::var_os("PATH") {
        for dir in std::env::split_paths(&paths) {
            let candidate = dir.join(name);
            if is_executable(&candidate) {
                return Ok(candidate);
            }
        }
    }
    Err(Missing::new(
        format!("the `{name}` binary (not in .tools/bin or on PATH)"),
        install,
    ))
}

/// The command that builds the `cosign` CLI (from its Go module, with the control plane).
pub const INSTALL_COSIGN: &str = "bash scripts/install-control-plane.sh";

/// The real `cosign` CLI (the signature interop tests sign with it), from `.tools/bin` or
/// `PATH`; the error names [`INSTALL_COSIGN`].
pub fn cosign() -> Result<PathBuf, Missing> {
    binary_with("cosign", INSTALL_COSIGN)
}

/// [`binary`], skipping (or failing in strict mode) when it is missing.
#[track_caller]
pub fn require_binary(name: &str) -> Option<PathBuf> {
    or_skip(binary(name))
}

fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path)
        .map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        .unwrap_or(false)
}

/// A set of released upstream CRDs, fetched at a pinned version by `scripts/install-tools.sh`
/// from the projects' Go modules into `.tools/crds/<dir>/`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Upstream {
    /// Gateway API v1.6.1, standard channel (`config/crd/standard/`): HTTPRoute, GRPCRoute, ...
    GatewayApi,
    /// Gateway API v1.2.1, standard channel: an older schema that prunes fields newer steps
    /// need (rule `name`, mirror `percent`/`fraction`).
    GatewayApiOld,
    /// Argo CD v3.5.1 (`manifests/crds/`): Application, ApplicationSet, AppProject.
    ArgoCd,
    /// Istio v1.28.0 (`istio.io/api` `kubernetes/customresourcedefinitions.gen.yaml`): every
    /// Istio CRD in one file.
    Istio,
}

impl Upstream {
    /// The folder under `.tools/crds/`.
    pub fn dir_name(self) -> &'static str {
        match self {
            Upstream::GatewayApi => "gateway-api-v1.6.1",
            Upstream::GatewayApiOld => "gateway-api-v1.2.1",
            Upstream::ArgoCd => "argo-cd-v3.5.1",
            Upstream::Istio => "istio-v1.28.0",
        }
    }
}

/// The root of the fetched upstream CRDs (`.tools/crds`).
pub fn upstream_root() -> PathBuf {
    tools_dir().join("crds")
}

/// The root of the upstream CRDs once every set is there: `<root>/gateway-api-v1.6.1/...`,
/// `<root>/gateway-api-v1.2.1/...`, `<root>/argo-cd-v3.5.1/...`, `<root>/istio-v1.28.0/...` (see
/// [`Upstream::dir_name`]).
pub fn upstream_crds() -> Result<PathBuf, Missing> {
    for set in [
        Upstream::GatewayApi,
        Upstream::GatewayApiOld,
        Upstream::ArgoCd,
        Upstream::Istio,
    ] {
        upstream_dir(set)?;
    }
    Ok(upstream_root())
}

/// The folder of one upstream CRD set, if the install script fetched it.
pub fn upstream_dir(set: Upstream) -> Result<PathBuf, Missing> {
    let dir = upstream_root().join(set.dir_name());
    // The install script writes `.complete` last, after every checksum matched.
    if dir.join(".complete").is_file() {
        Ok(dir)
    } else {
        Err(Missing::new(
            format!(
                "the released {} CRDs (expected under {})",
                set.dir_name(),
                dir.display()
            ),
            INSTALL_TOOLS,
        ))
    }
}

/// One file of an upstream CRD set, e.g.
/// `upstream_file(Upstream::GatewayApi, "gateway.networking.k8s.io_httproutes.yaml")`.
pub fn upstream_file(set: Upstream, file: &str) -> Result<PathBuf, Missing> {
    let path = upstream_dir(set)?.join(file);
    if path.is_file() {
        Ok(path)
    } else {
        Err(Missing::new(
            format!(
                "{} (not in the fetched {} set)",
                path.display(),
                set.dir_name()
            ),
            INSTALL_TOOLS,
        ))
    }
}

/// The released HTTPRoute CRD (Gateway API v1.6.1, standard channel).
pub fn httproute_crd() -> Result<PathBuf, Missing> {
    upstream_file(
        Upstream::GatewayApi,
        "gateway.networking.k8s.io_httproutes.yaml",
    )
}

/// The released GRPCRoute CRD (Gateway API v1.6.1, standard channel).
pub fn grpcroute_crd() -> Result<PathBuf, Missing> {
    upstream_file(
        Upstream::GatewayApi,
        "gateway.networking.k8s.io_grpcroutes.yaml",
    )
}

/// The released Application CRD (Argo CD v3.5.1).
pub fn application_crd() -> Result<PathBuf, Missing> {
    upstream_file(Upstream::ArgoCd, "application-crd.yaml")
}

/// The released ApplicationSet CRD (Argo CD v3.5.1).
pub fn applicationset_crd() -> Result<PathBuf, Missing> {
    upstream_file(Upstream::ArgoCd, "applicationset-crd.yaml")
}

/// The released AppProject CRD (Argo CD v3.5.1).
pub fn appproject_crd() -> Result<PathBuf, Missing> {
    upstream_file(Upstream::ArgoCd, "appproject-crd.yaml")
}

/// Istio's released CRDs (v1.28.0), every one in one multi-document file.
pub fn istio_crds() -> Result<PathBuf, Missing> {
    upstream_file(Upstream::Istio, "customresourcedefinitions.gen.yaml")
}

/// The released DestinationRule CRD (Istio v1.28.0) as YAML: its document of [`istio_crds`].
pub fn destination_rule_crd() -> Result<String, Missing> {
    istio_crd("destinationrules.networking.istio.io")
}

/// One CRD of Istio's released file by its name (`<plural>.<group>`), as YAML.
pub fn istio_crd(name: &str) -> Result<String, Missing> {
    let path = istio_crds()?;
    let text = std::fs::read_to_string(&path).map_err(|e| {
        Missing::new(
            format!("{} (unreadable: {e})", path.display()),
            INSTALL_TOOLS,
        )
    })?;
    let wanted = format!("\n  name: {name}\n");
    text.split("\n---\n")
        .find(|doc| doc.contains("kind: CustomResourceDefinition") && doc.contains(&wanted))
        .map(|doc| format!("{}\n", doc.trim()))
        .ok_or_else(|| {
            Missing::new(
                format!("the CRD {name} in {}", path.display()),
                INSTALL_TOOLS,
            )
        })
}

/// Reports a test that needs a component of [`UNAVAILABLE`] as not run (printed and recorded in
/// `$SLUICE_NOT_RUN_LOG` when set). Panics on a name that is not in the list, so the list stays
/// the one place that says what cannot run here.
#[track_caller]
pub fn unavailable(component: &str) {
    let Some((_, reason)) = UNAVAILABLE.iter().find(|(name, _)| *name == component) else {
        panic!("`{component}` is not in prereq::UNAVAILABLE: add it there with the reason");
    };
    let test = current_test();
    println!("NOT RUN: {test}: needs {component}: {reason}");
    if let Ok(path) = std::env::var("SLUICE_NOT_RUN_LOG")
        && !path.is_empty()
        && let Ok(mut f) = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
    {
        let _ = f.write_all(format!("{}\t{test}\t{component}\n", crate_name()).as_bytes());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_binary_names_itself_and_the_install_command() {
        let err = binary("sluice-no-such-binary-xyz").unwrap_err();
        assert_eq!(
            err.to_string(),
            "the `sluice-no-such-binary-xyz` binary (not in .tools/bin or on PATH); install it \
             with `bash scripts/install-tools.sh`"
        );
    }

    #[test]
    fn a_binary_on_path_is_found() {
        // `sh` is on every machine the tests run on.
        assert!(binary("sh").unwrap().ends_with("sh"));
    }

    #[test]
    fn unavailable_names_a_reason_for_every_component() {
        for (name, reason) in UNAVAILABLE {
            assert!(!name.is_empty() && reason.len() > 20, "{name}: {reason}");
        }
    }

    #[test]
    #[should_panic(expected = "is not in prereq::UNAVAILABLE")]
    fn an_unlisted_unavailable_component_is_refused() {
        unavailable("something-else");
    }
}
