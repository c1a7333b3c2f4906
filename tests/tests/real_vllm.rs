//! Two real vLLM engines (the CPU build, a random-weight tiny Qwen3) behind
//! a real Envoy with the kvsteer filter and a real `kvsteer-indexer`: the
//! engines' own KV events, token counts, prefix cache and restarts.
//!
//! Not part of `scripts/test.sh` (an engine needs ~3.7 GB and starts in
//! tens of seconds to minutes): `scripts/test-real-vllm.sh` installs vLLM,
//! prepares the model folder, sets `KVSTEER_REAL_VLLM_PYTHON` (the venv's
//! python) and `KVSTEER_REAL_VLLM_MODEL` (the model folder) and runs this
//! test. Without both variables it prints why and checks nothing.
//!
//! Engines on two cores are slow and their speed varies with the load:
//! every wait is a bounded poll for a fact, nothing asserts on a time.

use std::collections::BTreeSet;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use anyhow::Context;
use kvsteer_e2e::{
    ChatReply, Paths, Proc, chat_body, metric_sum, send_chat, serial, spawn_envoy, wait_http_ok,
    wait_until, workers_of,
};
use serde_json::{Value, json};

/// `--served-model-name` of the engines and the indexer's model.
const MODEL: &str = "tiny";
const ENGINES: usize = 2;
/// Bound on an engine's start (20–40 s on a quiet machine, minutes when
/// both start at once on two cores).
const ENGINE_START: Duration = Duration::from_secs(900);
/// Bound on the other waits (events, purges, reconnects).
const WAIT: Duration = Duration::from_secs(120);
/// Tokens generated per request: random weights, gibberish text.
const MAX_TOKENS: u32 = 12;
/// vLLM's CPU backend needs a multiple of 32.
const BLOCK_SIZE: u64 = 32;

/// Where the real vLLM is, from the environment.
struct RealVllm {
    python: PathBuf,
    model: PathBuf,
}

impl RealVllm {
    fn from_env() -> Option<RealVllm> {
        let python = std::env::var_os("KVSTEER_REAL_VLLM_PYTHON")?;
        let model = std::env::var_os("KVSTEER_REAL_VLLM_MODEL")?;
        Some(RealVllm {
            python: PathBuf::from(python),
            model: PathBuf::from(model),
        })
    }
}

fn http_port(i: usize) -> u16 {
    8001 + i as u16
}

fn worker_name(i: usize) -> String {
    format!("w{}", i + 1)
}

fn endpoint(i: usize) -> String {
    format!("127.0.0.1:{}", http_port(i))
}

// === the processes ===

/// The engines, the indexer and Envoy; engines run in their own process
/// groups, killed whole (vLLM may fork helpers).
struct Stack {
    paths: Paths,
    real: RealVllm,
    client: reqwest::Client,
    engines: Vec<Option<Proc>>,
    starts: Vec<usize>,
    indexer: Option<Proc>,
    envoy: Option<Proc>,
    dir: tempfile::TempDir,
}

impl Stack {
    async fn start(real: RealVllm) -> anyhow::Result<Stack> {
        let paths = Paths::discover()?;
        let dir = tempfile::Builder::new()
            .prefix("kvsteer-real-vllm-")
            .tempdir()?;
        let client = reqwest::Client::builder()
            .timeout(Duration::from_secs(600))
            .build()?;
        let mut stack = Stack {
            paths,
            real,
            client,
            engines: (0..ENGINES).map(|_| None).collect(),
            starts: vec![0; ENGINES],
            indexer: None,
            envoy: None,
            dir,
        };
        for i in 0..ENGINES {
            stack.spawn_engine(i)?;
        }
        for i in 0..ENGINES {
            stack.wait_engine(i).await?;
        }
        stack.start_indexer().await?;
        stack.start_envoy().await?;
        Ok(stack)
    }

    fn spawn_engine(&mut self, i: usize) -> anyhow::Result<()> {
        let events = format!(
            r#"{{"enable_kv_cache_events":true,"publisher":"zmq","endpoint":"tcp://*:{}","replay_endpoint":"tcp://*:{}","topic":"kv@{}@{MODEL}"}}"#,
            5557 + i,
            5567 + i,
            endpoint(i)
        );
        let mut cmd = Command::new(&self.real.python);
        cmd.envs([
            ("VLLM_HOST_IP", "127.0.0.1"),
            ("HF_HUB_OFFLINE", "1"),
            ("TRANSFORMERS_OFFLINE", "1"),
            ("VLLM_NO_USAGE_STATS", "1"),
            ("DO_NOT_TRACK", "1"),
            ("VLLM_CPU_KVCACHE_SPACE", "1"),
            ("VLLM_CPU_OMP_THREADS_BIND", "nobind"),
            ("VLLM_ENABLE_V1_MULTIPROCESSING", "0"),
        ])
        .args(["-m", "vllm.entrypoints.openai.api_server", "--model"])
        .arg(&self.real.model)
        .args(["--served-model-name", MODEL, "--host", "127.0.0.1"])
        .args(["--port", &http_port(i).to_string()])
        .args([
            "--load-format",
            "dummy",
            "--enforce-eager",
            "--dtype",
            "bfloat16",
        ])
        .args([
            "--max-model-len",
            "2048",
            "--block-size",
            &BLOCK_SIZE.to_string(),
        ])
        .args([
            "--enable-prefix-caching",
            "--distributed-executor-backend",
            "uni",
        ])
        .arg("--enable-prompt-tokens-details")
        .args(["--kv-events-config", &events])
        .process_group(0);
        self.starts[i] += 1;
        let name = format!("vllm-{}-start{}", worker_name(i), self.starts[i]);
        self.engines[i] = Some(Proc::spawn(&name, cmd, self.dir.path())?);
        Ok(())
    }

    async fn wait_engine(&mut self, i: usize) -> anyhow::Result<()> {
        let url = format!("http://{}/health", endpoint(i));
        let client = self.client.clone();
        let engine = self.engines[i].as_mut().context("engine not started")?;
        let deadline = tokio::time::Instant::now() + ENGINE_START;
        loop {
            anyhow::ensure!(
                !engine.exited(),
                "engine {} exited while starting:\n{}",
                worker_name(i),
                engine.log()
            );
            if let Ok(r) = client.get(&url).send().await
                && r.status().is_success()
            {
                return Ok(());
            }
            anyhow::ensure!(
                tokio::time::Instant::now() < deadline,
                "engine {} not healthy after {ENGINE_START:?}",
                worker_name(i)
            );
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }

    /// SIGKILLs engine `i`'s whole process group and reaps it.
    fn kill_engine(&mut self, i: usize) {
        if let Some(p) = self.engines[i].take() {
            kill_group(p.id());
            p.kill();
        }
    }

    async fn start_indexer(&mut self) -> anyhow::Result<()> {
        let path = self.dir.path().join("indexer.yaml");
        std::fs::write(&path, indexer_config(&self.real.model)?)?;
        let mut cmd = Command::new(self.paths.indexer());
        cmd.current_dir(&self.paths.root)
            .env("RUST_LOG", "info")
            .arg("serve")
            .arg("--config")
            .arg(&path);
        self.indexer = Some(Proc::spawn("indexer", cmd, self.dir.path())?);
        wait_http_ok(&admin_url("/readyz"), WAIT).await?;
        wait_until("both event streams live", WAIT, || async {
            let ws = self.workers().await.ok()?;
            let live = (0..ENGINES)
                .filter(|&i| stream_state(&ws, i).as_deref() == Some("live"))
                .count();
            (live == ENGINES).then_some(())
        })
        .await
    }

    async fn start_envoy(&mut self) -> anyhow::Result<()> {
        let template = std::fs::read_to_string(self.paths.root.join("envoy/local/envoy.yaml"))
            .context("reading envoy/local/envoy.yaml")?;
        let path = self.dir.path().join("envoy.yaml");
        std::fs::write(&path, envoy_config(&template, &self.paths.wasm)?)?;
        let envoy = spawn_envoy(
            &self.paths.envoy,
            &self.paths.root,
            &path,
            self.dir.path(),
            WAIT,
        )
        .await?;
        self.envoy = Some(envoy);
        Ok(())
    }

    /// The indexer's `/debug/workers` list.
    async fn workers(&self) -> anyhow::Result<Vec<Value>> {
        let v: Value = self
            .client
            .get(admin_url("/debug/workers"))
            .send()
            .await?
            .error_for_status()?
            .json()
            .await?;
        Ok(workers_of(&v))
    }

    /// The indexer's dry-run pick (`/debug/score`) for a body.
    async fn score(&self, body: &Value) -> anyhow::Result<Value> {
        Ok(self
            .client
            .post(admin_url("/debug/score"))
            .json(body)
            .send()
            .await?
            .error_for_status()?
            .json()
            .await?)
    }

    async fn metric(&self, name: &str, labels: &[&str]) -> anyhow::Result<f64> {
        let text = self
            .client
            .get(admin_url("/metrics"))
            .send()
            .await?
            .error_for_status()?
            .text()
            .await?;
        Ok(metric_sum(&text, name, labels))
    }

    /// A counter of the indexer for one `key="value"` label.
    async fn counter(&self, name: &str, label: &str) -> anyhow::Result<u64> {
        Ok(self.metric(name, &[label]).await? as u64)
    }

    /// The prompt token ids of `kvsteer-indexer tokenize` for a chat body.
    fn cli_token_count(&self, body: &Value) -> anyhow::Result<usize> {
        let path = self.dir.path().join("tokenize-request.json");
        std::fs::write(&path, serde_json::to_vec(body)?)?;
        let out = Command::new(self.paths.indexer())
            .arg("tokenize")
            .arg("--tokenizer")
            .arg(&self.real.model)
            .args(["--endpoint", "chat", "--request"])
            .arg(&path)
            .output()
            .context("running kvsteer-indexer tokenize")?;
        anyhow::ensure!(
            out.status.success(),
            "kvsteer-indexer tokenize: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let v: Value = serde_json::from_slice(&out.stdout)?;
        v["token_ids"]
            .as_array()
            .map(Vec::len)
            .context("tokenize printed no token_ids")
    }

    /// Sends a streaming chat request through Envoy; fails on a non-200.
    async fn chat_via_envoy(&self, messages: &[Value]) -> anyhow::Result<ChatReply> {
        let body = chat_body(MODEL, &Value::Array(messages.to_vec()), MAX_TOKENS);
        let reply = send_chat(
            &self.client,
            "http://127.0.0.1:8080/v1/chat/completions",
            &body,
            &[],
        )
        .await?;
        anyhow::ensure!(
            reply.status == 200,
            "status {}: {}",
            reply.status,
            reply.text()
        );
        Ok(reply)
    }

    /// Sends a chat request straight to engine `i` (bypassing Envoy).
    async fn chat_direct(&self, i: usize, messages: &[Value]) -> anyhow::Result<ChatReply> {
        let body = chat_body(MODEL, &Value::Array(messages.to_vec()), MAX_TOKENS);
        let url = format!("http://{}/v1/chat/completions", endpoint(i));
        let reply = send_chat(&self.client, &url, &body, &[]).await?;
        anyhow::ensure!(
            reply.status == 200,
            "status {}: {}",
            reply.status,
            reply.text()
        );
        Ok(reply)
    }
}

impl Drop for Stack {
    fn drop(&mut self) {
        for i in 0..ENGINES {
            self.kill_engine(i);
        }
    }
}

/// `kill -s KILL -- -PGID`.
fn kill_group(pgid: u32) {
    let _ = Command::new("kill")
        .args(["-s", "KILL", "--", &format!("-{pgid}")])
        .status();
}

fn admin_url(path: &str) -> String {
    format!("http://127.0.0.1:9091{path}")
}

// === configs ===

/// The indexer: the two engines, the model folder's tokenizer, vLLM's
/// CPU block size.
fn indexer_config(model_dir: &Path) -> anyhow::Result<String> {
    let tokenizer = model_dir.to_str().context("model path is not UTF-8")?;
    let mut yaml = format!(
        "grpc_listen: 127.0.0.1:9090\n\
         admin_listen: 127.0.0.1:9091\n\
         grpc:\n  advertise: 127.0.0.1:9090\n\
         models:\n  - name: {MODEL}\n    tokenizer: {tokenizer}\n    block_size: {BLOCK_SIZE}\n    max_model_len: 2048\n\
         scoring:\n  policy: kvsteer\n\
         index:\n  backend: memory\n\
         workers:\n"
    );
    for i in 0..ENGINES {
        yaml.push_str(&format!(
            "  - name: {name}\n    endpoint: {ep}\n    model: {MODEL}\n    \
             kv_events: tcp://127.0.0.1:{ev}\n    replay: tcp://127.0.0.1:{rp}\n    \
             metrics: http://{ep}/metrics\n",
            name = worker_name(i),
            ep = endpoint(i),
            ev = 5557 + i,
            rp = 5567 + i,
        ));
    }
    Ok(yaml)
}

/// `envoy/local/envoy.yaml` for two engines: the third worker dropped, the
/// filter at `wasm`, and `x-kvsteer-worker: <upstream ip:port>` added to
/// responses (vLLM does not say who it is; the simulator does).
fn envoy_config(template: &str, wasm: &Path) -> anyhow::Result<String> {
    let third = "              - endpoint:\n                  address:\n                    socket_address: { address: 127.0.0.1, port_value: 8003 }\n";
    anyhow::ensure!(template.contains(third), "envoy.yaml: no third worker");
    let domains = template
        .lines()
        .find(|l| l.trim() == r#"domains: ["*"]"#)
        .context("envoy.yaml: no virtual host domains")?;
    let indent = &domains[..domains.len() - domains.trim_start().len()];
    let header = format!(
        "{domains}\n{indent}response_headers_to_add:\n\
         {indent}  - header: {{ key: x-kvsteer-worker, value: \"%UPSTREAM_HOST%\" }}\n\
         {indent}    append_action: ADD_IF_ABSENT\n"
    );
    let filter = "target/wasm32-wasip1/release/kvsteer_filter.wasm";
    anyhow::ensure!(template.contains(filter), "envoy.yaml: no filter path");
    Ok(template
        .replace(third, "")
        .replacen(&format!("{domains}\n"), &header, 1)
        .replace(filter, wasm.to_str().context("wasm path is not UTF-8")?))
}

// === reading /debug/workers ===

fn worker_view(ws: &[Value], i: usize) -> Option<&Value> {
    let name = worker_name(i);
    ws.iter()
        .find(|w| w.get("name").and_then(Value::as_str) == Some(name.as_str()))
}

fn indexed_blocks(ws: &[Value], i: usize) -> u64 {
    worker_view(ws, i)
        .and_then(|w| w.get("indexed_blocks"))
        .and_then(Value::as_u64)
        .unwrap_or(0)
}

fn stream_state(ws: &[Value], i: usize) -> Option<String> {
    worker_view(ws, i)
        .and_then(|w| w.pointer("/stream/state"))
        .and_then(Value::as_str)
        .map(str::to_string)
}

/// The engine index of a reply's `x-kvsteer-worker` (`127.0.0.1:800x`).
fn served_by(reply: &ChatReply) -> anyhow::Result<usize> {
    let upstream = reply.worker.as_deref().context("no x-kvsteer-worker")?;
    (0..ENGINES)
        .find(|&i| endpoint(i) == upstream)
        .with_context(|| format!("unknown upstream {upstream}"))
}

// === the conversation ===

/// A long, conversation-specific system prompt (a few hundred tokens:
/// several 32-token blocks).
fn system_prompt(tag: &str) -> String {
    let mut s = format!("You are assistant {tag}. Follow the house rules below.\n");
    for i in 0..24 {
        s.push_str(&format!(
            "Rule {i} for {tag}: keep answers short, cite the source, check case {i}.\n"
        ));
    }
    s
}

fn user(tag: &str, turn: usize) -> Value {
    json!({"role": "user", "content": format!("Question {turn} about {tag}: what comes next?")})
}

// === the test ===

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_real_vllm_engines_behind_envoy() {
    let Some(real) = RealVllm::from_env() else {
        eprintln!(
            "SKIPPED real_vllm: set KVSTEER_REAL_VLLM_PYTHON (a python with vLLM) and \
             KVSTEER_REAL_VLLM_MODEL (the model folder), or run scripts/test-real-vllm.sh; \
             nothing was checked"
        );
        return;
    };
    let _g = serial().await;
    let stack = Stack::start(real)
        .await
        .expect("engines, indexer and Envoy");
    run(stack).await.expect("real vLLM checks");
}

async fn run(mut s: Stack) -> anyhow::Result<()> {
    ingests_both_engines(&s).await?;
    prompt_tokens_match(&s).await?;
    let warm = conversation_sticks_and_hits(&s).await?;
    engine_restart_is_detected(&mut s, warm).await?;
    Ok(())
}

/// (a) Each engine's own `BlockStored` events reach the index.
async fn ingests_both_engines(s: &Stack) -> anyhow::Result<()> {
    for i in 0..ENGINES {
        let tag = format!("warmup-{}", worker_name(i));
        let messages = [
            json!({"role": "system", "content": system_prompt(&tag)}),
            user(&tag, 0),
        ];
        s.chat_direct(i, &messages).await?;
    }
    let ws = wait_until("indexed blocks of both engines", WAIT, || async {
        let ws = s.workers().await.ok()?;
        (0..ENGINES)
            .all(|i| indexed_blocks(&ws, i) > 0)
            .then_some(ws)
    })
    .await?;
    for i in 0..ENGINES {
        println!(
            "(a) {}: indexed_blocks {}, stream {}",
            worker_name(i),
            indexed_blocks(&ws, i),
            worker_view(&ws, i)
                .map(|w| w["stream"].clone())
                .unwrap_or_default()
        );
    }
    Ok(())
}

/// (b) The indexer's prompt token count (the `tokenize` CLI, the dry-run
/// pick, and the routed pick's `kvsteer_prompt_tokens` observation) equals
/// vLLM's `usage.prompt_tokens`.
async fn prompt_tokens_match(s: &Stack) -> anyhow::Result<()> {
    let bodies = [
        vec![json!({"role": "user", "content": "Hello there, how are you?"})],
        vec![
            json!({"role": "system", "content": system_prompt("parity")}),
            json!({"role": "user", "content": "Résumé naïve café — 東京 🚀 tabs\tand\nnewlines."}),
        ],
        vec![
            json!({"role": "system", "content": "Be terse."}),
            json!({"role": "user", "content": "First question."}),
            json!({"role": "assistant", "content": "First answer."}),
            json!({"role": "user", "content": "Second question, with `code` and 12345 digits."}),
        ],
    ];
    for (n, messages) in bodies.iter().enumerate() {
        let body = chat_body(MODEL, &Value::Array(messages.clone()), MAX_TOKENS);
        let cli = s.cli_token_count(&body)?;
        let dry = s.score(&body).await?["prompt_tokens"]
            .as_u64()
            .context("/debug/score has no prompt_tokens")?;
        let (count0, sum0) = (
            s.metric("kvsteer_prompt_tokens_count", &[]).await?,
            s.metric("kvsteer_prompt_tokens_sum", &[]).await?,
        );
        let reply = s.chat_via_envoy(messages).await?;
        let vllm = reply.prompt_tokens();
        let picked = wait_until("the pick's prompt tokens observed", WAIT, || async {
            let count = s.metric("kvsteer_prompt_tokens_count", &[]).await.ok()?;
            let sum = s.metric("kvsteer_prompt_tokens_sum", &[]).await.ok()?;
            (count > count0).then_some((count - count0, sum - sum0))
        })
        .await?;
        println!(
            "(b) body {n}: vLLM usage.prompt_tokens {vllm}, tokenize CLI {cli}, \
             /debug/score {dry}, routed pick {} (over {} pick)",
            picked.1, picked.0
        );
        anyhow::ensure!(vllm > 0, "body {n}: vLLM reported no prompt tokens");
        anyhow::ensure!(
            cli as u64 == vllm,
            "body {n}: tokenize {cli} != vLLM {vllm}"
        );
        anyhow::ensure!(dry == vllm, "body {n}: /debug/score {dry} != vLLM {vllm}");
        anyhow::ensure!(picked.0 == 1.0, "body {n}: {} picks observed", picked.0);
        anyhow::ensure!(
            picked.1 == vllm as f64,
            "body {n}: routed pick {} != vLLM {vllm}",
            picked.1
        );
    }
    Ok(())
}

/// (c) A multi-turn conversation through Envoy stays on one engine, the
/// indexer sees the earlier turns there, and vLLM reports cache hits on
/// every later turn. Returns the engine it stuck to.
async fn conversation_sticks_and_hits(s: &Stack) -> anyhow::Result<usize> {
    const TURNS: usize = 5;
    let tag = "conversation";
    let mut messages = vec![json!({"role": "system", "content": system_prompt(tag)})];
    let mut engines = BTreeSet::new();
    let mut first = None;
    for turn in 0..TURNS {
        messages.push(user(tag, turn));
        let body = chat_body(MODEL, &Value::Array(messages.clone()), MAX_TOKENS);
        let mut matched = 0;
        if let Some(warm) = first {
            // The earlier turns' blocks are indexed on the engine that ran them.
            let score = wait_until("the earlier turns indexed", WAIT, || async {
                let v = s.score(&body).await.ok()?;
                let m = v["workers"]
                    .as_array()?
                    .iter()
                    .find(|w| w["name"] == worker_name(warm).as_str())?["matched_tokens"]
                    .as_u64()?;
                (m > 0).then_some(m)
            })
            .await?;
            matched = score;
        }
        let reply = s.chat_via_envoy(&messages).await?;
        let engine = served_by(&reply)?;
        first.get_or_insert(engine);
        engines.insert(engine);
        println!(
            "(c) turn {turn}: served by {}, prompt_tokens {}, cached_tokens {}, indexer matched {matched}",
            worker_name(engine),
            reply.prompt_tokens(),
            reply.cached_tokens()
        );
        if turn > 0 {
            let cached = reply.cached_tokens();
            anyhow::ensure!(
                cached > 0,
                "turn {turn}: no cached tokens on {}",
                worker_name(engine)
            );
            // vLLM recomputes a prompt's last token, so it may use one
            // block less than the index holds, never more.
            anyhow::ensure!(
                cached <= matched && matched <= cached + BLOCK_SIZE,
                "turn {turn}: the indexer matched {matched} tokens, vLLM hit {cached}"
            );
        }
        messages.push(json!({"role": "assistant", "content": reply.content()}));
    }
    anyhow::ensure!(
        engines.len() == 1,
        "the conversation was spread over {engines:?}"
    );
    first.context("no turn")
}

/// (d) Engine `victim` is killed and started again on the same ports: the
/// indexer shows its stream down and purges its blocks, requests keep
/// succeeding on the other engine, and the new incarnation's events are
/// indexed again.
async fn engine_restart_is_detected(s: &mut Stack, victim: usize) -> anyhow::Result<()> {
    let name = worker_name(victim);
    let label = format!("worker=\"{name}\"");
    let before = s.workers().await?;
    let blocks_before = indexed_blocks(&before, victim);
    anyhow::ensure!(blocks_before > 0, "{name} has no blocks before the restart");
    let lost_before = s
        .counter("kvsteer_stream_engines_lost_total", &label)
        .await?;
    let resets_before = s.counter("kvsteer_stream_resets_total", &label).await?;

    s.kill_engine(victim);
    let down = wait_until("the killed engine's stream down", WAIT, || async {
        let ws = s.workers().await.ok()?;
        (stream_state(&ws, victim).as_deref() == Some("down")).then_some(())
    });
    down.await?;
    println!("(d) {name} killed: stream down ({blocks_before} blocks indexed before)");

    // Fail-open meanwhile: every request is answered, by the other engine.
    let tag = "during-restart";
    let mut messages = vec![json!({"role": "system", "content": system_prompt(tag)})];
    for turn in 0..3 {
        messages.push(user(tag, turn));
        let reply = s.chat_via_envoy(&messages).await?;
        let engine = served_by(&reply)?;
        println!(
            "(d) request {turn} while {name} is down: served by {}",
            worker_name(engine)
        );
        anyhow::ensure!(engine != victim, "served by the dead engine");
        messages.push(json!({"role": "assistant", "content": reply.content()}));
    }
    let purged = wait_until("the dead engine's blocks purged", WAIT, || async {
        let ws = s.workers().await.ok()?;
        (indexed_blocks(&ws, victim) == 0).then_some(())
    });
    purged.await?;
    let lost = s
        .counter("kvsteer_stream_engines_lost_total", &label)
        .await?;
    println!("(d) {name} purged: indexed_blocks 0, engines_lost {lost_before} -> {lost}");

    s.spawn_engine(victim)?;
    s.wait_engine(victim).await?;
    wait_until("the restarted engine's stream live", WAIT, || async {
        let ws = s.workers().await.ok()?;
        (stream_state(&ws, victim).as_deref() == Some("live")).then_some(())
    })
    .await?;
    let tag = "after-restart";
    let messages = [
        json!({"role": "system", "content": system_prompt(tag)}),
        user(tag, 0),
    ];
    let reply = s.chat_direct(victim, &messages).await?;
    let ws = wait_until("the new incarnation's blocks indexed", WAIT, || async {
        let ws = s.workers().await.ok()?;
        (indexed_blocks(&ws, victim) > 0).then_some(ws)
    })
    .await?;
    let resets = s.counter("kvsteer_stream_resets_total", &label).await?;
    println!(
        "(d) {name} restarted: stream {}, indexed_blocks {}, cached_tokens of its first request {}, \
         engines_lost {lost}, resets {resets_before} -> {resets}",
        worker_view(&ws, victim)
            .map(|w| w["stream"].clone())
            .unwrap_or_default(),
        indexed_blocks(&ws, victim),
        reply.cached_tokens()
    );
    anyhow::ensure!(
        lost > lost_before || resets > resets_before,
        "neither an engine loss nor a reset was counted for {name}"
    );
    // The restarted engine's cache is empty: the old blocks are gone from
    // the index, only the new request's are there.
    let score = s
        .score(&chat_body(
            MODEL,
            &json!([{"role": "system", "content": system_prompt("conversation")}, user("conversation", 0)]),
            MAX_TOKENS,
        ))
        .await?;
    let stale = score["workers"]
        .as_array()
        .and_then(|ws| ws.iter().find(|w| w["name"] == name.as_str()))
        .and_then(|w| w["matched_tokens"].as_u64())
        .unwrap_or(0);
    println!("(d) {name}: the old conversation's matched tokens after the restart: {stale}");
    anyhow::ensure!(stale == 0, "{name} still matches the old conversation");
    Ok(())
}
