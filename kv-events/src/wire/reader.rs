//! A bounds-checked msgpack cursor over a byte slice. It accepts every valid
//! width for ints, strings and containers, never allocates more than the
//! remaining input can justify, and limits nesting depth, so no input can make
//! it panic or exhaust memory.

use rmpv::Value;

/// Deepest nesting accepted when skipping or reading a generic value.
pub(crate) const MAX_DEPTH: usize = 64;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum WireError {
    /// The input ended inside a value.
    Truncated,
    /// A value of another msgpack type was found.
    Unexpected { expected: &'static str, marker: u8 },
    /// An int does not fit the target type.
    OutOfRange,
    /// Containers nested deeper than [`MAX_DEPTH`].
    TooDeep,
}

impl std::fmt::Display for WireError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Truncated => f.write_str("input ends inside a value"),
            Self::Unexpected { expected, marker } => {
                write!(f, "expected {expected}, found marker 0x{marker:02x}")
            }
            Self::OutOfRange => f.write_str("int out of range"),
            Self::TooDeep => write!(f, "nesting deeper than {MAX_DEPTH}"),
        }
    }
}

/// A decoded msgpack int: unsigned markers and positive fixints are `U`,
/// signed markers and negative fixints are `I`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Int {
    U(u64),
    I(i64),
}

impl Int {
    pub(crate) fn to_u64(self) -> Option<u64> {
        match self {
            Self::U(u) => Some(u),
            Self::I(i) => u64::try_from(i).ok(),
        }
    }

    pub(crate) fn to_i64(self) -> Option<i64> {
        match self {
            Self::U(u) => i64::try_from(u).ok(),
            Self::I(i) => Some(i),
        }
    }
}

#[derive(Debug, Clone)]
pub(crate) struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

// === impl Reader ===

impl<'a> Reader<'a> {
    pub(crate) fn new(buf: &'a [u8]) -> Self {
        Self { buf, pos: 0 }
    }

    pub(crate) fn pos(&self) -> usize {
        self.pos
    }

    pub(crate) fn set_pos(&mut self, pos: usize) {
        self.pos = pos.min(self.buf.len());
    }

    pub(crate) fn remaining(&self) -> usize {
        self.buf.len() - self.pos
    }

    pub(crate) fn peek(&self) -> Result<u8, WireError> {
        self.buf.get(self.pos).copied().ok_or(WireError::Truncated)
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8], WireError> {
        let end = self.pos.checked_add(n).ok_or(WireError::Truncated)?;
        let s = self.buf.get(self.pos..end).ok_or(WireError::Truncated)?;
        self.pos = end;
        Ok(s)
    }

    fn byte(&mut self) -> Result<u8, WireError> {
        let b = self.peek()?;
        self.pos += 1;
        Ok(b)
    }

    fn be(&mut self, n: usize) -> Result<u64, WireError> {
        Ok(self
            .take(n)?
            .iter()
            .fold(0u64, |acc, b| (acc << 8) | u64::from(*b)))
    }

    fn len(&mut self, n: usize) -> Result<usize, WireError> {
        usize::try_from(self.be(n)?).map_err(|_| WireError::OutOfRange)
    }

    /// Consumes a nil if one is next.
    pub(crate) fn eat_nil(&mut self) -> Result<bool, WireError> {
        if self.peek()? == 0xc0 {
            self.pos += 1;
            Ok(true)
        } else {
            Ok(false)
        }
    }

    pub(crate) fn int(&mut self) -> Result<Int, WireError> {
        let m = self.peek()?;
        let v = match m {
            0x00..=0x7f => Int::U(u64::from(m)),
            0xe0..=0xff => Int::I(i64::from(m as i8)),
            0xcc => Int::U(self.skip_marker_then(1)?),
            0xcd => Int::U(self.skip_marker_then(2)?),
            0xce => Int::U(self.skip_marker_then(4)?),
            0xcf => Int::U(self.skip_marker_then(8)?),
            0xd0 => Int::I(i64::from(self.skip_marker_then(1)? as u8 as i8)),
            0xd1 => Int::I(i64::from(self.skip_marker_then(2)? as u16 as i16)),
            0xd2 => Int::I(i64::from(self.skip_marker_then(4)? as u32 as i32)),
            0xd3 => Int::I(self.skip_marker_then(8)? as i64),
            _ => return Err(unexpected("int", m)),
        };
        if matches!(m, 0x00..=0x7f | 0xe0..=0xff) {
            self.pos += 1;
        }
        Ok(v)
    }

    /// For multi-byte ints: consume the marker, then read `n` big-endian bytes.
    fn skip_marker_then(&mut self, n: usize) -> Result<u64, WireError> {
        let start = self.pos;
        self.pos += 1;
        self.be(n).inspect_err(|_| self.pos = start)
    }

    pub(crate) fn u64(&mut self) -> Result<u64, WireError> {
        self.int()?.to_u64().ok_or(WireError::OutOfRange)
    }

    pub(crate) fn i64(&mut self) -> Result<i64, WireError> {
        self.int()?.to_i64().ok_or(WireError::OutOfRange)
    }

    pub(crate) fn u32(&mut self) -> Result<u32, WireError> {
        u32::try_from(self.u64()?).map_err(|_| WireError::OutOfRange)
    }

    /// A float64, float32 or int read as `f64`.
    pub(crate) fn f64(&mut self) -> Result<f64, WireError> {
        match self.peek()? {
            0xcb => Ok(f64::from_bits(self.skip_marker_then(8)?)),
            0xca => Ok(f64::from(f32::from_bits(self.skip_marker_then(4)? as u32))),
            _ => match self.int() {
                Ok(Int::U(u)) => Ok(u as f64),
                Ok(Int::I(i)) => Ok(i as f64),
                Err(WireError::Unexpected { marker, .. }) => Err(unexpected("float", marker)),
                Err(e) => Err(e),
            },
        }
    }

    /// The raw bytes of a msgpack str.
    pub(crate) fn str_bytes(&mut self) -> Result<&'a [u8], WireError> {
        let m = self.peek()?;
        let start = self.pos;
        self.pos += 1;
        let n = match m {
            0xa0..=0xbf => Ok(usize::from(m & 0x1f)),
            0xd9 => self.len(1),
            0xda => self.len(2),
            0xdb => self.len(4),
            _ => Err(unexpected("str", m)),
        };
        n.and_then(|n| self.take(n))
            .inspect_err(|_| self.pos = start)
    }

    pub(crate) fn string(&mut self) -> Result<String, WireError> {
        let m = self.peek()?;
        let b = self.str_bytes()?;
        std::str::from_utf8(b)
            .map(str::to_owned)
            .map_err(|_| unexpected("utf-8 str", m))
    }

    pub(crate) fn bin(&mut self) -> Result<&'a [u8], WireError> {
        let m = self.peek()?;
        let start = self.pos;
        self.pos += 1;
        let n = match m {
            0xc4 => self.len(1),
            0xc5 => self.len(2),
            0xc6 => self.len(4),
            _ => Err(unexpected("bin", m)),
        };
        n.and_then(|n| self.take(n))
            .inspect_err(|_| self.pos = start)
    }

    pub(crate) fn is_array(&self) -> Result<bool, WireError> {
        Ok(matches!(self.peek()?, 0x90..=0x9f | 0xdc | 0xdd))
    }

    pub(crate) fn is_map(&self) -> Result<bool, WireError> {
        Ok(matches!(self.peek()?, 0x80..=0x8f | 0xde | 0xdf))
    }

    /// An array header; the length is checked against the remaining input
    /// (every element takes at least one byte).
    pub(crate) fn array_len(&mut self) -> Result<usize, WireError> {
        self.container_len(0x90, 0xdc, 0xdd, "array", 1)
    }

    /// A map header; the length is checked against the remaining input.
    pub(crate) fn map_len(&mut self) -> Result<usize, WireError> {
        self.container_len(0x80, 0xde, 0xdf, "map", 2)
    }

    fn container_len(
        &mut self,
        fix: u8,
        m16: u8,
        m32: u8,
        what: &'static str,
        min_bytes_per_item: usize,
    ) -> Result<usize, WireError> {
        let m = self.peek()?;
        let start = self.pos;
        self.pos += 1;
        let n = if m & 0xf0 == fix {
            Ok(usize::from(m & 0x0f))
        } else if m == m16 {
            self.len(2)
        } else if m == m32 {
            self.len(4)
        } else {
            Err(unexpected(what, m))
        };
        match n {
            Ok(n) if n.saturating_mul(min_bytes_per_item) <= self.remaining() => Ok(n),
            Ok(_) => {
                self.pos = start;
                Err(WireError::Truncated)
            }
            Err(e) => {
                self.pos = start;
                Err(e)
            }
        }
    }

    /// Skips one complete value of any type.
    pub(crate) fn skip(&mut self) -> Result<(), WireError> {
        self.skip_depth(0)
    }

    fn skip_depth(&mut self, depth: usize) -> Result<(), WireError> {
        if depth > MAX_DEPTH {
            return Err(WireError::TooDeep);
        }
        let m = self.peek()?;
        match m {
            0x00..=0x7f | 0xe0..=0xff | 0xc0 | 0xc2 | 0xc3 => {
                self.pos += 1;
                Ok(())
            }
            0xcc..=0xd3 => self.int().map(drop),
            0xca | 0xcb => self.f64().map(drop),
            0xa0..=0xbf | 0xd9..=0xdb => self.str_bytes().map(drop),
            0xc4..=0xc6 => self.bin().map(drop),
            0x90..=0x9f | 0xdc | 0xdd => {
                let n = self.array_len()?;
                (0..n).try_for_each(|_| self.skip_depth(depth + 1))
            }
            0x80..=0x8f | 0xde | 0xdf => {
                let n = self.map_len()?;
                (0..n * 2).try_for_each(|_| self.skip_depth(depth + 1))
            }
            0xd4..=0xd8 | 0xc7..=0xc9 => self.ext().map(drop),
            // 0xc1 is the one marker msgpack never uses.
            _ => Err(unexpected("a msgpack value", m)),
        }
    }

    fn ext(&mut self) -> Result<(i8, &'a [u8]), WireError> {
        let m = self.peek()?;
        let start = self.pos;
        self.pos += 1;
        let n = match m {
            0xd4 => Ok(1),
            0xd5 => Ok(2),
            0xd6 => Ok(4),
            0xd7 => Ok(8),
            0xd8 => Ok(16),
            0xc7 => self.len(1),
            0xc8 => self.len(2),
            0xc9 => self.len(4),
            _ => Err(unexpected("ext", m)),
        };
        let r = n.and_then(|n| {
            let ty = self.byte()? as i8;
            Ok((ty, self.take(n)?))
        });
        r.inspect_err(|_| self.pos = start)
    }

    /// Reads any value into an owned [`rmpv::Value`].
    pub(crate) fn value(&mut self) -> Result<Value, WireError> {
        self.value_depth(0)
    }

    fn value_depth(&mut self, depth: usize) -> Result<Value, WireError> {
        if depth > MAX_DEPTH {
            return Err(WireError::TooDeep);
        }
        let m = self.peek()?;
        Ok(match m {
            0xc0 => {
                self.pos += 1;
                Value::Nil
            }
            0xc2 | 0xc3 => {
                self.pos += 1;
                Value::Boolean(m == 0xc3)
            }
            0x00..=0x7f | 0xe0..=0xff | 0xcc..=0xd3 => match self.int()? {
                Int::U(u) => Value::from(u),
                Int::I(i) => Value::from(i),
            },
            0xca => Value::F32(f32::from_bits(self.skip_marker_then(4)? as u32)),
            0xcb => Value::F64(f64::from_bits(self.skip_marker_then(8)?)),
            0xa0..=0xbf | 0xd9..=0xdb => {
                let b = self.str_bytes()?;
                match std::str::from_utf8(b) {
                    Ok(s) => Value::from(s),
                    // Keep invalid UTF-8 as bytes so it re-encodes unchanged.
                    Err(_) => Value::Binary(b.to_vec()),
                }
            }
            0xc4..=0xc6 => Value::Binary(self.bin()?.to_vec()),
            0x90..=0x9f | 0xdc | 0xdd => {
                let n = self.array_len()?;
                let mut items = Vec::with_capacity(n);
                for _ in 0..n {
                    items.push(self.value_depth(depth + 1)?);
                }
                Value::Array(items)
            }
            0x80..=0x8f | 0xde | 0xdf => {
                let n = self.map_len()?;
                let mut entries = Vec::with_capacity(n);
                for _ in 0..n {
                    let k = self.value_depth(depth + 1)?;
                    let v = self.value_depth(depth + 1)?;
                    entries.push((k, v));
                }
                Value::Map(entries)
            }
            0xd4..=0xd8 | 0xc7..=0xc9 => {
                let (ty, data) = self.ext()?;
                Value::Ext(ty, data.to_vec())
            }
            _ => return Err(unexpected("a msgpack value", m)),
        })
    }
}

fn unexpected(expected: &'static str, marker: u8) -> WireError {
    WireError::Unexpected { expected, marker }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ints_of_every_width() {
        for (bytes, want) in [
            (&[0x05][..], Int::U(5)),
            (&[0xf5], Int::I(-11)),
            (&[0xcc, 0xff], Int::U(255)),
            (&[0xcd, 0x01, 0x00], Int::U(256)),
            (&[0xd0, 0x05], Int::I(5)),
            (
                &[0xd3, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff],
                Int::I(-1),
            ),
            (
                &[0xcf, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff],
                Int::U(u64::MAX),
            ),
        ] {
            let mut r = Reader::new(bytes);
            assert_eq!(r.int(), Ok(want), "{bytes:02x?}");
            assert_eq!(r.remaining(), 0);
        }
    }

    #[test]
    fn truncation_leaves_position_unchanged() {
        let mut r = Reader::new(&[0xcf, 0x01]);
        assert_eq!(r.int(), Err(WireError::Truncated));
        assert_eq!(r.pos(), 0);
        let mut r = Reader::new(&[0xdd, 0xff, 0xff, 0xff, 0xff]);
        assert_eq!(r.array_len(), Err(WireError::Truncated));
    }

    #[test]
    fn depth_is_bounded() {
        let deep = vec![0x91; MAX_DEPTH + 10];
        assert_eq!(Reader::new(&deep).skip(), Err(WireError::TooDeep));
        assert_eq!(Reader::new(&deep).value(), Err(WireError::TooDeep));
    }

    #[test]
    fn reserved_marker_is_rejected() {
        assert!(matches!(
            Reader::new(&[0xc1]).skip(),
            Err(WireError::Unexpected { marker: 0xc1, .. })
        ));
    }
}
