//! Helpers the end-to-end tests drive a BundlePin with, as the sandbox scenario `pin-release`
//! does: build a BundlePin, create it and measure `pin_ms` (BundlePin created → every object
//! applied, signature verification included: the time to phase Pinned), then wait for its
//! release.
//!
//! Owns only driving a BundlePin through the API as a human would. Never touches Applications,
//! bundles or destination clusters; revert does that.
// Helpers for any end-to-end driver: a test uses the ones it needs (as in `support`).
#![allow(dead_code)]

use std::time::{Duration, Instant};

use kube::{Api, Client, api::PostParams};
use sluice_api::v1alpha1::{BundlePin, BundlePinPhase, BundlePinStatus};

/// How often the helpers read the BundlePin.
const POLL: Duration = Duration::from_millis(20);

/// Why a scenario step did not complete.
#[derive(Debug, thiserror::Error, strum::IntoStaticStr)]
pub enum ScenarioError {
    /// The API refused a read or write.
    #[error("BundlePin {namespace}/{name}: {source}")]
    Api {
        /// Namespace.
        namespace: String,
        /// Name.
        name: String,
        /// The API error.
        source: kube::Error,
    },
    /// The pin did not reach the phase within the budget.
    #[error(
        "BundlePin {namespace}/{name} did not reach {want:?} within {budget:?}; last phase {last:?}; check revert's logs and the pin's conditions"
    )]
    Timeout {
        /// Namespace.
        namespace: String,
        /// Name.
        name: String,
        /// The phase waited for.
        want: BundlePinPhase,
        /// The budget.
        budget: Duration,
        /// The last phase seen.
        last: Option<BundlePinPhase>,
    },
    /// The pin ended in another terminal phase (Refused, Failed).
    #[error("BundlePin {namespace}/{name} ended {phase:?} instead of {want:?}: {message}")]
    Ended {
        /// Namespace.
        namespace: String,
        /// Name.
        name: String,
        /// The phase it ended in.
        phase: BundlePinPhase,
        /// The phase waited for.
        want: BundlePinPhase,
        /// The conditions' messages.
        message: String,
    },
}

impl ScenarioError {
    /// Bounded category.
    pub fn category(&self) -> &'static str {
        self.into()
    }
}

/// What a human asks for in a pin.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PinRequest<'a> {
    /// Namespace of the BundlePin (beside Argo CD) and of the target Applications.
    pub namespace: &'a str,
    /// Name of the BundlePin.
    pub name: &'a str,
    /// Application names.
    pub targets: &'a [&'a str],
    /// Bundle repository (`host[:port]/path`, with or without `oci://`).
    pub repository: &'a str,
    /// Bundle manifest digest.
    pub digest: &'a str,
    /// Secret holding the cosign public keys.
    pub keys_secret: &'a str,
    /// Why.
    pub reason: &'a str,
    /// Commit to revert in Git, when a revert branch is wanted.
    pub git_commit: Option<&'a str>,
}

/// The BundlePin a human applies for `r`.
pub fn pin_object(r: &PinRequest<'_>) -> BundlePin {
    let PinRequest {
        namespace,
        name,
        targets,
        repository,
        digest,
        keys_secret,
        reason,
        git_commit,
    } = *r;
    let repository = if repository.starts_with("oci://") {
        repository.to_owned()
    } else {
        format!("oci://{repository}")
    };
    let mut spec = serde_json::json!({
        "targets": targets.iter().map(|t| serde_json::json!({"name": t})).collect::<Vec<_>>(),
        "bundle": {"repository": repository, "digest": digest},
        "publicKeysSecretRef": {"name": keys_secret},
        "reason": reason,
    });
    if let Some(commit) = git_commit {
        spec["gitRevert"] = serde_json::json!({"commit": commit});
    }
    serde_json::from_value(serde_json::json!({
        "apiVersion": "sluice.dev/v1alpha1",
        "kind": "BundlePin",
        "metadata": {"name": name, "namespace": namespace},
        "spec": spec,
    }))
    .expect("a BundlePin built from valid parts")
}

/// Creates `pin` and waits until it is Pinned; returns the status and `pin_ms` (creation →
/// Pinned, measured by the caller's clock).
pub async fn pin_and_wait(
    client: Client,
    pin: &BundlePin,
    budget: Duration,
) -> Result<(BundlePinStatus, u64), ScenarioError> {
    let namespace = pin.metadata.namespace.clone().unwrap_or_default();
    let name = pin.metadata.name.clone().unwrap_or_default();
    let api: Api<BundlePin> = Api::namespaced(client.clone(), &namespace);
    let started = Instant::now();
    api.create(&PostParams::default(), pin)
        .await
        .map_err(|source| ScenarioError::Api {
            namespace: namespace.clone(),
            name: name.clone(),
            source,
        })?;
    let status = wait_for(client, &namespace, &name, BundlePinPhase::Pinned, budget).await?;
    Ok((status, started.elapsed().as_millis() as u64))
}

/// Waits until the BundlePin reaches `want` (Pinned, Released, ...); a different terminal
/// phase fails at once.
pub async fn wait_for(
    client: Client,
    namespace: &str,
    name: &str,
    want: BundlePinPhase,
    budget: Duration,
) -> Result<BundlePinStatus, ScenarioError> {
    let api: Api<BundlePin> = Api::namespaced(client, namespace);
    let deadline = Instant::now() + budget;
    let mut last = None;
    loop {
        let pin = api.get(name).await.map_err(|source| ScenarioError::Api {
            namespace: namespace.into(),
            name: name.into(),
            source,
        })?;
        if let Some(status) = pin.status {
            last = Some(status.phase);
            if status.phase == want {
                return Ok(status);
            }
            let terminal = matches!(
                status.phase,
                BundlePinPhase::Refused | BundlePinPhase::Failed | BundlePinPhase::Released
            );
            if terminal {
                return Err(ScenarioError::Ended {
                    namespace: namespace.into(),
                    name: name.into(),
                    phase: status.phase,
                    want,
                    message: status
                        .conditions
                        .iter()
                        .map(|c| format!("{}={} {}: {}", c.type_, c.status, c.reason, c.message))
                        .collect::<Vec<_>>()
                        .join("; "),
                });
            }
        }
        if Instant::now() > deadline {
            return Err(ScenarioError::Timeout {
                namespace: namespace.into(),
                name: name.into(),
                want,
                budget,
                last,
            });
        }
        tokio::time::sleep(POLL).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pin_object_is_a_valid_pin() {
        let digest = format!("sha256:{}", "a".repeat(64));
        let table = [
            ("registry.local:5000/mesh/config", None),
            ("oci://registry.local:5000/mesh/config", Some("abcdef1")),
        ];
        for (repository, commit) in table {
            let pin = pin_object(&PinRequest {
                namespace: "argocd",
                name: "pin-release",
                targets: &["mesh-east-1"],
                repository,
                digest: &digest,
                keys_secret: "sluice-cosign-public-keys",
                reason: "bad change",
                git_commit: commit,
            });
            assert!(
                sluice_revert::validity::problems(&pin.spec).is_empty(),
                "{repository}: {:?}",
                sluice_revert::validity::problems(&pin.spec)
            );
            assert_eq!(
                pin.spec.bundle.repository,
                "oci://registry.local:5000/mesh/config"
            );
            assert_eq!(
                pin.spec.git_revert.as_ref().map(|g| g.commit.as_str()),
                commit
            );
        }
    }

    #[test]
    fn every_error_has_its_category() {
        let name = || "pin".to_owned();
        let cases = [
            (
                ScenarioError::Api {
                    namespace: name(),
                    name: name(),
                    source: kube::Error::LinesCodecMaxLineLengthExceeded,
                },
                "Api",
            ),
            (
                ScenarioError::Timeout {
                    namespace: name(),
                    name: name(),
                    want: BundlePinPhase::Pinned,
                    budget: Duration::from_secs(1),
                    last: None,
                },
                "Timeout",
            ),
            (
                ScenarioError::Ended {
                    namespace: name(),
                    name: name(),
                    phase: BundlePinPhase::Failed,
                    want: BundlePinPhase::Pinned,
                    message: String::new(),
                },
                "Ended",
            ),
        ];
        for (err, want) in cases {
            assert_eq!(err.category(), want, "{err:?}");
        }
    }
}
