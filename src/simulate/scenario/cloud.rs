//! The cloud model of a scenario file (`cloud:`: pools, capacity, latencies, API faults) and
//! its `prices:`, each field checked by the scenario's strict reader. Reads only the
//! spot-trace files a pool names; decides nothing about the workload.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use tpu_runner_sim::{ApiConfig, ApiLatency, ApiQuota, Capacity, Latency, SpotTrace, WorkerConfig};

use crate::spec::yaml::{self, Checker, Fields, Node, Place, Value};
use crate::spec::{EntryKind, FleetSpec, ProvisioningModel, TpuEntry, TpuType, gcp};

use super::{CloudSpec, DATA_HINT, Dirs, PoolSpec};

/// GCP's Spot VM preemption notice (ACPI soft-off to termination), seconds.
const PREEMPTION_NOTICE_SECS: f64 = 30.0;

/// API call latencies: a batch of parallel inventory reads 0.3 s, a mutation 1 s, an SSH
/// call 3 s (medians; no public figures, kept well under the original's timeouts of 90 s,
/// 300 s and 180 s).
const API_LATENCY: ApiLatency = ApiLatency {
    read: Latency {
        median_secs: 0.3,
        sigma: 0.5,
    },
    mutation: Latency {
        median_secs: 1.0,
        sigma: 0.5,
    },
    remote: Latency {
        median_secs: 3.0,
        sigma: 0.5,
    },
};

fn read_latency(c: &mut Checker<'_>, node: &Node, path: impl Place) -> Option<Latency> {
    let f = c.mapping(
        node,
        path,
        "a latency `{median_secs, sigma}`",
        &["median_secs", "sigma"],
        &[],
    )?;
    let median = f
        .required(c, "median_secs", "seconds")
        .and_then(|n| c.number(n, f.path("median_secs"), 0.0, 1e7, "seconds, 0 or more"));
    let sigma = f.get("sigma").map_or(Some(0.0), |n| {
        c.number(
            n,
            f.path("sigma"),
            0.0,
            5.0,
            "a log-normal shape from 0 to 5",
        )
    });
    Some(Latency {
        median_secs: median?,
        sigma: sigma?,
    })
}

pub(super) fn read_api(c: &mut Checker<'_>, node: &Node, path: impl Place) -> Option<ApiConfig> {
    let a = c.mapping(
        node,
        path,
        "API error rates",
        &["rate_limited", "unavailable", "timeout", "lost_reply"],
        &[],
    )?;
    Some(ApiConfig {
        rate_limited: probability(c, &a, "rate_limited")?,
        unavailable: probability(c, &a, "unavailable")?,
        timeout: probability(c, &a, "timeout")?,
        lost_reply: probability(c, &a, "lost_reply")?,
    })
}

pub(super) fn probability(c: &mut Checker<'_>, f: &Fields<'_>, name: &str) -> Option<f64> {
    f.get(name).map_or(Some(0.0), |n| {
        c.number(n, f.path(name), 0.0, 1.0, "a probability from 0 to 1")
    })
}

/// Defaults (sources in scenarios/README.md): provisioning 5 min median (public reports 2–9
/// min per region), deletion 60 s, Spot preemption notice 30 s, set-up 120 s (30 s warm), no
/// faults, unlimited capacity.
pub(super) fn default_cloud(fleet: &FleetSpec) -> CloudSpec {
    CloudSpec {
        provisioning: Latency {
            median_secs: 300.0,
            sigma: 0.5,
        },
        provisioning_by_region: BTreeMap::new(),
        delete_secs: 60.0,
        qr_failure_per_hour: 0.0,
        preemption_notice_secs: PREEMPTION_NOTICE_SECS,
        api_latency: API_LATENCY,
        api_quota: ApiQuota::default(),
        api: ApiConfig::default(),
        workers: WorkerConfig::default(),
        pools: fleet_pools(
            fleet,
            &[],
            &PoolDefaults {
                capacity: Capacity::Unlimited,
                preemption_per_hour: 0.0,
            },
        ),
    }
}

struct PoolDefaults {
    capacity: Capacity,
    preemption_per_hour: f64,
}

/// True when `pool` serves `entry`: a managed entry of the same zone, type, model and
/// reservation.
fn serves(pool: &PoolSpec, entry: &TpuEntry) -> bool {
    !matches!(entry.kind, EntryKind::Adopted { .. })
        && pool.zone == entry.zone.as_str()
        && pool.tpu_type == entry.tpu_type
        && pool.model == entry.provisioning_model
        && pool.reservation == entry.reservation
}

/// One pool per managed (zone, type, model, reservation) of the fleet: listed ones as given,
/// the others from the defaults (Spot), unlimited and never preempted (on-demand), or as
/// large as the entries it serves (a reservation).
fn fleet_pools(fleet: &FleetSpec, listed: &[PoolSpec], defaults: &PoolDefaults) -> Vec<PoolSpec> {
    let mut pools: Vec<PoolSpec> = listed.to_vec();
    for entry in &fleet.tpus {
        if matches!(entry.kind, EntryKind::Adopted { .. }) || pools.iter().any(|p| serves(p, entry))
        {
            continue;
        }
        let mut pool = PoolSpec {
            zone: entry.zone.to_string(),
            tpu_type: entry.tpu_type.clone(),
            model: entry.provisioning_model,
            reservation: entry.reservation.clone(),
            capacity: defaults.capacity.clone(),
            preemption_per_hour: defaults.preemption_per_hour,
            outages: Vec::new(),
            reclaims: entry.provisioning_model == ProvisioningModel::Spot,
        };
        match entry.provisioning_model {
            ProvisioningModel::Spot => {}
            ProvisioningModel::OnDemand => {
                (pool.capacity, pool.preemption_per_hour) = (Capacity::Unlimited, 0.0);
            }
            ProvisioningModel::Reserved => {
                let slices = fleet
                    .tpus
                    .iter()
                    .filter(|e| serves(&pool, e))
                    .map(TpuEntry::ceiling)
                    .sum();
                (pool.capacity, pool.preemption_per_hour) = (Capacity::Constant(slices), 0.0);
            }
        }
        pools.push(pool);
    }
    pools
}

pub(super) fn read_cloud(
    c: &mut Checker<'_>,
    node: &Node,
    fleet: &FleetSpec,
    dir: &Dirs,
    unreadable: &mut usize,
) -> Option<CloudSpec> {
    let f = c.mapping(
        node,
        "cloud",
        "the cloud model",
        &[
            "provisioning",
            "provisioning_by_region",
            "delete_secs",
            "qr_failure_per_hour",
            "preemption_notice_secs",
            "api_latency",
            "api_quota",
            "api",
            "workers",
            "pools",
            "default_pool",
        ],
        &[],
    )?;
    let defaults = default_cloud(fleet);
    let provisioning = f
        .get("provisioning")
        .map_or(Some(defaults.provisioning), |n| {
            read_latency(c, n, "cloud.provisioning")
        });
    let mut by_region = BTreeMap::new();
    if let Some(n) = f.get("provisioning_by_region") {
        if let Value::Map(pairs) = &n.value {
            for (k, v) in pairs {
                let Some(region) = c.nonempty_string(k, "cloud.provisioning_by_region", "a region")
                else {
                    continue;
                };
                if let Err(e) = gcp::check_region(&region) {
                    c.expected(k, "cloud.provisioning_by_region", &e);
                    continue;
                }
                if let Some(l) =
                    read_latency(c, v, &format!("cloud.provisioning_by_region.{region}"))
                {
                    by_region.insert(region, l);
                }
            }
        } else {
            c.expected(
                n,
                "cloud.provisioning_by_region",
                "a mapping of regions to latencies",
            );
        }
    }
    let delete_secs = f.get("delete_secs").map_or(Some(60.0), |n| {
        c.number(n, "cloud.delete_secs", 0.0, 86400.0, "seconds")
    });
    let qr_failure = f.get("qr_failure_per_hour").map_or(Some(0.0), |n| {
        c.number(
            n,
            "cloud.qr_failure_per_hour",
            0.0,
            1000.0,
            "a rate per request-hour",
        )
    });
    let notice = f
        .get("preemption_notice_secs")
        .map_or(Some(PREEMPTION_NOTICE_SECS), |n| {
            c.number(
                n,
                "cloud.preemption_notice_secs",
                0.0,
                3600.0,
                "seconds, 0 to 3600",
            )
        });
    let api_latency = match f.get("api_latency") {
        None => Some(API_LATENCY),
        Some(n) => c
            .mapping(
                n,
                "cloud.api_latency",
                "API call latencies",
                &["read", "mutation", "remote"],
                &[],
            )
            .and_then(|l| {
                let read = |c: &mut Checker<'_>, name: &str, default: Latency| {
                    l.get(name).map_or(Some(default), |n| {
                        read_latency(c, n, &format!("cloud.api_latency.{name}"))
                    })
                };
                Some(ApiLatency {
                    read: read(c, "read", API_LATENCY.read)?,
                    mutation: read(c, "mutation", API_LATENCY.mutation)?,
                    remote: read(c, "remote", API_LATENCY.remote)?,
                })
            }),
    };
    let api_quota = match f.get("api_quota") {
        None => Some(ApiQuota::default()),
        Some(n) => c
            .mapping(
                n,
                "cloud.api_quota",
                "API quotas in calls per minute",
                &["reads_per_minute", "mutations_per_minute"],
                &[],
            )
            .and_then(|q| {
                let rate = |c: &mut Checker<'_>, name: &str| {
                    q.get(name).map_or(Some(0.0), |n| {
                        c.number(
                            n,
                            q.path(name),
                            0.0,
                            1e9,
                            "calls per minute, 0 for no limit",
                        )
                    })
                };
                Some(ApiQuota {
                    reads_per_minute: rate(c, "reads_per_minute")?,
                    mutations_per_minute: rate(c, "mutations_per_minute")?,
                })
            }),
    };
    let api = f
        .get("api")
        .map_or(Some(ApiConfig::default()), |n| read_api(c, n, "cloud.api"));
    let workers = match f.get("workers") {
        Some(n) => c
            .mapping(
                n,
                "cloud.workers",
                "worker behaviour",
                &[
                    "setup",
                    "setup_warm",
                    "missing_status",
                    "silent_death_per_hour",
                    "partial_failure",
                ],
                &[],
            )
            .and_then(|w| {
                let d = WorkerConfig::default();
                Some(WorkerConfig {
                    setup: w
                        .get("setup")
                        .map_or(Some(d.setup), |n| read_latency(c, n, "cloud.workers.setup"))?,
                    setup_warm: w.get("setup_warm").map_or(Some(d.setup_warm), |n| {
                        read_latency(c, n, "cloud.workers.setup_warm")
                    })?,
                    missing_status: probability(c, &w, "missing_status")?,
                    silent_death_per_hour: w.get("silent_death_per_hour").map_or(
                        Some(0.0),
                        |n| {
                            c.number(
                                n,
                                "cloud.workers.silent_death_per_hour",
                                0.0,
                                1000.0,
                                "a rate per hour",
                            )
                        },
                    )?,
                    partial_failure: probability(c, &w, "partial_failure")?,
                })
            }),
        None => Some(WorkerConfig::default()),
    };
    let pool_defaults = match f.get("default_pool") {
        Some(n) => read_pool_defaults(c, n, dir, unreadable),
        None => Some(PoolDefaults {
            capacity: Capacity::Unlimited,
            preemption_per_hour: 0.0,
        }),
    };
    let listed = match f.get("pools") {
        Some(n) => c
            .list(n, "cloud.pools", "a list of pools", true)
            .map(|items| {
                let mut pools: Vec<PoolSpec> = Vec::new();
                for (i, node) in items.iter().enumerate() {
                    let path = yaml::index("cloud.pools", i);
                    let Some(pool) = read_pool(c, node, path, dir, unreadable) else {
                        continue;
                    };
                    let used = fleet.tpus.iter().any(|e| serves(&pool, e));
                    let what = match &pool.reservation {
                        Some(r) => format!(
                            "{} {} in {} (reservation {r})",
                            pool.model.as_str(),
                            pool.tpu_type,
                            pool.zone
                        ),
                        None => {
                            format!("{} {} in {}", pool.model.as_str(), pool.tpu_type, pool.zone)
                        }
                    };
                    if !used {
                        c.error(
                            node,
                            path,
                            format!(
                                "no managed fleet entry is a {what}: this pool would never be used"
                            ),
                        );
                    } else if pools.iter().any(|p| {
                        p.zone == pool.zone
                            && p.tpu_type == pool.tpu_type
                            && p.model == pool.model
                            && p.reservation == pool.reservation
                    }) {
                        c.error(node, path, format!("a second pool for {what}"));
                    } else {
                        pools.push(pool);
                    }
                }
                pools
            }),
        None => Some(Vec::new()),
    };
    Some(CloudSpec {
        provisioning: provisioning?,
        provisioning_by_region: by_region,
        delete_secs: delete_secs?,
        qr_failure_per_hour: qr_failure?,
        preemption_notice_secs: notice?,
        api_latency: api_latency?,
        api_quota: api_quota?,
        api: api?,
        workers: workers?,
        pools: fleet_pools(fleet, &listed?, &pool_defaults?),
    })
}

fn read_pool_defaults(
    c: &mut Checker<'_>,
    node: &Node,
    dir: &Dirs,
    unreadable: &mut usize,
) -> Option<PoolDefaults> {
    let f = c.mapping(
        node,
        "cloud.default_pool",
        "pool defaults",
        &["capacity", "preemption_per_hour"],
        &[],
    )?;
    let capacity = f.get("capacity").map_or(Some(Capacity::Unlimited), |n| {
        read_capacity(c, n, "cloud.default_pool.capacity", dir, unreadable)
    });
    let preemption = f.get("preemption_per_hour").map_or(Some(0.0), |n| {
        c.number(
            n,
            "cloud.default_pool.preemption_per_hour",
            0.0,
            1000.0,
            "a rate per node-hour",
        )
    });
    Some(PoolDefaults {
        capacity: capacity?,
        preemption_per_hour: preemption?,
    })
}

fn read_pool(
    c: &mut Checker<'_>,
    node: &Node,
    path: impl Place,
    dir: &Dirs,
    unreadable: &mut usize,
) -> Option<PoolSpec> {
    let f = c.mapping(
        node,
        path,
        "a pool",
        &[
            "zone",
            "type",
            "model",
            "reservation",
            "capacity",
            "preemption_per_hour",
            "outages_hours",
            "reclaim",
        ],
        &[],
    )?;
    const MODELS: &str = "`spot`, `on-demand` or `reserved`";
    let model = f.get("model").map_or(Some(ProvisioningModel::Spot), |n| {
        let m = c.string(n, f.path("model"), MODELS)?;
        let model = ProvisioningModel::parse(&m);
        if model.is_none() {
            c.expected(n, f.path("model"), MODELS);
        }
        model
    });
    let reservation = f
        .get("reservation")
        .and_then(|n| c.nonempty_string(n, f.path("reservation"), "the reservation's name"));
    match (model, &reservation) {
        (Some(ProvisioningModel::Reserved), None) => {
            f.required(
                c,
                "reservation",
                "the reservation's name, as its fleet entry names it",
            );
        }
        (Some(m), Some(_)) if m != ProvisioningModel::Reserved => {
            let n = f.get("reservation").unwrap_or(node);
            c.error(
                n,
                f.path("reservation"),
                "`reservation` applies only to `model: reserved`",
            );
        }
        _ => {}
    }
    let zone = f.required(c, "zone", "a zone").and_then(|n| {
        let z = c.nonempty_string(n, f.path("zone"), "a zone")?;
        gcp::zone_region(&z)
            .map_err(|e| c.expected(n, f.path("zone"), &e))
            .ok()?;
        Some(z)
    });
    let tpu_type = f.required(c, "type", "a TPU type").and_then(|n| {
        let t = c.nonempty_string(n, f.path("type"), "a TPU type")?;
        TpuType::parse(&t)
            .map_err(|e| c.error(n, f.path("type"), format!("expected {e}")))
            .ok()
    });
    let capacity = f.get("capacity").map_or(Some(Capacity::Unlimited), |n| {
        read_capacity(c, n, f.path("capacity"), dir, unreadable)
    });
    let preemption = f.get("preemption_per_hour").map_or(Some(0.0), |n| {
        c.number(
            n,
            f.path("preemption_per_hour"),
            0.0,
            1000.0,
            "a rate per node-hour",
        )
    });
    let reclaims = f
        .get("reclaim")
        .map_or(Some(true), |n| c.boolean(n, f.path("reclaim")));
    let outages = match f.get("outages_hours") {
        Some(n) => c
            .list(
                n,
                f.path("outages_hours"),
                "a list of `[from, until]` hour pairs",
                true,
            )
            .map(|items| {
                let mut out = Vec::new();
                for (i, item) in items.iter().enumerate() {
                    let p = yaml::index(f.path("outages_hours"), i);
                    match &item.value {
                        Value::Seq(pair) if pair.len() == 2 => {
                            let a = c.number(&pair[0], p, 0.0, 1e6, "hours");
                            let b = c.number(&pair[1], p, 0.0, 1e6, "hours");
                            if let (Some(a), Some(b)) = (a, b) {
                                if a < b {
                                    out.push(((a * 3600.0) as u64, (b * 3600.0) as u64));
                                } else {
                                    c.error(item, p, "an outage must end after it starts");
                                }
                            }
                        }
                        _ => c.expected(item, p, "a pair `[from_hour, until_hour]`"),
                    }
                }
                out
            }),
        None => Some(Vec::new()),
    };
    let (model, capacity, preemption) = (model?, capacity?, preemption?);
    if model != ProvisioningModel::Spot {
        if let Some(n) = f.get("preemption_per_hour").filter(|_| preemption > 0.0) {
            c.error(
                n,
                f.path("preemption_per_hour"),
                format!("{} capacity is never preempted", model.as_str()),
            );
        }
        if let Some(n) = f.get("reclaim") {
            c.error(n, f.path("reclaim"), "only Spot capacity is reclaimed");
        }
    }
    if model == ProvisioningModel::Reserved && !matches!(capacity, Capacity::Constant(_)) {
        let n = f.get("capacity").unwrap_or(node);
        c.error_hint(
            n,
            f.path("capacity"),
            "a reservation's capacity is its size: a number of slices",
            "a reservation is billed whole for the whole run, so its size must be fixed",
        );
    }
    Some(PoolSpec {
        zone: zone?,
        tpu_type: tpu_type?,
        model,
        reservation,
        capacity,
        preemption_per_hour: preemption,
        outages: outages?,
        reclaims: reclaims? && model == ProvisioningModel::Spot,
    })
}

fn read_capacity(
    c: &mut Checker<'_>,
    node: &Node,
    path: impl Place,
    dir: &Dirs,
    unreadable: &mut usize,
) -> Option<Capacity> {
    const EXPECTED: &str =
        "`unlimited`, a number of slices, `{on_off: ...}`, `{trace: ...}` or `{schedule: ...}`";
    match &node.value {
        Value::Str(s) if s == "unlimited" => Some(Capacity::Unlimited),
        Value::Int(n) if *n >= 0 && *n <= u32::MAX as i64 => Some(Capacity::Constant(*n as u32)),
        Value::Map(_) => {
            let models = ["on_off", "trace", "schedule"];
            let f = c.mapping(node, path, "a capacity model", &models, &[])?;
            if !f.at_most_one(c, &models) {
                return None;
            }
            if let Some(n) = f.get("schedule") {
                return read_schedule(c, n, f.path("schedule"));
            }
            if let Some(n) = f.get("on_off") {
                let p = f.path("on_off");
                let o = c.mapping(
                    n,
                    p,
                    "an on/off model",
                    &["slices", "mean_on_hours", "mean_off_hours"],
                    &[],
                )?;
                let slices = o
                    .required(c, "slices", "slices while available")
                    .and_then(|n| {
                        c.integer(
                            n,
                            o.path("slices"),
                            0,
                            u32::MAX as i64,
                            "a number of slices",
                        )
                    });
                let on = o.required(c, "mean_on_hours", "hours").and_then(|n| {
                    c.number(n, o.path("mean_on_hours"), 0.001, 1e5, "positive hours")
                });
                let off = o.required(c, "mean_off_hours", "hours").and_then(|n| {
                    c.number(n, o.path("mean_off_hours"), 0.001, 1e5, "positive hours")
                });
                return Some(Capacity::OnOff {
                    slices: slices? as u32,
                    mean_on_secs: on? * 3600.0,
                    mean_off_secs: off? * 3600.0,
                });
            }
            if let Some(n) = f.get("trace") {
                let p = f.path("trace");
                let t = c.mapping(
                    n,
                    p,
                    "a trace model",
                    &["file", "scale", "offset_hours"],
                    &[],
                )?;
                let file = t
                    .required(c, "file", "a spot trace JSON file")
                    .and_then(|n| c.nonempty_string(n, t.path("file"), "a file path"))?;
                let scale = t.get("scale").map_or(Some(1), |n| {
                    c.integer(n, t.path("scale"), 1, 10_000, "slices per trace instance")
                });
                let offset = t.get("offset_hours").map_or(Some(0.0), |n| {
                    c.number(n, t.path("offset_hours"), 0.0, 1e6, "hours")
                });
                let full = dir.join(&file);
                let trace = match crate::files::read_text(&full, crate::files::DATA_LIMIT) {
                    Ok(text) => match SpotTrace::parse(&text) {
                        Ok(trace) => trace,
                        Err(e) => {
                            c.error(
                                n,
                                t.path("file"),
                                format!("`{}` is not a spot trace: {e}", full.display()),
                            );
                            return None;
                        }
                    },
                    Err(e) => {
                        *unreadable += 1;
                        c.error_hint(
                            n,
                            t.path("file"),
                            format!("cannot read the spot trace `{}`: {e}", full.display()),
                            DATA_HINT,
                        );
                        return None;
                    }
                };
                return Some(Capacity::Trace {
                    trace: Arc::new(trace),
                    scale: scale? as u32,
                    offset_secs: (offset? * 3600.0) as u64,
                });
            }
            c.expected(node, path, EXPECTED);
            None
        }
        _ => {
            c.expected(node, path, EXPECTED);
            None
        }
    }
}

/// `[[seconds, slices or unlimited], ...]`, in increasing time: each step holds until the
/// next (what a capture saw of a pool).
fn read_schedule(c: &mut Checker<'_>, node: &Node, path: impl Place) -> Option<Capacity> {
    const STEP: &str = "a step `[seconds, slices]` (slices a number or `unlimited`)";
    let items = c.list(node, path, "a non-empty list of steps", false)?;
    let mut steps: Vec<(u64, u32)> = Vec::with_capacity(items.len());
    let mut ok = true;
    for (i, item) in items.iter().enumerate() {
        let p = yaml::index(path, i);
        let pair = match &item.value {
            Value::Seq(pair) if pair.len() == 2 => pair,
            _ => {
                c.expected(item, p, STEP);
                ok = false;
                continue;
            }
        };
        let at = c.number(
            &pair[0],
            yaml::index(&p, 0),
            0.0,
            1e9,
            "seconds from the start",
        );
        let slices = match &pair[1].value {
            Value::Str(s) if s == "unlimited" => Some(u32::MAX),
            _ => c
                .integer(
                    &pair[1],
                    yaml::index(&p, 1),
                    0,
                    u32::MAX as i64 - 1,
                    "a number of slices",
                )
                .map(|n| n as u32),
        };
        let (Some(at), Some(slices)) = (at, slices) else {
            ok = false;
            continue;
        };
        let at = at as u64;
        if steps.last().is_some_and(|(last, _)| *last >= at) {
            c.error(
                item,
                p,
                format!(
                    "the steps must go forward in time: {at} s comes after {} s",
                    steps.last().map_or(0, |s| s.0)
                ),
            );
            ok = false;
            continue;
        }
        steps.push((at, slices));
    }
    ok.then(|| Capacity::Schedule(steps.into()))
}

/// Prices per family: the defaults, overridden or extended (for families the fleet uses).
pub(super) fn read_prices(
    c: &mut Checker<'_>,
    node: &Node,
    fleet_families: &BTreeSet<String>,
) -> Option<BTreeMap<String, (f64, f64)>> {
    let Value::Map(pairs) = &node.value else {
        c.expected(
            node,
            "prices",
            "a mapping of TPU families to `{spot, on_demand}` USD per chip-hour",
        );
        return None;
    };
    let mut out = default_prices();
    for (k, v) in pairs {
        let Some(family) = c.nonempty_string(k, "prices", "a TPU family such as `v6e`") else {
            continue;
        };
        if !out.contains_key(&family) && !fleet_families.contains(&family) {
            let known: BTreeSet<&str> = out
                .keys()
                .chain(fleet_families)
                .map(String::as_str)
                .collect();
            let known: Vec<&str> = known.into_iter().collect();
            c.error_hint(
                k,
                "prices",
                format!("unknown TPU family `{family}`"),
                format!("families are {}", known.join(", ")),
            );
            continue;
        }
        let p = format!("prices.{family}");
        let Some(f) = c.mapping(v, &p, "`{spot, on_demand}`", &["spot", "on_demand"], &[]) else {
            continue;
        };
        let spot = f
            .required(c, "spot", "USD per chip-hour")
            .and_then(|n| c.number(n, f.path("spot"), 0.0, 1e4, "USD per chip-hour"));
        let od = f
            .required(c, "on_demand", "USD per chip-hour")
            .and_then(|n| c.number(n, f.path("on_demand"), 0.0, 1e4, "USD per chip-hour"));
        if let (Some(s), Some(o)) = (spot, od) {
            out.insert(family, (s, o));
        }
    }
    Some(out)
}

/// USD per GB moved between regions (cloud.google.com/vpc/pricing, within a continent).
pub const DEFAULT_EGRESS_USD_PER_GB: f64 = 0.02;

/// GB an attempt outside its bucket region reads (checkpoint and dataset shard).
pub const DEFAULT_DATA_GB_PER_ATTEMPT: f64 = 10.0;

/// Default USD per chip-hour (spot, on-demand): the shipped list prices.
pub fn default_prices() -> BTreeMap<String, (f64, f64)> {
    crate::spec::prices::LIST_PRICES
        .iter()
        .map(|&(family, spot, on_demand)| (family.to_owned(), (spot, on_demand)))
        .collect()
}
