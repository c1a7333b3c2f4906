//! The router, shared state and the admin endpoints (models, health,
//! reset, tokenize, metrics); generation lives in `generate`.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::time::{SystemTime, UNIX_EPOCH};

use axum::Router;
use axum::body::Bytes;
use axum::extract::{Query, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use kvsteer_tokenize::PromptTokenizer;
use prometheus_client::registry::Registry;
use serde_json::{Value, json};
use tokio::sync::{mpsc, oneshot};

use super::ServerConfig;
use super::engine_loop::Command;
use super::error::ApiError;
use super::generate;
use super::openai::Api;
use crate::engine::{Lora, ResetOutcome};

pub(crate) struct AppState {
    pub(crate) model: String,
    pub(crate) worker_id: HeaderValue,
    pub(crate) max_model_len: usize,
    pub(crate) tokenizer: Arc<PromptTokenizer>,
    pub(crate) commands: mpsc::Sender<Command>,
    pub(crate) registry: Registry,
    /// Text of each filler token (EOS and unknown ids print nothing).
    pub(crate) token_text: HashMap<u32, String>,
    pub(crate) next_id: AtomicU64,
    pub(crate) created: u64,
    /// LoRA adapters served beside the base model, with their paths.
    pub(crate) loras: Vec<(Lora, String)>,
}

pub(crate) type Shared = Arc<AppState>;

// === impl AppState ===

impl AppState {
    pub(crate) fn new(
        cfg: &ServerConfig,
        tokenizer: Arc<PromptTokenizer>,
        commands: mpsc::Sender<Command>,
        registry: Registry,
        filler: Vec<(u32, String)>,
    ) -> Shared {
        let worker_id = HeaderValue::from_str(&cfg.worker_id)
            .unwrap_or_else(|_| HeaderValue::from_static("invalid"));
        Arc::new(Self {
            model: cfg.served_model_name.clone(),
            worker_id,
            max_model_len: cfg.engine.max_model_len,
            tokenizer,
            commands,
            registry,
            token_text: filler.into_iter().collect(),
            next_id: AtomicU64::new(0),
            created: unix_now(),
            loras: cfg
                .lora_modules
                .iter()
                .zip(1..)
                .map(|(m, id)| {
                    let lora = Lora {
                        id,
                        name: m.name.clone(),
                    };
                    (lora, m.path.clone())
                })
                .collect(),
        })
    }

    /// The request's adapter (`None`: the base model), or 404 for a model
    /// this engine does not serve.
    pub(crate) fn check_model(&self, model: Option<&str>) -> Result<Option<Lora>, ApiError> {
        match model {
            None => Ok(None),
            Some(m) if m == self.model => Ok(None),
            Some(m) => self
                .loras
                .iter()
                .find(|(l, _)| l.name == m)
                .map(|(l, _)| Some(l.clone()))
                .ok_or_else(|| ApiError::model_not_found(m)),
        }
    }

    pub(crate) async fn send(&self, cmd: Command) -> Result<(), ApiError> {
        self.commands
            .send(cmd)
            .await
            .map_err(|_| ApiError::unavailable("the engine loop has stopped"))
    }
}

pub(crate) fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// The filler tokens: [`super::FILLER_TEXT`] tokenized, with each token's text.
pub(crate) fn filler_tokens(
    tok: &PromptTokenizer,
    eos: u32,
) -> Result<Vec<(u32, String)>, kvsteer_tokenize::Error> {
    let ids = tok.encode(super::FILLER_TEXT, false)?;
    let mut out = Vec::with_capacity(ids.len());
    for id in ids.into_iter().filter(|&id| id != eos) {
        out.push((id, tok.decode(&[id])?));
    }
    if out.is_empty() {
        return Err(kvsteer_tokenize::Error::Encode(
            "the filler text encodes to no tokens".into(),
        ));
    }
    Ok(out)
}

/// The largest request body the server reads.
const MAX_BODY_BYTES: usize = 256 << 20;

pub(crate) fn router(state: Shared) -> Router {
    Router::new()
        .route("/v1/chat/completions", post(generate::chat))
        .route("/v1/completions", post(generate::completions))
        .route("/v1/messages", post(generate::messages))
        .route("/v1/models", get(models))
        .route("/health", get(health))
        .route("/reset_prefix_cache", post(reset_prefix_cache))
        .route("/tokenize", post(tokenize))
        .route(
            "/v1/chat/completions/render",
            post(super::render::render_chat),
        )
        .route("/metrics", get(metrics))
        .fallback(not_found)
        // vLLM reads bodies of any size and answers an over-long prompt with a
        // 400; axum's default 2 MB limit would cut the connection instead.
        .layer(axum::extract::DefaultBodyLimit::max(MAX_BODY_BYTES))
        .layer(axum::middleware::map_response_with_state(
            state.clone(),
            worker_header,
        ))
        .with_state(state)
}

async fn worker_header(State(state): State<Shared>, mut resp: Response) -> Response {
    resp.headers_mut()
        .insert("x-kvsteer-worker", state.worker_id.clone());
    resp
}

async fn not_found() -> ApiError {
    ApiError {
        status: StatusCode::NOT_FOUND,
        message: "Not Found".into(),
        param: None,
    }
}

pub(crate) fn parse_json(body: &Bytes) -> Result<Value, ApiError> {
    serde_json::from_slice(body)
        .map_err(|e| ApiError::bad_request(format!("JSON decode error: {e}")))
}

/// The base model, then one card per adapter with its `parent` (vLLM's
/// `show_available_models`).
async fn models(State(state): State<Shared>) -> Response {
    let mut data = vec![json!({
        "id": state.model,
        "object": "model",
        "created": state.created,
        "owned_by": "vllm",
        "root": state.model,
        "parent": null,
        "max_model_len": state.max_model_len,
        "permission": [],
    })];
    data.extend(state.loras.iter().map(|(l, path)| {
        json!({
            "id": l.name,
            "object": "model",
            "created": state.created,
            "owned_by": "vllm",
            "root": path,
            "parent": state.model,
            "max_model_len": null,
            "permission": [],
        })
    }));
    axum::Json(json!({"object": "list", "data": data})).into_response()
}

async fn health() -> StatusCode {
    StatusCode::OK
}

#[derive(Debug, serde::Deserialize)]
struct ResetQuery {
    #[serde(default)]
    reset_running_requests: bool,
}

/// vLLM answers 200 even when the engine refuses the reset (it only logs);
/// the `x-kvsteer-reset` header tells the outcome.
async fn reset_prefix_cache(
    State(state): State<Shared>,
    query: Result<Query<ResetQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Response, ApiError> {
    let reset_running_requests = query
        .map_err(|e| ApiError::bad_request(e.body_text()))?
        .reset_running_requests;
    let (reply, outcome) = oneshot::channel();
    state
        .send(Command::Reset {
            reset_running_requests,
            reply,
        })
        .await?;
    let outcome = outcome
        .await
        .map_err(|_| ApiError::unavailable("the engine loop has stopped"))?;
    let label = match outcome {
        ResetOutcome::Cleared => "cleared",
        ResetOutcome::BlocksInUse => {
            tracing::warn!("Failed to reset prefix cache because some blocks are not freed yet");
            "refused-blocks-in-use"
        }
    };
    Ok((StatusCode::OK, [("x-kvsteer-reset", label)]).into_response())
}

async fn tokenize(State(state): State<Shared>, body: Bytes) -> Result<Response, ApiError> {
    let body = parse_json(&body)?;
    let obj = body
        .as_object()
        .ok_or_else(|| ApiError::bad_request("request body must be a JSON object"))?;
    match obj.get("model") {
        None | Some(Value::Null) => {}
        Some(Value::String(m)) => {
            state.check_model(Some(m))?;
        }
        Some(_) => return Err(ApiError::bad_request("`model` must be a string")),
    }
    let api = if obj.contains_key("messages") {
        Api::Chat
    } else {
        Api::Completions
    };
    let tokens = generate::prompt_ids(&state, api, body).await?;
    Ok(axum::Json(json!({
        "count": tokens.len(),
        "max_model_len": state.max_model_len,
        "tokens": tokens,
        "token_strs": null,
    }))
    .into_response())
}

async fn metrics(State(state): State<Shared>) -> Result<Response, ApiError> {
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &state.registry)
        .map_err(|_| ApiError::unavailable("metrics encoding failed"))?;
    Ok((
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        text,
    )
        .into_response())
}
