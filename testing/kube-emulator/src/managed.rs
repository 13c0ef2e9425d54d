//! Field ownership: `metadata.managedFields` (fieldsV1), server-side apply merges, ownership
//! conflicts between managers, and the `Update` entries recorded for writes that are not applies.
//!
//! Follows structured-merge-diff's rules: an apply owns the leaves of its configuration (list
//! items and map entries too), conflicts are other managers' fields the apply would change,
//! `force` takes them over, and fields a manager stops applying are removed unless someone else
//! owns them — whole sub-objects too: removal is decided with each owned path's named parents
//! (struct fields, not map entries or list items) counted as owned, so a parent the manager
//! owned fields below goes once nobody owns anything below it, and stays while another manager
//! does. Lists honour `x-kubernetes-list-type` (atomic/set/map) from the CRD schema; for
//! built-ins the list types are hardcoded for the fields operators write. Pure: never stores.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::{Map, Value, json};

use crate::error::ApiError;
use crate::patch::builtin_merge_key;

/// One path element in structured-merge-diff's string form (`f:name`, `k:{"name":"a"}`,
/// `v:"x"`, `i:0`).
pub type Pe = String;
/// A path from the object root.
pub type Path = Vec<Pe>;
/// A set of owned paths.
pub type FieldSet = BTreeSet<Path>;

/// How a list merges.
#[derive(Debug, Clone, PartialEq)]
pub enum ListKind {
    /// Replaced as a whole, owned as a whole.
    Atomic,
    /// A set of scalars; each value owned separately.
    Set,
    /// A map keyed by these fields; each item owned separately.
    Map(Vec<String>),
}

/// Maps under these field names are maps (entries owned one by one), not structs.
const GRANULAR_MAPS: &[&str] = &[
    "labels",
    "annotations",
    "data",
    "stringData",
    "binaryData",
    "nodeSelector",
    "matchLabels",
    "limits",
    "requests",
];

/// The schema position while walking an object.
#[derive(Debug, Clone, Copy)]
pub enum Shape<'a> {
    /// A node of a CRD's OpenAPI v3 schema; `None` where the schema says nothing (deduced).
    Schema(Option<&'a Value>),
    /// A built-in kind (or `metadata`), at the field with this name.
    Builtin(Option<&'a str>),
}

impl<'a> Shape<'a> {
    /// The root shape of an object of a kind with this schema (`None` for built-ins).
    pub fn root(schema: Option<&'a Value>) -> Self {
        match schema {
            Some(s) => Shape::Schema(Some(s)),
            None => Shape::Builtin(None),
        }
    }

    fn child(self, field: &'a str, at_root: bool) -> Shape<'a> {
        if at_root && field == "metadata" {
            return Shape::Builtin(Some("metadata"));
        }
        match self {
            Shape::Schema(Some(s)) => {
                if let Some(p) = s.get("properties").and_then(|p| p.get(field)) {
                    return Shape::Schema(Some(p));
                }
                match s.get("additionalProperties") {
                    Some(ap) if ap.is_object() => Shape::Schema(Some(ap)),
                    _ => Shape::Schema(None),
                }
            }
            Shape::Schema(None) => Shape::Schema(None),
            Shape::Builtin(_) => Shape::Builtin(Some(field)),
        }
    }

    fn items(self) -> Shape<'a> {
        match self {
            Shape::Schema(Some(s)) => Shape::Schema(s.get("items")),
            other => other,
        }
    }

    fn map_atomic(self) -> bool {
        match self {
            Shape::Schema(Some(s)) => {
                s.get("x-kubernetes-map-type").and_then(Value::as_str) == Some("atomic")
            }
            _ => false,
        }
    }

    fn declared(self, key: &str) -> bool {
        match self {
            Shape::Schema(Some(s)) => s.get("properties").and_then(|p| p.get(key)).is_some(),
            Shape::Schema(None) => false,
            Shape::Builtin(Some(f)) => !GRANULAR_MAPS.contains(&f),
            Shape::Builtin(None) => true,
        }
    }

    /// How the list at this position merges.
    pub fn list_kind(self, sample: Option<&Value>) -> ListKind {
        match self {
            Shape::Schema(Some(s)) => match s.get("x-kubernetes-list-type").and_then(Value::as_str)
            {
                Some("set") => ListKind::Set,
                Some("map") => ListKind::Map(
                    s.get("x-kubernetes-list-map-keys")
                        .and_then(Value::as_array)
                        .map(|a| {
                            a.iter()
                                .filter_map(Value::as_str)
                                .map(str::to_string)
                                .collect()
                        })
                        .unwrap_or_default(),
                ),
                _ => ListKind::Atomic,
            },
            Shape::Schema(None) | Shape::Builtin(None) => ListKind::Atomic,
            Shape::Builtin(Some(field)) => {
                if field == "finalizers" {
                    return ListKind::Set;
                }
                match builtin_merge_key(field, sample) {
                    Some("containerPort") => {
                        ListKind::Map(vec!["containerPort".into(), "protocol".into()])
                    }
                    Some("port") => ListKind::Map(vec!["port".into(), "protocol".into()]),
                    Some(k) => ListKind::Map(vec![k.into()]),
                    None => ListKind::Atomic,
                }
            }
        }
    }
}

/// Compact JSON with object keys sorted, as structured-merge-diff writes keys and values.
fn canonical(v: &Value) -> String {
    match v {
        Value::Object(m) => {
            let mut keys: Vec<&String> = m.keys().collect();
            keys.sort();
            let inner: Vec<String> = keys
                .iter()
                .map(|k| {
                    format!(
                        "{}:{}",
                        Value::String((*k).clone()),
                        canonical(&m[k.as_str()])
                    )
                })
                .collect();
            format!("{{{}}}", inner.join(","))
        }
        Value::Array(a) => format!(
            "[{}]",
            a.iter().map(canonical).collect::<Vec<_>>().join(",")
        ),
        other => other.to_string(),
    }
}

fn key_pe(item: &Value, keys: &[String]) -> Pe {
    let mut m = Map::new();
    for k in keys {
        if let Some(v) = item.get(k) {
            m.insert(k.clone(), v.clone());
        }
    }
    format!("k:{}", canonical(&Value::Object(m)))
}

fn item_pe(kind: &ListKind, item: &Value, index: usize) -> Pe {
    match kind {
        ListKind::Set => format!("v:{}", canonical(item)),
        ListKind::Map(keys) if !keys.is_empty() => key_pe(item, keys),
        _ => format!("i:{index}"),
    }
}

/// The fields an apply configuration owns (structured-merge-diff's `ToFieldSet`).
pub fn to_field_set(v: &Value, shape: Shape<'_>) -> FieldSet {
    let mut out = FieldSet::new();
    walk_set(v, shape, &mut Vec::new(), &mut out);
    out
}

fn walk_set(v: &Value, shape: Shape<'_>, path: &mut Path, out: &mut FieldSet) {
    match v {
        Value::Object(m) => {
            if shape.map_atomic() {
                out.insert(path.clone());
                return;
            }
            for (k, cv) in m {
                path.push(format!("f:{k}"));
                walk_set(cv, shape.child(k, path.len() == 1), path, out);
                let empty = cv.is_null() || cv.as_object().is_some_and(Map::is_empty);
                if empty || !shape.declared(k) {
                    out.insert(path.clone());
                }
                path.pop();
            }
        }
        Value::Array(a) => {
            let kind = shape.list_kind(a.first());
            if kind == ListKind::Atomic {
                out.insert(path.clone());
                return;
            }
            for (i, item) in a.iter().enumerate() {
                path.push(item_pe(&kind, item, i));
                if !matches!(kind, ListKind::Set) {
                    walk_set(item, shape.items(), path, out);
                }
                out.insert(path.clone());
                path.pop();
            }
        }
        _ => {
            out.insert(path.clone());
        }
    }
}

/// Collects the nodes of `v` at `path` into `out` (see [`nodes_at`]).
fn walk_nodes<'v>(
    v: &'v Value,
    shape: Shape<'_>,
    path: &mut Path,
    out: &mut BTreeMap<Path, Option<&'v Value>>,
) {
    let leaf = match v {
        Value::Object(m) if !shape.map_atomic() => {
            out.insert(path.clone(), None);
            for (k, cv) in m {
                path.push(format!("f:{k}"));
                walk_nodes(cv, shape.child(k, path.len() == 1), path, out);
                path.pop();
            }
            false
        }
        Value::Array(a) => {
            let kind = shape.list_kind(a.first());
            if kind == ListKind::Atomic {
                true
            } else {
                out.insert(path.clone(), None);
                for (i, item) in a.iter().enumerate() {
                    path.push(item_pe(&kind, item, i));
                    if matches!(kind, ListKind::Set) {
                        out.insert(path.clone(), Some(item));
                    } else {
                        walk_nodes(item, shape.items(), path, out);
                    }
                    path.pop();
                }
                false
            }
        }
        _ => true,
    };
    if leaf {
        out.insert(path.clone(), Some(v));
    }
}

/// What changed between two versions of an object.
#[derive(Debug, Default, PartialEq)]
pub struct Comparison {
    /// Nodes present only in the new version.
    pub added: FieldSet,
    /// Leaves present in both with different values.
    pub modified: FieldSet,
    /// Nodes present only in the old version.
    pub removed: FieldSet,
}

/// Compares two versions of an object.
///
/// Walks both at once and skips every sub-object equal in the two, so a write costs what it
/// changed rather than the size of the object; where the two differ in shape (a list, a leaf
/// against a map) their nodes are listed and compared.
pub fn compare(old: &Value, new: &Value, shape: Shape<'_>) -> Comparison {
    let mut c = Comparison::default();
    diff(old, new, shape, &mut Vec::new(), &mut c);
    c
}

fn diff(a: &Value, b: &Value, shape: Shape<'_>, path: &mut Path, c: &mut Comparison) {
    if a == b {
        return;
    }
    match (a, b) {
        (Value::Object(am), Value::Object(bm)) if !shape.map_atomic() => {
            for (k, av) in am {
                path.push(format!("f:{k}"));
                let child = shape.child(k, path.len() == 1);
                match bm.get(k) {
                    Some(bv) => diff(av, bv, child, path, c),
                    None => c.removed.extend(nodes_at(av, child, path).into_keys()),
                }
                path.pop();
            }
            for (k, bv) in bm {
                if !am.contains_key(k) {
                    path.push(format!("f:{k}"));
                    let child = shape.child(k, path.len() == 1);
                    c.added.extend(nodes_at(bv, child, path).into_keys());
                    path.pop();
                }
            }
        }
        _ => {
            let na = nodes_at(a, shape, path);
            let nb = nodes_at(b, shape, path);
            for (p, bv) in &nb {
                match na.get(p) {
                    None => {
                        c.added.insert(p.clone());
                    }
                    Some(av) => {
                        if (av.is_some() || bv.is_some()) && av != bv {
                            c.modified.insert(p.clone());
                        }
                    }
                }
            }
            for p in na.keys() {
                if !nb.contains_key(p) {
                    c.removed.insert(p.clone());
                }
            }
        }
    }
}

/// Every node of the sub-object at `path` with its value when it is a leaf (scalar, atomic
/// list or map, set item), keyed by full paths.
fn nodes_at<'v>(v: &'v Value, shape: Shape<'_>, path: &Path) -> BTreeMap<Path, Option<&'v Value>> {
    let mut out = BTreeMap::new();
    walk_nodes(v, shape, &mut path.clone(), &mut out);
    out
}

/// Which part of the object a request may write (status separated from spec).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    /// Every field (kinds without a status subresource).
    Everything,
    /// Everything but `status` (main resource of a kind with a status subresource).
    NotStatus,
    /// Only `status` (the status subresource).
    StatusOnly,
}

/// Paths the server never tracks ownership of.
fn stripped(p: &Path) -> bool {
    let s = |i: usize| p.get(i).map(String::as_str);
    matches!(
        (s(0), s(1)),
        (None, _)
            | (Some("f:apiVersion" | "f:kind"), _)
            | (Some("f:metadata"), None)
            | (
                Some("f:metadata"),
                Some(
                    "f:name"
                        | "f:namespace"
                        | "f:creationTimestamp"
                        | "f:selfLink"
                        | "f:uid"
                        | "f:generation"
                        | "f:managedFields"
                        | "f:resourceVersion"
                        | "f:deletionTimestamp"
                        | "f:deletionGracePeriodSeconds",
                ),
            )
    )
}

fn filter(set: FieldSet, scope: Scope) -> FieldSet {
    set.into_iter()
        .filter(|p| !stripped(p))
        .filter(|p| {
            let status = p.first().map(String::as_str) == Some("f:status");
            match scope {
                Scope::Everything => true,
                Scope::NotStatus => !status,
                Scope::StatusOnly => status,
            }
        })
        .collect()
}

/// Identity of one managedFields entry.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct ManagerKey {
    /// Field manager name.
    pub manager: String,
    /// `Apply` or `Update`.
    pub operation: String,
    /// `status` or empty.
    pub subresource: String,
}

/// One managedFields entry, decoded.
#[derive(Debug, Clone, PartialEq)]
pub struct Entry {
    /// apiVersion of the entry.
    pub api_version: String,
    /// RFC 3339 time of the last change.
    pub time: String,
    /// Owned fields.
    pub set: FieldSet,
}

/// All managedFields entries of an object.
pub type Managers = BTreeMap<ManagerKey, Entry>;

/// Encodes a field set as fieldsV1.
pub fn encode_fields_v1(set: &FieldSet) -> Value {
    #[derive(Default)]
    struct Node {
        member: bool,
        children: BTreeMap<String, Node>,
    }
    let mut root = Node::default();
    for p in set {
        let mut n = &mut root;
        for pe in p {
            n = n.children.entry(pe.clone()).or_default();
        }
        n.member = true;
    }
    fn render(n: &Node) -> Value {
        let mut m = Map::new();
        if n.member && !n.children.is_empty() {
            m.insert(".".into(), json!({}));
        }
        for (k, c) in &n.children {
            m.insert(k.clone(), render(c));
        }
        Value::Object(m)
    }
    render(&root)
}

/// Decodes fieldsV1 into a field set.
pub fn decode_fields_v1(v: &Value) -> FieldSet {
    fn walk(v: &Value, path: &mut Path, out: &mut FieldSet) {
        let Some(m) = v.as_object() else { return };
        if m.is_empty() && !path.is_empty() {
            out.insert(path.clone());
        }
        for (k, c) in m {
            if k == "." {
                out.insert(path.clone());
                continue;
            }
            path.push(k.clone());
            walk(c, path, out);
            path.pop();
        }
    }
    let mut out = FieldSet::new();
    walk(v, &mut Vec::new(), &mut out);
    out
}

/// Decodes `metadata.managedFields`.
pub fn decode(list: &Value) -> Managers {
    let mut out = Managers::new();
    for e in list.as_array().into_iter().flatten() {
        let s = |k: &str| {
            e.get(k)
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_string()
        };
        let key = ManagerKey {
            manager: s("manager"),
            operation: s("operation"),
            subresource: s("subresource"),
        };
        let entry = Entry {
            api_version: s("apiVersion"),
            time: s("time"),
            set: e.get("fieldsV1").map(decode_fields_v1).unwrap_or_default(),
        };
        out.insert(key, entry);
    }
    out
}

/// Encodes managers as `metadata.managedFields` (Apply entries first, then by time).
pub fn encode(m: &Managers) -> Value {
    let mut entries: Vec<(&ManagerKey, &Entry)> =
        m.iter().filter(|(_, e)| !e.set.is_empty()).collect();
    entries.sort_by(|a, b| {
        (a.0.operation != "Apply", &a.1.time, a.0).cmp(&(b.0.operation != "Apply", &b.1.time, b.0))
    });
    Value::Array(
        entries
            .into_iter()
            .map(|(k, e)| {
                let mut o = json!({
                    "manager": k.manager,
                    "operation": k.operation,
                    "apiVersion": e.api_version,
                    "time": e.time,
                    "fieldsType": "FieldsV1",
                    "fieldsV1": encode_fields_v1(&e.set),
                });
                if !k.subresource.is_empty() {
                    o["subresource"] = json!(k.subresource);
                }
                o
            })
            .collect(),
    )
}

/// The managers to start from: the live object's, unless the request rewrote the list (`[{}]`
/// clears it, an empty list or none keeps the live one).
pub fn starting_managers(live: Option<&Value>, new: &Value) -> Managers {
    let live_mf = live.and_then(|l| l.pointer("/metadata/managedFields"));
    match new.pointer("/metadata/managedFields") {
        Some(Value::Array(a)) if a.len() == 1 && a[0].as_object().is_some_and(Map::is_empty) => {
            Managers::new()
        }
        Some(mf @ Value::Array(a)) if !a.is_empty() && Some(mf) != live_mf => decode(mf),
        _ => live_mf.map(decode).unwrap_or_default(),
    }
}

/// Formats a path as kube-apiserver prints it in conflicts (`.spec.containers[name="a"].image`).
pub fn path_string(p: &Path) -> String {
    let mut s = String::new();
    for pe in p {
        if let Some(f) = pe.strip_prefix("f:") {
            s.push('.');
            s.push_str(f);
        } else if let Some(k) = pe.strip_prefix("k:") {
            let parts: Vec<String> = serde_json::from_str::<Map<String, Value>>(k)
                .map(|m| m.iter().map(|(k, v)| format!("{k}={v}")).collect())
                .unwrap_or_default();
            s.push_str(&format!("[{}]", parts.join(",")));
        } else if let Some(v) = pe.strip_prefix("v:") {
            s.push_str(&format!("[={v}]"));
        } else if let Some(i) = pe.strip_prefix("i:") {
            s.push_str(&format!("[{i}]"));
        }
    }
    s
}

fn print_manager(k: &ManagerKey, e: &Entry) -> String {
    let mut s = format!("{:?}", k.manager);
    if !k.subresource.is_empty() {
        s = format!("{s} with subresource {:?}", k.subresource);
    }
    if k.operation == "Update" {
        if e.time.is_empty() {
            s = format!("{s} using {}", e.api_version);
        } else {
            s = format!("{s} using {} at {}", e.api_version, e.time);
        }
    }
    s
}

/// The 409 for apply conflicts, worded as kube-apiserver words it.
pub fn conflict_error(qualified: &str, name: &str, conflicts: &[(String, Path)]) -> ApiError {
    let message = if conflicts.len() == 1 {
        format!(
            "Apply failed with 1 conflict: conflict with {}: {}",
            conflicts[0].0,
            path_string(&conflicts[0].1)
        )
    } else {
        let mut by: BTreeMap<&str, Vec<&Path>> = BTreeMap::new();
        for (m, p) in conflicts {
            by.entry(m.as_str()).or_default().push(p);
        }
        let mut lines = Vec::new();
        for (m, ps) in by {
            lines.push(format!("conflicts with {m}:"));
            for p in ps {
                lines.push(format!("- {}", path_string(p)));
            }
        }
        format!(
            "Apply failed with {} conflicts: {}",
            conflicts.len(),
            lines.join("\n")
        )
    };
    let (resource, group) = qualified.split_once('.').unwrap_or((qualified, ""));
    let causes: Vec<Value> = conflicts
        .iter()
        .map(|(m, p)| json!({"reason": "FieldManagerConflict", "message": format!("conflict with {m}"), "field": path_string(p)}))
        .collect();
    let mut details = json!({"name": name, "kind": resource, "causes": causes});
    if !group.is_empty() {
        details["group"] = json!(group);
    }
    ApiError::Conflict { message, details }
}

/// Merges an apply configuration into the live object.
pub fn merge_apply(live: &Value, config: &Value, shape: Shape<'_>, depth: usize) -> Value {
    match (live, config) {
        (Value::Object(l), Value::Object(c)) if !shape.map_atomic() => {
            let mut out = l.clone();
            for (k, cv) in c {
                if cv.is_null() {
                    out.remove(k);
                } else {
                    let merged = merge_apply(
                        l.get(k).unwrap_or(&Value::Null),
                        cv,
                        shape.child(k, depth == 0),
                        depth + 1,
                    );
                    out.insert(k.clone(), merged);
                }
            }
            Value::Object(out)
        }
        (Value::Array(l), Value::Array(c)) => match shape.list_kind(c.first().or(l.first())) {
            ListKind::Atomic => config.clone(),
            ListKind::Set => {
                let mut out = l.clone();
                for i in c {
                    if !out.contains(i) {
                        out.push(i.clone());
                    }
                }
                Value::Array(out)
            }
            ListKind::Map(keys) => {
                let mut out = l.clone();
                for item in c {
                    let pe = key_pe(item, &keys);
                    match out.iter().position(|o| key_pe(o, &keys) == pe) {
                        Some(i) => out[i] = merge_apply(&out[i], item, shape.items(), depth + 1),
                        None => out.push(item.clone()),
                    }
                }
                Value::Array(out)
            }
        },
        _ => config.clone(),
    }
}

/// Removes the node at `path`; no-op when absent.
fn remove_path(v: &mut Value, path: &[Pe]) {
    let Some((first, rest)) = path.split_first() else {
        return;
    };
    let next: Option<&mut Value> = if let Some(f) = first.strip_prefix("f:") {
        let Some(m) = v.as_object_mut() else { return };
        if rest.is_empty() {
            m.remove(f);
            return;
        }
        m.get_mut(f)
    } else {
        let Some(a) = v.as_array_mut() else { return };
        let pos = if let Some(k) = first.strip_prefix("k:") {
            let want: Map<String, Value> = serde_json::from_str(k).unwrap_or_default();
            a.iter()
                .position(|item| want.iter().all(|(wk, wv)| item.get(wk) == Some(wv)))
        } else if let Some(val) = first.strip_prefix("v:") {
            let want: Value = serde_json::from_str(val).unwrap_or(Value::Null);
            a.iter().position(|item| *item == want)
        } else if let Some(i) = first.strip_prefix("i:") {
            i.parse::<usize>().ok().filter(|i| *i < a.len())
        } else {
            None
        };
        let Some(pos) = pos else { return };
        if rest.is_empty() {
            a.remove(pos);
            return;
        }
        a.get_mut(pos)
    };
    if let Some(n) = next {
        remove_path(n, rest);
    }
}

/// The set with, for each path, every ancestor that is a named field (a field the schema
/// declares on a struct, not a map entry or list item) as a member of its own: structured-merge-
/// diff's `EnsureNamedFieldsAreMembers`. An apply of `status.halt.gate.name` owns only that leaf,
/// but removal and the check for other owners are decided on this expanded set, so `halt` and
/// `halt.gate` go with it when nobody else owns anything below them.
pub fn with_named_parents(set: &FieldSet, shape: Shape<'_>) -> FieldSet {
    let mut out = set.clone();
    for p in set {
        let mut at = shape;
        for (i, pe) in p.iter().enumerate().take(p.len().saturating_sub(1)) {
            if let Some(f) = pe.strip_prefix("f:") {
                // The object root declares apiVersion, kind and metadata for every kind.
                let named =
                    at.declared(f) || (i == 0 && matches!(f, "apiVersion" | "kind" | "metadata"));
                if named {
                    out.insert(p[..=i].to_vec());
                }
                at = at.child(f, i == 0);
            } else {
                at = at.items();
            }
        }
    }
    out
}

/// What an apply removes from the merged object: the nodes the manager owned last time (named
/// parents included) that no manager owns now (its new configuration included, named parents
/// included), each with everything below it. System fields never go. Shallow paths come first;
/// removing a path below one already removed does nothing.
///
/// This is structured-merge-diff's prune (remove the last applied set, add back what any
/// manager owns, add back what the manager never owned) for sets made by applies, where every
/// ancestor of an owned leaf is a member, a named field or a list item.
fn pruned(last: &FieldSet, managers: &Managers, shape: Shape<'_>) -> Vec<Path> {
    let owned: FieldSet = managers
        .values()
        .flat_map(|e| e.set.iter().cloned())
        .collect();
    let owned = with_named_parents(&owned, shape);
    // A BTreeSet of paths iterates each ancestor before its descendants.
    with_named_parents(last, shape)
        .into_iter()
        .filter(|p| !stripped(p) && !owned.contains(p))
        .collect()
}

/// The parameters of one write, for ownership bookkeeping.
#[derive(Debug, Clone)]
pub struct Write<'a> {
    /// Field manager of the request.
    pub manager: &'a str,
    /// `status` for the status subresource, else empty.
    pub subresource: &'a str,
    /// apiVersion the request used.
    pub api_version: &'a str,
    /// Which fields the request may write.
    pub scope: Scope,
    /// RFC 3339 now.
    pub now: &'a str,
    /// `plural.group`, for error messages.
    pub qualified: &'a str,
    /// Object name, for error messages.
    pub name: &'a str,
}

/// Records a non-apply write (create/update/patch) in the managers: the writer takes every
/// field it added or changed, others lose those fields and any the write removed.
pub fn record_update(live: Option<&Value>, new: &mut Value, shape: Shape<'_>, w: &Write<'_>) {
    let mut managers = starting_managers(live, new);
    let empty = json!({});
    let cmp = compare(live.unwrap_or(&empty), new, shape);
    let mut changed = cmp.added;
    changed.extend(cmp.modified);
    let changed = filter(changed, w.scope);
    let removed = filter(cmp.removed, w.scope);
    let key = ManagerKey {
        manager: w.manager.to_string(),
        operation: "Update".into(),
        subresource: w.subresource.to_string(),
    };
    if !changed.is_empty() || !removed.is_empty() {
        for (k, e) in managers.iter_mut() {
            if *k != key {
                e.set
                    .retain(|p| !changed.contains(p) && !removed.contains(p));
            }
        }
    }
    let entry = managers.entry(key).or_insert_with(|| Entry {
        api_version: w.api_version.to_string(),
        time: w.now.to_string(),
        set: FieldSet::new(),
    });
    let mut ownership_changed = false;
    for p in &removed {
        ownership_changed |= entry.set.remove(p);
    }
    for p in changed {
        ownership_changed |= entry.set.insert(p);
    }
    if ownership_changed {
        entry.time = w.now.to_string();
        entry.api_version = w.api_version.to_string();
    }
    managers.retain(|_, e| !e.set.is_empty());
    new["metadata"]["managedFields"] = encode(&managers);
    if new["metadata"]["managedFields"]
        .as_array()
        .is_some_and(Vec::is_empty)
        && let Some(m) = new["metadata"].as_object_mut()
    {
        m.remove("managedFields");
    }
}

/// Server-side apply: merges `config` into `live`, checks ownership conflicts (unless `force`),
/// prunes fields this manager stopped applying, and returns the new object with its
/// managedFields. The caller restricts the result to the request's scope afterwards.
pub fn apply(
    live: Option<&Value>,
    config: &Value,
    shape: Shape<'_>,
    w: &Write<'_>,
    force: bool,
) -> Result<Value, ApiError> {
    let empty = json!({});
    let live_v = live.unwrap_or(&empty);
    let mut managers = live
        .and_then(|l| l.pointer("/metadata/managedFields"))
        .map(decode)
        .unwrap_or_default();
    let mut cfg = config.clone();
    if let Some(m) = cfg.get_mut("metadata").and_then(Value::as_object_mut) {
        m.remove("managedFields");
        m.remove("resourceVersion");
    }
    let mut merged = merge_apply(live_v, &cfg, shape, 0);
    let set = filter(to_field_set(&cfg, shape), w.scope);
    let key = ManagerKey {
        manager: w.manager.to_string(),
        operation: "Apply".into(),
        subresource: w.subresource.to_string(),
    };
    let last = managers
        .insert(
            key.clone(),
            Entry {
                api_version: w.api_version.to_string(),
                time: w.now.to_string(),
                set: set.clone(),
            },
        )
        .map(|e| e.set)
        .unwrap_or_default();

    // Prune before comparing, as structured-merge-diff does: what the pruning removes is a
    // removal in the comparison below, so other managers lose it too. A manager applying at
    // least what it applied last time (the common re-apply) has nothing to prune.
    if !last.is_subset(&set) {
        for p in pruned(&last, &managers, shape) {
            remove_path(&mut merged, &p);
        }
    }

    let cmp = compare(live_v, &merged, shape);
    let changed: FieldSet = filter(cmp.added.union(&cmp.modified).cloned().collect(), w.scope);
    let mut conflicts: Vec<(String, Path)> = Vec::new();
    for (k, e) in &managers {
        if *k == key {
            continue;
        }
        for p in e.set.intersection(&changed) {
            conflicts.push((print_manager(k, e), p.clone()));
        }
    }
    if !conflicts.is_empty() && !force {
        return Err(conflict_error(w.qualified, w.name, &conflicts));
    }
    let removed = filter(cmp.removed, w.scope);
    for (k, e) in managers.iter_mut() {
        if *k != key {
            e.set = e
                .set
                .difference(&changed)
                .cloned()
                .collect::<FieldSet>()
                .difference(&removed)
                .cloned()
                .collect();
        }
    }
    managers.retain(|_, e| !e.set.is_empty());
    if !merged.get("metadata").is_some_and(Value::is_object) {
        merged["metadata"] = json!({});
    }
    merged["metadata"]["managedFields"] = encode(&managers);
    Ok(merged)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn w<'a>(manager: &'a str) -> Write<'a> {
        Write {
            manager,
            subresource: "",
            api_version: "x.io/v1",
            scope: Scope::NotStatus,
            now: "2026-01-01T00:00:00Z",
            qualified: "things.x.io",
            name: "t",
        }
    }

    fn schema() -> Value {
        json!({"type": "object", "properties": {
            "spec": {"type": "object", "properties": {
                "replicas": {"type": "integer"},
                "hosts": {"type": "array", "items": {"type": "string"}},
                "tags": {"type": "array", "x-kubernetes-list-type": "set", "items": {"type": "string"}},
                "rules": {"type": "array", "x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"],
                    "items": {"type": "object", "properties": {"name": {"type": "string"}, "weight": {"type": "integer"}}}}
            }},
            "status": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}
        }})
    }

    #[test]
    fn field_sets_follow_list_types() {
        let s = schema();
        let obj = json!({"apiVersion": "x.io/v1", "kind": "T", "metadata": {"name": "t", "labels": {"a": "b"}},
            "spec": {"replicas": 1, "hosts": ["h"], "tags": ["x"], "rules": [{"name": "r", "weight": 5}]}});
        let enc = encode_fields_v1(&filter(
            to_field_set(&obj, Shape::root(Some(&s))),
            Scope::NotStatus,
        ));
        assert_eq!(
            enc,
            json!({"f:metadata": {"f:labels": {"f:a": {}}}, "f:spec": {
                "f:hosts": {}, "f:replicas": {}, "f:tags": {"v:\"x\"": {}},
                "f:rules": {"k:{\"name\":\"r\"}": {".": {}, "f:name": {}, "f:weight": {}}}}})
        );
        assert_eq!(
            decode_fields_v1(&enc),
            filter(to_field_set(&obj, Shape::root(Some(&s))), Scope::NotStatus)
        );
    }

    #[test]
    fn apply_conflicts_force_and_prune() {
        let s = schema();
        let shape = Shape::root(Some(&s));
        let a = apply(
            None,
            &json!({"metadata": {"name": "t"}, "spec": {"replicas": 1, "hosts": ["a", "b"]}}),
            shape,
            &w("a"),
            false,
        )
        .unwrap();
        // Same value from another manager: shared, no conflict.
        let b = apply(
            Some(&a),
            &json!({"metadata": {"name": "t"}, "spec": {"replicas": 1}}),
            shape,
            &w("b"),
            false,
        )
        .unwrap();
        // Different value on an atomic list owned by a: conflict naming a and the path.
        let err = apply(
            Some(&b),
            &json!({"metadata": {"name": "t"}, "spec": {"hosts": ["c"]}}),
            shape,
            &w("b"),
            false,
        )
        .unwrap_err();
        assert_eq!(err.code(), 409);
        assert_eq!(
            err.to_string(),
            "Apply failed with 1 conflict: conflict with \"a\": .spec.hosts"
        );
        // Force takes it over; a no longer owns hosts.
        let forced = apply(
            Some(&b),
            &json!({"metadata": {"name": "t"}, "spec": {"replicas": 1, "hosts": ["c"]}}),
            shape,
            &w("b"),
            true,
        )
        .unwrap();
        assert_eq!(forced["spec"]["hosts"], json!(["c"]));
        let m = decode(&forced["metadata"]["managedFields"]);
        let a_key = ManagerKey {
            manager: "a".into(),
            operation: "Apply".into(),
            subresource: "".into(),
        };
        assert!(
            !m[&a_key]
                .set
                .contains(&vec!["f:spec".to_string(), "f:hosts".to_string()])
        );
        // a stops applying replicas: still owned by b, so it stays.
        let pruned = apply(
            Some(&forced),
            &json!({"metadata": {"name": "t"}, "spec": {}}),
            shape,
            &w("a"),
            false,
        )
        .unwrap();
        assert_eq!(pruned["spec"]["replicas"], 1);
        // b stops applying replicas too: now removed.
        let gone = apply(
            Some(&pruned),
            &json!({"metadata": {"name": "t"}, "spec": {"hosts": ["c"]}}),
            shape,
            &w("b"),
            false,
        )
        .unwrap();
        assert_eq!(gone["spec"].get("replicas"), None);
    }

    #[test]
    fn map_lists_merge_by_key_and_conflict_per_item() {
        let s = schema();
        let shape = Shape::root(Some(&s));
        let a = apply(
            None,
            &json!({"spec": {"rules": [{"name": "x", "weight": 1}]}}),
            shape,
            &w("a"),
            false,
        )
        .unwrap();
        let b = apply(
            Some(&a),
            &json!({"spec": {"rules": [{"name": "y", "weight": 2}]}}),
            shape,
            &w("b"),
            false,
        )
        .unwrap();
        assert_eq!(b["spec"]["rules"].as_array().unwrap().len(), 2);
        let err = apply(
            Some(&b),
            &json!({"spec": {"rules": [{"name": "x", "weight": 9}]}}),
            shape,
            &w("b"),
            false,
        )
        .unwrap_err();
        assert_eq!(
            err.to_string(),
            "Apply failed with 1 conflict: conflict with \"a\": .spec.rules[name=\"x\"].weight"
        );
    }

    #[test]
    fn updates_take_ownership_and_client_lists_are_honoured() {
        let s = schema();
        let shape = Shape::root(Some(&s));
        let a = apply(
            None,
            &json!({"spec": {"replicas": 1}}),
            shape,
            &w("a"),
            false,
        )
        .unwrap();
        let mut upd = a.clone();
        upd["spec"]["replicas"] = json!(3);
        record_update(Some(&a), &mut upd, shape, &w("ctl"));
        let m = decode(&upd["metadata"]["managedFields"]);
        assert_eq!(m.len(), 1, "a lost its only field: {m:?}");
        let (k, _) = m.iter().next().unwrap();
        assert_eq!(
            (k.manager.as_str(), k.operation.as_str()),
            ("ctl", "Update")
        );
        // The conflict message for an Update manager names its apiVersion and time.
        let err = apply(
            Some(&upd),
            &json!({"spec": {"replicas": 5}}),
            shape,
            &w("a"),
            false,
        )
        .unwrap_err();
        assert_eq!(
            err.to_string(),
            "Apply failed with 1 conflict: conflict with \"ctl\" using x.io/v1 at 2026-01-01T00:00:00Z: .spec.replicas"
        );
        // [{}] clears; [] is ignored.
        let mut cleared = upd.clone();
        cleared["metadata"]["managedFields"] = json!([{}]);
        assert!(starting_managers(Some(&upd), &cleared).is_empty());
        let mut ignored = upd.clone();
        ignored["metadata"]["managedFields"] = json!([]);
        assert_eq!(starting_managers(Some(&upd), &ignored).len(), 1);
    }

    fn nested_schema() -> Value {
        let gate = json!({"type": "object", "required": ["name", "reason"], "properties": {
            "name": {"type": "string"}, "reason": {"type": "string"}}});
        json!({"type": "object", "properties": {
            "spec": {"type": "object", "properties": {
                "replicas": {"type": "integer"},
                "hold": {"type": "object", "properties": {"gate": gate, "note": {"type": "string"}}},
                "selectors": {"type": "object", "additionalProperties": {
                    "type": "object", "properties": {"match": {"type": "string"}}}},
                "rules": {"type": "array", "x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"],
                    "items": {"type": "object", "properties": {"name": {"type": "string"},
                        "limits": {"type": "object", "properties": {"max": {"type": "integer"}}}}}}
            }},
            "status": {"type": "object", "properties": {"halt": {"type": "object", "properties": {"gate": gate}}}}
        }})
    }

    fn paths(ps: &[&[&str]]) -> FieldSet {
        ps.iter()
            .map(|p| p.iter().map(|s| s.to_string()).collect())
            .collect()
    }

    #[test]
    fn named_parents_are_struct_fields_only() {
        let s = nested_schema();
        let cases: [(&str, Shape<'_>, FieldSet, FieldSet); 4] = [
            (
                "nested struct fields",
                Shape::root(Some(&s)),
                paths(&[&["f:spec", "f:hold", "f:gate", "f:name"]]),
                paths(&[
                    &["f:spec"],
                    &["f:spec", "f:hold"],
                    &["f:spec", "f:hold", "f:gate"],
                    &["f:spec", "f:hold", "f:gate", "f:name"],
                ]),
            ),
            (
                "a map entry is not a named field, its declared fields are",
                Shape::root(Some(&s)),
                paths(&[&["f:spec", "f:selectors", "f:x", "f:match"]]),
                paths(&[
                    &["f:spec"],
                    &["f:spec", "f:selectors"],
                    &["f:spec", "f:selectors", "f:x", "f:match"],
                ]),
            ),
            (
                "a list item is not a named field, fields inside it are",
                Shape::root(Some(&s)),
                paths(&[&[
                    "f:spec",
                    "f:rules",
                    "k:{\"name\":\"r\"}",
                    "f:limits",
                    "f:max",
                ]]),
                paths(&[
                    &["f:spec"],
                    &["f:spec", "f:rules"],
                    &["f:spec", "f:rules", "k:{\"name\":\"r\"}", "f:limits"],
                    &[
                        "f:spec",
                        "f:rules",
                        "k:{\"name\":\"r\"}",
                        "f:limits",
                        "f:max",
                    ],
                ]),
            ),
            (
                "built-in labels are a map",
                Shape::root(None),
                paths(&[&["f:metadata", "f:labels", "f:a"]]),
                paths(&[
                    &["f:metadata"],
                    &["f:metadata", "f:labels"],
                    &["f:metadata", "f:labels", "f:a"],
                ]),
            ),
        ];
        for (name, shape, set, want) in cases {
            assert_eq!(with_named_parents(&set, shape), want, "{name}");
        }
    }

    /// One apply of `spec` (left out when `Null`) by a manager.
    fn apply_spec(live: Option<&Value>, manager: &str, spec: Value, schema: &Value) -> Value {
        let mut cfg = json!({"metadata": {"name": "t"}});
        if !spec.is_null() {
            cfg["spec"] = spec;
        }
        apply(live, &cfg, Shape::root(Some(schema)), &w(manager), false)
            .unwrap_or_else(|e| panic!("apply by {manager}: {e}"))
    }

    #[test]
    fn an_apply_removes_what_its_manager_alone_owned_whole() {
        let s = nested_schema();
        let gate = json!({"name": "error-rate", "reason": "Breached"});
        // (case, earlier applies in order, the last apply by "a", the spec it leaves)
        type Case<'a> = (&'a str, Vec<(&'a str, Value)>, Value, Value);
        let cases: Vec<Case<'_>> = vec![
            (
                "a sub-object left out goes with its parents",
                vec![(
                    "a",
                    json!({"replicas": 1, "hold": {"gate": gate, "note": "n"}}),
                )],
                json!({"replicas": 1}),
                json!({"replicas": 1}),
            ),
            (
                "a leaf another applier owns keeps its parents, the rest goes",
                vec![
                    (
                        "a",
                        json!({"replicas": 1, "hold": {"gate": gate, "note": "n"}}),
                    ),
                    ("b", json!({"hold": {"gate": {"name": "error-rate"}}})),
                ],
                json!({"replicas": 1}),
                json!({"replicas": 1, "hold": {"gate": {"name": "error-rate"}}}),
            ),
            (
                "an emptied object still applied stays, empty",
                vec![("a", json!({"hold": {"gate": gate}}))],
                json!({"hold": {}}),
                json!({"hold": {}}),
            ),
            (
                "a map entry left out goes whole",
                vec![(
                    "a",
                    json!({"selectors": {"x": {"match": "1"}, "y": {"match": "2"}}}),
                )],
                json!({"selectors": {"y": {"match": "2"}}}),
                json!({"selectors": {"y": {"match": "2"}}}),
            ),
            (
                "a sub-object of a kept list item goes",
                vec![("a", json!({"rules": [{"name": "r", "limits": {"max": 3}}]}))],
                json!({"rules": [{"name": "r"}]}),
                json!({"rules": [{"name": "r"}]}),
            ),
            (
                "a list item left out goes whole",
                vec![(
                    "a",
                    json!({"rules": [{"name": "r", "limits": {"max": 3}}, {"name": "q"}]}),
                )],
                json!({"rules": [{"name": "q"}]}),
                json!({"rules": [{"name": "q"}]}),
            ),
            (
                "another applier's list item stays",
                vec![
                    ("a", json!({"rules": [{"name": "r", "limits": {"max": 3}}]})),
                    ("b", json!({"rules": [{"name": "q"}]})),
                ],
                json!({"replicas": 2}),
                json!({"replicas": 2, "rules": [{"name": "q"}]}),
            ),
        ];
        for (name, earlier, last, want) in cases {
            let mut obj: Option<Value> = None;
            for (m, spec) in earlier {
                obj = Some(apply_spec(obj.as_ref(), m, spec, &s));
            }
            let out = apply_spec(obj.as_ref(), "a", last, &s);
            assert_eq!(out["spec"], want, "{name}");
        }
    }

    #[test]
    fn leaving_out_everything_removes_the_root_field_but_never_metadata() {
        let s = nested_schema();
        let one = apply_spec(None, "a", json!({"replicas": 1}), &s);
        let none = apply_spec(Some(&one), "a", Value::Null, &s);
        assert_eq!(none.get("spec"), None, "{none}");
        assert_eq!(none["metadata"]["name"], "t");
        let labelled = apply(
            Some(&none),
            &json!({"metadata": {"name": "t", "labels": {"x": "1"}}}),
            Shape::root(Some(&s)),
            &w("a"),
            false,
        )
        .unwrap();
        let unlabelled = apply(
            Some(&labelled),
            &json!({"metadata": {"name": "t"}}),
            Shape::root(Some(&s)),
            &w("a"),
            false,
        )
        .unwrap();
        assert_eq!(unlabelled["metadata"].get("labels"), None, "{unlabelled}");
        assert_eq!(unlabelled["metadata"]["name"], "t");
    }

    #[test]
    fn a_status_apply_keeps_the_parents_of_a_leaf_an_update_manager_owns() {
        let s = nested_schema();
        let shape = Shape::root(Some(&s));
        let status_w = Write {
            subresource: "status",
            scope: Scope::StatusOnly,
            ..w("op")
        };
        let halted = apply(
            None,
            &json!({"metadata": {"name": "t"}, "status": {"halt": {"gate": {"name": "g", "reason": "r"}}}}),
            shape,
            &status_w,
            false,
        )
        .unwrap();
        // Another writer changes the gate's reason by an update: it owns that leaf now.
        let mut edited = halted.clone();
        edited["status"]["halt"]["gate"]["reason"] = json!("edited");
        record_update(
            Some(&halted),
            &mut edited,
            shape,
            &Write {
                subresource: "status",
                scope: Scope::StatusOnly,
                ..w("editor")
            },
        );
        // op stops applying halt: reason is the editor's, so halt and gate stay with it alone.
        let out = apply(
            Some(&edited),
            &json!({"metadata": {"name": "t"}, "status": {}}),
            shape,
            &status_w,
            false,
        )
        .unwrap();
        assert_eq!(
            out["status"],
            json!({"halt": {"gate": {"reason": "edited"}}})
        );
        let m = decode(&out["metadata"]["managedFields"]);
        let op = &m[&ManagerKey {
            manager: "op".into(),
            operation: "Apply".into(),
            subresource: "status".into(),
        }];
        assert_eq!(op.set, paths(&[&["f:status"]]));
    }

    #[test]
    fn a_list_item_only_the_applier_owned_goes_with_an_update_managers_leaf() {
        // structured-merge-diff keeps named parents of another manager's fields, not list
        // items: an item whose key only the applier owned goes whole, and the update manager
        // loses the leaf it had inside.
        let s = nested_schema();
        let shape = Shape::root(Some(&s));
        let a = apply_spec(
            None,
            "a",
            json!({"rules": [{"name": "r", "limits": {"max": 3}}]}),
            &s,
        );
        let mut edited = a.clone();
        edited["spec"]["rules"][0]["limits"]["max"] = json!(4);
        record_update(Some(&a), &mut edited, shape, &w("editor"));
        let out = apply_spec(Some(&edited), "a", json!({"replicas": 1}), &s);
        // `rules` is a named parent of the editor's leaf when pruning is decided, so the list
        // stays, emptied (structured-merge-diff keeps an emptied list as `[]`).
        assert_eq!(out["spec"], json!({"replicas": 1, "rules": []}));
        let m = decode(&out["metadata"]["managedFields"]);
        assert!(
            m.keys().all(|k| k.manager != "editor"),
            "the editor owned only the removed leaf: {m:?}"
        );
    }

    #[test]
    fn builtin_shapes() {
        let pod = json!({"metadata": {"finalizers": ["a"]}, "spec": {"containers": [{"name": "c", "image": "i", "ports": [{"containerPort": 80, "protocol": "TCP"}]}]}});
        let set = filter(to_field_set(&pod, Shape::root(None)), Scope::Everything);
        let enc = encode_fields_v1(&set);
        assert_eq!(
            enc,
            json!({"f:metadata": {"f:finalizers": {"v:\"a\"": {}}}, "f:spec": {"f:containers": {"k:{\"name\":\"c\"}": {
                ".": {}, "f:image": {}, "f:name": {},
                "f:ports": {"k:{\"containerPort\":80,\"protocol\":\"TCP\"}": {".": {}, "f:containerPort": {}, "f:protocol": {}}}}}}})
        );
    }

    /// The comparison by listing every node of both versions, which [`compare`] must agree
    /// with while skipping what is equal.
    fn compare_by_nodes(old: &Value, new: &Value, shape: Shape<'_>) -> Comparison {
        let root = Path::new();
        let (a, b) = (nodes_at(old, shape, &root), nodes_at(new, shape, &root));
        let mut c = Comparison::default();
        for (p, bv) in &b {
            match a.get(p) {
                None => {
                    c.added.insert(p.clone());
                }
                Some(av) if (av.is_some() || bv.is_some()) && av != bv => {
                    c.modified.insert(p.clone());
                }
                Some(_) => {}
            }
        }
        c.removed = a.keys().filter(|p| !b.contains_key(*p)).cloned().collect();
        c
    }

    #[test]
    fn comparing_skips_equal_parts_and_finds_every_change() {
        let schema = schema();
        let crd = Shape::root(Some(&schema));
        let pod = json!({
            "metadata": {"name": "p", "labels": {"app": "a"}, "finalizers": ["x"],
                         "managedFields": [{"manager": "m", "operation": "Update"}]},
            "spec": {"containers": [{"name": "app", "image": "a:1", "ports": [{"containerPort": 80}]}]},
            "status": {"phase": "Pending", "conditions": [{"type": "Ready", "status": "False"}]}
        });
        let mut ready = pod.clone();
        ready["status"]["phase"] = json!("Running");
        ready["status"]["conditions"] =
            json!([{"type": "Ready", "status": "True"}, {"type": "Initialized", "status": "True"}]);
        ready["metadata"]["labels"]["rev"] = json!("1-28");
        ready["metadata"]["labels"]
            .as_object_mut()
            .unwrap()
            .remove("app");
        ready["metadata"]["finalizers"] = json!(["y"]);
        ready["spec"]["containers"][0]["image"] = json!("a:2");
        let mut reshaped = pod.clone();
        reshaped["spec"]["containers"] = json!("not a list");
        reshaped["status"] = json!(null);
        let thing = json!({"spec": {"replicas": 1, "hosts": ["a"], "tags": ["x", "y"],
                                    "rules": [{"name": "r", "weight": 1}]}});
        let mut thing2 = thing.clone();
        thing2["spec"]["hosts"] = json!(["a", "b"]);
        thing2["spec"]["tags"] = json!(["y", "z"]);
        thing2["spec"]["rules"] = json!([{"name": "r", "weight": 2}, {"name": "s"}]);
        thing2["spec"]["extra"] = json!({"deep": {"x": 1}});
        let builtin = Shape::root(None);
        for (old, new, shape) in [
            (&pod, &ready, builtin),
            (&ready, &pod, builtin),
            (&pod, &reshaped, builtin),
            (&reshaped, &pod, builtin),
            (&json!({}), &pod, builtin),
            (&pod, &json!({}), builtin),
            (&pod, &pod, builtin),
            (&thing, &thing2, crd),
            (&thing2, &thing, crd),
        ] {
            let fast = compare(old, new, shape);
            assert_eq!(fast, compare_by_nodes(old, new, shape), "{old} -> {new}");
        }
        let c = compare(&pod, &ready, builtin);
        assert!(
            c.modified
                .contains(&vec!["f:status".into(), "f:phase".into()])
        );
        assert!(c.removed.contains(&vec![
            "f:metadata".into(),
            "f:labels".into(),
            "f:app".into()
        ]));
        assert!(c.added.contains(&vec![
            "f:metadata".into(),
            "f:labels".into(),
            "f:rev".into()
        ]));
        assert_eq!(compare(&pod, &pod, builtin), Comparison::default());
    }
}
