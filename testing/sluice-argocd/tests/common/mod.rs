//! Given/When/Then helpers for the simulated Argo CD's end-to-end tests: a management emulator
//! with the released Argo CD CRDs, workload emulators named by cluster Secrets, and polling
//! helpers with time budgets. Tests skip, saying why, when the upstream CRDs or a binary are
//! absent.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::api::{ApiResource, DynamicObject, Patch, PatchParams, PostParams};
use kube::{Api, Client};
use kube_emulator::{ADMIN_TOKEN, Emulator, Options};
use serde_json::{Value, json};
use sluice_argocd::{ArgoCd, ArgoCdOptions, cluster_secret};

/// The one wait of the test kit, for the scenarios that `use common::*`.
pub use sluice_testkit::eventually::eventually;

pub const NS: &str = "argocd";
pub const DEST_NS: &str = "mesh";

/// The released Argo CD CRDs (`.tools/crds/argo-cd-v3.5.1`); when missing the test fails under
/// CI and is skipped and counted otherwise.
pub fn upstream() -> Option<PathBuf> {
    use sluice_testkit::prereq;
    prereq::or_skip(prereq::upstream_dir(prereq::Upstream::ArgoCd))
}

/// Whether the git CLI is available (prints why not).
pub fn have_git() -> bool {
    sluice_testkit::prereq::require_binary("git").is_some()
}

/// One Argo CD site: management cluster, workload clusters, the simulation running.
pub struct Site {
    pub mgmt: Emulator,
    pub workloads: Vec<(String, Emulator)>,
    pub argocd: Option<ArgoCd>,
}

impl Site {
    /// Starts a site whose workload clusters have the given names (or returns `None` to skip).
    pub async fn start(clusters: &[&str], options: ArgoCdOptions) -> Option<Site> {
        let dir = upstream()?;
        let mgmt = Emulator::start_with(Options {
            manifests: vec![
                dir.join("application-crd.yaml"),
                dir.join("applicationset-crd.yaml"),
            ],
            ..Default::default()
        })
        .await
        .expect("management emulator starts with the Argo CD CRDs");
        mgmt.load_yaml(&format!(
            "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: {NS}\n"
        ))
        .expect("argocd namespace");
        let mut workloads = Vec::new();
        for name in clusters {
            let w = Emulator::start().await;
            w.load_yaml(&format!(
                "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: {DEST_NS}\n"
            ))
            .expect("mesh namespace");
            let labels: BTreeMap<String, String> = [("site".to_string(), "east".to_string())]
                .into_iter()
                .collect();
            let secret = cluster_secret(name, &w.base_url(), ADMIN_TOKEN, &labels);
            Api::<Secret>::namespaced(mgmt.client(), NS)
                .create(&PostParams::default(), &secret)
                .await
                .expect("cluster Secret created");
            workloads.push((name.to_string(), w));
        }
        let argocd = ArgoCd::start(mgmt.client(), options)
            .await
            .expect("simulated Argo CD starts");
        Some(Site {
            mgmt,
            workloads,
            argocd: Some(argocd),
        })
    }

    pub fn workload(&self, name: &str) -> Client {
        self.workloads
            .iter()
            .find(|(n, _)| n == name)
            .expect("known workload cluster")
            .1
            .client()
    }

    pub fn server(&self, name: &str) -> String {
        self.workloads
            .iter()
            .find(|(n, _)| n == name)
            .expect("known workload cluster")
            .1
            .base_url()
    }

    pub fn apps(&self) -> Api<DynamicObject> {
        Api::namespaced_with(
            self.mgmt.client(),
            NS,
            &sluice_argocd::app_controller::application_resource(),
        )
    }

    pub fn appsets(&self) -> Api<DynamicObject> {
        Api::namespaced_with(
            self.mgmt.client(),
            NS,
            &sluice_argocd::appset_controller::application_set_resource(),
        )
    }

    pub fn config_maps(&self, cluster: &str) -> Api<ConfigMap> {
        Api::namespaced(self.workload(cluster), DEST_NS)
    }

    pub async fn create_app(&self, app: Value) {
        let obj: DynamicObject = serde_json::from_value(app).expect("Application JSON");
        self.apps()
            .create(&PostParams::default(), &obj)
            .await
            .expect("Application created");
    }

    pub async fn app(&self, name: &str) -> Value {
        serde_json::to_value(self.apps().get(name).await.expect("Application exists")).unwrap()
    }

    pub async fn patch_app(&self, name: &str, patch: Value) {
        self.apps()
            .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .expect("Application patched");
    }

    pub async fn stop(mut self) {
        if let Some(a) = self.argocd.take() {
            a.stop().await;
        }
        for (_, w) in self.workloads {
            w.shutdown().await;
        }
        self.mgmt.shutdown().await;
    }
}

/// An Application in Argo CD's shape.
pub fn application(
    name: &str,
    repo_url: &str,
    revision: &str,
    cluster: &str,
    sync_policy: Value,
) -> Value {
    json!({
        "apiVersion": "argoproj.io/v1alpha1",
        "kind": "Application",
        "metadata": {"name": name, "namespace": NS},
        "spec": {
            "project": "default",
            "source": {"repoURL": repo_url, "path": ".", "targetRevision": revision},
            "destination": {"name": cluster, "namespace": DEST_NS},
            "syncPolicy": sync_policy,
        }
    })
}

/// Asserts `f` holds at every poll for `period`.
pub async fn always(what: &str, period: Duration, mut f: impl AsyncFnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + period;
    while tokio::time::Instant::now() < deadline {
        assert!(f().await, "expected throughout {period:?}: {what}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

pub fn str_at<'a>(v: &'a Value, pointer: &str) -> &'a str {
    v.pointer(pointer)
        .and_then(Value::as_str)
        .unwrap_or_default()
}

/// A ConfigMap manifest.
pub fn config_map(name: &str, data: &[(&str, &str)], wave: Option<i64>) -> String {
    let mut s = format!("apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {name}\n");
    if let Some(w) = wave {
        s.push_str(&format!(
            "  annotations:\n    argocd.argoproj.io/sync-wave: \"{w}\"\n"
        ));
    }
    s.push_str("data:\n");
    for (k, v) in data {
        s.push_str(&format!("  {k}: \"{v}\"\n"));
    }
    s
}

pub fn fast_options() -> ArgoCdOptions {
    ArgoCdOptions {
        resync: Duration::from_millis(500),
        sync_wave_delay: Duration::from_millis(200),
        ..Default::default()
    }
}

/// ApiResource for a test-only decision CRD.
pub fn decision_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &kube::api::GroupVersionKind::gvk("test.sluice.dev", "v1", "Decision"),
        "decisions",
    )
}
