//! `report`: the metrics `simulate` prints, for what production recorded in a window (the
//! store's jobs and event log): a production goodput ledger, in total and per job. Reads
//! the store; writes nothing.

use serde_json::json;

use super::events::{self, Window};
use super::exit_codes::ExitStatus;
use super::stack::{Stack, StackOpts};
use super::{Failure, print_stdout, table};
use crate::engine::state::{AttemptStatus, Job};
use crate::simulate::recorded::{self, Costs};

/// `report [--since T] [--until T] [--json]`.
pub(crate) fn run(opts: &StackOpts, window: Window, as_json: bool) -> Result<ExitStatus, Failure> {
    let stack = Stack::resolve(opts)?;
    let mut store = stack.open_store(false)?;
    let (state, log, since, until) = events::recorded(store.as_mut(), window, "to report on")?;
    let jobs: Vec<&Job> = state.all_jobs().collect();
    let m = recorded::metrics(&stack.fleet, &state, &log, since, until, &Costs::default());
    let in_window: Vec<&&Job> = jobs
        .iter()
        .filter(|j| j.submitted_at >= since && j.submitted_at < until)
        .collect();
    let per_job: Vec<serde_json::Value> = in_window
        .iter()
        .map(|j| {
            let ran = |pred: &dyn Fn(AttemptStatus) -> bool| -> f64 {
                j.attempts
                    .iter()
                    .filter(|a| pred(a.status))
                    .filter_map(|a| Some(a.ended_at.unwrap_or(until).secs_since(a.started_at?)))
                    .sum()
            };
            json!({
                "job_id": j.id,
                "status": j.status,
                "attempts": j.attempts.len(),
                "waited_s": j.attempts.iter().filter_map(|a| a.started_at).min().map(|s| s.secs_since(j.submitted_at)),
                "run_s": ran(&|_| true),
                "lost_s": ran(&|s| s == AttemptStatus::Interrupted),
            })
        })
        .collect();
    if as_json {
        let doc = json!({
            "store": store.describe(),
            "since": since,
            "until": until,
            "metrics": m,
            "jobs": per_job,
        });
        print_stdout(&(serde_json::to_string_pretty(&doc).expect("serialises") + "\n"));
        return Ok(ExitStatus::Ok);
    }
    let rows: Vec<Vec<String>> = [
        (
            "window",
            format!(
                "{since} to {until} ({:.2} h)",
                until.secs_since(since) / 3600.0
            ),
        ),
        (
            "jobs ok/failed/left",
            format!(
                "{}/{}/{}",
                m.jobs_succeeded, m.jobs_failed, m.jobs_unfinished
            ),
        ),
        ("utilisation", format!("{:.3}", m.utilization)),
        (
            "goodput",
            format!(
                "{:.3} ({:.2} of {:.2} chip-h held)",
                m.goodput_ratio, m.goodput_chip_hours, m.allocated_chip_hours
            ),
        ),
        (
            "lost to interruptions",
            format!("{:.2} chip-h", m.lost_chip_hours),
        ),
        (
            "wait p50 / p95 / p99",
            format!(
                "{:.0} s / {:.0} s / {:.0} s",
                m.queue_wait_s.p50, m.queue_wait_s.p95, m.queue_wait_s.p99
            ),
        ),
        (
            "JCT p50 / p99",
            format!("{:.0} s / {:.0} s", m.jct_s.p50, m.jct_s.p99),
        ),
        (
            "time to capacity p50",
            format!(
                "{:.0} s ({} requests)",
                m.time_to_capacity_s.p50, m.time_to_capacity_s.n
            ),
        ),
        ("preemptions", m.preemptions.to_string()),
        ("retries", m.retries.to_string()),
        ("cost", format!("${:.2} (list prices)", m.cost_usd)),
    ]
    .into_iter()
    .map(|(k, v)| vec![k.to_owned(), v])
    .collect();
    print_stdout(&format!(
        "what {} recorded (metrics as `simulate` defines them; --json for each job):\n{}",
        store.describe(),
        table(&["METRIC", "VALUE"], &rows)
    ));
    Ok(ExitStatus::Ok)
}
