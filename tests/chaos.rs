//! Chaos testing: the invariant checkers catch deliberately broken engines (and the failure
//! replays exactly from its seed), and a short sweep of seeds with every fault injector on
//! finds no violation. The long sweep is `tpu-runner simulate --chaos --seeds 1..=5000
//! scenarios/chaos/*.yaml` (README, "Chaos testing").

use std::path::PathBuf;

use tpu_runner::engine::Action;
use tpu_runner::engine::Timestamp;
use tpu_runner::engine::state::{JobStatus, State};
use tpu_runner::simulate::harness::{self, Hooks, RunOptions};
use tpu_runner::simulate::scenario::{self, Scenario};

fn load(rel: &str) -> Scenario {
    scenario::load(&PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(rel))
        .unwrap_or_else(|e| panic!("{e}"))
}

fn chaos(s: &Scenario) -> RunOptions {
    RunOptions {
        chaos: s.chaos,
        check_invariants: true,
        ..RunOptions::default()
    }
}

/// Runs `seed` with a sabotaged engine; returns the violation message (or None).
fn sabotaged(
    s: &Scenario,
    seed: u64,
    mut sabotage: impl FnMut(&mut State, &mut Vec<Action>, Timestamp),
) -> Option<(String, f64)> {
    let mut mutator = |st: &mut State, a: &mut Vec<Action>, now: Timestamp| sabotage(st, a, now);
    let hooks = Hooks {
        mutator: Some(&mut mutator),
        ..Hooks::default()
    };
    harness::run(
        s,
        "classic",
        seed,
        RunOptions {
            check_invariants: true,
            ..RunOptions::default()
        },
        hooks,
    )
    .err()
    .map(|v| (v.message, v.at_s))
}

/// Double assignment: every launch is repeated for a second, made-up attempt on the same TPU.
fn double_assignment(_: &mut State, actions: &mut Vec<Action>, _: Timestamp) {
    let extra: Vec<Action> = actions
        .iter()
        .filter_map(|a| match a {
            Action::Launch(l) => {
                let mut twin = l.clone();
                twin.attempt_id = format!("{}-twin", twin.attempt_id).into();
                Some(Action::Launch(twin))
            }
            _ => None,
        })
        .collect();
    actions.extend(extra);
}

/// Ignoring chip limits: every capacity request is doubled onto the next ordinal name.
fn ignore_limits(_: &mut State, actions: &mut Vec<Action>, _: Timestamp) {
    let extra: Vec<Action> = actions
        .iter()
        .filter_map(|a| match a {
            Action::CreateQueuedResource {
                name,
                node_id,
                zone,
                tpu_type,
                runtime,
                entry_id,
            } => Some(Action::CreateQueuedResource {
                name: format!("{name}-x").into(),
                node_id: format!("{node_id}-x").into(),
                zone: *zone,
                tpu_type: tpu_type.clone(),
                runtime: runtime.clone(),
                entry_id: *entry_id,
            }),
            _ => None,
        })
        .collect();
    actions.extend(extra);
}

/// Dropping a retried job: a requeued job (pending with attempts) disappears from the state.
fn drop_retried(state: &mut State, _: &mut Vec<Action>, _: Timestamp) {
    let victim = state
        .jobs
        .values()
        .find(|j| j.status == JobStatus::Pending && !j.attempts.is_empty())
        .map(|j| j.id);
    if let Some(id) = victim {
        state.jobs.remove(&id);
    }
}

#[test]
fn invariants_catch_broken_engines_and_replay_by_seed() {
    let s = load("scenarios/chaos/mixed.yaml");
    type Sabotage = fn(&mut State, &mut Vec<Action>, Timestamp);
    let cases: [(&str, Sabotage, &str); 3] = [
        (
            "double assignment",
            double_assignment,
            "no TPU runs two attempts",
        ),
        ("ignoring chip limits", ignore_limits, "never exceeded"),
        ("dropping a retried job", drop_retried, "no job lost"),
    ];
    for (what, sabotage, expected) in cases {
        let seed = 5;
        let first = sabotaged(&s, seed, sabotage)
            .unwrap_or_else(|| panic!("{what} was not caught (seed {seed})"));
        assert!(
            first.0.contains(expected),
            "{what}: caught as {:?}",
            first.0
        );
        let replay = sabotaged(&s, seed, sabotage).expect("replays");
        assert_eq!(
            first, replay,
            "{what}: seed {seed} did not replay identically"
        );
    }
    // And the unsabotaged engine passes the same seed.
    assert!(sabotaged(&s, 5, |_, _, _| {}).is_none());
}

#[test]
fn short_sweep_with_every_fault_finds_nothing() {
    for rel in [
        "scenarios/chaos/mixed.yaml",
        "scenarios/chaos/trc-adopted.yaml",
    ] {
        let s = load(rel);
        let mut faults = std::collections::BTreeMap::<String, u64>::new();
        for seed in 1..=150 {
            match harness::run(&s, "classic", seed, chaos(&s), Hooks::default()) {
                Ok(r) => {
                    for (k, v) in r.metrics.faults {
                        *faults.entry(k).or_default() += v;
                    }
                }
                Err(v) => panic!(
                    "{rel} seed {seed}: {} at {} s\nreplay: tpu-runner simulate {rel} --seed {seed}",
                    v.message, v.at_s
                ),
            }
        }
        // Every injector fired at least once over the sweep.
        for kind in [
            "api_rate_limited",
            "api_lost_reply",
            "qr_failed",
            "node_vanished",
            "status_lost",
            "workers_died_silently",
            "stale_observation",
            "crash_before_commit",
            "crash_before_acting",
            "crash_while_acting",
            "stale_controller",
        ] {
            assert!(
                faults.get(kind).copied().unwrap_or(0) > 0,
                "{rel}: fault {kind} never fired: {faults:?}"
            );
        }
    }
}

/// The controller's state kept in SQLite (every pass loads from it and commits to it; a
/// crashed controller knows only what the store holds) gives the same run as in memory:
/// the same events, metrics and final state, with crashes before commit, before acting and
/// while acting, and a stale controller fenced by the store itself.
#[test]
fn a_controller_on_sqlite_runs_exactly_as_in_memory() {
    let s = load("scenarios/chaos/mixed.yaml");
    let mut crashes = 0;
    for seed in 1..=4 {
        let memory = harness::run(&s, "classic", seed, chaos(&s), Hooks::default())
            .unwrap_or_else(|v| panic!("seed {seed} in memory: {}", v.message));
        let dir = tempfile::tempdir().unwrap();
        let mut store =
            tpu_runner::store::sqlite::SqliteStore::open(&dir.path().join("state.db")).unwrap();
        let stored = harness::run(
            &s,
            "classic",
            seed,
            chaos(&s),
            Hooks {
                store: Some(&mut store),
                ..Hooks::default()
            },
        )
        .unwrap_or_else(|v| {
            panic!(
                "seed {seed} on SQLite: {} at {} s\nreplay: cargo test --test chaos a_controller_on_sqlite",
                v.message, v.at_s
            )
        });
        let without_wall = |r: &harness::RunResult| {
            let mut m = r.metrics.clone();
            m.wall_s = 0.0;
            format!("{m:?}")
        };
        assert_eq!(
            stored.event_hash, memory.event_hash,
            "seed {seed}: events differ"
        );
        assert_eq!(
            without_wall(&stored),
            without_wall(&memory),
            "seed {seed}: metrics differ"
        );
        assert_eq!(stored.state.jobs, memory.state.jobs, "seed {seed}");
        assert_eq!(stored.state.finished, memory.state.finished, "seed {seed}");
        assert_eq!(
            stored.state.resources, memory.state.resources,
            "seed {seed}"
        );
        crashes += [
            "crash_before_commit",
            "crash_before_acting",
            "crash_while_acting",
        ]
        .iter()
        .map(|k| memory.metrics.faults.get(*k).copied().unwrap_or(0))
        .sum::<u64>();
        // And the store holds what the run ended with.
        use tpu_runner::store::StateStore;
        let exported = store.export().unwrap();
        assert_eq!(
            exported.jobs, memory.state.jobs,
            "seed {seed}: the store's active jobs"
        );
        assert_eq!(
            exported.finished, memory.state.finished,
            "seed {seed}: the store's history"
        );
    }
    assert!(crashes > 0, "the seeds crash the controller");
}
