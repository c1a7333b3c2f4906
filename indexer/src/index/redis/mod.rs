//! The Redis backend: the prefix index in a Redis shared by indexer
//! replicas. Key layout, lifetimes and trade-offs are in `README.md` beside
//! this file.
//!
//! - Writes: one Lua script call per [`IndexBackend::apply`] (chunked at
//!   `ops_per_script`), atomic, returning how many `(key, worker)` entries it
//!   created or removed.
//! - Lookups: ONE round trip for the whole chain, either a pipeline of
//!   `HGETALL`s walked here or a read-only script walking in Redis
//!   ([`LookupMode`]).
//! - Every call runs under a `tokio` timeout (`lookup_timeout_ms` for
//!   lookups, `write_timeout_ms` otherwise) and a semaphore of
//!   `max_in_flight` permits taken with `try_acquire`: when Redis is slow or
//!   down, calls fail with [`IndexError::Backend`] within their budget and
//!   nothing queues without bound. [`ConnectionManager`] reconnects in the
//!   background with a capped exponential backoff.
//! - [`IndexBackend::entries`] / [`IndexBackend::worker_blocks`] are local
//!   counters fed by the apply script's deltas; [`RedisBackend::refresh_stats`]
//!   (or [`RedisBackend::spawn_stats_refresh`]) replaces them with the sizes
//!   of the worker sets in Redis (other replicas' writes, TTL expiry).
//! - Several replicas: [`lease`] elects one writer per worker through a
//!   lease in Redis; with [`RedisBackend::enable_fencing`] every write
//!   checks the lease inside its script. [`cache::CachedLookups`] keeps hot
//!   lookup results for `cache_ttl_ms` in front of the backend.

pub mod cache;
pub mod config;
pub mod layout;
pub mod lease;
pub mod metrics;
pub mod scripts;
/// Test support (the `testing` feature): a `redis-server` of its own.
#[cfg(any(test, feature = "testing"))]
pub mod testing;
pub mod walk;

use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::sync::{Arc, OnceLock, Weak};
use std::time::{Duration, Instant};

use ::redis::aio::{ConnectionManager, ConnectionManagerConfig};
use ::redis::{RedisError, RedisResult, Script, Value};
use futures::future::BoxFuture;
use parking_lot::Mutex;
use tokio::sync::Semaphore;

use super::{IndexBackend, IndexError, KeyOp, WorkerId, WorkerMatch};
use crate::keys::BlockKey;
pub use config::{LookupMode, RedisConfig, RedisConfigError, WriterMode};
use layout::{Layout, op_code};
pub use metrics::RedisMetrics;
use metrics::{ErrorKind, Op};

/// Worker-set members popped per purge script call.
const PURGE_CHUNK: usize = 1_024;
/// Purge script calls per `purge_worker` at most (bounds a pathological loop).
const MAX_PURGE_ROUNDS: usize = 1 << 16;
/// Reconnect attempts per reconnect round; a failed call starts a new round.
const RECONNECT_RETRIES: usize = 4;
const RECONNECT_MIN_DELAY: Duration = Duration::from_millis(10);

#[derive(Debug, thiserror::Error)]
pub enum RedisSetupError {
    #[error("redis config: {0}")]
    Config(#[from] RedisConfigError),
    #[error("redis client: {0}")]
    Client(#[from] RedisError),
}

pub struct RedisBackend {
    cfg: RedisConfig,
    layout: Layout,
    conns: Box<[ConnectionManager]>,
    next_conn: AtomicUsize,
    in_flight: Semaphore,
    apply_script: Script,
    purge_script: Script,
    lookup_script: Script,
    leases_script: Script,
    release_script: Script,
    metrics: RedisMetrics,
    counts: Mutex<Counts>,
    /// Fencing token: when set, every apply and purge of worker `w` runs
    /// only if `{prefix}:lease:{w}` holds it.
    fence: OnceLock<String>,
}

/// Last known `(key, worker)` entries.
#[derive(Default)]
struct Counts {
    total: i64,
    per_worker: HashMap<WorkerId, i64>,
}

// === impl RedisBackend ===

impl RedisBackend {
    /// Validates `cfg` and sets up `cfg.connections` lazy connections: it
    /// does not wait for Redis (use [`Self::ping`]), so the service starts
    /// while Redis is down. Must run inside a tokio runtime.
    pub async fn new(cfg: RedisConfig, metrics: RedisMetrics) -> Result<Self, RedisSetupError> {
        cfg.validate()?;
        let client = ::redis::Client::open(cfg.url.as_str())?;
        let manager_cfg = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(Duration::from_millis(cfg.connect_timeout_ms)))
            .set_response_timeout(Some(cfg.write_timeout().max(cfg.lookup_timeout())))
            .set_number_of_retries(RECONNECT_RETRIES)
            .set_min_delay(RECONNECT_MIN_DELAY)
            .set_max_delay(Duration::from_millis(cfg.backoff_max_ms));
        let conns = (0..cfg.connections)
            .map(|_| ConnectionManager::new_lazy_with_config(client.clone(), manager_cfg.clone()))
            .collect::<Result<Vec<_>, _>>()?
            .into_boxed_slice();
        Ok(Self {
            layout: Layout::new(&cfg.key_prefix),
            conns,
            next_conn: AtomicUsize::new(0),
            in_flight: Semaphore::new(cfg.max_in_flight),
            apply_script: Script::new(scripts::APPLY),
            purge_script: Script::new(scripts::PURGE),
            lookup_script: Script::new(scripts::LOOKUP),
            leases_script: Script::new(scripts::LEASES),
            release_script: Script::new(scripts::RELEASE),
            metrics,
            counts: Mutex::new(Counts::default()),
            fence: OnceLock::new(),
            cfg,
        })
    }

    pub fn config(&self) -> &RedisConfig {
        &self.cfg
    }

    pub fn metrics(&self) -> &RedisMetrics {
        &self.metrics
    }

    pub fn layout(&self) -> &Layout {
        &self.layout
    }

    /// From now on, writes of worker `w` (apply, purge) are refused by Redis
    /// unless `{prefix}:lease:{w}` holds `token` (this replica's lease id).
    /// Set once; later calls are ignored.
    pub fn enable_fencing(&self, token: &str) {
        let _ = self.fence.set(token.to_owned());
    }

    fn fence_token(&self) -> &str {
        self.fence.get().map_or("", String::as_str)
    }

    /// One lease round trip for `workers` (see [`scripts::LEASES`]): extend
    /// the leases `holder` holds, take the free ones flagged `true`. Returns
    /// each lease's holder afterwards (`None` = free). Budget: the write
    /// budget, at most a third of the lease TTL.
    pub async fn lease_round(
        &self,
        workers: &[(WorkerId, bool)],
        holder: &str,
    ) -> Result<Vec<Option<String>>, IndexError> {
        if workers.is_empty() {
            return Ok(Vec::new());
        }
        let mut inv = self.leases_script.prepare_invoke();
        for (w, _) in workers {
            inv.key(self.layout.lease(*w));
        }
        let flags: Vec<u8> = workers
            .iter()
            .map(|(_, acquire)| if *acquire { b'1' } else { b'0' })
            .collect();
        inv.arg(holder).arg(self.cfg.lease_ttl_ms).arg(flags);
        let mut con = self.conn();
        let fut = async move { inv.invoke_async::<Vec<String>>(&mut con).await };
        let holders = self.call(Op::lease, self.lease_budget(), fut).await?;
        if holders.len() != workers.len() {
            self.metrics.error(Op::lease, ErrorKind::protocol);
            return Err(IndexError::Backend(
                "redis lease: reply length differs from the request".into(),
            ));
        }
        Ok(holders
            .into_iter()
            .map(|h| (!h.is_empty()).then_some(h))
            .collect())
    }

    /// Delete the leases of `workers` that `holder` holds; returns how many.
    pub async fn release_leases(
        &self,
        workers: &[WorkerId],
        holder: &str,
    ) -> Result<usize, IndexError> {
        if workers.is_empty() {
            return Ok(0);
        }
        let mut inv = self.release_script.prepare_invoke();
        for w in workers {
            inv.key(self.layout.lease(*w));
        }
        inv.arg(holder);
        let mut con = self.conn();
        let fut = async move { inv.invoke_async::<usize>(&mut con).await };
        self.call(Op::lease, self.lease_budget(), fut).await
    }

    fn lease_budget(&self) -> Duration {
        self.cfg.write_timeout().min(self.cfg.lease_ttl() / 3)
    }

    /// One `PING` within the write budget.
    pub async fn ping(&self) -> Result<(), IndexError> {
        let mut con = self.conn();
        let fut = async move { ::redis::cmd("PING").query_async::<String>(&mut con).await };
        self.call(Op::ping, self.cfg.write_timeout(), fut)
            .await
            .map(drop)
    }

    /// Replace the local counters with the sizes of the worker sets in Redis
    /// (one round trip for the registry, one for the sizes). Includes other
    /// replicas' writes; a member whose block hash expired still counts
    /// until the worker's next write or purge touches it.
    pub async fn refresh_stats(&self) -> Result<(), IndexError> {
        let mut con = self.conn();
        let registry = self.layout.registry();
        let fut = async move {
            ::redis::cmd("SMEMBERS")
                .arg(registry)
                .query_async::<Vec<String>>(&mut con)
                .await
        };
        let members = self
            .call(Op::refresh, self.cfg.write_timeout(), fut)
            .await?;
        let workers: Vec<WorkerId> = members.iter().filter_map(|m| m.parse().ok()).collect();
        let mut pipe = ::redis::pipe();
        for w in &workers {
            pipe.cmd("SCARD").arg(self.layout.worker_set(*w));
        }
        let mut con = self.conn();
        let fut = async move { pipe.query_async::<Vec<i64>>(&mut con).await };
        let sizes = if workers.is_empty() {
            Vec::new()
        } else {
            self.call(Op::refresh, self.cfg.write_timeout(), fut)
                .await?
        };
        let mut counts = self.counts.lock();
        counts.per_worker = workers.into_iter().zip(sizes).collect();
        counts.total = counts.per_worker.values().sum();
        Ok(())
    }

    /// Call [`Self::refresh_stats`] every `every` until the backend is
    /// dropped; failures keep the last known counters.
    pub fn spawn_stats_refresh(self: &Arc<Self>, every: Duration) -> tokio::task::JoinHandle<()> {
        let weak: Weak<Self> = Arc::downgrade(self);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(every);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            tick.tick().await;
            loop {
                tick.tick().await;
                let Some(backend) = weak.upgrade() else {
                    return;
                };
                if let Err(error) = backend.refresh_stats().await {
                    tracing::debug!(%error, "redis stats refresh failed");
                }
            }
        })
    }

    fn conn(&self) -> ConnectionManager {
        let i = self.next_conn.fetch_add(1, Relaxed) % self.conns.len();
        self.conns[i].clone()
    }

    /// Run one Redis round trip under the in-flight bound and `budget`,
    /// recording its latency or its error kind.
    async fn call<T>(
        &self,
        op: Op,
        budget: Duration,
        fut: impl Future<Output = RedisResult<T>>,
    ) -> Result<T, IndexError> {
        let Ok(_permit) = self.in_flight.try_acquire() else {
            self.metrics.error(op, ErrorKind::saturated);
            return Err(IndexError::Backend(format!(
                "redis {op:?}: {} calls already in flight",
                self.cfg.max_in_flight
            )));
        };
        let start = Instant::now();
        match tokio::time::timeout(budget, fut).await {
            Ok(Ok(value)) => {
                self.metrics.observe(op, start.elapsed());
                Ok(value)
            }
            Ok(Err(error)) => {
                self.metrics.error(op, classify(&error));
                Err(IndexError::Backend(format!("redis {op:?}: {error}")))
            }
            Err(_) => {
                self.metrics.error(op, ErrorKind::timeout);
                Err(IndexError::Backend(format!(
                    "redis {op:?}: no reply within {budget:?}"
                )))
            }
        }
    }

    fn account(&self, worker: WorkerId, delta: i64) {
        if delta == 0 {
            return;
        }
        let mut counts = self.counts.lock();
        counts.total += delta;
        *counts.per_worker.entry(worker).or_default() += delta;
    }

    async fn apply_ops(&self, worker: WorkerId, ops: &[KeyOp]) -> Result<(), IndexError> {
        let field = worker.to_string();
        let ttl_ms = self.cfg.entry_ttl_s * 1_000;
        for chunk in ops.chunks(self.cfg.ops_per_script) {
            let mut inv = self.apply_script.prepare_invoke();
            inv.key(self.layout.worker_set(worker))
                .key(self.layout.registry())
                .key(self.layout.lease(worker));
            for op in chunk {
                let (KeyOp::Add(key, _) | KeyOp::Remove(key, _) | KeyOp::Purge(key)) = *op;
                inv.key(self.layout.block(key));
            }
            let codes: Vec<u8> = chunk.iter().map(op_code).collect();
            inv.arg(&field)
                .arg(ttl_ms)
                .arg(codes)
                .arg(self.fence_token());
            let mut con = self.conn();
            let fut = async move { inv.invoke_async::<i64>(&mut con).await };
            let delta = self.call(Op::apply, self.cfg.write_timeout(), fut).await?;
            self.account(worker, delta);
        }
        Ok(())
    }

    async fn purge(&self, worker: WorkerId) -> Result<(), IndexError> {
        let field = worker.to_string();
        let set = self.layout.worker_set(worker);
        for _ in 0..MAX_PURGE_ROUNDS {
            let mut inv = self.purge_script.prepare_invoke();
            inv.key(&set)
                .key(self.layout.lease(worker))
                .arg(&field)
                .arg(PURGE_CHUNK)
                .arg(self.fence_token());
            let mut con = self.conn();
            let fut = async move { inv.invoke_async::<usize>(&mut con).await };
            let popped = self.call(Op::purge, self.cfg.write_timeout(), fut).await?;
            if popped < PURGE_CHUNK {
                break;
            }
        }
        let mut counts = self.counts.lock();
        if let Some(n) = counts.per_worker.insert(worker, 0) {
            counts.total -= n;
        }
        Ok(())
    }

    async fn lookup_pipeline(&self, keys: &[BlockKey]) -> Result<Vec<WorkerMatch>, IndexError> {
        let mut pipe = ::redis::pipe();
        for key in keys {
            pipe.cmd("HGETALL").arg(self.layout.block(*key));
        }
        let mut con = self.conn();
        let fut = async move { pipe.query_async::<Vec<Value>>(&mut con).await };
        let replies = self
            .call(Op::lookup, self.cfg.lookup_timeout(), fut)
            .await?;
        let chain = walk::decode_hgetall(replies).ok_or_else(|| {
            self.metrics.error(Op::lookup, ErrorKind::protocol);
            IndexError::Backend("redis lookup: malformed HGETALL reply".into())
        })?;
        Ok(walk::walk(&chain))
    }

    async fn lookup_script(&self, keys: &[BlockKey]) -> Result<Vec<WorkerMatch>, IndexError> {
        let mut inv = self.lookup_script.prepare_invoke();
        for key in keys {
            inv.key(self.layout.block(*key));
        }
        let mut con = self.conn();
        let fut = async move { inv.invoke_async::<Vec<i64>>(&mut con).await };
        let flat = self
            .call(Op::lookup, self.cfg.lookup_timeout(), fut)
            .await?;
        walk::decode_script_reply(&flat).ok_or_else(|| {
            self.metrics.error(Op::lookup, ErrorKind::protocol);
            IndexError::Backend("redis lookup: malformed script reply".into())
        })
    }
}

fn classify(error: &RedisError) -> ErrorKind {
    if error.code() == Some("KVSTEER_FENCED") || error.to_string().contains("KVSTEER_FENCED") {
        ErrorKind::fenced
    } else if error.is_timeout() {
        ErrorKind::timeout
    } else if error.is_io_error() || error.is_connection_dropped() || error.is_connection_refusal()
    {
        ErrorKind::io
    } else {
        ErrorKind::protocol
    }
}

impl IndexBackend for RedisBackend {
    fn apply<'a>(
        &'a self,
        worker: WorkerId,
        ops: &'a [KeyOp],
    ) -> BoxFuture<'a, Result<(), IndexError>> {
        Box::pin(self.apply_ops(worker, ops))
    }

    fn purge_worker(&self, worker: WorkerId) -> BoxFuture<'_, Result<(), IndexError>> {
        Box::pin(self.purge(worker))
    }

    fn lookup<'a>(
        &'a self,
        keys: &'a [BlockKey],
    ) -> BoxFuture<'a, Result<Vec<WorkerMatch>, IndexError>> {
        Box::pin(async move {
            if keys.is_empty() {
                return Ok(Vec::new());
            }
            match self.cfg.lookup {
                LookupMode::Pipeline => self.lookup_pipeline(keys).await,
                LookupMode::Script => self.lookup_script(keys).await,
            }
        })
    }

    fn entries(&self) -> u64 {
        self.counts.lock().total.max(0) as u64
    }

    fn worker_blocks(&self, worker: WorkerId) -> u64 {
        self.counts
            .lock()
            .per_worker
            .get(&worker)
            .map_or(0, |n| (*n).max(0) as u64)
    }
}
