//! [`PromptTokenizer`]: a model directory's tokenizer + chat template, and
//! the segment cache in front of the encoder.

use std::path::Path;
use std::sync::Arc;

use serde_json::{Map, Value};
use tokenizers::Tokenizer;

use crate::cache::{CacheStats, DEFAULT_CACHE_TOKENS, Key, SegmentCache};
use crate::error::Error;
use crate::fast::FastEncoder;
use crate::normalize::normalize;
use crate::request::{ChatRequest, CompletionPrompt};
use crate::segments::{Segment, Splitter};
use crate::template::ChatTemplate;

/// HF `special_tokens_map` keys a template may read.
const SPECIAL_TOKEN_KEYS: [&str; 7] = [
    "bos_token",
    "eos_token",
    "unk_token",
    "sep_token",
    "pad_token",
    "cls_token",
    "mask_token",
];

/// Request → prompt token ids, as vLLM computes them. `Send + Sync`; share
/// it in an `Arc`.
#[derive(Debug)]
pub struct PromptTokenizer {
    tokenizer: Tokenizer,
    template: Option<ChatTemplate>,
    /// `None` when piecewise encoding would not equal whole-text encoding.
    splitter: Option<Splitter>,
    /// The ids `add_special_tokens=true` puts around a text, when it does so
    /// uniformly (`None`: not cacheable with special tokens).
    special_wrap: Option<(Vec<u32>, Vec<u32>)>,
    /// Encodes cache misses; `None` when the pipeline is not the one it
    /// reproduces (then `tokenizers` encodes them).
    fast: Option<FastEncoder>,
    cache: SegmentCache,
    eos_token_id: Option<u32>,
    vocab_size: usize,
}

// === impl PromptTokenizer ===

impl PromptTokenizer {
    /// Loads `tokenizer.json` and `tokenizer_config.json` (chat template,
    /// special tokens; a `chat_template.jinja` file also works) with the
    /// default cache size.
    pub fn from_dir(dir: &Path) -> Result<Self, Error> {
        Self::from_dir_with_cache(dir, DEFAULT_CACHE_TOKENS)
    }

    /// As [`Self::from_dir`], caching at most about `cache_tokens` ids.
    pub fn from_dir_with_cache(dir: &Path, cache_tokens: usize) -> Result<Self, Error> {
        let tok_path = dir.join("tokenizer.json");
        let mut tokenizer =
            Tokenizer::from_file(&tok_path).map_err(|e| Error::load(&tok_path, e))?;
        tokenizer
            .with_truncation(None)
            .map_err(|e| Error::load(&tok_path, e))?;
        tokenizer.with_padding(None);
        // Added/special tokens written in the text become their single id
        // (the tokenizers default; vLLM never encodes them as plain text).
        tokenizer.set_encode_special_tokens(false);

        let cfg_path = dir.join("tokenizer_config.json");
        let config: Map<String, Value> = match std::fs::read_to_string(&cfg_path) {
            Ok(text) => serde_json::from_str(&text).map_err(|e| Error::load(&cfg_path, e))?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Map::new(),
            Err(e) => return Err(Error::load(&cfg_path, e)),
        };
        let special_tokens = special_tokens_map(&config);
        let template = match chat_template_source(dir, &config)? {
            Some(source) => Some(ChatTemplate::new(&source, special_tokens.clone())?),
            None => None,
        };
        let eos_token_id = special_tokens
            .get("eos_token")
            .and_then(Value::as_str)
            .and_then(|t| tokenizer.token_to_id(t));
        let splitter = Splitter::new(&tokenizer);
        let fast = FastEncoder::new(&tokenizer);
        let special_wrap = probe_special_wrap(&tokenizer);
        let vocab_size = tokenizer.get_vocab_size(true);
        Ok(PromptTokenizer {
            tokenizer,
            template,
            splitter,
            special_wrap,
            fast,
            cache: SegmentCache::new(cache_tokens),
            eos_token_id,
            vocab_size,
        })
    }

    /// The prompt text the chat template renders for `req`.
    pub fn render_chat(&self, req: &ChatRequest) -> Result<String, Error> {
        let template = self
            .template
            .as_ref()
            .ok_or_else(|| Error::Template("the tokenizer has no chat template".into()))?;
        template.render(&normalize(req)?)
    }

    /// The prompt ids of a chat request (cached encode of the rendered text).
    pub fn chat_token_ids(&self, req: &ChatRequest) -> Result<Vec<u32>, Error> {
        let text = self.render_chat(req)?;
        self.encode_cached(&text, req.add_special_tokens.unwrap_or(false))
    }

    /// The prompt ids of a completions request, one `Vec` per prompt.
    pub fn completion_token_ids(
        &self,
        prompt: &CompletionPrompt,
        add_special_tokens: Option<bool>,
    ) -> Result<Vec<Vec<u32>>, Error> {
        let special = add_special_tokens.unwrap_or(true);
        match prompt {
            CompletionPrompt::Text(text) => Ok(vec![self.encode_cached(text, special)?]),
            CompletionPrompt::Texts(texts) => texts
                .iter()
                .map(|t| self.encode_cached(t, special))
                .collect(),
            CompletionPrompt::Ids(ids) => Ok(vec![self.checked_ids("prompt", ids)?]),
            CompletionPrompt::IdBatch(batch) => batch
                .iter()
                .enumerate()
                .map(|(i, ids)| self.checked_ids(&format!("prompt[{i}]"), ids))
                .collect(),
        }
    }

    /// Encodes `text` without the cache; added tokens written in the text
    /// become their single id.
    pub fn encode(&self, text: &str, add_special_tokens: bool) -> Result<Vec<u32>, Error> {
        self.tokenizer
            .encode_fast(text, add_special_tokens)
            .map(|enc| enc.get_ids().to_vec())
            .map_err(|e| Error::Encode(e.to_string()))
    }

    /// Encodes `text` through the segment cache: only pieces between added
    /// tokens not seen before are encoded. Same ids as [`Self::encode`].
    pub fn encode_cached(&self, text: &str, add_special_tokens: bool) -> Result<Vec<u32>, Error> {
        let Some(splitter) = &self.splitter else {
            return self.encode(text, add_special_tokens);
        };
        let (prefix, suffix): (&[u32], &[u32]) = match (&self.special_wrap, add_special_tokens) {
            (_, false) => (&[], &[]),
            (Some((p, s)), true) => (p, s),
            (None, true) => return self.encode(text, true),
        };
        let mut out = Vec::with_capacity(text.len() / 3 + prefix.len() + suffix.len());
        out.extend_from_slice(prefix);
        for segment in splitter.split(text) {
            match segment {
                Segment::Added(id) => out.push(id),
                Segment::Text(piece) => {
                    let key = Key::of(piece);
                    match self.cache.get(key) {
                        Some(ids) => out.extend_from_slice(&ids),
                        None => {
                            let ids: Arc<[u32]> = self.encode_piece(piece)?.into();
                            out.extend_from_slice(&ids);
                            self.cache.insert(key, ids);
                        }
                    }
                }
            }
        }
        out.extend_from_slice(suffix);
        Ok(out)
    }

    /// Ids of a text piece holding no added token.
    fn encode_piece(&self, piece: &str) -> Result<Vec<u32>, Error> {
        match &self.fast {
            Some(fast) => {
                let mut ids = Vec::with_capacity(piece.len() / 3);
                fast.encode(&self.tokenizer, piece, &mut ids)?;
                Ok(ids)
            }
            None => self.encode(piece, false),
        }
    }

    pub fn decode(&self, ids: &[u32]) -> Result<String, Error> {
        self.tokenizer
            .decode(ids, false)
            .map_err(|e| Error::Encode(e.to_string()))
    }

    pub fn eos_token_id(&self) -> Option<u32> {
        self.eos_token_id
    }

    /// Vocabulary size including added tokens (`len(tokenizer)` in HF).
    pub fn vocab_size(&self) -> usize {
        self.vocab_size
    }

    pub fn cache_stats(&self) -> CacheStats {
        self.cache.stats()
    }

    /// The fast path's word cache (`None` when the fast path is off),
    /// bounded at about 1M tokens (`fast.rs`).
    pub fn word_cache_stats(&self) -> Option<CacheStats> {
        self.fast.as_ref().map(|f| f.stats())
    }

    /// Drops every cached piece and word (counters are kept).
    pub fn clear_cache(&self) {
        self.cache.clear();
        if let Some(fast) = &self.fast {
            fast.clear();
        }
    }

    /// Whether cache misses are encoded by the fast ASCII path (`fast.rs`)
    /// rather than by `tokenizers` alone.
    pub fn fast_path_enabled(&self) -> bool {
        self.fast.is_some() && self.splitter.is_some()
    }

    /// Whether [`Self::encode_cached`] actually uses the cache for this
    /// tokenizer (see `segments` for when it cannot).
    pub fn cache_enabled(&self) -> bool {
        self.splitter.is_some()
    }

    fn checked_ids(&self, at: &str, ids: &[u32]) -> Result<Vec<u32>, Error> {
        match ids.iter().find(|&&id| id as usize >= self.vocab_size) {
            Some(id) => Err(Error::invalid(format!(
                "`{at}` has token id {id}, out of vocabulary (size {})",
                self.vocab_size
            ))),
            None => Ok(ids.to_vec()),
        }
    }
}

/// HF `special_tokens_map`: the configured special tokens as strings.
fn special_tokens_map(config: &Map<String, Value>) -> Map<String, Value> {
    let as_text = |v: &Value| match v {
        Value::String(s) => Some(s.clone()),
        Value::Object(o) => o.get("content").and_then(Value::as_str).map(str::to_owned),
        _ => None,
    };
    let mut map = Map::new();
    for key in SPECIAL_TOKEN_KEYS {
        if let Some(text) = config.get(key).and_then(as_text) {
            map.insert(key.to_owned(), Value::String(text));
        }
    }
    if let Some(Value::Array(extra)) = config.get("additional_special_tokens") {
        let extra: Vec<Value> = extra
            .iter()
            .filter_map(as_text)
            .map(Value::String)
            .collect();
        map.insert("additional_special_tokens".to_owned(), Value::Array(extra));
    }
    map
}

/// `chat_template` from the config (a string, or named templates with a
/// `default`), else a `chat_template.jinja` file beside it.
fn chat_template_source(dir: &Path, config: &Map<String, Value>) -> Result<Option<String>, Error> {
    match config.get("chat_template") {
        Some(Value::String(s)) => return Ok(Some(s.clone())),
        Some(Value::Array(named)) => {
            let default = named
                .iter()
                .find(|t| t.get("name") == Some(&Value::from("default")));
            if let Some(s) = default
                .and_then(|t| t.get("template"))
                .and_then(Value::as_str)
            {
                return Ok(Some(s.to_owned()));
            }
        }
        _ => {}
    }
    let path = dir.join("chat_template.jinja");
    match std::fs::read_to_string(&path) {
        Ok(s) => Ok(Some(s)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(Error::load(&path, e)),
    }
}

/// Finds the ids `add_special_tokens=true` adds around a text by comparing
/// probes; `None` when they do not wrap every probe the same way.
fn probe_special_wrap(tokenizer: &Tokenizer) -> Option<(Vec<u32>, Vec<u32>)> {
    let mut wrap: Option<(Vec<u32>, Vec<u32>)> = None;
    for probe in ["a", "Hello, world!", " two\nlines "] {
        let plain = tokenizer.encode_fast(probe, false).ok()?.get_ids().to_vec();
        let special = tokenizer.encode_fast(probe, true).ok()?.get_ids().to_vec();
        let start = (0..=special.len().checked_sub(plain.len())?)
            .find(|&i| special[i..i + plain.len()] == plain[..])?;
        let found = (
            special[..start].to_vec(),
            special[start + plain.len()..].to_vec(),
        );
        match &wrap {
            Some(w) if *w != found => return None,
            _ => wrap = Some(found),
        }
    }
    wrap
}
