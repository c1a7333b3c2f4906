//! kvsteer's proxy-wasm HTTP filter for Envoy.
//!
//! A request's way through the filter, module by module:
//! [`admission`] (headers: strip, buffer or pass; does the body look like
//! JSON) → [`openai`] (body → `PickRequest`, keyed by a [`pick_id`] of the
//! filter's own) → the indexer's pick over gRPC, a message on the Envoy
//! worker's long-lived stream ([`pick_stream`]) or a unary `Pick` call → [`pick`] (answer →
//! destination header, new body or local reply) → Envoy's override_host load
//! balancer → the worker → [`first_output`] (the stream's first generated
//! output), [`usage`] and [`report`] (first token, done or cancelled) →
//! [`outbox`] → back to the indexer from the root context. Whatever goes
//! wrong, the request goes on untouched to Envoy's fallback load balancing
//! and a [`metrics`] counter says why.
//!
//! Everything but `host/` is plain Rust tested on the host target; `host/` is
//! the thin glue to the proxy-wasm ABI and never panics on its own account.
#![forbid(unsafe_code)]

pub mod admission;
pub mod config;
pub mod first_output;
pub mod grpc_target;
mod host;
pub mod metrics;
pub mod openai;
pub mod outbox;
pub mod pick;
pub mod pick_id;
pub mod pick_stream;
pub mod report;
pub mod retry;
pub mod usage;

proxy_wasm::main! {{
    proxy_wasm::set_log_level(proxy_wasm::types::LogLevel::Info);
    proxy_wasm::set_root_context(|context_id| Box::new(host::root::KvsteerRoot::new(context_id)));
}}
