//! The simulator's events, encoded by kvsteer-kv-events, are byte-identical
//! to what vLLM 0.33 sends for the same blocks (golden vectors).

use kvsteer_kv_events::{Encoding, encode_batch};
use kvsteer_sim::engine::{CacheEvent, to_event_batch};
use serde_json::Value;

use kvsteer_e2e::shared_dir as shared;

fn golden(name: &str) -> (Value, Vec<u8>) {
    let dir = shared().join("vllm-events");
    let json: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join(format!("{name}.json"))).unwrap())
            .unwrap();
    let bytes = std::fs::read(dir.join(format!("{name}.msgpack"))).unwrap();
    (json, bytes)
}

fn hash(v: &Value) -> u64 {
    v.as_str().unwrap().parse().unwrap()
}

#[test]
fn block_stored_matches_vllm_033() {
    for name in ["v033_stored_single_block", "v033_stored_chain_3_blocks"] {
        let (json, bytes) = golden(name);
        let ev = &json["events"][0];
        let event = CacheEvent::Stored {
            lora: None,
            cache_salt: None,
            block_hashes: ev["block_hashes"]
                .as_array()
                .unwrap()
                .iter()
                .map(hash)
                .collect(),
            parent_block_hash: (!ev["parent_block_hash"].is_null())
                .then(|| hash(&ev["parent_block_hash"])),
            token_ids: ev["token_ids"]
                .as_array()
                .unwrap()
                .iter()
                .map(|t| t.as_u64().unwrap() as u32)
                .collect(),
        };
        let batch = to_event_batch(&[event], 16, json["ts"].as_f64().unwrap());
        assert_eq!(encode_batch(&batch, Encoding::Map), bytes, "{name}");
    }
}

#[test]
fn block_removed_and_cleared_match_vllm_033() {
    let (json, bytes) = golden("v033_removed_and_cleared");
    let events: Vec<CacheEvent> = json["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| match e["type"].as_str().unwrap() {
            "BlockRemoved" => CacheEvent::Removed {
                block_hashes: e["block_hashes"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(hash)
                    .collect(),
            },
            _ => CacheEvent::Cleared,
        })
        .collect();
    let batch = to_event_batch(&events, 16, json["ts"].as_f64().unwrap());
    assert_eq!(encode_batch(&batch, Encoding::Map), bytes);
}
