//! Structural schema validation, defaulting, pruning and CEL rules for custom resources.
//!
//! Owns: turning a CRD version's `openAPIV3Schema` into a [`CrdSchema`] (compiled once, every CEL
//! rule and pattern included), shaping objects to it ([`CrdSchema::default_and_prune`]), judging
//! them ([`CrdSchema::validate`]) and wording the 422 the apiserver would send
//! ([`invalid_status`]). Must never: do I/O, or let a rule it cannot evaluate pass — such a rule
//! fails CRD load with a [`SchemaError`].

pub(crate) mod cel_library;
mod defaults;
mod field_check;
mod formats;
mod quantity;
mod schema;
mod walk;

use serde_json::{Value, json};

pub use quantity::{Quantity, QuantityError};

/// Why a CRD schema cannot be served.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error, strum::IntoStaticStr)]
pub enum SchemaError {
    /// The schema JSON is not a structural schema the emulator understands.
    #[error("invalid schema at {path}: {detail}")]
    InvalidSchema {
        /// Where in the schema (dotted property path).
        path: String,
        /// What is wrong and what to do.
        detail: String,
    },
    /// A `pattern` is not a regular expression the emulator can compile.
    #[error("invalid pattern {pattern:?} at {path}: {detail}; use RE2 syntax")]
    InvalidPattern {
        /// Where in the schema.
        path: String,
        /// The pattern as written.
        pattern: String,
        /// The regex compiler's complaint.
        detail: String,
    },
    /// A CEL rule or message expression does not compile, or calls a function the emulator does
    /// not provide.
    #[error("CEL rule {rule:?} at {path} cannot be evaluated: {detail}")]
    CelCompile {
        /// Where in the schema.
        path: String,
        /// The rule source.
        rule: String,
        /// The compiler's complaint.
        detail: String,
    },
    /// The CRD has no schema for the requested version.
    #[error(
        "CRD {crd} has no openAPIV3Schema for version {version:?}; add spec.versions[].schema.openAPIV3Schema"
    )]
    MissingSchema {
        /// The CRD's name.
        crd: String,
        /// The version asked for.
        version: String,
    },
}

impl SchemaError {
    /// A bounded label for metrics and logs.
    pub fn category(&self) -> &'static str {
        self.into()
    }
}

/// The kind of a field error, as `k8s.io/apimachinery/pkg/util/validation/field` names them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FieldErrorKind {
    /// `Required value`.
    Required,
    /// `Invalid value`.
    Invalid,
    /// `Invalid value` for a wrong type.
    TypeInvalid,
    /// `Unsupported value` (enum).
    NotSupported,
    /// `Too long`.
    TooLong,
    /// `Too many`.
    TooMany,
    /// `Duplicate value`.
    Duplicate,
    /// `Forbidden`.
    Forbidden,
    /// `Internal error`.
    Internal,
}

impl FieldErrorKind {
    /// The `details.causes[].reason` of this kind (`FieldValueInvalid`, ...).
    pub fn reason(self) -> &'static str {
        match self {
            FieldErrorKind::Required => "FieldValueRequired",
            FieldErrorKind::Invalid => "FieldValueInvalid",
            FieldErrorKind::TypeInvalid => "FieldValueTypeInvalid",
            FieldErrorKind::NotSupported => "FieldValueNotSupported",
            FieldErrorKind::TooLong => "FieldValueTooLong",
            FieldErrorKind::TooMany => "FieldValueTooMany",
            FieldErrorKind::Duplicate => "FieldValueDuplicate",
            FieldErrorKind::Forbidden => "FieldValueForbidden",
            FieldErrorKind::Internal => "InternalError",
        }
    }

    /// The words the apiserver prints for this kind.
    pub fn label(self) -> &'static str {
        match self {
            FieldErrorKind::Required => "Required value",
            FieldErrorKind::Invalid | FieldErrorKind::TypeInvalid => "Invalid value",
            FieldErrorKind::NotSupported => "Unsupported value",
            FieldErrorKind::TooLong => "Too long",
            FieldErrorKind::TooMany => "Too many",
            FieldErrorKind::Duplicate => "Duplicate value",
            FieldErrorKind::Forbidden => "Forbidden",
            FieldErrorKind::Internal => "Internal error",
        }
    }
}

/// One validation failure, at a field path such as `spec.rules[0].matches`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldError {
    /// The field path (`<nil>` for the object itself).
    pub path: String,
    /// What kind of failure.
    pub kind: FieldErrorKind,
    /// The offending value as the apiserver prints it (`200`, `"abc"`, `{"name":"x"}`), if it
    /// prints one for this kind (a failed rule on an object or a list prints none).
    pub value: Option<String>,
    /// The detail message (a rule's message, `should match '^a$'`, ...).
    pub detail: String,
}

impl FieldError {
    /// The error without its path, as `details.causes[].message` carries it:
    /// `Invalid value: "abc": <detail>`, or `Invalid value: <detail>` without a value.
    pub fn body(&self) -> String {
        let mut s = self.kind.label().to_owned();
        if let Some(v) = &self.value {
            s.push_str(": ");
            s.push_str(v);
        }
        if !self.detail.is_empty() {
            s.push_str(": ");
            s.push_str(&self.detail);
        }
        s
    }
}

impl std::fmt::Display for FieldError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.path, self.body())
    }
}

/// How server-side apply merges a list.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ListKind {
    /// Replaced as a whole (the default).
    Atomic,
    /// A set of scalars, merged by value.
    Set,
    /// A list of objects merged by these key fields.
    Map {
        /// `x-kubernetes-list-map-keys`.
        keys: Vec<String>,
    },
}

/// A compiled CRD version schema.
#[derive(Debug)]
pub struct CrdSchema {
    root: schema::Node,
}

impl CrdSchema {
    /// Compiles an `openAPIV3Schema` (the object under `spec.versions[].schema`), including every
    /// pattern and every CEL rule. A rule the emulator cannot parse, or that calls a function it
    /// does not provide, is an error here, never a rule that silently passes.
    pub fn from_openapi_v3(schema: &Value) -> Result<CrdSchema, SchemaError> {
        Ok(CrdSchema {
            root: schema::compile(schema, "")?,
        })
    }

    /// Compiles the schema of one version of a CustomResourceDefinition object.
    pub fn from_crd_version(crd: &Value, version: &str) -> Result<CrdSchema, SchemaError> {
        let name = crd
            .pointer("/metadata/name")
            .and_then(Value::as_str)
            .unwrap_or("<unnamed>");
        let schema = crd
            .pointer("/spec/versions")
            .and_then(Value::as_array)
            .and_then(|vs| {
                vs.iter()
                    .find(|v| v.get("name").and_then(Value::as_str) == Some(version))
            })
            .and_then(|v| v.pointer("/schema/openAPIV3Schema"))
            .ok_or_else(|| SchemaError::MissingSchema {
                crd: name.to_owned(),
                version: version.to_owned(),
            })?;
        CrdSchema::from_openapi_v3(schema)
    }

    /// Drops nulls the schema does not allow, prunes unknown fields (except under
    /// `x-kubernetes-preserve-unknown-fields`; `apiVersion`, `kind` and `metadata` are kept at the
    /// root and in embedded resources) and applies `default`s.
    pub fn default_and_prune(&self, obj: &mut Value) {
        defaults::default_and_prune(&self.root, obj, true);
    }

    /// Validates `new` (already defaulted and pruned) against the schema and its CEL rules.
    /// `old` is the stored object on update: transition rules (`oldSelf`) run only where an old
    /// value correlates, and unchanged values are ratcheted (not re-judged) as the apiserver does.
    pub fn validate(&self, new: &Value, old: Option<&Value>) -> Vec<FieldError> {
        walk::validate(&self.root, new, old)
    }

    /// The list semantics of the field at `path` (property names; list items are stepped through
    /// implicitly, so `["spec", "rules", "backendRefs"]` names the backendRefs of every rule).
    /// Unknown paths and lists without `x-kubernetes-list-type` are atomic.
    pub fn list_type_at(&self, path: &[&str]) -> ListKind {
        let Some(node) = self.node_at(path) else {
            return ListKind::Atomic;
        };
        match node.list_type.as_deref() {
            Some("set") => ListKind::Set,
            Some("map") => ListKind::Map {
                keys: node.list_map_keys.clone(),
            },
            _ => ListKind::Atomic,
        }
    }

    /// Whether the object field at `path` is an atomic map (`x-kubernetes-map-type: atomic`).
    pub fn is_atomic_map(&self, path: &[&str]) -> bool {
        self.node_at(path)
            .is_some_and(|n| n.map_type.as_deref() == Some("atomic"))
    }

    fn node_at(&self, path: &[&str]) -> Option<&schema::Node> {
        let mut node = &self.root;
        for seg in path {
            while let Some(items) = &node.items {
                node = items;
            }
            if seg.parse::<usize>().is_ok() || *seg == "[]" || *seg == "*" {
                continue;
            }
            node = match node.properties.get(*seg) {
                Some(n) => n,
                None => match &node.additional {
                    schema::Additional::Schema(n) => n,
                    _ => return None,
                },
            };
        }
        Some(node)
    }
}

/// Builds the 422 `Status` kube-apiserver sends for an invalid object, e.g.
/// `HTTPRoute.gateway.networking.k8s.io "x" is invalid: spec.rules[0]: Invalid value: <message>`,
/// with `details.causes`.
///
/// `kind_lower_plural_group` is the resource with its group (`httproutes.gateway.networking.k8s.io`,
/// or `configmaps` for the core group): the group is what follows the first dot.
pub fn invalid_status(
    kind_lower_plural_group: &str,
    kind: &str,
    name: &str,
    errors: &[FieldError],
) -> Value {
    let group = kind_lower_plural_group
        .split_once('.')
        .map(|(_, g)| g)
        .unwrap_or("");
    let qualified = if group.is_empty() {
        kind.to_owned()
    } else {
        format!("{kind}.{group}")
    };
    let mut rendered: Vec<String> = Vec::new();
    for e in errors {
        let s = e.to_string();
        if !rendered.contains(&s) {
            rendered.push(s);
        }
    }
    let aggregate = match rendered.len() {
        0 => String::new(),
        1 => rendered[0].clone(),
        _ => format!("[{}]", rendered.join(", ")),
    };
    let causes: Vec<Value> = errors
        .iter()
        .map(|e| json!({"reason": e.kind.reason(), "message": e.body(), "field": e.path}))
        .collect();
    let mut details = json!({"name": name, "kind": kind, "causes": causes});
    if !group.is_empty() {
        details["group"] = json!(group);
    }
    json!({
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": format!("{qualified} {name:?} is invalid: {aggregate}"),
        "reason": "Invalid",
        "details": details,
        "code": 422
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn invalid_status_is_worded_like_the_apiserver() {
        let errs = vec![FieldError {
            path: "spec.rules[0]".into(),
            kind: FieldErrorKind::Invalid,
            value: None,
            detail: "RequestRedirect filter must not be used together with backendRefs".into(),
        }];
        let st = invalid_status(
            "httproutes.gateway.networking.k8s.io",
            "HTTPRoute",
            "x",
            &errs,
        );
        assert_eq!(
            st["message"],
            "HTTPRoute.gateway.networking.k8s.io \"x\" is invalid: spec.rules[0]: Invalid value: RequestRedirect filter must not be used together with backendRefs"
        );
        assert_eq!(st["code"], 422);
        assert_eq!(st["reason"], "Invalid");
        assert_eq!(st["details"]["group"], "gateway.networking.k8s.io");
        assert_eq!(st["details"]["causes"][0]["field"], "spec.rules[0]");
        assert_eq!(st["details"]["causes"][0]["reason"], "FieldValueInvalid");

        let two = vec![
            FieldError {
                path: "spec.a".into(),
                kind: FieldErrorKind::Required,
                value: None,
                detail: String::new(),
            },
            FieldError {
                path: "spec.b".into(),
                kind: FieldErrorKind::TooLong,
                value: None,
                detail: "may not be more than 3 bytes".into(),
            },
        ];
        let st = invalid_status("configmaps", "ConfigMap", "c", &two);
        assert_eq!(
            st["message"],
            "ConfigMap \"c\" is invalid: [spec.a: Required value, spec.b: Too long: may not be more than 3 bytes]"
        );
        assert!(st["details"].get("group").is_none());
    }

    #[test]
    fn list_and_map_types_are_reported_for_apply() {
        let schema = CrdSchema::from_openapi_v3(&json!({
            "type": "object",
            "properties": {"spec": {"type": "object", "properties": {
                "rules": {"type": "array", "maxItems": 16, "items": {"type": "object", "properties": {
                    "backendRefs": {"type": "array", "x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"], "items": {"type": "object"}},
                    "tags": {"type": "array", "x-kubernetes-list-type": "set", "items": {"type": "string"}}
                }}},
                "selector": {"type": "object", "x-kubernetes-map-type": "atomic"}
            }}}
        }))
        .unwrap();
        assert_eq!(schema.list_type_at(&["spec", "rules"]), ListKind::Atomic);
        assert_eq!(
            schema.list_type_at(&["spec", "rules", "backendRefs"]),
            ListKind::Map {
                keys: vec!["name".into()]
            }
        );
        assert_eq!(
            schema.list_type_at(&["spec", "rules", "0", "tags"]),
            ListKind::Set
        );
        assert_eq!(schema.list_type_at(&["spec", "nothing"]), ListKind::Atomic);
        assert!(schema.is_atomic_map(&["spec", "selector"]));
        assert!(!schema.is_atomic_map(&["spec"]));
    }

    fn repo_crd(file: &str) -> Option<Value> {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../crds")
            .join(file);
        let Ok(text) = std::fs::read_to_string(&path) else {
            println!(
                "skipping: {} not found (generate it with the crdgen binary)",
                path.display()
            );
            return None;
        };
        let yaml: serde_yaml::Value = serde_yaml::from_str(&text).expect("CRD YAML parses");
        Some(serde_json::to_value(yaml).expect("CRD converts to JSON"))
    }

    #[test]
    fn sluice_crds_compile_and_their_rules_run() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../crds");
        let Ok(entries) = std::fs::read_dir(&dir) else {
            println!("skipping: {} not found", dir.display());
            return;
        };
        for entry in entries {
            let name = entry
                .expect("dir entry")
                .file_name()
                .to_string_lossy()
                .into_owned();
            if !name.ends_with(".yaml") {
                continue;
            }
            let crd = repo_crd(&name).expect("listed file");
            for v in crd
                .pointer("/spec/versions")
                .and_then(Value::as_array)
                .expect("versions")
            {
                let version = v["name"].as_str().expect("version name");
                if let Err(e) = CrdSchema::from_crd_version(&crd, version) {
                    panic!("{name} {version}: {e}");
                }
            }
        }
        let Some(crd) = repo_crd("rollouts.sluice.dev.yaml") else {
            return;
        };
        let schema = CrdSchema::from_crd_version(&crd, "v1alpha1").expect("Rollout schema");
        let rollout = |steps: Value| {
            json!({
                "apiVersion": "sluice.dev/v1alpha1", "kind": "Rollout",
                "metadata": {"name": "checkout", "namespace": "shop"},
                "spec": {
                    "routeRef": {"name": "checkout"},
                    "stableService": {"name": "checkout-v1"},
                    "canaryService": {"name": "checkout-v2"},
                    "canaryWorkload": {"name": "checkout-v2"},
                    "steps": steps
                }
            })
        };
        let check = |steps: Value| {
            let mut obj = rollout(steps);
            schema.default_and_prune(&mut obj);
            schema
                .validate(&obj, None)
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
        };
        assert_eq!(
            check(
                json!([{"setWeight": {"weight": 5}}, {"setWeight": {"weight": 25}}, {"promote": {}}])
            ),
            Vec::<String>::new()
        );
        assert_eq!(
            check(json!([{"setWeight": {"weight": 25}}, {"setWeight": {"weight": 5}}])),
            vec![
                "spec.steps: Invalid value: setWeight steps must be strictly increasing".to_owned()
            ]
        );
        assert_eq!(
            check(json!([{"setWeight": {"weight": 5}, "promote": {}}])),
            vec!["spec.steps[0]: Invalid value: a step sets exactly one of mirror, headerCohort, setWeight, pause or promote".to_owned()]
        );
    }
}
