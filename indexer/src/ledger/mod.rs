//! The request ledger: one entry per pick id, from the pick's commit to its
//! terminal report (done or cancelled), and each worker's load derived
//! from the entries.
//!
//! An entry holds what every per-request view needs: the worker and its
//! prediction (in-flight load, calibration), when it was picked and got
//! its first token, the tenant and policy (metric labels) and the prompt's
//! blocks (held there until the end: see [`blocks`]). The per-worker
//! aggregates (`in_flight`, `unprefilled_tokens`, `decoding`) and the block
//! counts change only with an entry, under the ledger's lock, so they
//! return to zero exactly when every request has ended.
//!
//! The pick's read side takes no lock of the ledger's entries: each
//! worker's load and rate (calibration) live in atomics ([`Shared`]),
//! changed only under the entries' mutex and read by [`Ledger::view`]
//! without it, and the prompt blocks are sharded under their own locks
//! (taken after the entries', one block at a time). Only writes (a pick's
//! commit, reports, expiry) take the entries' mutex. A view may see one
//! field of a worker's load before a change and another after it: the
//! scoring is an estimate either way, and the aggregates themselves change
//! only under the lock.
//!
//! Reports race their pick: the filter may give up on a pick and report
//! `Cancelled` before the pick commits. A terminal report for an id without
//! an entry leaves a short-lived tombstone ([`tombstones`]); the pick that
//! commits later finds it and is not counted. A first token for an id
//! without an entry (finished, expired, never ours) changes nothing.
//! Entries whose terminal report never comes expire after a TTL, in
//! [`Ledger::expire`] only (the service calls it on its housekeeping tick).

mod blocks;
mod tombstones;

#[cfg(test)]
mod proptests;
#[cfg(test)]
mod tests;

use crate::{keys::BlockKey, scoring::Prediction};
use blocks::PromptBlocks;
use parking_lot::Mutex;
use std::{
    collections::{HashMap, VecDeque},
    sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering},
    time::{Duration, Instant},
};
use tombstones::Tombstones;

/// How long a tombstone is kept: far longer than any pick takes (the
/// filter's pick deadline is well under a second), far shorter than the
/// in-flight TTL.
pub const TOMBSTONE_TTL: Duration = Duration::from_secs(30);
/// Tombstones kept at most (~100 bytes each).
pub const TOMBSTONE_CAPACITY: usize = 1 << 16;

/// One picked request that has not ended.
#[derive(Debug, Clone, PartialEq)]
pub struct Entry {
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

/// What [`Ledger::open`] did with a pick.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Opened {
    /// A new entry.
    New,
    /// The id had an entry: it was released and replaced.
    Replaced,
    /// Its terminal report came first (a tombstone): nothing recorded.
    Reported,
    /// The worker is not in the ledger: nothing recorded.
    UnknownWorker,
}

/// What [`Ledger::finish`] did with a terminal report.
#[derive(Debug, Clone, PartialEq)]
pub enum Finished {
    /// The entry, as it was, is gone and its load released.
    Closed(Entry),
    /// No entry: the id is tombstoned (its pick, if it comes, is not counted).
    Tombstoned,
    /// No entry, and the id was already tombstoned.
    AlreadyTombstoned,
}

/// What [`Ledger::expire`] dropped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Expired {
    pub entries: usize,
    pub tombstones: usize,
}

/// The ledger's own counts, for `/debug/workers` and the metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct LedgerStats {
    pub entries: usize,
    pub tombstones: usize,
    /// Prompt blocks held by prompts in flight.
    pub held_blocks: usize,
    /// Entries dropped by the TTL so far.
    pub expired: u64,
    /// Picks not counted because their terminal report came first.
    pub late_picks: u64,
    /// Tombstones dropped by the capacity bound before their TTL.
    pub tombstones_evicted: u64,
    /// Prompts whose blocks stopped counting as held before their end
    /// (the held-blocks bound).
    pub held_dropped: u64,
}

pub struct Ledger {
    ttl: Duration,
    /// Prompt blocks held at most (the oldest prompts stop counting first;
    /// their load stays).
    blocks_capacity: usize,
    /// A worker's load before anything is known of it.
    prior: LocalLoad,
    inner: Mutex<Inner>,
    shared: Shared,
}

/// What picks read without the entries' mutex; written only under it.
struct Shared {
    loads: Box<[SharedLoad]>,
    blocks: PromptBlocks,
}

/// One worker's [`LocalLoad`], field by field.
#[derive(Default)]
struct SharedLoad {
    in_flight: AtomicU32,
    unprefilled_tokens: AtomicU64,
    decoding: AtomicU32,
    /// `f64` bits.
    prefill_rate: AtomicU64,
    calibrated: AtomicBool,
}

struct Inner {
    entries: HashMap<String, Record>,
    /// Order in which prompts were picked, for the capacity bound; entries
    /// ended or replaced since leave stale items, skipped.
    held_order: VecDeque<(Instant, String)>,
    tombstones: Tombstones,
    /// Ids whose entry an end closed, as long as tombstones live: a first
    /// token that comes after its end is told apart from one for an id
    /// never seen (same bounds, same expiry).
    ended: Tombstones,
    expired: u64,
    late_picks: u64,
    held_dropped: u64,
}

/// An entry and its prompt's blocks, held until its end (empty when not
/// counted: none given, or dropped by the capacity bound).
struct Record {
    entry: Entry,
    blocks: Vec<BlockKey>,
}

// === impl Entry ===

impl Entry {
    /// The tokens this request adds to its worker's unprefilled work.
    fn tokens(&self) -> u64 {
        self.prediction.uncached_tokens.ceil() as u64
    }
}

// === impl SharedLoad ===

impl SharedLoad {
    fn store(&self, l: &LocalLoad) {
        self.in_flight.store(l.in_flight, Ordering::Relaxed);
        self.unprefilled_tokens
            .store(l.unprefilled_tokens, Ordering::Relaxed);
        self.decoding.store(l.decoding, Ordering::Relaxed);
        self.prefill_rate
            .store(l.prefill_rate.to_bits(), Ordering::Relaxed);
        self.calibrated.store(l.calibrated, Ordering::Relaxed);
    }

    fn load(&self) -> LocalLoad {
        LocalLoad {
            in_flight: self.in_flight.load(Ordering::Relaxed),
            unprefilled_tokens: self.unprefilled_tokens.load(Ordering::Relaxed),
            decoding: self.decoding.load(Ordering::Relaxed),
            prefill_rate: f64::from_bits(self.prefill_rate.load(Ordering::Relaxed)),
            calibrated: self.calibrated.load(Ordering::Relaxed),
        }
    }

    /// Changes the load (callers hold the entries' mutex: writes are
    /// serialized).
    fn update(&self, f: impl FnOnce(&mut LocalLoad)) {
        let mut l = self.load();
        f(&mut l);
        self.store(&l);
    }
}

// === impl Shared ===

impl Shared {
    fn load(&self, worker: usize) -> Option<&SharedLoad> {
        self.loads.get(worker)
    }

    /// The mean rate of the calibrated workers (`None`: none is).
    fn pooled_rate(&self) -> Option<f64> {
        let (sum, n) = self
            .loads
            .iter()
            .map(SharedLoad::load)
            .filter(|w| w.calibrated)
            .fold((0.0, 0u32), |(s, n), w| (s + w.prefill_rate, n + 1));
        (n > 0).then(|| sum / f64::from(n))
    }
}

// === impl Ledger ===

impl Ledger {
    /// `ttl`: entries without a terminal report are dropped after this long;
    /// `blocks_capacity`: prompt blocks of requests in flight kept at most.
    pub fn new(
        workers: usize,
        prefill_rate_prior: f64,
        ttl: Duration,
        blocks_capacity: usize,
    ) -> Self {
        Self::with_tombstones(
            workers,
            prefill_rate_prior,
            ttl,
            blocks_capacity,
            TOMBSTONE_TTL,
            TOMBSTONE_CAPACITY,
        )
    }

    /// [`Self::new`] with other tombstone bounds (tests).
    pub fn with_tombstones(
        workers: usize,
        prefill_rate_prior: f64,
        ttl: Duration,
        blocks_capacity: usize,
        tombstone_ttl: Duration,
        tombstone_capacity: usize,
    ) -> Self {
        let load = LocalLoad {
            prefill_rate: prefill_rate_prior,
            ..Default::default()
        };
        Self {
            ttl,
            blocks_capacity,
            prior: load,
            shared: Shared {
                loads: (0..workers)
                    .map(|_| {
                        let w = SharedLoad::default();
                        w.store(&load);
                        w
                    })
                    .collect(),
                blocks: PromptBlocks::new(workers),
            },
            inner: Mutex::new(Inner {
                entries: HashMap::new(),
                held_order: VecDeque::new(),
                tombstones: Tombstones::new(tombstone_ttl, tombstone_capacity),
                ended: Tombstones::new(tombstone_ttl, tombstone_capacity),
                expired: 0,
                late_picks: 0,
                held_dropped: 0,
            }),
        }
    }

    /// Records a committed pick and, when `blocks` is not empty, its prompt
    /// as held on its worker until the end. An id with an entry is
    /// replaced; an id with a tombstone is not recorded (and the tombstone
    /// is used up).
    pub fn open(&self, id: &str, entry: Entry, blocks: Vec<BlockKey>) -> Opened {
        let mut guard = self.inner.lock();
        let inner = &mut *guard;
        if inner.tombstones.take(id) {
            inner.late_picks += 1;
            return Opened::Reported;
        }
        let Some(load) = self.shared.load(entry.worker) else {
            return Opened::UnknownWorker;
        };
        let replaced = inner.close(id, &self.shared).is_some();
        // An id picked again is no longer one that ended.
        inner.ended.take(id);
        load.update(|w| {
            w.in_flight += 1;
            w.unprefilled_tokens += entry.tokens();
        });
        if !blocks.is_empty() {
            self.shared.blocks.add(entry.worker, &blocks);
            inner.held_order.push_back((entry.picked_at, id.to_owned()));
        }
        inner
            .entries
            .insert(id.to_owned(), Record { entry, blocks });
        inner.bound_blocks(self.blocks_capacity, &self.shared.blocks);
        if replaced {
            Opened::Replaced
        } else {
            Opened::New
        }
    }

    /// Records a first token: the entry's tokens move from unprefilled to
    /// decoding (its prompt stays held). Returns the entry once (`None` for
    /// an unknown id or a second first token).
    pub fn first_token(&self, id: &str, now: Instant) -> Option<Entry> {
        let mut guard = self.inner.lock();
        let inner = &mut *guard;
        let rec = inner.entries.get_mut(id)?;
        if rec.entry.first_token_at.is_some() {
            return None;
        }
        rec.entry.first_token_at = Some(now);
        let worker = rec.entry.worker;
        let tokens = rec.entry.tokens();
        if let Some(load) = self.shared.load(worker) {
            load.update(|w| {
                w.unprefilled_tokens = w.unprefilled_tokens.saturating_sub(tokens);
                w.decoding += 1;
            });
        }
        Some(rec.entry.clone())
    }

    /// Whether an end closed `id`'s entry within the tombstones' TTL: a
    /// first token without an entry then came after its end (the end
    /// carried it).
    pub fn ended(&self, id: &str) -> bool {
        self.inner.lock().ended.contains(id)
    }

    /// Records a terminal report (done or cancelled). An entry without a
    /// first token ends as if its first token came with the end: the
    /// aggregates are released either way.
    pub fn finish(&self, id: &str, now: Instant) -> Finished {
        let mut inner = self.inner.lock();
        if let Some(entry) = inner.close(id, &self.shared) {
            inner.ended.insert(id, now);
            return Finished::Closed(entry);
        }
        if inner.tombstones.insert(id, now) {
            Finished::Tombstoned
        } else {
            Finished::AlreadyTombstoned
        }
    }

    /// Drops entries picked more than the TTL before `now` (their reports
    /// never came) and tombstones past theirs.
    pub fn expire(&self, now: Instant) -> Expired {
        let mut guard = self.inner.lock();
        let inner = &mut *guard;
        let ttl = self.ttl;
        let stale: Vec<String> = inner
            .entries
            .iter()
            .filter(|(_, r)| now.saturating_duration_since(r.entry.picked_at) > ttl)
            .map(|(id, _)| id.clone())
            .collect();
        for id in &stale {
            inner.close(id, &self.shared);
        }
        inner.expired += stale.len() as u64;
        inner.trim_held_order();
        inner.ended.expire(now);
        Expired {
            entries: stale.len(),
            tombstones: inner.tombstones.expire(now),
        }
    }

    /// Every worker's load.
    pub fn snapshot(&self) -> Vec<LocalLoad> {
        self.shared.loads.iter().map(SharedLoad::load).collect()
    }

    /// Every worker's load and, per worker, how many of `keys`' leading
    /// blocks a prompt in flight there holds. Takes no lock of the entries:
    /// the loads are atomics, the blocks are read shard by shard.
    pub fn view(&self, keys: &[BlockKey]) -> (Vec<LocalLoad>, Vec<u32>) {
        let held = if keys.is_empty() {
            vec![0; self.shared.loads.len()]
        } else {
            self.shared.blocks.lookup(keys)
        };
        (self.snapshot(), held)
    }

    /// Worker `worker`'s prefill rate (`None` out of range).
    pub fn rate(&self, worker: usize) -> Option<f64> {
        self.shared
            .load(worker)
            .map(|w| f64::from_bits(w.prefill_rate.load(Ordering::Relaxed)))
    }

    /// Sets a worker's calibrated prefill rate. Workers without observations
    /// of their own borrow the mean rate of those that have: the workers of a
    /// pool run the same model on the same hardware, and a worker left at
    /// the prior would look faster or slower than its calibrated peers for no
    /// reason, winning (or losing) every cold pick.
    pub fn set_rate(&self, worker: usize, rate: f64) {
        let _writer = self.inner.lock();
        let Some(load) = self.shared.load(worker) else {
            return;
        };
        load.update(|w| {
            w.prefill_rate = rate;
            w.calibrated = true;
        });
        // Workers without observations of their own borrow the pool's rate.
        if let Some(pooled) = self.shared.pooled_rate() {
            for load in self.shared.loads.iter() {
                load.update(|w| {
                    if !w.calibrated {
                        w.prefill_rate = pooled;
                    }
                });
            }
        }
    }

    /// Drops every entry on `worker` and resets its load to the prior (its
    /// slot is being vacated: the worker left). Their terminal reports, if
    /// they still come, find no entry. Returns the entries dropped.
    pub fn forget(&self, worker: usize) -> usize {
        let mut guard = self.inner.lock();
        let inner = &mut *guard;
        let Some(load) = self.shared.load(worker) else {
            return 0;
        };
        let ids: Vec<String> = inner
            .entries
            .iter()
            .filter(|(_, r)| r.entry.worker == worker)
            .map(|(id, _)| id.clone())
            .collect();
        for id in &ids {
            inner.close(id, &self.shared);
        }
        // The slot's next worker starts uncalibrated, at the pool's rate.
        load.store(&self.prior);
        if let Some(pooled) = self.shared.pooled_rate() {
            load.update(|w| w.prefill_rate = pooled);
        }
        inner.trim_held_order();
        ids.len()
    }

    /// The entry of `id`, if any.
    pub fn get(&self, id: &str) -> Option<Entry> {
        self.inner.lock().entries.get(id).map(|r| r.entry.clone())
    }

    pub fn len(&self) -> usize {
        self.inner.lock().entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn stats(&self) -> LedgerStats {
        let inner = self.inner.lock();
        LedgerStats {
            entries: inner.entries.len(),
            tombstones: inner.tombstones.len(),
            held_blocks: self.shared.blocks.held(),
            expired: inner.expired,
            late_picks: inner.late_picks,
            tombstones_evicted: inner.tombstones.evicted,
            held_dropped: inner.held_dropped,
        }
    }
}

impl Inner {
    /// Removes `id`'s entry and releases what it held.
    fn close(&mut self, id: &str, shared: &Shared) -> Option<Entry> {
        let rec = self.entries.remove(id)?;
        let tokens = rec.entry.tokens();
        let worker = rec.entry.worker;
        let prefilled = rec.entry.first_token_at.is_some();
        if let Some(load) = shared.load(worker) {
            load.update(|w| {
                w.in_flight = w.in_flight.saturating_sub(1);
                if prefilled {
                    w.decoding = w.decoding.saturating_sub(1);
                } else {
                    w.unprefilled_tokens = w.unprefilled_tokens.saturating_sub(tokens);
                }
            });
        }
        shared.blocks.remove(worker, &rec.blocks);
        Some(rec.entry)
    }

    /// Beyond `capacity` held blocks, the oldest prompts stop counting as
    /// held (their entries stay). The order's stale items (prompts ended
    /// or replaced since) are dropped when they outnumber the live ones, so
    /// the order stays within twice the prompts held.
    fn bound_blocks(&mut self, capacity: usize, blocks: &PromptBlocks) {
        if self.held_order.len() > 2 * self.entries.len().max(1) {
            let entries = &self.entries;
            self.held_order.retain(|(at, id)| counted(entries, *at, id));
        }
        while blocks.held() > capacity {
            let Some((at, id)) = self.held_order.pop_front() else {
                break;
            };
            if counted(&self.entries, at, &id)
                && let Some(rec) = self.entries.get_mut(&id)
            {
                let keys = std::mem::take(&mut rec.blocks);
                blocks.remove(rec.entry.worker, &keys);
                self.held_dropped += 1;
            }
        }
    }

    /// Drops the stale items at the front of `held_order`.
    fn trim_held_order(&mut self) {
        while let Some((at, id)) = self.held_order.front() {
            if counted(&self.entries, *at, id) {
                break;
            }
            self.held_order.pop_front();
        }
    }
}

/// Whether a `held_order` item (`id` picked `at`) still stands for a
/// prompt's counted blocks: the entry is that pick and its blocks count.
fn counted(entries: &HashMap<String, Record>, at: Instant, id: &str) -> bool {
    entries
        .get(id)
        .is_some_and(|r| r.entry.picked_at == at && !r.blocks.is_empty())
}
