//! Test and benchmark support: a throwaway `redis-server` on a free loopback
//! port, without persistence, killed on drop.
//!
//! ```ignore
//! let server = RedisServer::start().await?;
//! let cfg = RedisConfig { url: server.url(), ..RedisConfig::default() };
//! ```

use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// How long a fresh server may take to answer `PING`.
const READY_WITHIN: Duration = Duration::from_secs(10);

#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    #[error(
        "`redis-server` is not installed or not on PATH ({0}); install it (e.g. `apt-get install redis-server`)"
    )]
    NotInstalled(std::io::Error),
    #[error("cannot start redis-server: {0}")]
    Spawn(std::io::Error),
    #[error("no free port: {0}")]
    Port(std::io::Error),
    #[error("redis-server on port {port} did not answer PING within {READY_WITHIN:?}")]
    NotReady { port: u16 },
}

pub struct RedisServer {
    port: u16,
    child: Option<Child>,
}

// === impl RedisServer ===

impl RedisServer {
    /// Start a server on a free port and wait until it answers `PING`.
    pub async fn start() -> Result<Self, ServerError> {
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map_err(ServerError::Port)?
            .port();
        let mut server = Self { port, child: None };
        server.restart().await?;
        Ok(server)
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// Kill the server (its data is lost: no persistence).
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Start again on the same port (after [`Self::stop`]).
    pub async fn restart(&mut self) -> Result<(), ServerError> {
        self.stop();
        let child = Command::new("redis-server")
            .args(["--port", &self.port.to_string()])
            .args(["--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
            .args(["--enable-debug-command", "local"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| match e.kind() {
                std::io::ErrorKind::NotFound => ServerError::NotInstalled(e),
                _ => ServerError::Spawn(e),
            })?;
        self.child = Some(child);
        let client = ::redis::Client::open(self.url())
            .map_err(|e| ServerError::Spawn(std::io::Error::other(e)))?;
        let deadline = Instant::now() + READY_WITHIN;
        while Instant::now() < deadline {
            let ping = async {
                let mut con = client.get_multiplexed_async_connection().await?;
                ::redis::cmd("PING").query_async::<String>(&mut con).await
            };
            if let Ok(Ok(_)) = tokio::time::timeout(Duration::from_millis(500), ping).await {
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        Err(ServerError::NotReady { port: self.port })
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.stop();
    }
}
