//! Requests: what the caller submits, and the engine's per-request state.

use super::block_pool::BlockId;

pub type RequestId = u64;

/// A request as submitted to the engine.
#[derive(Debug, Clone, PartialEq)]
pub struct SimRequest {
    pub id: RequestId,
    pub prompt_token_ids: Vec<u32>,
    /// Generated tokens at most (≥ 1).
    pub max_tokens: usize,
    /// Generated tokens before EOS may end the request.
    pub min_tokens: usize,
    /// Never stop on EOS.
    pub ignore_eos: bool,
    /// Arrival time, seconds on the driver's clock.
    pub arrival: f64,
    /// The LoRA adapter the request runs with (`None`: the base model).
    pub lora: Option<Lora>,
    /// vLLM's `cache_salt`: keys the request's first block (so all of its
    /// blocks) apart from other salts' and from unsalted ones.
    pub cache_salt: Option<String>,
}

/// A LoRA adapter as vLLM names it in its KV events: `lora_id` is the
/// adapter's `lora_int_id` (counted from 1 in load order), `lora_name` its
/// served name. Its blocks hash apart from the base model's and from every
/// other adapter's (vLLM puts the name in each block's extra keys).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lora {
    pub id: i64,
    pub name: String,
}

/// Why a request was not accepted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RejectReason {
    #[error("the prompt is empty")]
    EmptyPrompt,
    #[error(
        "This model's maximum context length is {max_model_len} tokens. However, your request has {prompt_tokens} input tokens. Please reduce the length of the input messages."
    )]
    PromptTooLong {
        prompt_tokens: usize,
        max_model_len: usize,
    },
    #[error(
        "'max_tokens' is too large: {max_tokens}. This model's maximum context length is {max_model_len} tokens and your request has {prompt_tokens} input tokens ({max_tokens} > {max_model_len} - {prompt_tokens})."
    )]
    MaxTokensTooLarge {
        max_tokens: usize,
        prompt_tokens: usize,
        max_model_len: usize,
    },
    #[error("max_tokens must be at least 1, got {0}")]
    MaxTokensZero(usize),
    #[error("request id {0} is already in use")]
    DuplicateId(RequestId),
}

/// Why a request finished.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FinishReason {
    /// EOS sampled.
    Stop,
    /// `max_tokens` or the model length reached.
    Length,
}

// === impl FinishReason ===

impl FinishReason {
    /// The OpenAI `finish_reason` string.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Stop => "stop",
            Self::Length => "length",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Usage {
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
    /// Prompt tokens served from the prefix cache at first scheduling.
    pub cached_tokens: usize,
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub enum RequestStatus {
    Waiting,
    Running,
    /// Preempted (blocks freed), back in the waiting queue.
    Preempted,
}

/// The engine's state of one request.
#[derive(Debug, Clone)]
pub(crate) struct ReqState {
    pub(crate) id: RequestId,
    pub(crate) prompt_len: usize,
    /// Prompt then generated tokens.
    pub(crate) token_ids: Vec<u32>,
    /// Hashes of every full block of `token_ids`.
    pub(crate) block_hashes: Vec<u64>,
    pub(crate) block_ids: Vec<BlockId>,
    /// Leading blocks of `block_ids` already cached (registered or skipped).
    pub(crate) num_cached_blocks: usize,
    pub(crate) num_computed: usize,
    pub(crate) max_tokens: usize,
    pub(crate) min_tokens: usize,
    pub(crate) ignore_eos: bool,
    pub(crate) arrival: f64,
    pub(crate) first_token_at: Option<f64>,
    pub(crate) cached_tokens: Option<usize>,
    pub(crate) status: RequestStatus,
    pub(crate) rng: SplitMix64,
    pub(crate) filler_offset: usize,
    /// Hashes this request's blocks (keyed by its adapter, if any).
    pub(crate) hasher: super::hash::BlockHasher,
    pub(crate) lora: Option<Lora>,
    pub(crate) cache_salt: Option<String>,
}

// === impl ReqState ===

impl ReqState {
    pub(crate) fn num_tokens(&self) -> usize {
        self.token_ids.len()
    }

    pub(crate) fn num_output(&self) -> usize {
        self.token_ids.len() - self.prompt_len
    }
}

/// A tiny deterministic generator (SplitMix64), one per request so one
/// request's sampling never depends on another's.
#[derive(Debug, Clone)]
pub(crate) struct SplitMix64(u64);

// === impl SplitMix64 ===

impl SplitMix64 {
    pub(crate) fn new(seed: u64) -> Self {
        Self(seed)
    }

    pub(crate) fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1).
    pub(crate) fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
}
