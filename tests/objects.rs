//! The object-store conformance suite, run against every implementation: `LocalDir` always,
//! and `Gcs` over the Cloud Storage JSON API against a real GCS emulator (fake-gcs-server)
//! when `STORAGE_EMULATOR_HOST` is set (`.ci/run` starts one; with
//! `TPU_RUNNER_REQUIRE_EMULATORS=1` its absence fails). Then the worker agent end to end with
//! its status, heartbeat and log objects in the emulator.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tpu_runner::backend::workers::{AgentWorkers, Workers};
use tpu_runner::backend::{InFlight, Outcome};
use tpu_runner::engine::observe::{LaunchRequest, WorkerState};
use tpu_runner::gcp::http::Endpoint;
use tpu_runner::objects::{Gcs, LocalDir, ObjectStore};
use tpu_runner::spec::{Name, TpuType};
use tpu_runner::worker::transport::Local;

/// The GCS emulator's endpoint, if one runs.
fn emulator() -> Option<Endpoint> {
    match std::env::var("STORAGE_EMULATOR_HOST") {
        Ok(host) if !host.trim().is_empty() => Some(Endpoint::emulator(host.trim())),
        _ => {
            assert!(
                std::env::var("TPU_RUNNER_REQUIRE_EMULATORS").as_deref() != Ok("1"),
                "STORAGE_EMULATOR_HOST is not set: start fake-gcs-server (.ci/run does)"
            );
            eprintln!(
                "GCS emulator cases skipped: set STORAGE_EMULATOR_HOST (README, Development)"
            );
            None
        }
    }
}

/// A fresh bucket on the emulator.
fn gcs_bucket(endpoint: &Endpoint, name: &str) -> Gcs {
    let gcs = Gcs::new(endpoint.clone()).expect("client");
    gcs.client()
        .create_bucket("test-project", name, "US-EAST1")
        .expect("bucket");
    gcs
}

/// A store under test: its kind, the store, its bucket, and the folder it lives in (kept).
type UnderTest = (
    &'static str,
    Box<dyn ObjectStore>,
    String,
    Option<tempfile::TempDir>,
);

/// Every store to test, each with its bucket (a fresh one per test).
fn stores(test: &str) -> Vec<UnderTest> {
    let dir = tempfile::tempdir().unwrap();
    let local = LocalDir::new(dir.path());
    local.create_bucket(test, "US-EAST1").unwrap();
    let mut out: Vec<UnderTest> =
        vec![("local", Box::new(local), format!("gs://{test}"), Some(dir))];
    if let Some(endpoint) = emulator() {
        let bucket = format!("{test}-{}", std::process::id());
        out.push((
            "gcs",
            Box::new(gcs_bucket(&endpoint, &bucket)),
            format!("gs://{bucket}"),
            None,
        ));
    }
    out
}

#[test]
fn objects_are_written_read_listed_and_deleted_alike() {
    for (kind, store, bucket, _keep) in stores("conformance") {
        let uri = |name: &str| format!("{bucket}/{name}");
        // The bucket's region, as GCP names regions; a missing bucket is named. (fake-gcs-server
        // ignores a new bucket's location and reports its own `-location`, US-CENTRAL1.)
        let made_in = if kind == "gcs" {
            "us-central1"
        } else {
            "us-east1"
        };
        assert_eq!(store.location(&bucket).unwrap(), made_in, "{kind}");
        let missing = store.location("gs://no-such-bucket-here").unwrap_err();
        assert!(
            missing.message.contains("gs://no-such-bucket-here"),
            "{kind}: {missing}"
        );
        // Absent things.
        assert_eq!(
            store.get(&uri("nope.json"), 1 << 20).unwrap(),
            None,
            "{kind}"
        );
        store.delete(&uri("nope.json")).unwrap();
        assert!(store.list(&uri("jobs/")).unwrap().is_empty(), "{kind}");
        // Round trips, names with spaces and non-ASCII.
        let names = [
            "jobs/j/attempts/a/status/w-0.json",
            "jobs/j/attempts/a/logs/w 1 ✓.log",
            "jobs/k/x",
        ];
        for (i, name) in names.iter().enumerate() {
            store
                .put(&uri(name), format!("body {i}").as_bytes(), false)
                .unwrap();
        }
        assert_eq!(
            store.get(&uri(names[1]), 1 << 20).unwrap().as_deref(),
            Some(&b"body 1"[..]),
            "{kind}"
        );
        // Overwrite, then create-only refuses.
        store.put(&uri(names[0]), b"again", false).unwrap();
        let refused = store.put(&uri(names[0]), b"never", true).unwrap_err();
        assert!(refused.exists, "{kind}: {refused}");
        assert_eq!(
            store.get(&uri(names[0]), 1 << 20).unwrap().as_deref(),
            Some(&b"again"[..])
        );
        store.put(&uri("jobs/j/new"), b"first", true).unwrap();
        // Listing by prefix, in name order, with generations that change on a write.
        let listed = store.list(&uri("jobs/j/")).unwrap();
        let listed_names: Vec<&str> = listed.iter().map(|o| o.name.as_str()).collect();
        assert_eq!(
            listed_names,
            [
                "jobs/j/attempts/a/logs/w 1 ✓.log",
                "jobs/j/attempts/a/status/w-0.json",
                "jobs/j/new"
            ],
            "{kind}"
        );
        assert!(listed.iter().all(|o| !o.updated.is_empty()));
        // Bounded reads.
        assert!(
            store.get(&uri(names[1]), 3).is_err(),
            "{kind}: a limit is a limit"
        );
        let dest = tempfile::NamedTempFile::new().unwrap();
        assert!(
            store
                .download(&uri(names[2]), dest.path(), 1 << 20)
                .unwrap()
        );
        assert_eq!(std::fs::read(dest.path()).unwrap(), b"body 2");
        assert!(!store.download(&uri("gone"), dest.path(), 1 << 20).unwrap());
        store.delete(&uri(names[2])).unwrap();
        assert_eq!(store.get(&uri(names[2]), 1 << 20).unwrap(), None, "{kind}");
        // Copies inside the store, replacing what is there; an absent source is an error.
        store.copy(&uri(names[1]), &uri("moved/w 1 ✓.log")).unwrap();
        store.copy(&uri(names[0]), &uri("moved/x")).unwrap();
        store.copy(&uri(names[1]), &uri("moved/x")).unwrap();
        for copy in ["moved/w 1 ✓.log", "moved/x"] {
            assert_eq!(
                store.get(&uri(copy), 1 << 20).unwrap().as_deref(),
                Some(&b"body 1"[..]),
                "{kind}: {copy}"
            );
        }
        assert!(store.copy(&uri("gone"), &uri("moved/y")).is_err(), "{kind}");
        assert_eq!(store.get(&uri("moved/y"), 1 << 20).unwrap(), None, "{kind}");
        // Ranged reads: from an offset, bounded, empty past the end, absent is `None`.
        store.put(&uri("log"), b"line 1\nline 2\n", false).unwrap();
        let from = |offset: u64, limit: u64| store.get_from(&uri("log"), offset, limit).unwrap();
        assert_eq!(from(0, 6).as_deref(), Some(&b"line 1"[..]), "{kind}");
        assert_eq!(from(7, 100).as_deref(), Some(&b"line 2\n"[..]), "{kind}");
        assert_eq!(
            from(14, 100).as_deref(),
            Some(&b""[..]),
            "{kind}: at the end"
        );
        assert_eq!(
            from(99, 100).as_deref(),
            Some(&b""[..]),
            "{kind}: past the end"
        );
        assert_eq!(
            from(3, 0).as_deref(),
            Some(&b""[..]),
            "{kind}: nothing asked"
        );
        assert_eq!(store.get_from(&uri("gone"), 0, 10).unwrap(), None, "{kind}");
        // Malformed addresses are errors, not panics.
        assert!(store.get("gs://", 10).is_err());
        assert!(store.get("s3://b/x", 10).is_err());
    }
}

/// A file is uploaded streamed, whole and exact (larger than one chunk, with its CRC32C
/// checked by the store), create-only as `put` is; what is there is left as it was.
#[test]
fn files_are_uploaded_whole_and_create_only() {
    for (kind, store, bucket, _dir) in stores("upload-files") {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("bundle.tar.gz");
        let data: Vec<u8> = (0..(3 << 20) + 12345u32)
            .map(|i| (i * 7 % 251) as u8)
            .collect();
        std::fs::write(&path, &data).unwrap();
        let uri = format!("{bucket}/bundles/b.tar.gz");
        store.upload(&uri, &path, true).unwrap();
        let back = store.get(&uri, 64 << 20).unwrap().unwrap();
        assert!(back == data, "{kind}: the object differs from the file");
        std::fs::write(&path, b"other").unwrap();
        let e = store.upload(&uri, &path, true).unwrap_err();
        assert!(e.exists, "{kind}: {e}");
        assert!(
            store.get(&uri, 64 << 20).unwrap().unwrap() == data,
            "{kind}"
        );
        store.upload(&uri, &path, false).unwrap();
        assert_eq!(
            store.get(&uri, 64 << 20).unwrap().unwrap(),
            b"other",
            "{kind}"
        );
        let missing = dir.path().join("missing");
        assert!(store.upload(&uri, &missing, false).is_err(), "{kind}");
    }
}

#[test]
fn listings_follow_every_page() {
    let Some(endpoint) = emulator() else { return };
    let bucket = format!("pages-{}", std::process::id());
    let gcs = gcs_bucket(&endpoint, &bucket);
    for i in 0..1_050 {
        gcs.put(&format!("gs://{bucket}/p/{i:05}"), b"x", false)
            .unwrap();
    }
    let listed = gcs.list(&format!("gs://{bucket}/p/")).unwrap();
    assert_eq!(listed.len(), 1_050, "two pages of 1,000 at most");
    assert_eq!(listed[1_049].name, "p/01049");
}

/// The agents of a launch report through Cloud Storage, and before the command starts copy
/// the checkpoints of a job moved from another region (`checkpoint_from`: the directory in its
/// previous bucket) into its new one, keeping what is there already.
#[test]
fn the_agent_reports_and_copies_checkpoints_through_cloud_storage() {
    let Some(endpoint) = emulator() else { return };
    let bucket = format!("agent-{}", std::process::id());
    let gcs = Arc::new(gcs_bucket(&endpoint, &bucket));
    let old = format!("agent-old-{}", std::process::id());
    gcs.client()
        .create_bucket("test-project", &old, "EUROPE-WEST4")
        .expect("bucket");
    let from = format!("gs://{old}/jobs/job-gcs/checkpoints");
    let to = format!("gs://{bucket}/jobs/job-gcs/checkpoints");
    for (name, body) in [("step-100/state", "100"), ("step-200/state", "200")] {
        gcs.put(&format!("{from}/{name}"), body.as_bytes(), false)
            .unwrap();
    }
    gcs.put(&format!("{to}/step-200/state"), b"written since", false)
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    // The agents find the emulator as the controller does: STORAGE_EMULATOR_HOST.
    let transport = Local {
        base: dir.path().join("workers"),
        agent: PathBuf::from(env!("CARGO_BIN_EXE_tpu-runner")),
        objects: None,
        metadata: None,
    };
    let mut workers = AgentWorkers::new(Arc::new(transport), gcs.clone(), "proj");
    workers.min_free_bytes = 0;
    workers.heartbeat_secs = 1;
    let r = LaunchRequest {
        attempt_id: Name::new("a-gcs"),
        job_id: Name::new("job-gcs"),
        resource_id: Name::new("tpu-gcs"),
        tpu_name: Name::new("tpu-gcs"),
        zone: Name::new("us-east1-d"),
        tpu_type: TpuType::parse("v6e-16").unwrap(),
        worker_count: 4,
        command: "echo \"hello from $TPU_WORKER_HOST\"".into(),
        bucket: format!("gs://{bucket}"),
        checkpoint_dir: to.clone(),
        checkpoint_from: Some(from.clone()),
        env: BTreeMap::new(),
        bundle: None,
        caches: Vec::new(),
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    assert_eq!(rt.block_on(workers.launch(&r)), Outcome::Done);
    let f = InFlight {
        attempt: r.attempt_id,
        job: r.job_id,
        bucket: Name::new(&r.bucket),
    };
    let until = Instant::now() + Duration::from_secs(60);
    let report = loop {
        let read = rt.block_on(workers.reports(&[f])).unwrap();
        let report = read.reports[&r.attempt_id].clone();
        if report.statuses.len() == 4 {
            break report;
        }
        assert!(Instant::now() < until, "still {report:?}");
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(
        report
            .statuses
            .iter()
            .all(|s| s.state == WorkerState::Succeeded),
        "{report:?}"
    );
    let log = gcs
        .get(
            &format!("gs://{bucket}/jobs/job-gcs/attempts/a-gcs/logs/tpu-gcs-w-3.log"),
            1 << 20,
        )
        .unwrap()
        .unwrap();
    assert_eq!(log, b"hello from tpu-gcs-w-3\n");
    for (name, body) in [
        ("step-100/state", &b"100"[..]),
        ("step-200/state", b"written since"),
    ] {
        assert_eq!(
            gcs.get(&format!("{to}/{name}"), 1 << 20)
                .unwrap()
                .as_deref(),
            Some(body),
            "{name}"
        );
    }
}

/// A listing while writers replace objects (each write goes through a temporary file renamed
/// into place) never fails: what vanishes mid-walk was never an object. (The agents rewrite
/// heartbeats and logs while the controller lists their attempts.)
#[test]
fn a_local_listing_during_writes_never_fails() {
    let dir = tempfile::tempdir().unwrap();
    let store = std::sync::Arc::new(LocalDir::new(dir.path()));
    store.create_bucket("gs://b", "US-EAST1").unwrap();
    let writer = {
        let store = store.clone();
        std::thread::spawn(move || {
            for i in 0..3000 {
                store
                    .put(
                        &format!("gs://b/jobs/j/attempts/a/heartbeat/w-{}.json", i % 4),
                        b"{}",
                        false,
                    )
                    .unwrap();
            }
        })
    };
    while !writer.is_finished() {
        store
            .list("gs://b/jobs/j/attempts/a/")
            .expect("a listing during writes");
    }
    writer.join().unwrap();
    assert_eq!(store.list("gs://b/jobs/j/attempts/a/").unwrap().len(), 4);
}
