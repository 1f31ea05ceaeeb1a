//! Step 7 of a pass: recycles, and TPUs that can no longer serve (preempted, failed, in
//! maintenance, orphaned, past their idle time) released or deleted. Assigns nothing.

use super::Pass;
use crate::engine::observed::Tpu;
use crate::engine::state::{Resource, ResourceStatus};
use crate::spec::{Name, names};

impl<'a> Pass<'a> {
    // ----- step 7: recycles, unusable resources -----------------------------------------

    pub(super) fn recycles(&mut self) {
        let ids: Vec<Name> = self
            .state
            .resources
            .values()
            .filter(|r| {
                matches!(
                    r.status,
                    ResourceStatus::Recycling | ResourceStatus::RecyclingRequested
                )
            })
            .map(|r| r.id)
            .collect();
        for id in ids {
            let resource = self.state.resources[&id].clone();
            if !self.recyclable(&resource) {
                // The original left these `recycling` and repeated the rejection every pass.
                self.event(
                    "retryable_infrastructure_recycle_rejected",
                    None,
                    Some(&id),
                    None,
                    "not a declared managed Spot TPU".into(),
                );
                self.set_resource_status(&id, ResourceStatus::Unavailable);
                continue;
            }
            let reason = if resource
                .cancellation_failures
                .as_ref()
                .is_some_and(|c| c.count >= self.config.cancel_escalation)
            {
                "stuck_cancellation"
            } else {
                "repeated_retryable_infrastructure_failure"
            };
            // Deletions are re-requested until seen happening (a lost request is not a stuck one):
            // the queued resource if there is one, else the node.
            let first = resource.status == ResourceStatus::Recycling;
            let target = match (self.matching_qr(&resource), self.matching_node(&resource)) {
                (Some(qr), _) => Some((true, !qr.state.is_deleting(), qr.name, qr.zone)),
                (None, Some(node)) => {
                    Some((false, !node.state.is_terminal(), node.name, node.zone))
                }
                (None, None) => None,
            };
            if let Some((is_qr, deletable, name, zone)) = target {
                if deletable {
                    let (kind, detail) = if is_qr {
                        self.delete_qr(&name, &zone);
                        (
                            "retryable_infrastructure_recycle_requested",
                            format!("reason={reason}"),
                        )
                    } else {
                        self.delete_node(&name, &zone);
                        (
                            "retryable_infrastructure_tpu_recycle_requested",
                            format!("reason={reason}:queued_resource_absent"),
                        )
                    };
                    if first {
                        self.event(kind, None, Some(&id), None, detail);
                        self.set_resource_status(&id, ResourceStatus::RecyclingRequested);
                    }
                }
                continue;
            }
            let now = self.now;
            if let Some(r) = self.state.resources.get_mut(&id) {
                r.retryable_failures = None;
                r.cancellation_failures = None;
                let _ = r.release(ResourceStatus::Preempted, now);
            }
            self.event(
                "retryable_infrastructure_recycle_completed",
                None,
                Some(&id),
                None,
                String::new(),
            );
        }
    }

    pub(super) fn unusable_resources(&mut self) {
        // Handling one record never touches another record, so the healthy majority and the
        // long gone can be skipped up front without copying their ids; of those, only records
        // found with something to do last time, or changed since, are looked at.
        let ids: Vec<Name> = match self.memo.records.due(&self.state.resources, self.observed) {
            Some(mut ids) => {
                ids.retain(|id| !self.nothing_to_do(&self.state.resources[id]));
                ids
            }
            None => {
                let records = self.state.resources.iter();
                let busy = records.filter(|(_, r)| !self.nothing_to_do(r));
                busy.map(|(id, _)| *id).collect()
            }
        };
        self.memo.records.busy.clone_from(&ids);
        for id in ids {
            let resource = self.state.resources[&id].clone();
            if matches!(
                resource.status,
                ResourceStatus::Recycling | ResourceStatus::RecyclingRequested
            ) {
                continue;
            }
            // Records of removed entries, and ordinals above a lowered `count`, are drained.
            if self.index.owns_record(&resource).is_none()
                || (!resource.adopted && !self.index.is_declared(&resource))
            {
                self.orphaned_record(&resource);
                continue;
            }
            let qr = if resource.adopted {
                None
            } else {
                self.matching_qr(&resource)
            };
            // (a) a terminal QR ends the TPU, even if the node still looks ready.
            // Deleting and suspending requests count as terminal too: their TPU is going away.
            if let Some(qr) = qr
                && !qr.state.is_live()
            {
                if !resource.status.is_gone() || resource.owner.is_some() {
                    self.mark_preempted(&id);
                }
                continue;
            }
            let node = self
                .matching_node(&resource)
                .filter(|_| self.index.is_declared(&resource));
            // (b) healthy and in use: nothing to do.
            if let Some(n) = node
                && self.ready(n)
                && resource.status != ResourceStatus::Draining
            {
                if resource.provisioning_node_seen_at.is_some()
                    || resource.provisioning_node_missing_since.is_some()
                {
                    let r = self.state.resources.get_mut(&id).expect("exists");
                    r.provisioning_node_seen_at = None;
                    r.provisioning_node_missing_since = None;
                }
                continue;
            }
            if resource.adopted {
                // (c) adopted TPUs are never deleted.
                match node {
                    Some(n) if !n.state.is_terminal() => {
                        if resource.owner.is_none()
                            && resource.status != ResourceStatus::Unavailable
                        {
                            self.set_resource_status(&id, ResourceStatus::Unavailable);
                        }
                    }
                    _ => {
                        if resource.owner.is_some() {
                            self.mark_preempted(&id);
                        } else if resource.status != ResourceStatus::Unavailable {
                            self.set_resource_status(&id, ResourceStatus::Unavailable);
                        }
                    }
                }
                continue;
            }
            let live_qr = qr.filter(|q| q.state.is_live());
            match (node, live_qr) {
                // (d) no node yet (or any more), live QR.
                (None, Some(qr)) => {
                    if resource.owner.is_some() {
                        self.mark_preempted(&id);
                        continue;
                    }
                    if resource.status == ResourceStatus::Draining {
                        // Deletion was asked for; ask again until the request is seen deleting
                        // (a lost or refused delete must not leave it stuck here forever).
                        if !qr.state.is_deleting() {
                            self.delete_qr(&qr.name, &qr.zone);
                        }
                        continue;
                    }
                    // A provisioning request whose node was seen, or an ACTIVE request whose
                    // node is gone (it vanished: nothing will bring it back), is recycled after
                    // the grace. The original only handled the first and waited forever on
                    // the second.
                    let node_was_there = (qr.state
                        == crate::engine::observe::QrState::Provisioning
                        && resource.provisioning_node_seen_at.is_some())
                        || qr.state == crate::engine::observe::QrState::Active;
                    if node_was_there {
                        let since = resource.provisioning_node_missing_since.unwrap_or(self.now);
                        if self.now.elapsed_since(since, self.config.orphan_grace_secs) {
                            self.delete_qr(&qr.name, &qr.zone);
                            let r = self.state.resources.get_mut(&id).expect("exists");
                            let _ = r.set_status(ResourceStatus::Draining);
                            r.provisioning_node_seen_at = None;
                            r.provisioning_node_missing_since = None;
                            self.event(
                                "orphaned_provisioning_tpu_recycling",
                                None,
                                Some(&id),
                                None,
                                format!(
                                    "missing_since={since}; grace_seconds={}",
                                    self.config.orphan_grace_secs
                                ),
                            );
                            continue;
                        }
                        self.wake_at(since.plus_secs(self.config.orphan_grace_secs));
                        if resource.provisioning_node_missing_since != Some(since) {
                            self.state
                                .resources
                                .get_mut(&id)
                                .expect("exists")
                                .provisioning_node_missing_since = Some(since);
                        }
                    }
                    if self.state.resources[&id].status != ResourceStatus::Provisioning {
                        let r = self.state.resources.get_mut(&id).expect("exists");
                        let _ = r.release(ResourceStatus::Provisioning, self.now);
                        r.idle_since = None;
                    }
                }
                // (e) node present but not ready, live QR: wait for it.
                (Some(n), Some(_))
                    if !n.is_operational()
                        && !n.state.is_terminal()
                        && resource.owner.is_none() =>
                {
                    let now = self.now;
                    let r = &self.state.resources[&id];
                    let settled = matches!(
                        r.status,
                        ResourceStatus::Provisioning | ResourceStatus::Draining
                    ) && r.provisioning_node_seen_at.is_some()
                        && r.provisioning_node_missing_since.is_none();
                    if !settled {
                        let r = self.state.resources.get_mut(&id).expect("exists");
                        if r.status != ResourceStatus::Provisioning
                            && r.status != ResourceStatus::Draining
                        {
                            let _ = r.release(ResourceStatus::Provisioning, now);
                            r.idle_since = None;
                        }
                        r.provisioning_node_seen_at.get_or_insert(now);
                        r.provisioning_node_missing_since = None;
                    }
                }
                // (f) node present otherwise.
                (Some(n), live) => {
                    if n.state.is_terminal() && resource.owner.is_some() {
                        self.mark_preempted(&id);
                        continue;
                    }
                    let draining = resource.status == ResourceStatus::Draining;
                    if !draining
                        && n.state == crate::engine::observe::NodeState::Ready
                        && n.health == crate::engine::observe::Health::UnhealthyMaintenance
                    {
                        if resource.owner.is_none()
                            && resource.status != ResourceStatus::Unavailable
                        {
                            self.set_resource_status(&id, ResourceStatus::Unavailable);
                            self.event(
                                "spot_tpu_waiting_for_maintenance",
                                None,
                                Some(&id),
                                None,
                                String::new(),
                            );
                        }
                        continue;
                    }
                    if !draining
                        && !n.state.is_terminal()
                        && n.state != crate::engine::observe::NodeState::Ready
                    {
                        if resource.owner.is_none() {
                            self.set_resource_status(&id, ResourceStatus::Unavailable);
                        }
                        continue;
                    }
                    if n.state == crate::engine::observe::NodeState::Ready
                        && resource.owner.is_some()
                        && live.is_some()
                        && n.is_operational()
                    {
                        continue; // ready but wrong transport while owned: let the run finish
                    }
                    if n.state != crate::engine::observe::NodeState::Deleting {
                        self.delete_node(&n.name, &n.zone);
                    }
                    if !draining {
                        if resource.owner.is_some() {
                            self.mark_preempted(&id);
                        }
                        let r = self.state.resources.get_mut(&id).expect("exists");
                        if r.owner.is_none() {
                            let _ = r.set_status(ResourceStatus::Draining);
                        }
                        self.event(
                            "unusable_spot_tpu_deleting",
                            None,
                            Some(&id),
                            None,
                            format!("state={:?}; health={:?}", n.state, n.health),
                        );
                    }
                }
                // (g) nothing left.
                (None, None) => {
                    if resource.owner.is_some() {
                        self.mark_preempted(&id);
                    } else if !resource.status.is_gone() {
                        self.mark_preempted(&id);
                        self.event(
                            "idle_spot_tpu_missing",
                            None,
                            Some(&id),
                            None,
                            String::new(),
                        );
                    }
                }
            }
        }
    }

    /// The unusable-resource step has nothing to do for `r`, decided with one lookup and
    /// without copying the record: either a managed TPU that is gone, runs nothing and has
    /// neither node nor queued resource (case (g) with a gone record), or the common case: a
    /// declared TPU whose node is ready behind a live request, not draining, no timers set.
    pub(super) fn nothing_to_do(&self, r: &Resource) -> bool {
        let Some(tpu) = self.listed(r) else {
            return !r.adopted && r.owner.is_none() && r.status.is_gone();
        };
        !matches!(
            r.status,
            ResourceStatus::Recycling
                | ResourceStatus::RecyclingRequested
                | ResourceStatus::Draining
        ) && r.provisioning_node_seen_at.is_none()
            && r.provisioning_node_missing_since.is_none()
            && self
                .up_entry_of(r, tpu)
                .is_some_and(|e| self.index.declares(self.index.entry(e), r))
    }

    /// The entry of a ready `matching_node(r)` with, unless adopted, a live `matching_qr(r)`,
    /// found with one lookup: once the node is of the record's entry (ids are unique), the
    /// request matches when it is of the same entry.
    pub(super) fn up_entry(&self, r: &Resource) -> Option<usize> {
        self.up_entry_of(r, self.listed(r)?)
    }

    /// `up_entry(r)`, given what is listed under its TPU name.
    pub(super) fn up_entry_of(&self, r: &Resource, tpu: &Tpu) -> Option<usize> {
        let node = tpu.node.as_ref()?;
        let e = node.facts.entry?;
        let up = self.index.entry(e as usize).id == r.entry_id
            && self.ready(&node.info)
            && (r.adopted
                || tpu
                    .qr
                    .as_ref()
                    .is_some_and(|q| q.facts.entry == Some(e) && q.info.state.is_live()));
        up.then_some(e as usize)
    }

    /// A record whose entry was removed or changed (§9.1 #11: the original orphaned these).
    pub(super) fn orphaned_record(&mut self, resource: &Resource) {
        if resource.status.is_gone() && resource.owner.is_none() {
            return;
        }
        if resource.owner.is_some() {
            self.mark_preempted(&resource.id);
        }
        if resource.adopted {
            self.set_resource_status(&resource.id, ResourceStatus::Deleted);
            return;
        }
        let qr = self
            .observed
            .qr_named(&names::queued_resource_name(&resource.tpu_name))
            .map(|q| &*q.info);
        let node = self
            .listed(resource)
            .and_then(|t| t.node.as_ref())
            .map(|n| &*n.info);
        match (qr, node) {
            (Some(q), _) if !q.state.is_deleting() => self.delete_qr(&q.name, &q.zone),
            (None, Some(n)) if n.state != crate::engine::observe::NodeState::Deleting => {
                self.delete_node(&n.name, &n.zone)
            }
            (None, None) => {
                let now = self.now;
                if let Some(r) = self.state.resources.get_mut(&resource.id) {
                    let _ = r.release(ResourceStatus::Deleted, now);
                    r.idle_since = None;
                }
                return;
            }
            _ => {}
        }
        if resource.status != ResourceStatus::Draining {
            self.set_resource_status(&resource.id, ResourceStatus::Draining);
            self.event(
                "orphaned_entry_tpu_deleting",
                None,
                Some(&resource.id),
                None,
                if self.index.owns_record(resource).is_none() {
                    format!("entry={} no longer in the fleet", resource.entry_id)
                } else {
                    format!("entry={}: beyond its count", resource.entry_id)
                },
            );
        }
    }
}
