//! Live load against a real HTTP endpoint (Envoy with kvsteer, or a worker):
//! a streaming client that measures time to first token on the client side,
//! and the scripted multi-turn workload of `kvsteer-sim converse`.

pub mod client;
pub mod converse;
