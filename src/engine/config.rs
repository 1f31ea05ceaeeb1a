//! Engine constants (the original's §3.11 values and the limits added by the rewrite): the
//! timings a fleet may set (`EngineConfig`, read from its `policy.engine`) and the fixed
//! ones. Plain data; every value is a number of seconds or a count.

/// The engine's timings are user configuration: the fleet's `policy.engine` (spec::policy).
pub use crate::spec::policy::EngineConfig;

/// Seconds between disk recoveries of one unhealthy idle adopted TPU (the original ran one
/// every pass, 30 s apart, each a round of SSH calls).
pub const DISK_RECOVERY_EVERY_SECS: i64 = 600;

/// Seconds after its workers stopped on the cloud's notice that an attempt waits for its TPU
/// to go (a Spot TPU is preempted 30 s after its notice): judged a preemption when it goes;
/// ended (its TPU kept) if it is still up after this, as after maintenance that did not stop
/// it for long.
pub const NOTICE_GRACE_SECS: i64 = 120;

/// `base × 2^(n-1)`, capped at `max` (n ≥ 1).
pub fn backoff_secs(base: i64, max: i64, n: u32) -> i64 {
    base.saturating_mul(1i64 << n.saturating_sub(1).min(30))
        .min(max)
}
