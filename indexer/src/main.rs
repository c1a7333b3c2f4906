//! `kvsteer-indexer`: `serve`, `check-config`, `tokenize`.
#![forbid(unsafe_code)]

use anyhow::{Context, bail};
use clap::{Parser, Subcommand, ValueEnum};
use kvsteer_indexer::{app, config::Config};
use kvsteer_tokenize::{ChatRequest, CompletionPrompt, PromptTokenizer};
use serde_json::{Value, json};
use std::path::PathBuf;
use std::time::Duration;

/// jemalloc rather than glibc's malloc (RELIABILITY.md, "the indexer's
/// memory"): glibc keeps a per-thread arena's high-water mark after a burst
/// (a burst of picks after a stall, a large prompt on a blocking thread),
/// so the indexer's RSS stepped up at every fault and never came back;
/// jemalloc returns freed pages to the system after `dirty_decay_ms`
/// (10 s), purged by its background thread even when the indexer is idle.
#[global_allocator]
static GLOBAL: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// How often the allocator's figures are logged (`debug` on
/// `kvsteer_indexer::alloc`).
const ALLOC_LOG_EVERY: Duration = Duration::from_secs(1);

#[derive(Parser)]
#[command(
    name = "kvsteer-indexer",
    version,
    about = "KV events in, predicted-TTFT picks out"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the service.
    Serve {
        #[arg(long)]
        config: PathBuf,
    },
    /// Validate a configuration and print it with every default filled in,
    /// then what its size limits mean for requests (as comments).
    CheckConfig {
        #[arg(long)]
        config: PathBuf,
    },
    /// Print the prompt token ids vLLM computes for an OpenAI request body.
    Tokenize {
        /// Folder with tokenizer.json and tokenizer_config.json.
        #[arg(long)]
        tokenizer: PathBuf,
        #[arg(long, value_enum)]
        endpoint: Endpoint,
        /// The request body (JSON).
        #[arg(long)]
        request: PathBuf,
    },
}

#[derive(Clone, Copy, ValueEnum)]
enum Endpoint {
    Chat,
    Completions,
    /// Anthropic `/v1/messages`, converted to chat as vLLM does.
    Messages,
}

fn main() -> std::process::ExitCode {
    match run(Cli::parse()) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Serve { config } => serve(config),
        Command::CheckConfig { config } => {
            let cfg = Config::load(&config).with_context(|| format!("{}", config.display()))?;
            print!("{}", cfg.to_yaml());
            for line in cfg.explain() {
                println!("# {line}");
            }
            Ok(())
        }
        Command::Tokenize {
            tokenizer,
            endpoint,
            request,
        } => tokenize(&tokenizer, endpoint, &request),
    }
}

fn serve(config: PathBuf) -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .init();
    let cfg = Config::load(&config).with_context(|| format!("{}", config.display()))?;
    if let Err(error) = tikv_jemalloc_ctl::background_thread::write(true) {
        tracing::warn!(%error, "no jemalloc background thread: freed memory returns only while allocating");
    }
    if tracing::enabled!(target: "kvsteer_indexer::alloc", tracing::Level::DEBUG) {
        std::thread::Builder::new()
            .name("alloc-stats".into())
            .spawn(log_allocator)
            .context("starting the allocator stats thread")?;
    }
    let rt = tokio::runtime::Runtime::new().context("tokio runtime")?;
    rt.block_on(app::serve(cfg, shutdown_signal()))?;
    Ok(())
}

/// What jemalloc holds, in bytes: `allocated` by the program, in `active`
/// pages, `resident` (what RSS sees of the heap), `retained` (unmapped
/// address space kept for reuse, not in RSS).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct AllocStats {
    allocated: usize,
    active: usize,
    resident: usize,
    retained: usize,
}

impl AllocStats {
    fn read() -> Result<Self, tikv_jemalloc_ctl::Error> {
        use tikv_jemalloc_ctl::{epoch, stats};
        epoch::advance()?;
        Ok(Self {
            allocated: stats::allocated::read()?,
            active: stats::active::read()?,
            resident: stats::resident::read()?,
            retained: stats::retained::read()?,
        })
    }
}

fn log_allocator() {
    loop {
        match AllocStats::read() {
            Ok(s) => tracing::debug!(
                target: "kvsteer_indexer::alloc",
                allocated = s.allocated,
                active = s.active,
                resident = s.resident,
                retained = s.retained,
                "allocator"
            ),
            Err(error) => {
                tracing::warn!(target: "kvsteer_indexer::alloc", %error, "cannot read allocator stats");
                return;
            }
        }
        std::thread::sleep(ALLOC_LOG_EVERY);
    }
}

async fn shutdown_signal() {
    let ctrl_c = async {
        if let Err(error) = tokio::signal::ctrl_c().await {
            tracing::error!(%error, "cannot listen for ctrl-c");
            std::future::pending::<()>().await;
        }
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(error) => {
                tracing::error!(%error, "cannot listen for SIGTERM");
                std::future::pending::<()>().await;
            }
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {}
        _ = term => {}
    }
}

fn tokenize(
    dir: &std::path::Path,
    endpoint: Endpoint,
    request: &std::path::Path,
) -> anyhow::Result<()> {
    let tok =
        PromptTokenizer::from_dir(dir).with_context(|| format!("tokenizer {}", dir.display()))?;
    let text = std::fs::read_to_string(request)
        .with_context(|| format!("cannot read {}", request.display()))?;
    let body: Value = serde_json::from_str(&text)
        .with_context(|| format!("{} is not JSON", request.display()))?;
    let ids = match endpoint {
        Endpoint::Chat => json!(tok.chat_token_ids(&ChatRequest::from_openai(&body)?)?),
        Endpoint::Messages => json!(tok.chat_token_ids(&ChatRequest::from_anthropic(&body)?)?),
        Endpoint::Completions => {
            let prompt = CompletionPrompt::from_openai(&body)?;
            let special = match body.get("add_special_tokens") {
                None | Some(Value::Null) => None,
                Some(Value::Bool(b)) => Some(*b),
                Some(_) => bail!("`add_special_tokens` must be a boolean"),
            };
            let mut batch = tok.completion_token_ids(&prompt, special)?;
            match prompt {
                CompletionPrompt::Texts(_) | CompletionPrompt::IdBatch(_) => json!(batch),
                _ => json!(batch.pop().unwrap_or_default()),
            }
        }
    };
    println!("{}", json!({ "token_ids": ids }));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// jemalloc is the global allocator: what the program allocates and
    /// frees shows in its stats, and its background thread can run.
    #[test]
    fn jemalloc_is_the_allocator() {
        let before = AllocStats::read().unwrap();
        let big: Vec<Vec<u8>> = (0..64).map(|i| vec![i as u8; 1 << 20]).collect();
        let held = AllocStats::read().unwrap();
        // Stats are per arena, small frees in thread caches apart: a margin.
        assert!(
            held.allocated >= before.allocated + (63 << 20),
            "{before:?} {held:?}"
        );
        assert!(held.resident >= held.active && held.active >= held.allocated);
        drop(big);
        let after = AllocStats::read().unwrap();
        assert!(
            after.allocated + (60 << 20) < held.allocated,
            "{held:?} {after:?}"
        );
        tikv_jemalloc_ctl::background_thread::write(true).unwrap();
        assert!(tikv_jemalloc_ctl::background_thread::read().unwrap());
    }
}
