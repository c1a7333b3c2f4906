//! Admin endpoints and worker scraping over loopback: a fake vLLM `/metrics`
//! page, a worker whose metrics port is closed, `/debug/score` on
//! completions bodies, and bad bodies.

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::{client::legacy::Client, rt::TokioExecutor};
use kvsteer_indexer::{app, config::Config};
use serde_json::{Value, json};
use std::time::Duration;

const WAIT: Duration = Duration::from_secs(20);
const PAGE: &str = "# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine=\"0\",model_name=\"m\"} 5.0
vllm:num_requests_running{engine=\"0\",model_name=\"m\"} 3.0
vllm:kv_cache_usage_perc{engine=\"0\",model_name=\"m\"} 0.5
";

use kvsteer_e2e::shared_dir as shared;

async fn call(base: &str, method: &str, path: &str, body: &str) -> (u16, String) {
    let client = Client::builder(TokioExecutor::new()).build_http();
    let req = http::Request::builder()
        .method(method)
        .uri(format!("{base}{path}"))
        .header("x-tenant-id", "team-a")
        .body(Full::new(Bytes::from(body.to_owned())))
        .unwrap();
    let resp = tokio::time::timeout(WAIT, client.request(req))
        .await
        .expect("answer in time")
        .expect("request");
    let status = resp.status().as_u16();
    let bytes = resp.into_body().collect().await.unwrap().to_bytes();
    (status, String::from_utf8_lossy(&bytes).into_owned())
}

async fn json_call(base: &str, method: &str, path: &str, body: &Value) -> (u16, Value) {
    let (s, text) = call(base, method, path, &body.to_string()).await;
    (s, serde_json::from_str(&text).unwrap_or(Value::Null))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scrape_marks_down_workers_and_debug_score_reads_bodies() {
    // A fake engine metrics page, and a port nobody listens on.
    let fake = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let fake_addr = fake.local_addr().unwrap();
    let server = tokio::spawn(async move {
        let app = axum::Router::new().route("/metrics", axum::routing::get(|| async { PAGE }));
        axum::serve(fake, app).await.unwrap();
    });
    let closed = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap()
    };
    let cfg = Config::from_yaml(&format!(
        "grpc_listen: 127.0.0.1:0
admin_listen: 127.0.0.1:0
models: [{{name: m, tokenizer: {tok}}}]
workers:
  - {{name: a, endpoint: 127.0.0.1:18101, model: m, metrics: 'http://{fake_addr}/metrics'}}
  - {{name: b, endpoint: 127.0.0.1:18102, model: m, metrics: 'http://{closed}/metrics'}}
scrape: {{interval_ms: 50, timeout_ms: 500, down_after: 1}}
tenants: {{metrics_allowlist: [team-a]}}
",
        tok = shared().join("tokenizers/qwen3").display()
    ))
    .unwrap();
    let running = app::start(cfg).await.expect("start");
    let base = format!("http://{}", running.admin_addr);

    let workers = tokio::time::timeout(WAIT, async {
        loop {
            let (_, v) = json_call(&base, "GET", "/debug/workers", &Value::Null).await;
            let ws = v["workers"].as_array().cloned().unwrap_or_default();
            if ws.len() == 2 && ws[0]["scraped"]["waiting"] == json!(5.0) && ws[1]["up"] == false {
                return ws;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await
    .expect("scrapes land");
    assert_eq!(workers[0]["up"], true);
    assert_eq!(workers[0]["scraped"]["running"], json!(3.0));
    assert!(workers[1]["scrape_error"].is_string());
    assert_eq!(workers[0]["stream"]["state"], "disabled");

    // b is down, so a is chosen even though its queue is long.
    let body = json!({"model": "m", "prompt": "hello there, general kenobi"});
    let (status, score) = json_call(&base, "POST", "/debug/score", &body).await;
    assert_eq!(status, 200, "{score}");
    assert_eq!(score["chosen"], "a", "{score}");
    assert_eq!(score["policy"], "kvsteer");
    assert!(score["prompt_tokens"].as_u64().unwrap() > 3);
    assert_eq!(score["workers"].as_array().unwrap().len(), 2);
    let batch = json!({"model": "m", "prompt": [[1, 2, 3], [4, 5]]});
    let (_, score) = json_call(&base, "POST", "/debug/score", &batch).await;
    assert_eq!(
        score["prompt_tokens"],
        json!(3),
        "routes on the first prompt"
    );

    // Bad bodies: clear 400s. Unknown model: no opinion.
    let (s, _) = call(&base, "POST", "/debug/score", "not json").await;
    assert_eq!(s, 400);
    let (s, v) = json_call(&base, "POST", "/debug/score", &json!({"model": "m"})).await;
    assert_eq!(s, 400);
    assert!(v["error"].as_str().unwrap().contains("messages"));
    let (_, v) = json_call(
        &base,
        "POST",
        "/debug/score",
        &json!({"model": "x", "prompt": "a"}),
    )
    .await;
    assert_eq!(v["chosen"], Value::Null);
    assert!(v["reason"].as_str().unwrap().starts_with("unknown_model"));
    // A chat body that fails to tokenize degrades instead of failing.
    let bad_chat = json!({"model": "m", "messages": [{"role": "user", "content": 7}]});
    let (s, v) = json_call(&base, "POST", "/debug/score", &bad_chat).await;
    assert_eq!(s, 200);
    assert_eq!(v["degraded"], true, "{v}");

    assert_eq!(call(&base, "GET", "/healthz", "").await.0, 200);
    assert_eq!(call(&base, "GET", "/readyz", "").await.0, 503);
    let (_, metrics) = call(&base, "GET", "/metrics", "").await;
    assert!(
        metrics.contains(r#"kvsteer_worker_up{worker="b"} 0"#),
        "{metrics}"
    );
    assert!(metrics.contains("kvsteer_index_entries 0"));

    running.shutdown().await;
    server.abort();
}
