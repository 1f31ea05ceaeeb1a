//! The simulator end to end (engine + driver + simulated cloud): one seed of the smoke
//! scenario and of a one-day cut of the scale scenario. Report simulated seconds per wall
//! second from `simulated_s` / time.

// The allocator the `tpu-runner` binary uses (src/main.rs).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

use criterion::{Criterion, criterion_group, criterion_main};
use tpu_runner::simulate::harness::{self, Hooks, RunOptions};
use tpu_runner::simulate::scenario;

fn load(rel: &str, edit: impl Fn(&mut scenario::Scenario)) -> scenario::Scenario {
    let mut s = scenario::load(&std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(rel))
        .unwrap_or_else(|e| panic!("{e}"));
    edit(&mut s);
    s
}

fn simulator(c: &mut Criterion) {
    let mut group = c.benchmark_group("simulate");
    group.sample_size(10);
    let smoke = load("scenarios/smoke.yaml", |_| {});
    group.bench_function("smoke-5h", |b| {
        b.iter(|| {
            harness::run(
                &smoke,
                "classic",
                1,
                RunOptions::default(),
                Hooks::default(),
            )
            .unwrap()
        })
    });
    let scale_day = load("scenarios/bench/scale.yaml", |s| {
        s.horizon_secs = 86_400;
        for w in &mut s.workloads {
            if let scenario::WorkloadSpec::Synthetic(w) = w {
                w.count = 1_700;
            }
        }
    });
    group.bench_function("scale-1day-200entries", |b| {
        b.iter(|| {
            harness::run(
                &scale_day,
                "classic",
                1,
                RunOptions::default(),
                Hooks::default(),
            )
            .unwrap()
        })
    });
    group.finish();
}

criterion_group!(benches, simulator);
criterion_main!(benches);
