//! `sluice-sandbox`: flags, signals and exit codes around [`sluice_sandbox::Sandbox`]. Owns the
//! command line only; everything it starts is started and stopped by the library.
#![forbid(unsafe_code)]

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, ValueEnum};
use sluice_sandbox::metrics::MetricsKind;
use sluice_sandbox::sandbox::ControlPlaneKind;
use sluice_sandbox::scenarios::{self, Outcome};
use sluice_sandbox::{Options, Sandbox, topology};
use tokio::signal::unix::{SignalKind, signal};

/// Whether to run the operator binaries.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Operators {
    /// Run them: built first with cargo when started through cargo (a no-op when up to date),
    /// else taken from beside this binary.
    On,
    /// Do not run them (clusters, Prometheus, registry, git and the mesh only).
    Off,
}

/// What serves each cluster's Kubernetes API.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum ControlPlane {
    /// The embedded API emulator (fast; the simulator plays the workload controllers).
    Emulator,
    /// A real kube-apiserver per cluster on one shared etcd (`bash
    /// scripts/install-control-plane.sh` builds them); workload clusters run the real
    /// kube-controller-manager, the simulator plays the kubelet and Istio's injector webhook.
    Real,
}

/// Where the telemetry goes and the operators read it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Metrics {
    /// One Prometheus for every cluster, read directly.
    Prometheus,
    /// As production reads metrics: a Prometheus per cluster (external labels `cluster`,
    /// `site`) with a Thanos sidecar, and Thanos Query over the sidecars with
    /// strict endpoints (`--endpoint.sd-config`); the operators read through Thanos Query (`bash
    /// scripts/install-control-plane.sh` builds thanos).
    Thanos,
}

/// The sluice sandbox: two sites (east, west), each a management cluster running a simulated
/// Argo CD plus two workload clusters, all Kubernetes API emulators on loopback; a real
/// Prometheus fed by the mesh simulator; the OCI registry; a git intent repository; the four
/// operator binaries where the Helm chart would put them. Prints `export KUBECONFIG=...` (one
/// context per cluster: east-mgmt, east-1, east-2, west-mgmt, west-1, west-2) and narrates what
/// happens. Ctrl-C or SIGTERM stops everything and removes its temporary files.
///
/// Fixed ports (when free, else a free one, said at start): cluster APIs from --base-port
/// (17400: east-mgmt, 17401 east-1, 17402 east-2, 17403 west-mgmt, 17404 west-1, 17405 west-2),
/// operator metrics from --base-port + 20 in start order. Prometheus and the registry take free
/// ports, printed at start.
#[derive(Debug, Parser)]
#[command(name = "sluice-sandbox", version, verbatim_doc_comment)]
struct Cli {
    /// Run this scenario once the sandbox is ready (see --list-scenarios).
    #[arg(long, value_name = "NAME")]
    scenario: Option<String>,
    /// With --scenario: stop when the scenario ends; exit 0 only if its expected outcome
    /// happened. The last stdout line is one JSON object {"scenario", "outcome", ...figures}.
    #[arg(long, requires = "scenario")]
    until_done: bool,
    /// List the scenarios and exit.
    #[arg(long)]
    list_scenarios: bool,
    /// First fixed port; 0 uses free ports everywhere.
    #[arg(long, default_value_t = topology::DEFAULT_BASE_PORT)]
    base_port: u16,
    /// Run the operator binaries.
    #[arg(long, value_enum, default_value_t = Operators::On)]
    operators: Operators,
    /// The sluice repository root (crds/, scenarios/). Default: the one this binary was built from.
    #[arg(long, value_name = "DIR")]
    repo: Option<PathBuf>,
    /// The released upstream CRDs (gateway-api-v1.6.1/, argo-cd-v3.5.1/). Default:
    /// <repo>/.tools/crds, where `bash scripts/install-tools.sh` puts them.
    #[arg(long, value_name = "DIR")]
    upstream: Option<PathBuf>,
    /// Mesh telemetry interval in milliseconds.
    #[arg(long, default_value_t = 1000, value_name = "MS")]
    telemetry_interval_ms: u64,
    /// What serves each cluster's API. With `real`, the API servers take free ports (printed at
    /// start) instead of --base-port's.
    #[arg(long, value_enum, default_value_t = ControlPlane::Emulator)]
    control_plane: ControlPlane,
    /// The metrics backend the telemetry is written to and the operators read.
    #[arg(long, value_enum, default_value_t = Metrics::Prometheus)]
    metrics: Metrics,
}

async fn shutdown_signal() -> &'static str {
    let mut term = match signal(SignalKind::terminate()) {
        Ok(s) => s,
        Err(_) => {
            let _ = tokio::signal::ctrl_c().await;
            return "interrupt";
        }
    };
    tokio::select! {
        _ = term.recv() => "SIGTERM",
        _ = tokio::signal::ctrl_c() => "interrupt",
    }
}

fn print_result(name: &str, outcome: &Outcome) {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{}", scenarios::result_line(name, outcome));
    let _ = out.flush();
}

async fn watch_operators(sandbox: &mut Sandbox) {
    loop {
        tokio::time::sleep(Duration::from_secs(2)).await;
        for line in sandbox.exited_operators() {
            sandbox.say(format!("warning: {line}"));
        }
    }
}

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    if cli.list_scenarios {
        for s in scenarios::REGISTRY {
            println!("{:<12} {} (budget {:?})", s.name, s.description, s.budget);
        }
        return ExitCode::SUCCESS;
    }
    let scenario = match cli.scenario.as_deref().map(|n| (n, scenarios::find(n))) {
        Some((name, None)) => {
            eprintln!(
                "sluice-sandbox: no scenario named {name:?}; known scenarios: {} (see --list-scenarios)",
                scenarios::names()
            );
            return ExitCode::from(2);
        }
        Some((_, Some(def))) => Some(def),
        None => None,
    };
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "warn,kube_runtime=error".into()),
        )
        .init();

    let mut options = Options::defaults();
    if let Some(repo) = cli.repo {
        options.upstream = repo.join(".tools/crds");
        options.repo = repo;
    }
    if let Some(upstream) = cli.upstream {
        options.upstream = upstream;
    }
    options.base_port = cli.base_port;
    options.operators = cli.operators == Operators::On;
    options.telemetry_interval = Duration::from_millis(cli.telemetry_interval_ms.max(100));
    options.control_plane = match cli.control_plane {
        ControlPlane::Emulator => ControlPlaneKind::Emulator,
        ControlPlane::Real => ControlPlaneKind::Real,
    };

    options.metrics = match cli.metrics {
        Metrics::Prometheus => MetricsKind::Prometheus,
        Metrics::Thanos => MetricsKind::Thanos,
    };

    let fail_start = |category: &str, message: String| {
        eprintln!("sluice-sandbox: {message}");
        if let Some(def) = scenario {
            print_result(def.name, &scenarios::failed(category, message));
        }
        ExitCode::FAILURE
    };
    let mut sandbox = tokio::select! {
        started = Sandbox::start(options) => match started {
            Ok(s) => s,
            Err(e) => return fail_start(e.category(), format!("could not start: {e}")),
        },
        sig = shutdown_signal() => {
            return fail_start("signal", format!("stopped by {sig} while starting; everything started so far was stopped"));
        }
    };
    sandbox.say(format!(
        "sluice sandbox ready in {:.1} s. In another terminal:",
        sandbox.uptime().as_secs_f64()
    ));
    sandbox.say(format!(
        "export KUBECONFIG={}",
        sandbox.kubeconfig().display()
    ));
    sandbox.say("kubectl get sluice -A --context east-1        # contexts: east-mgmt east-1 east-2 west-mgmt west-1 west-2");
    sandbox.say("kubectl get rollouts -A -w --context east-1   # -w takes one kind: kubectl cannot watch a category");
    sandbox.say("Ctrl-C stops everything.");

    let mut outcome = None;
    let mut stopped_by = None;
    if let Some(def) = scenario {
        sandbox.say(format!("scenario {}: {}", def.name, def.description));
        tokio::select! {
            result = scenarios::run(def, &sandbox) => {
                let o = result.unwrap_or_else(|e| scenarios::failed(e.category(), format!("scenario {}: {e}", def.name)));
                sandbox.say(format!(
                    "scenario {}: {}: {}",
                    def.name,
                    if o.pass { "pass" } else { "fail" },
                    o.summary
                ));
                outcome = Some(o);
            }
            sig = shutdown_signal() => {
                stopped_by = Some(sig);
                outcome = Some(scenarios::failed("signal", format!("stopped by {sig} before the scenario ended")));
            }
        }
    }
    if !cli.until_done && stopped_by.is_none() {
        tokio::select! {
            sig = shutdown_signal() => stopped_by = Some(sig),
            _ = watch_operators(&mut sandbox) => {}
        }
    }
    if let Some(sig) = stopped_by {
        sandbox.say(format!("{sig}: stopping"));
    }
    sandbox.stop().await;
    match (scenario, outcome) {
        (Some(def), Some(o)) => {
            print_result(def.name, &o);
            if o.pass {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            }
        }
        _ => ExitCode::SUCCESS,
    }
}
