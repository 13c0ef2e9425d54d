//! The released Gateway API and Argo CD CRDs load, every CEL rule in them compiles, and good and
//! bad objects are accepted or rejected with kube-apiserver's wording.
//!
//! The CRDs are the released files `scripts/install-tools.sh` fetches into `.tools/crds/`; when
//! they are missing a test fails under CI and is skipped and counted otherwise.

use std::path::PathBuf;

use kube_emulator::validation::{CrdSchema, FieldError, invalid_status};
use serde_json::{Value, json};

fn upstream_dir() -> Option<PathBuf> {
    sluice_testkit::prereq::or_skip(sluice_testkit::prereq::upstream_crds())
}

fn load_crds(file: &str) -> Option<Vec<Value>> {
    let path = upstream_dir()?.join(file);
    let text =
        std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
    let docs = serde_yaml::Deserializer::from_str(&text)
        .map(|d| {
            let v: serde_yaml::Value = serde::Deserialize::deserialize(d).expect("valid YAML");
            serde_json::to_value(v).expect("YAML converts to JSON")
        })
        .filter(|v: &Value| !v.is_null())
        .collect();
    Some(docs)
}

fn schema(file: &str, version: &str) -> Option<CrdSchema> {
    let crds = load_crds(file)?;
    Some(
        CrdSchema::from_crd_version(&crds[0], version)
            .unwrap_or_else(|e| panic!("{file} {version}: {e}")),
    )
}

fn count_rules(v: &Value) -> usize {
    match v {
        Value::Object(m) => {
            let here = m
                .get("x-kubernetes-validations")
                .and_then(Value::as_array)
                .map_or(0, Vec::len);
            here + m
                .iter()
                .filter(|(k, _)| k.as_str() != "x-kubernetes-validations")
                .map(|(_, v)| count_rules(v))
                .sum::<usize>()
        }
        Value::Array(a) => a.iter().map(count_rules).sum(),
        _ => 0,
    }
}

const FILES: &[&str] = &[
    "gateway-api-v1.6.1/gateway.networking.k8s.io_httproutes.yaml",
    "gateway-api-v1.6.1/gateway.networking.k8s.io_grpcroutes.yaml",
    "argo-cd-v3.5.1/application-crd.yaml",
    "argo-cd-v3.5.1/applicationset-crd.yaml",
];

#[test]
fn every_upstream_crd_version_compiles_with_every_rule() {
    let mut total_rules = 0;
    for file in FILES {
        let Some(crds) = load_crds(file) else { return };
        for crd in &crds {
            for version in crd
                .pointer("/spec/versions")
                .and_then(Value::as_array)
                .expect("versions")
            {
                let name = version["name"].as_str().expect("version name");
                total_rules += count_rules(version);
                if let Err(e) = CrdSchema::from_crd_version(crd, name) {
                    panic!("{file} {name}: {e}");
                }
            }
        }
    }
    assert!(
        total_rules > 100,
        "expected the Gateway API rules to be found, got {total_rules}"
    );
    println!(
        "compiled {total_rules} CEL rules across {} files",
        FILES.len()
    );
}

fn route(rules: Value) -> Value {
    json!({
        "apiVersion": "gateway.networking.k8s.io/v1",
        "kind": "HTTPRoute",
        "metadata": {"name": "checkout", "namespace": "shop"},
        "spec": {
            "parentRefs": [{"name": "mesh-gateway", "namespace": "istio-system"}],
            "hostnames": ["checkout.example.com"],
            "rules": rules
        }
    })
}

fn canary_rules() -> Value {
    json!([{
        "matches": [{"path": {"type": "PathPrefix", "value": "/"}}],
        "backendRefs": [
            {"name": "checkout-stable", "port": 8080, "weight": 95},
            {"name": "checkout-canary", "port": 8080, "weight": 5}
        ],
        "timeouts": {"request": "10s", "backendRequest": "2s"}
    }, {
        "matches": [{"headers": [{"name": "x-cohort", "value": "staff"}]}],
        "backendRefs": [{"name": "checkout-canary", "port": 8080}]
    }])
}

fn check(schema: &CrdSchema, obj: &Value, old: Option<&Value>) -> Vec<String> {
    let mut obj = obj.clone();
    schema.default_and_prune(&mut obj);
    schema
        .validate(&obj, old)
        .iter()
        .map(FieldError::to_string)
        .collect()
}

#[test]
fn a_canary_httproute_is_accepted_and_defaulted() {
    let Some(schema) = schema(FILES[0], "v1") else {
        return;
    };
    let mut obj = route(canary_rules());
    obj["spec"]["unknownField"] = json!(true);
    schema.default_and_prune(&mut obj);
    assert!(
        obj["spec"].get("unknownField").is_none(),
        "unknown fields are pruned"
    );
    assert_eq!(
        obj["spec"]["parentRefs"][0]["group"], "gateway.networking.k8s.io",
        "defaults applied"
    );
    assert_eq!(obj["spec"]["parentRefs"][0]["kind"], "Gateway");
    assert_eq!(
        obj["spec"]["rules"][1]["matches"][0]["path"],
        json!({"type": "PathPrefix", "value": "/"})
    );
    let errors = schema.validate(&obj, None);
    assert!(errors.is_empty(), "unexpected errors: {errors:?}");

    // A route without rules gets the default rule and is valid.
    let mut bare = route(json!(null));
    bare["spec"].as_object_mut().unwrap().remove("rules");
    assert!(check(&schema, &bare, None).is_empty());
}

#[test]
fn bad_httproutes_are_rejected_with_the_apiservers_wording() {
    let Some(schema) = schema(FILES[0], "v1") else {
        return;
    };
    let cases: Vec<(&str, Value, &str)> = vec![
        (
            "redirect together with backendRefs",
            route(json!([{
                "filters": [{"type": "RequestRedirect", "requestRedirect": {"statusCode": 301}}],
                "backendRefs": [{"name": "svc", "port": 80}]
            }])),
            "spec.rules[0]: Invalid value: RequestRedirect filter must not be used together with backendRefs",
        ),
        (
            "relative path",
            route(json!([{"matches": [{"path": {"type": "PathPrefix", "value": "api"}}]}])),
            "spec.rules[0].matches[0].path: Invalid value: value must be an absolute path and start with '/' when type one of ['Exact', 'PathPrefix']",
        ),
        (
            "backend timeout longer than request timeout (duration())",
            route(json!([{"timeouts": {"request": "1s", "backendRequest": "5s"}}])),
            "spec.rules[0].timeouts: Invalid value: backendRequest timeout cannot be longer than request timeout",
        ),
        (
            "same parent twice without sectionName (__namespace__ escaping)",
            json!({
                "apiVersion": "gateway.networking.k8s.io/v1", "kind": "HTTPRoute",
                "metadata": {"name": "checkout"},
                "spec": {"parentRefs": [
                    {"name": "gw", "namespace": "istio-system", "sectionName": "http"},
                    {"name": "gw", "namespace": "istio-system"}
                ]}
            }),
            "spec.parentRefs: Invalid value: sectionName must be specified when parentRefs includes 2 or more references to the same parent",
        ),
        (
            "weight above maximum",
            route(json!([{"backendRefs": [{"name": "svc", "port": 80, "weight": 1000001}]}])),
            "spec.rules[0].backendRefs[0].weight: Invalid value: 1000001: spec.rules[0].backendRefs[0].weight in body should be less than or equal to 1000000",
        ),
        (
            "too many rules",
            route(Value::Array(
                (0..17)
                    .map(|_| json!({"backendRefs": [{"name": "svc", "port": 80}]}))
                    .collect(),
            )),
            "spec.rules: Too many: 17: must have at most 16 items",
        ),
        (
            "Service backend without port",
            route(json!([{"backendRefs": [{"name": "svc"}]}])),
            "spec.rules[0].backendRefs[0]: Invalid value: Must have port for Service reference",
        ),
        (
            "filter type without its config",
            route(json!([{"filters": [{"type": "RequestHeaderModifier"}]}])),
            "spec.rules[0].filters[0]: Invalid value: filter.requestHeaderModifier must be specified for RequestHeaderModifier filter.type",
        ),
        (
            "path type not in enum",
            route(json!([{"matches": [{"path": {"type": "Glob", "value": "/"}}]}])),
            "spec.rules[0].matches[0].path.type: Unsupported value: \"Glob\": supported values: \"Exact\", \"PathPrefix\", \"RegularExpression\"",
        ),
        (
            "weight of the wrong type",
            route(json!([{"backendRefs": [{"name": "svc", "port": 80, "weight": "five"}]}])),
            "spec.rules[0].backendRefs[0].weight: Invalid value: \"string\": spec.rules[0].backendRefs[0].weight in body must be of type integer: \"string\"",
        ),
        (
            "backendRef name missing",
            route(json!([{"backendRefs": [{"port": 80}]}])),
            "spec.rules[0].backendRefs[0].name: Required value",
        ),
    ];
    for (what, obj, want) in cases {
        let got = check(&schema, &obj, None);
        assert!(
            got.iter().any(|g| g == want),
            "{what}: want {want:?}\n got {got:#?}"
        );
    }
}

#[test]
fn the_422_status_matches_kube_apiserver() {
    let Some(schema) = schema(FILES[0], "v1") else {
        return;
    };
    let mut obj = route(json!([{
        "filters": [{"type": "RequestRedirect", "requestRedirect": {"statusCode": 301}}],
        "backendRefs": [{"name": "svc", "port": 80}]
    }]));
    schema.default_and_prune(&mut obj);
    let errors = schema.validate(&obj, None);
    let status = invalid_status(
        "httproutes.gateway.networking.k8s.io",
        "HTTPRoute",
        "checkout",
        &errors,
    );
    assert_eq!(status["code"], 422);
    assert_eq!(
        status["message"],
        "HTTPRoute.gateway.networking.k8s.io \"checkout\" is invalid: spec.rules[0]: Invalid value: RequestRedirect filter must not be used together with backendRefs"
    );
    assert_eq!(status["details"]["causes"][0]["field"], "spec.rules[0]");
}

#[test]
fn ratcheting_keeps_an_unchanged_invalid_value_updatable() {
    let Some(schema) = schema(FILES[0], "v1") else {
        return;
    };
    let mut bad = route(json!([{"backendRefs": [{"name": "svc"}]}]));
    schema.default_and_prune(&mut bad);
    assert!(!schema.validate(&bad, None).is_empty());
    let mut relabelled = bad.clone();
    relabelled["spec"]["hostnames"] = json!(["other.example.com"]);
    assert!(
        schema.validate(&relabelled, Some(&bad)).is_empty(),
        "unchanged rules are not judged again"
    );
}

#[test]
fn grpcroute_rules_evaluate() {
    let Some(schema) = schema(FILES[1], "v1") else {
        return;
    };
    let good = json!({
        "apiVersion": "gateway.networking.k8s.io/v1", "kind": "GRPCRoute", "metadata": {"name": "g"},
        "spec": {"rules": [{"matches": [{"method": {"service": "foo.Bar", "method": "Get"}}], "backendRefs": [{"name": "svc", "port": 9000}]}]}
    });
    assert!(
        check(&schema, &good, None).is_empty(),
        "{:?}",
        check(&schema, &good, None)
    );
    let bad = json!({
        "apiVersion": "gateway.networking.k8s.io/v1", "kind": "GRPCRoute", "metadata": {"name": "g"},
        "spec": {"rules": [{"matches": [{"method": {"service": "foo/Bar", "method": "Get"}}]}]}
    });
    let got = check(&schema, &bad, None);
    let want = "spec.rules[0].matches[0].method: Invalid value: service must only contain valid characters (matching ^(?i)\\.?[a-z_][a-z_0-9]*(\\.[a-z_][a-z_0-9]*)*$)";
    assert!(got.iter().any(|g| g == want), "{got:#?}");
}

#[test]
fn argo_cd_applications_are_validated() {
    let Some(schema) = schema(FILES[2], "v1alpha1") else {
        return;
    };
    let good = json!({
        "apiVersion": "argoproj.io/v1alpha1", "kind": "Application",
        "metadata": {"name": "mesh-config", "namespace": "argocd"},
        "spec": {
            "project": "mesh",
            "destination": {"server": "https://kubernetes.default.svc", "namespace": "istio-system"},
            "source": {"repoURL": "oci://registry.internal/mesh/bundle", "targetRevision": "sha256:abc", "path": "."},
            "syncPolicy": {"automated": {"selfHeal": true, "prune": true}, "syncOptions": ["RespectIgnoreDifferences=true"]},
            "ignoreDifferences": [{"group": "gateway.networking.k8s.io", "kind": "HTTPRoute", "managedFieldsManagers": ["sluice-rollout-weights"]}]
        }
    });
    let errors = check(&schema, &good, None);
    assert!(errors.is_empty(), "{errors:#?}");

    let mut bad = good.clone();
    bad["spec"].as_object_mut().unwrap().remove("project");
    let mut defaulted = bad.clone();
    schema.default_and_prune(&mut defaulted);
    let errors = schema.validate(&defaulted, None);
    let status = invalid_status(
        "applications.argoproj.io",
        "Application",
        "mesh-config",
        &errors,
    );
    assert_eq!(
        status["message"],
        "Application.argoproj.io \"mesh-config\" is invalid: spec.project: Required value"
    );

    let Some(appset) = schema_opt_appset() else {
        return;
    };
    let set = json!({
        "apiVersion": "argoproj.io/v1alpha1", "kind": "ApplicationSet", "metadata": {"name": "mesh"},
        "spec": {
            "generators": [{"clusterDecisionResource": {"configMapRef": "sluice-wavegate", "name": "site-a", "requeueAfterSeconds": 30}}],
            "syncPolicy": {"applicationsSync": "create-update", "preserveResourcesOnDeletion": true},
            "template": {"metadata": {"name": "{{.clusterName}}-mesh"}, "spec": {
                "project": "mesh", "destination": {"name": "{{.clusterName}}"},
                "source": {"repoURL": "oci://registry.internal/mesh/bundle", "targetRevision": "{{.revision}}"}
            }}
        }
    });
    let errors = check(&appset, &set, None);
    assert!(errors.is_empty(), "{errors:#?}");
}

fn schema_opt_appset() -> Option<CrdSchema> {
    schema(FILES[3], "v1alpha1")
}

/// Prints what validating a canary HTTPRoute costs (defaulting, pruning, schema and all CEL rules).
/// A figure, not an assertion: `cargo test -p kube-emulator --release --test upstream_crds -- --ignored --nocapture`.
#[test]
#[ignore = "prints a measurement; run explicitly"]
fn measure_httproute_validation_cost() {
    let Some(schema) = schema(FILES[0], "v1") else {
        return;
    };
    let obj = route(canary_rules());
    let rounds = 2000;
    let started = std::time::Instant::now();
    for _ in 0..rounds {
        let mut o = obj.clone();
        schema.default_and_prune(&mut o);
        assert!(schema.validate(&o, None).is_empty());
    }
    let create = started.elapsed() / rounds;
    let mut stored = obj.clone();
    schema.default_and_prune(&mut stored);
    let mut changed = stored.clone();
    changed["spec"]["rules"][0]["backendRefs"][1]["weight"] = json!(25);
    let started = std::time::Instant::now();
    for _ in 0..rounds {
        assert!(schema.validate(&changed, Some(&stored)).is_empty());
    }
    let update = started.elapsed() / rounds;
    println!(
        "HTTPRoute v1 canary route: create {create:?} per object, weight update {update:?} per object ({rounds} rounds)"
    );
}
