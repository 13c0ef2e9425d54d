//! The checked-in CRDs equal what the types generate, and every CRD is complete and installable:
//! documented fields, status subresource, printer columns, short names, the `sluice` category,
//! a structural schema, and CEL rules whose inputs are bounded.

use std::path::{Path, PathBuf};

use serde_json::Value;
use sluice_api::crds;

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

#[test]
fn checked_in_crds_equal_generated_output() {
    let files = crds::files().expect("every CRD renders as YAML");
    assert_eq!(files.len(), 5, "one file per kind");
    for dir in ["crds", "charts/sluice/crds"] {
        for (name, want) in &files {
            let path = repo_root().join(dir).join(name);
            let got = std::fs::read_to_string(&path).unwrap_or_default();
            assert!(
                got == *want,
                "{} differs from the generated CRD: run `cargo run -p sluice-api --bin crdgen` and commit {dir}/",
                path.display()
            );
        }
        let mut on_disk: Vec<String> = std::fs::read_dir(repo_root().join(dir))
            .map(|rd| {
                rd.filter_map(|e| e.ok())
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .filter(|n| n.ends_with(".sluice.dev.yaml"))
                    .collect()
            })
            .unwrap_or_default();
        on_disk.sort();
        let mut want: Vec<String> = files.iter().map(|(n, _)| n.clone()).collect();
        want.sort();
        assert_eq!(
            on_disk, want,
            "{dir}/ holds a stale or missing CRD file: run crdgen"
        );
    }
}

fn crd_values() -> Vec<(String, Value)> {
    crds::all()
        .into_iter()
        .map(|c| {
            (
                c.spec.names.kind.clone(),
                serde_json::to_value(&c).expect("CRD serialises"),
            )
        })
        .collect()
}

fn schema_of(crd: &Value) -> &Value {
    &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
}

/// Walks every sub-schema (properties, items, additionalProperties) with its path.
fn walk<'a>(path: &str, s: &'a Value, f: &mut dyn FnMut(&str, &'a Value)) {
    f(path, s);
    if let Some(props) = s.get("properties").and_then(Value::as_object) {
        for (k, v) in props {
            walk(&format!("{path}.{k}"), v, f);
        }
    }
    if let Some(items) = s.get("items") {
        walk(&format!("{path}[]"), items, f);
    }
    if let Some(ap) = s.get("additionalProperties").filter(|v| v.is_object()) {
        walk(&format!("{path}{{}}"), ap, f);
    }
}

#[test]
fn every_kind_has_names_columns_category_and_status() {
    for (kind, crd) in crd_values() {
        let names = &crd["spec"]["names"];
        let cats: Vec<&str> = names["categories"]
            .as_array()
            .map(|a| a.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default();
        assert!(cats.contains(&"sluice"), "{kind}: category sluice missing");
        let shorts: Vec<&str> = names["shortNames"]
            .as_array()
            .map(|a| a.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default();
        assert!(!shorts.is_empty(), "{kind}: no short names");
        for s in &shorts {
            // Argo Rollouts owns `ro` and `rollout(s)`; sluice's must not be confusable.
            assert!(
                s.starts_with('s'),
                "{kind}: short name {s} lacks the s prefix"
            );
            assert!(
                !["ro", "rollout", "rollouts"].contains(s),
                "{kind}: {s} belongs to Argo Rollouts"
            );
        }
        let version = &crd["spec"]["versions"][0];
        let cols = version["additionalPrinterColumns"]
            .as_array()
            .map(Vec::len)
            .unwrap_or(0);
        assert!(cols >= 2, "{kind}: printer columns missing");
        // Every kind has observed state (a GateTemplate's is its Ready condition).
        assert!(
            version["subresources"]["status"].is_object(),
            "{kind}: status subresource missing"
        );
        assert!(
            schema_of(&crd)["properties"]["status"].is_object(),
            "{kind}: status schema missing"
        );
    }
}

#[test]
fn printer_columns_name_fields_that_exist() {
    for (kind, crd) in crd_values() {
        let schema = schema_of(&crd);
        for col in crd["spec"]["versions"][0]["additionalPrinterColumns"]
            .as_array()
            .unwrap()
        {
            let path = col["jsonPath"].as_str().unwrap();
            if path.starts_with(".metadata.") {
                continue;
            }
            let mut node = schema;
            for seg in path.trim_start_matches('.').split('.') {
                node = &node["properties"][seg];
                assert!(
                    node.is_object(),
                    "{kind}: printer column {path} names no field"
                );
            }
        }
    }
}

#[test]
fn every_spec_and_status_field_is_documented() {
    for (kind, crd) in crd_values() {
        let schema = schema_of(&crd);
        for root in ["spec", "status"] {
            let Some(node) = schema["properties"].get(root) else {
                continue;
            };
            let mut missing = Vec::new();
            walk(root, node, &mut |path, s| {
                // Array items and map values are documented by their field.
                if path.ends_with("[]") || path.ends_with('}') {
                    return;
                }
                let ok = s
                    .get("description")
                    .and_then(Value::as_str)
                    .is_some_and(|d| !d.trim().is_empty());
                if !ok {
                    missing.push(path.to_owned());
                }
            });
            assert!(
                missing.is_empty(),
                "{kind}: fields without description: {missing:?}"
            );
        }
    }
}

#[test]
fn schemas_are_structural() {
    for (kind, crd) in crd_values() {
        let mut problems = Vec::new();
        walk("", schema_of(&crd), &mut |path, s| {
            for bad in [
                "$ref",
                "anyOf",
                "oneOf",
                "allOf",
                "not",
                "definitions",
                "$defs",
            ] {
                if s.get(bad).is_some() {
                    problems.push(format!("{path}: {bad}"));
                }
            }
            let typed = s.get("type").is_some()
                || s.get("x-kubernetes-preserve-unknown-fields") == Some(&Value::Bool(true))
                || s.get("x-kubernetes-int-or-string") == Some(&Value::Bool(true));
            if !typed {
                problems.push(format!("{path}: no type"));
            }
            if s.get("x-kubernetes-list-type").and_then(Value::as_str) == Some("map") {
                let keys = s["x-kubernetes-list-map-keys"]
                    .as_array()
                    .cloned()
                    .unwrap_or_default();
                let required = s["items"]["required"]
                    .as_array()
                    .cloned()
                    .unwrap_or_default();
                for k in keys {
                    if !required.contains(&k) {
                        problems.push(format!("{path}: list-map key {k} is not required"));
                    }
                }
            }
        });
        assert!(problems.is_empty(), "{kind}: not structural: {problems:?}");
    }
}

/// Field names a CEL rule reads (`self.a.b`, `x.c`): every identifier after a dot.
fn fields_read(rule: &str) -> Vec<String> {
    let mut out = Vec::new();
    let b = rule.as_bytes();
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'.' {
            let start = i + 1;
            let mut j = start;
            while j < b.len() && (b[j].is_ascii_alphanumeric() || b[j] == b'_') {
                j += 1;
            }
            if j > start && !b[start].is_ascii_digit() {
                // CEL escapes reserved words: `__namespace__` reads the property `namespace`.
                let name = &rule[start..j];
                let name = name
                    .strip_prefix("__")
                    .and_then(|n| n.strip_suffix("__"))
                    .unwrap_or(name);
                out.push(name.to_owned());
            }
            i = j;
        } else {
            i += 1;
        }
    }
    out
}

fn bounded(s: &Value) -> Result<(), String> {
    match s.get("type").and_then(Value::as_str) {
        Some("string") if s.get("maxLength").is_none() && s.get("enum").is_none() => {
            Err("string without maxLength".into())
        }
        Some("array") if s.get("maxItems").is_none() => Err("array without maxItems".into()),
        Some("array") => match s["items"].get("type").and_then(Value::as_str) {
            Some("string") => bounded(&s["items"]),
            _ => Ok(()),
        },
        Some("object")
            if s.get("additionalProperties").is_some() && s.get("maxProperties").is_none() =>
        {
            Err("map without maxProperties".into())
        }
        _ => Ok(()),
    }
}

#[test]
fn cel_rules_touch_only_bounded_values() {
    let mut rules_seen = 0;
    for (kind, crd) in crd_values() {
        let mut problems = Vec::new();
        walk("", schema_of(&crd), &mut |path, node| {
            let Some(rules) = node
                .get("x-kubernetes-validations")
                .and_then(Value::as_array)
            else {
                return;
            };
            let mut read: Vec<String> = Vec::new();
            for r in rules {
                rules_seen += 1;
                let rule = r["rule"].as_str().unwrap_or_default();
                assert!(
                    r["message"].as_str().is_some_and(|m| !m.is_empty()),
                    "{kind}{path}: rule {rule:?} has no message"
                );
                read.extend(fields_read(rule));
            }
            // The node itself (`self`) when it is a list or string.
            if let Err(e) = bounded(node) {
                problems.push(format!("{path}: {e}"));
            }
            // Every field of the subtree the rules name.
            walk(path, node, &mut |p, s| {
                let name = p
                    .rsplit('.')
                    .next()
                    .unwrap_or_default()
                    .trim_end_matches("[]");
                if read.iter().any(|r| r == name)
                    && let Err(e) = bounded(s)
                {
                    problems.push(format!("{p}: {e}"));
                }
            });
        });
        assert!(
            problems.is_empty(),
            "{kind}: CEL rules read unbounded values: {problems:?}"
        );
    }
    assert!(
        rules_seen >= 20,
        "expected the cross-field rules, saw {rules_seen}"
    );
}

#[test]
fn required_cross_field_rules_are_present() {
    let all: String = crd_values()
        .iter()
        .map(|(_, c)| serde_json::to_string(c).unwrap())
        .collect();
    for needle in [
        "setWeight steps must be strictly increasing",
        "mirroring is only allowed for idempotent methods",
        "at least one wave is required",
        "a cluster may appear in at most one wave",
        "rate must be greater than 0",
        "depth must be greater than 0",
        "fromTag and toTag must differ",
        "set exactly one of templateRef, promql or builtin",
        "^sha256:[a-f0-9]{64}$",
    ] {
        assert!(all.contains(needle), "missing rule or pattern: {needle}");
    }
}

/// kube-apiserver warns about any `format` it does not know on every write of a CRD
/// (`cel_real_api_server` checks the real server sends no warning); integer fields carry only
/// `int32` or `int64`, and an unsigned field keeps its range as `minimum`/`maximum`.
#[test]
fn integer_formats_are_ones_kube_apiserver_knows() {
    let mut found = Vec::new();
    for (kind, crd) in crd_values() {
        walk(&kind, schema_of(&crd), &mut |path, s| {
            if s["type"] != "integer" {
                return;
            }
            match s["format"].as_str() {
                None | Some("int32") | Some("int64") => {}
                Some(other) => found.push(format!("{path}: format {other}")),
            }
            if s["format"] == "int32" {
                let max = s["maximum"].as_f64().unwrap_or(f64::INFINITY);
                if max > f64::from(i32::MAX) {
                    found.push(format!("{path}: int32 without a maximum that fits"));
                }
            }
        });
    }
    assert!(found.is_empty(), "{}", found.join("\n"));
}

#[test]
fn unsigned_fields_keep_their_range() {
    let mut schema: k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::JSONSchemaProps =
        serde_json::from_value(serde_json::json!({
            "type": "object",
            "properties": {
                "port": {"type": "integer", "format": "uint16", "minimum": 1.0},
                "count": {"type": "integer", "format": "uint32", "minimum": 0.0, "maximum": 100.0},
                "samples": {"type": "array", "items": {"type": "integer", "format": "uint64"}},
                "byName": {"type": "object", "additionalProperties": {"type": "integer", "format": "uint32"}},
                "ratio": {"type": "number", "format": "double"}
            }
        }))
        .unwrap();
    crds::kubernetes_integer_formats(&mut schema);
    assert_eq!(
        serde_json::to_value(&schema).unwrap()["properties"],
        serde_json::json!({
            "port": {"type": "integer", "format": "int32", "minimum": 1.0, "maximum": 65535.0},
            "count": {"type": "integer", "format": "int64", "minimum": 0.0, "maximum": 100.0},
            "samples": {"type": "array", "items": {"type": "integer", "format": "int64", "minimum": 0.0}},
            "byName": {"type": "object", "additionalProperties":
                {"type": "integer", "format": "int64", "minimum": 0.0, "maximum": 4294967295.0}},
            "ratio": {"type": "number", "format": "double"}
        })
    );
}
