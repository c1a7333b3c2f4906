//! Key names and value packing (the layout is described in `README.md`).
//!
//! - `{prefix}:b:{key:016x}` — hash, field = worker id (decimal), value =
//!   packed copies `gpu + cpu * 65536` (both saturate at 65535).
//! - `{prefix}:w:{worker}` — set of the block-hash key names holding a field
//!   of that worker (purge and per-worker counts).
//! - `{prefix}:workers` — set of worker ids that wrote (stats refresh).
//! - `{prefix}:lease:{worker}` — string, the id of the replica allowed to
//!   write that worker (`writer: auto`), with a PX TTL.

use super::super::{Tier, WorkerId};
use crate::keys::BlockKey;

/// Multiplier of the CPU count in a packed value.
pub const CPU_UNIT: u64 = 1 << 16;

#[derive(Clone, Debug)]
pub struct Layout {
    prefix: String,
}

// === impl Layout ===

impl Layout {
    pub fn new(prefix: &str) -> Self {
        Self {
            prefix: prefix.to_owned(),
        }
    }

    pub fn block(&self, key: BlockKey) -> String {
        format!("{}:b:{:016x}", self.prefix, key.0)
    }

    pub fn worker_set(&self, worker: WorkerId) -> String {
        format!("{}:w:{worker}", self.prefix)
    }

    pub fn lease(&self, worker: WorkerId) -> String {
        format!("{}:lease:{worker}", self.prefix)
    }

    pub fn registry(&self) -> String {
        format!("{}:workers", self.prefix)
    }

    /// `SCAN MATCH` pattern of every block key.
    pub fn block_pattern(&self) -> String {
        format!("{}:b:*", self.prefix)
    }
}

/// The apply script's op code.
pub fn op_code(op: &super::super::KeyOp) -> u8 {
    use super::super::KeyOp;
    match op {
        KeyOp::Add(_, Tier::Gpu) => b'g',
        KeyOp::Add(_, Tier::Cpu) => b'c',
        KeyOp::Remove(_, Tier::Gpu) => b'G',
        KeyOp::Remove(_, Tier::Cpu) => b'C',
        KeyOp::Purge(_) => b'p',
    }
}

/// Copies on the GPU tier of a packed value.
pub fn gpu_copies(packed: u64) -> u64 {
    packed % CPU_UNIT
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::index::KeyOp;

    #[test]
    fn names() {
        let l = Layout::new("kv");
        assert_eq!(l.block(BlockKey(0xab)), "kv:b:00000000000000ab");
        assert_eq!(l.block(BlockKey(u64::MAX)), "kv:b:ffffffffffffffff");
        assert_eq!(l.worker_set(7), "kv:w:7");
        assert_eq!(l.registry(), "kv:workers");
        assert_eq!(l.lease(3), "kv:lease:3");
        assert_eq!(l.block_pattern(), "kv:b:*");
    }

    #[test]
    fn packing_and_op_codes() {
        assert_eq!(gpu_copies(3 + 2 * CPU_UNIT), 3);
        assert_eq!(gpu_copies(2 * CPU_UNIT), 0);
        let k = BlockKey(1);
        let codes: Vec<u8> = [
            KeyOp::Add(k, Tier::Gpu),
            KeyOp::Add(k, Tier::Cpu),
            KeyOp::Remove(k, Tier::Gpu),
            KeyOp::Remove(k, Tier::Cpu),
            KeyOp::Purge(k),
        ]
        .iter()
        .map(op_code)
        .collect();
        assert_eq!(codes, b"gcGCp");
    }
}
