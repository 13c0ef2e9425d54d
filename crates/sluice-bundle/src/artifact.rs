//! The OCI artifact of a bundle: media types, annotations, manifest, and the local OCI layout.
//!
//! Owns the layout Argo CD accepts as an OCI source (its repo server requires exactly one content
//! layer, by default of media type `application/vnd.oci.image.layer.v1.tar+gzip`, a tar+gzip of the
//! manifests directory; `path: .` selects its root):
//!
//! ```text
//! manifest  application/vnd.oci.image.manifest.v1+json, artifactType application/vnd.sluice.bundle.v1
//! config    application/vnd.oci.empty.v1+json  ({}), as OCI 1.1 recommends for artifacts
//! layers[0] application/vnd.oci.image.layer.v1.tar+gzip  (see `archive`), title manifests.tar.gz
//! annotations (all optional except the two dev.sluice.bundle.* ones):
//!   dev.sluice.bundle.content-digest   the content digest (see `manifests`)
//!   dev.sluice.bundle.objects          object count
//!   org.opencontainers.image.revision  source commit sha
//!   org.opencontainers.image.source    source repository URL
//!   org.opencontainers.image.created   RFC 3339 creation time
//! ```
//!
//! The manifest is serialized deterministically (fixed field order, sorted annotations), so equal
//! manifests and equal annotations give the same manifest digest. Annotations are covered by the
//! manifest digest, hence by its signature; the content digest annotation is still re-checked
//! against the layer on every read. This module does no network I/O; the layout functions are
//! its only file I/O.

use std::collections::BTreeMap;
use std::path::Path;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::archive;
use crate::error::{BundleError, Result};
use crate::manifests::Manifests;

/// OCI image manifest media type.
pub const MANIFEST_MEDIA_TYPE: &str = "application/vnd.oci.image.manifest.v1+json";
/// `artifactType` of a sluice bundle.
pub const ARTIFACT_TYPE: &str = "application/vnd.sluice.bundle.v1";
/// The OCI empty descriptor's media type, used for the config.
pub const EMPTY_CONFIG_MEDIA_TYPE: &str = "application/vnd.oci.empty.v1+json";
/// The empty config blob.
pub const EMPTY_CONFIG: &[u8] = b"{}";
/// The layer media type Argo CD accepts by default.
pub const LAYER_MEDIA_TYPE: &str = "application/vnd.oci.image.layer.v1.tar+gzip";
/// Title annotation of the layer.
pub const LAYER_TITLE: &str = "manifests.tar.gz";

/// Annotation: the bundle's content digest.
pub const ANNOTATION_CONTENT_DIGEST: &str = "dev.sluice.bundle.content-digest";
/// Annotation: how many objects the bundle holds.
pub const ANNOTATION_OBJECTS: &str = "dev.sluice.bundle.objects";
/// Annotation: the source commit sha.
pub const ANNOTATION_REVISION: &str = "org.opencontainers.image.revision";
/// Annotation: the source repository URL.
pub const ANNOTATION_SOURCE: &str = "org.opencontainers.image.source";
/// Annotation: creation time (RFC 3339).
pub const ANNOTATION_CREATED: &str = "org.opencontainers.image.created";
/// Annotation: a descriptor's title.
pub const ANNOTATION_TITLE: &str = "org.opencontainers.image.title";
/// Annotation on an OCI layout index entry: the tag.
pub const ANNOTATION_REF_NAME: &str = "org.opencontainers.image.ref.name";

/// `sha256:<hex>` of some bytes.
pub fn sha256_digest(bytes: &[u8]) -> String {
    format!("sha256:{}", hex::encode(Sha256::digest(bytes)))
}

/// What is recorded about a bundle's origin. None of it changes the content digest; all of it
/// changes the manifest digest.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Metadata {
    /// Source commit sha (`org.opencontainers.image.revision`).
    pub source_commit: Option<String>,
    /// Source repository URL (`org.opencontainers.image.source`).
    pub source_url: Option<String>,
    /// Creation time (`org.opencontainers.image.created`); leave it unset for a manifest digest
    /// that depends on the manifests and the commit only.
    pub created: Option<jiff::Timestamp>,
    /// Any further annotations; keys in `dev.sluice.bundle.*` are reserved and refused.
    pub extra: BTreeMap<String, String>,
}

/// An OCI descriptor.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Descriptor {
    /// Media type of the referenced blob.
    pub media_type: String,
    /// `sha256:<hex>`.
    pub digest: String,
    /// Size in bytes.
    pub size: u64,
    /// Artifact type (index entries only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub artifact_type: Option<String>,
    /// Annotations.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
}

/// An OCI image manifest (the subset bundles and cosign signatures use).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ImageManifest {
    /// Always 2.
    pub schema_version: u32,
    /// [`MANIFEST_MEDIA_TYPE`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub media_type: Option<String>,
    /// Artifact type.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub artifact_type: Option<String>,
    /// Config descriptor.
    pub config: Descriptor,
    /// Layer descriptors.
    pub layers: Vec<Descriptor>,
    /// Annotations.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
}

impl ImageManifest {
    /// Deterministic JSON bytes.
    pub fn to_bytes(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("a manifest always serializes")
    }
}

/// A rendered bundle: every blob plus the manifest that ties them together.
#[derive(Clone, Debug)]
pub struct Artifact {
    /// The manifest's bytes as pushed.
    pub manifest_bytes: Vec<u8>,
    /// The parsed manifest.
    pub manifest: ImageManifest,
    /// `sha256:` of `manifest_bytes`: what Argo CD reports as the synced revision.
    pub manifest_digest: String,
    /// The config blob.
    pub config: Vec<u8>,
    /// The layer blob (tar+gzip).
    pub layer: Vec<u8>,
    /// The manifests inside, validated.
    pub manifests: Manifests,
}

impl Artifact {
    /// The descriptor of the content layer: the one whose digest is the layer this artifact
    /// holds (not merely the first layer the manifest lists).
    pub fn content_layer(&self) -> &Descriptor {
        let digest = sha256_digest(&self.layer);
        self.manifest
            .layers
            .iter()
            .find(|l| l.digest == digest)
            .or(self.manifest.layers.first())
            .expect("a parsed bundle manifest lists its content layer")
    }

    /// The content digest (see `manifests`).
    pub fn content_digest(&self) -> &str {
        self.manifests.content_digest()
    }

    /// The source commit annotation, when set.
    pub fn source_commit(&self) -> Option<&str> {
        self.manifest
            .annotations
            .get(ANNOTATION_REVISION)
            .map(String::as_str)
    }
}

/// Renders manifests into an artifact (pure).
pub fn render(manifests: &Manifests, metadata: &Metadata) -> Result<Artifact> {
    let layer = archive::pack(manifests.files());
    let mut annotations = BTreeMap::new();
    for (key, value) in &metadata.extra {
        if key.starts_with("dev.sluice.bundle.") {
            return Err(BundleError::invalid(
                format!("annotation {key}"),
                "keys under dev.sluice.bundle. are set by the renderer; choose another key",
            ));
        }
        annotations.insert(key.clone(), value.clone());
    }
    annotations.insert(
        ANNOTATION_CONTENT_DIGEST.to_string(),
        manifests.content_digest().to_string(),
    );
    annotations.insert(
        ANNOTATION_OBJECTS.to_string(),
        manifests.objects().len().to_string(),
    );
    if let Some(commit) = &metadata.source_commit {
        annotations.insert(ANNOTATION_REVISION.to_string(), commit.clone());
    }
    if let Some(url) = &metadata.source_url {
        annotations.insert(ANNOTATION_SOURCE.to_string(), url.clone());
    }
    if let Some(created) = metadata.created {
        annotations.insert(ANNOTATION_CREATED.to_string(), created.to_string());
    }
    let manifest = ImageManifest {
        schema_version: 2,
        media_type: Some(MANIFEST_MEDIA_TYPE.to_string()),
        artifact_type: Some(ARTIFACT_TYPE.to_string()),
        config: Descriptor {
            media_type: EMPTY_CONFIG_MEDIA_TYPE.to_string(),
            digest: sha256_digest(EMPTY_CONFIG),
            size: EMPTY_CONFIG.len() as u64,
            artifact_type: None,
            annotations: BTreeMap::new(),
        },
        layers: vec![Descriptor {
            media_type: LAYER_MEDIA_TYPE.to_string(),
            digest: sha256_digest(&layer),
            size: layer.len() as u64,
            artifact_type: None,
            annotations: BTreeMap::from([(ANNOTATION_TITLE.to_string(), LAYER_TITLE.to_string())]),
        }],
        annotations,
    };
    let manifest_bytes = manifest.to_bytes();
    Ok(Artifact {
        manifest_digest: sha256_digest(&manifest_bytes),
        manifest_bytes,
        manifest,
        config: EMPTY_CONFIG.to_vec(),
        layer,
        manifests: manifests.clone(),
    })
}

/// Checks a fetched manifest against the bundle layout and returns it with its one content
/// layer's descriptor. `reference` is only used in messages.
pub fn parse_bundle_manifest(bytes: &[u8], reference: &str) -> Result<(ImageManifest, Descriptor)> {
    let manifest: ImageManifest = serde_json::from_slice(bytes).map_err(|e| {
        BundleError::not_a_bundle(
            reference,
            format!("manifest is not an OCI image manifest: {e}"),
        )
    })?;
    if manifest.schema_version != 2 {
        return Err(BundleError::not_a_bundle(
            reference,
            format!("schemaVersion is {}, expected 2", manifest.schema_version),
        ));
    }
    if let Some(media_type) = &manifest.media_type
        && media_type != MANIFEST_MEDIA_TYPE
    {
        return Err(BundleError::not_a_bundle(
            reference,
            format!("manifest media type is {media_type}, expected {MANIFEST_MEDIA_TYPE}"),
        ));
    }
    // Argo CD's rule: exactly one content (tar or tar+gzip) layer; other layers are ignored.
    let content: Vec<&Descriptor> = manifest
        .layers
        .iter()
        .filter(|l| l.media_type.ends_with("tar+gzip") || l.media_type.ends_with("tar"))
        .collect();
    let [layer] = content.as_slice() else {
        return Err(BundleError::not_a_bundle(
            reference,
            format!(
                "expected exactly one content layer, found {}",
                content.len()
            ),
        ));
    };
    if layer.media_type != LAYER_MEDIA_TYPE {
        return Err(BundleError::not_a_bundle(
            reference,
            format!(
                "layer media type is {}, expected {LAYER_MEDIA_TYPE}",
                layer.media_type
            ),
        ));
    }
    let layer = (*layer).clone();
    Ok((manifest, layer))
}

/// Rebuilds an artifact from fetched bytes, checking every digest: the manifest against
/// `expected_manifest_digest` (when given), the layer against its descriptor, and the content
/// digest annotation (when present) against the unpacked objects.
pub fn from_parts(
    manifest_bytes: Vec<u8>,
    config: Vec<u8>,
    layer: Vec<u8>,
    expected_manifest_digest: Option<&str>,
    reference: &str,
) -> Result<Artifact> {
    from_parts_limited(
        manifest_bytes,
        config,
        layer,
        expected_manifest_digest,
        reference,
        archive::MAX_UNPACKED_BYTES,
    )
}

/// [`from_parts`] with the layer's unpacked size bounded by `max_unpacked` bytes.
pub fn from_parts_limited(
    manifest_bytes: Vec<u8>,
    config: Vec<u8>,
    layer: Vec<u8>,
    expected_manifest_digest: Option<&str>,
    reference: &str,
    max_unpacked: u64,
) -> Result<Artifact> {
    let manifest_digest = sha256_digest(&manifest_bytes);
    if let Some(expected) = expected_manifest_digest
        && expected != manifest_digest
    {
        return Err(BundleError::DigestMismatch {
            subject: format!("manifest of {reference}"),
            expected: expected.to_string(),
            actual: manifest_digest,
        });
    }
    let (manifest, layer_descriptor) = parse_bundle_manifest(&manifest_bytes, reference)?;
    let layer_digest = sha256_digest(&layer);
    if layer_digest != layer_descriptor.digest {
        return Err(BundleError::DigestMismatch {
            subject: format!("layer of {reference}"),
            expected: layer_descriptor.digest,
            actual: layer_digest,
        });
    }
    let files = archive::unpack_limited(&layer, &format!("layer of {reference}"), max_unpacked)?;
    let manifests = Manifests::from_files(files)?;
    if let Some(annotated) = manifest.annotations.get(ANNOTATION_CONTENT_DIGEST)
        && annotated != manifests.content_digest()
    {
        return Err(BundleError::DigestMismatch {
            subject: format!("content of {reference} (annotation {ANNOTATION_CONTENT_DIGEST})"),
            expected: annotated.clone(),
            actual: manifests.content_digest().to_string(),
        });
    }
    Ok(Artifact {
        manifest_bytes,
        manifest,
        manifest_digest,
        config,
        layer,
        manifests,
    })
}

#[derive(Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct LayoutIndex {
    schema_version: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    media_type: Option<String>,
    manifests: Vec<Descriptor>,
}

const INDEX_MEDIA_TYPE: &str = "application/vnd.oci.image.index.v1+json";

fn blob_path(dir: &Path, digest: &str) -> std::path::PathBuf {
    let hex = digest.trim_start_matches("sha256:");
    dir.join("blobs").join("sha256").join(hex)
}

fn write(path: &Path, bytes: &[u8]) -> Result<()> {
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent).map_err(|e| BundleError::io("creating", parent, e))?;
    }
    std::fs::write(path, bytes).map_err(|e| BundleError::io("writing", path, e))
}

/// Writes the artifact as an OCI image layout directory (`oci-layout`, `index.json`,
/// `blobs/sha256/*`), replacing any index there. `tag` becomes the entry's ref name.
pub fn write_layout(dir: &Path, artifact: &Artifact, tag: Option<&str>) -> Result<()> {
    write(
        &dir.join("oci-layout"),
        br#"{"imageLayoutVersion":"1.0.0"}"#,
    )?;
    write(
        &blob_path(dir, &artifact.manifest.config.digest),
        &artifact.config,
    )?;
    write(
        &blob_path(dir, &artifact.content_layer().digest),
        &artifact.layer,
    )?;
    write(
        &blob_path(dir, &artifact.manifest_digest),
        &artifact.manifest_bytes,
    )?;
    let mut annotations = BTreeMap::new();
    if let Some(tag) = tag {
        annotations.insert(ANNOTATION_REF_NAME.to_string(), tag.to_string());
    }
    let index = LayoutIndex {
        schema_version: 2,
        media_type: Some(INDEX_MEDIA_TYPE.to_string()),
        manifests: vec![Descriptor {
            media_type: MANIFEST_MEDIA_TYPE.to_string(),
            digest: artifact.manifest_digest.clone(),
            size: artifact.manifest_bytes.len() as u64,
            artifact_type: artifact.manifest.artifact_type.clone(),
            annotations,
        }],
    };
    write(
        &dir.join("index.json"),
        &serde_json::to_vec_pretty(&index).expect("an index always serializes"),
    )
}

/// Reads the (single) bundle of an OCI image layout directory, checking every digest.
/// Returns the artifact and the tag recorded in the index, if any.
pub fn read_layout(dir: &Path) -> Result<(Artifact, Option<String>)> {
    let location = dir.display().to_string();
    let index_path = dir.join("index.json");
    let index_bytes =
        std::fs::read(&index_path).map_err(|e| BundleError::io("reading", &index_path, e))?;
    let index: LayoutIndex = serde_json::from_slice(&index_bytes).map_err(|e| {
        BundleError::not_a_bundle(&location, format!("index.json is not an OCI index: {e}"))
    })?;
    let [entry] = index.manifests.as_slice() else {
        return Err(BundleError::not_a_bundle(
            &location,
            format!(
                "expected one manifest in index.json, found {}",
                index.manifests.len()
            ),
        ));
    };
    let read_blob = |digest: &str| -> Result<Vec<u8>> {
        let path = blob_path(dir, digest);
        std::fs::read(&path).map_err(|e| BundleError::io("reading blob", path, e))
    };
    let manifest_bytes = read_blob(&entry.digest)?;
    let (manifest, layer) = parse_bundle_manifest(&manifest_bytes, &location)?;
    let config = read_blob(&manifest.config.digest)?;
    let config_digest = sha256_digest(&config);
    if config_digest != manifest.config.digest {
        return Err(BundleError::DigestMismatch {
            subject: format!("config blob in {location}"),
            expected: manifest.config.digest.clone(),
            actual: config_digest,
        });
    }
    let layer_bytes = read_blob(&layer.digest)?;
    let artifact = from_parts(
        manifest_bytes,
        config,
        layer_bytes,
        Some(&entry.digest),
        &location,
    )?;
    Ok((
        artifact,
        entry.annotations.get(ANNOTATION_REF_NAME).cloned(),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::manifests::ManifestFile;

    fn manifests(weight: u32) -> Manifests {
        Manifests::from_files(vec![ManifestFile {
            path: "route.yaml".into(),
            contents: format!(
                "apiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata: {{name: r, namespace: ns}}\nspec: {{rules: [{{backendRefs: [{{name: a, weight: {weight}}}]}}]}}\n"
            )
            .into_bytes(),
        }])
        .unwrap()
    }

    fn meta(commit: &str, created: Option<&str>) -> Metadata {
        Metadata {
            source_commit: Some(commit.into()),
            created: created.map(|c| c.parse().unwrap()),
            ..Metadata::default()
        }
    }

    #[test]
    fn digests_follow_content_and_annotations_as_documented() {
        let a = render(&manifests(90), &meta("aaa", Some("2026-01-01T00:00:00Z"))).unwrap();
        let same = render(&manifests(90), &meta("aaa", Some("2026-01-01T00:00:00Z"))).unwrap();
        let other_commit =
            render(&manifests(90), &meta("bbb", Some("2026-02-01T00:00:00Z"))).unwrap();
        let other_content =
            render(&manifests(80), &meta("aaa", Some("2026-01-01T00:00:00Z"))).unwrap();

        assert_eq!(a.manifest_bytes, same.manifest_bytes);
        assert_eq!(a.manifest_digest, same.manifest_digest);
        assert_ne!(a.manifest_digest, other_commit.manifest_digest);
        assert_eq!(a.content_digest(), other_commit.content_digest());
        assert_eq!(a.layer, other_commit.layer);
        assert_ne!(a.content_digest(), other_content.content_digest());
        assert_eq!(a.source_commit(), Some("aaa"));
    }

    #[test]
    fn manifest_has_the_layout_argo_cd_accepts() {
        let a = render(&manifests(90), &Metadata::default()).unwrap();
        let json: serde_json::Value = serde_json::from_slice(&a.manifest_bytes).unwrap();
        assert_eq!(json["schemaVersion"], 2);
        assert_eq!(json["mediaType"], MANIFEST_MEDIA_TYPE);
        assert_eq!(json["artifactType"], ARTIFACT_TYPE);
        assert_eq!(json["config"]["mediaType"], EMPTY_CONFIG_MEDIA_TYPE);
        assert_eq!(
            json["config"]["digest"],
            "sha256:44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a"
        );
        assert_eq!(json["layers"].as_array().unwrap().len(), 1);
        assert_eq!(json["layers"][0]["mediaType"], LAYER_MEDIA_TYPE);
        assert_eq!(
            json["annotations"][ANNOTATION_CONTENT_DIGEST],
            a.content_digest()
        );
        assert_eq!(json["annotations"][ANNOTATION_OBJECTS], "1");
        assert!(json["annotations"].get(ANNOTATION_CREATED).is_none());
    }

    #[test]
    fn reserved_annotations_are_refused() {
        let mut m = Metadata::default();
        m.extra
            .insert(ANNOTATION_CONTENT_DIGEST.into(), "sha256:forged".into());
        let err = render(&manifests(1), &m).unwrap_err();
        assert_eq!(err.category(), "InvalidManifests");
    }

    #[test]
    fn from_parts_checks_every_digest() {
        let a = render(&manifests(90), &Metadata::default()).unwrap();
        let ok = from_parts(
            a.manifest_bytes.clone(),
            a.config.clone(),
            a.layer.clone(),
            Some(&a.manifest_digest),
            "r",
        )
        .unwrap();
        assert_eq!(ok.content_digest(), a.content_digest());

        let wrong_manifest = from_parts(
            a.manifest_bytes.clone(),
            a.config.clone(),
            a.layer.clone(),
            Some("sha256:0000"),
            "r",
        )
        .unwrap_err();
        assert_eq!(wrong_manifest.category(), "DigestMismatch");

        let other = render(&manifests(10), &Metadata::default()).unwrap();
        let wrong_layer = from_parts(
            a.manifest_bytes.clone(),
            a.config.clone(),
            other.layer.clone(),
            None,
            "r",
        )
        .unwrap_err();
        assert_eq!(wrong_layer.category(), "DigestMismatch");

        // A manifest whose content annotation lies about its layer.
        let mut forged = other.manifest.clone();
        forged.annotations.insert(
            ANNOTATION_CONTENT_DIGEST.into(),
            a.content_digest().to_string(),
        );
        let err = from_parts(
            forged.to_bytes(),
            other.config.clone(),
            other.layer.clone(),
            None,
            "r",
        )
        .unwrap_err();
        assert_eq!(err.category(), "DigestMismatch");
        assert!(err.to_string().contains(ANNOTATION_CONTENT_DIGEST), "{err}");
    }

    #[test]
    fn non_bundle_manifests_are_named_as_such() {
        let a = render(&manifests(90), &Metadata::default()).unwrap();
        let mut two_layers = a.manifest.clone();
        two_layers.layers.push(two_layers.layers[0].clone());
        let mut wrong_type = a.manifest.clone();
        wrong_type.layers[0].media_type =
            "application/vnd.cncf.helm.chart.content.v1.tar+gzip".into();
        for (what, manifest) in [("two layers", two_layers), ("helm layer", wrong_type)] {
            let err = parse_bundle_manifest(&manifest.to_bytes(), "r").unwrap_err();
            assert_eq!(err.category(), "NotABundle", "{what}");
        }
        let err = parse_bundle_manifest(b"[]", "r").unwrap_err();
        assert_eq!(err.category(), "NotABundle");
    }

    #[test]
    fn layout_round_trips_and_detects_corruption() {
        let dir = tempfile::tempdir().unwrap();
        let a = render(&manifests(90), &meta("abc", None)).unwrap();
        write_layout(dir.path(), &a, Some("v1")).unwrap();
        let (back, tag) = read_layout(dir.path()).unwrap();
        assert_eq!(back.manifest_digest, a.manifest_digest);
        assert_eq!(back.layer, a.layer);
        assert_eq!(tag.as_deref(), Some("v1"));

        std::fs::write(
            blob_path(dir.path(), &a.manifest.layers[0].digest),
            b"corrupt",
        )
        .unwrap();
        let err = read_layout(dir.path()).unwrap_err();
        assert_eq!(err.category(), "DigestMismatch");
    }
}
