//! `kubectl sluice waves` against two Kubernetes API emulators (two sites' Argo CD clusters)
//! and two contexts that cannot answer (a closed port, a server that never replies): every
//! site's WaveGates side by side, site × wave, and the unreachable contexts shown without
//! holding up or failing the others.

mod common;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::{BUDGET, run};
use kube::api::{Patch, PatchParams};
use kube_emulator::{ADMIN_TOKEN, Emulator};
use serde_json::{Value, json};

fn rev(c: char) -> String {
    format!("sha256:{}", c.to_string().repeat(64))
}

fn wave_gate(name: &str, site: &str, waves: &[(&str, &[&str])]) -> String {
    let waves: Vec<Value> = waves
        .iter()
        .map(|(n, c)| json!({"name": n, "clusters": c}))
        .collect();
    let obj = json!({
        "apiVersion": "sluice.dev/v1alpha1", "kind": "WaveGate",
        "metadata": {"name": name, "namespace": "argocd"},
        "spec": {
            "site": site,
            "applicationSetRef": {"name": "mesh-config"},
            "repository": "oci://registry.local:5000/mesh/config",
            "revision": rev('b'),
            "waves": waves,
            "driftGate": {"exporter": "None"},
            "pin": {"publicKeysSecretRef": {"name": "cosign"}},
        }
    });
    format!(
        "apiVersion: v1\nkind: Namespace\nmetadata: {{name: argocd}}\n---\n{}",
        serde_json::to_string(&obj).unwrap()
    )
}

async fn site(name: &str, site: &str, waves: &[(&str, &[&str])], status: Value) -> Emulator {
    let emu = common::emulator(false, &wave_gate(name, site, waves)).await;
    let api = common::sluice_api(&emu, "WaveGate", "wavegates", Some("argocd"));
    api.patch_status(
        name,
        &PatchParams::default(),
        &Patch::Merge(json!({ "status": status })),
    )
    .await
    .unwrap_or_else(|e| panic!("status of {name}: {e}"));
    emu
}

/// A kubeconfig with one context per (name, server URL).
fn kubeconfig(dir: &Path, contexts: &[(&str, String)]) -> PathBuf {
    let mut text = String::from("apiVersion: v1\nkind: Config\nclusters:\n");
    for (name, server) in contexts {
        text += &format!("- name: {name}\n  cluster:\n    server: {server}\n");
    }
    text += "contexts:\n";
    for (name, _) in contexts {
        text += &format!("- name: {name}\n  context:\n    cluster: {name}\n    user: admin\n");
    }
    text += &format!(
        "current-context: {}\nusers:\n- name: admin\n  user:\n    token: {ADMIN_TOKEN}\n",
        contexts[0].0
    );
    let path = dir.join("kubeconfig");
    std::fs::write(&path, text).unwrap();
    path
}

/// The table's rows as their whitespace-separated cells.
fn cells(table: &str) -> Vec<Vec<String>> {
    table
        .lines()
        .take_while(|l| !l.is_empty())
        .map(|l| {
            l.split("   ")
                .map(str::trim)
                .filter(|c| !c.is_empty())
                .map(str::to_string)
                .collect()
        })
        .collect()
}

#[tokio::test]
async fn waves_shows_every_sites_wave_gates_side_by_side_and_unreachable_contexts() {
    tokio::time::timeout(BUDGET, async {
        // eu-west is soaking its second wave of revision b; us-east finished b everywhere and
        // has an extra early wave.
        let eu = site(
            "mesh-eu",
            "eu-west",
            &[("canary", &["eu-1"]), ("rest", &["eu-2", "eu-3"])],
            json!({"phase": "Soaking", "currentWave": "rest", "currentRevision": rev('b'),
                   "waves": [{"name": "canary", "state": "Passed", "revision": rev('b')},
                             {"name": "rest", "state": "Soaking", "revision": rev('b')}]}),
        )
        .await;
        let us = site(
            "mesh-us",
            "us-east",
            &[("canary", &["us-1"]), ("early", &["us-2"]), ("rest", &["us-3"])],
            json!({"phase": "Complete", "currentRevision": rev('b'),
                   "waves": [{"name": "canary", "state": "Passed", "revision": rev('b')},
                             {"name": "early", "state": "Passed", "revision": rev('b')},
                             {"name": "rest", "state": "Passed", "revision": rev('b')}]}),
        )
        .await;
        // A closed port, and a server that accepts connections but never answers.
        let closed = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap().port()
        };
        let silent = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let silent_port = silent.local_addr().unwrap().port();
        let hold = tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((conn, _)) = silent.accept().await {
                held.push(conn);
            }
        });
        let dir = tempfile::tempdir().unwrap();
        let kc = kubeconfig(
            dir.path(),
            &[
                ("eu", eu.base_url()),
                ("us", us.base_url()),
                ("ap", format!("http://127.0.0.1:{closed}")),
                ("sa", format!("http://127.0.0.1:{silent_port}")),
            ],
        );

        // Every context by default.
        let started = Instant::now();
        let (code, out, err) = run(&kc, &["waves", "--request-timeout", "3"]).await;
        let took = started.elapsed();
        println!("{out}");
        assert_eq!(code, 1, "an unreachable context is a failure: {err}");
        assert!(
            err.contains("could not read context(s) ap, sa"),
            "{err}"
        );
        assert!(
            took < Duration::from_secs(10),
            "the contexts are read side by side, each within its timeout: took {took:?}"
        );
        let rows = cells(&out);
        let passed = "Passed bbbbbbbbbbbb";
        let want: Vec<Vec<String>> = [
            &["CONTEXT", "SITE", "WAVEGATE", "PHASE", "REVISION", "CANARY", "EARLY", "REST"][..],
            &["eu", "eu-west", "argocd/mesh-eu", "Soaking", "bbbbbbbbbbbb", passed, "-",
              "▶ Soaking bbbbbbbbbbbb"],
            &["us", "us-east", "argocd/mesh-us", "Complete", "bbbbbbbbbbbb", passed, passed,
              passed],
            &["ap", "-", "-", "unreachable", "-", "-", "-", "-"],
            &["sa", "-", "-", "unreachable", "-", "-", "-", "-"],
        ]
        .iter()
        .map(|r| r.iter().map(|c| c.to_string()).collect())
        .collect();
        assert_eq!(rows, want, "{out}");
        assert!(out.contains("\nap: unreachable: "), "{out}");
        assert!(out.contains("Connection refused"), "the cause is named: {out}");
        assert!(
            out.contains("sa: unreachable: no answer within 3s"),
            "{out}"
        );

        // Only the contexts asked for; all reachable, so success.
        let (code, out, err) = run(&kc, &["waves", "--contexts", "us,eu"]).await;
        assert_eq!(code, 0, "{err}");
        let rows = cells(&out);
        let contexts: Vec<&str> = rows[1..].iter().map(|r| r[0].as_str()).collect();
        assert_eq!(contexts, vec!["us", "eu"], "{out}");

        // The same as a document.
        let (code, out, err) = run(&kc, &["waves", "--contexts", "eu,ap", "-o", "json"]).await;
        assert_eq!(code, 1, "{err}");
        let doc: Value = serde_json::from_str(&out).unwrap();
        assert_eq!(doc["sites"][0]["site"], "eu-west");
        assert_eq!(doc["sites"][0]["waves"][1],
                   json!({"name": "rest", "state": "Soaking", "revision": rev('b'), "current": true}));
        assert_eq!(doc["unreachable"][0]["context"], "ap");

        // A context the kubeconfig does not have is a usage error naming those it has.
        let (code, _, err) = run(&kc, &["waves", "--contexts", "eu,mars"]).await;
        assert_eq!(code, 2, "{err}");
        assert!(
            err.contains("--contexts names \"mars\", which the kubeconfig does not have: it has eu, us, ap, sa"),
            "{err}"
        );
        hold.abort();
        eu.shutdown().await;
        us.shutdown().await;
    })
    .await
    .expect("the scenario did not finish within its time budget");
}
