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

/// The picker's two route memories: the working set of the last
/// `route_window_s` (the eviction charge) and the placements of the last
/// `placement_window_s` (what a prompt adds that is new, what each worker
/// has taken on).
pub struct RouteMemory {
    recent: RecentRoutes,
    placements: RecentRoutes,
}

/// Per worker, what each memory says about one prompt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RouteView {
    pub routed: Vec<Routed>,
    pub placed: Vec<Routed>,
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

    pub fn lookup(&self, keys: &[BlockKey], now: Instant) -> RouteView {
        RouteView {
            routed: self.recent.lookup(keys, now),
            placed: self.placements.lookup(keys, now),
        }
    }

    /// Records that a prompt with these block keys was sent to `worker`.
    pub fn record(&self, worker: usize, keys: &[BlockKey], now: Instant) {
        self.recent.record(worker, keys, now);
        self.placements.record(worker, keys, now);
    }
}

// === impl RouteView ===

impl RouteView {
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
}
