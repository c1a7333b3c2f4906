//! Write leases (`writer: auto`): per worker, the one replica allowed to
//! apply its KV events to Redis.
//!
//! - Key `{prefix}:lease:{worker}` = the holder's replica id
//!   ([`replica_id`]: hostname, pid, random), with a Redis-side `PX` TTL
//!   (`lease_ttl_ms`).
//! - Every third of the TTL, [`run`] sends ONE script call for all workers
//!   ([`super::scripts::LEASES`]): extend the leases this replica holds
//!   (compare-and-extend), take the free ones (`SET … PX`).
//! - A holder applies only while its last successful renewal was *sent*
//!   less than two thirds of the TTL ago ([`LeaseBoard::valid`], checked
//!   before every batch): Redis keeps the lease at least a TTL after that
//!   send, so the holder stops a third of a TTL before anybody else can take
//!   over, whatever the wall clocks say (only monotonic clocks are
//!   compared, each on its own machine).
//! - Fencing backs this up inside Redis: with
//!   [`super::RedisBackend::enable_fencing`] every apply and purge script
//!   first checks the lease holds this replica's id, so a write delayed
//!   past a lease change is refused (`KVSTEER_FENCED`) instead of applied.
//! - Acquiring a lease hands the worker to its stream task under a new
//!   epoch (a `watch`): it purges the worker and subscribes with replay.
//!   Losing it (taken, expired, Redis restarted empty, no renewal for two
//!   thirds of the TTL) sets the epoch to 0: the stream task stops at once.
//! - Graceful shutdown releases the held leases (compare-and-delete), so
//!   another replica takes over on its next round instead of after a TTL.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use tokio::sync::watch;

use super::RedisBackend;
use super::metrics::{LossReason, RedisMetrics};
use crate::index::{IndexError, WorkerId};

/// A process-unique, restart-unique replica id: `hostname:pid:random`.
pub fn replica_id() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|h| h.trim().to_owned())
        .filter(|h| !h.is_empty())
        .or_else(|| std::env::var("HOSTNAME").ok())
        .unwrap_or_else(|| "host".into());
    format!(
        "{host}:{}:{:08x}",
        std::process::id(),
        rand::random::<u32>()
    )
}

/// This replica's view of every managed worker's lease.
pub struct LeaseBoard {
    id: String,
    ttl: Duration,
    entries: Vec<Entry>,
    rounds: AtomicU64,
    epochs: AtomicU64,
}

struct Entry {
    worker: WorkerId,
    name: String,
    state: Mutex<State>,
    /// 0: not held; otherwise the epoch of the current holding.
    epoch: watch::Sender<u64>,
}

#[derive(Default)]
struct State {
    /// Send time of the last successful renewal, while held.
    renewed: Option<Instant>,
    /// Holder seen in the last successful round.
    holder: Option<String>,
}

/// What a round changed for one worker.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Change {
    Acquired {
        worker: WorkerId,
        epoch: u64,
    },
    Lost {
        worker: WorkerId,
        reason: LossReason,
    },
}

/// One worker's lease as shown by `/debug/workers`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeaseView {
    pub held: bool,
    pub holder: Option<String>,
}

// === impl LeaseBoard ===

impl LeaseBoard {
    /// Leases of `workers` (`(id, name)`), none held yet.
    pub fn new(
        id: String,
        ttl: Duration,
        workers: impl IntoIterator<Item = (WorkerId, String)>,
    ) -> Self {
        Self {
            id,
            ttl,
            entries: workers
                .into_iter()
                .map(|(worker, name)| Entry {
                    worker,
                    name,
                    state: Mutex::new(State::default()),
                    epoch: watch::channel(0).0,
                })
                .collect(),
            rounds: AtomicU64::new(0),
            epochs: AtomicU64::new(0),
        }
    }

    pub fn id(&self) -> &str {
        &self.id
    }

    pub fn ttl(&self) -> Duration {
        self.ttl
    }

    /// How long after a renewal was sent the holder may still write.
    pub fn validity(&self) -> Duration {
        self.ttl * 2 / 3
    }

    fn entry(&self, worker: WorkerId) -> Option<&Entry> {
        self.entries.iter().find(|e| e.worker == worker)
    }

    /// The holding epoch of `worker` (0 = not held), for its stream task.
    pub fn subscribe(&self, worker: WorkerId) -> Option<watch::Receiver<u64>> {
        self.entry(worker).map(|e| e.epoch.subscribe())
    }

    /// This replica may write `worker` at `now`.
    pub fn valid(&self, worker: WorkerId, now: Instant) -> bool {
        self.entry(worker).is_some_and(|e| {
            e.state
                .lock()
                .renewed
                .is_some_and(|r| now.saturating_duration_since(r) < self.validity())
        })
    }

    pub fn view(&self, worker: WorkerId) -> Option<LeaseView> {
        self.entry(worker).map(|e| {
            let s = e.state.lock();
            LeaseView {
                held: s.renewed.is_some(),
                holder: s.holder.clone(),
            }
        })
    }

    pub fn managed(&self) -> impl Iterator<Item = WorkerId> + '_ {
        self.entries.iter().map(|e| e.worker)
    }

    /// Rounds completed (successful or not).
    pub fn rounds(&self) -> u64 {
        self.rounds.load(Relaxed)
    }

    /// What the next round asks: `(worker, acquire)`; held leases are only
    /// extended, so a lease that vanished (expired, Redis restarted empty)
    /// shows as lost before it is taken again under a new epoch.
    pub fn request(&self) -> Vec<(WorkerId, bool)> {
        self.entries
            .iter()
            .map(|e| (e.worker, e.state.lock().renewed.is_none()))
            .collect()
    }

    /// Apply a round sent at `sent`: `holders` in [`Self::request`] order,
    /// or the error. Returns what changed (and tells the stream tasks).
    pub fn settle(
        &self,
        sent: Instant,
        holders: Result<&[Option<String>], &IndexError>,
    ) -> Vec<Change> {
        self.rounds.fetch_add(1, Relaxed);
        let mut changes = Vec::new();
        let Ok(holders) = holders else {
            changes.extend(self.expire(Instant::now()));
            return changes;
        };
        for (e, holder) in self.entries.iter().zip(holders) {
            let ours = holder.as_deref() == Some(self.id.as_str());
            let mut s = e.state.lock();
            s.holder = holder.clone();
            match (s.renewed.is_some(), ours) {
                (true, true) => s.renewed = Some(sent),
                (false, true) => {
                    s.renewed = Some(sent);
                    let epoch = self.epochs.fetch_add(1, Relaxed) + 1;
                    e.epoch.send_replace(epoch);
                    changes.push(Change::Acquired {
                        worker: e.worker,
                        epoch,
                    });
                }
                (true, false) => {
                    s.renewed = None;
                    e.epoch.send_replace(0);
                    let reason = if holder.is_some() {
                        LossReason::taken
                    } else {
                        LossReason::expired
                    };
                    changes.push(Change::Lost {
                        worker: e.worker,
                        reason,
                    });
                }
                (false, false) => {}
            }
        }
        changes
    }

    /// Drop the leases whose last renewal is too old to write under.
    pub fn expire(&self, now: Instant) -> Vec<Change> {
        let mut changes = Vec::new();
        for e in &self.entries {
            let mut s = e.state.lock();
            if s.renewed
                .is_some_and(|r| now.saturating_duration_since(r) >= self.validity())
            {
                s.renewed = None;
                e.epoch.send_replace(0);
                changes.push(Change::Lost {
                    worker: e.worker,
                    reason: LossReason::unrenewed,
                });
            }
        }
        changes
    }

    /// Stop holding everything (shutdown); returns the workers that were held.
    pub fn drop_all(&self) -> Vec<WorkerId> {
        let mut held = Vec::new();
        for e in &self.entries {
            let mut s = e.state.lock();
            if s.renewed.take().is_some() {
                held.push(e.worker);
            }
            e.epoch.send_replace(0);
        }
        held
    }

    fn name(&self, worker: WorkerId) -> &str {
        self.entry(worker).map_or("?", |e| e.name.as_str())
    }

    fn record(&self, changes: &[Change], metrics: &RedisMetrics) {
        for c in changes {
            match *c {
                Change::Acquired { worker, epoch } => {
                    tracing::info!(worker = self.name(worker), epoch, replica = %self.id, "write lease acquired");
                    metrics.lease_acquired(self.name(worker));
                }
                Change::Lost { worker, reason } => {
                    tracing::warn!(worker = self.name(worker), ?reason, replica = %self.id, "write lease lost; stopped applying");
                    metrics.lease_lost(self.name(worker), reason);
                }
            }
        }
    }
}

/// Keep this replica's leases: a round every third of the TTL until
/// `shutdown`, then release what is held (bounded by the lease budget).
pub async fn run(
    backend: Arc<RedisBackend>,
    board: Arc<LeaseBoard>,
    mut shutdown: watch::Receiver<bool>,
) {
    let metrics = backend.metrics().clone();
    for e in &board.entries {
        metrics.lease_idle(&e.name);
    }
    let mut tick = tokio::time::interval(board.ttl() / 3);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            biased;
            _ = shutdown.wait_for(|stop| *stop) => break,
            _ = tick.tick() => {}
        }
        let expired = board.expire(Instant::now());
        board.record(&expired, &metrics);
        let request = board.request();
        let sent = Instant::now();
        let result = backend.lease_round(&request, board.id()).await;
        if let Err(error) = &result {
            tracing::debug!(%error, "lease round failed");
        }
        let changes = board.settle(sent, result.as_deref());
        board.record(&changes, &metrics);
    }
    let held = board.drop_all();
    for w in &held {
        metrics.lease_lost(board.name(*w), LossReason::released);
    }
    if let Err(error) = backend.release_leases(&held, board.id()).await {
        tracing::debug!(%error, "lease release failed; they lapse after their TTL");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn board() -> LeaseBoard {
        LeaseBoard::new(
            "me".into(),
            Duration::from_millis(3_000),
            [(0, "w0".into()), (1, "w1".into())],
        )
    }

    fn s(v: &str) -> Option<String> {
        Some(v.into())
    }

    #[test]
    fn acquire_renew_and_lose_to_another_holder() {
        let b = board();
        let mut rx = b.subscribe(0).unwrap();
        assert_eq!(b.request(), vec![(0, true), (1, true)]);
        let t0 = Instant::now();
        let c = b.settle(t0, Ok(&[s("me"), s("other")]));
        assert_eq!(
            c,
            vec![Change::Acquired {
                worker: 0,
                epoch: 1
            }]
        );
        assert_eq!(*rx.borrow_and_update(), 1);
        assert!(b.valid(0, t0) && !b.valid(1, t0));
        assert_eq!(
            b.view(1).unwrap(),
            LeaseView {
                held: false,
                holder: s("other")
            }
        );
        // Held leases are only extended from now on.
        assert_eq!(b.request(), vec![(0, false), (1, true)]);
        let t1 = t0 + Duration::from_millis(1_000);
        assert!(b.settle(t1, Ok(&[s("me"), s("other")])).is_empty());
        assert!(b.valid(0, t1 + Duration::from_millis(1_999)));
        assert!(!b.valid(0, t1 + Duration::from_millis(2_000)));
        // Someone else holds it now: stop at once.
        let c = b.settle(t1, Ok(&[s("other"), s("other")]));
        assert_eq!(
            c,
            vec![Change::Lost {
                worker: 0,
                reason: LossReason::taken
            }]
        );
        assert_eq!(*rx.borrow_and_update(), 0);
        assert!(!b.valid(0, t1));
    }

    #[test]
    fn a_vanished_lease_is_lost_then_taken_under_a_new_epoch() {
        let b = board();
        let t0 = Instant::now();
        b.settle(t0, Ok(&[s("me"), s("me")]));
        // Redis restarted empty: the renewal finds nothing.
        let c = b.settle(t0, Ok(&[None, s("me")]));
        assert_eq!(
            c,
            vec![Change::Lost {
                worker: 0,
                reason: LossReason::expired
            }]
        );
        let c = b.settle(t0, Ok(&[s("me"), s("me")]));
        assert_eq!(
            c,
            vec![Change::Acquired {
                worker: 0,
                epoch: 3
            }]
        );
    }

    #[test]
    fn without_renewals_the_holder_stops_after_two_thirds_of_the_ttl() {
        let b = board();
        let t0 = Instant::now();
        b.settle(t0, Ok(&[s("me"), None]));
        let down = IndexError::Backend("down".into());
        // A failed round alone changes nothing while the lease is valid.
        assert!(b.expire(t0 + Duration::from_millis(1_999)).is_empty());
        assert!(b.valid(0, t0 + Duration::from_millis(1_999)));
        let c = b.expire(t0 + Duration::from_millis(2_000));
        assert_eq!(
            c,
            vec![Change::Lost {
                worker: 0,
                reason: LossReason::unrenewed
            }]
        );
        assert!(b.settle(t0, Err(&down)).is_empty());
        assert_eq!(b.rounds(), 2);
        assert_eq!(b.drop_all(), Vec::<WorkerId>::new());
    }
}
