//! The workers inside `SimCloud`: jobs' behaviour, launches, set-up, runs ending, failing,
//! dying with their TPU or cancelled, and the reports a controller reads; with the counts of
//! live runs and nodes the harness checks. Decides nothing a scheduler would.

use std::collections::{BTreeMap, BTreeSet};

use ustr::Ustr;

use crate::model::JobBehaviour;
use crate::rng::SimRng;

use super::{
    ApiCall, AttemptView, CancelResult, Event, JobProgress, NodeState, Outcome, QrState,
    RemoteError, Run, RunState, SimCloud, WorkerStatusView, sample,
};

impl SimCloud {
    /// The run dies with its TPU: no status, no heartbeat; progress since the last
    /// checkpoint is lost.
    pub(super) fn kill_run(&mut self, attempt: Ustr) {
        let now = self.now;
        self.touch_run(attempt);
        let Some(run) = self.runs.get_mut(&attempt) else {
            return;
        };
        if run.state == RunState::Ended || !run.alive {
            run.alive = false;
            return;
        }
        let was_running = run.state == RunState::Running;
        run.alive = false;
        let progress = (now.saturating_sub(run.run_start)) as f64 / 1000.0;
        let (job, chips, notice) = (run.job_id, run.chips, run.saved_at_notice);
        if was_running {
            self.account_interruption(job, progress, chips, notice);
        }
    }

    /// Busy time and saved/lost progress of an interrupted run (saved: the last periodic
    /// checkpoint, or the one written at a preemption notice if later).
    pub(super) fn account_interruption(
        &mut self,
        job: Ustr,
        progress_secs: f64,
        chips: u32,
        saved_at_notice: Option<f64>,
    ) {
        self.accounting.busy_chip_secs += progress_secs * chips as f64;
        if let Some(p) = self.jobs.get_mut(&job) {
            let ckpt = p.behaviour.checkpoint_secs;
            let periodic = if ckpt > 0.0 {
                (progress_secs / ckpt).floor() * ckpt
            } else {
                0.0
            };
            let saved = periodic.max(saved_at_notice.unwrap_or(0.0).min(progress_secs));
            let saved = saved
                .min(p.behaviour.work_secs - p.checkpointed_secs)
                .max(0.0);
            p.checkpointed_secs += saved;
            self.accounting.lost_chip_secs += (progress_secs - saved).max(0.0) * chips as f64;
        }
    }

    /// Registers how a job behaves (at its arrival).
    pub fn register_job(&mut self, job_id: &str, behaviour: JobBehaviour) {
        self.jobs.entry(Ustr::from(job_id)).or_insert(JobProgress {
            behaviour,
            checkpointed_secs: 0.0,
            attempts: 0,
        });
    }

    /// Starts `attempt` of `job_id` on every worker of the node (idempotent per attempt).
    pub fn launch(
        &mut self,
        zone: Ustr,
        node_name: Ustr,
        attempt: Ustr,
        job_id: Ustr,
    ) -> Result<(), RemoteError> {
        self.api_calls[ApiCall::Launch as usize] += 1;
        if self.runs.contains_key(&attempt) {
            return Ok(());
        }
        let Some(node) = self.nodes.get(node_name).filter(|n| n.zone == zone) else {
            return Err(RemoteError::NotFound);
        };
        if node.state != NodeState::Ready {
            return Err(if node.state == NodeState::Creating {
                RemoteError::Temporary
            } else {
                RemoteError::NotFound
            });
        }
        if let Some(other) = node.run {
            // The launch script stops whatever still runs there: an engine bug if it ever
            // happens to a live attempt (dead workers leave nothing to stop).
            if self
                .runs
                .get(&other)
                .is_some_and(|r| r.alive && r.state != RunState::Ended)
            {
                self.accounting.attempts_displaced += 1;
            }
            self.kill_run(other);
        }
        let cache = self
            .jobs
            .get(&job_id)
            .and_then(|j| j.behaviour.cache_key.clone());
        let node_slot = self.nodes.slot_of(node_name).expect("exists");
        let node = self.nodes.get_mut(node_name).expect("exists");
        let warm = cache.as_ref().is_some_and(|c| node.caches.contains(c));
        node.run = Some(attempt);
        node.launched.push(attempt);
        let (serial, hosts, chips) = (node.serial, node.hosts, node.chips);
        let latency = if warm {
            self.config.workers.setup_warm
        } else {
            self.config.workers.setup
        };
        let setup = sample(&mut self.rng_workers, latency).max(1.0);
        self.runs.insert(
            attempt,
            Run {
                job_id,
                node_serial: serial,
                node_key: node_name,
                node_slot,
                hosts,
                chips,
                state: RunState::Setup,
                run_start: self.now,
                outcome: Outcome::Success,
                alive: true,
                last_heartbeat: self.now,
                statuses: Vec::new(),
                saved_at_notice: None,
            },
        );
        self.touch_run(attempt);
        self.version += 1;
        self.push(
            self.now + (setup * 1000.0) as u64,
            Event::SetupDone { attempt },
        );
        Ok(())
    }

    pub(super) fn setup_done(&mut self, attempt: Ustr) {
        let now = self.now;
        let Some(run) = self.runs.get(&attempt) else {
            return;
        };
        if run.state != RunState::Setup || !run.alive {
            return;
        }
        let job_id = run.job_id;
        let workers = self.config.workers;
        let behaviour = self.jobs.get(&job_id).map(|j| j.behaviour.clone());
        let Some(behaviour) = behaviour else { return };
        let progress = self.jobs.get_mut(&job_id).expect("registered");
        progress.attempts += 1;
        let remaining = (behaviour.work_secs - progress.checkpointed_secs).max(0.0);
        // One draw per outcome from the job's own stream, so other jobs never shift it.
        let mut rng = SimRng::new(
            self.config.seed,
            &format!("job/{job_id}/{}", progress.attempts),
        );
        let faults_active = self.faults_active(now);
        self.touch_run(attempt);
        let run = self.runs.get_mut(&attempt).expect("exists");
        if rng.chance(behaviour.setup_failure) {
            run.outcome = Outcome::SetupFailure;
            run.state = RunState::Ended;
            run.statuses = vec![WorkerStatusView {
                host: Ustr::from("w0"),
                state: "failed_setup",
                exit_code: None,
                finished_at: now,
                infrastructure_failure: None,
            }];
            self.finish_run_on_node(attempt);
            return;
        }
        run.state = RunState::Running;
        run.run_start = now;
        let (outcome, duration) = if rng.chance(behaviour.app_failure) {
            (Outcome::AppFailure, remaining * rng.uniform())
        } else if rng.chance(behaviour.infra_failure) {
            (Outcome::InfraFailure, remaining * rng.uniform())
        } else if run.hosts > 1 && faults_active && rng.chance(workers.partial_failure) {
            (Outcome::PartialFailure, remaining * rng.uniform())
        } else {
            (Outcome::Success, remaining)
        };
        run.outcome = outcome;
        if outcome == Outcome::PartialFailure {
            *self.accounting.faults.entry("partial_failure").or_default() += 1;
        }
        self.version += 1;
        self.push(
            now + (duration.max(0.001) * 1000.0) as u64,
            Event::RunEnd { attempt },
        );
        if workers.silent_death_per_hour > 0.0 {
            let at = rng.exponential(3600.0 / workers.silent_death_per_hour);
            if at < duration && self.faults_active(now + (at * 1000.0) as u64) {
                self.push(now + (at * 1000.0) as u64, Event::SilentDeath { attempt });
            }
        }
    }

    fn finish_run_on_node(&mut self, attempt: Ustr) {
        if let Some(run) = self.runs.get(&attempt)
            && let Some(node) = self.nodes.get_mut(run.node_key)
            && node.run == Some(attempt)
        {
            node.run = None;
        }
        self.version += 1;
    }

    pub(super) fn run_end(&mut self, attempt: Ustr) {
        let now = self.now;
        let missing = self.config.workers.missing_status;
        let Some(run) = self.runs.get(&attempt).cloned() else {
            return;
        };
        if run.state != RunState::Running || !run.alive {
            return;
        }
        let duration = (now - run.run_start) as f64 / 1000.0;
        let hosts = run.hosts;
        // Kept with the run for the rest of the simulation: sized to the hosts, not grown.
        let mut statuses = Vec::with_capacity(hosts as usize);
        for h in 0..hosts {
            let host = Ustr::from(&format!("w{h}"));
            let (state, code, marker) = match run.outcome {
                Outcome::Success => ("succeeded", 0, None),
                Outcome::AppFailure => ("failed", if h == 0 { 1 } else { 143 }, None),
                Outcome::InfraFailure => {
                    if h == 0 {
                        ("failed", 134, Some("slice_failure_chip_driver_error"))
                    } else {
                        ("failed", 143, None)
                    }
                }
                Outcome::PartialFailure => {
                    if h == 0 {
                        ("failed", 1, None)
                    } else {
                        continue; // peers keep running until cancelled
                    }
                }
                Outcome::SetupFailure => ("failed_setup", 2, None),
            };
            if self.rng_workers.chance(missing) && self.faults_active(now) {
                *self.accounting.faults.entry("status_lost").or_default() += 1;
                continue;
            }
            statuses.push(WorkerStatusView {
                host,
                state,
                exit_code: Some(code),
                finished_at: now,
                infrastructure_failure: marker,
            });
        }
        match run.outcome {
            Outcome::Success => {
                self.accounting.busy_chip_secs += duration * run.chips as f64;
                if let Some(p) = self.jobs.get_mut(&run.job_id) {
                    p.checkpointed_secs = p.behaviour.work_secs;
                    if let Some(c) = p.behaviour.cache_key.clone()
                        && let Some(node) = self.nodes.get_mut(run.node_key)
                    {
                        node.caches.insert(c);
                    }
                }
            }
            _ => self.account_interruption(run.job_id, duration, run.chips, run.saved_at_notice),
        }
        let partial = run.outcome == Outcome::PartialFailure;
        self.touch_run(attempt);
        let r = self.runs.get_mut(&attempt).expect("exists");
        r.statuses = statuses;
        r.last_heartbeat = now;
        if partial {
            // One worker failed; the others keep running (and heartbeating) until cancelled.
            r.state = RunState::Running;
            r.run_start = now;
            self.version += 1;
        } else {
            r.state = RunState::Ended;
            r.alive = false;
            self.finish_run_on_node(attempt);
        }
    }

    /// Stops `attempt` on the node (every worker writes status 143).
    /// With a `notice` (the controller stops the run to start it again later), a job that
    /// checkpoints on notice saves its progress first, as at a Spot preemption notice.
    pub fn cancel(
        &mut self,
        zone: Ustr,
        node_name: Ustr,
        attempt: Ustr,
        notice: bool,
    ) -> Result<CancelResult, RemoteError> {
        self.api_calls[ApiCall::Cancel as usize] += 1;
        let Some(node) = self.nodes.get(node_name).filter(|n| n.zone == zone) else {
            return Err(RemoteError::NotFound);
        };
        if node.state != NodeState::Ready {
            return Err(RemoteError::Temporary);
        }
        match self.runs.get(&attempt) {
            None => {
                return Ok(if node.run.is_some() {
                    CancelResult::Mismatch
                } else {
                    CancelResult::NotRunning
                });
            }
            Some(run) if run.node_key != node_name => return Ok(CancelResult::Mismatch),
            Some(run) if run.state == RunState::Ended || !run.alive => {
                return Ok(CancelResult::NotRunning);
            }
            Some(_) => {}
        }
        let now = self.now;
        let run = self.runs.get(&attempt).cloned().expect("checked");
        if run.state == RunState::Running {
            let progress = (now - run.run_start) as f64 / 1000.0;
            let saves = notice
                && self
                    .jobs
                    .get(&run.job_id)
                    .is_some_and(|p| p.behaviour.checkpoint_on_notice);
            self.account_interruption(
                run.job_id,
                progress,
                run.chips,
                if saves {
                    Some(progress)
                } else {
                    run.saved_at_notice
                },
            );
        }
        self.touch_run(attempt);
        let r = self.runs.get_mut(&attempt).expect("checked");
        let have: BTreeSet<Ustr> = r.statuses.iter().map(|s| s.host).collect();
        for h in 0..r.hosts {
            let host = Ustr::from(&format!("w{h}"));
            if !have.contains(&host) {
                r.statuses.push(WorkerStatusView {
                    host,
                    state: "failed",
                    exit_code: Some(143),
                    finished_at: now,
                    infrastructure_failure: None,
                });
            }
        }
        r.state = RunState::Ended;
        r.alive = false;
        self.finish_run_on_node(attempt);
        Ok(CancelResult::Sent)
    }

    /// What the workers of `attempt` show now (`None` if it was never launched).
    pub fn attempt(&self, attempt: Ustr) -> Option<AttemptView> {
        let run = self.runs.get(&attempt)?;
        let node_alive = self
            .nodes
            .at(run.node_slot)
            .is_some_and(|n| n.serial == run.node_serial && n.state == NodeState::Ready);
        let beating = run.alive && node_alive;
        let heartbeat = if beating {
            self.now
        } else {
            run.last_heartbeat.max(run.run_start)
        };
        Some(AttemptView {
            launched: true,
            statuses: run.statuses.clone(),
            heartbeat_at: Some(heartbeat),
            beating,
        })
    }

    /// The attempts whose `attempt` view may have changed since the last call (a superset,
    /// in no particular order, repeats possible), other than the heartbeat of a beating run
    /// moving with time. A reader that keeps views between calls re-reads only these.
    pub fn take_report_changes(&mut self) -> Vec<Ustr> {
        std::mem::take(&mut self.report_changes)
    }

    pub(super) fn touch_run(&mut self, attempt: Ustr) {
        self.report_changes.push(attempt);
    }

    /// Marks every attempt launched on node `key` changed (the node is going away).
    pub(super) fn touch_node_runs(&mut self, key: Ustr) {
        if let Some(node) = self.nodes.get(key) {
            self.report_changes.extend(node.launched.iter().copied());
        }
    }

    /// Attempt ids running (alive) on each node, for invariant checks: (zone, node) → attempts.
    pub fn live_runs(&self) -> BTreeMap<String, Vec<String>> {
        let mut out: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for (id, run) in &self.runs {
            if run.alive && run.state != RunState::Ended {
                out.entry(run.node_key.to_string())
                    .or_default()
                    .push(id.to_string());
            }
        }
        for ids in out.values_mut() {
            ids.sort();
        }
        out
    }

    /// Node names of live capacity (nodes creating or ready, queued resources waiting,
    /// provisioning or active) grouped by the value of label `label`.
    pub fn live_capacity_by_label(&self, label: &str) -> BTreeMap<String, BTreeSet<String>> {
        let mut out: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        for n in self
            .nodes
            .values()
            .filter(|n| matches!(n.state, NodeState::Creating | NodeState::Ready))
        {
            if let Some(v) = n.labels.get(label) {
                out.entry(v.clone()).or_default().insert(n.name.to_string());
            }
        }
        for q in self.qrs.values().filter(|q| {
            matches!(
                q.state,
                QrState::WaitingForResources | QrState::Provisioning | QrState::Active
            )
        }) {
            if let Some(v) = q.labels.get(label) {
                out.entry(v.clone())
                    .or_default()
                    .insert(q.node_id.to_string());
            }
        }
        out
    }

    /// Live (Creating/Ready) nodes per pool, in pool order (existing nodes are in none).
    pub fn live_per_pool(&self) -> Vec<u32> {
        let mut out = vec![0; self.config.pools.len()];
        for n in self
            .nodes
            .values()
            .filter(|n| matches!(n.state, NodeState::Creating | NodeState::Ready))
        {
            if let Some(count) = out.get_mut(n.pool) {
                *count += 1;
            }
        }
        out
    }

    /// Live (Creating/Ready) nodes per accelerator type and zone: (zone, type) → count.
    pub fn live_nodes(&self) -> BTreeMap<(String, String), u32> {
        let mut out = BTreeMap::new();
        for n in self
            .nodes
            .values()
            .filter(|n| matches!(n.state, NodeState::Creating | NodeState::Ready))
        {
            *out.entry((n.zone.to_string(), n.accelerator.clone()))
                .or_default() += 1;
        }
        out
    }
}
