//! `simulate`: runs scenarios × policies × seeds (in parallel across seeds), prints a table,
//! writes JSON and an HTML report on request, and on an invariant violation prints the seed,
//! the broken invariant, the last events and the command that replays the run.

use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

use super::exit_codes::ExitStatus;
use super::{Failure, print_stdout};
use crate::engine::policy;
use crate::simulate::harness::{self, RunOptions, RunResult, Violation};
use crate::simulate::report;
use crate::simulate::scenario::{self, ChaosSpec, Scenario, ScenarioError, WorkloadSpec};

/// Options of `simulate`.
pub(crate) struct SimulateArgs<'a> {
    pub files: &'a [PathBuf],
    pub seed: Option<u64>,
    pub seeds: Option<&'a str>,
    pub policies: Option<&'a str>,
    pub json: bool,
    pub output: Option<&'a Path>,
    pub report: Option<&'a Path>,
    pub force: bool,
    pub threads: Option<usize>,
    pub chaos: bool,
    pub horizon_hours: Option<f64>,
    pub max_jobs: Option<usize>,
    pub traces: Option<&'a Path>,
}

/// Seeds one command may run (a typo such as `1..=1000000000` is refused, not run for days).
const MAX_SEEDS: u64 = 1_000_000;

/// Parses `A..B` (exclusive) or `A..=B` (inclusive).
pub(crate) fn parse_seed_range(text: &str) -> Result<Vec<u64>, String> {
    let bad = || format!("expected a seed range such as `1..100` or `1..=100`, found {text:?}");
    let (a, b, inclusive) = match text.split_once("..=") {
        Some((a, b)) => (a, b, true),
        None => text
            .split_once("..")
            .map(|(a, b)| (a, b, false))
            .ok_or_else(bad)?,
    };
    let a: u64 = a.trim().parse().map_err(|_| bad())?;
    let b: u64 = b.trim().parse().map_err(|_| bad())?;
    let end = if inclusive { b.saturating_add(1) } else { b };
    if end <= a {
        return Err(format!("the seed range {text:?} is empty"));
    }
    if end - a > MAX_SEEDS {
        return Err(format!(
            "the seed range {text:?} has {} seeds; at most {MAX_SEEDS} per command",
            end - a
        ));
    }
    Ok((a..end).collect())
}

/// Loads every file. An invalid or unreadable scenario stops the command before anything
/// runs; a scenario whose data files are missing (only that) is reported and left out, the
/// others run, and the command then exits with [`ExitStatus::Io`]. Returns the scenarios
/// and the reports of those left out.
fn load_all(files: &[PathBuf], traces: Option<&Path>) -> Result<(Vec<Scenario>, String), Failure> {
    let mut scenarios = Vec::new();
    let mut errors = String::new();
    let mut missing = String::new();
    let mut status = ExitStatus::Io;
    for file in files {
        match scenario::load_with(file, traces) {
            Ok(s) => scenarios.push(s),
            Err(e @ ScenarioError::Missing(_)) => missing.push_str(&e.to_string()),
            Err(e) => {
                if matches!(e, ScenarioError::Invalid(_)) {
                    status = ExitStatus::Invalid;
                }
                errors.push_str(&e.to_string());
            }
        }
    }
    if !errors.is_empty() || scenarios.is_empty() {
        errors.push_str(&missing);
        return Err(Failure {
            message: errors,
            status,
        });
    }
    Ok((scenarios, missing))
}

/// One unit of work.
struct Job<'a> {
    scenario: &'a Scenario,
    policy: String,
    seed: u64,
}

pub(crate) fn run(args: SimulateArgs<'_>) -> Result<ExitStatus, Failure> {
    if args.files.is_empty() {
        return Err(Failure {
            message: "error: no scenario given\n  = hint: tpu-runner simulate scenarios/*.yaml\n"
                .into(),
            status: ExitStatus::Usage,
        });
    }
    // The same scenario twice would run its seeds twice and report them as more seeds.
    for (i, f) in args.files.iter().enumerate() {
        let key = |p: &Path| p.canonicalize().unwrap_or_else(|_| p.to_path_buf());
        if args.files[..i].iter().any(|g| key(g) == key(f)) {
            return Err(Failure {
                message: format!(
                    "error: `{}` is given twice: each scenario runs once per seed and policy\n",
                    f.display()
                ),
                status: ExitStatus::Usage,
            });
        }
    }
    if let Some(h) = args.horizon_hours
        && !(h.is_finite() && h > 0.0 && h <= 24.0 * 366.0)
    {
        return Err(Failure {
            message: format!(
                "error: --horizon-hours must be a positive number of hours, at most a year \
                 (8784), found {h}\n"
            ),
            status: ExitStatus::Usage,
        });
    }
    // Outputs are checked before anything runs: no flag may overwrite an input, and a bad
    // path fails now rather than after a long run.
    if let Some(path) = args.output {
        let same = |a: &Path, b: &Path| match (a.canonicalize(), b.canonicalize()) {
            (Ok(a), Ok(b)) => a == b,
            _ => false,
        };
        if args.files.iter().any(|f| same(f, path)) {
            return Err(Failure {
                message: format!(
                    "error: --output `{}` is one of the scenario files: it would be overwritten\n",
                    path.display()
                ),
                status: ExitStatus::Usage,
            });
        }
        super::check_output(path, args.force)?;
    }
    if let Some(dir) = args.report {
        report::check_dir(dir, args.force).map_err(|message| Failure {
            message: format!("error: --report: {message}\n"),
            status: ExitStatus::Io,
        })?;
    }
    let (mut scenarios, left_out) = load_all(args.files, args.traces)?;
    for s in &mut scenarios {
        // Faults are fixed before any override, so a shortened replay keeps the same faults.
        if args.chaos && s.chaos.is_none() {
            s.chaos = Some(ChaosSpec::defaults(s.horizon_secs));
        }
        apply_limits(s, args.horizon_hours, args.max_jobs);
    }
    let seeds_override = match (args.seed, args.seeds) {
        (Some(s), None) => Some(vec![s]),
        (None, Some(r)) => Some(parse_seed_range(r).map_err(|e| Failure {
            message: format!("error: --seeds: {e}\n"),
            status: ExitStatus::Usage,
        })?),
        (Some(_), Some(_)) => {
            return Err(Failure {
                message: "error: give --seed or --seeds, not both\n".into(),
                status: ExitStatus::Usage,
            });
        }
        (None, None) => None,
    };
    let policies_override: Option<Vec<String>> = match args.policies {
        Some(list) => {
            let names: Vec<String> = list
                .split(',')
                .map(|s| s.trim().to_owned())
                .filter(|s| !s.is_empty())
                .collect();
            if names.is_empty() {
                return Err(Failure {
                    message: format!(
                        "error: --policy names no policy\n  = hint: known policies: {}\n",
                        policy::NAMES.join(", ")
                    ),
                    status: ExitStatus::Usage,
                });
            }
            if let Some((_, twice)) = names
                .iter()
                .enumerate()
                .find(|(i, n)| names[..*i].contains(n))
            {
                return Err(Failure {
                    message: format!("error: --policy names `{twice}` twice\n"),
                    status: ExitStatus::Usage,
                });
            }
            if let Some(bad) = names.iter().find(|n| policy::by_name(n).is_none()) {
                return Err(Failure {
                    message: format!(
                        "error: unknown policy `{bad}`\n  = hint: known policies: {}\n",
                        policy::NAMES.join(", ")
                    ),
                    status: ExitStatus::Usage,
                });
            }
            Some(names)
        }
        None => None,
    };
    // Shown once the arguments are known good, before the table.
    eprint!("{left_out}");
    let mut work = Vec::new();
    for s in &scenarios {
        for p in policies_override.as_ref().unwrap_or(&s.policies) {
            for seed in seeds_override.as_ref().unwrap_or(&s.seeds) {
                work.push(Job {
                    scenario: s,
                    policy: p.clone(),
                    seed: *seed,
                });
            }
        }
    }
    let threads = args
        .threads
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
        .clamp(1, 64);
    let results: Mutex<Vec<(usize, Result<RunResult, Violation>)>> = Mutex::new(Vec::new());
    let next = AtomicUsize::new(0);
    let done = AtomicUsize::new(0);
    let progress = std::io::stderr().is_terminal();
    let started = std::time::Instant::now();
    std::thread::scope(|scope| {
        for _ in 0..threads.min(work.len().max(1)) {
            scope.spawn(|| {
                loop {
                    let i = next.fetch_add(1, Ordering::SeqCst);
                    let Some(job) = work.get(i) else { break };
                    let result = run_one(job.scenario, &job.policy, job.seed);
                    let failed = result.is_err();
                    results.lock().expect("no poisoned lock").push((i, result));
                    let k = done.fetch_add(1, Ordering::SeqCst) + 1;
                    if progress {
                        eprint!(
                            "\r\x1b[K[{k}/{}] {} · {} · seed {}",
                            work.len(),
                            job.scenario.name,
                            job.policy,
                            job.seed
                        );
                    }
                    if failed {
                        next.store(work.len(), Ordering::SeqCst);
                    }
                }
            });
        }
    });
    if progress {
        eprint!("\r\x1b[K");
    }
    let wall_s = started.elapsed().as_secs_f64();
    let mut results = results.into_inner().expect("no poisoned lock");
    results.sort_by_key(|(i, _)| *i);
    let mut ok = Vec::new();
    for (i, r) in results {
        match r {
            Ok(r) => ok.push(r),
            Err(v) => return Err(violation_failure(&work[i], &v, args.chaos)),
        }
    }
    if let Some(dir) = args.report {
        report::write_dir(dir, &ok).map_err(|e| Failure {
            message: format!("error: {e}\n"),
            status: ExitStatus::Io,
        })?;
    }
    if let Some(path) = args.output {
        super::write_output(path, &report::json(&ok), args.force)?;
    }
    if args.json {
        print_stdout(&report::json(&ok));
    } else {
        print_stdout(&report::table(&ok));
    }
    if let Some(dir) = args.report {
        eprintln!("report written to {}", dir.join("index.html").display());
    }
    eprintln!(
        "{}",
        throughput(&ok, wall_s, threads.min(work.len().max(1)))
    );
    if left_out.is_empty() {
        Ok(ExitStatus::Ok)
    } else {
        eprintln!("error: scenarios whose data files could not be read (above) were left out");
        Ok(ExitStatus::Io)
    }
}

/// One line for stderr: how much simulated time and how many events the command covered per
/// wall second (runs share the threads), and the same per run.
fn throughput(runs: &[RunResult], wall_s: f64, threads: usize) -> String {
    let simulated_s: f64 = runs.iter().map(|r| r.metrics.simulated_s).sum();
    let run_wall_s: f64 = runs.iter().map(|r| r.metrics.wall_s).sum();
    let events: u64 = runs
        .iter()
        .map(|r| r.metrics.events + r.metrics.engine_events)
        .sum();
    let rate = |x: f64, wall: f64| {
        let r = if wall > 0.0 { x / wall } else { 0.0 };
        match r {
            r if r >= 1e6 => format!("{:.2} M", r / 1e6),
            r if r >= 1e3 => format!("{:.0} k", r / 1e3),
            r => format!("{r:.0}"),
        }
    };
    let plural = |n: usize| if n == 1 { "" } else { "s" };
    format!(
        "simulated {:.0} h in {wall_s:.2} s wall ({} run{} on {threads} thread{}): {} simulated s \
         and {} events per wall s; {} simulated s per s of one run",
        simulated_s / 3600.0,
        runs.len(),
        plural(runs.len()),
        plural(threads),
        rate(simulated_s, wall_s),
        rate(events as f64, wall_s),
        rate(simulated_s, run_wall_s),
    )
}

/// Overrides the horizon and caps every workload at `max_jobs` jobs.
fn apply_limits(s: &mut Scenario, horizon_hours: Option<f64>, max_jobs: Option<usize>) {
    if let Some(h) = horizon_hours {
        s.horizon_secs = (h * 3600.0).max(1.0) as u64;
    }
    if let Some(n) = max_jobs {
        for w in &mut s.workloads {
            match w {
                WorkloadSpec::Synthetic(w) => w.count = w.count.min(n),
                WorkloadSpec::Trace(t) => t.limit = t.limit.min(n),
            }
        }
    }
}

/// One run; invariants are checked whenever faults are on.
fn run_one(scenario: &Scenario, policy: &str, seed: u64) -> Result<RunResult, Violation> {
    let options = RunOptions {
        chaos: scenario.chaos,
        check_invariants: scenario.chaos.is_some(),
        ..RunOptions::default()
    };
    harness::run(scenario, policy, seed, options, Default::default())
}

/// The same broken invariant in a shorter run: the horizon cut just after the violation, then
/// the workloads halved while it still breaks. Returns (hours, jobs per workload, violation).
fn shrink(job: &Job<'_>, v: &Violation) -> Option<(f64, Option<usize>, Violation)> {
    let kind = |m: &str| m.split(':').next().unwrap_or(m).to_owned();
    let target = kind(&v.message);
    let hours =
        ((v.at_s + job.scenario.reconcile_interval_secs as f64) / 3600.0 * 100.0).ceil() / 100.0;
    let mut scenario = job.scenario.clone();
    apply_limits(&mut scenario, Some(hours), None);
    let mut best = match run_one(&scenario, &job.policy, job.seed) {
        Err(found) if kind(&found.message) == target => (hours, None, found),
        _ => return None,
    };
    let total: usize = scenario
        .workloads
        .iter()
        .map(|w| match w {
            WorkloadSpec::Synthetic(w) => w.count,
            WorkloadSpec::Trace(t) => t.limit.min(t.arrivals.len()),
        })
        .max()
        .unwrap_or(0);
    let mut limit = total / 2;
    for _ in 0..12 {
        if limit == 0 {
            break;
        }
        let mut smaller = scenario.clone();
        apply_limits(&mut smaller, None, Some(limit));
        match run_one(&smaller, &job.policy, job.seed) {
            Err(found) if kind(&found.message) == target => {
                best = (hours, Some(limit), found);
                limit /= 2;
            }
            _ => break,
        }
    }
    Some(best)
}

fn violation_failure(job: &Job<'_>, v: &Violation, chaos_flag: bool) -> Failure {
    let mut message = format!(
        "error: invariant violated in scenario `{}` with policy `{}`, seed {}, at {:.0} s simulated:\n  {}\n",
        job.scenario.name, job.policy, job.seed, v.at_s, v.message
    );
    if !v.recent_events.is_empty() {
        message.push_str("last events:\n");
        for e in &v.recent_events {
            message.push_str(&format!(
                "  {} {} {}\n",
                e.at,
                e.kind,
                e.job_id
                    .as_deref()
                    .or(e.resource_id.as_deref())
                    .unwrap_or("")
            ));
        }
    }
    let chaos = if chaos_flag { " --chaos" } else { "" };
    let replay = format!(
        "tpu-runner simulate {}{chaos} --policy {} --seed {}",
        job.scenario.path.display(),
        job.policy,
        job.seed
    );
    message.push_str(&format!("replay: {replay}\n"));
    if let Some((hours, jobs, found)) = shrink(job, v) {
        let jobs_flag = jobs.map_or(String::new(), |n| format!(" --max-jobs {n}"));
        message.push_str(&format!(
            "shrunk: the same invariant breaks at {:.0} s in a run of {hours} h{}:\n  {}\nreplay the shrunk run: {replay} --horizon-hours {hours}{jobs_flag}\n",
            found.at_s,
            jobs.map_or(String::new(), |n| format!(" with at most {n} jobs per workload")),
            found.message,
        ));
    }
    Failure {
        message,
        status: ExitStatus::Violation,
    }
}
