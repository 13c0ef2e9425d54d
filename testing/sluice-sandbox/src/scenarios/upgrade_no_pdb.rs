//! Scenario `upgrade-no-pdb`: east-1 moves from Istio revision 1-27 to 1-28 while none of the
//! workloads it restarts has a PodDisruptionBudget (the Eviction API then protects nothing) —
//! `web` (4 replicas, no maxUnavailable of its own), `cart` (5 replicas, its own maxUnavailable
//! 2), `solo` (1 replica), and the baseline's `shop` Deployments — under a budget generous
//! enough to evict every replica of a workload within a second. Owns the namespace and
//! Deployments it adds, the RevisionUpgrade it creates and the figure; judges availability from
//! the pods themselves (a watch sampled every 20 ms), never from the operator's numbers.
//!
//! Figure: `min_available_margin`, the least over time and workloads of
//! Available − (replicas − maxUnavailable), where maxUnavailable is the workload's own, else 1,
//! and 0 for a workload no eviction can keep up (one replica, or its own maxUnavailable
//! resolving to 0: sluice restarts those by rollout restart, which surges); pass needs ≥ 0,
//! every proxy on 1-28 and Ready, and the upgrade Complete.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::future::BoxFuture;
use futures::{FutureExt, StreamExt};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Namespace, Pod};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::api::{ListParams, PostParams};
use kube::runtime::{WatchStreamExt, reflector, watcher};
use kube::{Api, ResourceExt};
use serde_json::{Map, Value, json};
use sluice_api::v1alpha1::RevisionUpgrade;
use sluice_api::v1alpha1::RevisionUpgradePhase;

use super::revision_upgrade::{
    FROM_REVISION, ISSUANCE_METRIC, ISSUANCE_WINDOW, TO_REVISION, census,
};
use super::{Outcome, ScenarioDef, ScenarioError};
use crate::sandbox::Sandbox;

/// The workload cluster the scenario upgrades.
pub const CLUSTER: &str = "east-1";
/// The RevisionUpgrade's name.
pub const NAME: &str = "istio-1-28-no-pdb";
/// The namespace the scenario adds (first wave); the baseline's `shop` follows in the second.
pub const NAMESPACE: &str = "catalog";
/// Issuance budget (rate, depth and peak per second): enough to evict all of `web` at once.
pub const BUDGET: u32 = 20;
/// How often availability is sampled.
pub const SAMPLE_EVERY: Duration = Duration::from_millis(20);

/// The Deployments added: name, replicas, their own `rollingUpdate.maxUnavailable` (if any).
pub const WORKLOADS: [(&str, i32, Option<i32>); 3] =
    [("web", 4, None), ("cart", 5, Some(2)), ("solo", 1, None)];

/// The registry entry.
pub const SCENARIO: ScenarioDef = ScenarioDef {
    name: "upgrade-no-pdb",
    description: "east-1 moves from Istio 1-27 to 1-28 with no PodDisruptionBudget anywhere \
                  (web 4 replicas, cart 5 with maxUnavailable 2, solo 1, and shop) under a budget \
                  that could evict a whole workload at once; pass when every proxy runs 1-28, \
                  the upgrade is Complete and no workload ever had fewer Available pods than \
                  replicas − maxUnavailable (min_available_margin ≥ 0)",
    budget: Duration::from_secs(150),
    run: start,
};

fn start(sandbox: &Sandbox) -> BoxFuture<'_, Result<Outcome, ScenarioError>> {
    run(sandbox).boxed()
}

fn api_error(action: impl Into<String>) -> impl FnOnce(kube::Error) -> ScenarioError {
    let action = action.into();
    move |source| ScenarioError::Api {
        action,
        cluster: CLUSTER.into(),
        source,
    }
}

/// The floor sluice must keep for a workload of `replicas` with its own `max_unavailable`:
/// replicas − maxUnavailable (own, else 1); all of them when no eviction can keep a floor (one
/// replica, or maxUnavailable resolving to 0), which sluice restarts by surging.
pub fn floor(replicas: i32, max_unavailable: Option<&IntOrString>) -> i64 {
    let replicas = i64::from(replicas.max(0));
    let m = match max_unavailable {
        None => 1,
        Some(IntOrString::Int(i)) => i64::from(*i),
        Some(IntOrString::String(s)) => {
            let pct: f64 = s.trim_end_matches('%').trim().parse().unwrap_or(0.0);
            (pct * replicas as f64 / 100.0).floor() as i64
        }
    };
    if replicas <= 1 || m <= 0 {
        return replicas;
    }
    replicas - m.min(replicas - 1)
}

/// Available (Ready, not being deleted) pods per owning Deployment: the simulator's
/// Deployments own their pods directly; a real cluster's own them through a ReplicaSet named
/// `<deployment>-<pod-template-hash>`.
pub fn available_by_workload<'a>(pods: impl Iterator<Item = &'a Pod>) -> BTreeMap<String, i64> {
    let mut out = BTreeMap::new();
    for p in pods.filter(|p| p.metadata.deletion_timestamp.is_none()) {
        let ready = p
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
        let Some(owner) = p
            .owner_references()
            .iter()
            .find(|o| o.controller == Some(true))
        else {
            continue;
        };
        let name = match (owner.kind.as_str(), p.labels().get("pod-template-hash")) {
            ("ReplicaSet", Some(hash)) => owner
                .name
                .strip_suffix(&format!("-{hash}"))
                .unwrap_or(&owner.name)
                .to_owned(),
            _ => owner.name.clone(),
        };
        let key = format!("{}/{name}", p.namespace().unwrap_or_default());
        *out.entry(key).or_default() += i64::from(ready);
    }
    out
}

/// The least margin over `floors` (`namespace/name` → (floor, replicas)) given the Available
/// pods now, and the workload it was seen on.
pub fn least_margin(
    floors: &BTreeMap<String, (i64, i64)>,
    available: &BTreeMap<String, i64>,
) -> Option<(i64, String)> {
    floors
        .iter()
        .map(|(w, (floor, replicas))| {
            let a = available.get(w).copied().unwrap_or(0);
            (a - floor, format!("{w}: {a} Available of {replicas}"))
        })
        .min_by_key(|(m, _)| *m)
}

fn deployment(
    name: &str,
    replicas: i32,
    max_unavailable: Option<i32>,
) -> Result<Deployment, ScenarioError> {
    let mut rolling = json!({"maxSurge": 1});
    if let Some(m) = max_unavailable {
        rolling["maxUnavailable"] = json!(m);
    }
    serde_json::from_value(json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": name}},
            "strategy": {"type": "RollingUpdate", "rollingUpdate": rolling},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {"containers": [{"name": "app", "image": format!("registry.invalid/{name}:1")}]}
            }
        }
    }))
    .map_err(|e| ScenarioError::Missing(format!("a valid Deployment {NAMESPACE}/{name} ({e})")))
}

/// The RevisionUpgrade: the added namespace, then every remaining one (shop), 2 s soaks, the
/// xDS NACK gate judged every second, a budget of [`BUDGET`] per second, depth and peak.
pub fn upgrade() -> Value {
    json!({
        "apiVersion": "sluice.dev/v1alpha1", "kind": "RevisionUpgrade",
        "metadata": {"name": NAME},
        "spec": {
            "fromTag": "stable", "fromRevision": FROM_REVISION, "toTag": "canary", "toRevision": TO_REVISION,
            "waves": [
                {"name": "low-risk", "namespaceSelector": {"matchLabels": {"sluice.dev/risk-tier": "low"}}, "soak": "2s"},
                {"name": "rest", "namespaceSelector": {}, "soak": "2s"},
            ],
            "issuanceBudget": {"rate": BUDGET, "depth": BUDGET, "peakPerSecond": BUDGET},
            "analysisInterval": "1s",
            "gates": [{"name": "xds-nack-increase", "builtin": "XdsNackIncrease", "window": "4s",
                       "minSamples": 1, "consecutiveFailures": 1}],
        }
    })
}

/// The least margin seen by a sampler over a pod watch, stopped when dropped.
struct MarginSampler {
    least: Arc<Mutex<Option<(i64, String)>>>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl MarginSampler {
    fn start(client: kube::Client, floors: BTreeMap<String, (i64, i64)>) -> Self {
        let (store, writer) = reflector::store();
        let watch = tokio::spawn(
            reflector::reflector(
                writer,
                watcher(Api::<Pod>::all(client), watcher::Config::default()),
            )
            .default_backoff()
            .for_each(|_| async {}),
        );
        let least: Arc<Mutex<Option<(i64, String)>>> = Arc::new(Mutex::new(None));
        let out = least.clone();
        let begun = Instant::now();
        let sample = tokio::spawn(async move {
            let _ = store.wait_until_ready().await;
            loop {
                let state = store.state();
                let available = available_by_workload(state.iter().map(|p| p.as_ref()));
                if let Some((m, at)) = least_margin(&floors, &available)
                    && let Ok(mut l) = out.lock()
                    && l.as_ref().is_none_or(|(old, _)| m < *old)
                {
                    *l = Some((m, format!("{at} at {:.2} s", begun.elapsed().as_secs_f64())));
                }
                tokio::time::sleep(SAMPLE_EVERY).await;
            }
        });
        MarginSampler {
            least,
            tasks: vec![watch, sample],
        }
    }

    fn least(&self) -> Option<(i64, String)> {
        self.least.lock().ok().and_then(|l| l.clone())
    }
}

impl Drop for MarginSampler {
    fn drop(&mut self) {
        self.tasks.iter().for_each(|t| t.abort());
    }
}

async fn run(sandbox: &Sandbox) -> Result<Outcome, ScenarioError> {
    let client = sandbox
        .client(CLUSTER)
        .ok_or_else(|| ScenarioError::Missing(format!("cluster {CLUSTER}")))?;

    // Given: the namespace and its Deployments on tag stable, no PodDisruptionBudget.
    sandbox.say(format!(
        "upgrade-no-pdb: adding namespace {NAMESPACE} to {CLUSTER} on tag stable ({FROM_REVISION}) with web ×4, cart ×5 (maxUnavailable 2), solo ×1 and no PodDisruptionBudget; shop follows in the second wave"
    ));
    let ns: Namespace = serde_json::from_value(json!({"metadata": {"name": NAMESPACE, "labels": {
        "istio.io/rev": "stable", "sluice.dev/risk-tier": "low"}}}))
    .map_err(|e| ScenarioError::Missing(format!("a valid Namespace ({e})")))?;
    Api::<Namespace>::all(client.clone())
        .create(&PostParams::default(), &ns)
        .await
        .map_err(api_error(format!("creating namespace {NAMESPACE}")))?;
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), NAMESPACE);
    for (name, replicas, max_unavailable) in WORKLOADS {
        deployments
            .create(
                &PostParams::default(),
                &deployment(name, replicas, max_unavailable)?,
            )
            .await
            .map_err(api_error(format!("creating Deployment {NAMESPACE}/{name}")))?;
    }
    let pods: Api<Pod> = Api::all(client.clone());
    let added: u64 = WORKLOADS.iter().map(|w| w.1 as u64).sum();
    let before = loop {
        let list = pods
            .list(&ListParams::default())
            .await
            .map_err(api_error("listing pods"))?;
        let c = census(&list.items);
        if c.old >= added && c.new == 0 && c.ready == c.old {
            break c.old;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };

    // The floor of every Deployment the upgrade restarts, from the Deployments themselves.
    let mut floors = BTreeMap::new();
    for ns in [NAMESPACE, "shop"] {
        let list = Api::<Deployment>::namespaced(client.clone(), ns)
            .list(&ListParams::default())
            .await
            .map_err(api_error(format!("listing Deployments in {ns}")))?;
        for d in list.items {
            let replicas = d.spec.replicas.unwrap_or(1);
            let own = d
                .spec
                .strategy
                .as_ref()
                .and_then(|s| s.rolling_update.as_ref())
                .and_then(|r| r.max_unavailable.as_ref());
            floors.insert(
                format!("{ns}/{}", d.name_any()),
                (floor(replicas, own), i64::from(replicas)),
            );
        }
    }
    sandbox.say(format!(
        "upgrade-no-pdb: {before} proxies Ready on {FROM_REVISION}; floors (Available pods kept): {}",
        floors
            .iter()
            .map(|(w, (f, r))| format!("{w} {f} of {r}"))
            .collect::<Vec<_>>()
            .join(", ")
    ));
    // The operator holds restarts until Prometheus holds a whole issuance window.
    let query = format!("max({ISSUANCE_METRIC}{{cluster=\"{CLUSTER}\"}})");
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
    let sampler = MarginSampler::start(client.clone(), floors);

    // When: the RevisionUpgrade is created.
    let upgrades: Api<RevisionUpgrade> = Api::all(client.clone());
    let obj: RevisionUpgrade = serde_json::from_value(upgrade())
        .map_err(|e| ScenarioError::Missing(format!("a valid RevisionUpgrade ({e})")))?;
    sandbox.say(format!(
        "upgrade-no-pdb: creating RevisionUpgrade {NAME}: stable → canary ({FROM_REVISION} → {TO_REVISION}), budget {BUDGET}/s, depth {BUDGET}, peak {BUDGET}/s"
    ));
    upgrades
        .create(&PostParams::default(), &obj)
        .await
        .map_err(api_error(format!("creating RevisionUpgrade {NAME}")))?;
    let started = Instant::now();
    let mut said = String::new();
    let status = loop {
        let obj = upgrades
            .get(NAME)
            .await
            .map_err(api_error(format!("reading RevisionUpgrade {NAME}")))?;
        let status = obj.status.unwrap_or_default();
        let progress = status
            .conditions
            .iter()
            .find(|c| c.type_ == "Progressing")
            .map(|c| format!("{}: {}", c.reason, c.message))
            .unwrap_or_default();
        if progress != said {
            sandbox.say(format!("upgrade-no-pdb: {progress}"));
            said = progress;
        }
        match status.phase {
            RevisionUpgradePhase::Complete => break status,
            RevisionUpgradePhase::Aborted | RevisionUpgradePhase::Invalid => {
                let summary = format!(
                    "the upgrade stopped in phase {:?} instead of completing",
                    status.phase
                );
                return Ok(Outcome {
                    pass: false,
                    figures: Map::new(),
                    summary,
                });
            }
            _ => {}
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let seconds = started.elapsed().as_secs_f64();
    // Then: judged from the pods.
    let (margin, at) = sampler
        .least()
        .ok_or_else(|| ScenarioError::Missing("an availability sample".into()))?;
    drop(sampler);
    let list = pods
        .list(&ListParams::default())
        .await
        .map_err(api_error("listing pods"))?;
    let after = census(&list.items);
    let all_moved = after.old == 0 && after.new == before && after.ready == before;
    let pass = margin >= 0 && all_moved;
    let summary = if !all_moved {
        format!(
            "after the upgrade {} proxies run {FROM_REVISION}, {} run {TO_REVISION} ({} Ready) of {before}",
            after.old, after.new, after.ready
        )
    } else if margin < 0 {
        format!("a workload went below its floor: {at}")
    } else {
        format!(
            "all {before} proxies moved to {TO_REVISION} in {seconds:.1} s with no PodDisruptionBudget; the least Available margin was {margin} ({at}); {} workload(s) reported re-injected",
            status.reinjected_by_old_revision.len()
        )
    };
    sandbox.say(format!("upgrade-no-pdb: {summary}"));
    let mut figures = Map::new();
    figures.insert("min_available_margin".into(), Value::from(margin));
    figures.insert("least_margin_at".into(), Value::from(at));
    figures.insert("proxies".into(), Value::from(before));
    figures.insert(
        "upgrade_s".into(),
        Value::from((seconds * 1000.0).round() / 1000.0),
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
    fn the_floor_is_replicas_less_max_unavailable_and_all_of_a_surging_workload() {
        let pct = |s: &str| IntOrString::String(s.into());
        let cases = [
            (4, None, 3),
            (5, Some(IntOrString::Int(2)), 3),
            (1, None, 1),
            (3, Some(IntOrString::Int(0)), 3),
            (3, Some(pct("25%")), 3),
            (10, Some(pct("25%")), 8),
            (3, Some(pct("100%")), 1),
        ];
        for (replicas, own, want) in cases {
            assert_eq!(floor(replicas, own.as_ref()), want, "{replicas} {own:?}");
        }
    }

    fn pod(owner: &str, ready: bool) -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": "p", "namespace": "catalog", "labels": {},
                "ownerReferences": [{"apiVersion": "apps/v1", "kind": "Deployment", "name": owner, "uid": "u", "controller": true}]},
            "status": {"conditions": [{"type": "Ready", "status": if ready {"True"} else {"False"}}]}
        }))
        .unwrap()
    }

    #[test]
    fn the_margin_is_the_least_over_workloads() {
        let pods = [
            pod("web", true),
            pod("web", true),
            pod("web", false),
            pod("solo", true),
        ];
        let available = available_by_workload(pods.iter());
        assert_eq!(available.get("catalog/web"), Some(&2));
        let floors = BTreeMap::from([
            ("catalog/web".to_owned(), (3, 4)),
            ("catalog/solo".to_owned(), (1, 1)),
            ("catalog/cart".to_owned(), (3, 5)),
        ]);
        let (m, at) = least_margin(&floors, &available).unwrap();
        assert_eq!(m, -3, "{at}");
        assert!(at.starts_with("catalog/cart"), "{at}");
    }

    #[test]
    fn the_upgrade_parses_as_the_kind() {
        let u: RevisionUpgrade = serde_json::from_value(upgrade()).unwrap();
        assert_eq!(u.spec.waves.len(), 2);
        assert_eq!(u.spec.disruption.default_max_unavailable, 1);
    }
}
