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
                model,
                reservation,
            } => Some(Action::CreateQueuedResource {
                name: format!("{name}-x").into(),
                node_id: format!("{node_id}-x").into(),
                zone: *zone,
                tpu_type: tpu_type.clone(),
                runtime: runtime.clone(),
                entry_id: *entry_id,
                model: *model,
                reservation: reservation.clone(),
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
        // The default policy over 150 seeds, each policy option over 50.
        for label in &s.policies {
            let seeds = if label == "classic" { 150 } else { 50 };
            let (mut cooled, mut displacing, mut moved) = (0u64, 0u64, 0u64);
            let mut off_spot = 0u64;
            let index = tpu_runner::engine::FleetIndex::new(s.fleet.clone());
            for seed in 1..=seeds {
                // Counts the passes that saw a pool cooling (the memory is exercised) and those
                // that saw a displacement under way (priority preemption is) or a job moved
                // to another region (the region move is).
                let mut watch = |state: &mut State, _: &mut Vec<Action>, now: Timestamp| {
                    cooled += u64::from(state.pools.values().any(|m| m.cooling(now)));
                    displacing += u64::from(state.jobs.values().any(|j| {
                        j.attempt()
                            .is_some_and(|a| a.displaced_by.is_some() && !a.status.is_terminal())
                    }));
                    moved += u64::from(
                        state
                            .jobs
                            .values()
                            .any(|j| j.placement.as_ref().is_some_and(|p| p.since.is_some())),
                    );
                    // A job runs on a managed TPU that is not Spot (the fallback is).
                    off_spot += u64::from(state.resources.values().any(|r| {
                        r.is_busy()
                            && !r.adopted
                            && index.owns_record(r).is_some_and(|e| {
                                index.entry(e).provisioning_model
                                    != tpu_runner::spec::ProvisioningModel::Spot
                            })
                    }));
                };
                let hooks = Hooks {
                    mutator: Some(&mut watch),
                    ..Hooks::default()
                };
                match harness::run(&s, label, seed, chaos(&s), hooks) {
                    Ok(r) => {
                        for (k, v) in r.metrics.faults {
                            *faults.entry(k).or_default() += v;
                        }
                    }
                    Err(v) => panic!(
                        "{rel} {label} seed {seed}: {} at {} s\nreplay: tpu-runner simulate {rel} --policy {label} --chaos --seed {seed}",
                        v.message, v.at_s
                    ),
                }
            }
            let policy = s.policy(label).expect("listed");
            assert_eq!(
                cooled > 0,
                policy.stockout.enabled(),
                "{rel} {label}: passes with a pool cooling: {cooled}"
            );
            assert_eq!(
                displacing > 0,
                policy.priority_preemption.enabled(),
                "{rel} {label}: passes with a displacement under way: {displacing}"
            );
            assert_eq!(
                moved > 0,
                policy.region_move.enabled(),
                "{rel} {label}: passes with a job moved to another region: {moved}"
            );
            let falls_back = index.has_fallback
                && (policy.fallback.on_demand_after_secs.is_some()
                    || policy.fallback.reserved_after_secs.is_some());
            assert_eq!(
                off_spot > 0,
                falls_back,
                "{rel} {label}: passes with a job on on-demand or reserved capacity: {off_spot}"
            );
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

/// Regression (long sweep, chaos-mixed seed 252 with `dstack-offers`): a job that could run
/// on Spot or on-demand in one zone waited for ever. Its Spot pool cooled for a minute, so the
/// policy asked for the on-demand TPU and gave up the Spot request; the cooldown ended while
/// the on-demand TPU was still being created, so it went back to Spot and deleted the granted
/// on-demand request, and so on every minute. A granted TPU is now kept for the job.
#[test]
fn dstack_offers_keeps_a_granted_tpu_for_its_job() {
    let rel = "scenarios/chaos/mixed.yaml";
    let s = load(rel);
    let seed = 252;
    if let Err(v) = harness::run(&s, "dstack-offers", seed, chaos(&s), Hooks::default()) {
        panic!(
            "{rel} dstack-offers seed {seed}: {} at {} s\nreplay: tpu-runner simulate {rel} --policy dstack-offers --chaos --seed {seed}",
            v.message, v.at_s
        );
    }
}

/// The controller's state kept in SQLite (every pass reads what changed and commits to it; a
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

/// What the controller saw the cloud do is in the store's events, with times, in the order
/// it happened: each node and queued resource goes from the state it was last seen in
/// (`from=` is the previous event's `to=`; a restarted controller's first sightings have
/// none), requests are granted (ACTIVE) and fail (FAILED,
/// with the cloud's reason), nodes become READY and are preempted, and what vanishes says so.
#[test]
fn the_store_keeps_what_the_controller_saw_the_cloud_do() {
    use std::collections::HashMap;
    use tpu_runner::engine::sightings::{self, NODE_STATE, NODE_VANISHED, QR_STATE, QR_VANISHED};
    use tpu_runner::store::StateStore;
    let s = load("scenarios/chaos/mixed.yaml");
    let dir = tempfile::tempdir().unwrap();
    let mut store =
        tpu_runner::store::sqlite::SqliteStore::open(&dir.path().join("state.db")).unwrap();
    harness::run(
        &s,
        "classic",
        1,
        chaos(&s),
        Hooks {
            store: Some(&mut store),
            ..Hooks::default()
        },
    )
    .unwrap_or_else(|v| panic!("seed 1: {}", v.message));
    let mut events = Vec::new();
    loop {
        let after = events.last().map_or(0, |(seq, _)| *seq);
        let page = store.events_after(after, 1000).unwrap();
        if page.is_empty() {
            break;
        }
        events.extend(page);
    }
    let mut last: HashMap<(&str, String), String> = HashMap::new();
    let mut seen: HashMap<String, usize> = HashMap::new();
    let mut at = Timestamp(0);
    for (_, e) in &events {
        assert!(e.at >= at, "events go forward in time: {e:?}");
        at = e.at;
        let side = match e.kind.as_str() {
            NODE_STATE | NODE_VANISHED => "node",
            QR_STATE | QR_VANISHED => "qr",
            _ => continue,
        };
        let f: HashMap<&str, &str> = sightings::fields(&e.detail).collect();
        let key = (side, e.resource_id.unwrap().to_string());
        // A restarted controller saw nothing before: its first sightings have no `from=`.
        if let Some(from) = f.get("from") {
            assert_eq!(
                Some(from.to_string()),
                last.get(&key).cloned(),
                "{e:?} follows the last state seen"
            );
        }
        assert!(f.contains_key("zone") && f.contains_key("type"), "{e:?}");
        match f.get("to") {
            Some(to) => {
                *seen.entry(format!("{side} {to}")).or_default() += 1;
                last.insert(key, to.to_string());
            }
            None => {
                assert!(e.kind.ends_with("_vanished"), "{e:?}");
                *seen.entry(format!("{side} vanished")).or_default() += 1;
                last.remove(&key);
            }
        }
        if f.get("to") == Some(&"FAILED") {
            assert_eq!(
                f.get("reason"),
                Some(&tpu_runner_sim::QR_FAILED_MESSAGE),
                "{e:?}"
            );
        }
    }
    for what in [
        "node READY",
        "node PREEMPTED",
        "node vanished",
        "qr ACTIVE",
        "qr FAILED",
        "qr vanished",
    ] {
        assert!(
            seen.get(what).copied().unwrap_or(0) > 0,
            "never saw {what}: {seen:?}"
        );
    }
    eprintln!("{} events; sightings {seen:?}", events.len());
}
