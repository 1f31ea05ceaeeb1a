//! Deterministic synthetic fleets, queues and inventories for benches and scale tests: a
//! fleet of many entries, many pending jobs, idle TPUs with ready nodes, or a settled fleet
//! where every TPU runs a job. Pure; a simple integer hash stands in for randomness so the
//! same size always gives the same instance.

use std::collections::BTreeMap;
use std::sync::Arc;

use super::observe::{
    AttemptReport, Health, LABEL_FLEET_ENTRY, LABEL_MANAGED_BY, NodeInfo, NodeState, QrState,
    QueuedResourceInfo,
};
use super::policy::Classic;
use super::state::{BucketRegion, Job, JobStatus, Resource, ResourceStatus, State};
use super::{Engine, EngineConfig, Observation, Timestamp};
use crate::spec::fleet::{EntryKind, FleetSpec, SshTransport, TpuEntry};
use crate::spec::{JobSpec, Name, Priority, ProvisioningModel, TpuRequest, TpuType};

const TYPES: &[&str] = &[
    "v6e-8",
    "v6e-16",
    "v5litepod-8",
    "v5litepod-16",
    "v4-8",
    "v5p-8",
];
const REGIONS: &[&str] = &[
    "us-east1",
    "us-east5",
    "us-central1",
    "us-central2",
    "us-west1",
    "us-west4",
    "us-south1",
    "europe-west4",
    "europe-west1",
    "asia-northeast1",
    "asia-southeast1",
    "asia-east1",
];

fn mix(mut x: u64) -> u64 {
    x ^= x >> 33;
    x = x.wrapping_mul(0xff51_afd7_ed55_8ccd);
    x ^= x >> 33;
    x = x.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    x ^ (x >> 33)
}

/// A fleet of `n_entries` managed Spot entries spread over types and zones, each quota key
/// limited to what the whole fleet could hold (a limit that never binds).
pub fn fleet(n_entries: usize, count_per_entry: u32) -> FleetSpec {
    let most_chips = TYPES
        .iter()
        .map(|t| TpuType::parse(t).expect("valid").chips())
        .max()
        .unwrap_or(1);
    let chip_limit = most_chips * count_per_entry * n_entries as u32;
    let tpus = (0..n_entries)
        .map(|i| {
            let region = REGIONS[i % REGIONS.len()];
            let zone = format!("{region}-{}", ["a", "b", "c", "d"][(i / REGIONS.len()) % 4]);
            TpuEntry {
                id: Name::new(&format!("entry-{i}")),
                tpu_type: TpuType::parse(TYPES[(i / 7) % TYPES.len()]).expect("valid"),
                zone: Name::new(&zone),
                provisioning_model: ProvisioningModel::Spot,
                reservation: None,
                chip_limit: chip_limit.max(1),
                keep_warm_count: 0,
                runtime: Some("v2-alpha-tpuv6e".into()),
                kind: EntryKind::Managed {
                    count: count_per_entry,
                },
            }
        })
        .collect();
    FleetSpec {
        name: "bench".into(),
        project: "bench-project".into(),
        controller_region: "us-central1".into(),
        controller_timeout: "168h".into(),
        firestore_location: "nam5".into(),
        network: "default".into(),
        subnetwork: "default".into(),
        bucket: "gs://bench-bucket".into(),
        controller_memory: "1Gi".into(),
        controller_max_retries: 3,
        ssh_transport: SshTransport::Iap,
        idle_timeout_seconds: 600,
        worker_secrets: vec![],
        tpus,
        policy: Default::default(),
        event_retention_secs: crate::spec::fleet::DEFAULT_EVENT_RETENTION_SECS,
    }
}

/// `n_jobs` pending jobs, each accepting one to three types in one to three regions.
pub fn pending_jobs(n_jobs: usize, epoch: Timestamp) -> Vec<Job> {
    (0..n_jobs)
        .map(|i| {
            let h = mix(i as u64);
            let n_types = 1 + (h % 3) as usize;
            let types: Vec<TpuType> = (0..n_types)
                .map(|k| {
                    TpuType::parse(TYPES[((h >> 8) as usize + k * 2) % TYPES.len()]).expect("valid")
                })
                .collect();
            let n_regions = 1 + ((h >> 16) % 3) as usize;
            let buckets: Vec<BucketRegion> = (0..n_regions)
                .map(|k| {
                    let region = REGIONS[((h >> 24) as usize + k * 5) % REGIONS.len()];
                    BucketRegion {
                        region: region.into(),
                        bucket: format!("gs://bench-{region}"),
                    }
                })
                .collect();
            let spec = JobSpec {
                id: format!("job-{i:06}"),
                name: None,
                fresh_id: false,
                tpu: TpuRequest::OneOf(types),
                bundle: ".".into(),
                command: "python train.py".into(),
                tpu_name: None,
                zone: None,
                buckets: buckets.iter().map(|b| b.bucket.clone()).collect(),
                caches: vec![],
                env: BTreeMap::new(),
                priority: [
                    Priority::Low,
                    Priority::Normal,
                    Priority::Normal,
                    Priority::High,
                ][((h >> 40) % 4) as usize],
                retry_on_infrastructure_failure: true,
                move_checkpoints: false,
            };
            Job::new(spec, epoch.plus_secs((h >> 44) as i64 % 86_400), buckets)
        })
        .collect()
}

/// `pending_jobs` with requirements as varied as a lab's sweep queue: about one job in six
/// pinned to a zone of `fleet` (its type and region with it), one in twenty to a TPU by
/// name (an ordinal of a managed entry), the rest as `pending_jobs` makes them. The number
/// of distinct requirements grows with the queue (pins name entries and ordinals), which is
/// what makes explaining a large queue against a large fleet costly.
pub fn varied_pending_jobs(fleet: &FleetSpec, n_jobs: usize, epoch: Timestamp) -> Vec<Job> {
    let mut jobs = pending_jobs(n_jobs, epoch);
    for (i, job) in jobs.iter_mut().enumerate() {
        let h = mix(i as u64 ^ 0x05ee_dc1a_55e5);
        let entry = &fleet.tpus[(h >> 8) as usize % fleet.tpus.len()];
        let (zone, region) = (
            entry.zone.as_str(),
            entry.zone.as_str().rsplit_once('-').map_or("", |(r, _)| r),
        );
        let pin = match h % 20 {
            0 => match entry.kind {
                EntryKind::Managed { count } if count > 0 => Some(Name::new(
                    &entry.node_name(&fleet.name, 1 + (h >> 32) as u32 % count),
                )),
                _ => None,
            },
            1..=3 => None,
            _ => continue,
        };
        let mut types = vec![entry.tpu_type.clone()];
        if let TpuRequest::OneOf(others) = &job.spec.tpu {
            types.extend(others.iter().filter(|t| **t != entry.tpu_type).cloned());
        }
        job.spec.tpu = TpuRequest::OneOf(types);
        job.spec.zone = Some(zone.to_owned());
        job.spec.tpu_name = pin.map(|n| n.to_string());
        let bucket = BucketRegion {
            region: region.to_owned(),
            bucket: format!("gs://bench-{region}"),
        };
        if !job.bucket_regions.iter().any(|b| b.region == region) {
            job.spec.buckets.push(bucket.bucket.clone());
            job.bucket_regions.push(bucket);
        }
        // The requirement changed: its fingerprint is computed afresh.
        job.print = super::state::RequirementPrintCache::default();
        job.ensure_print();
    }
    jobs
}

/// A state with `n_jobs` pending jobs and `n_idle` idle TPUs (ordinals spread over the
/// entries), plus the observation showing those TPUs ready.
pub fn planning_instance(
    fleet: &FleetSpec,
    n_jobs: usize,
    n_idle: usize,
    epoch: Timestamp,
) -> (State, Observation) {
    let mut state = State::new();
    for job in pending_jobs(n_jobs, epoch) {
        state.jobs.insert(job.id, job);
    }
    let mut obs = Observation::default();
    let per_entry = match fleet.tpus.first().map(|e| &e.kind) {
        Some(EntryKind::Managed { count }) => *count as usize,
        _ => 0,
    };
    for i in 0..n_idle.min(fleet.tpus.len() * per_entry) {
        let entry = &fleet.tpus[i % fleet.tpus.len()];
        let ordinal = (i / fleet.tpus.len()) as u32 + 1;
        let name = Name::new(&entry.node_name(&fleet.name, ordinal));
        let labels: crate::engine::observe::Labels = BTreeMap::from([
            (LABEL_MANAGED_BY.to_owned(), fleet.name.clone()),
            (LABEL_FLEET_ENTRY.to_owned(), entry.id.to_string()),
        ])
        .into();
        let mut record = Resource::new(name, entry, ResourceStatus::Idle, 1);
        record.idle_since = Some(epoch);
        state.resources.insert(name, record);
        obs.queued_resources.push(Arc::new(QueuedResourceInfo {
            name: crate::spec::names::queued_resource_name(&name),
            zone: entry.zone,
            node_id: name,
            tpu_type: entry.tpu_type.clone(),
            state: QrState::Active,
            spot: true,
            reserved: false,
            labels: labels.clone(),
            failure: None,
        }));
        obs.nodes.push(Arc::new(NodeInfo {
            name,
            zone: entry.zone,
            tpu_type: entry.tpu_type.clone(),
            state: NodeState::Ready,
            health: Health::Healthy,
            spot: true,
            reserved: false,
            labels,
            queued_resource: None,
            worker_count: 1,
            public_ip: false,
        }));
    }
    (state, obs)
}

/// A settled fleet: every TPU of `fleet` ready behind an active request and running an
/// attempt of one of `n_jobs` jobs (those that found no TPU are withdrawn), its workers
/// heartbeating: what most passes at scale see, with nothing to decide. Returns the state,
/// the observation and the time of the next pass. Built by the engine itself: a pass assigns
/// the TPUs, two more see the launches confirmed.
pub fn running_instance(
    fleet: &FleetSpec,
    n_jobs: usize,
    epoch: Timestamp,
) -> (State, Observation, Timestamp) {
    let (mut state, mut obs) = planning_instance(fleet, n_jobs, usize::MAX, epoch);
    let engine = Engine::new(fleet.clone(), EngineConfig::default(), Box::new(Classic));
    let mut now = epoch.plus_secs(100_000);
    for _ in 0..3 {
        engine.reconcile(&mut state, &obs, now);
        now = now.plus_secs(30);
        obs.attempts = state
            .jobs
            .values()
            .filter(|j| j.status == JobStatus::Running)
            .filter_map(|j| {
                let report = AttemptReport {
                    launched: true,
                    heartbeat_at: Some(now),
                    ..AttemptReport::default()
                };
                Some((j.attempt()?.id, report))
            })
            .collect();
    }
    let waiting: Vec<Name> = state
        .jobs
        .values()
        .filter(|j| j.status == JobStatus::Pending)
        .map(|j| j.id)
        .collect();
    for id in waiting {
        state.jobs.remove(&id);
    }
    (state, obs, now)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::state::AttemptStatus;

    #[test]
    fn a_running_instance_is_settled() {
        let epoch = Timestamp::from_secs(1_767_225_600);
        let fleet = fleet(40, 3);
        let (mut state, obs, now) = running_instance(&fleet, 400, epoch);
        let running: Vec<&Job> = state
            .jobs
            .values()
            .filter(|j| j.status == JobStatus::Running)
            .collect();
        assert_eq!(running.len(), 120, "every TPU runs a job");
        assert_eq!(state.jobs.len(), 120, "no job waits");
        assert!(running.iter().all(|j| {
            j.attempt()
                .is_some_and(|a| a.status == AttemptStatus::Running)
        }));
        assert!(state.resources.values().all(Resource::is_busy));
        let engine = Engine::new(fleet, EngineConfig::default(), Box::new(Classic));
        let out = engine.reconcile(&mut state, &obs, now);
        assert!(out.actions.is_empty(), "{:?}", out.actions);
        assert!(out.violations.is_empty(), "{:?}", out.violations);
    }
}
