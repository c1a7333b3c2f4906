//! `kvsteer-sim`: a vLLM-compatible engine simulator.
//!
//! Subcommands: `engine` (one simulated vLLM server), `converse` (a scripted
//! multi-turn workload against an endpoint). The routing-policy benchmark
//! is `kvsteer-bench` (crate `bench/`).
#![forbid(unsafe_code)]

use anyhow::Context;
use clap::{Parser, Subcommand};
use kvsteer_sim::cli::engine::EngineArgs;
use kvsteer_sim::live::converse::{self, ConverseArgs};
use kvsteer_sim::server::ServerHandle;

#[derive(Parser)]
#[command(
    name = "kvsteer-sim",
    version,
    about = "vLLM-compatible engine simulator"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Serve one simulated vLLM engine (OpenAI HTTP + ZeroMQ KV events).
    Engine(Box<EngineArgs>),
    /// Run a scripted multi-turn chat workload against an endpoint and print,
    /// per request, the worker that served it, cached tokens and TTFT.
    Converse(ConverseArgs),
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    kvsteer_sim::init_tracing();
    match Cli::parse().command {
        Command::Engine(args) => run_engine(*args).await,
        Command::Converse(args) => converse::run(&args).await.map(|_| ()),
    }
}

async fn run_engine(args: EngineArgs) -> anyhow::Result<()> {
    let cfg = args.server_config()?;
    let mut server = ServerHandle::start(cfg)
        .await
        .context("starting the engine server")?;
    tokio::select! {
        r = server.wait() => r.context("HTTP server")?,
        _ = tokio::signal::ctrl_c() => {
            tracing::info!("shutting down");
            server.shutdown().await;
        }
    }
    Ok(())
}
