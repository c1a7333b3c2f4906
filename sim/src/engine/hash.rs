//! Chained block hashes for automatic prefix caching.
//!
//! A block's hash covers its parent's hash and its own token ids, so equal
//! hashes mean equal prefixes. Two algorithms:
//!
//! - [`HashAlgo::Xxh3`] (the default): XXH3-64 keyed by the engine's
//!   `hash_seed` (vLLM keys its hashes per process the same way when
//!   `PYTHONHASHSEED` is unset); hashes are opaque to everyone else and only
//!   map `BlockRemoved` back to `BlockStored`.
//! - [`HashAlgo::Sha256Cbor`]: vLLM's `--prefix-caching-hash-algo
//!   sha256_cbor`, bit for bit (`vllm/v1/core/kv_cache_utils.py`
//!   `hash_block_tokens` and `init_none_hash`, `vllm/utils/hashing.py`
//!   `sha256_cbor`): `sha256(canonical_cbor([parent, [tokens], extra]))`,
//!   the chain starting at `NONE_HASH = sha256_cbor(seed)`. Events carry the
//!   last 8 bytes of each digest, big-endian (vLLM's int block hashes), so a
//!   peer that recomputes vLLM's hashes from token ids finds the simulator's.

use sha2::{Digest, Sha256};
use xxhash_rust::xxh3::xxh3_64_with_seed;

use super::config::HashAlgo;

/// Hashes full blocks of a token sequence, one parent at a time.
#[derive(Debug, Clone)]
pub(crate) struct BlockHasher {
    seed: u64,
    root: u64,
    sha: Option<Sha256Chain>,
}

/// State of a `sha256_cbor` chain: vLLM chains the full 32-byte digests,
/// which the `u64` hashes kept per request do not hold.
#[derive(Debug, Clone)]
struct Sha256Chain {
    none_hash: [u8; 32],
    /// Digest of the last block hashed, with the number of blocks it ends.
    tip: [u8; 32],
    tip_blocks: usize,
    lora: Option<String>,
    salt: Option<String>,
}

// === impl BlockHasher ===

impl BlockHasher {
    /// The hasher of `algo`; `none_hash_seed` seeds `sha256_cbor`'s chain
    /// (vLLM: `PYTHONHASHSEED`, else `"vllm-none-hash"`), `seed` XXH3's.
    pub(crate) fn new(algo: HashAlgo, seed: u64, none_hash_seed: &str) -> Self {
        let root = xxh3_64_with_seed(b"kvsteer-sim-none-hash", seed);
        let sha = match algo {
            HashAlgo::Xxh3 => None,
            HashAlgo::Sha256Cbor => {
                let mut buf = Vec::with_capacity(9 + none_hash_seed.len());
                cbor_head(&mut buf, 3, none_hash_seed.len() as u64);
                buf.extend_from_slice(none_hash_seed.as_bytes());
                let none_hash: [u8; 32] = Sha256::digest(&buf).into();
                Some(Sha256Chain {
                    none_hash,
                    tip: none_hash,
                    tip_blocks: 0,
                    lora: None,
                    salt: None,
                })
            }
        };
        Self { seed, root, sha }
    }

    /// The hasher of an adapter's blocks: none of its hashes equals the
    /// base model's or another adapter's for the same tokens.
    pub(crate) fn for_lora(&self, name: &str) -> Self {
        let seed = xxh3_64_with_seed(name.as_bytes(), self.seed ^ 0x6c6f_7261);
        let mut hasher = Self {
            seed,
            root: xxh3_64_with_seed(b"kvsteer-sim-none-hash", seed),
            sha: self.sha.clone(),
        };
        if let Some(sha) = &mut hasher.sha {
            sha.lora = Some(name.to_owned());
        }
        hasher
    }

    /// The hasher of a request with vLLM's `cache_salt`: the salt keys the
    /// first block (vLLM puts it in the first block's extra keys only), and
    /// through the chain every later one.
    pub(crate) fn salted(&self, salt: &str) -> Self {
        let root = xxh3_64_with_seed(salt.as_bytes(), self.root ^ 0x7361_6c74);
        let mut sha = self.sha.clone();
        if let Some(sha) = &mut sha {
            sha.salt = Some(salt.to_owned());
        }
        Self {
            seed: self.seed,
            root,
            sha,
        }
    }

    /// The XXH3 hash of the block holding `tokens` after the block `parent`
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
    pub(crate) fn extend(&mut self, hashes: &mut Vec<u64>, tokens: &[u32], block_size: usize) {
        if let Some(sha) = &mut self.sha {
            sha.extend(hashes, tokens, block_size);
            return;
        }
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

// === impl Sha256Chain ===

impl Sha256Chain {
    fn extend(&mut self, hashes: &mut Vec<u64>, tokens: &[u32], block_size: usize) {
        if block_size == 0 {
            return;
        }
        if self.tip_blocks != hashes.len() {
            // The caller's hashes moved without us (never so far): rebuild
            // the tip from the tokens they cover.
            self.tip = self.none_hash;
            self.tip_blocks = 0;
            let covered = hashes.len().min(tokens.len() / block_size);
            for i in 0..covered {
                self.tip = self.block(i, &tokens[i * block_size..(i + 1) * block_size]);
            }
            self.tip_blocks = covered;
            hashes.truncate(covered);
        }
        while (hashes.len() + 1) * block_size <= tokens.len() {
            let i = hashes.len();
            self.tip = self.block(i, &tokens[i * block_size..(i + 1) * block_size]);
            self.tip_blocks += 1;
            hashes.push(digest_to_u64(&self.tip));
        }
    }

    /// `hash_block_tokens`: sha256 of the canonical CBOR of
    /// `(parent, tuple(tokens), extra_keys)` for block `index`.
    fn block(&self, index: usize, tokens: &[u32]) -> [u8; 32] {
        let mut buf = Vec::with_capacity(64 + 5 * tokens.len());
        cbor_head(&mut buf, 4, 3);
        cbor_head(&mut buf, 2, 32);
        buf.extend_from_slice(&self.tip);
        cbor_head(&mut buf, 4, tokens.len() as u64);
        for &t in tokens {
            cbor_head(&mut buf, 0, u64::from(t));
        }
        // The extra keys the event reports for this block: the adapter's
        // name on every block, the salt on the first (vLLM hashed these
        // values themselves up to 0.23).
        let salt = self.salt.as_deref().filter(|_| index == 0);
        let keys: Vec<&str> = self.lora.as_deref().into_iter().chain(salt).collect();
        if keys.is_empty() {
            buf.push(0xf6);
        } else {
            cbor_head(&mut buf, 4, keys.len() as u64);
            for k in keys {
                cbor_head(&mut buf, 3, k.len() as u64);
                buf.extend_from_slice(k.as_bytes());
            }
        }
        Sha256::digest(&buf).into()
    }
}

/// vLLM's int form of a block hash: the digest's last 8 bytes, big-endian.
fn digest_to_u64(digest: &[u8; 32]) -> u64 {
    let mut tail = [0u8; 8];
    tail.copy_from_slice(&digest[24..]);
    u64::from_be_bytes(tail)
}

/// A CBOR head in its shortest form (canonical CBOR, RFC 8949 §4.2.1).
fn cbor_head(buf: &mut Vec<u8>, major: u8, n: u64) {
    let m = major << 5;
    if n < 24 {
        buf.push(m | n as u8);
    } else if n <= u64::from(u8::MAX) {
        buf.extend_from_slice(&[m | 24, n as u8]);
    } else if n <= u64::from(u16::MAX) {
        buf.push(m | 25);
        buf.extend_from_slice(&(n as u16).to_be_bytes());
    } else if n <= u64::from(u32::MAX) {
        buf.push(m | 26);
        buf.extend_from_slice(&(n as u32).to_be_bytes());
    } else {
        buf.push(m | 27);
        buf.extend_from_slice(&n.to_be_bytes());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn xxh3(seed: u64) -> BlockHasher {
        BlockHasher::new(HashAlgo::Xxh3, seed, "")
    }

    #[test]
    fn chained_and_seeded() {
        let mut a = xxh3(1);
        let toks: Vec<u32> = (0..40).collect();
        let mut h = Vec::new();
        a.extend(&mut h, &toks, 16);
        assert_eq!(h.len(), 2);
        assert_eq!(h[1], a.hash(Some(h[0]), &toks[16..32]));
        // Same block content under a different parent hashes differently.
        assert_ne!(a.hash(None, &toks[16..32]), h[1]);
        // Another seed gives other hashes; the same seed the same ones.
        assert_ne!(xxh3(2).hash(None, &toks[..16]), h[0]);
        assert_eq!(xxh3(1).hash(None, &toks[..16]), h[0]);
        // Large blocks take the allocation path.
        let big: Vec<u32> = (0..128).collect();
        assert_ne!(a.hash(None, &big), a.hash(None, &big[..127]));
    }

    #[test]
    fn a_salt_keys_every_block_through_the_first() {
        let mut a = xxh3(1);
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

/// `sha256_cbor` against the vectors vLLM 0.33 itself produced
/// (`shared/vllm-events`, README there).
#[cfg(test)]
mod vllm_tests {

    use serde_json::Value;

    use super::*;

    fn golden(name: &str) -> Value {
        let dir = kvsteer_e2e::shared_dir();
        let path = dir.join("vllm-events").join(name);
        serde_json::from_str(&std::fs::read_to_string(path).expect("golden file")).expect("json")
    }

    fn strings(v: &Value) -> Vec<String> {
        v.as_array()
            .expect("array")
            .iter()
            .map(|h| h.as_str().expect("string").to_owned())
            .collect()
    }

    fn tokens(v: &Value) -> Vec<u32> {
        v.as_array()
            .expect("array")
            .iter()
            .map(|t| t.as_u64().expect("token") as u32)
            .collect()
    }

    fn hex(d: &[u8; 32]) -> String {
        d.iter().map(|b| format!("{b:02x}")).collect()
    }

    fn sha256_cbor() -> BlockHasher {
        BlockHasher::new(HashAlgo::Sha256Cbor, 0, "vllm-none-hash")
    }

    /// The prompt of the v033 vectors (blocks 1..4) with its full digests.
    fn prompt() -> (Vec<u32>, Vec<String>) {
        let v = golden("v033_bytes_hashes.json");
        let events = v["events"].as_array().expect("events");
        let mut toks = tokens(&events[0]["token_ids"]);
        toks.extend(tokens(&events[1]["token_ids"]));
        let mut digests = strings(&events[0]["block_hashes"]);
        digests.extend(strings(&events[1]["block_hashes"]));
        (toks, digests)
    }

    #[test]
    fn none_hash_and_digests_are_vllms() {
        let h = sha256_cbor();
        let none = h.sha.as_ref().expect("sha").none_hash;
        assert_eq!(
            hex(&none),
            golden("index.json")["none_hash_hex"].as_str().expect("hex")
        );
        let (toks, digests) = prompt();
        assert_eq!((toks.len(), digests.len()), (64, 4));
        let mut h = sha256_cbor();
        let mut hashes = Vec::new();
        for (i, want) in digests.iter().enumerate() {
            h.extend(&mut hashes, &toks[..(16 * (i + 1) + 3).min(toks.len())], 16);
            assert_eq!(hashes.len(), i + 1);
            assert_eq!(&hex(&h.sha.as_ref().expect("sha").tip), want, "block {i}");
        }
    }

    #[test]
    fn event_hashes_are_the_digests_last_8_bytes() {
        let (toks, _) = prompt();
        let mut want =
            strings(&golden("v033_stored_single_block.json")["events"][0]["block_hashes"]);
        let chain = golden("v033_stored_chain_3_blocks.json");
        want.extend(strings(&chain["events"][0]["block_hashes"]));
        let mut hashes = Vec::new();
        sha256_cbor().extend(&mut hashes, &toks, 16);
        let got: Vec<String> = hashes.iter().map(u64::to_string).collect();
        assert_eq!(got, want);
        assert_eq!(
            chain["events"][0]["parent_block_hash"].as_str(),
            Some(got[0].as_str())
        );
    }

    #[test]
    fn chain_survives_piecewise_extension_and_lost_state() {
        let (toks, _) = prompt();
        let mut whole = Vec::new();
        sha256_cbor().extend(&mut whole, &toks, 16);
        // Token by token, as decoding extends a request.
        let mut h = sha256_cbor();
        let mut piecewise = Vec::new();
        for n in 0..=toks.len() {
            h.extend(&mut piecewise, &toks[..n], 16);
        }
        assert_eq!(piecewise, whole);
        // A hasher whose tip does not match the hashes rebuilds it.
        let mut fresh = sha256_cbor();
        let mut partial = whole[..2].to_vec();
        fresh.extend(&mut partial, &toks, 16);
        assert_eq!(partial, whole);
    }

    #[test]
    fn seed_lora_and_salt_move_every_hash() {
        let (toks, _) = prompt();
        let run = |h: BlockHasher| {
            let mut h = h;
            let mut out = Vec::new();
            h.extend(&mut out, &toks, 16);
            out
        };
        let plain = run(sha256_cbor());
        let seeded = run(BlockHasher::new(HashAlgo::Sha256Cbor, 0, "42"));
        let lora = run(sha256_cbor().for_lora("sql-lora"));
        let salted = run(sha256_cbor().salted("tenant-a"));
        let both = run(sha256_cbor().for_lora("sql-lora").salted("tenant-a"));
        for other in [&seeded, &lora, &salted, &both] {
            assert_eq!(other.len(), plain.len());
            for (a, b) in plain.iter().zip(other.iter()) {
                assert_ne!(a, b);
            }
        }
        assert_ne!(lora, both);
        // The xxh3 seed does not touch sha256_cbor.
        assert_eq!(
            run(BlockHasher::new(HashAlgo::Sha256Cbor, 9, "vllm-none-hash")),
            plain
        );
    }
}
