//! Carries out a deploy plan over an `Http` boundary: `Google` (HTTPS with Application
//! Default Credentials) or, in tests, a fake as strict as Google's documents. Each step is
//! idempotent: checks before creates, IAM merges that write only what is missing (with the
//! etag read), uploads only of artifacts that differ, long-running operations followed to
//! their end within a deadline fit for each (recognised by the method that returns them,
//! never guessed from the reply), their errors surfaced. Stops at the first refusal and says
//! which step. Never logs a request body (the SSH key goes in one).

use std::time::Duration;

use base64::Engine as _;
use serde_json::{Value, json};

use super::{Binding, Reply, Request, Step};
use crate::store::StateStore;

/// One HTTP exchange.
pub trait Http {
    /// Sends `method url` with `body` (JSON, or raw bytes with `content_type`); the status
    /// code and body, or why nothing came back.
    fn send(
        &mut self,
        method: &str,
        url: &str,
        body: Option<(&[u8], &str)>,
    ) -> Result<(u16, Vec<u8>), String>;

    /// Waits `d` before an operation is read again (a test's fake lets time pass instead).
    fn wait(&mut self, d: Duration) {
        std::thread::sleep(d);
    }
}

/// Google's APIs over HTTPS with Application Default Credentials.
pub struct Google {
    rt: tokio::runtime::Runtime,
    http: reqwest::Client,
    auth: Option<std::sync::Arc<dyn gcp_auth::TokenProvider>>,
}

impl Google {
    /// Connects (credentials are looked up now, so a missing one fails here).
    pub fn connect() -> Result<Google, String> {
        Google::to(crate::gcp::http::Endpoint {
            base: String::new(),
            emulator: false,
        })
    }

    /// The same client without credentials (emulators, tests).
    pub fn without_credentials() -> Result<Google, String> {
        Google::to(crate::gcp::http::Endpoint::emulator("http://127.0.0.1"))
    }

    fn to(endpoint: crate::gcp::http::Endpoint) -> Result<Google, String> {
        let (rt, http, auth) = crate::gcp::http::connect(&endpoint, Duration::from_secs(120))
            .map_err(|e| e.to_string())?;
        Ok(Google { rt, http, auth })
    }
}

impl Http for Google {
    fn send(
        &mut self,
        method: &str,
        url: &str,
        body: Option<(&[u8], &str)>,
    ) -> Result<(u16, Vec<u8>), String> {
        let method = reqwest::Method::from_bytes(method.as_bytes()).map_err(|e| e.to_string())?;
        let mut request = self.http.request(method, url);
        if let Some((bytes, content_type)) = body {
            request = request
                .header(reqwest::header::CONTENT_TYPE, content_type)
                .body(bytes.to_vec());
        }
        let reply = self
            .rt
            .block_on(crate::gcp::http::exchange(request, self.auth.as_ref()))
            .map_err(|e| e.to_string())?;
        Ok((reply.code, reply.body.to_vec()))
    }
}

/// An SSH key pair: (private, public), OpenSSH formats.
pub type KeyPair = (Vec<u8>, Vec<u8>);

/// What the plan's uploads and the secret need, made by the caller.
pub struct Materials {
    /// The agent binary.
    pub agent: Vec<u8>,
    /// The fleet file's bytes.
    pub deployment: Vec<u8>,
    /// Makes the controller's SSH key pair, (private, public) (only called when the secret
    /// has no version).
    pub keygen: Box<dyn FnMut() -> Result<KeyPair, String>>,
    /// The public key made by this deploy, for `artifacts/ssh-key.pub` (filled by `apply`).
    pub public_key: Option<Vec<u8>>,
}

fn json_body(v: &Value) -> Vec<u8> {
    serde_json::to_vec(v).expect("a JSON value serialises")
}

fn parse(bytes: &[u8]) -> Value {
    serde_json::from_slice(bytes).unwrap_or(Value::Null)
}

fn refused(what: &str, method: &str, url: &str, code: u16, body: &[u8]) -> String {
    let message = parse(body)["error"]["message"]
        .as_str()
        .map(str::to_owned)
        .unwrap_or_else(|| String::from_utf8_lossy(body).chars().take(300).collect());
    format!("{what}: {method} {url} → {code}: {message}")
}

/// Sends `r` (its JSON body), following the long-running operation it returns (if its
/// method returns one) to its end; the reply, or the finished operation.
fn send(
    http: &mut dyn Http,
    what: &str,
    r: &Request,
    body: Option<&Value>,
) -> Result<Value, String> {
    let bytes = body.or(r.body.as_ref()).map(json_body);
    let (code, reply) = http.send(
        r.method,
        &r.url,
        bytes.as_deref().map(|b| (b, "application/json")),
    )?;
    if !(200..300).contains(&code) {
        return Err(refused(what, r.method, &r.url, code, &reply));
    }
    let reply = parse(&reply);
    type PollUrl = fn(&str, &str) -> Option<String>;
    let (deadline, at, state): (u64, PollUrl, fn(&Value) -> OpState) = match r.reply {
        Reply::Resource | Reply::Started => return Ok(reply),
        Reply::Operation { deadline_secs } => (deadline_secs, poll_url, operation_state),
        Reply::ComputeOperation { deadline_secs } => {
            (deadline_secs, compute_poll_url, compute_operation_state)
        }
    };
    follow(
        http,
        what,
        reply,
        Duration::from_secs(deadline),
        &|op| at(&r.url, op["name"].as_str()?),
        &state,
    )
}

/// Where a `google.longrunning.Operation` named `name` is read: `/VERSION/<name>` of the
/// API that returned it (`https://run.googleapis.com/v2/projects/…/operations/…`).
fn poll_url(url: &str, name: &str) -> Option<String> {
    let base: Vec<&str> = url.splitn(5, '/').take(4).collect();
    (base.len() == 4 && !name.is_empty() && !name.contains("..") && !name.contains('?'))
        .then(|| format!("{}/{name}", base.join("/")))
}

/// Where a Compute Engine global operation is read (`globalOperations.get`): next to the
/// collection it was returned from (`…/projects/P/global/operations/<name>`).
fn compute_poll_url(url: &str, name: &str) -> Option<String> {
    let global = url.find("/global/")? + "/global/".len();
    let plain = !name.is_empty()
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
    plain.then(|| format!("{}operations/{name}", &url[..global]))
}

/// Where an operation stands.
enum OpState {
    Running,
    Done,
    Failed(String),
}

/// `google.longrunning.Operation`: `done` (omitted while false), then `error` or
/// `response`; a finished Cloud Build says how the build ended in `response.status`.
fn operation_state(op: &Value) -> OpState {
    if op["done"] != json!(true) {
        return OpState::Running;
    }
    if let Some(e) = op.get("error") {
        return OpState::Failed(format!(
            "{} {}",
            e["status"]
                .as_str()
                .or(e["code"].as_i64().map(grpc_status))
                .unwrap_or("UNKNOWN"),
            e["message"].as_str().unwrap_or_default()
        ));
    }
    match op["response"]["status"].as_str() {
        Some(status)
            if op["response"]["@type"]
                .as_str()
                .is_some_and(|t| t.ends_with(".Build"))
                && status != "SUCCESS" =>
        {
            OpState::Failed(format!(
                "the build ended {status}: {}",
                op["response"]["statusDetail"].as_str().unwrap_or_default()
            ))
        }
        _ => OpState::Done,
    }
}

/// A Compute Engine `Operation`: `status` until `DONE`, then `error.errors[]`.
fn compute_operation_state(op: &Value) -> OpState {
    if op["status"] != "DONE" {
        return OpState::Running;
    }
    match op["error"]["errors"].as_array() {
        Some(errors) if !errors.is_empty() => OpState::Failed(
            errors
                .iter()
                .map(|e| {
                    format!(
                        "{}: {}",
                        e["code"].as_str().unwrap_or("ERROR"),
                        e["message"].as_str().unwrap_or_default()
                    )
                })
                .collect::<Vec<_>>()
                .join("; "),
        ),
        _ => OpState::Done,
    }
}

/// The name of a `google.rpc.Code`.
fn grpc_status(code: i64) -> &'static str {
    match code {
        1 => "CANCELLED",
        3 => "INVALID_ARGUMENT",
        4 => "DEADLINE_EXCEEDED",
        5 => "NOT_FOUND",
        6 => "ALREADY_EXISTS",
        7 => "PERMISSION_DENIED",
        8 => "RESOURCE_EXHAUSTED",
        9 => "FAILED_PRECONDITION",
        10 => "ABORTED",
        13 => "INTERNAL",
        14 => "UNAVAILABLE",
        16 => "UNAUTHENTICATED",
        _ => "UNKNOWN",
    }
}

/// Reads the operation `reply` again until it is done, waiting 1 s, then twice as long each
/// time up to 15 s, for at most `deadline`.
fn follow(
    http: &mut dyn Http,
    what: &str,
    mut reply: Value,
    deadline: Duration,
    at: &dyn Fn(&Value) -> Option<String>,
    state: &dyn Fn(&Value) -> OpState,
) -> Result<Value, String> {
    let url = at(&reply).ok_or_else(|| {
        format!(
            "{what}: the reply is not the operation its method returns: {}",
            reply.to_string().chars().take(300).collect::<String>()
        )
    })?;
    let (mut waited, mut pause) = (Duration::ZERO, Duration::from_secs(1));
    loop {
        match state(&reply) {
            OpState::Done => return Ok(reply),
            OpState::Failed(why) => {
                return Err(format!("{what}: the operation {url} failed: {why}"));
            }
            OpState::Running if waited >= deadline => {
                return Err(format!(
                    "{what}: the operation {url} was not done after {} s (it may still finish: deploy again to carry on)",
                    waited.as_secs()
                ));
            }
            OpState::Running => {}
        }
        http.wait(pause);
        waited += pause;
        pause = (pause * 2).min(Duration::from_secs(15));
        let (code, body) = http.send("GET", &url, None)?;
        if !(200..300).contains(&code) {
            return Err(refused(what, "GET", &url, code, &body));
        }
        reply = parse(&body);
    }
}

/// Adds the missing `bindings` to `policy`; true when it changed.
pub fn merge(policy: &mut Value, bindings: &[Binding]) -> bool {
    let mut changed = false;
    if !policy["bindings"].is_array() {
        policy["bindings"] = json!([]);
    }
    for b in bindings {
        let list = policy["bindings"].as_array_mut().expect("made an array");
        let same = |x: &Value| {
            x["role"] == b.role.as_str()
                && x.get("condition").map(|c| &c["expression"])
                    == b.condition.as_ref().map(|c| &c["expression"])
        };
        match list.iter_mut().find(|x| same(x)) {
            Some(existing) => {
                let members = existing["members"].as_array_mut();
                match members {
                    Some(m) if m.iter().any(|x| x == b.member.as_str()) => {}
                    Some(m) => {
                        m.push(json!(b.member));
                        changed = true;
                    }
                    None => {
                        existing["members"] = json!([b.member]);
                        changed = true;
                    }
                }
            }
            None => {
                let mut new = json!({"role": b.role, "members": [b.member]});
                if let Some(c) = &b.condition {
                    new["condition"] = c.clone();
                }
                list.push(new);
                changed = true;
            }
        }
    }
    if changed && bindings.iter().any(|b| b.condition.is_some()) {
        // Conditional bindings need policy version 3.
        policy["version"] = json!(3);
    }
    changed
}

/// Carries out `steps`; `log` hears one line per step (what was found or done).
pub fn apply(
    steps: &[Step],
    http: &mut dyn Http,
    materials: &mut Materials,
    store: &mut dyn StateStore,
    now: crate::engine::Timestamp,
    log: &mut dyn FnMut(String),
) -> Result<(), String> {
    let agent_sha = {
        use sha2::Digest;
        hex::encode(sha2::Sha256::digest(&materials.agent))
    };
    for step in steps {
        match step {
            Step::Ensure {
                what,
                check,
                create,
            } => {
                let (code, body) = http.send(check.method, &check.url, None)?;
                match code {
                    200..=299 => log(format!("ok      {what} (exists)")),
                    404 => {
                        let body = if create.url.ends_with(":addVersion") {
                            let (key, public) = (materials.keygen)()?;
                            materials.public_key = Some(public);
                            Some(
                                json!({"payload": {"data": base64::engine::general_purpose::STANDARD.encode(key)}}),
                            )
                        } else {
                            None
                        };
                        send(http, what, create, body.as_ref())?;
                        log(format!("created {what}"));
                    }
                    _ => return Err(refused(what, check.method, &check.url, code, &body)),
                }
            }
            Step::Grant {
                what,
                resource,
                iam,
                bindings,
            } => {
                let mut policy = send(http, what, &iam.read(resource), None)?;
                if merge(&mut policy, bindings) {
                    send(http, what, &iam.write(resource, policy), None)?;
                    log(format!("granted {what}"));
                } else {
                    log(format!("ok      {what} (granted already)"));
                }
            }
            Step::Send { what, request } => {
                send(http, what, request, None)?;
                log(format!("done    {what}"));
            }
            Step::SetEpoch { what, epoch } => {
                store
                    .set_epoch(epoch, now)
                    .map_err(|e| format!("{what}: {e}"))?;
                log(format!("done    {what}"));
            }
            Step::Upload { what, uri, source } => {
                let data: Vec<u8> = match source.as_str() {
                    "agent" => materials.agent.clone(),
                    "agent-sha256" => format!("{agent_sha}  tpu-runner\n").into_bytes(),
                    "image-context" => image_context(&materials.agent, false)?,
                    "image-context-gcloud" => image_context(&materials.agent, true)?,
                    "startup" => {
                        let (bucket, _) = crate::objects::split(uri).map_err(|e| e.to_string())?;
                        super::startup::render(bucket, &agent_sha)?.into_bytes()
                    }
                    "ssh-public-key" => match &materials.public_key {
                        Some(key) => key.clone(),
                        // Kept from the deploy that made the key.
                        None => continue,
                    },
                    _ => materials.deployment.clone(),
                };
                let (bucket, name) = crate::objects::split(uri).map_err(|e| e.to_string())?;
                let encoded = crate::gcp::storage::encode(name);
                let meta = format!(
                    "https://storage.googleapis.com/storage/v1/b/{bucket}/o/{encoded}?fields=crc32c,size"
                );
                let (code, body) = http.send("GET", &meta, None)?;
                let crc = crate::gcp::storage::crc32c_b64(&data);
                let same = code == 200 && {
                    let m = parse(&body);
                    m["crc32c"] == crc.as_str() && m["size"] == data.len().to_string().as_str()
                };
                if same {
                    log(format!("ok      {what} (unchanged)"));
                    continue;
                }
                if code != 200 && code != 404 {
                    return Err(refused(what, "GET", &meta, code, &body));
                }
                let url = format!(
                    "https://storage.googleapis.com/upload/storage/v1/b/{bucket}/o?uploadType=media&name={encoded}"
                );
                let (code, body) =
                    http.send("POST", &url, Some((&data, "application/octet-stream")))?;
                if !(200..300).contains(&code) {
                    return Err(refused(what, "POST", &url, code, &body));
                }
                log(format!("uploaded {what}"));
            }
        }
    }
    Ok(())
}

/// The controller image's build context: a Dockerfile (Debian slim with OpenSSH's client,
/// which the SSH transport runs; Google's slim Cloud SDK image when the fleet tunnels
/// through IAP, whose tunnels gcloud opens) and the binary. Deterministic (fixed
/// metadata), so an unchanged binary is not uploaded again.
fn image_context(agent: &[u8], gcloud: bool) -> Result<Vec<u8>, String> {
    let base = if gcloud {
        "FROM gcr.io/google.com/cloudsdktool/google-cloud-cli:slim\nENV CLOUDSDK_CONFIG=/tmp/gcloud\n"
    } else {
        "FROM debian:12-slim\n"
    };
    let dockerfile = format!(
        "{base}RUN apt-get update && apt-get install -y --no-install-recommends openssh-client ca-certificates && rm -rf /var/lib/apt/lists/*\nCOPY tpu-runner /usr/local/bin/tpu-runner\nUSER nobody\nENTRYPOINT [\"/usr/local/bin/tpu-runner\"]\n"
    );
    let gz = flate2::GzBuilder::new()
        .mtime(0)
        .write(Vec::new(), flate2::Compression::new(6));
    let mut tar = tar::Builder::new(gz);
    for (name, data, mode) in [
        ("Dockerfile", dockerfile.as_bytes(), 0o644),
        ("tpu-runner", agent, 0o755),
    ] {
        let mut header = tar::Header::new_gnu();
        header.set_size(data.len() as u64);
        header.set_mode(mode);
        header.set_mtime(0);
        header.set_uid(0);
        header.set_gid(0);
        tar.append_data(&mut header, name, data)
            .map_err(|e| e.to_string())?;
    }
    tar.into_inner()
        .and_then(|gz| gz.finish())
        .map_err(|e| e.to_string())
}
