//! Report bookkeeping for one request: picked → first token? → done |
//! cancelled. Exactly one terminal report per picked request; every event is
//! idempotent, and requests that were never picked report nothing.

use kvsteer_proto::v1::{ReportKind, ReportRequest, Usage};

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ReportState {
    /// Not steered by the indexer: nothing to report.
    #[default]
    Unpicked,
    /// Forwarded upstream with the indexer's choice.
    Picked,
    /// The first response body bytes arrived.
    FirstToken,
    /// Done or cancelled was reported.
    Finished,
}

#[derive(Clone, Debug, Default)]
pub struct ReportTracker {
    state: ReportState,
}

/// What the response has told the filter so far; fills the report fields.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ResponseFacts {
    pub upstream: String,
    pub status: u32,
}

// === impl ReportTracker ===

impl ReportTracker {
    pub fn state(&self) -> ReportState {
        self.state
    }

    /// Reports are due for this request: the pick was applied.
    pub fn picked(&mut self) {
        if self.state == ReportState::Unpicked {
            self.state = ReportState::Picked;
        }
    }

    /// Whether response bytes still matter (first token or the final usage).
    pub fn wants_response(&self) -> bool {
        matches!(self.state, ReportState::Picked | ReportState::FirstToken)
    }

    /// A response body chunk of `len` bytes arrived.
    pub fn on_body(&mut self, len: usize) -> Option<ReportKind> {
        if self.state == ReportState::Picked && len > 0 {
            self.state = ReportState::FirstToken;
            Some(ReportKind::FirstToken)
        } else {
            None
        }
    }

    /// The response reached its end of stream.
    pub fn on_end(&mut self) -> Option<ReportKind> {
        self.finish(ReportKind::Done)
    }

    /// The stream went away (client cancel, upstream reset, local reply)
    /// without a response end.
    pub fn on_close(&mut self) -> Option<ReportKind> {
        self.finish(ReportKind::Cancelled)
    }

    fn finish(&mut self, kind: ReportKind) -> Option<ReportKind> {
        if self.wants_response() {
            self.state = ReportState::Finished;
            Some(kind)
        } else {
            None
        }
    }
}

/// Builds a report. `usage` is only sent with done.
pub fn report_request(
    request_id: &str,
    kind: ReportKind,
    facts: &ResponseFacts,
    elapsed_ms: f64,
    usage: Option<Usage>,
) -> ReportRequest {
    ReportRequest {
        request_id: request_id.to_owned(),
        kind: kind as i32,
        usage: if kind == ReportKind::Done {
            usage
        } else {
            None
        },
        upstream: facts.upstream.clone(),
        elapsed_ms: if elapsed_ms.is_finite() {
            elapsed_ms.max(0.0)
        } else {
            0.0
        },
        status: facts.status,
        ..ReportRequest::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unpicked_requests_report_nothing() {
        let mut t = ReportTracker::default();
        assert!(!t.wants_response());
        assert_eq!(t.on_body(10), None);
        assert_eq!(t.on_end(), None);
        assert_eq!(t.on_close(), None);
        assert_eq!(t.state(), ReportState::Unpicked);
    }

    #[test]
    fn streamed_response_reports_first_token_then_done_once() {
        let mut t = ReportTracker::default();
        t.picked();
        assert_eq!(t.on_body(0), None, "empty chunks are not a token");
        assert_eq!(t.on_body(5), Some(ReportKind::FirstToken));
        assert_eq!(t.on_body(5), None);
        assert_eq!(t.on_end(), Some(ReportKind::Done));
        assert_eq!(t.on_end(), None);
        assert_eq!(t.on_close(), None, "closing after done is not a cancel");
        assert_eq!(t.on_body(5), None);
        assert_eq!(t.state(), ReportState::Finished);
    }

    #[test]
    fn bodiless_response_is_done_without_first_token() {
        let mut t = ReportTracker::default();
        t.picked();
        assert_eq!(t.on_end(), Some(ReportKind::Done));
        assert_eq!(t.on_close(), None);
    }

    #[test]
    fn early_close_is_cancelled_once() {
        let mut before_token = ReportTracker::default();
        before_token.picked();
        assert_eq!(before_token.on_close(), Some(ReportKind::Cancelled));
        assert_eq!(before_token.on_close(), None);
        assert_eq!(before_token.on_end(), None);

        let mut after_token = ReportTracker::default();
        after_token.picked();
        after_token.on_body(1);
        assert_eq!(after_token.on_close(), Some(ReportKind::Cancelled));
        assert_eq!(after_token.on_end(), None);
    }

    #[test]
    fn picked_is_idempotent() {
        let mut t = ReportTracker::default();
        t.picked();
        t.on_body(1);
        t.picked();
        assert_eq!(t.state(), ReportState::FirstToken);
        t.on_end();
        t.picked();
        assert_eq!(t.state(), ReportState::Finished);
    }

    #[test]
    fn report_fields() {
        let facts = ResponseFacts {
            upstream: "127.0.0.1:8001".into(),
            status: 200,
        };
        let usage = Usage {
            prompt_tokens: 3,
            completion_tokens: 2,
            cached_tokens: 1,
        };
        let done = report_request("r1", ReportKind::Done, &facts, 12.5, Some(usage));
        assert_eq!(done.request_id, "r1");
        assert_eq!(done.kind, ReportKind::Done as i32);
        assert_eq!(done.usage, Some(usage));
        assert_eq!(done.upstream, "127.0.0.1:8001");
        assert_eq!(done.elapsed_ms, 12.5);
        assert_eq!(done.status, 200);
        let first = report_request("r1", ReportKind::FirstToken, &facts, -1.0, Some(usage));
        assert_eq!(first.usage, None);
        assert_eq!(first.elapsed_ms, 0.0);
        let nan = report_request("r1", ReportKind::Cancelled, &facts, f64::NAN, None);
        assert_eq!(nan.elapsed_ms, 0.0);
    }
}
