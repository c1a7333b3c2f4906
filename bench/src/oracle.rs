//! `oracle`: the worker where this request's first token truly comes
//! soonest, found by running a copy of every engine forward with the request
//! added. It knows what no router can (each engine's exact queue, batch and
//! cache, and the step times to come) but not the arrivals after this one, so
//! it is greedy: the best a router can do that predicts TTFT perfectly and
//! places each request on its own, which is kvsteer's aim with perfect
//! prediction. Not a bound on every policy: keeping a worker free for the
//! requests to come can beat it. Virtual time only (`--policies oracle`).
//!
//! In the bench's FCFS engines a request's first token is not delayed by
//! requests that arrive after it (they queue behind it; preemption aside), so
//! the copy's first-token time is the one the run then measures.

use kvsteer_sim::engine::{Engine, SimRequest};

/// Steps one copy of an engine may run to reach the request's first token
/// before it counts as never (a guard; real runs need a few thousand).
const MAX_STEPS: usize = 1_000_000;

/// When `req`'s first token would come on `engine`: a copy of the engine
/// with `req` added, stepped from `free_at` (when its step in flight ends, or
/// now when it is idle) until the step that samples that token ends. `None`
/// when the engine refuses the request, or no token comes before `limit`.
pub fn first_token_at(engine: &Engine, free_at: f64, req: &SimRequest, limit: f64) -> Option<f64> {
    let mut copy = engine.clone();
    copy.add_request(req.clone()).ok()?;
    let mut t = free_at;
    for _ in 0..MAX_STEPS {
        if t > limit {
            return None;
        }
        let out = copy.step(t)?;
        if out.tokens.iter().any(|k| k.id == req.id && k.first) {
            return Some(out.end());
        }
        t = out.end();
    }
    None
}

/// The worker whose copy gives `req` its first token soonest, and when that
/// token comes; ties go to the first in the order rotated by `rotate` (so
/// equal idle workers share the load). `free_at[w]` is when engine `w`'s step
/// in flight ends (≤ now when idle). Worker `rotate % n` and no time when
/// every engine refuses the request.
pub fn choose(
    engines: &[Engine],
    free_at: &[f64],
    req: &SimRequest,
    rotate: usize,
) -> (usize, Option<f64>) {
    let n = engines.len().max(1);
    let mut best: Option<(usize, f64)> = None;
    for k in 0..engines.len() {
        let w = (k + rotate) % n;
        let limit = best.map_or(f64::INFINITY, |(_, t)| t);
        let free = free_at
            .get(w)
            .copied()
            .unwrap_or(req.arrival)
            .max(req.arrival);
        if let Some(t) = first_token_at(&engines[w], free, req, limit)
            && best.is_none_or(|(_, b)| t < b)
        {
            best = Some((w, t));
        }
    }
    best.map_or((rotate % n, None), |(w, t)| (w, Some(t)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use kvsteer_sim::engine::EngineConfig;
    use kvsteer_sim::profile::TimingProfile;

    fn engine() -> Engine {
        let profile = TimingProfile::by_name("l40s-27b-fp8").unwrap();
        Engine::new(EngineConfig::new(profile)).unwrap()
    }

    fn request(id: u64, prompt: Vec<u32>, arrival: f64) -> SimRequest {
        SimRequest {
            id,
            prompt_token_ids: prompt,
            max_tokens: 8,
            min_tokens: 0,
            ignore_eos: true,
            arrival,
            lora: None,
            cache_salt: None,
        }
    }

    fn prompt(seed: u32, len: u32) -> Vec<u32> {
        (0..len)
            .map(|i| 1000 + (seed * 7919 + i) % 50_000)
            .collect()
    }

    /// Runs `engine` alone from `now` until `id`'s first token; the time it comes.
    fn run_to_first_token(engine: &mut Engine, mut now: f64, id: u64) -> f64 {
        loop {
            let out = engine.step(now).expect("the request is still there");
            now = out.end();
            if out.tokens.iter().any(|k| k.id == id && k.first) {
                return now;
            }
        }
    }

    #[test]
    fn foresees_the_first_token_the_engine_then_gives() {
        let mut e = engine();
        e.add_request(request(1, prompt(1, 6000), 0.0)).unwrap();
        // Its step in flight: the copy starts where that step ends.
        let first = e.step(0.0).unwrap();
        let req = request(2, prompt(2, 3000), 0.01);
        let foreseen = first_token_at(&e, first.end(), &req, f64::INFINITY).unwrap();
        e.add_request(req).unwrap();
        assert_eq!(run_to_first_token(&mut e, first.end(), 2), foreseen);
        assert!(foreseen > first.end());
        // Nothing before the limit: none.
        let late = request(3, prompt(3, 3000), 0.01);
        assert_eq!(first_token_at(&e, first.end(), &late, first.end()), None);
    }

    #[test]
    fn chooses_the_cached_worker_then_the_idle_one() {
        let shared = prompt(9, 8000);
        let mut holder = engine();
        holder.add_request(request(1, shared.clone(), 0.0)).unwrap();
        let end = run_to_first_token(&mut holder, 0.0, 1);
        while let Some(out) = holder.step(end) {
            if !out.finished.is_empty() {
                break;
            }
        }
        let engines = vec![engine(), holder.clone(), engine()];
        let mut next = shared.clone();
        next.extend(prompt(10, 200));
        let req = request(2, next.clone(), 100.0);
        let free = [0.0, 0.0, 0.0];
        for rotate in 0..3 {
            assert_eq!(choose(&engines, &free, &req, rotate).0, 1);
        }
        // The holder busy with a long queue: an idle worker is sooner.
        let mut busy = holder;
        for id in 10..20 {
            busy.add_request(request(id, prompt(id as u32, 12_000), 100.0))
                .unwrap();
        }
        let step = busy.step(100.0).unwrap();
        let engines = vec![engine(), busy, engine()];
        let free = [100.0, step.end(), 100.0];
        let (w, at) = choose(&engines, &free, &req, 0);
        assert_ne!(w, 1);
        assert_eq!(at, first_token_at(&engines[w], 100.0, &req, f64::INFINITY));
        // Equal idle workers: the rotation decides.
        assert_eq!(choose(&engines, &free, &req, 2).0, 2);
    }
}
