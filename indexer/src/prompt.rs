//! The prompt-deciding fields of a `PickRequest` (proto) as the tokenizer's
//! domain types. Wire format at the edge: nothing past here sees proto types.

use kvsteer_proto::v1 as pb;
use kvsteer_tokenize::{
    ChatMessage, ChatRequest, CompletionPrompt, Content, ContentPart, ToolCall,
};
use serde_json::{Map, Value};

/// What to tokenize.
#[derive(Debug, Clone, PartialEq)]
pub enum Prompt {
    Chat(ChatRequest),
    Completion {
        prompt: CompletionPrompt,
        add_special_tokens: Option<bool>,
    },
}

// === impl Prompt ===

impl Prompt {
    /// Bytes of text the tokenizer would encode for the pick (every text
    /// field the chat template can render; the first prompt of a
    /// completions batch, the only one routed on; 0 for token ids). The
    /// template adds a few bytes per message. Cheap: no copy, no rendering.
    pub fn text_bytes(&self) -> usize {
        match self {
            Self::Chat(chat) => {
                let messages: usize = chat.messages.iter().map(message_bytes).sum();
                let tools: usize = chat.tools.iter().flatten().map(json_bytes).sum();
                let kwargs: usize = chat
                    .chat_template_kwargs
                    .iter()
                    .map(|(k, v)| k.len() + json_bytes(v))
                    .sum();
                messages + tools + kwargs + opt_len(&chat.reasoning_effort)
            }
            Self::Completion { prompt, .. } => match prompt {
                CompletionPrompt::Text(t) => t.len(),
                CompletionPrompt::Texts(t) => t.first().map_or(0, String::len),
                CompletionPrompt::Ids(_) | CompletionPrompt::IdBatch(_) => 0,
            },
        }
    }
}

fn message_bytes(m: &ChatMessage) -> usize {
    let content = match &m.content {
        Content::Null => 0,
        Content::Text(t) => t.len(),
        Content::Parts(parts) => parts.iter().map(|p| p.kind.len() + opt_len(&p.text)).sum(),
    };
    let calls: usize = m
        .tool_calls
        .iter()
        .map(|t| opt_len(&t.id) + opt_len(&t.kind) + t.name.len() + opt_len(&t.arguments))
        .sum();
    m.role.len()
        + content
        + calls
        + opt_len(&m.tool_call_id)
        + opt_len(&m.name)
        + opt_len(&m.reasoning)
}

/// About the length of `v` serialized (strings and keys exactly, scalars
/// roughly): what a template printing it would add.
fn json_bytes(v: &Value) -> usize {
    match v {
        Value::String(s) => s.len() + 2,
        Value::Array(items) => 2 + items.iter().map(|v| json_bytes(v) + 1).sum::<usize>(),
        Value::Object(map) => {
            2 + map
                .iter()
                .map(|(k, v)| k.len() + 4 + json_bytes(v))
                .sum::<usize>()
        }
        Value::Null | Value::Bool(_) | Value::Number(_) => 8,
    }
}

fn opt_len(s: &Option<String>) -> usize {
    s.as_ref().map_or(0, String::len)
}

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum PromptError {
    #[error("api kind {0} is not supported")]
    UnsupportedApi(i32),
    #[error("completions request without a prompt")]
    MissingPrompt,
    #[error("{field}: invalid JSON: {reason}")]
    Json { field: &'static str, reason: String },
}

/// Converts the proto fields; errors name the field.
pub fn from_proto(req: &pb::PickRequest) -> Result<Prompt, PromptError> {
    match pb::ApiKind::try_from(req.api) {
        // A `/v1/messages` body arrives converted to chat by the filter
        // (`kvsteer-openai-body`), exactly as vLLM converts it.
        Ok(pb::ApiKind::Chat | pb::ApiKind::Messages) => chat(req).map(Prompt::Chat),
        Ok(pb::ApiKind::Completions) => {
            let kind = req
                .prompt
                .as_ref()
                .and_then(|p| p.kind.as_ref())
                .ok_or(PromptError::MissingPrompt)?;
            Ok(Prompt::Completion {
                prompt: completion(kind),
                add_special_tokens: req.add_special_tokens,
            })
        }
        _ => Err(PromptError::UnsupportedApi(req.api)),
    }
}

fn chat(req: &pb::PickRequest) -> Result<ChatRequest, PromptError> {
    let tools = match req.tools_json.as_str() {
        "" => None,
        text => match parse("tools_json", text)? {
            Value::Array(items) => Some(items),
            Value::Null => None,
            _ => return Err(not("tools_json", "an array")),
        },
    };
    let chat_template_kwargs = match req.chat_template_kwargs_json.as_str() {
        "" => Map::new(),
        text => match parse("chat_template_kwargs_json", text)? {
            Value::Object(map) => map,
            Value::Null => Map::new(),
            _ => return Err(not("chat_template_kwargs_json", "an object")),
        },
    };
    Ok(ChatRequest {
        messages: req.messages.iter().map(message).collect(),
        tools,
        chat_template_kwargs,
        add_generation_prompt: req.add_generation_prompt,
        continue_final_message: req.continue_final_message,
        add_special_tokens: req.add_special_tokens,
        reasoning_effort: non_empty(&req.reasoning_effort),
    })
}

fn message(m: &pb::ChatMessage) -> ChatMessage {
    use pb::chat_message::Content as C;
    let content = match &m.content {
        None => Content::Null,
        Some(C::Text(t)) => Content::Text(t.clone()),
        Some(C::Parts(parts)) => Content::Parts(
            parts
                .parts
                .iter()
                .map(|p| ContentPart {
                    kind: p.r#type.clone(),
                    text: p.text.clone(),
                })
                .collect(),
        ),
    };
    ChatMessage {
        role: m.role.clone(),
        content,
        tool_calls: m
            .tool_calls
            .iter()
            .map(|t| ToolCall {
                id: non_empty(&t.id),
                kind: non_empty(&t.r#type),
                name: t.name.clone(),
                arguments: t.arguments.clone(),
            })
            .collect(),
        tool_call_id: non_empty(&m.tool_call_id),
        name: non_empty(&m.name),
        reasoning: m.reasoning.clone(),
    }
}

fn completion(kind: &pb::completion_prompt::Kind) -> CompletionPrompt {
    use pb::completion_prompt::Kind as K;
    match kind {
        K::Text(t) => CompletionPrompt::Text(t.clone()),
        K::TokenIds(ids) => CompletionPrompt::Ids(ids.ids.clone()),
        K::Texts(t) => CompletionPrompt::Texts(t.texts.clone()),
        K::TokenIdBatch(b) => {
            CompletionPrompt::IdBatch(b.prompts.iter().map(|p| p.ids.clone()).collect())
        }
    }
}

fn parse(field: &'static str, text: &str) -> Result<Value, PromptError> {
    serde_json::from_str(text).map_err(|e| PromptError::Json {
        field,
        reason: e.to_string(),
    })
}

fn not(field: &'static str, what: &str) -> PromptError {
    PromptError::Json {
        field,
        reason: format!("not {what}"),
    }
}

fn non_empty(s: &str) -> Option<String> {
    (!s.is_empty()).then(|| s.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chat_req() -> pb::PickRequest {
        pb::PickRequest {
            api: pb::ApiKind::Chat as i32,
            messages: vec![
                pb::ChatMessage {
                    role: "user".into(),
                    content: Some(pb::chat_message::Content::Parts(pb::ContentParts {
                        parts: vec![pb::ContentPart {
                            r#type: "text".into(),
                            text: Some("hi".into()),
                        }],
                    })),
                    ..Default::default()
                },
                pb::ChatMessage {
                    role: "assistant".into(),
                    tool_calls: vec![pb::ToolCall {
                        id: "c1".into(),
                        r#type: "function".into(),
                        name: "f".into(),
                        arguments: Some("{}".into()),
                    }],
                    reasoning: Some("hmm".into()),
                    ..Default::default()
                },
            ],
            tools_json: r#"[{"type":"function"}]"#.into(),
            chat_template_kwargs_json: r#"{"enable_thinking":false}"#.into(),
            add_generation_prompt: Some(true),
            reasoning_effort: "low".into(),
            ..Default::default()
        }
    }

    #[test]
    fn chat_fields_map_one_to_one() {
        let Prompt::Chat(c) = from_proto(&chat_req()).unwrap() else {
            panic!("not chat");
        };
        assert_eq!(c.messages.len(), 2);
        assert_eq!(
            c.messages[0].content,
            Content::Parts(vec![ContentPart {
                kind: "text".into(),
                text: Some("hi".into())
            }])
        );
        assert_eq!(c.messages[1].content, Content::Null);
        assert_eq!(c.messages[1].tool_calls[0].id.as_deref(), Some("c1"));
        assert_eq!(c.messages[1].tool_call_id, None);
        assert_eq!(c.messages[1].reasoning.as_deref(), Some("hmm"));
        assert_eq!(c.tools.as_ref().map(Vec::len), Some(1));
        assert_eq!(
            c.chat_template_kwargs["enable_thinking"],
            Value::Bool(false)
        );
        assert_eq!(c.reasoning_effort.as_deref(), Some("low"));
        assert_eq!(c.add_generation_prompt, Some(true));
    }

    #[test]
    fn bad_json_names_the_field() {
        let mut r = chat_req();
        r.tools_json = "{nope".into();
        let e = from_proto(&r).unwrap_err().to_string();
        assert!(e.starts_with("tools_json"), "{e}");
        r.tools_json = String::new();
        r.chat_template_kwargs_json = "[1]".into();
        let e = from_proto(&r).unwrap_err().to_string();
        assert!(e.starts_with("chat_template_kwargs_json"), "{e}");
    }

    /// Every text field counts: a prompt cannot hide its size in a tool
    /// call's arguments, its reasoning or the tool schemas.
    #[test]
    fn text_bytes_counts_every_rendered_field() {
        let Prompt::Chat(base) = from_proto(&chat_req()).unwrap() else {
            panic!("not chat");
        };
        let size = |c: &ChatRequest| Prompt::Chat(c.clone()).text_bytes();
        let small = size(&base);
        assert!(small > "hi".len() + "hmm".len(), "{small}");
        let big = "x".repeat(10_000);
        let mut c = base.clone();
        c.messages[1].tool_calls[0].arguments = Some(big.clone());
        assert!(size(&c) >= small + 9_990);
        let mut c = base.clone();
        c.messages[1].reasoning = Some(big.clone());
        assert!(size(&c) >= small + 9_990);
        let mut c = base.clone();
        c.tools = Some(vec![serde_json::json!({"description": big})]);
        assert!(size(&c) >= small + 9_990);
        let mut c = base.clone();
        c.messages[0].content = Content::Text(big.clone());
        assert!(size(&c) >= 10_000);
        // A completions batch is routed on its first prompt only.
        let batch = Prompt::Completion {
            prompt: CompletionPrompt::Texts(vec!["abc".into(), big]),
            add_special_tokens: None,
        };
        assert_eq!(batch.text_bytes(), 3);
        let ids = Prompt::Completion {
            prompt: CompletionPrompt::Ids(vec![1; 100]),
            add_special_tokens: None,
        };
        assert_eq!(ids.text_bytes(), 0);
    }

    #[test]
    fn completions_and_unsupported() {
        let mut r = pb::PickRequest {
            api: pb::ApiKind::Completions as i32,
            add_special_tokens: Some(false),
            ..Default::default()
        };
        assert_eq!(from_proto(&r), Err(PromptError::MissingPrompt));
        r.prompt = Some(pb::CompletionPrompt {
            kind: Some(pb::completion_prompt::Kind::TokenIdBatch(
                pb::TokenIdBatch {
                    prompts: vec![pb::TokenIds { ids: vec![1, 2] }],
                },
            )),
        });
        assert_eq!(
            from_proto(&r).unwrap(),
            Prompt::Completion {
                prompt: CompletionPrompt::IdBatch(vec![vec![1, 2]]),
                add_special_tokens: Some(false),
            }
        );
        r.api = pb::ApiKind::Unspecified as i32;
        assert_eq!(from_proto(&r), Err(PromptError::UnsupportedApi(0)));
        r.api = 9;
        assert_eq!(from_proto(&r), Err(PromptError::UnsupportedApi(9)));
    }

    /// The filter sends a `/v1/messages` body already converted to chat:
    /// it reads exactly as the same messages sent as chat.
    #[test]
    fn messages_read_as_chat() {
        let mut r = pb::PickRequest {
            api: pb::ApiKind::Chat as i32,
            messages: vec![pb::ChatMessage {
                role: "user".into(),
                content: Some(pb::chat_message::Content::Text("hi".into())),
                ..Default::default()
            }],
            ..Default::default()
        };
        let chat = from_proto(&r).unwrap();
        assert!(matches!(chat, Prompt::Chat(_)));
        r.api = pb::ApiKind::Messages as i32;
        assert_eq!(from_proto(&r).unwrap(), chat);
    }
}
