//! The OpenAI request body (wire format) → the fields of a `PickRequest`.
//!
//! Only what decides the prompt's token ids is extracted; everything else in
//! the body is ignored. A body that is not an OpenAI request of the expected
//! shape is an error, and the filter then lets the request through untouched.

use kvsteer_proto::v1::{
    ChatMessage, CompletionPrompt, ContentPart, ContentParts, PickRequest, Texts, TokenIdBatch,
    TokenIds, ToolCall, chat_message, completion_prompt,
};
use serde_json::{Map, Value};

use crate::admission::Api;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum BodyError {
    #[error("request body is not JSON: {0}")]
    Json(String),
    #[error("request body is not a JSON object")]
    NotAnObject,
    #[error("request body lacks `{0}`")]
    Missing(&'static str),
    #[error("request body field `{field}` must be {expected}")]
    WrongType {
        field: String,
        expected: &'static str,
    },
}

/// Content part types whose text is part of the prompt, with the key holding it.
const TEXT_PARTS: [(&str, &str); 5] = [
    ("text", "text"),
    ("input_text", "text"),
    ("output_text", "text"),
    ("refusal", "refusal"),
    ("thinking", "thinking"),
];

/// Parses `body` as a request to `api`. `request_id` and `tenant` are left
/// empty for the caller.
pub fn parse_pick_request(api: Api, body: &[u8]) -> Result<PickRequest, BodyError> {
    let value: Value = serde_json::from_slice(body).map_err(|e| BodyError::Json(e.to_string()))?;
    let Value::Object(mut obj) = value else {
        return Err(BodyError::NotAnObject);
    };
    let mut pick = PickRequest {
        api: api.kind() as i32,
        model: opt_str(&obj, "model")?.unwrap_or_default().to_owned(),
        add_special_tokens: opt_bool(&obj, "add_special_tokens")?,
        cache_salt: opt_str(&obj, "cache_salt")?.unwrap_or_default().to_owned(),
        max_tokens: max_tokens(&obj)?,
        stream: opt_bool(&obj, "stream")?.unwrap_or(false),
        body_bytes: u32::try_from(body.len()).unwrap_or(u32::MAX),
        ..PickRequest::default()
    };
    match api {
        Api::Chat => {
            // Taken out of the parsed body: message texts move into the
            // proto instead of being copied (they are most of the body).
            let messages = match obj.remove("messages") {
                Some(Value::Array(items)) => items,
                Some(_) => return Err(wrong("messages", "an array")),
                None => return Err(BodyError::Missing("messages")),
            };
            pick.messages = messages
                .into_iter()
                .enumerate()
                .map(|(i, m)| chat_message(i, m))
                .collect::<Result<_, _>>()?;
            pick.tools_json = opt_json_text(&obj, "tools");
            pick.chat_template_kwargs_json = opt_json_text(&obj, "chat_template_kwargs");
            pick.add_generation_prompt = opt_bool(&obj, "add_generation_prompt")?;
            pick.continue_final_message = opt_bool(&obj, "continue_final_message")?;
            pick.reasoning_effort = opt_str(&obj, "reasoning_effort")?
                .unwrap_or_default()
                .to_owned();
        }
        Api::Completions => {
            let prompt = obj.remove("prompt").ok_or(BodyError::Missing("prompt"))?;
            pick.prompt = Some(completion_prompt(prompt)?);
        }
    }
    Ok(pick)
}

// === messages ===

fn chat_message(index: usize, value: Value) -> Result<ChatMessage, BodyError> {
    let field = |name: &str| format!("messages[{index}].{name}");
    let Value::Object(mut obj) = value else {
        return Err(wrong(format!("messages[{index}]"), "an object"));
    };
    let mut str_field = |name: &str| -> Result<Option<String>, BodyError> {
        match obj.remove(name) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(s)) => Ok(Some(s)),
            Some(_) => Err(wrong(field(name), "a string")),
        }
    };
    let role = str_field("role")?.ok_or_else(|| wrong(field("role"), "a string"))?;
    let tool_call_id = str_field("tool_call_id")?.unwrap_or_default();
    let name = str_field("name")?.unwrap_or_default();
    let reasoning = match str_field("reasoning")? {
        Some(r) => Some(r),
        None => str_field("reasoning_content")?,
    };
    let content = match obj.remove("content") {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) => Some(chat_message::Content::Text(s)),
        Some(Value::Array(parts)) => Some(chat_message::Content::Parts(ContentParts {
            parts: parts
                .into_iter()
                .map(|p| content_part(p).ok_or_else(|| wrong(field("content"), "parts objects")))
                .collect::<Result<_, _>>()?,
        })),
        Some(_) => return Err(wrong(field("content"), "a string, an array or null")),
    };
    let tool_calls = match obj.get("tool_calls") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Array(calls)) => calls
            .iter()
            .map(|c| tool_call(c).ok_or_else(|| wrong(field("tool_calls"), "tool call objects")))
            .collect::<Result<_, _>>()?,
        Some(_) => return Err(wrong(field("tool_calls"), "an array")),
    };
    Ok(ChatMessage {
        role,
        content,
        tool_calls,
        tool_call_id,
        name,
        reasoning,
    })
}

/// A content part: an object with a `type`, or a bare string (a text part).
fn content_part(value: Value) -> Option<ContentPart> {
    match value {
        Value::String(s) => Some(ContentPart {
            r#type: "text".to_owned(),
            text: Some(s),
        }),
        Value::Object(mut part) => {
            let Some(Value::String(kind)) = part.remove("type") else {
                return None;
            };
            let key = TEXT_PARTS.iter().find(|(t, _)| *t == kind).map(|(_, k)| *k);
            let text = key
                .and_then(|key| part.remove(key).or_else(|| part.remove("text")))
                .and_then(|v| match v {
                    Value::String(s) => Some(s),
                    _ => None,
                });
            Some(ContentPart { r#type: kind, text })
        }
        _ => None,
    }
}

fn tool_call(value: &Value) -> Option<ToolCall> {
    let call = value.as_object()?;
    let text = |v: Option<&Value>| v.and_then(Value::as_str).unwrap_or_default().to_owned();
    let function = match call.get("function") {
        Some(Value::Object(f)) => Some(f),
        None | Some(Value::Null) => None,
        Some(_) => return None,
    };
    let arguments = match function.and_then(|f| f.get("arguments")) {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) => Some(s.clone()),
        Some(other) => Some(other.to_string()),
    };
    Some(ToolCall {
        id: text(call.get("id")),
        r#type: text(call.get("type")),
        name: text(function.and_then(|f| f.get("name"))),
        arguments,
    })
}

// === prompt ===

fn completion_prompt(value: Value) -> Result<CompletionPrompt, BodyError> {
    const EXPECTED: &str = "a string, strings, token ids or lists of token ids";
    let kind = match value {
        Value::String(s) => completion_prompt::Kind::Text(s),
        Value::Array(items) => match items.first() {
            None => return Err(wrong("prompt", "a non-empty list")),
            Some(Value::String(_)) => completion_prompt::Kind::Texts(Texts {
                texts: items
                    .into_iter()
                    .map(|v| match v {
                        Value::String(s) => Some(s),
                        _ => None,
                    })
                    .collect::<Option<_>>()
                    .ok_or_else(|| wrong("prompt", EXPECTED))?,
            }),
            Some(Value::Number(_)) => completion_prompt::Kind::TokenIds(
                token_ids(&items).ok_or_else(|| wrong("prompt", EXPECTED))?,
            ),
            Some(Value::Array(_)) => completion_prompt::Kind::TokenIdBatch(TokenIdBatch {
                prompts: items
                    .iter()
                    .map(|v| v.as_array().and_then(|ids| token_ids(ids)))
                    .collect::<Option<_>>()
                    .ok_or_else(|| wrong("prompt", EXPECTED))?,
            }),
            Some(_) => return Err(wrong("prompt", EXPECTED)),
        },
        _ => return Err(wrong("prompt", EXPECTED)),
    };
    Ok(CompletionPrompt { kind: Some(kind) })
}

fn token_ids(items: &[Value]) -> Option<TokenIds> {
    let ids = items
        .iter()
        .map(|v| v.as_u64().and_then(|id| u32::try_from(id).ok()))
        .collect::<Option<_>>()?;
    Some(TokenIds { ids })
}

// === scalar fields ===

fn wrong(field: impl Into<String>, expected: &'static str) -> BodyError {
    BodyError::WrongType {
        field: field.into(),
        expected,
    }
}

fn opt_str<'a>(
    obj: &'a Map<String, Value>,
    key: &'static str,
) -> Result<Option<&'a str>, BodyError> {
    match obj.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s)),
        Some(_) => Err(wrong(key, "a string")),
    }
}

fn opt_bool(obj: &Map<String, Value>, key: &'static str) -> Result<Option<bool>, BodyError> {
    match obj.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Bool(b)) => Ok(Some(*b)),
        Some(_) => Err(wrong(key, "a boolean")),
    }
}

/// JSON text of a present, non-null value; empty otherwise.
fn opt_json_text(obj: &Map<String, Value>, key: &str) -> String {
    match obj.get(key) {
        None | Some(Value::Null) => String::new(),
        Some(v) => v.to_string(),
    }
}

fn max_tokens(obj: &Map<String, Value>) -> Result<Option<u32>, BodyError> {
    for key in ["max_tokens", "max_completion_tokens"] {
        match obj.get(key) {
            None | Some(Value::Null) => continue,
            Some(v) => {
                return v
                    .as_u64()
                    .and_then(|n| u32::try_from(n).ok())
                    .map(Some)
                    .ok_or_else(|| wrong(key, "a non-negative 32-bit integer"));
            }
        }
    }
    Ok(None)
}

#[cfg(test)]
mod tests;
