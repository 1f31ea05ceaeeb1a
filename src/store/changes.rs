//! What a pass changed: the records of a `State` that differ from what was loaded (the
//! `Base`), found from the state tables' change logs so the cost follows the changes, not
//! the size of the state. Shared by every store; must not do IO.

use std::collections::BTreeMap;

use super::{ControllerDocs, Delta, Loaded, Version, Versions};
use crate::engine::State;
use crate::engine::sorted_map::Revision;
use crate::engine::state::{InterruptionRequest, Job, Resource};
use crate::spec::Name;

/// What a load read: the versions of the records it returned and copies of the small
/// controller-only maps, so a commit can tell what changed and guard what it writes.
#[derive(Clone, Debug)]
pub struct Base {
    /// `state.jobs` at the load (or the last commit).
    pub(crate) jobs_at: Revision,
    /// `state.resources` at the load (or the last commit).
    pub(crate) resources_at: Revision,
    /// Versions of the jobs read.
    pub jobs: Versions,
    /// Versions of the resource records read.
    pub resources: Versions,
    /// Open interruption requests read, with their versions.
    pub requests: BTreeMap<Name, (Version, InterruptionRequest)>,
    /// Backoffs and notices read.
    pub controller: ControllerDocs,
    /// The store's change sequence at the load (or brought forward by a delta or by a
    /// commit no one else wrote before): what `StateStore::load_changes` reads after.
    pub cursor: u64,
}

impl Base {
    /// The base of a freshly loaded `state`.
    pub fn new(
        state: &State,
        jobs: Versions,
        resources: Versions,
        requests: BTreeMap<Name, Version>,
        cursor: u64,
    ) -> Base {
        Base {
            jobs_at: state.jobs.revision(),
            resources_at: state.resources.revision(),
            jobs,
            resources,
            requests: requests
                .into_iter()
                .filter_map(|(id, v)| {
                    Some((id, (v, state.interruption_requests.get(&id)?.clone())))
                })
                .collect(),
            controller: ControllerDocs::of(state),
            cursor,
        }
    }

    /// After a commit of `changes` that gave the written records `written` versions: the
    /// base of `state` as it is now.
    pub fn advance(&mut self, state: &State, changes: &ChangeSet<'_>, written: Written) {
        self.jobs_at = state.jobs.revision();
        self.resources_at = state.resources.revision();
        for (job, _) in &changes.jobs {
            if job.status.is_terminal() {
                self.jobs.remove(&job.id);
            }
        }
        for (id, v) in written.jobs {
            if state.jobs.contains_key(&id) {
                self.jobs.insert(id, v);
            }
        }
        self.resources.extend(written.resources);
        for (id, v) in written.requests {
            match state.interruption_requests.get(&id) {
                Some(r) if !is_closed(r) => {
                    self.requests.insert(id, (v, r.clone()));
                }
                _ => {
                    self.requests.remove(&id);
                }
            }
        }
        self.controller = ControllerDocs::of(state);
        if let Some(cursor) = written.cursor {
            self.cursor = cursor;
        }
    }
}

/// True when a request is done (deletion requested, failed, rejected): history, not loaded.
pub fn is_closed(r: &InterruptionRequest) -> bool {
    use crate::engine::state::InterruptionStatus::*;
    matches!(r.status, DeletionRequested | Failed | Rejected)
}

/// The versions a commit gave the records it wrote.
#[derive(Debug, Default)]
pub struct Written {
    /// Jobs.
    pub jobs: Vec<(Name, Version)>,
    /// Resource records.
    pub resources: Vec<(Name, Version)>,
    /// Interruption requests.
    pub requests: Vec<(Name, Version)>,
    /// The change sequence after the commit, when no one wrote between the base's cursor
    /// and it (the next delta need not read back what this commit wrote).
    pub cursor: Option<u64>,
}

/// The records a pass changed, each with the version it must still have in the store
/// (`None`: it must not exist yet).
#[derive(Debug, Default)]
pub struct ChangeSet<'s> {
    /// Jobs (with all their attempts), active or just finished.
    pub jobs: Vec<(&'s Job, Option<Version>)>,
    /// Resource records.
    pub resources: Vec<(&'s Resource, Option<Version>)>,
    /// Interruption requests.
    pub requests: Vec<(&'s InterruptionRequest, Option<Version>)>,
    /// Backoffs and notices, when either changed.
    pub controller: Option<ControllerDocs>,
}

impl<'s> ChangeSet<'s> {
    /// What `state` changed since `base`. Falls back to comparing every record with its
    /// version when a table's change log does not reach back to the base (then every record
    /// of that table is written: correct, only slower).
    pub fn between(base: &Base, state: &'s State) -> ChangeSet<'s> {
        let mut set = ChangeSet::default();
        let expected = |versions: &Versions, id: &Name| versions.get(id).cloned();
        match state.jobs.changes_since(base.jobs_at) {
            Some(changes) => {
                let mut ids = changes.touched;
                ids.sort_unstable();
                for id in ids {
                    if let Some(job) = state.jobs.get(&id) {
                        set.jobs.push((job, expected(&base.jobs, &id)));
                    }
                }
                let mut removed = changes.removed;
                removed.sort_unstable();
                removed.dedup();
                for id in removed {
                    if let Some(job) = state
                        .finished
                        .get(&id)
                        .filter(|_| !state.jobs.contains_key(&id))
                    {
                        set.jobs.push((job, expected(&base.jobs, &id)));
                    }
                }
            }
            None => {
                for job in state.jobs.values() {
                    set.jobs.push((job, expected(&base.jobs, &job.id)));
                }
                for job in state.finished.values() {
                    if base.jobs.contains_key(&job.id) && !state.jobs.contains_key(&job.id) {
                        set.jobs.push((job, expected(&base.jobs, &job.id)));
                    }
                }
            }
        }
        let resources: Vec<&Resource> = match state.resources.changes_since(base.resources_at) {
            Some(changes) => {
                let mut ids = changes.touched;
                ids.sort_unstable();
                ids.iter()
                    .filter_map(|id| state.resources.get(id))
                    .collect()
            }
            None => state.resources.values().collect(),
        };
        for r in resources {
            set.resources.push((r, expected(&base.resources, &r.id)));
        }
        for (id, request) in &state.interruption_requests {
            match base.requests.get(id) {
                Some((_, read)) if read == request => {}
                Some((v, _)) => set.requests.push((request, Some(v.clone()))),
                // Closed requests not read at the load are history already stored.
                None if is_closed(request) => {}
                None => set.requests.push((request, None)),
            }
        }
        if !base.controller.held_by(state) {
            set.controller = Some(ControllerDocs::of(state));
        }
        set
    }

    /// True when nothing changed.
    pub fn is_empty(&self) -> bool {
        self.jobs.is_empty()
            && self.resources.is_empty()
            && self.requests.is_empty()
            && self.controller.is_none()
    }

    /// How many records it writes.
    pub fn len(&self) -> usize {
        self.jobs.len()
            + self.resources.len()
            + self.requests.len()
            + usize::from(self.controller.is_some())
    }
}

/// Brings the active part of a long-lived controller's `state` to `fresh` (a new load),
/// touching only the records that differ, so what the engine keeps between passes stays
/// valid for the others. Jobs no longer active in the store leave `state.jobs` (their
/// history stays in the store); closed interruption requests kept in memory stay. Returns
/// the base for the next commit: `fresh_base` with revisions taken after the sync.
pub fn sync(state: &mut State, fresh: Loaded) -> Base {
    let Loaded {
        state: fresh,
        base: mut fresh_base,
    } = fresh;
    let gone: Vec<Name> = state
        .jobs
        .keys()
        .filter(|id| !fresh.jobs.contains_key(id))
        .copied()
        .collect();
    for id in gone {
        state.jobs.remove(&id);
    }
    for (id, job) in fresh.jobs.iter() {
        if state.jobs.get(id) != Some(job) {
            state.jobs.insert(*id, job.clone());
        }
        // A job active in the store is not history (a refused pass may have retired it).
        state.finished.remove(id);
    }
    for (id, r) in fresh.resources.iter() {
        if state.resources.get(id) != Some(r) {
            state.resources.insert(*id, r.clone());
        }
    }
    // Open requests the store no longer has open were closed elsewhere: drop them (kept,
    // each commit would try to create them again and conflict forever).
    state
        .interruption_requests
        .retain(|id, r| is_closed(r) || fresh.interruption_requests.contains_key(id));
    for (id, r) in fresh.interruption_requests {
        if state.interruption_requests.get(&id) != Some(&r) {
            state.interruption_requests.insert(id, r);
        }
    }
    ControllerDocs {
        backoff: fresh.entry_backoff,
        notices: fresh.notices,
        pools: fresh.pools,
        others: fresh.others,
    }
    .apply_to(state);
    fresh_base.jobs_at = state.jobs.revision();
    fresh_base.resources_at = state.resources.revision();
    fresh_base
}

/// Brings a long-lived controller's `state` and `base` forward by `delta` (what the store
/// was written since `base.cursor`), touching only what differs, as `sync` does for a whole
/// load. A record whose version is the one `base` holds is the controller's own write, seen
/// again: skipped. A job written finished leaves the active set; an interruption request
/// closed elsewhere is dropped. Costs the delta, not the state.
pub fn apply_delta(state: &mut State, base: &mut Base, delta: Delta) {
    for (job, version) in delta.jobs {
        let id = job.id;
        if base.jobs.get(&id) == Some(&version) {
            continue;
        }
        if job.status.is_terminal() {
            if state.jobs.contains_key(&id) {
                state.jobs.remove(&id);
            }
            base.jobs.remove(&id);
        } else {
            state.finished.remove(&id);
            if state.jobs.get(&id) != Some(&job) {
                state.jobs.insert(id, job);
            }
            base.jobs.insert(id, version);
        }
    }
    for (r, version) in delta.resources {
        if base.resources.get(&r.id) == Some(&version) {
            continue;
        }
        let id = r.id;
        if state.resources.get(&id) != Some(&r) {
            state.resources.insert(id, r);
        }
        base.resources.insert(id, version);
    }
    for (r, version) in delta.requests {
        if base.requests.get(&r.id).is_some_and(|(v, _)| *v == version) {
            continue;
        }
        if is_closed(&r) {
            // Closed elsewhere: an open copy in memory would be created again forever.
            if state
                .interruption_requests
                .get(&r.id)
                .is_some_and(|mine| !is_closed(mine))
            {
                state.interruption_requests.remove(&r.id);
            }
            base.requests.remove(&r.id);
        } else {
            base.requests.insert(r.id, (version, r.clone()));
            if state.interruption_requests.get(&r.id) != Some(&r) {
                state.interruption_requests.insert(r.id, r);
            }
        }
    }
    delta.controller.apply_to(state);
    base.controller = ControllerDocs::of(state);
    base.jobs_at = state.jobs.revision();
    base.resources_at = state.resources.revision();
    base.cursor = delta.cursor;
}

/// Brings `state` and `base` to what `store` holds now: what was written since the base's
/// cursor (`apply_delta`), or the whole active set (`sync`) when there is no base or the
/// store's sequence has not reached it. True when it read the whole active set. What a
/// controller does before each pass and a reader that follows the store before each read.
pub fn refresh(
    store: &mut dyn super::StateStore,
    state: &mut State,
    base: &mut Option<Base>,
) -> Result<bool, super::StoreError> {
    if let Some(b) = base.as_mut()
        && let Some(delta) = store.load_changes(b.cursor)?
    {
        apply_delta(state, b, delta);
        return Ok(false);
    }
    *base = Some(sync(state, store.load_active()?));
    Ok(true)
}

/// The active state kept in memory by a reader that follows the store between reads
/// (`watch`, the dashboard): the whole active set on the first read, then only what was
/// written since each read, as a controller reads between passes.
#[derive(Debug, Default)]
pub struct Mirror {
    state: State,
    base: Option<Base>,
}

impl Mirror {
    /// The active state as the store holds it now.
    pub fn refresh(
        &mut self,
        store: &mut dyn super::StateStore,
    ) -> Result<&State, super::StoreError> {
        refresh(store, &mut self.state, &mut self.base)?;
        Ok(&self.state)
    }
}
