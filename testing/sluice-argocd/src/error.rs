//! Errors of the simulated Argo CD, with a bounded `category()` for logs, conditions and metrics.
//!
//! Owns the error vocabulary only; it must never carry a token or a cluster credential in a
//! message (cluster Secrets are named, never quoted).

/// Everything that can go wrong in the simulated Argo CD.
#[derive(Debug, thiserror::Error, strum::IntoStaticStr)]
#[strum(serialize_all = "snake_case")]
pub enum ArgoCdError {
    /// A Kubernetes API call failed.
    #[error(
        "Kubernetes API call failed while {action}: {source}; check that the cluster is reachable and the object exists"
    )]
    Kube {
        /// What was being done (names the object and cluster).
        action: String,
        /// The client error.
        #[source]
        source: kube::Error,
    },
    /// A cluster Secret lacks a field or holds an unreadable one.
    #[error(
        "cluster Secret {secret} is invalid: {reason}; fix the Secret (data keys name, server, config)"
    )]
    ClusterSecret {
        /// `namespace/name` of the Secret.
        secret: String,
        /// What is wrong with it.
        reason: String,
    },
    /// No cluster Secret names the Application's destination.
    #[error(
        "destination {destination} is not a known cluster: no cluster Secret in namespace {namespace} has that {field}; add a Secret labelled argocd.argoproj.io/secret-type=cluster"
    )]
    UnknownCluster {
        /// The destination name or server URL.
        destination: String,
        /// `name` or `server`.
        field: &'static str,
        /// The Argo CD namespace searched.
        namespace: String,
    },
    /// The source (git or OCI) could not be fetched or its revision resolved.
    #[error("failed to fetch {repo_url} at revision {revision}: {reason}")]
    Source {
        /// The source's `repoURL`.
        repo_url: String,
        /// The revision asked for.
        revision: String,
        /// What failed.
        reason: String,
    },
    /// The manifests at the source are not valid Kubernetes objects.
    #[error("manifests of {repo_url} at {revision} (path {path}) are invalid: {reason}")]
    Manifests {
        /// The source's `repoURL`.
        repo_url: String,
        /// The resolved revision.
        revision: String,
        /// The source path.
        path: String,
        /// What is wrong.
        reason: String,
    },
    /// The Application's spec cannot be acted on.
    #[error("Application {application} has an invalid spec: {reason}")]
    InvalidSpec {
        /// `namespace/name`.
        application: String,
        /// What is wrong and what to do.
        reason: String,
    },
    /// A kind in the manifests is not served by the destination cluster.
    #[error(
        "{api_version} {kind} is not served by cluster {cluster}: {reason}; install its CRD in the destination cluster first"
    )]
    UnknownKind {
        /// apiVersion of the object.
        api_version: String,
        /// Kind of the object.
        kind: String,
        /// Destination cluster server URL.
        cluster: String,
        /// The discovery error.
        reason: String,
    },
    /// An ApplicationSet generator could not produce parameters.
    #[error("ApplicationSet {application_set}: generator failed: {reason}")]
    Generator {
        /// `namespace/name`.
        application_set: String,
        /// What failed and what to fix.
        reason: String,
    },
    /// A rendered Application template is unusable.
    #[error("ApplicationSet {application_set}: template rendering failed: {reason}")]
    Template {
        /// `namespace/name`.
        application_set: String,
        /// What is wrong.
        reason: String,
    },
}

impl ArgoCdError {
    /// Bounded category (a metric label or condition reason never carries a payload).
    pub fn category(&self) -> &'static str {
        self.into()
    }

    /// Wraps a kube error with what was being done.
    pub(crate) fn kube(action: impl Into<String>, source: kube::Error) -> Self {
        ArgoCdError::Kube {
            action: action.into(),
            source,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn categories_are_bounded_and_distinct() {
        let errors = [
            ArgoCdError::ClusterSecret {
                secret: "argocd/a".into(),
                reason: "x".into(),
            },
            ArgoCdError::UnknownCluster {
                destination: "a".into(),
                field: "name",
                namespace: "argocd".into(),
            },
            ArgoCdError::Source {
                repo_url: "r".into(),
                revision: "v".into(),
                reason: "x".into(),
            },
            ArgoCdError::Manifests {
                repo_url: "r".into(),
                revision: "v".into(),
                path: ".".into(),
                reason: "x".into(),
            },
            ArgoCdError::InvalidSpec {
                application: "a".into(),
                reason: "x".into(),
            },
            ArgoCdError::UnknownKind {
                api_version: "v1".into(),
                kind: "K".into(),
                cluster: "c".into(),
                reason: "x".into(),
            },
            ArgoCdError::Generator {
                application_set: "a".into(),
                reason: "x".into(),
            },
            ArgoCdError::Template {
                application_set: "a".into(),
                reason: "x".into(),
            },
        ];
        let mut seen: Vec<&str> = errors.iter().map(ArgoCdError::category).collect();
        seen.sort();
        seen.dedup();
        assert_eq!(seen.len(), errors.len());
        for e in &errors {
            assert!(
                e.category()
                    .chars()
                    .all(|c| c.is_ascii_lowercase() || c == '_')
            );
        }
    }
}
