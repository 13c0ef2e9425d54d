//! Registry I/O for bundles: push, pull, sign, verify, inspect.
//!
//! Owns every network call of the crate, through `oci-client`. Plain HTTP is used for loopback
//! registries (127.0.0.0/8, `localhost`, `[::1]`) not listed in [`RegistryOptions::tls_hosts`]
//! and for hosts listed in [`RegistryOptions::plain_http_hosts`]; everything else is HTTPS,
//! trusting the system roots and [`RegistryOptions::ca_bundle`]. Credentials come per registry
//! (or repository prefix) from [`RegistryOptions::credentials`] (a Docker config), for pushes
//! and reads alike. The decisions (bundle layout,
//! digests, the signature verdict) live in the pure modules; this one only fetches and stores.
//! It must never verify by tag (every signature call requires a `@sha256:` reference), never
//! write a bundle's tag before its blobs, and never log credentials.
//!
//! Reads (manifests, blobs, signatures) go through [`crate::fetch`]: only registries on
//! [`RegistryOptions::allowed_registries`] (when set), bytes counted as they arrive, a deadline
//! per request, redirects to other hosts without credentials, at most
//! [`MAX_SIGNATURE_LAYERS`] signatures read per digest. Pushes use `oci-client`.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::Duration;

use oci_client::client::{ClientConfig, ClientProtocol};
use oci_client::errors::{OciDistributionError, OciErrorCode};
use oci_client::secrets::RegistryAuth;
use oci_client::{Client, Reference};
use serde::Serialize;

use crate::artifact::{self, Artifact, MANIFEST_MEDIA_TYPE};
use crate::error::{BundleError, Result};
use crate::keys::{PublicKey, SigningKey};
use crate::manifests::{BundleObject, GroupKind};
use crate::signature::{self, Policy, SIMPLE_SIGNING_MEDIA_TYPE, SignatureLayer, Verified};
use crate::sigstore_bundle::{self as sb, StoredBundle};

/// Largest config blob or signature payload read (1 MiB): they are a few hundred bytes.
const MAX_SMALL_BLOB: u64 = 1024 * 1024;

/// Most signatures read from one digest's signature tag: a key rotation leaves a few; a tag
/// listing more is refused before any is downloaded.
pub const MAX_SIGNATURE_LAYERS: usize = 32;

/// How to reach registries.
#[derive(Clone, Debug, Default)]
pub struct RegistryOptions {
    /// Extra `host:port`s spoken to over plain HTTP (loopback is, unless in `tls_hosts`).
    pub plain_http_hosts: Vec<String>,
    /// Loopback `host:port`s spoken to over HTTPS (a local registry serving TLS).
    pub tls_hosts: Vec<String>,
    /// Basic credentials `(username, password)` for every registry without an entry in
    /// `credentials`; anonymous when `None`.
    pub basic_auth: Option<(String, String)>,
    /// Credentials per registry (or repository prefix), from a Docker config.
    pub credentials: crate::credentials::RegistryCredentials,
    /// CA certificates trusted for registries' TLS besides the system roots.
    pub ca_bundle: Option<crate::credentials::CaBundle>,
    /// Longest silence while reading an answer; 30 s when `None`. A whole manifest request may
    /// take twice that, a blob ten times.
    pub timeout: Option<Duration>,
    /// Registries (`host` or `host:port`) bundles may be read from; empty: any. A reference to
    /// another registry is refused before anything is sent to it.
    pub allowed_registries: Vec<String>,
    /// Most bytes a bundle's layer may unpack to (its files together);
    /// [`crate::archive::MAX_UNPACKED_BYTES`] (64 MiB) when `None`. A larger bundle is refused
    /// before its layer is downloaded when the layer alone is larger, else while unpacking.
    pub max_unpacked_bytes: Option<u64>,
}

/// A parsed bundle reference.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BundleRef {
    /// `host[:port]`.
    pub registry: String,
    /// Repository path.
    pub repository: String,
    /// Tag, if given.
    pub tag: Option<String>,
    /// Digest, if given.
    pub digest: Option<String>,
}

impl BundleRef {
    /// Parses `host[:port]/repo[:tag][@sha256:hex]`. The registry host is required (no implicit
    /// Docker Hub), since bundles live in the platform's own registry.
    pub fn parse(input: &str) -> Result<Self> {
        let invalid = |reason: &str| BundleError::InvalidReference {
            what: "reference",
            value: input.to_string(),
            reason: reason.to_string(),
        };
        let input_trimmed = input.trim_start_matches("oci://");
        let (first, _) = input_trimmed
            .split_once('/')
            .ok_or_else(|| invalid("expected <registry>/<repository>[:tag][@sha256:...]"))?;
        if !(first.contains('.') || first.contains(':') || first == "localhost") {
            return Err(invalid(
                "the first path component must be a registry host (e.g. registry.example:5000/mesh/config)",
            ));
        }
        let parsed: Reference = input_trimmed
            .parse()
            .map_err(|e| invalid(&format!("{e}")))?;
        if let Some(digest) = parsed.digest() {
            signature::signature_tag(digest)?;
        }
        // The parser defaults a missing tag to "latest"; keep "no tag" as no tag.
        let without_digest = input_trimmed.split('@').next().unwrap_or_default();
        let has_tag = without_digest
            .rsplit('/')
            .next()
            .is_some_and(|last| last.contains(':'));
        Ok(Self {
            registry: parsed.registry().to_string(),
            repository: parsed.repository().to_string(),
            tag: parsed.tag().filter(|_| has_tag).map(str::to_string),
            digest: parsed.digest().map(str::to_string),
        })
    }

    /// The bundle an Argo CD OCI source names: `repo_url` is its `repoURL`
    /// (`oci://registry/repository`), `revision` its `targetRevision` or its reported synced
    /// revision (a `sha256:` digest, or a tag).
    pub fn from_oci_source(repo_url: &str, revision: &str) -> Result<Self> {
        let repository = repo_url.trim_start_matches("oci://").trim_end_matches('/');
        if revision.starts_with("sha256:") {
            Self::parse(&format!("{repository}@{revision}"))
        } else {
            Self::parse(&format!("{repository}:{revision}"))
        }
    }

    /// `registry/repository`.
    pub fn repository_ref(&self) -> String {
        format!("{}/{}", self.registry, self.repository)
    }

    /// `registry/repository@digest`, or an error naming the input if there is no digest.
    pub fn digest_ref(&self) -> Result<String> {
        match &self.digest {
            Some(d) => Ok(format!("{}@{d}", self.repository_ref())),
            None => Err(BundleError::DigestRequired {
                reference: self.to_string(),
            }),
        }
    }

    fn with_digest(&self, digest: &str) -> Reference {
        Reference::with_digest(
            self.registry.clone(),
            self.repository.clone(),
            digest.to_string(),
        )
    }

    fn with_tag(&self, tag: &str) -> Reference {
        Reference::with_tag(
            self.registry.clone(),
            self.repository.clone(),
            tag.to_string(),
        )
    }

    fn oci(&self) -> Reference {
        match (&self.tag, &self.digest) {
            (_, Some(d)) => self.with_digest(d),
            (Some(t), None) => self.with_tag(t),
            (None, None) => self.with_tag("latest"),
        }
    }
}

impl std::fmt::Display for BundleRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.repository_ref())?;
        if let Some(tag) = &self.tag {
            write!(f, ":{tag}")?;
        }
        if let Some(digest) = &self.digest {
            write!(f, "@{digest}")?;
        }
        Ok(())
    }
}

/// Whether `registry` is spoken to over plain HTTP: listed in `plain_http_hosts`, or a loopback
/// address not listed in `tls_hosts`.
pub(crate) fn plain_http(
    registry: &str,
    plain_http_hosts: &[String],
    tls_hosts: &[String],
) -> bool {
    plain_http_hosts.iter().any(|h| h == registry)
        || (is_loopback_host(registry) && !tls_hosts.iter().any(|h| h == registry))
}

/// Whether `host[:port]` is a loopback address.
pub fn is_loopback_host(host: &str) -> bool {
    let name = if let Some(rest) = host.strip_prefix('[') {
        rest.split(']').next().unwrap_or("")
    } else {
        host.rsplit_once(':').map_or(host, |(h, _)| h)
    };
    name == "localhost"
        || name == "::1"
        || name
            .parse::<std::net::Ipv4Addr>()
            .is_ok_and(|ip| ip.is_loopback())
}

/// Where a bundle was pushed.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Pushed {
    /// `registry/repository@sha256:...`: the name to sign, verify and pin.
    pub reference: String,
    /// The manifest digest.
    pub manifest_digest: String,
    /// The content digest.
    pub content_digest: String,
    /// The tag written, if any.
    pub tag: Option<String>,
}

/// What a signature push did.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Signed {
    /// The digest reference signed.
    pub reference: String,
    /// `registry/repository:sha256-<hex>.sig`.
    pub signature_reference: String,
    /// Fingerprint of the signing key.
    pub key_fingerprint: String,
    /// Signatures stored at the tag after this call.
    pub signatures: usize,
    /// False when this key had already signed this digest (nothing was written).
    pub added: bool,
}

/// A bundle whose signature verified, with its content.
#[derive(Debug)]
pub struct VerifiedBundle {
    /// The signature verdict.
    pub verified: Verified,
    /// The bundle, every digest checked.
    pub artifact: Artifact,
}

impl VerifiedBundle {
    /// The objects to apply.
    pub fn objects(&self) -> &[BundleObject] {
        self.artifact.manifests.objects()
    }

    /// An estimate of the memory this bundle holds: its blobs, its files and its parsed objects.
    pub fn memory_bytes(&self) -> u64 {
        let a = &self.artifact;
        let blobs = (a.manifest_bytes.len() + a.config.len() + a.layer.len()) as u64;
        let files: u64 = a
            .manifests
            .files()
            .iter()
            .map(|f| (f.path.len() + f.contents.len()) as u64)
            .sum();
        blobs + files + objects_bytes(a.manifests.objects())
    }
}

/// An estimate of the memory parsed objects hold.
fn objects_bytes(objects: &[BundleObject]) -> u64 {
    objects
        .iter()
        .map(|o| {
            crate::cache::json_bytes(&o.value)
                + (o.api_version.len() + o.name.len() + o.source.len()) as u64
        })
        .sum()
}

/// What applying a verified bundle needs of it: the signature verdict, the content digest and
/// the parsed objects, without the blobs and the files they were parsed from (what revert's
/// byte-bounded cache of verified bundles keeps).
#[derive(Clone, Debug)]
pub struct VerifiedObjects {
    /// The signature verdict.
    pub verified: Verified,
    /// The bundle's content digest (`sha256:<hex>`).
    pub content_digest: String,
    objects: Vec<BundleObject>,
}

impl VerifiedObjects {
    /// The objects to apply, sorted by (group, kind, namespace, name).
    pub fn objects(&self) -> &[BundleObject] {
        &self.objects
    }

    /// The objects whose group and kind are not in `allowed` (empty when all are allowed).
    pub fn objects_outside<'a>(&'a self, allowed: &[GroupKind]) -> Vec<&'a BundleObject> {
        self.objects
            .iter()
            .filter(|o| !allowed.contains(&o.group_kind))
            .collect()
    }

    /// An estimate of the memory this holds: the parsed objects and the two digests.
    pub fn memory_bytes(&self) -> u64 {
        objects_bytes(&self.objects)
            + (self.verified.digest.len()
                + self.verified.key_fingerprint.len()
                + self.verified.docker_reference.len()
                + self.content_digest.len()) as u64
    }
}

impl From<VerifiedBundle> for VerifiedObjects {
    fn from(bundle: VerifiedBundle) -> Self {
        let content_digest = bundle.artifact.content_digest().to_owned();
        Self {
            verified: bundle.verified,
            content_digest,
            objects: bundle.artifact.manifests.into_objects(),
        }
    }
}

/// What `inspect` reports.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Inspection {
    /// What was inspected (reference or layout path).
    pub reference: String,
    /// The manifest digest (Argo CD's synced revision).
    pub manifest_digest: String,
    /// The content digest, recomputed from the layer.
    pub content_digest: String,
    /// `org.opencontainers.image.revision`.
    pub source_commit: Option<String>,
    /// `org.opencontainers.image.created`.
    pub created: Option<String>,
    /// `artifactType`.
    pub artifact_type: Option<String>,
    /// Layer digest.
    pub layer_digest: String,
    /// Layer size in bytes.
    pub layer_size: u64,
    /// Object count.
    pub objects: usize,
    /// Objects per kind (`Kind.group`).
    pub kinds: BTreeMap<String, usize>,
    /// Manifest files inside.
    pub files: Vec<String>,
    /// All manifest annotations.
    pub annotations: BTreeMap<String, String>,
    /// Signatures stored at the cosign tag (unverified count); `None` for a local layout.
    pub signatures: Option<usize>,
}

/// Builds the inspection of an artifact (pure).
pub fn inspection(artifact: &Artifact, reference: &str, signatures: Option<usize>) -> Inspection {
    let annotations = artifact.manifest.annotations.clone();
    let layer = artifact.content_layer();
    Inspection {
        reference: reference.to_string(),
        manifest_digest: artifact.manifest_digest.clone(),
        content_digest: artifact.content_digest().to_string(),
        source_commit: annotations.get(artifact::ANNOTATION_REVISION).cloned(),
        created: annotations.get(artifact::ANNOTATION_CREATED).cloned(),
        artifact_type: artifact.manifest.artifact_type.clone(),
        layer_digest: layer.digest.clone(),
        layer_size: layer.size,
        objects: artifact.manifests.objects().len(),
        kinds: artifact
            .manifests
            .kinds()
            .into_iter()
            .map(|(k, n)| (k.to_string(), n))
            .collect(),
        files: artifact
            .manifests
            .files()
            .iter()
            .map(|f| f.path.clone())
            .collect(),
        annotations,
        signatures,
    }
}

/// A registry client for bundles.
pub struct BundleClient {
    options: RegistryOptions,
    clients: Mutex<BTreeMap<String, Client>>,
    fetcher: crate::fetch::Fetcher,
}

impl std::fmt::Debug for BundleClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BundleClient")
            .field("plain_http_hosts", &self.options.plain_http_hosts)
            .field("authenticated", &self.options.basic_auth.is_some())
            .field("credentials", &self.options.credentials)
            .field("ca_bundle", &self.options.ca_bundle)
            .finish()
    }
}

impl BundleClient {
    /// A client with these options.
    pub fn new(options: RegistryOptions) -> Self {
        let fetcher = crate::fetch::Fetcher::new(&options);
        Self {
            options,
            clients: Mutex::new(BTreeMap::new()),
            fetcher,
        }
    }

    /// Most bytes a bundle's layer may unpack to.
    pub fn max_unpacked_bytes(&self) -> u64 {
        self.options
            .max_unpacked_bytes
            .unwrap_or(crate::archive::MAX_UNPACKED_BYTES)
    }

    fn read_timeout(&self) -> Duration {
        self.options.timeout.unwrap_or(Duration::from_secs(30))
    }

    /// Refuses a registry that is not on the allowlist (when there is one).
    pub fn check_allowed(&self, registry: &str) -> Result<()> {
        if crate::fetch::registry_allowed(registry, &self.options.allowed_registries) {
            Ok(())
        } else {
            Err(BundleError::RegistryNotAllowed {
                registry: registry.to_owned(),
                allowed: self.options.allowed_registries.join(", "),
            })
        }
    }

    /// The push client for `registry` and the credential it authenticates with (oci-client
    /// keeps one credential per registry per client).
    fn client(&self, registry: &str, auth: &RegistryAuth) -> Client {
        let who = match auth {
            RegistryAuth::Basic(user, _) => format!("basic:{user}"),
            RegistryAuth::Bearer(_) => "bearer".to_owned(),
            RegistryAuth::Anonymous => "anonymous".to_owned(),
        };
        let mut clients = self.clients.lock().unwrap_or_else(|p| p.into_inner());
        clients
            .entry(format!("{registry}|{who}"))
            .or_insert_with(|| {
                let plain = plain_http(
                    registry,
                    &self.options.plain_http_hosts,
                    &self.options.tls_hosts,
                );
                let timeout = self.options.timeout.unwrap_or(Duration::from_secs(30));
                Client::new(ClientConfig {
                    protocol: if plain {
                        ClientProtocol::Http
                    } else {
                        ClientProtocol::Https
                    },
                    read_timeout: Some(timeout),
                    connect_timeout: Some(Duration::from_secs(5).min(timeout)),
                    platform_resolver: None,
                    extra_root_certificates: self
                        .options
                        .ca_bundle
                        .iter()
                        .flat_map(|ca| ca.pem_blocks())
                        .map(|pem| oci_client::client::Certificate {
                            encoding: oci_client::client::CertificateEncoding::Pem,
                            data: pem.as_bytes().to_vec(),
                        })
                        .collect(),
                    ..ClientConfig::default()
                })
            })
            .clone()
    }

    /// The credential pushes to `repository` on `registry` use: its registry config entry,
    /// else the client-wide basic credentials, else none.
    fn auth(&self, registry: &str, repository: &str) -> Result<RegistryAuth> {
        use crate::credentials::Credential;
        match self
            .options
            .credentials
            .for_repository(registry, repository)
        {
            Some(Credential::Basic { username, password }) => {
                Ok(RegistryAuth::Basic(username.clone(), password.clone()))
            }
            Some(Credential::IdentityToken { .. }) => Err(BundleError::Unauthorized {
                registry: registry.to_owned(),
                reference: format!("{registry}/{repository}"),
                action: "push".to_owned(),
                reason: "its registry config entry holds an identitytoken, which is used for \
                         reads only; push with a username and password (or access token)"
                    .to_owned(),
            }),
            None => Ok(match &self.options.basic_auth {
                Some((user, password)) => RegistryAuth::Basic(user.clone(), password.clone()),
                None => RegistryAuth::Anonymous,
            }),
        }
    }

    fn map_err(
        &self,
        err: OciDistributionError,
        registry: &str,
        reference: &str,
        action: &str,
    ) -> BundleError {
        let not_found = |envelope: &oci_client::errors::OciEnvelope| {
            envelope.errors.iter().any(|e| {
                matches!(
                    e.code,
                    OciErrorCode::ManifestUnknown
                        | OciErrorCode::BlobUnknown
                        | OciErrorCode::NameUnknown
                        | OciErrorCode::NotFound
                )
            })
        };
        let unauthorized = match &err {
            OciDistributionError::UnauthorizedError { .. }
            | OciDistributionError::AuthenticationFailure(_)
            | OciDistributionError::ServerError { code: 401, .. } => true,
            OciDistributionError::RequestError(e) => {
                e.status() == Some(reqwest::StatusCode::UNAUTHORIZED)
            }
            OciDistributionError::RegistryError { envelope, .. } => envelope
                .errors
                .iter()
                .any(|e| matches!(e.code, OciErrorCode::Unauthorized)),
            _ => false,
        };
        if unauthorized {
            let repository = reference
                .strip_prefix(registry)
                .map(|r| r.trim_start_matches('/'))
                .unwrap_or(reference);
            let repository = repository.split(['@', ':']).next().unwrap_or(repository);
            let tried = match self.auth(registry, repository) {
                Ok(RegistryAuth::Basic(user, _)) => {
                    format!("the registry refused the credentials of user {user:?}")
                }
                _ => self.options.credentials.missing_reason(registry),
            };
            return BundleError::Unauthorized {
                registry: registry.to_owned(),
                reference: reference.to_owned(),
                action: action.to_owned(),
                reason: tried,
            };
        }
        match err {
            OciDistributionError::RequestError(e)
                if e.is_connect() || e.is_timeout() || e.is_request() =>
            {
                BundleError::RegistryUnavailable {
                    registry: registry.to_string(),
                    action: action.to_string(),
                    reason: crate::fetch::transport(&e),
                }
            }
            OciDistributionError::ImageManifestNotFoundError(_) => BundleError::NotFound {
                reference: reference.to_string(),
                action: action.to_string(),
            },
            OciDistributionError::RegistryError { envelope, .. } if not_found(&envelope) => {
                BundleError::NotFound {
                    reference: reference.to_string(),
                    action: action.to_string(),
                }
            }
            OciDistributionError::ServerError { code: 404, .. } => BundleError::NotFound {
                reference: reference.to_string(),
                action: action.to_string(),
            },
            OciDistributionError::ServerError { code, message, .. } if code >= 500 => {
                BundleError::RegistryUnavailable {
                    registry: registry.to_string(),
                    action: action.to_string(),
                    reason: format!("HTTP {code}: {message}"),
                }
            }
            OciDistributionError::DigestError(
                oci_client::errors::DigestError::VerificationError { expected, actual },
            ) => BundleError::DigestMismatch {
                subject: format!("{reference} (content served by the registry)"),
                expected,
                actual,
            },
            other => BundleError::Registry {
                reference: reference.to_string(),
                action: action.to_string(),
                reason: other.to_string(),
            },
        }
    }

    async fn push_blob(&self, target: &BundleRef, data: &[u8], digest: &str) -> Result<()> {
        let auth = self.auth(&target.registry, &target.repository)?;
        let client = self.client(&target.registry, &auth);
        let reference = target.with_digest(digest);
        client.store_auth_if_needed(&target.registry, &auth).await;
        let exists = client.blob_exists(&reference, digest).await.map_err(|e| {
            self.map_err(
                e,
                &target.registry,
                &target.repository_ref(),
                "check a blob",
            )
        })?;
        if exists {
            return Ok(());
        }
        client
            .push_blob(&reference, data.to_vec(), digest)
            .await
            .map_err(|e| {
                self.map_err(e, &target.registry, &target.repository_ref(), "push a blob")
            })?;
        Ok(())
    }

    async fn push_manifest(
        &self,
        reference: &Reference,
        bytes: &[u8],
        registry: &str,
    ) -> Result<()> {
        let auth = self.auth(registry, reference.repository())?;
        let client = self.client(registry, &auth);
        client.store_auth_if_needed(registry, &auth).await;
        client
            .push_manifest_raw(
                reference,
                bytes.to_vec(),
                http::HeaderValue::from_static(MANIFEST_MEDIA_TYPE),
            )
            .await
            .map_err(|e| self.map_err(e, registry, &reference.whole(), "push a manifest"))?;
        Ok(())
    }

    async fn pull_manifest(&self, reference: &Reference, registry: &str) -> Result<Vec<u8>> {
        self.check_allowed(registry)?;
        let name = reference
            .digest()
            .or(reference.tag())
            .unwrap_or("latest")
            .to_owned();
        self.fetcher
            .get(
                registry,
                reference.repository(),
                "manifests",
                &name,
                Some(MANIFEST_MEDIA_TYPE),
                reference.digest(),
                crate::fetch::Limits {
                    max_bytes: crate::fetch::MAX_MANIFEST_BYTES,
                    deadline: self.read_timeout() * 2,
                },
                "pull a manifest",
            )
            .await
    }

    /// Pulls a blob: at most its declared size is received, and it must hash to its digest.
    async fn pull_blob(
        &self,
        target: &BundleRef,
        descriptor: &artifact::Descriptor,
    ) -> Result<Vec<u8>> {
        self.check_allowed(&target.registry)?;
        self.fetcher
            .get(
                &target.registry,
                &target.repository,
                "blobs",
                &descriptor.digest,
                None,
                Some(&descriptor.digest),
                crate::fetch::Limits {
                    max_bytes: descriptor.size,
                    deadline: self.read_timeout() * 10,
                },
                "pull a blob",
            )
            .await
    }

    /// Pushes a rendered bundle: blobs first, then the manifest by digest, then (if `target`
    /// has one) the tag. `target` is `registry/repository[:tag]`.
    pub async fn push(&self, artifact: &Artifact, target: &str) -> Result<Pushed> {
        let target = BundleRef::parse(target)?;
        if target.digest.is_some() {
            return Err(BundleError::InvalidReference {
                what: "push target",
                value: target.to_string(),
                reason:
                    "a push target names a repository and optionally a tag; the digest is computed"
                        .into(),
            });
        }
        self.push_blob(&target, &artifact.config, &artifact.manifest.config.digest)
            .await?;
        self.push_blob(&target, &artifact.layer, &artifact.content_layer().digest)
            .await?;
        self.push_manifest(
            &target.with_digest(&artifact.manifest_digest),
            &artifact.manifest_bytes,
            &target.registry,
        )
        .await?;
        if let Some(tag) = &target.tag {
            self.push_manifest(
                &target.with_tag(tag),
                &artifact.manifest_bytes,
                &target.registry,
            )
            .await?;
        }
        Ok(Pushed {
            reference: format!("{}@{}", target.repository_ref(), artifact.manifest_digest),
            manifest_digest: artifact.manifest_digest.clone(),
            content_digest: artifact.content_digest().to_string(),
            tag: target.tag.clone(),
        })
    }

    /// Resolves a reference (tag or digest) to its manifest digest.
    pub async fn resolve(&self, reference: &str) -> Result<String> {
        let target = BundleRef::parse(reference)?;
        let bytes = self.pull_manifest(&target.oci(), &target.registry).await?;
        Ok(artifact::sha256_digest(&bytes))
    }

    /// Pulls a bundle by tag or digest and checks every digest along the way (manifest, layer,
    /// content annotation). Pulling by tag is for inspection; pin and verify by digest.
    pub async fn pull(&self, reference: &str) -> Result<Artifact> {
        let target = BundleRef::parse(reference)?;
        let manifest_bytes = self.pull_manifest(&target.oci(), &target.registry).await?;
        let (manifest, layer) =
            artifact::parse_bundle_manifest(&manifest_bytes, &target.to_string())?;
        let max_unpacked = self.max_unpacked_bytes();
        if layer.size > max_unpacked || manifest.config.size > MAX_SMALL_BLOB {
            return Err(BundleError::not_a_bundle(
                target.to_string(),
                format!(
                    "layer of {} bytes or config of {} bytes is larger than a bundle may be (layer at most {max_unpacked} bytes, the unpacked-size limit; config at most {MAX_SMALL_BLOB})",
                    layer.size, manifest.config.size
                ),
            ));
        }
        let config = self.pull_blob(&target, &manifest.config).await?;
        let layer_bytes = self.pull_blob(&target, &layer).await?;
        artifact::from_parts_limited(
            manifest_bytes,
            config,
            layer_bytes,
            target.digest.as_deref(),
            &target.to_string(),
            max_unpacked,
        )
    }

    /// The signature layers stored at `digest`'s cosign tag (empty when there is no tag).
    async fn signature_layers(
        &self,
        target: &BundleRef,
        digest: &str,
    ) -> Result<(String, Vec<SignatureLayer>, Vec<artifact::Descriptor>)> {
        let tag = signature::signature_tag(digest)?;
        let manifest_bytes = match self
            .pull_manifest(&target.with_tag(&tag), &target.registry)
            .await
        {
            Ok(bytes) => bytes,
            Err(BundleError::NotFound { .. }) => return Ok((tag, Vec::new(), Vec::new())),
            Err(other) => return Err(other),
        };
        let manifest: artifact::ImageManifest =
            serde_json::from_slice(&manifest_bytes).map_err(|e| {
                BundleError::not_a_bundle(
                    format!("{}:{tag}", target.repository_ref()),
                    format!("signature tag does not hold an OCI manifest: {e}"),
                )
            })?;
        let signing: Vec<_> = manifest
            .layers
            .iter()
            .filter(|l| l.media_type == SIMPLE_SIGNING_MEDIA_TYPE)
            .collect();
        if signing.len() > MAX_SIGNATURE_LAYERS {
            return Err(BundleError::not_a_bundle(
                format!("{}:{tag}", target.repository_ref()),
                format!(
                    "the signature tag lists {} signatures, more than the {MAX_SIGNATURE_LAYERS} \
                     read; prune old signatures from the tag",
                    signing.len()
                ),
            ));
        }
        let mut layers = Vec::new();
        for descriptor in signing {
            if descriptor.size > MAX_SMALL_BLOB {
                return Err(BundleError::not_a_bundle(
                    format!("{}:{tag}", target.repository_ref()),
                    format!(
                        "a signature payload of {} bytes is not a cosign payload",
                        descriptor.size
                    ),
                ));
            }
            let payload = self.pull_blob(target, descriptor).await?;
            layers.push(SignatureLayer {
                payload,
                signature: descriptor
                    .annotations
                    .get(signature::SIGNATURE_ANNOTATION)
                    .cloned(),
            });
        }
        Ok((tag, layers, manifest.layers))
    }

    /// The sigstore bundles attached to `digest` as OCI referrers: listed by the referrers API
    /// (`GET /v2/<repo>/referrers/<digest>`), or, where the registry has none (404), by the
    /// referrers tag schema's index at tag `sha256-<hex>`. Only referrers whose `artifactType` is
    /// a sigstore bundle are read (and not attestations of another predicate), at most
    /// [`MAX_SIGNATURE_LAYERS`], each bundle at most 1 MiB, every read through the capped fetcher.
    async fn signature_bundles(
        &self,
        target: &BundleRef,
        digest: &str,
    ) -> Result<Vec<StoredBundle>> {
        self.check_allowed(&target.registry)?;
        let limits = crate::fetch::Limits {
            max_bytes: crate::fetch::MAX_MANIFEST_BYTES,
            deadline: self.read_timeout() * 2,
        };
        let listed = self
            .fetcher
            .get(
                &target.registry,
                &target.repository,
                "referrers",
                digest,
                Some(sb::IMAGE_INDEX_MEDIA_TYPE),
                None,
                limits,
                "list the referrers of",
            )
            .await;
        let index_bytes = match listed {
            Ok(bytes) => bytes,
            Err(BundleError::NotFound { .. }) => {
                let tag = sb::referrers_tag(digest)?;
                match self
                    .fetcher
                    .get(
                        &target.registry,
                        &target.repository,
                        "manifests",
                        &tag,
                        Some(sb::IMAGE_INDEX_MEDIA_TYPE),
                        None,
                        limits,
                        "read the referrers tag of",
                    )
                    .await
                {
                    Ok(bytes) => bytes,
                    Err(BundleError::NotFound { .. }) => return Ok(Vec::new()),
                    Err(other) => return Err(other),
                }
            }
            Err(other) => return Err(other),
        };
        let where_ = format!("{}@{digest} (referrers)", target.repository_ref());
        #[derive(serde::Deserialize)]
        struct Index {
            #[serde(default)]
            manifests: Vec<artifact::Descriptor>,
        }
        let index: Index = serde_json::from_slice(&index_bytes).map_err(|e| {
            BundleError::not_a_bundle(
                where_.clone(),
                format!("the referrers list is not an OCI image index: {e}"),
            )
        })?;
        let candidates: Vec<_> = index
            .manifests
            .iter()
            .filter(|d| {
                d.artifact_type
                    .as_deref()
                    .is_some_and(sb::is_bundle_media_type)
            })
            .filter(|d| {
                d.annotations
                    .get(sb::PREDICATE_TYPE_ANNOTATION)
                    .is_none_or(|p| p == sb::COSIGN_SIGN_PREDICATE_TYPE)
            })
            .collect();
        if candidates.len() > MAX_SIGNATURE_LAYERS {
            return Err(BundleError::not_a_bundle(
                where_,
                format!(
                    "{} sigstore signature bundles are attached, more than the \
                     {MAX_SIGNATURE_LAYERS} read; delete old signatures",
                    candidates.len()
                ),
            ));
        }
        let mut bundles = Vec::new();
        for descriptor in candidates {
            let manifest_bytes = self
                .pull_manifest(&target.with_digest(&descriptor.digest), &target.registry)
                .await?;
            let manifest: artifact::ImageManifest = serde_json::from_slice(&manifest_bytes)
                .map_err(|e| {
                    BundleError::not_a_bundle(
                        format!("{}@{}", target.repository_ref(), descriptor.digest),
                        format!("a signature referrer is not an OCI image manifest: {e}"),
                    )
                })?;
            for layer in manifest
                .layers
                .iter()
                .filter(|l| sb::is_bundle_media_type(&l.media_type))
            {
                if layer.size > MAX_SMALL_BLOB {
                    return Err(BundleError::not_a_bundle(
                        format!("{}@{}", target.repository_ref(), descriptor.digest),
                        format!(
                            "a signature bundle of {} bytes is not a cosign bundle",
                            layer.size
                        ),
                    ));
                }
                bundles.push(StoredBundle {
                    bytes: self.pull_blob(target, layer).await?,
                    referrer: descriptor.digest.clone(),
                });
            }
        }
        Ok(bundles)
    }

    /// Signs the manifest digest of `reference` (which must carry `@sha256:...`) in cosign's tag
    /// layout, appending to the signatures already there. Signing twice with the same key adds
    /// nothing. The bundle must exist in the registry.
    pub async fn sign(&self, reference: &str, key: &SigningKey) -> Result<Signed> {
        let target = BundleRef::parse(reference)?;
        let digest_ref = target.digest_ref()?;
        let digest = target.digest.clone().unwrap_or_default();
        // The bundle must exist: never sign a digest nobody can pull.
        self.pull_manifest(&target.with_digest(&digest), &target.registry)
            .await?;
        let (tag, existing, mut descriptors) = self.signature_layers(&target, &digest).await?;
        let signature_reference = format!("{}:{tag}", target.repository_ref());
        let already = existing.iter().any(|layer| {
            layer
                .signature
                .as_deref()
                .is_some_and(|s| key.public_key().verifies(&layer.payload, s))
                && serde_json::from_slice::<signature::Payload>(&layer.payload)
                    .is_ok_and(|p| p.critical.image.docker_manifest_digest == digest)
        });
        if already {
            return Ok(Signed {
                reference: digest_ref,
                signature_reference,
                key_fingerprint: key.public_key().fingerprint().to_string(),
                signatures: existing.len(),
                added: false,
            });
        }
        let payload = signature::payload(&target.repository_ref(), &digest);
        let signature_b64 = key.sign(&payload)?;
        let descriptor = signature::signature_descriptor(&payload, &signature_b64);
        self.push_blob(&target, &payload, &descriptor.digest)
            .await?;
        descriptors.push(descriptor);
        let count = descriptors
            .iter()
            .filter(|d| d.media_type == SIMPLE_SIGNING_MEDIA_TYPE)
            .count();
        let image = signature::signature_image(descriptors);
        self.push_blob(
            &target,
            &image.config,
            &artifact::sha256_digest(&image.config),
        )
        .await?;
        self.push_manifest(
            &target.with_tag(&tag),
            &image.manifest_bytes,
            &target.registry,
        )
        .await?;
        Ok(Signed {
            reference: digest_ref,
            signature_reference,
            key_fingerprint: key.public_key().fingerprint().to_string(),
            signatures: count,
            added: true,
        })
    }

    /// Verifies the cosign signature of `reference`'s digest (a tag is refused) against `keys`
    /// (any one suffices). The bundle manifest must exist at that digest.
    pub async fn verify(&self, reference: &str, keys: &[PublicKey]) -> Result<Verified> {
        self.verify_with(reference, &Policy::keys(keys)).await
    }

    /// Verifies the signatures of `reference`'s digest (a tag is refused) under `policy`: both
    /// cosign's legacy `.sig` tag and the sigstore bundles among its OCI referrers are read, and
    /// one signature by a signer the policy names suffices (see [`signature::verdict`]). The
    /// bundle manifest must exist at that digest.
    pub async fn verify_with(&self, reference: &str, policy: &Policy) -> Result<Verified> {
        let target = BundleRef::parse(reference)?;
        let digest_ref = target.digest_ref()?;
        let digest = target.digest.clone().unwrap_or_default();
        self.pull_manifest(&target.with_digest(&digest), &target.registry)
            .await?;
        let (tag, layers, _) = self.signature_layers(&target, &digest).await?;
        let bundles = self.signature_bundles(&target, &digest).await?;
        signature::verdict(
            &digest,
            &layers,
            &bundles,
            policy,
            &digest_ref,
            &format!(
                "tag {}:{tag} nor among its OCI referrers (sigstore bundles)",
                target.repository_ref()
            ),
        )
    }

    /// Verifies the signature on `reference`'s digest, then pulls the bundle at that digest with
    /// every digest checked: what an operator calls before applying anything.
    pub async fn verify_and_pull(
        &self,
        reference: &str,
        keys: &[PublicKey],
    ) -> Result<VerifiedBundle> {
        self.verify_and_pull_with(reference, &Policy::keys(keys))
            .await
    }

    /// [`BundleClient::verify_and_pull`] under a full [`Policy`] (keys, keyless identities,
    /// repository binding).
    pub async fn verify_and_pull_with(
        &self,
        reference: &str,
        policy: &Policy,
    ) -> Result<VerifiedBundle> {
        let verified = self.verify_with(reference, policy).await?;
        let artifact = self.pull(reference).await?;
        Ok(VerifiedBundle { verified, artifact })
    }

    /// Inspects a bundle in a registry (tag or digest): digests, source commit, kinds, and how
    /// many signatures its cosign tag holds (unverified).
    pub async fn inspect(&self, reference: &str) -> Result<Inspection> {
        let target = BundleRef::parse(reference)?;
        let artifact = self.pull(reference).await?;
        let (_, layers, _) = self
            .signature_layers(&target, &artifact.manifest_digest)
            .await?;
        let bundles = self
            .signature_bundles(&target, &artifact.manifest_digest)
            .await?;
        Ok(inspection(
            &artifact,
            &target.to_string(),
            Some(layers.len() + bundles.len()),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn references_parse_and_require_a_registry_host() {
        let d = format!("sha256:{}", "a".repeat(64));
        // (input, Some((registry, repository, tag, has digest)) or None for a parse error)
        type Want = Option<(&'static str, &'static str, Option<&'static str>, bool)>;
        let cases: Vec<(String, Want)> = vec![
            (
                "127.0.0.1:5000/mesh/config:v1".into(),
                Some(("127.0.0.1:5000", "mesh/config", Some("v1"), false)),
            ),
            (
                format!("127.0.0.1:5000/mesh@{d}"),
                Some(("127.0.0.1:5000", "mesh", None, true)),
            ),
            (
                format!("oci://registry.example/mesh@{d}"),
                Some(("registry.example", "mesh", None, true)),
            ),
            (
                "localhost/mesh".into(),
                Some(("localhost", "mesh", None, false)),
            ),
            ("mesh/config:v1".into(), None),
            ("nohost".into(), None),
            ("127.0.0.1:5000/mesh@sha256:short".into(), None),
        ];
        for (input, want) in cases {
            match (BundleRef::parse(&input), want) {
                (Ok(r), Some((registry, repository, tag, has_digest))) => {
                    assert_eq!(r.registry, registry, "{input}");
                    assert_eq!(r.repository, repository, "{input}");
                    assert_eq!(r.tag.as_deref(), tag, "{input}");
                    assert_eq!(r.digest.is_some(), has_digest, "{input}");
                }
                (Err(e), None) => assert_eq!(e.category(), "InvalidReference", "{input}: {e}"),
                (got, want) => panic!("{input}: got {got:?}, want {want:?}"),
            }
        }
    }

    #[test]
    fn argo_cd_oci_sources_map_to_references() {
        let d = format!("sha256:{}", "b".repeat(64));
        let by_digest = BundleRef::from_oci_source("oci://127.0.0.1:5000/mesh/config", &d).unwrap();
        assert_eq!(
            by_digest.digest_ref().unwrap(),
            format!("127.0.0.1:5000/mesh/config@{d}")
        );
        let by_tag = BundleRef::from_oci_source("oci://127.0.0.1:5000/mesh/config/", "v1").unwrap();
        assert_eq!(by_tag.tag.as_deref(), Some("v1"));
        assert_eq!(
            by_tag.digest_ref().unwrap_err().category(),
            "DigestRequired"
        );
    }

    #[test]
    fn what_is_kept_of_a_verified_bundle_is_its_objects_not_its_blobs_or_files() {
        let route = |i: usize| {
            format!(
                "apiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata: {{name: r{i}, namespace: shop}}\nspec:\n  rules:\n  - backendRefs:\n    - {{name: v1, port: 8080, weight: 90}}\n    - {{name: v2, port: 8080, weight: 10}}\n"
            )
        };
        let files: Vec<crate::ManifestFile> = (0..50)
            .map(|i| crate::ManifestFile {
                path: format!("r{i}.yaml"),
                contents: route(i).into_bytes(),
            })
            .collect();
        let manifests = crate::Manifests::from_files(files).unwrap();
        let artifact = artifact::render(&manifests, &artifact::Metadata::default()).unwrap();
        let bundle = VerifiedBundle {
            verified: Verified {
                digest: artifact.manifest_digest.clone(),
                key_fingerprint: "SHA256:k".into(),
                key_index: 0,
                docker_reference: String::new(),
                format: crate::signature::FORMAT_LEGACY_TAG.into(),
            },
            artifact,
        };
        let whole = bundle.memory_bytes();
        let a = &bundle.artifact;
        let blobs_and_files = (a.manifest_bytes.len() + a.config.len() + a.layer.len()) as u64
            + a.manifests
                .files()
                .iter()
                .map(|f| (f.path.len() + f.contents.len()) as u64)
                .sum::<u64>();
        let objects = bundle.objects().to_vec();
        let content_digest = bundle.artifact.content_digest().to_owned();
        let kept = VerifiedObjects::from(bundle);
        assert_eq!(kept.objects(), objects.as_slice());
        assert_eq!(kept.content_digest, content_digest);
        assert_eq!(kept.verified.key_fingerprint, "SHA256:k");
        // The blobs and the files are gone: what is kept counts the objects and the digests.
        let expected: u64 = objects
            .iter()
            .map(|o| {
                crate::cache::json_bytes(&o.value)
                    + (o.api_version.len() + o.name.len() + o.source.len()) as u64
            })
            .sum::<u64>()
            + (kept.verified.digest.len() + "SHA256:k".len() + kept.content_digest.len()) as u64;
        assert_eq!(kept.memory_bytes(), expected);
        assert!(
            // Two digests and a fingerprint besides the objects.
            kept.memory_bytes() <= whole - blobs_and_files + 200,
            "kept {} of the bundle's {whole} bytes, of which {blobs_and_files} are blobs and files",
            kept.memory_bytes()
        );
        // A cache sized for the objects keeps them; the whole bundle would not fit.
        eprintln!(
            "50 HTTPRoutes: whole bundle {whole} bytes, kept {} bytes",
            kept.memory_bytes()
        );
        let mut cache = crate::ByteLru::new(kept.memory_bytes());
        assert!(!crate::ByteLru::<()>::new(kept.memory_bytes()).insert(
            "w".into(),
            std::sync::Arc::new(()),
            whole
        ));
        let bytes = kept.memory_bytes();
        assert!(cache.insert("k".into(), std::sync::Arc::new(kept), bytes));
    }

    #[test]
    fn inspection_reports_the_content_layer_even_when_it_is_not_first() {
        let dir = std::env::temp_dir().join(format!("sluice-l16-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(
            dir.join("cm.yaml"),
            "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: a, namespace: b}\n",
        )
        .unwrap();
        let (manifests, _) =
            crate::Manifests::read_dir(&dir, &crate::ReadOptions::default()).unwrap();
        let _ = std::fs::remove_dir_all(&dir);
        let a = artifact::render(&manifests, &artifact::Metadata::default()).unwrap();
        // An extra non-content layer listed first (Argo CD ignores it).
        let mut manifest: serde_json::Value = serde_json::from_slice(&a.manifest_bytes).unwrap();
        let content = manifest["layers"][0].clone();
        let mut extra = content.clone();
        extra["mediaType"] = "application/vnd.example.readme".into();
        extra["digest"] = format!("sha256:{}", "0".repeat(64)).into();
        manifest["layers"] = serde_json::json!([extra, content]);
        let bytes = serde_json::to_vec(&manifest).unwrap();
        let b = artifact::from_parts(bytes, a.config.clone(), a.layer.clone(), None, "t").unwrap();
        let seen = inspection(&b, "t", None);
        assert_eq!(seen.layer_digest, a.content_layer().digest);
        assert_ne!(seen.layer_digest, b.manifest.layers[0].digest);
    }

    #[test]
    fn digest_ref_refuses_tags() {
        let r = BundleRef::parse("127.0.0.1:5000/mesh:latest").unwrap();
        let err = r.digest_ref().unwrap_err();
        assert_eq!(err.category(), "DigestRequired");
        assert!(err.to_string().contains("never a tag"), "{err}");
    }

    #[test]
    fn loopback_hosts() {
        for (host, want) in [
            ("127.0.0.1:5000", true),
            ("127.8.9.1", true),
            ("localhost:5000", true),
            ("[::1]:5000", true),
            ("registry.example:5000", false),
            ("10.0.0.1:5000", false),
        ] {
            assert_eq!(is_loopback_host(host), want, "{host}");
        }
    }
}
