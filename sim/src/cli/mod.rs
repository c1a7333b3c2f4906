//! Command-line interface of the `kvsteer-sim` binary: one module per
//! subcommand.

pub mod engine;
