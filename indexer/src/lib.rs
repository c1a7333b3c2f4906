//! kvsteer indexer: KV events in, predicted-TTFT picks out.
//!
//! A request's path: [`grpc`] (proto) → [`prompt`] (domain types) →
//! [`picker`] (tokenize, bounded by [`encode`] → [`keys`] → [`index`]
//! lookup → [`scoring`]) → endpoints. Reports come back through [`report`]
//! into the [`ledger`] (one entry per request, from pick to its terminal
//! report); KV events
//! come in through [`streams`]; engine queues through [`scrape`]. Workers
//! are static ([`config`]) or discovered ([`discovery`]: Kubernetes pods),
//! and join and leave through the [`fleet`].
#![forbid(unsafe_code)]

pub mod admin;
pub mod app;
pub mod config;
pub mod discovery;
pub mod encode;
pub mod fleet;
pub mod grpc;
pub mod index;
pub mod keys;
pub mod ledger;
pub mod metrics;
pub mod picker;
pub mod prompt;
pub mod report;
pub mod routes;
pub mod scoring;
pub mod scrape;
pub mod streams;
pub mod tenancy;
pub mod workers;
