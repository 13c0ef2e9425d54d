//! Label and field selectors: parsing the query-string syntax and matching objects.
//!
//! Pure; never touches storage. Field selectors cover `metadata.name` and `metadata.namespace`
//! (the ones every resource supports) plus exact matches on any other dotted path.

use std::collections::BTreeSet;

use serde_json::Value;

/// One requirement of a label selector.
#[derive(Debug, Clone, PartialEq)]
pub enum Requirement {
    /// `key=value`, `key==value`.
    Eq(String, String),
    /// `key!=value`.
    NotEq(String, String),
    /// `key in (a,b)`.
    In(String, BTreeSet<String>),
    /// `key notin (a,b)`.
    NotIn(String, BTreeSet<String>),
    /// `key`.
    Exists(String),
    /// `!key`.
    NotExists(String),
}

/// A parse failure, with the selector text in it.
#[derive(Debug, thiserror::Error, PartialEq)]
#[error(
    "unable to parse requirement: {0:?}: found unexpected syntax; use key=value, key!=value, key in (a,b), key notin (a,b), key or !key"
)]
pub struct SelectorError(pub String);

impl SelectorError {
    /// A bounded label for metrics and logs.
    pub fn category(&self) -> &'static str {
        "selector_syntax"
    }
}

/// Splits on commas that are not inside parentheses.
fn split_top(s: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut depth = 0;
    let mut cur = String::new();
    for c in s.chars() {
        match c {
            '(' => {
                depth += 1;
                cur.push(c)
            }
            ')' => {
                depth -= 1;
                cur.push(c)
            }
            ',' if depth == 0 => out.push(std::mem::take(&mut cur)),
            _ => cur.push(c),
        }
    }
    out.push(cur);
    out.into_iter()
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .collect()
}

fn set_of(rest: &str, whole: &str) -> Result<BTreeSet<String>, SelectorError> {
    let rest = rest.trim();
    let inner = rest
        .strip_prefix('(')
        .and_then(|r| r.strip_suffix(')'))
        .ok_or_else(|| SelectorError(whole.to_string()))?;
    Ok(inner
        .split(',')
        .map(|v| v.trim().to_string())
        .filter(|v| !v.is_empty())
        .collect())
}

/// Parses a label selector (`app=a,tier!=db,env in (x,y),!legacy`).
pub fn parse_labels(s: &str) -> Result<Vec<Requirement>, SelectorError> {
    let mut out = Vec::new();
    for part in split_top(s) {
        let p = part.as_str();
        if let Some(k) = p.strip_prefix('!') {
            out.push(Requirement::NotExists(k.trim().to_string()));
        } else if let Some((k, v)) = p.split_once("!=") {
            out.push(Requirement::NotEq(k.trim().into(), v.trim().into()));
        } else if let Some((k, v)) = p.split_once("==") {
            out.push(Requirement::Eq(k.trim().into(), v.trim().into()));
        } else if let Some((k, v)) = p.split_once('=') {
            out.push(Requirement::Eq(k.trim().into(), v.trim().into()));
        } else if let Some(idx) = p.find(" notin ") {
            out.push(Requirement::NotIn(
                p[..idx].trim().into(),
                set_of(&p[idx + 7..], p)?,
            ));
        } else if let Some(idx) = p.find(" in ") {
            out.push(Requirement::In(
                p[..idx].trim().into(),
                set_of(&p[idx + 4..], p)?,
            ));
        } else if p.contains(['(', ')', ' ', '<', '>']) {
            return Err(SelectorError(p.to_string()));
        } else {
            out.push(Requirement::Exists(p.to_string()));
        }
    }
    Ok(out)
}

/// The `(key, value)` pairs every selected object must carry (`key=value`, or `key in (value)`
/// with one value): what a label index can narrow a search by.
pub fn required_labels(reqs: &[Requirement]) -> Vec<(String, String)> {
    reqs.iter()
        .filter_map(|r| match r {
            Requirement::Eq(k, v) => Some((k.clone(), v.clone())),
            Requirement::In(k, set) if set.len() == 1 => {
                set.first().map(|v| (k.clone(), v.clone()))
            }
            _ => None,
        })
        .collect()
}

/// Whether the labels (a JSON object, or null) satisfy every requirement.
pub fn labels_match(reqs: &[Requirement], labels: Option<&Value>) -> bool {
    let get = |k: &str| labels.and_then(|l| l.get(k)).and_then(Value::as_str);
    reqs.iter().all(|r| match r {
        Requirement::Eq(k, v) => get(k) == Some(v.as_str()),
        Requirement::NotEq(k, v) => get(k) != Some(v.as_str()),
        Requirement::In(k, set) => get(k).is_some_and(|x| set.contains(x)),
        Requirement::NotIn(k, set) => get(k).is_none_or(|x| !set.contains(x)),
        Requirement::Exists(k) => get(k).is_some(),
        Requirement::NotExists(k) => get(k).is_none(),
    })
}

/// Whether a `matchLabels`/`matchExpressions` label selector object selects these labels.
/// An empty selector selects everything; a null one selects nothing.
pub fn label_selector_object_matches(selector: &Value, labels: Option<&Value>) -> bool {
    if selector.is_null() {
        return false;
    }
    let mut reqs = Vec::new();
    if let Some(ml) = selector.get("matchLabels").and_then(Value::as_object) {
        for (k, v) in ml {
            reqs.push(Requirement::Eq(
                k.clone(),
                v.as_str().unwrap_or_default().to_string(),
            ));
        }
    }
    if let Some(exprs) = selector.get("matchExpressions").and_then(Value::as_array) {
        for e in exprs {
            let key = e
                .get("key")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_string();
            let values: BTreeSet<String> = e
                .get("values")
                .and_then(Value::as_array)
                .map(|a| {
                    a.iter()
                        .filter_map(Value::as_str)
                        .map(str::to_string)
                        .collect()
                })
                .unwrap_or_default();
            match e.get("operator").and_then(Value::as_str) {
                Some("In") => reqs.push(Requirement::In(key, values)),
                Some("NotIn") => reqs.push(Requirement::NotIn(key, values)),
                Some("Exists") => reqs.push(Requirement::Exists(key)),
                Some("DoesNotExist") => reqs.push(Requirement::NotExists(key)),
                _ => return false,
            }
        }
    }
    labels_match(&reqs, labels)
}

/// One field-selector term: a dotted path, equal or not, and a value.
#[derive(Debug, Clone, PartialEq)]
pub struct FieldTerm {
    /// Dotted path, such as `metadata.name`.
    pub path: String,
    /// `true` for `=`/`==`, `false` for `!=`.
    pub equal: bool,
    /// The value compared with.
    pub value: String,
}

/// Parses a field selector (`metadata.name=x,metadata.namespace!=y`).
pub fn parse_fields(s: &str) -> Result<Vec<FieldTerm>, SelectorError> {
    let mut out = Vec::new();
    for part in split_top(s) {
        let (path, equal, value) = if let Some((k, v)) = part.split_once("!=") {
            (k, false, v)
        } else if let Some((k, v)) = part.split_once("==") {
            (k, true, v)
        } else if let Some((k, v)) = part.split_once('=') {
            (k, true, v)
        } else {
            return Err(SelectorError(part.clone()));
        };
        out.push(FieldTerm {
            path: path.trim().into(),
            equal,
            value: value.trim().into(),
        });
    }
    Ok(out)
}

/// Whether the object satisfies every field term. A missing field compares as the empty string.
pub fn fields_match(terms: &[FieldTerm], obj: &Value) -> bool {
    terms.iter().all(|t| {
        let mut cur = Some(obj);
        for seg in t.path.split('.') {
            cur = cur.and_then(|c| c.get(seg));
        }
        let actual = match cur {
            Some(Value::String(s)) => s.clone(),
            Some(Value::Null) | None => String::new(),
            Some(other) => other.to_string(),
        };
        (actual == t.value) == t.equal
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn label_selector_table() {
        let labels = json!({"app": "web", "tier": "front"});
        let cases = [
            ("app=web", true),
            ("app==web", true),
            ("app=db", false),
            ("app!=db", true),
            ("app!=web", false),
            ("tier in (front,back)", true),
            ("tier in (back)", false),
            ("tier notin (back)", true),
            ("tier notin (front, back)", false),
            ("missing notin (x)", true),
            ("app", true),
            ("missing", false),
            ("!missing", true),
            ("!app", false),
            ("app=web,tier in (front),!missing", true),
            ("app=web,tier=back", false),
            ("", true),
        ];
        for (sel, want) in cases {
            let reqs = parse_labels(sel).unwrap_or_else(|e| panic!("{sel}: {e}"));
            assert_eq!(labels_match(&reqs, Some(&labels)), want, "{sel}");
        }
        assert!(parse_labels("a in b").is_err());
    }

    #[test]
    fn field_selector_table() {
        let obj =
            json!({"metadata": {"name": "a", "namespace": "ns1"}, "status": {"phase": "Running"}});
        let cases = [
            ("metadata.name=a", true),
            ("metadata.name==a", true),
            ("metadata.name!=a", false),
            ("metadata.namespace=ns1,metadata.name=a", true),
            ("metadata.namespace=ns2", false),
            ("status.phase=Running", true),
            ("spec.nodeName=", true),
        ];
        for (sel, want) in cases {
            assert_eq!(
                fields_match(&parse_fields(sel).unwrap(), &obj),
                want,
                "{sel}"
            );
        }
        assert!(parse_fields("metadata.name").is_err());
    }

    #[test]
    fn selector_objects() {
        let labels = json!({"app": "web"});
        assert!(label_selector_object_matches(&json!({}), Some(&labels)));
        assert!(label_selector_object_matches(
            &json!({"matchLabels": {"app": "web"}}),
            Some(&labels)
        ));
        assert!(!label_selector_object_matches(
            &json!({"matchLabels": {"app": "db"}}),
            Some(&labels)
        ));
        assert!(label_selector_object_matches(
            &json!({"matchExpressions": [{"key": "app", "operator": "In", "values": ["web"]}]}),
            Some(&labels)
        ));
        assert!(!label_selector_object_matches(&Value::Null, Some(&labels)));
    }
}
