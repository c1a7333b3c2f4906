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

use parking_lot::{Mutex, RwLock};
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

/// This replica's view of every managed worker's lease. Workers join and
/// leave at run time (discovered pods): [`LeaseBoard::add`],
/// [`LeaseBoard::remove`].
pub struct LeaseBoard {
    id: String,
    ttl: Duration,
    entries: RwLock<Vec<Arc<Entry>>>,
    /// The workers of the last [`LeaseBoard::request`], in its order: what
    /// [`LeaseBoard::settle`]'s answers stand for.
    asked: Mutex<Vec<WorkerId>>,
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

impl Entry {
    fn new(worker: WorkerId, name: String) -> Self {
        Self {
            worker,
            name,
            state: Mutex::new(State::default()),
            epoch: watch::channel(0).0,
        }
    }
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
        let entries: Vec<Arc<Entry>> = workers
            .into_iter()
            .map(|(worker, name)| Arc::new(Entry::new(worker, name)))
            .collect();
        Self {
            id,
            ttl,
            asked: Mutex::new(entries.iter().map(|e| e.worker).collect()),
            entries: RwLock::new(entries),
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

    fn entry(&self, worker: WorkerId) -> Option<Arc<Entry>> {
        self.entries
            .read()
            .iter()
            .find(|e| e.worker == worker)
            .cloned()
    }

    fn snapshot(&self) -> Vec<Arc<Entry>> {
        self.entries.read().clone()
    }

    /// Manages `worker`'s lease from the next round on (not held yet).
    pub fn add(&self, worker: WorkerId, name: String) {
        let mut entries = self.entries.write();
        if !entries.iter().any(|e| e.worker == worker) {
            entries.push(Arc::new(Entry::new(worker, name)));
        }
    }

    /// Stops managing `worker`'s lease (the worker left); its stream task
    /// sees epoch 0. Returns whether this replica held it (the caller
    /// releases it in Redis).
    pub fn remove(&self, worker: WorkerId) -> bool {
        let removed = {
            let mut entries = self.entries.write();
            let i = entries.iter().position(|e| e.worker == worker);
            i.map(|i| entries.swap_remove(i))
        };
        let Some(e) = removed else {
            return false;
        };
        let held = e.state.lock().renewed.take().is_some();
        e.epoch.send_replace(0);
        held
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

    pub fn managed(&self) -> Vec<WorkerId> {
        self.entries.read().iter().map(|e| e.worker).collect()
    }

    /// Rounds completed (successful or not).
    pub fn rounds(&self) -> u64 {
        self.rounds.load(Relaxed)
    }

    /// What the next round asks: `(worker, acquire)`; held leases are only
    /// extended, so a lease that vanished (expired, Redis restarted empty)
    /// shows as lost before it is taken again under a new epoch.
    pub fn request(&self) -> Vec<(WorkerId, bool)> {
        let request: Vec<(WorkerId, bool)> = self
            .entries
            .read()
            .iter()
            .map(|e| (e.worker, e.state.lock().renewed.is_none()))
            .collect();
        *self.asked.lock() = request.iter().map(|&(w, _)| w).collect();
        request
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
        let asked = self.asked.lock().clone();
        for (worker, holder) in asked.into_iter().zip(holders) {
            // A worker that left since the request is no longer ours to settle.
            let Some(e) = self.entry(worker) else {
                continue;
            };
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
        for e in self.snapshot() {
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
        for e in self.snapshot() {
            let mut s = e.state.lock();
            if s.renewed.take().is_some() {
                held.push(e.worker);
            }
            e.epoch.send_replace(0);
        }
        held
    }

    fn name(&self, worker: WorkerId) -> String {
        self.entry(worker)
            .map_or_else(|| worker.to_string(), |e| e.name.clone())
    }

    fn record(&self, changes: &[Change], metrics: &RedisMetrics) {
        for c in changes {
            match *c {
                Change::Acquired { worker, epoch } => {
                    let name = self.name(worker);
                    tracing::info!(worker = %name, epoch, replica = %self.id, "write lease acquired");
                    metrics.lease_acquired(&name);
                }
                Change::Lost { worker, reason } => {
                    let name = self.name(worker);
                    tracing::warn!(worker = %name, ?reason, replica = %self.id, "write lease lost; stopped applying");
                    metrics.lease_lost(&name, reason);
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
    for e in board.snapshot() {
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
        metrics.lease_lost(&board.name(*w), LossReason::released);
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
