//! The worker agent's duties on one worker (`original-behaviour.md` §5.3–5.6, with its
//! faults fixed): launch an attempt idempotently (already running and already complete are
//! answers), in a wiped workspace, with the bundle's checksum verified and the declared
//! caches kept only when ready, under a free-disk floor; supervise it (a heartbeat object
//! while it runs, the command in its own process group with exactly the job's environment,
//! its output shipped, a status object with an explicit infrastructure-failure field); and
//! stop it on cancel (TERM the group, KILL after the grace). Everything an attempt leaves is
//! under the worker's root. It decides nothing about jobs.

use std::io::{Read, Write};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use serde::{Deserialize, Serialize};

use super::{CancelAck, LaunchAck, LaunchSpec, StatusObject, attempt_prefix, bundle, command_env};
use crate::objects::ObjectStore;

/// The folders of one attempt on a worker.
#[derive(Clone, Debug)]
pub struct Dirs {
    /// `JOB_DIR`: the job's workspace (the bundle, the command's working directory).
    pub job: PathBuf,
    /// `JOB_SHM_DIR`.
    pub shm: PathBuf,
    /// `CACHE_ROOT`.
    pub cache_root: PathBuf,
    /// `ATTEMPT_DIR`: the agent's own files of this attempt (spec, logs, status), outside
    /// the workspace so the command cannot clobber them by accident.
    pub attempt: PathBuf,
}

/// A worker's root: everything the agent keeps is below it.
#[derive(Clone, Debug)]
pub struct Root {
    /// The root folder.
    pub dir: PathBuf,
    /// Shared memory folder (production: `/dev/shm/tpu-runner`).
    pub shm: PathBuf,
}

impl Root {
    /// The root `dir`, its shared memory in `dir/shm`.
    pub fn new(dir: impl Into<PathBuf>) -> Root {
        let dir = dir.into();
        Root {
            shm: dir.join("shm"),
            dir,
        }
    }

    pub(crate) fn work(&self) -> PathBuf {
        self.dir.join("work")
    }

    pub(crate) fn cache(&self) -> PathBuf {
        self.dir.join("cache")
    }

    pub(crate) fn process(&self) -> PathBuf {
        self.dir.join("process")
    }

    /// The folders of `attempt` of `job`.
    pub fn dirs(&self, job: &str, attempt: &str) -> Dirs {
        Dirs {
            job: self.work().join(job),
            shm: self.shm.join(job),
            cache_root: self.cache(),
            attempt: self.dir.join("attempts").join(attempt),
        }
    }

    pub(crate) fn current(&self) -> PathBuf {
        self.process().join("current.json")
    }
}

/// What runs on this worker now (`process/current.json`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Current {
    /// The attempt.
    pub attempt_id: String,
    /// Its job.
    pub job_id: String,
    /// The supervisor's process id (its own process group).
    pub supervisor: i32,
    /// The command's process group, once it started.
    pub command_group: Option<i32>,
    /// The random token this agent put in the environment of the supervisor (and through it
    /// of the command): only a group holding a process that carries it, or a child of one,
    /// is ever signalled (a pid in a file may name anyone's process, or one reused since).
    /// Empty in a record of an agent from before tokens: its supervisor is then known by
    /// its command line.
    #[serde(default)]
    pub token: String,
}

/// The variable holding `Current::token` in the processes the agent starts.
const TOKEN_VAR: &str = "TPU_RUNNER_AGENT_TOKEN";

/// Whether process `pid` carries `token` in its environment (its own, readable only by its
/// user or root).
fn carries_token(pid: i32, token: &str) -> bool {
    if token.is_empty() || pid <= 0 {
        return false;
    }
    let Ok(file) = std::fs::File::open(format!("/proc/{pid}/environ")) else {
        return false;
    };
    let mut environ = Vec::new();
    if file.take(4 << 20).read_to_end(&mut environ).is_err() {
        return false;
    }
    let want = format!("{TOKEN_VAR}={token}");
    environ.split(|b| *b == 0).any(|e| e == want.as_bytes())
}

/// What proves that a process was started for the attempt `current` records: the token in
/// its environment; for a record an agent from before tokens wrote (no token), its
/// supervisor, proven by its owner and command line (`worker supervise … --attempt A`).
struct Proof<'a> {
    token: &'a str,
    supervisor: i32,
    attempt: &'a str,
}

impl Proof<'_> {
    fn of(current: &Current) -> Proof<'_> {
        Proof {
            token: &current.token,
            supervisor: current.supervisor,
            attempt: &current.attempt_id,
        }
    }

    /// Whether process `pid` was started for the attempt.
    fn holds(&self, pid: i32) -> bool {
        if self.token.is_empty() {
            pid == self.supervisor && supervises(pid, self.attempt)
        } else {
            carries_token(pid, self.token)
        }
    }
}

/// Whether process `pid` is this user's `tpu-runner worker supervise … --attempt ATTEMPT`.
fn supervises(pid: i32, attempt: &str) -> bool {
    use std::os::unix::fs::MetadataExt;
    let mine = std::fs::metadata(format!("/proc/{pid}"))
        .is_ok_and(|m| m.uid() == nix::unistd::geteuid().as_raw());
    let Ok(file) = std::fs::File::open(format!("/proc/{pid}/cmdline")) else {
        return false;
    };
    let mut cmdline = Vec::new();
    if file.take(1 << 16).read_to_end(&mut cmdline).is_err() {
        return false;
    }
    let args: Vec<&[u8]> = cmdline.split(|b| *b == 0).collect();
    mine && args
        .windows(2)
        .any(|w| w == [&b"worker"[..], &b"supervise"[..]])
        && args
            .windows(2)
            .any(|w| w[0] == b"--attempt" && w[1] == attempt.as_bytes())
}

/// Whether process group `pgid` is one started for the attempt `proof` stands for: a live
/// process of it is proven, or is the child of one that is (a command that replaced its
/// environment).
fn started_here(pgid: i32, proof: &Proof<'_>) -> bool {
    pgid > 0
        && processes().iter().any(|p| {
            p.group == pgid && p.state != 'Z' && (proof.holds(p.pid) || proof.holds(p.parent))
        })
}

pub(crate) fn read_current(root: &Root) -> Option<Current> {
    let bytes = crate::files::read_bytes(&root.current(), 1 << 20).ok()?;
    serde_json::from_slice(&bytes).ok()
}

fn write_atomic(path: &Path, data: &[u8]) -> std::io::Result<()> {
    let dir = path.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir)?;
    let mut temp = tempfile::NamedTempFile::new_in(dir)?;
    temp.write_all(data)?;
    temp.as_file().sync_all()?;
    temp.persist(path).map_err(|e| e.error)?;
    Ok(())
}

fn write_current(root: &Root, current: &Current) -> std::io::Result<()> {
    write_atomic(
        &root.current(),
        &serde_json::to_vec(current).expect("serialisable"),
    )
}

/// A process as `/proc/PID/stat` shows it.
struct Process {
    pid: i32,
    parent: i32,
    group: i32,
    state: char,
}

/// Every process, from `/proc` (Linux).
fn processes() -> Vec<Process> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|e| {
            let pid: i32 = e.file_name().to_str()?.parse().ok()?;
            let stat = std::fs::read_to_string(e.path().join("stat")).ok()?;
            // `pid (comm) state ppid pgrp …`: comm may hold spaces and parentheses.
            let rest = &stat[stat.rfind(')')? + 2..];
            let mut fields = rest.split_whitespace();
            let state = fields.next()?.chars().next()?;
            let parent: i32 = fields.next()?.parse().ok()?;
            let group: i32 = fields.next()?.parse().ok()?;
            Some(Process {
                pid,
                parent,
                group,
                state,
            })
        })
        .collect()
}

/// Whether a process still runs (a zombie, dead but not yet reaped, does not).
pub(crate) fn alive(pid: i32) -> bool {
    pid > 0
        && nix::sys::signal::kill(Pid::from_raw(pid), None).is_ok()
        && processes().iter().any(|p| p.pid == pid && p.state != 'Z')
}

/// Whether process `pid` runs and was started for the attempt `proof` stands for.
fn ours_alive(pid: i32, proof: &Proof<'_>) -> bool {
    alive(pid) && proof.holds(pid)
}

/// Whether any process of group `pgid` still runs.
fn group_alive(pgid: i32) -> bool {
    pgid > 0
        && killpg(Pid::from_raw(pgid), None).is_ok()
        && processes()
            .iter()
            .any(|p| p.group == pgid && p.state != 'Z')
}

/// TERMs process group `pgid`, waits up to `grace` for it to end, then KILLs it; only while
/// it is a group started for the attempt `proof` stands for, never anyone else's.
fn stop_group(pgid: i32, grace: Duration, proof: &Proof<'_>) {
    if group_alive(pgid) && !started_here(pgid, proof) {
        eprintln!("tpu-runner: process group {pgid} was not started by this agent: left alone");
        return;
    }
    terminate(pgid, grace, || started_here(pgid, proof));
}

/// TERMs process group `pgid`, waits up to `grace` for it to end, then KILLs it if
/// `still_ours()`.
fn terminate(pgid: i32, grace: Duration, still_ours: impl Fn() -> bool) {
    if !group_alive(pgid) {
        return;
    }
    let _ = killpg(Pid::from_raw(pgid), Signal::SIGTERM);
    let until = Instant::now() + grace;
    while group_alive(pgid) && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(50));
    }
    if group_alive(pgid) && still_ours() {
        let _ = killpg(Pid::from_raw(pgid), Signal::SIGKILL);
    }
}

/// Takes the worker's launch lock (held until dropped).
pub(crate) fn lock(root: &Root) -> Result<nix::fcntl::Flock<std::fs::File>, String> {
    std::fs::create_dir_all(root.process()).map_err(|e| format!("{}: {e}", root.dir.display()))?;
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(root.process().join("launch.lock"))
        .map_err(|e| format!("launch lock: {e}"))?;
    nix::fcntl::Flock::lock(file, nix::fcntl::FlockArg::LockExclusive)
        .map_err(|(_, e)| format!("launch lock: {e}"))
}

fn now() -> String {
    jiff::Timestamp::now().to_string()
}

/// Empties a folder (creating it if absent).
fn wipe(dir: &Path) -> std::io::Result<()> {
    if dir.exists() {
        for entry in std::fs::read_dir(dir)? {
            let path = entry?.path();
            if path.is_dir() && !path.is_symlink() {
                std::fs::remove_dir_all(&path)?;
            } else {
                std::fs::remove_file(&path)?;
            }
        }
    }
    std::fs::create_dir_all(dir)
}

/// Checks that `dir`, when present, is a real folder at its canonical path, owned by this
/// user and writable by no one else: what the agent empties, links into and reads its
/// current attempt from must be its own, never a link to or a folder of someone else's.
fn own_folder(dir: &Path) -> Result<(), String> {
    use std::os::unix::fs::MetadataExt;
    let Ok(meta) = std::fs::symlink_metadata(dir) else {
        return Ok(());
    };
    if meta.file_type().is_symlink() || !meta.is_dir() {
        return Err(format!("{} is not a plain folder", dir.display()));
    }
    if std::fs::canonicalize(dir).ok().as_deref() != Some(dir) {
        return Err(format!("{} is not at its canonical path", dir.display()));
    }
    if meta.uid() != nix::unistd::geteuid().as_raw() {
        return Err(format!("{} belongs to another user", dir.display()));
    }
    if meta.mode() & 0o022 != 0 {
        return Err(format!(
            "{} is writable by other users (mode {:o})",
            dir.display(),
            meta.mode() & 0o7777
        ));
    }
    Ok(())
}

/// The agent's folders under `root` (the root, the workspace, caches, process records,
/// attempts), each checked by [`own_folder`]: `launch` and `recover-disk` refuse a root
/// another user could have prepared (the default root is in a world-writable `/tmp`).
pub(crate) fn check_root(root: &Root) -> Result<(), String> {
    for dir in [
        root.dir.clone(),
        root.work(),
        root.cache(),
        root.process(),
        root.dir.join("attempts"),
    ] {
        own_folder(&dir).map_err(|e| format!("refusing the agent's root: {e}"))?;
    }
    Ok(())
}

/// Free bytes on the file system holding `dir`.
pub(crate) fn free_bytes(dir: &Path) -> u64 {
    nix::sys::statvfs::statvfs(dir)
        .map(|s| s.blocks_available() * s.fragment_size())
        .unwrap_or(0)
}

/// Keeps the declared caches that are ready, deletes every other, evicts the least
/// recently used while the disk is below `floor`, and links each declared cache into the
/// job directory. The error names what could not be done.
/// Copies into `to` (a moved job's checkpoint directory in its new bucket) every object of
/// `from` (the one it left) that `to` does not hold yet, inside the object store: each worker
/// of the attempt does it before the command starts, so whichever starts first finds them
/// all, and an attempt after a failed copy finishes it. Objects already in `to` (written
/// since the move) are kept. Returns what it did, for the preflight log.
fn copy_checkpoints(objects: &dyn ObjectStore, from: &str, to: &str) -> Result<String, String> {
    let prefix = |dir: &str| format!("{}/", dir.trim_end_matches('/'));
    let (from, to) = (prefix(from), prefix(to));
    let bucket_of = |uri: &str| -> Result<String, String> {
        crate::objects::split(uri)
            .map(|(b, _)| format!("gs://{b}/"))
            .map_err(|e| e.to_string())
    };
    let (from_bucket, to_bucket) = (bucket_of(&from)?, bucket_of(&to)?);
    let present: std::collections::BTreeSet<String> = objects
        .list(&to)
        .map_err(|e| e.to_string())?
        .into_iter()
        .map(|o| o.name)
        .collect();
    let to_name = to.strip_prefix(&to_bucket).unwrap_or(&to);
    let from_name = from.strip_prefix(&from_bucket).unwrap_or(&from);
    let (mut copied, mut kept) = (0, 0);
    for object in objects.list(&from).map_err(|e| e.to_string())? {
        let Some(rel) = object.name.strip_prefix(from_name) else {
            continue;
        };
        let target = format!("{to_name}{rel}");
        if present.contains(&target) {
            kept += 1;
            continue;
        }
        objects
            .copy(
                &format!("{from_bucket}{}", object.name),
                &format!("{to_bucket}{target}"),
            )
            .map_err(|e| format!("copying the checkpoints of the job's previous region: {e}"))?;
        copied += 1;
    }
    Ok(format!(
        "checkpoints: {copied} objects copied from {from} to {to}, {kept} already there"
    ))
}

fn prepare_caches(spec: &LaunchSpec, dirs: &Dirs, floor: u64) -> Result<Vec<String>, String> {
    let declared: Vec<&crate::spec::job::Cache> = spec.request.caches.iter().collect();
    std::fs::create_dir_all(&dirs.cache_root).map_err(|e| format!("cache root: {e}"))?;
    let mut notes = Vec::new();
    let mut kept: Vec<(std::time::SystemTime, PathBuf)> = Vec::new();
    for entry in std::fs::read_dir(&dirs.cache_root).map_err(|e| format!("cache root: {e}"))? {
        let entry = entry.map_err(|e| format!("cache root: {e}"))?;
        let name = entry.file_name().to_string_lossy().into_owned();
        let path = entry.path();
        let ready = path.join(".ready").is_file() && !path.join(".ready").is_symlink();
        if declared.iter().any(|c| c.key == name) && ready && path.is_dir() {
            let used = entry
                .metadata()
                .and_then(|m| m.modified())
                .unwrap_or(std::time::UNIX_EPOCH);
            kept.push((used, path));
        } else {
            remove_any(&path).map_err(|e| format!("cache {name}: {e}"))?;
            notes.push(format!(
                "cache {name} removed (not declared, or never made ready)"
            ));
        }
    }
    kept.sort();
    for (_, path) in &kept {
        if free_bytes(&dirs.cache_root) >= floor {
            break;
        }
        remove_any(path).map_err(|e| format!("cache {}: {e}", path.display()))?;
        notes.push(format!(
            "cache {} evicted: the disk is below its floor of {floor} free bytes",
            path.file_name().unwrap_or_default().to_string_lossy()
        ));
    }
    let free = free_bytes(&dirs.cache_root);
    if free < floor {
        return Err(format!(
            "the disk has {free} bytes free, below the floor of {floor} even with every cache evicted"
        ));
    }
    for cache in declared {
        crate::spec::job::check_cache_key(&cache.key)
            .map_err(|e| format!("cache key `{}`: expected {e}", cache.key))?;
        let target = dirs.cache_root.join(&cache.key);
        std::fs::create_dir_all(&target).map_err(|e| format!("cache {}: {e}", cache.key))?;
        let rel = Path::new(&cache.path);
        let outside = || {
            format!(
                "cache path `{}` is not inside the job directory",
                cache.path
            )
        };
        if rel.is_absolute()
            || rel
                .components()
                .any(|c| matches!(c, std::path::Component::ParentDir))
        {
            return Err(outside());
        }
        // Where the link goes once the bundle's links on the way are followed: nothing is
        // removed or linked through a path that leaves the job directory.
        let name = rel.file_name().ok_or_else(outside)?;
        let parent =
            super::bundle::resolve_beneath(&dirs.job, rel.parent().unwrap_or(Path::new("")))
                .ok_or_else(outside)?;
        let parent = dirs.job.join(parent);
        std::fs::create_dir_all(&parent).map_err(|e| format!("cache {}: {e}", cache.key))?;
        let link = parent.join(name);
        let _ = remove_any(&link);
        std::os::unix::fs::symlink(&target, &link)
            .map_err(|e| format!("cache {}: {e}", cache.key))?;
        // Touch: this cache was used now.
        let _ = filetime_now(&target);
    }
    Ok(notes)
}

fn filetime_now(path: &Path) -> std::io::Result<()> {
    let file = std::fs::File::open(path)?;
    file.set_modified(std::time::SystemTime::now())
}

pub(crate) fn remove_any(path: &Path) -> std::io::Result<()> {
    if path.is_dir() && !path.is_symlink() {
        std::fs::remove_dir_all(path)
    } else {
        match std::fs::remove_file(path) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            other => other,
        }
    }
}

/// The status object's address for `host`.
fn status_uri(spec: &LaunchSpec, host: &str) -> String {
    let r = &spec.request;
    format!(
        "{}status/{host}.json",
        attempt_prefix(&r.bucket, &r.job_id, &r.attempt_id)
    )
}

/// Uploads `status` (kept locally first), retrying for up to `patience`.
fn publish_status(
    objects: &dyn ObjectStore,
    spec: &LaunchSpec,
    dirs: &Dirs,
    status: &StatusObject,
    patience: Duration,
) -> Result<(), String> {
    let data = serde_json::to_vec_pretty(status).expect("serialisable");
    write_atomic(&dirs.attempt.join("status.json"), &data).map_err(|e| e.to_string())?;
    let uri = status_uri(spec, &status.host);
    let until = Instant::now() + patience;
    loop {
        match objects.put(&uri, &data, false) {
            Ok(()) => return Ok(()),
            Err(e) if Instant::now() >= until => return Err(e.to_string()),
            Err(_) => std::thread::sleep(Duration::from_secs(2)),
        }
    }
}

fn setup_failure(spec: &LaunchSpec, host: &str, error: String) -> StatusObject {
    StatusObject {
        host: host.to_owned(),
        attempt_id: spec.request.attempt_id.to_string(),
        state: "failed_setup".into(),
        command_exit_code: None,
        infrastructure_failure: None,
        setup_error: Some(error),
        artifact_upload_error: None,
        started_at: None,
        finished_at: now(),
    }
}

/// Launches `spec` on this worker (`host`, under `root`); `agent` is the program to start
/// the supervisor with (this binary). Idempotent per attempt.
pub fn launch(
    root: &Root,
    host: &str,
    spec: &LaunchSpec,
    objects: &dyn ObjectStore,
    agent: &Path,
    objects_arg: Option<&Path>,
    metadata: Option<&str>,
) -> Result<LaunchAck, String> {
    let r = &spec.request;
    let attempt = r.attempt_id.as_str();
    let job = r.job_id.as_str();
    // The one rule for ids, as `validate-jobs` and `submit` apply it (a path segment that is
    // never `.` or `..`: it starts with a letter or digit).
    // The host names objects (`status/HOST.json`, `logs/HOST.log`): a plain name only, or
    // the launch is refused here rather than acknowledged and failing unseen later.
    for (what, id) in [
        ("job id", job),
        ("attempt id", attempt),
        ("worker host", host),
    ] {
        crate::spec::job::check_job_id(id)
            .map_err(|rule| format!("the {what} {id:?} is not {rule}"))?;
    }
    // The manifest's rules for the environment and the command, as `submit` applies them: a
    // refused one is a set-up failure with its reason, never a command that cannot start.
    for (name, value) in &r.env {
        crate::spec::job::check_env_name(name)
            .map_err(|e| format!("the variable {name:?}: {e}"))?;
        crate::spec::job::check_env_value(name, value)
            .map_err(|e| format!("the variable {name}: expected {e}"))?;
    }
    crate::spec::job::check_command(&r.command)
        .map_err(|e| format!("the command: expected {e}"))?;
    spec.check_timings()?;
    check_root(root)?;
    let _lock = lock(root)?;
    // Again once the lock made the folders: a root another user made between the first
    // check and now is refused before anything in it is read or emptied.
    check_root(root)?;
    let dirs = root.dirs(job, attempt);
    // Already finished here: publish the status again.
    if let Ok(bytes) = crate::files::read_bytes(&dirs.attempt.join("status.json"), 1 << 20)
        && let Ok(status) = serde_json::from_slice::<StatusObject>(&bytes)
    {
        publish_status(objects, spec, &dirs, &status, Duration::from_secs(60))?;
        return Ok(LaunchAck::AlreadyComplete);
    }
    if let Some(current) = read_current(root) {
        let proof = Proof::of(&current);
        if current.attempt_id == attempt && ours_alive(current.supervisor, &proof) {
            return Ok(LaunchAck::AlreadyRunning);
        }
        // Whatever else this agent started here stops first.
        let grace = Duration::from_secs(spec.grace_secs.max(1));
        if let Some(group) = current.command_group {
            stop_group(group, grace, &proof);
        }
        stop_group(current.supervisor, grace, &proof);
        let _ = std::fs::remove_file(root.current());
    }
    // A clean workspace and shared memory; the attempt's own folder (earlier attempts'
    // folders go: their statuses were published, and a disk must not fill over weeks).
    wipe(&root.work()).map_err(|e| format!("cannot wipe the workspace: {e}"))?;
    if let Ok(entries) = std::fs::read_dir(root.dir.join("attempts")) {
        for entry in entries.flatten() {
            if entry.file_name() != attempt {
                let _ = remove_any(&entry.path());
            }
        }
    }
    // A fixed path in a shared /dev/shm (adopted TPUs are shared with their owner): only a
    // real folder of this user is emptied, never a link's target or another user's files.
    if let Ok(meta) = std::fs::symlink_metadata(&root.shm) {
        use std::os::unix::fs::MetadataExt;
        if meta.file_type().is_symlink()
            || !meta.is_dir()
            || meta.uid() != nix::unistd::geteuid().as_raw()
        {
            return Err(format!(
                "the shared-memory folder {} is not a folder of this user: refusing to empty it",
                root.shm.display()
            ));
        }
    }
    wipe(&root.shm).map_err(|e| format!("cannot wipe shared memory: {e}"))?;
    for dir in [&dirs.job, &dirs.shm, &dirs.attempt] {
        std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    }
    let spec_path = dirs.attempt.join("spec.json");
    write_atomic(&spec_path, &serde_json::to_vec(spec).expect("serialisable"))
        .map_err(|e| format!("{}: {e}", spec_path.display()))?;
    let mut preflight = Vec::new();
    // The free-disk floor: the job's TPU_RUNNER_MIN_ROOT_FREE_KB (checked at submit: an
    // integer of at least 1 GiB), else the runner's.
    let floor = r
        .env
        .get(crate::spec::job::MIN_ROOT_FREE_KB)
        .and_then(|kb| kb.trim().parse::<u64>().ok())
        .map_or(spec.min_free_bytes, |kb| kb.saturating_mul(1024));
    let prepared = (|| {
        if let Some(uri) = &r.bundle {
            bundle::fetch_and_unpack(
                objects,
                uri,
                &dirs.attempt.join("bundle.tar.gz"),
                &dirs.job,
                floor,
            )?;
            if bundle::sha256_of_uri(uri).is_none() {
                preflight.push(format!(
                    "bundle {uri} is not named by its digest: not verified"
                ));
            }
        }
        if let Some(from) = &r.checkpoint_from {
            preflight.push(copy_checkpoints(objects, from, &r.checkpoint_dir)?);
        }
        preflight.extend(prepare_caches(spec, &dirs, floor)?);
        Ok::<(), String>(())
    })();
    let _ = std::fs::write(dirs.attempt.join("preflight.log"), preflight.join("\n"));
    if let Err(error) = prepared {
        let status = setup_failure(spec, host, error);
        publish_status(objects, spec, &dirs, &status, Duration::from_secs(60))?;
        return Ok(LaunchAck::Launched);
    }
    // The supervisor runs detached in a process group of its own.
    let log = std::fs::File::create(dirs.attempt.join("supervisor.log"))
        .map_err(|e| format!("supervisor log: {e}"))?;
    let mut command = Command::new(agent);
    command
        .args(["worker", "supervise", "--root"])
        .arg(&root.dir)
        .arg("--shm")
        .arg(&root.shm)
        .args(["--host", host, "--attempt", attempt, "--job", job]);
    if let Some(dir) = objects_arg {
        command.arg("--objects").arg(dir);
    }
    command
        .arg("--metadata")
        .arg(metadata.unwrap_or(METADATA_OFF));
    let token = uuid::Uuid::new_v4().simple().to_string();
    let child = command
        .env(TOKEN_VAR, &token)
        .stdin(Stdio::null())
        .stdout(log.try_clone().map_err(|e| e.to_string())?)
        .stderr(log)
        .process_group(0)
        .spawn()
        .map_err(|e| format!("cannot start the supervisor: {e}"))?;
    write_current(
        root,
        &Current {
            attempt_id: attempt.to_owned(),
            job_id: job.to_owned(),
            supervisor: child.id() as i32,
            command_group: None,
            token,
        },
    )
    .map_err(|e| format!("cannot record the attempt: {e}"))?;
    Ok(LaunchAck::Launched)
}

/// How often a running command's output is shipped while it is at most `LIVE_LOG_SMALL`
/// bytes (larger logs go with the heartbeats; logs above `LIVE_LOG_LIMIT` only at the end).
const LIVE_LOG_EVERY: Duration = Duration::from_secs(2);
const LIVE_LOG_SMALL: u64 = 8 << 20;
const LIVE_LOG_LIMIT: u64 = 256 << 20;

/// The infrastructure failure a command's output shows, if any.
fn infrastructure_failure(log: &Path) -> Option<String> {
    let text = crate::files::read_bytes(log, 1 << 30).ok()?;
    let marker = b"SLICE_FAILURE_CHIP_DRIVER_ERROR";
    text.windows(marker.len())
        .any(|w| w == marker)
        .then(|| "slice_failure_chip_driver_error".to_owned())
}

/// The `--metadata` word for a worker with no metadata server to watch.
pub const METADATA_OFF: &str = "off";

/// Supervises attempt `attempt` of `job` (started by `launch`): heartbeats, the command, its
/// log and its status object, and the cloud's notices from the metadata server at `metadata`
/// (when given) passed on to the command. Returns the command's exit code.
pub fn supervise(
    root: &Root,
    host: &str,
    job: &str,
    attempt: &str,
    objects: &dyn ObjectStore,
    metadata: Option<&str>,
) -> Result<i32, String> {
    let dirs = root.dirs(job, attempt);
    let spec: LaunchSpec = serde_json::from_slice(
        &crate::files::read_bytes(&dirs.attempt.join("spec.json"), 16 << 20)
            .map_err(|e| format!("spec: {e}"))?,
    )
    .map_err(|e| format!("spec: {e}"))?;
    // Checked at launch; a spec file changed since must not overflow the clock either.
    spec.check_timings().map_err(|e| format!("spec: {e}"))?;
    let r = &spec.request;
    let prefix = attempt_prefix(&r.bucket, job, attempt);
    let heartbeat_uri = format!("{prefix}heartbeat/{host}.json");
    let beat = |objects: &dyn ObjectStore| {
        let body = serde_json::json!({"host": host, "attempt_id": attempt, "at": now()});
        objects.put(&heartbeat_uri, body.to_string().as_bytes(), false)
    };
    beat(objects).map_err(|e| format!("first heartbeat: {e}"))?;
    let log_path = dirs.attempt.join("command.log");
    let log_uri = format!("{prefix}logs/{host}.log");
    let interval = Duration::from_secs(spec.heartbeat_secs.max(1));
    // The accelerator devices must be free (a process of an earlier job may have escaped
    // its group); a cancel meanwhile stops this supervisor, as before the command starts.
    let mut holders = spec.devices.holders(&[std::process::id() as i32]);
    let wait_until = Instant::now() + Duration::from_secs(spec.device_wait_secs);
    let mut next = Instant::now() + interval;
    while !holders.clear() && Instant::now() < wait_until {
        std::thread::sleep(Duration::from_secs(2).min(wait_until - Instant::now()));
        if Instant::now() >= next {
            let _ = beat(objects);
            next = Instant::now() + interval;
        }
        holders = spec.devices.holders(&[std::process::id() as i32]);
    }
    if !holders.clear() {
        let note = format!(
            "tpu-runner: the accelerator devices ({}) are still held after {} s by process(es) {}: the command did not start\n",
            holders
                .devices
                .iter()
                .map(|d| d.display().to_string())
                .collect::<Vec<_>>()
                .join(", "),
            spec.device_wait_secs,
            super::devices::pid_list(&holders.pids),
        );
        let _ = std::fs::write(&log_path, &note);
        // No command ran, so no artifact is missing: a failed upload of this note must not
        // turn a retryable failure into a final one (the status says what happened).
        let _ = objects.put(&log_uri, note.as_bytes(), false);
        let status = StatusObject {
            host: host.to_owned(),
            attempt_id: attempt.to_owned(),
            state: "failed".into(),
            command_exit_code: None,
            infrastructure_failure: Some("accelerator_busy".into()),
            setup_error: None,
            artifact_upload_error: None,
            started_at: None,
            finished_at: now(),
        };
        publish_status(objects, &spec, &dirs, &status, Duration::from_secs(3600))?;
        forget_current(root, attempt);
        return Ok(EXIT_ACCELERATOR_BUSY);
    }
    if let Some(note) = spec.devices.clear_stale_lockfile(&holders) {
        let mut preflight = std::fs::OpenOptions::new()
            .append(true)
            .create(true)
            .open(dirs.attempt.join("preflight.log"))
            .map_err(|e| format!("preflight log: {e}"))?;
        let _ = writeln!(preflight, "{note}");
    }
    let log = std::fs::File::create(&log_path).map_err(|e| format!("command log: {e}"))?;
    // `launch` records this supervisor under its lock: wait for it, so the command's group
    // is recorded where a cancel looks.
    let launch_lock = lock(root)?;
    let started_at = now();
    let mut child = Command::new("bash")
        .arg("-lc")
        .arg(&r.command)
        .current_dir(&dirs.job)
        .envs(command_env(&spec, host, &dirs))
        .stdin(Stdio::null())
        .stdout(log.try_clone().map_err(|e| e.to_string())?)
        .stderr(log)
        .process_group(0)
        .spawn()
        .map_err(|e| format!("cannot start the command: {e}"))?;
    let group = child.id() as i32;
    if let Some(mut current) = read_current(root).filter(|c| c.attempt_id == attempt) {
        current.command_group = Some(group);
        let _ = write_current(root, &current);
    }
    drop(launch_lock);
    let watcher = metadata.map(super::notice::Watcher::start);
    let mut noticed = None;
    // Heartbeats while the command runs, and its output so far for `watch` and `logs`:
    // every couple of seconds while it is small, then with the heartbeats.
    let mut next_log = Instant::now() + LIVE_LOG_EVERY;
    let mut shipped = 0u64;
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break status,
            Ok(None) => {}
            Err(e) => return Err(format!("waiting for the command: {e}")),
        }
        // The cloud's notice: the command is told why, then asked to stop; the TPU goes
        // away (or into maintenance) on its own time, so nothing is killed here.
        if noticed.is_none()
            && let Some(notice) = watcher.as_ref().and_then(super::notice::Watcher::notice)
        {
            noticed = Some(notice);
            if let Err(e) = super::notice::write_marker(&dirs.attempt, notice) {
                eprintln!("tpu-runner: cannot write the notice file: {e}");
            }
            eprintln!(
                "tpu-runner: {} notice at {}: SIGTERM to the command",
                notice.word(),
                now()
            );
            let _ = killpg(Pid::from_raw(group), Signal::SIGTERM);
        }
        if Instant::now() >= next {
            let _ = beat(objects);
            next = Instant::now() + interval;
        }
        if Instant::now() >= next_log {
            let size = std::fs::metadata(&log_path).map_or(0, |m| m.len());
            if size != shipped
                && let Ok(data) = crate::files::read_bytes(&log_path, LIVE_LOG_LIMIT)
                && objects.put(&log_uri, &data, false).is_ok()
            {
                shipped = size;
            }
            next_log = Instant::now()
                + if size <= LIVE_LOG_SMALL {
                    LIVE_LOG_EVERY
                } else {
                    interval
                };
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    use std::os::unix::process::ExitStatusExt;
    let code = status
        .code()
        .unwrap_or_else(|| 128 + status.signal().unwrap_or(0));
    // Nothing of the command outlives it (the group is the one this supervisor started:
    // while any process of it lives, its id is not reused).
    terminate(group, Duration::from_secs(1), || true);
    let upload = crate::files::read_bytes(&log_path, 5 << 30)
        .map_err(|e| e.to_string())
        .and_then(|data| {
            objects
                .put(&log_uri, &data, false)
                .map_err(|e| e.to_string())
        });
    // Stopped by a notice, the command did not finish its work, whatever it exited with.
    let infrastructure = match noticed {
        Some(notice) => Some(notice.word().to_owned()),
        None => (code != 0)
            .then(|| infrastructure_failure(&log_path))
            .flatten(),
    };
    let state = match (&upload, code) {
        (Err(_), _) => "failed_artifacts",
        (Ok(()), 0) if noticed.is_none() => "succeeded",
        _ => "failed",
    };
    let status = StatusObject {
        host: host.to_owned(),
        attempt_id: attempt.to_owned(),
        state: state.into(),
        command_exit_code: Some(code),
        infrastructure_failure: infrastructure,
        setup_error: None,
        artifact_upload_error: upload.err(),
        started_at: Some(started_at),
        finished_at: now(),
    };
    publish_status(objects, &spec, &dirs, &status, Duration::from_secs(3600))?;
    forget_current(root, attempt);
    Ok(code)
}

/// What `supervise` returns when the devices stayed busy (the original's code 75).
pub const EXIT_ACCELERATOR_BUSY: i32 = 75;

/// Removes the record of what runs here if it is still `attempt`'s.
fn forget_current(root: &Root, attempt: &str) {
    if read_current(root).is_some_and(|c| c.attempt_id == attempt) {
        let _ = std::fs::remove_file(root.current());
    }
}

/// Stops whatever runs on this worker (what deleting its TPU does): the command's group
/// and the supervisor's, at once. Under the launch lock, like `cancel`: a supervisor that
/// has started its command has recorded its group, and one that has not is still waiting
/// for the lock, so killing it starts nothing.
pub fn stop_all(root: &Root) {
    let _lock = lock(root);
    if let Some(current) = read_current(root) {
        for group in current
            .command_group
            .into_iter()
            .chain([current.supervisor])
        {
            stop_group(group, Duration::ZERO, &Proof::of(&current));
        }
    }
}

/// Stops `attempt` on this worker. Stopped before its command started, the attempt gets its
/// status here (the supervisor that would have written it is gone).
/// With a `notice`, the command is told why first (its marker file) and has at least a Spot
/// notice's time to end before it is killed.
pub fn cancel(
    root: &Root,
    host: &str,
    attempt: &str,
    grace: Duration,
    objects: &dyn ObjectStore,
    notice: Option<super::notice::Notice>,
) -> CancelAck {
    // Under the launch lock: a supervisor records its command's group under it, so a cancel
    // never sees a command started but not yet recorded.
    let _lock = lock(root);
    let Some(current) = read_current(root) else {
        return CancelAck::NotRunning;
    };
    if current.attempt_id != attempt {
        return CancelAck::Mismatch;
    }
    let proof = Proof::of(&current);
    let running = current
        .command_group
        .is_some_and(|group| group_alive(group) && started_here(group, &proof))
        || ours_alive(current.supervisor, &proof);
    if !running {
        return CancelAck::NotRunning;
    }
    match current.command_group {
        Some(group) => {
            let grace = match notice {
                Some(notice) => {
                    let dirs = root.dirs(&current.job_id, attempt);
                    if let Err(e) = super::notice::write_marker(&dirs.attempt, notice) {
                        eprintln!("tpu-runner: cannot write the notice file: {e}");
                    }
                    grace.max(Duration::from_secs(super::notice::NOTICE_SECS))
                }
                None => grace,
            };
            stop_group(group, grace, &proof)
        }
        // Still setting up: stop the supervisor itself, and say so in its place.
        None => {
            stop_group(current.supervisor, grace, &proof);
            let dirs = root.dirs(&current.job_id, attempt);
            if !dirs.attempt.join("status.json").exists()
                && let Ok(bytes) =
                    crate::files::read_bytes(&dirs.attempt.join("spec.json"), 16 << 20)
                && let Ok(spec) = serde_json::from_slice::<LaunchSpec>(&bytes)
            {
                let mut status =
                    setup_failure(&spec, host, "cancelled before the command started".into());
                status.state = "failed".into();
                let _ = publish_status(objects, &spec, &dirs, &status, Duration::from_secs(60));
            }
            let _ = std::fs::remove_file(root.current());
        }
    }
    CancelAck::Sent
}
