//! Renders validated specs for people (aligned text) and machines (JSON). Pure formatting.

use crate::table::table;
use std::collections::BTreeMap;

use serde::Serialize;

use crate::engine::state::BucketRegion;
use crate::spec::fleet::EntryKind;
use crate::spec::job::compatible_entries;
use crate::spec::{FleetSpec, JobSpec, TpuEntry, TpuRequest, names};
use crate::submit::runs_on;

#[derive(Serialize)]
struct FleetView<'a> {
    #[serde(flatten)]
    fleet: &'a FleetSpec,
    entries: Vec<EntryView<'a>>,
}

#[derive(Serialize)]
struct EntryView<'a> {
    id: &'a str,
    runner_name: &'a str,
    adopted: bool,
    ceiling_count: u32,
    chips_per_tpu: u32,
    quota_family: &'a str,
    declared: Vec<Declared>,
}

#[derive(Serialize)]
struct Declared {
    tpu_name: String,
    queued_resource: Option<String>,
}

fn entry_view<'a>(fleet: &'a FleetSpec, e: &'a TpuEntry) -> EntryView<'a> {
    EntryView {
        id: &e.id,
        runner_name: &fleet.name,
        adopted: e.is_adopted(),
        ceiling_count: e.ceiling(),
        chips_per_tpu: e.chips_per_tpu(),
        quota_family: e.tpu_type.quota_family(),
        declared: e
            .declared_node_names(&fleet.name)
            .into_iter()
            .map(|tpu_name| Declared {
                queued_resource: (!e.is_adopted())
                    .then(|| names::queued_resource_name(&tpu_name).to_string()),
                tpu_name,
            })
            .collect(),
    }
}

/// The fleet as indented JSON: every field normalised, plus derived per-entry facts.
pub(crate) fn fleet_json(fleet: &FleetSpec) -> String {
    let view = FleetView {
        fleet,
        entries: fleet.tpus.iter().map(|e| entry_view(fleet, e)).collect(),
    };
    serde_json::to_string_pretty(&view).expect("fleet serialises") + "\n"
}

/// The jobs as indented JSON.
pub(crate) fn jobs_json(jobs: &[JobSpec]) -> String {
    serde_json::to_string_pretty(&serde_json::json!({ "jobs": jobs })).expect("jobs serialise")
        + "\n"
}

/// A human summary of a fleet.
pub(crate) fn fleet_summary(fleet: &FleetSpec) -> String {
    let mut out = format!(
        "fleet `{}` is valid: {} TPU entries\n\n",
        fleet.name,
        fleet.tpus.len()
    );
    out.push_str(&format!("  project             {}\n", fleet.project));
    out.push_str(&format!("  bucket              {}\n", fleet.bucket));
    out.push_str(&format!(
        "  controller          {} (timeout {}, memory {}, retries {})\n",
        fleet.controller_region,
        fleet.controller_timeout,
        fleet.controller_memory,
        fleet.controller_max_retries
    ));
    out.push_str(&format!(
        "  firestore           {}\n",
        fleet.firestore_location
    ));
    out.push_str(&format!(
        "  network             {} / {}\n",
        fleet.network, fleet.subnetwork
    ));
    out.push_str(&format!("  ssh transport       {:?}\n", fleet.ssh_transport).to_lowercase());
    out.push_str(&format!(
        "  idle timeout        {}s\n",
        fleet.idle_timeout_seconds
    ));
    let secrets = if fleet.worker_secrets.is_empty() {
        "none".to_owned()
    } else {
        fleet.worker_secrets.join(", ")
    };
    out.push_str(&format!("  worker secrets      {secrets}\n\n"));
    let rows: Vec<Vec<String>> = fleet
        .tpus
        .iter()
        .map(|e| {
            let (kind, count) = match &e.kind {
                EntryKind::Managed { count } => ("managed".to_owned(), count.to_string()),
                EntryKind::Adopted { existing } => (format!("adopts {existing}"), "1".to_owned()),
            };
            vec![
                e.id.to_string(),
                e.tpu_type.to_string(),
                e.zone.to_string(),
                e.provisioning_model.as_str().to_owned(),
                kind,
                count,
                e.chips_per_tpu().to_string(),
                e.keep_warm_count.to_string(),
                e.chip_limit.to_string(),
            ]
        })
        .collect();
    out.push_str(&table(
        &[
            "ENTRY",
            "TYPE",
            "ZONE",
            "MODEL",
            "KIND",
            "MAX",
            "CHIPS/TPU",
            "WARM",
            "CHIP LIMIT",
        ],
        &rows,
    ));
    out
}

/// A human summary of jobs; with a fleet, which entries can run each (with each job's bucket
/// regions, read as `submit` reads them: only those in one of them).
pub(crate) fn jobs_summary(
    jobs: &[JobSpec],
    fleet: Option<&FleetSpec>,
    regions: Option<&BTreeMap<String, Vec<BucketRegion>>>,
) -> String {
    let mut out = format!(
        "{} job{} valid\n\n",
        jobs.len(),
        if jobs.len() == 1 { "" } else { "s" }
    );
    let rows: Vec<Vec<String>> = jobs
        .iter()
        .map(|j| {
            let tpu = match &j.tpu {
                TpuRequest::Any => "any".to_owned(),
                TpuRequest::OneOf(types) => types
                    .iter()
                    .map(|t| t.to_string())
                    .collect::<Vec<_>>()
                    .join(","),
            };
            let mut row = vec![
                if j.fresh_id {
                    format!("{}-… (a new run per submit)", j.name())
                } else {
                    j.id.clone()
                },
                tpu,
                format!("{:?}", j.priority).to_lowercase(),
                j.zone
                    .clone()
                    .or_else(|| j.tpu_name.clone())
                    .unwrap_or_else(|| "-".to_owned()),
                j.buckets.len().to_string(),
            ];
            if let Some(fleet) = fleet {
                let entries = match regions.and_then(|r| r.get(&j.id)) {
                    Some(regions) => runs_on(j, fleet, regions),
                    None => compatible_entries(j, fleet),
                };
                let ids: Vec<&str> = entries.iter().map(|e| e.id.as_str()).collect();
                row.push(ids.join(","));
            }
            row
        })
        .collect();
    let mut header = vec!["JOB", "TPU", "PRIORITY", "PINNED TO", "BUCKETS"];
    if fleet.is_some() {
        header.push("RUNS ON");
    }
    out.push_str(&table(&header, &rows));
    if regions.is_some() {
        out.push_str(
            "\nRUNS ON: the entries whose type, zone and TPU name fit the job, in a region where one of its buckets\nis (their locations read from the object store, as `submit` reads them; `plan` applies the same rule).\n",
        );
    } else if fleet.is_some() {
        out.push_str(
            "\nRUNS ON: the entries whose type, zone and TPU name fit the job. It runs only on those in a region\nwhere one of its buckets is: `--buckets` reads the bucket regions (as `submit` does) and keeps only those.\n",
        );
    }
    out
}
