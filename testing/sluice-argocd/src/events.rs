//! Kubernetes Events on Applications, with Argo CD's reasons and wording (core/v1 Events from
//! `argocd-application-controller`, as Argo CD's recorder writes them): `OperationStarted`,
//! `OperationCompleted`, and `ResourceUpdated` for sync and health status changes. A failed
//! Event write is logged and never fails a reconcile; an Event never carries a credential.

use k8s_openapi::api::core::v1::{Event, EventSource, ObjectReference};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, Time};
use kube::api::{DynamicObject, ObjectMeta, PostParams};
use kube::{Api, Client, ResourceExt};

/// Event reasons.
pub mod reasons {
    /// A sync operation started.
    pub const OPERATION_STARTED: &str = "OperationStarted";
    /// A sync operation ended (succeeded, failed or terminated).
    pub const OPERATION_COMPLETED: &str = "OperationCompleted";
    /// Sync or health status changed.
    pub const RESOURCE_UPDATED: &str = "ResourceUpdated";
}

/// The component named in every Event.
pub const COMPONENT: &str = "argocd-application-controller";

/// The Event for `app` (pure).
pub fn event(app: &DynamicObject, reason: &str, message: &str, warning: bool) -> Event {
    let now = jiff::Timestamp::now();
    Event {
        metadata: ObjectMeta {
            generate_name: Some(format!("{}.", app.name_any())),
            namespace: app.namespace(),
            ..Default::default()
        },
        involved_object: ObjectReference {
            api_version: Some(format!("{}/{}", crate::types::GROUP, crate::types::VERSION)),
            kind: Some("Application".into()),
            name: Some(app.name_any()),
            namespace: app.namespace(),
            uid: app.uid(),
            resource_version: app.resource_version(),
            ..Default::default()
        },
        reason: Some(reason.into()),
        message: Some(message.into()),
        type_: Some(if warning { "Warning" } else { "Normal" }.into()),
        source: Some(EventSource {
            component: Some(COMPONENT.into()),
            ..Default::default()
        }),
        reporting_component: Some(COMPONENT.into()),
        reporting_instance: Some(COMPONENT.into()),
        first_timestamp: Some(Time(now)),
        last_timestamp: Some(Time(now)),
        event_time: Some(MicroTime(now)),
        action: Some(reason.into()),
        count: Some(1),
        ..Default::default()
    }
}

/// Writes the Event; a failure is logged only.
pub async fn emit(
    client: &Client,
    app: &DynamicObject,
    reason: &str,
    message: &str,
    warning: bool,
) {
    let namespace = app.namespace().unwrap_or_else(|| "default".into());
    let api: Api<Event> = Api::namespaced(client.clone(), &namespace);
    if let Err(e) = api
        .create(
            &PostParams::default(),
            &event(app, reason, message, warning),
        )
        .await
    {
        tracing::warn!(application = %app.name_any(), reason, error = %e, "could not write an Event");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_name_the_application() {
        let app: DynamicObject = serde_json::from_value(serde_json::json!({
            "apiVersion": "argoproj.io/v1alpha1", "kind": "Application",
            "metadata": {"name": "web", "namespace": "argocd", "uid": "u1"}
        }))
        .unwrap();
        let e = event(
            &app,
            reasons::OPERATION_STARTED,
            "Initiated automated sync to 'abc'",
            false,
        );
        assert_eq!(e.involved_object.kind.as_deref(), Some("Application"));
        assert_eq!(e.involved_object.uid.as_deref(), Some("u1"));
        assert_eq!(e.metadata.namespace.as_deref(), Some("argocd"));
        assert_eq!(e.type_.as_deref(), Some("Normal"));
        assert_eq!(
            event(&app, "x", "y", true).type_.as_deref(),
            Some("Warning")
        );
    }
}
