//! Msgpack primitives and the vLLM field tables shared by the encoder and the
//! decoder.

pub(crate) mod reader;
pub(crate) mod writer;

/// Event type names as vLLM writes them (`"type"` key or array element 0).
pub(crate) const BLOCK_STORED: &str = "BlockStored";
pub(crate) const BLOCK_REMOVED: &str = "BlockRemoved";
pub(crate) const ALL_BLOCKS_CLEARED: &str = "AllBlocksCleared";

/// BlockStored fields in declaration order (vLLM 0.33). Older array-form
/// versions send a prefix of this list, positionally after the tag.
pub(crate) const STORED_FIELDS: [&str; 15] = [
    "block_hashes",
    "parent_block_hash",
    "token_ids",
    "block_size",
    "lora_id",
    "medium",
    "lora_name",
    "extra_keys",
    "group_idx",
    "kv_cache_spec_kind",
    "kv_cache_spec_sliding_window",
    "locality",
    "ownership",
    "session_id",
    "lookahead_token_ids",
];

/// BlockRemoved fields in declaration order (vLLM 0.33).
pub(crate) const REMOVED_FIELDS: [&str; 5] = [
    "block_hashes",
    "medium",
    "group_idx",
    "locality",
    "ownership",
];

/// Fields vLLM 0.23 sends in array form (after the tag).
pub(crate) const STORED_FIELDS_V023: usize = 11;
pub(crate) const REMOVED_FIELDS_V023: usize = 3;
