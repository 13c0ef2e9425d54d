//! Defaulting and pruning of custom resources, in the apiserver's order: nulls that the schema
//! does not allow are dropped, unknown fields are pruned, then `default`s are applied.
//!
//! Owns: mutating a decoded object to the schema's shape. Must never: drop `apiVersion`, `kind` or
//! `metadata` of the object or of an embedded resource, or prune under
//! `x-kubernetes-preserve-unknown-fields`.

use serde_json::Value;

use super::schema::{Additional, Node};

/// Prunes and defaults `v` in place. `keep_meta` keeps `apiVersion`/`kind`/`metadata` (at the root
/// and in embedded resources).
pub(crate) fn default_and_prune(node: &Node, v: &mut Value, keep_meta: bool) {
    match v {
        Value::Object(map) => {
            let keep_meta = keep_meta || node.embedded_resource;
            let preserve = node.preserve_unknown;
            let has_props = !node.properties.is_empty();
            if !preserve {
                match &node.additional {
                    Additional::Schema(_) | Additional::Bool(true) => {}
                    _ => map.retain(|k, _| {
                        node.properties.contains_key(k)
                            || (keep_meta
                                && matches!(k.as_str(), "apiVersion" | "kind" | "metadata"))
                    }),
                }
            }
            if has_props {
                // Nulls where the schema does not allow them are removed before defaulting.
                map.retain(|k, val| {
                    !(val.is_null() && node.properties.get(k).is_some_and(|p| !p.nullable))
                });
                for (name, sub) in &node.properties {
                    if !map.contains_key(name)
                        && let Some(d) = &sub.default
                    {
                        map.insert(name.clone(), d.clone());
                    }
                    if let Some(child) = map.get_mut(name) {
                        default_and_prune(sub, child, false);
                    }
                }
            } else if let Additional::Schema(sub) = &node.additional {
                if !sub.nullable {
                    map.retain(|_, val| !val.is_null());
                }
                for child in map.values_mut() {
                    default_and_prune(sub, child, false);
                }
            }
            if keep_meta && node.embedded_resource {
                // An embedded resource's metadata is kept as written, apart from nulls.
                if let Some(Value::Object(meta)) = map.get_mut("metadata") {
                    meta.retain(|_, v| !v.is_null());
                }
            }
        }
        Value::Array(items) => {
            if let Some(sub) = &node.items {
                for item in items.iter_mut() {
                    default_and_prune(sub, item, false);
                }
            }
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::super::schema::compile;
    use super::*;
    use serde_json::json;

    #[test]
    fn prunes_defaults_and_keeps_what_it_must() {
        let schema = json!({
            "type": "object",
            "properties": {
                "spec": {
                    "type": "object",
                    "properties": {
                        "replicas": {"type": "integer", "default": 1},
                        "mode": {"type": "string", "default": "Auto"},
                        "free": {"type": "object", "x-kubernetes-preserve-unknown-fields": true},
                        "labels": {"type": "object", "additionalProperties": {"type": "string"}},
                        "items": {"type": "array", "items": {
                            "type": "object",
                            "properties": {"name": {"type": "string"}, "weight": {"type": "integer", "default": 1}}
                        }},
                        "template": {"type": "object", "x-kubernetes-embedded-resource": true,
                            "properties": {"spec": {"type": "object", "properties": {"a": {"type": "string"}}}}},
                        "withDefaultObject": {"type": "object", "default": {}, "properties": {
                            "inner": {"type": "string", "default": "x"}
                        }}
                    }
                }
            }
        });
        let node = compile(&schema, "").unwrap();
        let mut obj = json!({
            "apiVersion": "v1", "kind": "K", "metadata": {"name": "n"},
            "unknownTop": 1,
            "spec": {
                "mode": null,
                "unknown": true,
                "free": {"anything": {"goes": 1}},
                "labels": {"a": "b"},
                "items": [{"name": "x", "extra": 1}],
                "template": {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}, "spec": {"a": "b", "c": 1}, "junk": 2}
            }
        });
        default_and_prune(&node, &mut obj, true);
        assert_eq!(
            obj,
            json!({
                "apiVersion": "v1", "kind": "K", "metadata": {"name": "n"},
                "spec": {
                    "replicas": 1,
                    "mode": "Auto",
                    "free": {"anything": {"goes": 1}},
                    "labels": {"a": "b"},
                    "items": [{"name": "x", "weight": 1}],
                    "template": {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}, "spec": {"a": "b"}},
                    "withDefaultObject": {"inner": "x"}
                }
            })
        );
    }
}
