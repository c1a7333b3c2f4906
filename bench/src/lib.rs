//! `kvsteer-bench`: routing policies compared on the same arrivals, in
//! virtual time (default) or live through Envoy (`--live`).
//!
//! ```text
//! args → workload::Plan (per workload × rate, shared by all policies)
//!      → driver::run (engines + router::VirtualRouter, per policy)
//!      → summary::RunSummary → report (table, JSON) + plot (PNG)
//! ```
//! Design notes and results: `sim/BENCHMARKS.md`.

pub mod args;
pub mod cli;
pub mod driver;
pub mod oracle;
pub mod peers;
pub mod plot;
pub mod policy;
pub mod report;
pub mod router;
pub mod search;
pub mod service;
pub mod summary;
pub mod tokens;
pub mod trace;
pub mod workload;

/// Live runs through real endpoints (`--live`) and the latency a router
/// adds (`kvsteer-bench overhead`).
pub mod live {
    pub mod bench;
    pub mod overhead;
    pub mod words;
}

use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

pub use args::BenchArgs;
pub use driver::{RunConfig, RunOutput, run};
pub use summary::RunSummary;
pub use workload::{Plan, WorkloadKind};

/// One unit of work: a plan and a policy.
struct Job<'a> {
    workload: &'a str,
    rate: f64,
    plan: &'a Plan,
    cfg: RunConfig,
    /// `--records`: write the run's requests here.
    records: Option<&'a std::path::Path>,
}

/// Runs every workload × rate × policy of `jobs`, `threads` at a time; the
/// results come back in input order whatever the scheduling.
fn run_all(jobs: &[Job<'_>], threads: usize, progress: bool) -> Vec<RunSummary> {
    let next = AtomicUsize::new(0);
    let results: Mutex<Vec<Option<RunSummary>>> = Mutex::new(vec![None; jobs.len()]);
    std::thread::scope(|s| {
        for _ in 0..threads.clamp(1, jobs.len().max(1)) {
            s.spawn(|| {
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    let Some(job) = jobs.get(i) else { break };
                    let start = std::time::Instant::now();
                    let out = if job.cfg.policy == policy::BenchPolicy::Search {
                        let found = search::search(job.plan, &job.cfg);
                        if progress {
                            eprintln!(
                                "  {} search @ {} rpm: from {} (p90 {:.3} s, {} side targets missed), {} runs, {} moves kept: p90 {:.3} s, {} missed",
                                job.workload,
                                job.rate,
                                found.start,
                                found.start_score.map_or(f64::NAN, |s| s.run.p90_s),
                                found.start_score.map_or(0, |s| s.misses),
                                found.runs,
                                found.kept,
                                found.score.map_or(f64::NAN, |s| s.run.p90_s),
                                found.score.map_or(0, |s| s.misses),
                            );
                        }
                        found.output
                    } else {
                        run(job.plan, &job.cfg)
                    };
                    let summary = summary::summarize(
                        job.workload,
                        job.cfg.policy.name(),
                        job.rate,
                        job.cfg.workers,
                        &out,
                    );
                    if let Some(dir) = job.records
                        && let Err(e) = report::write_records(dir, &summary, &out.records)
                    {
                        tracing::warn!(error = %e, "records not written");
                    }
                    if progress {
                        eprintln!(
                            "  {} {} @ {} rpm: {} requests, {:.0} s simulated in {:.2} s wall",
                            job.workload,
                            job.cfg.policy,
                            job.rate,
                            summary.requests,
                            summary.simulated_s,
                            start.elapsed().as_secs_f64()
                        );
                    }
                    results.lock().unwrap_or_else(|e| e.into_inner())[i] = Some(summary);
                }
            });
        }
    });
    results
        .into_inner()
        .unwrap_or_else(|e| e.into_inner())
        .into_iter()
        .flatten()
        .collect()
}

/// The virtual-time benchmark: every run's summary, in
/// workload × rate × policy order.
pub fn run_virtual(args: &args::Resolved, progress: bool) -> Vec<RunSummary> {
    let mut plans = Vec::new();
    for &kind in &args.workloads {
        for &rate in &args.rates {
            let plan = args.plan(kind, rate);
            plans.push((args::workload_name(kind), rate, plan));
        }
    }
    let mut jobs = Vec::new();
    for (name, rate, plan) in &plans {
        for &policy in &args.policies {
            jobs.push(Job {
                workload: name,
                rate: *rate,
                plan,
                cfg: args.run_config(policy),
                records: args.args().records.as_deref(),
            });
        }
    }
    run_all(&jobs, args.jobs, progress)
}
