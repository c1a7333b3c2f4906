//! kvsteer-sim: a vLLM-compatible engine simulator.
//!
//! - [`engine`]: the core state machine (paged KV cache, prefix caching,
//!   continuous batching, KV events), driven step by step with explicit time.
//! - [`profile`]: how long a step takes.
//! - [`bench`]: the routing-policy benchmark (virtual time and live).
//! - [`live`]: a streaming client and scripted workloads against real endpoints.
//! - [`server`]: the `kvsteer-sim engine` HTTP + ZeroMQ server around the core.
#![forbid(unsafe_code)]

pub mod bench;
pub mod cli;
pub mod engine;
pub mod live;
pub mod profile;
pub mod server;
