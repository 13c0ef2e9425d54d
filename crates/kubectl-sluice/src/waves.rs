//! `kubectl sluice waves`: every site's WaveGates side by side across kubeconfig contexts, as
//! one table of site × wave (each wave's state and the revision it runs), so one look shows
//! which site is where in a change. A context that cannot be reached within the request timeout
//! is shown as unreachable and does not hold up or fail the others.
//!
//! Owns the command's I/O (one client per context, read concurrently) and its table; the
//! table is a pure function of what each context answered.

use std::path::PathBuf;
use std::time::Duration;

use clap::Args;
use kube::api::{Api, DynamicObject, ListParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config};
use serde_json::{Value, json};
use sluice_api::v1alpha1::ClusterDecision;
use sluice_api::v1alpha1::wave_gate::{Wave, WaveState, WaveStatus};

use crate::error::CliError;
use crate::kinds::Kind;
use crate::output::{self, Format};
use crate::tree;

/// `waves [--contexts A,B] [-n NAMESPACE] [--request-timeout S] [-o json|yaml]`.
#[derive(Debug, Args)]
pub struct WavesArgs {
    /// Kubeconfig contexts to read, comma-separated (default: every context of the kubeconfig).
    #[arg(long, value_delimiter = ',', value_name = "A,B")]
    pub contexts: Vec<String>,
    /// Path to the kubeconfig file (default: $KUBECONFIG, then ~/.kube/config).
    #[arg(long, value_name = "FILE")]
    pub kubeconfig: Option<PathBuf>,
    /// Namespace of the WaveGates (default: all namespaces).
    #[arg(short = 'n', long, value_name = "NAMESPACE")]
    pub namespace: Option<String>,
    /// How long to wait for each context before showing it as unreachable.
    #[arg(long, value_name = "SECONDS", default_value_t = 10)]
    pub request_timeout: u64,
    /// Print the sites as JSON or YAML instead of the table.
    #[arg(short = 'o', long, value_enum, value_name = "FORMAT")]
    pub output: Option<Format>,
}

/// What one context answered: its WaveGates, or why it could not be read.
#[derive(Clone, Debug, PartialEq)]
pub struct ContextReading {
    /// The kubeconfig context.
    pub context: String,
    /// The WaveGates (JSON as read), or the error that made the context unreachable.
    pub wave_gates: Result<Vec<Value>, String>,
}

/// Runs `waves`. Exits with a failure (after printing everything) when a context was
/// unreachable.
pub async fn run(args: WavesArgs) -> Result<(), CliError> {
    let kubeconfig = match &args.kubeconfig {
        Some(path) => Kubeconfig::read_from(path).map_err(|e| CliError::Config {
            message: format!("{}: {e}", path.display()),
        })?,
        None => Kubeconfig::read().map_err(|e| CliError::Config {
            message: e.to_string(),
        })?,
    };
    let contexts = contexts(&kubeconfig, &args.contexts)?;
    let timeout = Duration::from_secs(args.request_timeout.max(1));
    let readings = futures::future::join_all(contexts.iter().map(|context| {
        read_context(
            kubeconfig.clone(),
            context.clone(),
            args.namespace.clone(),
            timeout,
        )
    }))
    .await;
    match args.output {
        Some(format) => print!("{}", output::render(format, &document(&readings))?),
        None => print!("{}", table(&readings)),
    }
    let unreachable: Vec<&str> = readings
        .iter()
        .filter(|r| r.wave_gates.is_err())
        .map(|r| r.context.as_str())
        .collect();
    if unreachable.is_empty() {
        Ok(())
    } else {
        Err(CliError::Unreachable {
            contexts: unreachable.join(", "),
        })
    }
}

/// The contexts to read: those asked for (each must exist), else all, in kubeconfig order.
pub fn contexts(kubeconfig: &Kubeconfig, asked: &[String]) -> Result<Vec<String>, CliError> {
    let known: Vec<String> = kubeconfig.contexts.iter().map(|c| c.name.clone()).collect();
    if known.is_empty() {
        return Err(CliError::Config {
            message: "the kubeconfig has no contexts".into(),
        });
    }
    let asked: Vec<String> = asked
        .iter()
        .map(|c| c.trim().to_string())
        .filter(|c| !c.is_empty())
        .collect();
    if asked.is_empty() {
        return Ok(known);
    }
    if let Some(missing) = asked.iter().find(|c| !known.contains(c)) {
        return Err(CliError::Usage {
            message: format!(
                "--contexts names {missing:?}, which the kubeconfig does not have: it has {}",
                known.join(", ")
            ),
        });
    }
    Ok(asked)
}

async fn read_context(
    kubeconfig: Kubeconfig,
    context: String,
    namespace: Option<String>,
    timeout: Duration,
) -> ContextReading {
    let read = async {
        let options = KubeConfigOptions {
            context: Some(context.clone()),
            ..KubeConfigOptions::default()
        };
        let mut config = Config::from_custom_kubeconfig(kubeconfig, &options)
            .await
            .map_err(|e| format!("cannot load the context: {e}"))?;
        config.connect_timeout = Some(timeout);
        config.read_timeout = Some(timeout);
        let client = Client::try_from(config).map_err(|e| e.to_string())?;
        let ar = Kind::WaveGate.api_resource();
        let api: Api<DynamicObject> = match &namespace {
            Some(ns) => Api::namespaced_with(client, ns, &ar),
            None => Api::all_with(client, &ar),
        };
        let list = api
            .list(&ListParams::default())
            .await
            .map_err(|e| match e {
                kube::Error::Api(s) if s.code == 403 => {
                    format!(
                        "forbidden: {}: ask for 'list' on wavegates.sluice.dev",
                        s.message
                    )
                }
                kube::Error::Api(s) if s.code == 404 => {
                    "the sluice CRDs are not installed (no wavegates.sluice.dev)".to_string()
                }
                e => chain(&e),
            })?;
        Ok(list
            .items
            .into_iter()
            .map(|o| serde_json::to_value(o).unwrap_or(Value::Null))
            .collect())
    };
    let wave_gates = match tokio::time::timeout(timeout, read).await {
        Ok(result) => result,
        Err(_) => Err(format!("no answer within {}s", timeout.as_secs())),
    };
    ContextReading {
        context,
        wave_gates,
    }
}

/// An error with its causes, so a refused connection says so (kube's own text stops at
/// "client error (Connect)").
fn chain(err: &dyn std::error::Error) -> String {
    let mut text = err.to_string();
    let mut source = err.source();
    while let Some(cause) = source {
        let cause_text = cause.to_string();
        if !text.contains(&cause_text) {
            text.push_str(": ");
            text.push_str(&cause_text);
        }
        source = cause.source();
    }
    text
}

fn s<'a>(v: &'a Value, pointer: &str) -> Option<&'a str> {
    v.pointer(pointer).and_then(Value::as_str)
}

/// `sha256:<hex>` shortened to its first 12 hex digits, as image tools print digests.
pub fn short_revision(revision: &str) -> String {
    let hex = revision.strip_prefix("sha256:").unwrap_or(revision);
    hex.chars().take(12).collect()
}

/// One wave of a site: its state, the revision it runs (when known) and whether it is the
/// site's current wave.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WaveCell {
    /// The wave's name.
    pub name: String,
    /// `status.waves[].state`, `Pending` before the operator reports one.
    pub state: String,
    /// The revision the wave runs: `status.waves[].revision`, else the revision every decision
    /// of the wave's clusters admits.
    pub revision: Option<String>,
    /// Whether it is `status.currentWave`.
    pub current: bool,
}

/// The waves of a WaveGate in spec order.
pub fn wave_cells(wg: &Value) -> Vec<WaveCell> {
    let statuses: Vec<WaveStatus> = tree::list_at(wg, "/status/waves");
    let decisions: Vec<ClusterDecision> = tree::list_at(wg, "/status/decisions");
    let waves: Vec<Wave> = tree::list_at(wg, "/spec/waves");
    waves
        .into_iter()
        .map(|wave| {
            let status = statuses.iter().find(|w| w.name == wave.name);
            let state = status.map_or(WaveState::Pending, |w| w.state);
            let admitted: Vec<&str> = wave
                .clusters
                .iter()
                .filter_map(|c| {
                    decisions
                        .iter()
                        .find(|d| d.cluster_name == *c)
                        .map(|d| d.revision.as_str())
                })
                .collect();
            let from_decisions = match admitted.first() {
                Some(first)
                    if admitted.len() == wave.clusters.len()
                        && admitted.iter().all(|r| r == first) =>
                {
                    Some(first.to_string())
                }
                _ => None,
            };
            let revision = status.and_then(|w| w.revision.clone()).or(from_decisions);
            WaveCell {
                current: s(wg, "/status/currentWave") == Some(wave.name.as_str()),
                name: wave.name,
                state: tree::api_name(&state),
                revision,
            }
        })
        .collect()
}

/// The wave columns: every site's wave names, each site's order kept (a name first seen in a
/// site goes right after that site's previous wave).
pub fn wave_columns(readings: &[ContextReading]) -> Vec<String> {
    let mut columns: Vec<String> = Vec::new();
    for wg in readings
        .iter()
        .filter_map(|r| r.wave_gates.as_ref().ok())
        .flatten()
    {
        let mut after: Option<usize> = None;
        for cell in wave_cells(wg) {
            match columns.iter().position(|c| *c == cell.name) {
                Some(at) => after = Some(at),
                None => {
                    let at = after.map_or(0, |a| a + 1);
                    columns.insert(at, cell.name);
                    after = Some(at);
                }
            }
        }
    }
    columns
}

fn sort_key(wg: &Value) -> (String, String, String) {
    (
        s(wg, "/spec/site").unwrap_or("").to_string(),
        s(wg, "/metadata/namespace").unwrap_or("").to_string(),
        s(wg, "/metadata/name").unwrap_or("").to_string(),
    )
}

/// The table of `waves`: a row per WaveGate (context, site, object, phase, revision being
/// rolled out) and a column per wave with the wave's state and the revision it runs (▶ the
/// current wave, `-` a wave the site does not have); an unreachable context is a row saying
/// so, with the reason under the table.
pub fn table(readings: &[ContextReading]) -> String {
    let columns = wave_columns(readings);
    let mut header: Vec<String> = ["CONTEXT", "SITE", "WAVEGATE", "PHASE", "REVISION"]
        .into_iter()
        .map(str::to_string)
        .collect();
    header.extend(columns.iter().map(|c| c.to_ascii_uppercase()));
    let mut rows = vec![header];
    let mut notes = Vec::new();
    let blank = |row: &mut Vec<String>| row.extend(columns.iter().map(|_| "-".to_string()));
    for reading in readings {
        match &reading.wave_gates {
            Err(reason) => {
                let mut row = vec![
                    reading.context.clone(),
                    "-".into(),
                    "-".into(),
                    "unreachable".into(),
                    "-".into(),
                ];
                blank(&mut row);
                rows.push(row);
                notes.push(format!("{}: unreachable: {reason}", reading.context));
            }
            Ok(gates) if gates.is_empty() => {
                let mut row = vec![
                    reading.context.clone(),
                    "-".into(),
                    "-".into(),
                    "no WaveGates".into(),
                    "-".into(),
                ];
                blank(&mut row);
                rows.push(row);
            }
            Ok(gates) => {
                let mut gates: Vec<&Value> = gates.iter().collect();
                gates.sort_by_key(|wg| sort_key(wg));
                for wg in gates {
                    let cells = wave_cells(wg);
                    let mut row = vec![
                        reading.context.clone(),
                        s(wg, "/spec/site").unwrap_or("-").to_string(),
                        format!(
                            "{}/{}",
                            s(wg, "/metadata/namespace").unwrap_or("-"),
                            s(wg, "/metadata/name").unwrap_or("-")
                        ),
                        s(wg, "/status/phase")
                            .unwrap_or("(no status yet)")
                            .to_string(),
                        s(wg, "/spec/revision")
                            .map(short_revision)
                            .unwrap_or_else(|| "-".into()),
                    ];
                    for column in &columns {
                        row.push(match cells.iter().find(|c| c.name == *column) {
                            None => "-".into(),
                            Some(cell) => {
                                let mut text = String::new();
                                if cell.current {
                                    text.push_str("▶ ");
                                }
                                text.push_str(&cell.state);
                                if let Some(r) = &cell.revision {
                                    text.push(' ');
                                    text.push_str(&short_revision(r));
                                }
                                text
                            }
                        });
                    }
                    rows.push(row);
                }
            }
        }
    }
    let mut out = tree::table(&rows);
    if !notes.is_empty() {
        out.push('\n');
        for note in notes {
            out.push_str(&note);
            out.push('\n');
        }
    }
    out
}

/// The `-o json|yaml` form of `waves`: the sites with their waves, and the unreachable
/// contexts with the reason.
pub fn document(readings: &[ContextReading]) -> Value {
    let mut sites = Vec::new();
    let mut unreachable = Vec::new();
    for reading in readings {
        match &reading.wave_gates {
            Err(reason) => unreachable.push(json!({"context": reading.context, "error": reason})),
            Ok(gates) => {
                let mut gates: Vec<&Value> = gates.iter().collect();
                gates.sort_by_key(|wg| sort_key(wg));
                for wg in gates {
                    let waves: Vec<Value> = wave_cells(wg)
                        .into_iter()
                        .map(|c| {
                            json!({"name": c.name, "state": c.state, "revision": c.revision,
                                   "current": c.current})
                        })
                        .collect();
                    sites.push(json!({
                        "context": reading.context,
                        "site": s(wg, "/spec/site"),
                        "namespace": s(wg, "/metadata/namespace"),
                        "name": s(wg, "/metadata/name"),
                        "phase": s(wg, "/status/phase"),
                        "revision": s(wg, "/spec/revision"),
                        "waves": waves,
                    }));
                }
            }
        }
    }
    json!({"sites": sites, "unreachable": unreachable})
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rev(c: char) -> String {
        format!("sha256:{}", c.to_string().repeat(64))
    }

    fn gate(site: &str, waves: &[(&str, &[&str])], status: Value) -> Value {
        let waves: Vec<Value> = waves
            .iter()
            .map(|(n, c)| json!({"name": n, "clusters": c}))
            .collect();
        json!({"metadata": {"name": format!("mesh-{site}"), "namespace": "argocd"},
               "spec": {"site": site, "revision": rev('b'), "waves": waves},
               "status": status})
    }

    #[test]
    fn columns_keep_every_sites_wave_order() {
        let readings = vec![
            ContextReading {
                context: "a".into(),
                wave_gates: Ok(vec![gate(
                    "eu",
                    &[("canary", &[]), ("rest", &[])],
                    json!({}),
                )]),
            },
            ContextReading {
                context: "b".into(),
                wave_gates: Ok(vec![gate(
                    "us",
                    &[
                        ("canary", &[]),
                        ("early", &[]),
                        ("rest", &[]),
                        ("last", &[]),
                    ],
                    json!({}),
                )]),
            },
            ContextReading {
                context: "c".into(),
                wave_gates: Err("down".into()),
            },
        ];
        assert_eq!(
            wave_columns(&readings),
            vec!["canary", "early", "rest", "last"]
        );
    }

    #[test]
    fn a_waves_revision_comes_from_status_else_from_agreeing_decisions() {
        let wg = gate(
            "eu",
            &[
                ("canary", &["eu-1"]),
                ("rest", &["eu-2", "eu-3"]),
                ("last", &["eu-4"]),
            ],
            json!({"phase": "Soaking", "currentWave": "rest",
                   "waves": [{"name": "canary", "state": "Passed", "revision": rev('b')},
                             {"name": "rest", "state": "Soaking"}],
                   "decisions": [
                       {"clusterName": "eu-1", "revision": rev('b'), "wave": "canary"},
                       {"clusterName": "eu-2", "revision": rev('b'), "wave": "rest"},
                       {"clusterName": "eu-3", "revision": rev('b'), "wave": "rest"},
                       {"clusterName": "eu-4", "revision": rev('a'), "wave": "last"}]}),
        );
        let cells = wave_cells(&wg);
        let got: Vec<(&str, &str, Option<String>, bool)> = cells
            .iter()
            .map(|c| {
                (
                    c.name.as_str(),
                    c.state.as_str(),
                    c.revision.as_deref().map(short_revision),
                    c.current,
                )
            })
            .collect();
        assert_eq!(
            got,
            vec![
                ("canary", "Passed", Some("bbbbbbbbbbbb".into()), false),
                ("rest", "Soaking", Some("bbbbbbbbbbbb".into()), true),
                ("last", "Pending", Some("aaaaaaaaaaaa".into()), false),
            ]
        );
    }
}
