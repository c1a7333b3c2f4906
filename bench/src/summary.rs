//! From request records to the figures of one run (the JSON contract).

use std::collections::HashMap;

use serde::Serialize;

use super::driver::{RequestRecord, RunOutput};
use super::workload::Tenant;

/// The seed benchmark's objective: 90 % of first tokens within 8 s.
pub const SEED_TTFT_P90_S: f64 = 8.0;
/// A chat objective: 90 % of first tokens within 1 s.
pub const CHAT_TTFT_P90_S: f64 = 1.0;

/// One entry of `runs` in the JSON output. The first fields are the
/// contract; the rest are extra.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RunSummary {
    pub workload: String,
    pub policy: String,
    pub rate_per_min: f64,
    pub requests: u64,
    pub ttft_p50_s: f64,
    pub ttft_p90_s: f64,
    pub ttft_p99_s: f64,
    pub e2e_p50_s: f64,
    pub throughput_rps: f64,
    /// Throughput (requests/min) when p90 TTFT ≤ 8 s, else 0.
    pub goodput_rpm: f64,
    /// Throughput (requests/min) when p90 TTFT ≤ 1 s, else 0.
    pub goodput_chat_rpm: f64,
    /// Cached prompt tokens / prompt tokens, over finished requests.
    pub cache_hit_rate: f64,
    /// Coefficient of variation of requests per worker.
    pub imbalance_cov: f64,
    // --- extra ---
    pub completed: u64,
    pub rejected: u64,
    pub ttft_mean_s: f64,
    pub ttft_max_s: f64,
    pub e2e_p90_s: f64,
    /// Share of finished requests with TTFT ≤ 8 s / ≤ 1 s.
    pub slo_attainment: f64,
    pub slo_attainment_chat: f64,
    /// Requests/min that met 8 s (per request, whatever the p90).
    pub good_requests_rpm: f64,
    /// Requests/min finished while requests were still arriving (first to
    /// last arrival): the rate the cluster kept up. `throughput_rps` runs
    /// to the last finish, so past capacity it reads as the drain of the
    /// slowest worker's queue.
    pub served_in_window_rpm: f64,
    /// Median |predicted − observed| TTFT of the chosen worker (s); absent
    /// where nothing was predicted (live runs).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prediction_error_p50_s: Option<f64>,
    pub requests_per_worker: Vec<u64>,
    /// kvsteer's calibrated prefill rate per worker at the end (tokens/s).
    pub calibrated_prefill_rates: Vec<f64>,
    pub preemptions: u64,
    pub kv_event_batches: u64,
    pub kv_event_errors: u64,
    pub engine_steps: u64,
    pub simulated_s: f64,
    /// The same figures per sender, when a run has more than one (`mixed`):
    /// where a policy wins or loses cache hits.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub by_tenant: Vec<TenantSummary>,
    /// Where the shared-prefix groups went, in runs that have them.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub groups: Option<GroupSummary>,
    /// Which of the repeated live runs of this target and rate (from 0);
    /// absent when each ran once.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub repeat: Option<u32>,
}

/// Where a policy placed the shared-prefix groups. A group's first request
/// picks a worker; a later one sent to a worker the group had not been
/// sent to yet is a **spread**: that worker prefills another copy of the
/// group's prefix, and each copy is used (and kept warm) less often: the
/// price, in cache hits, of spreading a group for its queue.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct GroupSummary {
    pub groups: u64,
    /// Requests of a group that were placed (not rejected).
    pub requests: u64,
    pub spread: u64,
    /// Workers each group was sent to, on average.
    pub workers_per_group: f64,
}

/// One sender's requests in a run with several.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TenantSummary {
    pub tenant: &'static str,
    pub requests: u64,
    pub ttft_p50_s: f64,
    pub ttft_p90_s: f64,
    /// Cached prompt tokens / prompt tokens, over its finished requests.
    pub cache_hit_rate: f64,
}

/// Nearest-rank percentile of sorted values (0 when empty).
pub fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = (p / 100.0 * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

fn sorted(mut v: Vec<f64>) -> Vec<f64> {
    v.sort_by(f64::total_cmp);
    v
}

/// The TTFTs of `done` (finished requests), sorted.
fn ttfts<'a>(done: impl Iterator<Item = &'a RequestRecord>) -> Vec<f64> {
    sorted(
        done.filter_map(|r| Some(r.first_token_at? - r.arrival))
            .collect(),
    )
}

/// Cached prompt tokens / prompt tokens over `done` (0 without prompts).
fn hit_rate<'a>(done: impl Iterator<Item = &'a RequestRecord>) -> f64 {
    let (prompt, cached) = done.fold((0u64, 0u64), |(p, c), r| {
        (
            p + u64::from(r.prompt_tokens),
            c + u64::from(r.cached_tokens),
        )
    });
    if prompt > 0 {
        cached as f64 / prompt as f64
    } else {
        0.0
    }
}

/// Rounds to 6 significant decimals so the JSON is stable and readable.
fn r6(x: f64) -> f64 {
    if x.is_finite() {
        (x * 1e6).round() / 1e6
    } else {
        0.0
    }
}

pub fn summarize(
    workload: &str,
    policy: &str,
    rate_per_min: f64,
    workers: usize,
    out: &RunOutput,
) -> RunSummary {
    let recs: Vec<&RequestRecord> = out.records.iter().collect();
    let done: Vec<&RequestRecord> = recs
        .iter()
        .copied()
        .filter(|r| r.finished_at.is_some())
        .collect();
    let ttft = ttfts(done.iter().copied());
    let e2e = sorted(
        done.iter()
            .filter_map(|r| Some(r.finished_at? - r.arrival))
            .collect(),
    );
    let first = recs.iter().map(|r| r.arrival).fold(f64::INFINITY, f64::min);
    let last = done
        .iter()
        .filter_map(|r| r.finished_at)
        .fold(0.0, f64::max);
    let span = if first.is_finite() {
        (last - first.min(0.0)).max(1e-9)
    } else {
        1.0
    };
    let throughput = done.len() as f64 / span;
    let last_arrival = recs
        .iter()
        .map(|r| r.arrival)
        .fold(f64::NEG_INFINITY, f64::max);
    let served_in_window = if last_arrival > first {
        let n = done
            .iter()
            .filter(|r| r.finished_at.is_some_and(|f| f <= last_arrival))
            .count();
        n as f64 / (last_arrival - first) * 60.0
    } else {
        0.0
    };
    let p90 = percentile(&ttft, 90.0);
    let mut per_worker = vec![0u64; workers];
    for r in recs.iter().filter(|r| !r.rejected) {
        if let Some(c) = per_worker.get_mut(r.worker) {
            *c += 1;
        }
    }
    let mean = per_worker.iter().sum::<u64>() as f64 / workers.max(1) as f64;
    let var = per_worker
        .iter()
        .map(|&c| (c as f64 - mean).powi(2))
        .sum::<f64>()
        / workers.max(1) as f64;
    let within = |limit: f64| ttft.iter().filter(|&&t| t <= limit).count();
    let share = |n: usize| {
        if ttft.is_empty() {
            0.0
        } else {
            n as f64 / ttft.len() as f64
        }
    };
    let errors = sorted(
        done.iter()
            .filter_map(|r| Some((r.first_token_at? - r.arrival - r.predicted_ttft_s?).abs()))
            .collect(),
    );
    RunSummary {
        workload: workload.to_owned(),
        policy: policy.to_owned(),
        rate_per_min,
        requests: recs.len() as u64,
        ttft_p50_s: r6(percentile(&ttft, 50.0)),
        ttft_p90_s: r6(p90),
        ttft_p99_s: r6(percentile(&ttft, 99.0)),
        e2e_p50_s: r6(percentile(&e2e, 50.0)),
        throughput_rps: r6(throughput),
        goodput_rpm: r6(if !ttft.is_empty() && p90 <= SEED_TTFT_P90_S {
            throughput * 60.0
        } else {
            0.0
        }),
        goodput_chat_rpm: r6(if !ttft.is_empty() && p90 <= CHAT_TTFT_P90_S {
            throughput * 60.0
        } else {
            0.0
        }),
        cache_hit_rate: r6(hit_rate(done.iter().copied())),
        imbalance_cov: r6(if mean > 0.0 { var.sqrt() / mean } else { 0.0 }),
        completed: done.len() as u64,
        rejected: recs.iter().filter(|r| r.rejected).count() as u64,
        ttft_mean_s: r6(ttft.iter().sum::<f64>() / ttft.len().max(1) as f64),
        ttft_max_s: r6(ttft.last().copied().unwrap_or(0.0)),
        e2e_p90_s: r6(percentile(&e2e, 90.0)),
        slo_attainment: r6(share(within(SEED_TTFT_P90_S))),
        slo_attainment_chat: r6(share(within(CHAT_TTFT_P90_S))),
        good_requests_rpm: r6(within(SEED_TTFT_P90_S) as f64 / span * 60.0),
        served_in_window_rpm: r6(served_in_window),
        prediction_error_p50_s: (!errors.is_empty()).then(|| r6(percentile(&errors, 50.0))),
        requests_per_worker: per_worker,
        calibrated_prefill_rates: out.prefill_rates.iter().map(|&r| r6(r).round()).collect(),
        preemptions: out.preemptions,
        kv_event_batches: out.event_batches,
        kv_event_errors: out.event_errors,
        engine_steps: out.steps,
        simulated_s: r6(out.end_s),
        by_tenant: by_tenant(&recs),
        groups: groups(&recs),
        repeat: None,
    }
}

/// Placements of the shared-prefix groups; `None` without any.
fn groups(recs: &[&RequestRecord]) -> Option<GroupSummary> {
    let mut workers: HashMap<u32, Vec<usize>> = HashMap::new();
    let mut requests = 0;
    for r in recs.iter().filter(|r| !r.rejected) {
        let Some(group) = r.group else { continue };
        requests += 1;
        let on = workers.entry(group).or_default();
        if !on.contains(&r.worker) {
            on.push(r.worker);
        }
    }
    if workers.is_empty() {
        return None;
    }
    let copies: usize = workers.values().map(Vec::len).sum();
    Some(GroupSummary {
        groups: workers.len() as u64,
        requests,
        // Every copy beyond a group's first.
        spread: (copies - workers.len()) as u64,
        workers_per_group: r6(copies as f64 / workers.len() as f64),
    })
}

/// Per-sender figures, empty when every request has the same sender.
fn by_tenant(recs: &[&RequestRecord]) -> Vec<TenantSummary> {
    let mut tenants: Vec<Tenant> = recs.iter().map(|r| r.tenant).collect();
    tenants.sort();
    tenants.dedup();
    if tenants.len() < 2 {
        return Vec::new();
    }
    tenants
        .into_iter()
        .map(|tenant| {
            let mine: Vec<&RequestRecord> = recs
                .iter()
                .copied()
                .filter(|r| r.tenant == tenant)
                .collect();
            let done = || mine.iter().copied().filter(|r| r.finished_at.is_some());
            let ttft = ttfts(done());
            TenantSummary {
                tenant: tenant.as_str(),
                requests: mine.len() as u64,
                ttft_p50_s: r6(percentile(&ttft, 50.0)),
                ttft_p90_s: r6(percentile(&ttft, 90.0)),
                cache_hit_rate: r6(hit_rate(done())),
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(worker: usize, arrival: f64, ttft: f64, e2e: f64) -> RequestRecord {
        RequestRecord {
            tenant: Tenant::Chat,
            group: None,
            arrival,
            worker,
            prompt_tokens: 100,
            matched_tokens: 0,
            predicted_ttft_s: Some(ttft),
            cached_tokens: 50,
            first_token_at: Some(arrival + ttft),
            finished_at: Some(arrival + e2e),
            rejected: false,
        }
    }

    #[test]
    fn percentiles_are_nearest_rank() {
        let v: Vec<f64> = (1..=10).map(f64::from).collect();
        assert_eq!(percentile(&v, 50.0), 5.0);
        assert_eq!(percentile(&v, 90.0), 9.0);
        assert_eq!(percentile(&v, 99.0), 10.0);
        assert_eq!(percentile(&[], 50.0), 0.0);
    }

    #[test]
    fn goodput_needs_the_objective() {
        let mut out = output(
            (0..10)
                .map(|i| rec(i % 2, f64::from(i as u32), 0.5, 2.0))
                .collect(),
        );
        let s = summarize("w", "p", 60.0, 2, &out);
        assert_eq!(s.requests, 10);
        assert_eq!(s.cache_hit_rate, 0.5);
        assert_eq!(s.imbalance_cov, 0.0);
        assert!((s.throughput_rps - 10.0 / 11.0).abs() < 1e-6);
        assert_eq!(s.goodput_rpm, s.goodput_chat_rpm);
        assert!(s.goodput_rpm > 0.0);
        for r in &mut out.records {
            r.first_token_at = Some(r.arrival + 2.0);
            r.worker = 0;
        }
        let s = summarize("w", "p", 60.0, 2, &out);
        assert_eq!(s.goodput_chat_rpm, 0.0);
        assert!(s.goodput_rpm > 0.0);
        assert_eq!(s.imbalance_cov, 1.0);
    }

    fn output(records: Vec<RequestRecord>) -> RunOutput {
        let end_s = records
            .iter()
            .filter_map(|r| r.finished_at)
            .fold(0.0, f64::max);
        RunOutput::of_records(records, Vec::new(), end_s)
    }

    /// Arrivals at 0..9 s: what finishes after the last arrival counts in
    /// the throughput to the last finish, not in the rate kept up.
    #[test]
    fn the_served_rate_stops_at_the_last_arrival() {
        let out = output((0..10).map(|i| rec(0, f64::from(i), 0.5, 2.0)).collect());
        let s = summarize("w", "p", 60.0, 1, &out);
        // Finished by 9 s: the arrivals at 0..=7 s, 8 requests in 9 s.
        assert!((s.served_in_window_rpm - 8.0 / 9.0 * 60.0).abs() < 1e-4);
        assert!((s.throughput_rps - 10.0 / 11.0).abs() < 1e-6);

        // One worker's queue drains long after the arrivals end: the
        // throughput to the last finish falls to a quarter, the rate kept
        // up does not move (those two finished after the last arrival
        // either way).
        let mut late = out.records.clone();
        for r in late.iter_mut().skip(8) {
            r.worker = 1;
            r.finished_at = Some(40.0);
        }
        let s = summarize("w", "p", 60.0, 2, &output(late));
        assert!((s.served_in_window_rpm - 8.0 / 9.0 * 60.0).abs() < 1e-4);
        assert!((s.throughput_rps - 10.0 / 40.0).abs() < 1e-6);

        let mut queued = out.records.clone();
        for r in queued.iter_mut().skip(4) {
            r.finished_at = Some(40.0);
        }
        let s = summarize("w", "p", 60.0, 1, &output(queued));
        assert!((s.served_in_window_rpm - 4.0 / 9.0 * 60.0).abs() < 1e-4);
    }

    #[test]
    fn senders_are_summarized_apart_only_when_mixed() {
        let mut records: Vec<RequestRecord> =
            (0..4).map(|i| rec(0, f64::from(i), 0.5, 2.0)).collect();
        assert!(
            summarize("w", "p", 60.0, 1, &output(records.clone()))
                .by_tenant
                .is_empty()
        );
        for r in records.iter_mut().skip(2) {
            r.tenant = Tenant::Rag;
            r.cached_tokens = 0;
            r.first_token_at = Some(r.arrival + 3.0);
        }
        let s = summarize("w", "p", 60.0, 1, &output(records));
        let names: Vec<&str> = s.by_tenant.iter().map(|t| t.tenant).collect();
        assert_eq!(names, ["chat", "rag"]);
        let (chat, rag) = (&s.by_tenant[0], &s.by_tenant[1]);
        assert_eq!((chat.requests, rag.requests), (2, 2));
        assert_eq!((chat.cache_hit_rate, rag.cache_hit_rate), (0.5, 0.0));
        assert_eq!((chat.ttft_p90_s, rag.ttft_p90_s), (0.5, 3.0));
        assert_eq!(s.cache_hit_rate, 0.25);
    }

    #[test]
    fn one_arrival_has_no_window() {
        let s = summarize("w", "p", 60.0, 1, &output(vec![rec(0, 0.0, 0.5, 2.0)]));
        assert_eq!(s.served_in_window_rpm, 0.0);
    }

    #[test]
    fn a_group_sent_to_a_new_worker_is_a_spread() {
        let mut records: Vec<RequestRecord> =
            (0..6).map(|i| rec(0, f64::from(i), 0.5, 2.0)).collect();
        assert_eq!(
            summarize("w", "p", 60.0, 2, &output(records.clone())).groups,
            None
        );
        // Group 7 on workers 0, 0, 1, 0 (one spread); group 8 on 1, 1; a
        // rejected request of group 8 on worker 0 is not a placement.
        let placements = [(7, 0), (8, 1), (7, 0), (7, 1), (8, 1), (7, 0)];
        for (r, (group, worker)) in records.iter_mut().zip(placements) {
            r.group = Some(group);
            r.worker = worker;
        }
        let mut rejected = rec(0, 6.0, 0.5, 2.0);
        rejected.group = Some(8);
        rejected.rejected = true;
        records.push(rejected);
        let g = summarize("w", "p", 60.0, 2, &output(records))
            .groups
            .expect("groups");
        assert_eq!((g.groups, g.requests, g.spread), (2, 6, 1));
        assert_eq!(g.workers_per_group, 1.5);
    }
}
