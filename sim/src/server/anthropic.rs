//! Anthropic `/v1/messages` responses, shaped like vLLM 0.32's
//! (`vllm/entrypoints/anthropic/serving.py`): the request is generated as
//! the chat request it converts to, and the chat output is re-shaped.
//!
//! Stream: `message_start` (usage of the prompt, no output yet), then per
//! text run a `content_block_start` (empty text block), one
//! `content_block_delta` (`text_delta`) per non-empty token text, a
//! `content_block_stop`, then `message_delta` (stop reason and the final
//! usage) and `message_stop`. Usage follows vLLM's `_build_anthropic_usage`:
//! `input_tokens` is the prompt minus its cached tokens, which are
//! `cache_read_input_tokens` (the simulator always reports cached tokens,
//! as vLLM does with `--enable-prompt-tokens-details`).

use axum::body::Bytes;
use axum::response::{IntoResponse, Response};
use bytes::BytesMut;
use serde_json::{Value, json};
use tokio::sync::mpsc;

use super::engine_loop::{Delta, Finish, STREAM_CAPACITY};
use super::error::ApiError;
use super::generate::{sse_response, text_of};
use super::openai::ResponseMeta;
use super::routes::Shared;
use crate::engine::{FinishReason, Usage};

/// Anthropic's `usage` object for an engine usage.
pub fn usage_json(u: &Usage) -> Value {
    json!({
        "input_tokens": u.prompt_tokens.saturating_sub(u.cached_tokens),
        "output_tokens": u.completion_tokens,
        "cache_read_input_tokens": u.cached_tokens,
    })
}

fn stop_reason(reason: FinishReason) -> &'static str {
    match reason {
        FinishReason::Stop => "end_turn",
        FinishReason::Length => "max_tokens",
    }
}

/// One SSE event with its `event:` line, as vLLM's `wrap_data_with_event`.
pub fn event(kind: &str, data: &Value) -> Bytes {
    Bytes::from(format!("event: {kind}\ndata: {data}\n\n"))
}

/// The whole (non-streamed) message.
pub fn full(meta: &ResponseMeta, text: &str, reason: FinishReason, usage: &Usage) -> Value {
    let content = if text.is_empty() {
        json!([])
    } else {
        json!([{"type": "text", "text": text}])
    };
    json!({
        "id": meta.id,
        "type": "message",
        "role": "assistant",
        "content": content,
        "model": meta.model,
        "stop_reason": stop_reason(reason),
        "stop_sequence": null,
        "usage": usage_json(usage),
    })
}

/// The `message_start` event: vLLM builds it from the first chat chunk,
/// which carries the prompt size and no output yet (the cached share is only
/// known, and reported, in `message_delta`).
pub fn message_start(meta: &ResponseMeta, prompt_tokens: usize) -> Value {
    json!({
        "type": "message_start",
        "message": {
            "id": meta.id,
            "type": "message",
            "role": "assistant",
            "content": [],
            "model": meta.model,
            "stop_reason": null,
            "stop_sequence": null,
            "usage": {"input_tokens": prompt_tokens, "output_tokens": 0},
        }
    })
}

/// A vLLM-style Anthropic error body.
pub fn error_response(e: ApiError) -> Response {
    let kind = match e.status.as_u16() {
        400 => "invalid_request_error",
        404 => "not_found_error",
        503 => "overloaded_error",
        _ => "api_error",
    };
    let body = json!({"type": "error", "error": {"type": kind, "message": e.message}});
    (e.status, axum::Json(body)).into_response()
}

pub(crate) async fn collect_response(
    state: Shared,
    meta: ResponseMeta,
    mut rx: mpsc::Receiver<Delta>,
) -> Result<Response, ApiError> {
    let mut text = String::new();
    while let Some(delta) = rx.recv().await {
        text.push_str(text_of(&state, delta.token_id));
        if let Some(Finish { reason, usage }) = delta.finish {
            return Ok(axum::Json(full(&meta, &text, reason, &usage)).into_response());
        }
    }
    Err(ApiError::unavailable(
        "the request was dropped by the engine",
    ))
}

/// Events of one step's token: `message_start` before the first, a text
/// block opened on the first non-empty text, the delta, and after the last
/// token the block's stop, `message_delta` and `message_stop`.
pub struct StreamState {
    prompt_tokens: usize,
    started: bool,
    block_open: bool,
}

impl StreamState {
    pub fn new(prompt_tokens: usize) -> Self {
        Self {
            prompt_tokens,
            started: false,
            block_open: false,
        }
    }

    pub fn events(&mut self, meta: &ResponseMeta, delta: &Delta, text: &str) -> BytesMut {
        let mut frame = BytesMut::new();
        if !self.started {
            self.started = true;
            let start = message_start(meta, self.prompt_tokens);
            frame.extend_from_slice(&event("message_start", &start));
        }
        if !text.is_empty() {
            if !self.block_open {
                self.block_open = true;
                let start = json!({"type": "content_block_start", "index": 0,
                    "content_block": {"type": "text", "text": ""}});
                frame.extend_from_slice(&event("content_block_start", &start));
            }
            let data = json!({"type": "content_block_delta", "index": 0,
                "delta": {"type": "text_delta", "text": text}});
            frame.extend_from_slice(&event("content_block_delta", &data));
        }
        if let Some(Finish { reason, usage }) = delta.finish {
            if self.block_open {
                let stop = json!({"type": "content_block_stop", "index": 0});
                frame.extend_from_slice(&event("content_block_stop", &stop));
            }
            let data = json!({"type": "message_delta",
                "delta": {"stop_reason": stop_reason(reason), "stop_sequence": null},
                "usage": usage_json(&usage)});
            frame.extend_from_slice(&event("message_delta", &data));
            frame.extend_from_slice(&event("message_stop", &json!({"type": "message_stop"})));
        }
        frame
    }
}

pub(crate) fn stream_response(
    state: Shared,
    meta: ResponseMeta,
    prompt_tokens: usize,
    mut rx: mpsc::Receiver<Delta>,
) -> Response {
    let (tx, body_rx) = mpsc::channel::<Result<Bytes, std::convert::Infallible>>(STREAM_CAPACITY);
    tokio::spawn(async move {
        let mut stream = StreamState::new(prompt_tokens);
        while let Some(delta) = rx.recv().await {
            let frame = stream.events(&meta, &delta, text_of(&state, delta.token_id));
            let done = delta.finish.is_some();
            if tx.send(Ok(frame.freeze())).await.is_err() || done {
                return;
            }
        }
    });
    sse_response(body_rx)
}

#[cfg(test)]
mod tests;
