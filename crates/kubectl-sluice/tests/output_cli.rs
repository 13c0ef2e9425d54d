//! `kubectl sluice get|status -o json|yaml`, the CRDs' short names, the cluster-scoped kinds and
//! the shell completion scripts, against the Kubernetes API emulator with the generated CRDs.

mod common;

use common::{BUDGET, ok, run};
use serde_json::Value;

const OBJECTS: &str = r#"
apiVersion: v1
kind: Namespace
metadata: {name: argocd}
---
apiVersion: sluice.dev/v1alpha1
kind: WaveGate
metadata: {name: mesh-eu, namespace: argocd}
spec:
  site: eu-west
  applicationSetRef: {name: mesh-config}
  repository: oci://registry.local:5000/mesh/config
  revision: "sha256:bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb"
  waves:
    - {name: canary, clusters: [eu-1]}
  driftGate: {exporter: None}
  pin: {publicKeysSecretRef: {name: cosign}}
---
apiVersion: sluice.dev/v1alpha1
kind: RevisionUpgrade
metadata: {name: to-1-28}
spec: {fromTag: stable, fromRevision: "1-27", toTag: canary, toRevision: "1-28"}
---
apiVersion: sluice.dev/v1alpha1
kind: GateTemplate
metadata: {name: mesh-errors}
spec: {builtin: MeshErrorRatio, description: mesh 5xx ratio}
"#;

#[tokio::test]
async fn get_and_status_print_json_and_yaml_and_every_short_name_works() {
    tokio::time::timeout(BUDGET, async {
        let emu = common::emulator(false, OBJECTS).await;
        let dir = tempfile::tempdir().unwrap();
        let kc = common::admin_kubeconfig(&emu, dir.path(), "kubeconfig");

        // One object by name: the object itself, without managedFields.
        let out = ok(
            &kc,
            &["get", "swg", "mesh-eu", "-n", "argocd", "-o", "json"],
        )
        .await;
        let obj: Value = serde_json::from_str(&out).unwrap();
        assert_eq!(obj["kind"], "WaveGate");
        assert_eq!(obj["spec"]["site"], "eu-west");
        assert!(obj["metadata"].get("managedFields").is_none(), "{out}");
        assert!(obj["metadata"]["resourceVersion"].is_string(), "{out}");

        // The same in YAML reads back to the same object.
        let out = ok(
            &kc,
            &["get", "wavegate", "mesh-eu", "-n", "argocd", "-o", "yaml"],
        )
        .await;
        let yaml: Value = serde_saphyr::from_str(&out).unwrap();
        assert_eq!(yaml, obj, "{out}");

        // Several objects: a List, like kubectl's.
        let out = ok(&kc, &["get", "all", "-n", "argocd", "-o", "json"]).await;
        let list: Value = serde_json::from_str(&out).unwrap();
        assert_eq!(list["kind"], "List");
        let kinds: Vec<&str> = list["items"]
            .as_array()
            .unwrap()
            .iter()
            .map(|o| o["kind"].as_str().unwrap())
            .collect();
        assert_eq!(kinds, vec!["WaveGate", "RevisionUpgrade", "GateTemplate"]);
        let empty = ok(&kc, &["get", "srol", "-n", "argocd", "-o", "json"]).await;
        assert_eq!(
            serde_json::from_str::<Value>(&empty).unwrap()["items"],
            serde_json::json!([])
        );

        // status -o: the object, not the tree.
        let out = ok(&kc, &["status", "sru/to-1-28", "-o", "json"]).await;
        let ru: Value = serde_json::from_str(&out).unwrap();
        assert_eq!(ru["spec"]["toRevision"], "1-28");
        let out = ok(&kc, &["status", "sru", "to-1-28", "-o", "yaml"]).await;
        assert!(
            out.contains("toRevision: 1-28")
                || out.contains("toRevision: '1-28'")
                || out.contains("toRevision: \"1-28\""),
            "{out}"
        );

        // Every CRD short name, and GateTemplate is cluster-scoped (listed from any namespace).
        for (name, kind_header) in [
            ("sgt", "DEFINITION"),
            ("gt", "DEFINITION"),
            ("sru", "OLD"),
            ("swg", "SITE"),
            ("spin", "TO"),
            ("srollout", "VERDICTS"),
        ] {
            let (code, out, err) = run(&kc, &["get", name, "-n", "argocd"]).await;
            assert_eq!(code, 0, "get {name}: {err}");
            assert!(
                out.contains(kind_header) || out.starts_with("No "),
                "get {name}: {out}"
            );
        }
        let out = ok(&kc, &["get", "sgt", "-n", "some-namespace"]).await;
        assert!(
            out.contains("mesh-errors") && out.contains("MeshErrorRatio"),
            "{out}"
        );
        let out = ok(&kc, &["status", "sgt/mesh-errors"]).await;
        assert!(out.starts_with("GateTemplate mesh-errors\n"), "{out}");
        assert!(out.contains("builtin MeshErrorRatio"), "{out}");

        // A bad format is a usage error.
        let (code, _, err) = run(&kc, &["get", "swg", "-o", "wide"]).await;
        assert_eq!(code, 2, "{err}");
        assert!(err.contains("invalid value 'wide'"), "{err}");
        emu.shutdown().await;
    })
    .await
    .expect("the scenario did not finish within its time budget");
}

/// The bash script completes subcommands, flags and flag values; zsh and fish scripts are
/// generated for the same executable.
#[tokio::test]
async fn completion_scripts_complete_the_plugins_commands() {
    let exe = env!("CARGO_BIN_EXE_kubectl-sluice");
    let script = std::process::Command::new(exe)
        .args(["completion", "bash"])
        .output()
        .unwrap();
    assert!(script.status.success());
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("kubectl-sluice.bash");
    std::fs::write(&path, &script.stdout).unwrap();
    let Some(bash) = sluice_testkit::prereq::require_binary("bash") else {
        return;
    };
    // (words typed, the candidates bash offers)
    let cases: [(&[&str], &str); 4] = [
        (&["kubectl-sluice", "wa"], "waves"),
        (&["kubectl-sluice", "get", "-o", ""], "json yaml"),
        (&["kubectl-sluice", "waves", "--con"], "--contexts"),
        (&["kubectl-sluice", "completion", "fi"], "fish"),
    ];
    for (words, want) in cases {
        let cword = words.len() - 1;
        let quoted: Vec<String> = words.iter().map(|w| format!("'{w}'")).collect();
        let program = format!(
            "source '{}'; COMP_WORDS=({}); COMP_CWORD={cword}; _kubectl__sluice kubectl-sluice '{}' '{}'; echo \"${{COMPREPLY[*]}}\"",
            path.display(),
            quoted.join(" "),
            words[cword],
            words[cword - 1],
        );
        let out = std::process::Command::new(&bash)
            .args(["-c", &program])
            .output()
            .unwrap();
        let got = String::from_utf8_lossy(&out.stdout);
        assert_eq!(
            got.trim(),
            want,
            "completing {words:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    for shell in ["zsh", "fish"] {
        let out = std::process::Command::new(exe)
            .args(["completion", shell])
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success() && text.contains("kubectl-sluice") && text.contains("waves"),
            "{shell}: {text}"
        );
    }
}

/// `kubectl sluice <TAB>`: kubectl (1.26+) asks the plugin's completion executable
/// `kubectl_complete-sluice`, here the documented one-line shim over `kubectl-sluice
/// __complete`, and passes on its candidates.
#[tokio::test]
async fn kubectl_completes_the_plugin_through_its_completion_executable() {
    let Some(kubectl) = sluice_testkit::prereq::require_binary("kubectl") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    std::os::unix::fs::symlink(
        env!("CARGO_BIN_EXE_kubectl-sluice"),
        dir.path().join("kubectl-sluice"),
    )
    .unwrap();
    let shim = dir.path().join("kubectl_complete-sluice");
    std::fs::write(&shim, "#!/bin/sh\nexec kubectl-sluice __complete \"$@\"\n").unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&shim, std::fs::Permissions::from_mode(0o755)).unwrap();
    let path = format!(
        "{}:{}",
        dir.path().display(),
        std::env::var("PATH").unwrap_or_default()
    );
    // (words after `kubectl sluice`, the candidates)
    let cases: [(&[&str], &[&str]); 4] = [
        (&["wa"], &["waves"]),
        (&["get", "-o", ""], &["json", "yaml"]),
        (&["get", "wave"], &["wavegates"]),
        (&["waves", "--req"], &["--request-timeout"]),
    ];
    for (words, want) in cases {
        let out = std::process::Command::new(&kubectl)
            .arg("__complete")
            .arg("sluice")
            .args(words)
            .env("PATH", &path)
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        let mut lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.pop(), Some(":4"), "directive for {words:?}: {text}");
        assert_eq!(
            lines,
            want,
            "kubectl __complete sluice {words:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}
