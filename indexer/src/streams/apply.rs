//! A worker's apply loop: its stream items (event batches, replays, the
//! subscriber's connection news) applied to the index in order, and the
//! stream state they move it through.

use super::{Gate, OnCleared, StreamState};
use crate::{
    index::Index,
    metrics::{Metrics, StreamLabels},
    workers::Worker,
};
use kvsteer_kv_events::zmq::StreamItem;
use std::sync::{Arc, atomic::Ordering::Relaxed};
use tokio::sync::mpsc;

/// Applies one worker's stream items in order until the subscriber ends.
pub(super) async fn apply_loop(
    w: &Worker,
    index: Index,
    on_cleared: OnCleared,
    metrics: Arc<Metrics>,
    mut rx: mpsc::Receiver<StreamItem>,
    gate: Arc<Gate>,
) {
    let labels = Metrics::worker(&w.cfg.name);
    while let Some(item) = rx.recv().await {
        if handle(w, &index, &metrics, &labels, item, &gate).await {
            on_cleared(w.slot);
        }
    }
    transition(&metrics, w, StreamState::Down);
}

/// Applies one item; `true` when it says the engine's cache is empty (an
/// `AllBlocksCleared` applied, a restarted publisher, an engine gone).
async fn handle(
    w: &Worker,
    index: &Index,
    metrics: &Metrics,
    labels: &crate::metrics::WorkerLabels,
    item: StreamItem,
    gate: &Gate,
) -> bool {
    let s = &w.stream;
    let writes = matches!(
        item,
        StreamItem::Batch { .. } | StreamItem::Reset { .. } | StreamItem::EngineGone { .. }
    );
    if writes && !gate.open() {
        // The lease lapsed (or is about to): never write without it. The
        // lease task stops this loop; the next holder replays.
        tracing::debug!(worker = %w.cfg.name, "write lease not valid; batch dropped");
        return false;
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
            } else if s.transport() != StreamState::Live {
                transition(metrics, w, StreamState::Live);
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
            // A replayed clear happened during the gap: still since the
            // routes the picker remembers.
            stats.cleared
        }
        StreamItem::Malformed { seq, error } => {
            tracing::warn!(worker = %w.cfg.name, seq, %error, "malformed kv event batch");
            s.malformed.fetch_add(1, Relaxed);
            s.next_seq.store(seq.saturating_add(1), Relaxed);
            metrics.malformed.get_or_create(labels).inc();
            false
        }
        StreamItem::Connected => {
            tracing::info!(worker = %w.cfg.name, "kv event stream connected");
            s.suspect.store(false, Relaxed);
            transition(metrics, w, StreamState::Live);
            false
        }
        StreamItem::Disconnected => {
            tracing::warn!(worker = %w.cfg.name, "kv event stream disconnected");
            s.suspect.store(true, Relaxed);
            transition(metrics, w, StreamState::Down);
            false
        }
        StreamItem::EngineGone { down_for } => {
            tracing::warn!(worker = %w.cfg.name, ?down_for, "kv event engine unreachable beyond the grace; purging its blocks");
            s.next_seq.store(0, Relaxed);
            metrics.engines_lost.get_or_create(labels).inc();
            match index.clear_worker(w.id).await {
                Ok(()) => s.suspect.store(false, Relaxed),
                Err(error) => {
                    tracing::error!(worker = %w.cfg.name, %error, "cannot purge an unreachable worker");
                    s.mark_resync();
                }
            }
            metrics
                .indexed_blocks
                .get_or_create(labels)
                .set(index.worker_blocks(w.id) as i64);
            true
        }
        StreamItem::Gap { expected, got } => {
            tracing::info!(worker = %w.cfg.name, expected, got, "kv event gap, replaying");
            s.gaps.fetch_add(1, Relaxed);
            transition(metrics, w, StreamState::Replaying);
            metrics.gaps.get_or_create(labels).inc();
            false
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
            true
        }
        StreamItem::ReplayFailed { from, error } => {
            tracing::warn!(worker = %w.cfg.name, from, %error, "kv event replay failed; batches lost");
            transition(metrics, w, StreamState::Live);
            false
        }
    }
}

/// Sets the stream's own state and publishes the worker's effective one.
pub(super) fn transition(metrics: &Metrics, w: &Worker, state: StreamState) {
    w.stream.set_state(state);
    publish_state(metrics, w);
}

/// `kvsteer_stream_state{worker, state}`: 1 for the state `/debug/workers`
/// shows, 0 for the others.
pub(super) fn publish_state(metrics: &Metrics, w: &Worker) {
    let state = w.stream.state();
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
