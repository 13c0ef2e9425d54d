//! What ships is built from `crates/` and `operators/` alone: no shipped package depends, as a
//! normal or build dependency, on a package of the test world (`testing/`, `e2e/`). Read from
//! `cargo metadata`, so a new dependency edge or a new crate placed on the wrong side fails here.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

/// The binaries the image and the kubectl plugin release are built from.
const SHIPPED_BINARIES: [&str; 5] = [
    "sluice-rollout-weights",
    "sluice-wave-gate",
    "sluice-revert",
    "sluice-upgrade-revisions",
    "kubectl-sluice",
];

/// Which side of the layout a workspace package stands on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Side {
    /// `crates/` and `operators/`: built into the image or the plugin.
    Shipped,
    /// `testing/` and `e2e/`: emulators, simulators, fixtures, the sandbox and the suites.
    TestWorld,
}

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .expect("repository root")
}

fn metadata() -> Value {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = Command::new(cargo)
        .args(["metadata", "--format-version", "1"])
        .current_dir(root())
        .output()
        .expect("run cargo metadata");
    assert!(
        out.status.success(),
        "cargo metadata failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("cargo metadata prints JSON")
}

/// Workspace packages by id: (name, path relative to the root, side).
fn workspace(meta: &Value, root: &Path) -> BTreeMap<String, (String, String, Side)> {
    let members: Vec<&str> = meta["workspace_members"]
        .as_array()
        .expect("workspace_members")
        .iter()
        .filter_map(Value::as_str)
        .collect();
    let mut out = BTreeMap::new();
    for pkg in meta["packages"].as_array().expect("packages") {
        let id = pkg["id"].as_str().expect("package id");
        if !members.contains(&id) {
            continue;
        }
        let name = pkg["name"].as_str().expect("package name").to_string();
        let manifest = Path::new(pkg["manifest_path"].as_str().expect("manifest_path"));
        let dir = manifest
            .parent()
            .expect("manifest dir")
            .strip_prefix(root)
            .expect("member inside the repository")
            .to_string_lossy()
            .into_owned();
        let side = match dir.split('/').next() {
            Some("crates" | "operators") => Side::Shipped,
            Some("testing" | "e2e") => Side::TestWorld,
            _ => panic!(
                "workspace member {name} at {dir}/ is neither shipped (crates/, operators/) nor test \
                 world (testing/, e2e/): place it on one side"
            ),
        };
        out.insert(id.to_string(), (name, dir, side));
    }
    out
}

#[test]
fn no_shipped_package_depends_on_the_test_world() {
    let root = root();
    let meta = metadata();
    let members = workspace(&meta, &root);

    for bin in SHIPPED_BINARIES {
        assert!(
            members
                .values()
                .any(|(name, _, side)| name == bin && *side == Side::Shipped),
            "the shipped binary {bin} is not a package under crates/ or operators/"
        );
    }

    let mut wrong = Vec::new();
    for node in meta["resolve"]["nodes"].as_array().expect("resolve.nodes") {
        let Some((from, from_dir, Side::Shipped)) = members.get(node["id"].as_str().unwrap_or(""))
        else {
            continue;
        };
        for dep in node["deps"].as_array().into_iter().flatten() {
            let Some((to, to_dir, Side::TestWorld)) =
                members.get(dep["pkg"].as_str().unwrap_or(""))
            else {
                continue;
            };
            let shipped_kind = dep["dep_kinds"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|k| k["kind"].as_str() != Some("dev"));
            if shipped_kind {
                wrong.push(format!(
                    "{from} ({from_dir}) depends on {to} ({to_dir}) outside [dev-dependencies]"
                ));
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "shipped packages depend on the test world (make it a dev-dependency, or move the code \
         into a shipped crate):\n{}",
        wrong.join("\n")
    );
}

#[test]
fn the_test_world_is_where_the_emulators_and_simulators_are() {
    let root = root();
    let meta = metadata();
    let members = workspace(&meta, &root);
    for name in [
        "kube-emulator",
        "sluice-sim",
        "sluice-argocd",
        "sluice-testkit",
        "sluice-sandbox",
    ] {
        let side = members
            .values()
            .find(|(n, _, _)| n == name)
            .map(|(_, _, side)| *side);
        assert_eq!(
            side,
            Some(Side::TestWorld),
            "{name} must be a workspace member under testing/"
        );
    }
}
