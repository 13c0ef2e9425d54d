//! Binary entry point of sluice-wave-gate: flags, then the shared runtime runs the WaveGate
//! controller while this replica holds the Lease.
#![forbid(unsafe_code)]

use std::{process::ExitCode, sync::Arc};

use clap::Parser;
use sluice_runtime::{Runtime, RuntimeArgs};
use sluice_wave_gate::{OPERATOR, reconcile};

/// Gates a site's ApplicationSet across cluster waves of mesh configuration changes.
#[derive(Debug, Parser)]
#[command(name = OPERATOR, version)]
struct Cli {
    #[command(flatten)]
    runtime: RuntimeArgs,
    /// Allow free-form PromQL in gates of namespaced objects (it runs with the operator's view
    /// of all metrics).
    #[arg(long, env = "SLUICE_ALLOW_FREE_FORM_PROMQL", default_value_t = false)]
    allow_free_form_promql: bool,
}

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = async {
        let rt = Runtime::init(OPERATOR, cli.runtime).await?;
        let api = rt.namespaced_api();
        let ctx = Arc::new(reconcile::Context {
            allow_free_form_promql: cli.allow_free_form_promql,
            ..reconcile::Context::new(rt.client.clone(), rt.recorder.clone())
        });
        rt.run(api, ctx, reconcile::reconcile).await
    }
    .await;
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("{OPERATOR}: {err}");
            tracing::error!(error = %err, "{OPERATOR} failed to start");
            ExitCode::FAILURE
        }
    }
}
