//! Comparison of desired and live objects, as Argo CD's diff normalises them.
//!
//! Owns: the "desired is contained in live" comparison (live may carry defaulted and
//! server-set fields), `status` and `metadata.managedFields` left out of the comparison,
//! `ignoreDifferences` (`jsonPointers`, simple `jqPathExpressions`, `managedFieldsManagers` read
//! from the live object's `managedFields`), and `RespectIgnoreDifferences` (the ignored fields of
//! the desired object replaced by their live values before a sync). Pure: it must never do I/O.

use serde_json::{Map, Value};

use crate::types::IgnoreDifference;

/// Whether every field of `desired` is present and equal in `live` (lists compared element by
/// element and of equal length; a `null` in desired matches an absent field).
pub fn contained_in(desired: &Value, live: &Value) -> bool {
    match (desired, live) {
        (Value::Object(d), Value::Object(l)) => d.iter().all(|(k, dv)| match l.get(k) {
            Some(lv) => contained_in(dv, lv),
            None => dv.is_null() || is_empty_container(dv),
        }),
        (Value::Array(d), Value::Array(l)) => {
            d.len() == l.len() && d.iter().zip(l).all(|(dv, lv)| contained_in(dv, lv))
        }
        (Value::Number(d), Value::Number(l)) => d.as_f64() == l.as_f64(),
        (Value::Null, _) => true,
        (d, l) => d == l,
    }
}

fn is_empty_container(v: &Value) -> bool {
    match v {
        Value::Object(m) => m.is_empty(),
        Value::Array(a) => a.is_empty(),
        _ => false,
    }
}

/// Whether an ignore rule applies to an object.
pub fn rule_applies(
    rule: &IgnoreDifference,
    group: &str,
    kind: &str,
    namespace: &str,
    name: &str,
) -> bool {
    rule.kind == kind
        && rule.group == group
        && (rule.name.is_empty() || rule.name == name)
        && (rule.namespace.is_empty() || rule.namespace == namespace)
}

/// Converts a simple jq path (`.a.b`, `.a["b.c"]`, `.a[0]`) into an RFC 6901 pointer, or `None`
/// for anything else (filters, pipes, wildcards), which the simulation does not evaluate.
pub fn jq_to_pointer(expr: &str) -> Option<String> {
    let mut rest = expr.trim();
    if !rest.starts_with('.') {
        return None;
    }
    let mut pointer = String::new();
    while !rest.is_empty() {
        if let Some(after) = rest.strip_prefix("[\"") {
            let end = after.find("\"]")?;
            pointer.push('/');
            pointer.push_str(&escape(&after[..end]));
            rest = &after[end + 2..];
        } else if let Some(after) = rest.strip_prefix('[') {
            let end = after.find(']')?;
            let index = &after[..end];
            if index.is_empty() || !index.chars().all(|c| c.is_ascii_digit()) {
                return None;
            }
            pointer.push('/');
            pointer.push_str(index);
            rest = &after[end + 1..];
        } else if let Some(after) = rest.strip_prefix('.') {
            if after.starts_with('[') {
                rest = after;
                continue;
            }
            let end = after.find(['.', '[']).unwrap_or(after.len());
            let key = &after[..end];
            if key.is_empty()
                || !key
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
            {
                return None;
            }
            pointer.push('/');
            pointer.push_str(&escape(key));
            rest = &after[end..];
        } else {
            return None;
        }
    }
    (!pointer.is_empty()).then_some(pointer)
}

fn escape(key: &str) -> String {
    key.replace('~', "~0").replace('/', "~1")
}

fn unescape(token: &str) -> String {
    token.replace("~1", "/").replace("~0", "~")
}

/// Removes the value at an RFC 6901 pointer, if present.
pub fn remove_pointer(value: &mut Value, pointer: &str) {
    let tokens: Vec<String> = pointer.split('/').skip(1).map(unescape).collect();
    let Some((last, parents)) = tokens.split_last() else {
        return;
    };
    let mut node = value;
    for token in parents {
        let next = match node {
            Value::Object(m) => m.get_mut(token),
            Value::Array(a) => token.parse::<usize>().ok().and_then(|i| a.get_mut(i)),
            _ => None,
        };
        match next {
            Some(n) => node = n,
            None => return,
        }
    }
    match node {
        Value::Object(m) => {
            m.remove(last);
        }
        Value::Array(a) => {
            if let Ok(i) = last.parse::<usize>()
                && i < a.len()
            {
                a.remove(i);
            }
        }
        _ => {}
    }
}

/// The value at an RFC 6901 pointer.
pub fn get_pointer<'a>(value: &'a Value, pointer: &str) -> Option<&'a Value> {
    let mut node = value;
    for token in pointer.split('/').skip(1).map(unescape) {
        node = match node {
            Value::Object(m) => m.get(&token)?,
            Value::Array(a) => a.get(token.parse::<usize>().ok()?)?,
            _ => return None,
        };
    }
    Some(node)
}

/// Sets the value at an RFC 6901 pointer, creating missing objects on the way.
pub fn set_pointer(value: &mut Value, pointer: &str, new: Value) {
    let tokens: Vec<String> = pointer.split('/').skip(1).map(unescape).collect();
    let Some((last, parents)) = tokens.split_last() else {
        *value = new;
        return;
    };
    let mut node = value;
    for token in parents {
        if node.is_null() {
            *node = Value::Object(Map::new());
        }
        let next = match node {
            Value::Object(m) => Some(m.entry(token.clone()).or_insert(Value::Null)),
            Value::Array(a) => token.parse::<usize>().ok().and_then(|i| a.get_mut(i)),
            _ => None,
        };
        match next {
            Some(n) => node = n,
            None => return,
        }
    }
    if node.is_null() {
        *node = Value::Object(Map::new());
    }
    match node {
        Value::Object(m) => {
            m.insert(last.clone(), new);
        }
        Value::Array(a) => {
            if let Ok(i) = last.parse::<usize>()
                && i < a.len()
            {
                a[i] = new;
            }
        }
        _ => {}
    }
}

/// The pointers of a rule: `jsonPointers` plus the simple `jqPathExpressions`.
pub fn rule_pointers(rule: &IgnoreDifference) -> Vec<String> {
    rule.json_pointers
        .iter()
        .cloned()
        .chain(
            rule.jq_path_expressions
                .iter()
                .filter_map(|e| jq_to_pointer(e)),
        )
        .collect()
}

/// The `fieldsV1` sets that the named managers own in `live`.
pub fn managed_fields_of<'a>(live: &'a Value, managers: &[String]) -> Vec<&'a Value> {
    live.pointer("/metadata/managedFields")
        .and_then(Value::as_array)
        .map(|entries| {
            entries
                .iter()
                .filter(|e| {
                    e.get("manager")
                        .and_then(Value::as_str)
                        .is_some_and(|m| managers.iter().any(|x| x == m))
                })
                .filter_map(|e| e.get("fieldsV1"))
                .collect()
        })
        .unwrap_or_default()
}

/// A `fieldsV1` node is a leaf when it owns the node and nothing below it is listed.
fn is_leaf(fields: &Value) -> bool {
    match fields.as_object() {
        None => true,
        Some(m) => m.keys().all(|k| k == "."),
    }
}

/// Finds the list element a `k:{...}` key names.
fn keyed_index(list: &[Value], key_json: &str) -> Option<usize> {
    let key: Value = serde_json::from_str(key_json).ok()?;
    let key = key.as_object()?;
    list.iter()
        .position(|item| key.iter().all(|(k, v)| item.get(k) == Some(v)))
}

/// Removes from `value` every field in the `fieldsV1` set.
pub fn remove_fields(value: &mut Value, fields: &Value) {
    let Some(fields) = fields.as_object() else {
        return;
    };
    for (key, sub) in fields {
        if let Some(name) = key.strip_prefix("f:") {
            let Some(map) = value.as_object_mut() else {
                continue;
            };
            if is_leaf(sub) {
                map.remove(name);
            } else if let Some(child) = map.get_mut(name) {
                remove_fields(child, sub);
            }
        } else if let Some(key_json) = key.strip_prefix("k:") {
            let Some(list) = value.as_array_mut() else {
                continue;
            };
            if let Some(i) = keyed_index(list, key_json) {
                if is_leaf(sub) {
                    list.remove(i);
                } else {
                    remove_fields(&mut list[i], sub);
                }
            }
        } else if let Some(item_json) = key.strip_prefix("v:") {
            let (Some(list), Ok(item)) = (
                value.as_array_mut(),
                serde_json::from_str::<Value>(item_json),
            ) else {
                continue;
            };
            list.retain(|x| *x != item);
        } else if let Some(index) = key.strip_prefix("i:") {
            let (Some(list), Ok(i)) = (value.as_array_mut(), index.parse::<usize>()) else {
                continue;
            };
            if i < list.len() {
                if is_leaf(sub) {
                    list.remove(i);
                } else {
                    remove_fields(&mut list[i], sub);
                }
            }
        }
    }
}

/// Copies into `desired` the live value of every field in the `fieldsV1` set (removing it from
/// desired where live lacks it): how `RespectIgnoreDifferences` keeps another manager's fields.
pub fn copy_fields(desired: &mut Value, live: &Value, fields: &Value) {
    let Some(fields) = fields.as_object() else {
        return;
    };
    for (key, sub) in fields {
        if let Some(name) = key.strip_prefix("f:") {
            let live_child = live.get(name);
            if desired.is_null() {
                *desired = Value::Object(Map::new());
            }
            let Some(map) = desired.as_object_mut() else {
                continue;
            };
            if is_leaf(sub) {
                match live_child {
                    Some(v) => {
                        map.insert(name.to_string(), v.clone());
                    }
                    None => {
                        map.remove(name);
                    }
                }
            } else if let Some(lc) = live_child {
                let child = map.entry(name.to_string()).or_insert(Value::Null);
                copy_fields(child, lc, sub);
            }
        } else if let Some(key_json) = key.strip_prefix("k:") {
            let Some(live_list) = live.as_array() else {
                continue;
            };
            let Some(li) = keyed_index(live_list, key_json) else {
                continue;
            };
            if desired.is_null() {
                *desired = Value::Array(Vec::new());
            }
            let Some(list) = desired.as_array_mut() else {
                continue;
            };
            match keyed_index(list, key_json) {
                Some(di) if is_leaf(sub) => list[di] = live_list[li].clone(),
                Some(di) => copy_fields(&mut list[di], &live_list[li], sub),
                None => list.push(live_list[li].clone()),
            }
        }
    }
}

/// Desired and live, normalised for comparison: `status`, `managedFields` and the system
/// metadata left out, and every applicable ignore rule applied to both.
pub fn normalize(desired: &Value, live: &Value, rules: &[&IgnoreDifference]) -> (Value, Value) {
    let mut d = desired.clone();
    let mut l = live.clone();
    for v in [&mut d, &mut l] {
        if let Some(m) = v.as_object_mut() {
            m.remove("status");
        }
        for p in [
            "/metadata/managedFields",
            "/metadata/resourceVersion",
            "/metadata/uid",
            "/metadata/generation",
            "/metadata/creationTimestamp",
        ] {
            remove_pointer(v, p);
        }
    }
    for rule in rules {
        for pointer in rule_pointers(rule) {
            remove_pointer(&mut d, &pointer);
            remove_pointer(&mut l, &pointer);
        }
        for fields in managed_fields_of(live, &rule.managed_fields_managers) {
            remove_fields(&mut d, fields);
            remove_fields(&mut l, fields);
        }
    }
    (d, l)
}

/// Whether the live object matches the desired one after normalisation.
pub fn in_sync(desired: &Value, live: &Value, rules: &[&IgnoreDifference]) -> bool {
    let (d, l) = normalize(desired, live, rules);
    contained_in(&d, &l)
}

/// The desired object with every ignored field taken from live (RespectIgnoreDifferences).
pub fn respect_ignored(desired: &Value, live: &Value, rules: &[&IgnoreDifference]) -> Value {
    let mut d = desired.clone();
    for rule in rules {
        for pointer in rule_pointers(rule) {
            match get_pointer(live, &pointer) {
                Some(v) => set_pointer(&mut d, &pointer, v.clone()),
                None => remove_pointer(&mut d, &pointer),
            }
        }
        for fields in managed_fields_of(live, &rule.managed_fields_managers) {
            copy_fields(&mut d, live, fields);
        }
    }
    d
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn containment_table() {
        let cases = [
            (json!({"a": 1}), json!({"a": 1, "b": 2}), true),
            (json!({"a": 1}), json!({"a": 2}), false),
            (
                json!({"a": {"b": [1, 2]}}),
                json!({"a": {"b": [1, 2], "c": 1}}),
                true,
            ),
            (json!({"a": {"b": [1, 2]}}), json!({"a": {"b": [1]}}), false),
            (
                json!({"a": [{"x": 1}]}),
                json!({"a": [{"x": 1, "y": 2}]}),
                true,
            ),
            (json!({"a": null}), json!({}), true),
            (json!({"a": {}}), json!({}), true),
            (json!({"a": 1}), json!({}), false),
            (json!({"a": 1}), json!({"a": 1.0}), true),
        ];
        for (d, l, want) in cases {
            assert_eq!(contained_in(&d, &l), want, "{d} in {l}");
        }
    }

    #[test]
    fn jq_paths_table() {
        let cases = [
            (".spec.replicas", Some("/spec/replicas")),
            (
                ".metadata.annotations[\"a/b\"]",
                Some("/metadata/annotations/a~1b"),
            ),
            (
                ".spec.rules[0].backendRefs",
                Some("/spec/rules/0/backendRefs"),
            ),
            (".spec.rules[] | select(.name)", None),
            ("spec", None),
            (".a[*]", None),
        ];
        for (expr, want) in cases {
            assert_eq!(jq_to_pointer(expr).as_deref(), want, "{expr}");
        }
    }

    fn rule(json: Value) -> IgnoreDifference {
        serde_json::from_value(json).unwrap()
    }

    #[test]
    fn json_pointer_rules_hide_differences() {
        let r = rule(json!({"kind": "ConfigMap", "jsonPointers": ["/data/b"]}));
        let desired = json!({"data": {"a": "1", "b": "1"}});
        let live = json!({"data": {"a": "1", "b": "2"}});
        assert!(!in_sync(&desired, &live, &[]));
        assert!(in_sync(&desired, &live, &[&r]));
        let live2 = json!({"data": {"a": "2", "b": "2"}});
        assert!(!in_sync(&desired, &live2, &[&r]));
    }

    fn live_with_manager() -> Value {
        json!({
            "metadata": {"name": "r", "managedFields": [
                {"manager": "argocd-controller", "operation": "Apply", "fieldsV1": {"f:spec": {"f:hostnames": {}}}},
                {"manager": "rollout-weights", "operation": "Update", "fieldsV1": {"f:spec": {"f:rules": {}}, "f:metadata": {"f:annotations": {".": {}, "f:owner": {}}}}}
            ], "annotations": {"owner": "rw"}},
            "spec": {"hostnames": ["a"], "rules": [{"w": 50}]}
        })
    }

    #[test]
    fn managed_fields_managers_hide_and_respect() {
        let live = live_with_manager();
        let desired =
            json!({"metadata": {"name": "r"}, "spec": {"hostnames": ["a"], "rules": [{"w": 0}]}});
        let r = rule(
            json!({"group": "gateway.networking.k8s.io", "kind": "HTTPRoute", "managedFieldsManagers": ["rollout-weights"]}),
        );
        assert!(!in_sync(&desired, &live, &[]));
        assert!(in_sync(&desired, &live, &[&r]));
        // A difference in a field the other manager does not own still shows.
        let desired2 =
            json!({"metadata": {"name": "r"}, "spec": {"hostnames": ["b"], "rules": [{"w": 0}]}});
        assert!(!in_sync(&desired2, &live, &[&r]));
        // RespectIgnoreDifferences: the other manager's fields come from live.
        let respected = respect_ignored(&desired2, &live, &[&r]);
        assert_eq!(respected["spec"]["rules"], json!([{"w": 50}]));
        assert_eq!(respected["spec"]["hostnames"], json!(["b"]));
        assert_eq!(respected["metadata"]["annotations"]["owner"], json!("rw"));
        // A manager not listed changes nothing.
        let other = rule(json!({"kind": "HTTPRoute", "managedFieldsManagers": ["someone-else"]}));
        assert_eq!(respect_ignored(&desired2, &live, &[&other]), desired2);
    }

    #[test]
    fn keyed_and_set_items_are_removed() {
        let mut v = json!({"spec": {"containers": [{"name": "a", "image": "x"}, {"name": "b", "image": "y"}], "finalizers": ["f1", "f2"]}});
        let fields = json!({"f:spec": {"f:containers": {"k:{\"name\":\"a\"}": {"f:image": {}}}, "f:finalizers": {"v:\"f1\"": {}}}});
        remove_fields(&mut v, &fields);
        assert_eq!(
            v,
            json!({"spec": {"containers": [{"name": "a"}, {"name": "b", "image": "y"}], "finalizers": ["f2"]}})
        );
    }

    #[test]
    fn status_and_system_metadata_never_differ() {
        let desired = json!({"metadata": {"name": "a"}, "status": {"x": 1}});
        let live = json!({"metadata": {"name": "a", "uid": "u", "resourceVersion": "3"}, "status": {"x": 2}});
        assert!(in_sync(&desired, &live, &[]));
    }

    #[test]
    fn pointers_set_get_remove() {
        let mut v = json!({});
        set_pointer(&mut v, "/spec/syncPolicy/automated", json!({"prune": true}));
        assert_eq!(
            get_pointer(&v, "/spec/syncPolicy/automated/prune"),
            Some(&json!(true))
        );
        remove_pointer(&mut v, "/spec/syncPolicy/automated");
        assert_eq!(v, json!({"spec": {"syncPolicy": {}}}));
    }
}
