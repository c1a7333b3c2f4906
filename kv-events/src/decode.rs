//! Payload → [`EventBatch`]. Accepts both the map form (vLLM 0.24+) and the
//! array form (0.23 and earlier), told apart per event. A bad or unknown
//! single event is skipped and recorded; only a broken batch envelope fails.

use crate::event::{BlockHash, BlockRemoved, BlockStored, EventBatch, ExtraKey, KvEvent};
use crate::wire::reader::{Int, Reader, WireError};
use crate::wire::{ALL_BLOCKS_CLEARED, BLOCK_REMOVED, BLOCK_STORED, REMOVED_FIELDS, STORED_FIELDS};

/// A decoded payload: the events that could be read, and those that were skipped.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct DecodedBatch {
    pub batch: EventBatch,
    pub skipped: Vec<SkippedEvent>,
}

/// One event left out of [`DecodedBatch::batch`]; `index` is its position
/// in the payload's event array.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SkippedEvent {
    pub index: usize,
    pub reason: SkipReason,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SkipReason {
    #[error("unknown event type {0:?}")]
    UnknownType(String),
    #[error("event has no type")]
    MissingType,
    #[error("event is neither a map nor an array (marker 0x{0:02x})")]
    NotAnEvent(u8),
    #[error("field `{field}`: {detail}")]
    BadField { field: &'static str, detail: String },
}

/// Why a whole payload was rejected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    #[error("payload is empty")]
    Empty,
    #[error("payload truncated (at byte {offset})")]
    Truncated { offset: usize },
    #[error("batch is not a msgpack array (marker 0x{marker:02x})")]
    NotAnArray { marker: u8 },
    #[error("batch has {len} elements, expected at least 2 (ts, events)")]
    TooShort { len: usize },
    #[error("bad ts: {0}")]
    BadTs(String),
    #[error("bad events array: {0}")]
    BadEvents(String),
    #[error("bad data_parallel_rank: {0}")]
    BadDataParallelRank(String),
    #[error("malformed msgpack at byte {offset}: {detail}")]
    Malformed { offset: usize, detail: String },
    #[error("{extra} trailing bytes after the batch")]
    TrailingBytes { extra: usize },
}

/// Decodes one payload (the third frame of a PUB message).
pub fn decode_batch(payload: &[u8]) -> Result<DecodedBatch, DecodeError> {
    if payload.is_empty() {
        return Err(DecodeError::Empty);
    }
    let mut r = Reader::new(payload);
    let marker = r.peek().map_err(|e| envelope(&r, e))?;
    if !r.is_array().map_err(|e| envelope(&r, e))? {
        return Err(DecodeError::NotAnArray { marker });
    }
    let len = r.array_len().map_err(|e| envelope(&r, e))?;
    if len < 2 {
        return Err(DecodeError::TooShort { len });
    }
    let ts = r
        .f64()
        .map_err(|e| field_error(&r, e, DecodeError::BadTs))?;

    let n = r
        .array_len()
        .map_err(|e| field_error(&r, e, DecodeError::BadEvents))?;
    let mut out = DecodedBatch {
        batch: EventBatch {
            ts,
            events: Vec::with_capacity(n),
            data_parallel_rank: None,
        },
        skipped: Vec::new(),
    };
    for index in 0..n {
        let start = r.pos();
        match decode_event(&mut r) {
            Ok(event) => out.batch.events.push(event),
            Err(reason) => {
                // Step over the whole event; if even that fails the payload is broken.
                r.set_pos(start);
                r.skip().map_err(|e| envelope(&r, e))?;
                out.skipped.push(SkippedEvent { index, reason });
            }
        }
    }

    if len >= 3 && !r.eat_nil().map_err(|e| envelope(&r, e))? {
        let rank = r
            .i64()
            .map_err(|e| field_error(&r, e, DecodeError::BadDataParallelRank))?;
        out.batch.data_parallel_rank = Some(rank);
    }
    for _ in 3..len {
        r.skip().map_err(|e| envelope(&r, e))?;
    }
    match r.remaining() {
        0 => Ok(out),
        extra => Err(DecodeError::TrailingBytes { extra }),
    }
}

fn envelope(r: &Reader<'_>, e: WireError) -> DecodeError {
    match e {
        WireError::Truncated => DecodeError::Truncated { offset: r.pos() },
        e => DecodeError::Malformed {
            offset: r.pos(),
            detail: e.to_string(),
        },
    }
}

fn field_error(r: &Reader<'_>, e: WireError, f: fn(String) -> DecodeError) -> DecodeError {
    match e {
        WireError::Truncated => DecodeError::Truncated { offset: r.pos() },
        e => f(e.to_string()),
    }
}

// === events ===

fn decode_event(r: &mut Reader<'_>) -> Result<KvEvent, SkipReason> {
    let marker = r.peek().map_err(|e| bad("event", e))?;
    if r.is_map().map_err(|e| bad("event", e))? {
        decode_map_event(r)
    } else if r.is_array().map_err(|e| bad("event", e))? {
        decode_array_event(r)
    } else {
        Err(SkipReason::NotAnEvent(marker))
    }
}

/// Map form: find `"type"` first (keys may come in any order), then read the
/// fields that type knows, ignoring others.
fn decode_map_event(r: &mut Reader<'_>) -> Result<KvEvent, SkipReason> {
    let n = r.map_len().map_err(|e| bad("event", e))?;
    let start = r.pos();
    // Fast path: vLLM writes `"type"` first, so one pass reads everything.
    if n > 0 && key(r)? == Some(b"type".as_slice()) {
        let ty = r.string().map_err(|e| bad("type", e))?;
        let mut builder = Builder::new(&ty)?;
        for _ in 1..n {
            match key(r)? {
                Some(k) => builder.field(r, k)?,
                None => r.skip().map_err(|e| bad("event", e))?,
            }
        }
        return builder.finish();
    }
    r.set_pos(start);
    let mut ty = None;
    for _ in 0..n {
        if key(r)? == Some(b"type".as_slice()) {
            ty = Some(r.string().map_err(|e| bad("type", e))?);
        } else {
            r.skip().map_err(|e| bad("event", e))?;
        }
    }
    let ty = ty.ok_or(SkipReason::MissingType)?;
    let mut builder = Builder::new(&ty)?;
    r.set_pos(start);
    for _ in 0..n {
        match key(r)? {
            Some(k) => builder.field(r, k)?,
            None => r.skip().map_err(|e| bad("event", e))?,
        }
    }
    builder.finish()
}

/// A map key: the bytes of a str key, or `None` (key skipped) for other types.
fn key<'a>(r: &mut Reader<'a>) -> Result<Option<&'a [u8]>, SkipReason> {
    match r.str_bytes() {
        Ok(k) => Ok(Some(k)),
        Err(WireError::Unexpected { .. }) => {
            r.skip().map_err(|e| bad("event", e))?;
            Ok(None)
        }
        Err(e) => Err(bad("event", e)),
    }
}

/// Array form: `[tag, field1, field2, ...]`; missing trailing fields are nil,
/// extra trailing elements are ignored.
fn decode_array_event(r: &mut Reader<'_>) -> Result<KvEvent, SkipReason> {
    let n = r.array_len().map_err(|e| bad("event", e))?;
    if n == 0 {
        return Err(SkipReason::MissingType);
    }
    let ty = r.string().map_err(|e| bad("type", e))?;
    let mut builder = Builder::new(&ty)?;
    let names = builder.field_names();
    for i in 1..n {
        match names.get(i - 1) {
            Some(name) => builder.field(r, name.as_bytes())?,
            None => r.skip().map_err(|e| bad("event", e))?,
        }
    }
    builder.finish()
}

/// Collects fields of one event; required fields are tracked so a missing
/// one skips the event instead of inventing a value.
#[expect(
    clippy::large_enum_variant,
    reason = "a short-lived stack value whose event is moved into KvEvent unboxed"
)]
enum Builder {
    Stored {
        ev: BlockStored,
        has_hashes: bool,
        has_tokens: bool,
        has_size: bool,
    },
    Removed {
        ev: BlockRemoved,
        has_hashes: bool,
    },
    Cleared,
}

// === impl Builder ===

impl Builder {
    fn new(ty: &str) -> Result<Self, SkipReason> {
        Ok(match ty {
            BLOCK_STORED => Self::Stored {
                ev: BlockStored::default(),
                has_hashes: false,
                has_tokens: false,
                has_size: false,
            },
            BLOCK_REMOVED => Self::Removed {
                ev: BlockRemoved::default(),
                has_hashes: false,
            },
            ALL_BLOCKS_CLEARED => Self::Cleared,
            other => return Err(SkipReason::UnknownType(other.to_owned())),
        })
    }

    fn field_names(&self) -> &'static [&'static str] {
        match self {
            Self::Stored { .. } => &STORED_FIELDS,
            Self::Removed { .. } => &REMOVED_FIELDS,
            Self::Cleared => &[],
        }
    }

    /// Reads the value of field `name` (unknown names are skipped).
    fn field(&mut self, r: &mut Reader<'_>, name: &[u8]) -> Result<(), SkipReason> {
        match self {
            Self::Stored {
                ev,
                has_hashes,
                has_tokens,
                has_size,
            } => match name {
                b"block_hashes" => {
                    ev.block_hashes = hashes(r, "block_hashes")?;
                    *has_hashes = true;
                }
                b"parent_block_hash" => {
                    ev.parent_block_hash = opt(r, "parent_block_hash", |r| hash(r))?;
                }
                b"token_ids" => {
                    ev.token_ids = u32_list(r).map_err(|e| bad("token_ids", e))?;
                    *has_tokens = true;
                }
                b"block_size" => {
                    ev.block_size = r.u32().map_err(|e| bad("block_size", e))?;
                    *has_size = true;
                }
                b"lora_id" => ev.lora_id = opt(r, "lora_id", Reader::i64)?,
                b"medium" => ev.medium = opt(r, "medium", Reader::string)?,
                b"lora_name" => ev.lora_name = opt(r, "lora_name", Reader::string)?,
                b"extra_keys" => ev.extra_keys = opt(r, "extra_keys", extra_keys)?,
                b"group_idx" => ev.group_idx = opt(r, "group_idx", Reader::u32)?,
                b"kv_cache_spec_kind" => {
                    ev.kv_cache_spec_kind = opt(r, "kv_cache_spec_kind", Reader::string)?;
                }
                b"kv_cache_spec_sliding_window" => {
                    ev.kv_cache_spec_sliding_window =
                        opt(r, "kv_cache_spec_sliding_window", Reader::u32)?;
                }
                b"locality" => ev.locality = opt(r, "locality", Reader::string)?,
                b"ownership" => ev.ownership = opt(r, "ownership", Reader::string)?,
                b"session_id" => ev.session_id = opt(r, "session_id", Reader::string)?,
                b"lookahead_token_ids" => {
                    ev.lookahead_token_ids = opt(r, "lookahead_token_ids", |r| list(r, u32_list))?;
                }
                _ => r.skip().map_err(|e| bad("event", e))?,
            },
            Self::Removed { ev, has_hashes } => match name {
                b"block_hashes" => {
                    ev.block_hashes = hashes(r, "block_hashes")?;
                    *has_hashes = true;
                }
                b"medium" => ev.medium = opt(r, "medium", Reader::string)?,
                b"group_idx" => ev.group_idx = opt(r, "group_idx", Reader::u32)?,
                b"locality" => ev.locality = opt(r, "locality", Reader::string)?,
                b"ownership" => ev.ownership = opt(r, "ownership", Reader::string)?,
                _ => r.skip().map_err(|e| bad("event", e))?,
            },
            Self::Cleared => r.skip().map_err(|e| bad("event", e))?,
        }
        Ok(())
    }

    fn finish(self) -> Result<KvEvent, SkipReason> {
        match self {
            Self::Stored {
                ev,
                has_hashes,
                has_tokens,
                has_size,
            } => {
                for (present, field) in [
                    (has_hashes, "block_hashes"),
                    (has_tokens, "token_ids"),
                    (has_size, "block_size"),
                ] {
                    if !present {
                        return Err(missing(field));
                    }
                }
                Ok(KvEvent::BlockStored(ev))
            }
            Self::Removed { ev, has_hashes } => {
                if !has_hashes {
                    return Err(missing("block_hashes"));
                }
                Ok(KvEvent::BlockRemoved(ev))
            }
            Self::Cleared => Ok(KvEvent::AllBlocksCleared),
        }
    }
}

// === field readers ===

/// A block hash: an int (u64; a negative i64 is kept as its two's-complement
/// bits, as very old vLLM versions sent Python's signed `hash()`), or bin.
fn hash(r: &mut Reader<'_>) -> Result<BlockHash, WireError> {
    match r.peek()? {
        0xc4..=0xc6 => Ok(BlockHash::Bytes(r.bin()?.to_vec())),
        _ => Ok(BlockHash::U64(match r.int()? {
            Int::U(u) => u,
            Int::I(i) => i as u64,
        })),
    }
}

fn hashes(r: &mut Reader<'_>, field: &'static str) -> Result<Vec<BlockHash>, SkipReason> {
    list(r, hash).map_err(|e| bad(field, e))
}

fn u32_list(r: &mut Reader<'_>) -> Result<Vec<u32>, WireError> {
    list(r, Reader::u32)
}

fn list<'a, T>(
    r: &mut Reader<'a>,
    mut item: impl FnMut(&mut Reader<'a>) -> Result<T, WireError>,
) -> Result<Vec<T>, WireError> {
    let n = r.array_len()?;
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        out.push(item(r)?);
    }
    Ok(out)
}

/// `extra_keys`: per block nil or a list of arbitrary msgpack values.
fn extra_keys(r: &mut Reader<'_>) -> Result<Vec<Option<Vec<ExtraKey>>>, WireError> {
    list(r, |r| {
        if r.eat_nil()? {
            Ok(None)
        } else {
            list(r, Reader::value).map(Some)
        }
    })
}

fn opt<'a, T>(
    r: &mut Reader<'a>,
    field: &'static str,
    read: impl FnOnce(&mut Reader<'a>) -> Result<T, WireError>,
) -> Result<Option<T>, SkipReason> {
    let nil = r.eat_nil().map_err(|e| bad(field, e))?;
    if nil {
        Ok(None)
    } else {
        read(r).map(Some).map_err(|e| bad(field, e))
    }
}

fn bad(field: &'static str, e: WireError) -> SkipReason {
    SkipReason::BadField {
        field,
        detail: e.to_string(),
    }
}

fn missing(field: &'static str) -> SkipReason {
    SkipReason::BadField {
        field,
        detail: "missing".to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn envelope_errors() {
        assert_eq!(decode_batch(&[]), Err(DecodeError::Empty));
        assert_eq!(
            decode_batch(&[0x81, 0xc0, 0xc0]),
            Err(DecodeError::NotAnArray { marker: 0x81 })
        );
        assert_eq!(
            decode_batch(&[0x91, 0x00]),
            Err(DecodeError::TooShort { len: 1 })
        );
        assert!(matches!(
            decode_batch(&[0x92, 0xa1, b'x', 0x90]),
            Err(DecodeError::BadTs(_))
        ));
        assert!(matches!(
            decode_batch(&[0x92, 0x00, 0x90, 0x00]),
            Err(DecodeError::TrailingBytes { extra: 1 })
        ));
        assert!(matches!(
            decode_batch(&[0x93, 0x00, 0x91]),
            Err(DecodeError::Truncated { .. })
        ));
    }

    #[test]
    fn int_ts_and_nil_rank() {
        let d = decode_batch(&[0x93, 0x05, 0x90, 0xc0]).expect("valid");
        assert_eq!(d.batch.ts, 5.0);
        assert_eq!(d.batch.data_parallel_rank, None);
    }

    #[test]
    fn non_event_is_skipped() {
        let d = decode_batch(&[
            0x93, 0x00, 0x92, 0x07, 0x81, 0xa4, b't', b'y', b'p', b'e', 0xc0, 0x01,
        ])
        .expect("valid envelope");
        assert!(d.batch.events.is_empty());
        assert_eq!(d.skipped.len(), 2);
        assert_eq!(d.skipped[0].reason, SkipReason::NotAnEvent(0x07));
        assert_eq!(d.skipped[1].index, 1);
        assert_eq!(d.batch.data_parallel_rank, Some(1));
    }
}
