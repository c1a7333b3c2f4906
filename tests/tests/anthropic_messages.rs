//! Anthropic `/v1/messages` through a real Envoy 1.40 with the kvsteer
//! filter (the local layout steers `/v1/messages` too), a real indexer and three simulated
//! workers: a multi-turn conversation sticks to its worker and hits its
//! cache, and its first-token and done reports arrive.

use std::time::Duration;

use kvsteer_e2e::{Cluster, ClusterOptions, MODEL, send_chat, serial, wait_until};
use serde_json::{Value, json};

const WAIT: Duration = Duration::from_secs(30);

fn options() -> ClusterOptions {
    ClusterOptions::tiny(4.0)
}

fn system_blocks(tag: &str, turn: usize) -> Value {
    let mut rules = format!("You are assistant {tag}.\n");
    for i in 0..120 {
        rules.push_str(&format!(
            "Rule {i} for {tag}: keep it small, test edge case {i}.\n"
        ));
    }
    // Claude Code's per-request billing header changes every turn; vLLM (and
    // so kvsteer) drops it, which keeps the prefix cacheable.
    json!([
        {"type": "text", "text": format!("x-anthropic-billing-header: cch={turn:05x};")},
        {"type": "text", "text": rules},
    ])
}

/// The text of an Anthropic SSE stream's `text_delta`s, and its
/// `message_delta` usage.
fn read_stream(body: &str) -> (String, Option<Value>) {
    let mut text = String::new();
    let mut usage = None;
    for data in body.lines().filter_map(|l| l.strip_prefix("data: ")) {
        let Ok(event) = serde_json::from_str::<Value>(data) else {
            continue;
        };
        match event["type"].as_str() {
            Some("content_block_delta") => {
                text.push_str(event["delta"]["text"].as_str().unwrap_or_default());
            }
            Some("message_delta") => usage = Some(event["usage"].clone()),
            _ => {}
        }
    }
    (text, usage)
}

async fn reports(c: &Cluster, kind: &str) -> f64 {
    c.indexer_metric("kvsteer_reports_total", &[&format!("kind=\"{kind}\"")])
        .await
        .expect("indexer metrics")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn multi_turn_messages_stick_to_the_warm_worker_and_report() {
    let _g = serial().await;
    let c = Cluster::start(options()).await.expect("cluster");
    let url = c.envoy_url("/v1/messages?beta=true");
    let steered_before = c
        .envoy_stat("wasmcustom.kvsteer_filter_steered")
        .await
        .expect("envoy stats");
    let (done_before, first_before) = (reports(&c, "done").await, reports(&c, "first_token").await);
    let ttft_before = observed_ttfts(&c).await;
    let turns = 4;
    for tag in ["alpha", "beta"] {
        let mut messages: Vec<Value> = Vec::new();
        let mut first_worker: Option<String> = None;
        for t in 0..turns {
            messages.push(json!({"role": "user", "content": [
                {"type": "text", "text": format!("Question {t} about {tag}: what next?")}
            ]}));
            let body = json!({
                "model": MODEL, "max_tokens": 16, "stream": true,
                "system": system_blocks(tag, t),
                "messages": messages,
            });
            let reply = send_chat(&c.client, &url, &body, &[])
                .await
                .expect("request");
            assert_eq!(reply.status, 200, "{tag} turn {t}: {}", reply.text());
            let (text, usage) = read_stream(&reply.text());
            let usage = usage.expect("message_delta usage");
            let worker = reply.worker.clone().expect("x-kvsteer-worker");
            match &first_worker {
                None => first_worker = Some(worker),
                Some(first) => {
                    assert_eq!(&worker, first, "{tag} turn {t} moved");
                    let cached = usage["cache_read_input_tokens"].as_u64().unwrap_or(0);
                    assert!(cached > 0, "{tag} turn {t}: no cached tokens ({usage})");
                }
            }
            messages
                .push(json!({"role": "assistant", "content": [{"type": "text", "text": text}]}));
        }
    }
    let steered = c
        .envoy_stat("wasmcustom.kvsteer_filter_steered")
        .await
        .expect("envoy stats");
    assert_eq!(
        steered - steered_before,
        2 * turns as u64,
        "every turn steered"
    );
    let n = f64::from(2 * turns as u32);
    wait_until("a DONE per request", WAIT, || async {
        (reports(&c, "done").await - done_before >= n).then_some(())
    })
    .await
    .expect("done reports");
    assert_eq!(reports(&c, "done").await - done_before, n);
    // Every stream's first token was seen (the first `content_block_delta`):
    // reported apart, or riding on its DONE when the whole stream came in
    // one chunk; each is one observed TTFT.
    let first = reports(&c, "first_token").await - first_before;
    assert!(first <= n, "{first} first-token reports for {n} requests");
    assert_eq!(observed_ttfts(&c).await - ttft_before, n);
}

async fn observed_ttfts(c: &Cluster) -> f64 {
    c.indexer_metric("kvsteer_observed_ttft_seconds_count", &[])
        .await
        .expect("indexer metrics")
}

/// A rejected `/v1/messages` request would answer in Anthropic's error shape
/// (covered in the filter's unit tests); here a malformed messages body is
/// let through unsteered to the worker, which answers in that shape.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_messages_body_reaches_the_worker() {
    let _g = serial().await;
    let c = Cluster::start(options()).await.expect("cluster");
    let body =
        json!({"model": MODEL, "max_tokens": 4, "messages": [{"role": "tool", "content": "x"}]});
    let reply = send_chat(&c.client, &c.envoy_url("/v1/messages"), &body, &[])
        .await
        .expect("request");
    assert_eq!(reply.status, 400, "{}", reply.text());
    let err: Value = serde_json::from_slice(&reply.body).expect("JSON error");
    assert_eq!(err["type"], "error");
    assert!(
        c.envoy_stat("wasmcustom.kvsteer_filter_failopen.malformed_body")
            .await
            .expect("envoy stats")
            >= 1
    );
}
