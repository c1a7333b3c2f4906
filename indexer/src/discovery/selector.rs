//! Kubernetes label selectors (the `labelSelector` query syntax) and the
//! name rules of the fields discovery reads: checked when the configuration
//! loads, so that a malformed selector is a configuration error naming the
//! pool rather than a watch the API server refuses at run time.

use std::collections::BTreeMap;

/// One requirement of a selector.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Requirement {
    Equals(String, String),
    NotEquals(String, String),
    In(String, Vec<String>),
    NotIn(String, Vec<String>),
    Exists(String),
    NotExists(String),
}

/// Parses a selector; an empty one selects everything.
pub fn parse(selector: &str) -> Result<Vec<Requirement>, String> {
    let mut out = Vec::new();
    for part in split_top_level(selector)? {
        let part = part.trim();
        if part.is_empty() {
            if selector.trim().is_empty() {
                continue;
            }
            return Err(format!("{selector:?}: empty requirement"));
        }
        out.push(requirement(part).map_err(|e| format!("{selector:?}: {e}"))?);
    }
    Ok(out)
}

/// Whether `labels` satisfy every requirement.
pub fn matches(reqs: &[Requirement], labels: &BTreeMap<String, String>) -> bool {
    reqs.iter().all(|r| match r {
        Requirement::Equals(k, v) => labels.get(k) == Some(v),
        Requirement::NotEquals(k, v) => labels.get(k) != Some(v),
        Requirement::In(k, vs) => labels.get(k).is_some_and(|v| vs.contains(v)),
        Requirement::NotIn(k, vs) => labels.get(k).is_none_or(|v| !vs.contains(v)),
        Requirement::Exists(k) => labels.contains_key(k),
        Requirement::NotExists(k) => !labels.contains_key(k),
    })
}

/// Splits on commas outside parentheses.
fn split_top_level(s: &str) -> Result<Vec<&str>, String> {
    let (mut parts, mut depth, mut start) = (Vec::new(), 0u32, 0);
    for (i, c) in s.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => {
                depth = depth
                    .checked_sub(1)
                    .ok_or_else(|| format!("{s:?}: unbalanced ')'"))?;
            }
            ',' if depth == 0 => {
                parts.push(&s[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    if depth != 0 {
        return Err(format!("{s:?}: unclosed '('"));
    }
    parts.push(&s[start..]);
    Ok(parts)
}

fn requirement(part: &str) -> Result<Requirement, String> {
    if let Some(key) = part.strip_prefix('!') {
        return Ok(Requirement::NotExists(key_of(key.trim())?));
    }
    for (op, build) in [
        (
            "!=",
            Requirement::NotEquals as fn(String, String) -> Requirement,
        ),
        ("==", Requirement::Equals),
        ("=", Requirement::Equals),
    ] {
        if let Some((k, v)) = part.split_once(op) {
            return Ok(build(key_of(k.trim())?, value_of(v.trim())?));
        }
    }
    let mut words = part.splitn(2, char::is_whitespace);
    let key = words.next().unwrap_or_default();
    let Some(rest) = words.next().map(str::trim) else {
        return Ok(Requirement::Exists(key_of(key)?));
    };
    let (set_op, list) = if let Some(l) = rest.strip_prefix("notin") {
        (false, l)
    } else if let Some(l) = rest.strip_prefix("in") {
        (true, l)
    } else {
        return Err(format!("{part:?}: expected =, ==, !=, in or notin"));
    };
    let list = list.trim();
    let inner = list
        .strip_prefix('(')
        .and_then(|l| l.strip_suffix(')'))
        .ok_or_else(|| format!("{part:?}: the values need parentheses"))?;
    let values = inner
        .split(',')
        .map(|v| value_of(v.trim()))
        .collect::<Result<Vec<_>, _>>()?;
    let key = key_of(key)?;
    Ok(if set_op {
        Requirement::In(key, values)
    } else {
        Requirement::NotIn(key, values)
    })
}

/// A label key: `[prefix/]name`, the prefix a DNS subdomain.
fn key_of(k: &str) -> Result<String, String> {
    let ok = match k.rsplit_once('/') {
        Some((prefix, name)) => is_dns_subdomain(prefix) && is_label_name(name),
        None => is_label_name(k),
    };
    if ok {
        Ok(k.to_owned())
    } else {
        Err(format!("{k:?} is not a label key"))
    }
}

fn value_of(v: &str) -> Result<String, String> {
    if v.is_empty() || is_label_name(v) {
        Ok(v.to_owned())
    } else {
        Err(format!("{v:?} is not a label value"))
    }
}

/// `[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?`, at most 63 characters.
fn is_label_name(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= 63
        && b[0].is_ascii_alphanumeric()
        && b[b.len() - 1].is_ascii_alphanumeric()
        && b.iter()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.'))
}

/// A DNS-1123 label: lowercase alphanumerics and `-`, at most 63.
pub fn is_dns_label(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= 63
        && b[0].is_ascii_alphanumeric()
        && b[b.len() - 1].is_ascii_alphanumeric()
        && b.iter()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
}

fn is_dns_subdomain(s: &str) -> bool {
    s.len() <= 253 && s.split('.').all(is_dns_label)
}

/// A container port name (IANA_SVC_NAME): lowercase alphanumerics and
/// `-`, at most 15, with a letter, no `--`, not starting or ending in `-`.
pub fn is_port_name(s: &str) -> bool {
    is_dns_label(s)
        && s.len() <= 15
        && s.bytes().any(|c| c.is_ascii_lowercase())
        && !s.contains("--")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[test]
    fn selectors_parse_and_match_like_the_api_server() {
        let r =
            parse("app=vllm,kvsteer.io/pool==qwen3-8b, tier in (a, b),!canary,zone notin (x),gpu")
                .unwrap();
        assert_eq!(r.len(), 6);
        let pod = labels(&[
            ("app", "vllm"),
            ("kvsteer.io/pool", "qwen3-8b"),
            ("tier", "b"),
            ("gpu", ""),
        ]);
        assert!(matches(&r, &pod));
        let mut canary = pod.clone();
        canary.insert("canary".into(), "true".into());
        assert!(!matches(&r, &canary));
        let mut other_tier = pod.clone();
        other_tier.insert("tier".into(), "c".into());
        assert!(!matches(&r, &other_tier));
        assert!(matches(&parse("").unwrap(), &pod));
        assert!(matches(&parse("app!=sglang").unwrap(), &pod));
    }

    #[test]
    fn malformed_selectors_are_refused_with_the_reason() {
        for bad in [
            "app in (a",
            "app=vllm)",
            "app=vllm,,x=y",
            "app in a,b",
            "app ~ x",
            "-app=x",
            "app=not a value",
            "Bad_Prefix.io/x=y",
            "app=",
        ] {
            let res = parse(bad);
            // `app=` is valid (an empty value); everything else is not.
            if bad == "app=" {
                assert!(res.is_ok());
            } else {
                assert!(res.is_err(), "{bad} parsed: {res:?}");
            }
        }
    }

    #[test]
    fn names() {
        assert!(is_port_name("kv-events") && is_port_name("http"));
        assert!(!is_port_name("kv_events") && !is_port_name("8000") && !is_port_name("a--b"));
        assert!(!is_port_name("much-too-long-port-name"));
        assert!(is_dns_label("kvsteer") && !is_dns_label("KvSteer") && !is_dns_label("-a"));
    }
}
