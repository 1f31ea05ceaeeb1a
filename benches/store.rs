//! The state store: committing a pass that changed 1, 100 or 10,000 jobs into a store
//! holding 1k or 100k jobs (the cost must follow the changes, not the size of the state),
//! and loading 100k active jobs. SQLite always; the Firestore emulator too when
//! `FIRESTORE_EMULATOR_HOST` is set (smaller sizes: every record is an HTTP round trip's
//! share of JSON), with the round trips per pass printed. Events: the bytes the event log
//! grows by per 1,000 jobs (submissions with their specs, and a simulated run of
//! `scenarios/trc-mixed.yaml` with every sighting and decision the controller records),
//! printed, and what compacting 1,000 old events costs a pass.

use std::time::Instant;

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use tpu_runner::engine::{State, Timestamp, synthetic};
use tpu_runner::store::firestore::{FirestoreStore, endpoint_from_env};
use tpu_runner::store::sqlite::SqliteStore;
use tpu_runner::store::{CommitOutcome, Fence, Loaded, StateStore};

const T0: Timestamp = Timestamp::from_secs(1_767_225_600);

fn fence() -> Fence {
    Fence {
        owner: "bench".into(),
        epoch: "e1".into(),
    }
}

/// A store holding `n` pending jobs, with the lease held.
fn filled(store: &mut dyn StateStore, n: usize) {
    let mut state = State::new();
    for job in synthetic::pending_jobs(n, T0) {
        state.jobs.insert(job.id, job);
    }
    store.import(&state).expect("import");
    store.set_epoch("e1", T0).unwrap();
    store
        .acquire_lease("bench", "e1", 10 * 365 * 86_400, T0)
        .unwrap()
        .unwrap();
}

/// Changes `k` jobs of `loaded` (a counter each pass) and commits them.
fn commit_changes(store: &mut dyn StateStore, loaded: &mut Loaded, k: usize, round: u32) {
    let ids: Vec<_> = loaded.state.jobs.keys().take(k).copied().collect();
    for id in ids {
        loaded.state.jobs.get_mut(&id).unwrap().interruptions = round;
    }
    let outcome = store
        .commit_pass(&mut loaded.base, &loaded.state, &[], &fence(), T0)
        .unwrap();
    assert_eq!(outcome, CommitOutcome::Committed);
}

fn sqlite(c: &mut Criterion) {
    let dir = tempfile::tempdir().unwrap();
    let mut group = c.benchmark_group("sqlite_commit");
    group.sample_size(10);
    for stored in [1_000usize, 100_000] {
        let mut store = SqliteStore::open(&dir.path().join(format!("{stored}.db"))).unwrap();
        filled(&mut store, stored);
        let mut loaded = store.load_active().unwrap();
        for changed in [1usize, 100, 10_000].into_iter().filter(|c| *c <= stored) {
            let mut round = 0;
            group.bench_function(
                BenchmarkId::new(format!("{stored}_jobs"), format!("{changed}_changed")),
                |b| {
                    b.iter(|| {
                        round += 1;
                        commit_changes(&mut store, &mut loaded, changed, round)
                    })
                },
            );
        }
    }
    group.finish();
    let mut group = c.benchmark_group("sqlite_load");
    group.sample_size(10);
    let mut store = SqliteStore::open(&dir.path().join("100000.db")).unwrap();
    group.bench_function("100000_active_jobs", |b| {
        b.iter(|| store.load_active().unwrap().state.jobs.len())
    });
    group.finish();
}

fn firestore(c: &mut Criterion) {
    if std::env::var("FIRESTORE_EMULATOR_HOST").is_err() {
        eprintln!(
            "firestore benches skipped: set FIRESTORE_EMULATOR_HOST to run them against the emulator"
        );
        return;
    }
    let mut group = c.benchmark_group("firestore_emulator_commit");
    group.sample_size(10);
    for stored in [1_000usize] {
        let runner = format!("bench{}", std::process::id());
        let mut store =
            FirestoreStore::open("demo-tpu-runner", "(default)", &runner, endpoint_from_env())
                .unwrap();
        filled(&mut store, stored);
        let started = Instant::now();
        let before = store.calls();
        let mut loaded = store.load_active().unwrap();
        eprintln!(
            "firestore emulator: loading {stored} jobs took {} round trips, {:.0} ms",
            store.calls() - before,
            started.elapsed().as_secs_f64() * 1000.0
        );
        for changed in [1usize, 100] {
            let mut round = 0;
            let before = store.calls();
            let started = Instant::now();
            commit_changes(&mut store, &mut loaded, changed, 1000);
            eprintln!(
                "firestore emulator: a pass changing {changed} of {stored} jobs: {} round trips, {:.0} ms",
                store.calls() - before,
                started.elapsed().as_secs_f64() * 1000.0
            );
            group.bench_function(
                BenchmarkId::new(format!("{stored}_jobs"), format!("{changed}_changed")),
                |b| {
                    b.iter(|| {
                        round += 1;
                        commit_changes(&mut store, &mut loaded, changed, round)
                    })
                },
            );
        }
    }
    group.finish();
}

/// The event log's size in bytes (as JSON) and count after `f` writes to a fresh store.
fn event_bytes(f: impl FnOnce(&mut SqliteStore)) -> (usize, usize, u64) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("events.db");
    let mut store = SqliteStore::open(&path).unwrap();
    f(&mut store);
    let (mut n, mut bytes, mut after) = (0, 0, 0);
    loop {
        let page = store.events_after(after, 1000).unwrap();
        let Some(&(last, _)) = page.last() else { break };
        after = last;
        n += page.len();
        bytes += page
            .iter()
            .map(|(_, e)| serde_json::to_string(e).unwrap().len())
            .sum::<usize>();
    }
    drop(store);
    (n, bytes, std::fs::metadata(&path).unwrap().len())
}

fn events(c: &mut Criterion) {
    use tpu_runner::simulate::{harness, scenario};
    let (n, bytes, file) = event_bytes(|store| {
        let jobs = synthetic::pending_jobs(1_000, T0);
        store.create_jobs(&jobs, T0).unwrap();
    });
    eprintln!(
        "events: submitting 1,000 jobs records {n} events, {:.0} kB of JSON ({:.0} B each; SQLite file {:.0} kB with the jobs)",
        bytes as f64 / 1e3,
        bytes as f64 / n as f64,
        file as f64 / 1e3
    );
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("scenarios/trc-mixed.yaml");
    let s = scenario::load(&path).unwrap();
    let mut jobs = 0;
    let (n, bytes, _) = event_bytes(|store| {
        let hooks = harness::Hooks {
            store: Some(store),
            ..harness::Hooks::default()
        };
        let run = harness::run(&s, "classic", 1, harness::RunOptions::default(), hooks).unwrap();
        jobs = run.metrics.jobs_submitted;
    });
    eprintln!(
        "events: a simulated run of trc-mixed ({jobs} jobs, {} h) records {n} events, {:.0} kB of JSON: {:.0} events and {:.0} kB per 1,000 jobs ({:.0} B each)",
        s.horizon_secs / 3600,
        bytes as f64 / 1e3,
        n as f64 * 1000.0 / jobs as f64,
        bytes as f64 / jobs as f64,
        bytes as f64 / n as f64
    );
    let mut group = c.benchmark_group("sqlite_events");
    group.sample_size(10);
    let dir = tempfile::tempdir().unwrap();
    let mut store = SqliteStore::open(&dir.path().join("compact.db")).unwrap();
    let mut round = 0u64;
    group.bench_function("compact_1000", |b| {
        b.iter_custom(|iters| {
            let mut total = std::time::Duration::ZERO;
            for _ in 0..iters {
                // 1,000 events past retention.
                round += 1;
                let jobs: Vec<_> = synthetic::pending_jobs(1_000, T0)
                    .into_iter()
                    .map(|mut j| {
                        j.id = tpu_runner::spec::Name::new(&format!("r{round}-{}", j.id));
                        j
                    })
                    .collect();
                store.create_jobs(&jobs, T0).unwrap();
                let started = Instant::now();
                assert_eq!(store.compact_events(T0.plus_secs(1), 1000).unwrap(), 1000);
                total += started.elapsed();
            }
            total
        })
    });
    group.finish();
}

criterion_group!(benches, sqlite, firestore, events);
criterion_main!(benches);
