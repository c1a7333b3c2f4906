//! Text table and JSON file of the results.

use std::io::Write;
use std::path::Path;

use anyhow::Context;
use serde::Serialize;

use super::summary::RunSummary;

#[derive(Serialize)]
struct Output<'a> {
    config: serde_json::Value,
    runs: &'a [RunSummary],
}

/// Writes `{"config": …, "runs": […]}`.
pub fn write_json(
    path: &Path,
    config: serde_json::Value,
    runs: &[RunSummary],
) -> anyhow::Result<()> {
    let text = serde_json::to_string_pretty(&Output { config, runs })?;
    std::fs::write(path, text + "\n").with_context(|| format!("writing {}", path.display()))
}

/// Writes one run's requests as JSON lines to
/// `dir/<workload>-<policy>-<rate>rpm[-run<k>].jsonl` (`k` from 1) and
/// returns the path. Times are seconds from the start of the run; `worker`
/// is the worker's index (live: in the order the responses first named it).
pub fn write_records(
    dir: &Path,
    s: &RunSummary,
    records: &[crate::driver::RequestRecord],
) -> anyhow::Result<std::path::PathBuf> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let run = s.repeat.map_or(String::new(), |k| format!("-run{}", k + 1));
    let path = dir.join(format!(
        "{}-{}-{}rpm{run}.jsonl",
        s.workload, s.policy, s.rate_per_min
    ));
    let mut text = Vec::new();
    for r in records {
        let line = serde_json::json!({
            "tenant": r.tenant.as_str(),
            "group": r.group,
            "arrival_s": r.arrival,
            "worker": r.worker,
            "prompt_tokens": r.prompt_tokens,
            "cached_tokens": r.cached_tokens,
            "matched_tokens": r.matched_tokens,
            "predicted_ttft_s": r.predicted_ttft_s,
            "ttft_s": r.first_token_at.map(|t| t - r.arrival),
            "e2e_s": r.finished_at.map(|t| t - r.arrival),
            "rejected": r.rejected,
        });
        writeln!(text, "{line}")?;
    }
    std::fs::write(&path, text).with_context(|| format!("writing {}", path.display()))?;
    Ok(path)
}

/// One table per workload and rate, one row per policy.
pub fn table(runs: &[RunSummary]) -> String {
    let mut out = Vec::new();
    let mut last: Option<(&str, f64)> = None;
    for r in runs {
        if last != Some((r.workload.as_str(), r.rate_per_min)) {
            last = Some((r.workload.as_str(), r.rate_per_min));
            let _ = writeln!(out, "\n{} @ {} req/min", r.workload, r.rate_per_min);
            let _ = writeln!(
                out,
                "{:<14} {:>6} {:>8} {:>8} {:>8} {:>8} {:>7} {:>8} {:>8} {:>6} {:>6}",
                "policy",
                "reqs",
                "ttft50",
                "ttft90",
                "ttft99",
                "e2e50",
                "rps",
                "good8s",
                "good1s",
                "hit%",
                "cov"
            );
        }
        let _ = writeln!(
            out,
            "{:<14} {:>6} {:>8.3} {:>8.3} {:>8.3} {:>8.2} {:>7.3} {:>8.1} {:>8.1} {:>6.1} {:>6.3}",
            match r.repeat {
                Some(k) => format!("{} #{}", r.policy, k + 1),
                None => r.policy.clone(),
            },
            r.requests,
            r.ttft_p50_s,
            r.ttft_p90_s,
            r.ttft_p99_s,
            r.e2e_p50_s,
            r.throughput_rps,
            r.goodput_rpm,
            r.goodput_chat_rpm,
            100.0 * r.cache_hit_rate,
            r.imbalance_cov
        );
    }
    String::from_utf8(out).unwrap_or_default()
}

/// The comparisons the issue asks for, per workload, as text: where
/// `random` first misses the seed objective and kvsteer's TTFT p50 there,
/// max goodput, and kvsteer's worst gap to the best other policy.
/// With repeated runs (live `--repeats`) the comparison is between the
/// medians of each target's runs ([`medians`]).
pub fn comparisons(runs: &[RunSummary]) -> String {
    let repeated = runs.iter().any(|r| r.repeat.is_some());
    let runs = &medians(runs);
    let mut out = Vec::new();
    let mut workloads: Vec<&str> = runs.iter().map(|r| r.workload.as_str()).collect();
    workloads.dedup();
    for w in workloads {
        let mine: Vec<&RunSummary> = runs.iter().filter(|r| r.workload == w).collect();
        let of = |p: &str| -> Vec<&RunSummary> {
            mine.iter().copied().filter(|r| r.policy == p).collect()
        };
        let (random, kvsteer) = (of("random"), of("kvsteer"));
        if kvsteer.is_empty() {
            continue;
        }
        let of_runs = if repeated {
            " (medians of the runs)"
        } else {
            ""
        };
        let _ = writeln!(out, "\n{w}: kvsteer vs the others{of_runs}");
        if let Some(miss) = random
            .iter()
            .find(|r| r.ttft_p90_s > super::summary::SEED_TTFT_P90_S)
            && let Some(k) = kvsteer.iter().find(|k| k.rate_per_min == miss.rate_per_min)
        {
            let _ = writeln!(
                out,
                "  random first misses p90 TTFT <= 8 s at {} rpm: TTFT p50 random {:.3} s, kvsteer {:.3} s ({:.1}x)",
                miss.rate_per_min,
                miss.ttft_p50_s,
                k.ttft_p50_s,
                miss.ttft_p50_s / k.ttft_p50_s.max(1e-9)
            );
        }
        let max_good = |v: &[&RunSummary]| v.iter().map(|r| r.goodput_rpm).fold(0.0, f64::max);
        let mut policies: Vec<&str> = mine.iter().map(|r| r.policy.as_str()).collect();
        policies.sort_unstable();
        policies.dedup();
        for p in &policies {
            let _ = write!(out, "  max goodput {p}: {:.1} rpm;", max_good(&of(p)));
        }
        let _ = writeln!(out);
        for k in &kvsteer {
            let others: Vec<&&RunSummary> = mine
                .iter()
                .filter(|r| r.rate_per_min == k.rate_per_min && r.policy != "kvsteer")
                .collect();
            let best = |f: &dyn Fn(&RunSummary) -> f64, low: bool| {
                others
                    .iter()
                    .map(|r| f(r))
                    .fold(if low { f64::INFINITY } else { 0.0 }, |a, b| {
                        if low { a.min(b) } else { a.max(b) }
                    })
            };
            let (p50, p90, good, hits) = (
                best(&|r| r.ttft_p50_s, true),
                best(&|r| r.ttft_p90_s, true),
                best(&|r| r.goodput_rpm, false),
                best(&|r| r.cache_hit_rate, false),
            );
            let _ = writeln!(
                out,
                "  @ {:>5} rpm: TTFT p50 {:.3} vs best other {:.3} ({:+.0}%), p90 {:.3} vs {:.3} ({:+.0}%), goodput {:.1} vs {:.1}, hits {:.1}% vs {:.1}%",
                k.rate_per_min,
                k.ttft_p50_s,
                p50,
                100.0 * (k.ttft_p50_s / p50.max(1e-9) - 1.0),
                k.ttft_p90_s,
                p90,
                100.0 * (k.ttft_p90_s / p90.max(1e-9) - 1.0),
                k.goodput_rpm,
                good,
                100.0 * k.cache_hit_rate,
                100.0 * hits
            );
        }
    }
    String::from_utf8(out).unwrap_or_default()
}

/// One entry per workload, policy and rate, in the order first run: the
/// run itself where it ran once, else the first run with the rate figures
/// (TTFT, e2e, throughput, goodput, hit rate, balance) replaced by their
/// medians over the runs and no repeat index. Counts and placements stay
/// the first run's.
pub fn medians(runs: &[RunSummary]) -> Vec<RunSummary> {
    let mut keys: Vec<(&str, &str, f64)> = Vec::new();
    for r in runs {
        let key = (r.workload.as_str(), r.policy.as_str(), r.rate_per_min);
        if !keys.contains(&key) {
            keys.push(key);
        }
    }
    keys.into_iter()
        .map(|(w, p, rate)| {
            let same: Vec<&RunSummary> = runs
                .iter()
                .filter(|r| r.workload == w && r.policy == p && r.rate_per_min == rate)
                .collect();
            let mut m = same[0].clone();
            if same.len() > 1 {
                let med = |f: fn(&RunSummary) -> f64| median(same.iter().map(|r| f(r)));
                m.ttft_p50_s = med(|r| r.ttft_p50_s);
                m.ttft_p90_s = med(|r| r.ttft_p90_s);
                m.ttft_p99_s = med(|r| r.ttft_p99_s);
                m.ttft_mean_s = med(|r| r.ttft_mean_s);
                m.e2e_p50_s = med(|r| r.e2e_p50_s);
                m.e2e_p90_s = med(|r| r.e2e_p90_s);
                m.throughput_rps = med(|r| r.throughput_rps);
                m.goodput_rpm = med(|r| r.goodput_rpm);
                m.goodput_chat_rpm = med(|r| r.goodput_chat_rpm);
                m.served_in_window_rpm = med(|r| r.served_in_window_rpm);
                m.cache_hit_rate = med(|r| r.cache_hit_rate);
                m.imbalance_cov = med(|r| r.imbalance_cov);
                m.repeat = None;
            }
            m
        })
        .collect()
}

/// The median (the mean of the middle two for an even count); 0 for none.
fn median(values: impl Iterator<Item = f64>) -> f64 {
    let mut v: Vec<f64> = values.collect();
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => 0.0,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

/// With repeated runs: per workload, rate and policy, the median of TTFT
/// p50, p90 and the hit rate with their range over the runs, and how far
/// the range reaches from the median: the noise a single run carries.
/// Empty when each target ran once.
pub fn spread(runs: &[RunSummary]) -> String {
    if runs.iter().all(|r| r.repeat.is_none()) {
        return String::new();
    }
    let mut out = Vec::new();
    let mut last: Option<(String, f64)> = None;
    for m in medians(runs) {
        let same: Vec<&RunSummary> = runs
            .iter()
            .filter(|r| {
                r.workload == m.workload && r.policy == m.policy && r.rate_per_min == m.rate_per_min
            })
            .collect();
        let key = (m.workload.clone(), m.rate_per_min);
        if last.as_ref() != Some(&key) {
            let _ = writeln!(
                out,
                "\n{} @ {} req/min, {} runs each: median (min-max, widest from the median)",
                m.workload,
                m.rate_per_min,
                same.len()
            );
        }
        last = Some(key);
        let range = |f: fn(&RunSummary) -> f64, mid: f64| {
            let lo = same.iter().map(|r| f(r)).fold(f64::INFINITY, f64::min);
            let hi = same.iter().map(|r| f(r)).fold(f64::NEG_INFINITY, f64::max);
            let far = ((hi - mid).max(mid - lo)) / mid.abs().max(1e-9);
            format!("{mid:.3} ({lo:.3}-{hi:.3}, {:.0}%)", 100.0 * far)
        };
        let lo_hit = same.iter().map(|r| r.cache_hit_rate).fold(1.0, f64::min);
        let hi_hit = same.iter().map(|r| r.cache_hit_rate).fold(0.0, f64::max);
        let _ = writeln!(
            out,
            "{:<20} ttft50 {}  ttft90 {}  hit% {:.1} ({:.1}-{:.1})",
            m.policy,
            range(|r| r.ttft_p50_s, m.ttft_p50_s),
            range(|r| r.ttft_p90_s, m.ttft_p90_s),
            100.0 * m.cache_hit_rate,
            100.0 * lo_hit,
            100.0 * hi_hit
        );
    }
    String::from_utf8(out).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::driver::{RequestRecord, RunOutput};
    use crate::summary::summarize;
    use crate::workload::Tenant;

    /// A run of `policy` whose requests' TTFTs are `ttfts` (one worker).
    fn run(policy: &str, repeat: Option<u32>, ttfts: &[f64], cached: u32) -> RunSummary {
        let records = ttfts
            .iter()
            .enumerate()
            .map(|(i, &t)| RequestRecord {
                tenant: Tenant::Chat,
                group: None,
                arrival: i as f64,
                worker: 0,
                prompt_tokens: 100,
                matched_tokens: 0,
                predicted_ttft_s: None,
                cached_tokens: cached,
                first_token_at: Some(i as f64 + t),
                finished_at: Some(i as f64 + t + 1.0),
                rejected: false,
            })
            .collect();
        let out = RunOutput::of_records(records, Vec::new(), 0.0);
        let mut s = summarize("mixed", policy, 120.0, 1, &out);
        s.repeat = repeat;
        s
    }

    #[test]
    fn medians_take_the_middle_run_per_policy_and_rate() {
        let runs = vec![
            run("kvsteer", Some(0), &[1.0; 10], 10),
            run("peer", Some(0), &[2.0; 10], 50),
            run("kvsteer", Some(1), &[5.0; 10], 30),
            run("peer", Some(1), &[4.0; 10], 40),
            run("kvsteer", Some(2), &[3.0; 10], 20),
            run("peer", Some(2), &[3.0; 10], 60),
        ];
        let m = medians(&runs);
        assert_eq!(m.len(), 2);
        assert_eq!(
            (m[0].policy.as_str(), m[1].policy.as_str()),
            ("kvsteer", "peer")
        );
        assert_eq!((m[0].ttft_p90_s, m[1].ttft_p90_s), (3.0, 3.0));
        assert_eq!((m[0].cache_hit_rate, m[1].cache_hit_rate), (0.2, 0.5));
        assert!(m.iter().all(|r| r.repeat.is_none()));
        // The comparison reads the medians: level on p90, 30 points of hits behind.
        let text = comparisons(&runs);
        assert!(text.contains("(medians of the runs)"), "{text}");
        assert!(text.contains("p90 3.000 vs 3.000 (+0%)"), "{text}");
        assert!(text.contains("hits 20.0% vs 50.0%"), "{text}");
        // The spread shows each target's range and the widest distance from its median.
        let spread = spread(&runs);
        assert!(spread.contains("3 runs each"), "{spread}");
        assert!(
            spread.contains("ttft90 3.000 (1.000-5.000, 67%)"),
            "{spread}"
        );
        assert!(
            spread.contains("ttft90 3.000 (2.000-4.000, 33%)"),
            "{spread}"
        );
    }

    #[test]
    fn records_are_one_line_per_request() {
        let dir = std::env::temp_dir().join(format!("kvsteer-records-{}", std::process::id()));
        let mut s = run("kvsteer", Some(1), &[], 0);
        s.policy = "kvsteer".into();
        let records: Vec<RequestRecord> = (0..3)
            .map(|i| RequestRecord {
                tenant: Tenant::Rag,
                group: None,
                arrival: f64::from(i),
                worker: i as usize,
                prompt_tokens: 100,
                matched_tokens: 0,
                predicted_ttft_s: None,
                cached_tokens: 16 * i,
                first_token_at: (i < 2).then_some(f64::from(i) + 0.5),
                finished_at: None,
                rejected: i == 2,
            })
            .collect();
        let path = write_records(&dir, &s, &records).unwrap();
        assert_eq!(path, dir.join("mixed-kvsteer-120rpm-run2.jsonl"));
        let lines: Vec<serde_json::Value> = std::fs::read_to_string(&path)
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(lines.len(), 3);
        assert_eq!(lines[1]["tenant"], "rag");
        assert_eq!(lines[1]["worker"], 1);
        assert_eq!(lines[1]["cached_tokens"], 16);
        assert_eq!(lines[1]["ttft_s"], 0.5);
        assert!(lines[2]["ttft_s"].is_null());
        assert_eq!(lines[2]["rejected"], true);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn single_runs_pass_through() {
        let runs = vec![
            run("kvsteer", None, &[1.0; 4], 0),
            run("peer", None, &[2.0; 4], 0),
        ];
        assert_eq!(medians(&runs), runs);
        assert_eq!(spread(&runs), "");
        assert!(!comparisons(&runs).contains("medians"));
    }

    #[test]
    fn an_even_count_takes_the_mean_of_the_middle_two() {
        assert_eq!(median([4.0, 1.0, 3.0, 2.0].into_iter()), 2.5);
        assert_eq!(median(std::iter::empty()), 0.0);
    }
}
