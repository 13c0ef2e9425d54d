//! Benchmark (not in CI): how long after a wave's soak ends does the wave gate decide that the
//! wave passed? Runs `sites` WaveGates (default 10) of two waves each through a change on the
//! local world (emulator, real Prometheus, Argo CD played by the world) and prints the median,
//! 90th percentile and maximum of `finishedAt − (convergedAt + soak)` over every wave.
//!
//! `cargo run --release -p sluice-wave-gate --example soak_decision_bench -- [sites]`

#[path = "../tests/common/mod.rs"]
mod common;

use std::time::{Duration, Instant};

use common::*;
use sluice_api::v1alpha1::WaveGatePhase;

const SOAK_S: i64 = 2;

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let sites: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(10);
    let names: Vec<String> = (0..sites).map(|i| format!("s{i}")).collect();
    let clusters: Vec<String> = names
        .iter()
        .flat_map(|s| [format!("{s}-1"), format!("{s}-2")])
        .collect();
    let cluster_refs: Vec<&str> = clusters.iter().map(String::as_str).collect();
    let Some(w) = World::start(&cluster_refs).await else {
        eprintln!("the local world is not available (see the SKIPPED line above)");
        return;
    };
    let op = w.operator();
    for s in &names {
        let (c1, c2) = (format!("{s}-1"), format!("{s}-2"));
        w.application_set(&format!("mesh-{s}"), safe_policy(), &[&c1, &c2], &rev('a'))
            .await;
        let waves = serde_json::json!([
            {"name": "canary", "clusters": [c1], "soak": format!("{SOAK_S}s")},
            {"name": "rest", "clusters": [c2], "soak": format!("{SOAK_S}s")}
        ]);
        w.wave_gate(object(s, spec(s, waves, &rev('b')))).await;
    }
    let started = Instant::now();
    // Poll every WaveGate every 10 ms and note, in wall-clock time, when each wave is first seen
    // Passed. Status timestamps have whole-second precision, so the decision time comes from
    // the poll (at most one poll interval plus one API round trip late), and the soak's end from
    // the stored convergedAt the operator itself counts from.
    let mut seen: std::collections::BTreeMap<(String, String), jiff::Timestamp> =
        Default::default();
    let mut latencies_ms = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(300);
    loop {
        let list = w.wave_gates().list(&Default::default()).await.unwrap();
        let now = jiff::Timestamp::now();
        let mut complete = 0;
        for g in &list.items {
            let name = g.metadata.name.clone().unwrap_or_default();
            let Some(st) = &g.status else { continue };
            if st.phase == WaveGatePhase::Complete {
                complete += 1;
            }
            for wave in &st.waves {
                if wave.state == sluice_api::v1alpha1::wave_gate::WaveState::Passed
                    && !seen.contains_key(&(name.clone(), wave.name.clone()))
                {
                    seen.insert((name.clone(), wave.name.clone()), now);
                    let end = wave.converged_at.as_ref().unwrap().0
                        + jiff::SignedDuration::from_secs(SOAK_S);
                    latencies_ms.push(now.duration_since(end).as_secs_f64() * 1000.0);
                }
            }
        }
        if complete == names.len() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "not every site completed within 300 s"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    latencies_ms.sort_by(f64::total_cmp);
    let pick = |q: f64| latencies_ms[((latencies_ms.len() as f64 - 1.0) * q).round() as usize];
    println!(
        "sites={sites} waves={} all complete in {:.1}s",
        latencies_ms.len(),
        started.elapsed().as_secs_f64()
    );
    println!(
        "gate decision latency after the soak ends: median {:.0} ms, p90 {:.0} ms, max {:.0} ms",
        pick(0.5),
        pick(0.9),
        pick(1.0)
    );
    op.stop().await;
    w.stop().await;
}
