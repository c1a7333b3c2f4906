//! The HF chat template, rendered the way `transformers` renders it:
//! Jinja with `trim_blocks` and `lstrip_blocks`, python string methods,
//! `tojson` = `json.dumps(ensure_ascii=False)`, `raise_exception` and
//! `strftime_now`, and `continue_final_message` cutting the text after the
//! final message's content.

use minijinja::value::{Kwargs, Value, ValueKind};
use minijinja::{Environment, Error as JinjaError, ErrorKind, State};
use serde_json::Map;

use crate::error::Error;
use crate::normalize::TemplateInput;
use crate::pyjson::{self, DumpOptions};
use crate::strftime;

const TEMPLATE_NAME: &str = "chat_template";

/// A compiled chat template plus the special-token variables HF passes it.
#[derive(Debug)]
pub struct ChatTemplate {
    env: Environment<'static>,
    /// `bos_token`, `eos_token`, ... as strings (HF's `special_tokens_map`).
    special_tokens: Map<String, serde_json::Value>,
}

// === impl ChatTemplate ===

impl ChatTemplate {
    /// Compiles `source` once; rendering then only evaluates it.
    pub fn new(
        source: &str,
        special_tokens: Map<String, serde_json::Value>,
    ) -> Result<Self, Error> {
        let mut env = Environment::new();
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.set_keep_trailing_newline(false);
        env.set_unknown_method_callback(python_method);
        env.add_filter("tojson", tojson);
        env.add_function("raise_exception", raise_exception);
        env.add_function("strftime_now", strftime_now);
        env.add_template_owned(TEMPLATE_NAME, source.to_owned())
            .map_err(|e| Error::Template(format!("failed to compile: {e}")))?;
        Ok(ChatTemplate {
            env,
            special_tokens,
        })
    }

    /// Renders the normalised request; applies `continue_final_message`.
    pub fn render(&self, input: &TemplateInput) -> Result<String, Error> {
        let tmpl = self
            .env
            .get_template(TEMPLATE_NAME)
            .map_err(|e| Error::Template(e.to_string()))?;
        let mut ctx: Vec<(String, Value)> = Vec::new();
        let mut push = |k: &str, v: Value| {
            ctx.retain(|(key, _)| key != k);
            ctx.push((k.to_owned(), v));
        };
        for (k, v) in self.special_tokens.iter().chain(input.kwargs.iter()) {
            push(k, pyjson::from_json(v));
        }
        let messages: Vec<Value> = input.messages.iter().map(pyjson::from_json).collect();
        push("messages", Value::from(messages));
        push(
            "tools",
            match &input.tools {
                Some(tools) => Value::from(tools.iter().map(pyjson::from_json).collect::<Vec<_>>()),
                None => Value::from(()),
            },
        );
        push("documents", Value::from(()));
        push(
            "add_generation_prompt",
            Value::from(input.add_generation_prompt),
        );
        let ctx: Value = ctx.into_iter().collect();
        let rendered = tmpl
            .render(ctx)
            .map_err(|e| Error::Template(e.to_string()))?;
        if input.continue_final_message {
            let last = input.final_content().unwrap_or_default();
            cut_after_final_message(rendered, last)
        } else {
            Ok(rendered)
        }
    }
}

/// HF `continue_final_message`: keep the text up to the end of the final
/// message's content (its trailing whitespace only if the template kept it).
pub fn cut_after_final_message(rendered: String, last: &str) -> Result<String, Error> {
    let stripped = py_strip(last);
    let Some(loc) = rendered.rfind(stripped) else {
        return Err(Error::Template(
            "continue_final_message is set but the final message does not appear in the \
             rendered chat"
                .into(),
        ));
    };
    let lstripped = last.trim_start_matches(py_is_space);
    let end = if rendered.get(loc..loc + lstripped.len()) == Some(last) {
        loc + lstripped.len()
    } else {
        loc + stripped.len()
    };
    let mut rendered = rendered;
    rendered.truncate(end);
    Ok(rendered)
}

// === python compatibility ===

/// Python's `str.isspace` (Rust's `is_whitespace` lacks `\x1c`..`\x1f`).
fn py_is_space(c: char) -> bool {
    c.is_whitespace() || ('\u{1c}'..='\u{1f}').contains(&c)
}

fn py_strip(s: &str) -> &str {
    s.trim_matches(py_is_space)
}

/// `str.strip/lstrip/rstrip` with Python's whitespace set; every other
/// method goes to minijinja-contrib's pycompat layer.
fn python_method(
    state: &State,
    value: &Value,
    method: &str,
    args: &[Value],
) -> Result<Value, JinjaError> {
    if let (Some(s), "strip" | "lstrip" | "rstrip") = (value.as_str(), method) {
        let chars: Option<Vec<char>> = match args {
            [] => None,
            [c] if c.is_none() => None,
            [c] => match c.as_str() {
                Some(c) => Some(c.chars().collect()),
                None => {
                    return Err(JinjaError::new(
                        ErrorKind::InvalidOperation,
                        format!("{method} arg must be None or str"),
                    ));
                }
            },
            _ => {
                return Err(JinjaError::new(
                    ErrorKind::TooManyArguments,
                    format!("{method} takes at most 1 argument"),
                ));
            }
        };
        let pred = |c: char| match &chars {
            Some(set) => set.contains(&c),
            None => py_is_space(c),
        };
        let out = match method {
            "strip" => s.trim_matches(pred),
            "lstrip" => s.trim_start_matches(pred),
            _ => s.trim_end_matches(pred),
        };
        return Ok(Value::from(out));
    }
    minijinja_contrib::pycompat::unknown_method_callback(state, value, method, args)
}

/// HF's `tojson(x, ensure_ascii=False, indent=None, separators=None,
/// sort_keys=False)`.
fn tojson(value: &Value, kwargs: Kwargs) -> Result<Value, JinjaError> {
    let indent = match kwargs.get::<Option<Value>>("indent")? {
        None => None,
        Some(v) if v.is_none() => None,
        Some(v) if v.kind() == ValueKind::Number => {
            Some(" ".repeat(usize::try_from(v).unwrap_or(0)))
        }
        Some(v) => Some(v.as_str().unwrap_or_default().to_owned()),
    };
    let separators = match kwargs.get::<Option<Vec<String>>>("separators")? {
        Some(pair) if pair.len() == 2 => Some((pair[0].clone(), pair[1].clone())),
        Some(_) => {
            return Err(JinjaError::new(
                ErrorKind::InvalidOperation,
                "separators must be an (item, key) pair",
            ));
        }
        None => None,
    };
    let opts = DumpOptions {
        ensure_ascii: kwargs.get::<Option<bool>>("ensure_ascii")?.unwrap_or(false),
        indent,
        separators,
        sort_keys: kwargs.get::<Option<bool>>("sort_keys")?.unwrap_or(false),
    };
    kwargs.assert_all_used()?;
    pyjson::dumps_with(value, &opts).map(Value::from)
}

fn raise_exception(message: String) -> Result<Value, JinjaError> {
    Err(JinjaError::new(ErrorKind::InvalidOperation, message))
}

fn strftime_now(format: String) -> Result<Value, JinjaError> {
    Ok(Value::from(strftime::now(&format)))
}

#[cfg(test)]
mod tests;
