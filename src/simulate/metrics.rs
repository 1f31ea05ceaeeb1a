//! Metrics of a simulated run (definitions in ../shared/reference/simulation.md) and the
//! release-aware max-flow upper bound on goodput. Pure computations on the run's records.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::engine::state::{Job, JobStatus};
use crate::spec::{TpuType, gcp};

/// Summary statistics of a sample.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct Stats {
    /// Mean.
    pub mean: f64,
    /// Median.
    pub p50: f64,
    /// 95th percentile.
    pub p95: f64,
    /// 99th percentile.
    pub p99: f64,
    /// Sample size.
    pub n: usize,
}

impl Stats {
    /// Statistics of `values` (nearest-rank percentiles); zeros when empty.
    pub fn of(values: &[f64]) -> Stats {
        if values.is_empty() {
            return Stats::default();
        }
        let mut v = values.to_vec();
        v.sort_by(f64::total_cmp);
        let rank = |q: f64| v[((q * v.len() as f64).ceil() as usize).clamp(1, v.len()) - 1];
        Stats {
            mean: v.iter().sum::<f64>() / v.len() as f64,
            p50: rank(0.5),
            p95: rank(0.95),
            p99: rank(0.99),
            n: v.len(),
        }
    }
}

/// Every metric of one run.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Metrics {
    /// Chip-hours of ACTIVE capacity (set-up and idle included).
    pub allocated_chip_hours: f64,
    /// Chip-hours of commands running.
    pub busy_chip_hours: f64,
    /// Busy chip-hours whose progress survived.
    pub goodput_chip_hours: f64,
    /// Chip-hours of progress lost to preemption and failures.
    pub lost_chip_hours: f64,
    /// busy / allocated.
    pub utilization: f64,
    /// goodput / allocated.
    pub goodput_ratio: f64,
    /// The release-aware max-flow bound on goodput chip-hours.
    pub bound_goodput_chip_hours: f64,
    /// goodput / bound.
    pub efficiency: f64,
    /// Preemptions.
    pub preemptions: u64,
    /// Attempts beyond the first, over all jobs.
    pub retries: u64,
    /// Jobs submitted.
    pub jobs_submitted: u64,
    /// Jobs succeeded.
    pub jobs_succeeded: u64,
    /// Jobs failed.
    pub jobs_failed: u64,
    /// Jobs pending or running at the end.
    pub jobs_unfinished: u64,
    /// Workload jobs no fleet type could run (width without types), not submitted.
    pub jobs_skipped: u64,
    /// First start − submission, seconds (jobs that started).
    pub queue_wait_s: Stats,
    /// Completion − submission, seconds (succeeded jobs).
    pub jct_s: Stats,
    /// Capacity request → ACTIVE, seconds.
    pub time_to_capacity_s: Stats,
    /// USD of allocated chip-hours.
    pub cost_usd: f64,
    /// GB moved between regions.
    pub egress_gb: f64,
    /// USD of egress.
    pub egress_usd: f64,
    /// API calls by kind.
    pub api_calls: std::collections::BTreeMap<String, u64>,
    /// API errors by kind.
    pub api_errors: std::collections::BTreeMap<String, u64>,
    /// Discrete events processed by the simulated cloud.
    pub events: u64,
    /// Controller passes run (passes with nothing to do are skipped).
    pub passes: u64,
    /// Passes skipped because an inventory read failed.
    pub failed_passes: u64,
    /// Engine events emitted.
    pub engine_events: u64,
    /// Injected faults that fired, by kind (chaos runs; `qr_failed` also from the
    /// scenario's `cloud.qr_failure_per_hour`).
    pub faults: std::collections::BTreeMap<String, u64>,
    /// Steps whose invariants were checked.
    pub invariant_checks: u64,
    /// Simulated seconds.
    pub simulated_s: f64,
    /// Wall-clock seconds (the only field that differs between identical runs).
    pub wall_s: f64,
}

/// How many times `job`'s data crossed regions: each attempt run outside its bucket's region
/// (a job moved without its checkpoints reads them from afar), or, for a job whose
/// checkpoints move with it, each move (one copy).
fn cross_region_moves(job: &Job) -> usize {
    fn region(a: &crate::engine::state::Attempt) -> &str {
        gcp::zone_region(&a.zone).unwrap_or("")
    }
    if job.spec.move_checkpoints {
        job.attempts
            .windows(2)
            .filter(|w| region(&w[0]) != region(&w[1]))
            .count()
    } else {
        let home = job.placement.as_ref().map(|p| p.bucket_region());
        job.attempts
            .iter()
            .filter(|a| home.is_some_and(|h| h != region(a)))
            .count()
    }
}

/// Fills the job counts, retries, queue waits, completion times and egress of `metrics` from
/// `jobs` (every job of the run or window, ended or not): the same for a simulated run and
/// for what production recorded (`report`). `data_gb_per_attempt` moves for each attempt run
/// outside the job's bucket region, or for each move of a job whose checkpoints move with
/// it.
pub fn add_job_metrics<'a>(
    metrics: &mut Metrics,
    jobs: impl Iterator<Item = &'a Job>,
    data_gb_per_attempt: f64,
) {
    let mut waits = Vec::new();
    let mut jcts = Vec::new();
    for job in jobs {
        metrics.jobs_submitted += 1;
        match job.status {
            JobStatus::Succeeded => metrics.jobs_succeeded += 1,
            JobStatus::Failed | JobStatus::Deactivated => metrics.jobs_failed += 1,
            _ => metrics.jobs_unfinished += 1,
        }
        metrics.retries += job.attempts.len().saturating_sub(1) as u64;
        if let Some(start) = job.attempts.iter().filter_map(|a| a.started_at).min() {
            waits.push(start.secs_since(job.submitted_at));
        }
        if job.status == JobStatus::Succeeded
            && let Some(end) = job.ended_at
        {
            jcts.push(end.secs_since(job.submitted_at));
        }
        metrics.egress_gb += data_gb_per_attempt * cross_region_moves(job) as f64;
    }
    metrics.queue_wait_s = Stats::of(&waits);
    metrics.jct_s = Stats::of(&jcts);
}

/// USD of capacity held: chip-seconds per `<accelerator>/<spot|on-demand|adopted>` at
/// `prices` (family → (spot, on-demand) per chip-hour); adopted TPUs at `adopted` (None:
/// their on-demand price).
pub fn capacity_cost(
    chip_secs_by_type: &BTreeMap<String, f64>,
    prices: &BTreeMap<String, (f64, f64)>,
    adopted: Option<f64>,
) -> f64 {
    chip_secs_by_type
        .iter()
        .map(|(key, chip_s)| {
            let (accelerator, model) = key.split_once('/').unwrap_or((key, "spot"));
            let family = TpuType::parse(accelerator)
                .map(|t| t.quota_family().to_owned())
                .unwrap_or_default();
            let (spot, on_demand) = prices.get(&family).copied().unwrap_or((0.0, 0.0));
            chip_s / 3600.0
                * match model {
                    "spot" => spot,
                    "adopted" => adopted.unwrap_or(on_demand),
                    _ => on_demand,
                }
        })
        .sum()
}

/// A sample's mean with its 95 % confidence interval (Student's t).
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Interval {
    /// Sample size.
    pub n: usize,
    /// Mean.
    pub mean: f64,
    /// Half the interval's width (NaN with fewer than two values).
    pub half_width: f64,
}

impl Interval {
    /// The interval of the mean of `values`.
    pub fn of(values: &[f64]) -> Interval {
        let n = values.len();
        let mean = values.iter().sum::<f64>() / n.max(1) as f64;
        let half_width = if n < 2 {
            f64::NAN
        } else {
            let var = values.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1) as f64;
            t95(n - 1) * (var / n as f64).sqrt()
        };
        Interval {
            n,
            mean,
            half_width,
        }
    }

    /// The interval of the mean difference `b[i] - a[i]` (runs on the same seed: common
    /// random numbers).
    pub fn paired(a: &[f64], b: &[f64]) -> Interval {
        let d: Vec<f64> = a.iter().zip(b).map(|(a, b)| b - a).collect();
        Interval::of(&d)
    }

    /// Whether the interval leaves out zero.
    pub fn significant(&self) -> bool {
        self.half_width.is_finite() && self.mean.abs() > self.half_width
    }
}

/// The two-sided 95 % quantile of Student's t with `df` degrees of freedom.
fn t95(df: usize) -> f64 {
    const TABLE: [f64; 30] = [
        12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160,
        2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056,
        2.052, 2.048, 2.045, 2.042,
    ];
    match df {
        0 => f64::NAN,
        1..=30 => TABLE[df - 1],
        31..=60 => 2.000,
        61..=120 => 1.980,
        _ => 1.960,
    }
}

/// A job for the bound: released at `release_s`, needing `work` chip-seconds at most `width`
/// chips at a time.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BoundJob {
    /// Release (submission) time, seconds.
    pub release_s: f64,
    /// Chip-seconds of work.
    pub work: f64,
    /// Chips it can use at once.
    pub width: f64,
}

/// The release-aware max-flow bound: source → job (its work) → every slot at or after its
/// release (width × slot length) → sink (chips available in the slot × slot length).
///
/// Computed exactly as the minimum cut. For a set T of slots cut from the sink, each job
/// independently cuts either its source edge or its edges to the slots after its release
/// outside T, so cut(T) = Σ_{t∈T} C_t + Σ_j min(w_j, u_j · n_j(T)), where n_j(T) counts the
/// slots at or after j's release not in T. A dynamic programme over slots, backwards, with
/// state k = slots outside T so far, finds the minimum in O(S² + J log J) for S slots and J
/// jobs. (A greedy fill is not exact with per-job rate caps; a property test checks this
/// against a general max-flow solver.)
pub fn goodput_bound(jobs: &[BoundJob], slot_capacity_chip_s: &[f64], slot_s: f64) -> f64 {
    let n_slots = slot_capacity_chip_s.len();
    if n_slots == 0 || jobs.is_empty() {
        return 0.0;
    }
    // Jobs grouped by release slot; a job released after the last slot contributes nothing.
    let mut by_slot: Vec<Vec<(f64, f64)>> = vec![Vec::new(); n_slots];
    for j in jobs {
        let slot = (j.release_s / slot_s).floor().max(0.0) as usize;
        if slot < n_slots && j.work > 0.0 {
            by_slot[slot].push((j.work, (j.width * slot_s).max(0.0)));
        }
    }
    const INF: f64 = f64::INFINITY;
    // best[k]: minimum cut contribution of slots processed so far with k of them outside T.
    let mut best = vec![INF; n_slots + 1];
    best[0] = 0.0;
    for t in (0..n_slots).rev() {
        let max_k = n_slots - t;
        let mut next = vec![INF; n_slots + 1];
        for (k, cell) in next.iter_mut().enumerate().take(max_k + 1) {
            let in_t = if best[k].is_finite() {
                best[k] + slot_capacity_chip_s[t].max(0.0)
            } else {
                INF
            };
            let out_t = if k > 0 { best[k - 1] } else { INF };
            *cell = in_t.min(out_t);
        }
        // Jobs released in slot t: Σ min(w, u·k) for every k, from their sorted breakpoints.
        let group = &mut by_slot[t];
        if !group.is_empty() {
            group.sort_by(|a, b| (a.0 / a.1.max(1e-300)).total_cmp(&(b.0 / b.1.max(1e-300))));
            let mut rate: f64 = group.iter().map(|g| g.1).sum();
            let mut saturated = 0.0;
            let mut g = 0;
            for (k, cell) in next.iter_mut().enumerate().take(max_k + 1) {
                while g < group.len() && group[g].0 <= group[g].1 * k as f64 {
                    saturated += group[g].0;
                    rate -= group[g].1;
                    g += 1;
                }
                if cell.is_finite() {
                    *cell += saturated + rate.max(0.0) * k as f64;
                }
            }
        }
        best = next;
    }
    best.into_iter().fold(INF, f64::min)
}

/// A job for the placement-aware bound: a [`BoundJob`] and the index of the set of resources
/// (capacity pools) it may run on.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PlacedBoundJob {
    /// The job.
    pub job: BoundJob,
    /// Index into the resource sets.
    pub set: usize,
}

/// Resource sets of one connected component beyond which the nested-set refinement is
/// skipped (each costs two more bounds; the result stays a valid bound without it).
const REFINE_SETS_MAX: usize = 64;

/// The release-aware bound with placement rules: a job may use only the resources in its set
/// (`sets[set]`, indices into `capacity`: per resource, chip-seconds per slot).
///
/// Resources joined by a job's set form connected components; no job crosses one, so the
/// bound is the sum over components of [`goodput_bound`] on the component's own capacity.
/// Within a component, for each set P the jobs confined to P (their set ⊆ P) can do at most
/// the bound on P's capacity and the others at most the bound on the component's: the
/// smallest of these sums is kept. Every term is an upper bound on work any policy can do,
/// so the result is one too, and it is never above the pooled bound (all jobs on all
/// capacity). Jobs whose set is empty can never run and count nothing.
pub fn goodput_bound_with_placement(
    jobs: &[PlacedBoundJob],
    sets: &[Vec<usize>],
    capacity: &[Vec<f64>],
    slot_s: f64,
) -> f64 {
    let n_slots = capacity.first().map_or(0, Vec::len);
    let mut parent: Vec<usize> = (0..capacity.len()).collect();
    fn root(parent: &mut [usize], mut r: usize) -> usize {
        while parent[r] != r {
            parent[r] = parent[parent[r]];
            r = parent[r];
        }
        r
    }
    let mut jobs_of_set: Vec<Vec<BoundJob>> = vec![Vec::new(); sets.len()];
    for j in jobs {
        jobs_of_set[j.set].push(j.job);
    }
    for (set, members) in sets.iter().enumerate() {
        if jobs_of_set[set].is_empty() {
            continue;
        }
        if let Some((&first, rest)) = members.split_first() {
            for &r in rest {
                let (a, b) = (root(&mut parent, first), root(&mut parent, r));
                parent[a.max(b)] = a.min(b);
            }
        }
    }
    let mut components: std::collections::BTreeMap<usize, Vec<usize>> = Default::default();
    for (set, members) in sets.iter().enumerate() {
        if let Some(&first) = members.first()
            && !jobs_of_set[set].is_empty()
        {
            components
                .entry(root(&mut parent, first))
                .or_default()
                .push(set);
        }
    }
    let capacity_of = |resources: &mut dyn Iterator<Item = usize>| {
        let mut total = vec![0.0; n_slots];
        for r in resources {
            for (t, c) in capacity[r].iter().enumerate() {
                total[t] += c;
            }
        }
        total
    };
    let mut bound = 0.0;
    for (component, component_sets) in components {
        let component_capacity =
            capacity_of(&mut (0..capacity.len()).filter(|&r| root(&mut parent, r) == component));
        let all: Vec<BoundJob> = component_sets
            .iter()
            .flat_map(|&s| jobs_of_set[s].iter().copied())
            .collect();
        let mut best = goodput_bound(&all, &component_capacity, slot_s);
        if component_sets.len() > 1 && component_sets.len() <= REFINE_SETS_MAX {
            for &p in &component_sets {
                let (mut inside, mut outside) = (Vec::new(), Vec::new());
                for &q in &component_sets {
                    let within = sets[q].iter().all(|r| sets[p].binary_search(r).is_ok());
                    let to = if within { &mut inside } else { &mut outside };
                    to.extend_from_slice(&jobs_of_set[q]);
                }
                let p_capacity = capacity_of(&mut sets[p].iter().copied());
                best = best.min(
                    goodput_bound(&inside, &p_capacity, slot_s)
                        + goodput_bound(&outside, &component_capacity, slot_s),
                );
            }
        }
        bound += best;
    }
    bound
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bound_respects_releases_widths_and_capacity() {
        // One slot of 100 s with 8 chips: a job of width 4 can do at most 400 chip-s.
        let jobs = [BoundJob {
            release_s: 0.0,
            work: 1000.0,
            width: 4.0,
        }];
        assert_eq!(goodput_bound(&jobs, &[800.0], 100.0), 400.0);
        // Released in the last slot: only that slot counts.
        let jobs = [BoundJob {
            release_s: 150.0,
            work: 1000.0,
            width: 8.0,
        }];
        assert_eq!(goodput_bound(&jobs, &[800.0, 800.0], 100.0), 800.0);
        // Ample capacity: all work.
        let jobs = [
            BoundJob {
                release_s: 0.0,
                work: 300.0,
                width: 4.0,
            },
            BoundJob {
                release_s: 50.0,
                work: 200.0,
                width: 4.0,
            },
        ];
        assert_eq!(goodput_bound(&jobs, &[1e9; 3], 100.0), 500.0);
    }

    #[test]
    fn percentiles() {
        let s = Stats::of(&[1.0, 2.0, 3.0, 4.0]);
        assert_eq!((s.mean, s.p50, s.p95, s.p99, s.n), (2.5, 2.0, 4.0, 4.0, 4));
    }

    #[test]
    fn paired_differences_have_a_t_interval() {
        // Differences 1, 2, 3: mean 2, sd 1, t(2) = 4.303: half width 4.303 / sqrt(3).
        let p = Interval::paired(&[0.0, 0.0, 0.0], &[1.0, 2.0, 3.0]);
        assert_eq!((p.n, p.mean), (3, 2.0));
        assert!((p.half_width - 4.303 / 3f64.sqrt()).abs() < 1e-9);
        assert!(!p.significant(), "the interval [-0.48, 4.48] covers zero");
        let p = Interval::paired(&[0.0; 5], &[2.0, 2.1, 1.9, 2.0, 2.0]);
        assert!(p.significant());
        let one = Interval::paired(&[1.0], &[3.0]);
        assert!(
            one.half_width.is_nan() && !one.significant(),
            "one run has no interval"
        );
    }
}
