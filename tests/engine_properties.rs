//! Properties of the engine on random small instances: the class-graph matcher assigns
//! exactly the jobs the original's Kuhn matching assigns; no TPU is given twice or to an
//! incompatible job; desired counts never exceed `count` and equal the original's racing
//! loop; a pass is deterministic, and does not depend on the observations before it.

mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use proptest::prelude::*;
use tpu_runner::engine::demand::{Demand, Requirement};
use tpu_runner::engine::observe::{
    Health, LABEL_FLEET_ENTRY, LABEL_MANAGED_BY, NodeInfo, NodeState, QrState, QueuedResourceInfo,
};
use tpu_runner::engine::policy::matching::{ClassGraph, greedy_match, kuhn_reference};
use tpu_runner::engine::policy::{AssignInput, CapacityInput, Classic, Policy};
use tpu_runner::engine::state::{BucketRegion, Job, Resource, ResourceStatus, State};
use tpu_runner::engine::{Engine, EngineConfig, FleetIndex, Observation};
use tpu_runner::spec::{self, Name, Priority};

// ----- the matcher alone ------------------------------------------------------------------

fn class_graph() -> impl Strategy<Value = (ClassGraph, Vec<u32>)> {
    (1usize..6, 1usize..6).prop_flat_map(|(n_jc, n_tc)| {
        (
            proptest::collection::vec(
                proptest::collection::btree_set(0..n_tc as u32, 0..=n_tc),
                n_jc,
            ),
            proptest::collection::vec(0u32..4, n_tc),
            proptest::collection::vec(0..n_jc as u32, 0..25),
        )
            .prop_map(|(compat, capacity, jobs)| {
                (
                    ClassGraph {
                        compat: compat
                            .into_iter()
                            .map(|s| s.into_iter().collect())
                            .collect(),
                        capacity,
                    },
                    jobs,
                )
            })
    })
}

proptest! {
    #[test]
    fn class_matcher_assigns_the_same_jobs_as_kuhn((graph, jobs) in class_graph()) {
        let got = greedy_match(&graph, &jobs);
        // Expand classes into single TPUs for the oracle.
        let mut tpus_of_class = Vec::new();
        let mut n_tpus = 0;
        for &cap in &graph.capacity {
            tpus_of_class.push((n_tpus..n_tpus + cap as usize).collect::<Vec<_>>());
            n_tpus += cap as usize;
        }
        let compat: Vec<Vec<usize>> = jobs
            .iter()
            .map(|&jc| graph.compat[jc as usize].iter().flat_map(|&tc| tpus_of_class[tc as usize].clone()).collect())
            .collect();
        let want = kuhn_reference(&compat, n_tpus);
        for (j, (g, w)) in got.iter().zip(&want).enumerate() {
            prop_assert_eq!(g.is_some(), w.is_some(), "job {} (class {})", j, jobs[j]);
        }
        // The class assignment is feasible.
        let mut used = vec![0u32; graph.capacity.len()];
        for (j, g) in got.iter().enumerate() {
            if let Some(tc) = g {
                prop_assert!(graph.compat[jobs[j] as usize].contains(tc));
                used[*tc as usize] += 1;
            }
        }
        for (u, c) in used.iter().zip(&graph.capacity) {
            prop_assert!(u <= c);
        }
    }
}

// ----- classic policy on real jobs and TPUs -----------------------------------------------

const TYPES: &[&str] = &["v6e-8", "v5litepod-8", "v4-16"];
const ZONES: &[&str] = &["us-east1-d", "us-central1-a", "europe-west4-a"];

#[derive(Clone, Debug)]
struct EntryGen {
    ty: usize,
    zone: usize,
    count: u32,
    adopted: bool,
    keep_warm: u32,
    /// Chips its quota key's limit allows beyond what the key's entries may hold.
    headroom: u32,
}

#[derive(Clone, Debug)]
struct JobGen {
    types: BTreeSet<usize>,
    zone: Option<usize>,
    regions: BTreeSet<usize>,
    priority: u8,
    submitted: i64,
    pinned: Option<usize>,
    backoff: bool,
}

fn entry_gen() -> impl Strategy<Value = EntryGen> {
    (
        0..TYPES.len(),
        0..ZONES.len(),
        0u32..4,
        any::<bool>(),
        0u32..2,
        prop_oneof![Just(0u32), 0u32..64],
    )
        .prop_map(|(ty, zone, count, adopted, keep_warm, headroom)| EntryGen {
            ty,
            zone,
            count,
            adopted,
            keep_warm: keep_warm.min(count),
            headroom,
        })
}

fn job_gen() -> impl Strategy<Value = JobGen> {
    (
        proptest::collection::btree_set(0..TYPES.len(), 1..=3),
        proptest::option::weighted(0.2, 0..ZONES.len()),
        proptest::collection::btree_set(0..ZONES.len(), 1..=3),
        0u8..3,
        0i64..5,
        proptest::option::weighted(0.2, 0..ZONES.len()),
        proptest::bool::weighted(0.1),
    )
        .prop_map(
            |(types, zone, regions, priority, submitted, pinned, backoff)| JobGen {
                types,
                zone,
                regions,
                priority,
                submitted,
                pinned,
                backoff,
            },
        )
}

fn region(zone: usize) -> String {
    spec::gcp::zone_region(ZONES[zone]).unwrap().to_owned()
}

fn build_fleet(entries: &[EntryGen]) -> FleetIndex {
    // Each quota key (Spot, family, zone) limited to what its entries may hold together
    // (plus a headroom drawn with the fleet), so a limit binds only through other inventory.
    let chips = |e: &EntryGen| {
        let t = spec::TpuType::parse(TYPES[e.ty]).unwrap();
        let tpus = if e.adopted { 1 } else { e.count };
        (t.quota_family().to_owned(), e.zone, t.chips() * tpus)
    };
    let mut limits: BTreeMap<(String, usize), u32> = BTreeMap::new();
    for e in entries {
        let (family, zone, chips) = chips(e);
        *limits.entry((family, zone)).or_default() += chips + e.headroom;
    }
    let mut text = String::new();
    for (i, e) in entries.iter().enumerate() {
        let (family, zone, _) = chips(e);
        let limit = limits[&(family, zone)].max(1);
        if e.adopted {
            text.push_str(&format!(
                "  - {{id: e{i}, type: {}, zone: {}, existing: tpu-{i}, chip_limit: {limit}}}\n",
                TYPES[e.ty], ZONES[e.zone]
            ));
        } else {
            text.push_str(&format!(
                "  - {{id: e{i}, type: {}, zone: {}, count: {}, runtime: r, keep_warm_count: {}, chip_limit: {limit}}}\n",
                TYPES[e.ty], ZONES[e.zone], e.count, e.keep_warm
            ));
        }
    }
    FleetIndex::new(support::fleet(&text))
}

fn build_jobs(jobs: &[JobGen]) -> Vec<Job> {
    jobs.iter()
        .enumerate()
        .map(|(i, g)| {
            let tpu: Vec<&str> = g.types.iter().map(|&t| TYPES[t]).collect();
            let priority = [Priority::Low, Priority::Normal, Priority::High][g.priority as usize];
            let spec = support::job_spec(
                &format!("j{i:02}"),
                &tpu.join(","),
                g.zone.map(|z| ZONES[z].to_owned()),
                None,
                priority,
                true,
            );
            let buckets = g
                .regions
                .iter()
                .map(|&z| BucketRegion {
                    region: region(z),
                    bucket: format!("gs://b-{}", region(z)),
                })
                .collect();
            let mut job = Job::new(spec, support::at(g.submitted), buckets);
            if let Some(z) = g.pinned {
                job.placement = Some(tpu_runner::engine::state::Placement::new(
                    &region(z),
                    &format!("gs://b-{}", region(z)),
                ));
            }
            if g.backoff {
                job.not_before = Some(support::at(1000));
            }
            job
        })
        .collect()
}

/// Idle TPUs: adopted entries' TPU plus up to `count` ordinals of managed entries.
fn build_tpus(index: &FleetIndex, idle: &[u32]) -> Vec<Resource> {
    let mut out = Vec::new();
    for (e, entry) in index.fleet.tpus.iter().enumerate() {
        let names: Vec<Name> = match &entry.kind {
            spec::EntryKind::Adopted { existing } => vec![Name::new(existing)],
            spec::EntryKind::Managed { count } => (1..=(*count).min(idle[e % idle.len()]))
                .map(|k| Name::new(&entry.node_name(index.runner(), k)))
                .collect(),
        };
        for name in names {
            out.push(Resource::new(name, entry, ResourceStatus::Idle, 1));
        }
    }
    out.sort_by(|a, b| (!a.adopted, &a.id).cmp(&(!b.adopted, &b.id)));
    out
}

/// A TPU as listed: its node, and its queued resource if it is managed.
type Observed = (Arc<NodeInfo>, Option<Arc<QueuedResourceInfo>>);

/// The node of idle record `r` in `node_state`, and its queued resource in `qr_state` if it
/// is managed; labelled for its entry, or for no entry of this runner.
fn observed(
    index: &FleetIndex,
    r: &Resource,
    node_state: NodeState,
    qr_state: QrState,
    labelled: bool,
) -> Observed {
    let entry = index.entry(index.entry_index(&r.entry_id).unwrap());
    let mut labels = std::collections::BTreeMap::new();
    if !r.adopted {
        labels.insert(LABEL_MANAGED_BY.to_owned(), index.runner().to_owned());
        let entry_id = if labelled {
            r.entry_id.as_str()
        } else {
            "elsewhere"
        };
        labels.insert(LABEL_FLEET_ENTRY.to_owned(), entry_id.to_owned());
    }
    let qr = (!r.adopted).then(|| {
        Arc::new(QueuedResourceInfo {
            name: spec::names::queued_resource_name(&r.tpu_name),
            zone: r.zone,
            node_id: r.tpu_name,
            tpu_type: r.tpu_type.clone(),
            state: qr_state,
            spot: entry.provisioning_model == spec::ProvisioningModel::Spot,
            reserved: entry.provisioning_model == spec::ProvisioningModel::Reserved,
            labels: labels.clone().into(),
            failure: None,
        })
    });
    let node = Arc::new(NodeInfo {
        name: r.tpu_name,
        zone: r.zone,
        tpu_type: r.tpu_type.clone(),
        state: node_state,
        health: Health::Healthy,
        spot: entry.provisioning_model == spec::ProvisioningModel::Spot,
        reserved: entry.provisioning_model == spec::ProvisioningModel::Reserved,
        labels: labels.into(),
        queued_resource: None,
        worker_count: 1,
        public_ip: false,
    });
    (node, qr)
}

/// The original, literally: sort jobs by its key, then Kuhn over single TPUs.
fn oracle_assigned(index: &FleetIndex, jobs: &[&Job], tpus: &[Resource]) -> BTreeSet<Name> {
    let n_entries = index.fleet.tpus.len();
    let mut order: Vec<&Job> = jobs
        .iter()
        .copied()
        .filter(|j| j.not_before.is_none_or(|t| t <= support::at(100)))
        .collect();
    let compat_entries = |j: &Job| {
        (0..n_entries)
            .filter(|&e| Requirement::of(j).accepts_entry(index, e))
            .count()
    };
    order.sort_by_key(|j| {
        (
            compat_entries(j) == 0,
            std::cmp::Reverse(j.spec.priority.rank()),
            compat_entries(j),
            j.submitted_at,
            j.id,
        )
    });
    let compat: Vec<Vec<usize>> = order
        .iter()
        .map(|j| {
            (0..tpus.len())
                .filter(|&t| Requirement::of(j).accepts_resource(&tpus[t]))
                .collect()
        })
        .collect();
    let matched = kuhn_reference(&compat, tpus.len());
    order
        .iter()
        .zip(matched)
        .filter(|(_, m)| m.is_some())
        .map(|(j, _)| j.id)
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    /// Grouping by cached fingerprints puts two jobs in one class exactly when their
    /// requirements are equal (types, zone, TPU name, pinned region or bucket regions).
    #[test]
    fn demand_classes_follow_requirement_equality(
        entries in proptest::collection::vec(entry_gen(), 1..5),
        jobs in proptest::collection::vec(job_gen(), 0..12),
    ) {
        let index = build_fleet(&entries);
        let jobs = build_jobs(&jobs);
        let demand = Demand::build(&index, jobs.iter(), support::at(100));
        for a in &demand.jobs {
            for b in &demand.jobs {
                let same = Requirement::of(a.job) == Requirement::of(b.job);
                prop_assert_eq!(a.class == b.class, same, "{} vs {}", a.job.id, b.job.id);
            }
        }
    }

    #[test]
    fn classic_assignment_matches_the_original(
        entries in proptest::collection::vec(entry_gen(), 1..5),
        jobs in proptest::collection::vec(job_gen(), 0..12),
        idle in proptest::collection::vec(0u32..4, 1..4),
    ) {
        let index = build_fleet(&entries);
        let jobs = build_jobs(&jobs);
        let tpus = build_tpus(&index, &idle);
        let demand = Demand::build(&index, jobs.iter(), support::at(100));
        let tpu_refs: Vec<&Resource> = tpus.iter().collect();
        let pairs = Classic.assign(&AssignInput { index: &index, demand: &demand, tpus: &tpu_refs });

        let mut seen_tpus = BTreeSet::new();
        for &(j, t) in &pairs {
            let job = demand.jobs[j].job;
            prop_assert!(seen_tpus.insert(t), "TPU {} assigned twice", tpus[t].id);
            prop_assert!(demand.jobs[j].assignable, "job {} is backing off", job.id);
            prop_assert!(Requirement::of(job).accepts_resource(&tpus[t]), "{} cannot run on {}", job.id, tpus[t].id);
        }
        let got: BTreeSet<Name> = pairs.iter().map(|&(j, _)| demand.jobs[j].job.id).collect();
        let job_refs: Vec<&Job> = jobs.iter().collect();
        prop_assert_eq!(got, oracle_assigned(&index, &job_refs, &tpus));
    }

    #[test]
    fn desired_counts_follow_the_racing_rule(
        entries in proptest::collection::vec(entry_gen(), 1..5),
        jobs in proptest::collection::vec(job_gen(), 0..12),
        busy in proptest::collection::vec(0u32..3, 5),
        cooling in proptest::collection::vec(proptest::bool::weighted(0.4), 5),
    ) {
        let index = build_fleet(&entries);
        let jobs = build_jobs(&jobs);
        let demand = Demand::build(&index, jobs.iter(), support::at(100));
        let waiting = vec![true; demand.jobs.len()];
        let busy: Vec<u32> = index.fleet.tpus.iter().enumerate().map(|(e, entry)| busy[e].min(entry.ceiling())).collect();
        let none_cooling = vec![false; index.fleet.tpus.len()];
        let cooling = &cooling[..index.fleet.tpus.len()];
        let input = |cooling| CapacityInput { index: &index, demand: &demand, waiting: &waiting, busy: &busy, idle_adopted: &[], cooling, paused: cooling, granted: &[], now: support::at(100) };
        let desired = Classic.desired_counts(&input(&none_cooling));
        // The original's loop: jobs in order add one to every compatible managed entry with room.
        let mut add = vec![0u32; index.fleet.tpus.len()];
        for job in &demand.jobs {
            for &e in &demand.class(job).entries {
                let entry = index.entry(e as usize);
                if let spec::EntryKind::Managed { count } = entry.kind
                    && add[e as usize] < count.saturating_sub(busy[e as usize])
                {
                    add[e as usize] += 1;
                }
            }
        }
        for (e, entry) in index.fleet.tpus.iter().enumerate() {
            if let spec::EntryKind::Managed { count } = entry.kind {
                prop_assert!(desired[e] <= count);
                prop_assert_eq!(desired[e], count.min(entry.keep_warm_count.max(busy[e] + add[e])), "entry {}", entry.id);
            }
        }
        // Every registered policy stays within counts and never asks more than classic, and
        // with pools cooling still asks for every waiting job somewhere it has room.
        for name in spec::PolicyName::ALL {
            let policy = tpu_runner::engine::policy::of_spec(&spec::PolicySpec::named(name));
            let other = policy.desired_counts(&input(&none_cooling));
            let cooled = policy.desired_counts(&input(cooling));
            for (e, entry) in index.fleet.tpus.iter().enumerate() {
                if let spec::EntryKind::Managed { count } = entry.kind {
                    prop_assert!(other[e] <= count && other[e] <= desired[e], "{name} entry {}: {} (classic {})", entry.id, other[e], desired[e]);
                    prop_assert!(cooled[e] <= count && cooled[e] <= desired[e], "{name} cooling entry {}: {} (classic {})", entry.id, cooled[e], desired[e]);
                }
            }
            for class in &demand.classes {
                let room = |e: &u32| matches!(index.entry(*e as usize).kind, spec::EntryKind::Managed { count } if count > busy[*e as usize]);
                if class.entries.iter().any(room) {
                    prop_assert!(class.entries.iter().any(|&e| cooled[e as usize] > busy[e as usize]), "{name} stranded a class with cooling {cooling:?}");
                }
            }
        }
    }

    #[test]
    fn a_pass_is_deterministic_and_respects_limits(
        entries in proptest::collection::vec(entry_gen(), 1..5),
        jobs in proptest::collection::vec(job_gen(), 0..12),
        idle in proptest::collection::vec(0u32..4, 1..4),
    ) {
        let index = build_fleet(&entries);
        let engine = Engine::new(index.fleet.clone(), EngineConfig::default(), Box::new(Classic));
        let mut state = State::new();
        for job in build_jobs(&jobs) {
            state.submit(job).unwrap();
        }
        let mut obs = Observation::default();
        for r in build_tpus(&index, &idle) {
            let (node, qr) = observed(&index, &r, NodeState::Ready, QrState::Active, true);
            obs.queued_resources.extend(qr);
            obs.nodes.push(node);
        }
        let mut again = state.clone();
        let out = engine.reconcile(&mut state, &obs, support::at(100));
        let out2 = engine.reconcile(&mut again, &obs, support::at(100));
        prop_assert_eq!(&out, &out2);
        prop_assert_eq!(&state, &again);
        prop_assert!(out.violations.is_empty(), "{:?}", out.violations);
        // Never more live requests per entry than its count.
        for (e, entry) in index.fleet.tpus.iter().enumerate() {
            let created = out.actions.iter().filter(|a| matches!(a, tpu_runner::engine::Action::CreateQueuedResource { entry_id, .. } if *entry_id == entry.id)).count();
            let existing = obs.queued_resources.iter().filter(|q| index.qr_facts(q).labelled == Some(e as u32)).count();
            prop_assert!(created + existing <= entry.ceiling() as usize);
        }
        // No TPU runs two attempts; every running job owns its TPU.
        let mut owners = BTreeSet::new();
        for r in state.resources.values() {
            if let Some(o) = &r.owner {
                prop_assert!(owners.insert(o.job_id));
                prop_assert_eq!(state.jobs[&o.job_id].assigned_resource.as_deref(), Some(r.id.as_str()));
            }
        }
    }

    /// The engine keeps the index of the last observation and patches it where the next one
    /// differs (objects shared between observations keep their entry facts). Over sequences of
    /// observations sharing, changing, dropping, duplicating and reordering objects, every
    /// pass equals the pass of a fresh engine.
    #[test]
    fn a_pass_does_not_depend_on_the_observations_before_it(
        entries in proptest::collection::vec(entry_gen(), 1..5),
        jobs in proptest::collection::vec(job_gen(), 0..8),
        idle in proptest::collection::vec(1u32..4, 1..4),
        steps in proptest::collection::vec(
            proptest::collection::vec((0usize..64, 0usize..VARIANTS), 0..16),
            1..6,
        ),
    ) {
        let index = build_fleet(&entries);
        let engine = || Engine::new(index.fleet.clone(), EngineConfig::default(), Box::new(Classic));
        let long_lived = engine();
        let tpus = build_tpus(&index, &idle);
        prop_assume!(!tpus.is_empty());
        // Every variant of every object is made once: observations share them as a backend's
        // cache shares unchanged objects.
        let pool: Vec<Vec<Observed>> = tpus
            .iter()
            .map(|r| {
                [
                    (NodeState::Ready, QrState::Active, true),
                    (NodeState::Creating, QrState::Provisioning, true),
                    (NodeState::Ready, QrState::Active, false),
                    (NodeState::Preempted, QrState::Suspended, true),
                ]
                .into_iter()
                .map(|(n, q, labelled)| observed(&index, r, n, q, labelled))
                .collect()
            })
            .collect();
        let mut state = State::new();
        for job in build_jobs(&jobs) {
            state.submit(job).unwrap();
        }
        for (k, picks) in steps.iter().enumerate() {
            let mut obs = Observation::default();
            for &(i, v) in picks {
                let (node, qr) = &pool[i % pool.len()][v];
                obs.nodes.push(node.clone());
                obs.queued_resources.extend(qr.clone());
            }
            let now = support::at(100 + 30 * k as i64);
            let mut fresh_state = state.clone();
            let out = long_lived.reconcile(&mut state, &obs, now);
            let fresh = engine().reconcile(&mut fresh_state, &obs, now);
            prop_assert_eq!(&out, &fresh, "pass {}", k);
            prop_assert_eq!(&state, &fresh_state, "pass {}", k);
        }
    }
}

const VARIANTS: usize = 4;

/// Two equal Spot entries in two zones of us-east1, and a job that may run in either.
fn two_zones_one_job() -> (FleetIndex, Job) {
    let index = FleetIndex::new(support::fleet(
        "  - {id: a, type: v6e-8, zone: us-east1-d, count: 2, runtime: r, chip_limit: 16}\n  - {id: b, type: v6e-8, zone: us-east1-c, count: 2, runtime: r, chip_limit: 16}\n",
    ));
    let spec = support::job_spec("j", "v6e-8", None, None, Priority::Normal, true);
    let job = Job::new(
        spec,
        support::at(0),
        vec![BucketRegion {
            region: "us-east1".into(),
            bucket: "gs://b".into(),
        }],
    );
    (index, job)
}

/// Regression (chaos sweep, chaos-trc-adopted seed 2451 with `frugal`): a job whose one chosen
/// zone was stocked out waited forever although another zone had capacity. After 15 minutes
/// of waiting its demand now races every compatible entry.
#[test]
fn frugal_races_after_waiting() {
    let (index, job) = two_zones_one_job();
    let demand = Demand::build(&index, [&job], support::at(0));
    let frugal = tpu_runner::engine::policy::of_spec(&tpu_runner::spec::PolicySpec::named(
        tpu_runner::spec::PolicyName::Frugal,
    ));
    let desired = |now| {
        frugal.desired_counts(&CapacityInput {
            index: &index,
            demand: &demand,
            waiting: &[true],
            busy: &[0, 0],
            idle_adopted: &[],
            cooling: &[false, false],
            paused: &[false, false],
            granted: &[],
            now,
        })
    };
    assert_eq!(
        desired(support::at(60)),
        vec![1, 0],
        "one request while the wait is short"
    );
    assert_eq!(
        desired(support::at(901)),
        vec![1, 1],
        "racing after 15 minutes"
    );
}

/// The peers keep to a TPU the cloud granted: with one on its way in the second of two
/// equally priced entries, a waiting job is counted there, not in the first (asked again the
/// moment its pool stops cooling, which traded the two back and forth: chaos-mixed seed 252).
#[test]
fn peers_keep_a_granted_tpu() {
    let (index, job) = two_zones_one_job();
    let demand = Demand::build(&index, [&job], support::at(0));
    for name in [
        tpu_runner::spec::PolicyName::DstackOffers,
        tpu_runner::spec::PolicyName::SkypilotFailover,
        tpu_runner::spec::PolicyName::KueueFlavors,
    ] {
        let policy =
            tpu_runner::engine::policy::of_spec(&tpu_runner::spec::PolicySpec::named(name));
        assert!(policy.reads_granted(), "{name:?}");
        let desired = |granted: &[u32]| {
            policy.desired_counts(&CapacityInput {
                index: &index,
                demand: &demand,
                waiting: &[true],
                busy: &[0, 0],
                idle_adopted: &[],
                cooling: &[false, false],
                paused: &[false, false],
                granted,
                now: support::at(60),
            })
        };
        assert_eq!(
            desired(&[]),
            vec![1, 0],
            "{name:?}: the first entry in order"
        );
        assert_eq!(desired(&[0, 0]), vec![1, 0], "{name:?}: nothing granted");
        assert_eq!(desired(&[0, 1]), vec![0, 1], "{name:?}: the granted TPU");
    }
}

/// The inventory scope: every zone of a managed entry or of a live managed record (an entry
/// removed from the fleet keeps its zone listed until its TPUs are gone), adopted TPUs by
/// name; records already gone add nothing.
#[test]
fn inventory_scope_lists_zones_and_fetches_adopted_tpus() {
    let old = FleetIndex::new(support::fleet(
        "  - {id: gone, type: v6e-8, zone: europe-west4-a, count: 1, runtime: r, chip_limit: 8}\n  - {id: old-trc, type: v4-32, zone: us-central2-a, existing: old-v4, provisioning_model: on-demand, chip_limit: 16}\n  - {id: dead, type: v6e-8, zone: asia-east1-c, count: 1, runtime: r, chip_limit: 8}\n",
    ));
    let index = FleetIndex::new(support::fleet(
        "  - {id: a, type: v6e-8, zone: us-east1-d, count: 2, runtime: r, chip_limit: 32}\n  - {id: b, type: v6e-16, zone: us-east1-d, count: 1, runtime: r, chip_limit: 32}\n  - {id: c, type: v6e-8, zone: us-west1-a, count: 1, runtime: r, chip_limit: 8}\n  - {id: trc, type: v4-32, zone: us-central2-b, existing: my-v4, provisioning_model: on-demand, chip_limit: 16}\n",
    ));
    let mut state = State::new();
    for (entry, name, status) in [
        (0, "left-behind", ResourceStatus::Idle),
        (1, "old-v4", ResourceStatus::Busy),
        (2, "long-gone", ResourceStatus::Deleted),
    ] {
        let r = Resource::new(Name::new(name), old.entry(entry), status, 1);
        state.resources.insert(r.id, r);
    }
    let scope = index.inventory_scope(&state);
    assert_eq!(scope.runner, "runner");
    assert_eq!(
        scope.zones.iter().map(Name::as_str).collect::<Vec<_>>(),
        ["europe-west4-a", "us-east1-d", "us-west1-a"]
    );
    assert_eq!(
        scope.adopted.into_iter().collect::<Vec<_>>(),
        [("us-central2-a", "old-v4"), ("us-central2-b", "my-v4")]
    );
}

proptest! {
    /// `SortedMap` behaves like a `BTreeMap` under any sequence of inserts and removals: same
    /// lookups, same iteration order, same serialised form.
    #[test]
    fn sorted_map_matches_a_btree_map(
        ops in proptest::collection::vec((any::<bool>(), "[a-e]{0,3}", any::<u8>()), 0..200)
    ) {
        use std::collections::BTreeMap;
        use tpu_runner::engine::sorted_map::SortedMap;
        let mut sorted = SortedMap::new();
        let mut reference = BTreeMap::new();
        for (insert, key, value) in ops {
            if insert {
                prop_assert_eq!(sorted.insert(Name::new(&key), value), reference.insert(key, value));
            } else {
                prop_assert_eq!(sorted.remove(&Name::new(&key)), reference.remove(&key));
            }
            prop_assert_eq!(sorted.len(), reference.len());
        }
        let got: Vec<(&str, &u8)> = sorted.iter().map(|(k, v)| (k.as_str(), v)).collect();
        let want: Vec<(&str, &u8)> = reference.iter().map(|(k, v)| (k.as_str(), v)).collect();
        prop_assert_eq!(got, want);
        for key in reference.keys() {
            prop_assert_eq!(sorted.get(&Name::new(key)), reference.get(key));
        }
        prop_assert_eq!(
            serde_json::to_string(&sorted).unwrap(),
            serde_json::to_string(&reference).unwrap()
        );
    }
}

/// A chip limit counts every TPU of its quota key, whoever created it: while someone else's
/// v6e-8 holds 8 of the 8 chips, the entry creates nothing and says so; when that TPU is gone
/// (nothing of the entry's own changed), the next pass of the same engine creates the
/// request, as a pass with empty caches does.
#[test]
fn freed_quota_is_used_by_an_entry_the_limit_held_back() {
    use tpu_runner::engine::observe::Action;
    let index = FleetIndex::new(support::fleet(
        "  - {id: a, type: v6e-8, zone: us-east1-d, count: 1, runtime: r, chip_limit: 8}\n",
    ));
    let engine = Engine::new(
        index.fleet.clone(),
        EngineConfig::default(),
        Box::new(Classic),
    );
    let mut state = State::new();
    let spec = support::job_spec("j", "v6e-8", None, None, Priority::Normal, true);
    let region = BucketRegion {
        region: "us-east1".into(),
        bucket: "gs://b".into(),
    };
    state
        .submit(Job::new(spec, support::at(0), vec![region]))
        .unwrap();
    let foreign = Arc::new(NodeInfo {
        name: Name::new("someone-elses-tpu"),
        zone: Name::new("us-east1-d"),
        tpu_type: spec::TpuType::parse("v6e-8").unwrap(),
        state: NodeState::Ready,
        health: Health::Healthy,
        spot: true,
        reserved: false,
        labels: std::collections::BTreeMap::new().into(),
        queued_resource: None,
        worker_count: 1,
        public_ip: false,
    });
    let held = Observation {
        nodes: vec![foreign],
        ..Observation::default()
    };
    let creates = |actions: &[Action]| {
        actions
            .iter()
            .filter(|a| matches!(a, Action::CreateQueuedResource { .. }))
            .count()
    };
    for k in 0..3 {
        let out = engine.reconcile(&mut state, &held, support::at(100 + 30 * k));
        assert_eq!(
            creates(&out.actions),
            0,
            "pass {k}: the foreign TPU holds the quota"
        );
    }
    assert!(state.notices.keys().any(|k| k.starts_with("chip_limit:")));
    let freed = Observation::default();
    let mut scratch = state.clone();
    let expected = engine.reconcile_from_scratch(&mut scratch, &freed, support::at(190));
    let out = engine.reconcile(&mut state, &freed, support::at(190));
    assert_eq!(
        creates(&expected.actions),
        1,
        "a pass without memory creates"
    );
    assert_eq!(out.actions, expected.actions);
    assert_eq!(out.events, expected.events);
}
