//! The loop from production to the simulator, measured: 100 real jobs (commands run by
//! worker agents on this machine) go through the controller against the TPU API emulator on
//! the wall clock, with stockouts and Spot preemptions; `capture` turns the store into a
//! scenario, `simulate` replays it under the policy that ran, and `report` says what really
//! happened over the same window. Every metric of the replay (mean over its seeds) must be
//! within its stated tolerance of the record. Then the capture is replayed under another
//! policy: the prediction a user acts on.

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

const BIN: &str = env!("CARGO_BIN_EXE_tpu-runner");

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/fidelity")
        .join(name)
}

struct Processes(Vec<Child>);

impl Drop for Processes {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// The jobs: 100 single-host jobs of 3 to 12 s each, half submitted at once and half
/// 40 s later, in either region.
fn manifest(first: bool) -> String {
    let mut text = String::from("jobs:\n");
    for i in 0..50 {
        let n = if first { i } else { 50 + i };
        let secs = 3 + (n * 7) % 10;
        text.push_str(&format!(
            "  - id: job-{n:03}\n    tpu: v6e-8\n    bundle: bundle\n    buckets: [gs://fid-us-east1, gs://fid-us-central1]\n    command: 'sleep {secs}'\n"
        ));
    }
    text
}

#[test]
fn a_captured_run_replays_within_its_tolerances() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let objects = tpu_runner::objects::LocalDir::new(root.join("objects"));
    objects
        .create_bucket("gs://fid-us-east1", "US-EAST1")
        .unwrap();
    objects
        .create_bucket("gs://fid-us-central1", "US-CENTRAL1")
        .unwrap();
    std::fs::create_dir_all(root.join("bundle")).unwrap();
    std::fs::write(root.join("bundle/README"), "nothing to run but sleep\n").unwrap();
    std::fs::write(root.join("first.yaml"), manifest(true)).unwrap();
    std::fs::write(root.join("second.yaml"), manifest(false)).unwrap();

    let mut procs = Processes(Vec::new());
    let mut emulator = Command::new(BIN)
        .args([
            "emulator",
            "--listen",
            "127.0.0.1:0",
            "--speed",
            "1",
            "--workers",
        ])
        .arg(root.join("workers"))
        .arg(fixture("cloud.yaml"))
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let mut first = String::new();
    BufReader::new(emulator.stdout.take().unwrap())
        .read_line(&mut first)
        .unwrap();
    procs.0.push(emulator);
    let url = first
        .split_whitespace()
        .find(|w| w.starts_with("http://"))
        .unwrap_or_else(|| panic!("the emulator said: {first}"))
        .trim_end_matches(':')
        .to_owned();
    let store = format!("sqlite:{}", root.join("state.db").display());
    let command = |args: &[&str]| {
        let mut c = Command::new(BIN);
        c.args(args)
            .current_dir(root)
            .env("TPU_RUNNER_DEPLOYMENT", fixture("deployment.yaml"))
            .env("TPU_RUNNER_STORE", &store)
            .env("TPU_RUNNER_TPU_ENDPOINT", &url)
            .env("TPU_RUNNER_OBJECTS", root.join("objects"));
        c
    };
    let run = |args: &[&str]| {
        let out = command(args).output().unwrap();
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(
            out.status.success(),
            "{args:?}: {text}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        text
    };

    let started = Instant::now();
    run(&["submit", "first.yaml"]);
    let controller = command(&[
        "controller",
        "--local-workers",
        &root.join("workers").display().to_string(),
        "--lease-ttl",
        "5",
        "--exit-when-idle",
        "--wait-for-lease",
    ])
    .stdout(Stdio::null())
    .spawn()
    .unwrap();
    procs.0.push(controller);
    std::thread::sleep(Duration::from_secs(40));
    run(&["submit", "second.yaml"]);
    let controller = procs.0.last_mut().unwrap();
    let until = Instant::now() + Duration::from_secs(600);
    let status = loop {
        if let Some(s) = controller.try_wait().unwrap() {
            break s;
        }
        assert!(
            Instant::now() < until,
            "the controller did not drain the queue"
        );
        std::thread::sleep(Duration::from_millis(500));
    };
    assert!(status.success());
    let lived = started.elapsed().as_secs_f64();

    // What really happened, and its replay.
    let recorded: Value = serde_json::from_str(&run(&["report", "--json"])).unwrap();
    let captured = run(&["capture", "--output", "captured"]);
    eprintln!("{captured}");
    let scenario = root.join("captured/scenario.yaml");
    eprintln!("{}", std::fs::read_to_string(&scenario).unwrap());
    let replay = |policy: &str| -> Vec<Value> {
        let text = run(&[
            "simulate",
            scenario.to_str().unwrap(),
            "--policy",
            policy,
            "--json",
        ]);
        let doc: Value = serde_json::from_str(&text).unwrap();
        doc["records"].as_array().unwrap().clone()
    };
    let classic = replay("classic");
    let mean = |runs: &[Value], f: &dyn Fn(&Value) -> f64| {
        runs.iter().map(|r| f(&r["metrics"])).sum::<f64>() / runs.len() as f64
    };
    let r = &recorded["metrics"];
    // (name, metric, tolerance: the most the replay's mean may differ from the record, as
    // an absolute amount or a share of the record, whichever is larger).
    type Metric<'a> = (&'a str, &'a dyn Fn(&Value) -> f64, f64, f64);
    let metrics: [Metric<'_>; 9] = [
        (
            "jobs succeeded",
            &|m| m["jobs_succeeded"].as_f64().unwrap(),
            0.0,
            0.0,
        ),
        (
            "jobs failed",
            &|m| m["jobs_failed"].as_f64().unwrap(),
            0.0,
            0.0,
        ),
        (
            "utilisation",
            &|m| m["utilization"].as_f64().unwrap(),
            0.10,
            0.0,
        ),
        (
            "goodput ratio",
            &|m| m["goodput_ratio"].as_f64().unwrap(),
            0.10,
            0.0,
        ),
        (
            "chip-hours held",
            &|m| m["allocated_chip_hours"].as_f64().unwrap(),
            0.0,
            0.20,
        ),
        (
            "wait p50 s",
            &|m| m["queue_wait_s"]["p50"].as_f64().unwrap(),
            5.0,
            0.30,
        ),
        (
            "JCT p50 s",
            &|m| m["jct_s"]["p50"].as_f64().unwrap(),
            5.0,
            0.30,
        ),
        (
            "preemptions",
            &|m| m["preemptions"].as_f64().unwrap(),
            4.0,
            0.5,
        ),
        ("retries", &|m| m["retries"].as_f64().unwrap(), 4.0, 0.5),
    ];
    let frugal = replay("frugal");
    let mut table = format!(
        "lived {lived:.0} s; metric: recorded / replayed under classic (mean of {} seeds) / tolerance / predicted under frugal\n",
        classic.len()
    );
    let mut outside = Vec::new();
    for (name, f, abs, rel) in &metrics {
        let (want, got) = (f(r), mean(&classic, *f));
        let tolerance = abs.max(rel * want.abs());
        table.push_str(&format!(
            "  {name}: {want:.3} / {got:.3} / ±{tolerance:.3} / {:.3}\n",
            mean(&frugal, *f)
        ));
        if (got - want).abs() > tolerance + 1e-9 {
            outside.push(*name);
        }
    }
    eprintln!("{table}");
    assert!(
        outside.is_empty(),
        "the replay is outside its tolerance for {outside:?}:\n{table}"
    );
}
