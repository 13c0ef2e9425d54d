//! The generated CRDs' schemas and CEL rules behave as intended when an API server (here the
//! project's emulator, which compiles every rule and refuses functions it cannot evaluate)
//! defaults and validates objects: valid objects pass with defaults applied, and each
//! cross-field rule rejects the object it is meant to reject, naming the field.

use kube_emulator::validation::CrdSchema;
use serde_json::{Value, json};
use sluice_api::crds;

mod cel_cases;
use cel_cases::*;

fn schema(plural: &str) -> CrdSchema {
    let crd = crds::all()
        .into_iter()
        .find(|c| c.spec.names.plural == plural)
        .unwrap_or_else(|| panic!("no CRD {plural}"));
    let v = serde_json::to_value(&crd).unwrap();
    CrdSchema::from_crd_version(&v, "v1alpha1")
        .unwrap_or_else(|e| panic!("{plural}: the schema does not load: {e}"))
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

#[test]
fn cross_field_rules_reject_what_they_should() {
    let cases = rejections();
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
    for (budget, needle) in budget_rejections() {
        let mut spec = upgrade();
        spec["issuanceBudget"] = budget.clone();
        let (_, errs) = check(&s, object("RevisionUpgrade", spec));
        assert!(
            errs.iter().any(|e| e.contains(needle)),
            "{budget}: {errs:?}"
        );
    }
    let (pin, needle) = release_without_reason();
    let (_, errs) = check(&schema("bundlepins"), object("BundlePin", pin));
    assert!(errs.iter().any(|e| e.contains(needle)), "{errs:?}");
}

/// An emergency an Argo CD action wrote stays on the live object when Git moves
/// `spec.revision` (ignoreDifferences): that update is accepted while the emergency is
/// unchanged, and wave-gate ignores it; an emergency written or changed in the same update must
/// still name the current revision.
#[test]
fn a_stale_emergency_may_stay_when_the_revision_moves() {
    let s = schema("wavegates");
    let emergency = json!({"revision": digest('a'), "reason": "CVE fix"});
    let old = object(
        "WaveGate",
        set(wave_gate(), "/emergency", emergency.clone()),
    );
    let moved = |e: Option<Value>| {
        let mut spec = set(wave_gate(), "/revision", json!(digest('b')));
        if let Some(e) = e {
            spec["emergency"] = e;
        }
        object("WaveGate", spec)
    };
    let update = |old: &Value, new: Value| {
        s.validate(&new, Some(old))
            .into_iter()
            .map(|e| format!("{}: {}", e.path, e.body()))
            .collect::<Vec<_>>()
    };
    let needle = "emergency.revision must equal spec.revision";

    let errs = update(&old, moved(Some(emergency.clone())));
    assert!(errs.is_empty(), "unchanged stale emergency: {errs:?}");

    let errs = update(&old, moved(None));
    assert!(errs.is_empty(), "emergency removed: {errs:?}");

    let changed = json!({"revision": digest('a'), "reason": "another reason"});
    let errs = update(&old, moved(Some(changed)));
    assert!(
        errs.iter().any(|e| e.contains(needle)),
        "changed stale emergency: {errs:?}"
    );

    let without = object("WaveGate", wave_gate());
    let errs = update(&without, moved(Some(emergency)));
    assert!(
        errs.iter().any(|e| e.contains(needle)),
        "new emergency for the old revision: {errs:?}"
    );

    let current = json!({"revision": digest('b'), "reason": "CVE fix"});
    let errs = update(&without, moved(Some(current)));
    assert!(
        errs.is_empty(),
        "new emergency for the new revision: {errs:?}"
    );
}

#[test]
fn additional_routes_of_distinct_kind_or_name_pass() {
    // The same name under another kind is another route; none is routeRef.
    let spec = set(
        rollout(),
        "/additionalRoutes",
        json!([
            {"name": "checkout-mesh"},
            {"kind": "GRPCRoute", "name": "checkout-mesh"},
            {"kind": "GRPCRoute", "name": "checkout"}
        ]),
    );
    let (r, errs) = check(&schema("rollouts"), object("Rollout", spec));
    assert!(errs.is_empty(), "{errs:?}");
    assert_eq!(r["spec"]["additionalRoutes"][0]["name"], "checkout-mesh");
}
