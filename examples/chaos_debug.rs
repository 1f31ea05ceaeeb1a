//! Development aid: runs a scenario with default chaos and dumps the state when it stops.
use tpu_runner::simulate::harness::{self, RunOptions, StepView};
use tpu_runner::simulate::scenario::ChaosSpec;
fn main() {
    let path = std::env::args().nth(1).unwrap();
    let seed: u64 = std::env::args().nth(2).unwrap().parse().unwrap();
    let job = std::env::args().nth(3);
    let s = tpu_runner::simulate::scenario::load(std::path::Path::new(&path)).unwrap();
    let chaos = s.chaos.or(Some(ChaosSpec::defaults(s.horizon_secs)));
    let mut last = String::new();
    let mut check = |v: &StepView<'_>| -> Result<(), String> {
        if let Some(out) = v.output { for e in &out.events { if job.as_deref().is_none_or(|j| e.job_id.as_deref() == Some(j) || e.detail.contains(j) || e.resource_id.as_deref().is_some_and(|r| r.contains(j))) { println!("{} {} {:?} {:?} {:?} {}", e.at, e.kind, e.job_id, e.resource_id, e.attempt_id, e.detail); } } }
        if v.now.to_string().as_str() >= "2026-01-03T06:00" && v.now.to_string().as_str() < "2026-01-03T06:01" {
            if let Some(out) = v.output { println!("{} pass actions={:?} big={:?} {}", v.now, out.actions.iter().map(|a| a.kind()).collect::<Vec<_>>(), v.state.resources.get("faulty-big-1-28722621").map(|r| r.status), v.cloud.describe("faulty-big-1-28722621")); }
        }
        last = v.state.resources.keys().map(|k| format!("{} [{:?}]\n", v.cloud.describe(k), v.state.resources[k].status)).collect();
        last.push_str(&format!("available {:?}\n", v.cloud.available_slices()));
        if let Some(j) = &job { if let Some(jj) = v.state.job(j) { last.push_str(&serde_json::to_string_pretty(jj).unwrap()); } }
        Ok(())
    };
    let r = harness::run(&s, "classic", seed, RunOptions { chaos, ..Default::default() }, harness::Hooks { checker: Some(&mut check), mutator: None });
    if let Err(v) = r { println!("VIOLATION {} at {}", v.message, v.at_s); }
    println!("{last}");
}
