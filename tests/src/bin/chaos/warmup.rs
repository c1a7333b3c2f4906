//! Warm-up: the indexer's bounded memories full before its RSS baseline.
//!
//! The RSS check looks for memory that grows and stays, not for bounded
//! caches filling up (RELIABILITY.md, "the indexer's memory"). Two of them
//! would otherwise fill over the whole soak:
//! - the tokenizer's segment cache (an LRU of ~4M tokens, filled mostly by
//!   the reset bodies: ~2.2M tokens after 10 minutes): [`fill_segment_cache`]
//!   sends unique prompts to `/debug/score` (a dry run that tokenizes,
//!   routes nothing) until the cache stops growing: over the last
//!   [`WINDOW`] prompts it grew by less than one prompt (each of its 16
//!   shards evicts what a new prompt brings);
//! - the placement memory (every block routed within `placement_window_s`,
//!   600 s by default: the soak's length): the soak's indexer runs with
//!   [`window_s`], so it is at its steady size before the baseline (see
//!   `layout::indexer_config`).

use std::time::{Duration, Instant};

use kvsteer_e2e::MODEL;
use serde_json::json;

use crate::traffic::{Rng, words};

/// The soak indexer's `scoring.placement_window_s` and `route_window_s`
/// for a run of `duration` seconds: the route window's default (60 s) for
/// runs of 300 s or more, 10 s for shorter ones (the CI-sized run judges
/// 45 s). The route memories reach their steady size within two windows of
/// the indexer's start.
pub fn window_s(duration: f64) -> u64 {
    if duration >= 300.0 { 60 } else { 10 }
}
/// Words of one prefill prompt (one token each, ~16k tokens).
const PROMPT_WORDS: usize = 16_000;
/// Stop after this many prompts whatever the cache says (a cache bound
/// larger than the default, or a cache that is off).
const MAX_PROMPTS: usize = 600;
/// The cache is full once it grew by less than one prompt over this many
/// prompts (its shards are picked by hash: one evicting says little).
pub const WINDOW: usize = 16;

/// What the prefill did.
#[derive(Debug, Clone, PartialEq)]
pub struct Filled {
    /// Seconds from the start when it ended.
    pub at: f64,
    pub prompts: usize,
    /// Segment-cache tokens at the end.
    pub tokens: u64,
    /// Whether the cache was seen evicting (full).
    pub full: bool,
}

/// Sends unique prompts to the indexer's `/debug/score` until its segment
/// cache is full (see the module doc).
pub async fn fill_segment_cache(t0: Instant, seed: u64) -> Filled {
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .build()
        .expect("a reqwest client");
    let mut rng = Rng::new(seed);
    // (cache tokens after, prompt tokens) of every prompt sent.
    let mut seen: Vec<(u64, u64)> = Vec::new();
    let mut prompts = 0;
    let mut full = false;
    while prompts < MAX_PROMPTS && !full {
        let text = format!(
            "prefill {seed} {prompts}: {}",
            words(&mut rng, PROMPT_WORDS)
        );
        let body = json!({"model": MODEL, "messages": [{"role": "user", "content": text}]});
        let tokens = match http
            .post("http://127.0.0.1:9091/debug/score")
            .json(&body)
            .send()
            .await
        {
            Ok(r) => r
                .json::<serde_json::Value>()
                .await
                .ok()
                .and_then(|v| v["prompt_tokens"].as_u64())
                .unwrap_or(0),
            // The indexer stopped or restarting: try again.
            Err(_) => 0,
        };
        prompts += 1;
        // A prompt not tokenized (busy, degraded) says nothing.
        if tokens == 0 {
            continue;
        }
        let Some(after) = cache_tokens(&http).await else {
            continue;
        };
        seen.push((after, tokens));
        full = stopped_growing(&seen);
    }
    Filled {
        at: t0.elapsed().as_secs_f64(),
        prompts,
        tokens: seen.last().map_or(0, |s| s.0),
        full,
    }
}

/// `seen`: (cache tokens after, prompt tokens) per prompt tokenized.
/// Whether over the last [`WINDOW`] prompts the cache grew by less than
/// one prompt's tokens.
pub fn stopped_growing(seen: &[(u64, u64)]) -> bool {
    if seen.len() <= WINDOW {
        return false;
    }
    let (first, last) = (seen[seen.len() - 1 - WINDOW].0, seen[seen.len() - 1]);
    last.0.saturating_sub(first) < last.1
}

async fn cache_tokens(http: &reqwest::Client) -> Option<u64> {
    let text = http
        .get("http://127.0.0.1:9091/metrics")
        .send()
        .await
        .ok()?
        .text()
        .await
        .ok()?;
    Some(crate::memory::sizes(&text).segment_tokens)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cache_is_full_once_it_stops_growing_over_a_window() {
        const P: u64 = 16_000;
        // Growing by every prompt, then one shard evicting now and then.
        let mut seen: Vec<(u64, u64)> = (1..=40).map(|i| (i * P, P)).collect();
        assert!(!stopped_growing(&seen));
        let top = 40 * P;
        seen.extend((1..=WINDOW as u64).map(|i| (top + (i % 4 == 0) as u64 * P, P)));
        assert!(!stopped_growing(&seen), "one more prompt's worth");
        // Every shard evicting: flat (or shrinking) over a window.
        seen.extend((0..WINDOW).map(|i| (top + P - (i as u64 % 3) * 100, P)));
        assert!(stopped_growing(&seen));
        assert!(!stopped_growing(&seen[..WINDOW]), "too few to tell");
    }
}
