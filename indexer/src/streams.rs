//! One KV-event subscriber per worker and one task per worker that applies
//! its batches to the index in order (bounded channel between them).
//!
//! Resync: when the index backend fails to apply a batch, the worker is
//! marked ([`StreamStatus::needs_resync`]); once the backend answers again
//! its owner calls [`StreamStatus::request_resync`], and the worker's task
//! stops the subscriber, purges the worker from the index and starts a new
//! subscriber, which replays everything the publisher still buffers.

use crate::{
    config::StreamsConfig,
    index::Index,
    metrics::{Metrics, StreamLabels},
    workers::{Worker, Workers},
};
use kvsteer_kv_events::zmq::{StreamItem, SubscriberConfig, spawn_subscriber};
use std::{
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicU8, AtomicU64, Ordering::Relaxed},
    },
    time::Duration,
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
    pub const ALL: [StreamState; 5] = [
        Self::Disabled,
        Self::Connecting,
        Self::Live,
        Self::Replaying,
        Self::Down,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Disabled => "disabled",
            Self::Connecting => "connecting",
            Self::Live => "live",
            Self::Replaying => "replaying",
            Self::Down => "down",
        }
    }

    pub fn is_live(self) -> bool {
        matches!(self, Self::Live | Self::Replaying)
    }
}

// === impl StreamStatus ===

impl StreamStatus {
    pub fn state(&self) -> StreamState {
        StreamState::ALL[usize::from(self.state.load(Relaxed)).min(4)]
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

/// Starts the subscriber and the apply task of every worker with a
/// `kv_events` endpoint. Tasks end when `shutdown` turns true.
pub fn spawn_all(
    workers: &Arc<Workers>,
    index: &Index,
    cfg: &StreamsConfig,
    metrics: &Arc<Metrics>,
    shutdown: &watch::Receiver<bool>,
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
        let task = run_worker(
            workers.clone(),
            w.id as usize,
            index.clone(),
            metrics.clone(),
            sub,
            cfg.channel_capacity,
            shutdown.clone(),
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

/// One worker's subscriber and apply loop, restarted after a resync, until
/// `shutdown` turns true or the subscriber ends.
async fn run_worker(
    workers: Arc<Workers>,
    index_of: usize,
    index: Index,
    metrics: Arc<Metrics>,
    sub: SubscriberConfig,
    capacity: usize,
    mut shutdown: watch::Receiver<bool>,
) {
    let Some(w) = workers.get(index_of) else {
        return;
    };
    loop {
        let (stop_tx, stop_rx) = watch::channel(false);
        let (tx, rx) = mpsc::channel(capacity);
        let subscriber = spawn_subscriber(sub.clone(), tx, stop_rx);
        let apply = apply_loop(
            workers.clone(),
            index_of,
            index.clone(),
            metrics.clone(),
            rx,
        );
        tokio::pin!(apply);
        let mut applying = true;
        let resync = loop {
            tokio::select! {
                biased;
                _ = stopped(&mut shutdown) => break false,
                _ = w.stream.resync.notified() => {
                    if w.stream.needs_resync() {
                        break true;
                    }
                }
                _ = &mut apply => {
                    applying = false;
                    break false;
                }
            }
        };
        let _ = stop_tx.send(true);
        let drained = tokio::time::timeout(STOP_WITHIN, async {
            let _ = subscriber.await;
            if applying {
                apply.await;
            }
        })
        .await;
        if drained.is_err() {
            tracing::warn!(worker = %w.cfg.name, "kv event subscriber did not stop in time");
        }
        if !resync {
            return;
        }
        // Clear the flag first: a write failing from now on marks it again.
        w.stream.take_resync();
        match index.reset_worker(w.id).await {
            Ok(()) => {
                tracing::info!(worker = %w.cfg.name, "index resync: worker purged, replaying its events");
                w.stream.next_seq.store(0, Relaxed);
                metrics
                    .index_resyncs
                    .get_or_create(&Metrics::worker(&w.cfg.name))
                    .inc();
            }
            Err(error) => {
                tracing::warn!(worker = %w.cfg.name, %error, "index resync failed; retrying later");
                w.stream.mark_resync();
            }
        }
        w.stream.set_state(StreamState::Connecting);
        set_state_metric(&metrics, w, StreamState::Connecting);
    }
}

async fn stopped(rx: &mut watch::Receiver<bool>) {
    let _ = rx.wait_for(|stop| *stop).await;
}

/// Applies one worker's stream items in order until the subscriber ends.
pub async fn apply_loop(
    workers: Arc<Workers>,
    index_of: usize,
    index: Index,
    metrics: Arc<Metrics>,
    mut rx: mpsc::Receiver<StreamItem>,
) {
    let Some(w) = workers.get(index_of) else {
        return;
    };
    let labels = Metrics::worker(&w.cfg.name);
    while let Some(item) = rx.recv().await {
        handle(w, &index, &metrics, &labels, item).await;
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
) {
    let s = &w.stream;
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
