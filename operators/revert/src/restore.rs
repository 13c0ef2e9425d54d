//! Exact restore: what must go from a live object so that it equals the bundle's, and whether
//! it then does.
//!
//! Server-side apply removes a field only when the same manager applied it before and omits it
//! now, so applying the pinned bundle under revert's own manager leaves every field the bad
//! change added outside atomic lists (a DestinationRule `trafficPolicy.connectionPool`, a
//! VirtualService `retries`, an annotation). Argo CD writes every object it syncs under one
//! field manager ([`ARGOCD_MANAGERS`]); the fields that manager still owns after revert's apply
//! and that the bundle lacks are exactly what the bad revision added. [`removals`] names them
//! (JSON pointers into the live object); [`differences`] then compares the live object with the
//! bundle's object as the API server defaults it (a server-side dry-run), so a pin is declared
//! only once the object really is the bundle's.
//!
//! Pure: never reads or writes a cluster. Never names a field another manager owns (a person's
//! or another controller's edit is reported by [`differences`], not silently wiped), and never
//! a field inside an atomic list (the apply already replaced the whole list).

use serde_json::Value;

/// The field managers Argo CD's application controller writes under: `argocd-controller` for
/// server-side and client-side apply alike (argo-cd `common.ArgoCDSSAManager`, passed by the
/// sync context to every `ApplyResource`).
pub const ARGOCD_MANAGERS: &[&str] = &["argocd-controller"];

/// Annotations that are Argo CD's or kubectl's bookkeeping, never configuration: kept even when
/// the bundle does not set them.
pub const BOOKKEEPING_ANNOTATIONS: &[&str] = &[
    "kubectl.kubernetes.io/last-applied-configuration",
    "argocd.argoproj.io/tracking-id",
    "argocd.argoproj.io/installation-id",
];

/// Top-level fields that are not the object's configuration.
const NOT_CONTENT: &[&str] = &["apiVersion", "kind", "metadata", "status"];

/// Most differences named in one message.
pub const SHOWN: usize = 5;

/// The fieldsV1 trees of `managers`' entries in a `metadata.managedFields` list.
pub fn owned_fields<'a>(managed_fields: &'a Value, managers: &[&str]) -> Vec<&'a Value> {
    managed_fields
        .as_array()
        .into_iter()
        .flatten()
        .filter(|e| {
            e.get("manager")
                .and_then(Value::as_str)
                .is_some_and(|m| managers.contains(&m))
        })
        .filter_map(|e| e.get("fieldsV1"))
        .collect()
}

/// JSON pointers (into `live`) of the fields `managers` own in `live` that `desired` lacks: the
/// topmost missing node of each owned path, in an order that removes them safely one after the
/// other (later items of one list first). Only configuration counts: every top-level field but
/// `apiVersion`, `kind`, `metadata` and `status`, plus `metadata.labels` and
/// `metadata.annotations` (bookkeeping annotations excepted).
pub fn removals(live: &Value, desired: &Value, managers: &[&str]) -> Vec<String> {
    let mut out = Vec::new();
    let managed = live
        .pointer("/metadata/managedFields")
        .unwrap_or(&Value::Null);
    for tree in owned_fields(managed, managers) {
        let Some(top) = tree.as_object() else {
            continue;
        };
        for (pe, sub) in top {
            let Some(field) = pe.strip_prefix("f:") else {
                continue;
            };
            if field == "metadata" {
                for meta in ["labels", "annotations"] {
                    let Some(sub) = sub.get(format!("f:{meta}")) else {
                        continue;
                    };
                    let ptr = format!("/metadata/{meta}");
                    let l = live.pointer(&ptr);
                    let d = desired.pointer(&ptr);
                    let Some(entries) = sub.as_object() else {
                        continue;
                    };
                    for key in entries.keys().filter_map(|k| k.strip_prefix("f:")) {
                        if meta == "annotations" && BOOKKEEPING_ANNOTATIONS.contains(&key) {
                            continue;
                        }
                        let in_live = l.and_then(|l| l.get(key)).is_some();
                        let in_desired = d.and_then(|d| d.get(key)).is_some();
                        if in_live && !in_desired {
                            out.push(format!("{ptr}/{}", escape(key)));
                        }
                    }
                }
                continue;
            }
            if NOT_CONTENT.contains(&field) {
                continue;
            }
            let ptr = format!("/{}", escape(field));
            match (live.get(field), desired.get(field)) {
                (None, _) => {}
                (Some(_), None) => out.push(ptr),
                (Some(l), Some(d)) => walk(sub, l, d, &ptr, &mut out),
            }
        }
    }
    out.sort_by(|a, b| order(b, a));
    out.dedup();
    // A node whose ancestor goes is not removed on its own.
    let all = out.clone();
    out.retain(|p| {
        !all.iter()
            .any(|q| q != p && p.starts_with(q.as_str()) && p[q.len()..].starts_with('/'))
    });
    out
}

fn walk(tree: &Value, live: &Value, desired: &Value, ptr: &str, out: &mut Vec<String>) {
    let Some(children) = tree.as_object() else {
        return;
    };
    for (pe, sub) in children {
        if pe == "." {
            continue;
        }
        let Some((l, d, seg)) = resolve(pe, live, desired) else {
            continue;
        };
        let child = format!("{ptr}/{seg}");
        match d {
            None => out.push(child),
            Some(d) => walk(sub, l, d, &child, out),
        }
    }
}

/// The live node a path element names, the desired node (when the bundle has it) and the
/// pointer segment of the live node; `None` when live lacks it.
fn resolve<'a>(
    pe: &str,
    live: &'a Value,
    desired: &'a Value,
) -> Option<(&'a Value, Option<&'a Value>, String)> {
    if let Some(name) = pe.strip_prefix("f:") {
        let l = live.get(name)?;
        return Some((l, desired.get(name), escape(name)));
    }
    let items = live.as_array()?;
    let wanted = desired.as_array();
    if let Some(key) = pe.strip_prefix("k:") {
        let key: Value = serde_json::from_str(key).ok()?;
        let matches = |item: &Value| {
            key.as_object()
                .is_some_and(|k| k.iter().all(|(f, v)| item.get(f) == Some(v)))
        };
        let index = items.iter().position(matches)?;
        let d = wanted.and_then(|w| w.iter().find(|i| matches(i)));
        return Some((&items[index], d, index.to_string()));
    }
    if let Some(value) = pe.strip_prefix("v:") {
        let value: Value = serde_json::from_str(value).ok()?;
        let index = items.iter().position(|i| *i == value)?;
        let d = wanted.and_then(|w| w.iter().find(|i| **i == value));
        return Some((&items[index], d, index.to_string()));
    }
    if let Some(index) = pe.strip_prefix("i:") {
        let index: usize = index.parse().ok()?;
        let l = items.get(index)?;
        return Some((l, wanted.and_then(|w| w.get(index)), index.to_string()));
    }
    None
}

/// RFC 6901 escaping of one pointer segment.
fn escape(s: &str) -> String {
    s.replace('~', "~0").replace('/', "~1")
}

/// Pointer order with list indices compared as numbers.
fn order(a: &str, b: &str) -> std::cmp::Ordering {
    let seg = |s: &str| -> Vec<(u8, u64, String)> {
        s.split('/')
            .map(|p| match p.parse::<u64>() {
                Ok(n) => (0, n, String::new()),
                Err(_) => (1, 0, p.to_owned()),
            })
            .collect()
    };
    seg(a).cmp(&seg(b))
}

/// Where `live` differs from `expected` (the bundle's object as the API server stores it, from
/// a server-side dry-run): every configuration field must be equal, and every label and
/// annotation the bundle (`desired`) sets. JSON pointers, sorted.
pub fn differences(live: &Value, expected: &Value, desired: &Value) -> Vec<String> {
    let mut out = Vec::new();
    let keys = |v: &Value| -> Vec<String> {
        v.as_object()
            .map(|o| {
                o.keys()
                    .filter(|k| !NOT_CONTENT.contains(&k.as_str()))
                    .cloned()
                    .collect()
            })
            .unwrap_or_default()
    };
    let mut fields = keys(live);
    fields.extend(keys(expected));
    fields.sort();
    fields.dedup();
    for f in fields {
        diff(
            live.get(&f),
            expected.get(&f),
            &format!("/{}", escape(&f)),
            &mut out,
        );
    }
    for meta in ["labels", "annotations"] {
        let ptr = format!("/metadata/{meta}");
        if let Some(want) = desired.pointer(&ptr).and_then(Value::as_object) {
            for (k, v) in want {
                if live.pointer(&ptr).and_then(|l| l.get(k)) != Some(v) {
                    out.push(format!("{ptr}/{}", escape(k)));
                }
            }
        }
    }
    out.sort();
    out
}

fn diff(a: Option<&Value>, b: Option<&Value>, ptr: &str, out: &mut Vec<String>) {
    match (a, b) {
        (Some(Value::Object(x)), Some(Value::Object(y))) => {
            let mut keys: Vec<&String> = x.keys().chain(y.keys()).collect();
            keys.sort();
            keys.dedup();
            for k in keys {
                diff(x.get(k), y.get(k), &format!("{ptr}/{}", escape(k)), out);
            }
        }
        (Some(Value::Array(x)), Some(Value::Array(y))) if x.len() == y.len() => {
            for (i, (p, q)) in x.iter().zip(y).enumerate() {
                diff(Some(p), Some(q), &format!("{ptr}/{i}"), out);
            }
        }
        (a, b) if a == b => {}
        _ => out.push(ptr.to_owned()),
    }
}

/// `a, b, c, d, e and N more`.
pub fn shown(paths: &[String]) -> String {
    let mut s = paths
        .iter()
        .take(SHOWN)
        .cloned()
        .collect::<Vec<_>>()
        .join(", ");
    if paths.len() > SHOWN {
        s.push_str(&format!(" and {} more", paths.len() - SHOWN));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// A DestinationRule the bad change synced (connectionPool, an outlier rule in a keyed
    /// list, an annotation) after revert applied the good one over it.
    fn live_after_apply() -> Value {
        json!({
            "apiVersion": "networking.istio.io/v1",
            "kind": "DestinationRule",
            "metadata": {
                "name": "checkout",
                "annotations": {
                    "debug": "on",
                    "kubectl.kubernetes.io/last-applied-configuration": "{}",
                    "team": "shop"
                },
                "labels": {"app": "checkout"},
                "managedFields": [
                    {"manager": "argocd-controller", "operation": "Apply", "fieldsV1": {
                        "f:metadata": {"f:annotations": {"f:debug": {}, "f:kubectl.kubernetes.io/last-applied-configuration": {}}},
                        "f:spec": {"f:trafficPolicy": {
                            "f:connectionPool": {"f:tcp": {"f:maxConnections": {}}},
                            "f:loadBalancer": {"f:simple": {}}
                        }, "f:subsets": {"k:{\"name\":\"v1\"}": {".": {}, "f:name": {}}, "k:{\"name\":\"v9\"}": {".": {}, "f:name": {}}}}
                    }},
                    {"manager": "sluice-revert", "operation": "Apply", "fieldsV1": {
                        "f:metadata": {"f:labels": {"f:app": {}}},
                        "f:spec": {"f:host": {}, "f:trafficPolicy": {"f:loadBalancer": {"f:simple": {}}}}
                    }},
                    {"manager": "kubectl-edit", "operation": "Update", "fieldsV1": {
                        "f:metadata": {"f:annotations": {"f:team": {}}},
                        "f:spec": {"f:exportTo": {}}
                    }}
                ]
            },
            "spec": {
                "host": "checkout",
                "exportTo": ["."],
                "subsets": [{"name": "v1"}, {"name": "v9"}],
                "trafficPolicy": {
                    "connectionPool": {"tcp": {"maxConnections": 1}},
                    "loadBalancer": {"simple": "ROUND_ROBIN"}
                }
            }
        })
    }

    fn desired() -> Value {
        json!({
            "apiVersion": "networking.istio.io/v1",
            "kind": "DestinationRule",
            "metadata": {"name": "checkout", "labels": {"app": "checkout"}},
            "spec": {"host": "checkout", "subsets": [{"name": "v1"}], "trafficPolicy": {"loadBalancer": {"simple": "ROUND_ROBIN"}}}
        })
    }

    #[test]
    fn only_what_argo_cd_owns_and_the_bundle_lacks_goes() {
        let got = removals(&live_after_apply(), &desired(), ARGOCD_MANAGERS);
        assert_eq!(
            got,
            vec![
                "/spec/trafficPolicy/connectionPool".to_owned(),
                "/spec/subsets/1".to_owned(),
                "/metadata/annotations/debug".to_owned(),
            ],
            "the bad change's fields; not the person's exportTo or annotation, not kubectl's bookkeeping"
        );
    }

    #[test]
    fn nothing_goes_when_live_is_the_bundle_or_nobody_named_owns_it() {
        let live = live_after_apply();
        assert!(removals(&live, &live, ARGOCD_MANAGERS).is_empty());
        assert!(removals(&live, &desired(), &["someone-else"]).is_empty());
        assert!(removals(&json!({"spec": {}}), &desired(), ARGOCD_MANAGERS).is_empty());
    }

    #[test]
    fn later_items_of_one_list_go_first_and_children_of_removed_nodes_are_not_named() {
        let live = json!({
            "metadata": {"managedFields": [{"manager": "argocd-controller", "fieldsV1": {"f:spec": {
                "f:http": {"k:{\"name\":\"a\"}": {"f:retries": {"f:attempts": {}}}, "k:{\"name\":\"b\"}": {}, "k:{\"name\":\"c\"}": {}}
            }}}]},
            "spec": {"http": [
                {"name": "a", "retries": {"attempts": 3}},
                {"name": "b"}, {"name": "c"}
            ]}
        });
        let desired = json!({"spec": {"http": [{"name": "a"}]}});
        assert_eq!(
            removals(&live, &desired, ARGOCD_MANAGERS),
            vec!["/spec/http/2", "/spec/http/1", "/spec/http/0/retries"]
        );
        let mut order = vec!["/spec/x/10".to_owned(), "/spec/x/9".to_owned()];
        order.sort_by(|a, b| self::order(b, a));
        assert_eq!(order, vec!["/spec/x/10", "/spec/x/9"]);
    }

    #[test]
    fn differences_name_every_field_that_is_not_the_bundles() {
        let expected = json!({
            "apiVersion": "networking.istio.io/v1",
            "kind": "DestinationRule",
            "metadata": {"name": "checkout", "labels": {"app": "checkout"}},
            "spec": {"host": "checkout", "subsets": [{"name": "v1"}], "trafficPolicy": {"loadBalancer": {"simple": "ROUND_ROBIN"}}}
        });
        let table: [(&str, Value, Vec<&str>); 4] = [
            ("equal", expected.clone(), vec![]),
            (
                "a field left behind",
                {
                    let mut l = expected.clone();
                    l["spec"]["trafficPolicy"]["connectionPool"] = json!({"tcp": {}});
                    l
                },
                vec!["/spec/trafficPolicy/connectionPool"],
            ),
            (
                "a label changed, an unrelated annotation kept",
                {
                    let mut l = expected.clone();
                    l["metadata"]["labels"]["app"] = json!("other");
                    l["metadata"]["annotations"] = json!({"team": "shop"});
                    l
                },
                vec!["/metadata/labels/app"],
            ),
            (
                "status and managedFields do not count",
                {
                    let mut l = expected.clone();
                    l["status"] = json!({"x": 1});
                    l["metadata"]["managedFields"] = json!([]);
                    l
                },
                vec![],
            ),
        ];
        for (name, live, want) in table {
            assert_eq!(differences(&live, &expected, &expected), want, "{name}");
        }
    }

    #[test]
    fn messages_show_a_bounded_number_of_fields() {
        let many: Vec<String> = (0..7).map(|i| format!("/spec/f{i}")).collect();
        assert_eq!(
            shown(&many),
            "/spec/f0, /spec/f1, /spec/f2, /spec/f3, /spec/f4 and 2 more"
        );
    }
}
