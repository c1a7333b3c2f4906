//! vLLM's KV-cache event stream: the wire format and its ZeroMQ transport.
//!
//! - [`event`](crate::KvEvent): domain types (every field any vLLM version sent).
//! - [`decode_batch`] / [`encode_batch`]: the msgpack payload, map form (vLLM 0.24+)
//!   and array form (0.23 and earlier), byte-compatible with vLLM's msgspec encoder.
//! - `zmq` (feature `zmq`): the engine-side [`zmq::Publisher`] (PUB + replay ROUTER)
//!   and the indexer-side [`zmq::spawn_subscriber`] (SUB + replay DEALER, gap fill,
//!   restart detection).
#![forbid(unsafe_code)]

mod decode;
mod encode;
mod event;
mod wire;

#[cfg(feature = "zmq")]
pub mod zmq;

pub use decode::{DecodeError, DecodedBatch, SkipReason, SkippedEvent, decode_batch};
pub use encode::encode_batch;
pub use event::{BlockHash, BlockRemoved, BlockStored, Encoding, EventBatch, ExtraKey, KvEvent};
