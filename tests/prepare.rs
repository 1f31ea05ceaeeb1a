//! `tpu-runner worker prepare`, as a TPU VM's startup script runs it at boot, on this machine
//! for real: a runner user created with `useradd`, its authorized key (0700/0600, owned by
//! it), the agent's folders owned by it, a readiness marker for this boot; run again, it
//! changes nothing; a launch on a worker not prepared for this boot is refused. Needs root
//! (CI runs as root); elsewhere it says so and passes. The user is removed afterwards.

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_tpu-runner");

fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
}

struct User(String);

impl Drop for User {
    fn drop(&mut self) {
        let _ = Command::new("userdel").args(["--remove", &self.0]).output();
    }
}

#[test]
fn prepare_makes_the_runner_user_its_key_folders_and_the_boot_marker() {
    if !is_root() {
        eprintln!("not root: worker prepare (useradd) is not exercised here; CI runs it as root");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let user = User(format!("trtest{}", std::process::id()));
    let key = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIK4oYf0dTCq8M0aRpe6iF6QQ6hrNEmv3xJ1nsoE9bF9G tpurunner";
    std::fs::write(dir.path().join("controller.pub"), format!("{key}\n")).unwrap();
    let prepare = || {
        Command::new(BIN)
            .args([
                "worker",
                "prepare",
                "--user",
                &user.0,
                "--authorized-key-file",
            ])
            .arg(dir.path().join("controller.pub"))
            .arg("--root")
            .arg(dir.path().join("root"))
            .arg("--shm")
            .arg(dir.path().join("shm"))
            .arg("--state-dir")
            .arg(dir.path().join("state"))
            .output()
            .unwrap()
    };
    let out = prepare();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        format!("TPU_RUNNER_PREPARED {}", user.0)
    );
    let uid: u32 = String::from_utf8_lossy(
        &Command::new("id")
            .arg("-u")
            .arg(&user.0)
            .output()
            .unwrap()
            .stdout,
    )
    .trim()
    .parse()
    .unwrap();
    let home = String::from_utf8_lossy(
        &Command::new("getent")
            .args(["passwd", &user.0])
            .output()
            .unwrap()
            .stdout,
    )
    .split(':')
    .nth(5)
    .unwrap()
    .to_owned();
    let keys = std::path::Path::new(&home).join(".ssh/authorized_keys");
    assert_eq!(std::fs::read_to_string(&keys).unwrap(), format!("{key}\n"));
    let meta = std::fs::metadata(&keys).unwrap();
    assert_eq!(
        (meta.uid(), meta.permissions().mode() & 0o777),
        (uid, 0o600)
    );
    let ssh_dir = std::fs::metadata(keys.parent().unwrap()).unwrap();
    assert_eq!(ssh_dir.permissions().mode() & 0o777, 0o700);
    for folder in ["root", "shm"] {
        let m = std::fs::metadata(dir.path().join(folder)).unwrap();
        assert_eq!(
            (m.uid(), m.permissions().mode() & 0o777),
            (uid, 0o700),
            "{folder}"
        );
    }
    let boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").unwrap();
    let marker = std::fs::read_to_string(dir.path().join("state/startup-ready")).unwrap();
    assert!(
        marker.contains(&format!("boot_id={}\n", boot.trim())),
        "{marker}"
    );
    assert!(tpu_runner::worker::prepare::ready(
        &dir.path().join("state")
    ));
    // Every boot runs it again: nothing changes, nothing fails.
    let again = prepare();
    assert!(
        again.status.success(),
        "{}",
        String::from_utf8_lossy(&again.stderr)
    );
    // A worker whose boot was not prepared refuses to launch.
    std::fs::write(
        dir.path().join("state/startup-ready"),
        "schema_version=3\nboot_id=an-earlier-boot\n",
    )
    .unwrap();
    let launch = Command::new(BIN)
        .args(["worker", "launch", "--host", "w-0", "--root"])
        .arg(dir.path().join("root"))
        .arg("--require-ready")
        .arg(dir.path().join("state"))
        .output()
        .unwrap();
    assert!(!launch.status.success());
    assert!(
        String::from_utf8_lossy(&launch.stderr).contains("not prepared for this boot"),
        "{}",
        String::from_utf8_lossy(&launch.stderr)
    );
    // Bad input is refused before anything is touched.
    std::fs::write(dir.path().join("bad.pub"), "ssh-rsa AAAA\n").unwrap();
    let bad = Command::new(BIN)
        .args([
            "worker",
            "prepare",
            "--user",
            &user.0,
            "--authorized-key-file",
        ])
        .arg(dir.path().join("bad.pub"))
        .output()
        .unwrap();
    assert!(!bad.status.success());
}
