//! One KV-event subscriber per worker and one task per worker that applies
//! its batches to the index in order (bounded channel between them).
//!
//! Resync: when the index backend fails to apply a batch, the worker is
//! marked ([`StreamStatus::needs_resync`]); once the backend answers again
//! its owner calls [`StreamStatus::request_resync`], and the worker's task
//! stops the subscriber, purges the worker from the index and starts a new
//! subscriber, which replays everything the publisher still buffers.
//!
//! Liveness: the subscriber reports a lost engine connection at once
//! (`Disconnected`: the stream shows `down` and the worker is no candidate
//! while its blocks are still indexed) and gives the engine up after
//! `down_grace_ms` (`EngineGone`: its blocks are purged). A worker whose
//! `/metrics` fails `scrape.down_after` times in a row also shows `down`
//! (a stopped or unreachable host keeps its TCP connection open), is purged
//! after the same grace and resubscribed; when its scrape answers again the
//! subscriber probes the replay endpoint, which tells a restarted engine
//! (seq from 0) from the same one.
//!
//! Write leases (Redis, `writer: auto`): a worker's task runs its
//! subscriber only while this replica holds the worker's lease
//! ([`Gates::Leases`]). Each acquisition (a new epoch) purges the worker
//! and subscribes with replay; a loss stops the subscriber and drops the
//! queued batches at once, and every batch is checked against the lease's
//! validity before it is applied.

mod apply;

use apply::{apply_loop, publish_state, transition};

use crate::{
    config::StreamsConfig,
    index::{Index, WorkerId, redis::lease::LeaseBoard},
    metrics::Metrics,
    workers::{Worker, Workers},
};
use kvsteer_kv_events::zmq::{SubscriberConfig, spawn_probed_subscriber};
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

/// How often a worker's scrape health is looked at (the scrape loop
/// records it every `scrape.interval_ms`).
const HEALTH_EVERY: Duration = Duration::from_millis(100);

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
    /// The engine's connection is lost and its blocks are still indexed:
    /// they may be gone with the engine, so the worker is no candidate.
    suspect: AtomicBool,
    /// The worker's `/metrics` failed `scrape.down_after` times in a row.
    scrape_down: AtomicBool,
    /// Asks the subscriber to replay from its resume point.
    probe: Arc<Notify>,
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
    /// The stream's state; `down` whenever the worker's scrape says it is
    /// down, whatever its socket says (a dead host's TCP connection may
    /// look open).
    pub fn state(&self) -> StreamState {
        let s = self.transport();
        match s {
            StreamState::Disabled | StreamState::Standby => s,
            _ if self.scrape_down.load(Relaxed) => StreamState::Down,
            _ => s,
        }
    }

    /// The engine's connection was lost and its blocks are still indexed.
    pub fn suspect(&self) -> bool {
        self.suspect.load(Relaxed)
    }

    fn set_state(&self, s: StreamState) {
        self.state.store(s as u8, Relaxed);
    }

    /// The state of the event stream itself, without the scrape's verdict.
    fn transport(&self) -> StreamState {
        StreamState::ALL[usize::from(self.state.load(Relaxed)).min(StreamState::ALL.len() - 1)]
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

/// Called with a worker's slot when its engine's cache is known to be
/// empty: an `AllBlocksCleared`, a restarted event publisher, an engine
/// unreachable beyond the grace. What the picker remembers routing there is
/// no longer cached there ([`crate::picker::Picker::worker_cleared`]).
pub type OnCleared = Arc<dyn Fn(usize) + Send + Sync>;

/// What every worker's stream task shares.
#[derive(Clone)]
pub struct StreamContext {
    pub index: Index,
    pub on_cleared: OnCleared,
    pub cfg: StreamsConfig,
    /// `scrape.down_after`.
    pub down_after: u32,
    pub metrics: Arc<Metrics>,
    pub shutdown: watch::Receiver<bool>,
    pub gates: Gates,
}

/// Starts the stream task of every worker (see [`spawn_worker`]).
pub fn spawn_all(workers: &Workers, ctx: &StreamContext) -> Vec<JoinHandle<()>> {
    workers
        .iter()
        .filter_map(|w| spawn_worker(&w, ctx))
        .collect()
}

/// Starts `w`'s subscriber and apply task when it has a `kv_events`
/// endpoint (under [`Gates::Leases`], only while the lease is held). The
/// task ends when `shutdown` turns true, when the worker retires or when
/// its subscriber ends.
pub fn spawn_worker(w: &Arc<Worker>, ctx: &StreamContext) -> Option<JoinHandle<()>> {
    let Some(endpoint) = w.cfg.kv_events.clone() else {
        transition(&ctx.metrics, w, StreamState::Disabled);
        return None;
    };
    transition(&ctx.metrics, w, StreamState::Connecting);
    let cfg = &ctx.cfg;
    let sub = SubscriberConfig {
        endpoint,
        replay_endpoint: w.cfg.replay.clone(),
        topic: w.cfg.topic(),
        bind: w.cfg.bind,
        max_replay_retries: cfg.max_replay_retries,
        backoff_initial: Duration::from_millis(cfg.backoff_initial_ms),
        backoff_max: Duration::from_millis(cfg.backoff_max_ms),
        reconnect_max: Duration::from_millis(cfg.reconnect_max_ms),
        idle_reconnect: cfg.idle_reconnect_s.map(Duration::from_secs),
        down_grace: Some(Duration::from_millis(cfg.down_grace_ms)),
    };
    let (board, lease) = match &ctx.gates {
        Gates::Open => (None, None),
        Gates::Leases(board) => (Some(board.clone()), board.subscribe(w.id)),
    };
    let task = run_worker(
        w.clone(),
        ctx.index.clone(),
        ctx.on_cleared.clone(),
        ctx.metrics.clone(),
        sub,
        cfg.channel_capacity,
        ctx.down_after,
        ctx.shutdown.clone(),
        Gate {
            board,
            worker: w.id,
        },
        lease,
    );
    Some(tokio::spawn(task))
}

/// Marks every stream disabled (a replica that does not apply events).
pub fn mark_disabled(workers: &Workers, metrics: &Metrics) {
    for w in workers.iter() {
        transition(metrics, &w, StreamState::Disabled);
    }
}

/// Marks one worker's stream disabled (it joined a replica that does not
/// apply events).
pub fn mark_one_disabled(w: &Worker, metrics: &Metrics) {
    transition(metrics, w, StreamState::Disabled);
}

/// Why a worker's subscriber was stopped.
enum Stop {
    Shutdown,
    /// The worker left.
    Retired,
    /// The subscriber ended on its own.
    Ended,
    Resync,
    /// The lease epoch changed (lost, or lost and taken again).
    Lease,
    /// The worker's scrape was down for the grace: purge and resubscribe.
    Gone,
}

/// One worker's subscriber and apply loop, restarted after a resync or a
/// new lease epoch, until `shutdown` turns true or the subscriber ends.
/// With `lease`, it runs only under a nonzero epoch, and each new epoch
/// starts with a purge of the worker and a replay.
#[allow(clippy::too_many_arguments)]
async fn run_worker(
    w: Arc<Worker>,
    index: Index,
    on_cleared: OnCleared,
    metrics: Arc<Metrics>,
    sub: SubscriberConfig,
    capacity: usize,
    down_after: u32,
    mut shutdown: watch::Receiver<bool>,
    gate: Gate,
    mut lease: Option<watch::Receiver<u64>>,
) {
    let w = &*w;
    let gate = Arc::new(gate);
    let mut scrape = ScrapeWatch::new(sub.down_grace.unwrap_or(Duration::MAX), down_after);
    loop {
        let epoch = match &mut lease {
            None => 0,
            Some(rx) => {
                let epoch = *rx.borrow_and_update();
                if epoch == 0 {
                    transition(&metrics, w, StreamState::Standby);
                    tokio::select! {
                        biased;
                        _ = stopped(&mut shutdown) => return,
                        _ = w.retired() => return,
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
                transition(&metrics, w, StreamState::Connecting);
                epoch
            }
        };
        let (stop_tx, stop_rx) = watch::channel(false);
        let (tx, rx) = mpsc::channel(capacity);
        let subscriber = spawn_probed_subscriber(sub.clone(), tx, stop_rx, w.stream.probe.clone());
        let mut health = tokio::time::interval(HEALTH_EVERY);
        health.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let apply = apply_loop(
            w,
            index.clone(),
            on_cleared.clone(),
            metrics.clone(),
            rx,
            gate.clone(),
        );
        tokio::pin!(apply);
        let why = loop {
            tokio::select! {
                biased;
                _ = stopped(&mut shutdown) => break Stop::Shutdown,
                _ = w.retired() => break Stop::Retired,
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
                _ = health.tick() => {
                    if scrape.check(w, &metrics) {
                        break Stop::Gone;
                    }
                }
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
            Stop::Shutdown | Stop::Retired | Stop::Ended => return,
            Stop::Lease => {
                tracing::info!(worker = %w.cfg.name, "write lease changed; subscriber stopped");
                continue;
            }
            Stop::Resync => {
                // Clear the flag first: a write failing from now on marks it again.
                w.stream.take_resync();
                purge_for_replay(w, &index, &metrics, true).await;
                transition(&metrics, w, StreamState::Connecting);
            }
            Stop::Gone => {
                metrics
                    .engines_lost
                    .get_or_create(&Metrics::worker(&w.cfg.name))
                    .inc();
                on_cleared(w.slot);
                purge_for_replay(w, &index, &metrics, false).await;
                transition(&metrics, w, StreamState::Connecting);
            }
        }
    }
}

/// Follows one worker's scrape health for the stream: `down` while the
/// scrape is, a purge once it stayed down for the grace (once per outage),
/// a probe of the replay endpoint when it answers again.
struct ScrapeWatch {
    grace: Duration,
    down_after: u32,
    down_since: Option<Instant>,
    purged: bool,
}

// === impl ScrapeWatch ===

impl ScrapeWatch {
    fn new(grace: Duration, down_after: u32) -> Self {
        Self {
            grace,
            down_after,
            down_since: None,
            purged: false,
        }
    }

    /// Updates the worker's stream state; `true` when it must be purged.
    fn check(&mut self, w: &Worker, metrics: &Metrics) -> bool {
        let down = w.cfg.metrics.is_some() && !w.health.is_up(self.down_after);
        if w.stream.scrape_down.swap(down, Relaxed) != down {
            publish_state(metrics, w);
            if down {
                tracing::warn!(worker = %w.cfg.name, "worker scrape down; its stream is marked down");
                self.down_since = Some(Instant::now());
                self.purged = false;
            } else {
                tracing::info!(worker = %w.cfg.name, "worker scrape answers again; probing its event stream");
                self.down_since = None;
                w.stream.probe.notify_one();
            }
        }
        let expired = self
            .down_since
            .is_some_and(|since| since.elapsed() >= self.grace);
        if expired && !self.purged {
            tracing::warn!(worker = %w.cfg.name, grace = ?self.grace, "worker down beyond the grace; purging its blocks");
            self.purged = true;
            return true;
        }
        false
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
            w.stream.suspect.store(false, Relaxed);
            metrics
                .indexed_blocks
                .get_or_create(&Metrics::worker(&w.cfg.name))
                .set(index.worker_blocks(w.id) as i64);
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{config::WorkerConfig, metrics::StreamLabels, scrape::ScrapeError};
    use prometheus_client::registry::Registry;

    fn worker(metrics: Option<&str>) -> (Workers, Metrics) {
        let cfg = WorkerConfig {
            name: "w1".into(),
            endpoint: "127.0.0.1:8001".into(),
            model: "m".into(),
            kv_events: Some("tcp://127.0.0.1:5557".into()),
            metrics: metrics.map(str::to_owned),
            ..WorkerConfig::default()
        };
        (
            Workers::new(&[cfg]),
            Metrics::new(&mut Registry::default(), &[]),
        )
    }

    #[test]
    fn a_lost_engine_is_no_candidate_until_purged_or_back() {
        let (workers, metrics) = worker(None);
        let w = &*workers.get(0).unwrap();
        transition(&metrics, w, StreamState::Live);
        assert!(w.is_up(3));
        // What the apply loop does on `Disconnected`.
        w.stream.suspect.store(true, Relaxed);
        transition(&metrics, w, StreamState::Down);
        assert!(!w.is_up(3));
        assert_eq!(w.stream.state(), StreamState::Down);
        assert!(!workers.any_live());
    }

    #[test]
    fn scrape_down_shows_down_purges_once_after_the_grace_and_probes_when_back() {
        let (workers, metrics) = worker(Some("http://127.0.0.1:8001/metrics"));
        let w = &*workers.get(0).unwrap();
        transition(&metrics, w, StreamState::Live);
        let mut watch = ScrapeWatch::new(Duration::ZERO, 2);
        assert!(!watch.check(w, &metrics));
        assert_eq!(w.stream.state(), StreamState::Live);

        let now = Instant::now();
        w.health.record(Err(ScrapeError::Timeout), now);
        assert!(!watch.check(w, &metrics), "one failure is not down");
        w.health.record(Err(ScrapeError::Timeout), now);
        // Down: shown at once (the socket still says live), purged once.
        assert!(watch.check(w, &metrics));
        assert_eq!(w.stream.state(), StreamState::Down);
        assert!(!w.is_up(2));
        let shown = |state: StreamState| {
            metrics
                .stream_state
                .get_or_create(&StreamLabels {
                    worker: "w1".into(),
                    state: state.as_str(),
                })
                .get()
        };
        assert_eq!((shown(StreamState::Down), shown(StreamState::Live)), (1, 0));
        assert!(!watch.check(w, &metrics), "one purge per outage");

        // Back: live again, and the subscriber is asked to probe.
        w.health.record(Ok(Default::default()), now);
        assert!(!watch.check(w, &metrics));
        assert_eq!(w.stream.state(), StreamState::Live);
        assert_eq!((shown(StreamState::Down), shown(StreamState::Live)), (0, 1));
        let probed = w.stream.probe.notified();
        tokio::pin!(probed);
        assert!(
            futures::FutureExt::now_or_never(probed).is_some(),
            "probe requested"
        );
    }
}
