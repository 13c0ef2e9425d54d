//! The one error type of the bundle crate.
//!
//! Owns the classification of every failure into a bounded [`BundleError::category`] (a metric
//! label and an Event reason for the operators) and the wording of each message: what was wrong,
//! where, and what to do. It must never put a payload (a digest, a path) into a category, and
//! never carry key material in a message.

use std::path::PathBuf;

/// Everything that can go wrong while rendering, pushing, signing, verifying or inspecting a
/// bundle.
#[derive(Debug, thiserror::Error, strum::IntoStaticStr)]
pub enum BundleError {
    /// The manifests directory (or a bundle's layer) holds something that is not a valid set of
    /// Kubernetes objects.
    #[error("invalid manifests in {location}: {reason}")]
    InvalidManifests {
        /// File (or archive entry) where the problem is.
        location: String,
        /// What is wrong and what to do about it.
        reason: String,
    },
    /// A stored artifact is not a sluice bundle (wrong media types, layer count, annotations).
    #[error("{reference} is not a sluice bundle: {reason}")]
    NotABundle {
        /// The reference or path that was read.
        reference: String,
        /// What does not match the bundle layout.
        reason: String,
    },
    /// A reference names a tag (or nothing) where a digest is required.
    #[error(
        "{reference} does not name a manifest digest: signatures are checked on a digest, never a tag; \
         use <repository>@sha256:<hex> (`kubectl sluice bundle inspect` prints it)"
    )]
    DigestRequired {
        /// The reference as given.
        reference: String,
    },
    /// A reference or digest could not be parsed.
    #[error("cannot parse {what} {value:?}: {reason}")]
    InvalidReference {
        /// What was being parsed ("reference", "digest").
        what: &'static str,
        /// The input.
        value: String,
        /// The parser's complaint.
        reason: String,
    },
    /// Content does not hash to the digest that names it.
    #[error("digest mismatch for {subject}: expected {expected}, got {actual}")]
    DigestMismatch {
        /// What was hashed (a manifest, a layer, a content digest annotation).
        subject: String,
        /// The digest that was expected.
        expected: String,
        /// The digest that was computed.
        actual: String,
    },
    /// No cosign signature exists for the digest.
    #[error(
        "{reference} is unsigned: no cosign signature at {signature_tag}; sign it with \
         `kubectl sluice bundle sign` (or cosign, see the crate docs) before pinning it"
    )]
    Unsigned {
        /// The digest reference that was checked.
        reference: String,
        /// The cosign tag that was looked up.
        signature_tag: String,
    },
    /// Signatures exist, but none verifies with any of the given public keys.
    #[error(
        "{reference}: none of its {signatures} signature(s) verifies with the given public key(s) [{keys}]; \
         it was signed with another key or its signature payload was altered; check which key signed it"
    )]
    WrongKey {
        /// The digest reference that was checked.
        reference: String,
        /// How many signatures were found.
        signatures: usize,
        /// Fingerprints of the keys tried.
        keys: String,
    },
    /// A valid signature exists at this digest's signature tag, but it signs another digest.
    #[error(
        "{reference}: the signature stored for it is valid but signs {signed_digest}, not this digest; the \
         signature tag was tampered with or copied from another bundle; re-sign the intended digest"
    )]
    Tampered {
        /// The digest reference that was checked.
        reference: String,
        /// The digest the signature payload actually names.
        signed_digest: String,
    },
    /// An authentic signature exists, but its signer is not one the policy names (a keyless
    /// identity or issuer not listed, a certificate that does not chain to the trusted root, log
    /// evidence that does not verify, a signature made for another repository).
    #[error(
        "{reference}: no signature by a signer the pin trusts [{signers}]: {reason}; sign with a \
         trusted key or identity, or add this signer to the pin's policy if it is meant to be trusted"
    )]
    UntrustedSignature {
        /// The digest reference that was checked.
        reference: String,
        /// Why each authentic signature was refused.
        reason: String,
        /// The signers the policy names.
        signers: String,
    },
    /// A key file could not be read, decrypted or parsed.
    #[error("key {location}: {reason}")]
    Key {
        /// Where the key came from (path or description).
        location: String,
        /// What went wrong and what to do.
        reason: String,
    },
    /// The registry could not be reached (connection refused, timeout, DNS).
    #[error(
        "registry {registry} unavailable while trying to {action}: {reason}; check the address and that it runs"
    )]
    RegistryUnavailable {
        /// `host:port`.
        registry: String,
        /// What was being attempted.
        action: String,
        /// Transport error.
        reason: String,
    },
    /// The manifest or blob does not exist in the registry.
    #[error("{reference} not found in the registry while trying to {action}")]
    NotFound {
        /// What was looked up.
        reference: String,
        /// What was being attempted.
        action: String,
    },
    /// The registry answered with an error (denied, invalid manifest, ...).
    #[error("registry refused to {action} {reference}: {reason}")]
    Registry {
        /// What was addressed.
        reference: String,
        /// What was being attempted.
        action: String,
        /// The registry's answer.
        reason: String,
    },
    /// The registry refused the credentials configured for it (or wants some and none are
    /// configured).
    #[error(
        "registry {registry} answered unauthorized (HTTP 401) while trying to {action} {reference}: \
         {reason}; check the credentials for {registry} in the registry config (revert's \
         revert.registry.credentialsSecret, or the plugin's --registry-config / ~/.docker/config.json)"
    )]
    Unauthorized {
        /// `host[:port]`.
        registry: String,
        /// What was addressed.
        reference: String,
        /// What was being attempted.
        action: String,
        /// Which credential was tried and what the registry said (never the credential).
        reason: String,
    },
    /// A registry config (Docker config JSON) or CA bundle is unusable.
    #[error("registry config {source_name}: {reason}")]
    Credentials {
        /// Where it came from (a path, `Secret namespace/name`).
        source_name: String,
        /// What is wrong.
        reason: String,
    },
    /// A Docker credential helper named by the registry config was refused, missing, failed,
    /// took too long or answered something unusable.
    #[error("credential helper {helper} for registry {registry}: {reason}")]
    CredentialHelper {
        /// The program (`docker-credential-<name>`), or the refused name, quoted.
        helper: String,
        /// `host[:port]` it was asked about.
        registry: String,
        /// What went wrong and what to do (never the secret).
        reason: String,
    },
    /// The registry is not one the platform lets bundles come from.
    #[error(
        "registry {registry} is not allowed: bundles may come only from {allowed}; push the bundle \
         to an allowed registry or ask the platform to add this one to revert.allowedRegistries"
    )]
    RegistryNotAllowed {
        /// `host[:port]` that was named.
        registry: String,
        /// The allowlist, comma-separated.
        allowed: String,
    },
    /// The registry sent more bytes than the object may have (its declared size, or the cap).
    #[error(
        "{subject}: the registry sent more than {limit} bytes (declared or allowed); the download \
         was stopped"
    )]
    TooLarge {
        /// What was downloaded.
        subject: String,
        /// The limit in bytes.
        limit: u64,
    },
    /// Local file I/O failed.
    #[error("{action} {path}: {source}")]
    Io {
        /// What was being done ("reading", "writing", ...).
        action: &'static str,
        /// The path.
        path: PathBuf,
        /// The underlying error.
        source: std::io::Error,
    },
}

/// Why a bundle is refused for good (see [`BundleError::refusal`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// No signature at all.
    Unsigned,
    /// Signed, but with none of the trusted keys.
    WrongKey,
    /// Signed keylessly by an identity or issuer the policy does not trust.
    UntrustedSigner,
    /// The content is not what was signed, or not a valid bundle, or too large to be one.
    Tampered,
    /// The reference names a registry the policy does not allow.
    RegistryNotAllowed,
}

impl BundleError {
    /// Bounded category of this error: a metric label and an Event reason, never a payload.
    pub fn category(&self) -> &'static str {
        self.into()
    }

    /// Why the bundle is refused for good, if this error says so: a changed input (a signature,
    /// a key, the content, the reference) is needed, never a retry. `None` for failures a retry
    /// or a fixed registry may cure.
    pub fn refusal(&self) -> Option<Refusal> {
        Some(match self {
            BundleError::Unsigned { .. } => Refusal::Unsigned,
            BundleError::WrongKey { .. } => Refusal::WrongKey,
            BundleError::UntrustedSignature { .. } => Refusal::UntrustedSigner,
            BundleError::Tampered { .. }
            | BundleError::DigestMismatch { .. }
            | BundleError::NotABundle { .. }
            | BundleError::InvalidManifests { .. }
            | BundleError::DigestRequired { .. }
            | BundleError::InvalidReference { .. }
            | BundleError::TooLarge { .. } => Refusal::Tampered,
            BundleError::RegistryNotAllowed { .. } => Refusal::RegistryNotAllowed,
            BundleError::Key { .. }
            | BundleError::RegistryUnavailable { .. }
            | BundleError::NotFound { .. }
            | BundleError::Registry { .. }
            | BundleError::Io { .. }
            | BundleError::Unauthorized { .. }
            | BundleError::Credentials { .. }
            | BundleError::CredentialHelper { .. } => return None,
        })
    }

    /// Whether retrying the same call later may succeed (the registry was unreachable or
    /// answered with a server error); everything else needs a change of input.
    pub fn is_transient(&self) -> bool {
        matches!(self, BundleError::RegistryUnavailable { .. })
    }

    pub(crate) fn invalid(location: impl Into<String>, reason: impl Into<String>) -> Self {
        BundleError::InvalidManifests {
            location: location.into(),
            reason: reason.into(),
        }
    }

    pub(crate) fn not_a_bundle(reference: impl Into<String>, reason: impl Into<String>) -> Self {
        BundleError::NotABundle {
            reference: reference.into(),
            reason: reason.into(),
        }
    }

    pub(crate) fn io(
        action: &'static str,
        path: impl Into<PathBuf>,
        source: std::io::Error,
    ) -> Self {
        BundleError::Io {
            action,
            path: path.into(),
            source,
        }
    }
}

/// Result alias of the crate.
pub type Result<T, E = BundleError> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn categories_are_bounded_and_carry_no_payload() {
        let payload = "sha256:0123456789abcdef";
        let errors = [
            BundleError::invalid(payload, payload),
            BundleError::not_a_bundle(payload, payload),
            BundleError::DigestRequired {
                reference: payload.into(),
            },
            BundleError::DigestMismatch {
                subject: payload.into(),
                expected: payload.into(),
                actual: payload.into(),
            },
            BundleError::Unsigned {
                reference: payload.into(),
                signature_tag: payload.into(),
            },
            BundleError::WrongKey {
                reference: payload.into(),
                signatures: 1,
                keys: payload.into(),
            },
            BundleError::Tampered {
                reference: payload.into(),
                signed_digest: payload.into(),
            },
            BundleError::RegistryUnavailable {
                registry: payload.into(),
                action: payload.into(),
                reason: payload.into(),
            },
        ];
        let mut seen = std::collections::BTreeSet::new();
        for err in &errors {
            let category = err.category();
            assert!(!category.contains(payload), "{category}");
            assert!(
                category.chars().all(|c| c.is_ascii_alphabetic()),
                "category {category} must be a CamelCase word"
            );
            assert!(seen.insert(category), "duplicate category {category}");
            assert!(
                err.to_string().contains(payload),
                "message names the subject: {err}"
            );
        }
        assert!(errors[7].is_transient());
        assert!(!errors[6].is_transient());
    }
}
