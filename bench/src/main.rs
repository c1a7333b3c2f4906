//! `kvsteer-bench`: routing policies compared on the same arrivals, in
//! virtual time (default; deterministic for a seed) or live through real
//! routers (`--live`); `kvsteer-bench overhead` measures the latency a
//! router adds over a direct request. Results: `sim/BENCHMARKS.md`.
#![forbid(unsafe_code)]

use clap::{Parser, Subcommand};
use kvsteer_bench::BenchArgs;
use kvsteer_bench::live::overhead::{self, OverheadArgs};

#[derive(Parser)]
#[command(
    name = "kvsteer-bench",
    version,
    about = "Routing policies compared on the same arrivals",
    args_conflicts_with_subcommands = true
)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
    #[command(flatten)]
    bench: BenchArgs,
}

#[derive(Subcommand)]
enum Command {
    /// Measure the latency a router (Envoy with kvsteer, a peer router) adds
    /// over the same request sent straight to a worker, side by side.
    Overhead(OverheadArgs),
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    kvsteer_sim::init_tracing();
    let cli = Cli::parse();
    match cli.command {
        Some(Command::Overhead(args)) => overhead::run(&args).await,
        None => kvsteer_bench::cli::run(&cli.bench).await,
    }
}
