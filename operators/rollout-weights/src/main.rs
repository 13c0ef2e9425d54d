//! Binary entry point of sluice-rollout-weights: flags, then the shared runtime runs the Rollout
//! controller while this replica holds the Lease.
#![forbid(unsafe_code)]

use std::{process::ExitCode, sync::Arc};

use clap::Parser;
use sluice_rollout_weights::{OPERATOR, reconcile};
use sluice_runtime::{Runtime, RuntimeArgs};

/// Sole writer of canary weights on a Gateway API HTTPRoute for the life of a Rollout.
#[derive(Debug, Parser)]
#[command(name = OPERATOR, version)]
struct Cli {
    #[command(flatten)]
    runtime: RuntimeArgs,
}

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = async {
        let rt = Runtime::init(OPERATOR, cli.runtime).await?;
        let api = rt.namespaced_api();
        let ctx = Arc::new(reconcile::Context::new(
            rt.client.clone(),
            rt.recorder.clone(),
        ));
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
