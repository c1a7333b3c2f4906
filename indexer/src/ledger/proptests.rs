//! The report state machine over random interleavings of picks, reports
//! and time, against a trivial reference model: per id, open (worker,
//! tokens, first token or not, prompt blocks) or tombstoned.

use super::*;
use proptest::prelude::*;
use std::collections::HashMap;

const IDS: u8 = 6;
const WORKERS: usize = 3;
const GROUPS: u64 = 3;
const TTL: Duration = Duration::from_secs(60);
const TOMB_TTL: Duration = Duration::from_secs(30);

#[derive(Debug, Clone)]
enum Op {
    Pick {
        id: u8,
        worker: usize,
        tokens: u16,
        group: u64,
        blocks: u64,
    },
    First(u8),
    Done(u8),
    Cancel(u8),
    /// Time passes, then the housekeeping sweep.
    Tick(u64),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0..IDS, 0..WORKERS, 0u16..500, 0..GROUPS, 0u64..6).prop_map(
            |(id, worker, tokens, group, blocks)| Op::Pick { id, worker, tokens, group, blocks }
        ),
        3 => (0..IDS).prop_map(Op::First),
        2 => (0..IDS).prop_map(Op::Done),
        1 => (0..IDS).prop_map(Op::Cancel),
        1 => (0u64..40).prop_map(Op::Tick),
    ]
}

/// A prompt of group `group`: prompts of one group share their prefix.
fn prompt(group: u64, blocks: u64) -> Vec<BlockKey> {
    (0..blocks).map(|i| BlockKey(group * 100 + i)).collect()
}

#[derive(Debug, Clone)]
struct Open {
    worker: usize,
    tokens: u64,
    first: bool,
    picked_at: Instant,
    keys: Vec<BlockKey>,
}

#[derive(Default)]
struct Model {
    open: HashMap<String, Open>,
    tombs: HashMap<String, Instant>,
}

impl Model {
    fn pick(&mut self, id: &str, open: Open) {
        if self.tombs.remove(id).is_none() {
            self.open.insert(id.to_owned(), open);
        }
    }

    fn first(&mut self, id: &str) {
        if let Some(o) = self.open.get_mut(id) {
            o.first = true;
        }
    }

    fn finish(&mut self, id: &str, now: Instant) {
        if self.open.remove(id).is_none() {
            self.tombs.entry(id.to_owned()).or_insert(now);
        }
    }

    fn expire(&mut self, now: Instant) {
        self.open
            .retain(|_, o| now.saturating_duration_since(o.picked_at) <= TTL);
        self.tombs
            .retain(|_, at| now.saturating_duration_since(*at) <= TOMB_TTL);
    }

    fn loads(&self) -> Vec<(u32, u64, u32)> {
        let mut out = vec![(0, 0, 0); WORKERS];
        for o in self.open.values() {
            let w = &mut out[o.worker];
            w.0 += 1;
            if o.first {
                w.2 += 1;
            } else {
                w.1 += o.tokens;
            }
        }
        out
    }

    /// Per worker, the leading blocks of `keys` each held by some prompt
    /// in flight there.
    fn held(&self, keys: &[BlockKey]) -> Vec<u32> {
        (0..WORKERS)
            .map(|w| {
                let held = |k: &BlockKey| {
                    self.open
                        .values()
                        .any(|o| o.worker == w && o.keys.contains(k))
                };
                keys.iter().take_while(|k| held(k)).count() as u32
            })
            .collect()
    }
}

fn check(l: &Ledger, m: &Model) -> Result<(), TestCaseError> {
    let loads: Vec<(u32, u64, u32)> = l
        .snapshot()
        .iter()
        .map(|w| (w.in_flight, w.unprefilled_tokens, w.decoding))
        .collect();
    prop_assert_eq!(loads, m.loads());
    prop_assert_eq!(l.len(), m.open.len());
    prop_assert_eq!(l.stats().tombstones, m.tombs.len());
    for g in 0..GROUPS {
        let keys = prompt(g, 8);
        prop_assert_eq!(l.view(&keys).1, m.held(&keys), "group {}", g);
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn reports_in_any_order_match_the_model(ops in prop::collection::vec(op(), 0..60)) {
        let l = Ledger::with_tombstones(WORKERS, 1000.0, TTL, 10_000, TOMB_TTL, 1_000);
        let mut m = Model::default();
        let mut now = Instant::now();
        for op in ops {
            match op {
                Op::Pick { id, worker, tokens, group, blocks } => {
                    let id = id.to_string();
                    let keys = prompt(group, blocks);
                    let e = Entry {
                        worker,
                        prediction: Prediction {
                            uncached_tokens: f64::from(tokens),
                            ..Default::default()
                        },
                        picked_at: now,
                        first_token_at: None,
                        tenant: "t".into(),
                        policy: "kvsteer",
                    };
                    l.open(&id, e, keys.clone());
                    m.pick(&id, Open { worker, tokens: u64::from(tokens), first: false, picked_at: now, keys });
                }
                Op::First(id) => {
                    l.first_token(&id.to_string(), now);
                    m.first(&id.to_string());
                }
                Op::Done(id) | Op::Cancel(id) => {
                    l.finish(&id.to_string(), now);
                    m.finish(&id.to_string(), now);
                }
                Op::Tick(s) => {
                    now += Duration::from_secs(s);
                    l.expire(now);
                    m.expire(now);
                }
            }
            check(&l, &m)?;
        }
        // Every request ends, the tombstones' time passes: nothing is left.
        for id in 0..IDS {
            l.finish(&id.to_string(), now);
        }
        prop_assert_eq!(l.len(), 0);
        now += TOMB_TTL + Duration::from_secs(1);
        l.expire(now);
        let s = l.stats();
        prop_assert_eq!((s.entries, s.tombstones, s.held_blocks), (0, 0, 0));
        prop_assert!(l.snapshot().iter().all(|w| (w.in_flight, w.unprefilled_tokens, w.decoding) == (0, 0, 0)));
        prop_assert!(l.inner.lock().held_order.is_empty());
    }
}
