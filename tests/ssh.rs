//! The worker agent over SSH to real OpenSSH servers on 127.0.0.1: one `sshd` per simulated
//! worker (its own port, host key and root folder, given to the agent through `SetEnv`),
//! the controller's own key, host keys pinned per worker. A 4-worker attempt succeeds and
//! is cancelled over SSH; a changed host key is refused, never trusted.
//!
//! Needs Debian's `openssh-server` (`/usr/sbin/sshd`; `.ci/run` installs it). Without it the
//! tests say so and pass, unless `TPU_RUNNER_REQUIRE_EMULATORS=1` (as in CI) makes that a
//! failure.

#[path = "support/sshd.rs"]
mod sshd;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tpu_runner::backend::workers::{AgentWorkers, Workers};
use tpu_runner::backend::{InFlight, Outcome};
use tpu_runner::engine::aggregate::{Graces, Verdict, aggregate};
use tpu_runner::engine::observe::{
    AttemptReport, CancelOutcome, LaunchRequest, RemoteErrorKind, WorkerState,
};
use tpu_runner::objects::LocalDir;
use tpu_runner::spec::{Name, TpuType};
use tpu_runner::worker::transport::{Ssh, Target};

const BUCKET: &str = "gs://job-bucket";

struct Rig {
    _dir: tempfile::TempDir,
    servers: Vec<Server>,
    ssh: Arc<Ssh>,
    workers: AgentWorkers,
    rt: tokio::runtime::Runtime,
}

const TPU: &str = "tpu-ssh";

use sshd::{Server, keygen, sshd_available, start_sshd};

fn rig(count: u32) -> Rig {
    let dir = tempfile::tempdir().unwrap();
    let (ssh, client_public) = sshd::controller(dir.path(), env!("CARGO_BIN_EXE_tpu-runner"));
    let objects = dir.path().join("objects");
    let mut servers = Vec::new();
    for i in 0..count {
        let root = dir.path().join(format!("roots/w-{i}"));
        let server = start_sshd(
            &dir.path().join(format!("sshd-{i}")),
            &client_public,
            &[
                ("TPU_RUNNER_WORKER_ROOT", root.display().to_string()),
                ("TPU_RUNNER_OBJECTS", objects.display().to_string()),
            ],
        );
        let target = Target {
            zone: "us-east1-d".into(),
            tpu: TPU.into(),
            worker: i,
        };
        ssh.set_address(&target, "127.0.0.1", server.port);
        ssh.pin(&target, &server.host_key);
        servers.push(server);
    }
    let mut workers = AgentWorkers::new(ssh.clone(), Arc::new(LocalDir::new(&objects)), "proj");
    workers.min_free_bytes = 0;
    workers.heartbeat_secs = 1;
    workers.timeout = Duration::from_secs(60);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    Rig {
        _dir: dir,
        servers,
        ssh,
        workers,
        rt,
    }
}

impl Drop for Rig {
    /// Whatever a failed test left running ends with it.
    fn drop(&mut self) {
        for i in 0..self.servers.len() {
            let root = self._dir.path().join(format!("roots/w-{i}"));
            tpu_runner::worker::agent::stop_all(&tpu_runner::worker::agent::Root::new(root));
        }
    }
}

fn request(attempt: &str, workers: u32, command: &str) -> LaunchRequest {
    LaunchRequest {
        attempt_id: Name::new(attempt),
        job_id: Name::new("job-ssh"),
        resource_id: Name::new(TPU),
        tpu_name: Name::new(TPU),
        zone: Name::new("us-east1-d"),
        tpu_type: TpuType::parse("v6e-16").unwrap(),
        worker_count: workers,
        command: command.into(),
        bucket: BUCKET.into(),
        checkpoint_dir: format!("{BUCKET}/jobs/job-ssh/checkpoints"),
        checkpoint_from: None,
        env: BTreeMap::from([("GREETING".to_owned(), "it's \"here\" $(nope)".to_owned())]),
        bundle: None,
        caches: Vec::new(),
    }
}

impl Rig {
    fn report(&self, r: &LaunchRequest) -> AttemptReport {
        let f = InFlight {
            attempt: r.attempt_id,
            job: r.job_id,
            bucket: Name::new(BUCKET),
        };
        let read = self.rt.block_on(self.workers.reports(&[f])).unwrap();
        read.reports.get(&r.attempt_id).cloned().unwrap_or_default()
    }

    fn wait(&self, r: &LaunchRequest, n: usize) -> AttemptReport {
        let until = Instant::now() + Duration::from_secs(60);
        loop {
            let report = self.report(r);
            if report.statuses.len() >= n {
                return report;
            }
            assert!(Instant::now() < until, "still {report:?}");
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

#[test]
fn a_four_worker_attempt_runs_and_is_cancelled_over_ssh() {
    if !sshd_available() {
        return;
    }
    let rig = rig(4);
    let started = Instant::now();
    let r = request(
        "a-ssh-ok",
        4,
        "test \"$GREETING\" = \"it's \\\"here\\\" \\$(nope)\" && echo ok",
    );
    assert_eq!(rig.rt.block_on(rig.workers.launch(&r)), Outcome::Done);
    eprintln!(
        "launch on 4 workers over loopback SSH: {:?}",
        started.elapsed()
    );
    let report = rig.wait(&r, 4);
    assert!(
        report
            .statuses
            .iter()
            .all(|s| s.state == WorkerState::Succeeded),
        "{report:?}"
    );
    let now = report.statuses[0].finished_at.unwrap();
    let graces = Graces {
        partial_failure_secs: 60,
        partial_success_secs: 600,
    };
    assert_eq!(
        aggregate(&report.statuses, 4, now, graces),
        Verdict::Succeeded
    );

    let r = request("a-ssh-cancel", 4, "sleep 600");
    assert_eq!(rig.rt.block_on(rig.workers.launch(&r)), Outcome::Done);
    let until = Instant::now() + Duration::from_secs(30);
    while !rig.report(&r).launched {
        assert!(Instant::now() < until);
        std::thread::sleep(Duration::from_millis(50));
    }
    // Mid-run: every worker's command has started and its group is recorded (a cancel before
    // that is a set-up failure, not an exit).
    while (0..4).any(|i| {
        let current = std::fs::read_to_string(
            rig._dir
                .path()
                .join(format!("roots/w-{i}/process/current.json")),
        )
        .unwrap_or_default();
        !current.contains("\"command_group\":") || current.contains("\"command_group\":null")
    }) {
        assert!(Instant::now() < until, "the commands did not start");
        std::thread::sleep(Duration::from_millis(50));
    }
    let cancelled = rig.rt.block_on(
        rig.workers
            .cancel(r.attempt_id, r.tpu_name, r.zone, 4, None),
    );
    assert_eq!(cancelled, Outcome::Cancelled(CancelOutcome::Sent));
    let report = rig.wait(&r, 4);
    assert!(
        report
            .statuses
            .iter()
            .all(|s| s.command_exit_code == Some(143)),
        "{report:?}"
    );
}

#[test]
fn a_changed_host_key_is_refused() {
    if !sshd_available() {
        return;
    }
    let rig = rig(2);
    // Worker 1's pinned key is not the one its server presents (a new VM under the same name,
    // or someone in the middle).
    let other = tempfile::tempdir().unwrap();
    let wrong = keygen(&other.path().join("other"));
    rig.ssh.pin(
        &Target {
            zone: "us-east1-d".into(),
            tpu: TPU.into(),
            worker: 1,
        },
        &wrong,
    );
    let r = request("a-ssh-key", 2, "true");
    match rig.rt.block_on(rig.workers.launch(&r)) {
        Outcome::LaunchFailed(e) => {
            assert_eq!(e.kind, RemoteErrorKind::Hard, "{}", e.message);
            assert!(
                e.message.contains("Host key verification failed"),
                "{}",
                e.message
            );
        }
        other => panic!("refused expected, got {other:?}"),
    }
    let _ = &rig.servers;
}

#[test]
fn keys_never_reach_messages_logs_or_objects() {
    if !sshd_available() {
        return;
    }
    let rig = rig(2);
    let private = std::fs::read_to_string(rig._dir.path().join("controller_ed25519")).unwrap();
    // The key's body, without its armour lines.
    let body: String = private
        .lines()
        .filter(|l| !l.starts_with("-----"))
        .collect();
    assert!(body.len() > 40);
    let r = request("a-ssh-secret", 2, "echo done");
    assert_eq!(rig.rt.block_on(rig.workers.launch(&r)), Outcome::Done);
    rig.wait(&r, 2);
    // A refused call's message neither.
    rig.ssh.pin(
        &Target {
            zone: "us-east1-d".into(),
            tpu: TPU.into(),
            worker: 0,
        },
        "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl",
    );
    let refused = format!(
        "{:?}",
        rig.rt
            .block_on(rig.workers.launch(&request("a-ssh-secret-2", 2, "true")))
    );
    let mut seen = vec![refused, format!("{:?}", rig.ssh)];
    // Everything the agents and servers wrote: worker roots, objects, sshd logs.
    let mut stack = vec![
        rig._dir.path().join("roots"),
        rig._dir.path().join("objects"),
    ];
    for i in 0..2 {
        seen.push(
            std::fs::read_to_string(rig._dir.path().join(format!("sshd-{i}/sshd.log")))
                .unwrap_or_default(),
        );
    }
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
            let path = entry.path();
            if path.is_dir() {
                stack.push(path);
            } else if let Ok(text) = std::fs::read_to_string(&path) {
                seen.push(format!("{}: {text}", path.display()));
            }
        }
    }
    assert!(seen.len() > 10, "the agents wrote their files");
    // The key's own bytes: past the header every OpenSSH key shares.
    let body = &body[64..];
    for text in &seen {
        for chunk in body
            .as_bytes()
            .chunks(24)
            .map(|c| String::from_utf8_lossy(c).into_owned())
        {
            assert!(
                !text.contains(&chunk),
                "a piece of the private key leaked: {chunk}"
            );
        }
    }
}

/// The TPU API emulator with one READY single-host TPU (`tpu-ssh` in us-east1-d) whose
/// worker is a real sshd registered through the control route, as production finds workers.
struct ApiRig {
    dir: tempfile::TempDir,
    objects: std::path::PathBuf,
    root: std::path::PathBuf,
    project: String,
    running: tpu_runner::emulator::Running,
    ssh: Arc<Ssh>,
    client_public: String,
    rt: tokio::runtime::Runtime,
}

impl ApiRig {
    fn new(agent: &str) -> ApiRig {
        ApiRig::with_hosts(agent, 1)
    }

    /// The rig with a TPU of `hosts` workers (a `v6e-8` pool of that many hosts).
    fn with_hosts(agent: &str, hosts: u32) -> ApiRig {
        use tpu_runner::emulator::{self, Clock, World, lock};
        let dir = tempfile::tempdir().unwrap();
        let s = tpu_runner::simulate::scenario::load(
            &std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("scenarios/smoke.yaml"),
        )
        .unwrap();
        let (mut sim, _) = tpu_runner::simulate::harness::world_of(&s, 1, None);
        if hosts > 1 {
            let mut config = tpu_runner::simulate::harness::cloud_config(&s, 1, None);
            for pool in &mut config.pools {
                pool.hosts = hosts;
            }
            sim = tpu_runner::backend::sim::SimBackend::new(
                tpu_runner_sim::SimCloud::new(config),
                tpu_runner::simulate::harness::EPOCH,
                "smoke",
                true,
            );
        }
        let world = World::new(sim, &s.fleet.project, Clock::Virtual).shared();
        {
            let mut w = lock(&world);
            let labels = Arc::new(BTreeMap::from([(
                "managed-by".to_owned(),
                "smoke".to_owned(),
            )]));
            w.sim
                .cloud
                .create_queued_resource(
                    ustr::Ustr::from("us-east1-d"),
                    ustr::Ustr::from("tpu-ssh-qr"),
                    ustr::Ustr::from(TPU),
                    "v6e-8",
                    tpu_runner_sim::PoolModel::Spot,
                    None,
                    labels,
                )
                .unwrap();
            w.sim.cloud.advance_to(3_600_000);
        }
        let running = emulator::start(world, "127.0.0.1:0").unwrap();
        let (ssh, client_public) = sshd::controller(dir.path(), agent);
        ApiRig {
            objects: dir.path().join("objects"),
            root: dir.path().join("roots/w-0"),
            project: s.fleet.project.clone(),
            running,
            ssh,
            client_public,
            rt: tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap(),
            dir,
        }
    }

    /// A worker's sshd, with the agent's root and objects handed over through `SetEnv`.
    fn sshd(&self, name: &str) -> sshd::Server {
        let env = [
            ("TPU_RUNNER_WORKER_ROOT", self.root.display().to_string()),
            ("TPU_RUNNER_OBJECTS", self.objects.display().to_string()),
        ];
        start_sshd(&self.dir.path().join(name), &self.client_public, &env)
    }

    /// Tells the emulator worker 0 of the TPU is at `port` with `host_key`.
    fn register(&self, port: u16, host_key: &str) {
        self.register_worker(0, port, host_key);
    }

    /// Tells the emulator worker `worker` of the TPU is at `port` with `host_key`.
    fn register_worker(&self, worker: u32, port: u16, host_key: &str) {
        let out = std::process::Command::new("curl")
            .args([
                "-sf",
                "-X",
                "POST",
                "-H",
                "content-type: application/json",
                "-d",
            ])
            .arg(
                serde_json::json!({"ipAddress": "127.0.0.1", "port": port, "hostKey": host_key})
                    .to_string(),
            )
            .arg(format!(
                "{}/emulator/v1/projects/{}/locations/us-east1-d/nodes/{TPU}/workers/{worker}",
                self.running.url(),
                self.project
            ))
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
    }

    /// `TpuSsh` over `ssh`, finding workers through the emulator.
    fn tpu_ssh(&self, ssh: Arc<Ssh>) -> tpu_runner::backend::ssh::TpuSsh {
        use tpu_runner::gcp::http::{Endpoint, RetryPolicy};
        use tpu_runner::gcp::tpu::{Client, Quotas};
        let client = Client::new(
            Endpoint::emulator(&self.running.url()),
            &self.project,
            Quotas::default(),
            RetryPolicy::default(),
        )
        .unwrap();
        tpu_runner::backend::ssh::TpuSsh::new(ssh, client, false, true)
    }

    fn workers(&self, transport: tpu_runner::backend::ssh::TpuSsh) -> AgentWorkers {
        let mut w = AgentWorkers::new(
            Arc::new(transport),
            Arc::new(LocalDir::new(&self.objects)),
            "proj",
        );
        w.min_free_bytes = 0;
        w.heartbeat_secs = 1;
        w
    }

    fn launch(&self, workers: &AgentWorkers, attempt: &str) -> (Outcome, LaunchRequest) {
        let mut r = request(attempt, 1, "echo found through the API");
        r.tpu_type = TpuType::parse("v6e-8").unwrap();
        let outcome = self.rt.block_on(workers.launch(&r));
        (outcome, r)
    }

    /// Waits for the attempt's status: it must have succeeded.
    fn succeeded(&self, workers: &AgentWorkers, r: &LaunchRequest) {
        self.succeeded_on(workers, r, 1);
    }

    /// Waits for the statuses of `n` workers: each must have succeeded.
    fn succeeded_on(&self, workers: &AgentWorkers, r: &LaunchRequest, n: usize) {
        let until = Instant::now() + Duration::from_secs(30);
        loop {
            let f = InFlight {
                attempt: r.attempt_id,
                job: r.job_id,
                bucket: Name::new(BUCKET),
            };
            let read = self.rt.block_on(workers.reports(&[f])).unwrap();
            let report = read.reports.get(&r.attempt_id).cloned().unwrap_or_default();
            if report.statuses.len() >= n {
                assert!(
                    report
                        .statuses
                        .iter()
                        .all(|s| s.command_exit_code == Some(0)),
                    "{report:?}"
                );
                return;
            }
            assert!(Instant::now() < until, "not every worker ran: {report:?}");
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Drop for ApiRig {
    fn drop(&mut self) {
        tpu_runner::worker::agent::stop_all(&tpu_runner::worker::agent::Root::new(&self.root));
    }
}

/// Production's way to a worker: the TPU API says where each worker is (`networkEndpoints`)
/// and which host key it has (`hostkeys` guest attributes); the key is pinned before the
/// first connection. Here the emulator serves both for a real sshd; an sshd that does not
/// hold the published key is refused, and once the API publishes a new key (a node
/// re-created under the same name) it is used.
#[test]
fn host_keys_come_from_the_tpu_api_never_from_the_worker() {
    if !sshd_available() {
        return;
    }
    let rig = ApiRig::new(env!("CARGO_BIN_EXE_tpu-runner"));
    let server = rig.sshd("sshd-a");
    rig.register(server.port, &server.host_key);
    let workers = rig.workers(rig.tpu_ssh(rig.ssh.clone()));
    let (outcome, r) = rig.launch(&workers, "a-api-1");
    assert_eq!(outcome, Outcome::Done);
    rig.succeeded(&workers, &r);

    // Another sshd (its own host key) takes the worker's address, but the API still
    // publishes the first key: refused, never trusted.
    let impostor = rig.sshd("sshd-b");
    rig.register(impostor.port, &server.host_key);
    let workers = rig.workers(rig.tpu_ssh(rig.ssh.clone()));
    match rig.launch(&workers, "a-api-2").0 {
        Outcome::LaunchFailed(e) => {
            assert!(e.message.to_ascii_lowercase().contains("host key"), "{e:?}")
        }
        other => panic!("an unpublished host key was accepted: {other:?}"),
    }
    // The API publishes the new key (the node was re-created): it is pinned and used.
    rig.register(impostor.port, &impostor.host_key);
    let workers = rig.workers(rig.tpu_ssh(rig.ssh.clone()));
    assert_eq!(rig.launch(&workers, "a-api-3").0, Outcome::Done);
}

/// A multi-host TPU: each worker's address and host key come from the TPU API, told apart
/// by their place in the guest attributes' reply (Google's `GuestAttributes` names no
/// worker). Every worker is reached with its own pinned key and runs its part.
#[test]
fn every_worker_of_a_multi_host_tpu_is_reached_with_its_own_published_key() {
    if !sshd_available() {
        return;
    }
    let rig = ApiRig::with_hosts(env!("CARGO_BIN_EXE_tpu-runner"), 2);
    let mut servers = Vec::new();
    for i in 0..2u32 {
        let root = rig.dir.path().join(format!("roots/w-{i}"));
        let server = start_sshd(
            &rig.dir.path().join(format!("sshd-{i}")),
            &rig.client_public,
            &[
                ("TPU_RUNNER_WORKER_ROOT", root.display().to_string()),
                ("TPU_RUNNER_OBJECTS", rig.objects.display().to_string()),
            ],
        );
        rig.register_worker(i, server.port, &server.host_key);
        servers.push(server);
    }
    let workers = rig.workers(rig.tpu_ssh(rig.ssh.clone()));
    let mut r = request("a-api-slice", 2, "echo worker $TPU_WORKER_ID");
    r.tpu_type = TpuType::parse("v6e-8").unwrap();
    assert_eq!(rig.rt.block_on(workers.launch(&r)), Outcome::Done);
    rig.succeeded_on(&workers, &r, 2);
    for i in 0..2 {
        let root = rig.dir.path().join(format!("roots/w-{i}"));
        tpu_runner::worker::agent::stop_all(&tpu_runner::worker::agent::Root::new(&root));
    }
    drop(servers);
}

fn sha256_hex(data: &[u8]) -> String {
    use sha2::Digest;
    hex::encode(sha2::Sha256::digest(data))
}

/// An adopted TPU never ran the startup script: no agent there (the transport's agent
/// path does not exist on it). The controller sends its own binary over the connection,
/// checked on the worker against its SHA-256, once per incarnation, and launches with it;
/// a binary that does not match the digest it is sent under is refused on the worker and
/// replaces nothing.
#[test]
fn the_agent_is_sent_to_an_adopted_tpu_checked_by_its_digest() {
    use tpu_runner::backend::ssh::AdoptedAgent;
    if !sshd_available() {
        return;
    }
    let rig = ApiRig::new("/nonexistent/tpu-runner");
    let server = rig.sshd("sshd-a");
    rig.register(server.port, &server.host_key);
    let binary = std::path::PathBuf::from(env!("CARGO_BIN_EXE_tpu-runner"));
    let sha = sha256_hex(&std::fs::read(&binary).unwrap());
    let dir = rig.dir.path().join("adopted-home/.tpu-runner/bin");
    let adopted = AdoptedAgent {
        tpus: [("us-east1-d".to_owned(), TPU.to_owned())].into(),
        binary: binary.clone(),
        sha256: sha.clone(),
        dir: dir.display().to_string(),
        extra_args: Vec::new(),
    };
    let workers = rig.workers(rig.tpu_ssh(rig.ssh.clone()).with_adopted(adopted.clone()));
    let (outcome, r) = rig.launch(&workers, "a-adopted-1");
    assert_eq!(outcome, Outcome::Done);
    rig.succeeded(&workers, &r);
    let installed = dir.join(format!("tpu-runner-{sha}"));
    assert_eq!(sha256_hex(&std::fs::read(&installed).unwrap()), sha);
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(
        std::fs::metadata(&installed).unwrap().permissions().mode() & 0o777,
        0o755
    );

    // Sent once: a second launch finds it in place (its file is not rewritten).
    let modified = std::fs::metadata(&installed).unwrap().modified().unwrap();
    let fresh = rig.workers(rig.tpu_ssh(rig.ssh.clone()).with_adopted(adopted.clone()));
    let (outcome, r) = rig.launch(&fresh, "a-adopted-2");
    assert_eq!(outcome, Outcome::Done);
    rig.succeeded(&fresh, &r);
    assert_eq!(
        std::fs::metadata(&installed).unwrap().modified().unwrap(),
        modified
    );

    // A program that is not what its digest says: refused on the worker, nothing left.
    let wrong = AdoptedAgent {
        sha256: "0".repeat(64),
        ..adopted
    };
    let workers = rig.workers(rig.tpu_ssh(rig.ssh.clone()).with_adopted(wrong));
    match rig.launch(&workers, "a-adopted-3").0 {
        Outcome::LaunchFailed(e) => {
            assert!(e.message.contains("does not match its SHA-256"), "{e:?}")
        }
        other => panic!("a mismatching agent was installed: {other:?}"),
    }
    let left: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .flatten()
        .map(|e| e.file_name())
        .collect();
    assert_eq!(
        left,
        [std::ffi::OsString::from(format!("tpu-runner-{sha}"))]
    );
}

/// `ssh_transport: iap`: every connection goes through `gcloud compute start-iap-tunnel` to
/// the worker's instance (its `hostname` guest attribute), with the host key still pinned
/// from the API. Here `gcloud` is a stand-in that checks its arguments and relays to the
/// sshd, as IAP would; the launch must have gone through it.
#[test]
fn iap_tunnels_every_connection_through_gcloud_to_the_workers_instance() {
    use tpu_runner::backend::ssh::Iap;
    if !sshd_available() {
        return;
    }
    let rig = ApiRig::new(env!("CARGO_BIN_EXE_tpu-runner"));
    let server = rig.sshd("sshd-a");
    rig.register(server.port, &server.host_key);
    let gcloud = rig.dir.path().join("gcloud");
    let calls = rig.dir.path().join("gcloud-calls");
    std::fs::write(
        &gcloud,
        format!(
            r#"#!/usr/bin/env python3
import socket, sys, threading
args = sys.argv[1:]
open({calls:?}, "a").write(" ".join(args) + "\n")
expected = ["compute", "start-iap-tunnel", "t1v-n-{TPU}-w-0", args[3], "--listen-on-stdin",
            "--zone=us-east1-d", "--project={project}", "--verbosity=warning"]
if args != expected:
    sys.stderr.write("unexpected gcloud arguments: %r\n" % args)
    sys.exit(2)
s = socket.create_connection(("127.0.0.1", int(args[3])))
def up():
    while True:
        data = sys.stdin.buffer.read1(65536)
        if not data:
            s.shutdown(socket.SHUT_WR)
            return
        s.sendall(data)
threading.Thread(target=up, daemon=True).start()
while True:
    data = s.recv(65536)
    if not data:
        break
    sys.stdout.buffer.write(data)
    sys.stdout.buffer.flush()
"#,
            project = rig.project,
        ),
    )
    .unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&gcloud, std::fs::Permissions::from_mode(0o755)).unwrap();
    let transport = rig.tpu_ssh(rig.ssh.clone()).with_iap(Iap {
        gcloud: gcloud.display().to_string(),
        project: rig.project.clone(),
    });
    let workers = rig.workers(transport);
    let (outcome, r) = rig.launch(&workers, "a-iap-1");
    assert_eq!(outcome, Outcome::Done);
    rig.succeeded(&workers, &r);
    let log = std::fs::read_to_string(&calls).unwrap();
    assert!(
        log.starts_with(&format!(
            "compute start-iap-tunnel t1v-n-{TPU}-w-0 {} ",
            server.port
        )),
        "{log}"
    );
}
