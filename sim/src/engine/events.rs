//! KV-cache events as the core emits them, and their conversion to vLLM's
//! event types (`kvsteer_kv_events`) at the edge.

use kvsteer_kv_events::{BlockHash, BlockRemoved, BlockStored, EventBatch, ExtraKey, KvEvent};

use super::request::Lora;

/// `medium` of every event: vLLM says `GPU` even on CPU engines.
pub const MEDIUM_GPU: &str = "GPU";

/// One change to the set of cached blocks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CacheEvent {
    /// Consecutive blocks of one sequence became full and cached.
    Stored {
        block_hashes: Vec<u64>,
        /// The hash of the block before the first one, `None` at the start.
        parent_block_hash: Option<u64>,
        /// The tokens of all blocks, `block_hashes.len() * block_size` of them.
        token_ids: Vec<u32>,
        /// The adapter the blocks were computed with.
        lora: Option<Lora>,
        /// The request's `cache_salt` when the first block is the request's
        /// first (vLLM adds it to that block's extra keys only).
        cache_salt: Option<String>,
    },
    /// Cached blocks were evicted (one event per block, like vLLM).
    Removed { block_hashes: Vec<u64> },
    /// The prefix cache was reset.
    Cleared,
}

// === impl CacheEvent ===

impl CacheEvent {
    /// The event as vLLM 0.33 fills it for a plain full-attention model.
    pub fn to_kv_event(&self, block_size: usize) -> KvEvent {
        match self {
            Self::Stored {
                block_hashes,
                parent_block_hash,
                token_ids,
                lora,
                cache_salt,
            } => KvEvent::BlockStored(BlockStored {
                block_hashes: block_hashes.iter().map(|&h| BlockHash::U64(h)).collect(),
                parent_block_hash: parent_block_hash.map(BlockHash::U64),
                token_ids: token_ids.clone(),
                block_size: block_size as u32,
                // vLLM 0.32 (`block_pool.py`): `lora_id` is the adapter's
                // `adapter_id`, `lora_name` its name, and each block's extra
                // keys start with the name; `cache_salt` ends the first
                // block's (`_gen_mm_extra_hash_keys`, then the salt at
                // `start_token_idx == 0`).
                lora_id: lora.as_ref().map(|l| l.id),
                medium: Some(MEDIUM_GPU.to_owned()),
                lora_name: lora.as_ref().map(|l| l.name.clone()),
                extra_keys: Some(
                    (0..block_hashes.len())
                        .map(|i| {
                            let mut keys: Vec<ExtraKey> = lora
                                .iter()
                                .map(|l| ExtraKey::from(l.name.as_str()))
                                .collect();
                            if i == 0 {
                                keys.extend(cache_salt.as_deref().map(ExtraKey::from));
                            }
                            (!keys.is_empty()).then_some(keys)
                        })
                        .collect(),
                ),
                group_idx: Some(0),
                kv_cache_spec_kind: Some("full_attention".to_owned()),
                ..BlockStored::default()
            }),
            Self::Removed { block_hashes } => KvEvent::BlockRemoved(BlockRemoved {
                block_hashes: block_hashes.iter().map(|&h| BlockHash::U64(h)).collect(),
                medium: Some(MEDIUM_GPU.to_owned()),
                group_idx: Some(0),
                ..BlockRemoved::default()
            }),
            Self::Cleared => KvEvent::AllBlocksCleared,
        }
    }
}

/// The events of one step as one vLLM batch (`data_parallel_rank` 0).
pub fn to_event_batch(events: &[CacheEvent], block_size: usize, ts: f64) -> EventBatch {
    EventBatch {
        ts,
        events: events.iter().map(|e| e.to_kv_event(block_size)).collect(),
        data_parallel_rank: Some(0),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_adapters_blocks_carry_its_id_name_and_extra_keys_like_vllm_032() {
        let ev = CacheEvent::Stored {
            lora: Some(Lora {
                id: 2,
                name: "sql".into(),
            }),
            block_hashes: vec![1, 2],
            parent_block_hash: None,
            token_ids: (0..32).collect(),
            cache_salt: None,
        };
        let KvEvent::BlockStored(s) = ev.to_kv_event(16) else {
            panic!("not stored")
        };
        assert_eq!((s.lora_id, s.lora_name.as_deref()), (Some(2), Some("sql")));
        let name = vec![ExtraKey::from("sql")];
        assert_eq!(s.extra_keys, Some(vec![Some(name.clone()), Some(name)]));
    }

    #[test]
    fn the_salt_ends_the_first_blocks_extra_keys_only() {
        let ev = CacheEvent::Stored {
            lora: Some(Lora {
                id: 1,
                name: "sql".into(),
            }),
            block_hashes: vec![1, 2],
            parent_block_hash: None,
            token_ids: (0..32).collect(),
            cache_salt: Some("s3cret".into()),
        };
        let KvEvent::BlockStored(s) = ev.to_kv_event(16) else {
            panic!("not stored")
        };
        let (sql, salt) = (ExtraKey::from("sql"), ExtraKey::from("s3cret"));
        assert_eq!(
            s.extra_keys,
            Some(vec![Some(vec![sql.clone(), salt]), Some(vec![sql])])
        );
    }

    #[test]
    fn stored_like_vllm_033() {
        let ev = CacheEvent::Stored {
            lora: None,
            block_hashes: vec![1, 2],
            parent_block_hash: Some(7),
            token_ids: (0..32).collect(),
            cache_salt: None,
        };
        let KvEvent::BlockStored(s) = ev.to_kv_event(16) else {
            panic!("not stored")
        };
        assert_eq!(s.parent_block_hash, Some(BlockHash::U64(7)));
        assert_eq!(s.block_size, 16);
        assert_eq!(s.extra_keys, Some(vec![None, None]));
        assert_eq!(s.group_idx, Some(0));
        assert_eq!(s.kv_cache_spec_kind.as_deref(), Some("full_attention"));
        assert_eq!(s.medium.as_deref(), Some("GPU"));
        let batch = to_event_batch(&[CacheEvent::Cleared], 16, 1.5);
        assert_eq!(batch.events, vec![KvEvent::AllBlocksCleared]);
        assert_eq!(batch.data_parallel_rank, Some(0));
    }
}
