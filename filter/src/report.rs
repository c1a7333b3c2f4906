//! Report bookkeeping for one request, as a state machine with no host types:
//!
//! ```text
//! idle --pick_sent--> pending --answered(steered)--> picked --flush--> first_token_sent
//!                        |  \--answered(unchosen)--> unchosen           |
//!                        |   \--answered(abandoned)--> CANCELLED        |
//!                        \--close--> CANCELLED      picked | first_token_sent --end--> DONE
//!                                                                       \--close--> CANCELLED
//! ```
//!
//! What it guarantees (and `tests` checks over random event sequences):
//! at most one terminal report (DONE or CANCELLED) per request; a request
//! whose pick was sent and that ends (response end, stream close, failed
//! pick) gets exactly one; no FIRST_TOKEN after the terminal report. A
//! response whose first output was not reported on its own by the time it
//! ends (one chunk, or a whole JSON body) gets one DONE carrying
//! `first_token_ms`. A DONE after a FIRST_TOKEN repeats its time, and so
//! does a CANCELLED after a first output: the two are separate calls, which
//! the indexer may take in either order (each runs as its own task) or lose
//! one of, and it counts the first it gets.

use kvsteer_proto::v1::{ReportKind, ReportRequest, Usage};

/// How a `Pick` call ended, as far as the indexer's ledger is concerned.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PickEnd {
    /// The chosen destination was applied: the request goes to that worker.
    Steered,
    /// The indexer answered without choosing a worker (no endpoints, a
    /// rejection): it holds nothing for this request.
    Unchosen,
    /// The call failed or its answer could not be applied: the indexer may
    /// hold the request's load, so it is cancelled.
    Abandoned,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ReportState {
    /// No pick sent: nothing to report.
    #[default]
    Idle,
    /// The indexer answered without choosing a worker: nothing to report.
    Unchosen,
    /// The `Pick` call is outstanding.
    Pending,
    /// Forwarded to the indexer's choice; no first-token report sent yet.
    Picked,
    /// A FIRST_TOKEN report was sent.
    FirstTokenSent,
    /// DONE or CANCELLED was reported.
    Finished,
}

/// When the first generated output was seen, in ms since the request was
/// forwarded.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct FirstOutput {
    pub at_ms: f64,
    /// A real time to first token: a streamed 2xx response's first output event.
    pub measured: bool,
    /// Worth a FIRST_TOKEN report of its own (streams); otherwise it only
    /// rides on the terminal report (whole responses, whose first bytes
    /// come with the end).
    pub alone: bool,
}

/// One report to send, without the request's identity and response facts.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Report {
    pub kind: ReportKind,
    /// ms since forwarding to this event.
    pub elapsed_ms: f64,
    /// DONE and CANCELLED only: the first token (also when a FIRST_TOKEN
    /// report said so); a CANCELLED has one only if output was seen.
    pub first_token_ms: Option<f64>,
    /// `elapsed_ms` (FIRST_TOKEN) or `first_token_ms` (DONE, CANCELLED) is a measured TTFT.
    pub ttft_measured: bool,
}

#[derive(Clone, Debug, Default)]
pub struct ReportTracker {
    state: ReportState,
    first_bytes_ms: Option<f64>,
    first_output: Option<FirstOutput>,
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

    /// The `Pick` call was dispatched: from now on the indexer may count it.
    pub fn pick_sent(&mut self) {
        if self.state == ReportState::Idle {
            self.state = ReportState::Pending;
        }
    }

    pub fn is_pending(&self) -> bool {
        self.state == ReportState::Pending
    }

    /// The `Pick` call ended; an abandoned pick is cancelled right away.
    pub fn pick_answered(&mut self, end: PickEnd) -> Option<Report> {
        if self.state != ReportState::Pending {
            return None;
        }
        match end {
            PickEnd::Steered => {
                self.state = ReportState::Picked;
                None
            }
            PickEnd::Unchosen => {
                self.state = ReportState::Unchosen;
                None
            }
            PickEnd::Abandoned => self.finish(ReportKind::Cancelled, 0.0),
        }
    }

    /// Whether response bytes still matter (first token or the final usage).
    pub fn wants_response(&self) -> bool {
        matches!(
            self.state,
            ReportState::Picked | ReportState::FirstTokenSent
        )
    }

    /// Response body bytes arrived at `at_ms` (the fallback first-token time
    /// when no output event is recognised).
    pub fn response_bytes(&mut self, at_ms: f64) {
        if self.wants_response() && self.first_bytes_ms.is_none() {
            self.first_bytes_ms = Some(at_ms);
        }
    }

    /// The first generated output was seen; only the first sighting counts.
    pub fn output(&mut self, first: FirstOutput) {
        if self.state == ReportState::Picked && self.first_output.is_none() {
            self.first_output = Some(first);
        }
    }

    /// The FIRST_TOKEN report, once the output that deserves one was seen
    /// and the response did not end in the same callback (then `end` carries
    /// it instead).
    pub fn flush_first_token(&mut self) -> Option<Report> {
        let first = self.first_output.filter(|f| f.alone)?;
        if self.state != ReportState::Picked {
            return None;
        }
        self.state = ReportState::FirstTokenSent;
        Some(Report {
            kind: ReportKind::FirstToken,
            elapsed_ms: first.at_ms,
            first_token_ms: None,
            ttft_measured: first.measured,
        })
    }

    /// The response reached its end of stream at `at_ms`. Its DONE carries
    /// the first token, whether or not it was reported alone.
    pub fn end(&mut self, at_ms: f64) -> Option<Report> {
        if !self.wants_response() {
            return None;
        }
        // Without an output event, the first bytes (or the end) stand in.
        let first = self.first_output.unwrap_or(FirstOutput {
            at_ms: self.first_bytes_ms.unwrap_or(at_ms),
            measured: false,
            alone: false,
        });
        Some(self.finish(ReportKind::Done, at_ms)?.carrying(first))
    }

    /// The stream went away (client reset, upstream reset, local reply)
    /// before the response ended, or while the pick was outstanding. Its
    /// CANCELLED carries the first output, if one was seen.
    pub fn close(&mut self, at_ms: f64) -> Option<Report> {
        match self.state {
            ReportState::Pending | ReportState::Picked | ReportState::FirstTokenSent => {
                let first = self.first_output;
                let report = self.finish(ReportKind::Cancelled, at_ms)?;
                Some(match first {
                    Some(first) => report.carrying(first),
                    None => report,
                })
            }
            ReportState::Idle | ReportState::Unchosen | ReportState::Finished => None,
        }
    }

    fn finish(&mut self, kind: ReportKind, at_ms: f64) -> Option<Report> {
        if self.state == ReportState::Finished {
            return None;
        }
        self.state = ReportState::Finished;
        Some(Report {
            kind,
            elapsed_ms: at_ms,
            first_token_ms: None,
            ttft_measured: false,
        })
    }
}

// === impl Report ===

impl Report {
    /// This terminal report with `first` as its first token.
    fn carrying(self, first: FirstOutput) -> Self {
        Self {
            first_token_ms: Some(first.at_ms),
            ttft_measured: first.measured,
            ..self
        }
    }
}

/// Builds the wire report. `usage` is only sent with DONE,
/// `first_token_ms` with a terminal report.
pub fn report_request(
    pick_id: &str,
    report: &Report,
    facts: &ResponseFacts,
    usage: Option<Usage>,
) -> ReportRequest {
    let done = report.kind == ReportKind::Done;
    let first_token_ms = if report.kind == ReportKind::FirstToken {
        None
    } else {
        report.first_token_ms.map(non_negative)
    };
    ReportRequest {
        request_id: pick_id.to_owned(),
        kind: report.kind as i32,
        usage: if done { usage } else { None },
        upstream: facts.upstream.clone(),
        elapsed_ms: non_negative(report.elapsed_ms),
        status: facts.status,
        ttft_measured: report.ttft_measured
            && (report.kind == ReportKind::FirstToken || first_token_ms.is_some()),
        first_token_ms,
        replica: String::new(),
    }
}

fn non_negative(ms: f64) -> f64 {
    if ms.is_finite() { ms.max(0.0) } else { 0.0 }
}

#[cfg(test)]
mod tests;
