//! What each operator may write, as the API server enforces it: the chart's RBAC and admission
//! policies (default values), one table of writes per operator — every write the operator makes
//! (allowed) and one forbidden write per grant wider than its purpose (denied with the policy's
//! message) — run on a real kube-apiserver v1.37.2 and on the emulator's admission engine, which
//! must answer alike. The same table covers the owned-route policy's CREATE, DELETE and
//! field-manager rules for other users, and the reads granted by resource name. On the real
//! server it also checks that charts/sluice/admission/fields.yaml lists every field of the
//! built-in kinds the policies hold unchanged (the server's own OpenAPI is the schema).

use std::time::Duration;

use kube::api::{ApiResource, DeleteParams, DynamicObject, Patch, PatchParams, PostParams};
use kube::{Api, Client};
use serde_json::{Value, json};
use sluice_e2e::{chart, eventually, repo_root, target::Target};

/// Budget of the wait for the real server to enforce newly created policies.
const POLICY_ACTIVE_BUDGET: Duration = Duration::from_secs(30);

/// One row each admission policy of the chart denies at the fixtures' state (the
/// operator-writes policy of each operator, the owned-route and the field-manager policies).
const POLICY_PROBES: &[&str] = &[
    "a Deployment's replicas",
    "an ApplicationSet's template",
    "an Application's prune flag",
    "a route no Rollout owns",
    "someone else creates a route carrying the ownership annotation",
    "someone else writes as field manager sluice-rollout-weights",
];
/// The Argo CD namespace of the default values.
const ARGOCD: &str = "argocd";
const OWNER: &str = "sluice.dev/owned-by-rollout";

fn ar(group: &str, version: &str, kind: &str, plural: &str) -> ApiResource {
    ApiResource {
        group: group.into(),
        version: version.into(),
        api_version: if group.is_empty() {
            version.into()
        } else {
            format!("{group}/{version}")
        },
        kind: kind.into(),
        plural: plural.into(),
    }
}

fn deployments() -> ApiResource {
    ar("apps", "v1", "Deployment", "deployments")
}
fn statefulsets() -> ApiResource {
    ar("apps", "v1", "StatefulSet", "statefulsets")
}
fn daemonsets() -> ApiResource {
    ar("apps", "v1", "DaemonSet", "daemonsets")
}
fn namespaces() -> ApiResource {
    ar("", "v1", "Namespace", "namespaces")
}
fn configmaps() -> ApiResource {
    ar("", "v1", "ConfigMap", "configmaps")
}
fn applications() -> ApiResource {
    ar("argoproj.io", "v1alpha1", "Application", "applications")
}
fn applicationsets() -> ApiResource {
    ar(
        "argoproj.io",
        "v1alpha1",
        "ApplicationSet",
        "applicationsets",
    )
}
fn httproutes() -> ApiResource {
    ar("gateway.networking.k8s.io", "v1", "HTTPRoute", "httproutes")
}
fn grpcroutes() -> ApiResource {
    ar("gateway.networking.k8s.io", "v1", "GRPCRoute", "grpcroutes")
}

/// Who writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Who {
    Operator(&'static str),
    /// The administrator: RBAC lets it do anything, so only the policies stop it.
    Admin,
}

/// One request.
#[derive(Debug, Clone)]
enum Write {
    Merge(Value),
    Json(Value),
    /// Server-side apply under this field manager (forced).
    Apply(&'static str, Value),
    /// Replaces the object with the one read, changed by `edit` (JSON pointer, value; null
    /// removes).
    Replace(Vec<(&'static str, Value)>),
    Create(Value),
    Delete,
    Get,
}

#[derive(Debug, Clone)]
enum Expect {
    Allowed,
    /// Denied by a policy, with this text in the message.
    Denied(&'static str),
    /// Refused by RBAC (403, no policy involved).
    Unauthorized,
}

struct Case {
    what: &'static str,
    who: Who,
    resource: fn() -> ApiResource,
    /// Namespace (empty: cluster-scoped; `{ns}` is the test's namespace).
    namespace: &'static str,
    name: &'static str,
    write: Write,
    expect: Expect,
}

fn deployment(kind: &str, name: &str) -> Value {
    let template = json!({
        "metadata": {"labels": {"app": name}, "annotations": {"sidecar.istio.io/inject": "true"}},
        "spec": {"containers": [{"name": "app", "image": "registry.example/app:1"}]}
    });
    let mut spec = json!({"selector": {"matchLabels": {"app": name}}, "template": template});
    match kind {
        "Deployment" => spec["replicas"] = json!(2),
        "StatefulSet" => {
            spec["replicas"] = json!(1);
            spec["serviceName"] = json!(name);
        }
        _ => {}
    }
    json!({"apiVersion": "apps/v1", "kind": kind, "metadata": {"name": name, "labels": {"team": "a"}}, "spec": spec})
}

fn application() -> Value {
    json!({
        "apiVersion": "argoproj.io/v1alpha1",
        "kind": "Application",
        "metadata": {"name": "shop", "namespace": ARGOCD},
        "operation": {"sync": {"revision": "abc123"}},
        "spec": {
            "project": "default",
            "destination": {"name": "east-1", "namespace": "shop"},
            "source": {"repoURL": "https://git.example/shop.git", "path": "deploy", "targetRevision": "main"},
            "syncPolicy": {"automated": {"enabled": true, "prune": true, "selfHeal": true}}
        },
        "status": {
            "operationState": {
                "operation": {"sync": {"revision": "abc123"}},
                "phase": "Running",
                "startedAt": "2026-12-01T10:00:00Z"
            }
        }
    })
}

fn application_set() -> Value {
    json!({
        "apiVersion": "argoproj.io/v1alpha1",
        "kind": "ApplicationSet",
        "metadata": {"name": "fleet", "namespace": ARGOCD},
        "spec": {
            "generators": [{"list": {"elements": [{"cluster": "east-1"}]}}],
            "template": {
                "metadata": {"name": "shop-{{cluster}}"},
                "spec": {
                    "project": "default",
                    "destination": {"name": "{{cluster}}", "namespace": "shop"},
                    "source": {"repoURL": "https://git.example/shop.git", "path": "deploy", "targetRevision": "main"}
                }
            }
        }
    })
}

fn route(name: &str, owner: Option<&str>) -> Value {
    let mut r = json!({
        "apiVersion": "gateway.networking.k8s.io/v1",
        "kind": "HTTPRoute",
        "metadata": {"name": name},
        "spec": {
            "parentRefs": [{"name": "gw", "namespace": "istio-system"}],
            "hostnames": ["shop.example"],
            "rules": [{"backendRefs": [
                {"name": "shop-v1", "port": 80, "weight": 100},
                {"name": "shop-v2", "port": 80, "weight": 0}
            ]}]
        }
    });
    if let Some(o) = owner {
        r["metadata"]["annotations"] = json!({OWNER: o});
    }
    r
}

fn weights(stable: u32) -> Value {
    json!([{"backendRefs": [
        {"name": "shop-v1", "port": 80, "weight": stable},
        {"name": "shop-v2", "port": 80, "weight": 100 - stable}
    ]}])
}

const UR: Who = Who::Operator("upgrade-revisions");
const WG: Who = Who::Operator("wave-gate");
const RV: Who = Who::Operator("revert");
const RW: Who = Who::Operator("rollout-weights");

const RESTART: &str = "kubectl.kubernetes.io/restartedAt";

fn restart_patch() -> Write {
    Write::Merge(
        json!({"spec": {"template": {"metadata": {"annotations": {RESTART: "2026-12-02T01:00:00Z"}}}}}),
    )
}

/// The table, in order (later rows see what earlier rows wrote).
fn table() -> Vec<Case> {
    let ur_msg = "sluice upgrade-revisions may change only the kubectl.kubernetes.io/restartedAt annotation of the pod template";
    vec![
        // upgrade-revisions: apps patch (rollout restart) on Deployments, StatefulSets, DaemonSets.
        Case {
            what: "rollout restart of a Deployment",
            who: UR,
            resource: deployments,
            namespace: "{ns}",
            name: "web",
            write: restart_patch(),
            expect: Expect::Allowed,
        },
        Case {
            what: "rollout restart of a StatefulSet",
            who: UR,
            resource: statefulsets,
            namespace: "{ns}",
            name: "db",
            write: restart_patch(),
            expect: Expect::Allowed,
        },
        Case {
            what: "rollout restart of a DaemonSet",
            who: UR,
            resource: daemonsets,
            namespace: "{ns}",
            name: "agent",
            write: restart_patch(),
            expect: Expect::Allowed,
        },
        Case {
            what: "a Deployment's pod spec (another ServiceAccount)",
            who: UR,
            resource: deployments,
            namespace: "{ns}",
            name: "web",
            write: Write::Merge(
                json!({"spec": {"template": {"spec": {"serviceAccountName": "cluster-admin"}}}}),
            ),
            expect: Expect::Denied("changes the pod spec"),
        },
        Case {
            what: "a Deployment's replicas",
            who: UR,
            resource: deployments,
            namespace: "{ns}",
            name: "web",
            write: Write::Merge(json!({"spec": {"replicas": 0}})),
            expect: Expect::Denied("changes spec fields other than the pod template"),
        },
        Case {
            what: "a StatefulSet's other pod-template annotation",
            who: UR,
            resource: statefulsets,
            namespace: "{ns}",
            name: "db",
            write: Write::Merge(
                json!({"spec": {"template": {"metadata": {"annotations": {"sidecar.istio.io/inject": "false"}}}}}),
            ),
            expect: Expect::Denied(
                "changes pod-template annotations other than kubectl.kubernetes.io/restartedAt",
            ),
        },
        Case {
            what: "a DaemonSet's host network",
            who: UR,
            resource: daemonsets,
            namespace: "{ns}",
            name: "agent",
            write: Write::Merge(json!({"spec": {"template": {"spec": {"hostNetwork": true}}}})),
            expect: Expect::Denied(ur_msg),
        },
        Case {
            what: "a Deployment's own labels",
            who: UR,
            resource: deployments,
            namespace: "{ns}",
            name: "web",
            write: Write::Merge(json!({"metadata": {"labels": {"team": "b"}}})),
            expect: Expect::Denied(
                "changes labels, annotations, finalizers or owners of the object",
            ),
        },
        // upgrade-revisions: namespaces patch (relabel istio.io/rev).
        Case {
            what: "relabel istio.io/rev (JSON patch test + replace)",
            who: UR,
            resource: namespaces,
            namespace: "",
            name: "{ns}-mesh",
            write: Write::Json(json!([
                {"op": "test", "path": "/metadata/labels/istio.io~1rev", "value": "1-24"},
                {"op": "replace", "path": "/metadata/labels/istio.io~1rev", "value": "1-25"}
            ])),
            expect: Expect::Allowed,
        },
        Case {
            what: "a Namespace's pod-security label",
            who: UR,
            resource: namespaces,
            namespace: "",
            name: "{ns}-mesh",
            write: Write::Json(
                json!([{"op": "remove", "path": "/metadata/labels/pod-security.kubernetes.io~1enforce"}]),
            ),
            expect: Expect::Denied(
                "sluice upgrade-revisions may change only the value of an existing istio.io/rev label of a Namespace; this write to Namespace {ns}-mesh changes labels other than istio.io/rev",
            ),
        },
        Case {
            what: "istio.io/rev added to a Namespace without it",
            who: UR,
            resource: namespaces,
            namespace: "",
            name: "{ns}-plain",
            write: Write::Merge(json!({"metadata": {"labels": {"istio.io/rev": "1-25"}}})),
            expect: Expect::Denied("changes a Namespace without istio.io/rev before or after"),
        },
        // wave-gate: applicationsets patch (refresh nudge).
        Case {
            what: "refresh nudge of an ApplicationSet",
            who: WG,
            resource: applicationsets,
            namespace: ARGOCD,
            name: "fleet",
            write: Write::Merge(
                json!({"metadata": {"annotations": {"argocd.argoproj.io/application-set-refresh": "true"}}}),
            ),
            expect: Expect::Allowed,
        },
        Case {
            what: "an ApplicationSet's template",
            who: WG,
            resource: applicationsets,
            namespace: ARGOCD,
            name: "fleet",
            write: Write::Merge(
                json!({"spec": {"template": {"spec": {"source": {"repoURL": "https://evil.example/x.git"}}}}}),
            ),
            expect: Expect::Denied(
                "sluice wave-gate may change only the argocd.argoproj.io/application-set-refresh annotation of an ApplicationSet; this write to ApplicationSet argocd/fleet changes the spec",
            ),
        },
        Case {
            what: "argocd-cmd-params-cm read (by name)",
            who: WG,
            resource: configmaps,
            namespace: ARGOCD,
            name: "argocd-cmd-params-cm",
            write: Write::Get,
            expect: Expect::Allowed,
        },
        Case {
            what: "another ConfigMap read",
            who: WG,
            resource: configmaps,
            namespace: ARGOCD,
            name: "argocd-rbac-cm",
            write: Write::Get,
            expect: Expect::Unauthorized,
        },
        // revert: applications update/patch.
        Case {
            what: "terminate the running sync",
            who: RV,
            resource: applications,
            namespace: ARGOCD,
            name: "shop",
            write: Write::Merge(json!({"status": {"operationState": {"phase": "Terminating"}}})),
            expect: Expect::Allowed,
        },
        Case {
            what: "suspend automated sync",
            who: RV,
            resource: applications,
            namespace: ARGOCD,
            name: "shop",
            write: Write::Json(
                json!([{"op": "add", "path": "/spec/syncPolicy/automated/enabled", "value": false}]),
            ),
            expect: Expect::Allowed,
        },
        Case {
            what: "clear the operation",
            who: RV,
            resource: applications,
            namespace: ARGOCD,
            name: "shop",
            write: Write::Merge(json!({"operation": null})),
            expect: Expect::Allowed,
        },
        Case {
            what: "refresh annotation",
            who: RV,
            resource: applications,
            namespace: ARGOCD,
            name: "shop",
            write: Write::Merge(
                json!({"metadata": {"annotations": {"argocd.argoproj.io/refresh": "normal"}}}),
            ),
            expect: Expect::Allowed,
        },
        Case {
            what: "restore automated sync as it was (enabled absent)",
            who: RV,
            resource: applications,
            namespace: ARGOCD,
            name: "shop",
            write: Write::Json(
                json!([{"op": "remove", "path": "/spec/syncPolicy/automated/enabled"}]),
            ),
            expect: Expect::Allowed,
        },
        Case {
            what: "an Application's source",
            who: RV,
            resource: applications,
            namespace: ARGOCD,
            name: "shop",
            write: Write::Merge(
                json!({"spec": {"source": {"repoURL": "https://evil.example/x.git"}}}),
            ),
            expect: Expect::Denied(
                "sluice revert may change only spec.syncPolicy.automated.enabled, the removal of operation, status.operationState.phase set to Terminating and the argocd.argoproj.io/refresh annotation of an Application; this write to Application argocd/shop changes spec fields other than syncPolicy",
            ),
        },
        Case {
            what: "an Application's prune flag",
            who: RV,
            resource: applications,
            namespace: ARGOCD,
            name: "shop",
            write: Write::Merge(json!({"spec": {"syncPolicy": {"automated": {"prune": false}}}})),
            expect: Expect::Denied("changes syncPolicy fields other than automated.enabled"),
        },
        Case {
            what: "a new sync operation",
            who: RV,
            resource: applications,
            namespace: ARGOCD,
            name: "shop",
            write: Write::Merge(json!({"operation": {"sync": {"revision": "evil"}}})),
            expect: Expect::Denied("changes operation other than by removing it"),
        },
        Case {
            what: "an operation phase other than Terminating",
            who: RV,
            resource: applications,
            namespace: ARGOCD,
            name: "shop",
            write: Write::Merge(json!({"status": {"operationState": {"phase": "Succeeded"}}})),
            expect: Expect::Denied(
                "changes status other than operationState.phase set to Terminating",
            ),
        },
        Case {
            what: "argocd-cm read (by name)",
            who: RV,
            resource: configmaps,
            namespace: ARGOCD,
            name: "argocd-cm",
            write: Write::Get,
            expect: Expect::Allowed,
        },
        Case {
            what: "argocd-cmd-params-cm read",
            who: RV,
            resource: configmaps,
            namespace: ARGOCD,
            name: "argocd-cmd-params-cm",
            write: Write::Get,
            expect: Expect::Unauthorized,
        },
        // rollout-weights: httproutes update/patch, owned routes only.
        Case {
            what: "take ownership with the weight-0 edit (one read-modify-write)",
            who: RW,
            resource: httproutes,
            namespace: "{ns}",
            name: "checkout",
            write: Write::Replace(vec![
                ("/metadata/annotations", json!({OWNER: "{ns}/checkout"})),
                ("/spec/rules", weights(100)),
            ]),
            expect: Expect::Allowed,
        },
        Case {
            what: "canary weights of an owned route",
            who: RW,
            resource: httproutes,
            namespace: "{ns}",
            name: "checkout",
            write: Write::Replace(vec![("/spec/rules", weights(90))]),
            expect: Expect::Allowed,
        },
        Case {
            what: "an owned route's hostnames",
            who: RW,
            resource: httproutes,
            namespace: "{ns}",
            name: "checkout",
            write: Write::Replace(vec![("/spec/hostnames", json!(["admin.example"]))]),
            expect: Expect::Denied(
                "sluice rollout-weights may change only the spec.rules and the sluice.dev/owned-by-rollout annotation of a route a Rollout owns; this write to HTTPRoute {ns}/checkout changes spec fields other than rules (parentRefs, hostnames)",
            ),
        },
        Case {
            what: "a route no Rollout owns",
            who: RW,
            resource: httproutes,
            namespace: "{ns}",
            name: "free",
            write: Write::Replace(vec![("/spec/rules", weights(50))]),
            expect: Expect::Denied("changes a route no Rollout owns"),
        },
        // Other users on owned routes and sluice field managers (the owned-route policies).
        Case {
            what: "someone else changes owned rules",
            who: Who::Admin,
            resource: httproutes,
            namespace: "{ns}",
            name: "checkout",
            write: Write::Replace(vec![("/spec/rules", weights(10))]),
            expect: Expect::Denied(
                "spec.rules of HTTPRoute {ns}/checkout belong to Rollout {ns}/checkout",
            ),
        },
        Case {
            what: "someone else deletes an owned route",
            who: Who::Admin,
            resource: httproutes,
            namespace: "{ns}",
            name: "checkout",
            write: Write::Delete,
            expect: Expect::Denied(
                "HTTPRoute {ns}/checkout belongs to Rollout {ns}/checkout until that Rollout is deleted",
            ),
        },
        Case {
            what: "someone else creates a route carrying the ownership annotation",
            who: Who::Admin,
            resource: httproutes,
            namespace: "{ns}",
            name: "copied",
            write: Write::Create(route("copied", Some("{ns}/checkout"))),
            expect: Expect::Denied(
                "HTTPRoute {ns}/copied may not be created with annotation sluice.dev/owned-by-rollout",
            ),
        },
        Case {
            what: "someone else writes as field manager sluice-rollout-weights",
            who: Who::Admin,
            resource: httproutes,
            namespace: "{ns}",
            name: "free",
            write: Write::Apply(
                "sluice-rollout-weights",
                json!({"spec": {"hostnames": ["other.example"]}}),
            ),
            expect: Expect::Denied(
                "field manager sluice-rollout-weights on HTTPRoute {ns}/free is reserved for the sluice ServiceAccounts",
            ),
        },
        Case {
            what: "someone else writes a free route under a manager of its own",
            who: Who::Admin,
            resource: httproutes,
            namespace: "{ns}",
            name: "free",
            write: Write::Apply("team-a", json!({"spec": {"hostnames": ["other.example"]}})),
            expect: Expect::Allowed,
        },
        Case {
            what: "someone else creates a GRPCRoute carrying the ownership annotation",
            who: Who::Admin,
            resource: grpcroutes,
            namespace: "{ns}",
            name: "grpc",
            write: Write::Create(json!({
                "apiVersion": "gateway.networking.k8s.io/v1",
                "kind": "GRPCRoute",
                "metadata": {"name": "grpc", "annotations": {OWNER: "{ns}/checkout"}},
                "spec": {"parentRefs": [{"name": "gw", "namespace": "istio-system"}],
                         "rules": [{"backendRefs": [{"name": "shop-v1", "port": 80}]}]}
            })),
            expect: Expect::Denied(
                "GRPCRoute {ns}/grpc may not be created with annotation sluice.dev/owned-by-rollout",
            ),
        },
        // Hand-back last: the route is free again.
        Case {
            what: "hand back (annotation removed)",
            who: RW,
            resource: httproutes,
            namespace: "{ns}",
            name: "checkout",
            write: Write::Replace(vec![("/metadata/annotations", Value::Null)]),
            expect: Expect::Allowed,
        },
    ]
}

fn fill(s: &str, ns: &str) -> String {
    s.replace("{ns}", ns)
}

fn fill_value(v: &Value, ns: &str) -> Value {
    serde_json::from_str(&fill(&v.to_string(), ns)).unwrap()
}

/// The objects every row starts from, created by the administrator.
async fn fixtures(admin: &Client, ns: &str) {
    let pp = PostParams::default();
    let create = |r: ApiResource, namespace: Option<String>, body: Value| {
        let admin = admin.clone();
        async move {
            let api: Api<DynamicObject> = match namespace {
                Some(n) => Api::namespaced_with(admin, &n, &r),
                None => Api::all_with(admin, &r),
            };
            api.create(
                &PostParams::default(),
                &serde_json::from_value(body).unwrap(),
            )
            .await
            .unwrap_or_else(|e| panic!("fixture {}: {e}", r.kind));
        }
    };
    let _ = pp;
    create(
        deployments(),
        Some(ns.into()),
        deployment("Deployment", "web"),
    )
    .await;
    create(
        statefulsets(),
        Some(ns.into()),
        deployment("StatefulSet", "db"),
    )
    .await;
    create(
        daemonsets(),
        Some(ns.into()),
        deployment("DaemonSet", "agent"),
    )
    .await;
    create(
        namespaces(),
        None,
        json!({"metadata": {"name": format!("{ns}-mesh"), "labels": {"istio.io/rev": "1-24", "pod-security.kubernetes.io/enforce": "baseline"}}}),
    )
    .await;
    create(
        namespaces(),
        None,
        json!({"metadata": {"name": format!("{ns}-plain")}}),
    )
    .await;
    create(applicationsets(), Some(ARGOCD.into()), application_set()).await;
    create(applications(), Some(ARGOCD.into()), application()).await;
    create(
        configmaps(),
        Some(ARGOCD.into()),
        json!({"metadata": {"name": "argocd-cm"}, "data": {}}),
    )
    .await;
    create(
        configmaps(),
        Some(ARGOCD.into()),
        json!({"metadata": {"name": "argocd-cmd-params-cm"}, "data": {}}),
    )
    .await;
    create(
        configmaps(),
        Some(ARGOCD.into()),
        json!({"metadata": {"name": "argocd-rbac-cm"}, "data": {}}),
    )
    .await;
    create(httproutes(), Some(ns.into()), route("checkout", None)).await;
    create(httproutes(), Some(ns.into()), route("free", None)).await;
}

fn set_pointer(obj: &mut Value, pointer: &str, value: Value) {
    let (parent, key) = pointer.rsplit_once('/').unwrap();
    let parent = obj.pointer_mut(parent).unwrap().as_object_mut().unwrap();
    if value.is_null() {
        parent.remove(key);
    } else {
        parent.insert(key.to_owned(), value);
    }
}

/// Carries out one row as its writer; the server's answer.
/// One row's request; as a dry run (`dry_run`) it goes through admission and changes nothing.
async fn run(case: &Case, client: Client, ns: &str, dry_run: bool) -> Result<(), kube::Error> {
    let r = (case.resource)();
    let namespace = fill(case.namespace, ns);
    let name = fill(case.name, ns);
    let api: Api<DynamicObject> = if namespace.is_empty() {
        Api::all_with(client, &r)
    } else {
        Api::namespaced_with(client, &namespace, &r)
    };
    // Each operator writes under its own field manager, as the binaries do.
    let manager = match case.who {
        Who::Operator(op) => format!("sluice-{op}"),
        Who::Admin => "kubectl".to_owned(),
    };
    let pp = PatchParams {
        field_manager: Some(manager.clone()),
        dry_run,
        ..PatchParams::default()
    };
    let post = PostParams {
        field_manager: Some(manager),
        dry_run,
    };
    match &case.write {
        Write::Merge(p) => api
            .patch(&name, &pp, &Patch::Merge(fill_value(p, ns)))
            .await
            .map(drop),
        Write::Json(p) => {
            let patch = serde_json::from_value(fill_value(p, ns)).unwrap();
            api.patch(&name, &pp, &Patch::<()>::Json(patch))
                .await
                .map(drop)
        }
        Write::Apply(m, body) => {
            let mut body = fill_value(body, ns);
            body["apiVersion"] = json!(r.api_version);
            body["kind"] = json!(r.kind);
            body["metadata"] = json!({"name": name});
            let pp = PatchParams {
                dry_run,
                ..PatchParams::apply(m).force()
            };
            api.patch(&name, &pp, &Patch::Apply(body)).await.map(drop)
        }
        Write::Replace(edits) => {
            let mut obj = serde_json::to_value(api.get(&name).await?).unwrap();
            for (pointer, value) in edits {
                set_pointer(&mut obj, pointer, fill_value(value, ns));
            }
            api.replace(&name, &post, &serde_json::from_value(obj).unwrap())
                .await
                .map(drop)
        }
        Write::Create(body) => api
            .create(
                &post,
                &serde_json::from_value(fill_value(body, ns)).unwrap(),
            )
            .await
            .map(drop),
        Write::Delete => {
            let dp = DeleteParams {
                dry_run,
                ..DeleteParams::default()
            };
            api.delete(&name, &dp).await.map(drop)
        }
        Write::Get => api.get(&name).await.map(drop),
    }
}

/// Runs the whole table on `target` in namespace `ns`; one line per row that answered
/// otherwise than expected.
async fn run_table(target: &Target, ns: &str) -> Vec<String> {
    let admin = target.admin();
    fixtures(&admin, ns).await;
    let client = |who: Who| match who {
        Who::Admin => admin.clone(),
        Who::Operator(op) => target
            .service_account_client(chart::NAMESPACE, &chart::service_account(op))
            .unwrap_or_else(|| panic!("no token for {op}")),
    };
    // A new policy takes effect a moment after it is created, each policy on its own: wait until
    // one write each policy denies is denied, as a dry run.
    let probes: Vec<Case> = table()
        .into_iter()
        .filter(|c| POLICY_PROBES.contains(&c.what))
        .collect();
    assert_eq!(probes.len(), POLICY_PROBES.len(), "a probe names no row");
    eventually(
        "every admission policy of the chart is active",
        POLICY_ACTIVE_BUDGET,
        async || {
            let mut allowed = Vec::new();
            for case in &probes {
                if run(case, client(case.who), ns, true).await.is_ok() {
                    allowed.push(case.what);
                }
            }
            match allowed.is_empty() {
                true => Ok(()),
                false => Err(format!("still allowed: {}", allowed.join("; "))),
            }
        },
    )
    .await;
    let mut wrong = Vec::new();
    for case in table() {
        let got = run(&case, client(case.who), ns, false).await;
        let verdict = match (&case.expect, &got) {
            (Expect::Allowed, Ok(())) => None,
            (Expect::Denied(text), Err(kube::Error::Api(s)))
                if s.code == 403
                    && s.reason == "Forbidden"
                    && s.message.contains("ValidatingAdmissionPolicy")
                    && s.message.contains(&fill(text, ns)) =>
            {
                None
            }
            (Expect::Unauthorized, Err(kube::Error::Api(s)))
                if s.code == 403 && !s.message.contains("ValidatingAdmissionPolicy") =>
            {
                None
            }
            (expect, got) => Some(format!(
                "{:?} {}: expected {expect:?}, got {}",
                case.who,
                case.what,
                match got {
                    Ok(()) => "allowed".to_owned(),
                    Err(e) => e.to_string(),
                }
            )),
        };
        wrong.extend(verdict);
    }
    wrong
}

/// The scenario CRDs and the released GRPCRoute CRD.
fn crds(upstream: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut crds = sluice_e2e::target::crd_files(&repo_root(), upstream);
    crds.push(upstream.join("gateway-api-v1.6.1/gateway.networking.k8s.io_grpcroutes.yaml"));
    crds
}

fn rendered() -> Option<Vec<Value>> {
    rendered_in(chart::Mode::Management)
}

fn rendered_workload() -> Option<Vec<Value>> {
    rendered_in(chart::Mode::Workload)
}

/// The chart rendered in `mode`; None when helm is missing (a failure under CI).
fn rendered_in(mode: chart::Mode) -> Option<Vec<Value>> {
    match chart::render(&repo_root(), mode) {
        Ok(d) => Some(d),
        Err(e) if e.category() == "helm_missing" => {
            sluice_testkit::prereq::Missing::new(
                e.to_string(),
                sluice_testkit::prereq::INSTALL_TOOLS,
            )
            .skip();
            None
        }
        Err(e) => panic!("{e}"),
    }
}

#[tokio::test]
async fn each_operator_writes_only_what_it_owns_on_the_emulator() {
    let (Some(upstream), Some(rendered)) = (sluice_e2e::upstream(), rendered()) else {
        return;
    };
    let crds = crds(&upstream);
    let ns = "admission-table";
    let target = Target::emulated(&crds, &rendered, &[ARGOCD, ns])
        .await
        .unwrap();
    let wrong = run_table(&target, ns).await;
    target.stop().await;
    assert!(
        wrong.is_empty(),
        "rows answered otherwise:\n{}",
        wrong.join("\n")
    );
}

#[tokio::test]
async fn each_operator_writes_only_what_it_owns_on_a_real_api_server() {
    let (Some(upstream), Some(rendered)) = (sluice_e2e::upstream(), rendered()) else {
        return;
    };
    let crds = crds(&upstream);
    let ns = "admission-table";
    let Some(target) = Target::real(&crds, &rendered, &[ARGOCD, ns]).await.unwrap() else {
        return;
    };
    let wrong = run_table(&target, ns).await;
    let admin = target.admin();
    let schema = builtin_fields_match_the_server(&admin).await;
    // A namespace holding an owned route can still be deleted: the policy lets the namespace
    // controller delete the route once the namespace is terminating.
    if wrong.is_empty() {
        namespace_with_an_owned_route_goes_away(&target).await;
    }
    target.stop().await;
    assert!(
        wrong.is_empty(),
        "rows answered otherwise:\n{}",
        wrong.join("\n")
    );
    assert!(schema.is_empty(), "{}", schema.join("\n"));
}

/// charts/sluice/admission/fields.yaml against the server's OpenAPI: each list is every property
/// of the schema but the owned one.
async fn builtin_fields_match_the_server(admin: &Client) -> Vec<String> {
    let fields: Value = serde_yaml::from_str(
        &std::fs::read_to_string(repo_root().join("charts/sluice/admission/fields.yaml")).unwrap(),
    )
    .unwrap();
    let fetch = async |path: &str| -> Value {
        let req = http::Request::get(path).body(Vec::new()).unwrap();
        serde_json::from_str(&admin.request_text(req).await.unwrap()).unwrap()
    };
    let apps = fetch("/openapi/v3/apis/apps/v1").await;
    let core = fetch("/openapi/v3/api/v1").await;
    let props = |doc: &Value, schema: &str| -> Vec<String> {
        let mut p: Vec<String> = doc["components"]["schemas"][schema]["properties"]
            .as_object()
            .unwrap_or_else(|| panic!("no schema {schema}"))
            .keys()
            .cloned()
            .collect();
        p.sort();
        p
    };
    let mut wrong = Vec::new();
    for (key, doc, schema, owned) in [
        (
            "deploymentSpec",
            &apps,
            "io.k8s.api.apps.v1.DeploymentSpec",
            "template",
        ),
        (
            "statefulSetSpec",
            &apps,
            "io.k8s.api.apps.v1.StatefulSetSpec",
            "template",
        ),
        (
            "daemonSetSpec",
            &apps,
            "io.k8s.api.apps.v1.DaemonSetSpec",
            "template",
        ),
        (
            "podTemplateSpec",
            &core,
            "io.k8s.api.core.v1.PodTemplateSpec",
            "metadata",
        ),
        (
            "objectMeta",
            &core,
            "io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta",
            "annotations",
        ),
    ] {
        let want: Vec<String> = props(doc, schema)
            .into_iter()
            .filter(|p| p != owned)
            .collect();
        let have: Vec<String> = fields["builtin"][key]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_str().unwrap().to_owned())
            .collect();
        if want != have {
            wrong.push(format!(
                "charts/sluice/admission/fields.yaml builtin.{key} is {have:?}; the server's {schema} has {want:?} (all but {owned}): update the list, or the policy lets a new field change"
            ));
        }
    }
    wrong
}

/// Creates a namespace with a route rollout-weights owns, deletes the namespace and waits for it
/// to be gone (the real namespace controller deletes its content first).
async fn namespace_with_an_owned_route_goes_away(target: &Target) {
    let admin = target.admin();
    let ns = "admission-doomed";
    Api::<DynamicObject>::all_with(admin.clone(), &namespaces())
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": ns}})).unwrap(),
        )
        .await
        .unwrap();
    let routes: Api<DynamicObject> = Api::namespaced_with(admin.clone(), ns, &httproutes());
    routes
        .create(
            &PostParams::default(),
            &serde_json::from_value(route("checkout", None)).unwrap(),
        )
        .await
        .unwrap();
    let operator = target
        .service_account_client(chart::NAMESPACE, &chart::service_account("rollout-weights"))
        .unwrap();
    let claim = Case {
        what: "claim",
        who: RW,
        resource: httproutes,
        namespace: ns,
        name: "checkout",
        write: Write::Replace(vec![(
            "/metadata/annotations",
            json!({OWNER: "doomed/checkout"}),
        )]),
        expect: Expect::Allowed,
    };
    run(&claim, operator, ns, false).await.unwrap();
    let delete = Case {
        who: Who::Admin,
        write: Write::Delete,
        ..claim
    };
    assert!(
        run(&delete, admin.clone(), ns, false).await.is_err(),
        "an owned route is not deleted by others"
    );
    Api::<DynamicObject>::all_with(admin.clone(), &namespaces())
        .delete(ns, &DeleteParams::default())
        .await
        .unwrap();
    eventually(
        "the namespace holding an owned route is deleted",
        Duration::from_secs(60),
        async || match Api::<DynamicObject>::all_with(admin.clone(), &namespaces())
            .get_opt(ns)
            .await
        {
            Ok(None) => Ok(()),
            Ok(Some(n)) => Err(format!("still there: {:?}", n.data.get("status"))),
            Err(e) => Err(e.to_string()),
        },
    )
    .await;
}

/// After a pin, Argo CD syncs Git over a route revert applied: its update takes fields from
/// revert's `sluice-revert` managedFields entry, which shrinks but keeps its time; the
/// field-manager policy lets that through (it denies only new or re-stamped sluice-* entries).
async fn argo_cd_takes_fields_from_sluice_revert(target: &Target) -> Result<(), String> {
    let ns = "admission-resync";
    let admin = target.admin();
    let routes: Api<DynamicObject> = Api::namespaced_with(admin.clone(), ns, &httproutes());
    let revert = target
        .service_account_client(chart::NAMESPACE, "sluice-revert-target")
        .ok_or("no token for revert's target identity")?;
    let mut body = route("reverted", None);
    body["metadata"]["namespace"] = json!(ns);
    Api::<DynamicObject>::namespaced_with(revert, ns, &httproutes())
        .patch(
            "reverted",
            &PatchParams::apply("sluice-revert").force(),
            &Patch::Apply(body),
        )
        .await
        .map_err(|e| format!("revert's apply: {e}"))?;
    let argo = json!({
        "apiVersion": "gateway.networking.k8s.io/v1", "kind": "HTTPRoute",
        "metadata": {"name": "reverted", "namespace": ns},
        "spec": {"hostnames": ["git.example"]}
    });
    routes
        .patch(
            "reverted",
            &PatchParams::apply("argocd-controller").force(),
            &Patch::Apply(argo),
        )
        .await
        .map_err(|e| format!("Argo CD's sync over revert's fields was denied: {e}"))?;
    let after = routes.get("reverted").await.map_err(|e| e.to_string())?;
    let managers: Vec<String> = after
        .metadata
        .managed_fields
        .unwrap_or_default()
        .into_iter()
        .filter_map(|e| e.manager)
        .collect();
    if !managers.iter().any(|m| m == "sluice-revert") {
        return Err(format!(
            "sluice-revert's entry is gone ({managers:?}): the case did not exercise a shrinking entry"
        ));
    }
    Ok(())
}

#[tokio::test]
async fn argo_cd_may_sync_over_revert_fields_on_the_emulator() {
    let (Some(upstream), Some(rendered)) = (sluice_e2e::upstream(), rendered_workload()) else {
        return;
    };
    let target = Target::emulated(&crds(&upstream), &rendered, &["admission-resync"])
        .await
        .unwrap();
    let result = argo_cd_takes_fields_from_sluice_revert(&target).await;
    target.stop().await;
    result.unwrap();
}

#[tokio::test]
async fn argo_cd_may_sync_over_revert_fields_on_a_real_api_server() {
    let (Some(upstream), Some(rendered)) = (sluice_e2e::upstream(), rendered_workload()) else {
        return;
    };
    let Some(target) = Target::real(&crds(&upstream), &rendered, &["admission-resync"])
        .await
        .unwrap()
    else {
        return;
    };
    // The field-manager policy is active once it denies a foreign sluice-* manager.
    let admin = target.admin();
    eventually(
        "the field-manager policy is active",
        POLICY_ACTIVE_BUDGET,
        async || {
            let api: Api<DynamicObject> =
                Api::namespaced_with(admin.clone(), "admission-resync", &httproutes());
            let mut probe = route("probe", None);
            probe["metadata"]["namespace"] = json!("admission-resync");
            match api
                .patch(
                    "probe",
                    &PatchParams::apply("sluice-probe").force(),
                    &Patch::Apply(probe),
                )
                .await
            {
                Err(kube::Error::Api(s)) if s.code == 403 => Ok(()),
                Ok(_) => {
                    let _ = api.delete("probe", &DeleteParams::default()).await;
                    Err("accepted".into())
                }
                Err(e) => Err(e.to_string()),
            }
        },
    )
    .await;
    let result = argo_cd_takes_fields_from_sluice_revert(&target).await;
    target.stop().await;
    result.unwrap();
}
