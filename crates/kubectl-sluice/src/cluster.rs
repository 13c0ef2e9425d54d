//! The cluster side of the plugin's object commands: client from the kubeconfig, reading and
//! listing sluice objects, the control patches (with a resourceVersion precondition, decided
//! again on a conflict), creating pins, and watching one object.
//!
//! Owns all I/O of `get`, `status`, the control commands, `pin` and `upgrade`; the decisions
//! and the text come from `control` and `tree`. Never writes status and never anything but
//! sluice objects.

use std::path::PathBuf;
use std::time::Duration;

use clap::Args;
use futures::{StreamExt, TryStreamExt};
use kube::api::{Api, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::runtime::watcher;
use kube::{Client, Config};
use serde_json::Value;

use crate::control::{self, Control, PinRequest};
use crate::error::CliError;
use crate::kinds::{Kind, Target};

/// The field manager of the plugin's writes (visible in managedFields).
pub const FIELD_MANAGER: &str = "kubectl-sluice";
/// How often a control command decides again after a conflicting write.
const CONFLICT_RETRIES: usize = 5;

/// Where to connect: the usual kubectl flags.
#[derive(Clone, Debug, Args)]
pub struct ClusterArgs {
    /// Path to the kubeconfig file (default: $KUBECONFIG, then ~/.kube/config).
    #[arg(long, global = true, value_name = "FILE")]
    pub kubeconfig: Option<PathBuf>,
    /// The kubeconfig context to use (default: the current context).
    #[arg(long, global = true, value_name = "NAME")]
    pub context: Option<String>,
    /// Namespace of namespaced objects (default: the context's namespace, else `default`).
    #[arg(short = 'n', long, global = true, value_name = "NAMESPACE")]
    pub namespace: Option<String>,
}

/// A connected client and the namespace commands act in.
pub struct Cluster {
    client: Client,
    namespace: String,
}

impl Cluster {
    /// Connects as the kubeconfig says.
    pub async fn connect(args: &ClusterArgs) -> Result<Cluster, CliError> {
        let options = KubeConfigOptions {
            context: args.context.clone(),
            ..KubeConfigOptions::default()
        };
        let config = match &args.kubeconfig {
            Some(path) => {
                let kc = Kubeconfig::read_from(path).map_err(|e| CliError::Config {
                    message: format!("{}: {e}", path.display()),
                })?;
                Config::from_custom_kubeconfig(kc, &options).await
            }
            None => Config::from_kubeconfig(&options).await,
        }
        .map_err(|e| CliError::Config {
            message: e.to_string(),
        })?;
        let namespace = args
            .namespace
            .clone()
            .unwrap_or_else(|| config.default_namespace.clone());
        let client = Client::try_from(config).map_err(|e| CliError::Config {
            message: e.to_string(),
        })?;
        Ok(Cluster { client, namespace })
    }

    fn api(&self, kind: Kind) -> Api<DynamicObject> {
        let ar = kind.api_resource();
        if kind.namespaced() {
            Api::namespaced_with(self.client.clone(), &self.namespace, &ar)
        } else {
            Api::all_with(self.client.clone(), &ar)
        }
    }

    fn ns(&self, kind: Kind) -> Option<&str> {
        kind.namespaced().then_some(self.namespace.as_str())
    }

    /// Reads one object as JSON; a missing one names the other sluice kinds that have an
    /// object of that name (the usual cause: the wrong kind).
    pub async fn get(&self, kind: Kind, name: &str) -> Result<Value, CliError> {
        match self.api(kind).get(name).await {
            Ok(obj) => Ok(serde_json::to_value(obj).unwrap_or(Value::Null)),
            Err(err) => {
                let mut e = CliError::from_kube(err, "get", kind, name, self.ns(kind));
                if let CliError::NotFound { other_kinds, .. } = &mut e {
                    for other in Kind::ALL.into_iter().filter(|k| *k != kind) {
                        if matches!(self.api(other).get_opt(name).await, Ok(Some(_))) {
                            other_kinds.push(other);
                        }
                    }
                }
                Err(e)
            }
        }
    }

    /// Lists objects of a kind, in the namespace or in all.
    pub async fn list(&self, kind: Kind, all_namespaces: bool) -> Result<Vec<Value>, CliError> {
        let api = if all_namespaces || !kind.namespaced() {
            Api::all_with(self.client.clone(), &kind.api_resource())
        } else {
            self.api(kind)
        };
        let ns = if all_namespaces { None } else { self.ns(kind) };
        let list = api
            .list(&ListParams::default())
            .await
            .map_err(|e| CliError::from_kube(e, "list", kind, "", ns))?;
        Ok(list
            .items
            .into_iter()
            .map(|o| serde_json::to_value(o).unwrap_or(Value::Null))
            .collect())
    }

    /// Asks for `control` on `target`: reads, decides, patches with the resourceVersion it
    /// decided from; on a conflict reads and decides again. Returns the patch written.
    pub async fn control(&self, control: &Control, target: &Target) -> Result<Value, CliError> {
        let api = self.api(target.kind);
        let mut attempt = 0;
        loop {
            let obj = self.get(target.kind, &target.name).await?;
            let patch = control::decide(control, target.kind, &obj).map_err(|message| {
                CliError::NotApplicable {
                    kind: target.kind,
                    name: target.name.clone(),
                    message,
                }
            })?;
            let params = PatchParams {
                field_manager: Some(FIELD_MANAGER.to_string()),
                ..PatchParams::default()
            };
            match api
                .patch(&target.name, &params, &Patch::Merge(&patch))
                .await
            {
                Ok(_) => return Ok(patch),
                Err(kube::Error::Api(s)) if s.code == 409 && attempt < CONFLICT_RETRIES => {
                    attempt += 1;
                }
                Err(err) => {
                    return Err(CliError::from_kube(
                        err,
                        "patch",
                        target.kind,
                        &target.name,
                        self.ns(target.kind),
                    ));
                }
            }
        }
    }

    /// Creates a BundlePin; returns its name.
    pub async fn pin(&self, request: &PinRequest) -> Result<String, CliError> {
        let obj = control::bundle_pin(request, &self.namespace)
            .map_err(|message| CliError::Usage { message })?;
        let name = obj["metadata"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        let dynamic: DynamicObject = serde_json::from_value(obj).map_err(|e| CliError::Usage {
            message: format!("cannot build the BundlePin: {e}"),
        })?;
        let params = PostParams {
            field_manager: Some(FIELD_MANAGER.to_string()),
            ..PostParams::default()
        };
        match self.api(Kind::BundlePin).create(&params, &dynamic).await {
            Ok(_) => Ok(name),
            Err(kube::Error::Api(s)) if s.code == 409 => Err(CliError::NotApplicable {
                kind: Kind::BundlePin,
                name: name.clone(),
                message: format!(
                    "already exists in namespace {:?}: see 'kubectl sluice status pin/{name}', or choose another --name",
                    self.namespace
                ),
            }),
            Err(err) => Err(CliError::from_kube(
                err,
                "create",
                Kind::BundlePin,
                &name,
                Some(&self.namespace),
            )),
        }
    }

    /// Prints `target` as `render` makes it now and after every change (each print after the
    /// first preceded by `separator`), until the object is deleted, `timeout` passes, or the
    /// process is interrupted.
    pub async fn watch(
        &self,
        target: &Target,
        timeout: Option<Duration>,
        render: &dyn Fn(&Value) -> Result<String, CliError>,
        separator: &str,
    ) -> Result<(), CliError> {
        // Fail clearly first when the object is missing or unreadable.
        let first = self.get(target.kind, &target.name).await?;
        print!("{}", render(&first)?);
        let mut last = strip_volatile(&first);
        let config = watcher::Config::default().fields(&format!("metadata.name={}", target.name));
        let stream = watcher(self.api(target.kind), config).map_err(|e| CliError::Api {
            action: format!("watch {} {}", target.kind, target.name),
            source: kube::Error::Service(Box::new(e)),
        });
        let mut stream = std::pin::pin!(stream);
        let deadline = timeout.map(|t| tokio::time::Instant::now() + t);
        loop {
            let next = match deadline {
                Some(d) => match tokio::time::timeout_at(d, stream.next()).await {
                    Ok(next) => next,
                    Err(_) => return Ok(()),
                },
                None => stream.next().await,
            };
            match next {
                None => return Ok(()),
                Some(Err(e)) => return Err(e),
                Some(Ok(watcher::Event::Apply(obj) | watcher::Event::InitApply(obj))) => {
                    let v = serde_json::to_value(obj).unwrap_or(Value::Null);
                    let stripped = strip_volatile(&v);
                    if stripped != last {
                        print!("{separator}{}", render(&v)?);
                        last = stripped;
                    }
                }
                Some(Ok(watcher::Event::Delete(_))) => {
                    println!("{} {} was deleted", target.kind, target.name);
                    return Ok(());
                }
                Some(Ok(_)) => {}
            }
        }
    }
}

/// The object without fields that change on every write (so a watch prints only real changes).
fn strip_volatile(v: &Value) -> Value {
    let mut v = v.clone();
    if let Some(meta) = v.get_mut("metadata").and_then(Value::as_object_mut) {
        meta.remove("resourceVersion");
        meta.remove("managedFields");
    }
    v
}
