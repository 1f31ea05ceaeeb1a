//! One controller pass as production runs it (`Controller::pass`: renew the lease, read the
//! store, observe, reconcile, commit, act) on a store of 50,000 active jobs, against a cloud
//! that does not change: with nothing changed since the last pass, and with 100 jobs changed
//! by a command (a priority change) before each pass. The store keeps what it read between
//! passes and reads only what changed (`StateStore::load_changes`); a whole load of the
//! active set, what every pass cost before, is measured beside it. SQLite always; the
//! Firestore emulator too when `FIRESTORE_EMULATOR_HOST` is set. The documents each pass
//! reads and writes are printed, and Firestore's reads per day at a 30 s interval, before
//! (a whole load each pass) and after.
//!
//! Under `cargo test` (no `--bench`) a 2,000-job store shows the bench works; the sizes are
//! for `cargo bench`.

use std::time::{Duration, Instant};

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use tpu_runner::backend::{BackendError, CloudBackend, InFlight, Inventory, Outcome, Refreshed};
use tpu_runner::controller::{Controller, Pass, Settings};
use tpu_runner::engine::observe::{Action, AttemptReport};
use tpu_runner::engine::{
    Engine, EngineConfig, InventoryScope, Observation, Timestamp, policy, synthetic,
};
use tpu_runner::spec::{Name, NameMap, Priority};
use tpu_runner::store::firestore::{FirestoreStore, endpoint_from_env};
use tpu_runner::store::sqlite::SqliteStore;
use tpu_runner::store::{Io, StateStore};

const T0: Timestamp = Timestamp::from_secs(1_767_225_600);

/// A cloud that stays as it is: the TPUs of the observation it was made with, every launch
/// acknowledged, every launched attempt's workers beating.
struct Steady {
    observation: Observation,
}

impl CloudBackend for Steady {
    fn inventory(
        &mut self,
        _scope: &InventoryScope<'_>,
        _now: Timestamp,
        inventory: &mut Inventory,
    ) -> Result<(), BackendError> {
        if inventory.nodes.is_empty() {
            inventory.nodes = self.observation.nodes.clone();
            inventory.queued_resources = self.observation.queued_resources.clone();
        }
        Ok(())
    }

    fn refresh_reports(
        &mut self,
        in_flight: &[InFlight],
        reports: &mut NameMap<AttemptReport>,
        now: Timestamp,
    ) -> Result<Refreshed, BackendError> {
        let mut changed = Vec::new();
        let live: tpu_runner::spec::NameSet = in_flight.iter().map(|f| f.attempt).collect();
        reports.retain(|id, _| live.contains(id));
        for f in in_flight {
            if let std::collections::hash_map::Entry::Vacant(slot) = reports.entry(f.attempt) {
                slot.insert(AttemptReport {
                    launched: true,
                    heartbeat_at: Some(T0),
                    beating: true,
                    ..AttemptReport::default()
                });
                changed.push(f.attempt);
            }
        }
        Ok(Refreshed {
            read_at: now,
            changed: Some(changed),
        })
    }

    fn execute(&mut self, actions: &[Action], _now: Timestamp) -> Vec<Outcome> {
        actions.iter().map(|_| Outcome::Done).collect()
    }
}

/// `n_jobs` pending jobs and 1,000 idle TPUs (10 per entry, every entry at its count) in
/// `store`, and a controller over it that has run until its passes change nothing.
fn settled(mut store: Box<dyn StateStore>, n_jobs: usize) -> Controller {
    let fleet = synthetic::fleet(100, 10);
    let (state, observation) = synthetic::planning_instance(&fleet, n_jobs, 1_000, T0);
    store.import(&state).expect("import");
    store.set_epoch("e1", T0).expect("epoch");
    let engine = Engine::new(fleet, EngineConfig::default(), Box::new(policy::Classic));
    let settings = Settings {
        owner: "bench".into(),
        epoch: "e1".into(),
        lease_ttl_secs: 10 * 365 * 86_400,
        interval: Duration::from_secs(30),
        exit_when_idle: false,
        wait_for_lease: false,
    };
    let mut controller = Controller::new(engine, store, Box::new(Steady { observation }), settings);
    for k in 0..30 {
        match controller.pass(T0.plus_secs(k)).expect("pass") {
            Pass::Done { events, io, .. } if events.is_empty() && io.writes <= 4 => {
                return controller;
            }
            _ => {}
        }
    }
    panic!("the controller never settled");
}

/// Runs one pass at `now`; its store reads and writes.
fn pass(controller: &mut Controller, now: Timestamp) -> Io {
    match controller.pass(now).expect("pass") {
        Pass::Done { io, .. } => io,
        other => panic!("not a committed pass: {other:?}"),
    }
}

/// Changes the priority of 100 pending jobs through `commands` (a second store handle, as
/// `tpu-runner set-priority` would), alternating between high and low each round.
fn command_writes(commands: &mut dyn StateStore, ids: &[Name], round: u64) {
    let priority = if round.is_multiple_of(2) {
        Priority::High
    } else {
        Priority::Low
    };
    for id in ids {
        commands
            .reprioritize(id, priority, T0.plus_secs(round as i64))
            .expect("reprioritize");
    }
}

/// The benches of one store: a quiet pass, a pass after 100 command writes, and a whole
/// load of the active set (what every pass read before).
fn bench_store(
    c: &mut Criterion,
    group_name: &str,
    n_jobs: usize,
    open: &dyn Fn() -> Box<dyn StateStore>,
) {
    let started = Instant::now();
    let mut controller = settled(open(), n_jobs);
    eprintln!(
        "{group_name}: {n_jobs} jobs stored and settled in {:.1} s",
        started.elapsed().as_secs_f64()
    );
    let mut commands = open();
    let loaded = commands.load_active().expect("load");
    let whole_load = commands.take_io();
    let pending: Vec<Name> = loaded
        .state
        .jobs
        .values()
        .filter(|j| j.current_attempt.is_none())
        .take(100)
        .map(|j| j.id)
        .collect();
    drop(loaded);
    let mut now = T0.plus_secs(100);
    let quiet = pass(&mut controller, now);
    command_writes(&mut *commands, &pending, 0);
    now = now.plus_secs(1);
    let busy = pass(&mut controller, now);
    let per_day = 86_400 / 30;
    eprintln!(
        "{group_name}: documents per pass at {n_jobs} active jobs: a whole load reads {}; a quiet pass reads {} and writes {}; after 100 jobs changed, {} and {}",
        whole_load.reads, quiet.reads, quiet.writes, busy.reads, busy.writes
    );
    eprintln!(
        "{group_name}: reads per day at a 30 s interval: {:.1} million with a whole load each pass, {} with deltas when nothing changes",
        (whole_load.reads + quiet.reads) as f64 * per_day as f64 / 1e6,
        quiet.reads * per_day
    );
    let mut group = c.benchmark_group(group_name);
    group.sample_size(10);
    group.bench_function(BenchmarkId::new("pass_nothing_changed", n_jobs), |b| {
        b.iter(|| {
            now = now.plus_secs(1);
            pass(&mut controller, now)
        })
    });
    let mut round = 1;
    group.bench_function(BenchmarkId::new("pass_100_jobs_changed", n_jobs), |b| {
        b.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            for _ in 0..iters {
                round += 1;
                command_writes(&mut *commands, &pending, round);
                now = now.plus_secs(1);
                let started = Instant::now();
                pass(&mut controller, now);
                total += started.elapsed();
            }
            total
        })
    });
    group.bench_function(BenchmarkId::new("whole_load_before", n_jobs), |b| {
        b.iter(|| commands.load_active().expect("load").state.jobs.len())
    });
    group.finish();
}

fn full_size() -> bool {
    std::env::args().any(|a| a == "--bench")
}

fn sqlite(c: &mut Criterion) {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("pass.db");
    let n = if full_size() { 50_000 } else { 2_000 };
    bench_store(c, "controller_pass_sqlite", n, &|| {
        Box::new(SqliteStore::open(&path).expect("open"))
    });
}

fn firestore(c: &mut Criterion) {
    if std::env::var("FIRESTORE_EMULATOR_HOST").is_err() {
        eprintln!(
            "firestore controller pass skipped: set FIRESTORE_EMULATOR_HOST to run it against the emulator"
        );
        return;
    }
    let runner = format!("pass{}", std::process::id());
    let n = if full_size() { 50_000 } else { 2_000 };
    bench_store(c, "controller_pass_firestore_emulator", n, &|| {
        Box::new(
            FirestoreStore::open("demo-tpu-runner", "(default)", &runner, endpoint_from_env())
                .expect("open"),
        )
    });
}

criterion_group!(benches, sqlite, firestore);
criterion_main!(benches);
