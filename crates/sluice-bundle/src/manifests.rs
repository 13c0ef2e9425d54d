//! The objects inside a bundle, and the content digest that names them.
//!
//! Owns reading a manifests directory (I/O kept in [`Manifests::read_dir`]), parsing multi-document
//! YAML/JSON into Kubernetes objects with the checks a bundle needs (apiVersion, kind, a fixed
//! `metadata.name`, no duplicate object; YAML that Argo CD would read otherwise is refused, see
//! [`crate::yaml`]), and the **content digest**:
//!
//! ```text
//! content digest = "sha256:" + hex(sha256(canonical))
//! canonical      = "sluice.dev/bundle-content/v1\n"
//!                  + for each object, sorted by (group, kind, namespace, name):
//!                    canonical JSON of the object (keys sorted, no whitespace) + "\n"
//! ```
//!
//! It depends only on the objects: not on file names, document order, comments, YAML style, nor
//! on any OCI annotation (source commit, creation time), which change the manifest digest but
//! never the content digest. It must never drop or rewrite an object silently: anything it cannot
//! represent exactly is an [`BundleError::InvalidManifests`].

use std::collections::BTreeMap;
use std::fmt;
use std::path::Path;

use sha2::{Digest, Sha256};

use crate::error::{BundleError, Result};

/// First line of the canonical form; bump it if the canonical form ever changes.
pub const CONTENT_FORMAT: &str = "sluice.dev/bundle-content/v1";

/// File name extensions read as manifests (what Argo CD's directory source reads).
pub const MANIFEST_EXTENSIONS: &[&str] = &["yaml", "yml", "json"];

/// One manifest file as stored in the bundle: a relative `/`-separated path and its bytes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ManifestFile {
    /// Path relative to the manifests directory, `/`-separated, no `.` or `..` components.
    pub path: String,
    /// The file's bytes, unchanged.
    pub contents: Vec<u8>,
}

/// API group and kind of an object, shown as `Kind.group` (`Kind` for the core group), like
/// `kubectl api-resources`.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize)]
pub struct GroupKind {
    /// API group; empty for the core group.
    pub group: String,
    /// Kind.
    pub kind: String,
}

impl GroupKind {
    /// Parses `Kind.group` (or `Kind` for the core group), the form [`fmt::Display`] writes.
    pub fn parse(text: &str) -> Option<Self> {
        let (kind, group) = text.split_once('.').unwrap_or((text, ""));
        let valid = !kind.is_empty()
            && kind.chars().all(|c| c.is_ascii_alphanumeric())
            && group
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '.' || c == '-');
        valid.then(|| GroupKind {
            group: group.to_string(),
            kind: kind.to_string(),
        })
    }
}

impl fmt::Display for GroupKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.group.is_empty() {
            write!(f, "{}", self.kind)
        } else {
            write!(f, "{}.{}", self.kind, self.group)
        }
    }
}

/// One Kubernetes object of a bundle.
#[derive(Clone, Debug, PartialEq)]
pub struct BundleObject {
    /// `apiVersion` as written (`group/version` or `version`).
    pub api_version: String,
    /// Group and kind.
    pub group_kind: GroupKind,
    /// `metadata.namespace`, when set.
    pub namespace: Option<String>,
    /// `metadata.name`.
    pub name: String,
    /// Where it came from: `path#document-index` (0-based).
    pub source: String,
    /// The whole object as JSON.
    pub value: serde_json::Value,
}

impl BundleObject {
    fn sort_key(&self) -> (&str, &str, &str, &str) {
        (
            &self.group_kind.group,
            &self.group_kind.kind,
            self.namespace.as_deref().unwrap_or(""),
            &self.name,
        )
    }

    /// `Kind.group namespace/name` for messages.
    pub fn display_name(&self) -> String {
        match &self.namespace {
            Some(ns) => format!("{} {ns}/{}", self.group_kind, self.name),
            None => format!("{} {}", self.group_kind, self.name),
        }
    }
}

/// A validated set of manifest files and the objects they hold.
#[derive(Clone, Debug)]
pub struct Manifests {
    files: Vec<ManifestFile>,
    objects: Vec<BundleObject>,
    content_digest: String,
}

/// How to read a manifests directory.
#[derive(Clone, Debug, Default)]
pub struct ReadOptions {
    /// Read subdirectories too. Off by default, like Argo CD's directory source, which reads
    /// only the top level unless the Application sets `directory.recurse: true`.
    pub recurse: bool,
}

/// What [`Manifests::read_dir`] found besides manifests.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Skipped {
    /// Files that are not manifests (other extensions, hidden files), relative paths.
    pub files: Vec<String>,
}

impl Manifests {
    /// Parses and validates `files` (pure). Files are kept sorted by path; objects sorted by
    /// (group, kind, namespace, name).
    pub fn from_files(mut files: Vec<ManifestFile>) -> Result<Self> {
        files.sort_by(|a, b| a.path.cmp(&b.path));
        for pair in files.windows(2) {
            if pair[0].path == pair[1].path {
                return Err(BundleError::invalid(
                    &pair[0].path,
                    "the same path appears twice",
                ));
            }
        }
        let mut objects = Vec::new();
        for file in &files {
            validate_path(&file.path)?;
            refuse_tool_files(&file.path)?;
            objects.extend(parse_file(file)?);
        }
        if objects.is_empty() {
            return Err(BundleError::invalid(
                "the manifests directory",
                "it holds no Kubernetes object; a bundle must contain at least one",
            ));
        }
        objects.sort_by(|a, b| a.sort_key().cmp(&b.sort_key()));
        for pair in objects.windows(2) {
            if pair[0].sort_key() == pair[1].sort_key() {
                return Err(BundleError::invalid(
                    &pair[1].source,
                    format!(
                        "{} is defined twice (also in {}); keep one definition",
                        pair[1].display_name(),
                        pair[0].source
                    ),
                ));
            }
        }
        let content_digest = content_digest(&objects);
        Ok(Self {
            files,
            objects,
            content_digest,
        })
    }

    /// Reads a manifests directory: every `.yaml`, `.yml` and `.json` file (hidden entries
    /// skipped), subdirectories only with `recurse`. Symbolic links are refused, because the
    /// bundle must hold what was reviewed, not what a link points to at render time.
    pub fn read_dir(dir: &Path, options: &ReadOptions) -> Result<(Self, Skipped)> {
        let mut files = Vec::new();
        let mut skipped = Skipped::default();
        collect(dir, "", options, &mut files, &mut skipped)?;
        skipped.files.sort();
        Ok((Self::from_files(files)?, skipped))
    }

    /// The manifest files, sorted by path.
    pub fn files(&self) -> &[ManifestFile] {
        &self.files
    }

    /// The objects, sorted by (group, kind, namespace, name).
    pub fn objects(&self) -> &[BundleObject] {
        &self.objects
    }

    /// The objects, dropping the files they were parsed from.
    pub fn into_objects(self) -> Vec<BundleObject> {
        self.objects
    }

    /// The content digest (`sha256:<hex>`), see the module docs.
    pub fn content_digest(&self) -> &str {
        &self.content_digest
    }

    /// The objects whose group and kind are not in `allowed` (empty when all are allowed).
    /// Callers refuse the whole bundle when this is not empty, before applying anything.
    pub fn objects_outside<'a>(&'a self, allowed: &[GroupKind]) -> Vec<&'a BundleObject> {
        self.objects
            .iter()
            .filter(|o| !allowed.contains(&o.group_kind))
            .collect()
    }

    /// How many objects of each kind the bundle holds.
    pub fn kinds(&self) -> BTreeMap<GroupKind, usize> {
        let mut kinds = BTreeMap::new();
        for object in &self.objects {
            *kinds.entry(object.group_kind.clone()).or_insert(0) += 1;
        }
        kinds
    }
}

fn collect(
    dir: &Path,
    prefix: &str,
    options: &ReadOptions,
    files: &mut Vec<ManifestFile>,
    skipped: &mut Skipped,
) -> Result<()> {
    let entries =
        std::fs::read_dir(dir).map_err(|e| BundleError::io("reading directory", dir, e))?;
    let mut entries: Vec<_> = entries
        .collect::<std::io::Result<Vec<_>>>()
        .map_err(|e| BundleError::io("reading directory", dir, e))?;
    entries.sort_by_key(|e| e.file_name());
    for entry in entries {
        let name = entry.file_name();
        let Some(name) = name.to_str() else {
            return Err(BundleError::invalid(
                entry.path().display().to_string(),
                "file name is not UTF-8; rename it",
            ));
        };
        let relative = format!("{prefix}{name}");
        if name.starts_with('.') {
            skipped.files.push(relative);
            continue;
        }
        let path = entry.path();
        let file_type = entry
            .file_type()
            .map_err(|e| BundleError::io("reading file type of", &path, e))?;
        if file_type.is_symlink() {
            return Err(BundleError::invalid(
                relative,
                "symbolic links are not bundled; copy the file into the manifests directory",
            ));
        }
        if file_type.is_dir() {
            if !options.recurse {
                return Err(BundleError::invalid(
                    relative,
                    "subdirectory found, but Argo CD reads only the top level of a directory source unless \
                     the Application sets directory.recurse: true; flatten the directory or render with --recurse",
                ));
            }
            collect(&path, &format!("{relative}/"), options, files, skipped)?;
            continue;
        }
        if !is_manifest_name(name) {
            skipped.files.push(relative);
            continue;
        }
        let contents = std::fs::read(&path).map_err(|e| BundleError::io("reading", &path, e))?;
        files.push(ManifestFile {
            path: relative,
            contents,
        });
    }
    Ok(())
}

/// Whether a file name has one of [`MANIFEST_EXTENSIONS`].
pub fn is_manifest_name(name: &str) -> bool {
    name.rsplit_once('.')
        .is_some_and(|(stem, ext)| !stem.is_empty() && MANIFEST_EXTENSIONS.contains(&ext))
}

/// Files that make Argo CD treat the directory as a Kustomize or Helm source instead of plain
/// manifests: a bundle must hold what will be applied, rendered.
const TOOL_FILES: &[(&str, &str)] = &[
    ("kustomization.yaml", "kustomize build"),
    ("kustomization.yml", "kustomize build"),
    ("Kustomization", "kustomize build"),
    ("Chart.yaml", "helm template"),
];

fn refuse_tool_files(path: &str) -> Result<()> {
    let name = path.rsplit('/').next().unwrap_or(path);
    if let Some((_, tool)) = TOOL_FILES.iter().find(|(file, _)| *file == name) {
        return Err(BundleError::invalid(
            path,
            format!(
                "Argo CD would treat this directory as a {} source, not plain manifests; bundle the output \
                 of `{tool}` instead",
                if tool.starts_with("helm") {
                    "Helm"
                } else {
                    "Kustomize"
                }
            ),
        ));
    }
    Ok(())
}

/// A bundle path must be relative, `/`-separated, without empty, `.` or `..` components.
pub(crate) fn validate_path(path: &str) -> Result<()> {
    let bad = path.is_empty()
        || path.starts_with('/')
        || path.contains('\\')
        || path
            .split('/')
            .any(|c| c.is_empty() || c == "." || c == "..");
    if bad {
        return Err(BundleError::invalid(
            path,
            "path must be relative, '/'-separated, without empty, '.' or '..' components",
        ));
    }
    Ok(())
}

fn parse_file(file: &ManifestFile) -> Result<Vec<BundleObject>> {
    let text = std::str::from_utf8(&file.contents).map_err(|e| {
        BundleError::invalid(
            format!("{}#0", file.path),
            format!("not valid YAML: the file is not UTF-8 ({e})"),
        )
    })?;
    let documents = crate::yaml::documents(text)
        .map_err(|e| BundleError::invalid(format!("{}#{}", file.path, e.document), e.message))?;
    let mut objects = Vec::new();
    for (index, document) in documents.into_iter().enumerate() {
        // An empty document (`---` with nothing after it) holds no object.
        if let Some(value) = document {
            objects.push(object_from_value(value, format!("{}#{index}", file.path))?);
        }
    }
    Ok(objects)
}

fn object_from_value(value: serde_json::Value, source: String) -> Result<BundleObject> {
    let field = |path: &[&str]| -> Option<&serde_json::Value> {
        path.iter().try_fold(&value, |v, key| v.get(key))
    };
    if !value.is_object() {
        return Err(BundleError::invalid(
            &source,
            "a document must be a Kubernetes object (a mapping with apiVersion, kind and metadata)",
        ));
    }
    let text = |path: &[&str], what: &str| -> Result<String> {
        match field(path) {
            Some(serde_json::Value::String(s)) if !s.is_empty() => Ok(s.clone()),
            Some(_) => Err(BundleError::invalid(
                &source,
                format!("{what} must be a non-empty string"),
            )),
            None => Err(BundleError::invalid(&source, format!("{what} is missing"))),
        }
    };
    let api_version = text(&["apiVersion"], "apiVersion")?;
    let kind = text(&["kind"], "kind")?;
    if field(&["metadata", "generateName"]).is_some() && field(&["metadata", "name"]).is_none() {
        return Err(BundleError::invalid(
            &source,
            "metadata.generateName is not allowed: a pinned bundle must name every object so it can be \
             applied and pruned again; set metadata.name",
        ));
    }
    let name = text(&["metadata", "name"], "metadata.name")?;
    let namespace = match field(&["metadata", "namespace"]) {
        None => None,
        Some(serde_json::Value::String(s)) if !s.is_empty() => Some(s.clone()),
        Some(_) => {
            return Err(BundleError::invalid(
                &source,
                "metadata.namespace must be a non-empty string when set",
            ));
        }
    };
    let group = match api_version.split_once('/') {
        Some((group, _)) => group.to_string(),
        None => String::new(),
    };
    Ok(BundleObject {
        api_version,
        group_kind: GroupKind { group, kind },
        namespace,
        name,
        source,
        value,
    })
}

/// Canonical JSON: object keys sorted by their UTF-8 bytes, no whitespace, serde_json's string
/// and number forms. Written by hand so it holds whatever map order serde_json is built with.
pub fn canonical_json(value: &serde_json::Value, out: &mut Vec<u8>) {
    match value {
        serde_json::Value::Object(map) => {
            let mut keys: Vec<&String> = map.keys().collect();
            keys.sort();
            out.push(b'{');
            for (i, key) in keys.into_iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                out.extend_from_slice(
                    serde_json::to_string(key)
                        .expect("a string always serializes")
                        .as_bytes(),
                );
                out.push(b':');
                canonical_json(&map[key], out);
            }
            out.push(b'}');
        }
        serde_json::Value::Array(items) => {
            out.push(b'[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                canonical_json(item, out);
            }
            out.push(b']');
        }
        scalar => out.extend_from_slice(
            serde_json::to_string(scalar)
                .expect("a scalar always serializes")
                .as_bytes(),
        ),
    }
}

/// The content digest of objects already sorted by (group, kind, namespace, name).
fn content_digest(objects: &[BundleObject]) -> String {
    let mut canonical = Vec::with_capacity(objects.len() * 512);
    canonical.extend_from_slice(CONTENT_FORMAT.as_bytes());
    canonical.push(b'\n');
    for object in objects {
        canonical_json(&object.value, &mut canonical);
        canonical.push(b'\n');
    }
    format!("sha256:{}", hex::encode(Sha256::digest(&canonical)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(path: &str, text: &str) -> ManifestFile {
        ManifestFile {
            path: path.into(),
            contents: text.as_bytes().to_vec(),
        }
    }

    const ROUTE: &str = "apiVersion: gateway.networking.k8s.io/v1\nkind: HTTPRoute\nmetadata:\n  name: checkout\n  namespace: shop\nspec:\n  rules:\n  - backendRefs:\n    - name: checkout-v1\n      weight: 90\n";
    const CM: &str = "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: settings, namespace: shop}\ndata: {a: \"1\"}\n";

    #[test]
    fn content_digest_ignores_layout_order_comments_and_style() {
        let base =
            Manifests::from_files(vec![file("route.yaml", ROUTE), file("cm.yaml", CM)]).unwrap();
        // Same objects: one file, reversed document order, comments, flow style, JSON.
        let reshaped = format!(
            "# comment\n{CM}---\n# another\n---\n{}",
            "{\"kind\":\"HTTPRoute\",\"apiVersion\":\"gateway.networking.k8s.io/v1\",\"spec\":{\"rules\":[{\"backendRefs\":[{\"weight\":90,\"name\":\"checkout-v1\"}]}]},\"metadata\":{\"namespace\":\"shop\",\"name\":\"checkout\"}}\n"
        );
        let other = Manifests::from_files(vec![file("all.yml", &reshaped)]).unwrap();
        assert_eq!(base.content_digest(), other.content_digest());
        assert!(base.content_digest().starts_with("sha256:"));
        assert_eq!(base.content_digest().len(), 7 + 64);
    }

    #[test]
    fn content_digest_changes_with_any_object_change() {
        let base = Manifests::from_files(vec![file("route.yaml", ROUTE)]).unwrap();
        let cases = [
            ("weight", ROUTE.replace("weight: 90", "weight: 91")),
            (
                "name",
                ROUTE.replace("name: checkout\n", "name: checkout2\n"),
            ),
            (
                "namespace",
                ROUTE.replace("namespace: shop", "namespace: shop2"),
            ),
            (
                "string vs number",
                ROUTE.replace("weight: 90", "weight: \"90\""),
            ),
            ("added object", format!("{ROUTE}---\n{CM}")),
        ];
        for (what, text) in cases {
            let changed = Manifests::from_files(vec![file("route.yaml", &text)]).unwrap();
            assert_ne!(base.content_digest(), changed.content_digest(), "{what}");
        }
    }

    #[test]
    fn objects_are_sorted_and_kinds_counted() {
        let m = Manifests::from_files(vec![file("b.yaml", ROUTE), file("a.yaml", CM)]).unwrap();
        let names: Vec<String> = m.objects().iter().map(BundleObject::display_name).collect();
        assert_eq!(
            names,
            [
                "ConfigMap shop/settings",
                "HTTPRoute.gateway.networking.k8s.io shop/checkout"
            ]
        );
        assert_eq!(m.files()[0].path, "a.yaml");
        let kinds: Vec<(String, usize)> = m
            .kinds()
            .into_iter()
            .map(|(k, n)| (k.to_string(), n))
            .collect();
        assert_eq!(
            kinds,
            [
                ("ConfigMap".to_string(), 1),
                ("HTTPRoute.gateway.networking.k8s.io".to_string(), 1)
            ]
        );
        assert_eq!(m.objects()[0].source, "a.yaml#0");
    }

    #[test]
    fn invalid_manifests_are_refused_with_their_location() {
        let cases: &[(&str, &str, &str)] = &[
            (
                "no kind",
                "apiVersion: v1\nmetadata: {name: a}\n",
                "kind is missing",
            ),
            (
                "no apiVersion",
                "kind: ConfigMap\nmetadata: {name: a}\n",
                "apiVersion is missing",
            ),
            (
                "no name",
                "apiVersion: v1\nkind: ConfigMap\nmetadata: {}\n",
                "metadata.name is missing",
            ),
            (
                "generateName",
                "apiVersion: v1\nkind: ConfigMap\nmetadata: {generateName: a-}\n",
                "generateName is not allowed",
            ),
            (
                "scalar document",
                "just a string\n",
                "must be a Kubernetes object",
            ),
            ("broken yaml", "apiVersion: v1\nkind: [\n", "not valid YAML"),
            (
                "merge key",
                "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: a}\nbase: &b {x: \"1\"}\ndata:\n  <<: *b\n",
                "YAML merge keys (<<) are not allowed in manifests",
            ),
            (
                "non-string key",
                "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: a}\ndata: {1: x}\n",
                "is not a string",
            ),
            (
                "yaml tag",
                "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: a}\ndata: !custom {a: b}\n",
                "YAML tag",
            ),
            (
                "duplicate object",
                "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: a}\n---\napiVersion: v1\nkind: ConfigMap\nmetadata: {name: a}\n",
                "defined twice",
            ),
            ("empty", "---\n", "no Kubernetes object"),
        ];
        for (what, text, want) in cases {
            let err = Manifests::from_files(vec![file("x.yaml", text)]).unwrap_err();
            assert_eq!(err.category(), "InvalidManifests", "{what}");
            let message = err.to_string();
            assert!(message.contains(want), "{what}: {message}");
            if *want != "no Kubernetes object" {
                assert!(
                    message.contains("x.yaml#"),
                    "{what}: location missing in {message}"
                );
            }
        }
    }

    #[test]
    fn yaml_that_argo_cd_would_read_otherwise_is_refused_with_its_location() {
        let cases: &[(&str, &str, &str)] = &[
            (
                "YAML 1.1 boolean",
                "data:\n  enabled: yes\n",
                "line 10, column 12: `yes` reads as a string here but as the boolean true by YAML 1.1 \
                 readers such as Argo CD's; quote it if the text is meant, or write true if the value is",
            ),
            (
                "YAML 1.1 boolean key",
                "data:\n  on: push\n",
                "`on` reads as a string here but as the boolean true",
            ),
            (
                "octal",
                "data:\n  mode: 0644\n",
                "`0644` reads as a string here but as the integer 420",
            ),
            (
                "underscored number",
                "spec:\n  replicas: 1_000\n",
                "`1_000` reads as a string here but as the integer 1000",
            ),
            (
                "duplicate key",
                "data:\n  a: \"1\"\n  a: \"2\"\n",
                "line 11, column 3: mapping key \"a\" appears twice; keep one",
            ),
        ];
        let head = "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: a}\n";
        for (what, body, want) in cases {
            let text = format!("{CM}---\n{head}{body}");
            let err = Manifests::from_files(vec![file("x.yaml", &text)]).unwrap_err();
            assert_eq!(err.category(), "InvalidManifests", "{what}");
            let message = err.to_string();
            assert!(message.contains(want), "{what}: {message}");
            assert!(message.contains("x.yaml#1"), "{what}: {message}");
        }
        // Quoted, the same text is a string both readers agree on.
        let quoted = format!("{head}data:\n  enabled: \"yes\"\n  \"on\": push\n  mode: '0644'\n");
        let m = Manifests::from_files(vec![file("x.yaml", &quoted)]).unwrap();
        assert_eq!(
            m.objects()[0].value["data"],
            serde_json::json!({"enabled": "yes", "on": "push", "mode": "0644"})
        );
        let latin1 = ManifestFile {
            path: "x.yaml".into(),
            contents: b"data: caf\xe9\n".to_vec(),
        };
        let err = Manifests::from_files(vec![latin1]).unwrap_err().to_string();
        assert!(
            err.contains("x.yaml#0") && err.contains("not UTF-8"),
            "{err}"
        );
    }

    #[test]
    fn group_kinds_parse_and_filter_an_allowlist() {
        let route = GroupKind::parse("HTTPRoute.gateway.networking.k8s.io").unwrap();
        assert_eq!(route.group, "gateway.networking.k8s.io");
        assert_eq!(route.kind, "HTTPRoute");
        assert_eq!(route.to_string(), "HTTPRoute.gateway.networking.k8s.io");
        assert_eq!(GroupKind::parse("ConfigMap").unwrap().group, "");
        assert_eq!(GroupKind::parse(""), None);
        assert_eq!(GroupKind::parse("Bad Kind.x"), None);

        let m = Manifests::from_files(vec![file("a.yaml", ROUTE), file("b.yaml", CM)]).unwrap();
        let outside: Vec<String> = m
            .objects_outside(&[route])
            .iter()
            .map(|o| o.display_name())
            .collect();
        assert_eq!(outside, ["ConfigMap shop/settings"]);
        let all = [
            GroupKind::parse("HTTPRoute.gateway.networking.k8s.io").unwrap(),
            GroupKind::parse("ConfigMap").unwrap(),
        ];
        assert!(m.objects_outside(&all).is_empty());
    }

    #[test]
    fn kustomize_and_helm_sources_are_refused() {
        for name in ["kustomization.yaml", "sub/kustomization.yml", "Chart.yaml"] {
            let err = Manifests::from_files(vec![
                file("route.yaml", ROUTE),
                file(name, "apiVersion: v2\n"),
            ])
            .unwrap_err();
            assert!(err.to_string().contains("instead"), "{name}: {err}");
            assert!(err.to_string().contains(name), "{name}: {err}");
        }
    }

    #[test]
    fn paths_must_be_clean_and_relative() {
        for (path, ok) in [
            ("a.yaml", true),
            ("dir/a.yaml", true),
            ("/abs.yaml", false),
            ("../up.yaml", false),
            ("dir/./a.yaml", false),
            ("dir//a.yaml", false),
            ("", false),
        ] {
            assert_eq!(validate_path(path).is_ok(), ok, "{path}");
        }
    }

    #[test]
    fn manifest_names_by_extension() {
        for (name, want) in [
            ("a.yaml", true),
            ("a.yml", true),
            ("a.json", true),
            ("README.md", false),
            (".yaml", false),
            ("yaml", false),
        ] {
            assert_eq!(is_manifest_name(name), want, "{name}");
        }
    }

    #[test]
    fn canonical_json_sorts_keys_at_every_level() {
        let value: serde_json::Value =
            serde_json::from_str(r#"{"b":1,"a":{"d":[{"z":1,"y":"\u00e9"}],"c":null}}"#).unwrap();
        let mut out = Vec::new();
        canonical_json(&value, &mut out);
        assert_eq!(
            String::from_utf8(out).unwrap(),
            r#"{"a":{"c":null,"d":[{"y":"é","z":1}]},"b":1}"#
        );
    }

    #[test]
    fn read_dir_skips_non_manifests_and_refuses_nested_dirs_unless_recursing() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("route.yaml"), ROUTE).unwrap();
        std::fs::write(dir.path().join("README.md"), "docs").unwrap();
        std::fs::write(dir.path().join(".hidden.yaml"), "not: read").unwrap();
        let (m, skipped) = Manifests::read_dir(dir.path(), &ReadOptions::default()).unwrap();
        assert_eq!(m.objects().len(), 1);
        assert_eq!(skipped.files, [".hidden.yaml", "README.md"]);

        std::fs::create_dir(dir.path().join("extra")).unwrap();
        std::fs::write(dir.path().join("extra/cm.yaml"), CM).unwrap();
        let err = Manifests::read_dir(dir.path(), &ReadOptions::default()).unwrap_err();
        assert!(err.to_string().contains("directory.recurse"), "{err}");
        let (m, _) = Manifests::read_dir(dir.path(), &ReadOptions { recurse: true }).unwrap();
        let paths: Vec<&str> = m.files().iter().map(|f| f.path.as_str()).collect();
        assert_eq!(paths, ["extra/cm.yaml", "route.yaml"]);
    }

    #[test]
    fn read_dir_refuses_symlinks() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("route.yaml"), ROUTE).unwrap();
        std::os::unix::fs::symlink(dir.path().join("route.yaml"), dir.path().join("link.yaml"))
            .unwrap();
        let err = Manifests::read_dir(dir.path(), &ReadOptions::default()).unwrap_err();
        assert!(err.to_string().contains("symbolic links"), "{err}");
    }
}
