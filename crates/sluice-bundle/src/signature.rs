//! Cosign's signature layout and the verdict on a digest's signatures (pure, no I/O).
//!
//! Owns what cosign (key-based, `--new-bundle-format=false`, `--tlog-upload=false`) stores and
//! reads: for a manifest digest `sha256:<hex>` of repository `R`, an OCI image at tag
//! `R:sha256-<hex>.sig` whose layers each hold one signature: the layer blob is the
//! simple-signing payload
//! `{"critical":{"identity":{"docker-reference":R},"image":{"docker-manifest-digest":D},"type":"cosign container image signature"},"optional":null}`,
//! media type `application/vnd.dev.cosign.simplesigning.v1+json`, and the base64 signature of
//! the payload bytes is in the layer annotation `dev.cosignproject.cosign/signature`.
//!
//! The verdict ([`judge`]) is taken on the digest, never on a tag: a signature counts only if it
//! verifies with one of the given keys **and** its payload names exactly the digest asked about.
//! It must never accept a signature whose payload names another digest (a copied or tampered
//! signature tag), and never report a wrong key as unsigned or the reverse. Like `cosign verify`,
//! it reports the payload's `docker-reference` but does not require it to equal the repository
//! read from, so a bundle copied to a mirror keeps its signature.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::artifact::{Descriptor, ImageManifest, MANIFEST_MEDIA_TYPE, sha256_digest};
use crate::error::{BundleError, Result};
use crate::keys::PublicKey;

/// Media type of a cosign signature layer.
pub const SIMPLE_SIGNING_MEDIA_TYPE: &str = "application/vnd.dev.cosign.simplesigning.v1+json";
/// Layer annotation holding the base64 signature.
pub const SIGNATURE_ANNOTATION: &str = "dev.cosignproject.cosign/signature";
/// `critical.type` of a cosign image signature.
pub const CRITICAL_TYPE: &str = "cosign container image signature";
/// Media type of the signature image's config.
pub const SIGNATURE_CONFIG_MEDIA_TYPE: &str = "application/vnd.oci.image.config.v1+json";

/// The cosign tag for a manifest digest: `sha256:<hex>` → `sha256-<hex>.sig`.
pub fn signature_tag(digest: &str) -> Result<String> {
    let Some(hex) = digest.strip_prefix("sha256:") else {
        return Err(BundleError::InvalidReference {
            what: "digest",
            value: digest.to_string(),
            reason: "only sha256 digests are supported".into(),
        });
    };
    if hex.len() != 64
        || !hex
            .bytes()
            .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase())
    {
        return Err(BundleError::InvalidReference {
            what: "digest",
            value: digest.to_string(),
            reason: "expected sha256: followed by 64 lowercase hex digits".into(),
        });
    }
    Ok(format!("sha256-{hex}.sig"))
}

/// The simple-signing payload (the container-signature JSON format cosign signs).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Payload {
    /// What the signature is about.
    pub critical: Critical,
    /// Optional claims; cosign writes `null`.
    pub optional: Option<BTreeMap<String, serde_json::Value>>,
}

/// The signed claims.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Critical {
    /// The repository the signer meant.
    pub identity: Identity,
    /// The digest signed.
    pub image: Image,
    /// Always [`CRITICAL_TYPE`].
    #[serde(rename = "type")]
    pub type_name: String,
}

/// `critical.identity`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Identity {
    /// The repository, e.g. `registry.example/mesh/config`.
    #[serde(rename = "docker-reference")]
    pub docker_reference: String,
}

/// `critical.image`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Image {
    /// The manifest digest signed.
    #[serde(rename = "docker-manifest-digest")]
    pub docker_manifest_digest: String,
}

/// The payload bytes cosign would sign for `repository` at `digest`.
pub fn payload(repository: &str, digest: &str) -> Vec<u8> {
    serde_json::to_vec(&Payload {
        critical: Critical {
            identity: Identity {
                docker_reference: repository.to_string(),
            },
            image: Image {
                docker_manifest_digest: digest.to_string(),
            },
            type_name: CRITICAL_TYPE.to_string(),
        },
        optional: None,
    })
    .expect("a payload always serializes")
}

/// One signature as read from the registry: the payload blob and the annotation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SignatureLayer {
    /// The payload bytes exactly as stored.
    pub payload: Vec<u8>,
    /// The base64 signature from the layer annotation (`None` if the annotation is missing).
    pub signature: Option<String>,
}

/// A signature image to push at the cosign tag: its manifest and config.
pub struct SignatureImage {
    /// The manifest bytes.
    pub manifest_bytes: Vec<u8>,
    /// The config blob.
    pub config: Vec<u8>,
}

/// Builds the signature image's manifest and config from its layer descriptors (pure).
pub fn signature_image(layers: Vec<Descriptor>) -> SignatureImage {
    let diff_ids: Vec<&str> = layers.iter().map(|l| l.digest.as_str()).collect();
    // The config go-containerregistry writes for cosign's signature images.
    let config = serde_json::to_vec(&serde_json::json!({
        "architecture": "",
        "config": {},
        "created": "0001-01-01T00:00:00Z",
        "history": [{"created": "0001-01-01T00:00:00Z"}],
        "os": "",
        "rootfs": {"diff_ids": diff_ids, "type": "layers"},
    }))
    .expect("a config always serializes");
    let manifest = ImageManifest {
        schema_version: 2,
        media_type: Some(MANIFEST_MEDIA_TYPE.to_string()),
        artifact_type: None,
        config: Descriptor {
            media_type: SIGNATURE_CONFIG_MEDIA_TYPE.to_string(),
            digest: sha256_digest(&config),
            size: config.len() as u64,
            artifact_type: None,
            annotations: BTreeMap::new(),
        },
        layers,
        annotations: BTreeMap::new(),
    };
    SignatureImage {
        manifest_bytes: manifest.to_bytes(),
        config,
    }
}

/// The descriptor of a new signature layer.
pub fn signature_descriptor(payload: &[u8], signature_b64: &str) -> Descriptor {
    Descriptor {
        media_type: SIMPLE_SIGNING_MEDIA_TYPE.to_string(),
        digest: sha256_digest(payload),
        size: payload.len() as u64,
        artifact_type: None,
        annotations: BTreeMap::from([(
            SIGNATURE_ANNOTATION.to_string(),
            signature_b64.to_string(),
        )]),
    }
}

/// A signature that passed: which key or identity, and what it claims.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Verified {
    /// The digest verified.
    pub digest: String,
    /// Who signed: the fingerprint of the key that verified it, or for a keyless signature
    /// `keyless:<certificate identity> (<OIDC issuer>)`.
    pub key_fingerprint: String,
    /// Index of that key in the list given (0 for a keyless signature).
    pub key_index: usize,
    /// The repository named in the payload (legacy format; the bundle format names none, then
    /// empty).
    pub docker_reference: String,
    /// Where the signature was found: [`FORMAT_LEGACY_TAG`] or [`FORMAT_SIGSTORE_BUNDLE`].
    pub format: String,
}

/// [`Verified::format`] of a signature at the `sha256-<hex>.sig` tag.
pub const FORMAT_LEGACY_TAG: &str = "legacy-tag";
/// [`Verified::format`] of a sigstore bundle found among the digest's referrers.
pub const FORMAT_SIGSTORE_BUNDLE: &str = "sigstore-bundle";

/// Which signers a verification accepts (the pin's policy). A signature counts only when its
/// signer is one this policy names: a key of [`Policy::keys`], or a certificate that chains to
/// the trusted root and whose identity and issuer match one of the keyless identities.
#[derive(Clone, Debug, Default)]
pub struct Policy {
    /// Public keys, any of which may sign.
    pub keys: Vec<PublicKey>,
    /// Keyless signers (trusted root and identities); `None`: keyless signatures are refused.
    pub keyless: Option<crate::keyless::Keyless>,
    /// When set, a legacy signature must name this repository (`registry/repository`) in its
    /// payload's `docker-reference`: a signature made for another repository is refused.
    pub repository: Option<String>,
}

impl Policy {
    /// A policy of keys alone.
    pub fn keys(keys: &[PublicKey]) -> Self {
        Self {
            keys: keys.to_vec(),
            ..Self::default()
        }
    }

    fn describe_signers(&self) -> String {
        let mut signers: Vec<String> = self
            .keys
            .iter()
            .map(|k| k.fingerprint().to_string())
            .collect();
        if let Some(keyless) = &self.keyless {
            signers.extend(keyless.identities.iter().map(|i| format!("keyless {i}")));
        }
        signers.join(", ")
    }
}

/// The verdict on `layers` (the signatures stored at `digest`'s cosign tag) for `digest`, given
/// `keys`. `reference` and `tag` only name things in errors.
///
/// - no signature layers at all → [`BundleError::Unsigned`];
/// - a signature verifies with a key and names `digest` → `Ok`;
/// - a signature verifies with a key but names another digest → [`BundleError::Tampered`];
/// - otherwise (signatures exist, none verifies with any key) → [`BundleError::WrongKey`].
pub fn judge(
    digest: &str,
    layers: &[SignatureLayer],
    keys: &[PublicKey],
    reference: &str,
    tag: &str,
) -> Result<Verified> {
    if layers.is_empty() {
        return Err(BundleError::Unsigned {
            reference: reference.to_string(),
            signature_tag: tag.to_string(),
        });
    }
    let mut signed_other = None;
    for layer in layers {
        let Some(signature) = &layer.signature else {
            continue;
        };
        for (key_index, key) in keys.iter().enumerate() {
            if !key.verifies(&layer.payload, signature) {
                continue;
            }
            // Authentic payload: now it must be a cosign image claim about this very digest.
            let claim: Option<Payload> = serde_json::from_slice(&layer.payload).ok();
            match claim {
                Some(p)
                    if p.critical.type_name == CRITICAL_TYPE
                        && p.critical.image.docker_manifest_digest == digest =>
                {
                    return Ok(Verified {
                        digest: digest.to_string(),
                        key_fingerprint: key.fingerprint().to_string(),
                        key_index,
                        docker_reference: p.critical.identity.docker_reference,
                        format: FORMAT_LEGACY_TAG.to_string(),
                    });
                }
                Some(p) => signed_other = Some(p.critical.image.docker_manifest_digest),
                None => signed_other = Some("an unreadable payload".to_string()),
            }
        }
    }
    if let Some(signed_digest) = signed_other {
        return Err(BundleError::Tampered {
            reference: reference.to_string(),
            signed_digest,
        });
    }
    Err(BundleError::WrongKey {
        reference: reference.to_string(),
        signatures: layers.len(),
        keys: keys
            .iter()
            .map(PublicKey::fingerprint)
            .collect::<Vec<_>>()
            .join(", "),
    })
}

/// The verdict on every signature stored for `digest`: the legacy `layers` (its `.sig` tag) and
/// the sigstore `bundles` among its referrers, under `policy`. `reference` names the digest in
/// errors, `locations` where signatures were looked for.
///
/// Any one signature that verifies with a signer the policy names, names `digest` and (with
/// [`Policy::repository`]) names the repository, passes. Otherwise the most telling refusal:
/// a verified signature of another digest ([`BundleError::Tampered`]), then an authentic
/// signature by a signer the policy does not name or with failing evidence
/// ([`BundleError::UntrustedSignature`]), then signatures no key verifies
/// ([`BundleError::WrongKey`]), then none at all ([`BundleError::Unsigned`]).
pub fn verdict(
    digest: &str,
    layers: &[SignatureLayer],
    bundles: &[crate::sigstore_bundle::StoredBundle],
    policy: &Policy,
    reference: &str,
    locations: &str,
) -> Result<Verified> {
    use crate::sigstore_bundle::{self as sb, Outcome};
    let mut tampered: Option<BundleError> = None;
    let mut untrusted: Vec<String> = Vec::new();
    let mut unverified = 0usize;
    let mut ignored: Vec<String> = Vec::new();

    for stored in bundles {
        let outcome = match sb::decode(&stored.bytes) {
            Err(why) => Outcome::Ignored(why),
            Ok(decoded) => {
                let material = &decoded.bundle.verification_material;
                if material.certificate.is_some() || material.x509_certificate_chain.is_some() {
                    match &policy.keyless {
                        Some(keyless) => keyless.judge(&decoded, digest),
                        None => Outcome::Untrusted(
                            "a keyless (certificate) signature, but no keyless identity is \
                             trusted (a BundlePin's spec.keyless)"
                                .into(),
                        ),
                    }
                } else {
                    sb::judge_key_based(&decoded, digest, &policy.keys)
                }
            }
        };
        match outcome {
            Outcome::Verified { signer, key_index } => {
                return Ok(Verified {
                    digest: digest.to_string(),
                    key_fingerprint: signer,
                    key_index: key_index.unwrap_or(0),
                    docker_reference: String::new(),
                    format: FORMAT_SIGSTORE_BUNDLE.to_string(),
                });
            }
            Outcome::SignsOther(other) => {
                tampered.get_or_insert(BundleError::Tampered {
                    reference: reference.to_string(),
                    signed_digest: other,
                });
            }
            Outcome::Untrusted(why) => untrusted.push(format!("bundle {}: {why}", stored.referrer)),
            Outcome::NoKey => unverified += 1,
            Outcome::Ignored(why) => ignored.push(format!("referrer {}: {why}", stored.referrer)),
        }
    }

    if !layers.is_empty() {
        match judge(digest, layers, &policy.keys, reference, locations) {
            Ok(v) => match &policy.repository {
                Some(repository) if &v.docker_reference != repository => untrusted.push(format!(
                    "the legacy signature by {} was made for repository {:?}, not {repository:?} \
                     (the pin requires its own repository: spec.requireSignedRepository)",
                    v.key_fingerprint, v.docker_reference
                )),
                _ => return Ok(v),
            },
            Err(e @ BundleError::Tampered { .. }) => {
                tampered.get_or_insert(e);
            }
            Err(_) => unverified += layers.len(),
        }
    }

    if let Some(e) = tampered {
        return Err(e);
    }
    if !untrusted.is_empty() {
        return Err(BundleError::UntrustedSignature {
            reference: reference.to_string(),
            reason: untrusted.join("; "),
            signers: policy.describe_signers(),
        });
    }
    if unverified > 0 {
        return Err(BundleError::WrongKey {
            reference: reference.to_string(),
            signatures: unverified,
            keys: policy.describe_signers(),
        });
    }
    let mut where_ = locations.to_string();
    if !ignored.is_empty() {
        where_.push_str(&format!(" (not image signatures: {})", ignored.join("; ")));
    }
    Err(BundleError::Unsigned {
        reference: reference.to_string(),
        signature_tag: where_,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::keys::SigningKey;

    const D1: &str = "sha256:1111111111111111111111111111111111111111111111111111111111111111";
    const D2: &str = "sha256:2222222222222222222222222222222222222222222222222222222222222222";

    fn signed(key: &SigningKey, digest: &str) -> SignatureLayer {
        let payload = payload("127.0.0.1:5000/mesh", digest);
        SignatureLayer {
            signature: Some(key.sign(&payload).unwrap()),
            payload,
        }
    }

    #[test]
    fn tag_follows_cosign_layout() {
        assert_eq!(
            signature_tag(D1).unwrap(),
            format!("sha256-{}.sig", "1".repeat(64))
        );
        for bad in ["latest", "sha512:00", "sha256:XYZ", "sha256:ABCDEF"] {
            assert_eq!(
                signature_tag(bad).unwrap_err().category(),
                "InvalidReference",
                "{bad}"
            );
        }
    }

    #[test]
    fn payload_matches_cosign_simple_signing_format() {
        let p: serde_json::Value = serde_json::from_slice(&payload("r/x", D1)).unwrap();
        assert_eq!(p["critical"]["identity"]["docker-reference"], "r/x");
        assert_eq!(p["critical"]["image"]["docker-manifest-digest"], D1);
        assert_eq!(p["critical"]["type"], CRITICAL_TYPE);
        assert!(p["optional"].is_null());
        assert!(p.as_object().unwrap().contains_key("optional"));
    }

    #[test]
    fn verdicts() {
        let good = SigningKey::generate().unwrap();
        let other = SigningKey::generate().unwrap();
        let trusted = [other.public_key().clone(), good.public_key().clone()];
        let mut altered = signed(&good, D1);
        altered.payload = payload("127.0.0.1:5000/mesh", D2); // signature no longer matches

        struct Case {
            name: &'static str,
            layers: Vec<SignatureLayer>,
            want: std::result::Result<usize, &'static str>,
        }
        let cases = [
            Case {
                name: "signed by the second trusted key",
                layers: vec![signed(&good, D1)],
                want: Ok(1),
            },
            Case {
                name: "one good among several",
                layers: vec![
                    signed(&SigningKey::generate().unwrap(), D1),
                    signed(&good, D1),
                ],
                want: Ok(1),
            },
            Case {
                name: "no signatures",
                layers: vec![],
                want: Err("Unsigned"),
            },
            Case {
                name: "signed by an untrusted key",
                layers: vec![signed(&SigningKey::generate().unwrap(), D1)],
                want: Err("WrongKey"),
            },
            Case {
                name: "valid signature of another digest (copied signature tag)",
                layers: vec![signed(&good, D2)],
                want: Err("Tampered"),
            },
            Case {
                name: "payload altered after signing",
                layers: vec![altered],
                want: Err("WrongKey"),
            },
            Case {
                name: "annotation missing",
                layers: vec![SignatureLayer {
                    payload: payload("r", D1),
                    signature: None,
                }],
                want: Err("WrongKey"),
            },
        ];
        for case in cases {
            let got = judge(D1, &case.layers, &trusted, "r@d", "t");
            match (got, case.want) {
                (Ok(v), Ok(index)) => {
                    assert_eq!(v.key_index, index, "{}", case.name);
                    assert_eq!(v.digest, D1);
                    assert_eq!(v.key_fingerprint, trusted[index].fingerprint());
                }
                (Err(e), Err(category)) => assert_eq!(e.category(), category, "{}: {e}", case.name),
                (got, want) => panic!("{}: got {got:?}, want {want:?}", case.name),
            }
        }
    }

    #[test]
    fn no_keys_never_verifies() {
        let good = SigningKey::generate().unwrap();
        let err = judge(D1, &[signed(&good, D1)], &[], "r@d", "t").unwrap_err();
        assert_eq!(err.category(), "WrongKey");
    }

    #[test]
    fn signature_image_lists_every_layer_in_config_and_manifest() {
        let key = SigningKey::generate().unwrap();
        let one = signed(&key, D1);
        let two = signed(&SigningKey::generate().unwrap(), D1);
        let layers = vec![
            signature_descriptor(&one.payload, one.signature.as_deref().unwrap()),
            signature_descriptor(&two.payload, two.signature.as_deref().unwrap()),
        ];
        let image = signature_image(layers.clone());
        let manifest: ImageManifest = serde_json::from_slice(&image.manifest_bytes).unwrap();
        assert_eq!(manifest.layers, layers);
        assert_eq!(manifest.config.digest, sha256_digest(&image.config));
        let config: serde_json::Value = serde_json::from_slice(&image.config).unwrap();
        assert_eq!(config["rootfs"]["diff_ids"].as_array().unwrap().len(), 2);
        assert_eq!(manifest.layers[0].media_type, SIMPLE_SIGNING_MEDIA_TYPE);
        assert!(
            manifest.layers[0]
                .annotations
                .contains_key(SIGNATURE_ANNOTATION)
        );
    }
}
