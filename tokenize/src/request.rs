//! The prompt-deciding fields of OpenAI request bodies, as plain values.
//!
//! These mirror what a client sends (before vLLM's normalisation); the
//! renderer applies the normalisation rules. The Envoy filter sends the same
//! fields over gRPC (`kvsteer.v1.PickRequest`), the simulator reads them from
//! the HTTP body.

use serde_json::{Map, Value};

/// `POST /v1/chat/completions`.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ChatRequest {
    pub messages: Vec<ChatMessage>,
    /// The `tools` array as sent, `None` when absent.
    pub tools: Option<Vec<Value>>,
    /// `chat_template_kwargs` as sent (empty when absent).
    pub chat_template_kwargs: Map<String, Value>,
    pub add_generation_prompt: Option<bool>,
    pub continue_final_message: Option<bool>,
    pub add_special_tokens: Option<bool>,
    pub reasoning_effort: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Default)]
pub struct ChatMessage {
    pub role: String,
    pub content: Content,
    pub tool_calls: Vec<ToolCall>,
    pub tool_call_id: Option<String>,
    pub name: Option<String>,
    /// `reasoning`, or the older `reasoning_content`.
    pub reasoning: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Default)]
pub enum Content {
    /// `null` or absent.
    #[default]
    Null,
    Text(String),
    Parts(Vec<ContentPart>),
}

#[derive(Debug, Clone, PartialEq, Default)]
pub struct ContentPart {
    /// The part's `type` (`text`, `refusal`, `thinking`, `image_url`, ...).
    pub kind: String,
    /// The text of a text-like part (`.text`, `.refusal`, `.thinking`).
    pub text: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Default)]
pub struct ToolCall {
    pub id: Option<String>,
    pub kind: Option<String>,
    pub name: String,
    /// `function.arguments`: the JSON string as sent (or the JSON text of an
    /// object sent in its place); `None` for null or absent.
    pub arguments: Option<String>,
}

/// `POST /v1/completions` `prompt`.
#[derive(Debug, Clone, PartialEq)]
pub enum CompletionPrompt {
    Text(String),
    Texts(Vec<String>),
    Ids(Vec<u32>),
    IdBatch(Vec<Vec<u32>>),
}
