//! vLLM's request normalisation: a [`ChatRequest`] → the variables the chat
//! template is rendered with (see `shared/chat-parity/README.md`, rules 2–9).

use serde_json::{Map, Value, json};

use crate::error::Error;
use crate::request::{ChatMessage, ChatRequest, Content};

const BILLING_HEADER: &str = "x-anthropic-billing-header";

/// What the template sees, before special tokens are added.
#[derive(Debug, Clone, PartialEq)]
pub struct TemplateInput {
    pub messages: Vec<Value>,
    /// Re-shaped tools; `None` when the request has none.
    pub tools: Option<Vec<Value>>,
    pub add_generation_prompt: bool,
    pub continue_final_message: bool,
    /// `chat_template_kwargs` (+ `enable_thinking` from `reasoning_effort`),
    /// without the keys the explicit variables above own.
    pub kwargs: Map<String, Value>,
}

impl TemplateInput {
    /// The final message's normalised content: what `continue_final_message`
    /// continues.
    pub fn final_content(&self) -> Option<&str> {
        self.messages.last()?.get("content")?.as_str()
    }
}

/// Applies every normalisation rule to `req`.
pub fn normalize(req: &ChatRequest) -> Result<TemplateInput, Error> {
    let add_generation_prompt = req.add_generation_prompt.unwrap_or(true);
    let continue_final_message = req.continue_final_message.unwrap_or(false);
    if add_generation_prompt && continue_final_message {
        return Err(Error::invalid(
            "`continue_final_message` and `add_generation_prompt` cannot both be true",
        ));
    }
    let mut kwargs = req.chat_template_kwargs.clone();
    for owned in [
        "messages",
        "tools",
        "documents",
        "add_generation_prompt",
        "continue_final_message",
    ] {
        kwargs.shift_remove(owned);
    }
    if let Some(effort) = &req.reasoning_effort
        && !kwargs.contains_key("enable_thinking")
    {
        kwargs.insert("enable_thinking".into(), Value::Bool(effort != "none"));
    }
    let tools = match &req.tools {
        None => None,
        Some(tools) => Some(
            tools
                .iter()
                .enumerate()
                .map(|(i, t)| reshape_tool(i, t))
                .collect::<Result<_, _>>()?,
        ),
    };
    Ok(TemplateInput {
        messages: normalize_messages(&req.messages),
        tools,
        add_generation_prompt,
        continue_final_message,
        kwargs,
    })
}

/// Rules 2, 3, 6, 7, 9: one JSON object per message.
pub fn normalize_messages(messages: &[ChatMessage]) -> Vec<Value> {
    let had_developer = messages.iter().any(|m| m.role == "developer");
    let mut out: Vec<Value> = messages.iter().map(message_value).collect();
    if had_developer {
        merge_system_messages(&mut out);
    }
    out
}

fn message_value(msg: &ChatMessage) -> Value {
    let role = if msg.role == "developer" {
        "system"
    } else {
        msg.role.as_str()
    };
    let mut obj = Map::new();
    obj.insert("role".into(), role.into());
    obj.insert(
        "content".into(),
        content_text(&msg.content, role == "system").into(),
    );
    if !msg.tool_calls.is_empty() {
        let calls = msg
            .tool_calls
            .iter()
            .map(|call| {
                let mut c = Map::new();
                if let Some(id) = &call.id {
                    c.insert("id".into(), id.as_str().into());
                }
                c.insert("type".into(), call.kind.as_deref().unwrap_or("function").into());
                c.insert(
                    "function".into(),
                    json!({"name": call.name, "arguments": parse_arguments(call.arguments.as_deref())}),
                );
                Value::Object(c)
            })
            .collect();
        obj.insert("tool_calls".into(), Value::Array(calls));
    }
    if let Some(id) = &msg.tool_call_id {
        obj.insert("tool_call_id".into(), id.as_str().into());
    }
    if let Some(name) = &msg.name {
        obj.insert("name".into(), name.as_str().into());
    }
    if let Some(reasoning) = &msg.reasoning {
        obj.insert("reasoning_content".into(), reasoning.as_str().into());
    }
    Value::Object(obj)
}

/// Rule 2 (+ rule 9 for system messages): the content as one string.
pub fn content_text(content: &Content, system: bool) -> String {
    let strip = |text: &str| -> Option<String> {
        if system && text.starts_with(BILLING_HEADER) {
            text.split_once('\n').map(|(_, rest)| rest.to_owned())
        } else {
            Some(text.to_owned())
        }
    };
    match content {
        Content::Null => String::new(),
        Content::Text(text) => strip(text).unwrap_or_default(),
        Content::Parts(parts) => parts
            .iter()
            .filter_map(|p| p.text.as_deref())
            .filter_map(strip)
            .filter(|t| !t.is_empty())
            .collect::<Vec<_>>()
            .join("\n"),
    }
}

/// Rule 3: `json.loads(arguments)`, anything but an object → `{}`.
pub fn parse_arguments(arguments: Option<&str>) -> Value {
    match arguments.map(serde_json::from_str::<Value>) {
        Some(Ok(Value::Object(map))) => Value::Object(map),
        _ => Value::Object(Map::new()),
    }
}

/// Rule 6: all system messages → one at position 0, non-empty contents
/// joined with a blank line, when one is not first or there are several.
fn merge_system_messages(messages: &mut Vec<Value>) {
    let is_system = |m: &Value| m.get("role").and_then(Value::as_str) == Some("system");
    let positions: Vec<usize> = (0..messages.len())
        .filter(|&i| is_system(&messages[i]))
        .collect();
    if positions.is_empty() || positions == [0] {
        return;
    }
    let joined = positions
        .iter()
        .filter_map(|&i| messages[i].get("content").and_then(Value::as_str))
        .filter(|c| !c.is_empty())
        .collect::<Vec<_>>()
        .join("\n\n");
    messages.retain(|m| !is_system(m));
    messages.insert(0, json!({"role": "system", "content": joined}));
}

/// Rule 5: `{"type": "function", "function": {name, description, parameters
/// [, strict] [, defer_loading]}}`, nothing else.
fn reshape_tool(i: usize, tool: &Value) -> Result<Value, Error> {
    let at = format!("tools[{i}]");
    let obj = tool
        .as_object()
        .ok_or_else(|| Error::invalid(format!("`{at}` must be an object")))?;
    match obj.get("type") {
        None | Some(Value::Null) => {}
        Some(Value::String(t)) if t == "function" => {}
        Some(_) => return Err(Error::invalid(format!("`{at}.type` must be \"function\""))),
    }
    let function = match obj.get("function") {
        Some(Value::Object(f)) => f,
        Some(_) => return Err(Error::invalid(format!("`{at}.function` must be an object"))),
        None => return Err(Error::invalid(format!("`{at}.function` is required"))),
    };
    let name = match function.get("name") {
        Some(Value::String(n)) => n.clone(),
        _ => {
            return Err(Error::invalid(format!(
                "`{at}.function.name` must be a string"
            )));
        }
    };
    let description = match function.get("description") {
        None | Some(Value::Null) => Value::Null,
        Some(Value::String(d)) => Value::String(d.clone()),
        Some(_) => {
            return Err(Error::invalid(format!(
                "`{at}.function.description` must be a string or null"
            )));
        }
    };
    let parameters = match function.get("parameters") {
        None | Some(Value::Null) => Value::Null,
        Some(Value::Object(p)) => Value::Object(p.clone()),
        Some(_) => {
            return Err(Error::invalid(format!(
                "`{at}.function.parameters` must be an object or null"
            )));
        }
    };
    let mut f = Map::new();
    f.insert("name".into(), Value::String(name));
    f.insert("description".into(), description);
    f.insert("parameters".into(), parameters);
    for flag in ["strict", "defer_loading"] {
        match function.get(flag) {
            None | Some(Value::Null) => {}
            Some(Value::Bool(b)) => {
                f.insert(flag.into(), Value::Bool(*b));
            }
            Some(_) => {
                return Err(Error::invalid(format!(
                    "`{at}.function.{flag}` must be a boolean or null"
                )));
            }
        }
    }
    Ok(json!({"type": "function", "function": Value::Object(f)}))
}

#[cfg(test)]
mod tests;
