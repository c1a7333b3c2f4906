//! Sends concurrent Picks with large chat bodies to a running indexer, to
//! measure what they cost it (see the README's "Bounded work per pick"):
//!
//! ```text
//! cargo run -p kvsteer-indexer --example big_picks -- http://127.0.0.1:9090 3800000 2
//! grep -E 'VmRSS|VmHWM' /proc/$(pgrep -f 'kvsteer-indexer serve')/status
//! ```
//! Arguments: gRPC address, bytes of text per body, concurrent picks
//! (defaults: the local layout, 3.8 MB, 2). Each body is distinct words,
//! so no segment cache helps.

use kvsteer_proto::v1 as pb;
use std::time::Instant;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let addr = args
        .next()
        .unwrap_or_else(|| "http://127.0.0.1:9090".into());
    let bytes: usize = args.next().map_or(Ok(3_800_000), |a| a.parse())?;
    let concurrent: usize = args.next().map_or(Ok(2), |a| a.parse())?;
    let channel = tonic::transport::Channel::from_shared(addr)?
        .connect()
        .await?;
    let client = pb::router_client::RouterClient::new(channel)
        .max_encoding_message_size(usize::MAX)
        .max_decoding_message_size(usize::MAX);
    let picks = (0..concurrent).map(|i| {
        let mut client = client.clone();
        let req = body(i, bytes);
        tokio::spawn(async move {
            let start = Instant::now();
            let out = client.pick(req).await;
            (i, start.elapsed(), out)
        })
    });
    for pick in futures::future::join_all(picks).await {
        let (i, took, out) = pick?;
        match out {
            Ok(r) => {
                let d = r.into_inner().decision.unwrap_or_default();
                println!(
                    "pick {i}: {took:?} worker={} prompt_tokens={} degraded={} reason={:?}",
                    d.worker, d.prompt_tokens, d.degraded, d.reason
                );
            }
            Err(status) => println!("pick {i}: {took:?} error {status}"),
        }
    }
    Ok(())
}

fn body(i: usize, bytes: usize) -> pb::PickRequest {
    let mut text = String::with_capacity(bytes + 32);
    let mut n = 0u64;
    while text.len() < bytes {
        text.push_str(&format!("word{i}x{n} and "));
        n += 1;
    }
    pb::PickRequest {
        request_id: format!("big-{i}"),
        model: "Qwen/Qwen3-8B".into(),
        api: pb::ApiKind::Chat as i32,
        messages: vec![pb::ChatMessage {
            role: "user".into(),
            content: Some(pb::chat_message::Content::Text(text)),
            ..Default::default()
        }],
        ..Default::default()
    }
}
