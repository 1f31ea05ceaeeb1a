//! Where each key of a sequence was first seen, for the checks that refuse a repeated key (a
//! job's buckets, a sweep's ids, a snapshot object's keys). A few keys are compared one by
//! one in place (no hashing, no allocation); past that they go through a hash map, so a long
//! sequence costs linear time. Holds only what it is given; reports nothing itself.

use std::collections::HashMap;
use std::hash::Hash;

/// Keys compared one by one before a hash map takes over.
const FEW: usize = 16;

/// See the module doc.
#[derive(Debug)]
pub struct FirstSeen<K, V> {
    few: [Option<(K, V)>; FEW],
    /// Keys put in `few` while `many` was empty (then `few` holds all of them; once `many`
    /// takes over, `few` is emptied and `n` is no longer read).
    n: usize,
    many: HashMap<K, V>,
}

impl<K: Eq + Hash, V> Default for FirstSeen<K, V> {
    fn default() -> Self {
        FirstSeen {
            few: [const { None }; FEW],
            n: 0,
            many: HashMap::new(),
        }
    }
}

impl<K: Eq + Hash, V> FirstSeen<K, V> {
    /// Where `key` was first seen, if it was.
    pub fn get(&self, key: &K) -> Option<&V> {
        if self.many.is_empty() {
            self.few[..self.n]
                .iter()
                .flatten()
                .find_map(|(k, v)| (k == key).then_some(v))
        } else {
            self.many.get(key)
        }
    }

    /// Records `key` as first seen at `at`; `key` must not be recorded yet (see `get`).
    pub fn insert(&mut self, key: K, at: V) {
        if self.many.is_empty() && self.n < FEW {
            self.few[self.n] = Some((key, at));
            self.n += 1;
            return;
        }
        if self.many.is_empty() {
            self.many
                .extend(self.few.iter_mut().filter_map(Option::take));
        }
        self.many.insert(key, at);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Around the switch to hashing: every key repeated after every other key is found, at
    /// its first place, in sequences of 1 to 40 distinct keys.
    #[test]
    fn repeats_are_found_at_their_first_place_on_both_sides_of_the_switch() {
        for distinct in [1usize, 2, 15, 16, 17, 40] {
            for repeated in 0..distinct {
                for after in repeated..distinct {
                    let mut seen = FirstSeen::default();
                    let record = |seen: &mut FirstSeen<usize, usize>, k: usize| {
                        assert_eq!(seen.get(&k), None, "{distinct} keys, {k} new");
                        seen.insert(k, k * 10);
                    };
                    for k in 0..=after {
                        record(&mut seen, k);
                    }
                    assert_eq!(
                        seen.get(&repeated),
                        Some(&(repeated * 10)),
                        "{distinct} keys, {repeated} repeated after {after}"
                    );
                    for k in after + 1..distinct {
                        record(&mut seen, k);
                    }
                }
            }
        }
    }
}
