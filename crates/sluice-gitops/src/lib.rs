//! Git changes for sluice operators: revert branches pushed with the `git` CLI
//! ([`git::RevertBranch`]) and pull requests opened through the Forgejo/Gitea API
//! ([`forge::ForgeClient`]).
//!
//! Owns talking to the intent repository and the forge. Never decides whether a change is
//! wanted (the operators do), never logs a token, and never rewrites an existing branch.
#![forbid(unsafe_code)]

pub mod error;
pub mod forge;
pub mod git;
pub mod refname;

pub use error::GitopsError;
pub use forge::{ForgeClient, ForgeConfig, PullRequest, PullRequestRequest};
pub use git::{GitConfig, OWNER_TRAILER, PushedBranch, RevertBranch};
pub use refname::branch_name_problem;
