//! Pull requests through the Forgejo/Gitea API (`/api/v1/repos/{owner}/{repo}/pulls`, token
//! authentication).
//!
//! Owns opening a pull request once: an open pull request from the same head to the same base is
//! returned instead of a second one (looked up before creating, and again when the forge answers
//! 409 because a concurrent caller won). Never merges, closes or comments, and never logs the
//! token.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::error::GitopsError;

/// Where the forge is and how to authenticate.
#[derive(Clone)]
pub struct ForgeConfig {
    /// Base URL of the forge (`https://forge.example`), without `/api/v1`.
    pub base_url: String,
    /// Repository owner (user or organisation).
    pub owner: String,
    /// Repository name.
    pub repo: String,
    /// API token (sent as `Authorization: token <token>`).
    pub token: String,
    /// Per-request timeout; 30 s when `None`.
    pub timeout: Option<Duration>,
}

impl std::fmt::Debug for ForgeConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ForgeConfig")
            .field("base_url", &self.base_url)
            .field("owner", &self.owner)
            .field("repo", &self.repo)
            .field("token", &"<redacted>")
            .finish()
    }
}

/// A pull request to open.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct PullRequestRequest {
    /// Branch holding the change.
    pub head: String,
    /// Branch to merge into.
    pub base: String,
    /// Title.
    pub title: String,
    /// Description (Markdown).
    pub body: String,
}

/// A pull request as the forge reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PullRequest {
    /// Number in the repository.
    pub number: u64,
    /// Web URL.
    pub url: String,
    /// False when an open pull request already existed (nothing was created).
    pub created: bool,
}

#[derive(Debug, Deserialize)]
struct WirePull {
    number: u64,
    #[serde(default)]
    html_url: String,
    #[serde(default)]
    head: Option<WireBranch>,
    #[serde(default)]
    base: Option<WireBranch>,
}

#[derive(Debug, Deserialize)]
struct WireBranch {
    #[serde(rename = "ref", default)]
    reference: String,
}

/// A Forgejo/Gitea API client for one repository.
#[derive(Debug, Clone)]
pub struct ForgeClient {
    config: ForgeConfig,
    http: reqwest::Client,
}

impl ForgeClient {
    /// A client for `config`.
    pub fn new(config: ForgeConfig) -> Result<Self, GitopsError> {
        let http = reqwest::Client::builder()
            .timeout(config.timeout.unwrap_or(Duration::from_secs(30)))
            .build()
            .map_err(|source| GitopsError::ForgeUnavailable {
                url: config.base_url.clone(),
                source,
            })?;
        Ok(Self { config, http })
    }

    fn pulls_url(&self) -> String {
        format!(
            "{}/api/v1/repos/{}/{}/pulls",
            self.config.base_url.trim_end_matches('/'),
            self.config.owner,
            self.config.repo
        )
    }

    /// Opens the pull request, or returns the open one from the same head to the same base.
    pub async fn open_pull_request(
        &self,
        request: &PullRequestRequest,
    ) -> Result<PullRequest, GitopsError> {
        if let Some(existing) = self.find_open(&request.head, &request.base).await? {
            return Ok(existing);
        }
        let url = self.pulls_url();
        let response = self
            .http
            .post(&url)
            .header("Authorization", format!("token {}", self.config.token))
            .json(request)
            .send()
            .await
            .map_err(|source| GitopsError::ForgeUnavailable {
                url: url.clone(),
                source,
            })?;
        let status = response.status().as_u16();
        if status == 409 {
            // A concurrent caller opened it first.
            if let Some(existing) = self.find_open(&request.head, &request.base).await? {
                return Ok(existing);
            }
        }
        let pull: WirePull = read_json(response, "POST", &url).await?;
        Ok(PullRequest {
            number: pull.number,
            url: pull.html_url,
            created: true,
        })
    }

    /// The open pull request from `head` to `base`, if any.
    pub async fn find_open(
        &self,
        head: &str,
        base: &str,
    ) -> Result<Option<PullRequest>, GitopsError> {
        let url = self.pulls_url();
        let mut page = 1u32;
        loop {
            let response = self
                .http
                .get(format!("{url}?state=open&limit=50&page={page}"))
                .header("Authorization", format!("token {}", self.config.token))
                .send()
                .await
                .map_err(|source| GitopsError::ForgeUnavailable {
                    url: url.clone(),
                    source,
                })?;
            let pulls: Vec<WirePull> = read_json(response, "GET", &url).await?;
            if let Some(found) = pulls.iter().find(|p| {
                p.head.as_ref().is_some_and(|h| h.reference == head)
                    && p.base.as_ref().is_some_and(|b| b.reference == base)
            }) {
                return Ok(Some(PullRequest {
                    number: found.number,
                    url: found.html_url.clone(),
                    created: false,
                }));
            }
            // A short page is the last one; the page bound stops a forge that ignores `limit`.
            if pulls.len() < 50 || page >= 100 {
                return Ok(None);
            }
            page += 1;
        }
    }
}

async fn read_json<T: serde::de::DeserializeOwned>(
    response: reqwest::Response,
    method: &'static str,
    url: &str,
) -> Result<T, GitopsError> {
    let status = response.status().as_u16();
    if status == 401 || status == 403 {
        return Err(GitopsError::ForgeUnauthorized {
            url: url.to_owned(),
            status,
        });
    }
    let text = response
        .text()
        .await
        .map_err(|source| GitopsError::ForgeUnavailable {
            url: url.to_owned(),
            source,
        })?;
    if !(200..300).contains(&status) {
        return Err(GitopsError::Forge {
            method,
            url: url.to_owned(),
            status,
            body: text.chars().take(512).collect(),
        });
    }
    serde_json::from_str(&text).map_err(|e| GitopsError::Forge {
        method,
        url: url.to_owned(),
        status,
        body: format!(
            "unexpected response ({e}): {}",
            text.chars().take(256).collect::<String>()
        ),
    })
}
