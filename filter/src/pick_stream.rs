//! The filter's side of `PickStream`: which stream picks go on, which
//! picks wait on it, and when to open, rotate or give up on it. No host
//! calls here; the root context acts on what this decides.
//!
//! A few streams per plugin instance (Envoy worker; `pick_streams`, 2 by
//! default), picks taking the open ones in turn: the indexer cluster's load
//! balancer places each stream, so a worker's picks spread over as many
//! replicas as it has streams. Only the root context opens them: the SDK
//! delivers a stream's messages to the context that opened it, and the
//! root lives as long as the worker. A pick goes on a stream only once the
//! indexer has answered its headers (the stream is *open*); while none is,
//! picks take the unary call, so an indexer without `PickStream`
//! (UNIMPLEMENTED) or a stream being replaced costs no request anything.
//!
//! - A stream that closes before it opened is retried with a doubling
//!   back-off (`RETRY_FIRST` up to `RETRY_MAX`); UNIMPLEMENTED waits
//!   `RETRY_UNIMPLEMENTED`. One that closes after opening is replaced at
//!   once.
//! - A stream older than its maximum age (checked on the ticks that run
//!   while picks wait) is half-closed (it still gets the answers it owes)
//!   and a new one opened, one slot at a time while another stream is
//!   open: the indexer cluster's load
//!   balancer picks a replica per stream, so rotation spreads the workers'
//!   streams over replicas that came up later.
//! - Each pick waits until its deadline; the root's tick fails it open
//!   then, as Envoy's timeout fails a unary call.

use std::collections::HashMap;
use std::time::Duration;

use kvsteer_proto::v1::PickRequest;
use proxy_wasm::types::GrpcStatusCode;

/// First wait before retrying a stream that never opened.
pub(crate) const RETRY_FIRST: Duration = Duration::from_millis(250);
/// Longest such wait.
pub(crate) const RETRY_MAX: Duration = Duration::from_secs(30);
/// Wait after the indexer said it has no `PickStream`.
pub(crate) const RETRY_UNIMPLEMENTED: Duration = Duration::from_secs(300);
/// How long a stream may wait for the indexer's headers before it is
/// cancelled and retried.
pub(crate) const OPEN_TIMEOUT: Duration = Duration::from_secs(5);
/// How often deadlines are checked while picks wait on a stream: a stream
/// pick fails open up to this much after its timeout.
pub(crate) const PICK_TICK: Duration = Duration::from_millis(5);

/// The `PickStreamRequest` carrying `pick`, encoded without copying the
/// pick (prompts run to megabytes): field 1 `pick`, field 3 `timeout_ms`.
pub(crate) fn pick_message(pick: &PickRequest, timeout_ms: u32) -> Vec<u8> {
    let mut bytes = Vec::with_capacity(prost::Message::encoded_len(pick) + 16);
    prost::encoding::message::encode(1, pick, &mut bytes);
    if timeout_ms != 0 {
        prost::encoding::uint32::encode(3, &timeout_ms, &mut bytes);
    }
    bytes
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    /// No stream, none wanted yet (no pick has asked for one).
    Unwanted,
    /// No stream; open one at `at` (host time since the epoch).
    Closed { at: Duration },
    /// Opened (`token`) at `at`, the indexer's headers not yet in.
    Opening { token: u32, at: Duration },
    /// Picks go on `token`; opened at `since`.
    Open { token: u32, since: Duration },
}

/// A pick waiting for its answer on a stream.
#[derive(Debug)]
pub(crate) struct Waiting<H> {
    /// Who to give the answer to.
    pub(crate) handle: H,
    /// The stream it went on.
    pub(crate) token: u32,
    pub(crate) deadline: Duration,
}

pub(crate) struct PickStreams<H> {
    max_age: Duration,
    slots: Vec<Slot>,
    /// Where the round robin over open streams starts next.
    cursor: usize,
    waiting: HashMap<String, Waiting<H>>,
}

/// One of the worker's streams.
#[derive(Clone, Copy, Debug)]
struct Slot {
    state: State,
    /// Consecutive streams that closed before opening.
    failures: u32,
}

impl<H> PickStreams<H> {
    /// `count` streams (at least one), each replaced after `max_age`.
    pub(crate) fn new(count: usize, max_age: Duration) -> Self {
        let slot = Slot {
            state: State::Unwanted,
            failures: 0,
        };
        Self {
            max_age,
            slots: vec![slot; count.max(1)],
            cursor: 0,
            waiting: HashMap::new(),
        }
    }

    /// The stream a pick sent now goes on, taking the open ones in turn;
    /// `None`: use a unary call (and the streams are wanted from now on).
    pub(crate) fn stream(&mut self) -> Option<u32> {
        let n = self.slots.len();
        for i in 0..n {
            let at = (self.cursor + i) % n;
            if let State::Open { token, .. } = self.slots[at].state {
                self.cursor = (at + 1) % n;
                return Some(token);
            }
        }
        for slot in &mut self.slots {
            if slot.state == State::Unwanted {
                slot.state = State::Closed { at: Duration::ZERO };
            }
        }
        None
    }

    /// A slot the root should open a stream for now.
    pub(crate) fn open_due(&self, now: Duration) -> Option<usize> {
        self.slots
            .iter()
            .position(|s| matches!(s.state, State::Closed { at } if at <= now))
    }

    /// The root opened stream `token` for `slot`.
    pub(crate) fn opening(&mut self, slot: usize, token: u32, now: Duration) {
        if let Some(s) = self.slots.get_mut(slot) {
            s.state = State::Opening { token, at: now };
        }
    }

    /// Opening `slot`'s stream failed at the host: retry later.
    pub(crate) fn open_failed(&mut self, slot: usize, now: Duration) {
        if let Some(s) = self.slots.get_mut(slot) {
            s.state = State::Closed {
                at: now + s.back_off(),
            };
        }
    }

    /// The streams still waiting for their headers after `OPEN_TIMEOUT`:
    /// the root cancels them; others are opened after a back-off.
    pub(crate) fn open_timed_out(&mut self, now: Duration) -> Vec<u32> {
        let mut gone = Vec::new();
        for s in &mut self.slots {
            if let State::Opening { token, at } = s.state
                && now.saturating_sub(at) >= OPEN_TIMEOUT
            {
                s.state = State::Closed {
                    at: now + s.back_off(),
                };
                gone.push(token);
            }
        }
        gone
    }

    /// The indexer answered stream `token`'s headers: picks may go on it.
    pub(crate) fn established(&mut self, token: u32, now: Duration) {
        for s in &mut self.slots {
            if matches!(s.state, State::Opening { token: t, .. } if t == token) {
                s.state = State::Open { token, since: now };
                s.failures = 0;
            }
        }
    }

    /// The open streams to half-close because they reached their maximum
    /// age; their slots open successors now, picks meanwhile go on the
    /// others. With several slots a stream is half-closed only while
    /// another one is open, so streams opened together are replaced one
    /// after the other and picks never fall back to unary calls for a
    /// rotation. The last open one is kept, past its age, until another
    /// has opened (a later tick), or for as long as none can.
    pub(crate) fn rotate_due(&mut self, now: Duration) -> Vec<u32> {
        let single = self.slots.len() == 1;
        let mut open = self
            .slots
            .iter()
            .filter(|s| matches!(s.state, State::Open { .. }))
            .count();
        let mut old = Vec::new();
        for s in &mut self.slots {
            if let State::Open { token, since } = s.state
                && now.saturating_sub(since) >= self.max_age
                && (open > 1 || single)
            {
                s.state = State::Closed { at: now };
                open -= 1;
                old.push(token);
            }
        }
        old
    }

    /// Stream `token` closed with gRPC `status`: the picks waiting on it.
    pub(crate) fn closed(
        &mut self,
        token: u32,
        status: u32,
        now: Duration,
    ) -> Vec<(String, Waiting<H>)> {
        for s in &mut self.slots {
            match s.state {
                State::Opening { token: t, .. } if t == token => {
                    let wait = if status == GrpcStatusCode::Unimplemented as u32 {
                        RETRY_UNIMPLEMENTED
                    } else {
                        s.back_off()
                    };
                    s.state = State::Closed { at: now + wait };
                }
                State::Open { token: t, .. } if t == token => s.state = State::Closed { at: now },
                _ => {}
            }
        }
        self.waiting.extract_if(|_, w| w.token == token).collect()
    }

    /// The stream a pick went on (`token`) and until when it waits.
    pub(crate) fn sent(&mut self, id: String, handle: H, token: u32, deadline: Duration) {
        self.waiting.insert(
            id,
            Waiting {
                handle,
                token,
                deadline,
            },
        );
    }

    /// The pick `id` was answered; `None` if nobody waits for it any more.
    pub(crate) fn answered(&mut self, id: &str) -> Option<Waiting<H>> {
        self.waiting.remove(id)
    }

    /// The pick `id` is no longer awaited (its client went away): the
    /// stream to send its cancel on.
    pub(crate) fn forget(&mut self, id: &str) -> Option<u32> {
        self.waiting.remove(id).map(|w| w.token)
    }

    /// The picks past their deadline, no longer awaited.
    pub(crate) fn expired(&mut self, now: Duration) -> Vec<(String, Waiting<H>)> {
        self.waiting.extract_if(|_, w| w.deadline <= now).collect()
    }

    /// How soon the root needs its tick for the streams: deadlines while
    /// picks wait, then the next open, retry or open timeout; `None`: not
    /// at all. An open stream needs none of its own: it is rotated on a
    /// tick that finds it old, and ticks run while picks wait, so an idle
    /// worker does not wake up for it.
    pub(crate) fn next_tick(&self, now: Duration) -> Option<Duration> {
        let due = |at: Duration| at.saturating_sub(now).max(Duration::from_millis(1));
        let slots = self.slots.iter().filter_map(|s| match s.state {
            State::Unwanted | State::Open { .. } => None,
            State::Closed { at } => Some(due(at)),
            State::Opening { at, .. } => Some(due(at + OPEN_TIMEOUT)),
        });
        let deadlines = (!self.waiting.is_empty()).then_some(PICK_TICK);
        slots.chain(deadlines).min()
    }
}

impl Slot {
    fn back_off(&mut self) -> Duration {
        let wait = RETRY_FIRST
            .saturating_mul(1 << self.failures.min(8))
            .min(RETRY_MAX);
        self.failures = self.failures.saturating_add(1);
        wait
    }
}

#[cfg(test)]
mod tests;
