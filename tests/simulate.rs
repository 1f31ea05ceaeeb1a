//! The simulator end to end: determinism (same seed, same bytes), skipped passes change
//! nothing, the bound is reached with ample capacity and never exceeded, the bound equals a
//! general max flow, trace statistics match the data, bad scenarios get clear errors.

use std::path::{Path, PathBuf};

use proptest::prelude::*;
use tpu_runner::simulate::harness::{self, RunOptions};
use tpu_runner::simulate::metrics::{
    BoundJob, PlacedBoundJob, goodput_bound, goodput_bound_with_placement,
};
use tpu_runner::simulate::report;
use tpu_runner::simulate::scenario;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn load(rel: &str) -> scenario::Scenario {
    scenario::load(&root().join(rel)).unwrap_or_else(|e| panic!("{e}"))
}

/// A run of `seed` under `classic`.
fn classic(s: &scenario::Scenario, seed: u64, options: RunOptions) -> harness::RunResult {
    harness::run(s, "classic", seed, options, Default::default()).unwrap()
}

/// The metrics of seed 1 under `classic`.
fn classic_seed_1(s: &scenario::Scenario) -> tpu_runner::simulate::metrics::Metrics {
    classic(s, 1, RunOptions::default()).metrics
}

fn without_wall(json: &str) -> String {
    json.lines()
        .filter(|l| !l.contains("\"wall_s\""))
        .collect::<Vec<_>>()
        .join("\n")
}

#[test]
fn same_seed_same_bytes_different_seed_different_run() {
    let s = load("tests/fixtures/scenarios/faulty-small.yaml");
    let a = classic(&s, 7, RunOptions::default());
    let b = classic(&s, 7, RunOptions::default());
    let c = classic(&s, 8, RunOptions::default());
    let ja = without_wall(&report::json(std::slice::from_ref(&a)));
    let jb = without_wall(&report::json(std::slice::from_ref(&b)));
    assert_eq!(
        ja, jb,
        "replay with seed 7: tpu-runner simulate tests/fixtures/scenarios/faulty-small.yaml --seed 7"
    );
    assert_eq!(a.event_hash, b.event_hash);
    assert_ne!(
        a.event_hash, c.event_hash,
        "seeds 7 and 8 gave the same run"
    );
    assert!(
        a.metrics.preemptions > 0,
        "the fixture should exercise preemptions"
    );
}

#[test]
fn skipping_idle_passes_changes_nothing() {
    // Preemptions with a notice, stockouts, failures and API latency: time moves inside a
    // pass, and a skipped pass must see exactly what a run one would have seen.
    // A skipped pass still makes its reads: they count, use quota and may fail, so even API
    // faults and a tight read quota must not tell the two runs apart.
    // (scenario, seeds, median seconds of an inventory read if overridden, API faults)
    let cases = [
        (
            "tests/fixtures/scenarios/faulty-small.yaml",
            1..=6,
            None,
            false,
        ),
        (
            "tests/fixtures/scenarios/faulty-small.yaml",
            1..=6,
            Some(10.0),
            false,
        ),
        (
            "tests/fixtures/scenarios/faulty-small.yaml",
            1..=6,
            None,
            true,
        ),
        ("tests/fixtures/scenarios/notice.yaml", 1..=3, None, false),
    ];
    // Every policy: a decision that changes with time alone (frugal racing a job that waited
    // long enough) must ask for its wake-up, or a skipped pass would have decided it.
    for policy in tpu_runner::spec::PolicyName::ALL.map(|p| p.as_str()) {
        for (rel, seeds, read_secs, api_faults) in cases.clone() {
            let mut s = load(rel);
            if let Some(median_secs) = read_secs {
                s.cloud.api_latency.read = tpu_runner_sim::Latency {
                    median_secs,
                    sigma: 0.5,
                };
            }
            if api_faults {
                s.cloud.api = tpu_runner_sim::ApiConfig {
                    rate_limited: 0.02,
                    unavailable: 0.02,
                    timeout: 0.01,
                    lost_reply: 0.01,
                };
                s.cloud.api_quota.reads_per_minute = 12.0;
            }
            for seed in seeds {
                let run =
                    |options| harness::run(&s, policy, seed, options, Default::default()).unwrap();
                let skip = run(RunOptions::default());
                let every = run(RunOptions {
                    never_skip: true,
                    ..RunOptions::default()
                });
                assert_eq!(
                    skip.event_hash, every.event_hash,
                    "replay: tpu-runner simulate {rel} --seed {seed} --policy {policy}"
                );
                assert_eq!(
                    skip.metrics.goodput_chip_hours,
                    every.metrics.goodput_chip_hours
                );
                assert_eq!(skip.metrics.api_calls, every.metrics.api_calls);
                assert_eq!(skip.metrics.api_errors, every.metrics.api_errors);
                assert_eq!(skip.metrics.failed_passes, every.metrics.failed_passes);
                assert!(
                    skip.metrics.passes < every.metrics.passes,
                    "{} vs {}",
                    skip.metrics.passes,
                    every.metrics.passes
                );
            }
        }
    }
}

#[test]
fn checkpointing_on_the_preemption_notice_loses_only_the_notice() {
    let mut s = load("tests/fixtures/scenarios/notice.yaml");
    let run = classic_seed_1;
    let hourly = run(&s);
    for w in &mut s.workloads {
        if let scenario::WorkloadSpec::Synthetic(w) = w {
            w.checkpoint_on_notice = true;
        }
    }
    let on_notice = run(&s);
    assert!(hourly.preemptions > 5, "{} preemptions", hourly.preemptions);
    // Each preemption costs at most the 30 s notice on 8 chips.
    let at_most = on_notice.preemptions as f64 * 30.0 * 8.0 / 3600.0;
    assert!(
        on_notice.lost_chip_hours <= at_most + 1e-9,
        "lost {} > {at_most}",
        on_notice.lost_chip_hours
    );
    assert!(on_notice.lost_chip_hours > 0.0);
    assert!(
        hourly.lost_chip_hours > 5.0 * on_notice.lost_chip_hours,
        "hourly checkpoints lose {}, notice checkpoints {}",
        hourly.lost_chip_hours,
        on_notice.lost_chip_hours
    );
}

#[test]
fn slow_api_calls_delay_the_next_pass() {
    use tpu_runner_sim::{ApiLatency, Latency};
    let mut s = load("tests/fixtures/scenarios/faulty-small.yaml");
    let run = classic_seed_1;
    s.cloud.api_latency = ApiLatency::ZERO;
    let instant = run(&s);
    s.cloud.api_latency.mutation = Latency {
        median_secs: 20.0,
        sigma: 0.0,
    };
    let slow = run(&s);
    // Mutations are made one after another: a pass that creates or deletes k requests takes
    // 20k s, so there are fewer passes and jobs wait longer.
    assert!(
        slow.passes < instant.passes,
        "{} vs {} passes",
        slow.passes,
        instant.passes
    );
    assert!(slow.queue_wait_s.mean > instant.queue_wait_s.mean);
    // Latencies are a pure function of seed, pass and call.
    let cloud = tpu_runner_sim::SimCloud::new(harness::cloud_config(&s, 7, None));
    let a = cloud.call_latency_ms(tpu_runner_sim::CallKind::Read, 30_000, 0);
    assert_eq!(
        a,
        cloud.call_latency_ms(tpu_runner_sim::CallKind::Read, 30_000, 0)
    );
    assert_eq!(
        cloud.call_latency_ms(tpu_runner_sim::CallKind::Mutation, 30_000, 3),
        20_000
    );
}

#[test]
fn read_quotas_throttle_the_inventory() {
    let mut s = load("tests/fixtures/scenarios/faulty-small.yaml");
    let free = classic_seed_1(&s);
    assert_eq!(free.failed_passes, 0);
    // 4 reads per pass (a node list and a queued-resource list in each of 2 zones), one
    // pass about every 30 s. With 12 reads a minute the bucket keeps up; jobs run as
    // before, give or take a retried pass.
    s.cloud.api_quota.reads_per_minute = 12.0;
    let enough = classic_seed_1(&s);
    assert!(enough.failed_passes * 10 < enough.passes, "{enough:?}");
    assert!(enough.jobs_succeeded * 10 >= free.jobs_succeeded * 9);
    // With 3 a minute a pass spends the refill and fails on its 2nd or 3rd read, every
    // time: the controller starves. (Reading every declared name, as the original did,
    // needs 14 reads per pass here: it starved at 20 a minute.)
    s.cloud.api_quota.reads_per_minute = 3.0;
    let starved = classic_seed_1(&s);
    assert!(
        starved.failed_passes > 10 * starved.passes.max(1),
        "{starved:?}"
    );
    assert_eq!(starved.jobs_succeeded, 0);
    assert!(
        starved
            .api_errors
            .get("quota_exceeded")
            .copied()
            .unwrap_or(0)
            > 0
    );
}

#[test]
fn ample_capacity_without_preemption_reaches_the_bound() {
    let s = load("scenarios/smoke.yaml");
    for seed in 1..=3 {
        let r = classic(&s, seed, RunOptions::default());
        assert_eq!(
            r.metrics.jobs_succeeded, r.metrics.jobs_submitted,
            "seed {seed}"
        );
        assert!(
            r.metrics.efficiency > 0.999,
            "seed {seed}: efficiency {}",
            r.metrics.efficiency
        );
    }
}

#[test]
fn goodput_never_exceeds_the_bound() {
    // Every policy; pinned regions, adopted TPUs, whole-slice failures, and (with the data)
    // trace-driven capacity and mixed widths.
    let mut files = vec![
        "tests/fixtures/scenarios/faulty-small.yaml",
        "scenarios/smoke.yaml",
        "scenarios/regional-stockout.yaml",
        "scenarios/huge-multihost.yaml",
        "scenarios/trc-mixed.yaml",
        "scenarios/philly-replay.yaml",
    ];
    if shared_data().is_some() {
        files.push("scenarios/traces/preemption-storm.yaml");
        files.push("scenarios/traces/spot-stockouts.yaml");
    }
    for rel in files {
        let s = load_traced(rel);
        for policy in tpu_runner::spec::PolicyName::ALL.map(|p| p.as_str()) {
            for seed in 1..=2 {
                let r = harness::run(&s, policy, seed, RunOptions::default(), Default::default())
                    .unwrap();
                let m = &r.metrics;
                let replay = format!("tpu-runner simulate {rel} --seed {seed} --policy {policy}");
                assert!(
                    m.goodput_chip_hours <= m.bound_goodput_chip_hours * (1.0 + 1e-9) + 1e-6,
                    "{replay}: {} > {}",
                    m.goodput_chip_hours,
                    m.bound_goodput_chip_hours
                );
                assert!(
                    m.busy_chip_hours <= m.allocated_chip_hours + 1e-6,
                    "{replay}: busy > allocated"
                );
            }
        }
    }
}

proptest! {
    #[test]
    fn bound_is_the_max_flow(
        jobs in proptest::collection::vec((0u32..6, 1u32..40, 1u32..4), 0..8),
        caps in proptest::collection::vec(0u32..12, 1..6),
    ) {
        let jobs: Vec<BoundJob> = jobs.iter().map(|&(r, w, width)| BoundJob { release_s: r as f64, work: w as f64, width: width as f64 }).collect();
        let caps: Vec<f64> = caps.iter().map(|&c| c as f64).collect();
        // One resource every job may use: the placed flow is the plain one.
        let placed: Vec<PlacedBoundJob> = jobs.iter().map(|&job| PlacedBoundJob { job, set: 0 }).collect();
        prop_assert_eq!(goodput_bound(&jobs, &caps, 1.0), placed_max_flow(&placed, &[vec![0]], &[caps]));
    }
}

/// The exact max flow with placement: source → job (work) → (job, slot) (width × slot) →
/// (slot, resource) for each resource of the job's set → sink (the resource's capacity).
fn placed_max_flow(jobs: &[PlacedBoundJob], sets: &[Vec<usize>], caps: &[Vec<f64>]) -> f64 {
    use pathfinding::directed::edmonds_karp::{SparseCapacity, edmonds_karp};
    let (n_jobs, n_res, n_slots) = (jobs.len(), caps.len(), caps[0].len());
    let (source, sink) = (0usize, 1usize);
    let job_node = |j: usize| 2 + j;
    let job_slot = |j: usize, t: usize| 2 + n_jobs + j * n_slots + t;
    let res_slot = |r: usize, t: usize| 2 + n_jobs + n_jobs * n_slots + r * n_slots + t;
    let vertices: Vec<usize> = (0..2 + n_jobs + n_jobs * n_slots + n_res * n_slots).collect();
    let mut edges = Vec::new();
    for (j, pj) in jobs.iter().enumerate() {
        edges.push(((source, job_node(j)), pj.job.work as i64));
        for t in (pj.job.release_s as usize).min(n_slots)..n_slots {
            edges.push(((job_node(j), job_slot(j, t)), pj.job.width as i64));
            for &r in &sets[pj.set] {
                edges.push(((job_slot(j, t), res_slot(r, t)), i64::MAX / 4));
            }
        }
    }
    for (r, row) in caps.iter().enumerate() {
        for (t, c) in row.iter().enumerate() {
            edges.push(((res_slot(r, t), sink), *c as i64));
        }
    }
    let (_, total, _) =
        edmonds_karp::<_, _, _, SparseCapacity<_>>(&vertices, &source, &sink, edges);
    total as f64
}

proptest! {
    /// The placement-aware bound never falls below what any schedule can do (the exact
    /// flow), never rises above the pooled bound, and is exact when every job may use one
    /// resource only or every resource.
    #[test]
    fn placement_bound_lies_between_the_exact_flow_and_the_pooled_bound(
        jobs in proptest::collection::vec((0u32..4, 1u32..30, 1u32..4, 0usize..6), 0..7),
        caps in proptest::collection::vec(proptest::collection::vec(0u32..8, 4), 1..4),
        masks in proptest::collection::vec(0u8..16, 6),
    ) {
        let n_res = caps.len();
        let sets: Vec<Vec<usize>> = masks
            .iter()
            .map(|m| (0..n_res).filter(|r| m & (1 << r) != 0).collect())
            .collect();
        let jobs: Vec<PlacedBoundJob> = jobs
            .iter()
            .map(|&(r, w, width, set)| PlacedBoundJob {
                job: BoundJob { release_s: r as f64, work: w as f64, width: width as f64 },
                set,
            })
            .collect();
        let caps: Vec<Vec<f64>> =
            caps.iter().map(|row| row.iter().map(|&c| c as f64).collect()).collect();
        let ours = goodput_bound_with_placement(&jobs, &sets, &caps, 1.0);
        let exact = placed_max_flow(&jobs, &sets, &caps);
        let pooled_caps: Vec<f64> = (0..4).map(|t| caps.iter().map(|row| row[t]).sum()).collect();
        let all: Vec<BoundJob> = jobs.iter().map(|j| j.job).collect();
        let pooled = goodput_bound(&all, &pooled_caps, 1.0);
        prop_assert!(exact <= ours + 1e-9, "exact {exact} > bound {ours}");
        prop_assert!(ours <= pooled + 1e-9, "bound {ours} > pooled {pooled}");
        if jobs.iter().all(|j| sets[j.set].len() == 1) {
            prop_assert_eq!(ours, exact);
        }
        if jobs.iter().all(|j| sets[j.set].len() == n_res) {
            prop_assert_eq!(ours, pooled);
        }
    }
}

/// The unlicensed spot traces, when this checkout has them beside it (`../shared/data`, or
/// `TPU_RUNNER_TRACES`); scenarios/traces/README.md says how to fetch them.
fn shared_data() -> Option<PathBuf> {
    let dir = std::env::var_os("TPU_RUNNER_TRACES")
        .map(PathBuf::from)
        .unwrap_or_else(|| root().join("../shared/data"));
    if dir.join("spot-traces").is_dir() {
        Some(dir)
    } else {
        eprintln!(
            "note: the spot traces are absent (../shared/data, TPU_RUNNER_TRACES); trace statistics and scenarios/traces not checked"
        );
        None
    }
}

/// Loads a shipped scenario, with `$TRACES` from `shared_data()`.
fn load_traced(rel: &str) -> scenario::Scenario {
    scenario::load_with(&root().join(rel), shared_data().as_deref())
        .unwrap_or_else(|e| panic!("{e}"))
}

#[test]
fn vendored_philly_data_loads_with_its_documented_statistics() {
    // The vendored copies (scenarios/data, MIT and CC BY 4.0) are what ../shared/data holds.
    let data = root().join("scenarios/data");
    let csv = std::fs::read_to_string(data.join("gavel_philly_vc_traces_seed0.csv")).unwrap();
    let widths = tpu_runner_sim::workload::read_column(&csv, "scale_factor").unwrap();
    assert_eq!(widths.len(), 15_264);
    assert_eq!(widths.iter().filter(|w| **w == 1.0).count(), 10_480);
    let runtimes =
        std::fs::read_to_string(data.join("philly_runtime_from_alibaba_analysis.csv")).unwrap();
    let mut r = tpu_runner_sim::workload::read_column(&runtimes, "runtime").unwrap();
    r.sort_by(f64::total_cmp);
    assert_eq!(r.len(), 83_154);
    assert!(
        (r[r.len() / 2] - 1186.0).abs() < 2.0,
        "median {}",
        r[r.len() / 2]
    );
    for file in ["README.md", "LICENSE-gavel"] {
        assert!(
            data.join(file).is_file(),
            "{file}: the licence and attribution travel with the data"
        );
    }
}

#[test]
fn trace_loader_reproduces_the_data() {
    let Some(data) = shared_data() else { return };
    let mut checked = 0;
    for entry in std::fs::read_dir(data.join("spot-traces")).unwrap() {
        let path = entry.unwrap().path();
        let text = std::fs::read_to_string(&path).unwrap();
        let trace = tpu_runner_sim::SpotTrace::parse(&text).unwrap();
        // Independent recount from the raw JSON.
        let raw: serde_json::Value = serde_json::from_str(&text).unwrap();
        let values: Vec<u64> = raw["data"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_u64().unwrap())
            .collect();
        let available = values.iter().filter(|v| **v > 0).count() as f64 / values.len() as f64;
        let drops = values.windows(2).filter(|w| w[0] > 0 && w[1] == 0).count();
        assert!(
            (trace.availability() - available).abs() < 1e-12,
            "{}",
            path.display()
        );
        assert_eq!(trace.drops_to_zero(), drops, "{}", path.display());
        assert_eq!(
            trace.gap_seconds,
            raw["metadata"]["gap_seconds"].as_u64().unwrap()
        );
        checked += 1;
    }
    assert!(checked >= 10);
    // Values published in ../shared/data/README.md's description of the traces.
    let t = tpu_runner_sim::SpotTrace::parse(
        &std::fs::read_to_string(
            data.join("spot-traces/aws-04-19-2023_preemption_1-node_us-east-1c_intel_64.json"),
        )
        .unwrap(),
    )
    .unwrap();
    assert_eq!((t.drops_to_zero(), t.peak(), t.gap_seconds), (128, 1, 34));
    assert!((t.availability() - 0.639).abs() < 0.001);
}

#[test]
fn simulated_capacity_follows_the_trace_with_scale_offset_repeat_and_outages() {
    let dir = tempfile::tempdir().unwrap();
    let values = [1u32, 0, 2, 1, 0];
    let gap = 600u64;
    std::fs::write(
        dir.path().join("trace.json"),
        format!(r#"{{"metadata": {{"gap_seconds": {gap}}}, "data": {values:?}}}"#),
    )
    .unwrap();
    let text = std::fs::read_to_string(root().join("scenarios/smoke.yaml"))
        .unwrap()
        .replace(
            "horizon_hours: 24",
            "horizon_hours: 24\ncloud:\n  pools:\n    - {zone: us-east1-d, type: v6e-8, \
             capacity: {trace: {file: trace.json, scale: 3, offset_hours: 0.5}}, \
             outages_hours: [[2, 2.5]]}",
        );
    let path = dir.path().join("traced.yaml");
    let s = scenario::parse(&path, &text).unwrap_or_else(|e| panic!("{e}"));
    let mut cloud = tpu_runner_sim::SimCloud::new(harness::cloud_config(&s, 1, None));
    let offset = 1800u64;
    // Every minute for three passes through the trace (it repeats).
    for minute in 0..(3 * values.len() as u64 * gap / 60) {
        let t = minute * 60;
        cloud.advance_to(t * 1000);
        let expected = if (7200..9000).contains(&t) {
            0
        } else {
            values[(((t + offset) / gap) as usize) % values.len()] * 3
        };
        assert_eq!(cloud.available_slices()[0], expected, "at {t} s");
    }
}

#[test]
fn shipped_scenarios_load() {
    // Everything of the default glob loads on a fresh clone, with no data beside it.
    for entry in std::fs::read_dir(root().join("scenarios")).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "yaml") {
            let s = scenario::load_with(&path, Some(Path::new("/nonexistent")))
                .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            assert!(!s.workloads.is_empty());
        }
    }
    // Those that need the spot traces load with them, and without say where to get them.
    for entry in std::fs::read_dir(root().join("scenarios/traces")).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "yaml") {
            let without = scenario::load_with(&path, Some(Path::new("/nonexistent")));
            let e = without.expect_err("needs the traces").to_string();
            assert!(
                e.contains("--traces") && e.contains("scenarios/traces/README.md"),
                "{e}"
            );
            if let Some(data) = shared_data() {
                scenario::load_with(&path, Some(&data))
                    .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            }
        }
    }
}

#[test]
fn bad_scenarios_get_clear_errors() {
    insta::glob!("fixtures/scenarios/invalid/*.yaml", |path: &Path| {
        let err = scenario::load(path).expect_err("invalid fixture");
        let text = err
            .to_string()
            .replace(env!("CARGO_MANIFEST_DIR"), "<root>");
        assert!(text.contains(":"), "{text}");
        insta::assert_snapshot!(text);
    });
}

#[test]
fn a_freed_slice_goes_to_the_oldest_request_still_waiting() {
    // The pool of the one-pool scenario has 8 slices: of 12 requests the first 8 provision.
    // A waiting request deleted, or created again under its name, loses its place; freed
    // slices go to the oldest requests still waiting, in creation order.
    use std::sync::Arc;
    use tpu_runner_sim::cloud::QrState;
    use ustr::ustr;

    let s = load("scenarios/bench/one-pool.yaml");
    let mut cloud = tpu_runner_sim::SimCloud::new(harness::cloud_config(&s, 1, None));
    let zone = ustr("us-east1-d");
    let name = |i: usize| ustr(&format!("qr-{i:02}"));
    let create = |cloud: &mut tpu_runner_sim::SimCloud, i: usize| {
        cloud
            .create_queued_resource(
                zone,
                name(i),
                name(i),
                "v6e-8",
                tpu_runner_sim::PoolModel::Spot,
                None,
                Arc::new(Default::default()),
            )
            .unwrap()
    };
    for i in 0..12 {
        create(&mut cloud, i);
    }
    let states = |cloud: &tpu_runner_sim::SimCloud| -> Vec<QrState> {
        (0..12)
            .map(|i| {
                cloud
                    .peek_queued_resource(zone, name(i))
                    .map_or(QrState::Deleting, |q| q.state)
            })
            .collect()
    };
    let waiting = |cloud: &tpu_runner_sim::SimCloud| -> Vec<usize> {
        let states = states(cloud);
        (0..12)
            .filter(|&i| states[i] == QrState::WaitingForResources)
            .collect()
    };
    assert_eq!(waiting(&cloud), vec![8, 9, 10, 11]);
    // Request 8 is deleted while waiting; its deletion finishes and it is created again:
    // it is now the newest.
    let delete_ms = (cloud.config().delete_secs * 1000.0) as u64 + 1;
    cloud.delete_queued_resource(zone, name(8)).unwrap();
    cloud.advance_to(cloud.now() + delete_ms);
    create(&mut cloud, 8);
    assert_eq!(waiting(&cloud), vec![8, 9, 10, 11]);
    // Three slices are freed: requests 9, 10 and 11 take them, 8 still waits.
    for i in 0..3 {
        cloud.delete_queued_resource(zone, name(i)).unwrap();
    }
    cloud.advance_to(cloud.now() + delete_ms);
    assert_eq!(waiting(&cloud), vec![8]);
    cloud.delete_queued_resource(zone, name(3)).unwrap();
    cloud.advance_to(cloud.now() + delete_ms);
    assert_eq!(waiting(&cloud), Vec::<usize>::new());
}

#[test]
fn the_inventory_lists_the_runners_objects_per_zone_and_rereads_only_changes() {
    use std::sync::Arc;
    use tpu_runner::backend::sim::SimBackend;
    use tpu_runner::backend::{CloudBackend, Inventory};
    use tpu_runner::engine::observe::{NodeState, QrState};
    use tpu_runner::engine::{InventoryScope, Timestamp};
    use ustr::ustr;

    let s = load("tests/fixtures/scenarios/faulty-small.yaml");
    let mut cloud = tpu_runner_sim::SimCloud::new(harness::cloud_config(&s, 1, None));
    let labels = |runner: &str| {
        Arc::new(
            [("managed-by".to_owned(), runner.to_owned())]
                .into_iter()
                .collect(),
        )
    };
    for (zone, node, runner) in [
        ("us-west1-a", "b", "me"),
        ("us-west1-a", "a", "me"),
        ("us-west1-a", "c", "someone-else"),
        ("us-east1-d", "d", "me"),
    ] {
        cloud
            .create_queued_resource(
                ustr(zone),
                ustr(&format!("qr-{node}")),
                ustr(node),
                "v6e-8",
                tpu_runner_sim::PoolModel::Spot,
                None,
                labels(runner),
            )
            .unwrap();
    }
    let mut backend = SimBackend::new(cloud, Timestamp(0), "me", false);
    let scope = InventoryScope {
        runner: "me",
        zones: std::borrow::Cow::Owned(
            [tpu_runner::spec::Name::new("us-west1-a")]
                .into_iter()
                .collect(),
        ),
        adopted: Default::default(),
    };
    // Read into the lists the previous read left, as the driver does.
    let mut kept = Default::default();
    let mut read = |backend: &mut SimBackend| {
        backend.inventory(&scope, Timestamp(0), &mut kept).unwrap();
        kept.clone()
    };
    let Inventory {
        queued_resources: qrs,
        others,
        ..
    } = read(&mut backend);
    // Ours, in this zone, in name order; one call per zone and kind. Someone else's request
    // is listed apart (it counts against the chip limits, nothing acts on it).
    let names: Vec<&str> = qrs.iter().map(|q| q.name.as_str()).collect();
    assert_eq!(names, ["qr-a", "qr-b"]);
    let names: Vec<&str> = others
        .queued_resources
        .iter()
        .map(|q| q.name.as_str())
        .collect();
    assert_eq!(names, ["qr-c"]);
    assert!(qrs.iter().all(|q| q.state != QrState::Active), "{qrs:?}");
    let calls = |b: &SimBackend, kind: &str| b.cloud.accounting().api_calls.get(kind).copied();
    assert_eq!(calls(&backend, "list_queued_resources"), Some(1));
    assert_eq!(calls(&backend, "get_queued_resource"), None);
    // Unchanged objects are shared with the previous read, not converted again; the call
    // that found the zone unchanged still counts.
    let again = read(&mut backend).queued_resources;
    assert!(Arc::ptr_eq(&qrs[0], &again[0]) && Arc::ptr_eq(&qrs[1], &again[1]));
    assert_eq!(calls(&backend, "list_queued_resources"), Some(2));
    // Changes are seen on the next read: the requests were granted, nodes came up.
    backend.cloud.advance_to(3_600_000);
    let Inventory {
        nodes,
        queued_resources: qrs,
        others,
    } = read(&mut backend);
    // Someone else's request is still listed apart after the zone changed.
    assert_eq!(others.queued_resources.len(), 1, "{others:?}");
    assert_eq!(others.queued_resources[0].name.as_str(), "qr-c");
    for q in &qrs {
        let now = backend
            .cloud
            .get_queued_resource(q.zone.ustr(), q.name.ustr())
            .unwrap();
        assert_eq!(
            format!("{:?}", now.unwrap().state),
            format!("{:?}", q.state)
        );
    }
    assert!(qrs.iter().any(|q| q.state == QrState::Active), "{qrs:?}");
    assert!(!Arc::ptr_eq(&qrs[0], &again[0]));
    let names: Vec<&str> = nodes.iter().map(|n| n.name.as_str()).collect();
    assert_eq!(names, ["a", "b"]);
    assert!(
        nodes.iter().any(|n| n.state == NodeState::Ready),
        "{nodes:?}"
    );
    // Deleted objects leave the listing.
    backend
        .cloud
        .delete_queued_resource(ustr("us-west1-a"), ustr("qr-a"))
        .unwrap();
    backend.cloud.advance_to(2 * 3_600_000);
    let qrs = read(&mut backend).queued_resources;
    let names: Vec<&str> = qrs.iter().map(|q| q.name.as_str()).collect();
    assert_eq!(names, ["qr-b"]);
}

/// A fleet of `count` v6e-8 TPUs (8 chips each) under a horizon of `hours`, `jobs` jobs of
/// about `work` seconds, and API calls whose remote (SSH) and mutation medians are given:
/// the scenario for the horizon property.
fn slow_api_scenario(
    count: u32,
    hours: u32,
    jobs: u32,
    work: u32,
    remote: f64,
    mutation: f64,
) -> scenario::Scenario {
    let chips = count.max(1) * 8;
    let text = format!(
        r#"name: slow-api
description: generated
fleet:
  name: slow
  project: sim-project-1
  controller_region: us-central1
  controller_timeout: 168h
  firestore_location: nam5
  network: default
  subnetwork: default
  ssh_transport: iap
  idle_timeout_seconds: 300
  tpus:
    - {{id: east, type: v6e-8, zone: us-east1-d, count: {count}, runtime: v2-alpha-tpuv6e, chip_limit: {chips}}}
horizon_hours: {hours}
seeds: [1]
types_by_width: {{8: [v6e-8]}}
cloud:
  api_latency:
    remote: {{median_secs: {remote}, sigma: 0.3}}
    mutation: {{median_secs: {mutation}, sigma: 0.3}}
workload:
  - kind: synthetic
    name: w
    count: {jobs}
    interarrival: {{exponential: 600}}
    duration: {{lognormal: {{median: {work}, sigma: 0.5}}}}
    widths: {{8: 1}}
    regions: [{{regions: [us-east1]}}]
    checkpoint_secs: 600
"#
    );
    scenario::parse(Path::new("slow-api.yaml"), &text).unwrap_or_else(|e| panic!("{e}"))
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]
    /// Nothing the simulator reports exceeds what the cloud gave within the horizon, however
    /// long the last pass's calls take (a launch taking hours ends past the horizon): the
    /// efficiency is at most 1, allocated chip-hours at most the fleet's chips × the horizon,
    /// busy at most allocated.
    #[test]
    fn no_metric_exceeds_the_horizons_capacity(
        seed in 1u64..1000,
        count in 1u32..4,
        hours in 1u32..8,
        jobs in 1u32..30,
        work in 600u32..20_000,
        remote in prop::sample::select(vec![3.0, 600.0, 7200.0, 72_000.0]),
        mutation in prop::sample::select(vec![1.0, 3600.0, 36_000.0]),
    ) {
        let s = slow_api_scenario(count, hours, jobs, work, remote, mutation);
        let r = classic(&s, seed, RunOptions::default());
        let m = &r.metrics;
        let replay = format!("seed {seed}, {count} TPUs, {hours} h, {jobs} jobs of ~{work} s, remote {remote} s, mutation {mutation} s");
        let capacity = f64::from(count * 8 * hours);
        prop_assert!(m.allocated_chip_hours <= capacity + 1e-6, "{replay}: allocated {} > {capacity}", m.allocated_chip_hours);
        prop_assert!(m.busy_chip_hours <= m.allocated_chip_hours + 1e-6, "{replay}: busy {} > allocated {}", m.busy_chip_hours, m.allocated_chip_hours);
        prop_assert!(m.efficiency <= 1.0 + 1e-9, "{replay}: efficiency {}", m.efficiency);
        prop_assert!(m.simulated_s <= f64::from(hours) * 3600.0, "{replay}: simulated {} s", m.simulated_s);
    }
}

/// A scenario compares policy variants with their own parameters, laid over the fleet's
/// policy: each row is labelled with its variant, `race_after` decides (5 min and 15 min
/// give different runs), and `frugal` that races at once decides exactly as `classic`.
#[test]
fn policy_variants_with_parameters_are_compared_by_label() {
    let dir = tempfile::tempdir().unwrap();
    let text = std::fs::read_to_string(root().join("scenarios/regional-stockout.yaml"))
        .unwrap()
        .replace(
            "fleet: fleets/multi-region.yaml",
            &format!(
                "fleet: {}",
                root().join("scenarios/fleets/multi-region.yaml").display()
            ),
        )
        .replace(
            "policies: [classic, frugal]",
            "policies:\n  classic: {}\n  frugal: {}\n  frugal-5m: {name: frugal, race_after: 5m}\n  frugal-0s: {name: frugal, race_after: 0s}",
        );
    let path = dir.path().join("variants.yaml");
    std::fs::write(&path, text).unwrap();
    let s = scenario::load(&path).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(s.policies, ["classic", "frugal", "frugal-5m", "frugal-0s"]);
    assert_eq!(s.policy("frugal-5m").unwrap().race_after_secs, 300);
    assert!(s.policy("frugal-1m").is_none());
    let run = |label: &str| {
        harness::run(&s, label, 1, RunOptions::default(), Default::default()).unwrap()
    };
    let (classic, frugal, quick, at_once) = (
        run("classic"),
        run("frugal"),
        run("frugal-5m"),
        run("frugal-0s"),
    );
    assert_eq!(quick.policy, "frugal-5m");
    assert_ne!(frugal.event_hash, quick.event_hash, "race_after decides");
    assert_eq!(
        classic.event_hash, at_once.event_hash,
        "frugal racing at once is classic"
    );
}

/// A scenario may start from a live state: the snapshot's pending and running jobs are the
/// queue at time 0 (in their order, with their types, regions and priorities), their work
/// drawn from the given duration; "what happens to my queue under policy X" is one run.
#[test]
fn a_scenario_starts_from_a_state_snapshot() {
    let dir = tempfile::tempdir().unwrap();
    let example = root().join("docs/plan-example");
    let scenario = dir.path().join("queue.yaml");
    std::fs::write(
        &scenario,
        format!(
            "name: live-queue\nfleet: {}\nhorizon_hours: 12\nseeds: [1, 2]\ntypes_by_width: {{16: [v6e-16, v5litepod-16]}}\ninitial_state: {{file: {}, duration: {{constant: 1800}}}}\n",
            example.join("deployment.yaml").display(),
            example.join("state.json").display()
        ),
    )
    .unwrap();
    let s = scenario::load(&scenario).unwrap_or_else(|e| panic!("{e}"));
    let r = classic(&s, 1, RunOptions::default());
    // One running and three pending jobs in the snapshot: the one asking for a type no
    // entry has is skipped, the other three run to the end.
    assert_eq!(r.metrics.jobs_skipped, 1, "{:?}", r.metrics);
    assert_eq!(r.metrics.jobs_submitted, 3, "{:?}", r.metrics);
    assert_eq!(r.metrics.jobs_succeeded, 3, "{:?}", r.metrics);
    assert!(r.metrics.jct_s.p50 >= 1800.0, "{:?}", r.metrics.jct_s);
    let arrivals = harness::arrivals(&s, 1);
    assert!(
        arrivals.windows(2).all(|w| w[0].at_secs < w[1].at_secs),
        "in order"
    );
    assert!(
        arrivals.iter().all(|a| a.types.is_some()),
        "with their own types"
    );
    // A damaged snapshot is refused with its problems.
    std::fs::write(
        dir.path().join("bad.json"),
        "{\"schema_version\": 1, \"jobs\": 3}",
    )
    .unwrap();
    std::fs::write(
        &scenario,
        format!(
            "name: bad\nfleet: {}\nhorizon_hours: 1\ntypes_by_width: {{16: [v6e-16]}}\ninitial_state: bad.json\n",
            example.join("deployment.yaml").display()
        ),
    )
    .unwrap();
    let err = scenario::load(&scenario).unwrap_err().to_string();
    assert!(
        err.contains("initial_state") && err.contains("not a valid state snapshot"),
        "{err}"
    );
}

/// A trace longer than the horizon costs what arrives within it: the rows after it are
/// never made into jobs (a ten-million-row trace under a one-hour horizon took 4.9 GB), and
/// the jobs that do arrive are those a longer horizon gives, draw for draw. Files that bring
/// more jobs within the horizon than a run can hold are refused before anything runs,
/// naming the limit.
#[test]
fn a_trace_is_replayed_up_to_the_horizon_and_a_huge_one_is_refused() {
    use std::io::Write;
    let dir = tempfile::tempdir().unwrap();
    let rows = scenario::MAX_REPLAYED_JOBS + 1;
    let mut csv = std::io::BufWriter::new(std::fs::File::create(dir.path().join("t.csv")).unwrap());
    writeln!(csv, "arrival_time_s,scale_factor,dur").unwrap();
    for i in 0..rows {
        writeln!(csv, "{},1,600", i * 2).unwrap();
    }
    csv.into_inner().unwrap().sync_all().unwrap();
    let scenario_of = |hours: &str| {
        format!(
            "name: t\nfleet: {fleet}\nhorizon_hours: {hours}\nseeds: [1]\ntypes_by_width: {{8: [v6e-8]}}\n\
             workload:\n  - kind: trace\n    name: t\n    file: t.csv\n    arrival_column: arrival_time_s\n    \
             width_column: scale_factor\n    duration_column: dur\n    chips_per_unit: 8\n    \
             regions: [{{regions: [us-east1]}}]\n",
            fleet = root().join("scenarios/fleets/philly.yaml").display()
        )
    };
    let path = dir.path().join("t.yaml");
    let short = scenario::parse(&path, &scenario_of("1")).unwrap_or_else(|e| panic!("{e}"));
    let arrivals = harness::arrivals(&short, 1);
    // One every 2 s, the first at 0 and the last at the horizon itself.
    assert_eq!(arrivals.len(), 1801);
    let two = scenario::parse(&path, &scenario_of("2")).unwrap_or_else(|e| panic!("{e}"));
    let longer = harness::arrivals(&two, 1);
    assert_eq!(longer.len(), 3601);
    assert_eq!(format!("{:?}", &longer[..1801]), format!("{arrivals:?}"));
    // Past the limit: refused before anything runs, the limit named.
    assert!(scenario::check_replayed_jobs(&two).is_ok());
    let long = scenario::parse(&path, &scenario_of("2000")).unwrap_or_else(|e| panic!("{e}"));
    let e = scenario::check_replayed_jobs(&long).unwrap_err();
    assert!(
        e.contains(&format!(
            "bring {rows} jobs within the horizon; a run replays at most {}",
            scenario::MAX_REPLAYED_JOBS
        )),
        "{e}"
    );
}
