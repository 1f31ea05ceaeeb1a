//! The simulator end to end (engine + driver + simulated cloud): one seed of the smoke
//! scenario and of a one-day cut of the scale scenario. Each bench's throughput is its
//! simulated seconds, so criterion's `elem/s` reads as simulated seconds per wall second.

// The allocator the `tpu-runner` binary uses (src/main.rs).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use tpu_runner::simulate::harness::{self, Hooks, RunOptions};
use tpu_runner::simulate::scenario;

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

criterion_group!(benches, simulator);
criterion_main!(benches);
