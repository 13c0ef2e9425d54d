//! cosign's current signature format: a sigstore bundle attached to the image as an OCI referrer,
//! and the verdict on a digest's bundles (pure, no I/O).
//!
//! Owns what `cosign sign` (v2 with `--new-bundle-format`, the v3 default) stores and what this
//! crate accepts of it. For a manifest digest `sha256:<hex>`, cosign pushes an OCI image manifest
//! whose `subject` is that digest, whose `artifactType` is
//! `application/vnd.dev.sigstore.bundle.v0.3+json`, whose annotation
//! `dev.sigstore.bundle.predicateType` is `https://sigstore.dev/cosign/sign/v1`, and whose one
//! layer (same media type) is the bundle JSON. The registry lists it among the digest's referrers
//! (OCI 1.1 `GET /v2/<repo>/referrers/<digest>`); a registry without that API holds the same list
//! as an image index at the tag `sha256-<hex>` (the referrers tag schema).
//!
//! The bundle's `dsseEnvelope` holds an in-toto statement (`_type`
//! `https://in-toto.io/Statement/v1`, predicate type `https://sigstore.dev/cosign/sign/v1`) whose
//! one subject names the digest; the signature is over the DSSE pre-authentication encoding of
//! the payload. The signer is either a public key (`verificationMaterial.publicKey`, key-based)
//! or a certificate (`verificationMaterial.certificate`, keyless, judged against a trusted root by
//! [`crate::keyless`]).
//!
//! The verdict is taken on the digest: a bundle counts only if its signature verifies with a key
//! or identity the policy names **and** its statement names exactly the digest asked about. A
//! verified statement about another digest is [`BundleError::Tampered`], never accepted.

use base64::Engine;
use serde::Deserialize;

use crate::error::Result;
use crate::keys::PublicKey;

/// Media type (and referrer `artifactType`) of a sigstore bundle v0.3 as cosign writes it.
pub const BUNDLE_MEDIA_TYPE: &str = "application/vnd.dev.sigstore.bundle.v0.3+json";
/// The other spellings of a bundle media type this crate reads (older bundle versions).
const BUNDLE_MEDIA_TYPES: &[&str] = &[
    BUNDLE_MEDIA_TYPE,
    "application/vnd.dev.sigstore.bundle+json;version=0.3",
    "application/vnd.dev.sigstore.bundle+json;version=0.2",
    "application/vnd.dev.sigstore.bundle.v0.2+json",
];
/// Predicate type of the statement `cosign sign` signs.
pub const COSIGN_SIGN_PREDICATE_TYPE: &str = "https://sigstore.dev/cosign/sign/v1";
/// Referrer annotation naming the statement's predicate type.
pub const PREDICATE_TYPE_ANNOTATION: &str = "dev.sigstore.bundle.predicateType";
/// DSSE payload type of an in-toto statement.
pub const INTOTO_PAYLOAD_TYPE: &str = "application/vnd.in-toto+json";
/// `_type` of an in-toto statement v1 (v0.1 is read too).
const STATEMENT_TYPES: &[&str] = &[
    "https://in-toto.io/Statement/v1",
    "https://in-toto.io/Statement/v0.1",
];
/// Media type of an OCI image index (the referrers list).
pub const IMAGE_INDEX_MEDIA_TYPE: &str = "application/vnd.oci.image.index.v1+json";

/// Whether `media_type` is a sigstore bundle media type this crate reads.
pub fn is_bundle_media_type(media_type: &str) -> bool {
    BUNDLE_MEDIA_TYPES.contains(&media_type)
}

/// The referrers tag schema's tag for a manifest digest: `sha256:<hex>` → `sha256-<hex>`.
pub fn referrers_tag(digest: &str) -> Result<String> {
    let sig = crate::signature::signature_tag(digest)?;
    Ok(sig.trim_end_matches(".sig").to_string())
}

/// A sigstore bundle (the fields this crate reads; protobuf JSON, camelCase).
#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Bundle {
    /// The bundle's own media type.
    pub media_type: String,
    /// Who signed and the log's evidence.
    pub verification_material: VerificationMaterial,
    /// The signed envelope (cosign's image signatures are DSSE).
    #[serde(default)]
    pub dsse_envelope: Option<Envelope>,
    /// A plain message signature (blob signing); not an image signature.
    #[serde(default)]
    pub message_signature: Option<serde_json::Value>,
}

/// `verificationMaterial`.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct VerificationMaterial {
    /// Present for a key-based signature (a hint only; the key comes from the policy).
    #[serde(default)]
    pub public_key: Option<serde_json::Value>,
    /// The signing certificate (v0.3, keyless).
    #[serde(default)]
    pub certificate: Option<RawBytes>,
    /// The certificate chain, leaf first (v0.1/v0.2, keyless).
    #[serde(default)]
    pub x509_certificate_chain: Option<CertificateChain>,
    /// Transparency-log entries.
    #[serde(default)]
    pub tlog_entries: Vec<TlogEntry>,
}

/// Base64 DER bytes.
#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RawBytes {
    /// Standard base64.
    pub raw_bytes: String,
}

/// `x509CertificateChain`.
#[derive(Clone, Debug, Deserialize)]
pub struct CertificateChain {
    /// Leaf first.
    #[serde(default)]
    pub certificates: Vec<RawBytes>,
}

/// One transparency-log entry of a bundle.
#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TlogEntry {
    /// Index in the log (a decimal string in protobuf JSON).
    pub log_index: String,
    /// The log's id.
    pub log_id: LogId,
    /// When the log integrated the entry (Unix seconds, decimal string).
    pub integrated_time: String,
    /// The log's signed promise to include the entry (SET).
    #[serde(default)]
    pub inclusion_promise: Option<InclusionPromise>,
    /// The entry body as the log canonicalized it (base64).
    pub canonicalized_body: String,
}

/// `logId`.
#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LogId {
    /// Base64 of SHA-256 over the log's DER public key.
    pub key_id: String,
}

/// `inclusionPromise`.
#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct InclusionPromise {
    /// Base64 signature of the log over the entry's canonical JSON.
    pub signed_entry_timestamp: String,
}

/// A DSSE envelope.
#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Envelope {
    /// Base64 payload.
    pub payload: String,
    /// Payload type.
    pub payload_type: String,
    /// Signatures over the pre-authentication encoding.
    #[serde(default)]
    pub signatures: Vec<EnvelopeSignature>,
}

/// One DSSE signature.
#[derive(Clone, Debug, Deserialize)]
pub struct EnvelopeSignature {
    /// Base64 signature.
    pub sig: String,
}

/// An in-toto statement (the fields read).
#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Statement {
    #[serde(rename = "_type")]
    type_name: String,
    #[serde(default)]
    subject: Vec<Subject>,
    #[serde(default)]
    predicate_type: String,
}

#[derive(Clone, Debug, Deserialize)]
struct Subject {
    #[serde(default)]
    digest: std::collections::BTreeMap<String, String>,
}

/// DSSE's pre-authentication encoding of `payload` of type `payload_type`.
pub fn pae(payload_type: &str, payload: &[u8]) -> Vec<u8> {
    let mut out = format!(
        "DSSEv1 {} {} {} ",
        payload_type.len(),
        payload_type,
        payload.len()
    )
    .into_bytes();
    out.extend_from_slice(payload);
    out
}

pub(crate) fn b64(text: &str) -> Option<Vec<u8>> {
    base64::engine::general_purpose::STANDARD
        .decode(text.trim())
        .ok()
}

/// One bundle as read from the registry, with where it was found (for messages).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoredBundle {
    /// The bundle bytes exactly as stored.
    pub bytes: Vec<u8>,
    /// The referrer manifest digest that holds it.
    pub referrer: String,
}

/// What one bundle says, once its envelope is decoded.
pub(crate) struct Decoded {
    pub bundle: Bundle,
    pub payload: Vec<u8>,
    pub signatures: Vec<Vec<u8>>,
}

/// Decodes a bundle and its DSSE envelope; `Err` carries why it is not an image signature.
pub(crate) fn decode(bytes: &[u8]) -> std::result::Result<Decoded, String> {
    let bundle: Bundle =
        serde_json::from_slice(bytes).map_err(|e| format!("not a sigstore bundle: {e}"))?;
    if !is_bundle_media_type(&bundle.media_type) {
        return Err(format!(
            "bundle media type {:?} is not one this version reads ({BUNDLE_MEDIA_TYPE})",
            bundle.media_type
        ));
    }
    let Some(envelope) = &bundle.dsse_envelope else {
        return Err(if bundle.message_signature.is_some() {
            "a message-signature bundle (cosign sign-blob) is not an image signature".into()
        } else {
            "the bundle holds no DSSE envelope".into()
        });
    };
    if envelope.payload_type != INTOTO_PAYLOAD_TYPE {
        return Err(format!(
            "envelope payload type {:?} is not {INTOTO_PAYLOAD_TYPE}",
            envelope.payload_type
        ));
    }
    let payload = b64(&envelope.payload).ok_or("the envelope payload is not base64")?;
    let signatures = envelope
        .signatures
        .iter()
        .filter_map(|s| b64(&s.sig))
        .collect();
    Ok(Decoded {
        bundle,
        payload,
        signatures,
    })
}

/// What an authentic statement claims about `digest`.
pub(crate) enum Claim {
    /// A cosign signature of this digest.
    Signs,
    /// A cosign signature of another digest (the one named).
    SignsOther(String),
    /// Not a cosign signature (an attestation with another predicate, or not a statement).
    NotASignature(String),
}

/// Reads the claim of an authentic payload about `digest`.
pub(crate) fn claim(payload: &[u8], digest: &str) -> Claim {
    let Ok(statement) = serde_json::from_slice::<Statement>(payload) else {
        return Claim::NotASignature("the payload is not an in-toto statement".into());
    };
    if !STATEMENT_TYPES.contains(&statement.type_name.as_str()) {
        return Claim::NotASignature(format!("statement type {:?}", statement.type_name));
    }
    if statement.predicate_type != COSIGN_SIGN_PREDICATE_TYPE {
        return Claim::NotASignature(format!(
            "an attestation of predicate {:?}, not a signature",
            statement.predicate_type
        ));
    }
    let hex = digest.strip_prefix("sha256:").unwrap_or(digest);
    let named: Vec<String> = statement
        .subject
        .iter()
        .filter_map(|s| s.digest.get("sha256"))
        .map(|h| format!("sha256:{h}"))
        .collect();
    if statement.subject.len() == 1 && named.len() == 1 && named[0] == format!("sha256:{hex}") {
        Claim::Signs
    } else {
        Claim::SignsOther(if named.is_empty() {
            "no sha256 digest".into()
        } else {
            named.join(", ")
        })
    }
}

/// How one bundle fared against the policy.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// Verified, naming this digest.
    Verified {
        /// Who signed: a key fingerprint, or `keyless:<subject> (<issuer>)`.
        signer: String,
        /// Index of the key (key-based only).
        key_index: Option<usize>,
    },
    /// Verified, but signing another digest.
    SignsOther(String),
    /// Authentic, but the signer is not one the policy names (or its evidence fails).
    Untrusted(String),
    /// No key of the policy verifies it.
    NoKey,
    /// Not an image signature at all (ignored, like an unrelated referrer).
    Ignored(String),
}

/// Judges one key-based bundle against `keys`.
pub(crate) fn judge_key_based(decoded: &Decoded, digest: &str, keys: &[PublicKey]) -> Outcome {
    let message = pae(INTOTO_PAYLOAD_TYPE, &decoded.payload);
    for signature in &decoded.signatures {
        for (index, key) in keys.iter().enumerate() {
            if !key.verifies_raw(&message, signature) {
                continue;
            }
            return match claim(&decoded.payload, digest) {
                Claim::Signs => Outcome::Verified {
                    signer: key.fingerprint().to_string(),
                    key_index: Some(index),
                },
                Claim::SignsOther(other) => Outcome::SignsOther(other),
                Claim::NotASignature(why) => Outcome::Ignored(why),
            };
        }
    }
    Outcome::NoKey
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::keys::SigningKey;

    pub(crate) const D1: &str =
        "sha256:1111111111111111111111111111111111111111111111111111111111111111";
    pub(crate) const D2: &str =
        "sha256:2222222222222222222222222222222222222222222222222222222222222222";

    pub(crate) fn statement(digest: &str, predicate: &str) -> Vec<u8> {
        serde_json::to_vec(&serde_json::json!({
            "_type": "https://in-toto.io/Statement/v1",
            "subject": [{"digest": {"sha256": digest.trim_start_matches("sha256:")}}],
            "predicateType": predicate,
            "predicate": {},
        }))
        .unwrap()
    }

    pub(crate) fn key_bundle(key: &SigningKey, payload: &[u8]) -> Vec<u8> {
        let sig = key.sign(&pae(INTOTO_PAYLOAD_TYPE, payload)).unwrap();
        serde_json::to_vec(&serde_json::json!({
            "mediaType": BUNDLE_MEDIA_TYPE,
            "verificationMaterial": {"publicKey": {"hint": "x"}, "tlogEntries": []},
            "dsseEnvelope": {
                "payload": base64::engine::general_purpose::STANDARD.encode(payload),
                "payloadType": INTOTO_PAYLOAD_TYPE,
                "signatures": [{"sig": sig, "keyid": ""}],
            },
        }))
        .unwrap()
    }

    #[test]
    fn pae_is_dsse_v1() {
        assert_eq!(
            pae("application/vnd.in-toto+json", b"{}"),
            b"DSSEv1 28 application/vnd.in-toto+json 2 {}".to_vec()
        );
    }

    #[test]
    fn referrers_tag_is_the_digest_with_a_dash() {
        assert_eq!(
            referrers_tag(D1).unwrap(),
            format!("sha256-{}", "1".repeat(64))
        );
    }

    #[test]
    fn key_based_verdicts() {
        let good = SigningKey::generate().unwrap();
        let other = SigningKey::generate().unwrap();
        let keys = [other.public_key().clone(), good.public_key().clone()];
        let judge = |bytes: Vec<u8>| judge_key_based(&decode(&bytes).unwrap(), D1, &keys);

        assert_eq!(
            judge(key_bundle(
                &good,
                &statement(D1, COSIGN_SIGN_PREDICATE_TYPE)
            )),
            Outcome::Verified {
                signer: good.public_key().fingerprint().to_string(),
                key_index: Some(1)
            }
        );
        assert_eq!(
            judge(key_bundle(
                &good,
                &statement(D2, COSIGN_SIGN_PREDICATE_TYPE)
            )),
            Outcome::SignsOther(D2.to_string())
        );
        assert_eq!(
            judge(key_bundle(
                &SigningKey::generate().unwrap(),
                &statement(D1, COSIGN_SIGN_PREDICATE_TYPE)
            )),
            Outcome::NoKey
        );
        assert!(matches!(
            judge(key_bundle(&good, &statement(D1, "https://slsa.dev/provenance/v1"))),
            Outcome::Ignored(why) if why.contains("attestation")
        ));
        // The payload swapped after signing: the signature no longer verifies.
        let mut tampered: serde_json::Value = serde_json::from_slice(&key_bundle(
            &good,
            &statement(D2, COSIGN_SIGN_PREDICATE_TYPE),
        ))
        .unwrap();
        tampered["dsseEnvelope"]["payload"] = base64::engine::general_purpose::STANDARD
            .encode(statement(D1, COSIGN_SIGN_PREDICATE_TYPE))
            .into();
        assert_eq!(
            judge(serde_json::to_vec(&tampered).unwrap()),
            Outcome::NoKey
        );
    }

    #[test]
    fn non_signature_bundles_are_explained() {
        for (bytes, want) in [
            (b"{}".to_vec(), "not a sigstore bundle"),
            (
                br#"{"mediaType":"application/x","verificationMaterial":{}}"#.to_vec(),
                "not one this version reads",
            ),
            (
                format!(r#"{{"mediaType":"{BUNDLE_MEDIA_TYPE}","verificationMaterial":{{}},"messageSignature":{{}}}}"#).into_bytes(),
                "sign-blob",
            ),
        ] {
            let err = decode(&bytes).err().unwrap();
            assert!(err.contains(want), "{err}");
        }
    }
}
