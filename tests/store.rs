//! The `StateStore` conformance suite, run against every store: SQLite (always) and
//! Firestore through Google's emulator (when `FIRESTORE_EMULATOR_HOST` is set; `.ci/run`
//! starts it and sets `TPU_RUNNER_REQUIRE_EMULATORS=1`, which turns a missing emulator into a
//! failure instead of a skip). Every operation of §2.1 with its refusals, optimistic
//! concurrency between commands and passes (threads and processes), lease fencing, and crash
//! safety under SIGKILL (child processes are this test binary re-run in a child role).

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tpu_runner::engine::commands::{CancelResult, ReprioritizeResult};
use tpu_runner::engine::lease::Refusal;
use tpu_runner::engine::state::{JobStatus, Resource, ResourceStatus, State};
use tpu_runner::engine::{Engine, EngineConfig, Observation, Timestamp, policy, synthetic};
use tpu_runner::spec::{FleetSpec, Name, Priority};
use tpu_runner::store::firestore::{Endpoint, FirestoreStore, endpoint_from_env};
use tpu_runner::store::sqlite::SqliteStore;
use tpu_runner::store::{
    CommitOutcome, CreateResult, Fence, InterruptResult, Loaded, StateStore, apply_delta,
};

const T0: Timestamp = Timestamp::from_secs(1_767_225_600);

/// A store under test and how to open it again (from another thread or process).
#[derive(Clone, Debug)]
enum Where {
    Sqlite(PathBuf),
    Firestore { runner: String },
}

impl Where {
    fn open(&self) -> Box<dyn StateStore> {
        match self {
            Where::Sqlite(path) => Box::new(SqliteStore::open(path).expect("open sqlite")),
            Where::Firestore { runner } => Box::new(
                FirestoreStore::open("demo-tpu-runner", "(default)", runner, endpoint_from_env())
                    .expect("open firestore emulator"),
            ),
        }
    }

    fn env(&self) -> (String, String) {
        match self {
            Where::Sqlite(path) => ("sqlite".into(), path.display().to_string()),
            Where::Firestore { runner } => ("firestore".into(), runner.clone()),
        }
    }

    fn from_env(kind: &str, arg: &str) -> Where {
        match kind {
            "sqlite" => Where::Sqlite(arg.into()),
            _ => Where::Firestore { runner: arg.into() },
        }
    }
}

fn unique(name: &str) -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .subsec_nanos();
    format!("{name}-{}-{n}-{nanos}", std::process::id())
}

/// Every store this machine can test: SQLite in a temporary folder, and the Firestore
/// emulator when it runs. `dir` keeps the SQLite file alive for the test.
fn stores(test: &str, dir: &Path) -> Vec<Where> {
    let mut out = vec![Where::Sqlite(dir.join(format!("{test}.db")))];
    match std::env::var("FIRESTORE_EMULATOR_HOST") {
        Ok(host) if !host.is_empty() => out.push(Where::Firestore {
            runner: unique(test).replace('_', "-"),
        }),
        _ if std::env::var("TPU_RUNNER_REQUIRE_EMULATORS").is_ok_and(|v| v == "1") => {
            panic!(
                "FIRESTORE_EMULATOR_HOST is not set but TPU_RUNNER_REQUIRE_EMULATORS=1: start the Firestore emulator (see .ci/run)"
            )
        }
        _ => eprintln!(
            "{test}: Firestore emulator not running, testing SQLite only (start it as .ci/run does and set FIRESTORE_EMULATOR_HOST=127.0.0.1:8086)"
        ),
    }
    out
}

fn fleet() -> FleetSpec {
    synthetic::fleet(6, 2)
}

fn engine() -> Engine {
    Engine::new(fleet(), EngineConfig::default(), Box::new(policy::Classic))
}

/// The fleet's idle TPUs, ready: a state to import and the observation that shows them.
fn planning(jobs: usize) -> (State, Observation) {
    synthetic::planning_instance(&fleet(), jobs, usize::MAX, T0)
}

fn fence() -> Fence {
    Fence {
        owner: "controller-a".into(),
        epoch: "e1".into(),
    }
}

fn hold_lease(store: &mut dyn StateStore, now: Timestamp) {
    store.set_epoch("e1", now).unwrap();
    store
        .acquire_lease("controller-a", "e1", 900, now)
        .unwrap()
        .expect("lease");
}

/// A store holding the fleet's idle TPUs and `jobs` pending jobs, its lease held by
/// `fence()`; and the observation showing those TPUs ready.
fn seeded(at: &Where, jobs: usize) -> (Box<dyn StateStore>, Observation) {
    let mut store = at.open();
    let (state, obs) = planning(jobs);
    store.import(&state).unwrap();
    hold_lease(&mut *store, T0);
    (store, obs)
}

/// A pass of the real engine on the stored state, committed.
fn pass(
    store: &mut dyn StateStore,
    engine: &Engine,
    obs: &Observation,
    now: Timestamp,
) -> CommitOutcome {
    let Loaded {
        mut state,
        mut base,
    } = store.load_active().unwrap();
    let out = engine.reconcile(&mut state, obs, now);
    assert!(out.violations.is_empty(), "{:?}", out.violations);
    store
        .commit_pass(&mut base, &state, &out.events, &fence(), now)
        .unwrap()
}

fn jobs(ids: &[&str]) -> Vec<tpu_runner::engine::state::Job> {
    let mut all = synthetic::pending_jobs(ids.len(), T0);
    for (job, id) in all.iter_mut().zip(ids) {
        job.spec.id = (*id).into();
        job.id = Name::new(id);
    }
    all
}

/// Checks what a store must always hold: ownership points both ways, every current attempt
/// exists, no TPU runs two attempts.
fn consistent(state: &State) -> Result<(), String> {
    for r in state.resources.values() {
        if let Some(owner) = &r.owner {
            let job = state.jobs.get(&owner.job_id).ok_or(format!(
                "{} owned by missing active job {}",
                r.id, owner.job_id
            ))?;
            if job.assigned_resource != Some(r.id) || job.current_attempt != Some(owner.attempt_id)
            {
                return Err(format!(
                    "{} owned by {} which does not point back",
                    r.id, job.id
                ));
            }
        } else if r.status == ResourceStatus::Busy {
            return Err(format!("{} busy without owner", r.id));
        }
    }
    for job in state.jobs.values() {
        if let Some(a) = job.current_attempt
            && !job.attempts.iter().any(|x| x.id == a)
        {
            return Err(format!("{}: current attempt {a} missing", job.id));
        }
        if let Some(res) = job.assigned_resource {
            let r = state
                .resources
                .get(&res)
                .ok_or(format!("{}: resource {res} missing", job.id))?;
            if r.owner.as_ref().map(|o| o.job_id) != Some(job.id) {
                return Err(format!(
                    "{}: assigned to {res} which does not own it",
                    job.id
                ));
            }
        }
    }
    Ok(())
}

// ----- §2.1 operations -----------------------------------------------------------------

#[test]
fn create_jobs_is_all_or_none() {
    let dir = tempfile::tempdir().unwrap();
    for at in stores("create", dir.path()) {
        let mut store = at.open();
        let s = &mut *store;
        assert_eq!(
            s.create_jobs(&jobs(&["a", "b"]), T0).unwrap(),
            CreateResult::Created,
            "{at:?}"
        );
        assert_eq!(
            s.create_jobs(&jobs(&["c", "b", "a"]), T0).unwrap(),
            CreateResult::Exist(vec!["a".into(), "b".into()]),
            "{at:?}"
        );
        assert!(
            s.job(&"c".into()).unwrap().is_none(),
            "{at:?}: nothing of a refused batch is written"
        );
        assert_eq!(
            s.create_jobs(&jobs(&["d", "d"]), T0).unwrap(),
            CreateResult::Exist(vec!["d".into()]),
            "{at:?}: duplicates within one batch"
        );
        let stored = s.job(&"a".into()).unwrap().expect("created");
        assert_eq!(
            stored,
            jobs(&["a"]).remove(0),
            "{at:?}: a job reads back as written"
        );
        assert_eq!(s.load_active().unwrap().state.jobs.len(), 2, "{at:?}");
        // What submit asks before uploading anything: which ids are taken already.
        let ids: Vec<Name> = ["c", "b", "a", "b"].iter().map(|i| Name::new(i)).collect();
        assert_eq!(
            s.existing_jobs(&ids).unwrap(),
            vec![Name::new("a"), Name::new("b")],
            "{at:?}"
        );
        assert!(s.existing_jobs(&[]).unwrap().is_empty(), "{at:?}");
    }
}

#[test]
fn a_submission_is_recorded_with_its_spec_and_old_events_are_compacted() {
    let dir = tempfile::tempdir().unwrap();
    for at in stores("events", dir.path()) {
        let mut store = at.open();
        let s = &mut *store;
        let submitted = jobs(&["a", "b"]);
        s.create_jobs(&submitted, T0).unwrap();
        // A refused batch records nothing.
        s.create_jobs(&jobs(&["c", "a"]), T0).unwrap();
        let events = s.events_after(0, 100).unwrap();
        assert_eq!(events.len(), 2, "{at:?}: one event per created job");
        for ((_, e), job) in events.iter().zip(&submitted) {
            assert_eq!(
                (e.kind.as_str(), e.job_id, e.at),
                ("job_created", Some(job.id), T0)
            );
            let spec: tpu_runner::spec::JobSpec = serde_json::from_str(&e.detail).unwrap();
            assert_eq!(spec, job.spec, "{at:?}: the spec as submitted");
        }
        // Three generations of events, a minute apart.
        let later = |i: i64| T0.plus_secs(60 * i);
        s.create_jobs(&jobs(&["d"]), later(1)).unwrap();
        s.create_jobs(&jobs(&["e"]), later(2)).unwrap();
        assert_eq!(
            s.compact_events(T0, 100).unwrap(),
            0,
            "{at:?}: nothing is older"
        );
        // Bounded: at most `limit` of the oldest go per call.
        assert_eq!(s.compact_events(later(2), 1).unwrap(), 1, "{at:?}");
        assert_eq!(s.compact_events(later(2), 100).unwrap(), 2, "{at:?}");
        let left: Vec<_> = s.events_after(0, 100).unwrap();
        assert_eq!(left.len(), 1, "{at:?}");
        assert_eq!(
            left[0].1.job_id,
            Some(Name::new("e")),
            "{at:?}: the newest stays"
        );
        // Sequence numbers go on after a compaction.
        s.create_jobs(&jobs(&["f"]), later(3)).unwrap();
        let seqs: Vec<u64> = s
            .events_after(0, 100)
            .unwrap()
            .iter()
            .map(|e| e.0)
            .collect();
        assert!(seqs[1] > seqs[0], "{at:?}: {seqs:?}");
        assert_eq!(
            s.job(&"a".into()).unwrap().map(|j| j.id),
            Some(Name::new("a"))
        );
    }
}

/// What the daily commands read, alike on every store: a name's runs latest first, the
/// history latest ended first, and one run's events in order (after a given one).
#[test]
fn runs_by_name_the_history_and_a_runs_events() {
    let dir = tempfile::tempdir().unwrap();
    for at in stores("daily", dir.path()) {
        let mut store = at.open();
        let s = &mut *store;
        let mut runs = jobs(&["train-aaaaaa", "train-bbbbbb", "eval-cccccc", "fixed"]);
        for (k, job) in runs.iter_mut().enumerate() {
            job.submitted_at = T0.plus_secs(k as i64);
        }
        runs[0].spec.name = Some("train".into());
        runs[1].spec.name = Some("train".into());
        runs[2].spec.name = Some("eval".into());
        for (k, job) in runs.iter().enumerate() {
            s.create_jobs(std::slice::from_ref(job), T0.plus_secs(k as i64))
                .unwrap();
        }
        assert_eq!(
            s.runs_named("train", 10).unwrap(),
            vec![Name::new("train-bbbbbb"), Name::new("train-aaaaaa")],
            "{at:?}: latest submitted first"
        );
        assert_eq!(s.runs_named("train", 1).unwrap().len(), 1, "{at:?}");
        assert!(
            s.runs_named("fixed", 10).unwrap().is_empty(),
            "{at:?}: an id is no name"
        );
        assert!(s.runs_named("nope", 10).unwrap().is_empty(), "{at:?}");
        // Two runs end, a minute apart: the history lists the later first.
        for (id, secs) in [("train-aaaaaa", 120), ("eval-cccccc", 60)] {
            s.cancel_job(&Name::new(id), false, T0.plus_secs(secs))
                .unwrap();
        }
        let latest: Vec<Name> = s
            .latest_finished(T0, 10)
            .unwrap()
            .iter()
            .map(|j| j.id)
            .collect();
        assert_eq!(
            latest,
            [Name::new("train-aaaaaa"), Name::new("eval-cccccc")],
            "{at:?}"
        );
        let oldest: Vec<Name> = s
            .finished_jobs(T0, 10)
            .unwrap()
            .iter()
            .map(|j| j.id)
            .collect();
        assert_eq!(
            oldest,
            [Name::new("eval-cccccc"), Name::new("train-aaaaaa")],
            "{at:?}"
        );
        assert_eq!(
            s.latest_finished(T0.plus_secs(90), 10).unwrap().len(),
            1,
            "{at:?}"
        );
        // One run's events, in order, and only those after one already seen.
        let mine = s.job_events(&Name::new("train-aaaaaa"), 0, 100).unwrap();
        let kinds: Vec<&str> = mine.iter().map(|(_, e)| e.kind.as_str()).collect();
        assert_eq!(kinds, ["job_created", "cancel_requested"], "{at:?}");
        assert!(
            mine.iter()
                .all(|(_, e)| e.job_id == Some(Name::new("train-aaaaaa")))
        );
        let after = s
            .job_events(&Name::new("train-aaaaaa"), mine[0].0, 100)
            .unwrap();
        assert_eq!(after.len(), 1, "{at:?}");
        assert_eq!(after[0].0, mine[1].0, "{at:?}");
    }
}

/// Firestore's import claims the store first: of two imports at once into one empty
/// store, one writes and the other is refused having written nothing; a killed import
/// (its marker left `importing`) makes loads refuse the half-imported store and a second
/// import say so, with how to clear it. (SQLite imports in one transaction.)
#[test]
fn a_firestore_import_is_exclusive_and_a_half_import_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    for at in stores("import-claim", dir.path()) {
        let Where::Firestore { runner } = &at else {
            continue;
        };
        let (first, _) = planning(30);
        let mut second = State::new();
        for job in synthetic::pending_jobs(12, T0) {
            let id = Name::new(&format!("other-{}", job.id));
            let mut job = job;
            job.id = id;
            job.spec.id = id.to_string();
            second.jobs.insert(id, job);
        }
        let results: Vec<Result<(), String>> = std::thread::scope(|scope| {
            let a = scope.spawn(|| at.open().import(&first).map_err(|e| e.to_string()));
            let b = scope.spawn(|| at.open().import(&second).map_err(|e| e.to_string()));
            vec![a.join().unwrap(), b.join().unwrap()]
        });
        assert_eq!(
            results.iter().filter(|r| r.is_ok()).count(),
            1,
            "exactly one import wins: {results:?}"
        );
        let loaded = at.open().load_active().unwrap().state;
        let won = if results[0].is_ok() { &first } else { &second };
        assert_eq!(
            loaded.jobs.len(),
            won.jobs.len(),
            "one file's jobs, not both"
        );

        // A killed import: its marker says `importing`.
        let half = Where::Firestore {
            runner: format!("{runner}-half"),
        };
        let mut client = tpu_runner::gcp::firestore::Client::new(
            endpoint_from_env(),
            "demo-tpu-runner",
            "(default)",
        )
        .unwrap();
        let prefix = format!("{runner}-half").replace('-', "_");
        client
            .commit(
                &[tpu_runner::gcp::firestore::Write::Set {
                    path: format!("{prefix}_controller/import"),
                    fields: serde_json::Map::from_iter([
                        ("state".to_owned(), serde_json::json!("importing")),
                        ("jobs".to_owned(), serde_json::json!(3000)),
                    ]),
                    precondition: tpu_runner::gcp::firestore::Precondition::None,
                }],
                None,
            )
            .unwrap();
        let mut store = half.open();
        let e = store.load_active().map(|_| ()).unwrap_err().to_string();
        assert!(e.contains("did not finish") && e.contains("3000"), "{e}");
        let e = store.import(&first).unwrap_err().to_string();
        assert!(e.contains("did not finish"), "{e}");
    }
}

#[test]
fn cancel_follows_the_rules() {
    let dir = tempfile::tempdir().unwrap();
    for at in stores("cancel", dir.path()) {
        let (mut store, obs) = seeded(&at, 20);
        let s = &mut *store;
        let engine = engine();
        assert_eq!(
            pass(s, &engine, &obs, T0),
            CommitOutcome::Committed,
            "{at:?}"
        );
        let loaded = s.load_active().unwrap().state;
        let running = loaded
            .jobs
            .values()
            .find(|j| j.status == JobStatus::Running)
            .unwrap()
            .id;
        let pending = loaded
            .jobs
            .values()
            .find(|j| j.status == JobStatus::Pending)
            .unwrap()
            .id;
        let now = T0.plus_secs(10);
        assert_eq!(
            s.cancel_job(&"nope".into(), false, now).unwrap(),
            CancelResult::Unknown
        );
        assert!(
            matches!(
                s.cancel_job(&running, true, now).unwrap(),
                CancelResult::Conflict { .. }
            ),
            "{at:?}: --if-pending refuses a running job"
        );
        assert_eq!(
            s.cancel_job(&running, false, now).unwrap(),
            CancelResult::Status {
                status: JobStatus::Cancelling,
                changed: true
            }
        );
        assert_eq!(
            s.cancel_job(&running, false, now).unwrap(),
            CancelResult::Status {
                status: JobStatus::Cancelling,
                changed: false
            }
        );
        assert_eq!(
            s.cancel_job(&pending, true, now).unwrap(),
            CancelResult::Status {
                status: JobStatus::Deactivated,
                changed: true
            }
        );
        assert_eq!(
            s.cancel_job(&pending, false, now).unwrap(),
            CancelResult::Status {
                status: JobStatus::Deactivated,
                changed: false
            },
            "{at:?}: a terminal job is left as it is"
        );
        let active = s.load_active().unwrap().state;
        assert!(
            !active.jobs.contains_key(&pending),
            "{at:?}: a finished job is not loaded"
        );
        let finished = s.job(&pending).unwrap().expect("still queryable");
        assert_eq!(finished.status, JobStatus::Deactivated);
        assert_eq!(finished.ended_at, Some(now));
        assert_eq!(s.finished_jobs(T0, 10).unwrap().len(), 1, "{at:?}");
    }
}

#[test]
fn cancel_if_pending_needs_a_provably_finished_previous_attempt() {
    let dir = tempfile::tempdir().unwrap();
    for at in stores("ifpending", dir.path()) {
        let (mut store, obs) = seeded(&at, 1);
        let s = &mut *store;
        assert_eq!(pass(s, &engine(), &obs, T0), CommitOutcome::Committed);
        // Requeue the job by hand as a preemption would, but leave the TPU pointing at it:
        // a damaged or half-finished record the cancel must not trust.
        let Loaded {
            mut state,
            mut base,
        } = s.load_active().unwrap();
        let id = *state.jobs.keys().next().unwrap();
        let resource = state.jobs.get(&id).unwrap().assigned_resource.unwrap();
        {
            let job = state.jobs.get_mut(&id).unwrap();
            let now = T0.plus_secs(5);
            job.attempt_mut()
                .unwrap()
                .end(
                    tpu_runner::engine::state::AttemptStatus::Interrupted,
                    tpu_runner::engine::state::EndReason::Preempted,
                    None,
                    "",
                    now,
                )
                .unwrap();
            job.transition(JobStatus::Pending, now).unwrap();
            job.assigned_resource = None;
        }
        let committed = s
            .commit_pass(&mut base, &state, &[], &fence(), T0.plus_secs(5))
            .unwrap();
        assert_eq!(committed, CommitOutcome::Committed);
        let refused = s.cancel_job(&id, true, T0.plus_secs(6)).unwrap();
        assert!(
            matches!(&refused, CancelResult::Conflict { reason } if reason.contains(resource.as_str())),
            "{at:?}: {refused:?}"
        );
        // Once the TPU is released, the cancel goes through.
        state
            .resources
            .get_mut(&resource)
            .unwrap()
            .release(ResourceStatus::Idle, T0.plus_secs(7))
            .unwrap();
        assert_eq!(
            s.commit_pass(&mut base, &state, &[], &fence(), T0.plus_secs(7))
                .unwrap(),
            CommitOutcome::Committed
        );
        assert_eq!(
            s.cancel_job(&id, true, T0.plus_secs(8)).unwrap(),
            CancelResult::Status {
                status: JobStatus::Deactivated,
                changed: true
            },
            "{at:?}"
        );
    }
}

#[test]
fn reprioritize_follows_the_rules_and_writes_its_event() {
    let dir = tempfile::tempdir().unwrap();
    for at in stores("prio", dir.path()) {
        let (mut store, obs) = seeded(&at, 20);
        let s = &mut *store;
        assert_eq!(pass(s, &engine(), &obs, T0), CommitOutcome::Committed);
        let loaded = s.load_active().unwrap().state;
        let running = loaded
            .jobs
            .values()
            .find(|j| j.status == JobStatus::Running)
            .unwrap()
            .id;
        let pending = loaded
            .jobs
            .values()
            .find(|j| j.status == JobStatus::Pending)
            .unwrap();
        let (id, old) = (pending.id, pending.spec.priority);
        let new = if old == Priority::High {
            Priority::Low
        } else {
            Priority::High
        };
        let before = s.events_after(0, 10_000).unwrap().len();
        assert_eq!(
            s.reprioritize(&"nope".into(), new, T0).unwrap(),
            ReprioritizeResult::Unknown
        );
        assert_eq!(
            s.reprioritize(&running, new, T0).unwrap(),
            ReprioritizeResult::Conflict {
                status: JobStatus::Running
            }
        );
        assert_eq!(
            s.reprioritize(&id, old, T0).unwrap(),
            ReprioritizeResult::Unchanged
        );
        assert_eq!(
            s.reprioritize(&id, new, T0).unwrap(),
            ReprioritizeResult::Reprioritized { old, new }
        );
        assert_eq!(s.job(&id).unwrap().unwrap().spec.priority, new, "{at:?}");
        let events = s.events_after(0, 10_000).unwrap();
        assert_eq!(events.len(), before + 1, "{at:?}: exactly one event");
        let (seq, last) = events.last().unwrap();
        assert_eq!(last.kind, "pending_job_reprioritized");
        assert_eq!(last.job_id, Some(id));
        assert!(s.events_after(*seq, 10).unwrap().is_empty(), "{at:?}");
    }
}

#[test]
fn interruption_requests_check_their_target() {
    let dir = tempfile::tempdir().unwrap();
    for at in stores("interrupt", dir.path()) {
        let (mut store, obs) = seeded(&at, 4);
        let s = &mut *store;
        assert_eq!(pass(s, &engine(), &obs, T0), CommitOutcome::Committed);
        let loaded = s.load_active().unwrap().state;
        let job = loaded
            .jobs
            .values()
            .find(|j| j.status == JobStatus::Running)
            .unwrap();
        let (res, attempt) = (job.assigned_resource.unwrap(), job.current_attempt.unwrap());
        let yes = |_: &Name| true;
        let no = |_: &Name| false;
        assert!(matches!(
            s.create_interruption_request(&"ghost".into(), &job.id, &attempt, &yes, T0)
                .unwrap(),
            InterruptResult::UnknownTarget(_)
        ));
        assert!(matches!(
            s.create_interruption_request(&res, &job.id, &"attempt-x".into(), &yes, T0)
                .unwrap(),
            InterruptResult::UnknownTarget(_)
        ));
        assert!(
            matches!(
                s.create_interruption_request(&res, &job.id, &attempt, &no, T0)
                    .unwrap(),
                InterruptResult::Rejected(_)
            ),
            "{at:?}: not a managed Spot entry"
        );
        let InterruptResult::Requested(req) = s
            .create_interruption_request(&res, &job.id, &attempt, &yes, T0)
            .unwrap()
        else {
            panic!("{at:?}: a valid target is requested")
        };
        assert_eq!(
            s.create_interruption_request(&res, &job.id, &attempt, &yes, T0)
                .unwrap(),
            InterruptResult::Exists(req.id)
        );
        let loaded = s.load_active().unwrap().state;
        assert_eq!(
            loaded.interruption_requests.get(&req.id),
            Some(&req),
            "{at:?}: loaded for the pass"
        );
    }
}

#[test]
fn the_lease_is_fenced_by_owner_expiry_and_epoch() {
    let dir = tempfile::tempdir().unwrap();
    for at in stores("lease", dir.path()) {
        let mut store = at.open();
        let s = &mut *store;
        assert!(
            s.set_epoch("", T0).is_err(),
            "{at:?}: an empty epoch is refused"
        );
        s.set_epoch("e1", T0).unwrap();
        let held = s.acquire_lease("a", "e1", 900, T0).unwrap().expect("free");
        assert!(matches!(
            s.acquire_lease("b", "e1", 900, T0.plus_secs(1)).unwrap(),
            Err(Refusal::Held { .. })
        ));
        assert!(
            s.acquire_lease("a", "e1", 900, T0.plus_secs(1))
                .unwrap()
                .is_ok(),
            "renewal"
        );
        assert!(
            matches!(
                s.acquire_lease("old", "e0", 900, T0.plus_secs(2000))
                    .unwrap(),
                Err(Refusal::StaleEpoch { .. })
            ),
            "{at:?}: a stale epoch never acquires, even a lapsed lease"
        );
        s.release_lease("b").unwrap();
        assert_eq!(
            s.lease().unwrap().0.map(|l| l.owner),
            Some("a".into()),
            "only the owner releases"
        );
        s.release_lease("a").unwrap();
        assert_eq!(s.lease().unwrap(), (None, Some("e1".into())));
        assert!(
            s.acquire_lease("b", "e1", 900, T0.plus_secs(3))
                .unwrap()
                .is_ok()
        );
        assert_eq!(held.owner, "a");
    }
}

#[test]
fn a_commit_is_refused_without_the_lease_of_the_current_epoch() {
    let dir = tempfile::tempdir().unwrap();
    for at in stores("fence", dir.path()) {
        let mut store = at.open();
        let s = &mut *store;
        let (state, obs) = planning(6);
        s.import(&state).unwrap();
        let engine = engine();
        let try_commit = |s: &mut dyn StateStore, fence: &Fence, now: Timestamp| {
            let Loaded {
                mut state,
                mut base,
            } = s.load_active().unwrap();
            let out = engine.reconcile(&mut state, &obs, now);
            s.commit_pass(&mut base, &state, &out.events, fence, now)
                .unwrap()
        };
        let fenced = |o: &CommitOutcome| matches!(o, CommitOutcome::Fenced { .. });
        assert!(
            fenced(&try_commit(s, &fence(), T0)),
            "{at:?}: nobody holds the lease"
        );
        hold_lease(s, T0);
        let other = Fence {
            owner: "controller-b".into(),
            epoch: "e1".into(),
        };
        assert!(fenced(&try_commit(s, &other, T0)), "{at:?}: not the holder");
        assert!(
            fenced(&try_commit(s, &fence(), T0.plus_secs(901))),
            "{at:?}: expired lease"
        );
        s.set_epoch("e2", T0.plus_secs(1)).unwrap();
        assert!(
            fenced(&try_commit(s, &fence(), T0.plus_secs(2))),
            "{at:?}: stale epoch"
        );
        let loaded = s.load_active().unwrap().state;
        assert!(
            loaded.jobs.values().all(|j| j.status == JobStatus::Pending),
            "{at:?}: nothing was written"
        );
        assert!(
            s.events_after(0, 10).unwrap().is_empty(),
            "{at:?}: no events either"
        );
    }
}

#[test]
fn a_pass_never_overwrites_a_command_write() {
    let dir = tempfile::tempdir().unwrap();
    for at in stores("conflict", dir.path()) {
        let (mut store, obs) = seeded(&at, 30);
        let s = &mut *store;
        let engine = engine();
        // A pass loads (and reads what changed since, as a controller does between passes),
        // a user cancels a job the pass assigns, the pass commits: refused.
        let Loaded {
            mut state,
            mut base,
        } = s.load_active().unwrap();
        let delta = s.load_changes(base.cursor).unwrap().expect("reaches back");
        apply_delta(&mut state, &mut base, delta);
        let out = engine.reconcile(&mut state, &obs, T0);
        let assigned = state
            .jobs
            .values()
            .find(|j| j.status == JobStatus::Running)
            .unwrap()
            .id;
        let untouched = state
            .jobs
            .values()
            .find(|j| j.status == JobStatus::Pending)
            .unwrap()
            .id;
        assert_eq!(
            s.cancel_job(&assigned, false, T0).unwrap(),
            CancelResult::Status {
                status: JobStatus::Deactivated,
                changed: true
            }
        );
        let refused = s
            .commit_pass(&mut base, &state, &out.events, &fence(), T0)
            .unwrap();
        assert_eq!(
            refused,
            CommitOutcome::Conflict {
                records: vec![format!("jobs/{assigned}")]
            },
            "{at:?}"
        );
        assert_eq!(
            s.job(&assigned).unwrap().unwrap().status,
            JobStatus::Deactivated,
            "{at:?}: the cancel stands"
        );
        let kinds: Vec<String> = s
            .events_after(0, 10)
            .unwrap()
            .into_iter()
            .map(|(_, e)| e.kind)
            .collect();
        assert_eq!(
            kinds,
            ["cancel_requested"],
            "{at:?}: a refused pass writes no event (the cancel writes its own)"
        );
        // Redone from the fresh state, the pass commits and keeps a concurrent cancel of a
        // job it did not touch.
        let Loaded {
            mut state,
            mut base,
        } = s.load_active().unwrap();
        let out = engine.reconcile(&mut state, &obs, T0);
        let still_pending: Vec<Name> = state
            .jobs
            .values()
            .filter(|j| j.status == JobStatus::Pending)
            .map(|j| j.id)
            .collect();
        let other = *still_pending
            .iter()
            .find(|id| **id != untouched)
            .unwrap_or(&untouched);
        assert_eq!(
            s.cancel_job(&other, false, T0).unwrap(),
            CancelResult::Status {
                status: JobStatus::Deactivated,
                changed: true
            }
        );
        assert_eq!(
            s.commit_pass(&mut base, &state, &out.events, &fence(), T0)
                .unwrap(),
            CommitOutcome::Committed
        );
        let stored = s.load_active().unwrap().state;
        assert!(
            !stored.jobs.contains_key(&other),
            "{at:?}: the command's write survived the pass"
        );
        assert!(!stored.jobs.contains_key(&assigned));
        assert_eq!(
            stored
                .jobs
                .values()
                .filter(|j| j.status == JobStatus::Running)
                .count(),
            state
                .jobs
                .values()
                .filter(|j| j.status == JobStatus::Running)
                .count(),
            "{at:?}"
        );
        consistent(&stored).unwrap();
        // The base moved forward with the commit; the in-memory state still believes the
        // job cancelled meanwhile is pending, so a next pass that touches it is refused
        // (and a pass that does not touch it commits).
        let out = engine.reconcile(&mut state, &obs, T0.plus_secs(30));
        match s
            .commit_pass(&mut base, &state, &out.events, &fence(), T0.plus_secs(30))
            .unwrap()
        {
            CommitOutcome::Committed => {}
            CommitOutcome::Conflict { records } => {
                assert_eq!(records, vec![format!("jobs/{other}")], "{at:?}")
            }
            fenced => panic!("{at:?}: {fenced:?}"),
        }
        assert_eq!(
            s.job(&other).unwrap().unwrap().status,
            JobStatus::Deactivated,
            "{at:?}"
        );
    }
}

#[test]
fn state_round_trips_through_export_and_import() {
    let dir = tempfile::tempdir().unwrap();
    for at in stores("export", dir.path()) {
        let mut store = at.open();
        let s = &mut *store;
        let (state, obs) = planning(12);
        s.import(&state).unwrap();
        assert!(
            s.import(&state).is_err(),
            "{at:?}: import refuses a store with records"
        );
        hold_lease(s, T0);
        assert_eq!(pass(s, &engine(), &obs, T0), CommitOutcome::Committed);
        let pending = s
            .load_active()
            .unwrap()
            .state
            .jobs
            .values()
            .find(|j| j.status == JobStatus::Pending)
            .unwrap()
            .id;
        s.cancel_job(&pending, false, T0).unwrap();
        let exported = s.export().unwrap();
        assert_eq!(exported.finished.len(), 1, "{at:?}");
        let json = serde_json::to_string(&exported).unwrap();
        let reread: State = serde_json::from_str(&json).unwrap();
        let copy = Where::Sqlite(dir.path().join(format!("copy-{}.db", unique("x"))));
        let mut other = copy.open();
        other.import(&reread).unwrap();
        assert_eq!(
            other.export().unwrap(),
            exported,
            "{at:?}: export → import → export is exact"
        );
    }
}

#[test]
fn a_long_lived_controller_commits_pass_after_pass() {
    // The base moves forward with each commit: a controller does not reload between
    // passes, and what it committed equals what a reload reads.
    let dir = tempfile::tempdir().unwrap();
    for at in stores("passes", dir.path()) {
        let (mut store, obs) = seeded(&at, 40);
        let s = &mut *store;
        let engine = engine();
        let Loaded {
            mut state,
            mut base,
        } = s.load_active().unwrap();
        for k in 0..6 {
            let now = T0.plus_secs(30 * k);
            let out = engine.reconcile(&mut state, &obs, now);
            // The stockout memory is stored with the other controller documents.
            if k % 2 == 1 {
                state.pools.insert(
                    format!("us-east1-d/v6e-8/spot-{k}"),
                    tpu_runner::engine::state::PoolMemory {
                        strikes: k as u32,
                        cool_until: Some(now.plus_secs(1800)),
                        reason: "a request waited 10m for capacity".into(),
                        ..Default::default()
                    },
                );
            }
            // So is what others hold in the fleet's zones (the pass set it from `obs`).
            if k % 3 == 1 {
                state.others = vec![tpu_runner::engine::state::OthersTpus {
                    zone: Name::new("us-east1-d"),
                    tpu_type: tpu_runner::spec::TpuType::parse("v6e-8").unwrap(),
                    model: tpu_runner::spec::ProvisioningModel::Spot,
                    count: k as u32,
                }];
            }
            assert_eq!(
                s.commit_pass(&mut base, &state, &out.events, &fence(), now)
                    .unwrap(),
                CommitOutcome::Committed
            );
            state.finished.clear();
            let stored = s.load_active().unwrap().state;
            assert_eq!(stored.others, state.others, "{at:?}: pass {k}");
            assert_eq!(stored.jobs, state.jobs, "{at:?}: pass {k}");
            assert_eq!(stored.resources, state.resources, "{at:?}: pass {k}");
            assert_eq!(stored.notices, state.notices, "{at:?}: pass {k}");
            assert_eq!(
                stored.entry_backoff, state.entry_backoff,
                "{at:?}: pass {k}"
            );
            assert_eq!(stored.pools, state.pools, "{at:?}: pass {k}");
        }
    }
}

/// The active part of a state: what a controller keeps and a load reads.
fn active(state: &State) -> (Vec<String>, Vec<String>, Vec<String>) {
    (
        state.jobs.values().map(|j| format!("{j:?}")).collect(),
        state.resources.values().map(|r| format!("{r:?}")).collect(),
        state
            .interruption_requests
            .values()
            .filter(|r| !tpu_runner::store::changes::is_closed(r))
            .map(|r| format!("{r:?}"))
            .collect(),
    )
}

/// A delta carries every writer's writes since the cursor and nothing else: commands'
/// submissions, cancels, priorities and interruption requests, another controller's pass;
/// a commit no one wrote before moves the cursor past itself; state kept in memory and
/// brought forward by deltas equals a fresh load after every step.
#[test]
fn deltas_carry_every_write_since_the_cursor() {
    let dir = tempfile::tempdir().unwrap();
    for at in stores("deltas", dir.path()) {
        let (mut store, obs) = seeded(&at, 12);
        let s = &mut *store;
        let engine = engine();
        let Loaded {
            mut state,
            mut base,
        } = s.load_active().unwrap();
        let step = |s: &mut dyn StateStore,
                    state: &mut State,
                    base: &mut tpu_runner::store::Base,
                    what: &str|
         -> (usize, usize, usize) {
            let delta = s.load_changes(base.cursor).unwrap().expect("reaches back");
            let counts = (
                delta.jobs.len(),
                delta.resources.len(),
                delta.requests.len(),
            );
            apply_delta(state, base, delta);
            let fresh = s.load_active().unwrap().state;
            assert_eq!(active(state), active(&fresh), "{at:?}: after {what}");
            assert_eq!(
                base.cursor,
                s.load_active().unwrap().base.cursor,
                "{at:?}: {what}"
            );
            counts
        };
        assert_eq!(
            step(s, &mut state, &mut base, "nothing"),
            (0, 0, 0),
            "{at:?}"
        );
        // Our own pass: committed with no one writing before, so not read back.
        let out = engine.reconcile(&mut state, &obs, T0);
        assert!(
            out.events.iter().any(|e| e.kind == "job_assigned"),
            "{at:?}"
        );
        assert_eq!(
            s.commit_pass(&mut base, &state, &out.events, &fence(), T0)
                .unwrap(),
            CommitOutcome::Committed
        );
        assert_eq!(
            step(s, &mut state, &mut base, "our pass"),
            (0, 0, 0),
            "{at:?}"
        );
        // Commands: two submissions, a cancel, a priority change, an interruption request.
        s.create_jobs(&jobs(&["d-new-1", "d-new-2"]), T0).unwrap();
        assert_eq!(step(s, &mut state, &mut base, "submit").0, 2, "{at:?}");
        let pending = state
            .jobs
            .values()
            .find(|j| j.status == JobStatus::Pending && !j.id.as_str().starts_with("d-"))
            .map(|j| j.id)
            .expect("a pending job");
        s.cancel_job(&pending, false, T0.plus_secs(1)).unwrap();
        s.reprioritize(&Name::new("d-new-1"), Priority::High, T0.plus_secs(1))
            .unwrap();
        assert_eq!(step(s, &mut state, &mut base, "cancel and priority").0, 2);
        assert!(
            !state.jobs.contains_key(&pending),
            "{at:?}: a cancelled pending job leaves"
        );
        let running = state
            .jobs
            .values()
            .find(|j| j.status == JobStatus::Running || j.current_attempt.is_some())
            .expect("a job with an attempt");
        let (tpu, job, attempt) = (
            running.assigned_resource.expect("assigned"),
            running.id,
            running.current_attempt.expect("an attempt"),
        );
        let filed = s
            .create_interruption_request(&tpu, &job, &attempt, &|_| true, T0.plus_secs(2))
            .unwrap();
        assert!(
            matches!(filed, InterruptResult::Requested(_)),
            "{at:?}: {filed:?}"
        );
        assert_eq!(step(s, &mut state, &mut base, "interrupt").2, 1, "{at:?}");
        // Another pass, then a second controller's view: its writes arrive as a delta.
        let now = T0.plus_secs(30);
        let out = engine.reconcile(&mut state, &obs, now);
        s.commit_pass(&mut base, &state, &out.events, &fence(), now)
            .unwrap();
        step(s, &mut state, &mut base, "a second pass");
        let mut other = s.load_active().unwrap();
        let out = engine.reconcile(&mut other.state, &obs, T0.plus_secs(60));
        s.commit_pass(
            &mut other.base,
            &other.state,
            &out.events,
            &fence(),
            T0.plus_secs(60),
        )
        .unwrap();
        step(s, &mut state, &mut base, "another controller's pass");
        // A cursor the store never reached: load it whole.
        assert!(
            s.load_changes(base.cursor + 1_000).unwrap().is_none(),
            "{at:?}"
        );
    }
}

/// A store written before the change sequence existed (schema 2) is migrated when opened:
/// its records keep their content, a whole load reads them, and deltas from then on carry
/// what is written after.
#[test]
fn a_store_from_before_the_change_sequence_is_migrated() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("old.db");
    {
        let mut store = SqliteStore::open(&path).unwrap();
        let (state, _) = planning(5);
        store.import(&state).unwrap();
    }
    {
        // What a schema-2 file holds: no stamps, no sequence.
        let c = rusqlite::Connection::open(&path).unwrap();
        c.execute_batch(
            "DROP INDEX jobs_changed; DROP INDEX resources_changed;
             DROP INDEX interruption_requests_changed;
             ALTER TABLE jobs DROP COLUMN changed; ALTER TABLE resources DROP COLUMN changed;
             ALTER TABLE interruption_requests DROP COLUMN changed; DROP TABLE changes;
             PRAGMA user_version = 2;",
        )
        .unwrap();
    }
    let mut store = SqliteStore::open(&path).unwrap();
    let Loaded {
        mut state,
        mut base,
    } = store.load_active().unwrap();
    assert_eq!((state.jobs.len(), base.cursor), (5, 0));
    let quiet = store.load_changes(base.cursor).unwrap().unwrap();
    assert!(quiet.jobs.is_empty() && quiet.resources.is_empty());
    store.create_jobs(&jobs(&["after-migration"]), T0).unwrap();
    let delta = store.load_changes(base.cursor).unwrap().unwrap();
    assert_eq!(delta.jobs.len(), 1);
    apply_delta(&mut state, &mut base, delta);
    assert_eq!(active(&state), active(&store.load_active().unwrap().state));
}

/// A reader that follows the store (`watch`, the dashboard) reads the whole active set once
/// and then only what changed, and always sees what a fresh load sees.
#[test]
fn a_mirror_follows_the_store_by_deltas() {
    let dir = tempfile::tempdir().unwrap();
    for at in stores("mirror", dir.path()) {
        let (mut store, _) = seeded(&at, 200);
        let s = &mut *store;
        let mut mirror = tpu_runner::store::changes::Mirror::default();
        let first = active(mirror.refresh(s).unwrap());
        assert_eq!(first, active(&s.load_active().unwrap().state), "{at:?}");
        let _ = s.take_io();
        s.create_jobs(&jobs(&["m-1", "m-2"]), T0).unwrap();
        s.cancel_job(&Name::new("m-1"), false, T0).unwrap();
        let _ = s.take_io();
        let seen = active(mirror.refresh(s).unwrap());
        let cost = s.take_io();
        assert!(
            cost.reads < 20,
            "{at:?}: a refresh after three writes read {cost:?}"
        );
        assert_eq!(seen, active(&s.load_active().unwrap().state), "{at:?}");
        assert_eq!(
            seen.0.len(),
            201,
            "{at:?}: m-2 added, m-1 cancelled before it started"
        );
    }
}

/// The store counts the documents a delta reads: what changed, not the size of the state.
#[test]
fn a_delta_reads_what_changed_not_the_state() {
    let dir = tempfile::tempdir().unwrap();
    for at in stores("delta-io", dir.path()) {
        let (mut store, _) = seeded(&at, 300);
        let s = &mut *store;
        let Loaded { base, .. } = s.load_active().unwrap();
        let whole = s.take_io();
        assert!(whole.reads >= 300, "{at:?}: {whole:?}");
        s.load_changes(base.cursor).unwrap().unwrap();
        let quiet = s.take_io();
        assert!(quiet.reads <= 8, "{at:?}: a quiet delta read {quiet:?}");
        s.create_jobs(&jobs(&["io-1", "io-2", "io-3"]), T0).unwrap();
        let _ = s.take_io();
        let delta = s.load_changes(base.cursor).unwrap().unwrap();
        assert_eq!(delta.jobs.len(), 3, "{at:?}");
        let busy = s.take_io();
        assert!(
            busy.reads <= 8 + 3 + 3,
            "{at:?}: three new jobs read as {busy:?}"
        );
    }
}

// ----- concurrency and crashes ---------------------------------------------------------

/// A child role: this binary run again with `STORE_CHILD=<role>`; it prints one JSON line
/// per operation result.
#[test]
#[ignore = "run only as a child of the concurrency and crash tests"]
fn child() {
    let Ok(role) = std::env::var("STORE_CHILD") else {
        return;
    };
    let at = Where::from_env(
        &std::env::var("STORE_KIND").unwrap(),
        &std::env::var("STORE_ARG").unwrap(),
    );
    let seed: u64 = std::env::var("STORE_SEED").unwrap().parse().unwrap();
    let mut store = at.open();
    match role.as_str() {
        "commands" => commands_child(&mut *store, seed),
        "controller" => controller_child(&mut *store, seed),
        other => panic!("unknown role {other}"),
    }
}

fn say(line: serde_json::Value) {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    writeln!(out, "{line}").unwrap();
    out.flush().unwrap();
}

/// Submits, cancels and reprioritises its own jobs (ids `c<seed>-<k>`), and tries to create
/// the jobs of others (refused), printing each result.
fn commands_child(store: &mut dyn StateStore, seed: u64) {
    for k in 0..12u64 {
        let id = format!("c{seed}-{k}");
        let dup = format!("c{}-0", (seed + 1) % 3);
        let mut batch = jobs(&[&id]);
        if k % 4 == 3 {
            batch.extend(jobs(&[&dup]));
        }
        let created = store.create_jobs(&batch, T0).unwrap();
        say(
            serde_json::json!({"op": "create", "ids": batch.iter().map(|j| j.id.as_str()).collect::<Vec<_>>(), "created": created == CreateResult::Created}),
        );
        let target = Name::new(&format!("c{seed}-{}", k / 2));
        if k % 2 == 1 {
            let r = store
                .cancel_job(&target, false, T0.plus_secs(k as i64))
                .unwrap();
            say(serde_json::json!({"op": "cancel", "id": target.as_str(), "result": r}));
        } else {
            let p = [Priority::Low, Priority::High][(k / 2 % 2) as usize];
            let r = store
                .reprioritize(&target, p, T0.plus_secs(k as i64))
                .unwrap();
            say(
                serde_json::json!({"op": "prio", "id": target.as_str(), "priority": p.as_str(), "result": r}),
            );
        }
    }
}

/// Runs engine passes for a fixed number of passes as the controller does: each pass reads
/// only what was written since the last (`load_changes`, `apply_delta`), a conflict reloads
/// the whole active set; prints each commit.
fn controller_child(store: &mut dyn StateStore, seed: u64) {
    let engine = engine();
    let (_, obs) = planning(0);
    let mut loaded = store.load_active().unwrap();
    // The marker counts on from what the store holds, so a later child's lost commits
    // cannot hide behind an earlier child's higher count.
    let from: u64 = loaded
        .state
        .notices
        .get("test:commits")
        .and_then(|v| v.parse::<u64>().ok())
        .map_or(0, |k| k + 1);
    for k in from..from + seed.max(1) * 40 {
        let now = T0.plus_secs(k as i64);
        // A controller renews its lease every pass.
        store
            .acquire_lease("controller-a", "e1", 900, now)
            .unwrap()
            .expect("the lease is ours");
        let delta = store
            .load_changes(loaded.base.cursor)
            .unwrap()
            .expect("the store's sequence only grows");
        apply_delta(&mut loaded.state, &mut loaded.base, delta);
        let out = engine.reconcile(&mut loaded.state, &obs, now);
        // A marker committed with the pass: a notice the child counts up.
        loaded
            .state
            .notices
            .insert("test:commits".into(), k.to_string());
        match store
            .commit_pass(&mut loaded.base, &loaded.state, &out.events, &fence(), now)
            .unwrap()
        {
            CommitOutcome::Committed => {
                loaded.state.finished.clear();
                say(serde_json::json!({"op": "commit", "k": k}));
            }
            CommitOutcome::Conflict { records } => {
                say(serde_json::json!({"op": "conflict", "records": records}));
                loaded = store.load_active().unwrap();
            }
            CommitOutcome::Fenced { reason } => panic!("fenced: {reason}"),
        }
    }
}

fn spawn(at: &Where, role: &str, seed: u64) -> std::process::Child {
    let (kind, arg) = at.env();
    Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "child",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
            "-q",
        ])
        .env("STORE_CHILD", role)
        .env("STORE_KIND", kind)
        .env("STORE_ARG", arg)
        .env("STORE_SEED", seed.to_string())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap()
}

fn lines(child: &mut std::process::Child) -> Vec<serde_json::Value> {
    let out = child.stdout.take().unwrap();
    BufReader::new(out)
        .lines()
        .map_while(Result::ok)
        .filter_map(|l| serde_json::from_str(&l).ok())
        .collect()
}

#[test]
fn commands_and_a_controller_in_several_processes_lose_nothing() {
    let dir = tempfile::tempdir().unwrap();
    for at in stores("concurrency", dir.path()) {
        {
            let mut s = at.open();
            let (state, _) = planning(0);
            s.import(&state).unwrap();
            hold_lease(&mut *s, T0);
        }
        let mut children: Vec<_> = (0..3).map(|seed| spawn(&at, "commands", seed)).collect();
        let mut controller = spawn(&at, "controller", 2);
        let outputs: Vec<Vec<serde_json::Value>> = children.iter_mut().map(lines).collect();
        let passes = lines(&mut controller);
        for mut c in children.into_iter().chain([controller]) {
            assert!(c.wait().unwrap().success(), "{at:?}: a child failed");
        }
        // Threads of this process too, on their own connections.
        let threads: Vec<_> = (3..5u64)
            .map(|seed| {
                let at = at.clone();
                std::thread::spawn(move || {
                    let mut s = at.open();
                    let r = s.create_jobs(&jobs(&[&format!("t{seed}")]), T0).unwrap();
                    let again = s.create_jobs(&jobs(&[&format!("t{seed}")]), T0).unwrap();
                    (r, again)
                })
            })
            .collect();
        for t in threads {
            let (first, again) = t.join().unwrap();
            assert_eq!(first, CreateResult::Created);
            assert!(matches!(again, CreateResult::Exist(_)));
        }
        let mut s = at.open();
        let everything = s.export().unwrap();
        consistent(&everything).unwrap_or_else(|e| panic!("{at:?}: {e}"));
        let all: BTreeMap<Name, &tpu_runner::engine::state::Job> =
            everything.all_jobs().map(|j| (j.id, j)).collect();
        let mut expected_cancelled = Vec::new();
        for (seed, out) in outputs.iter().enumerate() {
            for line in out {
                match line["op"].as_str().unwrap() {
                    "create" => {
                        let ids: Vec<&str> = line["ids"]
                            .as_array()
                            .unwrap()
                            .iter()
                            .map(|v| v.as_str().unwrap())
                            .collect();
                        let own = ids[0];
                        // A batch with another child's job is refused once that job exists
                        // (it may be created first by this batch if the owner was slower).
                        if line["created"].as_bool().unwrap() {
                            for id in &ids {
                                assert!(
                                    all.contains_key(&Name::new(id)),
                                    "{at:?}: created {id} is missing"
                                );
                            }
                        } else {
                            // Refused only because one of its ids existed already.
                            assert!(
                                ids.iter().any(|id| all.contains_key(&Name::new(id))),
                                "{at:?}: batch {ids:?} refused but none of its jobs exists ({own})"
                            );
                        }
                    }
                    "cancel" => {
                        let id = Name::new(line["id"].as_str().unwrap());
                        let job = || {
                            *all.get(&id)
                                .unwrap_or_else(|| panic!("{at:?}: cancelled {id} missing"))
                        };
                        match line["result"]["status"].as_str() {
                            Some("deactivated") => {
                                assert_eq!(
                                    job().status,
                                    JobStatus::Deactivated,
                                    "{at:?}: cancel of {id} lost"
                                );
                                expected_cancelled.push(id);
                            }
                            Some("cancelling") => assert!(
                                matches!(
                                    job().status,
                                    JobStatus::Cancelling | JobStatus::Deactivated
                                ),
                                "{at:?}: cancel of {id} lost: {:?}",
                                job().status
                            ),
                            _ => {}
                        }
                    }
                    "prio" => {
                        let id = Name::new(line["id"].as_str().unwrap());
                        if line["result"]["result"] == "reprioritized" {
                            // Later calls of the same child may change it again; the last
                            // successful one must hold unless the job left pending.
                            let last = out.iter().rev().find(|l| {
                                l["op"] == "prio"
                                    && l["id"] == line["id"]
                                    && l["result"]["result"] == "reprioritized"
                            });
                            if std::ptr::eq(last.unwrap(), line) {
                                let job = all[&id];
                                assert_eq!(
                                    job.spec.priority.as_str(),
                                    line["priority"].as_str().unwrap(),
                                    "{at:?}: priority of {id} lost (child {seed})"
                                );
                            }
                        }
                    }
                    _ => unreachable!(),
                }
            }
        }
        // Every job that exists was created exactly once by some successful batch.
        let created: usize = outputs
            .iter()
            .flatten()
            .filter(|l| l["created"] == true)
            .map(|l| l["ids"].as_array().unwrap().len())
            .sum();
        assert_eq!(all.len(), created + 2, "{at:?}: jobs created = jobs stored");
        let commits = passes.iter().filter(|l| l["op"] == "commit").count();
        assert!(commits > 0, "{at:?}: the controller committed");
        eprintln!(
            "{at:?}: {} jobs, {commits} commits, {} conflicts, {} cancels held",
            all.len(),
            passes.iter().filter(|l| l["op"] == "conflict").count(),
            expected_cancelled.len()
        );
    }
}

/// Kills a controller process with SIGKILL at random points, `kills` times, and checks the
/// store after each: it opens, it is consistent, and every commit the child reported is
/// there (its marker is at least the last one printed).
fn crash_test(at: &Where, kills: usize, window_us: u64) {
    {
        let mut s = at.open();
        let (state, _) = planning(60);
        s.import(&state).unwrap();
        hold_lease(&mut *s, T0);
    }
    let mut rng = 0x9e37_79b9_7f4a_7c15u64 ^ std::process::id() as u64;
    let mut next = move || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    let mut total_commits = 0;
    for kill in 0..kills {
        let mut child = spawn(at, "controller", 1000);
        let out = child.stdout.take().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        let reader = std::thread::spawn(move || {
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                let Ok(line) = serde_json::from_str::<serde_json::Value>(&line) else {
                    continue;
                };
                if let Some(k) = line["k"].as_u64().filter(|_| line["op"] == "commit") {
                    let _ = tx.send(k);
                }
            }
        });
        // Kill at a random point of the commit loop: after its first commit, within the time
        // of a few more (a pass and its commit take ~1 ms on SQLite, ~50 ms on the emulator).
        let mut last = rx.recv_timeout(Duration::from_secs(60)).ok();
        assert!(last.is_some(), "{at:?}: the child never committed");
        std::thread::sleep(Duration::from_micros(next() % window_us));
        child.kill().unwrap();
        let _ = child.wait();
        reader.join().unwrap();
        while let Ok(k) = rx.try_recv() {
            last = Some(k);
        }
        let mut s = at.open();
        let state = s
            .load_active()
            .unwrap_or_else(|e| panic!("{at:?} after kill {kill}: {e}"))
            .state;
        consistent(&state).unwrap_or_else(|e| panic!("{at:?} after kill {kill}: {e}"));
        if let Some(k) = last {
            total_commits = k + 1;
            let stored: u64 = state
                .notices
                .get("test:commits")
                .and_then(|v| v.parse().ok())
                .unwrap_or(0);
            assert!(
                stored >= k,
                "{at:?} after kill {kill}: commit {k} was reported but the store has {stored}"
            );
        }
        // The next child starts over from the store; new work arrives meanwhile.
        s.create_jobs(&jobs(&[&format!("late-{kill}")]), T0)
            .unwrap();
    }
    eprintln!("{at:?}: {kills} kills; {total_commits} passes committed in all, none lost");
}

#[test]
fn sqlite_survives_200_kills_mid_commit() {
    let dir = tempfile::tempdir().unwrap();
    crash_test(&Where::Sqlite(dir.path().join("crash.db")), 200, 30_000);
}

#[test]
fn firestore_survives_50_kills_mid_commit() {
    let dir = tempfile::tempdir().unwrap();
    let stores = stores("crash", dir.path());
    if let Some(at) = stores.iter().find(|w| matches!(w, Where::Firestore { .. })) {
        crash_test(at, 50, 1_000_000);
    }
}

// ----- bad input and faults ------------------------------------------------------------

#[test]
fn bad_files_are_clear_errors_and_nothing_is_written() {
    let dir = tempfile::tempdir().unwrap();
    let garbage = dir.path().join("garbage.db");
    std::fs::write(&garbage, vec![0x42u8; 8192]).unwrap();
    let e = SqliteStore::open(&garbage).unwrap_err();
    assert!(e.to_string().contains("not an SQLite database"), "{e}");
    assert_eq!(
        std::fs::read(&garbage).unwrap(),
        vec![0x42u8; 8192],
        "untouched"
    );

    let foreign = dir.path().join("foreign.db");
    {
        let c = rusqlite::Connection::open(&foreign).unwrap();
        c.execute_batch("CREATE TABLE songs (title TEXT); INSERT INTO songs VALUES ('x');")
            .unwrap();
    }
    let e = SqliteStore::open(&foreign).unwrap_err();
    assert!(e.to_string().contains("another program"), "{e}");

    let newer = dir.path().join("newer.db");
    drop(SqliteStore::open(&newer).unwrap());
    {
        let c = rusqlite::Connection::open(&newer).unwrap();
        c.pragma_update(None, "user_version", 99).unwrap();
    }
    let e = SqliteStore::open(&newer).unwrap_err();
    assert!(
        e.to_string().contains("schema version 99") && e.to_string().contains("upgrade"),
        "{e}"
    );

    // A store truncated to nothing is damage, not a new store (issue 34 item 16).
    let empty = dir.path().join("empty.db");
    std::fs::write(&empty, b"").unwrap();
    let e = SqliteStore::open(&empty).unwrap_err();
    assert!(e.to_string().contains("empty file"), "{e}");
    assert_eq!(
        std::fs::metadata(&empty).unwrap().len(),
        0,
        "left as it was"
    );
    assert!(!dir.path().join("empty.db-wal").exists());

    let folder = dir.path().join("a-folder");
    std::fs::create_dir(&folder).unwrap();
    let e = SqliteStore::open(&folder).unwrap_err();
    assert!(e.to_string().contains("not a regular file"), "{e}");

    let e = FirestoreStore::open(
        "demo-tpu-runner",
        "(default)",
        "runner",
        Endpoint::emulator("127.0.0.1:1"),
    )
    .unwrap_err();
    assert!(e.to_string().contains("unreachable"), "{e}");
    assert!(
        e.to_string().contains("firestore:projects/demo-tpu-runner"),
        "{e}"
    );
}

#[test]
fn a_damaged_record_names_itself() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("damaged.db");
    {
        let mut s = SqliteStore::open(&path).unwrap();
        s.create_jobs(&jobs(&["a"]), T0).unwrap();
    }
    {
        let c = rusqlite::Connection::open(&path).unwrap();
        c.execute("UPDATE jobs SET doc = '{\"id\": 3}' WHERE id = 'a'", [])
            .unwrap();
    }
    let mut s = SqliteStore::open(&path).unwrap();
    let e = s.load_active().unwrap_err();
    assert!(e.to_string().contains("jobs/a"), "{e}");
}

#[test]
fn a_read_only_file_says_so() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ro.db");
    drop(SqliteStore::open(&path).unwrap());
    let mut perms = std::fs::metadata(&path).unwrap().permissions();
    use std::os::unix::fs::PermissionsExt;
    perms.set_mode(0o444);
    std::fs::set_permissions(&path, perms).unwrap();
    // Root ignores file permissions: only check when they apply.
    let ours = std::fs::OpenOptions::new().write(true).open(&path).is_err();
    if ours {
        let e = match SqliteStore::open(&path) {
            Ok(mut s) => s.create_jobs(&jobs(&["a"]), T0).unwrap_err(),
            Err(e) => e,
        };
        assert!(e.to_string().contains("permission"), "{e}");
    }
}

#[test]
fn resource_records_survive_a_round_trip() {
    // Every field of a busy record (owner, counters, times) reads back exactly.
    let dir = tempfile::tempdir().unwrap();
    for at in stores("records", dir.path()) {
        let mut s = at.open();
        let (mut state, _) = planning(0);
        let id = *state.resources.keys().next().unwrap();
        let r: &mut Resource = state.resources.get_mut(&id).unwrap();
        r.retryable_failures = Some(tpu_runner::engine::state::FailureCounter {
            job_id: "j".into(),
            attempt_id: None,
            count: 2,
        });
        r.provisioning_node_seen_at = Some(T0.plus_millis(1234));
        s.import(&state).unwrap();
        assert_eq!(
            s.load_active().unwrap().state.resources,
            state.resources,
            "{at:?}"
        );
    }
}

/// A one-shot HTTP server on loopback answering every request with `status` and `body`
/// (what a real Firestore says to a caller without the role).
fn canned_server(status: u16, body: &'static str) -> String {
    use std::io::{Read, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    std::thread::spawn(move || {
        for stream in listener.incoming().take(4) {
            let Ok(mut stream) = stream else { continue };
            let mut buf = [0u8; 65536];
            let _ = stream.read(&mut buf);
            let reply = format!(
                "HTTP/1.1 {status} X\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                body.len()
            );
            let _ = stream.write_all(reply.as_bytes());
        }
    });
    addr
}

#[test]
fn permission_errors_name_the_store_and_the_role() {
    let addr = canned_server(
        403,
        r#"{"error":{"code":403,"message":"Missing or insufficient permissions.","status":"PERMISSION_DENIED"}}"#,
    );
    let e =
        FirestoreStore::open("p", "(default)", "runner", Endpoint::emulator(&addr)).unwrap_err();
    let text = e.to_string();
    assert!(
        text.contains("permission denied") && text.contains("roles/datastore.user"),
        "{text}"
    );
    assert!(
        text.contains("firestore:projects/p/databases/(default)"),
        "{text}"
    );
    // A database that does not exist says how to create it.
    let addr = canned_server(
        404,
        r#"{"error":{"code":404,"message":"The database (default) does not exist for project p","status":"NOT_FOUND"}}"#,
    );
    let e =
        FirestoreStore::open("p", "(default)", "runner", Endpoint::emulator(&addr)).unwrap_err();
    assert!(e.to_string().contains("tpu-runner deploy"), "{e}");
    // SQLite where no file can be created (even for root).
    let e = SqliteStore::open(Path::new("/proc/tpu-runner-test/state.db")).unwrap_err();
    assert!(e.to_string().contains("cannot create the folder"), "{e}");
    let e = SqliteStore::open(Path::new("/proc/self/state.db")).unwrap_err();
    assert!(
        e.to_string().contains("permission") || e.to_string().contains("cannot be opened"),
        "{e}"
    );
}
