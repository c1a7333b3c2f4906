//! Replay requests from the consumer side: a short-lived DEALER per request.

use std::time::Duration;

use bytes::Bytes;
use zeromq::prelude::*;
use zeromq::{DealerSocket, SocketOptions, ZmqMessage};

use super::frames::{ReplyMessage, parse_reply, seq_frame};

/// One batch returned by a replay.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReplayedBatch {
    pub seq: u64,
    pub payload: Bytes,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ReplayError {
    #[error("connect to {endpoint}: {detail}")]
    Connect { endpoint: String, detail: String },
    #[error("send request to {endpoint}: {detail}")]
    Send { endpoint: String, detail: String },
    #[error("receive from {endpoint}: {detail}")]
    Recv { endpoint: String, detail: String },
    #[error("no reply from {endpoint} within {timeout:?}")]
    Timeout { endpoint: String, timeout: Duration },
    #[error("bad reply from {endpoint}: {detail}")]
    Protocol { endpoint: String, detail: String },
}

/// Asks the replay ROUTER at `endpoint` for every buffered batch with
/// `seq >= start_seq` and collects them up to the end marker. `timeout`
/// bounds the connect and each wait for the next reply message.
pub async fn fetch_replay(
    endpoint: &str,
    start_seq: u64,
    timeout: Duration,
) -> Result<Vec<ReplayedBatch>, ReplayError> {
    let ep = || endpoint.to_owned();
    let mut options = SocketOptions::default();
    options.connect_timeout(timeout);
    let mut dealer = DealerSocket::with_options(options);
    match tokio::time::timeout(timeout, dealer.connect(endpoint)).await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => {
            return Err(ReplayError::Connect {
                endpoint: ep(),
                detail: e.to_string(),
            });
        }
        Err(_) => {
            return Err(ReplayError::Timeout {
                endpoint: ep(),
                timeout,
            });
        }
    }
    let mut request = ZmqMessage::from(Bytes::new());
    request.push_back(seq_frame(start_seq));
    dealer.send(request).await.map_err(|e| ReplayError::Send {
        endpoint: ep(),
        detail: e.to_string(),
    })?;

    let mut out = Vec::new();
    loop {
        let msg = match tokio::time::timeout(timeout, dealer.recv()).await {
            Ok(Ok(msg)) => msg,
            Ok(Err(e)) => {
                return Err(ReplayError::Recv {
                    endpoint: ep(),
                    detail: e.to_string(),
                });
            }
            Err(_) => {
                return Err(ReplayError::Timeout {
                    endpoint: ep(),
                    timeout,
                });
            }
        };
        let frames = msg.into_vec();
        match parse_reply(&frames) {
            Ok(ReplyMessage::Batch { seq, payload }) => out.push(ReplayedBatch { seq, payload }),
            Ok(ReplyMessage::End) => break,
            Err(detail) => {
                return Err(ReplayError::Protocol {
                    endpoint: ep(),
                    detail,
                });
            }
        }
    }
    let _ = dealer.close().await;
    Ok(out)
}
