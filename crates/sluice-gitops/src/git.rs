//! Revert branches in the intent repository, pushed with the `git` CLI.
//!
//! Owns one operation: given a commit on a base branch, push a branch holding its revert — once.
//! A branch that already exists is reported, never rewritten, so a restarted operator that asks
//! again gets the same branch and commit back; with an owner, only a branch whose tip commit
//! names that owner (an [`OWNER_TRAILER`] trailer) is reported, so a reused branch name never
//! passes someone else's revert off as this one. Branch names are checked before any git command
//! runs ([`crate::refname`]). Never touches the base branch, never reads the
//! user's or the system's git configuration, and never puts the token on a command line or in a
//! log line (it travels in the environment, as an HTTP header git sends).

use std::{path::Path, process::Stdio, time::Duration};

use tokio::process::Command;

use crate::error::GitopsError;

/// The commit-message trailer naming who a revert branch was pushed for
/// (`Sluice-Revert-Owner: <owner>`).
pub const OWNER_TRAILER: &str = "Sluice-Revert-Owner";

/// How long one git command may take before it is killed.
const COMMAND_TIMEOUT: Duration = Duration::from_secs(120);

/// Where the intent repository is and who commits.
#[derive(Clone)]
pub struct GitConfig {
    /// Clone URL of the intent repository (`https://...`, `ssh://...` or `file://...`).
    pub url: String,
    /// Token sent as HTTP basic credentials (user `sluice`) for `https://` URLs; `None`:
    /// credentials come from the URL or the environment.
    pub token: Option<String>,
    /// Committer and author name.
    pub author_name: String,
    /// Committer and author e-mail.
    pub author_email: String,
}

impl std::fmt::Debug for GitConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GitConfig")
            .field("url", &self.url)
            .field("token", &self.token.as_ref().map(|_| "<redacted>"))
            .field("author_name", &self.author_name)
            .finish()
    }
}

/// A revert to push.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RevertBranch {
    /// The commit to revert (full or abbreviated sha); must be on `base`.
    pub commit: String,
    /// Branch the revert is based on.
    pub base: String,
    /// Branch to push (e.g. `sluice/revert/argocd/pin-42`); never rewritten once it exists.
    pub branch: String,
    /// Commit message of the revert.
    pub message: String,
    /// Who the branch is for (e.g. a BundlePin's UID): written as an [`OWNER_TRAILER`] trailer
    /// of the revert commit, and an existing branch is reported only when its tip commit names
    /// the same owner (else [`GitopsError::BranchTaken`]). `None`: any existing branch is
    /// reported.
    pub owner: Option<String>,
}

/// The branch as it is in the repository after [`RevertBranch::push`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PushedBranch {
    /// Branch name.
    pub branch: String,
    /// Commit the branch points at.
    pub commit: String,
    /// False when the branch already existed (nothing was pushed).
    pub created: bool,
}

impl RevertBranch {
    /// Pushes the revert branch unless it already exists; returns the branch's commit either way.
    pub async fn push(&self, config: &GitConfig) -> Result<PushedBranch, GitopsError> {
        for (role, name) in [("base branch", &self.base), ("revert branch", &self.branch)] {
            if let Some(problem) = crate::refname::branch_name_problem(name) {
                return Err(GitopsError::InvalidBranch {
                    role,
                    name: name.clone(),
                    problem,
                });
            }
        }
        if let Some(commit) = remote_branch(config, &self.branch).await? {
            return self.existing(config, commit).await;
        }
        let dir = work_dir("sluice-revert-")?;
        let work = dir.path();
        run(
            config,
            work,
            &[
                "clone",
                "--quiet",
                "--no-tags",
                "--single-branch",
                // Commits and trees only; the blobs the revert touches are fetched on demand, so
                // a large intent repository does not fill the pod's small /tmp. A server without
                // partial clone support ignores the filter (a full clone, as before).
                "--filter=blob:none",
                "--branch",
                &self.base,
                &config.url,
                ".",
            ],
        )
        .await?;
        let not_on_base = || GitopsError::CommitNotOnBase {
            commit: self.commit.clone(),
            base: self.base.clone(),
            repository: config.url.clone(),
        };
        let full = run(
            config,
            work,
            &[
                "rev-parse",
                "--verify",
                &format!("{}^{{commit}}", self.commit),
            ],
        )
        .await
        .map_err(|_| not_on_base())?;
        if run(
            config,
            work,
            &["merge-base", "--is-ancestor", &full, "HEAD"],
        )
        .await
        .is_err()
        {
            return Err(not_on_base());
        }
        let parents = run(config, work, &["rev-list", "--parents", "-n", "1", &full]).await?;
        let mut revert = vec!["revert", "--no-commit"];
        if parents.split_whitespace().count() > 2 {
            // A merge commit: revert to its first parent (the base branch's side).
            revert.extend(["-m", "1"]);
        }
        revert.push(&full);
        if let Err(err) = run(config, work, &revert).await {
            let paths = run(config, work, &["diff", "--name-only", "--diff-filter=U"])
                .await
                .unwrap_or_default();
            if paths.is_empty() {
                return Err(err);
            }
            return Err(GitopsError::RevertConflict {
                commit: full,
                base: self.base.clone(),
                paths: paths.lines().collect::<Vec<_>>().join(", "),
            });
        }
        let message = match &self.owner {
            Some(owner) => format!("{}\n\n{OWNER_TRAILER}: {owner}", self.message.trim_end()),
            None => self.message.clone(),
        };
        run(
            config,
            work,
            &["commit", "--quiet", "--allow-empty", "-m", &message],
        )
        .await?;
        let commit = run(config, work, &["rev-parse", "HEAD"]).await?;
        let target = format!("HEAD:refs/heads/{}", self.branch);
        match run(config, work, &["push", "--quiet", &config.url, &target]).await {
            Ok(_) => Ok(PushedBranch {
                branch: self.branch.clone(),
                commit,
                created: true,
            }),
            Err(err) => match remote_branch(config, &self.branch).await? {
                // Someone (a previous leader) pushed it first: keep theirs, if it is ours.
                Some(existing) => self.existing(config, existing).await,
                None => Err(err),
            },
        }
    }

    /// The branch that already exists at `commit`, reported when it belongs to this owner.
    async fn existing(
        &self,
        config: &GitConfig,
        commit: String,
    ) -> Result<PushedBranch, GitopsError> {
        if let Some(owner) = &self.owner {
            let message = tip_message(config, &self.branch).await?;
            let found = owner_of(&message);
            if found != Some(owner.as_str()) {
                return Err(GitopsError::BranchTaken {
                    branch: self.branch.clone(),
                    repository: config.url.clone(),
                    owner: owner.clone(),
                    commit,
                    found: found.unwrap_or("no owner").to_owned(),
                });
            }
        }
        Ok(PushedBranch {
            branch: self.branch.clone(),
            commit,
            created: false,
        })
    }
}

/// The owner an [`OWNER_TRAILER`] line of `message` names (the last one), if any.
fn owner_of(message: &str) -> Option<&str> {
    message
        .lines()
        .filter_map(|l| l.strip_prefix(OWNER_TRAILER)?.strip_prefix(':'))
        .map(str::trim)
        .next_back()
}

/// A new empty directory under the system's temporary directory, removed when dropped.
fn work_dir(prefix: &str) -> Result<tempfile::TempDir, GitopsError> {
    tempfile::Builder::new()
        .prefix(prefix)
        .tempdir()
        .map_err(|source| GitopsError::Io {
            path: std::env::temp_dir().display().to_string(),
            source,
        })
}

/// The message of the commit `branch` points at: one shallow fetch of that commit (no blobs)
/// into an empty repository, not a clone.
async fn tip_message(config: &GitConfig, branch: &str) -> Result<String, GitopsError> {
    let dir = work_dir("sluice-revert-tip-")?;
    let work = dir.path();
    run(config, work, &["init", "--quiet"]).await?;
    run(
        config,
        work,
        &[
            "fetch",
            "--quiet",
            "--no-tags",
            "--depth=1",
            "--filter=blob:none",
            &config.url,
            &format!("refs/heads/{branch}"),
        ],
    )
    .await?;
    run(config, work, &["log", "-1", "--format=%B", "FETCH_HEAD"]).await
}

/// The commit `branch` points at in the repository, or `None` when it does not exist.
pub async fn remote_branch(
    config: &GitConfig,
    branch: &str,
) -> Result<Option<String>, GitopsError> {
    let out = run(
        config,
        &std::env::temp_dir(),
        &[
            "ls-remote",
            "--heads",
            &config.url,
            &format!("refs/heads/{branch}"),
        ],
    )
    .await?;
    Ok(out
        .lines()
        .filter_map(|l| l.split_once('\t'))
        .find(|(_, r)| *r == format!("refs/heads/{branch}"))
        .map(|(sha, _)| sha.to_owned()))
}

/// Runs git with an isolated configuration; returns trimmed stdout.
async fn run(config: &GitConfig, dir: &Path, args: &[&str]) -> Result<String, GitopsError> {
    let mut cmd = Command::new("git");
    cmd.args(args)
        .current_dir(dir)
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .env("GIT_TERMINAL_PROMPT", "0")
        .env("GIT_AUTHOR_NAME", &config.author_name)
        .env("GIT_AUTHOR_EMAIL", &config.author_email)
        .env("GIT_COMMITTER_NAME", &config.author_name)
        .env("GIT_COMMITTER_EMAIL", &config.author_email)
        .env_remove("GIT_DIR")
        .env_remove("GIT_WORK_TREE")
        .env_remove("GIT_INDEX_FILE")
        .stdin(Stdio::null())
        .kill_on_drop(true);
    // Configuration through the environment keeps the token off the command line.
    let mut entries: Vec<(&str, String)> = vec![("commit.gpgsign", "false".into())];
    if let Some(token) = &config.token {
        entries.push((
            "http.extraHeader",
            format!("Authorization: Basic {}", basic("sluice", token)),
        ));
    }
    cmd.env("GIT_CONFIG_COUNT", entries.len().to_string());
    for (i, (k, v)) in entries.iter().enumerate() {
        cmd.env(format!("GIT_CONFIG_KEY_{i}"), k)
            .env(format!("GIT_CONFIG_VALUE_{i}"), v);
    }
    let shown = args.join(" ");
    let output = tokio::time::timeout(COMMAND_TIMEOUT, cmd.output())
        .await
        .map_err(|_| GitopsError::Git {
            args: shown.clone(),
            status: format!("timed out after {}s", COMMAND_TIMEOUT.as_secs()),
            stderr: String::new(),
        })?
        .map_err(|source| {
            if source.kind() == std::io::ErrorKind::NotFound {
                GitopsError::GitMissing
            } else {
                GitopsError::Io {
                    path: dir.display().to_string(),
                    source,
                }
            }
        })?;
    if !output.status.success() {
        return Err(GitopsError::Git {
            args: shown,
            status: output.status.to_string(),
            stderr: String::from_utf8_lossy(&output.stderr).trim().to_owned(),
        });
    }
    Ok(String::from_utf8_lossy(&output.stdout).trim().to_owned())
}

/// `base64(user:password)` (standard alphabet, padded).
fn basic(user: &str, password: &str) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let input = format!("{user}:{password}");
    let bytes = input.as_bytes();
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let b = [
            chunk[0],
            chunk.get(1).copied().unwrap_or(0),
            chunk.get(2).copied().unwrap_or(0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(ALPHABET[((n >> (18 - 6 * i)) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn basic_credentials_encode_like_rfc_4648() {
        let table = [
            ("a", "", "YTo="),
            ("sluice", "t", "c2x1aWNlOnQ="),
            ("sluice", "to", "c2x1aWNlOnRv"),
            ("Aladdin", "open sesame", "QWxhZGRpbjpvcGVuIHNlc2FtZQ=="),
        ];
        for (user, password, want) in table {
            assert_eq!(basic(user, password), want, "{user}:{password}");
        }
    }

    #[test]
    fn the_owner_is_read_from_the_last_trailer() {
        let table = [
            ("Revert x\n\nSluice-Revert-Owner: u1", Some("u1")),
            ("Revert x\n\nSluice-Revert-Owner:u2\n", Some("u2")),
            (
                "Revert x\n\nSluice-Revert-Owner: u0\nSluice-Revert-Owner: u3",
                Some("u3"),
            ),
            (
                "Revert x\n\nmentions Sluice-Revert-Owner: u1 in prose",
                None,
            ),
            ("Revert x", None),
        ];
        for (message, want) in table {
            assert_eq!(owner_of(message), want, "{message:?}");
        }
    }

    #[test]
    fn debug_never_shows_the_token() {
        let config = GitConfig {
            url: "https://git.example/mesh".into(),
            token: Some("s3cr3t-token".into()),
            author_name: "sluice".into(),
            author_email: "sluice@example.invalid".into(),
        };
        let shown = format!("{config:?}");
        assert!(!shown.contains("s3cr3t"), "{shown}");
        assert!(shown.contains("redacted"), "{shown}");
    }
}
