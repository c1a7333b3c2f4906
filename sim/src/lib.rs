//! kvsteer-sim: a vLLM-compatible engine simulator.
//!
//! - [`engine`]: the core state machine (paged KV cache, prefix caching,
//!   continuous batching, KV events), driven step by step with explicit time.
//! - [`profile`]: how long a step takes.
//! - [`live`]: a streaming client and scripted workloads against real endpoints.
//!
//! The routing-policy benchmark is its own crate, `kvsteer-bench` (`bench/`).
//! - [`server`]: the `kvsteer-sim engine` HTTP + ZeroMQ server around the core.
#![forbid(unsafe_code)]

pub mod cli;
pub mod engine;
pub mod live;
pub mod profile;
pub mod server;
