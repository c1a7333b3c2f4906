//! Deterministic synthetic token ids: a token is a pure function of
//! `(seed, stream, position)`, so prompts are rebuilt on demand instead of
//! being stored, and two prompts share a prefix exactly when they share the
//! stream of that prefix.

/// Token ids are drawn from `[FIRST_TOKEN, FIRST_TOKEN + VOCAB)`: below the
/// Qwen3 special tokens (EOS is 151,645) and above the engine's filler ids.
pub const FIRST_TOKEN: u32 = 2_000;
pub const VOCAB: u64 = 140_000;

/// Stream kinds: each kind's ids never collide with another kind's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stream {
    /// A shared prefix (group, tenant salt).
    Prefix(u64, u64),
    /// A question of one user (group, user).
    Question(u64, u64),
    /// Tokens nobody else has (request or session number, part).
    Unique(u64, u64),
    /// One 512-token block of a Mooncake-style trace (hash id).
    TraceBlock(u64),
}

/// SplitMix64's finaliser: a cheap, well-mixed 64-bit hash.
pub fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

// === impl Stream ===

impl Stream {
    fn id(self) -> u64 {
        let (kind, a, b) = match self {
            Self::Prefix(a, b) => (1, a, b),
            Self::Question(a, b) => (2, a, b),
            Self::Unique(a, b) => (3, a, b),
            Self::TraceBlock(a) => (4, a, 0),
        };
        mix(mix(kind ^ mix(a)).wrapping_add(b))
    }
}

/// Appends `len` tokens of `stream`, from position `from`.
pub fn extend(out: &mut Vec<u32>, seed: u64, stream: Stream, from: u64, len: u64) {
    let base = mix(seed ^ stream.id());
    out.extend((from..from + len).map(|i| FIRST_TOKEN + (mix(base ^ i) % VOCAB) as u32));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_stream_same_tokens_other_stream_differs() {
        let (mut a, mut b, mut c) = (Vec::new(), Vec::new(), Vec::new());
        extend(&mut a, 7, Stream::Prefix(1, 0), 0, 64);
        extend(&mut b, 7, Stream::Prefix(1, 0), 0, 32);
        extend(&mut b, 7, Stream::Prefix(1, 0), 32, 32);
        extend(&mut c, 7, Stream::Question(1, 0), 0, 64);
        assert_eq!(a, b);
        assert_ne!(a, c);
        let mut d = Vec::new();
        extend(&mut d, 8, Stream::Prefix(1, 0), 0, 64);
        assert_ne!(a, d);
        assert!(
            a.iter()
                .all(|&t| (FIRST_TOKEN..FIRST_TOKEN + VOCAB as u32).contains(&t))
        );
    }
}
