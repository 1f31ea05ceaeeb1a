//! `tpu-runner simulate`: scenarios, the harness that runs the real engine against the
//! simulated cloud, metrics with an upper bound, and reports (table, JSON, SVG/HTML).

pub mod capture;
pub mod captured;
pub mod checker;
mod fingerprint;
pub mod harness;
pub mod metrics;
pub mod recorded;
pub mod report;
pub mod scenario;
pub mod starter;
