//! Walking an object against its compiled schema: OpenAPI value validations first, then the CEL
//! rules, with the apiserver's error wording and validation ratcheting on update.
//!
//! Owns: deciding which errors an object has. Must never: treat a rule that errors at run time
//! as passing — an evaluation error is reported as a field error.

use std::sync::{Arc, LazyLock};

use cel::objects::{Key, Map, OptionalValue};
use cel::{Context, Value as CelValue};
use serde_json::Value;

use super::cel_library::{self, escape_property, number_to_cel};
use super::formats::has_openapi_format;
use super::schema::{Additional, Node, Rule};
use super::{FieldError, FieldErrorKind};

/// One step of a field path.
#[derive(Clone)]
enum Seg {
    Field(String),
    Index(usize),
    Key(String),
}

fn render(path: &[Seg]) -> String {
    if path.is_empty() {
        return "<nil>".to_owned();
    }
    let mut s = String::new();
    for seg in path {
        match seg {
            Seg::Field(f) => {
                if !s.is_empty() {
                    s.push('.');
                }
                s.push_str(f);
            }
            Seg::Index(i) => s.push_str(&format!("[{i}]")),
            Seg::Key(k) => s.push_str(&format!("[{k}]")),
        }
    }
    s
}

/// Go's `%q` of a string, close enough for messages (JSON escaping).
fn quote(s: &str) -> String {
    serde_json::to_string(s).unwrap_or_else(|_| format!("\"{s}\""))
}

/// A value as `field.Error` prints it: strings quoted, numbers and bools bare, maps and lists as JSON.
fn go_value(v: &Value) -> String {
    match v {
        Value::String(s) => quote(s),
        Value::Number(n) => n.to_string(),
        Value::Bool(b) => b.to_string(),
        Value::Null => "\"null\"".to_owned(),
        // apimachinery prints maps and lists as JSON (json.Marshal: keys sorted).
        Value::Object(_) | Value::Array(_) => go_json(v),
    }
}

fn go_json(v: &Value) -> String {
    match v {
        Value::Object(m) => {
            let mut keys: Vec<&String> = m.keys().collect();
            keys.sort();
            let inner: Vec<String> = keys
                .into_iter()
                .map(|k| format!("{}:{}", quote(k), go_json(&m[k])))
                .collect();
            format!("{{{}}}", inner.join(","))
        }
        Value::Array(a) => format!("[{}]", a.iter().map(go_json).collect::<Vec<_>>().join(",")),
        other => serde_json::to_string(other).unwrap_or_default(),
    }
}

/// The OpenAPI type name of a JSON value, as kube-openapi reports it.
fn type_name(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(n) if n.is_i64() || n.is_u64() => "integer",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

fn is_integral(v: &Value) -> bool {
    match v {
        Value::Number(n) => {
            n.is_i64() || n.is_u64() || n.as_f64().is_some_and(|f| f.fract() == 0.0)
        }
        _ => false,
    }
}

fn type_matches(want: &str, v: &Value) -> bool {
    match want {
        "object" => v.is_object(),
        "array" => v.is_array(),
        "string" => v.is_string(),
        "integer" => is_integral(v),
        "number" => v.is_number(),
        "boolean" => v.is_boolean(),
        _ => true,
    }
}

struct Walker {
    schema_errors: Vec<FieldError>,
    rule_errors: Vec<FieldError>,
}

impl Walker {
    fn err(&mut self, path: &[Seg], kind: FieldErrorKind, value: Option<String>, detail: String) {
        self.schema_errors.push(FieldError {
            path: render(path),
            kind,
            value,
            detail,
        });
    }
}

/// Validates `new` against `root`; schema errors first, then rule errors, as the apiserver lists
/// them.
pub(crate) fn validate(root: &Node, new: &Value, old: Option<&Value>) -> Vec<FieldError> {
    let mut w = Walker {
        schema_errors: Vec::new(),
        rule_errors: Vec::new(),
    };
    let mut path = Vec::new();
    walk(&mut w, root, new, old, &mut path, true);
    let mut out = w.schema_errors;
    // The apiserver does not run the CEL rules of an object with a missing required field, a
    // too long string, too many items, a wrong type or a value outside its enum; it says so
    // instead (apiextensions-apiserver's `hasBlockingErr`).
    let blocking = out.iter().any(|e| {
        matches!(
            e.kind,
            FieldErrorKind::Required
                | FieldErrorKind::TooLong
                | FieldErrorKind::TooMany
                | FieldErrorKind::TypeInvalid
                | FieldErrorKind::NotSupported
        )
    });
    if blocking {
        if !w.rule_errors.is_empty() || root.has_rules() {
            out.push(FieldError {
                path: "<nil>".into(),
                kind: FieldErrorKind::Invalid,
                value: Some("null".into()),
                detail: "some validation rules were not checked because the object was invalid; \
                         correct the existing errors to complete validation"
                    .into(),
            });
        }
    } else {
        out.append(&mut w.rule_errors);
    }
    out
}

fn walk(
    w: &mut Walker,
    node: &Node,
    new: &Value,
    old: Option<&Value>,
    path: &mut Vec<Seg>,
    root: bool,
) {
    // Ratcheting: a value unchanged since the stored object is not judged again (the apiserver's
    // CRDValidationRatcheting), so tightening a schema does not wedge existing objects.
    if !root && old.is_some_and(|o| o == new) {
        return;
    }
    let name = render(path);
    if new.is_null() {
        if !node.nullable && node.type_.is_some() && !node.int_or_string {
            let t = node.type_.as_deref().unwrap_or_default();
            w.err(
                path,
                FieldErrorKind::TypeInvalid,
                Some("\"null\"".into()),
                format!("{name} in body must be of type {t}: \"null\""),
            );
        }
        return;
    }
    if node.int_or_string {
        if !(is_integral(new) || new.is_string()) {
            let got = type_name(new);
            w.err(
                path,
                FieldErrorKind::TypeInvalid,
                Some(quote(got)),
                format!(
                    "{name} in body must be of type integer,string: {}",
                    quote(got)
                ),
            );
            return;
        }
    } else if let Some(t) = node.type_.as_deref()
        && !type_matches(t, new)
    {
        let got = type_name(new);
        w.err(
            path,
            FieldErrorKind::TypeInvalid,
            Some(quote(got)),
            format!("{name} in body must be of type {t}: {}", quote(got)),
        );
        return;
    }
    value_checks(w, node, new, path, &name);
    for sub in &node.all_of {
        let errs = validate_branch(sub, new, path);
        w.schema_errors.extend(errs);
    }
    if !node.any_of.is_empty()
        && !node
            .any_of
            .iter()
            .any(|s| validate_branch(s, new, path).is_empty())
    {
        w.err(
            path,
            FieldErrorKind::Invalid,
            Some(go_value(new)),
            format!("{name} in body must validate at least one schema (anyOf)"),
        );
    }
    if !node.one_of.is_empty() {
        let passing = node
            .one_of
            .iter()
            .filter(|s| validate_branch(s, new, path).is_empty())
            .count();
        if passing != 1 {
            w.err(
                path,
                FieldErrorKind::Invalid,
                Some(go_value(new)),
                format!("{name} in body must validate one and only one schema (oneOf)"),
            );
        }
    }
    if let Some(not) = &node.not
        && validate_branch(not, new, path).is_empty()
    {
        w.err(
            path,
            FieldErrorKind::Invalid,
            Some(go_value(new)),
            format!("{name} in body should not validate the schema (not)"),
        );
    }

    // A node's own rules are evaluated before its children's, as the apiserver's CEL validator
    // does, so a list's rule is reported before its items' rules.
    if !node.rules.is_empty() {
        run_rules(w, node, new, old, path);
    }

    match new {
        Value::Object(map) => {
            let old_map = old.and_then(Value::as_object);
            if node.properties.is_empty() {
                if let Additional::Schema(sub) = &node.additional {
                    for (k, v) in map {
                        path.push(Seg::Key(k.clone()));
                        walk(w, sub, v, old_map.and_then(|o| o.get(k)), path, false);
                        path.pop();
                    }
                }
            } else {
                for (k, sub) in &node.properties {
                    if let Some(v) = map.get(k) {
                        path.push(Seg::Field(k.clone()));
                        walk(w, sub, v, old_map.and_then(|o| o.get(k)), path, false);
                        path.pop();
                    }
                }
            }
        }
        Value::Array(items) => {
            if let Some(sub) = &node.items {
                let old_items = old.and_then(Value::as_array);
                for (i, item) in items.iter().enumerate() {
                    let old_item = old_items.and_then(|olds| correlate(node, item, olds));
                    path.push(Seg::Index(i));
                    walk(w, sub, item, old_item, path, false);
                    path.pop();
                }
            }
        }
        _ => {}
    }
}

/// The old list item a new one corresponds to: by key fields for `x-kubernetes-list-type: map`;
/// items of other lists do not correlate.
fn correlate<'a>(node: &Node, item: &Value, olds: &'a [Value]) -> Option<&'a Value> {
    if node.list_type.as_deref() != Some("map") {
        return None;
    }
    olds.iter()
        .find(|o| node.list_map_keys.iter().all(|k| o.get(k) == item.get(k)))
}

/// Schema errors of `v` against a branch of allOf/anyOf/oneOf/not.
fn validate_branch(node: &Node, v: &Value, path: &[Seg]) -> Vec<FieldError> {
    let mut w = Walker {
        schema_errors: Vec::new(),
        rule_errors: Vec::new(),
    };
    let mut p = path.to_vec();
    walk(&mut w, node, v, None, &mut p, true);
    w.schema_errors
}

fn value_checks(w: &mut Walker, node: &Node, v: &Value, path: &[Seg], name: &str) {
    if let Some(allowed) = &node.enum_
        && !allowed.contains(v)
    {
        let supported: Vec<String> = allowed.iter().map(go_value).collect();
        w.err(
            path,
            FieldErrorKind::NotSupported,
            Some(go_value(v)),
            format!("supported values: {}", supported.join(", ")),
        );
    }
    match v {
        Value::String(s) => {
            let len = s.chars().count() as u64;
            if let Some(max) = node.max_length
                && len > max
            {
                let unit = if max == 1 { "byte" } else { "bytes" };
                w.err(
                    path,
                    FieldErrorKind::TooLong,
                    None,
                    format!("may not be more than {max} {unit}"),
                );
            }
            // kube-openapi's stringValidator reports only the first of maxLength, minLength
            // and pattern that fails.
            let length_failed = node.max_length.is_some_and(|max| len > max);
            if !length_failed
                && let Some(min) = node.min_length
                && len < min
            {
                w.err(
                    path,
                    FieldErrorKind::Invalid,
                    Some(quote(s)),
                    format!("{name} in body should be at least {min} chars long"),
                );
            }
            if !length_failed
                && node.min_length.is_none_or(|min| len >= min)
                && let Some((src, re)) = &node.pattern
                && !re.is_match(s)
            {
                w.err(
                    path,
                    FieldErrorKind::Invalid,
                    Some(quote(s)),
                    format!("{name} in body should match '{src}'"),
                );
            }
            if let Some(f) = &node.format
                && !has_openapi_format(f, s)
            {
                w.err(
                    path,
                    FieldErrorKind::Invalid,
                    Some(quote(s)),
                    format!("{name} in body must be of type {f}: {}", quote(s)),
                );
            }
        }
        Value::Number(n) => {
            let x = n.as_f64().unwrap_or(f64::NAN);
            // kube-openapi's numberValidator lists multipleOf, then minimum, then maximum.
            if let Some(m) = node.multiple_of
                && m != 0.0
                && (x / m).fract().abs() > 1e-9
            {
                w.err(
                    path,
                    FieldErrorKind::Invalid,
                    Some(n.to_string()),
                    format!("{name} in body should be a multiple of {m}"),
                );
            }
            if let Some(min) = node.minimum
                && ((node.exclusive_minimum && x <= min) || x < min)
            {
                let rel = if node.exclusive_minimum {
                    "greater than"
                } else {
                    "greater than or equal to"
                };
                w.err(
                    path,
                    FieldErrorKind::Invalid,
                    Some(n.to_string()),
                    format!("{name} in body should be {rel} {min}"),
                );
            }
            if let Some(max) = node.maximum
                && ((node.exclusive_maximum && x >= max) || x > max)
            {
                let rel = if node.exclusive_maximum {
                    "less than"
                } else {
                    "less than or equal to"
                };
                w.err(
                    path,
                    FieldErrorKind::Invalid,
                    Some(n.to_string()),
                    format!("{name} in body should be {rel} {max}"),
                );
            }
        }
        Value::Array(items) => {
            let len = items.len() as u64;
            if let Some(max) = node.max_items
                && len > max
            {
                w.err(
                    path,
                    FieldErrorKind::TooMany,
                    Some(len.to_string()),
                    format!("must have at most {max} items"),
                );
            }
            if let Some(min) = node.min_items
                && len < min
            {
                w.err(
                    path,
                    FieldErrorKind::Invalid,
                    Some(len.to_string()),
                    format!("{name} in body should have at least {min} items"),
                );
            }
            match node.list_type.as_deref() {
                Some("set") => {
                    for (i, item) in items.iter().enumerate() {
                        if items[..i].contains(item) {
                            let mut p = path.to_vec();
                            p.push(Seg::Index(i));
                            w.err(
                                &p,
                                FieldErrorKind::Duplicate,
                                Some(go_value(item)),
                                String::new(),
                            );
                        }
                    }
                }
                Some("map") => {
                    let key_of = |item: &Value| -> Value {
                        let mut m = serde_json::Map::new();
                        for k in &node.list_map_keys {
                            if let Some(x) = item.get(k) {
                                m.insert(k.clone(), x.clone());
                            }
                        }
                        Value::Object(m)
                    };
                    let keys: Vec<Value> = items.iter().map(key_of).collect();
                    for i in 0..keys.len() {
                        if keys[..i].contains(&keys[i]) {
                            let mut p = path.to_vec();
                            p.push(Seg::Index(i));
                            w.err(
                                &p,
                                FieldErrorKind::Duplicate,
                                Some(go_value(&keys[i])),
                                String::new(),
                            );
                        }
                    }
                }
                _ => {}
            }
        }
        Value::Object(map) => {
            if node.embedded_resource {
                // An embedded resource must say what it is, as the apiserver demands.
                for field in ["apiVersion", "kind"] {
                    if map
                        .get(field)
                        .and_then(Value::as_str)
                        .is_none_or(str::is_empty)
                    {
                        let mut p = path.to_vec();
                        p.push(Seg::Field(field.to_owned()));
                        w.err(
                            &p,
                            FieldErrorKind::Required,
                            None,
                            "must not be empty".to_owned(),
                        );
                    }
                }
            }
            for r in &node.required {
                if !map.contains_key(r) {
                    let mut p = path.to_vec();
                    p.push(Seg::Field(r.clone()));
                    w.err(&p, FieldErrorKind::Required, None, String::new());
                }
            }
            let len = map.len() as u64;
            if let Some(max) = node.max_properties
                && len > max
            {
                w.err(
                    path,
                    FieldErrorKind::TooMany,
                    Some(len.to_string()),
                    format!("must have at most {max} items"),
                );
            }
            if let Some(min) = node.min_properties
                && len < min
            {
                w.err(
                    path,
                    FieldErrorKind::Invalid,
                    Some(len.to_string()),
                    format!("{name} in body should have at least {min} properties"),
                );
            }
            if let Additional::Bool(false) = node.additional {
                for k in map.keys() {
                    if !node.properties.contains_key(k) {
                        let mut p = path.to_vec();
                        p.push(Seg::Field(k.clone()));
                        w.err(
                            &p,
                            FieldErrorKind::Invalid,
                            Some(quote(k)),
                            format!("{name} in body is a forbidden property"),
                        );
                    }
                }
            }
        }
        _ => {}
    }
}

/// Converts `v` to CEL following the schema: object properties by their escaped names, numbers
/// as `double` where the schema says `number`, `date-time` strings as timestamps.
pub(crate) fn to_cel(node: Option<&Node>, v: &Value) -> CelValue {
    let Some(node) = node else {
        return cel_library::json_to_cel(v);
    };
    match v {
        Value::Number(n) => number_to_cel(n, node.type_.as_deref() == Some("number")),
        Value::String(s) if node.format.as_deref() == Some("date-time") => {
            cel_timestamp(s).unwrap_or_else(|| CelValue::String(Arc::new(s.clone())))
        }
        Value::Array(items) => {
            let sub = node.items.as_deref();
            CelValue::List(Arc::new(items.iter().map(|i| to_cel(sub, i)).collect()))
        }
        Value::Object(map) => {
            let mut out: std::collections::HashMap<Key, CelValue> =
                std::collections::HashMap::with_capacity(map.len());
            if !node.properties.is_empty() {
                for (k, val) in map {
                    match node.properties.get(k) {
                        Some(sub) => {
                            if let Some(escaped) = escape_property(k) {
                                out.insert(Key::String(Arc::new(escaped)), to_cel(Some(sub), val));
                            }
                        }
                        // Unknown fields survive only under preserve-unknown-fields or in
                        // embedded resources: untyped, under their own names.
                        None => {
                            out.insert(
                                Key::String(Arc::new(k.clone())),
                                cel_library::json_to_cel(val),
                            );
                        }
                    }
                }
            } else {
                let sub = match &node.additional {
                    Additional::Schema(s) => Some(s.as_ref()),
                    _ => None,
                };
                for (k, val) in map {
                    out.insert(Key::String(Arc::new(k.clone())), to_cel(sub, val));
                }
            }
            CelValue::Map(Map { map: Arc::new(out) })
        }
        other => cel_library::json_to_cel(other),
    }
}

/// A CEL timestamp for an RFC 3339 string, through CEL's own `timestamp()` conversion (so the
/// emulator needs no direct dependency on the time library the `cel` crate uses).
fn cel_timestamp(rfc3339: &str) -> Option<CelValue> {
    static PROGRAM: LazyLock<Option<cel::Program>> =
        LazyLock::new(|| cel_library::env().compile("timestamp(s)").ok());
    let program = PROGRAM.as_ref()?;
    let mut ctx = Context::with_env(cel_library::env());
    ctx.add_variable_from_value("s", CelValue::String(Arc::new(rfc3339.to_owned())));
    match program.execute(&ctx) {
        Ok(v @ CelValue::Timestamp(_)) => Some(v),
        _ => None,
    }
}

fn rule_error(
    w: &mut Walker,
    path: &[Seg],
    rule: &Rule,
    type_name: &str,
    detail: String,
    new: &Value,
) {
    let mut p = render(path);
    if let Some(fp) = &rule.field_path {
        if p == "<nil>" {
            p = fp.clone();
        } else if fp.starts_with('[') {
            p.push_str(fp);
        } else {
            p = format!("{p}.{fp}");
        }
    }
    // A failed rule names the value of a scalar and omits an object or list
    // (`field.OmitValueType`): `spec.x: Invalid value: "abc": msg`, `spec: Invalid value: msg`.
    let value = if type_name == "object" || type_name == "array" {
        None
    } else {
        Some(go_value(new))
    };
    let (kind, value, detail) = match rule.reason.as_deref() {
        Some("FieldValueForbidden") => (FieldErrorKind::Forbidden, None, detail),
        Some("FieldValueRequired") => (FieldErrorKind::Required, None, detail),
        Some("FieldValueDuplicate") => (FieldErrorKind::Duplicate, value, String::new()),
        _ => (FieldErrorKind::Invalid, value, detail),
    };
    w.rule_errors.push(FieldError {
        path: p,
        kind,
        value,
        detail,
    });
}

fn rule_label(rule: &Rule) -> String {
    match &rule.message {
        Some(m) if !m.trim().is_empty() => m.trim().to_owned(),
        _ => rule.source.trim().to_owned(),
    }
}

fn run_rules(w: &mut Walker, node: &Node, new: &Value, old: Option<&Value>, path: &[Seg]) {
    let type_name = node
        .type_
        .as_deref()
        .unwrap_or(if node.int_or_string { "" } else { "object" });
    let env = cel_library::env();
    let self_val = to_cel(Some(node), new);
    let old_val = old.map(|o| to_cel(Some(node), o));
    // One context per shape of `oldSelf`, shared by the node's rules: converting the value into
    // the interpreter's form is the dominant cost, so it is done once per node, not per rule.
    let make_ctx = |old_self: Option<CelValue>| {
        let mut ctx = Context::with_env(env.clone());
        ctx.add_variable_from_value("self", self_val.clone());
        if let Some(o) = old_self {
            ctx.add_variable_from_value("oldSelf", o);
        }
        ctx
    };
    let plain_ctx = make_ctx(old_val.clone());
    let optional_ctx = std::cell::OnceCell::new();
    for rule in &node.rules {
        if rule.transition && old_val.is_none() && !rule.optional_old_self {
            continue;
        }
        let ctx = if rule.optional_old_self {
            optional_ctx.get_or_init(|| {
                make_ctx(Some(CelValue::Opaque(Arc::new(match &old_val {
                    Some(o) => OptionalValue::of(o.clone()),
                    None => OptionalValue::none(),
                }))))
            })
        } else {
            &plain_ctx
        };
        match rule.program.execute(ctx) {
            Ok(CelValue::Bool(true)) => {}
            Ok(CelValue::Bool(false)) => {
                let fallback = match &rule.message {
                    Some(m) if !m.trim().is_empty() => m.trim().to_owned(),
                    _ => format!("failed rule: {}", rule.source.trim()),
                };
                let detail = match &rule.message_expression {
                    Some(me) => match me.execute(ctx) {
                        Ok(CelValue::String(s)) if !s.trim().is_empty() && !s.contains('\n') => {
                            s.trim().to_owned()
                        }
                        _ => fallback,
                    },
                    None => fallback,
                };
                rule_error(w, path, rule, type_name, detail, new);
            }
            Ok(other) => {
                let detail = format!(
                    "rule did not evaluate to a boolean (got {other:?}) for rule: {}",
                    rule_label(rule)
                );
                rule_error(w, path, rule, type_name, detail, new);
            }
            Err(e) => {
                let text = e.to_string();
                let detail = if text.starts_with("found no matching overload") {
                    format!(
                        "'{text}': call arguments did not match a supported operator, function or macro signature for rule: {}",
                        rule_label(rule)
                    )
                } else {
                    format!("{text} evaluating rule: {}", rule_label(rule))
                };
                let mut p = render(path);
                if p.is_empty() {
                    p = "<nil>".into();
                }
                w.rule_errors.push(FieldError {
                    path: p,
                    kind: FieldErrorKind::Invalid,
                    value: Some(quote(type_name)),
                    detail,
                });
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::schema::compile;
    use super::*;
    use serde_json::json;

    fn schema() -> Node {
        compile(
            &json!({
                "type": "object",
                "x-kubernetes-validations": [{"rule": "self.metadata.name != 'forbidden'", "message": "that name is taken"}],
                "properties": {
                    "spec": {
                        "type": "object",
                        "required": ["target"],
                        "x-kubernetes-validations": [
                            {"rule": "self.replicas <= self.maxReplicas", "messageExpression": "'replicas ' + string(self.replicas) + ' exceeds ' + string(self.maxReplicas)", "fieldPath": ".replicas"},
                            {"rule": "self.target == oldSelf.target", "message": "target is immutable", "reason": "FieldValueForbidden"},
                            {"rule": "!oldSelf.hasValue() || oldSelf.value().mode != 'Locked' || self.mode == 'Locked'", "optionalOldSelf": true, "message": "a locked spec stays locked"},
                            {"rule": "!has(self.ratio) || self.ratio < 1.0"}
                        ],
                        "properties": {
                            "target": {"type": "string", "minLength": 1, "maxLength": 8, "pattern": "^[a-z]+$"},
                            "replicas": {"type": "integer", "minimum": 0, "exclusiveMinimum": true, "default": 1},
                            "maxReplicas": {"type": "integer", "maximum": 10, "default": 10},
                            "ratio": {"type": "number"},
                            "mode": {"type": "string", "enum": ["Open", "Locked"]},
                            "port": {"x-kubernetes-int-or-string": true},
                            "note": {"type": "string", "nullable": true},
                            "since": {"type": "string", "format": "date-time"},
                            "template": {"type": "object", "x-kubernetes-embedded-resource": true, "x-kubernetes-preserve-unknown-fields": true},
                            "tags": {"type": "array", "x-kubernetes-list-type": "set", "minItems": 1, "items": {"type": "string"}},
                            "backends": {"type": "array", "x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"],
                                "items": {"type": "object", "required": ["name"], "properties": {
                                    "name": {"type": "string"},
                                    "weight": {"type": "integer", "maximum": 100}
                                },
                                "x-kubernetes-validations": [{"rule": "self.weight >= oldSelf.weight", "message": "weights only grow"}]}}
                        }
                    }
                }
            }),
            "",
        )
        .unwrap()
    }

    fn obj(spec: Value) -> Value {
        json!({"apiVersion": "x/v1", "kind": "K", "metadata": {"name": "n"}, "spec": spec})
    }

    fn errors(new: &Value, old: Option<&Value>) -> Vec<String> {
        let node = schema();
        let mut new = new.clone();
        super::super::defaults::default_and_prune(&node, &mut new, true);
        validate(&node, &new, old)
            .iter()
            .map(|e| e.to_string())
            .collect()
    }

    /// What the apiserver adds instead of running the rules of an object with a blocking error.
    const BLOCKED: &str = "<nil>: Invalid value: null: some validation rules were not checked because the object was invalid; correct the existing errors to complete validation";

    #[test]
    fn schema_and_rule_errors_are_worded_like_the_apiserver() {
        let cases: Vec<(&str, Value, &[&str])> = vec![
            (
                "valid",
                obj(
                    json!({"target": "web", "tags": ["a"], "port": "http", "note": null, "since": "2024-01-02T03:04:05Z"}),
                ),
                &[],
            ),
            (
                "required",
                obj(json!({})),
                &["spec.target: Required value", BLOCKED],
            ),
            (
                "pattern and length",
                obj(json!({"target": "WEB-SERVER-1"})),
                &[
                    "spec.target: Too long: may not be more than 8 bytes",
                    BLOCKED,
                ],
            ),
            (
                "minLength",
                obj(json!({"target": ""})),
                &[
                    "spec.target: Invalid value: \"\": spec.target in body should be at least 1 chars long",
                ],
            ),
            (
                "exclusive minimum",
                obj(json!({"target": "a", "replicas": 0})),
                &[
                    "spec.replicas: Invalid value: 0: spec.replicas in body should be greater than 0",
                ],
            ),
            (
                "maximum",
                obj(json!({"target": "a", "maxReplicas": 11})),
                &[
                    "spec.maxReplicas: Invalid value: 11: spec.maxReplicas in body should be less than or equal to 10",
                ],
            ),
            (
                "enum",
                obj(json!({"target": "a", "mode": "Shut"})),
                &[
                    "spec.mode: Unsupported value: \"Shut\": supported values: \"Open\", \"Locked\"",
                    BLOCKED,
                ],
            ),
            (
                "int-or-string",
                obj(json!({"target": "a", "port": true})),
                &[
                    "spec.port: Invalid value: \"boolean\": spec.port in body must be of type integer,string: \"boolean\"",
                    BLOCKED,
                ],
            ),
            (
                "null not nullable",
                obj(json!({"target": "a", "ratio": null, "mode": null})),
                &[],
            ),
            (
                "format",
                obj(json!({"target": "a", "since": "yesterday"})),
                &[
                    "spec.since: Invalid value: \"yesterday\": spec.since in body must be of type date-time: \"yesterday\"",
                ],
            ),
            (
                "set duplicate",
                obj(json!({"target": "a", "tags": ["a", "b", "a"]})),
                &["spec.tags[2]: Duplicate value: \"a\""],
            ),
            (
                "minItems",
                obj(json!({"target": "a", "tags": []})),
                &["spec.tags: Invalid value: 0: spec.tags in body should have at least 1 items"],
            ),
            (
                "map duplicate",
                obj(json!({"target": "a", "backends": [{"name": "x"}, {"name": "x"}]})),
                &["spec.backends[1]: Duplicate value: {\"name\":\"x\"}"],
            ),
            (
                "messageExpression and fieldPath",
                obj(json!({"target": "a", "replicas": 5, "maxReplicas": 3})),
                &["spec.replicas: Invalid value: replicas 5 exceeds 3"],
            ),
            (
                "rule without message",
                obj(json!({"target": "a", "ratio": 1.5})),
                &["spec: Invalid value: failed rule: !has(self.ratio) || self.ratio < 1.0"],
            ),
            (
                "root rule",
                json!({"apiVersion": "x/v1", "kind": "K", "metadata": {"name": "forbidden"}, "spec": {"target": "a"}}),
                &["<nil>: Invalid value: that name is taken"],
            ),
            (
                "embedded resource without kind",
                obj(json!({"target": "a", "template": {"apiVersion": "v1"}})),
                &[
                    "spec.template.kind: Required value: must not be empty",
                    BLOCKED,
                ],
            ),
            (
                "type error stops the subtree",
                obj(json!({"target": 7})),
                &[
                    "spec.target: Invalid value: \"integer\": spec.target in body must be of type string: \"integer\"",
                    BLOCKED,
                ],
            ),
        ];
        for (what, new, want) in cases {
            assert_eq!(
                errors(&new, None),
                want.iter().map(|s| s.to_string()).collect::<Vec<_>>(),
                "{what}"
            );
        }
    }

    #[test]
    fn transition_rules_run_only_against_a_correlated_old_value() {
        let old = obj(
            json!({"target": "a", "mode": "Locked", "backends": [{"name": "x", "weight": 50}], "replicas": 1, "maxReplicas": 10}),
        );
        let cases: Vec<(&str, Value, Option<&Value>, &[&str])> = vec![
            (
                "create skips transition rules",
                obj(json!({"target": "b", "mode": "Open"})),
                None,
                &[],
            ),
            ("unchanged passes", old.clone(), Some(&old), &[]),
            (
                "immutable with reason",
                obj(
                    json!({"target": "b", "mode": "Locked", "backends": [{"name": "x", "weight": 50}]}),
                ),
                Some(&old),
                &["spec: Forbidden: target is immutable"],
            ),
            (
                "optionalOldSelf sees the old value",
                obj(
                    json!({"target": "a", "mode": "Open", "backends": [{"name": "x", "weight": 50}]}),
                ),
                Some(&old),
                &["spec: Invalid value: a locked spec stays locked"],
            ),
            (
                "map-list items correlate by key",
                obj(
                    json!({"target": "a", "mode": "Locked", "backends": [{"name": "x", "weight": 40}]}),
                ),
                Some(&old),
                &["spec.backends[0]: Invalid value: weights only grow"],
            ),
            (
                "a new map-list item has no old value",
                obj(
                    json!({"target": "a", "mode": "Locked", "backends": [{"name": "x", "weight": 50}, {"name": "y", "weight": 1}]}),
                ),
                Some(&old),
                &[],
            ),
        ];
        for (what, new, old, want) in cases {
            assert_eq!(
                errors(&new, old),
                want.iter().map(|s| s.to_string()).collect::<Vec<_>>(),
                "{what}"
            );
        }
    }

    #[test]
    fn evaluation_errors_are_reported_not_passed() {
        let node = compile(
            &json!({"type": "object", "properties": {"spec": {"type": "object",
                "x-kubernetes-validations": [{"rule": "self.a > 0", "message": "a must be positive"}],
                "properties": {"a": {"type": "integer"}}}}}),
            "",
        )
        .unwrap();
        let errs = validate(&node, &json!({"spec": {}}), None);
        assert_eq!(errs.len(), 1);
        assert_eq!(errs[0].path, "spec");
        assert!(
            errs[0]
                .detail
                .ends_with("evaluating rule: a must be positive"),
            "{}",
            errs[0].detail
        );
    }
}
