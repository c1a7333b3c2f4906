//! The events as vLLM defines them (`vllm/distributed/kv_events.py`), as plain
//! Rust values. Every field any vLLM version has sent is here; a field that was
//! nil, absent on the wire, or not defined in the sender's version is `None`.

/// A block hash as the engine sent it: an unsigned 64-bit int (most versions),
/// or the raw digest bytes (`msgpack bin`, 32 bytes for sha256).
///
/// Engine hashes are opaque to kvsteer: they are only ever used to map
/// `BlockRemoved` back to blocks announced by `BlockStored`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum BlockHash {
    U64(u64),
    Bytes(Vec<u8>),
}

/// One element of `extra_keys`: msgpack values as sent (strings, ints,
/// nested arrays such as `[identifier, offset]`).
pub type ExtraKey = rmpv::Value;

#[derive(Debug, Clone, PartialEq, Default)]
pub struct BlockStored {
    pub block_hashes: Vec<BlockHash>,
    pub parent_block_hash: Option<BlockHash>,
    pub token_ids: Vec<u32>,
    pub block_size: u32,
    pub lora_id: Option<i64>,
    /// `"GPU"`, `"CPU"`, ...; `None` when nil.
    pub medium: Option<String>,
    pub lora_name: Option<String>,
    /// Per block: `None` (nil) or the list of extra keys of that block
    /// (LoRA name, `cache_salt`, multimodal `[identifier, offset]`).
    pub extra_keys: Option<Vec<Option<Vec<ExtraKey>>>>,
    pub group_idx: Option<u32>,
    /// `"full_attention"`, `"sliding_window"`, ...
    pub kv_cache_spec_kind: Option<String>,
    pub kv_cache_spec_sliding_window: Option<u32>,
    pub locality: Option<String>,
    pub ownership: Option<String>,
    pub session_id: Option<String>,
    /// Per block: the lookahead tokens that followed it (vLLM 0.33+).
    pub lookahead_token_ids: Option<Vec<Vec<u32>>>,
}

#[derive(Debug, Clone, PartialEq, Default)]
pub struct BlockRemoved {
    pub block_hashes: Vec<BlockHash>,
    pub medium: Option<String>,
    pub group_idx: Option<u32>,
    pub locality: Option<String>,
    pub ownership: Option<String>,
}

#[derive(Debug, Clone, PartialEq)]
pub enum KvEvent {
    BlockStored(BlockStored),
    BlockRemoved(BlockRemoved),
    AllBlocksCleared,
}

/// One payload of the PUB stream: `[ts, events, data_parallel_rank]`.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct EventBatch {
    pub ts: f64,
    pub events: Vec<KvEvent>,
    pub data_parallel_rank: Option<i64>,
}

/// How events are laid out inside a batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Encoding {
    /// vLLM 0.24 and later: each event is a map whose `"type"` key comes first.
    #[default]
    Map,
    /// vLLM 0.23 and earlier: each event is a positional array, tag first.
    Array,
}
