//! A light static check of CEL rules against the schema they are attached to: every field a rule
//! selects on a typed object must exist (under its escaped CEL name), as the apiserver's type
//! checker demands when the CRD is created.
//!
//! Owns: finding `self.fieldThatDoesNotExist` (and `p.namespace` where the property is only
//! reachable as `p.__namespace__`) at load time. Must never: report a field where the schema does
//! not pin the shape down (preserved unknown fields, dynamic values) — it only reports certainties.

use cel::common::ast::{Expr, IdedExpr};

use super::cel_library::escape_property;
use super::schema::{Additional, Node};

#[derive(Clone, Copy)]
enum Shape<'a> {
    Unknown,
    Node(&'a Node),
}

struct Checker<'a> {
    scope: Vec<(String, Shape<'a>)>,
    errors: Vec<String>,
    root: Option<&'a Node>,
}

impl<'a> Checker<'a> {
    fn lookup(&self, name: &str) -> Shape<'a> {
        self.scope
            .iter()
            .rev()
            .find(|(n, _)| n == name)
            .map_or(Shape::Unknown, |(_, s)| *s)
    }

    fn select(&mut self, node: &'a Node, field: &str) -> Shape<'a> {
        if !node.properties.is_empty() {
            for (name, sub) in &node.properties {
                if escape_property(name).as_deref() == Some(field) {
                    return Shape::Node(sub);
                }
            }
            let is_root = self.root.is_some_and(|r| std::ptr::eq(r, node));
            let meta = matches!(field, "apiVersion" | "kind" | "metadata");
            if node.preserve_unknown || ((is_root || node.embedded_resource) && meta) {
                return Shape::Unknown;
            }
            let hint = node
                .properties
                .keys()
                .find(|k| k.as_str() == field)
                .and_then(|k| escape_property(k))
                .map(|e| format!(" (the property is reachable as '{e}')"))
                .unwrap_or_default();
            self.errors.push(format!("undefined field '{field}'{hint}"));
            return Shape::Unknown;
        }
        match &node.additional {
            Additional::Schema(sub) => Shape::Node(sub),
            _ => Shape::Unknown,
        }
    }

    fn check(&mut self, e: &IdedExpr) -> Shape<'a> {
        match &e.expr {
            Expr::Ident(name) => self.lookup(name),
            Expr::Select(sel) => match self.check(&sel.operand) {
                Shape::Node(n) => {
                    let s = self.select(n, &sel.field);
                    if sel.test { Shape::Unknown } else { s }
                }
                Shape::Unknown => Shape::Unknown,
            },
            Expr::Call(call) => {
                let target = call.target.as_ref().map(|t| self.check(t));
                let args: Vec<Shape<'a>> = call.args.iter().map(|a| self.check(a)).collect();
                if call.func_name == "_[_]"
                    && target.is_none()
                    && let Some(Shape::Node(n)) = args.first()
                {
                    if let Some(items) = &n.items {
                        return Shape::Node(items);
                    }
                    if let Additional::Schema(sub) = &n.additional {
                        return Shape::Node(sub);
                    }
                }
                Shape::Unknown
            }
            Expr::Comprehension(c) => {
                let range = self.check(&c.iter_range);
                self.check(&c.accu_init);
                let elem = match range {
                    Shape::Node(n) => match &n.items {
                        Some(items) => Shape::Node(items),
                        None => Shape::Unknown,
                    },
                    Shape::Unknown => Shape::Unknown,
                };
                let before = self.scope.len();
                self.scope.push((c.iter_var.clone(), elem));
                if let Some(v2) = &c.iter_var2 {
                    self.scope.push((v2.clone(), Shape::Unknown));
                }
                self.scope.push((c.accu_var.clone(), Shape::Unknown));
                self.check(&c.loop_cond);
                self.check(&c.loop_step);
                self.check(&c.result);
                self.scope.truncate(before);
                Shape::Unknown
            }
            Expr::List(l) => {
                for el in &l.elements {
                    self.check(el);
                }
                Shape::Unknown
            }
            Expr::Map(m) => {
                for entry in &m.entries {
                    if let cel::common::ast::EntryExpr::MapEntry(me) = &entry.expr {
                        self.check(&me.key);
                        self.check(&me.value);
                    }
                }
                Shape::Unknown
            }
            Expr::Struct(s) => {
                for entry in &s.entries {
                    if let cel::common::ast::EntryExpr::StructField(f) = &entry.expr {
                        self.check(&f.value);
                    }
                }
                Shape::Unknown
            }
            Expr::Literal(_) | Expr::Unspecified => Shape::Unknown,
        }
    }
}

/// The fields `program` selects that `node` (bound to `self`, and to `oldSelf` unless the old
/// value is optional) does not have. `is_root` allows `apiVersion`/`kind`/`metadata`.
pub(crate) fn undefined_fields(
    program: &cel::Program,
    node: &Node,
    old_self_typed: bool,
    is_root: bool,
) -> Vec<String> {
    let mut scope = vec![("self".to_owned(), Shape::Node(node))];
    if old_self_typed {
        scope.push(("oldSelf".to_owned(), Shape::Node(node)));
    }
    let mut c = Checker {
        scope,
        errors: Vec::new(),
        root: is_root.then_some(node),
    };
    c.check(program.expression());
    c.errors.dedup();
    c.errors
}

#[cfg(test)]
mod tests {
    use super::super::schema::compile;
    use super::*;
    use serde_json::json;

    #[test]
    fn reports_only_certain_undefined_fields() {
        let node = compile(
            &json!({"type": "object", "properties": {
                "targets": {"type": "array", "items": {"type": "object", "properties": {
                    "name": {"type": "string"}, "namespace": {"type": "string"}
                }}},
                "labels": {"type": "object", "additionalProperties": {"type": "object", "properties": {"v": {"type": "string"}}}},
                "free": {"type": "object", "x-kubernetes-preserve-unknown-fields": true, "properties": {"a": {"type": "string"}}}
            }}),
            "",
        )
        .unwrap();
        let cases: &[(&str, &[&str])] = &[
            (
                "self.targets.all(t, has(t.__namespace__) && t.name != '')",
                &[],
            ),
            (
                "self.targets.all(t, has(t.namespace))",
                &["undefined field 'namespace' (the property is reachable as '__namespace__')"],
            ),
            ("self.targets[0].nmae == 'x'", &["undefined field 'nmae'"]),
            ("self.labels['k'].v == 'x' && self.labels.k.v == 'y'", &[]),
            ("self.labels['k'].w == 'x'", &["undefined field 'w'"]),
            ("self.free.anything == 1", &[]),
            ("self.apiVersion == 'v1' && self.metadata.name == 'x'", &[]),
            ("self.nope", &["undefined field 'nope'"]),
            ("[1].all(x, x.whatever)", &[]),
        ];
        let env = super::super::cel_library::env();
        for (rule, want) in cases {
            let p = env.compile(rule).unwrap();
            assert_eq!(undefined_fields(&p, &node, true, true), *want, "{rule}");
        }
    }
}
