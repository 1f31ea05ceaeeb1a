//! Conformance of the two `CloudBackend`s: `SimBackend` (in process) and `GcpBackend` over
//! loopback HTTP to the TPU API emulator serving the same simulated cloud.
//!
//! - The same actions give the same observations and outcomes: one scripted suite of
//!   actions, faults and time steps, run on two identical worlds, one through each backend,
//!   compared after every step.
//! - Whole shipped scenarios run through `GcpBackend` on the emulator's virtual time give the
//!   same metrics, events and final state as the in-process run with the same seed; with
//!   invariant checks on, every pass also checks that what `GcpBackend` observed over HTTP is
//!   what reading the simulated cloud directly gives.
//!
//! A failure prints the scenario, the seed and the command that replays it.

use std::collections::BTreeMap;
use std::path::PathBuf;

use tpu_runner::backend::gcp::{CreateSettings, GcpBackend};
use tpu_runner::backend::sim::SimBackend;
use tpu_runner::backend::workers::EmulatedWorkers;
use tpu_runner::backend::{CloudBackend, InFlight, Inventory, Outcome};
use tpu_runner::emulator::{self, Clock, Running, Shared, World, lock};
use tpu_runner::engine::observe::{AttemptReport, LaunchRequest};
use tpu_runner::engine::{Action, InventoryScope, Timestamp};
use tpu_runner::gcp::http::{Endpoint, RetryPolicy};
use tpu_runner::gcp::tpu::{Client, Quotas};
use tpu_runner::simulate::harness::{self, EPOCH, Hooks, RunOptions, RunResult};
use tpu_runner::simulate::scenario::{self, Scenario};
use tpu_runner::spec::{FleetSpec, Name, NameMap, ProvisioningModel, TpuType};
use tpu_runner_sim::SimCloud;

fn load(rel: &str) -> Scenario {
    scenario::load(&PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(rel))
        .unwrap_or_else(|e| panic!("{e}"))
}

/// A `GcpBackend` for `fleet` on the emulator at `running`: one call at a time and no
/// client retries, as the simulator's backend makes them (so both make the same calls in the
/// same order), and no client-side pacing (the emulator models the project's quota).
fn gcp_backend(running: &Running, fleet: &FleetSpec) -> GcpBackend {
    let endpoint = Endpoint::emulator(&running.url());
    let quotas = Quotas {
        reads_per_minute: 6_000_000,
        writes_per_minute: 6_000_000,
    };
    let policy = RetryPolicy {
        tries: 1,
        ..RetryPolicy::default()
    };
    let client = Client::new(endpoint.clone(), &fleet.project, quotas, policy).expect("client");
    let workers = EmulatedWorkers::new(&endpoint, &fleet.project).expect("workers");
    let mut backend = GcpBackend::new(client, CreateSettings::of_fleet(fleet), Box::new(workers));
    backend.concurrency = 1;
    backend
}

/// Runs `scenario` with `seed` in process, or wired through the emulator.
fn run(scenario: &Scenario, seed: u64, wired: bool) -> RunResult {
    let options = RunOptions {
        check_invariants: true,
        samples: 50,
        ..RunOptions::default()
    };
    let mut running: Option<Running> = None;
    let fleet = scenario.fleet.clone();
    let mut wire = |world: &Shared| -> Box<dyn CloudBackend> {
        let r = emulator::start(world.clone(), "127.0.0.1:0").expect("emulator");
        let backend = gcp_backend(&r, &fleet);
        running = Some(r);
        Box::new(backend)
    };
    let hooks = Hooks {
        wire: wired.then_some(&mut wire as &mut harness::Wire<'_>),
        ..Hooks::default()
    };
    harness::run(scenario, "classic", seed, options, hooks).unwrap_or_else(|v| {
        panic!(
            "{} seed {seed} ({}): {}\nreplay: cargo test --test backend_conformance",
            scenario.name,
            if wired { "over HTTP" } else { "in process" },
            v.message
        )
    })
}

#[test]
fn shipped_scenarios_over_http_give_the_in_process_results() {
    for (path, seed) in [
        ("scenarios/smoke.yaml", 1),
        ("scenarios/regional-stockout.yaml", 1),
        ("scenarios/regional-stockout.yaml", 7),
    ] {
        let s = load(path);
        let local = run(&s, seed, false);
        let remote = run(&s, seed, true);
        // Everything but the wall time it took.
        let metrics = |r: &RunResult| {
            let mut m = serde_json::to_value(&r.metrics).expect("metrics");
            m["wall_s"] = serde_json::Value::Null;
            m
        };
        assert_eq!(
            metrics(&local),
            metrics(&remote),
            "{path} seed {seed}: metrics differ over HTTP"
        );
        assert_eq!(
            local.event_hash, remote.event_hash,
            "{path} seed {seed}: events differ over HTTP"
        );
        assert_eq!(
            local.state, remote.state,
            "{path} seed {seed}: final state differs over HTTP"
        );
        assert!(local.metrics.passes > 10, "{path}: the run did something");
    }
}

// ----- the same actions, the same observations ---------------------------------------------

const RUNNER: &str = "conf";
const PROJECT: &str = "conf-project";
const EAST: &str = "us-east1-d";
const WEST: &str = "us-west4-a";

fn fleet() -> FleetSpec {
    let text = format!(
        "name: {RUNNER}\nproject: {PROJECT}\ncontroller_region: us-east1\ncontroller_timeout: 168h\nfirestore_location: nam5\nnetwork: default\nsubnetwork: default\nssh_transport: direct\nbucket: gs://conf-bucket\ntpus:\n  - {{id: east, type: v6e-8, zone: {EAST}, count: 4, runtime: v2-alpha-tpuv6e, chip_limit: 32}}\n"
    );
    tpu_runner::spec::fleet::parse_fleet("conformance.yaml", &text)
        .unwrap_or_else(|e| panic!("{e:?}"))
}

fn cloud(adjust: &dyn Fn(&mut tpu_runner_sim::CloudConfig)) -> SimCloud {
    use tpu_runner_sim::model::*;
    let pool = |zone: &str, accelerator: &str, chips, hosts, slices| PoolConfig {
        zone: zone.into(),
        accelerator: accelerator.into(),
        model: PoolModel::Spot,
        reservation: None,
        chips,
        hosts,
        capacity: Capacity::Constant(slices),
        preemption_per_hour: 0.0,
        outages: Vec::new(),
        reclaims: true,
    };
    let mut config = harness::cloud_config(&load("scenarios/smoke.yaml"), 5, None);
    config.pools = vec![
        pool(EAST, "v6e-8", 8, 2, 2),
        pool(WEST, "v5litepod-16", 16, 4, 1),
        PoolConfig {
            model: PoolModel::OnDemand,
            reclaims: false,
            ..pool(EAST, "v6e-8", 8, 2, 1)
        },
        PoolConfig {
            model: PoolModel::Reserved,
            reservation: Some("conf-res".into()),
            reclaims: false,
            ..pool(EAST, "v6e-8", 8, 2, 1)
        },
    ];
    adjust(&mut config);
    let mut cloud = SimCloud::new(config);
    cloud.add_existing_node(EAST, "adopted-1", "v6e-8", 8, 2);
    cloud
}

/// The two sides of the suite: each backend with the world it acts on.
struct Sides {
    local: (SimBackend, Inventory),
    world: Shared,
    remote: (GcpBackend, Inventory),
    _running: Running,
}

impl Sides {
    fn new() -> Sides {
        Sides::with(&|_| {})
    }

    /// Both worlds made with `adjust` applied to their configuration.
    fn with(adjust: &dyn Fn(&mut tpu_runner_sim::CloudConfig)) -> Sides {
        let fleet = fleet();
        let local = SimBackend::new(cloud(adjust), EPOCH, RUNNER, true);
        let world = World::new(
            SimBackend::new(cloud(adjust), EPOCH, RUNNER, true),
            PROJECT,
            Clock::Virtual,
        )
        .shared();
        let running = emulator::start(world.clone(), "127.0.0.1:0").expect("emulator");
        let remote = gcp_backend(&running, &fleet);
        Sides {
            local: (local, Inventory::default()),
            world,
            remote: (remote, Inventory::default()),
            _running: running,
        }
    }

    fn now(&self) -> Timestamp {
        EPOCH.plus_millis(self.local.0.cloud.now() as i64)
    }

    /// Both worlds move to `secs` of virtual time.
    fn advance(&mut self, secs: u64) {
        self.local.0.cloud.advance_to(secs * 1000);
        lock(&self.world).sim.cloud.advance_to(secs * 1000);
    }

    /// The same change made to both worlds.
    fn both(&mut self, f: impl Fn(&mut SimCloud)) {
        f(&mut self.local.0.cloud);
        f(&mut lock(&self.world).sim.cloud);
    }

    /// Reads the inventory through both backends; they must agree.
    fn observe(&mut self, step: &str) -> Inventory {
        let zones = [Name::new(EAST), Name::new(WEST)];
        let adopted = [(EAST, "adopted-1"), (EAST, "never-existed")];
        let scope = InventoryScope {
            runner: RUNNER,
            zones: std::borrow::Cow::Owned(zones.iter().copied().collect()),
            adopted: adopted.iter().copied().collect(),
        };
        let now = self.now();
        let (local, li) = &mut self.local;
        local.inventory(&scope, now, li).expect("local read");
        let (remote, ri) = &mut self.remote;
        remote
            .inventory(&scope, now, ri)
            .unwrap_or_else(|e| panic!("{step}: {e}"));
        assert_eq!(li, ri, "{step}: the inventories differ");
        li.clone()
    }

    fn reports(&mut self, in_flight: &[InFlight], step: &str) -> NameMap<AttemptReport> {
        let now = self.now();
        let mut local = NameMap::default();
        let mut remote = NameMap::default();
        let l = self
            .local
            .0
            .refresh_reports(in_flight, &mut local, now)
            .expect("local");
        let r = self
            .remote
            .0
            .refresh_reports(in_flight, &mut remote, now)
            .expect("remote");
        assert_eq!(l.read_at, r.read_at, "{step}: read times differ");
        assert_eq!(local, remote, "{step}: the reports differ");
        local
    }

    /// Carries out `actions` through both backends; the outcomes must agree.
    fn act(&mut self, actions: &[Action], step: &str) -> Vec<Outcome> {
        let now = self.now();
        let local = self.local.0.execute(actions, now);
        // The remote world's clock must be where the local one was when the pass began.
        let remote = self.remote.0.execute(actions, now);
        assert_eq!(local, remote, "{step}: the outcomes differ");
        local
    }
}

fn create(name: &str, zone: &str, tpu_type: &str) -> Action {
    create_as(name, zone, tpu_type, ProvisioningModel::Spot, None)
}

/// A create of on-demand or reserved capacity.
fn create_as(
    name: &str,
    zone: &str,
    tpu_type: &str,
    model: ProvisioningModel,
    reservation: Option<&str>,
) -> Action {
    Action::CreateQueuedResource {
        name: Name::new(&format!("{name}-qr")),
        node_id: Name::new(name),
        zone: Name::new(zone),
        tpu_type: TpuType::parse(tpu_type).expect("type"),
        runtime: "v2-alpha-tpuv6e".into(),
        entry_id: Name::new("east"),
        model,
        reservation: reservation.map(str::to_owned),
    }
}

fn launch(attempt: &str, job: &str, tpu: &str, zone: &str) -> Action {
    Action::Launch(Box::new(LaunchRequest {
        attempt_id: Name::new(attempt),
        job_id: Name::new(job),
        resource_id: Name::new(tpu),
        tpu_name: Name::new(tpu),
        zone: Name::new(zone),
        tpu_type: TpuType::parse("v6e-8").expect("type"),
        worker_count: 2,
        command: "python train.py".into(),
        bucket: "conf-bucket".into(),
        checkpoint_dir: "gs://conf-bucket/jobs/j/checkpoints".into(),
        checkpoint_from: None,
        env: BTreeMap::new(),
        bundle: None,
        caches: Vec::new(),
    }))
}

fn cancel(attempt: &str, job: &str, tpu: &str, zone: &str) -> Action {
    Action::Cancel {
        attempt_id: Name::new(attempt),
        job_id: Name::new(job),
        tpu_name: Name::new(tpu),
        zone: Name::new(zone),
        notice: None,
    }
}

#[test]
fn the_same_actions_give_the_same_observations_and_outcomes() {
    let mut s = Sides::new();
    // The jobs the simulated workers will run (both worlds know how they behave).
    s.both(|c| {
        for job in ["job-1", "job-2", "job-3"] {
            c.register_job(
                job,
                tpu_runner_sim::JobBehaviour {
                    work_secs: 7200.0,
                    checkpoint_secs: 600.0,
                    app_failure: 0.0,
                    infra_failure: 0.0,
                    setup_failure: 0.0,
                    cache_key: None,
                    checkpoint_on_notice: true,
                },
            );
        }
    });
    let inv = s.observe("start");
    assert_eq!(inv.nodes.len(), 1, "only the adopted TPU exists");
    assert!(inv.queued_resources.is_empty());
    assert!(
        inv.others.is_empty(),
        "the adopted TPU is not someone else's"
    );

    // Creates: two fit, a third waits, a duplicate and an unknown type are refused; on-demand
    // and reserved capacity come from their own pools, a reservation that does not exist is
    // refused for good.
    let outcomes = s.act(
        &[
            create("tpu-a", EAST, "v6e-8"),
            create("tpu-b", EAST, "v6e-8"),
            create("tpu-c", EAST, "v6e-8"),
            create("tpu-a", EAST, "v6e-8"),
            create("tpu-x", WEST, "v6e-8"),
            create_as("tpu-d", EAST, "v6e-8", ProvisioningModel::OnDemand, None),
            create_as(
                "tpu-r",
                EAST,
                "v6e-8",
                ProvisioningModel::Reserved,
                Some("conf-res"),
            ),
            create_as(
                "tpu-q",
                EAST,
                "v6e-8",
                ProvisioningModel::Reserved,
                Some("other"),
            ),
        ],
        "creates",
    );
    assert_eq!(outcomes[5..7], [Outcome::Done, Outcome::Done]);
    assert!(
        matches!(
            outcomes[7],
            Outcome::Refused(tpu_runner::engine::observe::CloudFailure::Permanent(_))
        ),
        "{:?}",
        outcomes[7]
    );
    assert_eq!(outcomes[0], Outcome::Done);
    assert!(matches!(
        outcomes[3],
        Outcome::Refused(tpu_runner::engine::observe::CloudFailure::AlreadyExists(_))
    ));
    assert!(matches!(
        outcomes[4],
        Outcome::Refused(tpu_runner::engine::observe::CloudFailure::Stockout(_))
    ));
    s.observe("after creates");

    // Provisioning.
    for t in [60, 300, 900, 1800, 3600] {
        s.advance(t);
        s.observe(&format!("at {t} s"));
    }
    let Inventory {
        nodes,
        queued_resources: qrs,
        ..
    } = s.observe("provisioned");
    assert!(nodes.iter().any(|n| n.name == "tpu-a"), "{nodes:?}");
    assert_eq!(qrs.len(), 5);
    let model = |name: &str| nodes.iter().find(|n| n.name == name).map(|n| n.model());
    assert_eq!(model("tpu-a"), Some(ProvisioningModel::Spot));
    assert_eq!(model("tpu-d"), Some(ProvisioningModel::OnDemand));
    assert_eq!(model("tpu-r"), Some(ProvisioningModel::Reserved));

    // Launches: one on a READY TPU, one on a missing TPU; the reports agree while it runs.
    let outcomes = s.act(
        &[
            launch("a-1", "job-1", "tpu-a", EAST),
            launch("z-1", "job-2", "no-such-tpu", EAST),
            launch("d-1", "job-3", "adopted-1", EAST),
        ],
        "launches",
    );
    assert_eq!(outcomes[0], Outcome::Done);
    assert!(matches!(outcomes[1], Outcome::LaunchFailed(_)));
    let flight = |attempt: &str, job: &str| InFlight {
        attempt: Name::new(attempt),
        job: Name::new(job),
        bucket: Name::new("gs://conf-bucket"),
    };
    let in_flight = [
        flight("a-1", "job-1"),
        flight("d-1", "job-3"),
        flight("never", "job-9"),
    ];
    for t in [3700, 3900, 4200] {
        s.advance(t);
        let reports = s.reports(&in_flight, &format!("reports at {t} s"));
        assert!(reports[&Name::new("a-1")].launched);
    }

    // Cancels: the running attempt, a mismatched one, one on a missing TPU.
    let outcomes = s.act(
        &[
            cancel("a-1", "job-1", "tpu-a", EAST),
            cancel("other", "job-1", "tpu-a", EAST),
            cancel("a-1", "job-1", "gone", EAST),
        ],
        "cancels",
    );
    assert!(matches!(outcomes[0], Outcome::Cancelled(_)));
    s.advance(4300);
    s.reports(&in_flight, "after cancel");

    // A preemption and a stockout injected by hand, then deletions (one of something gone).
    s.both(|c| {
        assert!(c.preempt_now(EAST, "tpu-b"));
    });
    s.advance(4400);
    s.observe("after a preemption");
    s.both(|c| {
        c.set_stockout(EAST, true);
    });
    s.advance(4500);
    s.observe("stocked out");
    s.act(
        &[
            Action::DeleteQueuedResource {
                name: Name::new("tpu-b-qr"),
                zone: Name::new(EAST),
            },
            Action::DeleteNode {
                name: Name::new("tpu-a"),
                zone: Name::new(EAST),
            },
            Action::DeleteQueuedResource {
                name: Name::new("never-qr"),
                zone: Name::new(EAST),
            },
        ],
        "deletes",
    );
    for t in [4600, 5000, 8000] {
        s.advance(t);
        s.observe(&format!("deleting at {t} s"));
    }
    s.both(|c| {
        c.set_stockout(EAST, false);
    });
    s.advance(9000);
    let nodes = s.observe("lifted").nodes;
    assert!(
        nodes.iter().any(|n| n.name == "tpu-c"),
        "the waiting request got capacity: {nodes:?}"
    );
}

/// Someone else's request and node in a listed zone (another team's, labelled for another
/// runner) are listed apart by both backends, through its whole life: never among the
/// runner's objects, always among the others whose chips count against the chip limits.
#[test]
fn someone_elses_tpus_are_listed_apart_alike() {
    let mut s = Sides::new();
    s.both(|c| {
        let labels = std::sync::Arc::new(
            [("managed-by".to_owned(), "another-team".to_owned())]
                .into_iter()
                .collect(),
        );
        c.create_queued_resource(
            ustr::ustr(EAST),
            ustr::ustr("theirs-qr"),
            ustr::ustr("theirs"),
            "v6e-8",
            tpu_runner_sim::PoolModel::Spot,
            None,
            labels,
        )
        .expect("their request");
    });
    let inv = s.observe("requested");
    assert!(inv.queued_resources.is_empty(), "{inv:?}");
    assert_eq!(inv.others.queued_resources.len(), 1, "{inv:?}");
    assert_eq!(inv.others.queued_resources[0].name, "theirs-qr");
    for t in [600, 1200, 1800, 3600] {
        s.advance(t);
        s.observe(&format!("at {t} s"));
    }
    let inv = s.observe("provisioned");
    assert!(inv.nodes.iter().all(|n| n.name != "theirs"), "{inv:?}");
    let theirs: Vec<_> = inv.others.nodes.iter().map(|n| n.name).collect();
    assert_eq!(theirs, [Name::new("theirs")], "{inv:?}");
    // The runner's own objects come and go in the zone (the simulator reads only what
    // changed, and keeps what it read of the others); then theirs go.
    let ours = |name: &'static str| {
        let labels: tpu_runner_sim::cloud::Labels = std::sync::Arc::new(
            [("managed-by".to_owned(), RUNNER.to_owned())]
                .into_iter()
                .collect(),
        );
        let node = format!("{name}-node");
        move |c: &mut tpu_runner_sim::SimCloud| {
            c.create_queued_resource(
                ustr::ustr(EAST),
                ustr::ustr(name),
                ustr::ustr(&node),
                "v6e-8",
                tpu_runner_sim::PoolModel::Spot,
                None,
                labels.clone(),
            )
            .expect("our request");
        }
    };
    s.both(ours("ours-a"));
    s.both(ours("zz-ours"));
    let inv = s.observe("ours requested");
    assert_eq!(inv.queued_resources.len(), 2, "{inv:?}");
    assert_eq!(inv.others.queued_resources.len(), 1, "{inv:?}");
    s.both(|c| {
        c.delete_queued_resource(ustr::ustr(EAST), ustr::ustr("ours-a"))
            .expect("deleted");
    });
    s.advance(4000);
    s.observe("ours deleted");
    s.both(|c| {
        c.delete_queued_resource(ustr::ustr(EAST), ustr::ustr("theirs-qr"))
            .expect("deleted");
    });
    for t in [4600, 9000] {
        s.advance(t);
        s.observe(&format!("theirs deleted, at {t} s"));
    }
    let inv = s.observe("theirs gone");
    assert!(inv.others.queued_resources.is_empty(), "{inv:?}");
}

#[test]
fn every_refusal_over_http_is_the_one_the_simulator_reports() {
    use tpu_runner::engine::observe::CloudFailure as F;
    type Adjust = Box<dyn Fn(&mut tpu_runner_sim::CloudConfig)>;
    let kind = |f: &F| std::mem::discriminant(f);
    let cases: Vec<(&str, Adjust, F)> = vec![
        (
            "rate limited",
            Box::new(|c| c.api.rate_limited = 1.0),
            F::RateLimited(String::new()),
        ),
        (
            "unavailable",
            Box::new(|c| c.api.unavailable = 1.0),
            F::Unavailable(String::new()),
        ),
        (
            "timeout",
            Box::new(|c| c.api.timeout = 1.0),
            F::Unavailable(String::new()),
        ),
        (
            "lost reply",
            Box::new(|c| c.api.lost_reply = 1.0),
            F::Unavailable(String::new()),
        ),
        (
            "quota",
            Box::new(|c| c.api_quota.mutations_per_minute = 0.5),
            F::RateLimited(String::new()),
        ),
    ];
    for (what, adjust, want) in cases {
        let mut s = Sides::with(&*adjust);
        // The quota bucket starts full: its first call goes through.
        let outcomes = s.act(
            &[
                create("tpu-a", EAST, "v6e-8"),
                create("tpu-b", EAST, "v6e-8"),
            ],
            what,
        );
        match &outcomes[1] {
            Outcome::Refused(f) => assert_eq!(kind(f), kind(&want), "{what}: {f:?}"),
            other => panic!("{what}: refused expected, got {other:?}"),
        }
    }
}

#[test]
fn a_create_retried_after_a_lost_reply_leaves_one_queued_resource() {
    let world = World::new(
        SimBackend::new(cloud(&|c| c.api.lost_reply = 1.0), EPOCH, RUNNER, true),
        PROJECT,
        Clock::Virtual,
    )
    .shared();
    let running = emulator::start(world.clone(), "127.0.0.1:0").expect("emulator");
    let mut backend = gcp_backend(&running, &fleet());
    // The first reply is lost; the client's retry carries the same requestId, and the API
    // answers with the operation the first call started.
    let client = Client::new(
        Endpoint::emulator(&running.url()),
        PROJECT,
        Quotas::default(),
        RetryPolicy {
            tries: 3,
            base: std::time::Duration::from_millis(1),
            cap: std::time::Duration::from_millis(5),
        },
    )
    .expect("client");
    let settings = CreateSettings::of_fleet(&fleet());
    let workers = EmulatedWorkers::new(&Endpoint::emulator(&running.url()), PROJECT).unwrap();
    let mut retrying = GcpBackend::new(client, settings, Box::new(workers));
    let outcomes = retrying.execute(&[create("tpu-a", EAST, "v6e-8")], EPOCH);
    assert_eq!(
        outcomes,
        vec![Outcome::Done],
        "the retry got the first call's operation"
    );
    let w = lock(&world);
    let acc = w.sim.cloud.accounting();
    assert_eq!(
        acc.api_errors.get("lost_reply"),
        Some(&1),
        "one reply was lost"
    );
    assert_eq!(
        acc.api_calls.get("create_queued_resource"),
        Some(&1),
        "the retry was answered from the first call"
    );
    let qrs: Vec<_> = w
        .sim
        .cloud
        .peek_queued_resources(ustr::Ustr::from(EAST), ("managed-by", RUNNER))
        .collect();
    assert_eq!(qrs.len(), 1, "exactly one queued resource");
    drop(w);
    // Without retries the lost reply is reported, and the next pass's create of the same name
    // finds it already there.
    let outcomes = backend.execute(&[create("tpu-a", EAST, "v6e-8")], EPOCH);
    assert!(matches!(&outcomes[0], Outcome::Refused(_)), "{outcomes:?}");
    let w = lock(&world);
    assert_eq!(
        w.sim
            .cloud
            .peek_queued_resources(ustr::Ustr::from(EAST), ("managed-by", RUNNER))
            .count(),
        1
    );
}
