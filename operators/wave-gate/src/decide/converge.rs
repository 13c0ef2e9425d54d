//! The Converging phase: what a wave's clusters report (Applications Synced and Healthy at the
//! revision, proxies caught up), and the wave soaking once they converge or halted when they do
//! not within the convergence timeout.

use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use sluice_api::v1alpha1::WaveGateSpec;
use sluice_api::v1alpha1::wave_gate::{
    DriftExporter, HaltReason, WaveState, conditions as types, reasons,
};
use sluice_runtime::{conditions::Status, events::Notice};

use super::halt::{finish_halt, halt};
use super::model::{
    AppView, EventAction, Machine, Observations, Requeue, add, ceil_second, convergence_timeout,
    interval, soak, ts, until,
};

/// What a wave's clusters report.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Convergence {
    pub(super) counts: sluice_api::v1alpha1::wave_gate::ApplicationCounts,
    pub(super) proxies_behind: Option<f64>,
    pub(super) ok: bool,
    pub(super) detail: String,
}

pub(super) fn convergence(
    spec: &WaveGateSpec,
    wave: usize,
    revision: &str,
    obs: &Observations,
) -> Convergence {
    let clusters = &spec.waves[wave].clusters;
    let apps: Vec<&AppView> = obs
        .applications
        .iter()
        .filter(|a| clusters.contains(&a.cluster))
        .collect();
    let counts = sluice_api::v1alpha1::wave_gate::ApplicationCounts {
        total: apps.len() as u32,
        synced: apps.iter().filter(|a| a.synced_at(revision)).count() as u32,
        healthy: apps.iter().filter(|a| a.healthy).count() as u32,
    };
    let mut problems = Vec::new();
    let without: Vec<&str> = clusters
        .iter()
        .filter(|c| !apps.iter().any(|a| &a.cluster == *c))
        .map(String::as_str)
        .collect();
    if !without.is_empty() {
        problems.push(format!(
            "no Application for cluster(s) {}",
            without.join(", ")
        ));
    }
    if counts.synced < counts.total || counts.healthy < counts.total {
        problems.push(format!(
            "{}/{} Applications Synced at the revision, {}/{} Healthy",
            counts.synced, counts.total, counts.healthy, counts.total
        ));
    }
    let mut proxies_behind = None;
    if spec.drift_gate.exporter == DriftExporter::Platform {
        let mut sum = 0.0;
        let mut missing = Vec::new();
        let mut behind = Vec::new();
        for c in clusters {
            match obs.drift.get(c).copied().flatten() {
                Some(v) if !v.is_nan() => {
                    sum += v;
                    if v > f64::from(spec.drift_gate.max_proxies_behind) {
                        behind.push(format!("{c}={v}"));
                    }
                }
                _ => missing.push(c.as_str()),
            }
        }
        if missing.len() < clusters.len() {
            proxies_behind = Some(sum);
        }
        if !missing.is_empty() {
            problems.push(format!(
                "no drift signal for cluster(s) {} (a missing signal never passes)",
                missing.join(", ")
            ));
        }
        if !behind.is_empty() {
            problems.push(format!(
                "proxies behind (max {}): {}",
                spec.drift_gate.max_proxies_behind,
                behind.join(", ")
            ));
        }
    }
    Convergence {
        counts,
        proxies_behind,
        ok: problems.is_empty(),
        detail: problems.join("; "),
    }
}

pub(super) fn converge(cx: &mut Machine<'_>, i: usize) -> Option<Requeue> {
    let spec = cx.spec;
    let c = convergence(spec, i, &spec.revision, cx.obs);
    let ws = &mut cx.decision.status.waves[i];
    ws.applications = Some(c.counts.clone());
    ws.proxies_behind = c.proxies_behind;
    let admitted_at = ws.admitted_at.as_ref().map_or(cx.now, ts);
    if c.ok {
        ws.state = WaveState::Soaking;
        // Status times have whole-second precision: the soak starts at the next whole second,
        // so the soak a restarted operator reads back is never shorter than the one decided.
        ws.converged_at = Some(Time(ceil_second(cx.now)));
        ws.gates.clear();
        let end = add(ceil_second(cx.now), soak(spec, i));
        let note = format!(
            "wave {} converged at {}; soaking until {end}",
            spec.waves[i].name, spec.revision
        );
        cx.decision.condition(
            cx.stamp(),
            types::PROGRESSING,
            Status::True,
            reasons::SOAKING,
            note.clone(),
        );
        cx.decision
            .event(Notice::normal(reasons::SOAKING, EventAction::Soak, note));
        // Gates are due at once.
        return Some(Requeue::After(Duration::ZERO));
    }
    let deadline = add(admitted_at, convergence_timeout(spec));
    if cx.now >= deadline {
        let message = format!(
            "wave {} did not converge within {}: {}",
            spec.waves[i].name, spec.convergence_timeout, c.detail
        );
        halt(cx, i, HaltReason::ConvergenceTimeout, message, None);
        return Some(finish_halt(cx));
    }
    Some(Requeue::After(interval(spec).min(until(cx.now, deadline))))
}
