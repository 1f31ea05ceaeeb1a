//! `WaitingQueue`: one capacity pool's queued resources waiting for resources, oldest first
//! (creation time, then serial), with O(log n) pushes and pops so a backlog of 100k requests
//! in one pool costs the simulator O(n log n), not O(n²). It does not track state changes:
//! an entry whose request has left the waiting state is dropped when it surfaces (the caller
//! says which are live) or when the queue is compacted, so it must never be trusted without
//! that check.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use ustr::Ustr;

use crate::cloud::Millis;

/// A waiting request: (created at, serial, name), ordered oldest first.
type Entry = (Millis, u64, Ustr);

/// The smallest queue that is ever compacted (below it dead entries cost nothing worth
/// sweeping).
const COMPACT_FLOOR: usize = 64;

#[derive(Debug, Default)]
pub(crate) struct WaitingQueue {
    heap: BinaryHeap<Reverse<Entry>>,
    /// The length at which the next push compacts: twice the live entries found by the last
    /// compaction, so a sweep costs O(1) per push amortised and the queue never holds more
    /// than twice the entries live at the last sweep (or `COMPACT_FLOOR`), whatever the
    /// number of requests ever made.
    compact_at: usize,
}

impl WaitingQueue {
    /// Adds request `name` (incarnation `serial`) created at `created_at`; `live` says which
    /// entries still wait, for a compaction.
    pub(crate) fn push(
        &mut self,
        created_at: Millis,
        serial: u64,
        name: Ustr,
        live: impl Fn(u64, Ustr) -> bool,
    ) {
        if self.heap.len() >= self.compact_at.max(COMPACT_FLOOR) {
            self.heap.retain(|Reverse((_, s, n))| live(*s, *n));
            self.compact_at = 2 * self.heap.len();
        }
        self.heap.push(Reverse((created_at, serial, name)));
    }

    /// The oldest live request (its serial and name), removed from the queue; dead entries
    /// above it are dropped on the way.
    pub(crate) fn pop_live(&mut self, live: impl Fn(u64, Ustr) -> bool) -> Option<(u64, Ustr)> {
        while let Some(Reverse((_, serial, name))) = self.heap.pop() {
            if live(serial, name) {
                return Some((serial, name));
            }
        }
        None
    }

    /// Entries held, dead ones included.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.heap.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;

    #[test]
    fn pops_oldest_live_first_by_time_then_serial() {
        let mut q = WaitingQueue::default();
        let all = |_: u64, _: Ustr| true;
        q.push(5, 3, Ustr::from("c"), all);
        q.push(5, 2, Ustr::from("b"), all);
        q.push(1, 9, Ustr::from("z"), all);
        let dead = Ustr::from("b");
        let live = |_: u64, n: Ustr| n != dead;
        assert_eq!(q.pop_live(live), Some((9, Ustr::from("z"))));
        assert_eq!(q.pop_live(live), Some((3, Ustr::from("c"))));
        assert_eq!(q.pop_live(live), None);
    }

    #[test]
    fn the_queue_grows_with_live_requests_not_with_requests_made() {
        // Requests created and cancelled in a pool with no capacity (never popped): the
        // queue must stay near the live count, not grow with every request ever made.
        let mut q = WaitingQueue::default();
        let mut live: BTreeSet<u64> = BTreeSet::new();
        for serial in 0..100_000u64 {
            let name = Ustr::from(&format!("qr-{serial}"));
            q.push(serial, serial, name, |s, _| live.contains(&s));
            live.insert(serial);
            // Every request but one in ten is deleted soon after.
            if serial % 10 != 0 {
                live.remove(&serial);
            }
            assert!(
                q.len() <= 2 * live.len() + COMPACT_FLOOR + 1,
                "{} entries for {} live",
                q.len(),
                live.len()
            );
        }
        let mut popped = Vec::new();
        while let Some((s, _)) = q.pop_live(|s, _| live.contains(&s)) {
            popped.push(s);
        }
        assert_eq!(popped, live.iter().copied().collect::<Vec<_>>());
    }
}
