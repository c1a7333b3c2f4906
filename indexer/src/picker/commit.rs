//! Commit: a pick's ledger entry (in flight on its worker, its prompt
//! held there until its end), its blocks in the route memories, and its
//! metrics.
//!
//! Everything is recorded before the answer leaves, on the unary call and
//! the stream alike: a pick that comes after an answer sees all of it, and
//! no pick waits for another's records. (Sending a stream's answer before
//! the per-block records was tried and reverted: its gain at light load was
//! within the machine's drift, and under concurrency every pick waited for
//! the records deferred before it, `indexer/README.md`, "Pick latency under
//! concurrency".)

use super::{Mode, Picker};
use crate::{
    index::WorkerId,
    keys::BlockKey,
    ledger::{Entry, Opened},
    metrics::{AbandonLabels, PickLabels, ReasonLabels},
    scoring::Prediction,
};
use std::time::Instant;

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

// === impl Picker ===

impl Picker {
    /// Records a pick: its ledger entry (in flight on its worker, its
    /// prompt held there until its end), its routes and its
    /// metrics. A pick whose terminal report came first records nothing.
    /// The gRPC handler calls this last, once its caller is known to be
    /// still there ([`Mode::Deferred`]).
    pub fn commit(&self, p: Placement) -> Committed {
        // The slot may be vacated (its ledger entries dropped) or hold a new
        // worker by now: record nothing on it then.
        let present = self
            .workers
            .get(p.worker)
            .is_some_and(|w| w.id == p.worker_id && !w.is_retired());
        if !present {
            self.metrics
                .pick_abandoned
                .get_or_create(&AbandonLabels {
                    reason: "worker_gone",
                })
                .inc();
            return Committed::WorkerGone;
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
            if self.ledger.open(&p.request_id, entry, p.keys.clone()) == Opened::Reported {
                self.metrics
                    .pick_abandoned
                    .get_or_create(&AbandonLabels { reason: "reported" })
                    .inc();
                tracing::debug!(request_id = %p.request_id, "pick not counted: its terminal report came first");
                return Committed::Reported;
            }
        }
        self.routes.record(p.worker, &p.keys, p.at);
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
        Committed::Recorded
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
