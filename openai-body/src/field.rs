//! Typed reads of one field, and the JSON path an error names.
//!
//! Values are taken out of the parsed body (`remove`), so message texts move
//! into the result instead of being copied: they are most of a large body.

use serde_json::{Map, Value};

use crate::error::{BodyError, wrong};

pub(crate) type Object = Map<String, Value>;

/// Where a field sits in the body. Paths are only formatted for errors, so
/// the success path allocates nothing for them.
#[derive(Clone, Copy, Debug)]
pub(crate) enum At {
    Top,
    Message(usize),
    Part(usize, usize),
    Call(usize, usize),
    Function(usize, usize),
}

impl At {
    /// The path of this node itself (`messages[2].content[0]`).
    pub(crate) fn node(self) -> String {
        match self {
            At::Top => String::new(),
            At::Message(i) => format!("messages[{i}]"),
            At::Part(i, j) => format!("messages[{i}].content[{j}]"),
            At::Call(i, j) => format!("messages[{i}].tool_calls[{j}]"),
            At::Function(i, j) => format!("messages[{i}].tool_calls[{j}].function"),
        }
    }

    /// The path of `key` inside this node.
    pub(crate) fn field(self, key: &str) -> String {
        match self {
            At::Top => key.to_owned(),
            other => format!("{}.{key}", other.node()),
        }
    }
}

/// A string or absent/`null`.
pub(crate) fn string(obj: &mut Object, key: &str, at: At) -> Result<Option<String>, BodyError> {
    match obj.remove(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s)),
        Some(_) => Err(wrong(at.field(key), "a string")),
    }
}

/// A boolean or absent/`null`.
pub(crate) fn boolean(obj: &Object, key: &str) -> Result<Option<bool>, BodyError> {
    match obj.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Bool(b)) => Ok(Some(*b)),
        Some(_) => Err(wrong(key, "a boolean")),
    }
}

/// A non-negative 32-bit integer or absent/`null`.
pub(crate) fn count(obj: &Object, key: &str) -> Result<Option<u32>, BodyError> {
    match obj.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => v
            .as_u64()
            .and_then(|n| u32::try_from(n).ok())
            .map(Some)
            .ok_or_else(|| wrong(key, "a non-negative 32-bit integer")),
    }
}

/// A token id: an integer in `0..2^32`.
pub(crate) fn token_id(value: &Value) -> Option<u32> {
    value.as_u64().and_then(|id| u32::try_from(id).ok())
}
