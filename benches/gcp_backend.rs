//! `GcpBackend` over loopback HTTP to the TPU API emulator:
//! - the inventory read of a pass on the scale fleet (192 entries in 12 regions, one queued
//!   resource and TPU per entry): its calls per pass (printed: one listing per zone and kind,
//!   O(zones), not O(entries)) and wall time, on the emulator's virtual clock (so the time
//!   is HTTP, JSON and parsing alone);
//! - 200 creates in one pass, 16 at once versus one at a time, on the emulator's wall clock
//!   at 50× (each create waits its modelled latency, a median of 1 s, so 20 ms here): the
//!   pass's time is latency-bound, as against GCP.

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use criterion::{BatchSize, Criterion, criterion_group, criterion_main};
use tpu_runner::backend::gcp::{CreateSettings, GcpBackend};
use tpu_runner::backend::workers::EmulatedWorkers;
use tpu_runner::backend::{CloudBackend, Inventory};
use tpu_runner::emulator::{self, Clock, Running, World};
use tpu_runner::engine::observe::{LABEL_FLEET_ENTRY, LABEL_MANAGED_BY};
use tpu_runner::engine::state::State;
use tpu_runner::engine::{Action, Engine};
use tpu_runner::gcp::http::{Endpoint, RetryPolicy};
use tpu_runner::gcp::tpu::{Client, Quotas};
use tpu_runner::simulate::harness::{self, EPOCH};
use tpu_runner::simulate::scenario::{self, Scenario};
use tpu_runner::spec::Name;
use ustr::Ustr;

fn scale() -> Scenario {
    scenario::load(
        &std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("scenarios/bench/scale.yaml"),
    )
    .unwrap_or_else(|e| panic!("{e}"))
}

/// The scale scenario's world on `clock`, served; one queued resource per fleet entry,
/// provisioned when `provisioned`.
fn serve(s: &Scenario, clock: Clock, provisioned: bool) -> Running {
    let (mut sim, _) = harness::world_of(s, 1, None);
    for entry in &s.fleet.tpus {
        let labels = Arc::new(
            [
                (LABEL_MANAGED_BY.to_owned(), s.fleet.name.clone()),
                (LABEL_FLEET_ENTRY.to_owned(), entry.id.to_string()),
            ]
            .into_iter()
            .collect(),
        );
        let node = format!("{}-{}-0", s.fleet.name, entry.id);
        let _ = sim.cloud.create_queued_resource(
            entry.zone.ustr(),
            Ustr::from(&format!("{node}-qr")),
            Ustr::from(&node),
            &entry.tpu_type.to_string(),
            tpu_runner::backend::sim::pool_model(entry.provisioning_model),
            entry.reservation.as_deref(),
            labels,
        );
    }
    if provisioned {
        sim.cloud.advance_to(3_600_000);
    }
    let world = World::new(sim, &s.fleet.project, clock).shared();
    emulator::start(world, "127.0.0.1:0").expect("emulator")
}

fn backend(running: &Running, s: &Scenario, concurrency: usize) -> GcpBackend {
    let endpoint = Endpoint::emulator(&running.url());
    let quotas = Quotas {
        reads_per_minute: 60_000_000,
        writes_per_minute: 60_000_000,
    };
    let client = Client::new(
        endpoint.clone(),
        &s.fleet.project,
        quotas,
        RetryPolicy::default(),
    )
    .unwrap();
    let workers = EmulatedWorkers::new(&endpoint, &s.fleet.project).unwrap();
    let mut b = GcpBackend::new(
        client,
        CreateSettings::of_fleet(&s.fleet),
        Box::new(workers),
    );
    b.concurrency = concurrency;
    b
}

fn gcp_backend(c: &mut Criterion) {
    let s = scale();
    let engine = Engine::of_fleet(s.fleet.clone());
    let state = State::new();
    let scope = engine.inventory_scope(&state);

    let running = serve(&s, Clock::Virtual, true);
    let mut b = backend(&running, &s, 16);
    let mut inventory = Inventory::default();
    let before = b.api_calls();
    b.inventory(&scope, EPOCH, &mut inventory).unwrap();
    eprintln!(
        "inventory of the scale fleet: {} entries in {} zones ({} adopted): {} calls per pass, {} nodes and {} queued resources listed",
        s.fleet.tpus.len(),
        scope.zones.len(),
        scope.adopted.len(),
        b.api_calls() - before,
        inventory.nodes.len(),
        inventory.queued_resources.len()
    );
    let mut group = c.benchmark_group("gcp_backend");
    group.sample_size(20);
    group.bench_function("inventory/scale-fleet", |bench| {
        bench.iter(|| b.inventory(&scope, EPOCH, &mut inventory).unwrap())
    });

    // 200 creates in one pass, against the modelled latency.
    let wall = Clock::Wall {
        started: Instant::now(),
        from_ms: 0,
        speed: 50.0,
    };
    let running = serve(&s, wall, false);
    let serial = AtomicU64::new(0);
    let entry = &s.fleet.tpus[0];
    let creates = || -> Vec<Action> {
        (0..200)
            .map(|_| {
                let n = serial.fetch_add(1, Ordering::Relaxed);
                let node = format!("bench-{n}");
                Action::CreateQueuedResource {
                    name: Name::new(&format!("{node}-qr")),
                    node_id: Name::new(&node),
                    zone: entry.zone,
                    tpu_type: entry.tpu_type.clone(),
                    runtime: entry
                        .runtime
                        .clone()
                        .unwrap_or_else(|| "v2-alpha-tpuv6e".into()),
                    entry_id: entry.id,
                    model: entry.provisioning_model,
                    reservation: entry.reservation.clone(),
                }
            })
            .collect()
    };
    group.sample_size(10);
    for (label, concurrency) in [
        ("200-creates/16-at-once", 16),
        ("200-creates/one-at-a-time", 1),
    ] {
        let mut b = backend(&running, &s, concurrency);
        group.bench_function(label, |bench| {
            bench.iter_batched(
                creates,
                |actions| b.execute(&actions, EPOCH),
                BatchSize::PerIteration,
            )
        });
    }
    group.finish();
}

criterion_group!(benches, gcp_backend);
criterion_main!(benches);
