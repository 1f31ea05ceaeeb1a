//! The YAML tree of a value serde can serialise (a state snapshot's stored job specs), built
//! directly: the tree `yaml::parse` gives for the value's JSON text with each object's keys
//! in byte order (as a JSON tree holds them), without writing the text or a tree between. For re-reading stored records with the reader of their files; the
//! tree has no positions (every node at line 1, column 1, no source span: a reader's
//! `raw_text` of it is empty), so it must not be used where a problem needs one.

use serde::ser::{self, Serialize};

use super::yaml::{Node, Value};

/// Why a value has no tree: what JSON cannot hold either (a map key that is not a string or
/// number, an integer beyond 64 bits).
#[derive(Debug)]
pub struct Error(String);

impl std::fmt::Display for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Error {}

impl ser::Error for Error {
    fn custom<T: std::fmt::Display>(msg: T) -> Self {
        Error(msg.to_string())
    }
}

/// `value`'s tree, as JSON writes it: `None` and units are null, a unit variant is its
/// name, other variants a one-key mapping, a map's keys in byte order with the last of a
/// repeated key kept, a non-finite float null, an integer beyond `i64` a float.
pub fn to_tree<T: Serialize + ?Sized>(value: &T) -> Result<Node, Error> {
    value.serialize(Tree)
}

fn node(value: Value) -> Node {
    Node {
        line: 1,
        column: 1,
        span: (0, 0),
        value,
    }
}

/// A mapping from `(key, value)` pairs in the order given, as a JSON object holds them:
/// sorted by key, a repeated key's last value kept.
fn mapping(mut pairs: Vec<(String, Node)>) -> Node {
    // Stable: of equal keys the last given stays last, and is kept.
    pairs.sort_by(|a, b| a.0.cmp(&b.0));
    let mut out: Vec<(Node, Node)> = Vec::with_capacity(pairs.len());
    for (key, value) in pairs {
        match out.last_mut() {
            Some((k, v)) if k.as_str() == Some(&key) => *v = value,
            _ => out.push((node(Value::Str(key)), value)),
        }
    }
    node(Value::Map(out))
}

/// `{variant: value}`.
fn variant(name: &str, value: Node) -> Node {
    node(Value::Map(vec![(node(Value::Str(name.to_owned())), value)]))
}

struct Tree;

impl ser::Serializer for Tree {
    type Ok = Node;
    type Error = Error;
    type SerializeSeq = Seq;
    type SerializeTuple = Seq;
    type SerializeTupleStruct = Seq;
    type SerializeTupleVariant = Seq;
    type SerializeMap = Map;
    type SerializeStruct = Map;
    type SerializeStructVariant = Map;

    fn serialize_bool(self, v: bool) -> Result<Node, Error> {
        Ok(node(Value::Bool(v)))
    }

    fn serialize_i64(self, v: i64) -> Result<Node, Error> {
        Ok(node(Value::Int(v)))
    }

    fn serialize_i8(self, v: i8) -> Result<Node, Error> {
        self.serialize_i64(v.into())
    }

    fn serialize_i16(self, v: i16) -> Result<Node, Error> {
        self.serialize_i64(v.into())
    }

    fn serialize_i32(self, v: i32) -> Result<Node, Error> {
        self.serialize_i64(v.into())
    }

    fn serialize_i128(self, v: i128) -> Result<Node, Error> {
        match (i64::try_from(v), u64::try_from(v)) {
            (Ok(v), _) => self.serialize_i64(v),
            (_, Ok(v)) => self.serialize_u64(v),
            _ => Err(Error("an integer beyond 64 bits".into())),
        }
    }

    fn serialize_u64(self, v: u64) -> Result<Node, Error> {
        Ok(node(match i64::try_from(v) {
            Ok(v) => Value::Int(v),
            // JSON keeps it exact; the tree of its text holds it as a float.
            Err(_) => Value::Float(v as f64),
        }))
    }

    fn serialize_u8(self, v: u8) -> Result<Node, Error> {
        self.serialize_i64(v.into())
    }

    fn serialize_u16(self, v: u16) -> Result<Node, Error> {
        self.serialize_i64(v.into())
    }

    fn serialize_u32(self, v: u32) -> Result<Node, Error> {
        self.serialize_i64(v.into())
    }

    fn serialize_u128(self, v: u128) -> Result<Node, Error> {
        match u64::try_from(v) {
            Ok(v) => self.serialize_u64(v),
            Err(_) => Err(Error("an integer beyond 64 bits".into())),
        }
    }

    fn serialize_f32(self, v: f32) -> Result<Node, Error> {
        self.serialize_f64(v.into())
    }

    fn serialize_f64(self, v: f64) -> Result<Node, Error> {
        Ok(node(if v.is_finite() {
            Value::Float(v)
        } else {
            Value::Null
        }))
    }

    fn serialize_char(self, v: char) -> Result<Node, Error> {
        Ok(node(Value::Str(v.to_string())))
    }

    fn serialize_str(self, v: &str) -> Result<Node, Error> {
        Ok(node(Value::Str(v.to_owned())))
    }

    fn serialize_bytes(self, v: &[u8]) -> Result<Node, Error> {
        let items = v.iter().map(|b| node(Value::Int((*b).into())));
        Ok(node(Value::Seq(items.collect())))
    }

    fn serialize_none(self) -> Result<Node, Error> {
        Ok(node(Value::Null))
    }

    fn serialize_some<T: Serialize + ?Sized>(self, value: &T) -> Result<Node, Error> {
        value.serialize(self)
    }

    fn serialize_unit(self) -> Result<Node, Error> {
        Ok(node(Value::Null))
    }

    fn serialize_unit_struct(self, _: &'static str) -> Result<Node, Error> {
        self.serialize_unit()
    }

    fn serialize_unit_variant(
        self,
        _: &'static str,
        _: u32,
        name: &'static str,
    ) -> Result<Node, Error> {
        self.serialize_str(name)
    }

    fn serialize_newtype_struct<T: Serialize + ?Sized>(
        self,
        _: &'static str,
        value: &T,
    ) -> Result<Node, Error> {
        value.serialize(self)
    }

    fn serialize_newtype_variant<T: Serialize + ?Sized>(
        self,
        _: &'static str,
        _: u32,
        name: &'static str,
        value: &T,
    ) -> Result<Node, Error> {
        Ok(variant(name, value.serialize(Tree)?))
    }

    fn serialize_seq(self, len: Option<usize>) -> Result<Seq, Error> {
        Ok(Seq {
            variant: None,
            items: Vec::with_capacity(len.unwrap_or(0)),
        })
    }

    fn serialize_tuple(self, len: usize) -> Result<Seq, Error> {
        self.serialize_seq(Some(len))
    }

    fn serialize_tuple_struct(self, _: &'static str, len: usize) -> Result<Seq, Error> {
        self.serialize_seq(Some(len))
    }

    fn serialize_tuple_variant(
        self,
        _: &'static str,
        _: u32,
        name: &'static str,
        len: usize,
    ) -> Result<Seq, Error> {
        Ok(Seq {
            variant: Some(name),
            items: Vec::with_capacity(len),
        })
    }

    fn serialize_map(self, len: Option<usize>) -> Result<Map, Error> {
        Ok(Map {
            variant: None,
            pairs: Vec::with_capacity(len.unwrap_or(0)),
            key: None,
        })
    }

    fn serialize_struct(self, _: &'static str, len: usize) -> Result<Map, Error> {
        self.serialize_map(Some(len))
    }

    fn serialize_struct_variant(
        self,
        _: &'static str,
        _: u32,
        name: &'static str,
        len: usize,
    ) -> Result<Map, Error> {
        Ok(Map {
            variant: Some(name),
            pairs: Vec::with_capacity(len),
            key: None,
        })
    }
}

/// A list being built (of a tuple variant: under its name).
struct Seq {
    variant: Option<&'static str>,
    items: Vec<Node>,
}

impl Seq {
    fn push<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), Error> {
        self.items.push(value.serialize(Tree)?);
        Ok(())
    }

    fn done(self) -> Node {
        let list = node(Value::Seq(self.items));
        match self.variant {
            Some(name) => variant(name, list),
            None => list,
        }
    }
}

impl ser::SerializeSeq for Seq {
    type Ok = Node;
    type Error = Error;

    fn serialize_element<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), Error> {
        self.push(value)
    }

    fn end(self) -> Result<Node, Error> {
        Ok(self.done())
    }
}

impl ser::SerializeTuple for Seq {
    type Ok = Node;
    type Error = Error;

    fn serialize_element<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), Error> {
        self.push(value)
    }

    fn end(self) -> Result<Node, Error> {
        Ok(self.done())
    }
}

impl ser::SerializeTupleStruct for Seq {
    type Ok = Node;
    type Error = Error;

    fn serialize_field<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), Error> {
        self.push(value)
    }

    fn end(self) -> Result<Node, Error> {
        Ok(self.done())
    }
}

impl ser::SerializeTupleVariant for Seq {
    type Ok = Node;
    type Error = Error;

    fn serialize_field<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), Error> {
        self.push(value)
    }

    fn end(self) -> Result<Node, Error> {
        Ok(self.done())
    }
}

/// A mapping being built (of a struct variant: under its name); `key` waits for its value.
struct Map {
    variant: Option<&'static str>,
    pairs: Vec<(String, Node)>,
    key: Option<String>,
}

impl Map {
    fn field<T: Serialize + ?Sized>(&mut self, key: String, value: &T) -> Result<(), Error> {
        self.pairs.push((key, value.serialize(Tree)?));
        Ok(())
    }

    fn done(self) -> Node {
        let map = mapping(self.pairs);
        match self.variant {
            Some(name) => variant(name, map),
            None => map,
        }
    }
}

impl ser::SerializeMap for Map {
    type Ok = Node;
    type Error = Error;

    fn serialize_key<T: Serialize + ?Sized>(&mut self, key: &T) -> Result<(), Error> {
        // As JSON writes keys: strings as they are, numbers and booleans as their text.
        let key = match key.serialize(Tree)?.value {
            Value::Str(s) => s,
            Value::Int(i) => i.to_string(),
            Value::Bool(b) => b.to_string(),
            other => {
                return Err(Error(format!(
                    "a map key must be a string, found {other:?}"
                )));
            }
        };
        self.key = Some(key);
        Ok(())
    }

    fn serialize_value<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), Error> {
        let key = self
            .key
            .take()
            .ok_or_else(|| Error("a value without its key".into()))?;
        self.field(key, value)
    }

    fn end(self) -> Result<Node, Error> {
        Ok(self.done())
    }
}

impl ser::SerializeStruct for Map {
    type Ok = Node;
    type Error = Error;

    fn serialize_field<T: Serialize + ?Sized>(
        &mut self,
        key: &'static str,
        value: &T,
    ) -> Result<(), Error> {
        self.field(key.to_owned(), value)
    }

    fn end(self) -> Result<Node, Error> {
        Ok(self.done())
    }
}

impl ser::SerializeStructVariant for Map {
    type Ok = Node;
    type Error = Error;

    fn serialize_field<T: Serialize + ?Sized>(
        &mut self,
        key: &'static str,
        value: &T,
    ) -> Result<(), Error> {
        self.field(key.to_owned(), value)
    }

    fn end(self) -> Result<Node, Error> {
        Ok(self.done())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::yaml;

    /// Same values, same kinds, same key order; positions aside.
    fn same(a: &Node, b: &Node) -> bool {
        match (&a.value, &b.value) {
            (Value::Null, Value::Null) => true,
            (Value::Bool(x), Value::Bool(y)) => x == y,
            (Value::Int(x), Value::Int(y)) => x == y,
            (Value::Float(x), Value::Float(y)) => x.to_bits() == y.to_bits(),
            (Value::Str(x), Value::Str(y)) => x == y,
            (Value::Seq(x), Value::Seq(y)) => {
                x.len() == y.len() && x.iter().zip(y).all(|(a, b)| same(a, b))
            }
            (Value::Map(x), Value::Map(y)) => {
                x.len() == y.len()
                    && (x.iter().zip(y)).all(|((ka, va), (kb, vb))| same(ka, kb) && same(va, vb))
            }
            _ => false,
        }
    }

    /// The tree built directly is the tree of the value's JSON text, keys sorted.
    fn check<T: Serialize>(value: &T) {
        // Each object's keys in byte order, as a JSON tree holds them.
        let json = serde_json::to_value(value).expect("serialises");
        let text = serde_json::to_string(&json).expect("serialises");
        let read = yaml::parse("value.json", &text).expect("JSON is YAML");
        let built = to_tree(value).expect("has a tree");
        assert!(same(&built, &read), "{text}: built {built:?}");
    }

    #[derive(serde::Serialize)]
    enum Kind {
        Unit,
        Newtype(u8),
        Tuple(i32, bool),
        Struct { b: Option<String>, a: f64 },
    }

    #[derive(serde::Serialize)]
    #[serde(tag = "code", rename_all = "snake_case")]
    enum Tagged {
        Taken { holders: Vec<String>, more: u32 },
    }

    #[derive(serde::Serialize)]
    struct Record {
        zeta: Vec<Kind>,
        alpha: (char, ()),
        numbers: [i64; 3],
        big: u64,
        wide: i128,
        nan: f32,
        keys: std::collections::BTreeMap<u16, &'static str>,
        tagged: Tagged,
        none: Option<bool>,
        empty: Vec<u8>,
        bytes: serde_bytes_like::Bytes,
    }

    /// Bytes as a serializer sees them (serde writes them as a list of numbers in JSON).
    mod serde_bytes_like {
        pub struct Bytes(pub &'static [u8]);
        impl serde::Serialize for Bytes {
            fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.serialize_bytes(self.0)
            }
        }
    }

    #[test]
    fn every_kind_of_value_has_the_tree_of_its_json() {
        check(&Record {
            zeta: vec![
                Kind::Unit,
                Kind::Newtype(7),
                Kind::Tuple(-3, true),
                Kind::Struct {
                    b: Some("x: y".into()),
                    a: 1.5,
                },
                Kind::Struct { b: None, a: 2.0 },
            ],
            alpha: ('é', ()),
            numbers: [i64::MIN, 0, i64::MAX],
            big: u64::MAX,
            wide: -5,
            nan: f32::NAN,
            keys: [(10, "ten"), (2, "two")].into_iter().collect(),
            tagged: Tagged::Taken {
                holders: vec!["job-1 (running)".into()],
                more: 3,
            },
            none: None,
            empty: Vec::new(),
            bytes: serde_bytes_like::Bytes(b"\x00\xff"),
        });
        check(&serde_json::json!({"b": [1, 2.5, null, "\u{1}"], "a": {}, "": [[]]}));
        // A map whose keys repeat keeps the last value, as a JSON object does.
        struct Repeated;
        impl Serialize for Repeated {
            fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                use serde::ser::SerializeMap as _;
                let mut map = s.serialize_map(None)?;
                for (k, v) in [("k", 1), ("a", 0), ("k", 2)] {
                    map.serialize_entry(k, &v)?;
                }
                map.end()
            }
        }
        let tree = to_tree(&Repeated).expect("has a tree");
        let json = serde_json::to_value(Repeated).expect("serialises");
        assert_eq!(yaml::to_json(&tree), json);
        assert!(matches!(&tree.value, Value::Map(pairs) if pairs.len() == 2));
        assert!(to_tree(&u128::MAX).is_err());
        let mut map = std::collections::HashMap::new();
        map.insert(vec![1], 1);
        assert!(to_tree(&map).is_err(), "a list is no key");
    }

    /// Stored job specs, as a snapshot holds them: from a full manifest and a sweep's.
    #[test]
    fn stored_specs_have_the_tree_of_their_json() {
        let full = include_str!("../../tests/fixtures/jobs/valid/full.yaml");
        let runs = include_str!("../../tests/fixtures/jobs/valid/runs.yaml");
        for (file, text) in [("full/job.yaml", full), ("runs/job.yaml", runs)] {
            for spec in crate::spec::job::parse_jobs(file, text, None).expect("valid") {
                check(&spec);
            }
        }
        let fleet = crate::engine::synthetic::fleet(20, 1);
        let epoch = crate::engine::Timestamp::from_secs(1_767_225_600);
        for job in crate::engine::synthetic::varied_pending_jobs(&fleet, 50, epoch) {
            check(&job.spec);
        }
    }
}
