//! What the soak checks at the end, and the results table.
//!
//! - failures: every request either completed, or failed because it was in
//!   flight on a worker that was killed (counted apart; the worker's own
//!   running + waiting count at the kill is printed beside it);
//! - phantom load: the indexer's in-flight load back to 0 within 5 s of the
//!   last response;
//! - indexer RSS flat: within 10 % of its value at the end of warm-up, over
//!   the indexer's last life;
//! - stale blocks: blocks a killed worker had cached gone from the indexer
//!   within 5 s of its restart, and still gone at the end.

use std::fmt::Write as _;

use crate::faults::{Event, Fault};
use crate::traffic::Outcome;

/// The in-flight load must be gone this long after the last response, and
/// stale blocks this long after a restart (issue 18's targets).
pub const SETTLE_S: f64 = 5.0;
/// RSS may grow this much over its warmed-up value.
pub const RSS_GROWTH: f64 = 0.10;

#[derive(Debug, Clone)]
pub struct Check {
    pub name: &'static str,
    pub pass: bool,
    pub detail: String,
}

/// How the failed requests split.
#[derive(Debug, Default)]
pub struct Failures {
    /// In flight on a worker when it was killed.
    pub worker_kill: usize,
    /// Everything else.
    pub other: Vec<Outcome>,
}

/// Splits failed requests: a failure is the kill's when the request was in
/// flight across the kill and either came from the killed worker (a stream
/// cut short) or got Envoy's reply for an upstream connection closed after
/// the request was sent (`connection termination`). A connect failure is not
/// the kill's: Envoy retries those on another worker.
pub fn classify(outcomes: &[Outcome], events: &[Event]) -> Failures {
    let mut f = Failures::default();
    for o in outcomes.iter().filter(|o| o.error.is_some()) {
        let killed = events.iter().any(|e| {
            let Fault::KillWorker(i) = e.fault else {
                return false;
            };
            let from_worker = match &o.worker {
                Some(w) => *w == format!("w{}", i + 1),
                None => {
                    o.status == 503
                        && o.error
                            .as_deref()
                            .is_some_and(|m| m.contains("connection termination"))
                }
            };
            o.start <= e.at && o.end >= e.sampled && from_worker
        });
        if killed {
            f.worker_kill += 1;
        } else {
            f.other.push(o.clone());
        }
    }
    f
}

/// `samples`: (seconds, incarnation, VmRSS kB) of the indexer. Judged over
/// the last incarnation: the first sample `warmup` seconds into it, and not
/// before `filled` (seconds from the start: when its bounded caches were
/// full, see `warmup`), is the baseline; no later sample may exceed it by
/// more than [`RSS_GROWTH`].
pub fn rss_check(samples: &[(f64, u32, u64)], warmup: f64, filled: Option<f64>) -> Check {
    let name = "indexer RSS flat after warm-up (<= +10 %)";
    let Some(&(_, last, _)) = samples.last() else {
        return Check {
            name,
            pass: false,
            detail: "no RSS samples".into(),
        };
    };
    let life: Vec<_> = samples.iter().filter(|s| s.1 == last).collect();
    let born = life[0].0;
    let ready = (born + warmup).max(filled.unwrap_or(0.0));
    let Some(base_at) = life.iter().position(|s| s.0 >= ready) else {
        return Check {
            name,
            pass: false,
            detail: format!(
                "the indexer's last life ended before its warm-up ({warmup:.0} s, caches filled at {:.0} s)",
                filled.unwrap_or(0.0)
            ),
        };
    };
    let base = life[base_at].2;
    let after = &life[base_at..];
    let (peak_t, peak) = after
        .iter()
        .map(|s| (s.0, s.2))
        .max_by_key(|s| s.1)
        .unwrap_or((life[base_at].0, base));
    let end = after.last().map_or(base, |s| s.2);
    let growth = peak as f64 / base.max(1) as f64 - 1.0;
    Check {
        name,
        pass: growth <= RSS_GROWTH && after.len() >= 3,
        detail: format!(
            "{} samples over {:.0} s: {} MB at warm-up end ({:.0} s), peak {} MB at {:.0} s ({:+.1} %), {} MB at the end",
            after.len(),
            after.last().map_or(0.0, |s| s.0) - life[base_at].0,
            base / 1024,
            life[base_at].0,
            peak / 1024,
            peak_t,
            growth * 100.0,
            end / 1024
        ),
    }
}

/// The indexer's RSS every `step` seconds: "t s: MB" (incarnations apart).
pub fn rss_series(samples: &[(f64, u32, u64)], step: f64) -> String {
    let mut out = Vec::new();
    let mut next = 0.0;
    let mut life = 0;
    for &(t, l, kb) in samples {
        if t >= next || l != life {
            let mark = if l != life && life != 0 {
                " (restarted)"
            } else {
                ""
            };
            out.push(format!("{t:.0} s: {} MB{mark}", kb / 1024));
            next = t + step;
            life = l;
        }
    }
    out.join(", ")
}

/// A markdown table of the checks.
pub fn table(checks: &[Check]) -> String {
    let mut s = String::from("| check | result | detail |\n|---|---|---|\n");
    for c in checks {
        let _ = writeln!(
            s,
            "| {} | {} | {} |",
            c.name,
            if c.pass { "PASS" } else { "FAIL" },
            c.detail.replace('|', "/")
        );
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn outcome(
        start: f64,
        end: f64,
        worker: Option<&str>,
        status: u16,
        error: Option<&str>,
    ) -> Outcome {
        Outcome {
            session: 0,
            api: "chat",
            stream: worker.is_some(),
            start,
            end,
            status,
            worker: worker.map(str::to_string),
            error: error.map(str::to_string),
        }
    }

    #[test]
    fn only_requests_in_flight_on_the_killed_worker_are_the_kills() {
        let events = vec![Event {
            sampled: 9.9,
            at: 10.0,
            back: 12.0,
            fault: Fault::KillWorker(1),
            in_flight: Some(2),
        }];
        let reset = "HTTP 503: upstream connect error or disconnect/reset before headers. reset reason: connection termination";
        let refused = "HTTP 503: upstream connect error or disconnect/reset before headers. reset reason: remote connection failure";
        let outcomes = vec![
            // A stream of w2 cut short, and a whole response reset.
            outcome(9.0, 10.5, Some("w2"), 200, Some("stream truncated")),
            outcome(9.5, 9.95, None, 503, Some(reset)),
            // Another worker's stream, a connect failure (should have
            // been retried), a reset outside the kill, a success.
            outcome(9.0, 10.5, Some("w1"), 200, Some("stream truncated")),
            outcome(10.1, 10.2, None, 503, Some(refused)),
            outcome(11.0, 11.5, None, 503, Some(reset)),
            outcome(1.0, 2.0, Some("w2"), 200, None),
        ];
        let f = classify(&outcomes, &events);
        assert_eq!(f.worker_kill, 2);
        assert_eq!(f.other.len(), 3);
    }

    #[test]
    fn rss_judged_over_the_last_life_after_warm_up() {
        let mut samples: Vec<(f64, u32, u64)> = (0..10).map(|t| (t as f64, 1, 900_000)).collect();
        samples.extend((10..40).map(|t| (t as f64, 2, 100_000 + if t < 15 { 0 } else { 5_000 })));
        assert!(
            rss_check(&samples, 5.0, None).pass,
            "{:?}",
            rss_check(&samples, 5.0, None)
        );
        // Caches filling until 20 s: judged from then, not from 12 s.
        let filling: Vec<(f64, u32, u64)> = (10..40)
            .map(|t| (t as f64, 2, 100_000 + 5_000 * t.min(20) as u64))
            .collect();
        assert!(!rss_check(&filling, 2.0, None).pass);
        let filled = rss_check(&filling, 2.0, Some(20.0));
        assert!(
            filled.pass && filled.detail.contains("(20 s)"),
            "{filled:?}"
        );
        samples.push((40.0, 2, 200_000));
        assert!(!rss_check(&samples, 5.0, None).pass);
        assert!(!rss_check(&samples[..12], 5.0, None).pass);
        assert!(
            !rss_check(&samples[..20], 5.0, Some(30.0)).pass,
            "never filled"
        );
    }
}
