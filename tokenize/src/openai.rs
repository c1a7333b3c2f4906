//! OpenAI JSON bodies → the domain types of [`crate::request`].
//!
//! The parse is `kvsteer-openai-body`'s, the one the Envoy filter builds its
//! `PickRequest` from; this module only moves its result into the
//! tokenizer's types. It reads the fields exactly as the indexer reads them
//! from a `PickRequest` (an empty string is absent: the proto cannot tell
//! the two apart), so a body tokenizes to the same ids whether it reaches
//! the tokenizer directly or through the filter and the indexer. Every
//! malformed field is an [`Error::InvalidRequest`] naming the field.

use kvsteer_openai_body::{self as parsed, Input};
use serde_json::Value;

use crate::error::Error;
use crate::request::{ChatMessage, ChatRequest, CompletionPrompt, Content, ContentPart, ToolCall};

// === impl ChatRequest ===

impl ChatRequest {
    /// Reads a `/v1/chat/completions` body.
    pub fn from_openai(body: &Value) -> Result<ChatRequest, Error> {
        Self::from_api(parsed::Api::Chat, body)
    }

    /// Reads a `/v1/messages` (Anthropic) body: the chat request vLLM
    /// converts it to.
    pub fn from_anthropic(body: &Value) -> Result<ChatRequest, Error> {
        Self::from_api(parsed::Api::Messages, body)
    }

    fn from_api(api: parsed::Api, body: &Value) -> Result<ChatRequest, Error> {
        let request = parsed::from_value(api, body.clone()).map_err(invalid)?;
        match request.input {
            Input::Chat(chat) => Ok(ChatRequest::from_body(chat, request.add_special_tokens)),
            Input::Completion(_) => Err(Error::invalid("not a chat request")),
        }
    }

    /// The chat fields of a parsed body, with its `add_special_tokens`.
    pub fn from_body(chat: parsed::Chat, add_special_tokens: Option<bool>) -> ChatRequest {
        ChatRequest {
            messages: chat.messages.into_iter().map(message).collect(),
            tools: chat.tools,
            chat_template_kwargs: chat.chat_template_kwargs.unwrap_or_default(),
            add_generation_prompt: chat.add_generation_prompt,
            continue_final_message: chat.continue_final_message,
            add_special_tokens,
            reasoning_effort: non_empty(chat.reasoning_effort),
        }
    }
}

fn message(m: parsed::Message) -> ChatMessage {
    let content = match m.content {
        parsed::Content::Null => Content::Null,
        parsed::Content::Text(text) => Content::Text(text),
        parsed::Content::Parts(parts) => Content::Parts(
            parts
                .into_iter()
                .map(|p| ContentPart {
                    kind: p.kind,
                    text: p.text,
                })
                .collect(),
        ),
    };
    ChatMessage {
        role: m.role,
        content,
        tool_calls: m
            .tool_calls
            .into_iter()
            .map(|c| ToolCall {
                id: non_empty(c.id),
                kind: non_empty(c.kind),
                name: c.name,
                arguments: c.arguments,
            })
            .collect(),
        tool_call_id: non_empty(m.tool_call_id),
        name: non_empty(m.name),
        reasoning: m.reasoning,
    }
}

// === impl CompletionPrompt ===

impl CompletionPrompt {
    /// Reads `prompt` of a `/v1/completions` body: a string, a list of
    /// strings, a list of token ids, or a list of token-id lists.
    pub fn from_openai(body: &Value) -> Result<CompletionPrompt, Error> {
        let request =
            parsed::from_value(parsed::Api::Completions, body.clone()).map_err(invalid)?;
        match request.input {
            Input::Completion(prompt) => Ok(CompletionPrompt::from_body(prompt)),
            Input::Chat(_) => Err(Error::invalid("not a completions request")),
        }
    }

    /// The prompt of a parsed body.
    pub fn from_body(prompt: parsed::Prompt) -> CompletionPrompt {
        match prompt {
            parsed::Prompt::Text(text) => CompletionPrompt::Text(text),
            parsed::Prompt::Texts(texts) => CompletionPrompt::Texts(texts),
            parsed::Prompt::Ids(ids) => CompletionPrompt::Ids(ids),
            parsed::Prompt::IdBatch(batch) => CompletionPrompt::IdBatch(batch),
        }
    }
}

fn invalid(e: parsed::BodyError) -> Error {
    Error::invalid(e.to_string())
}

fn non_empty(s: Option<String>) -> Option<String> {
    s.filter(|s| !s.is_empty())
}

#[cfg(test)]
mod tests;
