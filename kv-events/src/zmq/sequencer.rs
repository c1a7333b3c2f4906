//! Sequence bookkeeping of one subscriber, free of I/O: which live message to
//! deliver, drop as a duplicate, treat as a gap, or take as an engine restart,
//! and what to make of a replay reply.
//!
//! A restarted engine counts from 0 again, so "seq went back" alone cannot
//! tell a restart from a duplicate (live messages queued while a replay ran).
//! The sequencer therefore remembers a hash of recently delivered payloads:
//! an old seq with the same payload is a duplicate, with another payload a
//! restart (every payload starts with its own timestamp).

use std::collections::VecDeque;
use std::hash::{DefaultHasher, Hash, Hasher};

use super::replay_client::ReplayedBatch;

/// Delivered (seq, payload hash) pairs remembered for duplicate detection.
const RECENT: usize = 4096;

#[derive(Debug, Default)]
pub(crate) struct Sequencer {
    last: Option<u64>,
    /// Highest live seq seen since the last reset: live messages of one
    /// engine only ever go up.
    live_high: Option<u64>,
    recent: VecDeque<(u64, u64)>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Live {
    Deliver,
    Duplicate,
    Gap { expected: u64 },
    Reset { last_seq: u64 },
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum ReplayPlan {
    /// The replay shows another engine incarnation than the one delivered so far.
    Reset { last_seq: u64, got: u64 },
    /// Deliver these replies (indices, in order); `lost` is the range
    /// `[from, to)` that was no longer buffered.
    Deliver {
        indices: Vec<usize>,
        lost: Option<(u64, u64)>,
    },
}

// === impl Sequencer ===

impl Sequencer {
    pub(crate) fn last(&self) -> Option<u64> {
        self.last
    }

    /// Where a replay should start: the last delivered seq itself (so its
    /// payload can be compared), or 0 when nothing was delivered.
    pub(crate) fn resume_from(&self) -> u64 {
        self.last.unwrap_or(0)
    }

    pub(crate) fn reset(&mut self) {
        *self = Self::default();
    }

    pub(crate) fn classify_live(&mut self, seq: u64, payload: &[u8]) -> Live {
        let went_back = self.live_high.is_some_and(|high| seq <= high);
        self.live_high = Some(self.live_high.map_or(seq, |h| h.max(seq)));
        let Some(last) = self.last else {
            return if seq == 0 {
                Live::Deliver
            } else {
                Live::Gap { expected: 0 }
            };
        };
        let expected = last.saturating_add(1);
        if seq == expected && last != u64::MAX {
            return Live::Deliver;
        }
        if seq > expected {
            return Live::Gap { expected };
        }
        match self.recent_hash(seq) {
            Some(h) if h == hash(payload) => Live::Duplicate,
            Some(_) => Live::Reset { last_seq: last },
            None if went_back => Live::Reset { last_seq: last },
            None => Live::Duplicate,
        }
    }

    pub(crate) fn plan_replay(&self, replies: &[ReplayedBatch]) -> ReplayPlan {
        let newest = replies.last().map(|b| b.seq);
        if let Some(last) = self.last {
            let same_engine = match replies.iter().find(|b| b.seq == last) {
                Some(b) => self.recent_hash(last).is_none_or(|h| h == hash(&b.payload)),
                // The engine's newest batch is older than ours: it restarted.
                None => newest.is_some_and(|n| n > last),
            };
            if !same_engine {
                return ReplayPlan::Reset {
                    last_seq: last,
                    got: newest.unwrap_or(0),
                };
            }
        }
        let mut indices = Vec::new();
        let mut high = self.last;
        for (i, b) in replies.iter().enumerate() {
            if high.is_none_or(|h| b.seq > h) {
                indices.push(i);
                high = Some(b.seq);
            }
        }
        let lost = match (self.last, indices.first().map(|i| replies[*i].seq)) {
            (Some(last), Some(first)) if first > last.saturating_add(1) => Some((last + 1, first)),
            _ => None,
        };
        ReplayPlan::Deliver { indices, lost }
    }

    pub(crate) fn delivered(&mut self, seq: u64, payload: &[u8]) {
        self.last = Some(seq);
        if self.recent.len() == RECENT {
            self.recent.pop_front();
        }
        self.recent.push_back((seq, hash(payload)));
    }

    fn recent_hash(&self, seq: u64) -> Option<u64> {
        self.recent
            .iter()
            .rev()
            .find(|(s, _)| *s == seq)
            .map(|(_, h)| *h)
    }
}

fn hash(payload: &[u8]) -> u64 {
    let mut h = DefaultHasher::new();
    payload.hash(&mut h);
    h.finish()
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;

    use super::*;

    fn rb(seq: u64, payload: &'static [u8]) -> ReplayedBatch {
        ReplayedBatch {
            seq,
            payload: Bytes::from_static(payload),
        }
    }

    #[test]
    fn in_order_gap_and_duplicate() {
        let mut s = Sequencer::default();
        assert_eq!(s.classify_live(0, b"a"), Live::Deliver);
        s.delivered(0, b"a");
        assert_eq!(s.classify_live(1, b"b"), Live::Deliver);
        s.delivered(1, b"b");
        assert_eq!(s.classify_live(1, b"b"), Live::Duplicate);
        assert_eq!(s.classify_live(4, b"e"), Live::Gap { expected: 2 });
    }

    #[test]
    fn restart_is_told_from_duplicate_by_payload() {
        let mut s = Sequencer::default();
        for (seq, p) in [(0, b"a"), (1, b"b"), (2, b"c")] {
            s.classify_live(seq, p);
            s.delivered(seq, p);
        }
        assert_eq!(s.classify_live(0, b"new"), Live::Reset { last_seq: 2 });
    }

    #[test]
    fn first_live_message_after_start_is_a_gap() {
        let mut s = Sequencer::default();
        assert_eq!(s.classify_live(3, b"d"), Live::Gap { expected: 0 });
    }

    #[test]
    fn replay_from_same_engine_delivers_newer_only() {
        let mut s = Sequencer::default();
        s.delivered(2, b"c");
        let plan = s.plan_replay(&[rb(2, b"c"), rb(3, b"d"), rb(4, b"e")]);
        assert_eq!(
            plan,
            ReplayPlan::Deliver {
                indices: vec![1, 2],
                lost: None
            }
        );
    }

    #[test]
    fn replay_detects_restart() {
        let mut s = Sequencer::default();
        s.delivered(5, b"f");
        // The new engine is behind us.
        assert_eq!(
            s.plan_replay(&[rb(0, b"x"), rb(1, b"y")]),
            ReplayPlan::Reset {
                last_seq: 5,
                got: 1
            }
        );
        assert_eq!(
            s.plan_replay(&[]),
            ReplayPlan::Reset {
                last_seq: 5,
                got: 0
            }
        );
        // The new engine got further, but seq 5 is another payload.
        assert!(matches!(
            s.plan_replay(&[rb(5, b"other"), rb(6, b"z")]),
            ReplayPlan::Reset { .. }
        ));
    }

    #[test]
    fn replay_reports_evicted_range() {
        let mut s = Sequencer::default();
        s.delivered(1, b"b");
        assert_eq!(
            s.plan_replay(&[rb(4, b"e"), rb(5, b"f")]),
            ReplayPlan::Deliver {
                indices: vec![0, 1],
                lost: Some((2, 4))
            }
        );
    }
}
