//! Scenario `world`: the local world works end to end. The checkout route in `east-1` is set to
//! 90/10 and the canary share is read back from Prometheus, as the mesh simulator reports it from
//! the weights stored in the API (figure `canary_share`; pass within ±0.02 of 0.10). Never judges
//! by the route it wrote: only the measured share counts.

use std::time::{Duration, Instant};

use futures::FutureExt;
use futures::future::BoxFuture;
use kube::Api;
use kube::api::{ApiResource, DynamicObject, GroupVersionKind, Patch, PatchParams};
use serde_json::{Map, Value, json};

use super::{Outcome, ScenarioDef, ScenarioError};
use crate::baseline::{CANARY, ROUTE, SHOP, STABLE};
use crate::sandbox::Sandbox;
use crate::share;

/// The workload cluster the scenario uses.
pub const CLUSTER: &str = "east-1";
/// Canary weight written (of 100).
pub const CANARY_WEIGHT: u32 = 10;
/// Allowed distance of the measured share from the written one.
pub const TOLERANCE: f64 = 0.02;
/// The window the share is measured over (≥ 4 telemetry intervals of 1 s).
pub const WINDOW_S: u64 = 5;
/// Wait after the write before measuring: the mesh's propagation delay (2 s), a full window and
/// two telemetry intervals, so the window holds only traffic split by the new weights.
pub const SETTLE: Duration = Duration::from_secs(2 + WINDOW_S + 2);

// A rate window needs at least 4 telemetry intervals (1 s each).
const _: () = assert!(WINDOW_S >= 4);

/// The registry entry.
pub const SCENARIO: ScenarioDef = ScenarioDef {
    name: "world",
    description: "east-1's checkout route at 90/10; pass when Prometheus reports a canary share \
                  within 0.10 ± 0.02 (figure canary_share)",
    budget: Duration::from_secs(60),
    run: start,
};

fn start(sandbox: &Sandbox) -> BoxFuture<'_, Result<Outcome, ScenarioError>> {
    run(sandbox).boxed()
}

/// The verdict on a measured share.
pub fn judge(measured: Option<f64>, target: f64, tolerance: f64) -> (bool, String) {
    match measured {
        None => (
            false,
            "Prometheus reported no checkout requests; no data is never a pass".to_string(),
        ),
        Some(s) if (s - target).abs() <= tolerance => (
            true,
            format!("the mesh reports a canary share of {s:.4}, the {target:.2} written"),
        ),
        Some(s) => (
            false,
            format!("the mesh reports a canary share of {s:.4}, not {target:.2} ± {tolerance}"),
        ),
    }
}

fn routes(sandbox: &Sandbox) -> Result<Api<DynamicObject>, ScenarioError> {
    let client = sandbox
        .client(CLUSTER)
        .ok_or_else(|| ScenarioError::Missing(format!("cluster {CLUSTER}")))?;
    let resource = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("gateway.networking.k8s.io", "v1", "HTTPRoute"),
        "httproutes",
    );
    Ok(Api::namespaced_with(client, SHOP, &resource))
}

async fn run(sandbox: &Sandbox) -> Result<Outcome, ScenarioError> {
    let stable_weight = 100 - CANARY_WEIGHT;
    sandbox.say(format!(
        "world: setting {CLUSTER}'s route {SHOP}/{ROUTE} to {stable_weight}/{CANARY_WEIGHT}, then reading the canary share back from Prometheus"
    ));
    let patch = json!({"spec": {"rules": [{"backendRefs": [
        {"name": STABLE, "port": 80, "weight": stable_weight},
        {"name": CANARY, "port": 80, "weight": CANARY_WEIGHT},
    ]}]}});
    routes(sandbox)?
        .patch(ROUTE, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .map_err(|source| ScenarioError::Api {
            action: format!("setting route {SHOP}/{ROUTE} to {stable_weight}/{CANARY_WEIGHT}"),
            cluster: CLUSTER.into(),
            source,
        })?;
    let written = Instant::now();
    tokio::time::sleep(SETTLE).await;
    // Telemetry may lag a tick on a loaded machine: read until there is data.
    let measured = loop {
        let m = share::measure(sandbox.prometheus(), CLUSTER, SHOP, WINDOW_S).await?;
        if m.total() > 0.0 {
            break m;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    };
    let share = share::canary_share(&measured, STABLE, CANARY);
    let target = f64::from(CANARY_WEIGHT) / 100.0;
    let (pass, summary) = judge(share, target, TOLERANCE);
    sandbox.say(format!("world: {summary}"));
    let mut figures = Map::new();
    let round = |v: f64| (v * 10_000.0).round() / 10_000.0;
    figures.insert(
        "canary_share".into(),
        share.map(round).map(Value::from).unwrap_or(Value::Null),
    );
    figures.insert(
        "canary_requests".into(),
        Value::from(measured.requests(CANARY).round()),
    );
    figures.insert(
        "stable_requests".into(),
        Value::from(measured.requests(STABLE).round()),
    );
    figures.insert("share_window_s".into(), Value::from(WINDOW_S));
    figures.insert(
        "measured_after_ms".into(),
        Value::from(u64::try_from(written.elapsed().as_millis()).unwrap_or(u64::MAX)),
    );
    Ok(Outcome {
        pass,
        figures,
        summary,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn judged_by_the_measured_share_only() {
        let cases = [
            (Some(0.10), true),
            (Some(0.119), true),
            (Some(0.081), true),
            (Some(0.125), false),
            (Some(0.0), false),
            (None, false),
        ];
        for (measured, want) in cases {
            let (pass, why) = judge(measured, 0.10, TOLERANCE);
            assert_eq!(pass, want, "{measured:?}: {why}");
        }
    }
}
