//! What the router sent where, over two time windows: each worker's
//! working set as the router sees it (`route_window_s`), and the prompts it
//! has taken on (`placement_window_s`, minutes: their follow-ups come back
//! there; and which prompt prefixes the router has seen at all).
//!
//! Both windows are views of one record: per prompt block, the last time it
//! was routed to each worker. A pick looks each of its blocks up once for
//! both windows and a commit records each once (with two separate memories
//! a warm 1k-token pick of token ids took 15 µs, 7 µs of it without any;
//! see `indexer/README.md`, "Pick latency under concurrency"). Neither
//! window is per request: the prompts in flight (picked, not ended) are
//! the request ledger's ([`crate::ledger`]), which fills
//! [`RouteView::held`].
//!
//! One mutex guards the record, held for a lookup or an insert (a few
//! microseconds), never across an await. Every pick both reads and writes
//! the record, so it is not read-mostly state: a read-write lock (readers
//! and writers on every pick) and a 16-way sharded record (a shard lock
//! per block, twice per pick) were both measured slower than the mutex
//! (`indexer/README.md`, "Pick latency under concurrency"). Lookups change nothing; entries
//! leave on the housekeeping tick ([`RouteMemory::expire`]), never inside a pick. A
//! lookup ignores entries already past a window, so what the tick has not
//! yet dropped never counts as this prompt's; until the tick, such entries
//! still count in [`Routed::other_blocks`].

use crate::config::ScoringConfig;
use crate::keys::{BlockKey, KeyHasher};
use parking_lot::Mutex;
use std::{
    collections::{HashMap, VecDeque},
    time::{Duration, Instant},
};

/// The windows, in the order of [`Entry::live`].
const ROUTED: usize = 0;
const PLACED: usize = 1;

/// The prompt blocks routed to each worker within two time windows.
pub struct RouteMemory {
    /// `route_window_s`, `placement_window_s`; zero: that window is off.
    spans: [Duration; 2],
    /// (block, worker) entries kept at most (oldest dropped first).
    capacity: usize,
    inner: Mutex<Inner>,
}

/// What one window says about one worker for one prompt, in blocks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Routed {
    /// This prompt's blocks routed to the worker within the window.
    pub prompt_blocks: u32,
    /// Other blocks routed to the worker within the window.
    pub other_blocks: u64,
}

struct Inner {
    /// Per block, the workers it was routed to (few per block): one hash
    /// lookup per block answers for every worker and both windows.
    last: HashMap<BlockKey, Vec<Entry>, KeyHasher>,
    /// Routing order; items whose entry was routed again since (or
    /// forgotten) are stale and skipped.
    order: VecDeque<(Instant, BlockKey, u32)>,
    /// Per window: how many items of `order` (from the front) its expiry
    /// has passed, and the live entries per worker slot.
    passed: [usize; 2],
    blocks: [Vec<u64>; 2],
    /// Entries in `last`.
    entries: usize,
}

#[derive(Debug, Clone, Copy)]
struct Entry {
    slot: u32,
    at: Instant,
    /// Counted in each window (until its expiry passes `at`).
    live: [bool; 2],
}

/// Per worker, what each window (and the ledger's prompts in flight) says
/// about one prompt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RouteView {
    pub routed: Vec<Routed>,
    pub placed: Vec<Routed>,
    /// The prompt's leading blocks that a prompt in flight there holds
    /// (from the ledger; empty: none anywhere).
    pub held: Vec<u32>,
}

/// One worker's part of a [`RouteView`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct WorkerRoutes {
    pub routed: Routed,
    pub placed: Routed,
    pub held_blocks: u32,
}

// === impl RouteMemory ===

impl RouteMemory {
    /// The windows of `cfg`; at most `capacity` (block, worker) entries.
    pub fn new(workers: usize, cfg: &ScoringConfig, capacity: usize) -> Self {
        Self::with_windows(
            workers,
            Duration::from_secs(cfg.route_window_s),
            Duration::from_secs(cfg.placement_window_s),
            capacity,
        )
    }

    /// A memory over a route window and a placement window (zero: off).
    pub fn with_windows(
        workers: usize,
        routed: Duration,
        placed: Duration,
        capacity: usize,
    ) -> Self {
        Self {
            spans: [routed, placed],
            capacity,
            inner: Mutex::new(Inner {
                last: HashMap::with_hasher(KeyHasher),
                order: VecDeque::new(),
                passed: [0; 2],
                blocks: [vec![0; workers], vec![0; workers]],
                entries: 0,
            }),
        }
    }

    fn enabled(&self) -> [bool; 2] {
        self.spans.map(|s| !s.is_zero())
    }

    /// Records that a prompt with these block keys was sent to `worker`.
    pub fn record(&self, worker: usize, keys: &[BlockKey], now: Instant) {
        let enabled = self.enabled();
        if enabled == [false; 2] {
            return;
        }
        let mut guard = self.inner.lock();
        let inner = &mut *guard;
        if worker >= inner.blocks[ROUTED].len() {
            return;
        }
        let slot = worker as u32;
        for &key in keys {
            let entries = inner.last.entry(key).or_default();
            match entries.iter_mut().find(|e| e.slot == slot) {
                Some(e) => {
                    e.at = now;
                    for w in [ROUTED, PLACED] {
                        if enabled[w] && !e.live[w] {
                            e.live[w] = true;
                            inner.blocks[w][worker] += 1;
                        }
                    }
                }
                None => {
                    entries.push(Entry {
                        slot,
                        at: now,
                        live: enabled,
                    });
                    inner.entries += 1;
                    for w in [ROUTED, PLACED] {
                        if enabled[w] {
                            inner.blocks[w][worker] += 1;
                        }
                    }
                }
            }
            inner.order.push_back((now, key, slot));
        }
        inner.bound(self.capacity);
    }

    /// What both windows say about `keys` at `now`, with `held` (the
    /// ledger's held blocks per worker) alongside. Changes nothing.
    pub fn lookup(&self, keys: &[BlockKey], now: Instant, held: Vec<u32>) -> RouteView {
        let inner = self.inner.lock();
        let workers = inner.blocks[ROUTED].len();
        let mut seen = [
            vec![Routed::default(); workers],
            vec![Routed::default(); workers],
        ];
        let enabled = self.enabled();
        // `None`: a window reaching back past the clock's start.
        let cutoffs = self.spans.map(|s| now.checked_sub(s));
        if enabled != [false; 2] {
            for key in keys {
                let Some(entries) = inner.last.get(key) else {
                    continue;
                };
                for e in entries {
                    for w in [ROUTED, PLACED] {
                        let within = enabled[w] && cutoffs[w].is_none_or(|c| e.at >= c);
                        if within
                            && e.live[w]
                            && let Some(r) = seen[w].get_mut(e.slot as usize)
                        {
                            r.prompt_blocks += 1;
                        }
                    }
                }
            }
        }
        for w in [ROUTED, PLACED] {
            for (r, &blocks) in seen[w].iter_mut().zip(&inner.blocks[w]) {
                r.other_blocks = blocks.saturating_sub(u64::from(r.prompt_blocks));
            }
        }
        let [routed, placed] = seen;
        RouteView {
            routed,
            placed,
            held,
        }
    }

    /// Passes each window's expiry over what was routed before it at `now`,
    /// and drops the entries out of both (the housekeeping tick).
    ///
    /// `held`: how many blocks the workers' KV caches hold together (`None`:
    /// unknown). The route window then also ends where the blocks routed
    /// within it exceed that: an LRU cache keeps the most recent blocks it
    /// was sent, so routes older than what all the caches can hold are
    /// evicted everywhere, and counting them charged every placement alike.
    /// Returns how far back the route window reaches now (`None`: nothing
    /// routed within it).
    pub fn expire(&self, now: Instant, held: Option<u64>) -> Option<Duration> {
        let mut inner = self.inner.lock();
        for w in [ROUTED, PLACED] {
            if let Some(cutoff) = now.checked_sub(self.spans[w]) {
                inner.pass(w, cutoff);
            }
        }
        if let Some(held) = held
            && !self.spans[ROUTED].is_zero()
        {
            inner.hold(ROUTED, held);
        }
        inner.drop_passed();
        inner.bound(self.capacity);
        inner
            .reach(ROUTED)
            .map(|at| now.saturating_duration_since(at))
    }

    /// Forgets everything routed to `worker` (its slot is being vacated).
    pub fn forget(&self, worker: usize) {
        let mut guard = self.inner.lock();
        let inner = &mut *guard;
        if worker >= inner.blocks[ROUTED].len() {
            return;
        }
        let slot = worker as u32;
        let mut removed = 0;
        inner.last.retain(|_, entries| {
            let before = entries.len();
            entries.retain(|e| e.slot != slot);
            removed += before - entries.len();
            !entries.is_empty()
        });
        inner.entries -= removed;
        for w in [ROUTED, PLACED] {
            inner.blocks[w][worker] = 0;
        }
        // Its items in `order` no longer match an entry: skipped.
    }

    /// Ends the route window of everything routed to `worker`, whose cache
    /// was emptied: none of it is cached there any more, so it no longer
    /// counts as the worker's working set (what a placement there would
    /// evict) nor as a prompt routed there. The placement window keeps it:
    /// where the router placed a prompt is still where its follow-ups go.
    pub fn cleared(&self, worker: usize) {
        let mut guard = self.inner.lock();
        let inner = &mut *guard;
        if worker >= inner.blocks[ROUTED].len() {
            return;
        }
        let slot = worker as u32;
        for entries in inner.last.values_mut() {
            for e in entries.iter_mut().filter(|e| e.slot == slot) {
                e.live[ROUTED] = false;
            }
        }
        inner.blocks[ROUTED][worker] = 0;
    }

    /// Live (block, worker) entries.
    pub fn entries(&self) -> usize {
        self.inner.lock().entries
    }
}

// === impl Inner ===

impl Inner {
    /// Window `w`'s expiry passes the items routed before `cutoff` (in
    /// routing order: it stops at the first one routed later).
    fn pass(&mut self, w: usize, cutoff: Instant) {
        while self
            .order
            .get(self.passed[w])
            .is_some_and(|&(at, _, _)| at < cutoff)
        {
            self.pass_next(w);
        }
    }

    /// Window `w`'s expiry passes the oldest items it counts until it
    /// counts at most `held` blocks over all workers.
    fn hold(&mut self, w: usize, held: u64) {
        let mut counted: u64 = self.blocks[w].iter().sum();
        while counted > held {
            match self.pass_next(w) {
                Some(uncounted) => counted -= u64::from(uncounted),
                None => break,
            }
        }
    }

    /// Window `w`'s expiry passes the next item: whether that uncounted a
    /// block (`None`: no item left).
    fn pass_next(&mut self, w: usize) -> Option<bool> {
        let &(at, key, slot) = self.order.get(self.passed[w])?;
        self.passed[w] += 1;
        let Some(e) = self.entry_mut(key, slot, at) else {
            return Some(false);
        };
        if !e.live[w] {
            return Some(false);
        }
        e.live[w] = false;
        self.blocks[w][slot as usize] -= 1;
        Some(true)
    }

    /// When the oldest item window `w`'s expiry has not passed was routed:
    /// the window reaches back to there.
    fn reach(&self, w: usize) -> Option<Instant> {
        self.order.get(self.passed[w]).map(|&(at, _, _)| at)
    }

    /// Drops the items both windows' expiries have passed, and their
    /// entries (which neither window counts any more).
    fn drop_passed(&mut self) {
        while self.passed[ROUTED].min(self.passed[PLACED]) > 0 {
            self.pop_front();
        }
    }

    /// Drops the oldest items while over `capacity` entries (or while the
    /// order holds over twice that many items, stale ones included).
    fn bound(&mut self, capacity: usize) {
        while self.entries > capacity || self.order.len() > 2 * capacity.max(1) {
            if !self.pop_front() {
                break;
            }
        }
    }

    /// Pops the oldest item and the entry it stands for (uncounted from
    /// the windows that still count it). False when the order is empty.
    fn pop_front(&mut self) -> bool {
        let Some((at, key, slot)) = self.order.pop_front() else {
            return false;
        };
        for p in &mut self.passed {
            *p = p.saturating_sub(1);
        }
        let Some(entries) = self.last.get_mut(&key) else {
            return true;
        };
        let Some(i) = entries.iter().position(|e| e.slot == slot && e.at == at) else {
            return true;
        };
        let e = entries.swap_remove(i);
        if entries.is_empty() {
            self.last.remove(&key);
        }
        self.entries -= 1;
        for w in [ROUTED, PLACED] {
            if e.live[w] {
                self.blocks[w][slot as usize] -= 1;
            }
        }
        true
    }

    /// The entry an order item stands for, unless it was routed again
    /// since (or forgotten).
    fn entry_mut(&mut self, key: BlockKey, slot: u32, at: Instant) -> Option<&mut Entry> {
        self.last
            .get_mut(&key)?
            .iter_mut()
            .find(|e| e.slot == slot && e.at == at)
    }
}

// === impl RouteView ===

impl RouteView {
    /// Worker `i`'s part (nothing, for an index out of range).
    pub fn worker(&self, i: usize) -> WorkerRoutes {
        WorkerRoutes {
            routed: self.routed.get(i).copied().unwrap_or_default(),
            placed: self.placed.get(i).copied().unwrap_or_default(),
            held_blocks: self.held.get(i).copied().unwrap_or_default(),
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

    /// A memory with only the route window (60 s).
    fn routed_only(workers: usize, capacity: usize) -> RouteMemory {
        RouteMemory::with_windows(workers, Duration::from_secs(60), Duration::ZERO, capacity)
    }

    fn routed(m: &RouteMemory, k: &[BlockKey], now: Instant) -> Vec<Routed> {
        m.lookup(k, now, Vec::new()).routed
    }

    #[test]
    fn routes_are_each_workers_working_set() {
        let r = routed_only(2, 1_000);
        let t0 = Instant::now();
        r.record(0, &keys(0..10), t0);
        r.record(1, &keys(0..4), t0);
        // A longer prompt extending the first: 10 of its 12 blocks went to 0.
        let seen = routed(&r, &keys(0..12), t0 + Duration::from_secs(1));
        let blocks = |prompt_blocks, other_blocks| Routed {
            prompt_blocks,
            other_blocks,
        };
        assert_eq!(seen[0], blocks(10, 0));
        assert_eq!(seen[1], blocks(4, 0));
        // Another prompt: everything there is someone else's.
        assert_eq!(routed(&r, &keys(100..105), t0)[0], blocks(0, 10));
        // Routing again keeps blocks alive; the rest leave after the window.
        r.record(0, &keys(0..2), t0 + Duration::from_secs(50));
        // Before the tick, blocks past the window no longer count as the
        // prompt's, but still as the worker's.
        let stale = routed(&r, &keys(0..10), t0 + Duration::from_secs(61));
        assert_eq!(stale[0], blocks(2, 8));
        r.expire(t0 + Duration::from_secs(61), None);
        let later = routed(&r, &keys(0..10), t0 + Duration::from_secs(61));
        assert_eq!(later[0], blocks(2, 0));
        assert_eq!(later[1], Routed::default());
        assert_eq!(r.entries(), 2);
        r.expire(t0 + Duration::from_secs(111), None);
        assert_eq!(r.entries(), 0);
        let gone = routed(&r, &keys(0..10), t0 + Duration::from_secs(111));
        assert_eq!(gone, vec![Routed::default(); 2]);
    }

    #[test]
    fn routes_are_bounded_and_can_be_off() {
        let r = routed_only(1, 8);
        let t0 = Instant::now();
        r.record(0, &keys(0..20), t0);
        assert_eq!(
            routed(&r, &keys(0..20), t0)[0].prompt_blocks,
            8,
            "the newest 8 are kept"
        );
        assert_eq!(routed(&r, &keys(12..20), t0)[0].prompt_blocks, 8);
        assert_eq!(r.entries(), 8);
        let off = RouteMemory::with_windows(1, Duration::ZERO, Duration::ZERO, 8);
        off.record(0, &keys(0..4), t0);
        assert_eq!(off.entries(), 0);
        let view = off.lookup(&keys(0..4), t0, vec![1]);
        assert_eq!(view.worker(0).routed, Routed::default());
        assert_eq!(view.worker(0).placed, Routed::default());
        // Out-of-range workers are ignored.
        r.record(5, &keys(0..4), t0);
        r.forget(5);
        assert_eq!(r.entries(), 8);
    }

    #[test]
    fn the_route_window_ends_where_the_caches_are_full() {
        let r =
            RouteMemory::with_windows(2, Duration::from_secs(60), Duration::from_secs(600), 1_000);
        let t0 = Instant::now();
        let at = |s| t0 + Duration::from_secs(s);
        r.record(0, &keys(0..6), at(0));
        r.record(1, &keys(10..14), at(10));
        r.record(0, &keys(20..24), at(20));
        // Block 0 routed again: its first routing no longer counts.
        r.record(1, &keys(0..1), at(25));
        r.record(0, &keys(0..1), at(30));
        // 15 blocks routed within the window; the caches hold 10 together:
        // the oldest routes leave it (block 0 stays, routed again at 30 s).
        assert_eq!(r.expire(at(30), Some(10)), Some(Duration::from_secs(20)));
        let view = r.lookup(&keys(0..30), at(30), Vec::new());
        assert_eq!(view.worker(0).routed.prompt_blocks, 5, "0 and 20..24");
        assert_eq!(view.worker(1).routed.prompt_blocks, 5, "10..14 and 0");
        assert_eq!(view.worker(0).placed.prompt_blocks, 10, "placements stay");
        // Room for all of it: the time window alone (60 s).
        assert_eq!(r.expire(at(30), Some(100)), Some(Duration::from_secs(20)));
        assert_eq!(r.expire(at(50), None), Some(Duration::from_secs(40)));
        assert_eq!(r.expire(at(100), None), None, "nothing routed within 60 s");
        let off = routed_only(1, 100);
        off.record(0, &keys(0..8), at(0));
        assert_eq!(off.expire(at(1), Some(0)), None, "nothing held: all out");
        assert_eq!(
            off.lookup(&keys(0..8), at(1), Vec::new()).worker(0).routed,
            Routed::default()
        );
    }

    #[test]
    fn a_cleared_worker_keeps_its_placements_but_no_working_set() {
        let r =
            RouteMemory::with_windows(2, Duration::from_secs(60), Duration::from_secs(600), 1_000);
        let t0 = Instant::now();
        r.record(0, &keys(0..6), t0);
        r.record(1, &keys(0..4), t0);
        r.cleared(0);
        let view = r.lookup(&keys(0..6), t0, Vec::new());
        assert_eq!(view.worker(0).routed, Routed::default());
        assert_eq!(
            view.worker(1).routed.prompt_blocks,
            4,
            "the other worker is untouched"
        );
        assert_eq!(view.worker(0).placed.prompt_blocks, 6, "placements stay");
        // Routed again after the clear: counted afresh, once.
        r.record(0, &keys(0..2), t0 + Duration::from_secs(10));
        let again = r.lookup(&keys(0..6), t0 + Duration::from_secs(10), Vec::new());
        assert_eq!(again.worker(0).routed.prompt_blocks, 2);
        assert_eq!(again.worker(0).routed.other_blocks, 0);
        // The route window's expiry passes the cleared entries without
        // counting them down a second time; the placements expire later.
        r.expire(t0 + Duration::from_secs(61), None);
        let later = r.lookup(&keys(0..6), t0 + Duration::from_secs(61), Vec::new());
        assert_eq!(later.worker(0).routed.prompt_blocks, 2);
        assert_eq!(later.worker(1).routed, Routed::default());
        assert_eq!(later.worker(0).placed.prompt_blocks, 6);
        r.expire(t0 + Duration::from_secs(671), None);
        assert_eq!(r.entries(), 0);
        let gone = r.lookup(&keys(0..6), t0 + Duration::from_secs(671), Vec::new());
        assert_eq!(gone.worker(0), WorkerRoutes::default());
        // Out of range: nothing happens.
        r.cleared(7);
    }

    #[test]
    fn a_forgotten_worker_has_routed_nothing_and_its_old_items_expire_harmlessly() {
        let r = routed_only(3, 1_000);
        let t0 = Instant::now();
        r.record(0, &keys(0..6), t0);
        r.record(1, &keys(0..4), t0);
        r.forget(1);
        let seen = routed(&r, &keys(0..6), t0);
        assert_eq!(seen[1], Routed::default());
        assert_eq!(seen[0].prompt_blocks, 6);
        // The slot's next worker starts from nothing; the old items in the
        // expiry order do not take its entries away.
        r.record(1, &keys(10..12), t0 + Duration::from_secs(30));
        r.expire(t0 + Duration::from_secs(61), None);
        let later = routed(&r, &keys(10..12), t0 + Duration::from_secs(61));
        assert_eq!(later[1].prompt_blocks, 2);
        assert_eq!(later[0], Routed::default());
        assert_eq!(r.entries(), 2);
    }

    #[test]
    fn both_windows_from_one_record() {
        let m =
            RouteMemory::with_windows(2, Duration::from_secs(60), Duration::from_secs(600), 1_000);
        let t0 = Instant::now();
        let at = |s| t0 + Duration::from_secs(s);
        m.record(1, &keys(0..5), t0);
        let view = m.lookup(&keys(0..5), t0, vec![0, 5]);
        assert_eq!(view.worker(1).routed.prompt_blocks, 5);
        assert_eq!(view.worker(1).placed.prompt_blocks, 5);
        assert_eq!(view.worker(1).held_blocks, 5);
        assert_eq!(view.worker(0), WorkerRoutes::default());
        assert_eq!(view.worker(7), WorkerRoutes::default());
        assert_eq!(view.seen_tokens(16), 80);
        // Past the route window: placed, no longer routed, and not the
        // worker's working set once the tick has passed it.
        m.expire(at(100), None);
        let view = m.lookup(&keys(0..5), at(100), Vec::new());
        assert_eq!(view.worker(1).routed, Routed::default());
        assert_eq!(view.worker(1).placed.prompt_blocks, 5);
        // Routed again: back in the working set.
        m.record(1, &keys(0..2), at(200));
        m.expire(at(200), None);
        let view = m.lookup(&keys(0..5), at(200), Vec::new());
        assert_eq!(
            view.worker(1).routed,
            Routed {
                prompt_blocks: 2,
                other_blocks: 0
            }
        );
        assert_eq!(view.worker(1).placed.prompt_blocks, 5);
        // Past the placement window: gone.
        m.expire(at(700), None);
        assert_eq!(m.entries(), 2);
        assert_eq!(
            m.lookup(&keys(0..5), at(700), Vec::new())
                .worker(1)
                .placed
                .prompt_blocks,
            2
        );
        m.expire(at(801), None);
        assert_eq!(m.entries(), 0);
        assert_eq!(
            m.lookup(&keys(0..5), at(801), Vec::new()).worker(1),
            WorkerRoutes::default()
        );
    }

    #[test]
    fn the_default_windows_are_the_scoring_configs() {
        let m = RouteMemory::new(2, &ScoringConfig::default(), 100);
        assert_eq!(m.spans, [Duration::from_secs(60), Duration::from_secs(600)]);
    }

    #[test]
    fn concurrent_records_keep_each_workers_count_exact() {
        let m = RouteMemory::with_windows(
            4,
            Duration::from_secs(600),
            Duration::from_secs(600),
            1 << 18,
        );
        let t0 = Instant::now();
        std::thread::scope(|s| {
            for w in 0..4u64 {
                let m = &m;
                s.spawn(move || {
                    for i in 0..200u64 {
                        let keys: Vec<_> = (0..16)
                            .map(|b| BlockKey(w * 1_000_000 + i * 16 + b))
                            .collect();
                        m.record(w as usize, &keys, t0);
                        m.lookup(&keys, t0, Vec::new());
                    }
                });
            }
        });
        let view = m.lookup(&[], t0, Vec::new());
        for w in 0..4 {
            assert_eq!(view.worker(w).routed.other_blocks, 200 * 16);
            assert_eq!(view.worker(w).placed.other_blocks, 200 * 16);
        }
        assert_eq!(m.entries(), 4 * 200 * 16);
    }
}
