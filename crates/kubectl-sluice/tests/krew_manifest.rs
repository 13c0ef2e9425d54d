//! The krew manifest the release process makes with scripts/krew-manifest.sh: every platform
//! krew selects on, each archive's URI and the sha256 of its bytes, krew's required fields, and
//! clear refusals of a missing archive or a version krew would reject.

use std::path::Path;
use std::process::Command;

use serde_json::Value;

fn script() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/krew-manifest.sh")
}

/// Packs an archive holding an executable `kubectl-sluice` (its bytes differ per platform).
fn pack(dist: &Path, version: &str, os: &str, arch: &str) {
    let stage = dist.join(format!("stage-{os}-{arch}"));
    std::fs::create_dir_all(&stage).unwrap();
    std::fs::write(
        stage.join("kubectl-sluice"),
        format!("#!/bin/sh\necho {os} {arch}\n"),
    )
    .unwrap();
    let archive = dist.join(format!("kubectl-sluice_{version}_{os}_{arch}.tar.gz"));
    let status = Command::new("tar")
        .arg("-czf")
        .arg(&archive)
        .arg("-C")
        .arg(&stage)
        .arg("kubectl-sluice")
        .status()
        .unwrap();
    assert!(status.success());
}

fn sha256(path: &Path) -> String {
    let out = Command::new("sha256sum").arg(path).output().unwrap();
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .next()
        .unwrap()
        .to_string()
}

fn run(args: &[&str]) -> (i32, String, String) {
    let out = Command::new("bash")
        .arg(script())
        .args(args)
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn the_release_manifest_names_every_platform_with_its_archives_sha256() {
    let dir = tempfile::tempdir().unwrap();
    let dist = dir.path();
    let platforms = [
        ("linux", "amd64"),
        ("linux", "arm64"),
        ("darwin", "amd64"),
        ("darwin", "arm64"),
    ];
    for (os, arch) in platforms {
        pack(dist, "v0.2.0", os, arch);
    }
    let base = "https://releases.example.org/sluice/v0.2.0";
    let (code, out, err) = run(&["v0.2.0", base, dist.to_str().unwrap()]);
    assert_eq!(code, 0, "{err}");
    let manifest: Value = serde_saphyr::from_str(&out).unwrap_or_else(|e| panic!("{e}\n{out}"));
    assert_eq!(
        manifest["apiVersion"],
        "krew.googlecontainertools.github.com/v1alpha2"
    );
    assert_eq!(manifest["kind"], "Plugin");
    assert_eq!(manifest["metadata"]["name"], "sluice");
    let spec = &manifest["spec"];
    assert_eq!(spec["version"], "v0.2.0");
    assert_eq!(spec["homepage"], base);
    assert!(spec["shortDescription"].as_str().unwrap().len() <= 255);
    let got = spec["platforms"].as_array().unwrap();
    assert_eq!(got.len(), platforms.len());
    for ((os, arch), p) in platforms.iter().zip(got) {
        let archive = format!("kubectl-sluice_v0.2.0_{os}_{arch}.tar.gz");
        assert_eq!(p["selector"]["matchLabels"]["os"], *os);
        assert_eq!(p["selector"]["matchLabels"]["arch"], *arch);
        assert_eq!(p["uri"], format!("{base}/{archive}"));
        assert_eq!(p["sha256"], sha256(&dist.join(&archive)), "{os}/{arch}");
        assert_eq!(p["bin"], "kubectl-sluice");
        assert_eq!(p["files"][0]["from"], "kubectl-sluice");
    }
    let shas: std::collections::BTreeSet<&str> =
        got.iter().map(|p| p["sha256"].as_str().unwrap()).collect();
    assert_eq!(
        shas.len(),
        platforms.len(),
        "each platform has its own archive"
    );
    for placeholder in ["@VERSION@", "@HOMEPAGE@", "@PLATFORMS@"] {
        assert!(
            !out.contains(placeholder),
            "{placeholder} is filled:\n{out}"
        );
    }

    // Refusals: an archive missing, a version krew rejects, plain http.
    std::fs::remove_file(dist.join("kubectl-sluice_v0.2.0_darwin_arm64.tar.gz")).unwrap();
    let (code, _, err) = run(&["v0.2.0", base, dist.to_str().unwrap()]);
    assert_eq!(code, 1);
    assert!(
        err.contains("kubectl-sluice_v0.2.0_darwin_arm64.tar.gz is missing"),
        "{err}"
    );
    let (code, _, err) = run(&["0.2.0", base, dist.to_str().unwrap()]);
    assert_eq!(code, 1);
    assert!(
        err.contains("krew needs a v-prefixed semantic version"),
        "{err}"
    );
    let (code, _, err) = run(&["v0.2.0", "http://x", dist.to_str().unwrap()]);
    assert_eq!(code, 1);
    assert!(err.contains("is not https://"), "{err}");
}
