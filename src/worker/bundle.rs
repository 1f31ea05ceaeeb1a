//! A job's content bundle on a worker: fetched from the object store, its SHA-256 checked
//! against the digest its name carries (`bundles/<sha256>.tar.gz`), and unpacked into the job
//! directory so that no entry can write outside it (no `..`, no absolute paths, no devices,
//! and no link that leads out once every link of the unpacked tree is followed as the
//! kernel would: `resolve_beneath`). Must not run anything from the bundle.

use std::collections::VecDeque;
use std::ffi::OsString;
use std::io::Read;
use std::path::{Component, Path, PathBuf};

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
    floor: u64,
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
    unpack(flate2::read::GzDecoder::new(file), into, floor)
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

/// Unpacks a tar stream into `into`, refusing any entry that could write outside it, and
/// any file that would leave the disk with fewer than `floor` bytes free: each entry's size
/// is known from its header before it is written, so a small archive that inflates to more
/// than the disk can hold (a gzip bomb) is refused before it fills it.
pub fn unpack(reader: impl Read, into: &Path, floor: u64) -> Result<(), String> {
    std::fs::create_dir_all(into).map_err(|e| format!("{}: {e}", into.display()))?;
    let mut budget = super::agent::free_bytes(into).saturating_sub(floor);
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
        let size = entry.header().size().unwrap_or(u64::MAX);
        if kind.is_file() || kind.is_contiguous() {
            budget = budget.checked_sub(size).ok_or_else(|| {
                format!(
                    "the bundle unpacks to more than the disk holds above its floor of {floor} free bytes (at `{}`; the floor is the job's TPU_RUNNER_MIN_ROOT_FREE_KB, else the runner's)",
                    path.display()
                )
            })?;
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
    // Each link was judged alone above; links chain (`d -> .` makes `d/d/d/c -> ../..` climb
    // from the top): judge every link where it leads in the tree as unpacked.
    check_links(into, Path::new(""), 0)
}

/// How deep a bundle's folders may nest.
const MAX_DEPTH: usize = 256;

/// Every link under `root/rel` must resolve beneath `root`, links followed as the kernel
/// follows them.
fn check_links(root: &Path, rel: &Path, depth: usize) -> Result<(), String> {
    if depth > MAX_DEPTH {
        return Err(format!(
            "the bundle nests folders deeper than {MAX_DEPTH} at `{}`",
            rel.display()
        ));
    }
    let dir = root.join(rel);
    let entries = std::fs::read_dir(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    for entry in entries {
        let entry = entry.map_err(|e| format!("{}: {e}", dir.display()))?;
        let path = rel.join(entry.file_name());
        let kind = entry
            .file_type()
            .map_err(|e| format!("{}: {e}", path.display()))?;
        if kind.is_symlink() {
            if resolve_beneath(root, &path).is_none() {
                let target = std::fs::read_link(root.join(&path)).unwrap_or_default();
                return Err(format!(
                    "the bundle link `{}` → `{}` leads outside the job directory once the links before it are followed",
                    path.display(),
                    target.display()
                ));
            }
        } else if kind.is_dir() {
            check_links(root, &path, depth + 1)?;
        }
    }
    Ok(())
}

/// The steps of a relative path (`..` kept, `.` dropped); `None` for an absolute one.
fn relative_steps(path: &Path) -> Option<VecDeque<OsString>> {
    let mut steps = VecDeque::new();
    for c in path.components() {
        match c {
            Component::Normal(n) => steps.push_back(n.to_owned()),
            Component::ParentDir => steps.push_back("..".into()),
            Component::CurDir => {}
            Component::RootDir | Component::Prefix(_) => return None,
        }
    }
    Some(steps)
}

/// Where `rel` leads beneath `root` as the kernel resolves it — every link on the way
/// followed, `..` applied to where the path really is — as a path relative to `root` free of
/// links; `None` if it leaves `root` at any step, goes through an absolute link, or loops (40
/// links, the kernel's own bound). What does not exist yet is taken as written (a folder to
/// be made). The one rule for paths in the job directory: the bundle's links and the caches
/// the agent links there are both judged by it.
pub fn resolve_beneath(root: &Path, rel: &Path) -> Option<PathBuf> {
    let mut pending = relative_steps(rel)?;
    let mut real: Vec<OsString> = Vec::new();
    let mut links = 0;
    while let Some(name) = pending.pop_front() {
        if name == ".." {
            real.pop()?;
            continue;
        }
        let here: PathBuf = root.join(real.iter().collect::<PathBuf>()).join(&name);
        match std::fs::symlink_metadata(&here) {
            Ok(meta) if meta.file_type().is_symlink() => {
                links += 1;
                if links > 40 {
                    return None;
                }
                let mut front = relative_steps(&std::fs::read_link(&here).ok()?)?;
                front.extend(pending.drain(..));
                pending = front;
            }
            _ => real.push(name),
        }
    }
    Some(real.iter().collect())
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

    /// A small archive that inflates past the disk's floor (a gzip bomb of zeros) is refused
    /// from its headers, before its files are written; under the floor it unpacks.
    #[test]
    fn a_bundle_that_would_eat_the_floor_is_refused_before_it_is_written() {
        let dir = tempfile::tempdir().unwrap();
        let free = crate::worker::agent::free_bytes(dir.path());
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
        {
            let mut tar = tar::Builder::new(&mut gz);
            let mut h = tar::Header::new_gnu();
            h.set_entry_type(tar::EntryType::Regular);
            h.set_size(64 << 20);
            h.set_mode(0o644);
            tar.append_data(&mut h, "zeros", std::io::repeat(0).take(64 << 20))
                .unwrap();
            tar.finish().unwrap();
        }
        let bomb = gz.finish().unwrap();
        assert!(bomb.len() < 1 << 20, "{} bytes", bomb.len());
        let floor = free.saturating_sub(32 << 20);
        let into = dir.path().join("job");
        let e = unpack(flate2::read::GzDecoder::new(&bomb[..]), &into, floor).unwrap_err();
        assert!(
            e.contains("more than the disk holds above its floor"),
            "{e}"
        );
        assert!(!into.join("zeros").exists(), "written before the check");
        unpack(flate2::read::GzDecoder::new(&bomb[..]), &into, 0).unwrap();
        assert_eq!(
            std::fs::metadata(into.join("zeros")).unwrap().len(),
            64 << 20
        );
    }

    /// `d -> .` then `d/d/d/d/d/d/d/d/c -> ../../../../../../../..`: each link alone stays
    /// inside; `c` lands at the top and climbs eight levels out.
    #[test]
    fn links_that_escape_by_chaining_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let mut tar = tar::Builder::new(Vec::new());
        let link = |tar: &mut tar::Builder<Vec<u8>>, path: &str, target: &str| {
            let mut h = tar::Header::new_gnu();
            h.set_entry_type(tar::EntryType::Symlink);
            h.set_size(0);
            h.set_mode(0o777);
            tar.append_link(&mut h, path, target).unwrap();
        };
        link(&mut tar, "d", ".");
        link(&mut tar, "d/d/d/d/d/d/d/d/c", "../../../../../../../..");
        let bytes = tar.into_inner().unwrap();
        let job = dir.path().join("root/job");
        let e = unpack(&bytes[..], &job, 0).unwrap_err();
        assert!(e.contains("`c`") && e.contains("leads outside"), "{e}");
        // Links that stay inside however they chain are kept.
        let mut tar = tar::Builder::new(Vec::new());
        link(&mut tar, "d", ".");
        link(&mut tar, "d/d/e", "d/f");
        let ok = dir.path().join("ok");
        unpack(&tar.into_inner().unwrap()[..], &ok, 0).unwrap();
        assert_eq!(
            resolve_beneath(&ok, Path::new("e/x")),
            Some(PathBuf::from("f/x"))
        );
        assert_eq!(resolve_beneath(&ok, Path::new("d/d/../..")), None);
        std::os::unix::fs::symlink("loop", ok.join("loop")).unwrap();
        assert_eq!(resolve_beneath(&ok, Path::new("loop")), None);
    }

    #[test]
    fn paths_that_climb_out_are_caught() {
        assert!(stays_inside(Path::new("a/b/../c")));
        assert!(!stays_inside(Path::new("a/../../etc")));
        assert!(!stays_inside(Path::new("/etc/passwd")));
    }
}
