//! The scenario every operator's first end-to-end test runs against its running controller: an
//! object the schema accepts but the operator refuses is `Ready=False` (`InvalidSpec`) with a
//! condition and a Warning Event naming the field, and once fixed, `Ready=True` for the new
//! generation. Only reads and patches the one object it is given; never creates or deletes.

use std::{fmt::Debug, time::Duration};

use k8s_openapi::api::events::v1::Event;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::{
    Api, Resource,
    api::{Patch, PatchParams},
};
use serde::{Serialize, de::DeserializeOwned};
use sluice_api::v1alpha1::{BundlePin, RevisionUpgrade, Rollout, WaveGate};

use crate::{events, eventually::object_until};

/// How long the operator gets to write a status.
pub const WAIT: Duration = Duration::from_secs(15);

/// A sluice kind whose status carries conditions and the generation they were decided from.
pub trait Conditioned: Resource + Clone + DeserializeOwned + Serialize + Debug {
    /// The type of the condition that says whether the spec is valid.
    const READY: &'static str;
    /// The reason of `Ready=False` for a refused spec.
    const INVALID_SPEC: &'static str;
    /// The reason of `Ready=True`.
    const VALID: &'static str;

    /// The conditions of its status; empty when it has no status yet.
    fn conditions(&self) -> &[Condition];

    /// The generation its status was written from.
    fn observed_generation(&self) -> Option<i64>;

    /// The `Ready` condition's status and reason, once written.
    fn ready(&self) -> Option<(String, String)> {
        let c = self.conditions().iter().find(|c| c.type_ == Self::READY)?;
        Some((c.status.clone(), c.reason.clone()))
    }
}

macro_rules! conditioned {
    ($kind:ty, $module:ident) => {
        impl Conditioned for $kind {
            const READY: &'static str = sluice_api::v1alpha1::$module::conditions::READY;
            const INVALID_SPEC: &'static str = sluice_api::v1alpha1::$module::reasons::INVALID_SPEC;
            const VALID: &'static str = sluice_api::v1alpha1::$module::reasons::VALID;

            fn conditions(&self) -> &[Condition] {
                self.status.as_ref().map_or(&[], |s| &s.conditions)
            }

            fn observed_generation(&self) -> Option<i64> {
                self.status.as_ref().and_then(|s| s.observed_generation)
            }
        }
    };
}

conditioned!(BundlePin, bundle_pin);
conditioned!(RevisionUpgrade, revision_upgrade);
conditioned!(Rollout, rollout);
conditioned!(WaveGate, wave_gate);

/// Waits until `name` is `Ready=False` (`InvalidSpec`) and asserts that the status is of the
/// object's generation, that the condition's message names `field`, and that a Warning
/// `InvalidSpec` Event in the object's namespace (`default` for a cluster-scoped kind) names it.
/// Returns the object as seen and those Events.
pub async fn refused_naming<K: Conditioned>(
    api: &Api<K>,
    name: &str,
    field: &str,
) -> (K, Vec<Event>) {
    let seen = object_until(api, name, "Ready=False InvalidSpec", WAIT, |o| {
        o.ready() == Some(("False".into(), K::INVALID_SPEC.into()))
    })
    .await;
    assert_eq!(seen.observed_generation(), seen.meta().generation);
    let message = &seen
        .conditions()
        .iter()
        .find(|c| c.type_ == K::READY)
        .unwrap()
        .message;
    assert!(
        message.contains(field),
        "message names the field: {message}"
    );
    let namespace = seen.meta().namespace.as_deref().unwrap_or("default");
    let warnings: Vec<Event> =
        events::with_reason(&api.clone().into_client(), namespace, K::INVALID_SPEC)
            .await
            .into_iter()
            .filter(|e| {
                e.type_.as_deref() == Some("Warning")
                    && e.note.as_deref().is_some_and(|n| n.contains(field))
            })
            .collect();
    assert!(
        !warnings.is_empty(),
        "a Warning InvalidSpec Event names the field"
    );
    (seen, warnings)
}

/// Merge-patches `fix` into `name`'s spec, waits until it is `Ready=True` (`Valid`) for the
/// generation the patch made, asserts that generation is 2 and returns the object.
pub async fn ready_once_fixed<K: Conditioned>(
    api: &Api<K>,
    name: &str,
    fix: serde_json::Value,
) -> K {
    api.patch(
        name,
        &PatchParams::default(),
        &Patch::Merge(serde_json::json!({ "spec": fix })),
    )
    .await
    .unwrap();
    let fixed = object_until(api, name, "Ready=True for generation 2", WAIT, |o| {
        o.ready() == Some(("True".into(), K::VALID.into()))
            && o.observed_generation() == o.meta().generation
    })
    .await;
    assert_eq!(fixed.meta().generation, Some(2));
    fixed
}
