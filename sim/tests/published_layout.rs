//! What a running `kvsteer-sim` server publishes, read back with an
//! independent msgpack decoder (`rmpv`) and compared with the layout and
//! meaning that vLLM's own encoder gives the same content in
//! `shared/vllm-events/*.json`: map form as vLLM 0.33, array form as 0.23.

use std::time::Duration;

use kvsteer_kv_events::Encoding;
use kvsteer_kv_events::zmq::{PublisherConfig, fetch_replay};
use kvsteer_sim::engine::EngineConfig;
use kvsteer_sim::profile::TimingProfile;
use kvsteer_sim::server::{ServerConfig, ServerHandle};
use rmpv::Value as Mp;
use serde_json::Value;
use tokio::time::timeout;

const WAIT: Duration = Duration::from_secs(20);

use kvsteer_e2e::shared_dir as shared;

fn golden(name: &str) -> Value {
    let path = shared().join("vllm-events").join(format!("{name}.json"));
    serde_json::from_str(&std::fs::read_to_string(path).expect("golden json")).expect("json")
}

fn config(encoding: Encoding) -> ServerConfig {
    let mut engine = EngineConfig::new(TimingProfile::by_name("test").expect("profile"));
    engine.hash_seed = 7;
    ServerConfig {
        listen: "127.0.0.1:0".parse().expect("addr"),
        served_model_name: "sim-model".into(),
        tokenizer_dir: shared().join("tokenizers/qwen3"),
        kv_events: Some(PublisherConfig {
            pub_endpoint: "tcp://127.0.0.1:0".into(),
            replay_endpoint: Some("tcp://127.0.0.1:0".into()),
            topic: "kv@test@sim-model".into(),
            encoding,
            replay_buffer_batches: 1000,
        }),
        engine,
        time_scale: 100.0,
        worker_id: "w".into(),
        lora_modules: Vec::new(),
    }
}

/// Runs one request and returns every payload the server published, as
/// `rmpv` reads them, via the replay socket (the same bytes as the live stream).
async fn published(encoding: Encoding) -> Vec<Mp> {
    let server = timeout(WAIT, ServerHandle::start(config(encoding)))
        .await
        .expect("start in time")
        .expect("start");
    let body = serde_json::json!({
        "model": "sim-model",
        "prompt": "The quick brown fox jumps over the lazy dog. ".repeat(12),
        "max_tokens": 2,
    });
    let resp = reqwest::Client::new()
        .post(format!("http://{}/v1/completions", server.addr))
        .json(&body)
        .send()
        .await
        .expect("request");
    assert_eq!(resp.status(), 200);
    let (_, replay) = server.kv_endpoints.clone().expect("kv endpoints");
    let replay = replay.expect("replay endpoint");
    let batches = fetch_replay(&replay, 0, WAIT).await.expect("replay");
    server.shutdown().await;
    batches
        .iter()
        .map(|b| {
            let mut rd = &b.payload[..];
            let v = rmpv::decode::read_value(&mut rd).expect("rmpv reads the payload");
            assert!(rd.is_empty(), "trailing bytes after the batch");
            v
        })
        .collect()
}

fn batch_parts(batch: &Mp) -> (&Mp, &[Mp], &Mp) {
    let parts = batch.as_array().expect("batch is an array");
    assert_eq!(parts.len(), 3, "[ts, events, dp_rank]");
    assert!(parts[0].is_f64(), "ts is a float64");
    (&parts[0], parts[1].as_array().expect("events"), &parts[2])
}

/// The meaning every BlockStored of a plain full-attention model carries.
fn check_stored(field: impl Fn(&str) -> Mp, expected: &Value) {
    let hashes = field("block_hashes");
    let n = hashes.as_array().expect("block_hashes").len();
    assert!(n > 0);
    assert!(hashes.as_array().expect("hashes").iter().all(Mp::is_u64));
    let tokens = field("token_ids");
    assert_eq!(tokens.as_array().expect("token_ids").len(), 16 * n);
    assert_eq!(field("block_size").as_u64(), Some(16));
    let parent = field("parent_block_hash");
    assert!(parent.is_nil() || parent.is_u64());
    for (key, want) in [
        ("lora_id", &expected["lora_id"]),
        ("lora_name", &expected["lora_name"]),
        ("medium", &expected["medium"]),
        ("group_idx", &expected["group_idx"]),
        ("kv_cache_spec_kind", &expected["kv_cache_spec_kind"]),
    ] {
        let got = field(key);
        match want {
            Value::Null => assert!(got.is_nil(), "{key}: {got}"),
            Value::String(s) => assert_eq!(got.as_str(), Some(s.as_str()), "{key}"),
            Value::Number(x) => assert_eq!(got.as_u64(), x.as_u64(), "{key}"),
            other => panic!("unexpected golden value {other}"),
        }
    }
    let extra = field("extra_keys");
    let extra = extra.as_array().expect("extra_keys is a list");
    assert_eq!(extra.len(), n);
    assert!(extra.iter().all(Mp::is_nil));
}

#[tokio::test]
async fn map_form_has_vllm_033_keys_and_meaning() {
    let golden = golden("v033_stored_chain_3_blocks");
    let want_keys: Vec<&str> = golden["events"][0]["wire_keys"]
        .as_array()
        .expect("wire_keys")
        .iter()
        .map(|k| k.as_str().expect("key"))
        .collect();
    let batches = published(Encoding::Map).await;
    let mut stored = 0;
    for batch in &batches {
        let (_, events, rank) = batch_parts(batch);
        assert_eq!(rank.as_u64(), golden["data_parallel_rank"].as_u64());
        for ev in events {
            let map = ev.as_map().expect("map-form event");
            let keys: Vec<&str> = map.iter().map(|(k, _)| k.as_str().expect("key")).collect();
            if keys.first() != Some(&"type") {
                panic!("type is not the first key: {keys:?}");
            }
            let field = |name: &str| {
                map.iter()
                    .find(|(k, _)| k.as_str() == Some(name))
                    .map(|(_, v)| v.clone())
                    .unwrap_or(Mp::Nil)
            };
            if field("type").as_str() == Some("BlockStored") {
                assert_eq!(keys, want_keys);
                check_stored(field, &golden["events"][0]);
                stored += 1;
            }
        }
    }
    assert!(stored > 0, "no BlockStored among {} batches", batches.len());
}

#[tokio::test]
async fn array_form_has_vllm_023_positions_and_meaning() {
    let golden = golden("v023_stored_chain_3_blocks");
    let ev0 = &golden["events"][0];
    let positions: Vec<String> = ev0["wire_positional_fields"]
        .as_array()
        .expect("positions")
        .iter()
        .map(|p| p.as_str().expect("name").to_string())
        .collect();
    let batches = published(Encoding::Array).await;
    let mut stored = 0;
    for batch in &batches {
        let (_, events, _) = batch_parts(batch);
        for ev in events {
            let arr = ev.as_array().expect("array-form event");
            if arr.first().and_then(Mp::as_str) != Some("BlockStored") {
                continue;
            }
            assert_eq!(Some(arr.len() as u64), ev0["wire_array_len"].as_u64());
            let field = |name: &str| {
                let i = positions
                    .iter()
                    .position(|p| p == name)
                    .unwrap_or_else(|| panic!("{name} has no position"));
                arr[i].clone()
            };
            check_stored(field, ev0);
            stored += 1;
        }
    }
    assert!(stored > 0, "no BlockStored among {} batches", batches.len());
}
