//! Documented process exit codes (also listed in `--help` and the README). Nothing else.

/// Exit status of a `tpu-runner` command.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum ExitStatus {
    /// Success.
    Ok = 0,
    /// The input was read but is invalid (every problem is printed).
    Invalid = 1,
    /// Usage error: unknown command or flag, bad argument value.
    Usage = 2,
    /// A file could not be read or written.
    Io = 3,
    /// A simulated run broke an invariant.
    Violation = 4,
    /// The state store failed: unreachable, damaged, refused (the message says what to do).
    Store = 5,
    /// Something holds what was asked about (`probe-adopted-device-owners`: a device is
    /// busy), as the original's 75.
    Busy = 75,
    /// Interrupted by Ctrl-C (`watch`).
    Interrupted = 130,
}
