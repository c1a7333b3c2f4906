//! msgpack as Python's `msgspec` writes it. `rmp::encode` picks the same
//! encodings: the narrowest int width (unsigned markers for non-negative
//! values), always float64 for floats, `fixstr`/`str8`/`str16`/`str32` by
//! length, `bin` for bytes, fix/16/32 headers for containers. The one thing
//! msgspec does its own way is a struct's map header, sized by the struct's
//! maximum key count ([`Writer::map16_len`]).

use rmp::encode;
use rmpv::Value;

/// A payload being written. Writes go to a `Vec`, which cannot fail.
#[derive(Debug, Default)]
pub(crate) struct Writer {
    buf: Vec<u8>,
}

/// The `Result` of a write into a `Vec` (never an error).
fn written<T, E>(r: Result<T, E>) {
    debug_assert!(r.is_ok(), "writing msgpack into a Vec failed");
}

// === impl Writer ===

impl Writer {
    pub(crate) fn with_capacity(cap: usize) -> Self {
        Self {
            buf: Vec::with_capacity(cap),
        }
    }

    pub(crate) fn into_inner(self) -> Vec<u8> {
        self.buf
    }

    pub(crate) fn nil(&mut self) {
        written(encode::write_nil(&mut self.buf));
    }

    pub(crate) fn uint(&mut self, v: u64) {
        written(encode::write_uint(&mut self.buf, v));
    }

    pub(crate) fn int(&mut self, v: i64) {
        written(encode::write_sint(&mut self.buf, v));
    }

    pub(crate) fn f64(&mut self, v: f64) {
        written(encode::write_f64(&mut self.buf, v));
    }

    pub(crate) fn str(&mut self, s: &str) {
        written(encode::write_str(&mut self.buf, s));
    }

    pub(crate) fn bin(&mut self, b: &[u8]) {
        written(encode::write_bin(&mut self.buf, b));
    }

    pub(crate) fn array_len(&mut self, n: usize) {
        written(encode::write_array_len(&mut self.buf, len32(n)));
    }

    pub(crate) fn map_len(&mut self, n: usize) {
        written(encode::write_map_len(&mut self.buf, len32(n)));
    }

    /// A map header that is always `map16`, even for fewer than 16 keys:
    /// msgspec sizes a struct's header by its maximum key count.
    pub(crate) fn map16_len(&mut self, n: usize) {
        self.buf.push(0xde);
        self.buf
            .extend_from_slice(&u16::try_from(n).unwrap_or(u16::MAX).to_be_bytes());
    }

    /// Any msgpack value (used for `extra_keys`).
    pub(crate) fn value(&mut self, v: &Value) {
        written(rmpv::encode::write_value(&mut self.buf, v));
    }
}

/// Lengths beyond u32 cannot be expressed in msgpack; such values would need
/// more than 4 GiB in one payload, which no KV event comes near.
fn len32(n: usize) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bytes(f: impl FnOnce(&mut Writer)) -> Vec<u8> {
        let mut w = Writer::default();
        f(&mut w);
        w.into_inner()
    }

    #[test]
    fn int_widths_match_msgspec() {
        assert_eq!(bytes(|w| w.uint(44)), [0x2c]);
        assert_eq!(bytes(|w| w.uint(180)), [0xcc, 0xb4]);
        assert_eq!(bytes(|w| w.uint(2841)), [0xcd, 0x0b, 0x19]);
        assert_eq!(bytes(|w| w.uint(116_682)), [0xce, 0x00, 0x01, 0xc7, 0xca]);
        assert_eq!(bytes(|w| w.uint(1 << 32))[0], 0xcf);
        assert_eq!(bytes(|w| w.int(-11)), [0xf5]);
        assert_eq!(bytes(|w| w.int(-33)), [0xd0, 0xdf]);
        assert_eq!(bytes(|w| w.int(-129)), [0xd1, 0xff, 0x7f]);
        assert_eq!(bytes(|w| w.int(i64::MIN))[0], 0xd3);
    }

    #[test]
    fn str_and_container_headers() {
        assert_eq!(bytes(|w| w.str("GPU")), b"\xa3GPU");
        assert_eq!(bytes(|w| w.str(&"x".repeat(64)))[..2], [0xd9, 64]);
        assert_eq!(bytes(|w| w.array_len(15)), [0x9f]);
        assert_eq!(bytes(|w| w.array_len(16)), [0xdc, 0, 16]);
        assert_eq!(bytes(|w| w.map16_len(11)), [0xde, 0, 11]);
        assert_eq!(bytes(|w| w.bin(&[1, 2])), [0xc4, 2, 1, 2]);
        assert_eq!(bytes(|w| w.map_len(3)), [0x83]);
        assert_eq!(bytes(|w| w.f64(1.5))[0], 0xcb);
    }

    #[test]
    fn values_take_the_same_encodings() {
        let v = Value::Array(vec![
            Value::from(180u64),
            Value::from(-33i64),
            Value::from("GPU"),
            Value::Nil,
            Value::from(0.25f64),
        ]);
        assert_eq!(
            bytes(|w| w.value(&v)),
            [
                0x95, 0xcc, 0xb4, 0xd0, 0xdf, 0xa3, b'G', b'P', b'U', 0xc0, 0xcb, 0x3f, 0xd0, 0, 0,
                0, 0, 0, 0
            ]
        );
    }
}
