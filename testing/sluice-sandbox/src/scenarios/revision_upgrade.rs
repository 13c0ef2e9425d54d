//! Scenario `revision-upgrade`: east-1's fleet moves from Istio revision 1-27 (tag `stable`) to
//! 1-28 (tag `canary`) across three waves (low-risk, tier-2, tier-1) driven by the
//! upgrade-revisions operator running in east-1, restarts paced by a small issuance budget.
//! Owns the fleet it adds (three namespaces), the RevisionUpgrade it creates and the figures;
//! judges issuance by the mesh simulator's own SVID counter, never by the operator's numbers,
//! and progress by the revision the injector recorded in each pod, never by labels.
//!
//! Figures: `peak_issuance_ratio` (the largest, over every window between two samples of the
//! counter, of issuance ÷ `min(depth + rate × w, peak × ⌈w⌉)`; pass needs ≤ 1.0),
//! `budget_utilisation` (restarts per second while a wave was Restarting ÷ the headroom: the
//! budget's rate less the background issuance counted before the upgrade), `time_ratio`
//! (restart time ÷ (proxies ÷ headroom)), `issuance_window_wait_ms` (the wait for Prometheus to
//! hold one issuance window of the operator, [`ISSUANCE_WINDOW`], before the upgrade),
//! `surge_restarted_deployments` (fleet Deployments restarted by surge rather than evicted; the
//! fleet rolls with 25% maxUnavailable, so any is a failure), `paused_ms` (created with
//! `spec.paused` → seen Paused; it is held Paused for [`HELD_PAUSED`], what
//! `SluiceUpgradePaused` reports, then resumed; the upgrade's time counts from the resume).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::FutureExt;
use futures::future::BoxFuture;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Namespace, Pod};
use kube::Api;
use kube::api::{ListParams, Patch, PatchParams, PostParams};
use serde_json::{Map, Value, json};
use sluice_api::v1alpha1::RevisionUpgrade;
use sluice_api::v1alpha1::RevisionUpgradePhase;
use sluice_api::v1alpha1::revision_upgrade::{UpgradeWaveState, conditions};

use super::{Outcome, ScenarioDef, ScenarioError};
use crate::sandbox::Sandbox;

/// The workload cluster the scenario upgrades.
pub const CLUSTER: &str = "east-1";
/// The RevisionUpgrade's name.
pub const NAME: &str = "istio-1-28";
/// The old revision (tag `stable`).
pub const FROM_REVISION: &str = "1-27";
/// The new revision (tag `canary`).
pub const TO_REVISION: &str = "1-28";
/// How long the RevisionUpgrade, created with `spec.paused`, is held Paused before it is resumed:
/// twice the 2 s the dashboards-and-alerts check holds an alert's `for:` to, so a late scrape
/// (1 s apart) still sees it Paused for 2 s.
pub const HELD_PAUSED: Duration = Duration::from_secs(4);
/// Issuance budget: sustained SVIDs per second.
pub const RATE: f64 = 8.0;
/// Issuance budget: bucket depth.
pub const DEPTH: f64 = 8.0;
/// Issuance budget: at most this many SVIDs in any one second.
pub const PEAK: f64 = 10.0;
/// How often the simulator's SVID counter is sampled.
pub const SAMPLE_EVERY: Duration = Duration::from_millis(20);
/// How long background issuance is counted before the upgrade starts.
pub const BACKGROUND_WINDOW: Duration = Duration::from_secs(3);
/// The window the operator binary measures issuance over: the sandbox starts it with
/// `SLUICE_ISSUANCE_WINDOW_SECONDS` set to [`crate::operators::ISSUANCE_WINDOW_SECONDS`].
pub const ISSUANCE_WINDOW: Duration =
    Duration::from_secs(crate::operators::ISSUANCE_WINDOW_SECONDS);
/// The certificate authority's issuance counter the simulator writes to Prometheus.
pub const ISSUANCE_METRIC: &str = "citadel_server_success_cert_issuance_count";
/// The injector's record of the revision that injected a pod.
pub const STATUS_ANNOTATION: &str = "sidecar.istio.io/status";

/// A namespace the scenario adds: name, risk tier, Deployments (name, replicas).
pub type FleetNamespace = (&'static str, &'static str, &'static [(&'static str, i32)]);

/// The namespaces the scenario adds. The baseline's `shop` namespace (tag `stable`, no tier)
/// joins the last wave.
/// Every Deployment rolls with Kubernetes' default strategy (maxSurge and maxUnavailable 25%),
/// and has at least 4 replicas so that 25% allows one unavailable pod: upgrade-revisions then
/// evicts (at most that many at once), as in a real fleet, rather than surge-restarting.
pub const FLEET: [FleetNamespace; 3] = [
    ("edge", "low", &[("gw", 4)]),
    ("orders", "tier-2", &[("cart", 4), ("search", 4)]),
    ("payments", "tier-1", &[("ledger", 4), ("api", 8)]),
];

/// The registry entry.
pub const SCENARIO: ScenarioDef = ScenarioDef {
    name: "revision-upgrade",
    description: "east-1 moves from Istio 1-27 to 1-28 in three waves under an issuance budget \
                  of 8/s (depth 8, 10 in any second); pass when every proxy runs 1-28, the old \
                  revision is reported retirable and the simulator's SVID counter never exceeds \
                  the budget (peak_issuance_ratio ≤ 1.0; also budget_utilisation, time_ratio)",
    budget: Duration::from_secs(110),
    run: start,
};

fn start(sandbox: &Sandbox) -> BoxFuture<'_, Result<Outcome, ScenarioError>> {
    run(sandbox).boxed()
}

/// The largest, over every window between two samples `(time, count)`, of issuance ÷ what the
/// budget allows in that window: `min(depth + rate × w, peak × ⌈w⌉)` (a window shorter than a
/// second is allowed one second's peak). Returns the ratio and the window it was seen in; 0.0
/// when nothing was issued.
pub fn peak_issuance_ratio(
    samples: &[(Duration, u64)],
    rate: f64,
    depth: f64,
    peak: f64,
) -> (f64, String) {
    let mut worst = (0.0, String::new());
    for (i, a) in samples.iter().enumerate() {
        for b in &samples[i + 1..] {
            let issued = b.1.saturating_sub(a.1) as f64;
            if issued == 0.0 {
                continue;
            }
            let w = b.0.saturating_sub(a.0).as_secs_f64();
            let allowed = (depth + rate * w).min(peak * w.ceil().max(1.0));
            let ratio = issued / allowed;
            if ratio > worst.0 {
                worst = (
                    ratio,
                    format!(
                        "{issued} SVIDs in {w:.2} s (allowed {allowed:.1}) at {:.2} s",
                        a.0.as_secs_f64()
                    ),
                );
            }
        }
    }
    worst
}

/// Utilisation and time ratio of `proxies` restarts taking `restart` (soaks excluded) against
/// `headroom` SVIDs per second: `(proxies ÷ restart) ÷ headroom` and
/// `restart ÷ (proxies ÷ headroom)`. `None` when any input is zero.
pub fn pace_figures(proxies: u64, restart: Duration, headroom: f64) -> Option<(f64, f64)> {
    let secs = restart.as_secs_f64();
    if proxies == 0 || secs <= 0.0 || headroom <= 0.0 {
        return None;
    }
    let p = proxies as f64;
    Some((p / secs / headroom, secs / (p / headroom)))
}

/// The revision the injector recorded in a pod's annotations.
pub fn injected_revision(annotations: &BTreeMap<String, String>) -> Option<String> {
    let raw = annotations.get(STATUS_ANNOTATION)?;
    let v: Value = serde_json::from_str(raw).ok()?;
    v.get("revision")?.as_str().map(str::to_owned)
}

/// Live pods of the cluster counted by injected revision: (old, new, Ready).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Census {
    /// Injected by the old revision.
    pub old: u64,
    /// Injected by the new revision.
    pub new: u64,
    /// Ready, any revision.
    pub ready: u64,
}

/// Counts pods by injected revision (pods being deleted are left out).
pub fn census(pods: &[Pod]) -> Census {
    let mut c = Census::default();
    for p in pods
        .iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
    {
        match p
            .metadata
            .annotations
            .as_ref()
            .and_then(injected_revision)
            .as_deref()
        {
            Some(FROM_REVISION) => c.old += 1,
            Some(TO_REVISION) => c.new += 1,
            _ => {}
        }
        let ready = p
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
        if ready {
            c.ready += 1;
        }
    }
    c
}

/// The verdict: complete, every proxy on the new revision and Ready, the old revision reported
/// retirable, and issuance within the budget.
pub fn judge(
    before: u64,
    after: Census,
    retirable: bool,
    ratio: f64,
    seconds: f64,
) -> (bool, String) {
    if after.old > 0 || after.new != before {
        return (
            false,
            format!(
                "after the upgrade {} proxies run {FROM_REVISION} and {} run {TO_REVISION}, of {before}",
                after.old, after.new
            ),
        );
    }
    if after.ready != before {
        return (
            false,
            format!(
                "only {} of {before} pods are Ready after the upgrade",
                after.ready
            ),
        );
    }
    if !retirable {
        return (
            false,
            format!(
                "every proxy runs {TO_REVISION} but the upgrade does not report {} True",
                conditions::OLD_REVISION_RETIRABLE
            ),
        );
    }
    if ratio > 1.0 {
        return (
            false,
            format!("issuance exceeded the budget: peak ratio {ratio:.3}"),
        );
    }
    (
        true,
        format!(
            "all {before} proxies moved from {FROM_REVISION} to {TO_REVISION} in {seconds:.1} s, \
             issuance peaking at {ratio:.3} of the budget; {FROM_REVISION} reported retirable"
        ),
    )
}

fn api_error(action: impl Into<String>) -> impl FnOnce(kube::Error) -> ScenarioError {
    let action = action.into();
    move |source| ScenarioError::Api {
        action,
        cluster: CLUSTER.into(),
        source,
    }
}

fn deployment(ns: &str, name: &str, replicas: i32) -> Result<Deployment, ScenarioError> {
    serde_json::from_value(json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": name, "namespace": ns},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": name}},
            "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": "25%", "maxUnavailable": "25%"}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {"containers": [{"name": "app", "image": format!("registry.invalid/{name}:1")}]}
            }
        }
    }))
    .map_err(|e| ScenarioError::Missing(format!("a valid Deployment {ns}/{name} ({e})")))
}

/// The RevisionUpgrade: three waves with 2 s soaks, the xDS NACK gate judged every second.
pub fn upgrade() -> Value {
    json!({
        "apiVersion": "sluice.dev/v1alpha1", "kind": "RevisionUpgrade",
        "metadata": {"name": NAME},
        "spec": {
            "fromTag": "stable", "fromRevision": FROM_REVISION, "toTag": "canary", "toRevision": TO_REVISION,
            "waves": [
                {"name": "low-risk", "namespaceSelector": {"matchLabels": {"sluice.dev/risk-tier": "low"}}, "soak": "2s"},
                {"name": "tier-2", "namespaceSelector": {"matchLabels": {"sluice.dev/risk-tier": "tier-2"}}, "soak": "2s"},
                {"name": "tier-1", "namespaceSelector": {}, "soak": "2s"},
            ],
            "issuanceBudget": {"rate": RATE as u32, "depth": DEPTH as u32, "peakPerSecond": PEAK as u32},
            "analysisInterval": "1s",
            "gates": [{"name": "xds-nack-increase", "builtin": "XdsNackIncrease", "window": "4s",
                       "minSamples": 1, "consecutiveFailures": 1}],
        }
    })
}

/// Samples of the SVID counter, taken by a task that stops when this is dropped.
struct Sampler {
    samples: Arc<Mutex<Vec<(Duration, u64)>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Sampler {
    fn start(svid: sluice_sim::SvidCounter) -> Self {
        let samples = Arc::new(Mutex::new(Vec::new()));
        let out = samples.clone();
        let begun = Instant::now();
        let task = tokio::spawn(async move {
            loop {
                if let Ok(mut s) = out.lock() {
                    s.push((begun.elapsed(), svid.get()));
                }
                tokio::time::sleep(SAMPLE_EVERY).await;
            }
        });
        Sampler { samples, task }
    }

    fn samples(&self) -> Vec<(Duration, u64)> {
        self.samples.lock().map(|s| s.clone()).unwrap_or_default()
    }
}

impl Drop for Sampler {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn count(pods: &Api<Pod>) -> Result<Census, ScenarioError> {
    let list = pods
        .list(&ListParams::default())
        .await
        .map_err(api_error("listing pods"))?;
    Ok(census(&list.items))
}

async fn run(sandbox: &Sandbox) -> Result<Outcome, ScenarioError> {
    let client = sandbox
        .client(CLUSTER)
        .ok_or_else(|| ScenarioError::Missing(format!("cluster {CLUSTER}")))?;
    let svid = sandbox
        .world(CLUSTER)
        .and_then(|w| w.svid(CLUSTER))
        .cloned()
        .ok_or_else(|| ScenarioError::Missing(format!("mesh simulator of {CLUSTER}")))?;

    // Given: the fleet on tag stable, every pod Ready on 1-27.
    sandbox.say(format!(
        "revision-upgrade: adding namespaces {} to {CLUSTER} on tag stable ({FROM_REVISION}); shop joins the last wave",
        FLEET.map(|f| f.0).join(", ")
    ));
    let namespaces: Api<Namespace> = Api::all(client.clone());
    for (ns, tier, deployments) in FLEET {
        let obj: Namespace = serde_json::from_value(json!({"metadata": {"name": ns, "labels": {
            "istio.io/rev": "stable", "sluice.dev/risk-tier": tier}}}))
        .map_err(|e| ScenarioError::Missing(format!("a valid Namespace {ns} ({e})")))?;
        namespaces
            .create(&PostParams::default(), &obj)
            .await
            .map_err(api_error(format!("creating namespace {ns}")))?;
        let api: Api<Deployment> = Api::namespaced(client.clone(), ns);
        for (name, replicas) in deployments {
            api.create(&PostParams::default(), &deployment(ns, name, *replicas)?)
                .await
                .map_err(api_error(format!("creating Deployment {ns}/{name}")))?;
        }
    }
    let added: u64 = FLEET
        .iter()
        .flat_map(|f| f.2.iter().map(|d| d.1 as u64))
        .sum();
    let pods: Api<Pod> = Api::all(client.clone());
    let before = loop {
        let c = count(&pods).await?;
        if c.old >= added && c.new == 0 && c.ready == c.old {
            break c.old;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    sandbox.say(format!(
        "revision-upgrade: {before} proxies Ready on {FROM_REVISION}; counting background issuance for {BACKGROUND_WINDOW:?}"
    ));
    // The operator holds restarts until Prometheus can answer the issuance counter at both ends
    // of its window (no data is not zero): wait for the window's early end to exist.
    sandbox.say(format!(
        "revision-upgrade: waiting until Prometheus holds a full issuance window ({ISSUANCE_WINDOW:?}) for {CLUSTER}; without it the operator holds restarts"
    ));
    let query = format!("max({ISSUANCE_METRIC}{{cluster=\"{CLUSTER}\"}})");
    let window_wait = Instant::now();
    loop {
        let now_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
            .unwrap_or_default();
        let early = now_ms - i64::try_from(ISSUANCE_WINDOW.as_millis()).unwrap_or_default();
        if !sandbox
            .prometheus()
            .query(&query, Some(early))
            .await?
            .is_empty()
        {
            break;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    let window_wait = window_wait.elapsed();
    sandbox.say(format!(
        "revision-upgrade: Prometheus holds a full issuance window after waiting {:.1} s",
        window_wait.as_secs_f64()
    ));
    let sampler = Sampler::start(svid);
    tokio::time::sleep(BACKGROUND_WINDOW).await;
    let pre = sampler.samples();
    let background = match (pre.first(), pre.last()) {
        (Some(a), Some(b)) if b.0 > a.0 => {
            b.1.saturating_sub(a.1) as f64 / (b.0 - a.0).as_secs_f64()
        }
        _ => 0.0,
    };
    let headroom = RATE - background;

    // When: the RevisionUpgrade is created.
    let upgrades: Api<RevisionUpgrade> = Api::all(client.clone());
    let mut paused = upgrade();
    paused["spec"]["paused"] = Value::Bool(true);
    let obj: RevisionUpgrade = serde_json::from_value(paused)
        .map_err(|e| ScenarioError::Missing(format!("a valid RevisionUpgrade ({e})")))?;
    sandbox.say(format!(
        "revision-upgrade: creating RevisionUpgrade {NAME} paused: stable → canary ({FROM_REVISION} → {TO_REVISION}), waves low-risk, tier-2, tier-1, budget {RATE}/s depth {DEPTH} peak {PEAK}/s"
    ));
    let created = Instant::now();
    upgrades
        .create(&PostParams::default(), &obj)
        .await
        .map_err(api_error(format!("creating RevisionUpgrade {NAME}")))?;
    // Held by spec.paused: Paused, with nothing relabelled or restarted, until resumed.
    loop {
        let phase = upgrades
            .get(NAME)
            .await
            .map_err(api_error(format!("reading RevisionUpgrade {NAME}")))?
            .status
            .map(|s| s.phase);
        if phase == Some(RevisionUpgradePhase::Paused) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let paused_ms = u64::try_from(created.elapsed().as_millis()).unwrap_or(u64::MAX);
    sandbox.say(format!(
        "revision-upgrade: {NAME} is Paused {paused_ms} ms after its creation; resuming it in {HELD_PAUSED:?}"
    ));
    tokio::time::sleep(HELD_PAUSED).await;
    let moved = count(&pods).await?;
    if moved.new > 0 {
        let summary = format!(
            "{} proxies moved to {TO_REVISION} while the upgrade was paused",
            moved.new
        );
        sandbox.say(format!("revision-upgrade: {summary}"));
        let mut figures = Map::new();
        figures.insert("paused_ms".into(), Value::from(paused_ms));
        return Ok(Outcome {
            pass: false,
            figures,
            summary,
        });
    }
    upgrades
        .patch(
            NAME,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"paused": false}})),
        )
        .await
        .map_err(api_error(format!("resuming RevisionUpgrade {NAME}")))?;
    let started = Instant::now();

    // Restart time: the time any wave spends Restarting (soaks excluded), polled every 100 ms.
    let mut restart = Duration::ZERO;
    let mut last = Instant::now();
    let mut wave_said: Option<(String, UpgradeWaveState)> = None;
    let mut said_budget = Instant::now();
    let done = loop {
        let obj = upgrades
            .get(NAME)
            .await
            .map_err(api_error(format!("reading RevisionUpgrade {NAME}")))?;
        let now = Instant::now();
        let status = obj.status.clone().unwrap_or_default();
        let wave = status
            .current_wave_index
            .and_then(|i| status.waves.get(i as usize));
        if wave.is_some_and(|w| w.state == UpgradeWaveState::Restarting) {
            restart += now - last;
            if said_budget.elapsed() >= Duration::from_secs(5) {
                said_budget = Instant::now();
                let b = status.issuance_budget.clone().unwrap_or_default();
                sandbox.say(format!(
                    "revision-upgrade: budget {:.1} tokens, observed {:.1}/s, background {:.1}/s, throttled {}",
                    b.tokens, b.observed_rate, b.background_rate, b.throttled
                ));
            }
        }
        last = now;
        if let Some(w) = wave {
            let key = (w.name.clone(), w.state);
            if wave_said.as_ref() != Some(&key) {
                let p = status.proxies.clone().unwrap_or_default();
                sandbox.say(format!(
                    "revision-upgrade: wave {} {:?} ({} proxies on {FROM_REVISION}, {} on {TO_REVISION})",
                    w.name, w.state, p.old, p.new
                ));
                wave_said = Some(key);
            }
        }
        match status.phase {
            RevisionUpgradePhase::Complete => break obj,
            RevisionUpgradePhase::Aborted | RevisionUpgradePhase::Invalid => {
                let mut figures = Map::new();
                figures.insert("phase".into(), Value::from(format!("{:?}", status.phase)));
                let summary = format!(
                    "the upgrade stopped in phase {:?} instead of completing; conditions: {}",
                    status.phase,
                    status
                        .conditions
                        .iter()
                        .map(|c| format!("{}={} ({}: {})", c.type_, c.status, c.reason, c.message))
                        .collect::<Vec<_>>()
                        .join("; ")
                );
                sandbox.say(format!("revision-upgrade: {summary}"));
                return Ok(Outcome {
                    pass: false,
                    figures,
                    summary,
                });
            }
            _ => {}
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let seconds = started.elapsed().as_secs_f64();
    // Then: counted from the pods themselves and the simulator's counter.
    let after = count(&pods).await?;
    let samples = sampler.samples();
    drop(sampler);
    let (ratio, at) = peak_issuance_ratio(&samples, RATE, DEPTH, PEAK);
    let issued = match (samples.first(), samples.last()) {
        (Some(a), Some(b)) => b.1.saturating_sub(a.1),
        _ => 0,
    };
    let retirable = done.status.as_ref().is_some_and(|s| {
        s.conditions
            .iter()
            .any(|c| c.type_ == conditions::OLD_REVISION_RETIRABLE && c.status == "True")
    });
    // How the fleet's Deployments were moved: restarted by surge (the pod template's
    // restartedAt) or evicted (none of them should need a surge with 25% maxUnavailable).
    let mut surged = 0u64;
    for (ns, _, _) in FLEET {
        let api: Api<Deployment> = Api::namespaced(client.clone(), ns);
        let list = api
            .list(&ListParams::default())
            .await
            .map_err(api_error(format!("listing Deployments in {ns}")))?;
        surged += list
            .items
            .iter()
            .filter(|d| {
                d.spec
                    .template
                    .metadata
                    .as_ref()
                    .and_then(|m| m.annotations.as_ref())
                    .is_some_and(|a| a.contains_key("kubectl.kubernetes.io/restartedAt"))
            })
            .count() as u64;
    }
    let (mut pass, mut summary) = judge(before, after, retirable, ratio, seconds);
    if surged > 0 {
        pass = false;
        summary = format!(
            "{summary}; but {surged} Deployment(s) were restarted by surge, though 25% maxUnavailable of at least 4 replicas lets upgrade-revisions evict"
        );
    }
    let (utilisation, time_ratio) = pace_figures(before, restart, headroom).unzip();
    sandbox.say(format!(
        "revision-upgrade: peak issuance {ratio:.3} of the budget ({at}); restarting took {:.1} s of {seconds:.1} s",
        restart.as_secs_f64()
    ));
    sandbox.say(format!("revision-upgrade: {summary}"));
    let round = |v: f64| (v * 1000.0).round() / 1000.0;
    let mut figures = Map::new();
    figures.insert("peak_issuance_ratio".into(), Value::from(round(ratio)));
    figures.insert("paused_ms".into(), Value::from(paused_ms));
    figures.insert(
        "budget_utilisation".into(),
        utilisation
            .map(round)
            .map(Value::from)
            .unwrap_or(Value::Null),
    );
    figures.insert(
        "time_ratio".into(),
        time_ratio
            .map(round)
            .map(Value::from)
            .unwrap_or(Value::Null),
    );
    figures.insert("proxies".into(), Value::from(before));
    figures.insert("surge_restarted_deployments".into(), Value::from(surged));
    figures.insert(
        "issuance_window_wait_ms".into(),
        Value::from(u64::try_from(window_wait.as_millis()).unwrap_or(u64::MAX)),
    );
    figures.insert("svids_issued".into(), Value::from(issued));
    figures.insert(
        "restart_s".into(),
        Value::from(round(restart.as_secs_f64())),
    );
    figures.insert("upgrade_s".into(), Value::from(round(seconds)));
    figures.insert("headroom_per_s".into(), Value::from(round(headroom)));
    Ok(Outcome {
        pass,
        figures,
        summary,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(ms: u64, n: u64) -> (Duration, u64) {
        (Duration::from_millis(ms), n)
    }

    #[test]
    fn peak_issuance_ratio_is_the_worst_window_against_the_budget() {
        // rate 8, depth 8, peak 10.
        let cases: [(&[(Duration, u64)], f64); 5] = [
            (&[], 0.0),
            (&[s(0, 5), s(5000, 5)], 0.0),
            // 10 in 0.5 s: allowed min(8 + 4, 10) = 10.
            (&[s(0, 0), s(500, 10)], 1.0),
            // 12 in 0.5 s: over the one-second peak.
            (&[s(0, 0), s(500, 12)], 1.2),
            // 32 in 3 s: allowed min(8 + 24, 30) = 30, the peak cap binds.
            (&[s(0, 0), s(3000, 32)], 32.0 / 30.0),
        ];
        for (samples, want) in cases {
            let (got, _) = peak_issuance_ratio(samples, RATE, DEPTH, PEAK);
            assert!((got - want).abs() < 1e-9, "{samples:?}: {got} != {want}");
        }
    }

    #[test]
    fn pace_figures_compare_restarts_with_the_headroom() {
        let cases = [
            (24, 3.0, 8.0, Some((1.0, 1.0))),
            (24, 6.0, 8.0, Some((0.5, 2.0))),
            (0, 3.0, 8.0, None),
            (24, 0.0, 8.0, None),
            (24, 3.0, 0.0, None),
        ];
        for (proxies, secs, headroom, want) in cases {
            let got = pace_figures(proxies, Duration::from_secs_f64(secs), headroom);
            assert_eq!(got, want, "{proxies} in {secs} s at {headroom}/s");
        }
    }

    fn pod(annotation: Option<&str>, ready: bool, deleting: bool) -> Pod {
        let mut v = json!({"metadata": {"name": "p"},
            "status": {"conditions": [{"type": "Ready", "status": if ready {"True"} else {"False"}}]}});
        if let Some(a) = annotation {
            v["metadata"]["annotations"] = json!({STATUS_ANNOTATION: a});
        }
        if deleting {
            v["metadata"]["deletionTimestamp"] = json!("2026-01-01T00:00:00Z");
        }
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn census_counts_the_injectors_record_not_labels() {
        let old = r#"{"revision":"1-27"}"#;
        let new = r#"{"revision":"1-28"}"#;
        let cases = [
            (vec![pod(Some(old), true, false)], (1, 0, 1)),
            (vec![pod(Some(new), false, false)], (0, 1, 0)),
            (vec![pod(Some(old), true, true)], (0, 0, 0)),
            (vec![pod(None, true, false)], (0, 0, 1)),
            (vec![pod(Some("not json"), true, false)], (0, 0, 1)),
        ];
        for (pods, (old, new, ready)) in cases {
            assert_eq!(census(&pods), Census { old, new, ready });
        }
    }

    #[test]
    fn judged_by_pods_condition_and_issuance() {
        let all_new = Census {
            old: 0,
            new: 24,
            ready: 24,
        };
        let cases = [
            (all_new, true, 0.9, true),
            (all_new, true, 1.01, false),
            (all_new, false, 0.9, false),
            (
                Census {
                    old: 1,
                    new: 23,
                    ready: 24,
                },
                true,
                0.9,
                false,
            ),
            (
                Census {
                    old: 0,
                    new: 24,
                    ready: 20,
                },
                true,
                0.9,
                false,
            ),
        ];
        for (after, retirable, ratio, want) in cases {
            let (pass, why) = judge(24, after, retirable, ratio, 10.0);
            assert_eq!(pass, want, "{after:?} {retirable} {ratio}: {why}");
        }
    }

    #[test]
    fn the_upgrade_parses_as_the_kind() {
        let u: RevisionUpgrade = serde_json::from_value(upgrade()).unwrap();
        assert_eq!(u.spec.waves.len(), 3);
        assert_eq!(u.spec.issuance_budget.rate, RATE as u32);
    }
}
