//! A scenario around a user's own fleet (`simulate --fleet deployment.yaml`): the fleet as
//! it is, with a default cloud (provisioning, stockouts and Spot preemption at the levels of
//! the shipped scenarios) and a default workload sized to keep about 60 % of its chips busy (stockouts take a quarter of the time),
//! compared under `classic` and `frugal`; written out commented, to be edited. Pure text.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

use crate::spec::{EntryKind, FleetSpec};

/// Mean work of the default workload's jobs, hours (log-normal, median 1.5 h, σ 0.8).
const MEAN_WORK_H: f64 = 2.06;

/// The scenario text for `fleet`, read from `fleet_path`.
pub fn scenario_for(fleet_path: &Path, fleet: &FleetSpec) -> String {
    let mut pools: BTreeMap<(String, String), u32> = BTreeMap::new();
    let mut chips = 0u64;
    let mut widths: BTreeMap<u32, Vec<String>> = BTreeMap::new();
    let mut regions: Vec<String> = Vec::new();
    for e in &fleet.tpus {
        chips += e.declared_chips();
        let t = e.tpu_type.to_string();
        let w = widths.entry(e.tpu_type.chips()).or_default();
        if !w.contains(&t) {
            w.push(t.clone());
        }
        if !regions.iter().any(|r| r == e.region()) {
            regions.push(e.region().to_owned());
        }
        if let EntryKind::Managed { count } = e.kind {
            *pools.entry((e.zone.to_string(), t)).or_default() += count;
        }
    }
    let mean_width = widths.keys().map(|w| f64::from(*w)).sum::<f64>() / widths.len().max(1) as f64;
    // Jobs per hour that keep 60 % of the fleet's chips busy on average.
    let per_hour = (0.6 * chips as f64 / (MEAN_WORK_H * mean_width)).max(0.01);
    let q = |s: &str| serde_json::to_string(s).expect("a string serialises");
    let mut y = String::new();
    let _ = writeln!(
        y,
        "# A scenario around your fleet, written by `tpu-runner simulate --fleet`. The fleet is\n\
         # yours; the cloud and the workload are defaults: make them look like yours\n\
         # (scenarios/README.md lists every field and where its default comes from), or capture\n\
         # what your controller lived through with `tpu-runner capture`.\n\
         name: {}\n\
         description: {}\n\
         fleet: {}\n\
         horizon_hours: 72\n\
         seeds: [1, 2, 3]\n\
         # Your fleet's policy is one of these, with its parameters; the other is laid over\n\
         # your engine timings.\n\
         policies: [classic, frugal]",
        q(&format!("{}-default", fleet.name)),
        q("your fleet against a default cloud and workload: which policy suits it?"),
        q(&fleet_path.display().to_string()),
    );
    let _ = writeln!(y, "types_by_width:");
    for (w, types) in &widths {
        let _ = writeln!(y, "  {w}: [{}]", types.join(", "));
    }
    let _ = writeln!(
        y,
        "cloud:\n  provisioning: {{median_secs: 300, sigma: 0.5}}   # 5 min to a TPU\n  qr_failure_per_hour: 0.02\n  pools:                                         # stockouts: ~6 h available, ~2 h out"
    );
    for ((zone, t), count) in &pools {
        let _ = writeln!(
            y,
            "    - {{zone: {zone}, type: {t}, capacity: {{on_off: {{slices: {count}, mean_on_hours: 6, mean_off_hours: 2}}}}, preemption_per_hour: 0.05}}"
        );
    }
    let _ = writeln!(
        y,
        "workload:\n  - kind: synthetic\n    name: jobs\n    count: {}\n    interarrival: {{exponential: {:.0}}}   # about {per_hour:.1} jobs an hour: 60 % of your {chips} chips busy\n    duration: {{lognormal: {{median: 5400, sigma: 0.8}}}}\n    widths: {{{}}}\n    regions: [{{regions: [{}]}}]\n    checkpoint_secs: 1800\n    checkpoint_on_notice: true",
        ((per_hour * 72.0).ceil() as u64).clamp(1, 100_000),
        3600.0 / per_hour,
        widths
            .keys()
            .map(|w| format!("{w}: 1"))
            .collect::<Vec<_>>()
            .join(", "),
        regions.join(", ")
    );
    y
}
