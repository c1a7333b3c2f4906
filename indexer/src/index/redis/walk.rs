//! Turning Redis replies into [`WorkerMatch`]es: the client-side walk of the
//! pipeline mode and the decoding of the script mode's flat reply. Pure
//! functions, tested here.

use ::redis::Value;

use super::super::{WorkerId, WorkerMatch};
use super::layout::gpu_copies;

/// One block's holders: (worker, packed copies).
pub type Holders = Vec<(WorkerId, u64)>;

/// Decode a pipeline of `HGETALL` replies (RESP2 flat arrays or RESP3 maps)
/// without intermediate strings. Fields that are not worker ids are
/// skipped (nothing kvsteer writes); `None` when a reply is malformed.
pub fn decode_hgetall(replies: Vec<Value>) -> Option<Vec<Holders>> {
    replies
        .into_iter()
        .map(|reply| {
            let mut holders = Holders::new();
            let mut push = |field: &Value, packed: &Value| -> Option<()> {
                let packed = as_u64(packed)?;
                if let Some(worker) = as_u64(field).and_then(|w| WorkerId::try_from(w).ok()) {
                    holders.push((worker, packed));
                }
                Some(())
            };
            match reply {
                Value::Array(flat) if flat.len().is_multiple_of(2) => {
                    for pair in flat.chunks_exact(2) {
                        push(&pair[0], &pair[1])?;
                    }
                }
                Value::Map(pairs) => {
                    for (field, packed) in &pairs {
                        push(field, packed)?;
                    }
                }
                Value::Nil => {}
                _ => return None,
            }
            Some(holders)
        })
        .collect()
}

fn as_u64(v: &Value) -> Option<u64> {
    match v {
        Value::BulkString(b) => std::str::from_utf8(b).ok()?.parse().ok(),
        Value::Int(i) => u64::try_from(*i).ok(),
        _ => None,
    }
}

/// Longest-prefix walk over the holders of each key of the chain, in order;
/// same semantics as the memory backend.
pub fn walk(chain: &[Holders]) -> Vec<WorkerMatch> {
    let Some(first) = chain.first() else {
        return Vec::new();
    };
    let mut matches: Vec<WorkerMatch> = first
        .iter()
        .map(|&(worker, packed)| WorkerMatch {
            worker,
            gpu_blocks: u32::from(gpu_copies(packed) > 0),
            cpu_blocks: 1,
        })
        .collect();
    matches.sort_unstable_by_key(|m| m.worker);
    matches.dedup_by_key(|m| m.worker);
    for (i, holders) in chain.iter().enumerate().skip(1) {
        let depth = i as u32;
        let mut alive = false;
        for m in matches.iter_mut().filter(|m| m.cpu_blocks == depth) {
            if let Some((_, packed)) = holders.iter().find(|(w, _)| *w == m.worker) {
                m.cpu_blocks += 1;
                if m.gpu_blocks == depth && gpu_copies(*packed) > 0 {
                    m.gpu_blocks += 1;
                }
                alive = true;
            }
        }
        if !alive {
            break;
        }
    }
    matches
}

/// Decode the lookup script's `worker, gpu, cpu, …` reply. `None` when the
/// reply is not a multiple of three or a value is out of range.
pub fn decode_script_reply(flat: &[i64]) -> Option<Vec<WorkerMatch>> {
    if !flat.len().is_multiple_of(3) {
        return None;
    }
    let mut matches = Vec::with_capacity(flat.len() / 3);
    for t in flat.chunks_exact(3) {
        if t[0] < 0 {
            continue; // a field that is not a worker id
        }
        let worker = WorkerId::try_from(t[0]).ok()?;
        let gpu_blocks = u32::try_from(t[1]).ok()?;
        let cpu_blocks = u32::try_from(t[2]).ok()?;
        if gpu_blocks > cpu_blocks || cpu_blocks == 0 {
            return None;
        }
        matches.push(WorkerMatch {
            worker,
            gpu_blocks,
            cpu_blocks,
        });
    }
    matches.sort_unstable_by_key(|m| m.worker);
    matches.dedup_by_key(|m| m.worker);
    Some(matches)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::index::redis::layout::CPU_UNIT;

    fn h(entries: &[(&str, u64)]) -> Holders {
        let flat = entries
            .iter()
            .flat_map(|(f, p)| {
                [
                    Value::BulkString(f.as_bytes().to_vec()),
                    Value::BulkString(p.to_string().into_bytes()),
                ]
            })
            .collect();
        decode_hgetall(vec![Value::Array(flat)]).unwrap().remove(0)
    }

    fn m(worker: WorkerId, gpu_blocks: u32, cpu_blocks: u32) -> WorkerMatch {
        WorkerMatch {
            worker,
            gpu_blocks,
            cpu_blocks,
        }
    }

    #[test]
    fn walk_follows_each_worker_to_its_first_miss() {
        let chain = vec![
            h(&[("2", 1), ("0", 1), ("1", CPU_UNIT)]),
            h(&[("0", 1), ("1", 1), ("2", CPU_UNIT)]),
            h(&[("0", CPU_UNIT), ("1", 1)]),
            h(&[("0", 1)]),
            h(&[("1", 1)]),
        ];
        assert_eq!(walk(&chain), vec![m(0, 2, 4), m(1, 0, 3), m(2, 1, 2)]);
    }

    #[test]
    fn walk_stops_at_a_gap_even_if_later_keys_match() {
        let chain = vec![h(&[("0", 1)]), h(&[]), h(&[("0", 1)])];
        assert_eq!(walk(&chain), vec![m(0, 1, 1)]);
        assert_eq!(walk(&[h(&[]), h(&[("0", 1)])]), vec![]);
        assert_eq!(walk(&[]), vec![]);
    }

    #[test]
    fn walk_ignores_foreign_fields() {
        let chain = vec![h(&[("x", 1), ("3", 2)]), h(&[("x", 1), ("3", 1)])];
        assert_eq!(walk(&chain), vec![m(3, 2, 2)]);
    }

    #[test]
    fn hgetall_decoding() {
        let b = |s: &str| Value::BulkString(s.as_bytes().to_vec());
        let map = Value::Map(vec![(b("4"), b("7")), (b("x"), b("1"))]);
        assert_eq!(
            decode_hgetall(vec![map, Value::Array(vec![]), Value::Nil]),
            Some(vec![vec![(4, 7)], vec![], vec![]])
        );
        // Odd arrays, non-numeric values and other types are malformed.
        assert_eq!(decode_hgetall(vec![Value::Array(vec![b("1")])]), None);
        assert_eq!(
            decode_hgetall(vec![Value::Array(vec![b("1"), b("x")])]),
            None
        );
        assert_eq!(decode_hgetall(vec![Value::Int(3)]), None);
    }

    #[test]
    fn script_reply_decodes_and_rejects_garbage() {
        assert_eq!(
            decode_script_reply(&[2, 1, 3, 0, 0, 1, -1, 0, 1]),
            Some(vec![m(0, 0, 1), m(2, 1, 3)])
        );
        assert_eq!(decode_script_reply(&[]), Some(vec![]));
        assert_eq!(decode_script_reply(&[1, 2]), None);
        assert_eq!(decode_script_reply(&[1, 3, 2]), None);
        assert_eq!(decode_script_reply(&[1, 0, 0]), None);
        assert_eq!(decode_script_reply(&[1 << 40, 0, 1]), None);
    }
}
