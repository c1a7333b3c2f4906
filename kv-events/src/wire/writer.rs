//! A msgpack writer that picks the same encodings as Python's `msgspec`:
//! the narrowest int width (unsigned markers for non-negative values),
//! always float64 for floats, `fixstr`/`str8`/`str16`/`str32` by length,
//! `bin` for bytes, and fix/16/32 headers for containers.

use rmpv::Value;

#[derive(Debug, Default)]
pub(crate) struct Writer {
    buf: Vec<u8>,
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
        self.buf.push(0xc0);
    }

    pub(crate) fn bool(&mut self, v: bool) {
        self.buf.push(if v { 0xc3 } else { 0xc2 });
    }

    pub(crate) fn uint(&mut self, v: u64) {
        if v < 0x80 {
            self.buf.push(v as u8);
        } else if v <= u64::from(u8::MAX) {
            self.buf.extend_from_slice(&[0xcc, v as u8]);
        } else if v <= u64::from(u16::MAX) {
            self.buf.push(0xcd);
            self.buf.extend_from_slice(&(v as u16).to_be_bytes());
        } else if v <= u64::from(u32::MAX) {
            self.buf.push(0xce);
            self.buf.extend_from_slice(&(v as u32).to_be_bytes());
        } else {
            self.buf.push(0xcf);
            self.buf.extend_from_slice(&v.to_be_bytes());
        }
    }

    pub(crate) fn int(&mut self, v: i64) {
        if v >= 0 {
            self.uint(v as u64);
        } else if v >= -32 {
            self.buf.push(v as i8 as u8);
        } else if v >= i64::from(i8::MIN) {
            self.buf.extend_from_slice(&[0xd0, v as i8 as u8]);
        } else if v >= i64::from(i16::MIN) {
            self.buf.push(0xd1);
            self.buf.extend_from_slice(&(v as i16).to_be_bytes());
        } else if v >= i64::from(i32::MIN) {
            self.buf.push(0xd2);
            self.buf.extend_from_slice(&(v as i32).to_be_bytes());
        } else {
            self.buf.push(0xd3);
            self.buf.extend_from_slice(&v.to_be_bytes());
        }
    }

    pub(crate) fn f64(&mut self, v: f64) {
        self.buf.push(0xcb);
        self.buf.extend_from_slice(&v.to_bits().to_be_bytes());
    }

    fn f32(&mut self, v: f32) {
        self.buf.push(0xca);
        self.buf.extend_from_slice(&v.to_bits().to_be_bytes());
    }

    pub(crate) fn str(&mut self, s: &str) {
        self.str_bytes(s.as_bytes());
    }

    fn str_bytes(&mut self, s: &[u8]) {
        let n = s.len();
        if n < 32 {
            self.buf.push(0xa0 | n as u8);
        } else if n <= usize::from(u8::MAX) {
            self.buf.extend_from_slice(&[0xd9, n as u8]);
        } else if n <= usize::from(u16::MAX) {
            self.buf.push(0xda);
            self.buf.extend_from_slice(&(n as u16).to_be_bytes());
        } else {
            self.buf.push(0xdb);
            self.buf.extend_from_slice(&len32(n).to_be_bytes());
        }
        self.buf.extend_from_slice(s);
    }

    pub(crate) fn bin(&mut self, b: &[u8]) {
        let n = b.len();
        if n <= usize::from(u8::MAX) {
            self.buf.extend_from_slice(&[0xc4, n as u8]);
        } else if n <= usize::from(u16::MAX) {
            self.buf.push(0xc5);
            self.buf.extend_from_slice(&(n as u16).to_be_bytes());
        } else {
            self.buf.push(0xc6);
            self.buf.extend_from_slice(&len32(n).to_be_bytes());
        }
        self.buf.extend_from_slice(b);
    }

    pub(crate) fn array_len(&mut self, n: usize) {
        self.container_len(n, 0x90, 0xdc, 0xdd);
    }

    pub(crate) fn map_len(&mut self, n: usize) {
        self.container_len(n, 0x80, 0xde, 0xdf);
    }

    /// A map header that is always `map16`, even for fewer than 16 keys:
    /// msgspec sizes a struct's header by its maximum key count.
    pub(crate) fn map16_len(&mut self, n: usize) {
        self.buf.push(0xde);
        self.buf
            .extend_from_slice(&u16::try_from(n).unwrap_or(u16::MAX).to_be_bytes());
    }

    fn container_len(&mut self, n: usize, fix: u8, m16: u8, m32: u8) {
        if n < 16 {
            self.buf.push(fix | n as u8);
        } else if n <= usize::from(u16::MAX) {
            self.buf.push(m16);
            self.buf.extend_from_slice(&(n as u16).to_be_bytes());
        } else {
            self.buf.push(m32);
            self.buf.extend_from_slice(&len32(n).to_be_bytes());
        }
    }

    /// Any msgpack value (used for `extra_keys`).
    pub(crate) fn value(&mut self, v: &Value) {
        match v {
            Value::Nil => self.nil(),
            Value::Boolean(b) => self.bool(*b),
            Value::Integer(i) => match (i.as_u64(), i.as_i64()) {
                (Some(u), _) => self.uint(u),
                (None, Some(s)) => self.int(s),
                (None, None) => self.nil(),
            },
            Value::F32(f) => self.f32(*f),
            Value::F64(f) => self.f64(*f),
            Value::String(s) => self.str_bytes(s.as_bytes()),
            Value::Binary(b) => self.bin(b),
            Value::Array(items) => {
                self.array_len(items.len());
                for item in items {
                    self.value(item);
                }
            }
            Value::Map(entries) => {
                self.map_len(entries.len());
                for (k, v) in entries {
                    self.value(k);
                    self.value(v);
                }
            }
            Value::Ext(ty, data) => self.ext(*ty, data),
        }
    }

    fn ext(&mut self, ty: i8, data: &[u8]) {
        let n = data.len();
        match n {
            1 => self.buf.push(0xd4),
            2 => self.buf.push(0xd5),
            4 => self.buf.push(0xd6),
            8 => self.buf.push(0xd7),
            16 => self.buf.push(0xd8),
            _ if n <= usize::from(u8::MAX) => self.buf.extend_from_slice(&[0xc7, n as u8]),
            _ if n <= usize::from(u16::MAX) => {
                self.buf.push(0xc8);
                self.buf.extend_from_slice(&(n as u16).to_be_bytes());
            }
            _ => {
                self.buf.push(0xc9);
                self.buf.extend_from_slice(&len32(n).to_be_bytes());
            }
        }
        self.buf.push(ty as u8);
        self.buf.extend_from_slice(data);
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
    }
}
