//! The fault schedule and its execution: kill and restart the indexer, a
//! worker and Redis; SIGSTOP a worker and the indexer; client resets. Each
//! fault is logged with its time so the checks can attribute failures.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use kvsteer_e2e::{MODEL, wait_until};
use serde_json::{Value, json};

use crate::layout::Layout;
use crate::traffic::{Rng, words};

/// How long a killed process stays down and a stopped one stays stopped.
const DOWN: Duration = Duration::from_secs(2);
const STOPPED: Duration = Duration::from_secs(3);

#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Fault {
    KillIndexer,
    StopIndexer,
    KillRedis,
    /// Plants stale-block probes on the busiest worker (this one on a tie),
    /// then kills and restarts it.
    KillWorker(usize),
    StopWorker(usize),
    ResetBurst,
}

/// When each fault happens, in seconds from the start.
pub fn schedule(duration: f64) -> Vec<(f64, Fault)> {
    let rounds = (duration / 150.0).floor().max(1.0) as usize;
    let len = duration / rounds as f64;
    let mut out = Vec::new();
    for r in 0..rounds {
        let at = |f: f64| r as f64 * len + f * len;
        // Once only: the indexer's RSS is judged over its last life.
        if r == 0 {
            out.push((at(0.08), Fault::KillIndexer));
        }
        out.push((at(0.19), Fault::StopIndexer));
        out.push((at(0.27), Fault::KillRedis));
        out.push((at(0.37), Fault::KillWorker((1 + r) % 3)));
        out.push((at(0.56), Fault::StopWorker((2 + r) % 3)));
        out.push((at(0.66), Fault::ResetBurst));
    }
    out
}

/// One executed fault.
#[derive(Debug, Clone)]
pub struct Event {
    /// Seconds from the start when `in_flight` was read.
    pub sampled: f64,
    /// Seconds from the start when the fault hit (a killed process is
    /// gone by then).
    pub at: f64,
    /// Seconds from the start when the process was back (or resumed).
    pub back: f64,
    pub fault: Fault,
    /// Worker kills: requests running or waiting on the worker just before
    /// (its own `/metrics`; requests still being tokenized are not in it).
    pub in_flight: Option<u64>,
}

/// A worker restart and what the indexer says of the old life's blocks.
#[derive(Debug, Clone)]
pub struct StaleProbe {
    pub worker: usize,
    /// Prompts sent straight to the worker before the kill.
    pub bodies: Vec<Value>,
    /// Whether the indexer had indexed them on the worker before the kill.
    pub indexed: bool,
    /// Seconds from the start when the new process was spawned.
    pub restarted: f64,
}

pub struct Faults {
    pub layout: Layout,
    pub http: reqwest::Client,
    pub t0: Instant,
    /// The running indexer's (pid, incarnation), for the RSS sampler.
    pub indexer_pid: Arc<Mutex<Option<(u32, u32)>>>,
    pub events: Vec<Event>,
    pub probes: Vec<StaleProbe>,
    pub resets: usize,
    pub rng: Rng,
}

// === impl Faults ===

impl Faults {
    pub fn now(&self) -> f64 {
        self.t0.elapsed().as_secs_f64()
    }

    fn publish_pid(&self) {
        *self.indexer_pid.lock().unwrap_or_else(|e| e.into_inner()) = self.layout.indexer_pid();
    }

    pub async fn run(&mut self, fault: Fault) -> anyhow::Result<()> {
        let at = self.now();
        let mut in_flight = None;
        match fault {
            Fault::KillIndexer => {
                self.layout.kill_indexer();
                self.publish_pid();
                tokio::time::sleep(DOWN).await;
                self.layout.start_indexer().await?;
                self.publish_pid();
            }
            Fault::StopIndexer => {
                self.layout.signal_indexer("STOP")?;
                tokio::time::sleep(STOPPED).await;
                self.layout.signal_indexer("CONT")?;
            }
            Fault::KillRedis => {
                self.layout.kill_redis();
                tokio::time::sleep(DOWN).await;
                self.layout.start_redis().await?;
            }
            Fault::KillWorker(scheduled) => {
                // The busiest worker (the scheduled one on a tie): steering
                // may keep a worker idle, and an idle kill tests little.
                let mut i = scheduled;
                let mut most = self.worker_in_flight(i).await;
                for w in 0..3 {
                    let n = self.worker_in_flight(w).await;
                    if n > most {
                        (i, most) = (w, n);
                    }
                }
                let fault = Fault::KillWorker(i);
                let probe = self.plant(i).await?;
                // Kill it busy (up to 5 s of waiting), so the kill fails
                // requests in flight as a crash in production would.
                let mut busy = 0;
                for _ in 0..50 {
                    busy = self.worker_in_flight(i).await;
                    if busy > 0 {
                        break;
                    }
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                in_flight = Some(busy);
                let sampled = self.now();
                self.layout.kill_worker(i);
                let at = self.now();
                tokio::time::sleep(DOWN).await;
                let spawned = self.now();
                self.layout.start_worker(i).await?;
                let back = self.now();
                self.events.push(Event {
                    sampled,
                    at,
                    back,
                    fault,
                    in_flight,
                });
                self.probes.push(StaleProbe {
                    restarted: spawned,
                    ..probe
                });
                return Ok(());
            }
            Fault::StopWorker(i) => {
                self.layout.signal_worker(i, "STOP")?;
                tokio::time::sleep(STOPPED).await;
                self.layout.signal_worker(i, "CONT")?;
            }
            Fault::ResetBurst => {
                for _ in 0..5 {
                    self.reset().await;
                    tokio::time::sleep(Duration::from_millis(300)).await;
                }
            }
        }
        let back = self.now();
        self.events.push(Event {
            sampled: at,
            at,
            back,
            fault,
            in_flight,
        });
        Ok(())
    }

    /// One client reset, held 30-120 ms after the body is sent.
    pub async fn reset(&mut self) {
        let hold = Duration::from_millis(self.rng.range(30, 120));
        match crate::traffic::client_reset(&mut self.rng, hold).await {
            Ok(_) => self.resets += 1,
            Err(e) => eprintln!("chaos: a client reset could not be sent: {e:#}"),
        }
    }

    /// Requests running or waiting on worker `i` (its `/metrics`).
    async fn worker_in_flight(&self, i: usize) -> u64 {
        let url = format!("http://127.0.0.1:{}/metrics", 8001 + i);
        let Ok(text) = async { self.http.get(&url).send().await?.text().await }.await else {
            return 0;
        };
        text.lines()
            .filter(|l| {
                l.starts_with("vllm:num_requests_running{")
                    || l.starts_with("vllm:num_requests_waiting{")
            })
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum::<f64>() as u64
    }

    /// Sends two unique prompts straight to worker `i` (no pick, no load)
    /// and waits until the indexer has their blocks on it.
    async fn plant(&mut self, i: usize) -> anyhow::Result<StaleProbe> {
        let mut bodies = Vec::new();
        for k in 0..2 {
            let text = format!(
                "stale probe {k} at {:.3}: {}",
                self.now(),
                words(&mut self.rng, 150)
            );
            let body = json!({"model": MODEL, "messages": [{"role": "user", "content": text}], "max_tokens": 1});
            self.http
                .post(format!("http://127.0.0.1:{}/v1/chat/completions", 8001 + i))
                .json(&body)
                .send()
                .await?
                .error_for_status()?;
            bodies.push(body);
        }
        let name = format!("w{}", i + 1);
        let indexed = wait_until("the probes indexed", Duration::from_secs(10), || async {
            for b in &bodies {
                if matched_tokens(&self.http, b, &name).await? == 0 {
                    return None;
                }
            }
            Some(())
        })
        .await
        .is_ok();
        Ok(StaleProbe {
            worker: i,
            bodies,
            indexed,
            restarted: 0.0,
        })
    }
}

/// Tokens of `body` the indexer says worker `name` has cached (a dry run).
pub async fn matched_tokens(http: &reqwest::Client, body: &Value, name: &str) -> Option<u64> {
    let v: Value = http
        .post("http://127.0.0.1:9091/debug/score")
        .json(body)
        .send()
        .await
        .ok()?
        .error_for_status()
        .ok()?
        .json()
        .await
        .ok()?;
    // A degraded dry run (e.g. a Redis lookup that timed out) says nothing
    // about what is indexed.
    if v["degraded"].as_bool() != Some(false) {
        return None;
    }
    v["workers"]
        .as_array()?
        .iter()
        .find(|w| w["name"] == name)
        .and_then(|w| w["matched_tokens"].as_u64())
}

/// Polls until the indexer reports none of `probe`'s tokens on its worker;
/// seconds from the start when that was first seen, `None` if not by
/// `until` (seconds from the start).
pub async fn watch_stale(
    http: reqwest::Client,
    t0: Instant,
    probe: StaleProbe,
    until: f64,
) -> Option<f64> {
    let name = format!("w{}", probe.worker + 1);
    while t0.elapsed().as_secs_f64() < until {
        let mut stale = 0;
        let mut answered = true;
        for b in &probe.bodies {
            match matched_tokens(&http, b, &name).await {
                Some(n) => stale += n,
                None => answered = false,
            }
        }
        if answered && stale == 0 {
            return Some(t0.elapsed().as_secs_f64());
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_fault_in_every_round_and_the_indexer_killed_once() {
        let ci = schedule(60.0);
        assert_eq!(ci.len(), 6);
        assert!(ci.windows(2).all(|w| w[0].0 < w[1].0));
        assert!(ci.iter().all(|(at, _)| *at > 3.0 && *at < 45.0));
        let full = schedule(600.0);
        assert_eq!(
            full.iter()
                .filter(|(_, f)| *f == Fault::KillIndexer)
                .count(),
            1
        );
        assert_eq!(
            full.iter()
                .filter(|(_, f)| matches!(f, Fault::KillWorker(_)))
                .count(),
            4
        );
        assert!(full.iter().all(|(at, _)| *at < 600.0));
    }
}
