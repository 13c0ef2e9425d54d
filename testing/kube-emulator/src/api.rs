//! Request semantics for objects: get, list, create, update, patch, apply, delete,
//! deletecollection and pod eviction, with resourceVersion conflicts, generation, finalizers,
//! status separated from spec, managedFields, CRD schemas, RBAC and admission policies.
//!
//! Owns the order in which a write is checked and committed (authorize → build the new object
//! → system fields → ownership → defaulting/validation → admission → commit). Never speaks
//! HTTP (that is `server`) and never renders discovery.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, RwLock};

use serde_json::{Value, json};

use crate::admission;
use crate::error::ApiError;
use crate::managed::{self, Scope, Shape, Write};
use crate::patch;
use crate::rbac;
use crate::resources::{Registry, ResourceType, TableKey};
use crate::selector;
use crate::store::{Inner, Store, key_of};
use crate::validation::{self, CrdSchema};

/// Who is making a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UserInfo {
    /// User name (`system:serviceaccount:<ns>:<name>` for service accounts).
    pub username: String,
    /// Stable uid.
    pub uid: String,
    /// Groups, including `system:authenticated`.
    pub groups: Vec<String>,
}

impl UserInfo {
    /// The administrator every emulator kubeconfig uses by default (`system:masters`).
    pub fn admin() -> Self {
        UserInfo {
            username: "emulator-admin".into(),
            uid: "emulator-admin".into(),
            groups: vec!["system:masters".into(), "system:authenticated".into()],
        }
    }

    /// The identity of a service account's token.
    pub fn service_account(namespace: &str, name: &str) -> Self {
        UserInfo {
            username: format!("system:serviceaccount:{namespace}:{name}"),
            uid: format!("sa-{namespace}-{name}"),
            groups: vec![
                "system:serviceaccounts".into(),
                format!("system:serviceaccounts:{namespace}"),
                "system:authenticated".into(),
            ],
        }
    }

    /// Requests without a token when RBAC is enforced.
    pub fn anonymous() -> Self {
        UserInfo {
            username: "system:anonymous".into(),
            uid: String::new(),
            groups: vec!["system:unauthenticated".into()],
        }
    }

    /// Whether RBAC is bypassed for this user.
    pub fn is_master(&self) -> bool {
        self.groups.iter().any(|g| g == "system:masters")
    }
}

/// What RBAC is asked about one request.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Attributes {
    /// Verb (`get`, `list`, `watch`, `create`, `update`, `patch`, `delete`, `deletecollection`).
    pub verb: String,
    /// API group.
    pub group: String,
    /// Resource plural.
    pub resource: String,
    /// Subresource (`status`, `eviction`) or empty.
    pub subresource: String,
    /// Namespace or empty.
    pub namespace: String,
    /// Object name or empty.
    pub name: String,
    /// Request path, for non-resource requests (discovery).
    pub path: String,
}

/// One parsed object request.
#[derive(Debug, Clone)]
pub struct Req {
    /// The resource addressed.
    pub rt: Arc<ResourceType>,
    /// Namespace from the path (empty for cluster scope or all namespaces).
    pub namespace: String,
    /// Name from the path.
    pub name: Option<String>,
    /// Subresource from the path.
    pub subresource: Option<String>,
    /// Query parameters.
    pub query: HashMap<String, String>,
    /// Who asks.
    pub user: UserInfo,
    /// The `User-Agent` header (default field manager).
    pub user_agent: String,
}

impl Req {
    fn q(&self, k: &str) -> Option<&str> {
        self.query.get(k).map(String::as_str)
    }

    fn dry_run(&self) -> bool {
        self.q("dryRun") == Some("All")
    }

    fn scope(&self) -> Scope {
        match (self.subresource.as_deref(), self.rt.has_status) {
            (Some("status"), _) => Scope::StatusOnly,
            (_, true) => Scope::NotStatus,
            _ => Scope::Everything,
        }
    }

    fn field_manager(&self) -> String {
        if let Some(m) = self.q("fieldManager").filter(|m| !m.is_empty()) {
            return m.to_string();
        }
        let ua = self.user_agent.split('/').next().unwrap_or_default();
        if ua.is_empty() {
            "unknown".into()
        } else {
            ua.to_string()
        }
    }
}

/// How a PATCH body is interpreted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PatchKind {
    /// `application/merge-patch+json`.
    Merge,
    /// `application/json-patch+json`.
    Json,
    /// `application/strategic-merge-patch+json`.
    Strategic,
    /// `application/apply-patch+yaml` (server-side apply).
    Apply,
}

impl PatchKind {
    /// From the request's `Content-Type`.
    pub fn from_content_type(ct: &str) -> Option<PatchKind> {
        let ct = ct.split(';').next().unwrap_or_default().trim();
        match ct {
            "application/merge-patch+json" => Some(PatchKind::Merge),
            "application/json-patch+json" => Some(PatchKind::Json),
            "application/strategic-merge-patch+json" => Some(PatchKind::Strategic),
            "application/apply-patch+yaml" | "application/apply-patch+json" => {
                Some(PatchKind::Apply)
            }
            _ => None,
        }
    }
}

#[derive(Clone, Copy)]
enum Op {
    Create,
    Update,
    Patch(PatchKind),
}

/// Emulator options that change semantics.
#[derive(Debug, Clone)]
pub struct Semantics {
    /// Whether RBAC is enforced for users outside `system:masters`.
    pub rbac: bool,
}

/// Compiled schemas per (group, version, plural).
type SchemaChecks = HashMap<(String, String, String), Arc<CrdSchema>>;

/// One compiled CRD version.
type CompiledVersion = ((String, String, String), Arc<CrdSchema>);

/// The shared state of one emulator instance.
pub struct State {
    /// Object storage.
    pub store: Store,
    /// Served resources.
    pub registry: RwLock<Registry>,
    /// Bearer token → user.
    pub tokens: RwLock<HashMap<String, UserInfo>>,
    /// Semantics switches.
    pub semantics: Semantics,
    checks: RwLock<SchemaChecks>,
    authorizer: RwLock<Arc<rbac::Authorizer>>,
    /// `None` while no policy or binding exists (the common case: no evaluation at all).
    admission: RwLock<Option<Arc<admission::PolicySet>>>,
}

impl std::fmt::Debug for State {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("State")
            .field("semantics", &self.semantics)
            .finish_non_exhaustive()
    }
}

/// RFC 3339 UTC with second precision, as Kubernetes writes timestamps.
pub fn now_rfc3339() -> String {
    jiff::Timestamp::now()
        .strftime("%Y-%m-%dT%H:%M:%SZ")
        .to_string()
}

fn random_suffix() -> String {
    const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    uuid::Uuid::new_v4().as_bytes()[..5]
        .iter()
        .map(|b| ALPHABET[*b as usize % ALPHABET.len()] as char)
        .collect()
}

fn table(group: &str, plural: &str) -> TableKey {
    TableKey {
        group: group.into(),
        plural: plural.into(),
    }
}

fn hex(s: &str) -> String {
    s.bytes().map(|b| format!("{b:02x}")).collect()
}

fn unhex(s: &str) -> Option<String> {
    if !s.len().is_multiple_of(2) {
        return None;
    }
    let bytes: Option<Vec<u8>> = (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).ok())
        .collect();
    String::from_utf8(bytes?).ok()
}

/// Result of a list: the objects (shared), the list resourceVersion and the continue token.
#[derive(Debug)]
pub struct ListResult {
    /// Matching objects in (namespace, name) order.
    pub items: Vec<Arc<Value>>,
    /// The resourceVersion of the list.
    pub resource_version: u64,
    /// Token for the next page.
    pub continue_token: Option<String>,
    /// Objects left after this page.
    pub remaining: usize,
}

/// Whether an object passes a request's label and field selectors.
pub fn selectors(
    query: &HashMap<String, String>,
) -> Result<impl Fn(&Value) -> bool + Send + 'static, ApiError> {
    let labels = selector::parse_labels(
        query
            .get("labelSelector")
            .map(String::as_str)
            .unwrap_or_default(),
    )
    .map_err(|e| ApiError::BadRequest(e.to_string()))?;
    let fields = selector::parse_fields(
        query
            .get("fieldSelector")
            .map(String::as_str)
            .unwrap_or_default(),
    )
    .map_err(|e| ApiError::BadRequest(e.to_string()))?;
    Ok(move |obj: &Value| {
        selector::labels_match(&labels, obj.pointer("/metadata/labels"))
            && selector::fields_match(&fields, obj)
    })
}

impl State {
    /// A fresh state with the built-in kinds and the default namespaces.
    pub fn new(semantics: Semantics, watch_history: usize) -> Self {
        let s = State {
            store: Store::new(watch_history),
            registry: RwLock::new(Registry::with_builtins()),
            tokens: RwLock::new(HashMap::new()),
            semantics,
            checks: RwLock::new(HashMap::new()),
            authorizer: RwLock::new(Arc::new(rbac::Authorizer::default())),
            admission: RwLock::new(None),
        };
        {
            let mut w = s.store.write();
            for ns in ["default", "kube-system", "kube-public", "kube-node-lease"] {
                w.put(&table("", "namespaces"), new_namespace(ns));
            }
            // The bootstrap policy every cluster starts with (cluster-admin, discovery, ...).
            let (roles, bindings) = rbac::bootstrap_policy();
            let now = now_rfc3339();
            for (plural, objs) in [("clusterroles", roles), ("clusterrolebindings", bindings)] {
                for mut o in objs {
                    o["metadata"]["uid"] = json!(uuid::Uuid::new_v4().to_string());
                    o["metadata"]["creationTimestamp"] = json!(now);
                    w.put(&table("rbac.authorization.k8s.io", plural), o);
                }
            }
        }
        s.rebuild_rbac();
        s
    }

    /// Looks up a served resource.
    pub fn resource(&self, group: &str, version: &str, plural: &str) -> Option<Arc<ResourceType>> {
        self.registry
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(group, version, plural)
    }

    /// Resolves a bearer token (`None` header → admin when RBAC is off, anonymous when on).
    pub fn authenticate(&self, token: Option<&str>) -> Result<UserInfo, ApiError> {
        match token {
            None if self.semantics.rbac => Ok(UserInfo::anonymous()),
            None => Ok(UserInfo::admin()),
            Some(t) => self
                .tokens
                .read()
                .unwrap_or_else(|p| p.into_inner())
                .get(t)
                .cloned()
                .ok_or(ApiError::Unauthorized),
        }
    }

    /// Answers 403 unless the user may do this.
    pub fn authorize(
        &self,
        user: &UserInfo,
        attrs: &Attributes,
        rt: Option<&ResourceType>,
    ) -> Result<(), ApiError> {
        if !self.semantics.rbac || user.is_master() {
            return Ok(());
        }
        let a = rbac::Attributes {
            user: user.username.clone(),
            groups: user.groups.clone(),
            verb: attrs.verb.clone(),
            api_group: attrs.group.clone(),
            resource: attrs.resource.clone(),
            subresource: attrs.subresource.clone(),
            namespace: attrs.namespace.clone(),
            name: attrs.name.clone(),
            path: attrs.path.clone(),
        };
        let authorizer = self
            .authorizer
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        if authorizer.authorize(&a).is_allowed() {
            return Ok(());
        }
        let _ = rt;
        Err(ApiError::from_status(rbac::forbidden_status(&a)))
    }

    fn rebuild_rbac(&self) {
        let r = self.store.read();
        let all = |plural: &str| -> Vec<Value> {
            r.table(&table("rbac.authorization.k8s.io", plural))
                .map(|t| t.iter_ns(None).map(|v| (**v).clone()).collect())
                .unwrap_or_default()
        };
        let a = rbac::Authorizer::new(
            &all("roles"),
            &all("clusterroles"),
            &all("rolebindings"),
            &all("clusterrolebindings"),
        );
        *self.authorizer.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(a);
    }

    fn rebuild_admission(&self) {
        let r = self.store.read();
        let mut set = admission::PolicySet::new();
        let mut any = false;
        for plural in [
            "validatingadmissionpolicies",
            "validatingadmissionpolicybindings",
        ] {
            if let Some(t) = r.table(&table("admissionregistration.k8s.io", plural)) {
                for o in t.iter_ns(None) {
                    any = true;
                    if let Err(e) = set.upsert(o) {
                        tracing::warn!(error = %e, category = e.category(), "admission object not installed");
                    }
                }
            }
        }
        *self.admission.write().unwrap_or_else(|p| p.into_inner()) = any.then(|| Arc::new(set));
    }

    /// Compiles every served version's schema; a rule the emulator cannot evaluate refuses the CRD.
    fn compile_crd(name: &str, types: &[ResourceType]) -> Result<Vec<CompiledVersion>, ApiError> {
        let mut compiled = Vec::new();
        for t in types {
            let schema = t.schema.as_deref().cloned().unwrap_or(Value::Null);
            let check = CrdSchema::from_openapi_v3(&schema).map_err(|e| {
                ApiError::invalid(
                    "CustomResourceDefinition.apiextensions.k8s.io",
                    name,
                    &[(
                        format!("spec.versions[{}].schema.openAPIV3Schema", t.version),
                        e.to_string(),
                    )],
                )
            })?;
            compiled.push((
                (t.group.clone(), t.version.clone(), t.plural.clone()),
                Arc::new(check),
            ));
        }
        Ok(compiled)
    }

    /// Compiles the schemas of a CRD's versions and serves its resources.
    fn register_crd(&self, crd: &Value) -> Result<(), ApiError> {
        let name = crd
            .pointer("/metadata/name")
            .and_then(Value::as_str)
            .unwrap_or_default();
        let types = crate::resources::from_crd(crd).map_err(|e| {
            ApiError::invalid(
                "CustomResourceDefinition.apiextensions.k8s.io",
                name,
                &[(String::new(), e.to_string())],
            )
        })?;
        let compiled = Self::compile_crd(name, &types)?;
        self.registry
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .put_crd(crd)
            .map_err(|e| {
                ApiError::invalid(
                    "CustomResourceDefinition.apiextensions.k8s.io",
                    name,
                    &[(String::new(), e.to_string())],
                )
            })?;
        let mut checks = self.checks.write().unwrap_or_else(|p| p.into_inner());
        for (k, c) in compiled {
            checks.insert(k, c);
        }
        Ok(())
    }

    fn check_for(&self, rt: &ResourceType) -> Option<Arc<CrdSchema>> {
        self.checks
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(&(rt.group.clone(), rt.version.clone(), rt.plural.clone()))
            .cloned()
    }

    /// Runs after a committed write: keeps the registry, RBAC and admission in step.
    fn after_write(&self, rt: &ResourceType, obj: &Value, deleted: bool) {
        match (rt.group.as_str(), rt.plural.as_str()) {
            ("apiextensions.k8s.io", "customresourcedefinitions") => {
                let name = obj
                    .pointer("/metadata/name")
                    .and_then(Value::as_str)
                    .unwrap_or_default();
                if deleted {
                    if let Ok(types) = crate::resources::from_crd(obj) {
                        let mut w = self.store.write();
                        if let Some(t) = types.first() {
                            w.drop_table(&t.table());
                        }
                    }
                    self.registry
                        .write()
                        .unwrap_or_else(|p| p.into_inner())
                        .remove_crd(name);
                } else if let Err(e) = self.register_crd(obj) {
                    tracing::warn!(crd = name, error = %e, "stored CustomResourceDefinition could not be served");
                }
            }
            ("rbac.authorization.k8s.io", _) => self.rebuild_rbac(),
            (
                "admissionregistration.k8s.io",
                "validatingadmissionpolicies" | "validatingadmissionpolicybindings",
            ) => self.rebuild_admission(),
            _ => {}
        }
    }

    fn attrs(&self, req: &Req, verb: &str) -> Attributes {
        Attributes {
            verb: verb.into(),
            group: req.rt.group.clone(),
            resource: req.rt.plural.clone(),
            subresource: req.subresource.clone().unwrap_or_default(),
            namespace: req.namespace.clone(),
            name: req.name.clone().unwrap_or_default(),
            path: String::new(),
        }
    }

    /// Runs the ValidatingAdmissionPolicies that match a write.
    #[allow(clippy::too_many_arguments)]
    fn admit(
        &self,
        inner: &Inner,
        user: &UserInfo,
        rt: &ResourceType,
        operation: &str,
        subresource: &str,
        ns: &str,
        name: &str,
        object: Option<&Value>,
        old_object: Option<&Value>,
        dry_run: bool,
    ) -> Result<(), ApiError> {
        let Some(policies) = self
            .admission
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
        else {
            return Ok(());
        };
        let namespace_object = if ns.is_empty() {
            None
        } else {
            inner
                .get(&table("", "namespaces"), "", ns)
                .map(|n| (*n).clone())
        };
        let request = admission::AdmissionRequest {
            operation: operation.into(),
            api_group: rt.group.clone(),
            api_version: rt.version.clone(),
            kind: rt.kind.clone(),
            resource: rt.plural.clone(),
            subresource: subresource.into(),
            // kube-apiserver's request attributes carry a Namespace's own name as its namespace.
            namespace: if ns.is_empty() && rt.group.is_empty() && rt.plural == "namespaces" {
                name.into()
            } else {
                ns.into()
            },
            name: name.into(),
            user: user.username.clone(),
            uid: user.uid.clone(),
            groups: user.groups.clone(),
            object: object.cloned(),
            old_object: old_object.cloned(),
            namespace_object,
            dry_run,
        };
        let registry = self
            .registry
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        let params = StoreParams {
            inner,
            registry: &registry,
        };
        let outcome = policies.validate(&request, &params);
        match outcome.denied {
            Some(status) => Err(ApiError::from_status(status)),
            None => Ok(()),
        }
    }

    /// Shapes a stored object for a request's version.
    pub fn present(rt: &ResourceType, obj: &Arc<Value>) -> Arc<Value> {
        if obj.get("apiVersion").and_then(Value::as_str) == Some(rt.api_version().as_str()) {
            return obj.clone();
        }
        let mut o = (**obj).clone();
        o["apiVersion"] = json!(rt.api_version());
        Arc::new(o)
    }

    /// GET one object.
    pub fn get(&self, req: &Req) -> Result<Arc<Value>, ApiError> {
        self.authorize(&req.user, &self.attrs(req, "get"), Some(&req.rt))?;
        let name = req.name.clone().unwrap_or_default();
        let r = self.store.read();
        let obj = r
            .get(&req.rt.table(), &req.namespace, &name)
            .ok_or_else(|| ApiError::not_found(&req.rt.qualified(), &name))?;
        Ok(Self::present(&req.rt, &obj))
    }

    /// LIST with selectors and pagination.
    pub fn list(&self, req: &Req) -> Result<ListResult, ApiError> {
        self.authorize(&req.user, &self.attrs(req, "list"), Some(&req.rt))?;
        let matches = selectors(&req.query)?;
        let limit: usize = req
            .q("limit")
            .and_then(|l| l.parse().ok())
            .filter(|l| *l > 0)
            .unwrap_or(usize::MAX);
        let after: Option<(String, String)> = match req.q("continue").filter(|c| !c.is_empty()) {
            Some(c) => {
                let raw = unhex(c).ok_or_else(|| {
                    ApiError::BadRequest(format!(
                        "continue key is not valid: {c:?}; restart the list without continue"
                    ))
                })?;
                let (ns, name) = raw.split_once('\u{0}').ok_or_else(|| {
                    ApiError::BadRequest(
                        "continue key is not valid; restart the list without continue".into(),
                    )
                })?;
                Some((ns.to_string(), name.to_string()))
            }
            None => None,
        };
        let r = self.store.read();
        let rv = r.rv();
        let Some(t) = r.table(&req.rt.table()) else {
            return Ok(ListResult {
                items: Vec::new(),
                resource_version: rv,
                continue_token: None,
                remaining: 0,
            });
        };
        let ns = (!req.namespace.is_empty()).then_some(req.namespace.as_str());
        let required = selector::required_labels(
            &selector::parse_labels(req.q("labelSelector").unwrap_or_default())
                .map_err(|e| ApiError::BadRequest(e.to_string()))?,
        );
        let mut items = Vec::new();
        let mut remaining = 0;
        let mut last = None;
        for (key, obj) in t.iter_keyed(ns, &required, after.as_ref()) {
            if !matches(obj) {
                continue;
            }
            if items.len() >= limit {
                remaining += 1;
                continue;
            }
            last = Some(key);
            items.push(obj.clone());
        }
        let continue_token = if remaining > 0 {
            last.map(|(ns, n)| hex(&format!("{ns}\u{0}{n}")))
        } else {
            None
        };
        drop(r);
        let items = items.iter().map(|o| Self::present(&req.rt, o)).collect();
        Ok(ListResult {
            items,
            resource_version: rv,
            continue_token,
            remaining,
        })
    }

    /// POST: create.
    pub fn create(&self, req: &Req, body: Value) -> Result<Arc<Value>, ApiError> {
        self.authorize(&req.user, &self.attrs(req, "create"), Some(&req.rt))?;
        self.write(req, Op::Create, body).map(|(_, o)| o)
    }

    /// PUT: update (main resource or status).
    pub fn update(&self, req: &Req, body: Value) -> Result<Arc<Value>, ApiError> {
        self.authorize(&req.user, &self.attrs(req, "update"), Some(&req.rt))?;
        self.write(req, Op::Update, body).map(|(_, o)| o)
    }

    /// PATCH: merge, JSON, strategic or apply; returns whether the object was created.
    pub fn patch(
        &self,
        req: &Req,
        kind: PatchKind,
        body: Value,
    ) -> Result<(bool, Arc<Value>), ApiError> {
        self.authorize(&req.user, &self.attrs(req, "patch"), Some(&req.rt))?;
        if kind == PatchKind::Strategic && req.rt.is_custom() {
            return Err(ApiError::UnsupportedMediaType(
                "the body of the request was in an unknown format - accepted media types include: application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml".into(),
            ));
        }
        if kind == PatchKind::Apply && req.q("fieldManager").is_none_or(str::is_empty) {
            return Err(ApiError::BadRequest("PATCH /apply: fieldManager is required for apply requests; set ?fieldManager=<name>".into()));
        }
        self.write(req, Op::Patch(kind), body)
    }

    fn namespace_exists(inner: &Inner, ns: &str) -> bool {
        inner.get(&table("", "namespaces"), "", ns).is_some()
    }

    /// The single write path for create, update and patch. The new object is computed from a
    /// snapshot of the live one outside the store's lock (managed fields, validation and the
    /// no-op check cost far more than the commit), and committed only if the live object is
    /// still that snapshot; otherwise the write is computed again from the newer one, as an
    /// API server's guaranteed update retries.
    fn write(&self, req: &Req, op: Op, body: Value) -> Result<(bool, Arc<Value>), ApiError> {
        loop {
            if let Some(done) = self.attempt_write(req, op, &body)? {
                return Ok(done);
            }
        }
    }

    /// One attempt of [`State::write`]; `None` when another write committed first.
    fn attempt_write(
        &self,
        req: &Req,
        op: Op,
        body: &Value,
    ) -> Result<Option<(bool, Arc<Value>)>, ApiError> {
        let rt = req.rt.clone();
        let key = rt.table();
        let scope = req.scope();
        let sub = req.subresource.clone().unwrap_or_default();
        let manager = req.field_manager();
        let now = now_rfc3339();
        let api_version = rt.api_version();
        let qualified = rt.qualified();
        let kind_group = if rt.group.is_empty() {
            rt.kind.clone()
        } else {
            format!("{}.{}", rt.kind, rt.group)
        };
        if !body.is_object() && !matches!(op, Op::Patch(PatchKind::Json)) {
            return Err(ApiError::BadRequest(format!(
                "the request body for {qualified} must be a JSON object"
            )));
        }
        if rt.namespaced && !Self::namespace_exists(&self.store.read(), &req.namespace) {
            return Err(ApiError::not_found("namespaces", &req.namespace));
        }
        // Name of the object written.
        let name = match (&op, &req.name) {
            (Op::Create, _) => {
                let body_ns = body
                    .pointer("/metadata/namespace")
                    .and_then(Value::as_str)
                    .unwrap_or_default();
                if rt.namespaced && !body_ns.is_empty() && body_ns != req.namespace {
                    return Err(ApiError::BadRequest(
                        "the namespace of the provided object does not match the namespace sent on the request".into(),
                    ));
                }
                match body
                    .pointer("/metadata/name")
                    .and_then(Value::as_str)
                    .filter(|n| !n.is_empty())
                {
                    Some(n) => n.to_string(),
                    None => match body
                        .pointer("/metadata/generateName")
                        .and_then(Value::as_str)
                    {
                        Some(g) => format!("{g}{}", random_suffix()),
                        None => {
                            return Err(ApiError::invalid(
                                &kind_group,
                                "",
                                &[(
                                    "metadata.name".into(),
                                    "Required value: name or generateName is required".into(),
                                )],
                            ));
                        }
                    },
                }
            }
            (_, Some(n)) => {
                if let Some(bn) = body.pointer("/metadata/name").and_then(Value::as_str)
                    && !bn.is_empty()
                    && bn != n
                {
                    return Err(ApiError::BadRequest(format!(
                        "the name of the object ({bn}) does not match the name on the URL ({n})"
                    )));
                }
                n.clone()
            }
            (_, None) => {
                return Err(ApiError::MethodNotAllowed(
                    "a name is required for this request".into(),
                ));
            }
        };
        let ns = if rt.namespaced {
            req.namespace.clone()
        } else {
            String::new()
        };
        let live = self.store.read().get(&key, &ns, &name);
        let shape_schema = rt.schema.clone();
        let shape = Shape::root(shape_schema.as_deref());
        let w = Write {
            manager: &manager,
            subresource: &sub,
            api_version: &api_version,
            scope,
            now: &now,
            qualified: &qualified,
            name: &name,
        };
        let mut is_apply = false;
        let mut new = match op {
            Op::Create => {
                if live.is_some() {
                    return Err(ApiError::already_exists(&qualified, &name));
                }
                if scope == Scope::StatusOnly {
                    return Err(ApiError::not_found(&qualified, &name));
                }
                body.clone()
            }
            Op::Update => {
                let Some(l) = &live else {
                    return Err(ApiError::not_found(&qualified, &name));
                };
                let body_rv = body
                    .pointer("/metadata/resourceVersion")
                    .and_then(Value::as_str)
                    .unwrap_or_default();
                let live_rv = l
                    .pointer("/metadata/resourceVersion")
                    .and_then(Value::as_str)
                    .unwrap_or_default();
                if !body_rv.is_empty() && body_rv != live_rv {
                    return Err(ApiError::stale(&qualified, &name));
                }
                body.clone()
            }
            Op::Patch(kind) => match kind {
                PatchKind::Apply => {
                    is_apply = true;
                    if live.is_none() && scope == Scope::StatusOnly {
                        return Err(ApiError::not_found(&qualified, &name));
                    }
                    // A resourceVersion in the configuration is a precondition (a fenced write).
                    let body_rv = body
                        .pointer("/metadata/resourceVersion")
                        .and_then(Value::as_str)
                        .unwrap_or_default();
                    if !body_rv.is_empty() {
                        let live_rv = live
                            .as_ref()
                            .and_then(|l| l.pointer("/metadata/resourceVersion"))
                            .and_then(Value::as_str);
                        match live_rv {
                            None => return Err(ApiError::not_found(&qualified, &name)),
                            Some(rv) if rv != body_rv => {
                                return Err(ApiError::stale(&qualified, &name));
                            }
                            Some(_) => {}
                        }
                    }
                    let force = req.q("force") == Some("true");
                    managed::apply(live.as_deref(), body, shape, &w, force)?
                }
                other => {
                    let Some(l) = &live else {
                        return Err(ApiError::not_found(&qualified, &name));
                    };
                    let mut v = (**l).clone();
                    match other {
                        PatchKind::Merge => patch::merge_patch(&mut v, body),
                        PatchKind::Json => patch::json_patch(&mut v, body)?,
                        _ => patch::strategic_merge(&mut v, body),
                    }
                    let patched_rv = v
                        .pointer("/metadata/resourceVersion")
                        .and_then(Value::as_str)
                        .unwrap_or_default();
                    let live_rv = l
                        .pointer("/metadata/resourceVersion")
                        .and_then(Value::as_str)
                        .unwrap_or_default();
                    if !patched_rv.is_empty() && patched_rv != live_rv {
                        return Err(ApiError::stale(&qualified, &name));
                    }
                    v
                }
            },
        };
        let created = live.is_none();
        // Identity and system fields.
        if !new.get("metadata").is_some_and(Value::is_object) {
            new["metadata"] = json!({});
        }
        new["apiVersion"] = json!(api_version);
        new["kind"] = json!(rt.kind);
        new["metadata"]["name"] = json!(name);
        if rt.namespaced {
            new["metadata"]["namespace"] = json!(ns);
        } else if let Some(m) = new["metadata"].as_object_mut() {
            m.remove("namespace");
        }
        restrict(live.as_deref(), &mut new, scope);
        {
            let m = new["metadata"].as_object_mut().expect("metadata object");
            match &live {
                Some(l) => {
                    for f in [
                        "uid",
                        "creationTimestamp",
                        "deletionTimestamp",
                        "deletionGracePeriodSeconds",
                        "generation",
                    ] {
                        match l.pointer(&format!("/metadata/{f}")) {
                            Some(v) => m.insert(f.into(), v.clone()),
                            None => m.remove(f),
                        };
                    }
                }
                None => {
                    m.insert("uid".into(), json!(uuid::Uuid::new_v4().to_string()));
                    m.insert("creationTimestamp".into(), json!(now));
                    m.remove("deletionTimestamp");
                    m.remove("deletionGracePeriodSeconds");
                    m.remove("resourceVersion");
                    if rt.tracks_generation {
                        m.insert("generation".into(), json!(1));
                    } else {
                        m.remove("generation");
                    }
                }
            }
        }
        if created {
            initial_status(&rt, &mut new);
        }
        if !is_apply {
            managed::record_update(live.as_deref(), &mut new, shape, &w);
        }
        if let Some(l) = &live
            && rt.tracks_generation
            && spec_changed(l, &new, rt.has_status)
        {
            {
                let g = l
                    .pointer("/metadata/generation")
                    .and_then(Value::as_i64)
                    .unwrap_or(0);
                new["metadata"]["generation"] = json!(g + 1);
            }
        }
        if let Some(check) = self.check_for(&rt) {
            // apiVersion, kind and metadata are never pruned or defaulted by a CRD schema.
            let metadata = new.get("metadata").cloned();
            check.default_and_prune(&mut new);
            if let (Some(m), Some(obj)) = (metadata, new.as_object_mut()) {
                obj.insert("metadata".into(), m);
                obj.insert("apiVersion".into(), json!(api_version));
                obj.insert("kind".into(), json!(rt.kind));
            }
            let errs = check.validate(&new, live.as_deref());
            if !errs.is_empty() {
                return Err(ApiError::from_status(validation::invalid_status(
                    &qualified, &rt.kind, &name, &errs,
                )));
            }
        }
        if rt.group == "apiextensions.k8s.io" && rt.plural == "customresourcedefinitions" {
            let types = crate::resources::from_crd(&new).map_err(|e| {
                ApiError::invalid(&kind_group, &name, &[(String::new(), e.to_string())])
            })?;
            Self::compile_crd(&name, &types)?;
        }
        // A write that changes nothing is not a write.
        let unchanged = live.as_ref().is_some_and(|l| {
            let mut probe = new.clone();
            probe["metadata"]["resourceVersion"] = l["metadata"]["resourceVersion"].clone();
            probe == **l
        });
        let mut inner = self.store.write();
        let current = inner.get(&key, &ns, &name);
        let same = match (&current, &live) {
            (Some(c), Some(l)) => Arc::ptr_eq(c, l),
            (None, None) => true,
            _ => false,
        };
        if !same || (rt.namespaced && !Self::namespace_exists(&inner, &req.namespace)) {
            // Raced with another write (or the namespace went): compute again.
            drop(inner);
            return if same {
                Err(ApiError::not_found("namespaces", &req.namespace))
            } else {
                Ok(None)
            };
        }
        self.admit(
            &inner,
            &req.user,
            &rt,
            if created { "CREATE" } else { "UPDATE" },
            &sub,
            &ns,
            &name,
            Some(&new),
            live.as_deref(),
            req.dry_run(),
        )?;
        if let (true, Some(l)) = (unchanged, &live) {
            return Ok(Some((false, Self::present(&rt, l))));
        }
        if req.dry_run() {
            return Ok(Some((created, Arc::new(new))));
        }
        // Finalizers cleared on an object being deleted: it goes now.
        let finalizing = new.pointer("/metadata/deletionTimestamp").is_some()
            && new
                .pointer("/metadata/finalizers")
                .and_then(Value::as_array)
                .is_none_or(Vec::is_empty);
        let stored = if finalizing {
            inner.put(&key, new);
            inner.remove(&key, &ns, &name).expect("just stored")
        } else {
            inner.put(&key, new)
        };
        drop(inner);
        self.after_write(&rt, &stored, finalizing);
        if finalizing {
            self.collect_dependents(&stored);
        }
        Ok(Some((created, Self::present(&rt, &stored))))
    }

    /// DELETE one object: finalizers hold it with a deletionTimestamp, otherwise it goes.
    pub fn delete(&self, req: &Req, body: &Value) -> Result<Arc<Value>, ApiError> {
        self.authorize(&req.user, &self.attrs(req, "delete"), Some(&req.rt))?;
        let name = req.name.clone().unwrap_or_default();
        let out = self.delete_one(
            &req.rt,
            &req.namespace,
            &name,
            body,
            req.dry_run(),
            &req.user,
        )?;
        Ok(Self::present(&req.rt, &out))
    }

    fn delete_one(
        &self,
        rt: &Arc<ResourceType>,
        ns: &str,
        name: &str,
        body: &Value,
        dry_run: bool,
        user: &UserInfo,
    ) -> Result<Arc<Value>, ApiError> {
        let key = rt.table();
        let qualified = rt.qualified();
        let mut inner = self.store.write();
        let live = inner
            .get(&key, ns, name)
            .ok_or_else(|| ApiError::not_found(&qualified, name))?;
        if let Some(uid) = body.pointer("/preconditions/uid").and_then(Value::as_str) {
            let actual = live
                .pointer("/metadata/uid")
                .and_then(Value::as_str)
                .unwrap_or_default();
            if uid != actual {
                return Err(ApiError::Conflict {
                    message: format!(
                        "Operation cannot be fulfilled on {qualified} \"{name}\": Precondition failed: UID in precondition: {uid}, UID in object meta: {actual}"
                    ),
                    details: json!({"name": name, "kind": rt.plural}),
                });
            }
        }
        if let Some(rv) = body
            .pointer("/preconditions/resourceVersion")
            .and_then(Value::as_str)
        {
            let actual = live
                .pointer("/metadata/resourceVersion")
                .and_then(Value::as_str)
                .unwrap_or_default();
            if rv != actual {
                return Err(ApiError::Conflict {
                    message: format!(
                        "Operation cannot be fulfilled on {qualified} \"{name}\": Precondition failed: ResourceVersion in precondition: {rv}, ResourceVersion in object meta: {actual}"
                    ),
                    details: json!({"name": name, "kind": rt.plural}),
                });
            }
        }
        self.admit(
            &inner,
            user,
            rt,
            "DELETE",
            "",
            ns,
            name,
            None,
            Some(&live),
            dry_run,
        )?;
        if dry_run {
            return Ok(live);
        }
        let has_finalizers = live
            .pointer("/metadata/finalizers")
            .and_then(Value::as_array)
            .is_some_and(|f| !f.is_empty());
        if has_finalizers {
            if live.pointer("/metadata/deletionTimestamp").is_some() {
                return Ok(live);
            }
            let mut v = (*live).clone();
            v["metadata"]["deletionTimestamp"] = json!(now_rfc3339());
            v["metadata"]["deletionGracePeriodSeconds"] = json!(0);
            if let Some(g) = v.pointer("/metadata/generation").and_then(Value::as_i64) {
                v["metadata"]["generation"] = json!(g + 1);
            }
            let stored = inner.put(&key, v);
            return Ok(stored);
        }
        let gone = inner.remove(&key, ns, name).expect("present");
        drop(inner);
        if rt.group.is_empty() && rt.plural == "namespaces" {
            self.empty_namespace(name);
        }
        self.after_write(rt, &gone, true);
        if body.get("propagationPolicy").and_then(Value::as_str) != Some("Orphan") {
            self.collect_dependents(&gone);
        }
        Ok(gone)
    }

    /// Background garbage collection after `owner` is gone: a dependent whose only owner it was
    /// is deleted (and its own dependents after it); a dependent with other owners loses the
    /// dangling reference.
    fn collect_dependents(&self, owner: &Value) {
        let Some(uid) = owner.pointer("/metadata/uid").and_then(Value::as_str) else {
            return;
        };
        let owner_ns = key_of(owner).0;
        let types: Vec<Arc<ResourceType>> = {
            let reg = self.registry.read().unwrap_or_else(|p| p.into_inner());
            let mut seen = std::collections::BTreeSet::new();
            reg.all()
                .filter(|t| seen.insert(t.table()))
                .cloned()
                .collect()
        };
        let mut dependents = Vec::new();
        {
            let r = self.store.read();
            for t in &types {
                // Namespaced owners only own objects of their namespace.
                let ns = match (owner_ns.is_empty(), t.namespaced) {
                    (true, _) => None,
                    (false, true) => Some(owner_ns.as_str()),
                    (false, false) => continue,
                };
                if let Some(tb) = r.table(&t.table()) {
                    dependents.extend(
                        tb.owned_by(uid)
                            .into_iter()
                            .filter(|(n, _)| ns.is_none_or(|ns| n == ns))
                            .map(|k| (t.clone(), k)),
                    );
                }
            }
        }
        let collector = UserInfo::service_account("kube-system", "generic-garbage-collector");
        for (t, (ns, name)) in dependents {
            let remaining: Option<Vec<Value>> = {
                let mut inner = self.store.write();
                let Some(live) = inner.get(&t.table(), &ns, &name) else {
                    continue;
                };
                let refs: Vec<Value> = live
                    .pointer("/metadata/ownerReferences")
                    .and_then(Value::as_array)
                    .map(|refs| {
                        refs.iter()
                            .filter(|r| r.get("uid").and_then(Value::as_str) != Some(uid))
                            .cloned()
                            .collect()
                    })
                    .unwrap_or_default();
                if refs.is_empty() {
                    None
                } else {
                    let mut v = (*live).clone();
                    v["metadata"]["ownerReferences"] = Value::Array(refs.clone());
                    inner.put(&t.table(), v);
                    Some(refs)
                }
            };
            if remaining.is_none() {
                let _ = self.delete_one(&t, &ns, &name, &Value::Null, false, &collector);
            }
        }
    }

    /// Deletes every namespaced object in a deleted namespace.
    fn empty_namespace(&self, ns: &str) {
        let types: Vec<Arc<ResourceType>> = {
            let reg = self.registry.read().unwrap_or_else(|p| p.into_inner());
            let mut seen = std::collections::BTreeSet::new();
            reg.all()
                .filter(|t| t.namespaced && seen.insert(t.table()))
                .cloned()
                .collect()
        };
        for t in types {
            let names: Vec<String> = {
                let r = self.store.read();
                r.table(&t.table())
                    .map(|tb| tb.iter_ns(Some(ns)).map(|o| key_of(o).1).collect())
                    .unwrap_or_default()
            };
            for n in names {
                // Everything in the namespace goes anyway: no per-object collection pass.
                let orphan = json!({"propagationPolicy": "Orphan"});
                let _ = self.delete_one(&t, ns, &n, &orphan, false, &UserInfo::admin());
            }
        }
    }

    /// DELETE on a collection, honouring selectors.
    pub fn delete_collection(&self, req: &Req) -> Result<Vec<Arc<Value>>, ApiError> {
        self.authorize(
            &req.user,
            &self.attrs(req, "deletecollection"),
            Some(&req.rt),
        )?;
        let mut q = req.clone();
        q.query.remove("limit");
        q.query.remove("continue");
        let matches = selectors(&q.query)?;
        let keys: Vec<(String, String)> = {
            let r = self.store.read();
            let ns = (!req.namespace.is_empty()).then_some(req.namespace.as_str());
            r.table(&req.rt.table())
                .map(|t| {
                    t.iter_ns(ns)
                        .filter(|o| matches(o))
                        .map(|o| key_of(o))
                        .collect()
                })
                .unwrap_or_default()
        };
        let mut out = Vec::new();
        for (ns, name) in keys {
            if let Ok(o) =
                self.delete_one(&req.rt, &ns, &name, &Value::Null, req.dry_run(), &req.user)
            {
                out.push(Self::present(&req.rt, &o));
            }
        }
        Ok(out)
    }

    /// POST pods/<name>/eviction: refused with 429 while a matching PodDisruptionBudget allows no
    /// disruption; otherwise the budget's `disruptionsAllowed` is decremented and the pod deleted.
    pub fn evict(&self, req: &Req) -> Result<Value, ApiError> {
        self.authorize(&req.user, &self.attrs(req, "create"), Some(&req.rt))?;
        let name = req.name.clone().unwrap_or_default();
        let pods = table("", "pods");
        let pdbs = table("policy", "poddisruptionbudgets");
        {
            let mut inner = self.store.write();
            let pod = inner
                .get(&pods, &req.namespace, &name)
                .ok_or_else(|| ApiError::not_found("pods", &name))?;
            let labels = pod.pointer("/metadata/labels").cloned();
            let matching: Vec<Arc<Value>> = inner
                .table(&pdbs)
                .map(|t| {
                    t.iter_ns(Some(&req.namespace))
                        .filter(|p| {
                            selector::label_selector_object_matches(
                                p.pointer("/spec/selector").unwrap_or(&Value::Null),
                                labels.as_ref(),
                            )
                        })
                        .cloned()
                        .collect()
                })
                .unwrap_or_default();
            if matching.len() > 1 {
                return Err(ApiError::Internal(
                    "This pod has more than one PodDisruptionBudget, which the eviction subresource does not support.".into(),
                ));
            }
            if let Some(pdb) = matching.first() {
                let allowed = pdb
                    .pointer("/status/disruptionsAllowed")
                    .and_then(Value::as_i64)
                    .unwrap_or(0);
                let pdb_name = key_of(pdb).1;
                let observed = pdb
                    .pointer("/status/observedGeneration")
                    .and_then(Value::as_i64)
                    .unwrap_or(0);
                let generation = pdb
                    .pointer("/metadata/generation")
                    .and_then(Value::as_i64)
                    .unwrap_or(0);
                if observed < generation {
                    return Err(ApiError::TooManyRequests {
                        message:
                            "Cannot evict pod as it would violate the pod's disruption budget."
                                .into(),
                        details: json!({"retryAfterSeconds": 0, "causes": [{
                            "reason": "DisruptionBudget",
                            "message": format!("The disruption budget {pdb_name} is still being processed by the server."),
                        }]}),
                    });
                }
                if allowed < 0 {
                    return Err(ApiError::Forbidden {
                        message: "pdb disruptions allowed is negative".into(),
                        details: json!({"name": name, "kind": "pods"}),
                    });
                }
                if allowed == 0 {
                    let desired = pdb
                        .pointer("/status/desiredHealthy")
                        .and_then(Value::as_i64)
                        .unwrap_or(0);
                    let current = pdb
                        .pointer("/status/currentHealthy")
                        .and_then(Value::as_i64)
                        .unwrap_or(0);
                    return Err(ApiError::TooManyRequests {
                        message:
                            "Cannot evict pod as it would violate the pod's disruption budget."
                                .into(),
                        details: json!({"retryAfterSeconds": 0, "causes": [{
                            "reason": "DisruptionBudget",
                            "message": format!("The disruption budget {pdb_name} needs {desired} healthy pods and has {current} currently"),
                        }]}),
                    });
                }
                if !req.dry_run() {
                    let mut p = (**pdb).clone();
                    p["status"]["disruptionsAllowed"] = json!(allowed - 1);
                    p["status"]["disruptedPods"][name.as_str()] = json!(now_rfc3339());
                    inner.put(&pdbs, p);
                }
            }
        }
        if !req.dry_run() {
            self.delete_one(
                &req.rt,
                &req.namespace,
                &name,
                &Value::Null,
                false,
                &req.user,
            )?;
        }
        Ok(
            json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201}),
        )
    }

    /// Registers a bearer token for a user.
    pub fn add_token(&self, token: String, user: UserInfo) {
        self.tokens
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .insert(token, user);
    }

    /// Loads a CRD (or any object) as the administrator would create it.
    pub fn create_as_admin(
        &self,
        group: &str,
        version: &str,
        plural: &str,
        obj: Value,
    ) -> Result<Arc<Value>, ApiError> {
        let rt = self
            .resource(group, version, plural)
            .ok_or_else(|| ApiError::NotFound {
                message: format!(
                    "the server could not find the requested resource ({plural}.{group})"
                ),
                details: Value::Null,
            })?;
        let ns = obj
            .pointer("/metadata/namespace")
            .and_then(Value::as_str)
            .unwrap_or("default")
            .to_string();
        let req = Req {
            rt: rt.clone(),
            namespace: if rt.namespaced { ns } else { String::new() },
            name: None,
            subresource: None,
            query: HashMap::new(),
            user: UserInfo::admin(),
            user_agent: "kube-emulator".into(),
        };
        self.create(&req, obj)
    }

    /// Every served CRD resource, grouped by group/version.
    pub fn group_versions(&self) -> BTreeMap<String, Vec<Arc<ResourceType>>> {
        let mut out: BTreeMap<String, Vec<Arc<ResourceType>>> = BTreeMap::new();
        for t in self
            .registry
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .all()
        {
            out.entry(t.api_version()).or_default().push(t.clone());
        }
        out
    }
}

/// Policy parameters read from the store.
struct StoreParams<'a> {
    inner: &'a Inner,
    registry: &'a Registry,
}

impl admission::ParamSource for StoreParams<'_> {
    fn params(
        &self,
        api_version: &str,
        kind: &str,
        namespace: Option<&str>,
        name: Option<&str>,
        selector: Option<&Value>,
    ) -> Vec<Value> {
        let (group, version) = api_version.rsplit_once('/').unwrap_or(("", api_version));
        let Some(rt) = self
            .registry
            .all()
            .find(|t| t.group == group && t.version == version && t.kind == kind)
        else {
            return Vec::new();
        };
        let Some(t) = self.inner.table(&rt.table()) else {
            return Vec::new();
        };
        t.iter_ns(namespace)
            .filter(|o| name.is_none_or(|n| key_of(o).1 == n))
            .filter(|o| {
                selector.is_none_or(|s| {
                    selector::label_selector_object_matches(s, o.pointer("/metadata/labels"))
                })
            })
            .map(|o| (**o).clone())
            .collect()
    }
}

fn new_namespace(name: &str) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Namespace",
        "metadata": {"name": name, "uid": uuid::Uuid::new_v4().to_string(), "creationTimestamp": now_rfc3339(),
            "labels": {"kubernetes.io/metadata.name": name}},
        "spec": {"finalizers": ["kubernetes"]},
        "status": {"phase": "Active"}
    })
}

/// Status the emulator's missing controllers would write at creation.
fn initial_status(rt: &ResourceType, obj: &mut Value) {
    match (rt.group.as_str(), rt.plural.as_str()) {
        ("", "namespaces") => {
            obj["status"] = json!({"phase": "Active"});
            let name = obj["metadata"]["name"].clone();
            obj["metadata"]["labels"]["kubernetes.io/metadata.name"] = name;
        }
        ("apiextensions.k8s.io", "customresourcedefinitions") => {
            let names = obj.pointer("/spec/names").cloned().unwrap_or(json!({}));
            let stored: Vec<Value> = obj
                .pointer("/spec/versions")
                .and_then(Value::as_array)
                .map(|vs| {
                    vs.iter()
                        .filter(|v| v.get("storage") == Some(&json!(true)))
                        .filter_map(|v| v.get("name").cloned())
                        .collect()
                })
                .unwrap_or_default();
            let now = now_rfc3339();
            obj["status"] = json!({
                "acceptedNames": names,
                "storedVersions": stored,
                "conditions": [
                    {"type": "NamesAccepted", "status": "True", "reason": "NoConflicts", "message": "no conflicts found", "lastTransitionTime": now},
                    {"type": "Established", "status": "True", "reason": "InitialNamesAccepted", "message": "the initial names have been accepted", "lastTransitionTime": now},
                ],
            });
        }
        _ => {}
    }
}

/// Keeps a write within its scope: status only through the status subresource, nothing but
/// status through it.
fn restrict(live: Option<&Value>, new: &mut Value, scope: Scope) {
    match scope {
        Scope::Everything => {}
        Scope::NotStatus => {
            let status = live.and_then(|l| l.get("status")).cloned();
            let m = new.as_object_mut().expect("object");
            match status {
                Some(s) => m.insert("status".into(), s),
                None => m.remove("status"),
            };
        }
        Scope::StatusOnly => {
            let Some(l) = live else { return };
            let mut out = l.clone();
            let o = out.as_object_mut().expect("object");
            match new.get("status") {
                Some(s) => o.insert("status".into(), s.clone()),
                None => o.remove("status"),
            };
            if let Some(mf) = new.pointer("/metadata/managedFields") {
                out["metadata"]["managedFields"] = mf.clone();
            }
            out["metadata"]["resourceVersion"] = l["metadata"]["resourceVersion"].clone();
            *new = out;
        }
    }
}

/// Whether anything but metadata (and status, for kinds with the subresource) changed.
fn spec_changed(old: &Value, new: &Value, has_status: bool) -> bool {
    let relevant = |v: &Value| -> BTreeMap<String, Value> {
        v.as_object()
            .map(|m| {
                m.iter()
                    .filter(|(k, _)| {
                        !(matches!(k.as_str(), "metadata" | "apiVersion" | "kind")
                            || (has_status && *k == "status"))
                    })
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect()
            })
            .unwrap_or_default()
    };
    relevant(old) != relevant(new)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spec_changes_table() {
        let base =
            json!({"metadata": {"labels": {"a": "b"}}, "spec": {"x": 1}, "status": {"s": 1}});
        let cases = [
            (
                json!({"metadata": {"labels": {"a": "c"}}, "spec": {"x": 1}, "status": {"s": 1}}),
                true,
                false,
            ),
            (
                json!({"metadata": {}, "spec": {"x": 1}, "status": {"s": 2}}),
                true,
                false,
            ),
            (
                json!({"metadata": {}, "spec": {"x": 1}, "status": {"s": 2}}),
                false,
                true,
            ),
            (
                json!({"metadata": {}, "spec": {"x": 2}, "status": {"s": 1}}),
                true,
                true,
            ),
        ];
        for (new, has_status, want) in cases {
            assert_eq!(
                spec_changed(&base, &new, has_status),
                want,
                "{new} has_status={has_status}"
            );
        }
    }

    #[test]
    fn continue_tokens_round_trip() {
        let t = hex("ns\u{0}name");
        assert_eq!(unhex(&t).unwrap(), "ns\u{0}name");
        assert!(unhex("zz").is_none());
    }

    #[test]
    fn restrict_keeps_status_out_of_the_main_resource() {
        let live =
            json!({"metadata": {"resourceVersion": "3"}, "spec": {"a": 1}, "status": {"ok": true}});
        let mut main = json!({"metadata": {}, "spec": {"a": 2}, "status": {"ok": false}});
        restrict(Some(&live), &mut main, Scope::NotStatus);
        assert_eq!(main["status"], json!({"ok": true}));
        let mut st = json!({"metadata": {}, "spec": {"a": 9}, "status": {"ok": false}});
        restrict(Some(&live), &mut st, Scope::StatusOnly);
        assert_eq!(st["spec"], json!({"a": 1}));
        assert_eq!(st["status"], json!({"ok": false}));
    }
}
