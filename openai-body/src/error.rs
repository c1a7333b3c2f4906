//! What a malformed body is: always one field, named by its JSON path.

/// A body that is not an OpenAI request of the expected shape. The filter
/// lets such a request through unsteered; the tokenizer answers 400.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum BodyError {
    #[error("request body is not JSON: {0}")]
    Json(String),
    #[error("request body is not a JSON object")]
    NotAnObject,
    /// A required field is absent (or `null`); the path names it.
    #[error("`{0}` is required")]
    Missing(String),
    #[error("`{field}` must be {expected}")]
    WrongType {
        field: String,
        expected: &'static str,
    },
}

impl BodyError {
    /// The JSON path of the offending field, when one field is at fault.
    pub fn field(&self) -> Option<&str> {
        match self {
            BodyError::Missing(field) | BodyError::WrongType { field, .. } => Some(field),
            BodyError::Json(_) | BodyError::NotAnObject => None,
        }
    }
}

pub(crate) fn wrong(field: impl Into<String>, expected: &'static str) -> BodyError {
    BodyError::WrongType {
        field: field.into(),
        expected,
    }
}
