//! The object-store boundary the workers and the controller share for status objects,
//! heartbeats, logs and bundles (`gs://BUCKET/NAME` addresses): `Gcs` (the Cloud Storage JSON
//! API, an emulator through `STORAGE_EMULATOR_HOST`) and `LocalDir` (a folder per bucket, for
//! the local stack and tests). Writes are whole objects, atomic; a create-only write never
//! replaces one. Knows nothing of jobs.

use std::io::Write;
use std::path::{Path, PathBuf};

use crate::gcp::http::RetryPolicy;
use crate::gcp::storage::{self, Storage};

/// An object in a listing.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Listed {
    /// Name inside the bucket.
    pub name: String,
    /// Changes on every write.
    pub generation: String,
    /// Last write, RFC 3339.
    pub updated: String,
}

/// A failed object-store call.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ObjectError {
    /// What failed.
    pub message: String,
    /// A create-only write found the object there.
    pub exists: bool,
}

impl std::fmt::Display for ObjectError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for ObjectError {}

fn fail(message: String) -> ObjectError {
    ObjectError {
        message,
        exists: false,
    }
}

/// Splits `gs://BUCKET/NAME`.
pub fn split(uri: &str) -> Result<(&str, &str), ObjectError> {
    uri.strip_prefix("gs://")
        .and_then(|rest| rest.split_once('/'))
        .filter(|(bucket, name)| !bucket.is_empty() && !name.is_empty())
        .ok_or_else(|| fail(format!("`{uri}` is not a gs://BUCKET/OBJECT address")))
}

/// Where objects live.
pub trait ObjectStore: Send + Sync {
    /// The object's bytes (`None`: absent); refused above `limit` bytes.
    fn get(&self, uri: &str, limit: u64) -> Result<Option<Vec<u8>>, ObjectError>;
    /// The object's bytes from `offset` on, at most `limit` of them (`None`: absent; empty:
    /// nothing past `offset`): a ranged read, so following a growing log costs what it grew.
    fn get_from(&self, uri: &str, offset: u64, limit: u64) -> Result<Option<Vec<u8>>, ObjectError>;
    /// Copies the object to `path` (at most `limit` bytes); false when absent.
    fn download(&self, uri: &str, path: &Path, limit: u64) -> Result<bool, ObjectError>;
    /// Writes the object; `create_only`: fails with `exists` if it is there.
    fn put(&self, uri: &str, data: &[u8], create_only: bool) -> Result<(), ObjectError>;
    /// Writes the object from the file at `path`, streamed (never held in memory whole);
    /// `create_only` as for `put`.
    fn upload(&self, uri: &str, path: &Path, create_only: bool) -> Result<(), ObjectError>;
    /// Objects whose address starts with `prefix` (`gs://BUCKET/PREFIX`), in name order.
    fn list(&self, prefix: &str) -> Result<Vec<Listed>, ObjectError>;
    /// Copies the object `from` to `to` (replacing it), inside the store.
    fn copy(&self, from: &str, to: &str) -> Result<(), ObjectError>;
    /// Deletes the object; absent is success.
    fn delete(&self, uri: &str) -> Result<(), ObjectError>;
    /// Where bucket `gs://B` lives, lower case as GCP names regions (`us-east1`; `us` or
    /// `nam4` for a multi- or dual-region); an error names a missing bucket.
    fn location(&self, bucket: &str) -> Result<String, ObjectError>;
}

/// The bucket name of `gs://B` (or `B`).
fn bucket_name(bucket: &str) -> &str {
    let b = bucket.strip_prefix("gs://").unwrap_or(bucket);
    b.trim_end_matches('/')
}

/// The object store the environment names: `TPU_RUNNER_OBJECTS=DIR` (a local folder per
/// bucket) or Cloud Storage (`STORAGE_EMULATOR_HOST` for an emulator).
pub fn from_env() -> Result<Box<dyn ObjectStore>, ObjectError> {
    match std::env::var("TPU_RUNNER_OBJECTS") {
        Ok(dir) if !dir.trim().is_empty() => Ok(Box::new(LocalDir::new(dir.trim()))),
        _ => Ok(Box::new(Gcs::new(storage::endpoint_from_env())?)),
    }
}

/// Cloud Storage.
#[derive(Debug)]
pub struct Gcs(Storage);

impl Gcs {
    /// The store at `endpoint`.
    pub fn new(endpoint: crate::gcp::http::Endpoint) -> Result<Gcs, ObjectError> {
        Storage::new(endpoint, RetryPolicy::default())
            .map(Gcs)
            .map_err(|e| fail(format!("Cloud Storage: {e}")))
    }

    /// The client.
    pub fn client(&self) -> &Storage {
        &self.0
    }
}

impl ObjectStore for Gcs {
    fn get(&self, uri: &str, limit: u64) -> Result<Option<Vec<u8>>, ObjectError> {
        let (bucket, name) = split(uri)?;
        self.0
            .get(bucket, name, limit)
            .map_err(|e| fail(format!("reading {uri}: {e}")))
    }

    fn get_from(&self, uri: &str, offset: u64, limit: u64) -> Result<Option<Vec<u8>>, ObjectError> {
        let (bucket, name) = split(uri)?;
        self.0
            .get_from(bucket, name, offset, limit)
            .map_err(|e| fail(format!("reading {uri}: {e}")))
    }

    fn download(&self, uri: &str, path: &Path, limit: u64) -> Result<bool, ObjectError> {
        let (bucket, name) = split(uri)?;
        self.0
            .download(bucket, name, path, limit)
            .map_err(|e| fail(format!("downloading {uri}: {e}")))
    }

    fn put(&self, uri: &str, data: &[u8], create_only: bool) -> Result<(), ObjectError> {
        let (bucket, name) = split(uri)?;
        let kind = if name.ends_with(".json") {
            "application/json"
        } else {
            "application/octet-stream"
        };
        self.0
            .put(bucket, name, data, kind, create_only)
            .map(|_| ())
            .map_err(|e| ObjectError {
                exists: e.code == 412,
                message: format!("writing {uri}: {e}"),
            })
    }

    fn upload(&self, uri: &str, path: &Path, create_only: bool) -> Result<(), ObjectError> {
        let (bucket, name) = split(uri)?;
        self.0
            .upload(bucket, name, path, create_only)
            .map(|_| ())
            .map_err(|e| ObjectError {
                exists: e.code == 412,
                message: format!("writing {uri}: {e}"),
            })
    }

    fn list(&self, prefix: &str) -> Result<Vec<Listed>, ObjectError> {
        let (bucket, name) = prefix
            .strip_prefix("gs://")
            .and_then(|rest| rest.split_once('/'))
            .ok_or_else(|| fail(format!("`{prefix}` is not a gs://BUCKET/PREFIX address")))?;
        let listed = self
            .0
            .list(bucket, name)
            .map_err(|e| fail(format!("listing {prefix}: {e}")))?;
        Ok(listed
            .into_iter()
            .map(|o| Listed {
                name: o.name,
                generation: o.generation,
                updated: o.updated,
            })
            .collect())
    }

    fn copy(&self, from: &str, to: &str) -> Result<(), ObjectError> {
        let (from_bucket, from_name) = split(from)?;
        let (to_bucket, to_name) = split(to)?;
        self.0
            .rewrite(from_bucket, from_name, to_bucket, to_name)
            .map_err(|e| fail(format!("copying {from} to {to}: {e}")))
    }

    fn delete(&self, uri: &str) -> Result<(), ObjectError> {
        let (bucket, name) = split(uri)?;
        self.0
            .delete(bucket, name)
            .map_err(|e| fail(format!("deleting {uri}: {e}")))
    }

    fn location(&self, bucket: &str) -> Result<String, ObjectError> {
        let name = bucket_name(bucket);
        match self.0.bucket_location(name) {
            Ok(Some(location)) => Ok(location.to_ascii_lowercase()),
            Ok(None) => Err(fail(format!("the bucket gs://{name} does not exist"))),
            Err(e) => Err(fail(format!("gs://{name}: {e}"))),
        }
    }
}

/// A folder per bucket under a root: `gs://B/N` is `ROOT/B/N`.
#[derive(Clone, Debug)]
pub struct LocalDir {
    root: PathBuf,
}

impl LocalDir {
    /// The store under `root`.
    pub fn new(root: impl Into<PathBuf>) -> LocalDir {
        LocalDir { root: root.into() }
    }

    /// Creates bucket `gs://B` in `location` (its folder, and `B.location` beside it); one
    /// that exists keeps its location.
    pub fn create_bucket(&self, bucket: &str, location: &str) -> Result<(), ObjectError> {
        let name = bucket_name(bucket);
        if name.is_empty() || name.contains(['/', '\\']) || name.starts_with('.') {
            return Err(fail(format!("`{bucket}` is not a bucket name")));
        }
        std::fs::create_dir_all(self.root.join(name)).map_err(|e| io(bucket, e))?;
        let path = self.root.join(format!("{name}.location"));
        if !path.exists() {
            std::fs::write(&path, format!("{location}\n")).map_err(|e| io(bucket, e))?;
        }
        Ok(())
    }

    /// Writes object `uri` whole or not at all: `write` fills a temporary file beside it,
    /// which then takes its name (`create_only`: only if there is none).
    fn write_with(
        &self,
        uri: &str,
        create_only: bool,
        write: impl FnOnce(&mut tempfile::NamedTempFile) -> std::io::Result<()>,
    ) -> Result<(), ObjectError> {
        let path = self.path(uri)?;
        let dir = path.parent().expect("an object has a folder");
        std::fs::create_dir_all(dir).map_err(|e| io(uri, e))?;
        let mut temp = tempfile::NamedTempFile::new_in(dir).map_err(|e| io(uri, e))?;
        write(&mut temp).map_err(|e| io(uri, e))?;
        temp.as_file().sync_all().map_err(|e| io(uri, e))?;
        if create_only {
            temp.persist_noclobber(&path).map_err(|e| ObjectError {
                exists: e.error.kind() == std::io::ErrorKind::AlreadyExists,
                message: format!("{uri}: {}", e.error),
            })?;
        } else {
            temp.persist(&path).map_err(|e| io(uri, e.error))?;
        }
        Ok(())
    }

    fn path(&self, uri: &str) -> Result<PathBuf, ObjectError> {
        let (bucket, name) = split(uri)?;
        if name
            .split('/')
            .any(|part| part.is_empty() || part == "." || part == "..")
            || bucket.contains(['/', '\\'])
            || bucket == ".."
        {
            return Err(fail(format!("`{uri}` does not name an object")));
        }
        Ok(self.root.join(bucket).join(name))
    }
}

fn io(uri: &str, e: std::io::Error) -> ObjectError {
    fail(format!("{uri}: {e}"))
}

impl ObjectStore for LocalDir {
    fn get(&self, uri: &str, limit: u64) -> Result<Option<Vec<u8>>, ObjectError> {
        let path = self.path(uri)?;
        match crate::files::read_bytes(&path, limit) {
            Ok(data) => Ok(Some(data)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(fail(format!("{uri}: {e}"))),
        }
    }

    fn get_from(&self, uri: &str, offset: u64, limit: u64) -> Result<Option<Vec<u8>>, ObjectError> {
        use std::io::{Read, Seek};
        let path = self.path(uri)?;
        let (mut file, meta) = match crate::files::open_regular(&path) {
            Ok(opened) => opened,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(fail(format!("{uri}: {e}"))),
        };
        if offset >= meta.len() {
            return Ok(Some(Vec::new()));
        }
        file.seek(std::io::SeekFrom::Start(offset))
            .map_err(|e| io(uri, e))?;
        let mut data = Vec::new();
        file.take(limit)
            .read_to_end(&mut data)
            .map_err(|e| io(uri, e))?;
        Ok(Some(data))
    }

    fn download(&self, uri: &str, path: &Path, limit: u64) -> Result<bool, ObjectError> {
        let source = self.path(uri)?;
        let mut file = match std::fs::File::open(&source) {
            Ok(file) => file,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(false),
            Err(e) => return Err(io(uri, e)),
        };
        let size = file.metadata().map_err(|e| io(uri, e))?.len();
        if size > limit {
            return Err(fail(format!(
                "{uri} is {size} bytes, more than the {limit} allowed"
            )));
        }
        // Copied, never read whole into memory.
        let mut out = std::fs::File::create(path).map_err(|e| io(uri, e))?;
        std::io::copy(&mut std::io::Read::take(&mut file, limit), &mut out)
            .map_err(|e| io(uri, e))?;
        Ok(true)
    }

    fn put(&self, uri: &str, data: &[u8], create_only: bool) -> Result<(), ObjectError> {
        self.write_with(uri, create_only, |temp| temp.write_all(data))
    }

    fn upload(&self, uri: &str, path: &Path, create_only: bool) -> Result<(), ObjectError> {
        self.write_with(uri, create_only, |temp| {
            std::io::copy(&mut std::fs::File::open(path)?, temp).map(|_| ())
        })
    }

    fn list(&self, prefix: &str) -> Result<Vec<Listed>, ObjectError> {
        let (bucket, name_prefix) = prefix
            .strip_prefix("gs://")
            .and_then(|rest| rest.split_once('/'))
            .ok_or_else(|| fail(format!("`{prefix}` is not a gs://BUCKET/PREFIX address")))?;
        let base = self.root.join(bucket);
        // Walk only the folder the prefix is in.
        let folder = match name_prefix.rfind('/') {
            Some(i) => base.join(&name_prefix[..i]),
            None => base.clone(),
        };
        let mut out = Vec::new();
        let mut stack = vec![folder];
        while let Some(dir) = stack.pop() {
            let entries = match std::fs::read_dir(&dir) {
                Ok(entries) => entries,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                Err(e) => return Err(io(prefix, e)),
            };
            for entry in entries {
                let entry = entry.map_err(|e| io(prefix, e))?;
                // A writer's temporary file can be renamed away between the folder read and
                // this look: it was never an object.
                let meta = match entry.metadata() {
                    Ok(meta) => meta,
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                    Err(e) => return Err(io(prefix, e)),
                };
                let path = entry.path();
                if meta.is_dir() {
                    stack.push(path);
                    continue;
                }
                let Ok(rel) = path.strip_prefix(&base) else {
                    continue;
                };
                let name = rel.to_string_lossy().replace('\\', "/");
                if !name.starts_with(name_prefix) || name.contains(".tmp") {
                    continue;
                }
                let modified = meta
                    .modified()
                    .ok()
                    .and_then(|t| jiff::Timestamp::try_from(t).ok())
                    .unwrap_or(jiff::Timestamp::UNIX_EPOCH);
                out.push(Listed {
                    name,
                    generation: modified.as_nanosecond().to_string(),
                    updated: modified.to_string(),
                });
            }
        }
        out.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(out)
    }

    fn copy(&self, from: &str, to: &str) -> Result<(), ObjectError> {
        let source = self.path(from)?;
        let target = self.path(to)?;
        let dir = target.parent().expect("an object has a folder");
        std::fs::create_dir_all(dir).map_err(|e| io(to, e))?;
        // Through a temporary file beside it, so a reader never sees half an object.
        let temp = tempfile::Builder::new()
            .prefix(".copy")
            .suffix(".tmp")
            .tempfile_in(dir)
            .map_err(|e| io(to, e))?;
        let (mut input, _) =
            crate::files::open_regular(&source).map_err(|e| fail(format!("{from}: {e}")))?;
        std::io::copy(&mut input, &mut temp.as_file()).map_err(|e| io(from, e))?;
        temp.persist(&target).map_err(|e| io(to, e.error))?;
        Ok(())
    }

    fn delete(&self, uri: &str) -> Result<(), ObjectError> {
        match std::fs::remove_file(self.path(uri)?) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(io(uri, e)),
            _ => Ok(()),
        }
    }

    fn location(&self, bucket: &str) -> Result<String, ObjectError> {
        let name = bucket_name(bucket);
        let path = self.root.join(format!("{name}.location"));
        match crate::files::read_text(&path, 256) {
            Ok(text) => Ok(text.trim().to_ascii_lowercase()),
            Err(_) => Err(fail(format!(
                "the bucket gs://{name} does not exist in the local object store {} (create it with its region: `tpu-runner local up` makes one per region of the fleet)",
                self.root.display()
            ))),
        }
    }
}
