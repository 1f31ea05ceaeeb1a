//! What the engine remembers from one pass to the next so that a step can skip the items
//! whose judgement cannot have changed: running attempts found still running, the TPU
//! records the unusable-resource step found with nothing to do, the assignment's inputs and
//! the fleet entries whose sizing decided nothing. An item is judged again as soon as
//! anything its judgement read may have changed: its job or record was accessed mutably (the
//! tables' change tracking), a node or queued resource under its TPU name was listed anew or
//! vanished (the observation index), its workers' final statuses differ, or a time it waits
//! for has come. A cache only: a pass with an empty memo leaves the same state and returns
//! the same actions, events and violations (the harness checks it on every step of every
//! chaos run); only its wake-up may come later, as a kept heartbeat deadline may be older
//! than the heartbeat. Also keeps what the records add to the inventory scope, always what a
//! sweep of every record finds (the harness reads afresh over the swept scope on every chaos
//! step). Must not hold anything that is not derived from the passes' inputs, and must never
//! be an input to a decision.

use std::collections::BTreeMap;

use super::demand::ClassEntries;
use super::fleet_index::{FleetIndex, ScopeAdd};
use super::observe::Observation;
use super::observed::ObservedIndex;
use super::sorted_map::{Changes, Revision, SortedMap};
use super::state::{Backoff, Job, JobStatus, Resource, ResourceStatus, State};
use super::time::Timestamp;
use crate::spec::{Name, NameMap, NameSet};

/// See the module doc.
#[derive(Debug, Default)]
pub(crate) struct Memo {
    /// The attempts step's last judgement.
    pub runs: RunsMemo,
    /// The unusable-resource step's last judgement.
    pub records: RecordsMemo,
    /// The assignment step's inputs.
    pub assign: AssignMemo,
    /// Compatible entries per requirement (they depend on the fleet only).
    pub classes: ClassEntries,
    /// The sizing step's inputs and per-entry outcome.
    pub sizing: SizingMemo,
    /// When the refresh steps last looked.
    pub refresh: RefreshMemo,
    /// What the records add to the inventory scope.
    pub scope: ScopeMemo,
}

/// What the records add to the fleet's own inventory scope (`FleetIndex::scope_add`), kept
/// up to date with the record table's changes instead of found by sweeping every record
/// before each pass.
#[derive(Debug, Default)]
pub(crate) struct ScopeMemo {
    seen: Option<Revision>,
    /// What each record adds.
    by_record: NameMap<ScopeAdd>,
    /// How many records add each.
    counts: BTreeMap<ScopeAdd, u32>,
}

impl ScopeMemo {
    /// What the records of `records` add, each once (looking only at the records accessed
    /// mutably or removed since the last call, or at all of them when that is unknown).
    /// `index` must be the same on every call (the engine's).
    pub fn adds(
        &mut self,
        records: &SortedMap<Resource>,
        index: &FleetIndex,
    ) -> impl Iterator<Item = ScopeAdd> + '_ {
        let changes = self.seen.and_then(|then| records.changes_since(then));
        self.seen = Some(records.revision());
        let now = |id: &Name| records.get(id).and_then(|r| index.scope_add(r));
        match changes {
            Some(changes) => {
                for id in changes.touched.iter().chain(&changes.removed) {
                    self.set(*id, now(id));
                }
            }
            None => {
                self.by_record.clear();
                self.counts.clear();
                for (id, r) in records.iter() {
                    self.set(*id, index.scope_add(r));
                }
            }
        }
        self.counts.keys().copied()
    }

    fn set(&mut self, id: Name, add: Option<ScopeAdd>) {
        if let Some(old) = self.by_record.remove(&id)
            && let Some(n) = self.counts.get_mut(&old)
        {
            *n -= 1;
            if *n == 0 {
                self.counts.remove(&old);
            }
        }
        if let Some(add) = add {
            self.by_record.insert(id, add);
            *self.counts.entry(add).or_default() += 1;
        }
    }
}

/// When the refresh steps (records brought up to date with the listed nodes and queued
/// resources) last looked, so that they look again only under the TPU names where something
/// changed: their judgement of a listed object reads only that object, its fleet entry and
/// its record (and the entries' backoffs, which the step checks apart), and writes only
/// that record, so an object listed as before whose record was not touched is left as the
/// last look left it.
#[derive(Debug, Default)]
pub(crate) struct RefreshMemo {
    seen: Option<Revision>,
    /// The names gathered by the last call (kept for its allocation only).
    gathered: NameSet,
}

impl RefreshMemo {
    /// The TPU names to look at, in text order: those the observation index found listed
    /// anew or gone, and those of records accessed mutably or removed since the last call;
    /// `None` (look at every listed object) when either is unknown.
    pub fn due(
        &mut self,
        records: &SortedMap<Resource>,
        observed: &ObservedIndex,
    ) -> Option<Vec<Name>> {
        let seen = self.seen.replace(records.revision());
        let changes = records.changes_since(seen?)?;
        let mut names = observed.changed()?.to_vec();
        for id in &changes.touched {
            names.push(*id);
            names.extend(records.get(id).map(|r| r.tpu_name));
        }
        for id in &changes.removed {
            names.push(*id);
            names.extend(Resource::tpu_name_in_id(id));
        }
        // Repeats dropped first (hashed on the interned name), so that only distinct names
        // are ordered by their text.
        self.gathered.clear();
        names.retain(|name| self.gathered.insert(*name));
        names.sort_unstable_by(|a, b| a.as_str().cmp(b.as_str()));
        Some(names)
    }
}

/// Running jobs the attempts step found still running, with what it read and when each
/// must be judged again; jobs it found needing work are judged again on the next pass.
#[derive(Debug, Default)]
pub(crate) struct RunsMemo {
    /// Revisions of the job and record tables, and the observation's serial, at the last
    /// sweep.
    seen: Option<(Revision, Revision, u64)>,
    quiet: NameMap<QuietRun>,
    /// Quiet runs by their record, and by their TPU name. (Hashed, and ordered by time
    /// only: ordering names compares their text, which a pass cannot afford per item.)
    by_record: NameMap<Name>,
    by_tpu: NameMap<Vec<Name>>,
    /// Quiet runs by attempt.
    by_attempt: NameMap<Name>,
    /// Quiet runs by the heartbeat deadline they were judged with.
    deadlines: BTreeMap<Timestamp, Vec<Name>>,
    /// Running jobs judged last time and not found quiet.
    pending: Vec<Name>,
    /// Whether the judgements of the last pass were remembered (then the memo holds every
    /// running job of its state, and the next pass may judge only what changed).
    remember: bool,
}

/// What a still-running judgement read beyond the job (untouched since) and the time.
#[derive(Debug)]
pub(crate) struct QuietRun {
    pub attempt: Name,
    /// The attempt's last sign of life when its report has no heartbeat.
    pub started: Timestamp,
    pub resource: Name,
    pub tpu_name: Name,
    /// The heartbeat deadline then, if the TPU looked up (else none: the attempt waits for
    /// its TPU's fate, decided elsewhere).
    pub deadline: Option<Timestamp>,
}

impl RunsMemo {
    /// The running jobs to judge this pass, in id order: those judged last time and not found
    /// quiet (if still running), and quiet ones whose job, record, listing or report changed
    /// or whose heartbeat deadline came (taken out of the memo). `None`: judge every running
    /// job (first pass, another state, another observation sequence, or an index rebuilt),
    /// with an emptied memo.
    pub fn due(
        &mut self,
        jobs: &SortedMap<Job>,
        records: &SortedMap<Resource>,
        observed: &ObservedIndex,
        obs: &Observation,
        heartbeat_timeout_secs: i64,
        now: Timestamp,
    ) -> Option<Vec<Name>> {
        let seen = self
            .seen
            .replace((jobs.revision(), records.revision(), obs.serial));
        let tables = seen.and_then(|(j, r, _)| table_changes(jobs, records, (j, r)));
        let reports = seen
            .and_then(|(_, _, serial)| obs.report_changes.as_ref().filter(|c| c.since == serial));
        // Judging everything: remember what it finds only if the state goes on from the last
        // pass's (a one-off pass on a fresh copy pays nothing for a memo it cannot use).
        let remember = tables.is_some();
        let (Some((job_changes, record_changes)), Some(names), Some(reports), true) =
            (tables, observed.changed(), reports, self.remember)
        else {
            *self = RunsMemo {
                seen: self.seen,
                remember,
                ..RunsMemo::default()
            };
            return None;
        };
        self.remember = true;
        let mut ids: NameSet = self.pending.drain(..).collect();
        ids.extend(job_changes.touched);
        ids.extend(job_changes.removed);
        ids.extend(
            reports
                .attempts
                .iter()
                .filter_map(|a| self.by_attempt.get(a)),
        );
        for r in record_changes.touched.iter().chain(&record_changes.removed) {
            ids.extend(self.by_record.get(r));
        }
        for name in names {
            ids.extend(self.by_tpu.get(name).into_iter().flatten());
        }
        // Deadlines are kept as judged: a report not listed as changed has the same heartbeat
        // or a later one, so a kept deadline is never later than the run's true one, and a
        // run whose kept deadline came is judged again (usually to find it beating on).
        while let Some(entry) = self.deadlines.first_entry()
            && *entry.key() <= now
        {
            ids.extend(entry.remove());
        }
        for id in &ids {
            self.forget(id);
        }
        self.refresh_deadlines(obs, heartbeat_timeout_secs, now);
        let ids = jobs
            .in_key_order(ids)
            .into_iter()
            .filter(|(_, j)| j.status == JobStatus::Running)
            .map(|(id, _)| *id)
            .collect();
        Some(ids)
    }

    /// Brings the kept deadlines due within half a heartbeat timeout up to date with the
    /// reports (a beating run's heartbeat moves on every read): a kept deadline only wakes a
    /// pass early, and refreshing ahead keeps those early passes to about one per half
    /// timeout whatever the number of runs, for a report lookup per run and half timeout.
    fn refresh_deadlines(&mut self, obs: &Observation, timeout_secs: i64, now: Timestamp) {
        let horizon = now.plus_secs(timeout_secs / 2);
        let near: Vec<Timestamp> = self
            .deadlines
            .range(..=horizon)
            .map(|(at, _)| *at)
            .collect();
        for at in near {
            let jobs = self.deadlines.remove(&at).expect("listed");
            for job in jobs {
                let q = self.quiet.get_mut(&job).expect("kept");
                let heartbeat = obs
                    .attempts
                    .get(&q.attempt)
                    .and_then(|r| obs.heartbeat(r))
                    .unwrap_or(q.started);
                let deadline = heartbeat.plus_secs(timeout_secs);
                q.deadline = Some(deadline);
                self.deadlines.entry(deadline).or_default().push(job);
            }
        }
    }

    fn forget(&mut self, job: &Name) {
        let Some(q) = self.quiet.remove(job) else {
            return;
        };
        self.by_record.remove(&q.resource);
        self.by_attempt.remove(&q.attempt);
        if let Some(jobs) = self.by_tpu.get_mut(&q.tpu_name) {
            jobs.retain(|j| j != job);
            if jobs.is_empty() {
                self.by_tpu.remove(&q.tpu_name);
            }
        }
        if let Some(at) = q.deadline
            && let Some(jobs) = self.deadlines.get_mut(&at)
        {
            jobs.retain(|j| j != job);
            if jobs.is_empty() {
                self.deadlines.remove(&at);
            }
        }
    }

    /// Remembers a job found still running.
    pub fn quiet(&mut self, job: Name, run: QuietRun) {
        if !self.remember {
            return;
        }
        self.by_record.insert(run.resource, job);
        self.by_attempt.insert(run.attempt, job);
        self.by_tpu.entry(run.tpu_name).or_default().push(job);
        if let Some(at) = run.deadline {
            self.deadlines.entry(at).or_default().push(job);
        }
        self.quiet.insert(job, run);
    }

    /// Remembers a running job found needing work (judged again next pass).
    pub fn pending(&mut self, job: Name) {
        if !self.remember {
            return;
        }
        self.pending.push(job);
    }

    /// The earliest heartbeat deadline kept for the quiet runs: a pass must look at them by
    /// then (their heartbeats may have moved on since, which only makes the wake-up early).
    pub fn next_deadline(&self) -> Option<Timestamp> {
        self.deadlines.first_key_value().map(|(at, _)| *at)
    }
}

/// Records the unusable-resource step found something to do for (all others had nothing to
/// do), with the record table's revision of that sweep.
#[derive(Debug, Default)]
pub(crate) struct RecordsMemo {
    seen: Option<Revision>,
    pub busy: Vec<Name>,
    /// Adopted records by TPU name (their ids, `adopted-<name>`, differ from their names).
    adopted: NameMap<Name>,
}

impl RecordsMemo {
    /// The records to judge, in key order: those found busy last time, those accessed
    /// mutably or removed since, and those listed under a TPU name that changed; `None`
    /// (judge every record) when the last sweep is unknown.
    pub fn due(
        &mut self,
        records: &SortedMap<Resource>,
        observed: &ObservedIndex,
    ) -> Option<Vec<Name>> {
        let seen = self.seen.replace(records.revision());
        let changes =
            seen.and_then(|then| Some((records.changes_since(then)?, observed.changed()?)));
        let Some((changes, names)) = changes else {
            self.adopted = records
                .values()
                .filter(|r| r.adopted)
                .map(|r| (r.tpu_name, r.id))
                .collect();
            return None;
        };
        for id in &changes.removed {
            self.adopted.retain(|_, r| r != id);
        }
        for id in &changes.touched {
            if let Some(r) = records.get(id).filter(|r| r.adopted) {
                self.adopted.insert(r.tpu_name, r.id);
            }
        }
        let mut ids: NameSet = self.busy.drain(..).collect();
        ids.extend(changes.touched);
        for name in names {
            ids.insert(*name);
            ids.extend(self.adopted.get(name));
        }
        let ids = records.in_key_order(ids).into_iter().map(|(id, _)| *id);
        Some(ids.collect())
    }
}

/// The assignment step's inputs, kept up to date with the tables' changes instead of found
/// by sweeping them: pending jobs, idle declared unowned records, and busy records per
/// entry.
#[derive(Debug, Default)]
pub(crate) struct AssignMemo {
    seen: Option<(Revision, Revision)>,
    pending: NameSet,
    idle: NameSet,
    /// Busy records owned by each entry, and the entry each busy record was counted for.
    busy: Vec<u32>,
    busy_in: NameMap<usize>,
    /// The sets are kept for the state `seen` belongs to.
    built: bool,
}

impl AssignMemo {
    /// Brings the inputs up to date (all of them afresh on the second pass over a state);
    /// false when they are not kept for this state (its first pass): the caller sweeps.
    pub fn update(
        &mut self,
        jobs: &SortedMap<Job>,
        records: &SortedMap<Resource>,
        index: &FleetIndex,
    ) -> bool {
        let seen = self.seen.replace((jobs.revision(), records.revision()));
        let changes = seen.and_then(|then| table_changes(jobs, records, then));
        let Some((job_changes, record_changes)) = changes else {
            // Another state: swept this pass; the memo is built if the next goes on from it.
            self.built = false;
            return false;
        };
        if !self.built {
            *self = AssignMemo {
                seen: self.seen,
                busy: vec![0; index.fleet.tpus.len()],
                built: true,
                ..AssignMemo::default()
            };
            for id in jobs.keys() {
                self.job_changed(*id, jobs);
            }
            for id in records.keys() {
                self.record_changed(*id, records, index);
            }
            return true;
        }
        for id in job_changes.touched.into_iter().chain(job_changes.removed) {
            self.job_changed(id, jobs);
        }
        let records_changed = record_changes.touched.into_iter();
        for id in records_changed.chain(record_changes.removed) {
            self.record_changed(id, records, index);
        }
        true
    }

    fn job_changed(&mut self, id: Name, jobs: &SortedMap<Job>) {
        if jobs.get(&id).is_some_and(is_pending) {
            self.pending.insert(id);
        } else {
            self.pending.remove(&id);
        }
    }

    fn record_changed(&mut self, id: Name, records: &SortedMap<Resource>, index: &FleetIndex) {
        let r = records.get(&id);
        if r.is_some_and(|r| is_candidate(r, index)) {
            self.idle.insert(id);
        } else {
            self.idle.remove(&id);
        }
        if let Some(e) = self.busy_in.remove(&id) {
            self.busy[e] -= 1;
        }
        if let Some(e) = r.filter(|r| r.is_busy()).and_then(|r| index.owns_record(r)) {
            self.busy[e] += 1;
            self.busy_in.insert(id, e);
        }
    }

    /// Pending jobs, in key order.
    pub fn pending<'j>(&self, jobs: &'j SortedMap<Job>) -> Vec<&'j Job> {
        jobs.in_key_order(self.pending.iter().copied())
            .into_iter()
            .map(|(_, j)| j)
            .collect()
    }

    /// Idle, declared, unowned records, in key order.
    pub fn idle<'r>(&self, records: &'r SortedMap<Resource>) -> Vec<&'r Resource> {
        records
            .in_key_order(self.idle.iter().copied())
            .into_iter()
            .map(|(_, r)| r)
            .collect()
    }

    /// Busy records per entry (fleet order).
    pub fn busy(&self) -> &[u32] {
        &self.busy
    }
}

/// What the sizing step read on its last pass, and per entry whether it acted and when it
/// asked to be woken: an entry is sized again when anything it reads may have changed (the
/// policy's count for it, the names pending jobs ask for, its backoff, a record or listed
/// object under a name it reads, a deletion this pass), when it acted last time, when it
/// wanted more TPUs than it held last time (it then read its quota key's free chips, which
/// any TPU of the key, the fleet's or not, changes), or when its wake-up came; the others only
/// repeat their wake-up. An entry that wanted nothing never read the free chips, and wants
/// nothing again while its own inputs stay the same.
#[derive(Debug, Default)]
pub(crate) struct SizingMemo {
    /// The record table's revision when the last sizing began (so the sizing's own changes
    /// count as changes for the next).
    seen: Option<Revision>,
    /// Whether the last sizing was remembered: every entry's outcome is kept.
    remember: bool,
    desired: Vec<u32>,
    named: NameSet,
    backoff: BTreeMap<Name, Backoff>,
    /// Per entry: whether its last sizing acted (an action or an event), and the earliest
    /// wake-up it asked for.
    acted: Vec<bool>,
    wake: Vec<Option<Timestamp>>,
    /// Per entry: whether its last sizing wanted more TPUs than it holds (and so read its
    /// quota key's free chips, which other entries and foreign TPUs change).
    wanted: Vec<bool>,
}

/// What the sizing step reads besides the observation's objects.
pub(crate) struct SizingInputs<'p> {
    pub index: &'p FleetIndex,
    pub state: &'p State,
    pub observed: &'p ObservedIndex,
    pub desired: &'p [u32],
    pub named: &'p NameSet,
    /// Names deleted earlier in the pass.
    pub deleted: &'p NameSet,
    pub now: Timestamp,
}

impl SizingMemo {
    /// Which entries to size this pass (fleet order): all of them when the last sizing is
    /// unknown (first pass, another state or an index rebuilt).
    pub fn due(&mut self, input: &SizingInputs<'_>) -> Vec<bool> {
        let SizingInputs {
            index,
            state,
            observed,
            desired,
            named,
            deleted,
            now,
        } = *input;
        let records = &state.resources;
        let n = index.fleet.tpus.len();
        let seen = self.seen.replace(records.revision());
        let changes = seen.and_then(|then| records.changes_since(then));
        let remember = changes.is_some();
        let known = self.remember && self.acted.len() == n;
        let mut due = vec![true; n];
        if let (Some(changes), Some(names), true) = (changes, observed.changed(), known) {
            let count = |d: &[u32], e: usize| d.get(e).copied().unwrap_or(0);
            for (e, due) in due.iter_mut().enumerate() {
                *due = self.acted[e]
                    || self.wanted[e]
                    || self.wake[e].is_some_and(|w| w <= now)
                    || count(desired, e) != count(&self.desired, e);
            }
            let mut mark = |e: u32| due[e as usize] = true;
            for name in named.symmetric_difference(&self.named) {
                index
                    .declared(name)
                    .map(|d| d.entry)
                    .into_iter()
                    .for_each(&mut mark);
            }
            for name in changes.touched.iter().chain(&changes.removed) {
                reading_record(name, index, observed).for_each(&mut mark);
            }
            for name in deleted {
                reading_deleted(name, index, observed).for_each(&mut mark);
            }
            // A node new or gone is read by the entry of a queued resource for it.
            for name in names {
                let qr = observed.tpu(name).and_then(|t| t.qr.as_ref());
                qr.and_then(|q| q.facts.labelled)
                    .into_iter()
                    .for_each(&mut mark);
            }
            observed
                .changed_entries()
                .iter()
                .copied()
                .for_each(&mut mark);
            let backoff_changed = state
                .entry_backoff
                .iter()
                .filter(|(id, b)| self.backoff.get(*id) != Some(*b))
                .map(|(id, _)| id)
                .chain(
                    self.backoff
                        .keys()
                        .filter(|id| !state.entry_backoff.contains_key(*id)),
                );
            for id in backoff_changed {
                index
                    .entry_index(id)
                    .into_iter()
                    .for_each(|e| mark(e as u32));
            }
        } else {
            self.acted = vec![false; n];
            self.wake = vec![None; n];
            self.wanted = vec![false; n];
        }
        self.remember = remember;
        if remember {
            self.desired.clear();
            self.desired.extend_from_slice(desired);
            self.named.clone_from(named);
            self.backoff.clone_from(&state.entry_backoff);
        }
        due
    }

    /// Records the outcome of sizing entry `e`.
    pub fn sized(&mut self, e: usize, acted: bool, wake: Option<Timestamp>, wanted: bool) {
        if self.remember {
            self.acted[e] = acted;
            self.wake[e] = wake;
            self.wanted[e] = wanted;
        }
    }

    /// The wake-up entry `e` asked for when it was last sized.
    pub fn kept_wake(&self, e: usize) -> Option<Timestamp> {
        self.wake.get(e).copied().flatten()
    }
}

/// The entries whose sizing reads the record under TPU name `name`: the entry declaring it,
/// and those the node or queued resource listed under it is labelled for.
fn reading_record<'i>(
    name: &Name,
    index: &FleetIndex,
    observed: &'i ObservedIndex,
) -> impl Iterator<Item = u32> + 'i {
    let tpu = observed.tpu(name);
    let labelled = tpu.into_iter().flat_map(|t| {
        let node = t.node.as_ref().and_then(|l| l.facts.labelled);
        node.into_iter()
            .chain(t.qr.as_ref().and_then(|l| l.facts.labelled))
    });
    index
        .declared(name)
        .map(|d| d.entry)
        .into_iter()
        .chain(labelled)
}

/// The entries whose sizing reads whether TPU or queued-resource name `name` was deleted:
/// the entry declaring it (as a node or an own queued resource's name), and the one the
/// queued resource of that name is labelled for.
fn reading_deleted(
    name: &Name,
    index: &FleetIndex,
    observed: &ObservedIndex,
) -> impl Iterator<Item = u32> {
    let declared = [index.declared(name), index.declared_qr(name)];
    let labelled = observed.qr_named(name).and_then(|l| l.facts.labelled);
    declared
        .into_iter()
        .flatten()
        .map(|d| d.entry)
        .chain(labelled)
}

/// What changed in the job and record tables since revisions `then` (`None`: unknown).
fn table_changes(
    jobs: &SortedMap<Job>,
    records: &SortedMap<Resource>,
    (jobs_then, records_then): (Revision, Revision),
) -> Option<(Changes, Changes)> {
    Some((
        jobs.changes_since(jobs_then)?,
        records.changes_since(records_then)?,
    ))
}

/// A job the assignment considers.
pub(crate) fn is_pending(job: &Job) -> bool {
    job.status == JobStatus::Pending
}

/// A record the assignment may give a job: idle, unowned, declared.
pub(crate) fn is_candidate(r: &Resource, index: &FleetIndex) -> bool {
    r.status == ResourceStatus::Idle && !r.is_busy() && index.is_declared(r)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::synthetic;

    #[derive(Clone, Debug)]
    enum Op {
        /// A record for ordinal `.1` of entry `.0`, in the given status.
        Insert(usize, usize, ResourceStatus),
        /// The `n`th record moved to a zone no entry lists, or back to its entry's.
        Move(usize, bool),
        Adopt(usize, bool),
        SetStatus(usize, ResourceStatus),
        Remove(usize),
        /// Every record reached mutably and adopted or not (readers from before must look
        /// at everything).
        AdoptAll(bool),
        /// The table kept aside, or the one kept aside taken back (another map, whose
        /// records may differ: the memo starts again).
        Swap,
        /// The memo asked for the scope (edits between two looks land together).
        Look,
    }

    fn status() -> impl proptest::strategy::Strategy<Value = ResourceStatus> {
        proptest::sample::select(vec![
            ResourceStatus::Provisioning,
            ResourceStatus::Idle,
            ResourceStatus::Busy,
            ResourceStatus::Preempted,
            ResourceStatus::Deleted,
        ])
    }

    fn op() -> impl proptest::strategy::Strategy<Value = Op> {
        use proptest::prelude::*;
        prop_oneof![
            4 => (0..6usize, 0..3usize, status()).prop_map(|(e, o, s)| Op::Insert(e, o, s)),
            2 => (0..20usize, any::<bool>()).prop_map(|(n, b)| Op::Move(n, b)),
            2 => (0..20usize, any::<bool>()).prop_map(|(n, b)| Op::Adopt(n, b)),
            2 => (0..20usize, status()).prop_map(|(n, s)| Op::SetStatus(n, s)),
            2 => (0..20usize).prop_map(Op::Remove),
            1 => any::<bool>().prop_map(Op::AdoptAll),
            1 => Just(Op::Swap),
            4 => Just(Op::Look),
        ]
    }

    proptest::proptest! {
        /// The scope the memo keeps is, after any run of record edits, the scope a sweep of
        /// every record finds.
        #[test]
        fn kept_scope_is_the_swept_scope(ops in proptest::collection::vec(op(), 1..60)) {
            let index = FleetIndex::new(synthetic::fleet(6, 3));
            let mut records: SortedMap<Resource> = SortedMap::new();
            let mut aside: SortedMap<Resource> = SortedMap::new();
            let mut memo = ScopeMemo::default();
            let nth = |records: &SortedMap<Resource>, n: usize| {
                (!records.is_empty()).then(|| *records.keys().nth(n % records.len()).unwrap())
            };
            for op in ops {
                match op {
                    Op::Insert(e, o, s) => {
                        let entry = &index.fleet.tpus[e];
                        let name = index.ordinals[e][o];
                        records.insert(name, Resource::new(name, entry, s, 1));
                    }
                    Op::Move(n, away) => {
                        if let Some(id) = nth(&records, n) {
                            let r = records.get_mut(&id).unwrap();
                            r.zone = if away {
                                Name::new("mars-north1-a")
                            } else {
                                index.entry(index.entry_index(&r.entry_id).unwrap()).zone
                            };
                        }
                    }
                    Op::Adopt(n, adopted) => {
                        if let Some(id) = nth(&records, n) {
                            records.get_mut(&id).unwrap().adopted = adopted;
                        }
                    }
                    Op::SetStatus(n, s) => {
                        if let Some(id) = nth(&records, n) {
                            records.get_mut(&id).unwrap().status = s;
                        }
                    }
                    Op::Remove(n) => {
                        if let Some(id) = nth(&records, n) {
                            records.remove(&id);
                        }
                    }
                    Op::AdoptAll(adopted) => records.values_mut().for_each(|r| r.adopted = adopted),
                    Op::Swap => std::mem::swap(&mut records, &mut aside),
                    Op::Look => {
                        let kept: Vec<ScopeAdd> = memo.adds(&records, &index).collect();
                        let state = State { resources: records.clone(), ..State::default() };
                        let swept = index.inventory_scope(&state);
                        proptest::prop_assert_eq!(index.scope_with(kept), swept);
                    }
                }
            }
        }
    }
}
