//! `kvsteer-indexer`: `serve`, `check-config`, `tokenize`.
#![forbid(unsafe_code)]

use anyhow::{Context, bail};
use clap::{Parser, Subcommand, ValueEnum};
use kvsteer_indexer::{app, config::Config};
use kvsteer_tokenize::{ChatRequest, CompletionPrompt, PromptTokenizer};
use serde_json::{Value, json};
use std::path::PathBuf;

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
    let rt = tokio::runtime::Runtime::new().context("tokio runtime")?;
    rt.block_on(app::serve(cfg, shutdown_signal()))?;
    Ok(())
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
