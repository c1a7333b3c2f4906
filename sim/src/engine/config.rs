//! Engine configuration, with vLLM's defaults.

use crate::profile::TimingProfile;

pub const DEFAULT_BLOCK_SIZE: usize = 16;
/// vLLM v1's default for the OpenAI server on GPUs below the H100 class.
pub const DEFAULT_MAX_NUM_SEQS: usize = 256;
/// vLLM v1's default for the OpenAI server on GPUs below the H100 class.
pub const DEFAULT_MAX_NUM_BATCHED_TOKENS: usize = 2048;
pub const DEFAULT_MAX_MODEL_LEN: usize = 32768;
/// Qwen3's `<|im_end|>`.
pub const DEFAULT_EOS_TOKEN_ID: u32 = 151_645;
/// Chance per generated token (once `min_tokens` are out, unless
/// `ignore_eos`) that the token is EOS: mean length ~500 tokens.
pub const DEFAULT_EOS_PROBABILITY: f64 = 0.002;

/// vLLM's `NONE_HASH` seed for cryptographic hashes when `PYTHONHASHSEED`
/// is unset (`kv_cache_utils.DEFAULT_NONE_HASH_SEED`).
pub const DEFAULT_NONE_HASH_SEED: &str = "vllm-none-hash";

/// Block-hash algorithm.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum HashAlgo {
    /// The simulator's own: XXH3-64 keyed by `hash_seed` (opaque to peers).
    #[default]
    Xxh3,
    /// vLLM's `sha256_cbor`, bit for bit: peers that recompute vLLM's block
    /// hashes from token ids match the published ones.
    Sha256Cbor,
}

#[derive(Debug, Clone, PartialEq)]
pub struct EngineConfig {
    pub block_size: usize,
    pub num_gpu_blocks: u32,
    pub max_num_seqs: usize,
    pub max_num_batched_tokens: usize,
    pub max_model_len: usize,
    pub profile: TimingProfile,
    /// How block hashes are computed (`--prefix-caching-hash-algo`).
    pub prefix_caching_hash_algo: HashAlgo,
    /// Keys the XXH3 block hashes.
    pub hash_seed: u64,
    /// Seeds the `sha256_cbor` chain: vLLM's `NONE_HASH = sha256_cbor(seed)`
    /// with `PYTHONHASHSEED`, else [`DEFAULT_NONE_HASH_SEED`].
    pub none_hash_seed: String,
    /// Seeds token sampling (filler choice and EOS).
    pub seed: u64,
    pub eos_token_id: u32,
    pub eos_probability: f64,
    /// Generated tokens cycle through these (from a per-request offset).
    pub filler_token_ids: Vec<u32>,
}

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ConfigError {
    #[error("{0} must be at least 1")]
    Zero(&'static str),
    #[error("eos_probability must be within [0, 1], got {0}")]
    EosProbability(f64),
    #[error("filler_token_ids must not contain the EOS token {0}")]
    FillerHasEos(u32),
    #[error(
        "To serve at least one request with the model's max seq len ({max_model_len}), {needed} KV-cache blocks are needed, which is more than the {num_gpu_blocks} available. Try increasing num_gpu_blocks or decreasing max_model_len."
    )]
    KvCacheTooSmall {
        max_model_len: usize,
        needed: usize,
        num_gpu_blocks: u32,
    },
}

// === impl EngineConfig ===

impl EngineConfig {
    /// vLLM's defaults, with the profile's KV-cache size.
    pub fn new(profile: TimingProfile) -> Self {
        Self {
            block_size: DEFAULT_BLOCK_SIZE,
            num_gpu_blocks: profile.num_gpu_blocks(DEFAULT_BLOCK_SIZE),
            max_num_seqs: DEFAULT_MAX_NUM_SEQS,
            max_num_batched_tokens: DEFAULT_MAX_NUM_BATCHED_TOKENS,
            max_model_len: DEFAULT_MAX_MODEL_LEN,
            profile,
            prefix_caching_hash_algo: HashAlgo::default(),
            hash_seed: 0,
            none_hash_seed: DEFAULT_NONE_HASH_SEED.to_owned(),
            seed: 0,
            eos_token_id: DEFAULT_EOS_TOKEN_ID,
            eos_probability: DEFAULT_EOS_PROBABILITY,
            filler_token_ids: (1000..1064).collect(),
        }
    }

    pub fn validate(&self) -> Result<(), ConfigError> {
        for (name, v) in [
            ("block_size", self.block_size),
            ("num_gpu_blocks", self.num_gpu_blocks as usize),
            ("max_num_seqs", self.max_num_seqs),
            ("max_num_batched_tokens", self.max_num_batched_tokens),
            ("max_model_len", self.max_model_len),
            ("filler_token_ids", self.filler_token_ids.len()),
        ] {
            if v == 0 {
                return Err(ConfigError::Zero(name));
            }
        }
        if !(0.0..=1.0).contains(&self.eos_probability) {
            return Err(ConfigError::EosProbability(self.eos_probability));
        }
        if self.filler_token_ids.contains(&self.eos_token_id) {
            return Err(ConfigError::FillerHasEos(self.eos_token_id));
        }
        let needed = self.max_model_len.div_ceil(self.block_size);
        if needed > self.num_gpu_blocks as usize {
            return Err(ConfigError::KvCacheTooSmall {
                max_model_len: self.max_model_len,
                needed,
                num_gpu_blocks: self.num_gpu_blocks,
            });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_validate_and_bad_values_are_named() {
        for name in crate::profile::PROFILE_NAMES {
            let cfg = EngineConfig::new(TimingProfile::by_name(name).unwrap());
            assert_eq!(cfg.validate(), Ok(()), "{name}");
        }
        let mut cfg = EngineConfig::new(TimingProfile::by_name("test").unwrap());
        cfg.max_num_seqs = 0;
        assert_eq!(cfg.validate(), Err(ConfigError::Zero("max_num_seqs")));
        cfg.max_num_seqs = 1;
        cfg.num_gpu_blocks = 10;
        assert!(matches!(
            cfg.validate(),
            Err(ConfigError::KvCacheTooSmall { needed: 2048, .. })
        ));
        cfg.max_model_len = 160;
        assert_eq!(cfg.validate(), Ok(()));
        cfg.filler_token_ids.push(cfg.eos_token_id);
        assert_eq!(
            cfg.validate(),
            Err(ConfigError::FillerHasEos(DEFAULT_EOS_TOKEN_ID))
        );
    }
}
