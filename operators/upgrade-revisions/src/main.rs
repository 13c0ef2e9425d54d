//! Binary entry point of sluice-upgrade-revisions: flags, then the shared runtime runs the
//! RevisionUpgrade controller while this replica holds the Lease.
#![forbid(unsafe_code)]

use std::{process::ExitCode, sync::Arc, time::Duration};

use clap::Args;
use sluice_analysis::ClusterGateArgs;
use sluice_runtime::{OperatorCli, Runtime};
use sluice_upgrade_revisions::{OPERATOR, metrics, reconcile};

/// The operator's own flags (the shared ones are `RuntimeArgs`).
#[derive(Debug, Args)]
struct Flags {
    /// The metrics source (gates and the certificate issuance counter), the cluster label value
    /// and free-form PromQL.
    #[command(flatten)]
    gates: ClusterGateArgs,
    /// Window background issuance is measured over, seconds (at least 4 scrape intervals).
    #[arg(long, env = "SLUICE_ISSUANCE_WINDOW_SECONDS", default_value_t = 60)]
    issuance_window_seconds: u64,
    /// Series selector of the certificate issuance counters, one series per CA replica
    /// (`{{cluster}}` is replaced by --cluster); issuance is the sum of their increases. Default:
    /// istiod's counter. With SPIRE, SPIRE server's X.509-SVID signing counter.
    #[arg(
        long,
        env = "SLUICE_ISSUANCE_SERIES",
        default_value = sluice_upgrade_revisions::issuance::DEFAULT_ISSUANCE_SERIES
    )]
    issuance_series: String,
}

#[tokio::main]
async fn main() -> ExitCode {
    let cli = OperatorCli::<Flags>::parse_as(OPERATOR, env!("CARGO_PKG_DESCRIPTION"));
    let result: Result<(), Box<dyn std::error::Error>> = async {
        let prometheus = cli.flags.gates.config(Duration::from_secs(10))?;
        let mut rt = Runtime::init(OPERATOR, cli.runtime).await?;
        let api = kube::Api::all(rt.watch_client.clone());
        let metrics = metrics::register(&mut rt.registry);
        // An upgrade's series go when the leader's store no longer holds it: when it is deleted,
        // or when this replica stops leading.
        let followed = metrics.clone();
        let _following =
            rt.metrics
                .objects()
                .follow_every(Duration::from_secs(10), move |objects| {
                    followed.follow(objects);
                });
        // Evictions need a client that does not retry 429: a PodDisruptionBudget's refusal
        // must come back at once, so the tick moves on to other pods.
        let (mut config, _) = sluice_runtime::client::config(&rt.args).await?;
        config.default_retry = false;
        let evict_client = kube::Client::try_from(sluice_runtime::client::for_requests(config))?;
        let (fleet, _watchers) = reconcile::FleetCache::start(&rt.watch_client);
        let source = reconcile::metrics_source(
            prometheus,
            &cli.flags.gates.cluster,
            Duration::from_secs(cli.flags.issuance_window_seconds.max(1)),
            cli.flags.gates.allow_free_form_promql,
        )?
        .with_issuance_series(cli.flags.issuance_series);
        let mut ctx = reconcile::Context::full(
            rt.client.clone(),
            evict_client,
            rt.recorder.clone(),
            fleet,
            Some(source),
            metrics,
        );
        ctx.allow_free_form_promql = cli.flags.gates.allow_free_form_promql;
        ctx.leadership = rt.leadership()?;
        metrics::read_at_scrape(&rt.metrics.objects());
        ctx.notifier = rt.notifier.clone();
        let _forgetting = ctx.forget_deleted(&rt.watch_client);
        rt.run(api, Arc::new(ctx), reconcile::reconcile).await?;
        Ok(())
    }
    .await;
    sluice_runtime::operator::exit_code(OPERATOR, result)
}
