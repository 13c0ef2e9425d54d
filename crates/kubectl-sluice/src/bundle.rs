//! `kubectl sluice bundle ...`: the producer and checker side of signed bundles, for CI and
//! release engineers.
//!
//! Owns the bundle subcommands' arguments, their output (human text by default, one JSON object
//! with `--json`/`-o json` for scripts) and their exit codes: 0 success, 1 failure,
//! [`EXIT_REFUSED`] when a signature check refuses the bundle (unsigned, wrong key, tampered).
//! All logic lives in `sluice-bundle`; this module only parses, calls, and prints; it asks the
//! Docker config's credential helper for the one registry a command names, as `docker` would.
//! It must never print key material or passwords, and never verify a tag.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use clap::{Args, Subcommand, ValueEnum};
use serde::Serialize;
use sluice_bundle::{
    BundleClient, BundleError, BundleRef, CaBundle, HelperOptions, Manifests, Metadata, PublicKey,
    ReadOptions, RegistryCredentials, RegistryOptions, SigningKey,
};

use crate::EXIT_FAILURE;

/// Exit code when a signature check refuses the bundle (Unsigned, WrongKey, Tampered,
/// DigestRequired), so CI can tell "bad bundle" from "broken pipeline".
pub const EXIT_REFUSED: u8 = 3;

/// Default environment variable holding the private key's password (cosign's name for it).
pub const DEFAULT_PASSWORD_ENV: &str = "COSIGN_PASSWORD";

/// Bundle subcommands and the registry options they share.
#[derive(Debug, Args)]
pub struct BundleArgs {
    #[command(flatten)]
    registry: RegistryArgs,
    #[command(subcommand)]
    command: BundleCommand,
}

#[derive(Debug, Args)]
struct RegistryArgs {
    /// Registry `host:port` to reach over plain HTTP (repeatable). Loopback registries always are.
    #[arg(long = "plain-http", value_name = "HOST:PORT", global = true)]
    plain_http: Vec<String>,
    /// Registry user name for basic auth (password from --registry-password-env).
    #[arg(long, global = true, requires = "registry_password_env")]
    registry_username: Option<String>,
    /// Environment variable holding the registry password.
    #[arg(long, value_name = "VAR", global = true)]
    registry_password_env: Option<String>,
    /// Docker config with per-registry credentials (`auths`: `auth`, `username`/`password` or
    /// `identitytoken`). Default: `$DOCKER_CONFIG/config.json`, else `~/.docker/config.json`,
    /// when it exists. Its credential helper for the command's registry (`credHelpers`, else
    /// `credsStore`) is run as `docker` runs it (`docker-credential-<name>` from $PATH, 10 s at
    /// most), unless --registry-username is given.
    #[arg(long, value_name = "FILE", global = true)]
    registry_config: Option<PathBuf>,
    /// PEM file of CA certificates trusted for registries' TLS, besides the system roots.
    #[arg(long, value_name = "FILE", global = true)]
    registry_ca: Option<PathBuf>,
    /// Loopback registry `host:port` to reach over HTTPS (repeatable); other loopback
    /// registries are plain HTTP.
    #[arg(long = "tls-registry", value_name = "HOST:PORT", global = true)]
    tls_registries: Vec<String>,
}

/// The Docker config read when `--registry-config` is not given: `$DOCKER_CONFIG/config.json`,
/// else `$HOME/.docker/config.json`; `None` when neither variable is set.
fn default_registry_config() -> Option<PathBuf> {
    if let Some(dir) = std::env::var_os("DOCKER_CONFIG").filter(|d| !d.is_empty()) {
        return Some(PathBuf::from(dir).join("config.json"));
    }
    std::env::var_os("HOME")
        .filter(|h| !h.is_empty())
        .map(|home| PathBuf::from(home).join(".docker").join("config.json"))
}

#[derive(Debug, Subcommand)]
enum BundleCommand {
    /// Render a manifests directory into a bundle: to a local OCI layout and/or pushed.
    Render(RenderArgs),
    /// Push a bundle from a local OCI layout (written by `render --output-layout`).
    Push(PushArgs),
    /// Sign a pushed bundle's manifest digest with a cosign key (cosign's tag layout).
    Sign(SignArgs),
    /// Verify a bundle's signature by manifest digest against one or more public keys.
    Verify(VerifyArgs),
    /// Show a bundle's digests, source commit, kinds and signatures.
    Inspect(InspectArgs),
    /// Generate a cosign-compatible key pair (`<prefix>.key`, encrypted, and `<prefix>.pub`).
    GenerateKeyPair(KeyPairArgs),
}

#[derive(Debug, Args)]
struct RenderArgs {
    /// Directory of Kubernetes manifests (.yaml, .yml, .json).
    dir: PathBuf,
    /// Write the bundle as an OCI image layout into this directory.
    #[arg(long, value_name = "DIR", required_unless_present = "push")]
    output_layout: Option<PathBuf>,
    /// Push the bundle to this repository (`host:port/repo[:tag]`).
    #[arg(long, value_name = "REPOSITORY[:TAG]")]
    push: Option<String>,
    /// Source commit sha (annotation org.opencontainers.image.revision).
    #[arg(long, value_name = "SHA")]
    source_commit: Option<String>,
    /// Source repository URL (annotation org.opencontainers.image.source).
    #[arg(long, value_name = "URL")]
    source_url: Option<String>,
    /// Creation time, RFC 3339 or `now`; defaults to $SOURCE_DATE_EPOCH when set, else none
    /// (no time annotation, so the manifest digest depends on content and commit only).
    #[arg(long, value_name = "TIME")]
    created: Option<String>,
    /// Extra manifest annotation (repeatable).
    #[arg(long = "annotation", value_name = "KEY=VALUE")]
    annotations: Vec<String>,
    /// Read subdirectories too (the Applications then need `directory.recurse: true`).
    #[arg(long)]
    recurse: bool,
    /// Print one JSON object instead of text.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, Args)]
struct PushArgs {
    /// OCI layout directory holding one bundle.
    layout: PathBuf,
    /// Target repository (`host:port/repo[:tag]`).
    target: String,
    /// Print one JSON object instead of text.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, Args)]
struct SignArgs {
    /// The bundle, by digest: `host:port/repo@sha256:<hex>`.
    reference: String,
    /// Private key file (cosign.key, encrypted; or an unencrypted PKCS#8 PEM).
    #[arg(long, value_name = "FILE")]
    key: PathBuf,
    /// Environment variable holding the key's password (empty when unset).
    #[arg(long, value_name = "VAR", default_value = DEFAULT_PASSWORD_ENV)]
    password_env: String,
    /// Print one JSON object instead of text.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, Args)]
struct VerifyArgs {
    /// The bundle, by digest: `host:port/repo@sha256:<hex>` (a tag is refused).
    reference: String,
    /// Public key file (repeatable; any one verifying suffices).
    #[arg(long = "key", value_name = "FILE", required = true)]
    keys: Vec<PathBuf>,
    /// Print one JSON object instead of text.
    #[arg(long)]
    json: bool,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum Format {
    Text,
    Json,
}

#[derive(Debug, Args)]
struct InspectArgs {
    /// A registry reference (tag or digest) or a local OCI layout directory.
    target: String,
    /// Output format.
    #[arg(short = 'o', long = "output", value_enum, default_value = "text")]
    output: Format,
}

#[derive(Debug, Args)]
struct KeyPairArgs {
    /// Path prefix of the files written (`<prefix>.key`, `<prefix>.pub`).
    #[arg(long, value_name = "PATH", default_value = "cosign")]
    output_prefix: PathBuf,
    /// Environment variable holding the password for the private key (empty when unset).
    #[arg(long, value_name = "VAR", default_value = DEFAULT_PASSWORD_ENV)]
    password_env: String,
    /// Overwrite existing files.
    #[arg(long)]
    force: bool,
}

/// A failure ready to print: message and exit code.
#[derive(Debug)]
struct Failure {
    message: String,
    category: &'static str,
    code: u8,
}

impl From<BundleError> for Failure {
    fn from(err: BundleError) -> Self {
        let code = match err {
            BundleError::Unsigned { .. }
            | BundleError::WrongKey { .. }
            | BundleError::Tampered { .. }
            | BundleError::UntrustedSignature { .. }
            | BundleError::DigestRequired { .. } => EXIT_REFUSED,
            _ => EXIT_FAILURE,
        };
        Failure {
            category: err.category(),
            message: err.to_string(),
            code,
        }
    }
}

fn usage(message: impl Into<String>) -> Failure {
    Failure {
        message: message.into(),
        category: "Usage",
        code: EXIT_FAILURE,
    }
}

/// Runs a bundle subcommand; on failure prints `error [Category]: message` to stderr and
/// returns the exit code.
pub async fn run(args: BundleArgs) -> Result<(), u8> {
    match dispatch(args).await {
        Ok(()) => Ok(()),
        Err(failure) => {
            eprintln!("error [{}]: {}", failure.category, failure.message);
            Err(failure.code)
        }
    }
}

impl BundleCommand {
    /// The registry (`host[:port]`) the command talks to, if any.
    fn registry(&self) -> Option<String> {
        let reference = match self {
            BundleCommand::Render(a) => a.push.as_deref()?,
            BundleCommand::Push(a) => &a.target,
            BundleCommand::Sign(a) => &a.reference,
            BundleCommand::Verify(a) => &a.reference,
            BundleCommand::Inspect(a) if !Path::new(&a.target).exists() => &a.target,
            BundleCommand::Inspect(_) | BundleCommand::GenerateKeyPair(_) => return None,
        };
        BundleRef::parse(reference).ok().map(|r| r.registry)
    }
}

async fn dispatch(args: BundleArgs) -> Result<(), Failure> {
    let mut options = registry_options(&args.registry)?;
    // On a workstation the Docker config's credential helper answers for the command's
    // registry, as it does for `docker push`; explicit --registry-username credentials win.
    if options.basic_auth.is_none()
        && let Some(registry) = args.command.registry()
    {
        options
            .credentials
            .run_helpers([registry.as_str()], &HelperOptions::default())
            .await?;
    }
    let client = BundleClient::new(options);
    match args.command {
        BundleCommand::Render(a) => render(&client, a).await,
        BundleCommand::Push(a) => push(&client, a).await,
        BundleCommand::Sign(a) => sign(&client, a).await,
        BundleCommand::Verify(a) => verify(&client, a).await,
        BundleCommand::Inspect(a) => inspect(&client, a).await,
        BundleCommand::GenerateKeyPair(a) => generate_key_pair(a),
    }
}

fn registry_options(args: &RegistryArgs) -> Result<RegistryOptions, Failure> {
    let basic_auth = match (&args.registry_username, &args.registry_password_env) {
        (Some(user), Some(var)) => {
            let password = std::env::var(var).map_err(|_| {
                usage(format!(
                    "--registry-password-env names {var}, which is not set"
                ))
            })?;
            Some((user.clone(), password))
        }
        _ => None,
    };
    // An explicit --registry-config must exist; the default one is read when it does.
    let credentials = match &args.registry_config {
        Some(path) => RegistryCredentials::from_file(path)?,
        None => match default_registry_config().filter(|p| p.is_file()) {
            Some(path) => RegistryCredentials::from_file(&path)?,
            None => RegistryCredentials::none(),
        },
    };
    let ca_bundle = args
        .registry_ca
        .as_deref()
        .map(CaBundle::from_file)
        .transpose()?;
    Ok(RegistryOptions {
        plain_http_hosts: args.plain_http.clone(),
        tls_hosts: args.tls_registries.clone(),
        basic_auth,
        credentials,
        ca_bundle,
        timeout: None,
        allowed_registries: Vec::new(),
        max_unpacked_bytes: None,
    })
}

/// Prints `value` as one JSON line, or `lines` as `key: value` text.
fn emit<T: Serialize>(json: bool, value: &T, lines: &[(&str, String)]) {
    if json {
        println!(
            "{}",
            serde_json::to_string(value).expect("output always serializes")
        );
    } else {
        for (key, text) in lines {
            println!("{key}: {text}");
        }
    }
}

fn parse_created(arg: Option<&str>) -> Result<Option<jiff::Timestamp>, Failure> {
    match arg {
        Some("now") => Ok(Some(jiff::Timestamp::now())),
        Some(text) => text
            .parse()
            .map(Some)
            .map_err(|e| usage(format!("--created {text:?} is not RFC 3339 or `now`: {e}"))),
        None => match std::env::var("SOURCE_DATE_EPOCH") {
            Ok(epoch) => {
                let seconds: i64 = epoch
                    .trim()
                    .parse()
                    .map_err(|_| usage(format!("SOURCE_DATE_EPOCH {epoch:?} is not an integer")))?;
                jiff::Timestamp::from_second(seconds)
                    .map(Some)
                    .map_err(|e| usage(format!("SOURCE_DATE_EPOCH {epoch:?} is out of range: {e}")))
            }
            Err(_) => Ok(None),
        },
    }
}

fn parse_annotations(items: &[String]) -> Result<BTreeMap<String, String>, Failure> {
    items
        .iter()
        .map(|item| {
            item.split_once('=')
                .filter(|(k, _)| !k.is_empty())
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .ok_or_else(|| usage(format!("--annotation {item:?} must be KEY=VALUE")))
        })
        .collect()
}

#[derive(Serialize)]
struct RenderOutput {
    manifest_digest: String,
    content_digest: String,
    objects: usize,
    kinds: BTreeMap<String, usize>,
    skipped: Vec<String>,
    layout: Option<String>,
    reference: Option<String>,
    tag: Option<String>,
}

async fn render(client: &BundleClient, args: RenderArgs) -> Result<(), Failure> {
    let metadata = Metadata {
        source_commit: args.source_commit.clone(),
        source_url: args.source_url.clone(),
        created: parse_created(args.created.as_deref())?,
        extra: parse_annotations(&args.annotations)?,
    };
    let (manifests, skipped) = Manifests::read_dir(
        &args.dir,
        &ReadOptions {
            recurse: args.recurse,
        },
    )?;
    let artifact = sluice_bundle::render(&manifests, &metadata)?;
    if let Some(layout) = &args.output_layout {
        let tag = args
            .push
            .as_deref()
            .and_then(|p| sluice_bundle::BundleRef::parse(p).ok())
            .and_then(|r| r.tag);
        sluice_bundle::write_layout(layout, &artifact, tag.as_deref())?;
    }
    let pushed = match &args.push {
        Some(target) => Some(client.push(&artifact, target).await?),
        None => None,
    };
    for file in &skipped.files {
        eprintln!("skipped (not a manifest): {file}");
    }
    let output = RenderOutput {
        manifest_digest: artifact.manifest_digest.clone(),
        content_digest: artifact.content_digest().to_string(),
        objects: manifests.objects().len(),
        kinds: manifests
            .kinds()
            .into_iter()
            .map(|(k, n)| (k.to_string(), n))
            .collect(),
        skipped: skipped.files.clone(),
        layout: args.output_layout.as_ref().map(|p| p.display().to_string()),
        reference: pushed.as_ref().map(|p| p.reference.clone()),
        tag: pushed.as_ref().and_then(|p| p.tag.clone()),
    };
    let mut lines = vec![
        ("manifest digest", output.manifest_digest.clone()),
        ("content digest", output.content_digest.clone()),
        ("objects", output.objects.to_string()),
    ];
    if let Some(layout) = &output.layout {
        lines.push(("layout", layout.clone()));
    }
    if let Some(reference) = &output.reference {
        lines.push(("reference", reference.clone()));
    }
    emit(args.json, &output, &lines);
    Ok(())
}

async fn push(client: &BundleClient, args: PushArgs) -> Result<(), Failure> {
    let (artifact, _tag) = sluice_bundle::read_layout(&args.layout)?;
    let pushed = client.push(&artifact, &args.target).await?;
    emit(
        args.json,
        &pushed,
        &[
            ("manifest digest", pushed.manifest_digest.clone()),
            ("content digest", pushed.content_digest.clone()),
            ("reference", pushed.reference.clone()),
        ],
    );
    Ok(())
}

fn password_from(var: &str) -> Vec<u8> {
    std::env::var(var).unwrap_or_default().into_bytes()
}

async fn sign(client: &BundleClient, args: SignArgs) -> Result<(), Failure> {
    let key = SigningKey::from_file(&args.key, &password_from(&args.password_env))?;
    let signed = client.sign(&args.reference, &key).await?;
    emit(
        args.json,
        &signed,
        &[
            ("signed", signed.reference.clone()),
            ("signature", signed.signature_reference.clone()),
            ("key", signed.key_fingerprint.clone()),
            (
                "result",
                if signed.added {
                    format!("signature added ({} stored)", signed.signatures)
                } else {
                    format!("already signed by this key ({} stored)", signed.signatures)
                },
            ),
        ],
    );
    Ok(())
}

async fn verify(client: &BundleClient, args: VerifyArgs) -> Result<(), Failure> {
    let keys = args
        .keys
        .iter()
        .map(|path| PublicKey::from_file(path))
        .collect::<Result<Vec<_>, _>>()?;
    let verified = client.verify(&args.reference, &keys).await?;
    emit(
        args.json,
        &verified,
        &[
            ("verified", args.reference.clone()),
            ("key", verified.key_fingerprint.clone()),
        ],
    );
    Ok(())
}

async fn inspect(client: &BundleClient, args: InspectArgs) -> Result<(), Failure> {
    let path = Path::new(&args.target);
    let inspection = if path.join("index.json").is_file() {
        let (artifact, _) = sluice_bundle::read_layout(path)?;
        sluice_bundle::inspection(&artifact, &args.target, None)
    } else {
        client.inspect(&args.target).await?
    };
    match args.output {
        Format::Json => emit(true, &inspection, &[]),
        Format::Text => {
            let kinds = inspection
                .kinds
                .iter()
                .map(|(k, n)| format!("{k}={n}"))
                .collect::<Vec<_>>()
                .join(", ");
            let mut lines = vec![
                ("reference", inspection.reference.clone()),
                ("manifest digest", inspection.manifest_digest.clone()),
                ("content digest", inspection.content_digest.clone()),
                (
                    "source commit",
                    inspection
                        .source_commit
                        .clone()
                        .unwrap_or_else(|| "-".into()),
                ),
                (
                    "created",
                    inspection.created.clone().unwrap_or_else(|| "-".into()),
                ),
                ("objects", inspection.objects.to_string()),
                ("kinds", kinds),
            ];
            if let Some(signatures) = inspection.signatures {
                lines.push(("signatures (unverified)", signatures.to_string()));
            }
            emit(false, &inspection, &lines);
        }
    }
    Ok(())
}

fn generate_key_pair(args: KeyPairArgs) -> Result<(), Failure> {
    let private = args.output_prefix.with_extension("key");
    let public = args.output_prefix.with_extension("pub");
    for path in [&private, &public] {
        if path.exists() && !args.force {
            return Err(exists(path));
        }
    }
    let pair = sluice_bundle::generate_key_pair(&password_from(&args.password_env))?;
    write_new(&private, &pair.private_pem, 0o600, args.force)?;
    write_new(&public, &pair.public_pem, 0o644, args.force)?;
    println!("private key: {}", private.display());
    println!("public key: {}", public.display());
    Ok(())
}

fn exists(path: &Path) -> Failure {
    usage(format!(
        "{} exists; pass --force to overwrite",
        path.display()
    ))
}

/// Writes `text` to a file created with `mode` from the start (never a wider mode, not even for
/// a moment), refusing a path that exists (a file, or a link to one, written by another process
/// meanwhile). With `replace`, an existing file is first removed, so the key is never written into
/// an existing file (whose mode, or another link to it, could expose it).
fn write_new(path: &Path, text: &str, mode: u32, replace: bool) -> Result<(), Failure> {
    use std::{io::Write, os::unix::fs::OpenOptionsExt};
    if replace {
        match std::fs::remove_file(path) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => {
                return Err(usage(format!(
                    "removing {} to overwrite it: {e}",
                    path.display()
                )));
            }
        }
    }
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(path)
        .map_err(|e| {
            if e.kind() == std::io::ErrorKind::AlreadyExists {
                exists(path)
            } else {
                usage(format!("creating {}: {e}", path.display()))
            }
        })?;
    file.write_all(text.as_bytes())
        .and_then(|()| file.sync_all())
        .map_err(|e| usage(format!("writing {}: {e}", path.display())))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn annotations_parse_as_key_value() {
        let parsed = parse_annotations(&["a=1".into(), "b=x=y".into(), "c=".into()]).unwrap();
        assert_eq!(parsed["a"], "1");
        assert_eq!(parsed["b"], "x=y");
        assert_eq!(parsed["c"], "");
        for bad in ["novalue", "=v"] {
            assert!(parse_annotations(&[bad.into()]).is_err(), "{bad}");
        }
    }

    #[test]
    fn created_accepts_rfc3339_and_now() {
        let t = parse_created(Some("2026-01-02T03:04:05Z"))
            .unwrap()
            .unwrap();
        assert_eq!(t.to_string(), "2026-01-02T03:04:05Z");
        assert!(parse_created(Some("now")).unwrap().is_some());
        assert!(parse_created(Some("yesterday")).is_err());
    }

    #[test]
    fn refusals_have_their_own_exit_code() {
        let refused: Failure = BundleError::DigestRequired {
            reference: "r:tag".into(),
        }
        .into();
        assert_eq!(refused.code, EXIT_REFUSED);
        let broken: Failure = BundleError::RegistryUnavailable {
            registry: "r".into(),
            action: "a".into(),
            reason: "x".into(),
        }
        .into();
        assert_eq!(broken.code, EXIT_FAILURE);
        assert_eq!(broken.category, "RegistryUnavailable");
    }

    fn mode(path: &Path) -> u32 {
        use std::os::unix::fs::PermissionsExt;
        std::fs::metadata(path).unwrap().permissions().mode() & 0o777
    }

    #[test]
    fn a_private_key_is_created_owner_only_and_never_overwrites_a_file() {
        let dir = tempfile::tempdir().unwrap();
        let key = dir.path().join("cosign.key");
        write_new(&key, "secret-1", 0o600, false).unwrap();
        assert_eq!(mode(&key), 0o600);
        assert_eq!(std::fs::read_to_string(&key).unwrap(), "secret-1");

        // A file that appeared since the existence check (or a link to one) is refused, kept.
        let err = write_new(&key, "secret-2", 0o600, false).unwrap_err();
        assert_eq!(
            err.message,
            format!("{} exists; pass --force to overwrite", key.display())
        );
        assert_eq!(err.code, EXIT_FAILURE);
        assert_eq!(std::fs::read_to_string(&key).unwrap(), "secret-1");
        let link = dir.path().join("link.key");
        std::os::unix::fs::symlink(dir.path().join("elsewhere"), &link).unwrap();
        let err = write_new(&link, "secret-2", 0o600, false).unwrap_err();
        assert!(
            err.message.ends_with("exists; pass --force to overwrite"),
            "{}",
            err.message
        );
        assert!(
            !dir.path().join("elsewhere").exists(),
            "never written through a link"
        );

        // --force replaces the file: a new one, owner-only, even over a world-readable key, and
        // never written into the old one (another hard link to it keeps the old text).
        let old = dir.path().join("old.key");
        std::fs::write(&old, "old").unwrap();
        std::fs::set_permissions(&old, std::os::unix::fs::PermissionsExt::from_mode(0o644))
            .unwrap();
        let other_link = dir.path().join("readable-by-others");
        std::fs::hard_link(&old, &other_link).unwrap();
        write_new(&old, "secret-3", 0o600, true).unwrap();
        assert_eq!(mode(&old), 0o600);
        assert_eq!(std::fs::read_to_string(&old).unwrap(), "secret-3");
        assert_eq!(std::fs::read_to_string(&other_link).unwrap(), "old");
    }

    #[test]
    fn generate_key_pair_writes_an_owner_only_private_key_and_refuses_existing_ones() {
        let dir = tempfile::tempdir().unwrap();
        let prefix = dir.path().join("release");
        let args = || KeyPairArgs {
            output_prefix: prefix.clone(),
            password_env: "SLUICE_TEST_UNSET_PASSWORD_ENV".into(),
            force: false,
        };
        generate_key_pair(args()).unwrap();
        assert_eq!(mode(&prefix.with_extension("key")), 0o600);
        let private = std::fs::read_to_string(prefix.with_extension("key")).unwrap();
        let err = generate_key_pair(args()).unwrap_err();
        assert!(
            err.message
                .ends_with("release.key exists; pass --force to overwrite"),
            "{}",
            err.message
        );
        assert_eq!(
            std::fs::read_to_string(prefix.with_extension("key")).unwrap(),
            private,
            "the existing key is kept"
        );
    }

    #[test]
    fn the_registry_a_command_names_is_the_one_its_helper_is_asked_about() {
        let push = |target: &str| {
            BundleCommand::Push(PushArgs {
                layout: "layout".into(),
                target: target.into(),
                json: false,
            })
            .registry()
        };
        assert_eq!(
            push("registry.example:5000/mesh/config:v1").as_deref(),
            Some("registry.example:5000")
        );
        assert_eq!(push("not-a-reference"), None);
        let dir = tempfile::tempdir().unwrap();
        let inspect = |target: &str| {
            BundleCommand::Inspect(InspectArgs {
                target: target.into(),
                output: Format::Text,
            })
            .registry()
        };
        assert_eq!(
            inspect(dir.path().to_str().unwrap()),
            None,
            "a local layout"
        );
        assert_eq!(
            inspect(&format!(
                "127.0.0.1:5000/mesh/config@sha256:{}",
                "0".repeat(64)
            ))
            .as_deref(),
            Some("127.0.0.1:5000")
        );
    }

    #[test]
    fn cli_definition_is_consistent() {
        use clap::CommandFactory;
        crate::Cli::command().debug_assert();
    }
}
