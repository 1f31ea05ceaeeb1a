//! Deterministic naming: the interned [`Name`] the engine keys its tables by, slugs, stable
//! ids, fleet entry ids, generated TPU node and queued-resource names, the default runner
//! bucket and job ids. Bit-compatible with
//! tpu-runner 0.1.12 wherever the original is correct (see ARCHITECTURE.md, "Naming").
//! Must stay pure: no clock, no randomness (callers pass stamps and random bits in).

use std::borrow::Cow;
use std::fmt;
use std::hash::BuildHasherDefault;

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::Value as Json;
use sha1::{Digest, Sha1};

/// A name the engine compares and looks up all the time: TPU nodes, queued resources,
/// zones, fleet entries, jobs and attempts. Interned: a copy is a pointer, equality is
/// pointer equality and the hash is computed once, when the text is first seen. Orders,
/// prints and serialises as its text, so it can replace a `String` without changing any
/// output. The interner keeps every distinct text for the life of the process (tens of
/// bytes each): fleet names are bounded by the fleet, job and attempt ids grow with the jobs
/// one controller process sees.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct Name(ustr::Ustr);

/// A hash map keyed by [`Name`]: uses the name's precomputed hash (never iterate it where
/// order matters: the order is the interner's hash order).
pub type NameMap<V> = std::collections::HashMap<Name, V, BuildHasherDefault<ustr::IdentityHasher>>;

/// A hash set of [`Name`]s (see [`NameMap`]).
pub type NameSet = std::collections::HashSet<Name, BuildHasherDefault<ustr::IdentityHasher>>;

impl Name {
    /// The name of `text` (interned on first sight).
    pub fn new(text: &str) -> Name {
        Name(ustr::Ustr::from(text))
    }

    /// The name of `text` if some name has it already (a lookup that interns nothing: for
    /// text from outside, such as labels, that can only match a known name).
    pub fn existing(text: &str) -> Option<Name> {
        ustr::Ustr::from_existing(text).map(Name)
    }

    /// The text.
    pub fn as_str(&self) -> &'static str {
        self.0.as_str()
    }

    /// The interned string (for crates that intern with `ustr` too, such as the simulator).
    pub fn ustr(self) -> ustr::Ustr {
        self.0
    }

    /// The name of an interned string.
    pub fn from_ustr(text: ustr::Ustr) -> Name {
        Name(text)
    }
}

impl std::ops::Deref for Name {
    type Target = str;
    fn deref(&self) -> &str {
        self.as_str()
    }
}

impl fmt::Debug for Name {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self.as_str(), f)
    }
}

impl fmt::Display for Name {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl From<&str> for Name {
    fn from(text: &str) -> Name {
        Name::new(text)
    }
}

impl From<String> for Name {
    fn from(text: String) -> Name {
        Name::new(&text)
    }
}

impl PartialEq<str> for Name {
    fn eq(&self, other: &str) -> bool {
        self.as_str() == other
    }
}

impl PartialEq<&str> for Name {
    fn eq(&self, other: &&str) -> bool {
        self.as_str() == *other
    }
}

impl PartialEq<String> for Name {
    fn eq(&self, other: &String) -> bool {
        self.as_str() == other
    }
}

impl PartialEq<Name> for &str {
    fn eq(&self, other: &Name) -> bool {
        *self == other.as_str()
    }
}

impl PartialEq<Name> for String {
    fn eq(&self, other: &Name) -> bool {
        self == other.as_str()
    }
}

impl Serialize for Name {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.as_str())
    }
}

impl<'de> Deserialize<'de> for Name {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Name, D::Error> {
        let text = Cow::<'de, str>::deserialize(deserializer)?;
        Ok(Name::new(&text))
    }
}

/// GCP's limit for the generated node base name (the original's 50 characters, kept so that
/// `qr-` + base stays far below the 63-character resource-id limit).
pub const NODE_NAME_MAX: usize = 50;

/// Prefix of a managed queued-resource name.
pub const QR_PREFIX: &str = "qr-";

/// Lowercases, maps `_` to `-`, replaces every run of other characters outside `[a-z0-9-]`
/// with `-`, collapses dashes and trims them; an empty result becomes `item`.
pub fn slug(text: &str) -> String {
    let lowered = text.trim().to_lowercase().replace('_', "-");
    let mut out = String::with_capacity(lowered.len());
    for c in lowered.chars() {
        let c = if c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' {
            c
        } else {
            '-'
        };
        if c == '-' && out.ends_with('-') {
            continue;
        }
        out.push(c);
    }
    let trimmed = out.trim_matches('-');
    if trimmed.is_empty() {
        "item".to_owned()
    } else {
        trimmed.to_owned()
    }
}

/// Canonical JSON as the original writes it: sorted keys, `,`/`:` separators, non-ASCII as
/// `\uXXXX` escapes (UTF-16 surrogate pairs above the BMP).
pub fn canonical_json(value: &Json) -> String {
    let mut out = String::new();
    write_canonical(value, &mut out);
    out
}

fn write_canonical(value: &Json, out: &mut String) {
    match value {
        Json::Object(map) => {
            let mut keys: Vec<&String> = map.keys().collect();
            keys.sort();
            out.push('{');
            for (i, key) in keys.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_string(key, out);
                out.push(':');
                write_canonical(&map[key], out);
            }
            out.push('}');
        }
        Json::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_canonical(item, out);
            }
            out.push(']');
        }
        Json::String(s) => write_string(s, out),
        other => out.push_str(&other.to_string()),
    }
}

fn write_string(s: &str, out: &mut String) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{08}' => out.push_str("\\b"),
            '\u{0c}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 || (c as u32) > 0x7e => {
                let mut units = [0u16; 2];
                for unit in c.encode_utf16(&mut units) {
                    out.push_str(&format!("\\u{unit:04x}"));
                }
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

/// Lowercase hex SHA-1 of `bytes`.
pub fn sha1_hex(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(40);
    push_hex(&Sha1::digest(bytes), &mut out);
    out
}

/// Appends `bytes` as lowercase hex.
fn push_hex(bytes: &[u8], out: &mut String) {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    for b in bytes {
        out.push(DIGITS[usize::from(b >> 4)] as char);
        out.push(DIGITS[usize::from(b & 0xf)] as char);
    }
}

/// `prefix-<10 hex>`: SHA-1 of the canonical JSON of `value`.
pub fn stable_id(prefix: &str, value: &Json) -> String {
    format!(
        "{prefix}-{}",
        &sha1_hex(canonical_json(value).as_bytes())[..10]
    )
}

/// The attempt id: `stable_id("attempt", {"job", "previous", "resource"})`, written without
/// building a JSON value (it is computed for every assignment).
pub fn attempt_id(job: &str, resource: &str, previous: &str) -> Name {
    let mut canonical = String::with_capacity(48 + job.len() + resource.len() + previous.len());
    canonical.push_str("{\"job\":");
    write_string(job, &mut canonical);
    canonical.push_str(",\"previous\":");
    write_string(previous, &mut canonical);
    canonical.push_str(",\"resource\":");
    write_string(resource, &mut canonical);
    canonical.push('}');
    let mut id = String::with_capacity(18);
    id.push_str("attempt-");
    push_hex(&Sha1::digest(canonical.as_bytes())[..5], &mut id);
    Name::new(&id)
}

/// Default entry id when `id` is absent: `slug(type)-slug(zone)-<1-based index>`.
pub fn default_entry_id(tpu_type: &str, zone: &str, index_1based: usize) -> String {
    format!("{}-{}-{index_1based}", slug(tpu_type), slug(zone))
}

/// The generated node name of ordinal `ordinal` (1-based) of a managed entry.
///
/// Same as the original when the untruncated name fits in [`NODE_NAME_MAX`]. When it does not,
/// the original cut the whole name, ordinal and hash included, so long runner and entry names
/// gave every ordinal the same name; here only the `<runner>-<entry>` prefix is shortened, so
/// `-<ordinal>-<hash>` always survives and names stay unique per ordinal.
pub fn managed_node_name(
    runner: &str,
    entry_id: &str,
    tpu_type: &str,
    zone: &str,
    ordinal: u32,
) -> String {
    let hash = sha1_hex(
        canonical_json(&serde_json::json!({
            "entry": entry_id, "ordinal": ordinal, "type": tpu_type, "zone": zone,
        }))
        .as_bytes(),
    );
    let tail = format!("-{ordinal}-{}", &hash[..8]);
    let full = slug(&format!("{runner}-{entry_id}{tail}"));
    if full.len() <= NODE_NAME_MAX {
        return full;
    }
    let prefix = slug(&format!("{runner}-{entry_id}"));
    let keep = NODE_NAME_MAX.saturating_sub(tail.len());
    let prefix = prefix[..keep.min(prefix.len())].trim_end_matches('-');
    format!("{prefix}{tail}")
}

/// The queued-resource name that provisions `node_name`.
pub fn queued_resource_name(node_name: &str) -> Name {
    Name::new(&format!("{QR_PREFIX}{node_name}"))
}

/// The default runner bucket name (without `gs://`), as the original derives it.
pub fn default_bucket_name(project: &str, runner: &str) -> String {
    let full = slug(&format!("{project}-{runner}-us-central2"));
    if full.len() <= 63 {
        return full;
    }
    let head = full[..52].trim_end_matches('-');
    format!("{head}-{}", &sha1_hex(full.as_bytes())[..10])
}

/// A run's id: the job's name, `-` and six letters or digits drawn from `random` (the
/// caller's randomness, so this stays pure): `hello-k3x9q2`.
pub fn run_id(name: &str, random: u64) -> String {
    const ALPHABET: &[u8; 36] = b"0123456789abcdefghijklmnopqrstuvwxyz";
    let mut bits = random;
    let mut suffix = String::with_capacity(6);
    for _ in 0..6 {
        suffix.push(ALPHABET[(bits % 36) as usize] as char);
        bits /= 36;
    }
    format!("{name}-{suffix}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_name_behaves_like_its_text() {
        let (b, a) = (Name::new("qr-b"), Name::new("qr-a"));
        assert_eq!(Name::new("qr-b"), b, "the same text is the same name");
        assert_eq!(b.as_str(), "qr-b");
        assert!(a < b, "names order as their texts");
        assert_eq!(format!("{b} {b:?}"), r#"qr-b "qr-b""#);
        let json = serde_json::to_string(&[a, b]).unwrap();
        assert_eq!(json, r#"["qr-a","qr-b"]"#);
        let back: Vec<Name> = serde_json::from_str(&json).unwrap();
        assert_eq!(back, [a, b]);
        assert_eq!(Name::default(), Name::new(""));
        let mut set = NameSet::default();
        assert!(set.insert(a) && !set.insert(Name::new("qr-a")));
    }

    #[test]
    fn looking_up_a_text_interns_nothing() {
        let unseen = "a text no test interns: 7f3e9c";
        assert_eq!(Name::existing(unseen), None);
        assert_eq!(Name::existing(unseen), None);
        let name = Name::new("a text this test interns: 7f3e9c");
        assert_eq!(Name::existing(name.as_str()), Some(name));
    }

    #[test]
    fn vectors_from_the_original() {
        assert_eq!(slug("  Hello_World!!x--y "), "hello-world-x-y");
        assert_eq!(slug("!!!"), "item");
        assert_eq!(
            stable_id(
                "attempt",
                &json!({"job": "j", "previous": "", "resource": "r"})
            ),
            "attempt-7c8661d378"
        );
        assert_eq!(
            managed_node_name(
                "example-tpu-runner",
                "us-east1d-v6e-spot",
                "v6e-64",
                "us-east1-d",
                1
            ),
            "example-tpu-runner-us-east1d-v6e-spot-1-f79cf783"
        );
        assert_eq!(
            managed_node_name(
                "example-tpu-runner",
                "us-east1d-v6e-spot",
                "v6e-64",
                "us-east1-d",
                2
            ),
            "example-tpu-runner-us-east1d-v6e-spot-2-d7639adc"
        );
        assert_eq!(
            default_bucket_name("your-gcp-project-id", "example-tpu-runner"),
            "your-gcp-project-id-example-tpu-runner-us-central2"
        );
    }

    #[test]
    fn long_names_no_longer_collide() {
        let a = managed_node_name(
            "my-long-runner-name-x",
            "a-very-long-fleet-entry-identifier",
            "v6e-8",
            "us-east1-d",
            1,
        );
        let b = managed_node_name(
            "my-long-runner-name-x",
            "a-very-long-fleet-entry-identifier",
            "v6e-8",
            "us-east1-d",
            2,
        );
        assert_ne!(a, b);
        assert!(a.len() <= NODE_NAME_MAX && b.len() <= NODE_NAME_MAX);
        assert!(a.starts_with("my-long-runner-name-x-a-very-long") && a.contains("-1-"));
    }

    #[test]
    fn canonical_json_escapes_like_python() {
        assert_eq!(
            canonical_json(&json!({"b": 1, "a": "é😀"})),
            r#"{"a":"\u00e9\ud83d\ude00","b":1}"#
        );
    }

    #[test]
    fn long_default_bucket_is_hashed() {
        let name = default_bucket_name(
            "a-really-long-project-identifier",
            "and-an-even-longer-runner-name-here",
        );
        assert!(name.len() <= 63, "{name}");
        let (head, hash) = name.rsplit_once('-').unwrap();
        assert_eq!(hash.len(), 10);
        assert!(head.len() <= 52 && !head.ends_with('-'));
    }

    #[test]
    fn run_ids_are_the_name_and_six_letters_or_digits() {
        assert_eq!(run_id("hello", 0), "hello-000000");
        let id = run_id("train.a_1", u64::MAX);
        assert_eq!(
            id.len(),
            "train.a_1".len() + super::super::job::RUN_SUFFIX_LEN
        );
        assert!(super::super::job::check_job_id(&id).is_ok());
        assert_ne!(run_id("x", 1), run_id("x", 2));
    }
}
