//! The whole life of jobs on one machine, every part real and on loopback: the TPU API
//! emulator as its own process (its TPUs backed by worker agents on this machine), a local
//! object store, the SQLite store, controllers as processes — SIGKILLed mid-run and
//! restarted — and the commands a user types. 20 jobs across two regions: one is preempted
//! mid-run and resumes from its checkpoint in the same region, one pending and one running
//! job are cancelled, one fails; every job must end in its right state, no attempt may run
//! twice, and when the queue drains nothing may be left running or billed.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

const BIN: &str = env!("CARGO_BIN_EXE_tpu-runner");

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/lifecycle")
        .join(name)
}

struct Rig {
    dir: tempfile::TempDir,
    emulator: Child,
    url: String,
    controllers: Vec<Child>,
    /// The state store's URL.
    store: String,
    /// The fleet file.
    fleet: PathBuf,
}

/// The stores to run the lifecycle on: SQLite, and Firestore through Google's emulator when
/// it runs (`.ci/run` starts it; with `TPU_RUNNER_REQUIRE_EMULATORS=1` it must).
fn firestore() -> Option<String> {
    match std::env::var("FIRESTORE_EMULATOR_HOST") {
        Ok(host) if !host.is_empty() => {
            let nanos = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos();
            Some(format!(
                "firestore:lifecycle-{}-{nanos}",
                std::process::id()
            ))
        }
        _ => {
            assert!(
                std::env::var("TPU_RUNNER_REQUIRE_EMULATORS").as_deref() != Ok("1"),
                "FIRESTORE_EMULATOR_HOST is not set but TPU_RUNNER_REQUIRE_EMULATORS=1"
            );
            eprintln!(
                "the Firestore emulator is not running: the lifecycle on Firestore is skipped (start it as .ci/run does)"
            );
            None
        }
    }
}

impl Rig {
    fn new(store: Option<String>) -> Rig {
        let dir = tempfile::tempdir().unwrap();
        let objects = tpu_runner::objects::LocalDir::new(dir.path().join("objects"));
        objects
            .create_bucket("gs://e2e-us-east1", "US-EAST1")
            .unwrap();
        objects
            .create_bucket("gs://e2e-us-central1", "US-CENTRAL1")
            .unwrap();
        std::fs::create_dir_all(dir.path().join("marks")).unwrap();
        let mut emulator = Command::new(BIN)
            .args([
                "emulator",
                "--listen",
                "127.0.0.1:0",
                "--speed",
                "10",
                "--workers",
            ])
            .arg(dir.path().join("workers"))
            .arg(fixture("cloud.yaml"))
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        let mut first = String::new();
        BufReader::new(emulator.stdout.take().unwrap())
            .read_line(&mut first)
            .unwrap();
        let url = first
            .split_whitespace()
            .find(|w| w.starts_with("http://"))
            .unwrap_or_else(|| panic!("the emulator said: {first}"))
            .trim_end_matches(':')
            .to_owned();
        let store =
            store.unwrap_or_else(|| format!("sqlite:{}", dir.path().join("state.db").display()));
        Rig {
            dir,
            emulator,
            url,
            controllers: Vec::new(),
            store,
            fleet: fixture("deployment.yaml"),
        }
    }

    /// A command with the rig's configuration in the environment, as a user exports it.
    fn command(&self, args: &[&str]) -> Command {
        let mut c = Command::new(BIN);
        c.args(args)
            .current_dir(self.dir.path())
            .env("TPU_RUNNER_DEPLOYMENT", &self.fleet)
            .env("TPU_RUNNER_STORE", &self.store)
            .env("TPU_RUNNER_TPU_ENDPOINT", &self.url)
            .env("TPU_RUNNER_OBJECTS", self.dir.path().join("objects"));
        c
    }

    fn run(&self, args: &[&str]) -> (i32, String) {
        let out = self.command(args).output().unwrap();
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        (out.status.code().unwrap_or(-1), text)
    }

    fn start_controller(&mut self) {
        let n = self.controllers.len();
        let events =
            std::fs::File::create(self.dir.path().join(format!("events-{n}.jsonl"))).unwrap();
        let child = self
            .command(&[
                "controller",
                "--local-workers",
                &self.dir.path().join("workers").display().to_string(),
                "--interval",
                "0.3",
                "--lease-ttl",
                "5",
                "--exit-when-idle",
                "--wait-for-lease",
            ])
            .stdout(events)
            .spawn()
            .unwrap();
        self.controllers.push(child);
    }

    /// SIGKILLs the running controller and starts another at once (it waits for the dead
    /// one's lease to lapse).
    fn kill_and_restart_controller(&mut self) {
        let last = self.controllers.last_mut().unwrap();
        last.kill().unwrap();
        last.wait().unwrap();
        self.start_controller();
    }

    fn jobs(&self) -> BTreeMap<String, Value> {
        let (code, text) = self.run(&["status", "--json"]);
        assert_eq!(code, 0, "{text}");
        let v: Value = serde_json::from_str(&text).unwrap();
        v["jobs"]["items"]
            .as_array()
            .unwrap()
            .iter()
            .map(|j| (j["id"].as_str().unwrap().to_owned(), j.clone()))
            .collect()
    }

    fn job(&self, id: &str) -> Value {
        let out = self.command(&["state", "export"]).output().unwrap();
        let v: Value = serde_json::from_slice(&out.stdout).unwrap();
        for table in ["jobs", "finished"] {
            if let Some(j) = v[table]
                .as_array()
                .and_then(|a| a.iter().find(|j| j["id"] == id))
            {
                return j.clone();
            }
            if let Some(j) = v[table].as_object().and_then(|m| m.get(id)) {
                return j.clone();
            }
        }
        panic!("no job {id} in the store");
    }

    fn wait_for(&self, what: &str, secs: u64, mut done: impl FnMut() -> bool) {
        let until = Instant::now() + Duration::from_secs(secs);
        while !done() {
            assert!(Instant::now() < until, "timed out waiting for {what}");
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    fn curl(&self, method: &str, path: &str) -> Value {
        let out = Command::new("curl")
            .args(["-sf", "-X", method, "-H", "content-type: application/json"])
            .args(if method == "POST" {
                vec!["-d", "{}"]
            } else {
                vec![]
            })
            .arg(format!("{}{path}", self.url))
            .output()
            .unwrap();
        assert!(out.status.success(), "{method} {path}: {out:?}");
        serde_json::from_slice(&out.stdout).unwrap_or(Value::Null)
    }
}

impl Drop for Rig {
    fn drop(&mut self) {
        for c in &mut self.controllers {
            let _ = c.kill();
            let _ = c.wait();
        }
        let _ = self.emulator.kill();
        let _ = self.emulator.wait();
        tpu_runner::worker::transport::Local::stop_all(&self.dir.path().join("workers"));
    }
}

/// Processes whose environment names one of `jobs`' attempts (`JOB_ID=…`).
fn processes_of_jobs(dir: &Path) -> Vec<String> {
    let needle = format!("MARKS={}", dir.join("marks").display());
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        if entry.file_name().to_string_lossy().parse::<u32>().is_err() {
            continue;
        }
        if let Ok(mut f) = std::fs::File::open(entry.path().join("environ")) {
            let mut env = Vec::new();
            let _ = f.read_to_end(&mut env);
            if env.split(|&b| b == 0).any(|v| v == needle.as_bytes()) {
                let cmd = std::fs::read(entry.path().join("cmdline")).unwrap_or_default();
                found.push(String::from_utf8_lossy(&cmd).replace('\0', " "));
            }
        }
    }
    found
}

fn manifest(marks: &Path) -> String {
    let mark = "echo \"$ATTEMPT_ID\" >> \"$MARKS/$JOB_ID\"";
    let mut jobs = String::from("jobs:\n");
    let mut job = |id: &str, buckets: &str, command: &str, priority: &str| {
        jobs.push_str(&format!(
            "  - id: {id}\n    tpu: v6e-8\n    bundle: bundle\n    priority: {priority}\n    buckets: [{buckets}]\n    env: {{MARKS: \"{}\"}}\n    command: '{mark}; {command}'\n",
            marks.display()
        ));
    };
    let east = "gs://e2e-us-east1";
    let central = "gs://e2e-us-central1";
    let both = "gs://e2e-us-east1, gs://e2e-us-central1";
    for i in 1..=16 {
        let buckets = match i {
            1..=6 => east,
            7..=12 => central,
            _ => both,
        };
        job(&format!("j{i:02}"), buckets, "sleep 1; echo done", "normal");
    }
    job("resume", both, "bash count.sh", "high");
    job("pending-cancel", both, "echo never", "low");
    job("running-cancel", both, "sleep 600", "high");
    job("fails", east, "echo failing; exit 3", "normal");
    jobs
}

const COUNT: &str = r#"set -euo pipefail
dir="$TPU_RUNNER_OBJECTS/${CHECKPOINT_GCS_DIR#gs://}"
mkdir -p "$dir"
step=$(cat "$dir/step" 2>/dev/null || echo 0)
echo "starting at step $step in $TPU_ZONE"
while [ "$step" -lt 30 ]; do
  sleep 0.5
  step=$((step + 1))
  echo "$step" > "$dir/step.tmp" && mv "$dir/step.tmp" "$dir/step"
  echo "step $step"
done
"#;

#[test]
fn twenty_jobs_survive_a_preemption_cancels_and_two_controller_kills_on_sqlite() {
    lifecycle(None);
}

#[test]
fn twenty_jobs_survive_a_preemption_cancels_and_two_controller_kills_on_firestore() {
    if let Some(store) = firestore() {
        lifecycle(Some(store));
    }
}

fn lifecycle(store: Option<String>) {
    let mut rig = Rig::new(store);
    let dir = rig.dir.path().to_path_buf();
    std::fs::create_dir_all(dir.join("bundle")).unwrap();
    std::fs::write(dir.join("bundle/count.sh"), COUNT).unwrap();
    std::fs::write(dir.join("job.yaml"), manifest(&dir.join("marks"))).unwrap();

    let (code, out) = rig.run(&["submit", "job.yaml", "--json"]);
    assert_eq!(code, 0, "{out}");
    assert_eq!(out.lines().count(), 20, "{out}");
    // A second submission of the same ids creates nothing, and uploads nothing: the
    // existing job's folder holds its own spec only.
    let specs = |job: &str| {
        std::fs::read_dir(dir.join(format!("objects/e2e-us-east1/jobs/{job}")))
            .map(|d| d.count())
            .unwrap_or(0)
    };
    let before = specs("j01");
    let (code, _) = rig.run(&["submit", "job.yaml", "--name", "j01"]);
    assert_eq!(code, 2);
    assert_eq!(
        specs("j01"),
        before,
        "nothing of a refused submit is uploaded"
    );
    // Cancelled before any controller saw it: deactivated at once.
    let (code, out) = rig.run(&["cancel", "pending-cancel", "--json"]);
    assert_eq!(
        (code, out.trim()),
        (0, r#"{"job_id":"pending-cancel","status":"deactivated"}"#)
    );
    let (code, _) = rig.run(&["cancel", "no-such-job"]);
    assert_eq!(code, 1);

    // `plan` on the live store: what the first pass would do, without any cloud call.
    let (code, out) = rig.run(&["plan", "--json"]);
    assert_eq!(code, 0, "{out}");
    let plan: Value = serde_json::from_str(&out).unwrap();
    assert!(!plan["actions"].as_array().unwrap().is_empty(), "{plan}");

    rig.start_controller();
    // The checkpointing job runs and saves a few steps; then its TPU is preempted.
    let mut resumed_from = None;
    rig.wait_for("the resume job to run a few steps", 120, || {
        let j = rig.job("resume");
        let step =
            std::fs::read_to_string(dir.join("objects/e2e-us-east1/jobs/resume/checkpoints/step"))
                .or_else(|_| {
                    std::fs::read_to_string(
                        dir.join("objects/e2e-us-central1/jobs/resume/checkpoints/step"),
                    )
                })
                .unwrap_or_default();
        let running = j["status"] == "running";
        if running && step.trim().parse::<u32>().unwrap_or(0) >= 4 {
            resumed_from = Some(j.clone());
            true
        } else {
            false
        }
    });
    let first = resumed_from.unwrap();
    let attempt = first["attempts"]
        .as_array()
        .unwrap()
        .last()
        .unwrap()
        .clone();
    let (zone, node) = (
        attempt["zone"].as_str().unwrap().to_owned(),
        attempt["tpu_name"].as_str().unwrap().to_owned(),
    );
    let region = first["placement"]["region"].as_str().unwrap().to_owned();
    rig.curl(
        "POST",
        &format!("/emulator/v1/projects/e2e-project/locations/{zone}/nodes/{node}/preempt"),
    );
    // The first controller dies mid-run.
    std::thread::sleep(Duration::from_millis(1300));
    rig.kill_and_restart_controller();

    // The long job runs; cancel it.
    rig.wait_for("running-cancel to run", 120, || {
        rig.job("running-cancel")["status"] == "running"
            && std::fs::read_to_string(dir.join("marks/running-cancel")).is_ok()
    });
    let (code, out) = rig.run(&["cancel", "running-cancel"]);
    assert_eq!(code, 0, "{out}");
    // The second controller dies too.
    std::thread::sleep(Duration::from_millis(700));
    rig.kill_and_restart_controller();

    // The third drains the queue and stops when nothing is left.
    let last = rig.controllers.last_mut().unwrap();
    let until = Instant::now() + Duration::from_secs(240);
    let status = loop {
        if let Some(s) = last.try_wait().unwrap() {
            break s;
        }
        assert!(
            Instant::now() < until,
            "the controller did not drain the queue"
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    assert!(status.success());
    let events =
        std::fs::read_to_string(dir.join(format!("events-{}.jsonl", rig.controllers.len() - 1)))
            .unwrap();
    assert!(
        events.trim_end().ends_with(r#""status":"idle"}"#),
        "{events}"
    );

    // Every job in its right terminal state.
    assert!(
        rig.jobs().is_empty(),
        "active jobs left: {:?}",
        rig.jobs().keys()
    );
    let mut ran: BTreeMap<String, usize> = BTreeMap::new();
    for i in 1..=16 {
        let id = format!("j{i:02}");
        let j = rig.job(&id);
        assert_eq!(j["status"], "succeeded", "{id}: {j}");
        let attempts = j["attempts"].as_array().unwrap();
        assert_eq!(attempts.len(), 1, "{id} ran once: {j}");
        let want = match i {
            1..=6 => "us-east1",
            7..=12 => "us-central1",
            _ => j["placement"]["region"].as_str().unwrap(),
        };
        assert_eq!(j["placement"]["region"], want, "{id}");
    }
    let fails = rig.job("fails");
    assert_eq!(fails["status"], "failed", "{fails}");
    assert_eq!(rig.job("pending-cancel")["status"], "deactivated");
    assert!(
        rig.job("pending-cancel")["attempts"]
            .as_array()
            .unwrap()
            .is_empty()
    );
    assert_eq!(rig.job("running-cancel")["status"], "deactivated");
    // The preempted job went back to pending in its region and resumed from its checkpoint.
    let resume = rig.job("resume");
    assert_eq!(resume["status"], "succeeded", "{resume}");
    let attempts = resume["attempts"].as_array().unwrap();
    assert!(attempts.len() >= 2, "{resume}");
    assert_eq!(resume["placement"]["region"], region.as_str());
    for a in attempts {
        let z = a["zone"].as_str().unwrap();
        assert!(z.starts_with(&region), "an attempt left {region}: {a}");
    }
    let (code, json_logs) = rig.run(&["logs", "resume", "--json"]);
    assert_eq!(code, 0);
    let records: Vec<Value> = json_logs
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(
        records.iter().filter(|r| r["event"] == "attempt").count(),
        attempts.len()
    );
    let (_, logs) = rig.run(&["logs", "resume"]);
    let starts: Vec<u32> = logs
        .lines()
        .filter_map(|l| l.split_once("starting at step ").map(|(_, rest)| rest))
        .map(|l| l.split_whitespace().next().unwrap().parse().unwrap())
        .collect();
    assert!(
        starts.first() == Some(&0) && starts.iter().skip(1).all(|&s| s >= 4),
        "resumed from its checkpoint: {starts:?}\n{logs}"
    );
    eprintln!(
        "{}: resume: {} attempts in {region}, started at steps {starts:?}; {} controllers",
        rig.store,
        attempts.len(),
        rig.controllers.len()
    );
    // No attempt ran twice: each attempt id appears once in its job's marks.
    for entry in std::fs::read_dir(dir.join("marks")).unwrap().flatten() {
        let text = std::fs::read_to_string(entry.path()).unwrap();
        for attempt in text.lines() {
            *ran.entry(attempt.to_owned()).or_default() += 1;
        }
    }
    let twice: Vec<_> = ran.iter().filter(|(_, n)| **n > 1).collect();
    assert!(twice.is_empty(), "attempts that ran twice: {twice:?}");
    assert!(!ran.keys().any(|a| a.is_empty()));
    // Nothing left running or billed.
    assert!(
        processes_of_jobs(&dir).is_empty(),
        "left running: {:?}",
        processes_of_jobs(&dir)
    );
    // The store recorded what was lived through, with times: every submission with its spec,
    // the policy the controllers decided with, the requests granted, the nodes ready and
    // the one preempted, the attempts launched and finished.
    let (code, log) = rig.run(&["state", "events"]);
    assert_eq!(code, 0, "{log}");
    let log: Vec<Value> = log
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let count = |kind: &str, detail: &str| {
        log.iter()
            .filter(|e| e["kind"] == kind && e["detail"].as_str().unwrap_or("").contains(detail))
            .count()
    };
    assert_eq!(
        count("job_created", "\"command\""),
        20,
        "one per submitted job"
    );
    assert!(count("controller_policy", "name=classic") >= 1);
    assert!(count("queued_resource_state", "to=ACTIVE") >= 1);
    assert!(count("node_state", "to=READY") >= 1);
    // (Seen by the killed controller, or first seen PREEMPTED by the one after it, or both.)
    assert!(
        log.iter().any(|e| e["kind"] == "node_state"
            && e["resource_id"] == node.as_str()
            && e["detail"].as_str().unwrap().contains("to=PREEMPTED")),
        "the preempted node"
    );
    assert!(count("job_succeeded", "") >= 16);
    let seqs: Vec<u64> = log.iter().map(|e| e["seq"].as_u64().unwrap()).collect();
    assert!(seqs.windows(2).all(|w| w[0] < w[1]), "in the order written");
    let status = rig.curl("GET", "/emulator/v1/status");
    assert_eq!(status["liveNodes"], 0, "{status}");
    assert_eq!(status["allocatedChips"], 0, "{status}");
    for zone in ["us-east1-d", "us-central1-b"] {
        let qrs = rig.curl(
            "GET",
            &format!("/v2/projects/e2e-project/locations/{zone}/queuedResources"),
        );
        assert!(
            qrs["queuedResources"]
                .as_array()
                .is_none_or(|a| a.is_empty()),
            "{zone}: {qrs}"
        );
    }
}

/// `interrupt-spot` never runs two attempts of a job at once (issue 34 item 18): the
/// interrupted attempt's workers are stopped, and confirmed stopped, before the job is
/// requeued; the attempt ends interrupted as by a preemption, not lost.
#[test]
fn interrupt_spot_stops_the_attempt_before_the_next_one_starts() {
    let mut rig = Rig::new(None);
    let dir = rig.dir.path().to_path_buf();
    std::fs::create_dir_all(dir.join("bundle")).unwrap();
    std::fs::write(dir.join("bundle/README"), "sleeps\n").unwrap();
    let marks = dir.join("marks/long");
    // The first attempt runs until stopped and notes when it ends; the next one succeeds.
    let command = format!(
        "m={m}; now() {{ date +%s%N; }}; if [ -s \"$m\" ]; then echo \"start $ATTEMPT_ID $(now)\" >> \"$m\"; exit 0; fi; echo \"start $ATTEMPT_ID $(now)\" >> \"$m\"; trap 'echo \"end $ATTEMPT_ID $(now) $(cat $TPU_RUNNER_PREEMPTION_FILE)\" >> \"$m\"; exit 143' TERM; sleep 600 & wait",
        m = marks.display()
    );
    std::fs::write(
        dir.join("job.yaml"),
        format!(
            "jobs:\n  - id: long\n    tpu: v6e-8\n    bundle: bundle\n    buckets: [gs://e2e-us-east1]\n    command: {}\n",
            serde_json::to_string(&command).unwrap()
        ),
    )
    .unwrap();
    let (code, out) = rig.run(&["submit", "job.yaml"]);
    assert_eq!(code, 0, "{out}");
    rig.start_controller();
    rig.wait_for("the first attempt to run", 120, || {
        rig.job("long")["status"] == "running"
            && std::fs::read_to_string(&marks).is_ok_and(|t| t.contains("start"))
    });
    let job = rig.job("long");
    let attempt = job["attempts"].as_array().unwrap().last().unwrap().clone();
    let (code, out) = rig.run(&[
        "interrupt-spot",
        "long",
        "--tpu",
        attempt["resource_id"].as_str().unwrap(),
        "--attempt-id",
        attempt["id"].as_str().unwrap(),
    ]);
    assert_eq!(code, 0, "{out}");
    rig.wait_for("the job to succeed on its next attempt", 180, || {
        rig.job("long")["status"] == "succeeded"
    });
    let text = std::fs::read_to_string(&marks).unwrap();
    let times: Vec<(String, String, u128)> = text
        .lines()
        .map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f[0].to_owned(), f[1].to_owned(), f[2].parse().unwrap())
        })
        .collect();
    let first = attempt["id"].as_str().unwrap();
    let ended = times
        .iter()
        .find(|(what, a, _)| what == "end" && a == first)
        .unwrap_or_else(|| panic!("the first attempt was stopped: {text}"));
    let next = times
        .iter()
        .find(|(what, a, _)| what == "start" && a != first)
        .unwrap_or_else(|| panic!("a next attempt ran: {text}"));
    assert!(
        ended.2 <= next.2,
        "the next attempt started {} ms before the interrupted one ended:\n{text}",
        (ended.2 - next.2) / 1_000_000
    );
    // It was told why (the same notice as a Spot preemption's).
    assert!(
        text.lines()
            .any(|l| l.starts_with(&format!("end {first} ")) && l.ends_with(" interrupt-spot")),
        "{text}"
    );
    let job = rig.job("long");
    let first_record = &job["attempts"][0];
    assert_eq!(first_record["status"], "interrupted", "{job}");
    assert_eq!(first_record["end_reason"], "preempted", "{job}");
}

/// A training loop that saves every 40 steps and at once when it is told to stop (its
/// `TPU_RUNNER_PREEMPTION_FILE`, then SIGTERM), each step noted in `$MARKS`.
const CHECKPOINTS_ON_NOTICE: &str = r#"set -u
dir="$TPU_RUNNER_OBJECTS/${CHECKPOINT_GCS_DIR#gs://}"
mkdir -p "$dir"
step=$(cat "$dir/step" 2>/dev/null || echo 0)
echo "start $ATTEMPT_ID $step" >> "$MARKS"
save() { echo "$step" > "$dir/step.tmp" && mv "$dir/step.tmp" "$dir/step"; }
trap 'save; echo "saved $ATTEMPT_ID $step $(cat "$TPU_RUNNER_PREEMPTION_FILE")" >> "$MARKS"; exit 143' TERM
while [ "$step" -lt 100 ]; do
  sleep 0.2
  step=$((step + 1))
  echo "step $ATTEMPT_ID $step" >> "$MARKS"
  if [ $((step % 40)) -eq 0 ]; then save; fi
done
echo "done $ATTEMPT_ID $step" >> "$MARKS"
"#;

/// The cloud's notice reaches the job on the local stack (issue 32, item 5): the agent
/// watches its TPU VM's metadata server, writes the reason into the command's
/// `TPU_RUNNER_PREEMPTION_FILE` and sends it SIGTERM; a job that saves then loses less than
/// one checkpoint interval (here: nothing) and resumes where it stopped, requeued as after
/// a preemption.
fn a_noticed_job_resumes_where_it_stopped(control: &str, word: &str) {
    let mut rig = Rig::new(None);
    let dir = rig.dir.path().to_path_buf();
    std::fs::create_dir_all(dir.join("bundle")).unwrap();
    std::fs::write(dir.join("bundle/train.sh"), CHECKPOINTS_ON_NOTICE).unwrap();
    let marks = dir.join("marks/train");
    std::fs::write(
        dir.join("job.yaml"),
        format!(
            "jobs:\n  - id: train\n    tpu: v6e-8\n    bundle: bundle\n    buckets: [gs://e2e-us-east1]\n    env: {{MARKS: \"{}\"}}\n    command: bash train.sh\n",
            marks.display()
        ),
    )
    .unwrap();
    let (code, out) = rig.run(&["submit", "job.yaml"]);
    assert_eq!(code, 0, "{out}");
    rig.start_controller();
    let steps = |text: &str, attempt: &str| -> Vec<u32> {
        text.lines()
            .filter_map(|l| {
                let f: Vec<&str> = l.split_whitespace().collect();
                (f.len() >= 3 && f[0] == "step" && f[1] == attempt).then(|| f[2].parse().unwrap())
            })
            .collect()
    };
    // Mid-way between two checkpoints: 15 steps past the last one (at 0).
    rig.wait_for("the job to run 15 steps", 120, || {
        let text = std::fs::read_to_string(&marks).unwrap_or_default();
        text.lines()
            .any(|l| l.starts_with("step ") && l.ends_with(" 15"))
    });
    let job = rig.job("train");
    let attempt = job["attempts"].as_array().unwrap().last().unwrap().clone();
    let first = attempt["id"].as_str().unwrap().to_owned();
    let (zone, node) = (
        attempt["zone"].as_str().unwrap(),
        attempt["tpu_name"].as_str().unwrap(),
    );
    rig.curl(
        "POST",
        &format!("/emulator/v1/projects/e2e-project/locations/{zone}/nodes/{node}/{control}"),
    );
    rig.wait_for("the job to succeed on its next attempt", 180, || {
        rig.job("train")["status"] == "succeeded"
    });
    let text = std::fs::read_to_string(&marks).unwrap();
    let reached = *steps(&text, &first).last().expect("the first attempt ran");
    assert!(reached < 40, "the notice came after a checkpoint:\n{text}");
    let saved = text
        .lines()
        .find(|l| l.starts_with(&format!("saved {first} ")))
        .unwrap_or_else(|| panic!("the first attempt was not told to save:\n{text}"));
    assert!(saved.ends_with(&format!(" {word}")), "{saved}");
    let resumed: u32 = text
        .lines()
        .filter(|l| l.starts_with("start ") && !l.contains(&first))
        .map(|l| l.split_whitespace().nth(2).unwrap().parse().unwrap())
        .next()
        .unwrap_or_else(|| panic!("no next attempt:\n{text}"));
    // Less than one checkpoint interval lost: here none at all (a step may finish between
    // the save and the exit).
    assert!(
        resumed + 1 >= reached,
        "the next attempt resumed at {resumed}, the first reached {reached}:\n{text}"
    );
    let job = rig.job("train");
    let record = &job["attempts"][0];
    assert_eq!(record["status"], "interrupted", "{job}");
    assert_eq!(record["end_reason"], "preempted", "{job}");
}

#[test]
fn a_spot_preemption_notice_reaches_the_job_which_loses_no_work() {
    a_noticed_job_resumes_where_it_stopped("preempt", "spot-preemption");
}

#[test]
fn a_host_maintenance_notice_reaches_the_job_which_loses_no_work() {
    a_noticed_job_resumes_where_it_stopped("maintenance", "host-maintenance");
}

/// On GCP, `submit` starts the fleet's Cloud Run controller job (here a loopback server
/// answers as Cloud Run's `jobs:run` does) and says so; the jobs stay queued if it cannot.
#[test]
fn submit_starts_the_cloud_run_controller() {
    use std::io::Write;
    let rig = Rig::new(None);
    let dir = rig.dir.path();
    std::fs::create_dir_all(dir.join("bundle")).unwrap();
    std::fs::write(
        dir.join("job.yaml"),
        "jobs:\n  - {id: one, tpu: v6e-8, bundle: bundle, buckets: [gs://e2e-us-east1], command: 'true'}\n  - {id: two, tpu: v6e-8, bundle: bundle, buckets: [gs://e2e-us-east1], command: 'true'}\n",
    )
    .unwrap();
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let server = std::thread::spawn(move || {
        let (mut stream, _) = listener.accept().unwrap();
        let mut reader = BufReader::new(stream.try_clone().unwrap());
        let mut request_line = String::new();
        reader.read_line(&mut request_line).unwrap();
        let body = r#"{"name": "projects/e2e-project/locations/us-central1/operations/op-1", "metadata": {"@type": "type.googleapis.com/google.cloud.run.v2.Execution"}}"#;
        write!(
            stream,
            "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
            body.len()
        )
        .unwrap();
        request_line
    });
    let out = rig
        .command(&["submit", "job.yaml", "--name", "one", "--json"])
        .env(
            "TPU_RUNNER_RUN_ENDPOINT",
            format!("http://127.0.0.1:{port}"),
        )
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        server.join().unwrap().trim(),
        "POST /v2/projects/e2e-project/locations/us-central1/jobs/e2e-controller:run HTTP/1.1"
    );
    let last: Value = serde_json::from_str(text.lines().last().unwrap()).unwrap();
    assert_eq!(last["event"], "controller_triggered", "{text}");
    assert_eq!(
        last["operation"],
        "projects/e2e-project/locations/us-central1/operations/op-1"
    );
    // Nobody answers: the job is queued all the same, and the exit code says the trigger failed.
    let out = rig
        .command(&["submit", "job.yaml", "--name", "two"])
        .env("TPU_RUNNER_RUN_ENDPOINT", "http://127.0.0.1:1")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("the jobs are queued"));
    assert_eq!(rig.jobs()["two"]["status"], "pending");
}

/// The fleet's `policy:` is what decides, alike in `plan` and in the controller: with
/// `frugal` and a long `race_after`, a job that may run in either region gets one capacity
/// request, in `plan` and in the controller's first pass on the emulator (whose pass record
/// names the same policy digest `plan` reports); with `race_after: 0s` the same file's plan
/// races both regions.
#[test]
fn the_fleets_policy_decides_alike_in_plan_and_in_the_controllers_first_pass() {
    let mut rig = Rig::new(None);
    let dir = rig.dir.path().to_path_buf();
    let fleet = |race_after: &str| {
        let text = std::fs::read_to_string(fixture("deployment.yaml")).unwrap().replace(
            "tpus:",
            &format!("policy: {{name: frugal, race_after: {race_after}, engine: {{heartbeat_timeout: 20m}}}}\ntpus:"),
        );
        let path = dir.join(format!("deployment-{race_after}.yaml"));
        std::fs::write(&path, text).unwrap();
        path
    };
    rig.fleet = fleet("1h");
    std::fs::create_dir_all(dir.join("bundle")).unwrap();
    std::fs::write(
        dir.join("job.yaml"),
        "jobs:\n  - id: either\n    tpu: v6e-8\n    bundle: bundle\n    buckets: [gs://e2e-us-east1, gs://e2e-us-central1]\n    command: sleep 30\n",
    )
    .unwrap();
    let (code, out) = rig.run(&["submit", "job.yaml"]);
    assert_eq!(code, 0, "{out}");

    let creates = |plan: &Value| -> Vec<String> {
        plan["actions"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|a| a["action"] == "create_queued_resource")
            .map(|a| a["zone"].as_str().unwrap().to_owned())
            .collect()
    };
    let (code, out) = rig.run(&["plan", "--json"]);
    assert_eq!(code, 0, "{out}");
    let plan: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(plan["policy"], "frugal");
    let planned = creates(&plan);
    assert_eq!(planned.len(), 1, "frugal asks one entry: {plan}");

    // The controller's first pass, on the same file and store.
    let log = std::fs::File::create(dir.join("controller.log")).unwrap();
    let child = rig
        .command(&[
            "controller",
            "--local-workers",
            &dir.join("workers").display().to_string(),
            "--interval",
            "600",
            "--log-json",
        ])
        .stderr(log)
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    rig.controllers.push(child);
    let zones = ["us-east1-d", "us-central1-b"];
    let listed = |rig: &Rig| -> Vec<String> {
        zones
            .iter()
            .filter(|z| {
                let v = rig.curl(
                    "GET",
                    &format!("/v2/projects/e2e-project/locations/{z}/queuedResources"),
                );
                !v["queuedResources"].as_array().is_none_or(|q| q.is_empty())
            })
            .map(|z| z.to_string())
            .collect()
    };
    rig.wait_for("the controller's first pass", 60, || {
        std::fs::read_to_string(dir.join("controller.log"))
            .is_ok_and(|t| t.contains("\"message\":\"pass\""))
    });
    assert_eq!(
        listed(&rig),
        planned,
        "the controller asked where plan said it would"
    );
    let record: Value = std::fs::read_to_string(dir.join("controller.log"))
        .unwrap()
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .find(|v| v["message"] == "pass")
        .unwrap();
    assert_eq!(record["policy"], "frugal");
    assert_eq!(record["policy_digest"], plan["policy_digest"], "{record}");

    // The same state under the same file with `race_after: 0s`: every region races.
    rig.fleet = fleet("0s");
    let (code, out) = rig.run(&["plan", "--json"]);
    assert_eq!(code, 0, "{out}");
    let plan: Value = serde_json::from_str(&out).unwrap();
    assert_ne!(plan["policy_digest"], record["policy_digest"]);
    let raced = creates(&plan);
    assert_eq!(
        raced.len(),
        1,
        "one left to race: the other is asked already: {plan}"
    );
    assert_ne!(raced, planned);
}
