//! Support shared by the service's integration tests: the shared test data,
//! polling with a deadline, a small admin-API client and hand-made engine
//! events. Each test file uses a subset.
#![allow(dead_code)]

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::{
    client::legacy::{Client, connect::HttpConnector},
    rt::TokioExecutor,
};
use kvsteer_kv_events::{BlockHash, BlockStored, EventBatch, KvEvent};
use serde_json::Value;
use std::{future::Future, path::PathBuf, time::Duration};

pub const MODEL: &str = "Qwen/Qwen3-8B";
pub const BLOCK: usize = 16;
pub const WAIT: Duration = Duration::from_secs(20);

pub fn shared() -> PathBuf {
    std::env::var_os("KVSTEER_SHARED")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../../shared")))
}

/// Polls `check` every 50 ms until it yields a value, failing after `WAIT`.
pub async fn eventually<T, F, Fut>(what: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let poll = async {
        loop {
            if let Some(v) = check().await {
                return v;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    };
    tokio::time::timeout(WAIT, poll)
        .await
        .unwrap_or_else(|_| panic!("timed out waiting for {what}"))
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
