//! `kubectl sluice` object commands against the Kubernetes API emulator with RBAC enforced and
//! the generated sluice CRDs: each control command writes exactly its spec control fields,
//! `get`/`status [--watch]` print the tree, and a missing object, a wrong kind and a forbidden
//! action fail with a clear message and exit code.

mod common;

use std::path::{Path, PathBuf};
use std::time::Duration;

use common::BUDGET;
use kube::api::{Api, DynamicObject, Patch, PatchParams};
use kube_emulator::Emulator;
use serde_json::{Value, json};

struct Fixture {
    emu: Emulator,
    dir: tempfile::TempDir,
    admin: PathBuf,
}

fn digest(c: char) -> String {
    format!("sha256:{}", c.to_string().repeat(64))
}

const OBJECTS: &str = r#"
apiVersion: v1
kind: Namespace
metadata: {name: shop}
---
apiVersion: v1
kind: Namespace
metadata: {name: argocd}
---
apiVersion: sluice.dev/v1alpha1
kind: Rollout
metadata: {name: checkout, namespace: shop}
spec:
  routeRef: {name: checkout}
  stableService: {name: checkout-v1}
  canaryService: {name: checkout-v2}
  canaryWorkload: {name: checkout-v2}
  steps:
    - headerCohort: {header: {name: x-cohort, value: staff}}
    - setWeight: {weight: 5}
    - setWeight: {weight: 25}
    - pause: {untilPromoted: true}
    - setWeight: {weight: 50}
---
apiVersion: sluice.dev/v1alpha1
kind: WaveGate
metadata: {name: checkout, namespace: shop}
spec:
  site: eu-west
  applicationSetRef: {name: mesh-config}
  repository: oci://registry.local:5000/mesh/config
  revision: "sha256:aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
  waves:
    - {name: canary, clusters: [eu-1]}
    - {name: rest, clusters: [eu-2, eu-3]}
  driftGate: {exporter: None}
  pin: {publicKeysSecretRef: {name: cosign}}
---
apiVersion: sluice.dev/v1alpha1
kind: RevisionUpgrade
metadata: {name: to-1-28}
spec: {fromTag: stable, fromRevision: "1-27", toTag: canary, toRevision: "1-28"}
"#;

impl Fixture {
    async fn start() -> Fixture {
        let emu = common::emulator(true, OBJECTS).await;
        let dir = tempfile::tempdir().unwrap();
        let admin = common::admin_kubeconfig(&emu, dir.path(), "admin.kubeconfig");
        Fixture { emu, dir, admin }
    }

    fn api(&self, kind: &str, plural: &str, namespace: Option<&str>) -> Api<DynamicObject> {
        common::sluice_api(&self.emu, kind, plural, namespace)
    }

    async fn set_status(
        &self,
        kind: &str,
        plural: &str,
        namespace: Option<&str>,
        name: &str,
        status: Value,
    ) {
        self.api(kind, plural, namespace)
            .patch_status(
                name,
                &PatchParams::default(),
                &Patch::Merge(json!({"status": status})),
            )
            .await
            .unwrap_or_else(|e| panic!("status of {kind} {name}: {e}"));
    }

    async fn spec(&self, kind: &str, plural: &str, namespace: Option<&str>, name: &str) -> Value {
        let obj = self.api(kind, plural, namespace).get(name).await.unwrap();
        obj.data["spec"].clone()
    }

    /// Runs the plugin with a kubeconfig; returns (exit code, stdout, stderr).
    async fn run(&self, kubeconfig: &Path, args: &[&str]) -> (i32, String, String) {
        common::run(kubeconfig, args).await
    }

    async fn ok(&self, args: &[&str]) -> String {
        common::ok(&self.admin, args).await
    }
}

async fn within_budget<F: std::future::Future<Output = ()>>(f: F) {
    tokio::time::timeout(BUDGET, f)
        .await
        .expect("the scenario did not finish within its time budget");
}

#[tokio::test]
async fn rollout_controls_write_their_spec_fields() {
    within_budget(async {
        let fx = Fixture::start().await;
        let ns = Some("shop");
        fx.set_status(
            "Rollout",
            "rollouts",
            ns,
            "checkout",
            json!({"phase": "Paused", "currentStepIndex": 3}),
        )
        .await;

        let out = fx.ok(&["promote", "checkout", "-n", "shop"]).await;
        assert!(
            out.contains("Rollout checkout: promote requested (spec.promoteThroughStep=3)"),
            "{out}"
        );
        assert_eq!(
            fx.spec("Rollout", "rollouts", ns, "checkout").await["promoteThroughStep"],
            3
        );

        // Asking again for the same step is refused: nothing new to promote.
        let (code, _, err) = fx
            .run(&fx.admin, &["promote", "checkout", "-n", "shop"])
            .await;
        assert_eq!(code, 3, "{err}");
        assert!(err.contains("already promoted through step 3"), "{err}");

        fx.ok(&["promote", "--full", "rollout/checkout", "-n", "shop"])
            .await;
        assert_eq!(
            fx.spec("Rollout", "rollouts", ns, "checkout").await["promoteFull"],
            true
        );

        fx.set_status(
            "Rollout",
            "rollouts",
            ns,
            "checkout",
            json!({"phase": "Progressing"}),
        )
        .await;
        fx.ok(&["pause", "checkout", "-n", "shop"]).await;
        assert_eq!(
            fx.spec("Rollout", "rollouts", ns, "checkout").await["paused"],
            true
        );
        fx.ok(&["resume", "checkout", "-n", "shop"]).await;
        assert_eq!(
            fx.spec("Rollout", "rollouts", ns, "checkout").await["paused"],
            false
        );

        fx.ok(&["abort", "checkout", "-n", "shop"]).await;
        assert_eq!(
            fx.spec("Rollout", "rollouts", ns, "checkout").await["abort"],
            true
        );

        fx.set_status(
            "Rollout",
            "rollouts",
            ns,
            "checkout",
            json!({"phase": "Aborted", "retriesHandled": 0}),
        )
        .await;
        fx.ok(&["retry", "checkout", "-n", "shop"]).await;
        let spec = fx.spec("Rollout", "rollouts", ns, "checkout").await;
        assert_eq!(
            (spec["abort"].clone(), spec["retry"].clone()),
            (json!(false), json!(1)),
            "{spec}"
        );
        assert!(
            spec.get("promoteThroughStep").is_none(),
            "retry clears the manual promotion: {spec}"
        );
        assert_eq!(spec["promoteFull"], false);
        // Only control fields changed: the steps are as written.
        assert_eq!(spec["steps"].as_array().unwrap().len(), 5);
        fx.emu.shutdown().await;
    })
    .await;
}

#[tokio::test]
async fn upgrade_controls_pin_and_unpin() {
    within_budget(async {
        let fx = Fixture::start().await;
        fx.set_status(
            "RevisionUpgrade",
            "revisionupgrades",
            None,
            "to-1-28",
            json!({"phase": "Progressing"}),
        )
        .await;
        fx.ok(&["pause", "ru/to-1-28"]).await;
        assert_eq!(
            fx.spec("RevisionUpgrade", "revisionupgrades", None, "to-1-28")
                .await["paused"],
            true
        );
        fx.ok(&["upgrade", "abort", "to-1-28"]).await;
        assert_eq!(
            fx.spec("RevisionUpgrade", "revisionupgrades", None, "to-1-28")
                .await["abort"],
            true
        );
        fx.set_status(
            "RevisionUpgrade",
            "revisionupgrades",
            None,
            "to-1-28",
            json!({"phase": "Aborted", "resumesHandled": 0}),
        )
        .await;
        fx.ok(&["upgrade", "resume", "to-1-28"]).await;
        let spec = fx
            .spec("RevisionUpgrade", "revisionupgrades", None, "to-1-28")
            .await;
        assert_eq!(
            (
                spec["abort"].clone(),
                spec["paused"].clone(),
                spec["resume"].clone()
            ),
            (json!(false), json!(false), json!(1)),
            "{spec}"
        );

        let bundle = format!("registry.local:5000/mesh/config@{}", digest('c'));
        let out = fx
            .ok(&[
                "pin",
                "mesh-eu-1",
                "--bundle",
                &bundle,
                "--keys",
                "cosign",
                "--reason",
                "5xx after change 42",
                "-n",
                "argocd",
            ])
            .await;
        let name = format!("pin-mesh-eu-1-{}", "c".repeat(12));
        assert!(out.contains(&format!("BundlePin {name} created")), "{out}");
        let spec = fx
            .spec("BundlePin", "bundlepins", Some("argocd"), &name)
            .await;
        assert_eq!(
            spec["bundle"],
            json!({"repository": "oci://registry.local:5000/mesh/config", "digest": digest('c')})
        );
        assert_eq!(spec["targets"], json!([{"name": "mesh-eu-1"}]));
        assert_eq!(spec["reason"], "5xx after change 42");

        // A tag is refused before anything is written.
        let (code, _, err) = fx
            .run(
                &fx.admin,
                &[
                    "pin",
                    "x",
                    "--bundle",
                    "oci://r/m:v1",
                    "--reason",
                    "r",
                    "-n",
                    "argocd",
                ],
            )
            .await;
        assert_eq!(code, 2, "{err}");
        assert!(err.contains("names no digest"), "{err}");

        fx.set_status(
            "BundlePin",
            "bundlepins",
            Some("argocd"),
            &name,
            json!({"phase": "Pinned"}),
        )
        .await;
        fx.ok(&[
            "unpin",
            &name,
            "--reason",
            "forward fix merged",
            "-n",
            "argocd",
        ])
        .await;
        let spec = fx
            .spec("BundlePin", "bundlepins", Some("argocd"), &name)
            .await;
        assert_eq!(
            (spec["release"].clone(), spec["releaseReason"].clone()),
            (json!(true), json!("forward fix merged"))
        );
        fx.emu.shutdown().await;
    })
    .await;
}

#[tokio::test]
async fn get_and_status_print_the_tree_and_watch_follows_changes() {
    within_budget(async {
        let fx = Fixture::start().await;
        fx.set_status(
            "Rollout",
            "rollouts",
            Some("shop"),
            "checkout",
            json!({"phase": "Progressing", "currentStepIndex": 2, "desiredWeight": 25, "appliedShare": 0.243,
                   "gates": [{"gate": "errors", "verdict": "Pass", "reason": "ThresholdMet", "value": 0.002,
                              "threshold": 0.003, "consecutiveFailures": 0, "evaluatedAt": "2026-11-30T04:00:00Z"}]}),
        )
        .await;
        let out = fx.ok(&["get", "rollouts", "-A"]).await;
        assert!(out.contains("shop        checkout   Progressing   2      25%       24.3%     errors=Pass"), "{out}");
        let out = fx.ok(&["get", "all", "-A"]).await;
        for w in ["rollouts:", "wavegates:", "revisionupgrades:", "to-1-28"] {
            assert!(out.contains(w), "get all lacks {w:?}: {out}");
        }
        let out = fx.ok(&["status", "rollout/checkout", "-n", "shop"]).await;
        for w in ["Rollout shop/checkout  Progressing", "traffic: desired weight 25%, applied share 24.3%",
                  "▶ 2 setWeight 25%  current", "errors: Pass (ThresholdMet) value 0.002 vs threshold 0.003"] {
            assert!(out.contains(w), "status lacks {w:?}:\n{out}");
        }
        let out = fx.ok(&["status", "wavegate", "checkout", "-n", "shop"]).await;
        assert!(out.contains("canary  Pending") && out.contains("cluster eu-2: -"), "{out}");

        // --watch prints the tree again when the status changes, and stops at its timeout.
        let child = tokio::process::Command::new(env!("CARGO_BIN_EXE_kubectl-sluice"))
            .args(["status", "rollout/checkout", "-n", "shop", "--watch", "--watch-timeout", "4", "--kubeconfig"])
            .arg(&fx.admin)
            .stdout(std::process::Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        tokio::time::sleep(Duration::from_millis(1500)).await;
        fx.set_status("Rollout", "rollouts", Some("shop"), "checkout",
            json!({"currentStepIndex": 3, "phase": "Paused", "desiredWeight": 25})).await;
        let out = child.wait_with_output().await.unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{text}");
        assert!(text.contains("Rollout shop/checkout  Progressing"), "{text}");
        assert!(text.contains("Rollout shop/checkout  Paused") && text.contains("▶ 3 pause until promoted"), "{text}");
        fx.emu.shutdown().await;
    })
    .await;
}

#[tokio::test]
async fn missing_object_wrong_kind_and_forbidden_action_fail_clearly() {
    within_budget(async {
        let fx = Fixture::start().await;
        // A missing object: exit 3, the kind, name and namespace, and how to list them.
        let (code, _, err) = fx.run(&fx.admin, &["abort", "nope", "-n", "shop"]).await;
        assert_eq!(code, 3, "{err}");
        assert!(err.contains(r#"Rollout "nope" not found in namespace "shop": list them with 'kubectl sluice get rollouts'"#), "{err}");

        // A kind the command does not act on: exit 2, before any request.
        let (code, _, err) = fx.run(&fx.admin, &["promote", "wavegate/checkout", "-n", "shop"]).await;
        assert_eq!(code, 2, "{err}");
        assert!(err.contains("'promote' does not act on WaveGate checkout: it acts on Rollouts"), "{err}");
        let (code, _, err) = fx.run(&fx.admin, &["status", "deployment/checkout", "-n", "shop"]).await;
        assert_eq!(code, 2, "{err}");
        assert!(err.contains("'deployment' is not a sluice kind"), "{err}");

        // A name that exists only as another kind: the error says which.
        let (code, _, err) = fx.run(&fx.admin, &["unpin", "checkout", "--reason", "r", "-n", "shop"]).await;
        assert_eq!(code, 3, "{err}");
        assert!(err.contains(r#"BundlePin "checkout" not found in namespace "shop": there is a Rollout "checkout""#), "{err}");

        // A viewer may read but not change: get works, abort is forbidden and nothing changes.
        fx.emu
            .load_yaml(
                r#"
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {name: rollout-viewer, namespace: shop}
rules:
  - apiGroups: [sluice.dev]
    resources: [rollouts]
    verbs: [get, list, watch]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {name: rollout-viewer, namespace: shop}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: Role, name: rollout-viewer}
subjects:
  - {kind: ServiceAccount, name: viewer, namespace: shop}
"#,
            )
            .unwrap();
        let viewer = fx.dir.path().join("viewer.kubeconfig");
        fx.emu
            .write_kubeconfig_with_token(&viewer, &fx.emu.service_account_token("shop", "viewer"))
            .unwrap();
        let (code, _, err) = fx.run(&viewer, &["status", "checkout", "-n", "shop"]).await;
        assert_eq!(code, 2, "{err}");
        assert!(err.contains("'checkout' names no kind: use KIND/NAME"), "{err}");
        let (code, out, err) = fx.run(&viewer, &["status", "rollout/checkout", "-n", "shop"]).await;
        assert_eq!(code, 0, "a viewer reads: {err}");
        assert!(out.contains("Rollout shop/checkout"), "{out}");
        let (code, _, err) = fx.run(&viewer, &["abort", "checkout", "-n", "shop"]).await;
        assert_eq!(code, 3, "{err}");
        assert!(err.contains("forbidden:") && err.contains("ask for 'patch' on rollouts.sluice.dev in namespace \"shop\""), "{err}");
        assert_ne!(fx.spec("Rollout", "rollouts", Some("shop"), "checkout").await["abort"], true, "a forbidden abort changed nothing");
        fx.emu.shutdown().await;
    })
    .await;
}
