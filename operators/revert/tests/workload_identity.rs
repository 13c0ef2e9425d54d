//! revert's identity in a workload cluster as the chart renders it (`sluice_testkit::rbac`), on
//! the emulator with RBAC: by default it may write the mesh kinds a bundle may hold but not
//! EnvoyFilter (code in every Envoy); with `revertTarget.envoyFilters` it may write EnvoyFilters
//! too.

use kube::{
    Api,
    api::{ApiResource, DynamicObject, GroupVersionKind, Patch, PatchParams},
};
use serde_json::json;
use sluice_testkit::rbac::{REVERT_TARGET_NAME, REVERT_TARGET_NAMESPACE, revert_target_with};

const SHOP: &str = "shop";

fn resource(group: &str, version: &str, kind: &str) -> ApiResource {
    ApiResource::from_gvk(&GroupVersionKind::gvk(group, version, kind))
}

/// Server-side applies a small object of `kind` as `client`; the API status code when refused.
async fn apply(
    client: &kube::Client,
    ar: &ApiResource,
    spec: serde_json::Value,
) -> Result<(), u16> {
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), SHOP, ar);
    let body = json!({
        "apiVersion": ar.api_version,
        "kind": ar.kind,
        "metadata": {"name": "x", "namespace": SHOP},
        "spec": spec,
    });
    match api
        .patch(
            "x",
            &PatchParams::apply("sluice-revert").force(),
            &Patch::Apply(&body),
        )
        .await
    {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) => Err(s.code),
        Err(e) => panic!("applying a {}: {e}", ar.kind),
    }
}

#[tokio::test]
async fn envoy_filters_are_writable_only_when_opted_in() {
    let Some(upstream) = sluice_testkit::prereq::or_skip(sluice_testkit::prereq::upstream_crds())
    else {
        return;
    };
    let envoy_filter = resource("networking.istio.io", "v1alpha3", "EnvoyFilter");
    let destination_rule = resource("networking.istio.io", "v1", "DestinationRule");
    for opted_in in [false, true] {
        let emu = kube_emulator::Emulator::start_with(kube_emulator::Options {
            rbac: true,
            ..Default::default()
        })
        .await
        .expect("emulator");
        emu.load_manifest_file(upstream.join("istio-v1.28.0/customresourcedefinitions.gen.yaml"))
            .expect("Istio CRDs");
        emu.load_yaml(&format!(
            "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: {SHOP}\n---\napiVersion: v1\nkind: Namespace\nmetadata:\n  name: {REVERT_TARGET_NAMESPACE}\n"
        ))
        .expect("namespaces");
        emu.load_yaml(&revert_target_with(opted_in))
            .expect("revert's role");
        let revert = emu.client_with_token(
            &emu.service_account_token(REVERT_TARGET_NAMESPACE, REVERT_TARGET_NAME),
        );

        assert_eq!(
            apply(&revert, &destination_rule, json!({"host": "checkout"})).await,
            Ok(()),
            "a DestinationRule is always revert's to write (envoyFilters={opted_in})"
        );
        let filter = apply(
            &revert,
            &envoy_filter,
            json!({"configPatches": [{"applyTo": "HTTP_FILTER"}]}),
        )
        .await;
        if opted_in {
            assert_eq!(filter, Ok(()), "with revertTarget.envoyFilters");
        } else {
            assert_eq!(
                filter,
                Err(403),
                "by default an EnvoyFilter write is forbidden"
            );
        }
    }
}
