//! Bounded tokenization: what one pick may cost the service.
//!
//! Encoding takes ~300 bytes of transient memory per byte of prompt text
//! (the tokenizer's per-byte alignments and per-token strings): two
//! concurrent 3.8 MB chat bodies took the indexer from 116 MB to 2.35 GB.
//! So, per pick:
//! - a prompt with more text than its model's `max_tokenize_bytes` (derived
//!   from `max_model_len`: such a prompt has more tokens than the engine
//!   accepts) is not tokenized: the pick is scored on load only,
//!   `prompt_too_large`; so is one with more tokens than `max_model_len`;
//! - a large prompt (`tokenize.large_prompt_bytes`) is encoded on a blocking
//!   thread under a permit: at most `tokenize.max_concurrent_large` at once,
//!   a pick finding none free is scored on load only at once
//!   (`tokenize_busy`) rather than queued behind the others;
//! - when the pick's caller is gone (the gRPC deadline passed or the filter
//!   reset the stream: tonic drops the pick's future), the encode is not
//!   started, or stops between rendering the template and encoding, and its
//!   result is discarded (`kvsteer_tokenize_cancelled_total`). The permit
//!   is held until the blocking work really ends, so the memory bound holds
//!   for abandoned picks too.
//!
//! Small prompts are encoded inline: a cold encode is a few ms at most, a
//! warm one (segment cache) tens of µs, and a hand-off to another thread
//! would cost a wakeup on every pick.
//!
//! After each encode the tokenizers' cache sizes (segment cache, word
//! cache; every tokenizer this encoder has seen, summed) go to the
//! `kvsteer_tokenize_*cache*` gauges: they are bounded, and most of what the
//! indexer's memory grows by while it warms up (RELIABILITY.md).

use crate::{metrics::Metrics, prompt::Prompt};
use kvsteer_tokenize::{CacheStats, CompletionPrompt, PromptTokenizer};
use parking_lot::Mutex;
use std::{
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::Instant,
};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// Why a pick has no token ids: it is scored on load only, `degraded`
/// with [`Unread::reason`] as the metric label.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum Unread {
    #[error("tokenize_failed: {0}")]
    Failed(String),
    #[error("prompt_too_large: {bytes} bytes of prompt text > max_tokenize_bytes {cap}")]
    TooLarge { bytes: u64, cap: u64 },
    #[error("prompt_too_large: {tokens} tokens > max_model_len {max}")]
    TooManyTokens { tokens: usize, max: u32 },
    #[error("tokenize_busy: {0} large prompts already tokenizing")]
    Busy(usize),
    #[error("cancelled: the pick's caller is gone")]
    Cancelled,
}

/// A model's bounds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Prompt text beyond which the prompt is not tokenized.
    pub max_bytes: u64,
    pub max_model_len: u32,
}

/// The service's tokenization gate, shared by every pick.
pub struct Encoder {
    large_bytes: usize,
    max_large: usize,
    large: Arc<Semaphore>,
    metrics: Arc<Metrics>,
    /// The tokenizers encoded with (one per model), for the cache gauges.
    tokenizers: Mutex<Vec<Arc<PromptTokenizer>>>,
}

/// Set when the pick's future is dropped before its encode returned.
struct CancelOnDrop(Arc<AtomicBool>);

/// A large tokenization holding its permit, counted in the gauge until the
/// blocking work ends (also when it panics).
struct Running {
    _permit: OwnedSemaphorePermit,
    metrics: Arc<Metrics>,
}

// === impl Unread ===

impl Unread {
    /// The `reason` label of `kvsteer_degraded_picks_total`.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::Failed(_) => "tokenize_failed",
            Self::TooLarge { .. } | Self::TooManyTokens { .. } => "prompt_too_large",
            Self::Busy(_) => "tokenize_busy",
            Self::Cancelled => "cancelled",
        }
    }
}

// === impl Encoder ===

impl Encoder {
    pub fn new(large_bytes: usize, max_large: usize, metrics: Arc<Metrics>) -> Self {
        Self {
            large_bytes,
            max_large,
            large: Arc::new(Semaphore::new(max_large)),
            metrics,
            tokenizers: Mutex::new(Vec::new()),
        }
    }

    /// The prompt's token ids (the first prompt of a completions batch),
    /// within `limits`.
    pub async fn ids(
        &self,
        tok: Option<&Arc<PromptTokenizer>>,
        limits: Limits,
        prompt: Prompt,
    ) -> Result<Vec<u32>, Unread> {
        // Token ids are the prompt: no tokenizer, no copy.
        let prompt = match prompt {
            Prompt::Completion {
                prompt: CompletionPrompt::Ids(ids),
                ..
            } => return within_model_len(ids, limits),
            Prompt::Completion {
                prompt: CompletionPrompt::IdBatch(mut batch),
                ..
            } if !batch.is_empty() => return within_model_len(batch.swap_remove(0), limits),
            other => other,
        };
        let tok = tok.ok_or_else(|| Unread::Failed("no tokenizer loaded".into()))?;
        let bytes = prompt.text_bytes() as u64;
        if bytes > limits.max_bytes {
            return Err(Unread::TooLarge {
                bytes,
                cap: limits.max_bytes,
            });
        }
        let start = Instant::now();
        let ids = if bytes <= self.large_bytes as u64 {
            encode(tok, &prompt, &AtomicBool::new(false))
        } else {
            self.encode_large(tok, prompt).await
        };
        if !matches!(ids, Err(Unread::Busy(_))) {
            self.metrics
                .tokenize_latency
                .observe(start.elapsed().as_secs_f64());
        }
        self.cache_gauges(tok);
        within_model_len(ids?, limits)
    }

    /// Sets the cache gauges from every tokenizer seen (`tok` included): a
    /// few dozen uncontended shard locks, small beside an encode.
    fn cache_gauges(&self, tok: &Arc<PromptTokenizer>) {
        let mut seen = self.tokenizers.lock();
        if !seen.iter().any(|t| Arc::ptr_eq(t, tok)) {
            seen.push(tok.clone());
        }
        let (segments, words) = cache_totals(&seen);
        drop(seen);
        let m = &self.metrics;
        m.tokenize_cache_tokens.set(gauge(segments.tokens));
        m.tokenize_cache_entries.set(gauge(segments.entries));
        m.tokenize_word_cache_tokens.set(gauge(words.tokens));
        m.tokenize_word_cache_entries.set(gauge(words.entries));
    }

    async fn encode_large(
        &self,
        tok: &Arc<PromptTokenizer>,
        prompt: Prompt,
    ) -> Result<Vec<u32>, Unread> {
        let permit = self
            .large
            .clone()
            .try_acquire_owned()
            .map_err(|_| Unread::Busy(self.max_large))?;
        let cancel = CancelOnDrop(Arc::new(AtomicBool::new(false)));
        let cancelled = cancel.0.clone();
        let tok = tok.clone();
        let metrics = self.metrics.clone();
        let running = Running::start(permit, metrics);
        let task = tokio::task::spawn_blocking(move || {
            let out = encode(&tok, &prompt, &cancelled);
            if matches!(out, Err(Unread::Cancelled)) {
                running.metrics.tokenize_cancelled.inc();
            }
            drop(running);
            out
        });
        let out = task
            .await
            .map_err(|e| Unread::Failed(format!("tokenizer task: {e}")))?;
        drop(cancel);
        out
    }
}

impl Running {
    fn start(permit: OwnedSemaphorePermit, metrics: Arc<Metrics>) -> Self {
        metrics.tokenize_large_running.inc();
        Self {
            _permit: permit,
            metrics,
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        self.metrics.tokenize_large_running.dec();
    }
}

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

/// Encodes `prompt` unless `cancelled` is set before it starts or between
/// rendering the chat template and encoding the text (the two long steps;
/// a prompt is one text segment per message, so there is no finer point).
fn encode(
    tok: &PromptTokenizer,
    prompt: &Prompt,
    cancelled: &AtomicBool,
) -> Result<Vec<u32>, Unread> {
    let stop = || {
        if cancelled.load(Ordering::Relaxed) {
            Err(Unread::Cancelled)
        } else {
            Ok(())
        }
    };
    let failed = |e: kvsteer_tokenize::Error| Unread::Failed(e.to_string());
    stop()?;
    match prompt {
        Prompt::Chat(chat) => {
            let text = tok.render_chat(chat).map_err(failed)?;
            stop()?;
            tok.encode_cached(&text, chat.add_special_tokens.unwrap_or(false))
                .map_err(failed)
        }
        Prompt::Completion {
            prompt,
            add_special_tokens,
        } => {
            // Only the first prompt of a batch is routed on: encode it alone.
            let first;
            let single = match prompt {
                CompletionPrompt::Texts(texts) => {
                    first = CompletionPrompt::Text(texts.first().cloned().ok_or_else(empty)?);
                    &first
                }
                CompletionPrompt::IdBatch(batch) => {
                    first = CompletionPrompt::Ids(batch.first().cloned().ok_or_else(empty)?);
                    &first
                }
                single => single,
            };
            let mut batch = tok
                .completion_token_ids(single, *add_special_tokens)
                .map_err(failed)?;
            batch.pop().ok_or_else(empty)
        }
    }
}

/// `ids`, unless longer than the model takes.
fn within_model_len(ids: Vec<u32>, limits: Limits) -> Result<Vec<u32>, Unread> {
    if ids.len() > limits.max_model_len as usize {
        return Err(Unread::TooManyTokens {
            tokens: ids.len(),
            max: limits.max_model_len,
        });
    }
    Ok(ids)
}

/// The segment caches' and the word caches' sizes, summed.
fn cache_totals(tokenizers: &[Arc<PromptTokenizer>]) -> (CacheStats, CacheStats) {
    let mut segments = CacheStats::default();
    let mut words = CacheStats::default();
    for t in tokenizers {
        let s = t.cache_stats();
        segments.tokens += s.tokens;
        segments.entries += s.entries;
        if let Some(w) = t.word_cache_stats() {
            words.tokens += w.tokens;
            words.entries += w.entries;
        }
    }
    (segments, words)
}

fn gauge(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

fn empty() -> Unread {
    Unread::Failed("empty prompt batch".into())
}

#[cfg(test)]
mod tests {
    use super::*;
    use kvsteer_tokenize::{ChatMessage, ChatRequest, Content};
    use prometheus_client::registry::Registry;
    use std::time::Duration;

    fn tokenizer() -> Arc<PromptTokenizer> {
        let shared = kvsteer_e2e::shared_dir();
        Arc::new(PromptTokenizer::from_dir(&shared.join("tokenizers/qwen3")).unwrap())
    }

    fn encoder(max_large: usize) -> Arc<Encoder> {
        let metrics = Arc::new(Metrics::new(&mut Registry::default(), &[]));
        Arc::new(Encoder::new(1_000, max_large, metrics))
    }

    /// A chat prompt of `words` distinct words (never in the segment cache).
    fn chat(words: usize, salt: &str) -> Prompt {
        let text: String = (0..words).map(|i| format!("{salt}{i} ")).collect();
        Prompt::Chat(ChatRequest {
            messages: vec![ChatMessage {
                role: "user".into(),
                content: Content::Text(text),
                tool_calls: Vec::new(),
                tool_call_id: None,
                name: None,
                reasoning: None,
            }],
            tools: None,
            chat_template_kwargs: Default::default(),
            add_generation_prompt: Some(true),
            continue_final_message: None,
            add_special_tokens: None,
            reasoning_effort: None,
        })
    }

    const WIDE: Limits = Limits {
        max_bytes: 1 << 30,
        max_model_len: u32::MAX,
    };

    #[tokio::test]
    async fn small_and_large_prompts_give_the_tokenizers_ids() {
        let tok = tokenizer();
        let enc = encoder(1);
        for prompt in [chat(10, "s"), chat(2_000, "l")] {
            let Prompt::Chat(c) = &prompt else { panic!() };
            let expected = tok.chat_token_ids(c).unwrap();
            let ids = enc.ids(Some(&tok), WIDE, prompt.clone()).await.unwrap();
            assert_eq!(ids, expected);
        }
        assert_eq!(enc.large.available_permits(), 1);
        assert_eq!(enc.metrics.tokenize_large_running.get(), 0);
        // A completions batch: the first prompt only, as tokenized alone.
        let batch = Prompt::Completion {
            prompt: CompletionPrompt::Texts(vec!["a b c".into(), "d".into()]),
            add_special_tokens: None,
        };
        let first = tok
            .completion_token_ids(&CompletionPrompt::Text("a b c".into()), None)
            .unwrap();
        assert_eq!(enc.ids(Some(&tok), WIDE, batch).await.unwrap(), first[0]);
        let none = Prompt::Completion {
            prompt: CompletionPrompt::Texts(Vec::new()),
            add_special_tokens: None,
        };
        let e = enc.ids(Some(&tok), WIDE, none).await.unwrap_err();
        assert_eq!(e.reason(), "tokenize_failed");
        let e = enc.ids(None, WIDE, chat(1, "x")).await.unwrap_err();
        assert_eq!(e.reason(), "tokenize_failed");
    }

    /// The cache gauges follow the tokenizers' caches, summed over every
    /// tokenizer encoded with.
    #[tokio::test]
    async fn cache_gauges_sum_the_tokenizers_caches() {
        let (a, b) = (tokenizer(), tokenizer());
        let enc = encoder(1);
        let m = enc.metrics.clone();
        assert_eq!(m.tokenize_cache_tokens.get(), 0);
        enc.ids(Some(&a), WIDE, chat(50, "g")).await.unwrap();
        let one = a.cache_stats();
        assert!(one.tokens > 0, "{one:?}");
        assert_eq!(m.tokenize_cache_tokens.get(), one.tokens as i64);
        assert_eq!(m.tokenize_cache_entries.get(), one.entries as i64);
        let words = a.word_cache_stats().unwrap();
        assert!(words.entries > 0, "{words:?}");
        assert_eq!(m.tokenize_word_cache_entries.get(), words.entries as i64);
        assert_eq!(m.tokenize_word_cache_tokens.get(), words.tokens as i64);
        // A second tokenizer (another model) adds its own.
        enc.ids(Some(&b), WIDE, chat(50, "g")).await.unwrap();
        assert_eq!(m.tokenize_cache_tokens.get(), 2 * one.tokens as i64);
        // Emptied caches show at the next encode.
        a.clear_cache();
        b.clear_cache();
        enc.ids(
            Some(&a),
            WIDE,
            Prompt::Completion {
                prompt: CompletionPrompt::Text("x".into()),
                add_special_tokens: None,
            },
        )
        .await
        .unwrap();
        let left = a.cache_stats().tokens;
        assert_eq!(m.tokenize_cache_tokens.get(), left as i64);
    }

    /// Beyond the byte cap nothing is encoded; beyond `max_model_len`
    /// tokens the ids are not used either.
    #[tokio::test]
    async fn prompts_beyond_the_limits_are_too_large() {
        let tok = tokenizer();
        let enc = encoder(1);
        let prompt = chat(2_000, "cap");
        let bytes = prompt.text_bytes() as u64;
        let before = tok.cache_stats();
        let capped = Limits {
            max_bytes: bytes - 1,
            max_model_len: u32::MAX,
        };
        let e = enc
            .ids(Some(&tok), capped, prompt.clone())
            .await
            .unwrap_err();
        assert_eq!(
            e,
            Unread::TooLarge {
                bytes,
                cap: bytes - 1
            }
        );
        assert_eq!(e.reason(), "prompt_too_large");
        assert_eq!(tok.cache_stats().misses, before.misses, "nothing encoded");
        let short = Limits {
            max_bytes: bytes,
            max_model_len: 100,
        };
        let e = enc.ids(Some(&tok), short, prompt).await.unwrap_err();
        assert!(matches!(e, Unread::TooManyTokens { max: 100, .. }), "{e}");
        assert!(e.to_string().starts_with("prompt_too_large"), "{e}");
    }

    /// With every large-prompt permit taken, a large prompt is refused at
    /// once (no queue); a small one is still encoded.
    #[tokio::test]
    async fn large_prompts_beyond_the_permits_are_refused_not_queued() {
        let tok = tokenizer();
        let enc = encoder(1);
        let held = enc.large.clone().try_acquire_owned().unwrap();
        let e = enc
            .ids(Some(&tok), WIDE, chat(2_000, "b"))
            .await
            .unwrap_err();
        assert_eq!(e, Unread::Busy(1));
        assert_eq!(e.reason(), "tokenize_busy");
        assert!(enc.ids(Some(&tok), WIDE, chat(10, "b")).await.is_ok());
        drop(held);
        assert!(enc.ids(Some(&tok), WIDE, chat(2_000, "b")).await.is_ok());
    }

    /// A pick dropped while its large prompt waits for a blocking thread:
    /// the encode never starts, the permit comes back, and it is counted.
    #[test]
    fn a_dropped_pick_does_not_encode() {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .max_blocking_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let tok = tokenizer();
        let enc = encoder(1);
        rt.block_on(async {
            // Occupy the only blocking thread until told.
            let (release, wait) = std::sync::mpsc::channel::<()>();
            let blocker = tokio::task::spawn_blocking(move || wait.recv());
            let before = tok.cache_stats();
            let pick = tokio::spawn({
                let (enc, tok) = (enc.clone(), tok.clone());
                async move { enc.ids(Some(&tok), WIDE, chat(2_000, "gone")).await }
            });
            // The encode is queued once the permit is taken.
            until(|| enc.large.available_permits() == 0).await;
            pick.abort();
            assert!(pick.await.unwrap_err().is_cancelled());
            release.send(()).unwrap();
            blocker.await.unwrap().unwrap();
            until(|| enc.large.available_permits() == 1).await;
            assert_eq!(enc.metrics.tokenize_cancelled.get(), 1);
            assert_eq!(enc.metrics.tokenize_large_running.get(), 0);
            let after = tok.cache_stats();
            assert_eq!(
                (after.misses, after.hits),
                (before.misses, before.hits),
                "nothing encoded"
            );
        });
    }

    async fn until(mut done: impl FnMut() -> bool) {
        tokio::time::timeout(Duration::from_secs(20), async {
            while !done() {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
        .await
        .expect("condition within 20 s");
    }
}
