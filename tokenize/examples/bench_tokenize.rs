//! Time to tokenize turn n+1 of a growing conversation (~8k and ~32k
//! tokens) with the segment cache warm from turn n, versus cold.
//!
//! Run: `cargo run --release -p kvsteer-tokenize --example bench_tokenize`
//! (set `KVSTEER_SHARED` if `shared/` is not beside the workspace).

use std::path::PathBuf;
use std::time::{Duration, Instant};

use kvsteer_tokenize::{ChatRequest, PromptTokenizer};
use rand::{Rng, SeedableRng, rngs::SmallRng};
use serde_json::{Value, json};

const WORDS: &[&str] = &[
    "the",
    "queue",
    "worker",
    "retry",
    "priority",
    "lease",
    "timeout",
    "database",
    "index",
    "returns",
    "error",
    "because",
    "when",
    "async",
    "tokio",
    "spawn",
    "mutex",
    "channel",
    "bounded",
    "latency",
    "request",
    "prefix",
    "cache",
    "token",
    "engine",
    "scheduler",
    "résumé",
    "naïve",
    "数据库",
    "缓存",
    "🚀",
    "fn",
    "impl",
    "struct",
    "let",
    "match",
    "Ok(())",
];
const ITERATIONS: usize = 7;

fn shared_dir() -> PathBuf {
    std::env::var_os("KVSTEER_SHARED")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../../shared")))
}

fn paragraph(rng: &mut SmallRng, words: usize) -> String {
    let mut s = String::new();
    for i in 0..words {
        if i > 0 {
            s.push(if rng.random_bool(0.08) { '\n' } else { ' ' });
        }
        s.push_str(WORDS[rng.random_range(0..WORDS.len())]);
        if rng.random_bool(0.05) {
            s.push_str(&format!(" {}", rng.random_range(0..100_000)));
        }
    }
    s
}

fn request(messages: &[Value]) -> ChatRequest {
    ChatRequest::from_openai(&json!({ "messages": messages })).expect("request")
}

fn median(mut d: Vec<Duration>) -> Duration {
    d.sort();
    d[d.len() / 2]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn bench(tok: &PromptTokenizer, target_tokens: usize, rng: &mut SmallRng) {
    // Grow a conversation until it reaches the target size: that is turn n.
    let mut messages = vec![json!({"role": "system", "content": paragraph(rng, 60)})];
    loop {
        messages.push(json!({"role": "user", "content": paragraph(rng, 250)}));
        let len = tok
            .encode(&tok.render_chat(&request(&messages)).unwrap(), false)
            .unwrap()
            .len();
        if len >= target_tokens {
            break;
        }
        messages.push(json!({"role": "assistant", "content": paragraph(rng, 350)}));
    }
    let turn_n = request(&messages);
    messages.push(json!({"role": "assistant", "content": paragraph(rng, 350)}));
    messages.push(json!({"role": "user", "content": paragraph(rng, 250)}));
    let turn_next = request(&messages);

    let n_ids = tok.chat_token_ids(&turn_n).unwrap();
    let next_ids = tok.chat_token_ids(&turn_next).unwrap();
    let text = tok.render_chat(&turn_next).unwrap();
    assert_eq!(
        next_ids,
        tok.encode(&text, false).unwrap(),
        "cached ids must equal uncached"
    );

    let (mut render, mut uncached, mut cold, mut warm) = (vec![], vec![], vec![], vec![]);
    let mut served = 0;
    for _ in 0..ITERATIONS {
        let t = Instant::now();
        let text = tok.render_chat(&turn_next).unwrap();
        render.push(t.elapsed());

        let t = Instant::now();
        std::hint::black_box(tok.encode(&text, false).unwrap());
        uncached.push(t.elapsed());

        tok.clear_cache();
        let t = Instant::now();
        std::hint::black_box(tok.chat_token_ids(&turn_next).unwrap());
        cold.push(t.elapsed());

        tok.clear_cache();
        tok.chat_token_ids(&turn_n).unwrap();
        let before = tok.cache_stats().tokens_served;
        let t = Instant::now();
        std::hint::black_box(tok.chat_token_ids(&turn_next).unwrap());
        warm.push(t.elapsed());
        served = tok.cache_stats().tokens_served - before;
    }
    let (cold, warm) = (median(cold), median(warm));
    println!(
        "{:>6} tokens (turn n {:>6}, {} messages): render {:7.2} ms | uncached encode {:7.2} ms | \
         cold cache {:7.2} ms | warm from turn n {:7.2} ms ({} of {} ids from cache) | speedup x{:.1}",
        next_ids.len(),
        n_ids.len(),
        messages.len(),
        ms(median(render)),
        ms(median(uncached)),
        ms(cold),
        ms(warm),
        served,
        next_ids.len(),
        cold.as_secs_f64() / warm.as_secs_f64(),
    );
}

fn main() {
    let dir = shared_dir().join("tokenizers/qwen3");
    let tok = PromptTokenizer::from_dir(&dir).expect("load tokenizer");
    let mut rng = SmallRng::seed_from_u64(1);
    println!(
        "segment cache enabled: {} (median of {ITERATIONS} runs, 1 thread)",
        tok.cache_enabled()
    );
    for target in [8_000, 32_000] {
        bench(&tok, target, &mut rng);
    }
    println!("{:?}", tok.cache_stats());
}
