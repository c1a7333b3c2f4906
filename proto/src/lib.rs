//! The gRPC contract between the kvsteer filter and the indexer
//! (`kvsteer/v1/router.proto`).
//!
//! The Rust code is generated and checked in under `src/gen/`, so building needs
//! no `protoc`. `tests/bootstrap.rs` regenerates it and fails on any difference:
//! after editing the `.proto`, run `KVSTEER_BLESS=1 cargo test -p kvsteer-proto`.
//!
//! With the default `grpc` feature the tonic client and server come along; the
//! wasm filter turns it off and gets the prost messages alone.
#![forbid(unsafe_code)]

#[cfg(feature = "grpc")]
#[allow(clippy::all, clippy::pedantic)]
mod generated {
    include!("gen/grpc/kvsteer.v1.rs");
}

#[cfg(not(feature = "grpc"))]
#[allow(clippy::all, clippy::pedantic)]
mod generated {
    include!("gen/messages/kvsteer.v1.rs");
}

/// Version 1 of the contract.
pub mod v1 {
    pub use crate::generated::*;
}

/// Full gRPC method paths, for clients that call by name (the wasm filter).
pub mod paths {
    pub const SERVICE: &str = "kvsteer.v1.Router";
    pub const PICK: &str = "Pick";
    pub const PICK_STREAM: &str = "PickStream";
    pub const REPORT: &str = "Report";
}
