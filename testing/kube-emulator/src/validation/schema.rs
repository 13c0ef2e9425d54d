//! Compiling an OpenAPI v3 structural schema (as a CRD version carries it) into a tree of
//! [`Node`]s, with every regular expression and CEL rule compiled once, up front.
//!
//! Owns: reading the schema JSON and refusing what cannot be honoured. Must never: accept a rule
//! or pattern it cannot evaluate (that would let invalid objects through silently).

use std::collections::BTreeMap;

use regex::Regex;
use serde_json::Value;

use super::SchemaError;
use super::cel_library;
use super::field_check;

/// What `additionalProperties` says about keys not listed in `properties`.
#[derive(Debug, Default)]
pub(crate) enum Additional {
    /// Not given: unknown keys are pruned (unless unknown fields are preserved).
    #[default]
    Unspecified,
    /// `additionalProperties: true|false`.
    Bool(bool),
    /// `additionalProperties: {schema}`: the object is a map of that schema.
    Schema(Box<Node>),
}

/// One compiled `x-kubernetes-validations` rule.
pub(crate) struct Rule {
    /// The rule's source, for messages.
    pub(crate) source: String,
    pub(crate) program: cel::Program,
    pub(crate) message: Option<String>,
    pub(crate) message_expression: Option<cel::Program>,
    /// A JSON path relative to the node (`.spec.x`, `['a.b']`), already in error-path form.
    pub(crate) field_path: Option<String>,
    /// `FieldValueInvalid` (default), `FieldValueForbidden`, `FieldValueRequired`,
    /// `FieldValueDuplicate`.
    pub(crate) reason: Option<String>,
    /// Whether the rule reads `oldSelf`.
    pub(crate) transition: bool,
    pub(crate) optional_old_self: bool,
}

impl std::fmt::Debug for Rule {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Rule")
            .field("source", &self.source)
            .finish_non_exhaustive()
    }
}

/// A compiled schema node.
#[derive(Debug, Default)]
pub(crate) struct Node {
    pub(crate) type_: Option<String>,
    pub(crate) nullable: bool,
    pub(crate) properties: BTreeMap<String, Node>,
    pub(crate) additional: Additional,
    pub(crate) items: Option<Box<Node>>,
    pub(crate) required: Vec<String>,
    pub(crate) enum_: Option<Vec<Value>>,
    pub(crate) minimum: Option<f64>,
    pub(crate) maximum: Option<f64>,
    pub(crate) exclusive_minimum: bool,
    pub(crate) exclusive_maximum: bool,
    pub(crate) multiple_of: Option<f64>,
    pub(crate) pattern: Option<(String, Regex)>,
    pub(crate) min_length: Option<u64>,
    pub(crate) max_length: Option<u64>,
    pub(crate) min_items: Option<u64>,
    pub(crate) max_items: Option<u64>,
    pub(crate) min_properties: Option<u64>,
    pub(crate) max_properties: Option<u64>,
    pub(crate) format: Option<String>,
    pub(crate) default: Option<Value>,
    pub(crate) preserve_unknown: bool,
    pub(crate) int_or_string: bool,
    pub(crate) embedded_resource: bool,
    pub(crate) list_type: Option<String>,
    pub(crate) list_map_keys: Vec<String>,
    pub(crate) map_type: Option<String>,
    pub(crate) rules: Vec<Rule>,
    pub(crate) all_of: Vec<Node>,
    pub(crate) any_of: Vec<Node>,
    pub(crate) one_of: Vec<Node>,
    pub(crate) not: Option<Box<Node>>,
}

impl Node {
    /// Whether this node or any node below it has an `x-kubernetes-validations` rule (the
    /// apiserver builds a CEL validator for the schema only then).
    pub(crate) fn has_rules(&self) -> bool {
        !self.rules.is_empty()
            || self.properties.values().any(Node::has_rules)
            || matches!(&self.additional, Additional::Schema(sub) if sub.has_rules())
            || self.items.as_ref().is_some_and(|i| i.has_rules())
    }
}

fn u64_of(
    v: &serde_json::Map<String, Value>,
    key: &str,
    at: &str,
) -> Result<Option<u64>, SchemaError> {
    match v.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(x) => x
            .as_u64()
            .map(Some)
            .ok_or_else(|| SchemaError::InvalidSchema {
                path: at.to_owned(),
                detail: format!("{key} must be a non-negative integer, got {x}"),
            }),
    }
}

fn f64_of(
    v: &serde_json::Map<String, Value>,
    key: &str,
    at: &str,
) -> Result<Option<f64>, SchemaError> {
    match v.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(x) => x
            .as_f64()
            .map(Some)
            .ok_or_else(|| SchemaError::InvalidSchema {
                path: at.to_owned(),
                detail: format!("{key} must be a number, got {x}"),
            }),
    }
}

fn bool_of(v: &serde_json::Map<String, Value>, key: &str) -> bool {
    v.get(key).and_then(Value::as_bool).unwrap_or(false)
}

/// Turns a rule's `fieldPath` (`.spec.x`, `.a['b.c']`, `.list[0]`) into error-path form
/// (`spec.x`, `a[b.c]`), or refuses it.
fn field_path_suffix(fp: &str, at: &str) -> Result<String, SchemaError> {
    let bad = |why: &str| SchemaError::InvalidSchema {
        path: at.to_owned(),
        detail: format!(
            "fieldPath {fp:?} is invalid: {why}; use a JSON path such as '.spec.field' or \".map['key']\""
        ),
    };
    let mut out = String::new();
    let mut rest = fp;
    if rest.is_empty() {
        return Err(bad("empty"));
    }
    while !rest.is_empty() {
        if let Some(r) = rest.strip_prefix('.') {
            let end = r.find(['.', '[']).unwrap_or(r.len());
            if end == 0 {
                return Err(bad("empty field name"));
            }
            if !out.is_empty() {
                out.push('.');
            }
            out.push_str(&r[..end]);
            rest = &r[end..];
        } else if let Some(r) = rest.strip_prefix('[') {
            let end = r.find(']').ok_or_else(|| bad("unclosed '['"))?;
            let inner = r[..end].trim_matches('\'');
            out.push('[');
            out.push_str(inner);
            out.push(']');
            rest = &r[end + 1..];
        } else {
            return Err(bad("expected '.' or '['"));
        }
    }
    Ok(out)
}

fn compile_cel(source: &str, at: &str, what: &str) -> Result<cel::Program, SchemaError> {
    let env = cel_library::env();
    let program = env.compile(source).map_err(|e| SchemaError::CelCompile {
        path: at.to_owned(),
        rule: source.to_owned(),
        detail: format!("{what} does not parse: {e}; fix the expression"),
    })?;
    let unknown = cel_library::unknown_functions(&program);
    if !unknown.is_empty() {
        return Err(SchemaError::CelCompile {
            path: at.to_owned(),
            rule: source.to_owned(),
            detail: format!(
                "{what} calls {} that the emulator's CEL environment does not provide; use the Kubernetes CEL libraries, or extend the emulator's",
                unknown
                    .iter()
                    .map(|u| format!("'{u}'"))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        });
    }
    Ok(program)
}

fn compile_rules(
    list: &Value,
    at: &str,
    node: &Node,
    is_root: bool,
) -> Result<Vec<Rule>, SchemaError> {
    let Some(items) = list.as_array() else {
        return Err(SchemaError::InvalidSchema {
            path: at.to_owned(),
            detail: "x-kubernetes-validations must be a list of rules".to_owned(),
        });
    };
    let mut rules = Vec::with_capacity(items.len());
    for (i, item) in items.iter().enumerate() {
        let where_ = format!("{at} x-kubernetes-validations[{i}]");
        let source =
            item.get("rule")
                .and_then(Value::as_str)
                .ok_or_else(|| SchemaError::InvalidSchema {
                    path: where_.clone(),
                    detail: "rule is required and must be a string".to_owned(),
                })?;
        let program = compile_cel(source, &where_, "rule")?;
        let refs = program.references();
        let transition = refs.has_variable("oldSelf");
        drop(refs);
        let optional_old_self_flag = item
            .get("optionalOldSelf")
            .and_then(Value::as_bool)
            .unwrap_or(false);
        let undefined =
            field_check::undefined_fields(&program, node, !optional_old_self_flag, is_root);
        if !undefined.is_empty() {
            return Err(SchemaError::CelCompile {
                path: where_,
                rule: source.to_owned(),
                detail: format!(
                    "compilation failed: {}; select properties by their CEL names (reserved words and '-', '.', '/' are escaped)",
                    undefined.join(", ")
                ),
            });
        }
        let message_expression = match item.get("messageExpression").and_then(Value::as_str) {
            Some(src) => {
                let me = compile_cel(src, &where_, "messageExpression")?;
                let undefined =
                    field_check::undefined_fields(&me, node, !optional_old_self_flag, is_root);
                if !undefined.is_empty() {
                    return Err(SchemaError::CelCompile {
                        path: where_,
                        rule: src.to_owned(),
                        detail: format!(
                            "messageExpression compilation failed: {}; select properties by their CEL names",
                            undefined.join(", ")
                        ),
                    });
                }
                Some(me)
            }
            None => None,
        };
        let field_path = match item.get("fieldPath").and_then(Value::as_str) {
            Some(fp) => Some(field_path_suffix(fp, &where_)?),
            None => None,
        };
        let reason = item
            .get("reason")
            .and_then(Value::as_str)
            .map(str::to_owned);
        if let Some(r) = &reason
            && ![
                "FieldValueInvalid",
                "FieldValueForbidden",
                "FieldValueRequired",
                "FieldValueDuplicate",
            ]
            .contains(&r.as_str())
        {
            return Err(SchemaError::InvalidSchema {
                path: where_,
                detail: format!(
                    "reason {r:?} is not one of FieldValueInvalid, FieldValueForbidden, FieldValueRequired, FieldValueDuplicate"
                ),
            });
        }
        let optional_old_self = item
            .get("optionalOldSelf")
            .and_then(Value::as_bool)
            .unwrap_or(false);
        if optional_old_self && !transition {
            return Err(SchemaError::InvalidSchema {
                path: where_,
                detail: "optionalOldSelf is set but the rule does not use oldSelf".to_owned(),
            });
        }
        rules.push(Rule {
            source: source.to_owned(),
            program,
            message: item
                .get("message")
                .and_then(Value::as_str)
                .map(str::to_owned),
            message_expression,
            field_path,
            reason,
            transition,
            optional_old_self,
        });
    }
    Ok(rules)
}

/// Compiles the schema JSON at `at` (a human-readable location for errors).
pub(crate) fn compile(schema: &Value, at: &str) -> Result<Node, SchemaError> {
    let Some(obj) = schema.as_object() else {
        return Err(SchemaError::InvalidSchema {
            path: at.to_owned(),
            detail: "a schema must be an object".to_owned(),
        });
    };
    let mut node = Node {
        type_: obj.get("type").and_then(Value::as_str).map(str::to_owned),
        nullable: bool_of(obj, "nullable"),
        required: obj
            .get("required")
            .and_then(Value::as_array)
            .map(|r| {
                r.iter()
                    .filter_map(Value::as_str)
                    .map(str::to_owned)
                    .collect()
            })
            .unwrap_or_default(),
        enum_: obj.get("enum").and_then(Value::as_array).cloned(),
        minimum: f64_of(obj, "minimum", at)?,
        maximum: f64_of(obj, "maximum", at)?,
        exclusive_minimum: bool_of(obj, "exclusiveMinimum"),
        exclusive_maximum: bool_of(obj, "exclusiveMaximum"),
        multiple_of: f64_of(obj, "multipleOf", at)?,
        min_length: u64_of(obj, "minLength", at)?,
        max_length: u64_of(obj, "maxLength", at)?,
        min_items: u64_of(obj, "minItems", at)?,
        max_items: u64_of(obj, "maxItems", at)?,
        min_properties: u64_of(obj, "minProperties", at)?,
        max_properties: u64_of(obj, "maxProperties", at)?,
        format: obj.get("format").and_then(Value::as_str).map(str::to_owned),
        default: obj.get("default").cloned(),
        preserve_unknown: bool_of(obj, "x-kubernetes-preserve-unknown-fields"),
        int_or_string: bool_of(obj, "x-kubernetes-int-or-string"),
        embedded_resource: bool_of(obj, "x-kubernetes-embedded-resource"),
        list_type: obj
            .get("x-kubernetes-list-type")
            .and_then(Value::as_str)
            .map(str::to_owned),
        list_map_keys: obj
            .get("x-kubernetes-list-map-keys")
            .and_then(Value::as_array)
            .map(|r| {
                r.iter()
                    .filter_map(Value::as_str)
                    .map(str::to_owned)
                    .collect()
            })
            .unwrap_or_default(),
        map_type: obj
            .get("x-kubernetes-map-type")
            .and_then(Value::as_str)
            .map(str::to_owned),
        ..Node::default()
    };
    if let Some(p) = obj.get("pattern").and_then(Value::as_str) {
        let re = Regex::new(p).map_err(|e| SchemaError::InvalidPattern {
            path: at.to_owned(),
            pattern: p.to_owned(),
            detail: e.to_string(),
        })?;
        node.pattern = Some((p.to_owned(), re));
    }
    if let Some(props) = obj.get("properties").and_then(Value::as_object) {
        for (name, sub) in props {
            let child_at = if at.is_empty() {
                name.clone()
            } else {
                format!("{at}.{name}")
            };
            node.properties
                .insert(name.clone(), compile(sub, &child_at)?);
        }
    }
    match obj.get("additionalProperties") {
        None | Some(Value::Null) => {}
        Some(Value::Bool(b)) => node.additional = Additional::Bool(*b),
        Some(sub) => {
            node.additional = Additional::Schema(Box::new(compile(sub, &format!("{at}[*]"))?))
        }
    }
    if let Some(items) = obj.get("items") {
        node.items = Some(Box::new(compile(items, &format!("{at}[*]"))?));
    }
    for (key, slot) in [
        ("allOf", &mut node.all_of),
        ("anyOf", &mut node.any_of),
        ("oneOf", &mut node.one_of),
    ] {
        if let Some(list) = obj.get(key).and_then(Value::as_array) {
            for (i, sub) in list.iter().enumerate() {
                slot.push(compile(sub, &format!("{at} {key}[{i}]"))?);
            }
        }
    }
    if let Some(sub) = obj.get("not") {
        node.not = Some(Box::new(compile(sub, &format!("{at} not"))?));
    }
    if node.type_.as_deref() == Some("array")
        && node.list_type.as_deref() == Some("map")
        && node.list_map_keys.is_empty()
    {
        return Err(SchemaError::InvalidSchema {
            path: at.to_owned(),
            detail: "x-kubernetes-list-type: map requires x-kubernetes-list-map-keys".to_owned(),
        });
    }
    if let Some(rules) = obj.get("x-kubernetes-validations") {
        let compiled = compile_rules(
            rules,
            if at.is_empty() { "<root>" } else { at },
            &node,
            at.is_empty(),
        )?;
        node.rules = compiled;
    }
    Ok(node)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn field_paths_become_error_paths() {
        let cases = [
            (".spec.x", Some("spec.x")),
            (".a['b.c']", Some("a[b.c]")),
            (".list[0].name", Some("list[0].name")),
            ("spec", None),
            ("", None),
        ];
        for (fp, want) in cases {
            assert_eq!(field_path_suffix(fp, "x").ok().as_deref(), want, "{fp}");
        }
    }

    #[test]
    fn refuses_what_it_cannot_evaluate() {
        let cases = [
            (
                json!({"type": "string", "pattern": "(unclosed"}),
                "InvalidPattern",
            ),
            (
                json!({"type": "object", "x-kubernetes-validations": [{"rule": "self.a >"}]}),
                "CelCompile",
            ),
            (
                json!({"type": "object", "x-kubernetes-validations": [{"rule": "self.frob()"}]}),
                "CelCompile",
            ),
            (
                json!({"type": "object", "x-kubernetes-validations": [{"rule": "true", "messageExpression": "'a' +"}]}),
                "CelCompile",
            ),
            (
                json!({"type": "object", "x-kubernetes-validations": [{"rule": "true", "reason": "Nope"}]}),
                "InvalidSchema",
            ),
            (
                json!({"type": "array", "x-kubernetes-list-type": "map", "items": {"type": "object"}}),
                "InvalidSchema",
            ),
        ];
        for (schema, want) in cases {
            let err = compile(&schema, "").expect_err(&schema.to_string());
            assert_eq!(err.category(), want, "{schema}: {err}");
        }
    }
}
