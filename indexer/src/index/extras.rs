//! A block's `extra_keys` → what they contribute to its chain key.

use kvsteer_kv_events::ExtraKey;

/// Deepest `extra_keys` nesting folded into a digest; deeper is malformed.
const MAX_EXTRA_DEPTH: u32 = 16;

/// What a block's `extra_keys` contribute to its key.
#[derive(Debug, Default, PartialEq)]
pub struct Extras<'a> {
    pub salt: Option<&'a str>,
    /// Digest of keys a prompt cannot reproduce (multimodal, ...); 0 if none.
    pub digest: u64,
}

/// vLLM orders a block's extra keys `lora + mm + cache_salt (+ embeds)`, the
/// salt only in the first block of a request. So: the first string equal to
/// the LoRA name (or int equal to the LoRA id) is the LoRA, already in the
/// context; in the root block the last remaining string is the salt;
/// everything else is folded into a digest. `None` when malformed.
pub fn classify_extras<'a>(
    extras: Option<&'a [ExtraKey]>,
    lora: Option<&str>,
    lora_id: Option<i64>,
    is_root: bool,
) -> Option<Extras<'a>> {
    let mut out = Extras::default();
    let Some(extras) = extras else {
        return Some(out);
    };
    let mut lora_seen = false;
    let is_lora = |v: &ExtraKey| match (v.as_str(), v.as_i64()) {
        (Some(s), _) => lora == Some(s),
        (None, Some(id)) => lora.is_none() && lora_id == Some(id),
        _ => false,
    };
    let salt_at = if is_root {
        let skip_lora = extras.iter().position(is_lora);
        extras
            .iter()
            .enumerate()
            .rev()
            .find(|(i, v)| Some(*i) != skip_lora && v.as_str().is_some())
            .map(|(i, _)| i)
    } else {
        None
    };
    let mut digest: Option<u64> = None;
    for (i, value) in extras.iter().enumerate() {
        if !lora_seen && is_lora(value) {
            lora_seen = true;
            continue;
        }
        if Some(i) == salt_at {
            out.salt = value.as_str();
            continue;
        }
        digest = Some(fold(digest.unwrap_or(0), value, 0)?);
    }
    // 0 means "no extras": a real digest of 0 becomes 1.
    out.digest = digest.map_or(0, |d| d.max(1));
    Some(out)
}

/// Order-sensitive digest of a msgpack value tree.
fn fold(acc: u64, value: &ExtraKey, depth: u32) -> Option<u64> {
    if depth > MAX_EXTRA_DEPTH {
        return None;
    }
    let mix = |acc: u64, tag: u8, bytes: &[u8]| {
        let seed = acc.rotate_left(5) ^ u64::from(tag);
        xxhash_rust::xxh3::xxh3_64_with_seed(bytes, seed)
    };
    Some(match value {
        ExtraKey::Nil => mix(acc, 0, &[]),
        ExtraKey::Boolean(b) => mix(acc, 1, &[u8::from(*b)]),
        ExtraKey::Integer(i) => match (i.as_i64(), i.as_u64()) {
            (Some(v), _) => mix(acc, 2, &v.to_le_bytes()),
            (None, Some(v)) => mix(acc, 3, &v.to_le_bytes()),
            _ => mix(acc, 4, &[]),
        },
        ExtraKey::F32(f) => mix(acc, 5, &f.to_le_bytes()),
        ExtraKey::F64(f) => mix(acc, 6, &f.to_le_bytes()),
        ExtraKey::String(s) => mix(acc, 7, s.as_bytes()),
        ExtraKey::Binary(b) => mix(acc, 8, b),
        ExtraKey::Ext(t, b) => mix(acc, 9 ^ (*t as u8), b),
        ExtraKey::Array(items) => {
            let mut a = mix(acc, 10, &(items.len() as u64).to_le_bytes());
            for item in items {
                a = fold(a, item, depth + 1)?;
            }
            a
        }
        ExtraKey::Map(pairs) => {
            let mut a = mix(acc, 11, &(pairs.len() as u64).to_le_bytes());
            for (k, v) in pairs {
                a = fold(a, k, depth + 1)?;
                a = fold(a, v, depth + 1)?;
            }
            a
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(v: &str) -> ExtraKey {
        ExtraKey::from(v)
    }

    #[test]
    fn extras_lora_salt_and_opaque() {
        let lora = Some("sql");
        // Root block: [lora, salt] → salt.
        let e = [s("sql"), s("tenant")];
        let x = classify_extras(Some(&e), lora, Some(1), true).unwrap();
        assert_eq!(
            x,
            Extras {
                salt: Some("tenant"),
                digest: 0
            }
        );
        // Non-root block: the lora only.
        let x = classify_extras(Some(&e[..1]), lora, Some(1), false).unwrap();
        assert_eq!(x, Extras::default());
        // A salt equal to the LoRA name: the first is the LoRA.
        let e = [s("sql"), s("sql")];
        let x = classify_extras(Some(&e), lora, None, true).unwrap();
        assert_eq!(x.salt, Some("sql"));
        // Old engines: the LoRA as its int id.
        let e = [ExtraKey::from(3), s("tenant")];
        let x = classify_extras(Some(&e), None, Some(3), true).unwrap();
        assert_eq!(
            x,
            Extras {
                salt: Some("tenant"),
                digest: 0
            }
        );
        // Multimodal [identifier, offset] is opaque, and order matters.
        let mm = |o: i64| ExtraKey::Array(vec![s("img"), ExtraKey::from(o)]);
        let (ea, eb) = ([mm(5)], [mm(-11)]);
        let a = classify_extras(Some(&ea), None, None, true).unwrap();
        let b = classify_extras(Some(&eb), None, None, true).unwrap();
        assert!(a.digest != 0 && b.digest != 0 && a.digest != b.digest);
        assert_eq!(a.salt, None);
        // A string outside the root block is opaque too.
        let e = [s("x")];
        let x = classify_extras(Some(&e), None, None, false).unwrap();
        assert_ne!(x.digest, 0);
        assert_eq!(
            classify_extras(None, lora, None, true),
            Some(Extras::default())
        );
    }

    #[test]
    fn extras_too_deep_are_malformed() {
        let mut v = ExtraKey::from(1);
        for _ in 0..40 {
            v = ExtraKey::Array(vec![v]);
        }
        assert_eq!(classify_extras(Some(&[v]), None, None, false), None);
    }
}
