//! The objects the CEL tests send: a valid object of each kind, and the bad variants each
//! cross-field rule must reject with the text it must contain. Shared by `cel.rs` (the emulator's
//! schema engine) and `cel_real_api_server.rs` (a real kube-apiserver).
#![allow(dead_code)]

use serde_json::{Value, json};

pub fn object(kind: &str, spec: Value) -> Value {
    json!({
        "apiVersion": "sluice.dev/v1alpha1",
        "kind": kind,
        "metadata": {"name": "x", "namespace": "shop"},
        "spec": spec
    })
}

pub fn digest(c: char) -> String {
    format!("sha256:{}", c.to_string().repeat(64))
}

/// Sets `value` at a JSON pointer; the parent must exist (a missing last key is inserted).
pub fn set(mut v: Value, pointer: &str, value: Value) -> Value {
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

pub fn rollout() -> Value {
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

pub fn wave_gate() -> Value {
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

pub fn bundle_pin() -> Value {
    json!({
        "targets": [{"name": "mesh-eu-1"}],
        "bundle": {"repository": "oci://registry.local:5000/mesh/config", "digest": digest('c')},
        "publicKeysSecretRef": {"name": "cosign"},
        "reason": "5xx after change 42"
    })
}

pub fn upgrade() -> Value {
    json!({"fromTag": "stable", "fromRevision": "1-27", "toTag": "canary", "toRevision": "1-28"})
}

/// (case, plural, kind, spec, text the error must contain)
pub type Case = (
    &'static str,
    &'static str,
    &'static str,
    Value,
    &'static str,
);

/// Every bad object of the cross-field rules.
pub fn rejections() -> Vec<Case> {
    vec![
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
            "gRPC method twice",
            "rollouts",
            "Rollout",
            set(
                rollout(),
                "/steps/0/mirror/grpcMethods",
                json!([
                    {"service": "pay.v1.Ledger", "method": "GetBalance"},
                    {"service": "pay.v1.Ledger", "method": "GetBalance"}
                ]),
            ),
            "grpcMethods must be unique",
        ),
        (
            "gRPC service that is not a service name",
            "rollouts",
            "Rollout",
            set(
                rollout(),
                "/steps/0/mirror/grpcMethods",
                json!([{"service": "pay.v1/Ledger", "method": "GetBalance"}]),
            ),
            "should match",
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
            "additional route twice",
            "rollouts",
            "Rollout",
            set(
                rollout(),
                "/additionalRoutes",
                json!([{"name": "checkout-mesh"}, {"kind": "HTTPRoute", "name": "checkout-mesh"}]),
            ),
            "unique by kind and name",
        ),
        (
            "additional route equal to routeRef",
            "rollouts",
            "Rollout",
            set(
                rollout(),
                "/additionalRoutes",
                json!([{"name": "checkout-mesh"}, {"name": "checkout"}]),
            ),
            "must not name the route of routeRef",
        ),
        (
            "eight additional routes",
            "rollouts",
            "Rollout",
            set(
                rollout(),
                "/additionalRoutes",
                json!(
                    (0..8)
                        .map(|i| json!({"name": format!("r{i}")}))
                        .collect::<Vec<_>>()
                ),
            ),
            "additionalRoutes",
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
        (
            "secret key with a slash",
            "bundlepins",
            "BundlePin",
            set(
                bundle_pin(),
                "/publicKeysSecretRef",
                json!({"name": "cosign", "keys": ["cosign/pub"]}),
            ),
            "publicKeysSecretRef.keys[0]",
        ),
        (
            "secret key too long",
            "wavegates",
            "WaveGate",
            set(
                wave_gate(),
                "/pin",
                json!({"publicKeysSecretRef": {"name": "cosign", "keys": ["k".repeat(254)]}}),
            ),
            "pin.publicKeysSecretRef.keys[0]",
        ),
        (
            "selector with 17 labels",
            "revisionupgrades",
            "RevisionUpgrade",
            with_selector(json!({"matchLabels": (0..17)
                .map(|i| (format!("l{i}"), json!("v")))
                .collect::<serde_json::Map<_, _>>()})),
            "waves[0].namespaceSelector.matchLabels",
        ),
        (
            "selector with 17 expressions",
            "revisionupgrades",
            "RevisionUpgrade",
            with_selector(json!({"matchExpressions": (0..17)
                .map(|i| json!({"key": format!("l{i}"), "operator": "Exists"}))
                .collect::<Vec<_>>()})),
            "waves[0].namespaceSelector.matchExpressions",
        ),
        (
            "selector expression with 33 values",
            "revisionupgrades",
            "RevisionUpgrade",
            with_selector(
                json!({"matchExpressions": [{"key": "tier", "operator": "In",
                "values": (0..33).map(|i| format!("v{i}")).collect::<Vec<_>>()}]}),
            ),
            "waves[0].namespaceSelector.matchExpressions[0].values",
        ),
        (
            "base branch read as an option",
            "bundlepins",
            "BundlePin",
            set(
                bundle_pin(),
                "/gitRevert",
                json!({"commit": "abcdef0", "baseBranch": "--upload-pack=x"}),
            ),
            "gitRevert.baseBranch",
        ),
        (
            "emergency for another revision",
            "wavegates",
            "WaveGate",
            set(
                wave_gate(),
                "/emergency",
                json!({"revision": digest('d'), "reason": "CVE fix"}),
            ),
            "emergency.revision must equal spec.revision",
        ),
    ]
}

/// An upgrade whose single wave selects namespaces with `selector`.
fn with_selector(selector: Value) -> Value {
    set(
        upgrade(),
        "/waves",
        json!([{"name": "w", "namespaceSelector": selector}]),
    )
}

/// Bad issuance budgets of a RevisionUpgrade and the text each rejection must contain.
pub fn budget_rejections() -> Vec<(Value, &'static str)> {
    vec![
        (json!({"rate": 0}), "issuanceBudget.rate"),
        (json!({"depth": 0}), "issuanceBudget.depth"),
        (
            json!({"rate": 500, "peakPerSecond": 100}),
            "peakPerSecond must be at least rate",
        ),
    ]
}

/// A BundlePin that releases without saying why, and the text its rejection must contain.
pub fn release_without_reason() -> (Value, &'static str) {
    let mut pin = bundle_pin();
    pin["release"] = json!(true);
    (pin, "releaseReason is required")
}
