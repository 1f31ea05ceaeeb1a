//! `plan`: one reconcile pass on a state snapshot, without touching any cloud. Prints the
//! decisions (actions, events) and why each pending job still waits.

use crate::engine::snapshot::{self, Problem};
use std::io::Write as _;
use std::path::Path;
use std::sync::Arc;

use serde::Serialize;

use super::exit_codes::ExitStatus;
use super::validate::load_fleet;
use super::{Failure, output, print_stdout, read_text};
use crate::engine::explain::{Explanation, explain};
use crate::engine::observe::{
    Health, LABEL_FLEET_ENTRY, LABEL_MANAGED_BY, NodeInfo, NodeState, QrState, QueuedResourceInfo,
};
use crate::engine::state::{ResourceStatus, SCHEMA_VERSION};
use crate::engine::{Action, Engine, Event, FleetIndex, Observation, State, Timestamp};
use crate::spec::names;
use crate::spec::{PolicyName, PolicySpec};

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

#[derive(Serialize)]
struct PlanReport<'a> {
    schema_version: u32,
    now: Timestamp,
    policy: &'a str,
    /// The digest of everything that decides (name, parameters, timings), as the
    /// controller's pass records give it.
    policy_digest: String,
    actions: &'a [Action],
    events: &'a [Event],
    waiting: &'a [Explanation],
    next_wake: Option<Timestamp>,
    violations: &'a [String],
}

fn json_error(path: &Path, what: &str, e: &serde_json::Error) -> Failure {
    Failure {
        message: format!(
            "error: {what}: {e}\n  --> {}:{}:{}\n  = hint: see docs/state-schema.md for the format\n",
            path.display(),
            e.line(),
            e.column()
        ),
        status: ExitStatus::Invalid,
    }
}

/// The last line of a refused snapshot's message.
const NOTHING_DONE: &str = "nothing was done: the state snapshot must be valid first\n";

/// Reads and checks a state snapshot.
pub(crate) fn load_state(path: &Path) -> Result<State, Failure> {
    let text = read_text(path, crate::files::DATA_LIMIT, None)?;
    // The version first, the rest skipped without building it (a 100k-job snapshot as a
    // `serde_json::Value` took half a gigabyte).
    #[derive(serde::Deserialize)]
    struct Head {
        schema_version: Option<serde_json::Value>,
    }
    let version = match serde_json::from_str::<Head>(&text) {
        Ok(head) => head
            .schema_version
            .as_ref()
            .and_then(serde_json::Value::as_u64),
        Err(e) if e.is_data() => None,
        Err(e) => return Err(json_error(path, "invalid JSON", &e)),
    };
    if version != Some(SCHEMA_VERSION as u64) {
        return Err(Failure {
            message: format!(
                "error: schema_version: expected {SCHEMA_VERSION}, found {}\n  --> {}\n",
                version.map_or("none".to_owned(), |v| v.to_string()),
                path.display()
            ),
            status: ExitStatus::Invalid,
        });
    }
    // Fields serde would skip are reported (a misspelled `priorty` must not vanish).
    let mut unknown = Vec::new();
    let state: State =
        serde_ignored::deserialize(&mut serde_json::Deserializer::from_str(&text), |p| {
            unknown.push(field_path(&p))
        })
        .map_err(|e| json_error(path, "invalid state", &e))?;
    let mut problems: Vec<Problem> = unknown
        .into_iter()
        .map(|p| Problem {
            message: format!(
                "unknown field `{}`",
                p.rsplit(['.', '[']).next().unwrap_or(&p)
            ),
            hint: Some("see docs/state-schema.md for the fields of each record".into()),
            path: p,
        })
        .collect();
    problems.extend(snapshot::problems(&state));
    if problems.is_empty() {
        return Ok(state);
    }
    // Positions come from the text read as YAML (JSON is YAML): only when there are
    // problems to show.
    let file = path.display().to_string();
    let Ok(tree) = crate::spec::yaml::parse(&file, &text) else {
        // Valid JSON the YAML reader refuses (a surrogate escape): the problems without
        // positions rather than none.
        let mut message = String::new();
        for p in &problems {
            message.push_str(&format!("error: {}: {}\n  --> {file}\n", p.path, p.message));
            if let Some(hint) = &p.hint {
                message.push_str(&format!("  = hint: {hint}\n"));
            }
        }
        message.push_str(NOTHING_DONE);
        return Err(Failure {
            message,
            status: ExitStatus::Invalid,
        });
    };
    let mut checker = crate::spec::yaml::Checker::new(&text);
    for p in &problems {
        let node = crate::spec::yaml::node_at(&tree, &p.path);
        match &p.hint {
            Some(hint) => checker.error_hint(node, &p.path, p.message.clone(), hint.clone()),
            None => checker.error(node, &p.path, p.message.clone()),
        }
    }
    let errors = checker
        .finish(&file, ())
        .expect_err("problems were recorded");
    Err(Failure {
        message: format!("{}{NOTHING_DONE}", errors.render()),
        status: ExitStatus::Invalid,
    })
}

/// A path serde_ignored reports, in the field-path syntax of every other message
/// (`jobs.J.attempts[0].status`).
fn field_path(path: &serde_ignored::Path<'_>) -> String {
    use serde_ignored::Path;
    match path {
        Path::Root => String::new(),
        Path::Seq { parent, index } => format!("{}[{index}]", field_path(parent)),
        Path::Map { parent, key } => crate::spec::yaml::join(&field_path(parent), key),
        Path::Some { parent }
        | Path::NewtypeStruct { parent }
        | Path::NewtypeVariant { parent } => field_path(parent),
    }
}

/// The cloud as the state believes it to be: ready TPUs for idle and busy records, waiting
/// requests for provisioning ones, healthy workers for running attempts.
fn assumed_observation(index: &FleetIndex, state: &State, now: Timestamp) -> Observation {
    let mut obs = Observation::default();
    for job in state.jobs.values() {
        if let Some(a) = job.attempt().filter(|a| !a.status.is_terminal()) {
            let report = crate::engine::observe::AttemptReport {
                launched: true,
                heartbeat_at: Some(now),
                ..Default::default()
            };
            obs.attempts.insert(a.id, report);
        }
    }
    for r in state.resources.values() {
        let labels = std::collections::BTreeMap::from([
            (LABEL_MANAGED_BY.to_owned(), index.runner().to_owned()),
            (LABEL_FLEET_ENTRY.to_owned(), r.entry_id.to_string()),
        ]);
        let up =
            matches!(r.status, ResourceStatus::Idle | ResourceStatus::Busy) || r.owner.is_some();
        let spot = index.entry_index(&r.entry_id).is_some_and(|e| {
            index.entry(e).provisioning_model == crate::spec::ProvisioningModel::Spot
        });
        if !r.adopted && (up || r.status == ResourceStatus::Provisioning) {
            obs.queued_resources.push(Arc::new(QueuedResourceInfo {
                name: names::queued_resource_name(&r.tpu_name),
                zone: r.zone,
                node_id: r.tpu_name,
                tpu_type: r.tpu_type.clone(),
                state: if up {
                    QrState::Active
                } else {
                    QrState::WaitingForResources
                },
                spot: true,
                labels: labels.clone().into(),
                failure: None,
            }));
        }
        if up {
            obs.nodes.push(Arc::new(NodeInfo {
                name: r.tpu_name,
                zone: r.zone,
                tpu_type: r.tpu_type.clone(),
                state: NodeState::Ready,
                health: Health::Healthy,
                spot,
                labels: if r.adopted {
                    Default::default()
                } else {
                    labels.into()
                },
                queued_resource: None,
                worker_count: r.worker_count,
                public_ip: true,
            }));
        }
    }
    obs
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
            Some(name) if name == fleet.policy.name => fleet.policy.clone(),
            Some(name) => PolicySpec {
                engine: fleet.policy.engine,
                ..PolicySpec::named(name)
            },
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
            serde_json::from_str(&text).map_err(|e| json_error(path, "invalid observation", &e))?
        }
        None => assumed_observation(engine.index(), &state, now),
    };
    let out = engine.reconcile(&mut state, &observation, now);
    let waiting = explain(engine.index(), &state, &observation, &out, now);
    if let Some(path) = args.write_state {
        let text = serde_json::to_string_pretty(&state).expect("state serialises") + "\n";
        super::write_output(path, &text, false)?;
    }
    if args.json {
        let report = PlanReport {
            schema_version: SCHEMA_VERSION,
            now,
            policy: engine.policy().name(),
            policy_digest: engine.index().fleet.policy.digest(),
            actions: &out.actions,
            events: &out.events,
            waiting: &waiting,
            next_wake: out.next_wake,
            violations: &out.violations,
        };
        // Streamed: at 100k waiting jobs the report is ~200 MB.
        let mut stdout = std::io::BufWriter::new(std::io::stdout().lock());
        let _ = serde_json::to_writer_pretty(&mut stdout, &report)
            .map_err(std::io::Error::from)
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
                ..
            } => vec![
                "cancel".into(),
                job_id.to_string(),
                format!("on {tpu_name}, attempt {attempt_id}"),
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
        s.push_str(&output::table(&["ACTION", "TARGET", "DETAIL"], &rows));
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
    for w in waiting {
        s.push_str(&format!("  {}\n", w.job_id));
        for r in &w.reasons {
            s.push_str(&format!("    - {r}\n"));
        }
    }
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
