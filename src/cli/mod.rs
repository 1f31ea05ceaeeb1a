//! The `tpu-runner` command line: argument parsing (clap), dispatch to commands, error
//! rendering and exit codes. Data goes to stdout, diagnostics to stderr. The only module
//! allowed to print or exit.

mod capture;
mod controller;
mod dashboard;
mod deploy;
mod emulator;
mod events;
mod exit_codes;
mod follow;
mod jobs;
mod output;
mod plan;
mod queue;
mod report;
mod simulate;
mod stack;
mod state;
mod validate;
mod worker;

pub(crate) use crate::table::table;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::{CommandFactory, Parser, Subcommand};

pub use exit_codes::ExitStatus;

const INIT_TEMPLATE: &str = include_str!("templates/deployment.yaml");

/// tpu-runner keeps every chip of a Google Cloud TPU allocation busy.
#[derive(Debug, Parser)]
#[command(name = "tpu-runner", version, about, long_about = None, after_help = EXIT_CODES_HELP)]
pub struct Cli {
    #[command(subcommand)]
    command: Command,
}

const EXIT_CODES_HELP: &str = "\
Exit codes (each command's --help says which it uses and what they mean there):
  0  success
  1  the input was read but is invalid (or, for watch, the run did not succeed)
  2  usage error (unknown command, bad flag), or a refused request (a taken id)
  3  a file could not be read or written (a missing manifest or fleet)
  4  a simulated run broke an invariant (the seed and a replay command are printed)
  5  the state store failed (unreachable, damaged, refused; the message says what to do)
  75 probe-adopted-device-owners: a process holds an accelerator device
  130 interrupted by Ctrl-C";

#[derive(Debug, Subcommand)]
enum Command {
    /// Write a commented example fleet file (never overwrites).
    #[command(
        after_help = "Example:\n  tpu-runner init deployment.yaml\n  tpu-runner validate-fleet deployment.yaml"
    )]
    Init {
        /// Where to write the example.
        #[arg(default_value = "deployment.yaml")]
        path: PathBuf,
    },
    /// Validate a fleet file and print its normalised form.
    #[command(
        after_help = "Example:\n  tpu-runner validate-fleet deployment.yaml --json | jq '.tpus[].id'"
    )]
    ValidateFleet {
        /// The fleet file.
        #[arg(default_value = "deployment.yaml")]
        path: PathBuf,
        /// Print JSON instead of a summary.
        #[arg(long)]
        json: bool,
    },
    /// Validate a job manifest and print its normalised form.
    #[command(after_help = "Example:\n  tpu-runner validate-jobs job.yaml --fleet deployment.yaml")]
    ValidateJobs {
        /// The job manifest.
        #[arg(default_value = "job.yaml")]
        path: PathBuf,
        /// Also check every job can run on this fleet.
        #[arg(long, value_name = "DEPLOYMENT")]
        fleet: Option<PathBuf>,
        /// Also read where each job's buckets are, as `submit` does, and show only the
        /// entries in their regions (the rule `plan` applies).
        #[arg(long, requires = "fleet")]
        buckets: bool,
        /// With --buckets: the local object folder (one folder per bucket; default: the
        /// local stack's, else Cloud Storage). Not required to be with --buckets: the job
        /// commands' environment may set it.
        #[arg(long, env = "TPU_RUNNER_OBJECTS", value_name = "DIR")]
        objects: Option<PathBuf>,
        /// Print JSON instead of a summary.
        #[arg(long)]
        json: bool,
    },
    /// Run one reconcile pass on a state snapshot, without touching any cloud.
    #[command(
        after_help = "Example:\n  tpu-runner plan --fleet docs/plan-example/deployment.yaml --state docs/plan-example/state.json --now 2026-01-01T12:00:00Z"
    )]
    Plan {
        /// The fleet (default: the local stack's, else `deployment.yaml`).
        #[arg(long, env = "TPU_RUNNER_DEPLOYMENT")]
        fleet: Option<PathBuf>,
        /// A state snapshot (JSON, docs/state-schema.md); default: the live state of the
        /// store (`--store`, as the job commands find it).
        #[arg(long)]
        state: Option<PathBuf>,
        /// The state store to plan on when no --state is given.
        #[arg(
            long,
            env = "TPU_RUNNER_STORE",
            value_name = "URL",
            conflicts_with = "state"
        )]
        store: Option<String>,
        /// An observation of the cloud (JSON); default: the cloud as the state believes it.
        #[arg(long)]
        observation: Option<PathBuf>,
        /// The pass's time (RFC 3339); default: now.
        #[arg(long)]
        now: Option<String>,
        /// Decide with this policy (its defaults, the fleet's timings) instead of the fleet's
        /// `policy:`: a what-if.
        #[arg(long, value_name = "NAME")]
        policy: Option<String>,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
        /// Write the state after the pass here.
        #[arg(long, value_name = "PATH")]
        write_state: Option<PathBuf>,
    },
    /// Simulate scenarios: the real engine against a deterministic simulated cloud.
    #[command(
        after_help = "Examples:\n  tpu-runner simulate scenarios/*.yaml\n  tpu-runner simulate --fleet deployment.yaml --save-scenario my-fleet.yaml\n  tpu-runner simulate scenarios/regional-stockout.yaml --seeds 1..=20 --output results.json --report report/\n  tpu-runner simulate scenarios/smoke.yaml --json | jq '.records[].metrics.utilization'\n  tpu-runner simulate scenarios/traces/*.yaml --traces ../shared/data\n  tpu-runner simulate --chaos --seeds 1..=1000 scenarios/chaos/*.yaml\n\nColumns (one row per scenario and policy, over its seeds):\n  JOBS OK/FAIL/LEFT  jobs succeeded / failed or cancelled / unfinished at the horizon\n  UTIL               busy ÷ allocated chip-hours\n  GOODPUT            preserved progress ÷ allocated chip-hours (lost work since the last\n                     checkpoint at a preemption does not count)\n  EFFICIENCY         goodput ÷ the max-flow upper bound on the capacity that existed\n                     (1.00: no policy could have done more useful work)\n  WAIT p50, JCT p50  median queue wait and job completion time\n  PREEMPT            Spot preemptions;  COST $  chip-hours × the scenario's prices, and egress\n  SIM h              simulated hours;  WALL s  seconds of computer time per run\n  a ±b               the mean over the seeds and its standard deviation\nEverything stops at the horizon: work after it counts nowhere. On a terminal (or with\nTPU_RUNNER_PROGRESS=1) stderr shows each run's progress."
    )]
    Simulate {
        /// Scenario files.
        #[arg(required_unless_present = "fleet")]
        files: Vec<PathBuf>,
        /// Simulate this fleet file (`deployment.yaml`) against a default cloud and workload,
        /// under `classic` and `frugal`: no scenario to write.
        #[arg(long, value_name = "DEPLOYMENT")]
        fleet: Option<PathBuf>,
        /// With --fleet: also write the scenario it ran here, commented, to edit (never over
        /// an existing file without --force).
        #[arg(long, value_name = "PATH", requires = "fleet")]
        save_scenario: Option<PathBuf>,
        /// Run only this seed.
        #[arg(long)]
        seed: Option<u64>,
        /// Run these seeds: `A..B` (B excluded) or `A..=B`.
        #[arg(long, value_name = "RANGE")]
        seeds: Option<String>,
        /// Policies to compare, comma-separated (default: the scenario's).
        #[arg(long, value_name = "NAME[,NAME...]")]
        policy: Option<String>,
        /// Run the policy variants of this file in every scenario (`policies:`, labels to
        /// variants laid over each scenario's fleet policy, as in a scenario); --policy then
        /// picks among them.
        #[arg(long, value_name = "FILE")]
        variants: Option<PathBuf>,
        /// Print, instead of the table, one Markdown table per scenario comparing its
        /// policies over the seeds: goodput, cost, waits p50/p95 and efficiency with their
        /// 95 % confidence intervals, and each policy's paired difference in goodput from the
        /// first one's.
        #[arg(long, conflicts_with = "json")]
        compare: bool,
        /// Print the JSON records (docs/simulate-json.md) on stdout instead of the table.
        #[arg(long)]
        json: bool,
        /// Also write the JSON records to this file (never over an input, nor over an
        /// existing file without --force); checked before anything runs.
        #[arg(long, value_name = "PATH")]
        output: Option<PathBuf>,
        /// Write SVG plots and an HTML page to DIR (a new or empty folder, or one an earlier
        /// report wrote; its old plots are removed first).
        #[arg(long, value_name = "DIR")]
        report: Option<PathBuf>,
        /// Replace an existing --output file, or write the report into a folder that holds
        /// other files.
        #[arg(long)]
        force: bool,
        /// Worker threads (default: all cores).
        #[arg(long)]
        threads: Option<usize>,
        /// Inject faults (the scenario's `chaos:` settings or the defaults) and check every
        /// invariant after every step; stop at the first violation and print how to replay it.
        #[arg(long)]
        chaos: bool,
        /// Override every scenario's horizon (hours); used by shrunk replays.
        #[arg(long, value_name = "HOURS")]
        horizon_hours: Option<f64>,
        /// Cap every workload at this many jobs; used by shrunk replays.
        #[arg(long, value_name = "N")]
        max_jobs: Option<usize>,
        /// Read a scenario's `$TRACES/...` files from DIR (the spot traces the repository
        /// does not carry: scenarios/traces/README.md).
        #[arg(long, value_name = "DIR", env = "TPU_RUNNER_TRACES")]
        traces: Option<PathBuf>,
    },
    /// Serve a scenario's simulated cloud as a local TPU API, to point the controller, `curl`
    /// or your own tools at (no cloud account, no bill).
    #[command(
        after_help = "Examples:\n  tpu-runner emulator\n  tpu-runner emulator scenarios/regional-stockout.yaml --listen 127.0.0.1:8470 --speed 60\n  tpu-runner emulator scenarios/smoke.yaml --virtual-time\n\nRoutes: the TPU API v2 (nodes, queuedResources, operations) under /v2; control under\n/emulator/v1: GET status, POST time {advanceSecs|toSecs} (virtual time only),\nPOST zones/ZONE/stockout {on}, POST projects/P/locations/Z/nodes/N/preempt.\nSee docs/emulator.md."
    )]
    Emulator {
        /// Scenario whose cloud to serve (default: the built-in smoke scenario).
        scenario: Option<PathBuf>,
        /// Address to listen on (port 0: any free port).
        #[arg(long, default_value = "127.0.0.1:8470", value_name = "ADDR")]
        listen: String,
        /// Seed of the simulated world (default: the scenario's first seed).
        #[arg(long)]
        seed: Option<u64>,
        /// Virtual seconds per wall-clock second.
        #[arg(long, default_value_t = 1.0, value_name = "X")]
        speed: f64,
        /// Move time only through `POST /emulator/v1/time` (for tests).
        #[arg(long, conflicts_with = "speed")]
        virtual_time: bool,
        /// Back the TPUs with worker agents on this machine whose roots are under DIR (the
        /// local transport's layout): a TPU that is preempted or deleted ends their processes,
        /// and a deleted one's disks are emptied.
        #[arg(long, value_name = "DIR")]
        workers: Option<PathBuf>,
        /// Read the scenario's `$TRACES/...` files from DIR.
        #[arg(long, value_name = "DIR", env = "TPU_RUNNER_TRACES")]
        traces: Option<PathBuf>,
    },
    /// Submit the jobs of a manifest: bundles uploaded to every candidate region's bucket,
    /// every job queued at once (or none).
    #[command(
        after_help = "Each submit is a new run of each job, with a fresh id (its name and six letters or\ndigits, shown at once); `watch`, `logs` and `cancel` take the name for its latest run.\nA job with an `id:` in the manifest is submitted once under that id.\n\nExamples:\n  tpu-runner submit examples/hello\n  tpu-runner submit job.yaml --name train-a --name train-b --json\n  tpu-runner submit --env LR=3e-4 --command 'python3 train.py --steps 10'\n\nExit codes: 0 submitted; 1 the manifest (or an --env) is invalid; 2 a manifest id is\ntaken (nothing was submitted), or the runs are queued but the Cloud Run controller could\nnot be started (the message says which); 3 the manifest cannot be read, or a bucket, bundle or\nupload failed; 5 the store failed."
    )]
    Submit {
        /// The job manifest, or a folder holding `job.yaml`.
        #[arg(default_value = "job.yaml")]
        manifest: PathBuf,
        /// Submit only the jobs with these names (in manifest order).
        #[arg(long = "name", value_name = "NAME")]
        names: Vec<String>,
        /// Set a variable in every submitted job (NAME=VALUE; repeatable; after --env-file).
        #[arg(long = "env", value_name = "NAME=VALUE")]
        env: Vec<String>,
        /// Set the variables of a file (NAME=VALUE per line, `#` comments) in every job.
        #[arg(long = "env-file", value_name = "PATH")]
        env_files: Vec<PathBuf>,
        /// Run this shell command instead of the manifest's (a quick try).
        #[arg(long, value_name = "CMD")]
        command: Option<String>,
        /// One JSON line per job instead of text.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        stack: stack::StackOpts,
    },
    /// The queue: every active run in the order the controller serves it, each waiting one
    /// with why; with --all or --since, the runs that ended too. Then the TPUs.
    #[command(
        after_help = "Examples:\n  tpu-runner status\n  tpu-runner status --all --name train\n  tpu-runner status --since 24h --state failed\n  tpu-runner status --json | jq '.queue.items[] | {job_id, status, waiting}'\n\nExit codes: 0; 2 a bad filter; 5 the store failed."
    )]
    Status {
        /// Also the runs that ended in the last 7 days (latest first).
        #[arg(long)]
        all: bool,
        /// The runs that ended since this time (RFC 3339) or this long ago (`24h`, `7d`).
        #[arg(long, value_name = "TIME")]
        since: Option<String>,
        /// Only runs in this state (pending, running, cancelling, succeeded, failed,
        /// cancelled; repeatable).
        #[arg(long = "state", value_name = "STATE")]
        states: Vec<String>,
        /// Only the runs of this job name (or this run id).
        #[arg(long, value_name = "NAME")]
        name: Option<String>,
        /// Only runs of this priority.
        #[arg(long, value_parser = ["low", "normal", "high"])]
        priority: Option<String>,
        /// At most this many rows per table (0: all).
        #[arg(long, default_value_t = 50)]
        limit: usize,
        /// The state as one JSON document (the queue with reasons, the records, the
        /// history with --all) instead of tables.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        stack: stack::StackOpts,
    },
    /// Cancel jobs: a pending job is deactivated at once, a running one once its workers
    /// stopped.
    #[command(
        after_help = "Examples:\n  tpu-runner cancel hello\n  tpu-runner cancel a b --if-pending --json\n\nExit codes: 0 cancelled (or already ended); 1 a job is unknown; 2 --if-pending and a\njob is not provably idle; 5 the store failed."
    )]
    Cancel {
        /// Job ids.
        #[arg(required = true, value_name = "JOB")]
        jobs: Vec<String>,
        /// Only cancel jobs that are pending and provably not running anywhere.
        #[arg(long)]
        if_pending: bool,
        /// One JSON line per job.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        stack: stack::StackOpts,
    },
    /// Change a pending job's priority.
    #[command(
        after_help = "Example:\n  tpu-runner set-priority train-a high\n\nExit codes: 0 changed or unchanged; 1 unknown job; 2 the job is no longer pending."
    )]
    SetPriority {
        /// Job id.
        job: String,
        /// low, normal or high.
        #[arg(value_parser = ["low", "normal", "high"])]
        priority: String,
        /// A JSON line.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        stack: stack::StackOpts,
    },
    /// Ask the controller to interrupt the managed Spot TPU a job runs on, as a Spot
    /// preemption would (its command gets the notice first): to see a job checkpoint and
    /// resume.
    #[command(
        after_help = "Examples:\n  tpu-runner interrupt-spot resume\n  tpu-runner interrupt-spot resume-k3x9q2 --tpu local-stack-east-1-0a1b2c3d --attempt-id attempt-1234abcd\n\nExit codes: 0 filed; 1 refused (the message says why); 5 the store failed."
    )]
    InterruptSpot {
        /// The job (a name: its latest run; or a run's id).
        job: String,
        /// Only if it runs on this TPU record (default: the one its attempt runs on).
        #[arg(long, value_name = "TPU")]
        tpu: Option<String>,
        /// Only if this attempt runs (default: its current one).
        #[arg(long)]
        attempt_id: Option<String>,
        /// A JSON line.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        stack: stack::StackOpts,
    },
    /// Ask an adopted TPU's workers which processes hold their accelerator devices (as root,
    /// through `sudo -n`, which the TPU's owner grants the runner user). The TPU must be
    /// idle: no job of ours runs there.
    #[command(
        after_help = "Example:\n  tpu-runner probe-adopted-device-owners adopted-my-v4\n\nExit codes: 0 every device is free; 75 a process holds one; 1 not an idle adopted TPU;\n2 a worker could not answer; 5 the store failed."
    )]
    ProbeAdoptedDeviceOwners {
        /// The TPU record (`tpu-runner status` lists them).
        resource: String,
        #[command(flatten)]
        stack: stack::StackOpts,
        #[command(flatten)]
        ssh: SshOpts,
    },
    /// Follow a run: every event recorded for it with its time (submitted, assigned,
    /// started, interrupted and requeued, ended), why it waits while it waits, and its
    /// workers' new output lines, until it ends.
    #[command(
        after_help = "Examples:\n  tpu-runner watch hello\n  tpu-runner watch hello-k3x9q2 --json\n\nExit codes: 0 the run succeeded; 1 it failed, was cancelled, or is unknown; 130 Ctrl-C."
    )]
    Watch {
        /// The job (a name: its latest run; or a run's id).
        job: String,
        /// Seconds between looks.
        #[arg(long, default_value_t = 2.0, value_name = "SECS")]
        interval: f64,
        /// JSON lines (`state`, `waiting`, `log`, `artifacts` events).
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        stack: stack::StackOpts,
    },
    /// Serve a read-only web page of the queue (why each run waits), the latest runs, the
    /// TPUs by zone, the latest events and the last day's goodput ledger, refreshing on its
    /// own.
    #[command(
        after_help = "Examples:\n  tpu-runner dashboard                  then open http://127.0.0.1:8471/\n  tpu-runner dashboard --listen 127.0.0.1:0 --refresh 2\n\nExit codes: 0 stopped with Ctrl-C; 2 bad flags; 3 cannot listen; 5 the store failed."
    )]
    Dashboard {
        /// Where to listen (loopback by default: the page shows job names and commands'
        /// output locations; put it behind your own authentication to share it).
        #[arg(long, default_value = "127.0.0.1:8471", value_name = "ADDR")]
        listen: String,
        /// Seconds between reads of the store (and the page's refreshes).
        #[arg(long, default_value_t = 5.0, value_name = "SECS")]
        refresh: f64,
        #[command(flatten)]
        stack: stack::StackOpts,
    },
    /// Write what production lived through in a time window as a scenario folder
    /// (`scenario.yaml`, `jobs.jsonl`, `fleet.yaml`) that `simulate` replays: the jobs as
    /// submitted with their run times and outcomes, and the capacity the controller saw.
    #[command(
        after_help = "Examples:\n  tpu-runner capture --output last-week --since 7d\n  tpu-runner simulate last-week/scenario.yaml\n  tpu-runner simulate last-week/scenario.yaml --policy frugal\n\nExit codes: 0; 1 nothing to capture; 2 bad flags; 3 the folder cannot be written; 5 the\nstore failed."
    )]
    Capture {
        /// The folder to write (made if missing).
        #[arg(long, value_name = "DIR")]
        output: PathBuf,
        #[command(flatten)]
        window: events::WindowArgs,
        /// Replace a scenario already in the folder.
        #[arg(long)]
        force: bool,
        #[command(flatten)]
        stack: stack::StackOpts,
    },
    /// The metrics `simulate` prints, for what production recorded in a window: utilisation,
    /// goodput, waits, completion times, preemptions, chip-hours lost, cost; per job with
    /// --json.
    #[command(
        after_help = "Examples:\n  tpu-runner report --since 24h\n  tpu-runner report --json | jq .metrics.goodput_ratio\n\nExit codes: 0; 1 nothing recorded; 2 bad flags; 5 the store failed."
    )]
    Report {
        #[command(flatten)]
        window: events::WindowArgs,
        /// One JSON document: the window, the metrics and each job's ledger.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        stack: stack::StackOpts,
    },
    /// Print a run's attempts and their workers' output; --follow until it ends.
    #[command(
        after_help = "Examples:\n  tpu-runner logs hello\n  tpu-runner logs hello --follow --tail 20\n  tpu-runner logs hello --attempt 2\n  tpu-runner logs hello --json | jq -r 'select(.event == \"log\") | .line'\n\nExit codes: 0; 1 unknown job or attempt, or a log that could not be read; 5 the store\nfailed; 130 Ctrl-C while following."
    )]
    Logs {
        /// The job (a name: its latest run; or a run's id).
        job: String,
        /// Only this attempt (its number from 1, or its id).
        #[arg(long, value_name = "ATTEMPT")]
        attempt: Option<String>,
        /// Only the last N lines of each worker's log (then what follows, with --follow).
        #[arg(long, value_name = "N")]
        tail: Option<usize>,
        /// Keep printing new lines until the run ends.
        #[arg(long, short = 'f')]
        follow: bool,
        /// One JSON line per attempt and per output line.
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        stack: stack::StackOpts,
    },
    /// Run the controller: hold the lease, and every interval observe the cloud, decide,
    /// commit, act. Events go to stdout as JSON lines.
    #[command(
        after_help = "Examples:\n  tpu-runner controller --exit-when-idle\n  tpu-runner emulator --workers /tmp/w &  tpu-runner controller --tpu-endpoint http://127.0.0.1:8470 --local-workers /tmp/w\n\nExit codes: 0 stopped, idle or another controller holds the lease; 2 bad flags or no\nworkers; 5 the store failed or the lease was lost."
    )]
    Controller {
        #[command(flatten)]
        stack: stack::StackOpts,
        /// Run jobs on local worker agents under DIR (an emulator started with --workers DIR).
        #[arg(long, value_name = "DIR")]
        local_workers: Option<PathBuf>,
        /// Seconds between passes (default: the fleet's `policy.engine.reconcile_interval`,
        /// 30 s unless it says otherwise).
        #[arg(long, value_name = "SECS")]
        interval: Option<f64>,
        /// Seconds the lease lasts unless renewed (every pass renews it).
        #[arg(long, default_value_t = 900, value_name = "SECS")]
        lease_ttl: i64,
        /// Stop when no job is active and nothing of ours is left in the cloud.
        #[arg(long)]
        exit_when_idle: bool,
        /// When another controller holds the lease, wait for it instead of exiting.
        #[arg(long)]
        wait_for_lease: bool,
        #[command(flatten)]
        ssh: SshOpts,
        /// Logs (stderr) as JSON lines, as Cloud Logging reads them (default when run as a
        /// Cloud Run job).
        #[arg(long, env = "CLOUD_RUN_JOB", value_parser = clap::builder::FalseyValueParser::new())]
        log_json: bool,
        /// Lease owner (default: CLOUD_RUN_EXECUTION, else a fresh local id).
        #[arg(long)]
        owner: Option<String>,
        /// This deployment's epoch (a newer one fences this controller).
        #[arg(long, env = "TPU_RUNNER_CONTROLLER_EPOCH", default_value = "local")]
        epoch: String,
    },
    /// Set up the fleet's project: services, runner bucket, Firestore, service accounts with
    /// least-privilege grants, the SSH key secret, artifacts, the controller image and its
    /// Cloud Run job, a new epoch. Idempotent; --dry-run prints every call in order.
    #[command(
        after_help = "Examples:\n  tpu-runner deploy deployment.yaml --dry-run --job-bucket gs://my-lab-us-east1\n  tpu-runner deploy deployment.yaml --job-bucket gs://my-lab-us-east1\n\nNot yet run against GCP by its authors: it is tested against recorded REST fixtures\n(tests/deploy.rs). Read --dry-run first.\n\nExit codes: 0 deployed (or planned); 1 the fleet is invalid; 2 bad flags; 3 a call\nwas refused (the step is named; run it again once fixed); 5 the store failed."
    )]
    Deploy {
        /// The fleet file.
        #[arg(default_value = "deployment.yaml")]
        fleet: PathBuf,
        /// Print every call in order, and change nothing.
        #[arg(long)]
        dry_run: bool,
        /// A bucket your jobs use (repeat): workers may write there, the controller read.
        #[arg(long = "job-bucket", value_name = "gs://BUCKET")]
        job_buckets: Vec<String>,
        /// With --dry-run: the plan as JSON.
        #[arg(long)]
        json: bool,
        /// The new deployment epoch (default: a fresh random one).
        #[arg(long)]
        epoch: Option<String>,
    },
    /// The whole stack on this machine: no cloud account, no bill.
    #[command(subcommand)]
    Local(LocalCommand),
    /// Move the controller's state in and out of a store (SQLite or Firestore).
    #[command(subcommand)]
    State(StateCommand),
    /// The agent on a TPU VM worker (run by the controller through SSH or a local
    /// transport; see docs/workers.md).
    #[command(subcommand, hide = true)]
    Worker(WorkerCommand),
    /// Print a shell completion script.
    #[command(
        after_help = "Example:\n  tpu-runner completions bash > ~/.local/share/bash-completion/completions/tpu-runner"
    )]
    Completions {
        /// The shell.
        shell: clap_complete::Shell,
    },
}

#[derive(Debug, Subcommand)]
enum LocalCommand {
    /// Start the local stack in the foreground: the TPU API emulator (its TPUs backed by
    /// worker agents on this machine), a local object store with a bucket per region, the
    /// SQLite store and the controller. While it runs, commands run from any folder without
    /// --fleet use it.
    #[command(
        after_help = "Example (two terminals):\n  tpu-runner local up\n  tpu-runner submit examples/hello && tpu-runner watch hello\n\nExit codes: 0 stopped with Ctrl-C; 2 a local stack runs already; 3 cannot write the\nstack's folder or listen."
    )]
    Up {
        /// The stack's folder (store, objects, worker roots; default: `local` in the state
        /// folder: TPU_RUNNER_HOME, else $XDG_STATE_HOME/tpu-runner, else
        /// ~/.local/state/tpu-runner, where the stack also registers itself).
        #[arg(long, value_name = "DIR")]
        dir: Option<PathBuf>,
        /// Virtual seconds per wall second for the emulated cloud (provisioning, deletes).
        #[arg(long, default_value_t = 20.0, value_name = "X")]
        speed: f64,
        /// Where the emulator listens (port 0: any free port).
        #[arg(long, default_value = "127.0.0.1:0", value_name = "ADDR")]
        listen: String,
        /// Seconds between controller passes (default: the fleet's
        /// `policy.engine.reconcile_interval`, 2 s in the local stack's fleet).
        #[arg(long, value_name = "SECS")]
        interval: Option<f64>,
    },
}

/// How TPU VMs are reached over SSH.
#[derive(Debug, clap::Args)]
struct SshOpts {
    /// The SSH private key for TPU VMs (default: TPU_RUNNER_SSH_PRIVATE_KEY's content).
    #[arg(long, value_name = "FILE")]
    ssh_key: Option<PathBuf>,
    /// The user on TPU VMs.
    #[arg(long, env = "TPU_RUNNER_SSH_USER", default_value = "tpurunner")]
    ssh_user: String,
    /// Where the startup script installs the agent on TPU VMs.
    #[arg(long, default_value = "/usr/local/bin/tpu-runner", value_name = "PATH")]
    remote_agent: String,
    /// The `gcloud` that opens IAP tunnels to TPU VMs (`ssh_transport: iap`).
    #[arg(
        long,
        env = "TPU_RUNNER_GCLOUD",
        default_value = "gcloud",
        value_name = "PATH"
    )]
    gcloud: String,
}

impl SshOpts {
    fn args(&self) -> controller::SshArgs<'_> {
        controller::SshArgs {
            key_file: self.ssh_key.as_deref(),
            user: &self.ssh_user,
            remote_agent: &self.remote_agent,
            gcloud: &self.gcloud,
        }
    }
}

/// Where a worker command works.
#[derive(Debug, clap::Args)]
struct WorkerOpts {
    /// The worker's root folder (workspace, caches, the agent's records).
    #[arg(
        long,
        env = "TPU_RUNNER_WORKER_ROOT",
        default_value = "/tmp/tpu-runner"
    )]
    root: PathBuf,
    /// Shared-memory folder (default: ROOT/shm; on a TPU VM /dev/shm/tpu-runner).
    #[arg(long)]
    shm: Option<PathBuf>,
    /// This worker's host name.
    #[arg(long)]
    host: String,
    /// Keep objects in this local folder (one folder per bucket) instead of Cloud Storage.
    #[arg(long, env = "TPU_RUNNER_OBJECTS")]
    objects: Option<PathBuf>,
    /// Launch only when `worker prepare` marked this boot ready in DIR (TPU VMs).
    #[arg(long, value_name = "DIR")]
    require_ready: Option<PathBuf>,
    /// The metadata server whose Spot preemption and maintenance notices reach the command
    /// (its `computeMetadata/v1/` root), or `off`.
    #[arg(
        long,
        env = "TPU_RUNNER_METADATA",
        value_name = "URL",
        default_value = crate::worker::notice::GOOGLE_METADATA
    )]
    metadata: String,
}

#[derive(Debug, Subcommand)]
enum WorkerCommand {
    /// Start an attempt on this worker (the launch spec as JSON on stdin).
    Launch {
        #[command(flatten)]
        at: WorkerOpts,
    },
    /// Supervise an attempt (started by `launch`).
    Supervise {
        #[command(flatten)]
        at: WorkerOpts,
        /// Job id.
        #[arg(long)]
        job: String,
        /// Attempt id.
        #[arg(long)]
        attempt: String,
    },
    /// Prepare this TPU VM worker at boot (root; run by the startup script): the runner
    /// user, its authorized key, lingering, the agent's folders, the readiness marker.
    Prepare {
        /// The runner user.
        #[arg(long, default_value = "tpurunner")]
        user: String,
        /// A file holding the controller's public key (`ssh-ed25519 …`).
        #[arg(long, value_name = "FILE")]
        authorized_key_file: PathBuf,
        /// The agent's root folder.
        #[arg(long, default_value = "/tmp/tpu-runner")]
        root: PathBuf,
        /// Shared-memory folder.
        #[arg(long, default_value = "/dev/shm/tpu-runner")]
        shm: PathBuf,
        /// Where the readiness marker goes.
        #[arg(long, default_value = "/var/lib/tpu-runner", value_name = "DIR")]
        state_dir: PathBuf,
    },
    /// Free disk space the agent's folders hold on an adopted TPU (no attempt may run):
    /// the workspace and old attempts first, then caches, least recently used first.
    RecoverDisk {
        #[command(flatten)]
        at: WorkerOpts,
        /// Free bytes to reach.
        #[arg(long, default_value_t = 10 << 30, value_name = "BYTES")]
        floor: u64,
    },
    /// Say which processes hold this worker's accelerator devices (as root, to see every
    /// process: the controller runs it with `sudo -n`).
    Devices {
        #[command(flatten)]
        at: WorkerOpts,
        /// A glob of device files (default: a TPU VM's /dev/accel* and /dev/vfio/<n>);
        /// several in TPU_RUNNER_DEVICES separated by `:`.
        #[arg(
            long = "device",
            value_name = "GLOB",
            env = "TPU_RUNNER_DEVICES",
            value_delimiter = ':'
        )]
        devices: Vec<String>,
    },
    /// Stop an attempt on this worker.
    Cancel {
        #[command(flatten)]
        at: WorkerOpts,
        /// Attempt id.
        #[arg(long)]
        attempt: String,
        /// Seconds between TERM and KILL.
        #[arg(long, default_value_t = 10)]
        grace: u64,
        /// Tell the command why first (its TPU_RUNNER_PREEMPTION_FILE) and give it at least
        /// 30 s: `interrupt-spot` or `priority-preemption`.
        #[arg(long, value_name = "REASON", value_parser = parse_notice)]
        notice: Option<crate::worker::notice::Notice>,
    },
}

fn parse_notice(word: &str) -> Result<crate::worker::notice::Notice, String> {
    crate::worker::notice::Notice::of_word(word).ok_or_else(|| {
        let words: Vec<&str> = crate::worker::notice::Notice::ALL
            .iter()
            .map(|n| n.word())
            .collect();
        format!("expected one of {}", words.join(", "))
    })
}

impl WorkerOpts {
    fn args(&self) -> worker::WorkerArgs<'_> {
        worker::WorkerArgs {
            root: &self.root,
            shm: self.shm.as_deref(),
            host: &self.host,
            objects: self.objects.as_deref(),
            require_ready: self.require_ready.as_deref(),
            metadata: Some(self.metadata.as_str())
                .filter(|m| *m != crate::worker::agent::METADATA_OFF),
        }
    }
}

/// Where a command finds its state store.
#[derive(Debug, clap::Args)]
struct StoreOpts {
    /// The state store: `sqlite:PATH` or `firestore` (project and runner from the fleet) or
    /// `firestore:PROJECT/DATABASE`. Default: the running local stack's, else
    /// `.tpu-runner/state.db` beside the fleet file.
    #[arg(long, env = "TPU_RUNNER_STORE", value_name = "URL")]
    store: Option<String>,
    /// The fleet file (names a Firestore store's project and collections; default: the
    /// running local stack's, else `deployment.yaml`).
    #[arg(long, env = "TPU_RUNNER_DEPLOYMENT", value_name = "PATH")]
    fleet: Option<PathBuf>,
}

impl StoreOpts {
    /// The store and fleet these name; with neither, the running local stack's (as the job
    /// commands find it), else `deployment.yaml`'s.
    fn resolve(&self) -> Result<state::OwnedStoreArgs, Failure> {
        let (store, fleet) = match (&self.store, &self.fleet) {
            (store, Some(fleet)) => (store.clone(), fleet.clone()),
            (Some(store), None) => (Some(store.clone()), PathBuf::from("deployment.yaml")),
            (None, None) => {
                let (fleet, local) = stack::default_fleet()?;
                (local.map(|l| l.store), fleet)
            }
        };
        Ok(state::OwnedStoreArgs { store, fleet })
    }
}

#[derive(Debug, Subcommand)]
enum StateCommand {
    /// Print everything in the store (finished jobs included) as state JSON
    /// (docs/state-schema.md).
    #[command(
        after_help = "Examples:\n  tpu-runner state export > state.json\n  tpu-runner state export --store firestore --fleet deployment.yaml --output backup.json\n  tpu-runner plan --fleet deployment.yaml --state state.json"
    )]
    Export {
        #[command(flatten)]
        store: StoreOpts,
        /// Write to this file instead of stdout (never over an existing file without --force).
        #[arg(long, value_name = "PATH")]
        output: Option<PathBuf>,
        /// Replace an existing --output file.
        #[arg(long)]
        force: bool,
    },
    /// Print the store's event log (what the controller saw and did, what was submitted) as
    /// JSON lines, oldest first.
    #[command(
        after_help = "Examples:\n  tpu-runner state events --since 24h\n  tpu-runner state events --kind job_created --kind controller_policy\n  tpu-runner state events --since 2026-12-01T00:00:00Z --until 2026-12-02T00:00:00Z"
    )]
    Events {
        #[command(flatten)]
        store: StoreOpts,
        #[command(flatten)]
        window: events::WindowArgs,
        /// Only events of this kind (repeatable).
        #[arg(long, value_name = "KIND")]
        kind: Vec<String>,
    },
    /// Write a state JSON document into an empty store.
    #[command(
        after_help = "Examples:\n  tpu-runner state import backup.json --store sqlite:.tpu-runner/state.db\n  FIRESTORE_EMULATOR_HOST=127.0.0.1:8086 tpu-runner state import state.json --store firestore"
    )]
    Import {
        /// The state JSON file.
        file: PathBuf,
        #[command(flatten)]
        store: StoreOpts,
    },
}

/// Runs the CLI with the process arguments and returns the exit code.
pub fn main() -> ExitCode {
    let parsed = with_negative_numbers(Cli::command())
        .try_get_matches()
        .and_then(|m| <Cli as clap::FromArgMatches>::from_arg_matches(&m));
    let cli = match parsed {
        Ok(cli) => cli,
        Err(e) => {
            let _ = e.print();
            return ExitCode::from(if e.use_stderr() {
                ExitStatus::Usage as u8
            } else {
                0
            });
        }
    };
    match run(cli) {
        Ok(status) => ExitCode::from(status as u8),
        Err(failure) => {
            eprint!("{}", failure.message);
            ExitCode::from(failure.status as u8)
        }
    }
}

/// `cmd` and every subcommand read `-1` as a value (which its parser then refuses with a
/// real message: "invalid value '-1' for '--seed <N>'"), never as an unknown flag with the
/// hint `-- -1`, which would turn the value into a file argument.
fn with_negative_numbers(cmd: clap::Command) -> clap::Command {
    cmd.allow_negative_numbers(true)
        .mut_subcommands(with_negative_numbers)
}

/// An expected failure: a message for stderr and the exit status.
#[derive(Debug)]
pub struct Failure {
    /// Full text for stderr (ends with a newline).
    pub message: String,
    /// Exit status.
    pub status: ExitStatus,
}

impl Failure {
    fn io(what: &str, path: &Path, err: &std::io::Error, hint: Option<&str>) -> Failure {
        let mut message = format!("error: cannot {what} `{}`: {err}\n", path.display());
        if let Some(hint) = hint {
            message.push_str(&format!("  = hint: {hint}\n"));
        }
        Failure {
            message,
            status: ExitStatus::Io,
        }
    }
}

fn run(cli: Cli) -> Result<ExitStatus, Failure> {
    match cli.command {
        Command::Init { path } => init(&path),
        Command::ValidateFleet { path, json } => validate::fleet(&path, json),
        Command::ValidateJobs {
            path,
            fleet,
            buckets,
            objects,
            json,
        } => validate::jobs(&path, fleet.as_deref(), buckets, objects.as_deref(), json),
        Command::Plan {
            fleet,
            state,
            store,
            observation,
            now,
            policy,
            json,
            write_state,
        } => plan::run(plan::PlanArgs {
            fleet: fleet.as_deref(),
            state: state.as_deref(),
            store: store.as_deref(),
            observation: observation.as_deref(),
            now: now.as_deref(),
            policy: policy.as_deref(),
            json,
            write_state: write_state.as_deref(),
        }),
        Command::Simulate {
            files,
            fleet,
            save_scenario,
            seed,
            seeds,
            policy,
            variants,
            compare,
            json,
            output,
            report,
            force,
            threads,
            chaos,
            horizon_hours,
            max_jobs,
            traces,
        } => simulate::run(simulate::SimulateArgs {
            files: &files,
            fleet: fleet.as_deref(),
            save_scenario: save_scenario.as_deref(),
            seed,
            seeds: seeds.as_deref(),
            policies: policy.as_deref(),
            variants: variants.as_deref(),
            compare,
            json,
            output: output.as_deref(),
            report: report.as_deref(),
            force,
            threads,
            chaos,
            horizon_hours,
            max_jobs,
            traces: traces.as_deref(),
        }),
        Command::State(StateCommand::Export {
            store,
            output,
            force,
        }) => state::export(&store.resolve()?.args(), output.as_deref(), force),
        Command::State(StateCommand::Events {
            store,
            window,
            kind,
        }) => events::print(&store.resolve()?.args(), window.window()?, &kind),
        Command::State(StateCommand::Import { file, store }) => {
            state::import(&store.resolve()?.args(), &file)
        }
        Command::Emulator {
            scenario,
            listen,
            seed,
            speed,
            virtual_time,
            workers,
            traces,
        } => emulator::run(emulator::EmulatorArgs {
            scenario: scenario.as_deref(),
            listen: &listen,
            seed,
            speed,
            virtual_time,
            workers: workers.as_deref(),
            traces: traces.as_deref(),
        }),
        Command::Submit {
            manifest,
            names,
            env,
            env_files,
            command,
            json,
            stack,
        } => jobs::submit(
            &stack,
            &jobs::SubmitArgs {
                manifest: &manifest,
                names: &names,
                env: &env,
                env_files: &env_files,
                command: command.as_deref(),
                json,
            },
        ),
        Command::Status {
            all,
            since,
            states,
            name,
            priority,
            limit,
            json,
            stack,
        } => {
            let since =
                events::Window::parse(since.as_deref(), None, crate::controller::wall_clock())?
                    .since;
            queue::status(
                &stack,
                &queue::StatusArgs {
                    all,
                    since,
                    states: &states,
                    name: name.as_deref(),
                    priority: priority.as_deref().and_then(crate::spec::Priority::parse),
                    limit,
                    json,
                },
            )
        }
        Command::Report {
            window,
            json,
            stack,
        } => report::run(&stack, window.window()?, json),
        Command::Capture {
            output,
            window,
            force,
            stack,
        } => capture::run(&stack, window.window()?, &output, force),
        Command::Cancel {
            jobs: ids,
            if_pending,
            json,
            stack,
        } => jobs::cancel(&stack, &ids, if_pending, json),
        Command::SetPriority {
            job,
            priority,
            json,
            stack,
        } => jobs::set_priority(
            &stack,
            &job,
            crate::spec::Priority::parse(&priority).expect("clap checked it"),
            json,
        ),
        Command::Watch {
            job,
            interval,
            json,
            stack,
        } => {
            if !(interval.is_finite() && interval > 0.0) {
                return Err(Failure {
                    message: "error: --interval must be a positive number of seconds\n".into(),
                    status: ExitStatus::Usage,
                });
            }
            follow::watch(
                &stack,
                &job,
                std::time::Duration::from_secs_f64(interval),
                json,
            )
        }
        Command::Dashboard {
            listen,
            refresh,
            stack,
        } => dashboard::run(
            &stack,
            &dashboard::DashboardArgs {
                listen: &listen,
                refresh,
            },
        ),
        Command::InterruptSpot {
            job,
            tpu,
            attempt_id,
            json,
            stack,
        } => jobs::interrupt_spot(&stack, &job, tpu.as_deref(), attempt_id.as_deref(), json),
        Command::Logs {
            job,
            attempt,
            tail,
            follow,
            json,
            stack,
        } => follow::logs(
            &stack,
            &follow::LogsArgs {
                job: &job,
                attempt: attempt.as_deref(),
                tail,
                follow,
                interval: std::time::Duration::from_secs(1),
                json,
            },
        ),
        Command::ProbeAdoptedDeviceOwners {
            resource,
            stack,
            ssh,
        } => controller::probe_adopted_device_owners(&stack, &resource, &ssh.args()),
        Command::Controller {
            stack,
            local_workers,
            interval,
            lease_ttl,
            exit_when_idle,
            wait_for_lease,
            ssh,
            log_json,
            owner,
            epoch,
        } => controller::controller(&controller::ControllerArgs {
            stack: &stack,
            local_workers: local_workers.as_deref(),
            interval,
            lease_ttl,
            exit_when_idle,
            wait_for_lease,
            log_json,
            ssh: ssh.args(),
            owner: owner.as_deref(),
            epoch: &epoch,
        }),
        Command::Deploy {
            fleet,
            dry_run,
            job_buckets,
            json,
            epoch,
        } => deploy::run(&deploy::DeployArgs {
            fleet: &fleet,
            dry_run,
            job_buckets: &job_buckets,
            json,
            epoch: epoch.as_deref(),
        }),
        Command::Local(LocalCommand::Up {
            dir,
            speed,
            listen,
            interval,
        }) => controller::local_up(&controller::LocalUpArgs {
            dir: dir.as_deref(),
            speed,
            listen: &listen,
            interval,
        }),
        Command::Worker(WorkerCommand::Launch { at }) => worker::launch(&at.args()),
        Command::Worker(WorkerCommand::Prepare {
            user,
            authorized_key_file,
            root,
            shm,
            state_dir,
        }) => worker::prepare(&user, &authorized_key_file, &root, &shm, &state_dir),
        Command::Worker(WorkerCommand::Supervise { at, job, attempt }) => {
            worker::supervise(&at.args(), &job, &attempt)
        }
        Command::Worker(WorkerCommand::RecoverDisk { at, floor }) => {
            worker::recover_disk(&at.args(), floor)
        }
        Command::Worker(WorkerCommand::Devices { at, devices }) => {
            worker::devices(&at.args(), devices)
        }
        Command::Worker(WorkerCommand::Cancel {
            at,
            attempt,
            grace,
            notice,
        }) => worker::cancel(&at.args(), &attempt, grace, notice),
        Command::Completions { shell } => {
            let mut out = Vec::new();
            clap_complete::generate(shell, &mut Cli::command(), "tpu-runner", &mut out);
            print_stdout(&String::from_utf8_lossy(&out));
            Ok(ExitStatus::Ok)
        }
    }
}

fn init(path: &Path) -> Result<ExitStatus, Failure> {
    let file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(path);
    let mut file = match file {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
            return Err(Failure {
                message: format!(
                    "error: `{}` already exists; tpu-runner init never overwrites a file\n  = hint: pass another path, e.g. `tpu-runner init new-deployment.yaml`\n",
                    path.display()
                ),
                status: ExitStatus::Io,
            });
        }
        Err(e) => return Err(Failure::io("create", path, &e, None)),
    };
    file.write_all(INIT_TEMPLATE.as_bytes())
        .map_err(|e| Failure::io("write", path, &e, None))?;
    print_stdout(&format!("wrote {}\n", path.display()));
    Ok(ExitStatus::Ok)
}

/// Checks, before any work, that `path` can take an output: not a folder, its folder
/// exists, and no file is there unless `force` (no flag may destroy an input).
pub(crate) fn check_output(path: &Path, force: bool) -> Result<(), Failure> {
    let fail = |what: String| Failure {
        message: format!("error: `{}` {what}\n", path.display()),
        status: ExitStatus::Io,
    };
    if path.is_dir() {
        return Err(fail("is a folder: --output needs a file path".into()));
    }
    if path.exists() && !force {
        return Err(fail(
            "already exists\n  = hint: pass --force to replace it, or another path".into(),
        ));
    }
    let dir = path
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    if !dir.is_dir() {
        return Err(fail(format!(
            "cannot be written: the folder `{}` does not exist",
            dir.display()
        )));
    }
    Ok(())
}

/// Writes `text` to `path` whole or not at all: into a temporary file beside it, then
/// renamed over it (`force`) or linked to it (refused if a file appeared meanwhile), so a
/// failure never leaves a truncated file where a good one was.
pub(crate) fn write_output(path: &Path, text: &str, force: bool) -> Result<(), Failure> {
    let dir = path
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let temp = dir.join(format!(".{name}.tmp-{}", std::process::id()));
    let result = std::fs::write(&temp, text).and_then(|()| {
        if force {
            std::fs::rename(&temp, path)
        } else {
            std::fs::hard_link(&temp, path).and_then(|()| std::fs::remove_file(&temp))
        }
    });
    result.map_err(|e| {
        let _ = std::fs::remove_file(&temp);
        Failure::io("write", path, &e, None)
    })
}

/// Reads a user file as UTF-8 (a regular file of at most `limit` bytes), with an actionable
/// error.
pub(crate) fn read_text(path: &Path, limit: u64, hint: Option<&str>) -> Result<String, Failure> {
    use crate::files::ReadError;
    crate::files::read_text(path, limit).map_err(|e| match e {
        ReadError::Io(e) => {
            let hint = (e.kind() == std::io::ErrorKind::NotFound)
                .then_some(hint)
                .flatten();
            Failure::io("read", path, &e, hint)
        }
        ReadError::NotUtf8(_) => Failure {
            message: format!("error: `{}` is {e}\n", path.display()),
            status: ExitStatus::Invalid,
        },
        other => Failure {
            message: format!("error: cannot read `{}`: {other}\n", path.display()),
            status: ExitStatus::Io,
        },
    })
}

/// A flag set by SIGINT or SIGTERM (Ctrl-C, a stop request), for commands that run until
/// asked to stop.
pub(crate) fn interrupt_flag() -> std::sync::Arc<std::sync::atomic::AtomicBool> {
    let flag = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    for signal in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        let _ = signal_hook::flag::register(signal, std::sync::Arc::clone(&flag));
    }
    flag
}

/// Writes to stdout, treating a closed pipe as success.
pub(crate) fn print_stdout(text: &str) {
    let mut out = std::io::stdout().lock();
    let _ = out.write_all(text.as_bytes()).and_then(|()| out.flush());
}

/// The example fleet that `init` writes.
pub fn init_template() -> &'static str {
    INIT_TEMPLATE
}
