//! How records are laid out in a store: a job's document carries everything but its
//! attempts, and each attempt is a document of its own (with its job id and position), so no
//! document grows with a job's history (Firestore caps a document at 1 MiB). The JSON of each
//! part is the state schema's (`docs/state-schema.md`). No IO.

use serde_json::{Map, Value};

use crate::engine::state::{Attempt, Job};

/// A job's document without its attempts.
pub fn job_doc(job: &Job) -> Result<Map<String, Value>, String> {
    let mut value = serde_json::to_value(job).map_err(|e| e.to_string())?;
    let map = value.as_object_mut().ok_or("a job is a JSON object")?;
    map.remove("attempts");
    Ok(std::mem::take(map))
}

/// An attempt's document: the attempt plus `job_id` and `seq` (its position, oldest first).
pub fn attempt_doc(job: &Job, seq: usize, attempt: &Attempt) -> Result<Map<String, Value>, String> {
    let mut value = serde_json::to_value(attempt).map_err(|e| e.to_string())?;
    let map = value.as_object_mut().ok_or("an attempt is a JSON object")?;
    map.insert("job_id".into(), Value::String(job.id.as_str().to_owned()));
    map.insert("seq".into(), Value::from(seq as u64));
    Ok(std::mem::take(map))
}

/// A job read back from its document and its attempts' documents (any order), with its
/// derived requirement fingerprint filled (so the first pass after a load does not touch
/// every job to fill it, which would make its commit rewrite them all).
pub fn job_from_docs(
    doc: Map<String, Value>,
    attempts: Vec<Map<String, Value>>,
) -> Result<Job, String> {
    let mut job: Job = serde_json::from_value(Value::Object(doc)).map_err(|e| e.to_string())?;
    let mut parsed = Vec::with_capacity(attempts.len());
    for mut a in attempts {
        let seq = a.remove("seq").and_then(|s| s.as_u64()).unwrap_or(u64::MAX);
        a.remove("job_id");
        let attempt: Attempt =
            serde_json::from_value(Value::Object(a)).map_err(|e| format!("attempt: {e}"))?;
        parsed.push((seq, attempt));
    }
    parsed.sort_by_key(|(seq, _)| *seq);
    job.attempts = parsed.into_iter().map(|(_, a)| a).collect();
    job.ensure_print();
    Ok(job)
}

/// The `active` flag of a job (pending, running, cancelling): what a load reads.
pub fn is_active(job: &Job) -> bool {
    !job.status.is_terminal()
}
