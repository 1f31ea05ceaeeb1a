//! Data-driven engine tests: every `tests/engine_cases/*.yaml` is one situation (fleet,
//! state, observation, `now`); one pass runs (two with `again_at`) and a readable summary of
//! actions, events and resulting state is snapshotted. A pass must never report a violation.

mod support;

use std::fmt::Write;

use tpu_runner::engine::observe::Action;
use tpu_runner::engine::{Engine, FleetIndex, PassOutput, State};

fn summarize(index: &FleetIndex, out: &PassOutput, state: &State, now_secs: i64) -> String {
    let mut s = String::new();
    writeln!(s, "actions:").unwrap();
    for a in &out.actions {
        let line = match a {
            Action::CreateQueuedResource {
                name,
                tpu_type,
                zone,
                ..
            } => format!("create {name} ({tpu_type} in {zone})"),
            Action::DeleteQueuedResource { name, .. } => format!("delete queued resource {name}"),
            Action::DeleteNode { name, .. } => format!("delete node {name}"),
            Action::Launch(l) => format!(
                "launch {} of {} on {} ({} workers, bucket {}{})",
                l.attempt_id,
                l.job_id,
                l.tpu_name,
                l.worker_count,
                l.bucket,
                l.checkpoint_from
                    .as_ref()
                    .map_or(String::new(), |from| format!(
                        ", checkpoints copied from {from}"
                    ))
            ),
            Action::Cancel {
                attempt_id,
                job_id,
                tpu_name,
                notice,
                ..
            } => match notice {
                Some(n) => format!(
                    "cancel {attempt_id} of {job_id} on {tpu_name} with notice {}",
                    n.word()
                ),
                None => format!("cancel {attempt_id} of {job_id} on {tpu_name}"),
            },
            Action::RecoverDisk {
                resource_id,
                worker_count,
                ..
            } => format!("recover disk of {resource_id} ({worker_count} workers)"),
        };
        writeln!(s, "  {line}").unwrap();
    }
    writeln!(s, "events:").unwrap();
    for e in &out.events {
        let mut line = e.kind.clone();
        for (k, v) in [
            ("job", &e.job_id),
            ("resource", &e.resource_id),
            ("attempt", &e.attempt_id),
        ] {
            if let Some(v) = v {
                line.push_str(&format!(" {k}={v}"));
            }
        }
        if !e.detail.is_empty() {
            line.push_str(&format!(" ({})", e.detail));
        }
        writeln!(s, "  {line}").unwrap();
    }
    writeln!(s, "jobs:").unwrap();
    let mut jobs: Vec<_> = state.all_jobs().collect();
    jobs.sort_by_key(|a| a.id);
    for j in jobs {
        let mut line = format!("  {}: {}", j.id, j.status.as_str());
        if let Some(r) = &j.assigned_resource {
            line.push_str(&format!(" on {r}"));
        }
        if let Some(a) = j.attempt() {
            line.push_str(&format!("; attempt {} {:?}", a.id, a.status).to_lowercase());
            if let Some(reason) = a.end_reason {
                let exit = a.exit_code.map_or("none".to_owned(), |c| c.to_string());
                line.push_str(&format!(" ({reason:?}, exit {exit})").to_lowercase());
            }
        }
        if let Some(p) = &j.placement {
            line.push_str(&format!("; pinned {}", p.region));
            if let Some(r) = &p.bucket_region {
                line.push_str(&format!(" (bucket in {r})"));
            }
        }
        if let Some(t) = j.not_before {
            line.push_str(&format!("; not before +{}s", t.as_secs() - support::EPOCH));
        }
        if j.infra_failures > 0 {
            line.push_str(&format!("; infra failures {}", j.infra_failures));
        }
        if let Some(r) = &j.end_reason {
            line.push_str(&format!("; ended: {r}"));
        }
        writeln!(s, "{line}").unwrap();
    }
    writeln!(s, "resources:").unwrap();
    for r in state.resources.values() {
        let mut line = format!("  {}: {:?}", r.id, r.status).to_lowercase();
        if let Some(o) = &r.owner {
            line.push_str(&format!(" by {}/{}", o.job_id, o.attempt_id));
        }
        if let Some(t) = r.provisioning_node_missing_since {
            line.push_str(&format!(
                "; missing since +{}s",
                t.as_secs() - support::EPOCH
            ));
        }
        if let Some(t) = r.provisioning_node_seen_at {
            line.push_str(&format!("; seen at +{}s", t.as_secs() - support::EPOCH));
        }
        writeln!(s, "{line}").unwrap();
    }
    if !state.pools.is_empty() {
        writeln!(s, "pools:").unwrap();
        for (pool, m) in &state.pools {
            let secs = |t: Option<tpu_runner::engine::Timestamp>| {
                t.map_or("-".to_owned(), |t| {
                    format!("+{}s", t.as_secs() - support::EPOCH)
                })
            };
            writeln!(
                s,
                "  {pool}: waiting since {}, granted {}, strikes {}, cooling until {}",
                secs(m.waiting_since),
                m.granted,
                m.strikes,
                secs(m.cool_until)
            )
            .unwrap();
        }
    }
    if let Some(w) = out.next_wake {
        writeln!(
            s,
            "next wake: +{}s",
            w.as_secs() - support::EPOCH - now_secs
        )
        .unwrap();
    }
    assert!(
        out.violations.is_empty(),
        "violations: {:?}\n{s}",
        out.violations
    );
    support::shorten(index, &s)
}

#[test]
fn engine_cases() {
    insta::glob!("engine_cases/*.yaml", |path| {
        let case = support::read_case(&std::fs::read_to_string(path).unwrap());
        let engine = Engine::of_fleet(support::case_fleet(&case));
        let naming = support::naming_index(&case);
        let (mut state, obs) = support::build(&case, &naming);
        let out = engine.reconcile(&mut state, &obs, support::at(case.now));
        let mut text = format!(
            "{}\n\npass at +{}s\n{}",
            case.about.trim(),
            case.now,
            summarize(&naming, &out, &state, case.now)
        );
        if let Some(t) = case.again_at {
            let out = engine.reconcile(&mut state, &obs, support::at(t));
            text.push_str(&format!(
                "\npass again at +{t}s (same observation)\n{}",
                summarize(&naming, &out, &state, t)
            ));
        }
        insta::assert_snapshot!(text);
    });
}

/// What the engine keeps between passes (its memo) never changes a decision: after two passes
/// on every case (a memo is built on the second pass over a state), the state is damaged (or
/// left alone) and the next pass of the same engine must leave the state and decide what a
/// pass with empty caches decides (it may only wake earlier). A damaged record or job must be
/// found although the memo skips what did not change.
#[test]
fn a_pass_with_memory_decides_as_one_without() {
    type Damage = fn(&mut State);
    let damages: [(&str, Damage); 4] = [
        ("nothing", |_| {}),
        ("a busy TPU forgets its owner", |st| {
            let owned = st
                .resources
                .values()
                .find(|r| r.owner.is_some())
                .map(|r| r.id);
            if let Some(id) = owned {
                st.resources.get_mut(&id).expect("found").owner = None;
            }
        }),
        ("a running job forgets its TPU", |st| {
            let running = st
                .jobs
                .values()
                .find(|j| j.assigned_resource.is_some())
                .map(|j| j.id);
            if let Some(id) = running {
                st.jobs.get_mut(&id).expect("found").assigned_resource = None;
            }
        }),
        ("every record is touched", |st| {
            for r in st.resources.values_mut() {
                r.idle_since = None;
            }
        }),
    ];
    for path in std::fs::read_dir("tests/engine_cases").unwrap() {
        let path = path.unwrap().path();
        let case = support::read_case(&std::fs::read_to_string(&path).unwrap());
        for (what, damage) in damages {
            let engine = Engine::of_fleet(support::case_fleet(&case));
            let (mut state, obs) = support::build(&case, &support::naming_index(&case));
            engine.reconcile(&mut state, &obs, support::at(case.now));
            engine.reconcile(&mut state, &obs, support::at(case.now + 30));
            damage(&mut state);
            let later = support::at(case.now + 60);
            let mut scratch = state.clone();
            let expected = engine.reconcile_from_scratch(&mut scratch, &obs, later);
            let out = engine.reconcile(&mut state, &obs, later);
            let case = path.display();
            assert_eq!(state, scratch, "{case}, {what}: state");
            assert_eq!(out.actions, expected.actions, "{case}, {what}: actions");
            assert_eq!(out.events, expected.events, "{case}, {what}: events");
            assert_eq!(
                out.violations, expected.violations,
                "{case}, {what}: violations"
            );
            assert!(
                out.next_wake.is_some() || expected.next_wake.is_none(),
                "{case}, {what}: wake"
            );
            assert!(
                out.next_wake <= expected.next_wake || expected.next_wake.is_none(),
                "{case}, {what}: wake later than without memory"
            );
        }
    }
}
