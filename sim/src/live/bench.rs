//! `kvsteer-sim bench --live`: the same workload plans as the virtual-time
//! benchmark, sent as real streaming `/v1/completions` requests (prompts as
//! token ids) at their planned times to each `--target` in turn (e.g.
//! Envoy with kvsteer, then Envoy with plain round robin, in front of the
//! same simulated workers). TTFT is measured on the client side; the
//! summaries have the same fields as the virtual-time ones, `policy` being
//! the target's name.
//!
//! Sessions (multi-turn, and the agent tenant of mixed) are closed loops
//! as in virtual time: a session starts at its planned time, and each turn
//! is sent after the previous answer and the turn's think time, its prompt
//! the previous prompt, the tokens generated for it (`return_token_ids`)
//! and the turn's user message. No turn starts after the run's end.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use serde_json::json;

use super::client::{ClientError, Observed, stream_request};
use crate::bench::args::{Resolved, workload_name};
use crate::bench::driver::{RequestRecord, RunOutput};
use crate::bench::summary::summarize;
use crate::bench::workload::{Plan, Tenant, What, WorkloadKind};
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
        for &rate in &args.rates {
            let plan = match (kind, &args.trace) {
                (WorkloadKind::Trace, Some(trace)) => {
                    Plan::from_trace(trace, rate, args.duration_s, args.seed)
                }
                _ => Plan::synthetic(kind, &args.sizes(kind), rate, args.duration_s, args.seed),
            };
            for (name, url) in &targets {
                reset(&client, &args.args().reset_worker).await?;
                let sessions = plan
                    .arrivals
                    .iter()
                    .filter(|a| matches!(a.what, What::Session(_)))
                    .count();
                eprintln!(
                    "live: {} @ {rate} rpm → {name} ({url}), {} arrivals ({sessions} of them sessions of several turns)",
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

/// One request as sent and observed.
struct Sent {
    tenant: Tenant,
    /// When it was sent, seconds from the start of the run.
    arrival: f64,
    prompt_tokens: usize,
    obs: Result<Observed, ClientError>,
}

async fn drive(
    client: &reqwest::Client,
    base: &str,
    model: &str,
    plan: &Plan,
) -> anyhow::Result<RunOutput> {
    let url: Arc<str> = format!("{base}/v1/completions").into();
    let model: Arc<str> = model.into();
    let plan = Arc::new(plan.clone());
    let start = Instant::now();
    let mut tasks = Vec::with_capacity(plan.arrivals.len());
    for a in &plan.arrivals {
        tokio::time::sleep_until((start + Duration::from_secs_f64(a.t)).into()).await;
        let (client, url, model) = (client.clone(), url.clone(), model.clone());
        let (tenant, t) = (a.tenant, a.t);
        match &a.what {
            What::Single { prompt, output } => {
                let ids = plan.prompt(prompt);
                let body = request_body(&model, &ids, *output);
                tasks.push(tokio::spawn(async move {
                    let obs = stream_request(&client, &url, &body).await;
                    vec![Sent {
                        tenant,
                        arrival: t,
                        prompt_tokens: ids.len(),
                        obs,
                    }]
                }));
            }
            &What::Session(s) => {
                let plan = plan.clone();
                tasks.push(tokio::spawn(async move {
                    session(&client, &url, &model, &plan, s, tenant, start).await
                }));
            }
        }
    }
    let mut sent = Vec::with_capacity(tasks.len());
    for task in tasks {
        sent.extend(task.await.context("request task")?);
    }
    sent.sort_by(|a, b| a.arrival.total_cmp(&b.arrival));
    let mut names: Vec<String> = Vec::new();
    let mut records = Vec::with_capacity(sent.len());
    for Sent {
        tenant,
        arrival,
        prompt_tokens,
        obs,
    } in sent
    {
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
            prompt_tokens: prompt_tokens as u32,
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

/// A streaming completion of `prompt` (token ids) that returns the
/// generated token ids.
fn request_body(model: &str, prompt: &[u32], output: u32) -> serde_json::Value {
    json!({
        "model": model,
        "prompt": prompt,
        "max_tokens": output,
        "ignore_eos": true,
        "stream": true,
        "stream_options": {"include_usage": true},
        "return_token_ids": true,
    })
}

/// One session's turns, each after the previous answer and its think time.
/// A failed turn ends the session (as a rejected one does in virtual time).
async fn session(
    client: &reqwest::Client,
    url: &str,
    model: &str,
    plan: &Plan,
    s: usize,
    tenant: Tenant,
    start: Instant,
) -> Vec<Sent> {
    let sp = &plan.sessions[s];
    let mut context = plan.session_start(sp);
    let mut out = Vec::with_capacity(sp.turns.len());
    for (turn, tp) in sp.turns.iter().enumerate() {
        if turn > 0 {
            tokio::time::sleep(Duration::from_secs_f64(tp.think_s)).await;
            if start.elapsed().as_secs_f64() > plan.end_s {
                break;
            }
        }
        plan.user_message(sp, turn, &mut context);
        let arrival = start.elapsed().as_secs_f64();
        let obs = stream_request(client, url, &request_body(model, &context, tp.output)).await;
        let generated = match &obs {
            Ok(o) if o.status == 200 && o.ttft.is_some() => Some(o.token_ids.clone()),
            _ => None,
        };
        out.push(Sent {
            tenant,
            arrival,
            prompt_tokens: context.len(),
            obs,
        });
        let Some(generated) = generated else {
            break;
        };
        context.extend_from_slice(&generated);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::workload::Sizes;
    use crate::engine::EngineConfig;
    use crate::profile::TimingProfile;
    use crate::server::{ServerConfig, ServerHandle};

    /// An in-process simulated worker on a free loopback port, running 100×
    /// faster than the `test` profile's clock.
    async fn worker() -> ServerHandle {
        let shared = std::env::var_os("KVSTEER_SHARED")
            .map(std::path::PathBuf::from)
            .unwrap_or_else(|| concat!(env!("CARGO_MANIFEST_DIR"), "/../../shared").into());
        let mut engine = EngineConfig::new(TimingProfile::by_name("test").unwrap());
        engine.num_gpu_blocks = 4096;
        engine.max_model_len = 8192;
        let cfg = ServerConfig {
            listen: "127.0.0.1:0".parse().unwrap(),
            served_model_name: "sim-model".into(),
            tokenizer_dir: shared.join("tokenizers/qwen3"),
            kv_events: None,
            engine,
            time_scale: 100.0,
            worker_id: "w".into(),
            lora_modules: Vec::new(),
        };
        ServerHandle::start(cfg).await.unwrap()
    }

    fn multi_turn(rate_per_min: f64, duration_s: f64) -> Plan {
        let sizes = Sizes {
            groups: 2,
            users_per_group: 1,
            prefix_tokens: 256,
            question_tokens: 64,
            output_tokens: 16,
            think_s: 0.01,
            max_context_tokens: 1_500,
        };
        Plan::synthetic(WorkloadKind::MultiTurn, &sizes, rate_per_min, duration_s, 1)
    }

    /// Each turn's prompt is the last one, its answer (the engine's own
    /// ids) and the new message, so the worker finds the last prompt and
    /// the answer's full blocks cached.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_session_sends_its_answers_back() {
        let server = worker().await;
        let url = format!("http://{}/v1/completions", server.addr);
        let plan = multi_turn(60.0, 3_600.0);
        let sp = &plan.sessions[0];
        assert!(sp.turns.len() >= 2, "{sp:?}");
        let client = reqwest::Client::new();
        let sent = session(
            &client,
            &url,
            "sim-model",
            &plan,
            0,
            Tenant::Agent,
            Instant::now(),
        )
        .await;
        assert_eq!(sent.len(), sp.turns.len());
        for (k, pair) in sent.windows(2).enumerate() {
            let (prev, next) = (&pair[0], &pair[1]);
            let answer = sp.turns[k].output as usize;
            let user = sp.turns[k + 1].user_tokens as usize;
            assert_eq!(next.prompt_tokens, prev.prompt_tokens + answer + user);
            let obs = next.obs.as_ref().unwrap();
            assert_eq!(obs.status, 200);
            // The answer's last token never enters the cache; blocks of 16.
            let held = (prev.prompt_tokens + answer - 1) / 16 * 16;
            assert!(
                obs.cached_tokens as usize >= held,
                "turn {}: {obs:?}",
                k + 1
            );
        }
        server.shutdown().await;
    }

    /// A whole plan of sessions: every turn answered, in order of sending,
    /// more turns than sessions.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_live_run_of_sessions_completes() {
        let server = worker().await;
        let plan = multi_turn(600.0, 3.0);
        assert!(!plan.arrivals.is_empty());
        let client = reqwest::Client::new();
        let base = format!("http://{}", server.addr);
        let out = drive(&client, &base, "sim-model", &plan).await.unwrap();
        assert!(
            out.records.len() > plan.arrivals.len(),
            "{}",
            out.records.len()
        );
        assert!(
            out.records
                .iter()
                .all(|r| !r.rejected && r.first_token_at.is_some())
        );
        assert!(out.records.windows(2).all(|w| w[0].arrival <= w[1].arrival));
        server.shutdown().await;
    }

    #[test]
    fn targets_are_named() {
        let t = targets(&["kvsteer=http://a:1/".into(), "http://b:2".into()]).unwrap();
        assert_eq!(t[0], ("kvsteer".into(), "http://a:1".into()));
        assert_eq!(t[1], ("target2".into(), "http://b:2".into()));
        assert!(targets(&[]).is_err());
    }
}
