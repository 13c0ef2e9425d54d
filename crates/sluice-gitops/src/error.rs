//! The one error type of the gitops crate, with a bounded [`GitopsError::category`] (a metric
//! label and an Event reason). Messages say what failed, where, and what to do; they never carry
//! a token.

/// Everything that can go wrong pushing a branch or opening a pull request.
#[derive(Debug, thiserror::Error, strum::IntoStaticStr)]
pub enum GitopsError {
    /// The `git` binary is not installed.
    #[error("the git binary was not found on PATH; install git in the operator image")]
    GitMissing,
    /// A git command failed.
    #[error("`git {args}` failed ({status}): {stderr}")]
    Git {
        /// The arguments (never a token: credentials travel in the environment).
        args: String,
        /// Exit status.
        status: String,
        /// Standard error, trimmed.
        stderr: String,
    },
    /// The commit to revert is not on the base branch.
    #[error(
        "commit {commit} is not on branch {base} of {repository}; name a commit of the base branch in spec.gitRevert.commit"
    )]
    CommitNotOnBase {
        /// The commit asked for.
        commit: String,
        /// The base branch.
        base: String,
        /// The repository URL (without credentials).
        repository: String,
    },
    /// Reverting the commit conflicts with later changes.
    #[error(
        "reverting {commit} onto {base} conflicts with later changes in {paths}; revert it by hand"
    )]
    RevertConflict {
        /// The commit.
        commit: String,
        /// The base branch.
        base: String,
        /// The conflicting paths.
        paths: String,
    },
    /// A branch name git would not accept (checked before any git command runs).
    #[error(
        "the {role} {name:?} is not a git branch name: it {problem}; name a branch as `git check-ref-format --branch` accepts"
    )]
    InvalidBranch {
        /// Which branch: "base branch" or "revert branch".
        role: &'static str,
        /// The name given.
        name: String,
        /// The rule it breaks.
        problem: String,
    },
    /// The revert branch exists but another owner pushed it (a reused name): it is never
    /// reported as this one's, nor rewritten.
    #[error(
        "branch {branch} already exists in {repository} but was not pushed for {owner} (its tip commit {commit} names {found}); delete the stale branch or name the revert differently"
    )]
    BranchTaken {
        /// The branch.
        branch: String,
        /// The repository URL (without credentials).
        repository: String,
        /// The owner asked for.
        owner: String,
        /// The commit the branch points at.
        commit: String,
        /// The owner its tip commit names ("no owner" when none).
        found: String,
    },
    /// Local I/O (a temporary checkout).
    #[error("gitops I/O at {path}: {source}")]
    Io {
        /// Path involved.
        path: String,
        /// The underlying error.
        source: std::io::Error,
    },
    /// The forge could not be reached.
    #[error("forge at {url} unreachable: {source}; check the forge URL and network policy")]
    ForgeUnavailable {
        /// The URL called.
        url: String,
        /// The underlying error.
        source: reqwest::Error,
    },
    /// The forge answered with an error.
    #[error("forge {method} {url} answered {status}: {body}")]
    Forge {
        /// HTTP method.
        method: &'static str,
        /// The URL called.
        url: String,
        /// HTTP status.
        status: u16,
        /// Response body (truncated).
        body: String,
    },
    /// The forge rejected the token.
    #[error(
        "forge {url} rejected the token ({status}); give the token write access to pull requests of the repository"
    )]
    ForgeUnauthorized {
        /// The URL called.
        url: String,
        /// HTTP status (401 or 403).
        status: u16,
    },
}

impl GitopsError {
    /// Bounded category: a metric label and an Event reason, never a payload.
    pub fn category(&self) -> &'static str {
        self.into()
    }

    /// Whether retrying later may succeed without a change of input (a permanent error —
    /// a conflict, a commit not on the base, a bad or taken branch, a refused token — waits for
    /// a change of the request instead).
    pub fn is_transient(&self) -> bool {
        match self {
            GitopsError::Git { .. } | GitopsError::Io { .. } => true,
            GitopsError::ForgeUnavailable { .. } => true,
            GitopsError::Forge { status, .. } => *status >= 500 || *status == 429,
            _ => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn categories_are_bounded_and_transience_is_by_cause() {
        let table: Vec<(GitopsError, &str, bool)> = vec![
            (GitopsError::GitMissing, "GitMissing", false),
            (
                GitopsError::RevertConflict {
                    commit: "abc".into(),
                    base: "main".into(),
                    paths: "a.yaml".into(),
                },
                "RevertConflict",
                false,
            ),
            (
                GitopsError::InvalidBranch {
                    role: "base branch",
                    name: "a..b".into(),
                    problem: "contains '..'".into(),
                },
                "InvalidBranch",
                false,
            ),
            (
                GitopsError::BranchTaken {
                    branch: "b".into(),
                    repository: "file:///x".into(),
                    owner: "u1".into(),
                    commit: "f00".into(),
                    found: "u0".into(),
                },
                "BranchTaken",
                false,
            ),
            (
                GitopsError::Git {
                    args: "clone".into(),
                    status: "exit status: 128".into(),
                    stderr: "connection reset".into(),
                },
                "Git",
                true,
            ),
            (
                GitopsError::CommitNotOnBase {
                    commit: "abc".into(),
                    base: "main".into(),
                    repository: "file:///x".into(),
                },
                "CommitNotOnBase",
                false,
            ),
            (
                GitopsError::Forge {
                    method: "POST",
                    url: "u".into(),
                    status: 503,
                    body: String::new(),
                },
                "Forge",
                true,
            ),
            (
                GitopsError::Forge {
                    method: "POST",
                    url: "u".into(),
                    status: 422,
                    body: String::new(),
                },
                "Forge",
                false,
            ),
            (
                GitopsError::ForgeUnauthorized {
                    url: "u".into(),
                    status: 401,
                },
                "ForgeUnauthorized",
                false,
            ),
        ];
        for (err, category, transient) in table {
            assert_eq!(err.category(), category, "{err}");
            assert_eq!(err.is_transient(), transient, "{err}");
        }
    }
}
