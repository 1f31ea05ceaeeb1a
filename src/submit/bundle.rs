//! A job's content bundle on the submitting side (§6.1): the files of a directory, walked
//! without following links, minus what is never code (`.git`, virtualenvs, caches, `*.pyc`)
//! and what `.tpu-runnerignore` names, archived as a deterministic `tar.gz` (sorted paths,
//! owner 0, mtime 0, fixed compression): the same content gives the same bytes, so its
//! SHA-256 names it and workers verify it. A tar file is used as it is. The archive is
//! written to a private temporary file (random name, 0600, removed when the bundle is
//! dropped), bounded and hashed while written: never held in memory. Reads only the
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

/// A bundle ready to upload: its archive in a temporary file.
#[derive(Debug)]
pub struct Bundle {
    /// The archive (removed when the bundle is dropped).
    pub file: tempfile::TempPath,
    /// Its size in bytes.
    pub size: u64,
    /// Its SHA-256, hex (the object's name: `bundles/<sha256>.tar.gz`).
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

/// The archive's temporary file as it is written: bounded (it refuses to grow past
/// `limit` bytes, never built whole and measured after) and hashed.
struct Bounded {
    file: std::io::BufWriter<tempfile::NamedTempFile>,
    hash: Sha256,
    written: u64,
    limit: u64,
}

impl Bounded {
    /// A new private temporary file bounded at `limit` bytes.
    fn new(limit: u64) -> std::io::Result<Bounded> {
        Ok(Bounded {
            file: std::io::BufWriter::new(tempfile::NamedTempFile::new()?),
            hash: Sha256::new(),
            written: 0,
            limit,
        })
    }

    /// The bundle it holds, once whole on disk.
    fn finish(self, entries: usize) -> std::io::Result<Bundle> {
        let file = self.file.into_inner().map_err(|e| e.into_error())?;
        file.as_file().sync_all()?;
        Ok(Bundle {
            file: file.into_temp_path(),
            size: self.written,
            sha256: hex::encode(self.hash.finalize()),
            entries,
        })
    }
}

impl std::io::Write for Bounded {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if self.written + buf.len() as u64 > self.limit {
            return Err(std::io::Error::new(
                std::io::ErrorKind::FileTooLarge,
                TOO_BIG,
            ));
        }
        self.file.write_all(buf)?;
        self.hash.update(buf);
        self.written += buf.len() as u64;
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.file.flush()
    }
}

/// The message of a bound reached (told apart from other write errors).
const TOO_BIG: &str = "the bundle's limit";

/// What a failed write of `dir`'s archive says: the bound reached, else the error at `at`.
fn write_error(e: &std::io::Error, dir: &Path, at: &Path) -> String {
    if e.to_string() == TOO_BIG {
        too_big(dir)
    } else {
        format!("{}: {e}", at.display())
    }
}

/// A file's content exactly as long as its header says: a file that grows or shrinks while
/// it is read is an error, never an archive whose header and data disagree.
struct Exact {
    inner: std::io::Take<std::fs::File>,
    want: u64,
    got: u64,
}

impl std::io::Read for Exact {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.got += n as u64;
        if n == 0 && self.got < self.want && !buf.is_empty() {
            return Err(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                "it shrank while it was bundled; bundle again once nothing writes to it",
            ));
        }
        Ok(n)
    }
}

/// Appends the regular file `full` (as `meta` saw it when the folder was walked) under
/// `name`: opened without blocking and checked as opened (a file swapped for a FIFO is
/// refused, not waited on), read for exactly its size, and refused if its size or
/// modification time changed while it was read (the archive is `dir`'s).
fn append_file<W: std::io::Write>(
    tar: &mut tar::Builder<W>,
    header: &mut tar::Header,
    name: &str,
    dir: &Path,
    full: &Path,
    meta: &std::fs::Metadata,
) -> Result<(), String> {
    use std::io::Read as _;
    let (file, opened) =
        crate::files::open_regular(full).map_err(|e| format!("{}: {e}", full.display()))?;
    let stamp = |m: &std::fs::Metadata| (m.len(), m.modified().ok());
    let changed = || {
        format!(
            "{}: it changed while it was bundled; bundle again once nothing writes to it",
            full.display()
        )
    };
    if stamp(&opened) != stamp(meta) {
        return Err(changed());
    }
    let reader = Exact {
        inner: file.take(meta.len()),
        want: meta.len(),
        got: 0,
    };
    tar.append_data(header, name, reader)
        .map_err(|e| write_error(&e, dir, full))?;
    let after = std::fs::symlink_metadata(full).map_err(|e| format!("{}: {e}", full.display()))?;
    if stamp(&after) != stamp(meta) {
        return Err(changed());
    }
    Ok(())
}

/// The bundle of `dir`.
pub fn of_directory(dir: &Path) -> Result<Bundle, String> {
    of_directory_within(dir, LIMIT)
}

/// The bundle of `dir`, refused once its archive would exceed `limit` bytes.
fn of_directory_within(dir: &Path, limit: u64) -> Result<Bundle, String> {
    let ignores = read_ignores(dir)?;
    let paths = walk(dir, &ignores)?;
    let out = Bounded::new(limit).map_err(|e| format!("a temporary file for the bundle: {e}"))?;
    let gz = flate2::GzBuilder::new()
        .mtime(0)
        .write(out, flate2::Compression::new(6));
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
            // The workers' rule for links, on the same tree: where it leads once every link
            // on the way is followed must stay inside.
            if crate::worker::bundle::resolve_beneath(dir, rel).is_none() {
                return Err(format!(
                    "{}: the link → `{}` leads outside the bundle's folder, and the workers refuse such a bundle: ship what it points to, or leave it out with .tpu-runnerignore",
                    full.display(),
                    target.display()
                ));
            }
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
            append_file(&mut tar, &mut header, text, dir, &full, &meta)?;
            continue;
        } else {
            return Err(format!(
                "{}: only files, folders and links can be bundled",
                full.display()
            ));
        };
        added.map_err(|e| write_error(&e, dir, &full))?;
    }
    tar.into_inner()
        .and_then(|gz| gz.finish())
        .and_then(|out| out.finish(paths.len()))
        .map_err(|e| write_error(&e, dir, dir))
}

fn too_big(path: &Path) -> String {
    format!(
        "{}: the bundle would exceed {} GiB; upload large files to a bucket and name a `gs://` bundle",
        path.display(),
        LIMIT >> 30
    )
}

/// What an archive's first bytes say it is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    /// gzip (`1f 8b`) holding a tar archive.
    TarGz,
    /// A plain tar archive (`ustar` at byte 257).
    Tar,
}

fn is_tar(header: &[u8]) -> bool {
    header.get(257..262) == Some(&b"ustar"[..])
}

/// What the archive `file` holds, read from its first bytes (the file is left at its start).
fn kind_of(file: &mut std::fs::File) -> std::io::Result<Option<Kind>> {
    use std::io::{Read, Seek};
    let mut head = Vec::with_capacity(512);
    file.by_ref().take(512).read_to_end(&mut head)?;
    file.rewind()?;
    let kind = if head.starts_with(&[0x1f, 0x8b]) {
        let mut inner = Vec::with_capacity(512);
        let gz = flate2::read::GzDecoder::new(file.by_ref());
        let read = gz.take(512).read_to_end(&mut inner);
        file.rewind()?;
        (read.is_ok() && is_tar(&inner)).then_some(Kind::TarGz)
    } else {
        is_tar(&head).then_some(Kind::Tar)
    };
    Ok(kind)
}

/// The bundle of a tar archive: a `tar.gz` used as it is, a plain tar compressed (the
/// workers unpack `tar.gz`); anything else is refused, whatever its name says. The archive
/// is streamed into the bundle's file and checked there, as shipped, by the workers' own
/// unpacking.
pub fn of_archive(path: &Path) -> Result<Bundle, String> {
    let at = |e: &dyn std::fmt::Display| format!("{}: {e}", path.display());
    let (mut file, meta) = crate::files::open_regular(path).map_err(|e| at(&e))?;
    if meta.len() > LIMIT {
        return Err(too_big(path));
    }
    let kind = kind_of(&mut file).map_err(|e| at(&e))?;
    let out = Bounded::new(LIMIT).map_err(|e| at(&e))?;
    let written = match kind {
        Some(Kind::TarGz) => {
            let mut out = out;
            std::io::copy(&mut file, &mut out).map(|_| out)
        }
        Some(Kind::Tar) => {
            let mut gz = flate2::GzBuilder::new()
                .mtime(0)
                .write(out, flate2::Compression::new(6));
            std::io::copy(&mut file, &mut gz).and_then(|_| gz.finish())
        }
        None => {
            return Err(format!(
                "{} is not a tar or tar.gz archive: a bundle is a folder or an archive of one",
                path.display()
            ));
        }
    };
    let bundle = written
        .and_then(|out| out.finish(0))
        .map_err(|e| write_error(&e, path, path))?;
    // Unpacked as the workers unpack it, by their own function: an entry or a link they
    // would refuse is refused here.
    let shipped = std::fs::File::open(&bundle.file).map_err(|e| at(&e))?;
    let scratch = tempfile::tempdir().map_err(|e| at(&e))?;
    crate::worker::bundle::unpack(
        flate2::read::GzDecoder::new(std::io::BufReader::new(shipped)),
        scratch.path(),
        0,
    )
    .map_err(|e| at(&e))?;
    Ok(bundle)
}

/// The bundle a job names: a folder or a tar archive. A relative name is taken in `base`
/// (the manifest's folder) and must stay there once its links are followed: a manifest
/// cannot ship what lies outside its own folder unless it names it by an absolute path.
pub fn build(bundle: &str, base: &Path) -> Result<Bundle, String> {
    let path = base.join(bundle);
    let resolved = path
        .canonicalize()
        .map_err(|e| format!("bundle {}: {e}", path.display()))?;
    if Path::new(bundle).is_relative() {
        let folder = base
            .canonicalize()
            .map_err(|e| format!("{}: {e}", base.display()))?;
        if !resolved.starts_with(&folder) {
            return Err(format!(
                "bundle `{bundle}` resolves to {}, outside the manifest's folder {}: name it by an absolute path to ship it",
                resolved.display(),
                folder.display()
            ));
        }
    }
    let meta =
        std::fs::metadata(&resolved).map_err(|e| format!("bundle {}: {e}", path.display()))?;
    if meta.is_dir() {
        of_directory(&resolved)
    } else if meta.is_file() {
        of_archive(&resolved)
    } else {
        Err(format!(
            "bundle {}: not a folder or a regular file",
            path.display()
        ))
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
        std::os::unix::fs::symlink("src/model.py", dir.join("link")).unwrap();
    }

    fn bytes(bundle: &Bundle) -> Vec<u8> {
        std::fs::read(&bundle.file).unwrap()
    }

    fn names(bundle: &Bundle) -> Vec<String> {
        let data = bytes(bundle);
        let gz = flate2::read::GzDecoder::new(&data[..]);
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

    /// The archive is a private temporary file, hashed and measured as written, and gone
    /// once the bundle is dropped.
    #[test]
    fn a_bundle_is_a_private_file_named_by_its_digest_and_removed_after() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        tree(dir.path());
        let bundle = of_directory(dir.path()).unwrap();
        let data = bytes(&bundle);
        assert_eq!(data.len() as u64, bundle.size);
        assert_eq!(hex::encode(Sha256::digest(&data)), bundle.sha256);
        assert_eq!(
            crate::worker::bundle::sha256_file(&bundle.file).unwrap(),
            bundle.sha256
        );
        let mode = std::fs::metadata(&bundle.file)
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o077, 0, "readable by others: {mode:o}");
        let path = bundle.file.to_path_buf();
        drop(bundle);
        assert!(!path.exists(), "the bundle's file was left behind");
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

    /// A plain tar is shipped compressed; a file that is no archive (a process's
    /// environment, a text file named `.tar.gz`) is refused; a relative name leading out of
    /// the manifest's folder is refused, an absolute one is taken.
    #[test]
    fn only_archives_are_shipped_and_only_from_the_manifests_folder_unless_named() {
        let dir = tempfile::tempdir().unwrap();
        let base = dir.path().join("project");
        std::fs::create_dir_all(base.join("code")).unwrap();
        std::fs::write(base.join("code/train.py"), "print(1)\n").unwrap();
        let folder = bytes(&of_directory(&base.join("code")).unwrap());
        let gz = flate2::read::GzDecoder::new(&folder[..]);
        let mut plain = Vec::new();
        std::io::Read::read_to_end(&mut { gz }, &mut plain).unwrap();
        std::fs::write(base.join("code.tar"), &plain).unwrap();
        std::fs::write(base.join("code.tar.gz"), &folder).unwrap();
        let from_tar = build("code.tar", &base).unwrap();
        assert_eq!(names(&from_tar), ["train.py"]);
        assert_eq!(bytes(&build("code.tar.gz", &base).unwrap()), folder);
        std::fs::write(base.join("notes.tar.gz"), "not an archive").unwrap();
        let e = build("notes.tar.gz", &base).unwrap_err();
        assert!(e.contains("is not a tar or tar.gz archive"), "{e}");
        let e = build("/proc/self/environ", &base).unwrap_err();
        assert!(e.contains("is not a tar or tar.gz archive"), "{e}");
        std::fs::write(dir.path().join("outside.tar.gz"), &folder).unwrap();
        let e = build("../outside.tar.gz", &base).unwrap_err();
        assert!(e.contains("outside the manifest's folder"), "{e}");
        std::os::unix::fs::symlink(dir.path().join("outside.tar.gz"), base.join("in.tar.gz"))
            .unwrap();
        let e = build("in.tar.gz", &base).unwrap_err();
        assert!(e.contains("outside the manifest's folder"), "{e}");
        let outside = dir.path().join("outside.tar.gz");
        assert!(build(outside.to_str().unwrap(), &base).is_ok());
    }

    /// A link the workers would refuse (absolute, or out through `..`, or out through a
    /// chain of links) is refused when the bundle is built, by the workers' own rule.
    #[test]
    fn links_the_workers_refuse_are_refused_when_building() {
        for (name, target) in [("pw", "/etc/passwd"), ("up", ".."), ("d/c", "../../../..")] {
            let dir = tempfile::tempdir().unwrap();
            std::fs::write(dir.path().join("train.py"), "x\n").unwrap();
            std::fs::create_dir_all(dir.path().join("d")).unwrap();
            std::os::unix::fs::symlink(target, dir.path().join(name)).unwrap();
            let e = of_directory(dir.path()).unwrap_err();
            assert!(
                e.contains("leads outside the bundle's folder"),
                "{name}: {e}"
            );
        }
        // An archive holding such a link is refused as the workers would.
        let dir = tempfile::tempdir().unwrap();
        let mut tar = tar::Builder::new(Vec::new());
        let mut header = tar::Header::new_gnu();
        header.set_entry_type(tar::EntryType::Symlink);
        header.set_size(0);
        tar.append_link(&mut header, "pw", "/etc/passwd").unwrap();
        let plain = tar.into_inner().unwrap();
        std::fs::write(dir.path().join("evil.tar"), plain).unwrap();
        let e = of_archive(&dir.path().join("evil.tar")).unwrap_err();
        assert!(e.contains("points outside the job directory"), "{e}");
    }

    /// The archive is bounded while it is written; a file that changed between the walk
    /// and its read is refused, never shipped with a header that disagrees with its data.
    #[test]
    fn a_bundle_is_bounded_while_written_and_a_changing_file_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        // Incompressible bytes (xorshift), so the archive is about as large as the file.
        let mut x = 0x9E37_79B9_7F4A_7C15u64;
        let noise: Vec<u8> = (0..1 << 20)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect();
        std::fs::write(dir.path().join("big.bin"), &noise).unwrap();
        match of_directory_within(dir.path(), 64 << 10) {
            Err(e) => assert!(e.contains("would exceed"), "{e}"),
            Ok(b) => panic!("a {} byte bundle passed a 64 KiB bound", b.size),
        }
        assert!(of_directory_within(dir.path(), 4 << 20).is_ok());
        // Walked at one size, grown before it is read.
        let path = dir.path().join("log.txt");
        std::fs::write(&path, "one\n").unwrap();
        let seen = std::fs::symlink_metadata(&path).unwrap();
        std::fs::write(&path, "one\ntwo, written while bundling\n").unwrap();
        let mut tar = tar::Builder::new(Vec::new());
        let mut header = tar::Header::new_gnu();
        header.set_size(seen.len());
        let e =
            append_file(&mut tar, &mut header, "log.txt", dir.path(), &path, &seen).unwrap_err();
        assert!(e.contains("changed while it was bundled"), "{e}");
    }

    #[test]
    fn a_bad_ignore_pattern_names_its_line() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join(".tpu-runnerignore"), "ok\n[\n").unwrap();
        let e = of_directory(dir.path()).unwrap_err();
        assert!(e.contains(".tpu-runnerignore:2: `[`"), "{e}");
    }
}
