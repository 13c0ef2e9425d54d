//! The chart's notifications grant, enforced: with `notifications.secretName` set, each
//! operator's ServiceAccount, under exactly the RBAC the chart renders, reads its webhook
//! targets from that Secret with the runtime's notifier (a GET, then a watch filtered on
//! `metadata.name`), sees an edit of the Secret, and may read no other Secret. Against the
//! emulator enforcing RBAC, or with `SLUICE_E2E_CONTROL_PLANE=real` a real kube-apiserver, which
//! is what decides whether `resourceNames` admits that watch.

use std::{process::Command, time::Duration};

use k8s_openapi::{
    ByteString,
    api::core::v1::{Namespace, Secret},
};
use kube::{Api, api::PostParams};
use serde_json::{Value, json};
use sluice_e2e::{
    chart::{self, NAMESPACE, RELEASE},
    eventually, repo_root,
    target::{self, Target},
};
use sluice_runtime::notify::{Notifier, NotifierOptions, NotifyMetrics, RetryPolicy};
use tokio_util::sync::CancellationToken;

/// Budget of each wait.
const BUDGET: Duration = Duration::from_secs(30);
const SECRET: &str = "sluice-notifications";
const OPERATORS: [&str; 4] = [
    "rollout-weights",
    "wave-gate",
    "revert",
    "upgrade-revisions",
];

fn secret(name: &str, targets: &Value) -> Secret {
    serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": NAMESPACE},
        "data": {"targets.json": ByteString(serde_json::to_vec(targets).unwrap())},
    }))
    .unwrap()
}

/// The chart's RBAC rendered with notifications on, or `None` (printed) without helm.
fn rendered() -> Option<Vec<Value>> {
    let repo = repo_root();
    let helm = match chart::helm(&repo) {
        Ok(h) => h,
        Err(e) => {
            sluice_testkit::prereq::Missing::new(
                e.to_string(),
                sluice_testkit::prereq::INSTALL_TOOLS,
            )
            .skip();
            return None;
        }
    };
    let out = Command::new(helm)
        .current_dir(&repo)
        .args([
            "template",
            RELEASE,
            "charts/sluice",
            "--namespace",
            NAMESPACE,
        ])
        .args(["--set", &format!("notifications.secretName={SECRET}")])
        .output()
        .expect("helm runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let docs = chart::parse(&String::from_utf8_lossy(&out.stdout)).expect("chart parses");
    Some(chart::of_kinds(&docs, &chart::RBAC_KINDS))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_operator_reads_and_watches_its_notifications_secret_and_no_other() {
    if target::cluster_mode() {
        println!(
            "skipping: this check installs its own RBAC, which only a local API server does here"
        );
        return;
    }
    if target::real_mode() && sluice_testkit::control_plane::require().is_none() {
        return;
    }
    let Some(rbac) = rendered() else { return };
    let t = if target::real_mode() {
        Target::real(&[], &rbac, &[])
            .await
            .expect("real control plane with the chart's RBAC")
            .expect("the control plane's binaries")
    } else {
        Target::emulated(&[], &rbac, &[])
            .await
            .expect("emulator with the chart's RBAC")
    };
    let admin = t.admin();
    let _ = Api::<Namespace>::all(admin.clone())
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": NAMESPACE}})).unwrap(),
        )
        .await;
    let secrets: Api<Secret> = Api::namespaced(admin, NAMESPACE);
    let url = |n: u16| format!("http://127.0.0.1:{n}/hook");
    secrets
        .create(
            &PostParams::default(),
            &secret(SECRET, &json!([{"name": "a", "url": url(9)}])),
        )
        .await
        .unwrap();
    secrets
        .create(&PostParams::default(), &secret("unrelated", &json!([])))
        .await
        .unwrap();

    let stop = CancellationToken::new();
    let mut notifiers = Vec::new();
    for component in OPERATORS {
        let client = t
            .service_account_client(NAMESPACE, &chart::service_account(component))
            .expect("a client as the operator's ServiceAccount");
        let api: Api<Secret> = Api::namespaced(client, NAMESPACE);
        let err = api
            .get("unrelated")
            .await
            .expect_err("another Secret is denied");
        assert!(
            matches!(&err, kube::Error::Api(s) if s.code == 403),
            "{component}: {err}"
        );
        let n = Notifier::start(
            NotifierOptions {
                operator: format!("sluice-{component}"),
                cluster: String::new(),
                retry: RetryPolicy::default(),
            },
            NotifyMetrics::default(),
            None,
        );
        tokio::spawn(n.clone().watch_secret(api, SECRET.into(), stop.clone()));
        notifiers.push((component, n));
    }
    for (component, n) in &notifiers {
        eventually(
            &format!("{component} reads its targets"),
            BUDGET,
            async || {
                let names = n.target_names();
                (names == ["a"]).then_some(()).ok_or(format!("{names:?}"))
            },
        )
        .await;
    }

    // An edit reaches every operator through its watch.
    let mut s = secrets.get(SECRET).await.unwrap();
    s.data = secret(SECRET, &json!([{"name": "b", "url": url(10)}])).data;
    secrets
        .replace(SECRET, &PostParams::default(), &s)
        .await
        .unwrap();
    for (component, n) in &notifiers {
        eventually(&format!("{component} sees the edit"), BUDGET, async || {
            let names = n.target_names();
            (names == ["b"]).then_some(()).ok_or(format!("{names:?}"))
        })
        .await;
    }
    stop.cancel();
}
