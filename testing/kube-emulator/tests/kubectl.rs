//! Drives the real `kubectl` against an emulator: apply a CRD and objects, get -o json, patch,
//! server-side apply with a conflict and with force, explain a field, delete. Skips (saying why)
//! when kubectl is not installed.

use std::path::Path;
use std::time::Duration;

use kube_emulator::Emulator;
use serde_json::Value;

const CRD: &str = r#"
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: widgets.test.sluice.dev
spec:
  group: test.sluice.dev
  scope: Namespaced
  names: {plural: widgets, singular: widget, kind: Widget, shortNames: [wg]}
  versions:
  - name: v1
    served: true
    storage: true
    subresources: {status: {}}
    additionalPrinterColumns:
    - {name: Replicas, type: integer, jsonPath: .spec.replicas}
    schema:
      openAPIV3Schema:
        type: object
        description: A widget used by the kubectl conformance test.
        properties:
          spec:
            type: object
            description: Desired state of the widget.
            properties:
              replicas:
                type: integer
                minimum: 0
                description: Number of widget replicas; defaults to 1.
              hosts: {type: array, items: {type: string}}
"#;

const WIDGET: &str = r#"
apiVersion: test.sluice.dev/v1
kind: Widget
metadata: {name: w1, namespace: default}
spec: {replicas: 2, hosts: [a.example]}
"#;

struct Kubectl {
    bin: std::path::PathBuf,
    kubeconfig: std::path::PathBuf,
    cache: std::path::PathBuf,
}

struct Out {
    ok: bool,
    stdout: String,
    stderr: String,
}

impl Kubectl {
    async fn run(&self, args: &[&str], stdin: Option<&str>) -> Out {
        use tokio::io::AsyncWriteExt;
        let mut cmd = tokio::process::Command::new(&self.bin);
        cmd.env("KUBECONFIG", &self.kubeconfig)
            .arg("--cache-dir")
            .arg(&self.cache)
            .arg("--request-timeout=10s")
            .args(args)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .kill_on_drop(true);
        let mut child = cmd.spawn().expect("kubectl runs");
        let mut pipe = child.stdin.take().expect("stdin");
        if let Some(input) = stdin {
            pipe.write_all(input.as_bytes()).await.expect("write stdin");
        }
        drop(pipe);
        let out = tokio::time::timeout(Duration::from_secs(60), child.wait_with_output())
            .await
            .expect("kubectl finished within a minute")
            .expect("kubectl output");
        let o = Out {
            ok: out.status.success(),
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        };
        println!("$ kubectl {}\n{}{}", args.join(" "), o.stdout, o.stderr);
        o
    }
}

/// The kubectl the tests run (`.tools/bin` first, then PATH); when missing the test fails under
/// CI and is skipped and counted otherwise.
fn kubectl_binary() -> Option<std::path::PathBuf> {
    sluice_testkit::prereq::require_binary("kubectl")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_applies_gets_patches_explains_and_deletes() {
    let Some(bin) = kubectl_binary() else {
        return;
    };
    let emu = Emulator::start().await;
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    emu.write_kubeconfig(&kubeconfig).unwrap();
    let k = Kubectl {
        bin,
        kubeconfig,
        cache: dir.path().join("cache"),
    };
    assert!(Path::new(&k.kubeconfig).exists());

    let o = k.run(&["apply", "-f", "-"], Some(CRD)).await;
    assert!(o.ok, "{}", o.stderr);
    assert!(
        o.stdout.contains(
            "customresourcedefinition.apiextensions.k8s.io/widgets.test.sluice.dev created"
        )
    );

    let o = k.run(&["apply", "-f", "-"], Some(WIDGET)).await;
    assert!(o.ok, "{}", o.stderr);
    assert!(o.stdout.contains("widget.test.sluice.dev/w1 created"));

    let o = k.run(&["get", "widgets", "w1", "-o", "json"], None).await;
    assert!(o.ok, "{}", o.stderr);
    let w: Value = serde_json::from_str(&o.stdout).unwrap();
    assert_eq!(w["spec"]["replicas"], 2);
    assert_eq!(w["kind"], "Widget");

    let o = k.run(&["get", "wg"], None).await;
    assert!(
        o.ok && o.stdout.contains("REPLICAS") && o.stdout.contains("w1"),
        "{}",
        o.stdout
    );

    let o = k
        .run(
            &[
                "patch",
                "widget",
                "w1",
                "--type",
                "merge",
                "-p",
                r#"{"spec":{"replicas":3}}"#,
            ],
            None,
        )
        .await;
    assert!(o.ok, "{}", o.stderr);

    let ssa = "apiVersion: test.sluice.dev/v1\nkind: Widget\nmetadata: {name: w1, namespace: default}\nspec: {replicas: 5}\n";
    let o = k
        .run(
            &[
                "apply",
                "--server-side",
                "--field-manager=tool-a",
                "-f",
                "-",
            ],
            Some(ssa),
        )
        .await;
    assert!(!o.ok, "a conflicting server-side apply must fail");
    assert!(
        o.stderr
            .contains("Apply failed with 1 conflict: conflict with \"kubectl-patch\"")
            && o.stderr.contains(".spec.replicas"),
        "{}",
        o.stderr
    );
    let o = k
        .run(
            &[
                "apply",
                "--server-side",
                "--field-manager=tool-a",
                "--force-conflicts",
                "-f",
                "-",
            ],
            Some(ssa),
        )
        .await;
    assert!(o.ok, "{}", o.stderr);
    let o = k
        .run(
            &["get", "widget", "w1", "-o", "jsonpath={.spec.replicas}"],
            None,
        )
        .await;
    assert_eq!(o.stdout.trim(), "5");

    let o = k.run(&["explain", "widgets.spec.replicas"], None).await;
    assert!(o.ok, "{}", o.stderr);
    assert!(
        o.stdout
            .contains("Number of widget replicas; defaults to 1."),
        "{}",
        o.stdout
    );

    let o = k.run(&["delete", "widget", "w1"], None).await;
    assert!(
        o.ok && o.stdout.contains("widget.test.sluice.dev \"w1\" deleted"),
        "{}",
        o.stdout
    );
    let o = k.run(&["get", "widget", "w1"], None).await;
    assert!(
        !o.ok
            && o.stderr
                .contains("widgets.test.sluice.dev \"w1\" not found"),
        "{}",
        o.stderr
    );
}
