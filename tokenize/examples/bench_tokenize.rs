//! Time to tokenize turn n+1 of a growing conversation (~8k and ~32k
//! tokens): cold (nothing cached) and with the segment cache warm from turn
//! n, next to a plain `tokenizers` encode of the same rendered text, and
//! where a plain `tokenizers` encode spends its time.
//!
//! Run: `cargo run --release -p kvsteer-tokenize --example bench_tokenize`
//! (set `KVSTEER_SHARED` if `shared/` is not beside the workspace). Uses only
//! the public API, so the same file builds against an older
//! `kvsteer-tokenize` for an old-vs-new comparison ("Speed" in the
//! crate README).

use std::path::PathBuf;
use std::time::{Duration, Instant};

use kvsteer_tokenize::{ChatRequest, PromptTokenizer};
use rand::{Rng, SeedableRng, rngs::SmallRng};
use serde_json::{Value, json};
use tokenizers::{Model, OffsetType, PreTokenizer, Tokenizer};

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
const ITERATIONS: usize = 15;
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

/// (p50, p90) in ms.
fn pct(mut d: Vec<Duration>) -> (f64, f64) {
    d.sort();
    let at = |q: f64| ms(d[((d.len() - 1) as f64 * q).round() as usize]);
    (at(0.5), at(0.9))
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// Where a plain `tokenizers` encode spends its time: added-token split +
/// NFC, the split regex, byte-level mapping, BPE, building the `Encoding`.
fn stages(tk: &Tokenizer, text: &str) -> [Duration; 5] {
    let t0 = Instant::now();
    let mut pre = tk
        .get_added_vocabulary()
        .extract_and_normalize(tk.get_normalizer(), text);
    let t1 = Instant::now();
    let Some(tokenizers::pre_tokenizers::PreTokenizerWrapper::Sequence(seq)) =
        tk.get_pre_tokenizer()
    else {
        panic!("expected a Sequence pre-tokenizer");
    };
    let [split, byte_level] = seq.as_ref() else {
        panic!("expected Split + ByteLevel");
    };
    split.pre_tokenize(&mut pre).unwrap();
    let t2 = Instant::now();
    byte_level.pre_tokenize(&mut pre).unwrap();
    let t3 = Instant::now();
    pre.tokenize(|n| tk.get_model().tokenize(n.get())).unwrap();
    let t4 = Instant::now();
    std::hint::black_box(pre.into_encoding(None, 0, OffsetType::None).unwrap());
    let t5 = Instant::now();
    [t1 - t0, t2 - t1, t3 - t2, t4 - t3, t5 - t4]
}

fn bench(tok: &PromptTokenizer, tk: &Tokenizer, target_tokens: usize, rng: &mut SmallRng) {
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
    tok.clear_cache();
    let next_ids = tok.chat_token_ids(&turn_next).unwrap();
    let text = tok.render_chat(&turn_next).unwrap();
    assert_eq!(
        next_ids,
        tk.encode_fast(text.as_str(), false).unwrap().get_ids(),
        "ids must equal a plain tokenizers encode"
    );

    let mut t: [Vec<Duration>; 6] = Default::default();
    let mut st: [Vec<Duration>; 5] = Default::default();
    let mut served = 0;
    let time = |i: usize, t: &mut [Vec<Duration>; 6], f: &mut dyn FnMut()| {
        let start = Instant::now();
        f();
        t[i].push(start.elapsed());
    };
    for _ in 0..ITERATIONS {
        time(0, &mut t, &mut || {
            std::hint::black_box(tok.render_chat(&turn_next).unwrap());
        });
        time(1, &mut t, &mut || {
            std::hint::black_box(tk.encode_fast(text.as_str(), false).unwrap());
        });
        time(2, &mut t, &mut || {
            std::hint::black_box(tk.encode(text.as_str(), false).unwrap());
        });
        tok.clear_cache();
        time(3, &mut t, &mut || {
            std::hint::black_box(tok.chat_token_ids(&turn_next).unwrap());
        });
        // Cold again, but the second request in a row of the same text: the
        // segments are cached now (an upper bound on a cache hit).
        time(4, &mut t, &mut || {
            std::hint::black_box(tok.chat_token_ids(&turn_next).unwrap());
        });
        tok.clear_cache();
        tok.chat_token_ids(&turn_n).unwrap();
        let before = tok.cache_stats().tokens_served;
        time(5, &mut t, &mut || {
            std::hint::black_box(tok.chat_token_ids(&turn_next).unwrap());
        });
        served = tok.cache_stats().tokens_served - before;
        for (acc, d) in st.iter_mut().zip(stages(tk, &text)) {
            acc.push(d);
        }
    }
    let [render, plain_fast, plain, cold, hit, warm] = t.map(pct);
    println!(
        "{:>6} tokens (turn n {:>6}, {} messages, {} KB), p50/p90 ms over {ITERATIONS} runs:",
        next_ids.len(),
        n_ids.len(),
        messages.len(),
        text.len() / 1024,
    );
    let row = |name: &str, (p50, p90): (f64, f64)| {
        println!("  {name:<44} {p50:8.2} {p90:8.2}");
    };
    row("render (chat template)", render);
    row("plain tokenizers encode_fast (no offsets)", plain_fast);
    row("plain tokenizers encode (offsets)", plain);
    row("cold pick: chat_token_ids, nothing cached", cold);
    row("same request again (every segment cached)", hit);
    row("warm from turn n", warm);
    println!(
        "  cold / plain encode_fast: x{:.2} (p50)   warm: {served} of {} ids from cache",
        cold.0 / plain_fast.0,
        next_ids.len()
    );
    let names = [
        "added split+NFC",
        "split regex",
        "byte-level",
        "BPE",
        "into_encoding",
    ];
    let stage_p50: Vec<String> = st
        .into_iter()
        .zip(names)
        .map(|(d, n)| format!("{n} {:.2}", pct(d).0))
        .collect();
    println!(
        "  plain encode_fast stages, p50 ms: {}",
        stage_p50.join(" | ")
    );
}

fn main() {
    let dir = shared_dir().join("tokenizers/qwen3");
    let tok = PromptTokenizer::from_dir(&dir).expect("load tokenizer");
    let tk = Tokenizer::from_file(dir.join("tokenizer.json")).expect("load tokenizers");
    let mut rng = SmallRng::seed_from_u64(1);
    println!("segment cache enabled: {}, 1 thread", tok.cache_enabled());
    for target in [8_000, 32_000] {
        bench(&tok, &tk, target, &mut rng);
    }
    println!("{:?}", tok.cache_stats());
}
