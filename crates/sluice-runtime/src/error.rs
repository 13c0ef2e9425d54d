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

    #[test]
    fn only_retryable_categories_are_transient() {
        assert!(Category::Conflict.is_transient());
        assert!(Category::ApiUnavailable.is_transient());
        assert!(!Category::InvalidSpec.is_transient());
        assert!(!Category::Forbidden.is_transient());
        assert!(!Category::Rejected.is_transient());
    }
}
