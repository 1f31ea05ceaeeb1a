//! `watch` and `logs`: following a run. `watch` prints every event the store recorded for
//! it (submitted, assigned, started, interrupted and requeued, ended), each with its time,
//! why it waits while it waits, and its workers' new output lines; `logs` prints its
//! attempts' output (`--attempt`, `--tail`, `--follow`). Logs are read by ranged reads
//! from where the last read stopped, so a poll costs what a log grew. Reads only.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use serde_json::json;

use super::exit_codes::ExitStatus;
use super::jobs::{resolve, resolve_one};
use super::stack::{Stack, StackOpts};
use super::state::store_failure;
use super::{Failure, print_stdout};
use crate::controller::wall_clock;
use crate::engine::Timestamp;
use crate::engine::observe::Event;
use crate::engine::state::{Job, JobStatus};
use crate::objects::ObjectStore;
use crate::spec::Name;
use crate::store::StateStore;

/// Bytes read from a log per request.
const CHUNK: u64 = 4 << 20;

/// One worker's log of one attempt, read up to `offset`.
struct Log {
    attempt: String,
    host: String,
    offset: u64,
    /// The end of the log that is not a whole line yet.
    partial: Vec<u8>,
}

/// One output line.
pub(crate) struct Line {
    pub attempt: String,
    pub host: String,
    pub uri: String,
    pub text: String,
}

/// The logs of a run's attempts, followed by ranged reads.
#[derive(Default)]
pub(crate) struct Logs {
    /// By (attempt number, address): output in attempt order.
    known: BTreeMap<(usize, String), Log>,
}

impl Logs {
    /// Finds the log objects of `job`'s attempts (`only`: that attempt's), reads what each
    /// grew since the last call, and returns the whole lines (with `flush`, the unfinished
    /// last line too: the run has ended).
    pub fn poll(
        &mut self,
        objects: &dyn ObjectStore,
        job: &Job,
        only: Option<&str>,
        flush: bool,
    ) -> Result<Vec<Line>, crate::objects::ObjectError> {
        let Some(bucket) = job.placement.as_ref().map(|p| p.bucket.to_string()) else {
            return Ok(Vec::new());
        };
        let attempts = job.attempts.iter().enumerate();
        for (k, a) in attempts.filter(|(_, a)| only.is_none_or(|o| a.id.as_str() == o)) {
            let prefix = crate::worker::attempt_prefix(&bucket, job.id.as_str(), a.id.as_str());
            let (b, _) = crate::objects::split(&prefix).unwrap_or(("", ""));
            for o in objects.list(&format!("{prefix}logs/"))? {
                let uri = format!("gs://{b}/{}", o.name);
                let host = o
                    .name
                    .rsplit('/')
                    .next()
                    .and_then(|f| f.strip_suffix(".log"))
                    .unwrap_or("")
                    .to_owned();
                self.known.entry((k, uri)).or_insert_with(|| Log {
                    attempt: a.id.to_string(),
                    host,
                    offset: 0,
                    partial: Vec::new(),
                });
            }
        }
        let mut lines = Vec::new();
        for ((_, uri), log) in &mut self.known {
            while let Some(data) = objects.get_from(uri, log.offset, CHUNK)? {
                log.offset += data.len() as u64;
                log.partial.extend_from_slice(&data);
                if (data.len() as u64) < CHUNK {
                    break;
                }
            }
            let mut push = |bytes: &[u8]| {
                lines.push(Line {
                    attempt: log.attempt.clone(),
                    host: log.host.clone(),
                    uri: uri.clone(),
                    text: String::from_utf8_lossy(bytes).into_owned(),
                });
            };
            if let Some(end) = log.partial.iter().rposition(|&b| b == b'\n') {
                let whole: Vec<u8> = log.partial.drain(..=end).collect();
                for l in whole[..end].split(|&b| b == b'\n') {
                    push(l);
                }
            }
            if flush && !log.partial.is_empty() {
                let rest = std::mem::take(&mut log.partial);
                push(&rest);
            }
        }
        Ok(lines)
    }
}

/// A time as a person reads it in a log: `2026-12-05 08:17:59Z`.
fn clock(at: Timestamp) -> String {
    let text = at.to_string();
    let text = text.split('.').next().unwrap_or(&text);
    format!("{}Z", text.trim_end_matches('Z').replacen('T', " ", 1))
}

/// What an event says about a run, in words.
pub(crate) fn sentence(e: &Event) -> String {
    let attempt = e.attempt_id.map(|a| a.to_string()).unwrap_or_default();
    let tpu = e.resource_id.map(|r| r.to_string()).unwrap_or_default();
    let detail = if e.detail.is_empty() {
        String::new()
    } else {
        format!(" ({})", e.detail)
    };
    match e.kind.as_str() {
        "job_created" => "submitted".into(),
        "job_assigned" => format!("assigned to TPU {tpu}: attempt {attempt} launching"),
        "distributed_job_launched" => format!("attempt {attempt} started{detail}"),
        "job_interrupted" => format!("attempt {attempt} interrupted on {tpu}{detail}"),
        "job_succeeded" => format!("succeeded (attempt {attempt})"),
        "job_failed" => format!("failed{detail}"),
        "job_cancelled" => format!("cancelled{detail}"),
        "cancel_requested" if e.detail == "status=deactivated" => {
            "cancelled (it had not started)".into()
        }
        "cancel_requested" => "cancel requested: its workers are being stopped".into(),
        "pending_job_reprioritized" => format!("priority changed{detail}"),
        "job_moved" => format!("moved to another region{detail}"),
        "job_displaced" => format!("attempt {attempt} stopped for a higher-priority job{detail}"),
        "job_displacing" => format!("a lower-priority job is being stopped to free a TPU{detail}"),
        "controlled_interruption_attempt_stopping" => {
            format!("interrupt-spot: attempt {attempt} is stopping (its command has the notice)")
        }
        "controlled_interruption_deletion_requested" => {
            format!("interrupt-spot: TPU {tpu} is being deleted")
        }
        "controlled_interruption_attempt_requeued" => {
            format!("attempt {attempt} interrupted (interrupt-spot); requeued in its region")
        }
        other => format!("{}{detail}", other.replace('_', " ")),
    }
}

/// `watch`: the run's events as they are recorded, why it waits while it waits, and its
/// output lines, until it ends; exit 0 when it succeeded, 1 otherwise, 130 on Ctrl-C.
pub(crate) fn watch(
    opts: &StackOpts,
    what: &str,
    interval: Duration,
    json: bool,
) -> Result<ExitStatus, Failure> {
    let stack = Stack::resolve(opts)?;
    let mut store = stack.open_store(false)?;
    let objects = stack.objects()?;
    let interrupted = super::interrupt_flag();
    let id = match resolve(store.as_mut(), what)? {
        Ok(id) => id,
        Err(message) => {
            if json {
                eprintln!(
                    "{}",
                    json!({"event": "error", "error": "unknown job", "job_id": what, "message": message})
                );
            } else {
                eprintln!("error: {message}");
            }
            return Ok(ExitStatus::Invalid);
        }
    };
    let mut seen = 0u64;
    let mut logs = Logs::default();
    let mut waiting_shown = String::new();
    let mut last_explained: Option<Instant> = None;
    let mut mirror = crate::store::changes::Mirror::default();
    loop {
        // Events first, then the record: an event is never missed for a record that ended.
        let events = read_events(store.as_mut(), &id, &mut seen)?;
        let Some(job) = store.job(&id).map_err(|e| store_failure(&e))? else {
            eprintln!("error: {id}: the run is gone from the store");
            return Ok(ExitStatus::Invalid);
        };
        for (_, e) in &events {
            if json {
                print_stdout(&format!(
                    "{}\n",
                    json!({"event": "state", "job_id": id.as_str(), "at": e.at, "kind": e.kind, "attempt_id": e.attempt_id, "resource_id": e.resource_id, "detail": e.detail, "text": sentence(e)})
                ));
            } else {
                print_stdout(&format!("{} {id}: {}\n", clock(e.at), sentence(e)));
            }
            if e.kind != "job_created" {
                waiting_shown.clear();
            }
        }
        // While it waits, why (recomputed every 10 s at most: it plans the whole queue, read
        // once and then followed by what changed).
        if job.status == JobStatus::Pending
            && last_explained.is_none_or(|t| t.elapsed() >= Duration::from_secs(10))
        {
            last_explained = Some(Instant::now());
            if let Some(reasons) = waiting(&stack, store.as_mut(), &mut mirror, &id)?
                && reasons.first().is_some_and(|r| *r != waiting_shown)
            {
                waiting_shown = reasons[0].clone();
                if json {
                    print_stdout(&format!(
                        "{}\n",
                        json!({"event": "waiting", "job_id": id.as_str(), "at": wall_clock(), "reasons": reasons})
                    ));
                } else {
                    print_stdout(&format!(
                        "{} {id}: waiting: {}\n",
                        clock(wall_clock()),
                        reasons.join("; ")
                    ));
                }
            }
        }
        let ended = job.status.is_terminal();
        match logs.poll(objects.as_ref(), &job, None, ended) {
            Ok(lines) => print_lines(&lines, id.as_str(), json, false),
            Err(e) => eprintln!("log retrieval failed: {e}"),
        }
        if ended {
            if let Some(p) = &job.placement {
                let uri = format!("{}/jobs/{id}", p.bucket);
                if json {
                    print_stdout(&format!(
                        "{}\n",
                        json!({"event": "artifacts", "job_id": id.as_str(), "uri": uri})
                    ));
                } else {
                    print_stdout(&format!(
                        "{} {id}: artifacts in {uri}\n",
                        clock(wall_clock())
                    ));
                }
            }
            return Ok(if job.status == JobStatus::Succeeded {
                ExitStatus::Ok
            } else {
                ExitStatus::Invalid
            });
        }
        if sleep(interval, &interrupted) {
            return Ok(ExitStatus::Interrupted);
        }
    }
}

/// The events of `id` after `seen` (all of them, in pages), moving `seen` on.
fn read_events(
    store: &mut dyn StateStore,
    id: &Name,
    seen: &mut u64,
) -> Result<Vec<(u64, Event)>, Failure> {
    let mut out = Vec::new();
    loop {
        let page = store
            .job_events(id, *seen, 500)
            .map_err(|e| store_failure(&e))?;
        let full = page.len() == 500;
        if let Some((seq, _)) = page.last() {
            *seen = (*seen).max(*seq);
        }
        out.extend(page);
        if !full {
            return Ok(out);
        }
    }
}

/// Why `id` waits now, as `status` says it (`mirror` follows the store: each call reads what
/// was written since the last).
fn waiting(
    stack: &Stack,
    store: &mut dyn StateStore,
    mirror: &mut crate::store::changes::Mirror,
    id: &Name,
) -> Result<Option<Vec<String>>, Failure> {
    let state = mirror.refresh(store).map_err(|e| store_failure(&e))?;
    Ok(super::queue::waiting_reasons(
        stack,
        state,
        id,
        wall_clock(),
    ))
}

/// Sleeps `interval`; true when Ctrl-C came.
fn sleep(interval: Duration, interrupted: &std::sync::atomic::AtomicBool) -> bool {
    let until = Instant::now() + interval;
    while Instant::now() < until {
        if interrupted.load(Ordering::SeqCst) {
            return true;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    interrupted.load(Ordering::SeqCst)
}

fn print_lines(lines: &[Line], id: &str, json: bool, with_attempt: bool) {
    let mut text = String::new();
    for l in lines {
        if json {
            text.push_str(&format!(
                "{}\n",
                json!({"event": "log", "job_id": id, "attempt_id": l.attempt, "worker": l.host, "uri": l.uri, "line": l.text})
            ));
        } else if with_attempt {
            text.push_str(&format!("[{} {}] {}\n", l.attempt, l.host, l.text));
        } else {
            text.push_str(&format!("[{}] {}\n", l.host, l.text));
        }
    }
    print_stdout(&text);
}

/// What `logs` is asked.
pub(crate) struct LogsArgs<'a> {
    pub job: &'a str,
    /// An attempt id, or its 1-based number.
    pub attempt: Option<&'a str>,
    /// Only the last N lines of each log (then, with `follow`, what follows).
    pub tail: Option<usize>,
    pub follow: bool,
    pub interval: Duration,
    pub json: bool,
}

/// `logs`: each attempt's result and its workers' output; `--follow` until the run ends.
pub(crate) fn logs(opts: &StackOpts, args: &LogsArgs<'_>) -> Result<ExitStatus, Failure> {
    let stack = Stack::resolve(opts)?;
    let mut store = stack.open_store(false)?;
    let objects = stack.objects()?;
    let id = resolve_one(store.as_mut(), args.job)?;
    let read = |store: &mut Box<dyn StateStore>| -> Result<Job, Failure> {
        store
            .job(&id)
            .map_err(|e| store_failure(&e))?
            .ok_or_else(|| Failure {
                message: format!("error: {id}: the run is gone from the store\n"),
                status: ExitStatus::Invalid,
            })
    };
    let job = read(&mut store)?;
    let only: Option<String> = match args.attempt {
        None => None,
        Some(a) => {
            let by_number = a
                .parse::<usize>()
                .ok()
                .and_then(|n| n.checked_sub(1))
                .and_then(|k| job.attempts.get(k));
            match by_number.or_else(|| job.attempts.iter().find(|x| x.id.as_str() == a)) {
                Some(found) => Some(found.id.to_string()),
                None => {
                    return Err(Failure {
                        message: format!(
                            "error: {id} has no attempt {a} (it has {}: give a number from 1 or an id)\n",
                            job.attempts.len()
                        ),
                        status: ExitStatus::Invalid,
                    });
                }
            }
        }
    };
    let mut text = String::new();
    for (k, a) in job.attempts.iter().enumerate() {
        if only.as_deref().is_some_and(|o| o != a.id.as_str()) {
            continue;
        }
        if args.json {
            text.push_str(&format!(
                "{}\n",
                json!({"event": "attempt", "job_id": id.as_str(), "number": k + 1, "attempt_id": a.id.as_str(), "status": a.status.as_str(), "exit_code": a.exit_code, "error": a.error_summary, "tpu_name": a.tpu_name.as_str(), "zone": a.zone.as_str()})
            ));
            continue;
        }
        text.push_str(&format!(
            "[{}] attempt {} status={}",
            a.id,
            k + 1,
            a.status.as_str()
        ));
        if let Some(code) = a.exit_code {
            text.push_str(&format!(" exit_code={code}"));
        }
        if !a.error_summary.is_empty() {
            text.push_str(&format!(" error={}", a.error_summary));
        }
        text.push('\n');
    }
    print_stdout(&text);
    let mut follower = Logs::default();
    let interrupted = super::interrupt_flag();
    let mut first = true;
    let mut any = false;
    let mut job = job;
    loop {
        let ended = job.status.is_terminal();
        let mut lines = match follower.poll(
            objects.as_ref(),
            &job,
            only.as_deref(),
            ended || !args.follow,
        ) {
            Ok(lines) => lines,
            Err(e) => {
                eprintln!("log retrieval failed: {e}");
                return Ok(ExitStatus::Invalid);
            }
        };
        if first && let Some(n) = args.tail {
            // The last `n` lines of each log.
            let mut by_log: BTreeMap<String, Vec<Line>> = BTreeMap::new();
            for l in lines {
                by_log.entry(l.uri.clone()).or_default().push(l);
            }
            lines = by_log
                .into_values()
                .flat_map(|mut v| v.split_off(v.len().saturating_sub(n)))
                .collect();
        }
        first = false;
        any |= !lines.is_empty();
        print_lines(&lines, id.as_str(), args.json, true);
        if !args.follow || ended {
            break;
        }
        if sleep(args.interval, &interrupted) {
            return Ok(ExitStatus::Interrupted);
        }
        job = read(&mut store)?;
    }
    if !any && !args.json {
        eprintln!(
            "{id}: no output yet ({})",
            if job.attempts.is_empty() {
                "it has not started"
            } else {
                "its workers have not shipped any"
            }
        );
    }
    Ok(ExitStatus::Ok)
}
