//! The I/O side of sluice-wave-gate: reads what `decide` needs, writes the status it returns
//! (server-side apply fenced by resourceVersion), then carries out its actions.
//!
//! Owns the order of effects: status first, Events only after the status write succeeded, so
//! a deposed leader whose write is refused publishes nothing. Must never decide anything.

use std::sync::Arc;

use k8s_openapi::jiff::Timestamp;
use kube::{Api, Client, ResourceExt, runtime::controller::Action as ControllerAction};
use sluice_api::v1alpha1::WaveGate;
use sluice_runtime::{
    Categorized, Category,
    events::EventRecorder,
    write::{self, WriteError},
};

use crate::{
    FIELD_MANAGER,
    decide::{self, Action, Observations, Requeue},
};

/// What every reconcile shares.
pub struct Context {
    /// The Kubernetes client.
    pub client: Client,
    /// The operator's Event recorder.
    pub recorder: EventRecorder,
    /// The clock; tests pin it.
    pub clock: fn() -> Timestamp,
    /// Whether free-form PromQL gates are allowed (`--allow-free-form-promql`).
    pub allow_free_form_promql: bool,
}

impl std::fmt::Debug for Context {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Context").finish_non_exhaustive()
    }
}

impl Context {
    /// A context reading the system clock.
    pub fn new(client: Client, recorder: EventRecorder) -> Self {
        Self {
            client,
            recorder,
            clock: Timestamp::now,
            allow_free_form_promql: false,
        }
    }
}

/// A reconcile that did not complete; retried with back-off.
#[derive(Debug, thiserror::Error)]
pub enum ReconcileError {
    /// The WaveGate came without a namespace (a watch or API bug).
    #[error("WaveGate {name} has no metadata.namespace; it cannot be written back")]
    NoNamespace {
        /// Object name.
        name: String,
    },
    /// Writing the status failed.
    #[error("writing WaveGate status: {0}")]
    Status(#[from] WriteError),
}

impl Categorized for ReconcileError {
    fn category(&self) -> Category {
        match self {
            ReconcileError::NoNamespace { .. } => Category::Internal,
            ReconcileError::Status(e) => e.category(),
        }
    }
}

/// Reconciles one WaveGate.
#[tracing::instrument(skip_all, fields(kind = "WaveGate", namespace = obj.namespace().unwrap_or_default(), name = obj.name_any()))]
pub async fn reconcile(
    obj: Arc<WaveGate>,
    ctx: Arc<Context>,
) -> Result<ControllerAction, ReconcileError> {
    let ns = obj.namespace().ok_or_else(|| ReconcileError::NoNamespace {
        name: obj.name_any(),
    })?;
    let api: Api<WaveGate> = Api::namespaced(ctx.client.clone(), &ns);
    let obs = Observations {
        generation: obj.metadata.generation,
        allow_free_form_promql: ctx.allow_free_form_promql,
    };
    let decision = decide::decide(&obj.spec, obj.status.as_ref(), &obs, (ctx.clock)());
    if obj.status.as_ref() != Some(&decision.status) {
        write::apply_status(&api, FIELD_MANAGER, obj.as_ref(), &decision.status).await?;
        tracing::info!(phase = ?decision.status.phase, "status written");
    }
    for action in &decision.actions {
        match action {
            Action::Event {
                severity,
                reason,
                action,
                note,
            } => {
                ctx.recorder
                    .publish(obj.as_ref(), *severity, reason, action, note)
                    .await
            }
        }
    }
    Ok(match decision.requeue {
        Requeue::AwaitChange => ControllerAction::await_change(),
        Requeue::After(d) => ControllerAction::requeue(d),
    })
}
