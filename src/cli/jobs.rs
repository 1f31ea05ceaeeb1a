//! The job commands of a user's day that write (§6): `submit`, `cancel`, `set-priority` and
//! `interrupt-spot` (`status` is in `queue`, `watch` and `logs` in `follow`), and the rule
//! that turns a name into its latest run. Each reads its configuration through `stack`,
//! works through the store, the object store and `submit`, and prints human text by default
//! or JSON lines (`--json`). No decision is made here: the store applies the engine's rules.

use std::path::Path;

use serde_json::json;

use super::exit_codes::ExitStatus;
use super::stack::{Stack, StackOpts};
use super::state::store_failure;
use super::{Failure, print_stdout};
use crate::controller::wall_clock;
use crate::engine::commands::{CancelResult, ReprioritizeResult};
use crate::engine::state::JobStatus;
use crate::spec::{Name, Priority};
use crate::submit::{self, SubmitError};

fn line(value: serde_json::Value) {
    print_stdout(&format!("{value}\n"));
}

/// What `submit` is asked.
pub(crate) struct SubmitArgs<'a> {
    pub manifest: &'a Path,
    pub names: &'a [String],
    pub env: &'a [String],
    pub env_files: &'a [std::path::PathBuf],
    pub command: Option<&'a str>,
    pub json: bool,
}

/// `submit`.
pub(crate) fn submit(opts: &StackOpts, args: &SubmitArgs<'_>) -> Result<ExitStatus, Failure> {
    let json = args.json;
    let manifest = &submit::manifest_path(args.manifest);
    let mut overrides = submit::Overrides::default();
    for file in args.env_files {
        overrides.add_file(file).map_err(fail_submit)?;
    }
    for pair in args.env {
        overrides.add_pair(pair).map_err(fail_submit)?;
    }
    if let Some(command) = args.command {
        overrides.set_command(command).map_err(fail_submit)?;
    }
    let stack = Stack::resolve(opts)?;
    let mut jobs = submit::read_jobs(manifest, &stack.fleet, args.names).map_err(fail_submit)?;
    overrides.apply(&mut jobs);
    let objects = stack.objects()?;
    let mut store = stack.open_store(true)?;
    let base = manifest
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let mut progress = |uri: &str, bytes: usize| {
        if !json {
            eprintln!("  uploading {uri} ({})", human_bytes(bytes));
        }
    };
    let submitted = submit::submit(
        jobs,
        base,
        &stack.fleet,
        objects.as_ref(),
        store.as_mut(),
        wall_clock(),
        &mut progress,
    )
    .map_err(fail_submit)?;
    for s in &submitted {
        if json {
            let mut v = serde_json::to_value(s).expect("serialisable");
            v["event"] = json!("submitted");
            line(v);
        } else {
            print_stdout(&format!(
                "submitted {} (job {}, priority {}, may run in {})\n",
                s.job_id,
                s.name,
                s.priority.as_str(),
                s.regions.join(", ")
            ));
        }
    }
    // The controller: the local stack's runs already; on GCP the Cloud Run job is started
    // (an execution that finds another holding the lease exits at once); against an
    // emulator there is no Cloud Run unless TPU_RUNNER_RUN_ENDPOINT names one.
    let run_endpoint = std::env::var("TPU_RUNNER_RUN_ENDPOINT")
        .ok()
        .filter(|u| !u.trim().is_empty());
    let on_gcp = stack.workers.is_none() && !stack.endpoint().emulator;
    let triggered = if run_endpoint.is_some() || on_gcp {
        Some(trigger_controller(&stack.fleet, run_endpoint.as_deref())?)
    } else {
        None
    };
    let ids: Vec<&str> = submitted.iter().map(|s| s.job_id.as_str()).collect();
    let first_name = submitted.first().map_or("JOB", |s| s.name.as_str());
    if json {
        if let Some(operation) = &triggered {
            line(
                json!({"event": "controller_triggered", "controller": format!("{}-controller", stack.fleet.name), "region": stack.fleet.controller_region, "operation": operation, "job_ids": ids}),
            );
        }
    } else {
        let controller = match (&triggered, stack.workers.is_some()) {
            (Some(_), _) => format!(
                "the controller ({}-controller, Cloud Run) was started",
                stack.fleet.name
            ),
            (None, true) => "the local stack's controller picks them up within seconds".into(),
            (None, false) => "start the controller (`tpu-runner controller`) if none runs".into(),
        };
        print_stdout(&format!(
            "{} job(s) queued in {}; {controller}. Follow one with `tpu-runner watch {first_name}`.\n",
            submitted.len(),
            store.describe(),
        ));
    }
    Ok(ExitStatus::Ok)
}

/// Runs the fleet's Cloud Run controller job (`jobs/<name>-controller:run`); its operation's
/// name. A failure leaves the jobs queued and says so (exit 2, as the original).
fn trigger_controller(
    fleet: &crate::spec::FleetSpec,
    endpoint: Option<&str>,
) -> Result<String, Failure> {
    use crate::deploy::apply::Http;
    let run =
        crate::deploy::run_controller(fleet, endpoint.unwrap_or("https://run.googleapis.com"));
    let url = run.url;
    let fail = |why: String| Failure {
        message: format!(
            "error: the jobs are queued, but the controller could not be started: {why}\n  = hint: run `tpu-runner controller`, or deploy the fleet (`tpu-runner deploy`)\n"
        ),
        status: ExitStatus::Usage,
    };
    let mut http: Box<dyn Http> = match endpoint {
        Some(_) => Box::new(crate::deploy::apply::Google::without_credentials().map_err(fail)?),
        None => Box::new(crate::deploy::apply::Google::connect().map_err(fail)?),
    };
    let (code, body) = http
        .send(run.method, &url, Some((b"{}", "application/json")))
        .map_err(fail)?;
    if !(200..300).contains(&code) {
        return Err(fail(format!(
            "POST {url} → {code}: {}",
            String::from_utf8_lossy(&body)
                .chars()
                .take(300)
                .collect::<String>()
        )));
    }
    let reply: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
    Ok(reply["name"].as_str().unwrap_or_default().to_owned())
}

fn fail_submit(e: SubmitError) -> Failure {
    match e {
        SubmitError::Invalid(text) => Failure {
            message: text,
            status: ExitStatus::Invalid,
        },
        SubmitError::Unreadable(text) | SubmitError::Objects(text) => Failure {
            message: text,
            status: ExitStatus::Io,
        },
        SubmitError::Exist(_) => Failure {
            message: format!(
                "error: {e}\n  = hint: nothing was submitted; an `id:` in the manifest is used once: remove it (or write `name:` instead) and each submit is a new run\n"
            ),
            status: ExitStatus::Usage,
        },
        SubmitError::Store(e) => store_failure(&e),
    }
}

fn human_bytes(n: usize) -> String {
    match n {
        n if n >= 1 << 30 => format!("{:.1} GiB", n as f64 / f64::from(1u32 << 30)),
        n if n >= 1 << 20 => format!("{:.1} MiB", n as f64 / f64::from(1u32 << 20)),
        n if n >= 1 << 10 => format!("{:.1} KiB", n as f64 / 1024.0),
        n => format!("{n} B"),
    }
}

/// The job `what` names: that job id, else the latest run of the job with that name. An
/// unknown one is `Err` with what to say: the closest id or name the store knows, if any.
pub(crate) fn resolve(
    store: &mut dyn crate::store::StateStore,
    what: &str,
) -> Result<Result<Name, String>, Failure> {
    if crate::spec::job::check_job_id(what).is_ok() {
        let id = Name::new(what);
        if !store
            .existing_jobs(&[id])
            .map_err(|e| store_failure(&e))?
            .is_empty()
        {
            return Ok(Ok(id));
        }
        if let Some(latest) = store
            .runs_named(what, 1)
            .map_err(|e| store_failure(&e))?
            .first()
        {
            return Ok(Ok(*latest));
        }
    }
    // Unknown: offer the closest of the active jobs and those ended in the last 30 days.
    let mut known: Vec<String> = Vec::new();
    let active = store.load_active().map_err(|e| store_failure(&e))?;
    let since = wall_clock().plus_secs(-30 * 86_400);
    let finished = store
        .finished_jobs(since, 1_000)
        .map_err(|e| store_failure(&e))?;
    for job in active.state.jobs.values().chain(finished.iter()) {
        known.push(job.id.to_string());
        known.push(job.spec.name().to_owned());
    }
    let hint = crate::spec::diagnostic::closest(what, known.iter().map(String::as_str))
        .map(|c| format!(" (did you mean `{c}`?)"))
        .unwrap_or_default();
    Ok(Err(format!("{what}: no such job id or job name{hint}")))
}

/// [`resolve`] for commands that need the job: an unknown one fails (exit 1).
pub(crate) fn resolve_one(
    store: &mut dyn crate::store::StateStore,
    what: &str,
) -> Result<Name, Failure> {
    resolve(store, what)?.map_err(|message| Failure {
        message: format!("error: {message}\n"),
        status: ExitStatus::Invalid,
    })
}

/// `cancel`: each job's result; exit 0, 1 when a job is unknown, 2 on a conflict.
pub(crate) fn cancel(
    opts: &StackOpts,
    ids: &[String],
    if_pending: bool,
    json: bool,
) -> Result<ExitStatus, Failure> {
    let stack = Stack::resolve(opts)?;
    let mut store = stack.open_store(false)?;
    let mut exit = ExitStatus::Ok;
    for what in ids {
        let id = match resolve(store.as_mut(), what)? {
            Ok(id) => id,
            Err(message) => {
                exit = ExitStatus::Invalid;
                if json {
                    line(json!({"job_id": what, "status": "unknown", "error": message}));
                } else {
                    print_stdout(&format!("{message}\n"));
                }
                continue;
            }
        };
        let result = store
            .cancel_job(&id, if_pending, wall_clock())
            .map_err(|e| store_failure(&e))?;
        let (value, text) = match &result {
            CancelResult::Unknown => {
                exit = ExitStatus::Invalid;
                (
                    json!({"job_id": id, "status": "unknown"}),
                    format!("{id}: no such job\n"),
                )
            }
            CancelResult::Conflict { reason } => {
                if exit == ExitStatus::Ok {
                    exit = ExitStatus::Usage;
                }
                (
                    json!({"job_id": id, "status": "conflict", "reason": reason}),
                    format!("{id}: not cancelled: {reason}\n"),
                )
            }
            CancelResult::Status { status, changed } => (
                json!({"job_id": id, "status": status.as_str()}),
                match (status, changed) {
                    (JobStatus::Cancelling, true) => format!(
                        "{id}: cancelling (the controller stops its workers, then it is cancelled)\n"
                    ),
                    (JobStatus::Deactivated, true) => format!("{id}: cancelled\n"),
                    (s, _) => format!("{id}: already {}\n", s.word()),
                },
            ),
        };
        if json {
            line(value);
        } else {
            print_stdout(&text);
        }
    }
    Ok(exit)
}

/// `set-priority`: exit 0, 1 when unknown, 2 when the job is no longer pending.
pub(crate) fn set_priority(
    opts: &StackOpts,
    id: &str,
    priority: Priority,
    json: bool,
) -> Result<ExitStatus, Failure> {
    let stack = Stack::resolve(opts)?;
    let mut store = stack.open_store(false)?;
    let name = resolve_one(store.as_mut(), id)?;
    let id = name.as_str();
    let result = store
        .reprioritize(&name, priority, wall_clock())
        .map_err(|e| store_failure(&e))?;
    let word = priority.as_str();
    let (value, text, exit) = match result {
        ReprioritizeResult::Unknown => (
            json!({"job_id": id, "status": "unknown"}),
            format!("{id}: no such job\n"),
            ExitStatus::Invalid,
        ),
        ReprioritizeResult::Conflict { status } => (
            json!({"job_id": id, "status": "conflict", "job_status": status.as_str()}),
            format!(
                "{id}: is {}: only a pending job's priority can change\n",
                status.word()
            ),
            ExitStatus::Usage,
        ),
        ReprioritizeResult::Unchanged => (
            json!({"job_id": id, "status": "unchanged", "priority": word}),
            format!("{id}: already {word}\n"),
            ExitStatus::Ok,
        ),
        ReprioritizeResult::Reprioritized { old, .. } => (
            json!({"job_id": id, "status": "reprioritized", "priority": word}),
            format!("{id}: priority {} → {word}\n", old.as_str()),
            ExitStatus::Ok,
        ),
    };
    if json {
        line(value);
    } else {
        print_stdout(&text);
    }
    Ok(exit)
}

/// `interrupt-spot`: asks the controller to stop a managed Spot TPU running an attempt, as a
/// preemption would (the job goes back to pending, pinned to its region). Exit 0 filed, 1
/// refused (unknown target, not a managed Spot TPU running that attempt, already asked).
pub(crate) fn interrupt_spot(
    opts: &StackOpts,
    what: &str,
    tpu: Option<&str>,
    attempt: Option<&str>,
    json: bool,
) -> Result<ExitStatus, Failure> {
    use crate::spec::fleet::EntryKind;
    use crate::spec::gcp::ProvisioningModel;
    use crate::store::InterruptResult;
    let stack = Stack::resolve(opts)?;
    let mut store = stack.open_store(false)?;
    let id = resolve_one(store.as_mut(), what)?;
    let current = store
        .job(&id)
        .map_err(|e| store_failure(&e))?
        .and_then(|j| j.attempt().map(|a| (a.resource_id, a.id)));
    let (resource, attempt) = match (tpu, attempt, current) {
        (Some(t), Some(a), _) => (t.to_owned(), a.to_owned()),
        (t, a, Some((resource, current))) => (
            t.map_or_else(|| resource.to_string(), str::to_owned),
            a.map_or_else(|| current.to_string(), str::to_owned),
        ),
        (_, _, None) => {
            eprintln!("error: not filed: {id} has no attempt running (it waits or has ended)");
            return Ok(ExitStatus::Invalid);
        }
    };
    let (resource, job, attempt) = (resource.as_str(), id.as_str(), attempt.as_str());
    let fleet = stack.fleet.clone();
    let eligible = move |entry: &Name| {
        fleet.entry(entry.as_str()).is_some_and(|e| {
            matches!(e.kind, EntryKind::Managed { .. })
                && e.provisioning_model == ProvisioningModel::Spot
        })
    };
    let result = store
        .create_interruption_request(
            &Name::new(resource),
            &Name::new(job),
            &Name::new(attempt),
            &eligible,
            wall_clock(),
        )
        .map_err(|e| store_failure(&e))?;
    let refused = |why: String| {
        eprintln!("error: not filed: {why}");
        Ok(ExitStatus::Invalid)
    };
    match result {
        InterruptResult::Requested(r) => {
            if json {
                line(
                    json!({"request_id": r.id.as_str(), "resource_id": resource, "job_id": job, "attempt_id": attempt, "status": "requested"}),
                );
            } else {
                print_stdout(&format!(
                    "requested {}: the controller stops {resource} and requeues {job}\n",
                    r.id
                ));
            }
            Ok(ExitStatus::Ok)
        }
        InterruptResult::UnknownTarget(what) => refused(what),
        InterruptResult::Exists(id) => refused(format!("request {id} exists already")),
        InterruptResult::Rejected(why) => refused(why),
    }
}
