//! Pure sync decisions: tracking ids (annotation tracking), sync-wave ordering, and whether an
//! automated sync starts (Argo CD's auto-sync rules: once per new revision, again on drift only
//! with selfHeal, never after a failed attempt at the same revision, prune only when allowed).
//! It must never do I/O and never read the clock: time is a parameter.

use serde_json::Value;

use crate::types::{Automated, SYNC_WAVE_ANNOTATION};

/// Identity of a resource inside an Application.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ResourceKey {
    /// API group ("" for core).
    pub group: String,
    /// Kind.
    pub kind: String,
    /// Namespace ("" when cluster-scoped).
    pub namespace: String,
    /// Name.
    pub name: String,
}

impl std::fmt::Display for ResourceKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}/{}:{}/{}",
            self.group, self.kind, self.namespace, self.name
        )
    }
}

/// The application instance name used in tracking ids: `name`, or `namespace_name` for an
/// Application outside the controller's namespace.
pub fn app_instance(app_namespace: &str, app_name: &str, controller_namespace: &str) -> String {
    if app_namespace == controller_namespace {
        app_name.to_string()
    } else {
        format!("{app_namespace}_{app_name}")
    }
}

/// `<app>:<group>/<kind>:<namespace>/<name>`, Argo CD's annotation tracking id.
pub fn tracking_id(instance: &str, key: &ResourceKey) -> String {
    format!(
        "{instance}:{}/{}:{}/{}",
        key.group, key.kind, key.namespace, key.name
    )
}

/// The application instance a tracking id names, and the resource key it records.
pub fn parse_tracking_id(id: &str) -> Option<(String, ResourceKey)> {
    let (instance, rest) = id.split_once(':')?;
    let (gk, nn) = rest.split_once(':')?;
    let (group, kind) = gk.split_once('/')?;
    let (namespace, name) = nn.split_once('/')?;
    Some((
        instance.to_string(),
        ResourceKey {
            group: group.to_string(),
            kind: kind.to_string(),
            namespace: namespace.to_string(),
            name: name.to_string(),
        },
    ))
}

/// The sync wave of an object (annotation, default 0; an unparsable value counts as 0).
pub fn sync_wave(obj: &Value) -> i64 {
    obj.pointer("/metadata/annotations")
        .and_then(|a| a.get(SYNC_WAVE_ANNOTATION))
        .and_then(Value::as_str)
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(0)
}

/// Kinds applied first within a wave (gitops-engine's order); other kinds come after, custom
/// resources last.
const KIND_ORDER: &[&str] = &[
    "Namespace",
    "NetworkPolicy",
    "ResourceQuota",
    "LimitRange",
    "PodSecurityPolicy",
    "PodDisruptionBudget",
    "ServiceAccount",
    "Secret",
    "SecretList",
    "ConfigMap",
    "StorageClass",
    "PersistentVolume",
    "PersistentVolumeClaim",
    "CustomResourceDefinition",
    "ClusterRole",
    "ClusterRoleList",
    "ClusterRoleBinding",
    "ClusterRoleBindingList",
    "Role",
    "RoleList",
    "RoleBinding",
    "RoleBindingList",
    "Service",
    "DaemonSet",
    "Pod",
    "ReplicationController",
    "ReplicaSet",
    "Deployment",
    "HorizontalPodAutoscaler",
    "StatefulSet",
    "Job",
    "CronJob",
    "IngressClass",
    "Ingress",
    "APIService",
];

/// Sort key of a resource inside a sync: wave, kind order, name.
pub fn apply_order(wave: i64, key: &ResourceKey) -> (i64, usize, String, String) {
    let kind_rank = KIND_ORDER
        .iter()
        .position(|k| *k == key.kind)
        .unwrap_or(KIND_ORDER.len());
    (wave, kind_rank, key.name.clone(), key.namespace.clone())
}

/// Groups resources into waves in apply order: each inner list is one wave.
pub fn waves<T: Clone>(items: &[(i64, ResourceKey, T)]) -> Vec<Vec<(ResourceKey, T)>> {
    let mut sorted: Vec<&(i64, ResourceKey, T)> = items.iter().collect();
    sorted.sort_by_key(|(w, k, _)| apply_order(*w, k));
    let mut out: Vec<Vec<(ResourceKey, T)>> = Vec::new();
    let mut current: Option<i64> = None;
    for (w, k, t) in sorted {
        if current != Some(*w) {
            out.push(Vec::new());
            current = Some(*w);
        }
        out.last_mut()
            .expect("a wave was just pushed")
            .push((k.clone(), t.clone()));
    }
    out
}

/// What the last operation recorded.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct LastOperation {
    /// `Succeeded`, `Failed`, `Error`, `Running`, `Terminating`.
    pub phase: String,
    /// `syncResult.revision` (or the operation's revision when no result).
    pub revision: String,
}

/// Inputs of the auto-sync decision.
#[derive(Clone, Debug, Default)]
pub struct AutoSyncInput<'a> {
    /// `spec.syncPolicy.automated`.
    pub automated: Option<&'a Automated>,
    /// Whether the comparison found the Application out of sync.
    pub out_of_sync: bool,
    /// The revision compared (the one a sync would apply).
    pub revision: &'a str,
    /// The last operation, if any.
    pub last: Option<LastOperation>,
    /// Out-of-sync resources that exist in the source (need apply).
    pub needs_apply: Vec<ResourceKey>,
    /// Out-of-sync resources that need pruning.
    pub needs_prune: Vec<ResourceKey>,
    /// Whether the source holds no resource at all.
    pub desired_empty: bool,
    /// An operation is requested or running, or the Application is being deleted.
    pub busy: bool,
}

/// The auto-sync verdict.
#[derive(Clone, Debug, PartialEq)]
pub enum AutoSync {
    /// No automated sync, with the reason (as Argo CD logs it).
    Skip(String),
    /// Start a sync.
    Sync {
        /// Prune tracked resources missing from the source.
        prune: bool,
        /// Only these resources (self-heal syncs only what drifted); all when empty.
        resources: Vec<ResourceKey>,
        /// Whether this is a self-heal.
        self_heal: bool,
    },
}

/// Argo CD's auto-sync rules.
pub fn auto_sync(input: &AutoSyncInput<'_>) -> AutoSync {
    let Some(automated) = input.automated else {
        return AutoSync::Skip("automated sync is not configured".into());
    };
    if automated.enabled == Some(false) {
        return AutoSync::Skip("automated sync is disabled (enabled: false)".into());
    }
    if input.busy {
        return AutoSync::Skip("an operation is in progress".into());
    }
    if !input.out_of_sync {
        return AutoSync::Skip("application is synced".into());
    }
    if !automated.prune && input.needs_apply.is_empty() && !input.needs_prune.is_empty() {
        return AutoSync::Skip(
            "all out-of-sync resources require pruning, and automated prune is disabled".into(),
        );
    }
    if automated.prune && !automated.allow_empty && input.desired_empty {
        return AutoSync::Skip(
            "the sync would delete every resource and allowEmpty is false".into(),
        );
    }
    let mut self_heal = false;
    if let Some(last) = &input.last
        && last.revision == input.revision
    {
        match last.phase.as_str() {
            "Succeeded" => {
                if !automated.self_heal {
                    return AutoSync::Skip(format!(
                        "most recent sync already to {}; live drift is reverted only with selfHeal",
                        input.revision
                    ));
                }
                self_heal = true;
            }
            "Running" | "Terminating" => {
                return AutoSync::Skip("an operation is in progress".into());
            }
            _ => {
                return AutoSync::Skip(format!(
                    "previous sync attempt to {} failed ({}); sync manually or change the revision",
                    input.revision, last.phase
                ));
            }
        }
    }
    let resources = if self_heal {
        let mut r = input.needs_apply.clone();
        if automated.prune {
            r.extend(input.needs_prune.iter().cloned());
        }
        r
    } else {
        Vec::new()
    };
    AutoSync::Sync {
        prune: automated.prune,
        resources,
        self_heal,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn key(kind: &str, name: &str) -> ResourceKey {
        ResourceKey {
            group: String::new(),
            kind: kind.into(),
            namespace: "ns".into(),
            name: name.into(),
        }
    }

    #[test]
    fn tracking_ids_round_trip() {
        let k = ResourceKey {
            group: "apps".into(),
            kind: "Deployment".into(),
            namespace: "mesh".into(),
            name: "web".into(),
        };
        let id = tracking_id(&app_instance("argocd", "app", "argocd"), &k);
        assert_eq!(id, "app:apps/Deployment:mesh/web");
        assert_eq!(parse_tracking_id(&id), Some(("app".into(), k)));
        assert_eq!(app_instance("team", "app", "argocd"), "team_app");
        assert_eq!(parse_tracking_id("nonsense"), None);
    }

    #[test]
    fn waves_order_by_wave_then_kind_then_name() {
        let items = vec![
            (1, key("ConfigMap", "late"), ()),
            (0, key("Deployment", "web"), ()),
            (0, key("ConfigMap", "b"), ()),
            (0, key("Namespace", "ns"), ()),
            (-1, key("Service", "first"), ()),
        ];
        let w = waves(&items);
        let names: Vec<Vec<&str>> = w
            .iter()
            .map(|wave| wave.iter().map(|(k, _)| k.name.as_str()).collect())
            .collect();
        assert_eq!(
            names,
            vec![vec!["first"], vec!["ns", "b", "web"], vec!["late"]]
        );
        assert_eq!(
            sync_wave(&json!({"metadata": {"annotations": {SYNC_WAVE_ANNOTATION: "-2"}}})),
            -2
        );
        assert_eq!(sync_wave(&json!({"metadata": {}})), 0);
    }

    #[test]
    fn auto_sync_table() {
        let on = Automated::default();
        let heal = Automated {
            self_heal: true,
            ..Default::default()
        };
        let prune = Automated {
            prune: true,
            ..Default::default()
        };
        let off = Automated {
            enabled: Some(false),
            self_heal: true,
            ..Default::default()
        };
        let last = |phase: &str, rev: &str| {
            Some(LastOperation {
                phase: phase.into(),
                revision: rev.into(),
            })
        };
        let drift = vec![key("ConfigMap", "a")];
        let base = AutoSyncInput {
            automated: Some(&on),
            out_of_sync: true,
            revision: "r2",
            needs_apply: drift.clone(),
            ..Default::default()
        };
        let sync_all = AutoSync::Sync {
            prune: false,
            resources: vec![],
            self_heal: false,
        };
        let cases: Vec<(&str, AutoSyncInput, bool, Option<AutoSync>)> = vec![
            (
                "no policy",
                AutoSyncInput {
                    automated: None,
                    ..base.clone()
                },
                false,
                None,
            ),
            (
                "disabled",
                AutoSyncInput {
                    automated: Some(&off),
                    ..base.clone()
                },
                false,
                None,
            ),
            (
                "synced",
                AutoSyncInput {
                    out_of_sync: false,
                    ..base.clone()
                },
                false,
                None,
            ),
            ("new revision", base.clone(), true, Some(sync_all.clone())),
            (
                "new revision after old success",
                AutoSyncInput {
                    last: last("Succeeded", "r1"),
                    ..base.clone()
                },
                true,
                Some(sync_all.clone()),
            ),
            (
                "drift without selfHeal",
                AutoSyncInput {
                    last: last("Succeeded", "r2"),
                    ..base.clone()
                },
                false,
                None,
            ),
            (
                "drift with selfHeal",
                AutoSyncInput {
                    automated: Some(&heal),
                    last: last("Succeeded", "r2"),
                    ..base.clone()
                },
                true,
                Some(AutoSync::Sync {
                    prune: false,
                    resources: drift.clone(),
                    self_heal: true,
                }),
            ),
            (
                "failed attempt at same revision",
                AutoSyncInput {
                    automated: Some(&heal),
                    last: last("Failed", "r2"),
                    ..base.clone()
                },
                false,
                None,
            ),
            (
                "prune only, prune off",
                AutoSyncInput {
                    needs_apply: vec![],
                    needs_prune: drift.clone(),
                    ..base.clone()
                },
                false,
                None,
            ),
            (
                "prune only, prune on",
                AutoSyncInput {
                    automated: Some(&prune),
                    needs_apply: vec![],
                    needs_prune: drift.clone(),
                    ..base.clone()
                },
                true,
                Some(AutoSync::Sync {
                    prune: true,
                    resources: vec![],
                    self_heal: false,
                }),
            ),
            (
                "empty source with prune",
                AutoSyncInput {
                    automated: Some(&prune),
                    desired_empty: true,
                    ..base.clone()
                },
                false,
                None,
            ),
            (
                "busy",
                AutoSyncInput {
                    busy: true,
                    ..base.clone()
                },
                false,
                None,
            ),
        ];
        for (name, input, syncs, want) in cases {
            let got = auto_sync(&input);
            assert_eq!(
                matches!(got, AutoSync::Sync { .. }),
                syncs,
                "{name}: {got:?}"
            );
            if let Some(want) = want {
                assert_eq!(got, want, "{name}");
            }
        }
    }
}
