//! The pick id: the key the indexer's ledger holds a request's load under,
//! from `Pick` to its terminal report.
//!
//! The filter makes it itself, one per HTTP stream; a client header never
//! becomes a pick id, so two requests sharing an `x-request-id` are two picks
//! and nobody can cancel another client's pick by guessing its id. An id is
//! a 64-bit nonce drawn once per plugin instance (per Envoy worker thread and
//! configuration) plus a counter of that instance, in hex:
//! `5f0c2e9a81d4b7e3-1a`. The nonce comes from the host's random source
//! (WASI `random_get`, which Envoy serves from BoringSSL's `RAND_bytes`),
//! mixed with the clock and the root context id, so instances of one VM, of
//! several VMs and of several Envoys do not collide (a clash needs two equal
//! 64-bit draws).

use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};

/// Hands out the pick ids of one plugin instance.
#[derive(Clone, Debug)]
pub struct PickIds {
    nonce: u64,
    next: u64,
}

// === impl PickIds ===

impl PickIds {
    /// A generator with a fixed nonce (tests, or a nonce drawn elsewhere).
    pub fn with_nonce(nonce: u64) -> Self {
        Self { nonce, next: 0 }
    }

    /// A generator with a fresh random nonce; `salt` (the clock, the root
    /// context id) is mixed in so that a broken random source alone cannot
    /// make two instances agree.
    pub fn random(salt: &[u64]) -> Self {
        Self::with_nonce(random_nonce(salt))
    }

    /// The next id. Ids of one generator never repeat (the counter would
    /// take 2^64 requests to wrap).
    pub fn next_id(&mut self) -> String {
        let id = format!("{:016x}-{:x}", self.nonce, self.next);
        self.next = self.next.wrapping_add(1);
        id
    }
}

/// 64 random bits: std's `RandomState` draws its SipHash keys from the
/// platform's random source (WASI `random_get` in the VM), so hashing the
/// salt with them gives a keyed-random value without another dependency.
fn random_nonce(salt: &[u64]) -> u64 {
    let mut hasher = RandomState::new().build_hasher();
    for value in salt {
        hasher.write_u64(*value);
    }
    hasher.finish()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    #[test]
    fn ids_of_one_generator_are_distinct_and_carry_the_nonce() {
        let mut ids = PickIds::with_nonce(0xabc);
        assert_eq!(ids.next_id(), "0000000000000abc-0");
        assert_eq!(ids.next_id(), "0000000000000abc-1");
        let many: HashSet<String> = (0..10_000).map(|_| ids.next_id()).collect();
        assert_eq!(many.len(), 10_000);
        assert!(many.iter().all(|id| id.starts_with("0000000000000abc-")));
    }

    #[test]
    fn generators_with_the_same_salt_draw_different_nonces() {
        // Two plugin instances started at the same instant with the same
        // context id still differ: the nonce is random, not derived.
        let nonces: HashSet<u64> = (0..64).map(|_| random_nonce(&[7, 1])).collect();
        assert_eq!(nonces.len(), 64);
        let mut a = PickIds::random(&[7, 1]);
        let mut b = PickIds::random(&[7, 1]);
        assert_ne!(a.next_id(), b.next_id());
    }

    #[test]
    fn counter_wraps_instead_of_panicking() {
        let mut ids = PickIds {
            nonce: 1,
            next: u64::MAX,
        };
        assert_eq!(ids.next_id(), "0000000000000001-ffffffffffffffff");
        assert_eq!(ids.next_id(), "0000000000000001-0");
    }
}
