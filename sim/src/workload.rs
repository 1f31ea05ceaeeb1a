//! Workloads: synthetic generators (arrival process, durations, widths, regions, priorities,
//! checkpointing, failure rates) and replay of job traces from CSV with a column mapping. A
//! workload is a list of job arrivals; it knows nothing of TPU types or the engine.

use crate::model::JobBehaviour;
use crate::rng::SimRng;

/// A set of regions (a job's buckets), shared by every job drawn with it.
pub type Regions = std::sync::Arc<[String]>;

/// A job entering the system.
#[derive(Clone, Debug, PartialEq)]
pub struct JobArrival {
    /// Job id.
    pub id: String,
    /// Seconds after the start of the run.
    pub at_secs: f64,
    /// Chips it needs (its slice width).
    pub width_chips: u32,
    /// Regions with one of its buckets.
    pub regions: Regions,
    /// 0 low, 1 normal, 2 high.
    pub priority: u8,
    /// The TPU types it accepts, when the workload says (a captured job); else the
    /// scenario's types for its width.
    pub types: Option<Regions>,
    /// How it behaves on the workers.
    pub behaviour: JobBehaviour,
}

/// A distribution of seconds.
#[derive(Clone, Debug, PartialEq)]
pub enum Dist {
    /// Always this value.
    Constant(f64),
    /// Exponential with this mean.
    Exponential(f64),
    /// Log-normal with this median and shape.
    LogNormal {
        /// Median.
        median: f64,
        /// Shape.
        sigma: f64,
    },
    /// Draws from these observed values (e.g. a CSV column).
    Empirical(Vec<f64>),
}

impl Dist {
    /// One draw.
    pub fn sample(&self, rng: &mut SimRng) -> f64 {
        match self {
            Dist::Constant(v) => *v,
            Dist::Exponential(mean) => rng.exponential(*mean),
            Dist::LogNormal { median, sigma } => rng.lognormal(*median, *sigma),
            Dist::Empirical(values) if values.is_empty() => 0.0,
            Dist::Empirical(values) => values[rng.index(values.len())],
        }
    }
}

/// A synthetic workload.
#[derive(Clone, Debug, PartialEq)]
pub struct Synthetic {
    /// Prefix of job ids.
    pub name: String,
    /// Number of jobs.
    pub count: usize,
    /// First arrival (seconds).
    pub start_secs: f64,
    /// Inter-arrival times (`Constant(0)` = all at once).
    pub interarrival: Dist,
    /// Work per job (seconds of computation).
    pub duration: Dist,
    /// Widths in chips with weights.
    pub widths: Vec<(u32, f64)>,
    /// Region sets (a job's buckets) with weights.
    pub regions: Vec<(Regions, f64)>,
    /// Priority weights for low, normal, high.
    pub priorities: [f64; 3],
    /// Seconds between checkpoints (0 = none).
    pub checkpoint_secs: f64,
    /// Save a checkpoint on a preemption notice.
    pub checkpoint_on_notice: bool,
    /// Probability an attempt fails in the application.
    pub app_failure: f64,
    /// Probability an attempt hits a slice failure.
    pub infra_failure: f64,
    /// Probability the runner's set-up fails.
    pub setup_failure: f64,
    /// Shortest work (seconds); shorter draws are raised to it.
    pub min_duration_secs: f64,
    /// Longest work (seconds); longer draws are cut to it.
    pub max_duration_secs: f64,
}

fn weighted<T: Clone>(rng: &mut SimRng, items: &[(T, f64)]) -> T {
    let total: f64 = items.iter().map(|(_, w)| w).sum();
    let mut x = rng.uniform() * total;
    for (item, w) in items {
        if x < *w {
            return item.clone();
        }
        x -= w;
    }
    items.last().expect("non-empty").0.clone()
}

impl Synthetic {
    /// The arrivals up to `until_secs`, drawn from the `workload/<name>` stream of `seed`
    /// (lazily: a `count` of ten million with a few hundred arrivals in the horizon draws a
    /// few hundred; the draws of each arrival do not depend on where the list stops).
    pub fn generate(&self, seed: u64, until_secs: f64) -> Vec<JobArrival> {
        let mut rng = SimRng::new(seed, &format!("workload/{}", self.name));
        let mut t = self.start_secs;
        (0..self.count)
            .map_while(|i| {
                if i > 0 {
                    t += self.interarrival.sample(&mut rng);
                }
                if t > until_secs {
                    return None;
                }
                let work = self
                    .duration
                    .sample(&mut rng)
                    .clamp(self.min_duration_secs, self.max_duration_secs);
                let priority = weighted(
                    &mut rng,
                    &[
                        (0u8, self.priorities[0]),
                        (1, self.priorities[1]),
                        (2, self.priorities[2]),
                    ],
                );
                Some(JobArrival {
                    id: format!("{}-{i:05}", self.name),
                    at_secs: t,
                    width_chips: weighted(&mut rng, &self.widths),
                    regions: weighted(&mut rng, &self.regions),
                    priority,
                    types: None,
                    behaviour: JobBehaviour {
                        work_secs: work,
                        checkpoint_secs: self.checkpoint_secs,
                        app_failure: self.app_failure,
                        infra_failure: self.infra_failure,
                        setup_failure: self.setup_failure,
                        cache_key: Some(format!("{}-cache", self.name)),
                        checkpoint_on_notice: self.checkpoint_on_notice,
                    },
                })
            })
            .collect()
    }
}

/// Reads one numeric column of a CSV file (header row required).
pub fn read_column(text: &str, column: &str) -> Result<Vec<f64>, String> {
    let mut reader = csv::Reader::from_reader(text.as_bytes());
    let headers = reader
        .headers()
        .map_err(|e| format!("cannot read the header row: {e}"))?
        .clone();
    let index = headers.iter().position(|h| h == column).ok_or_else(|| {
        format!(
            "no column `{column}` (columns: {})",
            headers.iter().collect::<Vec<_>>().join(", ")
        )
    })?;
    let mut out = Vec::new();
    for (row, record) in reader.records().enumerate() {
        let record = record.map_err(|e| format!("row {}: {e}", row + 2))?;
        let cell = record.get(index).unwrap_or("");
        let value: f64 = cell
            .trim()
            .parse()
            .ok()
            .filter(|v: &f64| v.is_finite())
            .ok_or_else(|| {
                format!(
                    "row {}: `{column}` is not a finite number: {cell:?}",
                    row + 2
                )
            })?;
        out.push(value);
    }
    Ok(out)
}

/// Replay of a job trace: arrivals and widths from CSV columns, work from a column or a
/// distribution.
#[derive(Clone, Debug, PartialEq)]
pub struct TraceReplay {
    /// Prefix of job ids.
    pub name: String,
    /// Arrival seconds per job.
    pub arrivals: Vec<f64>,
    /// Width units per job (e.g. Philly's `scale_factor`, GPUs).
    pub widths: Vec<f64>,
    /// Work per job, if the trace has it.
    pub durations: Option<Vec<f64>>,
    /// Otherwise: work drawn from this distribution.
    pub duration: Dist,
    /// Chips per width unit.
    pub chips_per_unit: u32,
    /// Arrival times are multiplied by this (compress or stretch the trace).
    pub time_scale: f64,
    /// At most this many jobs (from the start of the trace).
    pub limit: usize,
    /// Region sets with weights.
    pub regions: Vec<(Regions, f64)>,
    /// Checkpoint interval, failure probabilities and duration bounds as for synthetic jobs.
    pub template: Synthetic,
}

impl TraceReplay {
    /// The jobs replayed: the first `limit` rows.
    fn rows(&self) -> usize {
        self.arrivals.len().min(self.widths.len()).min(self.limit)
    }

    /// When row `i` arrives.
    fn arrival_secs(&self, i: usize) -> f64 {
        let first = self.arrivals.first().copied().unwrap_or(0.0);
        (self.arrivals[i] - first).max(0.0) * self.time_scale + self.template.start_secs
    }

    /// How many jobs arrive up to `until_secs`.
    pub fn arriving_until(&self, until_secs: f64) -> usize {
        (0..self.rows())
            .filter(|&i| self.arrival_secs(i) <= until_secs)
            .count()
    }

    /// The arrivals up to `until_secs` (each row's draws are made whether it arrives in
    /// time or not, so a horizon changes no arrival's values).
    pub fn generate(&self, seed: u64, until_secs: f64) -> Vec<JobArrival> {
        let mut rng = SimRng::new(seed, &format!("workload/{}", self.name));
        (0..self.rows())
            .filter_map(|i| {
                let work = match &self.durations {
                    Some(d) => d[i % d.len()],
                    None => self.duration.sample(&mut rng),
                };
                let t = &self.template;
                let at_secs = self.arrival_secs(i);
                let arrival = JobArrival {
                    id: String::new(),
                    at_secs,
                    width_chips: (self.widths[i].max(1.0) as u32)
                        .saturating_mul(self.chips_per_unit),
                    regions: weighted(&mut rng, &self.regions),
                    priority: weighted(
                        &mut rng,
                        &[
                            (0u8, t.priorities[0]),
                            (1, t.priorities[1]),
                            (2, t.priorities[2]),
                        ],
                    ),
                    types: None,
                    behaviour: JobBehaviour {
                        work_secs: work.clamp(t.min_duration_secs, t.max_duration_secs),
                        checkpoint_secs: t.checkpoint_secs,
                        app_failure: t.app_failure,
                        infra_failure: t.infra_failure,
                        setup_failure: t.setup_failure,
                        cache_key: Some(format!("{}-cache", self.name)),
                        checkpoint_on_notice: t.checkpoint_on_notice,
                    },
                };
                (at_secs <= until_secs).then(|| JobArrival {
                    id: format!("{}-{i:05}", self.name),
                    ..arrival
                })
            })
            .collect()
    }
}
