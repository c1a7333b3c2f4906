//! The golden vectors in `shared/vllm-events/`: decode each payload to the
//! meaning in its `.json`, re-encode it byte for byte, and check the encoder
//! with an independent msgpack decoder (`rmpv`).

use std::path::PathBuf;

use kvsteer_kv_events::{
    BlockHash, BlockStored, DecodeError, Encoding, EventBatch, ExtraKey, KvEvent, SkipReason,
    decode_batch, encode_batch,
};
use serde_json::{Value as Json, json};

fn golden_dir() -> PathBuf {
    let shared = kvsteer_e2e::shared_dir();
    shared.join("vllm-events")
}

struct Vector {
    name: String,
    json: Json,
    payload: Vec<u8>,
}

fn vectors() -> Vec<Vector> {
    let dir = golden_dir();
    let index: Json = serde_json::from_slice(
        &std::fs::read(dir.join("index.json")).expect("index.json in the golden folder"),
    )
    .expect("index.json parses");
    let names: Vec<String> = index["vectors"]
        .as_array()
        .expect("vectors array")
        .iter()
        .map(|v| v["name"].as_str().expect("name").to_owned())
        .collect();
    // Every .msgpack in the folder must be listed.
    let on_disk = std::fs::read_dir(&dir)
        .expect("golden dir")
        .filter(|e| {
            e.as_ref()
                .is_ok_and(|e| e.path().extension().is_some_and(|x| x == "msgpack"))
        })
        .count();
    assert_eq!(on_disk, names.len(), "index.json lists every .msgpack");
    assert!(names.len() >= 16);
    names
        .into_iter()
        .map(|name| {
            let json: Json = serde_json::from_slice(
                &std::fs::read(dir.join(format!("{name}.json"))).expect("vector json"),
            )
            .expect("vector json parses");
            let payload = std::fs::read(dir.join(format!("{name}.msgpack"))).expect("payload");
            Vector {
                name,
                json,
                payload,
            }
        })
        .collect()
}

fn encoding_of(v: &Vector) -> Encoding {
    match v.json["encoding"].as_str() {
        Some("map") => Encoding::Map,
        Some("array") => Encoding::Array,
        other => panic!("{}: unknown encoding {other:?}", v.name),
    }
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn unhex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).expect("hex"))
        .collect()
}

// === meaning → golden JSON schema ===

fn hash_json(h: &BlockHash) -> Json {
    match h {
        BlockHash::U64(v) => json!(v.to_string()),
        BlockHash::Bytes(b) => json!(hex(b)),
    }
}

fn extra_json(v: &ExtraKey) -> Json {
    match v {
        ExtraKey::Nil => Json::Null,
        ExtraKey::Boolean(b) => json!(b),
        ExtraKey::Integer(i) => match (i.as_u64(), i.as_i64()) {
            (Some(u), _) => json!(u),
            (None, Some(s)) => json!(s),
            _ => unreachable!("rmpv ints are u64 or i64"),
        },
        ExtraKey::F32(f) => json!(f),
        ExtraKey::F64(f) => json!(f),
        ExtraKey::String(s) => json!(s.as_str().expect("utf-8")),
        ExtraKey::Binary(b) => json!({ "bytes_hex": hex(b) }),
        ExtraKey::Array(a) => Json::Array(a.iter().map(extra_json).collect()),
        other => panic!("unexpected extra key {other:?}"),
    }
}

fn stored_json(e: &BlockStored) -> Json {
    json!({
        "type": "BlockStored",
        "block_hashes": e.block_hashes.iter().map(hash_json).collect::<Vec<_>>(),
        "parent_block_hash": e.parent_block_hash.as_ref().map(hash_json),
        "token_ids": e.token_ids,
        "block_size": e.block_size,
        "lora_id": e.lora_id,
        "medium": e.medium,
        "lora_name": e.lora_name,
        "extra_keys": e.extra_keys.as_ref().map(|blocks| blocks
            .iter()
            .map(|b| b.as_ref().map(|keys| keys.iter().map(extra_json).collect::<Vec<_>>()))
            .collect::<Vec<_>>()),
        "group_idx": e.group_idx,
        "kv_cache_spec_kind": e.kv_cache_spec_kind,
        "kv_cache_spec_sliding_window": e.kv_cache_spec_sliding_window,
        "locality": e.locality,
        "ownership": e.ownership,
        "session_id": e.session_id,
        "lookahead_token_ids": e.lookahead_token_ids,
    })
}

fn event_json(e: &KvEvent) -> Json {
    match e {
        KvEvent::BlockStored(s) => stored_json(s),
        KvEvent::BlockRemoved(r) => json!({
            "type": "BlockRemoved",
            "block_hashes": r.block_hashes.iter().map(hash_json).collect::<Vec<_>>(),
            "medium": r.medium,
            "group_idx": r.group_idx,
            "locality": r.locality,
            "ownership": r.ownership,
        }),
        KvEvent::AllBlocksCleared => json!({ "type": "AllBlocksCleared" }),
    }
}

/// The golden event without its wire-detail keys.
fn meaning(event: &Json) -> Json {
    let mut m = event.as_object().expect("event object").clone();
    m.retain(|k, _| !k.starts_with("wire_"));
    Json::Object(m)
}

#[test]
fn every_vector_decodes_to_its_meaning() {
    for v in vectors() {
        let d = decode_batch(&v.payload).unwrap_or_else(|e| panic!("{}: {e}", v.name));
        assert!(d.skipped.is_empty(), "{}: skipped {:?}", v.name, d.skipped);
        let ts_bits = u64::from_str_radix(v.json["ts_f64_hex"].as_str().expect("ts hex"), 16)
            .expect("ts hex");
        assert_eq!(d.batch.ts.to_bits(), ts_bits, "{}: ts", v.name);
        assert_eq!(d.batch.ts, v.json["ts"].as_f64().expect("ts"), "{}", v.name);
        assert_eq!(
            json!(d.batch.data_parallel_rank),
            v.json["data_parallel_rank"],
            "{}: data_parallel_rank",
            v.name
        );
        let want = v.json["events"].as_array().expect("events");
        assert_eq!(d.batch.events.len(), want.len(), "{}: event count", v.name);
        for (i, (got, want)) in d.batch.events.iter().zip(want).enumerate() {
            assert_eq!(event_json(got), meaning(want), "{} event {i}", v.name);
        }
    }
}

#[test]
fn every_vector_reencodes_byte_for_byte() {
    for v in vectors() {
        let d = decode_batch(&v.payload).expect("decodes");
        let bytes = encode_batch(&d.batch, encoding_of(&v));
        assert_eq!(hex(&bytes), hex(&v.payload), "{}", v.name);
    }
}

/// The v023 vectors carry the same events as their v033 namesakes, so each
/// form encodes into the other exactly.
#[test]
fn counterparts_encode_into_each_other() {
    let all = vectors();
    let mut pairs = 0;
    for old in all.iter().filter(|v| v.name.starts_with("v023_")) {
        let new_name = old.name.replacen("v023_", "v033_", 1);
        let new = all
            .iter()
            .find(|v| v.name == new_name)
            .expect("counterpart");
        let from_old = decode_batch(&old.payload).expect("decodes").batch;
        let from_new = decode_batch(&new.payload).expect("decodes").batch;
        assert_eq!(from_old, from_new, "{}", old.name);
        assert_eq!(
            encode_batch(&from_old, Encoding::Map),
            new.payload,
            "{}",
            new.name
        );
        assert_eq!(
            encode_batch(&from_new, Encoding::Array),
            old.payload,
            "{}",
            old.name
        );
        pairs += 1;
    }
    assert_eq!(pairs, 3);
}

/// What we encode, read back by `rmpv` (a generic msgpack decoder) and
/// checked against the JSON's wire details.
#[test]
fn encoder_output_checked_with_rmpv() {
    use rmpv::Value;
    for v in vectors() {
        let d = decode_batch(&v.payload).expect("decodes");
        let bytes = encode_batch(&d.batch, encoding_of(&v));
        let mut rd = bytes.as_slice();
        let value = rmpv::decode::read_value(&mut rd).expect("rmpv reads our output");
        assert!(rd.is_empty(), "{}: trailing bytes", v.name);
        let batch = value.as_array().expect("batch array");
        assert_eq!(batch.len(), 3, "{}", v.name);
        let Value::F64(ts) = batch[0] else {
            panic!("{}: ts is not float64", v.name)
        };
        assert_eq!(format!("{:016x}", ts.to_bits()), v.json["ts_f64_hex"]);
        let events = batch[1].as_array().expect("events");
        let want = v.json["events"].as_array().expect("events");
        assert_eq!(events.len(), want.len());
        assert_eq!(batch[2].as_i64(), v.json["data_parallel_rank"].as_i64());
        assert_eq!(batch[2].is_nil(), v.json["data_parallel_rank"].is_null());

        // Locate each event's header in our bytes: it follows the events header.
        let mut offset = 1 + 9 + unhex(v.json["events_header_hex"].as_str().expect("hex")).len();
        for (ev, w) in events.iter().zip(want) {
            let header = unhex(w["wire_header_hex"].as_str().expect("header hex"));
            assert_eq!(&bytes[offset..offset + header.len()], header, "{}", v.name);
            match encoding_of(&v) {
                Encoding::Map => {
                    let keys: Vec<&str> = ev
                        .as_map()
                        .expect("map event")
                        .iter()
                        .map(|(k, _)| k.as_str().expect("str key"))
                        .collect();
                    let wire_keys: Vec<&str> = w["wire_keys"]
                        .as_array()
                        .expect("wire_keys")
                        .iter()
                        .map(|k| k.as_str().expect("key"))
                        .collect();
                    assert_eq!(keys, wire_keys, "{}", v.name);
                    for (k, val) in ev.as_map().expect("map") {
                        let name = k.as_str().expect("key");
                        let meaning = &w[name];
                        if name == "type" {
                            assert_eq!(val.as_str(), meaning.as_str());
                        } else if name.ends_with("hash") || name == "block_hashes" {
                            continue; // compared through the decoder above
                        } else if meaning.is_null() {
                            assert!(val.is_nil(), "{}: {name}", v.name);
                        }
                    }
                }
                Encoding::Array => {
                    let arr = ev.as_array().expect("array event");
                    assert_eq!(Some(arr.len() as u64), w["wire_array_len"].as_u64());
                    assert_eq!(arr[0].as_str(), w["type"].as_str());
                }
            }
            let mut rest = &bytes[offset..];
            rmpv::decode::read_value(&mut rest).expect("event value");
            offset = bytes.len() - rest.len();
        }
    }
}

// === hand-built payloads ===

fn batch_with(events: &[u8], n_events: u8, tail: &[u8]) -> Vec<u8> {
    let mut b = vec![0x93, 0xcb];
    b.extend_from_slice(&1.0f64.to_bits().to_be_bytes());
    b.push(0x90 | n_events);
    b.extend_from_slice(events);
    b.extend_from_slice(tail);
    b
}

fn msgpack(v: &rmpv::Value) -> Vec<u8> {
    let mut out = Vec::new();
    rmpv::encode::write_value(&mut out, v).expect("write");
    out
}

fn stored_fields(with_unknown: bool) -> Vec<(rmpv::Value, rmpv::Value)> {
    use rmpv::Value as V;
    let mut f = vec![
        (
            V::from("block_hashes"),
            V::Array(vec![V::from(7u8), V::from(300u16)]),
        ),
        (
            V::from("token_ids"),
            V::Array(vec![V::from(1u8), V::from(2u8)]),
        ),
        (V::from("block_size"), V::from(2u8)),
        (V::from("medium"), V::from("GPU")),
        (V::from("type"), V::from("BlockStored")),
    ];
    if with_unknown {
        f.push((
            V::from("future_field"),
            V::Map(vec![(V::from("x"), V::from(1))]),
        ));
        f.push((V::from(5), V::from("non-str key")));
    }
    f
}

#[test]
fn fixmap_event_with_small_hashes_and_unknown_keys() {
    let ev = msgpack(&rmpv::Value::Map(stored_fields(true)));
    assert_eq!(ev[0], 0x87, "rmpv writes a fixmap");
    let d = decode_batch(&batch_with(&ev, 1, &[0x00])).expect("decodes");
    let KvEvent::BlockStored(s) = &d.batch.events[0] else {
        panic!("not stored: {d:?}")
    };
    assert_eq!(s.block_hashes, [BlockHash::U64(7), BlockHash::U64(300)]);
    assert_eq!(s.token_ids, [1, 2]);
    assert_eq!(s.medium.as_deref(), Some("GPU"));
    assert_eq!(s.group_idx, None);
}

#[test]
fn map16_and_map32_headers_are_accepted() {
    let fields = stored_fields(false);
    let mut body = Vec::new();
    for (k, v) in &fields {
        body.extend(msgpack(k));
        body.extend(msgpack(v));
    }
    let mut ev16 = vec![0xde, 0x00, fields.len() as u8];
    ev16.extend_from_slice(&body);
    let mut ev32 = vec![0xdf, 0, 0, 0, fields.len() as u8];
    ev32.extend_from_slice(&body);
    let a = decode_batch(&batch_with(&ev16, 1, &[0x00])).expect("map16");
    let b = decode_batch(&batch_with(&ev32, 1, &[0x00])).expect("map32");
    assert_eq!(a, b);
    assert_eq!(a.batch.events.len(), 1);
}

#[test]
fn unknown_type_is_skipped_not_fatal() {
    use rmpv::Value as V;
    let unknown = msgpack(&V::Map(vec![
        (V::from("type"), V::from("BlockMoved")),
        (V::from("block_hashes"), V::from("not even a list")),
    ]));
    let cleared = msgpack(&V::Map(vec![(
        V::from("type"),
        V::from("AllBlocksCleared"),
    )]));
    let unknown_arr = msgpack(&V::Array(vec![V::from("Future"), V::from(1)]));
    let mut events = unknown;
    events.extend(&cleared);
    events.extend(&unknown_arr);
    let d = decode_batch(&batch_with(&events, 3, &[0x01])).expect("decodes");
    assert_eq!(d.batch.events, [KvEvent::AllBlocksCleared]);
    assert_eq!(d.batch.data_parallel_rank, Some(1));
    assert_eq!(d.skipped.len(), 2);
    assert_eq!(d.skipped[0].index, 0);
    assert_eq!(
        d.skipped[0].reason,
        SkipReason::UnknownType("BlockMoved".into())
    );
    assert_eq!(d.skipped[1].index, 2);
}

#[test]
fn malformed_single_event_is_skipped() {
    use rmpv::Value as V;
    let bad_tokens = msgpack(&V::Map(vec![
        (V::from("type"), V::from("BlockStored")),
        (V::from("block_hashes"), V::Array(vec![V::from(1)])),
        (V::from("token_ids"), V::Array(vec![V::from(-1)])),
        (V::from("block_size"), V::from(16)),
    ]));
    let no_hashes = msgpack(&V::Array(vec![V::from("BlockRemoved")]));
    let mut events = bad_tokens;
    events.extend(no_hashes);
    let d = decode_batch(&batch_with(&events, 2, &[0xc0])).expect("decodes");
    assert!(d.batch.events.is_empty());
    assert!(matches!(
        d.skipped[0].reason,
        SkipReason::BadField {
            field: "token_ids",
            ..
        }
    ));
    assert!(matches!(
        d.skipped[1].reason,
        SkipReason::BadField {
            field: "block_hashes",
            ..
        }
    ));
}

#[test]
fn two_element_batch_and_extra_trailing_elements() {
    let two = [0x92, 0xcb, 0, 0, 0, 0, 0, 0, 0, 0, 0x90];
    let d = decode_batch(&two).expect("2-element batch");
    assert_eq!(d.batch, EventBatch::default());
    let mut four = batch_with(&[], 0, &[0x02, 0xa3, b'x', b'y', b'z']);
    four[0] = 0x94;
    let d = decode_batch(&four).expect("4-element batch");
    assert_eq!(d.batch.data_parallel_rank, Some(2));
}

#[test]
fn short_and_long_array_events() {
    use rmpv::Value as V;
    // vLLM 0.11 layout: 7 elements; and a future layout with an extra element.
    let short = msgpack(&V::Array(vec![
        V::from("BlockStored"),
        V::Array(vec![V::from(u64::MAX)]),
        V::Nil,
        V::Array(vec![V::from(5)]),
        V::from(1),
        V::Nil,
        V::from("GPU"),
    ]));
    let mut long_fields = vec![
        V::from("BlockRemoved"),
        V::Array(vec![V::Binary(vec![9; 32])]),
    ];
    long_fields.extend([
        V::from("CPU"),
        V::from(3),
        V::from("local"),
        V::from("own"),
        V::from("extra"),
    ]);
    let long = msgpack(&V::Array(long_fields));
    let mut events = short;
    events.extend(long);
    let d = decode_batch(&batch_with(&events, 2, &[0x00])).expect("decodes");
    assert!(d.skipped.is_empty(), "{:?}", d.skipped);
    let KvEvent::BlockStored(s) = &d.batch.events[0] else {
        panic!("stored")
    };
    assert_eq!(s.block_hashes, [BlockHash::U64(u64::MAX)]);
    assert_eq!(s.lora_name, None);
    assert_eq!(s.group_idx, None);
    let KvEvent::BlockRemoved(r) = &d.batch.events[1] else {
        panic!("removed")
    };
    assert_eq!(r.block_hashes, [BlockHash::Bytes(vec![9; 32])]);
    assert_eq!(r.ownership.as_deref(), Some("own"));
}

#[test]
fn envelope_errors_are_reported() {
    assert_eq!(decode_batch(&[]), Err(DecodeError::Empty));
    assert!(matches!(
        decode_batch(&[0xa1, b'x']),
        Err(DecodeError::NotAnArray { marker: 0xa1 })
    ));
    assert!(matches!(
        decode_batch(&[0x93, 0xc0, 0x90, 0x00]),
        Err(DecodeError::BadTs(_))
    ));
    assert!(matches!(
        decode_batch(&[0x93, 0x00, 0x90, 0xa1, b'x']),
        Err(DecodeError::BadDataParallelRank(_))
    ));
}
