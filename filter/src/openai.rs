//! The OpenAI (or Anthropic `/v1/messages`) request body → the fields of a
//! `PickRequest`. A messages body arrives as the chat request vLLM converts
//! it to, with `api = API_KIND_MESSAGES`.
//!
//! Parsing is `kvsteer-openai-body`'s, the same parse the indexer's
//! tokenizer and the simulator use, so `Pick` sees the prompt they see; this
//! module only moves the result into proto types. A body that is not an
//! OpenAI request of the expected shape is an error, and the filter then
//! lets the request through untouched.

use kvsteer_openai_body::{Chat, Content, Input, Message, Prompt, Request};
use kvsteer_proto::v1::{
    ApiKind, ChatMessage, CompletionPrompt, ContentPart, ContentParts, PickRequest, Texts,
    TokenIdBatch, TokenIds, ToolCall, chat_message, completion_prompt,
};
use serde_json::Value;

use crate::admission::Api;

pub use kvsteer_openai_body::BodyError;

/// Parses `body` as a request to `api`. `request_id` and `tenant` are left
/// empty for the caller.
pub fn parse_pick_request(api: Api, body: &[u8]) -> Result<PickRequest, BodyError> {
    let api = match api {
        Api::Chat => kvsteer_openai_body::Api::Chat,
        Api::Completions => kvsteer_openai_body::Api::Completions,
        Api::Messages => kvsteer_openai_body::Api::Messages,
    };
    let request = kvsteer_openai_body::parse(api, body)?;
    let mut pick = pick_request(request, body.len());
    if api == kvsteer_openai_body::Api::Messages {
        // Converted to chat fields as vLLM converts it; the kind tells the
        // indexer where the request came from.
        pick.api = ApiKind::Messages as i32;
    }
    Ok(pick)
}

/// The `PickRequest` for a parsed body of `body_bytes` bytes. Texts move,
/// they are not copied: they are most of the body.
pub fn pick_request(request: Request, body_bytes: usize) -> PickRequest {
    let mut pick = PickRequest {
        model: request.model,
        add_special_tokens: request.add_special_tokens,
        cache_salt: request.cache_salt.unwrap_or_default(),
        max_tokens: request.max_tokens,
        stream: request.stream,
        body_bytes: u32::try_from(body_bytes).unwrap_or(u32::MAX),
        ..PickRequest::default()
    };
    match request.input {
        Input::Chat(chat) => {
            pick.api = ApiKind::Chat as i32;
            chat_fields(&mut pick, chat);
        }
        Input::Completion(prompt) => {
            pick.api = ApiKind::Completions as i32;
            pick.prompt = Some(completion_prompt(prompt));
        }
    }
    pick
}

fn chat_fields(pick: &mut PickRequest, chat: Chat) {
    pick.messages = chat.messages.into_iter().map(chat_message).collect();
    pick.tools_json = chat
        .tools
        .map(|tools| Value::Array(tools).to_string())
        .unwrap_or_default();
    pick.chat_template_kwargs_json = chat
        .chat_template_kwargs
        .map(|kwargs| Value::Object(kwargs).to_string())
        .unwrap_or_default();
    pick.add_generation_prompt = chat.add_generation_prompt;
    pick.continue_final_message = chat.continue_final_message;
    pick.reasoning_effort = chat.reasoning_effort.unwrap_or_default();
}

fn chat_message(m: Message) -> ChatMessage {
    let content = match m.content {
        Content::Null => None,
        Content::Text(text) => Some(chat_message::Content::Text(text)),
        Content::Parts(parts) => Some(chat_message::Content::Parts(ContentParts {
            parts: parts
                .into_iter()
                .map(|p| ContentPart {
                    r#type: p.kind,
                    text: p.text,
                })
                .collect(),
        })),
    };
    ChatMessage {
        role: m.role,
        content,
        tool_calls: m
            .tool_calls
            .into_iter()
            .map(|c| ToolCall {
                id: c.id.unwrap_or_default(),
                r#type: c.kind.unwrap_or_default(),
                name: c.name,
                arguments: c.arguments,
            })
            .collect(),
        tool_call_id: m.tool_call_id.unwrap_or_default(),
        name: m.name.unwrap_or_default(),
        reasoning: m.reasoning,
    }
}

fn completion_prompt(prompt: Prompt) -> CompletionPrompt {
    use completion_prompt::Kind;
    let kind = match prompt {
        Prompt::Text(text) => Kind::Text(text),
        Prompt::Texts(texts) => Kind::Texts(Texts { texts }),
        Prompt::Ids(ids) => Kind::TokenIds(TokenIds { ids }),
        Prompt::IdBatch(batch) => Kind::TokenIdBatch(TokenIdBatch {
            prompts: batch.into_iter().map(|ids| TokenIds { ids }).collect(),
        }),
    };
    CompletionPrompt { kind: Some(kind) }
}

#[cfg(test)]
mod tests;
