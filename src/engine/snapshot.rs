//! What a state snapshot written by a person must hold before a pass may read it
//! (`plan --state`, `state import`, a scenario's `initial_state`): map keys equal to ids,
//! finished jobs only under `finished`, ownership that points both ways, at least one worker
//! per TPU, every job's spec valid as `job.yaml` would read it, each job and attempt id once. Each problem
//! names its field path, what was found and what is expected. Pure; it repairs nothing and
//! decides nothing (a store's own records are repaired by the pass instead).

use super::state::{Job, JobStatus, ResourceStatus, State};

/// One problem of a snapshot.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Problem {
    /// Field path (`jobs.J.status`).
    pub path: String,
    /// What is wrong.
    pub message: String,
    /// What would be right, when it helps.
    pub hint: Option<String>,
}

fn problem(path: String, message: String, hint: Option<&str>) -> Problem {
    Problem {
        path,
        message,
        hint: hint.map(str::to_owned),
    }
}

/// The most TPUs of one pool a snapshot may say others hold (no zone holds more; `status`
/// and `plan` stand one observed node in for each).
pub const MAX_OTHERS_PER_POOL: u32 = 10_000;

/// Every problem of `state`, in table order (jobs, finished, resources, requests). What a
/// fleet change explains (a job no entry runs any more, a TPU of an entry whose type
/// changed) is not a problem: the pass handles it.
pub fn problems(state: &State) -> Vec<Problem> {
    let mut out = Vec::new();
    let key_differs = |table: &str, key: &str, id: &str| {
        (key != id).then(|| {
            problem(
                format!("{table}.{key}.id"),
                format!("the id `{id}` differs from its key `{key}`"),
                Some("a record's key and its `id` must be the same"),
            )
        })
    };
    for (key, job) in state.jobs.iter() {
        out.extend(key_differs("jobs", key.as_str(), job.id.as_str()));
        check_active_job(state, key.as_str(), job, &mut out);
    }
    for (key, job) in &state.finished {
        out.extend(key_differs("finished", key.as_str(), job.id.as_str()));
        if !job.status.is_terminal() {
            out.push(problem(
                format!("finished.{key}.status"),
                format!(
                    "a {} job under `finished`",
                    job.status.as_str()
                ),
                Some("`finished` holds succeeded, failed and deactivated jobs; active ones go under `jobs`"),
            ));
        }
    }
    // Others' TPUs as a pass counts them: one pool each, a count a zone can hold.
    for (i, held) in state.others.iter().enumerate() {
        if held.count > MAX_OTHERS_PER_POOL {
            out.push(problem(
                format!("others[{i}].count"),
                format!(
                    "{} TPUs of one pool held by others; at most {MAX_OTHERS_PER_POOL}",
                    held.count
                ),
                Some("`others` is what a pass counted of other users' TPUs in a zone"),
            ));
        }
    }
    for (key, r) in state.resources.iter() {
        let at = |field: &str| format!("resources.{key}.{field}");
        out.extend(key_differs("resources", key.as_str(), r.id.as_str()));
        if r.worker_count == 0 {
            out.push(problem(
                at("worker_count"),
                "expected at least 1 worker, found 0".into(),
                None,
            ));
        }
        match (&r.owner, r.status) {
            (Some(_), ResourceStatus::Idle) => out.push(problem(
                at("owner"),
                "an idle TPU with an owner".into(),
                Some("drop `owner`, or make the TPU `busy` and its job run on it"),
            )),
            (None, ResourceStatus::Busy) => out.push(problem(
                at("owner"),
                "a busy TPU without an owner".into(),
                Some("name the job and attempt running on it: `owner: {job_id, attempt_id}`"),
            )),
            _ => {}
        }
        if let Some(owner) = &r.owner {
            match state.jobs.get(&owner.job_id) {
                None => out.push(problem(
                    at("owner.job_id"),
                    format!("no active job `{}` in `jobs`", owner.job_id),
                    None,
                )),
                Some(job)
                    if !matches!(job.status, JobStatus::Running | JobStatus::Cancelling)
                        || job.assigned_resource.as_ref() != Some(key)
                        || job.current_attempt.as_ref() != Some(&owner.attempt_id) =>
                {
                    out.push(problem(
                        at("owner"),
                        format!(
                            "owned by {}/{}, but that job is {} with current attempt and TPU {}/{}",
                            owner.job_id,
                            owner.attempt_id,
                            job.status.as_str(),
                            job.current_attempt.map_or("none".into(), |a| a.to_string()),
                            job.assigned_resource.map_or("none".into(), |a| a.to_string()),
                        ),
                        Some("ownership must point both ways: the TPU's `owner` and the job's `assigned_resource` and `current_attempt`"),
                    ));
                }
                Some(_) => {}
            }
        }
    }
    for (key, request) in &state.interruption_requests {
        out.extend(key_differs(
            "interruption_requests",
            key.as_str(),
            request.id.as_str(),
        ));
    }
    check_specs(state, &mut out);
    check_attempt_ids(state, &mut out);
    out
}

/// Every job's spec read again exactly as `job.yaml` is read (ids, env names, buckets,
/// caches, command): one rule wherever a job comes from. A job both under `jobs` and under
/// `finished` is an id given twice. One read for the whole snapshot.
fn check_specs(state: &State, out: &mut Vec<Problem>) {
    let all: Vec<(JobPath, &Job)> = jobs_with_paths(state).collect();
    if all.is_empty() {
        return;
    }
    let specs: Vec<&crate::spec::JobSpec> = all.iter().map(|(_, j)| &j.spec).collect();
    let Err(errors) = crate::spec::job::recheck_stored(&specs) else {
        return;
    };
    for d in errors.diagnostics {
        // `jobs[i]...` is the i-th job of `all`.
        let place = d
            .path
            .strip_prefix("jobs[")
            .and_then(|rest| rest.split_once(']'))
            .and_then(|(i, rest)| Some((all.get(i.parse::<usize>().ok()?)?, rest)));
        let path = match place {
            Some(((at, _), rest)) => format!("{at}.spec{rest}"),
            None => "jobs".to_owned(),
        };
        // A message naming another job by its place names it by its own path too.
        let mut message = d.message;
        while let Some(start) = message.find("jobs[") {
            let Some((i, len)) = message[start + 5..]
                .split_once(']')
                .and_then(|(i, _)| Some((i.parse::<usize>().ok()?, i.len())))
            else {
                break;
            };
            let Some((at, _)) = all.get(i) else { break };
            let end = start + 5 + len + 1;
            let tail = message[end..]
                .strip_prefix(".id")
                .unwrap_or(&message[end..]);
            message = format!("{}{at}{tail}", &message[..start]);
        }
        out.push(Problem {
            path,
            message,
            hint: d.hint,
        });
    }
}

/// Where a job is in a snapshot (`jobs.K`, `finished.K`), written only when a problem is.
#[derive(Clone, Copy)]
struct JobPath {
    table: &'static str,
    key: crate::spec::Name,
}

impl std::fmt::Display for JobPath {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}.{}", self.table, self.key)
    }
}

/// Every job, active then finished, with its place.
fn jobs_with_paths(state: &State) -> impl Iterator<Item = (JobPath, &Job)> {
    let at = |table, key: &crate::spec::Name| JobPath { table, key: *key };
    let active = state.jobs.iter().map(move |(k, j)| (at("jobs", k), j));
    let finished = (state.finished.iter()).map(move |(k, j)| (at("finished", k), &**j));
    active.chain(finished)
}

/// An attempt id names one attempt of one job: a repeat would be merged away by a store.
fn check_attempt_ids(state: &State, out: &mut Vec<Problem>) {
    let mut seen: std::collections::HashMap<&str, (JobPath, usize)> = Default::default();
    for (at, job) in jobs_with_paths(state) {
        for (i, a) in job.attempts.iter().enumerate() {
            match seen.get(a.id.as_str()) {
                Some((first, k)) => out.push(problem(
                    format!("{at}.attempts[{i}].id"),
                    format!(
                        "the attempt id `{}` is given twice (first at {first}.attempts[{k}].id)",
                        a.id
                    ),
                    Some("every attempt has its own id"),
                )),
                None => {
                    seen.insert(a.id.as_str(), (at, i));
                }
            }
        }
    }
}

fn check_active_job(state: &State, key: &str, job: &Job, out: &mut Vec<Problem>) {
    let at = |field: &str| format!("jobs.{key}.{field}");
    if job.status.is_terminal() {
        out.push(problem(
            at("status"),
            format!("a {} job under `jobs`", job.status.as_str()),
            Some("`jobs` holds pending, running and cancelling jobs; finished ones go under `finished`"),
        ));
        return;
    }
    if !matches!(job.status, JobStatus::Running | JobStatus::Cancelling) {
        return;
    }
    let status = job.status.as_str();
    match job.attempt() {
        Some(a) if !a.status.is_terminal() => {}
        Some(a) => out.push(problem(
            at("current_attempt"),
            format!(
                "a {status} job whose current attempt `{}` is {}",
                a.id,
                a.status.as_str()
            ),
            Some("a running or cancelling job's current attempt is launching or running"),
        )),
        None => out.push(problem(
            at("current_attempt"),
            format!("a {status} job without a current attempt"),
            Some("name one of its `attempts` (launching or running) in `current_attempt`"),
        )),
    }
    match &job.assigned_resource {
        None => out.push(problem(
            at("assigned_resource"),
            format!("a {status} job without a TPU"),
            Some("name the TPU record it runs on"),
        )),
        Some(r) => match state.resources.get(r) {
            None => out.push(problem(
                at("assigned_resource"),
                format!("no TPU record `{r}` in `resources`"),
                None,
            )),
            Some(res) if res.owner.as_ref().map(|o| o.job_id) != Some(job.id) => {
                out.push(problem(
                    at("assigned_resource"),
                    format!(
                        "TPU `{r}` is {}",
                        res.owner
                            .as_ref()
                            .map_or("not owned by it".into(), |o| format!(
                                "owned by {}/{}",
                                o.job_id, o.attempt_id
                            ))
                    ),
                    Some("ownership must point both ways: the TPU's `owner` names this job"),
                ));
            }
            Some(_) => {}
        },
    }
}
