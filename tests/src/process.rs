use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use anyhow::{Context, bail};

/// A child process that is killed when dropped, its output kept in a log file
/// that is printed when a test fails while it runs.
#[derive(Debug)]
pub struct Proc {
    name: String,
    child: Child,
    log: PathBuf,
}

impl Proc {
    pub fn spawn(name: &str, mut cmd: Command, log_dir: &Path) -> anyhow::Result<Proc> {
        let log = log_dir.join(format!("{name}.log"));
        let out = File::create(&log).with_context(|| format!("creating {}", log.display()))?;
        let err = out.try_clone()?;
        cmd.stdin(Stdio::null()).stdout(out).stderr(err);
        let child = cmd
            .spawn()
            .with_context(|| format!("starting {name}: {cmd:?}"))?;
        Ok(Proc {
            name: name.to_string(),
            child,
            log,
        })
    }

    /// The process id (to signal it).
    pub fn id(&self) -> u32 {
        self.child.id()
    }

    /// Whether the process has exited.
    pub fn exited(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(Some(_)))
    }

    /// The process's output so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    pub fn kill(mut self) {
        self.stop();
    }

    fn stop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.stop();
        if std::thread::panicking() {
            let log = self.log();
            let tail: String = log
                .lines()
                .rev()
                .take(40)
                .collect::<Vec<_>>()
                .into_iter()
                .rev()
                .collect::<Vec<_>>()
                .join("\n");
            eprintln!("----- last lines of {} -----\n{tail}", self.name);
        }
    }
}

/// Polls `f` every 50 ms until it returns `Some`, failing after `limit`.
pub async fn wait_until<T, F, Fut>(what: &str, limit: Duration, mut f: F) -> anyhow::Result<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        if let Some(v) = f().await {
            return Ok(v);
        }
        if tokio::time::Instant::now() >= deadline {
            bail!("timed out after {limit:?} waiting for {what}");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Starts Envoy on `config` from the repository root (the configs name the
/// wasm by a path relative to it), logging into `log_dir`, and waits until
/// its admin port (9901, every local config's) says it is ready.
pub async fn spawn_envoy(
    envoy: &Path,
    root: &Path,
    config: &Path,
    log_dir: &Path,
    limit: Duration,
) -> anyhow::Result<Proc> {
    let mut cmd = Command::new(envoy);
    cmd.current_dir(root).arg("-c").arg(config).args([
        "--disable-hot-restart",
        "--log-level",
        "info",
    ]);
    let proc = Proc::spawn("envoy", cmd, log_dir)?;
    wait_http_ok("http://127.0.0.1:9901/ready", limit).await?;
    Ok(proc)
}

/// Waits until `url` answers 2xx.
pub async fn wait_http_ok(url: &str, limit: Duration) -> anyhow::Result<()> {
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(2))
        .build()?;
    wait_until(url, limit, || {
        let client = client.clone();
        async move {
            match client.get(url).send().await {
                Ok(r) if r.status().is_success() => Some(()),
                _ => None,
            }
        }
    })
    .await
}
