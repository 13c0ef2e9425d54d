//! Ingestion benchmark: N simulated two-version services (default 1,000) written by the mesh
//! telemetry loop to a local Prometheus at the fixed interval, for a while; prints the series per
//! tick, the samples per second Prometheus accepted, and how long each write took against the
//! interval (a write longer than the interval means the loop cannot keep up).
//!
//! `cargo run --release -p sluice-sim --example ingest_bench -- [services] [interval_s] [seconds]`

use sluice_sim::{Scenario, World};
use sluice_testkit::prometheus::Prometheus;
use std::time::{Duration, Instant};

fn scenario(services: usize) -> Scenario {
    let mut yaml = String::from("name: ingest-bench\ndescription: many services\nservices:\n");
    for i in 0..services {
        yaml.push_str(&format!(
            "  - name: svc-{i:04}\n    namespace: bench-{}\n    requests_per_second: 50\n    versions:\n      - {{name: v1, backend: svc-{i:04}-v1, error_ratio: 0.01}}\n      - {{name: v2, backend: svc-{i:04}-v2, error_ratio: 0.01}}\n",
            i % 50
        ));
    }
    Scenario::from_yaml(&yaml).expect("generated scenario is valid")
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let arg = |i: usize, default: u64| args.get(i).and_then(|a| a.parse().ok()).unwrap_or(default);
    let services = arg(0, 1000) as usize;
    let interval = Duration::from_secs(arg(1, 5));
    let run_for = Duration::from_secs(arg(2, 30));
    let prometheus = match Prometheus::start().await {
        Ok(p) => p,
        Err(e) => {
            eprintln!("cannot run the benchmark: {e}");
            std::process::exit(2);
        }
    };
    let emu = kube_emulator::Emulator::start().await;
    let world = World::builder()
        .telemetry_only("bench", emu.client())
        .telemetry(prometheus.url(), scenario(services), interval)
        .start()
        .expect("world starts");
    let started = Instant::now();
    tokio::time::sleep(run_for).await;
    let elapsed = started.elapsed().as_secs_f64();
    let stats = world.mesh().expect("telemetry runs").stats();
    let count = prometheus
        .query(
            r#"count({__name__=~"istio_request.*", cluster="bench"})"#,
            None,
        )
        .await
        .map(|v| v.first().map_or(0.0, |s| s.value))
        .unwrap_or(f64::NAN);
    let mean_write = stats.write_time.as_secs_f64() / stats.ticks.max(1) as f64;
    println!("services:              {services}");
    println!("interval:              {interval:?}");
    println!("ticks:                 {}", stats.ticks);
    println!("series per tick:       {}", stats.series_last_tick);
    println!("series in Prometheus:  {count}");
    println!("samples accepted:      {}", stats.samples_written);
    println!(
        "ingestion rate:        {:.0} samples/s (over {elapsed:.1} s)",
        stats.samples_written as f64 / elapsed
    );
    println!(
        "steady-state rate:     {:.0} samples/s (series per tick / interval)",
        stats.series_last_tick as f64 / interval.as_secs_f64()
    );
    println!(
        "write time per tick:   mean {:.3} s, max {:.3} s (interval {:.1} s)",
        mean_write,
        stats.max_write.as_secs_f64(),
        interval.as_secs_f64()
    );
    println!(
        "write errors:          {} {}",
        stats.write_errors,
        stats.last_error.unwrap_or_default()
    );
    let keeps_up = stats.max_write < interval && stats.write_errors == 0;
    println!("keeps up:              {keeps_up}");
}
