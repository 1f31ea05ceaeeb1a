//! Preparing a TPU VM worker at boot (§5.1), run as root by the startup script once it has
//! installed the checked agent: the runner user (created if missing), its SSH
//! `authorized_keys` (0700/0600), lingering so its processes outlive SSH sessions, the
//! agent's root and shared-memory folders owned by it, and last a readiness marker tied to
//! this boot. The runner user gets no root power at all (no sudoers rule): it owns every
//! process of its jobs, so the agent needs none. Must not touch anything of a job.

use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;

/// What to prepare.
#[derive(Clone, Debug)]
pub struct Prepare {
    /// The runner user.
    pub user: String,
    /// The controller's public key (`ssh-ed25519 AAAA… comment`).
    pub authorized_key: String,
    /// The agent's root folder (owned by the user).
    pub root: PathBuf,
    /// Shared-memory folder (owned by the user).
    pub shm: PathBuf,
    /// Where the readiness marker goes (`startup-ready` inside).
    pub state_dir: PathBuf,
}

/// This boot's id.
pub fn boot_id() -> Result<String, String> {
    std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
        .map(|s| s.trim().to_owned())
        .map_err(|e| format!("boot id: {e}"))
}

/// The marker's path.
pub fn marker(state_dir: &Path) -> PathBuf {
    state_dir.join("startup-ready")
}

/// True when the marker says this boot was prepared.
pub fn ready(state_dir: &Path) -> bool {
    let Ok(text) = std::fs::read_to_string(marker(state_dir)) else {
        return false;
    };
    let Ok(boot) = boot_id() else {
        return false;
    };
    text.lines().any(|l| l == format!("boot_id={boot}"))
}

fn run(what: &str, command: &mut Command) -> Result<String, String> {
    let out = command
        .output()
        .map_err(|e| format!("{what}: cannot run {:?}: {e}", command.get_program()))?;
    if !out.status.success() {
        return Err(format!(
            "{what}: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
}

/// A user name `useradd` takes and no shell can misread.
fn plain_user(user: &str) -> bool {
    !user.is_empty()
        && user.len() <= 32
        && user.starts_with(|c: char| c.is_ascii_lowercase())
        && user
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_')
}

/// Prepares this worker; each step is idempotent, so every boot runs it again.
pub fn prepare(p: &Prepare) -> Result<(), String> {
    if !plain_user(&p.user) {
        return Err(format!("`{}` is not a plain user name", p.user));
    }
    let key = p.authorized_key.trim();
    if !key.starts_with("ssh-ed25519 ") || key.contains('\n') {
        return Err("the authorized key must be one `ssh-ed25519 …` line".into());
    }
    let marker_path = marker(&p.state_dir);
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o755)
        .create(&p.state_dir)
        .map_err(|e| format!("{}: {e}", p.state_dir.display()))?;
    // Not ready until every step below is done again for this boot.
    let _ = std::fs::remove_file(&marker_path);
    let exists = Command::new("id")
        .arg("-u")
        .arg(&p.user)
        .output()
        .is_ok_and(|o| o.status.success());
    if !exists {
        run(
            "creating the runner user",
            Command::new("useradd")
                .args([
                    "--create-home",
                    "--shell",
                    "/bin/bash",
                    "--comment",
                    "tpu-runner",
                ])
                .arg(&p.user),
        )?;
    }
    let uid: u32 = run(
        "the runner user's uid",
        Command::new("id").arg("-u").arg(&p.user),
    )?
    .parse()
    .map_err(|e| format!("uid: {e}"))?;
    let gid: u32 = run(
        "the runner user's gid",
        Command::new("id").arg("-g").arg(&p.user),
    )?
    .parse()
    .map_err(|e| format!("gid: {e}"))?;
    let home = run(
        "the runner user's home",
        Command::new("getent").args(["passwd", &p.user]),
    )?
    .split(':')
    .nth(5)
    .map(PathBuf::from)
    .ok_or("getent gave no home")?;
    let own = |path: &Path, mode: u32| -> Result<(), String> {
        std::os::unix::fs::chown(path, Some(uid), Some(gid))
            .and_then(|()| std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)))
            .map_err(|e| format!("{}: {e}", path.display()))
    };
    let ssh_dir = home.join(".ssh");
    std::fs::create_dir_all(&ssh_dir).map_err(|e| format!("{}: {e}", ssh_dir.display()))?;
    own(&ssh_dir, 0o700)?;
    let keys = ssh_dir.join("authorized_keys");
    std::fs::write(&keys, format!("{key}\n")).map_err(|e| format!("{}: {e}", keys.display()))?;
    own(&keys, 0o600)?;
    for dir in [&p.root, &p.shm] {
        std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        own(dir, 0o700)?;
    }
    // Lingering keeps the user's processes when the SSH session that started them ends (the
    // agent's supervisors are detached anyway, so a host without logind only notes it).
    let linger = match run(
        "enabling lingering",
        Command::new("loginctl").args(["enable-linger", &p.user]),
    ) {
        Ok(_) => "yes".to_owned(),
        Err(e) => format!("no ({})", e.replace('\n', " ")),
    };
    let boot = boot_id()?;
    let text = format!(
        "schema_version=3\nboot_id={boot}\nuser={}\nlinger_enabled={linger}\nready_at={}\n",
        p.user,
        jiff::Timestamp::now()
    );
    let temp = p.state_dir.join(".startup-ready.tmp");
    std::fs::write(&temp, text)
        .and_then(|()| std::fs::set_permissions(&temp, std::fs::Permissions::from_mode(0o644)))
        .and_then(|()| std::fs::rename(&temp, &marker_path))
        .map_err(|e| format!("{}: {e}", marker_path.display()))?;
    Ok(())
}
