//! End to end with the simulated Argo CD (`sluice-argocd`): its ApplicationSet controller reads
//! the WaveGate as a Cluster Decision Resource through the duck ConfigMap. A WaveGate that has
//! published no decisions yet (its adoption waits) never makes Argo CD delete the site's
//! Applications, and once it adopts, the generated Applications follow its decisions.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::{
    Api,
    api::{Patch, PatchParams, PostParams},
};
use kube_emulator::{ADMIN_TOKEN, Emulator, Options};
use sluice_api::{
    external::argocd::{Application, ApplicationSet},
    v1alpha1::{
        WaveGate, WaveGatePhase,
        wave_gate::{DUCK_MATCH_KEY, DUCK_RESOURCE, DUCK_STATUS_LIST_KEY},
    },
};
use sluice_argocd::{ArgoCd, ArgoCdOptions, cluster_secret};
use sluice_runtime::events::EventRecorder;
use sluice_testkit::controller::RunningController;
use sluice_testkit::eventually::{eventually_every, object_until};
use sluice_wave_gate::{OPERATOR, reconcile};

const NS: &str = "argocd";
const BUDGET: Duration = Duration::from_secs(30);

fn rev(c: char) -> String {
    format!("sha256:{}", c.to_string().repeat(64))
}

fn upstream() -> Option<PathBuf> {
    use sluice_testkit::prereq;
    prereq::or_skip(prereq::upstream_dir(prereq::Upstream::ArgoCd))
}

async fn apps(client: &kube::Client) -> BTreeMap<String, Option<String>> {
    Api::<Application>::namespaced(client.clone(), NS)
        .list(&Default::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .map(|a| {
            let target = a
                .spec
                .source
                .as_ref()
                .and_then(|s| s.target_revision.clone());
            (a.metadata.name.unwrap_or_default(), target)
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_decisions_yet_never_makes_argo_cd_delete_applications() {
    let Some(argo_crds) = upstream() else { return };
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let mgmt = Emulator::start_with(Options {
        manifests: vec![
            argo_crds.join("application-crd.yaml"),
            argo_crds.join("applicationset-crd.yaml"),
            root.join("crds/wavegates.sluice.dev.yaml"),
            root.join("crds/bundlepins.sluice.dev.yaml"),
        ],
        ..Default::default()
    })
    .await
    .expect("management emulator starts");
    mgmt.load_yaml(&format!(
        "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: {NS}\n"
    ))
    .unwrap();
    let workload = Emulator::start().await;
    let client = mgmt.client();
    for c in ["eu-1", "eu-2"] {
        Api::<Secret>::namespaced(client.clone(), NS)
            .create(
                &PostParams::default(),
                &cluster_secret(c, &workload.base_url(), ADMIN_TOKEN, &BTreeMap::new()),
            )
            .await
            .unwrap();
    }
    // The duck ConfigMap the chart ships, from sluice-api's constants.
    let duck: ConfigMap = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "sluice-wavegate-decisions", "namespace": NS},
        "data": {"apiVersion": "sluice.dev/v1alpha1", "kind": DUCK_RESOURCE, "statusListKey": DUCK_STATUS_LIST_KEY, "matchKey": DUCK_MATCH_KEY},
    }))
    .unwrap();
    Api::<ConfigMap>::namespaced(client.clone(), NS)
        .create(&PostParams::default(), &duck)
        .await
        .unwrap();
    // Given the site's ApplicationSet and the Applications it generated before the WaveGate
    // governed it.
    let set: ApplicationSet = serde_json::from_value(serde_json::json!({
        "apiVersion": "argoproj.io/v1alpha1", "kind": "ApplicationSet",
        "metadata": {"name": "mesh-eu", "namespace": NS},
        "spec": {
            "goTemplate": true,
            "generators": [{"clusterDecisionResource": {"configMapRef": "sluice-wavegate-decisions", "name": "eu"}}],
            "template": {
                "metadata": {"name": "mesh-{{.clusterName}}"},
                "spec": {"project": "default", "source": {"repoURL": "oci://127.0.0.1:9/mesh/config", "targetRevision": "{{.revision}}", "path": "."}, "destination": {"name": "{{.clusterName}}", "namespace": "istio-config"}}
            },
            "syncPolicy": {"applicationsSync": "create-update", "preserveResourcesOnDeletion": true},
            "ignoreApplicationDifferences": [{"jsonPointers": ["/spec/syncPolicy"]}],
        }
    }))
    .unwrap();
    let set = Api::<ApplicationSet>::namespaced(client.clone(), NS)
        .create(&PostParams::default(), &set)
        .await
        .unwrap();
    for c in ["eu-1", "eu-2"] {
        let app: Application = serde_json::from_value(serde_json::json!({
            "apiVersion": "argoproj.io/v1alpha1", "kind": "Application",
            "metadata": {"name": format!("mesh-{c}"), "namespace": NS, "ownerReferences": [{"apiVersion": "argoproj.io/v1alpha1", "kind": "ApplicationSet", "name": "mesh-eu", "uid": set.metadata.uid.clone().unwrap(), "controller": true}]},
            "spec": {"project": "default", "source": {"repoURL": "oci://127.0.0.1:9/mesh/config", "targetRevision": rev('0'), "path": "."}, "destination": {"name": c, "namespace": "istio-config"}},
        }))
        .unwrap();
        Api::<Application>::namespaced(client.clone(), NS)
            .create(&PostParams::default(), &app)
            .await
            .unwrap();
    }
    let argocd = ArgoCd::start(client.clone(), ArgoCdOptions::default())
        .await
        .expect("simulated Argo CD starts");
    let ctx = reconcile::Context::new(client.clone(), EventRecorder::new(client.clone(), OPERATOR));
    let controller = RunningController::start(&client, ctx, reconcile::reconcile);

    // When a WaveGate governs the site but cannot adopt yet (the Applications report no
    // revision and no previousRevision is set): it publishes no decisions.
    let wg: WaveGate = serde_json::from_value(serde_json::json!({
        "apiVersion": "sluice.dev/v1alpha1", "kind": "WaveGate",
        "metadata": {"name": "eu", "namespace": NS},
        "spec": {
            "site": "eu", "applicationSetRef": {"name": "mesh-eu"},
            "repository": "oci://127.0.0.1:9/mesh/config", "revision": rev('b'),
            "waves": [{"name": "canary", "clusters": ["eu-1"]}, {"name": "rest", "clusters": ["eu-2"]}],
            "driftGate": {"exporter": "None"}, "pin": {"publicKeysSecretRef": {"name": "cosign-keys"}},
        }
    }))
    .unwrap();
    let gates: Api<WaveGate> = Api::namespaced(client.clone(), NS);
    gates.create(&PostParams::default(), &wg).await.unwrap();
    let g = object_until(&gates, "eu", "WaveGate Pending", BUDGET, |g| {
        g.status
            .as_ref()
            .is_some_and(|s| s.phase == WaveGatePhase::Pending)
    })
    .await;
    assert!(g.status.unwrap().decisions.is_empty());
    // Then several ApplicationSet regenerations later (resync 1 s), every Application is there.
    for _ in 0..5 {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let now = apps(&client).await;
        assert_eq!(
            now.keys().cloned().collect::<Vec<_>>(),
            vec!["mesh-eu-1".to_owned(), "mesh-eu-2".to_owned()],
            "an Application was deleted while the WaveGate had no decisions"
        );
        let g = gates.get("eu").await.unwrap();
        assert!(g.status.unwrap().decisions.is_empty());
    }

    // When the WaveGate adopts (previousRevision set): the Applications follow its decisions.
    gates
        .patch(
            "eu",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"spec": {"previousRevision": rev('a')}})),
        )
        .await
        .unwrap();
    eventually_every(
        "the Applications to follow the decisions (wave 0 at b, the rest at a)",
        BUDGET,
        Duration::from_millis(200),
        async || {
            let now = apps(&client).await;
            let want = BTreeMap::from([
                ("mesh-eu-1".to_owned(), Some(rev('b'))),
                ("mesh-eu-2".to_owned(), Some(rev('a'))),
            ]);
            if now == want {
                Ok(())
            } else {
                Err(format!(
                    "{now:#?}; WaveGate: {:#?}",
                    gates.get("eu").await.unwrap().status
                ))
            }
        },
    )
    .await;

    controller.stop().await;
    argocd.stop().await;
    workload.shutdown().await;
    mgmt.shutdown().await;
}
