//! Splitting text at added-token occurrences, exactly as `tokenizers` does
//! before it normalises and runs the model.
//!
//! `tokenizers` first cuts the raw text at every added token that is matched
//! un-normalised (leftmost-longest), then normalises (NFC for Qwen3),
//! pre-tokenises and encodes each remaining piece on its own. So the ids of a
//! text are the concatenation of the ids of its pieces, and a piece's ids can
//! be cached by its text. This holds only when every added token is matched
//! on the raw text with no whitespace stripping or word-boundary rule
//! (`normalized`, `lstrip`, `rstrip`, `single_word` all false) and special
//! tokens are split out (`encode_special_tokens` false); otherwise
//! [`Splitter::new`] returns `None` and the caller must not cache.

use aho_corasick::{AhoCorasick, AhoCorasickBuilder, MatchKind};
use tokenizers::Tokenizer;

/// One piece of a text: an added token, or the text between two.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Segment<'a> {
    Added(u32),
    Text(&'a str),
}

#[derive(Debug)]
pub struct Splitter {
    matcher: AhoCorasick,
    ids: Vec<u32>,
}

// === impl Splitter ===

impl Splitter {
    /// `None` when the tokenizer's added tokens make piecewise encoding unsafe.
    pub fn new(tokenizer: &Tokenizer) -> Option<Self> {
        if tokenizer.get_added_vocabulary().get_encode_special_tokens() {
            return None;
        }
        let mut patterns = Vec::new();
        let mut ids = Vec::new();
        let decoder = tokenizer.get_added_tokens_decoder();
        let mut tokens: Vec<_> = decoder.into_iter().collect();
        tokens.sort_by_key(|(id, _)| *id);
        for (_, token) in tokens {
            if token.normalized || token.lstrip || token.rstrip || token.single_word {
                return None;
            }
            if token.content.is_empty() || patterns.contains(&token.content) {
                continue;
            }
            // The id tokenizers itself resolves the content to.
            let id = tokenizer.token_to_id(&token.content)?;
            patterns.push(token.content);
            ids.push(id);
        }
        let matcher = AhoCorasickBuilder::new()
            .match_kind(MatchKind::LeftmostLongest)
            .build(&patterns)
            .ok()?;
        Some(Splitter { matcher, ids })
    }

    /// The pieces of `text`, in order; empty text pieces are skipped.
    pub fn split<'a>(&'a self, text: &'a str) -> impl Iterator<Item = Segment<'a>> + 'a {
        let mut matches = self.matcher.find_iter(text);
        let mut pos = 0;
        let mut pending: Option<u32> = None;
        std::iter::from_fn(move || {
            if let Some(id) = pending.take() {
                return Some(Segment::Added(id));
            }
            match matches.next() {
                Some(m) => {
                    let id = self.ids[m.pattern().as_usize()];
                    let before = &text[pos..m.start()];
                    pos = m.end();
                    if before.is_empty() {
                        Some(Segment::Added(id))
                    } else {
                        pending = Some(id);
                        Some(Segment::Text(before))
                    }
                }
                None if pos < text.len() => {
                    let rest = &text[pos..];
                    pos = text.len();
                    Some(Segment::Text(rest))
                }
                None => None,
            }
        })
    }
}
