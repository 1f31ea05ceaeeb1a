//! `plan`: one reconcile pass on a state snapshot, without touching any cloud. Prints the
//! decisions (actions, events) and why each pending job still waits.

use std::io::Write as _;
use std::path::Path;

use serde::Serialize;

use super::exit_codes::ExitStatus;
use super::validate::load_fleet;
use super::{Failure, print_stdout, read_text};
use crate::engine::explain::{Explanation, explain};
use crate::engine::state::SCHEMA_VERSION;
use crate::engine::{Action, Engine, Event, State, Timestamp};
use crate::spec::PolicyName;

/// Options of `plan`.
pub(crate) struct PlanArgs<'a> {
    pub fleet: Option<&'a Path>,
    pub state: Option<&'a Path>,
    pub store: Option<&'a str>,
    pub observation: Option<&'a Path>,
    pub now: Option<&'a str>,
    pub policy: Option<&'a str>,
    pub json: bool,
    pub write_state: Option<&'a Path>,
}

#[derive(Clone, Copy, Serialize)]
struct PlanReport<'a> {
    schema_version: u32,
    now: Timestamp,
    policy: &'a str,
    /// The digest of everything that decides (name, parameters, timings), as the
    /// controller's pass records give it.
    policy_digest: &'a str,
    actions: &'a [Action],
    events: &'a [Event],
    waiting: &'a [Explanation],
    next_wake: Option<Timestamp>,
    violations: &'a [String],
}

/// Reads and checks a state snapshot.
pub(crate) fn load_state(path: &Path) -> Result<State, Failure> {
    let text = read_text(path, crate::files::STATE_LIMIT, None)?;
    crate::engine::state_file::parse(&path.display().to_string(), &text).map_err(|message| {
        Failure {
            message,
            status: ExitStatus::Invalid,
        }
    })
}

pub(crate) fn run(args: PlanArgs<'_>) -> Result<ExitStatus, Failure> {
    // No flag may destroy a file: the state written goes to a new file, checked first.
    if let Some(path) = args.write_state {
        super::check_output(path, false)?;
    }
    let (fleet, mut state) = match args.state {
        Some(path) => {
            let fleet = load_fleet(args.fleet.unwrap_or(Path::new("deployment.yaml")))?;
            let state = load_state(path)?;
            (fleet, state)
        }
        // The live state: what the store holds now, read as a controller pass reads it.
        None => {
            let stack = super::stack::Stack::resolve(&super::stack::StackOpts {
                fleet: args.fleet.map(Path::to_path_buf),
                store: args.store.map(str::to_owned),
                ..Default::default()
            })?;
            let mut store = stack.open_store(false)?;
            let state = store
                .load_active()
                .map_err(|e| super::state::store_failure(&e))?
                .state;
            (stack.fleet, state)
        }
    };
    let spec = match args.policy {
        None => fleet.policy.clone(),
        Some(text) => match PolicyName::parse(text) {
            Some(name) => fleet.policy.variant(name),
            None => {
                return Err(Failure {
                    message: format!(
                        "error: unknown policy `{text}`\n  = hint: known policies: {}\n",
                        PolicyName::list()
                    ),
                    status: ExitStatus::Usage,
                });
            }
        },
    };
    let now = match args.now {
        Some(text) => Timestamp::parse(text).map_err(|e| Failure {
            message: format!("error: --now: {e}\n"),
            status: ExitStatus::Usage,
        })?,
        None => {
            let ms = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_millis() as i64);
            Timestamp(ms)
        }
    };
    let engine = Engine::with_policy(spec, fleet);
    let observation = match args.observation {
        Some(path) => {
            let text = read_text(path, crate::files::DATA_LIMIT, None)?;
            serde_json::from_str(&text).map_err(|e| Failure {
                message: crate::engine::state_file::json_error(
                    &path.display().to_string(),
                    "invalid observation",
                    &e,
                ),
                status: ExitStatus::Invalid,
            })?
        }
        None => crate::engine::explain::assumed_observation(engine.index(), &state, now),
    };
    let out = engine.reconcile(&mut state, &observation, now);
    let waiting = explain(engine.index(), &state, &observation, &out, now);
    if let Some(path) = args.write_state {
        let text = serde_json::to_string_pretty(&state).expect("state serialises") + "\n";
        super::write_output(path, &text, false)?;
    }
    if args.json {
        let digest = engine.index().fleet.policy.digest();
        let report = PlanReport {
            schema_version: SCHEMA_VERSION,
            now,
            policy: engine.policy().name(),
            policy_digest: &digest,
            actions: &out.actions,
            events: &out.events,
            waiting: &waiting,
            next_wake: out.next_wake,
            violations: &out.violations,
        };
        let mut stdout = std::io::stdout().lock();
        let _ = write_report(&mut stdout, &report, WAIT_BATCH)
            .and_then(|()| stdout.write_all(b"\n"))
            .and_then(|()| stdout.flush());
    } else {
        print_stdout(&render(&engine, &out, &waiting, now));
    }
    Ok(if out.violations.is_empty() {
        ExitStatus::Ok
    } else {
        ExitStatus::Invalid
    })
}

/// Waiting jobs written per batch (a batch's text is held: ~2 KB a job).
const WAIT_BATCH: usize = 4 * crate::parallel::PARTS_FROM;

/// `report` as `serde_json::to_writer_pretty` writes it, the waiting jobs (at 100k of them
/// nearly all of a ~200 MB report) written in batches, each in parts side by side: the
/// report without them, with its empty list cut open and the parts put in.
fn write_report(
    w: &mut impl std::io::Write,
    report: &PlanReport<'_>,
    batch: usize,
) -> std::io::Result<()> {
    let frame = serde_json::to_vec_pretty(&PlanReport {
        waiting: &[],
        ..*report
    })?;
    // A top-level key starts a line of its own: no string holds a raw line break.
    const EMPTY: &[u8] = b"\n  \"waiting\": []";
    let open = (frame.windows(EMPTY.len()).position(|w| w == EMPTY))
        .expect("the report has a waiting list")
        + EMPTY.len()
        - 1;
    w.write_all(&frame[..open])?;
    for (k, batch) in report.waiting.chunks(batch).enumerate() {
        let parts = crate::parallel::in_parts(batch, |_, part| waiting_items(part));
        for (j, part) in parts.into_iter().enumerate() {
            let text = part?;
            if k + j > 0 {
                w.write_all(b",")?;
            }
            w.write_all(&text)?;
        }
    }
    if !report.waiting.is_empty() {
        w.write_all(b"\n  ")?;
    }
    w.write_all(&frame[open..])
}

/// `waiting` as the items of the report's list (each on a line of its own, after a comma
/// but the first) as the pretty writer writes them. The explanations whose reasons are all
/// their class's differ only in the job id: each class's text is made once, then copied.
fn waiting_items(waiting: &[Explanation]) -> std::io::Result<Vec<u8>> {
    use serde_json::ser::Formatter as _;
    /// How an item starts, up to its job id (the first field).
    const HEAD: &[u8] = b"{\n      \"job_id\": ";
    let mut tails: rustc_hash::FxHashMap<usize, Vec<u8>> = Default::default();
    let mut out = Vec::new();
    let mut id = Vec::new();
    for (i, e) in waiting.iter().enumerate() {
        out.extend_from_slice(if i == 0 { b"\n    " } else { b",\n    " });
        id.clear();
        serde_json::to_writer(&mut id, &e.job_id)?;
        if let Some(tail) = e.class_only().and_then(|k| tails.get(&k)) {
            out.extend_from_slice(HEAD);
            out.extend_from_slice(&id);
            out.extend_from_slice(tail);
            continue;
        }
        // An item of a list in the report's object: two levels down.
        let mut formatter = serde_json::ser::PrettyFormatter::new();
        formatter.begin_object(&mut std::io::sink())?;
        formatter.begin_object(&mut std::io::sink())?;
        let start = out.len();
        let mut ser = serde_json::Serializer::with_formatter(&mut out, formatter);
        e.serialize(&mut ser)?;
        let text = &out[start..];
        if let Some(key) = e.class_only()
            && let Some(tail) = text
                .strip_prefix(HEAD)
                .and_then(|t| t.strip_prefix(&id[..]))
        {
            tails.insert(key, tail.to_vec());
        }
    }
    Ok(out)
}

fn render(
    engine: &Engine,
    out: &crate::engine::PassOutput,
    waiting: &[Explanation],
    now: Timestamp,
) -> String {
    let mut s = format!(
        "plan at {now} with policy {}\n\n",
        engine.index().fleet.policy.describe()
    );
    s.push_str(&format!("actions ({}):\n", out.actions.len()));
    let rows: Vec<Vec<String>> = out
        .actions
        .iter()
        .map(|a| match a {
            Action::CreateQueuedResource {
                name,
                zone,
                tpu_type,
                entry_id,
                ..
            } => {
                vec![
                    "create".into(),
                    name.to_string(),
                    format!("{tpu_type} in {zone} (entry {entry_id})"),
                ]
            }
            Action::DeleteQueuedResource { name, zone } => vec![
                "delete".into(),
                name.to_string(),
                format!("queued resource in {zone}"),
            ],
            Action::DeleteNode { name, zone } => {
                vec![
                    "delete".into(),
                    name.to_string(),
                    format!("TPU VM in {zone}"),
                ]
            }
            Action::Launch(l) => vec![
                "launch".into(),
                l.job_id.to_string(),
                format!(
                    "on {} ({} workers), attempt {}",
                    l.tpu_name, l.worker_count, l.attempt_id
                ),
            ],
            Action::Cancel {
                job_id,
                tpu_name,
                attempt_id,
                notice,
                ..
            } => vec![
                "cancel".into(),
                job_id.to_string(),
                match notice {
                    Some(n) => format!(
                        "on {tpu_name}, attempt {attempt_id}, with notice {}",
                        n.word()
                    ),
                    None => format!("on {tpu_name}, attempt {attempt_id}"),
                },
            ],
            Action::RecoverDisk {
                resource_id,
                worker_count,
                ..
            } => vec![
                "recover-disk".into(),
                resource_id.to_string(),
                format!("adopted, ready but unhealthy: free the agent's folders on {worker_count} workers"),
            ],
        })
        .collect();
    if !rows.is_empty() {
        s.push_str(&crate::table::table(&["ACTION", "TARGET", "DETAIL"], &rows));
    }
    s.push_str(&format!("\nevents ({}):\n", out.events.len()));
    for e in &out.events {
        let subject = e
            .job_id
            .as_deref()
            .or(e.resource_id.as_deref())
            .unwrap_or("-");
        s.push_str(&format!(
            "  {:<40} {subject}{}\n",
            e.kind,
            if e.detail.is_empty() {
                String::new()
            } else {
                format!(": {}", e.detail)
            }
        ));
    }
    s.push_str(&format!("\nwaiting jobs ({}):\n", waiting.len()));
    // A long queue's lines (nearly all of the text) are written in parts side by side.
    let parts = crate::parallel::in_parts(waiting, |_, part| {
        let mut s = String::new();
        for w in part {
            for line in [["  ", &w.job_id, "\n"]]
                .into_iter()
                .chain(w.reasons().map(|r| ["    - ", r, "\n"]))
            {
                s.extend(line);
            }
        }
        s
    });
    s.extend(parts);
    if let Some(t) = out.next_wake {
        s.push_str(&format!("\nnext pass needed by {t} at the latest\n"));
    }
    if !out.violations.is_empty() {
        s.push_str("\ninvariant violations (a bug, please report):\n");
        for v in &out.violations {
            s.push_str(&format!("  {v}\n"));
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::synthetic;

    /// The report written in batches and parts is byte for byte what the plain pretty
    /// writer gives: no waiting job, a few (one part), and batches of several parts; jobs
    /// waiting only for their class's reasons (written once per class) and for their own.
    #[test]
    fn the_report_in_parts_is_the_report() {
        let epoch = Timestamp::from_secs(1_767_225_600);
        let fleet = synthetic::fleet(40, 2);
        for n_jobs in [0, 3, crate::parallel::PARTS_FROM + 700] {
            let (mut state, observation) = synthetic::planning_instance(&fleet, 0, 20, epoch);
            for (i, mut job) in synthetic::varied_pending_jobs(&fleet, n_jobs, epoch)
                .into_iter()
                .enumerate()
            {
                // Every seventh backs off: a reason of its own.
                if i % 7 == 1 {
                    job.not_before = Some(Timestamp(epoch.0 + 600_000));
                    job.infra_failures = 1;
                }
                state.jobs.insert(job.id, job);
            }
            let engine = Engine::with_policy(fleet.policy.clone(), fleet.clone());
            let out = engine.reconcile(&mut state, &observation, epoch);
            let waiting = explain(engine.index(), &state, &observation, &out, epoch);
            let class_only = waiting.iter().filter(|w| w.class_only().is_some()).count();
            if n_jobs > 3 {
                assert!(
                    class_only > 100 && class_only < waiting.len(),
                    "{class_only}"
                );
            }
            let report = PlanReport {
                schema_version: SCHEMA_VERSION,
                now: epoch,
                policy: engine.policy().name(),
                policy_digest: "d",
                actions: &out.actions,
                events: &out.events,
                waiting: &waiting,
                next_wake: out.next_wake,
                violations: &out.violations,
            };
            // The text's waiting lines, written in parts, are those of one job after another.
            let text = render(&engine, &out, &waiting, epoch);
            let mut lines = String::new();
            for w in &waiting {
                lines += &format!("  {}\n", w.job_id);
                for r in w.reasons() {
                    lines += &format!("    - {r}\n");
                }
            }
            let head = format!("\nwaiting jobs ({}):\n", waiting.len());
            assert!(text.contains(&(head + &lines)), "{n_jobs} jobs: text");
            let plain = serde_json::to_vec_pretty(&report).expect("serialises");
            for batch in [1, 2, crate::parallel::PARTS_FROM + 50, WAIT_BATCH] {
                let mut parts = Vec::new();
                write_report(&mut parts, &report, batch).expect("writes to memory");
                assert!(parts == plain, "{n_jobs} jobs in batches of {batch}");
            }
        }
    }
}
