//! In-flight load per worker, from our own picks and the filter's reports,
//! and each worker's calibrated prefill rate.
//!
//! A pick adds the request's uncached tokens to its worker's "unprefilled"
//! work; its first token moves it to "decoding"; done or cancelled removes it.
//! Entries whose reports never come expire after a TTL.
//!
//! [`RecentRoutes`] remembers which prompt blocks were sent where in the last
//! `route_window_s`: each worker's working set as the router sees it, whether
//! or not the engine still caches (or already caches) those blocks.
//! A second one over `placement_window_s` (minutes) tells which prompts a
//! worker has taken on (their follow-ups come back there) and which prompt
//! prefixes the router has seen at all; [`RouteMemory`] holds both.
//! [`QueuedPrompts`], also in it, holds the prompts picked but not yet
//! prefilled: a request queued behind one of them on the same worker finds
//! their shared prefix cached when its turn comes.

use crate::config::ScoringConfig;
use crate::index::memory::MixState;
use crate::keys::BlockKey;
use crate::scoring::Prediction;
use parking_lot::Mutex;
use std::{
    collections::{HashMap, VecDeque},
    time::{Duration, Instant},
};

/// One picked request that has not finished.
#[derive(Debug, Clone, PartialEq)]
pub struct Pending {
    /// Position of the worker in the configuration.
    pub worker: usize,
    pub prediction: Prediction,
    pub picked_at: Instant,
    pub first_token_at: Option<Instant>,
    /// Tenant metric label (already bounded by the allowlist).
    pub tenant: String,
    pub policy: &'static str,
}

/// Aggregate load of one worker, as scoring sees it.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct LocalLoad {
    pub in_flight: u32,
    pub unprefilled_tokens: u64,
    pub decoding: u32,
    pub prefill_rate: f64,
    /// Whether `prefill_rate` comes from this worker's own observations
    /// (otherwise it is borrowed from the pool, or the prior).
    pub calibrated: bool,
}

pub struct LoadTracker {
    ttl: Duration,
    inner: Mutex<Inner>,
}

struct Inner {
    requests: HashMap<String, Pending>,
    workers: Vec<LocalLoad>,
}

// === impl Pending ===

impl Pending {
    fn tokens(&self) -> u64 {
        self.prediction.uncached_tokens.ceil() as u64
    }
}

// === impl LoadTracker ===

impl LoadTracker {
    pub fn new(workers: usize, prefill_rate_prior: f64, ttl: Duration) -> Self {
        let load = LocalLoad {
            prefill_rate: prefill_rate_prior,
            ..Default::default()
        };
        Self {
            ttl,
            inner: Mutex::new(Inner {
                requests: HashMap::new(),
                workers: vec![load; workers],
            }),
        }
    }

    pub fn snapshot(&self) -> Vec<LocalLoad> {
        self.inner.lock().workers.clone()
    }

    /// Records a pick. A request id seen before replaces the older entry.
    pub fn on_pick(&self, request_id: &str, pending: Pending) {
        let mut inner = self.inner.lock();
        if pending.worker >= inner.workers.len() {
            return;
        }
        if let Some(old) = inner.requests.remove(request_id) {
            inner.release(&old);
        }
        let w = &mut inner.workers[pending.worker];
        w.in_flight += 1;
        w.unprefilled_tokens += pending.tokens();
        inner.requests.insert(request_id.to_owned(), pending);
    }

    /// Records a first token; returns the entry (once: a second first-token
    /// report for the same request returns `None`).
    pub fn on_first_token(&self, request_id: &str, now: Instant) -> Option<Pending> {
        let mut guard = self.inner.lock();
        let inner = &mut *guard;
        let p = inner.requests.get_mut(request_id)?;
        if p.first_token_at.is_some() {
            return None;
        }
        p.first_token_at = Some(now);
        let w = &mut inner.workers[p.worker];
        w.unprefilled_tokens = w.unprefilled_tokens.saturating_sub(p.tokens());
        w.decoding += 1;
        Some(p.clone())
    }

    /// Records the end of a request (done or cancelled).
    pub fn on_finish(&self, request_id: &str) -> Option<Pending> {
        let mut inner = self.inner.lock();
        let p = inner.requests.remove(request_id)?;
        inner.release(&p);
        Some(p)
    }

    /// Sets a worker's calibrated prefill rate. Workers without observations
    /// of their own borrow the mean rate of those that have: the workers of a
    /// pool run the same model on the same hardware, and a worker left at
    /// the prior would look faster or slower than its calibrated peers for no
    /// reason, winning (or losing) every cold pick.
    pub fn set_rate(&self, worker: usize, rate: f64) {
        let mut inner = self.inner.lock();
        let Some(w) = inner.workers.get_mut(worker) else {
            return;
        };
        w.prefill_rate = rate;
        w.calibrated = true;
        let rates: Vec<f64> = inner
            .workers
            .iter()
            .filter(|w| w.calibrated)
            .map(|w| w.prefill_rate)
            .collect();
        let pooled = rates.iter().sum::<f64>() / rates.len() as f64;
        for w in inner.workers.iter_mut().filter(|w| !w.calibrated) {
            w.prefill_rate = pooled;
        }
    }

    /// Drops entries older than the TTL; returns how many.
    pub fn expire(&self, now: Instant) -> usize {
        let mut inner = self.inner.lock();
        let ttl = self.ttl;
        let stale: Vec<String> = inner
            .requests
            .iter()
            .filter(|(_, p)| now.saturating_duration_since(p.picked_at) > ttl)
            .map(|(id, _)| id.clone())
            .collect();
        for id in &stale {
            if let Some(p) = inner.requests.remove(id) {
                inner.release(&p);
            }
        }
        stale.len()
    }

    pub fn len(&self) -> usize {
        self.inner.lock().requests.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

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
    /// Per block, the last time it was routed to each worker (indexed by
    /// worker): one hash lookup per block answers for every worker.
    last: HashMap<BlockKey, Box<[Option<Instant>]>, MixState>,
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
        let workers = inner.blocks.len();
        if worker >= workers {
            return;
        }
        let RoutesInner {
            last,
            order,
            blocks,
        } = &mut *inner;
        for &key in keys {
            let slots = last
                .entry(key)
                .or_insert_with(|| vec![None; workers].into_boxed_slice());
            if slots[worker].replace(now).is_none() {
                blocks[worker] += 1;
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
            let Some(slots) = inner.last.get(key) else {
                continue;
            };
            for (routed, slot) in seen.iter_mut().zip(slots.iter()) {
                routed.prompt_blocks += u32::from(slot.is_some());
            }
        }
        for (routed, &blocks) in seen.iter_mut().zip(&inner.blocks) {
            routed.other_blocks = blocks.saturating_sub(u64::from(routed.prompt_blocks));
        }
        seen
    }
}

/// The picker's route memories: the working set of the last
/// `route_window_s` (the eviction charge), the placements of the last
/// `placement_window_s` (what a prompt adds that is new, what each worker
/// has taken on) and the prompts still queued (prefixes about to be cached).
pub struct RouteMemory {
    recent: RecentRoutes,
    placements: RecentRoutes,
    queued: QueuedPrompts,
}

/// Per worker, what each memory says about one prompt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RouteView {
    pub routed: Vec<Routed>,
    pub placed: Vec<Routed>,
    /// The prompt's leading blocks that a prompt queued there holds.
    pub queued: Vec<u32>,
}

/// One worker's part of a [`RouteView`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct WorkerRoutes {
    pub routed: Routed,
    pub placed: Routed,
    pub queued_blocks: u32,
}

/// Prompts picked and not yet prefilled (no first token), per worker.
/// vLLM schedules first come, first served, so a request sent behind one of
/// them to the same worker starts its prefill after theirs: the prefix they
/// share is cached by then, though the index does not show it yet. Without
/// this, past saturation (long queues) every request of a group whose
/// prefix is still queued looks cold everywhere and goes wherever the queue
/// is shortest, each worker prefills the prefix again, and the hit rate
/// collapses with the throughput.
pub struct QueuedPrompts {
    /// Entries older than this are dropped (their reports never came).
    ttl: Duration,
    /// Prompt blocks kept at most, over all prompts (oldest dropped first).
    capacity: usize,
    inner: Mutex<QueuedInner>,
}

struct QueuedInner {
    /// Per request id: its worker, prompt blocks and when it was queued.
    requests: HashMap<String, (usize, Vec<BlockKey>, Instant)>,
    /// Per block, how many queued prompts hold it on each worker.
    blocks: HashMap<BlockKey, Box<[u32]>, MixState>,
    /// Queueing order, for expiry; entries of ids already prefilled, or
    /// queued again since, are stale and skipped.
    order: VecDeque<(Instant, String)>,
    /// Blocks of all queued prompts.
    held: usize,
    workers: usize,
}

// === impl RouteMemory ===

impl RouteMemory {
    /// Each memory keeps at most `capacity` (block, worker) entries.
    pub fn new(workers: usize, cfg: &ScoringConfig, capacity: usize) -> Self {
        let memory = |window_s| RecentRoutes::new(workers, Duration::from_secs(window_s), capacity);
        Self {
            recent: memory(cfg.route_window_s),
            placements: memory(cfg.placement_window_s),
            queued: QueuedPrompts::new(workers, Duration::from_secs(cfg.in_flight_ttl_s), capacity),
        }
    }

    pub fn lookup(&self, keys: &[BlockKey], now: Instant) -> RouteView {
        RouteView {
            routed: self.recent.lookup(keys, now),
            placed: self.placements.lookup(keys, now),
            queued: self.queued.lookup(keys, now),
        }
    }

    /// Records that a prompt with these block keys was sent to `worker`;
    /// with a request id, it stays queued there until [`Self::prefilled`].
    pub fn record(&self, request_id: &str, worker: usize, keys: &[BlockKey], now: Instant) {
        self.recent.record(worker, keys, now);
        self.placements.record(worker, keys, now);
        if !request_id.is_empty() {
            self.queued.queue(request_id, worker, keys, now);
        }
    }

    /// The request's first token came, or it ended: its prompt is no longer
    /// queued.
    pub fn prefilled(&self, request_id: &str) {
        self.queued.remove(request_id);
    }
}

// === impl QueuedPrompts ===

impl QueuedPrompts {
    pub fn new(workers: usize, ttl: Duration, capacity: usize) -> Self {
        Self {
            ttl,
            capacity,
            inner: Mutex::new(QueuedInner {
                requests: HashMap::new(),
                blocks: HashMap::with_hasher(MixState),
                order: VecDeque::new(),
                held: 0,
                workers,
            }),
        }
    }

    /// `request_id`'s prompt was sent to `worker` (again: replaces it).
    pub fn queue(&self, request_id: &str, worker: usize, keys: &[BlockKey], now: Instant) {
        let mut inner = self.inner.lock();
        if worker >= inner.workers || keys.is_empty() {
            return;
        }
        inner.remove(request_id);
        inner.add(request_id, worker, keys, now);
        inner.order.push_back((now, request_id.to_owned()));
        inner.expire(now.checked_sub(self.ttl), self.capacity);
    }

    pub fn remove(&self, request_id: &str) {
        self.inner.lock().remove(request_id);
    }

    /// Per worker: how many of `keys`' leading blocks a queued prompt
    /// holds there. Block keys chain the whole prefix, so a held block
    /// means its whole prefix is held.
    pub fn lookup(&self, keys: &[BlockKey], now: Instant) -> Vec<u32> {
        let mut inner = self.inner.lock();
        inner.expire(now.checked_sub(self.ttl), self.capacity);
        let mut leading = vec![0u32; inner.workers];
        for (i, key) in keys.iter().enumerate() {
            let Some(counts) = inner.blocks.get(key) else {
                break;
            };
            let mut extended = false;
            for (n, &count) in leading.iter_mut().zip(counts.iter()) {
                // Only a worker still in the run of held blocks goes on.
                if count > 0 && *n as usize == i {
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

impl QueuedInner {
    fn add(&mut self, request_id: &str, worker: usize, keys: &[BlockKey], at: Instant) {
        let workers = self.workers;
        for &key in keys {
            self.blocks
                .entry(key)
                .or_insert_with(|| vec![0; workers].into_boxed_slice())[worker] += 1;
        }
        self.held += keys.len();
        self.requests
            .insert(request_id.to_owned(), (worker, keys.to_vec(), at));
    }

    fn remove(&mut self, request_id: &str) {
        let Some((worker, keys, _)) = self.requests.remove(request_id) else {
            return;
        };
        self.held = self.held.saturating_sub(keys.len());
        for key in keys {
            let Some(counts) = self.blocks.get_mut(&key) else {
                continue;
            };
            counts[worker] = counts[worker].saturating_sub(1);
            if counts.iter().all(|&c| c == 0) {
                self.blocks.remove(&key);
            }
        }
    }

    /// Drops prompts queued before `cutoff`, and the oldest beyond
    /// `capacity` (ids already prefilled leave stale entries in `order`,
    /// which go the same way).
    fn expire(&mut self, cutoff: Option<Instant>, capacity: usize) {
        while let Some((at, _)) = self.order.front() {
            let old = cutoff.is_some_and(|c| *at < c);
            let over = self.held > capacity || self.order.len() > 2 * capacity.max(1);
            if !old && !over {
                break;
            }
            let Some((at, id)) = self.order.pop_front() else {
                break;
            };
            if self.requests.get(&id).is_some_and(|r| r.2 == at) {
                self.remove(&id);
            }
        }
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
            let Some(slots) = self.last.get_mut(&key) else {
                continue;
            };
            if slots[worker] != Some(at) {
                continue;
            }
            slots[worker] = None;
            self.blocks[worker] = self.blocks[worker].saturating_sub(1);
            entries = entries.saturating_sub(1);
            if slots.iter().all(Option::is_none) {
                self.last.remove(&key);
            }
        }
    }
}

impl Inner {
    fn release(&mut self, p: &Pending) {
        let w = &mut self.workers[p.worker];
        w.in_flight = w.in_flight.saturating_sub(1);
        if p.first_token_at.is_some() {
            w.decoding = w.decoding.saturating_sub(1);
        } else {
            w.unprefilled_tokens = w.unprefilled_tokens.saturating_sub(p.tokens());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pending(worker: usize, tokens: f64, at: Instant) -> Pending {
        Pending {
            worker,
            prediction: Prediction {
                uncached_tokens: tokens,
                ..Default::default()
            },
            picked_at: at,
            first_token_at: None,
            tenant: "other".into(),
            policy: "kvsteer",
        }
    }

    #[test]
    fn pick_first_token_done() {
        let t = LoadTracker::new(2, 1000.0, Duration::from_secs(60));
        let now = Instant::now();
        t.on_pick("a", pending(1, 100.0, now));
        t.on_pick("b", pending(1, 50.5, now));
        let w = t.snapshot()[1];
        assert_eq!((w.in_flight, w.unprefilled_tokens, w.decoding), (2, 151, 0));
        assert!(t.on_first_token("a", now).is_some());
        assert!(t.on_first_token("a", now).is_none());
        let w = t.snapshot()[1];
        assert_eq!((w.in_flight, w.unprefilled_tokens, w.decoding), (2, 51, 1));
        assert!(t.on_finish("a").is_some());
        assert!(t.on_finish("b").is_some());
        assert!(t.on_finish("b").is_none());
        assert_eq!(
            t.snapshot()[1],
            LocalLoad {
                prefill_rate: 1000.0,
                ..Default::default()
            }
        );
        assert!(t.is_empty());
    }

    #[test]
    fn repeated_id_replaces_and_unknown_worker_is_ignored() {
        let t = LoadTracker::new(2, 1000.0, Duration::from_secs(60));
        let now = Instant::now();
        t.on_pick("a", pending(0, 10.0, now));
        t.on_pick("a", pending(1, 20.0, now));
        t.on_pick("z", pending(7, 20.0, now));
        let s = t.snapshot();
        assert_eq!((s[0].in_flight, s[1].in_flight), (0, 1));
        assert_eq!(t.len(), 1);
        assert!(t.on_first_token("nope", now).is_none());
    }

    #[test]
    fn stale_entries_expire() {
        let t = LoadTracker::new(1, 1000.0, Duration::from_secs(10));
        let start = Instant::now();
        t.on_pick("old", pending(0, 10.0, start));
        t.on_pick("new", pending(0, 5.0, start + Duration::from_secs(8)));
        t.on_first_token("new", start + Duration::from_secs(9));
        assert_eq!(t.expire(start + Duration::from_secs(11)), 1);
        let w = t.snapshot()[0];
        assert_eq!((w.in_flight, w.unprefilled_tokens, w.decoding), (1, 0, 1));
        assert_eq!(t.expire(start + Duration::from_secs(30)), 1);
        assert_eq!(t.snapshot()[0].in_flight, 0);
    }

    #[test]
    fn uncalibrated_workers_borrow_the_pool_rate() {
        let t = LoadTracker::new(3, 8_000.0, Duration::from_secs(60));
        t.set_rate(0, 16_000.0);
        let rates: Vec<f64> = t.snapshot().iter().map(|w| w.prefill_rate).collect();
        assert_eq!(rates, [16_000.0, 16_000.0, 16_000.0]);
        t.set_rate(1, 10_000.0);
        let s = t.snapshot();
        assert_eq!(
            s.iter().map(|w| w.prefill_rate).collect::<Vec<_>>(),
            [16_000.0, 10_000.0, 13_000.0]
        );
        assert_eq!(s.iter().filter(|w| w.calibrated).count(), 2);
    }

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
    fn queued_prompts_lend_their_prefix_until_prefilled() {
        let q = QueuedPrompts::new(3, Duration::from_secs(300), 100);
        let t0 = Instant::now();
        // A group prefix (blocks 0..6) queued on 1 with its question, and
        // the first half of it on 2.
        q.queue("a", 1, &keys(0..8), t0);
        q.queue("b", 2, &keys(0..3), t0);
        // Another user of the group: same prefix, another question.
        let mut prompt = keys(0..6);
        prompt.extend(keys(50..52));
        assert_eq!(q.lookup(&prompt, t0), vec![0, 6, 3]);
        // Only a leading run counts: a prompt whose first block differs
        // holds nothing, even where later keys are alike.
        let mut stranger = vec![BlockKey(99)];
        stranger.extend(keys(1..8));
        assert_eq!(q.lookup(&stranger, t0), vec![0, 0, 0]);
        // Two prompts with the same prefix on one worker: it stays held
        // until both are prefilled.
        q.queue("c", 1, &keys(0..6), t0);
        q.remove("a");
        assert_eq!(q.lookup(&prompt, t0), vec![0, 6, 3]);
        q.remove("c");
        q.remove("c");
        assert_eq!(q.lookup(&prompt, t0), vec![0, 0, 3]);
        // Queued again elsewhere: the prompt moves.
        q.queue("b", 0, &keys(0..3), t0);
        assert_eq!(q.lookup(&prompt, t0), vec![3, 0, 0]);
    }

    #[test]
    fn queued_prompts_expire_and_are_bounded() {
        let q = QueuedPrompts::new(1, Duration::from_secs(300), 8);
        let t0 = Instant::now();
        q.queue("a", 0, &keys(0..4), t0);
        q.queue("b", 0, &keys(10..14), t0);
        q.queue("c", 0, &keys(20..24), t0);
        assert_eq!(
            q.lookup(&keys(0..4), t0),
            vec![0],
            "the oldest beyond 8 blocks goes"
        );
        assert_eq!(q.lookup(&keys(10..14), t0), vec![4]);
        assert_eq!(q.lookup(&keys(20..24), t0), vec![4]);
        // A report that never comes: gone after the TTL.
        assert_eq!(
            q.lookup(&keys(20..24), t0 + Duration::from_secs(301)),
            vec![0]
        );
        // Out-of-range workers and empty prompts are ignored.
        q.queue("d", 3, &keys(0..4), t0);
        q.queue("e", 0, &[], t0);
        assert_eq!(q.lookup(&keys(0..4), t0), vec![0]);
    }

    #[test]
    fn route_memory_queues_a_pick_until_its_report() {
        let m = RouteMemory::new(2, &ScoringConfig::default(), 100);
        let t0 = Instant::now();
        m.record("r1", 1, &keys(0..5), t0);
        // No request id (a dry run): routed, not queued.
        m.record("", 0, &keys(0..5), t0);
        let view = m.lookup(&keys(0..5), t0);
        assert_eq!(view.queued, vec![0, 5]);
        assert_eq!(view.worker(1).queued_blocks, 5);
        assert_eq!(view.worker(0).routed.prompt_blocks, 5);
        assert_eq!(view.worker(7), WorkerRoutes::default());
        m.prefilled("r1");
        assert_eq!(m.lookup(&keys(0..5), t0).queued, vec![0, 0]);
    }
}
