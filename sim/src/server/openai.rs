//! The OpenAI wire format at the edge: sampling parameters read from request
//! bodies, and response / SSE chunk bodies shaped like vLLM's.

use serde_json::{Map, Value, json};

use super::error::ApiError;
use crate::engine::{FinishReason, Usage};

/// Which endpoint a request came through.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Api {
    Chat,
    Completions,
    /// Anthropic `/v1/messages`: generated as the chat request vLLM converts
    /// it to, answered in Anthropic's shapes (`super::anthropic`).
    Messages,
}

/// The generation-deciding fields of a body.
#[derive(Debug, Clone, PartialEq)]
pub struct SamplingParams {
    pub model: Option<String>,
    /// `None`: up to the model length.
    pub max_tokens: Option<usize>,
    pub min_tokens: usize,
    pub ignore_eos: bool,
    pub stream: bool,
    pub include_usage: bool,
    /// vLLM's `return_token_ids` (≥ 0.10.2): generated token ids on every
    /// chunk's choice (`token_ids`), and the prompt's in a whole response.
    pub return_token_ids: bool,
    /// vLLM's `cache_salt` (≥ 0.9): blocks computed with one salt are never
    /// a prefix hit for another salt or for none.
    pub cache_salt: Option<String>,
}

/// vLLM's `max_tokens` default for `/v1/completions`.
pub const COMPLETIONS_DEFAULT_MAX_TOKENS: usize = 16;

// === impl SamplingParams ===

impl SamplingParams {
    pub fn from_body(api: Api, body: &Value) -> Result<Self, ApiError> {
        let obj = body
            .as_object()
            .ok_or_else(|| ApiError::bad_request("request body must be a JSON object"))?;
        let model = match obj.get("model") {
            None | Some(Value::Null) => None,
            Some(Value::String(s)) => Some(s.clone()),
            Some(_) => return Err(ApiError::bad_request("`model` must be a string")),
        };
        let mut max_tokens = uint(obj, "max_tokens")?;
        if api == Api::Chat {
            if let Some(n) = uint(obj, "max_completion_tokens")? {
                max_tokens = Some(n);
            }
        } else if max_tokens.is_none() && !obj.contains_key("max_tokens") {
            max_tokens = Some(COMPLETIONS_DEFAULT_MAX_TOKENS);
        }
        if max_tokens == Some(0) {
            return Err(ApiError::bad_request(
                "max_tokens must be at least 1, got 0.",
            ));
        }
        let min_tokens = uint(obj, "min_tokens")?.unwrap_or(0);
        if let Some(max) = max_tokens
            && min_tokens > max
        {
            return Err(ApiError::bad_request(format!(
                "min_tokens must be less than or equal to max_tokens={max}, got {min_tokens}."
            )));
        }
        if let Some(n) = uint(obj, "n")?
            && n != 1
        {
            return Err(ApiError::bad_request("the simulator supports only n = 1"));
        }
        let stream = boolean(obj, "stream")?.unwrap_or(false);
        let include_usage = match obj.get("stream_options") {
            None | Some(Value::Null) => false,
            Some(Value::Object(o)) => boolean(o, "include_usage")?.unwrap_or(false),
            Some(_) => return Err(ApiError::bad_request("`stream_options` must be an object")),
        };
        if include_usage && !stream {
            return Err(ApiError::bad_request(
                "Stream options can only be defined when `stream=True`.",
            ));
        }
        Ok(Self {
            model,
            max_tokens,
            min_tokens,
            ignore_eos: boolean(obj, "ignore_eos")?.unwrap_or(false),
            stream,
            include_usage,
            return_token_ids: boolean(obj, "return_token_ids")?.unwrap_or(false),
            cache_salt: cache_salt(obj)?,
        })
    }
}

/// vLLM's check: `cache_salt`, when given, is a non-empty string.
fn cache_salt(obj: &Map<String, Value>) -> Result<Option<String>, ApiError> {
    match obj.get("cache_salt") {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) if !s.is_empty() => Ok(Some(s.clone())),
        Some(_) => Err(ApiError::bad_request(
            "Parameter 'cache_salt' must be a non-empty string if provided.",
        )),
    }
}

fn uint(obj: &Map<String, Value>, key: &str) -> Result<Option<usize>, ApiError> {
    match obj.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => v
            .as_u64()
            .map(|n| Some(n.min(usize::MAX as u64) as usize))
            .ok_or_else(|| {
                ApiError::bad_request(format!("`{key}` must be a non-negative integer"))
            }),
    }
}

fn boolean(obj: &Map<String, Value>, key: &str) -> Result<Option<bool>, ApiError> {
    match obj.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Bool(b)) => Ok(Some(*b)),
        Some(_) => Err(ApiError::bad_request(format!("`{key}` must be a boolean"))),
    }
}

/// The identity of one response: id prefix, creation time, model.
#[derive(Debug, Clone)]
pub struct ResponseMeta {
    pub api: Api,
    pub id: String,
    pub created: u64,
    pub model: String,
}

pub fn usage_json(u: &Usage) -> Value {
    json!({
        "prompt_tokens": u.prompt_tokens,
        "total_tokens": u.prompt_tokens + u.completion_tokens,
        "completion_tokens": u.completion_tokens,
        "prompt_tokens_details": {"cached_tokens": u.cached_tokens},
    })
}

// === impl ResponseMeta ===

impl ResponseMeta {
    fn object(&self, stream: bool) -> &'static str {
        match (self.api, stream) {
            (Api::Chat | Api::Messages, false) => "chat.completion",
            (Api::Chat | Api::Messages, true) => "chat.completion.chunk",
            (Api::Completions, _) => "text_completion",
        }
    }

    /// A whole non-streaming response.
    pub fn full(&self, text: &str, reason: FinishReason, usage: &Usage) -> Value {
        let choice = match self.api {
            Api::Chat | Api::Messages => json!({
                "index": 0,
                "message": {
                    "role": "assistant",
                    "content": text,
                    "refusal": null,
                    "annotations": null,
                    "audio": null,
                    "function_call": null,
                    "tool_calls": [],
                    "reasoning_content": null,
                },
                "logprobs": null,
                "finish_reason": reason.as_str(),
                "stop_reason": null,
            }),
            Api::Completions => json!({
                "index": 0,
                "text": text,
                "logprobs": null,
                "finish_reason": reason.as_str(),
                "stop_reason": null,
                "prompt_logprobs": null,
            }),
        };
        let mut body = json!({
            "id": self.id,
            "object": self.object(false),
            "created": self.created,
            "model": self.model,
            "choices": [choice],
            "service_tier": null,
            "system_fingerprint": null,
            "usage": usage_json(usage),
        });
        if let Some(o) = body.as_object_mut() {
            if self.api == Api::Chat {
                o.insert("prompt_logprobs".into(), Value::Null);
            } else {
                o.remove("service_tier");
            }
            o.insert("kv_transfer_params".into(), Value::Null);
        }
        body
    }

    /// A streaming chunk with one choice.
    pub fn chunk(
        &self,
        delta_text: Option<&str>,
        role: bool,
        reason: Option<FinishReason>,
    ) -> Value {
        let choice = match self.api {
            Api::Chat | Api::Messages => {
                let mut delta = Map::new();
                if role {
                    delta.insert("role".into(), "assistant".into());
                }
                if let Some(t) = delta_text {
                    delta.insert("content".into(), t.into());
                }
                let mut choice = json!({
                    "index": 0,
                    "delta": delta,
                    "logprobs": null,
                    "finish_reason": reason.map(FinishReason::as_str),
                });
                // vLLM sets `stop_reason` only on the finishing chunk.
                if reason.is_some() {
                    choice["stop_reason"] = Value::Null;
                }
                choice
            }
            Api::Completions => json!({
                "index": 0,
                "text": delta_text.unwrap_or(""),
                "logprobs": null,
                "finish_reason": reason.map(FinishReason::as_str),
                "stop_reason": null,
            }),
        };
        json!({
            "id": self.id,
            "object": self.object(true),
            "created": self.created,
            "model": self.model,
            "choices": [choice],
        })
    }

    /// The final `stream_options.include_usage` chunk: no choices.
    pub fn usage_chunk(&self, usage: &Usage) -> Value {
        json!({
            "id": self.id,
            "object": self.object(true),
            "created": self.created,
            "model": self.model,
            "choices": [],
            "usage": usage_json(usage),
        })
    }
}

/// Adds `token_ids` (and `prompt_token_ids`, when given) to a response's
/// or chunk's choice, as vLLM does for `return_token_ids`.
pub fn with_token_ids(mut body: Value, ids: &[u32], prompt: Option<&[u32]>) -> Value {
    if let Some(choice) = body
        .pointer_mut("/choices/0")
        .and_then(Value::as_object_mut)
    {
        choice.insert("token_ids".into(), json!(ids));
        if let Some(p) = prompt {
            choice.insert("prompt_token_ids".into(), json!(p));
        }
    }
    body
}

/// One SSE event line pair.
pub fn sse_data(v: &Value) -> bytes::Bytes {
    bytes::Bytes::from(format!("data: {v}\n\n"))
}

pub const SSE_DONE: &str = "data: [DONE]\n\n";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn params_defaults_and_errors() {
        let p = SamplingParams::from_body(Api::Completions, &json!({"prompt": "x"})).unwrap();
        assert_eq!(p.max_tokens, Some(16));
        let p = SamplingParams::from_body(Api::Chat, &json!({"messages": []})).unwrap();
        assert_eq!(p.max_tokens, None);
        let p = SamplingParams::from_body(
            Api::Chat,
            &json!({"max_completion_tokens": 5, "stream": true, "stream_options": {"include_usage": true}, "ignore_eos": true, "min_tokens": 2}),
        )
        .unwrap();
        assert_eq!(
            (
                p.max_tokens,
                p.min_tokens,
                p.stream,
                p.include_usage,
                p.ignore_eos
            ),
            (Some(5), 2, true, true, true)
        );
        for bad in [
            json!([]),
            json!({"max_tokens": -1}),
            json!({"max_tokens": "3"}),
            json!({"max_tokens": 0}),
            json!({"stream": "yes"}),
            json!({"model": 3}),
            json!({"max_tokens": 2, "min_tokens": 3}),
            json!({"stream_options": {"include_usage": true}}),
            json!({"n": 2}),
        ] {
            let e = SamplingParams::from_body(Api::Chat, &bad).unwrap_err();
            assert_eq!(e.status, 400, "{bad}");
        }
    }

    #[test]
    fn chunk_shapes() {
        let meta = ResponseMeta {
            api: Api::Chat,
            id: "chatcmpl-1".into(),
            created: 5,
            model: "m".into(),
        };
        let c = meta.chunk(Some(""), true, None);
        assert_eq!(
            c["choices"][0]["delta"],
            json!({"role": "assistant", "content": ""})
        );
        assert_eq!(c["object"], "chat.completion.chunk");
        assert!(c["choices"][0].get("stop_reason").is_none());
        let c = meta.chunk(Some("x"), false, Some(FinishReason::Stop));
        assert_eq!(c["choices"][0]["finish_reason"], "stop");
        assert_eq!(c["choices"][0]["stop_reason"], Value::Null);
        let u = Usage {
            prompt_tokens: 3,
            completion_tokens: 2,
            cached_tokens: 1,
        };
        let c = meta.usage_chunk(&u);
        assert_eq!(c["usage"]["total_tokens"], 5);
        assert_eq!(c["usage"]["prompt_tokens_details"]["cached_tokens"], 1);
        let full = meta.full("hi", FinishReason::Length, &u);
        assert_eq!(full["choices"][0]["message"]["content"], "hi");
        assert_eq!(sse_data(&json!({"a": 1})), "data: {\"a\":1}\n\n");
    }
}
