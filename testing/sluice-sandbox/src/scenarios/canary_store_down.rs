//! Scenario `canary-store-down` (needs `--metrics thanos`): east-1's checkout v2.14 is at 10%
//! with a healthy canary when east-1's metrics store goes down (its Thanos sidecar stops; its
//! Prometheus keeps receiving telemetry, Thanos Query keeps the strict endpoint in its query
//! set). rollout-weights reads through Thanos Query asking for no partial response, so every
//! query for east-1 fails: no gate may pass on what is left. Passes when, for the whole hold
//! ([`HOLD`]), no verdict computed after the outage is Pass, the Rollout neither advances past
//! its step nor promotes, and the gates report Inconclusive with a message naming the failure.
//! Figures: `first_inconclusive_ms` (store down → first Inconclusive verdict seen),
//! `held_s`, `step_index`, `gate_message` (the first Inconclusive verdict's message),
//! `store_error` (what Thanos Query reports about the store).

use std::time::{Duration, Instant};

use futures::FutureExt;
use futures::future::BoxFuture;
use serde_json::{Map, Value, json};
use sluice_api::v1alpha1::{GateVerdict, RolloutPhase, Verdict, VerdictReason};

use super::canary_abort::{self, CLUSTER};
use super::{Outcome, ScenarioDef, ScenarioError};
use crate::baseline::ROUTE;
use crate::metrics::MetricsKind;
use crate::sandbox::Sandbox;

/// How long the Rollout is watched with the store down.
pub const HOLD: Duration = Duration::from_secs(25);
/// Verdicts computed within this long of the outage may still carry a query answered before
/// it (status times have one-second precision).
pub const IN_FLIGHT: Duration = Duration::from_secs(2);

/// The registry entry.
pub const SCENARIO: ScenarioDef = ScenarioDef {
    name: "canary-store-down",
    description: "with --metrics thanos: east-1's checkout v2.14 at 10% with a healthy canary, then \
                  east-1's metrics store goes down; pass when for 25 s no gate passes, the Rollout \
                  neither advances nor promotes, and its gates report Inconclusive naming the failure \
                  (first_inconclusive_ms, held_s)",
    budget: Duration::from_secs(120),
    run: start,
};

fn start(sandbox: &Sandbox) -> BoxFuture<'_, Result<Outcome, ScenarioError>> {
    run(sandbox).boxed()
}

/// What one look at the Rollout during the outage shows.
#[derive(Debug, Clone, PartialEq)]
pub struct Look {
    /// The step index.
    pub step: Option<u32>,
    /// The phase.
    pub phase: RolloutPhase,
    /// Verdicts computed after the outage (beyond [`IN_FLIGHT`]).
    pub fresh: Vec<GateVerdict>,
}

/// Whether a look breaks the hold: a step past `held_step`, promotion or an abort, or a fresh
/// Pass verdict. `Some(why)` when it does.
pub fn breaks_hold(look: &Look, held_step: Option<u32>) -> Option<String> {
    if look.step != held_step {
        return Some(format!(
            "the Rollout moved from step {held_step:?} to {:?} with east-1's store down",
            look.step
        ));
    }
    if matches!(look.phase, RolloutPhase::Promoted | RolloutPhase::Aborted) {
        return Some(format!(
            "the Rollout reached {:?} with east-1's store down",
            look.phase
        ));
    }
    look.fresh
        .iter()
        .find(|v| v.verdict == Verdict::Pass)
        .map(|v| {
            format!(
                "gate {} passed ({:?}: {}) with east-1's store down",
                v.gate,
                v.reason,
                v.message.as_deref().unwrap_or("")
            )
        })
}

/// Whether a verdict says the gate could not be evaluated because a query failed.
pub fn could_not_evaluate(v: &GateVerdict) -> bool {
    v.verdict == Verdict::Inconclusive
        && matches!(v.reason, VerdictReason::QueryError | VerdictReason::Timeout)
        && v.message.as_deref().is_some_and(|m| !m.is_empty())
}

async fn run(sandbox: &Sandbox) -> Result<Outcome, ScenarioError> {
    if sandbox.metrics().kind() != MetricsKind::Thanos {
        return Ok(Outcome {
            pass: false,
            figures: Map::new(),
            summary: format!(
                "canary-store-down needs --metrics thanos (this sandbox runs {}: there is no per-cluster store to take down)",
                sandbox.metrics().kind().name()
            ),
        });
    }
    canary_abort::raise_traffic(sandbox)?;
    sandbox.say(format!(
        "canary-store-down: a Rollout takes checkout in {CLUSTER} from v2.13 to v2.14 and holds 10%; the canary is healthy"
    ));
    let steps = json!([
        {"setWeight": {"weight": 10, "duration": "6s"}},
        {"setWeight": {"weight": 50, "duration": "6s"}},
        {"promote": {}}
    ]);
    canary_abort::create(sandbox, &canary_abort::rollout(steps, json!({}))?).await?;
    let held_step = canary_abort::rollout_until(sandbox, |r| {
        r.status.as_ref().and_then(|s| {
            s.history
                .last()
                .is_some_and(|h| h.share_confirmed_at.is_some())
                .then_some(s.current_step_index)
        })
    })
    .await?;

    // The outage, from a known instant.
    let address = sandbox
        .metrics()
        .stop_store(CLUSTER)
        .map_err(|e| ScenarioError::Missing(format!("a store of {CLUSTER} to take down ({e})")))?;
    let down = Instant::now();
    let down_at_ms = sluice_testkit::prometheus::now_ms();
    sandbox.say(format!(
        "canary-store-down: the mesh confirmed the share at step {held_step:?}; {CLUSTER}'s Thanos sidecar ({address}) is now down"
    ));

    // The scenario's own reading through Thanos Query fails too.
    let own_reading = match canary_abort::measured_share(sandbox).await {
        Ok(s) => format!("answered {s:?}"),
        Err(e) => format!("failed: {e}"),
    };
    sandbox.say(format!(
        "canary-store-down: reading {CLUSTER}'s share through Thanos Query {own_reading}"
    ));

    let api = canary_abort::rollouts(sandbox)?;
    let fresh_after_ms = down_at_ms + i64::try_from(IN_FLIGHT.as_millis()).unwrap_or_default();
    let mut first_inconclusive: Option<(Duration, GateVerdict)> = None;
    let mut broken = None;
    let mut looks = 0u32;
    while down.elapsed() < HOLD {
        if let Ok(r) = api.get(ROUTE).await
            && let Some(s) = r.status
        {
            looks += 1;
            let look = Look {
                step: s.current_step_index,
                phase: s.phase,
                fresh: s
                    .gates
                    .iter()
                    .filter(|v| v.evaluated_at.0.as_millisecond() >= fresh_after_ms)
                    .cloned()
                    .collect(),
            };
            if let Some(why) = breaks_hold(&look, held_step) {
                broken = Some(why);
                break;
            }
            if first_inconclusive.is_none()
                && let Some(v) = look.fresh.iter().find(|v| could_not_evaluate(v))
            {
                first_inconclusive = Some((down.elapsed(), v.clone()));
                sandbox.say(format!(
                    "canary-store-down: gate {} is Inconclusive ({:?}) {} ms after the outage: {}",
                    v.gate,
                    v.reason,
                    canary_abort::ms(down.elapsed()),
                    v.message.as_deref().unwrap_or("")
                ));
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let store_error = sandbox
        .metrics()
        .store_error(CLUSTER, Duration::from_secs(5))
        .await;

    let mut figures = Map::new();
    figures.insert("held_s".into(), Value::from(down.elapsed().as_secs()));
    figures.insert("looks".into(), Value::from(looks));
    figures.insert(
        "step_index".into(),
        held_step.map_or(Value::Null, Value::from),
    );
    figures.insert(
        "first_inconclusive_ms".into(),
        first_inconclusive
            .as_ref()
            .map_or(Value::Null, |(d, _)| Value::from(canary_abort::ms(*d))),
    );
    figures.insert(
        "gate_message".into(),
        first_inconclusive
            .as_ref()
            .and_then(|(_, v)| v.message.clone())
            .map_or(Value::Null, Value::from),
    );
    figures.insert(
        "store_error".into(),
        store_error.clone().map_or(Value::Null, Value::from),
    );
    figures.insert("own_reading".into(), Value::from(own_reading));
    let (pass, summary) = match (broken, first_inconclusive) {
        (Some(why), _) => (false, why),
        (None, None) => (
            false,
            format!(
                "no gate reported Inconclusive with a query error within {HOLD:?} of {CLUSTER}'s store going down"
            ),
        ),
        (None, Some((_, v))) => (
            true,
            format!(
                "with {CLUSTER}'s store down the Rollout held at step {held_step:?} for {} s and no gate passed; gate {} reported {:?}: {}",
                HOLD.as_secs(),
                v.gate,
                v.reason,
                v.message.as_deref().unwrap_or("")
            ),
        ),
    };
    sandbox.say(format!("canary-store-down: {summary}"));
    Ok(Outcome {
        pass,
        figures,
        summary,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn verdict(verdict: Verdict, reason: VerdictReason, message: Option<&str>) -> GateVerdict {
        serde_json::from_value(json!({
            "gate": "error-ratio",
            "verdict": verdict,
            "reason": reason,
            "message": message,
            "evaluatedAt": "2026-01-01T00:00:00Z",
        }))
        .unwrap()
    }

    #[test]
    fn a_fresh_pass_a_step_forward_or_an_end_breaks_the_hold() {
        let inconclusive = verdict(
            Verdict::Inconclusive,
            VerdictReason::QueryError,
            Some("store unavailable"),
        );
        let pass = verdict(Verdict::Pass, VerdictReason::WithinTolerance, None);
        let look = |step, phase, fresh: Vec<GateVerdict>| Look { step, phase, fresh };
        let cases = [
            (
                look(
                    Some(0),
                    RolloutPhase::Progressing,
                    vec![inconclusive.clone()],
                ),
                false,
            ),
            (look(Some(0), RolloutPhase::Progressing, vec![]), false),
            (
                look(
                    Some(0),
                    RolloutPhase::Progressing,
                    vec![inconclusive.clone(), pass.clone()],
                ),
                true,
            ),
            (look(Some(1), RolloutPhase::Progressing, vec![]), true),
            (look(Some(0), RolloutPhase::Promoted, vec![]), true),
            (look(Some(0), RolloutPhase::Aborted, vec![]), true),
        ];
        for (l, want) in cases {
            assert_eq!(breaks_hold(&l, Some(0)).is_some(), want, "{l:?}");
        }
        let why = breaks_hold(
            &look(Some(0), RolloutPhase::Progressing, vec![pass]),
            Some(0),
        )
        .unwrap();
        assert!(why.starts_with("gate error-ratio passed"), "{why}");
    }

    #[test]
    fn could_not_evaluate_means_inconclusive_on_a_query_failure_with_its_message() {
        let cases = [
            (
                Verdict::Inconclusive,
                VerdictReason::QueryError,
                Some("unavailable"),
                true,
            ),
            (
                Verdict::Inconclusive,
                VerdictReason::Timeout,
                Some("deadline"),
                true,
            ),
            (
                Verdict::Inconclusive,
                VerdictReason::QueryError,
                None,
                false,
            ),
            (
                Verdict::Inconclusive,
                VerdictReason::NoData,
                Some("no data"),
                false,
            ),
            (Verdict::Fail, VerdictReason::QueryError, Some("x"), false),
        ];
        for (v, r, m, want) in cases {
            assert_eq!(
                could_not_evaluate(&verdict(v, r, m)),
                want,
                "{v:?} {r:?} {m:?}"
            );
        }
    }
}
