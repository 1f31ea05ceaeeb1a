//! `tpu-runner emulator`: serves a scenario's simulated cloud as a local TPU API (nodes,
//! queued resources, operations; control and simulated-worker routes) until interrupted,
//! and prints where it listens and what to export.

use std::path::Path;
use std::time::Instant;

use super::{ExitStatus, Failure, print_stdout};
use crate::emulator::{self, Clock, World};
use crate::simulate::harness;
use crate::simulate::scenario::{self, Scenario};

/// The scenario served when none is named: the shipped smoke scenario.
const DEFAULT_SCENARIO: &str = include_str!("../../scenarios/smoke.yaml");

/// The command's arguments.
pub struct EmulatorArgs<'a> {
    /// Scenario file (default: the built-in smoke scenario).
    pub scenario: Option<&'a Path>,
    /// Address to listen on.
    pub listen: &'a str,
    /// Seed of the simulated world (default: the scenario's first).
    pub seed: Option<u64>,
    /// Virtual seconds per wall second.
    pub speed: f64,
    /// Time moves only through `POST /emulator/v1/time`.
    pub virtual_time: bool,
    /// Worker roots of the TPUs' local agents.
    pub workers: Option<&'a Path>,
    /// Folder of `$TRACES/...` files.
    pub traces: Option<&'a Path>,
}

fn usage(message: String) -> Failure {
    Failure {
        message,
        status: ExitStatus::Usage,
    }
}

/// Runs the emulator (returns only on a failure to start).
pub fn run(args: EmulatorArgs<'_>) -> Result<ExitStatus, Failure> {
    if !(args.speed.is_finite() && args.speed > 0.0) {
        return Err(usage(format!(
            "error: --speed must be a positive number of virtual seconds per second, found {}\n",
            args.speed
        )));
    }
    let (scenario, source): (Scenario, String) = match args.scenario {
        Some(path) => {
            let s = scenario::load_with(path, args.traces).map_err(|e| Failure {
                message: format!("{e}\n"),
                status: ExitStatus::Invalid,
            })?;
            (s, path.display().to_string())
        }
        None => {
            let s = scenario::parse_with(Path::new("scenarios/smoke.yaml"), DEFAULT_SCENARIO, None)
                .map_err(|e| Failure {
                    message: format!("built-in scenario: {e}\n"),
                    status: ExitStatus::Invalid,
                })?;
            (s, "the built-in smoke scenario".to_owned())
        }
    };
    let seed = args
        .seed
        .or_else(|| scenario.seeds.first().copied())
        .unwrap_or(1);
    let (sim, _) = harness::world_of(&scenario, seed, None);
    let clock = if args.virtual_time {
        Clock::Virtual
    } else {
        Clock::Wall {
            started: Instant::now(),
            from_ms: 0,
            speed: args.speed,
        }
    };
    let mut world = World::new(sim, &scenario.fleet.project, clock);
    world.workers = args.workers.map(Path::to_path_buf);
    let zones = world.zones();
    let project = world.project.clone();
    let running = emulator::start(world.shared(), args.listen).map_err(|e| Failure {
        message: format!("error: cannot listen on {}: {e}\n", args.listen),
        status: ExitStatus::Io,
    })?;
    let url = running.url();
    let clock = if args.virtual_time {
        "virtual time (POST /emulator/v1/time moves it)".to_owned()
    } else {
        format!("wall clock × {}", args.speed)
    };
    let mut text = format!(
        "TPU API emulator on {url}: project {project}, {source}, seed {seed}, {clock}\nzones: {}\n\nPoint tpu-runner (and your own tools) at it:\n",
        zones.join(", ")
    );
    for (var, value) in emulator::environment(&running) {
        text.push_str(&format!("  export {var}={value}\n"));
    }
    let zone = zones.first().map_or("us-east1-d", String::as_str);
    text.push_str(&format!(
        "\nTry:\n  curl {url}/v2/projects/{project}/locations/{zone}/nodes\n  curl {url}/emulator/v1/status\n  curl -X POST {url}/emulator/v1/zones/{zone}/stockout -d '{{\"on\": true}}' -H 'content-type: application/json'\n\nStop with Ctrl-C.\n"
    ));
    print_stdout(&text);
    running.wait();
    Ok(ExitStatus::Ok)
}
