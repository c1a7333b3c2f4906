use super::*;

const TTL: Duration = Duration::from_secs(60);

fn ledger(workers: usize) -> Ledger {
    Ledger::new(workers, 1000.0, TTL, 1_000)
}

fn entry(worker: usize, tokens: f64, at: Instant) -> Entry {
    Entry {
        worker,
        prediction: Prediction {
            uncached_tokens: tokens,
            ..Default::default()
        },
        picked_at: at,
        first_token_at: None,
        tenant: "other".into(),
        policy: "kvsteer",
    }
}

fn keys(range: std::ops::Range<u64>) -> Vec<BlockKey> {
    range.map(BlockKey).collect()
}

/// (in_flight, unprefilled_tokens, decoding) of one worker.
fn load(l: &Ledger, worker: usize) -> (u32, u64, u32) {
    let w = l.snapshot()[worker];
    (w.in_flight, w.unprefilled_tokens, w.decoding)
}

fn idle(l: &Ledger) -> bool {
    l.is_empty()
        && l.snapshot()
            .iter()
            .all(|w| (w.in_flight, w.unprefilled_tokens, w.decoding) == (0, 0, 0))
        && l.stats().held_blocks == 0
}

#[test]
fn pick_first_token_done() {
    let l = ledger(2);
    let now = Instant::now();
    assert_eq!(l.open("a", entry(1, 100.0, now), vec![]), Opened::New);
    assert_eq!(l.open("b", entry(1, 50.5, now), vec![]), Opened::New);
    assert_eq!(load(&l, 1), (2, 151, 0));
    assert!(l.first_token("a", now).is_some());
    assert!(l.first_token("a", now).is_none(), "once");
    assert_eq!(load(&l, 1), (2, 51, 1));
    assert!(matches!(l.finish("a", now), Finished::Closed(_)));
    assert!(matches!(l.finish("b", now), Finished::Closed(_)));
    assert!(idle(&l));
    assert_eq!(l.snapshot()[1].prefill_rate, 1000.0);
}

/// Every order of pick, first token and terminal report of one id, with a
/// duplicate of each: the aggregates end at zero, the entry is gone, and a
/// pick after its terminal report is never counted.
#[test]
fn every_order_ends_idle() {
    #[derive(Debug, Clone, Copy)]
    enum Op {
        Pick,
        First,
        Done,
        Cancel,
    }
    let ops = [Op::Pick, Op::First, Op::Done, Op::Cancel];
    let now = Instant::now();
    for a in ops {
        for b in ops {
            for c in ops {
                let seq = [a, b, c];
                // Only sequences with one pick and a terminal report.
                let picks = seq.iter().filter(|o| matches!(o, Op::Pick)).count();
                let ended = seq.iter().any(|o| matches!(o, Op::Done | Op::Cancel));
                if picks != 1 || !ended {
                    continue;
                }
                let l = ledger(1);
                let mut reported = false;
                for op in seq {
                    match op {
                        Op::Pick => {
                            let opened = l.open("r", entry(0, 10.0, now), keys(0..2));
                            assert_eq!(opened == Opened::Reported, reported, "{seq:?}");
                        }
                        Op::First => {
                            l.first_token("r", now);
                        }
                        Op::Done | Op::Cancel => {
                            l.finish("r", now);
                            reported = true;
                        }
                    }
                }
                assert!(idle(&l), "{seq:?}: {:?}", l.snapshot());
                // A duplicate of every report changes nothing more.
                l.first_token("r", now);
                l.finish("r", now);
                assert!(idle(&l), "{seq:?} + duplicates");
            }
        }
    }
}

#[test]
fn a_terminal_report_before_its_pick_leaves_a_tombstone() {
    let l = ledger(1);
    let now = Instant::now();
    assert_eq!(l.finish("late", now), Finished::Tombstoned);
    assert_eq!(l.finish("late", now), Finished::AlreadyTombstoned);
    assert_eq!(l.stats().tombstones, 1);
    // The late pick is not counted, and uses the tombstone up.
    assert_eq!(
        l.open("late", entry(0, 10.0, now), keys(0..3)),
        Opened::Reported
    );
    assert!(idle(&l));
    let s = l.stats();
    assert_eq!((s.tombstones, s.late_picks), (0, 1));
    // A late first token for it is ignored too.
    assert!(l.first_token("late", now).is_none());
    assert!(idle(&l));
}

#[test]
fn done_without_a_first_token_counts_as_both() {
    let l = ledger(1);
    let now = Instant::now();
    l.open("a", entry(0, 10.0, now), keys(0..4));
    assert_eq!(l.view(&keys(0..4)).1, vec![4]);
    let Finished::Closed(e) = l.finish("a", now) else {
        panic!("closed");
    };
    assert_eq!(e.first_token_at, None, "as it was");
    assert!(idle(&l));
}

#[test]
fn repeated_id_replaces_and_unknown_worker_is_refused() {
    let l = ledger(2);
    let now = Instant::now();
    l.open("a", entry(0, 10.0, now), keys(0..2));
    assert_eq!(
        l.open("a", entry(1, 20.0, now), keys(0..2)),
        Opened::Replaced
    );
    assert_eq!(
        l.open("z", entry(7, 20.0, now), vec![]),
        Opened::UnknownWorker
    );
    let s = l.snapshot();
    assert_eq!((s[0].in_flight, s[1].in_flight), (0, 1));
    assert_eq!((s[0].unprefilled_tokens, s[1].unprefilled_tokens), (0, 20));
    assert_eq!(l.view(&keys(0..2)).1, vec![0, 2], "the prompt moved");
    assert_eq!(l.len(), 1);
    assert!(l.first_token("nope", now).is_none());
}

/// An end that closed an entry is remembered as long as a tombstone
/// lives: a first token after it is told apart from one for an unknown id.
#[test]
fn an_ended_id_is_remembered_as_long_as_a_tombstone() {
    let l = Ledger::with_tombstones(2, 1000.0, TTL, 1_000, Duration::from_secs(30), 2);
    let t0 = Instant::now();
    l.open("a", entry(0, 4.0, t0), vec![]);
    assert!(!l.ended("a"), "open");
    assert!(matches!(l.finish("a", t0), Finished::Closed(_)));
    assert!(l.ended("a"));
    assert!(l.first_token("a", t0).is_none());
    assert!(!l.ended("b"), "never picked");
    // A terminal report without an entry leaves a tombstone, not an end.
    l.finish("b", t0);
    assert!(!l.ended("b"));
    // Bounded as tombstones are: the oldest go first.
    for id in ["c", "d"] {
        l.open(id, entry(0, 4.0, t0), vec![]);
        l.finish(id, t0 + Duration::from_secs(1));
    }
    assert!(!l.ended("a") && l.ended("c") && l.ended("d"));
    l.expire(t0 + Duration::from_secs(32));
    assert!(!l.ended("c") && !l.ended("d"));
    assert!(idle(&l));
}

#[test]
fn stale_entries_and_tombstones_expire() {
    let l = Ledger::with_tombstones(
        1,
        1000.0,
        Duration::from_secs(10),
        100,
        Duration::from_secs(5),
        8,
    );
    let start = Instant::now();
    l.open("old", entry(0, 10.0, start), keys(0..2));
    l.open("new", entry(0, 5.0, start + Duration::from_secs(8)), vec![]);
    l.first_token("new", start + Duration::from_secs(9));
    l.finish("ghost", start + Duration::from_secs(8));
    let e = l.expire(start + Duration::from_secs(11));
    assert_eq!(
        e,
        Expired {
            entries: 1,
            tombstones: 0
        }
    );
    assert_eq!(load(&l, 0), (1, 0, 1));
    assert_eq!(l.view(&keys(0..2)).1, vec![0], "its held prompt went too");
    let e = l.expire(start + Duration::from_secs(30));
    assert_eq!(
        e,
        Expired {
            entries: 1,
            tombstones: 1
        }
    );
    assert!(idle(&l));
    let s = l.stats();
    assert_eq!((s.expired, s.tombstones), (2, 0));
}

#[test]
fn uncalibrated_workers_borrow_the_pool_rate() {
    let l = Ledger::new(3, 8_000.0, TTL, 100);
    l.set_rate(0, 16_000.0);
    let rates: Vec<f64> = l.snapshot().iter().map(|w| w.prefill_rate).collect();
    assert_eq!(rates, [16_000.0, 16_000.0, 16_000.0]);
    l.set_rate(1, 10_000.0);
    let s = l.snapshot();
    assert_eq!(
        s.iter().map(|w| w.prefill_rate).collect::<Vec<_>>(),
        [16_000.0, 10_000.0, 13_000.0]
    );
    assert_eq!(s.iter().filter(|w| w.calibrated).count(), 2);
    assert_eq!(l.rate(2), Some(13_000.0));
    assert_eq!(l.rate(3), None);
}

#[test]
fn prompts_in_flight_lend_their_prefix_until_their_end() {
    let l = ledger(3);
    let t0 = Instant::now();
    // A group prefix (blocks 0..6) queued on 1 with its question, and
    // the first half of it on 2.
    l.open("a", entry(1, 8.0, t0), keys(0..8));
    l.open("b", entry(2, 3.0, t0), keys(0..3));
    // Another user of the group: same prefix, another question.
    let mut prompt = keys(0..6);
    prompt.extend(keys(50..52));
    assert_eq!(l.view(&prompt).1, vec![0, 6, 3]);
    // Only a leading run counts: a prompt whose first block differs
    // holds nothing, even where later keys are alike.
    let mut stranger = vec![BlockKey(99)];
    stranger.extend(keys(1..8));
    assert_eq!(l.view(&stranger).1, vec![0, 0, 0]);
    // Two prompts with the same prefix on one worker: it stays held
    // until both have ended; a first token changes nothing.
    l.open("c", entry(1, 6.0, t0), keys(0..6));
    l.first_token("a", t0);
    assert_eq!(l.view(&prompt).1, vec![0, 6, 3]);
    l.finish("c", t0);
    assert_eq!(l.view(&prompt).1, vec![0, 6, 3], "a still runs");
    l.finish("a", t0);
    assert_eq!(l.view(&prompt).1, vec![0, 0, 3]);
    // Picked again elsewhere: the prompt moves.
    l.open("b", entry(0, 3.0, t0), keys(0..3));
    assert_eq!(l.view(&prompt).1, vec![3, 0, 0]);
    assert_eq!(l.view(&[]).1, vec![0, 0, 0]);
}

/// A prompt's blocks are held on its worker from its pick to its end,
/// through its first token; every way an entry ends (done, replaced,
/// expired, forgotten) lets them go.
#[test]
fn a_prompt_is_held_from_its_pick_to_its_end() {
    let l = ledger(2);
    let t0 = Instant::now();
    let prompt = keys(0..5);
    let held = |l: &Ledger| l.view(&prompt).1;
    l.open("a", entry(1, 5.0, t0), prompt.clone());
    l.first_token("a", t0);
    assert_eq!(held(&l), vec![0, 5]);
    assert_eq!(l.stats().held_blocks, 5);
    l.finish("a", t0);
    assert_eq!(held(&l), vec![0, 0]);
    // A shorter prompt, prefilled: held as well.
    l.open("b", entry(0, 5.0, t0), keys(0..3));
    l.first_token("b", t0);
    assert_eq!(held(&l), vec![3, 0]);
    // Replaced by a pick of the same id on another worker.
    l.open("b", entry(1, 5.0, t0), keys(0..2));
    assert_eq!(held(&l), vec![0, 2]);
    // Forgotten with its worker.
    l.forget(1);
    assert_eq!(held(&l), vec![0, 0]);
    // Expired without a report, prefilled or not.
    l.open("c", entry(0, 5.0, t0), prompt.clone());
    l.open("d", entry(1, 5.0, t0), prompt.clone());
    l.first_token("d", t0);
    assert_eq!(held(&l), vec![5, 5]);
    assert_eq!(l.expire(t0 + 2 * TTL).entries, 2);
    assert!(idle(&l));
    assert!(l.inner.lock().held_order.is_empty());
    // A first token for an expired entry holds nothing again.
    assert!(l.first_token("c", t0 + 2 * TTL).is_none());
    assert_eq!(held(&l), vec![0, 0]);
}

/// Requests that end out of order leave stale items behind a long one at
/// the front of the bound's order: they are dropped once they outnumber
/// the live ones, so the order stays within twice the requests in flight.
#[test]
fn the_held_order_stays_within_twice_the_requests_in_flight() {
    let l = ledger(1);
    let t0 = Instant::now();
    l.open("long", entry(0, 4.0, t0), keys(0..2));
    for i in 0..100u64 {
        let id = format!("short-{i}");
        l.open(&id, entry(0, 4.0, t0), keys(10 + 2 * i..12 + 2 * i));
        l.finish(&id, t0);
        // At most twice the entries at the last pick, one more than now.
        let order = l.inner.lock().held_order.len();
        assert!(
            order <= 2 * (l.len() + 1),
            "{order} items, {} entries",
            l.len()
        );
    }
    assert_eq!(l.view(&keys(0..2)).1, vec![2], "the long one still held");
    assert_eq!(l.stats().held_dropped, 0);
    l.finish("long", t0);
    assert!(idle(&l));
}

#[test]
fn held_prompts_are_bounded_and_their_load_stays() {
    let l = Ledger::new(1, 1000.0, TTL, 8);
    let t0 = Instant::now();
    l.open("a", entry(0, 4.0, t0), keys(0..4));
    l.open("b", entry(0, 4.0, t0), keys(10..14));
    l.open("c", entry(0, 4.0, t0), keys(20..24));
    assert_eq!(l.view(&keys(0..4)).1, vec![0], "the oldest beyond 8 blocks");
    assert_eq!(l.view(&keys(10..14)).1, vec![4]);
    assert_eq!(l.view(&keys(20..24)).1, vec![4]);
    assert_eq!(load(&l, 0), (3, 12, 0), "all three still in flight");
    // Prefilled prompts count in the bound until their end.
    l.first_token("b", t0);
    assert_eq!(l.view(&keys(10..14)).1, vec![4], "b runs, still held");
    assert_eq!(l.stats().held_blocks, 8);
    l.open("d", entry(0, 4.0, t0), keys(30..34));
    assert_eq!(l.view(&keys(10..14)).1, vec![0], "b was the oldest");
    assert_eq!(l.view(&keys(20..24)).1, vec![4]);
    assert_eq!(l.view(&keys(30..34)).1, vec![4]);
    assert_eq!(l.stats().held_dropped, 2, "a, then b");
    l.finish("d", t0);
    for id in ["a", "b", "c"] {
        l.first_token(id, t0);
        l.finish(id, t0);
    }
    assert!(idle(&l));
    // Stale order items go on the next sweep.
    l.expire(t0);
    assert!(l.inner.lock().held_order.is_empty());
}

#[test]
fn forgetting_a_worker_drops_its_entries_and_held_blocks_and_resets_its_load() {
    let l = ledger(3);
    let t0 = Instant::now();
    l.open("a", entry(1, 500.0, t0), keys(0..4));
    l.open("b", entry(1, 300.0, t0), Vec::new());
    l.open("c", entry(2, 100.0, t0), keys(0..2));
    l.set_rate(1, 5_000.0);
    l.set_rate(2, 3_000.0);
    assert_eq!(l.forget(1), 2);
    assert_eq!(load(&l, 1), (0, 0, 0));
    let w = l.snapshot()[1];
    assert!(!w.calibrated);
    assert_eq!(w.prefill_rate, 3_000.0, "the pool's rate, not its own");
    // Worker 2 keeps its entry and its held blocks.
    assert_eq!(load(&l, 2), (1, 100, 0));
    assert_eq!(l.view(&keys(0..4)).1, vec![0, 0, 2]);
    // A late report of a forgotten entry changes nothing.
    assert_eq!(l.finish("a", t0), Finished::Tombstoned);
    assert_eq!(load(&l, 1), (0, 0, 0));
    l.finish("c", t0);
    assert!(idle(&l));
    assert_eq!(l.forget(7), 0);
}

#[test]
fn picks_reading_while_reports_write_see_whole_changes_and_end_at_zero() {
    // Writers open, first-token and finish while readers take views: the
    // loads and the held blocks never go negative (saturated
    // u32/u64 would show as huge), and once every writer is done both read
    // zero with no entry left.
    let l = std::sync::Arc::new(ledger(4));
    let t0 = Instant::now();
    let writers: Vec<_> = (0..4)
        .map(|t| {
            let l = l.clone();
            std::thread::spawn(move || {
                for i in 0..500u64 {
                    let id = format!("{t}-{i}");
                    let worker = ((t as u64 + i) % 4) as usize;
                    l.open(&id, entry(worker, 64.0, t0), keys(i % 7..i % 7 + 3));
                    if i % 3 != 0 {
                        l.first_token(&id, t0);
                    }
                    if i % 5 == 0 {
                        l.set_rate(worker, 1_000.0 + i as f64);
                    }
                    l.finish(&id, t0);
                }
            })
        })
        .collect();
    let readers: Vec<_> = (0..2)
        .map(|_| {
            let l = l.clone();
            std::thread::spawn(move || {
                for i in 0..2_000u64 {
                    let (loads, held) = l.view(&keys(i % 7..i % 7 + 3));
                    assert_eq!(loads.len(), 4);
                    for w in loads.iter() {
                        assert!(w.in_flight <= 4, "{w:?}");
                        assert!(w.unprefilled_tokens <= 4 * 64, "{w:?}");
                        assert!(w.decoding <= 4, "{w:?}");
                    }
                    assert!(held.iter().all(|&n| n <= 3), "{held:?}");
                }
            })
        })
        .collect();
    for h in writers.into_iter().chain(readers) {
        h.join().expect("no panic");
    }
    assert!(idle(&l));
    assert_eq!(l.view(&keys(0..10)).1, vec![0; 4]);
    assert!(l.snapshot().iter().all(|w| w.calibrated));
}
