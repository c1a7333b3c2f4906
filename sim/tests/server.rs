//! The HTTP + ZeroMQ server, run in-process on free loopback ports with the
//! fast `test` profile (no timing assertions).

use std::path::PathBuf;
use std::time::Duration;

use kvsteer_kv_events::zmq::{PublisherConfig, fetch_replay};
use kvsteer_kv_events::{Encoding, KvEvent, decode_batch};
use kvsteer_sim::engine::EngineConfig;
use kvsteer_sim::profile::TimingProfile;
use kvsteer_sim::server::{ServerConfig, ServerHandle};
use serde_json::{Value, json};
use tokio::time::timeout;
use zeromq::{Socket, SocketRecv};

const WAIT: Duration = Duration::from_secs(20);

fn tokenizer_dir() -> PathBuf {
    let shared = kvsteer_e2e::shared_dir();
    shared.join("tokenizers/qwen3")
}

fn config(num_gpu_blocks: u32, max_model_len: usize) -> ServerConfig {
    let mut engine = EngineConfig::new(TimingProfile::by_name("test").unwrap());
    engine.num_gpu_blocks = num_gpu_blocks;
    engine.max_model_len = max_model_len;
    engine.hash_seed = 1;
    ServerConfig {
        listen: "127.0.0.1:0".parse().unwrap(),
        served_model_name: "sim-model".into(),
        tokenizer_dir: tokenizer_dir(),
        kv_events: Some(PublisherConfig {
            pub_endpoint: "tcp://127.0.0.1:0".into(),
            replay_endpoint: Some("tcp://127.0.0.1:0".into()),
            topic: "kv@test@sim-model".into(),
            encoding: Encoding::Map,
            replay_buffer_batches: 1000,
        }),
        engine,
        time_scale: 100.0,
        worker_id: "worker-a".into(),
        lora_modules: Vec::new(),
    }
}

struct Harness {
    server: ServerHandle,
    http: reqwest::Client,
    base: String,
    sub: zeromq::SubSocket,
    /// Reset probes sent at start (their batches have seqs 0..probes).
    probes: u64,
}

impl Harness {
    async fn start(cfg: ServerConfig) -> Self {
        let server = timeout(WAIT, ServerHandle::start(cfg))
            .await
            .unwrap()
            .unwrap();
        let (pub_ep, _) = server.kv_endpoints.clone().unwrap();
        let mut sub = zeromq::SubSocket::new();
        sub.connect(&pub_ep).await.unwrap();
        sub.subscribe("").await.unwrap();
        let mut h = Self {
            base: format!("http://{}", server.addr),
            server,
            http: reqwest::Client::new(),
            sub,
            probes: 0,
        };
        // PUB drops messages for subscribers it does not know yet: probe with
        // prefix-cache resets (each an AllBlocksCleared batch on an idle
        // engine) until one arrives.
        for _ in 0..100 {
            let resp = h
                .http
                .post(format!("{}/reset_prefix_cache", h.base))
                .send()
                .await
                .unwrap();
            assert_eq!(resp.status(), 200);
            h.probes += 1;
            if let Ok(msg) = timeout(Duration::from_millis(200), h.sub.recv()).await {
                let frames = msg.unwrap().into_vec();
                let events = decode_batch(&frames[2]).unwrap().batch.events;
                assert_eq!(events, vec![KvEvent::AllBlocksCleared]);
                // Late deliveries of earlier probes, if any.
                h.drain().await;
                return h;
            }
        }
        panic!("the subscriber never received a batch");
    }

    async fn post(&self, path: &str, body: &str) -> (u16, Value) {
        let resp = timeout(
            WAIT,
            self.http
                .post(format!("{}{path}", self.base))
                .body(body.to_owned())
                .send(),
        )
        .await
        .unwrap()
        .unwrap();
        let status = resp.status().as_u16();
        let text = resp.text().await.unwrap();
        (status, serde_json::from_str(&text).unwrap_or(Value::Null))
    }

    /// The next live message: (topic, seq, events).
    async fn next_batch(&mut self) -> (String, u64, Vec<KvEvent>) {
        let msg = timeout(WAIT, self.sub.recv())
            .await
            .expect("no KV event batch")
            .unwrap();
        let frames = msg.into_vec();
        assert_eq!(frames.len(), 3);
        let seq = u64::from_be_bytes(frames[1][..].try_into().unwrap());
        let batch = decode_batch(&frames[2]).unwrap().batch;
        (
            String::from_utf8(frames[0].to_vec()).unwrap(),
            seq,
            batch.events,
        )
    }

    /// Every live batch already sent: reads until the stream is quiet.
    async fn drain(&mut self) -> Vec<(u64, Vec<KvEvent>)> {
        let mut seen = Vec::new();
        while let Ok(msg) = timeout(Duration::from_millis(300), self.sub.recv()).await {
            let frames = msg.unwrap().into_vec();
            let seq = u64::from_be_bytes(frames[1][..].try_into().unwrap());
            seen.push((seq, decode_batch(&frames[2]).unwrap().batch.events));
        }
        seen
    }

    /// Live batches until one satisfies `pred`.
    async fn until(&mut self, mut pred: impl FnMut(&KvEvent) -> bool) -> Vec<(u64, Vec<KvEvent>)> {
        let mut seen = Vec::new();
        loop {
            let (_, seq, events) = self.next_batch().await;
            let hit = events.iter().any(&mut pred);
            seen.push((seq, events));
            if hit {
                return seen;
            }
        }
    }
}

fn long_system_prompt() -> String {
    (0..300)
        .map(|i| format!("rule {i} says be brief."))
        .collect::<Vec<_>>()
        .join(" ")
}

fn chat_body(system: &str, user: &str, max_tokens: usize) -> String {
    json!({
        "model": "sim-model",
        "messages": [{"role": "system", "content": system}, {"role": "user", "content": user}],
        "max_tokens": max_tokens,
    })
    .to_string()
}

fn stored(events: &[(u64, Vec<KvEvent>)]) -> usize {
    events
        .iter()
        .flat_map(|(_, e)| e)
        .map(|e| match e {
            KvEvent::BlockStored(s) => s.block_hashes.len(),
            _ => 0,
        })
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prefix_hits_events_reset_and_replay() {
    let mut h = Harness::start(config(4096, 8192)).await;
    let system = long_system_prompt();

    let (status, first) = h
        .post(
            "/v1/chat/completions",
            &chat_body(&system, "first question", 4),
        )
        .await;
    assert_eq!(status, 200, "{first}");
    assert_eq!(first["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
    let prompt1 = first["usage"]["prompt_tokens"].as_u64().unwrap() as usize;
    let (topic, seq, _) = h.next_batch().await;
    assert_eq!((topic.as_str(), seq), ("kv@test@sim-model", h.probes));
    // Events of a step go out before its tokens: all of the first
    // request's batches are on the wire by now.
    let rest = h.drain().await;
    assert!(
        rest.iter()
            .enumerate()
            .all(|(i, (s, _))| *s == seq + i as u64 + 1)
    );

    let (status, second) = h
        .post(
            "/v1/chat/completions",
            &chat_body(&system, "another question", 4),
        )
        .await;
    assert_eq!(status, 200, "{second}");
    let cached = second["usage"]["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .unwrap() as usize;
    assert!(
        cached > 1000 && cached.is_multiple_of(16),
        "cached {cached} of {prompt1}"
    );
    let batches = h.drain().await;
    // Only blocks after the cached prefix are new.
    let prompt2 = second["usage"]["prompt_tokens"].as_u64().unwrap() as usize;
    assert!(
        stored(&batches) <= (prompt2 + 3) / 16 - cached / 16,
        "{batches:?}"
    );

    // Reset → AllBlocksCleared on the live stream.
    let resp = h
        .http
        .post(format!("{}/reset_prefix_cache", h.base))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers()["x-kvsteer-worker"], "worker-a");
    let after = h.until(|e| *e == KvEvent::AllBlocksCleared).await;
    let last_seq = after.last().unwrap().0;
    let (_, third) = h
        .post(
            "/v1/chat/completions",
            &chat_body(&system, "first question", 4),
        )
        .await;
    assert_eq!(third["usage"]["prompt_tokens_details"]["cached_tokens"], 0);

    // Replay from seq 0: every batch since, in order, ending at the end marker.
    let (_, replay_ep) = h.server.kv_endpoints.clone().unwrap();
    let replayed = fetch_replay(&replay_ep.unwrap(), 0, Duration::from_secs(5))
        .await
        .unwrap();
    let seqs: Vec<u64> = replayed.iter().map(|b| b.seq).collect();
    // Seqs count from 0.
    assert_eq!(seqs[0], 0);
    assert!(seqs.windows(2).all(|w| w[1] == w[0] + 1));
    assert!(*seqs.last().unwrap() >= last_seq);
    let cleared = replayed.iter().any(|b| {
        decode_batch(&b.payload)
            .unwrap()
            .batch
            .events
            .contains(&KvEvent::AllBlocksCleared)
    });
    assert!(cleared);
    // A start past the newest batch yields only the end marker.
    let (_, replay_ep) = h.server.kv_endpoints.clone().unwrap();
    assert!(
        fetch_replay(&replay_ep.unwrap(), 1 << 40, Duration::from_secs(5))
            .await
            .unwrap()
            .is_empty()
    );
    h.server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_pressure_publishes_block_removed() {
    let mut h = Harness::start(config(64, 1024)).await;
    for i in 0..4 {
        let prompt: Vec<u32> = (0..400).map(|t| 1000 + i * 1000 + t).collect();
        let body = json!({"model": "sim-model", "prompt": prompt, "max_tokens": 2}).to_string();
        let (status, v) = h.post("/v1/completions", &body).await;
        assert_eq!(status, 200, "{v}");
    }
    let seen = h.until(|e| matches!(e, KvEvent::BlockRemoved(_))).await;
    assert!(stored(&seen) > 0);
    h.server.shutdown().await;
}

async fn stream(http: &reqwest::Client, base: &str, i: usize) -> (usize, Value) {
    let body = json!({
        "model": "sim-model",
        "messages": [{"role": "user", "content": format!("stream number {i}")}],
        "max_tokens": 20,
        "ignore_eos": true,
        "stream": true,
        "stream_options": {"include_usage": true},
    });
    let mut resp = http
        .post(format!("{base}/v1/chat/completions"))
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let mut text = String::new();
    while let Some(chunk) = resp.chunk().await.unwrap() {
        text.push_str(std::str::from_utf8(&chunk).unwrap());
    }
    let events: Vec<&str> = text.split("\n\n").filter(|s| !s.is_empty()).collect();
    assert_eq!(*events.last().unwrap(), "data: [DONE]");
    let chunks: Vec<Value> = events[..events.len() - 1]
        .iter()
        .map(|e| serde_json::from_str(e.strip_prefix("data: ").unwrap()).unwrap())
        .collect();
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    let content_chunks = chunks
        .iter()
        .filter(|c| c["choices"][0]["delta"].get("content").is_some())
        .count();
    (content_chunks, chunks.last().unwrap().clone())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_concurrent_streams_complete_and_bad_input_is_rejected() {
    let h = Harness::start(config(4096, 4096)).await;
    let mut tasks = Vec::new();
    for i in 0..64 {
        let (http, base) = (h.http.clone(), h.base.clone());
        tasks.push(tokio::spawn(async move { stream(&http, &base, i).await }));
    }
    for t in tasks {
        let (content_chunks, usage) = timeout(WAIT, t).await.unwrap().unwrap();
        // Role chunk with "" plus 20 tokens.
        assert_eq!(content_chunks, 21);
        assert_eq!(usage["choices"], json!([]));
        assert_eq!(usage["usage"]["completion_tokens"], 20);
    }

    for bad in [
        "{",
        "[]",
        r#"{"model": "sim-model"}"#,
        r#"{"model": "sim-model", "messages": "hi"}"#,
        r#"{"model": "sim-model", "messages": [{"role": "user", "content": "x"}], "max_tokens": -5}"#,
        r#"{"model": "sim-model", "messages": [{"role": "user", "content": "x"}], "stream": 1}"#,
    ] {
        let (status, v) = h.post("/v1/chat/completions", bad).await;
        assert_eq!(status, 400, "{bad} → {v}");
        assert_eq!(v["error"]["type"], "BadRequestError");
        assert_eq!(v["error"]["code"], 400);
    }
    let (status, v) = h
        .post("/v1/completions", r#"{"model": "other", "prompt": "x"}"#)
        .await;
    assert_eq!((status, v["error"]["code"].as_u64()), (404, Some(404)));
    let long = "word ".repeat(5000);
    let (status, v) = h
        .post(
            "/v1/completions",
            &json!({"model": "sim-model", "prompt": long}).to_string(),
        )
        .await;
    assert_eq!(status, 400);
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("maximum context length")
    );

    // Still serving.
    let (status, v) = h
        .post(
            "/v1/completions",
            r#"{"model": "sim-model", "prompt": "hello", "max_tokens": 3}"#,
        )
        .await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["object"], "text_completion");
    assert_eq!(v["usage"]["completion_tokens"], 3);
    let (status, v) = h.post("/tokenize", r#"{"prompt": "hello world"}"#).await;
    assert_eq!((status, v["count"].as_u64()), (200, Some(2)));
    let models: Value = h
        .http
        .get(format!("{}/v1/models", h.base))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(models["data"][0]["id"], "sim-model");
    let health = h
        .http
        .get(format!("{}/health", h.base))
        .send()
        .await
        .unwrap();
    assert_eq!(health.status(), 200);
    let metrics = h
        .http
        .get(format!("{}/metrics", h.base))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    for name in [
        "vllm:num_requests_running{",
        "vllm:num_requests_waiting{",
        "vllm:kv_cache_usage_perc{",
        "vllm:prefix_cache_queries_total{",
        "vllm:prefix_cache_hits_total{",
        "vllm:num_preemptions_total{",
        "vllm:time_to_first_token_seconds_bucket{",
        "vllm:e2e_request_latency_seconds_count{",
        "vllm:cache_config_info{",
    ] {
        assert!(metrics.contains(name), "{name} missing in\n{metrics}");
    }
    assert!(metrics.contains("model_name=\"sim-model\""));
    assert!(metrics.contains("block_size=\"16\""));
    assert!(metrics.contains(
        "vllm:time_to_first_token_seconds_count{engine=\"0\",model_name=\"sim-model\"} 65"
    ));
    h.server.shutdown().await;
}

/// `return_token_ids`: the ids streamed are the engine's own output, so a
/// next turn made of prompt + generated ids + a new message finds the
/// generated blocks cached; a whole response carries both id lists.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn returned_token_ids_make_the_next_turn_hit_its_answer() {
    use kvsteer_sim::live::client::stream_request;
    let h = Harness::start(config(4096, 4096)).await;
    let url = format!("{}/v1/completions", h.base);
    let body = |prompt: &[u32], stream: bool| {
        json!({
            "model": "sim-model",
            "prompt": prompt,
            "max_tokens": 32,
            "ignore_eos": true,
            "stream": stream,
            "return_token_ids": true,
        })
    };
    let prompt: Vec<u32> = (0..64).map(|i| 1_000 + i).collect();
    let first = stream_request(&h.http, &url, &body(&prompt, true))
        .await
        .unwrap();
    assert_eq!(first.status, 200);
    assert_eq!(first.token_ids.len(), 32);
    let mut next = prompt.clone();
    next.extend_from_slice(&first.token_ids);
    next.extend((0..16).map(|i| 2_000 + i));
    let (status, whole) = h
        .post("/v1/completions", &body(&next, false).to_string())
        .await;
    assert_eq!(status, 200, "{whole}");
    // Blocks of 16: the prompt's 4, and the answer's full blocks after it
    // (its last token never enters the cache).
    assert_eq!(whole["usage"]["prompt_tokens_details"]["cached_tokens"], 80);
    let choice = &whole["choices"][0];
    assert_eq!(choice["token_ids"].as_array().unwrap().len(), 32);
    assert_eq!(choice["prompt_token_ids"], json!(next));
    // Without the flag, no ids.
    let (_, plain) = h
        .post(
            "/v1/completions",
            &json!({"model": "sim-model", "prompt": prompt, "max_tokens": 2}).to_string(),
        )
        .await;
    assert!(plain["choices"][0].get("token_ids").is_none(), "{plain}");
    h.server.shutdown().await;
}

/// The sum of a histogram in the simulator's `/metrics` (simulated seconds).
async fn histogram_sum(h: &Harness, name: &str) -> f64 {
    let text = h
        .http
        .get(format!("{}/metrics", h.base))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let prefix = format!("{name}_sum{{");
    let line = text
        .lines()
        .find(|l| l.starts_with(&prefix))
        .unwrap_or_else(|| panic!("{prefix} missing in\n{text}"));
    line.rsplit(' ').next().unwrap().parse().unwrap()
}

/// Real seconds from the request's send to its first body frame and to its
/// end, and the body.
async fn timed(h: &Harness, path: &str, body: &Value) -> (f64, f64, String) {
    let start = std::time::Instant::now();
    let mut resp = timeout(
        WAIT,
        h.http.post(format!("{}{path}", h.base)).json(body).send(),
    )
    .await
    .unwrap()
    .unwrap();
    assert_eq!(resp.status(), 200);
    let mut first = None;
    let mut text = String::new();
    while let Some(frame) = timeout(WAIT, resp.chunk()).await.unwrap().unwrap() {
        first.get_or_insert_with(|| start.elapsed().as_secs_f64());
        text.push_str(std::str::from_utf8(&frame).unwrap());
    }
    (first.unwrap(), start.elapsed().as_secs_f64(), text)
}

/// Like vLLM, nothing of a response reaches the client before the step that
/// produced it has run: not the chat role chunk before the prefill, not a
/// token before its step's simulated time has passed. Checked against the
/// simulator's own clock: `real elapsed × time_scale` at the client can
/// only be at least the simulated TTFT / end-to-end time the engine
/// reports for the request (a lower bound: sleeps never end early; one
/// request at a time so each histogram sum grows by that request alone).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn responses_arrive_only_after_their_steps_have_run() {
    let mut cfg = config(4096, 8192);
    // A cold ~2,100-token prefill takes ~5 simulated ms: ~100 real ms.
    cfg.time_scale = 0.05;
    let scale = cfg.time_scale;
    let h = Harness::start(cfg).await;
    // Floating-point slack of the clock conversions, in simulated seconds.
    let slack = 1e-9;
    let system = long_system_prompt();
    let cases = [
        (
            "/v1/chat/completions",
            json!({"model": "sim-model", "max_tokens": 4, "ignore_eos": true, "stream": true,
                   "messages": [{"role": "system", "content": format!("chat stream. {system}")},
                                {"role": "user", "content": "hi"}]}),
        ),
        (
            "/v1/completions",
            json!({"model": "sim-model", "max_tokens": 4, "ignore_eos": true, "stream": true,
                   "prompt": format!("completion stream. {system}")}),
        ),
        (
            "/v1/chat/completions",
            json!({"model": "sim-model", "max_tokens": 1,
                   "messages": [{"role": "system", "content": format!("whole response. {system}")},
                                {"role": "user", "content": "hi"}]}),
        ),
    ];
    for (path, body) in cases {
        let ttft_before = histogram_sum(&h, "vllm:time_to_first_token_seconds").await;
        let e2e_before = histogram_sum(&h, "vllm:e2e_request_latency_seconds").await;
        let (first, end, text) = timed(&h, path, &body).await;
        let ttft = histogram_sum(&h, "vllm:time_to_first_token_seconds").await - ttft_before;
        let e2e = histogram_sum(&h, "vllm:e2e_request_latency_seconds").await - e2e_before;
        // A cold prefill of this size is long on the simulated clock.
        assert!(ttft > 0.004, "{path}: simulated TTFT {ttft}");
        assert!(
            first * scale + slack >= ttft,
            "{path}: first bytes after {first} s real = {} s simulated, before the simulated TTFT {ttft} s: {text}",
            first * scale
        );
        assert!(
            end * scale + slack >= e2e,
            "{path}: complete after {} s simulated, before the simulated end {e2e} s",
            end * scale
        );
        if body["stream"] == true {
            // The first event already carries the role (chat); content
            // follows in the same step's frame.
            assert!(text.ends_with("data: [DONE]\n\n"), "{text}");
            let events: Vec<Value> = text
                .split("\n\n")
                .filter(|e| !e.is_empty() && *e != "data: [DONE]")
                .map(|e| serde_json::from_str(e.strip_prefix("data: ").unwrap()).unwrap())
                .collect();
            let chat = path.contains("chat");
            assert_eq!(events.len(), 4 + usize::from(chat), "{text}");
            if chat {
                assert_eq!(events[0]["choices"][0]["delta"]["role"], "assistant");
            }
            let last = &events.last().unwrap()["choices"][0];
            assert_eq!(last["finish_reason"], "length", "{text}");
        }
    }
    h.server.shutdown().await;
}

/// vLLM's `cache_salt`: blocks computed under one salt are a hit only for
/// the same salt; the first stored block carries the salt in its extra keys.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cache_salt_keeps_prefixes_apart() {
    let mut h = Harness::start(config(4096, 8192)).await;
    let system = long_system_prompt();
    let salted = |salt: Option<&str>, user: &str| {
        let mut body: Value = serde_json::from_str(&chat_body(&system, user, 4)).unwrap();
        if let Some(salt) = salt {
            body["cache_salt"] = json!(salt);
        }
        body.to_string()
    };
    let cached = |v: &Value| {
        v["usage"]["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .unwrap()
    };

    let (status, a1) = h
        .post("/v1/chat/completions", &salted(Some("tenant-a"), "q1"))
        .await;
    assert_eq!((status, cached(&a1)), (200, 0), "{a1}");
    let first = h.until(|e| matches!(e, KvEvent::BlockStored(_))).await;
    let stored_first = first
        .iter()
        .flat_map(|(_, e)| e)
        .find_map(|e| match e {
            KvEvent::BlockStored(s) if s.parent_block_hash.is_none() => Some(s.clone()),
            _ => None,
        })
        .expect("the first block stored");
    let keys = stored_first.extra_keys.expect("extra keys");
    assert_eq!(
        keys[0],
        Some(vec![kvsteer_kv_events::ExtraKey::from("tenant-a")])
    );
    assert!(keys[1..].iter().all(Option::is_none), "{keys:?}");
    h.drain().await;

    // Another tenant's salt, and no salt: nothing cached.
    let (_, b1) = h
        .post("/v1/chat/completions", &salted(Some("tenant-b"), "q1"))
        .await;
    assert_eq!(cached(&b1), 0, "{b1}");
    let (_, plain) = h.post("/v1/chat/completions", &salted(None, "q1")).await;
    assert_eq!(cached(&plain), 0, "{plain}");
    // The same salt hits its own prefix.
    let (_, a2) = h
        .post("/v1/chat/completions", &salted(Some("tenant-a"), "q2"))
        .await;
    assert!(cached(&a2) > 1000, "{a2}");
    // vLLM refuses an empty or non-string salt.
    for bad in [json!(""), json!(5)] {
        let mut body: Value = serde_json::from_str(&salted(None, "q")).unwrap();
        body["cache_salt"] = bad;
        let (status, err) = h.post("/v1/chat/completions", &body.to_string()).await;
        assert_eq!(status, 400, "{err}");
    }
}

/// `/v1/chat/completions/render` (vLLM's render API, used by vLLM's router
/// to learn a prompt's tokens) answers the tokens `/tokenize` and generation
/// use, as a `GenerateRequest`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn render_returns_the_prompt_tokens() {
    let h = Harness::start(config(4096, 8192)).await;
    let body = chat_body("be brief.", "what is a block hash?", 7);
    let (status, rendered) = h.post("/v1/chat/completions/render", &body).await;
    assert_eq!(status, 200, "{rendered}");
    let (status, tokenized) = h.post("/tokenize", &body).await;
    assert_eq!(status, 200, "{tokenized}");
    assert!(rendered["token_ids"].as_array().unwrap().len() > 10);
    assert_eq!(rendered["token_ids"], tokenized["tokens"]);
    assert_eq!(rendered["sampling_params"]["max_tokens"], 7);
    assert_eq!(rendered["model"], "sim-model");
    assert_eq!(rendered["features"], Value::Null);
    // The same tokens are what a generation counts as its prompt.
    let (_, done) = h.post("/v1/chat/completions", &body).await;
    assert_eq!(
        done["usage"]["prompt_tokens"].as_u64().unwrap() as usize,
        rendered["token_ids"].as_array().unwrap().len()
    );
    // No max_tokens: what the context leaves, as vLLM resolves it.
    let mut open: Value = serde_json::from_str(&body).unwrap();
    open.as_object_mut().unwrap().remove("max_tokens");
    let (_, r) = h
        .post("/v1/chat/completions/render", &open.to_string())
        .await;
    assert_eq!(
        r["sampling_params"]["max_tokens"].as_u64().unwrap() as usize,
        8192 - r["token_ids"].as_array().unwrap().len()
    );
    // Bad input: an unknown model, no messages, not JSON.
    let mut other: Value = serde_json::from_str(&body).unwrap();
    other["model"] = json!("other-model");
    let (status, _) = h
        .post("/v1/chat/completions/render", &other.to_string())
        .await;
    assert_eq!(status, 404);
    let (status, _) = h
        .post("/v1/chat/completions/render", r#"{"model":"sim-model"}"#)
        .await;
    assert_eq!(status, 400);
    let (status, _) = h.post("/v1/chat/completions/render", "{").await;
    assert_eq!(status, 400);
}

/// Canonical CBOR head (test-local, independent of the simulator's).
fn cbor_head(out: &mut Vec<u8>, major: u8, n: u64) {
    let m = major << 5;
    match n {
        0..=23 => out.push(m | n as u8),
        24..=0xff => out.extend([m | 24, n as u8]),
        0x100..=0xffff => {
            out.push(m | 25);
            out.extend((n as u16).to_be_bytes());
        }
        0x1_0000..=0xffff_ffff => {
            out.push(m | 26);
            out.extend((n as u32).to_be_bytes());
        }
        _ => {
            out.push(m | 27);
            out.extend(n.to_be_bytes());
        }
    }
}

/// With `--prefix-caching-hash-algo sha256_cbor` the published hashes are
/// vLLM's: `sha256(cbor([parent, [tokens], null]))` chained from
/// `NONE_HASH = sha256(cbor("vllm-none-hash"))`, last 8 bytes big-endian.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sha256_cbor_publishes_vllm_block_hashes() {
    use kvsteer_kv_events::BlockHash;
    use sha2::{Digest, Sha256};

    let mut cfg = config(4096, 8192);
    cfg.engine.prefix_caching_hash_algo = kvsteer_sim::engine::HashAlgo::Sha256Cbor;
    let mut h = Harness::start(cfg).await;
    let body = chat_body(&long_system_prompt(), "q1", 2);
    let (_, rendered) = h.post("/v1/chat/completions/render", &body).await;
    let prompt: Vec<u64> = rendered["token_ids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_u64().unwrap())
        .collect();
    let (status, _) = h.post("/v1/chat/completions", &body).await;
    assert_eq!(status, 200);
    let seen = h.until(|e| matches!(e, KvEvent::BlockStored(_))).await;
    let mut seen = seen;
    seen.extend(h.drain().await);
    let published: Vec<u64> = seen
        .iter()
        .flat_map(|(_, e)| e)
        .filter_map(|e| match e {
            KvEvent::BlockStored(s) => Some(s.block_hashes.clone()),
            _ => None,
        })
        .flatten()
        .map(|b| match b {
            BlockHash::U64(v) => v,
            other => panic!("expected u64 hashes, got {other:?}"),
        })
        .collect();

    let mut text = Vec::new();
    cbor_head(&mut text, 3, 14);
    text.extend(b"vllm-none-hash");
    let mut parent: [u8; 32] = Sha256::digest(&text).into();
    let full = prompt.len() / 16;
    assert!(full > 50 && published.len() >= full, "{}", published.len());
    for (i, chunk) in prompt.chunks_exact(16).enumerate() {
        let mut buf = vec![0x83];
        cbor_head(&mut buf, 2, 32);
        buf.extend(parent);
        cbor_head(&mut buf, 4, 16);
        for &t in chunk {
            cbor_head(&mut buf, 0, t);
        }
        buf.push(0xf6);
        parent = Sha256::digest(&buf).into();
        let want = u64::from_be_bytes(parent[24..].try_into().unwrap());
        assert_eq!(published[i], want, "block {i}");
    }
}

/// `/v1/messages`: the prompt is the chat conversion's (same ids as the
/// chat body vLLM converts it to), a repeat hits the cache and reports it as
/// Anthropic `cache_read_input_tokens`, and a stream carries vLLM's events.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn anthropic_messages_whole_and_streamed() {
    let h = Harness::start(config(4096, 4096)).await;
    let system = long_system_prompt();
    let body = |stream: bool| {
        json!({
            "model": "sim-model", "max_tokens": 4, "stream": stream,
            "system": [{"type": "text", "text": "x-anthropic-billing-header: cch=1;"},
                       {"type": "text", "text": system}],
            "messages": [{"role": "user", "content": [{"type": "text", "text": "hello"}]}],
        })
        .to_string()
    };
    let (status, first) = h.post("/v1/messages", &body(false)).await;
    assert_eq!(status, 200, "{first}");
    assert_eq!(first["type"], "message");
    assert_eq!(first["role"], "assistant");
    assert_eq!(first["stop_reason"], "max_tokens");
    let usage = &first["usage"];
    assert_eq!(usage["output_tokens"], 4);
    assert_eq!(usage["cache_read_input_tokens"], 0);
    let prompt = usage["input_tokens"].as_u64().unwrap();
    // The same prompt as the chat request it converts to.
    let chat = json!({"model": "sim-model", "max_tokens": 1,
        "messages": [{"role": "system", "content": system}, {"role": "user", "content": "hello"}]});
    let (_, chat) = h.post("/v1/chat/completions", &chat.to_string()).await;
    assert_eq!(chat["usage"]["prompt_tokens"].as_u64().unwrap(), prompt);

    let resp = timeout(
        WAIT,
        h.http
            .post(format!("{}/v1/messages", h.base))
            .body(body(true))
            .send(),
    )
    .await
    .unwrap()
    .unwrap();
    assert_eq!(resp.status(), 200);
    let text = resp.text().await.unwrap();
    let events: Vec<(String, Value)> = text
        .split("\n\n")
        .filter(|e| !e.is_empty())
        .map(|e| {
            let (kind, data) = e.split_once('\n').unwrap();
            let data: Value = serde_json::from_str(data.strip_prefix("data: ").unwrap()).unwrap();
            (kind.strip_prefix("event: ").unwrap().to_owned(), data)
        })
        .collect();
    assert_eq!(events.first().unwrap().0, "message_start");
    assert_eq!(events.last().unwrap().0, "message_stop");
    assert_eq!(
        events[0].1["message"]["usage"]["input_tokens"].as_u64(),
        Some(prompt)
    );
    let (_, delta) = events.iter().find(|(k, _)| k == "message_delta").unwrap();
    let cached = delta["usage"]["cache_read_input_tokens"].as_u64().unwrap();
    // The whole system prompt's full blocks come from the cache.
    assert!(cached >= 16 && cached <= prompt, "{delta}");
    assert_eq!(
        delta["usage"]["input_tokens"].as_u64(),
        Some(prompt - cached)
    );
    assert_eq!(delta["usage"]["output_tokens"], 4);

    // Errors take Anthropic's shape.
    let (status, err) = h
        .post("/v1/messages", r#"{"model":"sim-model","messages":[]}"#)
        .await;
    assert_eq!(status, 400);
    assert_eq!(err["type"], "error");
    assert_eq!(err["error"]["type"], "invalid_request_error");
    h.server.shutdown().await;
}
