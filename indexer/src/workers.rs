//! The static worker set: configuration plus the live state every part of
//! the service shares (event stream status, scrape health).

use crate::{config::WorkerConfig, index::WorkerId, scrape::Health, streams::StreamStatus};

pub struct Worker {
    /// Position in the configuration; also the index's worker id.
    pub id: WorkerId,
    pub cfg: WorkerConfig,
    pub stream: StreamStatus,
    pub health: Health,
}

// === impl Worker ===

impl Worker {
    /// A candidate for picks: its `/metrics` answers (when scraped; the
    /// last `down_after` scrapes did not all fail) and its event stream has
    /// not lost the engine while the engine's blocks are still indexed
    /// (they may be gone with it: phantom hits).
    pub fn is_up(&self, down_after: u32) -> bool {
        (self.cfg.metrics.is_none() || self.health.is_up(down_after)) && !self.stream.suspect()
    }
}

pub struct Workers {
    list: Vec<Worker>,
}

// === impl Workers ===

impl Workers {
    pub fn new(cfgs: &[WorkerConfig]) -> Self {
        let list = cfgs
            .iter()
            .enumerate()
            .map(|(i, cfg)| Worker {
                id: i as WorkerId,
                cfg: cfg.clone(),
                stream: StreamStatus::default(),
                health: Health::default(),
            })
            .collect();
        Self { list }
    }

    pub fn iter(&self) -> impl Iterator<Item = &Worker> {
        self.list.iter()
    }

    pub fn get(&self, index: usize) -> Option<&Worker> {
        self.list.get(index)
    }

    pub fn len(&self) -> usize {
        self.list.len()
    }

    pub fn is_empty(&self) -> bool {
        self.list.is_empty()
    }

    /// Ready once at least one event stream is live.
    pub fn any_live(&self) -> bool {
        self.list.iter().any(|w| w.stream.state().is_live())
    }
}
