//! Docker credential helpers: `docker-credential-<name> get`, run for the registries a command
//! talks to when its caller opts in ([`crate::RegistryCredentials::run_helpers`]).
//!
//! Owns finding a helper (a program named `docker-credential-<name>` in the helper directories,
//! `$PATH` by default) and speaking Docker's credential-helper protocol: the server URL on
//! stdin, `{"ServerURL","Username","Secret"}` on stdout, `Username` `<token>` for an identity
//! (refresh) token, and the answer `credentials not found in native keychain` (with a non-zero
//! exit) for "no credentials", which means anonymous, not an error. It must never run a program
//! whose name holds anything but letters, digits, `.`, `_` and `-` (a config cannot name a
//! path), never wait longer than [`HelperOptions::timeout`], never read more than
//! [`MAX_HELPER_OUTPUT`], and never put a secret into an error message or a `Debug` output.

use std::path::PathBuf;
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};

use crate::credentials::Credential;
use crate::error::{BundleError, Result};

/// Longest a helper may take to answer (10 s): a keychain or a cloud token exchange answers in
/// well under a second; a helper that waits for input is stopped.
pub const DEFAULT_HELPER_TIMEOUT: Duration = Duration::from_secs(10);

/// Most bytes read from a helper's stdout (64 KiB): an answer is a few hundred bytes, a cloud
/// access token a few kilobytes.
pub const MAX_HELPER_OUTPUT: u64 = 64 * 1024;

/// Most bytes of a helper's stderr kept for an error message.
const MAX_HELPER_STDERR: u64 = 4 * 1024;

/// Longest part of a helper's own error message quoted in ours.
const MAX_QUOTED: usize = 200;

/// What a helper answers when it holds nothing for the server URL (Docker's
/// `credentials.errCredentialsNotFoundMessage`).
pub const NOT_FOUND_ANSWER: &str = "credentials not found in native keychain";

/// The user name a helper answers with when its secret is an identity (refresh) token.
pub const TOKEN_USERNAME: &str = "<token>";

/// How credential helpers are found and bounded.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HelperOptions {
    /// Longest a helper may take; [`DEFAULT_HELPER_TIMEOUT`] by default.
    pub timeout: Duration,
    /// Directories searched for `docker-credential-<name>`, in order; `None`: `$PATH`.
    pub dirs: Option<Vec<PathBuf>>,
}

impl Default for HelperOptions {
    fn default() -> Self {
        Self {
            timeout: DEFAULT_HELPER_TIMEOUT,
            dirs: None,
        }
    }
}

/// Whether `name` may name a helper: 1 to 64 letters, digits, `.`, `_` or `-`, starting with a
/// letter or digit (so never a path, an option, or `.`/`..`).
pub fn valid_helper_name(name: &str) -> bool {
    (1..=64).contains(&name.len())
        && name.starts_with(|c: char| c.is_ascii_alphanumeric())
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))
}

/// The server URL Docker hands a helper for `registry` (`host[:port]`): the host itself, and
/// Docker Hub's historical index address for `docker.io`.
pub fn server_url(registry: &str) -> String {
    match registry {
        "docker.io" | "index.docker.io" => "https://index.docker.io/v1/".to_owned(),
        other => other.to_owned(),
    }
}

/// The program a helper name stands for.
pub fn program(name: &str) -> String {
    format!("docker-credential-{name}")
}

/// The helper's answer (never `Debug`: it holds the secret).
#[derive(serde::Deserialize)]
struct Answer {
    #[serde(rename = "Username", default)]
    username: String,
    #[serde(rename = "Secret", default)]
    secret: String,
}

/// Runs helper `name` for `registry` (`host[:port]`): `Some` credential, or `None` when the
/// helper has none for it (anonymous).
pub(crate) async fn get(
    name: &str,
    registry: &str,
    options: &HelperOptions,
) -> Result<Option<Credential>> {
    let fail = |reason: String| BundleError::CredentialHelper {
        helper: if valid_helper_name(name) {
            program(name)
        } else {
            format!("{name:?}")
        },
        registry: registry.to_owned(),
        reason,
    };
    if !valid_helper_name(name) {
        return Err(fail(
            "refused: a helper name may hold only letters, digits, '.', '_' and '-' (no path); \
             fix credsStore/credHelpers in the registry config"
                .into(),
        ));
    }
    let path = find(name, options).ok_or_else(|| {
        fail(format!(
            "not found in {}; install it, or remove it from credsStore/credHelpers of the \
             registry config and put the credentials under \"auths\"",
            if options.dirs.is_some() {
                "the helper directories"
            } else {
                "$PATH"
            }
        ))
    })?;
    let mut child = tokio::process::Command::new(&path)
        .arg("get")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| fail(format!("cannot be started: {e}")))?;
    let url = server_url(registry);
    let mut stdin = child.stdin.take();
    let stdout = child.stdout.take();
    let stderr = child.stderr.take();
    let run = async {
        let write = async {
            if let Some(mut stdin) = stdin.take() {
                // A helper that exits without reading its input is judged by its answer.
                let _ = stdin.write_all(url.as_bytes()).await;
            }
        };
        let (_, out, err) = tokio::join!(
            write,
            read_capped(stdout, MAX_HELPER_OUTPUT),
            read_capped(stderr, MAX_HELPER_STDERR)
        );
        if out.len() as u64 > MAX_HELPER_OUTPUT {
            return Err(format!(
                "answered more than {MAX_HELPER_OUTPUT} bytes; it was stopped"
            ));
        }
        let status = child
            .wait()
            .await
            .map_err(|e| format!("could not be waited for: {e}"))?;
        Ok((status, out, err))
    };
    let outcome = tokio::time::timeout(options.timeout, run).await;
    let (status, out, err) = match outcome {
        Ok(Ok(done)) => done,
        Ok(Err(reason)) => {
            let _ = child.start_kill();
            return Err(fail(reason));
        }
        Err(_) => {
            let _ = child.start_kill();
            return Err(fail(format!(
                "did not answer within {} s; it was stopped (is it waiting for a login?)",
                options.timeout.as_secs_f64()
            )));
        }
    };
    if !status.success() {
        let answer = String::from_utf8_lossy(&out);
        if answer.trim() == NOT_FOUND_ANSWER {
            return Ok(None);
        }
        // A failing helper writes its error to stdout (Docker's protocol) or stderr.
        let said = quote(&answer).or_else(|| quote(&String::from_utf8_lossy(&err)));
        return Err(fail(match said {
            Some(said) => format!("failed ({status}): {said}"),
            None => format!("failed ({status}) without a message"),
        }));
    }
    let answer: Answer = serde_json::from_slice(&out).map_err(|e| {
        fail(format!(
            "answered with something other than the credential-helper protocol's JSON \
             {{\"ServerURL\",\"Username\",\"Secret\"}} ({} at line {} column {})",
            crate::credentials::classify(&e),
            e.line(),
            e.column()
        ))
    })?;
    Ok(if answer.secret.is_empty() {
        None
    } else if answer.username == TOKEN_USERNAME {
        Some(Credential::IdentityToken {
            token: answer.secret,
        })
    } else {
        Some(Credential::Basic {
            username: answer.username,
            password: answer.secret,
        })
    })
}

/// The first non-empty line of a helper's message, cut at [`MAX_QUOTED`] characters.
fn quote(text: &str) -> Option<String> {
    let line = text.lines().map(str::trim).find(|l| !l.is_empty())?;
    let mut quoted: String = line.chars().take(MAX_QUOTED).collect();
    if quoted.len() < line.len() {
        quoted.push('…');
    }
    Some(format!("{quoted:?}"))
}

/// `docker-credential-<name>` in the first helper directory that has it as an executable file.
fn find(name: &str, options: &HelperOptions) -> Option<PathBuf> {
    let program = program(name);
    let dirs: Vec<PathBuf> = match &options.dirs {
        Some(dirs) => dirs.clone(),
        None => std::env::var_os("PATH")
            .map(|path| std::env::split_paths(&path).collect())
            .unwrap_or_default(),
    };
    dirs.into_iter()
        .filter(|dir| dir.is_absolute())
        .map(|dir| dir.join(&program))
        .find(|candidate| executable(candidate))
}

#[cfg(unix)]
fn executable(path: &std::path::Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

#[cfg(not(unix))]
fn executable(path: &std::path::Path) -> bool {
    path.is_file()
}

/// Reads at most `max + 1` bytes, so a caller can tell "more than `max`".
async fn read_capped<R: AsyncRead + Unpin>(reader: Option<R>, max: u64) -> Vec<u8> {
    let mut bytes = Vec::new();
    if let Some(reader) = reader {
        let _ = reader.take(max + 1).read_to_end(&mut bytes).await;
    }
    bytes
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn helper_names_never_name_a_path() {
        for name in [
            "desktop",
            "ecr-login",
            "osxkeychain",
            "gcloud",
            "pass",
            "a.b_c-1",
        ] {
            assert!(valid_helper_name(name), "{name}");
        }
        for name in [
            "",
            "../bin/sh",
            "/bin/sh",
            "a/b",
            "a\\b",
            ".",
            "..",
            "-rf",
            ".hidden",
            "name with space",
            "ünïcode",
            &"x".repeat(65),
        ] {
            assert!(!valid_helper_name(name), "{name:?}");
        }
    }

    #[test]
    fn docker_hub_has_its_historical_server_url() {
        assert_eq!(server_url("docker.io"), "https://index.docker.io/v1/");
        assert_eq!(server_url("registry.example:5000"), "registry.example:5000");
    }

    #[test]
    fn quotes_are_one_bounded_line() {
        assert_eq!(quote("\n  no login \nmore"), Some("\"no login\"".into()));
        assert_eq!(quote(" \n "), None);
        let long = quote(&"é".repeat(500)).unwrap();
        assert_eq!(long.chars().count(), MAX_QUOTED + 3);
    }
}
