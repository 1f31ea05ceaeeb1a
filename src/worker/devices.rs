//! Who holds a worker's accelerator devices (`/dev/accel*`, `/dev/vfio/<n>`): read from
//! every process's open files in `/proc`, so the agent needs neither `lsof` nor `fuser`.
//! A process whose files this user cannot read is counted, not guessed at: only root sees
//! every holder (the device-owner probe on adopted TPUs runs with `sudo`). Decides nothing.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

/// Which files are a worker's accelerator devices, and libtpu's lock file.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Devices {
    /// Glob patterns of the device files.
    pub patterns: Vec<String>,
    /// libtpu's lock file, removed before a launch when no process holds a device (a
    /// crashed job leaves it and the next one would refuse to start).
    pub lockfile: PathBuf,
}

impl Default for Devices {
    /// A TPU VM's: `/dev/accel*` (v4, v5e, v6e), `/dev/vfio/<n>` (v5p) and
    /// `/tmp/libtpu_lockfile`.
    fn default() -> Devices {
        Devices {
            patterns: vec!["/dev/accel*".into(), "/dev/vfio/[0-9]*".into()],
            lockfile: PathBuf::from("/tmp/libtpu_lockfile"),
        }
    }
}

/// What a look at the devices found.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Holders {
    /// The device files present.
    pub devices: Vec<PathBuf>,
    /// Processes with one of them open, ascending.
    pub pids: Vec<i32>,
    /// Processes whose open files could not be read (another user's, without root).
    pub unreadable: usize,
}

impl Holders {
    /// No readable process holds a device.
    pub fn clear(&self) -> bool {
        self.pids.is_empty()
    }
}

impl Devices {
    /// The device files present now, sorted.
    pub fn present(&self) -> Vec<PathBuf> {
        let mut found: Vec<PathBuf> = self
            .patterns
            .iter()
            .filter_map(|p| glob::glob(p).ok())
            .flat_map(|paths| paths.flatten())
            .collect();
        found.sort();
        found.dedup();
        found
    }

    /// The processes (other than `except`) holding a device now.
    pub fn holders(&self, except: &[i32]) -> Holders {
        let devices = self.present();
        let mut holders = Holders {
            devices,
            ..Holders::default()
        };
        if holders.devices.is_empty() {
            return holders;
        }
        let Ok(entries) = std::fs::read_dir("/proc") else {
            // Nothing could be looked at: never an answer of "free".
            holders.unreadable = usize::MAX;
            return holders;
        };
        for entry in entries.flatten() {
            let Some(pid) = entry
                .file_name()
                .to_str()
                .and_then(|s| s.parse::<i32>().ok())
            else {
                continue;
            };
            if except.contains(&pid) {
                continue;
            }
            match std::fs::read_dir(entry.path().join("fd")) {
                Ok(fds) => {
                    let holds = fds.flatten().any(|fd| {
                        std::fs::read_link(fd.path())
                            .is_ok_and(|target| holders.devices.iter().any(|d| d == &target))
                    });
                    if holds {
                        holders.pids.push(pid);
                    }
                }
                // Gone since the listing: nothing to count.
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(_) => holders.unreadable += 1,
            }
        }
        holders.pids.sort_unstable();
        holders
    }

    /// Removes libtpu's lock file when it is stale: no readable process holds a device and
    /// no process holds the file's lock (one of another user, which this one cannot see,
    /// would); says what it did.
    pub fn clear_stale_lockfile(&self, holders: &Holders) -> Option<String> {
        if !holders.clear() || !self.lockfile.exists() {
            return None;
        }
        let unlocked = std::fs::File::open(&self.lockfile).is_ok_and(|f| {
            nix::fcntl::Flock::lock(f, nix::fcntl::FlockArg::LockExclusiveNonblock).is_ok()
        });
        if !unlocked {
            return Some(format!(
                "left {} alone: a process holds its lock",
                self.lockfile.display()
            ));
        }
        Some(match std::fs::remove_file(&self.lockfile) {
            Ok(()) => format!(
                "removed the stale {} (no process holds an accelerator device)",
                self.lockfile.display()
            ),
            Err(e) => format!(
                "could not remove the stale {}: {e}",
                self.lockfile.display()
            ),
        })
    }
}

/// `pids` as the probe prints them: `1,2,3`, or `-` for none.
pub fn pid_list(pids: &[i32]) -> String {
    if pids.is_empty() {
        return "-".into();
    }
    pids.iter()
        .map(i32::to_string)
        .collect::<Vec<_>>()
        .join(",")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lock_file_someone_holds_is_left_alone_and_a_free_one_removed() {
        let dir = tempfile::tempdir().unwrap();
        let devices = Devices {
            patterns: vec![dir.path().join("accel*").display().to_string()],
            lockfile: dir.path().join("libtpu_lockfile"),
        };
        std::fs::write(&devices.lockfile, "").unwrap();
        let free = devices.holders(&[]);
        let held = nix::fcntl::Flock::lock(
            std::fs::File::open(&devices.lockfile).unwrap(),
            nix::fcntl::FlockArg::LockExclusiveNonblock,
        )
        .unwrap();
        let note = devices.clear_stale_lockfile(&free).unwrap();
        assert!(note.contains("left") && devices.lockfile.exists(), "{note}");
        drop(held);
        let note = devices.clear_stale_lockfile(&free).unwrap();
        assert!(
            note.contains("removed") && !devices.lockfile.exists(),
            "{note}"
        );
    }
}
