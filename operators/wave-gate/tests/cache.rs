//! wave-gate reads Applications and its own BundlePins from watch caches: after the first
//! reconcile (one list and one watch per cache), a reconcile sends no list of either, whatever
//! the number of Applications, and the caches follow changes. On the API emulator, every request
//! of the operator's client counted (method, resource, watch or not).

#[path = "support/requests.rs"]
mod requests;

use std::{sync::Arc, time::Duration};

use kube::{Api, api::PostParams};
use requests::{Counts, NS, counting_client};
use sluice_api::{external::argocd::Application, v1alpha1::WaveGate};
use sluice_runtime::events::EventRecorder;
use sluice_testkit::eventually::eventually_every;
use sluice_testkit::prereq;
use sluice_wave_gate::{OPERATOR, reconcile};

const AT: &str = "sha256:aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reconciles_read_applications_and_pins_from_watch_caches() {
    let Some(argocd) = prereq::or_skip(prereq::upstream_dir(prereq::Upstream::ArgoCd)) else {
        return;
    };
    let emu = kube_emulator::Emulator::start().await;
    // Given a site of 4 clusters × 25 Applications.
    requests::site(&emu, &argocd, 4, 25, AT).await;
    let counts = Counts::default();
    let client = counting_client(&emu, &counts);
    let ctx = Arc::new(reconcile::Context::new(
        client.clone(),
        EventRecorder::new(client.clone(), OPERATOR),
    ));
    let plain: Api<WaveGate> = Api::namespaced(emu.client(), NS);
    let reconcile_once = async || {
        let obj = plain.get("site").await.unwrap();
        tokio::time::timeout(
            Duration::from_secs(30),
            reconcile::reconcile(Arc::new(obj), ctx.clone()),
        )
        .await
        .expect("a reconcile ends within 30 s")
        .expect("the reconcile succeeds");
    };
    // The first reconcile starts the caches: one list and one watch each.
    reconcile_once().await;
    let first = counts.snapshot();
    assert_eq!(first.get("LIST applications"), Some(&1), "{first:?}");
    assert_eq!(first.get("LIST bundlepins"), Some(&1), "{first:?}");
    counts.reset();

    // When it reconciles five more times.
    for _ in 0..5 {
        reconcile_once().await;
    }
    // Then it lists neither Applications nor BundlePins again, and starts no other watch.
    let after = counts.snapshot();
    for key in after.keys() {
        assert!(
            !key.starts_with("LIST") && !key.starts_with("WATCH"),
            "a reconcile read from the API server instead of its caches ({key}): {after:?}"
        );
    }
    let per_reconcile: u64 = after.values().sum::<u64>() / 5;
    assert!(
        per_reconcile <= 3,
        "at most the ApplicationSet, Argo CD's parameters and a status write per reconcile: {after:?}"
    );

    // And the cache follows a change: a new Application shows within the budget.
    let apps: Api<Application> = Api::namespaced(emu.client(), NS);
    let mut extra: Application = (*ctx.caches.applications(NS).await.unwrap()[0]).clone();
    extra.metadata = kube::api::ObjectMeta {
        name: Some("mesh-late".into()),
        namespace: Some(NS.into()),
        ..Default::default()
    };
    apps.create(&PostParams::default(), &extra).await.unwrap();
    let seen = eventually_every(
        "the Application cache to show a new Application within 5 s",
        Duration::from_secs(5),
        Duration::from_millis(50),
        async || {
            let seen = ctx.caches.applications(NS).await.unwrap();
            seen.iter()
                .any(|a| a.metadata.name.as_deref() == Some("mesh-late"))
                .then_some(seen)
        },
    )
    .await;
    assert_eq!(seen.len(), 101);
    emu.shutdown().await;
}
