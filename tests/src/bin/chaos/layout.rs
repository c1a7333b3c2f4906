//! The local layout the soak runs against, with the handles the faults need:
//! three `kvsteer-sim` workers (8001-8003), the indexer on the Redis backend
//! (9090/9091), its own `redis-server` on a free port, and Envoy (8080/9901).
//! Every process is killed when the layout is dropped.

use std::fs::File;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use anyhow::{Context, bail};
use kvsteer_e2e::{MODEL, Paths, wait_http_ok, wait_until};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const START_LIMIT: Duration = Duration::from_secs(60);

/// How the simulated workers run.
#[derive(Debug, Clone)]
pub struct SimSpec {
    pub profile: String,
    pub time_scale: f64,
}

/// One process of the layout: how to start it again, and the running child.
struct Slot {
    name: String,
    cmd: Vec<String>,
    cwd: PathBuf,
    child: Option<Child>,
    /// Bumped at every start; the indexer's RSS samples are per incarnation.
    incarnation: u32,
}

// === impl Slot ===

impl Slot {
    fn new(name: &str, cmd: Vec<String>, cwd: &Path) -> Slot {
        Slot {
            name: name.to_string(),
            cmd,
            cwd: cwd.to_path_buf(),
            child: None,
            incarnation: 0,
        }
    }

    /// Starts the process, its output appended to `<name>.log` in `logs`.
    fn spawn(&mut self, logs: &Path) -> anyhow::Result<()> {
        let log = logs.join(format!("{}.log", self.name));
        let out = File::options().create(true).append(true).open(&log)?;
        let err = out.try_clone()?;
        let child = Command::new(&self.cmd[0])
            .args(&self.cmd[1..])
            .current_dir(&self.cwd)
            // The indexer logs its allocator's figures every second.
            .env("RUST_LOG", "info,kvsteer_indexer::alloc=debug")
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .with_context(|| format!("starting {}: {:?}", self.name, self.cmd))?;
        self.child = Some(child);
        self.incarnation += 1;
        Ok(())
    }

    fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// SIGKILL and reap.
    fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// SIGSTOP / SIGCONT through `kill(1)` (the crate forbids `unsafe`).
    fn signal(&self, sig: &str) -> anyhow::Result<()> {
        let pid = self
            .pid()
            .with_context(|| format!("{} is not running", self.name))?;
        let status = Command::new("kill")
            .args([&format!("-{sig}"), &pid.to_string()])
            .status()
            .context("running kill(1)")?;
        if !status.success() {
            bail!("kill -{sig} {pid} ({}) failed", self.name);
        }
        Ok(())
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.kill();
    }
}

pub struct Layout {
    pub logs: PathBuf,
    pub redis_port: u16,
    sims: Vec<Slot>,
    indexer: Slot,
    redis: Slot,
    envoy: Slot,
    http: reqwest::Client,
}

// === impl Layout ===

impl Layout {
    /// Starts Redis, the workers, the indexer (waiting until it sees every
    /// worker's stream live) and Envoy.
    /// `window_s`: the indexer's route and placement windows.
    pub async fn start(
        paths: &Paths,
        sim: &SimSpec,
        logs: &Path,
        window_s: u64,
    ) -> anyhow::Result<Layout> {
        std::fs::create_dir_all(logs)?;
        let redis_port = free_port()?;
        let redis = Slot::new(
            "redis",
            [
                "redis-server",
                "--port",
                &redis_port.to_string(),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
            ]
            .map(str::to_string)
            .to_vec(),
            logs,
        );
        let sims = (0..3).map(|i| sim_slot(paths, sim, i)).collect();
        let config = logs.join("indexer.yaml");
        std::fs::write(&config, indexer_config(paths, redis_port, window_s)?)?;
        let indexer = Slot::new(
            "indexer",
            vec![
                path_str(&paths.indexer())?,
                "serve".into(),
                "--config".into(),
                path_str(&config)?,
            ],
            &paths.root,
        );
        let envoy = Slot::new(
            "envoy",
            vec![
                path_str(&paths.envoy)?,
                "-c".into(),
                "envoy/local/envoy.yaml".into(),
                "--disable-hot-restart".into(),
                "--log-level".into(),
                "warn".into(),
            ],
            &paths.root,
        );
        let mut layout = Layout {
            logs: logs.to_path_buf(),
            redis_port,
            sims,
            indexer,
            redis,
            envoy,
            http: reqwest::Client::builder()
                .timeout(Duration::from_secs(5))
                .build()?,
        };
        layout.start_redis().await?;
        for i in 0..3 {
            layout.start_worker(i).await?;
        }
        layout.start_indexer().await?;
        layout.envoy.spawn(&layout.logs)?;
        wait_http_ok("http://127.0.0.1:9901/ready", START_LIMIT).await?;
        Ok(layout)
    }

    pub async fn start_redis(&mut self) -> anyhow::Result<()> {
        self.redis.spawn(&self.logs)?;
        let port = self.redis_port;
        wait_until("redis-server to answer PING", START_LIMIT, || async move {
            redis_ping(port).await.then_some(())
        })
        .await
    }

    pub fn kill_redis(&mut self) {
        self.redis.kill();
    }

    pub async fn start_worker(&mut self, i: usize) -> anyhow::Result<()> {
        self.sims[i].spawn(&self.logs)?;
        wait_http_ok(
            &format!("http://127.0.0.1:{}/health", 8001 + i),
            START_LIMIT,
        )
        .await
    }

    pub fn kill_worker(&mut self, i: usize) {
        self.sims[i].kill();
    }

    pub fn signal_worker(&self, i: usize, sig: &str) -> anyhow::Result<()> {
        self.sims[i].signal(sig)
    }

    /// Starts the indexer and waits until it is ready and every running
    /// worker's stream is live.
    pub async fn start_indexer(&mut self) -> anyhow::Result<()> {
        self.indexer.spawn(&self.logs)?;
        wait_http_ok("http://127.0.0.1:9091/readyz", START_LIMIT).await?;
        let http = self.http.clone();
        wait_until("every worker's stream live", START_LIMIT, || {
            let http = http.clone();
            async move {
                let v = debug_workers(&http).await.ok()?;
                let live = workers(&v)
                    .iter()
                    .filter(|w| w.pointer("/stream/state").and_then(|s| s.as_str()) == Some("live"))
                    .count();
                (live == 3).then_some(())
            }
        })
        .await
    }

    pub fn kill_indexer(&mut self) {
        self.indexer.kill();
    }

    pub fn signal_indexer(&self, sig: &str) -> anyhow::Result<()> {
        self.indexer.signal(sig)
    }

    /// The running indexer's pid and incarnation (1 for the first start).
    pub fn indexer_pid(&self) -> Option<(u32, u32)> {
        self.indexer.pid().map(|p| (p, self.indexer.incarnation))
    }
}

/// `GET /debug/workers` of the indexer.
pub async fn debug_workers(http: &reqwest::Client) -> anyhow::Result<serde_json::Value> {
    Ok(http
        .get("http://127.0.0.1:9091/debug/workers")
        .send()
        .await?
        .error_for_status()?
        .json()
        .await?)
}

/// The worker list of a `/debug/workers` answer.
pub fn workers(v: &serde_json::Value) -> Vec<serde_json::Value> {
    kvsteer_e2e::workers_of(v)
}

fn sim_slot(paths: &Paths, sim: &SimSpec, i: usize) -> Slot {
    let port = 8001 + i;
    let cmd = vec![
        paths.sim().display().to_string(),
        "engine".into(),
        "--listen".into(),
        format!("127.0.0.1:{port}"),
        "--kv-events-topic".into(),
        format!("kv@127.0.0.1:{port}@{MODEL}"),
        "--served-model-name".into(),
        MODEL.into(),
        "--tokenizer".into(),
        paths.tokenizer().display().to_string(),
        "--kv-events-endpoint".into(),
        format!("tcp://127.0.0.1:{}", 5557 + i),
        "--replay-endpoint".into(),
        format!("tcp://127.0.0.1:{}", 5567 + i),
        "--block-size".into(),
        "16".into(),
        "--profile".into(),
        sim.profile.clone(),
        "--time-scale".into(),
        sim.time_scale.to_string(),
        "--seed".into(),
        (i + 1).to_string(),
        "--worker-id".into(),
        format!("w{}", i + 1),
    ];
    Slot::new(&format!("sim-w{}", i + 1), cmd, &paths.root)
}

/// `envoy/local/indexer.yaml` with the tokenizer resolved, the index on
/// the soak's Redis and the route windows of [`crate::warmup::window_s`].
fn indexer_config(paths: &Paths, redis_port: u16, window_s: u64) -> anyhow::Result<String> {
    let template = std::fs::read_to_string(paths.root.join("envoy/local/indexer.yaml"))
        .context("reading envoy/local/indexer.yaml")?;
    let memory = "index:\n  backend: memory\n";
    let scoring = "scoring:\n  policy: kvsteer\n";
    for part in [memory, scoring] {
        if !template.contains(part) {
            bail!("envoy/local/indexer.yaml no longer has `{part}`: update the soak");
        }
    }
    Ok(template
        .replace(
            scoring,
            &format!("{scoring}  route_window_s: {window_s}\n  placement_window_s: {window_s}\n"),
        )
        .replace(".cache/tokenizers/qwen3", &path_str(&paths.tokenizer())?)
        .replace(
            memory,
            &format!(
                "index:\n  backend: redis\n  redis:\n    url: redis://127.0.0.1:{redis_port}\n"
            ),
        ))
}

fn path_str(p: &Path) -> anyhow::Result<String> {
    p.to_str()
        .map(str::to_string)
        .with_context(|| format!("{} is not UTF-8", p.display()))
}

fn free_port() -> anyhow::Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// Whether Redis answers `PING` (inline command, no client library).
async fn redis_ping(port: u16) -> bool {
    let probe = async {
        let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port)).await?;
        s.write_all(b"PING\r\n").await?;
        let mut buf = [0u8; 16];
        let n = s.read(&mut buf).await?;
        Ok::<_, std::io::Error>(buf[..n].starts_with(b"+PONG"))
    };
    matches!(
        tokio::time::timeout(Duration::from_millis(500), probe).await,
        Ok(Ok(true))
    )
}
