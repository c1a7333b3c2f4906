//! kvsteer-sim: a vLLM-compatible engine simulator.
//!
//! - [`engine`]: the core state machine (paged KV cache, prefix caching,
//!   continuous batching, KV events), driven step by step with explicit time.
//! - [`profile`]: how long a step takes.
//! - [`live`]: a streaming client and scripted workloads against real endpoints.
//! - [`server`]: the `kvsteer-sim engine` HTTP + ZeroMQ server around the core.
//!
//! The routing-policy benchmark is its own crate, `kvsteer-bench` (`bench/`).
#![forbid(unsafe_code)]

pub mod cli;
pub mod engine;
pub mod live;
pub mod profile;
pub mod server;

/// Logs to stderr at `RUST_LOG`'s levels (default `info`): the binaries'
/// (`kvsteer-sim`, `kvsteer-bench`) one setup.
pub fn init_tracing() {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .init();
}
