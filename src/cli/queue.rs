//! `status`: the queue and the history. The queue is every active run in the order the
//! controller serves it (running first, then pending by priority, most-constrained, FIFO),
//! each waiting run with why (the reasons `plan` gives, from the engine's `explain` on the
//! same pass the controller would make now); the history is the runs that ended, latest
//! first, with how long they waited and ran, how they ended and their exit code. Reads the
//! store; decides nothing.

use serde::Serialize;
use serde_json::json;

use super::exit_codes::ExitStatus;
use super::stack::{Stack, StackOpts};
use super::state::store_failure;
use super::{Failure, print_stdout, table};
use crate::controller::wall_clock;
use crate::engine::explain::Reason;
use crate::engine::state::{Job, JobStatus, State};
use crate::engine::{Engine, Timestamp};
use crate::spec::Priority;

/// What `status` shows.
pub(crate) struct StatusArgs<'a> {
    /// Also the runs that ended (since `since`, else the last 7 days).
    pub all: bool,
    /// Finished runs ended at or after this.
    pub since: Option<Timestamp>,
    /// Only runs in these states (`pending`, `running`, `cancelling`, `succeeded`,
    /// `failed`, `cancelled`).
    pub states: &'a [String],
    /// Only runs of this job name (or this run id).
    pub name: Option<&'a str>,
    /// Only runs of this priority.
    pub priority: Option<Priority>,
    /// At most this many rows per table (0: all).
    pub limit: usize,
    /// JSON instead of tables.
    pub json: bool,
}

/// One active run in queue order.
#[derive(Serialize)]
struct QueueRow<'a> {
    #[serde(skip)]
    job: &'a Job,
    /// 1-based place among the waiting runs (running ones have none).
    position: Option<usize>,
    job_id: &'a str,
    name: &'a str,
    status: &'static str,
    priority: Priority,
    submitted_at: Timestamp,
    /// Where it runs (TPU, zone) or is placed (region).
    tpu_name: Option<&'a str>,
    zone: Option<&'a str>,
    region: Option<&'a str>,
    attempts: usize,
    /// Interruptions (preemptions, maintenance) it came back from.
    recoveries: u32,
    /// Why it waits (sentences), most important first.
    waiting: Vec<String>,
    /// The same as codes.
    codes: Vec<Reason>,
}

/// One finished run.
#[derive(Serialize)]
struct HistoryRow<'a> {
    job_id: &'a str,
    name: &'a str,
    status: &'static str,
    priority: Priority,
    submitted_at: Timestamp,
    started_at: Option<Timestamp>,
    ended_at: Option<Timestamp>,
    /// Seconds from submission to the first start.
    waited_secs: Option<f64>,
    /// Seconds from the first start to the end.
    ran_secs: Option<f64>,
    attempts: usize,
    recoveries: u32,
    /// The last attempt's exit code.
    exit_code: Option<i32>,
    /// Why it ended (the record's end reason, else the last attempt's).
    end_reason: String,
}

/// `status --json`: fields in name order (what the document always had).
#[derive(Serialize)]
struct StatusDoc<'a> {
    fleet: serde_json::Value,
    generated_at: Timestamp,
    #[serde(skip_serializing_if = "Option::is_none")]
    history: Option<Listed<'a, HistoryRow<'a>>>,
    interruption_requests: Vec<&'a crate::engine::state::InterruptionRequest>,
    jobs: Counted<'a, &'a Job>,
    queue: Listed<'a, QueueRow<'a>>,
    resources: Counted<'a, &'a crate::engine::state::Resource>,
    schema_version: u32,
    store: String,
}

/// A page of rows and how many more matched.
#[derive(Serialize)]
struct Listed<'a, T> {
    items: &'a [T],
    more: usize,
}

/// Counts by status and the items.
#[derive(Serialize)]
struct Counted<'a, T> {
    counts: std::collections::BTreeMap<&'a str, usize>,
    items: Vec<T>,
}

fn wanted(job: &Job, args: &StatusArgs<'_>) -> bool {
    (args.states.is_empty()
        || args
            .states
            .iter()
            .any(|s| s == job.status.word() || s == job.status.as_str()))
        && args
            .name
            .is_none_or(|n| job.spec.name() == n || job.id.as_str() == n)
        && args.priority.is_none_or(|p| job.spec.priority == p)
}

/// The first `limit` (0: all) active runs `shown` keeps, in queue order, with the waiting
/// ones' reasons (the engine's), and how many more matched.
fn queue<'s>(
    stack: &Stack,
    state: &'s State,
    now: Timestamp,
    shown: impl Fn(&Job) -> bool,
    limit: usize,
) -> (Vec<QueueRow<'s>>, usize) {
    let engine = Engine::with_policy(stack.fleet.policy.clone(), stack.fleet.clone());
    let page = crate::engine::explain::queue(&engine, state, now, shown, limit);
    let rows = page
        .rows
        .into_iter()
        .map(|q| {
            let job = q.job;
            let attempt = job.attempt().filter(|a| !a.status.is_terminal());
            let (waiting, codes) = match q.why {
                Some(e) => (
                    e.reasons().map(str::to_owned).collect(),
                    e.codes().cloned().collect(),
                ),
                None if job.status == JobStatus::Pending => (
                    vec!["a compatible TPU is free: the controller's next pass starts it".into()],
                    Vec::new(),
                ),
                None => (Vec::new(), Vec::new()),
            };
            QueueRow {
                job,
                position: q.position,
                job_id: job.id.as_str(),
                name: job.spec.name(),
                status: job.status.word(),
                priority: job.spec.priority,
                submitted_at: job.submitted_at,
                tpu_name: attempt.map(|a| a.tpu_name.as_str()),
                zone: attempt.map(|a| a.zone.as_str()),
                region: job.placement.as_ref().map(|p| p.region.as_str()),
                attempts: job.attempts.len(),
                recoveries: job.interruptions,
                waiting,
                codes,
            }
        })
        .collect();
    (rows, page.more)
}

/// The first `limit` runs of the queue as JSON (the dashboard's).
pub(crate) fn queue_json(
    stack: &Stack,
    state: &State,
    now: Timestamp,
    limit: usize,
) -> serde_json::Value {
    let (rows, more) = queue(stack, state, now, |_| true, limit);
    json!({"items": rows, "more": more})
}

/// A finished run as JSON (the dashboard's history).
pub(crate) fn history_json(job: &Job) -> serde_json::Value {
    serde_json::to_value(history(job)).unwrap_or_default()
}

/// Why the pending run `id` waits now (the reasons `status` gives it), if it is pending.
pub(crate) fn waiting_reasons(
    stack: &Stack,
    state: &State,
    id: &crate::spec::Name,
    now: Timestamp,
) -> Option<Vec<String>> {
    let (rows, _) = queue(stack, state, now, |j| j.id == *id, 1);
    rows.into_iter()
        .next()
        .map(|r| r.waiting)
        .filter(|w| !w.is_empty())
}

fn history(job: &Job) -> HistoryRow<'_> {
    let started = job.attempts.iter().filter_map(|a| a.started_at).min();
    let last = job.attempts.last();
    HistoryRow {
        job_id: job.id.as_str(),
        name: job.spec.name(),
        status: job.status.word(),
        priority: job.spec.priority,
        submitted_at: job.submitted_at,
        started_at: started,
        ended_at: job.ended_at,
        waited_secs: started.map(|s| s.secs_since(job.submitted_at).max(0.0)),
        ran_secs: started
            .zip(job.ended_at)
            .map(|(s, e)| e.secs_since(s).max(0.0)),
        attempts: job.attempts.len(),
        recoveries: job.interruptions,
        exit_code: last.and_then(|a| a.exit_code),
        end_reason: job
            .end_reason
            .clone()
            .filter(|r| !r.is_empty())
            .or_else(|| {
                last.map(|a| a.error_summary.clone())
                    .filter(|e| !e.is_empty())
            })
            .unwrap_or_default(),
    }
}

/// A duration in a few characters: `45s`, `12m`, `3.5h`, `2d`.
fn short_duration(secs: f64) -> String {
    let secs = secs.max(0.0);
    match secs {
        s if s < 120.0 => format!("{}s", s as u64),
        s if s < 7200.0 => format!("{}m", (s / 60.0) as u64),
        s if s < 172_800.0 => format!("{:.1}h", s / 3600.0),
        s => format!("{}d", (s / 86_400.0) as u64),
    }
}

fn take<T>(rows: Vec<T>, limit: usize) -> (Vec<T>, usize) {
    if limit == 0 || rows.len() <= limit {
        return (rows, 0);
    }
    let more = rows.len() - limit;
    let mut rows = rows;
    rows.truncate(limit);
    (rows, more)
}

/// `status`.
pub(crate) fn status(opts: &StackOpts, args: &StatusArgs<'_>) -> Result<ExitStatus, Failure> {
    for s in args.states {
        if ![
            "pending",
            "running",
            "cancelling",
            "succeeded",
            "failed",
            "cancelled",
            "deactivated",
        ]
        .contains(&s.as_str())
        {
            return Err(Failure {
                message: format!(
                    "error: --state {s}: expected pending, running, cancelling, succeeded, failed or cancelled\n"
                ),
                status: ExitStatus::Usage,
            });
        }
    }
    let stack = Stack::resolve(opts)?;
    let mut store = stack.open_store(false)?;
    let state = store.load_active().map_err(|e| store_failure(&e))?.state;
    let now = wall_clock();
    let (rows, more_active) = queue(&stack, &state, now, |j| wanted(j, args), args.limit);
    let finished: Vec<Job> = if args.all || args.since.is_some() {
        let since = args.since.unwrap_or_else(|| now.plus_secs(-7 * 86_400));
        // Filters apply after the read: read a page beyond the limit's worth.
        let want = if args.limit == 0 {
            usize::MAX
        } else {
            args.limit.saturating_mul(20).max(1000)
        };
        store
            .latest_finished(since, want)
            .map_err(|e| store_failure(&e))?
            .into_iter()
            .filter(|j| wanted(j, args))
            .collect()
    } else {
        Vec::new()
    };
    let done: Vec<HistoryRow<'_>> = finished.iter().map(history).collect();
    let (done, more_done) = take(done, args.limit);
    if args.json {
        let mut job_counts = std::collections::BTreeMap::<&str, usize>::new();
        for j in state.jobs.values() {
            *job_counts.entry(j.status.as_str()).or_default() += 1;
        }
        let mut tpu_counts = std::collections::BTreeMap::<&str, usize>::new();
        let mut per_entry = std::collections::HashMap::<&str, usize>::new();
        for r in state.resources.values() {
            *tpu_counts.entry(r.shown_status()).or_default() += 1;
            *per_entry.entry(r.entry_id.as_str()).or_default() += 1;
        }
        let entries: Vec<_> = stack
            .fleet
            .tpus
            .iter()
            .map(|e| {
                json!({
                    "id": e.id.as_str(),
                    "type": e.tpu_type.to_string(),
                    "zone": e.zone.as_str(),
                    "adopted": e.is_adopted(),
                    "ceiling_count": e.ceiling(),
                    "keep_warm_count": e.keep_warm_count,
                    "records": per_entry.get(e.id.as_str()).copied().unwrap_or(0),
                })
            })
            .collect();
        let doc = StatusDoc {
            fleet: json!({"name": stack.fleet.name, "project": stack.fleet.project, "idle_timeout_seconds": stack.fleet.idle_timeout_seconds, "entries": entries}),
            generated_at: now,
            history: (args.all || args.since.is_some()).then_some(Listed {
                items: &done,
                more: more_done,
            }),
            interruption_requests: state.interruption_requests.values().collect(),
            jobs: Counted {
                counts: job_counts,
                items: rows.iter().map(|r| r.job).collect(),
            },
            queue: Listed {
                items: &rows,
                more: more_active,
            },
            resources: Counted {
                counts: tpu_counts,
                items: state.resources.values().collect(),
            },
            schema_version: crate::engine::state::SCHEMA_VERSION,
            store: store.describe(),
        };
        // Streamed: 100k runs are hundreds of megabytes of JSON, never held whole.
        use std::io::Write as _;
        let mut out = std::io::BufWriter::new(std::io::stdout().lock());
        let _ = serde_json::to_writer(&mut out, &doc)
            .map_err(std::io::Error::from)
            .and_then(|()| out.write_all(b"\n"))
            .and_then(|()| out.flush());
        return Ok(ExitStatus::Ok);
    }
    let running = state
        .jobs
        .values()
        .filter(|j| j.status != JobStatus::Pending)
        .count();
    let mut text = format!(
        "{} ({}): {} active run{}, {running} running, {} waiting\n",
        stack.fleet.name,
        store.describe(),
        state.jobs.len(),
        if state.jobs.len() == 1 { "" } else { "s" },
        state.jobs.len() - running,
    );
    if rows.is_empty() {
        text.push_str("  no active runs match\n");
    } else {
        let table_rows: Vec<Vec<String>> = rows
            .iter()
            .map(|r| {
                vec![
                    r.position.map_or("-".into(), |p| p.to_string()),
                    r.job_id.into(),
                    r.name.into(),
                    r.status.into(),
                    r.priority.as_str().into(),
                    short_duration(now.secs_since(r.submitted_at)),
                    match (r.tpu_name, r.zone, r.region) {
                        (Some(t), Some(z), _) => format!("{t} ({z})"),
                        (_, _, Some(region)) => region.into(),
                        _ => "-".into(),
                    },
                    r.attempts.to_string(),
                    r.recoveries.to_string(),
                    r.waiting.first().cloned().unwrap_or_else(|| "-".into()),
                ]
            })
            .collect();
        text.push_str(&table(
            &[
                "#",
                "RUN",
                "NAME",
                "STATE",
                "PRIORITY",
                "AGE",
                "WHERE",
                "ATTEMPTS",
                "RECOVERED",
                "WAITING BECAUSE",
            ],
            &table_rows,
        ));
        if more_active > 0 {
            text.push_str(&format!(
                "  … and {more_active} more active runs (--limit 0 shows all)\n"
            ));
        }
    }
    if args.all || args.since.is_some() {
        text.push_str(&format!("\nfinished ({}):\n", done.len() + more_done));
        if done.is_empty() {
            text.push_str("  none in this window\n");
        } else {
            let table_rows: Vec<Vec<String>> = done
                .iter()
                .map(|h| {
                    vec![
                        h.job_id.into(),
                        h.name.into(),
                        h.status.into(),
                        h.ended_at.map_or("-".into(), |e| {
                            format!("{} ago", short_duration(now.secs_since(e)))
                        }),
                        h.waited_secs.map_or("-".into(), short_duration),
                        h.ran_secs.map_or("-".into(), short_duration),
                        h.attempts.to_string(),
                        h.exit_code.map_or("-".into(), |c| c.to_string()),
                        if h.end_reason.is_empty() {
                            "-".into()
                        } else {
                            h.end_reason.clone()
                        },
                    ]
                })
                .collect();
            text.push_str(&table(
                &[
                    "RUN", "NAME", "STATE", "ENDED", "WAITED", "RAN", "ATTEMPTS", "EXIT", "REASON",
                ],
                &table_rows,
            ));
            if more_done > 0 {
                text.push_str(&format!(
                    "  … and {more_done} more (--limit 0 shows all, --since narrows)\n"
                ));
            }
        }
    }
    // The TPUs one by one, or, past the row limit, counted by zone, type and status.
    if args.limit != 0 && state.resources.len() > args.limit {
        let mut counts: std::collections::BTreeMap<(&str, String, &str), usize> =
            Default::default();
        for r in state.resources.values() {
            *counts
                .entry((r.zone.as_str(), r.tpu_type.to_string(), r.shown_status()))
                .or_default() += 1;
        }
        let rows: Vec<Vec<String>> = counts
            .into_iter()
            .map(|((zone, tpu_type, status), n)| {
                vec![zone.into(), tpu_type, status.into(), n.to_string()]
            })
            .collect();
        text.push_str(&format!(
            "\n{} TPUs (--limit 0 lists each):\n",
            state.resources.len()
        ));
        text.push_str(&table(&["ZONE", "TYPE", "STATUS", "TPUS"], &rows));
    } else if !state.resources.is_empty() {
        let tpus: Vec<Vec<String>> = state
            .resources
            .values()
            .map(|r| {
                vec![
                    r.tpu_name.to_string(),
                    r.zone.to_string(),
                    r.tpu_type.to_string(),
                    match r.waiting_for_capacity_since() {
                        Some(since) => format!(
                            "waiting for capacity ({})",
                            short_duration(now.secs_since(since))
                        ),
                        None => r.status.as_str().into(),
                    },
                    r.owner
                        .as_ref()
                        .map_or("-".into(), |o| o.job_id.to_string()),
                ]
            })
            .collect();
        text.push('\n');
        text.push_str(&table(&["TPU", "ZONE", "TYPE", "STATUS", "RUN"], &tpus));
    }
    print_stdout(&text);
    Ok(ExitStatus::Ok)
}
