//! Publishing a mesh change as CI would: commit it to the git intent repository and push, render
//! the directory's manifests into a bundle carrying the commit, push the bundle to the sandbox's
//! registry and sign it with the sandbox's cosign key (the key revert trusts). Shared by every
//! scenario that needs a bundle. Never creates or changes Applications or cluster objects: what
//! syncs a bundle is the scenario's business.

use sluice_bundle::{BundleClient, Manifests, Metadata, ReadOptions, RegistryOptions};

use super::ScenarioError;
use crate::sandbox::Sandbox;

/// A change to publish.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Change<'a> {
    /// Files written to the intent repository (path relative to its root, contents).
    pub files: &'a [(&'a str, &'a str)],
    /// Commit message.
    pub message: &'a str,
    /// The directory whose manifests make the bundle (relative to the repository root).
    pub dir: &'a str,
    /// Registry repository path the bundle is pushed to (`mesh/east-1`).
    pub repository: &'a str,
}

/// A published, signed bundle.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Published {
    /// The commit the bundle was rendered from.
    pub commit: String,
    /// The tag it was pushed under (the commit's first 12 characters).
    pub tag: String,
    /// The registry repository (`host:port/mesh/east-1`), without `oci://`.
    pub repository: String,
    /// `repository@sha256:...`: the name to sign, verify and pin.
    pub reference: String,
    /// The manifest digest (what Argo CD reports as the revision).
    pub manifest_digest: String,
    /// The content digest (equal for equal manifests, whatever the commit).
    pub content_digest: String,
}

/// Turns a bundle error into a scenario error naming the step.
pub fn bundle_error(
    step: &'static str,
) -> impl FnOnce(sluice_bundle::BundleError) -> ScenarioError {
    move |e| ScenarioError::Bundle {
        step,
        message: format!("{e} [{}]", e.category()),
    }
}

/// The tag of a commit's bundle: its first 12 characters.
pub fn tag_of(commit: &str) -> &str {
    &commit[..commit.len().min(12)]
}

/// Commits and pushes `change` to the intent repository, then renders, pushes and signs its
/// directory as a bundle (see [`publish_commit`]).
pub async fn publish_bundle(
    sandbox: &Sandbox,
    change: &Change<'_>,
) -> Result<Published, ScenarioError> {
    let commit = sandbox
        .git()
        .commit_files(change.files, change.message)
        .map_err(|e| ScenarioError::Bundle {
            step: "commit",
            message: e.to_string(),
        })?;
    publish_commit(sandbox, &commit, change.dir, change.repository).await
}

/// Renders the manifests under `dir` in the intent repository's working clone (which must hold
/// `commit`) into a bundle recording `commit`, pushes it to `repository` in the sandbox's
/// registry under the commit's tag and signs it with the sandbox's key.
pub async fn publish_commit(
    sandbox: &Sandbox,
    commit: &str,
    dir: &str,
    repository: &str,
) -> Result<Published, ScenarioError> {
    let git = sandbox.git();
    let (manifests, _) = Manifests::read_dir(&git.work_dir().join(dir), &ReadOptions::default())
        .map_err(bundle_error("read manifests"))?;
    let artifact = sluice_bundle::render(
        &manifests,
        &Metadata {
            source_commit: Some(commit.to_string()),
            source_url: Some(git.url()),
            ..Metadata::default()
        },
    )
    .map_err(bundle_error("render"))?;
    let client = BundleClient::new(RegistryOptions::default());
    let repository = sandbox.registry().repository(repository);
    let tag = tag_of(commit).to_string();
    let pushed = client
        .push(&artifact, &format!("{repository}:{tag}"))
        .await
        .map_err(bundle_error("push"))?;
    client
        .sign(&pushed.reference, sandbox.signing_key())
        .await
        .map_err(bundle_error("sign"))?;
    Ok(Published {
        commit: commit.to_string(),
        tag,
        repository,
        reference: pushed.reference,
        manifest_digest: pushed.manifest_digest,
        content_digest: pushed.content_digest,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_tag_is_the_commit_prefix() {
        let cases = [
            ("0123456789abcdef0123", "0123456789ab"),
            ("0123456789ab", "0123456789ab"),
            ("abc", "abc"),
            ("", ""),
        ];
        for (commit, want) in cases {
            assert_eq!(tag_of(commit), want, "{commit}");
        }
    }
}
