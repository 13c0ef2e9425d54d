//! Verification of the pinned bundle, before anything is applied: the public keys from the pin's
//! Secret (and, for keyless signatures, the trusted root read at each verification), the
//! signature on the digest through the registry client, and every object of a kind both the
//! platform (`--allowed-kinds`) and the pin allow. Owns the cache of verified bundles (bounded by
//! `--verified-cache-bytes`, least recently used evicted first). Must never hand out objects that
//! did not verify in this process, and never decides: it reports a [`Verification`] that
//! [`crate::decide`] reads.

use std::{
    path::PathBuf,
    sync::{Arc, Mutex},
};

use k8s_openapi::api::core::v1::Secret;
use kube::{Api, Client};
use sluice_api::v1alpha1::{
    BundlePinSpec,
    bundle_pin::{GroupKind, reasons},
};
use sluice_bundle::{ByteLru, PublicKey, Refusal, VerifiedObjects};

use crate::{
    decide::{self, BundleSummary, ObjectKey, Verification},
    registry::Registries,
};

/// Default bound of the verified-bundle cache: 128 MiB, a quarter of revert's default memory
/// limit (512 MiB), leaving room for the bundle being verified and applied.
pub const DEFAULT_VERIFIED_CACHE_BYTES: u64 = 128 << 20;

/// What verifying a pin needs besides the cluster and the registries: the cache of verified
/// bundles, the platform's kinds and the trusted root for keyless signatures.
pub struct Verifier {
    verified: Mutex<ByteLru<VerifiedObjects>>,
    platform_kinds: Option<Vec<GroupKind>>,
    trusted_root: Option<PathBuf>,
}

sluice_runtime::opaque_debug!(Verifier);

impl Verifier {
    /// A verifier caching up to `cache_bytes` of verified bundles; `platform_kinds` `None`:
    /// the default mesh kinds; `trusted_root` `None`: keyless signatures are refused.
    pub fn new(
        cache_bytes: u64,
        platform_kinds: Option<Vec<GroupKind>>,
        trusted_root: Option<PathBuf>,
    ) -> Self {
        Self {
            verified: Mutex::new(ByteLru::new(cache_bytes)),
            platform_kinds,
            trusted_root,
        }
    }

    /// The kinds any pin may apply (`--allowed-kinds`); `None`: the default mesh kinds.
    pub fn platform_kinds(&self) -> Option<Vec<GroupKind>> {
        self.platform_kinds.clone()
    }

    /// Verifies the pinned bundle: keys from the Secret, signature on the digest, every object
    /// of an allowed kind.
    pub async fn verify(
        &self,
        client: &Client,
        bundles: &Registries,
        spec: &BundlePinSpec,
        ns: &str,
    ) -> (Verification, Option<Arc<VerifiedObjects>>) {
        let unavailable = |reason, message: String| {
            (
                Verification::Unavailable { reason, message },
                None::<Arc<VerifiedObjects>>,
            )
        };
        let secret_name = &spec.public_keys_secret_ref.name;
        let secrets: Api<Secret> = Api::namespaced(client.clone(), ns);
        let secret = match secrets.get_opt(secret_name).await {
            Ok(Some(s)) => s,
            Ok(None) => {
                return unavailable(
                    reasons::KEYS_MISSING,
                    format!(
                        "public keys Secret {ns}/{secret_name} (spec.publicKeysSecretRef) not found; create it with the cosign public key(s)"
                    ),
                );
            }
            Err(e) => {
                return unavailable(
                    reasons::KEYS_MISSING,
                    format!("reading public keys Secret {ns}/{secret_name}: {e}"),
                );
            }
        };
        let data = secret.data.unwrap_or_default();
        let wanted: Vec<String> = if spec.public_keys_secret_ref.keys.is_empty() {
            data.keys().cloned().collect()
        } else {
            spec.public_keys_secret_ref.keys.clone()
        };
        let mut keys = Vec::new();
        for k in &wanted {
            let Some(bytes) = data.get(k) else {
                return unavailable(
                    reasons::KEYS_MISSING,
                    format!("public keys Secret {ns}/{secret_name} has no key {k:?}"),
                );
            };
            match PublicKey::from_pem(&bytes.0, &format!("Secret {ns}/{secret_name} key {k}")) {
                Ok(key) => keys.push(key),
                Err(e) => return unavailable(reasons::KEYS_MISSING, e.to_string()),
            }
        }
        if keys.is_empty() && spec.keyless.is_none() {
            return unavailable(
                reasons::KEYS_MISSING,
                format!("public keys Secret {ns}/{secret_name} holds no key"),
            );
        }
        let mut fingerprints: Vec<&str> = keys.iter().map(PublicKey::fingerprint).collect();
        fingerprints.sort_unstable();
        let trusted_root = match (&spec.keyless, &self.trusted_root) {
            (Some(_), Some(path)) => match std::fs::read(path) {
                Ok(bytes) => Some((bytes, path.display().to_string())),
                Err(e) => {
                    return unavailable(
                        reasons::KEYS_MISSING,
                        format!("reading the trusted root {}: {e}", path.display()),
                    );
                }
            },
            _ => None,
        };
        let cache_key = format!(
            "{}|{}|{}|root={}",
            spec.bundle.reference(),
            fingerprints.join(","),
            crate::policy::cache_key(spec),
            trusted_root
                .as_ref()
                .map(|(b, _)| sluice_bundle::artifact::sha256_digest(b))
                .unwrap_or_default()
        );
        let policy = match crate::policy::signature_policy(
            spec,
            keys,
            trusted_root
                .as_ref()
                .map(|(b, p)| (b.as_slice(), p.as_str())),
        ) {
            Ok(p) => p,
            Err(e) if e.refused => {
                return (
                    Verification::Refused {
                        reason: e.reason,
                        message: e.message,
                    },
                    None,
                );
            }
            Err(e) => return unavailable(e.reason, e.message),
        };
        let cached = self.verified.lock().expect("cache lock").get(&cache_key);
        let bundle = match cached {
            Some(b) => b,
            None => match bundles
                .verify_and_pull_with(&spec.bundle.reference(), &policy)
                .await
            {
                Ok(b) => {
                    // Only what applying needs is kept: the objects, not the blobs and files.
                    let b = Arc::new(VerifiedObjects::from(b));
                    let bytes = b.memory_bytes();
                    let mut cache = self.verified.lock().expect("cache lock");
                    if !cache.insert(cache_key, b.clone(), bytes) {
                        tracing::warn!(
                            bytes,
                            "a verified bundle larger than --verified-cache-bytes is not cached; it is pulled again when needed"
                        );
                    }
                    b
                }
                Err(e) => {
                    return match e.refusal().map(refusal_reason) {
                        Some(reason) => (
                            Verification::Refused {
                                reason,
                                message: e.to_string(),
                            },
                            None,
                        ),
                        None => unavailable(reasons::BUNDLE_UNAVAILABLE, e.to_string()),
                    };
                }
            },
        };
        let platform = self
            .platform_kinds
            .clone()
            .unwrap_or_else(BundlePinSpec::default_allowed_kinds);
        let beyond: Vec<String> = spec
            .allowed_kinds
            .iter()
            .filter(|k| !platform.contains(k))
            .map(|k| format!("{}.{}", k.kind, k.group))
            .collect();
        if !beyond.is_empty() {
            return (
                Verification::Refused {
                    reason: reasons::DISALLOWED_KIND,
                    message: format!(
                        "spec.allowedKinds lists {} which the platform does not allow (revert's --allowed-kinds); a pin can only narrow the platform's kinds",
                        beyond.join(", ")
                    ),
                },
                None,
            );
        }
        let allowed: Vec<sluice_bundle::GroupKind> = decide::allowed_kinds(spec, Some(&platform))
            .into_iter()
            .map(|g| sluice_bundle::GroupKind {
                group: g.group,
                kind: g.kind,
            })
            .collect();
        let outside = bundle.objects_outside(&allowed);
        if !outside.is_empty() {
            let shown: Vec<String> = outside.iter().take(5).map(|o| o.display_name()).collect();
            return (
                Verification::Refused {
                    reason: reasons::DISALLOWED_KIND,
                    message: format!(
                        "the bundle holds {} object(s) of kinds outside the allowlist (spec.allowedKinds): {}{}",
                        outside.len(),
                        shown.join(", "),
                        if outside.len() > 5 { ", ..." } else { "" }
                    ),
                },
                None,
            );
        }
        let summary = BundleSummary {
            digest: bundle.verified.digest.clone(),
            content_digest: bundle.content_digest.clone(),
            key_fingerprint: bundle.verified.key_fingerprint.clone(),
            objects: bundle
                .objects()
                .iter()
                .map(|o| ObjectKey {
                    group: o.group_kind.group.clone(),
                    kind: o.group_kind.kind.clone(),
                    namespace: o.namespace.clone().unwrap_or_default(),
                    name: o.name.clone(),
                    version: o
                        .api_version
                        .rsplit_once('/')
                        .map_or(o.api_version.clone(), |(_, v)| v.to_owned()),
                })
                .collect(),
        };
        (Verification::Verified(summary), Some(bundle))
    }
}

fn refusal_reason(refusal: Refusal) -> &'static str {
    match refusal {
        Refusal::Unsigned => reasons::UNSIGNED,
        Refusal::WrongKey => reasons::WRONG_KEY,
        Refusal::UntrustedSigner => reasons::UNTRUSTED_SIGNER,
        Refusal::Tampered => reasons::TAMPERED,
        Refusal::RegistryNotAllowed => reasons::INVALID_SPEC,
    }
}
