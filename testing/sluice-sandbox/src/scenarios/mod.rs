//! The scenario registry: each scenario is a module with one [`ScenarioDef`] (name, one-line
//! description, time budget, run function) listed in [`REGISTRY`]. An operator adds its own
//! scenarios by adding a module and a line there. A scenario drives a started [`Sandbox`] and
//! returns an [`Outcome`] with its figures; it never stops the sandbox (the caller does) and never
//! prints the result line (the caller prints [`result_line`] last).

pub mod bundles;
pub mod canary_abort;
pub mod canary_grpc;
pub mod canary_grpc_mirror;
pub mod canary_pause_abort;
pub mod canary_promote;
pub mod canary_store_down;
pub mod pin_exact;
pub mod pin_release;
pub mod revision_upgrade;
pub mod upgrade_no_pdb;
pub mod waves;
pub mod world;

use std::time::Duration;

use futures::future::BoxFuture;
use serde_json::{Map, Value};

use crate::sandbox::Sandbox;

/// What a scenario reports.
#[derive(Debug, Clone, PartialEq)]
pub struct Outcome {
    /// Whether the expected outcome happened.
    pub pass: bool,
    /// Figures measured (numbers or short strings), merged into the result line.
    pub figures: Map<String, Value>,
    /// In plain words: what happened, or why it failed.
    pub summary: String,
}

/// A scenario could not run to its end.
#[derive(Debug, thiserror::Error, strum::IntoStaticStr)]
#[strum(serialize_all = "snake_case")]
pub enum ScenarioError {
    /// An API call to a cluster failed.
    #[error("{action} in {cluster} failed: {source}")]
    Api {
        /// What was being done.
        action: String,
        /// Cluster name.
        cluster: String,
        /// Cause.
        source: kube::Error,
    },
    /// Prometheus could not answer.
    #[error("asking Prometheus failed: {0}")]
    Prometheus(#[from] sluice_testkit::prometheus::PrometheusError),
    /// A bundle could not be rendered, pushed or signed.
    #[error("bundle step {step} failed: {message}")]
    Bundle {
        /// Which step.
        step: &'static str,
        /// Cause.
        message: String,
    },
    /// The sandbox lacks a part the scenario needs.
    #[error("the sandbox has no {0}; this is a bug in the scenario or the sandbox")]
    Missing(String),
    /// The scenario did not finish within its budget.
    #[error("did not finish within its budget of {budget:?}; last step: {step}")]
    Timeout {
        /// The budget.
        budget: Duration,
        /// The step it was in.
        step: String,
    },
}

impl ScenarioError {
    /// Bounded category for the result line.
    pub fn category(&self) -> &'static str {
        self.into()
    }
}

/// How a scenario runs.
pub type RunFn = for<'a> fn(&'a Sandbox) -> BoxFuture<'a, Result<Outcome, ScenarioError>>;

/// One registered scenario.
#[derive(Clone, Copy)]
pub struct ScenarioDef {
    /// Name used with `--scenario`.
    pub name: &'static str,
    /// What it shows and what counts as passing, in one line.
    pub description: &'static str,
    /// Time it may take after the sandbox is ready; beyond that it fails.
    pub budget: Duration,
    /// The scenario itself.
    pub run: RunFn,
}

impl std::fmt::Debug for ScenarioDef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ScenarioDef")
            .field("name", &self.name)
            .field("budget", &self.budget)
            .finish()
    }
}

/// Every scenario, in the order `--list-scenarios` shows them.
pub const REGISTRY: &[ScenarioDef] = &[
    world::SCENARIO,
    canary_abort::SCENARIO,
    canary_grpc::SCENARIO,
    canary_grpc_mirror::SCENARIO,
    canary_pause_abort::SCENARIO,
    canary_promote::SCENARIO,
    canary_store_down::SCENARIO,
    revision_upgrade::SCENARIO,
    upgrade_no_pdb::SCENARIO,
    pin_release::SCENARIO,
    pin_exact::SCENARIO,
    waves::CLEAN,
    waves::BREACH,
];

/// A scenario by name.
pub fn find(name: &str) -> Option<&'static ScenarioDef> {
    REGISTRY.iter().find(|s| s.name == name)
}

/// The names, comma-separated (for error messages).
pub fn names() -> String {
    REGISTRY
        .iter()
        .map(|s| s.name)
        .collect::<Vec<_>>()
        .join(", ")
}

/// Runs a scenario within its budget.
pub async fn run(def: &ScenarioDef, sandbox: &Sandbox) -> Result<Outcome, ScenarioError> {
    match tokio::time::timeout(def.budget, (def.run)(sandbox)).await {
        Ok(result) => result,
        Err(_) => Err(ScenarioError::Timeout {
            budget: def.budget,
            step: sandbox
                .transcript()
                .last()
                .cloned()
                .unwrap_or_else(|| "none".into()),
        }),
    }
}

/// The last stdout line of scenario mode: `{"scenario": NAME, "outcome": "pass"|"fail",
/// ...figures}` (figures never override `scenario` and `outcome`).
pub fn result_line(name: &str, outcome: &Outcome) -> String {
    let verdict = if outcome.pass { "pass" } else { "fail" };
    // `scenario` and `outcome` first, so the line reads well; then figures, then the summary.
    let mut parts = vec![
        format!("\"scenario\":{}", Value::from(name)),
        format!("\"outcome\":{}", Value::from(verdict)),
    ];
    for (k, v) in &outcome.figures {
        if !matches!(k.as_str(), "scenario" | "outcome" | "summary") {
            parts.push(format!("{}:{v}", Value::from(k.as_str())));
        }
    }
    parts.push(format!(
        "\"summary\":{}",
        Value::from(outcome.summary.as_str())
    ));
    format!("{{{}}}", parts.join(","))
}

/// The outcome of a scenario that could not run (start failure, error, timeout, signal).
pub fn failed(category: &str, message: String) -> Outcome {
    let mut figures = Map::new();
    figures.insert("error".into(), Value::from(category));
    Outcome {
        pass: false,
        figures,
        summary: message,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_registered_scenario_has_a_unique_name_a_description_and_a_budget() {
        let mut names: Vec<&str> = REGISTRY.iter().map(|s| s.name).collect();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), REGISTRY.len(), "duplicate scenario names");
        for s in REGISTRY {
            assert!(!s.description.is_empty(), "{} has no description", s.name);
            assert!(s.budget > Duration::ZERO, "{} has no budget", s.name);
            assert!(find(s.name).is_some());
        }
        assert!(find("no-such-scenario").is_none());
    }

    #[test]
    fn the_result_line_is_one_json_object_with_scenario_outcome_and_figures() {
        let mut figures = Map::new();
        figures.insert("canary_share".into(), Value::from(0.1));
        figures.insert("outcome".into(), Value::from("pass"));
        let cases = [(true, "pass"), (false, "fail")];
        for (pass, want) in cases {
            let line = result_line(
                "world",
                &Outcome {
                    pass,
                    figures: figures.clone(),
                    summary: "s".into(),
                },
            );
            assert!(!line.contains('\n'));
            let v: Value = serde_json::from_str(&line).unwrap();
            assert_eq!(v["scenario"], "world");
            assert_eq!(v["outcome"], want, "a figure must not override the outcome");
            assert_eq!(v["canary_share"], 0.1);
            assert!(
                line.starts_with("{\"scenario\":\"world\",\"outcome\":"),
                "{line}"
            );
        }
        let v: Value =
            serde_json::from_str(&result_line("x", &failed("timeout", "slow".into()))).unwrap();
        assert_eq!(v["outcome"], "fail");
        assert_eq!(v["error"], "timeout");
    }
}
