//! Binary entry point of sluice-wave-gate: flags, then the shared runtime runs the WaveGate
//! controller while this replica holds the Lease.
#![forbid(unsafe_code)]

use std::{process::ExitCode, sync::Arc, time::Duration};

use clap::Args;
use sluice_analysis::{Engine, EngineOptions, MetricsSourceArgs, PrometheusSource};
use sluice_runtime::{OperatorCli, Runtime};
use sluice_wave_gate::{OPERATOR, metrics, reconcile};

/// The operator's own flags (the shared ones are `RuntimeArgs`).
#[derive(Debug, Args)]
struct Flags {
    /// Allow free-form PromQL in gates of namespaced objects (it runs with the operator's view
    /// of all metrics).
    #[arg(long, env = "SLUICE_ALLOW_FREE_FORM_PROMQL", default_value_t = false)]
    allow_free_form_promql: bool,
    /// The global metrics view (Prometheus HTTP API, Thanos Query in production), e.g.
    /// `http://thanos-query.monitoring:9090`. Without it no gate, drift signal or cross-site
    /// wait can pass, so every wave holds.
    #[arg(long, env = "SLUICE_PROMETHEUS_URL")]
    prometheus_url: Option<String>,
    /// The label that scopes a series to one cluster in the metrics view.
    #[arg(long, env = "SLUICE_CLUSTER_LABEL", default_value = "cluster")]
    cluster_label: String,
    /// Scrape `job` label of wave-gate's own metrics at every site: a cross-site wait trusts
    /// only `sluice_wavegate_wave_passed` series of this job (another scraped workload exposing
    /// the same series under its own job is ignored). Empty: any job.
    #[arg(long, env = "SLUICE_WAVE_PASSED_JOB", default_value = reconcile::DEFAULT_WAVE_PASSED_JOB)]
    wave_passed_job: String,
    /// After a halt, how long to wait for revert to hold the BundlePins (automation suspended,
    /// previous bundle applied) before setting the halted clusters' decisions back anyway.
    #[arg(long, env = "SLUICE_PIN_WAIT_SECONDS", default_value_t = 30)]
    pin_wait_seconds: u64,
    /// Credentials, headers, CA and timeout for the Prometheus URL.
    #[command(flatten)]
    prometheus: MetricsSourceArgs,
}

#[tokio::main]
async fn main() -> ExitCode {
    let cli = OperatorCli::<Flags>::parse_as(OPERATOR, env!("CARGO_PKG_DESCRIPTION"));
    let result = async {
        let mut rt = Runtime::init(OPERATOR, cli.runtime).await?;
        let engine = match cli.flags.prometheus_url {
            Some(url) => Some(Arc::new(Engine::new(
                PrometheusSource::new(cli.flags.prometheus.config(url, Duration::from_secs(10))?),
                EngineOptions {
                    allow_inline_promql_in_namespaced: cli.flags.allow_free_form_promql,
                    cluster_label: cli.flags.cluster_label,
                    ..EngineOptions::default()
                },
            )?)),
            None => {
                tracing::warn!("no --prometheus-url: gates, drift and cross-site waits cannot pass; waves will hold");
                None
            }
        };
        let wave_metrics = metrics::register(&mut rt.registry);
        metrics::read_at_scrape(&rt.metrics.objects());
        // A WaveGate's series (its verdicts and its site's) go when the leader's store no longer
        // holds it: when it is deleted, or when this replica stops leading.
        let followed = wave_metrics.clone();
        let _following = rt
            .metrics
            .objects()
            .follow_every(Duration::from_secs(10), move |objects| {
                followed.follow(objects);
            });
        let api = rt.namespaced_api();
        let leadership = rt.leadership()?;
        let ctx = Arc::new(reconcile::Context {
            leadership,
            wave_passed_job: cli.flags.wave_passed_job,
            allow_free_form_promql: cli.flags.allow_free_form_promql,
            engine,
            metrics: Some(wave_metrics),
            notifier: rt.notifier.clone(),
            pin_wait: std::time::Duration::from_secs(cli.flags.pin_wait_seconds),
            caches: Arc::new(sluice_wave_gate::cache::Caches::new(rt.watch_client.clone())),
            ..reconcile::Context::new(rt.client.clone(), rt.recorder.clone())
        });
        // A WaveGate is reconciled when one of its BundlePins changes (revert pinned it, it
        // failed, it was released): a halt waiting on its pins never waits for a timer alone.
        let pins: kube::Api<sluice_api::v1alpha1::BundlePin> = rt.namespaced_api();
        rt.run_with(api, ctx, reconcile::reconcile, move |c| {
            c.owns(pins.clone(), kube::runtime::watcher::Config::default())
        })
        .await?;
        Ok::<(), Box<dyn std::error::Error>>(())
    }
    .await;
    sluice_runtime::operator::exit_code(OPERATOR, result)
}
