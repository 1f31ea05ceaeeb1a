//! `simulate`: runs scenarios × policies × seeds (in parallel across seeds), prints a table,
//! writes JSON and an HTML report on request, and on an invariant violation prints the seed,
//! the broken invariant, the last events and the command that replays the run.

use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use super::exit_codes::ExitStatus;
use super::{Failure, print_stdout};
use crate::simulate::harness::{self, RunOptions, RunResult, Violation};
use crate::simulate::report;
use crate::simulate::scenario::{self, ChaosSpec, Scenario, ScenarioError, WorkloadSpec};
use crate::spec::PolicyName;

/// Options of `simulate`.
pub(crate) struct SimulateArgs<'a> {
    pub files: &'a [PathBuf],
    pub fleet: Option<&'a Path>,
    pub save_scenario: Option<&'a Path>,
    pub seed: Option<u64>,
    pub seeds: Option<&'a str>,
    pub policies: Option<&'a str>,
    pub variants: Option<&'a Path>,
    pub compare: bool,
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
                    if is_fleet_file(file) {
                        errors.push_str(&format!(
                            "error: `{0}` is a fleet file (deployment.yaml), not a scenario\n  = hint: simulate your fleet against a default cloud and workload with `tpu-runner simulate --fleet {0}` (add `--save-scenario my-fleet.yaml` to edit them)\n",
                            file.display()
                        ));
                        continue;
                    }
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

/// Whether `file` reads as a fleet file: its top level has `tpus` and no `horizon_hours`.
fn is_fleet_file(file: &Path) -> bool {
    let Ok(text) = crate::files::read_text(file, crate::files::SPEC_LIMIT) else {
        return false;
    };
    let top = |key: &str| text.lines().any(|l| l.starts_with(key));
    top("tpus:") && !top("horizon_hours:")
}

/// The default scenario around the fleet file at `fleet_path` (`--fleet`), also written to
/// `save` when given.
fn fleet_scenario(
    fleet_path: &Path,
    save: Option<&Path>,
    force: bool,
) -> Result<Scenario, Failure> {
    let fleet = super::validate::load_fleet(fleet_path)?;
    let absolute = std::path::absolute(fleet_path).unwrap_or_else(|_| fleet_path.to_path_buf());
    let text = crate::simulate::starter::scenario_for(&absolute, &fleet);
    if let Some(path) = save {
        super::check_output(path, force)?;
    }
    let at = absolute.with_file_name(format!("{}-default.yaml", fleet.name));
    let scenario = scenario::parse(&at, &text).map_err(|e| Failure {
        message: format!(
            "error: the scenario made for `{}` is invalid (a bug):\n{e}",
            fleet_path.display()
        ),
        status: ExitStatus::Invalid,
    })?;
    if let Some(path) = save {
        super::write_output(path, &text, force)?;
        eprintln!(
            "wrote the scenario around `{}` to `{}`",
            fleet_path.display(),
            path.display()
        );
    }
    Ok(scenario)
}

/// One unit of work.
struct Job<'a> {
    scenario: &'a Scenario,
    policy: String,
    seed: u64,
}

pub(crate) fn run(args: SimulateArgs<'_>) -> Result<ExitStatus, Failure> {
    if args.files.is_empty() && args.fleet.is_none() {
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
    let (mut scenarios, left_out) = if args.files.is_empty() {
        (Vec::new(), String::new())
    } else {
        load_all(args.files, args.traces)?
    };
    if let Some(fleet_path) = args.fleet {
        scenarios.push(fleet_scenario(fleet_path, args.save_scenario, args.force)?);
    }
    for s in &mut scenarios {
        // Faults are fixed before any override, so a shortened replay keeps the same faults.
        if args.chaos && s.chaos.is_none() {
            s.chaos = Some(ChaosSpec::defaults(s.horizon_secs));
        }
        apply_limits(s, args.horizon_hours, args.max_jobs);
        scenario::check_replayed_jobs(s).map_err(|message| Failure {
            message,
            status: ExitStatus::Invalid,
        })?;
    }
    if let Some(path) = args.variants {
        let text =
            crate::files::read_text(path, crate::files::SPEC_LIMIT).map_err(|e| Failure {
                message: format!("error: cannot read `{}`: {e}\n", path.display()),
                status: ExitStatus::Io,
            })?;
        for s in &mut scenarios {
            let (labels, variants) = scenario::read_variants(path, &text, &s.fleet.policy)
                .map_err(|e| Failure {
                    message: e.to_string(),
                    status: if matches!(e, ScenarioError::Invalid(_)) {
                        ExitStatus::Invalid
                    } else {
                        ExitStatus::Io
                    },
                })?;
            s.policies = labels;
            s.variants.extend(variants);
        }
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
                        PolicyName::list()
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
            // Each label must be a policy name or a variant of every scenario run.
            for s in &scenarios {
                if let Some(bad) = names.iter().find(|n| s.policy(n).is_none()) {
                    return Err(Failure {
                        message: format!(
                            "error: unknown policy `{bad}` for scenario `{}`\n  = hint: its policies: {}\n",
                            s.name,
                            s.labels().join(", ")
                        ),
                        status: ExitStatus::Usage,
                    });
                }
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
    // On a terminal (or with TPU_RUNNER_PROGRESS=1): the progress of the runs, on stderr.
    let progress = std::io::stderr().is_terminal()
        || std::env::var("TPU_RUNNER_PROGRESS").as_deref() == Ok("1");
    let started = std::time::Instant::now();
    let workers = threads.min(work.len().max(1));
    // Per worker thread: the run it is on (index + 1; 0: none) and its simulated ms.
    let slots: Vec<(AtomicUsize, AtomicU64)> = (0..workers)
        .map(|_| (AtomicUsize::new(0), AtomicU64::new(0)))
        .collect();
    let finished_ms = AtomicU64::new(0);
    // Worker threads still running: the progress line ends with the last.
    let live = AtomicUsize::new(workers);
    std::thread::scope(|scope| {
        for slot in &slots {
            let (results, next, done, work, finished_ms, live) =
                (&results, &next, &done, &work, &finished_ms, &live);
            scope.spawn(move || {
                // Counted out however the thread ends (a panic included).
                let _live = Live(live);
                loop {
                    let i = next.fetch_add(1, Ordering::SeqCst);
                    let Some(job) = work.get(i) else { break };
                    slot.1.store(0, Ordering::Relaxed);
                    slot.0.store(i + 1, Ordering::Relaxed);
                    let result = run_one(job.scenario, &job.policy, job.seed, Some(&slot.1));
                    slot.0.store(0, Ordering::Relaxed);
                    finished_ms.fetch_add(job.scenario.horizon_secs * 1000, Ordering::Relaxed);
                    let failed = result.is_err();
                    results.lock().expect("no poisoned lock").push((i, result));
                    done.fetch_add(1, Ordering::SeqCst);
                    if failed {
                        next.store(work.len(), Ordering::SeqCst);
                    }
                }
            });
        }
        // On a terminal, a line twice a second: runs done, the runs in progress (simulated
        // time / horizon), elapsed and an estimate of what is left.
        if progress {
            let (slots, work, done, live, finished_ms) =
                (&slots, &work, &done, &live, &finished_ms);
            scope.spawn(move || {
                let total_ms: u64 = work.iter().map(|j| j.scenario.horizon_secs * 1000).sum();
                loop {
                    for _ in 0..10 {
                        if live.load(Ordering::SeqCst) == 0 {
                            eprint!("\r\x1b[K");
                            return;
                        }
                        std::thread::sleep(std::time::Duration::from_millis(50));
                    }
                    let mut covered = finished_ms.load(Ordering::Relaxed);
                    let mut running = Vec::new();
                    for (job, at) in slots {
                        let Some(job) = job.load(Ordering::Relaxed).checked_sub(1) else {
                            continue;
                        };
                        let j = &work[job];
                        let at = at.load(Ordering::Relaxed);
                        covered += at;
                        let horizon = (j.scenario.horizon_secs * 1000).max(1);
                        running.push(format!(
                            "{} · {} · seed {} {:.0}%",
                            j.scenario.name,
                            j.policy,
                            j.seed,
                            100.0 * at as f64 / horizon as f64
                        ));
                    }
                    let elapsed = started.elapsed().as_secs_f64();
                    let eta = if covered > 0 {
                        format!(
                            ", at most ~{:.0} s left",
                            elapsed * (total_ms.saturating_sub(covered)) as f64 / covered as f64
                        )
                    } else {
                        String::new()
                    };
                    eprint!(
                        "\r\x1b[K[{}/{} runs] {} · {elapsed:.0} s{eta}",
                        done.load(Ordering::Relaxed),
                        work.len(),
                        running.join(", ")
                    );
                }
            });
        }
    });
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
        let context = report::Context {
            command: std::env::args().collect::<Vec<_>>().join(" "),
            generated_at: jiff::Timestamp::now()
                .round(jiff::Unit::Second)
                .map_or_else(|_| jiff::Timestamp::now().to_string(), |t| t.to_string()),
            descriptions: scenarios
                .iter()
                .map(|s| (s.name.clone(), s.description.clone()))
                .collect(),
            chip_limits: scenarios
                .iter()
                .map(|s| (s.name.clone(), report::ChipLimits::of(&s.fleet)))
                .collect(),
        };
        report::write_dir(dir, &ok, &context).map_err(|e| Failure {
            message: format!("error: {e}\n"),
            status: ExitStatus::Io,
        })?;
    }
    if let Some(path) = args.output {
        super::write_output(path, &report::json(&ok), args.force)?;
    }
    if args.json {
        print_stdout(&report::json(&ok));
    } else if args.compare {
        print_stdout(&report::compare(&ok));
    } else {
        print_stdout(&(report::table(&ok) + &report::paired_comparisons(&ok)));
    }
    if let Some(dir) = args.report {
        eprintln!("report written to {}", dir.join("index.html").display());
    }
    for note in notes(&ok, args.chaos) {
        eprintln!("{note}");
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
                WorkloadSpec::Jobs(jobs) => jobs.truncate(n),
                WorkloadSpec::Queue(q) => q.jobs.truncate(n),
            }
        }
    }
}

/// One run; invariants are checked whenever faults are on.
fn run_one(
    scenario: &Scenario,
    policy: &str,
    seed: u64,
    progress: Option<&AtomicU64>,
) -> Result<RunResult, Violation> {
    let options = RunOptions {
        chaos: scenario.chaos,
        check_invariants: scenario.chaos.is_some(),
        ..RunOptions::default()
    };
    let hooks = harness::Hooks {
        progress,
        ..Default::default()
    };
    harness::run(scenario, policy, seed, options, hooks)
}

/// The same broken invariant in a shorter run: the horizon cut just after the violation, then
/// the workloads halved while it still breaks. Returns (hours, jobs per workload, violation).
fn shrink(job: &Job<'_>, v: &Violation) -> Option<(f64, Option<usize>, Violation)> {
    let kind = |m: &str| m.split(':').next().unwrap_or(m).to_owned();
    let target = kind(&v.message);
    let hours = ((v.at_s + job.scenario.fleet.policy.engine.reconcile_interval_secs as f64)
        / 3600.0
        * 100.0)
        .ceil()
        / 100.0;
    let mut scenario = job.scenario.clone();
    apply_limits(&mut scenario, Some(hours), None);
    let mut best = match run_one(&scenario, &job.policy, job.seed, None) {
        Err(found) if kind(&found.message) == target => (hours, None, found),
        _ => return None,
    };
    let total: usize = scenario
        .workloads
        .iter()
        .map(|w| match w {
            WorkloadSpec::Synthetic(w) => w.count,
            WorkloadSpec::Trace(t) => t.limit.min(t.arrivals.len()),
            WorkloadSpec::Jobs(jobs) => jobs.len(),
            WorkloadSpec::Queue(q) => q.jobs.len(),
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
        match run_one(&smaller, &job.policy, job.seed, None) {
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

/// A running worker thread, counted out when dropped.
struct Live<'a>(&'a AtomicUsize);

impl Drop for Live<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// What a reader of the table should know: runs that measured nothing (every API call
/// failed; no capacity ever allocated while jobs waited), and a chaos sweep's verdict.
fn notes(runs: &[RunResult], chaos: bool) -> Vec<String> {
    let mut notes = Vec::new();
    for r in runs {
        let m = &r.metrics;
        let run = format!("{} · {} · seed {}", r.scenario, r.policy, r.seed);
        let calls: u64 = m.api_calls.values().sum();
        let errors: u64 = m.api_errors.values().sum();
        if calls > 0 && errors >= calls {
            notes.push(format!(
                "note: {run}: every one of its {calls} API calls failed: its row measures the faults, not a policy"
            ));
        } else if m.allocated_chip_hours == 0.0 && m.jobs_submitted > 0 {
            notes.push(format!(
                "note: {run}: no capacity was ever allocated while {} jobs waited (zero capacity, or none obtainable)",
                m.jobs_submitted
            ));
        }
    }
    if chaos && !runs.is_empty() {
        let checks: u64 = runs.iter().map(|r| r.metrics.invariant_checks).sum();
        notes.push(format!(
            "chaos: {} runs with faults injected, every invariant held ({checks} checks, one after every step)",
            runs.len()
        ));
    }
    notes
}
