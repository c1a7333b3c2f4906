//! ZeroMQ transport for the event stream, compatible with vLLM's
//! `ZmqEventPublisher`:
//!
//! - live PUB messages `[topic, seq (u64 BE), payload]`, seq from 0, +1 per batch;
//! - replay over ROUTER/DEALER: request `[b"", start_seq (u64 BE)]`, reply one
//!   `[b"", topic, seq, payload]` per buffered batch with `seq >= start`, then
//!   the end marker `[b"", b"", 0xffffffffffffffff, b""]`.
//!
//! [`Publisher`] is the engine side (used by the simulator);
//! [`spawn_subscriber`] is the indexer side (dedup, gap fill, restart detection).

mod frames;
mod publisher;
mod replay_client;
mod sequencer;
mod subscriber;

pub use publisher::{
    DEFAULT_PUB_ENDPOINT, DEFAULT_REPLAY_BUFFER_BATCHES, Publisher, PublisherConfig,
};
pub use replay_client::{ReplayError, ReplayStream, ReplayedBatch, fetch_replay};
pub use subscriber::{
    CONNECT_TIMEOUT, REPLAY_TIMEOUT, StreamItem, SubscriberConfig, spawn_probed_subscriber,
    spawn_subscriber,
};

/// Errors of the ZeroMQ publisher.
#[derive(Debug, thiserror::Error)]
pub enum TransportError {
    #[error("bind {endpoint}: {source}")]
    Bind {
        endpoint: String,
        #[source]
        source: zeromq::ZmqError,
    },
    #[error("send on {endpoint}: {source}")]
    Send {
        endpoint: String,
        #[source]
        source: zeromq::ZmqError,
    },
    #[error("publisher is shut down")]
    Closed,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn send_sync<T: Send + Sync>() {}

    #[test]
    fn shareable_across_tasks() {
        send_sync::<Publisher>();
        send_sync::<StreamItem>();
        send_sync::<TransportError>();
    }
}
