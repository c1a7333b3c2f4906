//! A faster encoder for text pieces (the text between added tokens) of
//! byte-level BPE tokenizers with the Qwen2/Qwen3 pipeline: NFC (or none),
//! the [`pretok::PATTERN`] split, byte-level mapping, BPE.
//!
//! `tokenizers` builds offset-tracking strings for every normalisation and
//! split step, runs onig once per piece and a `String` per token; on a 32k
//! token prompt that is nearly all of the time. Here the piece is cut at
//! [`pretok::is_boundary`] positions into runs: runs of plain ASCII are split
//! by [`pretok::split`] and each word's ids come from a word cache (or the
//! tokenizer's own BPE model on a miss); every other run (anything non-ASCII
//! or a rare control character) is encoded by `tokenizers` itself. A cut
//! never changes the ids (see `is_boundary`), so the result is the same as
//! encoding the whole piece; `tests/fast_property.rs` checks it on random
//! texts and the parity files.

use std::sync::Arc;

use tokenizers::models::ModelWrapper;
use tokenizers::normalizers::NormalizerWrapper;
use tokenizers::pre_tokenizers::PreTokenizerWrapper;
use tokenizers::pre_tokenizers::split::SplitPattern;
use tokenizers::{Model, SplitDelimiterBehavior, Tokenizer};

use crate::cache::{Key, SegmentCache};
use crate::error::Error;
use crate::pretok;

/// Word cache budget in tokens (each entry is also charged the cache's
/// per-entry overhead): about 50k distinct words, a few MB.
const WORD_CACHE_TOKENS: usize = 1 << 20;

#[derive(Debug)]
pub struct FastEncoder {
    /// Word (raw ASCII bytes) → ids.
    words: SegmentCache,
}

// === impl FastEncoder ===

impl FastEncoder {
    /// `None` unless the tokenizer's pipeline is exactly the one this
    /// encoder reproduces.
    pub fn new(tokenizer: &Tokenizer) -> Option<Self> {
        match tokenizer.get_normalizer() {
            None | Some(NormalizerWrapper::NFC(_)) => {}
            Some(_) => return None,
        }
        let Some(PreTokenizerWrapper::Sequence(seq)) = tokenizer.get_pre_tokenizer() else {
            return None;
        };
        let [
            PreTokenizerWrapper::Split(split),
            PreTokenizerWrapper::ByteLevel(byte_level),
        ] = seq.as_ref()
        else {
            return None;
        };
        let split_ok = matches!(&split.pattern, SplitPattern::Regex(p) if p == pretok::PATTERN)
            && split.behavior == SplitDelimiterBehavior::Isolated
            && !split.invert;
        let byte_level_ok = !byte_level.add_prefix_space && !byte_level.use_regex;
        // Caching a word's ids needs a deterministic model.
        let model_ok = matches!(
            tokenizer.get_model(),
            ModelWrapper::BPE(bpe) if bpe.dropout.is_none_or(|d| d == 0.0)
        );
        (split_ok && byte_level_ok && model_ok).then(|| FastEncoder {
            words: SegmentCache::new(WORD_CACHE_TOKENS),
        })
    }

    /// Appends the ids of `text` (which holds no added token) to `out`: the
    /// ids `tokenizer.encode_fast(text, false)` gives.
    pub fn encode(
        &self,
        tokenizer: &Tokenizer,
        text: &str,
        out: &mut Vec<u32>,
    ) -> Result<(), Error> {
        let bytes = text.as_bytes();
        // The current run [run_start, chunk_start) and whether it is ASCII;
        // the chunk [chunk_start, p) between two boundaries being scanned.
        let (mut run_start, mut run_fast) = (0, true);
        let (mut chunk_start, mut chunk_fast) = (0, true);
        for p in 1..=bytes.len() {
            chunk_fast &= pretok::is_fast_byte(bytes[p - 1]);
            if p < bytes.len() && !pretok::is_boundary(bytes, p) {
                continue;
            }
            if chunk_fast != run_fast && chunk_start > run_start {
                self.encode_run(tokenizer, &text[run_start..chunk_start], run_fast, out)?;
                run_start = chunk_start;
            }
            run_fast = chunk_fast;
            (chunk_start, chunk_fast) = (p, true);
        }
        if bytes.len() > run_start {
            self.encode_run(tokenizer, &text[run_start..], run_fast, out)?;
        }
        Ok(())
    }

    /// Drops every cached word.
    pub fn clear(&self) {
        self.words.clear();
    }

    /// The word cache's size and counters.
    pub fn stats(&self) -> crate::cache::CacheStats {
        self.words.stats()
    }

    fn encode_run(
        &self,
        tokenizer: &Tokenizer,
        run: &str,
        fast: bool,
        out: &mut Vec<u32>,
    ) -> Result<(), Error> {
        if !fast {
            let enc = tokenizer
                .encode_fast(run, false)
                .map_err(|e| Error::Encode(e.to_string()))?;
            out.extend_from_slice(enc.get_ids());
            return Ok(());
        }
        let model = tokenizer.get_model();
        let mut result = Ok(());
        let mut mapped = String::new();
        pretok::split(run.as_bytes(), |word| {
            if result.is_err() {
                return;
            }
            let key = Key::of_bytes(word);
            if let Some(ids) = self.words.get(key) {
                out.extend_from_slice(&ids);
                return;
            }
            mapped.clear();
            mapped.extend(word.iter().map(|&b| byte_char(b)));
            match model.tokenize(&mapped) {
                Ok(tokens) => {
                    let ids: Arc<[u32]> = tokens.iter().map(|t| t.id).collect();
                    out.extend_from_slice(&ids);
                    self.words.insert(key, ids);
                }
                Err(e) => result = Err(Error::Encode(e.to_string())),
            }
        });
        result
    }
}

/// The byte-level (GPT-2) alphabet for an ASCII byte: printable characters
/// stand for themselves, the bytes 0..=32 are moved to U+0100..=U+0120.
fn byte_char(b: u8) -> char {
    match b {
        b'!'..=b'~' => char::from(b),
        _ => char::from_u32(0x100 + u32::from(b)).unwrap_or(char::REPLACEMENT_CHARACTER),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_chars_are_gpt2_alphabet() {
        assert_eq!(byte_char(b' '), 'Ġ');
        assert_eq!(byte_char(b'\n'), 'Ċ');
        assert_eq!(byte_char(b'\t'), 'ĉ');
        assert_eq!(byte_char(b'\r'), 'č');
        assert_eq!(byte_char(b'a'), 'a');
        assert_eq!(byte_char(b'~'), '~');
    }
}
