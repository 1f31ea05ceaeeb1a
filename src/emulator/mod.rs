//! The TPU API emulator: the `sim` crate's cloud served over HTTP in the TPU API v2 shapes the
//! GCP backend uses (nodes and queued resources listed with pages, read, created with a
//! `requestId` that makes a retry idempotent, deleted; operations), with the scenario's
//! capacity, provisioning latency, Spot preemption with notice, multi-host slices, API faults
//! and quotas. Time is virtual (advanced by a control call, or by the simulator harness that
//! shares the world) or the wall clock scaled by a speed. Control endpoints inject faults
//! (preempt this node, stock out this zone); simulated-worker endpoints launch, cancel and
//! report attempts on the simulated workers. For tests and for trying the controller without
//! a cloud account: production code must never use it.

mod metadata;
pub mod routes;

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use tpu_runner_sim::{CallKind, JobBehaviour};

use crate::backend::sim::SimBackend;

/// How the emulated world's time moves.
#[derive(Clone, Copy, Debug)]
pub enum Clock {
    /// Only when told (`POST /emulator/v1/time`, or the harness sharing the world). Calls
    /// that take time in the model move it on as they are made, as in the simulator.
    Virtual,
    /// The wall clock since `started`, times `speed`, from virtual `from_ms`; replies are
    /// delayed by the modelled call latency (divided by `speed`).
    Wall {
        /// When the clock started.
        started: Instant,
        /// Virtual milliseconds at `started`.
        from_ms: u64,
        /// Virtual seconds per wall second.
        speed: f64,
    },
}

/// What a create asked for that the simulated cloud does not keep.
#[derive(Clone, Debug)]
pub(crate) struct Created {
    pub runtime_version: String,
    pub external_ips: bool,
    pub create_time: String,
}

/// The emulated world: the simulated cloud and what the API adds around it.
#[derive(Debug)]
pub struct World {
    /// The simulated cloud (behind the backend the simulator itself uses, so a harness
    /// sharing the world reads it exactly as an in-process run would).
    pub sim: SimBackend,
    /// The only project the emulator answers for.
    pub project: String,
    clock: Clock,
    /// When the pass whose calls are being made started (its first read).
    pass_at: u64,
    next_operation: u64,
    /// Operations by name (the most recent `KEPT` only).
    operations: HashMap<String, Operation>,
    operation_order: VecDeque<String>,
    /// `requestId` → the operation its first call produced.
    requests: HashMap<String, String>,
    /// Page tokens → the rest of a listing, as (zone, name) (the most recent `KEPT_PAGES`).
    pages: HashMap<String, Vec<(ustr::Ustr, ustr::Ustr)>>,
    page_order: VecDeque<String>,
    next_page: u64,
    /// Per node id: what its create asked for.
    pub(crate) created: HashMap<String, Created>,
    /// How a job the emulator was never told about behaves on the simulated workers.
    pub default_job: JobBehaviour,
    /// Where this machine's worker agents keep their roots (`BASE/ZONE/TPU/w-I`, as the
    /// local transport lays them out), when the emulator's TPUs are backed by real agents.
    pub workers: Option<PathBuf>,
    /// The TPUs alive at the last look (zone, name) → incarnation, to end their workers'
    /// processes when they go, and every TPU that existed then, to empty their disks.
    live: HashMap<(String, String), u64>,
    present: HashMap<(String, String), u64>,
    /// Workers reachable over SSH, registered through the control route: by (zone, node,
    /// worker), the address the node's `networkEndpoints` give and the host key its guest
    /// attributes publish.
    pub ssh_workers: HashMap<(String, String, u32), SshWorker>,
    /// Host maintenance announced on a node's metadata server: (zone, node) → the node's
    /// incarnation it was announced for and when (virtual milliseconds).
    pub(crate) maintenance: HashMap<(String, String), (u64, u64)>,
}

/// A worker reachable over SSH (a real sshd on this machine, registered by a test).
#[derive(Clone, Debug, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SshWorker {
    /// Its address.
    pub ip_address: String,
    /// Its SSH port (the emulator puts it in the endpoint's `port`).
    pub port: u16,
    /// `ssh-ed25519 AAAA…` as published in the `hostkeys` guest attributes.
    pub host_key: String,
}

/// Operations kept (older ones are forgotten: 404).
const KEPT: usize = 10_000;

/// Page tokens kept (older ones are forgotten: 400). Each keeps a name per listed object
/// (16 bytes): 1,000 unfinished listings of 10,000 objects hold 160 MB at most.
const KEPT_PAGES: usize = 1_000;

/// Virtual time a long-running operation takes to be done (its effect on the simulated
/// cloud is immediate: the inventory, not the operation, is what the controller reads).
const OPERATION_MS: u64 = 2_000;

/// A long-running operation of the TPU API.
#[derive(Debug)]
pub(crate) struct Operation {
    name: String,
    /// The resource it acts on (`metadata.target`), when known.
    target: String,
    verb: String,
    created_ms: u64,
    due_ms: u64,
    reads: u32,
    /// `response` once done (with its `@type`).
    response: serde_json::Value,
}

impl Operation {
    /// The operation in the API's shape (`google.longrunning.Operation` with the TPU API's
    /// `OperationMetadata`); proto-JSON omits `done` and `endTime` until it is done.
    fn json(&self, w: &World, done: bool) -> serde_json::Value {
        let mut metadata = serde_json::json!({
            "@type": "type.googleapis.com/google.cloud.tpu.v2.OperationMetadata",
            "createTime": w.timestamp(self.created_ms),
            "verb": self.verb,
            "apiVersion": "v2",
        });
        if !self.target.is_empty() {
            metadata["target"] = serde_json::json!(self.target);
        }
        let mut op = serde_json::json!({"name": self.name, "metadata": metadata});
        if done {
            op["metadata"]["endTime"] = serde_json::json!(w.timestamp(self.due_ms.min(w.now_ms())));
            op["done"] = serde_json::json!(true);
            op["response"] = self.response.clone();
        }
        op
    }
}

/// The world shared by the server and, in tests, the simulator harness.
pub type Shared = Arc<Mutex<World>>;

/// Locks the world (a handler that panicked leaves it usable: every handler's changes are
/// the simulated cloud's own, each complete).
pub fn lock(shared: &Shared) -> MutexGuard<'_, World> {
    shared
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl World {
    /// The world of `sim`, answering for `project`, on `clock`.
    pub fn new(sim: SimBackend, project: &str, clock: Clock) -> World {
        World {
            sim,
            project: project.to_owned(),
            clock,
            pass_at: 0,
            next_operation: 0,
            operations: HashMap::new(),
            operation_order: VecDeque::new(),
            requests: HashMap::new(),
            pages: HashMap::new(),
            page_order: VecDeque::new(),
            next_page: 0,
            created: HashMap::new(),
            workers: None,
            live: HashMap::new(),
            present: HashMap::new(),
            ssh_workers: HashMap::new(),
            maintenance: HashMap::new(),
            default_job: JobBehaviour::plain(600.0),
        }
    }

    /// Shares the world.
    pub fn shared(self) -> Shared {
        Arc::new(Mutex::new(self))
    }

    /// The clock.
    pub fn clock(&self) -> Clock {
        self.clock
    }

    /// Brings the simulated cloud to the wall clock (nothing on a virtual clock).
    pub fn tick(&mut self) {
        if let Clock::Wall {
            started,
            from_ms,
            speed,
        } = self.clock
        {
            let at = from_ms + (started.elapsed().as_secs_f64() * speed * 1000.0) as u64;
            self.sim.cloud.advance_to(at);
        }
    }

    /// Ends the worker processes of every TPU that stopped being alive since the last look
    /// (preempted, deleted, vanished), as on a real TPU, and empties the disks of those that
    /// are gone, so the next TPU of that name starts clean. Nothing without `workers`.
    pub fn reap_workers(&mut self) {
        let Some(base) = self.workers.clone() else {
            return;
        };
        let mut now_live = HashMap::new();
        let mut present = HashMap::new();
        for n in self.sim.cloud.all_nodes() {
            let key = (n.zone.to_string(), n.name.to_string());
            present.insert(key.clone(), n.serial);
            let up = matches!(
                n.state,
                tpu_runner_sim::cloud::NodeState::Creating
                    | tpu_runner_sim::cloud::NodeState::Ready
            );
            if up {
                now_live.insert(key, n.serial);
            }
        }
        let tpu_dir = |key: &(String, String)| base.join(&key.0).join(&key.1);
        for (key, serial) in &self.live {
            if now_live.get(key) != Some(serial) {
                for worker in std::fs::read_dir(tpu_dir(key))
                    .into_iter()
                    .flatten()
                    .flatten()
                {
                    crate::worker::agent::stop_all(&crate::worker::agent::Root::new(worker.path()));
                }
            }
        }
        for (key, serial) in &self.present {
            if present.get(key) != Some(serial) {
                let _ = std::fs::remove_dir_all(tpu_dir(key));
            }
        }
        self.live = now_live;
        self.present = present;
    }

    /// Virtual milliseconds now.
    pub fn now_ms(&self) -> u64 {
        self.sim.cloud.now()
    }

    /// A read call: it starts the pass whose later calls are numbered for their latencies,
    /// and on the wall clock its reply waits for the read latency.
    pub(crate) fn read_call(&mut self) -> Duration {
        self.pass_at = self.now_ms();
        match self.clock {
            Clock::Virtual => Duration::ZERO,
            Clock::Wall { speed, .. } => {
                let ms = self
                    .sim
                    .cloud
                    .call_latency_ms(CallKind::Read, self.pass_at, 0);
                scaled(ms, speed)
            }
        }
    }

    /// A mutation or a worker call: on a virtual clock the world moves on by its latency
    /// before it takes effect (as in the simulator); on the wall clock its reply waits.
    pub(crate) fn timed_call(&mut self, kind: CallKind) -> Duration {
        let ms = self.sim.cloud.take_call_latency_ms(kind, self.pass_at);
        match self.clock {
            Clock::Virtual => {
                let at = self.now_ms() + ms;
                self.sim.cloud.advance_to(at);
                Duration::ZERO
            }
            Clock::Wall { speed, .. } => scaled(ms, speed),
        }
    }

    /// Starts an operation and returns it as its call replies: not done yet (proto-JSON
    /// omits `done` while it is false). It is done once `OPERATION_MS` of virtual time have
    /// passed, or from its second read on (so a poll on a virtual clock ends).
    pub(crate) fn operation(
        &mut self,
        zone: &str,
        verb: &str,
        request_id: Option<&str>,
        response: serde_json::Value,
    ) -> serde_json::Value {
        self.next_operation += 1;
        let name = format!(
            "projects/{}/locations/{zone}/operations/operation-{}",
            self.project, self.next_operation
        );
        let now = self.now_ms();
        let op = Operation {
            name: name.clone(),
            target: match response["name"].as_str() {
                Some(target) => target.to_owned(),
                None => String::new(),
            },
            verb: verb.to_owned(),
            created_ms: now,
            due_ms: now + OPERATION_MS,
            reads: 0,
            response,
        };
        if let Some(id) = request_id.filter(|id| !id.is_empty()) {
            self.requests.insert(id.to_owned(), name.clone());
        }
        let reply = op.json(self, false);
        keep(
            &mut self.operations,
            &mut self.operation_order,
            name,
            op,
            KEPT,
        );
        reply
    }

    /// The operation a call with `request_id` already produced, as it is now.
    pub(crate) fn replayed(&mut self, request_id: Option<&str>) -> Option<serde_json::Value> {
        let name = self.requests.get(request_id?)?.clone();
        self.find_operation(&name)
    }

    /// An operation by name, as it is now (a read).
    pub(crate) fn find_operation(&mut self, name: &str) -> Option<serde_json::Value> {
        let now = self.now_ms();
        let mut op = self.operations.remove(name)?;
        let done = now >= op.due_ms || op.reads > 0;
        op.reads += 1;
        let reply = op.json(self, done);
        self.operations.insert(name.to_owned(), op);
        Some(reply)
    }

    /// One page of `items` (the rest kept under the returned token).
    pub(crate) fn page(
        &mut self,
        mut items: Vec<(ustr::Ustr, ustr::Ustr)>,
        size: usize,
    ) -> (Vec<(ustr::Ustr, ustr::Ustr)>, Option<String>) {
        if items.len() <= size {
            return (items, None);
        }
        let rest = items.split_off(size);
        self.next_page += 1;
        let token = format!("page-{}", self.next_page);
        keep(
            &mut self.pages,
            &mut self.page_order,
            token.clone(),
            rest,
            KEPT_PAGES,
        );
        (items, Some(token))
    }

    /// The rest of a listing a page token names (it can be used once).
    pub(crate) fn take_page(&mut self, token: &str) -> Option<Vec<(ustr::Ustr, ustr::Ustr)>> {
        self.pages.remove(token)
    }

    /// RFC 3339 of virtual `ms`.
    pub(crate) fn timestamp(&self, ms: u64) -> String {
        self.sim.epoch.plus_millis(ms as i64).to_string()
    }

    /// Every zone the scenario has capacity in.
    pub fn zones(&self) -> Vec<String> {
        let mut zones: Vec<String> = self
            .sim
            .cloud
            .config()
            .pools
            .iter()
            .map(|p| p.zone.clone())
            .collect();
        zones.sort();
        zones.dedup();
        zones
    }
}

fn scaled(ms: u64, speed: f64) -> Duration {
    Duration::from_secs_f64(ms as f64 / 1000.0 / speed.max(1e-9)).min(Duration::from_secs(60))
}

fn keep<V>(
    map: &mut HashMap<String, V>,
    order: &mut VecDeque<String>,
    key: String,
    value: V,
    most: usize,
) {
    order.push_back(key.clone());
    map.insert(key, value);
    while order.len() > most {
        if let Some(old) = order.pop_front() {
            map.remove(&old);
        }
    }
}

/// A running emulator: its address; stopped when dropped.
#[derive(Debug)]
pub struct Running {
    /// Where it listens.
    pub addr: SocketAddr,
    shutdown: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Running {
    /// `http://ADDR`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Serves until the process ends.
    pub fn wait(mut self) {
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// How long a client may take to send a request's headers (and, between requests, to start
/// the next) before its connection is closed: a client that opens connections and sends
/// nothing holds none for long. Longer than HTTP clients keep an idle connection (reqwest:
/// 90 s), so that they, not the emulator, close idle ones.
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(120);

/// Starts serving `shared` on `listen` (`127.0.0.1:0` picks a free port) in a thread of its
/// own; returns once it listens.
pub fn start(shared: Shared, listen: &str) -> std::io::Result<Running> {
    start_with(shared, listen, HEADER_READ_TIMEOUT)
}

/// `start`, closing a connection whose request headers take longer than
/// `header_read_timeout`.
pub fn start_with(
    shared: Shared,
    listen: &str,
    header_read_timeout: Duration,
) -> std::io::Result<Running> {
    let std_listener = std::net::TcpListener::bind(listen)?;
    std_listener.set_nonblocking(true)?;
    let addr = std_listener.local_addr()?;
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let thread = std::thread::Builder::new()
        .name("tpu-emulator".into())
        .spawn(move || {
            rt.block_on(async move {
                let listener = match tokio::net::TcpListener::from_std(std_listener) {
                    Ok(l) => l,
                    Err(_) => return,
                };
                // On a wall clock the world moves without requests: look every second.
                let ticker = shared.clone();
                tokio::spawn(async move {
                    loop {
                        tokio::time::sleep(Duration::from_secs(1)).await;
                        let mut w = lock(&ticker);
                        if matches!(w.clock(), Clock::Wall { .. }) {
                            w.tick();
                            w.reap_workers();
                        }
                    }
                });
                serve(listener, routes::router(shared), rx, header_read_timeout).await;
            });
        })?;
    Ok(Running {
        addr,
        shutdown: Some(tx),
        thread: Some(thread),
    })
}

/// Serves `app` on `listener` until `shutdown`, one task per connection, each closed when
/// a request's headers take longer than `header_read_timeout`.
async fn serve(
    listener: tokio::net::TcpListener,
    app: axum::Router,
    shutdown: tokio::sync::oneshot::Receiver<()>,
    header_read_timeout: Duration,
) {
    tokio::pin!(shutdown);
    loop {
        let stream = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                // Out of descriptors and the like: let connections end before accepting more.
                Err(_) => {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            _ = &mut shutdown => return,
        };
        let service = hyper_util::service::TowerToHyperService::new(app.clone());
        tokio::spawn(async move {
            let _ = hyper::server::conn::http1::Builder::new()
                .timer(hyper_util::rt::TokioTimer::new())
                .header_read_timeout(header_read_timeout)
                .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                .await;
        });
    }
}

/// The environment a shell needs to point tpu-runner (and `curl`) at the emulator.
pub fn environment(running: &Running) -> BTreeMap<&'static str, String> {
    BTreeMap::from([("TPU_RUNNER_TPU_ENDPOINT", running.url())])
}
