//! Why each pending job is not running: used by `plan` and `status`. Reads the state after
//! a pass; pure.
