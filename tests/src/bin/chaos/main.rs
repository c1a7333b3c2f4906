//! `kvsteer-chaos`: the chaos soak of issue 18. Starts the local layout
//! (three simulated workers, the indexer on a Redis backend, Envoy with the
//! filter), drives steady mixed traffic through Envoy while it kills and
//! restarts the indexer, a worker and Redis, SIGSTOPs a worker and the
//! indexer, and resets client connections mid-pick; then checks that no
//! request failed except those in flight on a killed worker, that no
//! phantom load is left, that the indexer's RSS stayed flat and that a
//! restarted worker has no stale blocks. Exits 1 when a check fails, 2 when
//! the soak itself could not run.
//!
//! Uses the fixed local-layout ports: run it under
//! `flock /tmp/kvsteer-e2e.lock` (`scripts/chaos-soak.sh` does).
#![forbid(unsafe_code)]

mod checks;
mod faults;
mod layout;
mod memory;
mod traffic;
mod warmup;

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use kvsteer_e2e::Paths;

use checks::{Check, SETTLE_S};
use faults::{Fault, Faults, watch_stale};
use layout::{Layout, SimSpec, debug_workers, workers};
use traffic::{Rng, Traffic};

const USAGE: &str = "usage: kvsteer-chaos [--ci | --duration SECS] [--sessions N] [--profile NAME] \
[--time-scale X] [--seed N] [--logs DIR] [--report FILE]";

#[derive(Debug)]
struct Args {
    duration: f64,
    sessions: usize,
    sim: SimSpec,
    seed: u64,
    logs: Option<PathBuf>,
    report: Option<PathBuf>,
}

impl Args {
    fn parse() -> anyhow::Result<Args> {
        let mut a = Args {
            duration: 600.0,
            sessions: 6,
            sim: SimSpec {
                profile: "l40s-27b-fp8".into(),
                time_scale: 2.0,
            },
            seed: 18,
            logs: None,
            report: None,
        };
        let mut it = std::env::args().skip(1);
        while let Some(flag) = it.next() {
            let mut value = || {
                it.next()
                    .with_context(|| format!("{flag} needs a value\n{USAGE}"))
            };
            match flag.as_str() {
                "--ci" => {
                    a.duration = 60.0;
                    a.sessions = 4;
                }
                "--duration" => a.duration = value()?.parse().context("--duration")?,
                "--sessions" => a.sessions = value()?.parse().context("--sessions")?,
                "--profile" => a.sim.profile = value()?,
                "--time-scale" => a.sim.time_scale = value()?.parse().context("--time-scale")?,
                "--seed" => a.seed = value()?.parse().context("--seed")?,
                "--logs" => a.logs = Some(value()?.into()),
                "--report" => a.report = Some(value()?.into()),
                "-h" | "--help" => {
                    println!("{USAGE}");
                    std::process::exit(0);
                }
                other => bail!("unknown argument {other:?}\n{USAGE}"),
            }
        }
        if !(30.0..=7200.0).contains(&a.duration) {
            bail!("--duration must be 30..=7200 s");
        }
        if !(1..=64).contains(&a.sessions) {
            bail!("--sessions must be 1..=64");
        }
        Ok(a)
    }
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let code = match run().await {
        Ok(true) => 0,
        Ok(false) => 1,
        Err(e) => {
            eprintln!("chaos soak could not run: {e:#}");
            2
        }
    };
    std::process::exit(code);
}

async fn run() -> anyhow::Result<bool> {
    let args = Args::parse()?;
    let paths = Paths::discover()?;
    let tmp = tempfile::Builder::new()
        .prefix("kvsteer-chaos-")
        .tempdir()?;
    let logs = args
        .logs
        .clone()
        .unwrap_or_else(|| tmp.path().to_path_buf());
    eprintln!(
        "chaos: {} s, {} sessions, profile {} x{}, logs in {}",
        args.duration,
        args.sessions,
        args.sim.profile,
        args.sim.time_scale,
        logs.display()
    );
    let window_s = warmup::window_s(args.duration);
    let layout = Layout::start(&paths, &args.sim, &logs, window_s).await?;
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()?;
    let t0 = Instant::now();
    let indexer_pid = Arc::new(Mutex::new(layout.indexer_pid()));
    let mut faults = Faults {
        layout,
        http: http.clone(),
        t0,
        indexer_pid: indexer_pid.clone(),
        events: Vec::new(),
        probes: Vec::new(),
        resets: 0,
        rng: Rng::new(args.seed ^ 0xFA17),
    };

    let stop = Arc::new(AtomicBool::new(false));
    let rss = tokio::spawn(memory::sample(indexer_pid, t0, stop.clone()));
    let traffic = Arc::new(Traffic {
        http: reqwest::Client::builder()
            .pool_max_idle_per_host(0)
            .build()?,
        t0,
        stop: stop.clone(),
    });
    let sessions: Vec<_> = (0..args.sessions)
        .map(|i| tokio::spawn(traffic.clone().session(i, args.seed * 1000 + i as u64)))
        .collect();

    // Faults in order; a client reset every 5 s in between.
    let mut plan = faults::schedule(args.duration);
    plan.reverse();
    let mut next_reset = 5.0;
    let mut stale_watches = Vec::new();
    // The indexer's segment cache filled after its restart.
    let mut prefill = None;
    let interrupted = loop {
        let now = faults.now();
        if now >= args.duration {
            break false;
        }
        if let Some(&(at, fault)) = plan.last()
            && at <= now
        {
            plan.pop();
            eprintln!("chaos: {now:6.1} s {fault:?}");
            faults.run(fault).await?;
            if fault == Fault::KillIndexer {
                prefill = Some(tokio::spawn(warmup::fill_segment_cache(t0, args.seed)));
            }
            if let Fault::KillWorker(_) = fault
                && let Some(p) = faults.probes.last()
            {
                stale_watches.push((
                    p.clone(),
                    tokio::spawn(watch_stale(
                        http.clone(),
                        t0,
                        p.clone(),
                        args.duration + 30.0,
                    )),
                ));
            }
            continue;
        }
        if now >= next_reset && now < args.duration - 10.0 {
            faults.reset().await;
            next_reset += 5.0;
            continue;
        }
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_millis(100)) => {}
            _ = tokio::signal::ctrl_c() => break true,
        }
    };
    stop.store(true, Ordering::Relaxed);
    if interrupted {
        bail!("interrupted");
    }
    // Faults a slow machine pushed past the end did not run.
    let skipped: Vec<String> = plan
        .iter()
        .rev()
        .map(|(at, f)| format!("{f:?} at {at:.0} s"))
        .collect();
    let mut outcomes = Vec::new();
    for s in sessions {
        outcomes.extend(s.await.context("a traffic session panicked")?);
    }
    let last_end = outcomes.iter().map(|o| o.end).fold(0.0, f64::max);
    let settled = settle_in_flight(&http, t0, last_end).await;
    let mem_samples = rss.await.context("the memory sampler panicked")?;
    let rss_samples: Vec<(f64, u32, u64)> = mem_samples
        .iter()
        .map(|m| (m.t, m.life, m.rss_kb))
        .collect();

    let mut checks = Vec::new();
    let failures = checks::classify(&outcomes, &faults.events);
    let ok = outcomes.iter().filter(|o| o.error.is_none()).count();
    checks.push(Check {
        name: "no failed request (worker-kill ones apart)",
        pass: failures.other.is_empty() && ok > 0,
        detail: format!(
            "{} requests ({} chat, {} completions, {} streamed): {} ok, {} in flight on a killed worker, {} other failures; {} client resets sent",
            outcomes.len(),
            outcomes.iter().filter(|o| o.api == "chat").count(),
            outcomes.iter().filter(|o| o.api == "completions").count(),
            outcomes.iter().filter(|o| o.stream).count(),
            ok,
            failures.worker_kill,
            failures.other.len(),
            faults.resets
        ),
    });
    checks.push(settled);
    checks.push(Check {
        name: "every scheduled fault ran",
        pass: skipped.is_empty(),
        detail: if skipped.is_empty() {
            format!("{} faults", faults.events.len())
        } else {
            format!("not run before the end: {}", skipped.join(", "))
        },
    });
    let filled = match prefill {
        Some(p) => Some(p.await.context("the cache prefill panicked")?),
        None => None,
    };
    // Two route windows: the route memories at their steady size.
    let warmup = 2.0 * window_s as f64;
    checks.push(checks::rss_check(
        &rss_samples,
        warmup,
        filled.as_ref().map(|f| f.at),
    ));
    checks.extend(stale_checks(&http, stale_watches).await);

    let mut report = String::new();
    report.push_str(&checks::table(&checks));
    report.push_str(&format!(
        "\n{} s soak, {} sessions, profile {} x{}, seed {}. Faults (seconds from start):\n",
        args.duration, args.sessions, args.sim.profile, args.sim.time_scale, args.seed
    ));
    for e in &faults.events {
        report.push_str(&format!(
            "- {:6.1} → {:6.1} {:?}{}\n",
            e.at,
            e.back,
            e.fault,
            e.in_flight
                .map(|n| format!(" ({n} running or waiting on the worker just before)"))
                .unwrap_or_default()
        ));
    }
    report.push_str(&format!(
        "\nIndexer RSS: {}\n",
        checks::rss_series(&rss_samples, 5.0)
    ));
    if let Some(f) = &filled {
        report.push_str(&format!(
            "\nSegment cache prefill: {} prompts, {} k tokens cached, {} at {:.0} s.\n",
            f.prompts,
            f.tokens / 1000,
            if f.full {
                "full (evicting)"
            } else {
                "NOT seen full"
            },
            f.at
        ));
    }
    report.push_str(&format!(
        "\nIndexer memory every 30 s (every second in {}/memory.csv):\n\n{}",
        logs.display(),
        memory::table(&mem_samples, 30.0)
    ));
    std::fs::write(logs.join("memory.csv"), memory::csv(&mem_samples))
        .context("writing memory.csv")?;
    if !failures.other.is_empty() {
        report.push_str("\nFailed requests (first 20):\n");
        for o in failures.other.iter().take(20) {
            report.push_str(&format!(
                "- {:6.1}..{:6.1} session {} {} stream={} worker={:?}: {}\n",
                o.start,
                o.end,
                o.session,
                o.api,
                o.stream,
                o.worker,
                o.error.as_deref().unwrap_or("")
            ));
        }
    }
    println!("{report}");
    if let Some(path) = &args.report {
        std::fs::write(path, &report).with_context(|| format!("writing {}", path.display()))?;
    }
    if args.logs.is_none() {
        // Keep the logs of a failed run.
        if checks.iter().any(|c| !c.pass) {
            let kept = tmp.keep();
            eprintln!("chaos: logs kept in {}", kept.display());
        }
    }
    Ok(checks.iter().all(|c| c.pass))
}

/// Polls the indexer until its in-flight load is 0, up to [`SETTLE_S`] after
/// the last response.
async fn settle_in_flight(http: &reqwest::Client, t0: Instant, last_end: f64) -> Check {
    let name = "in-flight load 0 within 5 s of the last response";
    let deadline = last_end + SETTLE_S;
    let mut last = String::from("the indexer never answered");
    loop {
        if let Ok(v) = debug_workers(http).await {
            let ws = workers(&v);
            let total = |k: &str| ws.iter().filter_map(|w| w[k].as_u64()).sum::<u64>();
            let (n, tokens) = (total("in_flight"), total("unprefilled_tokens"));
            let per: Vec<String> = ws
                .iter()
                .map(|w| format!("{}={}", w["name"].as_str().unwrap_or("?"), w["in_flight"]))
                .collect();
            last = format!(
                "{n} in flight ({}), {tokens} unprefilled tokens",
                per.join(" ")
            );
            let at = t0.elapsed().as_secs_f64();
            if n == 0 && tokens == 0 {
                return Check {
                    name,
                    pass: true,
                    detail: format!(
                        "0 at {:.1} s after the last response",
                        (at - last_end).max(0.0)
                    ),
                };
            }
        }
        if t0.elapsed().as_secs_f64() >= deadline {
            return Check {
                name,
                pass: false,
                detail: format!("{last} {SETTLE_S} s after the last response"),
            };
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// For each restarted worker: its old blocks gone within 5 s of the restart
/// and still gone now.
async fn stale_checks(
    http: &reqwest::Client,
    watches: Vec<(faults::StaleProbe, tokio::task::JoinHandle<Option<f64>>)>,
) -> Vec<Check> {
    let mut out = Vec::new();
    for (probe, watch) in watches {
        let name = format!("w{}", probe.worker + 1);
        // Now (a non-degraded answer, retried for up to 5 s).
        let mut now_stale = None;
        for _ in 0..25 {
            let mut sum = Some(0);
            for b in &probe.bodies {
                let n = faults::matched_tokens(http, b, &name).await;
                sum = sum.zip(n).map(|(a, n)| a + n);
            }
            if sum.is_some() {
                now_stale = sum;
                break;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        let now_text =
            now_stale.map_or("unknown (degraded dry runs)".to_string(), |n| n.to_string());
        // The watch has seen them gone by now or never will.
        watch.abort();
        let clean = watch.await.ok().flatten();
        let (pass, detail) = match (probe.indexed, clean) {
            (false, _) => (
                false,
                "the probe prompts were never indexed on the worker before its kill: cannot tell"
                    .to_string(),
            ),
            (true, Some(at)) => (
                at - probe.restarted <= SETTLE_S && now_stale == Some(0),
                format!(
                    "old blocks gone {:.1} s after the respawn; {now_text} stale probe tokens at the end",
                    (at - probe.restarted).max(0.0)
                ),
            ),
            (true, None) => (
                false,
                format!("old blocks still indexed at the end ({now_text} probe tokens)"),
            ),
        };
        out.push(Check {
            name: "no stale blocks for a restarted worker (gone <= 5 s)",
            pass,
            detail: format!("{name} respawned at {:.1} s: {detail}", probe.restarted),
        });
    }
    if out.is_empty() {
        out.push(Check {
            name: "no stale blocks for a restarted worker (gone <= 5 s)",
            pass: false,
            detail: "no worker was restarted".into(),
        });
    }
    out
}
