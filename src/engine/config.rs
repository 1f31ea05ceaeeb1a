//! Engine constants (the original's §3.11 values and the limits added by the rewrite). Plain
//! data; every field is a number of seconds or a count.

use serde::{Deserialize, Serialize};

/// Timing and limits of the reconcile engine.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct EngineConfig {
    /// Seconds between passes in production (the original's loop, 30 s).
    pub reconcile_interval_secs: i64,
    /// A provisioning node seen before and now missing is recycled after this (300 s).
    pub orphan_grace_secs: i64,
    /// After one worker fails, wait this long for the others (60 s).
    pub partial_failure_grace_secs: i64,
    /// After some workers succeed, silent ones are lost after this (new; 600 s).
    pub partial_success_grace_secs: i64,
    /// A launch still failing after this long ends the attempt (1800 s).
    pub stale_launch_secs: i64,
    /// A running attempt whose heartbeat is older than this is lost (new; 900 s).
    pub heartbeat_timeout_secs: i64,
    /// Launch failures of one attempt before it is ended as lost (new; 5).
    pub max_launch_failures: u32,
    /// Failed cleanups of a failed launch before it is ended anyway (new; 5).
    pub max_cleanup_failures: u32,
    /// Retryable infrastructure failures of one job before it fails (new; 6).
    pub max_infra_retries: u32,
    /// First backoff after an infrastructure failure, doubled each time (new; 60 s).
    pub infra_backoff_secs: i64,
    /// Longest infrastructure backoff (new; 1800 s).
    pub infra_backoff_max_secs: i64,
    /// Failed cancels of one attempt before escalation (2).
    pub cancel_escalation: u32,
    /// Retryable failures of one job on one managed Spot TPU before it is replaced (2).
    pub recycle_threshold: u32,
    /// First pause of an entry's capacity requests after a refusal, doubled each time (new; 60 s).
    pub create_backoff_secs: i64,
    /// Longest pause of an entry's capacity requests (new; 900 s).
    pub create_backoff_max_secs: i64,
}

impl Default for EngineConfig {
    fn default() -> Self {
        EngineConfig {
            reconcile_interval_secs: 30,
            orphan_grace_secs: 300,
            partial_failure_grace_secs: 60,
            partial_success_grace_secs: 600,
            stale_launch_secs: 1800,
            heartbeat_timeout_secs: 900,
            max_launch_failures: 5,
            max_cleanup_failures: 5,
            max_infra_retries: 6,
            infra_backoff_secs: 60,
            infra_backoff_max_secs: 1800,
            cancel_escalation: 2,
            recycle_threshold: 2,
            create_backoff_secs: 60,
            create_backoff_max_secs: 900,
        }
    }
}

/// Seconds between disk recoveries of one unhealthy idle adopted TPU (the original ran one
/// every pass, 30 s apart, each a round of SSH calls).
pub const DISK_RECOVERY_EVERY_SECS: i64 = 600;

/// `base × 2^(n-1)`, capped at `max` (n ≥ 1).
pub fn backoff_secs(base: i64, max: i64, n: u32) -> i64 {
    base.saturating_mul(1i64 << n.saturating_sub(1).min(30))
        .min(max)
}
