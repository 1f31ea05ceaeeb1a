//! The simulator end to end (engine + driver + simulated cloud): one seed of the smoke
//! scenario and of a one-day cut of the scale scenario. Each bench's throughput is its
//! simulated seconds, so criterion's `elem/s` reads as simulated seconds per wall second.
//! Then the simulated cloud alone with a deep queue (issue 17): 100k queued resources
//! waiting in the one pool of `scenarios/bench/one-pool.yaml`, created, then drained a
//! thousand slices at a time (each deletion frees a slice for the oldest waiting request).

// The allocator the `tpu-runner` binary uses (src/main.rs).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

use criterion::{BatchSize, Criterion, Throughput, criterion_group, criterion_main};
use tpu_runner::simulate::harness::{self, Hooks, RunOptions};
use tpu_runner::simulate::scenario;
use tpu_runner_sim::SimCloud;
use ustr::Ustr;

fn load(rel: &str, edit: impl Fn(&mut scenario::Scenario)) -> scenario::Scenario {
    let mut s = scenario::load(&std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(rel))
        .unwrap_or_else(|e| panic!("{e}"));
    edit(&mut s);
    s
}

/// One run of `s` (seed 1, classic).
fn run(s: &scenario::Scenario) -> harness::RunResult {
    harness::run(s, "classic", 1, RunOptions::default(), Hooks::default()).unwrap()
}

/// Simulated seconds of a run, as criterion elements.
fn simulated(s: &scenario::Scenario) -> Throughput {
    Throughput::Elements(run(s).metrics.simulated_s as u64)
}

fn simulator(c: &mut Criterion) {
    let mut group = c.benchmark_group("simulate");
    group.sample_size(10);
    let smoke = load("scenarios/smoke.yaml", |_| {});
    group.throughput(simulated(&smoke));
    group.bench_function("smoke-5h", |b| b.iter(|| run(&smoke)));
    let scale_day = load("scenarios/bench/scale.yaml", |s| {
        s.horizon_secs = 86_400;
        for w in &mut s.workloads {
            if let scenario::WorkloadSpec::Synthetic(w) = w {
                w.count = 1_700;
            }
        }
    });
    group.throughput(simulated(&scale_day));
    group.bench_function("scale-1day", |b| b.iter(|| run(&scale_day)));
    group.finish();
}

/// The name of the `i`th queued resource a bench creates.
fn qr_name(i: usize) -> Ustr {
    Ustr::from(&format!("qr-{i:06}"))
}

/// A cloud of the one-pool scenario (seed 1) with `n` queued resources created in its pool:
/// the first few provisioning, the rest waiting.
fn with_waiting(scenario: &scenario::Scenario, n: usize) -> SimCloud {
    let mut cloud = SimCloud::new(harness::cloud_config(scenario, 1, None));
    let zone = Ustr::from("us-east1-d");
    let labels = std::sync::Arc::new(Default::default());
    for i in 0..n {
        let name = qr_name(i);
        cloud
            .create_queued_resource(
                zone,
                name,
                name,
                "v6e-8",
                tpu_runner_sim::PoolModel::Spot,
                None,
                std::sync::Arc::clone(&labels),
            )
            .expect("the pool exists and the name is new");
    }
    cloud
}

/// Deletes the first `slices` requests one by one, each time letting the deletion finish so
/// that the oldest waiting request takes the freed slice.
fn drain(cloud: &mut SimCloud, slices: usize) {
    let zone = Ustr::from("us-east1-d");
    let delete_ms = (cloud.config().delete_secs * 1000.0) as u64 + 1;
    for i in 0..slices {
        cloud
            .delete_queued_resource(zone, qr_name(i))
            .expect("an active or provisioning request");
        cloud.advance_to(cloud.now() + delete_ms);
    }
}

fn waiting_requests(c: &mut Criterion) {
    let one_pool = load("scenarios/bench/one-pool.yaml", |_| {});
    // Under `cargo test` (no `--bench`: one run each, on a debug build) a small queue shows
    // the bench works; the 100k queue is for `cargo bench`.
    let waiting = if std::env::args().any(|a| a == "--bench") {
        100_000
    } else {
        2_000
    };
    let (drained, label) = (1_000, waiting / 1_000);
    let mut group = c.benchmark_group("waiting_requests");
    group.sample_size(10);
    group.throughput(Throughput::Elements(waiting as u64));
    group.bench_function(format!("create-{label}k-in-one-pool"), |b| {
        b.iter(|| with_waiting(&one_pool, waiting))
    });
    group.throughput(Throughput::Elements(drained as u64));
    group.bench_function(format!("drain-1k-of-{label}k"), |b| {
        b.iter_batched(
            || with_waiting(&one_pool, waiting),
            |mut cloud| {
                drain(&mut cloud, drained);
                cloud
            },
            BatchSize::LargeInput,
        )
    });
    group.finish();
}

criterion_group!(benches, simulator, waiting_requests);
criterion_main!(benches);
