//! Python-compatible JSON: `json.dumps` as HF chat templates' `tojson` calls
//! it, and the `serde_json` → template value conversion that keeps the
//! int/float distinction and key order.

use std::fmt::Write as _;

use minijinja::value::{Value, ValueKind};
use minijinja::{Error as JinjaError, ErrorKind};

/// The knobs of `json.dumps` that HF's `tojson` filter forwards.
#[derive(Debug, Clone, Default)]
pub struct DumpOptions {
    pub ensure_ascii: bool,
    /// `None`: one line. `Some(s)`: newline + `s` repeated per level.
    pub indent: Option<String>,
    /// `(item_separator, key_separator)`; Python's default when `None`.
    pub separators: Option<(String, String)>,
    pub sort_keys: bool,
}

/// `json.dumps(value, ensure_ascii=False)`: `", "` / `": "`, keys in order.
pub fn dumps(value: &Value) -> Result<String, JinjaError> {
    dumps_with(value, &DumpOptions::default())
}

/// `json.dumps` with explicit options.
pub fn dumps_with(value: &Value, opts: &DumpOptions) -> Result<String, JinjaError> {
    let (item_sep, key_sep) = match &opts.separators {
        Some((i, k)) => (i.as_str(), k.as_str()),
        None if opts.indent.is_some() => (",", ": "),
        None => (", ", ": "),
    };
    let mut w = Writer {
        out: String::new(),
        opts,
        item_sep,
        key_sep,
    };
    w.value(value, 0)?;
    Ok(w.out)
}

/// Python's `repr(float)`: shortest round-trip digits, `1e+16` / `1e-05`
/// beyond `[1e-4, 1e16)`, otherwise fixed with at least one decimal.
pub fn float_repr(f: f64) -> String {
    if f.is_nan() {
        return "NaN".to_owned();
    }
    if f.is_infinite() {
        return if f > 0.0 { "Infinity" } else { "-Infinity" }.to_owned();
    }
    let sci = format!("{:e}", f.abs());
    let (mantissa, exp) = sci.split_once('e').unwrap_or((sci.as_str(), "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    let digits: String = mantissa.chars().filter(|c| *c != '.').collect();
    let mut out = String::new();
    if f.is_sign_negative() {
        out.push('-');
    }
    if !(-4..16).contains(&exp) {
        out.push_str(&digits[..1]);
        if digits.len() > 1 {
            out.push('.');
            out.push_str(&digits[1..]);
        }
        let sign = if exp < 0 { '-' } else { '+' };
        let _ = write!(out, "e{sign}{:02}", exp.abs());
    } else if exp >= 0 {
        let int_len = exp as usize + 1;
        if digits.len() <= int_len {
            out.push_str(&digits);
            out.extend(std::iter::repeat_n('0', int_len - digits.len()));
            out.push_str(".0");
        } else {
            out.push_str(&digits[..int_len]);
            out.push('.');
            out.push_str(&digits[int_len..]);
        }
    } else {
        out.push_str("0.");
        out.extend(std::iter::repeat_n('0', (-exp - 1) as usize));
        out.push_str(&digits);
    }
    out
}

/// A JSON value as a template value: objects keep their key order, integers
/// stay integers and floats stay floats (`21.0` renders as `21.0`).
pub fn from_json(value: &serde_json::Value) -> Value {
    use serde_json::Value as J;
    match value {
        J::Null => Value::from(()),
        J::Bool(b) => Value::from(*b),
        J::Number(n) => {
            if let Some(u) = n.as_u64() {
                Value::from(u)
            } else if let Some(i) = n.as_i64() {
                Value::from(i)
            } else {
                Value::from(n.as_f64().unwrap_or(f64::NAN))
            }
        }
        J::String(s) => Value::from(s.as_str()),
        J::Array(items) => Value::from(items.iter().map(from_json).collect::<Vec<_>>()),
        J::Object(map) => map
            .iter()
            .map(|(k, v)| (Value::from(k.as_str()), from_json(v)))
            .collect(),
    }
}

// === impl Writer ===

struct Writer<'a> {
    out: String,
    opts: &'a DumpOptions,
    item_sep: &'a str,
    key_sep: &'a str,
}

impl Writer<'_> {
    fn value(&mut self, value: &Value, depth: usize) -> Result<(), JinjaError> {
        match value.kind() {
            ValueKind::None => self.out.push_str("null"),
            ValueKind::Bool => self
                .out
                .push_str(if value.is_true() { "true" } else { "false" }),
            ValueKind::Number => self.number(value)?,
            ValueKind::String => self.string(value.as_str().unwrap_or_default()),
            ValueKind::Seq | ValueKind::Iterable => {
                let items: Vec<Value> = value.try_iter()?.collect();
                self.out.push('[');
                for (i, item) in items.iter().enumerate() {
                    self.item_start(i, depth);
                    self.value(item, depth + 1)?;
                }
                self.close(']', items.is_empty(), depth);
            }
            ValueKind::Map => {
                let mut entries = Vec::new();
                for key in value.try_iter()? {
                    let item = value.get_item(&key)?;
                    entries.push((key_string(&key)?, item));
                }
                if self.opts.sort_keys {
                    entries.sort_by(|a, b| a.0.cmp(&b.0));
                }
                self.out.push('{');
                for (i, (key, item)) in entries.iter().enumerate() {
                    self.item_start(i, depth);
                    self.string(key);
                    self.out.push_str(self.key_sep);
                    self.value(item, depth + 1)?;
                }
                self.close('}', entries.is_empty(), depth);
            }
            kind => {
                return Err(JinjaError::new(
                    ErrorKind::InvalidOperation,
                    format!("Object of type {kind} is not JSON serializable"),
                ));
            }
        }
        Ok(())
    }

    fn number(&mut self, value: &Value) -> Result<(), JinjaError> {
        if value.is_integer() {
            let _ = write!(self.out, "{value}");
        } else {
            let f = f64::try_from(value.clone())?;
            self.out.push_str(&float_repr(f));
        }
        Ok(())
    }

    fn item_start(&mut self, i: usize, depth: usize) {
        if i > 0 {
            self.out.push_str(self.item_sep);
        }
        self.newline(depth + 1);
    }

    fn close(&mut self, bracket: char, empty: bool, depth: usize) {
        if !empty {
            self.newline(depth);
        }
        self.out.push(bracket);
    }

    fn newline(&mut self, depth: usize) {
        if let Some(indent) = &self.opts.indent {
            self.out.push('\n');
            for _ in 0..depth {
                self.out.push_str(indent);
            }
        }
    }

    fn string(&mut self, s: &str) {
        self.out.push('"');
        for c in s.chars() {
            match c {
                '"' => self.out.push_str("\\\""),
                '\\' => self.out.push_str("\\\\"),
                '\n' => self.out.push_str("\\n"),
                '\r' => self.out.push_str("\\r"),
                '\t' => self.out.push_str("\\t"),
                '\u{8}' => self.out.push_str("\\b"),
                '\u{c}' => self.out.push_str("\\f"),
                c if (c as u32) < 0x20 => {
                    let _ = write!(self.out, "\\u{:04x}", c as u32);
                }
                c if self.opts.ensure_ascii && !c.is_ascii() => {
                    let mut units = [0u16; 2];
                    for unit in c.encode_utf16(&mut units) {
                        let _ = write!(self.out, "\\u{unit:04x}");
                    }
                }
                c => self.out.push(c),
            }
        }
        self.out.push('"');
    }
}

/// Python turns non-string keys into strings (`1` → `"1"`, `None` → `"null"`).
fn key_string(key: &Value) -> Result<String, JinjaError> {
    Ok(match key.kind() {
        ValueKind::String => key.as_str().unwrap_or_default().to_owned(),
        ValueKind::None => "null".to_owned(),
        ValueKind::Bool => (if key.is_true() { "true" } else { "false" }).to_owned(),
        ValueKind::Number if key.is_integer() => key.to_string(),
        ValueKind::Number => float_repr(f64::try_from(key.clone())?),
        kind => {
            return Err(JinjaError::new(
                ErrorKind::InvalidOperation,
                format!("keys must be str, int, float, bool or None, not {kind}"),
            ));
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn py(json: &str) -> String {
        let v: serde_json::Value = serde_json::from_str(json).expect("test json");
        dumps(&from_json(&v)).expect("dumps")
    }

    #[test]
    fn float_repr_matches_python() {
        let cases = [
            (120.0, "120.0"),
            (3.5, "3.5"),
            (21.0, "21.0"),
            (0.0, "0.0"),
            (-0.0, "-0.0"),
            (1e16, "1e+16"),
            (1e15, "1000000000000000.0"),
            (1.5e-7, "1.5e-07"),
            (1e-5, "1e-05"),
            (0.0001, "0.0001"),
            (0.1, "0.1"),
            (1.0842, "1.0842"),
            (-2.5e-10, "-2.5e-10"),
            (123456789012345678.0, "1.2345678901234568e+17"),
            (1e100, "1e+100"),
            (f64::INFINITY, "Infinity"),
            (f64::NAN, "NaN"),
        ];
        for (f, want) in cases {
            assert_eq!(float_repr(f), want, "repr({f:?})");
        }
    }

    #[test]
    fn dumps_uses_python_separators_and_order() {
        assert_eq!(
            py(r#"{"b": 1, "a": [1, 2.50, 1.2e2, true, null], "c": {}}"#),
            r#"{"b": 1, "a": [1, 2.5, 120.0, true, null], "c": {}}"#
        );
        assert_eq!(py("[]"), "[]");
        assert_eq!(py("-7"), "-7");
        assert_eq!(py("18446744073709551615"), "18446744073709551615");
    }

    #[test]
    fn dumps_escapes_like_python() {
        assert_eq!(
            py(r#""a\"b\\c\n\r\t\b\f\u0001\u001f\/ \u007f""#),
            "\"a\\\"b\\\\c\\n\\r\\t\\b\\f\\u0001\\u001f/ \u{7f}\""
        );
        // ensure_ascii=False keeps non-ASCII as is, decoded from escapes.
        assert_eq!(py(r#""caf\u00e9 \ud83d\ude80 中""#), "\"café 🚀 中\"");
        // <, >, & and ' are not HTML-escaped (unlike Jinja's own tojson).
        assert_eq!(py(r#""<a href='x'>&</a>""#), "\"<a href='x'>&</a>\"");
    }

    #[test]
    fn dumps_options() {
        let v = from_json(&serde_json::json!({"b": [1, {"x": "é"}], "a": {}}));
        let opts = DumpOptions {
            indent: Some("  ".into()),
            sort_keys: true,
            ensure_ascii: true,
            ..Default::default()
        };
        assert_eq!(
            dumps_with(&v, &opts).unwrap(),
            "{\n  \"a\": {},\n  \"b\": [\n    1,\n    {\n      \"x\": \"\\u00e9\"\n    }\n  ]\n}"
        );
        let compact = DumpOptions {
            separators: Some((",".into(), ":".into())),
            ..Default::default()
        };
        assert_eq!(
            dumps_with(&v, &compact).unwrap(),
            r#"{"b":[1,{"x":"é"}],"a":{}}"#
        );
    }

    #[test]
    fn non_string_keys_and_unserializable() {
        let map: Value = vec![
            (Value::from(1), Value::from("x")),
            (Value::from(()), Value::from(2)),
        ]
        .into_iter()
        .collect();
        assert_eq!(dumps(&map).unwrap(), r#"{"1": "x", "null": 2}"#);
        assert!(dumps(&Value::UNDEFINED).is_err());
    }
}
