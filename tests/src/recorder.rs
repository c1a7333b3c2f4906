//! A recording TCP relay: sits between Envoy and a worker and keeps the bytes
//! the worker sent, so a test can check what the client received against what
//! the worker really sent.

use std::sync::{Arc, Mutex};

use anyhow::{Context, bail};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

/// Upstream→downstream bytes of each connection, in accept order.
pub type Recording = Arc<Mutex<Vec<Vec<u8>>>>;

pub struct Recorder {
    pub recording: Recording,
    task: JoinHandle<()>,
}

impl Recorder {
    /// Listens on `listen` and relays every connection to `upstream`.
    pub async fn start(listen: &str, upstream: String) -> anyhow::Result<Recorder> {
        let listener = TcpListener::bind(listen)
            .await
            .with_context(|| format!("binding {listen}"))?;
        let recording: Recording = Arc::default();
        let rec = recording.clone();
        let task = tokio::spawn(async move {
            while let Ok((down, _)) = listener.accept().await {
                let Ok(up) = TcpStream::connect(&upstream).await else {
                    continue;
                };
                let slot = {
                    let mut r = rec.lock().unwrap_or_else(|e| e.into_inner());
                    r.push(Vec::new());
                    r.len() - 1
                };
                tokio::spawn(relay(down, up, rec.clone(), slot));
            }
        });
        Ok(Recorder { recording, task })
    }

    /// Every HTTP/1.1 response body the worker sent, de-chunked, in order.
    pub fn response_bodies(&self) -> anyhow::Result<Vec<Vec<u8>>> {
        let conns = self
            .recording
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        let mut out = Vec::new();
        for bytes in conns {
            let mut rest = &bytes[..];
            while !rest.is_empty() {
                let (body, used) = parse_response(rest)?;
                out.push(body);
                rest = &rest[used..];
            }
        }
        Ok(out)
    }
}

impl Drop for Recorder {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn relay(down: TcpStream, up: TcpStream, rec: Recording, slot: usize) {
    let (mut dr, mut dw) = down.into_split();
    let (mut ur, mut uw) = up.into_split();
    let to_up = tokio::spawn(async move {
        let _ = tokio::io::copy(&mut dr, &mut uw).await;
        let _ = uw.shutdown().await;
    });
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        let n = match ur.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        rec.lock().unwrap_or_else(|e| e.into_inner())[slot].extend_from_slice(&buf[..n]);
        if dw.write_all(&buf[..n]).await.is_err() {
            break;
        }
    }
    let _ = dw.shutdown().await;
    to_up.abort();
}

/// Parses one HTTP/1.1 response; returns its de-chunked body and the bytes used.
fn parse_response(bytes: &[u8]) -> anyhow::Result<(Vec<u8>, usize)> {
    let head_end = find(bytes, b"\r\n\r\n").context("no end of response headers")? + 4;
    let head = String::from_utf8_lossy(&bytes[..head_end]).to_ascii_lowercase();
    let mut pos = head_end;
    let mut body = Vec::new();
    if head.contains("transfer-encoding: chunked") {
        loop {
            let line_end = pos + find(&bytes[pos..], b"\r\n").context("truncated chunk size")?;
            let size_text = String::from_utf8_lossy(&bytes[pos..line_end]);
            let size = usize::from_str_radix(size_text.split(';').next().unwrap_or("").trim(), 16)
                .with_context(|| format!("bad chunk size {size_text:?}"))?;
            pos = line_end + 2;
            if size == 0 {
                pos += 2;
                break;
            }
            if bytes.len() < pos + size + 2 {
                bail!("truncated chunk");
            }
            body.extend_from_slice(&bytes[pos..pos + size]);
            pos += size + 2;
        }
    } else if let Some(len) = head
        .lines()
        .find_map(|l| l.strip_prefix("content-length:"))
        .and_then(|v| v.trim().parse::<usize>().ok())
    {
        if bytes.len() < pos + len {
            bail!("truncated body");
        }
        body.extend_from_slice(&bytes[pos..pos + len]);
        pos += len;
    } else {
        body.extend_from_slice(&bytes[pos..]);
        pos = bytes.len();
    }
    Ok((body, pos.min(bytes.len())))
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_chunked_and_sized_responses() {
        let raw = b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\r\nhello\r\n6\r\n world\r\n0\r\n\r\nHTTP/1.1 400 Bad\r\ncontent-length: 3\r\n\r\nbad";
        let (b1, used) = parse_response(raw).expect("first");
        assert_eq!(b1, b"hello world");
        let (b2, used2) = parse_response(&raw[used..]).expect("second");
        assert_eq!(b2, b"bad");
        assert_eq!(used + used2, raw.len());
    }

    #[test]
    fn rejects_truncated_chunks() {
        assert!(
            parse_response(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\r\nhe")
                .is_err()
        );
    }
}
