//! How long each worker's queue has lasted, as picks see it: the time
//! since a pick last found the worker with no request waiting for its
//! first token. Scoring tells a burst (a queue younger than
//! `scoring.lasting_queue_s`) from a queue that lasts.
//!
//! Sampled at committed picks (a dry run reads it and changes nothing).
//! A queue that formed after the last dry sighting is counted from that
//! sighting, the longest it can have lasted: between picks, or while only
//! dry runs ask, the age errs towards counting the queue in full (moving
//! the prompt, as without the rule).

use parking_lot::Mutex;
use std::time::Instant;

/// Per worker slot, when a pick last found it without a queue (`None`:
/// not since the slot was taken, so the queue's age is unknown).
#[derive(Debug)]
pub struct QueueAge {
    last_dry: Mutex<Vec<Option<Instant>>>,
}

impl QueueAge {
    pub fn new(capacity: usize) -> Self {
        Self {
            last_dry: Mutex::new(vec![None; capacity]),
        }
    }

    /// Seconds the worker in `slot` has had a queue at `now`, given
    /// whether it has one (`queued`): 0 without one; `None` when no pick
    /// has found it dry (a queue of unknown age counts as lasting).
    pub fn age_s(&self, slot: usize, queued: bool, now: Instant) -> Option<f64> {
        if !queued {
            return Some(0.0);
        }
        let dry = self.last_dry.lock().get(slot).copied().flatten()?;
        Some(now.saturating_duration_since(dry).as_secs_f64())
    }

    /// Records what a committed pick at `now` saw: the worker in `slot`
    /// with (`queued`) or without requests waiting for their first token.
    pub fn observe(&self, slot: usize, queued: bool, now: Instant) {
        if queued {
            return;
        }
        if let Some(dry) = self.last_dry.lock().get_mut(slot) {
            *dry = Some(now);
        }
    }

    /// Forgets a leaving worker's slot.
    pub fn forget(&self, slot: usize) {
        if let Some(dry) = self.last_dry.lock().get_mut(slot) {
            *dry = None;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn a_queue_is_as_old_as_the_last_pick_that_found_the_worker_dry() {
        let clock = QueueAge::new(2);
        let t0 = Instant::now();
        let at = |s: u64| t0 + Duration::from_secs(s);
        assert_eq!(clock.age_s(0, true, t0), None, "never found dry: unknown");
        assert_eq!(clock.age_s(0, false, t0), Some(0.0), "no queue: 0");
        clock.observe(0, false, at(1));
        clock.observe(0, true, at(3));
        assert_eq!(
            clock.age_s(0, true, at(7)),
            Some(6.0),
            "counted from the dry sighting, not the first queued one"
        );
        clock.observe(0, false, at(8));
        assert_eq!(
            clock.age_s(0, true, at(10)),
            Some(2.0),
            "a dry pick restarts it"
        );
        assert_eq!(clock.age_s(1, true, at(10)), None, "slots are separate");
    }

    #[test]
    fn a_forgotten_or_unknown_slot_has_no_age() {
        let clock = QueueAge::new(1);
        let t0 = Instant::now();
        clock.observe(0, false, t0);
        assert_eq!(clock.age_s(0, true, t0), Some(0.0));
        clock.forget(0);
        assert_eq!(clock.age_s(0, true, t0), None);
        clock.observe(5, false, t0);
        clock.forget(5);
        assert_eq!(clock.age_s(5, true, t0), None, "out of range: ignored");
    }
}
