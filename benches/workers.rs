//! The worker side's costs:
//! - reading the reports of 100 running attempts (4 workers each, heartbeating): one listing
//!   per attempt, from a local object folder and (with `STORAGE_EMULATOR_HOST`) from a GCS
//!   emulator over loopback;
//! - a launch over loopback SSH to 1 and to 16 workers (one real sshd each; skipped without
//!   /usr/sbin/sshd): the agent's launch on every worker at once, connections reused.

#[path = "../tests/support/sshd.rs"]
mod sshd;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use criterion::{Criterion, criterion_group, criterion_main};
use tpu_runner::backend::workers::{AgentWorkers, Workers};
use tpu_runner::backend::{InFlight, Outcome};
use tpu_runner::engine::observe::LaunchRequest;
use tpu_runner::gcp::http::Endpoint;
use tpu_runner::objects::{Gcs, LocalDir, ObjectStore};
use tpu_runner::spec::{Name, TpuType};
use tpu_runner::worker::transport::{Local, Target};

const BUCKET: &str = "gs://bench-bucket";

fn request(attempt: &str, tpu: &str, workers: u32) -> LaunchRequest {
    LaunchRequest {
        attempt_id: Name::new(attempt),
        job_id: Name::new("job-bench"),
        resource_id: Name::new(tpu),
        tpu_name: Name::new(tpu),
        zone: Name::new("us-east1-d"),
        tpu_type: TpuType::parse("v6e-16").unwrap(),
        worker_count: workers,
        command: "true".into(),
        bucket: BUCKET.into(),
        checkpoint_dir: format!("{BUCKET}/jobs/job-bench/checkpoints"),
        checkpoint_from: None,
        env: BTreeMap::new(),
        bundle: None,
        caches: Vec::new(),
    }
}

/// 100 attempts whose 4 workers each wrote a heartbeat.
fn running(store: &dyn ObjectStore, bucket: &str) -> Vec<InFlight> {
    (0..100)
        .map(|i| {
            let attempt = format!("attempt-{i:03}");
            for w in 0..4 {
                let uri = format!(
                    "{bucket}/jobs/job-{i:03}/attempts/{attempt}/heartbeat/tpu-{i}-w-{w}.json"
                );
                store.put(&uri, b"{}", false).unwrap();
            }
            InFlight {
                attempt: Name::new(&attempt),
                job: Name::new(&format!("job-{i:03}")),
                bucket: Name::new(bucket),
            }
        })
        .collect()
}

fn reports(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let mut group = c.benchmark_group("workers");
    group.sample_size(10);
    let dir = tempfile::tempdir().unwrap();
    let mut stores: Vec<(&str, Arc<dyn ObjectStore>, String)> = vec![(
        "local",
        Arc::new(LocalDir::new(dir.path())),
        BUCKET.to_owned(),
    )];
    if let Ok(host) = std::env::var("STORAGE_EMULATOR_HOST") {
        let gcs = Gcs::new(Endpoint::emulator(&host)).unwrap();
        let bucket = format!("bench-{}", std::process::id());
        gcs.client()
            .create_bucket("bench", &bucket, "US-EAST1")
            .unwrap();
        stores.push(("gcs-emulator", Arc::new(gcs), format!("gs://{bucket}")));
    }
    for (kind, store, bucket) in stores {
        let in_flight = running(store.as_ref(), &bucket);
        let transport = Local {
            base: dir.path().join("unused"),
            agent: env!("CARGO_BIN_EXE_tpu-runner").into(),
            objects: None,
            metadata: None,
        };
        let workers = AgentWorkers::new(Arc::new(transport), store, "bench");
        group.bench_function(format!("reports-of-100-running-attempts/{kind}"), |b| {
            b.iter(|| {
                let read = rt.block_on(workers.reports(&in_flight)).unwrap();
                assert_eq!(read.reports.len(), 100);
            })
        });
    }

    if std::path::Path::new("/usr/sbin/sshd").exists() {
        let dir = tempfile::tempdir().unwrap();
        let (ssh, client) = sshd::controller(dir.path(), env!("CARGO_BIN_EXE_tpu-runner"));
        let objects = dir.path().join("objects");
        let mut servers = Vec::new();
        for i in 0..16 {
            let server = sshd::start_sshd(
                &dir.path().join(format!("sshd-{i}")),
                &client,
                &[
                    (
                        "TPU_RUNNER_WORKER_ROOT",
                        dir.path()
                            .join(format!("roots/w-{i}"))
                            .display()
                            .to_string(),
                    ),
                    ("TPU_RUNNER_OBJECTS", objects.display().to_string()),
                ],
            );
            for tpu in ["tpu-one", "tpu-sixteen"] {
                let target = Target {
                    zone: "us-east1-d".into(),
                    tpu: tpu.into(),
                    worker: i,
                };
                ssh.set_address(&target, "127.0.0.1", server.port);
                ssh.pin(&target, &server.host_key);
            }
            servers.push(server);
        }
        let mut workers = AgentWorkers::new(ssh, Arc::new(LocalDir::new(&objects)), "bench");
        workers.min_free_bytes = 0;
        workers.timeout = Duration::from_secs(60);
        let serial = AtomicU64::new(0);
        for (label, tpu, count) in [
            ("1-worker", "tpu-one", 1),
            ("16-workers", "tpu-sixteen", 16),
        ] {
            group.bench_function(format!("launch-over-loopback-ssh/{label}"), |b| {
                b.iter(|| {
                    let n = serial.fetch_add(1, Ordering::Relaxed);
                    let r = request(&format!("a-{n}"), tpu, count);
                    assert_eq!(rt.block_on(workers.launch(&r)), Outcome::Done);
                })
            });
        }
        drop(servers);
    }
    group.finish();
}

criterion_group!(benches, reports);
criterion_main!(benches);
