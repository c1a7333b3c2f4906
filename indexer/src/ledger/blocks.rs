//! Prompt blocks of the requests in flight, per worker: held from the pick
//! until the end, and queued (not yet prefilled) until the first token.
//!
//! vLLM schedules first come, first served, so a request sent behind a
//! queued one to the same worker starts its prefill after theirs: the
//! prefix they share is cached by then, though the index does not show it
//! yet. Without this, past saturation (long queues) every request of a
//! group whose prefix is still queued looks cold everywhere and goes
//! wherever the queue is shortest, each worker prefills the prefix again,
//! and the hit rate collapses with the throughput.
//!
//! A block a request in flight holds is one the engine keeps referenced
//! (a running request's KV) or will have by the time a later request is
//! admitted (first come, first served): it already counts as used KV
//! cache. A cached block that nothing holds sits in vLLM's free list and
//! leaves it when a request that hits it is admitted; scoring counts those
//! in the KV blocks a request needs (`scoring::kvsteer`).
//!
//! Only the per-block counts live here; which request holds which blocks is
//! its ledger entry's (see [`super::Ledger`]). The counts are sharded by
//! block key, each shard under its own mutex held for one block at a time,
//! so a pick's lookup and the writers (commits and reports, already
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

/// One worker's count of one block.
#[derive(Debug, Clone, Copy)]
struct Count {
    slot: u32,
    /// Prompts in flight there that hold the block.
    held: u32,
    /// Those of them still queued (no first token).
    queued: u32,
}

/// Per block, its count on each worker that has one (few per block).
type Counts = HashMap<BlockKey, Vec<Count>, KeyHasher>;

/// Per worker, how many of a prompt's leading blocks are held there.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Leading {
    /// By a prompt still queued (no first token).
    pub queued: Vec<u32>,
    /// By a prompt in flight, queued or not.
    pub held: Vec<u32>,
}

pub(super) struct PromptBlocks {
    shards: [Mutex<Counts>; SHARDS],
    /// Blocks of all prompts in flight.
    held: AtomicUsize,
    /// Blocks of all queued prompts.
    queued: AtomicUsize,
    workers: usize,
}

// === impl PromptBlocks ===

impl PromptBlocks {
    pub(super) fn new(workers: usize) -> Self {
        Self {
            shards: std::array::from_fn(|_| Mutex::new(HashMap::with_hasher(KeyHasher))),
            held: AtomicUsize::new(0),
            queued: AtomicUsize::new(0),
            workers,
        }
    }

    pub(super) fn held(&self) -> usize {
        self.held.load(Ordering::Relaxed)
    }

    pub(super) fn queued(&self) -> usize {
        self.queued.load(Ordering::Relaxed)
    }

    fn shard(&self, key: BlockKey) -> &Mutex<Counts> {
        // Keys are chain hashes: their top bits are as good as any.
        &self.shards[(key.0 >> 60) as usize % SHARDS]
    }

    /// A prompt with these blocks is queued on `worker` (in range). Callers
    /// hold the ledger's lock (writers are serialized).
    pub(super) fn add(&self, worker: usize, keys: &[BlockKey]) {
        let slot = worker as u32;
        for &key in keys {
            let mut shard = self.shard(key).lock();
            let counts = shard.entry(key).or_default();
            match counts.iter_mut().find(|c| c.slot == slot) {
                Some(c) => {
                    c.held += 1;
                    c.queued += 1;
                }
                None => counts.push(Count {
                    slot,
                    held: 1,
                    queued: 1,
                }),
            }
        }
        self.held.fetch_add(keys.len(), Ordering::Relaxed);
        self.queued.fetch_add(keys.len(), Ordering::Relaxed);
    }

    /// The prompt [`Self::add`]ed with these blocks got its first token: no
    /// longer queued, still held. Callers hold the ledger's lock.
    pub(super) fn prefilled(&self, worker: usize, keys: &[BlockKey]) {
        self.change(worker, keys, false, true);
    }

    /// The prompt [`Self::add`]ed with these blocks ended (`queued`: before
    /// its first token). Callers hold the ledger's lock.
    pub(super) fn remove(&self, worker: usize, keys: &[BlockKey], queued: bool) {
        self.change(worker, keys, true, queued);
    }

    fn change(&self, worker: usize, keys: &[BlockKey], held: bool, queued: bool) {
        // Writers are serialized: no other update of the totals runs now.
        for (total, on) in [(&self.held, held), (&self.queued, queued)] {
            if on {
                let n = total.load(Ordering::Relaxed);
                total.store(n.saturating_sub(keys.len()), Ordering::Relaxed);
            }
        }
        let slot = worker as u32;
        for key in keys {
            let mut shard = self.shard(*key).lock();
            let Some(counts) = shard.get_mut(key) else {
                continue;
            };
            if let Some(i) = counts.iter().position(|c| c.slot == slot) {
                let c = &mut counts[i];
                if held {
                    c.held = c.held.saturating_sub(1);
                }
                if queued {
                    c.queued = c.queued.saturating_sub(1);
                }
                if c.held == 0 {
                    counts.swap_remove(i);
                }
            }
            if counts.is_empty() {
                shard.remove(key);
            }
        }
    }

    /// Per worker: how many of `keys`' leading blocks a prompt in flight
    /// there holds, and a queued one. Block keys chain the whole prefix, so
    /// a held block means its whole prefix is held.
    pub(super) fn lookup(&self, keys: &[BlockKey]) -> Leading {
        let mut leading = Leading {
            queued: vec![0; self.workers],
            held: vec![0; self.workers],
        };
        for (i, key) in keys.iter().enumerate() {
            let shard = self.shard(*key).lock();
            let Some(counts) = shard.get(key) else {
                break;
            };
            let mut extended = false;
            for c in counts {
                // Only a worker still in a run goes on in it.
                let w = c.slot as usize;
                for (run, on) in [
                    (&mut leading.held, true),
                    (&mut leading.queued, c.queued > 0),
                ] {
                    if let Some(n) = run.get_mut(w)
                        && on
                        && *n as usize == i
                    {
                        *n += 1;
                        extended = true;
                    }
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

#[cfg(test)]
mod tests {
    use super::*;

    fn keys(range: std::ops::Range<u64>) -> Vec<BlockKey> {
        range.map(|k| BlockKey(k << 58 | k)).collect()
    }

    #[test]
    fn a_prompt_is_queued_until_its_first_token_and_held_until_its_end() {
        let b = PromptBlocks::new(2);
        let prompt = keys(0..4);
        b.add(1, &prompt);
        let l = b.lookup(&prompt);
        assert_eq!((l.queued, l.held), (vec![0, 4], vec![0, 4]));
        b.prefilled(1, &prompt);
        let l = b.lookup(&prompt);
        assert_eq!((l.queued, l.held), (vec![0, 0], vec![0, 4]));
        assert_eq!((b.queued(), b.held()), (0, 4));
        b.remove(1, &prompt, false);
        let l = b.lookup(&prompt);
        assert_eq!((l.queued, l.held), (vec![0, 0], vec![0, 0]));
        assert_eq!((b.queued(), b.held()), (0, 0));
        assert!(b.shards.iter().all(|s| s.lock().is_empty()));
    }

    #[test]
    fn the_runs_are_leading_and_per_worker() {
        let b = PromptBlocks::new(3);
        let long = keys(0..6);
        // Worker 0 holds the first 3 blocks (prefilled), worker 2 queues 5.
        b.add(0, &long[..3]);
        b.prefilled(0, &long[..3]);
        b.add(2, &long[..5]);
        let l = b.lookup(&long);
        assert_eq!(l.held, vec![3, 0, 5]);
        assert_eq!(l.queued, vec![0, 0, 5]);
        // A prompt that differs from its first block matches nothing.
        let other = keys(10..16);
        assert_eq!(
            b.lookup(&other),
            Leading {
                queued: vec![0; 3],
                held: vec![0; 3]
            }
        );
        // Ending a queued prompt takes both counts back.
        b.remove(2, &long[..5], true);
        let l = b.lookup(&long);
        assert_eq!((l.queued, l.held), (vec![0; 3], vec![3, 0, 0]));
    }
}
