//! The ApplicationSet controller: generates parameters (cluster and clusterDecisionResource
//! generators), renders Applications, and creates, updates and deletes them as
//! `applicationsSync` allows, keeping `ignoreApplicationDifferences` fields; reports
//! `status.conditions` and `status.resources`; honours the refresh annotation (and removes it).
//!
//! It writes only Applications it owns (ownerReference to the ApplicationSet) and the
//! ApplicationSet's status and refresh annotation. A generator error changes no Application.

use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{
    ApiResource, DeleteParams, DynamicObject, GroupVersionKind, ListParams, Patch, PatchParams,
    PostParams,
};
use kube::{Api, Client, ResourceExt};
use serde_json::{Value, json};

use crate::app_controller::application_resource;
use crate::clusters::Clusters;
use crate::driver::Next;
use crate::error::ArgoCdError;
use crate::generators::{self, AppAction, ClusterInfo, Params};
use crate::types::*;

/// Condition types and reasons of `ApplicationSet.status.conditions`.
pub mod conditions {
    /// An error occurred while generating.
    pub const ERROR_OCCURRED: &str = "ErrorOccurred";
    /// Parameters were generated.
    pub const PARAMETERS_GENERATED: &str = "ParametersGenerated";
    /// Applications match the generated ones.
    pub const RESOURCES_UP_TO_DATE: &str = "ResourcesUpToDate";
    /// Reason: all fine.
    pub const REASON_UP_TO_DATE: &str = "ApplicationSetUpToDate";
    /// Reason: generation failed.
    pub const REASON_GENERATION_ERROR: &str = "ApplicationGenerationFromParamsError";
    /// Reason: parameters generated.
    pub const REASON_PARAMETERS_GENERATED: &str = "ParametersGenerated";
    /// Reason: an error occurred.
    pub const REASON_ERROR_OCCURRED: &str = "ErrorOccurred";
}

/// The `ApiResource` of ApplicationSets.
pub fn application_set_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk(GROUP, VERSION, "ApplicationSet"),
        "applicationsets",
    )
}

fn now() -> String {
    jiff::Timestamp::now()
        .round(jiff::Unit::Second)
        .map(|t| t.to_string())
        .unwrap_or_default()
}

pub(crate) struct AppSetCtx {
    pub(crate) client: Client,
    pub(crate) appsets: Api<DynamicObject>,
    pub(crate) apps: Api<DynamicObject>,
    pub(crate) namespace: String,
    pub(crate) resync: std::time::Duration,
    pub(crate) clusters: Arc<Clusters>,
}

impl AppSetCtx {
    pub(crate) fn new(
        mgmt: Client,
        namespace: &str,
        resync: std::time::Duration,
        clusters: Arc<Clusters>,
    ) -> Self {
        AppSetCtx {
            appsets: Api::namespaced_with(mgmt.clone(), namespace, &application_set_resource()),
            apps: Api::namespaced_with(mgmt.clone(), namespace, &application_resource()),
            client: mgmt,
            namespace: namespace.to_string(),
            resync,
            clusters,
        }
    }

    fn generator_error(&self, appset: &str, reason: impl Into<String>) -> ArgoCdError {
        ArgoCdError::Generator {
            application_set: format!("{}/{appset}", self.namespace),
            reason: reason.into(),
        }
    }

    async fn duck_params(
        &self,
        appset: &str,
        generator: &DuckGenerator,
        clusters: &[ClusterInfo],
    ) -> Result<Vec<Params>, ArgoCdError> {
        let cms: Api<ConfigMap> = Api::namespaced(self.client.clone(), &self.namespace);
        let cm = cms
            .get_opt(&generator.config_map_ref)
            .await
            .map_err(|e| {
                ArgoCdError::kube(format!("reading ConfigMap {}", generator.config_map_ref), e)
            })?
            .ok_or_else(|| {
                self.generator_error(
                    appset,
                    format!(
                        "ConfigMap {}/{} (configMapRef) does not exist",
                        self.namespace, generator.config_map_ref
                    ),
                )
            })?;
        let config =
            generators::duck_config(&generator.config_map_ref, &cm.data.unwrap_or_default())
                .map_err(|r| self.generator_error(appset, r))?;
        generators::check_duck_selection(generator).map_err(|r| self.generator_error(appset, r))?;
        let (group, version) = config.api_version.split_once('/').unwrap_or_default();
        let ar = ApiResource::from_gvk_with_plural(
            &GroupVersionKind::gvk(group, version, ""),
            &config.resource,
        );
        let api: Api<DynamicObject> =
            Api::namespaced_with(self.client.clone(), &self.namespace, &ar);
        let lp = if generator.name.is_empty() {
            ListParams::default().labels(&generator.label_selector.to_query())
        } else {
            ListParams::default().fields(&format!("metadata.name={}", generator.name))
        };
        let list = api.list(&lp).await.map_err(|e| {
            self.generator_error(
                appset,
                format!(
                    "failed to get dynamic resources {}/{}: {e}",
                    config.api_version, config.resource
                ),
            )
        })?;
        let resources: Vec<Value> = list
            .items
            .iter()
            .map(|o| serde_json::to_value(o).unwrap_or(Value::Null))
            .collect();
        generators::duck_params(generator, &config, &resources, clusters)
            .map_err(|r| self.generator_error(appset, r))
    }

    /// The Applications the ApplicationSet should have.
    async fn generate(
        &self,
        appset: &DynamicObject,
        spec: &ApplicationSetSpec,
    ) -> Result<Vec<Value>, ArgoCdError> {
        let name = appset.name_any();
        let (clusters, _) = self.clusters.list().await?;
        let infos: Vec<ClusterInfo> = clusters.iter().map(|c| c.info.clone()).collect();
        let preserve = spec
            .sync_policy
            .as_ref()
            .is_some_and(|p| p.preserve_resources_on_deletion);
        let mut out = Vec::new();
        for generator in &spec.generators {
            let (params, override_template) = if let Some(g) = &generator.clusters {
                (generators::cluster_params(g, &infos), g.template.clone())
            } else if let Some(g) = &generator.cluster_decision_resource {
                (
                    self.duck_params(&name, g, &infos).await?,
                    g.template.clone(),
                )
            } else {
                let kinds: Vec<&String> = generator.other.keys().collect();
                return Err(self.generator_error(&name, format!("generator {kinds:?} is not simulated; use clusters or clusterDecisionResource")));
            };
            let template = match &override_template {
                Some(o) => generators::merge_template(&spec.template, o),
                None => spec.template.clone(),
            };
            for p in params {
                let rendered =
                    generators::render(&template, &p, spec.go_template).map_err(|reason| {
                        ArgoCdError::Template {
                            application_set: format!("{}/{name}", self.namespace),
                            reason,
                        }
                    })?;
                out.push(self.application(appset, &rendered, preserve)?);
            }
        }
        Ok(out)
    }

    fn application(
        &self,
        appset: &DynamicObject,
        rendered: &Value,
        preserve: bool,
    ) -> Result<Value, ArgoCdError> {
        let meta = rendered.get("metadata").cloned().unwrap_or(json!({}));
        let name = meta.get("name").and_then(Value::as_str).unwrap_or_default();
        if name.is_empty() {
            return Err(ArgoCdError::Template {
                application_set: format!("{}/{}", self.namespace, appset.name_any()),
                reason: "the rendered template has no metadata.name".into(),
            });
        }
        let mut finalizers: Vec<Value> = meta
            .get("finalizers")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        if finalizers.is_empty() && !preserve {
            finalizers.push(json!(RESOURCES_FINALIZER));
        }
        let mut metadata = json!({
            "name": name,
            "namespace": self.namespace,
            "ownerReferences": [{
                "apiVersion": format!("{GROUP}/{VERSION}"), "kind": "ApplicationSet",
                "name": appset.name_any(), "uid": appset.uid().unwrap_or_default(),
                "controller": true, "blockOwnerDeletion": true,
            }],
        });
        for key in ["labels", "annotations"] {
            if let Some(v) = meta
                .get(key)
                .filter(|v| v.as_object().is_some_and(|m| !m.is_empty()))
            {
                metadata[key] = v.clone();
            }
        }
        if !finalizers.is_empty() {
            metadata["finalizers"] = json!(finalizers);
        }
        Ok(json!({
            "apiVersion": format!("{GROUP}/{VERSION}"),
            "kind": "Application",
            "metadata": metadata,
            "spec": rendered.get("spec").cloned().unwrap_or(json!({})),
        }))
    }

    async fn execute(
        &self,
        appset: &DynamicObject,
        actions: Vec<AppAction>,
        preserve: bool,
    ) -> Result<(), ArgoCdError> {
        let pp = PostParams {
            field_manager: Some(APPSET_FIELD_MANAGER.into()),
            ..Default::default()
        };
        for action in actions {
            match action {
                AppAction::Create(app) => {
                    let obj: DynamicObject =
                        serde_json::from_value(app).map_err(|e| ArgoCdError::Template {
                            application_set: appset.name_any(),
                            reason: format!("rendered Application is not an object: {e}"),
                        })?;
                    match self.apps.create(&pp, &obj).await {
                        Ok(_) => {
                            tracing::info!(application_set = %appset.name_any(), application = %obj.name_any(), "created Application")
                        }
                        Err(kube::Error::Api(s)) if s.code == 409 => {
                            return Err(ArgoCdError::Template {
                                application_set: appset.name_any(),
                                reason: format!(
                                    "Application {} already exists and is not owned by this ApplicationSet; rename it in the template or delete it",
                                    obj.name_any()
                                ),
                            });
                        }
                        Err(e) => {
                            return Err(ArgoCdError::kube(
                                format!("creating Application {}", obj.name_any()),
                                e,
                            ));
                        }
                    }
                }
                AppAction::Update(target) => {
                    let name = target
                        .pointer("/metadata/name")
                        .and_then(Value::as_str)
                        .unwrap_or_default()
                        .to_string();
                    let Some(mut live) =
                        self.apps.get_opt(&name).await.map_err(|e| {
                            ArgoCdError::kube(format!("reading Application {name}"), e)
                        })?
                    else {
                        continue;
                    };
                    live.data["spec"] = target.get("spec").cloned().unwrap_or(json!({}));
                    for key in ["labels", "annotations"] {
                        if let Some(m) = target
                            .pointer(&format!("/metadata/{key}"))
                            .and_then(Value::as_object)
                        {
                            let field = if key == "labels" {
                                &mut live.metadata.labels
                            } else {
                                &mut live.metadata.annotations
                            };
                            let map = field.get_or_insert_with(BTreeMap::new);
                            for (k, v) in m {
                                map.insert(k.clone(), v.as_str().unwrap_or_default().to_string());
                            }
                        }
                    }
                    match self.apps.replace(&name, &pp, &live).await {
                        Ok(_) => {
                            tracing::info!(application_set = %appset.name_any(), application = %name, "updated Application")
                        }
                        Err(kube::Error::Api(s)) if s.code == 409 => {}
                        Err(e) => {
                            return Err(ArgoCdError::kube(
                                format!("updating Application {name}"),
                                e,
                            ));
                        }
                    }
                }
                AppAction::Delete(name) => {
                    if preserve {
                        // Without the resources finalizer, deleting the Application keeps its resources.
                        if let Some(live) = self.apps.get_opt(&name).await.map_err(|e| {
                            ArgoCdError::kube(format!("reading Application {name}"), e)
                        })? {
                            let kept: Vec<String> = live
                                .finalizers()
                                .iter()
                                .filter(|f| {
                                    *f != RESOURCES_FINALIZER
                                        && *f != RESOURCES_FINALIZER_BACKGROUND
                                })
                                .cloned()
                                .collect();
                            if kept.len() != live.finalizers().len() {
                                self.apps
                                    .patch(&name, &PatchParams::default(), &Patch::Merge(json!({"metadata": {"finalizers": kept}})))
                                    .await
                                    .map_err(|e| ArgoCdError::kube(format!("removing the resources finalizer of Application {name}"), e))?;
                            }
                        }
                    }
                    match self.apps.delete(&name, &DeleteParams::default()).await {
                        Ok(_) => {
                            tracing::info!(application_set = %appset.name_any(), application = %name, "deleted Application")
                        }
                        Err(kube::Error::Api(s)) if s.code == 404 => {}
                        Err(e) => {
                            return Err(ArgoCdError::kube(
                                format!("deleting Application {name}"),
                                e,
                            ));
                        }
                    }
                }
            }
        }
        Ok(())
    }

    async fn write_status(
        &self,
        appset: &DynamicObject,
        error: Option<&ArgoCdError>,
        owned: &[DynamicObject],
    ) -> Result<(), ArgoCdError> {
        use conditions::*;
        let now = now();
        let old = appset
            .data
            .pointer("/status/conditions")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        let cond = |t: &str, status: bool, reason: &str, message: &str| {
            let status = if status { "True" } else { "False" };
            let time = old
                .iter()
                .find(|c| c["type"] == t && c["status"] == status && c["reason"] == reason)
                .and_then(|c| c.get("lastTransitionTime").cloned())
                .unwrap_or(json!(now));
            json!({"type": t, "status": status, "reason": reason, "message": message, "lastTransitionTime": time})
        };
        let conditions = match error {
            None => vec![
                cond(
                    ERROR_OCCURRED,
                    false,
                    REASON_UP_TO_DATE,
                    "All applications have been generated successfully",
                ),
                cond(
                    PARAMETERS_GENERATED,
                    true,
                    REASON_PARAMETERS_GENERATED,
                    "Successfully generated parameters for all Applications",
                ),
                cond(
                    RESOURCES_UP_TO_DATE,
                    true,
                    REASON_UP_TO_DATE,
                    "All applications have been generated successfully",
                ),
            ],
            Some(e) => {
                let m = e.to_string();
                vec![
                    cond(ERROR_OCCURRED, true, REASON_GENERATION_ERROR, &m),
                    cond(PARAMETERS_GENERATED, false, REASON_ERROR_OCCURRED, &m),
                    cond(RESOURCES_UP_TO_DATE, false, REASON_GENERATION_ERROR, &m),
                ]
            }
        };
        let resources: Vec<Value> = owned
            .iter()
            .map(|a| {
                json!({
                    "group": GROUP, "version": VERSION, "kind": "Application",
                    "name": a.name_any(), "namespace": self.namespace,
                    "status": a.data.pointer("/status/sync/status").cloned().unwrap_or(json!("Unknown")),
                    "health": {"status": a.data.pointer("/status/health/status").cloned().unwrap_or(json!("Unknown"))},
                })
            })
            .collect();
        let current = appset.data.get("status").cloned().unwrap_or(json!({}));
        if current.get("resources") == Some(&json!(resources))
            && current.get("conditions") == Some(&json!(conditions))
        {
            return Ok(());
        }
        self.appsets
            .patch_status(
                &appset.name_any(),
                &PatchParams::default(),
                &Patch::Merge(
                    json!({"status": {"conditions": conditions, "resources": resources}}),
                ),
            )
            .await
            .map_err(|e| {
                ArgoCdError::kube(
                    format!("writing status of ApplicationSet {}", appset.name_any()),
                    e,
                )
            })?;
        Ok(())
    }

    async fn owned(&self, appset: &DynamicObject) -> Result<Vec<DynamicObject>, ArgoCdError> {
        let uid = appset.uid().unwrap_or_default();
        let list = self
            .apps
            .list(&ListParams::default())
            .await
            .map_err(|e| ArgoCdError::kube("listing Applications", e))?;
        let mut owned: Vec<DynamicObject> = list
            .items
            .into_iter()
            .filter(|a| {
                a.owner_references()
                    .iter()
                    .any(|o| o.uid == uid && o.kind == "ApplicationSet")
            })
            .collect();
        owned.sort_by_key(|a| a.name_any());
        Ok(owned)
    }

    async fn reconcile(&self, name: &str, uid: &str) -> Result<Next, ArgoCdError> {
        let requeue = Next::Requeue(self.resync);
        let Some(appset) = self
            .appsets
            .get_opt(name)
            .await
            .map_err(|e| ArgoCdError::kube(format!("reading ApplicationSet {name}"), e))?
        else {
            return Ok(Next::Gone);
        };
        if appset.uid().as_deref() != Some(uid) {
            // Recreated under the same name: the new object has its own worker.
            return Ok(Next::Gone);
        }
        if appset.metadata.deletion_timestamp.is_some() {
            return Ok(Next::Gone);
        }
        let result = self.generate_and_apply(&appset).await;
        let owned = self.owned(&appset).await?;
        self.write_status(&appset, result.as_ref().err(), &owned)
            .await?;
        if appset.annotations().contains_key(APPSET_REFRESH_ANNOTATION) {
            self.appsets
                .patch(
                    name,
                    &PatchParams::default(),
                    &Patch::Merge(
                        json!({"metadata": {"annotations": {APPSET_REFRESH_ANNOTATION: null}}}),
                    ),
                )
                .await
                .map_err(|e| {
                    ArgoCdError::kube(
                        format!("removing the refresh annotation of ApplicationSet {name}"),
                        e,
                    )
                })?;
        }
        if let Err(e) = result {
            tracing::warn!(application_set = name, category = e.category(), error = %e, "generation failed; no Application changed");
        }
        Ok(requeue)
    }

    async fn generate_and_apply(&self, appset: &DynamicObject) -> Result<(), ArgoCdError> {
        let spec: ApplicationSetSpec =
            serde_json::from_value(appset.data.get("spec").cloned().unwrap_or(json!({}))).map_err(
                |e| self.generator_error(&appset.name_any(), format!("spec does not parse: {e}")),
            )?;
        let policy = generators::policy(
            spec.sync_policy
                .as_ref()
                .and_then(|p| p.applications_sync.as_deref()),
        )
        .map_err(|r| self.generator_error(&appset.name_any(), r))?;
        let desired = self.generate(appset, &spec).await?;
        let existing: Vec<Value> = self
            .owned(appset)
            .await?
            .iter()
            .map(|a| serde_json::to_value(a).unwrap_or(Value::Null))
            .collect();
        let actions = generators::plan(
            &desired,
            &existing,
            policy,
            &spec.ignore_application_differences,
        );
        let preserve = spec
            .sync_policy
            .as_ref()
            .is_some_and(|p| p.preserve_resources_on_deletion);
        self.execute(appset, actions, preserve).await
    }
}

fn trigger_hash(appset: &DynamicObject) -> Option<u64> {
    crate::driver::predicate_hash(&json!({
        "spec": appset.data.get("spec"),
        "refresh": appset.annotations().get(APPSET_REFRESH_ANNOTATION),
        "deleting": appset.metadata.deletion_timestamp.is_some(),
    }))
}

/// Runs the controller until the future is dropped.
pub(crate) async fn run(ctx: Arc<AppSetCtx>) {
    let (api, retry) = (ctx.appsets.clone(), ctx.resync);
    crate::driver::drive_fallible(
        api,
        trigger_hash,
        "ApplicationSet",
        retry,
        move |name, uid| {
            let ctx = ctx.clone();
            async move { ctx.reconcile(&name, &uid).await }
        },
    )
    .await;
}
