//! Development aid: prints the first divergence between skipped and unskipped runs.
use tpu_runner::simulate::harness::{self, RunOptions, StepView};
fn main() {
    let path = std::env::args().nth(1).unwrap();
    let seed: u64 = std::env::args().nth(2).unwrap().parse().unwrap();
    let s = tpu_runner::simulate::scenario::load(std::path::Path::new(&path)).unwrap();
    let mut logs = Vec::new();
    for never_skip in [false, true] {
        let mut log = Vec::new();
        let mut check = |v: &StepView<'_>| -> Result<(), String> {
            if let Some(out) = v.output {
                for e in &out.events { log.push(format!("{} {} {:?} {:?} {}", e.at, e.kind, e.job_id, e.resource_id, e.detail)); }
            }
            Ok(())
        };
        harness::run(&s, "classic", seed, RunOptions { never_skip, ..Default::default() }, harness::Hooks { checker: Some(&mut check), mutator: None }).unwrap();
        logs.push(log);
    }
    for (i, (a, b)) in logs[0].iter().zip(&logs[1]).enumerate() {
        if a != b { println!("diverge at {i}:\n skip:  {a}\n every: {b}"); for k in i.saturating_sub(5)..i+3 { println!("  s {}", logs[0].get(k).map(|s| s.as_str()).unwrap_or("")); println!("  e {}", logs[1].get(k).map(|s| s.as_str()).unwrap_or("")); } return; }
    }
    println!("same prefix; lengths {} {}", logs[0].len(), logs[1].len());
}
