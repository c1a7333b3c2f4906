//! OpenAI request → prompt token ids, exactly as a vLLM 0.33 OpenAI server
//! computes them.
//!
//! The path a request takes:
//!
//! 1. [`openai`]: the JSON body → domain types ([`ChatRequest`],
//!    [`CompletionPrompt`]).
//! 2. [`normalize`]: vLLM's message normalisation → the template context.
//! 3. `template`: the HF chat template (minijinja, python-compatible
//!    methods, [`pyjson`] `tojson`) → the prompt text.
//! 4. [`PromptTokenizer`]: the text → ids, through the segment cache
//!    (`segments` + `cache`) so a later turn of a conversation only encodes
//!    what is new. See `README.md` for why that is exact.
#![forbid(unsafe_code)]

mod cache;
mod error;
mod fast;
pub mod normalize;
mod openai;
mod pretok;
pub mod pyjson;
pub mod request;
mod segments;
mod strftime;
mod template;
mod tokenizer;

pub use cache::{CacheStats, DEFAULT_CACHE_TOKENS};
pub use error::Error;
pub use request::{ChatMessage, ChatRequest, CompletionPrompt, Content, ContentPart, ToolCall};
pub use tokenizer::PromptTokenizer;
