//! Signed, reproducible OCI bundles of mesh configuration.
//!
//! A **bundle** is a directory of Kubernetes manifests rendered into an OCI artifact that Argo CD
//! can use as an OCI source (one `application/vnd.oci.image.layer.v1.tar+gzip` layer holding the
//! manifests; see [`artifact`]), pushed to a registry, named by its **manifest digest**, and signed
//! cosign-style with a key (see [`signature`]). Its **content digest** names the objects alone
//! (see [`manifests`]): the same manifests always give the same content digest, whatever the
//! annotations (source commit, creation time) that change the manifest digest.
//!
//! This crate owns rendering, pushing, signing, verifying and inspecting bundles. It never applies
//! anything to a cluster and never trusts a tag: signatures are verified on a manifest digest.
//!
//! ```no_run
//! # async fn demo() -> sluice_bundle::Result<()> {
//! use sluice_bundle::{BundleClient, Manifests, Metadata, PublicKey, ReadOptions, RegistryOptions, SigningKey};
//! let (manifests, _skipped) = Manifests::read_dir("mesh/".as_ref(), &ReadOptions::default())?;
//! let artifact = sluice_bundle::render(&manifests, &Metadata { source_commit: Some("4f2a9c1".into()), ..Metadata::default() })?;
//! let client = BundleClient::new(RegistryOptions::default());
//! let pushed = client.push(&artifact, "127.0.0.1:5000/mesh/config:4f2a9c1").await?;
//! let key = SigningKey::from_file("cosign.key".as_ref(), b"password")?;
//! client.sign(&pushed.reference, &key).await?;
//! let trusted = [PublicKey::from_file("cosign.pub".as_ref())?];
//! let bundle = client.verify_and_pull(&pushed.reference, &trusted).await?;
//! assert_eq!(bundle.artifact.content_digest(), artifact.content_digest());
//! # Ok(()) }
//! ```
//!
//! # The same signature with the cosign CLI
//!
//! Signatures are stored exactly where and how cosign's legacy (pre-bundle) format stores them,
//! so either tool can produce a signature the other verifies. With cosign v3, key-based and
//! offline (no transparency log), and the tag layout that registries without the referrers API
//! (such as Debian's `docker-registry`) can hold:
//!
//! ```text
//! cosign generate-key-pair                      # writes cosign.key (encrypted) and cosign.pub
//! COSIGN_PASSWORD=... cosign sign --yes --key cosign.key \
//!     --new-bundle-format=false --tlog-upload=false --use-signing-config=false \
//!     registry.example/mesh/config@sha256:<manifest digest>
//! cosign verify --key cosign.pub --insecure-ignore-tlog=true --new-bundle-format=false \
//!     registry.example/mesh/config@sha256:<manifest digest>
//! ```
//!
//! `--use-signing-config=false` is needed from cosign v3.1 on, where `--tlog-upload=false` is
//! otherwise refused; earlier v3 releases accept it too.
//!
//! cosign's current default format is verified too: `cosign sign --key cosign.key
//! --tlog-upload=false --use-signing-config=false <ref>@sha256:...` (v3; v2 with
//! `--new-bundle-format`) attaches a sigstore bundle as an OCI referrer, which
//! [`BundleClient::verify`] reads beside the `.sig` tag (see [`sigstore_bundle`]); keyless
//! bundles verify under a [`Policy`] with a [`Keyless`] trusted root and identities (see
//! [`keyless`]). The `tests/cosign.rs` interop test signs with the real cosign CLI both ways.
//!
//! `kubectl sluice bundle sign --key cosign.key` (password from `$COSIGN_PASSWORD`) reads the same
//! key files and writes the same `sha256-<hex>.sig` tag, simple-signing payload, and
//! `dev.cosignproject.cosign/signature` annotation. Always sign and verify the `@sha256:`
//! reference, never a tag.
#![forbid(unsafe_code)]

pub mod archive;
pub mod artifact;
pub mod cache;
pub mod client;
pub mod credential_helpers;
pub mod credentials;
pub mod error;
pub mod fetch;
pub mod keyless;
pub mod keys;
pub mod manifests;
pub mod signature;
pub mod sigstore_bundle;
pub(crate) mod yaml;

pub use artifact::{Artifact, Metadata, read_layout, render, write_layout};
pub use cache::ByteLru;
pub use client::{
    BundleClient, BundleRef, Inspection, Pushed, RegistryOptions, Signed, VerifiedBundle,
    VerifiedObjects, inspection,
};
pub use credential_helpers::HelperOptions;
pub use credentials::{CaBundle, Credential, RegistryCredentials};
pub use error::{BundleError, Refusal, Result};
pub use keyless::{Identity, Keyless, Matcher, TrustedRoot};
pub use keys::{KeyPairPem, PublicKey, SigningKey, generate_key_pair};
pub use manifests::{BundleObject, GroupKind, ManifestFile, Manifests, ReadOptions, Skipped};
pub use signature::{Policy, Verified};
