//! kvsteer indexer: KV events in, predicted-TTFT picks out.
//!
//! A request's path, one module per step: [`grpc`] (proto) → [`prompt`]
//! (domain types) → [`picker`], which runs the pick: [`tokenize`] (within
//! the model's limits) → [`keys`] (block keys) → [`index`] (lookup: where
//! the blocks are cached) → `picker::view` (what the pick sees of each
//! worker: load from the [`ledger`], the [`routes`] memories, the last
//! [`scrape`]) → [`scoring`] (the order; `scoring::kvsteer` is the
//! predicted-TTFT rule) → commit (the request's [`ledger`] entry, the
//! routes) → endpoints. Reports come back through [`picker::report`] and
//! close the ledger entry (one per request, from pick to its terminal
//! report) and calibrate. KV events come in through [`streams`]; workers
//! are static ([`config`]) or discovered ([`discovery`]: Kubernetes pods),
//! and join and leave through the [`fleet`].
#![forbid(unsafe_code)]

pub mod admin;
pub mod app;
pub mod config;
pub mod discovery;
pub mod fleet;
pub mod grpc;
pub mod index;
pub mod keys;
pub mod ledger;
pub mod metrics;
pub mod picker;
pub mod prompt;
pub mod routes;
pub mod scoring;
pub mod scrape;
pub mod streams;
pub mod tenancy;
pub mod tokenize;
pub mod workers;
