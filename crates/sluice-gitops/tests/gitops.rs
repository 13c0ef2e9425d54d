//! The gitops client against a real `git` intent repository (`sluice_testkit::git`) and a local
//! HTTP stand-in of the Forgejo/Gitea pulls API (no forge server is available to the tests).
//! Skips with a printed reason when `git` is not installed.

use std::sync::{Arc, Mutex};

use axum::{
    Json, Router,
    extract::{Path, State},
    http::{HeaderMap, StatusCode},
    routing::get,
};
use serde_json::{Value, json};
use sluice_gitops::{
    ForgeClient, ForgeConfig, GitConfig, GitopsError, PullRequestRequest, RevertBranch,
};
use sluice_testkit::git::GitRepo;

fn repo() -> Option<GitRepo> {
    sluice_testkit::prereq::require_binary("git")?;
    Some(GitRepo::new().expect("git fixture"))
}

fn config(repo: &GitRepo) -> GitConfig {
    GitConfig {
        url: repo.url(),
        token: None,
        author_name: "sluice-revert".into(),
        author_email: "sluice-revert@example.invalid".into(),
    }
}

#[tokio::test]
async fn revert_branch_is_pushed_once_and_reverts_only_the_offending_commit() {
    let Some(repo) = repo() else { return };
    // Given a good change, a bad change, then an unrelated later change on main.
    repo.commit_files(&[("mesh/route.yaml", "weight: 10\n")], "good")
        .unwrap();
    let bad = repo
        .commit_files(
            &[
                ("mesh/route.yaml", "weight: 90\n"),
                ("mesh/extra.yaml", "added by the bad change\n"),
            ],
            "bad",
        )
        .unwrap();
    repo.commit_files(&[("docs/notes.md", "later\n")], "later")
        .unwrap();
    let main_before = repo.branch_sha("main").unwrap();

    let request = RevertBranch {
        commit: bad[..10].to_owned(),
        base: "main".into(),
        branch: "sluice/revert/argocd/pin-1".into(),
        message: "Revert bad change (BundlePin argocd/pin-1)".into(),
        owner: Some("uid-1".into()),
    };
    let first = request.push(&config(&repo)).await.unwrap();
    assert!(first.created);
    assert_eq!(
        repo.branch_sha(&request.branch).unwrap().as_deref(),
        Some(first.commit.as_str())
    );
    // The revert undoes the bad change and keeps the later one; main is untouched.
    assert_eq!(
        repo.read_file(&request.branch, "mesh/route.yaml")
            .unwrap()
            .as_deref(),
        Some("weight: 10")
    );
    assert_eq!(
        repo.read_file(&request.branch, "mesh/extra.yaml").unwrap(),
        None
    );
    assert!(
        repo.read_file(&request.branch, "docs/notes.md")
            .unwrap()
            .is_some()
    );
    assert_eq!(repo.branch_sha("main").unwrap(), main_before);
    assert_eq!(
        repo.log(&request.branch).unwrap()[0].subject,
        "Revert bad change (BundlePin argocd/pin-1)"
    );

    // Asked again (a restarted operator): the same branch and commit, nothing pushed.
    let second = request.push(&config(&repo)).await.unwrap();
    assert!(!second.created);
    assert_eq!(second.commit, first.commit);
    assert_eq!(
        repo.branches().unwrap(),
        vec!["main".to_owned(), request.branch.clone()]
    );
}

#[tokio::test]
async fn a_commit_not_on_the_base_branch_is_refused_with_its_name() {
    let Some(repo) = repo() else { return };
    let request = RevertBranch {
        commit: "0123456789abcdef0123456789abcdef01234567".into(),
        base: "main".into(),
        branch: "sluice/revert/x".into(),
        message: "m".into(),
        owner: None,
    };
    let err = request.push(&config(&repo)).await.unwrap_err();
    assert_eq!(err.category(), "CommitNotOnBase", "{err}");
    assert!(err.to_string().contains("0123456789abcdef"), "{err}");
    assert_eq!(repo.branches().unwrap(), vec!["main".to_owned()]);
}

#[tokio::test]
async fn a_conflicting_revert_names_the_paths() {
    let Some(repo) = repo() else { return };
    let bad = repo
        .commit_files(&[("mesh/route.yaml", "weight: 90\n")], "bad")
        .unwrap();
    repo.commit_files(&[("mesh/route.yaml", "weight: 50\n")], "forward edit")
        .unwrap();
    let request = RevertBranch {
        commit: bad,
        base: "main".into(),
        branch: "sluice/revert/y".into(),
        message: "m".into(),
        owner: None,
    };
    let err = request.push(&config(&repo)).await.unwrap_err();
    assert!(matches!(err, GitopsError::RevertConflict { .. }), "{err}");
    assert!(err.to_string().contains("mesh/route.yaml"), "{err}");
}

#[tokio::test]
async fn a_branch_pushed_for_another_owner_is_never_reported_as_this_ones() {
    let Some(repo) = repo() else { return };
    let bad = repo
        .commit_files(&[("mesh/route.yaml", "weight: 90\n")], "bad")
        .unwrap();
    // Months ago a pin of the same name (another UID) pushed its revert under this branch name.
    let old = RevertBranch {
        commit: bad.clone(),
        base: "main".into(),
        branch: "sluice/revert/argocd/pin-1".into(),
        message: "Revert bad (old pin)".into(),
        owner: Some("uid-old".into()),
    };
    let old_pushed = old.push(&config(&repo)).await.unwrap();
    assert!(old_pushed.created);
    // Its own owner still gets it back.
    let again = old.push(&config(&repo)).await.unwrap();
    assert_eq!(
        (again.created, again.commit),
        (false, old_pushed.commit.clone())
    );

    // A new pin reusing the name is refused, naming both owners; the old branch is untouched.
    let new = RevertBranch {
        owner: Some("uid-new".into()),
        message: "Revert bad (new pin)".into(),
        ..old.clone()
    };
    let err = new.push(&config(&repo)).await.unwrap_err();
    assert!(matches!(err, GitopsError::BranchTaken { .. }), "{err}");
    assert!(!err.is_transient(), "{err}");
    let said = err.to_string();
    for part in ["sluice/revert/argocd/pin-1", "uid-new", "uid-old"] {
        assert!(said.contains(part), "{said} lacks {part}");
    }
    assert_eq!(
        repo.branch_sha(&old.branch).unwrap().as_deref(),
        Some(old_pushed.commit.as_str())
    );

    // A branch someone pushed by hand (no owner trailer) is not taken over either.
    repo.git(&[
        "push",
        "--quiet",
        "origin",
        "main:refs/heads/sluice/revert/argocd/pin-2",
    ])
    .unwrap();
    let by_hand = RevertBranch {
        branch: "sluice/revert/argocd/pin-2".into(),
        ..new.clone()
    };
    let err = by_hand.push(&config(&repo)).await.unwrap_err();
    assert!(err.to_string().contains("no owner"), "{err}");
}

#[tokio::test]
async fn a_base_branch_git_would_refuse_is_named_before_any_git_command_runs() {
    // An unreachable repository: any git command would fail with a Git error instead.
    let config = GitConfig {
        url: "file:///nonexistent/intent.git".into(),
        token: None,
        author_name: "sluice-revert".into(),
        author_email: "sluice-revert@example.invalid".into(),
    };
    let table = [
        (
            "main..x",
            "the base branch \"main..x\" is not a git branch name: it contains '..'",
        ),
        ("main.lock", "it has a component ending with '.lock'"),
        ("-main", "it starts with '-'"),
        ("release 1", "it contains a space"),
    ];
    for (base, want) in table {
        let request = RevertBranch {
            commit: "abcdef1".into(),
            base: base.into(),
            branch: "sluice/revert/argocd/pin-1".into(),
            message: "m".into(),
            owner: None,
        };
        let err = request.push(&config).await.unwrap_err();
        assert_eq!(err.category(), "InvalidBranch", "{base}: {err}");
        assert!(!err.is_transient());
        assert!(err.to_string().contains(want), "{base}: {err} lacks {want}");
    }
}

/// The stand-in's state: pull requests created, and every Authorization header seen.
#[derive(Default)]
struct Forge {
    pulls: Vec<Value>,
    auth: Vec<String>,
}

type Shared = Arc<Mutex<Forge>>;

async fn list(
    State(s): State<Shared>,
    Path((_owner, _repo)): Path<(String, String)>,
    headers: HeaderMap,
) -> Result<Json<Value>, StatusCode> {
    let mut f = s.lock().unwrap();
    let auth = headers
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    f.auth.push(auth.clone());
    if auth != "token good-token" {
        return Err(StatusCode::UNAUTHORIZED);
    }
    Ok(Json(Value::Array(f.pulls.clone())))
}

async fn create(
    State(s): State<Shared>,
    Path((owner, repo)): Path<(String, String)>,
    headers: HeaderMap,
    Json(body): Json<Value>,
) -> (StatusCode, Json<Value>) {
    let mut f = s.lock().unwrap();
    let auth = headers
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    f.auth.push(auth.clone());
    if auth != "token good-token" {
        return (StatusCode::UNAUTHORIZED, Json(json!({"message": "token"})));
    }
    if f.pulls
        .iter()
        .any(|p| p["head"]["ref"] == body["head"] && p["base"]["ref"] == body["base"])
    {
        return (
            StatusCode::CONFLICT,
            Json(json!({"message": "pull request already exists for these targets"})),
        );
    }
    let number = f.pulls.len() as u64 + 1;
    let pull = json!({
        "number": number,
        "html_url": format!("http://forge.invalid/{owner}/{repo}/pulls/{number}"),
        "title": body["title"],
        "body": body["body"],
        "state": "open",
        "head": {"ref": body["head"]},
        "base": {"ref": body["base"]},
    });
    f.pulls.push(pull.clone());
    (StatusCode::CREATED, Json(pull))
}

async fn stand_in() -> (String, Shared) {
    let state: Shared = Arc::default();
    let app = Router::new()
        .route("/api/v1/repos/{owner}/{repo}/pulls", get(list).post(create))
        .with_state(state.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    (format!("http://{addr}"), state)
}

fn forge(base_url: &str, token: &str) -> ForgeClient {
    ForgeClient::new(ForgeConfig {
        base_url: base_url.to_owned(),
        owner: "platform".into(),
        repo: "mesh".into(),
        token: token.into(),
        timeout: Some(std::time::Duration::from_secs(5)),
    })
    .unwrap()
}

#[tokio::test]
async fn pull_request_is_opened_once_with_token_auth() {
    let (url, state) = stand_in().await;
    let client = forge(&url, "good-token");
    let request = PullRequestRequest {
        head: "sluice/revert/argocd/pin-1".into(),
        base: "main".into(),
        title: "Revert bad change".into(),
        body: "Pinned by BundlePin argocd/pin-1".into(),
    };
    let first = client.open_pull_request(&request).await.unwrap();
    assert!(first.created);
    assert_eq!(first.number, 1);
    assert_eq!(first.url, "http://forge.invalid/platform/mesh/pulls/1");
    let second = client.open_pull_request(&request).await.unwrap();
    assert!(!second.created, "the open pull request is reused");
    assert_eq!(second.number, 1);
    let other_base = PullRequestRequest {
        base: "release".into(),
        ..request.clone()
    };
    assert_eq!(
        client.open_pull_request(&other_base).await.unwrap().number,
        2
    );
    let f = state.lock().unwrap();
    assert_eq!(f.pulls.len(), 2);
    assert_eq!(f.pulls[0]["title"], "Revert bad change");
    assert!(f.auth.iter().all(|a| a == "token good-token"));
}

#[tokio::test]
async fn a_rejected_token_is_reported_as_unauthorized() {
    let (url, state) = stand_in().await;
    let err = forge(&url, "wrong")
        .open_pull_request(&PullRequestRequest {
            head: "h".into(),
            base: "main".into(),
            title: "t".into(),
            body: "b".into(),
        })
        .await
        .unwrap_err();
    assert_eq!(err.category(), "ForgeUnauthorized", "{err}");
    assert!(!err.is_transient());
    assert!(
        !err.to_string().contains("wrong"),
        "no token in messages: {err}"
    );
    assert!(state.lock().unwrap().pulls.is_empty());
}

#[tokio::test]
async fn an_unreachable_forge_is_transient() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    drop(listener);
    let err = forge(&url, "good-token")
        .find_open("h", "main")
        .await
        .unwrap_err();
    assert_eq!(err.category(), "ForgeUnavailable", "{err}");
    assert!(err.is_transient());
}
