//! `/v1/chat/completions`: messages, content parts, tool calls, tools.
//!
//! Which content parts carry prompt text follows vLLM's own parser
//! (`vllm/entrypoints/chat_utils.py`, `MM_PARSER_MAP` and
//! `_parse_chat_message_content_part`): `text`, `input_text` and
//! `output_text` (`.text`), `refusal` (`.refusal`), `thinking`
//! (`.thinking`) and `tool_reference` (`.name`) are text; media parts
//! (`image_url`, `input_audio`, ...) add no text for a text-only model;
//! a part without a `type` (or with a `uuid`) gets the type its payload
//! field names, as vLLM infers it.

use serde_json::{Map, Value};

use crate::error::{BodyError, wrong};
use crate::field::{self, At, Object};

/// The chat fields of a body that decide the prompt.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Chat {
    pub messages: Vec<Message>,
    /// `tools` as sent; `None` when absent or `null`.
    pub tools: Option<Vec<Value>>,
    /// `chat_template_kwargs` as sent; `None` when absent or `null`.
    pub chat_template_kwargs: Option<Map<String, Value>>,
    pub add_generation_prompt: Option<bool>,
    pub continue_final_message: Option<bool>,
    pub reasoning_effort: Option<String>,
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct Message {
    pub role: String,
    pub content: Content,
    pub tool_calls: Vec<ToolCall>,
    pub tool_call_id: Option<String>,
    pub name: Option<String>,
    /// `reasoning`, else the older `reasoning_content`.
    pub reasoning: Option<String>,
}

#[derive(Clone, Debug, Default, PartialEq)]
pub enum Content {
    /// Absent or `null`.
    #[default]
    Null,
    Text(String),
    Parts(Vec<Part>),
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct Part {
    /// The part's `type` (inferred when the body leaves it out).
    pub kind: String,
    /// The text a text-like part carries; `None` for media and unknown
    /// parts, and for text parts without text (vLLM skips both).
    pub text: Option<String>,
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct ToolCall {
    pub id: Option<String>,
    /// The call's `type` (normally `function`).
    pub kind: Option<String>,
    pub name: String,
    /// `function.arguments`: the JSON string as sent, or the JSON text of a
    /// non-string value sent in its place; `None` for absent or `null`.
    pub arguments: Option<String>,
}

/// The key holding the text of a part of type `kind`, for the types vLLM
/// renders as text; `None` for every other type.
pub fn text_key(kind: &str) -> Option<&'static str> {
    match kind {
        "text" | "input_text" | "output_text" => Some("text"),
        "refusal" => Some("refusal"),
        "thinking" => Some("thinking"),
        "tool_reference" => Some("name"),
        _ => None,
    }
}

/// Payload fields vLLM infers a part's type from when `type` is missing, in
/// its order.
const INFERRED_KINDS: [&str; 9] = [
    "image_url",
    "image_pil",
    "image_embeds",
    "audio_embeds",
    "prompt_embeds",
    "audio_url",
    "input_audio",
    "video_url",
    "tool_reference",
];

pub(crate) fn chat(obj: &mut Object) -> Result<Chat, BodyError> {
    let messages = match obj.remove("messages") {
        Some(Value::Array(items)) => items
            .into_iter()
            .enumerate()
            .map(|(i, m)| message(i, m))
            .collect::<Result<_, _>>()?,
        None | Some(Value::Null) => return Err(BodyError::Missing("messages".into())),
        Some(_) => return Err(wrong("messages", "an array")),
    };
    let tools = match obj.remove("tools") {
        None | Some(Value::Null) => None,
        Some(Value::Array(tools)) => Some(tools),
        Some(_) => return Err(wrong("tools", "an array or null")),
    };
    let chat_template_kwargs = match obj.remove("chat_template_kwargs") {
        None | Some(Value::Null) => None,
        Some(Value::Object(kwargs)) => Some(kwargs),
        Some(_) => return Err(wrong("chat_template_kwargs", "an object or null")),
    };
    Ok(Chat {
        messages,
        tools,
        chat_template_kwargs,
        add_generation_prompt: field::boolean(obj, "add_generation_prompt")?,
        continue_final_message: field::boolean(obj, "continue_final_message")?,
        reasoning_effort: field::string(obj, "reasoning_effort", At::Top)?,
    })
}

fn message(i: usize, value: Value) -> Result<Message, BodyError> {
    let at = At::Message(i);
    let Value::Object(mut obj) = value else {
        return Err(wrong(at.node(), "an object"));
    };
    let role =
        field::string(&mut obj, "role", at)?.ok_or_else(|| BodyError::Missing(at.field("role")))?;
    let content = match obj.remove("content") {
        None | Some(Value::Null) => Content::Null,
        Some(Value::String(text)) => Content::Text(text),
        Some(Value::Array(parts)) => Content::Parts(
            parts
                .into_iter()
                .enumerate()
                .map(|(j, p)| part(p, At::Part(i, j)))
                .collect::<Result<_, _>>()?,
        ),
        Some(_) => {
            return Err(wrong(
                at.field("content"),
                "a string, an array of content parts or null",
            ));
        }
    };
    let tool_calls = match obj.remove("tool_calls") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Array(calls)) => calls
            .into_iter()
            .enumerate()
            .map(|(j, c)| tool_call(c, i, j))
            .collect::<Result<_, _>>()?,
        Some(_) => return Err(wrong(at.field("tool_calls"), "an array or null")),
    };
    let reasoning = match field::string(&mut obj, "reasoning", at)? {
        Some(r) => Some(r),
        None => field::string(&mut obj, "reasoning_content", at)?,
    };
    Ok(Message {
        role,
        content,
        tool_calls,
        tool_call_id: field::string(&mut obj, "tool_call_id", at)?,
        name: field::string(&mut obj, "name", at)?,
        reasoning,
    })
}

/// A content part: a bare string (text) or an object.
fn part(value: Value, at: At) -> Result<Part, BodyError> {
    let mut obj = match value {
        Value::String(text) => {
            return Ok(Part {
                kind: "text".to_owned(),
                text: Some(text),
            });
        }
        Value::Object(obj) => obj,
        _ => return Err(wrong(at.node(), "a string or an object")),
    };
    let has_uuid = !matches!(obj.get("uuid"), None | Some(Value::Null));
    let kind = match obj.remove("type") {
        Some(Value::String(kind)) if !has_uuid => kind,
        // No type, or a uuid: vLLM goes by the payload field instead.
        None | Some(Value::Null) | Some(Value::String(_)) => INFERRED_KINDS
            .into_iter()
            .find(|k| match obj.get(*k) {
                None => false,
                // vLLM tests `input_audio` for a value, the others for presence.
                Some(Value::Null) => *k != "input_audio",
                Some(_) => true,
            })
            .ok_or_else(|| BodyError::Missing(at.field("type")))?
            .to_owned(),
        Some(_) => return Err(wrong(at.field("type"), "a string")),
    };
    let text = match text_key(&kind) {
        Some(key) => field::string(&mut obj, key, at)?,
        None => None,
    };
    Ok(Part { kind, text })
}

fn tool_call(value: Value, i: usize, j: usize) -> Result<ToolCall, BodyError> {
    let at = At::Call(i, j);
    let Value::Object(mut obj) = value else {
        return Err(wrong(at.node(), "an object"));
    };
    let mut function = match obj.remove("function") {
        Some(Value::Object(f)) => f,
        None | Some(Value::Null) => return Err(BodyError::Missing(at.field("function"))),
        Some(_) => return Err(wrong(at.field("function"), "an object")),
    };
    let fat = At::Function(i, j);
    let name = field::string(&mut function, "name", fat)?
        .ok_or_else(|| BodyError::Missing(fat.field("name")))?;
    let arguments = match function.remove("arguments") {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) => Some(s),
        Some(other) => Some(other.to_string()),
    };
    Ok(ToolCall {
        id: field::string(&mut obj, "id", at)?,
        kind: field::string(&mut obj, "type", at)?,
        name,
        arguments,
    })
}
