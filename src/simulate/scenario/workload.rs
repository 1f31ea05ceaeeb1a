//! The workloads of a scenario file (`workload:`, `initial_state:`): synthetic arrivals,
//! trace replays and captured jobs, read with the scenario's strict reader; files they name
//! are read from the scenario's folder, or from the traces folder for `$TRACES/…`. Decides
//! nothing about the cloud.

use std::collections::BTreeMap;
use std::path::Path;

use tpu_runner_sim::workload::{Dist, JobArrival, Regions, Synthetic, TraceReplay, read_column};

use crate::spec::yaml::{self, Checker, Fields, Node, Place, Value};
use crate::spec::{FleetSpec, TpuType, gcp};

use super::cloud::probability;
use super::{DATA_HINT, Dirs, LiveQueue, WorkloadSpec};

/// `initial_state: FILE` or `{file: FILE, duration: DIST}`: the active jobs of a state
/// snapshot (`state export`) as a queue at the start. Their work is drawn from `duration`,
/// by default the run times of the snapshot's succeeded jobs (one hour when there are none).
pub(super) fn read_initial_state(
    c: &mut Checker<'_>,
    node: &Node,
    fleet: &FleetSpec,
    dir: &Dirs,
    unreadable: &mut usize,
) -> Option<LiveQueue> {
    let path = "initial_state";
    let (file_node, duration) = match &node.value {
        Value::Map(_) => {
            let f = c.mapping(node, path, "a state snapshot", &["file", "duration"], &[])?;
            let file = f.required(c, "file", "a state snapshot from `state export`")?;
            let duration = match f.get("duration") {
                Some(n) => Some(read_dist(c, n, f.path("duration"), dir, unreadable)?),
                None => None,
            };
            (file, duration)
        }
        _ => (node, None),
    };
    let file = c.nonempty_string(file_node, path, "a state snapshot file (`state export`)")?;
    let full = dir.join(&file);
    let text = match crate::files::read_text(&full, crate::files::STATE_LIMIT) {
        Ok(text) => text,
        Err(e) => {
            *unreadable += 1;
            c.error(
                file_node,
                path,
                format!("cannot read the state snapshot `{}`: {e}", full.display()),
            );
            return None;
        }
    };
    let state = match crate::engine::state_file::parse(&full.display().to_string(), &text) {
        Ok(state) => state,
        Err(message) => {
            c.error(
                file_node,
                path,
                format!(
                    "`{file}` is not a valid state snapshot:\n{}",
                    message.trim_end()
                ),
            );
            return None;
        }
    };
    let mut active: Vec<&crate::engine::state::Job> = state
        .jobs
        .values()
        .filter(|j| !j.status.is_terminal())
        .collect();
    active.sort_by_key(|j| (j.submitted_at, j.id));
    let jobs = active
        .iter()
        .enumerate()
        .map(|(i, j)| {
            crate::simulate::captured::CapturedJob {
                id: j.id.to_string(),
                // In submission order, a millisecond apart.
                at_secs: i as f64 / 1000.0,
                types: crate::simulate::captured::types_of(&j.spec, fleet),
                regions: j.bucket_regions.iter().map(|b| b.region.clone()).collect(),
                priority: j.spec.priority,
                // Drawn per seed (`LiveQueue::generate`).
                work_secs: 0.0,
                outcome: crate::simulate::captured::Outcome::Unfinished,
                attempts: j.attempts.len() as u32,
                waited_secs: None,
            }
            .arrival()
        })
        .collect();
    let duration = duration.unwrap_or_else(|| {
        let ran: Vec<f64> = state
            .finished
            .values()
            .filter(|j| j.status == crate::engine::state::JobStatus::Succeeded)
            .filter_map(|j| {
                let a = j.attempts.last()?;
                Some(a.ended_at?.secs_since(a.started_at?))
            })
            .filter(|s| *s > 0.0)
            .collect();
        if ran.is_empty() {
            Dist::Constant(3600.0)
        } else {
            Dist::Empirical(ran)
        }
    });
    Some(LiveQueue { jobs, duration })
}

fn read_dist(
    c: &mut Checker<'_>,
    node: &Node,
    path: impl Place,
    dir: &Dirs,
    unreadable: &mut usize,
) -> Option<Dist> {
    let f = c.mapping(
        node,
        path,
        "a distribution",
        &["constant", "exponential", "lognormal", "empirical"],
        &[],
    )?;
    if !f.at_most_one(c, &["constant", "exponential", "lognormal", "empirical"]) {
        return None;
    }
    if let Some(n) = f.get("constant") {
        return c
            .number(n, f.path("constant"), 0.0, 1e9, "seconds")
            .map(Dist::Constant);
    }
    if let Some(n) = f.get("exponential") {
        return c
            .number(n, f.path("exponential"), 0.0, 1e9, "a mean in seconds")
            .map(Dist::Exponential);
    }
    if let Some(n) = f.get("lognormal") {
        let l = c.mapping(
            n,
            f.path("lognormal"),
            "`{median, sigma}`",
            &["median", "sigma"],
            &[],
        )?;
        let median = l
            .required(c, "median", "seconds")
            .and_then(|n| c.number(n, l.path("median"), 0.0, 1e9, "seconds"));
        let sigma = l
            .required(c, "sigma", "a shape")
            .and_then(|n| c.number(n, l.path("sigma"), 0.0, 5.0, "a shape from 0 to 5"));
        return Some(Dist::LogNormal {
            median: median?,
            sigma: sigma?,
        });
    }
    if let Some(n) = f.get("empirical") {
        let e = c.mapping(
            n,
            f.path("empirical"),
            "`{file, column}`",
            &["file", "column"],
            &[],
        )?;
        let file = e
            .required(c, "file", "a CSV file")
            .and_then(|n| c.nonempty_string(n, e.path("file"), "a file path"))?;
        let column = e
            .required(c, "column", "a column name")
            .and_then(|n| c.nonempty_string(n, e.path("column"), "a column name"))?;
        let values: Vec<f64> =
            read_csv_column(c, n, e.path("file"), &dir.join(&file), &column, unreadable)?
                .into_iter()
                .filter(|v| *v > 0.0)
                .collect();
        if values.is_empty() {
            c.error(
                n,
                e.path("column"),
                format!("column `{column}` of `{file}` has no positive value to draw from"),
            );
            return None;
        }
        return Some(Dist::Empirical(values));
    }
    c.expected(
        node,
        path,
        "one of `constant`, `exponential`, `lognormal`, `empirical`",
    );
    None
}

fn read_csv_column(
    c: &mut Checker<'_>,
    node: &Node,
    path: impl Place,
    file: &Path,
    column: &str,
    unreadable: &mut usize,
) -> Option<Vec<f64>> {
    match crate::files::read_text(file, crate::files::DATA_LIMIT) {
        Ok(text) => match read_column(&text, column) {
            Ok(v) => Some(v),
            Err(e) => {
                c.error(node, path, format!("`{}`: {e}", file.display()));
                None
            }
        },
        Err(e) => {
            *unreadable += 1;
            c.error_hint(
                node,
                path,
                format!("cannot read `{}`: {e}", file.display()),
                DATA_HINT,
            );
            None
        }
    }
}

fn read_weights(c: &mut Checker<'_>, node: &Node, path: impl Place) -> Option<Vec<(u32, f64)>> {
    let Value::Map(pairs) = &node.value else {
        c.expected(
            node,
            path,
            "a mapping of widths (chips) to weights, such as `{8: 3, 16: 1}`",
        );
        return None;
    };
    let mut out = Vec::new();
    for (k, v) in pairs {
        let Value::Int(width) = k.value else {
            c.expected(k, path, "a width in chips");
            continue;
        };
        if let Some(w) = c.number(v, &format!("{path}.{width}"), 0.0, 1e9, "a weight") {
            out.push((width as u32, w));
        }
    }
    if out.is_empty() {
        c.expected(node, path, "at least one width");
        return None;
    }
    Some(out)
}

fn read_regions(c: &mut Checker<'_>, node: &Node, path: impl Place) -> Option<Vec<(Regions, f64)>> {
    let items = c.list(node, path, "a list of `{regions: [...], weight: N}`", false)?;
    let mut out = Vec::new();
    for (i, item) in items.iter().enumerate() {
        let p = yaml::index(path, i);
        let Some(f) = c.mapping(item, p, "a region set", &["regions", "weight"], &[]) else {
            continue;
        };
        let regions = f
            .required(c, "regions", "a list of regions")
            .and_then(|n| c.list(n, f.path("regions"), "a non-empty list of regions", false))
            .map(|rs| {
                rs.iter()
                    .enumerate()
                    .filter_map(|(j, r)| {
                        let rp = yaml::index(f.path("regions"), j);
                        let s = c.nonempty_string(r, rp, "a region")?;
                        gcp::check_region(&s)
                            .map_err(|e| c.expected(r, rp, &e))
                            .ok()?;
                        Some(s)
                    })
                    .collect::<Vec<_>>()
            });
        let weight = f.get("weight").map_or(Some(1.0), |n| {
            c.number(n, f.path("weight"), 0.0, 1e9, "a weight")
        });
        if let (Some(r), Some(w)) = (regions, weight) {
            out.push((r.into(), w));
        }
    }
    Some(out)
}

/// Fields every workload reads (see also the kind-specific ones below).
const WORKLOAD_FIELDS: &[&str] = &[
    "kind",
    "name",
    "start_hours",
    "duration",
    "regions",
    "priorities",
    "checkpoint_secs",
    "checkpoint_on_notice",
    "app_failure",
    "infra_failure",
    "setup_failure",
    "min_duration_secs",
    "max_duration_secs",
];

/// Fields only a synthetic workload reads.
const SYNTHETIC_ONLY_FIELDS: &[&str] = &["count", "interarrival", "widths"];

/// Fields only a trace replay reads.
const TRACE_ONLY_FIELDS: &[&str] = &[
    "file",
    "arrival_column",
    "width_column",
    "duration_column",
    "chips_per_unit",
    "time_scale",
    "limit",
];

pub(super) fn read_workloads(
    c: &mut Checker<'_>,
    node: &Node,
    types_by_width: Option<&BTreeMap<u32, Vec<TpuType>>>,
    dir: &Dirs,
    unreadable: &mut usize,
) -> Option<Vec<WorkloadSpec>> {
    let items = c.list(node, "workload", "a non-empty list of workloads", false)?;
    let mut out = Vec::new();
    let mut names = Vec::new();
    for (i, item) in items.iter().enumerate() {
        let path = yaml::index("workload", i);
        let allowed = [WORKLOAD_FIELDS, SYNTHETIC_ONLY_FIELDS, TRACE_ONLY_FIELDS].concat();
        let Some(f) = c.mapping(item, path, "a workload", &allowed, &[]) else {
            continue;
        };
        let kind = f
            .required(c, "kind", "`synthetic`, `trace` or `jobs`")
            .and_then(|n| c.nonempty_string(n, f.path("kind"), "`synthetic`, `trace` or `jobs`"));
        let name = match f.get("name") {
            Some(n) => c
                .nonempty_string(n, f.path("name"), "a name")
                .and_then(|s| {
                    let slug = crate::spec::names::slug(&s);
                    if slug != s {
                        c.error_hint(
                            n,
                            f.path("name"),
                            format!("workload name {} is not a slug", yaml::quote(&s)),
                            format!("use `{slug}` (it prefixes job ids)"),
                        );
                        return None;
                    }
                    Some(s)
                }),
            None => Some(format!("w{i}")),
        };
        let Some(name) = name else { continue };
        names.push((name.clone(), f.node(), format!("{}.name", path)));
        if let Some(other) = kind
            .as_deref()
            .filter(|k| !matches!(*k, "synthetic" | "trace" | "jobs"))
        {
            c.error(
                f.get("kind").expect("present"),
                f.path("kind"),
                format!(
                    "expected `synthetic`, `trace` or `jobs`, found {}",
                    yaml::quote(other)
                ),
            );
            continue;
        }
        if kind.as_deref() == Some("jobs") {
            // A captured job file says everything of each job: nothing else applies.
            for field in allowed
                .iter()
                .filter(|k| !matches!(**k, "kind" | "name" | "file"))
            {
                if let Some(n) = f.get_raw(field) {
                    c.error_hint(
                        n,
                        f.path(field),
                        format!("`{field}` does not apply to a `jobs` workload"),
                        format!("remove `{field}`: each job of the file has its own"),
                    );
                }
            }
            if let Some(jobs) = read_captured_jobs(c, &f, dir, unreadable) {
                out.push(WorkloadSpec::Jobs(jobs));
            }
            continue;
        }
        // Fields of the other kind would be silently ignored: refuse them.
        let other_kind_fields: &[&str] = match kind.as_deref() {
            Some("synthetic") => TRACE_ONLY_FIELDS,
            Some("trace") => SYNTHETIC_ONLY_FIELDS,
            _ => &[],
        };
        for field in other_kind_fields {
            if let Some(n) = f.get_raw(field) {
                c.error_hint(
                    n,
                    f.path(field),
                    format!(
                        "`{field}` does not apply to a `{}` workload",
                        kind.as_deref().unwrap_or_default()
                    ),
                    format!("remove `{field}`"),
                );
            }
        }
        let template = read_template(c, &f, &name, dir, unreadable);
        match kind.as_deref() {
            Some("synthetic") => {
                let Some(t) = template else { continue };
                let unknown: Vec<String> = t
                    .widths
                    .iter()
                    .filter(|(w, weight)| {
                        *weight > 0.0 && types_by_width.is_some_and(|types| !types.contains_key(w))
                    })
                    .map(|(w, _)| w.to_string())
                    .collect();
                if !unknown.is_empty() {
                    c.error_hint(
                        f.get("widths").expect("required by the template"),
                        f.path("widths"),
                        format!(
                            "no `types_by_width` entry for width {}: these jobs could never run",
                            unknown.join(", ")
                        ),
                        "add the width to `types_by_width` or remove it here",
                    );
                    continue;
                }
                out.push(WorkloadSpec::Synthetic(t));
            }
            Some("trace") => {
                let Some(t) = template else { continue };
                let file = f
                    .required(c, "file", "a CSV job trace")
                    .and_then(|n| c.nonempty_string(n, f.path("file"), "a file path"));
                let arrival = f
                    .get("arrival_column")
                    .map_or(Some("arrival_time_s".to_owned()), |n| {
                        c.nonempty_string(n, f.path("arrival_column"), "a column")
                    });
                let width = f
                    .get("width_column")
                    .map_or(Some("scale_factor".to_owned()), |n| {
                        c.nonempty_string(n, f.path("width_column"), "a column")
                    });
                let duration_col = f
                    .get("duration_column")
                    .and_then(|n| c.nonempty_string(n, f.path("duration_column"), "a column"));
                let chips = f.get("chips_per_unit").map_or(Some(1), |n| {
                    c.integer(n, f.path("chips_per_unit"), 1, 4096, "chips per width unit")
                });
                let scale = f.get("time_scale").map_or(Some(1.0), |n| {
                    c.number(n, f.path("time_scale"), 1e-6, 1e6, "a positive factor")
                });
                let limit = f.get("limit").map_or(Some(usize::MAX), |n| {
                    c.integer(n, f.path("limit"), 1, i64::MAX, "a number of jobs")
                        .map(|v| v as usize)
                });
                let (Some(file), Some(arrival), Some(width), Some(chips), Some(scale), Some(limit)) =
                    (file, arrival, width, chips, scale, limit)
                else {
                    continue;
                };
                let full = dir.join(&file);
                let node_file = f.get("file").expect("required");
                let Some(arrivals) =
                    read_csv_column(c, node_file, f.path("file"), &full, &arrival, unreadable)
                else {
                    continue;
                };
                if arrivals.is_empty() {
                    c.error(
                        node_file,
                        f.path("file"),
                        format!("`{file}` has no job rows"),
                    );
                    continue;
                }
                let Some(widths) =
                    read_csv_column(c, node_file, f.path("file"), &full, &width, unreadable)
                else {
                    continue;
                };
                let durations = match duration_col {
                    Some(col) => {
                        read_csv_column(c, node_file, f.path("file"), &full, &col, unreadable)
                    }
                    None => None,
                };
                let duration = t.duration.clone();
                out.push(WorkloadSpec::Trace(TraceReplay {
                    name: name.clone(),
                    arrivals,
                    widths,
                    durations,
                    duration,
                    chips_per_unit: chips as u32,
                    time_scale: scale,
                    limit,
                    regions: t.regions.clone(),
                    template: t,
                }));
            }
            _ => {}
        }
    }
    c.unique(
        names
            .iter()
            .map(|(n, node, p)| (n.clone(), *node, p.clone())),
        "workload name",
    );
    Some(out)
}

/// The arrivals of a `kind: jobs` workload's file (`simulate::captured`'s format).
fn read_captured_jobs(
    c: &mut Checker<'_>,
    f: &Fields<'_>,
    dir: &Dirs,
    unreadable: &mut usize,
) -> Option<Vec<JobArrival>> {
    let node = f.required(c, "file", "a captured job file (JSON lines)")?;
    let file = c.nonempty_string(node, f.path("file"), "a file path")?;
    let full = dir.join(&file);
    let text = match crate::files::read_text(&full, crate::files::DATA_LIMIT) {
        Ok(text) => text,
        Err(e) => {
            *unreadable += 1;
            c.error(
                node,
                f.path("file"),
                format!("cannot read the job file `{}`: {e}", full.display()),
            );
            return None;
        }
    };
    match crate::simulate::captured::parse(&text) {
        Ok(jobs) if jobs.is_empty() => {
            c.error(node, f.path("file"), format!("`{file}` has no jobs"));
            None
        }
        Ok(jobs) => Some(
            jobs.iter()
                .map(crate::simulate::captured::CapturedJob::arrival)
                .collect(),
        ),
        Err((line, why)) => {
            c.error(
                node,
                f.path("file"),
                format!("`{}` line {line}: {why}", full.display()),
            );
            None
        }
    }
}

fn read_template(
    c: &mut Checker<'_>,
    f: &Fields<'_>,
    name: &str,
    dir: &Dirs,
    unreadable: &mut usize,
) -> Option<Synthetic> {
    let is_trace = f.get("kind").and_then(Node::as_str) == Some("trace");
    let count = if is_trace {
        Some(0)
    } else {
        f.required(c, "count", "a number of jobs").and_then(|n| {
            c.integer(n, f.path("count"), 0, 10_000_000, "a number of jobs")
                .map(|v| v as usize)
        })
    };
    let start = f.get("start_hours").map_or(Some(0.0), |n| {
        c.number(n, f.path("start_hours"), 0.0, 1e6, "hours")
    });
    let interarrival = match f.get("interarrival") {
        Some(n) => read_dist(c, n, f.path("interarrival"), dir, unreadable),
        None => Some(Dist::Constant(0.0)),
    };
    let duration = if is_trace && f.get("duration").is_none() {
        Some(Dist::Constant(3600.0))
    } else {
        f.required(c, "duration", "a distribution of work seconds")
            .and_then(|n| read_dist(c, n, f.path("duration"), dir, unreadable))
    };
    let widths = if is_trace {
        Some(vec![(0, 1.0)])
    } else {
        f.required(c, "widths", "widths in chips with weights")
            .and_then(|n| read_weights(c, n, f.path("widths")))
    };
    let regions = f
        .required(c, "regions", "region sets with weights")
        .and_then(|n| read_regions(c, n, f.path("regions")));
    let priorities = match f.get("priorities") {
        Some(n) => c
            .mapping(
                n,
                f.path("priorities"),
                "weights `{low, normal, high}`",
                &["low", "normal", "high"],
                &[],
            )
            .and_then(|p| {
                let mut w = [0.0; 3];
                for (i, k) in ["low", "normal", "high"].iter().enumerate() {
                    w[i] = p
                        .get(k)
                        .map_or(Some(0.0), |n| c.number(n, p.path(k), 0.0, 1e9, "a weight"))?;
                }
                if w.iter().sum::<f64>() <= 0.0 {
                    c.error(
                        n,
                        f.path("priorities"),
                        "at least one priority needs a positive weight",
                    );
                    return None;
                }
                Some(w)
            }),
        None => Some([0.0, 1.0, 0.0]),
    };
    let checkpoint = f.get("checkpoint_secs").map_or(Some(0.0), |n| {
        c.number(
            n,
            f.path("checkpoint_secs"),
            0.0,
            1e7,
            "seconds, 0 for none",
        )
    });
    let on_notice = f.get("checkpoint_on_notice").map_or(Some(false), |n| {
        c.boolean(n, f.path("checkpoint_on_notice"))
    });
    let min = f.get("min_duration_secs").map_or(Some(60.0), |n| {
        c.number(n, f.path("min_duration_secs"), 0.0, 1e9, "seconds")
    });
    let max = f
        .get("max_duration_secs")
        .map_or(Some(30.0 * 86400.0), |n| {
            c.number(n, f.path("max_duration_secs"), 0.0, 1e9, "seconds")
        });
    let (min, max) = duration_limits(c, f, min, max);
    Some(Synthetic {
        name: name.to_owned(),
        count: count?,
        start_secs: start? * 3600.0,
        interarrival: interarrival?,
        duration: duration?,
        widths: widths?,
        regions: regions?,
        priorities: priorities?,
        checkpoint_secs: checkpoint?,
        checkpoint_on_notice: on_notice?,
        app_failure: probability(c, f, "app_failure")?,
        infra_failure: probability(c, f, "infra_failure")?,
        setup_failure: probability(c, f, "setup_failure")?,
        min_duration_secs: min?,
        max_duration_secs: max?,
    })
}

/// The duration limits, or an error at the one given when the minimum exceeds the maximum.
fn duration_limits(
    c: &mut Checker<'_>,
    f: &yaml::Fields<'_>,
    min: Option<f64>,
    max: Option<f64>,
) -> (Option<f64>, Option<f64>) {
    if let (Some(lo), Some(hi)) = (min, max)
        && lo > hi
    {
        let default = |name: &str| match f.get(name) {
            Some(_) => "",
            None => ", its default",
        };
        let (key, message) = match f.get("max_duration_secs") {
            Some(_) => (
                "max_duration_secs",
                format!(
                    "must be at least `min_duration_secs` ({lo} s{})",
                    default("min_duration_secs")
                ),
            ),
            None => (
                "min_duration_secs",
                format!(
                    "must be at most `max_duration_secs` ({hi} s{})",
                    default("max_duration_secs")
                ),
            ),
        };
        if let Some(node) = f.get(key) {
            c.error(node, f.path(key), message);
        }
        return (None, None);
    }
    (min, max)
}
