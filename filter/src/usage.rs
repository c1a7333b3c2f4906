//! Finds the `"usage": {...}` object at the end of a response body, SSE or
//! plain JSON, while keeping only a bounded tail of the stream.
//!
//! vLLM puts usage in the last data chunk of a stream (with
//! `stream_options.include_usage`) and near the end of a JSON response, so the
//! last `"usage"` whose value is an object within the tail is the one.
//!
//! Anthropic's `/v1/messages` (as vLLM 0.32 serves it) splits the prompt
//! into `input_tokens` (not cached), `cache_read_input_tokens` and
//! `cache_creation_input_tokens`, and counts `output_tokens`; its stream's
//! last usage is in `message_delta` (the one in `message_start` has no
//! output yet).

use kvsteer_proto::v1::Usage;
use serde_json::Value;

/// Bytes of the response tail kept for the usage scan.
pub const DEFAULT_TAIL_BYTES: usize = 16 * 1024;

const KEY: &[u8] = b"\"usage\"";

#[derive(Clone, Debug)]
pub struct UsageScanner {
    tail: Vec<u8>,
    capacity: usize,
}

// === impl UsageScanner ===

impl Default for UsageScanner {
    fn default() -> Self {
        Self::with_capacity(DEFAULT_TAIL_BYTES)
    }
}

impl UsageScanner {
    pub fn with_capacity(capacity: usize) -> Self {
        Self {
            tail: Vec::new(),
            capacity: capacity.max(KEY.len()),
        }
    }

    /// How many trailing bytes of a chunk of `len` bytes are worth reading.
    pub fn wanted(&self, len: usize) -> usize {
        len.min(self.capacity)
    }

    /// Appends the (tail of the) next body chunk.
    pub fn push(&mut self, chunk: &[u8]) {
        self.tail.extend_from_slice(chunk);
        // Trim in batches so pushes stay amortised O(chunk).
        if self.tail.len() > 2 * self.capacity {
            let excess = self.tail.len() - self.capacity;
            self.tail.drain(..excess);
        }
    }

    /// Bytes held right now (at most twice the capacity).
    pub fn held(&self) -> usize {
        self.tail.len()
    }

    /// The last usage object in the kept tail.
    pub fn usage(&self) -> Option<Usage> {
        let start = self.tail.len().saturating_sub(self.capacity);
        let tail = &self.tail[start..];
        let mut end = tail.len();
        while let Some(at) = rfind(&tail[..end], KEY) {
            if let Some(usage) = usage_at(&tail[at + KEY.len()..]) {
                return Some(usage);
            }
            end = at;
        }
        None
    }
}

/// Parses `: {...}` at the start of `rest` as a usage object.
fn usage_at(rest: &[u8]) -> Option<Usage> {
    let rest = skip_ws(rest).strip_prefix(b":")?;
    let rest = skip_ws(rest);
    if rest.first() != Some(&b'{') {
        return None;
    }
    let mut values = serde_json::Deserializer::from_slice(rest).into_iter::<Value>();
    let value = values.next()?.ok()?;
    let count = |v: &Value| v.as_u64().and_then(|n| u32::try_from(n).ok());
    if let Some(prompt_tokens) = value.get("prompt_tokens").and_then(count) {
        return Some(Usage {
            prompt_tokens,
            completion_tokens: value.get("completion_tokens").and_then(count).unwrap_or(0),
            cached_tokens: value
                .get("prompt_tokens_details")
                .and_then(|d| d.get("cached_tokens"))
                .and_then(count)
                .unwrap_or(0),
        });
    }
    // Anthropic's prompt is input + cache reads + cache writes.
    let input_tokens = value.get("input_tokens").and_then(count)?;
    let cache_read = value
        .get("cache_read_input_tokens")
        .and_then(count)
        .unwrap_or(0);
    let cache_creation = value
        .get("cache_creation_input_tokens")
        .and_then(count)
        .unwrap_or(0);
    Some(Usage {
        prompt_tokens: input_tokens
            .saturating_add(cache_read)
            .saturating_add(cache_creation),
        completion_tokens: value.get("output_tokens").and_then(count).unwrap_or(0),
        cached_tokens: cache_read,
    })
}

fn skip_ws(bytes: &[u8]) -> &[u8] {
    let n = bytes.iter().take_while(|b| b.is_ascii_whitespace()).count();
    &bytes[n..]
}

fn rfind(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).rposition(|w| w == needle)
}

#[cfg(test)]
mod tests {
    use super::*;

    const SSE: &str = concat!(
        "data: {\"id\":\"c\",\"choices\":[{\"delta\":{\"content\":\"Hi\"}}],\"usage\":null}\n\n",
        "data: {\"id\":\"c\",\"choices\":[{\"delta\":{\"content\":\" \\\"usage\\\"\"}}],\"usage\":null}\n\n",
        "data: {\"id\":\"c\",\"choices\":[],\"usage\":{\"prompt_tokens\":12,\"total_tokens\":15,",
        "\"completion_tokens\":3,\"prompt_tokens_details\":{\"cached_tokens\":8}}}\n\n",
        "data: [DONE]\n\n",
    );

    fn expected() -> Usage {
        Usage {
            prompt_tokens: 12,
            completion_tokens: 3,
            cached_tokens: 8,
        }
    }

    #[test]
    fn finds_usage_in_a_sse_stream_split_anywhere() {
        let bytes = SSE.as_bytes();
        for split_a in 0..bytes.len() {
            let split_b = (split_a + 37).min(bytes.len());
            let mut scanner = UsageScanner::default();
            scanner.push(&bytes[..split_a]);
            scanner.push(&bytes[split_a..split_b]);
            scanner.push(&bytes[split_b..]);
            assert_eq!(scanner.usage(), Some(expected()), "split at {split_a}");
        }
    }

    #[test]
    fn finds_usage_byte_by_byte() {
        let mut scanner = UsageScanner::default();
        for b in SSE.as_bytes() {
            scanner.push(std::slice::from_ref(b));
        }
        assert_eq!(scanner.usage(), Some(expected()));
    }

    #[test]
    fn finds_usage_in_a_json_response() {
        let body = r#"{"id":"cmpl-1","choices":[{"text":"x","usage":"not this"}],
            "usage": {"prompt_tokens": 7, "completion_tokens": 1, "total_tokens": 8},
            "kv_transfer_params": null}"#;
        let mut scanner = UsageScanner::default();
        scanner.push(body.as_bytes());
        assert_eq!(
            scanner.usage(),
            Some(Usage {
                prompt_tokens: 7,
                completion_tokens: 1,
                cached_tokens: 0
            })
        );
    }

    /// vLLM's `/v1/messages` stream: `message_start` carries the input
    /// count, `message_delta` (the last usage) the output count too.
    #[test]
    fn finds_anthropic_usage_in_stream_and_response() {
        let stream = concat!(
            "event: message_start\n",
            "data: {\"type\":\"message_start\",\"message\":{\"id\":\"m\",\"content\":[],",
            "\"usage\":{\"input_tokens\":40,\"output_tokens\":0}}}\n\n",
            "event: content_block_delta\n",
            "data: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"x\"}}\n\n",
            "event: message_delta\n",
            "data: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\"},",
            "\"usage\":{\"input_tokens\":8,\"output_tokens\":5,\"cache_read_input_tokens\":32}}\n\n",
            "event: message_stop\n",
            "data: {\"type\":\"message_stop\"}\n\n",
        );
        let mut scanner = UsageScanner::default();
        scanner.push(stream.as_bytes());
        assert_eq!(
            scanner.usage(),
            Some(Usage {
                prompt_tokens: 40,
                completion_tokens: 5,
                cached_tokens: 32
            })
        );
        let body = r#"{"id":"m","type":"message","role":"assistant","content":[{"type":"text","text":"hi"}],
            "model":"m","stop_reason":"end_turn","stop_sequence":null,
            "usage":{"input_tokens":12,"output_tokens":2}}"#;
        let mut scanner = UsageScanner::default();
        scanner.push(body.as_bytes());
        assert_eq!(
            scanner.usage(),
            Some(Usage {
                prompt_tokens: 12,
                completion_tokens: 2,
                cached_tokens: 0
            })
        );
    }

    #[test]
    fn no_usage_when_absent_null_or_cut() {
        let mut scanner = UsageScanner::default();
        scanner.push(b"data: {\"usage\":null}\n\ndata: [DONE]\n\n");
        assert_eq!(scanner.usage(), None);
        let mut cut = UsageScanner::default();
        cut.push(b"{\"usage\":{\"prompt_tokens\":3,");
        assert_eq!(cut.usage(), None);
        assert_eq!(UsageScanner::default().usage(), None);
    }

    #[test]
    fn keeps_only_a_bounded_tail() {
        let mut scanner = UsageScanner::with_capacity(256);
        let filler = format!(
            "data: {{\"choices\":[{{\"delta\":{{\"content\":\"{}\"}}}}]}}\n\n",
            "x".repeat(100)
        );
        for _ in 0..1000 {
            scanner.push(filler.as_bytes());
            assert!(scanner.held() <= 2 * 256 + filler.len());
        }
        scanner.push(
            b"data: {\"usage\":{\"prompt_tokens\":1,\"completion_tokens\":2}}\n\ndata: [DONE]\n\n",
        );
        assert_eq!(scanner.usage().map(|u| u.completion_tokens), Some(2));
        assert_eq!(scanner.wanted(10_000), 256);
        assert_eq!(scanner.wanted(10), 10);
    }

    #[test]
    fn usage_outside_the_tail_is_not_found() {
        let mut scanner = UsageScanner::with_capacity(64);
        scanner.push(b"{\"usage\":{\"prompt_tokens\":1}}");
        scanner.push(&[b' '; 200]);
        assert_eq!(scanner.usage(), None);
    }
}
