//! Core-level behaviour: prefix caching, events, evictions, reset,
//! preemption and determinism, driven in virtual time.

use kvsteer_sim::engine::{
    CacheEvent, Engine, EngineConfig, FinishedRequest, RejectReason, ResetOutcome, SimRequest,
    StepOutput,
};
use kvsteer_sim::profile::TimingProfile;

fn config(profile: &str) -> EngineConfig {
    let mut cfg = EngineConfig::new(TimingProfile::by_name(profile).unwrap());
    cfg.hash_seed = 7;
    cfg.seed = 11;
    cfg
}

fn request(id: u64, prompt: Vec<u32>, max_tokens: usize, arrival: f64) -> SimRequest {
    SimRequest {
        id,
        prompt_token_ids: prompt,
        max_tokens,
        min_tokens: 0,
        ignore_eos: true,
        arrival,
        lora: None,
        cache_salt: None,
    }
}

/// Steps until idle; returns every step output.
fn run(engine: &mut Engine, mut now: f64) -> Vec<StepOutput> {
    let mut steps = Vec::new();
    while let Some(out) = engine.step(now) {
        now = out.end();
        steps.push(out);
        assert!(steps.len() < 100_000, "engine does not converge");
    }
    steps
}

fn finished(steps: &[StepOutput]) -> Vec<FinishedRequest> {
    steps.iter().flat_map(|s| s.finished.clone()).collect()
}

fn stored_hashes(steps: &[StepOutput]) -> Vec<u64> {
    steps
        .iter()
        .flat_map(|s| &s.events)
        .filter_map(|e| match e {
            CacheEvent::Stored { block_hashes, .. } => Some(block_hashes.clone()),
            _ => None,
        })
        .flatten()
        .collect()
}

fn prompt(prefix: u32, shared: usize, own: usize) -> Vec<u32> {
    let mut p: Vec<u32> = (0..shared as u32).map(|i| 100 + i % 5000).collect();
    p.extend((0..own as u32).map(|i| 20_000 + prefix * 1000 + i));
    p
}

#[test]
fn shared_prefix_hits_publishes_only_new_blocks_and_is_faster() {
    let mut engine = Engine::new(config("l40s-27b-fp8")).unwrap();
    let first = prompt(1, 2000, 40);
    engine
        .add_request(request(1, first.clone(), 4, 0.0))
        .unwrap();
    let steps1 = run(&mut engine, 0.0);
    let f1 = &finished(&steps1)[0];
    assert_eq!(f1.usage.cached_tokens, 0);
    assert_eq!(f1.usage.prompt_tokens, 2040);
    let blocks1 = stored_hashes(&steps1);
    // Prompt blocks (2040 / 16 = 127 full) plus the generated ones that got
    // computed: 2040 + 3 tokens in KV → 127 full blocks.
    assert_eq!(blocks1.len(), 127);

    let t0 = steps1.last().unwrap().end() + 1.0;
    let second = prompt(2, 2000, 40);
    engine.add_request(request(2, second, 4, t0)).unwrap();
    let steps2 = run(&mut engine, t0);
    let f2 = &finished(&steps2)[0];
    // 2000 shared tokens = 125 full blocks.
    assert_eq!(f2.usage.cached_tokens, 2000);
    let blocks2 = stored_hashes(&steps2);
    assert_eq!(blocks2.len(), 2, "only the request's own full blocks");
    assert!(blocks2.iter().all(|h| !blocks1.contains(h)));
    let ttft1 = f1.first_token_at - f1.arrival;
    let ttft2 = f2.first_token_at - f2.arrival;
    assert!(ttft2 < ttft1 / 5.0, "warm {ttft2} vs cold {ttft1}");
    let stats = engine.stats();
    assert_eq!(stats.prefix_cache_queries, 4080);
    assert_eq!(stats.prefix_cache_hits, 2000);
}

#[test]
fn fully_cached_prompt_recomputes_its_last_block() {
    let mut engine = Engine::new(config("test")).unwrap();
    let p: Vec<u32> = (0..64).collect();
    engine.add_request(request(1, p.clone(), 1, 0.0)).unwrap();
    run(&mut engine, 0.0);
    engine.add_request(request(2, p, 1, 1.0)).unwrap();
    let steps = run(&mut engine, 1.0);
    assert_eq!(finished(&steps)[0].usage.cached_tokens, 48);
    // The recomputed block is a duplicate of a cached one: not announced.
    assert!(stored_hashes(&steps).is_empty());
}

#[test]
fn generated_tokens_fill_blocks_and_store_them() {
    let mut engine = Engine::new(config("test")).unwrap();
    engine
        .add_request(request(1, (0..16).collect(), 40, 0.0))
        .unwrap();
    let steps = run(&mut engine, 0.0);
    let out = finished(&steps);
    assert_eq!(out[0].usage.completion_tokens, 40);
    // 16 + 39 computed tokens → 3 full blocks; the last sampled token is
    // never computed.
    assert_eq!(stored_hashes(&steps).len(), 3);
    let generated: Vec<u32> = steps
        .iter()
        .flat_map(|s| &s.tokens)
        .map(|t| t.token_id)
        .collect();
    assert_eq!(generated.len(), 40);
    match &steps.iter().flat_map(|s| &s.events).nth(1).unwrap() {
        CacheEvent::Stored {
            token_ids,
            parent_block_hash,
            ..
        } => {
            assert_eq!(&token_ids[..], &generated[..16]);
            assert!(parent_block_hash.is_some());
        }
        other => panic!("unexpected {other:?}"),
    }
}

#[test]
fn memory_pressure_evicts_and_publishes_block_removed() {
    let mut cfg = config("test");
    cfg.num_gpu_blocks = 40;
    cfg.max_model_len = 512;
    let mut engine = Engine::new(cfg).unwrap();
    for id in 0..6 {
        engine
            .add_request(request(id, prompt(id as u32, 0, 300), 8, 0.0))
            .unwrap();
    }
    let steps = run(&mut engine, 0.0);
    assert_eq!(finished(&steps).len(), 6);
    let stored = stored_hashes(&steps);
    let removed: Vec<u64> = steps
        .iter()
        .flat_map(|s| &s.events)
        .filter_map(|e| match e {
            CacheEvent::Removed { block_hashes } => Some(block_hashes.clone()),
            _ => None,
        })
        .flatten()
        .collect();
    assert!(!removed.is_empty());
    // Every removal refers to a block announced before.
    assert!(removed.iter().all(|h| stored.contains(h)));
    assert!(engine.stats().kv_usage == 0.0);
}

#[test]
fn preemption_by_recompute_when_blocks_run_out() {
    let mut cfg = config("test");
    cfg.num_gpu_blocks = 12;
    cfg.max_model_len = 192;
    let mut engine = Engine::new(cfg).unwrap();
    for id in 0..3 {
        engine
            .add_request(request(id, prompt(id as u32, 0, 40), 100, 0.0))
            .unwrap();
    }
    let steps = run(&mut engine, 0.0);
    let done = finished(&steps);
    assert_eq!(done.len(), 3);
    assert!(done.iter().all(|f| f.usage.completion_tokens == 100));
    assert!(engine.stats().preemptions > 0);
    assert!(steps.iter().any(|s| !s.preempted.is_empty()));
}

#[test]
fn reset_prefix_cache_clears_and_is_refused_while_running() {
    let mut engine = Engine::new(config("test")).unwrap();
    engine
        .add_request(request(1, (0..64).collect(), 20, 0.0))
        .unwrap();
    let out = engine.step(0.0).unwrap();
    assert_eq!(engine.reset_prefix_cache(false), ResetOutcome::BlocksInUse);
    let rest = run(&mut engine, out.end());
    assert!(
        !rest
            .iter()
            .flat_map(|s| &s.events)
            .any(|e| *e == CacheEvent::Cleared)
    );
    assert_eq!(engine.reset_prefix_cache(false), ResetOutcome::Cleared);
    // The event goes out with the next step, even an otherwise idle one.
    let step = engine.step(5.0).unwrap();
    assert_eq!(step.events, vec![CacheEvent::Cleared]);
    assert_eq!(step.duration_s, 0.0);
    assert!(engine.step(5.0).is_none());
    // Nothing is cached any more.
    engine
        .add_request(request(2, (0..64).collect(), 1, 6.0))
        .unwrap();
    assert_eq!(finished(&run(&mut engine, 6.0))[0].usage.cached_tokens, 0);
    // With reset_running_requests, running requests are preempted first.
    engine
        .add_request(request(3, (0..64).collect(), 20, 7.0))
        .unwrap();
    engine.step(7.0).unwrap();
    assert_eq!(engine.reset_prefix_cache(true), ResetOutcome::Cleared);
    let steps = run(&mut engine, 8.0);
    assert_eq!(steps[0].events[0], CacheEvent::Cleared);
    assert_eq!(finished(&steps)[0].usage.completion_tokens, 20);
}

#[test]
fn limits_reject_bad_requests() {
    let mut cfg = config("test");
    cfg.max_model_len = 100;
    let mut engine = Engine::new(cfg).unwrap();
    assert_eq!(
        engine.add_request(request(1, vec![], 1, 0.0)),
        Err(RejectReason::EmptyPrompt)
    );
    assert!(matches!(
        engine.add_request(request(1, vec![1; 101], 1, 0.0)),
        Err(RejectReason::PromptTooLong {
            prompt_tokens: 101,
            max_model_len: 100
        })
    ));
    assert!(matches!(
        engine.add_request(request(1, vec![1; 90], 11, 0.0)),
        Err(RejectReason::MaxTokensTooLarge { .. })
    ));
    assert_eq!(
        engine.add_request(request(1, vec![1; 90], 0, 0.0)),
        Err(RejectReason::MaxTokensZero(0))
    );
    engine
        .add_request(request(1, vec![1; 90], 10, 0.0))
        .unwrap();
    assert_eq!(
        engine.add_request(request(1, vec![1; 9], 1, 0.0)),
        Err(RejectReason::DuplicateId(1))
    );
    assert!(engine.abort(1));
    assert!(!engine.abort(1));
    assert!(engine.step(0.0).is_none());
}

#[test]
fn eos_respects_min_tokens_and_ignore_eos() {
    let mut cfg = config("test");
    cfg.eos_probability = 1.0;
    let eos = cfg.eos_token_id;
    let mut engine = Engine::new(cfg).unwrap();
    let mut r = request(1, (0..10).collect(), 50, 0.0);
    r.ignore_eos = false;
    r.min_tokens = 5;
    engine.add_request(r).unwrap();
    let mut r = request(2, (0..10).collect(), 7, 0.0);
    r.ignore_eos = true;
    engine.add_request(r).unwrap();
    let steps = run(&mut engine, 0.0);
    let done = finished(&steps);
    let one = done.iter().find(|f| f.id == 1).unwrap();
    assert_eq!(one.usage.completion_tokens, 6);
    assert_eq!(one.reason.as_str(), "stop");
    let last = steps
        .iter()
        .flat_map(|s| &s.tokens)
        .rfind(|t| t.id == 1)
        .unwrap();
    assert_eq!(last.token_id, eos);
    let two = done.iter().find(|f| f.id == 2).unwrap();
    assert_eq!(
        (two.usage.completion_tokens, two.reason.as_str()),
        (7, "length")
    );
}

#[test]
fn chunked_prefill_respects_the_token_budget_and_seat_limit() {
    let mut cfg = config("test");
    cfg.max_num_batched_tokens = 256;
    cfg.max_num_seqs = 2;
    let mut engine = Engine::new(cfg).unwrap();
    for id in 0..3 {
        engine
            .add_request(request(id, prompt(id as u32, 0, 1000), 2, 0.0))
            .unwrap();
    }
    let first = engine.step(0.0).unwrap();
    assert_eq!(first.shape.prefill_tokens, 256);
    assert!(first.tokens.is_empty());
    let stats = engine.stats();
    assert_eq!((stats.running, stats.waiting), (1, 2));
    let steps = run(&mut engine, first.end());
    for s in &steps {
        assert!(s.shape.prefill_tokens + s.shape.decode_seqs <= 256);
        assert!(s.num_scheduled <= 2);
    }
    assert_eq!(finished(&steps).len(), 3);
}

/// Same seed and request sequence → identical events and timings.
#[test]
fn deterministic_for_a_seed() {
    fn trace(seed: u64) -> Vec<String> {
        let mut cfg = config("l40s-27b-fp8");
        cfg.num_gpu_blocks = 3000;
        cfg.seed = seed;
        cfg.hash_seed = seed;
        let mut engine = Engine::new(cfg).unwrap();
        let mut log = Vec::new();
        let mut now = 0.0;
        for id in 0..40u64 {
            let mut r = request(id, prompt((id % 4) as u32, 1500, 30 + id as usize), 60, now);
            r.ignore_eos = false;
            engine.add_request(r).unwrap();
            for _ in 0..3 {
                if let Some(out) = engine.step(now) {
                    now = out.end();
                    log.push(format!("{out:?}"));
                }
            }
        }
        log.extend(run(&mut engine, now).iter().map(|o| format!("{o:?}")));
        log
    }
    let a = trace(3);
    assert_eq!(a, trace(3));
    assert_ne!(a, trace(4));
}
