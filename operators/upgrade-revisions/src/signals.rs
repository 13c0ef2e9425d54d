//! The signals a tick reads from the metrics source: the issuance counter (the sum over every CA
//! replica, over a window) and, when due, the current wave's gate verdicts with their pre-wave
//! baselines. A gate whose query cannot be built is reported Inconclusive naming why, under its
//! own policy; one that cannot be resolved is reported to `decide`, which judges it under the
//! upgrade's `spec.inconclusive`; each configuration problem is reported naming the gate and
//! the field. Never writes anything.

use std::{
    collections::{BTreeMap, BTreeSet},
    time::Duration,
};

use k8s_openapi::jiff::Timestamp;
use kube::Api;
use sluice_analysis::{CheckError, GateAction, GateCheck, GateTemplates};
use sluice_api::v1alpha1::GateQuery;
use sluice_api::v1alpha1::{
    BaselineSource, CapturedBaseline, GateTemplate, GateVerdict, RevisionUpgradeSpec,
    RevisionUpgradeStatus, Verdict, VerdictReason,
    revision_upgrade::{NamespaceState, UpgradeWaveState, UpgradeWaveStatus},
};

use crate::{
    context::{Context, Metrics},
    decide::{GateReport, Observations, UnresolvedGate},
    pacing::IssuanceReading,
};

/// Default length of the window background issuance is measured over.
pub const DEFAULT_ISSUANCE_WINDOW: Duration = Duration::from_secs(60);

/// Reads the issuance counter and, when due, the gates of the current wave.
pub(crate) async fn read_metrics(
    ctx: &Context,
    name: &str,
    spec: &RevisionUpgradeSpec,
    status: Option<&RevisionUpgradeStatus>,
    obs: &mut Observations,
    now: Timestamp,
) {
    let Some(m) = &ctx.metrics_source else {
        obs.issuance_problem = Some(
            "no metrics source is configured (--prometheus-url), so issuance cannot be observed"
                .into(),
        );
        return;
    };
    match issuance(ctx, name, m, status, now).await {
        Ok(r) => obs.issuance = Some(r),
        Err(why) => obs.issuance_problem = Some(why),
    }
    obs.gates = gates(ctx, name, m, spec, status, now).await;
}

/// Issuance over the last window (the sum of every CA replica's increase, resets handled), and
/// sluice's own issuance in the same window: the meshed pods first seen in the namespaces it is
/// moving in the window, at most the restarts it started since a minute before the window (a
/// pod created there for another reason is not taken for sluice's beyond what it started).
pub(crate) async fn issuance(
    ctx: &Context,
    name: &str,
    m: &Metrics,
    status: Option<&RevisionUpgradeStatus>,
    now: Timestamp,
) -> Result<IssuanceReading, String> {
    use sluice_analysis::MetricsSource;
    let window = m.issuance_window;
    let series = crate::issuance::series(&m.issuance_series, &m.cluster);
    let answer = m
        .engine
        .source()
        .query(&crate::issuance::query(&series, window), now)
        .await
        .map_err(|e| format!("reading {series}: {e}"))?;
    let part = |p: &str| {
        answer
            .iter()
            .find(|s| s.labels.get("part").map(String::as_str) == Some(p))
            .map(|s| s.value)
    };
    let now_s = now.as_millisecond() as f64 / 1000.0;
    let issued = crate::issuance::interpret(
        &series,
        part("value"),
        part("ts"),
        part("early"),
        window,
        now_s,
    )?;
    let (t0, t1) = (now_s - window.as_secs_f64(), now_s);
    let span = window.as_secs_f64();
    let (t0_ms, t1_ms) = ((t0 * 1000.0) as i64, (t1 * 1000.0) as i64);
    let moving: BTreeSet<String> = status
        .map(|s| {
            s.namespaces
                .iter()
                .filter(|n| {
                    matches!(
                        n.state,
                        NamespaceState::Restarting
                            | NamespaceState::RollingBack
                            | NamespaceState::Moved
                    )
                })
                .map(|n| n.name.clone())
                .collect()
        })
        .unwrap_or_default();
    let births = ctx
        .fleet
        .as_ref()
        .map_or(0, |f| f.births.count(t0_ms, t1_ms, &moving));
    let mut memory = ctx.memory.lock().expect("memory lock");
    let mem = memory.entry(name.to_owned()).or_default();
    let horizon = now.as_millisecond() - 2 * window.as_millis() as i64 - 60_000;
    while mem.own.front().is_some_and(|(t, _)| *t < horizon) {
        mem.own.pop_front();
    }
    let started: u32 = mem
        .own
        .iter()
        .filter(|(t, _)| *t > t0_ms - 60_000 && *t <= t1_ms)
        .map(|(_, n)| n)
        .sum();
    Ok(IssuanceReading {
        window_seconds: span,
        issued,
        own: f64::from(births.min(started)),
    })
}

/// The current wave's gate report: evaluated every analysis interval, reused in between.
pub(crate) async fn gates(
    ctx: &Context,
    name: &str,
    m: &Metrics,
    spec: &RevisionUpgradeSpec,
    status: Option<&RevisionUpgradeStatus>,
    now: Timestamp,
) -> Option<GateReport> {
    let status = status?;
    if status.aborted_at.is_some() {
        return None;
    }
    let index = status.current_wave_index? as usize;
    let wave = status.waves.get(index)?;
    if !matches!(
        wave.state,
        UpgradeWaveState::Restarting | UpgradeWaveState::Soaking
    ) {
        return None;
    }
    let interval = spec
        .analysis_interval
        .parse()
        .unwrap_or(Duration::from_secs(30));
    {
        let memory = ctx.memory.lock().expect("memory lock");
        if let Some((at, report)) = memory.get(name).and_then(|m| m.gates.as_ref())
            && report.wave == wave.name
            && now.duration_since(*at)
                < jiff::SignedDuration::try_from(interval).unwrap_or_default()
        {
            return Some(report.clone());
        }
    }
    // The namespaces the wave moves: a gate naming `{{namespace}}` is judged once per each.
    let namespaces: Vec<String> = status
        .namespaces
        .iter()
        .filter(|n| n.wave == wave.name)
        .map(|n| n.name.clone())
        .collect();
    let mut checks = Vec::new();
    // The gate (index into `names`) each check judges.
    let mut of_gate: Vec<usize> = Vec::new();
    let mut names: Vec<String> = Vec::new();
    let mut unresolved: Vec<UnresolvedGate> = Vec::new();
    let mut misconfigured: Vec<String> = Vec::new();
    let gates = spec.effective_gates();
    let api = Api::<GateTemplate>::all(ctx.client.clone());
    let templates = GateTemplates::read(&gates, |name| {
        let api = api.clone();
        async move { Ok::<_, kube::Error>(api.get_opt(&name).await?.map(|t| t.spec)) }
    })
    .await;
    for gate in gates {
        let resolved = match resolve(&templates, &gate, spec) {
            Ok(r) => r,
            Err(why) => {
                // Judged by `decide` under spec.inconclusive; only a failed read of the
                // template is not a configuration problem (it is read again next time).
                let read_failed = gate
                    .template_ref
                    .as_deref()
                    .is_some_and(|t| templates.unreadable.contains_key(t));
                let message = format!("spec.gates {}: {why}", gate.name);
                if !read_failed {
                    misconfigured.push(message.clone());
                }
                unresolved.push(UnresolvedGate {
                    gate: gate.name.clone(),
                    message,
                });
                continue;
            }
        };
        let per_namespace =
            matches!(&resolved.query, GateQuery::PromQl(q) if q.contains("{{namespace}}"));
        let scopes: Vec<Option<&str>> = if per_namespace {
            namespaces.iter().map(|n| Some(n.as_str())).collect()
        } else {
            vec![None]
        };
        let previous = wave.gates.iter().find(|v| v.gate == gate.name).cloned();
        names.push(gate.name.clone());
        for scope in scopes {
            let mut vars: BTreeMap<String, String> = [
                ("cluster", m.cluster.as_str()),
                ("revision", spec.to_revision.as_str()),
                ("tag", spec.to_tag.as_str()),
                ("wave", wave.name.as_str()),
            ]
            .into_iter()
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
            .collect();
            if let Some(ns) = scope {
                vars.insert("namespace".into(), ns.to_owned());
            }
            let owner = match scope {
                Some(ns) => format!("RevisionUpgrade {name} namespace {ns}"),
                None => format!("RevisionUpgrade {name}"),
            };
            let mut check = GateCheck::new(owner, resolved.clone(), vars);
            check.owner_namespaced = false;
            check.previous = previous.clone();
            checks.push(check);
            of_gate.push(names.len() - 1);
        }
    }
    let (baselines, missing_baselines) =
        pre_wave_baselines(m, status, wave, &mut checks, now).await;
    let report = m.engine.tick(&checks, now).await;
    // Per gate, the worst of its checks: Fail, then Inconclusive, then Pass; a namespace with no
    // traffic at all (NoData) is no news unless every namespace of the gate has none.
    let rank = |v: &GateVerdict| match (v.verdict, v.reason) {
        (Verdict::Fail, _) => 3,
        (Verdict::Inconclusive, VerdictReason::NoData) => 1,
        (Verdict::Inconclusive, _) => 2,
        (Verdict::Pass, _) => 0,
    };
    let mut worst: Vec<Option<(GateVerdict, GateAction)>> = vec![None; names.len()];
    for (i, ((check, outcome), gate)) in
        checks.iter().zip(report.outcomes).zip(&of_gate).enumerate()
    {
        let (mut verdict, a) = match outcome.verdict {
            Ok(v) => {
                let a = sluice_analysis::action(&check.gate, &v, now);
                (v, a)
            }
            Err(e) => {
                // A query that cannot be built (an unknown `{{variable}}`, PromQL that does not
                // parse) is a configuration problem, Inconclusive under the gate's own policy
                // (sustained, it pauses, aborts or continues), never an eternal Wait.
                let why = match &e {
                    CheckError::Template { source, .. } => source.to_string(),
                    other => other.to_string(),
                };
                let message = format!("spec.gates {}: {why}", check.gate.name);
                if !misconfigured.contains(&message) {
                    misconfigured.push(message);
                }
                let v = sluice_analysis::unevaluated(
                    &check.gate.name,
                    &e.to_string(),
                    check.previous.as_ref(),
                    now,
                );
                let a = sluice_analysis::action(&check.gate, &v, now);
                (v, a)
            }
        };
        if let Some(why) = missing_baselines.get(&i) {
            let m = verdict.message.take().unwrap_or_default();
            verdict.message = Some(format!("{m}: {why}"));
        }
        if check.vars.contains_key("namespace")
            && let Some(ns) = check.vars.get("namespace")
        {
            let m = verdict.message.take().unwrap_or_default();
            let mut m = format!("namespace {ns}: {m}");
            m.truncate(1000);
            verdict.message = Some(m);
        }
        let slot = &mut worst[*gate];
        if slot.as_ref().is_none_or(|(w, _)| rank(&verdict) > rank(w)) {
            *slot = Some((verdict, a));
        }
    }
    let (verdicts, actions): (Vec<GateVerdict>, Vec<GateAction>) =
        worst.into_iter().flatten().unzip();
    let (action, _) = sluice_analysis::combined_action(actions);
    let report = GateReport {
        wave: wave.name.clone(),
        verdicts,
        action: Some(action),
        baselines,
        unresolved,
        misconfigured,
    };
    ctx.memory
        .lock()
        .expect("memory lock")
        .entry(name.to_owned())
        .or_default()
        .gates = Some((now, report.clone()));
    Some(report)
}

/// The pre-wave baselines of the `checks` compared with `baseline: PreChangeWindow`: each
/// check's own reading (same gate, same namespace) over the window that ends when the wave
/// started, before its first relabel and restart. Kept ones (status) are reused; missing ones are
/// captured now (queried at the wave's start, so a later capture reads the same pre-wave data).
/// Returns the baselines to keep and, per check left without one, why (the check then stays
/// Inconclusive `BaselineMissing` under its gate's policy, and the capture is tried again at the
/// next evaluation).
pub(crate) async fn pre_wave_baselines(
    m: &Metrics,
    status: &RevisionUpgradeStatus,
    wave: &UpgradeWaveStatus,
    checks: &mut [GateCheck],
    now: Timestamp,
) -> (Vec<CapturedBaseline>, BTreeMap<usize, String>) {
    let mut kept = Vec::new();
    let mut why = BTreeMap::new();
    let Some(start) = wave.started_at.as_ref().map(|t| t.0) else {
        return (kept, why);
    };
    let mut missing = Vec::new();
    for (i, check) in checks.iter_mut().enumerate() {
        let pre_wave = check
            .gate
            .comparison
            .relative
            .as_ref()
            .is_some_and(|r| r.baseline == BaselineSource::PreChangeWindow);
        if !pre_wave {
            continue;
        }
        let scope = check.vars.get("namespace").cloned();
        match status
            .captured_baselines
            .iter()
            .find(|b| b.gate == check.gate.name && b.scope == scope && b.window_end.0 == start)
        {
            Some(b) => {
                check.captured_baseline = Some(b.clone());
                kept.push(b.clone());
            }
            None => missing.push(i),
        }
    }
    if missing.is_empty() {
        return (kept, why);
    }
    let wanted: Vec<GateCheck> = missing.iter().map(|&i| checks[i].clone()).collect();
    let captured = m.engine.capture_baselines(&wanted, start, now).await;
    for (&i, result) in missing.iter().zip(captured) {
        match result {
            Ok(mut b) => {
                b.scope = checks[i].vars.get("namespace").cloned();
                checks[i].captured_baseline = Some(b.clone());
                kept.push(b);
            }
            Err(e) => {
                why.insert(
                    i,
                    format!("no baseline captured before the wave started ({e})"),
                );
            }
        }
    }
    (kept, why)
}

/// `gate` resolved against the wave's GateTemplates, under the RevisionUpgrade's `inconclusive`
/// policy where neither the gate nor an unlocked template sets one (as the field documents).
fn resolve<E: std::fmt::Display>(
    templates: &GateTemplates<E>,
    gate: &sluice_api::v1alpha1::Gate,
    spec: &RevisionUpgradeSpec,
) -> Result<sluice_api::v1alpha1::ResolvedGate, String> {
    templates.resolve(gate, Some(&spec.inconclusive))
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use sluice_api::v1alpha1::{Gate, InconclusiveAction};

    use super::*;

    #[test]
    fn the_upgrades_inconclusive_policy_applies_where_a_gate_sets_none() {
        let spec: RevisionUpgradeSpec = serde_json::from_value(serde_json::json!({
            "fromTag": "stable", "fromRevision": "1-27",
            "toTag": "canary", "toRevision": "1-28",
            "inconclusive": {"action": "Abort", "after": "1m"},
        }))
        .unwrap();
        let templates = GateTemplates::<String> {
            found: BTreeMap::new(),
            unreadable: BTreeMap::new(),
        };
        let plain: Gate = serde_json::from_value(serde_json::json!({
            "name": "errors", "builtin": "ErrorRatioVsStable"
        }))
        .unwrap();
        let r = resolve(&templates, &plain, &spec).unwrap();
        assert_eq!(
            (r.inconclusive_action, r.inconclusive_after),
            (InconclusiveAction::Abort, Duration::from_secs(60)),
            "the RevisionUpgrade's policy"
        );
        let own: Gate = serde_json::from_value(serde_json::json!({
            "name": "errors", "builtin": "ErrorRatioVsStable",
            "inconclusive": {"action": "Continue", "after": "2m"},
        }))
        .unwrap();
        let r = resolve(&templates, &own, &spec).unwrap();
        assert_eq!(
            (r.inconclusive_action, r.inconclusive_after),
            (InconclusiveAction::Continue, Duration::from_secs(120)),
            "the gate's own policy wins"
        );
    }
}
