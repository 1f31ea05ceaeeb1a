//! What the controller saw the cloud do between two listings of its inventory, as events:
//! a node or queued resource first seen, its state changed (with the cloud's reason for a
//! failed request), or gone. These are the capacity side of a captured trace (when requests
//! waited, were granted or failed, when nodes were preempted) and what `report` reads.
//! Pure: it compares two listings handed to it and reads no clock; the driver calls it once
//! per observation. It decides nothing.

use std::sync::Arc;

use rustc_hash::FxHashMap;

use super::in_step::{self, Step};
use super::observe::{Event, NodeInfo, QueuedResourceInfo};
use super::time::Timestamp;
use crate::spec::{Name, TpuType};

/// A node first seen or in a new state (`detail`: `zone= type= spot= [from=] to= health=`).
pub const NODE_STATE: &str = "node_state";
/// A node listed before and no longer (`detail`: `zone= type= spot= from=`).
pub const NODE_VANISHED: &str = "node_vanished";
/// A queued resource first seen or in a new state (`resource_id`: the node it provisions;
/// `detail`: `qr= zone= type= spot= [from=] to= [reason=]`, the reason last).
pub const QR_STATE: &str = "queued_resource_state";
/// A queued resource listed before and no longer (`detail`: `qr= zone= type= spot= from=`).
pub const QR_VANISHED: &str = "queued_resource_vanished";

/// The events that take the listing `before` to `after` at `now`: nodes first, then queued
/// resources, each in the order of `after` and then the vanished in the order of `before`.
/// Costs one pointer comparison per object when nothing changed (the backends hand back the
/// very object they listed before when it did not change), one hash lookup otherwise.
pub fn changes(
    before: (&[Arc<NodeInfo>], &[Arc<QueuedResourceInfo>]),
    after: (&[Arc<NodeInfo>], &[Arc<QueuedResourceInfo>]),
    now: Timestamp,
) -> Vec<Event> {
    let mut events = Vec::new();
    diff(before.0, after.0, |n| n.name, now, &mut events, node_event);
    diff(before.1, after.1, |q| q.name, now, &mut events, qr_event);
    events
}

/// Appends an event per object of `after` that is new or differs from its namesake in
/// `before` (`event(Some(old), new)` / `event(None, new)`), then one per vanished object
/// (`event(Some(old), None)`). The backends keep an unchanged object in place, the very
/// same one: walking both lists side by side pairs those off, and only what is left (the
/// changed, new and gone, plus whatever the walk lost sight of) is matched by name.
fn diff<T: PartialEq>(
    before: &[Arc<T>],
    after: &[Arc<T>],
    name: impl Fn(&T) -> Name,
    now: Timestamp,
    out: &mut Vec<Event>,
    event: fn(Option<&T>, Option<&T>, Timestamp) -> Option<Event>,
) {
    // The objects listed again in place pair off (see `in_step`); only the rest are matched
    // by name, each rest in its list's order.
    let (mut rest_after, mut rest_before) = (Vec::new(), Vec::new());
    in_step::walk(before, after, |step| match step {
        Step::Pairs(..) => {}
        Step::After(i) => rest_after.push(&after[i]),
        Step::Before(j) => rest_before.push(&before[j]),
    });
    if rest_after.is_empty() && rest_before.is_empty() {
        return;
    }
    // Both rests keep their list's order: the vanished are reported in the order of `before`.
    let mut old: FxHashMap<Name, &Arc<T>> = rest_before.iter().map(|b| (name(b), *b)).collect();
    for a in rest_after {
        match old.remove(&name(a)) {
            Some(b) if Arc::ptr_eq(b, a) || **b == **a => {}
            b => out.extend(event(b.map(|b| &**b), Some(a), now)),
        }
    }
    for b in rest_before {
        if old.remove(&name(b)).is_some() {
            out.extend(event(Some(b), None, now));
        }
    }
}

fn node_event(old: Option<&NodeInfo>, new: Option<&NodeInfo>, at: Timestamp) -> Option<Event> {
    let shown = new.or(old)?;
    // Labels, endpoints and the like change nothing a trace records.
    if let (Some(o), Some(n)) = (old, new)
        && n.state == o.state
        && n.health == o.health
    {
        return None;
    }
    let mut detail = Detail::head(
        None,
        shown.zone,
        &shown.tpu_type,
        shown.spot,
        shown.reserved,
    );
    if let Some(o) = old {
        detail.field("from", o.state.api_name());
    }
    if let Some(n) = new {
        detail.field("to", n.state.api_name());
        detail.field("health", n.health.api_name());
    }
    Some(event(
        if new.is_some() {
            NODE_STATE
        } else {
            NODE_VANISHED
        },
        shown.name,
        at,
        detail.0,
    ))
}

fn qr_event(
    old: Option<&QueuedResourceInfo>,
    new: Option<&QueuedResourceInfo>,
    at: Timestamp,
) -> Option<Event> {
    let shown = new.or(old)?;
    if let (Some(o), Some(n)) = (old, new)
        && n.state == o.state
        && n.failure == o.failure
    {
        return None;
    }
    let (zone, tpu_type) = (shown.zone, &shown.tpu_type);
    let mut detail = Detail::head(Some(shown.name), zone, tpu_type, shown.spot, shown.reserved);
    if let Some(o) = old {
        detail.field("from", o.state.api_name());
    }
    if let Some(n) = new {
        detail.field("to", n.state.api_name());
        if let Some(reason) = &n.failure {
            // Last, so that it may hold spaces.
            detail.field("reason", &reason.replace(['\n', '\r'], " "));
        }
    }
    Some(event(
        if new.is_some() { QR_STATE } else { QR_VANISHED },
        shown.node_id,
        at,
        detail.0,
    ))
}

/// A sighting's detail, `key=value` pairs separated by spaces, written piece by piece (a
/// long run writes one for most objects it sees change).
struct Detail(String);

impl Detail {
    /// `[qr=Q ]zone=Z type=T spot=B[ reserved=true]`.
    fn head(
        qr: Option<Name>,
        zone: Name,
        tpu_type: &TpuType,
        spot: bool,
        reserved: bool,
    ) -> Detail {
        let mut d = Detail(String::with_capacity(160));
        if let Some(q) = qr {
            d.0.push_str("qr=");
            d.0.push_str(q.as_str());
            d.0.push(' ');
        }
        d.0.push_str("zone=");
        d.0.push_str(zone.as_str());
        d.0.push_str(" type=");
        tpu_type.push_onto(&mut d.0);
        d.field("spot", if spot { "true" } else { "false" });
        if reserved {
            d.field("reserved", "true");
        }
        d
    }

    /// Appends ` key=value`.
    fn field(&mut self, key: &str, value: &str) {
        self.0.push(' ');
        self.0.push_str(key);
        self.0.push('=');
        self.0.push_str(value);
    }
}

fn event(kind: &str, resource: Name, at: Timestamp, detail: String) -> Event {
    Event {
        at,
        kind: kind.to_owned(),
        job_id: None,
        resource_id: Some(resource),
        attempt_id: None,
        detail,
    }
}

/// The `key=value` pairs of an event's detail written here (`reason` takes the rest).
pub fn fields(detail: &str) -> impl Iterator<Item = (&str, &str)> {
    let (head, reason) = match detail.find(" reason=") {
        Some(i) => (&detail[..i], Some(&detail[i + " reason=".len()..])),
        None => (detail, None),
    };
    head.split(' ')
        .filter_map(|pair| pair.split_once('='))
        .chain(reason.map(|r| ("reason", r)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::observe::{Health, NodeState, QrState};

    /// The names written into events are the API's, as serde reads and writes them.
    #[test]
    fn state_names_are_serdes() {
        fn check<T: serde::Serialize + serde::de::DeserializeOwned + Copy>(
            names: &[&str],
            api_name: fn(T) -> &'static str,
        ) {
            for &name in names {
                let value: T = serde_json::from_value(serde_json::Value::from(name)).unwrap();
                let written = serde_json::to_value(value).unwrap();
                assert_eq!((api_name(value), written.as_str()), (name, Some(name)));
            }
        }
        let node_states = [
            "CREATING",
            "READY",
            "RESTARTING",
            "REPAIRING",
            "STOPPING",
            "STARTING",
            "STOPPED",
            "PREEMPTED",
            "TERMINATED",
            "FAILED",
            "DELETING",
            "SUSPENDING",
            "SUSPENDED",
        ];
        check(&node_states, NodeState::api_name);
        let health = [
            "HEALTHY",
            "UNHEALTHY",
            "UNHEALTHY_MAINTENANCE",
            "UNHEALTHY_TENSORFLOW",
            "TIMEOUT",
        ];
        check(&health, Health::api_name);
        let qr_states = [
            "CREATING",
            "ACCEPTED",
            "WAITING_FOR_RESOURCES",
            "PROVISIONING",
            "ACTIVE",
            "FAILED",
            "DELETING",
            "SUSPENDING",
            "SUSPENDED",
            "EXPIRED",
        ];
        check(&qr_states, QrState::api_name);
    }

    fn node(name: &str, state: NodeState) -> Arc<NodeInfo> {
        Arc::new(NodeInfo {
            name: Name::new(name),
            zone: Name::new("us-central2-b"),
            tpu_type: TpuType::parse("v4-8").unwrap(),
            state,
            health: Health::Healthy,
            spot: true,
            reserved: false,
            labels: Default::default(),
            queued_resource: None,
            worker_count: 1,
            public_ip: false,
        })
    }

    fn qr(name: &str, state: QrState, failure: Option<&str>) -> Arc<QueuedResourceInfo> {
        Arc::new(QueuedResourceInfo {
            name: Name::new(name),
            zone: Name::new("us-central2-b"),
            node_id: Name::new(&format!("{name}-node")),
            tpu_type: TpuType::parse("v4-8").unwrap(),
            state,
            spot: true,
            reserved: false,
            labels: Default::default(),
            failure: failure.map(str::to_owned),
        })
    }

    fn lines(events: &[Event]) -> Vec<String> {
        events
            .iter()
            .map(|e| {
                format!(
                    "{} {} {} {}",
                    e.at.0,
                    e.kind,
                    e.resource_id.unwrap(),
                    e.detail
                )
            })
            .collect()
    }

    #[test]
    fn first_seen_changed_unchanged_and_gone() {
        let a = node("a", NodeState::Creating);
        let b = node("b", NodeState::Ready);
        let q = qr("q", QrState::WaitingForResources, None);
        let first = changes(
            (&[], &[]),
            (&[a.clone(), b.clone()], std::slice::from_ref(&q)),
            Timestamp(10),
        );
        assert_eq!(
            lines(&first),
            [
                "10 node_state a zone=us-central2-b type=v4-8 spot=true to=CREATING health=HEALTHY",
                "10 node_state b zone=us-central2-b type=v4-8 spot=true to=READY health=HEALTHY",
                "10 queued_resource_state q-node qr=q zone=us-central2-b type=v4-8 spot=true \
                 to=WAITING_FOR_RESOURCES",
            ]
        );
        // The very same objects: nothing.
        let before = [a.clone(), b.clone()];
        assert!(
            changes(
                (&before, std::slice::from_ref(&q)),
                (&before, std::slice::from_ref(&q)),
                Timestamp(20)
            )
            .is_empty()
        );
        // Equal copies (a backend that reads afresh): nothing either.
        let copies = [node("a", NodeState::Creating), node("b", NodeState::Ready)];
        assert!(
            changes(
                (&before, std::slice::from_ref(&q)),
                (&copies, std::slice::from_ref(&q)),
                Timestamp(20)
            )
            .is_empty()
        );
        // a ready, b preempted, then b gone and the request failed with a reason.
        let later = [node("a", NodeState::Ready), node("b", NodeState::Preempted)];
        let failed = qr("q", QrState::Failed, Some("no capacity\nin zone"));
        let second = changes(
            (&before, std::slice::from_ref(&q)),
            (&later, std::slice::from_ref(&failed)),
            Timestamp(30),
        );
        assert_eq!(
            lines(&second),
            [
                "30 node_state a zone=us-central2-b type=v4-8 spot=true from=CREATING to=READY \
                 health=HEALTHY",
                "30 node_state b zone=us-central2-b type=v4-8 spot=true from=READY to=PREEMPTED \
                 health=HEALTHY",
                "30 queued_resource_state q-node qr=q zone=us-central2-b type=v4-8 spot=true \
                 from=WAITING_FOR_RESOURCES to=FAILED reason=no capacity in zone",
            ]
        );
        let third = changes((&later, &[failed]), (&later[..1], &[]), Timestamp(40));
        assert_eq!(
            lines(&third),
            [
                "40 node_vanished b zone=us-central2-b type=v4-8 spot=true from=PREEMPTED",
                "40 queued_resource_vanished q-node qr=q zone=us-central2-b type=v4-8 spot=true \
                 from=FAILED",
            ]
        );
        let reason: Vec<_> = fields(&second[2].detail).collect();
        assert_eq!(reason.last(), Some(&("reason", "no capacity in zone")));
        assert!(reason.contains(&("from", "WAITING_FOR_RESOURCES")));
    }

    /// Every object of `before` by name, then `after` in order, then the vanished: the
    /// plain rule the walk of [`diff`] must agree with.
    fn by_name(before: &[Arc<NodeInfo>], after: &[Arc<NodeInfo>]) -> Vec<Event> {
        let mut out = Vec::new();
        let mut old: FxHashMap<Name, &Arc<NodeInfo>> = before.iter().map(|b| (b.name, b)).collect();
        for a in after {
            match old.remove(&a.name) {
                Some(b) if **b == **a => {}
                b => out.extend(node_event(b.map(|b| &**b), Some(a), Timestamp(1))),
            }
        }
        for b in before {
            if old.remove(&b.name).is_some() {
                out.extend(node_event(Some(b), None, Timestamp(1)));
            }
        }
        out
    }

    proptest::proptest! {
        /// A listing changed as a backend changes it (objects kept in place, some replaced
        /// by a copy or a changed copy, some gone, new ones anywhere, runs moved) gives the
        /// events the match by name gives.
        #[test]
        fn the_walk_agrees_with_the_match_by_name(
            n in 0usize..40,
            edits in proptest::collection::vec((0u8..6, 0usize..64), 0..12),
        ) {
            let states = [NodeState::Creating, NodeState::Ready, NodeState::Preempted];
            let before: Vec<Arc<NodeInfo>> = (0..n)
                .map(|i| node(&format!("n{i}"), states[i % 3]))
                .collect();
            let mut after = before.clone();
            for (k, (op, at)) in edits.into_iter().enumerate() {
                let at = if after.is_empty() { 0 } else { at % after.len() };
                match op {
                    0 if !after.is_empty() => { after.remove(at); }
                    1 => after.insert(at, node(&format!("new{k}"), NodeState::Creating)),
                    2 if !after.is_empty() => {
                        let name = after[at].name.to_string();
                        after[at] = node(&name, states[(k + 1) % 3]);
                    }
                    3 if !after.is_empty() => {
                        let (name, state) = (after[at].name.to_string(), after[at].state);
                        after[at] = node(&name, state);
                    }
                    4 if after.len() > 1 => {
                        let moved = after.remove(at);
                        after.insert((at * 7 + 3) % after.len(), moved);
                    }
                    _ => after.reverse(),
                }
            }
            let mut walked = Vec::new();
            diff(&before, &after, |n| n.name, Timestamp(1), &mut walked, node_event);
            proptest::prop_assert_eq!(lines(&walked), lines(&by_name(&before, &after)));
        }
    }
}
