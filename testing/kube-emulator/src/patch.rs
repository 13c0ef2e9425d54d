//! Patch application: JSON merge patch (RFC 7386), JSON patch (RFC 6902) and strategic merge
//! patch for the built-in list fields operators touch (containers, volumes, env, ports, ...).
//!
//! Pure functions over JSON values. Never decides field ownership (that is `managed`).

use serde_json::{Map, Value};

use crate::error::ApiError;

/// Applies an RFC 7386 merge patch.
pub fn merge_patch(target: &mut Value, patch: &Value) {
    match patch {
        Value::Object(p) => {
            if !target.is_object() {
                *target = Value::Object(Map::new());
            }
            let t = target.as_object_mut().expect("object");
            for (k, v) in p {
                if v.is_null() {
                    t.remove(k);
                } else {
                    merge_patch(t.entry(k.clone()).or_insert(Value::Null), v);
                }
            }
        }
        other => *target = other.clone(),
    }
}

/// Applies an RFC 6902 JSON patch.
pub fn json_patch(target: &mut Value, patch: &Value) -> Result<(), ApiError> {
    let p: json_patch::Patch = serde_json::from_value(patch.clone()).map_err(|e| {
        ApiError::BadRequest(format!("the JSON patch is not a list of operations: {e}"))
    })?;
    json_patch::patch(target, &p).map_err(|e| ApiError::Invalid {
        message: format!("the server rejected our request due to an error in our request: {e}"),
        details: Value::Null,
    })
}

/// The merge key of a built-in list field, by field name and element shape, as the
/// `patchMergeKey` tags of the core types declare them. `None` means the list is replaced.
pub fn builtin_merge_key(field: &str, sample: Option<&Value>) -> Option<&'static str> {
    match field {
        "containers"
        | "initContainers"
        | "ephemeralContainers"
        | "volumes"
        | "env"
        | "imagePullSecrets"
        | "resourceClaims"
        | "secrets" => Some("name"),
        "volumeMounts" => Some("mountPath"),
        "volumeDevices" => Some("devicePath"),
        "conditions" => Some("type"),
        "ownerReferences" => Some("uid"),
        "hostAliases" => Some("ip"),
        "topologySpreadConstraints" => Some("topologyKey"),
        "ports" => {
            if sample.is_some_and(|s| s.get("containerPort").is_some()) {
                Some("containerPort")
            } else {
                Some("port")
            }
        }
        _ => None,
    }
}

/// Lists of scalars merged as sets by strategic merge patch.
fn is_primitive_merge_list(field: &str) -> bool {
    field == "finalizers"
}

/// Applies a strategic merge patch using the built-in merge keys.
pub fn strategic_merge(target: &mut Value, patch: &Value) {
    let Value::Object(p) = patch else {
        *target = patch.clone();
        return;
    };
    if p.get("$patch").and_then(Value::as_str) == Some("replace") {
        let mut p = p.clone();
        p.remove("$patch");
        *target = Value::Object(p);
        return;
    }
    if !target.is_object() {
        *target = Value::Object(Map::new());
    }
    let t = target.as_object_mut().expect("object");
    if let Some(Value::Array(keep)) = p.get("$retainKeys") {
        let keep: Vec<&str> = keep.iter().filter_map(Value::as_str).collect();
        t.retain(|k, _| keep.contains(&k.as_str()));
    }
    for (k, v) in p {
        if k.starts_with("$setElementOrder/") || k == "$retainKeys" || k == "$patch" {
            continue;
        }
        if let Some(field) = k.strip_prefix("$deleteFromPrimitiveList/") {
            if let (Some(Value::Array(cur)), Value::Array(del)) = (t.get_mut(field), v) {
                cur.retain(|x| !del.contains(x));
            }
            continue;
        }
        if v.is_null() {
            t.remove(k);
            continue;
        }
        match v {
            Value::Array(items) => {
                let cur = t.entry(k.clone()).or_insert(Value::Array(Vec::new()));
                merge_list(k, cur, items);
            }
            Value::Object(o) if o.get("$patch").and_then(Value::as_str) == Some("delete") => {
                t.remove(k);
            }
            _ => strategic_merge(t.entry(k.clone()).or_insert(Value::Null), v),
        }
    }
}

fn merge_list(field: &str, cur: &mut Value, items: &[Value]) {
    if is_primitive_merge_list(field) {
        let arr = cur.as_array_mut().map(std::mem::take).unwrap_or_default();
        let mut out = arr;
        for i in items {
            if !out.contains(i) {
                out.push(i.clone());
            }
        }
        *cur = Value::Array(out);
        return;
    }
    let sample = items.iter().find(|i| i.is_object());
    let Some(key) = builtin_merge_key(field, sample) else {
        *cur = Value::Array(
            items
                .iter()
                .filter(|i| i.get("$patch").is_none())
                .cloned()
                .collect(),
        );
        return;
    };
    if items
        .iter()
        .any(|i| i.get("$patch").and_then(Value::as_str) == Some("replace"))
    {
        *cur = Value::Array(
            items
                .iter()
                .filter(|i| i.get("$patch").is_none())
                .cloned()
                .collect(),
        );
        return;
    }
    let mut out: Vec<Value> = cur.as_array().cloned().unwrap_or_default();
    for item in items {
        let id = item.get(key).cloned();
        let pos = id
            .as_ref()
            .and_then(|id| out.iter().position(|o| o.get(key) == Some(id)));
        let delete = item.get("$patch").and_then(Value::as_str) == Some("delete");
        match (pos, delete) {
            (Some(i), true) => {
                out.remove(i);
            }
            (None, true) => {}
            (Some(i), false) => strategic_merge(&mut out[i], item),
            (None, false) => {
                let mut fresh = Value::Object(Map::new());
                strategic_merge(&mut fresh, item);
                out.push(fresh);
            }
        }
    }
    *cur = Value::Array(out);
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn merge_patch_table() {
        let cases = [
            (
                json!({"a": 1, "b": {"c": 2}}),
                json!({"b": {"c": null, "d": 3}}),
                json!({"a": 1, "b": {"d": 3}}),
            ),
            (json!({"l": [1, 2]}), json!({"l": [3]}), json!({"l": [3]})),
            (json!({"a": 1}), json!({"a": null}), json!({})),
        ];
        for (mut t, p, want) in cases {
            merge_patch(&mut t, &p);
            assert_eq!(t, want);
        }
    }

    #[test]
    fn strategic_merge_table() {
        let base = json!({"spec": {"containers": [
            {"name": "app", "image": "a:1", "env": [{"name": "X", "value": "1"}]},
            {"name": "side", "image": "s:1"}
        ], "tolerations": [{"key": "k"}]}, "metadata": {"finalizers": ["a"]}});
        let cases = [
            (
                json!({"spec": {"containers": [{"name": "app", "image": "a:2"}]}}),
                json!({"spec": {"containers": [
                    {"name": "app", "image": "a:2", "env": [{"name": "X", "value": "1"}]},
                    {"name": "side", "image": "s:1"}], "tolerations": [{"key": "k"}]}, "metadata": {"finalizers": ["a"]}}),
            ),
            (
                json!({"spec": {"containers": [{"name": "side", "$patch": "delete"}, {"name": "new", "image": "n"}]}}),
                json!({"spec": {"containers": [
                    {"name": "app", "image": "a:1", "env": [{"name": "X", "value": "1"}]},
                    {"name": "new", "image": "n"}], "tolerations": [{"key": "k"}]}, "metadata": {"finalizers": ["a"]}}),
            ),
            (
                json!({"spec": {"containers": [{"name": "app", "env": [{"name": "Y", "value": "2"}]}], "tolerations": []}}),
                json!({"spec": {"containers": [
                    {"name": "app", "image": "a:1", "env": [{"name": "X", "value": "1"}, {"name": "Y", "value": "2"}]},
                    {"name": "side", "image": "s:1"}], "tolerations": []}, "metadata": {"finalizers": ["a"]}}),
            ),
            (
                json!({"metadata": {"finalizers": ["b"], "$deleteFromPrimitiveList/finalizers": ["a"]}}),
                json!({"spec": {"containers": [
                    {"name": "app", "image": "a:1", "env": [{"name": "X", "value": "1"}]},
                    {"name": "side", "image": "s:1"}], "tolerations": [{"key": "k"}]}, "metadata": {"finalizers": ["b"]}}),
            ),
        ];
        for (p, want) in cases {
            let mut t = base.clone();
            strategic_merge(&mut t, &p);
            assert_eq!(t, want, "patch {p}");
        }
    }

    #[test]
    fn json_patch_applies_and_reports_failures() {
        let mut t = json!({"a": [1]});
        json_patch(&mut t, &json!([{"op": "add", "path": "/a/-", "value": 2}])).unwrap();
        assert_eq!(t, json!({"a": [1, 2]}));
        let err =
            json_patch(&mut t, &json!([{"op": "test", "path": "/a/0", "value": 9}])).unwrap_err();
        assert_eq!(err.code(), 422);
        assert_eq!(
            json_patch(&mut t, &json!({"op": "x"})).unwrap_err().code(),
            400
        );
    }
}
