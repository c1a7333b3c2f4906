//! The paged KV cache: `num_gpu_blocks` blocks with reference counts, a map
//! from block hash to cached block, and the LRU queue of free blocks.
//!
//! A freed block keeps its hash and stays findable until allocation reuses
//! it; only then is it evicted (`BlockRemoved`).

use std::collections::HashMap;

use super::events::CacheEvent;
use super::free_list::FreeList;
use super::request::Lora;

pub(crate) type BlockId = u32;

#[derive(Debug, Clone)]
pub(crate) struct BlockPool {
    ref_cnt: Vec<u32>,
    /// `Some` while the block is registered in `cached`.
    hash: Vec<Option<u64>>,
    cached: HashMap<u64, BlockId>,
    free: FreeList,
    /// Events since the last `take_events`.
    events: Vec<CacheEvent>,
}

// === impl BlockPool ===

impl BlockPool {
    pub(crate) fn new(num_blocks: u32) -> Self {
        Self {
            ref_cnt: vec![0; num_blocks as usize],
            hash: vec![None; num_blocks as usize],
            cached: HashMap::new(),
            free: FreeList::full(num_blocks),
            events: Vec::new(),
        }
    }

    pub(crate) fn num_blocks(&self) -> usize {
        self.ref_cnt.len()
    }

    /// Blocks not referenced by any request (cached or not).
    pub(crate) fn num_free(&self) -> usize {
        self.free.len()
    }

    pub(crate) fn ref_cnt(&self, block: BlockId) -> u32 {
        self.ref_cnt[block as usize]
    }

    /// The longest run of cached blocks matching `hashes` from the start,
    /// at most `max_blocks` long.
    pub(crate) fn longest_hit(&self, hashes: &[u64], max_blocks: usize) -> Vec<BlockId> {
        hashes
            .iter()
            .take(max_blocks)
            .map_while(|h| self.cached.get(h).copied())
            .collect()
    }

    /// Takes a reference on a cached block found by a prefix hit.
    pub(crate) fn touch(&mut self, block: BlockId) {
        if self.ref_cnt[block as usize] == 0 {
            self.free.remove(block);
        }
        self.ref_cnt[block as usize] += 1;
    }

    /// Takes the least recently freed block, evicting its hash if it had one.
    pub(crate) fn allocate(&mut self) -> Option<BlockId> {
        let block = self.free.pop_front()?;
        if let Some(h) = self.hash[block as usize].take() {
            self.cached.remove(&h);
            self.events.push(CacheEvent::Removed {
                block_hashes: vec![h],
            });
        }
        self.ref_cnt[block as usize] = 1;
        Some(block)
    }

    /// Drops one reference on each block, in the order given; blocks reaching
    /// zero join the tail of the free queue (and stay cached).
    pub(crate) fn free(&mut self, blocks: impl IntoIterator<Item = BlockId>) {
        for block in blocks {
            let rc = &mut self.ref_cnt[block as usize];
            debug_assert!(*rc > 0, "double free of block {block}");
            *rc = rc.saturating_sub(1);
            if *rc == 0 && !self.free.contains(block) {
                self.free.push_back(block);
            }
        }
    }

    /// Registers the full blocks `blocks[i]` with hashes `hashes[i]` (the
    /// blocks after `parent`) and records `BlockStored` for them. A hash that
    /// another block already holds leaves its block unregistered and
    /// unannounced, so every `BlockRemoved` matches one `BlockStored`.
    pub(crate) fn cache_full(
        &mut self,
        blocks: &[BlockId],
        hashes: &[u64],
        parent: Option<u64>,
        tokens: &[u32],
        block_size: usize,
        extras: BlockExtras<'_>,
    ) {
        let BlockExtras { lora, cache_salt } = extras;
        debug_assert_eq!(blocks.len(), hashes.len());
        let mut run_start = 0;
        let flush = |events: &mut Vec<CacheEvent>, from: usize, to: usize| {
            if from < to {
                events.push(CacheEvent::Stored {
                    block_hashes: hashes[from..to].to_vec(),
                    parent_block_hash: if from == 0 {
                        parent
                    } else {
                        Some(hashes[from - 1])
                    },
                    token_ids: tokens[from * block_size..to * block_size].to_vec(),
                    lora: lora.cloned(),
                    // Only the request's first block carries the salt.
                    cache_salt: cache_salt
                        .filter(|_| from == 0 && parent.is_none())
                        .map(str::to_owned),
                });
            }
        };
        for (i, (&block, &h)) in blocks.iter().zip(hashes).enumerate() {
            if self.hash[block as usize].is_some() || self.cached.contains_key(&h) {
                flush(&mut self.events, run_start, i);
                run_start = i + 1;
                continue;
            }
            self.hash[block as usize] = Some(h);
            self.cached.insert(h, block);
        }
        flush(&mut self.events, run_start, blocks.len());
    }

    /// Forgets every cached hash (`AllBlocksCleared`). Refused (`false`)
    /// while any block is in use, like vLLM's `BlockPool.reset_prefix_cache`.
    pub(crate) fn reset(&mut self) -> bool {
        if self.free.len() != self.num_blocks() {
            return false;
        }
        self.cached.clear();
        self.hash.iter_mut().for_each(|h| *h = None);
        self.events.push(CacheEvent::Cleared);
        true
    }

    pub(crate) fn has_events(&self) -> bool {
        !self.events.is_empty()
    }

    pub(crate) fn take_events(&mut self) -> Vec<CacheEvent> {
        std::mem::take(&mut self.events)
    }
}

/// What keys a request's blocks besides their tokens (vLLM's extra keys).
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct BlockExtras<'a> {
    pub(crate) lora: Option<&'a Lora>,
    /// The request's `cache_salt` (its first block only).
    pub(crate) cache_salt: Option<&'a str>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn evicts_lru_cached_block_on_reuse() {
        let mut pool = BlockPool::new(2);
        let a = pool.allocate().unwrap();
        let b = pool.allocate().unwrap();
        assert_eq!(pool.allocate(), None);
        pool.cache_full(&[a, b], &[10, 11], None, &[0; 8], 4, BlockExtras::default());
        assert!(
            matches!(&pool.take_events()[..], [CacheEvent::Stored { block_hashes, .. }] if block_hashes == &[10, 11])
        );
        pool.free([b, a]);
        assert_eq!(pool.num_free(), 2);
        // Both still hit.
        assert_eq!(pool.longest_hit(&[10, 11], 5), vec![a, b]);
        assert_eq!(pool.longest_hit(&[10, 11], 1), vec![a]);
        // Reuse evicts b first (freed first).
        assert_eq!(pool.allocate(), Some(b));
        assert_eq!(
            pool.take_events(),
            vec![CacheEvent::Removed {
                block_hashes: vec![11]
            }]
        );
        assert_eq!(pool.longest_hit(&[10, 11], 5), vec![a]);
        // A hit takes the cached block out of the free queue.
        pool.touch(a);
        assert_eq!(pool.num_free(), 0);
        assert!(!pool.reset());
        pool.free([a, b]);
        assert!(pool.reset());
        assert_eq!(pool.take_events(), vec![CacheEvent::Cleared]);
        assert!(pool.longest_hit(&[10], 1).is_empty());
    }

    #[test]
    fn duplicate_hash_is_not_announced_twice() {
        let mut pool = BlockPool::new(4);
        let blocks: Vec<_> = (0..4).map(|_| pool.allocate().unwrap()).collect();
        pool.cache_full(&blocks[..1], &[5], None, &[1, 1], 2, BlockExtras::default());
        pool.take_events();
        pool.cache_full(
            &blocks[1..4],
            &[6, 5, 7],
            Some(4),
            &[1, 2, 3, 4, 5, 6],
            2,
            BlockExtras::default(),
        );
        assert_eq!(
            pool.take_events(),
            vec![
                CacheEvent::Stored {
                    block_hashes: vec![6],
                    parent_block_hash: Some(4),
                    token_ids: vec![1, 2],
                    lora: None,
                    cache_salt: None,
                },
                CacheEvent::Stored {
                    block_hashes: vec![7],
                    parent_block_hash: Some(5),
                    token_ids: vec![5, 6],
                    lora: None,
                    cache_salt: None,
                },
            ]
        );
    }
}
