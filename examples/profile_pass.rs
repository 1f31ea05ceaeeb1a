//! Runs the 100k-job planning pass a few times (for profiling with perf).
use tpu_runner::engine::policy::Classic;
use tpu_runner::engine::{Engine, EngineConfig, Timestamp, synthetic};
fn main() {
    let epoch = Timestamp::from_secs(1_767_225_600);
    let fleet = synthetic::fleet(500, 21);
    let (state, obs) = synthetic::planning_instance(&fleet, 100_000, 10_000, epoch);
    let engine = Engine::new(fleet, EngineConfig::default(), Box::new(Classic));
    for _ in 0..5 {
        let mut s = state.clone();
        let t = std::time::Instant::now();
        let out = engine.reconcile(&mut s, &obs, epoch.plus_secs(100_000));
        eprintln!("{:?} actions={}", t.elapsed(), out.actions.len());
    }
}
