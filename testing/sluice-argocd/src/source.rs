//! Fetching an Application's desired manifests, as Argo CD's repo-server does for a plain
//! directory source: git (the `git` CLI over a local path or `file://` URL; branch, tag, commit
//! sha or `HEAD`, resolved to a commit sha) and OCI (`oci://host/repository`, a tag or `sha256:`
//! digest resolved to the manifest digest; the single tar+gzip layer unpacked by
//! `sluice-bundle`). Results are cached by resolved revision, which names immutable content.
//! It must never apply anything, and never verify signatures (Argo CD does not).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde_json::Value;
use sluice_bundle::{BundleClient, BundleRef, ManifestFile, Manifests, RegistryOptions};
use tokio::sync::Mutex;

use crate::error::ArgoCdError;
use crate::types::ApplicationSource;

/// Desired manifests at a resolved revision.
#[derive(Clone, Debug)]
pub struct Desired {
    /// Commit sha (git) or manifest digest (OCI).
    pub revision: String,
    /// The objects, in source order.
    pub objects: Arc<Vec<Value>>,
}

/// (repoURL, resolved revision, path, recurse): names immutable content.
type CacheKey = (String, String, String, bool);

/// Fetches and caches sources.
pub struct Sources {
    bundles: BundleClient,
    work: tempfile::TempDir,
    /// Per repository URL: its mirror directory (serialises git commands on one mirror).
    mirrors: Mutex<HashMap<String, Arc<Mutex<PathBuf>>>>,
    cache: Mutex<HashMap<CacheKey, Arc<Vec<Value>>>>,
}

/// Whether a source is OCI.
pub fn is_oci(repo_url: &str) -> bool {
    repo_url.starts_with("oci://")
}

fn source_error(src: &ApplicationSource, revision: &str, reason: impl Into<String>) -> ArgoCdError {
    ArgoCdError::Source {
        repo_url: src.repo_url.clone(),
        revision: revision.to_string(),
        reason: reason.into(),
    }
}

async fn git(dir: &Path, args: &[&str]) -> Result<String, String> {
    let output = tokio::process::Command::new("git")
        .args(args)
        .current_dir(dir)
        .env("GIT_TERMINAL_PROMPT", "0")
        .kill_on_drop(true)
        .output()
        .await
        .map_err(|e| format!("cannot run git (is it installed?): {e}"))?;
    if !output.status.success() {
        return Err(format!(
            "git {} failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&output.stderr).trim()
        ));
    }
    Ok(String::from_utf8_lossy(&output.stdout).into_owned())
}

async fn git_bytes(dir: &Path, args: &[&str]) -> Result<Vec<u8>, String> {
    let output = tokio::process::Command::new("git")
        .args(args)
        .current_dir(dir)
        .kill_on_drop(true)
        .output()
        .await
        .map_err(|e| format!("cannot run git: {e}"))?;
    if !output.status.success() {
        return Err(format!(
            "git {} failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&output.stderr).trim()
        ));
    }
    Ok(output.stdout)
}

fn is_sha(s: &str) -> bool {
    s.len() == 40 && s.chars().all(|c| c.is_ascii_hexdigit())
}

/// Normalises a source path: `.`, `./`, `` → root; otherwise without leading `./` and trailing `/`.
fn clean_path(path: &str) -> String {
    let p = path.trim().trim_start_matches("./").trim_matches('/');
    if p == "." {
        String::new()
    } else {
        p.to_string()
    }
}

impl Sources {
    /// A fetcher; `insecure_registries` are spoken to over plain HTTP.
    pub fn new(insecure_registries: &[String]) -> Result<Self, ArgoCdError> {
        let work = tempfile::Builder::new()
            .prefix("sluice-argocd-repo-")
            .tempdir()
            .map_err(|e| ArgoCdError::Source {
                repo_url: String::new(),
                revision: String::new(),
                reason: format!("cannot create the repository cache directory: {e}"),
            })?;
        Ok(Sources {
            bundles: BundleClient::new(RegistryOptions {
                plain_http_hosts: insecure_registries.to_vec(),
                ..Default::default()
            }),
            work,
            mirrors: Mutex::new(HashMap::new()),
            cache: Mutex::new(HashMap::new()),
        })
    }

    /// Resolves `revision` (or the source's targetRevision) and returns the manifests there.
    pub async fn fetch(
        &self,
        src: &ApplicationSource,
        revision: &str,
    ) -> Result<Desired, ArgoCdError> {
        if src.repo_url.is_empty() {
            return Err(source_error(src, revision, "spec.source.repoURL is empty"));
        }
        let revision = if revision.is_empty() {
            src.target_revision.as_str()
        } else {
            revision
        };
        let recurse = src.directory.as_ref().is_some_and(|d| d.recurse);
        let path = clean_path(&src.path);
        if is_oci(&src.repo_url) {
            self.fetch_oci(src, revision, &path, recurse).await
        } else {
            self.fetch_git(src, revision, &path, recurse).await
        }
    }

    async fn cached(&self, key: &CacheKey) -> Option<Arc<Vec<Value>>> {
        self.cache.lock().await.get(key).cloned()
    }

    async fn fetch_oci(
        &self,
        src: &ApplicationSource,
        revision: &str,
        path: &str,
        recurse: bool,
    ) -> Result<Desired, ArgoCdError> {
        let revision = if revision.is_empty() || revision == "HEAD" {
            "latest"
        } else {
            revision
        };
        let reference = BundleRef::from_oci_source(&src.repo_url, revision)
            .map_err(|e| source_error(src, revision, e.to_string()))?;
        let digest = match &reference.digest {
            Some(d) => d.clone(),
            None => self
                .bundles
                .resolve(&reference.to_string())
                .await
                .map_err(|e| source_error(src, revision, e.to_string()))?,
        };
        let key = (
            src.repo_url.clone(),
            digest.clone(),
            path.to_string(),
            recurse,
        );
        if let Some(objects) = self.cached(&key).await {
            return Ok(Desired {
                revision: digest,
                objects,
            });
        }
        let by_digest = format!("{}@{digest}", reference.repository_ref());
        let artifact = self
            .bundles
            .pull(&by_digest)
            .await
            .map_err(|e| source_error(src, revision, e.to_string()))?;
        let files: Vec<ManifestFile> = artifact
            .manifests
            .files()
            .iter()
            .filter(|f| in_path(&f.path, path, recurse))
            .cloned()
            .collect();
        let objects = parse(src, &digest, path, files)?;
        self.cache.lock().await.insert(key, objects.clone());
        Ok(Desired {
            revision: digest,
            objects,
        })
    }

    async fn mirror(
        &self,
        src: &ApplicationSource,
        revision: &str,
    ) -> Result<Arc<Mutex<PathBuf>>, ArgoCdError> {
        let mut mirrors = self.mirrors.lock().await;
        if let Some(m) = mirrors.get(&src.repo_url) {
            return Ok(m.clone());
        }
        let dir = self.work.path().join(format!("mirror-{}", mirrors.len()));
        git(
            self.work.path(),
            &[
                "clone",
                "--quiet",
                "--mirror",
                &src.repo_url,
                &dir.to_string_lossy(),
            ],
        )
        .await
        .map_err(|e| source_error(src, revision, e))?;
        let m = Arc::new(Mutex::new(dir));
        mirrors.insert(src.repo_url.clone(), m.clone());
        Ok(m)
    }

    async fn fetch_git(
        &self,
        src: &ApplicationSource,
        revision: &str,
        path: &str,
        recurse: bool,
    ) -> Result<Desired, ArgoCdError> {
        let revision = if revision.is_empty() {
            "HEAD"
        } else {
            revision
        };
        let mirror = self.mirror(src, revision).await?;
        let dir = mirror.lock().await;
        let resolve = async |dir: &Path| -> Option<String> {
            for candidate in [
                format!("refs/heads/{revision}^{{commit}}"),
                format!("refs/tags/{revision}^{{commit}}"),
                format!("{revision}^{{commit}}"),
            ] {
                if let Ok(out) = git(dir, &["rev-parse", "--verify", "--quiet", &candidate]).await {
                    return Some(out.trim().to_string());
                }
            }
            None
        };
        let sha = if is_sha(revision) && resolve(&dir).await.is_some() {
            revision.to_string()
        } else {
            git(
                &dir,
                &[
                    "fetch",
                    "--quiet",
                    "--prune",
                    "origin",
                    "+refs/heads/*:refs/heads/*",
                    "+refs/tags/*:refs/tags/*",
                ],
            )
            .await
            .map_err(|e| source_error(src, revision, e))?;
            resolve(&dir).await.ok_or_else(|| {
                source_error(src, revision, "no branch, tag or commit of that name; push it or fix spec.source.targetRevision")
            })?
        };
        let key = (src.repo_url.clone(), sha.clone(), path.to_string(), recurse);
        if let Some(objects) = self.cached(&key).await {
            return Ok(Desired {
                revision: sha,
                objects,
            });
        }
        let tree = if path.is_empty() {
            sha.clone()
        } else {
            format!("{sha}:{path}")
        };
        let mut args = vec!["ls-tree", "-z", "--name-only"];
        if recurse {
            args.push("-r");
        }
        args.push(&tree);
        let listing = git(&dir, &args).await.map_err(|e| {
            source_error(
                src,
                &sha,
                format!("path {path:?} is not a directory at this revision: {e}"),
            )
        })?;
        let mut files = Vec::new();
        for name in listing.split('\0').filter(|n| !n.is_empty()) {
            let base = name.rsplit('/').next().unwrap_or(name);
            if base.starts_with('.') || !sluice_bundle::manifests::is_manifest_name(base) {
                continue;
            }
            let blob = format!("{tree}{}{name}", if path.is_empty() { ":" } else { "/" });
            let contents = git_bytes(&dir, &["cat-file", "-p", &blob])
                .await
                .map_err(|e| source_error(src, &sha, e))?;
            files.push(ManifestFile {
                path: name.to_string(),
                contents,
            });
        }
        let objects = parse(src, &sha, path, files)?;
        self.cache.lock().await.insert(key, objects.clone());
        Ok(Desired {
            revision: sha,
            objects,
        })
    }
}

fn in_path(file: &str, path: &str, recurse: bool) -> bool {
    let rest = if path.is_empty() {
        file
    } else {
        match file.strip_prefix(path).and_then(|r| r.strip_prefix('/')) {
            Some(r) => r,
            None => return false,
        }
    };
    recurse || !rest.contains('/')
}

fn parse(
    src: &ApplicationSource,
    revision: &str,
    path: &str,
    files: Vec<ManifestFile>,
) -> Result<Arc<Vec<Value>>, ArgoCdError> {
    if files.is_empty() {
        return Ok(Arc::new(Vec::new()));
    }
    let manifests = Manifests::from_files(files).map_err(|e| ArgoCdError::Manifests {
        repo_url: src.repo_url.clone(),
        revision: revision.to_string(),
        path: if path.is_empty() {
            ".".into()
        } else {
            path.to_string()
        },
        reason: e.to_string(),
    })?;
    Ok(Arc::new(
        manifests
            .objects()
            .iter()
            .map(|o| o.value.clone())
            .collect(),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_table() {
        assert_eq!(clean_path("."), "");
        assert_eq!(clean_path("./mesh/"), "mesh");
        assert!(in_path("a.yaml", "", false));
        assert!(!in_path("sub/a.yaml", "", false));
        assert!(in_path("sub/a.yaml", "", true));
        assert!(in_path("mesh/a.yaml", "mesh", false));
        assert!(!in_path("mesh2/a.yaml", "mesh", false));
        assert!(is_oci("oci://127.0.0.1:5000/mesh"));
        assert!(!is_oci("/tmp/repo.git"));
    }
}
