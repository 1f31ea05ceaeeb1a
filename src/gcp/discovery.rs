//! Google's API discovery documents (the machine-readable descriptions Google's client
//! libraries are generated from) read as a rule book: which method a request is (its HTTP
//! method and path against each method's templates), whether its query parameters and JSON
//! body are ones the method declares (names, JSON types, enum values; an unknown name is
//! refused as Google's JSON transcoding refuses it), and whether a reply fits the method's
//! response schema as Google writes proto-JSON (only defined fields, int64 as strings,
//! RFC 3339 times, existing enum values, defaults omitted, `Any` values typed). The emulator
//! uses it to be as strict as Google; the conformance tests check every client's requests
//! with it. It knows no one API, does no IO and never panics on any document or input.

use std::collections::BTreeMap;

use serde_json::{Map, Value};

/// One API's discovery document, indexed by method.
#[derive(Debug)]
pub struct Api {
    /// `tpu`, `storage` …
    pub name: String,
    /// `v2` …
    pub version: String,
    /// `https://tpu.googleapis.com/`.
    pub root_url: String,
    schemas: Map<String, Value>,
    /// Parameters every method takes (`alt`, `fields`, `key` …).
    global: Map<String, Value>,
    methods: Vec<Method>,
}

/// One method of an API.
#[derive(Clone, Debug)]
pub struct Method {
    /// `tpu.projects.locations.nodes.delete`.
    pub id: String,
    /// `GET`, `POST` …
    pub http_method: String,
    /// Path templates from the host's root (`/v2/projects/{projectsId}/…`), the flat one
    /// first; `{+x}` spans segments.
    templates: Vec<String>,
    /// Patterns of the `{+x}` path parameters.
    patterns: BTreeMap<String, String>,
    /// Query parameters the method declares, by name.
    query: Map<String, Value>,
    /// The request body's schema id, if it takes one.
    pub request: Option<String>,
    /// The reply's schema id (`None`: an empty reply).
    pub response: Option<String>,
    /// Whether the method takes a media upload (`/upload/…`).
    pub media_upload: bool,
}

/// Whether a JSON value is what a client sends (Google's parser: int64 as a string or a
/// number, unknown names refused) or what Google replies (its printer: int64 as strings,
/// defaults omitted).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Direction {
    /// A request body.
    Request,
    /// A reply body.
    Reply,
}

impl Api {
    /// Reads a discovery document.
    pub fn parse(text: &str) -> Result<Api, String> {
        let doc: Value =
            serde_json::from_str(text).map_err(|e| format!("not a discovery document: {e}"))?;
        let text = |k: &str| doc[k].as_str().unwrap_or_default().to_owned();
        let (root_url, service_path) = (text("rootUrl"), text("servicePath"));
        if root_url.is_empty() || doc["schemas"].as_object().is_none() {
            return Err("not a discovery document: no rootUrl or schemas".into());
        }
        let mut methods = Vec::new();
        collect_methods(&doc, &service_path, &mut methods);
        Ok(Api {
            name: text("name"),
            version: text("version"),
            root_url,
            schemas: doc["schemas"].as_object().cloned().unwrap_or_default(),
            global: doc["parameters"].as_object().cloned().unwrap_or_default(),
            methods,
        })
    }

    /// Adds a URL binding of `method_id` the document does not carry (`template` from the
    /// host's root, `{x}` one segment): the discovery format keeps one binding per method and
    /// drops a method's additional ones, which Google's front end serves all the same.
    /// False if there is no such method.
    pub fn add_binding(&mut self, method_id: &str, template: &str) -> bool {
        match self.methods.iter_mut().find(|m| m.id == method_id) {
            Some(m) => {
                m.templates.push(template.to_owned());
                true
            }
            None => false,
        }
    }

    /// The host it is served at (`tpu.googleapis.com`).
    pub fn host(&self) -> &str {
        self.root_url
            .trim_start_matches("https://")
            .trim_end_matches('/')
    }

    /// A method by id.
    pub fn method(&self, id: &str) -> Option<&Method> {
        self.methods.iter().find(|m| m.id == id)
    }

    /// Every method.
    pub fn methods(&self) -> &[Method] {
        &self.methods
    }

    /// The method `http_method path` calls (`path` from the host's root, without the
    /// query), as Google's front end routes it: a custom verb (`:getGuestAttributes`) is
    /// part of the match; an upload path matches a method's media upload path.
    pub fn resolve(&self, http_method: &str, path: &str) -> Option<&Method> {
        let upload = path.starts_with("/upload/");
        // The path is split once, whatever its length, then held to each template.
        let (base, verb) = split_verb(path);
        let segments: Vec<&str> = base.split('/').collect();
        self.methods.iter().find(|m| {
            m.http_method.eq_ignore_ascii_case(http_method)
                && m.media_upload == upload
                && m.templates
                    .iter()
                    .any(|t| matches(t, &segments, verb, &m.patterns))
        })
    }

    /// Checks a request: the method it calls, every query parameter declared with a value of
    /// its type, the body against the request schema (or no body where none is taken).
    /// `query` is decoded (name, value) pairs. The method, or what Google would refuse.
    pub fn check_request(
        &self,
        http_method: &str,
        path: &str,
        query: &[(String, String)],
        body: Option<&Value>,
    ) -> Result<&Method, Vec<String>> {
        let method = self.resolve(http_method, path).ok_or_else(|| {
            vec![format!(
                "{http_method} {path}: no method of {} {} has this path",
                self.name, self.version
            )]
        })?;
        let mut out = self.check_query(method, query);
        match (&method.request, body) {
            (Some(schema), Some(body)) => {
                self.check_value(schema, body, Direction::Request, &mut out)
            }
            (None, Some(body)) if !is_empty_object(body) => out.push(format!(
                "{}: takes no request body, but one was sent",
                method.id
            )),
            _ => {}
        }
        if out.is_empty() { Ok(method) } else { Err(out) }
    }

    /// The query parameters of a call of `method`: each declared (by the method or for every
    /// method), of its type, repeated only when declared repeated.
    pub fn check_query(&self, method: &Method, query: &[(String, String)]) -> Vec<String> {
        let mut out = Vec::new();
        let mut seen = BTreeMap::<&str, usize>::new();
        for (name, value) in query {
            let Some(param) = method.query.get(name).or_else(|| self.global.get(name)) else {
                out.push(format!(
                    "Invalid JSON payload received. Unknown name \"{name}\": Cannot bind query parameter. Field '{name}' could not be found in request message."
                ));
                continue;
            };
            *seen.entry(name).or_default() += 1;
            if seen[name.as_str()] == 2 && param["repeated"] != Value::Bool(true) {
                out.push(format!("query parameter {name} given twice"));
            }
            if let Some(problem) = scalar_text_problem(param, value) {
                out.push(format!(
                    "Invalid value at '{name}' ({problem}), \"{value}\""
                ));
            }
        }
        out
    }

    /// A reply of `method`: what its response schema allows as Google writes it. A
    /// server-streaming method (Firestore's `batchGet`, `runQuery`) replies over REST with a
    /// JSON list of its response messages, each checked.
    pub fn check_reply(&self, method: &Method, body: &Value) -> Vec<String> {
        let mut out = Vec::new();
        match (&method.response, body) {
            (Some(schema), Value::Array(messages)) => {
                for m in messages {
                    self.check_value(schema, m, Direction::Reply, &mut out);
                }
            }
            (Some(schema), _) => self.check_value(schema, body, Direction::Reply, &mut out),
            (None, _) if !is_empty_object(body) => {
                out.push(format!("{}: replies with no body, but one came", method.id))
            }
            (None, _) => {}
        }
        out
    }

    /// Checks `value` against the schema `id`, adding what does not fit to `out`.
    pub fn check_value(
        &self,
        id: &str,
        value: &Value,
        direction: Direction,
        out: &mut Vec<String>,
    ) {
        let schema = Value::Object(
            [("$ref".to_owned(), Value::String(id.to_owned()))]
                .into_iter()
                .collect(),
        );
        Check {
            api: self,
            direction,
            out,
        }
        .value(&schema, value, "", 0);
    }
}

fn collect_methods(resource: &Value, service_path: &str, out: &mut Vec<Method>) {
    for m in resource["methods"]
        .as_object()
        .into_iter()
        .flat_map(|m| m.values())
    {
        let text = |k: &str| m[k].as_str().map(str::to_owned);
        let params = m["parameters"].as_object().cloned().unwrap_or_default();
        let mut templates = Vec::new();
        let upload = m["supportsMediaUpload"] == Value::Bool(true);
        if let Some(simple) = m["mediaUpload"]["protocols"]["simple"]["path"].as_str() {
            templates.push(simple.to_owned());
        } else {
            for key in ["flatPath", "path"] {
                if let Some(p) = text(key) {
                    let full = format!("/{service_path}{p}");
                    if !templates.contains(&full) {
                        templates.push(full);
                    }
                }
            }
        }
        out.push(Method {
            id: text("id").unwrap_or_default(),
            http_method: text("httpMethod").unwrap_or_default(),
            templates,
            patterns: params
                .iter()
                .filter_map(|(k, p)| Some((k.clone(), p["pattern"].as_str()?.to_owned())))
                .collect(),
            query: params
                .into_iter()
                .filter(|(_, p)| p["location"] == "query")
                .collect(),
            request: m["request"]["$ref"].as_str().map(str::to_owned),
            response: m["response"]["$ref"].as_str().map(str::to_owned),
            media_upload: upload,
        });
    }
    for r in resource["resources"]
        .as_object()
        .into_iter()
        .flat_map(|r| r.values())
    {
        collect_methods(r, service_path, out);
    }
}

fn is_empty_object(v: &Value) -> bool {
    v.as_object().is_some_and(Map::is_empty)
}

/// Whether `path` fits `template`: literal segments equal, `{x}` one non-empty segment,
/// `{+x}` the rest up to a trailing literal or verb (checked against the parameter's
/// pattern), a `:verb` on the last segment equal.
fn matches(
    template: &str,
    p: &[&str],
    path_verb: &str,
    patterns: &BTreeMap<String, String>,
) -> bool {
    let (template, verb) = split_verb(template);
    if verb != path_verb {
        return false;
    }
    let t: Vec<&str> = template.split('/').collect();
    if let Some(plus) = t.iter().position(|s| s.starts_with("{+")) {
        let tail = t.len() - plus - 1;
        if p.len() < t.len() || !segments_fit(&t[..plus], &p[..plus]) {
            return false;
        }
        if !segments_fit(&t[plus + 1..], &p[p.len() - tail..]) {
            return false;
        }
        let name = t[plus].trim_start_matches("{+").trim_end_matches('}');
        let value = p[plus..p.len() - tail].join("/");
        return !value.is_empty()
            && patterns
                .get(name)
                .is_none_or(|pattern| pattern_fits(pattern, &value));
    }
    t.len() == p.len() && segments_fit(&t, p)
}

fn segments_fit(template: &[&str], path: &[&str]) -> bool {
    template.iter().zip(path).all(|(t, p)| {
        if t.starts_with('{') && t.ends_with('}') {
            !p.is_empty()
        } else {
            t == p
        }
    })
}

/// `a/b:verb` → (`a/b`, `verb`); the verb is after a `:` in the last segment.
fn split_verb(path: &str) -> (&str, &str) {
    let last = path.rfind('/').map_or(0, |i| i + 1);
    match path[last..].rfind(':') {
        // `{x}:verb`, `documents:commit`; not a colon inside a template variable.
        Some(i) if !path[last + i..].contains('}') => (&path[..last + i], &path[last + i + 1..]),
        _ => (path, ""),
    }
}

/// The patterns discovery documents give path parameters: `^`, `$`, literal text,
/// `[^/]+` and `.*` (all they use). Anything else is taken as fitting.
fn pattern_fits(pattern: &str, value: &str) -> bool {
    fn fit(p: &str, v: &str) -> bool {
        if p.is_empty() || p == "$" {
            return v.is_empty();
        }
        if let Some(rest) = p.strip_prefix("[^/]+") {
            let end = v.find('/').unwrap_or(v.len());
            return (1..=end).any(|n| fit(rest, &v[n..]));
        }
        if let Some(rest) = p.strip_prefix(".*") {
            return (0..=v.len())
                .filter(|&n| v.is_char_boundary(n))
                .any(|n| fit(rest, &v[n..]));
        }
        let c = p.chars().next().expect("not empty");
        if matches!(c, '[' | '(' | '\\' | '+' | '?' | '*' | '|') {
            return true;
        }
        v.starts_with(c) && fit(&p[c.len_utf8()..], &v[c.len_utf8()..])
    }
    fit(pattern.strip_prefix('^').unwrap_or(pattern), value)
}

/// What is wrong with a query parameter's text value for its declared type.
fn scalar_text_problem(param: &Value, value: &str) -> Option<String> {
    if let Some(values) = param["enum"].as_array()
        && !values.iter().any(|v| v == value)
    {
        return Some("TYPE_ENUM".into());
    }
    let ok = match (param["type"].as_str(), param["format"].as_str()) {
        (Some("boolean"), _) => matches!(value, "true" | "false"),
        (Some("integer"), _) | (Some("string"), Some("int64" | "int32")) => {
            value.parse::<i64>().is_ok()
        }
        (Some("string"), Some("uint64" | "uint32")) => value.parse::<u64>().is_ok(),
        (Some("number"), _) => value.parse::<f64>().is_ok(),
        _ => true,
    };
    (!ok).then(|| {
        format!(
            "TYPE_{}",
            param["type"].as_str().unwrap_or("?").to_uppercase()
        )
    })
}

/// One walk over a value.
struct Check<'a> {
    api: &'a Api,
    direction: Direction,
    out: &'a mut Vec<String>,
}

/// Schemas nest deeper than this only by recursion (`Status` in `Status`…): a value that
/// deep is refused instead of walked.
const DEPTH: usize = 64;

impl Check<'_> {
    fn fail(&mut self, path: &str, text: String) {
        let at = if path.is_empty() { "the body" } else { path };
        self.out.push(format!("at '{at}': {text}"));
    }

    fn value(&mut self, schema: &Value, v: &Value, path: &str, depth: usize) {
        if depth > DEPTH {
            self.fail(path, "nested too deeply".into());
            return;
        }
        if let Some(id) = schema["$ref"].as_str() {
            match self.api.schemas.get(id) {
                Some(s) => self.value(&s.clone(), v, path, depth + 1),
                None => self.fail(path, format!("schema {id} is not in the document")),
            }
            return;
        }
        if v.is_null() {
            if self.direction == Direction::Reply {
                self.fail(path, "null (Google omits unset fields)".into());
            }
            return;
        }
        let reply = self.direction == Direction::Reply;
        match schema["type"].as_str() {
            Some("any") | None => {}
            Some("object") => self.object(schema, v, path, depth),
            Some("array") => match v.as_array() {
                Some(items) => {
                    if reply && items.is_empty() {
                        self.fail(path, "an empty list (Google omits it)".into());
                    }
                    for (i, item) in items.iter().enumerate() {
                        self.value(&schema["items"], item, &format!("{path}[{i}]"), depth + 1);
                    }
                }
                None => self.fail(path, format!("expected a list, got {v}")),
            },
            Some("boolean") => match v {
                Value::Bool(false) if reply => {
                    self.fail(path, "false (Google omits defaults)".into())
                }
                Value::Bool(_) => {}
                _ => self.fail(path, format!("expected a boolean (TYPE_BOOL), got {v}")),
            },
            Some("integer") | Some("number") => self.number(schema, v, path),
            Some("string") => self.string(schema, v, path),
            Some(other) => self.fail(path, format!("the document's type {other:?} is unknown")),
        }
    }

    fn object(&mut self, schema: &Value, v: &Value, path: &str, depth: usize) {
        let Some(fields) = v.as_object() else {
            self.fail(path, format!("expected an object, got {v}"));
            return;
        };
        let join = |k: &str| {
            if path.is_empty() {
                k.to_owned()
            } else {
                format!("{path}.{k}")
            }
        };
        if let Some(properties) = schema["properties"].as_object() {
            for (k, x) in fields {
                // Google's parser takes a field's proto name (snake_case) as well.
                let property = properties.get(k).or_else(|| match self.direction {
                    Direction::Request => properties.get(&camel(k)),
                    Direction::Reply => None,
                });
                match property {
                    Some(p) => self.value(p, x, &join(k), depth + 1),
                    None => {
                        let at = if path.is_empty() {
                            String::new()
                        } else {
                            format!(" at '{path}'")
                        };
                        self.out.push(format!(
                            "Invalid JSON payload received. Unknown name \"{k}\"{at}: Cannot find field."
                        ));
                    }
                }
            }
            return;
        }
        let additional = &schema["additionalProperties"];
        if additional.is_object() {
            // `google.protobuf.Any`: the document says its values carry `@type`.
            let any = additional["description"]
                .as_str()
                .is_some_and(|d| d.contains("@type"));
            if any && !fields.get("@type").is_some_and(Value::is_string) {
                self.fail(path, "an Any without its @type".into());
            }
            if self.direction == Direction::Reply && fields.is_empty() && !any {
                self.fail(path, "an empty map (Google omits it)".into());
            }
            for (k, x) in fields {
                if any && k == "@type" {
                    continue;
                }
                self.value(additional, x, &join(k), depth + 1);
            }
        }
    }

    fn number(&mut self, schema: &Value, v: &Value, path: &str) {
        let reply = self.direction == Direction::Reply;
        let format = schema["format"].as_str().unwrap_or("");
        let fits = match v {
            Value::Number(n) => {
                if schema["type"] == "integer" {
                    match format {
                        "uint32" => n.as_u64().is_some_and(|x| x <= u64::from(u32::MAX)),
                        _ => n.as_i64().is_some_and(|x| i32::try_from(x).is_ok()),
                    }
                } else {
                    true
                }
            }
            // Google's parser takes numbers written as strings too; its printer never.
            Value::String(s) if !reply => s.parse::<f64>().is_ok(),
            _ => false,
        };
        if !fits {
            self.fail(
                path,
                format!(
                    "expected a {} number, got {v}",
                    if format.is_empty() { "JSON" } else { format }
                ),
            );
        } else if reply && v.as_f64() == Some(0.0) {
            self.fail(path, "0 (Google omits defaults)".into());
        }
    }

    fn string(&mut self, schema: &Value, v: &Value, path: &str) {
        let reply = self.direction == Direction::Reply;
        let format = schema["format"].as_str().unwrap_or("");
        let text = match v {
            Value::String(s) => s.as_str(),
            // 64-bit integers: Google's printer writes strings; its parser takes numbers.
            Value::Number(n)
                if !reply
                    && ((format == "int64" && n.is_i64())
                        || (format == "uint64" && n.is_u64())) =>
            {
                return;
            }
            _ => {
                self.fail(
                    path,
                    format!(
                        "expected a string ({}), got {v}",
                        if format.is_empty() {
                            "TYPE_STRING"
                        } else {
                            format
                        }
                    ),
                );
                return;
            }
        };
        if reply && text.is_empty() {
            self.fail(path, "an empty string (Google omits defaults)".into());
            return;
        }
        if let Some(values) = schema["enum"].as_array()
            && !values.iter().any(|x| x == text)
        {
            self.fail(path, format!("{text:?} is not a value of the enum"));
            return;
        }
        let fits = match format {
            "int64" => text.parse::<i64>().is_ok(),
            "uint64" => text.parse::<u64>().is_ok(),
            "google-datetime" | "date-time" => text.parse::<jiff::Timestamp>().is_ok(),
            "google-duration" => text
                .strip_suffix('s')
                .is_some_and(|n| n.parse::<f64>().is_ok_and(f64::is_finite)),
            "byte" => {
                use base64::Engine as _;
                let t = text.trim_end_matches('=');
                base64::engine::general_purpose::STANDARD_NO_PAD
                    .decode(t)
                    .is_ok()
                    || base64::engine::general_purpose::URL_SAFE_NO_PAD
                        .decode(t)
                        .is_ok()
            }
            _ => true,
        };
        if !fits {
            self.fail(path, format!("{text:?} is not a {format}"));
        } else if reply && format == "int64" && text == "0" {
            self.fail(path, "\"0\" (Google omits defaults)".into());
        }
    }
}

/// `snake_case` → `snakeCase`.
fn camel(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    let mut upper = false;
    for c in name.chars() {
        if c == '_' {
            upper = true;
        } else if upper {
            out.extend(c.to_uppercase());
            upper = false;
        } else {
            out.push(c);
        }
    }
    out
}

/// Decoded `(name, value)` pairs of a URL's query (`a=1&b=x%20y`).
pub fn query_pairs(query: &str) -> Vec<(String, String)> {
    reqwest::Url::parse(&format!("http://h/?{query}"))
        .map(|u| {
            u.query_pairs()
                .map(|(k, v)| (k.into_owned(), v.into_owned()))
                .collect()
        })
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `matches` for a whole path.
    fn fits(template: &str, path: &str, patterns: &BTreeMap<String, String>) -> bool {
        let (base, verb) = split_verb(path);
        let segments: Vec<&str> = base.split('/').collect();
        matches(template, &segments, verb, patterns)
    }

    #[test]
    fn templates_match_as_google_routes_them() {
        let none = BTreeMap::new();
        let node = "/v2/projects/{projectsId}/locations/{locationsId}/nodes/{nodesId}";
        assert!(fits(node, "/v2/projects/p/locations/z/nodes/n", &none));
        assert!(!fits(
            node,
            "/v2/projects/p/locations/z/nodes/n:getGuestAttributes",
            &none
        ));
        assert!(fits(
            &format!("{node}:getGuestAttributes"),
            "/v2/projects/p/locations/z/nodes/n:getGuestAttributes",
            &none
        ));
        assert!(!fits(node, "/v2/projects/p/locations/z/nodes", &none));
        let patterns = BTreeMap::from([("name".to_owned(), "^operations/.*$".to_owned())]);
        assert!(fits("/v1/{+name}", "/v1/operations/build/p/123", &patterns));
        assert!(!fits("/v1/{+name}", "/v1/projects/p/builds", &patterns));
        assert!(fits(
            "/v1/projects/{projectsId}/services:batchEnable",
            "/v1/projects/p/services:batchEnable",
            &none
        ));
    }

    #[test]
    fn patterns_of_the_documents() {
        assert!(pattern_fits(
            "^projects/[^/]+/locations/[^/]+/operations/[^/]+$",
            "projects/p/locations/l/operations/o"
        ));
        assert!(!pattern_fits(
            "^projects/[^/]+/locations/[^/]+/operations/[^/]+$",
            "projects/p/locations/l/operations/o/x"
        ));
        assert!(pattern_fits("^operations/.*$", "operations/a/b"));
        assert!(!pattern_fits("^operations/.*$", "projects/a"));
    }

    #[test]
    fn snake_case_is_read_as_google_reads_it() {
        assert_eq!(camel("query_path"), "queryPath");
        assert_eq!(camel("worker_ids"), "workerIds");
    }
}
