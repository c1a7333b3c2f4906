//! The hot-prefix cache: lookup results kept in the process for
//! `cache_ttl_ms`, in front of the Redis lookup.
//!
//! - Key: the chain's last [`BlockKey`] and its length. Chain keys hash
//!   their parent, so the last key names the whole prefix.
//! - Staleness: an answer is served at most `cache_ttl_ms` after Redis gave
//!   it, whatever was written since (by this replica or another): a block
//!   an engine evicted may still look present for that long (a false hit
//!   costs one prefill), a block just stored may look absent (a missed hit).
//!   [`IndexBackend::purge_worker`] through the cache (resync, lease
//!   acquisition) clears it.
//! - Bound: `cache_entries` in all, split over [`SHARDS`] mutex-guarded
//!   maps. A full shard first drops its expired entries, then an arbitrary
//!   one. No LRU order: an entry lives at most a TTL anyway, so recency
//!   buys little over insertion age.
//! - Failed lookups are not cached.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::future::BoxFuture;
use parking_lot::Mutex;

use super::metrics::{CacheResult, RedisMetrics};
use crate::index::{IndexBackend, IndexError, KeyOp, WorkerId, WorkerMatch};
use crate::keys::BlockKey;

pub const SHARDS: usize = 16;

type Key = (u64, u32);

struct Entry {
    at: Instant,
    matches: Arc<[WorkerMatch]>,
}

/// Bounded map chain → lookup result, entries valid for `ttl`.
pub struct HotCache {
    ttl: Duration,
    per_shard: usize,
    shards: Box<[Mutex<HashMap<Key, Entry>>]>,
}

// === impl HotCache ===

impl HotCache {
    /// At most `entries` results (rounded up to a multiple of [`SHARDS`]).
    pub fn new(entries: usize, ttl: Duration) -> Self {
        Self {
            ttl,
            per_shard: entries.div_ceil(SHARDS).max(1),
            shards: (0..SHARDS).map(|_| Mutex::new(HashMap::new())).collect(),
        }
    }

    fn key(keys: &[BlockKey]) -> Option<Key> {
        let last = keys.last()?;
        Some((last.0, u32::try_from(keys.len()).ok()?))
    }

    fn shard(&self, key: Key) -> &Mutex<HashMap<Key, Entry>> {
        // Block keys are hashes already: their low bits spread well.
        &self.shards[(key.0 as usize ^ key.1 as usize) % SHARDS]
    }

    /// The result cached for `keys` if it is younger than the TTL at `now`.
    pub fn get(&self, keys: &[BlockKey], now: Instant) -> Option<Vec<WorkerMatch>> {
        let key = Self::key(keys)?;
        let shard = self.shard(key).lock();
        let e = shard.get(&key)?;
        (now.saturating_duration_since(e.at) < self.ttl).then(|| e.matches.to_vec())
    }

    /// Remember `matches` for `keys`, answered by the backend at `at` (the
    /// time the lookup was sent, so the TTL bounds the answer's real age).
    pub fn insert(&self, keys: &[BlockKey], matches: &[WorkerMatch], at: Instant) {
        let Some(key) = Self::key(keys) else {
            return;
        };
        let mut shard = self.shard(key).lock();
        if shard.len() >= self.per_shard && !shard.contains_key(&key) {
            let ttl = self.ttl;
            shard.retain(|_, e| at.saturating_duration_since(e.at) < ttl);
            if shard.len() >= self.per_shard
                && let Some(victim) = shard.keys().next().copied()
            {
                shard.remove(&victim);
            }
        }
        shard.insert(
            key,
            Entry {
                at,
                matches: matches.into(),
            },
        );
    }

    pub fn clear(&self) {
        for shard in self.shards.iter() {
            shard.lock().clear();
        }
    }

    /// Entries held, expired ones included.
    pub fn len(&self) -> usize {
        self.shards.iter().map(|s| s.lock().len()).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// An [`IndexBackend`] whose lookups go through a [`HotCache`]; writes pass
/// through (a purge also clears the cache).
pub struct CachedLookups {
    inner: Arc<dyn IndexBackend>,
    cache: HotCache,
    metrics: RedisMetrics,
}

// === impl CachedLookups ===

impl CachedLookups {
    pub fn new(inner: Arc<dyn IndexBackend>, cache: HotCache, metrics: RedisMetrics) -> Self {
        Self {
            inner,
            cache,
            metrics,
        }
    }

    pub fn cache(&self) -> &HotCache {
        &self.cache
    }

    async fn cached_lookup(&self, keys: &[BlockKey]) -> Result<Vec<WorkerMatch>, IndexError> {
        let now = Instant::now();
        if let Some(hit) = self.cache.get(keys, now) {
            self.metrics.cache(CacheResult::hit);
            return Ok(hit);
        }
        self.metrics.cache(CacheResult::miss);
        let matches = self.inner.lookup(keys).await?;
        self.cache.insert(keys, &matches, now);
        Ok(matches)
    }
}

impl IndexBackend for CachedLookups {
    fn apply<'a>(
        &'a self,
        worker: WorkerId,
        ops: &'a [KeyOp],
    ) -> BoxFuture<'a, Result<(), IndexError>> {
        self.inner.apply(worker, ops)
    }

    fn purge_worker(&self, worker: WorkerId) -> BoxFuture<'_, Result<(), IndexError>> {
        Box::pin(async move {
            let r = self.inner.purge_worker(worker).await;
            self.cache.clear();
            r
        })
    }

    fn lookup<'a>(
        &'a self,
        keys: &'a [BlockKey],
    ) -> BoxFuture<'a, Result<Vec<WorkerMatch>, IndexError>> {
        Box::pin(self.cached_lookup(keys))
    }

    fn entries(&self) -> u64 {
        self.inner.entries()
    }

    fn worker_blocks(&self, worker: WorkerId) -> u64 {
        self.inner.worker_blocks(worker)
    }

    fn evicted(&self) -> u64 {
        self.inner.evicted()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::index::Tier;
    use crate::index::memory::MemoryBackend;

    fn m(worker: WorkerId, blocks: u32) -> WorkerMatch {
        WorkerMatch {
            worker,
            gpu_blocks: blocks,
            cpu_blocks: blocks,
        }
    }

    fn chain(seed: u64, len: u64) -> Vec<BlockKey> {
        (0..len)
            .map(|d| BlockKey((seed << 20 | d).wrapping_mul(0x9e37_79b9_7f4a_7c15)))
            .collect()
    }

    #[test]
    fn hit_until_the_ttl_then_miss() {
        let ttl = Duration::from_millis(250);
        let cache = HotCache::new(64, ttl);
        let t0 = Instant::now();
        let keys = chain(1, 8);
        assert_eq!(cache.get(&keys, t0), None);
        cache.insert(&keys, &[m(2, 8)], t0);
        assert_eq!(cache.get(&keys, t0), Some(vec![m(2, 8)]));
        assert_eq!(cache.get(&keys, t0 + ttl / 2), Some(vec![m(2, 8)]));
        assert_eq!(cache.get(&keys, t0 + ttl), None, "expired at the TTL");
        // A prefix of the chain, or the same last key at another length, is
        // another entry.
        assert_eq!(cache.get(&keys[..7], t0), None);
        assert_eq!(cache.get(&[], t0), None);
    }

    #[test]
    fn stays_within_its_bound_and_prefers_dropping_expired_entries() {
        let ttl = Duration::from_secs(1);
        let cache = HotCache::new(SHARDS * 4, ttl);
        let t0 = Instant::now();
        for i in 0..10_000 {
            cache.insert(&chain(i, 3), &[m(0, 3)], t0);
        }
        assert!(cache.len() <= SHARDS * 4, "{}", cache.len());
        // Later inserts push out the expired generation first: as many as
        // one shard holds all fit, wherever they land.
        let t1 = t0 + 2 * ttl;
        let fresh: Vec<_> = (0..4).map(|i| chain(100_000 + i, 3)).collect();
        for keys in &fresh {
            cache.insert(keys, &[m(1, 3)], t1);
        }
        for keys in &fresh {
            assert_eq!(cache.get(keys, t1), Some(vec![m(1, 3)]));
        }
        assert!(cache.len() <= SHARDS * 4);
        cache.clear();
        assert!(cache.is_empty());
    }

    #[tokio::test]
    async fn serves_hits_counts_them_and_purge_clears() {
        let memory = Arc::new(MemoryBackend::new(1 << 16));
        let metrics = RedisMetrics::default();
        let cached = CachedLookups::new(
            memory.clone(),
            HotCache::new(128, Duration::from_secs(3600)),
            metrics.clone(),
        );
        let keys = chain(7, 4);
        let adds: Vec<KeyOp> = keys.iter().map(|k| KeyOp::Add(*k, Tier::Gpu)).collect();
        cached.apply(3, &adds).await.unwrap();
        assert_eq!(cached.lookup(&keys).await.unwrap(), vec![m(3, 4)]);
        // Written behind the cache's back: the cached answer stays (stale
        // for at most the TTL).
        memory.apply(4, &adds).await.unwrap();
        assert_eq!(cached.lookup(&keys).await.unwrap(), vec![m(3, 4)]);
        assert_eq!(metrics.cache_count(CacheResult::hit), 1);
        assert_eq!(metrics.cache_count(CacheResult::miss), 1);
        // A purge through the cache clears it.
        cached.purge_worker(3).await.unwrap();
        assert_eq!(cached.lookup(&keys).await.unwrap(), vec![m(4, 4)]);
        assert_eq!(metrics.cache_count(CacheResult::miss), 2);
    }
}
