//! Bounded reads of the files users hand in (fleets, job manifests, scenarios, traces, state
//! snapshots): only regular files, at most a stated size, so `/dev/zero`, a FIFO or a
//! runaway file is a clear error instead of an exhausted memory or a hang. No parsing here.

use std::io::Read;
use std::path::Path;

/// The most a YAML specification (fleet, jobs, scenario) may hold.
pub const SPEC_LIMIT: u64 = 16 << 20;

/// The most a data file (trace, CSV, state snapshot, observation) may hold.
pub const DATA_LIMIT: u64 = 1 << 30;

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

/// Reads `path` if it is a regular file of at most `limit` bytes.
pub fn read_bytes(path: &Path, limit: u64) -> Result<Vec<u8>, ReadError> {
    let file = std::fs::File::open(path).map_err(ReadError::Io)?;
    let meta = file.metadata().map_err(ReadError::Io)?;
    if !meta.is_file() {
        return Err(ReadError::NotAFile);
    }
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
        let dir = std::env::temp_dir().join(format!("tpu-runner-files-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let big = dir.join("big.yaml");
        std::fs::write(&big, vec![b'a'; 2048]).unwrap();
        assert!(matches!(
            read_text(&big, 1024),
            Err(ReadError::TooLarge(1024))
        ));
        assert_eq!(read_text(&big, 4096).unwrap().len(), 2048);
        std::fs::write(&big, [0xff, 0xfe]).unwrap();
        assert!(matches!(read_text(&big, 4096), Err(ReadError::NotUtf8(0))));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
