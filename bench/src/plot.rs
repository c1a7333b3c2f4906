//! PNG plots: per workload, TTFT p50 (log scale) and goodput against the
//! request rate, one line per policy.

use std::path::{Path, PathBuf};

use plotters::coord::types::RangedCoordf64;
use plotters::prelude::*;

use super::summary::RunSummary;

const SIZE: (u32, u32) = (900, 600);
const COLORS: [RGBColor; 8] = [
    RGBColor(220, 50, 47),
    RGBColor(133, 153, 0),
    RGBColor(38, 139, 210),
    RGBColor(255, 127, 14),
    RGBColor(0, 0, 0),
    RGBColor(108, 113, 196),
    RGBColor(42, 161, 152),
    RGBColor(211, 54, 130),
];

#[derive(Debug, thiserror::Error)]
#[error("plotting {path}: {detail}")]
pub struct PlotError {
    path: String,
    detail: String,
}

/// What to plot on the y axis.
#[derive(Debug, Clone, Copy)]
enum Metric {
    TtftP50,
    Goodput,
}

/// Writes `<prefix><workload>-ttft-p50.png` and `<prefix><workload>-goodput.png`
/// for every workload in `runs`; returns the files written.
pub fn write_all(dir: &Path, prefix: &str, runs: &[RunSummary]) -> Result<Vec<PathBuf>, PlotError> {
    let mut workloads: Vec<&str> = runs.iter().map(|r| r.workload.as_str()).collect();
    workloads.dedup();
    let mut files = Vec::new();
    for w in workloads {
        let mine: Vec<&RunSummary> = runs.iter().filter(|r| r.workload == w).collect();
        for (metric, suffix) in [(Metric::TtftP50, "ttft-p50"), (Metric::Goodput, "goodput")] {
            let path = dir.join(format!("{prefix}{w}-{suffix}.png"));
            draw(&path, w, metric, &mine).map_err(|detail| PlotError {
                path: path.display().to_string(),
                detail,
            })?;
            files.push(path);
        }
    }
    Ok(files)
}

fn value(r: &RunSummary, m: Metric) -> f64 {
    match m {
        Metric::TtftP50 => r.ttft_p50_s.max(1e-3),
        Metric::Goodput => r.goodput_rpm,
    }
}

fn draw(path: &Path, workload: &str, metric: Metric, runs: &[&RunSummary]) -> Result<(), String> {
    let mut policies: Vec<&str> = Vec::new();
    for r in runs {
        if !policies.contains(&r.policy.as_str()) {
            policies.push(&r.policy);
        }
    }
    let x_max = runs.iter().map(|r| r.rate_per_min).fold(1.0, f64::max) * 1.05;
    let y_max = runs.iter().map(|r| value(r, metric)).fold(1e-3, f64::max);
    let root = BitMapBackend::new(path, SIZE).into_drawing_area();
    root.fill(&WHITE).map_err(|e| e.to_string())?;
    let series = |r: &RunSummary| (r.rate_per_min, value(r, metric));
    match metric {
        Metric::TtftP50 => {
            let y_min = runs
                .iter()
                .map(|r| value(r, metric))
                .fold(f64::INFINITY, f64::min)
                .max(1e-3);
            let mut chart = ChartBuilder::on(&root)
                .caption(
                    format!("{workload}: TTFT p50 (s, log) vs rate"),
                    ("sans-serif", 24),
                )
                .margin(15)
                .x_label_area_size(45)
                .y_label_area_size(70)
                .build_cartesian_2d(0.0..x_max, (y_min * 0.8..y_max * 1.25).log_scale())
                .map_err(|e| e.to_string())?;
            chart
                .configure_mesh()
                .x_desc("requests/min")
                .y_desc("TTFT p50 (s)")
                .draw()
                .map_err(|e| e.to_string())?;
            policy_lines(&mut chart, &policies, runs, series)?;
        }
        Metric::Goodput => {
            let mut chart = ChartBuilder::on(&root)
                .caption(
                    format!("{workload}: goodput (req/min, p90 TTFT <= 8 s) vs rate"),
                    ("sans-serif", 24),
                )
                .margin(15)
                .x_label_area_size(45)
                .y_label_area_size(70)
                .build_cartesian_2d(0.0..x_max, 0.0..y_max * 1.1 + 1.0)
                .map_err(|e| e.to_string())?;
            chart
                .configure_mesh()
                .x_desc("requests/min")
                .y_desc("goodput (req/min)")
                .draw()
                .map_err(|e| e.to_string())?;
            policy_lines(&mut chart, &policies, runs, series)?;
        }
    }
    root.present().map_err(|e| e.to_string())
}

/// One line (with its points and legend entry) per policy, on any y axis.
fn policy_lines<'a, DB: DrawingBackend + 'a, Y: Ranged<ValueType = f64>>(
    chart: &mut ChartContext<'a, DB, Cartesian2d<RangedCoordf64, Y>>,
    policies: &[&str],
    runs: &[&RunSummary],
    series: impl Fn(&RunSummary) -> (f64, f64),
) -> Result<(), String> {
    for (i, p) in policies.iter().enumerate() {
        let c = COLORS[i % COLORS.len()];
        let pts: Vec<(f64, f64)> = runs
            .iter()
            .filter(|r| r.policy == *p)
            .map(|r| series(r))
            .collect();
        chart
            .draw_series(LineSeries::new(pts.clone(), c.stroke_width(2)))
            .map_err(|e| e.to_string())?
            .label(*p)
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], c.stroke_width(2)));
        chart
            .draw_series(pts.into_iter().map(|pt| Circle::new(pt, 3, c.filled())))
            .map_err(|e| e.to_string())?;
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .position(SeriesLabelPosition::UpperLeft)
        .draw()
        .map_err(|e| e.to_string())
}
