//! `POST /v1/chat/completions/render`, vLLM's render API
//! (`vllm/entrypoints/serve/render/api_router.py`): the request's prompt
//! token ids, templated exactly as `/v1/chat/completions` would, as a
//! `GenerateRequest` (`vllm/entrypoints/serve/disagg/protocol.py`) without
//! generating anything. Routers (vLLM's `vllm-router` cache-aware policies)
//! call it to learn the prompt tokens before picking a worker.

use std::sync::atomic::Ordering;

use axum::body::Bytes;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use serde_json::json;

use super::error::ApiError;
use super::generate::prompt_ids;
use super::openai::{Api, SamplingParams};
use super::routes::{Shared, parse_json};

pub(crate) async fn render_chat(
    State(state): State<Shared>,
    body: Bytes,
) -> Result<Response, ApiError> {
    let body = parse_json(&body)?;
    let params = SamplingParams::from_body(Api::Chat, &body)?;
    state.check_model(params.model.as_deref())?;
    let tokens = prompt_ids(&state, Api::Chat, body).await?;
    let max_len = state.max_model_len;
    if tokens.len() > max_len {
        return Err(ApiError::bad_request(format!(
            "This model's maximum context length is {max_len} tokens. However, your request has {} input tokens. Please reduce the length of the input messages.",
            tokens.len()
        )));
    }
    // vLLM resolves an omitted max_tokens to what the context leaves.
    let max_tokens = params
        .max_tokens
        .unwrap_or(max_len.saturating_sub(tokens.len()));
    let seq = state.next_id.fetch_add(1, Ordering::Relaxed);
    Ok(axum::Json(json!({
        "request_id": format!("render-{seq:016x}"),
        "token_ids": tokens,
        "features": null,
        "sampling_params": {
            "max_tokens": max_tokens,
            "min_tokens": params.min_tokens,
            "ignore_eos": params.ignore_eos,
        },
        "model": params.model,
        "stream": params.stream,
        "stream_options": null,
        "cache_salt": params.cache_salt,
        "priority": 0,
        "kv_transfer_params": null,
    }))
    .into_response())
}
