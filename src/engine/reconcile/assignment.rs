//! The assignment step of a pass: pending jobs matched to idle TPUs by the policy, in priority,
//! then most-constrained, then FIFO order, and the new attempts' launches queued for the end of
//! the pass. Sizes no capacity.

use super::{Pass, launch_request};
use crate::engine::demand::Demand;
use crate::engine::memo::{is_candidate, is_pending};
use crate::engine::observe::QrState;
use crate::engine::policy::{AssignInput, CapacityInput};
use crate::engine::state::{Attempt, JobStatus, Placement, Resource, ResourceStatus, State};
use crate::engine::time::Timestamp;
use crate::spec::{Name, NameSet, names};

impl<'a> Pass<'a> {
    // ----- step 8: assignment -------------------------------------------------------------

    /// Assignment, and the capacity plan for the state right after it: the demand is built
    /// once per pass, before any job changes, and capacity sees it with the chosen pairs
    /// already taken out.
    pub(super) fn assignment(&mut self) {
        let index = self.index;
        let now = self.now;
        let cooling = self.cooling_entries();
        let paused: Vec<bool> = index
            .fleet
            .tpus
            .iter()
            .map(|entry| {
                self.state
                    .entry_backoff
                    .get(&entry.id)
                    .is_some_and(|b| b.until > now)
            })
            .collect();
        let granted = if self.policy.reads_granted() {
            self.granted_per_entry()
        } else {
            Vec::new()
        };
        let kept = self
            .memo
            .assign
            .update(&self.state.jobs, &self.state.resources, index);
        let (pairs, waits, desired, named) = {
            let pending = if kept {
                self.memo.assign.pending(&self.state.jobs)
            } else {
                self.state.jobs.values().filter(|j| is_pending(j)).collect()
            };
            let demand = Demand::build_with(index, pending, now, &mut self.memo.classes);
            let waits: Vec<Timestamp> = demand
                .jobs
                .iter()
                .filter(|j| !j.assignable)
                .filter_map(|j| j.job.not_before)
                .collect();
            let candidates: Vec<&Resource> = if kept {
                self.memo.assign.idle(&self.state.resources)
            } else {
                let records = self.state.resources.values();
                records.filter(|r| is_candidate(r, index)).collect()
            };
            let pairs = self.policy.assign(&AssignInput {
                index,
                demand: &demand,
                tpus: &candidates,
            });
            let mut waiting = vec![true; demand.jobs.len()];
            let mut taken = vec![false; candidates.len()];
            let mut busy = if kept {
                self.memo.assign.busy().to_vec()
            } else {
                let mut busy = vec![0u32; index.fleet.tpus.len()];
                for r in self.state.resources.values().filter(|r| r.is_busy()) {
                    if let Some(e) = index.owns_record(r) {
                        busy[e] += 1;
                    }
                }
                busy
            };
            for &(j, t) in &pairs {
                waiting[j] = false;
                taken[t] = true;
                if let Some(e) = index.owns_record(candidates[t]) {
                    busy[e] += 1;
                }
            }
            let idle_adopted: Vec<&Resource> = candidates
                .iter()
                .zip(&taken)
                .filter(|(r, taken)| r.adopted && !**taken)
                .map(|(r, _)| *r)
                .collect();
            let capacity = CapacityInput {
                index,
                demand: &demand,
                waiting: &waiting,
                busy: &busy,
                idle_adopted: &idle_adopted,
                cooling: &cooling,
                paused: &paused,
                granted: &granted,
                now,
            };
            let desired = self.policy.desired_counts(&capacity);
            let mut waits = waits;
            waits.extend(self.policy.changes_at(&capacity));
            // A waiting job's wait opening another provisioning model to it changes its
            // class: a pass must run then.
            if index.has_fallback {
                let fallback = &index.fleet.policy.fallback;
                waits.extend(
                    demand
                        .jobs
                        .iter()
                        .zip(&waiting)
                        .filter(|(_, w)| **w)
                        .filter_map(|(j, _)| j.job.models_at(fallback, now).1)
                        .min(),
                );
            }
            // Names asked for by a class with a waiting job (no need to visit every job).
            let mut class_waits = vec![false; demand.classes.len()];
            for (j, w) in demand.jobs.iter().zip(&waiting) {
                class_waits[j.class as usize] |= *w;
            }
            let named: NameSet = demand
                .classes
                .iter()
                .zip(&class_waits)
                .filter(|(_, w)| **w)
                .filter_map(|(c, _)| c.req.tpu_name.map(Name::new))
                .collect();
            // Applied in job-id order, so the lookups into a large queue walk it in order;
            // `usize` is the pair's place in the policy's order, which the output keeps.
            let mut by_job: Vec<(usize, usize, usize)> = pairs
                .into_iter()
                .enumerate()
                .map(|(pos, (j, t))| (j, t, pos))
                .collect();
            by_job.sort_unstable();
            let pairs: Vec<(Name, Name, usize)> = by_job
                .into_iter()
                .map(|(j, t, pos)| (demand.jobs[j].job.id, candidates[t].id, pos))
                .collect();
            (pairs, waits, desired, named)
        };
        for t in waits {
            self.wake_at(t);
        }
        self.desired = desired;
        self.named = named;
        let (first_event, first_launch) = (self.out.events.len(), self.new_launches.len());
        let mut event_pos = Vec::with_capacity(pairs.len());
        let mut launch_pos = Vec::with_capacity(pairs.len());
        for (job_id, resource_id, pos) in pairs {
            let (events, launches) = (self.out.events.len(), self.new_launches.len());
            self.assign_job(&job_id, &resource_id);
            event_pos.resize(event_pos.len() + self.out.events.len() - events, pos);
            launch_pos.resize(launch_pos.len() + self.new_launches.len() - launches, pos);
        }
        in_order_of(&mut self.out.events, first_event, &event_pos);
        in_order_of(&mut self.new_launches, first_launch, &launch_pos);
    }

    /// assign_job (§2.1): re-checks everything, pins the placement, creates the attempt.
    /// Per entry: its listed queued resources the cloud granted (provisioning or active)
    /// whose TPU runs no job and is not being deleted by this pass.
    fn granted_per_entry(&self) -> Vec<u32> {
        let mut granted = vec![0; self.index.fleet.tpus.len()];
        for (qr, facts) in self.obs.queued_resources.iter().zip(self.qr_facts) {
            let Some(e) = facts.entry else {
                continue;
            };
            let runs_a_job =
                (self.state.resources.get(&qr.node_id)).is_some_and(|r| r.owner.is_some());
            if matches!(qr.state, QrState::Provisioning | QrState::Active)
                && !runs_a_job
                && !self.deleted.contains(&qr.name)
            {
                granted[e as usize] += 1;
            }
        }
        granted
    }

    pub(super) fn assign_job(&mut self, job_id: &Name, resource_id: &Name) {
        let now = self.now;
        let policy = self.policy.name();
        // Both records at once (disjoint fields of the state): one lookup each.
        let State {
            jobs, resources, ..
        } = &mut *self.state;
        let (Some(job), Some(resource)) = (jobs.get_mut(job_id), resources.get_mut(resource_id))
        else {
            return;
        };
        let usable = job.status == JobStatus::Pending
            && resource.status == ResourceStatus::Idle
            && !resource.is_busy()
            && crate::engine::demand::Requirement::at(self.index, job, now)
                .accepts_tpu(self.index, resource);
        if !usable {
            self.out.violations.push(format!(
                "policy {policy} paired job {job_id} with unusable TPU {resource_id}"
            ));
            return;
        }
        let Some((region, _)) = resource.zone.rsplit_once('-') else {
            return;
        };
        let placement = match &job.placement {
            Some(p) => p.clone(),
            None => match job.bucket_regions.iter().find(|b| b.region == region) {
                Some(b) => Placement::new(region, &b.bucket),
                None => return,
            },
        };
        let attempt_id = names::attempt_id(
            job_id,
            resource_id,
            job.current_attempt.as_ref().map_or("", Name::as_str),
        );
        if let Err(e) = resource.occupy(job_id, &attempt_id) {
            self.out.violations.push(e.to_string());
            return;
        }
        if let Err(e) = job.transition(JobStatus::Running, now) {
            self.out.violations.push(e.to_string());
            return;
        }
        let priority = ["low", "normal", "high"][job.spec.priority.rank() as usize];
        let detail = format!(
            "tpu_name={}; region={}; bucket={}; priority={priority}",
            resource.tpu_name, placement.region, placement.bucket
        );
        job.placement = Some(placement);
        job.assigned_resource = Some(*resource_id);
        job.current_attempt = Some(attempt_id);
        job.not_before = None;
        job.attempts.push(Attempt::new(
            attempt_id,
            *resource_id,
            resource.tpu_name,
            resource.zone,
            now,
        ));
        // Launched at the end of the pass (the original's second attempt pass).
        self.new_launches
            .push(launch_request(job, resource, &attempt_id));
        self.event(
            "job_assigned",
            Some(job_id),
            Some(resource_id),
            Some(&attempt_id),
            detail,
        );
    }

    pub(super) fn launch_new_attempts(&mut self) {
        let launches = std::mem::take(&mut self.new_launches);
        self.out.actions.extend(launches);
    }
}

/// Reorders `items[start..]` by `pos` (one per item), keeping equal positions in order.
fn in_order_of<T>(items: &mut Vec<T>, start: usize, pos: &[usize]) {
    let tail = items.split_off(start);
    let mut tagged: Vec<(usize, T)> = pos.iter().copied().zip(tail).collect();
    tagged.sort_by_key(|(p, _)| *p);
    items.extend(tagged.into_iter().map(|(_, t)| t));
}
