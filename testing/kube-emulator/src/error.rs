//! API errors and their `Status` rendering, worded as kube-apiserver words them.
//!
//! Owns the mapping from an error to an HTTP code, a `reason` and a `message`. Never decides
//! whether a request fails; callers do.

use serde_json::{Value, json};

/// An error answered to a client as a `metav1.Status`; the variant's name is its `reason`.
#[derive(Debug, Clone, thiserror::Error, strum::IntoStaticStr)]
pub enum ApiError {
    /// 404: the object or resource does not exist.
    #[error("{message}")]
    NotFound {
        /// Full message.
        message: String,
        /// `details` of the Status.
        details: Value,
    },
    /// 409 AlreadyExists.
    #[error("{message}")]
    AlreadyExists {
        /// Full message.
        message: String,
        /// `details` of the Status.
        details: Value,
    },
    /// 409 Conflict (stale resourceVersion, apply conflicts).
    #[error("{message}")]
    Conflict {
        /// Full message.
        message: String,
        /// `details` of the Status.
        details: Value,
    },
    /// 422 Invalid.
    #[error("{message}")]
    Invalid {
        /// Full message.
        message: String,
        /// `details` of the Status.
        details: Value,
    },
    /// 400 BadRequest.
    #[error("{0}")]
    BadRequest(String),
    /// 401 Unauthorized.
    #[error("Unauthorized")]
    Unauthorized,
    /// 403 Forbidden.
    #[error("{message}")]
    Forbidden {
        /// Full message.
        message: String,
        /// `details` of the Status.
        details: Value,
    },
    /// 405 MethodNotAllowed.
    #[error("{0}")]
    MethodNotAllowed(String),
    /// 410 Expired / Gone.
    #[error("{0}")]
    #[strum(serialize = "Expired")]
    Gone(String),
    /// 415 UnsupportedMediaType.
    #[error("{0}")]
    UnsupportedMediaType(String),
    /// 429 TooManyRequests (eviction refused by a disruption budget).
    #[error("{message}")]
    TooManyRequests {
        /// Full message.
        message: String,
        /// `details` of the Status.
        details: Value,
    },
    /// 500 InternalError: the emulator could not do what the request needs.
    #[error("{0}")]
    #[strum(serialize = "InternalError")]
    Internal(String),
    /// A complete Status built elsewhere (validation, RBAC, admission).
    #[error("{}", .0.get("message").and_then(Value::as_str).unwrap_or_default())]
    Status(Box<Value>),
}

fn details(qualified: &str, name: &str) -> Value {
    let (resource, group) = qualified.split_once('.').unwrap_or((qualified, ""));
    let mut d = json!({"name": name, "kind": resource});
    if !group.is_empty() {
        d["group"] = json!(group);
    }
    d
}

impl ApiError {
    /// `<qualified> "<name>" not found`.
    pub fn not_found(qualified: &str, name: &str) -> Self {
        ApiError::NotFound {
            message: format!("{qualified} \"{name}\" not found"),
            details: details(qualified, name),
        }
    }

    /// `<qualified> "<name>" already exists`.
    pub fn already_exists(qualified: &str, name: &str) -> Self {
        ApiError::AlreadyExists {
            message: format!("{qualified} \"{name}\" already exists"),
            details: details(qualified, name),
        }
    }

    /// The stale-resourceVersion conflict.
    pub fn stale(qualified: &str, name: &str) -> Self {
        ApiError::Conflict {
            message: format!(
                "Operation cannot be fulfilled on {qualified} \"{name}\": the object has been modified; please apply your changes to the latest version and try again"
            ),
            details: details(qualified, name),
        }
    }

    /// `<Kind>.<group> "<name>" is invalid: <causes>` with field causes `(field, message)`.
    pub fn invalid(kind_group: &str, name: &str, causes: &[(String, String)]) -> Self {
        let (kind, group) = kind_group.split_once('.').unwrap_or((kind_group, ""));
        let rendered: Vec<String> = causes
            .iter()
            .map(|(f, m)| {
                if f.is_empty() {
                    m.clone()
                } else {
                    format!("{f}: {m}")
                }
            })
            .collect();
        let message = if rendered.len() == 1 {
            format!("{kind_group} \"{name}\" is invalid: {}", rendered[0])
        } else {
            format!(
                "{kind_group} \"{name}\" is invalid: [{}]",
                rendered.join(", ")
            )
        };
        let mut d = json!({
            "name": name,
            "kind": kind,
            "causes": causes.iter().map(|(f, m)| json!({"reason": "FieldValueInvalid", "message": m, "field": f})).collect::<Vec<_>>(),
        });
        if !group.is_empty() {
            d["group"] = json!(group);
        }
        ApiError::Invalid {
            message,
            details: d,
        }
    }

    /// Wraps a complete `Status` object.
    pub fn from_status(status: Value) -> Self {
        ApiError::Status(Box::new(status))
    }

    /// HTTP status code.
    pub fn code(&self) -> u16 {
        match self {
            ApiError::Status(s) => s.get("code").and_then(Value::as_u64).unwrap_or(500) as u16,
            ApiError::NotFound { .. } => 404,
            ApiError::AlreadyExists { .. } | ApiError::Conflict { .. } => 409,
            ApiError::Invalid { .. } => 422,
            ApiError::BadRequest(_) => 400,
            ApiError::Unauthorized => 401,
            ApiError::Forbidden { .. } => 403,
            ApiError::MethodNotAllowed(_) => 405,
            ApiError::Gone(_) => 410,
            ApiError::UnsupportedMediaType(_) => 415,
            ApiError::TooManyRequests { .. } => 429,
            ApiError::Internal(_) => 500,
        }
    }

    /// The Status `reason`; also the bounded category for logs and metrics. A Status built
    /// elsewhere keeps the reasons the emulator answers with, any other is an `InternalError`.
    pub fn category(&self) -> &'static str {
        match self {
            ApiError::Status(s) => match s.get("reason").and_then(Value::as_str) {
                Some("Invalid") => "Invalid",
                Some("Forbidden") => "Forbidden",
                Some("NotFound") => "NotFound",
                Some("Conflict") => "Conflict",
                Some("BadRequest") => "BadRequest",
                _ => "InternalError",
            },
            other => other.into(),
        }
    }

    /// The `metav1.Status` body.
    pub fn status(&self) -> Value {
        if let ApiError::Status(s) = self {
            return (**s).clone();
        }
        let mut s = json!({
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.to_string(),
            "reason": self.category(),
            "code": self.code(),
        });
        match self {
            ApiError::NotFound { details, .. }
            | ApiError::AlreadyExists { details, .. }
            | ApiError::Conflict { details, .. }
            | ApiError::Invalid { details, .. }
            | ApiError::Forbidden { details, .. }
            | ApiError::TooManyRequests { details, .. } => s["details"] = details.clone(),
            _ => {}
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_error_has_its_status_reason() {
        let message = String::new;
        let details = || json!({});
        let cases = [
            (
                ApiError::NotFound {
                    message: message(),
                    details: details(),
                },
                "NotFound",
            ),
            (
                ApiError::AlreadyExists {
                    message: message(),
                    details: details(),
                },
                "AlreadyExists",
            ),
            (
                ApiError::Conflict {
                    message: message(),
                    details: details(),
                },
                "Conflict",
            ),
            (
                ApiError::Invalid {
                    message: message(),
                    details: details(),
                },
                "Invalid",
            ),
            (ApiError::BadRequest(message()), "BadRequest"),
            (ApiError::Unauthorized, "Unauthorized"),
            (
                ApiError::Forbidden {
                    message: message(),
                    details: details(),
                },
                "Forbidden",
            ),
            (ApiError::MethodNotAllowed(message()), "MethodNotAllowed"),
            (ApiError::Gone(message()), "Expired"),
            (
                ApiError::UnsupportedMediaType(message()),
                "UnsupportedMediaType",
            ),
            (
                ApiError::TooManyRequests {
                    message: message(),
                    details: details(),
                },
                "TooManyRequests",
            ),
            (ApiError::Internal(message()), "InternalError"),
            (
                ApiError::from_status(json!({"reason": "Invalid"})),
                "Invalid",
            ),
            (
                ApiError::from_status(json!({"reason": "Forbidden"})),
                "Forbidden",
            ),
            (
                ApiError::from_status(json!({"reason": "NotFound"})),
                "NotFound",
            ),
            (
                ApiError::from_status(json!({"reason": "Conflict"})),
                "Conflict",
            ),
            (
                ApiError::from_status(json!({"reason": "BadRequest"})),
                "BadRequest",
            ),
            (
                ApiError::from_status(json!({"reason": "Gone"})),
                "InternalError",
            ),
            (ApiError::from_status(json!({})), "InternalError"),
        ];
        for (err, want) in cases {
            assert_eq!(err.category(), want, "{err:?}");
        }
    }

    #[test]
    fn messages_match_apiserver_wording() {
        let cases = [
            (
                ApiError::not_found("rollouts.sluice.dev", "x"),
                404,
                "rollouts.sluice.dev \"x\" not found",
            ),
            (
                ApiError::already_exists("pods", "p"),
                409,
                "pods \"p\" already exists",
            ),
            (
                ApiError::stale("deployments.apps", "d"),
                409,
                "Operation cannot be fulfilled on deployments.apps \"d\": the object has been modified; please apply your changes to the latest version and try again",
            ),
            (
                ApiError::invalid(
                    "Rollout.sluice.dev",
                    "r",
                    &[("spec.x".into(), "Invalid value: 1: too big".into())],
                ),
                422,
                "Rollout.sluice.dev \"r\" is invalid: spec.x: Invalid value: 1: too big",
            ),
        ];
        for (e, code, msg) in cases {
            assert_eq!(e.code(), code);
            assert_eq!(e.status()["message"], msg);
            assert_eq!(e.status()["code"], code);
        }
        assert_eq!(
            ApiError::not_found("pods", "p").status()["details"],
            json!({"name":"p","kind":"pods"})
        );
        assert_eq!(
            ApiError::not_found("rollouts.sluice.dev", "x").status()["details"]["group"],
            json!("sluice.dev")
        );
    }
}
