//! The TPU API as `SimCloud` answers it: call latency, quota and injected faults, queued
//! resources and nodes created, deleted, read and listed (with each zone's change log), and
//! the hand-made changes of tests and the emulator's control routes (adopted nodes added,
//! stockouts, preemptions now). Decides nothing a scheduler would.

use std::collections::BTreeSet;

use ustr::Ustr;

use crate::model::{ApiConfig, CallKind, PoolModel};
use crate::rng::SimRng;

use super::{
    ApiCall, ApiError, Event, LabelFilter, Labels, Listing, Millis, Node, NodeState, NodeView, Qr,
    QrState, QrView, SimCloud, sample,
};

impl SimCloud {
    /// How long the `index`-th call of `kind` made by the pass that started at `pass_at`
    /// takes, in milliseconds: a pure function of the seed, the pass and the call (not a
    /// draw from a shared stream), so a run that skips idle passes sees the same latencies
    /// as one that runs them all.
    pub fn call_latency_ms(&self, kind: CallKind, pass_at: Millis, index: u32) -> Millis {
        let latency = match kind {
            CallKind::Read => self.config.api_latency.read,
            CallKind::Mutation => self.config.api_latency.mutation,
            CallKind::Remote => self.config.api_latency.remote,
        };
        if latency.median_secs <= 0.0 {
            return 0;
        }
        let call = pass_at
            .wrapping_mul(0x9e37_79b9_7f4a_7c15)
            .wrapping_add((u64::from(index) << 2) | kind as u64);
        let mut rng = SimRng::new(self.config.seed ^ call, "api_latency");
        (sample(&mut rng, latency).max(0.0) * 1000.0) as Millis
    }

    /// Takes one call from the read or mutation quota, refilled with simulated time; false
    /// when the bucket is empty (the call is refused and uses nothing).
    fn within_quota(&mut self, mutation: bool) -> bool {
        let quota = &self.config.api_quota;
        let per_minute = [quota.reads_per_minute, quota.mutations_per_minute];
        let elapsed_min = self.now.saturating_sub(self.quota_at) as f64 / 60_000.0;
        self.quota_at = self.now;
        for (tokens, rate) in self.quota_tokens.iter_mut().zip(per_minute) {
            *tokens = (*tokens + elapsed_min * rate).min(rate);
        }
        let k = usize::from(mutation);
        if per_minute[k] <= 0.0 {
            return true;
        }
        if self.quota_tokens[k] < 1.0 {
            return false;
        }
        self.quota_tokens[k] -= 1.0;
        true
    }

    fn api(&mut self, kind: ApiCall, mutation: bool) -> Result<bool, ApiError> {
        self.api_calls[kind as usize] += 1;
        let ApiConfig {
            rate_limited,
            unavailable,
            timeout,
            lost_reply,
        } = self.config.api;
        // The draw only picks the fault a call meets, and the stream is this function's alone:
        // with every fault probability 0 (fixed for the run) it is skipped.
        let u = if rate_limited + unavailable + timeout + lost_reply > 0.0 {
            self.rng_api.uniform()
        } else {
            1.0
        };
        if !self.within_quota(mutation) {
            *self
                .accounting
                .api_errors
                .entry("quota_exceeded")
                .or_default() += 1;
            return Err(ApiError::RateLimited);
        }
        if !self.faults_active(self.now) {
            return Ok(false);
        }
        let err = if u < rate_limited {
            Some(("rate_limited", ApiError::RateLimited, false))
        } else if u < rate_limited + unavailable {
            Some(("unavailable", ApiError::Unavailable, false))
        } else if u < rate_limited + unavailable + timeout {
            Some(("timeout", ApiError::Timeout, false))
        } else if mutation && u < rate_limited + unavailable + timeout + lost_reply {
            Some(("lost_reply", ApiError::Timeout, true))
        } else {
            None
        };
        match err {
            None => Ok(false),
            Some((name, _, true)) => {
                *self.accounting.api_errors.entry(name).or_default() += 1;
                Ok(true)
            }
            Some((name, e, false)) => {
                *self.accounting.api_errors.entry(name).or_default() += 1;
                Err(e)
            }
        }
    }

    /// Creates a queued resource for one node in the pool of `accelerator` and `model` in
    /// `zone` (a reserved one: in the reservation named `reservation`).
    #[allow(clippy::too_many_arguments)]
    pub fn create_queued_resource(
        &mut self,
        zone: Ustr,
        name: Ustr,
        node_id: Ustr,
        accelerator: &str,
        model: PoolModel,
        reservation: Option<&str>,
        labels: Labels,
    ) -> Result<(), ApiError> {
        let lost_reply = self.api(ApiCall::CreateQueuedResource, true)?;
        if self.qrs.contains_key(name) || self.nodes.contains_key(node_id) {
            return Err(ApiError::AlreadyExists);
        }
        let pool = self
            .pool_index
            .get(&zone)
            .and_then(|in_zone| {
                in_zone
                    .iter()
                    .find(|(a, p)| a == accelerator && self.config.pools[*p].model == model)
            })
            .map(|&(_, pool)| pool)
            .ok_or(ApiError::NoSuchPool)?;
        if model == PoolModel::Reserved
            && self.config.pools[pool].reservation.as_deref() != reservation
        {
            return Err(ApiError::NoSuchReservation);
        }
        self.serial += 1;
        let qr = Qr {
            serial: self.serial,
            name,
            zone,
            node_id,
            accelerator: accelerator.to_owned(),
            pool,
            model,
            reservation: reservation
                .filter(|_| model == PoolModel::Reserved)
                .map(Ustr::from),
            state: QrState::WaitingForResources,
            created_at: self.now,
            labels,
        };
        let serial = qr.serial;
        self.by_serial.insert(qr.serial, (true, name));
        self.qrs.insert(name, qr);
        let qrs = &self.qrs;
        self.waiting[pool].push(self.now, serial, name, |serial, name| {
            Self::still_waiting(qrs, serial, name)
        });
        self.version += 1;
        let faults = self.config.faults;
        self.schedule_fault(
            faults.qr_failure_per_hour,
            Event::QrFault {
                serial,
                vanish: false,
            },
        );
        self.schedule_fault(
            faults.qr_vanish_per_hour,
            Event::QrFault {
                serial,
                vanish: true,
            },
        );
        self.provision_waiting(pool);
        if lost_reply {
            Err(ApiError::Timeout)
        } else {
            Ok(())
        }
    }

    /// Deletes a queued resource and its node.
    pub fn delete_queued_resource(&mut self, zone: Ustr, name: Ustr) -> Result<(), ApiError> {
        let lost_reply = self.api(ApiCall::DeleteQueuedResource, true)?;
        let Some(qr) = self.qrs.get_mut(name).filter(|q| q.zone == zone) else {
            return Err(ApiError::NotFound);
        };
        if qr.state == QrState::Deleting {
            return if lost_reply {
                Err(ApiError::Timeout)
            } else {
                Ok(())
            };
        }
        qr.state = QrState::Deleting;
        let serial = qr.serial;
        let node_key = qr.node_id;
        if self
            .nodes
            .get(node_key)
            .is_some_and(|n| n.queued_resource == Some(name))
        {
            self.start_node_deletion(node_key);
        }
        self.version += 1;
        let done = self.now + (self.config.delete_secs * 1000.0) as u64;
        self.push(done, Event::DeletionDone { serial });
        if lost_reply {
            Err(ApiError::Timeout)
        } else {
            Ok(())
        }
    }

    fn start_node_deletion(&mut self, key: Ustr) {
        self.release_allocation(key);
        let Some(node) = self.nodes.get_mut(key) else {
            return;
        };
        if node.state == NodeState::Deleting {
            return;
        }
        self.set_node_state(key, NodeState::Deleting);
        self.touch_node_runs(key);
        let node = self.nodes.get_mut(key).expect("exists");
        let serial = node.serial;
        let run = node.run.take();
        if let Some(attempt) = run {
            self.kill_run(attempt);
        }
        let done = self.now + (self.config.delete_secs * 1000.0) as u64;
        self.push(done, Event::DeletionDone { serial });
        self.version += 1;
    }

    /// Deletes a node (its queued resource, if any, becomes SUSPENDING, then SUSPENDED).
    pub fn delete_node(&mut self, zone: Ustr, name: Ustr) -> Result<(), ApiError> {
        let lost_reply = self.api(ApiCall::DeleteNode, true)?;
        let Some(node) = self.nodes.get(name).filter(|n| n.zone == zone) else {
            return Err(ApiError::NotFound);
        };
        let qr = node.queued_resource;
        self.start_node_deletion(name);
        if let Some(qr) = qr
            && self
                .qrs
                .get(qr)
                .is_some_and(|q| matches!(q.state, QrState::Active | QrState::Provisioning))
        {
            self.suspend(qr);
        }
        let pool = self.nodes[name].pool;
        self.provision_waiting(pool);
        if lost_reply {
            Err(ApiError::Timeout)
        } else {
            Ok(())
        }
    }

    /// The calls of an inventory read that finds nothing changed, without listing: `zones`
    /// node listings, `adopted` node reads, then `zones` queued-resource listings, stopping
    /// at the first refusal as the reader does. For a controller pass the harness skips (it
    /// has nothing to do): its reads still count, use quota and may fail.
    pub fn idle_inventory_reads(&mut self, zones: usize, adopted: usize) -> Result<(), ApiError> {
        for _ in 0..zones {
            self.api(ApiCall::ListNodes, false)?;
        }
        for _ in 0..adopted {
            self.api(ApiCall::GetNode, false)?;
        }
        for _ in 0..zones {
            self.api(ApiCall::ListQueuedResources, false)?;
        }
        Ok(())
    }

    /// GET a node.
    pub fn get_node(&mut self, zone: Ustr, name: Ustr) -> Result<Option<NodeView<'_>>, ApiError> {
        self.api(ApiCall::GetNode, false)?;
        Ok(self
            .nodes
            .get(name)
            .filter(|n| n.zone == zone)
            .map(Node::view))
    }

    /// LIST the nodes of `zone` carrying label `key` = `value`, in name order (one call; the
    /// API's pages are not modelled). `known`: the version of an earlier listing of the zone
    /// the caller keeps (like an ETag); if no node of the zone changed since, the answer is
    /// `Unchanged` (the call still counts and can fail like any other).
    pub fn list_nodes<'a>(
        &'a mut self,
        zone: Ustr,
        label: (&'a str, &'a str),
        known: Option<u64>,
    ) -> Result<Listing<impl Iterator<Item = NodeView<'a>> + 'a>, ApiError> {
        self.api(ApiCall::ListNodes, false)?;
        let version = self.nodes.zone_version(zone);
        if known == Some(version) {
            return Ok(Listing::Unchanged);
        }
        let objects = self.peek_nodes(zone, label);
        Ok(Listing::Changed { version, objects })
    }

    /// What `list_nodes` lists in `zone`, without making a call (also for checks).
    pub fn peek_nodes<'a>(
        &'a self,
        zone: Ustr,
        label: (&'a str, &'a str),
    ) -> impl Iterator<Item = NodeView<'a>> + 'a {
        self.nodes_where(zone, label, true)
    }

    /// What `list_queued_resources` lists in `zone`, without making a call (also for checks).
    pub fn peek_queued_resources<'a>(
        &'a self,
        zone: Ustr,
        label: (&'a str, &'a str),
    ) -> impl Iterator<Item = QrView<'a>> + 'a {
        self.qrs_where(zone, label, true)
    }

    /// The nodes of `zone` that `list_nodes` with `label` leaves out (someone else's),
    /// without making a call.
    pub fn peek_other_nodes<'a>(
        &'a self,
        zone: Ustr,
        label: (&'a str, &'a str),
    ) -> impl Iterator<Item = NodeView<'a>> + 'a {
        self.nodes_where(zone, label, false)
    }

    /// The queued resources of `zone` that `list_queued_resources` with `label` leaves out,
    /// without making a call.
    pub fn peek_other_queued_resources<'a>(
        &'a self,
        zone: Ustr,
        label: (&'a str, &'a str),
    ) -> impl Iterator<Item = QrView<'a>> + 'a {
        self.qrs_where(zone, label, false)
    }

    /// The nodes of `zone` whose `label` is set as given (`labelled`), or not.
    fn nodes_where<'a>(
        &'a self,
        zone: Ustr,
        label: (&'a str, &'a str),
        labelled: bool,
    ) -> impl Iterator<Item = NodeView<'a>> + 'a {
        let mut filter = LabelFilter::new(label);
        self.nodes
            .in_zone(zone)
            .filter(move |(_, n)| filter.matches(&n.labels) == labelled)
            .map(|(_, n)| n.view())
    }

    /// The queued resources of `zone` whose `label` is set as given (`labelled`), or not.
    fn qrs_where<'a>(
        &'a self,
        zone: Ustr,
        label: (&'a str, &'a str),
        labelled: bool,
    ) -> impl Iterator<Item = QrView<'a>> + 'a {
        let mut filter = LabelFilter::new(label);
        self.qrs
            .in_zone(zone)
            .filter(move |(_, q)| filter.matches(&q.labels) == labelled)
            .map(|(_, q)| q.view())
    }

    /// The names of `zone`'s nodes changed since version `known` of its listing (an earlier
    /// `list_nodes` answer's), without making a call: a caller that keeps that listing may
    /// read just these (with `peek_node`) to bring it up to date. In order of change, possibly
    /// repeated; `None` when the cloud no longer knows (then list the zone whole).
    pub fn nodes_changed_since(
        &self,
        zone: Ustr,
        known: u64,
    ) -> Option<impl Iterator<Item = Ustr> + '_> {
        self.nodes.changed_since(zone, known)
    }

    /// The names of `zone`'s queued resources changed since version `known` of its listing
    /// (see `nodes_changed_since`).
    pub fn queued_resources_changed_since(
        &self,
        zone: Ustr,
        known: u64,
    ) -> Option<impl Iterator<Item = Ustr> + '_> {
        self.qrs.changed_since(zone, known)
    }

    /// What `get_node` would return, without making a call (for checks).
    pub fn peek_node(&self, zone: Ustr, name: Ustr) -> Option<NodeView<'_>> {
        self.nodes
            .get(name)
            .filter(|n| n.zone == zone)
            .map(Node::view)
    }

    /// Every node, in no particular order, without making a call (for the emulator's
    /// workers and for checks).
    pub fn all_nodes(&self) -> impl Iterator<Item = NodeView<'_>> + '_ {
        self.nodes.values().map(Node::view)
    }

    /// What `get_queued_resource` would return, without making a call.
    pub fn peek_queued_resource(&self, zone: Ustr, name: Ustr) -> Option<QrView<'_>> {
        self.qrs.get(name).filter(|q| q.zone == zone).map(Qr::view)
    }

    /// Adds a node that exists before the run (an adopted, on-demand TPU): READY, never
    /// preempted, outside every spot pool.
    pub fn add_existing_node(
        &mut self,
        zone: &str,
        name: &str,
        accelerator: &str,
        chips: u32,
        hosts: u32,
    ) {
        self.serial += 1;
        let (zone, key) = (Ustr::from(zone), Ustr::from(name));
        self.by_serial.insert(self.serial, (false, key));
        self.insert_node(
            key,
            Node {
                serial: self.serial,
                name: key,
                zone,
                accelerator: accelerator.to_owned(),
                pool: usize::MAX,
                state: NodeState::Ready,
                hosts,
                chips,
                labels: Labels::default(),
                queued_resource: None,
                active_since: Some(self.now),
                run: None,
                launched: Vec::new(),
                caches: BTreeSet::new(),
                spot: false,
                model: PoolModel::OnDemand,
                notice_at: None,
            },
        );
        self.version += 1;
    }

    /// GET a queued resource.
    pub fn get_queued_resource(
        &mut self,
        zone: Ustr,
        name: Ustr,
    ) -> Result<Option<QrView<'_>>, ApiError> {
        self.api(ApiCall::GetQueuedResource, false)?;
        Ok(self.qrs.get(name).filter(|q| q.zone == zone).map(Qr::view))
    }

    /// LIST the queued resources of `zone` carrying label `key` = `value`, in name order
    /// (`known` as for `list_nodes`).
    pub fn list_queued_resources<'a>(
        &'a mut self,
        zone: Ustr,
        label: (&'a str, &'a str),
        known: Option<u64>,
    ) -> Result<Listing<impl Iterator<Item = QrView<'a>> + 'a>, ApiError> {
        self.api(ApiCall::ListQueuedResources, false)?;
        let version = self.qrs.zone_version(zone);
        if known == Some(version) {
            return Ok(Listing::Unchanged);
        }
        let objects = self.peek_queued_resources(zone, label);
        Ok(Listing::Changed { version, objects })
    }

    /// The latency of the next call of `kind` made by the pass that started at `pass_at`
    /// (`call_latency_ms` numbering the pass's calls in order; a new `pass_at` starts again
    /// at 0). One numbering for every caller, so a pass made in process and one made over
    /// HTTP see the same latencies.
    pub fn take_call_latency_ms(&mut self, kind: CallKind, pass_at: Millis) -> Millis {
        if self.pass_calls.0 != pass_at {
            self.pass_calls = (pass_at, 0);
        }
        let index = self.pass_calls.1;
        self.pass_calls.1 += 1;
        self.call_latency_ms(kind, pass_at, index)
    }

    // ----- faults injected by hand (the emulator's control endpoints) -------------------

    /// Stocks out every pool of `zone` but its reservations (their capacity is held for
    /// the project) (`on`), or lifts it: a stocked-out pool offers no capacity, so its Spot
    /// TPUs beyond that are preempted (with notice) and its waiting requests wait. Returns
    /// the pools it applies to (0: no such zone).
    pub fn set_stockout(&mut self, zone: &str, on: bool) -> usize {
        let pools: Vec<usize> = (0..self.config.pools.len())
            .filter(|&p| {
                let pool = &self.config.pools[p];
                pool.zone == zone && pool.model != PoolModel::Reserved
            })
            .collect();
        for &pool in &pools {
            self.stocked_out[pool] = on;
            self.available[pool] = self.capacity_at(pool, self.now);
            self.enforce_capacity(pool);
            self.provision_waiting(pool);
        }
        self.version += 1;
        pools.len()
    }

    /// Whether node `name` of `zone` was given its preemption notice or is no longer up
    /// (what its metadata server's `instance/preempted` says: `None` when there is no node).
    pub fn preempted(&self, zone: Ustr, name: Ustr) -> Option<bool> {
        let node = self.nodes.get(name).filter(|n| n.zone == zone)?;
        Some(
            node.notice_at.is_some()
                || !matches!(node.state, NodeState::Creating | NodeState::Ready),
        )
    }

    /// Preempts the Spot node `name` of `zone` now (with the usual notice); false when there
    /// is no such READY Spot node.
    pub fn preempt_now(&mut self, zone: &str, name: &str) -> bool {
        let key = Ustr::from(name);
        let preemptible = self.nodes.get(key).is_some_and(|n| {
            n.zone == zone && n.spot && n.state == NodeState::Ready && n.notice_at.is_none()
        });
        if preemptible {
            *self
                .accounting
                .faults
                .entry("preempted_by_hand")
                .or_default() += 1;
            self.preempt(key);
            let pool = self.nodes.get(key).map_or(usize::MAX, |n| n.pool);
            self.provision_waiting(pool);
            self.version += 1;
        }
        preemptible
    }

    /// LIST every node of `zone`, whatever its labels, in name order (one call, as
    /// `list_nodes`).
    pub fn list_zone_nodes(
        &mut self,
        zone: &str,
    ) -> Result<impl Iterator<Item = NodeView<'_>> + '_, ApiError> {
        self.api(ApiCall::ListNodes, false)?;
        Ok(self.nodes.in_zone(Ustr::from(zone)).map(|(_, n)| n.view()))
    }

    /// LIST every queued resource of `zone`, whatever its labels, in name order.
    pub fn list_zone_queued_resources(
        &mut self,
        zone: &str,
    ) -> Result<impl Iterator<Item = QrView<'_>> + '_, ApiError> {
        self.api(ApiCall::ListQueuedResources, false)?;
        Ok(self.qrs.in_zone(Ustr::from(zone)).map(|(_, q)| q.view()))
    }
}
