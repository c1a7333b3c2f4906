//! `kvsteer-bench --live`: the same workload plans as the virtual-time
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
//!
//! `--chat` sends the same plans as chat requests with text prompts, for
//! routers that take only text ([`super::words`]): a single request is one
//! user message; a session keeps its messages, each answer's text going back
//! as an assistant message. `--live-time-scale S` runs against workers S
//! times faster than the profile's clock: arrivals and think times are
//! divided by S and measured times multiplied by it.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use serde_json::json;

use super::words::Words;
use crate::args::{Resolved, workload_name};
use crate::driver::{RequestRecord, RunOutput};
use crate::summary::summarize;
use crate::workload::{Plan, Tenant, What};
use crate::{cli::config_json, report};
use kvsteer_sim::live::client::{ClientError, Observed, stream_request};

/// Requests are abandoned after this long.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(600);

/// A `--before-run` command is killed, and the bench stopped, after this long.
const BEFORE_RUN_TIMEOUT: Duration = Duration::from_secs(300);

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
    let raw = args.args();
    let mode = match (&raw.tokenizer, raw.chat) {
        (Some(dir), true) => {
            let tok = kvsteer_tokenize::PromptTokenizer::from_dir(dir)
                .with_context(|| format!("tokenizer {}", dir.display()))?;
            Mode::Chat(Arc::new(Words::from_tokenizer(&tok)?))
        }
        _ => Mode::Completions,
    };
    let scale = raw.live_time_scale;
    let mut runs = Vec::new();
    for &kind in &args.workloads {
        for &rate in &args.rates {
            let plan = args.plan(kind, rate);
            for (repeat, name, url) in rounds(&targets, raw.repeats) {
                if let Some(cmd) = &raw.before_run {
                    before_run(cmd, name, url, BEFORE_RUN_TIMEOUT).await?;
                }
                reset(&client, &args.args().reset_worker).await?;
                let sessions = plan
                    .arrivals
                    .iter()
                    .filter(|a| matches!(a.what, What::Session(_)))
                    .count();
                let of = repeat.map_or(String::new(), |k| {
                    format!(", run {} of {}", k + 1, raw.repeats)
                });
                eprintln!(
                    "live: {} @ {rate} rpm → {name} ({url}){of}, {} arrivals ({sessions} of them sessions of several turns)",
                    workload_name(kind),
                    plan.arrivals.len()
                );
                let out = drive(&client, url, &args.args().model, &plan, &mode, scale).await?;
                let mut summary = summarize(workload_name(kind), name, rate, args.workers, &out);
                summary.repeat = repeat;
                if let Some(dir) = &raw.records {
                    report::write_records(dir, &summary, &out.records)?;
                }
                runs.push(summary);
            }
        }
    }
    if !args.args().quiet {
        print!("{}", report::table(&runs));
        print!("{}", report::spread(&runs));
        print!("{}", report::comparisons(&runs));
    }
    if let Some(out) = &args.args().out {
        let mut config = config_json(args);
        config["policies"] = json!(targets.iter().map(|(n, _)| n).collect::<Vec<_>>());
        config["live_targets"] = json!(targets);
        config["live_chat"] = json!(raw.chat);
        config["live_time_scale"] = json!(scale);
        config["live_repeats"] = json!(raw.repeats);
        report::write_json(out, config, &runs)?;
        crate::cli::write_plots(args.args(), out, &report::medians(&runs));
    }
    Ok(())
}

/// The runs at one rate: every target `repeats` times, each round starting
/// one target later, so that no target always runs first (on a machine
/// still warm from the previous rate) or always after the same one. The
/// repeat index is `None` when each target runs once.
fn rounds(
    targets: &[(String, String)],
    repeats: u32,
) -> impl Iterator<Item = (Option<u32>, &str, &str)> {
    let n = targets.len();
    (0..repeats).flat_map(move |k| {
        let repeat = (repeats > 1).then_some(k);
        (0..n).map(move |i| {
            let (name, url) = &targets[(k as usize + i) % n];
            (repeat, name.as_str(), url.as_str())
        })
    })
}

/// Runs `--before-run` for one target's run: `sh -c cmd` with the target's
/// name and URL in its environment. An error when it cannot start, fails
/// or outlasts `timeout` (it is killed then).
async fn before_run(cmd: &str, name: &str, url: &str, timeout: Duration) -> anyhow::Result<()> {
    eprintln!("live: before {name}'s run: {cmd}");
    let child = tokio::process::Command::new("sh")
        .arg("-c")
        .arg(cmd)
        .env("KVSTEER_BENCH_TARGET", name)
        .env("KVSTEER_BENCH_TARGET_URL", url)
        .kill_on_drop(true)
        .status();
    let status = tokio::time::timeout(timeout, child)
        .await
        .map_err(|_| {
            anyhow::anyhow!("--before-run for {name} did not finish within {timeout:?}: {cmd}")
        })?
        .with_context(|| format!("--before-run for {name}: cannot start sh"))?;
    if !status.success() {
        bail!("--before-run for {name} failed ({status}): {cmd}");
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

/// What the requests look like.
#[derive(Clone)]
pub enum Mode {
    /// `/v1/completions` with token-id prompts (sessions send back the
    /// generated ids).
    Completions,
    /// `/v1/chat/completions` with text prompts.
    Chat(Arc<Words>),
}

impl Mode {
    fn path(&self) -> &'static str {
        match self {
            Mode::Completions => "/v1/completions",
            Mode::Chat(_) => "/v1/chat/completions",
        }
    }
}

/// One request as sent and observed.
struct Sent {
    tenant: Tenant,
    group: Option<u32>,
    /// When it was sent, in plan seconds from the start of the run.
    arrival: f64,
    prompt_tokens: usize,
    obs: Result<Observed, ClientError>,
}

/// Plan seconds from `start`, on a clock `scale` times faster.
fn plan_elapsed(start: Instant, scale: f64) -> f64 {
    start.elapsed().as_secs_f64() * scale
}

async fn drive(
    client: &reqwest::Client,
    base: &str,
    model: &str,
    plan: &Plan,
    mode: &Mode,
    scale: f64,
) -> anyhow::Result<RunOutput> {
    let url: Arc<str> = format!("{base}{}", mode.path()).into();
    let model: Arc<str> = model.into();
    let plan = Arc::new(plan.clone());
    let start = Instant::now();
    let mut tasks = Vec::with_capacity(plan.arrivals.len());
    for a in &plan.arrivals {
        tokio::time::sleep_until((start + Duration::from_secs_f64(a.t / scale)).into()).await;
        let (client, url, model, mode) = (client.clone(), url.clone(), model.clone(), mode.clone());
        let (tenant, t) = (a.tenant, a.t);
        match &a.what {
            What::Single { prompt, output } => {
                let ids = plan.prompt(prompt);
                let body = match &mode {
                    Mode::Completions => request_body(&model, &ids, *output),
                    Mode::Chat(words) => chat_body(
                        &model,
                        &[json!({"role": "user", "content": words.text(&ids)})],
                        *output,
                    ),
                };
                let group = prompt.group();
                tasks.push(tokio::spawn(async move {
                    let obs = stream_request(&client, &url, &body).await;
                    vec![Sent {
                        tenant,
                        group,
                        arrival: t,
                        prompt_tokens: ids.len(),
                        obs,
                    }]
                }));
            }
            &What::Session(s) => {
                let plan = plan.clone();
                tasks.push(tokio::spawn(async move {
                    let run = SessionRun {
                        client: &client,
                        url: &url,
                        model: &model,
                        plan: &plan,
                        start,
                        scale,
                    };
                    match &mode {
                        Mode::Completions => run.ids(s, tenant).await,
                        Mode::Chat(words) => run.chat(words, s, tenant).await,
                    }
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
        group,
        arrival,
        prompt_tokens,
        obs,
    } in sent
    {
        let (worker, first, finished, cached, prompt, ok) = match obs {
            Ok(o) if o.status == 200 => {
                let name = o.worker.clone().unwrap_or_else(|| "?".to_owned());
                let w = names.iter().position(|n| *n == name).unwrap_or_else(|| {
                    names.push(name);
                    names.len() - 1
                });
                let first = o.ttft.map(|t| arrival + t.as_secs_f64() * scale);
                // The engine's count where it reports one (chat prompts
                // carry the template's tokens too).
                let prompt = match o.prompt_tokens {
                    0 => prompt_tokens,
                    n => n as usize,
                };
                (
                    w,
                    first,
                    Some(arrival + o.e2e.as_secs_f64() * scale),
                    o.cached_tokens as u32,
                    prompt,
                    first.is_some(),
                )
            }
            Ok(o) => {
                tracing::warn!(status = o.status, "live request failed");
                (0, None, None, 0, prompt_tokens, false)
            }
            Err(e) => {
                tracing::warn!(error = %e, "live request failed");
                (0, None, None, 0, prompt_tokens, false)
            }
        };
        records.push(RequestRecord {
            tenant,
            group,
            arrival,
            worker,
            prompt_tokens: prompt as u32,
            matched_tokens: 0,
            predicted_ttft_s: None,
            cached_tokens: cached,
            first_token_at: first,
            finished_at: if ok { finished } else { None },
            rejected: !ok,
        });
    }
    Ok(RunOutput::of_records(
        records,
        Vec::new(),
        plan_elapsed(start, scale),
    ))
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

/// A streaming chat completion of `messages`.
fn chat_body(model: &str, messages: &[serde_json::Value], output: u32) -> serde_json::Value {
    json!({
        "model": model,
        "messages": messages,
        "max_tokens": output,
        "ignore_eos": true,
        "stream": true,
        "stream_options": {"include_usage": true},
    })
}

/// One session's turns, each after the previous answer and its think time.
/// A failed turn ends the session (as a rejected one does in virtual time).
struct SessionRun<'a> {
    client: &'a reqwest::Client,
    url: &'a str,
    model: &'a str,
    plan: &'a Plan,
    start: Instant,
    scale: f64,
}

impl SessionRun<'_> {
    /// Waits for turn `turn`'s think time; false when the run is over.
    async fn think(&self, turn: usize, think_s: f64) -> bool {
        if turn > 0 {
            tokio::time::sleep(Duration::from_secs_f64(think_s / self.scale)).await;
            if plan_elapsed(self.start, self.scale) > self.plan.end_s {
                return false;
            }
        }
        true
    }

    /// Sends one turn and records it in `out`; the response when it
    /// streamed a first token (the session goes on), `None` otherwise.
    async fn send<'o>(
        &self,
        tenant: Tenant,
        body: &serde_json::Value,
        prompt_tokens: usize,
        out: &'o mut Vec<Sent>,
    ) -> Option<&'o Observed> {
        let arrival = plan_elapsed(self.start, self.scale);
        let obs = stream_request(self.client, self.url, body).await;
        out.push(Sent {
            tenant,
            group: None,
            arrival,
            prompt_tokens,
            obs,
        });
        match &out.last()?.obs {
            Ok(o) if o.status == 200 && o.ttft.is_some() => Some(o),
            _ => None,
        }
    }

    /// Token-id prompts: each turn's prompt is the last one, the generated
    /// ids and the new message.
    async fn ids(&self, s: usize, tenant: Tenant) -> Vec<Sent> {
        let sp = &self.plan.sessions[s];
        let mut context = self.plan.session_start(sp);
        let mut out = Vec::with_capacity(sp.turns.len());
        for (turn, tp) in sp.turns.iter().enumerate() {
            if !self.think(turn, tp.think_s).await {
                break;
            }
            self.plan.user_message(sp, turn, &mut context);
            let body = request_body(self.model, &context, tp.output);
            let Some(answered) = self.send(tenant, &body, context.len(), &mut out).await else {
                break;
            };
            context.extend_from_slice(&answered.token_ids);
        }
        out
    }

    /// Chat: the first user message holds the session's start and its first
    /// message; each answer goes back as an assistant message.
    async fn chat(&self, words: &Words, s: usize, tenant: Tenant) -> Vec<Sent> {
        let sp = &self.plan.sessions[s];
        let mut first = self.plan.session_start(sp);
        let mut planned = first.len();
        let mut messages = Vec::with_capacity(2 * sp.turns.len());
        let mut out = Vec::with_capacity(sp.turns.len());
        for (turn, tp) in sp.turns.iter().enumerate() {
            if !self.think(turn, tp.think_s).await {
                break;
            }
            let mut message = std::mem::take(&mut first);
            self.plan.user_message(sp, turn, &mut message);
            planned += message.len();
            messages.push(json!({"role": "user", "content": words.text(&message)}));
            let body = chat_body(self.model, &messages, tp.output);
            let Some(answered) = self.send(tenant, &body, planned, &mut out).await else {
                break;
            };
            let answer = answered.text.clone();
            planned += tp.output as usize;
            messages.push(json!({"role": "assistant", "content": answer}));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workload::{Sizes, WorkloadKind};
    use kvsteer_sim::engine::EngineConfig;
    use kvsteer_sim::profile::TimingProfile;
    use kvsteer_sim::server::{ServerConfig, ServerHandle};

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

    #[test]
    fn rounds_rotate_the_targets() {
        let targets: Vec<(String, String)> = ["a", "b", "c"]
            .iter()
            .map(|n| (n.to_string(), format!("http://{n}")))
            .collect();
        let order = |repeats| {
            rounds(&targets, repeats)
                .map(|(k, n, u)| {
                    assert_eq!(u, format!("http://{n}"));
                    (k, n.to_owned())
                })
                .collect::<Vec<_>>()
        };
        let once = order(1);
        assert_eq!(
            once,
            [(None, "a".into()), (None, "b".into()), (None, "c".into())]
        );
        let names: Vec<String> = order(3).into_iter().map(|(_, n)| n).collect();
        assert_eq!(names, ["a", "b", "c", "b", "c", "a", "c", "a", "b"]);
        let repeats: Vec<Option<u32>> = order(2).into_iter().map(|(k, _)| k).collect();
        assert_eq!(
            repeats,
            [Some(0), Some(0), Some(0), Some(1), Some(1), Some(1)]
        );
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
        let run = SessionRun {
            client: &client,
            url: &url,
            model: "sim-model",
            plan: &plan,
            start: Instant::now(),
            scale: 1.0,
        };
        let sent = run.ids(0, Tenant::Agent).await;
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
        let out = drive(&client, &base, "sim-model", &plan, &Mode::Completions, 1.0)
            .await
            .unwrap();
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

    /// Chat: each turn's prompt holds the previous one whole (its answer
    /// goes back as text), so the worker finds the previous prompt's full
    /// blocks cached; and the plan's time runs `scale` times faster.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_chat_session_finds_its_previous_prompt_cached() {
        let server = worker().await;
        let shared = std::env::var_os("KVSTEER_SHARED")
            .map(std::path::PathBuf::from)
            .unwrap_or_else(|| concat!(env!("CARGO_MANIFEST_DIR"), "/../../shared").into());
        let tok =
            kvsteer_tokenize::PromptTokenizer::from_dir(&shared.join("tokenizers/qwen3")).unwrap();
        let words = Words::from_tokenizer(&tok).unwrap();
        let plan = multi_turn(60.0, 3_600.0);
        let sp = &plan.sessions[0];
        assert!(sp.turns.len() >= 2, "{sp:?}");
        let client = reqwest::Client::new();
        let url = format!("http://{}/v1/chat/completions", server.addr);
        let run = SessionRun {
            client: &client,
            url: &url,
            model: "sim-model",
            plan: &plan,
            start: Instant::now(),
            scale: 4.0,
        };
        let sent = run.chat(&words, 0, Tenant::Agent).await;
        assert_eq!(sent.len(), sp.turns.len());
        for (k, pair) in sent.windows(2).enumerate() {
            let (prev, next) = (pair[0].obs.as_ref().unwrap(), pair[1].obs.as_ref().unwrap());
            assert_eq!(next.status, 200);
            // The template adds a few tokens per message; the words one each.
            assert!(next.prompt_tokens > prev.prompt_tokens + u64::from(sp.turns[k].output));
            let held = prev.prompt_tokens / 16 * 16;
            assert!(next.cached_tokens >= held, "turn {}: {next:?}", k + 1);
            // Plan seconds: the think time, at 4x, still counts whole.
            assert!(pair[1].arrival >= pair[0].arrival + sp.turns[k + 1].think_s);
        }
        server.shutdown().await;
    }

    /// The command sees which target runs next; a failing or hanging one
    /// stops the bench, naming the target.
    #[tokio::test]
    async fn before_run_knows_its_target_and_stops_the_bench_when_it_fails() {
        let file = std::env::temp_dir().join(format!("kvsteer-before-run-{}", std::process::id()));
        let cmd = format!(
            "printf '%s %s' \"$KVSTEER_BENCH_TARGET\" \"$KVSTEER_BENCH_TARGET_URL\" > '{}'",
            file.display()
        );
        let long = Duration::from_secs(60);
        before_run(&cmd, "sglang", "http://127.0.0.1:30000", long)
            .await
            .unwrap();
        let seen = std::fs::read_to_string(&file).unwrap();
        std::fs::remove_file(&file).unwrap();
        assert_eq!(seen, "sglang http://127.0.0.1:30000");
        let err = before_run("exit 3", "kvsteer", "http://a", long)
            .await
            .unwrap_err();
        assert!(err.to_string().contains("kvsteer failed"), "{err}");
        let err = before_run("sleep 30", "rr", "http://a", Duration::from_millis(50))
            .await
            .unwrap_err();
        assert!(err.to_string().contains("did not finish"), "{err}");
    }

    #[test]
    fn targets_are_named() {
        let t = targets(&["kvsteer=http://a:1/".into(), "http://b:2".into()]).unwrap();
        assert_eq!(t[0], ("kvsteer".into(), "http://a:1".into()));
        assert_eq!(t[1], ("target2".into(), "http://b:2".into()));
        assert!(targets(&[]).is_err());
    }
}
