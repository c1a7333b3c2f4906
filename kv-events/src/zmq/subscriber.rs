//! Indexer side: one task per engine endpoint turning the PUB stream (plus
//! replays) into an ordered, de-duplicated [`StreamItem`] stream.
//!
//! Session: create SUB (connect, or bind when `bind`), subscribe, replay
//! what was missed (everything buffered on first start, else from the last
//! delivered seq, which tells a restarted engine from the same one), emit
//! `Connected`, then read live messages. A gap triggers a replay from the
//! last delivered seq; a seq that went back (another payload for an old seq)
//! is an engine restart: `Reset`, then a replay from 0.
//!
//! Liveness: the SUB socket's monitor reports the engine's connection
//! closing (a killed process's kernel closes it) at once. zeromq-rs would
//! reconnect by itself, silently and with a backoff growing to 30 s, and the
//! restart would only show at the next live batch; instead the session ends
//! (`Disconnected`) and a new SUB is connected with a backoff capped at
//! `reconnect_max`, whose resume replay finds a restart. An engine not back
//! within `down_grace` is given up (`EngineGone`: its cache is gone; the
//! sequence starts over, so whatever comes back is replayed from 0). A
//! probe (replay from the resume point) runs after `idle_reconnect` without
//! a live message, or when the consumer asks ([`spawn_probed_subscriber`]),
//! e.g. because the engine's HTTP side answers again after failures.

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures::StreamExt;
use futures::channel::mpsc as fmpsc;
use tokio::sync::{Notify, mpsc, watch};
use tokio::task::JoinHandle;
use zeromq::prelude::*;
use zeromq::{SocketEvent, SocketOptions, SubSocket, ZmqError, ZmqMessage};

use super::frames::parse_live;
use super::replay_client::{ReplayError, ReplayStream};
use super::sequencer::{Live, ReplayCheck, ReplayStep, Sequencer};
use crate::{DecodeError, EventBatch, decode_batch};

/// Bound on the replay connect and on each wait for the next replay message.
pub const REPLAY_TIMEOUT: Duration = Duration::from_secs(1);
/// Bound on one SUB connect attempt (the publisher may not be up yet).
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SubscriberConfig {
    /// The engine's PUB endpoint (or, with `bind`, the endpoint to bind).
    pub endpoint: String,
    pub replay_endpoint: Option<String>,
    /// Topic prefix to subscribe to; `""` = all.
    pub topic: String,
    /// Bind the SUB socket instead of connecting (vLLM publishers given a
    /// non-wildcard endpoint connect to it).
    pub bind: bool,
    /// Extra attempts of a failed replay request.
    pub max_replay_retries: u32,
    /// First delay of replay retries and SUB reconnects.
    pub backoff_initial: Duration,
    /// Cap of the delay between replay retries.
    pub backoff_max: Duration,
    /// Cap of the delay between SUB reconnect attempts: the engine is known,
    /// so a short cap finds it soon after it is back.
    pub reconnect_max: Duration,
    /// Probe/recreate after this long without a live message; `None` = never.
    pub idle_reconnect: Option<Duration>,
    /// After the engine's connection is lost, how long until the engine is
    /// given up ([`StreamItem::EngineGone`]); `None` = never.
    pub down_grace: Option<Duration>,
}

impl Default for SubscriberConfig {
    fn default() -> Self {
        Self {
            endpoint: "tcp://127.0.0.1:5557".to_owned(),
            replay_endpoint: None,
            topic: String::new(),
            bind: false,
            max_replay_retries: 3,
            backoff_initial: Duration::from_millis(100),
            backoff_max: Duration::from_secs(5),
            reconnect_max: Duration::from_secs(1),
            idle_reconnect: Some(Duration::from_secs(30)),
            down_grace: Some(Duration::from_secs(2)),
        }
    }
}

/// What a subscriber hands to its consumer, in order.
#[derive(Debug, Clone, PartialEq)]
pub enum StreamItem {
    /// A decoded batch; `skipped` events could not be decoded; `replayed`
    /// when it came through the replay socket rather than live.
    Batch {
        seq: u64,
        batch: EventBatch,
        skipped: usize,
        replayed: bool,
    },
    /// A payload that could not be decoded at all; the stream continues.
    Malformed { seq: u64, error: DecodeError },
    /// Connected to the engine and caught up with it (the resume replay,
    /// which reports a restart as `Reset` first, is done or failed): live
    /// batches follow.
    Connected,
    /// The connection to the engine was lost (peer closed, receive failed,
    /// or the socket is recreated); reconnecting.
    Disconnected,
    /// The engine stayed unreachable for `down_grace` after a disconnect:
    /// its cache is gone with it, drop everything of this engine. Whatever
    /// reconnects later is replayed from its oldest buffered batch.
    EngineGone { down_for: Duration },
    /// Live seq `got` arrived while `expected` was next; a replay follows.
    Gap { expected: u64, got: u64 },
    /// The engine restarted (seq went back): drop everything of this engine.
    /// Batches from seq 0 of the new incarnation follow.
    Reset { last_seq: u64, got: u64 },
    /// Batches from `from` on could not be replayed; they are lost.
    ReplayFailed { from: u64, error: String },
}

/// Spawns the subscriber task. It runs until `shutdown` turns `true` (or its
/// sender is dropped), or the consumer drops the receiver; errors are logged
/// and retried with backoff.
pub fn spawn_subscriber(
    cfg: SubscriberConfig,
    tx: mpsc::Sender<StreamItem>,
    shutdown: watch::Receiver<bool>,
) -> JoinHandle<()> {
    spawn_probed_subscriber(cfg, tx, shutdown, Arc::new(Notify::new()))
}

/// [`spawn_subscriber`], plus `probe`: each `notify_one` makes a connected
/// subscriber replay from its resume point (finding a restart its live
/// stream has not shown yet).
pub fn spawn_probed_subscriber(
    cfg: SubscriberConfig,
    tx: mpsc::Sender<StreamItem>,
    shutdown: watch::Receiver<bool>,
    probe: Arc<Notify>,
) -> JoinHandle<()> {
    tokio::spawn(
        Worker {
            cfg,
            tx,
            shutdown,
            seq: Sequencer::default(),
            probe,
            down_since: None,
            gone: false,
        }
        .run(),
    )
}

/// The task must end: shutdown requested or consumer gone.
struct Stop;

type Flow<T> = Result<T, Stop>;

struct Worker {
    cfg: SubscriberConfig,
    tx: mpsc::Sender<StreamItem>,
    shutdown: watch::Receiver<bool>,
    seq: Sequencer,
    probe: Arc<Notify>,
    /// When the engine's connection was lost (`None` while connected, and
    /// before the first connection).
    down_since: Option<Instant>,
    /// `EngineGone` was emitted for the current loss.
    gone: bool,
}

enum Next {
    Message(Result<ZmqMessage, ZmqError>),
    Idle,
    /// The monitor saw the engine's connection close.
    PeerLost,
    /// The monitor saw a connection (bind mode: a publisher connected).
    PeerUp,
    /// Another monitor event.
    Other,
    /// The monitor's sender is gone (the socket is shutting down).
    MonitorClosed,
    Probe,
    /// `down_grace` passed since the loss (bind mode, socket kept).
    Grace,
}

/// How one replay request ended.
enum Replayed {
    /// The end marker was reached.
    Complete,
    /// The reply skipped seqs after delivering some.
    Truncated,
    /// The reply shows an engine restart.
    Restarted {
        last_seq: u64,
        got: u64,
    },
    Failed(ReplayError),
}

// === impl Worker ===

impl Worker {
    async fn run(mut self) {
        let mut backoff = self.cfg.backoff_initial;
        loop {
            if *self.shutdown.borrow() {
                break;
            }
            if self.session(&mut backoff).await.is_err() {
                break;
            }
            if self.guarded(tokio::time::sleep(backoff)).await.is_err() {
                break;
            }
            backoff = (backoff * 2).min(self.cfg.reconnect_max);
        }
        tracing::debug!(endpoint = %self.cfg.endpoint, "kv event subscriber stopped");
    }

    /// One SUB socket's lifetime. `Ok` means "recreate after a backoff".
    async fn session(&mut self, backoff: &mut Duration) -> Flow<()> {
        let cfg = self.cfg.clone();
        let (mut sub, mut monitor) = match self.guarded(open_sub(&cfg)).await? {
            Ok(sub) => sub,
            Err(e) => {
                tracing::debug!(endpoint = %self.cfg.endpoint, error = %e, "SUB connect failed");
                return Ok(());
            }
        };
        tracing::info!(endpoint = %self.cfg.endpoint, bind = self.cfg.bind, "kv event SUB connected");
        *backoff = self.cfg.backoff_initial;
        self.resume().await?;
        let ended = self.live(&mut sub, &mut monitor).await;
        // Release a bound endpoint before the next session binds it again.
        for e in sub.close().await {
            tracing::debug!(endpoint = %self.cfg.endpoint, error = %e, "closing SUB");
        }
        ended?;
        self.lost().await
    }

    /// Catch up after a (re)connect: replay from the resume point (a restart
    /// shows as `Reset`), then `Connected`.
    async fn resume(&mut self) -> Flow<()> {
        if self.cfg.replay_endpoint.is_some() {
            let from = self.seq.resume_from();
            self.replay(from, false).await?;
        }
        if let Some(since) = self.down_since.take() {
            tracing::info!(endpoint = %self.cfg.endpoint, down_for = ?since.elapsed(), "kv event stream back");
        }
        self.gone = false;
        self.emit(StreamItem::Connected).await
    }

    /// The engine's connection is lost: `Disconnected`, and the grace starts.
    async fn lost(&mut self) -> Flow<()> {
        self.down_since.get_or_insert_with(Instant::now);
        self.emit(StreamItem::Disconnected).await
    }

    /// When the engine is given up, unless it is connected or already given up.
    fn grace_deadline(&self) -> Option<tokio::time::Instant> {
        match (self.down_since, self.cfg.down_grace, self.gone) {
            (Some(since), Some(grace), false) => Some((since + grace).into()),
            _ => None,
        }
    }

    /// `EngineGone`; the next engine is read from its first buffered batch.
    async fn give_up(&mut self) -> Flow<()> {
        let down_for = self.down_since.map_or(Duration::ZERO, |t| t.elapsed());
        tracing::warn!(endpoint = %self.cfg.endpoint, ?down_for, "kv event engine unreachable; giving up its blocks");
        self.gone = true;
        self.seq.reset();
        self.emit(StreamItem::EngineGone { down_for }).await
    }

    /// Runs `fut` (cancellable), giving the engine up when the grace passes
    /// meanwhile.
    async fn guarded<T>(&mut self, fut: impl Future<Output = T>) -> Flow<T> {
        tokio::pin!(fut);
        loop {
            let deadline = self.grace_deadline();
            let step = async {
                tokio::select! {
                    v = &mut fut => Some(v),
                    _ = sleep_until(deadline) => None,
                }
            };
            match self.cancellable(step).await? {
                Some(v) => return Ok(v),
                None => self.give_up().await?,
            }
        }
    }

    /// Live messages until the session must end (`Ok`: recreate the SUB).
    async fn live(
        &mut self,
        sub: &mut SubSocket,
        monitor: &mut fmpsc::Receiver<SocketEvent>,
    ) -> Flow<()> {
        let mut monitored = true;
        loop {
            let idle = self.cfg.idle_reconnect;
            let deadline = self.grace_deadline();
            let probe = self.probe.clone();
            let next = async {
                let recv = async {
                    match idle {
                        Some(d) => match tokio::time::timeout(d, sub.recv()).await {
                            Ok(m) => Next::Message(m),
                            Err(_) => Next::Idle,
                        },
                        None => Next::Message(sub.recv().await),
                    }
                };
                tokio::select! {
                    n = recv => n,
                    ev = monitor.next(), if monitored => match ev {
                        Some(SocketEvent::Disconnected(_)) => Next::PeerLost,
                        Some(SocketEvent::Connected(..) | SocketEvent::Accepted(..)) => Next::PeerUp,
                        Some(_) => Next::Other,
                        None => Next::MonitorClosed,
                    },
                    _ = probe.notified() => Next::Probe,
                    _ = sleep_until(deadline) => Next::Grace,
                }
            };
            match self.cancellable(next).await? {
                Next::Message(Ok(msg)) => self.on_live(msg).await?,
                Next::Message(Err(e)) => {
                    tracing::warn!(endpoint = %self.cfg.endpoint, error = %e, "SUB receive failed");
                    return Ok(());
                }
                Next::PeerLost if self.cfg.bind => {
                    // The socket stays bound; the engine connects again.
                    tracing::warn!(endpoint = %self.cfg.endpoint, "kv event publisher disconnected");
                    self.lost().await?;
                }
                Next::PeerLost => {
                    tracing::warn!(endpoint = %self.cfg.endpoint, "kv event engine connection lost; reconnecting");
                    return Ok(());
                }
                Next::PeerUp if self.down_since.is_some() => self.resume().await?,
                Next::PeerUp | Next::Other => {}
                Next::MonitorClosed => monitored = false,
                Next::Grace => self.give_up().await?,
                // Nothing to ask without a replay endpoint.
                Next::Probe if self.cfg.replay_endpoint.is_none() => {}
                Next::Idle | Next::Probe => {
                    if !self.probe().await? {
                        tracing::info!(endpoint = %self.cfg.endpoint, "no replay answer: recreating SUB");
                        return Ok(());
                    }
                }
            }
        }
    }

    /// Replays from the resume point (idle period, or asked to); `false`
    /// when the engine did not answer (or cannot be probed).
    async fn probe(&mut self) -> Flow<bool> {
        let from = self.seq.resume_from();
        self.replay(from, true).await
    }

    async fn on_live(&mut self, msg: ZmqMessage) -> Flow<()> {
        let msg = match parse_live(msg.into_vec()) {
            Ok(m) => m,
            Err(e) => {
                tracing::warn!(endpoint = %self.cfg.endpoint, error = %e, "malformed live message");
                return Ok(());
            }
        };
        let (seq, payload) = (msg.seq, msg.payload);
        let can_replay = self.cfg.replay_endpoint.is_some();
        let mut replayed_once = false;
        loop {
            match self.seq.classify_live(seq, &payload) {
                Live::Deliver => return self.deliver(seq, &payload, false).await,
                Live::Duplicate => {
                    tracing::trace!(seq, "duplicate live batch dropped");
                    return Ok(());
                }
                // Joining a running engine without replay: start where it is.
                Live::Gap { .. } if self.seq.last().is_none() && !can_replay => {
                    return self.deliver(seq, &payload, false).await;
                }
                Live::Gap { expected } => {
                    if !replayed_once {
                        tracing::info!(endpoint = %self.cfg.endpoint, expected, got = seq, "gap in live stream");
                        self.emit(StreamItem::Gap { expected, got: seq }).await?;
                    }
                    if replayed_once || !can_replay {
                        // The replay could not fill it: accept the loss.
                        return self.deliver(seq, &payload, false).await;
                    }
                    replayed_once = true;
                    let from = self.seq.resume_from();
                    self.replay(from, false).await?;
                }
                Live::Reset { last_seq } => {
                    tracing::info!(endpoint = %self.cfg.endpoint, last_seq, got = seq, "engine restarted");
                    self.emit(StreamItem::Reset { last_seq, got: seq }).await?;
                    self.seq.reset();
                    if replayed_once || !can_replay {
                        return self.deliver(seq, &payload, false).await;
                    }
                    replayed_once = true;
                    self.replay(0, false).await?;
                }
            }
        }
    }

    /// Replays from `from`, delivering each new batch as it arrives (memory
    /// stays bounded by the consumer channel, not by the engine's buffer).
    /// A failed attempt is retried from the last delivered batch, with
    /// backoff unless it made progress; a restart seen in the reply gives
    /// `Reset` and one replay from 0. `false` when the engine never answered:
    /// a `probe` then reports nothing (the caller recreates the SUB),
    /// otherwise `ReplayFailed` is emitted after the retries.
    async fn replay(&mut self, from: u64, probe: bool) -> Flow<bool> {
        let Some(endpoint) = self.cfg.replay_endpoint.clone() else {
            return Ok(false);
        };
        let mut from = from;
        let mut delay = self.cfg.backoff_initial;
        let mut attempt = 0;
        let mut reset_done = false;
        loop {
            let (outcome, progressed) = self.replay_once(&endpoint, from).await?;
            match outcome {
                Replayed::Complete => return Ok(true),
                Replayed::Restarted { last_seq, got } if !reset_done => {
                    tracing::info!(endpoint = %self.cfg.endpoint, last_seq, got, "engine restarted (seen in replay)");
                    self.emit(StreamItem::Reset { last_seq, got }).await?;
                    self.seq.reset();
                    reset_done = true;
                    (from, attempt, delay) = (0, 0, self.cfg.backoff_initial);
                }
                Replayed::Restarted { .. } => return Ok(true),
                Replayed::Truncated => {
                    tracing::debug!(endpoint = %endpoint, last = ?self.seq.last(), "replay reply skipped batches; asking again");
                    from = self.seq.resume_from();
                }
                Replayed::Failed(e) if progressed => {
                    tracing::debug!(endpoint = %endpoint, error = %e, "replay broke off; resuming it");
                    from = self.seq.resume_from();
                }
                Replayed::Failed(e) if probe && !reset_done => {
                    tracing::info!(endpoint = %endpoint, start_seq = from, error = %e, "replay probe failed");
                    return Ok(false);
                }
                Replayed::Failed(e) if attempt >= self.cfg.max_replay_retries => {
                    tracing::warn!(endpoint = %endpoint, start_seq = from, error = %e, "replay failed");
                    let error = e.to_string();
                    self.emit(StreamItem::ReplayFailed { from, error }).await?;
                    return Ok(reset_done);
                }
                Replayed::Failed(e) => {
                    tracing::debug!(endpoint = %endpoint, start_seq = from, attempt, error = %e, "replay attempt failed");
                    self.sleep(delay).await?;
                    delay = (delay * 2).min(self.cfg.backoff_max);
                    attempt += 1;
                }
            }
        }
    }

    /// One replay request, its reply delivered as it is read; whether any
    /// batch was delivered comes with the outcome.
    async fn replay_once(&mut self, endpoint: &str, from: u64) -> Flow<(Replayed, bool)> {
        let opened = ReplayStream::open(endpoint, from, REPLAY_TIMEOUT);
        let mut stream = match self.cancellable(opened).await? {
            Ok(stream) => stream,
            Err(e) => return Ok((Replayed::Failed(e), false)),
        };
        let mut check = ReplayCheck::default();
        let mut delivered = 0usize;
        let outcome = loop {
            let batch = match self.cancellable(stream.next()).await? {
                Ok(Some(batch)) => batch,
                Ok(None) => {
                    break match self.seq.replay_end(&check) {
                        Some((last_seq, got)) => Replayed::Restarted { last_seq, got },
                        None => Replayed::Complete,
                    };
                }
                Err(e) => break Replayed::Failed(e),
            };
            match self.seq.replay_step(&mut check, batch.seq, &batch.payload) {
                ReplayStep::Skip => {}
                ReplayStep::Restarted { last_seq } => {
                    break Replayed::Restarted {
                        last_seq,
                        got: batch.seq,
                    };
                }
                // Batches missing after some were delivered: a ROUTER at its
                // high-water mark drops messages (vLLM's replay loop does not
                // wait for the reader); ask again from the last one delivered.
                ReplayStep::Deliver { lost: Some(_) } if delivered > 0 => {
                    break Replayed::Truncated;
                }
                ReplayStep::Deliver { lost } => {
                    if let Some((from, to)) = lost {
                        let error = format!(
                            "replay buffer starts at seq {to}; seq {from}..{to} are no longer buffered"
                        );
                        tracing::warn!(endpoint = %self.cfg.endpoint, from, to, "replay incomplete");
                        self.emit(StreamItem::ReplayFailed { from, error }).await?;
                    }
                    self.deliver(batch.seq, &batch.payload, true).await?;
                    delivered += 1;
                }
            }
        };
        stream.close().await;
        tracing::debug!(endpoint = %endpoint, start_seq = from, delivered, "replay read");
        Ok((outcome, delivered > 0))
    }

    async fn deliver(&mut self, seq: u64, payload: &Bytes, replayed: bool) -> Flow<()> {
        self.seq.delivered(seq, payload);
        let item = match decode_batch(payload) {
            Ok(d) => StreamItem::Batch {
                seq,
                skipped: d.skipped.len(),
                batch: d.batch,
                replayed,
            },
            Err(error) => {
                tracing::warn!(endpoint = %self.cfg.endpoint, seq, error = %error, "undecodable payload");
                StreamItem::Malformed { seq, error }
            }
        };
        self.emit(item).await
    }

    /// Sends to the consumer, waiting for room (backpressure), unless shut down.
    async fn emit(&mut self, item: StreamItem) -> Flow<()> {
        let tx = self.tx.clone();
        match self.cancellable(tx.send(item)).await? {
            Ok(()) => Ok(()),
            Err(_) => {
                tracing::debug!(endpoint = %self.cfg.endpoint, "consumer gone");
                Err(Stop)
            }
        }
    }

    async fn sleep(&mut self, d: Duration) -> Flow<()> {
        self.cancellable(tokio::time::sleep(d)).await
    }

    /// Runs `fut` unless shutdown comes first (checked first: `biased`).
    async fn cancellable<T>(&mut self, fut: impl Future<Output = T>) -> Flow<T> {
        if *self.shutdown.borrow() {
            return Err(Stop);
        }
        tokio::select! {
            biased;
            _ = wait_shutdown(&mut self.shutdown) => Err(Stop),
            v = fut => Ok(v),
        }
    }
}

/// Resolves when shutdown is signalled or its sender is gone.
async fn wait_shutdown(rx: &mut watch::Receiver<bool>) {
    let _ = rx.wait_for(|stop| *stop).await;
}

/// Resolves at `deadline`, never without one.
async fn sleep_until(deadline: Option<tokio::time::Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(d).await,
        None => std::future::pending().await,
    }
}

/// A subscribed SUB socket and its monitor (taken before connecting, so
/// that no connection event is missed).
async fn open_sub(
    cfg: &SubscriberConfig,
) -> Result<(SubSocket, fmpsc::Receiver<SocketEvent>), ZmqError> {
    let mut options = SocketOptions::default();
    options.connect_timeout(CONNECT_TIMEOUT);
    let mut sub = SubSocket::with_options(options);
    let monitor = sub.monitor();
    sub.subscribe(&cfg.topic).await?;
    if cfg.bind {
        sub.bind(&cfg.endpoint.replacen("://*:", "://0.0.0.0:", 1))
            .await?;
    } else {
        sub.connect(&cfg.endpoint).await?;
    }
    Ok((sub, monitor))
}
