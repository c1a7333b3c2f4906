//! OpenAI request bodies → plain domain types: kvsteer's one parser of them.
//!
//! The Envoy filter (wasm) turns a [`Request`] into the `PickRequest` it
//! sends; the tokenizer (and through it the indexer's `/debug/score`, its
//! `tokenize` CLI and the simulator) turns the same [`Request`] into what the
//! chat template renders. With one parse, a body cannot mean one prompt to
//! `Pick` and another to the simulator.
//!
//! Only fields that decide the prompt's token ids, plus the few the router
//! itself uses (`model`, `stream`, `max_tokens`, `cache_salt`), are read;
//! everything else is ignored. Every malformed field is a [`BodyError`]
//! naming its JSON path. Which content parts are text follows vLLM (see
//! [`text_key`]).
//!
//! Depends on `serde_json` alone, so it builds for `wasm32-wasip1` and the
//! host alike.
#![forbid(unsafe_code)]

mod chat;
mod error;
mod field;
mod messages;
mod prompt;

use serde_json::Value;

pub use chat::{Chat, Content, Message, Part, ToolCall, text_key};
pub use error::BodyError;
pub use prompt::Prompt;

/// The endpoint a body was sent to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Api {
    /// `POST /v1/chat/completions`.
    Chat,
    /// `POST /v1/completions`.
    Completions,
    /// `POST /v1/messages` (Anthropic): converted to the chat request vLLM
    /// makes of it, so its input is [`Input::Chat`].
    Messages,
}

/// A parsed request body.
#[derive(Clone, Debug, PartialEq)]
pub struct Request {
    /// `model`; empty when absent (the indexer then uses the model it
    /// serves, when it serves one).
    pub model: String,
    pub stream: bool,
    /// Chat: `max_completion_tokens`, else `max_tokens` (vLLM's
    /// `max_completion_tokens or max_tokens`: 0 counts as unset);
    /// completions and messages: `max_tokens`.
    pub max_tokens: Option<u32>,
    pub add_special_tokens: Option<bool>,
    pub cache_salt: Option<String>,
    pub input: Input,
}

/// What the prompt is made of, by endpoint.
#[derive(Clone, Debug, PartialEq)]
pub enum Input {
    Chat(Chat),
    Completion(Prompt),
}

/// Parses the bytes of a body sent to `api`.
pub fn parse(api: Api, body: &[u8]) -> Result<Request, BodyError> {
    let value = serde_json::from_slice(body).map_err(|e| BodyError::Json(e.to_string()))?;
    from_value(api, value)
}

/// Parses an already decoded body; its strings move into the result.
pub fn from_value(api: Api, body: Value) -> Result<Request, BodyError> {
    let Value::Object(mut obj) = body else {
        return Err(BodyError::NotAnObject);
    };
    let input = match api {
        Api::Chat => Input::Chat(chat::chat(&mut obj)?),
        Api::Completions => Input::Completion(prompt::prompt(obj.remove("prompt"))?),
        Api::Messages => Input::Chat(messages::messages(&mut obj)?),
    };
    // vLLM's Anthropic request has no `add_special_tokens`: the field is
    // ignored there, and so here.
    let add_special_tokens = match api {
        Api::Messages => None,
        Api::Chat | Api::Completions => field::boolean(&obj, "add_special_tokens")?,
    };
    Ok(Request {
        model: field::string(&mut obj, "model", field::At::Top)?.unwrap_or_default(),
        stream: field::boolean(&obj, "stream")?.unwrap_or(false),
        max_tokens: max_tokens(api, &obj)?,
        add_special_tokens,
        cache_salt: field::string(&mut obj, "cache_salt", field::At::Top)?,
        input,
    })
}

fn max_tokens(api: Api, obj: &field::Object) -> Result<Option<u32>, BodyError> {
    let max_tokens = field::count(obj, "max_tokens")?;
    if api == Api::Chat
        && let Some(n) = field::count(obj, "max_completion_tokens")?
        && n > 0
    {
        return Ok(Some(n));
    }
    Ok(max_tokens)
}

#[cfg(test)]
mod tests;
