//! [`EventBatch`] → payload, byte for byte as vLLM's msgspec encoder writes it.
//!
//! - Batch: `[ts (float64), events, data_parallel_rank (int | nil)]`.
//! - Map form (vLLM 0.33): `"type"` first, then fields in declaration order;
//!   fields without a default are always written (nil included), defaulted
//!   fields only when not nil. msgspec sizes a struct's map header by its
//!   *maximum* key count, so BlockStored (16 possible keys) always gets a
//!   `map16` header while BlockRemoved and AllBlocksCleared get a fixmap.
//! - Array form (vLLM 0.23): `[tag, every 0.23 field]`, nil included; fields
//!   newer than 0.23 are dropped.

use crate::event::{BlockHash, BlockRemoved, BlockStored, Encoding, EventBatch, KvEvent};
use crate::wire::writer::Writer;
use crate::wire::{
    ALL_BLOCKS_CLEARED, BLOCK_REMOVED, BLOCK_STORED, REMOVED_FIELDS, REMOVED_FIELDS_V023,
    STORED_FIELDS, STORED_FIELDS_V023,
};

/// Keys a 0.33 BlockStored always carries: `type` plus its 7 fields without default.
const STORED_REQUIRED_KEYS: usize = 8;
/// Keys a 0.33 BlockRemoved always carries: `type`, `block_hashes`, `medium`.
const REMOVED_REQUIRED_KEYS: usize = 3;

/// Encodes one payload (the third frame of a PUB message).
pub fn encode_batch(batch: &EventBatch, encoding: Encoding) -> Vec<u8> {
    let mut w = Writer::with_capacity(64 + batch.events.len() * 256);
    w.array_len(3);
    w.f64(batch.ts);
    w.array_len(batch.events.len());
    for event in &batch.events {
        match encoding {
            Encoding::Map => map_event(&mut w, event),
            Encoding::Array => array_event(&mut w, event),
        }
    }
    match batch.data_parallel_rank {
        Some(rank) => w.int(rank),
        None => w.nil(),
    }
    w.into_inner()
}

// === map form ===

fn map_event(w: &mut Writer, event: &KvEvent) {
    match event {
        KvEvent::BlockStored(ev) => {
            let optional = [
                ev.extra_keys.is_some(),
                ev.group_idx.is_some(),
                ev.kv_cache_spec_kind.is_some(),
                ev.kv_cache_spec_sliding_window.is_some(),
                ev.locality.is_some(),
                ev.ownership.is_some(),
                ev.session_id.is_some(),
                ev.lookahead_token_ids.is_some(),
            ];
            w.map16_len(STORED_REQUIRED_KEYS + optional.iter().filter(|p| **p).count());
            w.str("type");
            w.str(BLOCK_STORED);
            for (i, name) in STORED_FIELDS.iter().enumerate() {
                let required = i < STORED_REQUIRED_KEYS - 1;
                if required || optional[i + 1 - STORED_REQUIRED_KEYS] {
                    w.str(name);
                    stored_field(w, ev, i);
                }
            }
        }
        KvEvent::BlockRemoved(ev) => {
            let optional = [
                ev.group_idx.is_some(),
                ev.locality.is_some(),
                ev.ownership.is_some(),
            ];
            w.map_len(REMOVED_REQUIRED_KEYS + optional.iter().filter(|p| **p).count());
            w.str("type");
            w.str(BLOCK_REMOVED);
            for (i, name) in REMOVED_FIELDS.iter().enumerate() {
                let required = i < REMOVED_REQUIRED_KEYS - 1;
                if required || optional[i + 1 - REMOVED_REQUIRED_KEYS] {
                    w.str(name);
                    removed_field(w, ev, i);
                }
            }
        }
        KvEvent::AllBlocksCleared => {
            w.map_len(1);
            w.str("type");
            w.str(ALL_BLOCKS_CLEARED);
        }
    }
}

// === array form ===

fn array_event(w: &mut Writer, event: &KvEvent) {
    match event {
        KvEvent::BlockStored(ev) => {
            w.array_len(1 + STORED_FIELDS_V023);
            w.str(BLOCK_STORED);
            (0..STORED_FIELDS_V023).for_each(|i| stored_field(w, ev, i));
        }
        KvEvent::BlockRemoved(ev) => {
            w.array_len(1 + REMOVED_FIELDS_V023);
            w.str(BLOCK_REMOVED);
            (0..REMOVED_FIELDS_V023).for_each(|i| removed_field(w, ev, i));
        }
        KvEvent::AllBlocksCleared => {
            w.array_len(1);
            w.str(ALL_BLOCKS_CLEARED);
        }
    }
}

// === fields (index into STORED_FIELDS / REMOVED_FIELDS) ===

fn stored_field(w: &mut Writer, ev: &BlockStored, i: usize) {
    match i {
        0 => hashes(w, &ev.block_hashes),
        1 => opt(w, ev.parent_block_hash.as_ref(), hash),
        2 => u32_list(w, &ev.token_ids),
        3 => w.uint(u64::from(ev.block_size)),
        4 => opt(w, ev.lora_id, Writer::int),
        5 => opt_str(w, ev.medium.as_deref()),
        6 => opt_str(w, ev.lora_name.as_deref()),
        7 => opt(w, ev.extra_keys.as_ref(), |w, blocks| {
            w.array_len(blocks.len());
            for block in blocks {
                opt(w, block.as_ref(), |w, keys| {
                    w.array_len(keys.len());
                    keys.iter().for_each(|k| w.value(k));
                });
            }
        }),
        8 => opt(w, ev.group_idx, |w, v| w.uint(u64::from(v))),
        9 => opt_str(w, ev.kv_cache_spec_kind.as_deref()),
        10 => opt(w, ev.kv_cache_spec_sliding_window, |w, v| {
            w.uint(u64::from(v));
        }),
        11 => opt_str(w, ev.locality.as_deref()),
        12 => opt_str(w, ev.ownership.as_deref()),
        13 => opt_str(w, ev.session_id.as_deref()),
        _ => opt(w, ev.lookahead_token_ids.as_ref(), |w, lists| {
            w.array_len(lists.len());
            lists.iter().for_each(|l| u32_list(w, l));
        }),
    }
}

fn removed_field(w: &mut Writer, ev: &BlockRemoved, i: usize) {
    match i {
        0 => hashes(w, &ev.block_hashes),
        1 => opt_str(w, ev.medium.as_deref()),
        2 => opt(w, ev.group_idx, |w, v| w.uint(u64::from(v))),
        3 => opt_str(w, ev.locality.as_deref()),
        _ => opt_str(w, ev.ownership.as_deref()),
    }
}

fn hash(w: &mut Writer, h: &BlockHash) {
    match h {
        BlockHash::U64(v) => w.uint(*v),
        BlockHash::Bytes(b) => w.bin(b),
    }
}

fn hashes(w: &mut Writer, hs: &[BlockHash]) {
    w.array_len(hs.len());
    hs.iter().for_each(|h| hash(w, h));
}

fn u32_list(w: &mut Writer, vs: &[u32]) {
    w.array_len(vs.len());
    vs.iter().for_each(|v| w.uint(u64::from(*v)));
}

fn opt<T>(w: &mut Writer, v: Option<T>, f: impl FnOnce(&mut Writer, T)) {
    match v {
        Some(v) => f(w, v),
        None => w.nil(),
    }
}

fn opt_str(w: &mut Writer, v: Option<&str>) {
    opt(w, v, Writer::str);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cleared_with_nil_rank() {
        let batch = EventBatch {
            ts: 1.5,
            events: vec![KvEvent::AllBlocksCleared],
            data_parallel_rank: None,
        };
        let mut want = vec![0x93, 0xcb];
        want.extend_from_slice(&1.5f64.to_bits().to_be_bytes());
        want.extend_from_slice(b"\x91\x81\xa4type\xb0AllBlocksCleared\xc0");
        assert_eq!(encode_batch(&batch, Encoding::Map), want);
    }

    #[test]
    fn stored_map_header_is_map16_even_when_small() {
        let batch = EventBatch {
            events: vec![KvEvent::BlockStored(BlockStored::default())],
            ..EventBatch::default()
        };
        let bytes = encode_batch(&batch, Encoding::Map);
        assert_eq!(&bytes[11..14], &[0xde, 0x00, 0x08]);
        let bytes = encode_batch(&batch, Encoding::Array);
        assert_eq!(bytes[11], 0x9c);
    }
}
