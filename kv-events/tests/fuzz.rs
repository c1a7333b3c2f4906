//! Seeded fuzz-style checks: random bytes and mutated/truncated golden
//! payloads must decode to `Ok` or `Err`, never panic; whatever decodes
//! re-encodes to a payload that decodes to the same thing.

use kvsteer_kv_events::{Encoding, decode_batch, encode_batch};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

fn golden_payloads() -> Vec<Vec<u8>> {
    let shared = kvsteer_e2e::shared_dir();
    let dir = shared.join("vllm-events");
    let mut out: Vec<Vec<u8>> = std::fs::read_dir(&dir)
        .expect("golden dir")
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "msgpack"))
        .map(|p| std::fs::read(p).expect("payload"))
        .collect();
    out.sort();
    assert!(out.len() >= 16);
    out
}

/// Decoding must not panic; a decoded batch must survive a round trip.
fn check(input: &[u8]) -> bool {
    let Ok(d) = decode_batch(input) else {
        return false;
    };
    for enc in [Encoding::Map, Encoding::Array] {
        let bytes = encode_batch(&d.batch, enc);
        let again = decode_batch(&bytes).expect("our own output decodes");
        assert!(again.skipped.is_empty());
        assert_eq!(encode_batch(&again.batch, enc), bytes, "stable re-encoding");
    }
    true
}

fn mutate(rng: &mut SmallRng, base: &[u8]) -> Vec<u8> {
    let mut b = base.to_vec();
    for _ in 0..rng.random_range(1..4) {
        match rng.random_range(0..5) {
            0 if !b.is_empty() => {
                let i = rng.random_range(0..b.len());
                b[i] = rng.random();
            }
            1 if !b.is_empty() => {
                let i = rng.random_range(0..b.len());
                b[i] ^= 1 << rng.random_range(0..8);
            }
            2 => {
                let i = rng.random_range(0..=b.len());
                b.insert(i, rng.random());
            }
            3 if !b.is_empty() => {
                let i = rng.random_range(0..b.len());
                b.remove(i);
            }
            _ => {
                let n = rng.random_range(0..=b.len());
                b.truncate(n);
            }
        }
    }
    b
}

#[test]
fn random_bytes_never_panic() {
    let mut rng = SmallRng::seed_from_u64(0x6b76_7374);
    for _ in 0..5000 {
        let len = rng.random_range(0..96);
        let mut b: Vec<u8> = (0..len).map(|_| rng.random()).collect();
        // Bias towards a plausible envelope so the event decoder gets exercised.
        if rng.random_bool(0.5) && !b.is_empty() {
            b[0] = 0x93;
        }
        check(&b);
    }
}

#[test]
fn mutated_vectors_never_panic() {
    let mut rng = SmallRng::seed_from_u64(42);
    let payloads = golden_payloads();
    let mut decoded = 0;
    for _ in 0..6000 {
        let base = &payloads[rng.random_range(0..payloads.len())];
        if check(&mutate(&mut rng, base)) {
            decoded += 1;
        }
    }
    // Many single-byte changes keep a valid envelope (e.g. inside token ids).
    assert!(decoded > 100, "only {decoded} mutants decoded");
}

#[test]
fn every_truncation_is_an_error() {
    for p in golden_payloads() {
        for n in 0..p.len() {
            assert!(decode_batch(&p[..n]).is_err(), "prefix of {n} bytes");
        }
    }
}
