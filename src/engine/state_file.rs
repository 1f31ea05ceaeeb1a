//! A state snapshot as a user file (`state export`'s JSON, docs/state-schema.md): its schema
//! version, unknown fields and what a pass needs checked, with positions in the text. Read
//! by `plan --state`, `state import` and a scenario's `initial_state`; it opens no file.

use crate::engine::State;
use crate::engine::snapshot::{self, Problem};
use crate::engine::state::SCHEMA_VERSION;

/// The last line of a refused snapshot's message.
const NOTHING_DONE: &str = "nothing was done: the state snapshot must be valid first\n";

/// A JSON error of `file` with its position and a pointer to the format.
pub fn json_error(file: &str, what: &str, e: &serde_json::Error) -> String {
    format!(
        "error: {what}: {e}\n  --> {file}:{}:{}\n  = hint: see docs/state-schema.md for the format\n",
        e.line(),
        e.column()
    )
}

/// The state of `text` (read from `file`), or every problem found, rendered.
pub fn parse(file: &str, text: &str) -> Result<State, String> {
    // Two reads of the whole text, side by side (a 100k-job snapshot is 70 MB): the records,
    // and the check that no object names a key twice (merged, the last wins, without a
    // word). Fields serde would skip are reported (a misspelled `priorty` must not vanish).
    let mut unknown = Vec::new();
    let (read, duplicates) = std::thread::scope(|s| {
        let duplicates = s.spawn(|| serde_json::from_str::<NoDuplicateKeys>(text).err());
        let read: Result<State, _> =
            serde_ignored::deserialize(&mut serde_json::Deserializer::from_str(text), |p| {
                unknown.push(field_path(&p))
            });
        (read, duplicates.join())
    });
    // The version is judged first, as written (`1.0` is not `1`): a snapshot of another
    // schema fails for that reason, not for a field of its own. Read apart, building
    // nothing, only when the records did not say it.
    let version = match &read {
        Ok(state) => Some(serde_json::Value::from(state.schema_version)),
        Err(_) => {
            #[derive(serde::Deserialize)]
            struct Head {
                schema_version: Option<serde_json::Value>,
            }
            match serde_json::from_str::<Head>(text) {
                Ok(head) => head.schema_version,
                Err(e) if e.is_data() => None,
                Err(e) => return Err(json_error(file, "invalid JSON", &e)),
            }
        }
    };
    if version.as_ref().and_then(serde_json::Value::as_u64) != Some(SCHEMA_VERSION as u64) {
        return Err(format!(
            "error: schema_version: expected {SCHEMA_VERSION}, found {}\n  --> {file}\n",
            version.map_or("none".to_owned(), |v| v.to_string()),
        ));
    }
    match duplicates {
        Ok(None) => {}
        Ok(Some(e)) => return Err(json_error(file, "invalid state", &e)),
        Err(panic) => std::panic::resume_unwind(panic),
    }
    let state = read.map_err(|e| json_error(file, "invalid state", &e))?;
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
    let Ok(tree) = crate::spec::yaml::parse(file, text) else {
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
        return Err(message);
    };
    let mut checker = crate::spec::yaml::Checker::new(text);
    for p in &problems {
        let node = crate::spec::yaml::node_at(&tree, &p.path);
        match &p.hint {
            Some(hint) => checker.error_hint(node, &p.path, p.message.clone(), hint.clone()),
            None => checker.error(node, &p.path, p.message.clone()),
        }
    }
    let errors = checker
        .finish(file, ())
        .expect_err("problems were recorded");
    Err(format!("{}{NOTHING_DONE}", errors.render()))
}

use std::borrow::Cow;

/// Any JSON value whose objects name each key once (building nothing).
#[derive(Debug)]
struct NoDuplicateKeys;

impl<'de> serde::Deserialize<'de> for NoDuplicateKeys {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(NoDuplicateKeys)
    }
}

impl<'de> serde::de::Visitor<'de> for NoDuplicateKeys {
    type Value = NoDuplicateKeys;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_bool<E>(self, _: bool) -> Result<Self::Value, E> {
        Ok(self)
    }

    fn visit_i64<E>(self, _: i64) -> Result<Self::Value, E> {
        Ok(self)
    }

    fn visit_u64<E>(self, _: u64) -> Result<Self::Value, E> {
        Ok(self)
    }

    fn visit_f64<E>(self, _: f64) -> Result<Self::Value, E> {
        Ok(self)
    }

    fn visit_str<E>(self, _: &str) -> Result<Self::Value, E> {
        Ok(self)
    }

    fn visit_unit<E>(self) -> Result<Self::Value, E> {
        Ok(self)
    }

    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        while seq.next_element::<NoDuplicateKeys>()?.is_some() {}
        Ok(self)
    }

    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        // Most objects hold a few keys, compared without hashing; a large one (a queue's
        // jobs) costs linear time all the same.
        let mut seen = crate::spec::first_seen::FirstSeen::<Cow<'de, str>, ()>::default();
        while let Some(key) = map.next_key::<Cow<'de, str>>()? {
            if seen.get(&key).is_some() {
                return Err(serde::de::Error::custom(format!(
                    "the key `{key}` is given twice in one object (the first would be lost)"
                )));
            }
            map.next_value::<NoDuplicateKeys>()?;
            seen.insert(key, ());
        }
        Ok(self)
    }
}

/// A path serde_ignored reports, in the field-path syntax of every other message
fn field_path(path: &serde_ignored::Path<'_>) -> String {
    use serde_ignored::Path;
    match path {
        Path::Root => String::new(),
        Path::Seq { parent, index } => format!("{}[{index}]", field_path(parent)),
        Path::Map { parent, key } => {
            crate::spec::yaml::join(field_path(parent).as_str(), key).to_string()
        }
        Path::Some { parent }
        | Path::NewtypeStruct { parent }
        | Path::NewtypeVariant { parent } => field_path(parent),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_wrong_schema_version_is_shown_as_written() {
        let e = super::parse("s.json", r#"{"schema_version": 1.0, "jobs": {}}"#).unwrap_err();
        assert!(e.contains("expected 1, found 1.0"), "{e}");
        let e = super::parse("s.json", r#"{"jobs": {}}"#).unwrap_err();
        assert!(e.contains("found none"), "{e}");
    }

    #[test]
    fn a_key_given_twice_is_found_in_small_and_large_objects() {
        use super::NoDuplicateKeys;
        let object = |keys: &[String]| {
            let fields: Vec<String> = keys.iter().map(|k| format!("{k:?}: [{{}}]")).collect();
            format!("{{{}}}", fields.join(", "))
        };
        for n in [1, 2, 15, 16, 17, 40] {
            let keys: Vec<String> = (0..n).map(|i| format!("k{i}")).collect();
            let fine = object(&keys);
            assert!(
                serde_json::from_str::<NoDuplicateKeys>(&fine).is_ok(),
                "{fine}"
            );
            // The repeat of every key, placed after each of the others.
            for first in 0..n {
                for at in first + 1..=n {
                    let mut twice = keys.clone();
                    twice.insert(at, keys[first].clone());
                    let text = format!("[{}, {{\"a\": 1}}]", object(&twice));
                    let e = serde_json::from_str::<NoDuplicateKeys>(&text).unwrap_err();
                    let want = format!("the key `k{first}` is given twice");
                    assert!(e.to_string().starts_with(&want), "{text}: {e}");
                }
            }
        }
        // An escaped key equals its plain spelling.
        let e = serde_json::from_str::<NoDuplicateKeys>(r#"{"a": 1, "\u0061": 2}"#);
        assert!(e.is_err());
    }

    #[test]
    fn the_state_limit_holds_a_large_queue() {
        use crate::engine::{State, Timestamp, synthetic};
        let mut state = State::new();
        for job in synthetic::pending_jobs(10_000, Timestamp::from_secs(1_767_225_600)) {
            state.jobs.insert(job.id, job);
        }
        let bytes = serde_json::to_string_pretty(&state).unwrap().len() as u64;
        let per_job = bytes / 10_000;
        // About 1 KB each: the limit holds about 500,000 of them.
        assert!(
            (900..1200).contains(&per_job),
            "{per_job} B per pending job"
        );
        assert!(per_job * 450_000 < crate::files::STATE_LIMIT, "{per_job}");
    }
}
