//! The helpers for adopted TPUs (`original-behaviour.md` §5.7), which tpu-runner shares with
//! their owner: recover disk space the agent's own folders hold while no attempt runs, and
//! probe who holds the accelerator devices. Each answers one line; neither touches anything
//! outside the agent's root, and neither runs while an attempt does. Decides nothing.

use super::agent::{self, Root};
use super::devices::{Devices, pid_list};

/// What a disk recovery did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Recovery {
    /// Free bytes before.
    pub before: u64,
    /// Free bytes after.
    pub after: u64,
    /// Workspace and old attempt entries removed.
    pub work_entries: usize,
    /// Caches evicted.
    pub cache_dirs: usize,
}

impl Recovery {
    /// The answer line: `TPU_RUNNER_DISK_RECOVERY <host> SUFFICIENT|RECOVERED <before>
    /// <after> <work entries> <cache dirs>`.
    pub fn line(&self, host: &str) -> String {
        let word = if self.work_entries + self.cache_dirs == 0 {
            "SUFFICIENT"
        } else {
            "RECOVERED"
        };
        format!(
            "TPU_RUNNER_DISK_RECOVERY {host} {word} {} {} {} {}",
            self.before, self.after, self.work_entries, self.cache_dirs
        )
    }
}

/// Frees disk space below `root` until `floor` bytes are free: the workspace and old
/// attempts' folders first, then caches, least recently used first. Refuses while an
/// attempt runs, and on a root that is a link, not canonical or not ours.
pub fn recover_disk(root: &Root, floor: u64) -> Result<Recovery, String> {
    agent::check_root(root)?;
    let _lock = agent::lock(root)?;
    let current = root.current();
    if std::fs::symlink_metadata(&current).is_ok_and(|m| m.file_type().is_symlink()) {
        return Err(format!("{} is a link", current.display()));
    }
    if let Some(running) = agent::read_current(root)
        && agent::alive(running.supervisor)
    {
        return Err(format!(
            "attempt {} of job {} runs here: nothing is removed while it does",
            running.attempt_id, running.job_id
        ));
    }
    let before = agent::free_bytes(&root.dir);
    let mut recovery = Recovery {
        before,
        after: before,
        work_entries: 0,
        cache_dirs: 0,
    };
    if before >= floor {
        return Ok(recovery);
    }
    for dir in [root.work(), root.dir.join("attempts")] {
        for entry in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
            agent::remove_any(&entry.path())
                .map_err(|e| format!("{}: {e}", entry.path().display()))?;
            recovery.work_entries += 1;
        }
    }
    let mut caches: Vec<(std::time::SystemTime, std::path::PathBuf)> =
        std::fs::read_dir(root.cache())
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| {
                let used = e
                    .metadata()
                    .and_then(|m| m.modified())
                    .unwrap_or(std::time::UNIX_EPOCH);
                (used, e.path())
            })
            .collect();
    caches.sort();
    for (_, path) in caches {
        if agent::free_bytes(&root.dir) >= floor {
            break;
        }
        agent::remove_any(&path).map_err(|e| format!("{}: {e}", path.display()))?;
        recovery.cache_dirs += 1;
    }
    recovery.after = agent::free_bytes(&root.dir);
    if recovery.after < floor {
        return Err(format!(
            "{} bytes free after removing {} workspace entries and {} caches, below the floor of {floor}: the rest of the disk is not tpu-runner's",
            recovery.after, recovery.work_entries, recovery.cache_dirs
        ));
    }
    Ok(recovery)
}

/// Who holds the accelerator devices: the answer line `TPU_RUNNER_DEVICE_OWNER_PROBE <host>
/// CLEAR -` or `… BUSY <pids>`. Refuses where there are no devices, and where it could not
/// read every process and found no holder (only root sees every process: run it with
/// `sudo`), so CLEAR is never a guess.
pub fn probe_devices(devices: &Devices, host: &str) -> Result<String, String> {
    let holders = devices.holders(&[std::process::id() as i32]);
    if holders.devices.is_empty() {
        return Err(format!(
            "no accelerator devices on this worker (looked for {})",
            devices.patterns.join(", ")
        ));
    }
    if !holders.clear() {
        return Ok(format!(
            "TPU_RUNNER_DEVICE_OWNER_PROBE {host} BUSY {}",
            pid_list(&holders.pids)
        ));
    }
    if holders.unreadable > 0 {
        return Err(format!(
            "could not read the open files of {} process(es) and found no holder: the probe needs root (sudo) to answer",
            holders.unreadable
        ));
    }
    Ok(format!("TPU_RUNNER_DEVICE_OWNER_PROBE {host} CLEAR -"))
}
