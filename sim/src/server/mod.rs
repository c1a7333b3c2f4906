//! `kvsteer-sim engine`: the core behind vLLM's HTTP surface, on a real
//! clock scaled by `time_scale`, publishing KV events over ZeroMQ.
//!
//! Request path: handler (`routes`) → tokenize → `Command::Add` → the engine
//! loop (`engine_loop`) steps the core, publishes the step's events and
//! streams tokens back over a bounded channel → SSE or JSON (`openai`).

mod anthropic;
mod engine_loop;
mod error;
mod generate;
mod metrics;
mod openai;
mod render;
mod routes;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use kvsteer_kv_events::zmq::{Publisher, PublisherConfig};
use kvsteer_tokenize::PromptTokenizer;
use prometheus_client::registry::Registry;
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;

pub use engine_loop::{COMMAND_CAPACITY, STREAM_CAPACITY};
pub use error::ApiError;
pub use metrics::EngineMetrics;

use crate::engine::{ConfigError, Engine, EngineConfig};
use engine_loop::{EngineLoop, SimClock};

/// Text the filler tokens are cut from (deterministic output).
pub const FILLER_TEXT: &str = "The quick brown fox jumps over the lazy dog while the simulated engine keeps \
     writing plain filler words so that every response stays deterministic, readable and cheap to produce.";

#[derive(Debug, Clone)]
pub struct ServerConfig {
    pub listen: SocketAddr,
    pub served_model_name: String,
    pub tokenizer_dir: PathBuf,
    /// `None`: events are computed but not published.
    pub kv_events: Option<PublisherConfig>,
    pub engine: EngineConfig,
    /// Simulated time runs this many times faster than real time.
    pub time_scale: f64,
    pub worker_id: String,
    /// LoRA adapters served beside the base model (vLLM's `--lora-modules`),
    /// `lora_id` 1, 2, … in this order.
    pub lora_modules: Vec<LoraModule>,
}

/// One `--lora-modules name=path` entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoraModule {
    pub name: String,
    pub path: String,
}

impl std::str::FromStr for LoraModule {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s.split_once('=') {
            Some((name, path)) if !name.trim().is_empty() && !path.trim().is_empty() => Ok(Self {
                name: name.trim().to_owned(),
                path: path.trim().to_owned(),
            }),
            _ => Err(format!("{s:?}: expected name=path")),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    #[error("loading the tokenizer")]
    Tokenizer(#[from] kvsteer_tokenize::Error),
    #[error("invalid engine config")]
    Config(#[from] ConfigError),
    #[error("time_scale must be a positive finite number, got {0}")]
    TimeScale(f64),
    #[error("binding {addr}")]
    Bind {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("kv events publisher: {0}")]
    Publisher(String),
    #[error("background task failed: {0}")]
    Task(String),
}

/// A running server; dropping it leaves the tasks running until
/// [`ServerHandle::shutdown`].
pub struct ServerHandle {
    pub addr: SocketAddr,
    /// Bound `(pub, replay)` endpoints with resolved ports.
    pub kv_endpoints: Option<(String, Option<String>)>,
    stop: oneshot::Sender<()>,
    http: JoinHandle<std::io::Result<()>>,
    engine: JoinHandle<()>,
    publisher: Option<Arc<Publisher>>,
}

// === impl ServerHandle ===

impl ServerHandle {
    /// Binds everything and starts serving.
    pub async fn start(mut cfg: ServerConfig) -> Result<Self, ServerError> {
        if !(cfg.time_scale.is_finite() && cfg.time_scale > 0.0) {
            return Err(ServerError::TimeScale(cfg.time_scale));
        }
        let dir = cfg.tokenizer_dir.clone();
        let tokenizer = tokio::task::spawn_blocking(move || PromptTokenizer::from_dir(&dir))
            .await
            .map_err(|e| ServerError::Task(format!("tokenizer loading: {e}")))??;
        let tokenizer = Arc::new(tokenizer);
        if let Some(eos) = tokenizer.eos_token_id() {
            cfg.engine.eos_token_id = eos;
        }
        let filler = routes::filler_tokens(&tokenizer, cfg.engine.eos_token_id)?;
        cfg.engine.filler_token_ids = filler.iter().map(|(id, _)| *id).collect();
        let engine = Engine::new(cfg.engine.clone())?;

        let publisher = match &cfg.kv_events {
            Some(pc) => Some(Arc::new(
                Publisher::bind(pc.clone())
                    .await
                    .map_err(|e| ServerError::Publisher(e.to_string()))?,
            )),
            None => None,
        };
        let kv_endpoints = publisher.as_ref().map(|p| p.local_endpoints());

        let mut registry = Registry::default();
        let metrics = EngineMetrics::register(
            &mut registry,
            &cfg.served_model_name,
            cfg.engine.block_size,
            cfg.engine.num_gpu_blocks as usize,
        );
        let (tx, rx) = mpsc::channel(COMMAND_CAPACITY);
        let engine_task = tokio::spawn(
            EngineLoop {
                engine,
                clock: SimClock::new(cfg.time_scale),
                publisher: publisher.clone(),
                metrics,
            }
            .run(rx),
        );

        let state = routes::AppState::new(&cfg, tokenizer, tx, registry, filler);
        let app = routes::router(state);
        let listener = tokio::net::TcpListener::bind(cfg.listen)
            .await
            .map_err(|source| ServerError::Bind {
                addr: cfg.listen,
                source,
            })?;
        let addr = listener.local_addr().map_err(|source| ServerError::Bind {
            addr: cfg.listen,
            source,
        })?;
        let (stop, stopped) = oneshot::channel::<()>();
        let http = tokio::spawn(async move {
            axum::serve(listener, app)
                .with_graceful_shutdown(async {
                    let _ = stopped.await;
                })
                .await
        });
        tracing::info!(%addr, model = %cfg.served_model_name, worker_id = %cfg.worker_id, "kvsteer-sim engine serving");
        Ok(Self {
            addr,
            kv_endpoints,
            stop,
            http,
            engine: engine_task,
            publisher,
        })
    }

    /// Resolves when the HTTP server stops on its own (an I/O error).
    pub async fn wait(&mut self) -> std::io::Result<()> {
        match (&mut self.http).await {
            Ok(r) => r,
            Err(e) => Err(std::io::Error::other(e)),
        }
    }

    /// Stops accepting requests, stops the engine loop and closes the
    /// sockets.
    pub async fn shutdown(self) {
        let _ = self.stop.send(());
        self.engine.abort();
        let _ = self.engine.await;
        let _ = tokio::time::timeout(std::time::Duration::from_secs(5), self.http).await;
        if let Some(p) = self.publisher
            && let Ok(p) = Arc::try_unwrap(p)
        {
            p.shutdown().await;
        }
    }
}
