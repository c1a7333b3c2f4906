//! The service on the Redis index backend, end to end over loopback: a real
//! `redis-server` (free port, killed on drop), ZeroMQ publishers standing in
//! for the engines, in-process indexers (`app::start`, port 0).
//!
//! - Replicas: one writer applies the events, readers only look up; all
//!   answer the same, a late reader is warm at once, one survives the other.
//! - Outage: with Redis down picks keep answering on load only (`degraded`,
//!   `index_unavailable`) within a bound; after Redis restarts, the writer
//!   purges and replays the worker, and lookups match the published blocks.

mod common;

use common::{Admin, BLOCK, MODEL, eventually, shared, stored};
use kvsteer_indexer::{
    app::{self, Running},
    config::Config,
    index::redis::testing::RedisServer,
};
use kvsteer_kv_events::zmq::{Publisher, PublisherConfig};
use kvsteer_proto::v1 as pb;
use kvsteer_tokenize::{ChatRequest, PromptTokenizer};
use serde_json::{Value, json};
use std::time::Duration;

/// A pick must answer within this even with Redis gone (its lookup budget
/// in these tests is 1 s; a hang would blow it).
const PICK_BOUND: Duration = Duration::from_secs(5);
const ENDPOINTS: [&str; 2] = ["127.0.0.1:18101", "127.0.0.1:18102"];

async fn redis() -> RedisServer {
    RedisServer::start()
        .await
        .unwrap_or_else(|e| panic!("these tests need a local redis-server: {e}"))
}

impl Admin {
    fn of(running: &Running) -> Self {
        Self::new(format!("http://{}", running.admin_addr))
    }

    async fn json(&self, method: &str, path: &str, body: Option<&Value>) -> Value {
        let (status, text) = self.call(method, path, body).await;
        assert_eq!(status, 200, "{path}: {text}");
        serde_json::from_str(&text).unwrap_or(Value::Null)
    }

    async fn score(&self, body: &Value) -> Value {
        self.json("POST", "/debug/score", Some(body)).await
    }

    async fn metrics(&self) -> String {
        self.call("GET", "/metrics", None).await.1
    }

    async fn ready(&self) {
        eventually("readyz", || async {
            (self.call("GET", "/readyz", None).await.0 == 200).then_some(())
        })
        .await;
    }
}

fn matched(score: &Value, worker: &str) -> Value {
    score["workers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|w| w["name"] == worker)
        .map(|w| w["matched_tokens"].clone())
        .unwrap()
}

/// The value of the first sample line starting with `prefix`.
fn sample(metrics: &str, prefix: &str) -> Option<f64> {
    metrics
        .lines()
        .find(|l| l.starts_with(prefix))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

async fn publishers() -> Vec<Publisher> {
    let mut pubs = Vec::new();
    for ep in ENDPOINTS {
        let p = Publisher::bind(PublisherConfig {
            pub_endpoint: "tcp://127.0.0.1:0".into(),
            replay_endpoint: Some("tcp://127.0.0.1:0".into()),
            topic: format!("kv@{ep}@{MODEL}"),
            ..Default::default()
        })
        .await
        .expect("bind publisher");
        pubs.push(p);
    }
    pubs
}

/// A two-worker service on `redis` (`writer` or reader replica).
fn config(redis: &RedisServer, pubs: &[Publisher], writer: bool) -> Config {
    let mut workers = String::new();
    for (i, (p, ep)) in pubs.iter().zip(ENDPOINTS).enumerate() {
        let (kv, replay) = p.local_endpoints();
        workers.push_str(&format!(
            "  - {{name: w{n}, endpoint: {ep}, model: {MODEL}, kv_events: {kv}, replay: {r}}}\n",
            n = i + 1,
            r = replay.unwrap(),
        ));
    }
    Config::from_yaml(&format!(
        "grpc_listen: 127.0.0.1:0
admin_listen: 127.0.0.1:0
models:
  - name: {MODEL}
    tokenizer: {tok}
workers:
{workers}index:
  backend: redis
  redis_url: {url}
  redis:
    key_prefix: kvsvc
    writer: {writer}
    lookup_timeout_ms: 1000
    write_timeout_ms: 1000
    backoff_max_ms: 100
streams:
  backoff_initial_ms: 20
  backoff_max_ms: 200
",
        tok = shared().join("tokenizers/qwen3").display(),
        url = redis.url(),
    ))
    .expect("config")
}

/// A conversation's two turns and turn 1's token ids.
fn conversation() -> (Value, Value, Vec<u32>) {
    let tok = PromptTokenizer::from_dir(&shared().join("tokenizers/qwen3")).unwrap();
    let text = std::fs::read_to_string(shared().join("chat-parity/c002_coding_session_t1.json"))
        .expect("c002");
    let turn1: Value = serde_json::from_str(&text).unwrap();
    let mut turn2 = turn1.clone();
    let msgs = turn2["messages"].as_array_mut().unwrap();
    msgs.push(json!({"role": "assistant", "content": "Here is a first version of the function."}));
    msgs.push(json!({"role": "user", "content": "Now add unit tests for the edge cases."}));
    let ids1 = tok
        .chat_token_ids(&ChatRequest::from_openai(&turn1).unwrap())
        .unwrap();
    assert!(ids1.len() >= 2 * BLOCK);
    (turn1, turn2, ids1)
}

fn pick_request(id: &str, turn: &Value) -> pb::PickRequest {
    let messages = turn["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| pb::ChatMessage {
            role: m["role"].as_str().unwrap().into(),
            content: Some(pb::chat_message::Content::Text(
                m["content"].as_str().unwrap().into(),
            )),
            ..Default::default()
        })
        .collect();
    pb::PickRequest {
        request_id: id.into(),
        model: MODEL.into(),
        api: pb::ApiKind::Chat as i32,
        messages,
        ..Default::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writer_and_reader_replicas_answer_alike() {
    let server = redis().await;
    let pubs = publishers().await;
    let (_, turn2, ids1) = conversation();
    let cached = json!(ids1.len() / BLOCK * BLOCK);

    let writer = app::start(config(&server, &pubs, true))
        .await
        .expect("start writer");
    let reader = app::start(config(&server, &pubs, false))
        .await
        .expect("start reader");
    let (wa, ra) = (Admin::of(&writer), Admin::of(&reader));
    wa.ready().await;
    ra.ready().await;
    // The reader applies nothing: its streams are off.
    assert_eq!(ra.worker("w2").await["stream"]["state"], "disabled");

    pubs[1].publish(&stored(&ids1, 1000)).await.unwrap();
    let from_writer = eventually("writer sees turn 1 on w2", || async {
        let s = wa.score(&turn2).await;
        (matched(&s, "w2") == cached).then_some(s)
    })
    .await;
    assert_eq!(from_writer["chosen"], "w2", "{from_writer}");
    assert_eq!(from_writer["degraded"], false, "{from_writer}");
    assert_eq!(matched(&from_writer, "w1"), json!(0));
    let from_reader = ra.score(&turn2).await;
    assert_eq!(from_reader, from_writer);

    // A replica started later is warm on its first pick.
    let late = app::start(config(&server, &pubs, false))
        .await
        .expect("start late reader");
    let la = Admin::of(&late);
    assert_eq!(la.score(&turn2).await, from_writer);

    // The writer goes away: the readers keep serving what Redis holds.
    writer.shutdown().await;
    let after = ra.score(&turn2).await;
    assert_eq!(after, from_writer);
    let channel = tonic::transport::Channel::from_shared(format!("http://{}", late.grpc_addr))
        .unwrap()
        .connect()
        .await
        .expect("grpc connect");
    let mut client = pb::router_client::RouterClient::new(channel);
    let picked = client
        .pick(pick_request("r-1", &turn2))
        .await
        .expect("pick")
        .into_inner();
    assert_eq!(picked.endpoints[0], ENDPOINTS[1]);
    let d = picked.decision.unwrap();
    assert_eq!(
        d.matched_tokens,
        ids1.len() as u32 / BLOCK as u32 * BLOCK as u32
    );
    assert!(!d.degraded);

    late.shutdown().await;
    reader.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_outage_degrades_picks_then_resyncs() {
    let mut server = redis().await;
    let pubs = publishers().await;
    let (_, turn2, ids1) = conversation();
    let cached = json!(ids1.len() / BLOCK * BLOCK);

    let running = app::start(config(&server, &pubs, true))
        .await
        .expect("start");
    let admin = Admin::of(&running);
    admin.ready().await;
    pubs[0].publish(&stored(&ids1, 1000)).await.unwrap();
    eventually("w1 indexed", || async {
        let s = admin.score(&turn2).await;
        (matched(&s, "w1") == cached).then_some(())
    })
    .await;

    // Redis goes away: picks answer on load only, within a bound.
    server.stop();
    let channel = tonic::transport::Channel::from_shared(format!("http://{}", running.grpc_addr))
        .unwrap()
        .connect()
        .await
        .expect("grpc connect");
    let mut client = pb::router_client::RouterClient::new(channel);
    for i in 0..5 {
        let picked = tokio::time::timeout(
            PICK_BOUND,
            client.pick(pick_request(&format!("down-{i}"), &turn2)),
        )
        .await
        .expect("a pick answers while Redis is down")
        .expect("pick")
        .into_inner();
        assert_eq!(picked.endpoints.len(), 2, "{picked:?}");
        let d = picked.decision.unwrap();
        assert!(d.degraded, "{d:?}");
        assert!(d.reason.starts_with("index_unavailable"), "{d:?}");
        assert_eq!(d.matched_tokens, 0);
    }
    let metrics = admin.metrics().await;
    let degraded = sample(
        &metrics,
        "kvsteer_degraded_picks_total{reason=\"index_unavailable\"",
    );
    assert_eq!(degraded, Some(5.0), "{metrics}");

    // Events published meanwhile fail to apply: the worker needs a resync.
    let extra: Vec<u32> = vec![7; BLOCK];
    pubs[0].publish(&stored(&extra, 9000)).await.unwrap();
    eventually("failed write counted", || async {
        let m = admin.metrics().await;
        (sample(&m, "kvsteer_index_write_errors_total{worker=\"w1\"}") >= Some(1.0)).then_some(())
    })
    .await;

    // Redis is back, empty: the writer purges w1 and replays its buffer.
    server.restart().await.expect("restart redis");
    eventually("lookups warm again", || async {
        let s = admin.score(&turn2).await;
        (s["degraded"] == false && matched(&s, "w1") == cached).then_some(())
    })
    .await;
    let extra_score = admin
        .score(&json!({"model": MODEL, "prompt": extra, "max_tokens": 1}))
        .await;
    assert_eq!(matched(&extra_score, "w1"), json!(BLOCK), "{extra_score}");
    let metrics = admin.metrics().await;
    assert!(
        sample(&metrics, "kvsteer_index_resyncs_total{worker=\"w1\"}") >= Some(1.0),
        "{metrics}"
    );
    assert_eq!(
        sample(&metrics, "kvsteer_index_resyncs_total{worker=\"w2\"}").unwrap_or(0.0),
        0.0,
        "{metrics}"
    );
    running.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn starts_with_redis_down_and_catches_up() {
    let mut server = redis().await;
    server.stop();
    let pubs = publishers().await;
    let (_, turn2, ids1) = conversation();
    let cached = json!(ids1.len() / BLOCK * BLOCK);

    let running = app::start(config(&server, &pubs, true))
        .await
        .expect("starts while Redis is down");
    let admin = Admin::of(&running);
    admin.ready().await;
    pubs[1].publish(&stored(&ids1, 1000)).await.unwrap();
    let score = tokio::time::timeout(PICK_BOUND, admin.score(&turn2))
        .await
        .expect("a dry run answers while Redis is down");
    assert_eq!(score["degraded"], true, "{score}");
    assert_eq!(matched(&score, "w2"), json!(0), "{score}");

    // The startup purge and the batch failed: both are made good once
    // Redis answers.
    server.restart().await.expect("start redis");
    eventually("w2 warm after resync", || async {
        let s = admin.score(&turn2).await;
        (s["degraded"] == false && matched(&s, "w2") == cached).then_some(())
    })
    .await;
    running.shutdown().await;
}
