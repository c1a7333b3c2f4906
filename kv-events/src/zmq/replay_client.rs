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
///
/// Holds the whole reply in memory; a consumer that applies batches as they
/// come should read a [`ReplayStream`] instead.
pub async fn fetch_replay(
    endpoint: &str,
    start_seq: u64,
    timeout: Duration,
) -> Result<Vec<ReplayedBatch>, ReplayError> {
    let mut stream = ReplayStream::open(endpoint, start_seq, timeout).await?;
    let mut out = Vec::new();
    while let Some(batch) = stream.next().await? {
        out.push(batch);
    }
    Ok(out)
}

/// One replay request whose reply is read batch by batch, so that memory
/// stays bounded by what the reader keeps rather than by the engine's buffer
/// (vLLM keeps 10,000 batches by default).
pub struct ReplayStream {
    dealer: Option<DealerSocket>,
    endpoint: String,
    timeout: Duration,
}

impl ReplayStream {
    /// Connects a DEALER to `endpoint` and sends the request. `timeout`
    /// bounds the connect and each later wait for the next reply message.
    pub async fn open(
        endpoint: &str,
        start_seq: u64,
        timeout: Duration,
    ) -> Result<Self, ReplayError> {
        let mut options = SocketOptions::default();
        options.connect_timeout(timeout);
        let mut dealer = DealerSocket::with_options(options);
        let mut stream = Self {
            dealer: None,
            endpoint: endpoint.to_owned(),
            timeout,
        };
        match tokio::time::timeout(timeout, dealer.connect(endpoint)).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                return Err(ReplayError::Connect {
                    endpoint: stream.endpoint,
                    detail: e.to_string(),
                });
            }
            Err(_) => return Err(stream.timed_out()),
        }
        let mut request = ZmqMessage::from(Bytes::new());
        request.push_back(seq_frame(start_seq));
        if let Err(e) = dealer.send(request).await {
            let _ = dealer.close().await;
            return Err(ReplayError::Send {
                endpoint: stream.endpoint,
                detail: e.to_string(),
            });
        }
        stream.dealer = Some(dealer);
        Ok(stream)
    }

    /// The next batch, or `None` after the end marker (the socket is then
    /// closed). After an error the stream is closed and yields `None`.
    pub async fn next(&mut self) -> Result<Option<ReplayedBatch>, ReplayError> {
        let Some(dealer) = self.dealer.as_mut() else {
            return Ok(None);
        };
        let result = match tokio::time::timeout(self.timeout, dealer.recv()).await {
            Ok(Ok(msg)) => match parse_reply(&msg.into_vec()) {
                Ok(ReplyMessage::Batch { seq, payload }) => {
                    Ok(Some(ReplayedBatch { seq, payload }))
                }
                Ok(ReplyMessage::End) => Ok(None),
                Err(detail) => Err(ReplayError::Protocol {
                    endpoint: self.endpoint.clone(),
                    detail,
                }),
            },
            Ok(Err(e)) => Err(ReplayError::Recv {
                endpoint: self.endpoint.clone(),
                detail: e.to_string(),
            }),
            Err(_) => Err(self.timed_out()),
        };
        if !matches!(result, Ok(Some(_))) {
            self.close().await;
        }
        result
    }

    /// Closes the socket (a reply still in flight is discarded).
    pub async fn close(&mut self) {
        if let Some(dealer) = self.dealer.take() {
            let _ = dealer.close().await;
        }
    }

    fn timed_out(&self) -> ReplayError {
        ReplayError::Timeout {
            endpoint: self.endpoint.clone(),
            timeout: self.timeout,
        }
    }
}
