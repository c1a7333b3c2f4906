//! Concurrent picks: p50 / p99 pick latency with 1, 8 and 64 picks in
//! flight, and the picks per second they make together, two ways:
//! - `tasks`: each pick in flight a task on a multi-thread tokio runtime
//!   with one worker thread per core, as the service's gRPC handlers run
//!   them (the runtime interleaves the tasks; at most one pick per core
//!   runs at a time, plus the tokenizer's blocking threads);
//! - `threads`: each pick in flight on its own OS thread with its own
//!   runtime (64 threads on 2 cores: the scheduler preempts picks midway,
//!   lock holders included).
//!
//! Each pick works on warm ~1k-token conversations (the previous turn indexed on one
//! of 8 workers), each pick followed by its first-token and done reports, so
//! the ledger, the route memories and the index are read and written as the
//! service does. Two prompt kinds: chat turns (tokenized: most of a pick's
//! time) and the same turns as token ids (a completions request: no
//! tokenizer, so the shared state is most of it). One untimed pass fills
//! the route memories to their bound before anything is measured.
//!
//! Two variants in one run:
//! - `shared`: the picker as the service runs it;
//! - `one lock`: the same picks and reports behind a single mutex (the
//!   naive baseline: all of the picker's state under one lock; an async
//!   mutex for tasks, a blocking one for threads).
//!
//! The same file builds against an earlier commit (it uses only `pick`,
//! `report` and `build_picker`), which is how the old structure is raced
//! against the new (see `indexer/README.md`, "Pick latency under
//! concurrency"). `KVSTEER_BENCH_LABEL` names the build in the output.
//!
//! `cargo bench -p kvsteer-indexer --bench pick_concurrent`

use kvsteer_indexer::picker::{Mode, PickInput, Picker, report::Report};
use kvsteer_indexer::prompt::Prompt;
use kvsteer_tokenize::{ChatRequest, CompletionPrompt};
use parking_lot::Mutex;
use rand::{SeedableRng, rngs::SmallRng};
use std::{
    sync::{Arc, Barrier},
    time::{Duration, Instant},
};

mod common;
use common::{MODEL, conversation, next_turn, percentiles, stored, tokenizing_picker};

/// Picks per concurrency level (split over its threads).
const PICKS: usize = 6_000;
/// Conversations the picks continue (each indexed on one worker).
const CONVERSATIONS: usize = 64;
const ROUNDS: usize = 3;

fn main() {
    let label = std::env::var("KVSTEER_BENCH_LABEL").unwrap_or_else(|_| "this build".into());
    let (picker, tok, index) = tokenizing_picker();
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("runtime");
    let mut rng = SmallRng::seed_from_u64(11);
    let convs: Vec<ChatRequest> = (0..CONVERSATIONS)
        .map(|i| {
            let c = conversation(&tok, &mut rng, 1_000);
            let ids = tok.chat_token_ids(&c).expect("ids");
            rt.block_on(index.apply_batch((i % 8) as u32, &stored(&ids, (i as u64 + 1) << 32)));
            c
        })
        .collect();
    // Every turn the run will pick, made before the clock starts.
    let chats: Vec<ChatRequest> = (0..PICKS)
        .map(|i| next_turn(&convs[i % CONVERSATIONS], &mut rng))
        .collect();
    let as_ids: Arc<[Prompt]> = chats
        .iter()
        .map(|c| Prompt::Completion {
            prompt: CompletionPrompt::Ids(tok.chat_token_ids(c).expect("ids")),
            add_special_tokens: None,
        })
        .collect();
    let as_chat: Arc<[Prompt]> = chats.into_iter().map(Prompt::Chat).collect();
    // Untimed: the segment cache warm, the route memories at their bound.
    run(&picker, &as_chat, 1, None, 0);

    println!(
        "pick latency under concurrency ({label}): warm ~1k-token turns, 8 workers, {PICKS} picks per level, best of {ROUNDS} rounds by p99"
    );
    println!("model    prompt     variant    in flight        p50        p99   picks/s");
    let one_lock = Mutex::new(());
    let one_async_lock = Arc::new(tokio::sync::Mutex::new(()));
    let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
    let tasks_rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(cores)
        .enable_all()
        .build()
        .expect("runtime");
    let mut seq = 0usize;
    for model in ["tasks", "threads"] {
        for (kind, prompts) in [("chat", &as_chat), ("token ids", &as_ids)] {
            for in_flight in [1, 8, 64] {
                for variant in ["shared", "one lock"] {
                    let locked = variant == "one lock";
                    let best = (0..ROUNDS)
                        .map(|_| {
                            seq += 1;
                            if model == "tasks" {
                                let lock = locked.then(|| one_async_lock.clone());
                                tasks_rt.block_on(run_tasks(&picker, prompts, in_flight, lock, seq))
                            } else {
                                run(
                                    &picker,
                                    prompts,
                                    in_flight,
                                    locked.then_some(&one_lock),
                                    seq,
                                )
                            }
                        })
                        .min_by_key(|r| r.p99)
                        .expect("rounds");
                    println!(
                        "{model:<8} {kind:<10} {variant:<10} {in_flight:>9} {:>10.1?} {:>10.1?} {:>9.0}",
                        best.p50, best.p99, best.rate
                    );
                }
            }
        }
    }
}

struct Run {
    p50: Duration,
    p99: Duration,
    rate: f64,
}

impl Run {
    /// The pick latencies of a round that took `elapsed` in all.
    fn of(took: Vec<Duration>, elapsed: Duration) -> Self {
        let n = took.len();
        let [p50, _, p99] = percentiles(took);
        Run {
            p50,
            p99,
            rate: n as f64 / elapsed.as_secs_f64(),
        }
    }
}

/// Pick `i` of in-flight slot `t` in round `round`: its request id and input.
fn pick_input(round: usize, t: usize, i: usize, prompt: &Prompt) -> (String, PickInput) {
    let id = format!("c{round}-{t}-{i}");
    let input = PickInput {
        request_id: id.clone(),
        tenant: String::new(),
        model: MODEL.into(),
        prompt: Ok(prompt.clone()),
        cache_salt: None,
    };
    (id, input)
}

/// A pick's first token and done reports, as the filter sends them.
fn finish(picker: &Picker, id: &str, routed: bool) {
    assert!(routed, "a pick with no endpoint");
    picker.report(&Report::first_token(id, 50.0, true), Instant::now());
    picker.report(&Report::done(id, 100.0), Instant::now());
}

/// `prompts` picked by `in_flight` tasks at once on the current (multi-thread)
/// runtime (round `round` names the request ids), each pick followed by its
/// reports.
async fn run_tasks(
    picker: &Arc<Picker>,
    prompts: &Arc<[Prompt]>,
    in_flight: usize,
    lock: Option<Arc<tokio::sync::Mutex<()>>>,
    round: usize,
) -> Run {
    let per = prompts.len() / in_flight;
    let started = Instant::now();
    let tasks: Vec<_> = (0..in_flight)
        .map(|t| {
            let (picker, prompts, lock) = (picker.clone(), prompts.clone(), lock.clone());
            tokio::spawn(async move {
                let mut took = Vec::with_capacity(per);
                for (i, prompt) in prompts[t * per..(t + 1) * per].iter().enumerate() {
                    let (id, input) = pick_input(round, t, i, prompt);
                    let start = Instant::now();
                    let guard = match &lock {
                        Some(l) => Some(l.lock().await),
                        None => None,
                    };
                    let out = picker.pick(input, Mode::Commit).await;
                    took.push(start.elapsed());
                    finish(&picker, &id, !out.endpoints.is_empty());
                    drop(guard);
                }
                took
            })
        })
        .collect();
    let mut took = Vec::with_capacity(prompts.len());
    for task in tasks {
        took.extend(task.await.expect("bench task"));
    }
    Run::of(took, started.elapsed())
}

/// `prompts` picked by `threads` threads at once (round `round` names the
/// request ids), each pick followed by its reports.
fn run(
    picker: &Picker,
    prompts: &[Prompt],
    threads: usize,
    lock: Option<&Mutex<()>>,
    round: usize,
) -> Run {
    let per = prompts.len() / threads;
    let barrier = Barrier::new(threads);
    let started = Instant::now();
    let took: Vec<Duration> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                let barrier = &barrier;
                let mine = &prompts[t * per..(t + 1) * per];
                s.spawn(move || {
                    let rt = tokio::runtime::Builder::new_current_thread()
                        .build()
                        .expect("runtime");
                    let mut took = Vec::with_capacity(mine.len());
                    barrier.wait();
                    for (i, prompt) in mine.iter().enumerate() {
                        let (id, input) = pick_input(round, t, i, prompt);
                        let start = Instant::now();
                        let guard = lock.map(|l| l.lock());
                        let out = rt.block_on(picker.pick(input, Mode::Commit));
                        took.push(start.elapsed());
                        finish(picker, &id, !out.endpoints.is_empty());
                        drop(guard);
                    }
                    took
                })
            })
            .collect();
        handles
            .into_iter()
            .flat_map(|h| h.join().expect("bench thread"))
            .collect()
    });
    Run::of(took, started.elapsed())
}
