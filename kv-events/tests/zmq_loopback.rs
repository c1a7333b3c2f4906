//! Publisher ↔ subscriber over loopback TCP (free ports, every wait bounded).
#![cfg(feature = "zmq")]

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use kvsteer_kv_events::zmq::{
    Publisher, PublisherConfig, StreamItem, SubscriberConfig, spawn_probed_subscriber,
    spawn_subscriber,
};
use kvsteer_kv_events::{BlockHash, BlockRemoved, Encoding, EventBatch, KvEvent};
use tokio::sync::{Notify, mpsc, watch};
use tokio::time::timeout;
use zeromq::prelude::*;
use zeromq::{DealerSocket, ZmqMessage};

const WAIT: Duration = Duration::from_secs(5);
const TOPIC: &str = "kv@10.0.0.1:8000@Qwen/Qwen3-8B";

fn batch(engine: u64, i: u64) -> EventBatch {
    EventBatch {
        ts: 1_767_225_600.0 + (engine * 1000 + i) as f64,
        events: vec![KvEvent::BlockRemoved(BlockRemoved {
            block_hashes: vec![BlockHash::U64(engine << 32 | i)],
            medium: Some("GPU".into()),
            group_idx: Some(0),
            ..BlockRemoved::default()
        })],
        data_parallel_rank: Some(0),
    }
}

fn pub_config(pub_ep: &str, replay_ep: &str) -> PublisherConfig {
    PublisherConfig {
        pub_endpoint: pub_ep.into(),
        replay_endpoint: Some(replay_ep.into()),
        topic: TOPIC.into(),
        encoding: Encoding::Map,
        replay_buffer_batches: 100,
    }
}

async fn publisher() -> Publisher {
    Publisher::bind(pub_config("tcp://127.0.0.1:0", "tcp://127.0.0.1:0"))
        .await
        .expect("bind on free ports")
}

struct Sub {
    rx: mpsc::Receiver<StreamItem>,
    stop: watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
}

impl Sub {
    fn start(p: &Publisher) -> Sub {
        Sub::start_with(p, |_| {}, Arc::new(Notify::new()))
    }

    /// A subscriber to `p`, its config changed by `adjust`, probed by `probe`.
    fn start_with(
        p: &Publisher,
        adjust: impl FnOnce(&mut SubscriberConfig),
        probe: Arc<Notify>,
    ) -> Sub {
        let (pub_ep, replay_ep) = p.local_endpoints();
        let mut cfg = SubscriberConfig {
            endpoint: pub_ep,
            replay_endpoint: replay_ep,
            topic: "kv@10.0.0.1:8000@".into(),
            bind: false,
            max_replay_retries: 2,
            backoff_initial: Duration::from_millis(20),
            backoff_max: Duration::from_millis(200),
            reconnect_max: Duration::from_millis(200),
            idle_reconnect: Some(Duration::from_millis(300)),
            down_grace: None,
        };
        adjust(&mut cfg);
        let (tx, rx) = mpsc::channel(16);
        let (stop, stop_rx) = watch::channel(false);
        let task = spawn_probed_subscriber(cfg, tx, stop_rx, probe);
        Sub { rx, stop, task }
    }

    async fn next(&mut self) -> StreamItem {
        timeout(WAIT, self.rx.recv())
            .await
            .expect("stream item within the timeout")
            .expect("subscriber alive")
    }

    /// The next item that is not a connection notice.
    async fn next_event(&mut self) -> StreamItem {
        loop {
            match self.next().await {
                StreamItem::Connected | StreamItem::Disconnected => {}
                other => return other,
            }
        }
    }

    async fn wait_connected(&mut self) {
        while self.next().await != StreamItem::Connected {}
    }

    /// Next batch, returning (seq, batch, replayed); notices other than
    /// batches fail the test unless `allow` accepts them.
    async fn next_batch(&mut self, allow: impl Fn(&StreamItem) -> bool) -> (u64, EventBatch, bool) {
        loop {
            match self.next_event().await {
                StreamItem::Batch {
                    seq,
                    batch,
                    skipped,
                    replayed,
                } => {
                    assert_eq!(skipped, 0);
                    return (seq, batch, replayed);
                }
                other if allow(&other) => {}
                other => panic!("unexpected {other:?}"),
            }
        }
    }

    async fn stop(self) {
        let _ = self.stop.send(true);
        timeout(WAIT, self.task)
            .await
            .expect("subscriber stops on shutdown")
            .expect("no panic");
    }
}

/// Publishes batches until one arrives live (the SUB subscription reaches
/// the PUB asynchronously), checking every batch arrives once, in order.
async fn warm_up_live(p: &Publisher, sub: &mut Sub, engine: u64, next_seq: &mut u64) {
    for _ in 0..100 {
        let seq = p.publish(&batch(engine, *next_seq)).await.expect("publish");
        assert_eq!(seq, *next_seq);
        *next_seq += 1;
        let mut live = false;
        while let Ok(Some(item)) = timeout(Duration::from_millis(50), sub.rx.recv()).await {
            if let StreamItem::Batch {
                seq,
                batch: b,
                replayed,
                ..
            } = item
            {
                assert_eq!(b, batch(engine, seq));
                live |= !replayed;
                if seq + 1 == *next_seq {
                    break;
                }
            }
        }
        if live {
            return;
        }
    }
    panic!("no live delivery");
}

#[tokio::test]
async fn live_delivery_in_order() {
    let p = publisher().await;
    let mut sub = Sub::start(&p);
    sub.wait_connected().await;
    let mut next = 0;
    warm_up_live(&p, &mut sub, 1, &mut next).await;
    // Now the subscription is in place: a burst arrives live and in order.
    let start = next;
    for i in start..start + 20 {
        assert_eq!(p.publish(&batch(1, i)).await.expect("publish"), i);
    }
    for i in start..start + 20 {
        let (seq, b, _) = sub.next_batch(|_| false).await;
        assert_eq!(seq, i);
        assert_eq!(b, batch(1, i));
    }
    sub.stop().await;
    p.shutdown().await;
}

#[tokio::test]
async fn late_subscriber_is_warmed_by_replay() {
    let p = publisher().await;
    for i in 0..3 {
        p.publish(&batch(1, i)).await.expect("publish");
    }
    let mut sub = Sub::start(&p);
    for i in 0..3 {
        let (seq, b, replayed) = sub.next_batch(|_| false).await;
        assert_eq!((seq, replayed), (i, true));
        assert_eq!(b, batch(1, i));
    }
    sub.stop().await;
    p.shutdown().await;
}

#[tokio::test]
async fn gap_is_filled_by_replay() {
    let p = publisher().await;
    let mut sub = Sub::start(&p);
    sub.wait_connected().await;
    let mut next = 0;
    warm_up_live(&p, &mut sub, 1, &mut next).await;
    let lost_from = next;
    for i in lost_from..lost_from + 2 {
        assert_eq!(p.publish_unsent(&batch(1, i)).await, i);
    }
    let live_seq = p.publish(&batch(1, lost_from + 2)).await.expect("publish");
    assert_eq!(
        sub.next_event().await,
        StreamItem::Gap {
            expected: lost_from,
            got: live_seq
        }
    );
    for i in lost_from..=live_seq {
        let (seq, b, replayed) = sub.next_batch(|_| false).await;
        assert_eq!(seq, i);
        assert_eq!(b, batch(1, i));
        if i < live_seq {
            assert!(replayed, "seq {i} can only come from replay");
        }
    }
    sub.stop().await;
    p.shutdown().await;
}

#[tokio::test]
async fn publisher_restart_is_a_reset() {
    let a = publisher().await;
    let (pub_ep, replay_ep) = a.local_endpoints();
    let replay_ep = replay_ep.expect("replay bound");
    let mut sub = Sub::start(&a);
    sub.wait_connected().await;
    let mut next = 0;
    warm_up_live(&a, &mut sub, 1, &mut next).await;
    let last = next - 1;
    a.shutdown().await;

    // Same ports, seq from 0 again.
    let b = timeout(WAIT, async {
        loop {
            match Publisher::bind(pub_config(&pub_ep, &replay_ep)).await {
                Ok(b) => break b,
                Err(_) => tokio::time::sleep(Duration::from_millis(20)).await,
            }
        }
    })
    .await
    .expect("rebind the same ports");
    assert_eq!(b.local_endpoints(), (pub_ep, Some(replay_ep)));
    for i in 0..2 {
        assert_eq!(b.publish(&batch(2, i)).await.expect("publish"), i);
    }
    let reset = sub.next_event().await;
    let StreamItem::Reset { last_seq, .. } = reset else {
        panic!("expected Reset, got {reset:?}")
    };
    assert_eq!(last_seq, last);
    for i in 0..2 {
        let (seq, got, _) = sub.next_batch(|_| false).await;
        assert_eq!(seq, i);
        assert_eq!(got, batch(2, i));
    }
    sub.stop().await;
    b.shutdown().await;
}

// === liveness: engine loss, give-up, restart found at reconnect ===

/// Binds a publisher on the ports `a` used, retrying while they are released.
async fn rebind(pub_ep: &str, replay_ep: &str) -> Publisher {
    timeout(WAIT, async {
        loop {
            match Publisher::bind(pub_config(pub_ep, replay_ep)).await {
                Ok(b) => break b,
                Err(_) => tokio::time::sleep(Duration::from_millis(20)).await,
            }
        }
    })
    .await
    .expect("rebind the same ports")
}

/// A killed engine is reported at once by the socket monitor (no idle
/// probe here), given up after the grace, and what comes back later on the
/// same ports is read from its first batch, without a `Reset`.
#[tokio::test]
async fn engine_loss_is_reported_at_once_and_given_up_after_the_grace() {
    let grace = Duration::from_millis(400);
    let a = publisher().await;
    let (pub_ep, replay_ep) = a.local_endpoints();
    let replay_ep = replay_ep.expect("replay bound");
    let mut sub = Sub::start_with(
        &a,
        |c| {
            c.idle_reconnect = None;
            c.down_grace = Some(grace);
        },
        Arc::new(Notify::new()),
    );
    sub.wait_connected().await;
    let mut next = 0;
    warm_up_live(&a, &mut sub, 1, &mut next).await;
    let killed = Instant::now();
    a.shutdown().await;
    assert_eq!(sub.next().await, StreamItem::Disconnected);
    let noticed = killed.elapsed();
    let gone = sub.next().await;
    let StreamItem::EngineGone { down_for } = gone else {
        panic!("expected EngineGone, got {gone:?}")
    };
    assert!(down_for >= grace, "{down_for:?}");
    eprintln!("disconnect noticed after {noticed:?}, given up after {down_for:?}");

    let b = rebind(&pub_ep, &replay_ep).await;
    for i in 0..2 {
        assert_eq!(b.publish_unsent(&batch(2, i)).await, i);
    }
    // Replayed from 0 on reconnect: the old engine's seq is forgotten.
    for i in 0..2 {
        let (seq, got, replayed) = sub.next_batch(|_| false).await;
        assert_eq!((seq, replayed), (i, true));
        assert_eq!(got, batch(2, i));
    }
    assert_eq!(sub.next().await, StreamItem::Connected);
    sub.stop().await;
    b.shutdown().await;
}

/// An engine restarted within the grace, publishing nothing live, is found
/// at reconnect by the resume replay (no idle probe, no live batch).
#[tokio::test]
async fn restart_is_found_at_reconnect() {
    let a = publisher().await;
    let (pub_ep, replay_ep) = a.local_endpoints();
    let replay_ep = replay_ep.expect("replay bound");
    let mut sub = Sub::start_with(&a, |c| c.idle_reconnect = None, Arc::new(Notify::new()));
    sub.wait_connected().await;
    let mut next = 0;
    warm_up_live(&a, &mut sub, 1, &mut next).await;
    a.shutdown().await;
    let restarted = Instant::now();
    let b = rebind(&pub_ep, &replay_ep).await;
    let reset = sub.next_event().await;
    assert!(
        matches!(reset, StreamItem::Reset { last_seq, got: 0 } if last_seq == next - 1),
        "expected Reset, got {reset:?}"
    );
    eprintln!("restart found {:?} after the new bind", restarted.elapsed());
    assert_eq!(sub.next().await, StreamItem::Connected);
    sub.stop().await;
    b.shutdown().await;
}

/// A probe asked for by the consumer replays what the live stream lost.
#[tokio::test]
async fn probe_on_request_replays_lost_batches() {
    let p = publisher().await;
    let probe = Arc::new(Notify::new());
    let mut sub = Sub::start_with(&p, |c| c.idle_reconnect = None, probe.clone());
    sub.wait_connected().await;
    let mut next = 0;
    warm_up_live(&p, &mut sub, 1, &mut next).await;
    assert_eq!(p.publish_unsent(&batch(1, next)).await, next);
    probe.notify_one();
    let (seq, got, replayed) = sub.next_batch(|_| false).await;
    assert_eq!((seq, replayed), (next, true));
    assert_eq!(got, batch(1, next));
    sub.stop().await;
    p.shutdown().await;
}

// === the replay wire format, against the vLLM 0.33 transcripts (replay.md) ===

/// Capture 3 of live_stream.md: six BlockRemoved batches and one AllBlocksCleared.
const CAPTURE3: [&str; 7] = [
    "93cb41da556e590000009184a474797065ac426c6f636b52656d6f766564ac626c6f636b5f68617368657391cf0e3ed4c679ce40efa66d656469756da3475055a967726f75705f6964780000",
    "93cb41da556e594000009184a474797065ac426c6f636b52656d6f766564ac626c6f636b5f68617368657391cfd6ffb81976b79068a66d656469756da3475055a967726f75705f6964780000",
    "93cb41da556e598000009184a474797065ac426c6f636b52656d6f766564ac626c6f636b5f68617368657391cf9a710993bbb9d8c3a66d656469756da3475055a967726f75705f6964780000",
    "93cb41da556e59c000009184a474797065ac426c6f636b52656d6f766564ac626c6f636b5f68617368657391cfdd5f06a55f1b8b5da66d656469756da3475055a967726f75705f6964780000",
    "93cb41da556e5a0000009184a474797065ac426c6f636b52656d6f766564ac626c6f636b5f68617368657391cf23612fc775235f81a66d656469756da3475055a967726f75705f6964780000",
    "93cb41da556e5a4000009184a474797065ac426c6f636b52656d6f766564ac626c6f636b5f68617368657391cf260184682b045a3da66d656469756da3475055a967726f75705f6964780000",
    "93cb41da556e5a8000009181a474797065b0416c6c426c6f636b73436c656172656400",
];

fn unhex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).expect("hex"))
        .collect()
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// A reply rendered like the transcripts: `(empty) | <topic> | seq | payload`.
fn render(msg: &ZmqMessage) -> String {
    msg.iter()
        .map(|f| match f.as_ref() {
            [] => "(empty)".to_owned(),
            t if t == TOPIC.as_bytes() => "<topic>".to_owned(),
            other => hex(other),
        })
        .collect::<Vec<_>>()
        .join(" | ")
}

fn transcript(seqs: &[usize]) -> Vec<String> {
    let mut out: Vec<String> = seqs
        .iter()
        .map(|&s| format!("(empty) | <topic> | {s:016x} | {}", CAPTURE3[s]))
        .collect();
    out.push("(empty) | (empty) | ffffffffffffffff | (empty)".to_owned());
    out
}

async fn request(dealer: &mut DealerSocket, frames: &[&[u8]]) {
    let mut msg = ZmqMessage::from(Bytes::copy_from_slice(frames[0]));
    for f in &frames[1..] {
        msg.push_back(Bytes::copy_from_slice(f));
    }
    dealer.send(msg).await.expect("send request");
}

async fn replies(dealer: &mut DealerSocket) -> Vec<String> {
    let mut out = Vec::new();
    loop {
        let msg = timeout(WAIT, dealer.recv())
            .await
            .expect("reply within timeout")
            .expect("recv");
        let line = render(&msg);
        let end = line.ends_with("ffffffffffffffff | (empty)");
        out.push(line);
        if end {
            return out;
        }
    }
}

#[tokio::test]
async fn replay_wire_format_matches_vllm() {
    let mut cfg = pub_config("tcp://127.0.0.1:0", "tcp://127.0.0.1:0");
    cfg.replay_buffer_batches = 4;
    let p = Publisher::bind(cfg).await.expect("bind");
    for payload in &CAPTURE3[..6] {
        p.publish_payload(Bytes::from(unhex(payload)))
            .await
            .expect("publish");
    }
    let replay_ep = p.local_endpoints().1.expect("replay endpoint");
    let mut dealer = DealerSocket::new();
    timeout(WAIT, dealer.connect(&replay_ep))
        .await
        .expect("connect in time")
        .expect("connect");

    request(&mut dealer, &[b"", &3u64.to_be_bytes()]).await;
    assert_eq!(replies(&mut dealer).await, transcript(&[3, 4, 5]));

    // Older than the buffer: silently starts at the oldest (seq 2).
    request(&mut dealer, &[b"", &0u64.to_be_bytes()]).await;
    assert_eq!(replies(&mut dealer).await, transcript(&[2, 3, 4, 5]));

    // Newer than the newest: only the end marker.
    request(&mut dealer, &[b"", &100u64.to_be_bytes()]).await;
    assert_eq!(replies(&mut dealer).await, transcript(&[]));

    // 4-byte and empty start frames are read as big-endian ints.
    request(&mut dealer, &[b"", &[0, 0, 0, 4]]).await;
    assert_eq!(replies(&mut dealer).await, transcript(&[4, 5]));
    request(&mut dealer, &[b"", b""]).await;
    assert_eq!(replies(&mut dealer).await, transcript(&[2, 3, 4, 5]));
    request(&mut dealer, &[b"", &[5, 0, 0, 0, 0, 0, 0, 0]]).await;
    assert_eq!(replies(&mut dealer).await, transcript(&[]));

    // Malformed requests get no reply at all.
    request(&mut dealer, &[&3u64.to_be_bytes()]).await;
    request(&mut dealer, &[b"", &3u64.to_be_bytes(), b"x"]).await;
    assert!(
        timeout(Duration::from_millis(300), dealer.recv())
            .await
            .is_err(),
        "malformed requests must not be answered"
    );

    // One more live batch, then start 5.
    p.publish_payload(Bytes::from(unhex(CAPTURE3[6])))
        .await
        .expect("publish");
    request(&mut dealer, &[b"", &5u64.to_be_bytes()]).await;
    assert_eq!(replies(&mut dealer).await, transcript(&[5, 6]));
    p.shutdown().await;
}

#[tokio::test]
async fn undecodable_payload_is_reported_and_stream_continues() {
    let p = publisher().await;
    let mut sub = Sub::start(&p);
    sub.wait_connected().await;
    let mut next = 0;
    warm_up_live(&p, &mut sub, 1, &mut next).await;
    let bad = p
        .publish_payload(Bytes::from_static(b"\x81\xa1x\x00"))
        .await
        .expect("publish");
    let good = p.publish(&batch(1, next + 1)).await.expect("publish");
    match sub.next_event().await {
        StreamItem::Malformed { seq, .. } => assert_eq!(seq, bad),
        other => panic!("expected Malformed, got {other:?}"),
    }
    let (seq, b, _) = sub.next_batch(|_| false).await;
    assert_eq!((seq, b), (good, batch(1, next + 1)));
    sub.stop().await;
    p.shutdown().await;
}

/// A restarted engine whose live messages never reach the subscriber is
/// still noticed: the idle probe replays and sees the seq went back.
#[tokio::test]
async fn restart_with_lost_live_messages_is_found_by_idle_probe() {
    let a = publisher().await;
    let (pub_ep, replay_ep) = a.local_endpoints();
    let replay_ep = replay_ep.expect("replay bound");
    let mut sub = Sub::start(&a);
    sub.wait_connected().await;
    let mut next = 0;
    warm_up_live(&a, &mut sub, 1, &mut next).await;
    // Two more so the new engine (2 batches) is behind the old one.
    for _ in 0..2 {
        a.publish(&batch(1, next)).await.expect("publish");
        let (seq, _, _) = sub.next_batch(|_| false).await;
        assert_eq!(seq, next);
        next += 1;
    }
    a.shutdown().await;
    let b = timeout(WAIT, async {
        loop {
            match Publisher::bind(pub_config(&pub_ep, &replay_ep)).await {
                Ok(b) => break b,
                Err(_) => tokio::time::sleep(Duration::from_millis(20)).await,
            }
        }
    })
    .await
    .expect("rebind the same ports");
    for i in 0..2 {
        assert_eq!(b.publish_unsent(&batch(2, i)).await, i);
    }
    // `got` is the newest seq the new engine had when the subscriber looked
    // (it may look before `b` published anything).
    let reset = sub.next_event().await;
    assert!(
        matches!(reset, StreamItem::Reset { last_seq, got } if last_seq == next - 1 && got <= 1),
        "expected Reset, got {reset:?}"
    );
    for i in 0..2 {
        let (seq, got, replayed) = sub.next_batch(|_| false).await;
        assert_eq!((seq, replayed), (i, true));
        assert_eq!(got, batch(2, i));
    }
    sub.stop().await;
    b.shutdown().await;
}

#[tokio::test]
async fn shutdown_stops_a_subscriber_waiting_for_a_dead_engine() {
    // Reserve a port, then free it: nothing listens there.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("free port")
        .port();
    let cfg = SubscriberConfig {
        endpoint: format!("tcp://127.0.0.1:{port}"),
        replay_endpoint: Some(format!("tcp://127.0.0.1:{port}")),
        ..SubscriberConfig::default()
    };
    let (tx, mut rx) = mpsc::channel(4);
    let (stop, stop_rx) = watch::channel(false);
    let task = spawn_subscriber(cfg, tx, stop_rx);
    assert!(
        timeout(Duration::from_millis(200), rx.recv())
            .await
            .is_err(),
        "nothing to report without an engine"
    );
    stop.send(true).expect("send shutdown");
    timeout(WAIT, task)
        .await
        .expect("stops promptly")
        .expect("no panic");
}

/// vLLM connects its PUB to a non-wildcard endpoint; the SUB binds there.
#[tokio::test]
async fn bind_mode_receives_from_a_connecting_publisher() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("free port")
        .port();
    let endpoint = format!("tcp://127.0.0.1:{port}");
    let cfg = SubscriberConfig {
        endpoint: endpoint.clone(),
        bind: true,
        idle_reconnect: None,
        ..SubscriberConfig::default()
    };
    let (tx, mut rx) = mpsc::channel(16);
    let (stop, stop_rx) = watch::channel(false);
    let task = spawn_subscriber(cfg, tx, stop_rx);
    let first = timeout(WAIT, rx.recv()).await.expect("in time");
    assert_eq!(first, Some(StreamItem::Connected));

    let mut pub_socket = zeromq::PubSocket::new();
    timeout(WAIT, pub_socket.connect(&endpoint))
        .await
        .expect("connect in time")
        .expect("connect");
    // Keep publishing until the subscription has reached the PUB.
    let mut got = Vec::new();
    for seq in 0..100u64 {
        let payload = kvsteer_kv_events::encode_batch(&batch(3, seq), Encoding::Map);
        let mut msg = ZmqMessage::from(Bytes::from_static(TOPIC.as_bytes()));
        msg.push_back(Bytes::copy_from_slice(&seq.to_be_bytes()));
        msg.push_back(Bytes::from(payload));
        pub_socket.send(msg).await.expect("send");
        while let Ok(Some(item)) = timeout(Duration::from_millis(30), rx.recv()).await {
            if let StreamItem::Batch { seq, batch: b, .. } = item {
                assert_eq!(b, batch(3, seq));
                got.push(seq);
            }
        }
        if got.len() >= 3 {
            break;
        }
    }
    assert!(got.len() >= 3, "received {got:?}");
    assert!(
        got.windows(2).all(|w| w[1] == w[0] + 1),
        "in order: {got:?}"
    );
    stop.send(true).expect("shutdown");
    timeout(WAIT, task).await.expect("stops").expect("no panic");
}

/// Bind mode keeps its socket: a publisher leaving is `Disconnected`, given
/// up after the grace, and one connecting again is `Connected`.
#[tokio::test]
async fn bind_mode_reports_a_publisher_leaving_and_coming_back() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("free port")
        .port();
    let endpoint = format!("tcp://127.0.0.1:{port}");
    let cfg = SubscriberConfig {
        endpoint: endpoint.clone(),
        bind: true,
        idle_reconnect: None,
        down_grace: Some(Duration::from_millis(200)),
        ..SubscriberConfig::default()
    };
    let (tx, mut rx) = mpsc::channel(16);
    let (stop, stop_rx) = watch::channel(false);
    let task = spawn_subscriber(cfg, tx, stop_rx);
    async fn next(rx: &mut mpsc::Receiver<StreamItem>) -> StreamItem {
        timeout(WAIT, rx.recv())
            .await
            .expect("in time")
            .expect("subscriber alive")
    }
    assert_eq!(next(&mut rx).await, StreamItem::Connected);

    let mut first = zeromq::PubSocket::new();
    timeout(WAIT, first.connect(&endpoint))
        .await
        .expect("connect in time")
        .expect("connect");
    let _ = first.close().await;
    assert_eq!(next(&mut rx).await, StreamItem::Disconnected);
    assert!(matches!(next(&mut rx).await, StreamItem::EngineGone { .. }));

    let mut second = zeromq::PubSocket::new();
    timeout(WAIT, second.connect(&endpoint))
        .await
        .expect("connect in time")
        .expect("connect");
    assert_eq!(next(&mut rx).await, StreamItem::Connected);
    let _ = second.close().await;
    stop.send(true).expect("shutdown");
    timeout(WAIT, task).await.expect("stops").expect("no panic");
}

/// A replay ROUTER that answers its first request with a batch missing in
/// the middle (as a libzmq ROUTER past its high-water mark drops messages:
/// vLLM's replay loop sends without waiting for the reader), and later ones
/// whole. The subscriber asks again from the last batch it delivered and
/// loses nothing.
#[tokio::test]
async fn a_reply_missing_batches_midway_is_asked_again() {
    let live = Publisher::bind(PublisherConfig {
        replay_endpoint: None,
        ..pub_config("tcp://127.0.0.1:0", "unused")
    })
    .await
    .expect("bind PUB");
    let mut router = zeromq::RouterSocket::new();
    let replay_ep = router.bind("tcp://127.0.0.1:0").await.expect("bind ROUTER");
    let replay_ep = format!("tcp://{replay_ep}").replace("tcp://tcp://", "tcp://");
    let payloads: Vec<Bytes> = (0..6)
        .map(|i| kvsteer_kv_events::encode_batch(&batch(7, i), Encoding::Map).into())
        .collect();
    let requests = Arc::new(std::sync::Mutex::new(Vec::new()));
    let server = {
        let (payloads, requests) = (payloads.clone(), requests.clone());
        tokio::spawn(async move {
            for round in 0..2 {
                let msg = router.recv().await.expect("replay request");
                let frames = msg.into_vec();
                let start = u64::from_be_bytes(frames[2][..8].try_into().unwrap());
                requests.lock().unwrap().push(start);
                for seq in start..6 {
                    if round == 0 && seq == 3 {
                        continue;
                    }
                    let reply = vec![
                        frames[0].clone(),
                        Bytes::new(),
                        Bytes::from(TOPIC),
                        Bytes::copy_from_slice(&seq.to_be_bytes()),
                        payloads[seq as usize].clone(),
                    ];
                    router
                        .send(ZmqMessage::try_from(reply).unwrap())
                        .await
                        .unwrap();
                }
                let end = vec![
                    frames[0].clone(),
                    Bytes::new(),
                    Bytes::new(),
                    Bytes::from_static(&[0xff; 8]),
                    Bytes::new(),
                ];
                router
                    .send(ZmqMessage::try_from(end).unwrap())
                    .await
                    .unwrap();
            }
        })
    };
    let (pub_ep, _) = live.local_endpoints();
    let (tx, mut rx) = mpsc::channel(4);
    let (stop, stop_rx) = watch::channel(false);
    let cfg = SubscriberConfig {
        endpoint: pub_ep,
        replay_endpoint: Some(replay_ep),
        topic: "kv@".into(),
        bind: false,
        max_replay_retries: 0,
        backoff_initial: Duration::from_millis(20),
        backoff_max: Duration::from_millis(200),
        reconnect_max: Duration::from_millis(200),
        idle_reconnect: None,
        down_grace: None,
    };
    let task = spawn_subscriber(cfg, tx, stop_rx);
    let mut seqs = Vec::new();
    while seqs.len() < 6 {
        match timeout(WAIT, rx.recv())
            .await
            .expect("item")
            .expect("alive")
        {
            StreamItem::Batch {
                seq,
                replayed,
                batch: b,
                ..
            } => {
                assert!(replayed);
                assert_eq!(b, batch(7, seq));
                seqs.push(seq);
            }
            StreamItem::Connected => {}
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(seqs, [0, 1, 2, 3, 4, 5]);
    timeout(WAIT, server)
        .await
        .expect("server done")
        .expect("no panic");
    // First from the start, then from the last batch delivered before the hole.
    assert_eq!(*requests.lock().unwrap(), [0, 2]);
    let _ = stop.send(true);
    timeout(WAIT, task).await.expect("stops").expect("no panic");
    live.shutdown().await;
}
