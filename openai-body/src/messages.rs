//! `/v1/messages` (Anthropic Messages API) → the chat request vLLM makes of it.
//!
//! vLLM (0.32) serves `/v1/messages` by converting the body into a chat
//! request (`vllm/entrypoints/anthropic/serving.py`,
//! `to_chat_completion_request`) and rendering that with the chat template.
//! This module performs the same conversion, so the chat path tokenizes a
//! messages body exactly as vLLM does:
//!
//! - `system` (a string, or its non-empty text blocks concatenated with no
//!   separator) becomes a leading system message; text blocks starting with
//!   `x-anthropic-billing-header` are dropped.
//! - A `system`-role message stays in place as a system message with its
//!   text (same rules), or is dropped when it has none. (vLLM merges them
//!   into the leading one instead only for templates that reject a late
//!   system message, which Qwen3's does not.)
//! - `thinking: {"type": "disabled"}` sets `reasoning_effort` to `none`
//!   (over `output_config.effort`); other thinking types change nothing
//!   in the prompt.
//! - Blocks: non-empty `text` → a text part; `image` → an image part (no
//!   text); `thinking` → the message's `reasoning` (joined with no
//!   separator); `tool_use` → a tool call whose arguments are `input`;
//!   `tool_result` in a user message → a `tool` message (its text items
//!   joined with `"\n"`) emitted *before* the user message, then a user
//!   message with its images, then a `tool` message holding its
//!   `tool_reference` parts (the referenced tool names); `tool_result` in
//!   another role → a text part `"Tool result: …"`; `redacted_thinking`
//!   and top-level `tool_reference` blocks add nothing.
//! - One text part becomes plain string content; a user message left with
//!   no content is dropped.
//! - `tools[]` → `{"type": "function", "function": {name, description,
//!   parameters: input_schema (with "type": "object" added when missing),
//!   strict, defer_loading}}`.

use serde_json::{Map, Value, json};

use crate::chat::{Chat, Content, Message, Part, ToolCall};
use crate::error::{BodyError, wrong};
use crate::field::Object;

/// The prefix of Claude Code's per-request attribution block, which vLLM
/// drops from the system prompt to keep prefix caching working.
const BILLING_HEADER: &str = "x-anthropic-billing-header";

pub(crate) fn messages(obj: &mut Object) -> Result<Chat, BodyError> {
    let items = match obj.remove("messages") {
        Some(Value::Array(items)) => items,
        None | Some(Value::Null) => return Err(BodyError::Missing("messages".into())),
        Some(_) => return Err(wrong("messages", "an array")),
    };
    let mut parsed = Vec::with_capacity(items.len());
    for (i, item) in items.into_iter().enumerate() {
        parsed.push(anthropic_message(i, item)?);
    }

    let system = match obj.remove("system") {
        None | Some(Value::Null) => String::new(),
        Some(Value::String(s)) => s,
        Some(Value::Array(blocks)) => {
            let blocks = blocks
                .into_iter()
                .enumerate()
                .map(|(j, b)| block(b, || format!("system[{j}]")))
                .collect::<Result<Vec<_>, _>>()?;
            system_text(&blocks)
        }
        Some(_) => return Err(wrong("system", "a string, an array of blocks or null")),
    };
    let mut out = Vec::new();
    if !system.is_empty() {
        out.push(Message {
            role: "system".into(),
            content: Content::Text(system),
            ..Message::default()
        });
    }
    for m in parsed {
        if m.role == "system" {
            let text = match m.content {
                AnthropicContent::Text(t) if t.starts_with(BILLING_HEADER) => String::new(),
                AnthropicContent::Text(t) => t,
                AnthropicContent::Blocks(blocks) => system_text(&blocks),
            };
            if !text.is_empty() {
                out.push(Message {
                    role: "system".into(),
                    content: Content::Text(text),
                    ..Message::default()
                });
            }
        } else {
            convert_message(m, &mut out);
        }
    }

    let tools = match obj.remove("tools") {
        None | Some(Value::Null) => None,
        Some(Value::Array(tools)) => Some(
            tools
                .into_iter()
                .enumerate()
                .map(|(i, t)| tool(i, t))
                .collect::<Result<_, _>>()?,
        ),
        Some(_) => return Err(wrong("tools", "an array or null")),
    };
    let chat_template_kwargs = match obj.remove("chat_template_kwargs") {
        None | Some(Value::Null) => None,
        Some(Value::Object(kwargs)) => Some(kwargs),
        Some(_) => return Err(wrong("chat_template_kwargs", "an object or null")),
    };
    let mut reasoning_effort = match obj.get("output_config") {
        Some(Value::Object(cfg)) => match cfg.get("effort") {
            None | Some(Value::Null) => None,
            Some(Value::String(e)) => Some(e.clone()),
            Some(_) => return Err(wrong("output_config.effort", "a string")),
        },
        None | Some(Value::Null) => None,
        Some(_) => return Err(wrong("output_config", "an object or null")),
    };
    match obj.get("thinking") {
        None | Some(Value::Null) => {}
        Some(Value::Object(t)) => match t.get("type").and_then(Value::as_str) {
            Some("disabled") => reasoning_effort = Some("none".into()),
            Some("enabled" | "adaptive") => {}
            _ => return Err(wrong("thinking.type", "enabled, disabled or adaptive")),
        },
        Some(_) => return Err(wrong("thinking", "an object or null")),
    }
    Ok(Chat {
        messages: out,
        tools,
        chat_template_kwargs,
        add_generation_prompt: None,
        continue_final_message: None,
        reasoning_effort,
    })
}

// === Anthropic shapes ===

struct AnthropicMessage {
    role: String,
    content: AnthropicContent,
}

enum AnthropicContent {
    Text(String),
    Blocks(Vec<Block>),
}

/// A content block, with the fields the conversion reads.
#[derive(Default)]
struct Block {
    kind: String,
    text: Option<String>,
    has_source: bool,
    id: Option<String>,
    tool_use_id: Option<String>,
    name: Option<String>,
    input: Option<Map<String, Value>>,
    content: Option<Value>,
    thinking: Option<String>,
}

fn anthropic_message(i: usize, value: Value) -> Result<AnthropicMessage, BodyError> {
    let at = |key: &str| format!("messages[{i}].{key}");
    let Value::Object(mut obj) = value else {
        return Err(wrong(format!("messages[{i}]"), "an object"));
    };
    let role = match obj.remove("role") {
        Some(Value::String(r)) => match r.as_str() {
            "user" | "assistant" | "system" => r,
            _ => return Err(wrong(at("role"), "user, assistant or system")),
        },
        None | Some(Value::Null) => return Err(BodyError::Missing(at("role"))),
        Some(_) => return Err(wrong(at("role"), "a string")),
    };
    let content = match obj.remove("content") {
        Some(Value::String(s)) => AnthropicContent::Text(s),
        Some(Value::Array(blocks)) => AnthropicContent::Blocks(
            blocks
                .into_iter()
                .enumerate()
                .map(|(j, b)| block(b, || format!("messages[{i}].content[{j}]")))
                .collect::<Result<_, _>>()?,
        ),
        None | Some(Value::Null) => return Err(BodyError::Missing(at("content"))),
        Some(_) => return Err(wrong(at("content"), "a string or an array of blocks")),
    };
    Ok(AnthropicMessage { role, content })
}

fn block(value: Value, at: impl Fn() -> String) -> Result<Block, BodyError> {
    let Value::Object(mut obj) = value else {
        return Err(wrong(at(), "an object"));
    };
    let string = |obj: &mut Object, key: &str| match obj.remove(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s)),
        Some(_) => Err(wrong(format!("{}.{key}", at()), "a string")),
    };
    let kind = match string(&mut obj, "type")? {
        Some(k) => match k.as_str() {
            "text" | "image" | "tool_use" | "tool_result" | "tool_reference" | "thinking"
            | "redacted_thinking" => k,
            // They change `tools` mid-conversation (vLLM's `_resolve_tools`);
            // not followed here, so such a request is not steered.
            "tool_addition" | "tool_removal" => {
                return Err(wrong(
                    format!("{}.type", at()),
                    "a block type other than tool_addition/tool_removal (not supported)",
                ));
            }
            _ => return Err(wrong(format!("{}.type", at()), "a known block type")),
        },
        None => return Err(BodyError::Missing(format!("{}.type", at()))),
    };
    let has_source = match obj.get("source") {
        None | Some(Value::Null) => false,
        Some(Value::Object(s)) => !s.is_empty(),
        Some(_) => return Err(wrong(format!("{}.source", at()), "an object")),
    };
    let input = match obj.remove("input") {
        None | Some(Value::Null) => None,
        Some(Value::Object(m)) => Some(m),
        Some(_) => return Err(wrong(format!("{}.input", at()), "an object")),
    };
    let content = match obj.remove("content") {
        None | Some(Value::Null) => None,
        Some(v @ Value::String(_)) => Some(v),
        Some(Value::Array(items)) => {
            if items.iter().any(|item| !item.is_object()) {
                return Err(wrong(
                    format!("{}.content", at()),
                    "a string or an array of objects",
                ));
            }
            Some(Value::Array(items))
        }
        Some(_) => {
            return Err(wrong(
                format!("{}.content", at()),
                "a string or an array of objects",
            ));
        }
    };
    Ok(Block {
        text: string(&mut obj, "text")?,
        id: string(&mut obj, "id")?,
        tool_use_id: string(&mut obj, "tool_use_id")?,
        name: string(&mut obj, "name")?,
        thinking: string(&mut obj, "thinking")?,
        kind,
        has_source,
        input,
        content,
    })
}

fn system_text(blocks: &[Block]) -> String {
    blocks
        .iter()
        .filter(|b| b.kind == "text")
        .filter_map(|b| b.text.as_deref())
        .filter(|t| !t.is_empty() && !t.starts_with(BILLING_HEADER))
        .collect()
}

// === conversion ===

fn convert_message(m: AnthropicMessage, out: &mut Vec<Message>) {
    let blocks = match m.content {
        AnthropicContent::Text(text) => {
            out.push(Message {
                role: m.role,
                content: Content::Text(text),
                ..Message::default()
            });
            return;
        }
        AnthropicContent::Blocks(blocks) => blocks,
    };
    let mut parts: Vec<Part> = Vec::new();
    let mut calls = Vec::new();
    let mut reasoning: Option<String> = None;
    for b in blocks {
        match b.kind.as_str() {
            "text" => {
                if let Some(text) = b.text.filter(|t| !t.is_empty()) {
                    parts.push(text_part(text));
                }
            }
            "image" if b.has_source => parts.push(Part {
                kind: "image_url".into(),
                text: None,
            }),
            "thinking" => {
                if let Some(t) = b.thinking {
                    reasoning.get_or_insert_with(String::new).push_str(&t);
                }
            }
            "tool_use" => calls.push(ToolCall {
                id: Some(
                    b.id.filter(|id| !id.is_empty())
                        .unwrap_or_else(|| "call_0".into()),
                ),
                kind: Some("function".into()),
                name: b.name.unwrap_or_default(),
                arguments: Some(Value::Object(b.input.unwrap_or_default()).to_string()),
            }),
            "tool_result" if m.role == "user" => user_tool_result(b, out),
            "tool_result" => {
                let text = b.content.as_ref().map(python_str).unwrap_or_default();
                parts.push(text_part(format!("Tool result: {text}")));
            }
            // redacted_thinking, top-level tool_reference, image without source.
            _ => {}
        }
    }
    let has_content = !parts.is_empty();
    let content = if parts.len() == 1 && parts[0].kind == "text" {
        Content::Text(parts.pop().and_then(|p| p.text).unwrap_or_default())
    } else if has_content {
        Content::Parts(parts)
    } else {
        Content::Null
    };
    // vLLM drops a user message left without content (tool results only).
    if m.role == "user" && !has_content {
        return;
    }
    out.push(Message {
        role: m.role,
        content,
        tool_calls: calls,
        reasoning,
        ..Message::default()
    });
}

fn text_part(text: String) -> Part {
    Part {
        kind: "text".into(),
        text: Some(text),
    }
}

/// A user's `tool_result`: its text as a tool message, its images as a user
/// message, its `tool_reference` names as a second tool message.
fn user_tool_result(b: Block, out: &mut Vec<Message>) {
    let mut text = String::new();
    let mut images = 0usize;
    let mut references = Vec::new();
    match b.content {
        Some(Value::String(s)) => text = s,
        Some(Value::Array(items)) => {
            let mut texts = Vec::new();
            for item in items {
                let Value::Object(item) = item else { continue };
                match item.get("type").and_then(Value::as_str) {
                    Some("text") => texts.push(match item.get("text") {
                        Some(Value::String(s)) => s.clone(),
                        None => String::new(),
                        Some(other) => python_str(other),
                    }),
                    Some("image") => images += 1,
                    Some("tool_reference") => {
                        let name = [item.get("tool_name"), item.get("name")]
                            .into_iter()
                            .flatten()
                            .filter_map(Value::as_str)
                            .find(|n| !n.is_empty());
                        if let Some(name) = name {
                            references.push(Part {
                                kind: "tool_reference".into(),
                                text: Some(name.to_owned()),
                            });
                        }
                    }
                    _ => {}
                }
            }
            text = texts.join("\n");
        }
        _ => {}
    }
    let call_id = b.tool_use_id.unwrap_or_default();
    out.push(Message {
        role: "tool".into(),
        content: Content::Text(text),
        tool_call_id: Some(call_id.clone()),
        ..Message::default()
    });
    if images > 0 {
        out.push(Message {
            role: "user".into(),
            content: Content::Parts(
                (0..images)
                    .map(|_| Part {
                        kind: "image_url".into(),
                        text: None,
                    })
                    .collect(),
            ),
            ..Message::default()
        });
    }
    if !references.is_empty() {
        out.push(Message {
            role: "tool".into(),
            content: Content::Parts(references),
            tool_call_id: Some(call_id),
            ..Message::default()
        });
    }
}

fn tool(i: usize, value: Value) -> Result<Value, BodyError> {
    let at = |key: &str| format!("tools[{i}].{key}");
    let Value::Object(mut obj) = value else {
        return Err(wrong(format!("tools[{i}]"), "an object"));
    };
    let name = match obj.remove("name") {
        Some(Value::String(n)) => n,
        None | Some(Value::Null) => return Err(BodyError::Missing(at("name"))),
        Some(_) => return Err(wrong(at("name"), "a string")),
    };
    let description = match obj.remove("description") {
        None | Some(Value::Null) => Value::Null,
        Some(d @ Value::String(_)) => d,
        Some(_) => return Err(wrong(at("description"), "a string or null")),
    };
    let mut schema = match obj.remove("input_schema") {
        Some(Value::Object(s)) => s,
        None | Some(Value::Null) => return Err(BodyError::Missing(at("input_schema"))),
        Some(_) => return Err(wrong(at("input_schema"), "an object")),
    };
    if !schema.contains_key("type") {
        schema.insert("type".into(), Value::String("object".into()));
    }
    let mut flag = |key: &str| match obj.remove(key) {
        None | Some(Value::Null) => Ok(Value::Null),
        Some(b @ Value::Bool(_)) => Ok(b),
        Some(_) => Err(wrong(at(key), "a boolean or null")),
    };
    let strict = flag("strict")?;
    let defer_loading = flag("defer_loading")?;
    Ok(json!({
        "type": "function",
        "function": {
            "name": name,
            "description": description,
            "parameters": Value::Object(schema),
            "strict": strict,
            "defer_loading": defer_loading,
        }
    }))
}

/// Python's `str()` of a JSON value as pydantic hands it over: strings as
/// is, containers in `repr` form (`{'a': 1, 'b': [True, None]}`). vLLM
/// formats a non-user `tool_result` this way; an empty string or list
/// formats as nothing.
fn python_str(value: &Value) -> String {
    match value {
        Value::String(s) => s.clone(),
        Value::Array(a) if a.is_empty() => String::new(),
        other => {
            let mut out = String::new();
            python_repr(other, &mut out);
            out
        }
    }
}

fn python_repr(value: &Value, out: &mut String) {
    match value {
        Value::Null => out.push_str("None"),
        Value::Bool(true) => out.push_str("True"),
        Value::Bool(false) => out.push_str("False"),
        Value::Number(n) => out.push_str(&n.to_string()),
        Value::String(s) => repr_str(s, out),
        Value::Array(items) => {
            out.push('[');
            for (k, item) in items.iter().enumerate() {
                if k > 0 {
                    out.push_str(", ");
                }
                python_repr(item, out);
            }
            out.push(']');
        }
        Value::Object(map) => {
            out.push('{');
            for (k, (key, item)) in map.iter().enumerate() {
                if k > 0 {
                    out.push_str(", ");
                }
                repr_str(key, out);
                out.push_str(": ");
                python_repr(item, out);
            }
            out.push('}');
        }
    }
}

/// Python's `repr(str)`: single quotes unless the text holds `'` and no `"`.
fn repr_str(s: &str, out: &mut String) {
    let quote = if s.contains('\'') && !s.contains('"') {
        '"'
    } else {
        '\''
    };
    out.push(quote);
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c == quote => {
                out.push('\\');
                out.push(c);
            }
            c if (c as u32) < 0x20 || c as u32 == 0x7f => {
                out.push_str(&format!("\\x{:02x}", c as u32));
            }
            c => out.push(c),
        }
    }
    out.push(quote);
}

#[cfg(test)]
mod tests;
