//! Credentials of the production path, over real HTTP on loopback: with a service-account
//! key (Application Default Credentials through `GOOGLE_APPLICATION_CREDENTIALS`) the TPU
//! client signs a JWT, gets an access token from the key's `token_uri`, sends it as a bearer
//! token, reuses it while it is valid and fetches a new one once it has expired. The key is
//! a throwaway made for this test (`tests/fixtures/auth/`); its `token_uri` is pointed at a
//! loopback token server. The checks run in a child process of this test binary, started
//! with `GOOGLE_APPLICATION_CREDENTIALS` set (the environment is process-wide).

use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use axum::Router;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::routing::{get, post};
use serde_json::{Value, json};
use tpu_runner::gcp::http::{Endpoint, RetryPolicy};
use tpu_runner::gcp::tpu::{Client, Quotas};

#[derive(Default)]
struct Seen {
    /// Token requests answered.
    tokens: u32,
    /// `Authorization` headers of API calls.
    authorizations: Vec<String>,
    /// Seconds each token is valid for.
    expires_in: u64,
}

type Shared = Arc<Mutex<Seen>>;

async fn token(State(seen): State<Shared>, body: String) -> axum::Json<Value> {
    assert!(
        body.contains("grant_type=urn%3Aietf%3Aparams%3Aoauth%3Agrant-type%3Ajwt-bearer")
            && body.contains("assertion="),
        "a JWT bearer grant: {body}"
    );
    let mut s = seen.lock().unwrap();
    s.tokens += 1;
    axum::Json(json!({
        "access_token": format!("token-{}", s.tokens),
        "expires_in": s.expires_in,
        "token_type": "Bearer",
    }))
}

async fn nodes(State(seen): State<Shared>, headers: HeaderMap) -> axum::Json<Value> {
    let auth = headers
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_owned();
    seen.lock().unwrap().authorizations.push(auth);
    axum::Json(json!({"nodes": []}))
}

/// Serves the token endpoint and one TPU API listing on loopback; returns the base URL.
fn serve(seen: Shared) -> String {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let addr = listener.local_addr().unwrap();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            let app = Router::new()
                .route("/token", post(token))
                .route("/v2/projects/{p}/locations/{z}/nodes", get(nodes))
                .with_state(seen);
            let listener = tokio::net::TcpListener::from_std(listener).unwrap();
            axum::serve(listener, app).await.unwrap();
        });
    });
    format!("http://{addr}")
}

/// A production-path client (credentials from the environment) calling the API at `base`.
fn client(base: &str) -> Client {
    let endpoint = Endpoint {
        base: base.to_owned(),
        emulator: false,
    };
    Client::new(
        endpoint,
        "auth-test-project",
        Quotas::default(),
        RetryPolicy::default(),
    )
    .expect("credentials from the key file")
}

const CHILD: &str = "TPU_RUNNER_AUTH_TEST_BASE";

#[test]
fn tokens_are_fetched_sent_reused_while_valid_and_refreshed_once_expired() {
    let dir = tempfile::tempdir().unwrap();
    let seen: Shared = Arc::new(Mutex::new(Seen {
        expires_in: 3600,
        ..Seen::default()
    }));
    let base = serve(seen.clone());
    let fixture = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/auth/test-service-account.json");
    let key = std::fs::read_to_string(fixture)
        .unwrap()
        .replace("TOKEN_URI", &format!("{base}/token"));
    let path = dir.path().join("key.json");
    std::fs::write(&path, key).unwrap();
    // The child makes the calls; this process serves them and judges what it saw.
    let run_child = |phase: &str| {
        let out = std::process::Command::new(std::env::current_exe().unwrap())
            .args(["--exact", "child", "--nocapture"])
            .env("GOOGLE_APPLICATION_CREDENTIALS", &path)
            .env(CHILD, &base)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{phase}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    };

    // A token valid for an hour serves every call.
    run_child("valid tokens");
    {
        let s = seen.lock().unwrap();
        assert_eq!(s.tokens, 1, "one token for three calls");
        assert_eq!(s.authorizations, vec!["Bearer token-1"; 3]);
    }

    // Tokens that expire at once (within the provider's 20 s margin) are fetched again on
    // every call: the client never sends an expired token.
    seen.lock().unwrap().expires_in = 20;
    run_child("expiring tokens");
    let s = seen.lock().unwrap();
    assert_eq!(s.tokens, 4, "a new token for each call once expired");
    assert_eq!(
        &s.authorizations[3..],
        ["Bearer token-2", "Bearer token-3", "Bearer token-4"]
    );
}

/// Three calls through one client (run by the test above, in a process of its own).
#[test]
fn child() {
    let Ok(base) = std::env::var(CHILD) else {
        return;
    };
    let client = client(&base);
    for _ in 0..3 {
        client.list_nodes(&["us-east1-d".to_owned()])[0]
            .as_ref()
            .expect("listed");
    }
}
