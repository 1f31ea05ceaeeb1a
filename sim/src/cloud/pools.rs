//! The pools' capacity and the nodes' lifecycle inside `SimCloud`: slices in use, capacity
//! enforced (Spot reclaim, preemption with notice, suspension), waiting requests granted and
//! provisioned. Answers no API call itself.

use std::collections::BTreeSet;

use ustr::Ustr;

use crate::model::PoolModel;
use crate::zoned::ZonedTable;

use super::{
    Event, Node, NodeState, Qr, QrState, RunState, SimCloud, is_live, price_key, region_of, sample,
};

impl SimCloud {
    /// The nodes of `pool` (found through its zone's index), by name.
    fn pool_nodes(&self, pool: usize) -> impl Iterator<Item = (Ustr, &Node)> {
        self.nodes
            .in_zone(self.pool_zones[pool])
            .filter(move |(_, n)| n.pool == pool)
    }

    fn in_use(&self, pool: usize) -> u32 {
        debug_assert_eq!(
            self.live[pool],
            self.pool_nodes(pool)
                .filter(|(_, n)| is_live(n.state))
                .count() as u32,
            "pool {pool}'s live-node count"
        );
        self.live[pool]
    }

    /// Adds `node` (keeping its pool's live count).
    pub(super) fn insert_node(&mut self, key: Ustr, node: Node) {
        if is_live(node.state)
            && let Some(live) = self.live.get_mut(node.pool)
        {
            *live += 1;
        }
        self.remove_node(key);
        self.nodes.insert(key, node);
    }

    /// Moves node `key` to `state` (keeping its pool's live count).
    pub(super) fn set_node_state(&mut self, key: Ustr, state: NodeState) {
        let Some(node) = self.nodes.get_mut(key) else {
            return;
        };
        let (was, pool) = (is_live(node.state), node.pool);
        node.state = state;
        if let Some(live) = self.live.get_mut(pool) {
            match (was, is_live(state)) {
                (true, false) => *live -= 1,
                (false, true) => *live += 1,
                _ => {}
            }
        }
    }

    /// Removes node `key` (keeping its pool's live count).
    pub(super) fn remove_node(&mut self, key: Ustr) -> Option<Node> {
        let node = self.nodes.remove(key)?;
        if is_live(node.state)
            && let Some(live) = self.live.get_mut(node.pool)
        {
            *live -= 1;
        }
        Some(node)
    }

    /// Preempt the newest nodes while more are in use than available (nodes already under
    /// notice are on their way out and count as gone), unless the pool never reclaims.
    pub(super) fn enforce_capacity(&mut self, pool: usize) {
        if !self.config.pools[pool].reclaims {
            return;
        }
        let available = self.available[pool];
        let leaving = self
            .pool_nodes(pool)
            .filter(|(_, n)| {
                n.notice_at.is_some() && matches!(n.state, NodeState::Creating | NodeState::Ready)
            })
            .count() as u32;
        let mut in_use = self.in_use(pool) - leaving;
        if in_use <= available {
            return;
        }
        let mut victims: Vec<(u64, Ustr)> = self
            .pool_nodes(pool)
            .filter(|(_, n)| {
                n.notice_at.is_none() && matches!(n.state, NodeState::Creating | NodeState::Ready)
            })
            .map(|(k, n)| (n.serial, k))
            .collect();
        victims.sort_by_key(|v| std::cmp::Reverse(v.0));
        for (_, key) in victims {
            if in_use <= available {
                break;
            }
            self.preempt(key);
            in_use -= 1;
        }
    }

    pub(super) fn release_allocation(&mut self, key: Ustr) {
        let now = self.now;
        if let Some(node) = self.nodes.get_mut(key)
            && let Some(since) = node.active_since.take()
            && node.model != PoolModel::Reserved
        {
            let secs = (now - since) as f64 / 1000.0 * node.chips as f64;
            self.accounting.allocated_chip_secs += secs;
            *self
                .accounting
                .allocated_chip_secs_by_type
                .entry(price_key(node))
                .or_default() += secs;
        }
    }

    /// A Spot preemption: the notice now, the TPU gone `preemption_notice_secs` later. A job
    /// that checkpoints on notice saves its progress at the notice.
    pub(super) fn preempt(&mut self, key: Ustr) {
        let notice_ms = (self.config.preemption_notice_secs * 1000.0) as u64;
        let now = self.now;
        let Some(node) = self.nodes.get_mut(key) else {
            return;
        };
        if notice_ms == 0 || node.state == NodeState::Creating {
            self.reclaim(key);
            return;
        }
        if node.notice_at.is_some() {
            return;
        }
        node.notice_at = Some(now);
        let (serial, run) = (node.serial, node.run);
        if let Some(attempt) = run
            && let Some(r) = self.runs.get_mut(&attempt)
            && r.alive
            && r.state == RunState::Running
            && self
                .jobs
                .get(&r.job_id)
                .is_some_and(|p| p.behaviour.checkpoint_on_notice)
        {
            r.saved_at_notice = Some(now.saturating_sub(r.run_start) as f64 / 1000.0);
        }
        self.push(now + notice_ms, Event::NoticeEnd { serial });
    }

    /// The TPU goes away now: PREEMPTED, its request suspended, its run killed.
    pub(super) fn reclaim(&mut self, key: Ustr) {
        self.release_allocation(key);
        self.touch_node_runs(key);
        self.set_node_state(key, NodeState::Preempted);
        let Some(node) = self.nodes.get_mut(key) else {
            return;
        };
        let run = node.run.take();
        let qr = node.queued_resource;
        self.accounting.preemptions += 1;
        self.version += 1;
        if let Some(qr) = qr
            && self.qrs.get(qr).is_some_and(|q| {
                !matches!(
                    q.state,
                    QrState::Deleting | QrState::Suspending | QrState::Suspended
                )
            })
        {
            self.suspend(qr);
        }
        if let Some(attempt) = run {
            self.kill_run(attempt);
        }
    }

    /// The queued resource `key` lost its node: SUSPENDING now, SUSPENDED `delete_secs`
    /// later (unless it is deleted first).
    pub(super) fn suspend(&mut self, key: Ustr) {
        let Some(q) = self.qrs.get_mut(key) else {
            return;
        };
        q.state = QrState::Suspending;
        let serial = q.serial;
        let done = self.now + (self.config.delete_secs * 1000.0) as u64;
        self.push(done, Event::SuspensionDone { serial });
    }

    /// Whether incarnation `serial` of queued resource `name` still waits for resources.
    pub(super) fn still_waiting(qrs: &ZonedTable<Qr>, serial: u64, name: Ustr) -> bool {
        qrs.get(name)
            .is_some_and(|q| q.serial == serial && q.state == QrState::WaitingForResources)
    }

    /// Starts provisioning the oldest waiting requests of `pool` while it has capacity.
    /// Grants waiting requests while the pool has room, then logs its level.
    pub(super) fn provision_waiting(&mut self, pool: usize) {
        if pool >= self.available.len() {
            return;
        }
        let mut in_use = self.in_use(pool);
        while in_use < self.available[pool] {
            let qrs = &self.qrs;
            let next =
                self.waiting[pool].pop_live(|serial, name| Self::still_waiting(qrs, serial, name));
            let Some((_, key)) = next else { break };
            self.start_provisioning(key);
            in_use += 1;
        }
        self.log_level(pool);
    }

    /// Logs the slices `pool` can hold now if they changed: what is available, or, where a
    /// drop does not reclaim, at least what is still held (the bound credits those).
    pub(super) fn log_level(&mut self, pool: usize) {
        let mut level = self.available[pool];
        if !self.config.pools[pool].reclaims {
            level = level.max(self.in_use(pool));
        }
        if self.logged[pool] != Some(level) {
            self.logged[pool] = Some(level);
            self.capacity_log.push((self.now, pool, level));
        }
    }

    fn start_provisioning(&mut self, key: Ustr) {
        let region = region_of(&self.qrs[key].zone).to_owned();
        let latency = *self
            .config
            .provisioning_by_region
            .get(&region)
            .unwrap_or(&self.config.provisioning);
        let secs = sample(&mut self.rng_provisioning, latency).max(1.0);
        let pool = self.qrs[key].pool;
        let (chips, hosts) = (self.config.pools[pool].chips, self.config.pools[pool].hosts);
        let qr = self.qrs.get_mut(key).expect("exists");
        qr.state = QrState::Provisioning;
        let serial = qr.serial;
        let node_key = qr.node_id;
        let node = Node {
            serial: self.serial + 1,
            name: qr.node_id,
            zone: qr.zone,
            accelerator: qr.accelerator.clone(),
            pool,
            state: NodeState::Creating,
            hosts,
            chips,
            labels: qr.labels.clone(),
            queued_resource: Some(qr.name),
            active_since: None,
            run: None,
            launched: Vec::new(),
            caches: BTreeSet::new(),
            spot: self.config.pools[pool].model == PoolModel::Spot,
            model: self.config.pools[pool].model,
            notice_at: None,
        };
        self.serial += 1;
        self.by_serial.insert(node.serial, (false, node_key));
        self.insert_node(node_key, node);
        self.version += 1;
        self.push(
            self.now + (secs * 1000.0) as u64,
            Event::Provisioned { serial },
        );
    }

    pub(super) fn provisioned(&mut self, qr_serial: u64) {
        let Some((true, key)) = self.by_serial.get(&qr_serial).cloned() else {
            return;
        };
        let Some(qr) = self.qrs.get_mut(key) else {
            return;
        };
        if qr.state != QrState::Provisioning {
            return;
        }
        qr.state = QrState::Active;
        let created = qr.created_at;
        let node_key = qr.node_id;
        self.accounting
            .time_to_capacity_secs
            .push((self.now - created) as f64 / 1000.0);
        let rate = self
            .nodes
            .get(node_key)
            .and_then(|n| self.config.pools.get(n.pool))
            .map_or(0.0, |p| p.preemption_per_hour);
        if self
            .nodes
            .get(node_key)
            .is_some_and(|n| n.state == NodeState::Creating)
        {
            self.set_node_state(node_key, NodeState::Ready);
            let node = self.nodes.get_mut(node_key).expect("exists");
            node.active_since = Some(self.now);
            let serial = node.serial;
            if rate > 0.0 {
                let life = self.rng_preemption.exponential(3600.0 / rate);
                self.push(self.now + (life * 1000.0) as u64, Event::Preempt { serial });
            }
            let vanish = self.config.faults.node_vanish_per_hour;
            self.schedule_fault(vanish, Event::NodeVanish { serial });
        }
        self.version += 1;
    }
}
