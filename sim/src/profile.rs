//! Step timing: how long one engine step takes, as a function of what the
//! step computes.
//!
//! ```text
//! duration = overhead + max(memory, compute)
//! memory   = weight_read + kv_read_per_token × (context tokens read by the step)
//! compute  = linear_per_token × (prefill tokens + decoding sequences)
//!          + attention_per_pair × (query × key token pairs of the prefill chunks)
//! ```
//!
//! A roofline: decode steps are memory bound (every step streams the weights
//! once, plus each sequence's KV cache), prefill steps are compute bound.
//! Presets are looked up by name (`--profile`); see `sim/README.md` for the
//! constants and their sources.

use thiserror::Error;

/// What one step computes, as the scheduler sees it.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct StepShape {
    /// Prompt (or recomputed) tokens computed in this step, all sequences.
    pub prefill_tokens: u64,
    /// Query × key pairs of those tokens (causal: each token attends to its
    /// prefix, cached or not).
    pub prefill_attention_pairs: f64,
    /// KV-cache tokens read by the prefill chunks (their cached prefix).
    pub prefill_context_tokens: u64,
    /// Sequences generating one token in this step.
    pub decode_seqs: u64,
    /// Sum of their context lengths (KV tokens read).
    pub decode_context_tokens: u64,
}

/// The constants of the step-time formula, in seconds.
#[derive(Debug, Clone, PartialEq)]
pub struct TimingProfile {
    pub name: String,
    /// Scheduling, sampling, kernel launches: paid by every step.
    pub step_overhead_s: f64,
    /// Streaming the weights once from memory.
    pub weight_read_s: f64,
    /// Reading one token's KV cache (all layers).
    pub kv_read_s_per_token: f64,
    /// Dense (linear-layer) compute of one token.
    pub linear_s_per_token: f64,
    /// Attention compute of one query token against one key token.
    pub attention_s_per_pair: f64,
    /// Bytes of KV cache per token (all layers, K and V).
    pub kv_bytes_per_token: u64,
    /// Memory left for the KV cache (bytes).
    pub kv_cache_bytes: u64,
}

#[derive(Debug, Error, PartialEq, Eq)]
#[error("unknown timing profile {0:?} (known: {known})", known = PROFILE_NAMES.join(", "))]
pub struct UnknownProfile(pub String);

pub const PROFILE_NAMES: [&str; 3] = ["l40s-27b-fp8", "tiny-cpu", "test"];

// === impl TimingProfile ===

impl TimingProfile {
    pub fn by_name(name: &str) -> Result<Self, UnknownProfile> {
        match name {
            "l40s-27b-fp8" => Ok(l40s_27b_fp8()),
            "tiny-cpu" => Ok(tiny_cpu()),
            "test" => Ok(test()),
            other => Err(UnknownProfile(other.to_owned())),
        }
    }

    /// Seconds one step of this shape takes.
    pub fn step_duration(&self, s: &StepShape) -> f64 {
        let kv_tokens = (s.decode_context_tokens + s.prefill_context_tokens) as f64;
        let memory = self.weight_read_s + self.kv_read_s_per_token * kv_tokens;
        let compute = self.linear_s_per_token * (s.prefill_tokens + s.decode_seqs) as f64
            + self.attention_s_per_pair * s.prefill_attention_pairs;
        self.step_overhead_s + memory.max(compute)
    }

    /// How many blocks of `block_size` tokens fit in the KV-cache memory.
    pub fn num_gpu_blocks(&self, block_size: usize) -> u32 {
        let per_block = self
            .kv_bytes_per_token
            .saturating_mul(block_size.max(1) as u64);
        (self.kv_cache_bytes / per_block.max(1)).min(u32::MAX as u64 - 1) as u32
    }
}

/// A 27B-class dense model, FP8 weights, on one NVIDIA L40S under vLLM.
pub mod l40s {
    /// L40S dense FP8 tensor throughput (NVIDIA L40S datasheet: 733 TFLOPS,
    /// 1,466 with sparsity).
    pub const FP8_TFLOPS: f64 = 733.0;
    /// L40S dense BF16 tensor throughput (datasheet: 362.05 TFLOPS); attention
    /// runs in BF16 (FlashAttention on a BF16 KV cache).
    pub const BF16_TFLOPS: f64 = 362.05;
    /// GDDR6 bandwidth (datasheet: 864 GB/s).
    pub const MEM_BW_GBPS: f64 = 864.0;
    /// Memory as the driver reports it (nvidia-smi: 46,068 MiB of "48 GB").
    pub const MEM_BYTES: f64 = 46_068.0 * 1024.0 * 1024.0;
    /// Achieved fraction of peak tensor throughput in large prefill GEMMs
    /// (FP8 GEMMs on Ada reach 40-55% of peak in vLLM; we take 0.45).
    pub const MFU: f64 = 0.45;
    /// Achieved fraction of peak throughput of attention kernels (0.35).
    pub const ATTN_EFFICIENCY: f64 = 0.35;
    /// Achieved fraction of peak memory bandwidth when streaming weights and
    /// KV (GDDR6 sustains ~75-80% in decode GEMVs; we take 0.75).
    pub const BW_EFFICIENCY: f64 = 0.75;
    /// Per-step engine overhead with CUDA graphs: scheduling, input
    /// preparation, sampling, output processing (vLLM v1: 2-5 ms).
    pub const STEP_OVERHEAD_S: f64 = 0.003;
    /// Parameters touched per token (27B dense).
    pub const PARAMS: f64 = 27.0e9;
    /// Weight bytes: 27B FP8 parameters plus ~1 GB kept in BF16 (embeddings,
    /// norms, scales).
    pub const WEIGHT_BYTES: f64 = 28.0e9;
    /// Assumed attention geometry (Qwen2.5-32B-like, scaled to 27B): 64
    /// layers, 40 query heads, 8 KV heads, head_dim 128, full attention on
    /// every layer, BF16 KV cache (vLLM's `kv_cache_dtype=auto`).
    pub const LAYERS: f64 = 64.0;
    pub const Q_HEADS: f64 = 40.0;
    pub const KV_HEADS: f64 = 8.0;
    pub const HEAD_DIM: f64 = 128.0;
    pub const KV_DTYPE_BYTES: f64 = 2.0;
    /// vLLM's default `gpu_memory_utilization`.
    pub const GPU_MEMORY_UTILIZATION: f64 = 0.9;
    /// Activation peak, CUDA graphs and non-torch allocations vLLM subtracts
    /// before sizing the KV cache (~3 GB at max_num_batched_tokens 2048).
    pub const RUNTIME_RESERVE_BYTES: f64 = 3.0e9;

    /// K and V of one token over all layers: 2 × 64 × 8 × 128 × 2 = 262,144 B.
    pub const KV_BYTES_PER_TOKEN: f64 = 2.0 * LAYERS * KV_HEADS * HEAD_DIM * KV_DTYPE_BYTES;
}

fn l40s_27b_fp8() -> TimingProfile {
    use l40s::*;
    let bw = MEM_BW_GBPS * 1e9 * BW_EFFICIENCY;
    let kv_cache_bytes = MEM_BYTES * GPU_MEMORY_UTILIZATION - WEIGHT_BYTES - RUNTIME_RESERVE_BYTES;
    TimingProfile {
        name: "l40s-27b-fp8".to_owned(),
        step_overhead_s: STEP_OVERHEAD_S,
        weight_read_s: WEIGHT_BYTES / bw,
        kv_read_s_per_token: KV_BYTES_PER_TOKEN / bw,
        linear_s_per_token: 2.0 * PARAMS / (FP8_TFLOPS * 1e12 * MFU),
        // QK^T and PV: 2 × 2 flops per multiply-add, per layer and query head.
        attention_s_per_pair: 4.0 * LAYERS * Q_HEADS * HEAD_DIM
            / (BF16_TFLOPS * 1e12 * ATTN_EFFICIENCY),
        kv_bytes_per_token: KV_BYTES_PER_TOKEN as u64,
        kv_cache_bytes: kv_cache_bytes.max(0.0) as u64,
    }
}

/// Fitted to the CPU vLLM of `shared/vllm-cpu/README.md` (tiny random Qwen3,
/// 2 cores): decode ~140 tok/s → 7 ms per step; cold prefill of 1.2k tokens
/// ~40 ms → (40 − 7) / 1200 ≈ 27 µs per token. KV: 2 layers × 2 KV heads ×
/// 64 × 2 (K, V) × 2 B = 1,024 B/token in `VLLM_CPU_KVCACHE_SPACE=1` GiB.
fn tiny_cpu() -> TimingProfile {
    TimingProfile {
        name: "tiny-cpu".to_owned(),
        step_overhead_s: 0.007,
        weight_read_s: 0.0,
        kv_read_s_per_token: 0.0,
        linear_s_per_token: 27e-6,
        attention_s_per_pair: 0.0,
        kv_bytes_per_token: 1024,
        kv_cache_bytes: 1 << 30,
    }
}

/// Fast and small, for tests: 1 ms per step plus 2 µs per token.
fn test() -> TimingProfile {
    TimingProfile {
        name: "test".to_owned(),
        step_overhead_s: 0.001,
        weight_read_s: 0.0,
        kv_read_s_per_token: 0.0,
        linear_s_per_token: 2e-6,
        attention_s_per_pair: 0.0,
        kv_bytes_per_token: 1024,
        kv_cache_bytes: 4096 * 16 * 1024,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn l40s_figures_are_plausible() {
        let p = TimingProfile::by_name("l40s-27b-fp8").unwrap();
        // One decoding sequence at 2k context: ~45 ms per token.
        let decode = p.step_duration(&StepShape {
            decode_seqs: 1,
            decode_context_tokens: 2048,
            ..Default::default()
        });
        assert!((0.035..0.06).contains(&decode), "{decode}");
        // A 2k-token prefill: a few hundred ms, dominated by compute.
        let prefill = p.step_duration(&StepShape {
            prefill_tokens: 2048,
            prefill_attention_pairs: 2048.0 * 2049.0 / 2.0,
            ..Default::default()
        });
        assert!((0.2..0.6).contains(&prefill), "{prefill}");
        let blocks = p.num_gpu_blocks(16);
        assert!((2_000..4_000).contains(&blocks), "{blocks}");
    }

    #[test]
    fn tiny_cpu_matches_the_measured_engine() {
        let p = TimingProfile::by_name("tiny-cpu").unwrap();
        let cold = p.step_duration(&StepShape {
            prefill_tokens: 1200,
            ..Default::default()
        });
        assert!((0.035..0.045).contains(&cold), "{cold}");
        let decode = p.step_duration(&StepShape {
            decode_seqs: 1,
            ..Default::default()
        });
        assert!((120.0..160.0).contains(&(1.0 / decode)));
    }

    #[test]
    fn unknown_names_are_rejected() {
        assert_eq!(
            TimingProfile::by_name("h100"),
            Err(UnknownProfile("h100".into()))
        );
        assert!(
            UnknownProfile("x".into())
                .to_string()
                .contains("l40s-27b-fp8")
        );
    }
}
