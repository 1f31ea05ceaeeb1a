//! Turns the per-worker status objects of an attempt into one verdict (§5.5), with the
//! original's faults fixed: a user's own exit 2 or 75 is an application failure (setup and
//! infrastructure failures are only what the runner itself reports), and partial success
//! with silent workers is a lost attempt after a grace instead of waiting forever.

use super::observe::{Notice, WorkerState, WorkerStatus};
use super::time::Timestamp;

/// Exit code tpu-runner reports for retryable infrastructure failures.
pub const EXIT_RETRYABLE: i32 = 75;
/// Marker a worker reports when libtpu saw a slice (chip driver) failure.
pub const SLICE_FAILURE: &str = "slice_failure_chip_driver_error";

/// Exit codes of workers that stopped because a peer died (generic error, SIGTERM, SIGKILL).
const PEER_CODES: &[i32] = &[0, 1, 137, 143];

/// The verdict on an attempt.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Still running; look again at `recheck_at` at the latest (if any).
    Incomplete {
        /// When a grace period ends.
        recheck_at: Option<Timestamp>,
    },
    /// Every worker exited 0.
    Succeeded,
    /// The command, the set-up or the log upload failed.
    Failed {
        /// Aggregated exit code.
        exit_code: i32,
        /// Failure kind.
        kind: FailureKind,
        /// Per-worker summary.
        summary: String,
    },
    /// The cloud gave notice (a Spot preemption, host maintenance) and the workers stopped
    /// the command early: requeue it as after a preemption.
    Noticed {
        /// When the last of them stopped.
        at: Option<Timestamp>,
        /// Per-worker summary.
        summary: String,
    },
    /// Infrastructure failed under the job: requeue it.
    Retryable {
        /// Replace the TPU at once (slice failure).
        recycle: bool,
        /// Per-worker summary.
        summary: String,
    },
}

/// Non-retryable failure kinds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FailureKind {
    /// The command exited non-zero.
    Command,
    /// The runner's set-up failed.
    Setup,
    /// Logs could not be uploaded.
    Artifacts,
}

/// Grace periods used by [`aggregate`].
#[derive(Clone, Copy, Debug)]
pub struct Graces {
    /// After a worker fails, how long to wait for the others to report (original: 60 s).
    pub partial_failure_secs: i64,
    /// After some workers succeed, how long to wait for the silent ones before declaring
    /// them lost (the original waited forever).
    pub partial_success_secs: i64,
}

/// Aggregates `statuses` of an attempt expecting `expected` workers.
pub fn aggregate(
    statuses: &[WorkerStatus],
    expected: u32,
    now: Timestamp,
    graces: Graces,
) -> Verdict {
    let expected = expected.max(1) as usize;
    // One status per host (a re-upload may duplicate one).
    let mut by_host: Vec<&WorkerStatus> = Vec::with_capacity(statuses.len());
    for s in statuses {
        if !by_host.iter().any(|o| o.host == s.host) {
            by_host.push(s);
        }
    }
    by_host.sort_by(|a, b| a.host.cmp(&b.host));
    let missing = expected.saturating_sub(by_host.len());
    let code = |s: &WorkerStatus| -> i32 {
        if s.infrastructure_failure.is_some() {
            EXIT_RETRYABLE
        } else {
            match s.state {
                WorkerState::Succeeded => 0,
                _ => s.command_exit_code.filter(|c| *c != 0).unwrap_or(1),
            }
        }
    };
    // Only verdicts that end or retry an attempt carry a summary: built on demand (most
    // calls find a healthy attempt still running).
    let summary = || {
        let mut parts: Vec<String> = by_host
            .iter()
            .map(|s| match (&s.infrastructure_failure, &s.setup_error) {
                (Some(marker), _) => format!("{}: infrastructure failure {marker}", s.host),
                (None, Some(why)) if s.state == WorkerState::FailedSetup => {
                    format!("{}: set-up failed, the command never ran: {why}", s.host)
                }
                (None, _) => format!(
                    "{}: command exited {}",
                    s.host,
                    s.command_exit_code.unwrap_or(code(s))
                ),
            })
            .collect();
        if missing > 0 {
            parts.push(format!("{missing} worker status object(s) missing"));
        }
        parts.join("; ")
    };
    let artifacts = by_host
        .iter()
        .any(|s| s.state == WorkerState::FailedArtifacts || s.artifact_upload_error.is_some());
    let setup = by_host.iter().any(|s| s.state == WorkerState::FailedSetup);
    let infra: Vec<&&WorkerStatus> = by_host
        .iter()
        .filter(|s| s.infrastructure_failure.is_some())
        .collect();
    let others_are_peers = by_host
        .iter()
        .filter(|s| s.infrastructure_failure.is_none())
        .all(|s| s.state != WorkerState::FailedSetup && PEER_CODES.contains(&code(s)));
    let retryable = !infra.is_empty() && others_are_peers;
    let recycle = infra
        .iter()
        .any(|s| s.infrastructure_failure.as_deref() == Some(SLICE_FAILURE));
    let max_code = by_host.iter().map(|s| code(s)).max().unwrap_or(0);

    if artifacts {
        return Verdict::Failed {
            exit_code: 2,
            kind: FailureKind::Artifacts,
            summary: summary(),
        };
    }
    let noticed = infra.iter().all(|s| {
        s.infrastructure_failure
            .as_deref()
            .and_then(Notice::of_word)
            .is_some()
    });
    if retryable && noticed {
        return Verdict::Noticed {
            at: infra.iter().filter_map(|s| s.finished_at).max(),
            summary: summary(),
        };
    }
    if retryable {
        return Verdict::Retryable {
            recycle,
            summary: summary(),
        };
    }
    if missing == 0 {
        if setup {
            return Verdict::Failed {
                exit_code: max_code.max(1),
                kind: FailureKind::Setup,
                summary: summary(),
            };
        }
        if max_code != 0 {
            return Verdict::Failed {
                exit_code: max_code,
                kind: FailureKind::Command,
                summary: summary(),
            };
        }
        return Verdict::Succeeded;
    }
    // Some workers have not reported.
    let failing: Vec<&&WorkerStatus> = by_host.iter().filter(|s| code(s) != 0).collect();
    if !failing.is_empty() {
        let earliest = failing.iter().filter_map(|s| s.finished_at).min();
        return match earliest {
            Some(t) if !now.elapsed_since(t, graces.partial_failure_secs) => Verdict::Incomplete {
                recheck_at: Some(t.plus_secs(graces.partial_failure_secs)),
            },
            _ => Verdict::Failed {
                exit_code: max_code,
                kind: if setup {
                    FailureKind::Setup
                } else {
                    FailureKind::Command
                },
                summary: summary(),
            },
        };
    }
    // Everything reported so far succeeded; the rest are silent.
    match by_host.iter().filter_map(|s| s.finished_at).min() {
        Some(t) if now.elapsed_since(t, graces.partial_success_secs) => Verdict::Retryable {
            recycle: false,
            summary: summary(),
        },
        Some(t) => Verdict::Incomplete {
            recheck_at: Some(t.plus_secs(graces.partial_success_secs)),
        },
        None => Verdict::Incomplete { recheck_at: None },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const G: Graces = Graces {
        partial_failure_secs: 60,
        partial_success_secs: 600,
    };

    fn status(
        host: &str,
        state: WorkerState,
        code: Option<i32>,
        finished: Option<i64>,
        infra: Option<&str>,
    ) -> WorkerStatus {
        WorkerStatus {
            host: host.into(),
            state,
            command_exit_code: code,
            finished_at: finished.map(Timestamp::from_secs),
            infrastructure_failure: infra.map(str::to_owned),
            artifact_upload_error: None,
            setup_error: None,
        }
    }

    #[test]
    fn a_set_up_failure_says_why_the_command_never_ran() {
        let mut s = status("w0", WorkerState::FailedSetup, None, Some(10), None);
        s.setup_error = Some("the bundle link pw -> /etc/passwd points outside".into());
        match aggregate(&[s], 1, Timestamp::from_secs(10), G) {
            Verdict::Failed {
                kind: FailureKind::Setup,
                summary,
                ..
            } => assert!(
                summary.contains("set-up failed, the command never ran: the bundle link pw"),
                "{summary}"
            ),
            v => panic!("{v:?}"),
        }
    }

    #[test]
    fn a_notice_requeues_whatever_the_command_exited_with() {
        // A command that saved and exited 0 after the notice did not finish its work.
        for code in [0, 143] {
            let s = [
                status(
                    "w0",
                    WorkerState::Failed,
                    Some(code),
                    Some(10),
                    Some("spot-preemption"),
                ),
                status("w1", WorkerState::Failed, Some(143), Some(10), None),
            ];
            assert!(
                matches!(
                    aggregate(&s, 2, Timestamp::from_secs(10), G),
                    Verdict::Noticed { .. }
                ),
                "exit {code}"
            );
        }
        // A notice beside a slice failure is a slice failure.
        let s = [
            status(
                "w0",
                WorkerState::Failed,
                Some(0),
                Some(10),
                Some("host-maintenance"),
            ),
            status(
                "w1",
                WorkerState::Failed,
                Some(1),
                Some(10),
                Some(SLICE_FAILURE),
            ),
        ];
        assert!(matches!(
            aggregate(&s, 2, Timestamp::from_secs(10), G),
            Verdict::Retryable { recycle: true, .. }
        ));
    }

    // Acceptance scenarios 7–11 of the original (§8), adapted to explicit markers.
    #[test]
    fn one_of_four_failed_just_now_is_incomplete() {
        let s = [status("w0", WorkerState::Failed, Some(1), Some(1000), None)];
        assert_eq!(
            aggregate(&s, 4, Timestamp::from_secs(1000), G),
            Verdict::Incomplete {
                recheck_at: Some(Timestamp::from_secs(1060))
            }
        );
    }

    #[test]
    fn one_of_four_failed_61s_ago_is_a_command_failure() {
        let s = [status("w0", WorkerState::Failed, Some(1), Some(1000), None)];
        let v = aggregate(&s, 4, Timestamp::from_secs(1061), G);
        assert!(
            matches!(
                v,
                Verdict::Failed {
                    exit_code: 1,
                    kind: FailureKind::Command,
                    ..
                }
            ),
            "{v:?}"
        );
    }

    #[test]
    fn failure_without_finish_time_does_not_wait() {
        let s = [status("w0", WorkerState::Failed, Some(1), None, None)];
        assert!(matches!(
            aggregate(&s, 4, Timestamp::from_secs(5), G),
            Verdict::Failed {
                kind: FailureKind::Command,
                ..
            }
        ));
    }

    #[test]
    fn slice_failure_with_missing_peers_is_retryable_and_recycles() {
        let s = [
            status("w0", WorkerState::Failed, Some(1), Some(1000), None),
            status(
                "w1",
                WorkerState::Failed,
                Some(134),
                Some(1000),
                Some(SLICE_FAILURE),
            ),
        ];
        match aggregate(&s, 4, Timestamp::from_secs(1028), G) {
            Verdict::Retryable {
                recycle: true,
                summary,
            } => assert!(summary.contains("2 worker status object(s) missing")),
            v => panic!("{v:?}"),
        }
    }

    #[test]
    fn user_exit_75_without_marker_is_an_application_failure() {
        let s = [
            status("w0", WorkerState::Failed, Some(75), Some(1), None),
            status("w1", WorkerState::Failed, Some(1), Some(1), None),
            status("w2", WorkerState::Failed, Some(143), Some(1), None),
            status("w3", WorkerState::Failed, Some(143), Some(1), None),
        ];
        assert!(matches!(
            aggregate(&s, 4, Timestamp::from_secs(2), G),
            Verdict::Failed {
                exit_code: 143,
                kind: FailureKind::Command,
                ..
            }
        ));
    }

    #[test]
    fn user_exit_2_is_not_a_setup_failure() {
        let s = [status("w0", WorkerState::Failed, Some(2), Some(1), None)];
        assert!(matches!(
            aggregate(&s, 1, Timestamp::from_secs(2), G),
            Verdict::Failed {
                kind: FailureKind::Command,
                exit_code: 2,
                ..
            }
        ));
        let s = [status("w0", WorkerState::FailedSetup, None, Some(1), None)];
        assert!(matches!(
            aggregate(&s, 1, Timestamp::from_secs(2), G),
            Verdict::Failed {
                kind: FailureKind::Setup,
                ..
            }
        ));
    }

    #[test]
    fn partial_success_with_silent_workers_is_lost_after_grace() {
        let s = [status(
            "w0",
            WorkerState::Succeeded,
            Some(0),
            Some(100),
            None,
        )];
        assert_eq!(
            aggregate(&s, 2, Timestamp::from_secs(200), G),
            Verdict::Incomplete {
                recheck_at: Some(Timestamp::from_secs(700))
            }
        );
        assert!(matches!(
            aggregate(&s, 2, Timestamp::from_secs(700), G),
            Verdict::Retryable { recycle: false, .. }
        ));
    }

    #[test]
    fn all_succeeded() {
        let s = [
            status("w1", WorkerState::Succeeded, Some(0), Some(1), None),
            status("w0", WorkerState::Succeeded, Some(0), Some(1), None),
        ];
        assert_eq!(
            aggregate(&s, 2, Timestamp::from_secs(2), G),
            Verdict::Succeeded
        );
    }
}
