//! Binary entry point of sluice-revert: flags, then the shared runtime's server and Lease run
//! revert's controller (BundlePins, woken by their Applications) while this replica leads.
#![forbid(unsafe_code)]

use std::{path::PathBuf, process::ExitCode, sync::Arc};

use clap::Args;
use kube::runtime::watcher;
use sluice_api::{external::argocd::Application, v1alpha1::BundlePin};
use sluice_bundle::RegistryOptions;
use sluice_gitops::{ForgeConfig, GitConfig};
use sluice_revert::{
    OPERATOR, controller, metrics,
    reconcile::{self, Settings},
};
use sluice_runtime::{OperatorCli, Runtime, RuntimeArgs};

/// The operator's own flags (the shared ones are `RuntimeArgs`).
#[derive(Debug, Args)]
struct Flags {
    /// Namespace of the per-cluster identity Secrets (label `sluice.dev/revert-cluster=true`).
    /// Default: the operator's namespace.
    #[arg(long, env = "SLUICE_REVERT_CLUSTER_NAMESPACE")]
    cluster_namespace: Option<String>,
    /// Registry `host:port`s spoken to over plain HTTP (loopback always is). Repeatable.
    #[arg(
        long = "insecure-registry",
        env = "SLUICE_REVERT_INSECURE_REGISTRIES",
        value_delimiter = ','
    )]
    insecure_registries: Vec<String>,
    /// Registries (`host` or `host:port`) a BundlePin may name, comma-separated; empty: any. A
    /// pin naming another registry is refused (InvalidSpec) before anything is sent to it.
    #[arg(
        long = "allowed-registry",
        env = "SLUICE_REVERT_ALLOWED_REGISTRIES",
        value_delimiter = ','
    )]
    allowed_registries: Vec<String>,
    /// Docker config Secret (type `kubernetes.io/dockerconfigjson`, in the operator's
    /// namespace) with per-registry credentials; read on every registry use, so a renewed
    /// credential is used at once. Default: registries are read anonymously.
    #[arg(long, env = "SLUICE_REVERT_REGISTRY_CREDENTIALS_SECRET")]
    registry_credentials_secret: Option<String>,
    /// PEM file of CA certificates trusted for registries' TLS besides the system roots (the
    /// chart mounts `revert.registry.caConfigMap` there).
    #[arg(long, env = "SLUICE_REVERT_REGISTRY_CA_FILE")]
    registry_ca_file: Option<PathBuf>,
    /// ConfigMap (in the operator's namespace) whose `ca.crt` holds PEM CA certificates trusted
    /// for registries' TLS; read on every registry use, so a renewed CA is trusted at once.
    #[arg(long, env = "SLUICE_REVERT_REGISTRY_CA_CONFIGMAP")]
    registry_ca_configmap: Option<String>,
    /// The kinds any pin may apply and prune, as `Kind.group` (`Kind` for the core group),
    /// comma-separated: an upper bound on every BundlePin's `spec.allowedKinds`. Default: the
    /// mesh kinds of `DEFAULT_ALLOWED_KINDS`.
    #[arg(
        long = "allowed-kinds",
        env = "SLUICE_REVERT_ALLOWED_KINDS",
        value_delimiter = ','
    )]
    allowed_kinds: Vec<String>,
    /// Seconds after a pin's creation during which a missing signature is retried rather than
    /// refused (a replicated registry may answer 404 just after the push).
    #[arg(
        long = "signature-grace-seconds",
        env = "SLUICE_REVERT_SIGNATURE_GRACE_SECONDS",
        default_value_t = 120
    )]
    signature_grace_seconds: u64,
    /// Most bytes the cache of verified bundles holds (their parsed objects, estimated); the
    /// least recently used bundle is evicted first and verified again when a pin needs it.
    #[arg(
        long = "verified-cache-bytes",
        env = "SLUICE_REVERT_VERIFIED_CACHE_BYTES",
        default_value_t = reconcile::DEFAULT_VERIFIED_CACHE_BYTES
    )]
    verified_cache_bytes: u64,
    /// Most bytes a bundle's files may take together once its layer is unpacked; a larger
    /// bundle is refused (`Verified=False`, naming the limit). Keep revert's memory limit well
    /// above it: a bundle is held unpacked and parsed while it is applied.
    #[arg(
        long = "max-bundle-unpacked-bytes",
        env = "SLUICE_REVERT_MAX_BUNDLE_UNPACKED_BYTES",
        default_value_t = sluice_bundle::archive::MAX_UNPACKED_BYTES,
        value_parser = clap::value_parser!(u64).range(1..)
    )]
    max_bundle_unpacked_bytes: u64,
    /// sigstore `trusted_root.json` (certificate authorities and transparency logs) that keyless
    /// signatures are verified against, offline; a pin's `spec.keyless` names the identities.
    /// Without it, keyless signatures are refused.
    #[arg(long, env = "SLUICE_REVERT_TRUSTED_ROOT")]
    trusted_root: Option<PathBuf>,
    /// Clone URL of the intent repository; git reverts are off without it.
    #[arg(long, env = "SLUICE_REVERT_GIT_URL")]
    git_url: Option<String>,
    /// File holding the token for the intent repository (HTTPS basic credentials).
    #[arg(long, env = "SLUICE_REVERT_GIT_TOKEN_FILE")]
    git_token_file: Option<PathBuf>,
    /// Author name of revert commits.
    #[arg(
        long,
        env = "SLUICE_REVERT_GIT_AUTHOR",
        default_value = "sluice-revert"
    )]
    git_author: String,
    /// Author e-mail of revert commits.
    #[arg(
        long,
        env = "SLUICE_REVERT_GIT_EMAIL",
        default_value = "sluice-revert@sluice.dev"
    )]
    git_email: String,
    /// Base URL of the Forgejo/Gitea forge; pull requests are off without it.
    #[arg(long, env = "SLUICE_REVERT_FORGE_URL")]
    forge_url: Option<String>,
    /// Owner of the intent repository on the forge.
    #[arg(long, env = "SLUICE_REVERT_FORGE_OWNER")]
    forge_owner: Option<String>,
    /// Name of the intent repository on the forge.
    #[arg(long, env = "SLUICE_REVERT_FORGE_REPO")]
    forge_repo: Option<String>,
    /// File holding the forge API token.
    #[arg(long, env = "SLUICE_REVERT_FORGE_TOKEN_FILE")]
    forge_token_file: Option<PathBuf>,
}

fn read_token(path: &PathBuf, flag: &str) -> anyhow::Result<String> {
    let token = std::fs::read_to_string(path).map_err(|e| {
        anyhow::anyhow!(
            "{flag} {}: {e}; mount the token Secret there",
            path.display()
        )
    })?;
    Ok(token.trim().to_owned())
}

fn settings(flags: &Flags, runtime: &RuntimeArgs, namespace: &str) -> anyhow::Result<Settings> {
    let git = flags
        .git_url
        .as_ref()
        .map(|url| -> anyhow::Result<GitConfig> {
            Ok(GitConfig {
                url: url.clone(),
                token: flags
                    .git_token_file
                    .as_ref()
                    .map(|p| read_token(p, "--git-token-file"))
                    .transpose()?,
                author_name: flags.git_author.clone(),
                author_email: flags.git_email.clone(),
            })
        })
        .transpose()?;
    let forge = match (&flags.forge_url, &flags.forge_owner, &flags.forge_repo) {
        (None, _, _) => None,
        (Some(url), Some(owner), Some(repo)) => Some(ForgeConfig {
            base_url: url.clone(),
            owner: owner.clone(),
            repo: repo.clone(),
            token: flags
                .forge_token_file
                .as_ref()
                .map(|p| read_token(p, "--forge-token-file"))
                .transpose()?
                .ok_or_else(|| anyhow::anyhow!("--forge-url needs --forge-token-file"))?,
            timeout: None,
        }),
        _ => anyhow::bail!("--forge-url needs --forge-owner and --forge-repo"),
    };
    Ok(Settings {
        cluster_namespace: flags
            .cluster_namespace
            .clone()
            .unwrap_or_else(|| namespace.to_owned()),
        registry_ca_config_map: flags
            .registry_ca_configmap
            .as_ref()
            .filter(|name| !name.is_empty())
            .map(|name| (namespace.to_owned(), name.clone())),
        registry_credentials: flags
            .registry_credentials_secret
            .as_ref()
            .filter(|name| !name.is_empty())
            .map(|name| (namespace.to_owned(), name.clone())),
        registry: RegistryOptions {
            ca_bundle: flags
                .registry_ca_file
                .as_deref()
                .map(sluice_bundle::CaBundle::from_file)
                .transpose()
                .map_err(|e| anyhow::anyhow!("--registry-ca-file: {e}"))?,
            plain_http_hosts: flags.insecure_registries.clone(),
            allowed_registries: flags
                .allowed_registries
                .iter()
                .map(|r| r.trim().to_owned())
                .filter(|r| !r.is_empty())
                .collect(),
            max_unpacked_bytes: Some(flags.max_bundle_unpacked_bytes),
            ..RegistryOptions::default()
        },
        git,
        forge,
        signature_grace: Some(std::time::Duration::from_secs(
            flags.signature_grace_seconds,
        )),
        verified_cache_bytes: Some(flags.verified_cache_bytes),
        application_namespace: runtime.namespace_scope().map(str::to_owned),
        trusted_root: flags.trusted_root.clone(),
        allowed_kinds: (!flags.allowed_kinds.is_empty()).then(|| {
            flags
                .allowed_kinds
                .iter()
                .map(|k| {
                    let (kind, group) = k.trim().split_once('.').unwrap_or((k.trim(), ""));
                    sluice_api::v1alpha1::bundle_pin::GroupKind {
                        group: group.to_owned(),
                        kind: kind.to_owned(),
                    }
                })
                .collect()
        }),
    })
}

/// `Runtime::run` with revert's controller (BundlePins plus the Application watch): serves
/// metrics and health, runs leader election, reconciles while leading, until SIGTERM/SIGINT.
async fn run(rt: Runtime, ctx: Arc<reconcile::Context>) -> anyhow::Result<()> {
    let pins = rt.namespaced_api::<BundlePin>();
    let applications = rt.namespaced_api::<Application>();
    let extend = controller::with_application_trigger(
        applications,
        watcher::Config::default().any_semantic(),
    );
    rt.run_with(pins, ctx, reconcile::reconcile, extend).await?;
    Ok(())
}

#[tokio::main]
async fn main() -> ExitCode {
    let cli = OperatorCli::<Flags>::parse_as(OPERATOR, env!("CARGO_PKG_DESCRIPTION"));
    let result = async {
        let mut rt = Runtime::init(OPERATOR, cli.runtime.clone())
            .await
            .map_err(anyhow::Error::from)?;
        let metrics = metrics::register(&mut rt.registry);
        let own_namespace = cli
            .runtime
            .lease_namespace
            .clone()
            .or_else(|| std::env::var("POD_NAMESPACE").ok())
            .filter(|s| !s.is_empty())
            .unwrap_or_else(|| "default".to_owned());
        let settings = settings(&cli.flags, &cli.runtime, &own_namespace)?;
        let mut ctx =
            reconcile::Context::new(rt.client.clone(), rt.recorder.clone(), settings, metrics)
                .map_err(anyhow::Error::from)?;
        ctx.leadership = rt.leadership().map_err(anyhow::Error::from)?;
        metrics::read_at_scrape(&rt.metrics.objects());
        ctx.notifier = rt.notifier.clone();
        let ctx = Arc::new(ctx);
        run(rt, ctx).await
    }
    .await;
    sluice_runtime::operator::exit_code(OPERATOR, result)
}
