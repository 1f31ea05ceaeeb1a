//! A job's content bundle on a worker: fetched from the object store, its SHA-256 checked
//! against the digest its name carries (`bundles/<sha256>.tar.gz`), and unpacked into the job
//! directory so that no entry can write outside it (no `..`, no absolute paths, no links
//! that lead out, no devices). Must not run anything from the bundle.

use std::io::Read;
use std::path::{Component, Path};

use sha2::{Digest, Sha256};

use crate::objects::ObjectStore;

/// The most a bundle may weigh (compressed).
pub const BUNDLE_LIMIT: u64 = 64 << 30;

/// The digest a bundle address names (`…/bundles/<64 hex>.tar.gz`), if it names one.
pub fn sha256_of_uri(uri: &str) -> Option<String> {
    let file = uri.rsplit('/').next()?;
    let hex = file.strip_suffix(".tar.gz")?;
    let in_bundles = uri.contains("/bundles/");
    (in_bundles && hex.len() == 64 && hex.bytes().all(|b| b.is_ascii_hexdigit()))
        .then(|| hex.to_ascii_lowercase())
}

/// The SHA-256 of a file, in hex.
pub fn sha256_file(path: &Path) -> std::io::Result<String> {
    let mut file = std::fs::File::open(path)?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1 << 16];
    loop {
        let n = file.read(&mut buf)?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
    }
    Ok(hex::encode(hasher.finalize()))
}

/// Fetches the bundle at `uri` into `download` (a file path), checks its digest, and
/// unpacks it into `into`. The error says what was wrong, for the set-up failure.
pub fn fetch_and_unpack(
    objects: &dyn ObjectStore,
    uri: &str,
    download: &Path,
    into: &Path,
) -> Result<(), String> {
    let found = objects
        .download(uri, download, BUNDLE_LIMIT)
        .map_err(|e| format!("cannot fetch the bundle: {e}"))?;
    if !found {
        return Err(format!("the bundle {uri} does not exist"));
    }
    if let Some(want) = sha256_of_uri(uri) {
        let got = sha256_file(download).map_err(|e| format!("cannot read the bundle: {e}"))?;
        if got != want {
            return Err(format!(
                "bundle checksum mismatch: {uri} should have SHA-256 {want} but has {got}"
            ));
        }
    }
    let file = std::fs::File::open(download).map_err(|e| format!("cannot open the bundle: {e}"))?;
    unpack(flate2::read::GzDecoder::new(file), into)
}

/// Whether `path` (relative, from the bundle) stays inside the directory it is unpacked in.
fn stays_inside(path: &Path) -> bool {
    let mut depth = 0i64;
    for c in path.components() {
        match c {
            Component::Normal(_) => depth += 1,
            Component::CurDir => {}
            Component::ParentDir => {
                depth -= 1;
                if depth < 0 {
                    return false;
                }
            }
            Component::RootDir | Component::Prefix(_) => return false,
        }
    }
    true
}

/// Unpacks a tar stream into `into`, refusing any entry that could write outside it.
pub fn unpack(reader: impl Read, into: &Path) -> Result<(), String> {
    std::fs::create_dir_all(into).map_err(|e| format!("{}: {e}", into.display()))?;
    let mut archive = tar::Archive::new(reader);
    archive.set_preserve_permissions(false);
    archive.set_overwrite(true);
    let entries = archive
        .entries()
        .map_err(|e| format!("the bundle is not a tar.gz archive: {e}"))?;
    for entry in entries {
        let mut entry = entry.map_err(|e| format!("the bundle is damaged: {e}"))?;
        let path = entry
            .path()
            .map_err(|e| format!("a bundle entry has an unreadable name: {e}"))?
            .into_owned();
        if !stays_inside(&path) || path.as_os_str().is_empty() {
            return Err(format!(
                "the bundle entry `{}` points outside the job directory",
                path.display()
            ));
        }
        let kind = entry.header().entry_type();
        if kind.is_symlink() || kind.is_hard_link() {
            let target = entry
                .link_name()
                .map_err(|e| format!("a bundle link has an unreadable target: {e}"))?
                .ok_or_else(|| format!("the bundle link `{}` has no target", path.display()))?
                .into_owned();
            // A symlink's target is relative to its folder; a hard link's to the root.
            let resolved = if kind.is_symlink() {
                path.parent().unwrap_or(Path::new("")).join(&target)
            } else {
                target.clone()
            };
            if target.is_absolute() || !stays_inside(&resolved) {
                return Err(format!(
                    "the bundle link `{}` → `{}` points outside the job directory",
                    path.display(),
                    target.display()
                ));
            }
        } else if !(kind.is_file()
            || kind.is_dir()
            || kind.is_pax_global_extensions()
            || kind.is_pax_local_extensions()
            || kind.is_gnu_longname()
            || kind.is_gnu_longlink()
            || kind.is_contiguous())
        {
            return Err(format!(
                "the bundle entry `{}` is a device or another special file",
                path.display()
            ));
        }
        // `unpack_in` also refuses to follow a link already unpacked out of `into`.
        let inside = entry
            .unpack_in(into)
            .map_err(|e| format!("cannot unpack `{}`: {e}", path.display()))?;
        if !inside {
            return Err(format!(
                "the bundle entry `{}` points outside the job directory",
                path.display()
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn digests_are_read_only_from_bundle_names() {
        let hex = "ab".repeat(32);
        assert_eq!(
            sha256_of_uri(&format!("gs://b/bundles/{hex}.tar.gz")),
            Some(hex.clone())
        );
        assert_eq!(sha256_of_uri(&format!("gs://b/other/{hex}.tar.gz")), None);
        assert_eq!(sha256_of_uri("gs://b/bundles/short.tar.gz"), None);
    }

    #[test]
    fn paths_that_climb_out_are_caught() {
        assert!(stays_inside(Path::new("a/b/../c")));
        assert!(!stays_inside(Path::new("a/../../etc")));
        assert!(!stays_inside(Path::new("/etc/passwd")));
    }
}
