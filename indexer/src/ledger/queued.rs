//! Prompt blocks picked and not yet prefilled (no first token), per worker.
//!
//! vLLM schedules first come, first served, so a request sent behind one of
//! them to the same worker starts its prefill after theirs: the prefix they
//! share is cached by then, though the index does not show it yet. Without
//! this, past saturation (long queues) every request of a group whose
//! prefix is still queued looks cold everywhere and goes wherever the queue
//! is shortest, each worker prefills the prefix again, and the hit rate
//! collapses with the throughput.
//!
//! Only the per-block counts live here; which request holds which blocks is
//! its ledger entry's (see [`super::Ledger`]).

use crate::keys::{BlockKey, KeyHasher};
use std::collections::HashMap;

pub(super) struct QueuedBlocks {
    /// Per block, how many queued prompts hold it on each worker that has
    /// one (`(slot, count)`; few per block).
    blocks: HashMap<BlockKey, Vec<(u32, u32)>, KeyHasher>,
    /// Blocks of all queued prompts.
    held: usize,
    workers: usize,
}

// === impl QueuedBlocks ===

impl QueuedBlocks {
    pub(super) fn new(workers: usize) -> Self {
        Self {
            blocks: HashMap::with_hasher(KeyHasher),
            held: 0,
            workers,
        }
    }

    pub(super) fn held(&self) -> usize {
        self.held
    }

    /// A prompt with these blocks is queued on `worker` (in range).
    pub(super) fn add(&mut self, worker: usize, keys: &[BlockKey]) {
        let slot = worker as u32;
        for &key in keys {
            let counts = self.blocks.entry(key).or_default();
            match counts.iter_mut().find(|(w, _)| *w == slot) {
                Some((_, n)) => *n += 1,
                None => counts.push((slot, 1)),
            }
        }
        self.held += keys.len();
    }

    /// The prompt [`Self::add`]ed with these blocks is no longer queued.
    pub(super) fn remove(&mut self, worker: usize, keys: &[BlockKey]) {
        self.held = self.held.saturating_sub(keys.len());
        for key in keys {
            let Some(counts) = self.blocks.get_mut(key) else {
                continue;
            };
            let slot = worker as u32;
            if let Some(i) = counts.iter().position(|(w, _)| *w == slot) {
                counts[i].1 -= 1;
                if counts[i].1 == 0 {
                    counts.swap_remove(i);
                }
            }
            if counts.is_empty() {
                self.blocks.remove(key);
            }
        }
    }

    /// Per worker: how many of `keys`' leading blocks a queued prompt
    /// holds there. Block keys chain the whole prefix, so a held block
    /// means its whole prefix is held.
    pub(super) fn lookup(&self, keys: &[BlockKey]) -> Vec<u32> {
        let mut leading = vec![0u32; self.workers];
        for (i, key) in keys.iter().enumerate() {
            let Some(counts) = self.blocks.get(key) else {
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
            if !extended {
                break;
            }
        }
        leading
    }
}
