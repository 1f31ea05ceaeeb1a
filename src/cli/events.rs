//! `state events`: the store's event log in a time window, one JSON object per line; and the
//! window and the paged read that `capture` and `report` share. Reads only; never writes or
//! compacts the log.

use serde_json::json;

use super::exit_codes::ExitStatus;
use super::state::{StoreArgs, open, store_failure};
use super::{Failure, print_stdout};
use crate::engine::Timestamp;
use crate::engine::observe::Event;
use crate::spec::policy::parse_duration;
use crate::store::StateStore;

/// Events read per call to the store.
const PAGE: usize = 1000;

/// A time window `[since, until)`; an open end is unbounded.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Window {
    pub since: Option<Timestamp>,
    pub until: Option<Timestamp>,
}

/// `--since` and `--until`, as every command reading a window of the record takes them.
#[derive(Debug, Default, clap::Args)]
pub(crate) struct WindowArgs {
    /// From this time (RFC 3339) or this long ago (`24h`, `7d`); default: the first job or
    /// event.
    #[arg(long, value_name = "TIME")]
    since: Option<String>,
    /// Until this time (RFC 3339) or this long ago; default: just after the last job or
    /// event.
    #[arg(long, value_name = "TIME")]
    until: Option<String>,
}

impl WindowArgs {
    /// The window they name, durations counted back from now.
    pub fn window(&self) -> Result<Window, Failure> {
        Window::parse(
            self.since.as_deref(),
            self.until.as_deref(),
            crate::controller::wall_clock(),
        )
    }
}

impl Window {
    /// The window of `--since` and `--until`: each an RFC 3339 time, or a duration (`24h`,
    /// `7d`, `90m`) meaning that long before `now`.
    pub fn parse(
        since: Option<&str>,
        until: Option<&str>,
        now: Timestamp,
    ) -> Result<Window, Failure> {
        let one = |flag: &str, text: Option<&str>| -> Result<Option<Timestamp>, Failure> {
            let Some(text) = text else { return Ok(None) };
            if let Ok(at) = Timestamp::parse(text) {
                return Ok(Some(at));
            }
            match parse_duration(text) {
                Some(secs) => Ok(Some(now.plus_secs(-secs))),
                None => Err(Failure {
                    message: format!(
                        "error: {flag}: expected a time (RFC 3339, e.g. 2026-12-01T00:00:00Z) or a duration before now (e.g. 24h, 7d), found {text:?}\n"
                    ),
                    status: ExitStatus::Usage,
                }),
            }
        };
        let window = Window {
            since: one("--since", since)?,
            until: one("--until", until)?,
        };
        if let (Some(s), Some(u)) = (window.since, window.until)
            && u <= s
        {
            return Err(Failure {
                message: format!("error: --until ({u}) is not after --since ({s})\n"),
                status: ExitStatus::Usage,
            });
        }
        Ok(window)
    }

    /// Whether `at` is inside.
    pub fn contains(&self, at: Timestamp) -> bool {
        self.since.is_none_or(|s| at >= s) && self.until.is_none_or(|u| at < u)
    }
}

/// The store's state, its events in a window (with their sequence numbers) and the window's
/// ends.
pub(crate) type Recorded = (
    crate::engine::State,
    Vec<(u64, Event)>,
    Timestamp,
    Timestamp,
);

/// What `capture` and `report` read: the store's state and its events in `window`, and the
/// window's ends (an open end is where the record starts or stops: the first submission or
/// event, just after the last submission, end or event). `what` names the command's goal
/// in the error for an empty store.
pub(crate) fn recorded(
    store: &mut dyn StateStore,
    window: Window,
    what: &str,
) -> Result<Recorded, Failure> {
    let state = store.export().map_err(|e| store_failure(&e))?;
    let log = read(store, window)?;
    let first = state
        .all_jobs()
        .map(|j| j.submitted_at)
        .chain(log.iter().map(|(_, e)| e.at))
        .min();
    let last = state
        .all_jobs()
        .flat_map(|j| std::iter::once(j.submitted_at).chain(j.ended_at))
        .chain(log.iter().map(|(_, e)| e.at))
        .max();
    match (
        window.since.or(first),
        window.until.or(last.map(|t| t.plus_millis(1))),
    ) {
        (Some(since), Some(until)) => Ok((state, log, since, until)),
        _ => Err(Failure {
            message: format!(
                "error: {} holds no jobs and no events {what}\n",
                store.describe()
            ),
            status: ExitStatus::Invalid,
        }),
    }
}

/// Every event of the store inside `window`, in the order they were written (page by page:
/// the memory is that of the events kept, not of the log).
pub(crate) fn read(
    store: &mut dyn StateStore,
    window: Window,
) -> Result<Vec<(u64, Event)>, Failure> {
    let mut kept = Vec::new();
    let mut after = 0;
    loop {
        let page = store
            .events_after(after, PAGE)
            .map_err(|e| store_failure(&e))?;
        let Some(&(last, _)) = page.last() else {
            return Ok(kept);
        };
        after = last;
        kept.extend(page.into_iter().filter(|(_, e)| window.contains(e.at)));
    }
}

/// `state events`: prints the events of `window` (of the `kinds` given, all when empty) as
/// JSON lines with their sequence numbers.
pub(crate) fn print(
    args: &StoreArgs<'_>,
    window: Window,
    kinds: &[String],
) -> Result<ExitStatus, Failure> {
    let mut store = open(args, false)?;
    let mut text = String::new();
    for (seq, e) in read(store.as_mut(), window)? {
        if !kinds.is_empty() && !kinds.contains(&e.kind) {
            continue;
        }
        let mut line = json!({ "seq": seq });
        if let (Some(map), Ok(serde_json::Value::Object(fields))) =
            (line.as_object_mut(), serde_json::to_value(&e))
        {
            map.extend(fields);
        }
        text.push_str(&line.to_string());
        text.push('\n');
    }
    print_stdout(&text);
    Ok(ExitStatus::Ok)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn windows_take_times_and_durations_before_now() {
        let now = Timestamp::parse("2026-12-04T12:00:00Z").unwrap();
        let w = Window::parse(Some("2h"), Some("2026-12-04T11:30:00Z"), now).unwrap();
        assert_eq!(
            w.since,
            Some(Timestamp::parse("2026-12-04T10:00:00Z").unwrap())
        );
        assert!(w.contains(Timestamp::parse("2026-12-04T10:00:00Z").unwrap()));
        assert!(!w.contains(Timestamp::parse("2026-12-04T11:30:00Z").unwrap()));
        assert!(
            Window::parse(Some("1h"), Some("2h"), now).is_err(),
            "until before since"
        );
        assert!(Window::parse(Some("yesterday"), None, now).is_err());
        assert_eq!(Window::parse(None, None, now).unwrap(), Window::default());
    }
}
