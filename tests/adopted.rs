//! The adopted-TPU helpers of the agent, run as the controller runs them (the real binary,
//! one answer line each): `worker recover-disk` frees what the agent's own folders hold —
//! the workspace first, then the least recently used caches — only as far as the floor
//! needs, and refuses while an attempt runs or on a root that is a link; `worker devices`
//! names the processes holding the accelerator devices (here a file made the device).
//!
//! The recovery case reads this machine's free space: it allows 32 MiB of other writers
//! during the test (the files it frees are 64 MiB).

#[path = "support/holder.rs"]
mod holder;

use std::process::{Command, Output};
use std::time::Duration;

use holder::Holder;

const BIN: &str = env!("CARGO_BIN_EXE_tpu-runner");

fn agent(args: &[&str]) -> Output {
    Command::new(BIN).arg("worker").args(args).output().unwrap()
}

/// `worker recover-disk` on `root` as worker `h-w-0`, with `floor` free bytes to reach.
fn recover(root: &std::path::Path, floor: u64) -> Output {
    let floor = floor.to_string();
    agent(&[
        "recover-disk",
        "--root",
        root.to_str().unwrap(),
        "--host",
        "h-w-0",
        "--floor",
        &floor,
    ])
}

fn free(dir: &std::path::Path) -> u64 {
    let s = nix::sys::statvfs::statvfs(dir).unwrap();
    s.blocks_available() * s.fragment_size()
}

fn write_big(path: &std::path::Path, bytes: usize) {
    use std::io::Write;
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    let mut f = std::fs::File::create(path).unwrap();
    f.write_all(&vec![7u8; bytes]).unwrap();
    f.sync_all().unwrap();
}

fn stdout(o: &Output) -> String {
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    String::from_utf8(o.stdout.clone()).unwrap()
}

#[test]
fn disk_recovery_frees_the_workspace_then_the_oldest_caches_as_far_as_the_floor_needs() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("root");
    std::fs::create_dir_all(root.join("work/job-a")).unwrap();
    std::fs::write(root.join("work/job-a/small"), "x").unwrap();
    std::fs::create_dir_all(root.join("attempts/a-old")).unwrap();
    // The oldest cache is the big one; the newer one must survive.
    write_big(&root.join("cache/old/blob"), 64 << 20);
    std::fs::create_dir_all(root.join("cache/new")).unwrap();
    let old = std::fs::File::open(root.join("cache/old")).unwrap();
    old.set_modified(std::time::SystemTime::now() - Duration::from_secs(3600))
        .unwrap();

    // Enough free already: nothing is touched.
    let out = stdout(&recover(&root, 0));
    assert!(
        out.starts_with("TPU_RUNNER_DISK_RECOVERY h-w-0 SUFFICIENT "),
        "{out}"
    );
    assert!(out.trim_end().ends_with(" 0 0"), "{out}");
    assert!(root.join("work/job-a/small").exists());

    // A floor the workspace alone cannot meet: it goes, then the oldest cache, no more.
    let floor = free(&root) + (32 << 20);
    let out = stdout(&recover(&root, floor));
    let words: Vec<&str> = out.split_whitespace().collect();
    assert_eq!(
        words[..3],
        ["TPU_RUNNER_DISK_RECOVERY", "h-w-0", "RECOVERED"],
        "{out}"
    );
    let (before, after): (u64, u64) = (words[3].parse().unwrap(), words[4].parse().unwrap());
    assert!(after >= floor && after > before, "{out}");
    assert_eq!(words[5..], ["2", "1"], "{out}");
    assert!(!root.join("work/job-a").exists() && !root.join("attempts/a-old").exists());
    assert!(!root.join("cache/old").exists() && root.join("cache/new").exists());

    // A floor nothing of ours can meet: refused with the numbers, exit 2.
    let out = recover(&root, u64::MAX);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("below the floor") && err.contains("not tpu-runner's"),
        "{err}"
    );
}

#[test]
fn disk_recovery_refuses_while_an_attempt_runs_and_on_a_linked_root() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("root");
    std::fs::create_dir_all(root.join("process")).unwrap();
    std::fs::create_dir_all(root.join("work/job-a")).unwrap();
    // This test's own process stands for a live supervisor.
    let current = serde_json::json!({
        "attempt_id": "a-1", "job_id": "job-a",
        "supervisor": std::process::id(), "command_group": null,
    });
    std::fs::write(root.join("process/current.json"), current.to_string()).unwrap();
    let out = recover(&root, u64::MAX);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("attempt a-1 of job job-a runs here"));
    assert!(root.join("work/job-a").exists());

    // A linked folder inside the root is refused too (its target is not the agent's).
    std::fs::remove_file(root.join("process/current.json")).unwrap();
    let elsewhere = dir.path().join("elsewhere");
    std::fs::create_dir_all(elsewhere.join("keep")).unwrap();
    std::os::unix::fs::symlink(&elsewhere, root.join("attempts")).unwrap();
    let out = recover(&root, u64::MAX);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("attempts is not a plain folder"));
    assert!(elsewhere.join("keep").exists());

    let link = dir.path().join("link");
    std::os::unix::fs::symlink(&root, &link).unwrap();
    let out = recover(&link, 0);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("is not a plain folder"));
}

#[test]
fn the_device_probe_names_the_holders_and_refuses_without_devices() {
    let dir = tempfile::tempdir().unwrap();
    let pattern = dir.path().join("accel*").display().to_string();
    let probe = || agent(&["devices", "--host", "h-w-0", "--device", &pattern]);

    let out = probe();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("no accelerator devices"));

    let device = dir.path().join("accel0");
    std::fs::write(&device, "").unwrap();
    let holder = Holder::new(&device);
    let line = stdout(&probe());
    assert_eq!(
        line.trim(),
        format!("TPU_RUNNER_DEVICE_OWNER_PROBE h-w-0 BUSY {}", holder.0.id())
    );
    drop(holder);

    let out = probe();
    if nix::unistd::geteuid().is_root() {
        assert_eq!(
            stdout(&out).trim(),
            "TPU_RUNNER_DEVICE_OWNER_PROBE h-w-0 CLEAR -"
        );
    } else {
        // Not every process's files are readable: never a guessed CLEAR.
        assert_eq!(out.status.code(), Some(2));
        assert!(String::from_utf8_lossy(&out.stderr).contains("needs root"));
    }
}

/// `probe-adopted-device-owners` as a user runs it on the local stack: the TPU record must
/// be an idle adopted one; every worker answers (the agent, with the devices made files
/// here through `TPU_RUNNER_DEVICES`); a holder on one worker is exit 75 naming it.
#[test]
fn the_probe_command_asks_every_worker_of_an_idle_adopted_tpu() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    std::fs::write(
        d.join("deployment.yaml"),
        "name: probe\nproject: my-project-123\ncontroller_region: us-central1\ncontroller_timeout: 168h\nfirestore_location: nam5\nnetwork: default\nsubnetwork: default\ntpus:\n  - id: trc\n    type: v4-16\n    zone: us-central2-b\n    existing: trc-v4\n    provisioning_model: on-demand\n    chip_limit: 8\n",
    )
    .unwrap();
    let resource = |id: &str, adopted: bool, status: &str| {
        serde_json::json!({
            "id": id, "tpu_name": "trc-v4", "zone": "us-central2-b", "tpu_type": "v4-16",
            "entry_id": "trc", "adopted": adopted, "status": status, "worker_count": 2,
        })
    };
    let state = serde_json::json!({
        "schema_version": 1, "jobs": {}, "interruption_requests": {},
        "resources": {
            "adopted-trc-v4": resource("adopted-trc-v4", true, "idle"),
            "adopted-busy": resource("adopted-busy", true, "unavailable"),
        },
    });
    std::fs::write(d.join("state.json"), state.to_string()).unwrap();
    let store = format!("sqlite:{}", d.join("state.db").display());
    let import = Command::new(BIN)
        .args([
            "state",
            "import",
            "state.json",
            "--store",
            &store,
            "--fleet",
            "deployment.yaml",
        ])
        .current_dir(d)
        .output()
        .unwrap();
    assert!(
        import.status.success(),
        "{}",
        String::from_utf8_lossy(&import.stderr)
    );
    // A local stack registered in a state folder of the test's own, as `local up` registers
    // itself (its process: this test's, which lives).
    std::fs::create_dir_all(d.join("state")).unwrap();
    let stack = serde_json::json!({
        "fleet": d.join("deployment.yaml"), "store": store,
        "tpu_endpoint": "http://127.0.0.1:9", "objects": d.join("objects"),
        "workers": d.join("workers"), "pid": std::process::id(),
    });
    std::fs::write(d.join("state/local-stack.json"), stack.to_string()).unwrap();
    let device = d.join("accel0");
    std::fs::write(&device, "").unwrap();
    let probe = |id: &str| {
        Command::new(BIN)
            .args(["probe-adopted-device-owners", id])
            .env("TPU_RUNNER_HOME", d.join("state"))
            .env("TPU_RUNNER_DEVICES", d.join("accel*"))
            .current_dir(d)
            .output()
            .unwrap()
    };

    for (id, why) in [
        ("nope", "no TPU record nope"),
        ("adopted-busy", "is unavailable"),
    ] {
        let out = probe(id);
        assert_eq!(out.status.code(), Some(1));
        assert!(
            String::from_utf8_lossy(&out.stderr).contains(why),
            "{out:?}"
        );
    }

    let holder = Holder::new(&device);
    let out = probe("adopted-trc-v4");
    assert_eq!(out.status.code(), Some(75), "{out:?}");
    let answer: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(answer["clear"], false);
    assert_eq!(answer["tpu_name"], "trc-v4");
    let workers = answer["workers"].as_array().unwrap();
    assert_eq!(workers.len(), 2);
    for (i, w) in workers.iter().enumerate() {
        assert_eq!(w["host"], format!("trc-v4-w-{i}"));
        assert_eq!(w["pids"], serde_json::json!([holder.0.id()]));
    }
    drop(holder);
    if nix::unistd::geteuid().is_root() {
        let out = probe("adopted-trc-v4");
        assert_eq!(out.status.code(), Some(0), "{out:?}");
        let answer: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(answer["clear"], true);
    }
}
