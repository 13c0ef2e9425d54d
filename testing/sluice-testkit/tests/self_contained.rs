//! The repository depends on nothing beside it: no file under version control reads or names the
//! folder next to the clone that only the project's own machines have. A user's clone has
//! nothing beside it, and CI always has that folder, so only this check catches a dependency on it.

use std::path::Path;
use std::process::Command;

use sluice_testkit::prereq;

/// The needle, built so this file does not contain it literally.
fn needle() -> String {
    format!("{}/{}", "..", "shared")
}

#[test]
fn no_tracked_file_reads_anything_beside_the_repository() {
    let Some(git) = prereq::require_binary("git") else {
        return;
    };
    let root = prereq::repo_root();
    let out = Command::new(git)
        .args([
            "ls-files",
            "-z",
            "--cached",
            "--others",
            "--exclude-standard",
        ])
        .current_dir(&root)
        .output()
        .expect("git ls-files runs");
    assert!(
        out.status.success(),
        "git ls-files failed in {}: {}",
        root.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    let needle = needle();
    let mut offenders = Vec::new();
    let mut scanned = 0;
    for file in out.stdout.split(|b| *b == 0).filter(|f| !f.is_empty()) {
        let rel = String::from_utf8_lossy(file).into_owned();
        let Ok(bytes) = std::fs::read(root.join(&rel)) else {
            continue; // deleted in the work tree
        };
        scanned += 1;
        let text = String::from_utf8_lossy(&bytes);
        for (n, line) in text.lines().enumerate() {
            if line.contains(&needle) {
                offenders.push(format!("{rel}:{}: {}", n + 1, line.trim()));
            }
        }
    }
    assert!(
        scanned > 100,
        "only {scanned} files scanned under {}",
        root.display()
    );
    assert!(
        offenders.is_empty(),
        "{} line(s) read or name `{needle}`, which a user's clone does not have; fetch what is \
         needed in scripts/install-tools.sh (into .tools/) instead:\n{}",
        offenders.len(),
        offenders.join("\n")
    );
}

#[test]
fn the_upstream_crds_live_inside_the_repository() {
    let root = prereq::upstream_root();
    assert!(
        root.starts_with(prereq::repo_root()),
        "{} is outside the repository",
        root.display()
    );
    assert!(Path::new(&root).ends_with(".tools/crds"));
}
