//! `/v1/completions` `prompt`: text, token ids, or a batch of either.

use serde_json::Value;

use crate::error::{BodyError, wrong};
use crate::field::token_id;

/// A completions prompt as sent.
#[derive(Clone, Debug, PartialEq)]
pub enum Prompt {
    Text(String),
    Texts(Vec<String>),
    Ids(Vec<u32>),
    IdBatch(Vec<Vec<u32>>),
}

pub(crate) fn prompt(value: Option<Value>) -> Result<Prompt, BodyError> {
    const EXPECTED: &str =
        "a string, a list of strings, a list of token ids or a list of token-id lists";
    let items = match value {
        None | Some(Value::Null) => return Err(BodyError::Missing("prompt".into())),
        Some(Value::String(text)) => return Ok(Prompt::Text(text)),
        Some(Value::Array(items)) => items,
        Some(_) => return Err(wrong("prompt", EXPECTED)),
    };
    match items.first() {
        None => Err(wrong("prompt", "a non-empty list")),
        Some(Value::String(_)) => items
            .into_iter()
            .enumerate()
            .map(|(i, v)| match v {
                Value::String(s) => Ok(s),
                _ => Err(wrong(format!("prompt[{i}]"), "a string like the others")),
            })
            .collect::<Result<_, _>>()
            .map(Prompt::Texts),
        Some(Value::Number(_)) => token_ids(&items, |k| format!("prompt[{k}]")).map(Prompt::Ids),
        Some(Value::Array(_)) => items
            .iter()
            .enumerate()
            .map(|(i, v)| match v {
                Value::Array(ids) if !ids.is_empty() => {
                    token_ids(ids, |k| format!("prompt[{i}][{k}]"))
                }
                Value::Array(_) => Err(wrong(format!("prompt[{i}]"), "a non-empty list")),
                _ => Err(wrong(
                    format!("prompt[{i}]"),
                    "a list of token ids like the others",
                )),
            })
            .collect::<Result<_, _>>()
            .map(Prompt::IdBatch),
        Some(_) => Err(wrong("prompt", EXPECTED)),
    }
}

fn token_ids(items: &[Value], at: impl Fn(usize) -> String) -> Result<Vec<u32>, BodyError> {
    items
        .iter()
        .enumerate()
        .map(|(k, v)| token_id(v).ok_or_else(|| wrong(at(k), "a token id (0..2^32)")))
        .collect()
}
