//! Discovery and OpenAPI documents: `/version`, `/api`, `/apis`, resource lists per
//! group/version, `/openapi/v2` and `/openapi/v3` (CRD schemas, so `kubectl explain` works), and
//! the `Table` rendering `kubectl get` asks for.
//!
//! Pure renderers over the resource registry; never reads or writes objects except the ones
//! handed in for table rows.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde_json::{Value, json};

use crate::resources::ResourceType;

/// `/version`.
pub fn version() -> Value {
    json!({
        "major": "1", "minor": "32", "gitVersion": "v1.32.0", "gitCommit": "kube-emulator",
        "gitTreeState": "clean", "buildDate": "2026-01-01T00:00:00Z", "goVersion": "n/a",
        "compiler": "rust", "platform": "linux/amd64"
    })
}

/// `/api`.
pub fn core_versions(server_address: &str) -> Value {
    json!({"kind": "APIVersions", "versions": ["v1"],
        "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": server_address}]})
}

fn group_entry(group: &str, versions: &[String], preferred: &str) -> Value {
    json!({
        "name": group,
        "versions": versions.iter().map(|v| json!({"groupVersion": format!("{group}/{v}"), "version": v})).collect::<Vec<_>>(),
        "preferredVersion": {"groupVersion": format!("{group}/{preferred}"), "version": preferred},
    })
}

fn groups(types: &[Arc<ResourceType>]) -> BTreeMap<String, (Vec<String>, String)> {
    let mut out: BTreeMap<String, (Vec<String>, String)> = BTreeMap::new();
    for t in types.iter().filter(|t| !t.group.is_empty()) {
        let e = out
            .entry(t.group.clone())
            .or_insert_with(|| (Vec::new(), t.version.clone()));
        if !e.0.contains(&t.version) {
            e.0.push(t.version.clone());
        }
        if t.preferred {
            e.1 = t.version.clone();
        }
    }
    out
}

/// `/apis`.
pub fn group_list(types: &[Arc<ResourceType>]) -> Value {
    let gs: Vec<Value> = groups(types)
        .iter()
        .map(|(g, (vs, p))| group_entry(g, vs, p))
        .collect();
    json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": gs})
}

/// `/apis/<group>`, or `None` when the group is not served.
pub fn group(types: &[Arc<ResourceType>], name: &str) -> Option<Value> {
    let gs = groups(types);
    let (vs, p) = gs.get(name)?;
    let mut g = group_entry(name, vs, p);
    g["kind"] = json!("APIGroup");
    g["apiVersion"] = json!("v1");
    Some(g)
}

/// `/api/v1` or `/apis/<group>/<version>`, or `None` when nothing is served there.
pub fn resource_list(types: &[Arc<ResourceType>], group: &str, version: &str) -> Option<Value> {
    let here: Vec<&Arc<ResourceType>> = types
        .iter()
        .filter(|t| t.group == group && t.version == version)
        .collect();
    if here.is_empty() {
        return None;
    }
    let mut resources = Vec::new();
    for t in here {
        let mut r = json!({
            "name": t.plural, "singularName": t.singular, "namespaced": t.namespaced, "kind": t.kind,
            "verbs": t.verbs(),
        });
        if !t.short_names.is_empty() {
            r["shortNames"] = json!(t.short_names);
        }
        if !t.categories.is_empty() {
            r["categories"] = json!(t.categories);
        }
        resources.push(r);
        if t.has_status {
            resources.push(json!({"name": format!("{}/status", t.plural), "singularName": "", "namespaced": t.namespaced,
                "kind": t.kind, "verbs": ["get", "patch", "update"]}));
        }
        if t.group.is_empty() && t.plural == "pods" {
            resources.push(json!({"name": "pods/eviction", "singularName": "", "namespaced": true, "group": "policy",
                "version": "v1", "kind": "Eviction", "verbs": ["create"]}));
        }
    }
    let gv = if group.is_empty() {
        version.to_string()
    } else {
        format!("{group}/{version}")
    };
    Some(
        json!({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": gv, "resources": resources}),
    )
}

/// The OpenAPI definition name of a kind (`dev.sluice.v1alpha1.Rollout`).
pub fn definition_name(t: &ResourceType) -> String {
    if t.group.is_empty() {
        return format!("io.k8s.api.core.{}.{}", t.version, t.kind);
    }
    let reversed: Vec<&str> = t.group.split('.').rev().collect();
    format!("{}.{}.{}", reversed.join("."), t.version, t.kind)
}

fn kind_schema(t: &ResourceType) -> Value {
    let mut s = match &t.schema {
        Some(s) => (**s).clone(),
        None => {
            json!({"type": "object", "description": format!("{} is a built-in kind served by the emulator.", t.kind),
            "x-kubernetes-preserve-unknown-fields": true})
        }
    };
    if let Some(props) = s.get_mut("properties").and_then(Value::as_object_mut) {
        props.entry("apiVersion").or_insert(json!({"type": "string",
            "description": "APIVersion defines the versioned schema of this representation of an object."}));
        props.entry("kind").or_insert(json!({"type": "string",
            "description": "Kind is a string value representing the REST resource this object represents."}));
        props.insert("metadata".into(), json!({"type": "object",
            "description": "Standard object's metadata. More info: https://git.k8s.io/community/contributors/devel/sig-architecture/api-conventions.md#metadata"}));
    }
    s["x-kubernetes-group-version-kind"] =
        json!([{"group": t.group, "version": t.version, "kind": t.kind}]);
    s
}

/// `/openapi/v3`: the index of group/version documents.
pub fn openapi_v3_index(types: &[Arc<ResourceType>], hash: u64) -> Value {
    let mut paths = serde_json::Map::new();
    for t in types {
        let p = if t.group.is_empty() {
            format!("api/{}", t.version)
        } else {
            format!("apis/{}/{}", t.group, t.version)
        };
        paths.insert(
            p.clone(),
            json!({"serverRelativeURL": format!("/openapi/v3/{p}?hash={hash:016X}")}),
        );
    }
    json!({"paths": paths})
}

/// Query parameters of write operations; kubectl looks for `fieldValidation` here to decide
/// that validation happens on the server.
fn write_params() -> Value {
    let q = |name: &str| json!({"name": name, "in": "query", "schema": {"type": "string", "uniqueItems": true}});
    json!([
        q("dryRun"),
        q("fieldManager"),
        q("fieldValidation"),
        q("force")
    ])
}

/// The collection and item paths of a resource.
fn resource_paths(t: &ResourceType) -> (String, String) {
    let base = if t.group.is_empty() {
        format!("/api/{}", t.version)
    } else {
        format!("/apis/{}/{}", t.group, t.version)
    };
    let collection = if t.namespaced {
        format!("{base}/namespaces/{{namespace}}/{}", t.plural)
    } else {
        format!("{base}/{}", t.plural)
    };
    let item = format!("{collection}/{{name}}");
    (collection, item)
}

/// `/openapi/v3/api/v1` or `/openapi/v3/apis/<g>/<v>`.
pub fn openapi_v3_doc(types: &[Arc<ResourceType>], group: &str, version: &str) -> Option<Value> {
    let here: Vec<&Arc<ResourceType>> = types
        .iter()
        .filter(|t| t.group == group && t.version == version)
        .collect();
    if here.is_empty() {
        return None;
    }
    let mut schemas = serde_json::Map::new();
    let mut paths = serde_json::Map::new();
    for t in here {
        schemas.insert(definition_name(t), kind_schema(t));
        let (collection, item) = resource_paths(t);
        let gvk = json!({"group": t.group, "version": t.version, "kind": t.kind});
        let reference = json!({"$ref": format!("#/components/schemas/{}", definition_name(t))});
        let body = json!({"content": {"application/json": {"schema": reference.clone()}}});
        let ok = json!({"200": {"description": "OK", "content": {"application/json": {"schema": reference}}}});
        let op = |action: &str, write: bool| {
            let mut o = json!({
                "operationId": format!("{action}{}", t.kind),
                "x-kubernetes-action": action,
                "x-kubernetes-group-version-kind": gvk,
                "responses": ok,
                "parameters": if write { write_params() } else { json!([]) },
            });
            if write && action != "patch" {
                o["requestBody"] = body.clone();
            }
            if action == "patch" {
                o["requestBody"] = json!({"content": {
                    "application/json-patch+json": {"schema": {"type": "object"}},
                    "application/merge-patch+json": {"schema": {"type": "object"}},
                    "application/apply-patch+yaml": {"schema": {"type": "object"}},
                }});
            }
            o
        };
        paths.insert(
            collection,
            json!({"get": op("list", false), "post": op("post", true)}),
        );
        paths.insert(item, json!({"get": op("get", false), "put": op("put", true), "patch": op("patch", true), "delete": op("delete", false)}));
    }
    Some(json!({
        "openapi": "3.0.0",
        "info": {"title": "Kubernetes", "version": "v1.32.0"},
        "paths": paths,
        "components": {"schemas": schemas},
    }))
}

/// `/openapi/v2`: every kind's schema as a definition.
pub fn openapi_v2(types: &[Arc<ResourceType>]) -> Value {
    let mut defs = serde_json::Map::new();
    for t in types {
        defs.insert(definition_name(t), kind_schema(t));
    }
    json!({"swagger": "2.0", "info": {"title": "Kubernetes", "version": "v1.32.0"}, "paths": {}, "definitions": defs})
}

/// Human age as kubectl prints it (`45s`, `3m12s`, `5h`, `2d`).
pub fn age(created: Option<&str>, now: jiff::Timestamp) -> String {
    let Some(ts) = created.and_then(|c| c.parse::<jiff::Timestamp>().ok()) else {
        return "<unknown>".into();
    };
    let secs = (now.as_second() - ts.as_second()).max(0);
    match secs {
        s if s < 120 => format!("{s}s"),
        s if s < 600 => format!("{}m{}s", s / 60, s % 60),
        s if s < 3 * 3600 => format!("{}m", s / 60),
        s if s < 48 * 3600 => format!("{}h", s / 3600),
        s => format!("{}d", s / 86400),
    }
}

/// Evaluates the simple JSONPath forms printer columns use (`.spec.a.b`, `.a[0].b`).
fn json_path<'a>(obj: &'a Value, path: &str) -> Option<&'a Value> {
    let mut cur = obj;
    for seg in path
        .trim_start_matches('.')
        .split('.')
        .filter(|s| !s.is_empty())
    {
        let (name, idx) = match seg.split_once('[') {
            Some((n, rest)) => (n, rest.trim_end_matches(']').parse::<usize>().ok()),
            None => (seg, None),
        };
        if !name.is_empty() {
            cur = cur.get(name)?;
        }
        if let Some(i) = idx {
            cur = cur.get(i)?;
        }
    }
    Some(cur)
}

fn cell(v: Option<&Value>) -> Value {
    match v {
        None | Some(Value::Null) => Value::Null,
        Some(Value::String(s)) => json!(s),
        Some(Value::Number(n)) => json!(n),
        Some(Value::Bool(b)) => json!(b),
        Some(other) => json!(other.to_string()),
    }
}

/// A `meta.k8s.io/v1` Table for `kubectl get`.
pub fn table(
    t: &ResourceType,
    objects: &[Arc<Value>],
    resource_version: Option<String>,
    now: jiff::Timestamp,
) -> Value {
    let mut columns = vec![
        json!({"name": "Name", "type": "string", "format": "name", "description": "Name must be unique within a namespace.", "priority": 0}),
    ];
    let custom: Vec<&Value> = t.printer_columns.iter().collect();
    for c in &custom {
        columns.push(json!({
            "name": c.get("name").cloned().unwrap_or(json!("")),
            "type": c.get("type").cloned().unwrap_or(json!("string")),
            "format": c.get("format").cloned().unwrap_or(json!("")),
            "description": c.get("description").cloned().unwrap_or(json!("")),
            "priority": c.get("priority").cloned().unwrap_or(json!(0)),
        }));
    }
    if custom.is_empty() {
        columns.push(json!({"name": "Age", "type": "string", "format": "", "description": "CreationTimestamp is a timestamp representing the server time when this object was created.", "priority": 0}));
    }
    let rows: Vec<Value> = objects
        .iter()
        .map(|o| {
            let mut cells = vec![cell(o.pointer("/metadata/name"))];
            for c in &custom {
                let path = c.get("jsonPath").and_then(Value::as_str).unwrap_or_default();
                let v = json_path(o, path);
                if c.get("type").and_then(Value::as_str) == Some("date") {
                    cells.push(json!(age(v.and_then(Value::as_str), now)));
                } else {
                    cells.push(cell(v));
                }
            }
            if custom.is_empty() {
                cells.push(json!(age(o.pointer("/metadata/creationTimestamp").and_then(Value::as_str), now)));
            }
            let mut meta = o.get("metadata").cloned().unwrap_or(json!({}));
            if let Some(m) = meta.as_object_mut() {
                m.remove("managedFields");
            }
            json!({"cells": cells, "object": {"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1", "metadata": meta}})
        })
        .collect();
    let mut meta = json!({});
    if let Some(rv) = resource_version {
        meta["resourceVersion"] = json!(rv);
    }
    json!({"kind": "Table", "apiVersion": "meta.k8s.io/v1", "metadata": meta, "columnDefinitions": columns, "rows": rows})
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resources::Registry;

    #[test]
    fn discovery_lists_builtins_with_subresources() {
        let types: Vec<Arc<ResourceType>> = Registry::with_builtins().all().cloned().collect();
        let core = resource_list(&types, "", "v1").unwrap();
        let names: Vec<&str> = core["resources"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["name"].as_str().unwrap())
            .collect();
        for want in [
            "pods",
            "pods/status",
            "pods/eviction",
            "namespaces",
            "configmaps",
            "events",
        ] {
            assert!(names.contains(&want), "{want} missing from {names:?}");
        }
        let apps = resource_list(&types, "apps", "v1").unwrap();
        let deploy = apps["resources"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["name"] == "deployments")
            .unwrap();
        assert_eq!(deploy["shortNames"], json!(["deploy"]));
        assert!(resource_list(&types, "nope", "v1").is_none());
        let gl = group_list(&types);
        assert!(
            gl["groups"]
                .as_array()
                .unwrap()
                .iter()
                .any(|g| g["name"] == "apiextensions.k8s.io")
        );
    }

    #[test]
    fn ages_and_paths() {
        let now: jiff::Timestamp = "2026-01-02T00:00:00Z".parse().unwrap();
        let cases = [
            ("2026-01-01T23:59:30Z", "30s"),
            ("2026-01-01T23:55:00Z", "5m0s"),
            ("2026-01-01T23:00:00Z", "60m"),
            ("2026-01-01T12:00:00Z", "12h"),
            ("2025-12-20T00:00:00Z", "13d"),
        ];
        for (created, want) in cases {
            assert_eq!(age(Some(created), now), want);
        }
        let obj = json!({"spec": {"a": [{"b": 3}]}});
        assert_eq!(json_path(&obj, ".spec.a[0].b"), Some(&json!(3)));
        assert_eq!(json_path(&obj, ".spec.x"), None);
    }

    #[test]
    fn definition_names_reverse_the_group() {
        let r = Registry::with_builtins();
        assert_eq!(
            definition_name(&r.get("apps", "v1", "deployments").unwrap()),
            "apps.v1.Deployment"
        );
        assert_eq!(
            definition_name(&r.get("", "v1", "pods").unwrap()),
            "io.k8s.api.core.v1.Pod"
        );
    }
}
