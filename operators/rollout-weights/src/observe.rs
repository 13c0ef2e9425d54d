//! Turns what the reconcile read (the route of the wired kind, the canary workload) into the
//! state machine's observations: this operator's parts of the route, who last wrote its rules,
//! whether every step's route edit fits the route and the installed CRD, and whether the canary
//! is ready.
//!
//! Pure; never reads the cluster and never decides what to do about what it sees.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde_json::Value;
use sluice_api::v1alpha1::RolloutSpec;

use crate::{
    decide::{RouteObs, RouteState, desired_at},
    route::{Route, RouteKind, Wired},
    route_edit::{self, CrdSupport, Target},
};

/// The route target of a Rollout `<namespace>/<name>`.
pub fn target(spec: &RolloutSpec, namespace: &str, name: &str) -> Target {
    Target {
        owner: format!("{namespace}/{name}"),
        stable: spec.stable_service.name.clone(),
        canary: spec.canary_service.name.clone(),
        canary_port: spec.canary_service.port,
        rule_name: spec.route_ref.rule_name.clone(),
        zero_other_backends: spec.zero_other_backends,
    }
}

/// The field manager that owns `spec.rules` (an atomic list: whoever wrote it last owns all
/// of it). With several claimants (an old apiserver), the newest entry wins.
pub fn rules_writer(meta: &ObjectMeta) -> Option<String> {
    meta.managed_fields
        .iter()
        .flatten()
        .filter(|e| {
            e.fields_v1
                .as_ref()
                .is_some_and(|f| f.0.get("f:spec").and_then(|s| s.get("f:rules")).is_some())
        })
        .max_by_key(|e| e.time.as_ref().map(|t| t.0))
        .and_then(|e| e.manager.clone())
}

/// The state machine's view of the route: this operator's parts, or why it cannot be governed
/// (no managed rule, or a step whose edit does not fit the route or the installed CRD, or a
/// mirror step that would take requests from a rule of one of `others`, the routes that may
/// share the route's parent and hostname).
pub fn route(
    route: &Route,
    others: &[Route],
    target: &Target,
    spec: &RolloutSpec,
    crd: CrdSupport,
) -> RouteObs {
    let observed = match route_edit::observe(route, target) {
        Ok(o) => o,
        Err(e) => {
            return RouteObs::Unusable {
                reason: e.category(),
                message: e.to_string(),
                state: None,
            };
        }
    };
    // An absent weight is 1 to the data plane.
    let canary_weight = Wired::weight(route, observed.rule_index, &target.canary)
        .map_or(0, |w| u32::try_from(w.unwrap_or(1)).unwrap_or(0));
    let state = RouteState {
        resource_version: route.metadata.resource_version.clone(),
        owner: observed.owner,
        me: target.owner.clone(),
        canary_weight,
        cohort: observed.cohort,
        mirror: observed.mirror,
        last_writer: rules_writer(&route.metadata),
    };
    for index in 0..spec.steps.len() {
        let desired = desired_at(spec, index);
        let fits = route_edit::apply(route, target, &desired, crd)
            .and_then(|_| route_edit::mirror_clash(route, others, target, &desired));
        if let Err(e) = fits {
            return RouteObs::Unusable {
                reason: e.category(),
                message: format!("step {index}: {e}"),
                state: Some(state),
            };
        }
    }
    RouteObs::Present(state)
}

/// Whether a workload (Deployment, StatefulSet, or any kind with the same status fields) is
/// ready: its controller saw the current generation, and every desired replica is updated and
/// ready. A workload that wants 0 replicas is not ready to take traffic.
pub fn workload_ready(obj: &Value) -> bool {
    let generation = obj["metadata"]["generation"].as_i64();
    let status = &obj["status"];
    let observed = status["observedGeneration"].as_i64();
    if let (Some(g), Some(o)) = (generation, observed)
        && o < g
    {
        return false;
    }
    let desired = obj["spec"]["replicas"].as_i64().unwrap_or(1);
    let ready = status["readyReplicas"].as_i64().unwrap_or(0);
    let updated = status["updatedReplicas"].as_i64().unwrap_or(ready);
    desired > 0 && ready >= desired && updated >= desired
}

/// FNV-1a (64 bit) of `bytes`, hex: a change detector kept in status, stable across builds and
/// operator versions (never used for security).
pub fn fnv_hex(bytes: &[u8]) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in bytes {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    format!("{h:016x}")
}

/// `v` as JSON text with every object's keys sorted, so equal content hashes equally whatever
/// order the API server returned it in.
fn canonical(v: &Value, out: &mut String) {
    match v {
        Value::Object(m) => {
            let mut keys: Vec<&String> = m.keys().collect();
            keys.sort();
            out.push('{');
            for (i, k) in keys.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                out.push_str(&Value::from(k.as_str()).to_string());
                out.push(':');
                canonical(&m[k], out);
            }
            out.push('}');
        }
        Value::Array(a) => {
            out.push('[');
            for (i, x) in a.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                canonical(x, out);
            }
            out.push(']');
        }
        other => out.push_str(&other.to_string()),
    }
}

/// Removes nulls and empty objects, bottom-up: an absent field, a null and an empty map are the
/// same content (API servers and clients differ on which they write).
fn prune(v: &mut Value) {
    if let Value::Object(m) = v {
        for x in m.values_mut() {
            prune(x);
        }
        m.retain(|_, x| !(x.is_null() || x.as_object().is_some_and(|o| o.is_empty())));
    } else if let Value::Array(a) = v {
        a.iter_mut().for_each(prune);
    }
}

fn hash_of(v: &Value) -> String {
    let mut v = v.clone();
    prune(&mut v);
    let mut text = String::new();
    canonical(&v, &mut text);
    fnv_hex(text.as_bytes())
}

/// The hash of a Rollout's steps (`status.stepsHash`).
pub fn steps_hash(spec: &RolloutSpec) -> String {
    hash_of(&serde_json::to_value(&spec.steps).unwrap_or_default())
}

/// Whether a pod-template annotation or label is set by something other than a new version:
/// a rollout restart (`kubectl.kubernetes.io/restartedAt`) or Istio's sidecar injection and
/// revision moves (`sidecar.istio.io/*`, `istio.io/*`, `proxy.istio.io/*`, and the `traffic.`
/// and `status.` prefixes of `sidecar.istio.io`).
fn ignored_key(key: &str) -> bool {
    key == "kubectl.kubernetes.io/restartedAt"
        || ["istio.io/", "sidecar.istio.io/", "proxy.istio.io/"]
            .iter()
            .any(|p| key.starts_with(p) || key.contains(&format!(".{p}")))
}

/// The canary version of a workload object (Deployment, StatefulSet, or any kind with
/// `spec.template`): the hash of its pod template without the restart and injector keys.
/// `None` when it has no pod template.
pub fn workload_version(obj: &Value) -> Option<String> {
    let mut template = obj.get("spec")?.get("template")?.clone();
    if let Some(meta) = template.get_mut("metadata").and_then(Value::as_object_mut) {
        for field in ["annotations", "labels"] {
            if let Some(m) = meta.get_mut(field).and_then(Value::as_object_mut) {
                m.retain(|k, _| !ignored_key(k));
            }
        }
        meta.remove("creationTimestamp");
    }
    Some(hash_of(&template))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use sluice_api::external::http_route::HttpRoute;

    fn spec(steps: Value) -> RolloutSpec {
        serde_json::from_value(json!({
            "routeRef": {"name": "checkout"},
            "stableService": {"name": "v1"},
            "canaryService": {"name": "v2"},
            "canaryWorkload": {"name": "v2"},
            "steps": steps,
        }))
        .unwrap()
    }

    fn http_route(extra_rules: usize, canary_weight: Option<i32>) -> HttpRoute {
        let mut backends = vec![json!({"name": "v1", "port": 80, "weight": 100})];
        if let Some(w) = canary_weight {
            backends.push(json!({"name": "v2", "port": 80, "weight": w}));
        }
        let mut rules = vec![json!({"backendRefs": backends})];
        for i in 0..extra_rules {
            rules.push(json!({"matches": [{"path": {"type": "PathPrefix", "value": format!("/x{i}")}}], "backendRefs": [{"name": "other", "port": 80}]}));
        }
        serde_json::from_value(json!({
            "apiVersion": "gateway.networking.k8s.io/v1",
            "kind": "HTTPRoute",
            "metadata": {
                "name": "checkout", "namespace": "shop", "resourceVersion": "9",
                "managedFields": [
                    {"manager": "argocd-controller", "operation": "Apply", "time": "2026-01-01T00:00:00Z",
                     "fieldsType": "FieldsV1", "fieldsV1": {"f:spec": {"f:hostnames": {}}}},
                    {"manager": "sluice-revert", "operation": "Apply", "time": "2026-01-01T00:00:05Z",
                     "fieldsType": "FieldsV1", "fieldsV1": {"f:spec": {"f:rules": {}}}}
                ]
            },
            "spec": {"rules": rules}
        }))
        .unwrap()
    }

    #[test]
    fn route_observation_table() {
        let weights = json!([{"setWeight": {"weight": 5}}]);
        let cohort = json!([{"headerCohort": {"header": {"name": "x-cohort", "value": "staff"}}}, {"setWeight": {"weight": 5}}]);
        let mirror = json!([{"mirror": {"percent": 10}}, {"setWeight": {"weight": 5}}]);
        let old_crd = CrdSupport {
            rule_name: false,
            mirror_percent: false,
        };
        let names_only = CrdSupport {
            rule_name: true,
            mirror_percent: false,
        };
        // (name, route, spec, crd, want: Ok(canary weight) or Err(reason))
        type Row = (
            &'static str,
            HttpRoute,
            Value,
            CrdSupport,
            Result<u32, &'static str>,
        );
        let table: Vec<Row> = vec![
            (
                "fresh route",
                http_route(0, None),
                weights.clone(),
                CrdSupport::ALL,
                Ok(0),
            ),
            (
                "canary at 5",
                http_route(0, Some(5)),
                weights.clone(),
                CrdSupport::ALL,
                Ok(5),
            ),
            (
                "cohort on an old CRD",
                http_route(0, None),
                cohort.clone(),
                old_crd,
                Err("RouteFieldPruned"),
            ),
            (
                "mirror percent pruned",
                http_route(0, None),
                mirror.clone(),
                names_only,
                Err("RouteFieldPruned"),
            ),
            (
                "no room for the cohort rule",
                http_route(15, None),
                cohort,
                CrdSupport::ALL,
                Err("RouteFull"),
            ),
            (
                "room for weights only",
                http_route(15, None),
                weights,
                CrdSupport::ALL,
                Ok(0),
            ),
        ];
        for (name, r, steps, crd, want) in table {
            let s = spec(steps);
            let got = route(&r, &[], &target(&s, "shop", "checkout"), &s, crd);
            match (got, want) {
                (RouteObs::Present(state), Ok(w)) => {
                    assert_eq!(state.canary_weight, w, "{name}");
                    assert_eq!(state.me, "shop/checkout", "{name}");
                    assert_eq!(state.resource_version.as_deref(), Some("9"), "{name}");
                }
                (
                    RouteObs::Unusable {
                        reason,
                        message,
                        state,
                    },
                    Err(want),
                ) => {
                    assert_eq!(reason, want, "{name}: {message}");
                    assert!(state.is_some(), "{name}: the route's parts were read");
                    assert!(message.starts_with("step 0: "), "{name}: {message}");
                }
                (got, want) => panic!("{name}: got {got:?}, want {want:?}"),
            }
        }
    }

    #[test]
    fn rules_writer_is_the_owner_of_spec_rules() {
        let r = http_route(0, None);
        assert_eq!(rules_writer(&r.metadata).as_deref(), Some("sluice-revert"));
        let mut none = r.metadata.clone();
        none.managed_fields = None;
        assert_eq!(rules_writer(&none), None);
    }

    #[test]
    fn workload_readiness_table() {
        let table = [
            (
                "ready",
                json!({"metadata": {"generation": 2}, "spec": {"replicas": 2}, "status": {"observedGeneration": 2, "readyReplicas": 2, "updatedReplicas": 2}}),
                true,
            ),
            (
                "generation not yet observed",
                json!({"metadata": {"generation": 3}, "spec": {"replicas": 2}, "status": {"observedGeneration": 2, "readyReplicas": 2, "updatedReplicas": 2}}),
                false,
            ),
            (
                "one replica short",
                json!({"metadata": {"generation": 1}, "spec": {"replicas": 2}, "status": {"observedGeneration": 1, "readyReplicas": 1, "updatedReplicas": 2}}),
                false,
            ),
            (
                "old replicas ready",
                json!({"metadata": {"generation": 1}, "spec": {"replicas": 2}, "status": {"observedGeneration": 1, "readyReplicas": 2, "updatedReplicas": 1}}),
                false,
            ),
            (
                "no status yet",
                json!({"metadata": {"generation": 1}, "spec": {"replicas": 1}}),
                false,
            ),
            (
                "scaled to zero",
                json!({"metadata": {"generation": 1}, "spec": {"replicas": 0}, "status": {"observedGeneration": 1}}),
                false,
            ),
            (
                "replicas default to 1",
                json!({"metadata": {}, "spec": {}, "status": {"readyReplicas": 1}}),
                true,
            ),
        ];
        for (name, obj, want) in table {
            assert_eq!(workload_ready(&obj), want, "{name}");
        }
    }

    #[test]
    fn canary_version_ignores_restarts_and_the_injector() {
        let base = json!({"spec": {"template": {
            "metadata": {"labels": {"app": "v2"}, "annotations": {"team": "a"}},
            "spec": {"containers": [{"name": "app", "image": "example/app:2.14"}]}
        }}});
        let v0 = workload_version(&base).unwrap();
        let with = |f: &dyn Fn(&mut Value)| {
            let mut v = base.clone();
            f(&mut v);
            workload_version(&v).unwrap()
        };
        let bare = json!({"spec": {"template": {"spec": {"containers": [{"name": "app", "image": "example/app:2.14"}]}}}});
        let mut restarted = bare.clone();
        restarted["spec"]["template"]["metadata"] =
            json!({"annotations": {"kubectl.kubernetes.io/restartedAt": "2026-12-01T00:00:00Z"}});
        assert_eq!(
            workload_version(&restarted),
            workload_version(&bare),
            "a first restart adds only an ignored annotation"
        );
        let same = [
            with(&|v| v["spec"]["template"]["metadata"]["annotations"]["kubectl.kubernetes.io/restartedAt"] = json!("2026-12-01T00:00:00Z")),
            with(&|v| v["spec"]["template"]["metadata"]["annotations"]["sidecar.istio.io/status"] = json!("{\"revision\":\"1-28\"}")),
            with(&|v| v["spec"]["template"]["metadata"]["labels"]["istio.io/rev"] = json!("1-28")),
            with(&|v| v["spec"]["template"]["metadata"]["annotations"]["proxy.istio.io/config"] = json!("{}")),
            with(&|v| v["spec"]["replicas"] = json!(7)),
            // Key order is not content.
            serde_json::from_str::<Value>(r#"{"spec": {"template": {"spec": {"containers": [{"image": "example/app:2.14", "name": "app"}]}, "metadata": {"annotations": {"team": "a"}, "labels": {"app": "v2"}}}}}"#).map(|v| workload_version(&v).unwrap()).unwrap(),
        ];
        for (i, h) in same.iter().enumerate() {
            assert_eq!(*h, v0, "case {i}: not a new version");
        }
        let new_image = with(&|v| {
            v["spec"]["template"]["spec"]["containers"][0]["image"] = json!("example/app:2.15")
        });
        let new_env = with(&|v| {
            v["spec"]["template"]["spec"]["containers"][0]["env"] =
                json!([{"name": "X", "value": "1"}])
        });
        let new_label =
            with(&|v| v["spec"]["template"]["metadata"]["labels"]["version"] = json!("2.15"));
        for h in [new_image, new_env, new_label] {
            assert_ne!(h, v0, "a new version");
        }
        assert_eq!(workload_version(&json!({"spec": {}})), None);
        assert_eq!(fnv_hex(b""), "cbf29ce484222325");
    }
}
