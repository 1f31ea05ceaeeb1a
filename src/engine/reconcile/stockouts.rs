//! Stockout memory (the policy's `stockout_cooldown`): per pool (zone, TPU type,
//! provisioning model), a refused request or one left waiting for capacity past
//! `stockout_wait` cools the pool for the cooldown, doubled for each further signal (up to
//! `stockout_doublings` times, at most 8×), and capacity granted there again clears it. Policies read the result as
//! `CapacityInput::cooling` and ask cooling pools last. Decides no capacity itself; with the
//! memory off it keeps nothing.

use std::collections::BTreeMap;

use super::Pass;
use crate::engine::observe::QrState;
use crate::engine::state::PoolMemory;
use crate::spec::policy::show_secs;

impl<'a> Pass<'a> {
    /// Updates each pool's memory from this pass's listing: capacity granted clears it, a
    /// request waiting past `stockout_wait` cools it.
    pub(super) fn stockout_memory(&mut self) {
        let memory = self.index.fleet.policy.stockout;
        if !memory.enabled() {
            if !self.state.pools.is_empty() {
                self.state.pools.clear();
            }
            return;
        }
        // (waiting, granted) requests per pool, as listed.
        let mut seen: BTreeMap<String, (u32, u32)> = BTreeMap::new();
        for (i, qr) in self.obs.queued_resources.iter().enumerate() {
            let Some(e) = self.qr_facts[i].entry else {
                continue;
            };
            let entry = self.index.entry(e as usize);
            if entry.is_adopted() || self.deleted.contains(&qr.name) {
                continue;
            }
            let counts = seen
                .entry(self.index.pool_key(e as usize).to_owned())
                .or_default();
            match qr.state {
                QrState::Creating | QrState::Accepted | QrState::WaitingForResources => {
                    counts.0 += 1
                }
                QrState::Provisioning | QrState::Active => counts.1 += 1,
                _ => {}
            }
        }
        let keys: Vec<String> = seen
            .keys()
            .chain(self.state.pools.keys())
            .cloned()
            .collect::<std::collections::BTreeSet<_>>()
            .into_iter()
            .collect();
        for key in keys {
            let (waiting, granted) = seen.get(&key).copied().unwrap_or_default();
            let mut m = self.state.pools.get(&key).cloned().unwrap_or_default();
            if granted > m.granted {
                if m.strikes > 0 {
                    self.event(
                        "pool_capacity_seen",
                        None,
                        None,
                        None,
                        format!("pool={key}; after {} stockout signals", m.strikes),
                    );
                }
                m.strikes = 0;
                m.cool_until = None;
                m.reason.clear();
                m.waiting_since = None;
            }
            m.granted = granted;
            if waiting > 0 {
                let since = *m.waiting_since.get_or_insert(self.now);
                let due = since.plus_secs(memory.wait_secs);
                if self.now >= due {
                    let waited = self.now.secs_since(since) as i64;
                    self.cool(
                        &key,
                        &mut m,
                        format!("a request waited {} for capacity", show_secs(waited)),
                    );
                    m.waiting_since = Some(self.now);
                } else {
                    self.wake_at(due);
                }
            } else {
                m.waiting_since = None;
            }
            match m.cool_until {
                Some(t) if t > self.now => self.wake_at(t),
                Some(_) => m.cool_until = None,
                None => {}
            }
            let forgotten = m.waiting_since.is_none() && m.cool_until.is_none() && granted == 0;
            if forgotten {
                self.state.pools.remove(&key);
            } else if self.state.pools.get(&key) != Some(&m) {
                self.state.pools.insert(key, m);
            }
        }
    }

    /// A refused request of entry `e` is a stockout signal for its pool.
    pub(super) fn stockout_refused(&mut self, e: usize, refusal: &str) {
        if !self.index.fleet.policy.stockout.enabled() {
            return;
        }
        let key = self.index.pool_key(e).to_owned();
        let mut m = self.state.pools.get(&key).cloned().unwrap_or_default();
        self.cool(&key, &mut m, format!("refused: {refusal}"));
        self.state.pools.insert(key, m);
    }

    /// One stockout signal: the pool cools for the cooldown times 2^(strikes - 1).
    fn cool(&mut self, key: &str, m: &mut PoolMemory, reason: String) {
        let memory = self.index.fleet.policy.stockout;
        m.strikes = (m.strikes + 1).min(memory.doublings.min(3) + 1);
        let secs = memory.cooldown_secs << (m.strikes - 1);
        m.cool_until = Some(self.now.plus_secs(secs));
        self.event(
            "pool_cooled",
            None,
            None,
            None,
            format!(
                "pool={key}; {reason}; requests go elsewhere first for {}",
                show_secs(secs)
            ),
        );
        m.reason = reason;
    }

    /// Per fleet entry: its pool is cooling now.
    pub(super) fn cooling_entries(&self) -> Vec<bool> {
        let entries = &self.index.fleet.tpus;
        if self.state.pools.is_empty() {
            return vec![false; entries.len()];
        }
        entries
            .iter()
            .enumerate()
            .map(|(e, entry)| {
                !entry.is_adopted()
                    && self
                        .state
                        .pools
                        .get(self.index.pool_key(e))
                        .is_some_and(|m| m.cooling(self.now))
            })
            .collect()
    }
}
