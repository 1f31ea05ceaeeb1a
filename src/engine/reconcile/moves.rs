//! Moving on after repeated preemptions (opt-in per fleet: `policy.move_after_preemptions`):
//! a job requeued after its K-th cloud preemption within `move_window` in the region it is
//! pinned to is pinned to the next of its other regions (its buckets' regions, in order) where
//! the fleet has an entry it can use. Its checkpoint directory moves with it (copied to that
//! region's bucket before its next attempt) only when the job says `move_checkpoints: true`;
//! otherwise its bucket stays where it is and the job reads it across regions. Decides only:
//! never copies or deletes anything itself.

use super::Pass;
use crate::engine::state::{BucketRegion, EndReason, Job, Placement};
use crate::spec::{Name, gcp};

/// The summary of an attempt a cloud preemption ended (what counts towards a move; a
/// notice, a displacement or a controlled interruption does not).
pub(super) const CLOUD_PREEMPTION: &str = "TPU preempted or lost";

impl<'a> Pass<'a> {
    /// After `job_id` was requeued by a cloud preemption: moves it when the rule says so.
    pub(super) fn consider_move(&mut self, job_id: &Name) {
        let rule = self.index.fleet.policy.region_move;
        if !rule.enabled() {
            return;
        }
        let now = self.now;
        let Some(job) = self.state.job(job_id) else {
            return;
        };
        // A job the user pinned to a zone or a TPU stays there.
        let (Some(placement), None, None) = (&job.placement, &job.spec.zone, &job.spec.tpu_name)
        else {
            return;
        };
        let since = now.plus_secs(-rule.window_secs);
        let preemptions = job
            .attempts
            .iter()
            .filter(|a| {
                a.end_reason == Some(EndReason::Preempted)
                    && a.error_summary == CLOUD_PREEMPTION
                    && a.ended_at.is_some_and(|t| t > since)
                    && gcp::zone_region(&a.zone).is_ok_and(|r| r == placement.region)
                    && placement.since.is_none_or(|s| a.created_at >= s)
            })
            .count();
        if preemptions < rule.after_preemptions as usize {
            return;
        }
        let Some(to) = self.next_region(job, &placement.region) else {
            return;
        };
        let from = placement.region.clone();
        let old_bucket_region = placement.bucket_region().to_owned();
        let checkpoint_dir = format!("{}/jobs/{job_id}/checkpoints", placement.bucket);
        let next = if job.spec.move_checkpoints {
            Placement {
                region: to.region.clone(),
                bucket: Name::new(&to.bucket),
                bucket_region: None,
                checkpoint_from: Some(placement.checkpoint_from.clone().unwrap_or(checkpoint_dir)),
                since: Some(now),
            }
        } else {
            Placement {
                region: to.region.clone(),
                bucket: placement.bucket,
                bucket_region: (old_bucket_region != to.region).then_some(old_bucket_region),
                checkpoint_from: None,
                since: Some(now),
            }
        };
        let detail = format!(
            "from={from}; to={}; preemptions={preemptions}; checkpoints={}",
            to.region,
            match (&next.checkpoint_from, &next.bucket_region) {
                (Some(dir), _) => format!("copied from {dir} to {}", next.bucket),
                (None, Some(r)) => format!("stay in {r}"),
                (None, None) => "in the region's bucket".to_owned(),
            }
        );
        if let Some(job) = self.state.jobs.get_mut(job_id) {
            job.placement = Some(next);
        }
        self.event("job_moved", Some(job_id), None, None, detail);
    }

    /// The first of `job`'s bucket regions after `current` (in order, wrapping round) where
    /// the fleet has an entry the job can use.
    fn next_region<'j>(&self, job: &'j Job, current: &str) -> Option<&'j BucketRegion> {
        let regions = &job.bucket_regions;
        let at = regions.iter().position(|b| b.region == current);
        let start = at.map_or(0, |i| i + 1);
        (0..regions.len())
            .map(|k| &regions[(start + k) % regions.len()])
            .filter(|b| b.region != current)
            .find(|b| {
                self.index.fleet.tpus.iter().any(|e| {
                    job.spec.tpu.accepts(&e.tpu_type)
                        && gcp::zone_region(&e.zone).is_ok_and(|r| r == b.region)
                })
            })
    }
}
