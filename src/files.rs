//! Bounded reads of the files users hand in (fleets, job manifests, scenarios, traces, state
//! snapshots, bundle files): only regular files, opened without blocking and checked as
//! opened, at most a stated size, so `/dev/zero`, a FIFO or a runaway file is a clear error
//! instead of an exhausted memory or a hang. No parsing here.

use std::io::Read;
use std::path::Path;

/// The most a YAML specification (fleet, jobs, scenario) may hold.
pub const SPEC_LIMIT: u64 = 16 << 20;

/// The most a data file (trace, CSV, observation) may hold.
pub const DATA_LIMIT: u64 = 1 << 30;

/// The most a state snapshot may hold. Its records are built whole in memory, at about
/// three times the text's size besides the text itself: 512 MiB keeps that near 2 GiB (a
/// 1 GiB document took 4.2 GiB), and holds about 500,000 pending jobs (1 KB each as `state
/// export` writes them; `engine::state_file`'s test measures it).
pub const STATE_LIMIT: u64 = 512 << 20;

/// Why a file could not be read.
#[derive(Debug)]
pub enum ReadError {
    /// The OS refused (missing, permissions …).
    Io(std::io::Error),
    /// Not a regular file (a folder, a device, a FIFO).
    NotAFile,
    /// Larger than the limit.
    TooLarge(u64),
    /// Not UTF-8: the offset of the first bad byte.
    NotUtf8(usize),
}

impl ReadError {
    /// The I/O error kind (`Other` for refusals of this module).
    pub fn kind(&self) -> std::io::ErrorKind {
        match self {
            ReadError::Io(e) => e.kind(),
            _ => std::io::ErrorKind::Other,
        }
    }
}

impl std::fmt::Display for ReadError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ReadError::Io(e) => write!(f, "{e}"),
            ReadError::NotAFile => f.write_str("not a regular file (a folder, device or pipe)"),
            ReadError::TooLarge(limit) => write!(
                f,
                "larger than {} MiB, the most this input may be",
                limit >> 20
            ),
            ReadError::NotUtf8(at) => write!(f, "not UTF-8 text (invalid byte at offset {at})"),
        }
    }
}

/// Reads `path` as UTF-8 text if it is a regular file of at most `limit` bytes.
pub fn read_text(path: &Path, limit: u64) -> Result<String, ReadError> {
    let bytes = read_bytes(path, limit)?;
    String::from_utf8(bytes).map_err(|e| ReadError::NotUtf8(e.utf8_error().valid_up_to()))
}

/// Opens `path` for reading if it is a regular file, and its metadata as opened. The open
/// never blocks (`O_NONBLOCK`: a FIFO with no writer would hold a plain open forever), and
/// the check is of the file opened, not of the name (`fstat`), so nothing swapped in
/// between is read.
pub fn open_regular(path: &Path) -> Result<(std::fs::File, std::fs::Metadata), ReadError> {
    use std::os::unix::fs::OpenOptionsExt;
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(nix::fcntl::OFlag::O_NONBLOCK.bits())
        .open(path)
        .map_err(ReadError::Io)?;
    let meta = file.metadata().map_err(ReadError::Io)?;
    if !meta.is_file() {
        return Err(ReadError::NotAFile);
    }
    Ok((file, meta))
}

/// Reads `path` if it is a regular file of at most `limit` bytes.
pub fn read_bytes(path: &Path, limit: u64) -> Result<Vec<u8>, ReadError> {
    let (file, meta) = open_regular(path)?;
    if meta.len() > limit {
        return Err(ReadError::TooLarge(limit));
    }
    let mut bytes = Vec::with_capacity(meta.len() as usize);
    // The file may grow while it is read: never past the limit.
    file.take(limit + 1)
        .read_to_end(&mut bytes)
        .map_err(ReadError::Io)?;
    if bytes.len() as u64 > limit {
        return Err(ReadError::TooLarge(limit));
    }
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn devices_folders_and_big_files_are_refused() {
        assert!(matches!(
            read_text(Path::new("/dev/zero"), SPEC_LIMIT),
            Err(ReadError::NotAFile)
        ));
        assert!(matches!(
            read_text(Path::new("/"), SPEC_LIMIT),
            Err(ReadError::NotAFile)
        ));
        let dir = tempfile::tempdir().unwrap();
        let big = dir.path().join("big.yaml");
        std::fs::write(&big, vec![b'a'; 2048]).unwrap();
        assert!(matches!(
            read_text(&big, 1024),
            Err(ReadError::TooLarge(1024))
        ));
        assert_eq!(read_text(&big, 4096).unwrap().len(), 2048);
        std::fs::write(&big, [0xff, 0xfe]).unwrap();
        assert!(matches!(read_text(&big, 4096), Err(ReadError::NotUtf8(0))));
    }

    /// A FIFO with no writer: a plain open waits for one forever; this one is refused at
    /// once (the read runs in a thread so that a hang fails the test instead of holding it).
    #[test]
    fn a_fifo_is_refused_without_waiting() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("deployment.yaml");
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::S_IRWXU).unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        let path = fifo.clone();
        std::thread::spawn(move || {
            let _ = tx.send(matches!(
                read_text(&path, SPEC_LIMIT),
                Err(ReadError::NotAFile)
            ));
        });
        let refused = rx
            .recv_timeout(std::time::Duration::from_secs(10))
            .expect("reading a FIFO hung");
        assert!(refused);
    }
}
