//! One KV-event subscriber per worker and one task per worker that applies
//! its batches to the index in order (bounded channel between them).

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
        atomic::{AtomicU8, AtomicU64, Ordering::Relaxed},
    },
    time::Duration,
};
use tokio::{
    sync::{mpsc, watch},
    task::JoinHandle,
};

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
        let (tx, rx) = mpsc::channel(cfg.channel_capacity);
        tasks.push(spawn_subscriber(sub, tx, shutdown.clone()));
        let task = apply_loop(
            workers.clone(),
            w.id as usize,
            index.clone(),
            metrics.clone(),
            rx,
        );
        tasks.push(tokio::spawn(task));
    }
    tasks
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
