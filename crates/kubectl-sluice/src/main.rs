//! `kubectl-sluice`: the kubectl plugin of sluice (`kubectl sluice ...`).
//!
//! Owns argument parsing and dispatch to one module per command group; each group owns its own
//! output. Today it has the `bundle` group (render, push, sign, verify, inspect, generate-key-pair);
//! further groups are added as variants of [`Command`] with their own module. It must never apply
//! anything to a cluster on its own initiative, and never print key material or passwords.

mod bundle;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// Exit code for a failure that is not a refused signature.
pub const EXIT_FAILURE: u8 = 1;

/// Operator-facing commands for sluice.
#[derive(Debug, Parser)]
#[command(name = "kubectl-sluice", bin_name = "kubectl sluice", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Render, push, sign, verify and inspect signed OCI bundles of mesh configuration.
    Bundle(bundle::BundleArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(err) => {
            eprintln!("error: cannot start the async runtime: {err}");
            return ExitCode::from(EXIT_FAILURE);
        }
    };
    let result = runtime.block_on(async {
        match cli.command {
            Command::Bundle(args) => bundle::run(args).await,
        }
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(code) => ExitCode::from(code),
    }
}
