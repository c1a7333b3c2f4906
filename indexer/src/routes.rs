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
//!
//! Every pick reads both memories and every committed pick writes them, so
//! they have no global lock: blocks are sharded by key (a pick locks each
//! shard its prompt touches once, readers in parallel), each worker's entry
//! count is an atomic kept under the shard lock that changes it, and
//! entries leave on the housekeeping tick ([`RecentRoutes::expire`]), not
//! inside a pick. A lookup ignores entries already past the window, so what
//! the tick has not yet dropped never counts as this prompt's; until the
//! tick, such entries still count in [`Routed::other_blocks`].

use crate::config::ScoringConfig;
use crate::keys::{BlockKey, KeyHasher};
use parking_lot::RwLock;
use std::{
    borrow::Cow,
    collections::{HashMap, VecDeque},
    sync::atomic::{AtomicU64, Ordering::Relaxed},
    time::{Duration, Instant},
};

/// Shards at most; a memory gets fewer when each would keep fewer than
/// [`MIN_SHARD_ENTRIES`] entries (small memories, as in tests, keep one
/// shard, so their bound is exact).
const MAX_SHARDS: usize = 16;
const MIN_SHARD_ENTRIES: usize = 4_096;

/// The prompt blocks routed to each worker within a time window.
pub struct RecentRoutes {
    window: Duration,
    /// Entries each shard keeps at most (oldest dropped first).
    shard_capacity: usize,
    /// `log2` of the shard count.
    shard_bits: u32,
    shards: Box<[RwLock<Shard>]>,
    /// Live (block, worker) entries per worker slot, changed only under the
    /// lock of the shard whose entries change.
    blocks: Box<[AtomicU64]>,
}

/// What the recent routes say about one worker for one prompt, in blocks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Routed {
    /// This prompt's blocks routed to the worker within the window.
    pub prompt_blocks: u32,
    /// Other blocks routed to the worker within the window.
    pub other_blocks: u64,
}

#[derive(Default)]
struct Shard {
    /// Per block, the last time it was routed to each worker that got it
    /// (`(slot, when)`; few per block): one hash lookup per block answers
    /// for every worker, and the size does not grow with the worker slots.
    last: HashMap<BlockKey, Vec<(u32, Instant)>, KeyHasher>,
    /// Routing order, for expiry; stale items (routed again since, or
    /// forgotten) are skipped when they come out.
    order: VecDeque<(Instant, BlockKey, u32)>,
    /// Live entries in `last`.
    entries: usize,
}

// === impl RecentRoutes ===

impl RecentRoutes {
    /// `window` zero: nothing is remembered. `capacity`: entries kept at
    /// most, over all shards.
    pub fn new(workers: usize, window: Duration, capacity: usize) -> Self {
        let shards = (capacity / MIN_SHARD_ENTRIES).clamp(1, MAX_SHARDS);
        // A power of two, so a key's shard is its hash's top bits.
        let shards = if shards.is_power_of_two() {
            shards
        } else {
            shards.next_power_of_two() / 2
        };
        Self {
            window,
            shard_capacity: capacity.div_ceil(shards),
            shard_bits: shards.trailing_zeros(),
            shards: (0..shards).map(|_| RwLock::new(Shard::default())).collect(),
            blocks: (0..workers).map(|_| AtomicU64::new(0)).collect(),
        }
    }

    /// Records that a prompt with these block keys was sent to `worker`.
    pub fn record(&self, worker: usize, keys: &[BlockKey], now: Instant) {
        if self.window.is_zero() || worker >= self.blocks.len() {
            return;
        }
        let slot = worker as u32;
        let grouped = self.by_shard(keys);
        for (shard, keys) in grouped.groups() {
            let mut guard = self.shards[shard].write();
            let Shard {
                last,
                order,
                entries,
            } = &mut *guard;
            let mut added = 0;
            for &key in keys {
                let routed = last.entry(key).or_default();
                match routed.iter_mut().find(|(w, _)| *w == slot) {
                    Some((_, at)) => *at = now,
                    None => {
                        routed.push((slot, now));
                        added += 1;
                    }
                }
                order.push_back((now, key, slot));
            }
            *entries += added;
            self.blocks[worker].fetch_add(added as u64, Relaxed);
            self.drop_front(&mut guard, None);
        }
    }

    /// Per worker: how much of `keys`, and how much else, was routed there
    /// within the window. Changes nothing.
    pub fn lookup(&self, keys: &[BlockKey], now: Instant) -> Vec<Routed> {
        let mut seen = vec![Routed::default(); self.blocks.len()];
        if self.window.is_zero() {
            return seen;
        }
        let cutoff = now.checked_sub(self.window);
        let grouped = self.by_shard(keys);
        for (shard, keys) in grouped.groups() {
            let shard = self.shards[shard].read();
            for key in keys {
                let Some(routed) = shard.last.get(key) else {
                    continue;
                };
                for &(w, at) in routed {
                    if cutoff.is_some_and(|c| at < c) {
                        continue;
                    }
                    if let Some(seen) = seen.get_mut(w as usize) {
                        seen.prompt_blocks += 1;
                    }
                }
            }
        }
        for (routed, blocks) in seen.iter_mut().zip(&self.blocks) {
            routed.other_blocks = blocks
                .load(Relaxed)
                .saturating_sub(u64::from(routed.prompt_blocks));
        }
        seen
    }

    /// Drops the entries routed before the window at `now` (the
    /// housekeeping tick).
    pub fn expire(&self, now: Instant) {
        let Some(cutoff) = now.checked_sub(self.window) else {
            return;
        };
        for shard in self.shards.iter() {
            let mut shard = shard.write();
            self.drop_front(&mut shard, Some(cutoff));
        }
    }

    /// Forgets everything routed to `worker` (its slot is being vacated).
    pub fn forget(&self, worker: usize) {
        let Some(count) = self.blocks.get(worker) else {
            return;
        };
        let slot = worker as u32;
        for shard in self.shards.iter() {
            let mut shard = shard.write();
            let mut removed = 0;
            shard.last.retain(|_, routed| {
                let before = routed.len();
                routed.retain(|&(w, _)| w != slot);
                removed += before - routed.len();
                !routed.is_empty()
            });
            shard.entries -= removed;
            count.fetch_sub(removed as u64, Relaxed);
            // Its items in `order` no longer match an entry: skipped when
            // they come out.
        }
    }

    /// Live entries over all shards (for tests and gauges).
    pub fn entries(&self) -> usize {
        self.shards.iter().map(|s| s.read().entries).sum()
    }

    /// Drops items from the front of `shard`'s order: those routed before
    /// `cutoff`, and the oldest while over the shard's capacity.
    fn drop_front(&self, shard: &mut Shard, cutoff: Option<Instant>) {
        let capacity = self.shard_capacity;
        while let Some(&(at, key, slot)) = shard.order.front() {
            let old = cutoff.is_some_and(|c| at < c);
            if !old && shard.entries <= capacity && shard.order.len() <= 2 * capacity.max(1) {
                break;
            }
            shard.order.pop_front();
            let Some(routed) = shard.last.get_mut(&key) else {
                continue;
            };
            let Some(i) = routed.iter().position(|&(w, t)| w == slot && t == at) else {
                continue;
            };
            routed.swap_remove(i);
            if routed.is_empty() {
                shard.last.remove(&key);
            }
            shard.entries -= 1;
            if let Some(count) = self.blocks.get(slot as usize) {
                count.fetch_sub(1, Relaxed);
            }
        }
    }

    /// `keys` grouped by shard (a counting sort: one pass to count, one to
    /// place), so a pick locks each shard it touches once.
    fn by_shard<'k>(&self, keys: &'k [BlockKey]) -> ByShard<'k> {
        let shards = 1usize << self.shard_bits;
        let mut starts = [0usize; MAX_SHARDS + 1];
        if shards == 1 {
            starts[1] = keys.len();
            return ByShard {
                keys: Cow::Borrowed(keys),
                starts,
                shards,
            };
        }
        let shard_of = |k: &BlockKey| {
            (k.0.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> (64 - self.shard_bits)) as usize
        };
        for k in keys {
            starts[shard_of(k) + 1] += 1;
        }
        for i in 1..starts.len() {
            starts[i] += starts[i - 1];
        }
        let mut next = starts;
        let mut sorted = vec![BlockKey(0); keys.len()];
        for &k in keys {
            let s = shard_of(&k);
            sorted[next[s]] = k;
            next[s] += 1;
        }
        ByShard {
            keys: Cow::Owned(sorted),
            starts,
            shards,
        }
    }
}

/// Keys grouped by shard: shard `s` has `keys[starts[s]..starts[s + 1]]`.
struct ByShard<'k> {
    keys: Cow<'k, [BlockKey]>,
    starts: [usize; MAX_SHARDS + 1],
    shards: usize,
}

impl ByShard<'_> {
    /// `(shard, its keys)` for each shard with keys.
    fn groups(&self) -> impl Iterator<Item = (usize, &[BlockKey])> {
        (0..self.shards).filter_map(|s| {
            let (a, b) = (self.starts[s], self.starts[s + 1]);
            (a < b).then(|| (s, &self.keys[a..b]))
        })
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

    /// Drops what both memories hold from before their windows (the
    /// housekeeping tick).
    pub fn expire(&self, now: Instant) {
        self.recent.expire(now);
        self.placements.expire(now);
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
        // Before the tick, blocks past the window no longer count as the
        // prompt's, but still as the worker's.
        let stale = r.lookup(&keys(0..10), t0 + Duration::from_secs(61));
        assert_eq!(
            stale[0],
            Routed {
                prompt_blocks: 2,
                other_blocks: 8
            }
        );
        r.expire(t0 + Duration::from_secs(61));
        let later = r.lookup(&keys(0..10), t0 + Duration::from_secs(61));
        assert_eq!(
            later[0],
            Routed {
                prompt_blocks: 2,
                other_blocks: 0
            }
        );
        assert_eq!(later[1], Routed::default());
        r.expire(t0 + Duration::from_secs(111));
        assert_eq!(r.entries(), 0);
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
        r.expire(t0 + Duration::from_secs(61));
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

    #[test]
    fn a_sharded_memory_answers_like_one_shard() {
        // 16 shards: the keys of one prompt spread over all of them.
        let big = RecentRoutes::new(3, Duration::from_secs(60), 1 << 18);
        let small = RecentRoutes::new(3, Duration::from_secs(60), 1 << 18 >> 4);
        assert_eq!(big.shards.len(), 16);
        assert_eq!(small.shards.len(), 4);
        let one = RecentRoutes::new(3, Duration::from_secs(60), 1_000);
        assert_eq!(one.shards.len(), 1);
        let t0 = Instant::now();
        let key = |i: u64| BlockKey(i.wrapping_mul(0x2545_f491_4f6c_dd1d));
        let prompt = |r: std::ops::Range<u64>| r.map(key).collect::<Vec<_>>();
        for m in [&big, &small, &one] {
            m.record(0, &prompt(0..100), t0);
            m.record(1, &prompt(0..40), t0 + Duration::from_secs(10));
            m.record(2, &prompt(500..520), t0 + Duration::from_secs(20));
            m.record(0, &prompt(0..30), t0 + Duration::from_secs(40));
        }
        let at = |s| t0 + Duration::from_secs(s);
        for (when, probe) in [
            (30, prompt(0..120)),
            (65, prompt(0..120)),
            (75, prompt(495..520)),
        ] {
            let want = one.lookup(&probe, at(when));
            assert_eq!(big.lookup(&probe, at(when)), want, "at {when}s");
            assert_eq!(small.lookup(&probe, at(when)), want, "at {when}s");
        }
        let want = one.lookup(&prompt(0..120), at(30));
        assert_eq!(want[0].prompt_blocks, 100);
        assert_eq!(want[1].prompt_blocks, 40);
        assert_eq!(want[2].other_blocks, 20);
        for m in [&big, &small, &one] {
            m.expire(at(65));
            // Of 0's blocks, the 30 routed again at 40 s are left; 1's (10 s)
            // and 2's (20 s) are all left.
            assert_eq!(m.entries(), 30 + 40 + 20);
            m.forget(2);
            assert_eq!(m.entries(), 30 + 40);
            assert_eq!(m.lookup(&prompt(0..120), at(65))[0].prompt_blocks, 30);
            m.expire(at(101));
            assert_eq!(m.entries(), 0);
            assert_eq!(
                m.lookup(&prompt(0..120), at(101)),
                vec![Routed::default(); 3]
            );
        }
    }

    #[test]
    fn concurrent_records_keep_each_workers_count_exact() {
        let m = std::sync::Arc::new(RecentRoutes::new(4, Duration::from_secs(600), 1 << 18));
        let t0 = Instant::now();
        std::thread::scope(|s| {
            for w in 0..4u64 {
                let m = &m;
                s.spawn(move || {
                    for i in 0..200u64 {
                        let keys: Vec<_> = (0..16)
                            .map(|b| {
                                BlockKey(
                                    (w * 1_000_000 + i * 16 + b)
                                        .wrapping_mul(0x9e37_79b9_7f4a_7c15),
                                )
                            })
                            .collect();
                        m.record(w as usize, &keys, t0);
                        m.lookup(&keys, t0);
                    }
                });
            }
        });
        let none: Vec<BlockKey> = Vec::new();
        for routed in m.lookup(&none, t0) {
            assert_eq!(routed.other_blocks, 200 * 16);
        }
        assert_eq!(m.entries(), 4 * 200 * 16);
    }
}
