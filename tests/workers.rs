//! The worker agent end to end through a transport: the real `tpu-runner` binary runs as the
//! agent of every worker (one root folder each), writes its status, heartbeat and log objects
//! to an object store, and `AgentWorkers` launches, cancels and reads reports as the GCP
//! backend does; verdicts come from the engine's `aggregate`. Here through the local
//! transport and a local object folder.
//!
//! Waits are for events with a generous deadline (never a timing assertion).

#[path = "support/holder.rs"]
mod holder;
#[path = "support/sshd.rs"]
mod sshd;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use holder::Holder;
use tpu_runner::backend::workers::{AgentWorkers, Workers};
use tpu_runner::backend::{InFlight, Outcome};
use tpu_runner::engine::aggregate::{FailureKind, Graces, Verdict, aggregate};
use tpu_runner::engine::observe::{
    AttemptReport, CancelOutcome, LaunchRequest, RemoteErrorKind, WorkerState,
};
use tpu_runner::gcp::http::Endpoint;
use tpu_runner::objects::{Gcs, LocalDir, ObjectStore};
use tpu_runner::spec::job::Cache;
use tpu_runner::spec::{Name, TpuType};
use tpu_runner::worker::devices::Devices;
use tpu_runner::worker::transport::{Local, Ssh, Target, Transport};

/// Where the agents run and write: the local transport and a local folder, or real sshd
/// servers (one per worker) and the GCS emulator.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Local,
    SshGcs,
}

/// The kinds this machine can run: SSH plus GCS needs `/usr/sbin/sshd` and
/// `STORAGE_EMULATOR_HOST` (both in CI, where their absence fails).
fn kinds() -> Vec<Kind> {
    let gcs = std::env::var("STORAGE_EMULATOR_HOST").is_ok_and(|h| !h.trim().is_empty());
    if gcs && sshd::sshd_available() {
        return vec![Kind::Local, Kind::SshGcs];
    }
    assert!(
        std::env::var("TPU_RUNNER_REQUIRE_EMULATORS").as_deref() != Ok("1"),
        "the SSH and GCS cases need /usr/sbin/sshd and STORAGE_EMULATOR_HOST (.ci/run provides both)"
    );
    eprintln!("SSH + GCS cases skipped: they need /usr/sbin/sshd and STORAGE_EMULATOR_HOST");
    vec![Kind::Local]
}

/// The SSH side of a rig: the transport, the controller's public key, a server per worker.
struct SshSide {
    ssh: Arc<Ssh>,
    client_public: String,
    servers: Mutex<BTreeMap<String, sshd::Server>>,
    gcs: String,
}

struct Rig {
    kind: Kind,
    dir: tempfile::TempDir,
    objects: Arc<dyn ObjectStore>,
    bucket: String,
    workers: AgentWorkers,
    ssh: Option<SshSide>,
    rt: tokio::runtime::Runtime,
    /// A script the agent is run through (removed with the rig).
    wrapper: Option<tempfile::TempPath>,
}

impl Rig {
    fn new(kind: Kind) -> Rig {
        Rig::with_agent(
            kind,
            PathBuf::from(env!("CARGO_BIN_EXE_tpu-runner")),
            tempfile::tempdir().unwrap(),
        )
    }

    /// A local rig whose agent runs as the unprivileged user `uid` (through `setpriv`), its
    /// folders reachable by that user; `None` when this test cannot switch users (not root,
    /// or no `setpriv`).
    fn as_user(uid: u32) -> Option<Rig> {
        use std::os::unix::fs::PermissionsExt;
        let can = nix::unistd::Uid::effective().is_root()
            && std::process::Command::new("setpriv")
                .arg("--version")
                .output()
                .is_ok_and(|o| o.status.success());
        if !can {
            return None;
        }
        let wrapper = tempfile::Builder::new()
            .prefix("agent-as-")
            .tempfile()
            .unwrap()
            .into_temp_path();
        std::fs::write(
            &wrapper,
            format!(
                "#!/bin/sh\nTMPDIR=/tmp exec setpriv --reuid={uid} --regid={uid} --clear-groups '{}' \"$@\"\n",
                env!("CARGO_BIN_EXE_tpu-runner")
            ),
        )
        .unwrap();
        std::fs::set_permissions(&wrapper, std::fs::Permissions::from_mode(0o755)).unwrap();
        // Where that user can reach it (the test's own temporary folder may be private).
        let dir = tempfile::Builder::new()
            .prefix("tpu-runner-rig-")
            .tempdir_in("/tmp")
            .unwrap();
        let mut rig = Rig::with_agent(Kind::Local, wrapper.to_path_buf(), dir);
        rig.wrapper = Some(wrapper);
        std::fs::set_permissions(rig.dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        Some(rig)
    }

    fn with_agent(kind: Kind, agent: PathBuf, dir: tempfile::TempDir) -> Rig {
        static BUCKETS: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let (objects, bucket, transport, ssh): (
            Arc<dyn ObjectStore>,
            String,
            Arc<dyn Transport>,
            _,
        ) = match kind {
            Kind::Local => (
                Arc::new(LocalDir::new(dir.path().join("objects"))),
                "gs://job-bucket".to_owned(),
                Arc::new(Local {
                    base: dir.path().join("workers"),
                    agent,
                    objects: Some(dir.path().join("objects")),
                    metadata: None,
                }),
                None,
            ),
            Kind::SshGcs => {
                let host = std::env::var("STORAGE_EMULATOR_HOST").unwrap();
                let gcs = Gcs::new(Endpoint::emulator(&host)).unwrap();
                let name = format!(
                    "jobs-{}-{}",
                    std::process::id(),
                    BUCKETS.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
                );
                gcs.client()
                    .create_bucket("proj", &name, "US-EAST1")
                    .unwrap();
                let (ssh, client_public) =
                    sshd::controller(dir.path(), env!("CARGO_BIN_EXE_tpu-runner"));
                let side = SshSide {
                    ssh: ssh.clone(),
                    client_public,
                    servers: Mutex::default(),
                    gcs: host,
                };
                (Arc::new(gcs), format!("gs://{name}"), ssh, Some(side))
            }
        };
        let mut workers = AgentWorkers::new(transport, objects.clone(), "proj");
        workers.min_free_bytes = 0;
        workers.heartbeat_secs = 1;
        workers.timeout = Duration::from_secs(60);
        // The rig's own device files, none until a case makes one.
        workers.devices = Devices {
            patterns: vec![dir.path().join("dev/accel*").display().to_string()],
            lockfile: dir.path().join("dev/libtpu_lockfile"),
        };
        Rig {
            kind,
            dir,
            objects,
            bucket,
            workers,
            ssh,
            rt,
            wrapper: None,
        }
    }

    /// Over SSH, a server for every worker of `r`'s TPU (started the first time).
    fn serve(&self, r: &LaunchRequest) {
        let Some(side) = &self.ssh else { return };
        let mut servers = side.servers.lock().unwrap();
        for i in 0..r.worker_count {
            let target = Target {
                zone: r.zone.to_string(),
                tpu: r.tpu_name.to_string(),
                worker: i,
            };
            if servers.contains_key(&target.host()) {
                continue;
            }
            let root = self.root(&r.tpu_name, i);
            let server = sshd::start_sshd(
                &self.dir.path().join(format!("sshd/{}", target.host())),
                &side.client_public,
                &[
                    ("TPU_RUNNER_WORKER_ROOT", root.display().to_string()),
                    ("STORAGE_EMULATOR_HOST", side.gcs.clone()),
                ],
            );
            side.ssh.set_address(&target, "127.0.0.1", server.port);
            side.ssh.pin(&target, &server.host_key);
            servers.insert(target.host(), server);
        }
    }

    fn launch(&self, r: &LaunchRequest) -> Outcome {
        self.serve(r);
        self.rt.block_on(self.workers.launch(r))
    }

    fn request(
        &self,
        attempt: &str,
        job: &str,
        tpu: &str,
        workers: u32,
        command: &str,
    ) -> LaunchRequest {
        LaunchRequest {
            attempt_id: Name::new(attempt),
            job_id: Name::new(job),
            resource_id: Name::new(tpu),
            tpu_name: Name::new(tpu),
            zone: Name::new("us-east1-d"),
            tpu_type: TpuType::parse("v6e-16").unwrap(),
            worker_count: workers,
            command: command.into(),
            bucket: self.bucket.clone(),
            checkpoint_dir: format!("{}/jobs/{job}/checkpoints", self.bucket),
            checkpoint_from: None,
            env: BTreeMap::new(),
            bundle: None,
            caches: Vec::new(),
        }
    }

    /// An object of the rig's bucket, as text.
    fn object(&self, name: &str) -> String {
        let data = self
            .objects
            .get(&format!("{}/{name}", self.bucket), 1 << 20)
            .unwrap()
            .unwrap_or_else(|| panic!("{:?}: {name} is missing", self.kind));
        String::from_utf8(data).unwrap()
    }

    fn cancel(&self, r: &LaunchRequest) -> Outcome {
        self.rt.block_on(self.workers.cancel(
            r.attempt_id,
            r.tpu_name,
            r.zone,
            r.worker_count,
            None,
        ))
    }

    fn report(&self, r: &LaunchRequest) -> AttemptReport {
        let f = InFlight {
            attempt: r.attempt_id,
            job: r.job_id,
            bucket: Name::new(&self.bucket),
        };
        let read = self
            .rt
            .block_on(self.workers.reports(&[f]))
            .expect("reports");
        read.reports.get(&r.attempt_id).cloned().unwrap_or_default()
    }

    /// Reads reports until `done` holds (at most a minute).
    fn wait(
        &self,
        r: &LaunchRequest,
        what: &str,
        done: impl Fn(&AttemptReport) -> bool,
    ) -> AttemptReport {
        let until = Instant::now() + Duration::from_secs(60);
        loop {
            let report = self.report(r);
            if done(&report) {
                return report;
            }
            assert!(
                Instant::now() < until,
                "{:?}: {what}: still {report:?}",
                self.kind
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn roots(&self) -> Vec<PathBuf> {
        let mut roots = Vec::new();
        let zone = self.dir.path().join("workers/us-east1-d");
        for tpu in std::fs::read_dir(zone).into_iter().flatten().flatten() {
            for w in std::fs::read_dir(tpu.path())
                .into_iter()
                .flatten()
                .flatten()
            {
                roots.push(w.path());
            }
        }
        roots
    }

    fn root(&self, tpu: &str, worker: u32) -> PathBuf {
        self.dir
            .path()
            .join("workers/us-east1-d")
            .join(tpu)
            .join(format!("w-{worker}"))
    }
}

impl Drop for Rig {
    /// Whatever a failed test left running ends with it.
    fn drop(&mut self) {
        for root in self.roots() {
            tpu_runner::worker::agent::stop_all(&tpu_runner::worker::agent::Root::new(root));
        }
    }
}

fn graces() -> Graces {
    Graces {
        partial_failure_secs: 60,
        partial_success_secs: 600,
    }
}

fn finished(report: &AttemptReport, n: usize) -> bool {
    report.statuses.len() >= n
}

/// Processes (other than this test) whose environment names the attempt.
fn processes_of(attempt: &str) -> Vec<u32> {
    let needle = format!("ATTEMPT_ID={attempt}");
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        if let Ok(env) = std::fs::read(entry.path().join("environ"))
            && env.split(|&b| b == 0).any(|v| v == needle.as_bytes())
        {
            found.push(pid);
        }
    }
    found
}

#[test]
fn a_four_worker_attempt_succeeds_with_the_runner_environment() {
    for kind in kinds() {
        let rig = Rig::new(kind);
        let r = rig.request(
        "a-ok",
        "job-ok",
        "tpu-a",
        4,
        "echo \"$TPU_WORKER_HOST of $TPU_WORKER_COUNT: $JOB_ID $ATTEMPT_ID $CHECKPOINT_GCS_DIR\"",
    );
        assert_eq!(rig.launch(&r), Outcome::Done);
        let report = rig.wait(&r, "four statuses", |rep| finished(rep, 4));
        assert!(report.launched);
        assert!(
            report
                .statuses
                .iter()
                .all(|s| s.state == WorkerState::Succeeded)
        );
        let now = report.statuses[0].finished_at.unwrap();
        assert_eq!(
            aggregate(&report.statuses, 4, now, graces()),
            Verdict::Succeeded
        );
        let log = rig.object("jobs/job-ok/attempts/a-ok/logs/tpu-a-w-2.log");
        assert_eq!(
            log,
            format!(
                "tpu-a-w-2 of 4: job-ok a-ok {}/jobs/job-ok/checkpoints\n",
                rig.bucket
            )
        );
    }
}

#[test]
fn one_failing_worker_fails_the_attempt_after_the_grace() {
    for kind in kinds() {
        let rig = Rig::new(kind);
        let r = rig.request(
            "a-fail",
            "job-fail",
            "tpu-b",
            4,
            "if [ \"$TPU_WORKER_HOST\" = tpu-b-w-2 ]; then exit 3; fi; sleep 600",
        );
        assert_eq!(rig.launch(&r), Outcome::Done);
        let report = rig.wait(&r, "the failing worker's status", |rep| finished(rep, 1));
        let failed = &report.statuses[0];
        assert_eq!(
            (failed.host.as_str(), failed.command_exit_code),
            ("tpu-b-w-2", Some(3))
        );
        assert!(report.heartbeat_at.is_some(), "the others still beat");
        let at = failed.finished_at.unwrap();
        assert!(matches!(
            aggregate(&report.statuses, 4, at, graces()),
            Verdict::Incomplete { .. }
        ));
        assert!(matches!(
            aggregate(&report.statuses, 4, at.plus_secs(61), graces()),
            Verdict::Failed {
                kind: FailureKind::Command,
                exit_code: 3,
                ..
            }
        ));
        assert_eq!(rig.cancel(&r), Outcome::Cancelled(CancelOutcome::Sent));
        rig.wait(&r, "every status after the cancel", |rep| finished(rep, 4));
    }
}

#[test]
fn a_slice_failure_marker_is_a_retryable_infrastructure_failure() {
    for kind in kinds() {
        let rig = Rig::new(kind);
        let r = rig.request(
        "a-slice",
        "job-slice",
        "tpu-c",
        2,
        "if [ \"$TPU_WORKER_HOST\" = tpu-c-w-0 ]; then echo 'terminating: SLICE_FAILURE_CHIP_DRIVER_ERROR' >&2; exit 134; fi; exit 143",
    );
        assert_eq!(rig.launch(&r), Outcome::Done);
        let report = rig.wait(&r, "both statuses", |rep| finished(rep, 2));
        let marked: Vec<_> = report
            .statuses
            .iter()
            .filter_map(|s| s.infrastructure_failure.as_deref())
            .collect();
        assert_eq!(marked, ["slice_failure_chip_driver_error"]);
        let now = report.statuses[0].finished_at.unwrap();
        assert!(matches!(
            aggregate(&report.statuses, 2, now, graces()),
            Verdict::Retryable { recycle: true, .. }
        ));
    }
}

#[test]
fn a_command_waits_for_the_accelerator_devices_and_an_occupant_is_an_infrastructure_failure() {
    for kind in kinds() {
        let mut rig = Rig::new(kind);
        let dev = rig.dir.path().join("dev");
        std::fs::create_dir_all(&dev).unwrap();
        let accel = dev.join("accel0");
        std::fs::write(&accel, "").unwrap();
        rig.workers.device_wait_secs = 2;

        // Still held after the wait: the command never starts, and the attempt is a
        // retryable infrastructure failure (not a recycle: the slice is fine).
        let holder = Holder::new(&accel);
        let r = rig.request("a-busy", "job-busy", "tpu-busy", 2, "touch ran; exit 0");
        assert_eq!(rig.launch(&r), Outcome::Done);
        let report = rig.wait(&r, "both statuses", |rep| finished(rep, 2));
        for s in &report.statuses {
            assert_eq!(
                s.infrastructure_failure.as_deref(),
                Some("accelerator_busy"),
                "{kind:?}"
            );
            assert_eq!(s.command_exit_code, None);
        }
        let now = report.statuses[0].finished_at.unwrap();
        assert!(matches!(
            aggregate(&report.statuses, 2, now, graces()),
            Verdict::Retryable { recycle: false, .. }
        ));
        let log = rig.object("jobs/job-busy/attempts/a-busy/logs/tpu-busy-w-0.log");
        let pid = holder.0.id().to_string();
        assert!(log.contains("still held") && log.contains(&pid), "{log}");
        assert!(!rig.root("tpu-busy", 0).join("work/job-busy/ran").exists());

        // Freed during the wait: the command starts then, and libtpu's stale lock file,
        // left by the occupant, is removed first.
        rig.workers.device_wait_secs = 120;
        let lockfile = dev.join("libtpu_lockfile");
        std::fs::write(&lockfile, "").unwrap();
        let r = rig.request("a-freed", "job-freed", "tpu-busy", 1, "test ! -e \"$LOCK\"");
        let mut r = r;
        r.env.insert("LOCK".into(), lockfile.display().to_string());
        assert_eq!(rig.launch(&r), Outcome::Done);
        std::thread::sleep(Duration::from_secs(1));
        assert!(
            rig.report(&r).statuses.is_empty(),
            "{kind:?}: started while held"
        );
        drop(holder);
        let report = rig.wait(&r, "the status", |rep| finished(rep, 1));
        assert_eq!(report.statuses[0].state, WorkerState::Succeeded, "{kind:?}");
        assert!(!lockfile.exists());
    }
}

#[test]
fn a_cancel_mid_run_stops_everything_of_the_attempt() {
    for kind in kinds() {
        let rig = Rig::new(kind);
        let r = rig.request(
            "a-cancel",
            "job-cancel",
            "tpu-d",
            3,
            "sleep 600 & sleep 600; wait",
        );
        assert_eq!(rig.launch(&r), Outcome::Done);
        rig.wait(&r, "the first heartbeat", |rep| rep.launched);
        // The command runs (its children too) on every worker: each recorded its group.
        let until = Instant::now() + Duration::from_secs(30);
        while (0..3).any(|i| {
            let current =
                std::fs::read_to_string(rig.root("tpu-d", i).join("process/current.json"))
                    .unwrap_or_default();
            !current.contains("\"command_group\":") || current.contains("\"command_group\":null")
        }) {
            assert!(Instant::now() < until, "the commands did not start");
            std::thread::sleep(Duration::from_millis(50));
        }
        assert_eq!(rig.cancel(&r), Outcome::Cancelled(CancelOutcome::Sent));
        let report = rig.wait(&r, "the statuses after the cancel", |rep| finished(rep, 3));
        assert!(
            report
                .statuses
                .iter()
                .all(|s| s.command_exit_code == Some(143)),
            "{report:?}"
        );
        let until = Instant::now() + Duration::from_secs(30);
        while !processes_of("a-cancel").is_empty() {
            assert!(
                Instant::now() < until,
                "left running: {:?}",
                processes_of("a-cancel")
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        // A second cancel finds nothing to stop; one for another attempt is a mismatch only while
        // something runs.
        assert_eq!(
            rig.cancel(&r),
            Outcome::Cancelled(CancelOutcome::NotRunning)
        );
    }
}

#[test]
fn the_same_launch_twice_runs_once() {
    for kind in kinds() {
        let rig = Rig::new(kind);
        let runs = rig.dir.path().join("runs");
        std::fs::create_dir_all(&runs).unwrap();
        let mut r = rig.request(
            "a-twice",
            "job-twice",
            "tpu-e",
            2,
            "echo run >> \"$RUNS/$TPU_WORKER_HOST\"; sleep 2",
        );
        r.env.insert("RUNS".into(), runs.display().to_string());
        assert_eq!(rig.launch(&r), Outcome::Done);
        assert_eq!(
            rig.launch(&r),
            Outcome::Done,
            "already running is an answer"
        );
        rig.wait(&r, "both statuses", |rep| finished(rep, 2));
        assert_eq!(
            rig.launch(&r),
            Outcome::Done,
            "already complete is an answer"
        );
        for host in ["tpu-e-w-0", "tpu-e-w-1"] {
            assert_eq!(std::fs::read_to_string(runs.join(host)).unwrap(), "run\n");
        }
    }
}

/// A tar.gz of `entries` (path, contents; a `->` contents makes a symlink).
fn tarball(entries: &[(&str, &str)]) -> Vec<u8> {
    let mut builder = tar::Builder::new(flate2::write::GzEncoder::new(
        Vec::new(),
        flate2::Compression::default(),
    ));
    for (path, contents) in entries {
        let mut header = tar::Header::new_gnu();
        if let Some(target) = contents.strip_prefix("->") {
            header.set_entry_type(tar::EntryType::Symlink);
            header.set_size(0);
            header.set_mode(0o777);
            // Written raw: the builder refuses some hostile names itself.
            header.set_link_name(target).unwrap();
            let name = header.as_old_mut().name.as_mut();
            name[..path.len()].copy_from_slice(path.as_bytes());
            header.set_cksum();
            builder.append(&header, std::io::empty()).unwrap();
        } else {
            header.set_size(contents.len() as u64);
            header.set_mode(0o644);
            let name = header.as_old_mut().name.as_mut();
            name[..path.len()].copy_from_slice(path.as_bytes());
            header.set_cksum();
            builder.append(&header, contents.as_bytes()).unwrap();
        }
    }
    builder.into_inner().unwrap().finish().unwrap()
}

fn sha256(data: &[u8]) -> String {
    use sha2::Digest;
    hex::encode(sha2::Sha256::digest(data))
}

#[test]
fn bundles_are_verified_and_cannot_write_outside_the_job_directory() {
    for kind in kinds() {
        let rig = Rig::new(kind);
        // A good bundle runs.
        let good = tarball(&[("train.sh", "echo trained > out.txt\n")]);
        let uri = format!("{}/bundles/{}.tar.gz", rig.bucket, sha256(&good));
        rig.objects.put(&uri, &good, true).unwrap();
        let mut r = rig.request(
            "a-good",
            "job-good",
            "tpu-f",
            1,
            "bash train.sh && cat out.txt",
        );
        r.bundle = Some(uri);
        assert_eq!(rig.launch(&r), Outcome::Done);
        let report = rig.wait(&r, "the status", |rep| finished(rep, 1));
        assert_eq!(
            report.statuses[0].state,
            WorkerState::Succeeded,
            "{report:?}"
        );

        // A corrupted bundle is a set-up failure naming the checksum.
        let mut corrupted = good.clone();
        let last = corrupted.len() - 10;
        corrupted[last] ^= 0xff;
        let uri = format!(
            "{}/bundles/{}.tar.gz",
            rig.bucket,
            sha256(&good).replace('a', "b")
        );
        rig.objects.put(&uri, &corrupted, true).unwrap();
        let mut r = rig.request("a-bad", "job-bad", "tpu-f", 1, "echo never");
        r.bundle = Some(uri);
        assert_eq!(rig.launch(&r), Outcome::Done);
        let report = rig.wait(&r, "the set-up failure", |rep| finished(rep, 1));
        assert_eq!(report.statuses[0].state, WorkerState::FailedSetup);
        let status = rig.object("jobs/job-bad/attempts/a-bad/status/tpu-f-w-0.json");
        assert!(status.contains("checksum mismatch"), "{status}");
        // The reason reaches the controller, so the job's record (and `logs`, `watch`)
        // says why the command never ran (issue 34 item 7).
        assert!(
            report.statuses[0]
                .setup_error
                .as_deref()
                .is_some_and(|e| e.contains("checksum mismatch")),
            "{report:?}"
        );

        // Entries that climb out, absolute symlinks and links that lead out are refused, and
        // nothing lands outside the job directory.
        let outside = rig.dir.path().join("outside");
        for (i, hostile) in [
            vec![("../../../../../outside", "escaped")],
            vec![("link", &*format!("->{}", outside.display()))],
            vec![("up", "->../../../.."), ("up/outside", "escaped")],
        ]
        .into_iter()
        .enumerate()
        {
            let data = tarball(&hostile);
            let uri = format!("{}/bundles/{}.tar.gz", rig.bucket, sha256(&data));
            rig.objects.put(&uri, &data, true).unwrap();
            let mut r = rig.request(
                &format!("a-evil-{i}"),
                &format!("job-evil-{i}"),
                "tpu-f",
                1,
                "true",
            );
            r.bundle = Some(uri);
            assert_eq!(rig.launch(&r), Outcome::Done);
            let report = rig.wait(&r, "the refusal", |rep| finished(rep, 1));
            assert_eq!(
                report.statuses[0].state,
                WorkerState::FailedSetup,
                "case {i}"
            );
            let status = rig.object(&format!(
                "jobs/job-evil-{i}/attempts/a-evil-{i}/status/tpu-f-w-0.json"
            ));
            assert!(
                status.contains("outside the job directory"),
                "case {i}: {status}"
            );
            assert!(
                !outside.exists(),
                "case {i} wrote outside the job directory"
            );
            assert!(!rig.root("tpu-f", 0).join("outside").exists());
        }

        chained_links_are_refused(&rig, "tpu-f", |_| {});
    }
}

/// Links that escape by chaining, with the agent running as a second, unprivileged user (as
/// it does on a TPU VM) who owns a folder beside its root: the set-up fails naming the link
/// and that user's folder keeps its files (the check does not rest on being root).
#[test]
fn chained_links_escape_nothing_for_an_unprivileged_agent() {
    const NOBODY: u32 = 65534;
    let Some(rig) = Rig::as_user(NOBODY) else {
        eprintln!("skipped: needs root and setpriv to run the agent as another user");
        return;
    };
    let chown = |path: &std::path::Path| {
        let out = std::process::Command::new("chown")
            .args(["-R", &format!("{NOBODY}:{NOBODY}")])
            .arg(path)
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
    };
    let root = rig.root("tpu-u", 0);
    std::fs::create_dir_all(root.join("home")).unwrap();
    chained_links_are_refused(&rig, "tpu-u", |victim| {
        for path in [root.as_path(), victim, &rig.dir.path().join("objects")] {
            chown(path);
        }
    });
    // The agent really ran as that user: its files are theirs.
    use std::os::unix::fs::MetadataExt;
    assert_eq!(
        std::fs::metadata(root.join("process")).unwrap().uid(),
        NOBODY
    );
}

/// Links that escape by chaining: `d -> .` and `d/d/d/c -> ../../..`, each inside when
/// judged alone; `c` really sits at the top of the job directory and leads three levels up,
/// beside the worker's root, where a cache declared at `c/victim` would have had its folder
/// emptied and replaced by a link. On `tpu`'s first worker: the set-up fails naming the link
/// and the folder keeps its file. `prepare(victim)` runs before the launch.
fn chained_links_are_refused(rig: &Rig, tpu: &str, prepare: impl FnOnce(&std::path::Path)) {
    let victim = rig.root(tpu, 0).parent().unwrap().join("victim");
    std::fs::create_dir_all(&victim).unwrap();
    std::fs::write(victim.join("keep.txt"), "mine").unwrap();
    let data = tarball(&[("d", "->."), ("d/d/d/c", "->../../..")]);
    let uri = format!("{}/bundles/{}.tar.gz", rig.bucket, sha256(&data));
    rig.objects.put(&uri, &data, true).unwrap();
    prepare(&victim);
    let (attempt, job) = (format!("a-chain-{tpu}"), format!("job-chain-{tpu}"));
    let mut r = rig.request(&attempt, &job, tpu, 1, "true");
    r.bundle = Some(uri);
    r.caches = vec![Cache {
        key: "k".into(),
        path: "c/victim".into(),
    }];
    assert_eq!(rig.launch(&r), Outcome::Done);
    let report = rig.wait(&r, "the refusal", |rep| finished(rep, 1));
    assert_eq!(report.statuses[0].state, WorkerState::FailedSetup);
    let status = rig.object(&format!(
        "jobs/{job}/attempts/{attempt}/status/{tpu}-w-0.json"
    ));
    assert!(
        status.contains("leads outside the job directory"),
        "{status}"
    );
    assert_eq!(
        std::fs::read_to_string(victim.join("keep.txt")).unwrap(),
        "mine",
        "a folder outside the worker's root was emptied"
    );
    assert!(!std::fs::symlink_metadata(&victim).unwrap().is_symlink());
}

#[test]
fn caches_are_kept_for_the_same_key_and_evicted_under_the_disk_floor() {
    for kind in kinds() {
        let mut rig = Rig::new(kind);
        let cache = vec![Cache {
            key: "dataset".into(),
            path: "data".into(),
        }];
        let mut first = rig.request(
            "a-warm",
            "job-warm",
            "tpu-g",
            1,
            "test ! -e data/blob && echo warmed > data/blob && touch data/.ready",
        );
        first.caches = cache.clone();
        assert_eq!(rig.launch(&first), Outcome::Done);
        let report = rig.wait(&first, "the warm-up", |rep| finished(rep, 1));
        assert_eq!(report.statuses[0].state, WorkerState::Succeeded);

        let mut second = rig.request(
            "a-reuse",
            "job-reuse",
            "tpu-g",
            1,
            "grep -q warmed data/blob",
        );
        second.caches = cache.clone();
        assert_eq!(rig.launch(&second), Outcome::Done);
        let report = rig.wait(&second, "the reuse", |rep| finished(rep, 1));
        assert_eq!(
            report.statuses[0].state,
            WorkerState::Succeeded,
            "the cache was kept"
        );

        // A floor no disk can meet: every cache is evicted, and the set-up fails saying why.
        rig.workers.min_free_bytes = u64::MAX;
        let mut third = rig.request("a-floor", "job-floor", "tpu-g", 1, "true");
        third.caches = cache;
        assert_eq!(rig.launch(&third), Outcome::Done);
        let report = rig.wait(&third, "the floor", |rep| finished(rep, 1));
        assert_eq!(report.statuses[0].state, WorkerState::FailedSetup);
        assert!(
            !rig.root("tpu-g", 0).join("cache/dataset/blob").exists(),
            "evicted"
        );
        let status = rig.object("jobs/job-floor/attempts/a-floor/status/tpu-g-w-0.json");
        assert!(status.contains("below the floor"), "{status}");
    }
}

#[test]
fn hostile_values_reach_the_command_exactly_and_never_a_shell() {
    for kind in kinds() {
        let rig = Rig::new(kind);
        let out = rig.dir.path().join("seen");
        std::fs::create_dir_all(&out).unwrap();
        let marker = rig.dir.path().join("pwned");
        let weird = format!(
            "it's \"quoted\" $(touch {m}) `touch {m}` ; touch {m} \n second line ✓ ünïcödé \\ $HOME",
            m = marker.display()
        );
        let mut r = rig.request(
        "a-weird",
        "job-weird",
        "tpu-h",
        1,
        "printf '%s' \"$WEIRD\" > \"$OUT/value\"; printf '%s' \"$TPU_RUNNER_COMMAND\" > \"$OUT/command\"",
    );
        r.env.insert("WEIRD".into(), weird.clone());
        r.env.insert("OUT".into(), out.display().to_string());
        assert_eq!(rig.launch(&r), Outcome::Done);
        let report = rig.wait(&r, "the status", |rep| finished(rep, 1));
        assert_eq!(
            report.statuses[0].state,
            WorkerState::Succeeded,
            "{report:?}"
        );
        assert_eq!(std::fs::read_to_string(out.join("value")).unwrap(), weird);
        assert_eq!(
            std::fs::read_to_string(out.join("command")).unwrap(),
            r.command
        );
        assert!(!marker.exists(), "a value was run by a shell");

        // A job id that is not a plain name never reaches a path or a shell: the agent refuses.
        let evil = rig.request("a-evil", "../../etc; rm -rf x", "tpu-h", 1, "true");
        match rig.launch(&evil) {
            Outcome::LaunchFailed(e) => {
                assert_eq!(e.kind, RemoteErrorKind::Hard);
                assert!(
                    e.message.contains("is not a job id of 1 to 128 letters"),
                    "{}",
                    e.message
                );
            }
            other => panic!("refused expected, got {other:?}"),
        }
        // An id `validate-jobs` accepts runs: one rule for ids, from the manifest to the
        // agent (a `.` was refused here once, so every launch of such a job failed).
        tpu_runner::spec::job::check_job_id("sweep.v1.2").unwrap();
        let dotted = rig.request("a-dotted", "sweep.v1.2", "tpu-h", 1, "true");
        assert_eq!(rig.launch(&dotted), Outcome::Done);
        let report = rig.wait(&dotted, "the status", |rep| finished(rep, 1));
        assert_eq!(
            report.statuses[0].state,
            WorkerState::Succeeded,
            "{report:?}"
        );
    }
}

#[test]
fn the_emulators_tpus_end_their_workers_when_they_go() {
    use tpu_runner::emulator::{Clock, World, lock};
    use tpu_runner::simulate::harness::{self, EPOCH};
    // The emulator's TPUs are backed by agents on this machine: the local transport.
    let rig = Rig::new(Kind::Local);
    let s = tpu_runner::simulate::scenario::load(
        &PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("scenarios/smoke.yaml"),
    )
    .unwrap();
    let (sim, _) = harness::world_of(&s, 1, None);
    let mut world = World::new(sim, &s.fleet.project, Clock::Virtual);
    world.workers = Some(rig.dir.path().join("workers"));
    let world = world.shared();
    let labels = Arc::new(BTreeMap::from([(
        "managed-by".to_owned(),
        "smoke".to_owned(),
    )]));
    {
        let mut w = lock(&world);
        w.sim
            .cloud
            .create_queued_resource(
                ustr::Ustr::from("us-east1-d"),
                ustr::Ustr::from("tpu-emu-qr"),
                ustr::Ustr::from("tpu-emu"),
                "v6e-8",
                tpu_runner_sim::PoolModel::Spot,
                None,
                labels,
            )
            .unwrap();
        w.sim.cloud.advance_to(3_600_000);
        w.reap_workers();
    }
    let _ = EPOCH;
    let r = rig.request("a-emu", "job-emu", "tpu-emu", 1, "sleep 600");
    let r = LaunchRequest {
        zone: Name::new("us-east1-d"),
        ..r
    };
    assert_eq!(rig.launch(&r), Outcome::Done);
    let until = Instant::now() + Duration::from_secs(30);
    while processes_of("a-emu").is_empty() {
        assert!(Instant::now() < until, "the command did not start");
        std::thread::sleep(Duration::from_millis(50));
    }
    // A Spot preemption: the workers run through the notice, then end with the TPU.
    {
        let mut w = lock(&world);
        assert!(w.sim.cloud.preempt_now("us-east1-d", "tpu-emu"));
        w.reap_workers();
    }
    assert!(
        !processes_of("a-emu").is_empty(),
        "still running during the notice"
    );
    {
        let mut w = lock(&world);
        let later = w.sim.cloud.now() + 60_000;
        w.sim.cloud.advance_to(later);
        w.reap_workers();
    }
    let until = Instant::now() + Duration::from_secs(30);
    while !processes_of("a-emu").is_empty() {
        assert!(
            Instant::now() < until,
            "left running: {:?}",
            processes_of("a-emu")
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    // Deleted, its disks go; a TPU of the same name starts with empty ones.
    assert!(
        rig.root("tpu-emu", 0).exists(),
        "a preempted TPU still exists"
    );
    {
        let mut w = lock(&world);
        w.sim
            .cloud
            .delete_queued_resource(
                ustr::Ustr::from("us-east1-d"),
                ustr::Ustr::from("tpu-emu-qr"),
            )
            .unwrap();
        let later = w.sim.cloud.now() + 600_000;
        w.sim.cloud.advance_to(later);
        w.reap_workers();
    }
    assert!(
        !rig.root("tpu-emu", 0).exists(),
        "the disks of a deleted TPU are gone"
    );
}

/// The shared-memory folder is emptied at every launch; a link there (another user of a
/// shared TPU could plant one) is refused, and its target keeps its files.
#[test]
fn a_linked_shared_memory_folder_is_refused_not_emptied() {
    let rig = Rig::new(Kind::Local);
    let target = rig.dir.path().join("someone-elses");
    std::fs::create_dir_all(&target).unwrap();
    std::fs::write(target.join("keep"), "x").unwrap();
    let root = rig.root("tpu-shm", 0);
    std::fs::create_dir_all(&root).unwrap();
    std::os::unix::fs::symlink(&target, root.join("shm")).unwrap();
    let r = rig.request("a-shm", "job-shm", "tpu-shm", 1, "true");
    match rig.launch(&r) {
        Outcome::LaunchFailed(e) => {
            assert!(e.message.contains("is not a folder of this user"), "{e:?}")
        }
        other => panic!("a linked shared-memory folder was used: {other:?}"),
    }
    assert!(target.join("keep").exists());
}

/// Timings past a day are refused at launch with their name, never left to overflow the
/// clock in the supervisor (a heartbeat of 2^64−1 s panicked it, and it published nothing).
#[test]
fn absurd_timings_are_refused_at_launch() {
    for kind in kinds() {
        let mut rig = Rig::new(kind);
        rig.workers.heartbeat_secs = u64::MAX;
        let r = rig.request("a-timing", "job-timing", "tpu-t", 1, "true");
        match rig.launch(&r) {
            Outcome::LaunchFailed(e) => {
                assert_eq!(e.kind, RemoteErrorKind::Hard, "{kind:?}");
                assert!(
                    e.message.contains("heartbeat_secs"),
                    "{kind:?}: {}",
                    e.message
                );
            }
            other => panic!("{kind:?}: refused expected, got {other:?}"),
        }
    }
}

/// The agent signals only process groups it started. A forged `process/current.json` naming
/// another process (as one left from before a reboot names a reused pid) stops nothing: the
/// launch goes on and the process lives (the old agent killed it). A command that drops its
/// environment (`env -i`) is still the agent's: a cancel stops it.
#[test]
fn only_the_agents_own_process_groups_are_signalled() {
    use std::os::unix::process::CommandExt;
    let rig = Rig::new(Kind::Local);
    let mut victim = std::process::Command::new("sleep")
        .arg("120")
        .process_group(0)
        .spawn()
        .unwrap();
    let pid = victim.id();
    // A forged token, and none at all (as an agent from before tokens recorded).
    for (i, token) in [r#", "token": "forged""#, ""].into_iter().enumerate() {
        let tpu = format!("tpu-forged-{i}");
        let process = rig.root(&tpu, 0).join("process");
        std::fs::create_dir_all(&process).unwrap();
        std::fs::write(
            process.join("current.json"),
            format!(
                r#"{{"attempt_id": "a-old", "job_id": "job-old", "supervisor": {pid}, "command_group": {pid}{token}}}"#
            ),
        )
        .unwrap();
        let r = rig.request(&format!("a-forged-{i}"), "job-forged", &tpu, 1, "true");
        assert_eq!(rig.launch(&r), Outcome::Done);
        let report = rig.wait(&r, "the status", |rep| finished(rep, 1));
        assert_eq!(report.statuses[0].state, WorkerState::Succeeded);
        assert!(
            victim.try_wait().unwrap().is_none(),
            "a process the agent did not start was killed ({token:?})"
        );
    }
    let _ = victim.kill();
    let _ = victim.wait();

    let r = rig.request(
        "a-bare",
        "job-bare",
        "tpu-bare",
        1,
        "exec env -i /bin/sleep 600",
    );
    assert_eq!(rig.launch(&r), Outcome::Done);
    let until = Instant::now() + Duration::from_secs(30);
    loop {
        let current = std::fs::read_to_string(rig.root("tpu-bare", 0).join("process/current.json"))
            .unwrap_or_default();
        if current.contains("\"command_group\":") && !current.contains("\"command_group\":null") {
            break;
        }
        assert!(Instant::now() < until, "the command did not start");
        std::thread::sleep(Duration::from_millis(50));
    }
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(rig.cancel(&r), Outcome::Cancelled(CancelOutcome::Sent));
    let report = rig.wait(&r, "the status after the cancel", |rep| finished(rep, 1));
    assert_eq!(
        report.statuses[0].command_exit_code,
        Some(143),
        "{report:?}"
    );
}

/// A root another user could have prepared is refused before anything in it is emptied or
/// read: a workspace that is a link to someone's folder, or a root writable by others (the
/// default root is in a world-writable `/tmp`).
#[test]
fn a_root_that_is_not_the_agents_own_is_refused() {
    use std::os::unix::fs::PermissionsExt;
    let rig = Rig::new(Kind::Local);
    let target = rig.dir.path().join("someone-elses");
    std::fs::create_dir_all(&target).unwrap();
    std::fs::write(target.join("keep"), "x").unwrap();
    let linked = rig.root("tpu-linked", 0);
    std::fs::create_dir_all(&linked).unwrap();
    std::os::unix::fs::symlink(&target, linked.join("work")).unwrap();
    let open = rig.root("tpu-open", 0);
    std::fs::create_dir_all(&open).unwrap();
    std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o777)).unwrap();
    for (tpu, said) in [
        ("tpu-linked", "is not a plain folder"),
        ("tpu-open", "writable by other users"),
    ] {
        let r = rig.request(&format!("a-{tpu}"), &format!("job-{tpu}"), tpu, 1, "true");
        match rig.launch(&r) {
            Outcome::LaunchFailed(e) => assert!(e.message.contains(said), "{tpu}: {e:?}"),
            other => panic!("{tpu}: a foreign root was used: {other:?}"),
        }
    }
    assert!(
        target.join("keep").exists(),
        "the link's target was emptied"
    );
}

/// A worker host that is not a plain name (it names the attempt's objects, `status/HOST.json`)
/// is refused at launch, never acknowledged and then failing unseen.
#[test]
fn a_hostile_worker_host_is_refused_at_launch() {
    let rig = Rig::new(Kind::Local);
    let spec = tpu_runner::worker::LaunchSpec::new(
        rig.request("a-host", "job-host", "tpu-host", 1, "true"),
        "p",
    );
    let root = tpu_runner::worker::agent::Root::new(rig.dir.path().join("host-root"));
    let objects = LocalDir::new(rig.dir.path().join("host-objects"));
    for host in ["../../escape", "a/b", "", "-w"] {
        let e = tpu_runner::worker::agent::launch(
            &root,
            host,
            &spec,
            &objects,
            std::path::Path::new("/bin/false"),
            None,
            None,
        )
        .map(|ack| format!("{ack:?}"))
        .unwrap_err();
        assert!(e.contains("worker host"), "{host:?}: {e}");
    }
}
