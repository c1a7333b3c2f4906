//! `PickStream`: picks as messages on one long-lived stream, so a pick
//! costs no call set-up on either side.
//!
//! Each pick runs as its own task, as a unary call does, in a `JoinSet`
//! owned by the stream's driver:
//! - a cancel aborts its pick's task;
//! - the stream's end by reset or error, or its answers no longer read,
//!   aborts every pick still running;
//! - a half-close ends the inbound side only: the picks already sent are
//!   answered, then the stream ends;
//! - so does the indexer's shutdown, from its side: the stream ends with
//!   OK once its picks are answered, and the filter opens its next one
//!   (on another replica) rather than holding the server's drain.
//!
//! An aborted task is a dropped handler future: nothing is committed, the
//! pick is counted abandoned, as when a unary call is reset.

use super::{Deadline, RouterService};
use kvsteer_proto::v1::{self as pb, pick_stream_request::Kind};
use std::{collections::HashMap, time::Duration};
use tokio::{
    sync::{mpsc, watch},
    task::{self, AbortHandle, JoinSet},
};
use tokio_stream::{Stream, StreamExt, wrappers::ReceiverStream};
use tonic::Status;

/// Answers waiting for the filter to read them; a pick whose answer finds
/// the queue full waits (it is already committed).
const ANSWERS: usize = 256;

/// The answer side of a `PickStream`.
pub type Answers = ReceiverStream<Result<pb::PickResponse, Status>>;

/// Starts answering the picks of `inbound`.
pub(super) fn serve<S>(service: RouterService, inbound: S) -> Answers
where
    S: Stream<Item = Result<pb::PickStreamRequest, Status>> + Unpin + Send + 'static,
{
    let (tx, rx) = mpsc::channel(ANSWERS);
    tokio::spawn(drive(service, inbound, tx));
    ReceiverStream::new(rx)
}

/// One stream's picks in flight, by request id and by task.
#[derive(Default)]
struct Picks {
    tasks: JoinSet<()>,
    by_id: HashMap<String, AbortHandle>,
    by_task: HashMap<task::Id, String>,
}

async fn drive<S>(
    service: RouterService,
    mut inbound: S,
    tx: mpsc::Sender<Result<pb::PickResponse, Status>>,
) where
    S: Stream<Item = Result<pb::PickStreamRequest, Status>> + Unpin,
{
    let metrics = service.picker.metrics().clone();
    metrics.pick_streams.inc();
    let mut shutdown = service.shutdown.clone();
    let mut picks = Picks::default();
    // False once the filter half-closed: no more picks, answers still owed.
    let mut open = true;
    loop {
        tokio::select! {
            message = inbound.next(), if open => match message {
                Some(Ok(message)) => picks.on_message(&service, message, &tx),
                Some(Err(status)) => {
                    tracing::debug!(%status, "pick stream broken; its picks are abandoned");
                    break;
                }
                None => open = false,
            },
            Some(done) = picks.tasks.join_next_with_id(), if !picks.tasks.is_empty() => {
                picks.finished(done);
            }
            () = stopping(&mut shutdown), if open => {
                tracing::debug!("indexer shutting down: pick stream takes no more picks");
                open = false;
            }
            () = tx.closed() => {
                tracing::debug!("pick stream answers no longer read; its picks are abandoned");
                break;
            }
        }
        if !open && picks.tasks.is_empty() {
            break;
        }
    }
    // Dropping the set aborts whatever still runs.
    drop(picks);
    metrics.pick_streams.dec();
}

// === impl Picks ===

impl Picks {
    fn on_message(
        &mut self,
        service: &RouterService,
        message: pb::PickStreamRequest,
        tx: &mpsc::Sender<Result<pb::PickResponse, Status>>,
    ) {
        match message.kind {
            Some(Kind::Pick(pick)) => {
                let id = pick.request_id.clone();
                if id.is_empty() || self.by_id.contains_key(&id) {
                    // Its answer could not be told apart from another's.
                    tracing::warn!(request_id = %id, "stream pick without a unique request_id ignored");
                    return;
                }
                let deadline = (message.timeout_ms > 0)
                    .then(|| Deadline::after(Duration::from_millis(message.timeout_ms.into())));
                let (service, tx, task_id) = (service.clone(), tx.clone(), id.clone());
                let handle = self.tasks.spawn(async move {
                    match service.answer(pick, deadline).await {
                        Ok(mut answer) => {
                            answer.request_id = task_id;
                            // The stream may be gone by now; nothing waits then.
                            let _ = tx.send(Ok(answer)).await;
                        }
                        // Past its deadline: the filter has stopped waiting.
                        Err(status) => tracing::debug!(request_id = %task_id, %status, "stream pick unanswered"),
                    }
                });
                self.by_task.insert(handle.id(), id.clone());
                self.by_id.insert(id, handle);
            }
            Some(Kind::Cancel(id)) => {
                if let Some(handle) = self.by_id.remove(&id) {
                    self.by_task.remove(&handle.id());
                    handle.abort();
                }
            }
            None => tracing::debug!("empty pick stream message ignored"),
        }
    }

    /// A pick's task ended: answered, unanswered, aborted or panicked.
    fn finished(&mut self, done: Result<(task::Id, ()), task::JoinError>) {
        let task = match done {
            Ok((task, ())) => task,
            Err(error) => {
                if error.is_panic() {
                    tracing::error!(%error, "stream pick panicked");
                }
                error.id()
            }
        };
        if let Some(id) = self.by_task.remove(&task) {
            self.by_id.remove(&id);
        }
    }
}

/// Resolves once the indexer shuts down; never without a shutdown signal.
async fn stopping(shutdown: &mut Option<watch::Receiver<bool>>) {
    match shutdown {
        Some(rx) => {
            let _ = rx.wait_for(|stop| *stop).await;
        }
        None => std::future::pending().await,
    }
}
