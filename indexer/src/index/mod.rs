//! The prefix index: which worker holds which blocks, on which tier.
//!
//! Two layers (design notes in `README.md` beside this file):
//! - [`ingest`]: per worker, turns vLLM events into key operations ([`KeyOp`]):
//!   chain keys, the engine-hash → key map, duplicate counts, tiers, hybrid
//!   groups. Backend independent.
//! - [`IndexBackend`]: stores `(key, worker) → copies per tier` and answers
//!   longest-prefix lookups. [`memory::MemoryBackend`] is the in-process one;
//!   a remote (Redis) backend implements the same trait.
//!
//! [`Index`] ties them together; it is what the service uses.

mod extras;
pub mod ingest;
pub mod memory;
pub mod redis;
/// Test support (the `testing` feature): the differential harness.
#[cfg(any(test, feature = "testing"))]
pub mod testing;

#[cfg(test)]
mod golden_tests;
#[cfg(test)]
mod tests;

use std::collections::HashMap;
use std::sync::Arc;

use futures::future::BoxFuture;
use kvsteer_kv_events::EventBatch;
use parking_lot::RwLock;

use crate::keys::{BlockKey, KeyContext};
use ingest::WorkerIngest;

/// Dense worker id: the position of the worker in the config.
pub type WorkerId = u32;

/// Where a cached block lives.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Tier {
    Gpu,
    /// CPU offloading tier (vLLM `medium: "CPU"`): a hit costs a load, not a prefill.
    Cpu,
}

/// A worker's match for a prompt, in blocks from the start of the prompt.
///
/// - `gpu_blocks`: longest prefix whose every block is on the worker's GPU.
/// - `cpu_blocks`: longest prefix whose every block is on GPU **or** CPU, so
///   `cpu_blocks >= gpu_blocks`; blocks `gpu_blocks..cpu_blocks` would be loaded
///   from the CPU tier, the rest of the prompt prefilled.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct WorkerMatch {
    pub worker: WorkerId,
    pub gpu_blocks: u32,
    pub cpu_blocks: u32,
}

/// What one [`Index::apply_batch`] did, in blocks.
#[derive(Clone, Debug, Default)]
pub struct ApplyStats {
    /// Block copies stored (a `BlockStored` of n blocks counts n).
    pub stored: u64,
    /// Block copies removed.
    pub removed: u64,
    /// The batch held an `AllBlocksCleared`.
    pub cleared: bool,
    /// Blocks not applied: unknown parent, non-full-attention group, unknown
    /// medium, malformed event, removal of an unknown hash, unregistered worker.
    pub skipped: u64,
    /// Key operations the backend failed to apply (always 0 for memory).
    pub backend_errors: u64,
}

#[derive(Debug, thiserror::Error)]
pub enum IndexError {
    /// The storage backend failed (e.g. Redis unreachable); retrying may help.
    #[error("index backend: {0}")]
    Backend(String),
}

/// One change to the stored index, for one worker.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KeyOp {
    /// One more copy of `key` on `tier`.
    Add(BlockKey, Tier),
    /// One copy fewer (no-op when none is stored).
    Remove(BlockKey, Tier),
    /// Drop every copy of `key`, all tiers.
    Purge(BlockKey),
}

/// Storage of `(key, worker) → copies per tier`.
///
/// Methods return [`BoxFuture`] so the trait is dyn-compatible and a backend
/// may live in another crate; the in-memory backend answers inline and
/// returns a ready future (one small allocation per call).
pub trait IndexBackend: Send + Sync + 'static {
    /// Apply `ops` in order. Calls for one worker never overlap.
    fn apply<'a>(
        &'a self,
        worker: WorkerId,
        ops: &'a [KeyOp],
    ) -> BoxFuture<'a, Result<(), IndexError>>;
    /// Drop every entry of `worker` (a full scan; rare).
    fn purge_worker(&self, worker: WorkerId) -> BoxFuture<'_, Result<(), IndexError>>;
    /// One match per worker holding at least the first key; sorted by worker.
    fn lookup<'a>(
        &'a self,
        keys: &'a [BlockKey],
    ) -> BoxFuture<'a, Result<Vec<WorkerMatch>, IndexError>>;
    /// Total `(key, worker)` entries (last known for remote backends).
    fn entries(&self) -> u64;
    /// `(key, worker)` entries of one worker (last known for remote backends).
    fn worker_blocks(&self, worker: WorkerId) -> u64;
    /// `(key, worker)` entries dropped by the backend's own bound so far.
    fn evicted(&self) -> u64 {
        0
    }
}

/// The prefix index the service uses. Cheap to clone (an `Arc`).
#[derive(Clone)]
pub struct Index {
    inner: Arc<Inner>,
}

struct Inner {
    backend: Arc<dyn IndexBackend>,
    workers: RwLock<HashMap<WorkerId, Arc<WorkerHandle>>>,
    /// Failed applies come in bursts (Redis down, a lease lost: every
    /// batch of every worker fails): one warning per interval, with a count.
    apply_warnings: LogEvery,
}

/// Lets one log line through per `every`, counting the ones held back.
struct LogEvery {
    every: std::time::Duration,
    last: parking_lot::Mutex<Option<std::time::Instant>>,
    held: std::sync::atomic::AtomicU64,
}

impl LogEvery {
    fn new(every: std::time::Duration) -> Self {
        Self {
            every,
            last: parking_lot::Mutex::new(None),
            held: std::sync::atomic::AtomicU64::new(0),
        }
    }

    /// `Some(held back since the last one)` when a line may go out now.
    fn allow(&self) -> Option<u64> {
        use std::sync::atomic::Ordering::Relaxed;
        let now = std::time::Instant::now();
        let mut last = self.last.lock();
        if last.is_some_and(|t| now.duration_since(t) < self.every) {
            self.held.fetch_add(1, Relaxed);
            return None;
        }
        *last = Some(now);
        Some(self.held.swap(0, Relaxed))
    }
}

/// A worker's ingest state. The async mutex keeps one worker's batches in
/// order even across backend awaits.
struct WorkerHandle {
    state: tokio::sync::Mutex<WorkerIngest>,
    /// A context from `register_worker` not yet applied (it purges the
    /// worker's old keys, which needs the async lock).
    pending_ctx: parking_lot::Mutex<Option<KeyContext>>,
}

// === impl Index ===

impl Index {
    /// An in-memory index bounded to `capacity_entries` `(block, worker)` entries.
    pub fn memory(capacity_entries: usize) -> Index {
        Self::with_backend(Arc::new(memory::MemoryBackend::new(capacity_entries)))
    }

    pub fn with_backend(backend: Arc<dyn IndexBackend>) -> Index {
        Index {
            inner: Arc::new(Inner {
                backend,
                workers: RwLock::new(HashMap::new()),
                apply_warnings: LogEvery::new(std::time::Duration::from_secs(5)),
            }),
        }
    }

    /// Set the key context for `worker`'s events. Registering again with
    /// another model or block size drops the worker's entries (before its next
    /// batch); with the same one it is a no-op.
    pub fn register_worker(&self, worker: WorkerId, model: &str, block_size: u32) {
        let ctx = KeyContext::new(model, None, block_size);
        let mut workers = self.inner.workers.write();
        match workers.get(&worker) {
            Some(handle) => *handle.pending_ctx.lock() = Some(ctx),
            None => {
                let handle = WorkerHandle {
                    state: tokio::sync::Mutex::new(WorkerIngest::new(ctx)),
                    pending_ctx: parking_lot::Mutex::new(None),
                };
                workers.insert(worker, Arc::new(handle));
            }
        }
    }

    fn handle(&self, worker: WorkerId) -> Option<Arc<WorkerHandle>> {
        self.inner.workers.read().get(&worker).cloned()
    }

    /// Apply one batch of `worker`'s events. Never fails: bad events are
    /// counted in [`ApplyStats::skipped`], backend failures in `backend_errors`.
    pub async fn apply_batch(&self, worker: WorkerId, batch: &EventBatch) -> ApplyStats {
        let Some(handle) = self.handle(worker) else {
            tracing::debug!(worker, "events for an unregistered worker");
            return ApplyStats {
                skipped: ingest::batch_blocks(batch),
                ..ApplyStats::default()
            };
        };
        let mut state = handle.state.lock().await;
        let mut ops = Vec::new();
        let pending = handle.pending_ctx.lock().take();
        if let Some(ctx) = pending
            && ctx != *state.context()
        {
            state.clear(&mut ops);
            state.set_context(ctx);
        }
        let mut stats = state.apply(batch, &mut ops);
        if let Err(error) = self.inner.backend.apply(worker, &ops).await {
            if let Some(held_back) = self.inner.apply_warnings.allow() {
                tracing::warn!(worker, %error, ops = ops.len(), held_back, "index backend failed to apply events (one line per 5 s; `held_back` others since the last)");
            }
            stats.backend_errors += ops.len() as u64;
        }
        stats
    }

    /// Forget everything `worker` holds (AllBlocksCleared, engine restart).
    /// The worker stays registered.
    pub async fn clear_worker(&self, worker: WorkerId) -> Result<(), IndexError> {
        if let Some(handle) = self.handle(worker) {
            let mut state = handle.state.lock().await;
            let mut ops = Vec::new();
            state.clear(&mut ops);
            self.inner.backend.apply(worker, &ops).await?;
        }
        self.purge_leftovers(worker).await
    }

    /// Forget `worker`'s ingest state and purge every entry the backend
    /// holds for it, whatever the local counters say: a restarted service
    /// (entries from an earlier run) or a resync after failed writes. The
    /// worker stays registered; no batch is applied meanwhile.
    pub async fn reset_worker(&self, worker: WorkerId) -> Result<(), IndexError> {
        let handle = self.handle(worker);
        let _state = match &handle {
            Some(handle) => {
                let mut state = handle.state.lock().await;
                state.clear(&mut Vec::new());
                Some(state)
            }
            None => None,
        };
        self.inner.backend.purge_worker(worker).await
    }

    /// Unregister `worker` and purge its entries.
    pub async fn remove_worker(&self, worker: WorkerId) -> Result<(), IndexError> {
        let handle = self.inner.workers.write().remove(&worker);
        if let Some(handle) = handle {
            let mut state = handle.state.lock().await;
            let mut ops = Vec::new();
            state.clear(&mut ops);
            self.inner.backend.apply(worker, &ops).await?;
        }
        self.purge_leftovers(worker).await
    }

    /// Forget `worker`'s ingest state without touching the backend (a
    /// replica that does not write it).
    pub fn unregister_worker(&self, worker: WorkerId) {
        self.inner.workers.write().remove(&worker);
    }

    /// Entries the ingest map no longer knows (none, unless a backend call
    /// failed halfway) are found by a full scan.
    async fn purge_leftovers(&self, worker: WorkerId) -> Result<(), IndexError> {
        if self.inner.backend.worker_blocks(worker) > 0 {
            self.inner.backend.purge_worker(worker).await?;
        }
        Ok(())
    }

    /// One [`WorkerMatch`] per worker holding at least `keys[0]`, sorted by worker.
    pub async fn lookup(&self, keys: &[BlockKey]) -> Result<Vec<WorkerMatch>, IndexError> {
        if keys.is_empty() {
            return Ok(Vec::new());
        }
        self.inner.backend.lookup(keys).await
    }

    /// Total `(block, worker)` entries.
    pub fn entries(&self) -> u64 {
        self.inner.backend.entries()
    }

    /// `(block, worker)` entries of one worker.
    pub fn worker_blocks(&self, worker: WorkerId) -> u64 {
        self.inner.backend.worker_blocks(worker)
    }

    /// `(block, worker)` entries dropped by the capacity bound so far.
    pub fn evicted(&self) -> u64 {
        self.inner.backend.evicted()
    }

    /// Engine hashes `worker`'s ingest map tracks (for metrics and tests).
    pub async fn tracked_hashes(&self, worker: WorkerId) -> usize {
        match self.handle(worker) {
            Some(handle) => handle.state.lock().await.tracked_hashes(),
            None => 0,
        }
    }

    /// Estimated heap bytes of the ingest maps (the backend reports its own).
    pub async fn ingest_bytes(&self) -> usize {
        let handles: Vec<_> = self.inner.workers.read().values().cloned().collect();
        let mut total = 0;
        for handle in handles {
            total += handle.state.lock().await.heap_bytes();
        }
        total
    }
}

#[cfg(test)]
mod log_every_tests {
    use super::LogEvery;

    #[test]
    fn one_line_per_interval_with_the_count_held_back() {
        let l = LogEvery::new(std::time::Duration::from_secs(3600));
        assert_eq!(l.allow(), Some(0));
        for _ in 0..5 {
            assert_eq!(l.allow(), None);
        }
        let l0 = LogEvery::new(std::time::Duration::ZERO);
        assert_eq!((l0.allow(), l0.allow()), (Some(0), Some(0)));
        assert_eq!(l.held.load(std::sync::atomic::Ordering::Relaxed), 5);
    }
}
