//! ValidatingAdmissionPolicy evaluation (`admissionregistration.k8s.io/v1`): policies and their
//! bindings decide whether a write may proceed, with CEL over `object`, `oldObject`, `request`,
//! `params`, `namespaceObject` and `variables`, and the apiserver's denial wording.
//!
//! Owns: matching, evaluation and the resulting Status. Must never: do I/O (parameters come from
//! a [`ParamSource`] the caller supplies), or let a policy whose expressions it cannot compile
//! pass silently — such a policy fails closed or open exactly as its `failurePolicy` says.

use std::collections::BTreeMap;
use std::sync::Arc;

use cel::objects::{Key, Map};
use cel::{Context, Program, Value as CelValue};
use serde_json::{Value, json};

use crate::rbac::selector_matches;
use crate::validation::cel_library;

/// Why a policy or binding cannot be used as written.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error, strum::IntoStaticStr)]
pub enum AdmissionError {
    /// An expression does not compile or uses what the emulator does not provide.
    #[error(
        "ValidatingAdmissionPolicy {policy:?}: {field} {expression:?} cannot be evaluated: {detail}; fix the expression (requests it matches now fail per its failurePolicy)"
    )]
    CelCompile {
        /// The policy name.
        policy: String,
        /// Where (`spec.validations[0].expression`).
        field: String,
        /// The expression.
        expression: String,
        /// The compiler's complaint.
        detail: String,
    },
    /// The object is not a ValidatingAdmissionPolicy or binding.
    #[error("{kind} is not ValidatingAdmissionPolicy or ValidatingAdmissionPolicyBinding")]
    UnknownKind {
        /// The kind given.
        kind: String,
    },
    /// A required field is missing.
    #[error("{kind} {name:?} is missing {field}; add it and apply again")]
    Missing {
        /// The kind.
        kind: String,
        /// The object's name.
        name: String,
        /// The missing field.
        field: &'static str,
    },
}

impl AdmissionError {
    /// A bounded label for metrics and logs.
    pub fn category(&self) -> &'static str {
        self.into()
    }
}

/// One admission request, as the policy sees it.
#[derive(Debug, Clone, Default)]
pub struct AdmissionRequest {
    /// `CREATE`, `UPDATE`, `DELETE` or `CONNECT`.
    pub operation: String,
    /// API group of the resource (`""` for core).
    pub api_group: String,
    /// API version of the resource.
    pub api_version: String,
    /// The kind of the object.
    pub kind: String,
    /// The resource (plural).
    pub resource: String,
    /// The subresource, or empty.
    pub subresource: String,
    /// The namespace, empty for cluster-scoped objects.
    pub namespace: String,
    /// The object's name.
    pub name: String,
    /// The requesting user.
    pub user: String,
    /// The requesting user's uid.
    pub uid: String,
    /// The requesting user's groups.
    pub groups: Vec<String>,
    /// The object after the write (absent on DELETE).
    pub object: Option<Value>,
    /// The object before the write (absent on CREATE).
    pub old_object: Option<Value>,
    /// The Namespace object of a namespaced request, for `namespaceSelector` and
    /// `namespaceObject`.
    pub namespace_object: Option<Value>,
    /// Whether the request is a dry run.
    pub dry_run: bool,
}

/// Where `params` come from: the objects of the policy's `paramKind` that a binding's `paramRef`
/// names. The emulator's store implements this; [`NoParams`] has none.
pub trait ParamSource {
    /// The objects of `api_version`/`kind` in `namespace` (None: cluster-scoped) named `name`, or
    /// matching `selector` when no name is given.
    fn params(
        &self,
        api_version: &str,
        kind: &str,
        namespace: Option<&str>,
        name: Option<&str>,
        selector: Option<&Value>,
    ) -> Vec<Value>;
}

/// A [`ParamSource`] with no parameter objects.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoParams;

impl ParamSource for NoParams {
    fn params(
        &self,
        _: &str,
        _: &str,
        _: Option<&str>,
        _: Option<&str>,
        _: Option<&Value>,
    ) -> Vec<Value> {
        Vec::new()
    }
}

/// The result of running every matching policy over a request.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct AdmissionOutcome {
    /// The Status to answer with when a `Deny` binding's policy failed (403/422).
    pub denied: Option<Value>,
    /// Warnings from `Warn` bindings, for the `Warning` header.
    pub warnings: Vec<String>,
    /// Messages from `Audit` bindings.
    pub audit: Vec<String>,
}

struct Compiled {
    source: String,
    program: Result<Program, String>,
}

struct Validation {
    expression: Compiled,
    message: Option<String>,
    message_expression: Option<Compiled>,
    reason: Option<String>,
}

struct Policy {
    match_constraints: Option<Value>,
    match_conditions: Vec<(String, Compiled)>,
    variables: Vec<(String, Compiled)>,
    validations: Vec<Validation>,
    fail_closed: bool,
    param_kind: Option<(String, String)>,
}

impl std::fmt::Debug for Policy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Policy")
            .field("validations", &self.validations.len())
            .finish_non_exhaustive()
    }
}

#[derive(Debug, Clone)]
struct Binding {
    policy_name: String,
    param_ref: Option<Value>,
    match_resources: Option<Value>,
    actions: Vec<String>,
}

/// The installed policies and bindings.
#[derive(Debug, Default)]
pub struct PolicySet {
    policies: BTreeMap<String, Arc<Policy>>,
    bindings: BTreeMap<String, Binding>,
}

fn compile(expr: &str) -> Compiled {
    let env = cel_library::env();
    let program = env.compile(expr).map_err(|e| e.to_string()).and_then(|p| {
        let unknown = cel_library::unknown_functions(&p);
        if !unknown.is_empty() {
            return Err(format!(
                "calls {} that the emulator's CEL environment does not provide",
                unknown.join(", ")
            ));
        }
        if p.references().has_variable("authorizer") {
            return Err("the authorizer variable is not supported by the emulator".to_owned());
        }
        Ok(p)
    });
    Compiled {
        source: expr.to_owned(),
        program,
    }
}

fn str_at<'a>(v: &'a Value, pointer: &str) -> &'a str {
    v.pointer(pointer).and_then(Value::as_str).unwrap_or("")
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

fn labels_of(obj: Option<&Value>) -> BTreeMap<String, String> {
    obj.and_then(|o| o.pointer("/metadata/labels"))
        .and_then(Value::as_object)
        .map(|m| {
            m.iter()
                .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_owned())))
                .collect()
        })
        .unwrap_or_default()
}

fn rule_matches(rule: &Value, req: &AdmissionRequest) -> bool {
    let any = |list: Vec<String>, want: &str| list.iter().any(|x| x == "*" || x == want);
    if !any(strings(rule.get("operations")), &req.operation)
        || !any(strings(rule.get("apiGroups")), &req.api_group)
        || !any(strings(rule.get("apiVersions")), &req.api_version)
    {
        return false;
    }
    let resource_ok = strings(rule.get("resources")).iter().any(|r| {
        if req.subresource.is_empty() {
            r == "*" || r == "*/*" || *r == req.resource
        } else {
            r == "*/*"
                || *r == format!("{}/{}", req.resource, req.subresource)
                || *r == format!("{}/*", req.resource)
                || *r == format!("*/{}", req.subresource)
        }
    });
    if !resource_ok {
        return false;
    }
    let names = strings(rule.get("resourceNames"));
    if !names.is_empty() && !names.contains(&req.name) {
        return false;
    }
    match rule.get("scope").and_then(Value::as_str).unwrap_or("*") {
        "Cluster" => req.namespace.is_empty(),
        "Namespaced" => !req.namespace.is_empty(),
        _ => true,
    }
}

/// Whether `match` (a policy's matchConstraints or a binding's matchResources) selects `req`.
/// `rules_required`: an empty `resourceRules` matches nothing (policies) or everything (bindings).
fn resources_match(m: &Value, req: &AdmissionRequest, rules_required: bool) -> bool {
    let rules = m
        .get("resourceRules")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    if rules.is_empty() {
        if rules_required {
            return false;
        }
    } else if !rules.iter().any(|r| rule_matches(r, req)) {
        return false;
    }
    if let Some(excl) = m.get("excludeResourceRules").and_then(Value::as_array)
        && excl.iter().any(|r| rule_matches(r, req))
    {
        return false;
    }
    if let Some(sel) = m.get("namespaceSelector") {
        let is_namespace = req.api_group.is_empty() && req.resource == "namespaces";
        if is_namespace {
            let labels = labels_of(req.object.as_ref().or(req.old_object.as_ref()));
            if !selector_matches(sel, &labels) {
                return false;
            }
        } else if !req.namespace.is_empty()
            && !selector_matches(sel, &labels_of(req.namespace_object.as_ref()))
        {
            return false;
        }
    }
    if let Some(sel) = m.get("objectSelector") {
        let new_ok = req
            .object
            .as_ref()
            .is_some_and(|o| selector_matches(sel, &labels_of(Some(o))));
        let old_ok = req
            .old_object
            .as_ref()
            .is_some_and(|o| selector_matches(sel, &labels_of(Some(o))));
        if !new_ok && !old_ok {
            return false;
        }
    }
    true
}

fn request_value(req: &AdmissionRequest) -> Value {
    let gvk = json!({"group": req.api_group, "version": req.api_version, "kind": req.kind});
    let gvr = json!({"group": req.api_group, "version": req.api_version, "resource": req.resource});
    json!({
        "kind": gvk, "resource": gvr, "subResource": req.subresource,
        "requestKind": gvk, "requestResource": gvr, "requestSubResource": req.subresource,
        "name": req.name, "namespace": req.namespace, "operation": req.operation,
        "userInfo": {"username": req.user, "uid": req.uid, "groups": req.groups},
        "dryRun": req.dry_run
    })
}

/// One policy/binding verdict.
enum Verdict {
    Pass,
    Fail {
        message: String,
        reason: Option<String>,
    },
}

impl PolicySet {
    /// An empty set.
    pub fn new() -> PolicySet {
        PolicySet::default()
    }

    /// Adds or replaces a ValidatingAdmissionPolicy or binding. A policy whose expressions do not
    /// compile is still installed (requests it matches then fail per its `failurePolicy`, as on a
    /// real apiserver) and the compile error is returned so the caller can report it.
    pub fn upsert(&mut self, obj: &Value) -> Result<(), AdmissionError> {
        let kind = str_at(obj, "/kind");
        let name = str_at(obj, "/metadata/name").to_owned();
        match kind {
            "ValidatingAdmissionPolicy" => self.upsert_policy(&name, obj),
            "ValidatingAdmissionPolicyBinding" => {
                let policy_name = str_at(obj, "/spec/policyName");
                if policy_name.is_empty() {
                    return Err(AdmissionError::Missing {
                        kind: kind.to_owned(),
                        name,
                        field: "spec.policyName",
                    });
                }
                let actions = strings(obj.pointer("/spec/validationActions"));
                if actions.is_empty() {
                    return Err(AdmissionError::Missing {
                        kind: kind.to_owned(),
                        name,
                        field: "spec.validationActions",
                    });
                }
                self.bindings.insert(
                    name,
                    Binding {
                        policy_name: policy_name.to_owned(),
                        param_ref: obj.pointer("/spec/paramRef").cloned(),
                        match_resources: obj.pointer("/spec/matchResources").cloned(),
                        actions,
                    },
                );
                Ok(())
            }
            other => Err(AdmissionError::UnknownKind {
                kind: other.to_owned(),
            }),
        }
    }

    fn upsert_policy(&mut self, name: &str, obj: &Value) -> Result<(), AdmissionError> {
        let spec = obj.get("spec").cloned().unwrap_or(Value::Null);
        let mut first_error: Option<AdmissionError> = None;
        let mut note = |field: String, c: &Compiled| {
            if let (Err(detail), None) = (&c.program, &first_error) {
                first_error = Some(AdmissionError::CelCompile {
                    policy: name.to_owned(),
                    field,
                    expression: c.source.clone(),
                    detail: detail.clone(),
                });
            }
        };
        let named = |list: Option<&Value>,
                     what: &str,
                     note: &mut dyn FnMut(String, &Compiled)|
         -> Vec<(String, Compiled)> {
            list.and_then(Value::as_array)
                .map(|items| {
                    items
                        .iter()
                        .enumerate()
                        .map(|(i, item)| {
                            let c = compile(str_at(item, "/expression"));
                            note(format!("spec.{what}[{i}].expression"), &c);
                            (str_at(item, "/name").to_owned(), c)
                        })
                        .collect()
                })
                .unwrap_or_default()
        };
        let match_conditions = named(spec.get("matchConditions"), "matchConditions", &mut note);
        let variables = named(spec.get("variables"), "variables", &mut note);
        let mut validations = Vec::new();
        for (i, v) in spec
            .get("validations")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default()
            .iter()
            .enumerate()
        {
            let expression = compile(str_at(v, "/expression"));
            note(format!("spec.validations[{i}].expression"), &expression);
            let message_expression = v.get("messageExpression").and_then(Value::as_str).map(|m| {
                let c = compile(m);
                note(format!("spec.validations[{i}].messageExpression"), &c);
                c
            });
            validations.push(Validation {
                expression,
                message: v.get("message").and_then(Value::as_str).map(str::to_owned),
                message_expression,
                reason: v.get("reason").and_then(Value::as_str).map(str::to_owned),
            });
        }
        let param_kind = spec.get("paramKind").map(|pk| {
            (
                str_at(pk, "/apiVersion").to_owned(),
                str_at(pk, "/kind").to_owned(),
            )
        });
        let policy = Policy {
            match_constraints: spec.get("matchConstraints").cloned(),
            match_conditions,
            variables,
            validations,
            fail_closed: spec.get("failurePolicy").and_then(Value::as_str) != Some("Ignore"),
            param_kind,
        };
        self.policies.insert(name.to_owned(), Arc::new(policy));
        match first_error {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// Removes a policy or binding by kind and name.
    pub fn remove(&mut self, kind: &str, name: &str) {
        match kind {
            "ValidatingAdmissionPolicy" => {
                self.policies.remove(name);
            }
            "ValidatingAdmissionPolicyBinding" => {
                self.bindings.remove(name);
            }
            _ => {}
        }
    }

    /// Runs every binding whose policy matches `req`. The first `Deny` failure becomes the
    /// Status the apiserver would answer with: `<resource>.<group> "<name>" is forbidden:
    /// ValidatingAdmissionPolicy '<policy>' with binding '<binding>' denied request: <message>`,
    /// code 422 unless the validation's `reason` says otherwise.
    pub fn validate(&self, req: &AdmissionRequest, params: &dyn ParamSource) -> AdmissionOutcome {
        let mut out = AdmissionOutcome::default();
        for (binding_name, binding) in &self.bindings {
            let Some(policy) = self.policies.get(&binding.policy_name) else {
                continue;
            };
            let Some(mc) = &policy.match_constraints else {
                continue;
            };
            if !resources_match(mc, req, true) {
                continue;
            }
            if let Some(mr) = &binding.match_resources
                && !resources_match(mr, req, false)
            {
                continue;
            }
            let verdicts = self.evaluate(policy, binding, req, params);
            for verdict in verdicts {
                let Verdict::Fail { message, reason } = verdict else {
                    continue;
                };
                let full = format!(
                    "ValidatingAdmissionPolicy '{}' with binding '{binding_name}' denied request: {message}",
                    binding.policy_name
                );
                if binding.actions.iter().any(|a| a == "Warn") {
                    out.warnings.push(format!(
                        "Validation failed for ValidatingAdmissionPolicy '{}' with binding '{binding_name}': {message}",
                        binding.policy_name
                    ));
                }
                if binding.actions.iter().any(|a| a == "Audit") {
                    out.audit.push(full.clone());
                }
                if out.denied.is_none() && binding.actions.iter().any(|a| a == "Deny") {
                    out.denied = Some(denial_status(req, &full, reason.as_deref()));
                }
            }
        }
        out
    }

    fn evaluate(
        &self,
        policy: &Policy,
        binding: &Binding,
        req: &AdmissionRequest,
        source: &dyn ParamSource,
    ) -> Vec<Verdict> {
        let fail = |message: String| {
            if policy.fail_closed {
                vec![Verdict::Fail {
                    message,
                    reason: None,
                }]
            } else {
                vec![Verdict::Pass]
            }
        };
        // Resolve params.
        let mut param_sets: Vec<Value> = vec![Value::Null];
        if let (Some((api_version, kind)), Some(pr)) = (&policy.param_kind, &binding.param_ref) {
            let ns = match pr.get("namespace").and_then(Value::as_str) {
                Some(ns) => Some(ns.to_owned()),
                None if !req.namespace.is_empty() => Some(req.namespace.clone()),
                None => None,
            };
            let name = pr.get("name").and_then(Value::as_str);
            let found = source.params(api_version, kind, ns.as_deref(), name, pr.get("selector"));
            if found.is_empty() {
                if str_at(pr, "/parameterNotFoundAction") == "Allow" {
                    return vec![Verdict::Pass];
                }
                return fail("failed to configure binding: no params found for policy binding with `Deny` parameterNotFoundAction".to_owned());
            }
            param_sets = found;
        } else if policy.param_kind.is_some() {
            return fail(
                "failed to configure binding: params not configured for a policy with paramKind"
                    .to_owned(),
            );
        }

        let mut verdicts = Vec::new();
        for params in &param_sets {
            let env = cel_library::env();
            let mut ctx = Context::with_env(env);
            let obj = |v: &Option<Value>| {
                v.as_ref()
                    .map(cel_library::json_to_cel)
                    .unwrap_or(CelValue::Null)
            };
            ctx.add_variable_from_value("object", obj(&req.object));
            ctx.add_variable_from_value("oldObject", obj(&req.old_object));
            ctx.add_variable_from_value("request", cel_library::json_to_cel(&request_value(req)));
            ctx.add_variable_from_value("params", cel_library::json_to_cel(params));
            ctx.add_variable_from_value("namespaceObject", obj(&req.namespace_object));

            // matchConditions: all must be true for the policy to apply.
            let mut applies = true;
            for (name, c) in &policy.match_conditions {
                match run(c, &ctx) {
                    Ok(CelValue::Bool(true)) => {}
                    Ok(CelValue::Bool(false)) => {
                        applies = false;
                        break;
                    }
                    Ok(other) => {
                        return fail(format!(
                            "matchCondition '{name}' did not evaluate to a boolean: {other:?}"
                        ));
                    }
                    Err(e) => {
                        return fail(format!("failed to evaluate matchCondition '{name}': {e}"));
                    }
                }
            }
            if !applies {
                continue;
            }

            // variables, in order; each sees the ones before it.
            let mut vars: std::collections::HashMap<Key, CelValue> =
                std::collections::HashMap::new();
            for (name, c) in &policy.variables {
                ctx.add_variable_from_value(
                    "variables",
                    CelValue::Map(Map {
                        map: Arc::new(vars.clone()),
                    }),
                );
                if let Ok(v) = run(c, &ctx) {
                    vars.insert(Key::String(Arc::new(name.clone())), v);
                }
            }
            ctx.add_variable_from_value(
                "variables",
                CelValue::Map(Map {
                    map: Arc::new(vars),
                }),
            );

            for v in &policy.validations {
                match run(&v.expression, &ctx) {
                    Ok(CelValue::Bool(true)) => verdicts.push(Verdict::Pass),
                    Ok(CelValue::Bool(false)) => {
                        let fallback = match &v.message {
                            Some(m) if !m.trim().is_empty() => m.trim().to_owned(),
                            _ => format!("failed expression: {}", v.expression.source.trim()),
                        };
                        let message = match &v.message_expression {
                            Some(me) => match run(me, &ctx) {
                                Ok(CelValue::String(s)) if !s.trim().is_empty() && !s.contains('\n') => s.trim().to_owned(),
                                _ => fallback,
                            },
                            None => fallback,
                        };
                        verdicts.push(Verdict::Fail { message, reason: v.reason.clone() });
                    }
                    Ok(other) => verdicts.extend(fail(format!(
                        "expression '{}' resulted in error: expression did not evaluate to a boolean: {other:?}",
                        v.expression.source
                    ))),
                    Err(e) => verdicts.extend(fail(format!("expression '{}' resulted in error: {e}", v.expression.source))),
                }
            }
        }
        verdicts
    }
}

fn run(c: &Compiled, ctx: &Context) -> Result<CelValue, String> {
    match &c.program {
        Ok(p) => p.execute(ctx).map_err(|e| e.to_string()),
        Err(e) => Err(format!("compilation error: {e}")),
    }
}

fn reason_code(reason: &str) -> u16 {
    match reason {
        "Unauthorized" => 401,
        "Forbidden" => 403,
        "RequestEntityTooLarge" => 413,
        _ => 422,
    }
}

/// The Status a denied admission answers with.
fn denial_status(req: &AdmissionRequest, message: &str, reason: Option<&str>) -> Value {
    let qualified = if req.api_group.is_empty() {
        req.resource.clone()
    } else {
        format!("{}.{}", req.resource, req.api_group)
    };
    let full = if req.name.is_empty() {
        format!("{qualified} is forbidden: {message}")
    } else {
        format!("{qualified} {:?} is forbidden: {message}", req.name)
    };
    let reason = reason.unwrap_or("Invalid");
    let mut details = serde_json::Map::new();
    if !req.name.is_empty() {
        details.insert("name".into(), json!(req.name));
    }
    if !req.api_group.is_empty() {
        details.insert("group".into(), json!(req.api_group));
    }
    details.insert("kind".into(), json!(req.resource));
    details.insert("causes".into(), json!([{"message": message}]));
    json!({
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": full,
        "reason": reason,
        "details": Value::Object(details),
        "code": reason_code(reason)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const ROLLOUT_WEIGHTS: &str = "system:serviceaccount:sluice:rollout-weights";

    fn ownership_policy() -> Value {
        json!({
            "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicy",
            "metadata": {"name": "sluice-route-ownership"},
            "spec": {
                "failurePolicy": "Fail",
                "matchConstraints": {"resourceRules": [{
                    "apiGroups": ["gateway.networking.k8s.io"], "apiVersions": ["*"],
                    "operations": ["UPDATE"], "resources": ["httproutes"]
                }]},
                "matchConditions": [{"name": "owned", "expression": "has(oldObject.metadata.annotations) && 'sluice.dev/owner' in oldObject.metadata.annotations"}],
                "variables": [
                    {"name": "writer", "expression": "request.userInfo.username"},
                    {"name": "privileged", "expression": "variables.writer in ['system:serviceaccount:sluice:rollout-weights', 'system:serviceaccount:sluice:revert']"}
                ],
                "validations": [
                    {
                        "expression": "variables.privileged || object.spec.rules == oldObject.spec.rules",
                        "messageExpression": "'only rollout-weights and revert may change spec.rules of an owned route; ' + variables.writer + ' may not'",
                        "reason": "Forbidden"
                    },
                    {
                        "expression": "variables.privileged || (has(object.metadata.annotations) && 'sluice.dev/owner' in object.metadata.annotations && object.metadata.annotations['sluice.dev/owner'] == oldObject.metadata.annotations['sluice.dev/owner'])",
                        "message": "the sluice.dev/owner annotation of an owned route may only be changed by sluice"
                    }
                ]
            }
        })
    }

    fn binding(actions: &[&str]) -> Value {
        json!({
            "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicyBinding",
            "metadata": {"name": "sluice-route-ownership-binding"},
            "spec": {"policyName": "sluice-route-ownership", "validationActions": actions}
        })
    }

    fn route(rules: Value, owner: Option<&str>) -> Value {
        let mut r = json!({"apiVersion": "gateway.networking.k8s.io/v1", "kind": "HTTPRoute",
            "metadata": {"name": "checkout", "namespace": "shop"}, "spec": {"rules": rules}});
        if let Some(o) = owner {
            r["metadata"]["annotations"] = json!({"sluice.dev/owner": o});
        }
        r
    }

    fn update(user: &str, old: Value, new: Value) -> AdmissionRequest {
        AdmissionRequest {
            operation: "UPDATE".into(),
            api_group: "gateway.networking.k8s.io".into(),
            api_version: "v1".into(),
            kind: "HTTPRoute".into(),
            resource: "httproutes".into(),
            namespace: "shop".into(),
            name: "checkout".into(),
            user: user.into(),
            object: Some(new),
            old_object: Some(old),
            ..Default::default()
        }
    }

    fn set(actions: &[&str]) -> PolicySet {
        let mut s = PolicySet::new();
        s.upsert(&ownership_policy()).unwrap();
        s.upsert(&binding(actions)).unwrap();
        s
    }

    #[test]
    fn the_route_ownership_policy_decides_like_the_apiserver() {
        let s = set(&["Deny"]);
        let owned = route(
            json!([{"backendRefs": [{"name": "stable", "weight": 100}]}]),
            Some("rollout/shop/checkout"),
        );
        let reweighted = route(
            json!([{"backendRefs": [{"name": "stable", "weight": 95}]}]),
            Some("rollout/shop/checkout"),
        );
        let unowned = route(
            json!([{"backendRefs": [{"name": "stable", "weight": 100}]}]),
            None,
        );
        let unowned_changed = route(json!([{"backendRefs": [{"name": "other"}]}]), None);
        let disowned = route(
            json!([{"backendRefs": [{"name": "stable", "weight": 100}]}]),
            None,
        );
        let cases: Vec<(&str, AdmissionRequest, Option<&str>)> = vec![
            (
                "rollout-weights may reweight",
                update(ROLLOUT_WEIGHTS, owned.clone(), reweighted.clone()),
                None,
            ),
            (
                "revert may reweight",
                update(
                    "system:serviceaccount:sluice:revert",
                    owned.clone(),
                    reweighted.clone(),
                ),
                None,
            ),
            (
                "a no-op write by Argo CD passes",
                update(
                    "system:serviceaccount:argocd:argocd-application-controller",
                    owned.clone(),
                    owned.clone(),
                ),
                None,
            ),
            (
                "unowned routes are not governed",
                update("alice", unowned.clone(), unowned_changed),
                None,
            ),
            (
                "Argo CD may not change owned rules",
                update(
                    "system:serviceaccount:argocd:argocd-application-controller",
                    owned.clone(),
                    reweighted,
                ),
                Some(
                    "httproutes.gateway.networking.k8s.io \"checkout\" is forbidden: ValidatingAdmissionPolicy 'sluice-route-ownership' with binding 'sluice-route-ownership-binding' denied request: only rollout-weights and revert may change spec.rules of an owned route; system:serviceaccount:argocd:argocd-application-controller may not",
                ),
            ),
            (
                "nobody else may drop the ownership annotation",
                update("alice", owned.clone(), disowned),
                Some(
                    "httproutes.gateway.networking.k8s.io \"checkout\" is forbidden: ValidatingAdmissionPolicy 'sluice-route-ownership' with binding 'sluice-route-ownership-binding' denied request: the sluice.dev/owner annotation of an owned route may only be changed by sluice",
                ),
            ),
        ];
        for (what, req, want) in cases {
            let out = s.validate(&req, &NoParams);
            let got = out
                .denied
                .as_ref()
                .map(|st| st["message"].as_str().unwrap_or_default().to_owned());
            assert_eq!(got.as_deref(), want, "{what}");
        }
        let out = s.validate(
            &update(
                "alice",
                owned.clone(),
                route(json!([]), Some("rollout/shop/checkout")),
            ),
            &NoParams,
        );
        let st = out.denied.expect("denied");
        assert_eq!(st["code"], 403, "reason Forbidden gives 403");
        let out = s.validate(
            &update(
                "alice",
                owned.clone(),
                route(
                    json!([{"backendRefs": [{"name": "stable", "weight": 100}]}]),
                    Some("someone-else"),
                ),
            ),
            &NoParams,
        );
        let st = out.denied.expect("denied");
        assert_eq!(st["code"], 422, "no reason gives 422 Invalid");
        assert_eq!(st["reason"], "Invalid");
    }

    #[test]
    fn match_constraints_select_operations_and_resources() {
        let s = set(&["Deny"]);
        let owned = route(json!([1]), Some("o"));
        let changed = route(json!([2]), Some("o"));
        let mut create = update("alice", owned.clone(), changed.clone());
        create.operation = "CREATE".into();
        assert!(
            s.validate(&create, &NoParams).denied.is_none(),
            "CREATE is not matched"
        );
        let mut status = update("alice", owned.clone(), changed.clone());
        status.subresource = "status".into();
        assert!(
            s.validate(&status, &NoParams).denied.is_none(),
            "'httproutes' does not match the status subresource"
        );
        let mut other = update("alice", owned.clone(), changed.clone());
        other.api_group = "networking.istio.io".into();
        assert!(s.validate(&other, &NoParams).denied.is_none());
        assert!(
            s.validate(&update("alice", owned, changed), &NoParams)
                .denied
                .is_some()
        );
    }

    #[test]
    fn warn_and_audit_actions_do_not_deny() {
        let s = set(&["Warn", "Audit"]);
        let out = s.validate(
            &update(
                "alice",
                route(json!([1]), Some("o")),
                route(json!([2]), Some("o")),
            ),
            &NoParams,
        );
        assert!(out.denied.is_none());
        assert_eq!(out.warnings.len(), 1);
        assert!(out.warnings[0].starts_with(
            "Validation failed for ValidatingAdmissionPolicy 'sluice-route-ownership' with binding"
        ));
        assert_eq!(out.audit.len(), 1);
    }

    #[test]
    fn failure_policy_governs_errors_and_broken_policies() {
        let broken = |failure: &str| {
            json!({"kind": "ValidatingAdmissionPolicy", "metadata": {"name": "p"}, "spec": {
                "failurePolicy": failure,
                "matchConstraints": {"resourceRules": [{"apiGroups": ["*"], "apiVersions": ["*"], "operations": ["*"], "resources": ["*"]}]},
                "validations": [{"expression": "object.spec.missing == 1"}]
            }})
        };
        let uncompilable = json!({"kind": "ValidatingAdmissionPolicy", "metadata": {"name": "p"}, "spec": {
            "matchConstraints": {"resourceRules": [{"apiGroups": ["*"], "apiVersions": ["*"], "operations": ["*"], "resources": ["*"]}]},
            "validations": [{"expression": "object.frobnicate()"}]
        }});
        let b = json!({"kind": "ValidatingAdmissionPolicyBinding", "metadata": {"name": "b"}, "spec": {"policyName": "p", "validationActions": ["Deny"]}});
        let req = update("alice", route(json!([1]), None), route(json!([1]), None));

        let mut s = PolicySet::new();
        s.upsert(&broken("Fail")).unwrap();
        s.upsert(&b).unwrap();
        let st = s.validate(&req, &NoParams).denied.expect("fails closed");
        assert!(
            st["message"]
                .as_str()
                .unwrap()
                .contains("expression 'object.spec.missing == 1' resulted in error"),
            "{st}"
        );

        s.upsert(&broken("Ignore")).unwrap();
        assert!(s.validate(&req, &NoParams).denied.is_none(), "fails open");

        let err = s.upsert(&uncompilable).unwrap_err();
        assert_eq!(err.category(), "CelCompile");
        assert!(
            s.validate(&req, &NoParams).denied.is_some(),
            "an uncompilable policy fails closed"
        );
    }

    #[test]
    fn params_come_from_the_param_source() {
        struct Source;
        impl ParamSource for Source {
            fn params(
                &self,
                api_version: &str,
                kind: &str,
                namespace: Option<&str>,
                name: Option<&str>,
                _: Option<&Value>,
            ) -> Vec<Value> {
                if api_version == "v1"
                    && kind == "ConfigMap"
                    && namespace == Some("sluice")
                    && name == Some("limits")
                {
                    vec![json!({"data": {"maxRules": "2"}})]
                } else {
                    Vec::new()
                }
            }
        }
        let mut s = PolicySet::new();
        s.upsert(&json!({"kind": "ValidatingAdmissionPolicy", "metadata": {"name": "p"}, "spec": {
            "paramKind": {"apiVersion": "v1", "kind": "ConfigMap"},
            "matchConstraints": {"resourceRules": [{"apiGroups": ["*"], "apiVersions": ["*"], "operations": ["*"], "resources": ["*"]}]},
            "validations": [{"expression": "size(object.spec.rules) <= int(params.data.maxRules)", "message": "too many rules"}]
        }}))
        .unwrap();
        s.upsert(&json!({"kind": "ValidatingAdmissionPolicyBinding", "metadata": {"name": "b"}, "spec": {
            "policyName": "p", "validationActions": ["Deny"], "paramRef": {"name": "limits", "namespace": "sluice"}
        }}))
        .unwrap();
        let ok = update("alice", route(json!([1]), None), route(json!([1, 2]), None));
        assert!(s.validate(&ok, &Source).denied.is_none());
        let bad = update(
            "alice",
            route(json!([1]), None),
            route(json!([1, 2, 3]), None),
        );
        assert!(s.validate(&bad, &Source).denied.is_some());
        let st = s
            .validate(&ok, &NoParams)
            .denied
            .expect("missing params deny by default");
        assert!(st["message"].as_str().unwrap().contains("no params found"));
    }
}
