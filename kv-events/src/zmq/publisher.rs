//! Engine side: a PUB socket for live batches and a ROUTER answering replay
//! requests from a ring of the last `replay_buffer_batches` payloads.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex as StdMutex, PoisonError};

use bytes::Bytes;
use tokio::sync::{Mutex, oneshot};
use tokio::task::JoinHandle;
use zeromq::prelude::*;
use zeromq::{PubSocket, RouterSocket, ZmqMessage};

use super::TransportError;
use super::frames::{END_MARKER_SEQ, parse_start_seq, seq_frame};
use crate::{Encoding, EventBatch, encode_batch};

pub const DEFAULT_PUB_ENDPOINT: &str = "tcp://127.0.0.1:5557";
pub const DEFAULT_REPLAY_BUFFER_BATCHES: usize = 10_000;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PublisherConfig {
    /// Bound PUB endpoint; `tcp://host:0` picks a free port, `*` means all interfaces.
    pub pub_endpoint: String,
    /// Bound ROUTER endpoint for replay requests; `None` disables replay.
    pub replay_endpoint: Option<String>,
    /// Frame 0 of every live message (vLLM's default is `""`).
    pub topic: String,
    pub encoding: Encoding,
    /// Batches kept for replay (vLLM's `buffer_steps`).
    pub replay_buffer_batches: usize,
}

impl Default for PublisherConfig {
    fn default() -> Self {
        Self {
            pub_endpoint: DEFAULT_PUB_ENDPOINT.to_owned(),
            replay_endpoint: None,
            topic: String::new(),
            encoding: Encoding::Map,
            replay_buffer_batches: DEFAULT_REPLAY_BUFFER_BATCHES,
        }
    }
}

/// The last N payloads by seq, shared with the replay task.
#[derive(Debug)]
struct Ring {
    cap: usize,
    entries: VecDeque<(u64, Bytes)>,
}

struct Live {
    /// `None` only after [`Publisher::shutdown`].
    socket: Option<PubSocket>,
    next_seq: u64,
}

pub struct Publisher {
    live: Mutex<Live>,
    ring: Arc<StdMutex<Ring>>,
    topic: Bytes,
    encoding: Encoding,
    endpoints: (String, Option<String>),
    replay: Option<(oneshot::Sender<()>, JoinHandle<()>)>,
}

// === impl Publisher ===

impl Publisher {
    pub async fn bind(cfg: PublisherConfig) -> Result<Publisher, TransportError> {
        let mut socket = PubSocket::new();
        let pub_ep = bind(&mut socket, &cfg.pub_endpoint).await?;
        let ring = Arc::new(StdMutex::new(Ring {
            cap: cfg.replay_buffer_batches,
            entries: VecDeque::with_capacity(cfg.replay_buffer_batches.min(1024)),
        }));
        let topic = Bytes::from(cfg.topic.clone().into_bytes());

        let mut replay = None;
        let mut replay_ep = None;
        if let Some(endpoint) = &cfg.replay_endpoint {
            let mut router = RouterSocket::new();
            replay_ep = Some(bind(&mut router, endpoint).await?);
            let (stop_tx, stop_rx) = oneshot::channel();
            let task = tokio::spawn(serve_replay(router, ring.clone(), topic.clone(), stop_rx));
            replay = Some((stop_tx, task));
        }
        tracing::info!(pub_endpoint = %pub_ep, replay_endpoint = ?replay_ep, topic = %cfg.topic, "kv event publisher bound");
        Ok(Publisher {
            live: Mutex::new(Live {
                socket: Some(socket),
                next_seq: 0,
            }),
            ring,
            topic,
            encoding: cfg.encoding,
            endpoints: (pub_ep, replay_ep),
            replay,
        })
    }

    /// Encodes `batch`, assigns the next seq, sends it and keeps it for replay.
    pub async fn publish(&self, batch: &EventBatch) -> Result<u64, TransportError> {
        self.publish_payload(encode_batch(batch, self.encoding).into())
            .await
    }

    /// Like [`Publisher::publish`] for an already encoded payload.
    pub async fn publish_payload(&self, payload: Bytes) -> Result<u64, TransportError> {
        let mut live = self.live.lock().await;
        let seq = self.assign(&mut live, payload.clone());
        let msg = message([self.topic.clone(), seq_frame(seq), payload]);
        let Some(socket) = live.socket.as_mut() else {
            return Err(TransportError::Closed);
        };
        socket
            .send(msg)
            .await
            .map_err(|source| TransportError::Send {
                endpoint: self.endpoints.0.clone(),
                source,
            })?;
        Ok(seq)
    }

    /// Test hook: assigns a seq and buffers the batch for replay **without**
    /// sending it, as if the PUB message had been lost on the way.
    pub async fn publish_unsent(&self, batch: &EventBatch) -> u64 {
        let payload = encode_batch(batch, self.encoding).into();
        let mut live = self.live.lock().await;
        self.assign(&mut live, payload)
    }

    fn assign(&self, live: &mut Live, payload: Bytes) -> u64 {
        let seq = live.next_seq;
        live.next_seq += 1;
        let mut ring = self.ring.lock().unwrap_or_else(PoisonError::into_inner);
        if ring.cap > 0 {
            if ring.entries.len() == ring.cap {
                ring.entries.pop_front();
            }
            ring.entries.push_back((seq, payload));
        }
        seq
    }

    /// The bound endpoints `(pub, replay)` with resolved ports.
    pub fn local_endpoints(&self) -> (String, Option<String>) {
        self.endpoints.clone()
    }

    /// Stops the replay task and closes both sockets, waiting until the
    /// ports are released (so a new publisher can bind them at once).
    pub async fn shutdown(mut self) {
        if let Some((stop, task)) = self.replay.take() {
            let _ = stop.send(());
            let _ = task.await;
        }
        if let Some(socket) = self.live.get_mut().socket.take() {
            for e in socket.close().await {
                tracing::debug!(error = %e, "closing PUB socket");
            }
        }
    }
}

impl Drop for Publisher {
    fn drop(&mut self) {
        if let Some((stop, _task)) = self.replay.take() {
            // The task closes the ROUTER when it sees the stop signal.
            let _ = stop.send(());
        }
    }
}

async fn bind<S: Socket>(socket: &mut S, endpoint: &str) -> Result<String, TransportError> {
    let target = endpoint.replacen("://*:", "://0.0.0.0:", 1);
    socket
        .bind(&target)
        .await
        .map(|ep| ep.to_string())
        .map_err(|source| TransportError::Bind {
            endpoint: endpoint.to_owned(),
            source,
        })
}

/// A multi-frame message from `N >= 1` frames.
fn message<const N: usize>(frames: [Bytes; N]) -> ZmqMessage {
    let mut frames = frames.into_iter();
    let mut msg = ZmqMessage::from(frames.next().unwrap_or_default());
    frames.for_each(|f| msg.push_back(f));
    msg
}

// === replay server ===

async fn serve_replay(
    mut router: RouterSocket,
    ring: Arc<StdMutex<Ring>>,
    topic: Bytes,
    mut stop: oneshot::Receiver<()>,
) {
    loop {
        let msg = tokio::select! {
            biased;
            _ = &mut stop => break,
            msg = router.recv() => msg,
        };
        let frames = match msg {
            Ok(m) => m.into_vec(),
            Err(e) => {
                tracing::warn!(error = %e, "replay ROUTER receive failed");
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                continue;
            }
        };
        // [identity, empty delimiter, start seq]; anything else gets no reply.
        let [identity, delim, start] = match <[Bytes; 3]>::try_from(frames) {
            Ok(f) if f[1].is_empty() => f,
            Ok(f) => {
                tracing::warn!(frames = ?f, "invalid replay request: no empty delimiter");
                continue;
            }
            Err(f) => {
                tracing::warn!(n_frames = f.len(), "invalid replay request");
                continue;
            }
        };
        let start = parse_start_seq(&start);
        let batches: Vec<(u64, Bytes)> = {
            let ring = ring.lock().unwrap_or_else(PoisonError::into_inner);
            ring.entries
                .iter()
                .filter(|(seq, _)| *seq >= start)
                .cloned()
                .collect()
        };
        tracing::debug!(start_seq = start, n = batches.len(), "serving replay");
        let mut sent = Ok(());
        for (seq, payload) in batches {
            let frames = vec![
                identity.clone(),
                delim.clone(),
                topic.clone(),
                seq_frame(seq),
                payload,
            ];
            sent = router
                .send(ZmqMessage::try_from(frames).expect("frames"))
                .await;
            if sent.is_err() {
                break;
            }
        }
        if sent.is_ok() {
            let end = vec![
                identity,
                Bytes::new(),
                Bytes::new(),
                Bytes::from_static(&END_MARKER_SEQ),
                Bytes::new(),
            ];
            sent = router
                .send(ZmqMessage::try_from(end).expect("frames"))
                .await;
        }
        if let Err(e) = sent {
            tracing::warn!(error = %e, start_seq = start, "replay reply failed");
        }
    }
    for e in router.close().await {
        tracing::debug!(error = %e, "closing replay ROUTER");
    }
}
