//! The object commands of the plugin: `get`, `status [--watch]`, `promote [--full]`, `abort`,
//! `pause`, `resume`, `retry`, `pin`, `unpin` and `upgrade abort|resume`: argument shapes and
//! what each prints.
//!
//! Owns the command-line surface and output of those commands; the decisions live in
//! `control`, the text in `tree`, the I/O in `cluster`. Never acts on an object it was not
//! named.

use std::time::Duration;

use clap::{Args, Subcommand};
use serde_json::Value;

use crate::cluster::{Cluster, ClusterArgs};
use crate::control::{Control, PinRequest};
use crate::error::CliError;
use crate::kinds::{Kind, Target};
use crate::output::{self, Format};
use crate::tree;

/// `get KIND [NAME]`.
#[derive(Debug, Args)]
pub struct GetArgs {
    /// rollout (ro, srol), wavegate (wg, swg), bundlepin (pin, spin), revisionupgrade (ru,
    /// sru), gatetemplate (gt, sgt), or `all`.
    pub kind: String,
    /// One object (default: all of the kind).
    pub name: Option<String>,
    /// List across all namespaces.
    #[arg(short = 'A', long)]
    pub all_namespaces: bool,
    /// Print the objects as JSON or YAML (one object, or a `List`) instead of a table.
    #[arg(short = 'o', long, value_enum, value_name = "FORMAT")]
    pub output: Option<Format>,
    #[command(flatten)]
    pub cluster: ClusterArgs,
}

/// `status KIND/NAME` or `status KIND NAME`.
#[derive(Debug, Args)]
pub struct StatusArgs {
    /// KIND/NAME, or KIND followed by NAME.
    pub object: String,
    /// The name, when the kind was given alone.
    pub name: Option<String>,
    /// Keep printing the tree after every change (until the object is deleted or Ctrl-C).
    #[arg(short = 'w', long)]
    pub watch: bool,
    /// With --watch: stop after this many seconds.
    #[arg(long, value_name = "SECONDS", requires = "watch")]
    pub watch_timeout: Option<u64>,
    /// Print the object as JSON or YAML instead of the tree (with --watch: once per change,
    /// YAML documents separated by `---`).
    #[arg(short = 'o', long, value_enum, value_name = "FORMAT")]
    pub output: Option<Format>,
    #[command(flatten)]
    pub cluster: ClusterArgs,
}

/// A control command on `[KIND/]NAME`.
#[derive(Debug, Args)]
pub struct ControlArgs {
    /// NAME (of the command's default kind) or KIND/NAME.
    pub object: String,
    #[command(flatten)]
    pub cluster: ClusterArgs,
}

/// `promote [--full] NAME`.
#[derive(Debug, Args)]
pub struct PromoteArgs {
    /// The Rollout: NAME or rollout/NAME.
    pub object: String,
    /// Promote fully now (canary weight 100) instead of completing the current step.
    #[arg(long)]
    pub full: bool,
    #[command(flatten)]
    pub cluster: ClusterArgs,
}

/// `pin APPLICATION... --bundle REF --keys SECRET --reason TEXT`.
#[derive(Debug, Args)]
pub struct PinArgs {
    /// Argo CD Applications to pin (NAME, or NAMESPACE/NAME outside the pin's namespace).
    #[arg(required = true)]
    pub applications: Vec<String>,
    /// The signed bundle by digest: oci://host/repo@sha256:<hex>.
    #[arg(long, value_name = "REF")]
    pub bundle: String,
    /// Secret (in the pin's namespace) holding the cosign public keys.
    #[arg(
        long,
        value_name = "SECRET",
        default_value = "sluice-cosign-public-keys"
    )]
    pub keys: String,
    /// Why the pin exists (audited: Event, log, Git commit message).
    #[arg(long)]
    pub reason: String,
    /// The BundlePin's name (default: pin-<application>-<digest prefix>).
    #[arg(long)]
    pub name: Option<String>,
    /// The commit of the bad change in the intent repository: revert pushes a revert branch for
    /// it (and opens a pull request when the operator has a forge configured).
    #[arg(long, value_name = "SHA")]
    pub revert_commit: Option<String>,
    /// Base branch of the revert (default: main).
    #[arg(long, value_name = "BRANCH", requires = "revert_commit")]
    pub base_branch: Option<String>,
    /// Push the revert branch but open no pull request.
    #[arg(long, requires = "revert_commit")]
    pub no_pull_request: bool,
    /// Take over from this live BundlePin (an explicit hand-over of its Applications).
    #[arg(long, value_name = "PIN")]
    pub supersedes: Option<String>,
    /// Pin a digest Argo CD never deployed for the Application (audited by revert).
    #[arg(long)]
    pub allow_any_revision: bool,
    #[command(flatten)]
    pub cluster: ClusterArgs,
}

/// `unpin NAME --reason TEXT`.
#[derive(Debug, Args)]
pub struct UnpinArgs {
    /// The BundlePin: NAME or pin/NAME.
    pub object: String,
    /// Why it is released now (audited).
    #[arg(long)]
    pub reason: String,
    #[command(flatten)]
    pub cluster: ClusterArgs,
}

/// `upgrade abort|resume NAME`.
#[derive(Debug, Subcommand)]
pub enum UpgradeCommand {
    /// Abort a RevisionUpgrade: moved namespaces are retagged back and restarted (paced).
    Abort(ControlArgs),
    /// Resume a paused or aborted RevisionUpgrade.
    Resume(ControlArgs),
}

/// `get`: a table of one kind, or of every kind with `all`.
pub async fn get(args: GetArgs) -> Result<(), CliError> {
    let cluster = Cluster::connect(&args.cluster).await?;
    let kinds: Vec<Kind> = if args.kind.eq_ignore_ascii_case("all") {
        Kind::ALL.to_vec()
    } else {
        vec![Kind::parse(&args.kind)?]
    };
    if let Some(format) = args.output {
        let mut objects = Vec::new();
        for kind in &kinds {
            match &args.name {
                Some(name) => objects.push(cluster.get(*kind, name).await?),
                None => objects.extend(cluster.list(*kind, args.all_namespaces).await?),
            }
        }
        let value = match (&args.name, objects.as_slice()) {
            (Some(_), [one]) => output::clean(one),
            _ => output::list(&objects),
        };
        print!("{}", output::render(format, &value)?);
        return Ok(());
    }
    let mut first = true;
    for kind in kinds {
        let objects = match &args.name {
            Some(name) => vec![cluster.get(kind, name).await?],
            None => cluster.list(kind, args.all_namespaces).await?,
        };
        if objects.is_empty() && args.kind.eq_ignore_ascii_case("all") {
            continue;
        }
        if !first {
            println!();
        }
        first = false;
        if objects.is_empty() {
            println!("No {} found.", kind.plural());
            continue;
        }
        let mut rows = vec![tree::get_header(kind, args.all_namespaces)];
        rows.extend(
            objects
                .iter()
                .map(|o| tree::get_row(kind, o, args.all_namespaces)),
        );
        if args.kind.eq_ignore_ascii_case("all") {
            println!("{}:", kind.plural());
        }
        print!("{}", tree::table(&rows));
    }
    if first {
        println!("No sluice objects found.");
    }
    Ok(())
}

/// `status`: the tree of one object, once or on every change.
pub async fn status(args: StatusArgs) -> Result<(), CliError> {
    let target = match &args.name {
        Some(name) => Target {
            kind: Kind::parse(&args.object)?,
            name: name.clone(),
        },
        None => {
            if !args.object.contains('/') {
                return Err(CliError::Usage {
                    message: format!(
                        "'{}' names no kind: use KIND/NAME (e.g. rollout/{0}) or KIND NAME",
                        args.object
                    ),
                });
            }
            Target::parse(&args.object, "status", &Kind::ALL)?
        }
    };
    let cluster = Cluster::connect(&args.cluster).await?;
    let kind = target.kind;
    let render = |obj: &Value| -> Result<String, CliError> {
        match args.output {
            None => Ok(tree::status(kind, obj)),
            Some(format) => output::render(format, &output::clean(obj)),
        }
    };
    if args.watch {
        // Trees are separated by a blank line, YAML documents by `---`, JSON values by nothing
        // (a stream of JSON values, as `kubectl get -w -o json` prints).
        let separator = match args.output {
            None => "\n",
            Some(Format::Yaml) => "---\n",
            Some(Format::Json) => "",
        };
        cluster
            .watch(
                &target,
                args.watch_timeout.map(Duration::from_secs),
                &render,
                separator,
            )
            .await
    } else {
        let obj = cluster.get(target.kind, &target.name).await?;
        print!("{}", render(&obj)?);
        Ok(())
    }
}

/// A control command: decide, patch, say what was asked of the operator.
pub async fn control(
    control: Control,
    object: &str,
    cluster: &ClusterArgs,
) -> Result<(), CliError> {
    let target = Target::parse(object, control.command(), control.kinds())?;
    let cluster = Cluster::connect(cluster).await?;
    let patch = cluster.control(&control, &target).await?;
    let fields: Vec<String> = patch["spec"]
        .as_object()
        .map(|m| m.iter().map(|(k, v)| format!("spec.{k}={v}")).collect())
        .unwrap_or_default();
    println!(
        "{} {}: {} requested ({}); the operator acts on it and reports in status",
        target.kind,
        target.name,
        control.command(),
        fields.join(", ")
    );
    Ok(())
}

/// `pin`: create a BundlePin.
pub async fn pin(args: PinArgs) -> Result<(), CliError> {
    let cluster = Cluster::connect(&args.cluster).await?;
    let name = cluster
        .pin(&PinRequest {
            applications: args.applications,
            bundle: args.bundle,
            keys_secret: args.keys,
            reason: args.reason,
            name: args.name,
            revert_commit: args.revert_commit,
            base_branch: args.base_branch,
            pull_request: !args.no_pull_request,
            supersedes: args.supersedes,
            allow_any_revision: args.allow_any_revision,
        })
        .await?;
    println!("BundlePin {name} created: follow it with 'kubectl sluice status pin/{name} --watch'");
    Ok(())
}
