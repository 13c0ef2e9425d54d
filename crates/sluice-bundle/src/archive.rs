//! The bundle's single layer: a reproducible tar+gzip of the manifests directory.
//!
//! Owns packing and unpacking that archive. Packing is byte-for-byte reproducible: entries sorted
//! by path, directories before their contents, every entry owned by 0:0 with empty owner names,
//! mode 0644 (files) or 0755 (directories), mtime 0, and a gzip header with no name and mtime 0.
//! The same files therefore always give the same layer digest (for a given `flate2` backend).
//! Unpacking must never write to disk, follow links, or accept paths that leave the archive, and
//! it stops at a limit ([`MAX_UNPACKED_BYTES`] unless the caller sets another) so a hostile
//! layer cannot exhaust memory.

use std::collections::BTreeSet;
use std::io::Read;

use flate2::Compression;

use crate::error::{BundleError, Result};
use crate::manifests::{ManifestFile, is_manifest_name, validate_path};

/// Default upper bound on the unpacked size of a bundle layer (64 MiB); a client may set
/// another ([`crate::RegistryOptions::max_unpacked_bytes`]).
pub const MAX_UNPACKED_BYTES: u64 = 64 * 1024 * 1024;

/// Packs files (any order) into the reproducible tar+gzip described in the module docs.
pub fn pack(files: &[ManifestFile]) -> Vec<u8> {
    let mut entries: BTreeSet<String> = BTreeSet::new();
    for file in files {
        let mut prefix = String::new();
        let components: Vec<&str> = file.path.split('/').collect();
        for dir in &components[..components.len() - 1] {
            prefix.push_str(dir);
            prefix.push('/');
            entries.insert(prefix.clone());
        }
        entries.insert(file.path.clone());
    }
    let encoder = flate2::GzBuilder::new()
        .mtime(0)
        .write(Vec::new(), Compression::default());
    let mut builder = tar::Builder::new(encoder);
    builder.mode(tar::HeaderMode::Deterministic);
    for entry in &entries {
        let mut header = tar::Header::new_gnu();
        header.set_uid(0);
        header.set_gid(0);
        header.set_mtime(0);
        // Empty owner names never fail to set.
        let _ = header.set_username("");
        let _ = header.set_groupname("");
        if entry.ends_with('/') {
            header.set_entry_type(tar::EntryType::Directory);
            header.set_mode(0o755);
            header.set_size(0);
            builder
                .append_data(&mut header, entry, std::io::empty())
                .expect("writing a tar entry into memory cannot fail");
        } else {
            let file = files
                .iter()
                .find(|f| &f.path == entry)
                .expect("every non-directory entry comes from a file");
            header.set_entry_type(tar::EntryType::Regular);
            header.set_mode(0o644);
            header.set_size(file.contents.len() as u64);
            builder
                .append_data(&mut header, entry, file.contents.as_slice())
                .expect("writing a tar entry into memory cannot fail");
        }
    }
    let encoder = builder
        .into_inner()
        .expect("finishing a tar archive in memory cannot fail");
    encoder
        .finish()
        .expect("finishing a gzip stream in memory cannot fail")
}

/// Unpacks a bundle layer into its manifest files (sorted by path). Directory entries are
/// implied by paths and dropped; files that are not manifests (by extension) are dropped too,
/// as Argo CD's directory source ignores them; links, devices and unsafe paths are refused.
///
/// The layer must be exactly one gzip member: Go's reader (Argo CD's) reads every member of a
/// multi-member stream, so bytes after the first member would be files Argo CD applies and
/// this check never saw.
pub fn unpack(layer: &[u8], location: &str) -> Result<Vec<ManifestFile>> {
    unpack_limited(layer, location, MAX_UNPACKED_BYTES)
}

/// [`unpack`] with the files' total size bounded by `max_unpacked` bytes instead of
/// [`MAX_UNPACKED_BYTES`]; a layer over it is refused naming the limit.
pub fn unpack_limited(
    layer: &[u8],
    location: &str,
    max_unpacked: u64,
) -> Result<Vec<ManifestFile>> {
    let limited = flate2::bufread::GzDecoder::new(layer).take(max_unpacked.saturating_add(1));
    let mut archive = tar::Archive::new(limited);
    let mut files = Vec::new();
    let mut total: u64 = 0;
    let entries = archive.entries().map_err(|e| {
        BundleError::invalid(location, format!("layer is not a tar+gzip archive: {e}"))
    })?;
    for entry in entries {
        let mut entry = entry.map_err(|e| {
            BundleError::invalid(location, format!("layer archive is corrupt: {e}"))
        })?;
        let raw_path = entry
            .path()
            .map_err(|e| BundleError::invalid(location, format!("unreadable entry path: {e}")))?
            .to_string_lossy()
            .into_owned();
        let path = raw_path
            .trim_start_matches("./")
            .trim_end_matches('/')
            .to_string();
        let entry_location = format!("{location}:{raw_path}");
        match entry.header().entry_type() {
            tar::EntryType::Directory => {
                if !path.is_empty() && path != "." {
                    validate_path(&path).map_err(|_| {
                        BundleError::invalid(&entry_location, "unsafe directory path in the layer")
                    })?;
                }
                continue;
            }
            tar::EntryType::Regular | tar::EntryType::Continuous => {}
            // pax/GNU metadata entries are consumed by the tar reader itself.
            tar::EntryType::XGlobalHeader | tar::EntryType::XHeader => continue,
            other => {
                return Err(BundleError::invalid(
                    entry_location,
                    format!(
                        "entry type {other:?} is not allowed in a bundle (only files and directories)"
                    ),
                ));
            }
        }
        validate_path(&path).map_err(|_| {
            BundleError::invalid(
                &entry_location,
                "unsafe path in the layer (absolute or leaving the archive)",
            )
        })?;
        let size = entry.header().size().unwrap_or(0);
        total = total.saturating_add(size);
        if total > max_unpacked {
            return Err(BundleError::invalid(
                location,
                format!(
                    "layer unpacks to more than {max_unpacked} bytes, the unpacked-size limit; split the bundle or raise the limit"
                ),
            ));
        }
        let name = path.rsplit('/').next().unwrap_or(&path);
        if !is_manifest_name(name) || name.starts_with('.') {
            continue;
        }
        let mut contents = Vec::with_capacity(size as usize);
        entry.read_to_end(&mut contents).map_err(|e| {
            BundleError::invalid(&entry_location, format!("cannot read entry: {e}"))
        })?;
        files.push(ManifestFile { path, contents });
    }
    // The rest of the first member (the tar end-of-archive blocks), then nothing at all.
    let mut decoder = archive.into_inner().into_inner();
    std::io::copy(&mut (&mut decoder).take(max_unpacked), &mut std::io::sink())
        .map_err(|e| BundleError::invalid(location, format!("layer archive is corrupt: {e}")))?;
    if !decoder.get_ref().is_empty() {
        return Err(BundleError::invalid(
            location,
            format!(
                "{} bytes follow the layer's gzip stream (a second gzip member or trailing \
                 data, which Argo CD would read and this check would not); rebuild the bundle",
                decoder.get_ref().len()
            ),
        ));
    }
    files.sort_by(|a, b| a.path.cmp(&b.path));
    Ok(files)
}

#[cfg(test)]
mod tests {
    use super::*;
    use flate2::read::GzDecoder;

    #[test]
    fn a_second_gzip_member_or_trailing_bytes_are_refused() {
        let layer = pack(&files());
        assert!(unpack(&layer, "l").is_ok());
        // A second member holding another manifest: Go's multistream reader would see it.
        let mut two = layer.clone();
        two.extend(pack(&[ManifestFile {
            path: "hidden.yaml".into(),
            contents: b"kind: EnvoyFilter\n".to_vec(),
        }]));
        let err = unpack(&two, "l").unwrap_err().to_string();
        assert!(
            err.contains("follow the layer's gzip stream (a second gzip member"),
            "{err}"
        );
        let mut trailing = layer;
        trailing.extend_from_slice(b"junk");
        let err = unpack(&trailing, "l").unwrap_err().to_string();
        assert!(
            err.contains("4 bytes follow the layer's gzip stream"),
            "{err}"
        );
    }

    fn files() -> Vec<ManifestFile> {
        vec![
            ManifestFile {
                path: "z.yaml".into(),
                contents: b"kind: A\n".to_vec(),
            },
            ManifestFile {
                path: "dir/b.yaml".into(),
                contents: b"kind: B\n".to_vec(),
            },
            ManifestFile {
                path: "a.json".into(),
                contents: b"{}".to_vec(),
            },
        ]
    }

    #[test]
    fn pack_is_reproducible_and_order_independent() {
        let one = pack(&files());
        let mut reversed = files();
        reversed.reverse();
        let two = pack(&reversed);
        assert_eq!(one, two);
        // gzip header: magic, deflate, no flags (no name), mtime 0.
        assert_eq!(&one[..4], &[0x1f, 0x8b, 8, 0]);
        assert_eq!(&one[4..8], &[0, 0, 0, 0]);
    }

    #[test]
    fn pack_fixes_owners_modes_times_and_orders_entries() {
        let layer = pack(&files());
        let mut archive = tar::Archive::new(GzDecoder::new(layer.as_slice()));
        let mut seen = Vec::new();
        for entry in archive.entries().unwrap() {
            let entry = entry.unwrap();
            let h = entry.header();
            assert_eq!(h.uid().unwrap(), 0);
            assert_eq!(h.gid().unwrap(), 0);
            assert_eq!(h.mtime().unwrap(), 0);
            assert_eq!(h.username().unwrap(), Some(""));
            let mode = h.mode().unwrap();
            let path = entry.path().unwrap().to_string_lossy().into_owned();
            if path.ends_with('/') {
                assert_eq!(mode, 0o755, "{path}");
            } else {
                assert_eq!(mode, 0o644, "{path}");
            }
            seen.push(path);
        }
        assert_eq!(seen, ["a.json", "dir/", "dir/b.yaml", "z.yaml"]);
    }

    #[test]
    fn unpack_round_trips() {
        let mut want = files();
        want.sort_by(|a, b| a.path.cmp(&b.path));
        assert_eq!(unpack(&pack(&files()), "layer").unwrap(), want);
    }

    fn layer_with(entry_type: tar::EntryType, path: &str, data: &[u8]) -> Vec<u8> {
        let mut builder = tar::Builder::new(Vec::new());
        let mut header = tar::Header::new_gnu();
        header.set_entry_type(entry_type);
        header.set_size(data.len() as u64);
        header.set_mode(0o644);
        // set_path refuses "..": write the raw name bytes like a hostile producer would.
        let name = &mut header.as_old_mut().name;
        name[..path.len()].copy_from_slice(path.as_bytes());
        header.set_cksum();
        builder.append(&header, data).unwrap();
        let tar = builder.into_inner().unwrap();
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), Compression::default());
        std::io::Write::write_all(&mut gz, &tar).unwrap();
        gz.finish().unwrap()
    }

    #[test]
    fn unpack_refuses_links_and_escaping_paths_and_skips_non_manifests() {
        let cases = [
            (tar::EntryType::Symlink, "link.yaml", "not allowed"),
            (tar::EntryType::Regular, "../evil.yaml", "unsafe path"),
            (tar::EntryType::Regular, "/etc/evil.yaml", "unsafe path"),
        ];
        for (kind, path, want) in cases {
            let err = unpack(&layer_with(kind, path, b"x"), "layer").unwrap_err();
            assert!(err.to_string().contains(want), "{path}: {err}");
        }
        let skipped = unpack(
            &layer_with(tar::EntryType::Regular, "README.md", b"x"),
            "layer",
        )
        .unwrap();
        assert!(skipped.is_empty());
        let dotted = unpack(
            &layer_with(tar::EntryType::Regular, "./a.yaml", b"x"),
            "layer",
        )
        .unwrap();
        assert_eq!(dotted[0].path, "a.yaml");
    }

    #[test]
    fn unpack_refuses_garbage() {
        let err = unpack(b"not gzip at all", "layer").unwrap_err();
        assert_eq!(err.category(), "InvalidManifests");
    }
}
