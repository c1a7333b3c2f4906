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

/// What to do with one batch of a replay reply, read in seq order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ReplayStep {
    /// Already delivered (or older than what was delivered).
    Skip,
    /// New: deliver it. `lost` is the range `[from, to)` between what was
    /// delivered and this batch that the reply does not hold.
    Deliver { lost: Option<(u64, u64)> },
    /// The reply shows another engine incarnation than the one delivered so far.
    Restarted { last_seq: u64 },
}

/// Whether a replay reply has shown yet that it comes from the engine
/// delivered so far (it can tell only once it reaches the last delivered seq).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ReplayCheck {
    confirmed: bool,
    newest: Option<u64>,
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

    /// Classifies the next batch of a replay reply (asked from
    /// [`resume_from`](Self::resume_from), so the last delivered batch comes
    /// first when the engine still buffers it).
    pub(crate) fn replay_step(
        &self,
        check: &mut ReplayCheck,
        seq: u64,
        payload: &[u8],
    ) -> ReplayStep {
        check.newest = Some(check.newest.map_or(seq, |n| n.max(seq)));
        let Some(last) = self.last else {
            check.confirmed = true;
            return ReplayStep::Deliver { lost: None };
        };
        if seq < last {
            return ReplayStep::Skip;
        }
        if seq == last {
            if check.confirmed {
                return ReplayStep::Skip;
            }
            check.confirmed = true;
            return match self.recent_hash(last) {
                Some(h) if h != hash(payload) => ReplayStep::Restarted { last_seq: last },
                _ => ReplayStep::Skip,
            };
        }
        // Past our last batch without having seen it: the engine evicted it
        // (same engine, some batches lost) or, when it reached this seq in
        // its present life, restarted; the two cannot be told apart here and
        // the loss is reported either way.
        check.confirmed = true;
        let next = last.saturating_add(1);
        ReplayStep::Deliver {
            lost: (seq > next).then_some((next, seq)),
        }
    }

    /// At the end marker: `Restarted` when the reply never reached the last
    /// delivered seq (the engine's newest batch is older than ours), with the
    /// newest seq the reply held (0 when empty).
    pub(crate) fn replay_end(&self, check: &ReplayCheck) -> Option<(u64, u64)> {
        match self.last {
            Some(last) if !check.confirmed => Some((last, check.newest.unwrap_or(0))),
            _ => None,
        }
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
    use super::*;

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

    /// Feeds a reply through `replay_step` the way the subscriber does
    /// (delivering as it goes); the steps, then what `replay_end` says.
    fn run(s: &mut Sequencer, reply: &[(u64, &[u8])]) -> (Vec<ReplayStep>, Option<(u64, u64)>) {
        let mut check = ReplayCheck::default();
        let mut steps = Vec::new();
        for (seq, payload) in reply {
            let step = s.replay_step(&mut check, *seq, payload);
            if let ReplayStep::Deliver { .. } = step {
                s.delivered(*seq, payload);
            }
            steps.push(step);
            if let ReplayStep::Restarted { .. } = step {
                return (steps, None);
            }
        }
        let end = s.replay_end(&check);
        (steps, end)
    }

    const NEW: ReplayStep = ReplayStep::Deliver { lost: None };

    #[test]
    fn replay_from_same_engine_delivers_newer_only() {
        let mut s = Sequencer::default();
        s.delivered(2, b"c");
        let (steps, end) = run(&mut s, &[(2, b"c"), (3, b"d"), (4, b"e")]);
        assert_eq!(steps, [ReplayStep::Skip, NEW, NEW]);
        assert_eq!(end, None);
        assert_eq!(s.last(), Some(4));
    }

    #[test]
    fn replay_into_empty_sequencer_delivers_all() {
        let mut s = Sequencer::default();
        let (steps, end) = run(&mut s, &[(0, b"a"), (1, b"b")]);
        assert_eq!(steps, [NEW, NEW]);
        assert_eq!(end, None);
        assert_eq!(run(&mut Sequencer::default(), &[]), (vec![], None));
    }

    #[test]
    fn replay_detects_restart() {
        let mut s = Sequencer::default();
        s.delivered(5, b"f");
        // The new engine is behind us (asked from 5, an older engine's
        // ROUTER would send nothing; older seqs are skipped if sent).
        assert_eq!(
            run(&mut s, &[(0, b"x"), (1, b"y")]),
            (vec![ReplayStep::Skip; 2], Some((5, 1)))
        );
        assert_eq!(run(&mut s, &[]), (vec![], Some((5, 0))));
        // The new engine got further, but seq 5 is another payload.
        assert_eq!(
            run(&mut s, &[(5, b"other"), (6, b"z")]).0,
            [ReplayStep::Restarted { last_seq: 5 }]
        );
    }

    #[test]
    fn replay_reports_evicted_range() {
        let mut s = Sequencer::default();
        s.delivered(1, b"b");
        let (steps, end) = run(&mut s, &[(4, b"e"), (5, b"f")]);
        assert_eq!(steps, [ReplayStep::Deliver { lost: Some((2, 4)) }, NEW]);
        assert_eq!(end, None);
    }

    #[test]
    fn gap_inside_a_reply_is_reported_against_what_was_delivered() {
        let mut s = Sequencer::default();
        s.delivered(1, b"b");
        let (steps, _) = run(&mut s, &[(1, b"b"), (2, b"c"), (7, b"h")]);
        assert_eq!(
            steps,
            [
                ReplayStep::Skip,
                NEW,
                ReplayStep::Deliver { lost: Some((3, 7)) }
            ]
        );
    }
}
