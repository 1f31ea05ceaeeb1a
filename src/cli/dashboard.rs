//! `dashboard`: a read-only web page of what the store holds (the queue with why each run
//! waits, the latest finished runs, the TPUs by zone, the latest events, the goodput ledger
//! of the last day), served on loopback by default and refreshing on its own. One thread
//! reads the store every few seconds into a snapshot (new events only, the ledger once a
//! minute); requests are answered from the snapshot, so viewers never cost the store
//! anything. Never writes.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use axum::http::header;
use axum::response::IntoResponse;
use axum::routing::get;
use serde_json::{Value, json};

use super::Failure;
use super::exit_codes::ExitStatus;
use super::stack::{Stack, StackOpts};
use super::state::store_failure;
use crate::controller::wall_clock;
use crate::engine::observe::Event;
use crate::engine::state::Resource;
use crate::store::StateStore;

/// The page: static HTML that fetches `/api/snapshot` and renders it with DOM calls (never
/// `innerHTML`: names and details are shown as text).
const PAGE: &str = include_str!("templates/dashboard.html");

/// Events kept for the page.
const EVENTS: usize = 100;

/// What `dashboard` is asked.
pub(crate) struct DashboardArgs<'a> {
    pub listen: &'a str,
    /// Seconds between reads of the store.
    pub refresh: f64,
}

/// What the reader thread keeps between reads.
struct Reader {
    stack: Stack,
    store: Box<dyn StateStore>,
    /// The active state, followed by what changed since the last read.
    mirror: crate::store::changes::Mirror,
    seen: u64,
    events: VecDeque<(u64, Event)>,
    ledger: Value,
    ledger_at: Option<Instant>,
}

impl Reader {
    fn snapshot(&mut self) -> Result<Value, Failure> {
        let now = wall_clock();
        let state = self
            .mirror
            .refresh(self.store.as_mut())
            .map_err(|e| store_failure(&e))?;
        let queue = super::queue::queue_json(&self.stack, state, now, 200);
        let history = self
            .store
            .latest_finished(now.plus_secs(-7 * 86_400), 50)
            .map_err(|e| store_failure(&e))?;
        let history: Vec<Value> = history.iter().map(super::queue::history_json).collect();
        // Only the events recorded since the last read.
        loop {
            let page = self
                .store
                .events_after(self.seen, 1000)
                .map_err(|e| store_failure(&e))?;
            let full = page.len() == 1000;
            for (seq, e) in page {
                self.seen = self.seen.max(seq);
                self.events.push_back((seq, e));
                if self.events.len() > EVENTS {
                    self.events.pop_front();
                }
            }
            if !full {
                break;
            }
        }
        if self
            .ledger_at
            .is_none_or(|t| t.elapsed() >= Duration::from_secs(60))
        {
            self.ledger_at = Some(Instant::now());
            let window = super::events::Window {
                since: Some(now.plus_secs(-86_400)),
                until: None,
            };
            self.ledger = match super::events::recorded(self.store.as_mut(), window, "") {
                Ok((all, log, since, until)) => {
                    let m = crate::simulate::recorded::metrics(
                        &self.stack.fleet,
                        &all,
                        &log,
                        since,
                        until,
                        &crate::simulate::recorded::Costs::default(),
                    );
                    json!({"since": since, "until": until, "metrics": m})
                }
                Err(_) => Value::Null,
            };
        }
        let mut zones: std::collections::BTreeMap<&str, Vec<&Resource>> = Default::default();
        for r in state.resources.values() {
            zones.entry(r.zone.as_str()).or_default().push(r);
        }
        let zones: Vec<Value> = zones
            .into_iter()
            .map(|(zone, tpus)| {
                json!({
                    "zone": zone,
                    "tpus": tpus.iter().map(|r| json!({
                        "name": r.tpu_name.as_str(),
                        "type": r.tpu_type.to_string(),
                        "status": r.shown_status(),
                        "run": r.owner.as_ref().map(|o| o.job_id.as_str()),
                    })).collect::<Vec<_>>(),
                })
            })
            .collect();
        let events: Vec<Value> = self
            .events
            .iter()
            .rev()
            .map(|(seq, e)| {
                json!({
                    "seq": seq,
                    "at": e.at,
                    "kind": e.kind,
                    "run": e.job_id,
                    "tpu": e.resource_id,
                    "text": super::follow::sentence(e),
                })
            })
            .collect();
        Ok(json!({
            "generated_at": now,
            "fleet": self.stack.fleet.name,
            "store": self.store.describe(),
            "queue": queue,
            "history": history,
            "zones": zones,
            "events": events,
            "ledger": self.ledger,
        }))
    }
}

/// `dashboard`: serves until Ctrl-C.
pub(crate) fn run(opts: &StackOpts, args: &DashboardArgs<'_>) -> Result<ExitStatus, Failure> {
    if !(args.refresh.is_finite() && args.refresh >= 0.2) {
        return Err(Failure {
            message: "error: --refresh must be at least 0.2 seconds\n".into(),
            status: ExitStatus::Usage,
        });
    }
    let stack = Stack::resolve(opts)?;
    let listener = std::net::TcpListener::bind(args.listen).map_err(|e| Failure {
        message: format!("error: cannot listen on {}: {e}\n", args.listen),
        status: ExitStatus::Io,
    })?;
    let addr = listener.local_addr().map_err(|e| Failure {
        message: format!("error: {e}\n"),
        status: ExitStatus::Io,
    })?;
    let stop = super::interrupt_flag();
    let refresh = Duration::from_secs_f64(args.refresh);
    let shared: Arc<Mutex<Arc<String>>> = Arc::new(Mutex::new(Arc::new("null".into())));
    // The reader owns the store (stores are not shared between threads); the first
    // snapshot comes back before anything is served, so a store that cannot be read fails
    // the command.
    let (first_tx, first_rx) = std::sync::mpsc::channel::<Result<String, Failure>>();
    let into = Arc::clone(&shared);
    let stop_reader = Arc::clone(&stop);
    std::thread::Builder::new()
        .name("dashboard-reader".into())
        .spawn(move || {
            let store = match stack.open_store(false) {
                Ok(store) => store,
                Err(f) => {
                    let _ = first_tx.send(Err(f));
                    return;
                }
            };
            let describe = store.describe();
            let mut reader = Reader {
                stack,
                store,
                mirror: Default::default(),
                seen: 0,
                events: VecDeque::new(),
                ledger: Value::Null,
                ledger_at: None,
            };
            let mut first = Some(first_tx);
            while !stop_reader.load(std::sync::atomic::Ordering::SeqCst) {
                match (reader.snapshot(), first.take()) {
                    (Ok(doc), tx) => {
                        *into.lock().unwrap_or_else(|p| p.into_inner()) = Arc::new(doc.to_string());
                        if let Some(tx) = tx {
                            let _ = tx.send(Ok(describe.clone()));
                        }
                    }
                    (Err(f), Some(tx)) => {
                        let _ = tx.send(Err(f));
                        return;
                    }
                    (Err(f), None) => eprint!("{}", f.message),
                }
                std::thread::sleep(refresh);
            }
        })
        .map_err(|e| Failure {
            message: format!("error: {e}\n"),
            status: ExitStatus::Io,
        })?;
    let describe = first_rx.recv().map_err(|_| Failure {
        message: "error: the dashboard's reader stopped\n".into(),
        status: ExitStatus::Store,
    })??;
    eprintln!(
        "dashboard of {describe} on http://{addr}/ (read-only; refreshes every {} s). Stop with Ctrl-C.",
        args.refresh
    );
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| Failure {
            message: format!("error: {e}\n"),
            status: ExitStatus::Io,
        })?;
    let refresh_ms = (args.refresh * 1000.0) as u64;
    let app = Router::new()
        .route(
            "/",
            get(move || async move {
                (
                    [
                        (header::CONTENT_TYPE, "text/html; charset=utf-8"),
                        (header::CACHE_CONTROL, "no-store"),
                    ],
                    PAGE.replace("__REFRESH_MS__", &refresh_ms.to_string()),
                )
            }),
        )
        .route(
            "/api/snapshot",
            get(move || {
                let doc = Arc::clone(&shared.lock().unwrap_or_else(|p| p.into_inner()));
                async move {
                    (
                        [
                            (header::CONTENT_TYPE, "application/json"),
                            (header::CACHE_CONTROL, "no-store"),
                        ],
                        doc.as_str().to_owned(),
                    )
                        .into_response()
                }
            }),
        );
    rt.block_on(async move {
        listener.set_nonblocking(true)?;
        let listener = tokio::net::TcpListener::from_std(listener)?;
        axum::serve(listener, app)
            .with_graceful_shutdown(async move {
                while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
            })
            .await
    })
    .map_err(|e| Failure {
        message: format!("error: the dashboard stopped: {e}\n"),
        status: ExitStatus::Io,
    })?;
    Ok(ExitStatus::Ok)
}
