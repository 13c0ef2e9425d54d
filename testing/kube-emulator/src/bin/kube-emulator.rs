//! `kube-emulator --kubeconfig PATH [--port N] [--rbac] [--manifest FILE]...`: runs one emulator
//! until SIGTERM or Ctrl-C, printing the port and the kubeconfig path when ready.
//!
//! Only wires flags to the library; never adds behaviour of its own.

use std::path::PathBuf;

use clap::Parser;

/// Runs a Kubernetes API emulator on 127.0.0.1.
#[derive(Debug, Parser)]
#[command(name = "kube-emulator", version)]
struct Args {
    /// Where to write the administrator kubeconfig.
    #[arg(long)]
    kubeconfig: PathBuf,
    /// Port on 127.0.0.1 (0 picks a free one).
    #[arg(long, default_value_t = 0)]
    port: u16,
    /// Enforce RBAC for every user but the administrator.
    #[arg(long)]
    rbac: bool,
    /// YAML manifests (CRDs and objects) created at start; repeatable.
    #[arg(long = "manifest")]
    manifests: Vec<PathBuf>,
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .init();
    let args = Args::parse();
    let options = kube_emulator::Options {
        port: args.port,
        rbac: args.rbac,
        manifests: args.manifests,
        ..Default::default()
    };
    let emu = match kube_emulator::Emulator::start_with(options).await {
        Ok(e) => e,
        Err(e) => {
            eprintln!("kube-emulator: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    if let Err(e) = emu.write_kubeconfig(&args.kubeconfig) {
        eprintln!("kube-emulator: {e}");
        return std::process::ExitCode::FAILURE;
    }
    println!(
        "kube-emulator listening on {} (port {}), kubeconfig {}",
        emu.base_url(),
        emu.port(),
        args.kubeconfig.display()
    );
    let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("kube-emulator: cannot install the SIGTERM handler: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    tokio::select! {
        _ = term.recv() => {}
        _ = tokio::signal::ctrl_c() => {}
    }
    emu.shutdown().await;
    std::process::ExitCode::SUCCESS
}
