//! Keyless (certificate) signatures in sigstore bundles, judged offline against a trusted root
//! (pure, no I/O).
//!
//! Owns the checks that make a certificate signature trusted, all from the bundle and a
//! `trusted_root.json` the platform configures (nothing is fetched):
//!
//! 1. the bundle carries a transparency-log entry whose signed entry timestamp (SET, the log's
//!    inclusion promise) verifies with a log key of the trusted root, and whose body is this very
//!    signature (kind `dsse`: the payload hash and the signature match the envelope);
//! 2. the signing certificate chains to a certificate authority of the trusted root (the Fulcio
//!    role), with the code-signing extended key usage, valid at the log's integration time, which
//!    also lies within the authority's `validFor`;
//! 3. the envelope's signature verifies with the certificate's key;
//! 4. the certificate's identity (a subject alternative name: email or URI) and its OIDC issuer
//!    (Fulcio's extension 1.3.6.1.4.1.57264.1.8, or the older 1.1) match one of the configured
//!    [`Identity`] constraints, exactly or by a fully anchored regular expression.
//!
//! Not checked: the certificate's embedded SCTs (the trusted root's `ctlogs`), timestamp
//! authorities (a bundle needs a log entry), and Merkle inclusion proofs (the SET is the log's
//! signed promise of inclusion).

use std::collections::BTreeMap;

use serde::Deserialize;
use sha2::{Digest, Sha256};
use sigstore::crypto::{CosignVerificationKey, Signature};

use crate::error::{BundleError, Result};
use crate::sigstore_bundle::{self as sb, Claim, Decoded, Outcome, b64};

/// Fulcio's OIDC issuer extension (DER UTF8String).
const OID_ISSUER_V2: &str = "1.3.6.1.4.1.57264.1.8";
/// Fulcio's older OIDC issuer extension (raw string).
const OID_ISSUER_V1: &str = "1.3.6.1.4.1.57264.1.1";
/// id-kp-codeSigning, DER value bytes of 1.3.6.1.5.5.7.3.3.
const CODE_SIGNING_OID: &[u8] = &[0x2b, 0x06, 0x01, 0x05, 0x05, 0x07, 0x03, 0x03];

/// A string constraint: exact, or a regular expression that must match the whole value.
#[derive(Clone, Debug)]
pub enum Matcher {
    /// Equal to this string.
    Exact(String),
    /// Matches this expression, anchored at both ends.
    Regex(regex::Regex),
}

impl Matcher {
    /// A regular-expression matcher; the expression is anchored (`^(?:...)$`). `what` names the
    /// field in errors.
    pub fn regex(expression: &str, what: &str) -> Result<Self> {
        regex::Regex::new(&format!("^(?:{expression})$"))
            .map(Matcher::Regex)
            .map_err(|e| BundleError::Key {
                location: what.to_string(),
                reason: format!("not a valid regular expression: {e}"),
            })
    }

    fn matches(&self, value: &str) -> bool {
        match self {
            Matcher::Exact(s) => s == value,
            Matcher::Regex(r) => r.is_match(value),
        }
    }
}

impl std::fmt::Display for Matcher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Matcher::Exact(s) => write!(f, "{s:?}"),
            Matcher::Regex(r) => write!(f, "/{}/", r.as_str()),
        }
    }
}

/// One trusted keyless signer: a certificate identity from an OIDC issuer.
#[derive(Clone, Debug)]
pub struct Identity {
    /// The certificate identity (an email or URI subject alternative name).
    pub subject: Matcher,
    /// The OIDC issuer recorded in the certificate.
    pub issuer: Matcher,
}

impl std::fmt::Display for Identity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} from issuer {}", self.subject, self.issuer)
    }
}

/// What a verification trusts for keyless signatures.
#[derive(Clone, Debug)]
pub struct Keyless {
    /// The certificate authorities and transparency logs.
    pub trusted_root: TrustedRoot,
    /// The identities that may sign; at least one must match.
    pub identities: Vec<Identity>,
}

/// A certificate authority of the trusted root.
#[derive(Clone, Debug)]
struct Authority {
    /// DER certificates, the issuing one first, the root last.
    chain: Vec<Vec<u8>>,
    valid_for: Window,
}

/// A transparency log of the trusted root.
#[derive(Clone)]
struct Log {
    key_id: Vec<u8>,
    key: std::sync::Arc<CosignVerificationKey>,
    valid_for: Window,
}

#[derive(Clone, Copy, Debug)]
struct Window {
    start: Option<i64>,
    end: Option<i64>,
}

impl Window {
    fn contains(&self, t: i64) -> bool {
        self.start.is_none_or(|s| s <= t) && self.end.is_none_or(|e| t <= e)
    }
}

/// A sigstore `trusted_root.json` (the certificate authorities and transparency logs read).
#[derive(Clone, Debug)]
pub struct TrustedRoot {
    authorities: Vec<Authority>,
    logs: Vec<Log>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct RootJson {
    #[serde(default)]
    certificate_authorities: Vec<AuthorityJson>,
    #[serde(default)]
    tlogs: Vec<LogJson>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct AuthorityJson {
    cert_chain: sb::CertificateChain,
    #[serde(default)]
    valid_for: Option<WindowJson>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct LogJson {
    public_key: PublicKeyJson,
    log_id: sb::LogId,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct PublicKeyJson {
    raw_bytes: String,
    #[serde(default)]
    valid_for: Option<WindowJson>,
}

#[derive(Deserialize)]
struct WindowJson {
    #[serde(default)]
    start: Option<String>,
    #[serde(default)]
    end: Option<String>,
}

fn window(json: Option<WindowJson>, location: &str) -> Result<Window> {
    let parse = |t: Option<String>| -> Result<Option<i64>> {
        t.map(|t| {
            t.parse::<jiff::Timestamp>()
                .map(|ts| ts.as_second())
                .map_err(|e| root_error(location, format!("validFor time {t:?}: {e}")))
        })
        .transpose()
    };
    let json = json.unwrap_or(WindowJson {
        start: None,
        end: None,
    });
    Ok(Window {
        start: parse(json.start)?,
        end: parse(json.end)?,
    })
}

fn root_error(location: &str, reason: impl Into<String>) -> BundleError {
    BundleError::Key {
        location: format!("trusted root {location}"),
        reason: reason.into(),
    }
}

impl TrustedRoot {
    /// Parses a `trusted_root.json` (sigstore's `application/vnd.dev.sigstore.trustedroot+json`).
    /// `location` names it in errors. It must name at least one certificate authority and one
    /// transparency log.
    pub fn from_json(bytes: &[u8], location: &str) -> Result<Self> {
        let root: RootJson = serde_json::from_slice(bytes)
            .map_err(|e| root_error(location, format!("not a trusted_root.json: {e}")))?;
        let mut authorities = Vec::new();
        for (i, ca) in root.certificate_authorities.into_iter().enumerate() {
            let chain = ca
                .cert_chain
                .certificates
                .iter()
                .map(|c| b64(&c.raw_bytes))
                .collect::<Option<Vec<_>>>()
                .filter(|c| !c.is_empty())
                .ok_or_else(|| {
                    root_error(
                        location,
                        format!("certificateAuthorities[{i}] has no base64 certificate chain"),
                    )
                })?;
            for der in &chain {
                x509_parser::parse_x509_certificate(der).map_err(|e| {
                    root_error(
                        location,
                        format!("certificateAuthorities[{i}]: not a DER certificate: {e}"),
                    )
                })?;
            }
            authorities.push(Authority {
                chain,
                valid_for: window(ca.valid_for, location)?,
            });
        }
        let mut logs = Vec::new();
        for (i, log) in root.tlogs.into_iter().enumerate() {
            let der = b64(&log.public_key.raw_bytes)
                .ok_or_else(|| root_error(location, format!("tlogs[{i}]: key is not base64")))?;
            let key = CosignVerificationKey::try_from_der(&der)
                .map_err(|e| root_error(location, format!("tlogs[{i}]: not a public key: {e}")))?;
            let key_id = b64(&log.log_id.key_id)
                .ok_or_else(|| root_error(location, format!("tlogs[{i}]: logId not base64")))?;
            logs.push(Log {
                key_id,
                key: std::sync::Arc::new(key),
                valid_for: window(log.public_key.valid_for, location)?,
            });
        }
        if authorities.is_empty() || logs.is_empty() {
            return Err(root_error(
                location,
                "names no certificate authority or no transparency log; keyless verification \
                 needs both (certificateAuthorities, tlogs)",
            ));
        }
        Ok(Self { authorities, logs })
    }
}

impl std::fmt::Debug for Log {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Log")
            .field("key_id", &hex::encode(&self.key_id))
            .finish()
    }
}

/// The canonical JSON a log signs as its SET (RFC 8785: sorted keys, no spaces; every value
/// here is a string or an integer, which serde_json writes canonically).
fn set_message(entry: &sb::TlogEntry, integrated: i64, index: i64) -> Vec<u8> {
    let key_id = b64(&entry.log_id.key_id).unwrap_or_default();
    let value = serde_json::json!({
        "body": entry.canonicalized_body,
        "integratedTime": integrated,
        "logID": hex::encode(key_id),
        "logIndex": index,
    });
    // serde_json's map is sorted (no preserve_order feature in this crate's use).
    serde_json::to_vec(&value).unwrap_or_default()
}

#[derive(Deserialize)]
struct DsseBody {
    kind: String,
    spec: DsseSpec,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct DsseSpec {
    payload_hash: HashJson,
    #[serde(default)]
    signatures: Vec<BodySignature>,
}

#[derive(Deserialize)]
struct HashJson {
    value: String,
}

#[derive(Deserialize)]
struct BodySignature {
    signature: String,
}

impl Keyless {
    /// Judges one decoded bundle whose verification material is a certificate.
    pub(crate) fn judge(&self, decoded: &Decoded, digest: &str) -> Outcome {
        match self.check(decoded) {
            Err(why) => Outcome::Untrusted(why),
            Ok(signer) => match sb::claim(&decoded.payload, digest) {
                Claim::Signs => Outcome::Verified {
                    signer,
                    key_index: None,
                },
                Claim::SignsOther(other) => Outcome::SignsOther(other),
                Claim::NotASignature(why) => Outcome::Ignored(why),
            },
        }
    }

    /// Every check but the claim; `Ok` names the signer.
    fn check(&self, decoded: &Decoded) -> std::result::Result<String, String> {
        let material = &decoded.bundle.verification_material;
        let chain: Vec<Vec<u8>> = match (&material.certificate, &material.x509_certificate_chain) {
            (Some(c), _) => vec![b64(&c.raw_bytes).ok_or("the certificate is not base64")?],
            (None, Some(chain)) => chain
                .certificates
                .iter()
                .map(|c| b64(&c.raw_bytes))
                .collect::<Option<Vec<_>>>()
                .ok_or("the certificate chain is not base64")?,
            (None, None) => return Err("no certificate".into()),
        };
        let leaf_der = chain.first().ok_or("an empty certificate chain")?;
        let (_, leaf) = x509_parser::parse_x509_certificate(leaf_der)
            .map_err(|e| format!("the signing certificate is not DER: {e}"))?;

        // 1. The log's promise, for this signature.
        let integrated = self.logged_time(decoded)?;

        // 2. The chain to a trusted authority, at the logged time.
        let (not_before, not_after) = (
            leaf.validity().not_before.timestamp(),
            leaf.validity().not_after.timestamp(),
        );
        if integrated < not_before || integrated > not_after {
            return Err(format!(
                "the log integrated the signature at {integrated}, outside the certificate's \
                 validity [{not_before}, {not_after}]"
            ));
        }
        self.chain_trusted(leaf_der, &chain[1..], integrated)?;

        // 3. The signature, with the certificate's key.
        let key = CosignVerificationKey::try_from_der(leaf.public_key().raw)
            .map_err(|e| format!("the certificate's key is not usable: {e}"))?;
        let message = sb::pae(sb::INTOTO_PAYLOAD_TYPE, &decoded.payload);
        if !decoded
            .signatures
            .iter()
            .any(|s| key.verify_signature(Signature::Raw(s), &message).is_ok())
        {
            return Err(
                "the envelope's signature does not verify with its certificate's key (the \
                 payload was altered)"
                    .into(),
            );
        }

        // 4. Identity and issuer.
        let names = subject_names(&leaf);
        let issuer = oidc_issuer(&leaf).ok_or(
            "the certificate records no OIDC issuer (extension 1.3.6.1.4.1.57264.1.8 or .1.1)",
        )?;
        for identity in &self.identities {
            if identity.issuer.matches(&issuer)
                && let Some(name) = names.iter().find(|n| identity.subject.matches(n))
            {
                return Ok(format!("keyless:{name} ({issuer})"));
            }
        }
        Err(format!(
            "certificate identity {} from issuer {issuer:?} is not one the pin names ({})",
            if names.is_empty() {
                "(none)".to_string()
            } else {
                names
                    .iter()
                    .map(|n| format!("{n:?}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            },
            self.identities
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join("; ")
        ))
    }

    /// The integration time of a log entry whose SET verifies and whose body is this signature.
    fn logged_time(&self, decoded: &Decoded) -> std::result::Result<i64, String> {
        let entries = &decoded.bundle.verification_material.tlog_entries;
        if entries.is_empty() {
            return Err(
                "the bundle has no transparency-log entry; a keyless signature needs the log's \
                 promise to date its short-lived certificate"
                    .into(),
            );
        }
        let mut why = Vec::new();
        for entry in entries {
            match self.entry_time(entry, decoded) {
                Ok(t) => return Ok(t),
                Err(e) => why.push(e),
            }
        }
        Err(why.join("; "))
    }

    fn entry_time(
        &self,
        entry: &sb::TlogEntry,
        decoded: &Decoded,
    ) -> std::result::Result<i64, String> {
        let integrated: i64 = entry
            .integrated_time
            .parse()
            .map_err(|_| "a log entry's integratedTime is not a number")?;
        let index: i64 = entry
            .log_index
            .parse()
            .map_err(|_| "a log entry's logIndex is not a number")?;
        let key_id = b64(&entry.log_id.key_id).ok_or("a log entry's logId is not base64")?;
        let log = self
            .trusted_root
            .logs
            .iter()
            .find(|l| l.key_id == key_id)
            .ok_or_else(|| {
                format!(
                    "the log entry comes from log {}, not a log of the trusted root",
                    hex::encode(&key_id)
                )
            })?;
        if !log.valid_for.contains(integrated) {
            return Err("the log entry is outside its log key's validFor".into());
        }
        let set = entry
            .inclusion_promise
            .as_ref()
            .and_then(|p| b64(&p.signed_entry_timestamp))
            .ok_or("the log entry has no signed entry timestamp (inclusionPromise)")?;
        log.key
            .verify_signature(Signature::Raw(&set), &set_message(entry, integrated, index))
            .map_err(
                |_| "the log entry's signed entry timestamp does not verify with the log's key",
            )?;
        let body = b64(&entry.canonicalized_body).ok_or("the log entry body is not base64")?;
        let body: DsseBody =
            serde_json::from_slice(&body).map_err(|_| "the log entry body is not a dsse entry")?;
        if body.kind != "dsse" {
            return Err(format!(
                "the log entry is of kind {:?}; only dsse entries are read",
                body.kind
            ));
        }
        if body.spec.payload_hash.value != hex::encode(Sha256::digest(&decoded.payload)) {
            return Err("the log entry records another payload than the envelope's".into());
        }
        let logged: Vec<Vec<u8>> = body
            .spec
            .signatures
            .iter()
            .filter_map(|s| b64(&s.signature))
            .collect();
        if !decoded.signatures.iter().any(|s| logged.contains(s)) {
            return Err("the log entry records another signature than the envelope's".into());
        }
        Ok(integrated)
    }

    fn chain_trusted(
        &self,
        leaf: &[u8],
        extra: &[Vec<u8>],
        at: i64,
    ) -> std::result::Result<(), String> {
        use rustls_pki_types::{CertificateDer, UnixTime};
        let end_entity = CertificateDer::from(leaf);
        let end_entity = webpki::EndEntityCert::try_from(&end_entity)
            .map_err(|e| format!("the signing certificate is not usable: {e:?}"))?;
        let time = UnixTime::since_unix_epoch(std::time::Duration::from_secs(at.max(0) as u64));
        let mut why = Vec::new();
        for authority in &self.trusted_root.authorities {
            if !authority.valid_for.contains(at) {
                why.push("an authority not valid at the logged time".to_string());
                continue;
            }
            let Some((root, intermediates)) = authority.chain.split_last() else {
                continue;
            };
            let root_der = CertificateDer::from(root.as_slice());
            let anchor = match webpki::anchor_from_trusted_cert(&root_der) {
                Ok(a) => a.to_owned(),
                Err(e) => {
                    why.push(format!("an unusable root: {e:?}"));
                    continue;
                }
            };
            let inter: Vec<CertificateDer<'_>> = intermediates
                .iter()
                .chain(extra.iter())
                .map(|c| CertificateDer::from(c.as_slice()))
                .collect();
            match end_entity.verify_for_usage(
                webpki::ALL_VERIFICATION_ALGS,
                &[anchor],
                &inter,
                time,
                webpki::KeyUsage::required(CODE_SIGNING_OID),
                None,
                None,
            ) {
                Ok(_) => return Ok(()),
                Err(e) => why.push(format!("{e:?}")),
            }
        }
        Err(format!(
            "the signing certificate does not chain to a certificate authority of the trusted \
             root ({})",
            why.join("; ")
        ))
    }
}

/// Email and URI subject alternative names.
fn subject_names(cert: &x509_parser::certificate::X509Certificate<'_>) -> Vec<String> {
    use x509_parser::extensions::GeneralName;
    let Ok(Some(san)) = cert.subject_alternative_name() else {
        return Vec::new();
    };
    san.value
        .general_names
        .iter()
        .filter_map(|n| match n {
            GeneralName::RFC822Name(s) | GeneralName::URI(s) => Some(s.to_string()),
            _ => None,
        })
        .collect()
}

/// The OIDC issuer Fulcio recorded.
fn oidc_issuer(cert: &x509_parser::certificate::X509Certificate<'_>) -> Option<String> {
    let by_oid: BTreeMap<String, &[u8]> = cert
        .extensions()
        .iter()
        .map(|e| (e.oid.to_id_string(), e.value))
        .collect();
    if let Some(value) = by_oid.get(OID_ISSUER_V2) {
        // DER UTF8String: tag 0x0c, a length, the text.
        return der_utf8(value);
    }
    by_oid
        .get(OID_ISSUER_V1)
        .and_then(|v| std::str::from_utf8(v).ok())
        .map(str::to_string)
}

fn der_utf8(value: &[u8]) -> Option<String> {
    let (&tag, rest) = value.split_first()?;
    if tag != 0x0c {
        return None;
    }
    let (&first, rest) = rest.split_first()?;
    let (len, rest) = if first < 0x80 {
        (first as usize, rest)
    } else {
        let n = (first & 0x7f) as usize;
        if n == 0 || n > 2 || rest.len() < n {
            return None;
        }
        let len = rest[..n].iter().fold(0usize, |a, b| (a << 8) | *b as usize);
        (len, &rest[n..])
    };
    (rest.len() == len)
        .then(|| std::str::from_utf8(rest).ok().map(str::to_string))
        .flatten()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn der_utf8_reads_short_and_long_forms() {
        assert_eq!(der_utf8(b"\x0c\x05hello").as_deref(), Some("hello"));
        let long = "x".repeat(200);
        let mut v = vec![0x0c, 0x81, 200];
        v.extend_from_slice(long.as_bytes());
        assert_eq!(der_utf8(&v).as_deref(), Some(long.as_str()));
        assert_eq!(der_utf8(b"\x0c\x09short"), None);
        assert_eq!(der_utf8(b"\x13\x05hello"), None);
    }

    #[test]
    fn regex_matchers_are_anchored() {
        let m = Matcher::regex("https://github.com/acme/.+", "subjectRegExp").unwrap();
        assert!(
            m.matches("https://github.com/acme/mesh/.github/workflows/sign.yml@refs/heads/main")
        );
        assert!(!m.matches("https://evil.example/?https://github.com/acme/x"));
        assert!(Matcher::regex("(", "subjectRegExp").is_err());
    }

    #[test]
    fn trusted_roots_need_an_authority_and_a_log() {
        let err = TrustedRoot::from_json(b"{}", "cm/trusted_root.json").unwrap_err();
        assert!(
            err.to_string().contains("no certificate authority"),
            "{err}"
        );
        let err = TrustedRoot::from_json(b"\"a string\"", "cm/trusted_root.json").unwrap_err();
        assert!(err.to_string().contains("not a trusted_root.json"), "{err}");
    }
}
