//! Git intent repository for tests.
//!
//! Owns a temporary directory holding a bare repository (the "intent repo" Argo CD and the
//! operators read and push to, reachable as a `file://` URL) and a working clone of it, driven by
//! the real `git` binary with a committer identity set locally in the clone. Offers helpers to
//! write files, commit, push, and read branches, files and history from the bare repository.
//! It must never read or write the user's or the system's git configuration (every command runs
//! with `GIT_CONFIG_NOSYSTEM` and an empty global config) and never reaches the network.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// The branch the intent repository starts on.
pub const DEFAULT_BRANCH: &str = "main";
/// Committer name set in the working clone.
pub const COMMITTER_NAME: &str = "sluice test";
/// Committer e-mail set in the working clone.
pub const COMMITTER_EMAIL: &str = "sluice-test@example.invalid";

/// Errors of the git fixture.
#[derive(Debug, thiserror::Error, strum::IntoStaticStr)]
#[strum(serialize_all = "snake_case")]
pub enum GitError {
    /// The binary is not installed.
    #[error(
        "git binary not found on PATH; install the Debian package `git` (apt-get install -y git)"
    )]
    BinaryMissing,
    /// Creating the temporary directory or a file failed.
    #[error("git fixture I/O at {path}: {source}")]
    Io {
        /// The path being written or read.
        path: PathBuf,
        /// The underlying error.
        source: std::io::Error,
    },
    /// A git command exited non-zero.
    #[error("`git {args}` in {dir} failed with {status}: {stderr}")]
    Command {
        /// The arguments, space-joined.
        args: String,
        /// The directory it ran in.
        dir: PathBuf,
        /// Its exit status.
        status: String,
        /// Its standard error.
        stderr: String,
    },
}

impl GitError {
    /// Bounded category of this error, usable as a metric label.
    pub fn category(&self) -> &'static str {
        self.into()
    }
}

/// One commit as `git log` reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CommitInfo {
    /// Full commit sha.
    pub sha: String,
    /// First line of the message.
    pub subject: String,
}

/// A bare intent repository plus a working clone, both deleted when dropped.
#[derive(Debug)]
pub struct GitRepo {
    dir: tempfile::TempDir,
}

/// Runs `git args` in `dir` with an isolated configuration and returns trimmed stdout.
pub fn git(dir: &Path, args: &[&str]) -> Result<String, GitError> {
    let output = Command::new("git")
        .args(args)
        .current_dir(dir)
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .env("GIT_TERMINAL_PROMPT", "0")
        .env_remove("GIT_DIR")
        .env_remove("GIT_WORK_TREE")
        .env_remove("GIT_INDEX_FILE")
        .stdin(Stdio::null())
        .output()
        .map_err(|source| {
            if source.kind() == std::io::ErrorKind::NotFound {
                GitError::BinaryMissing
            } else {
                GitError::Io {
                    path: dir.to_path_buf(),
                    source,
                }
            }
        })?;
    if !output.status.success() {
        return Err(GitError::Command {
            args: args.join(" "),
            dir: dir.to_path_buf(),
            status: output.status.to_string(),
            stderr: String::from_utf8_lossy(&output.stderr).trim().to_string(),
        });
    }
    Ok(String::from_utf8_lossy(&output.stdout).trim().to_string())
}

impl GitRepo {
    /// Creates the bare repository on [`DEFAULT_BRANCH`], a working clone with the committer
    /// identity set locally, and one initial commit (a README) pushed to the bare repository, so
    /// the branch exists for anyone who clones it.
    pub fn new() -> Result<Self, GitError> {
        let dir = tempfile::Builder::new()
            .prefix("sluice-git-")
            .tempdir()
            .map_err(|source| GitError::Io {
                path: std::env::temp_dir(),
                source,
            })?;
        let repo = Self { dir };
        let root = repo.dir.path();
        git(
            root,
            &[
                "init",
                "--quiet",
                "--bare",
                &format!("--initial-branch={DEFAULT_BRANCH}"),
                "intent.git",
            ],
        )?;
        git(root, &["clone", "--quiet", "intent.git", "work"])?;
        let work = repo.work_dir();
        for (key, value) in [
            ("user.name", COMMITTER_NAME),
            ("user.email", COMMITTER_EMAIL),
            ("commit.gpgsign", "false"),
            ("init.defaultBranch", DEFAULT_BRANCH),
        ] {
            git(&work, &["config", "--local", key, value])?;
        }
        // An empty clone has no branch yet: name it before the first commit.
        git(&work, &["checkout", "--quiet", "-B", DEFAULT_BRANCH])?;
        repo.write("README.md", "intent repository for tests\n")?;
        repo.commit("initial commit")?;
        repo.push()?;
        Ok(repo)
    }

    /// The bare repository's directory.
    pub fn bare_dir(&self) -> PathBuf {
        self.dir.path().join("intent.git")
    }

    /// The working clone's directory.
    pub fn work_dir(&self) -> PathBuf {
        self.dir.path().join("work")
    }

    /// The bare repository as a URL git can clone and push to (`file:///...`).
    pub fn url(&self) -> String {
        format!("file://{}", self.bare_dir().display())
    }

    /// Runs `git args` in the working clone.
    pub fn git(&self, args: &[&str]) -> Result<String, GitError> {
        git(&self.work_dir(), args)
    }

    /// Runs `git args` in the bare repository.
    pub fn git_bare(&self, args: &[&str]) -> Result<String, GitError> {
        git(&self.bare_dir(), args)
    }

    /// Writes `contents` to `relative` in the working clone, creating parent directories.
    pub fn write(&self, relative: &str, contents: &str) -> Result<(), GitError> {
        let path = self.work_dir().join(relative);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).map_err(|source| GitError::Io {
                path: parent.to_path_buf(),
                source,
            })?;
        }
        std::fs::write(&path, contents).map_err(|source| GitError::Io { path, source })
    }

    /// Removes `relative` from the working clone (a file or a directory tree).
    pub fn remove(&self, relative: &str) -> Result<(), GitError> {
        let path = self.work_dir().join(relative);
        let result = if path.is_dir() {
            std::fs::remove_dir_all(&path)
        } else {
            std::fs::remove_file(&path)
        };
        result.map_err(|source| GitError::Io { path, source })
    }

    /// Stages everything in the working clone and commits it; returns the new commit's sha.
    /// Commits even when nothing changed (`--allow-empty`), so a test step always has a sha.
    pub fn commit(&self, message: &str) -> Result<String, GitError> {
        self.git(&["add", "--all"])?;
        self.git(&["commit", "--quiet", "--allow-empty", "-m", message])?;
        self.head()
    }

    /// Pushes the current branch of the working clone to the bare repository.
    pub fn push(&self) -> Result<(), GitError> {
        let branch = self.current_branch()?;
        self.git(&[
            "push",
            "--quiet",
            "origin",
            &format!("HEAD:refs/heads/{branch}"),
        ])?;
        Ok(())
    }

    /// Writes the files, commits and pushes; returns the commit sha.
    pub fn commit_files(&self, files: &[(&str, &str)], message: &str) -> Result<String, GitError> {
        for (path, contents) in files {
            self.write(path, contents)?;
        }
        let sha = self.commit(message)?;
        self.push()?;
        Ok(sha)
    }

    /// The working clone's `HEAD` sha.
    pub fn head(&self) -> Result<String, GitError> {
        self.git(&["rev-parse", "HEAD"])
    }

    /// The working clone's current branch.
    pub fn current_branch(&self) -> Result<String, GitError> {
        self.git(&["rev-parse", "--abbrev-ref", "HEAD"])
    }

    /// Switches the working clone to `branch`, creating it from the current `HEAD` if needed.
    pub fn switch(&self, branch: &str) -> Result<(), GitError> {
        if self
            .git(&[
                "rev-parse",
                "--verify",
                "--quiet",
                &format!("refs/heads/{branch}"),
            ])
            .is_ok()
        {
            self.git(&["checkout", "--quiet", branch])?;
        } else {
            self.git(&["checkout", "--quiet", "-b", branch])?;
        }
        Ok(())
    }

    /// Fetches the bare repository into the working clone and resets the current branch to its
    /// remote counterpart (used after an operator pushed to the intent repo).
    pub fn pull(&self) -> Result<(), GitError> {
        let branch = self.current_branch()?;
        self.git(&["fetch", "--quiet", "origin"])?;
        self.git(&["reset", "--quiet", "--hard", &format!("origin/{branch}")])?;
        Ok(())
    }

    /// The branches of the bare repository, sorted.
    pub fn branches(&self) -> Result<Vec<String>, GitError> {
        let out = self.git_bare(&["for-each-ref", "--format=%(refname:short)", "refs/heads"])?;
        let mut branches: Vec<String> = out.lines().map(str::to_string).collect();
        branches.sort();
        Ok(branches)
    }

    /// The sha `branch` points at in the bare repository, or `None` when it does not exist.
    pub fn branch_sha(&self, branch: &str) -> Result<Option<String>, GitError> {
        match self.git_bare(&[
            "rev-parse",
            "--verify",
            "--quiet",
            &format!("refs/heads/{branch}"),
        ]) {
            Ok(sha) => Ok(Some(sha)),
            Err(GitError::Command { .. }) => Ok(None),
            Err(other) => Err(other),
        }
    }

    /// The contents of `path` on `branch` of the bare repository, or `None` when absent.
    pub fn read_file(&self, branch: &str, path: &str) -> Result<Option<String>, GitError> {
        match self.git_bare(&["show", &format!("{branch}:{path}")]) {
            Ok(text) => Ok(Some(text)),
            Err(GitError::Command { .. }) => Ok(None),
            Err(other) => Err(other),
        }
    }

    /// The history of `branch` in the bare repository, newest first.
    pub fn log(&self, branch: &str) -> Result<Vec<CommitInfo>, GitError> {
        let out = self.git_bare(&["log", "--format=%H%x09%s", branch])?;
        Ok(out
            .lines()
            .filter_map(|line| line.split_once('\t'))
            .map(|(sha, subject)| CommitInfo {
                sha: sha.to_string(),
                subject: subject.to_string(),
            })
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn new_repo_has_main_with_an_initial_commit_and_local_identity() {
        if crate::prereq::require_binary("git").is_none() {
            return;
        }
        let repo = GitRepo::new().unwrap();
        assert_eq!(repo.branches().unwrap(), vec![DEFAULT_BRANCH.to_string()]);
        let log = repo.log(DEFAULT_BRANCH).unwrap();
        assert_eq!(log.len(), 1);
        assert_eq!(log[0].subject, "initial commit");
        assert_eq!(
            repo.branch_sha(DEFAULT_BRANCH).unwrap(),
            Some(repo.head().unwrap())
        );
        assert_eq!(
            repo.git(&["config", "user.email"]).unwrap(),
            COMMITTER_EMAIL
        );
        assert_eq!(
            repo.git(&["log", "-1", "--format=%cn <%ce>"]).unwrap(),
            format!("{COMMITTER_NAME} <{COMMITTER_EMAIL}>")
        );
    }

    #[test]
    fn commits_branches_and_files_are_visible_in_the_bare_repo() {
        if crate::prereq::require_binary("git").is_none() {
            return;
        }
        let repo = GitRepo::new().unwrap();
        let first = repo
            .commit_files(&[("mesh/route.yaml", "kind: HTTPRoute\n")], "add route")
            .unwrap();
        assert_eq!(repo.branch_sha("main").unwrap(), Some(first.clone()));
        assert_eq!(
            repo.read_file("main", "mesh/route.yaml")
                .unwrap()
                .as_deref(),
            Some("kind: HTTPRoute")
        );
        assert_eq!(repo.read_file("main", "mesh/absent.yaml").unwrap(), None);

        repo.switch("revert/abc").unwrap();
        repo.remove("mesh/route.yaml").unwrap();
        let reverted = repo.commit("revert route").unwrap();
        repo.push().unwrap();
        assert_eq!(
            repo.branches().unwrap(),
            vec!["main".to_string(), "revert/abc".to_string()]
        );
        assert_eq!(repo.branch_sha("revert/abc").unwrap(), Some(reverted));
        assert_eq!(
            repo.read_file("revert/abc", "mesh/route.yaml").unwrap(),
            None
        );
        // main is untouched by the branch.
        assert_eq!(repo.branch_sha("main").unwrap(), Some(first));
        assert_eq!(repo.branch_sha("nope").unwrap(), None);
        let subjects: Vec<String> = repo
            .log("revert/abc")
            .unwrap()
            .into_iter()
            .map(|c| c.subject)
            .collect();
        assert_eq!(subjects, ["revert route", "add route", "initial commit"]);
    }

    #[test]
    fn a_second_clone_sees_pushes_and_pull_follows_the_bare_repo() {
        if crate::prereq::require_binary("git").is_none() {
            return;
        }
        let repo = GitRepo::new().unwrap();
        let other = tempfile::tempdir().unwrap();
        git(other.path(), &["clone", "--quiet", &repo.url(), "c"]).unwrap();
        let clone = other.path().join("c");
        git(&clone, &["config", "user.name", "other"]).unwrap();
        git(&clone, &["config", "user.email", "other@example.invalid"]).unwrap();
        std::fs::write(clone.join("from-other.txt"), "x\n").unwrap();
        git(&clone, &["add", "."]).unwrap();
        git(&clone, &["commit", "--quiet", "-m", "from other"]).unwrap();
        git(&clone, &["push", "--quiet", "origin", "HEAD:main"]).unwrap();

        repo.pull().unwrap();
        assert!(repo.work_dir().join("from-other.txt").exists());
        assert_eq!(
            repo.head().unwrap(),
            repo.branch_sha("main").unwrap().unwrap()
        );
    }

    #[test]
    fn failing_command_says_what_and_where() {
        if crate::prereq::require_binary("git").is_none() {
            return;
        }
        let repo = GitRepo::new().unwrap();
        let err = repo.git(&["checkout", "no-such-branch"]).unwrap_err();
        assert_eq!(err.category(), "command");
        let message = err.to_string();
        assert!(message.contains("git checkout no-such-branch"), "{message}");
        assert!(message.contains("work"), "{message}");
    }

    #[test]
    fn dropping_the_repo_removes_its_directories() {
        if crate::prereq::require_binary("git").is_none() {
            return;
        }
        let repo = GitRepo::new().unwrap();
        let bare = repo.bare_dir();
        assert!(bare.join("HEAD").exists());
        drop(repo);
        assert!(!bare.exists());
    }
}
