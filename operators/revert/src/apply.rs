//! Writes to a destination cluster, as revert's own identity there: server-side apply of the
//! bundle's objects under the `sluice-revert` field manager (forced: the pin takes the fields
//! the bad change set), deletion of pruned objects, and on release the removal of revert's
//! managedFields entries so later Git removals prune.
//!
//! Owns only these three writes. Never writes an object the bundle does not hold except to
//! prune one the decision named, and never touches the management cluster.

use std::{collections::BTreeMap, sync::Mutex};

use futures::{StreamExt, TryStreamExt, stream};
use kube::{
    Api, Client,
    api::{ApiResource, DeleteParams, DynamicObject, GroupVersionKind, Patch, PatchParams},
    discovery::{self, Scope},
};
use serde_json::{Value, json};
use sluice_bundle::BundleObject;
use sluice_runtime::{Categorized, Category};

use crate::{
    decide::{AppKey, ObjectKey},
    restore,
    tracking::Tracking,
};

/// Argo CD's tracking to stamp on every object written for one Application.
#[derive(Debug, Clone, Copy)]
pub struct Track<'a> {
    /// Argo CD's tracking settings.
    pub tracking: &'a Tracking,
    /// The Application.
    pub app: &'a AppKey,
}

/// The body written for a bundle object: its namespace set and Argo CD's tracking added.
fn body_of(o: &BundleObject, ns: Option<&str>, track: Option<Track<'_>>) -> Value {
    let mut body = o.value.clone();
    if let (Some(ns), Some(meta)) = (ns, body.get_mut("metadata")) {
        meta["namespace"] = json!(ns);
    }
    if let Some(t) = track {
        t.tracking
            .stamp(&mut body, &t.app.namespace, &t.app.name, ns);
    }
    body
}

/// Objects written concurrently per destination.
pub const CONCURRENCY: usize = 16;

/// A write to a destination that failed.
#[derive(Debug, thiserror::Error)]
pub enum ApplyError {
    /// The kind is not served by the destination.
    #[error(
        "{object}: kind {gvk} is not served by destination {destination} ({source}); install its CRD there"
    )]
    Discovery {
        /// The object.
        object: String,
        /// group/version/kind.
        gvk: String,
        /// The destination.
        destination: String,
        /// The API error.
        source: kube::Error,
    },
    /// The kind is cluster-scoped in the destination: a pin writes and prunes only namespaced
    /// objects, which an Application's destination and AppProject bound.
    #[error(
        "{object}: kind {gvk} is cluster-scoped in destination {destination}; a pin applies and prunes namespaced objects only (a cluster-scoped object is shared by every namespace and Application): remove it from the bundle or from the allowed kinds, and revert it in Git"
    )]
    ClusterScoped {
        /// The object.
        object: String,
        /// group/version/kind.
        gvk: String,
        /// The destination.
        destination: String,
    },
    /// After the apply and the removals the object still differs from the bundle's (a field
    /// another manager owns, or a removal that did not hold).
    #[error(
        "{object} in destination {destination} still differs from the pinned bundle at {fields}; the pin is not declared until it equals the bundle (a field another manager than Argo CD set is never removed by revert: remove it, or release the pin)"
    )]
    NotRestored {
        /// The object.
        object: String,
        /// The destination.
        destination: String,
        /// The differing fields (JSON pointers), bounded.
        fields: String,
    },
    /// The API server refused a write.
    #[error("{verb} {object} in destination {destination}: {source}")]
    Write {
        /// apply, delete or patch.
        verb: &'static str,
        /// The object.
        object: String,
        /// The destination.
        destination: String,
        /// The API error.
        source: kube::Error,
    },
}

impl Categorized for ApplyError {
    fn category(&self) -> Category {
        match self {
            ApplyError::Discovery { .. } => Category::ApiUnavailable,
            ApplyError::ClusterScoped { .. } => Category::Rejected,
            ApplyError::NotRestored { .. } => Category::Conflict,
            ApplyError::Write { source, .. } => Category::of_kube(source),
        }
    }
}

/// (destination, group, version, kind).
type KindKey = (String, String, String, String);

/// Discovery results per destination, so a pin of 500 objects asks once per kind.
#[derive(Debug, Default)]
pub struct Kinds {
    cache: Mutex<BTreeMap<KindKey, (ApiResource, bool)>>,
}

impl Kinds {
    async fn resolve(
        &self,
        client: &Client,
        destination: &str,
        gvk: &GroupVersionKind,
        object: &str,
    ) -> Result<(ApiResource, bool), ApplyError> {
        let key = (
            destination.to_owned(),
            gvk.group.clone(),
            gvk.version.clone(),
            gvk.kind.clone(),
        );
        if let Some(hit) = self.cache.lock().expect("kinds lock").get(&key) {
            return Ok(hit.clone());
        }
        let (ar, caps) = discovery::pinned_kind(client, gvk)
            .await
            .map_err(|source| ApplyError::Discovery {
                object: object.to_owned(),
                gvk: format!("{}/{}/{}", gvk.group, gvk.version, gvk.kind),
                destination: destination.to_owned(),
                source,
            })?;
        let namespaced = caps.scope == Scope::Namespaced;
        self.cache
            .lock()
            .expect("kinds lock")
            .insert(key, (ar.clone(), namespaced));
        Ok((ar, namespaced))
    }

    async fn api(
        &self,
        client: &Client,
        destination: &str,
        gvk: &GroupVersionKind,
        namespace: Option<&str>,
        object: &str,
    ) -> Result<Api<DynamicObject>, ApplyError> {
        let (ar, namespaced) = self.resolve(client, destination, gvk, object).await?;
        if !namespaced {
            return Err(ApplyError::ClusterScoped {
                object: object.to_owned(),
                gvk: format!("{}/{}/{}", gvk.group, gvk.version, gvk.kind),
                destination: destination.to_owned(),
            });
        }
        Ok(match namespace {
            Some(ns) => Api::namespaced_with(client.clone(), ns, &ar),
            None => Api::all_with(client.clone(), &ar),
        })
    }
}

fn gvk_of(api_version: &str, kind: &str) -> GroupVersionKind {
    let (group, version) = api_version.rsplit_once('/').unwrap_or(("", api_version));
    GroupVersionKind::gvk(group, version, kind)
}

/// Where a bundle object goes: its own namespace, else the Application's.
fn namespace_of<'a>(o: &'a BundleObject, default_ns: Option<&'a str>) -> Option<&'a str> {
    o.namespace.as_deref().or(default_ns)
}

/// How many fields the exact restore removed, over all objects.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Restored {
    /// Objects written.
    pub objects: usize,
    /// Fields removed because Argo CD's manager owned them and the bundle lacks them.
    pub removed_fields: usize,
}

/// Restores every object exactly (see [`restore_object`]); returns what was written.
pub async fn apply_objects(
    kinds: &Kinds,
    client: &Client,
    destination: &str,
    objects: &[BundleObject],
    default_ns: Option<&str>,
    manager: &str,
    track: Option<Track<'_>>,
) -> Result<Restored, ApplyError> {
    let work: Vec<_> = objects
        .iter()
        .map(|o| restore_object(kinds, client, destination, o, default_ns, manager, track))
        .collect();
    let removed: Vec<usize> = stream::iter(work)
        .buffer_unordered(CONCURRENCY)
        .try_collect()
        .await?;
    Ok(Restored {
        objects: objects.len(),
        removed_fields: removed.into_iter().sum(),
    })
}

/// Attempts at removing fields when the object changes under revert (409 or a failed `test`).
const REMOVAL_ATTEMPTS: usize = 5;

/// Makes one live object equal to the bundle's: server-side apply (forced, `manager`), removal
/// of the fields [`restore::ARGOCD_MANAGERS`] own that the bundle lacks (JSON patch fenced by a
/// `test` of the resourceVersion), then a server-side dry-run of the bundle's configuration over
/// the live object (defaults applied) compared with the live object. Returns how many fields
/// were removed; [`ApplyError::NotRestored`] when the object still differs.
pub async fn restore_object(
    kinds: &Kinds,
    client: &Client,
    destination: &str,
    o: &BundleObject,
    default_ns: Option<&str>,
    manager: &str,
    track: Option<Track<'_>>,
) -> Result<usize, ApplyError> {
    let ns = namespace_of(o, default_ns);
    let gvk = gvk_of(&o.api_version, &o.group_kind.kind);
    let shown = o.display_name();
    let api = kinds.api(client, destination, &gvk, ns, &shown).await?;
    let body = body_of(o, ns, track);
    let write_err = |verb: &'static str| {
        let shown = shown.clone();
        move |source| ApplyError::Write {
            verb,
            object: shown,
            destination: destination.to_owned(),
            source,
        }
    };
    let applied = api
        .patch(
            &o.name,
            &PatchParams::apply(manager).force(),
            &Patch::Apply(&body),
        )
        .await
        .map_err(write_err("apply"))?;
    let mut live = serde_json::to_value(&applied).unwrap_or(Value::Null);
    let mut removed = 0;
    for attempt in 0..REMOVAL_ATTEMPTS {
        let gone = restore::removals(&live, &body, restore::ARGOCD_MANAGERS);
        if gone.is_empty() {
            break;
        }
        let mut ops = vec![json!({
            "op": "test",
            "path": "/metadata/resourceVersion",
            "value": live.pointer("/metadata/resourceVersion").cloned().unwrap_or(Value::Null),
        })];
        ops.extend(gone.iter().map(|p| json!({"op": "remove", "path": p})));
        let patch = serde_json::from_value(Value::Array(ops)).expect("a JSON patch");
        match api
            .patch(
                &o.name,
                &PatchParams {
                    field_manager: Some(manager.to_owned()),
                    ..PatchParams::default()
                },
                &Patch::<()>::Json(patch),
            )
            .await
        {
            Ok(after) => {
                tracing::info!(object = %shown, destination, fields = %restore::shown(&gone), "removed fields the pinned bundle lacks");
                removed += gone.len();
                live = serde_json::to_value(&after).unwrap_or(Value::Null);
                break;
            }
            // Changed since read: read again and recompute.
            Err(kube::Error::Api(s))
                if (s.code == 409 || s.code == 422) && attempt + 1 < REMOVAL_ATTEMPTS =>
            {
                let again = api.get(&o.name).await.map_err(write_err("read"))?;
                live = serde_json::to_value(&again).unwrap_or(Value::Null);
            }
            Err(source) => return Err(write_err("remove fields of")(source)),
        }
    }
    // The bundle's configuration as the API server would store it over this object.
    let mut ops = Vec::new();
    for (k, v) in body.as_object().into_iter().flatten() {
        if !matches!(k.as_str(), "apiVersion" | "kind" | "metadata" | "status") {
            ops.push(json!({"op": "add", "path": format!("/{k}"), "value": v}));
        }
    }
    for (k, _) in live.as_object().into_iter().flatten() {
        if !matches!(k.as_str(), "apiVersion" | "kind" | "metadata" | "status")
            && body.get(k).is_none()
        {
            ops.push(json!({"op": "remove", "path": format!("/{k}")}));
        }
    }
    let expected = if ops.is_empty() {
        live.clone()
    } else {
        let patch = serde_json::from_value(Value::Array(ops)).expect("a JSON patch");
        let dry = api
            .patch(
                &o.name,
                &PatchParams {
                    field_manager: Some(manager.to_owned()),
                    dry_run: true,
                    ..PatchParams::default()
                },
                &Patch::<()>::Json(patch),
            )
            .await
            .map_err(write_err("dry-run the bundle's configuration over"))?;
        serde_json::to_value(&dry).unwrap_or(Value::Null)
    };
    let differs = restore::differences(&live, &expected, &body);
    if !differs.is_empty() {
        return Err(ApplyError::NotRestored {
            object: shown,
            destination: destination.to_owned(),
            fields: restore::shown(&differs),
        });
    }
    Ok(removed)
}

/// Proves revert can carry out a pin in the destination before anything is suspended:
/// server-side dry-run (`dryRun=All`) of the forced apply of every object and of every delete
/// of `prune`. Fails like the real writes would (identity refused, a kind not served, 403,
/// 422), so nothing is suspended for a pin that cannot apply.
#[allow(clippy::too_many_arguments)]
pub async fn preflight(
    kinds: &Kinds,
    client: &Client,
    destination: &str,
    objects: &[BundleObject],
    default_ns: Option<&str>,
    prune: &[ObjectKey],
    manager: &str,
    track: Option<Track<'_>>,
) -> Result<(), ApplyError> {
    let mut params = PatchParams::apply(manager).force();
    params.dry_run = true;
    stream::iter(objects.iter().map(Ok))
        .try_for_each_concurrent(CONCURRENCY, |o| {
            let params = params.clone();
            async move {
                let ns = namespace_of(o, default_ns);
                let gvk = gvk_of(&o.api_version, &o.group_kind.kind);
                let shown = o.display_name();
                let api = kinds.api(client, destination, &gvk, ns, &shown).await?;
                let body = body_of(o, ns, track);
                api.patch(&o.name, &params, &Patch::Apply(&body))
                    .await
                    .map_err(|source| ApplyError::Write {
                        verb: "dry-run apply",
                        object: shown,
                        destination: destination.to_owned(),
                        source,
                    })?;
                Ok(())
            }
        })
        .await?;
    let delete = DeleteParams {
        dry_run: true,
        ..DeleteParams::default()
    };
    stream::iter(prune.iter().map(Ok))
        .try_for_each_concurrent(CONCURRENCY, |o| {
            let delete = delete.clone();
            async move {
                let version = if o.version.is_empty() {
                    "v1"
                } else {
                    &o.version
                };
                let gvk = GroupVersionKind::gvk(&o.group, version, &o.kind);
                let shown = o.display();
                let ns = (!o.namespace.is_empty()).then_some(o.namespace.as_str());
                let api = kinds.api(client, destination, &gvk, ns, &shown).await?;
                match api.delete(&o.name, &delete).await {
                    Ok(_) => Ok(()),
                    Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
                    Err(source) => Err(ApplyError::Write {
                        verb: "dry-run delete",
                        object: shown,
                        destination: destination.to_owned(),
                        source,
                    }),
                }
            }
        })
        .await
}

/// Argo CD's per-resource sync options annotation.
pub const SYNC_OPTIONS_ANNOTATION: &str = "argocd.argoproj.io/sync-options";

/// Whether Argo CD's sync options on an object forbid deleting it (`Prune=false` or
/// `Delete=false`, comma-separated as Argo CD reads them).
pub fn protected(sync_options: Option<&str>) -> bool {
    sync_options.is_some_and(|o| {
        o.split(',')
            .map(str::trim)
            .any(|x| x == "Prune=false" || x == "Delete=false")
    })
}

/// Deletes the objects (already gone counts as deleted), each with a UID precondition (the
/// object read, not one recreated since), never one Argo CD's sync options protect
/// (`Prune=false`, `Delete=false`); returns how many were deleted.
pub async fn prune_objects(
    kinds: &Kinds,
    client: &Client,
    destination: &str,
    objects: &[ObjectKey],
) -> Result<usize, ApplyError> {
    let work: Vec<_> = objects
        .iter()
        .map(|o| prune_one(kinds, client, destination, o))
        .collect();
    let deleted: Vec<bool> = stream::iter(work)
        .buffer_unordered(CONCURRENCY)
        .try_collect()
        .await?;
    Ok(deleted.into_iter().filter(|d| *d).count())
}

async fn prune_one(
    kinds: &Kinds,
    client: &Client,
    destination: &str,
    o: &ObjectKey,
) -> Result<bool, ApplyError> {
    let version = if o.version.is_empty() {
        "v1"
    } else {
        &o.version
    };
    let gvk = GroupVersionKind::gvk(&o.group, version, &o.kind);
    let shown = o.display();
    let ns = (!o.namespace.is_empty()).then_some(o.namespace.as_str());
    let api = kinds.api(client, destination, &gvk, ns, &shown).await?;
    let err = |verb: &'static str, source| ApplyError::Write {
        verb,
        object: shown.clone(),
        destination: destination.to_owned(),
        source,
    };
    let Some(live) = api.get_opt(&o.name).await.map_err(|e| err("read", e))? else {
        return Ok(false);
    };
    if protected(
        live.metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(SYNC_OPTIONS_ANNOTATION))
            .map(String::as_str),
    ) {
        tracing::info!(object = %shown, destination, "not pruned: Argo CD's sync options protect it (Prune=false or Delete=false)");
        return Ok(false);
    }
    let params = DeleteParams {
        preconditions: Some(kube::api::Preconditions {
            uid: live.metadata.uid.clone(),
            resource_version: None,
        }),
        ..DeleteParams::default()
    };
    match api.delete(&o.name, &params).await {
        Ok(_) => Ok(true),
        // Gone, or replaced by a new object since it was read: not the object to prune.
        Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => Ok(false),
        Err(source) => Err(err("delete", source)),
    }
}

/// The managedFields list without `manager`'s entries, or `None` when it has none.
pub fn without_manager(managed: &Value, manager: &str) -> Option<Vec<Value>> {
    let entries = managed.as_array()?;
    let kept: Vec<Value> = entries
        .iter()
        .filter(|e| e.get("manager").and_then(Value::as_str) != Some(manager))
        .cloned()
        .collect();
    (kept.len() != entries.len()).then_some(kept)
}

/// Removes `manager`'s managedFields entries from every object still present (the pinned
/// objects as verification recorded them); returns how many objects changed.
pub async fn drop_ownership(
    kinds: &Kinds,
    client: &Client,
    destination: &str,
    objects: &[ObjectKey],
    default_ns: Option<&str>,
    manager: &str,
) -> Result<usize, ApplyError> {
    let work: Vec<_> = objects
        .iter()
        .map(|o| drop_one(kinds, client, destination, o, default_ns, manager))
        .collect();
    let changed: Vec<bool> = stream::iter(work)
        .buffer_unordered(CONCURRENCY)
        .try_collect()
        .await?;
    Ok(changed.into_iter().filter(|c| *c).count())
}

async fn drop_one(
    kinds: &Kinds,
    client: &Client,
    destination: &str,
    o: &ObjectKey,
    default_ns: Option<&str>,
    manager: &str,
) -> Result<bool, ApplyError> {
    let ns = if o.namespace.is_empty() {
        default_ns
    } else {
        Some(o.namespace.as_str())
    };
    let version = if o.version.is_empty() {
        "v1"
    } else {
        &o.version
    };
    let gvk = GroupVersionKind::gvk(&o.group, version, &o.kind);
    let shown = o.display();
    let api = kinds.api(client, destination, &gvk, ns, &shown).await?;
    let write_err = |source| ApplyError::Write {
        verb: "patch managedFields of",
        object: shown.clone(),
        destination: destination.to_owned(),
        source,
    };
    // Read-modify-write with a resourceVersion precondition; a few retries on 409.
    for _ in 0..5 {
        let live = match api.get_opt(&o.name).await.map_err(write_err)? {
            Some(live) => live,
            None => return Ok(false),
        };
        let managed = serde_json::to_value(&live.metadata.managed_fields).unwrap_or(Value::Null);
        let Some(kept) = without_manager(&managed, manager) else {
            return Ok(false);
        };
        // An empty list is ignored by the API server; `[{}]` clears it.
        let kept = if kept.is_empty() {
            vec![json!({})]
        } else {
            kept
        };
        let patch = json!({"metadata": {
            "managedFields": kept,
            "resourceVersion": live.metadata.resource_version,
        }});
        match api
            .patch(&o.name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(_) => return Ok(true),
            Err(kube::Error::Api(s)) if s.code == 409 => continue,
            Err(source) => return Err(write_err(source)),
        }
    }
    Ok(false)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_named_managers_entries_are_dropped() {
        let managed = json!([
            {"manager": "argocd-controller", "operation": "Apply"},
            {"manager": "sluice-revert", "operation": "Apply"},
            {"manager": "kubectl", "operation": "Update"},
        ]);
        let table = [
            (
                "sluice-revert",
                Some(vec![managed[0].clone(), managed[2].clone()]),
            ),
            ("someone-else", None),
        ];
        for (manager, want) in table {
            assert_eq!(without_manager(&managed, manager), want, "{manager}");
        }
        assert_eq!(
            without_manager(&json!([{"manager": "sluice-revert"}]), "sluice-revert"),
            Some(vec![])
        );
        assert_eq!(without_manager(&Value::Null, "sluice-revert"), None);
    }

    #[test]
    fn argo_cds_sync_options_protect_from_prune() {
        let table = [
            (None, false),
            (Some("Prune=false"), true),
            (Some("ServerSideApply=true, Delete=false"), true),
            (Some("Prune=true"), false),
            (Some("Replace=true"), false),
        ];
        for (options, want) in table {
            assert_eq!(protected(options), want, "{options:?}");
        }
    }

    #[test]
    fn group_version_split() {
        let table = [
            (
                "gateway.networking.k8s.io/v1",
                ("gateway.networking.k8s.io", "v1"),
            ),
            ("v1", ("", "v1")),
        ];
        for (api_version, (group, version)) in table {
            let gvk = gvk_of(api_version, "K");
            assert_eq!((gvk.group.as_str(), gvk.version.as_str()), (group, version));
        }
    }
}
