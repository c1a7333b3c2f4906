//! Pick latency (the in-process picker path: tokenize → keys → lookup →
//! score) for 1k, 8k and 32k-token chat prompts, cold (new conversation:
//! nothing tokenized or indexed) and warm (the previous turn tokenized and
//! its blocks indexed on one worker; each pick is a new last turn).
//!
//! Then the same warm 1k-token pick plus its tenant's budget admission
//! (what the gRPC handler adds when budgets are configured): off, in
//! memory, in Redis (a `redis-server` this benchmark starts; skipped when
//! there is none).
//!
//! `cargo bench -p kvsteer-indexer --bench pick`

use kvsteer_indexer::config::TenantsConfig;
use kvsteer_indexer::index::redis::testing::RedisServer;
use kvsteer_indexer::tenancy::{Ending, Tenancy, TenancyMetrics};
use kvsteer_indexer::{picker::Mode, picker::report::Report};
use kvsteer_tokenize::{ChatRequest, PromptTokenizer};
use prometheus_client::registry::Registry;
use rand::{SeedableRng, rngs::SmallRng};
use std::{
    sync::Arc,
    time::{Duration, Instant},
};

mod common;
use common::{MODEL, chat_input, conversation, next_turn, percentiles, stored, tokenizing_picker};

fn main() {
    let (picker, tok, index) = tokenizing_picker();
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let mut rng = SmallRng::seed_from_u64(7);
    let mut seq = 0u64;
    let mut pick = |req: ChatRequest| {
        seq += 1;
        let id = format!("r{seq}");
        let input = chat_input(id.clone(), req);
        let start = Instant::now();
        let out = rt.block_on(picker.pick(input, Mode::Commit));
        let took = start.elapsed();
        picker.report(&Report::done(&id, 0.0), Instant::now());
        (took, out)
    };

    // Control: a 200 µs spin, timed the same way. On a shared machine its
    // p99 shows the scheduler's share of the pick's tail.
    let spin: Vec<Duration> = (0..2_000)
        .map(|_| {
            let start = Instant::now();
            while start.elapsed() < Duration::from_micros(200) {
                std::hint::spin_loop();
            }
            start.elapsed()
        })
        .collect();
    let [s50, s90, s99] = percentiles(spin);
    println!("control: 200µs spin p50 {s50:.3?} p90 {s90:.3?} p99 {s99:.3?}");
    println!("pick latency, 8 workers, Qwen3 tokenizer: p50 p90 p99");
    for (tokens, cold_n, warm_n) in [(1_000, 100, 2_000), (8_000, 30, 1_000), (32_000, 10, 300)] {
        // Cold: a new conversation every time.
        let convs: Vec<ChatRequest> = (0..cold_n)
            .map(|_| conversation(&tok, &mut rng, tokens))
            .collect();
        tok.clear_cache();
        let cold: Vec<Duration> = convs.into_iter().map(|c| pick(c).0).collect();

        // Warm: the previous turn is tokenized and indexed on w3.
        let prev = conversation(&tok, &mut rng, tokens);
        let ids = tok.chat_token_ids(&prev).unwrap();
        rt.block_on(index.apply_batch(2, &stored(&ids, tokens as u64 * 1_000)));
        let mut matched = 0;
        let warm: Vec<Duration> = (0..warm_n)
            .map(|_| {
                let (took, out) = pick(next_turn(&prev, &mut rng));
                matched = out.decision.matched_tokens;
                took
            })
            .collect();
        let [c50, c90, c99] = percentiles(cold);
        let [w50, w90, w99] = percentiles(warm);
        println!(
            "{:>6} tokens  cold {c50:>9.3?} {c90:>9.3?} {c99:>9.3?}   warm {w50:>9.3?} {w90:>9.3?} {w99:>9.3?}   (warm: {matched} matched)",
            ids.len(),
        );
    }

    // Redis needs the IO and time drivers.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    budgets(&picker, &index, &tok, &rt, &mut rng);
}

/// Warm 1k-token picks followed by the tenant's admission, per store.
fn budgets(
    picker: &kvsteer_indexer::picker::Picker,
    index: &kvsteer_indexer::index::Index,
    tok: &Arc<PromptTokenizer>,
    rt: &tokio::runtime::Runtime,
    rng: &mut SmallRng,
) {
    const N: usize = 2_000;
    let _runtime = rt.enter();
    let redis = rt.block_on(RedisServer::start()).ok();
    let tenancy = |store: &str| {
        let yaml = format!(
            "default: {{budget: {{tokens_per_minute: 1000000000, requests_per_minute: 1000000000, max_concurrent: 100000}}}}\nbudget_store: {store}\n"
        );
        let cfg: TenantsConfig = serde_norway::from_str(&yaml).expect("tenants config");
        let metrics = TenancyMetrics::new(&mut Registry::default(), &[]);
        Tenancy::new(cfg, None, "bench", Duration::from_secs(600), metrics).expect("tenancy")
    };
    let mut variants = vec![
        (
            "off",
            Tenancy::disabled(TenancyMetrics::new(&mut Registry::default(), &[])),
        ),
        ("memory", tenancy("{backend: memory}")),
    ];
    match &redis {
        Some(r) => variants.push((
            "redis",
            tenancy(&format!(
                "{{backend: redis, url: \"{}\", timeout_ms: 1000}}",
                r.url()
            )),
        )),
        None => println!("budgets in redis: skipped (no redis-server)"),
    }
    let prev = conversation(tok, rng, 1_000);
    let ids = tok.chat_token_ids(&prev).unwrap();
    rt.block_on(index.apply_batch(2, &stored(&ids, 77_000_000)));
    println!("pick + budget admission, 1k tokens warm, {N} picks: p50 p90 p99");
    for (name, t) in variants {
        let mut took = Vec::with_capacity(N);
        for i in 0..N {
            let id = format!("b-{name}-{i}");
            let input = chat_input(id.clone(), next_turn(&prev, rng));
            let start = Instant::now();
            let out = rt.block_on(picker.pick(input, Mode::Commit));
            let admitted =
                rt.block_on(t.admit(&id, "tenant", MODEL, out.decision.prompt_tokens, Some(64)));
            took.push(start.elapsed());
            assert!(admitted.is_ok(), "{name}: {admitted:?}");
            picker.report(&Report::done(&id, 0.0), Instant::now());
            rt.block_on(t.settle(
                &id,
                Ending::Done {
                    used_tokens: Some(100),
                },
            ));
        }
        let [p50, p90, p99] = percentiles(took);
        println!("  budgets {name:<7} {p50:>9.3?} {p90:>9.3?} {p99:>9.3?}");
    }
}
