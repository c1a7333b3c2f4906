//! The fast encoder (`fast.rs`: ASCII runs split by hand, cut at
//! pre-tokenizer boundaries, the rest left to `tokenizers`) gives exactly
//! the ids of a plain `tokenizers` encode of the whole text.

mod common;

use common::qwen3;
use kvsteer_tokenize::PromptTokenizer;
use rand::{Rng, SeedableRng, rngs::SmallRng};

/// Everything the split regex distinguishes on ASCII (letters of the
/// contractions in both cases, digits, apostrophes, punctuation, every kind
/// of whitespace run), controls left to the slow path, and non-ASCII text
/// next to it: Unicode letters, numbers, spaces (NBSP, ideographic, line
/// separator), combining marks that compose with an ASCII letter before
/// them, CJK, emoji.
const ATOMS: &[&str] = &[
    "a", "b", "s", "S", "t", "T", "r", "R", "e", "E", "v", "m", "M", "l", "L", "d", "D", "x", "Z",
    "0", "7", "'", "'", "\"", ".", ",", "!", "(", ")", "_", "-", "~", "`", "{", "}", "#", "/",
    "\\", " ", " ", " ", " ", "\t", "\n", "\n", "\r", "\r\n", "\u{b}", "\u{c}", "\u{0}", "\u{1f}",
    "\u{7f}", "é", "e\u{301}", "\u{301}", "\u{338}", "A\u{30a}", "中文", "😊", "\u{a0}",
    "\u{3000}", "\u{2028}", "\u{85}", "Ⅻ", "²", "١", "ß", "ﬁ", "\u{200b}",
];

fn random_text(rng: &mut SmallRng, max_atoms: usize) -> String {
    let n = rng.random_range(0..max_atoms);
    // Mostly ASCII, as prompts are: non-ASCII atoms with a small weight.
    let ascii = ATOMS
        .iter()
        .position(|a| !a.is_ascii())
        .unwrap_or(ATOMS.len());
    (0..n)
        .map(|_| {
            if rng.random_bool(0.9) {
                ATOMS[rng.random_range(0..ascii)]
            } else {
                ATOMS[rng.random_range(0..ATOMS.len())]
            }
        })
        .collect()
}

fn assert_same(tok: &PromptTokenizer, text: &str) {
    let want = tok.encode(text, false).expect("encode");
    tok.clear_cache();
    let cold = tok.encode_cached(text, false).expect("encode_cached");
    assert_eq!(cold, want, "fast ids differ for {text:?}");
    let warm = tok.encode_cached(text, false).expect("encode_cached");
    assert_eq!(warm, want, "cached fast ids differ for {text:?}");
}

#[test]
fn fast_path_is_enabled_for_qwen3() {
    let tok = qwen3();
    assert!(tok.fast_path_enabled());
}

#[test]
fn word_cache_stats_count_the_words_cached_and_clear_empties_them() {
    let tok = qwen3();
    tok.clear_cache();
    let empty = tok.word_cache_stats().expect("qwen3 has the fast path");
    assert_eq!((empty.entries, empty.tokens), (0, 0));
    tok.encode_cached("alpha beta gamma alpha", false).unwrap();
    let words = tok.word_cache_stats().unwrap();
    // ` alpha` twice is one word; `alpha` at the start is another.
    assert_eq!(words.entries, 4, "{words:?}");
    assert!(words.tokens >= words.entries, "{words:?}");
    tok.clear_cache();
    assert_eq!(tok.word_cache_stats().unwrap().entries, 0);
}

#[test]
fn fast_equals_tokenizers_on_random_texts() {
    let tok = qwen3();
    let mut rng = SmallRng::seed_from_u64(0xfa57);
    for _ in 0..6000 {
        assert_same(&tok, &random_text(&mut rng, 60));
    }
}

#[test]
fn fast_equals_tokenizers_on_long_texts_with_warm_words() {
    // Words cached from earlier texts must give the same ids in new ones.
    let tok = qwen3();
    let mut rng = SmallRng::seed_from_u64(42);
    for _ in 0..40 {
        let text = random_text(&mut rng, 3000);
        let want = tok.encode(&text, false).expect("encode");
        assert_eq!(tok.encode_cached(&text, false).expect("cached"), want);
    }
}

#[test]
fn fast_equals_tokenizers_on_known_hard_cases() {
    let tok = qwen3();
    for text in [
        "",
        " ",
        "  ",
        "\n",
        "a\n\n  b",
        "x  \n",
        "it's 'S 'Re 'rE 'll 'LL 'd 'x '",
        "   leading and trailing   ",
        "tab\tthen\t\tx",
        "\r\n\r\nwindows\r\n",
        "a.\n\nb",
        " ...\n\nend",
        "12345 abc1def 2.5e-3",
        "e\u{301}",
        "abc\u{301}def",
        "abc \u{301}",
        "x\u{a0}y \u{a0} z",
        "word\u{3000}\n中文 text",
        "\u{b}\u{c}\u{0}mixed\u{7f}",
        "a\u{338}\n>\u{338}",
        "Hello, world! 😊 done.\n",
    ] {
        assert_same(&tok, text);
    }
}
