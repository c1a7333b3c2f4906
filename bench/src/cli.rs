//! `kvsteer-bench` entry point: resolve flags, run, print, write.

use std::path::{Path, PathBuf};

use serde_json::json;

use super::args::{BenchArgs, Resolved, workload_name};
use super::{plot, report, run_virtual};

pub async fn run(args: &BenchArgs) -> anyhow::Result<()> {
    let resolved = args.resolve()?;
    if args.live {
        return crate::live::bench::run(&resolved).await;
    }
    let start = std::time::Instant::now();
    let r = resolved.clone();
    let quiet = args.quiet;
    let runs = tokio::task::spawn_blocking(move || run_virtual(&r, !quiet)).await?;
    if !quiet {
        print!("{}", report::table(&runs));
        print!("{}", report::comparisons(&runs));
        eprintln!(
            "{} runs in {:.1} s wall",
            runs.len(),
            start.elapsed().as_secs_f64()
        );
    }
    if let Some(out) = &args.out {
        report::write_json(out, config_json(&resolved), &runs)?;
        write_plots(args, out, &runs);
    }
    Ok(())
}

/// PNG plots beside `out` (or in `--plot-dir`). Plots are a convenience:
/// the JSON is already written, so a failure is a warning.
pub fn write_plots(args: &BenchArgs, out: &Path, runs: &[super::summary::RunSummary]) {
    let dir = args
        .plot_dir
        .clone()
        .or_else(|| out.parent().map(Path::to_path_buf))
        .unwrap_or_else(|| PathBuf::from("."));
    let stem = out.file_stem().and_then(|s| s.to_str()).unwrap_or("bench");
    match plot::write_all(&dir, &format!("{stem}-"), runs) {
        Ok(files) if !args.quiet => {
            for f in files {
                eprintln!("plot: {}", f.display());
            }
        }
        Ok(_) => {}
        Err(e) => tracing::warn!(error = %e, "plots not written"),
    }
}

/// The inputs of the run, for the JSON (no wall-clock values: same seed →
/// same file).
pub fn config_json(r: &Resolved) -> serde_json::Value {
    let workloads: Vec<_> = r
        .workloads
        .iter()
        .map(|&k| json!({"workload": workload_name(k), "sizes": r.sizes(k)}))
        .collect();
    let mut config = json!({
        "workloads": workloads,
        "policies": r.policies.iter().map(|p| p.name()).collect::<Vec<_>>(),
        "rates_per_min": r.rates,
        "duration_s": r.duration_s,
        "workers": r.workers,
        "profile": r.engine.profile.name,
        "num_gpu_blocks": r.engine.num_gpu_blocks,
        "block_size": r.engine.block_size,
        "seed": r.seed,
        "event_delay_s": r.event_delay_s,
        "scrape_interval_s": r.scrape_interval_s,
        "seed_objective": "p90 TTFT <= 8 s",
        "chat_objective": "p90 TTFT <= 1 s",
    });
    // Only when set, so that default runs keep their files.
    if r.args().scoring.is_some() {
        config["scoring"] = serde_json::to_value(&r.scoring).unwrap_or_default();
    }
    config
}
