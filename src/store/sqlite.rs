//! The embedded store: one SQLite file (WAL, `synchronous=FULL`), a versioned schema with
//! migrations, safe for a controller and any number of commands on one machine. Every write
//! is one `BEGIN IMMEDIATE` transaction (SQLite serialises writers; readers keep their
//! snapshot); a load is one read transaction. Applies the engine's rules; decides nothing.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use rusqlite::{
    Connection, ErrorCode, OptionalExtension, Transaction, TransactionBehavior, params,
};

use super::changes::{ChangeSet, Written, is_closed};
use super::records::{attempt_doc, is_active, job_doc};
use super::{
    Base, CommitOutcome, ControllerDocs, CreateResult, Delta, Fence, InterruptResult, Io, Loaded,
    StateStore, StoreError, Version, Versions,
};
use crate::engine::commands::{self, CancelResult, ReprioritizeResult};
use crate::engine::lease::{self, Lease, Refusal};
use crate::engine::state::{Attempt, InterruptionRequest, Job, Resource, SCHEMA_VERSION};
use crate::engine::{Event, State, Timestamp};
use crate::spec::{Name, Priority};

/// `PRAGMA application_id` of a tpu-runner store ("TPUR").
const APPLICATION_ID: i32 = 0x5450_5552;

/// The schema, one migration per version: `MIGRATIONS[k]` takes version k to k + 1.
const MIGRATIONS: &[&str] = &[
    // Version 1.
    "CREATE TABLE jobs (
         id TEXT PRIMARY KEY,
         status TEXT NOT NULL,
         active INTEGER NOT NULL,
         submitted_at INTEGER NOT NULL,
         ended_at INTEGER,
         version INTEGER NOT NULL,
         doc TEXT NOT NULL
     ) WITHOUT ROWID;
     CREATE INDEX jobs_active ON jobs (id) WHERE active = 1;
     CREATE INDEX jobs_ended ON jobs (ended_at) WHERE active = 0;
     CREATE TABLE attempts (
         id TEXT PRIMARY KEY,
         job_id TEXT NOT NULL,
         seq INTEGER NOT NULL,
         doc TEXT NOT NULL
     ) WITHOUT ROWID;
     CREATE INDEX attempts_job ON attempts (job_id, seq);
     CREATE TABLE resources (
         id TEXT PRIMARY KEY,
         owner_job TEXT,
         owner_attempt TEXT,
         version INTEGER NOT NULL,
         doc TEXT NOT NULL
     ) WITHOUT ROWID;
     CREATE INDEX resources_owner_job ON resources (owner_job) WHERE owner_job IS NOT NULL;
     CREATE INDEX resources_owner_attempt ON resources (owner_attempt)
         WHERE owner_attempt IS NOT NULL;
     CREATE TABLE interruption_requests (
         id TEXT PRIMARY KEY,
         active INTEGER NOT NULL,
         version INTEGER NOT NULL,
         doc TEXT NOT NULL
     ) WITHOUT ROWID;
     CREATE TABLE controller (key TEXT PRIMARY KEY, doc TEXT NOT NULL) WITHOUT ROWID;
     CREATE TABLE locks (key TEXT PRIMARY KEY, doc TEXT NOT NULL) WITHOUT ROWID;
     CREATE TABLE events (
         seq INTEGER PRIMARY KEY AUTOINCREMENT,
         at INTEGER NOT NULL,
         kind TEXT NOT NULL,
         job_id TEXT,
         doc TEXT NOT NULL
     );
     CREATE INDEX events_job ON events (job_id, seq) WHERE job_id IS NOT NULL;",
    // Version 2: a job's runs by name (`watch NAME` follows the latest).
    "CREATE INDEX jobs_name ON jobs (json_extract(doc, '$.spec.name'), submitted_at)
         WHERE json_extract(doc, '$.spec.name') IS NOT NULL;",
    // Version 3: the change sequence. Every record write takes the next number and stamps
    // the record with it, so a controller reads only what was written after its cursor.
    "ALTER TABLE jobs ADD COLUMN changed INTEGER NOT NULL DEFAULT 0;
     ALTER TABLE resources ADD COLUMN changed INTEGER NOT NULL DEFAULT 0;
     ALTER TABLE interruption_requests ADD COLUMN changed INTEGER NOT NULL DEFAULT 0;
     CREATE INDEX jobs_changed ON jobs (changed);
     CREATE INDEX resources_changed ON resources (changed);
     CREATE INDEX interruption_requests_changed ON interruption_requests (changed);
     CREATE TABLE changes (id INTEGER PRIMARY KEY CHECK (id = 0), seq INTEGER NOT NULL);
     INSERT INTO changes (id, seq) VALUES (0, 0);",
];

/// The schema version this build writes.
pub const LATEST_SCHEMA: i64 = MIGRATIONS.len() as i64;

/// A store in one SQLite file.
pub struct SqliteStore {
    conn: Connection,
    path: PathBuf,
    /// Documents read and written since `take_io`.
    io: Io,
}

impl std::fmt::Debug for SqliteStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "SqliteStore({})", self.path.display())
    }
}

/// A failure inside a transaction: the store's, or a record that cannot be read.
type Res<T> = Result<T, StoreError>;

impl SqliteStore {
    /// Opens (or creates) the store at `path`, creating its folder, and brings the schema
    /// up to date. Refuses a file that is not a tpu-runner store or whose schema is newer.
    pub fn open(path: &Path) -> Res<SqliteStore> {
        let describe = format!("sqlite:{}", path.display());
        let fail = |message: String| StoreError {
            store: describe.clone(),
            message,
        };
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty())
            && !dir.exists()
        {
            std::fs::create_dir_all(dir)
                .map_err(|e| fail(format!("cannot create the folder `{}`: {e}", dir.display())))?;
        }
        if path.exists() && !path.is_file() {
            return Err(fail("is not a regular file: pass a file path".into()));
        }
        // SQLite would take an empty file for a new database: a store truncated to nothing
        // would look brand new, its jobs silently gone.
        if std::fs::metadata(path).is_ok_and(|m| m.len() == 0) {
            return Err(fail(
                "is an empty file, not a store (truncated?): nothing was read or written; restore it from a backup, or remove it to start a new store".into(),
            ));
        }
        let conn = match read_only_uri(path) {
            Some(uri) => Connection::open_with_flags(
                uri,
                rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY | rusqlite::OpenFlags::SQLITE_OPEN_URI,
            ),
            None => Connection::open(path),
        }
        .map_err(|e| fail(open_error(&e)))?;
        let mut store = SqliteStore {
            conn,
            path: path.to_owned(),
            io: Io::default(),
        };
        store.prepare()?;
        Ok(store)
    }

    fn prepare(&mut self) -> Res<()> {
        let path = self.path.clone();
        let e = |err| store_err(&path, err);
        self.conn.busy_timeout(Duration::from_secs(30)).map_err(e)?;
        let app: i32 = self
            .conn
            .query_row("PRAGMA application_id", [], |r| r.get(0))
            .map_err(e)?;
        let version: i64 = self
            .conn
            .query_row("PRAGMA user_version", [], |r| r.get(0))
            .map_err(e)?;
        let tables: i64 = self
            .conn
            .query_row(
                "SELECT count(*) FROM sqlite_schema WHERE type = 'table'",
                [],
                |r| r.get(0),
            )
            .map_err(e)?;
        if app != APPLICATION_ID && (tables > 0 || app != 0) {
            return Err(self.fail(
                "is an SQLite database of another program (not a tpu-runner store): nothing was written; pass another path with --store sqlite:PATH".into(),
            ));
        }
        if version > LATEST_SCHEMA {
            return Err(self.fail(format!(
                "has schema version {version}, newer than this tpu-runner understands ({LATEST_SCHEMA}): nothing was written; upgrade tpu-runner"
            )));
        }
        // A file this user may only read (SQLite then opens it read-only): reads work, and
        // a write says the file is read-only. Its schema must be current (a migration writes).
        let read_only = self.conn.is_readonly(rusqlite::MAIN_DB).map_err(e)?;
        if read_only {
            if version < LATEST_SCHEMA {
                return Err(self.fail(format!(
                    "is read-only for this user and has schema version {version}, older than this tpu-runner's ({LATEST_SCHEMA}): open it once with write access to bring it up to date"
                )));
            }
            return Ok(());
        }
        self.conn
            .pragma_update(None, "journal_mode", "WAL")
            .map_err(e)?;
        self.conn
            .pragma_update(None, "synchronous", "FULL")
            .map_err(e)?;
        if version < LATEST_SCHEMA {
            let tx = self
                .conn
                .transaction_with_behavior(TransactionBehavior::Exclusive)
                .map_err(e)?;
            // Another process may have migrated meanwhile: read the version again inside.
            let current: i64 = tx
                .query_row("PRAGMA user_version", [], |r| r.get(0))
                .map_err(e)?;
            for (k, sql) in MIGRATIONS.iter().enumerate().skip(current as usize) {
                tx.execute_batch(sql).map_err(e)?;
                tx.pragma_update(None, "user_version", (k + 1) as i64)
                    .map_err(e)?;
            }
            tx.pragma_update(None, "application_id", APPLICATION_ID)
                .map_err(e)?;
            tx.commit().map_err(e)?;
        }
        Ok(())
    }

    /// Finished jobs ended at or after `since` in `order` (an ORDER BY of `ended_at, id`).
    fn finished_in_order(&mut self, since: Timestamp, limit: usize, order: &str) -> Res<Vec<Job>> {
        self.read(|tx, path| {
            let ids: Vec<String> = {
                let mut stmt = tx
                    .prepare(&format!(
                        "SELECT id FROM jobs WHERE active = 0 AND ended_at >= ?1
                         ORDER BY {order} LIMIT ?2"
                    ))
                    .map_err(|e| store_err(path, e))?;
                stmt.query_map(params![since.0, limit as i64], |r| r.get(0))
                    .and_then(|rows| rows.collect())
                    .map_err(|e| store_err(path, e))?
            };
            let mut jobs = Vec::with_capacity(ids.len());
            for id in ids {
                jobs.extend(read_job(tx, path, &id)?.map(|(j, _)| j));
            }
            Ok(jobs)
        })
    }

    /// Events (of job `job`, if given) with sequence numbers above `after`, oldest first,
    /// at most `limit`.
    fn events_where(
        &mut self,
        job: Option<&str>,
        after: u64,
        limit: usize,
    ) -> Res<Vec<(u64, Event)>> {
        self.read(|tx, path| {
            let mut stmt = tx
                .prepare_cached(match job {
                    Some(_) => {
                        "SELECT seq, doc FROM events WHERE job_id = ?3 AND seq > ?1
                         ORDER BY seq LIMIT ?2"
                    }
                    None => "SELECT seq, doc FROM events WHERE seq > ?1 ORDER BY seq LIMIT ?2",
                })
                .map_err(|e| store_err(path, e))?;
            let params = (after as i64, limit as i64);
            let map = |r: &rusqlite::Row<'_>| Ok((r.get::<_, i64>(0)?, r.get::<_, String>(1)?));
            let rows: Vec<(i64, String)> = match job {
                Some(job) => stmt.query_map(params![params.0, params.1, job], map),
                None => stmt.query_map(params![params.0, params.1], map),
            }
            .and_then(|rows| rows.collect())
            .map_err(|e| store_err(path, e))?;
            let mut out = Vec::new();
            for (seq, doc) in rows {
                out.push((seq as u64, parse(path, "events", &seq.to_string(), &doc)?));
            }
            Ok(out)
        })
    }

    fn fail(&self, message: String) -> StoreError {
        StoreError {
            store: self.describe(),
            message,
        }
    }

    /// Runs `f` in one `BEGIN IMMEDIATE` transaction; commits when it returns `Ok((_, true))`,
    /// rolls back otherwise.
    fn write<T>(&mut self, f: impl FnOnce(&Transaction<'_>, &Path) -> Res<(T, bool)>) -> Res<T> {
        let path = self.path.clone();
        let tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(|e| store_err(&path, e))?;
        let (value, commit) = f(&tx, &path)?;
        if commit {
            tx.commit().map_err(|e| store_err(&path, e))?;
        }
        Ok(value)
    }

    /// Runs `f` in one read transaction (a consistent snapshot).
    fn read<T>(&mut self, f: impl FnOnce(&Transaction<'_>, &Path) -> Res<T>) -> Res<T> {
        let path = self.path.clone();
        let tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Deferred)
            .map_err(|e| store_err(&path, e))?;
        f(&tx, &path)
    }
}

/// For a store file this user may only read: the URI that opens it read-only. Where the
/// WAL index (`-shm`) and log (`-wal`) are missing and cannot be made (a folder this user
/// cannot write), the file is read as immutable, as it is when opened: no writer runs (one
/// would have made the index).
fn read_only_uri(path: &Path) -> Option<String> {
    use nix::unistd::{AccessFlags, access};
    if !path.exists() || access(path, AccessFlags::W_OK).is_ok() {
        return None;
    }
    let full = path.canonicalize().ok()?;
    let dir = full.parent()?;
    let beside = |suffix: &str| {
        let mut name = full.clone().into_os_string();
        name.push(suffix);
        Path::new(&name).exists()
    };
    // No index, no log (a leftover log would be ignored), and no way to make them: nobody
    // writes it now. It is read as it is when opened.
    let immutable = !beside("-shm") && !beside("-wal") && access(dir, AccessFlags::W_OK).is_err();
    // The URI's path: `%`, `?` and `#` escaped.
    let escaped = full
        .to_str()?
        .replace('%', "%25")
        .replace('?', "%3f")
        .replace('#', "%23");
    Some(format!(
        "file:{escaped}?mode=ro{}",
        if immutable { "&immutable=1" } else { "" }
    ))
}

/// A readable sentence for an SQLite failure, with what to do.
fn open_error(e: &rusqlite::Error) -> String {
    match e.sqlite_error_code() {
        Some(ErrorCode::NotADatabase) => {
            "is not an SQLite database (or is damaged): nothing was written; move it away or pass another path with --store sqlite:PATH".into()
        }
        Some(ErrorCode::DatabaseCorrupt) => {
            "is damaged (SQLite reports corruption): nothing was written; restore it from a `tpu-runner state export` or move it away".into()
        }
        Some(ErrorCode::ReadOnly | ErrorCode::PermissionDenied | ErrorCode::CannotOpen) => {
            format!("cannot be opened for writing ({e}): check the file's and its folder's permissions")
        }
        Some(ErrorCode::DatabaseBusy | ErrorCode::DatabaseLocked) => {
            format!("stayed locked by another process for 30 s ({e}); try again")
        }
        Some(ErrorCode::DiskFull) => format!("the disk is full ({e})"),
        _ => e.to_string(),
    }
}

fn store_err(path: &Path, e: rusqlite::Error) -> StoreError {
    StoreError {
        store: format!("sqlite:{}", path.display()),
        message: open_error(&e),
    }
}

fn bad_record(path: &Path, what: &str, id: &str, e: impl std::fmt::Display) -> StoreError {
    StoreError {
        store: format!("sqlite:{}", path.display()),
        message: format!(
            "record {what}/{id} cannot be read ({e}): the store is damaged; restore it from a `tpu-runner state export`"
        ),
    }
}

fn json<T: serde::Serialize>(value: &T) -> String {
    serde_json::to_string(value).expect("state records serialise")
}

fn parse<T: serde::de::DeserializeOwned>(path: &Path, what: &str, id: &str, doc: &str) -> Res<T> {
    serde_json::from_str(doc).map_err(|e| bad_record(path, what, id, e))
}

/// Reads one job with its attempts.
fn read_job(tx: &Transaction<'_>, path: &Path, id: &str) -> Res<Option<(Job, i64)>> {
    let row: Option<(i64, String)> = tx
        .query_row("SELECT version, doc FROM jobs WHERE id = ?1", [id], |r| {
            Ok((r.get(0)?, r.get(1)?))
        })
        .optional()
        .map_err(|e| store_err(path, e))?;
    let Some((version, doc)) = row else {
        return Ok(None);
    };
    let mut job: Job = parse(path, "jobs", id, &doc)?;
    let mut stmt = tx
        .prepare_cached("SELECT id, doc FROM attempts WHERE job_id = ?1 ORDER BY seq")
        .map_err(|e| store_err(path, e))?;
    let rows = stmt
        .query_map([id], |r| {
            Ok((r.get::<_, String>(0)?, r.get::<_, String>(1)?))
        })
        .map_err(|e| store_err(path, e))?;
    for row in rows {
        let (aid, doc) = row.map_err(|e| store_err(path, e))?;
        job.attempts
            .push(parse::<Attempt>(path, "attempts", &aid, &doc)?);
    }
    Ok(Some((job, version)))
}

/// Takes the next number of the change sequence (for one record write).
fn next_change(tx: &Transaction<'_>) -> rusqlite::Result<i64> {
    tx.prepare_cached("UPDATE changes SET seq = seq + 1 WHERE id = 0 RETURNING seq")?
        .query_row([], |r| r.get(0))
}

/// The change sequence as it stands in `tx`.
fn change_seq(tx: &Transaction<'_>, path: &Path) -> Res<u64> {
    tx.prepare_cached("SELECT seq FROM changes WHERE id = 0")
        .and_then(|mut s| s.query_row([], |r| r.get::<_, i64>(0)))
        .map(|seq| seq as u64)
        .map_err(|e| store_err(path, e))
}

/// Writes one job and all its attempts at `version`.
fn write_job(tx: &Transaction<'_>, path: &Path, job: &Job, version: i64) -> Res<()> {
    let doc = job_doc(job).map_err(|e| bad_record(path, "jobs", &job.id, e))?;
    tx.prepare_cached(
        "INSERT INTO jobs (id, status, active, submitted_at, ended_at, version, doc, changed)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)
         ON CONFLICT (id) DO UPDATE SET status = excluded.status, active = excluded.active,
             ended_at = excluded.ended_at, version = excluded.version, doc = excluded.doc,
             changed = excluded.changed",
    )
    .and_then(|mut s| {
        s.execute(params![
            job.id.as_str(),
            job.status.as_str(),
            is_active(job),
            job.submitted_at.0,
            job.ended_at.map(|t| t.0),
            version,
            json(&doc),
            next_change(tx)?
        ])
    })
    .map_err(|e| store_err(path, e))?;
    for (seq, attempt) in job.attempts.iter().enumerate() {
        let doc = attempt_doc(job, seq, attempt)
            .map_err(|e| bad_record(path, "attempts", &attempt.id, e))?;
        tx.prepare_cached(
            "INSERT INTO attempts (id, job_id, seq, doc) VALUES (?1, ?2, ?3, ?4)
             ON CONFLICT (id) DO UPDATE SET job_id = excluded.job_id, seq = excluded.seq,
                 doc = excluded.doc",
        )
        .and_then(|mut s| {
            s.execute(params![
                attempt.id.as_str(),
                job.id.as_str(),
                seq as i64,
                json(&doc)
            ])
        })
        .map_err(|e| store_err(path, e))?;
    }
    Ok(())
}

fn write_resource(tx: &Transaction<'_>, path: &Path, r: &Resource, version: i64) -> Res<()> {
    tx.prepare_cached(
        "INSERT INTO resources (id, owner_job, owner_attempt, version, doc, changed)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6)
         ON CONFLICT (id) DO UPDATE SET owner_job = excluded.owner_job,
             owner_attempt = excluded.owner_attempt, version = excluded.version,
             doc = excluded.doc, changed = excluded.changed",
    )
    .and_then(|mut s| {
        s.execute(params![
            r.id.as_str(),
            r.owner.as_ref().map(|o| o.job_id.as_str()),
            r.owner.as_ref().map(|o| o.attempt_id.as_str()),
            version,
            json(r),
            next_change(tx)?
        ])
    })
    .map(|_| ())
    .map_err(|e| store_err(path, e))
}

fn write_request(
    tx: &Transaction<'_>,
    path: &Path,
    r: &InterruptionRequest,
    version: i64,
) -> Res<()> {
    tx.prepare_cached(
        "INSERT INTO interruption_requests (id, active, version, doc, changed)
         VALUES (?1, ?2, ?3, ?4, ?5)
         ON CONFLICT (id) DO UPDATE SET active = excluded.active, version = excluded.version,
             doc = excluded.doc, changed = excluded.changed",
    )
    .and_then(|mut s| {
        s.execute(params![
            r.id.as_str(),
            !is_closed(r),
            version,
            json(r),
            next_change(tx)?
        ])
    })
    .map(|_| ())
    .map_err(|e| store_err(path, e))
}

fn write_controller(tx: &Transaction<'_>, path: &Path, docs: &ControllerDocs) -> Res<()> {
    for (key, doc) in [
        ("backoff", json(&docs.backoff)),
        ("notices", json(&docs.notices)),
        ("pools", json(&docs.pools)),
        ("others", json(&docs.others)),
    ] {
        tx.execute(
            "INSERT INTO controller (key, doc) VALUES (?1, ?2)
             ON CONFLICT (key) DO UPDATE SET doc = excluded.doc",
            params![key, doc],
        )
        .map_err(|e| store_err(path, e))?;
    }
    Ok(())
}

fn append_events(tx: &Transaction<'_>, path: &Path, events: &[Event]) -> Res<()> {
    let mut stmt = tx
        .prepare_cached("INSERT INTO events (at, kind, job_id, doc) VALUES (?1, ?2, ?3, ?4)")
        .map_err(|e| store_err(path, e))?;
    for e in events {
        stmt.execute(params![
            e.at.0,
            e.kind,
            e.job_id.map(|j| j.as_str()),
            json(e)
        ])
        .map_err(|err| store_err(path, err))?;
    }
    Ok(())
}

fn version_of(tx: &Transaction<'_>, path: &Path, table: &str, id: &str) -> Res<Option<i64>> {
    tx.prepare_cached(&format!("SELECT version FROM {table} WHERE id = ?1"))
        .and_then(|mut s| s.query_row([id], |r| r.get(0)).optional())
        .map_err(|e| store_err(path, e))
}

fn read_locks(tx: &Transaction<'_>, path: &Path) -> Res<(Option<Lease>, Option<String>)> {
    let get = |key: &str| -> Res<Option<String>> {
        tx.query_row("SELECT doc FROM locks WHERE key = ?1", [key], |r| r.get(0))
            .optional()
            .map_err(|e| store_err(path, e))
    };
    // A lease that cannot be read is acquirable (§2.1), never a dead controller.
    let lease = get("controller")?.and_then(|doc| serde_json::from_str::<Lease>(&doc).ok());
    let epoch = match get("epoch")? {
        Some(doc) => parse::<EpochDoc>(path, "locks", "epoch", &doc)?
            .epoch
            .into(),
        None => None,
    };
    Ok((lease, epoch))
}

/// The stored epoch (`lease_epochs/controller` in the original).
#[derive(serde::Serialize, serde::Deserialize)]
struct EpochDoc {
    epoch: String,
    updated_at: Timestamp,
}

/// The TPU records `sql` selects (`id, doc` rows) with `args`.
fn resources_where(
    tx: &Transaction<'_>,
    path: &Path,
    sql: &str,
    args: &[&str],
) -> Res<Vec<Resource>> {
    let mut stmt = tx.prepare_cached(sql).map_err(|e| store_err(path, e))?;
    let rows: Vec<(String, String)> = stmt
        .query_map(rusqlite::params_from_iter(args.iter()), |r| {
            Ok((r.get(0)?, r.get(1)?))
        })
        .and_then(|rows| rows.collect())
        .map_err(|e| store_err(path, e))?;
    rows.iter()
        .map(|(id, doc)| parse(path, "resources", id, doc))
        .collect()
}

fn read_resource(tx: &Transaction<'_>, path: &Path, id: &Name) -> Res<Option<Resource>> {
    let found = resources_where(
        tx,
        path,
        "SELECT id, doc FROM resources WHERE id = ?1",
        &[id.as_str()],
    )?;
    Ok(found.into_iter().next())
}

/// What a `--if-pending` cancel of `job` judges (nothing is read for a plain cancel).
fn previous_tpus(
    tx: &Transaction<'_>,
    path: &Path,
    job: Option<&Job>,
    if_pending: bool,
) -> Res<commands::PreviousTpus> {
    let Some((resource, attempt)) = job
        .filter(|_| if_pending)
        .and_then(commands::previous_attempt)
    else {
        return Ok(Default::default());
    };
    Ok(commands::PreviousTpus {
        of_attempt: read_resource(tx, path, &resource)?,
        pointing: resources_where(
            tx,
            path,
            "SELECT id, doc FROM resources WHERE owner_job = ?1 OR owner_attempt = ?2 ORDER BY id",
            &[job.map_or("", |j| j.id.as_str()), attempt.as_str()],
        )?,
    })
}

impl StateStore for SqliteStore {
    fn describe(&self) -> String {
        format!("sqlite:{}", self.path.display())
    }

    fn create_jobs(&mut self, jobs: &[Job], now: Timestamp) -> Res<CreateResult> {
        self.write(|tx, path| {
            let mut exist = Vec::new();
            let mut seen = crate::spec::NameSet::default();
            for job in jobs {
                if !seen.insert(job.id) || version_of(tx, path, "jobs", &job.id)?.is_some() {
                    exist.push(job.id);
                }
            }
            if !exist.is_empty() {
                exist.sort();
                exist.dedup();
                return Ok((CreateResult::Exist(exist), false));
            }
            for job in jobs {
                write_job(tx, path, job, 1)?;
            }
            append_events(tx, path, &commands::created(jobs, now))?;
            Ok((CreateResult::Created, true))
        })
    }

    fn cancel_job(&mut self, id: &Name, if_pending: bool, now: Timestamp) -> Res<CancelResult> {
        self.write(|tx, path| {
            let mut read = read_job(tx, path, id)?;
            let tpus = previous_tpus(tx, path, read.as_ref().map(|(j, _)| j), if_pending)?;
            let result = commands::cancel(read.as_mut().map(|(j, _)| j), if_pending, &tpus, now);
            let changed = matches!(result, CancelResult::Status { changed: true, .. });
            if changed && let Some((job, version)) = &read {
                write_job(tx, path, job, version + 1)?;
                append_events(tx, path, &[commands::cancel_event(job, now)])?;
            }
            Ok((result, changed))
        })
    }

    fn reprioritize(
        &mut self,
        id: &Name,
        priority: Priority,
        now: Timestamp,
    ) -> Res<ReprioritizeResult> {
        self.write(|tx, path| {
            let mut read = read_job(tx, path, id)?;
            let (result, event) =
                commands::reprioritize(read.as_mut().map(|(j, _)| j), priority, now);
            let Some(event) = event else {
                return Ok((result, false));
            };
            let (job, version) = read.as_ref().expect("an event comes with a job");
            write_job(tx, path, job, version + 1)?;
            append_events(tx, path, &[event])?;
            Ok((result, true))
        })
    }

    fn create_interruption_request(
        &mut self,
        resource_id: &Name,
        job_id: &Name,
        attempt_id: &Name,
        eligible: &dyn Fn(&Name) -> bool,
        now: Timestamp,
    ) -> Res<InterruptResult> {
        self.write(|tx, path| {
            let resource = read_resource(tx, path, resource_id)?;
            let job = read_job(tx, path, job_id)?.map(|(j, _)| j);
            if let Some(reason) = commands::unknown_target(
                resource.as_ref(),
                job.as_ref(),
                resource_id,
                job_id,
                attempt_id,
            ) {
                return Ok((InterruptResult::UnknownTarget(reason), false));
            }
            let (Some(resource), Some(job)) = (resource, job) else {
                unreachable!("unknown_target checked both")
            };
            let id = commands::interruption_id(resource_id, job_id, attempt_id);
            if version_of(tx, path, "interruption_requests", &id)?.is_some() {
                return Ok((InterruptResult::Exists(id), false));
            }
            match commands::interruption_request(
                &resource,
                &job,
                attempt_id,
                eligible(&resource.entry_id),
                now,
            ) {
                Ok(request) => {
                    write_request(tx, path, &request, 1)?;
                    Ok((InterruptResult::Requested(request), true))
                }
                Err(reason) => Ok((InterruptResult::Rejected(reason), false)),
            }
        })
    }

    fn acquire_lease(
        &mut self,
        owner: &str,
        epoch: &str,
        ttl_secs: i64,
        now: Timestamp,
    ) -> Res<Result<Lease, Refusal>> {
        // The lease and the epoch read, the lease written.
        self.io.add(2, 1);
        self.write(|tx, path| {
            let (held, current) = read_locks(tx, path)?;
            match lease::acquire(
                held.as_ref(),
                current.as_deref(),
                owner,
                epoch,
                ttl_secs,
                now,
            ) {
                Ok(new) => {
                    tx.execute(
                        "INSERT INTO locks (key, doc) VALUES ('controller', ?1)
                         ON CONFLICT (key) DO UPDATE SET doc = excluded.doc",
                        [json(&new)],
                    )
                    .map_err(|e| store_err(path, e))?;
                    Ok((Ok(new), true))
                }
                Err(refusal) => Ok((Err(refusal), false)),
            }
        })
    }

    fn release_lease(&mut self, owner: &str) -> Res<()> {
        self.write(|tx, path| {
            let (held, _) = read_locks(tx, path)?;
            let release = held.is_some() && lease::release(held, owner).is_none();
            if release {
                tx.execute("DELETE FROM locks WHERE key = 'controller'", [])
                    .map_err(|e| store_err(path, e))?;
            }
            Ok(((), release))
        })
    }

    fn set_epoch(&mut self, epoch: &str, now: Timestamp) -> Res<()> {
        if epoch.is_empty() {
            return Err(self.fail("refused an empty epoch".into()));
        }
        self.write(|tx, path| {
            let doc = json(&EpochDoc {
                epoch: epoch.to_owned(),
                updated_at: now,
            });
            tx.execute(
                "INSERT INTO locks (key, doc) VALUES ('epoch', ?1)
                 ON CONFLICT (key) DO UPDATE SET doc = excluded.doc",
                [doc],
            )
            .map_err(|e| store_err(path, e))?;
            Ok(((), true))
        })
    }

    fn lease(&mut self) -> Res<(Option<Lease>, Option<String>)> {
        self.read(read_locks)
    }

    fn load_active(&mut self) -> Res<Loaded> {
        let loaded = self.read(load_in)?;
        let state = &loaded.state;
        let attempts: usize = state.jobs.values().map(|j| j.attempts.len()).sum();
        self.io.add(
            state.jobs.len()
                + attempts
                + state.resources.len()
                + state.interruption_requests.len()
                + CONTROL_READS,
            0,
        );
        Ok(loaded)
    }

    fn load_changes(&mut self, cursor: u64) -> Res<Option<Delta>> {
        let delta = self.read(|tx, path| load_changes_in(tx, path, cursor))?;
        if let Some(d) = &delta {
            let attempts: usize = d.jobs.iter().map(|(j, _)| j.attempts.len()).sum();
            self.io.add(
                d.jobs.len() + attempts + d.resources.len() + d.requests.len() + CONTROL_READS,
                0,
            );
        }
        Ok(delta)
    }

    fn take_io(&mut self) -> Io {
        std::mem::take(&mut self.io)
    }

    fn commit_pass(
        &mut self,
        base: &mut Base,
        state: &State,
        events: &[Event],
        fence: &Fence,
        now: Timestamp,
    ) -> Res<CommitOutcome> {
        let changes = ChangeSet::between(base, state);
        let (outcome, written) = self.write(|tx, path| {
            let (lease, epoch) = read_locks(tx, path)?;
            if let Some(reason) = commands::fence_refusal(
                lease.as_ref(),
                epoch.as_deref(),
                &fence.owner,
                &fence.epoch,
                now,
            ) {
                return Ok(((CommitOutcome::Fenced { reason }, None), false));
            }
            let mut conflicts = Vec::new();
            let mut check = |table: &str, id: &Name, expected: &Option<Version>| -> Res<i64> {
                let found = version_of(tx, path, table, id)?;
                let same = match (found, expected) {
                    (None, None) => true,
                    (Some(v), Some(e)) => v.to_string() == e.0,
                    _ => false,
                };
                if !same {
                    conflicts.push(format!("{table}/{id}"));
                }
                Ok(found.unwrap_or(0) + 1)
            };
            let mut next = Vec::with_capacity(changes.len());
            for (job, expected) in &changes.jobs {
                next.push(check("jobs", &job.id, expected)?);
            }
            for (r, expected) in &changes.resources {
                next.push(check("resources", &r.id, expected)?);
            }
            for (r, expected) in &changes.requests {
                next.push(check("interruption_requests", &r.id, expected)?);
            }
            if !conflicts.is_empty() {
                return Ok((
                    (CommitOutcome::Conflict { records: conflicts }, None),
                    false,
                ));
            }
            let mut next = next.into_iter();
            let before = change_seq(tx, path)?;
            let mut written = Written::default();
            for (job, _) in &changes.jobs {
                let v = next.next().expect("one version per record");
                write_job(tx, path, job, v)?;
                written.jobs.push((job.id, Version(v.to_string())));
            }
            for (r, _) in &changes.resources {
                let v = next.next().expect("one version per record");
                write_resource(tx, path, r, v)?;
                written.resources.push((r.id, Version(v.to_string())));
            }
            for (r, _) in &changes.requests {
                let v = next.next().expect("one version per record");
                write_request(tx, path, r, v)?;
                written.requests.push((r.id, Version(v.to_string())));
            }
            if let Some(docs) = &changes.controller {
                write_controller(tx, path, docs)?;
            }
            append_events(tx, path, events)?;
            // No one wrote since the base's cursor: the next delta starts after this commit.
            written.cursor = (before == base.cursor)
                .then(|| change_seq(tx, path))
                .transpose()?;
            Ok(((CommitOutcome::Committed, Some(written)), true))
        })?;
        // The lease and epoch, and each record checked; each record, attempt, event and
        // control document written.
        let attempts: usize = changes.jobs.iter().map(|(j, _)| j.attempts.len()).sum();
        self.io.add(2 + changes.len(), 0);
        if let Some(written) = written {
            self.io.add(
                0,
                // `changes.len()` counts the three control documents as one.
                changes.len()
                    + attempts
                    + events.len()
                    + changes.controller.as_ref().map_or(0, |_| 2),
            );
            base.advance(state, &changes, written);
        }
        Ok(outcome)
    }

    fn job(&mut self, id: &Name) -> Res<Option<Job>> {
        self.read(|tx, path| Ok(read_job(tx, path, id)?.map(|(j, _)| j)))
    }

    fn existing_jobs(&mut self, ids: &[Name]) -> Res<Vec<Name>> {
        self.read(|tx, path| {
            let mut stmt = tx
                .prepare_cached("SELECT 1 FROM jobs WHERE id = ?1")
                .map_err(|e| store_err(path, e))?;
            let mut found = Vec::new();
            for id in ids {
                if stmt
                    .exists(params![id.as_str()])
                    .map_err(|e| store_err(path, e))?
                {
                    found.push(*id);
                }
            }
            found.sort();
            found.dedup();
            Ok(found)
        })
    }

    fn runs_named(&mut self, name: &str, limit: usize) -> Res<Vec<Name>> {
        self.read(|tx, path| {
            let mut stmt = tx
                .prepare_cached(
                    "SELECT id FROM jobs WHERE json_extract(doc, '$.spec.name') = ?1
                     ORDER BY submitted_at DESC, id DESC LIMIT ?2",
                )
                .map_err(|e| store_err(path, e))?;
            let ids = stmt
                .query_map(params![name, limit as i64], |row| row.get::<_, String>(0))
                .and_then(|rows| rows.collect::<Result<Vec<_>, _>>())
                .map_err(|e| store_err(path, e))?;
            Ok(ids.iter().map(|id| Name::new(id)).collect())
        })
    }

    fn finished_jobs(&mut self, since: Timestamp, limit: usize) -> Res<Vec<Job>> {
        self.finished_in_order(since, limit, "ended_at, id")
    }

    fn latest_finished(&mut self, since: Timestamp, limit: usize) -> Res<Vec<Job>> {
        self.finished_in_order(since, limit, "ended_at DESC, id DESC")
    }

    fn job_events(&mut self, job: &Name, after: u64, limit: usize) -> Res<Vec<(u64, Event)>> {
        self.events_where(Some(job.as_str()), after, limit)
    }

    fn events_after(&mut self, after: u64, limit: usize) -> Res<Vec<(u64, Event)>> {
        self.events_where(None, after, limit)
    }

    fn compact_events(&mut self, before: Timestamp, limit: usize) -> Res<usize> {
        self.write(|tx, path| {
            let gone = tx
                .prepare_cached(
                    "DELETE FROM events WHERE seq IN \
                     (SELECT seq FROM events ORDER BY seq LIMIT ?2) AND at < ?1",
                )
                .and_then(|mut s| s.execute(params![before.0, limit as i64]))
                .map_err(|e| store_err(path, e))?;
            Ok((gone, gone > 0))
        })
    }

    fn export(&mut self) -> Res<State> {
        // One read transaction: a job finishing meanwhile is in `jobs` or in `finished`,
        // never in both.
        let mut state = self.read(|tx, path| {
            let Loaded { mut state, .. } = load_in(tx, path)?;
            let ids: Vec<String> = tx
                .prepare("SELECT id FROM jobs WHERE active = 0 ORDER BY id")
                .and_then(|mut s| s.query_map([], |r| r.get(0))?.collect())
                .map_err(|e| store_err(path, e))?;
            for id in ids {
                if let Some((job, _)) = read_job(tx, path, &id)? {
                    state.finished.insert(job.id, Box::new(job));
                }
            }
            let docs: Vec<(String, String)> = tx
                .prepare("SELECT id, doc FROM interruption_requests WHERE active = 0 ORDER BY id")
                .and_then(|mut s| s.query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?.collect())
                .map_err(|e| store_err(path, e))?;
            for (id, doc) in docs {
                let r: InterruptionRequest = parse(path, "interruption_requests", &id, &doc)?;
                state.interruption_requests.insert(r.id, r);
            }
            Ok(state)
        })?;
        state.schema_version = SCHEMA_VERSION;
        Ok(state)
    }

    fn import(&mut self, state: &State) -> Res<()> {
        let store = self.describe();
        self.write(|tx, path| {
            let count: i64 = tx
                .query_row(
                    "SELECT (SELECT count(*) FROM jobs) + (SELECT count(*) FROM resources)
                          + (SELECT count(*) FROM interruption_requests)",
                    [],
                    |r| r.get(0),
                )
                .map_err(|e| store_err(path, e))?;
            if count > 0 {
                return Err(StoreError {
                    store: store.clone(),
                    message: format!("holds {count} records already: import only into an empty store (nothing was written)"),
                });
            }
            for job in state.all_jobs() {
                write_job(tx, path, job, 1)?;
            }
            for r in state.resources.values() {
                write_resource(tx, path, r, 1)?;
            }
            for r in state.interruption_requests.values() {
                write_request(tx, path, r, 1)?;
            }
            write_controller(
                tx,
                path,
                &ControllerDocs::of(state),
            )?;
            Ok(((), true))
        })
    }
}

/// The active state and its base, read in `tx` (one snapshot).
fn load_in(tx: &Transaction<'_>, path: &Path) -> Res<Loaded> {
    let mut state = State::new();
    let mut job_versions = Versions::default();
    {
        let mut stmt = tx
            .prepare("SELECT id, version, doc FROM jobs WHERE active = 1 ORDER BY id")
            .map_err(|e| store_err(path, e))?;
        let mut rows = stmt.query([]).map_err(|e| store_err(path, e))?;
        let mut jobs = Vec::new();
        while let Some(row) = rows.next().map_err(|e| store_err(path, e))? {
            let id: String = row.get(0).map_err(|e| store_err(path, e))?;
            let version: i64 = row.get(1).map_err(|e| store_err(path, e))?;
            let doc: rusqlite::types::ValueRef<'_> =
                row.get_ref(2).map_err(|e| store_err(path, e))?;
            let text = doc.as_str().map_err(|e| bad_record(path, "jobs", &id, e))?;
            let job: Job = parse(path, "jobs", &id, text)?;
            job_versions.insert(job.id, Version(version.to_string()));
            jobs.push(job);
        }
        let mut stmt = tx
            .prepare(
                "SELECT a.job_id, a.id, a.doc FROM attempts a JOIN jobs j ON j.id = a.job_id
                 WHERE j.active = 1 ORDER BY a.job_id, a.seq",
            )
            .map_err(|e| store_err(path, e))?;
        let mut rows = stmt.query([]).map_err(|e| store_err(path, e))?;
        let mut at = 0;
        while let Some(row) = rows.next().map_err(|e| store_err(path, e))? {
            let job_id: String = row.get(0).map_err(|e| store_err(path, e))?;
            let id: String = row.get(1).map_err(|e| store_err(path, e))?;
            let doc = row.get_ref(2).map_err(|e| store_err(path, e))?;
            let text = doc
                .as_str()
                .map_err(|e| bad_record(path, "attempts", &id, e))?;
            let attempt: Attempt = parse(path, "attempts", &id, text)?;
            // Both lists are in job id order: walk them together.
            while at < jobs.len() && jobs[at].id.as_str() < job_id.as_str() {
                at += 1;
            }
            if let Some(job) = jobs.get_mut(at).filter(|j| j.id.as_str() == job_id) {
                job.attempts.push(attempt);
            }
        }
        for mut job in jobs {
            // Filled before the base is taken: the first pass need not touch it.
            job.ensure_print();
            state.jobs.insert(job.id, job);
        }
    }
    let mut resource_versions = Versions::default();
    for (id, version, doc) in versioned_rows(
        tx,
        path,
        "SELECT id, version, doc FROM resources ORDER BY id",
    )? {
        let r: Resource = parse(path, "resources", &id, &doc)?;
        resource_versions.insert(r.id, Version(version.to_string()));
        state.resources.insert(r.id, r);
    }
    let mut request_versions = BTreeMap::new();
    let open = "SELECT id, version, doc FROM interruption_requests WHERE active = 1 ORDER BY id";
    for (id, version, doc) in versioned_rows(tx, path, open)? {
        let r: InterruptionRequest = parse(path, "interruption_requests", &id, &doc)?;
        request_versions.insert(r.id, Version(version.to_string()));
        state.interruption_requests.insert(r.id, r);
    }
    read_controller(tx, path)?.apply_to(&mut state);
    let cursor = change_seq(tx, path)?;
    let base = Base::new(
        &state,
        job_versions,
        resource_versions,
        request_versions,
        cursor,
    );
    Ok(Loaded { state, base })
}

/// Documents a load reads besides the records: backoffs, notices, pools, others' TPUs and
/// the sequence.
const CONTROL_READS: usize = 5;

/// What was written after `cursor`, read in `tx` (one snapshot): the records stamped with a
/// later change number (an index on each table's stamp), each job with its attempts.
fn load_changes_in(tx: &Transaction<'_>, path: &Path, cursor: u64) -> Res<Option<Delta>> {
    let now = change_seq(tx, path)?;
    if now < cursor {
        return Ok(None);
    }
    let since = cursor as i64;
    let mut delta = Delta {
        cursor: now,
        controller: read_controller(tx, path)?,
        ..Delta::default()
    };
    if now == cursor {
        return Ok(Some(delta));
    }
    let ids: Vec<String> = tx
        .prepare_cached("SELECT id FROM jobs WHERE changed > ?1 ORDER BY id")
        .and_then(|mut s| s.query_map([since], |r| r.get(0))?.collect())
        .map_err(|e| store_err(path, e))?;
    for id in ids {
        if let Some((mut job, version)) = read_job(tx, path, &id)? {
            job.ensure_print();
            delta.jobs.push((job, Version(version.to_string())));
        }
    }
    let changed = |table: &str| {
        format!("SELECT id, version, doc FROM {table} WHERE changed > ?1 ORDER BY id")
    };
    for (id, version, doc) in versioned_rows_after(tx, path, &changed("resources"), since)? {
        let r: Resource = parse(path, "resources", &id, &doc)?;
        delta.resources.push((r, Version(version.to_string())));
    }
    for (id, version, doc) in
        versioned_rows_after(tx, path, &changed("interruption_requests"), since)?
    {
        let r: InterruptionRequest = parse(path, "interruption_requests", &id, &doc)?;
        delta.requests.push((r, Version(version.to_string())));
    }
    Ok(Some(delta))
}

/// The `(id, version, doc)` rows `sql` selects with `?1` = `after`.
fn versioned_rows_after(
    tx: &Transaction<'_>,
    path: &Path,
    sql: &str,
    after: i64,
) -> Res<Vec<(String, i64, String)>> {
    let mut stmt = tx.prepare_cached(sql).map_err(|e| store_err(path, e))?;
    stmt.query_map([after], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
        .and_then(|rows| rows.collect())
        .map_err(|e| store_err(path, e))
}

/// The `(id, version, doc)` rows `sql` selects.
fn versioned_rows(tx: &Transaction<'_>, path: &Path, sql: &str) -> Res<Vec<(String, i64, String)>> {
    let mut stmt = tx.prepare(sql).map_err(|e| store_err(path, e))?;
    stmt.query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
        .and_then(|rows| rows.collect())
        .map_err(|e| store_err(path, e))
}

fn read_controller(tx: &Transaction<'_>, path: &Path) -> Res<ControllerDocs> {
    let get = |key: &str| -> Res<Option<String>> {
        tx.query_row("SELECT doc FROM controller WHERE key = ?1", [key], |r| {
            r.get(0)
        })
        .optional()
        .map_err(|e| store_err(path, e))
    };
    Ok(ControllerDocs {
        backoff: match get("backoff")? {
            Some(doc) => parse(path, "controller", "backoff", &doc)?,
            None => BTreeMap::new(),
        },
        notices: match get("notices")? {
            Some(doc) => parse(path, "controller", "notices", &doc)?,
            None => BTreeMap::new(),
        },
        pools: match get("pools")? {
            Some(doc) => parse(path, "controller", "pools", &doc)?,
            None => BTreeMap::new(),
        },
        others: match get("others")? {
            Some(doc) => parse(path, "controller", "others", &doc)?,
            None => Vec::new(),
        },
    })
}
