//! A job's content bundle on the submitting side (§6.1): the files of a directory, walked
//! without following links, minus what is never code (`.git`, virtualenvs, caches, `*.pyc`)
//! and what `.tpu-runnerignore` names, archived as a deterministic `tar.gz` (sorted paths,
//! owner 0, mtime 0, fixed compression): the same content gives the same bytes, so its
//! SHA-256 names it and workers verify it. A tar file is used as it is. Reads only the
//! bundle's own files; never uploads.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

/// The most a bundle built here may weigh, compressed (larger code goes in a `gs://` bundle).
pub const LIMIT: u64 = 2 << 30;

/// Path components never bundled.
const ALWAYS_SKIPPED: [&str; 7] = [
    ".git",
    ".venv",
    ".mypy_cache",
    ".pytest_cache",
    ".ruff_cache",
    ".DS_Store",
    "__pycache__",
];

/// A bundle ready to upload.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Bundle {
    /// The archive's bytes.
    pub data: Vec<u8>,
    /// Their SHA-256, hex (the object's name: `bundles/<sha256>.tar.gz`).
    pub sha256: String,
    /// Files, links and folders in it.
    pub entries: usize,
}

/// One `.tpu-runnerignore` pattern.
struct Ignore {
    pattern: glob::Pattern,
    /// With a `/`: matched against the whole relative path; else against each component.
    whole_path: bool,
}

fn read_ignores(dir: &Path) -> Result<Vec<Ignore>, String> {
    let path = dir.join(".tpu-runnerignore");
    let text = match crate::files::read_text(&path, 1 << 20) {
        Ok(text) => text,
        Err(crate::files::ReadError::Io(e)) if e.kind() == std::io::ErrorKind::NotFound => {
            return Ok(Vec::new());
        }
        Err(e) => return Err(format!("{}: {e}", path.display())),
    };
    let mut ignores = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let trimmed = line.trim_matches('/');
        let pattern = glob::Pattern::new(trimmed).map_err(|e| {
            format!(
                "{}:{}: `{line}` is not a glob pattern: {e}",
                path.display(),
                n + 1
            )
        })?;
        ignores.push(Ignore {
            pattern,
            whole_path: trimmed.contains('/'),
        });
    }
    Ok(ignores)
}

fn skipped(relative: &str, ignores: &[Ignore]) -> bool {
    let components: Vec<&str> = relative.split('/').collect();
    if components
        .iter()
        .any(|c| ALWAYS_SKIPPED.contains(c) || c.ends_with(".pyc"))
    {
        return true;
    }
    let options = glob::MatchOptions {
        case_sensitive: true,
        require_literal_separator: false,
        require_literal_leading_dot: false,
    };
    ignores.iter().any(|i| {
        if i.whole_path {
            i.pattern.matches_with(relative, options)
        } else {
            components
                .iter()
                .any(|c| i.pattern.matches_with(c, options))
        }
    })
}

/// Every path to bundle under `dir`, relative, sorted; folders included.
fn walk(dir: &Path, ignores: &[Ignore]) -> Result<Vec<(String, PathBuf)>, String> {
    let mut found = Vec::new();
    let mut stack = vec![PathBuf::new()];
    while let Some(relative) = stack.pop() {
        let entries = std::fs::read_dir(dir.join(&relative))
            .map_err(|e| format!("{}: {e}", dir.join(&relative).display()))?;
        for entry in entries {
            let entry = entry.map_err(|e| format!("{}: {e}", dir.display()))?;
            let name = entry.file_name();
            let Some(name) = name.to_str() else {
                return Err(format!(
                    "{}: a file name that is not UTF-8 cannot be bundled",
                    entry.path().display()
                ));
            };
            let rel = relative.join(name);
            let text = rel.to_string_lossy().into_owned();
            if skipped(&text, ignores) {
                continue;
            }
            let kind = entry
                .file_type()
                .map_err(|e| format!("{}: {e}", entry.path().display()))?;
            if kind.is_dir() {
                stack.push(rel.clone());
            }
            found.push((text, rel));
        }
    }
    found.sort();
    Ok(found)
}

/// The bundle of `dir`.
pub fn of_directory(dir: &Path) -> Result<Bundle, String> {
    let ignores = read_ignores(dir)?;
    let paths = walk(dir, &ignores)?;
    let gz = flate2::GzBuilder::new()
        .mtime(0)
        .write(Vec::new(), flate2::Compression::new(6));
    let mut tar = tar::Builder::new(gz);
    tar.mode(tar::HeaderMode::Deterministic);
    tar.follow_symlinks(false);
    for (text, rel) in &paths {
        let full = dir.join(rel);
        let meta =
            std::fs::symlink_metadata(&full).map_err(|e| format!("{}: {e}", full.display()))?;
        let mut header = tar::Header::new_gnu();
        header.set_mode(meta.permissions().mode() & 0o7777);
        header.set_uid(0);
        header.set_gid(0);
        header.set_mtime(0);
        let kind = meta.file_type();
        let added = if kind.is_symlink() {
            let target =
                std::fs::read_link(&full).map_err(|e| format!("{}: {e}", full.display()))?;
            header.set_entry_type(tar::EntryType::Symlink);
            header.set_size(0);
            tar.append_link(&mut header, text, &target)
        } else if kind.is_dir() {
            header.set_entry_type(tar::EntryType::Directory);
            header.set_size(0);
            tar.append_data(&mut header, text, std::io::empty())
        } else if kind.is_file() {
            header.set_entry_type(tar::EntryType::Regular);
            header.set_size(meta.len());
            // Opened without blocking and checked as opened: a file swapped for a FIFO
            // after the walk saw it is refused, not waited on.
            let (file, _) = crate::files::open_regular(&full)
                .map_err(|e| format!("{}: {e}", full.display()))?;
            tar.append_data(&mut header, text, file)
        } else {
            return Err(format!(
                "{}: only files, folders and links can be bundled",
                full.display()
            ));
        };
        added.map_err(|e| format!("{}: {e}", full.display()))?;
        if tar.get_ref().get_ref().len() as u64 > LIMIT {
            return Err(too_big(dir));
        }
    }
    let data = tar
        .into_inner()
        .and_then(|gz| gz.finish())
        .map_err(|e| format!("{}: {e}", dir.display()))?;
    Ok(Bundle {
        sha256: hex::encode(Sha256::digest(&data)),
        data,
        entries: paths.len(),
    })
}

fn too_big(path: &Path) -> String {
    format!(
        "{}: the bundle would exceed {} GiB; upload large files to a bucket and name a `gs://` bundle",
        path.display(),
        LIMIT >> 30
    )
}

/// The bundle of a tar archive, used as it is.
pub fn of_archive(path: &Path) -> Result<Bundle, String> {
    let data = crate::files::read_bytes(path, LIMIT).map_err(|e| match e {
        crate::files::ReadError::TooLarge(_) => too_big(path),
        e => format!("{}: {e}", path.display()),
    })?;
    Ok(Bundle {
        sha256: hex::encode(Sha256::digest(&data)),
        data,
        entries: 0,
    })
}

/// The bundle a job names: a folder or a tar archive, relative to `base` (the manifest's
/// folder).
pub fn build(bundle: &str, base: &Path) -> Result<Bundle, String> {
    let path = base.join(bundle);
    let meta = std::fs::metadata(&path).map_err(|e| format!("bundle {}: {e}", path.display()))?;
    if meta.is_dir() {
        of_directory(&path)
    } else {
        of_archive(&path)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tree(dir: &Path) {
        std::fs::create_dir_all(dir.join("src/__pycache__")).unwrap();
        std::fs::create_dir_all(dir.join(".git")).unwrap();
        std::fs::create_dir_all(dir.join("data/big")).unwrap();
        std::fs::write(dir.join("train.py"), "print('hi')\n").unwrap();
        std::fs::write(dir.join("src/model.py"), "x = 1\n").unwrap();
        std::fs::write(dir.join("src/model.pyc"), "junk").unwrap();
        std::fs::write(dir.join("src/__pycache__/a.pyc"), "junk").unwrap();
        std::fs::write(dir.join(".git/HEAD"), "ref").unwrap();
        std::fs::write(dir.join("data/big/weights.bin"), "w").unwrap();
        std::fs::write(dir.join("notes.tmp"), "t").unwrap();
        std::fs::write(
            dir.join(".tpu-runnerignore"),
            "# comment\n/data/big\n*.tmp\n",
        )
        .unwrap();
        std::os::unix::fs::symlink("/etc/passwd", dir.join("link")).unwrap();
    }

    fn names(bundle: &Bundle) -> Vec<String> {
        let gz = flate2::read::GzDecoder::new(&bundle.data[..]);
        let mut archive = tar::Archive::new(gz);
        archive
            .entries()
            .unwrap()
            .map(|e| e.unwrap().path().unwrap().display().to_string())
            .collect()
    }

    #[test]
    fn a_folder_bundles_its_code_in_order_without_what_is_ignored() {
        let dir = tempfile::tempdir().unwrap();
        tree(dir.path());
        let bundle = of_directory(dir.path()).unwrap();
        assert_eq!(
            names(&bundle),
            [
                ".tpu-runnerignore",
                "data",
                "link",
                "src",
                "src/model.py",
                "train.py"
            ]
        );
    }

    #[test]
    fn the_same_content_gives_the_same_bytes() {
        let a = tempfile::tempdir().unwrap();
        let b = tempfile::tempdir().unwrap();
        tree(a.path());
        tree(b.path());
        // Different times and an ignored file's content do not matter.
        std::fs::write(b.path().join("notes.tmp"), "other").unwrap();
        let one = of_directory(a.path()).unwrap();
        let two = of_directory(b.path()).unwrap();
        assert_eq!(one.sha256, two.sha256);
        std::fs::write(b.path().join("train.py"), "print('changed')\n").unwrap();
        assert_ne!(of_directory(b.path()).unwrap().sha256, one.sha256);
    }

    #[test]
    fn a_bad_ignore_pattern_names_its_line() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join(".tpu-runnerignore"), "ok\n[\n").unwrap();
        let e = of_directory(dir.path()).unwrap_err();
        assert!(e.contains(".tpu-runnerignore:2: `[`"), "{e}");
    }
}
