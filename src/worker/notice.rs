//! The notice a running command gets before it is stopped to run again later: the agent
//! watches the metadata server's Spot preemption and host maintenance signals (and hears
//! the controller's interruptions through `worker cancel --notice`), writes the reason into
//! the file the command's `TPU_RUNNER_PREEMPTION_FILE` names, then sends the command SIGTERM,
//! so a training loop can save a checkpoint in the notice's 30 s. Decides nothing about jobs;
//! never talks to anything but the metadata server it is given.

use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::Duration;

pub use crate::engine::observe::Notice;

/// The command's environment variable naming the marker file (absent until a notice).
pub const FILE_ENV: &str = "TPU_RUNNER_PREEMPTION_FILE";

/// Seconds a Spot TPU VM runs on after its preemption notice; a controller's own stop with a
/// notice gives the command as long before it is killed.
pub const NOTICE_SECS: u64 = 30;

/// The metadata server of a Google Cloud VM (TPU VMs included).
pub const GOOGLE_METADATA: &str = "http://metadata.google.internal/computeMetadata/v1/";

/// The marker file of an attempt whose agent folder is `attempt_dir`.
pub fn marker(attempt_dir: &Path) -> PathBuf {
    attempt_dir.join("preemption-notice")
}

/// Writes `notice`'s word (one line) into the marker file, atomically: a command that sees the
/// file sees all of it.
pub fn write_marker(attempt_dir: &Path, notice: Notice) -> std::io::Result<()> {
    use std::io::Write;
    let path = marker(attempt_dir);
    let mut temp = tempfile::NamedTempFile::new_in(attempt_dir)?;
    writeln!(temp, "{}", notice.word())?;
    temp.as_file().sync_all()?;
    temp.persist(&path).map_err(|e| e.error)?;
    Ok(())
}

/// A metadata key the agent watches.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Key {
    /// `instance/preempted`: `TRUE` once a Spot VM got its preemption notice.
    Preempted,
    /// `instance/maintenance-event`: `NONE`, or the maintenance about to happen.
    MaintenanceEvent,
}

impl Key {
    /// The key's path below the metadata root.
    pub fn path(self) -> &'static str {
        match self {
            Key::Preempted => "instance/preempted",
            Key::MaintenanceEvent => "instance/maintenance-event",
        }
    }

    /// The notice a value of this key gives, if any. A live migration keeps the VM running
    /// (and TPU VMs do not migrate): only a maintenance that stops it is a notice.
    pub fn notice(self, value: &str) -> Option<Notice> {
        let value = value.trim();
        match self {
            Key::Preempted => value
                .eq_ignore_ascii_case("TRUE")
                .then_some(Notice::SpotPreemption),
            Key::MaintenanceEvent => value
                .starts_with("TERMINATE")
                .then_some(Notice::HostMaintenance),
        }
    }
}

/// Watches the metadata server at `base` (its `computeMetadata/v1/` root) until a notice
/// comes, on a thread of its own: each key is read once, then long-polled with
/// `wait_for_change` and the last ETag, as Google documents; an unreachable server is asked
/// again after a pause (doubling to a minute), and said once on stderr.
pub struct Watcher {
    notices: mpsc::Receiver<Notice>,
}

impl Watcher {
    /// Starts watching `base`.
    pub fn start(base: &str) -> Watcher {
        let (tx, rx) = mpsc::channel();
        let base = if base.ends_with('/') {
            base.to_owned()
        } else {
            format!("{base}/")
        };
        std::thread::spawn(move || {
            let Ok(runtime) = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            else {
                eprintln!("tpu-runner: cannot watch the metadata server: no runtime");
                return;
            };
            let client = match reqwest::Client::builder()
                .no_proxy()
                .connect_timeout(Duration::from_secs(5))
                .timeout(Duration::from_secs(LONG_POLL_SECS + 30))
                .build()
            {
                Ok(c) => c,
                Err(e) => {
                    eprintln!("tpu-runner: cannot watch the metadata server: {e}");
                    return;
                }
            };
            runtime.block_on(async {
                let first = tokio::select! {
                    n = watch_key(&client, &base, Key::Preempted) => n,
                    n = watch_key(&client, &base, Key::MaintenanceEvent) => n,
                };
                let _ = tx.send(first);
            });
        });
        Watcher { notices: rx }
    }

    /// The notice, once one came.
    pub fn notice(&self) -> Option<Notice> {
        self.notices.try_recv().ok()
    }
}

/// Seconds a long poll waits for a change before the server answers anyway.
const LONG_POLL_SECS: u64 = 60;

/// Watches `key` until its value is a notice.
async fn watch_key(client: &reqwest::Client, base: &str, key: Key) -> Notice {
    let url = format!("{base}{}", key.path());
    let mut etag: Option<String> = None;
    let mut pause = Duration::from_secs(1);
    let mut said = false;
    loop {
        let mut request = client.get(&url).header("Metadata-Flavor", "Google");
        if let Some(tag) = &etag {
            request = request.query(&[
                ("wait_for_change", "true"),
                ("timeout_sec", &LONG_POLL_SECS.to_string()),
                ("last_etag", tag),
            ]);
        }
        match read(request).await {
            Ok((value, tag)) => {
                if let Some(notice) = key.notice(&value) {
                    return notice;
                }
                etag = Some(tag);
                pause = Duration::from_secs(1);
            }
            Err(e) => {
                if !said {
                    eprintln!(
                        "tpu-runner: the metadata server does not answer {url} ({e}): asking again"
                    );
                    said = true;
                }
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(Duration::from_secs(60));
            }
        }
    }
}

/// A metadata value and its ETag; only a reply that says it is the metadata server's counts.
async fn read(request: reqwest::RequestBuilder) -> Result<(String, String), String> {
    let reply = request.send().await.map_err(|e| e.to_string())?;
    if !reply.status().is_success() {
        return Err(format!("HTTP {}", reply.status()));
    }
    let flavor = reply
        .headers()
        .get("Metadata-Flavor")
        .and_then(|v| v.to_str().ok());
    if flavor != Some("Google") {
        return Err("the reply is not the metadata server's (no Metadata-Flavor: Google)".into());
    }
    let etag = reply
        .headers()
        .get("ETag")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    let bytes = reply.bytes().await.map_err(|e| e.to_string())?;
    if bytes.len() > 4096 {
        return Err("the value is longer than any signal".into());
    }
    Ok((String::from_utf8_lossy(&bytes).into_owned(), etag))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_are_read_as_google_documents_them() {
        assert_eq!(Key::Preempted.notice("TRUE"), Some(Notice::SpotPreemption));
        assert_eq!(Key::Preempted.notice("FALSE"), None);
        assert_eq!(Key::MaintenanceEvent.notice("NONE"), None);
        assert_eq!(
            Key::MaintenanceEvent.notice("MIGRATE_ON_HOST_MAINTENANCE"),
            None
        );
        assert_eq!(
            Key::MaintenanceEvent.notice("TERMINATE_ON_HOST_MAINTENANCE\n"),
            Some(Notice::HostMaintenance)
        );
    }

    #[test]
    fn every_notice_has_a_word_read_back() {
        for n in Notice::ALL {
            assert_eq!(Notice::of_word(n.word()), Some(n));
        }
        assert_eq!(Notice::of_word("slice_failure_chip_driver_error"), None);
    }

    #[test]
    fn the_marker_holds_the_reason() {
        let dir = tempfile::tempdir().unwrap();
        write_marker(dir.path(), Notice::InterruptSpot).unwrap();
        assert_eq!(
            std::fs::read_to_string(marker(dir.path())).unwrap(),
            "interrupt-spot\n"
        );
    }
}
