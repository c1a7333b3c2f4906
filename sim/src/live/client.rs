//! A streaming OpenAI client that measures what a user feels: time to first
//! token, end-to-end latency, which worker answered and how much of the prompt
//! was already cached there. Used by `kvsteer-sim converse` and by the live
//! mode of `kvsteer-bench`.

use std::time::{Duration, Instant};

use futures::StreamExt;
use serde_json::Value;

/// One request as the client saw it.
#[derive(Debug, Clone, Default)]
pub struct Observed {
    pub status: u16,
    /// `x-kvsteer-worker` of the response, when the server sets it.
    pub worker: Option<String>,
    pub ttft: Option<Duration>,
    pub e2e: Duration,
    pub prompt_tokens: u64,
    pub cached_tokens: u64,
    pub completion_tokens: u64,
    /// The generated text (streamed deltas joined).
    pub text: String,
    /// The generated token ids, when the request asked for them
    /// (`return_token_ids`).
    pub token_ids: Vec<u32>,
}

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("request to {url} failed: {source}")]
    Send { url: String, source: reqwest::Error },
    #[error("reading the response from {url} failed: {source}")]
    Read { url: String, source: reqwest::Error },
}

/// Sends one streaming request (`stream: true` with usage) and reads it to the end.
pub async fn stream_request(
    client: &reqwest::Client,
    url: &str,
    body: &Value,
) -> Result<Observed, ClientError> {
    let start = Instant::now();
    let resp = client
        .post(url)
        .json(body)
        .send()
        .await
        .map_err(|source| ClientError::Send {
            url: url.to_string(),
            source,
        })?;
    let mut out = Observed {
        status: resp.status().as_u16(),
        worker: resp
            .headers()
            .get("x-kvsteer-worker")
            .and_then(|v| v.to_str().ok())
            .map(str::to_string),
        ..Observed::default()
    };
    let mut sse = SseLines::default();
    let mut stream = resp.bytes_stream();
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.map_err(|source| ClientError::Read {
            url: url.to_string(),
            source,
        })?;
        for data in sse.push(&chunk) {
            out.absorb(&data, start);
        }
    }
    out.e2e = start.elapsed();
    Ok(out)
}

impl Observed {
    fn absorb(&mut self, data: &str, start: Instant) {
        if data == "[DONE]" {
            return;
        }
        let Ok(v) = serde_json::from_str::<Value>(data) else {
            return;
        };
        let delta = v
            .pointer("/choices/0/delta/content")
            .or_else(|| v.pointer("/choices/0/text"))
            .and_then(Value::as_str)
            .unwrap_or("");
        let ids = v
            .pointer("/choices/0/token_ids")
            .and_then(Value::as_array)
            .map_or(&[][..], Vec::as_slice);
        if !delta.is_empty() || !ids.is_empty() {
            self.ttft.get_or_insert_with(|| start.elapsed());
            self.text.push_str(delta);
        }
        self.token_ids.extend(
            ids.iter()
                .filter_map(Value::as_u64)
                .filter_map(|id| u32::try_from(id).ok()),
        );
        if let Some(u) = v.get("usage").filter(|u| u.is_object()) {
            let n = |p: &str| u.pointer(p).and_then(Value::as_u64).unwrap_or(0);
            self.prompt_tokens = n("/prompt_tokens");
            self.completion_tokens = n("/completion_tokens");
            self.cached_tokens = n("/prompt_tokens_details/cached_tokens");
        }
    }
}

/// Splits a byte stream into SSE `data:` payloads, across chunk boundaries.
#[derive(Debug, Default)]
struct SseLines {
    buf: Vec<u8>,
}

impl SseLines {
    fn push(&mut self, chunk: &[u8]) -> Vec<String> {
        self.buf.extend_from_slice(chunk);
        let mut out = Vec::new();
        while let Some(pos) = self.buf.iter().position(|&b| b == b'\n') {
            let line: Vec<u8> = self.buf.drain(..=pos).collect();
            let line = String::from_utf8_lossy(&line);
            if let Some(data) = line.trim_end().strip_prefix("data:") {
                out.push(data.trim_start().to_string());
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sse_split_across_chunks() {
        let mut s = SseLines::default();
        assert!(s.push(b"data: {\"a\"").is_empty());
        assert_eq!(
            s.push(b":1}\n\ndata: [DONE]\n\n"),
            vec!["{\"a\":1}", "[DONE]"]
        );
    }

    #[test]
    fn absorbs_deltas_and_usage() {
        let mut o = Observed::default();
        let t = Instant::now();
        o.absorb(
            r#"{"choices":[{"delta":{"role":"assistant","content":""}}]}"#,
            t,
        );
        assert!(o.ttft.is_none());
        o.absorb(
            r#"{"choices":[{"delta":{"content":"hi"},"token_ids":[7]}]}"#,
            t,
        );
        o.absorb(
            r#"{"choices":[{"delta":{"content":""},"token_ids":[9]}]}"#,
            t,
        );
        o.absorb(r#"{"choices":[],"usage":{"prompt_tokens":10,"completion_tokens":1,"prompt_tokens_details":{"cached_tokens":8}}}"#, t);
        assert!(o.ttft.is_some());
        assert_eq!(
            (o.text.as_str(), o.prompt_tokens, o.cached_tokens),
            ("hi", 10, 8)
        );
        assert_eq!(o.token_ids, vec![7, 9]);
    }
}
