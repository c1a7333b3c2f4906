//! Reports waiting for the root context to send them.
//!
//! Why a queue: the proxy-wasm Rust SDK delivers a gRPC call's answer to the
//! context that was running when the call was dispatched, and silently drops
//! it once that context is gone. Envoy keeps every call on the root context,
//! so a report dispatched by an HTTP context from `on_log` is still sent, but
//! its answer (or its failure) reaches nobody, and `report_failed` stayed 0
//! while reports timed out. HTTP contexts therefore queue their reports here
//! and the root context dispatches them from its tick (armed on demand, 1 ms),
//! so it also receives and counts every answer.
//!
//! The queue is bounded; a report that does not fit is counted as failed. A
//! DONE or CANCELLED queued while the same pick's FIRST_TOKEN is still
//! waiting takes its place (it carries the same time as `first_token_ms`):
//! one call, not two.

use std::collections::VecDeque;

use kvsteer_proto::v1::{ReportKind, ReportRequest};

/// Reports held at most; more than a few ticks' worth means the host stopped ticking.
pub const DEFAULT_CAPACITY: usize = 4096;

#[derive(Clone, Debug)]
pub struct Outbox {
    queue: VecDeque<ReportRequest>,
    capacity: usize,
}

/// What happened to a queued report.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Queued {
    /// Queued; the queue was empty, so the sender must be woken.
    First,
    /// Queued behind others (a wake-up is already due).
    Behind,
    /// Merged into a waiting report of the same pick.
    Merged,
    /// Dropped: the queue is full.
    Full,
}

// === impl Outbox ===

impl Default for Outbox {
    fn default() -> Self {
        Self::with_capacity(DEFAULT_CAPACITY)
    }
}

impl Outbox {
    pub fn with_capacity(capacity: usize) -> Self {
        Self {
            queue: VecDeque::new(),
            capacity: capacity.max(1),
        }
    }

    pub fn len(&self) -> usize {
        self.queue.len()
    }

    pub fn is_empty(&self) -> bool {
        self.queue.is_empty()
    }

    pub fn push(&mut self, report: ReportRequest) -> Queued {
        let Some(report) = self.absorb_first_token(report) else {
            return Queued::Merged;
        };
        if self.queue.len() >= self.capacity {
            return Queued::Full;
        }
        let first = self.queue.is_empty();
        self.queue.push_back(report);
        if first { Queued::First } else { Queued::Behind }
    }

    /// Everything queued, oldest first.
    pub fn drain(&mut self) -> impl Iterator<Item = ReportRequest> + '_ {
        self.queue.drain(..)
    }

    /// A terminal report replaces the same pick's waiting FIRST_TOKEN; one
    /// without a first token of its own (the filter always sets it; this
    /// keeps the sample for any other sender) takes over its time and
    /// whether it was measured. Returns the report when it was not absorbed.
    fn absorb_first_token(&mut self, mut end: ReportRequest) -> Option<ReportRequest> {
        let terminal = [ReportKind::Done as i32, ReportKind::Cancelled as i32];
        if !terminal.contains(&end.kind) {
            return Some(end);
        }
        let Some(at) = self.queue.iter().position(|r| {
            r.kind == ReportKind::FirstToken as i32 && r.request_id == end.request_id
        }) else {
            return Some(end);
        };
        let first = &self.queue[at];
        if end.first_token_ms.is_none() {
            end.first_token_ms = Some(first.elapsed_ms);
            end.ttft_measured = first.ttft_measured;
        }
        self.queue[at] = end;
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(id: &str, kind: ReportKind, elapsed_ms: f64) -> ReportRequest {
        ReportRequest {
            request_id: id.to_owned(),
            kind: kind as i32,
            elapsed_ms,
            ..ReportRequest::default()
        }
    }

    #[test]
    fn queues_in_order_and_says_when_to_wake_the_sender() {
        let mut o = Outbox::default();
        assert!(o.is_empty());
        assert_eq!(o.push(report("a", ReportKind::Done, 1.0)), Queued::First);
        assert_eq!(
            o.push(report("b", ReportKind::Cancelled, 2.0)),
            Queued::Behind
        );
        let ids: Vec<String> = o.drain().map(|r| r.request_id).collect();
        assert_eq!(ids, ["a", "b"]);
        assert!(o.is_empty());
        assert_eq!(o.push(report("c", ReportKind::Done, 1.0)), Queued::First);
    }

    #[test]
    fn a_done_absorbs_the_waiting_first_token_of_its_pick() {
        let mut o = Outbox::default();
        let mut first = report("a", ReportKind::FirstToken, 40.0);
        first.ttft_measured = true;
        o.push(report("b", ReportKind::FirstToken, 10.0));
        o.push(first);
        assert_eq!(o.push(report("a", ReportKind::Done, 90.0)), Queued::Merged);
        let sent: Vec<ReportRequest> = o.drain().collect();
        assert_eq!(sent.len(), 2);
        assert_eq!(sent[0].request_id, "b");
        let done = &sent[1];
        assert_eq!(done.kind, ReportKind::Done as i32);
        assert_eq!(done.elapsed_ms, 90.0);
        assert_eq!(done.first_token_ms, Some(40.0));
        assert!(done.ttft_measured);
    }

    #[test]
    fn a_cancel_absorbs_the_waiting_first_token_too() {
        let mut o = Outbox::default();
        let mut first = report("a", ReportKind::FirstToken, 40.0);
        first.ttft_measured = true;
        o.push(first);
        assert_eq!(
            o.push(report("a", ReportKind::Cancelled, 50.0)),
            Queued::Merged
        );
        let sent: Vec<ReportRequest> = o.drain().collect();
        assert_eq!(sent.len(), 1);
        assert_eq!(sent[0].kind, ReportKind::Cancelled as i32);
        assert_eq!(sent[0].first_token_ms, Some(40.0), "the sample is kept");
        assert!(sent[0].ttft_measured);
        // First tokens of other picks stay apart.
        let mut o = Outbox::default();
        o.push(report("a", ReportKind::FirstToken, 40.0));
        assert_eq!(
            o.push(report("b", ReportKind::Cancelled, 50.0)),
            Queued::Behind
        );
    }

    #[test]
    fn a_done_with_its_own_first_token_keeps_it() {
        let mut o = Outbox::default();
        o.push(report("a", ReportKind::FirstToken, 40.0));
        let mut done = report("a", ReportKind::Done, 60.0);
        done.first_token_ms = Some(40.0);
        done.ttft_measured = true;
        assert_eq!(o.push(done), Queued::Merged);
        let sent: Vec<ReportRequest> = o.drain().collect();
        assert_eq!(sent.len(), 1);
        assert_eq!(sent[0].kind, ReportKind::Done as i32);
        assert_eq!(sent[0].first_token_ms, Some(40.0));
        assert!(sent[0].ttft_measured);
    }

    #[test]
    fn a_full_queue_drops_and_says_so() {
        let mut o = Outbox::with_capacity(2);
        o.push(report("a", ReportKind::Done, 1.0));
        o.push(report("b", ReportKind::FirstToken, 1.0));
        assert_eq!(o.push(report("c", ReportKind::Done, 1.0)), Queued::Full);
        // Merging needs no room.
        assert_eq!(o.push(report("b", ReportKind::Done, 2.0)), Queued::Merged);
        assert_eq!(o.len(), 2);
    }
}
