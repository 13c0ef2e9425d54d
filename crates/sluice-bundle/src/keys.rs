//! Signing and verification keys, in cosign's file formats.
//!
//! Owns loading a private key (cosign's `ENCRYPTED SIGSTORE PRIVATE KEY` / older
//! `ENCRYPTED COSIGN PRIVATE KEY` PEM, scrypt + secretbox, as `cosign generate-key-pair` writes
//! it; or an unencrypted PKCS#8 `PRIVATE KEY`), loading public keys (`PUBLIC KEY` PEM, as
//! `cosign.pub`), generating key pairs, and fingerprints that name a key in messages.
//! ECDSA (P-256 is cosign's default) and Ed25519 keys are supported. It must never log or
//! format key material or passwords: `Debug` shows fingerprints only.

use std::path::Path;

use sha2::{Digest, Sha256};
use sigstore::crypto::signing_key::SigStoreKeyPair;
use sigstore::crypto::{CosignVerificationKey, SigStoreSigner, Signature, SigningScheme};

use crate::error::{BundleError, Result};

fn key_error(location: &str, reason: impl Into<String>) -> BundleError {
    BundleError::Key {
        location: location.to_string(),
        reason: reason.into(),
    }
}

/// A public key that signatures are verified against.
pub struct PublicKey {
    pem: String,
    fingerprint: String,
    key: CosignVerificationKey,
}

impl std::fmt::Debug for PublicKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PublicKey")
            .field("fingerprint", &self.fingerprint)
            .finish()
    }
}

impl Clone for PublicKey {
    fn clone(&self) -> Self {
        Self::from_pem(self.pem.as_bytes(), "a clone").expect("a parsed key parses again")
    }
}

/// `SHA256:<first 16 hex of sha256(DER SubjectPublicKeyInfo)>`.
fn fingerprint_of_pem(pem: &str) -> String {
    let der: Vec<u8> = pem
        .lines()
        .filter(|line| !line.starts_with("-----"))
        .collect::<String>()
        .into_bytes();
    // Hash the base64 body decoded; fall back to the text itself if it is not base64.
    use base64::Engine;
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(&der)
        .unwrap_or(der);
    let hex = hex::encode(Sha256::digest(&bytes));
    format!("SHA256:{}", &hex[..16])
}

impl PublicKey {
    /// Parses a PEM public key (`-----BEGIN PUBLIC KEY-----`). `location` names it in errors.
    pub fn from_pem(pem: &[u8], location: &str) -> Result<Self> {
        let key = CosignVerificationKey::try_from_pem(pem).map_err(|e| {
            key_error(
                location,
                format!("not a PEM public key cosign can use (ECDSA or Ed25519): {e}"),
            )
        })?;
        let pem = String::from_utf8_lossy(pem).into_owned();
        Ok(Self {
            fingerprint: fingerprint_of_pem(&pem),
            pem,
            key,
        })
    }

    /// Reads a PEM public key file.
    pub fn from_file(path: &Path) -> Result<Self> {
        let pem =
            std::fs::read(path).map_err(|e| BundleError::io("reading public key", path, e))?;
        Self::from_pem(&pem, &path.display().to_string())
    }

    /// The PEM text.
    pub fn pem(&self) -> &str {
        &self.pem
    }

    /// A short, stable name of this key for messages and status.
    pub fn fingerprint(&self) -> &str {
        &self.fingerprint
    }

    /// Whether `signature_b64` (base64, as in cosign's annotation) signs `payload` with this key.
    pub fn verifies(&self, payload: &[u8], signature_b64: &str) -> bool {
        self.key
            .verify_signature(Signature::Base64Encoded(signature_b64.as_bytes()), payload)
            .is_ok()
    }

    /// Whether the raw signature bytes `signature` sign `message` with this key (DSSE and
    /// sigstore bundles carry raw signatures, base64 in their JSON).
    pub fn verifies_raw(&self, message: &[u8], signature: &[u8]) -> bool {
        self.key
            .verify_signature(Signature::Raw(signature), message)
            .is_ok()
    }
}

/// A private key that signs bundles.
pub struct SigningKey {
    signer: SigStoreSigner,
    public: PublicKey,
}

impl std::fmt::Debug for SigningKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SigningKey")
            .field("public", &self.public.fingerprint)
            .finish()
    }
}

/// The two files of a generated key pair, as `cosign generate-key-pair` writes them.
#[derive(Clone)]
pub struct KeyPairPem {
    /// `cosign.key`: the encrypted private key PEM.
    pub private_pem: String,
    /// `cosign.pub`: the public key PEM.
    pub public_pem: String,
}

impl std::fmt::Debug for KeyPairPem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KeyPairPem")
            .field("public", &fingerprint_of_pem(&self.public_pem))
            .finish()
    }
}

impl SigningKey {
    fn from_signer(signer: SigStoreSigner, location: &str) -> Result<Self> {
        let pem = signer
            .to_sigstore_keypair()
            .and_then(|pair| pair.public_key_to_pem())
            .map_err(|e| key_error(location, format!("cannot derive the public key: {e}")))?;
        let public = PublicKey::from_pem(pem.as_bytes(), location)?;
        Ok(Self { signer, public })
    }

    /// A fresh ECDSA P-256 key (cosign's default), in memory.
    pub fn generate() -> Result<Self> {
        let signer = SigningScheme::ECDSA_P256_SHA256_ASN1
            .create_signer()
            .map_err(|e| key_error("a new key", format!("key generation failed: {e}")))?;
        Self::from_signer(signer, "a new key")
    }

    /// Parses a private key PEM: encrypted (cosign/sigstore) with `password`, or unencrypted
    /// PKCS#8 (then `password` is ignored). `location` names it in errors.
    pub fn from_pem(pem: &[u8], password: &[u8], location: &str) -> Result<Self> {
        let text = String::from_utf8_lossy(pem);
        let pair = if text.contains("ENCRYPTED") {
            SigStoreKeyPair::from_encrypted_pem(pem, password).map_err(|e| {
                key_error(
                    location,
                    format!(
                        "cannot decrypt the private key (wrong password, or not a cosign key): {e}"
                    ),
                )
            })?
        } else {
            SigStoreKeyPair::from_pem(pem)
                .map_err(|e| key_error(location, format!("not a PEM private key: {e}")))?
        };
        let signer = match &pair {
            SigStoreKeyPair::ECDSA(keys) => keys.to_sigstore_signer(),
            SigStoreKeyPair::ED25519(_) => pair.to_sigstore_signer(&SigningScheme::ED25519),
            SigStoreKeyPair::RSA(_) => {
                return Err(key_error(
                    location,
                    "RSA keys are not supported; use an ECDSA P-256 key (cosign generate-key-pair)",
                ));
            }
        }
        .map_err(|e| key_error(location, format!("cannot build a signer: {e}")))?;
        Self::from_signer(signer, location)
    }

    /// Reads a private key file; see [`SigningKey::from_pem`].
    pub fn from_file(path: &Path, password: &[u8]) -> Result<Self> {
        let pem =
            std::fs::read(path).map_err(|e| BundleError::io("reading private key", path, e))?;
        Self::from_pem(&pem, password, &path.display().to_string())
    }

    /// The matching public key.
    pub fn public_key(&self) -> &PublicKey {
        &self.public
    }

    /// Signs `payload`; returns the base64 signature as cosign stores it in its annotation.
    pub fn sign(&self, payload: &[u8]) -> Result<String> {
        use base64::Engine;
        let raw = self
            .signer
            .sign(payload)
            .map_err(|e| key_error(&self.public.fingerprint, format!("signing failed: {e}")))?;
        Ok(base64::engine::general_purpose::STANDARD.encode(raw))
    }

    /// Exports the private key encrypted with `password`, in cosign's format.
    pub fn to_encrypted_pem(&self, password: &[u8]) -> Result<String> {
        let pair = self
            .signer
            .to_sigstore_keypair()
            .map_err(|e| key_error(&self.public.fingerprint, format!("cannot export: {e}")))?;
        let pem = pair
            .private_key_to_encrypted_pem(password)
            .map_err(|e| key_error(&self.public.fingerprint, format!("cannot encrypt: {e}")))?;
        Ok(pem.to_string())
    }

    /// Exports the private key unencrypted (PKCS#8 PEM). For tests and throwaway keys only.
    pub fn to_unencrypted_pem(&self) -> Result<String> {
        let pair = self
            .signer
            .to_sigstore_keypair()
            .map_err(|e| key_error(&self.public.fingerprint, format!("cannot export: {e}")))?;
        let pem = pair
            .private_key_to_pem()
            .map_err(|e| key_error(&self.public.fingerprint, format!("cannot export: {e}")))?;
        Ok(pem.to_string())
    }
}

/// Generates a key pair like `cosign generate-key-pair`: an ECDSA P-256 private key encrypted
/// with `password` (may be empty) and its public key.
pub fn generate_key_pair(password: &[u8]) -> Result<KeyPairPem> {
    let key = SigningKey::generate()?;
    Ok(KeyPairPem {
        private_pem: key.to_encrypted_pem(password)?,
        public_pem: key.public_key().pem().to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signatures_verify_only_with_the_matching_key_and_payload() {
        let one = SigningKey::generate().unwrap();
        let two = SigningKey::generate().unwrap();
        let payload = br#"{"critical":{}}"#;
        let signature = one.sign(payload).unwrap();
        assert!(one.public_key().verifies(payload, &signature));
        assert!(!two.public_key().verifies(payload, &signature));
        assert!(!one.public_key().verifies(b"{\"critical\":{}} ", &signature));
        assert!(!one.public_key().verifies(payload, "bm90IGEgc2lnbmF0dXJl"));
        assert_ne!(
            one.public_key().fingerprint(),
            two.public_key().fingerprint()
        );
    }

    #[test]
    fn unencrypted_pem_round_trips_and_debug_hides_key_material() {
        let key = SigningKey::generate().unwrap();
        let pem = key.to_unencrypted_pem().unwrap();
        let back = SigningKey::from_pem(pem.as_bytes(), b"", "test").unwrap();
        assert_eq!(
            back.public_key().fingerprint(),
            key.public_key().fingerprint()
        );
        let debug = format!("{key:?}");
        assert!(!debug.contains("PRIVATE"), "{debug}");
        assert!(debug.contains(key.public_key().fingerprint()));
    }

    #[test]
    fn generated_pair_is_cosign_encrypted_and_needs_the_password() {
        let pair = generate_key_pair(b"s3cret").unwrap();
        assert!(
            pair.private_pem
                .contains("-----BEGIN ENCRYPTED SIGSTORE PRIVATE KEY-----"),
            "cosign v2+ label expected"
        );
        assert!(pair.public_pem.contains("-----BEGIN PUBLIC KEY-----"));
        let key =
            SigningKey::from_pem(pair.private_pem.as_bytes(), b"s3cret", "cosign.key").unwrap();
        let public = PublicKey::from_pem(pair.public_pem.as_bytes(), "cosign.pub").unwrap();
        assert_eq!(key.public_key().fingerprint(), public.fingerprint());
        let signature = key.sign(b"payload").unwrap();
        assert!(public.verifies(b"payload", &signature));

        let err =
            SigningKey::from_pem(pair.private_pem.as_bytes(), b"wrong", "cosign.key").unwrap_err();
        assert_eq!(err.category(), "Key");
        assert!(err.to_string().contains("wrong password"), "{err}");
        assert!(!format!("{pair:?}").contains("PRIVATE"));
    }

    #[test]
    fn bad_keys_are_reported_with_their_location() {
        let err = PublicKey::from_pem(b"garbage", "keys/a.pub").unwrap_err();
        assert_eq!(err.category(), "Key");
        assert!(err.to_string().contains("keys/a.pub"), "{err}");
        let err = SigningKey::from_pem(b"garbage", b"", "keys/a.key").unwrap_err();
        assert!(err.to_string().contains("keys/a.key"), "{err}");
    }
}
