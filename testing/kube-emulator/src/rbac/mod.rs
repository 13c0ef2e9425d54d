//! RBAC authorization: Roles, ClusterRoles (with aggregation), RoleBindings and
//! ClusterRoleBindings decide whether a user may perform a request, with kube-apiserver's
//! semantics and its 403 wording.
//!
//! Owns: the decision and the Forbidden `Status`. Must never: do I/O, or allow anything a binding
//! does not grant (apart from the `system:masters` group, which the real apiserver also lets
//! through before RBAC is consulted).

use std::collections::BTreeMap;

use serde_json::{Value, json};

/// What a request wants to do, as the apiserver's authorizer sees it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Attributes {
    /// The user name (`system:serviceaccount:<ns>:<name>` for a service account).
    pub user: String,
    /// The user's groups as authenticated; the implicit groups (`system:authenticated`, and
    /// `system:serviceaccounts`, `system:serviceaccounts:<ns>` for service accounts) are added
    /// by the authorizer.
    pub groups: Vec<String>,
    /// The API verb: get, list, watch, create, update, patch, delete, deletecollection, ...
    pub verb: String,
    /// The API group (`""` for core).
    pub api_group: String,
    /// The resource (plural, lower case). Empty for a non-resource request.
    pub resource: String,
    /// The subresource (`status`, `eviction`, ...) or empty.
    pub subresource: String,
    /// The namespace, empty for cluster-scoped requests.
    pub namespace: String,
    /// The object name, empty for list/watch/create-without-name.
    pub name: String,
    /// The URL path of a non-resource request (`/apis`, `/version`); empty otherwise.
    pub path: String,
}

impl Attributes {
    fn is_resource_request(&self) -> bool {
        !self.resource.is_empty() || self.path.is_empty()
    }

    /// The groups the authorizer matches subjects against: the given ones plus the implicit ones.
    fn effective_groups(&self) -> Vec<String> {
        let mut groups = self.groups.clone();
        let mut add = |g: String| {
            if !groups.contains(&g) {
                groups.push(g);
            }
        };
        if let Some(rest) = self.user.strip_prefix("system:serviceaccount:")
            && let Some((ns, _)) = rest.split_once(':')
        {
            add("system:serviceaccounts".to_owned());
            add(format!("system:serviceaccounts:{ns}"));
        }
        if self.user == "system:anonymous" {
            add("system:unauthenticated".to_owned());
        } else {
            add("system:authenticated".to_owned());
        }
        groups
    }
}

/// The authorizer's answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// Allowed, with the reason the apiserver would log (`RBAC: allowed by ...`).
    Allow(String),
    /// Denied: no binding grants the request.
    Deny(String),
}

impl Decision {
    /// Whether the request may proceed.
    pub fn is_allowed(&self) -> bool {
        matches!(self, Decision::Allow(_))
    }
}

/// Why an RBAC object cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error, strum::IntoStaticStr)]
pub enum RbacError {
    /// The object is not an RBAC object this authorizer knows.
    #[error(
        "{kind} is not an RBAC kind (want Role, ClusterRole, RoleBinding or ClusterRoleBinding)"
    )]
    UnknownKind {
        /// The kind given.
        kind: String,
    },
    /// The object lacks a required field.
    #[error("{kind} {name:?} is missing {field}; add it and apply again")]
    Missing {
        /// The kind.
        kind: String,
        /// The object's name.
        name: String,
        /// The missing field path.
        field: &'static str,
    },
}

impl RbacError {
    /// A bounded label for metrics and logs.
    pub fn category(&self) -> &'static str {
        self.into()
    }
}

#[derive(Debug, Clone, Default)]
struct PolicyRule {
    verbs: Vec<String>,
    api_groups: Vec<String>,
    resources: Vec<String>,
    resource_names: Vec<String>,
    non_resource_urls: Vec<String>,
}

#[derive(Debug, Clone, Default)]
struct Role {
    labels: BTreeMap<String, String>,
    rules: Vec<PolicyRule>,
    aggregation: Option<Vec<Value>>,
}

#[derive(Debug, Clone)]
struct Subject {
    kind: String,
    name: String,
    namespace: String,
}

#[derive(Debug, Clone)]
struct Binding {
    role_kind: String,
    role_name: String,
    subjects: Vec<Subject>,
}

/// Key of a namespaced object: (namespace, name); cluster objects use an empty namespace.
type ObjKey = (String, String);

/// An RBAC authorizer over a set of RBAC objects, updated incrementally.
#[derive(Debug, Default, Clone)]
pub struct Authorizer {
    roles: BTreeMap<ObjKey, Role>,
    cluster_roles: BTreeMap<String, Role>,
    role_bindings: BTreeMap<ObjKey, Binding>,
    cluster_role_bindings: BTreeMap<String, Binding>,
}

fn strings(v: Option<&Value>) -> Vec<String> {
    v.and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(Value::as_str)
                .map(str::to_owned)
                .collect()
        })
        .unwrap_or_default()
}

fn str_at<'a>(v: &'a Value, pointer: &str) -> &'a str {
    v.pointer(pointer).and_then(Value::as_str).unwrap_or("")
}

fn parse_role(obj: &Value) -> Role {
    let rules = obj
        .get("rules")
        .and_then(Value::as_array)
        .map(|rs| {
            rs.iter()
                .map(|r| PolicyRule {
                    verbs: strings(r.get("verbs")),
                    api_groups: strings(r.get("apiGroups")),
                    resources: strings(r.get("resources")),
                    resource_names: strings(r.get("resourceNames")),
                    non_resource_urls: strings(r.get("nonResourceURLs")),
                })
                .collect()
        })
        .unwrap_or_default();
    let labels = obj
        .pointer("/metadata/labels")
        .and_then(Value::as_object)
        .map(|m| {
            m.iter()
                .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_owned())))
                .collect()
        })
        .unwrap_or_default();
    let aggregation = obj
        .pointer("/aggregationRule/clusterRoleSelectors")
        .and_then(Value::as_array)
        .cloned();
    Role {
        labels,
        rules,
        aggregation,
    }
}

fn parse_binding(obj: &Value, kind: &str, name: &str) -> Result<Binding, RbacError> {
    let role_name = str_at(obj, "/roleRef/name");
    let role_kind = str_at(obj, "/roleRef/kind");
    if role_name.is_empty() || role_kind.is_empty() {
        return Err(RbacError::Missing {
            kind: kind.to_owned(),
            name: name.to_owned(),
            field: "roleRef.kind/roleRef.name",
        });
    }
    let subjects = obj
        .get("subjects")
        .and_then(Value::as_array)
        .map(|ss| {
            ss.iter()
                .map(|s| Subject {
                    kind: str_at(s, "/kind").to_owned(),
                    name: str_at(s, "/name").to_owned(),
                    namespace: str_at(s, "/namespace").to_owned(),
                })
                .collect()
        })
        .unwrap_or_default();
    Ok(Binding {
        role_kind: role_kind.to_owned(),
        role_name: role_name.to_owned(),
        subjects,
    })
}

/// Whether a label selector (`matchLabels`, `matchExpressions`) selects `labels`.
pub(crate) fn selector_matches(selector: &Value, labels: &BTreeMap<String, String>) -> bool {
    if let Some(ml) = selector.get("matchLabels").and_then(Value::as_object) {
        for (k, v) in ml {
            if labels.get(k).map(String::as_str) != v.as_str() {
                return false;
            }
        }
    }
    if let Some(exprs) = selector.get("matchExpressions").and_then(Value::as_array) {
        for e in exprs {
            let key = str_at(e, "/key");
            let values = strings(e.get("values"));
            let have = labels.get(key);
            let ok = match str_at(e, "/operator") {
                "In" => have.is_some_and(|h| values.contains(h)),
                "NotIn" => have.is_none_or(|h| !values.contains(h)),
                "Exists" => have.is_some(),
                "DoesNotExist" => have.is_none(),
                _ => false,
            };
            if !ok {
                return false;
            }
        }
    }
    true
}

fn rule_matches(rule: &PolicyRule, a: &Attributes) -> bool {
    let verb_ok = rule.verbs.iter().any(|v| v == "*" || *v == a.verb);
    if !verb_ok {
        return false;
    }
    if !a.is_resource_request() {
        return rule.non_resource_urls.iter().any(|u| {
            u == "*"
                || *u == a.path
                || u.strip_suffix('*')
                    .is_some_and(|prefix| a.path.starts_with(prefix))
        });
    }
    if !rule
        .api_groups
        .iter()
        .any(|g| g == "*" || *g == a.api_group)
    {
        return false;
    }
    let combined = if a.subresource.is_empty() {
        a.resource.clone()
    } else {
        format!("{}/{}", a.resource, a.subresource)
    };
    let resource_ok = rule.resources.iter().any(|r| {
        r == "*"
            || *r == combined
            || (!a.subresource.is_empty()
                && (*r == format!("*/{}", a.subresource) || *r == format!("{}/*", a.resource)))
    });
    if !resource_ok {
        return false;
    }
    rule.resource_names.is_empty() || (!a.name.is_empty() && rule.resource_names.contains(&a.name))
}

impl Authorizer {
    /// Builds an authorizer from RBAC objects as JSON (`rbac.authorization.k8s.io/v1`). Objects
    /// that cannot be used (a binding without `roleRef`) grant nothing.
    pub fn new(
        roles: &[Value],
        cluster_roles: &[Value],
        role_bindings: &[Value],
        cluster_role_bindings: &[Value],
    ) -> Authorizer {
        let mut a = Authorizer::default();
        for (kind, objs) in [
            ("Role", roles),
            ("ClusterRole", cluster_roles),
            ("RoleBinding", role_bindings),
            ("ClusterRoleBinding", cluster_role_bindings),
        ] {
            for obj in objs {
                // A malformed object grants nothing; the API layer validates on write.
                let _ = a.upsert_kind(kind, obj);
            }
        }
        a
    }

    /// Adds or replaces an RBAC object, dispatching on its `kind`.
    pub fn upsert(&mut self, obj: &Value) -> Result<(), RbacError> {
        let kind = obj
            .get("kind")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_owned();
        self.upsert_kind(&kind, obj)
    }

    fn upsert_kind(&mut self, kind: &str, obj: &Value) -> Result<(), RbacError> {
        let name = str_at(obj, "/metadata/name").to_owned();
        let ns = str_at(obj, "/metadata/namespace").to_owned();
        match kind {
            "Role" => {
                self.roles.insert((ns, name), parse_role(obj));
            }
            "ClusterRole" => {
                self.cluster_roles.insert(name, parse_role(obj));
            }
            "RoleBinding" => {
                let b = parse_binding(obj, kind, &name)?;
                self.role_bindings.insert((ns, name), b);
            }
            "ClusterRoleBinding" => {
                let b = parse_binding(obj, kind, &name)?;
                self.cluster_role_bindings.insert(name, b);
            }
            other => {
                return Err(RbacError::UnknownKind {
                    kind: other.to_owned(),
                });
            }
        }
        Ok(())
    }

    /// Removes an RBAC object by kind, namespace (empty for cluster objects) and name.
    pub fn remove(&mut self, kind: &str, namespace: &str, name: &str) {
        let key = (namespace.to_owned(), name.to_owned());
        match kind {
            "Role" => {
                self.roles.remove(&key);
            }
            "ClusterRole" => {
                self.cluster_roles.remove(name);
            }
            "RoleBinding" => {
                self.role_bindings.remove(&key);
            }
            "ClusterRoleBinding" => {
                self.cluster_role_bindings.remove(name);
            }
            _ => {}
        }
    }

    /// The rules of a ClusterRole, with aggregated roles' rules included.
    fn cluster_role_rules(&self, name: &str) -> Vec<&PolicyRule> {
        let Some(role) = self.cluster_roles.get(name) else {
            return Vec::new();
        };
        let mut rules: Vec<&PolicyRule> = role.rules.iter().collect();
        if let Some(selectors) = &role.aggregation {
            for (other_name, other) in &self.cluster_roles {
                if other_name != name
                    && selectors.iter().any(|s| selector_matches(s, &other.labels))
                {
                    rules.extend(other.rules.iter());
                }
            }
        }
        rules
    }

    fn subject_matches(s: &Subject, user: &str, groups: &[String], binding_ns: &str) -> bool {
        match s.kind.as_str() {
            "User" => s.name == user,
            "Group" => groups.contains(&s.name),
            "ServiceAccount" => {
                let ns = if s.namespace.is_empty() {
                    binding_ns
                } else {
                    s.namespace.as_str()
                };
                user == format!("system:serviceaccount:{ns}:{}", s.name)
            }
            _ => false,
        }
    }

    /// Decides a request with RBAC semantics: ClusterRoleBindings grant everywhere, RoleBindings
    /// only in their namespace (to a Role of that namespace or a ClusterRole); `system:masters`
    /// may do anything.
    pub fn authorize(&self, a: &Attributes) -> Decision {
        let groups = a.effective_groups();
        if groups.iter().any(|g| g == "system:masters") {
            return Decision::Allow("allowed: user is in group system:masters".to_owned());
        }
        let who = subject_words(a);
        for (name, b) in &self.cluster_role_bindings {
            if b.role_kind != "ClusterRole"
                || !b
                    .subjects
                    .iter()
                    .any(|s| Self::subject_matches(s, &a.user, &groups, ""))
            {
                continue;
            }
            if self
                .cluster_role_rules(&b.role_name)
                .into_iter()
                .any(|r| rule_matches(r, a))
            {
                return Decision::Allow(format!(
                    "RBAC: allowed by ClusterRoleBinding {name:?} of ClusterRole {:?} to {who}",
                    b.role_name
                ));
            }
        }
        if !a.namespace.is_empty() && a.is_resource_request() {
            for ((ns, name), b) in self
                .role_bindings
                .range((a.namespace.clone(), String::new())..)
            {
                if *ns != a.namespace {
                    break;
                }
                if !b
                    .subjects
                    .iter()
                    .any(|s| Self::subject_matches(s, &a.user, &groups, ns))
                {
                    continue;
                }
                let rules: Vec<&PolicyRule> = match b.role_kind.as_str() {
                    "Role" => self
                        .roles
                        .get(&(ns.clone(), b.role_name.clone()))
                        .map(|r| r.rules.iter().collect())
                        .unwrap_or_default(),
                    "ClusterRole" => self.cluster_role_rules(&b.role_name),
                    _ => Vec::new(),
                };
                if rules.into_iter().any(|r| rule_matches(r, a)) {
                    return Decision::Allow(format!(
                        "RBAC: allowed by RoleBinding \"{name}/{ns}\" of {} {:?} to {who}",
                        b.role_kind, b.role_name
                    ));
                }
            }
        }
        Decision::Deny(String::new())
    }
}

fn subject_words(a: &Attributes) -> String {
    match a
        .user
        .strip_prefix("system:serviceaccount:")
        .and_then(|r| r.split_once(':'))
    {
        Some((ns, name)) => format!("ServiceAccount \"{name}/{ns}\""),
        None => format!("User {:?}", a.user),
    }
}

/// The 403 `Status` kube-apiserver sends when authorization denies a request, e.g.
/// `rollouts.sluice.dev "x" is forbidden: User "system:serviceaccount:sluice:rollout-weights"
/// cannot patch resource "rollouts/status" in API group "sluice.dev" in the namespace "default"`.
pub fn forbidden_status(a: &Attributes) -> Value {
    let detail = if !a.is_resource_request() {
        format!("User {:?} cannot {} path {:?}", a.user, a.verb, a.path)
    } else {
        let resource = if a.subresource.is_empty() {
            a.resource.clone()
        } else {
            format!("{}/{}", a.resource, a.subresource)
        };
        if a.namespace.is_empty() {
            format!(
                "User {:?} cannot {} resource {resource:?} in API group {:?} at the cluster scope",
                a.user, a.verb, a.api_group
            )
        } else {
            format!(
                "User {:?} cannot {} resource {resource:?} in API group {:?} in the namespace {:?}",
                a.user, a.verb, a.api_group, a.namespace
            )
        }
    };
    let qualified = if a.api_group.is_empty() {
        a.resource.clone()
    } else {
        format!("{}.{}", a.resource, a.api_group)
    };
    let message = if qualified.is_empty() || !a.is_resource_request() {
        format!("forbidden: {detail}")
    } else if a.name.is_empty() {
        format!("{qualified} is forbidden: {detail}")
    } else {
        format!("{qualified} {:?} is forbidden: {detail}", a.name)
    };
    let mut details = serde_json::Map::new();
    if !a.name.is_empty() {
        details.insert("name".into(), json!(a.name));
    }
    if !a.api_group.is_empty() {
        details.insert("group".into(), json!(a.api_group));
    }
    if !a.resource.is_empty() {
        details.insert("kind".into(), json!(a.resource));
    }
    json!({
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": "Forbidden",
        "details": Value::Object(details),
        "code": 403
    })
}

/// The parts of kube-apiserver's bootstrap policy a client needs before any chart is applied:
/// `cluster-admin` for `system:masters`, discovery and version paths and self-reviews for every
/// authenticated user. Returns `(cluster_roles, cluster_role_bindings)` as JSON objects.
pub fn bootstrap_policy() -> (Vec<Value>, Vec<Value>) {
    let role = |name: &str, rules: Value| {
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
               "metadata": {"name": name, "labels": {"kubernetes.io/bootstrapping": "rbac-defaults"}},
               "rules": rules})
    };
    let binding = |name: &str, group: &str| {
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
               "metadata": {"name": name, "labels": {"kubernetes.io/bootstrapping": "rbac-defaults"}},
               "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name},
               "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": group}]})
    };
    let roles = vec![
        role(
            "cluster-admin",
            json!([{"apiGroups": ["*"], "resources": ["*"], "verbs": ["*"]}, {"nonResourceURLs": ["*"], "verbs": ["*"]}]),
        ),
        role(
            "system:discovery",
            json!([{"nonResourceURLs": ["/api", "/api/*", "/apis", "/apis/*", "/healthz", "/livez", "/openapi", "/openapi/*", "/readyz", "/version", "/version/"], "verbs": ["get"]}]),
        ),
        role(
            "system:public-info-viewer",
            json!([{"nonResourceURLs": ["/healthz", "/livez", "/readyz", "/version", "/version/"], "verbs": ["get"]}]),
        ),
        role(
            "system:basic-user",
            json!([
                {"apiGroups": ["authorization.k8s.io"], "resources": ["selfsubjectaccessreviews", "selfsubjectrulesreviews"], "verbs": ["create"]},
                {"apiGroups": ["authentication.k8s.io"], "resources": ["selfsubjectreviews"], "verbs": ["create"]}
            ]),
        ),
    ];
    let bindings = vec![
        binding("cluster-admin", "system:masters"),
        binding("system:discovery", "system:authenticated"),
        binding("system:public-info-viewer", "system:authenticated"),
        binding("system:basic-user", "system:authenticated"),
    ];
    (roles, bindings)
}

#[cfg(test)]
mod tests {
    use super::*;

    const SA: &str = "system:serviceaccount:sluice:rollout-weights";

    fn attrs(
        user: &str,
        verb: &str,
        group: &str,
        resource: &str,
        sub: &str,
        ns: &str,
        name: &str,
    ) -> Attributes {
        Attributes {
            user: user.into(),
            groups: vec![],
            verb: verb.into(),
            api_group: group.into(),
            resource: resource.into(),
            subresource: sub.into(),
            namespace: ns.into(),
            name: name.into(),
            path: String::new(),
        }
    }

    fn authorizer() -> Authorizer {
        let cluster_roles = vec![
            json!({"kind": "ClusterRole", "metadata": {"name": "rollout-weights"}, "rules": [
                {"apiGroups": ["sluice.dev"], "resources": ["rollouts"], "verbs": ["get", "list", "watch"]},
                {"apiGroups": ["sluice.dev"], "resources": ["rollouts/status"], "verbs": ["patch", "update"]},
                {"apiGroups": ["gateway.networking.k8s.io"], "resources": ["httproutes"], "verbs": ["get", "update"], "resourceNames": ["checkout"]}
            ]}),
            json!({"kind": "ClusterRole", "metadata": {"name": "aggregate-view"},
                   "aggregationRule": {"clusterRoleSelectors": [{"matchLabels": {"sluice.dev/aggregate-to-view": "true"}}]}, "rules": []}),
            json!({"kind": "ClusterRole", "metadata": {"name": "wavegate-view", "labels": {"sluice.dev/aggregate-to-view": "true"}}, "rules": [
                {"apiGroups": ["sluice.dev"], "resources": ["wavegates"], "verbs": ["get", "list"]}
            ]}),
            json!({"kind": "ClusterRole", "metadata": {"name": "all-status"}, "rules": [
                {"apiGroups": ["*"], "resources": ["*/status"], "verbs": ["get"]}
            ]}),
        ];
        let crbs = vec![
            json!({"kind": "ClusterRoleBinding", "metadata": {"name": "rollout-weights"},
                   "roleRef": {"kind": "ClusterRole", "name": "rollout-weights"},
                   "subjects": [{"kind": "ServiceAccount", "name": "rollout-weights", "namespace": "sluice"}]}),
            json!({"kind": "ClusterRoleBinding", "metadata": {"name": "viewers"},
                   "roleRef": {"kind": "ClusterRole", "name": "aggregate-view"},
                   "subjects": [{"kind": "Group", "name": "sre"}]}),
            json!({"kind": "ClusterRoleBinding", "metadata": {"name": "sa-status"},
                   "roleRef": {"kind": "ClusterRole", "name": "all-status"},
                   "subjects": [{"kind": "Group", "name": "system:serviceaccounts:argocd"}]}),
        ];
        let roles = vec![
            json!({"kind": "Role", "metadata": {"name": "lease", "namespace": "sluice"}, "rules": [
                {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["get", "patch"]}
            ]}),
        ];
        let rbs = vec![
            json!({"kind": "RoleBinding", "metadata": {"name": "lease", "namespace": "sluice"},
                   "roleRef": {"kind": "Role", "name": "lease"},
                   "subjects": [{"kind": "ServiceAccount", "name": "rollout-weights"}]}),
            json!({"kind": "RoleBinding", "metadata": {"name": "shop-view", "namespace": "shop"},
                   "roleRef": {"kind": "ClusterRole", "name": "wavegate-view"},
                   "subjects": [{"kind": "User", "name": "alice"}]}),
        ];
        Authorizer::new(&roles, &cluster_roles, &rbs, &crbs)
    }

    #[test]
    fn decisions_follow_rbac_semantics() {
        let a = authorizer();
        let cases: Vec<(&str, Attributes, bool)> = vec![
            (
                "status patch granted",
                attrs(
                    SA,
                    "patch",
                    "sluice.dev",
                    "rollouts",
                    "status",
                    "default",
                    "x",
                ),
                true,
            ),
            (
                "spec patch not granted",
                attrs(SA, "patch", "sluice.dev", "rollouts", "", "default", "x"),
                false,
            ),
            (
                "list granted cluster-wide",
                attrs(SA, "list", "sluice.dev", "rollouts", "", "", ""),
                true,
            ),
            (
                "resourceNames allows the named route",
                attrs(
                    SA,
                    "update",
                    "gateway.networking.k8s.io",
                    "httproutes",
                    "",
                    "shop",
                    "checkout",
                ),
                true,
            ),
            (
                "resourceNames refuses another route",
                attrs(
                    SA,
                    "update",
                    "gateway.networking.k8s.io",
                    "httproutes",
                    "",
                    "shop",
                    "cart",
                ),
                false,
            ),
            (
                "resourceNames never grants list",
                attrs(
                    "system:serviceaccount:sluice:rollout-weights",
                    "list",
                    "gateway.networking.k8s.io",
                    "httproutes",
                    "",
                    "shop",
                    "",
                ),
                false,
            ),
            (
                "role binding in its namespace",
                attrs(
                    SA,
                    "patch",
                    "coordination.k8s.io",
                    "leases",
                    "",
                    "sluice",
                    "l",
                ),
                true,
            ),
            (
                "role binding not in another namespace",
                attrs(
                    SA,
                    "patch",
                    "coordination.k8s.io",
                    "leases",
                    "",
                    "default",
                    "l",
                ),
                false,
            ),
            (
                "other service account",
                attrs(
                    "system:serviceaccount:sluice:revert",
                    "patch",
                    "sluice.dev",
                    "rollouts",
                    "status",
                    "default",
                    "x",
                ),
                false,
            ),
            (
                "aggregated cluster role via group",
                Attributes {
                    groups: vec!["sre".into()],
                    ..attrs("bob", "list", "sluice.dev", "wavegates", "", "", "")
                },
                true,
            ),
            (
                "cluster role through a role binding: in namespace",
                attrs("alice", "get", "sluice.dev", "wavegates", "", "shop", "w"),
                true,
            ),
            (
                "cluster role through a role binding: cluster scope",
                attrs("alice", "list", "sluice.dev", "wavegates", "", "", ""),
                false,
            ),
            (
                "implicit service-account namespace group",
                attrs(
                    "system:serviceaccount:argocd:app",
                    "get",
                    "apps",
                    "deployments",
                    "status",
                    "x",
                    "d",
                ),
                true,
            ),
            (
                "*/status does not grant the main resource",
                attrs(
                    "system:serviceaccount:argocd:app",
                    "get",
                    "apps",
                    "deployments",
                    "",
                    "x",
                    "d",
                ),
                false,
            ),
            (
                "system:masters may do anything",
                Attributes {
                    groups: vec!["system:masters".into()],
                    ..attrs("admin", "delete", "", "namespaces", "", "", "kube-system")
                },
                true,
            ),
        ];
        for (what, at, want) in cases {
            assert_eq!(a.authorize(&at).is_allowed(), want, "{what}");
        }
    }

    #[test]
    fn incremental_updates_take_effect() {
        let mut a = authorizer();
        let at = attrs(
            SA,
            "patch",
            "sluice.dev",
            "rollouts",
            "status",
            "default",
            "x",
        );
        assert!(a.authorize(&at).is_allowed());
        a.remove("ClusterRoleBinding", "", "rollout-weights");
        assert!(!a.authorize(&at).is_allowed());
        a.upsert(&json!({"kind": "ClusterRoleBinding", "metadata": {"name": "again"},
            "roleRef": {"kind": "ClusterRole", "name": "rollout-weights"},
            "subjects": [{"kind": "ServiceAccount", "name": "rollout-weights", "namespace": "sluice"}]}))
            .unwrap();
        assert!(a.authorize(&at).is_allowed());
        let err = a.upsert(&json!({"kind": "ConfigMap"})).unwrap_err();
        assert_eq!(err.category(), "UnknownKind");
        let err = a
            .upsert(&json!({"kind": "RoleBinding", "metadata": {"name": "b"}}))
            .unwrap_err();
        assert_eq!(err.category(), "Missing");
    }

    #[test]
    fn bootstrap_policy_allows_discovery_only() {
        let (roles, bindings) = bootstrap_policy();
        let a = Authorizer::new(&[], &roles, &[], &bindings);
        let discovery = Attributes {
            user: SA.into(),
            verb: "get".into(),
            path: "/apis/sluice.dev/v1alpha1".into(),
            ..Default::default()
        };
        assert!(a.authorize(&discovery).is_allowed());
        assert!(
            !a.authorize(&attrs(SA, "get", "", "secrets", "", "default", "s"))
                .is_allowed()
        );
    }

    #[test]
    fn forbidden_status_is_worded_like_the_apiserver() {
        let cases = [
            (
                attrs(
                    SA,
                    "patch",
                    "sluice.dev",
                    "rollouts",
                    "status",
                    "default",
                    "x",
                ),
                "rollouts.sluice.dev \"x\" is forbidden: User \"system:serviceaccount:sluice:rollout-weights\" cannot patch resource \"rollouts/status\" in API group \"sluice.dev\" in the namespace \"default\"",
            ),
            (
                attrs(SA, "list", "", "secrets", "", "", ""),
                "secrets is forbidden: User \"system:serviceaccount:sluice:rollout-weights\" cannot list resource \"secrets\" in API group \"\" at the cluster scope",
            ),
            (
                Attributes {
                    user: "system:anonymous".into(),
                    verb: "get".into(),
                    path: "/apis".into(),
                    ..Default::default()
                },
                "forbidden: User \"system:anonymous\" cannot get path \"/apis\"",
            ),
        ];
        for (at, want) in cases {
            let st = forbidden_status(&at);
            assert_eq!(st["message"], want);
            assert_eq!(st["code"], 403);
            assert_eq!(st["reason"], "Forbidden");
        }
        let st = forbidden_status(&cases_first());
        assert_eq!(
            st["details"],
            json!({"name": "x", "group": "sluice.dev", "kind": "rollouts"})
        );
    }

    fn cases_first() -> Attributes {
        attrs(
            SA,
            "patch",
            "sluice.dev",
            "rollouts",
            "status",
            "default",
            "x",
        )
    }
}
