//! `crdgen`: writes one CustomResourceDefinition YAML per sluice.dev kind into `crds/` and an
//! identical copy into `charts/sluice/crds/`, and removes stale `*.sluice.dev.yaml` files there.
//!
//! Usage: `cargo run -p sluice-api --bin crdgen [-- <repo-root>]` (default: the repository this
//! crate lives in).

use std::path::{Path, PathBuf};
use std::process::ExitCode;

fn write_dir(dir: &Path, files: &[(String, String)]) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        let name = path
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or_default();
        if name.ends_with(".sluice.dev.yaml") && !files.iter().any(|(f, _)| f == name) {
            std::fs::remove_file(&path)?;
        }
    }
    for (name, text) in files {
        std::fs::write(dir.join(name), text)?;
    }
    Ok(())
}

fn main() -> ExitCode {
    let root = std::env::args_os()
        .nth(1)
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../.."));
    let root = root.canonicalize().unwrap_or(root);
    let files = match sluice_api::crds::files() {
        Ok(f) => f,
        Err(e) => {
            eprintln!("crdgen: cannot render a CRD as YAML: {e}");
            return ExitCode::FAILURE;
        }
    };
    for dir in [root.join("crds"), root.join("charts/sluice/crds")] {
        if let Err(e) = write_dir(&dir, &files) {
            eprintln!(
                "crdgen: cannot write {}: {e}; check the directory exists and is writable",
                dir.display()
            );
            return ExitCode::FAILURE;
        }
        println!("crdgen: wrote {} files to {}", files.len(), dir.display());
    }
    ExitCode::SUCCESS
}
