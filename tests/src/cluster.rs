use std::process::Command;
use std::time::Duration;

use anyhow::Context;
use serde_json::Value;

use crate::paths::Paths;
use crate::process::{Proc, spawn_envoy, wait_http_ok, wait_until};

/// The model name the local layout serves.
pub const MODEL: &str = "Qwen/Qwen3-8B";
const START_LIMIT: Duration = Duration::from_secs(60);

/// How one simulated worker runs.
#[derive(Debug, Clone)]
pub struct SimOptions {
    pub profile: String,
    pub time_scale: f64,
    pub max_num_seqs: u32,
    pub num_gpu_blocks: u32,
    pub seed: u64,
}

impl Default for SimOptions {
    fn default() -> Self {
        SimOptions {
            profile: "tiny-cpu".to_string(),
            time_scale: 1.0,
            max_num_seqs: 16,
            num_gpu_blocks: 4096,
            seed: 1,
        }
    }
}

#[derive(Debug, Clone, Default)]
pub struct ClusterOptions {
    /// One entry per worker (the local layout has three).
    pub sims: Vec<SimOptions>,
    /// Extra YAML appended to the indexer's `scoring:` section.
    pub scoring_extra: String,
    /// Indexer replicas beyond the first (gRPC 9190, 9290…; admin one
    /// above), each in Envoy's indexer cluster, each on its own memory
    /// index fed by every worker's events.
    pub extra_indexers: usize,
    /// Extra YAML appended to the indexer's `tenants:` section.
    pub tenants_extra: String,
    /// Environment of the indexer processes, beyond `RUST_LOG`.
    pub indexer_env: Vec<(String, String)>,
    /// An Envoy bootstrap to run instead of `envoy/local/envoy.yaml` (same
    /// ports, workers and indexer).
    pub envoy_config: Option<std::path::PathBuf>,
    /// Extra YAML appended to the indexer's `grpc:` section (e.g. `tls:`).
    pub grpc_extra: String,
}

impl ClusterOptions {
    /// Three workers of the default (`tiny-cpu`) profile at `time_scale`.
    pub fn tiny(time_scale: f64) -> ClusterOptions {
        ClusterOptions::three(SimOptions {
            time_scale,
            ..SimOptions::default()
        })
    }

    pub fn three(sim: SimOptions) -> ClusterOptions {
        ClusterOptions {
            sims: vec![sim; 3],
            scoring_extra: String::new(),
            extra_indexers: 0,
            tenants_extra: String::new(),
            indexer_env: Vec::new(),
            envoy_config: None,
            grpc_extra: String::new(),
        }
    }
}

/// Three simulated workers, the indexer and Envoy, in the local layout.
pub struct Cluster {
    pub paths: Paths,
    pub client: reqwest::Client,
    opts: ClusterOptions,
    sims: Vec<Option<Proc>>,
    indexer: Option<Proc>,
    /// Replicas 2, 3, … (`ClusterOptions::extra_indexers`).
    replicas: Vec<Option<Proc>>,
    envoy: Option<Proc>,
    /// Logs and generated configs; declared last so it outlives the processes.
    dir: tempfile::TempDir,
}

impl Cluster {
    /// Starts everything and waits until Envoy is ready and the indexer sees
    /// every worker's event stream.
    pub async fn start(opts: ClusterOptions) -> anyhow::Result<Cluster> {
        let paths = Paths::discover()?;
        let dir = tempfile::Builder::new().prefix("kvsteer-e2e-").tempdir()?;
        let client = reqwest::Client::builder()
            .timeout(Duration::from_secs(120))
            .build()?;
        let n = opts.sims.len();
        let mut cluster = Cluster {
            paths,
            client,
            opts,
            dir,
            sims: (0..n).map(|_| None).collect(),
            indexer: None,
            replicas: Vec::new(),
            envoy: None,
        };
        for i in 0..n {
            cluster.start_sim(i).await?;
        }
        cluster.start_indexer().await?;
        for r in 1..=cluster.opts.extra_indexers {
            cluster.start_replica(r).await?;
        }
        cluster.start_envoy().await?;
        Ok(cluster)
    }

    pub fn envoy_url(&self, path: &str) -> String {
        format!("http://127.0.0.1:8080{path}")
    }

    pub fn worker_url(&self, i: usize, path: &str) -> String {
        format!("http://127.0.0.1:{}{path}", 8001 + i)
    }

    pub fn admin_url(&self, path: &str) -> String {
        format!("http://127.0.0.1:9091{path}")
    }

    pub async fn start_sim(&mut self, i: usize) -> anyhow::Result<()> {
        self.start_sim_at(i, 8001 + i as u16).await
    }

    /// Starts worker `i` listening on `port` instead of its contract port (for
    /// a relay in front of it); it keeps its event endpoints and topic.
    pub async fn start_sim_at(&mut self, i: usize, port: u16) -> anyhow::Result<()> {
        let o = &self.opts.sims[i];
        let mut cmd = Command::new(self.paths.sim());
        cmd.arg("engine")
            .args(["--listen", &format!("127.0.0.1:{port}")])
            .args([
                "--kv-events-topic",
                &format!("kv@127.0.0.1:{}@{MODEL}", 8001 + i),
            ])
            .args(["--served-model-name", MODEL])
            .arg("--tokenizer")
            .arg(self.paths.tokenizer())
            .args([
                "--kv-events-endpoint",
                &format!("tcp://127.0.0.1:{}", 5557 + i),
            ])
            .args([
                "--replay-endpoint",
                &format!("tcp://127.0.0.1:{}", 5567 + i),
            ])
            .args(["--block-size", "16"])
            .args(["--num-gpu-blocks", &o.num_gpu_blocks.to_string()])
            .args(["--max-num-seqs", &o.max_num_seqs.to_string()])
            .args(["--profile", &o.profile])
            .args(["--time-scale", &o.time_scale.to_string()])
            .args(["--seed", &o.seed.to_string()])
            .args(["--worker-id", &format!("w{}", i + 1)]);
        let proc = Proc::spawn(&format!("sim-w{}", i + 1), cmd, self.dir.path())?;
        self.sims[i] = Some(proc);
        wait_http_ok(&format!("http://127.0.0.1:{port}/health"), START_LIMIT).await
    }

    pub fn stop_sim(&mut self, i: usize) {
        if let Some(p) = self.sims[i].take() {
            p.kill();
        }
    }

    pub async fn start_indexer(&mut self) -> anyhow::Result<()> {
        self.indexer = Some(self.spawn_indexer(0)?);
        wait_http_ok(&self.admin_url("/readyz"), START_LIMIT).await?;
        let n = self.sims.iter().filter(|s| s.is_some()).count();
        self.wait_streams_live(n).await
    }

    /// Replica `r` (1, 2, …) of the indexer: gRPC on 9090 + 100·r, admin
    /// one above, advertising its gRPC address.
    pub async fn start_replica(&mut self, r: usize) -> anyhow::Result<()> {
        let proc = self.spawn_indexer(r)?;
        while self.replicas.len() < r {
            self.replicas.push(None);
        }
        self.replicas[r - 1] = Some(proc);
        wait_http_ok(&self.replica_admin_url(r, "/readyz"), START_LIMIT).await
    }

    /// Kills replica `r` (1, 2, …) at once.
    pub fn kill_replica(&mut self, r: usize) {
        if let Some(p) = self.replicas.get_mut(r - 1).and_then(Option::take) {
            p.kill();
        }
    }

    /// Sends `signal` to replica `r` (1, 2, …) without reaping it.
    pub fn signal_replica(&self, r: usize, signal: &str) -> anyhow::Result<()> {
        let pid = self
            .replicas
            .get(r - 1)
            .and_then(Option::as_ref)
            .context("the replica is not running")?
            .id();
        kill(pid, signal)
    }

    /// The admin URL of replica `r` (0: the first indexer).
    pub fn replica_admin_url(&self, r: usize, path: &str) -> String {
        format!("http://127.0.0.1:{}{path}", 9091 + 100 * r)
    }

    /// Starts replica `r` (0: the first indexer) on its config.
    fn spawn_indexer(&self, r: usize) -> anyhow::Result<Proc> {
        let path = self.indexer_config(r)?;
        let mut cmd = Command::new(self.paths.indexer());
        cmd.current_dir(&self.paths.root)
            .env("RUST_LOG", "info")
            .envs(self.opts.indexer_env.iter().map(|(k, v)| (k, v)))
            .arg("serve")
            .arg("--config")
            .arg(&path);
        let name = if r == 0 {
            "indexer".to_owned()
        } else {
            format!("indexer-{}", r + 1)
        };
        Proc::spawn(&name, cmd, self.dir.path())
    }

    /// The config of replica `r` (0: the first) in the scratch directory.
    fn indexer_config(&self, r: usize) -> anyhow::Result<std::path::PathBuf> {
        let template = std::fs::read_to_string(self.paths.root.join("envoy/local/indexer.yaml"))
            .context("reading envoy/local/indexer.yaml")?;
        let tokenizer = self.paths.tokenizer();
        let mut config = template.replace(
            ".cache/tokenizers/qwen3",
            tokenizer.to_str().context("tokenizer path is not UTF-8")?,
        );
        if !self.opts.scoring_extra.is_empty() {
            config = config.replace(
                "scoring:\n",
                &format!("scoring:\n{}\n", self.opts.scoring_extra),
            );
        }
        if !self.opts.tenants_extra.is_empty() {
            anyhow::ensure!(
                config.contains("tenants:\n"),
                "indexer.yaml: no tenants section"
            );
            config = config.replace(
                "tenants:\n",
                &format!("tenants:\n{}\n", self.opts.tenants_extra.trim_end()),
            );
        }
        if !self.opts.grpc_extra.is_empty() {
            anyhow::ensure!(
                config.contains("\ngrpc:\n"),
                "indexer.yaml: no grpc section"
            );
            config = config.replace("\ngrpc:\n", &format!("\ngrpc:\n{}\n", self.opts.grpc_extra));
        }
        if r > 0 {
            let (grpc, admin) = (9090 + 100 * r, 9091 + 100 * r);
            config = config
                .replace("127.0.0.1:9090", &format!("127.0.0.1:{grpc}"))
                .replace("127.0.0.1:9091", &format!("127.0.0.1:{admin}"));
        }
        let path = self.dir.path().join(format!("indexer-{}.yaml", r + 1));
        std::fs::write(&path, config)?;
        Ok(path)
    }

    pub fn stop_indexer(&mut self) {
        if let Some(p) = self.indexer.take() {
            p.kill();
        }
    }

    async fn start_envoy(&mut self) -> anyhow::Result<()> {
        let mut config = self
            .opts
            .envoy_config
            .clone()
            .unwrap_or_else(|| self.paths.root.join("envoy/local/envoy.yaml"));
        if self.opts.extra_indexers > 0 {
            // The replicas join the first indexer's endpoint in the cluster.
            let text = std::fs::read_to_string(&config)?;
            let first = "socket_address: { address: 127.0.0.1, port_value: 9090 }";
            anyhow::ensure!(text.contains(first), "envoy.yaml: no indexer endpoint");
            let indent =
                "\n              - endpoint:\n                  address:\n                    ";
            let more: String = (1..=self.opts.extra_indexers)
                .map(|r| {
                    format!(
                        "{indent}socket_address: {{ address: 127.0.0.1, port_value: {} }}",
                        9090 + 100 * r
                    )
                })
                .collect();
            config = self.dir.path().join("envoy.yaml");
            std::fs::write(&config, text.replace(first, &format!("{first}{more}")))?;
        }
        let envoy = spawn_envoy(
            &self.paths.envoy,
            &self.paths.root,
            &config,
            self.dir.path(),
            START_LIMIT,
        )
        .await?;
        self.envoy = Some(envoy);
        Ok(())
    }

    /// `GET /debug/workers` of the indexer.
    pub async fn debug_workers(&self) -> anyhow::Result<Value> {
        self.admin_json(self.client.get(self.admin_url("/debug/workers")))
            .await
    }

    /// `POST /debug/score` of the indexer for an OpenAI body.
    pub async fn debug_score(&self, body: &Value) -> anyhow::Result<Value> {
        self.admin_json(self.client.post(self.admin_url("/debug/score")).json(body))
            .await
    }

    async fn admin_json(&self, req: reqwest::RequestBuilder) -> anyhow::Result<Value> {
        Ok(req
            .send()
            .await?
            .error_for_status()?
            .json::<Value>()
            .await?)
    }

    /// Waits until at least `n` workers' event streams are live.
    pub async fn wait_streams_live(&self, n: usize) -> anyhow::Result<()> {
        wait_until("worker event streams to be live", START_LIMIT, || async {
            let v = self.debug_workers().await.ok()?;
            let live = workers_of(&v)
                .iter()
                .filter(|w| w.pointer("/stream/state").and_then(Value::as_str) == Some("live"))
                .count();
            (live >= n).then_some(())
        })
        .await
    }

    /// Sum of the indexer's in-flight counts over all workers.
    pub async fn total_in_flight(&self) -> anyhow::Result<u64> {
        let v = self.debug_workers().await?;
        Ok(workers_of(&v)
            .iter()
            .filter_map(|w| w.get("in_flight").and_then(Value::as_u64))
            .sum())
    }
}

// === faults and counters (used by tests/faults_filter.rs) ===

impl Cluster {
    /// Sends `signal` (`STOP`, `CONT`, ...) to the indexer process.
    pub fn signal_indexer(&self, signal: &str) -> anyhow::Result<()> {
        let pid = self
            .indexer
            .as_ref()
            .context("the indexer is not running")?
            .id();
        kill(pid, signal)
    }

    /// An Envoy stat by its full name (`wasmcustom.kvsteer_filter_steered`,
    /// `cluster.kvsteer_indexer.upstream_rq_active`); 0 when absent.
    pub async fn envoy_stat(&self, name: &str) -> anyhow::Result<u64> {
        let filter = format!("^{}$", name.replace('.', "\\."));
        let text = self.envoy_stats(&[("filter", &filter)]).await?;
        Ok(text
            .lines()
            .filter_map(|l| l.split_once(": "))
            .find(|(n, _)| *n == name)
            .and_then(|(_, v)| v.trim().parse().ok())
            .unwrap_or(0))
    }

    /// A filter histogram's sample count and sum as Envoy exports them
    /// (`kvsteer_filter_pick_us` → `_count`, `_sum`); (0, 0.0) before
    /// Envoy's first stats flush has merged the workers' samples.
    pub async fn envoy_histogram(&self, name: &str) -> anyhow::Result<(u64, f64)> {
        let text = self
            .envoy_stats(&[("format", "prometheus"), ("filter", name)])
            .await?;
        let value = |suffix: &str| {
            let key = format!("{name}_{suffix}");
            text.lines()
                .filter_map(|l| l.split_once(' '))
                .find(|(n, _)| n.split('{').next() == Some(key.as_str()))
                .and_then(|(_, v)| v.trim().parse::<f64>().ok())
        };
        Ok((
            value("count").unwrap_or(0.0) as u64,
            value("sum").unwrap_or(0.0),
        ))
    }

    /// Envoy's admin `/stats` with `query`.
    async fn envoy_stats(&self, query: &[(&str, &str)]) -> anyhow::Result<String> {
        Ok(self
            .client
            .get("http://127.0.0.1:9901/stats")
            .query(query)
            .send()
            .await?
            .error_for_status()?
            .text()
            .await?)
    }

    /// The sum of the indexer's `/metrics` samples named `name` whose labels
    /// include every `key="value"` of `labels`.
    pub async fn indexer_metric(&self, name: &str, labels: &[&str]) -> anyhow::Result<f64> {
        let text = self
            .client
            .get(self.admin_url("/metrics"))
            .send()
            .await?
            .error_for_status()?
            .text()
            .await?;
        Ok(metric_sum(&text, name, labels))
    }
}

/// `kill -s SIGNAL PID`.
fn kill(pid: u32, signal: &str) -> anyhow::Result<()> {
    let status = Command::new("kill")
        .args(["-s", signal, &pid.to_string()])
        .status()
        .context("running kill")?;
    anyhow::ensure!(status.success(), "kill -s {signal} {pid}: {status}");
    Ok(())
}

/// Sums the samples of one metric in Prometheus text format.
pub fn metric_sum(text: &str, name: &str, labels: &[&str]) -> f64 {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let (series, value) = l.rsplit_once(' ')?;
            let (metric, rest) = series.split_once('{').unwrap_or((series, ""));
            (metric == name && labels.iter().all(|want| rest.contains(want)))
                .then(|| value.parse::<f64>().ok())
                .flatten()
        })
        .sum()
}

/// The worker list of a `/debug/workers` answer (a bare array or `{"workers": [...]}`).
pub fn workers_of(v: &Value) -> Vec<Value> {
    v.as_array()
        .or_else(|| v.get("workers").and_then(Value::as_array))
        .cloned()
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sums_matching_prometheus_samples() {
        let text = "# HELP kvsteer_reports Reports by kind\n\
                    # TYPE kvsteer_reports counter\n\
                    kvsteer_reports_total{kind=\"done\"} 3\n\
                    kvsteer_reports_total{kind=\"cancelled\"} 2\n\
                    kvsteer_in_flight{worker=\"w1\"} 1\n\
                    kvsteer_in_flight{worker=\"w2\"} 4\n\
                    kvsteer_in_flight_expired_total 7\n";
        assert_eq!(
            metric_sum(text, "kvsteer_reports_total", &["kind=\"done\""]),
            3.0
        );
        assert_eq!(metric_sum(text, "kvsteer_in_flight", &[]), 5.0);
        assert_eq!(
            metric_sum(text, "kvsteer_in_flight_expired_total", &[]),
            7.0
        );
        assert_eq!(
            metric_sum(text, "kvsteer_reports_total", &["kind=\"x\""]),
            0.0
        );
        assert_eq!(metric_sum(text, "absent", &[]), 0.0);
    }
}
