//! Support for every crate's tests: where the shared test data is
//! ([`shared_dir`]), polling with a deadline ([`wait_until`]), finding
//! Envoy and the binaries ([`Paths`]); and for kvsteer's end-to-end tests: real `envoy`, `kvsteer-indexer` and
//! `kvsteer-sim engine` processes on loopback, in the local layout that
//! `envoy/local/` describes (Envoy on 127.0.0.1:8080, indexer gRPC on :9090,
//! admin on :9091, workers on :8001..:8003).
//!
//! Because that layout uses fixed ports, tests that start a [`Cluster`] hold
//! [`serial`] for their whole run.
#![forbid(unsafe_code)]

mod cluster;
mod http;
pub mod manifests;
mod paths;
mod process;
mod recorder;

pub use cluster::{Cluster, ClusterOptions, MODEL, SimOptions, metric_sum, workers_of};
pub use http::{ChatReply, chat_body, send_chat, send_raw};
pub use paths::{Paths, repo_root, shared_dir};
pub use process::{Proc, spawn_envoy, wait_http_ok, wait_until};
pub use recorder::{Recorder, Recording};

/// Serialises tests that use the fixed local ports.
pub async fn serial() -> tokio::sync::MutexGuard<'static, ()> {
    static LOCK: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
    LOCK.lock().await
}
