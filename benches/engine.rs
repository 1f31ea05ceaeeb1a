//! One pass of the reconcile engine (`classic` policy) on synthetic instances. Planning: 1k,
//! 10k and 100k pending jobs with one idle TPU per ten jobs, over 50 to 500 fleet entries.
//! Steady: a settled fleet of 600 or 2,000 TPUs, each running a job, none waiting,
//! where a pass finds nothing to do: `cold`, a first pass on a copy of the state (cloned
//! outside the timed section), which looks at everything; `warm`, the same engine passing
//! again and again over the same state with an observation whose driver reports no change
//! (a controller's steady state), where the engine's memo skips what did not change.
//! Sightings: what recording the cloud's changes costs a pass over a listing of 2,000 or
//! 10,000 TPUs (and as many queued resources): nothing changed (the backends hand back the
//! objects they listed before), 1 % changed, and every object listed afresh but equal.

// The allocator the `tpu-runner` binary uses (src/main.rs).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

use criterion::measurement::WallTime;
use criterion::{
    BatchSize, BenchmarkGroup, BenchmarkId, Criterion, criterion_group, criterion_main,
};
use tpu_runner::engine::observe::ReportChanges;
use tpu_runner::engine::policy::Classic;
use tpu_runner::engine::{Engine, EngineConfig, Observation, State, Timestamp, synthetic};
use tpu_runner::spec::FleetSpec;

/// Times one pass of a `classic` engine for `fleet` on a copy of `state` (copied, and
/// dropped, outside the timed section).
fn bench_pass(
    group: &mut BenchmarkGroup<'_, WallTime>,
    id: BenchmarkId,
    fleet: FleetSpec,
    (state, obs, now): (State, Observation, Timestamp),
) {
    let engine = Engine::new(fleet, EngineConfig::default(), Box::new(Classic));
    group.bench_function(id, |b| {
        b.iter_batched(
            || state.clone(),
            |mut s| (engine.reconcile(&mut s, &obs, now), s),
            BatchSize::LargeInput,
        )
    });
}

fn planning_pass(c: &mut Criterion) {
    let epoch = Timestamp::from_secs(1_767_225_600);
    let mut group = c.benchmark_group("planning_pass");
    group.sample_size(10);
    for (n_jobs, n_entries) in [(1_000usize, 50usize), (10_000, 200), (100_000, 500)] {
        let n_idle = n_jobs / 10;
        let count = (n_idle / n_entries + 1) as u32;
        let fleet = synthetic::fleet(n_entries, count);
        let (state, obs) = synthetic::planning_instance(&fleet, n_jobs, n_idle, epoch);
        let id = BenchmarkId::new("jobs", format!("{n_jobs}x{n_idle}tpus/{n_entries}entries"));
        bench_pass(
            &mut group,
            id,
            fleet,
            (state, obs, epoch.plus_secs(100_000)),
        );
    }
    group.finish();
}

fn steady_pass(c: &mut Criterion) {
    let epoch = Timestamp::from_secs(1_767_225_600);
    let mut group = c.benchmark_group("steady_pass");
    group.sample_size(20);
    for (n_entries, count) in [(200usize, 3u32), (500, 4)] {
        let n_tpus = n_entries * count as usize;
        let fleet = synthetic::fleet(n_entries, count);
        let (state, obs, now) = synthetic::running_instance(&fleet, 2 * n_tpus, epoch);
        assert!(
            state.resources.len() == n_tpus && state.resources.values().all(|r| r.is_busy()),
            "the instance is not settled"
        );
        let id = BenchmarkId::new("cold", format!("{n_tpus}tpus/{n_entries}entries"));
        bench_pass(
            &mut group,
            id,
            fleet.clone(),
            (state.clone(), obs.clone(), now),
        );
        let id = BenchmarkId::new("warm", format!("{n_tpus}tpus/{n_entries}entries"));
        let engine = Engine::new(fleet, EngineConfig::default(), Box::new(Classic));
        let (mut state, mut obs) = (state, obs);
        group.bench_function(id, |b| {
            b.iter(|| {
                obs.report_changes = Some(ReportChanges {
                    since: obs.serial,
                    attempts: Vec::new(),
                });
                obs.serial += 1;
                engine.reconcile(&mut state, &obs, now)
            })
        });
    }
    group.finish();
}

/// What `plan` computes on a snapshot: one pass, then why each still-pending job waits, at
/// 4k, 20k and 100k pending jobs (one idle TPU per ten jobs). Linear: what depends on a
/// job's requirement is worked out once per class, and every list a reason names is bounded.
fn plan_explain(c: &mut Criterion) {
    use tpu_runner::engine::explain::explain;
    let epoch = Timestamp::from_secs(1_767_225_600);
    let mut group = c.benchmark_group("plan_explain");
    group.sample_size(10);
    for (n_jobs, n_entries) in [(4_000usize, 100usize), (20_000, 200), (100_000, 500)] {
        let n_idle = n_jobs / 10;
        let count = (n_idle / n_entries + 1) as u32;
        let fleet = synthetic::fleet(n_entries, count);
        let (state, obs) = synthetic::planning_instance(&fleet, n_jobs, n_idle, epoch);
        let engine = Engine::new(fleet, EngineConfig::default(), Box::new(Classic));
        let now = epoch.plus_secs(100_000);
        group.bench_function(BenchmarkId::new("jobs", n_jobs), |b| {
            b.iter_batched(
                || state.clone(),
                |mut s| {
                    let out = engine.reconcile_from_scratch(&mut s, &obs, now);
                    let waiting = explain(engine.index(), &s, &obs, &out, now);
                    (waiting, s)
                },
                BatchSize::LargeInput,
            )
        });
    }
    group.finish();
}

fn sightings(c: &mut Criterion) {
    use std::sync::Arc;
    use tpu_runner::engine::observe::NodeState;
    use tpu_runner::engine::sightings::changes;
    let epoch = Timestamp::from_secs(1_767_225_600);
    let mut group = c.benchmark_group("sightings");
    group.sample_size(20);
    for (n_entries, count) in [(500usize, 4u32), (2_000, 5)] {
        let fleet = synthetic::fleet(n_entries, count);
        let (_, obs, now) = synthetic::running_instance(&fleet, n_entries * count as usize, epoch);
        let before = (obs.nodes.clone(), obs.queued_resources.clone());
        let n = before.0.len();
        assert_eq!(n, n_entries * count as usize);
        let mut changed = before.clone();
        for node in changed.0.iter_mut().step_by(100) {
            let mut other = (**node).clone();
            other.state = NodeState::Preempted;
            *node = Arc::new(other);
        }
        let fresh = (
            before
                .0
                .iter()
                .map(|n| Arc::new((**n).clone()))
                .collect::<Vec<_>>(),
            before
                .1
                .iter()
                .map(|q| Arc::new((**q).clone()))
                .collect::<Vec<_>>(),
        );
        for (label, after) in [
            ("unchanged", &before),
            ("1pct_changed", &changed),
            ("fresh_equal", &fresh),
        ] {
            group.bench_function(BenchmarkId::new(label, format!("{n}tpus")), |b| {
                b.iter(|| changes((&before.0, &before.1), (&after.0, &after.1), now))
            });
        }
    }
    group.finish();
}

criterion_group!(benches, planning_pass, steady_pass, plan_explain, sightings);
criterion_main!(benches);
