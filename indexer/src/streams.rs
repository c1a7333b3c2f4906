//! One KV-event subscriber per worker and one task per worker that applies
//! its batches to the index in order (bounded channel between them).
//!
//! Resync: when the index backend fails to apply a batch, the worker is
//! marked ([`StreamStatus::needs_resync`]); once the backend answers again
//! its owner calls [`StreamStatus::request_resync`], and the worker's task
//! stops the subscriber, purges the worker from the index and starts a new
//! subscriber, which replays everything the publisher still buffers.
//!
//! Write leases (Redis, `writer: auto`): a worker's task runs its
//! subscriber only while this replica holds the worker's lease
//! ([`Gates::Leases`]). Each acquisition (a new epoch) purges the worker
//! and subscribes with replay; a loss stops the subscriber and drops the
//! queued batches at once, and every batch is checked against the lease's
//! validity before it is applied.

use crate::{
    config::StreamsConfig,
    index::{Index, WorkerId, redis::lease::LeaseBoard},
    metrics::{Metrics, StreamLabels},
    workers::{Worker, Workers},
};
use kvsteer_kv_events::zmq::{StreamItem, SubscriberConfig, spawn_subscriber};
use std::{
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicU8, AtomicU64, Ordering::Relaxed},
    },
    time::{Duration, Instant},
};
use tokio::{
    sync::{Notify, mpsc, watch},
    task::JoinHandle,
};

/// How long a stopping subscriber and apply loop may take to finish.
const STOP_WITHIN: Duration = Duration::from_secs(5);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StreamState {
    /// No events endpoint configured.
    Disabled,
    Connecting,
    Live,
    Replaying,
    Down,
    /// Another replica holds (or nobody can take) the worker's write lease.
    Standby,
}

/// Which workers this replica may apply events for.
#[derive(Clone)]
pub enum Gates {
    /// All of them, always (memory backend, Redis `writer: always`).
    Open,
    /// Those whose write lease it holds.
    Leases(Arc<LeaseBoard>),
}

/// One worker's write permission, checked before each batch.
struct Gate {
    board: Option<Arc<LeaseBoard>>,
    worker: WorkerId,
}

/// Shared per-worker stream status (lock-free; read by `/debug/workers`).
#[derive(Debug, Default)]
pub struct StreamStatus {
    state: AtomicU8,
    /// Last applied seq + 1; 0 = none yet.
    next_seq: AtomicU64,
    pub batches: AtomicU64,
    pub events_applied: AtomicU64,
    pub events_skipped: AtomicU64,
    pub gaps: AtomicU64,
    pub replayed: AtomicU64,
    pub resets: AtomicU64,
    pub malformed: AtomicU64,
    /// The index backend failed to apply some of this worker's events.
    resync_needed: AtomicBool,
    resync: Notify,
}

// === impl StreamState ===

impl StreamState {
    pub const ALL: [StreamState; 6] = [
        Self::Disabled,
        Self::Connecting,
        Self::Live,
        Self::Replaying,
        Self::Down,
        Self::Standby,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Disabled => "disabled",
            Self::Connecting => "connecting",
            Self::Live => "live",
            Self::Replaying => "replaying",
            Self::Down => "down",
            Self::Standby => "standby",
        }
    }

    pub fn is_live(self) -> bool {
        matches!(self, Self::Live | Self::Replaying)
    }
}

// === impl StreamStatus ===

impl StreamStatus {
    pub fn state(&self) -> StreamState {
        StreamState::ALL[usize::from(self.state.load(Relaxed)).min(StreamState::ALL.len() - 1)]
    }

    fn set_state(&self, s: StreamState) {
        self.state.store(s as u8, Relaxed);
    }

    pub fn last_seq(&self) -> Option<u64> {
        self.next_seq.load(Relaxed).checked_sub(1)
    }

    /// Some events of this worker are missing from the index.
    pub fn needs_resync(&self) -> bool {
        self.resync_needed.load(Relaxed)
    }

    pub fn mark_resync(&self) {
        self.resync_needed.store(true, Relaxed);
    }

    /// Clears the resync mark, returning whether it was set.
    pub fn take_resync(&self) -> bool {
        self.resync_needed.swap(false, Relaxed)
    }

    /// Wake the worker's task to resync it (the index backend answers
    /// again). A no-op unless [`Self::needs_resync`].
    pub fn request_resync(&self) {
        if self.needs_resync() {
            self.resync.notify_one();
        }
    }
}

// === impl Gate ===

impl Gate {
    fn open(&self) -> bool {
        self.board
            .as_ref()
            .is_none_or(|b| b.valid(self.worker, Instant::now()))
    }
}

/// Starts the subscriber and the apply task of every worker with a
/// `kv_events` endpoint (under [`Gates::Leases`], only while the lease is
/// held). Tasks end when `shutdown` turns true.
pub fn spawn_all(
    workers: &Arc<Workers>,
    index: &Index,
    cfg: &StreamsConfig,
    metrics: &Arc<Metrics>,
    shutdown: &watch::Receiver<bool>,
    gates: &Gates,
) -> Vec<JoinHandle<()>> {
    let mut tasks = Vec::new();
    for w in workers.iter() {
        let Some(endpoint) = w.cfg.kv_events.clone() else {
            w.stream.set_state(StreamState::Disabled);
            set_state_metric(metrics, w, StreamState::Disabled);
            continue;
        };
        w.stream.set_state(StreamState::Connecting);
        set_state_metric(metrics, w, StreamState::Connecting);
        let sub = SubscriberConfig {
            endpoint,
            replay_endpoint: w.cfg.replay.clone(),
            topic: w.cfg.topic(),
            bind: w.cfg.bind,
            max_replay_retries: cfg.max_replay_retries,
            backoff_initial: Duration::from_millis(cfg.backoff_initial_ms),
            backoff_max: Duration::from_millis(cfg.backoff_max_ms),
            idle_reconnect: cfg.idle_reconnect_s.map(Duration::from_secs),
        };
        let (board, lease) = match gates {
            Gates::Open => (None, None),
            Gates::Leases(board) => (Some(board.clone()), board.subscribe(w.id)),
        };
        let task = run_worker(
            workers.clone(),
            w.id as usize,
            index.clone(),
            metrics.clone(),
            sub,
            cfg.channel_capacity,
            shutdown.clone(),
            Gate {
                board,
                worker: w.id,
            },
            lease,
        );
        tasks.push(tokio::spawn(task));
    }
    tasks
}

/// Marks every stream disabled (a replica that does not apply events).
pub fn mark_disabled(workers: &Workers, metrics: &Metrics) {
    for w in workers.iter() {
        w.stream.set_state(StreamState::Disabled);
        set_state_metric(metrics, w, StreamState::Disabled);
    }
}

/// Why a worker's subscriber was stopped.
enum Stop {
    Shutdown,
    /// The subscriber ended on its own.
    Ended,
    Resync,
    /// The lease epoch changed (lost, or lost and taken again).
    Lease,
}

/// One worker's subscriber and apply loop, restarted after a resync or a
/// new lease epoch, until `shutdown` turns true or the subscriber ends.
/// With `lease`, it runs only under a nonzero epoch, and each new epoch
/// starts with a purge of the worker and a replay.
#[allow(clippy::too_many_arguments)]
async fn run_worker(
    workers: Arc<Workers>,
    index_of: usize,
    index: Index,
    metrics: Arc<Metrics>,
    sub: SubscriberConfig,
    capacity: usize,
    mut shutdown: watch::Receiver<bool>,
    gate: Gate,
    mut lease: Option<watch::Receiver<u64>>,
) {
    let Some(w) = workers.get(index_of) else {
        return;
    };
    let gate = Arc::new(gate);
    loop {
        let epoch = match &mut lease {
            None => 0,
            Some(rx) => {
                let epoch = *rx.borrow_and_update();
                if epoch == 0 {
                    w.stream.set_state(StreamState::Standby);
                    set_state_metric(&metrics, w, StreamState::Standby);
                    tokio::select! {
                        biased;
                        _ = stopped(&mut shutdown) => return,
                        changed = rx.changed() => {
                            if changed.is_err() {
                                return;
                            }
                            continue;
                        }
                    }
                }
                // A new holding: what an earlier holder (or this replica,
                // before a gap) stored cannot be trusted to match our
                // ingest map; purge, then replay.
                w.stream.take_resync();
                purge_for_replay(w, &index, &metrics, false).await;
                w.stream.set_state(StreamState::Connecting);
                set_state_metric(&metrics, w, StreamState::Connecting);
                epoch
            }
        };
        let (stop_tx, stop_rx) = watch::channel(false);
        let (tx, rx) = mpsc::channel(capacity);
        let subscriber = spawn_subscriber(sub.clone(), tx, stop_rx);
        let apply = apply_loop(
            workers.clone(),
            index_of,
            index.clone(),
            metrics.clone(),
            rx,
            gate.clone(),
        );
        tokio::pin!(apply);
        let why = loop {
            tokio::select! {
                biased;
                _ = stopped(&mut shutdown) => break Stop::Shutdown,
                changed = lease_changed(&mut lease, epoch) => {
                    if changed {
                        break Stop::Lease;
                    }
                }
                _ = w.stream.resync.notified() => {
                    if w.stream.needs_resync() {
                        break Stop::Resync;
                    }
                }
                _ = &mut apply => break Stop::Ended,
            }
        };
        let _ = stop_tx.send(true);
        // After a resync request the queued batches are still applied (the
        // purge follows); after a lease change they are dropped with the
        // apply loop: this replica may no longer write the worker.
        let drain = matches!(why, Stop::Resync);
        let drained = tokio::time::timeout(STOP_WITHIN, async {
            let _ = subscriber.await;
            if drain {
                apply.await;
            }
        })
        .await;
        if drained.is_err() {
            tracing::warn!(worker = %w.cfg.name, "kv event subscriber did not stop in time");
        }
        match why {
            Stop::Shutdown | Stop::Ended => return,
            Stop::Lease => {
                tracing::info!(worker = %w.cfg.name, "write lease changed; subscriber stopped");
                continue;
            }
            Stop::Resync => {
                // Clear the flag first: a write failing from now on marks it again.
                w.stream.take_resync();
                purge_for_replay(w, &index, &metrics, true).await;
                w.stream.set_state(StreamState::Connecting);
                set_state_metric(&metrics, w, StreamState::Connecting);
            }
        }
    }
}

/// Resolves `true` once the lease epoch differs from `epoch`, never when
/// there is no lease (or its sender is gone).
async fn lease_changed(lease: &mut Option<watch::Receiver<u64>>, epoch: u64) -> bool {
    match lease {
        None => std::future::pending().await,
        Some(rx) => match rx.changed().await {
            Ok(()) => *rx.borrow_and_update() != epoch,
            Err(_) => std::future::pending().await,
        },
    }
}

/// Purge `w` from the index before a replay; on failure mark it for a
/// resync (retried when the backend answers again).
async fn purge_for_replay(w: &Worker, index: &Index, metrics: &Metrics, resync: bool) {
    match index.reset_worker(w.id).await {
        Ok(()) => {
            tracing::info!(worker = %w.cfg.name, resync, "worker purged from the index, replaying its events");
            w.stream.next_seq.store(0, Relaxed);
            if resync {
                metrics
                    .index_resyncs
                    .get_or_create(&Metrics::worker(&w.cfg.name))
                    .inc();
            }
        }
        Err(error) => {
            tracing::warn!(worker = %w.cfg.name, %error, "purge before replay failed; retrying later");
            w.stream.mark_resync();
        }
    }
}

async fn stopped(rx: &mut watch::Receiver<bool>) {
    let _ = rx.wait_for(|stop| *stop).await;
}

/// Applies one worker's stream items in order until the subscriber ends.
async fn apply_loop(
    workers: Arc<Workers>,
    index_of: usize,
    index: Index,
    metrics: Arc<Metrics>,
    mut rx: mpsc::Receiver<StreamItem>,
    gate: Arc<Gate>,
) {
    let Some(w) = workers.get(index_of) else {
        return;
    };
    let labels = Metrics::worker(&w.cfg.name);
    while let Some(item) = rx.recv().await {
        handle(w, &index, &metrics, &labels, item, &gate).await;
    }
    w.stream.set_state(StreamState::Down);
    set_state_metric(&metrics, w, StreamState::Down);
}

async fn handle(
    w: &Worker,
    index: &Index,
    metrics: &Metrics,
    labels: &crate::metrics::WorkerLabels,
    item: StreamItem,
    gate: &Gate,
) {
    let s = &w.stream;
    let writes = matches!(item, StreamItem::Batch { .. } | StreamItem::Reset { .. });
    if writes && !gate.open() {
        // The lease lapsed (or is about to): never write without it. The
        // lease task stops this loop; the next holder replays.
        tracing::debug!(worker = %w.cfg.name, "write lease not valid; batch dropped");
        return;
    }
    match item {
        StreamItem::Batch {
            seq,
            batch,
            skipped,
            replayed,
        } => {
            if replayed {
                s.replayed.fetch_add(1, Relaxed);
                metrics.replays.get_or_create(labels).inc();
            } else if s.state() != StreamState::Live {
                s.set_state(StreamState::Live);
                set_state_metric(metrics, w, StreamState::Live);
            }
            let received = batch.events.len() as u64 + skipped as u64;
            metrics
                .events_received
                .get_or_create(labels)
                .inc_by(received);
            let stats = index.apply_batch(w.id, &batch).await;
            if stats.backend_errors > 0 {
                s.mark_resync();
                metrics
                    .index_write_errors
                    .get_or_create(labels)
                    .inc_by(stats.backend_errors);
            }
            let applied = stats.stored + stats.removed + u64::from(stats.cleared);
            let skipped = stats.skipped + skipped as u64;
            s.batches.fetch_add(1, Relaxed);
            s.events_applied.fetch_add(applied, Relaxed);
            s.events_skipped.fetch_add(skipped, Relaxed);
            s.next_seq.store(seq.saturating_add(1), Relaxed);
            metrics.events_applied.get_or_create(labels).inc_by(applied);
            metrics.events_skipped.get_or_create(labels).inc_by(skipped);
            metrics
                .indexed_blocks
                .get_or_create(labels)
                .set(index.worker_blocks(w.id) as i64);
        }
        StreamItem::Malformed { seq, error } => {
            tracing::warn!(worker = %w.cfg.name, seq, %error, "malformed kv event batch");
            s.malformed.fetch_add(1, Relaxed);
            s.next_seq.store(seq.saturating_add(1), Relaxed);
            metrics.malformed.get_or_create(labels).inc();
        }
        StreamItem::Connected => {
            tracing::info!(worker = %w.cfg.name, "kv event stream connected");
            s.set_state(StreamState::Live);
            set_state_metric(metrics, w, StreamState::Live);
        }
        StreamItem::Disconnected => {
            tracing::warn!(worker = %w.cfg.name, "kv event stream disconnected");
            s.set_state(StreamState::Down);
            set_state_metric(metrics, w, StreamState::Down);
        }
        StreamItem::Gap { expected, got } => {
            tracing::info!(worker = %w.cfg.name, expected, got, "kv event gap, replaying");
            s.gaps.fetch_add(1, Relaxed);
            s.set_state(StreamState::Replaying);
            set_state_metric(metrics, w, StreamState::Replaying);
            metrics.gaps.get_or_create(labels).inc();
        }
        StreamItem::Reset { last_seq, got } => {
            tracing::warn!(worker = %w.cfg.name, last_seq, got, "kv event publisher restarted; clearing its blocks");
            s.resets.fetch_add(1, Relaxed);
            s.next_seq.store(0, Relaxed);
            metrics.resets.get_or_create(labels).inc();
            if let Err(error) = index.clear_worker(w.id).await {
                tracing::error!(worker = %w.cfg.name, %error, "cannot clear worker after reset");
                s.mark_resync();
            }
            metrics
                .indexed_blocks
                .get_or_create(labels)
                .set(index.worker_blocks(w.id) as i64);
        }
        StreamItem::ReplayFailed { from, error } => {
            tracing::warn!(worker = %w.cfg.name, from, %error, "kv event replay failed; batches lost");
            s.set_state(StreamState::Live);
            set_state_metric(metrics, w, StreamState::Live);
        }
    }
}

fn set_state_metric(metrics: &Metrics, w: &Worker, state: StreamState) {
    for s in StreamState::ALL {
        metrics
            .stream_state
            .get_or_create(&StreamLabels {
                worker: w.cfg.name.clone(),
                state: s.as_str(),
            })
            .set(i64::from(s == state));
    }
}
