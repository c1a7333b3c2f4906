//! How many simulated requests per second the engine core schedules
//! in-process on one core: 6 engines (`l40s-27b-fp8`), 2k-token prompts
//! sharing one of 8 system prefixes, 100 output tokens, driven in virtual
//! time by a discrete-event loop (the shape of the routing benchmark).
//!
//! Run: `cargo bench -p kvsteer-sim --bench core_throughput`

use std::time::Instant;

use kvsteer_sim::engine::{Engine, EngineConfig, SimRequest};
use kvsteer_sim::profile::TimingProfile;

const ENGINES: usize = 6;
const REQUESTS: u64 = 12_000;
const PREFIXES: u64 = 8;
const PREFIX_TOKENS: u32 = 1_800;
const OWN_TOKENS: u32 = 200;
const OUTPUT_TOKENS: usize = 100;
/// Simulated arrivals per second over all engines.
const ARRIVAL_RATE: f64 = 30.0;

fn prompt(id: u64) -> Vec<u32> {
    let group = (id % PREFIXES) as u32;
    let mut p: Vec<u32> = (0..PREFIX_TOKENS)
        .map(|i| 1_000 + group * 2_000 + i)
        .collect();
    p.extend((0..OWN_TOKENS).map(|i| 50_000 + ((id as u32).wrapping_mul(7919) + i) % 90_000));
    p
}

struct Run {
    wall_s: f64,
    sim_s: f64,
    finished: u64,
    steps: u64,
    mean_ttft: f64,
    hit_rate: f64,
}

fn run() -> Run {
    let mut engines: Vec<Engine> = (0..ENGINES)
        .map(|i| {
            let mut cfg = EngineConfig::new(TimingProfile::by_name("l40s-27b-fp8").unwrap());
            cfg.seed = i as u64;
            cfg.hash_seed = 42;
            Engine::new(cfg).unwrap()
        })
        .collect();
    // When each engine is next free to step (None: idle).
    let mut busy_until: Vec<Option<f64>> = vec![None; ENGINES];
    let prompts: Vec<Vec<u32>> = (0..REQUESTS).map(prompt).collect();
    let (mut finished, mut steps, mut ttft_sum, mut sim_end) = (0u64, 0u64, 0.0, 0.0f64);
    let mut next_arrival = 0u64;
    let start = Instant::now();
    loop {
        let arrival_t = (next_arrival < REQUESTS).then(|| next_arrival as f64 / ARRIVAL_RATE);
        let (engine_i, engine_t) = busy_until
            .iter()
            .enumerate()
            .filter_map(|(i, t)| t.map(|t| (i, t)))
            .min_by(|a, b| a.1.total_cmp(&b.1))
            .map_or((usize::MAX, f64::INFINITY), |x| x);
        match arrival_t {
            Some(t) if t <= engine_t => {
                // Prefix affinity: each group sticks to one engine.
                let id = next_arrival;
                let e = (id % PREFIXES) as usize % ENGINES;
                engines[e]
                    .add_request(SimRequest {
                        id,
                        prompt_token_ids: prompts[id as usize].clone(),
                        max_tokens: OUTPUT_TOKENS,
                        min_tokens: 0,
                        ignore_eos: true,
                        arrival: t,
                        lora: None,
                        cache_salt: None,
                    })
                    .unwrap();
                busy_until[e].get_or_insert(t);
                next_arrival += 1;
            }
            _ if engine_i == usize::MAX => break,
            _ => match engines[engine_i].step(engine_t) {
                Some(out) => {
                    steps += 1;
                    for f in &out.finished {
                        finished += 1;
                        ttft_sum += f.first_token_at - f.arrival;
                    }
                    sim_end = sim_end.max(out.end());
                    busy_until[engine_i] = Some(out.end());
                }
                None => busy_until[engine_i] = None,
            },
        }
    }
    let wall_s = start.elapsed().as_secs_f64();
    let (q, h) = engines.iter().fold((0, 0), |(q, h), e| {
        let s = e.stats();
        (q + s.prefix_cache_queries, h + s.prefix_cache_hits)
    });
    Run {
        wall_s,
        sim_s: sim_end,
        finished,
        steps,
        mean_ttft: ttft_sum / finished.max(1) as f64,
        hit_rate: h as f64 / q.max(1) as f64,
    }
}

fn main() {
    let r = run();
    assert_eq!(r.finished, REQUESTS, "every request finishes");
    println!(
        "core_throughput: {} requests ({} engines, {}-token prompts, {} output tokens) in {:.3} s wall",
        r.finished,
        ENGINES,
        PREFIX_TOKENS + OWN_TOKENS,
        OUTPUT_TOKENS,
        r.wall_s
    );
    println!(
        "  simulated requests/s scheduled (wall): {:.0}",
        r.finished as f64 / r.wall_s
    );
    println!("  engine steps/s (wall): {:.0}", r.steps as f64 / r.wall_s);
    println!(
        "  simulated span {:.1} s, mean TTFT {:.3} s, prefix-cache hit rate {:.1}%",
        r.sim_s,
        r.mean_ttft,
        100.0 * r.hit_rate
    );
}
