//! `kvsteer-sim bench --live`: the same workload plans as the virtual-time
//! benchmark, sent as real streaming `/v1/completions` requests (prompts as
//! token ids) at their planned times to each `--target` in turn (e.g.
//! Envoy with kvsteer, then Envoy with plain round robin, in front of the
//! same simulated workers). TTFT is measured on the client side; the
//! summaries have the same fields as the virtual-time ones, `policy` being
//! the target's name.

use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use serde_json::json;

use super::client::stream_request;
use crate::bench::args::{Resolved, workload_name};
use crate::bench::driver::{RequestRecord, RunOutput};
use crate::bench::summary::summarize;
use crate::bench::workload::{Plan, What, WorkloadKind};
use crate::bench::{cli::config_json, report};

/// Requests are abandoned after this long.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(600);

/// `NAME=URL` or `URL` (named after its position).
fn targets(raw: &[String]) -> anyhow::Result<Vec<(String, String)>> {
    if raw.is_empty() {
        bail!("--live needs at least one --target URL");
    }
    Ok(raw
        .iter()
        .enumerate()
        .map(|(i, t)| match t.split_once('=') {
            Some((name, url)) => (name.to_owned(), url.trim_end_matches('/').to_owned()),
            None => (
                format!("target{}", i + 1),
                t.trim_end_matches('/').to_owned(),
            ),
        })
        .collect())
}

pub async fn run(args: &Resolved) -> anyhow::Result<()> {
    let targets = targets(&args.args().target)?;
    let client = reqwest::Client::builder()
        .timeout(REQUEST_TIMEOUT)
        .build()?;
    let mut runs = Vec::new();
    for &kind in &args.workloads {
        if matches!(kind, WorkloadKind::MultiTurn | WorkloadKind::Mixed) {
            bail!(
                "--live supports shared-prefix, independent and trace workloads (multi-turn is closed-loop: use `kvsteer-sim converse`)"
            );
        }
        for &rate in &args.rates {
            let plan = match (kind, &args.trace) {
                (WorkloadKind::Trace, Some(trace)) => {
                    Plan::from_trace(trace, rate, args.duration_s, args.seed)
                }
                _ => Plan::synthetic(kind, &args.sizes(kind), rate, args.duration_s, args.seed),
            };
            for (name, url) in &targets {
                reset(&client, &args.args().reset_worker).await?;
                eprintln!(
                    "live: {} @ {rate} rpm → {name} ({url}), {} requests",
                    workload_name(kind),
                    plan.arrivals.len()
                );
                let out = drive(&client, url, &args.args().model, &plan).await?;
                runs.push(summarize(
                    workload_name(kind),
                    name,
                    rate,
                    args.workers,
                    &out,
                ));
            }
        }
    }
    if !args.args().quiet {
        print!("{}", report::table(&runs));
        print!("{}", report::comparisons(&runs));
    }
    if let Some(out) = &args.args().out {
        let mut config = config_json(args);
        config["live_targets"] = json!(targets);
        report::write_json(out, config, &runs)?;
    }
    Ok(())
}

/// Empties the workers' prefix caches (they must be idle).
async fn reset(client: &reqwest::Client, workers: &[String]) -> anyhow::Result<()> {
    for w in workers {
        let url = format!("{}/reset_prefix_cache", w.trim_end_matches('/'));
        let resp = client
            .post(&url)
            .send()
            .await
            .with_context(|| format!("POST {url}"))?;
        let outcome = resp
            .headers()
            .get("x-kvsteer-reset")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("?")
            .to_owned();
        eprintln!("live: reset {w}: {} {outcome}", resp.status());
    }
    // Let the AllBlocksCleared events reach the indexer.
    tokio::time::sleep(Duration::from_millis(500)).await;
    Ok(())
}

async fn drive(
    client: &reqwest::Client,
    base: &str,
    model: &str,
    plan: &Plan,
) -> anyhow::Result<RunOutput> {
    let url = format!("{base}/v1/completions");
    let start = Instant::now();
    let mut tasks = Vec::with_capacity(plan.arrivals.len());
    for a in &plan.arrivals {
        let What::Single { prompt, output } = &a.what else {
            continue;
        };
        let ids = plan.prompt(prompt);
        let body = json!({
            "model": model,
            "prompt": ids,
            "max_tokens": output,
            "ignore_eos": true,
            "stream": true,
            "stream_options": {"include_usage": true},
        });
        tokio::time::sleep_until((start + Duration::from_secs_f64(a.t)).into()).await;
        let (client, url, tenant, t) = (client.clone(), url.clone(), a.tenant, a.t);
        tasks.push(tokio::spawn(async move {
            let obs = stream_request(&client, &url, &body).await;
            (tenant, t, ids.len(), obs)
        }));
    }
    let mut names: Vec<String> = Vec::new();
    let mut records = Vec::with_capacity(tasks.len());
    for task in tasks {
        let (tenant, arrival, prompt_len, obs) = task.await.context("request task")?;
        let (worker, first, finished, cached, ok) = match obs {
            Ok(o) if o.status == 200 => {
                let name = o.worker.clone().unwrap_or_else(|| "?".to_owned());
                let w = names.iter().position(|n| *n == name).unwrap_or_else(|| {
                    names.push(name);
                    names.len() - 1
                });
                let first = o.ttft.map(|t| arrival + t.as_secs_f64());
                (
                    w,
                    first,
                    Some(arrival + o.e2e.as_secs_f64()),
                    o.cached_tokens as u32,
                    first.is_some(),
                )
            }
            Ok(o) => {
                tracing::warn!(status = o.status, "live request failed");
                (0, None, None, 0, false)
            }
            Err(e) => {
                tracing::warn!(error = %e, "live request failed");
                (0, None, None, 0, false)
            }
        };
        records.push(RequestRecord {
            tenant,
            arrival,
            worker,
            prompt_tokens: prompt_len as u32,
            matched_tokens: 0,
            predicted_ttft_s: 0.0,
            cached_tokens: cached,
            first_token_at: first,
            finished_at: if ok { finished } else { None },
            rejected: !ok,
        });
    }
    Ok(RunOutput {
        records,
        preemptions: 0,
        event_batches: 0,
        event_errors: 0,
        steps: 0,
        end_s: start.elapsed().as_secs_f64(),
        prefill_rates: Vec::new(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets_are_named() {
        let t = targets(&["kvsteer=http://a:1/".into(), "http://b:2".into()]).unwrap();
        assert_eq!(t[0], ("kvsteer".into(), "http://a:1".into()));
        assert_eq!(t[1], ("target2".into(), "http://b:2".into()));
        assert!(targets(&[]).is_err());
    }
}
