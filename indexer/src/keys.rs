//! Chain keys: kvsteer's own 64-bit identity of a cached block.
//!
//! A block is identified by everything that decides whether vLLM can reuse it:
//! the model, the LoRA adapter, the request's `cache_salt`, and the tokens of
//! this block and of every block before it. Engine hashes are never used as
//! keys (they differ between vLLM versions, hash algorithms and
//! `PYTHONHASHSEED`s); both the prompt side ([`prompt_keys`]) and the event
//! side (`index::ingest`) derive keys with the functions in this module, so the
//! same tokens give the same keys.
//!
//! ```text
//! seed   = H(model) ⊕ H(lora)                  (KeyContext)
//! root   = seed, or H(seed, cache_salt)         (the salt enters once, at the root)
//! key_0  = H(root    ‖ tokens of block 0)
//! key_i  = H(key_i-1 ‖ tokens of block i [‖ extra])
//! ```
//!
//! `H` is xxh3-64; tokens are hashed as little-endian `u32`s. `extra` is a
//! digest of block extra keys kvsteer cannot reproduce from a prompt (e.g.
//! multimodal identifiers): such blocks, and everything chained after them,
//! never match a text prompt, which is the safe direction.

use xxhash_rust::xxh3::xxh3_64_with_seed;

/// Domain separators, so a model name can never collide with a salt or LoRA.
const MODEL_DOMAIN: u64 = 0x6b76_7374_6565_722d; // "kvsteer-"
const LORA_DOMAIN: u64 = 0x6c6f_7261_2d6e_616d; // "lora-nam"
const SALT_DOMAIN: u64 = 0x6361_6368_652d_736c; // "cache-sl"
const BLOCK_DOMAIN: u64 = 0x626c_6f63_6b2d_6b65; // "block-ke"

/// kvsteer's identity of one cached block (see the module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BlockKey(pub u64);

/// What seeds a chain: model, LoRA adapter and the engine's block size.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KeyContext {
    model_seed: u64,
    seed: u64,
    block_size: u32,
}

// === impl KeyContext ===

impl KeyContext {
    /// `lora_name` `None` or empty means the base model. `block_size` 0 yields
    /// no keys at all (never a panic).
    pub fn new(model: &str, lora_name: Option<&str>, block_size: u32) -> Self {
        let model_seed = xxh3_64_with_seed(model.as_bytes(), MODEL_DOMAIN);
        Self::from_model_seed(model_seed, lora_name, block_size)
    }

    fn from_model_seed(model_seed: u64, lora_name: Option<&str>, block_size: u32) -> Self {
        let seed = match lora_name {
            Some(lora) if !lora.is_empty() => {
                xxh3_64_with_seed(lora.as_bytes(), model_seed ^ LORA_DOMAIN)
            }
            _ => model_seed,
        };
        Self {
            model_seed,
            seed,
            block_size,
        }
    }

    /// The same model and block size with another LoRA adapter.
    pub fn with_lora(&self, lora_name: Option<&str>) -> Self {
        Self::from_model_seed(self.model_seed, lora_name, self.block_size)
    }

    /// A context for a LoRA known only by its numeric id (vLLM < 0.14 sends no
    /// `lora_name`). Its keys never equal a named adapter's or the base
    /// model's, so such blocks are indexed but only match the same id.
    pub fn with_lora_id(&self, lora_id: i64) -> Self {
        let seed = xxh3_64_with_seed(&lora_id.to_le_bytes(), self.model_seed ^ !LORA_DOMAIN);
        Self {
            seed,
            ..self.clone()
        }
    }

    pub fn block_size(&self) -> u32 {
        self.block_size
    }

    /// The parent of the first block: the seed, salted when `cache_salt` is a
    /// non-empty string (vLLM ignores an empty salt).
    pub fn root(&self, cache_salt: Option<&str>) -> BlockKey {
        match cache_salt {
            Some(salt) if !salt.is_empty() => {
                BlockKey(xxh3_64_with_seed(salt.as_bytes(), self.seed ^ SALT_DOMAIN))
            }
            _ => BlockKey(self.seed),
        }
    }
}

/// The key of the block holding `tokens` whose parent is `parent` (the root
/// for the first block). `extra` is 0 for a plain block, otherwise a digest of
/// extra keys. `buf` is scratch space, reused across calls.
pub fn chain_key(parent: BlockKey, tokens: &[u32], extra: u64, buf: &mut Vec<u8>) -> BlockKey {
    buf.clear();
    buf.extend_from_slice(&parent.0.to_le_bytes());
    for token in tokens {
        buf.extend_from_slice(&token.to_le_bytes());
    }
    BlockKey(xxh3_64_with_seed(buf, BLOCK_DOMAIN ^ extra))
}

/// Keys of a prompt, one per FULL block (a partial last block is never cached
/// by vLLM, so it has no key).
pub fn prompt_keys(ctx: &KeyContext, cache_salt: Option<&str>, token_ids: &[u32]) -> Vec<BlockKey> {
    let block_size = ctx.block_size as usize;
    if block_size == 0 {
        return Vec::new();
    }
    let mut keys = Vec::with_capacity(token_ids.len() / block_size);
    let mut buf = Vec::with_capacity(8 + 4 * block_size);
    let mut parent = ctx.root(cache_salt);
    for block in token_ids.chunks_exact(block_size) {
        parent = chain_key(parent, block, 0, &mut buf);
        keys.push(parent);
    }
    keys
}

// === impl KeyHasher ===

/// Hasher for maps keyed by values that already are 64-bit hashes (block
/// keys, the engine's block hashes): fold and multiply instead of SipHash.
#[derive(Clone, Copy, Debug, Default)]
pub struct KeyHasher;

#[derive(Default)]
pub struct KeyHasherState(u64);

impl std::hash::BuildHasher for KeyHasher {
    type Hasher = KeyHasherState;
    fn build_hasher(&self) -> KeyHasherState {
        KeyHasherState(0)
    }
}

impl std::hash::Hasher for KeyHasherState {
    fn finish(&self) -> u64 {
        (self.0 ^ (self.0 >> 32)).wrapping_mul(0x9e37_79b9_7f4a_7c15)
    }

    fn write(&mut self, bytes: &[u8]) {
        self.0 = xxh3_64_with_seed(bytes, self.0);
    }

    fn write_u64(&mut self, v: u64) {
        self.0 ^= v;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tokens(n: u32) -> Vec<u32> {
        (0..n).map(|i| i * 7 + 3).collect()
    }

    #[test]
    fn one_key_per_full_block() {
        let ctx = KeyContext::new("m", None, 16);
        assert_eq!(prompt_keys(&ctx, None, &tokens(15)).len(), 0);
        assert_eq!(prompt_keys(&ctx, None, &tokens(16)).len(), 1);
        assert_eq!(prompt_keys(&ctx, None, &tokens(47)).len(), 2);
        // The partial last block does not change the full blocks' keys.
        assert_eq!(
            prompt_keys(&ctx, None, &tokens(47)),
            prompt_keys(&ctx, None, &tokens(32))
        );
    }

    #[test]
    fn zero_block_size_yields_nothing() {
        let ctx = KeyContext::new("m", None, 0);
        assert!(prompt_keys(&ctx, None, &tokens(64)).is_empty());
    }

    #[test]
    fn keys_chain_over_the_whole_prefix() {
        let ctx = KeyContext::new("m", None, 4);
        let a = prompt_keys(&ctx, None, &[1, 2, 3, 4, 5, 6, 7, 8]);
        let b = prompt_keys(&ctx, None, &[9, 2, 3, 4, 5, 6, 7, 8]);
        // Same second block tokens, different first block: different key.
        assert_ne!(a[1], b[1]);
        // Chaining by hand gives the prompt's keys.
        let mut buf = Vec::new();
        let k0 = chain_key(ctx.root(None), &[1, 2, 3, 4], 0, &mut buf);
        let k1 = chain_key(k0, &[5, 6, 7, 8], 0, &mut buf);
        assert_eq!(a, vec![k0, k1]);
    }

    #[test]
    fn model_lora_and_salt_change_keys() {
        let t = tokens(32);
        let base = KeyContext::new("m", None, 16);
        let base_keys = prompt_keys(&base, None, &t);
        assert_ne!(
            prompt_keys(&KeyContext::new("m2", None, 16), None, &t),
            base_keys
        );
        let lora = KeyContext::new("m", Some("sql"), 16);
        assert_ne!(prompt_keys(&lora, None, &t), base_keys);
        assert_eq!(base.with_lora(Some("sql")), lora);
        assert_eq!(lora.with_lora(None), base);
        // An empty LoRA name or salt means none, as in vLLM.
        assert_eq!(KeyContext::new("m", Some(""), 16), base);
        assert_eq!(prompt_keys(&base, Some(""), &t), base_keys);
        let salted = prompt_keys(&base, Some("tenant-a"), &t);
        assert_ne!(salted[0], base_keys[0]);
        assert_ne!(salted[1], base_keys[1]);
        assert_ne!(prompt_keys(&base, Some("tenant-b"), &t), salted);
        assert_ne!(base.with_lora_id(1).root(None), base.root(None));
    }

    #[test]
    fn salt_enters_only_through_the_root() {
        let ctx = KeyContext::new("m", None, 4);
        let salted = prompt_keys(&ctx, Some("s"), &[1, 2, 3, 4, 5, 6, 7, 8]);
        let mut buf = Vec::new();
        // The second block is chained from the first block's key only.
        assert_eq!(chain_key(salted[0], &[5, 6, 7, 8], 0, &mut buf), salted[1]);
    }

    #[test]
    fn extra_digest_changes_the_key() {
        let ctx = KeyContext::new("m", None, 4);
        let mut buf = Vec::new();
        let plain = chain_key(ctx.root(None), &[1, 2, 3, 4], 0, &mut buf);
        let extra = chain_key(ctx.root(None), &[1, 2, 3, 4], 42, &mut buf);
        assert_ne!(plain, extra);
    }
}
