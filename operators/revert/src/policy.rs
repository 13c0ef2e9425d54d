//! Which signers a BundlePin trusts: its spec, its keys and the installed trusted root turned
//! into the bundle crate's verification [`Policy`] (pure, no I/O).
//!
//! Owns the binding between a pin and the signatures it accepts: a key of its
//! `publicKeysSecretRef`, or a keyless certificate that chains to revert's trusted root
//! (`--trusted-root`) and whose identity and OIDC issuer match one of `spec.keyless.identities`;
//! with `spec.requireSignedRepository`, a legacy signature must also name the pin's repository.
//! It must never widen that set: no keyless policy means no keyless signer, whatever the trusted
//! root holds.

use sluice_api::v1alpha1::bundle_pin::{BundlePinSpec, reasons};
use sluice_bundle::{BundleRef, Identity, Keyless, Matcher, Policy, PublicKey, TrustedRoot};

/// Why no policy could be built: the condition reason and the message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PolicyError {
    /// `Refused` (the spec must change) or not (revert's install must).
    pub refused: bool,
    /// Condition reason.
    pub reason: &'static str,
    /// What to do.
    pub message: String,
}

/// The policy of `spec` with `keys`; `trusted_root` is revert's trusted root file (its bytes and
/// path), `None` when revert runs without one.
pub fn signature_policy(
    spec: &BundlePinSpec,
    keys: Vec<PublicKey>,
    trusted_root: Option<(&[u8], &str)>,
) -> Result<Policy, PolicyError> {
    let repository = if spec.require_signed_repository {
        let parsed = BundleRef::parse(&spec.bundle.reference()).map_err(|e| PolicyError {
            refused: true,
            reason: reasons::INVALID_SPEC,
            message: format!("spec.bundle: {e}"),
        })?;
        Some(parsed.repository_ref())
    } else {
        None
    };
    let keyless = match &spec.keyless {
        None => None,
        Some(policy) => {
            let Some((bytes, path)) = trusted_root else {
                return Err(PolicyError {
                    refused: false,
                    reason: reasons::KEYS_MISSING,
                    message: "spec.keyless names keyless signers, but revert runs without a \
                              trusted root (--trusted-root; chart value revert.trustedRoot)"
                        .into(),
                });
            };
            let trusted_root = TrustedRoot::from_json(bytes, path).map_err(|e| PolicyError {
                refused: false,
                reason: reasons::KEYS_MISSING,
                message: e.to_string(),
            })?;
            let mut identities = Vec::new();
            for (i, id) in policy.identities.iter().enumerate() {
                let at = format!("spec.keyless.identities[{i}]");
                let matcher = |exact: &Option<String>, pattern: &Option<String>, what: &str| match (
                    exact, pattern,
                ) {
                    (Some(e), None) => Ok(Matcher::Exact(e.clone())),
                    (None, Some(p)) => {
                        Matcher::regex(p, &format!("{at}.{what}RegExp")).map_err(|e| e.to_string())
                    }
                    _ => Err(format!("{at}: give exactly one of {what} or {what}RegExp")),
                };
                let invalid = |message: String| PolicyError {
                    refused: true,
                    reason: reasons::INVALID_SPEC,
                    message,
                };
                identities.push(Identity {
                    subject: matcher(&id.subject, &id.subject_reg_exp, "subject")
                        .map_err(invalid)?,
                    issuer: matcher(&id.issuer, &id.issuer_reg_exp, "issuer").map_err(invalid)?,
                });
            }
            Some(Keyless {
                trusted_root,
                identities,
            })
        }
    };
    Ok(Policy {
        keys,
        keyless,
        repository,
    })
}

/// What of the spec's policy a cached verification depends on (besides the bundle and keys).
pub fn cache_key(spec: &BundlePinSpec) -> String {
    format!(
        "keyless={}|repo={}",
        serde_json::to_string(&spec.keyless).unwrap_or_default(),
        spec.require_signed_repository
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(patch: serde_json::Value) -> BundlePinSpec {
        let mut v = serde_json::json!({
            "targets": [{"name": "mesh"}],
            "bundle": {"repository": "oci://registry.example/mesh", "digest": format!("sha256:{}", "a".repeat(64))},
            "publicKeysSecretRef": {"name": "cosign"},
            "reason": "r",
        });
        for (k, val) in patch.as_object().unwrap() {
            v[k] = val.clone();
        }
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn no_keyless_spec_means_no_keyless_signer_even_with_a_trusted_root() {
        let p = signature_policy(&spec(serde_json::json!({})), vec![], Some((b"{}", "x"))).unwrap();
        assert!(p.keyless.is_none());
        assert!(p.repository.is_none());
    }

    #[test]
    fn keyless_needs_a_trusted_root_and_valid_expressions() {
        let keyless = spec(serde_json::json!({"keyless": {"identities": [
            {"subjectRegExp": "(", "issuer": "https://issuer.example"}
        ]}}));
        let err = signature_policy(&keyless, vec![], None).unwrap_err();
        assert!(!err.refused);
        assert!(err.message.contains("--trusted-root"), "{}", err.message);
        let err =
            signature_policy(&keyless, vec![], Some((b"not json", "/etc/root.json"))).unwrap_err();
        assert!(err.message.contains("/etc/root.json"), "{}", err.message);
    }

    #[test]
    fn the_repository_is_bound_when_asked() {
        let p = signature_policy(
            &spec(serde_json::json!({"requireSignedRepository": true})),
            vec![],
            None,
        )
        .unwrap();
        assert_eq!(p.repository.as_deref(), Some("registry.example/mesh"));
        assert_ne!(
            cache_key(&spec(serde_json::json!({"requireSignedRepository": true}))),
            cache_key(&spec(serde_json::json!({})))
        );
    }
}
