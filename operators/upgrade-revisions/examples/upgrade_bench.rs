//! Benchmark (not a test, not in CI): upgrades a simulated fleet from revision 1-27 to 1-28 on
//! the API emulator with the cluster simulator and a real Prometheus, and prints the issuance
//! figures of the issue:
//!
//! - `peak_issuance_ratio`: the largest, over every window between two samples of the
//!   simulator's SVID counter, of issuance ÷ what the budget allows in that window
//!   (`min(depth + rate × w, peak × ⌈w⌉)`); goal ≤ 1.0.
//! - `budget_utilisation`: restarts per second achieved while waves restarted (soaks excluded) ÷
//!   the headroom the budget left (its rate less the background, here none); goal ≥ 0.8.
//! - `time_ratio`: restart time ÷ (proxies ÷ headroom); goal ≤ 1.25.
//!
//! `cargo run -p sluice-upgrade-revisions --example upgrade_bench -- [workloads] [replicas]
//! [rate] [depth] [peak] [issuance window seconds]` (defaults 2000 × 20 = 40,000 proxies, 200/s,
//! 2000, 2000/s, 60 s as the operator's default;
//! `BENCH_VERBOSE=1` prints the budget every 2 s, `RUST_LOG=warn` the warnings). The workloads are spread over 20 namespaces:
//! 5% of them low-risk, 30% tier-2, the rest tier-1. Keep `depth` well above `rate` (the default
//! is 10×): a tick that comes late can refill at most `depth`.

#[path = "../tests/common/mod.rs"]
mod common;

use std::time::{Duration, Instant};

use common::{Harness, NsSpec, pods_of};
use serde_json::json;
use sluice_api::v1alpha1::{RevisionUpgradePhase, revision_upgrade::UpgradeWaveState};

fn arg<T: std::str::FromStr>(i: usize, default: T) -> T {
    std::env::args()
        .nth(i)
        .and_then(|a| a.parse().ok())
        .unwrap_or(default)
}

fn leak(s: String) -> &'static str {
    Box::leak(s.into_boxed_str())
}

#[tokio::main]
async fn main() {
    // `RUST_LOG=warn` shows what the simulator and the operator retry.
    if std::env::var_os("RUST_LOG").is_some() {
        tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
            .init();
    }
    let workloads: usize = arg(1, 2000);
    let replicas: i32 = arg(2, 20);
    let rate: f64 = arg(3, 200.0);
    let depth: f64 = arg(4, 2000.0);
    let peak: f64 = arg(5, 2000.0);
    let namespaces = 20.min(workloads.max(1));
    let per_ns = workloads.div_ceil(namespaces);
    let fleet: Vec<NsSpec> = (0..namespaces)
        .map(|i| {
            let share = i as f64 / namespaces as f64;
            let tier = if share < 0.05 {
                "low"
            } else if share < 0.35 {
                "tier-2"
            } else {
                "tier-1"
            };
            let n = per_ns.min(workloads.saturating_sub(i * per_ns));
            NsSpec {
                name: leak(format!("ns-{i:04}")),
                tier: Some(tier),
                deployments: (0..n)
                    .map(|d| (leak(format!("app-{d:02}")), replicas))
                    .collect(),
            }
        })
        .collect();
    let proxies = pods_of(&fleet);
    println!(
        "fleet: {namespaces} namespaces, {workloads} workloads, {proxies} proxies; budget {rate}/s depth {depth} peak {peak}/s"
    );
    let setup = Instant::now();
    // The operator's default window (its flag `--issuance-window-seconds`): a short window
    // magnifies the edges where a restart's certificate and its sighting fall apart.
    let window = Duration::from_secs(arg(6, 60));
    let Some(mut h) = Harness::given_with_window(&fleet, window).await else {
        return;
    };
    println!("fleet ready in {:.1}s", setup.elapsed().as_secs_f64());
    h.start_operator().await;
    h.sample_issuance();
    let started = Instant::now();
    h.when_upgrade(json!({
        "issuanceBudget": {"rate": rate as u32, "depth": depth as u32, "peakPerSecond": peak as u32},
        "waves": [
            {"name": "low-risk", "namespaceSelector": {"matchLabels": {"sluice.dev/risk-tier": "low"}}, "soak": "3s"},
            {"name": "tier-2", "namespaceSelector": {"matchLabels": {"sluice.dev/risk-tier": "tier-2"}}, "soak": "3s"},
            {"name": "tier-1", "namespaceSelector": {}, "soak": "3s"},
        ],
    }))
    .await;
    // Restart time: the time any wave spends Restarting (soaks excluded), polled every 100 ms.
    let mut restart_time = Duration::ZERO;
    let mut last = Instant::now();
    let verbose = std::env::var_os("BENCH_VERBOSE").is_some();
    let mut said = Instant::now();
    // Generous: past the budget's own pace, what runs late is the simulator replacing pods.
    let deadline = Instant::now()
        + Duration::from_secs(120)
        + Duration::from_secs_f64(proxies as f64 / rate * 10.0);
    loop {
        let obj = h.upgrade().await;
        let now = Instant::now();
        let status = obj.status.clone().unwrap_or_default();
        let restarting = status
            .current_wave_index
            .and_then(|i| status.waves.get(i as usize))
            .is_some_and(|w| w.state == UpgradeWaveState::Restarting);
        if restarting {
            restart_time += now - last;
        }
        if verbose && said.elapsed() >= Duration::from_secs(2) {
            said = Instant::now();
            let b = status.issuance_budget.clone().unwrap_or_default();
            let p = status.proxies.clone().unwrap_or_default();
            println!(
                "{:>5.1}s {:?} wave {:?}: old {} new {}; tokens {:.1}, observed {:.1}/s, background {:.1}/s, throttled {}",
                started.elapsed().as_secs_f64(),
                status.phase,
                status.current_wave,
                p.old,
                p.new,
                b.tokens,
                b.observed_rate,
                b.background_rate,
                b.throttled
            );
        }
        last = now;
        if status.phase == RevisionUpgradePhase::Complete {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "upgrade did not complete in time: {status:#?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let total = started.elapsed();
    let headroom = rate; // no background issuance in this run
    let restart_s = restart_time.as_secs_f64();
    let (ratio, at) = h.peak_issuance_ratio(rate, depth, peak);
    let utilisation = (proxies as f64 / restart_s) / headroom;
    let time_ratio = restart_s / (proxies as f64 / headroom);
    println!(
        "upgrade complete in {:.1}s (restarting {restart_s:.1}s, soaks and gates the rest)",
        total.as_secs_f64()
    );
    println!("peak_issuance_ratio {ratio:.3}  ({at})");
    println!("budget_utilisation {utilisation:.3}");
    println!("time_ratio {time_ratio:.3}");
    println!("svids_issued {}", h.svid.get());
    h.shutdown().await;
}
