//! Workers joining and leaving while the service runs (discovered pods).
//!
//! Joining places the worker in a free slot, registers it with the index
//! (and the write-lease board) and starts its event stream: it starts
//! empty and replays what its publisher still buffers. Leaving retires it
//! first (picks skip it from then on), stops its stream, purges its index
//! entries (memory, or Redis when this replica writes the worker), drops
//! its ledger entries, route memories and metric series, and frees the
//! slot. A request picked for it and not yet committed is not recorded
//! ([`crate::picker::Committed::WorkerGone`]).

use crate::config::WorkerConfig;
use crate::{
    index::{
        Index, WorkerId,
        redis::{RedisBackend, lease::LeaseBoard},
    },
    picker::Picker,
    streams::{self, StreamContext},
    workers::{Origin, PlaceError, Worker, Workers},
};
use parking_lot::Mutex;
use std::{collections::HashMap, sync::Arc, time::Duration};
use tokio::task::JoinHandle;

/// How long a leaving worker's stream may take to stop.
const STOP_WITHIN: Duration = Duration::from_secs(5);
/// Purge attempts of a leaving worker (a Redis hiccup), and the pause.
const PURGE_ATTEMPTS: u32 = 3;
const PURGE_PAUSE: Duration = Duration::from_millis(200);

pub struct Fleet {
    workers: Arc<Workers>,
    index: Index,
    picker: Arc<Picker>,
    /// `None`: this replica applies no events (Redis `writer: never`).
    streams: Option<StreamContext>,
    /// Write leases (Redis `writer: auto`).
    leases: Option<(Arc<LeaseBoard>, Arc<RedisBackend>)>,
    block_sizes: HashMap<String, u32>,
    tasks: Mutex<HashMap<WorkerId, JoinHandle<()>>>,
}

// === impl Fleet ===

impl Fleet {
    pub fn new(
        picker: Arc<Picker>,
        index: Index,
        streams: Option<StreamContext>,
        leases: Option<(Arc<LeaseBoard>, Arc<RedisBackend>)>,
        block_sizes: HashMap<String, u32>,
    ) -> Self {
        Self {
            workers: picker.workers().clone(),
            index,
            picker,
            streams,
            leases,
            block_sizes,
            tasks: Mutex::new(HashMap::new()),
        }
    }

    pub fn workers(&self) -> &Arc<Workers> {
        &self.workers
    }

    /// Adds a worker and starts its event stream.
    pub fn join(
        &self,
        id: WorkerId,
        cfg: WorkerConfig,
        origin: Origin,
    ) -> Result<Arc<Worker>, PlaceError> {
        let w = self.workers.place(id, cfg, origin)?;
        let block_size = self.block_sizes.get(&w.cfg.model).copied().unwrap_or(16);
        self.index.register_worker(w.id, &w.cfg.model, block_size);
        if let Some((board, _)) = &self.leases
            && w.cfg.kv_events.is_some()
        {
            board.add(w.id, w.cfg.name.clone());
        }
        match &self.streams {
            Some(ctx) => {
                if let Some(task) = streams::spawn_worker(&w, ctx) {
                    self.tasks.lock().insert(w.id, task);
                }
            }
            None => streams::mark_one_disabled(&w, self.picker.metrics()),
        }
        tracing::info!(worker = %w.cfg.name, id = w.id, endpoint = %w.cfg.endpoint, model = %w.cfg.model, "worker joined");
        Ok(w)
    }

    /// Removes a worker: nothing of it is left once this returns (but its
    /// index entries, when every purge attempt failed: logged).
    pub async fn leave(&self, w: &Arc<Worker>, why: &str) {
        w.retire();
        let task = self.tasks.lock().remove(&w.id);
        if let Some(task) = task {
            let abort = task.abort_handle();
            if tokio::time::timeout(STOP_WITHIN, task).await.is_err() {
                tracing::warn!(worker = %w.cfg.name, "event stream did not stop in time; aborted");
                abort.abort();
            }
        }
        // Purge what this replica may write: everything without leases; with
        // leases only a held one (Redis fences the others' writes; their
        // holder purges when it sees the worker leave).
        let held = self
            .leases
            .as_ref()
            .map(|(board, _)| board.view(w.id).is_some_and(|v| v.held));
        let writes = self.streams.is_some() && held.unwrap_or(true);
        if writes {
            self.purge(w).await;
        } else {
            self.index.unregister_worker(w.id);
        }
        if let Some((board, backend)) = &self.leases
            && board.remove(w.id)
            && let Err(error) = backend.release_leases(&[w.id], board.id()).await
        {
            tracing::debug!(worker = %w.cfg.name, %error, "lease release failed; it lapses after its TTL");
        }
        let dropped = self.picker.forget_worker(w.slot, &w.cfg.name);
        self.workers.vacate(w);
        tracing::info!(worker = %w.cfg.name, id = w.id, why, in_flight_dropped = dropped, "worker left");
    }

    async fn purge(&self, w: &Worker) {
        for attempt in 1..=PURGE_ATTEMPTS {
            match self.index.remove_worker(w.id).await {
                Ok(()) => return,
                Err(error) if attempt < PURGE_ATTEMPTS => {
                    tracing::debug!(worker = %w.cfg.name, %error, attempt, "purge of a leaving worker failed; retrying");
                    tokio::time::sleep(PURGE_PAUSE).await;
                }
                Err(error) => {
                    // Its entries name an id no worker has: lookups ignore
                    // them; they take room until the capacity bound or a
                    // Redis restart drops them.
                    tracing::warn!(worker = %w.cfg.name, %error, "cannot purge a leaving worker's index entries");
                    self.index.unregister_worker(w.id);
                }
            }
        }
    }

    /// The stream tasks of joined workers (for shutdown).
    pub fn take_tasks(&self) -> Vec<JoinHandle<()>> {
        self.tasks.lock().drain().map(|(_, t)| t).collect()
    }
}
