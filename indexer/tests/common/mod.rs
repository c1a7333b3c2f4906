//! Support shared by the service's integration tests: the shared test data,
//! polling with a deadline, a small admin-API client and hand-made engine
//! events. Each test file uses a subset.
#![allow(dead_code)]

pub mod fake_kube;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::{
    client::legacy::{Client, connect::HttpConnector},
    rt::TokioExecutor,
};
use kvsteer_kv_events::{BlockHash, BlockStored, EventBatch, KvEvent};
use serde_json::Value;
use std::{future::Future, time::Duration};

pub const MODEL: &str = "Qwen/Qwen3-8B";
pub const BLOCK: usize = 16;
pub const WAIT: Duration = Duration::from_secs(20);

pub use kvsteer_e2e::shared_dir as shared;

/// Polls `check` every 50 ms until it yields a value, failing after `WAIT`.
pub async fn eventually<T, F, Fut>(what: &str, check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    kvsteer_e2e::wait_until(what, WAIT, check)
        .await
        .unwrap_or_else(|e| panic!("{e}"))
}

/// An HTTP JSON client for one base URL (the indexer's admin API, or a worker).
pub struct Admin {
    pub base: String,
    pub client: Client<HttpConnector, Full<Bytes>>,
}

impl Admin {
    pub fn new(base: String) -> Self {
        Self {
            base,
            client: Client::builder(TokioExecutor::new()).build_http(),
        }
    }

    /// Status and body text.
    pub async fn call(&self, method: &str, path: &str, body: Option<&Value>) -> (u16, String) {
        let req = http::Request::builder()
            .method(method)
            .uri(format!("{}{path}", self.base))
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from(
                body.map(Value::to_string).unwrap_or_default(),
            )))
            .unwrap();
        let resp = tokio::time::timeout(WAIT, self.client.request(req))
            .await
            .expect("admin answers")
            .expect("admin request");
        let status = resp.status().as_u16();
        let bytes = resp.into_body().collect().await.unwrap().to_bytes();
        (status, String::from_utf8_lossy(&bytes).into_owned())
    }

    /// Status and body as JSON (`Null` when it is not JSON).
    pub async fn call_json(&self, method: &str, path: &str, body: Option<&Value>) -> (u16, Value) {
        let (status, text) = self.call(method, path, body).await;
        (status, serde_json::from_str(&text).unwrap_or(Value::Null))
    }

    /// One worker's entry of `/debug/workers`.
    pub async fn worker(&self, name: &str) -> Value {
        let (_, v) = self.call_json("GET", "/debug/workers", None).await;
        v["workers"]
            .as_array()
            .unwrap()
            .iter()
            .find(|w| w["name"] == name)
            .cloned()
            .unwrap()
    }
}

/// The engine's `BlockStored` for the full blocks of `ids` (hashes are opaque).
pub fn stored(ids: &[u32], first_hash: u64) -> EventBatch {
    let full = ids.len() / BLOCK * BLOCK;
    EventBatch {
        ts: 1.0,
        events: vec![KvEvent::BlockStored(BlockStored {
            block_hashes: (0..full / BLOCK)
                .map(|i| BlockHash::U64(first_hash + i as u64))
                .collect(),
            parent_block_hash: None,
            token_ids: ids[..full].to_vec(),
            block_size: BLOCK as u32,
            medium: Some("GPU".into()),
            ..Default::default()
        })],
        data_parallel_rank: None,
    }
}

// === simulated engines ===

/// A free loopback port (bound then released; rare collisions are retried
/// by [`Sim::start`]).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A `kvsteer-sim` engine in-process: vLLM's HTTP surface, a real prefix
/// cache, and its KV events published over ZeroMQ (with a replay socket).
pub struct Sim {
    pub addr: std::net::SocketAddr,
    pub kv: String,
    pub replay: String,
    pub handle: kvsteer_sim::server::ServerHandle,
}

impl Sim {
    /// An engine (test profile, time scale 50) on `listen`, publishing its
    /// KV events on `kv` and replaying on `replay`.
    pub async fn try_start(
        listen: std::net::SocketAddr,
        kv: &str,
        replay: &str,
    ) -> Result<kvsteer_sim::server::ServerHandle, kvsteer_sim::server::ServerError> {
        Self::try_start_with(listen, kv, replay, Vec::new()).await
    }

    /// [`Self::try_start`] serving LoRA adapters too.
    pub async fn try_start_with(
        listen: std::net::SocketAddr,
        kv: &str,
        replay: &str,
        lora_modules: Vec<kvsteer_sim::server::LoraModule>,
    ) -> Result<kvsteer_sim::server::ServerHandle, kvsteer_sim::server::ServerError> {
        use kvsteer_kv_events::zmq::PublisherConfig;
        use kvsteer_sim::{engine::EngineConfig, profile::TimingProfile, server};
        let engine = EngineConfig::new(TimingProfile::by_name("test").unwrap());
        server::ServerHandle::start(server::ServerConfig {
            listen,
            served_model_name: MODEL.into(),
            tokenizer_dir: shared().join("tokenizers/qwen3"),
            kv_events: Some(PublisherConfig {
                pub_endpoint: kv.into(),
                replay_endpoint: Some(replay.into()),
                topic: format!("kv@{listen}@{MODEL}"),
                ..Default::default()
            }),
            engine,
            time_scale: 50.0,
            worker_id: listen.to_string(),
            lora_modules,
        })
        .await
    }

    /// Start an engine on free ports (the topic names its HTTP address, so
    /// ports are chosen before binding; a collision picks again).
    pub async fn start() -> Sim {
        Self::start_with(Vec::new()).await
    }

    /// [`Self::start`] serving LoRA adapters too.
    pub async fn start_with(lora_modules: Vec<kvsteer_sim::server::LoraModule>) -> Sim {
        for attempt in 0.. {
            let addr: std::net::SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
            let kv = format!("tcp://127.0.0.1:{}", free_port());
            let replay = format!("tcp://127.0.0.1:{}", free_port());
            match Self::try_start_with(addr, &kv, &replay, lora_modules.clone()).await {
                Ok(handle) => {
                    return Sim {
                        addr,
                        kv,
                        replay,
                        handle,
                    };
                }
                Err(e) if attempt < 5 => eprintln!("retrying sim start: {e}"),
                Err(e) => panic!("start sim: {e}"),
            }
        }
        unreachable!()
    }

    /// The worker's line in an indexer config (`name`, no metrics scrape:
    /// replicas then see identical load and answer identically).
    pub fn worker_yaml(&self, name: &str) -> String {
        format!(
            "  - {{name: {name}, endpoint: '{a}', model: {MODEL}, kv_events: '{k}', replay: '{r}'}}\n",
            a = self.addr,
            k = self.kv,
            r = self.replay,
        )
    }

    /// A non-streamed chat completion on this engine; its JSON reply.
    pub async fn chat(&self, client: &Admin, body: &Value) -> Value {
        let sim = Admin {
            base: format!("http://{}", self.addr),
            client: client.client.clone(),
        };
        let (status, v) = sim
            .call_json("POST", "/v1/chat/completions", Some(body))
            .await;
        assert_eq!(status, 200, "{v}");
        v
    }

    /// Tokens of `body`'s prompt this engine had cached before it ran it
    /// (vLLM's `usage.prompt_tokens_details.cached_tokens`): one probe of
    /// the engine's real prefix cache. The probe itself caches the prompt.
    pub async fn cached_tokens(&self, client: &Admin, body: &Value) -> u64 {
        let mut probe = body.clone();
        probe["max_tokens"] = serde_json::json!(1);
        probe["stream"] = serde_json::json!(false);
        let v = self.chat(client, &probe).await;
        v["usage"]["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .unwrap_or_else(|| panic!("no cached_tokens in {v}"))
    }

    pub async fn shutdown(self) {
        self.handle.shutdown().await;
    }
}

/// A gRPC `Pick` for an OpenAI chat body whose messages are plain text.
pub fn pick_request(id: &str, turn: &Value) -> kvsteer_proto::v1::PickRequest {
    let messages = turn["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| kvsteer_proto::v1::ChatMessage {
            role: m["role"].as_str().unwrap().into(),
            content: Some(kvsteer_proto::v1::chat_message::Content::Text(
                m["content"].as_str().unwrap().into(),
            )),
            ..Default::default()
        })
        .collect();
    kvsteer_proto::v1::PickRequest {
        request_id: id.into(),
        model: MODEL.into(),
        api: kvsteer_proto::v1::ApiKind::Chat as i32,
        messages,
        ..Default::default()
    }
}
