//! Carries out a deploy plan over an `Http` boundary: `Google` (HTTPS with Application
//! Default Credentials) or, in tests, recorded fixtures. Each step is idempotent: checks
//! before creates, IAM merges that write only what is missing (with the etag read), uploads
//! only of artifacts that differ, operations followed to their end. Stops at the first
//! refusal and says which step. Never logs a request body (the SSH key goes in one).

use std::time::Duration;

use base64::Engine as _;
use serde_json::{Value, json};

use super::{Binding, Request, Step};
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

/// Sends `r` (its JSON body), following a long-running operation it returns to its end.
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
    follow(http, what, &r.url, reply)
}

/// Polls an operation (`{name, done}`) until it is done; other replies are returned as is.
fn follow(http: &mut dyn Http, what: &str, url: &str, mut reply: Value) -> Result<Value, String> {
    let is_operation = |v: &Value| v.get("name").is_some() && v.get("done").is_some();
    if !is_operation(&reply) {
        return Ok(reply);
    }
    // `https://host/v1/...` → `https://host/v1/<operation name>`.
    let base: String = url.splitn(5, '/').take(4).collect::<Vec<_>>().join("/");
    for _ in 0..120 {
        if reply["done"] == json!(true) {
            if let Some(error) = reply.get("error") {
                return Err(format!("{what}: the operation failed: {error}"));
            }
            return Ok(reply);
        }
        std::thread::sleep(Duration::from_millis(500));
        let name = reply["name"].as_str().unwrap_or_default().to_owned();
        let poll = format!("{base}/{name}");
        let (code, body) = http.send("GET", &poll, None)?;
        if !(200..300).contains(&code) {
            return Err(refused(what, "GET", &poll, code, &body));
        }
        reply = parse(&body);
    }
    Err(format!(
        "{what}: the operation did not finish within a minute"
    ))
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
                storage,
                bindings,
            } => {
                let (get, set_method, set_url) = if *storage {
                    (
                        Request {
                            method: "GET",
                            url: format!("{resource}/iam?optionsRequestedPolicyVersion=3"),
                            body: None,
                        },
                        "PUT",
                        format!("{resource}/iam"),
                    )
                } else {
                    (
                        Request {
                            method: "POST",
                            url: format!("{resource}:getIamPolicy"),
                            body: Some(json!({"options": {"requestedPolicyVersion": 3}})),
                        },
                        "POST",
                        format!("{resource}:setIamPolicy"),
                    )
                };
                let mut policy = send(http, what, &get, None)?;
                if merge(&mut policy, bindings) {
                    let body = if *storage {
                        policy
                    } else {
                        json!({"policy": policy})
                    };
                    let set = Request {
                        method: set_method,
                        url: set_url,
                        body: Some(body),
                    };
                    send(http, what, &set, None)?;
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
