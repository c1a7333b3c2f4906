//! Prompt blocks of the requests in flight (picked, not ended), per worker.
//!
//! A block a request in flight holds is in the worker's GPU cache by the
//! time a request sent behind it starts, and stays there while it runs:
//! - a request not yet prefilled (no first token) prefills it first: vLLM
//!   schedules first come, first served. The index does not show it yet.
//!   Without this, past saturation (long queues) every request of a group
//!   whose prefix is still queued looks cold everywhere and goes wherever
//!   the queue is shortest, each worker prefills the prefix again, and the
//!   hit rate collapses with the throughput;
//! - a running request references it: vLLM does not evict it, and it
//!   already counts as used KV cache. A cached block that nothing holds is
//!   in vLLM's free list (first to be evicted) and leaves it when a request
//!   that hits it is admitted: scoring counts those in the KV blocks a
//!   request needs (`scoring::kvsteer`).
//!
//! Only the per-block counts live here; which request holds which blocks is
//! its ledger entry's (see [`super::Ledger`]). The counts are sharded by
//! block key, each shard under its own mutex held for one block at a time,
//! so a pick's lookup and the writers (commits and ends, already
//! serialized by the ledger's lock) rarely meet. A lookup racing a write
//! may see part of a prompt's blocks: it then counts a shorter run, as if
//! it had come a moment earlier or later.

use crate::keys::{BlockKey, KeyHasher};
use parking_lot::Mutex;
use std::{
    collections::HashMap,
    sync::atomic::{AtomicUsize, Ordering},
};

const SHARDS: usize = 16;

/// Per block, how many prompts in flight hold it on each worker that has
/// one (`(slot, count)`; few per block).
type Counts = HashMap<BlockKey, Vec<(u32, u32)>, KeyHasher>;

pub(super) struct PromptBlocks {
    shards: [Mutex<Counts>; SHARDS],
    /// Blocks of all prompts in flight.
    held: AtomicUsize,
    workers: usize,
}

// === impl PromptBlocks ===

impl PromptBlocks {
    pub(super) fn new(workers: usize) -> Self {
        Self {
            shards: std::array::from_fn(|_| Mutex::new(HashMap::with_hasher(KeyHasher))),
            held: AtomicUsize::new(0),
            workers,
        }
    }

    pub(super) fn held(&self) -> usize {
        self.held.load(Ordering::Relaxed)
    }

    fn shard(&self, key: BlockKey) -> &Mutex<Counts> {
        // Keys are chain hashes: their top bits are as good as any.
        &self.shards[(key.0 >> 60) as usize % SHARDS]
    }

    /// A prompt with these blocks is in flight on `worker` (in range). Callers
    /// hold the ledger's lock (writers are serialized).
    pub(super) fn add(&self, worker: usize, keys: &[BlockKey]) {
        let slot = worker as u32;
        for &key in keys {
            let mut shard = self.shard(key).lock();
            let counts = shard.entry(key).or_default();
            match counts.iter_mut().find(|(w, _)| *w == slot) {
                Some((_, n)) => *n += 1,
                None => counts.push((slot, 1)),
            }
        }
        self.held.fetch_add(keys.len(), Ordering::Relaxed);
    }

    /// The prompt [`Self::add`]ed with these blocks ended. Callers hold the
    /// ledger's lock.
    pub(super) fn remove(&self, worker: usize, keys: &[BlockKey]) {
        // Writers are serialized: no other update of `held` runs now.
        let held = self.held.load(Ordering::Relaxed);
        self.held
            .store(held.saturating_sub(keys.len()), Ordering::Relaxed);
        let slot = worker as u32;
        for key in keys {
            let mut shard = self.shard(*key).lock();
            let Some(counts) = shard.get_mut(key) else {
                continue;
            };
            if let Some(i) = counts.iter().position(|(w, _)| *w == slot) {
                counts[i].1 -= 1;
                if counts[i].1 == 0 {
                    counts.swap_remove(i);
                }
            }
            if counts.is_empty() {
                shard.remove(key);
            }
        }
    }

    /// Per worker: how many of `keys`' leading blocks a prompt in flight
    /// holds there. Block keys chain the whole prefix, so a held block
    /// means its whole prefix is held.
    pub(super) fn lookup(&self, keys: &[BlockKey]) -> Vec<u32> {
        let mut leading = vec![0u32; self.workers];
        for (i, key) in keys.iter().enumerate() {
            let shard = self.shard(*key).lock();
            let Some(counts) = shard.get(key) else {
                break;
            };
            let mut extended = false;
            for &(w, _) in counts {
                // Only a worker still in the run of held blocks goes on.
                if let Some(n) = leading.get_mut(w as usize)
                    && *n as usize == i
                {
                    *n += 1;
                    extended = true;
                }
            }
            drop(shard);
            if !extended {
                break;
            }
        }
        leading
    }
}
