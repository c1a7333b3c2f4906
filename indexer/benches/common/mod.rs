//! Helpers shared by the benchmarks: conversations of a given size, the
//! `BlockStored` batch of a prompt, percentiles, the picker configuration.

#![allow(dead_code)] // each benchmark uses a subset

use kvsteer_indexer::{
    app::build_picker,
    config::Config,
    index::Index,
    picker::{PickInput, Picker},
    prompt::Prompt,
};
use kvsteer_kv_events::{BlockHash, BlockStored, EventBatch, KvEvent};
use kvsteer_tokenize::{ChatMessage, ChatRequest, Content, PromptTokenizer};
use prometheus_client::registry::Registry;
use rand::{Rng, rngs::SmallRng};
use std::time::Duration;
use std::{collections::HashMap, sync::Arc};

pub const MODEL: &str = "Qwen/Qwen3-8B";
pub const WORDS: &[&str] = &[
    "the", "request", "worker", "cache", "prefix", "token", "latency", "queue", "engine", "router",
    "block", "index", "memory", "schedule", "batch", "decode", "prefill", "model", "error",
    "retry", "kernel", "thread", "buffer", "stream", "offset", "value", "result", "function",
    "return", "struct", "trait", "async", "await", "future", "lock", "atomic",
];

pub use kvsteer_e2e::shared_dir as shared;

pub fn text(rng: &mut SmallRng, words: usize) -> String {
    let mut s = String::with_capacity(words * 7);
    for i in 0..words {
        if i > 0 {
            s.push(if i % 17 == 0 { '\n' } else { ' ' });
        }
        s.push_str(WORDS[rng.random_range(0..WORDS.len())]);
    }
    s
}

pub fn msg(role: &str, content: String) -> ChatMessage {
    ChatMessage {
        role: role.into(),
        content: Content::Text(content),
        ..Default::default()
    }
}

/// A conversation of ~`tokens` prompt tokens, ending with a user turn.
pub fn conversation(tok: &PromptTokenizer, rng: &mut SmallRng, tokens: usize) -> ChatRequest {
    let mut req = ChatRequest {
        messages: vec![msg("system", "You are a careful coding assistant.".into())],
        ..Default::default()
    };
    let per_turn = (tokens / 8).clamp(100, 2000);
    loop {
        req.messages.push(msg("user", text(rng, per_turn / 2)));
        let n = tok.chat_token_ids(&req).unwrap().len();
        if n >= tokens {
            return req;
        }
        req.messages.push(msg("assistant", text(rng, per_turn / 2)));
    }
}

pub fn stored(ids: &[u32], first_hash: u64) -> EventBatch {
    let full = ids.len() / 16 * 16;
    EventBatch {
        ts: 0.0,
        events: vec![KvEvent::BlockStored(BlockStored {
            block_hashes: (0..full as u64 / 16)
                .map(|i| BlockHash::U64(first_hash + i))
                .collect(),
            token_ids: ids[..full].to_vec(),
            block_size: 16,
            medium: Some("GPU".into()),
            ..Default::default()
        })],
        data_parallel_rank: None,
    }
}

/// p50, p90, p99.
pub fn percentiles(mut v: Vec<Duration>) -> [Duration; 3] {
    v.sort_unstable();
    [50, 90, 99].map(|p| v[(v.len() * p / 100).min(v.len() - 1)])
}

/// A configuration with the Qwen3 tokenizer and `workers` workers;
/// `extra` is appended (e.g. an `index:` section).
pub fn config(workers: usize, extra: &str) -> Config {
    let dir = shared().join("tokenizers/qwen3");
    Config::from_yaml(&format!(
        "models: [{{name: {MODEL}, tokenizer: {}}}]\nworkers:\n{}{extra}",
        dir.display(),
        (1..=workers)
            .map(|i| format!(
                "  - {{name: w{i}, endpoint: 127.0.0.1:{}, model: {MODEL}}}\n",
                8000 + i
            ))
            .collect::<String>()
    ))
    .expect("benchmark config")
}

/// The next turn of `prev`: an answer and a new user message.
pub fn next_turn(prev: &ChatRequest, rng: &mut SmallRng) -> ChatRequest {
    let mut next = prev.clone();
    next.messages.push(msg("assistant", text(rng, 40)));
    next.messages.push(msg("user", text(rng, 30)));
    next
}

/// A pick of a chat request, no tenant.
pub fn chat_input(request_id: String, req: ChatRequest) -> PickInput {
    PickInput {
        request_id,
        tenant: String::new(),
        model: MODEL.into(),
        prompt: Ok(Prompt::Chat(req)),
        cache_salt: None,
    }
}

/// The Qwen3 tokenizer and a picker over 8 workers that uses it, with its
/// index.
pub fn tokenizing_picker() -> (Arc<Picker>, Arc<PromptTokenizer>, Index) {
    let tok =
        Arc::new(PromptTokenizer::from_dir(&shared().join("tokenizers/qwen3")).expect("tokenizer"));
    let tokenizers = HashMap::from([(MODEL.to_owned(), tok.clone())]);
    let picker = build_picker(&config(8, ""), tokenizers, &mut Registry::default());
    let index = picker.index().clone();
    (picker, tok, index)
}
