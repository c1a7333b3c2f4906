//! What the router sent where, over time windows: each worker's working
//! set as the router sees it, and the prompts it has taken on.
//!
//! [`RecentRoutes`] remembers which prompt blocks were sent where in the last
//! `route_window_s`: each worker's working set as the router sees it, whether
//! or not the engine still caches (or already caches) those blocks.
//! A second one over `placement_window_s` (minutes) tells which prompts a
//! worker has taken on (their follow-ups come back there) and which prompt
//! prefixes the router has seen at all; [`RouteMemory`] holds both. Neither
//! is per request: the prompts picked and not yet prefilled are the
//! request ledger's ([`crate::ledger`]), which fills [`RouteView::queued`].

use crate::config::ScoringConfig;
use crate::index::memory::MixState;
use crate::keys::BlockKey;
use parking_lot::Mutex;
use std::{
    collections::{HashMap, VecDeque},
    time::{Duration, Instant},
};

/// The prompt blocks routed to each worker within a time window.
pub struct RecentRoutes {
    window: Duration,
    /// Entries kept at most (oldest dropped first).
    capacity: usize,
    inner: Mutex<RoutesInner>,
}

/// What the recent routes say about one worker for one prompt, in blocks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Routed {
    /// This prompt's blocks routed to the worker within the window.
    pub prompt_blocks: u32,
    /// Other blocks routed to the worker within the window.
    pub other_blocks: u64,
}

struct RoutesInner {
    /// Per block, the last time it was routed to each worker that got it
    /// (`(slot, when)`; few per block): one hash lookup per block answers
    /// for every worker, and the size does not grow with the worker slots.
    last: HashMap<BlockKey, Vec<(u32, Instant)>, MixState>,
    /// Routing order, for expiry; stale entries (routed again since) are
    /// skipped when they come out.
    order: VecDeque<(Instant, BlockKey, usize)>,
    /// Live (block, worker) entries per worker.
    blocks: Vec<u64>,
}

// === impl RecentRoutes ===

impl RecentRoutes {
    /// `window` zero: nothing is remembered.
    pub fn new(workers: usize, window: Duration, capacity: usize) -> Self {
        Self {
            window,
            capacity,
            inner: Mutex::new(RoutesInner {
                last: HashMap::with_hasher(MixState),
                order: VecDeque::new(),
                blocks: vec![0; workers],
            }),
        }
    }

    /// Records that a prompt with these block keys was sent to `worker`.
    pub fn record(&self, worker: usize, keys: &[BlockKey], now: Instant) {
        if self.window.is_zero() {
            return;
        }
        let mut inner = self.inner.lock();
        if worker >= inner.blocks.len() {
            return;
        }
        let RoutesInner {
            last,
            order,
            blocks,
        } = &mut *inner;
        let slot = worker as u32;
        for &key in keys {
            let routed = last.entry(key).or_default();
            match routed.iter_mut().find(|(w, _)| *w == slot) {
                Some((_, at)) => *at = now,
                None => {
                    routed.push((slot, now));
                    blocks[worker] += 1;
                }
            }
            order.push_back((now, key, worker));
        }
        inner.expire(now.checked_sub(self.window), self.capacity);
    }

    /// Per worker: how much of `keys`, and how much else, was routed there
    /// within the window.
    pub fn lookup(&self, keys: &[BlockKey], now: Instant) -> Vec<Routed> {
        let mut inner = self.inner.lock();
        let mut seen = vec![Routed::default(); inner.blocks.len()];
        if self.window.is_zero() {
            return seen;
        }
        inner.expire(now.checked_sub(self.window), self.capacity);
        for key in keys {
            let Some(routed) = inner.last.get(key) else {
                continue;
            };
            for &(w, _) in routed {
                if let Some(seen) = seen.get_mut(w as usize) {
                    seen.prompt_blocks += 1;
                }
            }
        }
        for (routed, &blocks) in seen.iter_mut().zip(&inner.blocks) {
            routed.other_blocks = blocks.saturating_sub(u64::from(routed.prompt_blocks));
        }
        seen
    }
}

impl RecentRoutes {
    /// Forgets everything routed to `worker` (its slot is being vacated).
    pub fn forget(&self, worker: usize) {
        let mut inner = self.inner.lock();
        let RoutesInner { last, blocks, .. } = &mut *inner;
        let Some(count) = blocks.get_mut(worker) else {
            return;
        };
        *count = 0;
        let slot = worker as u32;
        last.retain(|_, routed| {
            routed.retain(|&(w, _)| w != slot);
            !routed.is_empty()
        });
        // Its items in `order` no longer match an entry: skipped when they
        // come out.
    }
}

/// The picker's route memories: the working set of the last
/// `route_window_s` (the eviction charge) and the placements of the last
/// `placement_window_s` (what a prompt adds that is new, what each worker
/// has taken on).
pub struct RouteMemory {
    recent: RecentRoutes,
    placements: RecentRoutes,
}

/// Per worker, what each memory (and the ledger's queued prompts) says
/// about one prompt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RouteView {
    pub routed: Vec<Routed>,
    pub placed: Vec<Routed>,
    /// The prompt's leading blocks that a prompt queued there holds (from
    /// the ledger; empty: none anywhere).
    pub queued: Vec<u32>,
}

/// One worker's part of a [`RouteView`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct WorkerRoutes {
    pub routed: Routed,
    pub placed: Routed,
    pub queued_blocks: u32,
}

// === impl RouteMemory ===

impl RouteMemory {
    /// Each memory keeps at most `capacity` (block, worker) entries.
    pub fn new(workers: usize, cfg: &ScoringConfig, capacity: usize) -> Self {
        let memory = |window_s| RecentRoutes::new(workers, Duration::from_secs(window_s), capacity);
        Self {
            recent: memory(cfg.route_window_s),
            placements: memory(cfg.placement_window_s),
        }
    }

    /// What both memories say about `keys` at `now`, with `queued` (the
    /// ledger's queued blocks per worker) alongside.
    pub fn lookup(&self, keys: &[BlockKey], now: Instant, queued: Vec<u32>) -> RouteView {
        RouteView {
            routed: self.recent.lookup(keys, now),
            placed: self.placements.lookup(keys, now),
            queued,
        }
    }

    /// Records that a prompt with these block keys was sent to `worker`.
    pub fn record(&self, worker: usize, keys: &[BlockKey], now: Instant) {
        self.recent.record(worker, keys, now);
        self.placements.record(worker, keys, now);
    }

    /// Forgets `worker` in both memories (its slot is being vacated).
    pub fn forget(&self, worker: usize) {
        self.recent.forget(worker);
        self.placements.forget(worker);
    }
}

// === impl RouteView ===

impl RouteView {
    /// Worker `i`'s part (nothing, for an index out of range).
    pub fn worker(&self, i: usize) -> WorkerRoutes {
        WorkerRoutes {
            routed: self.routed.get(i).copied().unwrap_or_default(),
            placed: self.placed.get(i).copied().unwrap_or_default(),
            queued_blocks: self.queued.get(i).copied().unwrap_or_default(),
        }
    }

    /// The prompt tokens routed to some worker within the placement window
    /// (the most any one got: a prompt routed anywhere is known).
    pub fn seen_tokens(&self, block_size: u32) -> u32 {
        self.placed
            .iter()
            .map(|r| r.prompt_blocks)
            .max()
            .unwrap_or(0)
            .saturating_mul(block_size)
    }
}

impl RoutesInner {
    /// Drops entries routed before `cutoff`, and the oldest beyond `capacity`.
    fn expire(&mut self, cutoff: Option<Instant>, capacity: usize) {
        let mut entries: u64 = self.blocks.iter().sum();
        while let Some(&(at, key, worker)) = self.order.front() {
            let old = cutoff.is_some_and(|c| at < c);
            if !old && entries <= capacity as u64 && self.order.len() <= 2 * capacity.max(1) {
                break;
            }
            self.order.pop_front();
            let Some(routed) = self.last.get_mut(&key) else {
                continue;
            };
            let Some(i) = routed
                .iter()
                .position(|&(w, t)| w as usize == worker && t == at)
            else {
                continue;
            };
            routed.swap_remove(i);
            self.blocks[worker] = self.blocks[worker].saturating_sub(1);
            entries = entries.saturating_sub(1);
            if routed.is_empty() {
                self.last.remove(&key);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys(range: std::ops::Range<u64>) -> Vec<BlockKey> {
        range.map(BlockKey).collect()
    }

    #[test]
    fn recent_routes_are_each_workers_working_set() {
        let r = RecentRoutes::new(2, Duration::from_secs(60), 1_000);
        let t0 = Instant::now();
        r.record(0, &keys(0..10), t0);
        r.record(1, &keys(0..4), t0);
        // A longer prompt extending the first: 10 of its 12 blocks went to 0.
        let seen = r.lookup(&keys(0..12), t0 + Duration::from_secs(1));
        assert_eq!(
            seen[0],
            Routed {
                prompt_blocks: 10,
                other_blocks: 0
            }
        );
        assert_eq!(
            seen[1],
            Routed {
                prompt_blocks: 4,
                other_blocks: 0
            }
        );
        // Another prompt: everything there is someone else's.
        let other = r.lookup(&keys(100..105), t0);
        assert_eq!(
            other[0],
            Routed {
                prompt_blocks: 0,
                other_blocks: 10
            }
        );
        // Routing again keeps blocks alive; the rest leave after the window.
        r.record(0, &keys(0..2), t0 + Duration::from_secs(50));
        let later = r.lookup(&keys(0..10), t0 + Duration::from_secs(61));
        assert_eq!(
            later[0],
            Routed {
                prompt_blocks: 2,
                other_blocks: 0
            }
        );
        assert_eq!(later[1], Routed::default());
        let gone = r.lookup(&keys(0..10), t0 + Duration::from_secs(111));
        assert_eq!(gone, vec![Routed::default(); 2]);
    }

    #[test]
    fn recent_routes_are_bounded_and_can_be_off() {
        let r = RecentRoutes::new(1, Duration::from_secs(60), 8);
        let t0 = Instant::now();
        r.record(0, &keys(0..20), t0);
        let seen = r.lookup(&keys(0..20), t0)[0];
        assert_eq!(seen.prompt_blocks, 8, "the newest 8 are kept");
        assert_eq!(r.lookup(&keys(12..20), t0)[0].prompt_blocks, 8);
        let off = RecentRoutes::new(1, Duration::ZERO, 8);
        off.record(0, &keys(0..4), t0);
        assert_eq!(off.lookup(&keys(0..4), t0), vec![Routed::default()]);
        // Out-of-range workers are ignored.
        r.record(5, &keys(0..4), t0);
    }

    #[test]
    fn a_forgotten_worker_has_routed_nothing_and_its_old_items_expire_harmlessly() {
        let r = RecentRoutes::new(3, Duration::from_secs(60), 1_000);
        let t0 = Instant::now();
        r.record(0, &keys(0..6), t0);
        r.record(1, &keys(0..4), t0);
        r.forget(1);
        let seen = r.lookup(&keys(0..6), t0);
        assert_eq!(seen[1], Routed::default());
        assert_eq!(seen[0].prompt_blocks, 6);
        // The slot's next worker starts from nothing; the old items in the
        // expiry order do not take its entries away.
        r.record(1, &keys(10..12), t0 + Duration::from_secs(30));
        let later = r.lookup(&keys(10..12), t0 + Duration::from_secs(61));
        assert_eq!(later[1].prompt_blocks, 2);
        assert_eq!(later[0], Routed::default());
        r.forget(9);
    }

    #[test]
    fn route_memory_records_both_windows() {
        let m = RouteMemory::new(2, &ScoringConfig::default(), 100);
        let t0 = Instant::now();
        m.record(1, &keys(0..5), t0);
        let view = m.lookup(&keys(0..5), t0, vec![0, 5]);
        assert_eq!(view.worker(1).routed.prompt_blocks, 5);
        assert_eq!(view.worker(1).placed.prompt_blocks, 5);
        assert_eq!(view.worker(1).queued_blocks, 5);
        assert_eq!(view.worker(0), WorkerRoutes::default());
        assert_eq!(view.worker(7), WorkerRoutes::default());
        assert_eq!(view.seen_tokens(16), 80);
    }
}
