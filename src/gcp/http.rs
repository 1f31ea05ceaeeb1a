//! What every Google REST client here shares: the error shape (`google.rpc.Status` in
//! `{"error": …}`, or GCS's `errors[]`), transport failures as errors with a status, and the
//! retry policy (bounded exponential backoff with jitter, honouring `Retry-After`). No
//! knowledge of any one API.

use std::time::Duration;

use serde_json::Value;

/// Where an API is: production, or an emulator on this machine (no credentials).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Endpoint {
    /// `https://…googleapis.com` or an emulator's `http://HOST:PORT`.
    pub base: String,
    /// True for an emulator: no credentials are fetched.
    pub emulator: bool,
}

impl Endpoint {
    /// The emulator named by the environment variable `var` (a URL or `host:port`) when it
    /// is set, else `production`.
    pub fn from_env(var: &str, production: &str) -> Endpoint {
        match std::env::var(var) {
            Ok(url) if !url.trim().is_empty() => Endpoint::emulator(url.trim()),
            _ => Endpoint {
                base: production.into(),
                emulator: false,
            },
        }
    }

    /// An emulator at `url` (`http://127.0.0.1:8470`; a bare `host:port` is read as http).
    pub fn emulator(url: &str) -> Endpoint {
        let url = url.trim_end_matches('/');
        Endpoint {
            base: if url.contains("://") {
                url.to_owned()
            } else {
                format!("http://{url}")
            },
            emulator: true,
        }
    }
}

/// A runtime, an HTTP client and the credentials (none for an emulator).
pub type Connection = (
    tokio::runtime::Runtime,
    reqwest::Client,
    Option<std::sync::Arc<dyn gcp_auth::TokenProvider>>,
);

/// What a blocking client of `endpoint` needs: a private single-threaded runtime, an HTTP
/// client whose every call times out after `timeout`, and (for production endpoints) the
/// Application Default Credentials, fetched now so a missing one fails here, clearly.
pub fn connect(endpoint: &Endpoint, timeout: Duration) -> Result<Connection, ApiError> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| transport("UNAVAILABLE", format!("cannot start the HTTP runtime: {e}")))?;
    let http = reqwest::Client::builder()
        .timeout(timeout)
        .connect_timeout(Duration::from_secs(10))
        .build()
        .map_err(|e| transport("UNAVAILABLE", format!("cannot build the HTTP client: {e}")))?;
    let auth = if endpoint.emulator {
        None
    } else {
        Some(rt.block_on(gcp_auth::provider()).map_err(|e| {
            transport(
                "UNAUTHENTICATED",
                format!("no Google credentials found ({e}): run `gcloud auth application-default login`, set GOOGLE_APPLICATION_CREDENTIALS, or run on GCP"),
            )
        })?)
    };
    Ok((rt, http, auth))
}

/// What came back from one exchange.
#[derive(Debug)]
pub struct Reply {
    /// HTTP status.
    pub code: u16,
    /// `Retry-After`, if it said.
    pub retry_after: Option<Duration>,
    /// The body.
    pub body: bytes::Bytes,
}

impl Reply {
    /// The body as text, for error messages.
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    /// The `google.rpc.Status` (or GCS) error of a non-2xx reply; `None` for success.
    pub fn error(&self) -> Option<ApiError> {
        (!(200..300).contains(&self.code)).then(|| api_error(self.code, &self.text()))
    }
}

/// The OAuth scope every client here asks for.
pub const CLOUD_PLATFORM: &[&str] = &["https://www.googleapis.com/auth/cloud-platform"];

/// Sends `request` once, with a bearer token from `auth` (none for an emulator), and reads
/// the whole reply; a failure to get a token, connect or read is an error with no reply.
pub async fn exchange(
    request: reqwest::RequestBuilder,
    auth: Option<&std::sync::Arc<dyn gcp_auth::TokenProvider>>,
) -> Result<Reply, ApiError> {
    let reply = send(request, auth).await?;
    let code = reply.status().as_u16();
    let retry_after = retry_after(
        reply
            .headers()
            .get(reqwest::header::RETRY_AFTER)
            .and_then(|v| v.to_str().ok()),
    );
    let body = reply
        .bytes()
        .await
        .map_err(|e| transport("UNAVAILABLE", error_chain(&e)))?;
    Ok(Reply {
        code,
        retry_after,
        body,
    })
}

/// Sends `request` once with a bearer token from `auth` (none for an emulator); the reply
/// unread, for callers that stream it.
pub async fn send(
    request: reqwest::RequestBuilder,
    auth: Option<&std::sync::Arc<dyn gcp_auth::TokenProvider>>,
) -> Result<reqwest::Response, ApiError> {
    let request = match auth {
        Some(provider) => match provider.token(CLOUD_PLATFORM).await {
            Ok(token) => request.bearer_auth(token.as_str()),
            Err(e) => {
                return Err(transport(
                    "UNAUTHENTICATED",
                    format!("cannot get an access token: {e}"),
                ));
            }
        },
        None => request,
    };
    request.send().await.map_err(|e| {
        let status = if e.is_timeout() {
            "DEADLINE_EXCEEDED"
        } else {
            "UNAVAILABLE"
        };
        transport(status, error_chain(&e))
    })
}

/// A failed call.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ApiError {
    /// HTTP status (0: no reply).
    pub code: u16,
    /// The API's status (`ABORTED`, `FAILED_PRECONDITION`, `NOT_FOUND`, …), or
    /// `UNAVAILABLE` / `DEADLINE_EXCEEDED` / `UNAUTHENTICATED` for transport and credential
    /// failures.
    pub status: String,
    /// Message.
    pub message: String,
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.code == 0 {
            write!(f, "{}: {}", self.status, self.message)
        } else {
            write!(f, "{} {}: {}", self.code, self.status, self.message)
        }
    }
}

/// A failure with no HTTP reply (connection, timeout, credentials).
pub fn transport(status: &str, message: String) -> ApiError {
    ApiError {
        code: 0,
        status: status.into(),
        message,
    }
}

/// A reply that does not have the documented shape.
pub fn malformed(what: &str) -> ApiError {
    ApiError {
        code: 0,
        status: "INTERNAL".into(),
        message: format!("unexpected reply: {what}"),
    }
}

/// An error with all its causes, for messages.
pub fn error_chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        text.push_str(&format!(": {s}"));
        source = s.source();
    }
    text
}

/// The Google error body `{"error": {code, status, message}}` (or a bare text).
pub fn api_error(code: u16, body: &str) -> ApiError {
    let parsed: Option<Value> = serde_json::from_str(body).ok();
    let error = parsed.as_ref().map(|v| {
        // Some replies wrap the error in a one-element list.
        v.get("error")
            .or_else(|| v.get(0).and_then(|e| e.get("error")))
            .cloned()
    });
    match error.flatten() {
        Some(e) => ApiError {
            code,
            status: e["status"].as_str().unwrap_or("UNKNOWN").to_owned(),
            message: e["message"].as_str().unwrap_or_default().to_owned(),
        },
        None => ApiError {
            code,
            status: match code {
                401 => "UNAUTHENTICATED",
                403 => "PERMISSION_DENIED",
                404 => "NOT_FOUND",
                409 => "ABORTED",
                429 => "RESOURCE_EXHAUSTED",
                503 => "UNAVAILABLE",
                _ => "UNKNOWN",
            }
            .into(),
            message: body.chars().take(300).collect(),
        },
    }
}

/// Whether a failed call may be made again as it is: rate limits, server errors, timeouts
/// and lost connections (creates and deletes carry a `requestId`, so repeating them is
/// idempotent).
pub fn retryable(e: &ApiError) -> bool {
    e.code == 0 && e.status != "UNAUTHENTICATED" && e.status != "INTERNAL"
        || matches!(e.code, 408 | 429 | 500 | 502 | 503 | 504)
}

/// Bounded retries with exponential backoff and jitter.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RetryPolicy {
    /// Tries in all (the first included).
    pub tries: u32,
    /// Wait before the second try; doubled each time.
    pub base: Duration,
    /// The longest wait.
    pub cap: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            tries: 5,
            base: Duration::from_millis(500),
            cap: Duration::from_secs(30),
        }
    }
}

impl RetryPolicy {
    /// The wait before try `k` (1-based, k ≥ 2): `Retry-After` when the server gave one
    /// (capped), else base × 2^(k-2) with full jitter in its upper half.
    pub fn wait(&self, k: u32, retry_after: Option<Duration>, jitter: u64) -> Duration {
        if let Some(after) = retry_after {
            return after.min(self.cap);
        }
        let exp = self
            .base
            .saturating_mul(1u32 << (k.saturating_sub(2)).min(16))
            .min(self.cap);
        let half = exp / 2;
        half + Duration::from_nanos(jitter % (half.as_nanos() as u64 + 1))
    }
}

/// `Retry-After` as seconds (the HTTP-date form is ignored: the backoff applies).
pub fn retry_after(value: Option<&str>) -> Option<Duration> {
    value?.trim().parse::<u64>().ok().map(Duration::from_secs)
}

/// A jitter seed from the clock's nanoseconds (not a simulation input: only spreads
/// retries of many clients apart).
pub fn jitter() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::from(d.subsec_nanos()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_honours_retry_after_and_is_capped() {
        let p = RetryPolicy::default();
        let w2 = p.wait(2, None, 0);
        let w3 = p.wait(3, None, 0);
        assert_eq!(
            (w2, w3),
            (Duration::from_millis(250), Duration::from_millis(500))
        );
        assert!(p.wait(30, None, u64::MAX) <= p.cap);
        assert_eq!(
            p.wait(2, Some(Duration::from_secs(7)), 0),
            Duration::from_secs(7)
        );
        assert_eq!(p.wait(2, Some(Duration::from_secs(700)), 0), p.cap);
        assert_eq!(retry_after(Some(" 12 ")), Some(Duration::from_secs(12)));
        assert_eq!(retry_after(Some("Wed, 21 Oct 2015 07:28:00 GMT")), None);
    }

    #[test]
    fn what_is_retried() {
        let e = |code, status: &str| ApiError {
            code,
            status: status.into(),
            message: String::new(),
        };
        assert!(retryable(&e(429, "RESOURCE_EXHAUSTED")));
        assert!(retryable(&e(503, "UNAVAILABLE")));
        assert!(retryable(&e(0, "DEADLINE_EXCEEDED")));
        assert!(!retryable(&e(403, "PERMISSION_DENIED")));
        assert!(!retryable(&e(400, "INVALID_ARGUMENT")));
        assert!(!retryable(&e(0, "UNAUTHENTICATED")));
    }
}
