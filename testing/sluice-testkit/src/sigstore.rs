//! A sigstore instance made per test: a certificate authority in Fulcio's role, a log key in
//! Rekor's, the `trusted_root.json` naming both, short-lived certificates for an identity and
//! OIDC issuer, keyless sigstore bundles over a digest logged with a signed entry timestamp
//! (SET), and attaching such a bundle to an image in the local registry the way `cosign sign`
//! does (an OCI referrer, listed under the referrers tag `sha256-<hex>`). Nothing can reach a
//! public sigstore instance, so keyless verification is judged against this one.
//!
//! The format is spelled here from what cosign writes (sigstore bundle v0.3, an in-toto
//! statement with cosign's sign predicate in a DSSE envelope, a `dsse` log entry), not taken from
//! `sluice-bundle`, so the verifier is checked against an independent writer. Never talks to
//! anything but the registry it is given; keys live in memory only.

use std::time::Duration;

use aws_lc_rs::digest::{SHA256, digest};
use base64::Engine;
use rcgen::{PublicKeyData, SigningKey};
use serde_json::{Value, json};

/// Media type (and referrer `artifactType`) of a sigstore bundle v0.3, as cosign writes it.
pub const BUNDLE_MEDIA_TYPE: &str = "application/vnd.dev.sigstore.bundle.v0.3+json";
/// Predicate type of the statement `cosign sign` signs.
pub const COSIGN_SIGN_PREDICATE_TYPE: &str = "https://sigstore.dev/cosign/sign/v1";
/// DSSE payload type of an in-toto statement.
pub const INTOTO_PAYLOAD_TYPE: &str = "application/vnd.in-toto+json";
/// Fulcio's certificate extension for the OIDC issuer (v2, a DER UTF8String).
const OIDC_ISSUER_OID: &[u64] = &[1, 3, 6, 1, 4, 1, 57264, 1, 8];
/// How long a certificate is valid either side of its issuance (Fulcio's are valid 10 minutes).
const CERTIFICATE_HALF_LIFE: Duration = Duration::from_secs(300);
/// The log index every entry claims (one entry per bundle; the SET covers it).
const LOG_INDEX: i64 = 7;

const OCI_MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
const OCI_INDEX: &str = "application/vnd.oci.image.index.v1+json";
const OCI_EMPTY: &str = "application/vnd.oci.empty.v1+json";
const DOCKER_MANIFEST: &str = "application/vnd.docker.distribution.manifest.v2+json";

/// What went wrong making or attaching a signature.
#[derive(Debug, thiserror::Error, strum::IntoStaticStr)]
#[strum(serialize_all = "snake_case")]
pub enum SigstoreError {
    /// rcgen refused a key or certificate.
    #[error("sigstore fixture certificate or key: {0}")]
    Certificate(#[from] rcgen::Error),
    /// The registry could not be reached.
    #[error("registry request {what}: {source}")]
    Http {
        /// The request.
        what: String,
        /// The underlying error.
        source: reqwest::Error,
    },
    /// The registry answered with an unexpected status.
    #[error("registry answered {status} to {what}: {body}")]
    Registry {
        /// The request.
        what: String,
        /// The HTTP status.
        status: u16,
        /// The answer's body (as text).
        body: String,
    },
    /// A reference is not `host/name@sha256:<hex>`.
    #[error("{0:?} is not a digest reference host/name@sha256:<hex>")]
    Reference(String),
}

impl SigstoreError {
    /// Bounded category of this error, usable as a metric label.
    pub fn category(&self) -> &'static str {
        self.into()
    }
}

fn b64(bytes: impl AsRef<[u8]>) -> String {
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

fn sha256(bytes: &[u8]) -> Vec<u8> {
    digest(&SHA256, bytes).as_ref().to_vec()
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The DSSE pre-authentication encoding (what a DSSE signature signs).
fn pae(payload_type: &str, payload: &[u8]) -> Vec<u8> {
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

/// A signer's short-lived certificate (DER) and its key, as Fulcio hands them out.
pub struct Certified {
    /// The certificate, DER.
    pub der: Vec<u8>,
    key: rcgen::KeyPair,
}

impl std::fmt::Debug for Certified {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Certified").finish_non_exhaustive()
    }
}

/// One sigstore instance: its certificate authority and its log key. Two instances trust
/// nothing of each other.
pub struct Sigstore {
    ca_key: rcgen::KeyPair,
    ca_params: rcgen::CertificateParams,
    ca_der: Vec<u8>,
    rekor: rcgen::KeyPair,
}

impl std::fmt::Debug for Sigstore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sigstore").finish_non_exhaustive()
    }
}

impl Sigstore {
    /// A fresh instance: a self-signed CA ("test fulcio") and an ECDSA P-256 log key.
    pub fn new() -> Result<Self, SigstoreError> {
        let ca_key = rcgen::KeyPair::generate()?;
        let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new())?;
        ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        ca_params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "test fulcio");
        ca_params.key_usages = vec![
            rcgen::KeyUsagePurpose::KeyCertSign,
            rcgen::KeyUsagePurpose::CrlSign,
        ];
        let ca_der = ca_params.self_signed(&ca_key)?.der().to_vec();
        Ok(Self {
            ca_key,
            ca_params,
            ca_der,
            rekor: rcgen::KeyPair::generate()?,
        })
    }

    /// The log's id: the SHA-256 of its public key (DER).
    fn log_id(&self) -> Vec<u8> {
        sha256(&self.rekor.subject_public_key_info())
    }

    /// This instance's `trusted_root.json` (media type `trustedroot+json;version=0.1`): its CA
    /// and its log, valid from 2020, no CT logs or timestamp authorities. What revert's
    /// `--trusted-root` file holds.
    pub fn trusted_root_json(&self) -> Vec<u8> {
        let root = json!({
            "mediaType": "application/vnd.dev.sigstore.trustedroot+json;version=0.1",
            "tlogs": [{
                "baseUrl": "https://rekor.invalid",
                "hashAlgorithm": "SHA2_256",
                "publicKey": {
                    "rawBytes": b64(self.rekor.subject_public_key_info()),
                    "keyDetails": "PKIX_ECDSA_P256_SHA_256",
                    "validFor": {"start": "2020-01-01T00:00:00Z"},
                },
                "logId": {"keyId": b64(self.log_id())},
            }],
            "certificateAuthorities": [{
                "subject": {"organization": "test", "commonName": "test fulcio"},
                "uri": "https://fulcio.invalid",
                "certChain": {"certificates": [{"rawBytes": b64(&self.ca_der)}]},
                "validFor": {"start": "2020-01-01T00:00:00Z"},
            }],
            "ctlogs": [],
            "timestampAuthorities": [],
        });
        serde_json::to_vec(&root).expect("JSON")
    }

    /// A Fulcio-like certificate for `subject` (a URI subject alternative name) vouched for by
    /// `issuer` (the OIDC issuer extension), valid five minutes either side of now, code
    /// signing, with a fresh key.
    pub fn certificate(&self, subject: &str, issuer: &str) -> Result<Certified, SigstoreError> {
        let key = rcgen::KeyPair::generate()?;
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new())?;
        params.subject_alt_names = vec![rcgen::SanType::URI(subject.try_into()?)];
        params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::CodeSigning];
        params.key_usages = vec![rcgen::KeyUsagePurpose::DigitalSignature];
        // DER UTF8String (short form: issuers are under 128 bytes).
        let mut value = vec![0x0c, issuer.len() as u8];
        value.extend_from_slice(issuer.as_bytes());
        params.custom_extensions = vec![rcgen::CustomExtension::from_oid_content(
            OIDC_ISSUER_OID,
            value,
        )];
        let now = time::OffsetDateTime::now_utc();
        params.not_before = now - CERTIFICATE_HALF_LIFE;
        params.not_after = now + CERTIFICATE_HALF_LIFE;
        let issuer_ca = rcgen::Issuer::new(self.ca_params.clone(), &self.ca_key);
        let cert = params.signed_by(&key, &issuer_ca)?;
        Ok(Certified {
            der: cert.der().to_vec(),
            key,
        })
    }

    /// A keyless sigstore bundle (v0.3) by `signer` over `digest` (`sha256:<hex>`): an in-toto
    /// statement with cosign's sign predicate in a DSSE envelope, the certificate as
    /// verification material, and one `dsse` entry of this instance's log integrated at
    /// `integrated` (Unix seconds) with its SET.
    pub fn bundle(
        &self,
        digest: &str,
        signer: &Certified,
        integrated: i64,
    ) -> Result<Vec<u8>, SigstoreError> {
        let payload = serde_json::to_vec(&json!({
            "_type": "https://in-toto.io/Statement/v1",
            "subject": [{"digest": {"sha256": digest.trim_start_matches("sha256:")}}],
            "predicateType": COSIGN_SIGN_PREDICATE_TYPE,
            "predicate": {},
        }))
        .expect("JSON");
        let sig = b64(signer.key.sign(&pae(INTOTO_PAYLOAD_TYPE, &payload))?);
        let body = serde_json::to_vec(&json!({
            "apiVersion": "0.0.1",
            "kind": "dsse",
            "spec": {
                "envelopeHash": {"algorithm": "sha256", "value": "00"},
                "payloadHash": {"algorithm": "sha256", "value": hex(&sha256(&payload))},
                "signatures": [{"signature": sig, "verifier": b64(&signer.der)}],
            },
        }))
        .expect("JSON");
        let mut bundle = json!({
            "mediaType": BUNDLE_MEDIA_TYPE,
            "verificationMaterial": {
                "certificate": {"rawBytes": b64(&signer.der)},
                "tlogEntries": [{
                    "logIndex": LOG_INDEX.to_string(),
                    "logId": {"keyId": ""},
                    "kindVersion": {"kind": "dsse", "version": "0.0.1"},
                    "integratedTime": integrated.to_string(),
                    "inclusionPromise": {"signedEntryTimestamp": ""},
                    "canonicalizedBody": b64(&body),
                }],
            },
            "dsseEnvelope": {
                "payload": b64(&payload),
                "payloadType": INTOTO_PAYLOAD_TYPE,
                "signatures": [{"sig": sig, "keyid": ""}],
            },
        });
        self.promise(&mut bundle)?;
        Ok(serde_json::to_vec(&bundle).expect("JSON"))
    }

    /// `bundle` with its log entry's SET signed again by this instance's log (its log id and
    /// signature), as if this log had integrated the entry.
    pub fn resign_set(&self, bundle: &[u8]) -> Result<Vec<u8>, SigstoreError> {
        let mut v: Value = serde_json::from_slice(bundle).expect("a bundle made by this module");
        self.promise(&mut v)?;
        Ok(serde_json::to_vec(&v).expect("JSON"))
    }

    /// Writes this log's id and SET into the bundle's first log entry: the log's signature over
    /// the canonical JSON of body, integrated time, log id (hex) and log index.
    fn promise(&self, bundle: &mut Value) -> Result<(), SigstoreError> {
        let entry = &mut bundle["verificationMaterial"]["tlogEntries"][0];
        let log_id = self.log_id();
        let integrated: i64 = entry["integratedTime"]
            .as_str()
            .and_then(|t| t.parse().ok())
            .expect("a bundle made by this module");
        let message = serde_json::to_vec(&json!({
            "body": entry["canonicalizedBody"],
            "integratedTime": integrated,
            "logID": hex(&log_id),
            "logIndex": LOG_INDEX,
        }))
        .expect("JSON");
        entry["logId"]["keyId"] = b64(&log_id).into();
        entry["inclusionPromise"]["signedEntryTimestamp"] = b64(self.rekor.sign(&message)?).into();
        Ok(())
    }
}

/// Attaches `bundle` to the image `reference` (`host/name@sha256:<hex>`) in a plain-HTTP
/// registry the way `cosign sign` does on a registry without the OCI referrers API: pushes the
/// bundle as the one layer of an OCI manifest whose `subject` is the image and whose
/// `artifactType` is [`BUNDLE_MEDIA_TYPE`] (annotated with cosign's sign predicate), and adds
/// that manifest to the image index under the referrers tag `sha256-<hex>` (created if absent,
/// appended to otherwise). Returns the referrer manifest's digest.
pub async fn attach(reference: &str, bundle: &[u8]) -> Result<String, SigstoreError> {
    let bad = || SigstoreError::Reference(reference.to_owned());
    let (repository, subject_digest) = reference.split_once('@').ok_or_else(bad)?;
    let (host, name) = repository.split_once('/').ok_or_else(bad)?;
    let hex_digest = subject_digest.strip_prefix("sha256:").ok_or_else(bad)?;
    let base = format!("http://{host}/v2/{name}");
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()
        .map_err(|source| SigstoreError::Http {
            what: "building a client".into(),
            source,
        })?;

    // The subject descriptor: the image manifest as the registry serves it.
    let url = format!("{base}/manifests/{subject_digest}");
    let subject = send(
        http.get(&url)
            .header(
                "accept",
                format!("{OCI_MANIFEST}, {OCI_INDEX}, {DOCKER_MANIFEST}"),
            )
            .send()
            .await,
        &format!("GET {url}"),
        &[200],
    )
    .await?;
    let subject_type = subject
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or(OCI_MANIFEST)
        .to_owned();
    let subject_size = body(subject, &url).await?.len();

    let empty = b"{}";
    let layer = push_blob(&http, &base, bundle).await?;
    let config = push_blob(&http, &base, empty).await?;
    let annotations = json!({
        "dev.sigstore.bundle.content": "dsse-envelope",
        "dev.sigstore.bundle.predicateType": COSIGN_SIGN_PREDICATE_TYPE,
    });
    let manifest = serde_json::to_vec(&json!({
        "schemaVersion": 2,
        "mediaType": OCI_MANIFEST,
        "artifactType": BUNDLE_MEDIA_TYPE,
        "config": {"mediaType": OCI_EMPTY, "digest": config, "size": empty.len()},
        "layers": [{"mediaType": BUNDLE_MEDIA_TYPE, "digest": layer, "size": bundle.len()}],
        "subject": {"mediaType": subject_type, "digest": subject_digest, "size": subject_size},
        "annotations": annotations,
    }))
    .expect("JSON");
    let manifest_digest = format!("sha256:{}", hex(&sha256(&manifest)));
    put_manifest(
        &http,
        &base,
        &manifest_digest,
        OCI_MANIFEST,
        manifest.clone(),
    )
    .await?;

    // The referrers tag schema: the index of the subject's referrers, appended to.
    let tag = format!("sha256-{hex_digest}");
    let url = format!("{base}/manifests/{tag}");
    let what = format!("GET {url}");
    let existing = send(
        http.get(&url).header("accept", OCI_INDEX).send().await,
        &what,
        &[200, 404],
    )
    .await?;
    let mut index = if existing.status().as_u16() == 404 {
        json!({"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": []})
    } else {
        serde_json::from_slice(&body(existing, &url).await?).map_err(|e| {
            SigstoreError::Registry {
                what,
                status: 200,
                body: format!("not an image index: {e}"),
            }
        })?
    };
    index["manifests"]
        .as_array_mut()
        .ok_or_else(|| SigstoreError::Registry {
            what: format!("GET {url}"),
            status: 200,
            body: "an image index without manifests".into(),
        })?
        .push(json!({
            "mediaType": OCI_MANIFEST,
            "digest": manifest_digest,
            "size": manifest.len(),
            "artifactType": BUNDLE_MEDIA_TYPE,
            "annotations": annotations,
        }));
    let index = serde_json::to_vec(&index).expect("JSON");
    put_manifest(&http, &base, &tag, OCI_INDEX, index).await?;
    Ok(manifest_digest)
}

/// `response` if its status is one of `ok`, else the registry's answer as an error.
async fn send(
    response: reqwest::Result<reqwest::Response>,
    what: &str,
    ok: &[u16],
) -> Result<reqwest::Response, SigstoreError> {
    let response = response.map_err(|source| SigstoreError::Http {
        what: what.to_owned(),
        source,
    })?;
    let status = response.status().as_u16();
    if ok.contains(&status) {
        return Ok(response);
    }
    Err(SigstoreError::Registry {
        what: what.to_owned(),
        status,
        body: response.text().await.unwrap_or_default(),
    })
}

async fn body(response: reqwest::Response, url: &str) -> Result<Vec<u8>, SigstoreError> {
    Ok(response
        .bytes()
        .await
        .map_err(|source| SigstoreError::Http {
            what: format!("reading {url}"),
            source,
        })?
        .to_vec())
}

/// Uploads `bytes` as a blob (monolithic: POST then PUT with the digest); returns its digest.
async fn push_blob(
    http: &reqwest::Client,
    base: &str,
    bytes: &[u8],
) -> Result<String, SigstoreError> {
    let blob_digest = format!("sha256:{}", hex(&sha256(bytes)));
    let url = format!("{base}/blobs/uploads/");
    let started = send(http.post(&url).send().await, &format!("POST {url}"), &[202]).await?;
    let location = started
        .headers()
        .get("location")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    // The Location is absolute or relative to the registry's root.
    let location = if location.starts_with("http") {
        location
    } else {
        let root = base.split("/v2/").next().unwrap_or(base);
        format!("{root}{location}")
    };
    let separator = if location.contains('?') { '&' } else { '?' };
    let url = format!("{location}{separator}digest={blob_digest}");
    send(
        http.put(&url)
            .header("content-type", "application/octet-stream")
            .body(bytes.to_vec())
            .send()
            .await,
        &format!("PUT blob {blob_digest}"),
        &[201],
    )
    .await?;
    Ok(blob_digest)
}

async fn put_manifest(
    http: &reqwest::Client,
    base: &str,
    reference: &str,
    media_type: &str,
    bytes: Vec<u8>,
) -> Result<(), SigstoreError> {
    let url = format!("{base}/manifests/{reference}");
    send(
        http.put(&url)
            .header("content-type", media_type)
            .body(bytes)
            .send()
            .await,
        &format!("PUT {url}"),
        &[201],
    )
    .await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pae_is_dsse_v1() {
        assert_eq!(pae("t", b"ab"), b"DSSEv1 1 t 2 ab".to_vec());
    }

    #[test]
    fn a_bundle_names_the_digest_and_its_own_log() {
        let sigstore = Sigstore::new().unwrap();
        let signer = sigstore
            .certificate("https://ci.example/sign", "https://issuer.example")
            .unwrap();
        let digest = format!("sha256:{}", "1".repeat(64));
        let bundle: Value =
            serde_json::from_slice(&sigstore.bundle(&digest, &signer, 1_700_000_000).unwrap())
                .unwrap();
        assert_eq!(bundle["mediaType"], BUNDLE_MEDIA_TYPE);
        let entry = &bundle["verificationMaterial"]["tlogEntries"][0];
        assert_eq!(entry["logId"]["keyId"], b64(sigstore.log_id()));
        assert_eq!(entry["integratedTime"], "1700000000");
        let payload = base64::engine::general_purpose::STANDARD
            .decode(bundle["dsseEnvelope"]["payload"].as_str().unwrap())
            .unwrap();
        let statement: Value = serde_json::from_slice(&payload).unwrap();
        assert_eq!(statement["subject"][0]["digest"]["sha256"], "1".repeat(64));
        let root: Value = serde_json::from_slice(&sigstore.trusted_root_json()).unwrap();
        assert_eq!(root["tlogs"][0]["logId"]["keyId"], entry["logId"]["keyId"]);

        let other = Sigstore::new().unwrap();
        let moved: Value = serde_json::from_slice(
            &other
                .resign_set(&serde_json::to_vec(&bundle).unwrap())
                .unwrap(),
        )
        .unwrap();
        assert_eq!(
            moved["verificationMaterial"]["tlogEntries"][0]["logId"]["keyId"],
            b64(other.log_id())
        );
    }

    #[tokio::test]
    async fn attached_bundles_are_listed_as_referrers_of_the_image() {
        let Some(registry) = crate::registry::Registry::start_or_skip().await else {
            return;
        };
        let http = reqwest::Client::new();
        let base = format!("{}/v2/mesh/signed", registry.url());
        let config = push_blob(&http, &base, b"{}").await.unwrap();
        let image = serde_json::to_vec(&json!({
            "schemaVersion": 2,
            "mediaType": OCI_MANIFEST,
            "config": {"mediaType": OCI_EMPTY, "digest": config, "size": 2},
            "layers": [],
        }))
        .unwrap();
        let digest = format!("sha256:{}", hex(&sha256(&image)));
        put_manifest(&http, &base, &digest, OCI_MANIFEST, image)
            .await
            .unwrap();
        let reference = format!("{}@{digest}", registry.repository("mesh/signed"));
        let sigstore = Sigstore::new().unwrap();
        let signer = sigstore
            .certificate("https://ci.example/sign", "https://issuer.example")
            .unwrap();
        let first = attach(&reference, &sigstore.bundle(&digest, &signer, 1).unwrap())
            .await
            .unwrap();
        let second = attach(&reference, &sigstore.bundle(&digest, &signer, 2).unwrap())
            .await
            .unwrap();

        // Through the referrers API (in front of the registry), both, as cosign lists them.
        let front = crate::referrers_api::ReferrersApi::start(&registry.url())
            .await
            .unwrap();
        let index: Value = http
            .get(format!(
                "http://{}/v2/mesh/signed/referrers/{digest}",
                front.host()
            ))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        let listed: Vec<(&str, &str)> = index["manifests"]
            .as_array()
            .unwrap()
            .iter()
            .map(|d| {
                (
                    d["digest"].as_str().unwrap(),
                    d["artifactType"].as_str().unwrap(),
                )
            })
            .collect();
        assert_eq!(
            listed,
            vec![
                (first.as_str(), BUNDLE_MEDIA_TYPE),
                (second.as_str(), BUNDLE_MEDIA_TYPE)
            ]
        );
        let referrer: Value = http
            .get(format!("{base}/manifests/{first}"))
            .header("accept", OCI_MANIFEST)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        assert_eq!(referrer["subject"]["digest"], digest.as_str());
        assert_eq!(referrer["layers"][0]["mediaType"], BUNDLE_MEDIA_TYPE);
    }

    #[test]
    fn references_without_a_digest_are_refused() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let err = rt
            .block_on(attach("127.0.0.1:1/mesh:tag", b"{}"))
            .unwrap_err();
        assert_eq!(err.category(), "reference", "{err}");
    }
}
