//! Scrapes each worker's Prometheus `/metrics` for the engine's own queue
//! (vLLM gauges) and marks workers that stop answering as down.

use crate::scoring::ScrapedLoad;
use bytes::Bytes;
use http_body_util::{BodyExt, Empty, Limited};
use hyper_util::{
    client::legacy::{Client, connect::HttpConnector},
    rt::TokioExecutor,
};
use parking_lot::Mutex;
use std::time::{Duration, Instant};

const WAITING: &str = "vllm:num_requests_waiting";
const RUNNING: &str = "vllm:num_requests_running";
const KV_USAGE: &str = "vllm:kv_cache_usage_perc";
const E2E_SUM: &str = "vllm:e2e_request_latency_seconds_sum";
const E2E_COUNT: &str = "vllm:e2e_request_latency_seconds_count";
const TTFT_SUM: &str = "vllm:time_to_first_token_seconds_sum";
const TTFT_COUNT: &str = "vllm:time_to_first_token_seconds_count";
const CACHE_CONFIG: &str = "vllm:cache_config_info";

/// Larger metrics pages are refused.
const MAX_BODY: usize = 8 << 20;

/// The scrape state of one worker.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ScrapeState {
    pub load: Option<ScrapedLoad>,
    pub failures: u32,
    pub last_error: Option<String>,
    pub last_ok: Option<Instant>,
}

/// Shared, updated by the scrape loop, read by every pick.
#[derive(Debug, Default)]
pub struct Health {
    state: Mutex<ScrapeState>,
}

#[derive(Debug, thiserror::Error)]
pub enum ScrapeError {
    #[error("bad URL: {0}")]
    Url(String),
    #[error("timed out")]
    Timeout,
    #[error("request failed: {0}")]
    Request(String),
    #[error("HTTP status {0}")]
    Status(u16),
    #[error("body: {0}")]
    Body(String),
    #[error("none of the vLLM gauges found")]
    NoGauges,
}

pub type HttpClient = Client<HttpConnector, Empty<Bytes>>;

pub fn http_client() -> HttpClient {
    Client::builder(TokioExecutor::new()).build_http()
}

// === impl Health ===

impl Health {
    pub fn get(&self) -> ScrapeState {
        self.state.lock().clone()
    }

    /// Up unless the last `down_after` scrapes failed.
    pub fn is_up(&self, down_after: u32) -> bool {
        self.state.lock().failures < down_after
    }

    pub fn load(&self) -> Option<ScrapedLoad> {
        self.state.lock().load
    }

    pub fn record(&self, result: Result<ScrapedLoad, ScrapeError>, now: Instant) {
        let mut s = self.state.lock();
        match result {
            Ok(mut load) => {
                load.e2e.follow(s.load.as_ref().map(|l| &l.e2e));
                load.ttft.follow(s.load.as_ref().map(|l| &l.ttft));
                s.load = Some(load);
                s.failures = 0;
                s.last_error = None;
                s.last_ok = Some(now);
            }
            Err(e) => {
                s.failures = s.failures.saturating_add(1);
                s.last_error = Some(e.to_string());
            }
        }
    }
}

/// Fetches and parses one worker's metrics page.
pub async fn scrape(
    client: &HttpClient,
    url: &str,
    rank: Option<u32>,
    timeout: Duration,
) -> Result<ScrapedLoad, ScrapeError> {
    let body = get(client, url, timeout).await?;
    parse(&String::from_utf8_lossy(&body), rank).ok_or(ScrapeError::NoGauges)
}

/// The `/v1/models` URL beside a worker's `/metrics` URL.
pub fn models_url(metrics_url: &str) -> Option<String> {
    metrics_url
        .strip_suffix("/metrics")
        .map(|base| format!("{base}/v1/models"))
}

/// The LoRA adapters a worker serves: the entries of its `/v1/models` with
/// a `parent` (vLLM lists the base model, then one card per adapter).
pub async fn adapters(
    client: &HttpClient,
    url: &str,
    timeout: Duration,
) -> Result<Vec<String>, ScrapeError> {
    let body = get(client, url, timeout).await?;
    parse_adapters(&body).ok_or_else(|| ScrapeError::Body("not a model list".into()))
}

/// Adapter ids of a `/v1/models` body; `None` when it is not a model list.
pub fn parse_adapters(body: &[u8]) -> Option<Vec<String>> {
    let v: serde_json::Value = serde_json::from_slice(body).ok()?;
    let data = v.get("data")?.as_array()?;
    Some(
        data.iter()
            .filter(|m| m.get("parent").is_some_and(|p| p.is_string()))
            .filter_map(|m| m.get("id")?.as_str().map(str::to_owned))
            .collect(),
    )
}

/// One bounded GET.
async fn get(client: &HttpClient, url: &str, timeout: Duration) -> Result<Bytes, ScrapeError> {
    let uri: http::Uri = url.parse().map_err(|_| ScrapeError::Url(url.into()))?;
    let fetch = async {
        let resp = client
            .get(uri)
            .await
            .map_err(|e| ScrapeError::Request(e.to_string()))?;
        if !resp.status().is_success() {
            return Err(ScrapeError::Status(resp.status().as_u16()));
        }
        let body = Limited::new(resp.into_body(), MAX_BODY)
            .collect()
            .await
            .map_err(|e| ScrapeError::Body(e.to_string()))?
            .to_bytes();
        Ok(body)
    };
    tokio::time::timeout(timeout, fetch)
        .await
        .map_err(|_| ScrapeError::Timeout)?
}

/// Reads the vLLM gauges from a Prometheus text page, summed over label
/// sets; with a data-parallel rank, only series with `engine="<rank>"` (or
/// no engine label) count. `None` when none of the gauges is present.
pub fn parse(text: &str, rank: Option<u32>) -> Option<ScrapedLoad> {
    let engine = rank.map(|r| format!("engine=\"{r}\""));
    let mut load = ScrapedLoad::default();
    let (mut found, mut kv_series) = (false, 0u32);
    for line in text.lines() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let (name, labels, rest) = match line.find('{') {
            Some(open) => {
                let Some(close) = line[open..].find('}') else {
                    continue;
                };
                (
                    &line[..open],
                    &line[open + 1..open + close],
                    &line[open + close + 1..],
                )
            }
            None => match line.split_once(char::is_whitespace) {
                Some((name, rest)) => (name, "", rest),
                None => continue,
            },
        };
        let Some(value) = rest
            .split_whitespace()
            .next()
            .and_then(|v| v.parse::<f64>().ok())
        else {
            continue;
        };
        if !value.is_finite() {
            continue;
        }
        if let Some(e) = &engine
            && labels.contains("engine=\"")
            && !labels.contains(e.as_str())
        {
            continue;
        }
        match name {
            WAITING => load.waiting += value,
            RUNNING => load.running += value,
            KV_USAGE => {
                load.kv_usage += value;
                kv_series += 1;
            }
            E2E_SUM => load.e2e.sum += value,
            E2E_COUNT => load.e2e.count += value,
            TTFT_SUM => load.ttft.sum += value,
            TTFT_COUNT => load.ttft.count += value,
            CACHE_CONFIG => {
                let blocks = label(labels, "num_gpu_blocks");
                let size = label(labels, "block_size");
                let (Some(blocks), Some(size)) = (blocks, size) else {
                    continue;
                };
                load.kv_capacity_tokens += blocks * size;
            }
            _ => continue,
        }
        found = true;
    }
    if kv_series > 1 {
        load.kv_usage /= f64::from(kv_series);
    }
    found.then_some(load)
}

/// The number in `name="value"` among a series' labels.
fn label(labels: &str, name: &str) -> Option<f64> {
    labels.split(',').find_map(|kv| {
        let (k, v) = kv.split_once('=')?;
        (k.trim() == name)
            .then(|| v.trim().trim_matches('"').parse::<f64>().ok())
            .flatten()
            .filter(|x| x.is_finite() && *x >= 0.0)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn adapters_are_the_models_with_a_parent() {
        let body = br#"{"object":"list","data":[
            {"id":"Qwen/Qwen3-8B","object":"model","root":"Qwen/Qwen3-8B","parent":null},
            {"id":"sql","object":"model","root":"/adapters/sql","parent":"Qwen/Qwen3-8B"},
            {"id":"chat","object":"model","root":"/adapters/chat","parent":"Qwen/Qwen3-8B"}]}"#;
        assert_eq!(
            parse_adapters(body),
            Some(vec!["sql".into(), "chat".into()])
        );
        assert_eq!(parse_adapters(b"{}"), None);
        assert_eq!(parse_adapters(b"not json"), None);
        assert_eq!(
            models_url("http://10.0.0.1:8000/metrics").as_deref(),
            Some("http://10.0.0.1:8000/v1/models")
        );
        assert_eq!(models_url("http://10.0.0.1:8000/stats"), None);
    }

    const PAGE: &str = r#"# HELP vllm:num_requests_waiting Number of requests waiting.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="Qwen/Qwen3-8B"} 3.0
vllm:num_requests_waiting{engine="1",model_name="Qwen/Qwen3-8B"} 5.0
vllm:num_requests_running{engine="0",model_name="Qwen/Qwen3-8B"} 12.0
vllm:num_requests_running{engine="1",model_name="Qwen/Qwen3-8B"} 2
vllm:kv_cache_usage_perc{engine="0",model_name="Qwen/Qwen3-8B"} 0.5
vllm:kv_cache_usage_perc{engine="1",model_name="Qwen/Qwen3-8B"} 0.25
vllm:num_requests_waiting_total 99
vllm:cache_config_info{block_size="16",engine="0",num_gpu_blocks="100",prefix="a,b"} 1.0
vllm:cache_config_info{block_size="16",engine="1",num_gpu_blocks="50"} 1.0
vllm:cache_config_info{engine="1",num_gpu_blocks="oops"} 1.0
garbage line without value
vllm:num_requests_running{broken 7
"#;

    #[test]
    fn sums_over_engines_or_picks_one() {
        let all = parse(PAGE, None).unwrap();
        assert_eq!((all.waiting, all.running, all.kv_usage), (8.0, 14.0, 0.375));
        let one = parse(PAGE, Some(1)).unwrap();
        assert_eq!((one.waiting, one.running, one.kv_usage), (5.0, 2.0, 0.25));
        // KV capacity from the cache config's labels, in tokens.
        assert_eq!(all.kv_capacity_tokens, 150.0 * 16.0);
        assert_eq!(one.kv_capacity_tokens, 50.0 * 16.0);
        assert_eq!(
            parse("vllm:num_requests_running 1\n", None)
                .unwrap()
                .kv_capacity_tokens,
            0.0
        );
    }

    #[test]
    fn unlabelled_series_and_missing_gauges() {
        let l = parse("vllm:num_requests_waiting 2 1700000000\n", Some(0)).unwrap();
        assert_eq!(l.waiting, 2.0);
        assert_eq!(parse("other_metric 1\n", None), None);
        assert_eq!(parse("vllm:num_requests_waiting NaN\n", None), None);
    }

    #[test]
    fn health_goes_down_after_failures_and_back_up() {
        let h = Health::default();
        let now = Instant::now();
        assert!(h.is_up(2));
        h.record(Err(ScrapeError::Timeout), now);
        assert!(h.is_up(2));
        h.record(Err(ScrapeError::Status(500)), now);
        assert!(!h.is_up(2));
        h.record(Ok(ScrapedLoad::default()), now);
        assert!(h.is_up(2));
        assert_eq!(h.get().last_ok, Some(now));
    }

    #[test]
    fn latency_means_follow_the_histograms_between_scrapes() {
        let page = |e2e_sum: f64, n: f64, ttft_sum: f64| {
            format!(
                "vllm:num_requests_running 1\n\
                 vllm:e2e_request_latency_seconds_sum{{model_name=\"m\"}} {e2e_sum}\n\
                 vllm:e2e_request_latency_seconds_count{{model_name=\"m\"}} {n}\n\
                 vllm:time_to_first_token_seconds_sum {ttft_sum}\n\
                 vllm:time_to_first_token_seconds_count {n}\n"
            )
        };
        let h = Health::default();
        let now = Instant::now();
        h.record(Ok(parse(&page(0.0, 0.0, 0.0), None).unwrap()), now);
        assert_eq!(h.load().unwrap().slot_time_s(), None);
        // Two requests of 4 s, 1 s of it to the first token: 3 s per slot.
        h.record(Ok(parse(&page(8.0, 2.0, 2.0), None).unwrap()), now);
        assert_eq!(h.load().unwrap().slot_time_s(), Some(3.0));
        // Nothing new finished: the means stay.
        h.record(Ok(parse(&page(8.0, 2.0, 2.0), None).unwrap()), now);
        assert_eq!(h.load().unwrap().e2e.mean, Some(4.0));
        // Two more of 14 s each move the mean by MEAN_ALPHA towards 14.
        h.record(Ok(parse(&page(36.0, 4.0, 4.0), None).unwrap()), now);
        let e2e = h.load().unwrap().e2e.mean.unwrap();
        assert!(
            (e2e - (4.0 + crate::scoring::MEAN_ALPHA * 10.0)).abs() < 1e-9,
            "{e2e}"
        );
        // The engine restarted (counts went back): lifetime means again.
        h.record(Ok(parse(&page(2.0, 1.0, 0.5), None).unwrap()), now);
        assert_eq!(h.load().unwrap().slot_time_s(), Some(1.5));

        // An indexer that starts beside an engine with a past (100
        // requests of 2 s, 1 s to the first token) does not take that past
        // as recent: no slot time until something finishes after it.
        let h = Health::default();
        h.record(Ok(parse(&page(200.0, 100.0, 100.0), None).unwrap()), now);
        assert_eq!(h.load().unwrap().e2e.mean, None);
        assert_eq!(h.load().unwrap().slot_time_s(), None);
        h.record(Ok(parse(&page(200.0, 100.0, 100.0), None).unwrap()), now);
        assert_eq!(h.load().unwrap().slot_time_s(), None);
        // Then two of 11 s, 1 s to the first token: 10 s per slot, not the
        // lifetime's (222 − 102) / 102 ≈ 1.2 s.
        h.record(Ok(parse(&page(222.0, 102.0, 102.0), None).unwrap()), now);
        assert_eq!(h.load().unwrap().e2e.mean, Some(11.0));
        assert_eq!(h.load().unwrap().slot_time_s(), Some(10.0));
    }
}
