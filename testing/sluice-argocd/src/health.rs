//! Built-in health checks, as Argo CD's gitops-engine assesses them: Deployment, StatefulSet,
//! DaemonSet, ReplicaSet (rollout progress and availability), Pod (phase and readiness),
//! PersistentVolumeClaim (bound), and Argo CD's aggregation order. Every other kind has no health
//! of its own (it does not lower the Application's health). Pure: it must never do I/O.

use serde_json::Value;

/// Health status names as Argo CD writes them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum HealthStatus {
    /// Healthy.
    Healthy,
    /// Suspended (paused).
    Suspended,
    /// Progressing.
    Progressing,
    /// Missing (desired but absent).
    Missing,
    /// Degraded.
    Degraded,
    /// Unknown.
    Unknown,
}

impl HealthStatus {
    /// The status string.
    pub fn as_str(self) -> &'static str {
        match self {
            HealthStatus::Healthy => "Healthy",
            HealthStatus::Suspended => "Suspended",
            HealthStatus::Progressing => "Progressing",
            HealthStatus::Missing => "Missing",
            HealthStatus::Degraded => "Degraded",
            HealthStatus::Unknown => "Unknown",
        }
    }
}

/// A resource's health with its message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Health {
    /// Status.
    pub status: HealthStatus,
    /// Why, when not plainly healthy.
    pub message: String,
}

impl Health {
    fn new(status: HealthStatus, message: impl Into<String>) -> Self {
        Health {
            status,
            message: message.into(),
        }
    }
}

fn int(obj: &Value, pointer: &str) -> Option<i64> {
    obj.pointer(pointer).and_then(Value::as_i64)
}

/// The health of a live object, or `None` for kinds without a health check.
pub fn assess(group: &str, kind: &str, obj: &Value) -> Option<Health> {
    match (group, kind) {
        ("apps", "Deployment") => Some(deployment(obj)),
        ("apps", "StatefulSet") | ("apps", "ReplicaSet") | ("apps", "DaemonSet") => {
            Some(replicated(kind, obj))
        }
        ("", "Pod") => Some(pod(obj)),
        ("", "PersistentVolumeClaim") => {
            Some(match obj.pointer("/status/phase").and_then(Value::as_str) {
                Some("Bound") => Health::new(HealthStatus::Healthy, ""),
                Some("Lost") => Health::new(HealthStatus::Degraded, "claim lost"),
                _ => Health::new(
                    HealthStatus::Progressing,
                    "waiting for the claim to be bound",
                ),
            })
        }
        _ => None,
    }
}

fn generation_observed(obj: &Value) -> bool {
    let generation = int(obj, "/metadata/generation").unwrap_or(0);
    int(obj, "/status/observedGeneration").unwrap_or(0) >= generation
}

fn deployment(obj: &Value) -> Health {
    if obj.pointer("/spec/paused").and_then(Value::as_bool) == Some(true) {
        return Health::new(HealthStatus::Suspended, "Deployment is paused");
    }
    if !generation_observed(obj) {
        return Health::new(
            HealthStatus::Progressing,
            "Waiting for rollout to finish: observed deployment generation less than desired generation",
        );
    }
    let conditions = obj
        .pointer("/status/conditions")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    if conditions.iter().any(|c| {
        c.get("type").and_then(Value::as_str) == Some("Progressing")
            && c.get("reason").and_then(Value::as_str) == Some("ProgressDeadlineExceeded")
    }) {
        return Health::new(
            HealthStatus::Degraded,
            format!(
                "Deployment {:?} exceeded its progress deadline",
                obj.pointer("/metadata/name")
                    .and_then(Value::as_str)
                    .unwrap_or("")
            ),
        );
    }
    let replicas = int(obj, "/spec/replicas").unwrap_or(1);
    let updated = int(obj, "/status/updatedReplicas").unwrap_or(0);
    let total = int(obj, "/status/replicas").unwrap_or(0);
    let available = int(obj, "/status/availableReplicas").unwrap_or(0);
    if updated < replicas {
        return Health::new(
            HealthStatus::Progressing,
            format!(
                "Waiting for rollout to finish: {updated} out of {replicas} new replicas have been updated..."
            ),
        );
    }
    if total > updated {
        return Health::new(
            HealthStatus::Progressing,
            format!(
                "Waiting for rollout to finish: {} old replicas are pending termination...",
                total - updated
            ),
        );
    }
    if available < updated {
        return Health::new(
            HealthStatus::Progressing,
            format!(
                "Waiting for rollout to finish: {available} of {updated} updated replicas are available..."
            ),
        );
    }
    Health::new(HealthStatus::Healthy, "")
}

fn replicated(kind: &str, obj: &Value) -> Health {
    if !generation_observed(obj) {
        return Health::new(
            HealthStatus::Progressing,
            format!("Waiting for {kind} spec update to be observed..."),
        );
    }
    let (want, ready) = if kind == "DaemonSet" {
        (
            int(obj, "/status/desiredNumberScheduled").unwrap_or(0),
            int(obj, "/status/numberAvailable").unwrap_or(0),
        )
    } else {
        (
            int(obj, "/spec/replicas").unwrap_or(1),
            int(obj, "/status/readyReplicas").unwrap_or(0),
        )
    };
    if ready < want {
        return Health::new(
            HealthStatus::Progressing,
            format!("Waiting for {kind} to be ready: {ready} of {want} pods ready..."),
        );
    }
    Health::new(HealthStatus::Healthy, "")
}

fn pod(obj: &Value) -> Health {
    match obj.pointer("/status/phase").and_then(Value::as_str) {
        Some("Succeeded") => Health::new(HealthStatus::Healthy, ""),
        Some("Failed") => Health::new(HealthStatus::Degraded, "pod failed"),
        Some("Running") => {
            let ready = obj
                .pointer("/status/conditions")
                .and_then(Value::as_array)
                .is_some_and(|cs| {
                    cs.iter().any(|c| {
                        c.get("type").and_then(Value::as_str) == Some("Ready")
                            && c.get("status").and_then(Value::as_str) == Some("True")
                    })
                });
            if ready {
                Health::new(HealthStatus::Healthy, "")
            } else {
                Health::new(HealthStatus::Progressing, "pod is running but not ready")
            }
        }
        _ => Health::new(HealthStatus::Progressing, "pod is pending"),
    }
}

/// The Application's health: the worst of its resources' (Healthy when none has a health).
pub fn aggregate<'a>(healths: impl IntoIterator<Item = &'a HealthStatus>) -> HealthStatus {
    healths
        .into_iter()
        .copied()
        .filter(|h| *h != HealthStatus::Unknown)
        .max()
        .unwrap_or(HealthStatus::Healthy)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn deployment_table() {
        let cases = [
            (
                json!({"metadata": {"generation": 2}, "spec": {"replicas": 2}, "status": {"observedGeneration": 1}}),
                HealthStatus::Progressing,
            ),
            (
                json!({"metadata": {"generation": 1}, "spec": {"replicas": 2}, "status": {"observedGeneration": 1, "updatedReplicas": 2, "replicas": 2, "availableReplicas": 1}}),
                HealthStatus::Progressing,
            ),
            (
                json!({"metadata": {"generation": 1}, "spec": {"replicas": 2}, "status": {"observedGeneration": 1, "updatedReplicas": 2, "replicas": 3, "availableReplicas": 2}}),
                HealthStatus::Progressing,
            ),
            (
                json!({"metadata": {"generation": 1}, "spec": {"replicas": 2}, "status": {"observedGeneration": 1, "updatedReplicas": 2, "replicas": 2, "availableReplicas": 2}}),
                HealthStatus::Healthy,
            ),
            (
                json!({"metadata": {"generation": 1}, "spec": {"replicas": 2}, "status": {"observedGeneration": 1, "conditions": [{"type": "Progressing", "reason": "ProgressDeadlineExceeded"}]}}),
                HealthStatus::Degraded,
            ),
            (
                json!({"metadata": {"generation": 1}, "spec": {"paused": true}}),
                HealthStatus::Suspended,
            ),
            (
                json!({"metadata": {"generation": 1}, "spec": {"replicas": 1}}),
                HealthStatus::Progressing,
            ),
        ];
        for (obj, want) in cases {
            assert_eq!(
                assess("apps", "Deployment", &obj).unwrap().status,
                want,
                "{obj}"
            );
        }
    }

    #[test]
    fn kinds_without_checks_have_no_health() {
        assert_eq!(assess("", "ConfigMap", &json!({})), None);
        assert_eq!(
            assess("gateway.networking.k8s.io", "HTTPRoute", &json!({})),
            None
        );
    }

    #[test]
    fn pods_and_aggregation() {
        let ready = json!({"status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}});
        assert_eq!(
            assess("", "Pod", &ready).unwrap().status,
            HealthStatus::Healthy
        );
        assert_eq!(
            assess("", "Pod", &json!({"status": {"phase": "Failed"}}))
                .unwrap()
                .status,
            HealthStatus::Degraded
        );
        assert_eq!(aggregate(&[]), HealthStatus::Healthy);
        assert_eq!(
            aggregate(&[
                HealthStatus::Healthy,
                HealthStatus::Missing,
                HealthStatus::Progressing
            ]),
            HealthStatus::Missing
        );
        assert_eq!(
            aggregate(&[HealthStatus::Degraded, HealthStatus::Missing]),
            HealthStatus::Degraded
        );
    }
}
