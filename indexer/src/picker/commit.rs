//! Commit: a pick's ledger entry (in flight on its worker, its prompt
//! queued there until the first token), its blocks in the route memories,
//! and its metrics.
//!
//! A commit has two parts. The entry, the worker's load and the metrics
//! are recorded before the answer leaves: whatever reads the load or the
//! metrics once the caller has its answer sees the pick. The per-block
//! records (the prompt's blocks queued on the worker, its routes) are the
//! costly part on long prompts, one map update per block (a 10k-token
//! prompt has ~700): a `PickStream` answer leaves before them
//! ([`Picker::commit_answered`]). Until they are recorded, picks wait for
//! them before they read the workers ([`Trailing`]), so a pick arriving
//! after an answer sees all of it, as when it was recorded first.

use super::{Mode, Picker};
use crate::{
    index::WorkerId,
    keys::BlockKey,
    ledger::{Entry, Opened},
    metrics::{AbandonLabels, PickLabels, ReasonLabels},
    scoring::Prediction,
};
use std::{
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
    time::Instant,
};
use tokio::sync::Notify;

/// A pick not yet committed: what the ledger, the route memory and the
/// pick metrics record of it.
#[derive(Debug, Clone, PartialEq)]
pub struct Placement {
    pub(super) request_id: String,
    pub(super) worker: usize,
    /// The worker's id: its slot may have another worker by the commit.
    pub(super) worker_id: WorkerId,
    pub(super) keys: Vec<BlockKey>,
    pub(super) prediction: Prediction,
    pub(super) tenant: String,
    pub(super) policy: &'static str,
    pub(super) degraded: Option<&'static str>,
    pub(super) prompt_tokens: u32,
    pub(super) matched_tokens: u32,
    /// The pick's moment (stamps the entry and the routes).
    pub(super) at: Instant,
    /// Wall time the pick started, for the latency histogram.
    pub(super) start: Instant,
}

/// What [`Picker::commit`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Committed {
    /// Recorded: in flight on its worker until its terminal report.
    Recorded,
    /// Its terminal report came first: nothing recorded.
    Reported,
    /// Its worker left between the pick and the commit: nothing recorded
    /// (the request goes to Envoy's fallback).
    WorkerGone,
}

/// A commit's per-block records, not yet made: the prompt's blocks queued
/// on its worker, its routes.
#[derive(Debug)]
struct Blocks {
    request_id: String,
    worker: usize,
    worker_id: WorkerId,
    keys: Vec<BlockKey>,
    at: Instant,
}

/// A committed pick whose per-block records wait for its answer to be
/// sent. Dropping it records them: a task ended right after sending its
/// answer still leaves the pick whole.
#[must_use = "dropped at once, it records the blocks before the answer is sent"]
pub struct AfterAnswer {
    picker: Arc<Picker>,
    blocks: Option<Blocks>,
}

/// Commits whose per-block records are still to come. A pick reads the
/// workers once those open when it arrived are closed
/// ([`Trailing::settled`]): what was answered before it arrived is all in
/// its view.
#[derive(Debug, Default)]
pub(super) struct Trailing {
    open: AtomicUsize,
    settled: Notify,
}

// === impl Picker ===

impl Picker {
    /// Records a pick: its ledger entry (in flight on its worker, its
    /// prompt queued there until the first token), its routes and its
    /// metrics. A pick whose terminal report came first records nothing.
    /// The gRPC handler calls this last, once its caller is known to be
    /// still there ([`Mode::Deferred`]).
    pub fn commit(&self, p: Placement) -> Committed {
        let (committed, blocks) = self.commit_entry(p);
        if let Some(b) = blocks {
            let at = b.at;
            self.record_blocks(b, at);
        }
        committed
    }

    /// [`Self::commit`] whose per-block records wait for the answer: made
    /// when the returned [`AfterAnswer`] is dropped (after the answer is
    /// sent). Picks that read the workers meanwhile wait for them.
    pub fn commit_answered(self: &Arc<Self>, p: Placement) -> (Committed, AfterAnswer) {
        let (committed, blocks) = self.commit_entry(p);
        if blocks.is_some() {
            self.trailing.open.fetch_add(1, Ordering::AcqRel);
        }
        let after = AfterAnswer {
            picker: self.clone(),
            blocks,
        };
        (committed, after)
    }

    /// The entry, the load and the metrics; the per-block records to make.
    fn commit_entry(&self, p: Placement) -> (Committed, Option<Blocks>) {
        // The slot may be vacated (its ledger entries dropped) or hold a new
        // worker by now: record nothing on it then.
        if !self.holds(p.worker, p.worker_id) {
            self.metrics
                .pick_abandoned
                .get_or_create(&AbandonLabels {
                    reason: "worker_gone",
                })
                .inc();
            return (Committed::WorkerGone, None);
        }
        if !p.request_id.is_empty() {
            let entry = Entry {
                worker: p.worker,
                prediction: p.prediction,
                picked_at: p.at,
                first_token_at: None,
                tenant: p.tenant.clone(),
                policy: p.policy,
            };
            // Queued with its blocks below (`record_blocks`).
            if self.ledger.open(&p.request_id, entry, Vec::new()) == Opened::Reported {
                self.metrics
                    .pick_abandoned
                    .get_or_create(&AbandonLabels { reason: "reported" })
                    .inc();
                tracing::debug!(request_id = %p.request_id, "pick not counted: its terminal report came first");
                return (Committed::Reported, None);
            }
        }
        if let Some(reason) = p.degraded {
            self.metrics
                .degraded
                .get_or_create(&ReasonLabels {
                    reason,
                    tenant: p.tenant.clone(),
                })
                .inc();
        } else {
            self.metrics
                .prompt_tokens
                .observe(f64::from(p.prompt_tokens));
            if p.prompt_tokens > 0 {
                self.metrics
                    .matched_ratio
                    .observe(f64::from(p.matched_tokens) / f64::from(p.prompt_tokens));
            }
        }
        self.metrics
            .predicted_ttft
            .observe(p.prediction.ttft_ms / 1000.0);
        self.count(Mode::Commit, p.policy, "routed", &p.tenant, p.start);
        let blocks = (!p.keys.is_empty()).then_some(Blocks {
            request_id: p.request_id,
            worker: p.worker,
            worker_id: p.worker_id,
            keys: p.keys,
            at: p.at,
        });
        (Committed::Recorded, blocks)
    }

    /// The prompt's blocks queued on its worker (unless its entry has
    /// ended or has its first token by now) and in its routes (as routed
    /// at `routed_at`).
    fn record_blocks(&self, b: Blocks, routed_at: Instant) {
        if !self.holds(b.worker, b.worker_id) {
            return;
        }
        self.routes.record(b.worker, &b.keys, routed_at);
        if !b.request_id.is_empty() {
            self.ledger.queue(&b.request_id, b.at, b.keys);
        }
    }

    /// Whether slot `slot` still holds worker `id`, not retired.
    fn holds(&self, slot: usize, id: WorkerId) -> bool {
        self.workers
            .get(slot)
            .is_some_and(|w| w.id == id && !w.is_retired())
    }

    pub(super) fn count(
        &self,
        mode: Mode,
        policy: &'static str,
        outcome: &'static str,
        tenant: &str,
        start: Instant,
    ) {
        if mode == Mode::DryRun {
            return;
        }
        self.metrics
            .picks
            .get_or_create(&PickLabels {
                policy,
                outcome,
                tenant: tenant.to_owned(),
            })
            .inc();
        self.metrics
            .pick_latency
            .observe(start.elapsed().as_secs_f64());
    }
}

// === impl AfterAnswer ===

impl Drop for AfterAnswer {
    fn drop(&mut self) {
        if let Some(b) = self.blocks.take() {
            // Closed even if recording panics: picks must not wait forever.
            let _closed = Close(&self.picker.trailing);
            // Routed now, not at the pick: the route memory's items stay in
            // the order they came.
            let routed_at = Instant::now().max(b.at);
            self.picker.record_blocks(b, routed_at);
        }
    }
}

/// Closes one of [`Trailing`]'s open commits when dropped.
struct Close<'a>(&'a Trailing);

impl Drop for Close<'_> {
    fn drop(&mut self) {
        self.0.close();
    }
}

// === impl Trailing ===

impl Trailing {
    fn close(&self) {
        if self.open.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.settled.notify_waiters();
        }
    }

    /// Returns once no commit open when it was called is still open. One
    /// wakeup is enough: it comes when the count reaches 0, so every
    /// commit open before had closed by then, whatever opened since (a
    /// pick waiting for the count to stay at 0 could wait for ever under
    /// load).
    pub(super) async fn settled(&self) {
        let notified = self.settled.notified();
        tokio::pin!(notified);
        // Registered before the check: a close in between still wakes it.
        notified.as_mut().enable();
        if self.open.load(Ordering::Acquire) == 0 {
            return;
        }
        notified.await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A wait ends once the commits open when it began are closed, even if
    /// others opened since (under load the count may never stay at 0).
    #[tokio::test]
    async fn a_wait_ends_once_the_commits_open_at_its_start_close() {
        let t = Arc::new(Trailing::default());
        t.settled().await;
        t.open.fetch_add(1, Ordering::AcqRel);
        let waiter = tokio::spawn({
            let t = t.clone();
            async move { t.settled().await }
        });
        // This runtime has one thread: the waiter runs until it waits.
        tokio::task::yield_now().await;
        assert!(!waiter.is_finished(), "a commit is open");
        t.close();
        // Another commit opens before the waiter runs again.
        t.open.fetch_add(1, Ordering::AcqRel);
        tokio::task::yield_now().await;
        assert!(waiter.is_finished(), "the commit it waited for closed");
        t.close();
        assert_eq!(t.open.load(Ordering::Acquire), 0);
    }
}
