//! Steady mixed traffic through Envoy: a fixed number of client sessions,
//! each running multi-turn chat conversations and completions, streamed or
//! not, until told to stop; and client resets (a large body, then the
//! connection dropped while the pick is outstanding).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use futures::StreamExt;
use kvsteer_e2e::MODEL;
use serde_json::{Value, json};
use tokio::io::AsyncWriteExt;

const ENVOY: &str = "http://127.0.0.1:8080";
/// A request that takes longer than this counts as failed.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(60);

/// What one request came to.
#[derive(Debug, Clone)]
pub struct Outcome {
    pub session: usize,
    pub api: &'static str,
    pub stream: bool,
    /// Seconds since the soak's start.
    pub start: f64,
    pub end: f64,
    pub status: u16,
    /// `x-kvsteer-worker` of the response, when headers arrived.
    pub worker: Option<String>,
    /// `None`: a complete, well-formed answer.
    pub error: Option<String>,
}

/// A small deterministic generator (SplitMix64): the same seed gives the
/// same traffic.
pub struct Rng(u64);

// === impl Rng ===

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `lo..=hi`.
    pub fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.next() % (hi - lo + 1)
    }

    pub fn chance(&mut self, percent: u64) -> bool {
        self.next() % 100 < percent
    }
}

const WORDS: [&str; 24] = [
    "cache", "prefix", "worker", "token", "router", "latency", "queue", "block", "engine",
    "stream", "tensor", "batch", "memory", "budget", "signal", "kernel", "socket", "replay",
    "ledger", "shard", "metric", "window", "packet", "vector",
];

/// `n` pseudo-random words.
pub fn words(rng: &mut Rng, n: usize) -> String {
    (0..n)
        .map(|_| WORDS[rng.range(0, WORDS.len() as u64 - 1) as usize])
        .collect::<Vec<_>>()
        .join(" ")
}

/// Shared system prompts: sessions reuse them, so prefixes repeat.
fn system_prompt(k: u64) -> String {
    format!(
        "You are assistant number {k} of the chaos soak. {}",
        (0..40)
            .map(|i| format!("Rule {i}: answer briefly and stay on topic {k}."))
            .collect::<Vec<_>>()
            .join(" ")
    )
}

pub struct Traffic {
    pub http: reqwest::Client,
    pub t0: Instant,
    pub stop: Arc<AtomicBool>,
}

// === impl Traffic ===

impl Traffic {
    fn now(&self) -> f64 {
        self.t0.elapsed().as_secs_f64()
    }

    /// One session: conversations until `stop`; every request's outcome.
    pub async fn session(self: Arc<Self>, id: usize, seed: u64) -> Vec<Outcome> {
        let mut rng = Rng::new(seed);
        let mut out = Vec::new();
        while !self.stop.load(Ordering::Relaxed) {
            if rng.chance(70) {
                // A conversation of 2-4 turns, each turn's answer kept.
                let mut messages =
                    vec![json!({"role": "system", "content": system_prompt(rng.range(0, 2))})];
                for _ in 0..rng.range(2, 4) {
                    if self.stop.load(Ordering::Relaxed) {
                        break;
                    }
                    let n = rng.range(10, 60) as usize;
                    messages.push(json!({"role": "user", "content": words(&mut rng, n)}));
                    let stream = rng.chance(50);
                    let body = json!({
                        "model": MODEL, "messages": messages, "stream": stream,
                        "max_tokens": rng.range(4, 16),
                    });
                    let (o, answer) = self
                        .request(id, "chat", "/v1/chat/completions", body, stream)
                        .await;
                    let failed = o.error.is_some();
                    out.push(o);
                    if failed {
                        break;
                    }
                    messages.push(json!({"role": "assistant", "content": answer}));
                    tokio::time::sleep(Duration::from_millis(rng.range(20, 200))).await;
                }
            } else {
                let stream = rng.chance(50);
                let n = rng.range(50, 300) as usize;
                let body = json!({
                    "model": MODEL, "prompt": words(&mut rng, n), "stream": stream,
                    "max_tokens": rng.range(4, 16),
                });
                let (o, _) = self
                    .request(id, "completions", "/v1/completions", body, stream)
                    .await;
                out.push(o);
            }
            tokio::time::sleep(Duration::from_millis(rng.range(20, 200))).await;
        }
        out
    }

    /// Sends one request and reads it to the end: its outcome and the
    /// generated text.
    async fn request(
        &self,
        session: usize,
        api: &'static str,
        path: &str,
        body: Value,
        stream: bool,
    ) -> (Outcome, String) {
        let start = self.now();
        let mut o = Outcome {
            session,
            api,
            stream,
            start,
            end: start,
            status: 0,
            worker: None,
            error: None,
        };
        let result = tokio::time::timeout(REQUEST_TIMEOUT, async {
            let resp = self
                .http
                .post(format!("{ENVOY}{path}"))
                .json(&body)
                .send()
                .await
                .map_err(|e| format!("send: {e}"))?;
            o.status = resp.status().as_u16();
            o.worker = resp
                .headers()
                .get("x-kvsteer-worker")
                .and_then(|v| v.to_str().ok())
                .map(str::to_string);
            let mut bytes = Vec::new();
            let mut s = resp.bytes_stream();
            while let Some(chunk) = s.next().await {
                bytes.extend_from_slice(&chunk.map_err(|e| format!("body: {e}"))?);
            }
            Ok::<_, String>(bytes)
        })
        .await;
        o.end = self.now();
        let text = match result {
            Err(_) => {
                o.error = Some(format!("no answer within {REQUEST_TIMEOUT:?}"));
                return (o, String::new());
            }
            Ok(Err(e)) => {
                o.error = Some(e);
                return (o, String::new());
            }
            Ok(Ok(bytes)) => bytes,
        };
        let text = String::from_utf8_lossy(&text).into_owned();
        if o.status != 200 {
            o.error = Some(format!(
                "HTTP {}: {}",
                o.status,
                text.chars().take(200).collect::<String>()
            ));
            return (o, String::new());
        }
        match answer(&text, stream) {
            Ok(a) => (o, a),
            Err(e) => {
                o.error = Some(e);
                (o, String::new())
            }
        }
    }
}

/// The generated text of a complete response, or why it is not one.
fn answer(body: &str, stream: bool) -> Result<String, String> {
    if !stream {
        let v: Value = serde_json::from_str(body).map_err(|e| format!("not JSON ({e})"))?;
        let c = &v["choices"][0];
        return c["message"]["content"]
            .as_str()
            .or_else(|| c["text"].as_str())
            .map(str::to_string)
            .ok_or_else(|| "no choices in the response".to_string());
    }
    if !body.ends_with("data: [DONE]\n\n") {
        return Err("stream truncated (no [DONE])".into());
    }
    let mut text = String::new();
    for data in body.split("\n\n").filter_map(|e| e.strip_prefix("data: ")) {
        if data == "[DONE]" {
            break;
        }
        let v: Value = serde_json::from_str(data).map_err(|e| format!("bad chunk ({e})"))?;
        let c = &v["choices"][0];
        if let Some(t) = c["delta"]["content"]
            .as_str()
            .or_else(|| c["text"].as_str())
        {
            text.push_str(t);
        }
    }
    Ok(text)
}

/// A client that sends a large chat body through Envoy, waits `hold`
/// (while the filter's pick is outstanding) and drops the connection.
pub async fn client_reset(rng: &mut Rng, hold: Duration) -> anyhow::Result<usize> {
    let n = rng.range(8_000, 20_000) as usize;
    let body = serde_json::to_vec(&json!({
        "model": MODEL,
        "messages": [{"role": "user", "content": words(rng, n)}],
        "max_tokens": 8,
        "stream": true,
    }))?;
    let mut s = tokio::net::TcpStream::connect("127.0.0.1:8080").await?;
    let head = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: 127.0.0.1:8080\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
        body.len()
    );
    s.write_all(head.as_bytes()).await?;
    s.write_all(&body).await?;
    tokio::time::sleep(hold).await;
    drop(s);
    Ok(body.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_of_complete_and_broken_bodies() {
        let sse = "data: {\"choices\":[{\"delta\":{\"role\":\"assistant\",\"content\":\"\"}}]}\n\ndata: {\"choices\":[{\"delta\":{\"content\":\"hi\"}}]}\n\ndata: [DONE]\n\n";
        assert_eq!(answer(sse, true).unwrap(), "hi");
        assert!(answer(&sse[..sse.len() - 14], true).is_err());
        let whole = r#"{"choices":[{"message":{"content":"yes"}}]}"#;
        assert_eq!(answer(whole, false).unwrap(), "yes");
        assert!(answer("upstream connect error", false).is_err());
    }

    #[test]
    fn rng_is_deterministic_and_in_range() {
        let (mut a, mut b) = (Rng::new(7), Rng::new(7));
        for _ in 0..100 {
            let x = a.range(3, 9);
            assert_eq!(x, b.range(3, 9));
            assert!((3..=9).contains(&x));
        }
    }
}
