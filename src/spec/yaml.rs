//! A positioned YAML tree and a strict, error-collecting reader over it. Every spec file
//! (fleet, jobs, scenarios) is read through here so all of them report problems the same way.
//! Must not coerce types: a quoted `"1"` is a string, `64.7` is a float, never an integer.

use saphyr::{LoadableYamlNode, MarkedYamlOwned, ScalarOwned, YamlDataOwned};

use super::diagnostic::{Diagnostic, SpecErrors};

/// A YAML node with the position where it starts.
#[derive(Clone, Debug)]
pub struct Node {
    /// 1-based line.
    pub line: usize,
    /// 1-based column.
    pub column: usize,
    /// Character offsets of the node in the source (for raw scalar text).
    pub span: (usize, usize),
    /// The value.
    pub value: Value,
}

/// A YAML value after core-schema resolution.
#[derive(Clone, Debug)]
pub enum Value {
    /// `~`, `null` or nothing.
    Null,
    /// `true` / `false`.
    Bool(bool),
    /// An integer.
    Int(i64),
    /// A float.
    Float(f64),
    /// A string (quoted, or plain text that is not another type).
    Str(String),
    /// A sequence.
    Seq(Vec<Node>),
    /// A mapping, in file order.
    Map(Vec<(Node, Node)>),
    /// A construct this reader does not accept (custom tags, unresolved aliases).
    Unsupported(String),
}

impl Node {
    /// A short description of the value for "found …" messages.
    pub fn describe(&self) -> String {
        match &self.value {
            Value::Null => "null".into(),
            Value::Bool(b) => format!("boolean `{b}`"),
            Value::Int(i) => format!("integer `{i}`"),
            Value::Float(x) => format!("float `{x}`"),
            Value::Str(s) if s.is_empty() => "an empty string".into(),
            Value::Str(s) => format!("string {}", quote(s)),
            Value::Seq(items) if items.is_empty() => "an empty list".into(),
            Value::Seq(_) => "a list".into(),
            Value::Map(pairs) if pairs.is_empty() => "an empty mapping".into(),
            Value::Map(_) => "a mapping".into(),
            Value::Unsupported(what) => what.clone(),
        }
    }

    /// The string value, if the node is a string.
    pub fn as_str(&self) -> Option<&str> {
        match &self.value {
            Value::Str(s) => Some(s),
            _ => None,
        }
    }
}

/// Quotes a user value for a message, shortening very long ones.
pub fn quote(s: &str) -> String {
    let short: String = s.chars().take(60).collect();
    if short.len() < s.len() {
        format!("\"{short}…\"")
    } else {
        format!("{s:?}")
    }
}

/// Parses `source` as exactly one YAML document. An empty file yields a `Null` root.
pub fn parse(file: &str, source: &str) -> Result<Node, SpecErrors> {
    let fail = |line, column, message: String, hint: Option<String>| {
        SpecErrors::new(
            file,
            source,
            vec![Diagnostic {
                path: String::new(),
                line,
                column,
                message,
                hint,
            }],
        )
    };
    let docs = MarkedYamlOwned::load_from_str(source).map_err(|e| {
        let m = e.marker();
        fail(
            m.line().max(1),
            m.col() + 1,
            format!("invalid YAML: {}", e.info()),
            None,
        )
    })?;
    match docs.len() {
        0 => Ok(Node {
            line: 1,
            column: 1,
            span: (0, 0),
            value: Value::Null,
        }),
        1 => Ok(convert(docs.into_iter().next().expect("one document"))),
        _ => {
            let second = &docs[1];
            Err(fail(
                second.span.start.line(),
                second.span.start.col() + 1,
                format!("expected a single YAML document, found {}", docs.len()),
                Some("remove the `---` separators; one file holds one document".into()),
            ))
        }
    }
}

fn convert(node: MarkedYamlOwned) -> Node {
    let line = node.span.start.line().max(1);
    let column = node.span.start.col() + 1;
    let span = (node.span.start.index(), node.span.end.index());
    let value = match node.data {
        YamlDataOwned::Value(scalar) => match scalar {
            ScalarOwned::Null => Value::Null,
            ScalarOwned::Boolean(b) => Value::Bool(b),
            ScalarOwned::Integer(i) => Value::Int(i),
            ScalarOwned::FloatingPoint(f) => Value::Float(f.into_inner()),
            ScalarOwned::String(s) => Value::Str(s),
        },
        YamlDataOwned::Representation(s, _, _) => Value::Str(s),
        YamlDataOwned::Sequence(items) => Value::Seq(items.into_iter().map(convert).collect()),
        YamlDataOwned::Mapping(map) => Value::Map(
            map.into_iter()
                .map(|(k, v)| (convert(k), convert(v)))
                .collect(),
        ),
        YamlDataOwned::Tagged(tag, _) => Value::Unsupported(format!("a value tagged `{tag}`")),
        YamlDataOwned::Alias(_) => Value::Unsupported("an unresolved alias".into()),
        YamlDataOwned::BadValue => Value::Unsupported("a malformed value".into()),
    };
    Node {
        line,
        column,
        span,
        value,
    }
}

/// Collects diagnostics while a spec is read. One per file.
pub struct Checker<'s> {
    source: &'s str,
    diagnostics: Vec<Diagnostic>,
}

impl<'s> Checker<'s> {
    /// A checker over `source`.
    pub fn new(source: &'s str) -> Self {
        Checker {
            source,
            diagnostics: Vec::new(),
        }
    }

    /// An empty checker over the same source, for a part read apart (on another thread).
    pub fn fork(&self) -> Checker<'s> {
        Checker::new(self.source)
    }

    /// Takes in the problems of a part read apart, after this checker's own.
    pub fn absorb(&mut self, part: Checker<'s>) {
        self.diagnostics.extend(part.diagnostics);
    }

    /// Records a problem at `node`.
    pub fn error(&mut self, node: &Node, path: impl Place, message: impl Into<String>) {
        self.push(node, path, message.into(), None);
    }

    /// Records a problem at `node` with a hint.
    pub fn error_hint(
        &mut self,
        node: &Node,
        path: impl Place,
        message: impl Into<String>,
        hint: impl Into<String>,
    ) {
        self.push(node, path, message.into(), Some(hint.into()));
    }

    fn push(&mut self, node: &Node, path: impl Place, message: String, hint: Option<String>) {
        self.diagnostics.push(Diagnostic {
            path: path.to_string(),
            line: node.line,
            column: node.column,
            message,
            hint,
        });
    }

    /// Records "expected X, found Y".
    pub fn expected(&mut self, node: &Node, path: impl Place, expected: &str) {
        let hint = match (&node.value, expected) {
            (Value::Str(s), e) if e.contains("integer") && s.trim().parse::<i64>().is_ok() => {
                Some("remove the quotes: numbers are written without them".to_owned())
            }
            (Value::Str(s), e) if e.contains("boolean") && matches!(s.trim(), "true" | "false") => {
                Some("remove the quotes: booleans are written true or false".to_owned())
            }
            (Value::Str(s), e)
                if e.contains("boolean")
                    && matches!(
                        s.trim().to_ascii_lowercase().as_str(),
                        "yes" | "no" | "on" | "off"
                    ) =>
            {
                Some("YAML 1.2 booleans are only true and false".to_owned())
            }
            (Value::Int(_) | Value::Float(_) | Value::Bool(_), e) if e.contains("string") => {
                Some("quote the value to make it a string".to_owned())
            }
            _ => None,
        };
        // A number is quoted back as it was written (a float's value may print otherwise:
        // 18446744073709551615 is the float 18446744073709552000).
        let found = match node.value {
            Value::Float(_) => format!("number `{}`", self.raw_text(node)),
            _ => node.describe(),
        };
        let message = format!("expected {expected}, found {found}");
        self.push(node, path, message, hint);
    }

    /// `node` as JSON, numbers as written (see [`to_json_in`]).
    pub fn to_json(&self, node: &Node) -> serde_json::Value {
        to_json_in(node, Some(self.source))
    }

    /// The raw source text of a scalar node (what the user typed).
    pub fn raw_text(&self, node: &Node) -> String {
        let (start, end) = node.span;
        self.source
            .chars()
            .skip(start)
            .take(end.saturating_sub(start))
            .collect::<String>()
            .trim()
            .to_owned()
    }

    /// True when no problem has been recorded.
    pub fn is_clean(&self) -> bool {
        self.diagnostics.is_empty()
    }

    /// Number of problems recorded so far.
    pub fn error_count(&self) -> usize {
        self.diagnostics.len()
    }

    /// Finishes: `Ok(value)` when clean, else every problem.
    pub fn finish<T>(self, file: &str, value: T) -> Result<T, SpecErrors> {
        if self.diagnostics.is_empty() {
            Ok(value)
        } else {
            Err(SpecErrors::new(file, self.source, self.diagnostics))
        }
    }

    /// Reads `node` as a mapping whose keys are strings from `allowed`. Unknown keys are
    /// reported (with a suggestion), `rejected` keys get their own explanation.
    pub fn mapping<'n>(
        &mut self,
        node: &'n Node,
        path: impl Place,
        what: &str,
        allowed: &[&str],
        rejected: &[(&str, &str)],
    ) -> Option<Fields<'n>> {
        let Value::Map(pairs) = &node.value else {
            self.expected(node, path, &format!("{what} (a mapping)"));
            return None;
        };
        let mut fields = Vec::new();
        for (key, value) in pairs {
            let Some(name) = key.as_str() else {
                self.expected(key, path, "a field name (a string key)");
                continue;
            };
            if let Some((_, why)) = rejected.iter().find(|(k, _)| *k == name) {
                self.error_hint(
                    key,
                    join(path, name),
                    format!("field `{name}` is not allowed here"),
                    *why,
                );
            } else if allowed.contains(&name) {
                fields.push((name, key, value));
            } else {
                let suggestion = super::diagnostic::closest(name, allowed.iter().copied())
                    .map(|a| format!("did you mean `{a}`? "))
                    .unwrap_or_default();
                let mut sorted: Vec<&str> = allowed.to_vec();
                sorted.sort_unstable();
                self.error_hint(
                    key,
                    join(path, name),
                    format!("unknown field `{name}` in {what}"),
                    format!("{suggestion}known fields: {}", sorted.join(", ")),
                );
            }
        }
        Some(Fields {
            node,
            path: path.to_string(),
            fields,
        })
    }

    /// Reads a string; `None` (with an error) otherwise. Does not trim.
    pub fn string(&mut self, node: &Node, path: impl Place, expected: &str) -> Option<String> {
        match &node.value {
            Value::Str(s) => Some(s.clone()),
            _ => {
                self.expected(node, path, expected);
                None
            }
        }
    }

    /// Reads a trimmed, non-empty string.
    pub fn nonempty_string(
        &mut self,
        node: &Node,
        path: impl Place,
        expected: &str,
    ) -> Option<String> {
        let s = self.string(node, path, expected)?;
        let trimmed = s.trim();
        if trimmed.is_empty() {
            self.expected(node, path, expected);
            return None;
        }
        Some(trimmed.to_owned())
    }

    /// Reads an integer in `min..=max` (booleans and floats are errors).
    pub fn integer(
        &mut self,
        node: &Node,
        path: impl Place,
        min: i64,
        max: i64,
        expected: &str,
    ) -> Option<i64> {
        match node.value {
            Value::Int(i) if (min..=max).contains(&i) => Some(i),
            Value::Int(_) => {
                self.expected(node, path, &with_range(expected, min, max));
                None
            }
            _ => {
                self.expected(node, path, expected);
                None
            }
        }
    }

    /// Reads a boolean.
    pub fn boolean(&mut self, node: &Node, path: impl Place) -> Option<bool> {
        match node.value {
            Value::Bool(b) => Some(b),
            _ => {
                self.expected(node, path, "a boolean (true or false)");
                None
            }
        }
    }

    /// Reads a list; `allow_empty` false reports an empty one.
    pub fn list<'n>(
        &mut self,
        node: &'n Node,
        path: impl Place,
        expected: &str,
        allow_empty: bool,
    ) -> Option<&'n [Node]> {
        match &node.value {
            Value::Seq(items) if allow_empty || !items.is_empty() => Some(items),
            _ => {
                self.expected(node, path, expected);
                None
            }
        }
    }

    /// Reports duplicates among `(value, node, path)` triples, naming the first occurrence.
    /// A path is written only for a problem.
    pub fn unique<'n, V, P>(
        &mut self,
        items: impl IntoIterator<Item = (V, &'n Node, P)>,
        what: &str,
    ) where
        V: AsRef<str> + Eq + std::hash::Hash,
        P: std::fmt::Display,
    {
        let mut seen = super::first_seen::FirstSeen::default();
        for (value, node, path) in items {
            match seen.get(&value) {
                Some(at) => {
                    let message = format!(
                        "duplicate {what} {}, already used at {at}",
                        quote(value.as_ref())
                    );
                    self.error(node, &path, message);
                }
                None => seen.insert(value, path),
            }
        }
    }
}

/// The fields of a mapping that passed the key check.
pub struct Fields<'n> {
    node: &'n Node,
    path: String,
    fields: Vec<(&'n str, &'n Node, &'n Node)>,
}

impl<'n> Fields<'n> {
    /// The value of `name`, if present and not null.
    pub fn get(&self, name: &str) -> Option<&'n Node> {
        self.fields
            .iter()
            .find(|(k, _, v)| *k == name && !matches!(v.value, Value::Null))
            .map(|(_, _, v)| *v)
    }

    /// The value of `name` even when null (to tell "absent" from "null").
    pub fn get_raw(&self, name: &str) -> Option<&'n Node> {
        self.fields
            .iter()
            .find(|(k, _, _)| *k == name)
            .map(|(_, _, v)| *v)
    }

    /// The value of `name`, or an error "missing required field" at the mapping.
    pub fn required(
        &self,
        checker: &mut Checker<'_>,
        name: &str,
        expected: &str,
    ) -> Option<&'n Node> {
        let value = self.get(name);
        if value.is_none() {
            let what = if self.get_raw(name).is_some() {
                "is null"
            } else {
                "is missing"
            };
            checker.error_hint(
                self.get_raw(name).unwrap_or(self.node),
                self.path(name),
                format!("required field `{name}` {what}"),
                format!("set `{name}` to {expected}"),
            );
        }
        value
    }

    /// False (with an error at the second one given) when more than one of `names` is set:
    /// for mappings that choose one form among several.
    pub fn at_most_one(&self, checker: &mut Checker<'_>, names: &[&str]) -> bool {
        // In document order, so the error is at the one written second.
        let given: Vec<&str> = self
            .fields
            .iter()
            .filter(|(k, _, v)| names.contains(k) && !matches!(v.value, Value::Null))
            .map(|(k, _, _)| *k)
            .collect();
        if let [first, second, ..] = given[..] {
            let node = self.get_raw(second).unwrap_or(self.node);
            checker.error_hint(
                node,
                self.path(second),
                format!(
                    "`{first}` is already given: choose one of {}",
                    quoted(names)
                ),
                format!("remove `{second}` or `{first}`"),
            );
            return false;
        }
        true
    }

    /// Path of a field of this mapping (written only when a problem names it).
    pub fn path<'f>(&'f self, name: &'f str) -> Joined<'f, &'f str> {
        join(self.path.as_str(), name)
    }

    /// The mapping node itself.
    pub fn node(&self) -> &'n Node {
        self.node
    }
}

/// The node a field path such as `tpus[2].zone` names under `root`, or the deepest node on
/// the way when the path goes further than the tree (a missing field is reported at its
/// mapping).
pub fn node_at<'n>(root: &'n Node, path: &str) -> &'n Node {
    let mut node = root;
    for segment in path.split('.').filter(|s| !s.is_empty()) {
        let (key, indices) = match segment.find('[') {
            Some(i) => (&segment[..i], &segment[i..]),
            None => (segment, ""),
        };
        if !key.is_empty() {
            let Value::Map(pairs) = &node.value else {
                return node;
            };
            match pairs.iter().find(|(k, _)| k.as_str() == Some(key)) {
                Some((_, v)) => node = v,
                None => return node,
            }
        }
        for index in indices
            .split(['[', ']'])
            .filter_map(|i| i.parse::<usize>().ok())
        {
            match &node.value {
                Value::Seq(items) if index < items.len() => node = &items[index],
                _ => return node,
            }
        }
    }
    node
}

/// `a`, `b` and `c` as "`a`, `b`, `c`".
fn quoted(names: &[&str]) -> String {
    names
        .iter()
        .map(|n| format!("`{n}`"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Where a value is in its file (`tpus[2].zone`): anything that writes itself as a path. A
/// reader passes places along and a place is written only when a problem names it (a long
/// list read without problems formats none).
pub trait Place: std::fmt::Display + Copy {}

impl<T: std::fmt::Display + Copy> Place for T {}

/// A parent path and a field name: `tpus[2]` + `zone` = `tpus[2].zone`.
#[derive(Clone, Copy)]
pub struct Joined<'a, P> {
    parent: P,
    name: &'a str,
}

impl<P: Place> std::fmt::Display for Joined<'_, P> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let parent = self.parent.to_string();
        if parent.is_empty() {
            f.write_str(self.name)
        } else {
            write!(f, "{parent}.{}", self.name)
        }
    }
}

/// Joins a parent path and a field name: `tpus[2]` + `zone` = `tpus[2].zone`.
pub fn join<P: Place>(parent: P, name: &str) -> Joined<'_, P> {
    Joined { parent, name }
}

/// A list element's path: `tpus` + 2 = `tpus[2]`.
#[derive(Clone, Copy)]
pub struct Indexed<P> {
    parent: P,
    i: usize,
}

impl<P: Place> std::fmt::Display for Indexed<P> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}[{}]", self.parent, self.i)
    }
}

/// Path of a list element: `tpus` + 2 = `tpus[2]`.
pub fn index<P: Place>(parent: P, i: usize) -> Indexed<P> {
    Indexed { parent, i }
}

/// Converts a node to JSON (non-string keys are written as their description).
pub fn to_json(node: &Node) -> serde_json::Value {
    to_json_in(node, None)
}

/// As [`to_json`]; with the `source` the node was read from, a number that is not an
/// `i64` keeps the digits as written where JSON can hold them (`18446744073709551615`, not
/// the float it rounds to), so a message quoting it back quotes what the user wrote.
pub fn to_json_in(node: &Node, source: Option<&str>) -> serde_json::Value {
    use serde_json::Value as Json;
    let to_json = |n: &Node| to_json_in(n, source);
    match &node.value {
        Value::Null | Value::Unsupported(_) => Json::Null,
        Value::Bool(b) => Json::Bool(*b),
        Value::Int(i) => Json::from(*i),
        Value::Float(x) => source
            .map(|s| {
                let (start, end) = node.span;
                s.chars()
                    .skip(start)
                    .take(end.saturating_sub(start))
                    .collect::<String>()
            })
            .and_then(|raw| serde_json::from_str::<serde_json::Number>(raw.trim()).ok())
            .or_else(|| serde_json::Number::from_f64(*x))
            .map_or(Json::Null, Json::Number),
        Value::Str(s) => Json::String(s.clone()),
        Value::Seq(items) => Json::Array(items.iter().map(to_json).collect()),
        Value::Map(pairs) => Json::Object(
            pairs
                .iter()
                .map(|(k, v)| {
                    (
                        k.as_str().map_or_else(|| k.describe(), str::to_owned),
                        to_json(v),
                    )
                })
                .collect(),
        ),
    }
}

/// The value node of field `name` of a mapping node, if any.
pub fn field<'n>(node: &'n Node, name: &str) -> Option<&'n Node> {
    match &node.value {
        Value::Map(pairs) => pairs
            .iter()
            .find(|(k, _)| k.as_str() == Some(name))
            .map(|(_, v)| v),
        _ => None,
    }
}

impl Checker<'_> {
    /// Reads a number (integer or float) in `min..=max`.
    pub fn number(
        &mut self,
        node: &Node,
        path: impl Place,
        min: f64,
        max: f64,
        expected: &str,
    ) -> Option<f64> {
        let value = match node.value {
            Value::Int(i) => Some(i as f64),
            Value::Float(x) if x.is_finite() => Some(x),
            _ => None,
        };
        match value {
            Some(v) if (min..=max).contains(&v) => Some(v),
            Some(_) => {
                self.expected(node, path, &with_range(expected, min, max));
                None
            }
            None => {
                self.expected(node, path, expected);
                None
            }
        }
    }
}

/// `expected` with its limits, unless it states them already ("a probability from 0 to 1",
/// "a positive integer", "at most a year", "0 or more").
fn with_range(expected: &str, min: impl std::fmt::Display, max: impl std::fmt::Display) -> String {
    if expected.bytes().any(|b| b.is_ascii_digit())
        || ["positive", "at most", "or more"]
            .iter()
            .any(|w| expected.contains(w))
    {
        expected.to_owned()
    } else {
        format!("{expected} from {min} to {max}")
    }
}
