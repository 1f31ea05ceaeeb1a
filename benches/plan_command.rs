//! The whole `tpu-runner plan` and `tpu-runner status` commands, as a user runs them, on
//! snapshots of 4k, 20k and 100k pending jobs (one idle TPU per ten jobs, 100 to 500 fleet
//! entries). `plan`: the binary starts, reads and checks the fleet and the state, runs one
//! pass, explains every waiting job and prints the text report (`text`) or the JSON one
//! (`json`). `status`: the same jobs imported into an SQLite store; the binary loads the
//! active set, orders the queue, explains every waiting run and prints the first page
//! (`text`, 50 rows), every run (`json`) or the page and the history (`all`). The files
//! and stores are written once, outside the timed section. Issue 17's target: 100k jobs in
//! under 2 s, output linear in jobs (the output sizes are printed once per size).
//! `plan_command_many_classes`: `plan` on 500 entries with requirements as varied as a
//! sweep queue's (zone and TPU pins: the classes grow with the jobs), issue 35's target
//! (100k jobs in under 2 s).

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use tpu_runner::engine::{Timestamp, synthetic};
use tpu_runner::spec::FleetSpec;
use tpu_runner::spec::fleet::EntryKind;

const BIN: &str = env!("CARGO_BIN_EXE_tpu-runner");

/// `fleet` as a deployment.yaml.
fn fleet_yaml(fleet: &FleetSpec) -> String {
    let mut s = format!(
        "name: {}\nproject: {}\ncontroller_region: {}\ncontroller_timeout: {}\nfirestore_location: {}\nnetwork: {}\nsubnetwork: {}\nssh_transport: iap\ntpus:\n",
        fleet.name,
        fleet.project,
        fleet.controller_region,
        fleet.controller_timeout,
        fleet.firestore_location,
        fleet.network,
        fleet.subnetwork
    );
    for e in &fleet.tpus {
        let EntryKind::Managed { count } = e.kind else {
            unreachable!("the synthetic fleet is managed")
        };
        writeln!(
            s,
            "  - {{id: {}, type: {}, zone: {}, count: {count}, runtime: {}, chip_limit: {}}}",
            e.id,
            e.tpu_type,
            e.zone,
            e.runtime.as_deref().unwrap_or("v2-alpha-tpuv6e"),
            e.chip_limit
        )
        .expect("writes to a string");
    }
    s
}

/// Runs the binary with `args` in `dir`; the bytes it printed, drained as a pipe into a file
/// or `wc -c` takes them (the bench holds none: a 185 MB report kept in a growing buffer
/// cost the bench's side of the pipe as much CPU as parts of `plan` itself).
fn run(dir: &Path, args: &[&str]) -> usize {
    use std::io::Read as _;
    let mut child = Command::new(BIN)
        .current_dir(dir)
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the binary runs");
    let mut stderr = child.stderr.take().expect("piped");
    let errors = std::thread::spawn(move || {
        let mut text = String::new();
        let _ = stderr.read_to_string(&mut text);
        text
    });
    let mut stdout = child.stdout.take().expect("piped");
    // Read as `cat` reads (128 KB at a time), not in 8 KB steps.
    let mut buffer = vec![0u8; 128 << 10];
    let mut bytes = 0;
    loop {
        match stdout.read(&mut buffer) {
            Ok(0) => break,
            Ok(n) => bytes += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => panic!("reads the output: {e}"),
        }
    }
    let status = child.wait().expect("the binary ends");
    let errors = errors.join().expect("stderr is read");
    assert!(status.success(), "{args:?} failed: {errors}");
    bytes
}

/// A folder per size holding `deployment.yaml` and `state.json`: `n_jobs` pending jobs and
/// one idle TPU per ten jobs over `n_entries` entries. Under `cargo test` (no `--bench`:
/// criterion runs each bench once, on a debug build) the smallest size shows the bench
/// works; the sizes are for `cargo bench`.
fn snapshots() -> Vec<(usize, tempfile::TempDir)> {
    snapshots_of(false)
}

/// `snapshots`, and with `varied` the jobs' requirements as varied as a sweep queue's
/// (`synthetic::varied_pending_jobs`: zone and TPU pins), every snapshot over 500 entries:
/// many requirement classes against many entries.
fn snapshots_of(varied: bool) -> Vec<(usize, tempfile::TempDir)> {
    let epoch = Timestamp::from_secs(1_767_225_600);
    let sizes: &[(usize, usize)] = if std::env::args().any(|a| a == "--bench") {
        &[(4_000, 100), (20_000, 200), (100_000, 500)]
    } else {
        &[(4_000, 100)]
    };
    let mut dirs = Vec::new();
    for &(n_jobs, n_entries) in sizes {
        let n_entries = if varied { 500 } else { n_entries };
        let n_idle = n_jobs / 10;
        let count = (n_idle / n_entries + 1) as u32;
        let fleet = synthetic::fleet(n_entries, count);
        let (mut state, _) =
            synthetic::planning_instance(&fleet, if varied { 0 } else { n_jobs }, n_idle, epoch);
        if varied {
            for job in synthetic::varied_pending_jobs(&fleet, n_jobs, epoch) {
                state.jobs.insert(job.id, job);
            }
        }
        let dir = tempfile::tempdir().expect("temp dir");
        std::fs::write(dir.path().join("deployment.yaml"), fleet_yaml(&fleet)).expect("fleet");
        std::fs::write(
            dir.path().join("state.json"),
            serde_json::to_vec(&state).expect("state serialises"),
        )
        .expect("state");
        dirs.push((n_jobs, dir));
    }
    dirs
}

const PLAN: &[&str] = &[
    "plan",
    "--fleet",
    "deployment.yaml",
    "--state",
    "state.json",
    "--now",
    "2026-01-02T03:46:40Z",
];

fn plan_command(c: &mut Criterion) {
    plan_group(c, "plan_command", false);
    plan_group(c, "plan_command_many_classes", true);
}

fn plan_group(c: &mut Criterion, name: &str, varied: bool) {
    let mut group = c.benchmark_group(name);
    group.sample_size(10);
    let dirs = snapshots_of(varied);
    for (n_jobs, dir) in &dirs {
        let json_args = [PLAN, &["--json"]].concat();
        let (text, json) = (run(dir.path(), PLAN), run(dir.path(), &json_args));
        eprintln!(
            "{name}: {n_jobs} jobs: text {} KB ({:.0} B/job), JSON {} KB ({:.0} B/job)",
            text >> 10,
            text as f64 / *n_jobs as f64,
            json >> 10,
            json as f64 / *n_jobs as f64
        );
        let path: PathBuf = dir.path().to_path_buf();
        group.bench_function(BenchmarkId::new("text", n_jobs), |b| {
            b.iter(|| run(&path, PLAN))
        });
        group.bench_function(BenchmarkId::new("json", n_jobs), |b| {
            b.iter(|| run(&path, &json_args))
        });
    }
    group.finish();
}

const STATUS: &[&str] = &[
    "status",
    "--fleet",
    "deployment.yaml",
    "--store",
    "sqlite:state.db",
];

fn status_command(c: &mut Criterion) {
    let mut group = c.benchmark_group("status_command");
    group.sample_size(10);
    let dirs = snapshots();
    let kinds: [(&str, Vec<&str>); 3] = [
        ("text", STATUS.to_vec()),
        ("json", [STATUS, &["--json", "--limit", "0"]].concat()),
        ("all", [STATUS, &["--all"]].concat()),
    ];
    for (n_jobs, dir) in &dirs {
        run(
            dir.path(),
            &[
                "state",
                "import",
                "state.json",
                "--fleet",
                "deployment.yaml",
                "--store",
                "sqlite:state.db",
            ],
        );
        let text = run(dir.path(), &kinds[0].1);
        let json = run(dir.path(), &kinds[1].1);
        eprintln!(
            "status_command: {n_jobs} runs: text {} KB, JSON {} KB ({:.0} B/run)",
            text >> 10,
            json >> 10,
            json as f64 / *n_jobs as f64
        );
        let path: PathBuf = dir.path().to_path_buf();
        for (kind, args) in &kinds {
            group.bench_function(BenchmarkId::new(*kind, n_jobs), |b| {
                b.iter(|| run(&path, args))
            });
        }
    }
    group.finish();
}

criterion_group!(benches, plan_command, status_command);
criterion_main!(benches);
