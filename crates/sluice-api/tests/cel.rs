//! The generated CRDs' schemas and CEL rules behave as intended when an API server (here the
//! project's emulator, which compiles every rule and refuses functions it cannot evaluate)
//! defaults and validates objects: valid objects pass with defaults applied, and each
//! cross-field rule rejects the object it is meant to reject, naming the field.

use kube_emulator::validation::CrdSchema;
use serde_json::{Value, json};
use sluice_api::crds;

fn schema(plural: &str) -> CrdSchema {
    let crd = crds::all()
        .into_iter()
        .find(|c| c.spec.names.plural == plural)
        .unwrap_or_else(|| panic!("no CRD {plural}"));
    let v = serde_json::to_value(&crd).unwrap();
    CrdSchema::from_crd_version(&v, "v1alpha1")
        .unwrap_or_else(|e| panic!("{plural}: the schema does not load: {e}"))
}

fn object(kind: &str, spec: Value) -> Value {
    json!({
        "apiVersion": "sluice.dev/v1alpha1",
        "kind": kind,
        "metadata": {"name": "x", "namespace": "shop"},
        "spec": spec
    })
}

fn digest(c: char) -> String {
    format!("sha256:{}", c.to_string().repeat(64))
}

/// Defaults, prunes and validates; returns the defaulted object and the error texts.
fn check(s: &CrdSchema, mut obj: Value) -> (Value, Vec<String>) {
    s.default_and_prune(&mut obj);
    let errs = s
        .validate(&obj, None)
        .into_iter()
        .map(|e| format!("{}: {}", e.path, e.body()))
        .collect();
    (obj, errs)
}

/// Sets `value` at a JSON pointer; the parent must exist (a missing last key is inserted).
fn set(mut v: Value, pointer: &str, value: Value) -> Value {
    let (parent, key) = pointer.rsplit_once('/').unwrap();
    match v
        .pointer_mut(parent)
        .unwrap_or_else(|| panic!("no {parent}"))
    {
        Value::Array(a) => a[key.parse::<usize>().unwrap()] = value,
        Value::Object(o) => {
            o.insert(key.to_owned(), value);
        }
        _ => panic!("cannot set {pointer}"),
    }
    v
}

fn rollout() -> Value {
    json!({
        "routeRef": {"name": "checkout"},
        "stableService": {"name": "checkout-v1"},
        "canaryService": {"name": "checkout-v2"},
        "canaryWorkload": {"name": "checkout-v2"},
        "steps": [
            {"mirror": {"percent": 10}},
            {"headerCohort": {"header": {"name": "x-cohort", "value": "staff"}}},
            {"setWeight": {"weight": 1}},
            {"setWeight": {"weight": 5}},
            {"pause": {"untilPromoted": true}},
            {"setWeight": {"weight": 50}},
            {"promote": {}}
        ],
        "gates": [
            {"name": "errors", "builtin": "ErrorRatioVsStable", "comparison": {"relative": {"factor": 1.5}}},
            {"name": "latency", "templateRef": "p99-vs-stable"}
        ]
    })
}

fn wave_gate() -> Value {
    json!({
        "site": "eu-west",
        "applicationSetRef": {"name": "mesh-config"},
        "repository": "oci://registry.local:5000/mesh/config",
        "revision": digest('a'),
        "waves": [
            {"name": "canary", "clusters": ["eu-1"]},
            {"name": "rest", "clusters": ["eu-2", "eu-3"]}
        ],
        "driftGate": {"exporter": "None"},
        "pin": {"publicKeysSecretRef": {"name": "cosign"}}
    })
}

fn bundle_pin() -> Value {
    json!({
        "targets": [{"name": "mesh-eu-1"}],
        "bundle": {"repository": "oci://registry.local:5000/mesh/config", "digest": digest('c')},
        "publicKeysSecretRef": {"name": "cosign"},
        "reason": "5xx after change 42"
    })
}

fn upgrade() -> Value {
    json!({"fromTag": "stable", "fromRevision": "1-27", "toTag": "canary", "toRevision": "1-28"})
}

#[test]
fn every_schema_loads_with_all_rules_compiled() {
    for crd in crds::all() {
        schema(&crd.spec.names.plural);
    }
}

#[test]
fn valid_objects_pass_and_get_defaults() {
    let (r, errs) = check(&schema("rollouts"), object("Rollout", rollout()));
    assert!(errs.is_empty(), "{errs:?}");
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

    let (w, errs) = check(&schema("wavegates"), object("WaveGate", wave_gate()));
    assert!(errs.is_empty(), "{errs:?}");
    assert_eq!(w["spec"]["defaultSoak"], "15m");
    assert_eq!(w["spec"]["driftGate"]["clusterLabel"], "cluster");

    let (_, errs) = check(&schema("bundlepins"), object("BundlePin", bundle_pin()));
    assert!(errs.is_empty(), "{errs:?}");

    let (u, errs) = check(
        &schema("revisionupgrades"),
        object("RevisionUpgrade", upgrade()),
    );
    assert!(errs.is_empty(), "{errs:?}");
    assert_eq!(
        u["spec"]["issuanceBudget"],
        json!({"rate": 200, "depth": 2000, "peakPerSecond": 2000})
    );
    assert_eq!(u["spec"]["restart"], "Evict");
    assert_eq!(u["spec"]["waves"].as_array().map(Vec::len), Some(3));

    let (_, errs) = check(
        &schema("gatetemplates"),
        json!({"apiVersion": "sluice.dev/v1alpha1", "kind": "GateTemplate", "metadata": {"name": "p99"},
               "spec": {"promql": "histogram_quantile(0.99, x{svc=\"{{service}}\"})", "comparison": {"absolute": {"op": "LessThan", "value": 0.5}}}}),
    );
    assert!(errs.is_empty(), "{errs:?}");
}

/// (case, plural, kind, spec, text the error must contain)
type Case = (
    &'static str,
    &'static str,
    &'static str,
    Value,
    &'static str,
);

#[test]
fn cross_field_rules_reject_what_they_should() {
    let cases: Vec<Case> = vec![
        (
            "weights not increasing",
            "rollouts",
            "Rollout",
            set(rollout(), "/steps/3/setWeight/weight", json!(1)),
            "strictly increasing",
        ),
        (
            "weight over 100",
            "rollouts",
            "Rollout",
            set(rollout(), "/steps/5/setWeight/weight", json!(101)),
            "steps[5].setWeight.weight",
        ),
        (
            "mirror POST",
            "rollouts",
            "Rollout",
            set(rollout(), "/steps/0/mirror/methods", json!(["GET", "POST"])),
            "idempotent methods",
        ),
        (
            "two kinds in one step",
            "rollouts",
            "Rollout",
            set(
                rollout(),
                "/steps/2",
                json!({"setWeight": {"weight": 1}, "promote": {}}),
            ),
            "exactly one of mirror",
        ),
        (
            "promote not last",
            "rollouts",
            "Rollout",
            set(rollout(), "/steps/4", json!({"promote": {}})),
            "promote may appear once",
        ),
        (
            "pause without duration",
            "rollouts",
            "Rollout",
            set(rollout(), "/steps/4", json!({"pause": {}})),
            "either duration or untilPromoted",
        ),
        (
            "same services",
            "rollouts",
            "Rollout",
            set(rollout(), "/canaryService/name", json!("checkout-v1")),
            "different Services",
        ),
        (
            "bad duration",
            "rollouts",
            "Rollout",
            set(rollout(), "/gates/0/window", json!("5 minutes")),
            "gates[0].window",
        ),
        (
            "gate with two sources",
            "rollouts",
            "Rollout",
            set(rollout(), "/gates/1/builtin", json!("MeshErrorRatio")),
            "exactly one of templateRef",
        ),
        (
            "duplicate gate names",
            "rollouts",
            "Rollout",
            set(rollout(), "/gates/1/name", json!("errors")),
            "gate names must be unique",
        ),
        (
            "two comparisons",
            "rollouts",
            "Rollout",
            set(
                rollout(),
                "/gates/0/comparison",
                json!({"relative": {}, "share": {}}),
            ),
            "exactly one of absolute",
        ),
        (
            "no waves",
            "wavegates",
            "WaveGate",
            set(wave_gate(), "/waves", json!([])),
            "waves",
        ),
        (
            "cluster in two waves",
            "wavegates",
            "WaveGate",
            set(wave_gate(), "/waves/1/clusters", json!(["eu-2", "eu-1"])),
            "at most one wave",
        ),
        (
            "tag as revision",
            "wavegates",
            "WaveGate",
            set(wave_gate(), "/revision", json!("v1.2.3")),
            "spec.revision",
        ),
        (
            "drift metric with None",
            "wavegates",
            "WaveGate",
            set(
                wave_gate(),
                "/driftGate",
                json!({"exporter": "None", "metric": "m"}),
            ),
            "omit it when exporter is None",
        ),
        (
            "drift Platform without metric",
            "wavegates",
            "WaveGate",
            set(wave_gate(), "/driftGate", json!({"exporter": "Platform"})),
            "set metric",
        ),
        (
            "pin without keys",
            "wavegates",
            "WaveGate",
            set(wave_gate(), "/pin", json!({})),
            "publicKeysSecretRef",
        ),
        (
            "tag as digest",
            "bundlepins",
            "BundlePin",
            set(bundle_pin(), "/bundle/digest", json!("latest")),
            "bundle.digest",
        ),
        (
            "tagged repository",
            "bundlepins",
            "BundlePin",
            set(
                bundle_pin(),
                "/bundle/repository",
                json!("oci://r.local/m:v1"),
            ),
            "bundle.repository",
        ),
        (
            "empty reason",
            "bundlepins",
            "BundlePin",
            set(bundle_pin(), "/reason", json!("")),
            "spec.reason",
        ),
        (
            "same tags",
            "revisionupgrades",
            "RevisionUpgrade",
            set(upgrade(), "/toTag", json!("stable")),
            "fromTag and toTag must differ",
        ),
        (
            "same revisions",
            "revisionupgrades",
            "RevisionUpgrade",
            set(upgrade(), "/toRevision", json!("1-27")),
            "fromRevision and toRevision must differ",
        ),
    ];
    for (name, plural, kind, spec, needle) in cases {
        let (_, errs) = check(&schema(plural), object(kind, spec));
        assert!(
            errs.iter().any(|e| e.contains(needle)),
            "{name}: expected an error containing {needle:?}, got {errs:?}"
        );
    }
}

#[test]
fn budget_and_release_rules() {
    let s = schema("revisionupgrades");
    for (budget, needle) in [
        (json!({"rate": 0}), "issuanceBudget.rate"),
        (json!({"depth": 0}), "issuanceBudget.depth"),
        (
            json!({"rate": 500, "peakPerSecond": 100}),
            "peakPerSecond must be at least rate",
        ),
    ] {
        let mut spec = upgrade();
        spec["issuanceBudget"] = budget.clone();
        let (_, errs) = check(&s, object("RevisionUpgrade", spec));
        assert!(
            errs.iter().any(|e| e.contains(needle)),
            "{budget}: {errs:?}"
        );
    }
    let mut pin = bundle_pin();
    pin["release"] = json!(true);
    let (_, errs) = check(&schema("bundlepins"), object("BundlePin", pin));
    assert!(
        errs.iter().any(|e| e.contains("releaseReason is required")),
        "{errs:?}"
    );
}
