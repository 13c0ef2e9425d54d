//! Errors of the cluster commands: each says what was wrong, where, and what to do, and has a
//! bounded `category()`.
//!
//! Owns the mapping of API errors (404, 403, 409, 422) to those messages; never prints.

use crate::kinds::Kind;

/// Exit code of a command refused (forbidden, not found, invalid, not applicable): the same code
/// `bundle verify` exits with for a refused signature.
pub const EXIT_REFUSED: u8 = crate::bundle::EXIT_REFUSED;
/// Exit code of a usage error (unknown kind, wrong kind, bad argument).
pub const EXIT_USAGE: u8 = 2;

/// What went wrong in a cluster command.
#[derive(Debug, thiserror::Error, strum::IntoStaticStr)]
pub enum CliError {
    /// The kubeconfig could not be loaded.
    #[error("cannot load the kubeconfig: {message}; set KUBECONFIG or pass --kubeconfig")]
    Config {
        /// Why.
        message: String,
    },
    /// A kind that is not a sluice kind.
    #[error(
        "'{kind}' is not a sluice kind: use rollout (ro, srol), wavegate (wg, swg), bundlepin (pin, spin), revisionupgrade (ru, sru) or gatetemplate (gt, sgt)"
    )]
    UnknownKind {
        /// As typed.
        kind: String,
    },
    /// A command given an object of a kind it does not act on.
    #[error(
        "'{command}' does not act on {kind} {name}: it acts on {}",
        list(allowed)
    )]
    WrongKind {
        /// The command.
        command: String,
        /// The kind given.
        kind: Kind,
        /// The object's name.
        name: String,
        /// The kinds the command acts on.
        allowed: Vec<Kind>,
    },
    /// The object does not exist.
    #[error(
        "{kind} {name:?} not found{}{}",
        scope(namespace),
        hint(other_kinds, kind, name)
    )]
    NotFound {
        /// Its kind.
        kind: Kind,
        /// Its name.
        name: String,
        /// Its namespace (none for cluster-scoped kinds).
        namespace: Option<String>,
        /// Other sluice kinds that have an object of that name there.
        other_kinds: Vec<Kind>,
    },
    /// The API server refused the request for lack of permission.
    #[error(
        "forbidden: {message}; ask for '{verb}' on {resource}.sluice.dev{} (the chart's roles grant it to release engineers, not to viewers)",
        scope(namespace)
    )]
    Forbidden {
        /// The verb refused.
        verb: String,
        /// The plural resource.
        resource: String,
        /// Where.
        namespace: Option<String>,
        /// The API server's message.
        message: String,
    },
    /// The object's state does not allow the command.
    #[error("{kind} {name}: {message}")]
    NotApplicable {
        /// Its kind.
        kind: Kind,
        /// Its name.
        name: String,
        /// Why, and what to do instead.
        message: String,
    },
    /// The API server rejected the change as invalid.
    #[error("{kind} {name}: the API server rejected the change: {message}")]
    Invalid {
        /// Its kind.
        kind: Kind,
        /// Its name.
        name: String,
        /// The API server's message.
        message: String,
    },
    /// Bad arguments.
    #[error("{message}")]
    Usage {
        /// What was wrong and what to do.
        message: String,
    },
    /// Contexts that could not be read (the others were printed).
    #[error("could not read context(s) {contexts}: see the reasons above")]
    Unreachable {
        /// The contexts, comma-separated.
        contexts: String,
    },
    /// Any other API error.
    #[error(
        "{action} failed: {source}; check that the cluster is reachable and the sluice CRDs are installed"
    )]
    Api {
        /// What was being done.
        action: String,
        /// The client error.
        source: kube::Error,
    },
}

impl CliError {
    /// A bounded name of the error's kind.
    pub fn category(&self) -> &'static str {
        self.into()
    }

    /// The process exit code for this error.
    pub fn exit_code(&self) -> u8 {
        match self {
            CliError::UnknownKind { .. } | CliError::WrongKind { .. } | CliError::Usage { .. } => {
                EXIT_USAGE
            }
            CliError::NotFound { .. }
            | CliError::Forbidden { .. }
            | CliError::NotApplicable { .. }
            | CliError::Invalid { .. } => EXIT_REFUSED,
            CliError::Config { .. } | CliError::Api { .. } | CliError::Unreachable { .. } => {
                crate::EXIT_FAILURE
            }
        }
    }

    /// Maps a client error of `verb` on an object to a [`CliError`].
    pub fn from_kube(
        err: kube::Error,
        verb: &str,
        kind: Kind,
        name: &str,
        namespace: Option<&str>,
    ) -> CliError {
        match &err {
            kube::Error::Api(status) if status.code == 404 => CliError::NotFound {
                kind,
                name: name.to_string(),
                namespace: namespace.map(str::to_string),
                other_kinds: Vec::new(),
            },
            kube::Error::Api(status) if status.code == 403 => CliError::Forbidden {
                verb: verb.to_string(),
                resource: kind.plural().to_string(),
                namespace: namespace.map(str::to_string),
                message: status.message.clone(),
            },
            kube::Error::Api(status) if status.code == 422 || status.code == 400 => {
                CliError::Invalid {
                    kind,
                    name: name.to_string(),
                    message: status.message.clone(),
                }
            }
            _ => CliError::Api {
                action: format!("{verb} {kind} {name}"),
                source: err,
            },
        }
    }
}

fn list(kinds: &[Kind]) -> String {
    let names: Vec<String> = kinds.iter().map(|k| format!("{k}s")).collect();
    names.join(" and ")
}

fn scope(namespace: &Option<String>) -> String {
    match namespace {
        Some(ns) => format!(" in namespace {ns:?}"),
        None => String::new(),
    }
}

fn hint(other: &[Kind], kind: &Kind, name: &str) -> String {
    match other.first() {
        Some(o) => format!(
            ": there is a {o} {name:?}; name it as {}/{name} if this command acts on {o}s",
            o.plural()
        ),
        None => format!(": list them with 'kubectl sluice get {}'", kind.plural()),
    }
}
