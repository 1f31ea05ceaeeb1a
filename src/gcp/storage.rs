//! Cloud Storage JSON API client: read an object (whole, bounded, or streamed to a file),
//! write one (multipart upload, optionally create-only with `ifGenerationMatch=0`, with its
//! CRC32C), list a prefix (all pages, with each object's generation, size and update time)
//! and delete. `STORAGE_EMULATOR_HOST` points it at an emulator (no credentials); otherwise
//! Application Default Credentials (on a TPU VM: the metadata server). Bounded retries with
//! backoff on 429, 5xx and lost connections. Blocking API over a private runtime; knows
//! nothing of jobs or the engine.

use std::io::Write;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use serde::Deserialize;
use serde_json::json;

use super::http::{
    self, ApiError, Endpoint, Reply, RetryPolicy, exchange, malformed, retryable, transport,
};

/// `STORAGE_EMULATOR_HOST` when set (an emulator, no credentials), else production.
pub fn endpoint_from_env() -> Endpoint {
    Endpoint::from_env("STORAGE_EMULATOR_HOST", "https://storage.googleapis.com")
}

/// An object as a listing or an upload describes it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct ObjectMeta {
    /// Object name (the path inside the bucket).
    pub name: String,
    /// Generation (int64 as a string).
    pub generation: String,
    /// Size in bytes (int64 as a string).
    pub size: String,
    /// RFC 3339 time of the last write.
    pub updated: String,
    /// Base64 of the big-endian CRC32C.
    pub crc32c: String,
}

/// The client.
pub struct Storage {
    rt: tokio::runtime::Runtime,
    http: reqwest::Client,
    auth: Option<Arc<dyn gcp_auth::TokenProvider>>,
    endpoint: Endpoint,
    policy: RetryPolicy,
}

impl std::fmt::Debug for Storage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Storage({})", self.endpoint.base)
    }
}

/// The per-call timeout (large objects stream within it).
const CALL_TIMEOUT: Duration = Duration::from_secs(300);

/// Percent-encodes an object name for a URL path segment.
pub fn encode(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    for b in name.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// Base64 (standard, padded) of the big-endian CRC32C of `data`, as GCS reports it.
pub fn crc32c_b64(data: &[u8]) -> String {
    crc_b64(crc32c::crc32c(data))
}

/// A CRC32C as Cloud Storage writes it: base64 of its big-endian bytes.
fn crc_b64(crc: u32) -> String {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD.encode(crc.to_be_bytes())
}

/// The file at `path` in chunks, read as the request body is sent.
fn file_chunks(
    path: &Path,
) -> impl futures_util::Stream<Item = std::io::Result<bytes::Bytes>> + Send + 'static {
    let file = std::fs::File::open(path);
    futures_util::stream::unfold(Some(file), |state| async move {
        let mut file = match state? {
            Ok(file) => file,
            Err(e) => return Some((Err(e), None)),
        };
        let mut chunk = vec![0; 1 << 20];
        match std::io::Read::read(&mut file, &mut chunk) {
            Ok(0) => None,
            Ok(n) => {
                chunk.truncate(n);
                Some((Ok(bytes::Bytes::from(chunk)), Some(Ok(file))))
            }
            Err(e) => Some((Err(e), None)),
        }
    })
}

/// What an upload writes: where, its type and precondition, and its content's CRC32C and
/// size.
struct Upload<'a> {
    bucket: &'a str,
    name: &'a str,
    content_type: &'a str,
    create_only: bool,
    crc: u32,
    size: u64,
}

impl Storage {
    /// A client for `endpoint` (production endpoints fetch credentials now).
    pub fn new(endpoint: Endpoint, policy: RetryPolicy) -> Result<Storage, ApiError> {
        let (rt, http, auth) = http::connect(&endpoint, CALL_TIMEOUT)?;
        Ok(Storage {
            rt,
            http,
            auth,
            endpoint,
            policy,
        })
    }

    fn object_url(&self, bucket: &str, name: &str) -> String {
        format!(
            "{}/storage/v1/b/{}/o/{}",
            self.endpoint.base,
            encode(bucket),
            encode(name)
        )
    }

    /// One call with retries: `make` builds the request afresh for each try.
    fn call(
        &self,
        make: &dyn Fn(&reqwest::Client) -> reqwest::RequestBuilder,
    ) -> Result<Reply, ApiError> {
        self.rt.block_on(async {
            let mut k = 1;
            loop {
                let result = exchange(make(&self.http), self.auth.as_ref()).await;
                let (error, after) = match &result {
                    Ok(reply) => (reply.error(), reply.retry_after),
                    Err(e) => (Some(e.clone()), None),
                };
                match error {
                    Some(e) if retryable(&e) && k < self.policy.tries => {
                        k += 1;
                        tokio::time::sleep(self.policy.wait(k, after, http::jitter())).await;
                    }
                    _ => return result,
                }
            }
        })
    }

    /// The object's bytes, or `None` if it does not exist; refused if larger than `limit`.
    pub fn get(&self, bucket: &str, name: &str, limit: u64) -> Result<Option<Vec<u8>>, ApiError> {
        let url = format!("{}?alt=media", self.object_url(bucket, name));
        let reply = self.call(&|h| h.get(&url))?;
        if reply.code == 404 {
            return Ok(None);
        }
        if let Some(e) = reply.error() {
            return Err(e);
        }
        if reply.body.len() as u64 > limit {
            return Err(malformed(&format!(
                "gs://{bucket}/{name} is {} bytes, more than the {limit} allowed",
                reply.body.len()
            )));
        }
        Ok(Some(reply.body.to_vec()))
    }

    /// The object's bytes from `offset` on, at most `limit` (a `Range` request), or `None`
    /// if it does not exist; empty when it holds nothing past `offset` (416).
    pub fn get_from(
        &self,
        bucket: &str,
        name: &str,
        offset: u64,
        limit: u64,
    ) -> Result<Option<Vec<u8>>, ApiError> {
        if limit == 0 {
            return Ok(Some(Vec::new()));
        }
        let url = format!("{}?alt=media", self.object_url(bucket, name));
        let range = format!("bytes={offset}-{}", offset.saturating_add(limit - 1));
        let reply = self.call(&|h| h.get(&url).header(reqwest::header::RANGE, &range))?;
        match reply.code {
            404 => return Ok(None),
            416 => return Ok(Some(Vec::new())),
            _ => {}
        }
        if let Some(e) = reply.error() {
            return Err(e);
        }
        // 206 is the range; 200 is the whole object (a server that ignores ranges).
        let body = if reply.code == 206 {
            &reply.body[..]
        } else {
            reply.body.get(offset as usize..).unwrap_or_default()
        };
        Ok(Some(body[..body.len().min(limit as usize)].to_vec()))
    }

    /// Streams the object into `path` (created; at most `limit` bytes); false if it does not
    /// exist.
    pub fn download(
        &self,
        bucket: &str,
        name: &str,
        path: &Path,
        limit: u64,
    ) -> Result<bool, ApiError> {
        let url = format!("{}?alt=media", self.object_url(bucket, name));
        let http = self.http.clone();
        let auth = self.auth.clone();
        self.rt.block_on(async move {
            let mut request = http.get(&url);
            if let Some(provider) = &auth {
                let token = provider.token(http::CLOUD_PLATFORM).await.map_err(|e| {
                    transport(
                        "UNAUTHENTICATED",
                        format!("cannot get an access token: {e}"),
                    )
                })?;
                request = request.bearer_auth(token.as_str());
            }
            let mut reply = request
                .send()
                .await
                .map_err(|e| transport("UNAVAILABLE", http::error_chain(&e)))?;
            let code = reply.status().as_u16();
            if code == 404 {
                return Ok(false);
            }
            if !(200..300).contains(&code) {
                let text = reply.text().await.unwrap_or_default();
                return Err(http::api_error(code, &text));
            }
            let mut file = std::fs::File::create(path)
                .map_err(|e| transport("INTERNAL", format!("{}: {e}", path.display())))?;
            let mut written = 0u64;
            while let Some(chunk) = reply
                .chunk()
                .await
                .map_err(|e| transport("UNAVAILABLE", http::error_chain(&e)))?
            {
                written += chunk.len() as u64;
                if written > limit {
                    return Err(malformed(&format!(
                        "gs://{bucket}/{name} is more than the {limit} bytes allowed"
                    )));
                }
                file.write_all(&chunk)
                    .map_err(|e| transport("INTERNAL", format!("{}: {e}", path.display())))?;
            }
            file.sync_all()
                .map_err(|e| transport("INTERNAL", format!("{}: {e}", path.display())))?;
            Ok(true)
        })
    }

    /// Writes the object (multipart upload with its CRC32C); `create_only`: refused with 412
    /// `FAILED_PRECONDITION` if it exists.
    pub fn put(
        &self,
        bucket: &str,
        name: &str,
        data: &[u8],
        content_type: &str,
        create_only: bool,
    ) -> Result<ObjectMeta, ApiError> {
        let data = bytes::Bytes::copy_from_slice(data);
        let crc = crc32c::crc32c(&data);
        let upload = Upload {
            bucket,
            name,
            content_type,
            create_only,
            crc,
            size: data.len() as u64,
        };
        self.multipart(&upload, CALL_TIMEOUT, &|| {
            futures_util::stream::iter([Ok(data.clone())])
        })
    }

    /// Writes the object from the file at `path` as `put` does, the file streamed into the
    /// request (never held in memory whole), with a timeout that grows with its size.
    pub fn upload(
        &self,
        bucket: &str,
        name: &str,
        path: &Path,
        create_only: bool,
    ) -> Result<ObjectMeta, ApiError> {
        let local = |e: std::io::Error| transport("INTERNAL", format!("{}: {e}", path.display()));
        let (mut crc, mut size) = (0u32, 0u64);
        let mut file = std::fs::File::open(path).map_err(local)?;
        let mut chunk = vec![0; 1 << 20];
        loop {
            let n = std::io::Read::read(&mut file, &mut chunk).map_err(local)?;
            if n == 0 {
                break;
            }
            crc = crc32c::crc32c_append(crc, &chunk[..n]);
            size += n as u64;
        }
        let upload = Upload {
            bucket,
            name,
            content_type: "application/octet-stream",
            create_only,
            crc,
            size,
        };
        // At least a megabyte a second, on top of a call's own time.
        let timeout = CALL_TIMEOUT + Duration::from_secs(size >> 20);
        self.multipart(&upload, timeout, &|| file_chunks(path))
    }

    /// A multipart upload of `upload`, its content streamed from `content()` (called
    /// afresh for each try).
    fn multipart<S>(
        &self,
        upload: &Upload<'_>,
        timeout: Duration,
        content: &dyn Fn() -> S,
    ) -> Result<ObjectMeta, ApiError>
    where
        S: futures_util::Stream<Item = std::io::Result<bytes::Bytes>> + Send + 'static,
    {
        use futures_util::StreamExt;
        let mut url = format!(
            "{}/upload/storage/v1/b/{}/o?uploadType=multipart",
            self.endpoint.base,
            encode(upload.bucket)
        );
        if upload.create_only {
            url.push_str("&ifGenerationMatch=0");
        }
        let boundary = format!("tpu-runner-{:016x}", http::jitter());
        let metadata = json!({
            "name": upload.name,
            "contentType": upload.content_type,
            "crc32c": crc_b64(upload.crc),
        });
        let head = bytes::Bytes::from(format!(
            "--{boundary}\r\ncontent-type: application/json; charset=UTF-8\r\n\r\n{metadata}\r\n--{boundary}\r\ncontent-type: {}\r\n\r\n",
            upload.content_type
        ));
        let tail = bytes::Bytes::from(format!("\r\n--{boundary}--\r\n"));
        let length = head.len() as u64 + upload.size + tail.len() as u64;
        let reply = self.call(&|h| {
            let body = futures_util::stream::iter([Ok(head.clone())])
                .chain(content())
                .chain(futures_util::stream::iter([Ok(tail.clone())]));
            h.post(&url)
                .header(
                    reqwest::header::CONTENT_TYPE,
                    format!("multipart/related; boundary={boundary}"),
                )
                .header(reqwest::header::CONTENT_LENGTH, length)
                .timeout(timeout)
                .body(reqwest::Body::wrap_stream(body))
        })?;
        if let Some(mut e) = reply.error() {
            if reply.code == 412 {
                e.status = "FAILED_PRECONDITION".into();
            }
            return Err(e);
        }
        serde_json::from_slice(&reply.body).map_err(|e| malformed(&format!("upload reply: {e}")))
    }

    /// Copies an object within Cloud Storage (`objects.rewrite`: the bytes never leave it),
    /// calling again with the rewrite token until it is done (large objects across
    /// locations take several calls).
    pub fn rewrite(
        &self,
        from_bucket: &str,
        from_name: &str,
        to_bucket: &str,
        to_name: &str,
    ) -> Result<(), ApiError> {
        #[derive(Deserialize, Default)]
        #[serde(rename_all = "camelCase", default)]
        struct Progress {
            done: bool,
            rewrite_token: String,
        }
        let base = format!(
            "{}/rewriteTo/b/{}/o/{}",
            self.object_url(from_bucket, from_name),
            encode(to_bucket),
            encode(to_name)
        );
        let mut token = String::new();
        for _ in 0..100_000 {
            let url = if token.is_empty() {
                base.clone()
            } else {
                format!("{base}?rewriteToken={}", encode(&token))
            };
            let reply = self.call(&|h| {
                h.post(&url)
                    .header(reqwest::header::CONTENT_TYPE, "application/json")
                    .body("{}")
            })?;
            if let Some(e) = reply.error() {
                return Err(e);
            }
            let progress: Progress = serde_json::from_slice(&reply.body)
                .map_err(|e| malformed(&format!("rewrite reply: {e}")))?;
            if progress.done {
                return Ok(());
            }
            if progress.rewrite_token.is_empty() {
                return Err(malformed("a rewrite neither done nor continued"));
            }
            token = progress.rewrite_token;
        }
        Err(malformed("a rewrite that never ends"))
    }

    /// Every object whose name starts with `prefix`, in name order (all pages).
    pub fn list(&self, bucket: &str, prefix: &str) -> Result<Vec<ObjectMeta>, ApiError> {
        #[derive(Deserialize, Default)]
        #[serde(rename_all = "camelCase", default)]
        struct Page {
            items: Vec<ObjectMeta>,
            next_page_token: String,
        }
        let mut out = Vec::new();
        let mut token = String::new();
        for _ in 0..100_000 {
            let mut url = format!(
                "{}/storage/v1/b/{}/o?prefix={}&maxResults=1000",
                self.endpoint.base,
                encode(bucket),
                encode(prefix)
            );
            if !token.is_empty() {
                url.push_str(&format!("&pageToken={}", encode(&token)));
            }
            let reply = self.call(&|h| h.get(&url))?;
            if let Some(e) = reply.error() {
                return Err(e);
            }
            let page: Page = serde_json::from_slice(&reply.body)
                .map_err(|e| malformed(&format!("listing of gs://{bucket}/{prefix}: {e}")))?;
            out.extend(page.items);
            if page.next_page_token.is_empty() {
                out.sort_by(|a, b| a.name.cmp(&b.name));
                return Ok(out);
            }
            token = page.next_page_token;
        }
        Err(malformed("a listing that never ends"))
    }

    /// Deletes the object; absent is success.
    pub fn delete(&self, bucket: &str, name: &str) -> Result<(), ApiError> {
        let url = self.object_url(bucket, name);
        let reply = self.call(&|h| h.delete(&url))?;
        match reply.error() {
            Some(e) if reply.code != 404 => Err(e),
            _ => Ok(()),
        }
    }

    /// The bucket's location as Cloud Storage words it (`US-EAST1`, `US`, `NAM4` …); `None`
    /// if there is no such bucket.
    pub fn bucket_location(&self, bucket: &str) -> Result<Option<String>, ApiError> {
        let url = format!(
            "{}/storage/v1/b/{}?fields=location",
            self.endpoint.base,
            encode(bucket)
        );
        let reply = self.call(&|h| h.get(&url))?;
        if reply.code == 404 {
            return Ok(None);
        }
        if let Some(e) = reply.error() {
            return Err(e);
        }
        let v: serde_json::Value = serde_json::from_slice(&reply.body)
            .map_err(|_| malformed("a bucket's metadata that is not JSON"))?;
        Ok(v.get("location")
            .and_then(|l| l.as_str())
            .map(str::to_owned))
    }

    /// Creates a bucket in `location` (for tests and the local stack on an emulator); one
    /// that exists is left as it is.
    pub fn create_bucket(
        &self,
        project: &str,
        bucket: &str,
        location: &str,
    ) -> Result<(), ApiError> {
        let url = format!(
            "{}/storage/v1/b?project={}",
            self.endpoint.base,
            encode(project)
        );
        let body = json!({ "name": bucket, "location": location });
        let reply = self.call(&|h| h.post(&url).json(&body))?;
        match reply.error() {
            Some(e) if reply.code != 409 => Err(e),
            _ => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crc32c_matches_the_published_check_values() {
        // RFC 3720 B.4: 32 bytes of zeros → 0x8A9136AA; "123456789" → 0xE3069283.
        assert_eq!(crc32c::crc32c(&[0u8; 32]), 0x8A91_36AA);
        assert_eq!(crc32c::crc32c(b"123456789"), 0xE306_9283);
        // GCS's example: "hello world" → base64 of 0xC99465AA.
        assert_eq!(crc32c_b64(b"hello world"), "yZRlqg==");
    }

    #[test]
    fn object_names_are_encoded_for_a_path_segment() {
        assert_eq!(
            encode("jobs/j 1/status/w-0.json"),
            "jobs%2Fj%201%2Fstatus%2Fw-0.json"
        );
    }
}
