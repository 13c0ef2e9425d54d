//! The sluice CRDs on a real kube-apiserver (DESIGN.md, "Test strategy", tier 3): every CRD of
//! `crds/` is accepted — its CEL rules compile and fit the real cost estimator — and becomes
//! Established; valid objects pass with the schema's defaults applied; every bad object of the
//! CEL tests (`cel_cases`) is rejected with the rule's message; and the emulator answers each of
//! them with the same message as the real server.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::Client;
use kube::api::{Api, ApiResource, DynamicObject, PostParams};
use serde_json::{Value, json};
use sluice_testkit::control_plane::{self, ControlPlane};

mod cel_cases;
use cel_cases::*;

fn crd_files() -> Vec<PathBuf> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../crds");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "yaml"))
        .collect();
    files.sort();
    assert_eq!(files.len(), 5, "{files:?}");
    files
}

fn crd(path: &PathBuf) -> CustomResourceDefinition {
    serde_yaml::from_str(&std::fs::read_to_string(path).unwrap())
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Server-side applies every CRD of `crds/` (each a create: the control plane is fresh) and
/// returns the `Warning` headers the server sent back, as `<file>: <warning>`; panics with the
/// server's answer when one is refused. Then waits until each CRD is Established.
async fn install_crds(client: &Client) -> Vec<String> {
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    let mut warnings = Vec::new();
    for path in crd_files() {
        let crd = crd(&path);
        let name = crd.metadata.name.clone().unwrap();
        let request = http::Request::patch(format!(
            "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}?fieldManager=sluice-tests&force=true"
        ))
        .header("content-type", "application/apply-patch+yaml")
        .body(serde_json::to_vec(&crd).unwrap().into())
        .unwrap();
        let response = client
            .send(request)
            .await
            .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let status = response.status();
        for warning in response.headers().get_all("warning") {
            let file = path.file_name().unwrap().to_string_lossy();
            warnings.push(format!(
                "{file}: {}",
                warning.to_str().unwrap_or("<not text>")
            ));
        }
        if !status.is_success() {
            let body = response
                .into_body()
                .collect_bytes()
                .await
                .unwrap_or_default();
            panic!(
                "{} refused by kube-apiserver ({status}): {}",
                path.display(),
                String::from_utf8_lossy(&body)
            );
        }
    }
    for path in crd_files() {
        let name = crd(&path).metadata.name.unwrap();
        let start = Instant::now();
        loop {
            let got = api.get(&name).await.unwrap();
            let established = got
                .status
                .and_then(|s| s.conditions)
                .unwrap_or_default()
                .iter()
                .any(|c| c.type_ == "Established" && c.status == "True");
            if established {
                break;
            }
            assert!(
                start.elapsed() < Duration::from_secs(30),
                "{name} not Established"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    let namespaces: Api<Namespace> = Api::all(client.clone());
    if namespaces.get_opt("shop").await.unwrap().is_none() {
        namespaces
            .create(
                &PostParams::default(),
                &serde_json::from_value(json!({"metadata": {"name": "shop"}})).unwrap(),
            )
            .await
            .unwrap();
    }
    warnings
}

/// The warnings kube-apiserver answered the CRDs' creation with.
static INSTALLED: tokio::sync::OnceCell<Vec<String>> = tokio::sync::OnceCell::const_new();

/// The test binary's control plane with the CRDs installed (once), and the warnings of that
/// install.
async fn real_with_warnings() -> Option<(&'static ControlPlane, &'static [String])> {
    let cp = control_plane::shared().await?;
    let warnings = INSTALLED
        .get_or_init(|| async { install_crds(&cp.client().await.unwrap()).await })
        .await;
    Some((cp, warnings))
}

/// The test binary's control plane with the CRDs installed (once).
async fn real() -> Option<&'static ControlPlane> {
    real_with_warnings().await.map(|(cp, _)| cp)
}

fn scope_of(plural: &str) -> bool {
    crd_files()
        .iter()
        .map(crd)
        .find(|c| c.spec.names.plural == plural)
        .map(|c| c.spec.scope == "Namespaced")
        .unwrap_or_else(|| panic!("no CRD {plural}"))
}

/// Sends `object(kind, spec)` as a dry-run create; the stored (defaulted) object or the error.
async fn submit(
    client: &Client,
    plural: &str,
    kind: &str,
    spec: Value,
) -> Result<Value, kube::Error> {
    let ar = ApiResource {
        group: "sluice.dev".into(),
        version: "v1alpha1".into(),
        api_version: "sluice.dev/v1alpha1".into(),
        kind: kind.into(),
        plural: plural.into(),
    };
    let mut obj = object(kind, spec);
    let api: Api<DynamicObject> = if scope_of(plural) {
        Api::namespaced_with(client.clone(), "shop", &ar)
    } else {
        obj["metadata"].as_object_mut().unwrap().remove("namespace");
        Api::all_with(client.clone(), &ar)
    };
    let obj: DynamicObject = serde_json::from_value(obj).unwrap();
    let pp = PostParams {
        dry_run: true,
        field_manager: None,
    };
    api.create(&pp, &obj)
        .await
        .map(|o| serde_json::to_value(o).unwrap())
}

/// The message of a 422, panicking on anything else.
fn invalid_message(case: &str, answer: Result<Value, kube::Error>) -> String {
    match answer {
        Err(kube::Error::Api(status)) if status.code == 422 => status.message,
        Err(e) => panic!("{case}: expected 422 Invalid, got {e}"),
        Ok(obj) => panic!("{case}: expected 422 Invalid, the object was accepted: {obj}"),
    }
}

/// Every bad object: (case, plural, kind, spec, needle).
fn all_rejections() -> Vec<Case> {
    let mut cases = rejections();
    for (budget, needle) in budget_rejections() {
        let mut spec = upgrade();
        spec["issuanceBudget"] = budget;
        cases.push((
            "bad budget",
            "revisionupgrades",
            "RevisionUpgrade",
            spec,
            needle,
        ));
    }
    let (pin, needle) = release_without_reason();
    cases.push((
        "release without reason",
        "bundlepins",
        "BundlePin",
        pin,
        needle,
    ));
    cases
}

#[tokio::test]
async fn every_crd_is_accepted_and_established() {
    let Some(cp) = real().await else {
        return;
    };
    let api: Api<CustomResourceDefinition> = Api::all(cp.client().await.unwrap());
    for path in crd_files() {
        let name = crd(&path).metadata.name.unwrap();
        let got = api.get(&name).await.unwrap();
        let conditions = got.status.and_then(|s| s.conditions).unwrap_or_default();
        for want in ["Established", "NamesAccepted"] {
            assert!(
                conditions
                    .iter()
                    .any(|c| c.type_ == want && c.status == "True"),
                "{name}: {want} not True: {conditions:?}"
            );
        }
    }
}

/// kube-apiserver warns on every write of a CRD whose schema carries a `format` it does not know
/// (schemars writes `uint32`, `uint16`, `uint64` for unsigned integers); `kubectl apply` and Helm
/// print each warning to the user installing the chart. The generated CRDs carry none.
#[tokio::test]
async fn crds_are_created_without_warnings() {
    let Some((_, warnings)) = real_with_warnings().await else {
        return;
    };
    assert!(
        warnings.is_empty(),
        "kube-apiserver warned on creating the CRDs:\n{}",
        warnings.join("\n")
    );
}

#[tokio::test]
async fn valid_objects_pass_and_get_defaults() {
    let Some(cp) = real().await else {
        return;
    };
    let client = cp.client().await.unwrap();
    let r = submit(&client, "rollouts", "Rollout", rollout())
        .await
        .unwrap();
    assert_eq!(r["spec"]["analysisInterval"], "30s");
    assert_eq!(r["spec"]["appliedShareTolerancePercent"], 20);
    assert_eq!(
        r["spec"]["steps"][0]["mirror"]["methods"],
        json!(["GET", "HEAD"])
    );
    assert_eq!(
        r["spec"]["gates"][0]["comparison"]["relative"]["baseline"],
        "StableNow"
    );
    let w = submit(&client, "wavegates", "WaveGate", wave_gate())
        .await
        .unwrap();
    assert_eq!(w["spec"]["defaultSoak"], "15m");
    assert_eq!(w["spec"]["driftGate"]["clusterLabel"], "cluster");
    submit(&client, "bundlepins", "BundlePin", bundle_pin())
        .await
        .unwrap();
    let u = submit(&client, "revisionupgrades", "RevisionUpgrade", upgrade())
        .await
        .unwrap();
    assert_eq!(
        u["spec"]["issuanceBudget"],
        json!({"rate": 200, "depth": 2000, "peakPerSecond": 2000})
    );
    assert_eq!(u["spec"]["restart"], "Evict");
    assert_eq!(u["spec"]["waves"].as_array().map(Vec::len), Some(3));
    submit(
        &client,
        "gatetemplates",
        "GateTemplate",
        json!({"promql": "histogram_quantile(0.99, x{svc=\"{{service}}\"})",
               "comparison": {"absolute": {"op": "LessThan", "value": 0.5}}}),
    )
    .await
    .unwrap();
}

#[tokio::test]
async fn every_bad_object_is_rejected_with_the_rule_message() {
    let Some(cp) = real().await else {
        return;
    };
    let client = cp.client().await.unwrap();
    for (case, plural, kind, spec, needle) in all_rejections() {
        let message = invalid_message(case, submit(&client, plural, kind, spec).await);
        assert!(
            message.contains(needle),
            "{case}: expected a message containing {needle:?}, got {message:?}"
        );
    }
}

#[tokio::test]
async fn the_emulator_rejects_with_the_real_messages() {
    let Some(cp) = real().await else {
        return;
    };
    let client = cp.client().await.unwrap();
    let emulator = kube_emulator::Emulator::start().await;
    for path in crd_files() {
        emulator.load_manifest_file(&path).unwrap();
    }
    emulator
        .load_yaml("apiVersion: v1\nkind: Namespace\nmetadata:\n  name: shop\n")
        .unwrap();
    let emulated = emulator.client();
    let mut differences = Vec::new();
    for (case, plural, kind, spec, _) in all_rejections() {
        let real = invalid_message(case, submit(&client, plural, kind, spec.clone()).await);
        let emu = invalid_message(case, submit(&emulated, plural, kind, spec).await);
        if real != emu {
            differences.push(format!("{case}:\n  real:     {real}\n  emulator: {emu}"));
        }
    }
    emulator.shutdown().await;
    assert!(
        differences.is_empty(),
        "the emulator's messages differ from kube-apiserver's:\n{}",
        differences.join("\n")
    );
}
