//! Issue 17 §5: the admin listener's `/debug/*` endpoints can be closed or
//! put behind a bearer token (`admin.debug`), while `/metrics` and the probes
//! stay reachable; a token that cannot be resolved stops the start.

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::{client::legacy::Client, rt::TokioExecutor};
use kvsteer_indexer::{app, config::Config};
use std::time::Duration;

const WAIT: Duration = Duration::from_secs(20);
const SCORE_BODY: &str = r#"{"model": "m", "prompt": "hello there"}"#;

use kvsteer_e2e::shared_dir as shared;

fn config(admin: &str) -> Config {
    Config::from_yaml(&format!(
        "grpc_listen: 127.0.0.1:0
admin_listen: 127.0.0.1:0
models: [{{name: m, tokenizer: {tok}}}]
workers:
  - {{name: a, endpoint: 127.0.0.1:18101, model: m}}
{admin}
",
        tok = shared().join("tokenizers/qwen3").display()
    ))
    .expect("config")
}

/// Status of `method path` on the admin listener, with an optional bearer token.
async fn status(base: &str, method: &str, path: &str, token: Option<&str>) -> u16 {
    let client = Client::builder(TokioExecutor::new()).build_http();
    let mut req = http::Request::builder()
        .method(method)
        .uri(format!("{base}{path}"));
    if let Some(token) = token {
        req = req.header("authorization", format!("Bearer {token}"));
    }
    let body = if method == "POST" { SCORE_BODY } else { "" };
    let req = req.body(Full::new(Bytes::from(body))).expect("request");
    let resp = tokio::time::timeout(WAIT, client.request(req))
        .await
        .expect("answer in time")
        .expect("request");
    let status = resp.status().as_u16();
    resp.into_body().collect().await.expect("body");
    status
}

/// (`/debug/workers`, `/debug/score`, `/metrics`, `/healthz`) statuses.
async fn statuses(base: &str, token: Option<&str>) -> [u16; 4] {
    [
        status(base, "GET", "/debug/workers", token).await,
        status(base, "POST", "/debug/score", token).await,
        status(base, "GET", "/metrics", token).await,
        status(base, "GET", "/healthz", token).await,
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn debug_is_open_by_default() {
    let running = app::start(config("")).await.expect("start");
    let base = format!("http://{}", running.admin_addr);
    assert_eq!(statuses(&base, None).await, [200, 200, 200, 200]);
    running.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn disabled_debug_answers_404_and_metrics_stay() {
    let running = app::start(config("admin: {debug: disabled}"))
        .await
        .expect("start");
    let base = format!("http://{}", running.admin_addr);
    assert_eq!(statuses(&base, None).await, [404, 404, 200, 200]);
    assert_eq!(
        statuses(&base, Some("anything")).await,
        [404, 404, 200, 200]
    );
    running.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn token_debug_needs_the_bearer_token() {
    let dir = tempfile::tempdir().expect("dir");
    let file = dir.path().join("token");
    std::fs::write(&file, "s3cret-token\n").expect("token file");
    let admin = format!("admin: {{debug: token, token_file: {}}}", file.display());
    let running = app::start(config(&admin)).await.expect("start");
    let base = format!("http://{}", running.admin_addr);
    assert_eq!(statuses(&base, None).await, [401, 401, 200, 200]);
    assert_eq!(
        statuses(&base, Some("s3cret-tokeX")).await,
        [401, 401, 200, 200]
    );
    assert_eq!(statuses(&base, Some("s3cret")).await, [401, 401, 200, 200]);
    assert_eq!(
        statuses(&base, Some("s3cret-token")).await,
        [200, 200, 200, 200]
    );
    running.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unreadable_or_empty_token_stops_the_start() {
    let dir = tempfile::tempdir().expect("dir");
    let missing = dir.path().join("absent");
    let admin = format!("admin: {{debug: token, token_file: {}}}", missing.display());
    let error = app::start(config(&admin)).await.err().expect("refused");
    assert!(error.to_string().contains("admin.token_file"), "{error}");

    let empty = dir.path().join("empty");
    std::fs::write(&empty, " \n").expect("token file");
    let admin = format!("admin: {{debug: token, token_file: {}}}", empty.display());
    let error = app::start(config(&admin)).await.err().expect("refused");
    assert!(error.to_string().contains("is empty"), "{error}");
    // A token file outside `debug: token` is a mistake, said so.
    let admin = "admin: {debug: enabled, token_file: /etc/token}";
    let error = Config::from_yaml(&format!("models: [{{name: m, tokenizer: t}}]\n{admin}\n"))
        .expect_err("token_file without token mode");
    assert!(error.to_string().contains("admin.token_file"), "{error}");
}
