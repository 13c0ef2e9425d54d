//! GateTemplate status: every GateTemplate gets `status.observedGeneration` and a `Ready`
//! condition from validation, written by this operator (the one writer of that status, under its
//! field manager), so a platform team sees a broken template before any Rollout, WaveGate or
//! RevisionUpgrade references it.
//!
//! Pure: [`problems`] and [`next_status`] (the template's fields and variables as
//! `GateTemplateSpec::validate` checks them, and its PromQL parsed with every `{{variable}}`
//! given a placeholder). I/O: [`run`], a controller over GateTemplates that writes only while this
//! replica leads and only when the status changes.

use std::{sync::Arc, time::Duration};

use futures::StreamExt;
use jiff::Timestamp;
use kube::{
    Api, Client, ResourceExt,
    runtime::{Controller, controller::Action, watcher},
};
use sluice_api::v1alpha1::{GateTemplate, GateTemplateSpec, GateTemplateStatus};
use sluice_runtime::{
    conditions::{same_ignoring_time, set_validity},
    leader::Leadership,
    write::{self, WriteError},
};

use crate::{FIELD_MANAGER, validity::promql_problem};

/// How often a standby replica looks again (it writes nothing until it leads).
const STANDBY_RECHECK: Duration = Duration::from_secs(30);

/// The template's problems, each `path: what is wrong`; empty when it is usable.
pub fn problems(spec: &GateTemplateSpec) -> Vec<String> {
    let errors = spec.validate();
    let mut out: Vec<String> = errors.iter().map(ToString::to_string).collect();
    if let Some(q) = &spec.definition.promql
        && !errors.iter().any(|e| e.path == "spec.promql")
        && let Some(problem) = promql_problem(q)
    {
        out.push(format!("spec.promql: {problem}"));
    }
    out
}

/// The status a GateTemplate should have: `Ready` from [`problems`] (its transition time kept
/// when nothing changed) and the generation it reflects.
pub fn next_status(template: &GateTemplate, now: Timestamp) -> GateTemplateStatus {
    let generation = template.metadata.generation;
    let mut status = template.status.clone().unwrap_or_default();
    set_validity(
        &mut status.conditions,
        &problems(&template.spec),
        generation,
        now,
    );
    status.observed_generation = generation;
    status
}

fn same(a: Option<&GateTemplateStatus>, b: &GateTemplateStatus) -> bool {
    a.is_some_and(|a| {
        a.observed_generation == b.observed_generation
            && a.conditions.len() == b.conditions.len()
            && a.conditions
                .iter()
                .zip(&b.conditions)
                .all(|(x, y)| same_ignoring_time(x, y))
    })
}

struct Ctx {
    api: Api<GateTemplate>,
    leadership: Leadership,
}

async fn reconcile(template: Arc<GateTemplate>, ctx: Arc<Ctx>) -> Result<Action, WriteError> {
    if !ctx.leadership.is_leader() {
        return Ok(Action::requeue(STANDBY_RECHECK));
    }
    let next = next_status(&template, Timestamp::now());
    if !same(template.status.as_ref(), &next) {
        write::apply_status(&ctx.api, FIELD_MANAGER, template.as_ref(), &next).await?;
        tracing::info!(
            gate_template = template.name_any(),
            ready = next
                .conditions
                .iter()
                .find(|c| c.type_ == "Ready")
                .map(|c| c.status.as_str())
                .unwrap_or_default(),
            "GateTemplate status written"
        );
    }
    Ok(Action::await_change())
}

fn error_policy(_: Arc<GateTemplate>, err: &WriteError, _: Arc<Ctx>) -> Action {
    // A stale write (the template changed meanwhile) is retried on the newer object at once.
    tracing::warn!(error = %err, "GateTemplate status not written");
    Action::requeue(Duration::from_secs(2))
}

/// Runs the GateTemplate status controller until the watch ends: it watches with
/// `watch_client`, writes with `client`, and writes only while `leadership` holds.
pub async fn run(watch_client: Client, client: Client, leadership: Leadership) {
    let ctx = Arc::new(Ctx {
        api: Api::all(client),
        leadership,
    });
    Controller::new(
        Api::<GateTemplate>::all(watch_client),
        watcher::Config::default(),
    )
    .run(reconcile, error_policy, ctx)
    .for_each(|_| async {})
    .await;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn template(spec: serde_json::Value, generation: i64) -> GateTemplate {
        let mut t = GateTemplate::new("errors", serde_json::from_value(spec).unwrap());
        t.metadata.generation = Some(generation);
        t
    }

    fn now() -> Timestamp {
        Timestamp::from_second(1_800_000_000).unwrap()
    }

    #[test]
    fn a_template_whose_promql_does_not_parse_is_not_ready_naming_the_field() {
        let comparison = serde_json::json!({"absolute": {"op": "LessThan", "value": 0.01}});
        let bad = template(
            serde_json::json!({"promql": r#"sum(rate(x{service="{{canaryService}}"}[{{window}}])"#, "comparison": comparison}),
            1,
        );
        let status = next_status(&bad, now());
        assert_eq!(status.observed_generation, Some(1));
        let ready = &status.conditions[0];
        assert_eq!(
            (
                ready.type_.as_str(),
                ready.status.as_str(),
                ready.reason.as_str()
            ),
            ("Ready", "False", "InvalidSpec")
        );
        assert!(
            ready.message.contains(
                "spec.promql: template is not valid PromQL once its variables have values"
            ) && ready.message.contains("unclosed left parenthesis"),
            "{}",
            ready.message
        );

        // Fixed in generation 2: Ready, and the generation it reflects.
        let mut good = template(
            serde_json::json!({"promql": r#"sum(rate(x{service="{{canaryService}}"}[{{window}}]))"#, "comparison": comparison}),
            2,
        );
        good.status = Some(status);
        let status = next_status(&good, now());
        assert_eq!(status.observed_generation, Some(2));
        assert_eq!(status.conditions.len(), 1);
        assert_eq!(
            (
                status.conditions[0].status.as_str(),
                status.conditions[0].reason.as_str()
            ),
            ("True", "Valid")
        );
        assert_eq!(status.conditions[0].observed_generation, Some(2));

        // Field problems come from the shared validation, with their paths.
        let unknown = template(
            serde_json::json!({"promql": r#"sum(x{a="{{nope}}"})"#, "comparison": comparison}),
            3,
        );
        let got = problems(&unknown.spec);
        assert_eq!(got.len(), 1, "{got:?}");
        assert!(
            got[0].starts_with("spec.promql: unknown template variable {{nope}}"),
            "{got:?}"
        );
    }
}
