//! The in-memory backend: a sharded map `key → holders`, bounded by an
//! approximate LRU over whole keys.
//!
//! - Shards are `RwLock`s picked by key bits: lookups take read locks (one
//!   per key, never two at once), ingest takes write locks briefly per key.
//! - Recency is a per-entry `AtomicU64` stamped from a global clock by
//!   lookups (under the read lock) and by stores; no list to relink on reads.
//!   Within one call, deeper blocks get older stamps: chain tails are evicted
//!   before the prefixes they depend on.
//! - When a shard exceeds its share of the capacity it evicts its least
//!   recently used keys (all their holders) down to a low-water mark of
//!   15/16 of its capacity, so the sort amortises over many inserts.
//!
//! The core is synchronous; [`IndexBackend`] methods return ready futures.

use std::collections::HashMap;

use std::sync::atomic::{AtomicI64, AtomicU64, Ordering::Relaxed};

use futures::future::{BoxFuture, FutureExt, ready};
use parking_lot::RwLock;

use super::{IndexBackend, IndexError, KeyOp, Tier, WorkerId, WorkerMatch};
use crate::keys::{BlockKey, KeyHasher};

/// Upper bound on shards; fewer for small capacities so the LRU stays exact.
pub const MAX_SHARDS: usize = 64;
/// Capacity per shard below which fewer shards are used.
const MIN_SHARD_CAPACITY: usize = 8192;

pub struct MemoryBackend {
    shards: Box<[RwLock<Shard>]>,
    clock: AtomicU64,
    total: AtomicI64,
    per_worker: RwLock<HashMap<WorkerId, AtomicI64>>,
    evicted: AtomicU64,
}

struct Shard {
    map: HashMap<BlockKey, Entry, KeyHasher>,
    /// `(key, worker)` entries in this shard.
    entries: usize,
    capacity: usize,
    low_water: usize,
}

struct Entry {
    last_used: AtomicU64,
    holders: Holders,
}

/// One worker's copies of one key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Holder {
    worker: WorkerId,
    gpu: u16,
    cpu: u16,
}

/// Most keys have one holder: stored inline, no allocation.
enum Holders {
    One(Holder),
    Many(Box<[Holder]>),
}

// === impl MemoryBackend ===

impl MemoryBackend {
    pub fn new(capacity_entries: usize) -> Self {
        let shards = (capacity_entries / MIN_SHARD_CAPACITY).clamp(1, MAX_SHARDS);
        Self::with_shards(capacity_entries, shards)
    }

    /// `shards` is rounded up to a power of two (at most [`MAX_SHARDS`]); the
    /// capacity is split evenly between them.
    pub fn with_shards(capacity_entries: usize, shards: usize) -> Self {
        let n = shards.clamp(1, MAX_SHARDS).next_power_of_two();
        let shards = (0..n)
            .map(|i| {
                let capacity = capacity_entries / n + usize::from(i < capacity_entries % n);
                RwLock::new(Shard {
                    map: HashMap::default(),
                    entries: 0,
                    capacity,
                    low_water: capacity - capacity / 16,
                })
            })
            .collect();
        Self {
            shards,
            clock: AtomicU64::new(0),
            total: AtomicI64::new(0),
            per_worker: RwLock::new(HashMap::new()),
            evicted: AtomicU64::new(0),
        }
    }

    fn shard(&self, key: BlockKey) -> &RwLock<Shard> {
        let i = (key.0 >> 32) as usize & (self.shards.len() - 1);
        &self.shards[i]
    }

    /// Estimated heap bytes: map buckets plus multi-holder arrays. O(entries).
    pub fn heap_bytes(&self) -> usize {
        let bucket = size_of::<(BlockKey, Entry)>() + 1;
        self.shards
            .iter()
            .map(|shard| {
                let shard = shard.read();
                let many: usize = shard
                    .map
                    .values()
                    .map(|e| match &e.holders {
                        Holders::One(_) => 0,
                        Holders::Many(h) => h.len() * size_of::<Holder>(),
                    })
                    .sum();
                shard.map.capacity() * bucket * 8 / 7 + many
            })
            .sum()
    }

    /// Synchronous core of [`IndexBackend::apply`].
    pub fn apply_sync(&self, worker: WorkerId, ops: &[KeyOp]) {
        let n = ops.len() as u64;
        let base = self.clock.fetch_add(n + 1, Relaxed);
        let mut delta = 0i64;
        let mut evicted = Vec::new();
        for (i, op) in ops.iter().enumerate() {
            match *op {
                KeyOp::Add(key, tier) => {
                    let mut shard = self.shard(key).write();
                    // Later ops (deeper blocks of a chain) are stamped older,
                    // so the LRU drops chain tails before their prefixes.
                    let stamp = base + n - i as u64;
                    delta += i64::from(shard.add(key, worker, tier, stamp));
                    if shard.entries > shard.capacity {
                        shard.evict(&mut evicted);
                    }
                }
                KeyOp::Remove(key, tier) => {
                    delta -= i64::from(self.shard(key).write().remove(key, worker, Some(tier)));
                }
                KeyOp::Purge(key) => {
                    delta -= i64::from(self.shard(key).write().remove(key, worker, None));
                }
            }
        }
        self.account(worker, delta);
        if !evicted.is_empty() {
            self.evicted.fetch_add(evicted.len() as u64, Relaxed);
            evicted.sort_unstable();
            for chunk in evicted.chunk_by(|a, b| a == b) {
                self.account(chunk[0], -(chunk.len() as i64));
            }
        }
    }

    fn account(&self, worker: WorkerId, delta: i64) {
        if delta == 0 {
            return;
        }
        self.total.fetch_add(delta, Relaxed);
        if let Some(count) = self.per_worker.read().get(&worker) {
            count.fetch_add(delta, Relaxed);
            return;
        }
        let mut per_worker = self.per_worker.write();
        per_worker
            .entry(worker)
            .or_default()
            .fetch_add(delta, Relaxed);
    }

    /// Synchronous core of [`IndexBackend::purge_worker`]: a full scan.
    pub fn purge_sync(&self, worker: WorkerId) {
        let mut removed = 0i64;
        for shard in self.shards.iter() {
            let mut shard = shard.write();
            let keys: Vec<BlockKey> = shard
                .map
                .iter()
                .filter(|(_, e)| e.holders.get(worker).is_some())
                .map(|(k, _)| *k)
                .collect();
            for key in keys {
                removed += i64::from(shard.remove(key, worker, None));
            }
        }
        self.account(worker, -removed);
    }

    /// Synchronous core of [`IndexBackend::lookup`].
    pub fn lookup_sync(&self, keys: &[BlockKey]) -> Vec<WorkerMatch> {
        let n = keys.len() as u64;
        let base = self.clock.fetch_add(n + 1, Relaxed);
        let mut matches: Vec<WorkerMatch> = Vec::new();
        for (i, key) in keys.iter().enumerate() {
            let depth = i as u32;
            let shard = self.shard(*key).read();
            let Some(entry) = shard.map.get(key) else {
                break;
            };
            let mut alive = false;
            if i == 0 {
                for h in entry.holders.as_slice() {
                    matches.push(WorkerMatch {
                        worker: h.worker,
                        gpu_blocks: u32::from(h.gpu > 0),
                        cpu_blocks: 1,
                    });
                }
                alive = !matches.is_empty();
            } else {
                for m in matches.iter_mut().filter(|m| m.cpu_blocks == depth) {
                    if let Some(h) = entry.holders.get(m.worker) {
                        m.cpu_blocks += 1;
                        if m.gpu_blocks == depth && h.gpu > 0 {
                            m.gpu_blocks += 1;
                        }
                        alive = true;
                    }
                }
            }
            if !alive {
                break;
            }
            entry.last_used.store(base + n - depth as u64, Relaxed);
        }
        matches.sort_unstable_by_key(|m| m.worker);
        matches
    }
}

impl IndexBackend for MemoryBackend {
    fn apply<'a>(
        &'a self,
        worker: WorkerId,
        ops: &'a [KeyOp],
    ) -> BoxFuture<'a, Result<(), IndexError>> {
        self.apply_sync(worker, ops);
        ready(Ok(())).boxed()
    }

    fn purge_worker(&self, worker: WorkerId) -> BoxFuture<'_, Result<(), IndexError>> {
        self.purge_sync(worker);
        ready(Ok(())).boxed()
    }

    fn lookup<'a>(
        &'a self,
        keys: &'a [BlockKey],
    ) -> BoxFuture<'a, Result<Vec<WorkerMatch>, IndexError>> {
        ready(Ok(self.lookup_sync(keys))).boxed()
    }

    fn entries(&self) -> u64 {
        self.total.load(Relaxed).max(0) as u64
    }

    fn worker_blocks(&self, worker: WorkerId) -> u64 {
        self.per_worker
            .read()
            .get(&worker)
            .map_or(0, |c| c.load(Relaxed).max(0) as u64)
    }

    fn evicted(&self) -> u64 {
        self.evicted.load(Relaxed)
    }
}

// === impl Shard ===

impl Shard {
    /// One more copy; true when the `(key, worker)` entry is new.
    fn add(&mut self, key: BlockKey, worker: WorkerId, tier: Tier, now: u64) -> bool {
        let mut fresh = Holder {
            worker,
            gpu: 0,
            cpu: 0,
        };
        *fresh.count(tier) = 1;
        let entry = match self.map.get_mut(&key) {
            Some(entry) => entry,
            None => {
                self.map.insert(
                    key,
                    Entry {
                        last_used: AtomicU64::new(now),
                        holders: Holders::One(fresh),
                    },
                );
                self.entries += 1;
                return true;
            }
        };
        entry.last_used.store(now, Relaxed);
        match entry.holders.get_mut(worker) {
            Some(holder) => {
                let count = holder.count(tier);
                *count = count.saturating_add(1);
                false
            }
            None => {
                entry.holders.push(fresh);
                self.entries += 1;
                true
            }
        }
    }

    /// One copy fewer on `tier`, or all copies (`None`); true when the
    /// `(key, worker)` entry is gone as a result.
    fn remove(&mut self, key: BlockKey, worker: WorkerId, tier: Option<Tier>) -> bool {
        let Some(entry) = self.map.get_mut(&key) else {
            return false;
        };
        let Some(holder) = entry.holders.get_mut(worker) else {
            return false;
        };
        if let Some(tier) = tier {
            let count = holder.count(tier);
            *count = count.saturating_sub(1);
            if holder.gpu > 0 || holder.cpu > 0 {
                return false;
            }
        }
        if entry.holders.remove(worker) {
            self.map.remove(&key);
        }
        self.entries -= 1;
        true
    }

    /// Drop least recently used keys until at the low-water mark.
    fn evict(&mut self, evicted: &mut Vec<WorkerId>) {
        let mut order: Vec<(u64, BlockKey)> = self
            .map
            .iter()
            .map(|(k, e)| (e.last_used.load(Relaxed), *k))
            .collect();
        order.sort_unstable();
        for (_, key) in order {
            if self.entries <= self.low_water {
                break;
            }
            if let Some(entry) = self.map.remove(&key) {
                let holders = entry.holders.as_slice();
                self.entries -= holders.len();
                evicted.extend(holders.iter().map(|h| h.worker));
            }
        }
    }
}

// === impl Holder ===

impl Holder {
    fn count(&mut self, tier: Tier) -> &mut u16 {
        match tier {
            Tier::Gpu => &mut self.gpu,
            Tier::Cpu => &mut self.cpu,
        }
    }
}

// === impl Holders ===

impl Holders {
    fn as_slice(&self) -> &[Holder] {
        match self {
            Holders::One(h) => std::slice::from_ref(h),
            Holders::Many(hs) => hs,
        }
    }

    fn get(&self, worker: WorkerId) -> Option<&Holder> {
        self.as_slice().iter().find(|h| h.worker == worker)
    }

    fn get_mut(&mut self, worker: WorkerId) -> Option<&mut Holder> {
        match self {
            Holders::One(h) => (h.worker == worker).then_some(h),
            Holders::Many(hs) => hs.iter_mut().find(|h| h.worker == worker),
        }
    }

    fn push(&mut self, holder: Holder) {
        let mut all = self.as_slice().to_vec();
        all.push(holder);
        *self = Holders::Many(all.into_boxed_slice());
    }

    /// Remove `worker`; true when no holder is left.
    fn remove(&mut self, worker: WorkerId) -> bool {
        match self {
            Holders::One(h) => h.worker == worker,
            Holders::Many(hs) => {
                let rest: Vec<Holder> = hs.iter().copied().filter(|h| h.worker != worker).collect();
                match rest.as_slice() {
                    [] => return true,
                    [one] => *self = Holders::One(*one),
                    _ => *self = Holders::Many(rest.into_boxed_slice()),
                }
                false
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn k(i: u64) -> BlockKey {
        BlockKey(i.wrapping_mul(0x9e37_79b9_7f4a_7c15))
    }

    fn add(b: &MemoryBackend, worker: WorkerId, keys: &[u64]) {
        let ops: Vec<KeyOp> = keys.iter().map(|i| KeyOp::Add(k(*i), Tier::Gpu)).collect();
        b.apply_sync(worker, &ops);
    }

    fn held(b: &MemoryBackend, i: u64) -> Vec<WorkerId> {
        b.lookup_sync(&[k(i)]).iter().map(|m| m.worker).collect()
    }

    #[test]
    fn lru_evicts_the_least_recently_used_whole_keys() {
        let b = MemoryBackend::with_shards(4, 1);
        for i in 0..4 {
            add(&b, 0, &[i]);
        }
        add(&b, 1, &[0]); // key 0 gets a second holder: 5 entries > 4
        // Key 1 is the least recently used.
        assert_eq!(b.entries(), 4);
        assert!(held(&b, 1).is_empty());
        assert_eq!(held(&b, 0), vec![0, 1]);
        // A lookup makes key 2 recent; then key 3 is the oldest.
        let _ = b.lookup_sync(&[k(2)]);
        add(&b, 0, &[5]);
        assert!(held(&b, 3).is_empty());
        assert_eq!(held(&b, 2), vec![0]);
        // Then key 0, with both its holders.
        add(&b, 0, &[6]);
        assert_eq!(b.entries(), 3);
        assert!(held(&b, 0).is_empty());
        for i in [2, 5, 6] {
            assert_eq!(held(&b, i), vec![0]);
        }
        assert_eq!(b.worker_blocks(0), 3);
        assert_eq!(b.worker_blocks(1), 0);
        assert_eq!(b.evicted(), 4);
    }

    #[test]
    fn capacity_bound_holds_with_shards() {
        let b = MemoryBackend::with_shards(1000, 8);
        for round in 0..50u64 {
            let keys: Vec<u64> = (0..100).map(|i| round * 100 + i).collect();
            add(&b, (round % 3) as WorkerId, &keys);
            assert!(b.entries() <= 1000, "{}", b.entries());
        }
        let per_worker: u64 = (0..3).map(|w| b.worker_blocks(w)).sum();
        assert_eq!(per_worker, b.entries());
        assert!(b.entries() >= 900);
    }

    #[test]
    fn zero_capacity_keeps_nothing() {
        let b = MemoryBackend::new(0);
        add(&b, 0, &[1, 2, 3]);
        assert_eq!(b.entries(), 0);
        assert!(held(&b, 1).is_empty());
    }

    #[test]
    fn holders_grow_and_shrink() {
        let b = MemoryBackend::new(1 << 10);
        for w in 0..4 {
            add(&b, w, &[1]);
        }
        assert_eq!(held(&b, 1), vec![0, 1, 2, 3]);
        b.apply_sync(2, &[KeyOp::Remove(k(1), Tier::Gpu)]);
        b.apply_sync(0, &[KeyOp::Purge(k(1))]);
        assert_eq!(held(&b, 1), vec![1, 3]);
        b.apply_sync(1, &[KeyOp::Remove(k(1), Tier::Cpu)]); // no CPU copy: no-op
        b.apply_sync(1, &[KeyOp::Remove(k(1), Tier::Gpu)]);
        assert_eq!(held(&b, 1), vec![3]);
        assert_eq!(b.entries(), 1);
        b.apply_sync(3, &[KeyOp::Remove(k(1), Tier::Gpu)]);
        assert_eq!(b.entries(), 0);
        assert!(held(&b, 1).is_empty());
    }

    #[test]
    fn purge_scans_every_shard() {
        let b = MemoryBackend::with_shards(1 << 12, 8);
        add(&b, 0, &(0..100).collect::<Vec<_>>());
        add(&b, 1, &(50..150).collect::<Vec<_>>());
        b.purge_sync(1);
        assert_eq!(
            (b.worker_blocks(0), b.worker_blocks(1), b.entries()),
            (100, 0, 100)
        );
        assert!(held(&b, 120).is_empty());
        assert_eq!(held(&b, 60), vec![0]);
    }

    /// Each worker's leading run of `chain` (any tier, and on the GPU),
    /// key by key: what the walk must find.
    fn runs(held: &[Vec<Option<Tier>>]) -> Vec<WorkerMatch> {
        held.iter()
            .enumerate()
            .filter(|(_, tiers)| tiers.first().is_some_and(Option::is_some))
            .map(|(w, tiers)| WorkerMatch {
                worker: w as WorkerId,
                cpu_blocks: tiers.iter().take_while(|t| t.is_some()).count() as u32,
                gpu_blocks: tiers.iter().take_while(|t| **t == Some(Tier::Gpu)).count() as u32,
            })
            .collect()
    }

    #[test]
    fn long_walks_match_each_workers_leading_run() {
        use rand::{Rng, SeedableRng, rngs::SmallRng};
        let mut rng = SmallRng::seed_from_u64(3);
        for shards in [1, 8, 64] {
            for round in 0..200u64 {
                let b = MemoryBackend::with_shards(1 << 16, shards);
                let len = rng.random_range(1..=120);
                let chain: Vec<u64> = (0..len).map(|i| round * 1_000 + i).collect();
                // Per worker, per key: held on which tier, if at all (runs
                // of every length, a GPU run inside each).
                let held: Vec<Vec<Option<Tier>>> = (0..4)
                    .map(|_| {
                        let run = rng.random_range(0..=len);
                        let gpu = rng.random_range(0..=run);
                        (0..len)
                            .map(|i| match i {
                                i if i < gpu => Some(Tier::Gpu),
                                i if i < run => Some(Tier::Cpu),
                                // Held past a gap: must not count.
                                _ => rng.random_bool(0.2).then_some(Tier::Gpu),
                            })
                            .collect()
                    })
                    .collect();
                for (w, tiers) in held.iter().enumerate() {
                    let ops: Vec<KeyOp> = chain
                        .iter()
                        .zip(tiers)
                        .filter_map(|(i, t)| t.map(|t| KeyOp::Add(k(*i), t)))
                        .collect();
                    b.apply_sync(w as WorkerId, &ops);
                }
                let keys: Vec<BlockKey> = chain.iter().map(|i| k(*i)).collect();
                assert_eq!(
                    b.lookup_sync(&keys),
                    runs(&held),
                    "{shards} shards, {len} keys"
                );
            }
        }
    }

    #[test]
    fn entry_sizes_stay_small() {
        // Documented in README.md: 32-byte buckets, 8-byte holders.
        assert_eq!(size_of::<Holder>(), 8);
        assert_eq!(size_of::<(BlockKey, Entry)>(), 32);
    }
}
