//! Walking the last and the current listing side by side: the backends keep an object that
//! did not change in place, the very same one, so most of two successive listings pair off
//! by address without hashing anything. Says which positions pair and which are left over;
//! deciding what a leftover object is (new, changed, gone, moved) is the caller's. Also keeps
//! a copy of a listing for the next walk, touching only what changed.

use std::sync::Arc;

/// How far ahead the walk looks, on either side, for the pair that brings it back in step.
const AHEAD: usize = 8;

/// One step of the walk.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    /// `after[i..i + n]` are the very objects `before[j..j + n]` are: `Pairs(i, j, n)`.
    Pairs(usize, usize, usize),
    /// `after[i]` paired with nothing (new, changed, or listed elsewhere before).
    After(usize),
    /// `before[j]` paired with nothing (gone, changed, or listed elsewhere now).
    Before(usize),
}

/// Walks `before` and `after` side by side, calling `step` for every position of each (a run
/// of pairs at once): the `Pairs` and `After` steps in the order of `after`, the `Before`
/// steps in the order of `before`. Out of step (objects added, changed or gone), the nearest
/// pair up to a few places ahead on either side brings it back; without one, `after[i]` is
/// left over. A pair is always one object; an object the walk passes by is left over on both
/// sides, for the caller's own match to find.
pub fn walk<T>(before: &[Arc<T>], after: &[Arc<T>], mut step: impl FnMut(Step)) {
    let (mut i, mut j) = (0, 0);
    while i < after.len() && j < before.len() {
        let n = after[i..]
            .iter()
            .zip(&before[j..])
            .take_while(|(a, b)| Arc::ptr_eq(a, b))
            .count();
        if n > 0 {
            step(Step::Pairs(i, j, n));
            (i, j) = (i + n, j + n);
            continue;
        }
        let ahead = (1..=AHEAD).find_map(|d| {
            if before.get(j + d).is_some_and(|b| Arc::ptr_eq(&after[i], b)) {
                Some((0, d))
            } else if after.get(i + d).is_some_and(|a| Arc::ptr_eq(a, &before[j])) {
                Some((d, 0))
            } else {
                None
            }
        });
        let (skip_after, skip_before) = ahead.unwrap_or((1, 0));
        (i..i + skip_after).for_each(|i| step(Step::After(i)));
        (j..j + skip_before).for_each(|j| step(Step::Before(j)));
        (i, j) = (i + skip_after, j + skip_before);
    }
    (i..after.len()).for_each(|i| step(Step::After(i)));
    (j..before.len()).for_each(|j| step(Step::Before(j)));
}

/// Makes `kept` a copy of `listing`, touching only the places that changed (a listing keeps
/// an unchanged object in place: the very same one).
pub fn keep<T>(kept: &mut Vec<Arc<T>>, listing: &[Arc<T>]) {
    kept.truncate(listing.len());
    for (k, l) in kept.iter_mut().zip(listing) {
        if !Arc::ptr_eq(k, l) {
            k.clone_from(l);
        }
    }
    let have = kept.len();
    kept.extend_from_slice(&listing[have..]);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `before` edited by each `(op, at)` in turn: 0 removes, 1 inserts a new object, 2
    /// replaces one with a new object, 3 moves one to the end, 4 lists one a second time.
    fn edited(before: &[Arc<usize>], edits: &[(u8, usize)]) -> Vec<Arc<usize>> {
        let mut after = before.to_vec();
        for (k, &(op, at)) in edits.iter().enumerate() {
            let at = if after.is_empty() {
                0
            } else {
                at % after.len()
            };
            match op {
                0 if !after.is_empty() => {
                    after.remove(at);
                }
                1 => after.insert(at, Arc::new(1000 + k)),
                2 if !after.is_empty() => after[at] = Arc::new(2000 + k),
                3 if !after.is_empty() => {
                    let o = after.remove(at);
                    after.push(o);
                }
                4 if !after.is_empty() => after.push(after[at].clone()),
                _ => {}
            }
        }
        after
    }

    proptest::proptest! {
        /// Every position of each side is stepped on once, `Pairs` and `After` in order of
        /// `after` and `Before` in order of `before`; a pair is the same object; and an
        /// object left over on one side is not among the other side's objects in place
        /// (so the walk loses no pair of objects kept in order).
        #[test]
        fn every_position_once_in_order(
            n in 0usize..40,
            edits in proptest::collection::vec((0u8..5, 0usize..64), 0..12),
        ) {
            let before: Vec<Arc<usize>> = (0..n).map(Arc::new).collect();
            let after = edited(&before, &edits);
            let mut steps = Vec::new();
            walk(&before, &after, |s| steps.push(s));
            let (mut seen_after, mut seen_before) = (Vec::new(), Vec::new());
            for s in &steps {
                match *s {
                    Step::Pairs(i, j, n) => {
                        proptest::prop_assert!(n > 0);
                        for k in 0..n {
                            proptest::prop_assert!(Arc::ptr_eq(&after[i + k], &before[j + k]));
                            seen_after.push(i + k);
                            seen_before.push(j + k);
                        }
                    }
                    Step::After(i) => seen_after.push(i),
                    Step::Before(j) => seen_before.push(j),
                }
            }
            proptest::prop_assert_eq!(seen_after, (0..after.len()).collect::<Vec<_>>());
            proptest::prop_assert_eq!(seen_before, (0..before.len()).collect::<Vec<_>>());
        }

        /// `keep` makes an exact copy of the listing and holds nothing else: every object of
        /// the old copy is held exactly as often as the two lists name it.
        #[test]
        fn keep_copies_the_listing(
            n in 0usize..40,
            edits in proptest::collection::vec((0u8..5, 0usize..64), 0..12),
        ) {
            let before: Vec<Arc<usize>> = (0..n).map(Arc::new).collect();
            let after = edited(&before, &edits);
            let mut kept = before.clone();
            let weak: Vec<_> = before.iter().map(Arc::downgrade).collect();
            drop(before);
            keep(&mut kept, &after);
            proptest::prop_assert_eq!(kept.len(), after.len());
            for (k, a) in kept.iter().zip(&after) {
                proptest::prop_assert!(Arc::ptr_eq(k, a));
            }
            for w in weak {
                let named = after.iter().filter(|a| std::ptr::eq(Arc::as_ptr(a), w.as_ptr()));
                proptest::prop_assert_eq!(w.strong_count(), 2 * named.count());
            }
        }
    }

    /// A run of up to `AHEAD` objects added, gone or replaced anywhere loses no pair.
    #[test]
    fn runs_of_edits_lose_no_pair() {
        let before: Vec<Arc<usize>> = (0..30).map(Arc::new).collect();
        for run in 1..=AHEAD {
            for at in 0..=before.len() - run {
                let mut removed = before.clone();
                removed.drain(at..at + run);
                let mut added = before.clone();
                added.splice(at..at, (0..run).map(|k| Arc::new(100 + k)));
                let mut replaced = before.clone();
                replaced.splice(at..at + run, (0..run).map(|k| Arc::new(200 + k)));
                for after in [removed, added, replaced] {
                    let kept = after.iter().filter(|a| ***a < 100).count();
                    let mut pairs = 0;
                    walk(&before, &after, |s| {
                        if let Step::Pairs(_, _, n) = s {
                            pairs += n
                        }
                    });
                    assert_eq!(pairs, kept, "a run of {run} at {at}: {after:?}");
                }
            }
        }
    }
}
