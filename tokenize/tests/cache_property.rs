//! The segment cache never changes ids: cached == uncached encode on every
//! parity request and on random texts split at random points.

mod common;

use common::{cases, qwen3, shared_dir};
use kvsteer_tokenize::{ChatRequest, CompletionPrompt, PromptTokenizer};
use rand::{Rng, SeedableRng, rngs::SmallRng};

/// Pieces chosen to stress the added-token split and the normaliser: whole
/// and partial added tokens, NFC-composing sequences (also right after an
/// added token: `>` + U+0338 composes to `≯`), CRLF, whitespace runs,
/// contractions, digits, CJK, emoji.
const FRAGMENTS: &[&str] = &[
    "<|im_start|>",
    "<|im_end|>",
    "<|endoftext|>",
    "<think>",
    "</think>",
    "<tool_call>",
    "</tool_call>",
    "<tool_response>",
    "<|fim_prefix|>",
    "<|im_",
    "im_end|>",
    "<think",
    "</",
    "<|",
    "|>",
    ">",
    "<",
    "\u{338}",
    "e\u{301}",
    "\u{301}",
    "\u{1100}\u{1161}",
    "\u{1161}",
    "Å",
    "A\u{30a}",
    "\r\n",
    "\n",
    "\n\n",
    "   ",
    "\t",
    " ",
    "'s",
    "'LL",
    "don't",
    "123",
    "4567",
    "hello",
    " world",
    "Rust",
    "fn main() {}",
    "中文",
    "你好",
    "🇪🇸",
    "😊",
    "✈️",
    "\u{200b}",
    "\u{a0}",
    "x",
    "user",
    "assistant\n",
    "{\"a\": 1}",
    "ß",
    "ﬁ",
    "Ⅻ",
];

fn random_text(rng: &mut SmallRng) -> String {
    let n = rng.random_range(0..40);
    (0..n)
        .map(|_| FRAGMENTS[rng.random_range(0..FRAGMENTS.len())])
        .collect()
}

fn assert_same(tok: &PromptTokenizer, text: &str, special: bool) {
    let want = tok.encode(text, special).expect("encode");
    let got = tok.encode_cached(text, special).expect("encode_cached");
    assert_eq!(
        got, want,
        "cached ids differ for {text:?} (add_special_tokens={special})"
    );
}

#[test]
fn cache_is_enabled_for_qwen3() {
    assert!(qwen3().cache_enabled());
}

#[test]
fn cached_equals_uncached_on_parity_files() {
    let tok = qwen3();
    for pass in 0..2 {
        for case in cases() {
            let texts: Vec<String> = if case.endpoint == "chat" {
                let req = ChatRequest::from_openai(&case.body).expect("chat request");
                vec![tok.render_chat(&req).expect("render")]
            } else {
                match CompletionPrompt::from_openai(&case.body).expect("prompt") {
                    CompletionPrompt::Text(t) => vec![t],
                    CompletionPrompt::Texts(ts) => ts,
                    _ => vec![],
                }
            };
            for text in texts {
                assert_same(&tok, &text, false);
                assert_same(&tok, &text, true);
            }
        }
        if pass == 0 {
            assert!(tok.cache_stats().misses > 0);
        }
    }
    let stats = tok.cache_stats();
    assert!(stats.hits > 0 && stats.tokens_served > 0, "{stats:?}");
}

#[test]
fn cached_equals_uncached_on_random_texts_and_splits() {
    let tok = qwen3();
    let mut rng = SmallRng::seed_from_u64(0x5eed);
    for _ in 0..1500 {
        let text = random_text(&mut rng);
        // Warm the cache with a random prefix (cut at a char boundary), as
        // an earlier turn would, then encode the whole text.
        let cut = text
            .char_indices()
            .map(|(i, _)| i)
            .nth(rng.random_range(0..=text.chars().count()))
            .unwrap_or(text.len());
        let special = rng.random_bool(0.2);
        assert_same(&tok, &text[..cut], special);
        assert_same(&tok, &text, special);
        assert_same(&tok, &text[cut..], special);
    }
}

#[test]
fn tiny_cache_evicts_without_changing_ids() {
    let dir = shared_dir().join("tokenizers/qwen3");
    let tok = PromptTokenizer::from_dir_with_cache(&dir, 4096).expect("load");
    let mut rng = SmallRng::seed_from_u64(11);
    for _ in 0..400 {
        assert_same(&tok, &random_text(&mut rng), false);
    }
    let stats = tok.cache_stats();
    assert!(stats.tokens <= 4096 && stats.evictions > 0, "{stats:?}");
}

#[test]
fn concurrent_callers_get_the_same_ids() {
    let tok = qwen3();
    let mut rng = SmallRng::seed_from_u64(3);
    let texts: Vec<String> = (0..200).map(|_| random_text(&mut rng)).collect();
    let want: Vec<Vec<u32>> = texts
        .iter()
        .map(|t| tok.encode(t, false).unwrap())
        .collect();
    std::thread::scope(|s| {
        for offset in 0..4 {
            let (tok, texts, want) = (&tok, &texts, &want);
            s.spawn(move || {
                for i in 0..texts.len() {
                    let j = (i + offset * 50) % texts.len();
                    assert_eq!(tok.encode_cached(&texts[j], false).unwrap(), want[j]);
                }
            });
        }
    });
}

#[test]
fn tricky_boundaries() {
    let tok = qwen3();
    for text in [
        "<|im_end|>\u{338}",
        ">\u{338}",
        "a\u{301}<think>\u{301}b</think>\u{30a}",
        "<|im_start|><|im_end|><|im_start|>",
        "<|im_start|<|im_start|>|>",
        "",
        "\r\n<tool_call>\r\n",
        "   <|endoftext|>   ",
    ] {
        assert_same(&tok, text, false);
        assert_same(&tok, text, true);
    }
}
