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
use crate::simulate::scenario::{self, ChaosSpec, Scenario};

/// Options of `simulate`.
pub(crate) struct SimulateArgs<'a> {
    pub files: &'a [PathBuf],
    pub seed: Option<u64>,
    pub seeds: Option<&'a str>,
    pub policies: Option<&'a str>,
    pub json: Option<&'a str>,
    pub report: Option<&'a Path>,
    pub threads: Option<usize>,
    pub chaos: bool,
}

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
    Ok((a..end).collect())
}

fn load_all(files: &[PathBuf]) -> Result<Vec<Scenario>, Failure> {
    let mut scenarios = Vec::new();
    let mut errors = String::new();
    for file in files {
        match scenario::load(file) {
            Ok(s) => scenarios.push(s),
            Err(e) => errors.push_str(&e.to_string()),
        }
    }
    if !errors.is_empty() {
        let status = if errors.contains("cannot read") {
            ExitStatus::Io
        } else {
            ExitStatus::Invalid
        };
        return Err(Failure {
            message: errors,
            status,
        });
    }
    Ok(scenarios)
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
    let scenarios = load_all(args.files)?;
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
    std::thread::scope(|scope| {
        for _ in 0..threads.min(work.len().max(1)) {
            scope.spawn(|| {
                loop {
                    let i = next.fetch_add(1, Ordering::SeqCst);
                    let Some(job) = work.get(i) else { break };
                    let chaos = job.scenario.chaos.or_else(|| {
                        args.chaos
                            .then(|| ChaosSpec::defaults(job.scenario.horizon_secs))
                    });
                    let options = RunOptions {
                        chaos,
                        check_invariants: args.chaos,
                        ..RunOptions::default()
                    };
                    let result = harness::run(
                        job.scenario,
                        &job.policy,
                        job.seed,
                        options,
                        Default::default(),
                    );
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
    let mut results = results.into_inner().expect("no poisoned lock");
    results.sort_by_key(|(i, _)| *i);
    let mut ok = Vec::new();
    for (i, r) in results {
        match r {
            Ok(r) => ok.push(r),
            Err(v) => return Err(violation_failure(&work[i], &v)),
        }
    }
    if let Some(dir) = args.report {
        report::write_dir(dir, &ok).map_err(|e| Failure {
            message: format!("error: {e}\n"),
            status: ExitStatus::Io,
        })?;
    }
    match args.json {
        Some("-") => print_stdout(&report::json(&ok)),
        Some(path) => {
            std::fs::write(path, report::json(&ok))
                .map_err(|e| Failure::io("write", Path::new(path), &e, None))?;
            print_stdout(&report::table(&ok));
        }
        None => print_stdout(&report::table(&ok)),
    }
    if let Some(dir) = args.report {
        eprintln!("report written to {}", dir.join("index.html").display());
    }
    Ok(ExitStatus::Ok)
}

fn violation_failure(job: &Job<'_>, v: &Violation) -> Failure {
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
    let chaos = if job.scenario.chaos.is_some() {
        ""
    } else {
        " --chaos"
    };
    message.push_str(&format!(
        "replay: tpu-runner simulate {}{chaos} --policy {} --seed {}\n",
        job.scenario.path.display(),
        job.policy,
        job.seed
    ));
    Failure {
        message,
        status: ExitStatus::Violation,
    }
}
