//! vLLM events → key operations, per worker.
//!
//! [`WorkerIngest`] holds what is needed to interpret one worker's stream:
//! its key context, a map engine hash → (our key, copies on GPU, copies on
//! CPU), and which KV-cache groups are not full attention. It never fails:
//! what it cannot apply is counted in [`ApplyStats::skipped`].

use std::collections::HashMap;
use std::collections::hash_map::Entry;

use kvsteer_kv_events::{BlockHash, BlockRemoved, BlockStored, EventBatch, KvEvent};
use xxhash_rust::xxh3::xxh3_64;

use super::extras::classify_extras;
use super::{ApplyStats, KeyOp, Tier};
use crate::keys::KeyHasher;
use crate::keys::{BlockKey, KeyContext, chain_key};

/// A worker's ingest map stops growing here (the engine's cache is far
/// smaller; reaching it means removals were lost: re-sync with `clear_worker`).
pub const MAX_TRACKED_HASHES: usize = 1 << 23;

/// An engine hash as a map key: two `u32`s so a bucket packs into 20 bytes
/// (a `u64` would align it to 24).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct HashId([u32; 2]);

/// One engine hash's copies on this worker (our key split like [`HashId`]).
#[derive(Clone, Copy, Debug)]
struct Slot {
    key: [u32; 2],
    gpu: u16,
    cpu: u16,
}

pub struct WorkerIngest {
    ctx: KeyContext,
    hashes: HashMap<HashId, Slot, KeyHasher>,
    /// `group_idx` values announced with a non-full-attention kind: their
    /// `BlockRemoved` events are ignored (the same hashes live in group 0).
    other_groups: Vec<u32>,
    max_hashes: usize,
    buf: Vec<u8>,
}

// === impl HashId ===

impl HashId {
    fn of(hash: &BlockHash) -> Self {
        let h = engine_hash(hash);
        HashId([h as u32, (h >> 32) as u32])
    }
}

impl std::hash::Hash for HashId {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        state.write_u64(u64::from(self.0[0]) | u64::from(self.0[1]) << 32);
    }
}

// === impl Slot ===

impl Slot {
    fn new(key: BlockKey, tier: Tier) -> Self {
        let mut slot = Slot {
            key: [key.0 as u32, (key.0 >> 32) as u32],
            gpu: 0,
            cpu: 0,
        };
        *slot.count(tier) = 1;
        slot
    }

    fn key(&self) -> BlockKey {
        BlockKey(u64::from(self.key[0]) | u64::from(self.key[1]) << 32)
    }

    fn count(&mut self, tier: Tier) -> &mut u16 {
        match tier {
            Tier::Gpu => &mut self.gpu,
            Tier::Cpu => &mut self.cpu,
        }
    }
}

// === impl WorkerIngest ===

impl WorkerIngest {
    pub fn new(ctx: KeyContext) -> Self {
        Self::with_max_hashes(ctx, MAX_TRACKED_HASHES)
    }

    pub fn with_max_hashes(ctx: KeyContext, max_hashes: usize) -> Self {
        Self {
            ctx,
            hashes: HashMap::default(),
            other_groups: Vec::new(),
            max_hashes,
            buf: Vec::new(),
        }
    }

    pub fn context(&self) -> &KeyContext {
        &self.ctx
    }

    /// Switch context; call [`Self::clear`] first, old keys are stale.
    pub fn set_context(&mut self, ctx: KeyContext) {
        self.ctx = ctx;
    }

    pub fn tracked_hashes(&self) -> usize {
        self.hashes.len()
    }

    /// Estimated heap bytes of the engine-hash map.
    pub fn heap_bytes(&self) -> usize {
        let bucket = size_of::<(HashId, Slot)>() + 1;
        self.hashes.capacity() * bucket * 8 / 7 // hashbrown: buckets = capacity * 8/7
    }

    /// Forget every block; emits a purge per key.
    pub fn clear(&mut self, ops: &mut Vec<KeyOp>) {
        ops.extend(
            self.hashes
                .drain()
                .map(|(_, slot)| KeyOp::Purge(slot.key())),
        );
    }

    /// Interpret `batch`, appending the resulting key operations to `ops`.
    pub fn apply(&mut self, batch: &EventBatch, ops: &mut Vec<KeyOp>) -> ApplyStats {
        let mut stats = ApplyStats::default();
        for event in &batch.events {
            match event {
                KvEvent::BlockStored(stored) => self.store(stored, ops, &mut stats),
                KvEvent::BlockRemoved(removed) => self.remove(removed, ops, &mut stats),
                KvEvent::AllBlocksCleared => {
                    self.clear(ops);
                    stats.cleared = true;
                }
            }
        }
        stats
    }

    fn store(&mut self, ev: &BlockStored, ops: &mut Vec<KeyOp>, stats: &mut ApplyStats) {
        let n = ev.block_hashes.len();
        let skip = |stats: &mut ApplyStats, why: &'static str| {
            tracing::debug!(blocks = n, why, "BlockStored skipped");
            stats.skipped += n.max(1) as u64;
        };
        if n == 0 {
            return skip(stats, "no block hashes");
        }
        let Some(tier) = tier_of(ev.medium.as_deref()) else {
            return skip(stats, "unknown medium");
        };
        if !is_full_attention(ev.kv_cache_spec_kind.as_deref()) {
            if let Some(group) = ev.group_idx
                && !self.other_groups.contains(&group)
            {
                self.other_groups.push(group);
            }
            return skip(stats, "not a full-attention group");
        }
        if ev.token_ids.is_empty() {
            // CPU offloading placeholder: the hash names a block whose tokens we
            // only know from its GPU copy.
            return self.store_placeholders(ev, tier, ops, stats);
        }
        let bs = self.ctx.block_size() as usize;
        if bs == 0 || ev.block_size as usize != bs || ev.token_ids.len() != n * bs {
            return skip(stats, "block size or token count mismatch");
        }
        if ev.extra_keys.as_ref().is_some_and(|e| e.len() != n) {
            return skip(stats, "extra_keys length mismatch");
        }
        if self.hashes.len() + n > self.max_hashes {
            tracing::warn!(
                max = self.max_hashes,
                "ingest map full; removals were probably lost"
            );
            return skip(stats, "ingest map full");
        }
        let parent = match &ev.parent_block_hash {
            Some(parent) => match self.hashes.get(&HashId::of(parent)) {
                Some(slot) => Some(slot.key()),
                None => return skip(stats, "unknown parent"),
            },
            None => None,
        };
        let lora = ev.lora_name.as_deref().filter(|l| !l.is_empty());
        let mut prev = parent.unwrap_or(BlockKey(0));
        for (i, (hash, tokens)) in ev
            .block_hashes
            .iter()
            .zip(ev.token_ids.chunks_exact(bs))
            .enumerate()
        {
            let extras = ev.extra_keys.as_ref().and_then(|e| e[i].as_deref());
            let is_root = parent.is_none() && i == 0;
            let Some(extra) = classify_extras(extras, lora, ev.lora_id, is_root) else {
                stats.skipped += (n - i) as u64;
                return;
            };
            if is_root {
                let ctx = match (lora, ev.lora_id) {
                    (Some(name), _) => self.ctx.with_lora(Some(name)),
                    (None, Some(id)) if id > 0 => self.ctx.with_lora_id(id),
                    _ => self.ctx.clone(),
                };
                prev = ctx.root(extra.salt);
            }
            let key = chain_key(prev, tokens, extra.digest, &mut self.buf);
            prev = key;
            match self.hashes.entry(HashId::of(hash)) {
                Entry::Occupied(slot) if slot.get().key() != key => {
                    tracing::debug!(?key, existing = ?slot.get().key(), "engine hash re-stored with other content");
                    stats.skipped += 1;
                    continue;
                }
                Entry::Occupied(mut slot) => {
                    let count = slot.get_mut().count(tier);
                    *count = count.saturating_add(1);
                }
                Entry::Vacant(slot) => {
                    slot.insert(Slot::new(key, tier));
                }
            }
            ops.push(KeyOp::Add(key, tier));
            stats.stored += 1;
        }
    }

    /// A placeholder (`token_ids` empty, `block_size` 0) is applied to the
    /// key its hash already has on this worker, else skipped: without tokens
    /// no key can be derived, and guessing could only create false hits.
    fn store_placeholders(
        &mut self,
        ev: &BlockStored,
        tier: Tier,
        ops: &mut Vec<KeyOp>,
        stats: &mut ApplyStats,
    ) {
        for hash in &ev.block_hashes {
            match self.hashes.get_mut(&HashId::of(hash)) {
                Some(slot) => {
                    let count = slot.count(tier);
                    *count = count.saturating_add(1);
                    ops.push(KeyOp::Add(slot.key(), tier));
                    stats.stored += 1;
                }
                None => stats.skipped += 1,
            }
        }
    }

    fn remove(&mut self, ev: &BlockRemoved, ops: &mut Vec<KeyOp>, stats: &mut ApplyStats) {
        let n = ev.block_hashes.len() as u64;
        let Some(tier) = tier_of(ev.medium.as_deref()) else {
            stats.skipped += n;
            return;
        };
        if ev.group_idx.is_some_and(|g| self.other_groups.contains(&g)) {
            stats.skipped += n;
            return;
        }
        for hash in &ev.block_hashes {
            let h = HashId::of(hash);
            let Some(slot) = self.hashes.get_mut(&h) else {
                stats.skipped += 1;
                continue;
            };
            let count = slot.count(tier);
            if *count == 0 {
                stats.skipped += 1;
                continue;
            }
            *count -= 1;
            ops.push(KeyOp::Remove(slot.key(), tier));
            stats.removed += 1;
            if slot.gpu == 0 && slot.cpu == 0 {
                self.hashes.remove(&h);
            }
        }
    }
}

/// Total blocks named by a batch's events (to count a batch skipped whole).
pub fn batch_blocks(batch: &EventBatch) -> u64 {
    batch
        .events
        .iter()
        .map(|e| match e {
            KvEvent::BlockStored(s) => s.block_hashes.len().max(1) as u64,
            KvEvent::BlockRemoved(r) => r.block_hashes.len() as u64,
            KvEvent::AllBlocksCleared => 0,
        })
        .sum()
}

/// The engine hash as a u64: the int itself, or the last 8 bytes of a
/// digest read big-endian (what vLLM's u64 form is), or xxh3 of short bytes.
pub fn engine_hash(hash: &BlockHash) -> u64 {
    match hash {
        BlockHash::U64(h) => *h,
        BlockHash::Bytes(b) if b.len() >= 8 => {
            let mut last = [0u8; 8];
            last.copy_from_slice(&b[b.len() - 8..]);
            u64::from_be_bytes(last)
        }
        BlockHash::Bytes(b) => xxh3_64(b),
    }
}

/// `None` or `"GPU"` is the GPU; `"CPU"` the offloading tier; anything else
/// (disk, remote stores) is not modelled and skipped.
pub fn tier_of(medium: Option<&str>) -> Option<Tier> {
    match medium {
        None => Some(Tier::Gpu),
        Some(m) if m.eq_ignore_ascii_case("gpu") || m.eq_ignore_ascii_case("cuda") => {
            Some(Tier::Gpu)
        }
        Some(m) if m.eq_ignore_ascii_case("cpu") => Some(Tier::Cpu),
        Some(_) => None,
    }
}

/// `None` (pre-0.22 engines, placeholders) and full-attention kinds (incl. MLA)
/// are indexed; sliding window, chunked local, mamba, ... are not.
pub fn is_full_attention(kind: Option<&str>) -> bool {
    match kind {
        None => true,
        Some(k) => k.contains("full") || k.starts_with("mla"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn engine_hash_forms() {
        assert_eq!(engine_hash(&BlockHash::U64(7)), 7);
        let mut digest = vec![0xaa; 24];
        digest.extend_from_slice(&7u64.to_be_bytes());
        assert_eq!(engine_hash(&BlockHash::Bytes(digest)), 7);
        assert_ne!(
            engine_hash(&BlockHash::Bytes(vec![1, 2])),
            engine_hash(&BlockHash::Bytes(vec![2, 1]))
        );
    }

    #[test]
    fn ingest_buckets_pack_into_20_bytes() {
        assert_eq!(size_of::<(HashId, Slot)>(), 20);
        let key = BlockKey(0x0123_4567_89ab_cdef);
        assert_eq!(Slot::new(key, Tier::Cpu).key(), key);
    }

    #[test]
    fn media_and_kinds() {
        assert_eq!(tier_of(None), Some(Tier::Gpu));
        assert_eq!(tier_of(Some("GPU")), Some(Tier::Gpu));
        assert_eq!(tier_of(Some("cpu")), Some(Tier::Cpu));
        assert_eq!(tier_of(Some("DISK")), None);
        assert!(is_full_attention(None));
        assert!(is_full_attention(Some("full_attention")));
        assert!(is_full_attention(Some("mla_attention")));
        assert!(!is_full_attention(Some("sliding_window")));
        assert!(!is_full_attention(Some("mamba")));
    }

    #[test]
    fn ingest_map_is_bounded() {
        let mut w = WorkerIngest::with_max_hashes(KeyContext::new("m", None, 1), 2);
        let ev = |h: u64, parent: Option<u64>| {
            KvEvent::BlockStored(BlockStored {
                block_hashes: vec![BlockHash::U64(h)],
                parent_block_hash: parent.map(BlockHash::U64),
                token_ids: vec![h as u32],
                block_size: 1,
                ..BlockStored::default()
            })
        };
        let batch = EventBatch {
            ts: 0.0,
            events: vec![ev(1, None), ev(2, Some(1)), ev(3, Some(2))],
            data_parallel_rank: None,
        };
        let mut ops = Vec::new();
        let stats = w.apply(&batch, &mut ops);
        assert_eq!((stats.stored, stats.skipped, ops.len()), (2, 1, 2));
        assert_eq!(w.tracked_hashes(), 2);
    }
}
