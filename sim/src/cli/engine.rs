//! `kvsteer-sim engine`: flags (a contract shared with the deployment and
//! end-to-end tests) → [`ServerConfig`].

use std::net::SocketAddr;
use std::path::PathBuf;
use std::str::FromStr;

use clap::{Args, ValueEnum};
use kvsteer_kv_events::Encoding;
use kvsteer_kv_events::zmq::PublisherConfig;

use crate::engine::config::{
    DEFAULT_BLOCK_SIZE, DEFAULT_MAX_MODEL_LEN, DEFAULT_MAX_NUM_BATCHED_TOKENS, DEFAULT_MAX_NUM_SEQS,
};
use crate::engine::{EngineConfig, HashAlgo};
use crate::profile::{TimingProfile, UnknownProfile};
use crate::server::ServerConfig;

pub const DEFAULT_LISTEN: &str = "127.0.0.1:8000";
pub const DEFAULT_MODEL_NAME: &str = "kvsteer-sim";
pub const DEFAULT_PROFILE: &str = "l40s-27b-fp8";
/// vLLM's default replay buffer (`buffer_steps`).
pub const DEFAULT_REPLAY_BUFFER_BATCHES: usize = 10_000;

/// `--prefix-caching-hash-algo`: the simulator's own XXH3 or vLLM's
/// `sha256_cbor` (for peers that recompute vLLM's block hashes).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum PrefixCachingHashAlgo {
    Xxh3,
    #[value(name = "sha256_cbor")]
    Sha256Cbor,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum EventEncoding {
    Map,
    Array,
}

/// `random` (a new seed per process, like vLLM's unset `PYTHONHASHSEED`) or
/// a fixed number.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HashSeed {
    Random,
    Fixed(u64),
}

impl FromStr for HashSeed {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if s == "random" {
            return Ok(Self::Random);
        }
        s.parse()
            .map(Self::Fixed)
            .map_err(|_| format!("expected `random` or an unsigned integer, got {s:?}"))
    }
}

#[derive(Debug, Clone, Args)]
pub struct EngineArgs {
    /// HTTP listen address.
    #[arg(long, default_value = DEFAULT_LISTEN)]
    pub listen: SocketAddr,
    /// Model name served and checked in requests.
    #[arg(long, default_value = DEFAULT_MODEL_NAME)]
    pub served_model_name: String,
    /// LoRA adapters served beside the model, like vLLM's: `name=path`
    /// (repeat the flag or list several); requests name them in `model`.
    #[arg(long, num_args = 1..)]
    pub lora_modules: Vec<crate::server::LoraModule>,
    /// Directory with tokenizer.json and tokenizer_config.json.
    #[arg(long)]
    pub tokenizer: PathBuf,
    /// ZeroMQ PUB endpoint to bind for KV events (none: not published).
    #[arg(long)]
    pub kv_events_endpoint: Option<String>,
    /// ZeroMQ ROUTER endpoint to bind for replay requests.
    #[arg(long)]
    pub replay_endpoint: Option<String>,
    /// Topic frame of every event message [default: kv@<listen>@<served-model-name>].
    #[arg(long)]
    pub kv_events_topic: Option<String>,
    #[arg(long, value_enum, default_value = "map")]
    pub event_encoding: EventEncoding,
    #[arg(long, default_value_t = DEFAULT_BLOCK_SIZE)]
    pub block_size: usize,
    /// KV-cache blocks [default: derived from the profile's memory].
    #[arg(long)]
    pub num_gpu_blocks: Option<u32>,
    #[arg(long, default_value_t = DEFAULT_MAX_NUM_SEQS)]
    pub max_num_seqs: usize,
    #[arg(long, default_value_t = DEFAULT_MAX_NUM_BATCHED_TOKENS)]
    pub max_num_batched_tokens: usize,
    #[arg(long, default_value_t = DEFAULT_MAX_MODEL_LEN)]
    pub max_model_len: usize,
    /// Timing profile: l40s-27b-fp8, tiny-cpu, test.
    #[arg(long, default_value = DEFAULT_PROFILE)]
    pub profile: String,
    /// Simulated time runs this many times faster than real time.
    #[arg(long, default_value_t = 1.0)]
    pub time_scale: f64,
    /// Block-hash key of `xxh3`: `random` or a number.
    #[arg(long, default_value = "random")]
    pub hash_seed: HashSeed,
    /// Block-hash algorithm: `xxh3` (the simulator's) or `sha256_cbor`
    /// (vLLM's, bit for bit).
    #[arg(long, value_enum, default_value = "xxh3")]
    pub prefix_caching_hash_algo: PrefixCachingHashAlgo,
    /// Seed of `sha256_cbor`'s chain, as vLLM's `PYTHONHASHSEED` (vLLM's
    /// default when that is unset: `vllm-none-hash`).
    #[arg(long, default_value = crate::engine::DEFAULT_NONE_HASH_SEED)]
    pub none_hash_seed: String,
    /// Sampling seed (filler tokens, EOS).
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Value of the `x-kvsteer-worker` response header [default: the listen address].
    #[arg(long)]
    pub worker_id: Option<String>,
}

#[derive(Debug, thiserror::Error)]
pub enum ArgsError {
    #[error(transparent)]
    Profile(#[from] UnknownProfile),
    #[error("--replay-endpoint needs --kv-events-endpoint")]
    ReplayWithoutPub,
}

// === impl EngineArgs ===

impl EngineArgs {
    pub fn server_config(&self) -> Result<ServerConfig, ArgsError> {
        let profile = TimingProfile::by_name(&self.profile)?;
        let mut engine = EngineConfig::new(profile);
        engine.block_size = self.block_size;
        engine.num_gpu_blocks = match self.num_gpu_blocks {
            Some(n) => n,
            None => engine.profile.num_gpu_blocks(self.block_size),
        };
        engine.max_num_seqs = self.max_num_seqs;
        engine.max_num_batched_tokens = self.max_num_batched_tokens;
        engine.max_model_len = self.max_model_len;
        engine.seed = self.seed;
        engine.hash_seed = match self.hash_seed {
            HashSeed::Fixed(n) => n,
            HashSeed::Random => rand::random(),
        };
        engine.prefix_caching_hash_algo = match self.prefix_caching_hash_algo {
            PrefixCachingHashAlgo::Xxh3 => HashAlgo::Xxh3,
            PrefixCachingHashAlgo::Sha256Cbor => HashAlgo::Sha256Cbor,
        };
        engine.none_hash_seed.clone_from(&self.none_hash_seed);
        if self.replay_endpoint.is_some() && self.kv_events_endpoint.is_none() {
            return Err(ArgsError::ReplayWithoutPub);
        }
        let kv_events =
            self.kv_events_endpoint
                .as_ref()
                .map(|pub_endpoint| PublisherConfig {
                    pub_endpoint: pub_endpoint.clone(),
                    replay_endpoint: self.replay_endpoint.clone(),
                    topic: self.kv_events_topic.clone().unwrap_or_else(|| {
                        format!("kv@{}@{}", self.listen, self.served_model_name)
                    }),
                    encoding: match self.event_encoding {
                        EventEncoding::Map => Encoding::Map,
                        EventEncoding::Array => Encoding::Array,
                    },
                    replay_buffer_batches: DEFAULT_REPLAY_BUFFER_BATCHES,
                });
        Ok(ServerConfig {
            listen: self.listen,
            served_model_name: self.served_model_name.clone(),
            tokenizer_dir: self.tokenizer.clone(),
            kv_events,
            engine,
            time_scale: self.time_scale,
            worker_id: self
                .worker_id
                .clone()
                .unwrap_or_else(|| self.listen.to_string()),
            lora_modules: self.lora_modules.clone(),
        })
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        args: EngineArgs,
    }

    fn parse(args: &[&str]) -> Result<EngineArgs, clap::Error> {
        Cli::try_parse_from(std::iter::once("engine").chain(args.iter().copied())).map(|c| c.args)
    }

    #[test]
    fn lora_modules_like_vllm() {
        let a = parse(&[
            "--tokenizer",
            "t",
            "--lora-modules",
            "sql=/a/sql",
            "chat=/a/chat",
        ])
        .unwrap();
        let names: Vec<_> = a
            .lora_modules
            .iter()
            .map(|m| (m.name.as_str(), m.path.as_str()))
            .collect();
        assert_eq!(names, [("sql", "/a/sql"), ("chat", "/a/chat")]);
        assert!(parse(&["--tokenizer", "t", "--lora-modules", "no-path"]).is_err());
        assert!(
            parse(&["--tokenizer", "t"])
                .unwrap()
                .lora_modules
                .is_empty()
        );
    }

    #[test]
    fn defaults_and_topic() {
        let a = parse(&[
            "--tokenizer",
            "t",
            "--kv-events-endpoint",
            "tcp://127.0.0.1:5557",
            "--hash-seed",
            "9",
        ])
        .unwrap();
        let cfg = a.server_config().unwrap();
        let kv = cfg.kv_events.unwrap();
        assert_eq!(kv.topic, "kv@127.0.0.1:8000@kvsteer-sim");
        assert_eq!(kv.encoding, Encoding::Map);
        assert_eq!(cfg.engine.hash_seed, 9);
        assert_eq!(cfg.engine.prefix_caching_hash_algo, HashAlgo::Xxh3);
        assert_eq!(cfg.engine.none_hash_seed, "vllm-none-hash");
        assert_eq!(cfg.engine.block_size, 16);
        assert_eq!(
            cfg.engine.num_gpu_blocks,
            TimingProfile::by_name("l40s-27b-fp8")
                .unwrap()
                .num_gpu_blocks(16)
        );
        assert_eq!(cfg.worker_id, "127.0.0.1:8000");
    }

    #[test]
    fn every_contract_flag_parses() {
        let a = parse(&[
            "--listen",
            "127.0.0.1:9",
            "--served-model-name",
            "m",
            "--tokenizer",
            "t",
            "--kv-events-endpoint",
            "tcp://127.0.0.1:1",
            "--replay-endpoint",
            "tcp://127.0.0.1:2",
            "--kv-events-topic",
            "x",
            "--event-encoding",
            "array",
            "--block-size",
            "32",
            "--num-gpu-blocks",
            "2000",
            "--max-num-seqs",
            "8",
            "--max-num-batched-tokens",
            "512",
            "--max-model-len",
            "4096",
            "--profile",
            "test",
            "--time-scale",
            "10",
            "--hash-seed",
            "random",
            "--seed",
            "3",
            "--worker-id",
            "w1",
            "--prefix-caching-hash-algo",
            "sha256_cbor",
            "--none-hash-seed",
            "42",
        ])
        .unwrap();
        let cfg = a.server_config().unwrap();
        assert_eq!(cfg.engine.prefix_caching_hash_algo, HashAlgo::Sha256Cbor);
        assert_eq!(cfg.engine.none_hash_seed, "42");
        assert_eq!(cfg.engine.num_gpu_blocks, 2000);
        assert_eq!(cfg.engine.max_num_seqs, 8);
        assert_eq!(cfg.kv_events.unwrap().encoding, Encoding::Array);
        assert_eq!((cfg.worker_id.as_str(), cfg.time_scale), ("w1", 10.0));
    }

    #[test]
    fn bad_values_are_errors() {
        assert!(parse(&["--tokenizer", "t", "--hash-seed", "x"]).is_err());
        assert!(parse(&["--tokenizer", "t", "--event-encoding", "json"]).is_err());
        assert!(parse(&["--tokenizer", "t", "--prefix-caching-hash-algo", "sha256"]).is_err());
        let a = parse(&["--tokenizer", "t", "--profile", "h100"]).unwrap();
        assert!(matches!(a.server_config(), Err(ArgsError::Profile(_))));
        let a = parse(&["--tokenizer", "t", "--replay-endpoint", "tcp://127.0.0.1:2"]).unwrap();
        assert!(matches!(
            a.server_config(),
            Err(ArgsError::ReplayWithoutPub)
        ));
    }
}
