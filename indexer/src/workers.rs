//! The worker set: the static workers of the configuration and the workers
//! discovered at run time (Kubernetes pods), each in a slot, with the live
//! state every part of the service shares (event stream status, scrape
//! health).
//!
//! A slot is a worker's position in the per-worker tables of the ledger and
//! the route memories; its [`WorkerId`] is the index's (and Redis's) name
//! for it. A static worker's id is its position in the configuration; a
//! discovered one's is derived from its pod's uid ([`pod_worker_id`]), so
//! every indexer replica sharing a Redis index agrees on it. Slots are
//! reused, ids are not: a pod re-created under the same name has a new uid.
//!
//! Reads are lock-free (one atomic load per slot); only placing a worker
//! takes a lock.

use crate::{config::WorkerConfig, index::WorkerId, scrape::Health, streams::StreamStatus};
use arc_swap::{ArcSwap, ArcSwapOption};
use parking_lot::Mutex;
use std::sync::Arc;
use tokio::sync::watch;

/// Ids of discovered workers have this bit set; static ids never do.
const DISCOVERED_BIT: WorkerId = 1 << 31;

pub struct Worker {
    /// The index's id of the worker.
    pub id: WorkerId,
    /// Its slot in [`Workers`] (and in the ledger and route memories).
    pub slot: usize,
    pub cfg: WorkerConfig,
    pub origin: Origin,
    pub stream: StreamStatus,
    pub health: Health,
    /// The LoRA adapters it serves (its `/v1/models` entries with a
    /// `parent`), as last scraped.
    adapters: ArcSwap<Vec<String>>,
    /// Turns true when the worker leaves: its tasks stop, picks skip it.
    retired: watch::Sender<bool>,
}

/// Where a worker came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Origin {
    /// The configuration's `workers:` list.
    Static,
    /// A pod of a `discovery.kubernetes` pool.
    Pod {
        namespace: String,
        name: String,
        uid: String,
        ip: String,
    },
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum PlaceError {
    #[error("no free worker slot (discovery.kubernetes.max_workers: {0})")]
    Full(usize),
    #[error("worker id {0} is taken (two pod uids hash alike)")]
    IdTaken(WorkerId),
}

// === impl Worker ===

impl Worker {
    fn new(id: WorkerId, slot: usize, cfg: WorkerConfig, origin: Origin) -> Self {
        Self {
            id,
            slot,
            cfg,
            origin,
            stream: StreamStatus::default(),
            health: Health::default(),
            adapters: ArcSwap::from_pointee(Vec::new()),
            retired: watch::channel(false).0,
        }
    }

    /// A candidate for picks: not leaving, its `/metrics` answers (when
    /// scraped; the last `down_after` scrapes did not all fail) and its
    /// event stream has not lost the engine while the engine's blocks are
    /// still indexed (they may be gone with it: phantom hits).
    pub fn is_up(&self, down_after: u32) -> bool {
        !self.is_retired()
            && (self.cfg.metrics.is_none() || self.health.is_up(down_after))
            && !self.stream.suspect()
    }

    pub fn serves_adapter(&self, name: &str) -> bool {
        self.adapters.load().iter().any(|a| a == name)
    }

    pub fn adapters(&self) -> Arc<Vec<String>> {
        self.adapters.load_full()
    }

    /// Records the adapters its `/v1/models` lists now.
    pub fn set_adapters(&self, mut adapters: Vec<String>) {
        adapters.sort();
        adapters.dedup();
        if **self.adapters.load() != adapters {
            self.adapters.store(Arc::new(adapters));
        }
    }

    /// The worker is leaving: its tasks stop and picks skip it.
    pub fn retire(&self) {
        self.retired.send_replace(true);
    }

    pub fn is_retired(&self) -> bool {
        *self.retired.borrow()
    }

    /// Resolves once the worker is retired.
    pub async fn retired(&self) {
        let mut rx = self.retired.subscribe();
        let _ = rx.wait_for(|r| *r).await;
    }

    pub fn is_discovered(&self) -> bool {
        matches!(self.origin, Origin::Pod { .. })
    }
}

/// The id of the worker a pod with this uid is: the same on every replica.
pub fn pod_worker_id(uid: &str) -> WorkerId {
    let h = xxhash_rust::xxh3::xxh3_64(uid.as_bytes());
    DISCOVERED_BIT | (h as WorkerId & !DISCOVERED_BIT)
}

pub struct Workers {
    slots: Box<[ArcSwapOption<Worker>]>,
    /// Serializes placements (slot and id checks).
    place: Mutex<()>,
}

// === impl Workers ===

impl Workers {
    /// The static workers, in slots `0..cfgs.len()`, and nothing more.
    pub fn new(cfgs: &[WorkerConfig]) -> Self {
        Self::with_capacity(cfgs, cfgs.len())
    }

    /// The static workers and room for `capacity - cfgs.len()` more.
    pub fn with_capacity(cfgs: &[WorkerConfig], capacity: usize) -> Self {
        let slots = (0..capacity.max(cfgs.len()))
            .map(|i| {
                let w = cfgs.get(i).map(|cfg| {
                    Arc::new(Worker::new(i as WorkerId, i, cfg.clone(), Origin::Static))
                });
                ArcSwapOption::new(w)
            })
            .collect();
        Self {
            slots,
            place: Mutex::new(()),
        }
    }

    /// Slots in all: the size of the per-worker tables.
    pub fn capacity(&self) -> usize {
        self.slots.len()
    }

    /// Every worker present (retiring ones too), in slot order.
    pub fn iter(&self) -> impl Iterator<Item = Arc<Worker>> + '_ {
        self.slots.iter().filter_map(ArcSwapOption::load_full)
    }

    pub fn get(&self, slot: usize) -> Option<Arc<Worker>> {
        self.slots.get(slot)?.load_full()
    }

    /// The worker with index id `id`.
    pub fn by_id(&self, id: WorkerId) -> Option<Arc<Worker>> {
        self.iter().find(|w| w.id == id)
    }

    /// The workers of `model` that are not leaving, in slot order.
    pub fn serving(&self, model: &str) -> Vec<Arc<Worker>> {
        self.iter()
            .filter(|w| w.cfg.model == model && !w.is_retired())
            .collect()
    }

    /// The model of the workers (not leaving) that serve LoRA adapter
    /// `name`, if any does.
    pub fn adapter_base(&self, name: &str) -> Option<String> {
        self.iter()
            .find(|w| !w.is_retired() && w.serves_adapter(name))
            .map(|w| w.cfg.model.clone())
    }

    /// Whether some worker not leaving serves `model`.
    pub fn serves(&self, model: &str) -> bool {
        self.slots.iter().any(|s| {
            s.load()
                .as_ref()
                .is_some_and(|w| w.cfg.model == model && !w.is_retired())
        })
    }

    /// Workers present.
    pub fn len(&self) -> usize {
        self.slots.iter().filter(|s| s.load().is_some()).count()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Ready once at least one event stream is live.
    pub fn any_live(&self) -> bool {
        self.iter().any(|w| w.stream.state().is_live())
    }

    /// Places a new worker in the first free slot.
    pub fn place(
        &self,
        id: WorkerId,
        cfg: WorkerConfig,
        origin: Origin,
    ) -> Result<Arc<Worker>, PlaceError> {
        let _guard = self.place.lock();
        if self.iter().any(|w| w.id == id) {
            return Err(PlaceError::IdTaken(id));
        }
        let Some(slot) = self.slots.iter().position(|s| s.load().is_none()) else {
            return Err(PlaceError::Full(self.slots.len()));
        };
        let w = Arc::new(Worker::new(id, slot, cfg, origin));
        self.slots[slot].store(Some(w.clone()));
        Ok(w)
    }

    /// Frees `w`'s slot (once its tasks stopped and its state is purged).
    pub fn vacate(&self, w: &Worker) {
        let _guard = self.place.lock();
        let Some(s) = self.slots.get(w.slot) else {
            return;
        };
        if s.load().as_ref().is_some_and(|cur| cur.id == w.id) {
            s.store(None);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(name: &str, model: &str) -> WorkerConfig {
        WorkerConfig {
            name: name.into(),
            endpoint: "127.0.0.1:8000".into(),
            model: model.into(),
            ..Default::default()
        }
    }

    fn pod(uid: &str) -> Origin {
        Origin::Pod {
            namespace: "ns".into(),
            name: format!("pod-{uid}"),
            uid: uid.into(),
            ip: "10.0.0.1".into(),
        }
    }

    #[test]
    fn static_workers_fill_the_first_slots_and_keep_their_position_as_id() {
        let ws = Workers::with_capacity(&[cfg("a", "m"), cfg("b", "m")], 4);
        assert_eq!(ws.capacity(), 4);
        assert_eq!(ws.len(), 2);
        let ids: Vec<_> = ws.iter().map(|w| (w.id, w.slot)).collect();
        assert_eq!(ids, vec![(0, 0), (1, 1)]);
        assert!(ws.iter().all(|w| w.origin == Origin::Static));
    }

    #[test]
    fn placed_workers_take_free_slots_which_are_reused_after_vacate() {
        let ws = Workers::with_capacity(&[cfg("a", "m")], 3);
        let p = ws
            .place(pod_worker_id("u1"), cfg("p1", "m"), pod("u1"))
            .unwrap();
        assert_eq!(p.slot, 1);
        let q = ws
            .place(pod_worker_id("u2"), cfg("p2", "other"), pod("u2"))
            .unwrap();
        assert_eq!(q.slot, 2);
        assert_eq!(
            ws.place(pod_worker_id("u3"), cfg("p3", "m"), pod("u3"))
                .err(),
            Some(PlaceError::Full(3))
        );
        assert_eq!(ws.serving("m").len(), 2);
        assert!(ws.serves("other"));

        p.retire();
        assert!(!p.is_up(3), "a retiring worker is no candidate");
        assert_eq!(ws.serving("m").len(), 1, "nor is it served");
        ws.vacate(&p);
        assert!(ws.get(1).is_none());
        let r = ws
            .place(pod_worker_id("u3"), cfg("p3", "m"), pod("u3"))
            .unwrap();
        assert_eq!(r.slot, 1, "the freed slot is reused");
        // Vacating a worker that no longer holds its slot changes nothing.
        ws.vacate(&p);
        assert_eq!(ws.get(1).unwrap().id, r.id);
    }

    #[test]
    fn a_taken_id_is_refused() {
        let ws = Workers::with_capacity(&[], 4);
        let id = pod_worker_id("same");
        ws.place(id, cfg("p1", "m"), pod("same")).unwrap();
        assert_eq!(
            ws.place(id, cfg("p2", "m"), pod("same")).err(),
            Some(PlaceError::IdTaken(id))
        );
    }

    #[test]
    fn pod_ids_are_stable_distinct_and_never_a_static_position() {
        let a = pod_worker_id("6b1c2e1e-0000-4000-8000-000000000001");
        let b = pod_worker_id("6b1c2e1e-0000-4000-8000-000000000002");
        assert_eq!(a, pod_worker_id("6b1c2e1e-0000-4000-8000-000000000001"));
        assert_ne!(a, b);
        assert!(a & DISCOVERED_BIT != 0 && b & DISCOVERED_BIT != 0);
    }
}
