//! The generation path: body → sampling params → prompt ids → engine loop
//! → a JSON response or a vLLM-shaped SSE stream.

use std::sync::atomic::Ordering;

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::header;
use axum::response::{IntoResponse, Response};
use bytes::BytesMut;
use kvsteer_tokenize::{ChatRequest, CompletionPrompt};
use serde_json::Value;
use tokio::sync::{mpsc, oneshot};

use super::anthropic;
use super::engine_loop::{Command, Delta, Finish, STREAM_CAPACITY};
use super::error::ApiError;
use super::openai::{Api, ResponseMeta, SSE_DONE, SamplingParams, sse_data, with_token_ids};
use super::routes::{Shared, parse_json, unix_now};
use crate::engine::SimRequest;

fn tokenize_error(e: kvsteer_tokenize::Error) -> ApiError {
    match e {
        kvsteer_tokenize::Error::InvalidRequest(m) => ApiError::bad_request(m),
        other => ApiError::bad_request(other.to_string()),
    }
}

/// Prompt token ids of a body, computed off the async workers.
pub(crate) async fn prompt_ids(
    state: &Shared,
    api: Api,
    body: Value,
) -> Result<Vec<u32>, ApiError> {
    let tok = state.tokenizer.clone();
    let job = move || -> Result<Vec<u32>, ApiError> {
        match api {
            Api::Chat => {
                let req = ChatRequest::from_openai(&body).map_err(tokenize_error)?;
                tok.chat_token_ids(&req).map_err(tokenize_error)
            }
            Api::Messages => {
                let req = ChatRequest::from_anthropic(&body).map_err(tokenize_error)?;
                tok.chat_token_ids(&req).map_err(tokenize_error)
            }
            Api::Completions => {
                let prompt = CompletionPrompt::from_openai(&body).map_err(tokenize_error)?;
                let special = match body.get("add_special_tokens") {
                    None | Some(Value::Null) => None,
                    Some(Value::Bool(b)) => Some(*b),
                    Some(_) => {
                        return Err(ApiError::bad_request(
                            "`add_special_tokens` must be a boolean",
                        ));
                    }
                };
                let mut all = tok
                    .completion_token_ids(&prompt, special)
                    .map_err(tokenize_error)?;
                if all.len() != 1 {
                    return Err(ApiError::bad_request(
                        "the simulator supports exactly one prompt per request",
                    ));
                }
                Ok(all.pop().unwrap_or_default())
            }
        }
    };
    tokio::task::spawn_blocking(job)
        .await
        .map_err(|e| ApiError::unavailable(format!("tokenizer task failed: {e}")))?
}

pub(crate) async fn chat(State(state): State<Shared>, body: Bytes) -> Response {
    generate(state, Api::Chat, body)
        .await
        .unwrap_or_else(IntoResponse::into_response)
}

pub(crate) async fn completions(State(state): State<Shared>, body: Bytes) -> Response {
    generate(state, Api::Completions, body)
        .await
        .unwrap_or_else(IntoResponse::into_response)
}

pub(crate) async fn messages(State(state): State<Shared>, body: Bytes) -> Response {
    let result = async {
        let started = admit(state.clone(), Api::Messages, body).await?;
        Ok::<_, ApiError>(if started.params.stream {
            anthropic::stream_response(state, started.meta, started.prompt_tokens, started.rx)
        } else {
            anthropic::collect_response(state, started.meta, started.rx).await?
        })
    }
    .await;
    result.unwrap_or_else(anthropic::error_response)
}

async fn generate(state: Shared, api: Api, body: Bytes) -> Result<Response, ApiError> {
    let Started {
        meta,
        params,
        kept_prompt,
        rx,
        ..
    } = admit(state.clone(), api, body).await?;
    if params.stream {
        Ok(stream_response(state, meta, params, rx))
    } else {
        collect_response(state, meta, kept_prompt, rx).await
    }
}

/// A request the engine accepted: its response metadata, parameters, the
/// prompt ids when a whole response returns them, and its token stream.
pub(crate) struct Started {
    pub meta: ResponseMeta,
    pub params: SamplingParams,
    pub prompt_tokens: usize,
    kept_prompt: Option<Vec<u32>>,
    pub rx: mpsc::Receiver<Delta>,
}

/// Parses, tokenizes and hands a request to the engine loop.
async fn admit(state: Shared, api: Api, body: Bytes) -> Result<Started, ApiError> {
    let body = parse_json(&body)?;
    if api == Api::Messages && !matches!(body.get("max_tokens"), Some(Value::Number(_))) {
        // Required by vLLM's Anthropic request model.
        return Err(ApiError::bad_request("`max_tokens` is required"));
    }
    let params = SamplingParams::from_body(api, &body)?;
    let lora = state.check_model(params.model.as_deref())?;
    let prompt = prompt_ids(&state, api, body).await?;
    let prompt_tokens = prompt.len();
    let max_len = state.max_model_len;
    if prompt_tokens > max_len {
        return Err(ApiError::bad_request(format!(
            "This model's maximum context length is {max_len} tokens. However, your request has {prompt_tokens} input tokens. Please reduce the length of the input messages."
        )));
    }
    let max_tokens = match params.max_tokens {
        Some(n) => n,
        None if prompt_tokens < max_len => max_len - prompt_tokens,
        None => {
            return Err(ApiError::bad_request(format!(
                "This model's maximum context length is {max_len} tokens and your request has {prompt_tokens} input tokens, leaving no room for output tokens."
            )));
        }
    };
    // Kept for a whole response with `return_token_ids`.
    let kept_prompt = (params.return_token_ids && !params.stream).then(|| prompt.clone());
    let seq = state.next_id.fetch_add(1, Ordering::Relaxed);
    let (stream_tx, stream_rx) = mpsc::channel(STREAM_CAPACITY);
    let (reply_tx, reply_rx) = oneshot::channel();
    state
        .send(Command::Add {
            req: SimRequest {
                id: seq,
                prompt_token_ids: prompt,
                max_tokens,
                min_tokens: params.min_tokens,
                ignore_eos: params.ignore_eos,
                arrival: 0.0,
                lora,
                cache_salt: params.cache_salt.clone(),
            },
            stream: stream_tx,
            reply: reply_tx,
        })
        .await?;
    match reply_rx.await {
        Ok(Ok(())) => {}
        Ok(Err(reject)) => return Err(ApiError::bad_request(reject.to_string())),
        Err(_) => return Err(ApiError::unavailable("the engine loop has stopped")),
    }
    let prefix = match api {
        Api::Chat | Api::Messages => "chatcmpl",
        Api::Completions => "cmpl",
    };
    let meta = ResponseMeta {
        api,
        id: format!("{prefix}-{:016x}{seq:016x}", state.created),
        created: unix_now(),
        model: state.model.clone(),
    };
    Ok(Started {
        meta,
        params,
        prompt_tokens,
        kept_prompt,
        rx: stream_rx,
    })
}

/// The text of a generated (filler) token.
pub(crate) fn text_of(state: &Shared, id: u32) -> &str {
    state.token_text.get(&id).map_or("", String::as_str)
}

/// A whole response, complete once the step of its last token has run;
/// `prompt` (its token ids) when the request asked for ids.
async fn collect_response(
    state: Shared,
    meta: ResponseMeta,
    prompt: Option<Vec<u32>>,
    mut rx: mpsc::Receiver<Delta>,
) -> Result<Response, ApiError> {
    let mut text = String::new();
    let mut ids = Vec::new();
    while let Some(delta) = rx.recv().await {
        text.push_str(text_of(&state, delta.token_id));
        ids.push(delta.token_id);
        if let Some(Finish { reason, usage }) = delta.finish {
            let mut body = meta.full(&text, reason, &usage);
            if let Some(prompt) = &prompt {
                body = with_token_ids(body, &ids, Some(prompt));
            }
            return Ok(axum::Json(body).into_response());
        }
    }
    Err(ApiError::unavailable(
        "the request was dropped by the engine",
    ))
}

/// SSE like vLLM's stream generators: nothing until the first token exists
/// (after the prefill), then (chat) the role chunk together with the first
/// token's chunk, one chunk per token as its step completes (the last one
/// carries `finish_reason`), the usage chunk if asked, `[DONE]`.
fn stream_response(
    state: Shared,
    meta: ResponseMeta,
    params: SamplingParams,
    mut rx: mpsc::Receiver<Delta>,
) -> Response {
    let (tx, body_rx) = mpsc::channel::<Result<Bytes, std::convert::Infallible>>(STREAM_CAPACITY);
    tokio::spawn(async move {
        let mut first = true;
        while let Some(delta) = rx.recv().await {
            // The chunks of one step leave as one body frame.
            let mut frame = BytesMut::new();
            if first && meta.api == Api::Chat {
                frame.extend_from_slice(&sse_data(&meta.chunk(Some(""), true, None)));
            }
            first = false;
            let reason = delta.finish.map(|f| f.reason);
            let mut chunk = meta.chunk(Some(text_of(&state, delta.token_id)), false, reason);
            if params.return_token_ids {
                chunk = with_token_ids(chunk, &[delta.token_id], None);
            }
            frame.extend_from_slice(&sse_data(&chunk));
            let done = delta.finish.is_some();
            if let Some(Finish { usage, .. }) = delta.finish {
                if params.include_usage {
                    frame.extend_from_slice(&sse_data(&meta.usage_chunk(&usage)));
                }
                frame.extend_from_slice(SSE_DONE.as_bytes());
            }
            if tx.send(Ok(frame.freeze())).await.is_err() || done {
                return;
            }
        }
    });
    sse_response(body_rx)
}

/// An SSE response whose frames come from `frames` (a bounded channel the
/// generation task fills).
pub(crate) fn sse_response(
    frames: mpsc::Receiver<Result<Bytes, std::convert::Infallible>>,
) -> Response {
    let body = Body::from_stream(tokio_stream::wrappers::ReceiverStream::new(frames));
    (
        [
            (header::CONTENT_TYPE, "text/event-stream; charset=utf-8"),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        body,
    )
        .into_response()
}
