//! The job file of a captured scenario (`workload: [{kind: jobs, file: jobs.jsonl}]`): one
//! JSON object per line, each a job as it was submitted and what became of it in production,
//! read back as the simulator's arrivals. Written by `capture`, read by the scenario loader;
//! it touches no store and no file itself.

use std::sync::Arc;

use serde::{Deserialize, Serialize};
use tpu_runner_sim::JobBehaviour;
use tpu_runner_sim::workload::JobArrival;

use crate::spec::{FleetSpec, JobSpec, Priority, TpuRequest, TpuType};

/// How a job ended in the window captured.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    /// Every worker exited 0.
    Succeeded,
    /// Failed in the application (replayed as failing on every attempt).
    Failed,
    /// Cancelled by its user after running (replayed as running its observed time).
    Cancelled,
    /// Still pending or running when the window closed (its work is a lower bound).
    Unfinished,
}

/// One captured job.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CapturedJob {
    /// Its id in production.
    pub id: String,
    /// Submitted this many seconds after the window opened.
    pub at_secs: f64,
    /// The TPU types it accepts.
    pub types: Vec<String>,
    /// The regions of its buckets.
    pub regions: Vec<String>,
    /// Its priority.
    #[serde(default)]
    pub priority: Priority,
    /// Seconds of work: its last attempt's run time (the whole job when it never
    /// checkpoints; see `capture`'s notes).
    pub work_secs: f64,
    /// How it ended.
    pub outcome: Outcome,
    /// Attempts it took in production.
    #[serde(default)]
    pub attempts: u32,
    /// Seconds from submission to its first attempt's start in production (absent: it
    /// never started in the window).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub waited_secs: Option<f64>,
}

impl CapturedJob {
    /// Why the job cannot be replayed, if it cannot.
    pub fn check(&self) -> Option<String> {
        if self.id.is_empty() {
            return Some("an empty id".into());
        }
        if !(self.at_secs.is_finite() && self.at_secs >= 0.0) {
            return Some(format!(
                "at_secs {} is not a time in the window",
                self.at_secs
            ));
        }
        if !(self.work_secs.is_finite() && (0.0..=1e9).contains(&self.work_secs)) {
            return Some(format!("work_secs {} is not a duration", self.work_secs));
        }
        if self.types.is_empty() {
            return Some("no TPU types".into());
        }
        if let Some(bad) = self.types.iter().find(|t| TpuType::parse(t).is_err()) {
            return Some(format!("{bad:?} is not a TPU type"));
        }
        if self.regions.is_empty() {
            return Some("no regions".into());
        }
        None
    }

    /// The simulator's arrival for this job (`check` passed).
    pub fn arrival(&self) -> JobArrival {
        // A job of `tpu: any` accepts types of several sizes: its width is the smallest.
        let width = self
            .types
            .iter()
            .filter_map(|t| TpuType::parse(t).ok())
            .map(|t| t.chips())
            .min()
            .unwrap_or(0);
        JobArrival {
            id: self.id.clone(),
            at_secs: self.at_secs,
            width_chips: width,
            regions: Arc::from(self.regions.clone()),
            priority: match self.priority {
                Priority::Low => 0,
                Priority::Normal => 1,
                Priority::High => 2,
            },
            types: Some(Arc::from(self.types.clone())),
            behaviour: JobBehaviour {
                app_failure: if self.outcome == Outcome::Failed {
                    1.0
                } else {
                    0.0
                },
                ..JobBehaviour::plain(self.work_secs)
            },
        }
    }
}

/// The TPU types `spec` accepts, by name: its own, or every type of `fleet` for `tpu: any`
/// (sorted, once each).
pub fn types_of(spec: &JobSpec, fleet: &FleetSpec) -> Vec<String> {
    match &spec.tpu {
        TpuRequest::OneOf(types) => types.iter().map(ToString::to_string).collect(),
        TpuRequest::Any => {
            let mut all: Vec<String> = fleet.tpus.iter().map(|e| e.tpu_type.to_string()).collect();
            all.sort();
            all.dedup();
            all
        }
    }
}

/// The jobs of a job file, or the first line that is not one (1-based) and why.
pub fn parse(text: &str) -> Result<Vec<CapturedJob>, (usize, String)> {
    let mut jobs = Vec::new();
    let mut ids = std::collections::HashSet::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let job: CapturedJob = serde_json::from_str(line).map_err(|e| {
            // serde's position counts within the line: say the column only.
            let text = e.to_string();
            let what = text
                .rsplit_once(" at line ")
                .map_or(text.as_str(), |(w, _)| w);
            (i + 1, format!("{what} (column {})", e.column()))
        })?;
        if let Some(why) = job.check() {
            return Err((i + 1, format!("job {:?}: {why}", job.id)));
        }
        if !ids.insert(job.id.clone()) {
            return Err((i + 1, format!("job {:?} appears twice", job.id)));
        }
        jobs.push(job);
    }
    Ok(jobs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_are_read_strictly_and_named_when_bad() {
        let good = r#"{"id":"a","at_secs":1.5,"types":["v6e-8"],"regions":["us-east1"],"work_secs":60,"outcome":"succeeded"}"#;
        let jobs = parse(&format!("{good}\n\n")).unwrap();
        assert_eq!(jobs[0].arrival().width_chips, 8);
        assert_eq!(jobs[0].priority, Priority::Normal);
        let any = good.replace("[\"v6e-8\"]", "[\"v6e-16\",\"v5litepod-4\"]");
        assert_eq!(
            parse(&any).unwrap()[0].arrival().width_chips,
            4,
            "the smallest"
        );
        for (bad, why) in [
            (good.replace("\"a\"", "\"\""), "empty id"),
            (good.replace("1.5", "-1"), "at_secs"),
            (good.replace("v6e-8", "V6E_8"), "not a TPU type"),
            (
                good.replace("\"outcome\"", "\"extra\":1,\"outcome\""),
                "unknown field",
            ),
            (format!("{good}\n{good}"), "twice"),
        ] {
            let err = parse(&bad).unwrap_err();
            assert!(err.1.contains(why), "{bad}: {err:?}");
        }
    }
}
