use std::path::PathBuf;

/// Everything that can go wrong between a request body and its token ids.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A tokenizer file could not be read or parsed.
    #[error("failed to load {path}: {reason}")]
    Load { path: PathBuf, reason: String },
    /// The request body is malformed; the message names the field.
    #[error("invalid request: {0}")]
    InvalidRequest(String),
    /// The chat template failed to compile or render (or raised an exception).
    #[error("chat template: {0}")]
    Template(String),
    /// The tokenizer failed to encode or decode.
    #[error("tokenizer: {0}")]
    Encode(String),
}

impl Error {
    pub(crate) fn invalid(msg: impl Into<String>) -> Self {
        Error::InvalidRequest(msg.into())
    }

    pub(crate) fn load(path: impl Into<PathBuf>, reason: impl ToString) -> Self {
        Error::Load {
            path: path.into(),
            reason: reason.to_string(),
        }
    }
}
