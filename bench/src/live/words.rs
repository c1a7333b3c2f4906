//! Text prompts for routers that only take text (`--chat`): a plan's token
//! ids become words, one word per id, such that a prefix shared in ids stays
//! a prefix shared in the tokens the engine counts.
//!
//! Every word is a single vocabulary token with a leading space (` apple`),
//! so words separated by spaces are separate pre-tokens of a GPT-style
//! byte-level BPE and each encodes to exactly its own token whatever follows.
//! Two prompts that agree on their first `k` ids agree on their first `k`
//! words, hence on the tokens of those words.

use kvsteer_tokenize::PromptTokenizer;

/// How many words the vocabulary holds: ids map onto it modulo its size.
pub const VOCABULARY: usize = 4096;

/// The vocabulary is searched among the first ids up to this bound.
const SEARCH_IDS: u32 = 60_000;

#[derive(Debug, thiserror::Error)]
pub enum WordsError {
    #[error(
        "the tokenizer has only {found} single-token words among its first {SEARCH_IDS} ids (need {VOCABULARY})"
    )]
    TooFew { found: usize },
    #[error("tokenizer: {0}")]
    Tokenizer(#[from] kvsteer_tokenize::Error),
}

/// A fixed vocabulary of single-token words.
#[derive(Debug, Clone)]
pub struct Words {
    words: Vec<String>,
}

impl Words {
    /// The first [`VOCABULARY`] ids, in id order, whose text is a space and
    /// 3–12 lowercase ASCII letters and which encode back to themselves.
    pub fn from_tokenizer(tok: &PromptTokenizer) -> Result<Self, WordsError> {
        let mut words = Vec::with_capacity(VOCABULARY);
        for id in 0..SEARCH_IDS {
            if words.len() == VOCABULARY {
                break;
            }
            let Ok(text) = tok.decode(&[id]) else {
                continue;
            };
            let Some(word) = text.strip_prefix(' ') else {
                continue;
            };
            if !(3..=12).contains(&word.len()) || !word.bytes().all(|b| b.is_ascii_lowercase()) {
                continue;
            }
            if tok.encode(&text, false)? == [id] {
                words.push(text);
            }
        }
        if words.len() < VOCABULARY {
            return Err(WordsError::TooFew { found: words.len() });
        }
        Ok(Self { words })
    }

    /// The text of `ids`: one word per id. The first word keeps its leading
    /// space, so a text is the same whatever precedes it.
    pub fn text(&self, ids: &[u32]) -> String {
        let mut out = String::with_capacity(ids.len() * 8);
        for &id in ids {
            out.push_str(&self.words[id as usize % self.words.len()]);
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tokenizer() -> PromptTokenizer {
        let shared = std::env::var_os("KVSTEER_SHARED")
            .map(std::path::PathBuf::from)
            .unwrap_or_else(|| concat!(env!("CARGO_MANIFEST_DIR"), "/../../shared").into());
        PromptTokenizer::from_dir(&shared.join("tokenizers/qwen3")).unwrap()
    }

    /// One token per id, and a shared id prefix is a shared token prefix
    /// whatever follows it.
    #[test]
    fn one_token_per_id_and_prefixes_stay_shared() {
        let tok = tokenizer();
        let words = Words::from_tokenizer(&tok).unwrap();
        let prefix: Vec<u32> = (0..300).map(|i| i * 7919 % 100_000).collect();
        let mut a = prefix.clone();
        a.extend((0..50).map(|i| i * 31 + 5));
        let mut b = prefix.clone();
        b.extend((0..80).map(|i| i * 17 + 3));
        let (ta, tb) = (
            tok.encode(&words.text(&a), false).unwrap(),
            tok.encode(&words.text(&b), false).unwrap(),
        );
        assert_eq!(ta.len(), a.len());
        assert_eq!(tb.len(), b.len());
        assert_eq!(ta[..prefix.len()], tb[..prefix.len()]);
        assert_ne!(ta[prefix.len()], tb[prefix.len()]);
        // Every word of the vocabulary, each once, in one text.
        let all: Vec<u32> = (0..VOCABULARY as u32).collect();
        assert_eq!(
            tok.encode(&words.text(&all), false).unwrap().len(),
            VOCABULARY
        );
    }
}
