//! `kvsteer-bench overhead`: the latency the kvsteer filter and indexer add to a
//! request, measured side by side against the same Envoy with plain round
//! robin, in one run, at a fixed request rate.
//!
//! Both Envoys front the same workers. Requests alternate between the two
//! targets on one open-loop schedule; each is a chat request of a session
//! whose long context (about `--prompt-tokens` tokens) is shared by the
//! session's requests, plus a unique question, with `max_tokens: 1` and no
//! streaming. Run the workers with a near-zero step time (`--profile test`)
//! so that what differs between the two targets is the proxy path.

use std::time::{Duration, Instant};

use serde_json::{Value, json};

#[derive(Debug, Clone, clap::Args)]
pub struct OverheadArgs {
    /// Envoy with the kvsteer filter (or any target to measure against the
    /// baseline, e.g. another router).
    #[arg(long, default_value = "http://127.0.0.1:8080")]
    pub kvsteer: String,
    /// The same Envoy with plain round robin (or a worker, directly).
    #[arg(long, default_value = "http://127.0.0.1:8081")]
    pub baseline: String,
    #[arg(long, default_value = "Qwen/Qwen3-8B")]
    pub model: String,
    /// Approximate prompt sizes to measure, in tokens.
    #[arg(long, value_delimiter = ',', default_values_t = [1000u32, 8000])]
    pub prompt_tokens: Vec<u32>,
    /// Request rates to measure, requests per second, both targets together.
    /// At low rates the machine idles between requests and every hop of the
    /// path runs with cold CPU caches; higher rates show the warm path.
    #[arg(long = "rate", value_delimiter = ',', default_values_t = [10.0f64, 50.0, 100.0])]
    pub rates: Vec<f64>,
    /// Requests per target and prompt size.
    #[arg(long, default_value_t = 200)]
    pub requests: usize,
    /// Conversations the requests of one size are spread over.
    #[arg(long, default_value_t = 8)]
    pub sessions: usize,
    /// Warm-up requests per session and target before measuring (at least
    /// the number of workers, so round robin has warmed every worker).
    #[arg(long, default_value_t = 4)]
    pub warm_rounds: usize,
}

/// Latency percentiles of one target for one prompt size, milliseconds.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Percentiles {
    pub p50: f64,
    pub p99: f64,
    pub failed: usize,
}

/// About `tokens` tokens of context for session `s` (one short word is
/// roughly one Qwen3 token).
fn context(s: usize, tokens: u32) -> String {
    let mut text = format!("Session {s} context.");
    let words = [
        "alpha", "bravo", "delta", "gamma", "omega", "sigma", "kappa",
    ];
    for i in 0..tokens as usize {
        text.push(' ');
        text.push_str(words[(i * 7 + s) % words.len()]);
    }
    text
}

fn body(model: &str, context: &str, i: usize) -> Value {
    json!({
        "model": model,
        "messages": [
            {"role": "system", "content": context},
            {"role": "user", "content": format!("Question {i}: one word please.")}
        ],
        "max_tokens": 1,
        "stream": false,
    })
}

/// Sends `body` and reads the whole answer; `None` on any failure.
async fn timed(client: &reqwest::Client, url: &str, body: &Value) -> Option<f64> {
    let start = Instant::now();
    let resp = client.post(url).json(body).send().await.ok()?;
    let ok = resp.status().is_success();
    resp.bytes().await.ok()?;
    ok.then(|| start.elapsed().as_secs_f64() * 1e3)
}

fn percentiles(mut v: Vec<f64>, failed: usize) -> Percentiles {
    v.sort_by(f64::total_cmp);
    let at = |q: f64| {
        if v.is_empty() {
            f64::NAN
        } else {
            v[((v.len() - 1) as f64 * q).round() as usize]
        }
    };
    Percentiles {
        p50: at(0.5),
        p99: at(0.99),
        failed,
    }
}

/// Measures one prompt size at each of `args.rates` (warming once); returns
/// (rate, kvsteer, baseline) per rate.
pub async fn measure(
    args: &OverheadArgs,
    client: &reqwest::Client,
    tokens: u32,
) -> Vec<(f64, Percentiles, Percentiles)> {
    let targets = [
        format!("{}/v1/chat/completions", args.kvsteer.trim_end_matches('/')),
        format!(
            "{}/v1/chat/completions",
            args.baseline.trim_end_matches('/')
        ),
    ];
    let contexts: Vec<String> = (0..args.sessions.max(1))
        .map(|s| context(s + tokens as usize, tokens))
        .collect();
    // Warm both paths (tokenizer caches, connections, and every worker's
    // KV cache: round robin spreads each session over all workers, so one
    // request per session would leave the baseline with cold prefills).
    for round in 0..args.warm_rounds.max(1) {
        for (s, ctx) in contexts.iter().enumerate() {
            for t in &targets {
                let _ = timed(client, t, &body(&args.model, ctx, s + round)).await;
            }
        }
    }
    let mut out = Vec::with_capacity(args.rates.len());
    for &rate in &args.rates {
        let interval = Duration::from_secs_f64(1.0 / rate.max(0.1));
        let start = tokio::time::Instant::now();
        let mut tasks = Vec::with_capacity(2 * args.requests);
        for i in 0..2 * args.requests {
            tokio::time::sleep_until(start + interval * i as u32).await;
            let target = targets[i % 2].clone();
            let b = body(&args.model, &contexts[(i / 2) % contexts.len()], i);
            let client = client.clone();
            tasks.push(tokio::spawn(async move {
                (i % 2, timed(&client, &target, &b).await)
            }));
        }
        let mut lat = [Vec::new(), Vec::new()];
        let mut failed = [0usize; 2];
        for t in tasks {
            match t.await {
                Ok((k, Some(ms))) => lat[k].push(ms),
                Ok((k, None)) => failed[k] += 1,
                Err(_) => failed[0] += 1,
            }
        }
        let [k, b] = lat;
        out.push((rate, percentiles(k, failed[0]), percentiles(b, failed[1])));
    }
    out
}

pub async fn run(args: &OverheadArgs) -> anyhow::Result<()> {
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(60))
        .build()?;
    println!(
        "{} requests per target, size and rate, alternating between\n  target:   {}\n  baseline: {}\n",
        args.requests, args.kvsteer, args.baseline
    );
    println!(
        "{:>6}  {:>7}  {:>12} {:>12}  {:>12} {:>12}  {:>10} {:>10}  {:>6}",
        "req/s",
        "tokens",
        "target p50",
        "target p99",
        "base p50",
        "base p99",
        "added p50",
        "added p99",
        "failed"
    );
    for &tokens in &args.prompt_tokens {
        for (rate, k, b) in measure(args, &client, tokens).await {
            println!(
                "{:>6}  {:>7}  {:>9.2} ms {:>9.2} ms  {:>9.2} ms {:>9.2} ms  {:>7.2} ms {:>7.2} ms  {:>6}",
                rate,
                tokens,
                k.p50,
                k.p99,
                b.p50,
                b.p99,
                k.p50 - b.p50,
                k.p99 - b.p99,
                k.failed + b.failed
            );
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_of_a_known_sample() {
        let p = percentiles((1..=100).map(f64::from).collect(), 2);
        assert_eq!((p.p50, p.p99, p.failed), (51.0, 99.0, 2));
        assert!(percentiles(Vec::new(), 0).p50.is_nan());
    }

    #[test]
    fn sessions_get_distinct_contexts_of_the_requested_size() {
        let a = context(1, 100);
        assert_ne!(a, context(2, 100));
        assert_eq!(a.split_whitespace().count(), 103);
    }
}
