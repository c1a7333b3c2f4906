//! Terminal reports (DONE, CANCELLED) that failed, sent again.
//!
//! A lost terminal report leaves its pick counted as in flight at the
//! indexer until the ledger's TTL (minutes): phantom load that steers
//! traffic away from a worker. The chaos soak lost them whenever the indexer
//! paused (a SIGSTOP, a GC-like stall, a restart) for longer than the report
//! timeout. So a terminal report whose call fails is sent again after 250 ms,
//! 500 ms, 1 s and 2 s (with 200 ms timeouts it outlives a pause of ~4.5 s). A
//! duplicate is harmless: the indexer's ledger ignores a second terminal
//! report. FIRST_TOKEN reports are not retried: a late one carries nothing
//! the DONE does not.
//!
//! Both maps are bounded; a report that does not fit is simply not retried.

use std::collections::HashMap;
use std::time::Duration;

use kvsteer_proto::v1::{ReportKind, ReportRequest};

/// Sends of one terminal report at most.
pub const ATTEMPTS: u8 = 5;
/// Reports tracked (sent, or waiting to be sent again) at most.
pub const CAPACITY: usize = 4096;
/// How often the root context looks for due retries while some wait.
pub const TICK: Duration = Duration::from_millis(50);

/// The wait before the send after attempt `attempt` (1-based) failed.
pub fn delay(attempt: u8) -> Duration {
    Duration::from_millis(250 << u32::from(attempt.saturating_sub(1).min(4)))
}

/// What a call's answer means for its report.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Answer {
    /// Not a tracked report (a FIRST_TOKEN, or one that did not fit).
    Untracked,
    /// Delivered.
    Delivered,
    /// Failed; it goes out again when due.
    Retry,
    /// Failed for the last time.
    GaveUp,
}

#[derive(Debug, Default)]
pub struct Retries {
    /// Calls under way: token → (report, attempt).
    sent: HashMap<u32, (ReportRequest, u8)>,
    /// Waiting: (due, as time since the epoch; report; attempt just failed).
    due: Vec<(Duration, ReportRequest, u8)>,
}

// === impl Retries ===

impl Retries {
    /// A report went out as call `token` (its `attempt`-th send).
    pub fn sent(&mut self, token: u32, report: ReportRequest, attempt: u8) {
        let terminal =
            report.kind == ReportKind::Done as i32 || report.kind == ReportKind::Cancelled as i32;
        if terminal && self.sent.len() + self.due.len() < CAPACITY {
            self.sent.insert(token, (report, attempt));
        }
    }

    /// Call `token` ended, delivered or not, at `now`.
    pub fn answered(&mut self, token: u32, delivered: bool, now: Duration) -> Answer {
        let Some((report, attempt)) = self.sent.remove(&token) else {
            return Answer::Untracked;
        };
        if delivered {
            Answer::Delivered
        } else if attempt >= ATTEMPTS {
            Answer::GaveUp
        } else {
            self.due.push((now + delay(attempt), report, attempt));
            Answer::Retry
        }
    }

    /// Reports due at `now`, with the number of their next send.
    pub fn take_due(&mut self, now: Duration) -> Vec<(ReportRequest, u8)> {
        let mut ready = Vec::new();
        self.due.retain_mut(|(at, report, attempt)| {
            if *at <= now {
                ready.push((std::mem::take(report), *attempt + 1));
                false
            } else {
                true
            }
        });
        ready
    }

    /// Whether retries wait (the root keeps ticking).
    pub fn waiting(&self) -> bool {
        !self.due.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(kind: ReportKind) -> ReportRequest {
        ReportRequest {
            request_id: "p-1".to_owned(),
            kind: kind as i32,
            ..ReportRequest::default()
        }
    }

    const T0: Duration = Duration::from_secs(100);

    #[test]
    fn a_failed_terminal_report_is_sent_again_until_the_last_attempt() {
        let mut r = Retries::default();
        let mut now = T0;
        let mut next = (report(ReportKind::Done), 1);
        for token in 1..u32::from(ATTEMPTS) {
            r.sent(token, next.0.clone(), next.1);
            assert_eq!(r.answered(token, false, now), Answer::Retry);
            assert!(r.waiting());
            assert!(r.take_due(now).is_empty(), "not before its delay");
            now += delay(next.1);
            let due = r.take_due(now);
            assert_eq!(due.len(), 1);
            next = due.into_iter().next().expect("one");
            assert_eq!(next.0.request_id, "p-1");
            assert_eq!(next.1, u8::try_from(token + 1).expect("small"));
        }
        r.sent(99, next.0, next.1);
        assert_eq!(r.answered(99, false, now), Answer::GaveUp);
        assert!(!r.waiting());
    }

    #[test]
    fn delivered_and_untracked_reports_are_not_retried() {
        let mut r = Retries::default();
        r.sent(1, report(ReportKind::Cancelled), 1);
        assert_eq!(r.answered(1, true, T0), Answer::Delivered);
        r.sent(2, report(ReportKind::FirstToken), 1);
        assert_eq!(r.answered(2, false, T0), Answer::Untracked);
        assert_eq!(r.answered(3, false, T0), Answer::Untracked);
        assert!(!r.waiting());
    }

    #[test]
    fn the_delays_grow_and_cover_a_pause_of_four_seconds() {
        assert_eq!(delay(1), Duration::from_millis(250));
        assert_eq!(delay(2), Duration::from_millis(500));
        assert_eq!(delay(3), Duration::from_secs(1));
        assert_eq!(delay(4), Duration::from_secs(2));
        let waited: Duration = (1..ATTEMPTS).map(delay).sum();
        // Plus one 200 ms timeout per attempt.
        assert!(
            waited + Duration::from_millis(200) * u32::from(ATTEMPTS) >= Duration::from_secs(4)
        );
    }

    #[test]
    fn tracking_is_bounded() {
        let mut r = Retries::default();
        for token in 0..u32::try_from(CAPACITY + 10).expect("fits") {
            r.sent(token, report(ReportKind::Done), 1);
        }
        assert_eq!(r.sent.len(), CAPACITY);
    }
}
