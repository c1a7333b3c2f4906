//! The indexer's memory, once a second: its RSS (`/proc/PID/status`: all of
//! it, and the anonymous part, i.e. the heap without the mapped binary),
//! its thread count, and what it says it holds (`/metrics`: the
//! tokenizers' segment and word caches, the request ledger). The RSS check
//! judges `rss_kb`; the rest says what the growth is.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const METRICS: &str = "http://127.0.0.1:9091/metrics";
/// A stopped indexer does not answer: do not hold the sampler up.
const METRICS_TIMEOUT: Duration = Duration::from_millis(300);

/// One sample of the running indexer.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Sample {
    /// Seconds from the start.
    pub t: f64,
    /// The indexer's incarnation (1 for the first start).
    pub life: u32,
    pub rss_kb: u64,
    pub anon_kb: u64,
    pub threads: u64,
    /// From `/metrics`; `None` when it did not answer in time.
    pub sizes: Option<Sizes>,
}

/// What the indexer's `/metrics` says it holds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Sizes {
    pub segment_tokens: u64,
    pub segment_entries: u64,
    pub word_tokens: u64,
    pub ledger_entries: u64,
    pub ledger_tombstones: u64,
}

/// Samples the running indexer once a second until `stop`.
pub async fn sample(
    pid: Arc<Mutex<Option<(u32, u32)>>>,
    t0: Instant,
    stop: Arc<AtomicBool>,
) -> Vec<Sample> {
    let http = reqwest::Client::builder()
        .timeout(METRICS_TIMEOUT)
        .build()
        .expect("a reqwest client");
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut out = Vec::new();
    while !stop.load(Ordering::Relaxed) {
        tick.tick().await;
        let current = *pid.lock().unwrap_or_else(|e| e.into_inner());
        let Some((pid, life)) = current else {
            continue;
        };
        let t = t0.elapsed().as_secs_f64();
        let Some(status) = std::fs::read_to_string(format!("/proc/{pid}/status")).ok() else {
            continue;
        };
        let Some(rss_kb) = status_field(&status, "VmRSS") else {
            continue;
        };
        let sizes = match async { http.get(METRICS).send().await?.text().await }.await {
            Ok(text) => Some(sizes(&text)),
            Err(_) => None,
        };
        out.push(Sample {
            t,
            life,
            rss_kb,
            anon_kb: status_field(&status, "RssAnon").unwrap_or(0),
            threads: status_field(&status, "Threads").unwrap_or(0),
            sizes,
        });
    }
    out
}

/// A numeric field of `/proc/PID/status` (`VmRSS:   123 kB` → 123).
pub fn status_field(status: &str, name: &str) -> Option<u64> {
    status
        .lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// The sizes in an OpenMetrics text (absent ones are 0).
pub fn sizes(text: &str) -> Sizes {
    let value = |name: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(' '))
            .and_then(|v| v.trim().parse::<f64>().ok())
            .map_or(0, |v| v as u64)
    };
    Sizes {
        segment_tokens: value("kvsteer_tokenize_cache_tokens"),
        segment_entries: value("kvsteer_tokenize_cache_entries"),
        word_tokens: value("kvsteer_tokenize_word_cache_tokens"),
        ledger_entries: value("kvsteer_ledger_entries"),
        ledger_tombstones: value("kvsteer_ledger_tombstones"),
    }
}

/// The samples as CSV, one line a second.
pub fn csv(samples: &[Sample]) -> String {
    let mut s = String::from(
        "t_s,life,rss_kb,anon_kb,threads,segment_tokens,segment_entries,word_tokens,ledger_entries,ledger_tombstones\n",
    );
    for x in samples {
        let z = x.sizes.unwrap_or_default();
        let _ = writeln!(
            s,
            "{:.1},{},{},{},{},{},{},{},{},{}",
            x.t,
            x.life,
            x.rss_kb,
            x.anon_kb,
            x.threads,
            x.sizes
                .map_or(String::new(), |_| z.segment_tokens.to_string()),
            x.sizes
                .map_or(String::new(), |_| z.segment_entries.to_string()),
            x.sizes.map_or(String::new(), |_| z.word_tokens.to_string()),
            x.sizes
                .map_or(String::new(), |_| z.ledger_entries.to_string()),
            x.sizes
                .map_or(String::new(), |_| z.ledger_tombstones.to_string()),
        );
    }
    s
}

/// A markdown table of the samples every `step` seconds (and at each
/// restart): RSS, its anonymous part, threads, the caches and the ledger.
pub fn table(samples: &[Sample], step: f64) -> String {
    let mut s = String::from(
        "| t (s) | life | RSS (MB) | anon (MB) | threads | segment cache (k tokens) | word cache (k tokens) | ledger |\n|---|---|---|---|---|---|---|---|\n",
    );
    let mut next = 0.0;
    let mut life = 0;
    let last = samples.len().saturating_sub(1);
    for (i, x) in samples.iter().enumerate() {
        if x.t < next && x.life == life && i != last {
            continue;
        }
        next = x.t + step;
        life = x.life;
        let (seg, word, ledger) =
            x.sizes
                .map_or(("?".to_string(), "?".to_string(), "?".to_string()), |z| {
                    (
                        (z.segment_tokens / 1000).to_string(),
                        (z.word_tokens / 1000).to_string(),
                        z.ledger_entries.to_string(),
                    )
                });
        let _ = writeln!(
            s,
            "| {:.0} | {} | {:.1} | {:.1} | {} | {seg} | {word} | {ledger} |",
            x.t,
            x.life,
            x.rss_kb as f64 / 1024.0,
            x.anon_kb as f64 / 1024.0,
            x.threads,
        );
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_fields_and_metrics_are_read() {
        let status =
            "Name:\tkvsteer-indexer\nVmRSS:\t  123456 kB\nRssAnon:\t   100000 kB\nThreads:\t9\n";
        assert_eq!(status_field(status, "VmRSS"), Some(123_456));
        assert_eq!(status_field(status, "RssAnon"), Some(100_000));
        assert_eq!(status_field(status, "Threads"), Some(9));
        assert_eq!(status_field(status, "VmSwap"), None);
        let text = "# HELP kvsteer_tokenize_cache_tokens x\n# TYPE kvsteer_tokenize_cache_tokens gauge\nkvsteer_tokenize_cache_tokens 4096\nkvsteer_tokenize_cache_entries 12\nkvsteer_tokenize_word_cache_tokens_other 5\nkvsteer_ledger_entries 3\n# EOF\n";
        assert_eq!(
            sizes(text),
            Sizes {
                segment_tokens: 4096,
                segment_entries: 12,
                word_tokens: 0,
                ledger_entries: 3,
                ledger_tombstones: 0,
            }
        );
    }

    #[test]
    fn the_table_steps_and_marks_every_life_and_the_end() {
        let at = |t: f64, life: u32| Sample {
            t,
            life,
            rss_kb: 102_400,
            ..Sample::default()
        };
        let samples: Vec<_> = (0..10)
            .map(|t| at(f64::from(t), 1))
            .chain((10..25).map(|t| at(f64::from(t), 2)))
            .collect();
        let t = table(&samples, 10.0);
        let rows: Vec<&str> = t.lines().skip(2).collect();
        // 0 s, the restart at 10 s, 20 s, and the last sample.
        assert_eq!(rows.len(), 4, "{t}");
        assert!(rows[1].starts_with("| 10 | 2 | 100.0 |"), "{t}");
        assert!(rows[3].starts_with("| 24 |"), "{t}");
        assert_eq!(csv(&samples).lines().count(), 26);
    }
}
