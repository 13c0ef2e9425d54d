//! The Kubernetes API emulator with CRDs installed, the world most operator tests start from.
//! Reads CRD files only; never installs anything the test did not name.

use std::path::{Path, PathBuf};

use kube_emulator::Emulator;

/// The file of a sluice CRD in the repository's `crds/`, e.g. `bundlepins.sluice.dev.yaml`.
pub fn sluice_crd(file: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../crds")
        .join(file)
}

/// Starts an API emulator (no RBAC) with the CRDs in `files` installed, in order; panics naming
/// the file that does not load.
pub async fn emulator_with(files: impl IntoIterator<Item = impl AsRef<Path>>) -> Emulator {
    let emu = Emulator::start().await;
    for file in files {
        let file = file.as_ref();
        emu.load_manifest_file(file)
            .unwrap_or_else(|e| panic!("loading {}: {e}", file.display()));
    }
    emu
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sluice_crds_are_found_in_the_repository() {
        let file = sluice_crd("bundlepins.sluice.dev.yaml");
        assert!(file.is_file(), "{}", file.display());
    }
}
