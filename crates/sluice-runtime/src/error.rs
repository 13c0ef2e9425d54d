//! Bounded error categories shared by every operator.
//!
//! Owns the mapping from an error to a small, fixed set of categories that become the
//! `category` label of the error metric and the reason of the Warning Event. Must never carry a
//! payload (object name, message, id) into a category: labels stay bounded.

use std::fmt;

/// A bounded classification of what went wrong, used as metric label and Event reason.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Category {
    /// The object's spec is invalid in a way CEL could not express; waiting for a change.
    InvalidSpec,
    /// A write lost a race on `metadata.resourceVersion` (HTTP 409).
    Conflict,
    /// An object the reconcile needs does not exist (HTTP 404).
    NotFound,
    /// The operator's identity is not allowed to do what it tried (HTTP 401/403).
    Forbidden,
    /// The API server rejected a request as invalid (HTTP 400/422).
    Rejected,
    /// The API server or network failed transiently (HTTP 5xx, 429, timeouts, connection errors).
    ApiUnavailable,
    /// Encoding or decoding an object failed.
    Serialization,
    /// The operator's own configuration is wrong (flags, env, kubeconfig).
    Config,
    /// A metrics source or other dependency outside the Kubernetes API failed.
    Dependency,
    /// Anything else; a bug if it shows up.
    Internal,
}

impl Category {
    /// Every category, for pre-registering metric series and for tests.
    pub const ALL: [Category; 10] = [
        Category::InvalidSpec,
        Category::Conflict,
        Category::NotFound,
        Category::Forbidden,
        Category::Rejected,
        Category::ApiUnavailable,
        Category::Serialization,
        Category::Config,
        Category::Dependency,
        Category::Internal,
    ];

    /// The metric label value (snake_case, stable).
    pub fn label(self) -> &'static str {
        match self {
            Category::InvalidSpec => "invalid_spec",
            Category::Conflict => "conflict",
            Category::NotFound => "not_found",
            Category::Forbidden => "forbidden",
            Category::Rejected => "rejected",
            Category::ApiUnavailable => "api_unavailable",
            Category::Serialization => "serialization",
            Category::Config => "config",
            Category::Dependency => "dependency",
            Category::Internal => "internal",
        }
    }

    /// The Event reason (CamelCase, stable: dashboards and alerts key on it).
    pub fn reason(self) -> &'static str {
        match self {
            Category::InvalidSpec => "InvalidSpec",
            Category::Conflict => "WriteConflict",
            Category::NotFound => "NotFound",
            Category::Forbidden => "Forbidden",
            Category::Rejected => "Rejected",
            Category::ApiUnavailable => "ApiUnavailable",
            Category::Serialization => "SerializationFailed",
            Category::Config => "ConfigError",
            Category::Dependency => "DependencyFailed",
            Category::Internal => "InternalError",
        }
    }

    /// Whether retrying the same request later may succeed without anyone changing the object.
    pub fn is_transient(self) -> bool {
        matches!(
            self,
            Category::Conflict
                | Category::ApiUnavailable
                | Category::Dependency
                | Category::NotFound
        )
    }

    /// Classifies a kube client error by its HTTP status or failure kind.
    pub fn of_kube(err: &kube::Error) -> Category {
        match err {
            kube::Error::Api(status) => Category::of_status_code(status.code),
            kube::Error::SerdeError(_) => Category::Serialization,
            kube::Error::InferConfig(_) | kube::Error::Discovery(_) => Category::Config,
            _ => Category::ApiUnavailable,
        }
    }

    /// Classifies an HTTP status code returned by the API server.
    pub fn of_status_code(code: u16) -> Category {
        match code {
            409 => Category::Conflict,
            404 => Category::NotFound,
            401 | 403 => Category::Forbidden,
            400 | 422 => Category::Rejected,
            429 | 500..=599 => Category::ApiUnavailable,
            _ => Category::Internal,
        }
    }
}

impl fmt::Display for Category {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.label())
    }
}

/// Implemented by every error an operator's reconcile can return.
pub trait Categorized {
    /// The bounded category of this error.
    fn category(&self) -> Category;

    /// The longest the retry of the failed reconcile may wait, whatever the back-off says: a
    /// deadline the object keeps (a pin that must give automation back by then). `None`: the
    /// back-off alone.
    fn retry_within(&self) -> Option<std::time::Duration> {
        None
    }
}

/// When a failed reconcile is retried: the back-off's `delay`, no later than the error's
/// [`Categorized::retry_within`].
pub fn retry_delay(delay: std::time::Duration, err: &impl Categorized) -> std::time::Duration {
    err.retry_within().map_or(delay, |bound| delay.min(bound))
}

impl Categorized for kube::Error {
    fn category(&self) -> Category {
        Category::of_kube(self)
    }
}

/// Whether a kube error is a 409 Conflict (a stale resourceVersion or a lost race).
pub fn is_conflict(err: &kube::Error) -> bool {
    matches!(err, kube::Error::Api(s) if s.code == 409)
}

/// The failures every operator's reconcile shares, whatever its object: leadership lost before a
/// write, an object without the namespace it must be written back to, a status write that did not
/// happen. Each operator's error carries it as one variant ([`reconcile_failures!`]).
#[derive(Debug, thiserror::Error)]
pub enum ReconcileFailure {
    /// This replica no longer leads: the write was not sent.
    #[error(transparent)]
    NotLeader(#[from] crate::leader::NotLeader),
    /// A namespaced object came without a namespace (a watch or API bug).
    #[error("{kind} {name} has no metadata.namespace; it cannot be written back")]
    NoNamespace {
        /// The object's kind.
        kind: String,
        /// The object's name.
        name: String,
    },
    /// Writing the object's status failed.
    #[error("writing {kind} status: {source}")]
    Status {
        /// The object's kind.
        kind: String,
        /// Why the write did not happen.
        source: Box<crate::write::WriteError>,
    },
}

impl ReconcileFailure {
    /// The namespace of `obj`, a namespaced object, or [`ReconcileFailure::NoNamespace`]
    /// naming it.
    pub fn namespace_of<K>(obj: &K) -> Result<String, ReconcileFailure>
    where
        K: kube::Resource<DynamicType = ()>,
    {
        obj.meta()
            .namespace
            .clone()
            .ok_or_else(|| ReconcileFailure::NoNamespace {
                kind: K::kind(&()).into_owned(),
                name: obj.meta().name.clone().unwrap_or_default(),
            })
    }

    /// A failed status write of a `K`.
    pub fn status<K>(source: crate::write::WriteError) -> ReconcileFailure
    where
        K: kube::Resource<DynamicType = ()>,
    {
        ReconcileFailure::Status {
            kind: K::kind(&()).into_owned(),
            source: Box::new(source),
        }
    }
}

impl Categorized for ReconcileFailure {
    fn category(&self) -> Category {
        match self {
            ReconcileFailure::NotLeader(e) => e.category(),
            ReconcileFailure::NoNamespace { .. } => Category::Internal,
            ReconcileFailure::Status { source, .. } => source.category(),
        }
    }
}

/// Wires [`ReconcileFailure`] into an operator's error as its variant `$variant`: `?` turns a
/// `ReconcileFailure` and a [`NotLeader`](crate::leader::NotLeader) into it and, with
/// `status of $kind`, a [`WriteError`](crate::write::WriteError) into a failed status write of
/// that kind (for an operator whose only fenced write is its status).
///
/// ```
/// use k8s_openapi::api::core::v1::ConfigMap;
/// use sluice_runtime::{error::ReconcileFailure, leader::NotLeader};
///
/// #[derive(Debug, thiserror::Error)]
/// enum ReconcileError {
///     #[error(transparent)]
///     Failure(ReconcileFailure),
/// }
/// sluice_runtime::reconcile_failures!(ReconcileError::Failure, status of ConfigMap);
///
/// let lost: ReconcileError = NotLeader.into();
/// assert!(matches!(lost, ReconcileError::Failure(ReconcileFailure::NotLeader(_))));
/// ```
#[macro_export]
macro_rules! reconcile_failures {
    ($error:ident :: $variant:ident) => {
        impl From<$crate::error::ReconcileFailure> for $error {
            fn from(failure: $crate::error::ReconcileFailure) -> Self {
                $error::$variant(failure)
            }
        }
        impl From<$crate::leader::NotLeader> for $error {
            fn from(e: $crate::leader::NotLeader) -> Self {
                $error::$variant(e.into())
            }
        }
    };
    ($error:ident :: $variant:ident, status of $kind:ty) => {
        $crate::reconcile_failures!($error::$variant);
        impl From<$crate::write::WriteError> for $error {
            fn from(e: $crate::write::WriteError) -> Self {
                $error::$variant($crate::error::ReconcileFailure::status::<$kind>(e))
            }
        }
    };
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    #[test]
    fn status_codes_map_to_categories() {
        let table = [
            (409, Category::Conflict),
            (404, Category::NotFound),
            (403, Category::Forbidden),
            (401, Category::Forbidden),
            (422, Category::Rejected),
            (400, Category::Rejected),
            (429, Category::ApiUnavailable),
            (503, Category::ApiUnavailable),
            (418, Category::Internal),
        ];
        for (code, want) in table {
            assert_eq!(Category::of_status_code(code), want, "HTTP {code}");
        }
    }

    #[test]
    fn labels_and_reasons_are_unique_and_shaped() {
        let labels: HashSet<_> = Category::ALL.iter().map(|c| c.label()).collect();
        let reasons: HashSet<_> = Category::ALL.iter().map(|c| c.reason()).collect();
        assert_eq!(labels.len(), Category::ALL.len());
        assert_eq!(reasons.len(), Category::ALL.len());
        for c in Category::ALL {
            assert!(
                c.label()
                    .chars()
                    .all(|ch| ch.is_ascii_lowercase() || ch == '_'),
                "{c:?}"
            );
            assert!(
                c.reason().starts_with(|ch: char| ch.is_ascii_uppercase()),
                "{c:?}"
            );
            assert!(
                c.reason().chars().all(|ch| ch.is_ascii_alphanumeric()),
                "{c:?}"
            );
        }
    }

    #[test]
    fn a_retry_waits_the_back_off_but_never_past_the_errors_bound() {
        use std::time::Duration;
        struct Bounded(Option<Duration>);
        impl Categorized for Bounded {
            fn category(&self) -> Category {
                Category::Rejected
            }
            fn retry_within(&self) -> Option<Duration> {
                self.0
            }
        }
        let s = Duration::from_secs;
        assert_eq!(retry_delay(s(16), &Bounded(None)), s(16), "no bound");
        assert_eq!(
            retry_delay(s(16), &Bounded(Some(s(3)))),
            s(3),
            "bound first"
        );
        assert_eq!(
            retry_delay(s(2), &Bounded(Some(s(3)))),
            s(2),
            "back-off first"
        );
    }

    #[derive(Debug, thiserror::Error)]
    enum OperatorError {
        #[error(transparent)]
        Failure(ReconcileFailure),
    }
    crate::reconcile_failures!(OperatorError::Failure, status of k8s_openapi::api::core::v1::ConfigMap);

    impl Categorized for OperatorError {
        fn category(&self) -> Category {
            match self {
                OperatorError::Failure(e) => e.category(),
            }
        }
    }

    #[test]
    fn the_shared_failures_name_the_kind_and_keep_their_category() {
        let unnamespaced = k8s_openapi::api::core::v1::ConfigMap {
            metadata: kube::api::ObjectMeta {
                name: Some("routes".into()),
                ..Default::default()
            },
            ..Default::default()
        };
        let e: OperatorError = ReconcileFailure::namespace_of(&unnamespaced)
            .unwrap_err()
            .into();
        assert_eq!(
            e.to_string(),
            "ConfigMap routes has no metadata.namespace; it cannot be written back"
        );
        assert_eq!(e.category(), Category::Internal);

        let stale: OperatorError = crate::write::WriteError::Stale {
            kind: "ConfigMap".into(),
            name: "shop/routes".into(),
            resource_version: "7".into(),
        }
        .into();
        assert_eq!(
            stale.to_string(),
            "writing ConfigMap status: ConfigMap shop/routes: resourceVersion 7 is stale (409 \
             Conflict); the object changed since it was read, re-read it and decide again"
        );
        assert_eq!(stale.category(), Category::Conflict);

        let lost: OperatorError = crate::leader::NotLeader.into();
        assert_eq!(lost.category(), Category::Conflict);
        assert_eq!(lost.to_string(), crate::leader::NotLeader.to_string());
    }

    #[test]
    fn only_retryable_categories_are_transient() {
        assert!(Category::Conflict.is_transient());
        assert!(Category::ApiUnavailable.is_transient());
        assert!(!Category::InvalidSpec.is_transient());
        assert!(!Category::Forbidden.is_transient());
        assert!(!Category::Rejected.is_transient());
    }
}
