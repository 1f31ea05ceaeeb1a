//! The workers as the GCP backend sees them: start an attempt on every worker of a TPU, stop
//! it, and read what the workers of each attempt in flight report. `Workers` is the boundary
//! (each call a future, so a pass's launches and cancels run at once with the backend's
//! bound); `EmulatedWorkers` speaks to the TPU API emulator's simulated workers over HTTP;
//! `AgentWorkers` runs the worker agent on every worker through a transport and reads the
//! status and heartbeat objects the agents write.
//! Judging reports is the engine's (`aggregate`); nothing here decides.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{Value, json};

use super::sim::{cancel_unreachable, launch_error};
use super::{BackendError, InFlight, Outcome};
use crate::engine::Timestamp;
use crate::engine::observe::{
    AttemptReport, CancelOutcome, LaunchRequest, Notice, RemoteError, RemoteErrorKind, WorkerState,
    WorkerStatus,
};
use crate::gcp::http::{Endpoint, api_error, error_chain};
use crate::objects::ObjectStore;
use crate::spec::{Name, NameMap};
use crate::worker::transport::{Target, Transport, TransportError};
use crate::worker::{CancelAck, LaunchAck, LaunchSpec, StatusObject, attempt_prefix, find_ack};

/// A call in flight.
pub type Call<T> = Pin<Box<dyn Future<Output = T> + Send + 'static>>;

/// What a report read found.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Reports {
    /// Each attempt's report (absent: nothing known of it).
    pub reports: NameMap<AttemptReport>,
    /// When they were read.
    pub read_at: Timestamp,
    /// Attempts whose workers wrote, stopped or started since the previous read, when the
    /// workers can tell (others are found by comparing reports).
    pub touched: Vec<Name>,
}

/// The worker side of a backend.
pub trait Workers: Send + Sync {
    /// Starts `launch` on every worker of its TPU (idempotent per attempt).
    fn launch(&self, launch: &LaunchRequest) -> Call<Outcome>;
    /// Stops `attempt` on every worker (`workers` of them) of `tpu` in `zone`.
    /// Stops `attempt` on every worker of `tpu`; with a notice, the command is told why and
    /// given a notice's time first.
    fn cancel(
        &self,
        attempt: Name,
        tpu: Name,
        zone: Name,
        workers: u32,
        notice: Option<Notice>,
    ) -> Call<Outcome>;
    /// Recovers the disk of every worker of an idle adopted TPU
    /// (`Outcome::DiskRecovery`).
    fn recover_disk(&self, tpu: Name, zone: Name, workers: u32) -> Call<Outcome>;
    /// The reports of the attempts `in_flight`; a default report for one nothing is known of.
    fn reports(&self, in_flight: &[InFlight]) -> Call<Result<Reports, BackendError>>;
}

/// The emulator's simulated workers, over its `/emulator/v1` routes.
#[derive(Clone, Debug)]
pub struct EmulatedWorkers {
    http: reqwest::Client,
    base: String,
    project: String,
}

impl EmulatedWorkers {
    /// The simulated workers of the emulator at `endpoint`, for `project`.
    pub fn new(endpoint: &Endpoint, project: &str) -> Result<EmulatedWorkers, BackendError> {
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(60))
            .build()
            .map_err(|e| BackendError {
                message: format!("cannot build the HTTP client: {}", error_chain(&e)),
            })?;
        Ok(EmulatedWorkers {
            http,
            base: endpoint.base.clone(),
            project: project.to_owned(),
        })
    }

    fn node_url(&self, zone: Name, tpu: Name, verb: &str) -> String {
        format!(
            "{}/emulator/v1/projects/{}/locations/{zone}/nodes/{tpu}/{verb}",
            self.base, self.project
        )
    }
}

/// Posts `body` to `url`: the reply's JSON, or (HTTP status, `google.rpc.Status` status)
/// of a refusal, or status 0 when nothing came back.
async fn post(http: &reqwest::Client, url: &str, body: Value) -> Result<Value, (u16, String)> {
    let reply = http
        .post(url)
        .json(&body)
        .send()
        .await
        .map_err(|e| (0, error_chain(&e)))?;
    let code = reply.status().as_u16();
    let text = reply.text().await.map_err(|e| (0, error_chain(&e)))?;
    if !(200..300).contains(&code) {
        return Err((code, api_error(code, &text).status));
    }
    serde_json::from_str(&text).map_err(|e| (0, format!("unreadable reply: {e}")))
}

impl Workers for EmulatedWorkers {
    fn launch(&self, launch: &LaunchRequest) -> Call<Outcome> {
        let http = self.http.clone();
        let url = self.node_url(launch.zone, launch.tpu_name, "launch");
        let (zone, tpu) = (launch.zone, launch.tpu_name);
        let body = json!({"attemptId": launch.attempt_id, "jobId": launch.job_id});
        Box::pin(async move {
            match post(&http, &url, body).await {
                Ok(_) => Outcome::Done,
                Err((404, _)) => Outcome::LaunchFailed(launch_error(
                    &tpu_runner_sim::cloud::RemoteError::NotFound,
                    &zone,
                    &tpu,
                )),
                Err(_) => Outcome::LaunchFailed(launch_error(
                    &tpu_runner_sim::cloud::RemoteError::Temporary,
                    &zone,
                    &tpu,
                )),
            }
        })
    }

    fn cancel(
        &self,
        attempt: Name,
        tpu: Name,
        zone: Name,
        _workers: u32,
        notice: Option<Notice>,
    ) -> Call<Outcome> {
        let http = self.http.clone();
        let url = self.node_url(zone, tpu, "cancel");
        let body = match notice {
            Some(notice) => json!({"attemptId": attempt, "notice": notice.word()}),
            None => json!({"attemptId": attempt}),
        };
        Box::pin(async move {
            let outcome = match post(&http, &url, body).await {
                Ok(v) => match v["result"].as_str() {
                    Some("sent") => CancelOutcome::Sent,
                    Some("mismatch") => CancelOutcome::AttemptMismatch,
                    _ => CancelOutcome::NotRunning,
                },
                Err((404, _)) => CancelOutcome::NotRunning,
                Err(_) => cancel_unreachable(),
            };
            Outcome::Cancelled(outcome)
        })
    }

    fn recover_disk(&self, tpu: Name, _zone: Name, workers: u32) -> Call<Outcome> {
        // The emulator's simulated workers have no disks to fill.
        Box::pin(async move {
            Outcome::DiskRecovery(Ok(crate::backend::sim::sufficient(&tpu, workers)))
        })
    }

    fn reports(&self, in_flight: &[InFlight]) -> Call<Result<Reports, BackendError>> {
        let http = self.http.clone();
        let url = format!("{}/emulator/v1/reports", self.base);
        let attempts: Vec<Name> = in_flight.iter().map(|f| f.attempt).collect();
        Box::pin(async move {
            let fail = |message: String| BackendError {
                message: format!("reading the simulated workers' reports: {message}"),
            };
            let v = post(&http, &url, json!({ "attempts": attempts }))
                .await
                .map_err(|(code, status)| fail(format!("{code} {status}")))?;
            let read_at = v["readAt"]
                .as_str()
                .and_then(|t| Timestamp::parse(t).ok())
                .ok_or_else(|| fail("no readAt".into()))?;
            let reports: NameMap<AttemptReport> =
                serde_json::from_value(v["reports"].clone()).map_err(|e| fail(e.to_string()))?;
            let touched: Vec<String> =
                serde_json::from_value(v["touched"].clone()).map_err(|e| fail(e.to_string()))?;
            Ok(Reports {
                reports,
                read_at,
                touched: touched.iter().map(|a| Name::new(a)).collect(),
            })
        })
    }
}

/// The worker agent on every worker of a TPU, reached through `transport`; reports from
/// the status and heartbeat objects the agents write to each job's bucket.
pub struct AgentWorkers {
    transport: Arc<dyn Transport>,
    objects: Arc<dyn ObjectStore>,
    project: String,
    /// How long one agent call may take.
    pub timeout: Duration,
    /// Reads of attempts' objects in flight at once at most.
    pub concurrency: usize,
    /// Free bytes each worker's disk must keep (caches are evicted to keep it; a launch
    /// that cannot is a set-up failure). Default 10 GiB, as the original.
    pub min_free_bytes: u64,
    /// Seconds between the agents' heartbeats.
    pub heartbeat_secs: u64,
    /// The accelerator devices a command waits for (a TPU VM's by default), and how long.
    pub devices: crate::worker::devices::Devices,
    /// Seconds a command waits for them (60, as the original).
    pub device_wait_secs: u64,
    /// Status objects already read, by address: (generation, report), so a pass reads each
    /// once and otherwise only lists.
    seen: Arc<Mutex<HashMap<String, (String, WorkerStatus)>>>,
}

impl std::fmt::Debug for AgentWorkers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "AgentWorkers({})", self.project)
    }
}

impl AgentWorkers {
    /// Agents reached through `transport`, writing to `objects`, for `project`.
    pub fn new(
        transport: Arc<dyn Transport>,
        objects: Arc<dyn ObjectStore>,
        project: &str,
    ) -> AgentWorkers {
        AgentWorkers {
            transport,
            objects,
            project: project.to_owned(),
            timeout: Duration::from_secs(180),
            concurrency: 16,
            min_free_bytes: 10 << 30,
            heartbeat_secs: 30,
            devices: crate::worker::devices::Devices::default(),
            device_wait_secs: 60,
            seen: Arc::default(),
        }
    }
}

/// Runs `f` for every worker of `tpu` in `zone` at once and collects the results in worker order.
fn on_every_worker<T: Send>(
    zone: Name,
    tpu: Name,
    count: u32,
    f: impl Fn(&Target) -> T + Sync,
) -> Vec<T> {
    std::thread::scope(|scope| {
        let handles: Vec<_> = (0..count.max(1))
            .map(|i| {
                let f = &f;
                let target = Target {
                    zone: zone.to_string(),
                    tpu: tpu.to_string(),
                    worker: i,
                };
                scope.spawn(move || f(&target))
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("a worker call panicked"))
            .collect()
    })
}

fn worker_state(state: &str) -> WorkerState {
    match state {
        "succeeded" => WorkerState::Succeeded,
        "failed_setup" => WorkerState::FailedSetup,
        "failed_artifacts" => WorkerState::FailedArtifacts,
        _ => WorkerState::Failed,
    }
}

/// Reads the objects of one attempt: its report.
fn read_attempt(
    objects: &dyn ObjectStore,
    seen: &Mutex<HashMap<String, (String, WorkerStatus)>>,
    f: &InFlight,
) -> Result<AttemptReport, BackendError> {
    let prefix = attempt_prefix(&f.bucket, &f.job, &f.attempt);
    let listed = objects.list(&prefix).map_err(|e| BackendError {
        message: format!("reading the reports of {}: {e}", f.attempt),
    })?;
    let mut report = AttemptReport::default();
    let mut finished_hosts = Vec::new();
    let mut beats: Vec<(String, Timestamp)> = Vec::new();
    for object in &listed {
        let rest = &object.name[object.name.rfind("/attempts/").map_or(0, |i| i + 10)..];
        let rest = rest.split_once('/').map_or("", |(_, r)| r);
        if let Some(host) = rest
            .strip_prefix("heartbeat/")
            .and_then(|h| h.strip_suffix(".json"))
        {
            if let Ok(at) = Timestamp::parse(&object.updated) {
                beats.push((host.to_owned(), at));
            }
        } else if rest.starts_with("status/") && rest.ends_with(".json") {
            let uri = format!("{}{rest}", prefix);
            let cached = seen
                .lock()
                .expect("not poisoned")
                .get(&uri)
                .filter(|(generation, _)| *generation == object.generation)
                .map(|(_, s)| s.clone());
            let status = match cached {
                Some(s) => s,
                None => {
                    let Some(data) = objects.get(&uri, 1 << 20).map_err(|e| BackendError {
                        message: format!("reading {uri}: {e}"),
                    })?
                    else {
                        continue;
                    };
                    let Ok(s) = serde_json::from_slice::<StatusObject>(&data) else {
                        // Unreadable: a worker that wrote garbage has not reported.
                        continue;
                    };
                    if s.attempt_id != f.attempt.as_str() {
                        continue;
                    }
                    let status = WorkerStatus {
                        host: s.host,
                        state: worker_state(&s.state),
                        command_exit_code: s.command_exit_code,
                        finished_at: Timestamp::parse(&s.finished_at).ok(),
                        infrastructure_failure: s.infrastructure_failure,
                        artifact_upload_error: s.artifact_upload_error,
                        // The worker's words, bounded: they go into the job's record.
                        setup_error: s
                            .setup_error
                            .map(|e| crate::engine::state::last_chars(&e, 1000)),
                    };
                    seen.lock()
                        .expect("not poisoned")
                        .insert(uri, (object.generation.clone(), status.clone()));
                    status
                }
            };
            finished_hosts.push(status.host.clone());
            report.statuses.push(status);
        }
    }
    report.launched = !listed.is_empty();
    // The oldest heartbeat of the workers still running: one silent worker shows.
    report.heartbeat_at = beats
        .iter()
        .filter(|(host, _)| !finished_hosts.contains(host))
        .map(|(_, at)| *at)
        .min()
        .or_else(|| beats.iter().map(|(_, at)| *at).max());
    Ok(report)
}

impl Workers for AgentWorkers {
    fn launch(&self, launch: &LaunchRequest) -> Call<Outcome> {
        let transport = self.transport.clone();
        let mut spec = LaunchSpec::new(launch.clone(), &self.project);
        spec.min_free_bytes = self.min_free_bytes;
        spec.heartbeat_secs = self.heartbeat_secs;
        spec.devices = self.devices.clone();
        spec.device_wait_secs = self.device_wait_secs;
        let timeout = self.timeout;
        Box::pin(async move {
            tokio::task::spawn_blocking(move || {
                let r = &spec.request;
                let input = serde_json::to_vec(&spec).expect("serialisable");
                let words = [
                    (LaunchAck::Launched.word(), LaunchAck::Launched),
                    (LaunchAck::AlreadyRunning.word(), LaunchAck::AlreadyRunning),
                    (
                        LaunchAck::AlreadyComplete.word(),
                        LaunchAck::AlreadyComplete,
                    ),
                ];
                let results = on_every_worker(r.zone, r.tpu_name, r.worker_count, |target| {
                    transport
                        .run(target, &["launch"], &input, timeout)
                        .map(|out| find_ack(&out, &r.attempt_id, &words).is_some())
                });
                let failed: Vec<&TransportError> =
                    results.iter().filter_map(|r| r.as_ref().err()).collect();
                let unacked = results.iter().filter(|r| matches!(r, Ok(false))).count();
                if failed.is_empty() && unacked == 0 {
                    return Outcome::Done;
                }
                let temporary = failed.iter().all(|e| e.temporary);
                let mut message: Vec<String> = failed.iter().map(|e| e.message.clone()).collect();
                if unacked > 0 {
                    message.push(format!(
                        "{unacked} worker(s) did not acknowledge the launch"
                    ));
                }
                Outcome::LaunchFailed(RemoteError {
                    kind: if temporary {
                        RemoteErrorKind::Temporary
                    } else {
                        RemoteErrorKind::Hard
                    },
                    message: message.join("; "),
                })
            })
            .await
            .unwrap_or_else(|e| {
                Outcome::LaunchFailed(RemoteError {
                    kind: RemoteErrorKind::Temporary,
                    message: format!("the launch did not finish: {e}"),
                })
            })
        })
    }

    fn cancel(
        &self,
        attempt: Name,
        tpu: Name,
        zone: Name,
        workers: u32,
        notice: Option<Notice>,
    ) -> Call<Outcome> {
        let transport = self.transport.clone();
        let timeout = self.timeout;
        Box::pin(async move {
            tokio::task::spawn_blocking(move || {
                let words = [
                    (CancelAck::Sent.word(), CancelAck::Sent),
                    (CancelAck::NotRunning.word(), CancelAck::NotRunning),
                    (CancelAck::Mismatch.word(), CancelAck::Mismatch),
                ];
                let results = on_every_worker(zone, tpu, workers, |target| {
                    let mut args = vec!["cancel", "--attempt", &attempt];
                    if let Some(notice) = notice {
                        args.extend(["--notice", notice.word()]);
                    }
                    transport
                        .run(target, &args, b"", timeout)
                        .map(|out| find_ack(&out, &attempt, &words).map(|(ack, _)| ack))
                });
                // Only acknowledgements naming the attempt count.
                let acks: Vec<CancelAck> = results
                    .iter()
                    .filter_map(|r| r.as_ref().ok().copied().flatten())
                    .collect();
                let errors: Vec<&TransportError> =
                    results.iter().filter_map(|r| r.as_ref().err()).collect();
                let outcome = if acks.contains(&CancelAck::Mismatch) {
                    CancelOutcome::AttemptMismatch
                } else if acks.contains(&CancelAck::Sent) {
                    CancelOutcome::Sent
                } else if errors.is_empty() && acks.len() == results.len() {
                    CancelOutcome::NotRunning
                } else {
                    CancelOutcome::Error {
                        error: RemoteError {
                            kind: if errors.iter().all(|e| e.temporary) {
                                RemoteErrorKind::Temporary
                            } else {
                                RemoteErrorKind::Hard
                            },
                            message: if errors.is_empty() {
                                "a worker did not acknowledge the cancel".to_owned()
                            } else {
                                errors
                                    .iter()
                                    .map(|e| e.message.clone())
                                    .collect::<Vec<_>>()
                                    .join("; ")
                            },
                        },
                    }
                };
                Outcome::Cancelled(outcome)
            })
            .await
            .unwrap_or(Outcome::Cancelled(CancelOutcome::NotRunning))
        })
    }

    fn recover_disk(&self, tpu: Name, zone: Name, workers: u32) -> Call<Outcome> {
        let transport = self.transport.clone();
        let timeout = self.timeout;
        let floor = self.min_free_bytes.to_string();
        Box::pin(async move {
            tokio::task::spawn_blocking(move || {
                let results = on_every_worker(zone, tpu, workers, |target| {
                    transport
                        .run(target, &["recover-disk", "--floor", &floor], b"", timeout)
                        .map_err(|e| e.message)
                        .and_then(|out| {
                            out.lines()
                                .find(|l| l.starts_with("TPU_RUNNER_DISK_RECOVERY "))
                                .map(str::to_owned)
                                .ok_or_else(|| format!("{}: no recovery answer", target.host()))
                        })
                });
                let errors: Vec<String> = results
                    .iter()
                    .filter_map(|r| r.as_ref().err().cloned())
                    .collect();
                Outcome::DiskRecovery(if errors.is_empty() {
                    Ok(results.into_iter().flatten().collect())
                } else {
                    Err(errors.join("; "))
                })
            })
            .await
            .unwrap_or_else(|e| {
                Outcome::DiskRecovery(Err(format!("the recovery did not finish: {e}")))
            })
        })
    }

    fn reports(&self, in_flight: &[InFlight]) -> Call<Result<Reports, BackendError>> {
        let objects = self.objects.clone();
        let seen = self.seen.clone();
        let in_flight = in_flight.to_vec();
        let bound = self.concurrency.max(1);
        Box::pin(async move {
            tokio::task::spawn_blocking(move || {
                let read_at = Timestamp(jiff::Timestamp::now().as_millisecond());
                let mut reports = NameMap::default();
                for chunk in in_flight.chunks(bound) {
                    let read: Vec<Result<AttemptReport, BackendError>> =
                        std::thread::scope(|scope| {
                            let handles: Vec<_> = chunk
                                .iter()
                                .map(|f| {
                                    let (objects, seen) = (&objects, &seen);
                                    scope.spawn(move || read_attempt(objects.as_ref(), seen, f))
                                })
                                .collect();
                            handles
                                .into_iter()
                                .map(|h| h.join().expect("a report read panicked"))
                                .collect()
                        });
                    for (f, report) in chunk.iter().zip(read) {
                        reports.insert(f.attempt, report?);
                    }
                }
                // Forget status objects of attempts no longer in flight.
                let live: std::collections::HashSet<String> = in_flight
                    .iter()
                    .map(|f| attempt_prefix(&f.bucket, &f.job, &f.attempt))
                    .collect();
                seen.lock()
                    .expect("not poisoned")
                    .retain(|uri, _| live.iter().any(|p| uri.starts_with(p.as_str())));
                Ok(Reports {
                    reports,
                    read_at,
                    touched: Vec::new(),
                })
            })
            .await
            .map_err(|e| BackendError {
                message: format!("the report read did not finish: {e}"),
            })?
        })
    }
}
