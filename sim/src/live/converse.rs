//! `kvsteer-sim converse`: a scripted multi-turn chat workload against any
//! OpenAI-compatible endpoint (Envoy with kvsteer, or a worker directly). It
//! prints, per request, the worker that served it, the prompt tokens already
//! cached there and the time to first token.

use std::time::Duration;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde_json::{Value, json};

use super::client::{Observed, stream_request};

#[derive(Debug, Clone, clap::Args)]
pub struct ConverseArgs {
    /// Base URL, e.g. http://127.0.0.1:8080
    #[arg(long)]
    pub target: String,
    #[arg(long, default_value = "Qwen/Qwen3-8B")]
    pub model: String,
    #[arg(long, default_value_t = 4)]
    pub conversations: usize,
    #[arg(long, default_value_t = 4)]
    pub turns: usize,
    /// Lines in each conversation's system prompt (about 25 tokens a line).
    #[arg(long, default_value_t = 80)]
    pub context_lines: usize,
    #[arg(long, default_value_t = 32)]
    pub max_tokens: u32,
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
}

struct Conversation {
    name: String,
    messages: Vec<Value>,
}

const TOPICS: &[&str] = &[
    "a rate limiter",
    "a B-tree",
    "an HTTP router",
    "a log parser",
    "a job queue",
    "a config loader",
    "a cache",
    "a CSV importer",
];

impl Conversation {
    fn new(i: usize, lines: usize, rng: &mut ChaCha8Rng) -> Conversation {
        let topic = TOPICS[i % TOPICS.len()];
        let mut system = format!("You are a senior engineer reviewing {topic} (session {i}).\n");
        for l in 0..lines {
            let n: u32 = rng.random_range(0..10_000);
            system.push_str(&format!(
                "Context {l}: module_{n} handles {topic} case {l}; keep it small and tested.\n"
            ));
        }
        Conversation {
            name: format!("conv-{i}"),
            messages: vec![json!({"role": "system", "content": system})],
        }
    }
}

/// Runs the workload; returns the observations in order.
pub async fn run(args: &ConverseArgs) -> anyhow::Result<Vec<(String, usize, Observed)>> {
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(300))
        .build()?;
    let url = format!("{}/v1/chat/completions", args.target.trim_end_matches('/'));
    let mut rng = ChaCha8Rng::seed_from_u64(args.seed);
    let mut convs: Vec<Conversation> = (0..args.conversations)
        .map(|i| Conversation::new(i, args.context_lines, &mut rng))
        .collect();
    println!(
        "{:<8} {:>4}  {:<8} {:>7} {:>7} {:>9}",
        "conv", "turn", "worker", "prompt", "cached", "ttft_ms"
    );
    let mut out = Vec::new();
    // The conversations send each turn at the same time, as concurrent users
    // would; a conversation's next turn waits for its previous answer.
    for turn in 1..=args.turns {
        let bodies: Vec<Value> = convs
            .iter_mut()
            .map(|conv| {
                conv.messages.push(json!({
                    "role": "user",
                    "content": format!("Turn {turn}: what should we change next in {}?", conv.name),
                }));
                json!({
                    "model": args.model,
                    "messages": conv.messages,
                    "max_tokens": args.max_tokens,
                    "stream": true,
                    "stream_options": {"include_usage": true},
                })
            })
            .collect();
        let replies =
            futures::future::join_all(bodies.iter().map(|b| stream_request(&client, &url, b)))
                .await;
        for (conv, obs) in convs.iter_mut().zip(replies) {
            let obs = obs?;
            println!(
                "{:<8} {:>4}  {:<8} {:>7} {:>7} {:>9}",
                conv.name,
                turn,
                obs.worker.as_deref().unwrap_or("?"),
                obs.prompt_tokens,
                obs.cached_tokens,
                obs.ttft
                    .map(|t| format!("{:.1}", t.as_secs_f64() * 1e3))
                    .unwrap_or_else(|| format!("status {}", obs.status)),
            );
            conv.messages
                .push(json!({"role": "assistant", "content": obs.text.clone()}));
            out.push((conv.name.clone(), turn, obs));
        }
    }
    summarize(&out);
    Ok(out)
}

fn summarize(rows: &[(String, usize, Observed)]) {
    let later: Vec<&Observed> = rows.iter().filter(|r| r.1 > 1).map(|r| &r.2).collect();
    let first: Vec<&Observed> = rows.iter().filter(|r| r.1 == 1).map(|r| &r.2).collect();
    let mean_ttft = |v: &[&Observed]| {
        let t: Vec<f64> = v
            .iter()
            .filter_map(|o| o.ttft)
            .map(|t| t.as_secs_f64() * 1e3)
            .collect();
        if t.is_empty() {
            0.0
        } else {
            t.iter().sum::<f64>() / t.len() as f64
        }
    };
    let cached: u64 = later.iter().map(|o| o.cached_tokens).sum();
    let prompt: u64 = later.iter().map(|o| o.prompt_tokens).sum();
    println!(
        "\nturn 1: mean TTFT {:.1} ms | turns 2+: mean TTFT {:.1} ms, {:.0}% of prompt tokens cached",
        mean_ttft(&first),
        mean_ttft(&later),
        if prompt == 0 {
            0.0
        } else {
            100.0 * cached as f64 / prompt as f64
        }
    );
}
