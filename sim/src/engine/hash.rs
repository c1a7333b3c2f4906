//! Chained block hashes for automatic prefix caching.
//!
//! A block's hash covers its parent's hash and its own token ids, so equal
//! hashes mean equal prefixes. The hash is keyed by the engine's `hash_seed`
//! (vLLM keys its hashes per process the same way when `PYTHONHASHSEED` is
//! unset); hashes are opaque to everyone else and only map `BlockRemoved`
//! back to `BlockStored`.

use xxhash_rust::xxh3::xxh3_64_with_seed;

/// Hashes full blocks of a token sequence, one parent at a time.
#[derive(Debug, Clone, Copy)]
pub(crate) struct BlockHasher {
    seed: u64,
    root: u64,
}

// === impl BlockHasher ===

impl BlockHasher {
    pub(crate) fn new(seed: u64) -> Self {
        let root = xxh3_64_with_seed(b"kvsteer-sim-none-hash", seed);
        Self { seed, root }
    }

    /// The hasher of an adapter's blocks: none of its hashes equals the
    /// base model's or another adapter's for the same tokens.
    pub(crate) fn for_lora(&self, name: &str) -> Self {
        let seed = xxh3_64_with_seed(name.as_bytes(), self.seed ^ 0x6c6f_7261);
        Self::new(seed)
    }

    /// The hasher of a request with vLLM's `cache_salt`: the salt keys the
    /// first block (vLLM puts it in the first block's extra keys only), and
    /// through the chain every later one.
    pub(crate) fn salted(&self, salt: &str) -> Self {
        let root = xxh3_64_with_seed(salt.as_bytes(), self.root ^ 0x7361_6c74);
        Self {
            seed: self.seed,
            root,
        }
    }

    /// The hash of the block holding `tokens` after the block `parent`
    /// (`None` for the first block of a sequence).
    pub(crate) fn hash(&self, parent: Option<u64>, tokens: &[u32]) -> u64 {
        let mut buf = [0u8; 8 + 4 * 64];
        let parent = parent.unwrap_or(self.root);
        if tokens.len() <= 64 {
            buf[..8].copy_from_slice(&parent.to_le_bytes());
            for (i, t) in tokens.iter().enumerate() {
                buf[8 + 4 * i..12 + 4 * i].copy_from_slice(&t.to_le_bytes());
            }
            return xxh3_64_with_seed(&buf[..8 + 4 * tokens.len()], self.seed);
        }
        let mut bytes = Vec::with_capacity(8 + 4 * tokens.len());
        bytes.extend_from_slice(&parent.to_le_bytes());
        for t in tokens {
            bytes.extend_from_slice(&t.to_le_bytes());
        }
        xxh3_64_with_seed(&bytes, self.seed)
    }

    /// Extends `hashes` with the hash of every full block of `tokens` not
    /// hashed yet.
    pub(crate) fn extend(&self, hashes: &mut Vec<u64>, tokens: &[u32], block_size: usize) {
        while (hashes.len() + 1) * block_size <= tokens.len() {
            let i = hashes.len();
            let h = self.hash(
                hashes.last().copied(),
                &tokens[i * block_size..(i + 1) * block_size],
            );
            hashes.push(h);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chained_and_seeded() {
        let a = BlockHasher::new(1);
        let toks: Vec<u32> = (0..40).collect();
        let mut h = Vec::new();
        a.extend(&mut h, &toks, 16);
        assert_eq!(h.len(), 2);
        assert_eq!(h[1], a.hash(Some(h[0]), &toks[16..32]));
        // Same block content under a different parent hashes differently.
        assert_ne!(a.hash(None, &toks[16..32]), h[1]);
        // Another seed gives other hashes; the same seed the same ones.
        assert_ne!(BlockHasher::new(2).hash(None, &toks[..16]), h[0]);
        assert_eq!(BlockHasher::new(1).hash(None, &toks[..16]), h[0]);
        // Large blocks take the allocation path.
        let big: Vec<u32> = (0..128).collect();
        assert_ne!(a.hash(None, &big), a.hash(None, &big[..127]));
    }

    #[test]
    fn a_salt_keys_every_block_through_the_first() {
        let a = BlockHasher::new(1);
        let toks: Vec<u32> = (0..32).collect();
        let (mut plain, mut s1, mut s1_again, mut s2) = (vec![], vec![], vec![], vec![]);
        a.extend(&mut plain, &toks, 16);
        a.salted("t1").extend(&mut s1, &toks, 16);
        a.salted("t1").extend(&mut s1_again, &toks, 16);
        a.salted("t2").extend(&mut s2, &toks, 16);
        assert_eq!(s1, s1_again);
        for i in 0..2 {
            assert_ne!(s1[i], plain[i]);
            assert_ne!(s1[i], s2[i]);
        }
        // Only the root differs: later blocks chain as usual.
        assert_eq!(s1[1], a.hash(Some(s1[0]), &toks[16..32]));
    }
}
