//! `kubectl-sluice`: the kubectl plugin of sluice (`kubectl sluice ...`).
//!
//! Owns argument parsing and dispatch to one module per command group; each group owns its own
//! output: `bundle` (render, push, sign, verify, inspect, generate-key-pair) and the object
//! commands (`get`, `status`, `promote`, `abort`, `pause`, `resume`, `retry`, `pin`, `unpin`,
//! `upgrade`), which only ever write the control fields of the sluice object they are named;
//! `waves`, the WaveGates of every kubeconfig context side by side; `completion`, shell
//! completion scripts.
//! It must never apply anything to a cluster on its own initiative, and never print key
//! material, passwords or tokens.

mod bundle;
mod cluster;
mod complete;
mod control;
mod error;
mod kinds;
mod objects;
mod output;
mod tree;
mod waves;

use std::process::ExitCode;

use clap::{CommandFactory, Parser, Subcommand};

use crate::control::Control;

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
    /// List sluice objects of a kind (or `all`) with phase and progress.
    Get(objects::GetArgs),
    /// Show one object's status as a tree (steps, weights vs applied share, verdicts, waves,
    /// pins, upgrade progress); --watch follows it.
    Status(objects::StatusArgs),
    /// Rollout: complete the current step now, or with --full promote to 100%.
    Promote(objects::PromoteArgs),
    /// Rollout (default) or revisionupgrade/NAME: abort.
    Abort(objects::ControlArgs),
    /// Rollout (default) or revisionupgrade/NAME: hold at the current step or wave.
    Pause(objects::ControlArgs),
    /// Rollout (default) or revisionupgrade/NAME: continue after pause (an upgrade also after abort).
    Resume(objects::ControlArgs),
    /// Rollout: start an aborted rollout again from the first step.
    Retry(objects::ControlArgs),
    /// Pin Argo CD Applications to a signed bundle (creates a BundlePin).
    Pin(objects::PinArgs),
    /// Release a BundlePin now (audited with --reason).
    Unpin(objects::UnpinArgs),
    /// RevisionUpgrade controls.
    #[command(subcommand)]
    Upgrade(objects::UpgradeCommand),
    /// Every site's WaveGates side by side across kubeconfig contexts: a table of site × wave
    /// with each wave's state and revision; an unreachable context is shown, not fatal.
    Waves(waves::WavesArgs),
    /// Print a shell completion script (bash, zsh, fish, powershell, elvish), e.g.
    /// `source <(kubectl sluice completion bash)`.
    Completion(CompletionArgs),
    /// Completion candidates for kubectl's plugin completion (`kubectl_complete-sluice`).
    #[command(name = "__complete", hide = true)]
    Complete {
        /// The words after `kubectl sluice`, the last one being typed.
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
}

/// `completion SHELL`.
#[derive(Debug, clap::Args)]
struct CompletionArgs {
    /// The shell.
    #[arg(value_enum)]
    shell: clap_complete::Shell,
}

/// The name the completion scripts complete: the plugin's executable (kubectl finds it as
/// `kubectl-sluice` on PATH).
const COMPLETION_BIN_NAME: &str = "kubectl-sluice";

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
        let objects = match cli.command {
            Command::Bundle(args) => return bundle::run(args).await,
            Command::Completion(args) => {
                print!("{}", completion_script(args.shell));
                Ok(())
            }
            Command::Waves(args) => waves::run(args).await,
            Command::Complete { args } => {
                print!("{}", complete::candidates(&Cli::command(), &args));
                Ok(())
            }
            Command::Get(args) => objects::get(args).await,
            Command::Status(args) => objects::status(args).await,
            Command::Promote(args) => {
                objects::control(
                    Control::Promote { full: args.full },
                    &args.object,
                    &args.cluster,
                )
                .await
            }
            Command::Abort(args) => {
                objects::control(Control::Abort, &args.object, &args.cluster).await
            }
            Command::Pause(args) => {
                objects::control(Control::Pause, &args.object, &args.cluster).await
            }
            Command::Resume(args) => {
                objects::control(Control::Resume, &args.object, &args.cluster).await
            }
            Command::Retry(args) => {
                objects::control(Control::Retry, &args.object, &args.cluster).await
            }
            Command::Pin(args) => objects::pin(args).await,
            Command::Unpin(args) => {
                objects::control(
                    Control::Unpin {
                        reason: args.reason,
                    },
                    &args.object,
                    &args.cluster,
                )
                .await
            }
            Command::Upgrade(objects::UpgradeCommand::Abort(args)) => {
                objects::control(Control::Abort, &upgrade_target(&args.object), &args.cluster).await
            }
            Command::Upgrade(objects::UpgradeCommand::Resume(args)) => {
                objects::control(
                    Control::Resume,
                    &upgrade_target(&args.object),
                    &args.cluster,
                )
                .await
            }
        };
        objects.map_err(|err| {
            eprintln!("error[{}]: {err}", err.category());
            err.exit_code()
        })
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(code) => ExitCode::from(code),
    }
}

/// The completion script for `shell`, completing the `kubectl-sluice` executable.
fn completion_script(shell: clap_complete::Shell) -> String {
    // The scripts name their functions after the command's display name too: give both the
    // executable's name (the usage text's "kubectl sluice" has a space).
    let mut command = Cli::command()
        .bin_name(COMPLETION_BIN_NAME)
        .display_name(COMPLETION_BIN_NAME);
    let mut script = Vec::new();
    clap_complete::generate(shell, &mut command, COMPLETION_BIN_NAME, &mut script);
    let script = String::from_utf8_lossy(&script).into_owned();
    match shell {
        // clap_complete's bash script spells a hyphenated name two ways: the words select
        // `kubectl__sluice__subcmd__get` but the options are under
        // `kubectl__subcmd__sluice__subcmd__get`, so no subcommand's options would complete.
        clap_complete::Shell::Bash => script.replace("kubectl__subcmd__sluice", "kubectl__sluice"),
        _ => script,
    }
}

/// `upgrade abort NAME` names a RevisionUpgrade unless a kind is given.
fn upgrade_target(object: &str) -> String {
    if object.contains('/') {
        object.to_string()
    } else {
        format!("revisionupgrade/{object}")
    }
}
