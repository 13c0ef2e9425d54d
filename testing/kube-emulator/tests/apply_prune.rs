//! Server-side apply removal: what a field manager stops applying leaves the object, whole
//! sub-objects included, unless another manager owns it. Driven through kube-rs on the status
//! subresource (the operators' fenced status writes) and on the main resource of a CRD whose
//! nested objects have required fields, so a half-removed object would be refused by validation.

use kube::api::{
    Api, ApiResource, DynamicObject, GroupVersionKind, Patch, PatchParams, PostParams,
};
use kube_emulator::Emulator;
use serde_json::{Value, json};

const GADGET_CRD: &str = r#"
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: gadgets.test.sluice.dev
spec:
  group: test.sluice.dev
  scope: Namespaced
  names: {plural: gadgets, singular: gadget, kind: Gadget}
  versions:
  - name: v1
    served: true
    storage: true
    subresources: {status: {}}
    schema:
      openAPIV3Schema:
        type: object
        properties:
          spec:
            type: object
            properties:
              replicas: {type: integer}
              hold:
                type: object
                required: [gate]
                properties:
                  gate:
                    type: object
                    required: [name, reason]
                    properties:
                      name: {type: string}
                      reason: {type: string}
                  note: {type: string}
          status:
            type: object
            properties:
              phase: {type: string}
              halt:
                type: object
                required: [gate]
                properties:
                  gate:
                    type: object
                    required: [name, reason]
                    properties:
                      name: {type: string}
                      reason: {type: string}
                  since: {type: string}
"#;

async fn with_gadget() -> (Emulator, Api<DynamicObject>, String) {
    let emu = Emulator::start().await;
    emu.load_yaml(GADGET_CRD).expect("gadget CRD loads");
    let ar = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("test.sluice.dev", "v1", "Gadget"),
        "gadgets",
    );
    let api: Api<DynamicObject> = Api::namespaced_with(emu.client(), "default", &ar);
    let created = api
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "apiVersion": "test.sluice.dev/v1", "kind": "Gadget",
                "metadata": {"name": "g"}
            }))
            .unwrap(),
        )
        .await
        .expect("gadget created");
    let rv = created.metadata.resource_version.unwrap();
    (emu, api, rv)
}

/// A fenced status apply, as the operators write status.
async fn apply_status(
    api: &Api<DynamicObject>,
    manager: &str,
    rv: &str,
    status: Value,
) -> Result<DynamicObject, kube::Error> {
    api.patch_status(
        "g",
        &PatchParams::apply(manager),
        &Patch::Apply(json!({
            "apiVersion": "test.sluice.dev/v1", "kind": "Gadget",
            "metadata": {"name": "g", "resourceVersion": rv}, "status": status
        })),
    )
    .await
}

async fn apply_spec(
    api: &Api<DynamicObject>,
    manager: &str,
    spec: Value,
) -> Result<DynamicObject, kube::Error> {
    let mut config = json!({
        "apiVersion": "test.sluice.dev/v1", "kind": "Gadget", "metadata": {"name": "g"}
    });
    if !spec.is_null() {
        config["spec"] = spec;
    }
    api.patch("g", &PatchParams::apply(manager), &Patch::Apply(config))
        .await
}

fn rv(o: &DynamicObject) -> String {
    o.metadata.resource_version.clone().unwrap()
}

/// The fieldsV1 of one manager's entry, `null` when it has none.
fn fields_of(o: &DynamicObject, manager: &str) -> Value {
    o.metadata
        .managed_fields
        .iter()
        .flatten()
        .find(|m| m.manager.as_deref() == Some(manager))
        .map(|m| serde_json::to_value(&m.fields_v1).unwrap())
        .unwrap_or(Value::Null)
}

fn halt() -> Value {
    json!({"gate": {"name": "error-rate", "reason": "Breached"}, "since": "2026-01-01T00:00:00Z"})
}

#[tokio::test]
async fn a_status_apply_that_leaves_out_a_nested_object_removes_it_whole() {
    let (_emu, api, created) = with_gadget().await;
    let halted = apply_status(
        &api,
        "decider",
        &created,
        json!({"phase": "Halted", "halt": halt()}),
    )
    .await
    .expect("first status apply");
    assert_eq!(halted.data["status"]["halt"], halt());

    let resumed = apply_status(
        &api,
        "decider",
        &rv(&halted),
        json!({"phase": "Progressing"}),
    )
    .await
    .expect("an apply without status.halt is accepted (no half-removed halt to reject)");
    assert_eq!(resumed.data["status"], json!({"phase": "Progressing"}));
    assert_eq!(
        fields_of(&resumed, "decider"),
        json!({"f:status": {"f:phase": {}}})
    );
    let stored = api.get("g").await.unwrap();
    assert_eq!(stored.data["status"], json!({"phase": "Progressing"}));

    // Leaving out the whole status removes it too, the manager owning nothing else there.
    let cleared = apply_status(&api, "decider", &rv(&resumed), json!({}))
        .await
        .expect("an apply with an empty status is accepted");
    assert_eq!(cleared.data["status"], json!({}));
}

#[tokio::test]
async fn a_main_resource_apply_that_leaves_out_a_nested_object_removes_it_whole() {
    let (_emu, api, _) = with_gadget().await;
    let hold = json!({"gate": {"name": "soak", "reason": "Waiting"}, "note": "n"});
    let held = apply_spec(&api, "planner", json!({"replicas": 2, "hold": hold}))
        .await
        .expect("first apply");
    assert_eq!(held.data["spec"]["hold"], hold);

    let released = apply_spec(&api, "planner", json!({"replicas": 2}))
        .await
        .expect("an apply without spec.hold is accepted (no half-removed hold to reject)");
    assert_eq!(released.data["spec"], json!({"replicas": 2}));
    assert_eq!(
        fields_of(&released, "planner"),
        json!({"f:spec": {"f:replicas": {}}})
    );

    // Leaving out spec entirely (`Null` here) removes spec: the manager was its only owner.
    let gone = apply_spec(&api, "planner", Value::Null)
        .await
        .expect("an apply without spec is accepted");
    assert_eq!(gone.data.get("spec"), None, "{:?}", gone.data);
}

#[tokio::test]
async fn a_nested_object_another_manager_also_applies_stays() {
    let (_emu, api, created) = with_gadget().await;
    let a = apply_status(
        &api,
        "decider",
        &created,
        json!({"phase": "Halted", "halt": halt()}),
    )
    .await
    .expect("decider's apply");
    // The same gate from a second manager: shared ownership, no conflict.
    let b = apply_status(
        &api,
        "auditor",
        &rv(&a),
        json!({"halt": {"gate": {"name": "error-rate", "reason": "Breached"}}}),
    )
    .await
    .expect("auditor's apply of the same values");

    // decider drops halt: the gate auditor owns stays, halt.since (decider's alone) goes.
    let dropped = apply_status(&api, "decider", &rv(&b), json!({"phase": "Progressing"}))
        .await
        .expect("decider's apply without halt");
    assert_eq!(
        dropped.data["status"],
        json!({"phase": "Progressing", "halt": {"gate": {"name": "error-rate", "reason": "Breached"}}})
    );
    assert_eq!(
        fields_of(&dropped, "auditor"),
        json!({"f:status": {"f:halt": {"f:gate": {"f:name": {}, "f:reason": {}}}}})
    );

    // auditor drops it too: now it goes.
    let gone = apply_status(&api, "auditor", &rv(&dropped), json!({}))
        .await
        .expect("auditor's apply without halt");
    assert_eq!(gone.data["status"], json!({"phase": "Progressing"}));
    assert_eq!(fields_of(&gone, "auditor"), json!({"f:status": {}}));
}

#[tokio::test]
async fn a_field_written_by_an_update_manager_stays_when_the_applier_drops_its_own() {
    let (_emu, api, _) = with_gadget().await;
    apply_spec(
        &api,
        "planner",
        json!({"replicas": 2, "hold": {"gate": {"name": "soak", "reason": "Waiting"}}}),
    )
    .await
    .expect("planner's apply");
    // A merge patch by another writer adds hold.note: that writer owns it (Update).
    api.patch(
        "g",
        &PatchParams {
            field_manager: Some("editor".into()),
            ..Default::default()
        },
        &Patch::Merge(json!({"spec": {"hold": {"note": "held by hand"}}})),
    )
    .await
    .expect("editor's merge patch");
    // planner stops applying replicas only: hold stays as it is, note included.
    let kept = apply_spec(
        &api,
        "planner",
        json!({"hold": {"gate": {"name": "soak", "reason": "Waiting"}}}),
    )
    .await
    .expect("planner's second apply");
    assert_eq!(
        kept.data["spec"],
        json!({"hold": {"gate": {"name": "soak", "reason": "Waiting"}, "note": "held by hand"}})
    );
}

#[tokio::test]
async fn the_wave_gate_status_halt_goes_when_its_decider_stops_applying_it() {
    let crd = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../crds/wavegates.sluice.dev.yaml");
    if !crd.exists() {
        println!("skipped: {} is absent", crd.display());
        return;
    }
    let emu = Emulator::start().await;
    emu.load_manifest_file(&crd)
        .expect("the WaveGate CRD loads");
    let ar = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("sluice.dev", "v1alpha1", "WaveGate"),
        "wavegates",
    );
    let api: Api<DynamicObject> = Api::namespaced_with(emu.client(), "default", &ar);
    let revision = format!("sha256:{}", "a".repeat(64));
    let created = api
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "apiVersion": "sluice.dev/v1alpha1", "kind": "WaveGate",
                "metadata": {"name": "g"},
                "spec": {
                    "applicationSetRef": {"name": "mesh-config"},
                    "driftGate": {"exporter": "None"},
                    "pin": {"publicKeysSecretRef": {"name": "cosign-keys"}},
                    "repository": "oci://registry.local/mesh/config",
                    "revision": revision,
                    "site": "east",
                    "waves": [{"name": "canary", "clusters": ["east-1"]}]
                }
            }))
            .unwrap(),
        )
        .await
        .expect("WaveGate created");
    let status = |rv: &str, status: Value| {
        json!({"apiVersion": "sluice.dev/v1alpha1", "kind": "WaveGate",
            "metadata": {"name": "g", "resourceVersion": rv}, "status": status})
    };
    let halted = api
        .patch_status(
            "g",
            &PatchParams::apply("sluice-wave-gate"),
            &Patch::Apply(status(
                &rv(&created),
                json!({"phase": "Halted", "halt": {
                    "wave": "canary", "reason": "GateFailed", "haltedAt": "2026-01-01T00:00:00Z",
                    "gate": {"gate": "error-rate", "verdict": "Fail", "reason": "ThresholdBreached",
                        "evaluatedAt": "2026-01-01T00:00:00Z", "value": 0.2, "threshold": 0.01}}}),
            )),
        )
        .await
        .expect("halted status applied");
    assert_eq!(halted.data["status"]["halt"]["gate"]["verdict"], "Fail");
    let resumed = api
        .patch_status(
            "g",
            &PatchParams::apply("sluice-wave-gate"),
            &Patch::Apply(status(&rv(&halted), json!({"phase": "Progressing"}))),
        )
        .await
        .expect("a status without halt is accepted");
    assert_eq!(
        resumed.data["status"].get("halt"),
        None,
        "{:?}",
        resumed.data
    );
    assert_eq!(resumed.data["status"]["phase"], "Progressing");
}
