//! Write helpers: server-side apply of status fenced by `metadata.resourceVersion`, and
//! read-modify-write updates with a resourceVersion precondition and a bounded retry on 409.
//!
//! Owns how every operator writes to the API. A status decision is applied together with the
//! resourceVersion it was made from, so a stale decision (a deposed leader, a lost race) fails
//! with 409 instead of overwriting a newer one. Must never write without a field manager, never
//! retry a status apply on conflict (the decision itself is stale: re-reconcile instead), and
//! never retry an update without bound.

use std::{fmt, time::Duration};

use kube::{
    Api, Resource,
    api::{Patch, PatchParams, PostParams},
};
use serde::{Serialize, de::DeserializeOwned};

use crate::error::{Categorized, Category, is_conflict};

/// The name an operator writes under (`metadata.managedFields[].manager`). Declare one constant
/// per operator and pass it everywhere that operator writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct FieldManager(&'static str);

impl FieldManager {
    /// Declares a field manager; `name` must be a DNS-label-like constant such as
    /// `sluice-rollout-weights`.
    pub const fn new(name: &'static str) -> Self {
        Self(name)
    }

    /// The manager name.
    pub const fn as_str(self) -> &'static str {
        self.0
    }

    /// Server-side apply parameters under this manager. `force` takes over fields last written
    /// by someone else, which an operator does for the fields it owns.
    pub fn apply_params(self) -> PatchParams {
        PatchParams::apply(self.0).force()
    }

    /// Create/replace parameters under this manager.
    pub fn post_params(self) -> PostParams {
        PostParams {
            dry_run: false,
            field_manager: Some(self.0.to_owned()),
        }
    }
}

impl fmt::Display for FieldManager {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.0)
    }
}

/// A write that did not happen.
#[derive(Debug, thiserror::Error)]
pub enum WriteError {
    /// The object changed since the decision was made; the decision is stale.
    #[error(
        "{kind} {name}: resourceVersion {resource_version} is stale (409 Conflict); the object \
         changed since it was read, re-read it and decide again"
    )]
    Stale {
        /// Kind written.
        kind: String,
        /// Object name.
        name: String,
        /// The resourceVersion the decision was made from.
        resource_version: String,
    },
    /// Every attempt of a read-modify-write update lost the race.
    #[error(
        "{kind} {name}: update conflicted {attempts} times in a row (409); another writer keeps \
         changing it — find the competing writer"
    )]
    ConflictsExhausted {
        /// Kind written.
        kind: String,
        /// Object name.
        name: String,
        /// Attempts made.
        attempts: u32,
    },
    /// The object has no resourceVersion, so the write cannot be fenced.
    #[error(
        "{kind} {name}: no metadata.resourceVersion to fence the write with; read it from the API first"
    )]
    MissingResourceVersion {
        /// Kind written.
        kind: String,
        /// Object name.
        name: String,
    },
    /// The patch could not be encoded.
    #[error("{kind} {name}: cannot encode the status patch: {source}")]
    Encode {
        /// Kind written.
        kind: String,
        /// Object name.
        name: String,
        /// Encoder error.
        #[source]
        source: serde_json::Error,
    },
    /// The API refused or failed the request.
    #[error("{kind} {name}: {source}")]
    Api {
        /// Kind written.
        kind: String,
        /// Object name.
        name: String,
        /// Client error.
        #[source]
        source: kube::Error,
    },
}

impl Categorized for WriteError {
    fn category(&self) -> Category {
        match self {
            WriteError::Stale { .. } | WriteError::ConflictsExhausted { .. } => Category::Conflict,
            WriteError::MissingResourceVersion { .. } => Category::Internal,
            WriteError::Encode { .. } => Category::Serialization,
            WriteError::Api { source, .. } => Category::of_kube(source),
        }
    }
}

/// Builds the server-side apply body for a status write: apiVersion, kind, name and the
/// resourceVersion the decision was made from, plus the status. The resourceVersion makes the
/// API server reject the apply with 409 if the object changed in between.
pub fn status_apply_patch<K>(
    name: &str,
    resource_version: &str,
    status: &impl Serialize,
) -> Result<serde_json::Value, serde_json::Error>
where
    K: Resource<DynamicType = ()>,
{
    Ok(serde_json::json!({
        "apiVersion": K::api_version(&()),
        "kind": K::kind(&()),
        "metadata": {
            "name": name,
            "resourceVersion": resource_version,
        },
        "status": serde_json::to_value(status)?,
    }))
}

/// Applies `status` to `obj`'s status subresource under `manager`, fenced by `obj`'s
/// resourceVersion. Returns the object as stored. A 409 comes back as [`WriteError::Stale`]
/// and is not retried: the caller's decision was made from an old object.
pub async fn apply_status<K>(
    api: &Api<K>,
    manager: FieldManager,
    obj: &K,
    status: &impl Serialize,
) -> Result<K, WriteError>
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + fmt::Debug,
{
    let kind = K::kind(&()).into_owned();
    let name = obj.meta().name.clone().unwrap_or_default();
    let rv =
        obj.meta()
            .resource_version
            .clone()
            .ok_or_else(|| WriteError::MissingResourceVersion {
                kind: kind.clone(),
                name: name.clone(),
            })?;
    let patch =
        status_apply_patch::<K>(&name, &rv, status).map_err(|source| WriteError::Encode {
            kind: kind.clone(),
            name: name.clone(),
            source,
        })?;
    api.patch_status(&name, &manager.apply_params(), &Patch::Apply(&patch))
        .await
        .map_err(|source| {
            if is_conflict(&source) {
                WriteError::Stale {
                    kind,
                    name,
                    resource_version: rv,
                }
            } else {
                WriteError::Api { kind, name, source }
            }
        })
}

/// How many times and how patiently a read-modify-write update retries on 409.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Total attempts, including the first (at least 1).
    pub max_attempts: u32,
    /// Delay before the second attempt; doubles each further attempt.
    pub base_delay: Duration,
    /// Upper bound of one delay.
    pub max_delay: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self {
            max_attempts: 5,
            base_delay: Duration::from_millis(20),
            max_delay: Duration::from_millis(500),
        }
    }
}

impl RetryPolicy {
    /// Delay before attempt number `attempt` (1-based); `None` when no attempt is left.
    pub fn delay_before(&self, attempt: u32) -> Option<Duration> {
        if attempt == 0 || attempt > self.max_attempts.max(1) {
            return None;
        }
        if attempt == 1 {
            return Some(Duration::ZERO);
        }
        let factor = 1u32.checked_shl(attempt - 2).unwrap_or(u32::MAX);
        Some(self.base_delay.saturating_mul(factor).min(self.max_delay))
    }
}

/// The result of [`update_with_retry`].
#[derive(Debug, Clone, PartialEq)]
pub enum Updated<K> {
    /// The mutation changed nothing; no write was sent.
    Unchanged(K),
    /// The object was replaced; `attempts` counts tries including conflicts.
    Written {
        /// The object as stored.
        object: K,
        /// Attempts used.
        attempts: u32,
    },
}

impl<K> Updated<K> {
    /// The resulting object.
    pub fn object(&self) -> &K {
        match self {
            Updated::Unchanged(o) | Updated::Written { object: o, .. } => o,
        }
    }
}

/// Modify-write of an object as it was read: lets `mutate` change a copy of `read` (returning
/// whether it did) and replaces the object with `read`'s resourceVersion as precondition, in one
/// request and without reading it again. For a writer that has just read the object and must
/// not act if it changed since (its edit was decided from that read): a 409 is
/// [`WriteError::Stale`], not retried. Nothing is sent when `mutate` changes nothing.
pub async fn replace_as_read<K, F>(
    api: &Api<K>,
    manager: FieldManager,
    read: &K,
    mutate: F,
) -> Result<Updated<K>, WriteError>
where
    K: Resource<DynamicType = ()> + Clone + Serialize + DeserializeOwned + fmt::Debug,
    F: FnOnce(&mut K) -> bool,
{
    replace_as_read_with(api, &(), manager, read, mutate).await
}

/// [`replace_as_read`] for any resource, a `DynamicObject` included: `dt` is the resource's
/// dynamic type (its `ApiResource` for a dynamic object), used only to name the kind in errors.
pub async fn replace_as_read_with<K, F>(
    api: &Api<K>,
    dt: &K::DynamicType,
    manager: FieldManager,
    read: &K,
    mutate: F,
) -> Result<Updated<K>, WriteError>
where
    K: Resource + Clone + Serialize + DeserializeOwned + fmt::Debug,
    F: FnOnce(&mut K) -> bool,
{
    let kind = K::kind(dt).into_owned();
    let name = read.meta().name.clone().unwrap_or_default();
    let Some(rv) = read.meta().resource_version.clone() else {
        return Err(WriteError::MissingResourceVersion { kind, name });
    };
    let mut next = read.clone();
    if !mutate(&mut next) {
        return Ok(Updated::Unchanged(read.clone()));
    }
    next.meta_mut().resource_version = Some(rv.clone());
    match api.replace(&name, &manager.post_params(), &next).await {
        Ok(object) => Ok(Updated::Written {
            object,
            attempts: 1,
        }),
        Err(source) if is_conflict(&source) => Err(WriteError::Stale {
            kind,
            name,
            resource_version: rv,
        }),
        Err(source) => Err(WriteError::Api { kind, name, source }),
    }
}

/// Read-modify-write: reads `name`, lets `mutate` change it (returning whether it did), and
/// replaces it with the resourceVersion it read as precondition. On 409 it re-reads and
/// re-applies `mutate`, at most `policy.max_attempts` times in all. `mutate` must be a pure
/// function of the object it is given, because it runs once per attempt.
pub async fn update_with_retry<K, F>(
    api: &Api<K>,
    manager: FieldManager,
    name: &str,
    policy: RetryPolicy,
    mutate: F,
) -> Result<Updated<K>, WriteError>
where
    K: Resource<DynamicType = ()> + Clone + Serialize + DeserializeOwned + fmt::Debug,
    F: FnMut(&mut K) -> bool,
{
    update_with_retry_with(api, &(), manager, name, policy, mutate).await
}

/// [`update_with_retry`] for any resource, a `DynamicObject` included: `dt` is the resource's
/// dynamic type (its `ApiResource` for a dynamic object), used only to name the kind in errors.
pub async fn update_with_retry_with<K, F>(
    api: &Api<K>,
    dt: &K::DynamicType,
    manager: FieldManager,
    name: &str,
    policy: RetryPolicy,
    mut mutate: F,
) -> Result<Updated<K>, WriteError>
where
    K: Resource + Clone + Serialize + DeserializeOwned + fmt::Debug,
    F: FnMut(&mut K) -> bool,
{
    let kind = K::kind(dt).into_owned();
    let api_err = |source: kube::Error| WriteError::Api {
        kind: kind.clone(),
        name: name.to_owned(),
        source,
    };
    let mut attempt = 1;
    while let Some(delay) = policy.delay_before(attempt) {
        if !delay.is_zero() {
            tokio::time::sleep(crate::operator::jitter(delay)).await;
        }
        let current = api.get(name).await.map_err(api_err)?;
        if current.meta().resource_version.is_none() {
            return Err(WriteError::MissingResourceVersion {
                kind: kind.clone(),
                name: name.to_owned(),
            });
        }
        let mut next = current.clone();
        if !mutate(&mut next) {
            return Ok(Updated::Unchanged(current));
        }
        // The read resourceVersion travels in `next.metadata` and is the precondition.
        next.meta_mut().resource_version = current.meta().resource_version.clone();
        match api.replace(name, &manager.post_params(), &next).await {
            Ok(object) => {
                return Ok(Updated::Written {
                    object,
                    attempts: attempt,
                });
            }
            Err(err) if is_conflict(&err) => {
                tracing::debug!(%kind, name, attempt, "update conflicted, re-reading");
                attempt += 1;
            }
            Err(err) => return Err(api_err(err)),
        }
    }
    Err(WriteError::ConflictsExhausted {
        kind: kind.clone(),
        name: name.to_owned(),
        attempts: policy.max_attempts.max(1),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::FakeApi;
    use k8s_openapi::api::core::v1::ConfigMap;

    const MANAGER: FieldManager = FieldManager::new("sluice-test");

    #[test]
    fn status_patch_carries_the_resource_version() {
        let status = serde_json::json!({"observedGeneration": 3});
        let patch = status_apply_patch::<ConfigMap>("cm-1", "42", &status).unwrap();
        assert_eq!(patch["metadata"]["resourceVersion"], "42");
        assert_eq!(patch["metadata"]["name"], "cm-1");
        assert_eq!(patch["apiVersion"], "v1");
        assert_eq!(patch["kind"], "ConfigMap");
        assert_eq!(patch["status"]["observedGeneration"], 3);
    }

    #[test]
    fn apply_params_name_the_manager_and_force() {
        let p = MANAGER.apply_params();
        assert_eq!(p.field_manager.as_deref(), Some("sluice-test"));
        assert!(p.force);
        assert_eq!(
            MANAGER.post_params().field_manager.as_deref(),
            Some("sluice-test")
        );
    }

    #[test]
    fn retry_delays_grow_and_stop() {
        let p = RetryPolicy {
            max_attempts: 4,
            base_delay: Duration::from_millis(10),
            max_delay: Duration::from_millis(25),
        };
        let table = [
            (0, None),
            (1, Some(0)),
            (2, Some(10)),
            (3, Some(20)),
            (4, Some(25)),
            (5, None),
        ];
        for (attempt, want) in table {
            assert_eq!(
                p.delay_before(attempt),
                want.map(Duration::from_millis),
                "attempt {attempt}"
            );
        }
    }

    fn fast(max_attempts: u32) -> RetryPolicy {
        RetryPolicy {
            max_attempts,
            base_delay: Duration::from_millis(1),
            max_delay: Duration::from_millis(2),
        }
    }

    fn set_key(cm: &mut ConfigMap) -> bool {
        let data = cm.data.get_or_insert_with(Default::default);
        data.insert("owned".into(), "yes".into()) != Some("yes".into())
    }

    #[tokio::test]
    async fn update_retries_conflicts_then_succeeds() {
        // (competing writes injected after reads, attempts allowed, want attempts or exhausted)
        let table: [(u32, u32, Result<u32, ()>); 4] =
            [(0, 3, Ok(1)), (1, 3, Ok(2)), (2, 3, Ok(3)), (3, 3, Err(()))];
        for (races, max, want) in table {
            let fake = FakeApi::with_configmap("ns", "cm", serde_json::json!({"keep": "me"}));
            fake.race_next_reads(races);
            let api: Api<ConfigMap> = Api::namespaced(fake.client(), "ns");
            let got = update_with_retry(&api, MANAGER, "cm", fast(max), set_key).await;
            match (got, want) {
                (Ok(Updated::Written { object, attempts }), Ok(n)) => {
                    assert_eq!(attempts, n, "races {races}");
                    let data = object.data.unwrap();
                    assert_eq!(data["owned"], "yes");
                    assert_eq!(data["keep"], "me", "fields not owned survive");
                }
                (Err(WriteError::ConflictsExhausted { attempts, .. }), Err(())) => {
                    assert_eq!(attempts, max);
                }
                (other, want) => panic!("races {races}: got {other:?}, want {want:?}"),
            }
            assert_eq!(
                fake.puts(),
                races.min(max) + u32::from(races < max),
                "races {races}"
            );
        }
    }

    #[tokio::test]
    async fn update_without_change_sends_nothing() {
        let fake = FakeApi::with_configmap("ns", "cm", serde_json::json!({"owned": "yes"}));
        let api: Api<ConfigMap> = Api::namespaced(fake.client(), "ns");
        let got = update_with_retry(&api, MANAGER, "cm", fast(3), set_key)
            .await
            .unwrap();
        assert!(matches!(got, Updated::Unchanged(_)));
        assert_eq!(fake.puts(), 0);
    }

    #[tokio::test]
    async fn a_write_as_read_sends_one_put_and_never_overwrites_a_newer_object() {
        let fake = FakeApi::with_configmap("ns", "cm", serde_json::json!({"keep": "me"}));
        let api: Api<ConfigMap> = Api::namespaced(fake.client(), "ns");
        let read = api.get("cm").await.unwrap();
        let gets = fake.gets();

        // Unchanged by the edit: nothing sent.
        let same = replace_as_read(&api, MANAGER, &read, |_| false)
            .await
            .unwrap();
        assert!(matches!(same, Updated::Unchanged(_)));
        assert_eq!((fake.gets() - gets, fake.puts()), (0, 0));

        // Written from the read, with no second read.
        let written = replace_as_read(&api, MANAGER, &read, set_key)
            .await
            .unwrap();
        let Updated::Written { object, attempts } = written else {
            panic!("{written:?}")
        };
        assert_eq!(attempts, 1);
        assert_eq!(object.data.as_ref().unwrap()["owned"], "yes");
        assert_eq!(object.data.as_ref().unwrap()["keep"], "me");
        assert_eq!((fake.gets() - gets, fake.puts()), (0, 1));
        assert_eq!(fake.last_field_manager().as_deref(), Some("sluice-test"));

        // The same read again is stale now: refused, not retried, the stored object kept.
        let err = replace_as_read(&api, MANAGER, &read, |cm: &mut ConfigMap| {
            cm.data = None;
            true
        })
        .await
        .unwrap_err();
        assert!(matches!(err, WriteError::Stale { .. }), "{err:?}");
        assert!(err.to_string().contains("is stale (409 Conflict)"), "{err}");
        assert_eq!(err.category(), Category::Conflict);
        assert_eq!((fake.gets() - gets, fake.puts()), (0, 2));
        let stored = api.get("cm").await.unwrap();
        assert_eq!(stored.data.unwrap()["owned"], "yes");
    }

    /// A GRPCRoute CRD whose spec keeps fields no schema names, so the emulator stores them.
    const GRPCROUTE_CRD: &str = r#"
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: grpcroutes.gateway.networking.k8s.io
spec:
  group: gateway.networking.k8s.io
  scope: Namespaced
  names: {kind: GRPCRoute, listKind: GRPCRouteList, plural: grpcroutes, singular: grpcroute}
  versions:
  - name: v1
    served: true
    storage: true
    schema:
      openAPIV3Schema:
        type: object
        properties:
          spec: {type: object, x-kubernetes-preserve-unknown-fields: true}
---
apiVersion: v1
kind: Namespace
metadata: {name: shop}
"#;

    #[tokio::test]
    async fn a_dynamic_route_write_keeps_every_field_and_a_stale_one_is_refused() {
        use kube::api::{ApiResource, DynamicObject, GroupVersionKind};

        let emu = kube_emulator::Emulator::start().await;
        emu.load_yaml(GRPCROUTE_CRD).unwrap();
        let ar = ApiResource::from_gvk_with_plural(
            &GroupVersionKind::gvk("gateway.networking.k8s.io", "v1", "GRPCRoute"),
            "grpcroutes",
        );
        let api: Api<DynamicObject> = Api::namespaced_with(emu.client(), "shop", &ar);
        let doc: DynamicObject = serde_json::from_value(serde_json::json!({
            "apiVersion": "gateway.networking.k8s.io/v1",
            "kind": "GRPCRoute",
            "metadata": {"name": "payments", "namespace": "shop", "annotations": {"team": "payments"}},
            "spec": {
                "parentRefs": [{"name": "edge"}],
                "rules": [{
                    "matches": [{"method": {"service": "pay.v1.Payments"}}],
                    "filters": [{"type": "RequestHeaderModifier", "requestHeaderModifier": {"add": [{"name": "x", "value": "1"}]}}],
                    "backendRefs": [
                        {"name": "stable", "port": 9000, "weight": 100, "futureBackendField": "kept"},
                        {"name": "canary", "port": 9000, "weight": 0}
                    ],
                    "futureRuleField": {"kept": true}
                }],
                "futureSpecField": 3
            }
        }))
        .unwrap();
        api.create(&PostParams::default(), &doc).await.unwrap();
        let read = api.get("payments").await.unwrap();
        let set_weights = |r: &mut DynamicObject| {
            let refs = &mut r.data["spec"]["rules"][0]["backendRefs"];
            refs[0]["weight"] = serde_json::json!(90);
            refs[1]["weight"] = serde_json::json!(10);
            true
        };

        // Written from the read: only the weights change, every field no type names stays.
        let written = replace_as_read_with(&api, &ar, MANAGER, &read, set_weights)
            .await
            .unwrap();
        let Updated::Written { object, attempts } = written else {
            panic!("{written:?}")
        };
        assert_eq!(attempts, 1);
        let mut expect = read.data.clone();
        expect["spec"]["rules"][0]["backendRefs"][0]["weight"] = serde_json::json!(90);
        expect["spec"]["rules"][0]["backendRefs"][1]["weight"] = serde_json::json!(10);
        let stored = api.get("payments").await.unwrap();
        for got in [&object, &stored] {
            assert_eq!(
                serde_json::to_string(&got.data["spec"]).unwrap(),
                serde_json::to_string(&expect["spec"]).unwrap()
            );
            assert_eq!(got.metadata.annotations, read.metadata.annotations);
        }
        assert_eq!(stored.data["spec"]["futureSpecField"], 3);

        // The same read again is stale now: refused, not retried, naming the kind.
        let err = replace_as_read_with(&api, &ar, MANAGER, &read, |r: &mut DynamicObject| {
            r.data["spec"]["rules"] = serde_json::json!([]);
            true
        })
        .await
        .unwrap_err();
        assert!(
            matches!(&err, WriteError::Stale { kind, name, .. } if kind == "GRPCRoute" && name == "payments"),
            "{err:?}"
        );
        assert_eq!(err.category(), Category::Conflict);
        assert_eq!(
            api.get("payments").await.unwrap().data["spec"],
            stored.data["spec"]
        );

        // The read-modify-write re-reads and lands on the newer object.
        let updated = update_with_retry_with(
            &api,
            &ar,
            MANAGER,
            "payments",
            fast(3),
            |r: &mut DynamicObject| {
                let w = &mut r.data["spec"]["rules"][0]["backendRefs"][1]["weight"];
                let changed = *w != serde_json::json!(20);
                *w = serde_json::json!(20);
                changed
            },
        )
        .await
        .unwrap();
        let Updated::Written { object, .. } = updated else {
            panic!("{updated:?}")
        };
        expect["spec"]["rules"][0]["backendRefs"][1]["weight"] = serde_json::json!(20);
        assert_eq!(
            serde_json::to_string(&object.data["spec"]).unwrap(),
            serde_json::to_string(&expect["spec"]).unwrap()
        );
    }

    #[tokio::test]
    async fn stale_status_apply_fails_with_conflict() {
        let fake = FakeApi::with_configmap("ns", "cm", serde_json::json!({}));
        let api: Api<ConfigMap> = Api::namespaced(fake.client(), "ns");
        let seen = api.get("cm").await.unwrap();
        // A newer decision lands first (another leader, another reconcile).
        let fresh = apply_status(&api, MANAGER, &seen, &serde_json::json!({"phase": "New"}))
            .await
            .unwrap();
        // The decision made from the old read must not overwrite it.
        let err = apply_status(&api, MANAGER, &seen, &serde_json::json!({"phase": "Old"}))
            .await
            .unwrap_err();
        assert!(matches!(err, WriteError::Stale { .. }), "{err:?}");
        assert_eq!(err.category(), Category::Conflict);
        assert_eq!(fake.status()["phase"], "New");
        // Applying from the fresh read works.
        apply_status(
            &api,
            MANAGER,
            &fresh,
            &serde_json::json!({"phase": "Newer"}),
        )
        .await
        .unwrap();
        assert_eq!(fake.status()["phase"], "Newer");
        assert_eq!(fake.last_field_manager().as_deref(), Some("sluice-test"));
    }
}
