//! The reconcile engine: pure and deterministic. Given the fleet, the state, an observation
//! of the cloud and `now`, a pass mutates the state and returns actions, events and when it
//! next needs to run. It never reads the clock, never does IO, never uses an unseeded RNG,
//! and depends on no async runtime, HTTP client or storage (a tidy test enforces this).
//!
//! Driver contract: `scope = engine.inventory_scope(&state)`; list the runner's objects in its
//! zones and fetch its adopted TPUs into an `Observation` (plus worker reports and the
//! refusals of the previous actions); call
//! `engine.reconcile(&mut state, &obs, now)`; persist the state; then carry out the actions
//! in order. Actions are idempotent by name, so a crash between persisting and acting loses
//! nothing: the next pass re-derives them.

pub mod aggregate;
mod capacity;
pub mod commands;
pub mod config;
pub mod demand;
pub mod explain;
pub mod fleet_index;
pub(crate) mod in_step;
pub mod lease;
mod memo;
pub mod observe;
mod observed;
pub mod policy;
mod reconcile;
pub mod sightings;
pub mod snapshot;
pub mod sorted_map;
pub mod state;
pub mod state_file;
pub mod synthetic;
pub mod time;

pub use config::EngineConfig;
pub use fleet_index::{FleetIndex, InventoryScope};
pub use observe::{Action, CloudFailure, Event, Observation};
pub use policy::Policy;
pub use reconcile::PassOutput;
pub use state::State;
pub use time::Timestamp;

use crate::spec::FleetSpec;

/// The engine: a fleet index, constants and a policy, plus the last observation's index (a
/// cache: see `observed`).
#[derive(Debug)]
pub struct Engine {
    index: FleetIndex,
    config: EngineConfig,
    policy: Box<dyn Policy>,
    caches: std::sync::Mutex<Caches>,
}

/// What the engine carries from one pass to the next (caches only: a pass with fresh ones
/// decides the same).
#[derive(Debug, Default)]
struct Caches {
    observed: observed::ObservedIndex,
    memo: memo::Memo,
}

impl Engine {
    /// An engine running what `fleet`'s `policy:` section says (policy, parameters, timings).
    pub fn of_fleet(fleet: FleetSpec) -> Engine {
        Engine::with_policy(fleet.policy.clone(), fleet)
    }

    /// An engine for `fleet` running `spec` instead of the fleet's own policy (a what-if in
    /// `plan`, a variant in `simulate`).
    pub fn with_policy(spec: crate::spec::PolicySpec, mut fleet: FleetSpec) -> Engine {
        let policy = policy::of_spec(&spec);
        let config = spec.engine;
        fleet.policy = spec;
        Engine::new(fleet, config, policy)
    }

    /// An engine for `fleet` with `policy`.
    pub fn new(fleet: FleetSpec, config: EngineConfig, policy: Box<dyn Policy>) -> Engine {
        Engine {
            index: FleetIndex::new(fleet),
            config,
            policy,
            caches: Default::default(),
        }
    }

    /// The fleet index.
    pub fn index(&self) -> &FleetIndex {
        &self.index
    }

    /// The constants.
    pub fn config(&self) -> &EngineConfig {
        &self.config
    }

    /// The policy.
    pub fn policy(&self) -> &dyn Policy {
        &*self.policy
    }

    /// What the driver must read for the next observation: `FleetIndex::inventory_scope`,
    /// with what the records add kept from call to call (only records changed since are
    /// looked at).
    pub fn inventory_scope<'s>(&'s self, state: &'s State) -> InventoryScope<'s> {
        let mut caches = self.caches();
        let adds: Vec<_> = caches
            .memo
            .scope
            .adds(&state.resources, &self.index)
            .collect();
        drop(caches);
        self.index.scope_with(adds)
    }

    /// The caches, locked. A pass that panicked may have left them half-patched: they are
    /// then started afresh.
    fn caches(&self) -> std::sync::MutexGuard<'_, Caches> {
        self.caches.lock().unwrap_or_else(|poisoned| {
            let mut guard = poisoned.into_inner();
            *guard = Default::default();
            self.caches.clear_poison();
            guard
        })
    }

    /// One reconcile pass.
    pub fn reconcile(
        &self,
        state: &mut State,
        observation: &Observation,
        now: Timestamp,
    ) -> PassOutput {
        let mut caches = self.caches();
        let Caches { observed, memo } = &mut *caches;
        observed.update(&self.index, observation);
        self.pass(state, observation, observed, memo, now)
    }

    /// One reconcile pass that uses no cache: what `reconcile` must return, byte for byte,
    /// whatever passes came before (checked on every step of the chaos runs).
    pub fn reconcile_from_scratch(
        &self,
        state: &mut State,
        observation: &Observation,
        now: Timestamp,
    ) -> PassOutput {
        let mut observed = observed::ObservedIndex::default();
        observed.update(&self.index, observation);
        self.pass(
            state,
            observation,
            &observed,
            &mut memo::Memo::default(),
            now,
        )
    }

    fn pass(
        &self,
        state: &mut State,
        observation: &Observation,
        observed: &observed::ObservedIndex,
        memo: &mut memo::Memo,
        now: Timestamp,
    ) -> PassOutput {
        reconcile::Pass::new(self, state, observation, observed, memo, now).run()
    }
}
