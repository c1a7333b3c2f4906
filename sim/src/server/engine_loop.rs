//! The task that owns the engine: takes commands, steps the engine against
//! a scaled real clock, streams tokens to request handlers and publishes
//! each step's KV events as one batch.
//!
//! A step's tokens are handed out only once the step's simulated time has
//! passed, as vLLM's engine core returns a step's outputs after the model
//! ran: a first token therefore reaches the client a whole prefill after
//! arrival, which is what TTFT calibration downstream measures.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use kvsteer_kv_events::zmq::Publisher;
use tokio::sync::{mpsc, oneshot};

use super::metrics::EngineMetrics;
use crate::engine::{
    Engine, FinishReason, RejectReason, RequestId, ResetOutcome, SimRequest, Usage, to_event_batch,
};

/// Tokens buffered per request before the loop holds them back.
pub const STREAM_CAPACITY: usize = 64;
/// How often an idle loop retries sending held-back deltas.
const BACKLOG_RETRY: Duration = Duration::from_millis(5);
/// Pending commands before handlers wait.
pub const COMMAND_CAPACITY: usize = 1024;

/// What a request handler receives: one generated token, with how the
/// request ended when it is the last one (the engine finishes a request only
/// in the step that samples its last token).
#[derive(Debug, Clone, PartialEq)]
pub struct Delta {
    pub token_id: u32,
    pub finish: Option<Finish>,
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Finish {
    pub reason: FinishReason,
    pub usage: Usage,
}

pub enum Command {
    Add {
        /// Arrival is stamped by the loop.
        req: SimRequest,
        stream: mpsc::Sender<Delta>,
        reply: oneshot::Sender<Result<(), RejectReason>>,
    },
    Reset {
        reset_running_requests: bool,
        reply: oneshot::Sender<ResetOutcome>,
    },
}

/// Simulated seconds since start: real time × `time_scale`.
#[derive(Debug, Clone, Copy)]
pub struct SimClock {
    start: Instant,
    time_scale: f64,
}

// === impl SimClock ===

impl SimClock {
    pub fn new(time_scale: f64) -> Self {
        Self {
            start: Instant::now(),
            time_scale,
        }
    }

    pub fn now(&self) -> f64 {
        self.start.elapsed().as_secs_f64() * self.time_scale
    }

    /// Real time a simulated duration takes.
    pub fn real(&self, sim_s: f64) -> Duration {
        Duration::from_secs_f64((sim_s / self.time_scale).clamp(0.0, 3600.0))
    }
}

pub struct EngineLoop {
    pub engine: Engine,
    pub clock: SimClock,
    pub publisher: Option<Arc<Publisher>>,
    pub metrics: EngineMetrics,
}

struct Stream {
    tx: mpsc::Sender<Delta>,
    /// Deltas the channel had no room for, sent first next time.
    backlog: VecDeque<Delta>,
}

// === impl EngineLoop ===

impl EngineLoop {
    pub async fn run(mut self, mut commands: mpsc::Receiver<Command>) {
        let mut streams: HashMap<RequestId, Stream> = HashMap::new();
        loop {
            // Idle: block until something arrives (or, while some stream
            // still has a backlog, until it may have room again).
            if !self.engine.has_work() {
                let backlog = streams.values().any(|s| !s.backlog.is_empty());
                tokio::select! {
                    cmd = commands.recv() => match cmd {
                        Some(cmd) => self.handle(cmd, &mut streams),
                        None => return,
                    },
                    _ = tokio::time::sleep(BACKLOG_RETRY), if backlog => {
                        self.flush_backlogs(&mut streams);
                        continue;
                    }
                }
            }
            while let Ok(cmd) = commands.try_recv() {
                self.handle(cmd, &mut streams);
            }
            let Some(out) = self.engine.step(self.clock.now()) else {
                continue;
            };
            // Events go out when the step is scheduled (vLLM's scheduler
            // publishes from `schedule()`); tokens only after it has run.
            if !out.events.is_empty() {
                self.publish(&out.events).await;
            }
            if out.duration_s > 0.0 {
                tokio::time::sleep(self.clock.real(out.duration_s)).await;
            } else {
                tokio::task::yield_now().await;
            }
            let finishes: HashMap<RequestId, Finish> = out
                .finished
                .iter()
                .map(|f| {
                    let finish = Finish {
                        reason: f.reason,
                        usage: f.usage,
                    };
                    (f.id, finish)
                })
                .collect();
            for f in &out.finished {
                self.metrics.observe_finished(f);
            }
            for t in &out.tokens {
                let delta = Delta {
                    token_id: t.token_id,
                    finish: finishes.get(&t.id).copied(),
                };
                self.deliver(&mut streams, t.id, delta);
            }
            self.flush_backlogs(&mut streams);
            self.metrics.observe_stats(&self.engine.stats());
        }
    }

    fn handle(&mut self, cmd: Command, streams: &mut HashMap<RequestId, Stream>) {
        match cmd {
            Command::Add {
                mut req,
                stream,
                reply,
            } => {
                req.arrival = self.clock.now();
                let id = req.id;
                let result = self.engine.add_request(req);
                if result.is_ok() {
                    streams.insert(
                        id,
                        Stream {
                            tx: stream,
                            backlog: VecDeque::new(),
                        },
                    );
                }
                let _ = reply.send(result);
            }
            Command::Reset {
                reset_running_requests,
                reply,
            } => {
                let outcome = self.engine.reset_prefix_cache(reset_running_requests);
                let _ = reply.send(outcome);
            }
        }
    }

    async fn publish(&self, events: &[crate::engine::CacheEvent]) {
        let Some(publisher) = &self.publisher else {
            return;
        };
        let ts = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_secs_f64())
            .unwrap_or(0.0);
        let batch = to_event_batch(events, self.engine.config().block_size, ts);
        if let Err(error) = publisher.publish(&batch).await {
            tracing::warn!(%error, events = events.len(), "publishing KV events failed");
        }
    }

    /// Sends without waiting; a full channel keeps the delta in the backlog,
    /// a closed one (client gone) aborts the request.
    fn deliver(&mut self, streams: &mut HashMap<RequestId, Stream>, id: RequestId, delta: Delta) {
        let Some(stream) = streams.get_mut(&id) else {
            return;
        };
        let finished = delta.finish.is_some();
        stream.backlog.push_back(delta);
        match drain(stream) {
            Drained::Closed => {
                streams.remove(&id);
                if self.engine.abort(id) {
                    tracing::debug!(request_id = id, "client gone, request aborted");
                }
            }
            Drained::Empty if finished => {
                streams.remove(&id);
            }
            _ => {}
        }
    }

    fn flush_backlogs(&mut self, streams: &mut HashMap<RequestId, Stream>) {
        let mut gone = Vec::new();
        streams.retain(|&id, s| {
            if s.backlog.is_empty() {
                return true;
            }
            let done = s.backlog.back().is_some_and(|d| d.finish.is_some());
            match drain(s) {
                Drained::Closed => {
                    gone.push(id);
                    false
                }
                Drained::Empty => !done,
                Drained::Full => true,
            }
        });
        for id in gone {
            self.engine.abort(id);
        }
    }
}

enum Drained {
    Empty,
    Full,
    Closed,
}

fn drain(stream: &mut Stream) -> Drained {
    while let Some(delta) = stream.backlog.pop_front() {
        match stream.tx.try_send(delta) {
            Ok(()) => {}
            Err(mpsc::error::TrySendError::Full(delta)) => {
                stream.backlog.push_front(delta);
                return Drained::Full;
            }
            Err(mpsc::error::TrySendError::Closed(_)) => return Drained::Closed,
        }
    }
    Drained::Empty
}
