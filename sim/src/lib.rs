//! A deterministic discrete-event model of the Google Cloud TPU API (queued resources, nodes,
//! spot capacity, preemptions, workers) plus workload generators and spot-trace loading. It
//! knows nothing of tpu-runner's policies, never reads the wall clock and draws randomness only
//! from streams seeded by the run seed.

pub mod cloud;
pub mod model;
pub mod rng;
pub mod trace;
mod waiting;
pub mod workload;
mod zoned;

pub use cloud::{Accounting, QR_FAILED_MESSAGE, SimCloud};
pub use model::{
    ApiConfig, ApiLatency, ApiQuota, CallKind, Capacity, CloudConfig, CloudFaults, JobBehaviour,
    Latency, PoolConfig, PoolModel, WorkerConfig,
};
pub use rng::SimRng;
pub use trace::SpotTrace;
