//! The simulator against a real vLLM engine on the same requests: each
//! prompt is sent cold, then again warm, to every target in turn (one at a
//! time, so they do not share the CPU), while this tool subscribes to the
//! target's KV events. It compares what each request published (BlockStored
//! events, blocks, the token ids of the prompt's blocks) and the ratio of
//! cold to warm time to first token. `scripts/sim-vs-vllm.sh` starts an
//! engine and a simulator and runs it; results are in `sim/REAL-VLLM.md`.
//!
//! ```text
//! cargo run -p kvsteer-sim --example sim_vs_vllm -- \
//!   --target vllm,http://127.0.0.1:8001,tcp://127.0.0.1:5557 \
//!   --target sim,http://127.0.0.1:8011,tcp://127.0.0.1:5581 --model tiny
//! ```

use std::path::PathBuf;
use std::str::FromStr;
use std::time::{Duration, Instant};

use anyhow::{Context, bail, ensure};
use clap::Parser;
use futures::StreamExt;
use kvsteer_kv_events::KvEvent;
use kvsteer_kv_events::zmq::{StreamItem, SubscriberConfig, spawn_subscriber};
use serde::Serialize;
use serde_json::{Value, json};
use tokio::sync::{mpsc, watch};

#[derive(Parser)]
#[command(about = "kvsteer-sim against a real vLLM engine: KV events and cold/warm TTFT")]
struct Args {
    /// `name,http://host:port,tcp://host:port` (OpenAI server, KV-event PUB);
    /// the first target is the reference the others are compared with.
    #[arg(long, required = true)]
    target: Vec<Target>,
    /// Model name in the requests.
    #[arg(long, default_value = "tiny")]
    model: String,
    #[arg(long, default_value_t = 10)]
    prompts: usize,
    /// Lines per prompt (about 14 tokens each).
    #[arg(long, default_value_t = 70)]
    lines: usize,
    #[arg(long, default_value_t = 4)]
    max_tokens: u32,
    /// The engines' KV block size.
    #[arg(long, default_value_t = 32)]
    block_size: usize,
    /// A request's events are those that arrive until the stream has been
    /// quiet this long after its response ended.
    #[arg(long, default_value_t = 500)]
    quiet_ms: u64,
    /// Makes the prompts new to engines that served an earlier run
    /// [default: the current time].
    #[arg(long)]
    nonce: Option<String>,
    /// Writes every observation here as JSON.
    #[arg(long)]
    json: Option<PathBuf>,
}

#[derive(Debug, Clone, Serialize)]
struct Target {
    name: String,
    url: String,
    events: String,
}

impl FromStr for Target {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let mut parts = s.splitn(3, ',');
        match (parts.next(), parts.next(), parts.next()) {
            (Some(name), Some(url), Some(events)) => Ok(Target {
                name: name.to_owned(),
                url: url.trim_end_matches('/').to_owned(),
                events: events.to_owned(),
            }),
            _ => Err(format!("expected name,http-url,zmq-endpoint, got {s:?}")),
        }
    }
}

/// What one request did on one target.
#[derive(Debug, Clone, Default, Serialize)]
struct Observation {
    prompt: usize,
    warm: bool,
    prompt_tokens: u64,
    cached_tokens: u64,
    ttft_ms: f64,
    /// BlockStored events (vLLM sends one per scheduler step and request).
    stored_events: usize,
    stored_blocks: usize,
    removed_blocks: usize,
    cleared: usize,
    /// Token ids of every stored block, in order.
    block_tokens: Vec<Vec<u32>>,
}

#[derive(Debug, Serialize)]
struct Run {
    target: Target,
    observations: Vec<Observation>,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let nonce = args.nonce.clone().unwrap_or_else(|| {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        now.as_millis().to_string()
    });
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(600))
        .build()?;
    let mut runs = Vec::new();
    for target in &args.target {
        eprintln!(
            "==> {} ({}, events {})",
            target.name, target.url, target.events
        );
        runs.push(run_target(&args, &client, target, &nonce).await?);
    }
    report(&args, &runs);
    if let Some(path) = &args.json {
        std::fs::write(path, serde_json::to_vec_pretty(&runs)?)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}

async fn run_target(
    args: &Args,
    client: &reqwest::Client,
    target: &Target,
    nonce: &str,
) -> anyhow::Result<Run> {
    let (tx, mut rx) = mpsc::channel(1024);
    let (stop_tx, stop_rx) = watch::channel(false);
    let cfg = SubscriberConfig {
        endpoint: target.events.clone(),
        idle_reconnect: None,
        down_grace: None,
        ..SubscriberConfig::default()
    };
    let task = spawn_subscriber(cfg, tx, stop_rx);
    let connected = tokio::time::timeout(Duration::from_secs(60), async {
        while let Some(item) = rx.recv().await {
            if item == StreamItem::Connected {
                return true;
            }
        }
        false
    });
    ensure!(
        connected.await.unwrap_or(false),
        "{}: no KV-event stream at {}",
        target.name,
        target.events
    );
    let mut observations = Vec::new();
    for p in 0..args.prompts {
        let body = request(args, nonce, p);
        for warm in [false, true] {
            while rx.try_recv().is_ok() {}
            let mut o = send(client, &target.url, &body).await?;
            o.prompt = p;
            o.warm = warm;
            collect_events(&mut rx, Duration::from_millis(args.quiet_ms), &mut o).await;
            eprintln!(
                "  prompt {p} {}: prompt_tokens {} cached {} ttft {:.1} ms, BlockStored {} ({} blocks)",
                if warm { "warm" } else { "cold" },
                o.prompt_tokens,
                o.cached_tokens,
                o.ttft_ms,
                o.stored_events,
                o.stored_blocks
            );
            observations.push(o);
        }
    }
    let _ = stop_tx.send(true);
    drop(rx);
    let _ = task.await;
    Ok(Run {
        target: target.clone(),
        observations,
    })
}

/// Prompt `p`: a document of `lines` numbered lines, new to the engine.
fn request(args: &Args, nonce: &str, p: usize) -> Value {
    let mut doc = format!("Document {nonce}-{p}. Read it and summarise it.\n");
    for k in 0..args.lines {
        doc.push_str(&format!(
            "Line {k} of document {p}: the quick brown fox number {k} jumps over the lazy dog.\n"
        ));
    }
    json!({
        "model": args.model,
        "messages": [{"role": "user", "content": doc}],
        "max_tokens": args.max_tokens,
        "stream": true,
        "stream_options": {"include_usage": true},
    })
}

/// Sends a streaming chat request; the TTFT is the time to the first body
/// byte (both servers send nothing before the first token).
async fn send(client: &reqwest::Client, url: &str, body: &Value) -> anyhow::Result<Observation> {
    let start = Instant::now();
    let resp = client
        .post(format!("{url}/v1/chat/completions"))
        .json(body)
        .send()
        .await
        .with_context(|| format!("POST {url}"))?;
    let status = resp.status();
    let mut first = None;
    let mut bytes = Vec::new();
    let mut stream = resp.bytes_stream();
    while let Some(chunk) = stream.next().await {
        let chunk = chunk?;
        if first.is_none() && !chunk.is_empty() {
            first = Some(start.elapsed());
        }
        bytes.extend_from_slice(&chunk);
    }
    let text = String::from_utf8_lossy(&bytes);
    if !status.is_success() {
        bail!("{url}: {status}: {text}");
    }
    let usage = text
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .filter_map(|d| serde_json::from_str::<Value>(d).ok())
        .find_map(|v| v.get("usage").filter(|u| !u.is_null()).cloned())
        .context("no usage chunk")?;
    Ok(Observation {
        prompt_tokens: usage["prompt_tokens"].as_u64().unwrap_or(0),
        cached_tokens: usage
            .pointer("/prompt_tokens_details/cached_tokens")
            .and_then(Value::as_u64)
            .unwrap_or(0),
        ttft_ms: first.unwrap_or_default().as_secs_f64() * 1e3,
        ..Observation::default()
    })
}

/// Adds the batches that arrive until the stream is quiet for `quiet`.
async fn collect_events(rx: &mut mpsc::Receiver<StreamItem>, quiet: Duration, o: &mut Observation) {
    while let Ok(Some(item)) = tokio::time::timeout(quiet, rx.recv()).await {
        let StreamItem::Batch { batch, .. } = item else {
            continue;
        };
        for event in batch.events {
            match event {
                KvEvent::BlockStored(s) => {
                    o.stored_events += 1;
                    o.stored_blocks += s.block_hashes.len();
                    let size = (s.block_size as usize).max(1);
                    o.block_tokens
                        .extend(s.token_ids.chunks(size).map(<[u32]>::to_vec));
                }
                KvEvent::BlockRemoved(r) => o.removed_blocks += r.block_hashes.len(),
                KvEvent::AllBlocksCleared => o.cleared += 1,
            }
        }
    }
}

// === the report ===

fn median(mut xs: Vec<f64>) -> f64 {
    if xs.is_empty() {
        return f64::NAN;
    }
    xs.sort_by(f64::total_cmp);
    let n = xs.len();
    if n % 2 == 1 {
        xs[n / 2]
    } else {
        (xs[n / 2 - 1] + xs[n / 2]) / 2.0
    }
}

fn report(args: &Args, runs: &[Run]) {
    let Some(reference) = runs.first() else {
        return;
    };
    println!(
        "\n## Per request (events published; token ids compared with {})\n",
        reference.target.name
    );
    let mut header = String::from("| prompt | phase |");
    let mut rule = String::from("|---|---|");
    for r in runs {
        header.push_str(&format!(
            " {n} prompt/cached tokens | {n} BlockStored (blocks) |",
            n = r.target.name
        ));
        rule.push_str("---|---|");
    }
    if runs.len() > 1 {
        header.push_str(" prompt blocks' token ids |");
        rule.push_str("---|");
    }
    println!("{header}\n{rule}");
    for (k, o) in reference.observations.iter().enumerate() {
        let mut row = format!(
            "| {} | {} |",
            o.prompt,
            if o.warm { "warm" } else { "cold" }
        );
        for r in runs {
            let Some(x) = r.observations.get(k) else {
                row.push_str(" - | - |");
                continue;
            };
            row.push_str(&format!(
                " {}/{} | {} ({}) |",
                x.prompt_tokens, x.cached_tokens, x.stored_events, x.stored_blocks
            ));
        }
        if runs.len() > 1 {
            let verdicts: Vec<String> = runs[1..]
                .iter()
                .map(|r| match r.observations.get(k) {
                    Some(x) if !o.warm => prompt_blocks_verdict(args.block_size, o, x),
                    _ => "-".to_owned(),
                })
                .collect();
            row.push_str(&format!(" {} |", verdicts.join(", ")));
        }
        println!("{row}");
    }
    println!("\n## Totals and time to first token\n");
    println!(
        "| target | BlockStored cold / warm | blocks cold / warm | median TTFT cold / warm (ms) | cold/warm ratio (medians) | median of per-prompt ratios |"
    );
    println!("|---|---|---|---|---|---|");
    for r in runs {
        let phase = |warm: bool| r.observations.iter().filter(move |o| o.warm == warm);
        let events = |warm| phase(warm).map(|o| o.stored_events).sum::<usize>();
        let blocks = |warm| phase(warm).map(|o| o.stored_blocks).sum::<usize>();
        let cold = median(phase(false).map(|o| o.ttft_ms).collect());
        let warm = median(phase(true).map(|o| o.ttft_ms).collect());
        let ratios: Vec<f64> = r
            .observations
            .chunks(2)
            .filter(|c| c.len() == 2 && c[1].ttft_ms > 0.0)
            .map(|c| c[0].ttft_ms / c[1].ttft_ms)
            .collect();
        println!(
            "| {} | {} / {} | {} / {} | {cold:.1} / {warm:.1} | {:.2} | {:.2} |",
            r.target.name,
            events(false),
            events(true),
            blocks(false),
            blocks(true),
            cold / warm,
            median(ratios)
        );
    }
}

/// Whether `x` stored the same token ids as `reference` for the blocks made
/// of prompt tokens only (generated tokens differ: random weights on one
/// side, a seeded sampler on the other).
fn prompt_blocks_verdict(block_size: usize, reference: &Observation, x: &Observation) -> String {
    let full = (reference.prompt_tokens as usize) / block_size.max(1);
    let n = full
        .min(reference.block_tokens.len())
        .min(x.block_tokens.len());
    if n == 0 {
        return "none stored".to_owned();
    }
    let same = reference.block_tokens[..n] == x.block_tokens[..n];
    format!("{} of {n}", if same { "equal" } else { "DIFFER" })
}
