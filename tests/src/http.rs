use std::time::{Duration, Instant};

use anyhow::Context;
use futures::StreamExt;
use serde_json::{Value, json};

/// What a client saw of one request.
#[derive(Debug, Clone)]
pub struct ChatReply {
    pub status: u16,
    /// `x-kvsteer-worker`: which simulated worker served it.
    pub worker: Option<String>,
    /// `retry-after` of the response, when it has one.
    pub retry_after: Option<String>,
    /// The raw response body, byte for byte.
    pub body: Vec<u8>,
    /// `usage` of the response (the final SSE chunk's, for streams).
    pub usage: Option<Value>,
    /// Time from sending to the first body byte.
    pub ttft: Duration,
}

impl ChatReply {
    pub fn cached_tokens(&self) -> u64 {
        self.usage
            .as_ref()
            .and_then(|u| u.pointer("/prompt_tokens_details/cached_tokens"))
            .and_then(Value::as_u64)
            .unwrap_or(0)
    }

    pub fn prompt_tokens(&self) -> u64 {
        self.usage
            .as_ref()
            .and_then(|u| u.get("prompt_tokens"))
            .and_then(Value::as_u64)
            .unwrap_or(0)
    }

    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    /// The assistant message: the streamed `delta.content`s joined, or the
    /// `message.content` of a plain JSON body.
    pub fn content(&self) -> String {
        if let Ok(v) = serde_json::from_slice::<Value>(&self.body) {
            return v
                .pointer("/choices/0/message/content")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_string();
        }
        self.text()
            .lines()
            .filter_map(|l| l.strip_prefix("data: "))
            .filter_map(|d| serde_json::from_str::<Value>(d).ok())
            .filter_map(|v| {
                v.pointer("/choices/0/delta/content")
                    .and_then(Value::as_str)
                    .map(str::to_string)
            })
            .collect()
    }
}

/// A streaming chat completions body with usage in the final chunk.
pub fn chat_body(model: &str, messages: &Value, max_tokens: u32) -> Value {
    json!({
        "model": model,
        "messages": messages,
        "max_tokens": max_tokens,
        "stream": true,
        "stream_options": {"include_usage": true},
    })
}

/// POSTs a JSON body to `url` (a full URL) and reads the whole response.
pub async fn send_chat(
    client: &reqwest::Client,
    url: &str,
    body: &Value,
    headers: &[(&str, &str)],
) -> anyhow::Result<ChatReply> {
    send_raw(
        client,
        url,
        "application/json",
        serde_json::to_vec(body)?,
        headers,
    )
    .await
}

/// POSTs raw bytes with a content type and reads the whole response.
pub async fn send_raw(
    client: &reqwest::Client,
    url: &str,
    content_type: &str,
    body: Vec<u8>,
    headers: &[(&str, &str)],
) -> anyhow::Result<ChatReply> {
    let mut req = client
        .post(url)
        .header("content-type", content_type)
        .body(body);
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let start = Instant::now();
    let resp = req.send().await.with_context(|| format!("POST {url}"))?;
    let status = resp.status().as_u16();
    let worker = resp
        .headers()
        .get("x-kvsteer-worker")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    let retry_after = resp
        .headers()
        .get("retry-after")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    let mut ttft = None;
    let mut body = Vec::new();
    let mut stream = resp.bytes_stream();
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.context("reading the response body")?;
        if !chunk.is_empty() && ttft.is_none() {
            ttft = Some(start.elapsed());
        }
        body.extend_from_slice(&chunk);
    }
    let usage = find_usage(&body);
    Ok(ChatReply {
        status,
        worker,
        retry_after,
        body,
        usage,
        ttft: ttft.unwrap_or_else(|| start.elapsed()),
    })
}

/// The `usage` object of a JSON body or of the last SSE chunk that has one.
fn find_usage(body: &[u8]) -> Option<Value> {
    if let Ok(v) = serde_json::from_slice::<Value>(body) {
        return v.get("usage").filter(|u| !u.is_null()).cloned();
    }
    let text = String::from_utf8_lossy(body);
    text.lines()
        .rev()
        .filter_map(|l| l.strip_prefix("data: "))
        .filter_map(|d| serde_json::from_str::<Value>(d).ok())
        .find_map(|v| v.get("usage").filter(|u| !u.is_null()).cloned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn usage_from_sse_last_chunk() {
        let body = b"data: {\"choices\":[],\"usage\":null}\n\ndata: {\"choices\":[],\"usage\":{\"prompt_tokens\":5,\"prompt_tokens_details\":{\"cached_tokens\":3}}}\n\ndata: [DONE]\n\n";
        let usage = find_usage(body).expect("usage");
        assert_eq!(usage["prompt_tokens"], 5);
        assert_eq!(usage["prompt_tokens_details"]["cached_tokens"], 3);
    }

    #[test]
    fn usage_from_plain_json() {
        let body = br#"{"id":"x","usage":{"prompt_tokens":7}}"#;
        assert_eq!(find_usage(body).expect("usage")["prompt_tokens"], 7);
        assert!(find_usage(b"garbage").is_none());
    }
}
