//! Kubernetes Events as a test reads them back: what an operator reported, by reason. Reads
//! only; never writes an Event.

use k8s_openapi::api::events::v1::Event;
use kube::{Api, Client};

/// The Events in `namespace` whose reason is `reason`, in the order the API server lists them;
/// panics if they cannot be listed.
pub async fn with_reason(client: &Client, namespace: &str, reason: &str) -> Vec<Event> {
    Api::<Event>::namespaced(client.clone(), namespace)
        .list(&Default::default())
        .await
        .unwrap_or_else(|e| panic!("listing Events in {namespace}: {e}"))
        .items
        .into_iter()
        .filter(|e| e.reason.as_deref() == Some(reason))
        .collect()
}
