//! OpenAI JSON bodies → the domain types of [`crate::request`].
//!
//! Only the prompt-deciding fields are read; sampling fields are ignored.
//! Every malformed field is an [`Error::InvalidRequest`] naming the field.

use serde_json::{Map, Value};

use crate::error::Error;
use crate::request::{ChatMessage, ChatRequest, CompletionPrompt, Content, ContentPart, ToolCall};

// === impl ChatRequest ===

impl ChatRequest {
    /// Reads a `/v1/chat/completions` body.
    pub fn from_openai(body: &Value) -> Result<ChatRequest, Error> {
        let obj = body
            .as_object()
            .ok_or_else(|| Error::invalid("request body must be a JSON object"))?;
        let messages = match obj.get("messages") {
            Some(Value::Array(items)) => items
                .iter()
                .enumerate()
                .map(|(i, m)| parse_message(i, m))
                .collect::<Result<Vec<_>, _>>()?,
            Some(_) => return Err(Error::invalid("`messages` must be an array")),
            None => return Err(Error::invalid("`messages` is required")),
        };
        let tools = match obj.get("tools") {
            None | Some(Value::Null) => None,
            Some(Value::Array(tools)) => Some(tools.clone()),
            Some(_) => return Err(Error::invalid("`tools` must be an array or null")),
        };
        let chat_template_kwargs = match obj.get("chat_template_kwargs") {
            None | Some(Value::Null) => Map::new(),
            Some(Value::Object(kwargs)) => kwargs.clone(),
            Some(_) => {
                return Err(Error::invalid(
                    "`chat_template_kwargs` must be an object or null",
                ));
            }
        };
        Ok(ChatRequest {
            messages,
            tools,
            chat_template_kwargs,
            add_generation_prompt: opt_bool(obj, "add_generation_prompt")?,
            continue_final_message: opt_bool(obj, "continue_final_message")?,
            add_special_tokens: opt_bool(obj, "add_special_tokens")?,
            reasoning_effort: opt_str(obj, "reasoning_effort", "")?,
        })
    }
}

fn parse_message(i: usize, value: &Value) -> Result<ChatMessage, Error> {
    let obj = value
        .as_object()
        .ok_or_else(|| Error::invalid(format!("`messages[{i}]` must be an object")))?;
    let at = format!("messages[{i}].");
    let role = match obj.get("role") {
        Some(Value::String(role)) => role.clone(),
        Some(_) => return Err(Error::invalid(format!("`{at}role` must be a string"))),
        None => return Err(Error::invalid(format!("`{at}role` is required"))),
    };
    let content = match obj.get("content") {
        None | Some(Value::Null) => Content::Null,
        Some(Value::String(text)) => Content::Text(text.clone()),
        Some(Value::Array(parts)) => Content::Parts(
            parts
                .iter()
                .enumerate()
                .map(|(j, p)| parse_part(&format!("{at}content[{j}]"), p))
                .collect::<Result<_, _>>()?,
        ),
        Some(_) => {
            return Err(Error::invalid(format!(
                "`{at}content` must be a string, an array of content parts, or null"
            )));
        }
    };
    let tool_calls = match obj.get("tool_calls") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Array(calls)) => calls
            .iter()
            .enumerate()
            .map(|(j, c)| parse_tool_call(&format!("{at}tool_calls[{j}]"), c))
            .collect::<Result<_, _>>()?,
        Some(_) => {
            return Err(Error::invalid(format!(
                "`{at}tool_calls` must be an array or null"
            )));
        }
    };
    let reasoning = match opt_str(obj, "reasoning", &at)? {
        Some(r) => Some(r),
        None => opt_str(obj, "reasoning_content", &at)?,
    };
    Ok(ChatMessage {
        role,
        content,
        tool_calls,
        tool_call_id: opt_str(obj, "tool_call_id", &at)?,
        name: opt_str(obj, "name", &at)?,
        reasoning,
    })
}

fn parse_part(at: &str, value: &Value) -> Result<ContentPart, Error> {
    let obj = match value {
        // A bare string in a parts array reads as a text part.
        Value::String(text) => {
            return Ok(ContentPart {
                kind: "text".to_owned(),
                text: Some(text.clone()),
            });
        }
        Value::Object(obj) => obj,
        _ => return Err(Error::invalid(format!("`{at}` must be an object"))),
    };
    let kind = match obj.get("type") {
        Some(Value::String(kind)) => kind.clone(),
        Some(_) => return Err(Error::invalid(format!("`{at}.type` must be a string"))),
        None => return Err(Error::invalid(format!("`{at}.type` is required"))),
    };
    let text = match kind.as_str() {
        "text" | "refusal" | "thinking" => opt_str(obj, &kind, &format!("{at}."))?,
        _ => None,
    };
    Ok(ContentPart { kind, text })
}

fn parse_tool_call(at: &str, value: &Value) -> Result<ToolCall, Error> {
    let obj = value
        .as_object()
        .ok_or_else(|| Error::invalid(format!("`{at}` must be an object")))?;
    let prefix = format!("{at}.");
    let function = match obj.get("function") {
        Some(Value::Object(f)) => f,
        Some(_) => {
            return Err(Error::invalid(format!("`{at}.function` must be an object")));
        }
        None => return Err(Error::invalid(format!("`{at}.function` is required"))),
    };
    let fprefix = format!("{at}.function.");
    let name = opt_str(function, "name", &fprefix)?
        .ok_or_else(|| Error::invalid(format!("`{fprefix}name` is required")))?;
    let arguments = match function.get("arguments") {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) => Some(s.clone()),
        Some(other) => Some(other.to_string()),
    };
    Ok(ToolCall {
        id: opt_str(obj, "id", &prefix)?,
        kind: opt_str(obj, "type", &prefix)?,
        name,
        arguments,
    })
}

fn opt_bool(obj: &Map<String, Value>, key: &str) -> Result<Option<bool>, Error> {
    match obj.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Bool(b)) => Ok(Some(*b)),
        Some(_) => Err(Error::invalid(format!("`{key}` must be a boolean"))),
    }
}

fn opt_str(obj: &Map<String, Value>, key: &str, at: &str) -> Result<Option<String>, Error> {
    match obj.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(_) => Err(Error::invalid(format!("`{at}{key}` must be a string"))),
    }
}

// === impl CompletionPrompt ===

impl CompletionPrompt {
    /// Reads `prompt` of a `/v1/completions` body: a string, a list of
    /// strings, a list of token ids, or a list of token-id lists.
    pub fn from_openai(body: &Value) -> Result<CompletionPrompt, Error> {
        let obj = body
            .as_object()
            .ok_or_else(|| Error::invalid("request body must be a JSON object"))?;
        let items = match obj.get("prompt") {
            Some(Value::String(text)) => return Ok(CompletionPrompt::Text(text.clone())),
            Some(Value::Array(items)) => items,
            None | Some(Value::Null) => return Err(Error::invalid("`prompt` is required")),
            Some(_) => {
                return Err(Error::invalid(
                    "`prompt` must be a string, a list of strings, a list of token ids, \
                     or a list of token-id lists",
                ));
            }
        };
        match items.first() {
            None => Err(Error::invalid("`prompt` must not be an empty list")),
            Some(Value::String(_)) => items
                .iter()
                .enumerate()
                .map(|(i, v)| match v {
                    Value::String(s) => Ok(s.clone()),
                    _ => Err(Error::invalid(format!(
                        "`prompt[{i}]` must be a string like the other elements"
                    ))),
                })
                .collect::<Result<_, _>>()
                .map(CompletionPrompt::Texts),
            Some(Value::Number(_)) => token_ids("prompt", items).map(CompletionPrompt::Ids),
            Some(Value::Array(_)) => items
                .iter()
                .enumerate()
                .map(|(i, v)| match v {
                    Value::Array(ids) if !ids.is_empty() => token_ids(&format!("prompt[{i}]"), ids),
                    Value::Array(_) => {
                        Err(Error::invalid(format!("`prompt[{i}]` must not be empty")))
                    }
                    _ => Err(Error::invalid(format!(
                        "`prompt[{i}]` must be a list of token ids like the other elements"
                    ))),
                })
                .collect::<Result<_, _>>()
                .map(CompletionPrompt::IdBatch),
            Some(_) => Err(Error::invalid(
                "`prompt` list elements must be strings, token ids, or token-id lists",
            )),
        }
    }
}

fn token_ids(at: &str, items: &[Value]) -> Result<Vec<u32>, Error> {
    items
        .iter()
        .enumerate()
        .map(|(i, v)| {
            v.as_u64()
                .and_then(|id| u32::try_from(id).ok())
                .ok_or_else(|| Error::invalid(format!("`{at}[{i}]` must be a token id (0..2^32)")))
        })
        .collect()
}

#[cfg(test)]
mod tests;
