//! Binary entry point of sluice-rollout-weights: flags, then the shared runtime runs the Rollout
//! controller (with its triggers: canary workloads, canary Services, routes) and the orphaned
//! ownership controllers (HTTPRoutes, and GRPCRoutes when their CRD is installed at start) while
//! this replica holds the Lease.
#![forbid(unsafe_code)]

use std::{process::ExitCode, sync::Arc, time::Duration};

use kube::runtime::watcher;
use sluice_analysis::ClusterGateArgs;
use sluice_rollout_weights::{OPERATOR, metrics, orphans, reconcile, template_status, triggers};
use sluice_runtime::{OperatorCli, Runtime};

#[tokio::main]
async fn main() -> ExitCode {
    let cli = OperatorCli::<ClusterGateArgs>::parse_as(OPERATOR, env!("CARGO_PKG_DESCRIPTION"));
    let result: Result<(), Box<dyn std::error::Error>> = async {
        let source = cli.flags.config(Duration::from_secs(5))?;
        let mut rt = Runtime::init(OPERATOR, cli.runtime).await?;
        let api = rt.namespaced_api();
        let metrics = metrics::register(&mut rt.registry);
        let mut ctx = reconcile::Context::new(rt.client.clone(), rt.recorder.clone());
        ctx.allow_free_form_promql = cli.flags.allow_free_form_promql;
        metrics::read_at_scrape(&rt.metrics.objects());
        ctx.notifier = rt.notifier.clone();
        ctx.leadership = rt.leadership()?;
        let ctx = ctx
            .with_analysis(source, &cli.flags.cluster, metrics)?
            .with_gate_template_cache(rt.watch_client.clone());
        let watched = triggers::Watched {
            deployments: rt.namespaced_api(),
            statefulsets: rt.namespaced_api(),
            services: rt.namespaced_api(),
            routes: rt.namespaced_api(),
            grpc_routes: Some(triggers::GrpcRoutes::new(
                &rt.client,
                &rt.watch_client,
                rt.args.namespace_scope(),
            )),
            gate_templates: kube::Api::all(rt.watch_client.clone()),
        };
        let grpc_routes = watched.grpc_routes.clone();
        let extend = triggers::sharing_store(
            ctx.rollouts.clone(),
            triggers::with_triggers(watched, watcher::Config::default()),
        );
        // Every GateTemplate's Ready condition, written while this replica leads.
        tokio::spawn(template_status::run(
            rt.watch_client.clone(),
            rt.client.clone(),
            ctx.leadership.clone(),
        ));
        // Routes whose ownership annotation names a Rollout that is gone: reported and freed.
        tokio::spawn(orphans::run(
            rt.namespaced_api(),
            rt.client.clone(),
            ctx.leadership.clone(),
            rt.recorder.clone(),
        ));
        if let Some(grpc_routes) = grpc_routes {
            tokio::spawn(orphans::run_when_installed(
                grpc_routes,
                rt.client.clone(),
                ctx.leadership.clone(),
                rt.recorder.clone(),
            ));
        }
        rt.primary_changes = sluice_rollout_weights::PRIMARY_CHANGES;
        rt.run_with(api, Arc::new(ctx), reconcile::reconcile, extend)
            .await?;
        Ok(())
    }
    .await;
    sluice_runtime::operator::exit_code(OPERATOR, result)
}
