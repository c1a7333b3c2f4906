//! Mooncake-style JSONL traces: one request per line,
//! `{"timestamp": ms, "input_length": n, "output_length": n, "hash_ids": [..]}`
//! where each hash id names one 512-token block of the prompt (equal ids at
//! equal positions mean equal tokens, so prefixes are shared as in the
//! original trace). Unknown fields are ignored.

use std::path::Path;

/// Tokens per `hash_ids` entry in the public Mooncake traces.
pub const BLOCK_TOKENS: u32 = 512;

#[derive(Debug, Clone, PartialEq, serde::Deserialize)]
pub struct TraceRequest {
    pub timestamp_ms: u64,
    pub input_length: u32,
    pub output_length: u32,
    pub hash_ids: Vec<u64>,
}

#[derive(Debug, serde::Deserialize)]
struct Line {
    timestamp: f64,
    input_length: u32,
    output_length: u32,
    #[serde(default)]
    hash_ids: Vec<u64>,
}

#[derive(Debug, thiserror::Error)]
pub enum TraceError {
    #[error("reading trace {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("trace line {line}: {source}")]
    Line {
        line: usize,
        source: serde_json::Error,
    },
    #[error("trace line {line}: timestamp {timestamp} is not a finite non-negative number")]
    Timestamp { line: usize, timestamp: f64 },
    #[error("trace {0} has no requests")]
    Empty(String),
}

pub fn load(path: &Path) -> Result<Vec<TraceRequest>, TraceError> {
    let text = std::fs::read_to_string(path).map_err(|source| TraceError::Read {
        path: path.display().to_string(),
        source,
    })?;
    let out = parse(&text)?;
    if out.is_empty() {
        return Err(TraceError::Empty(path.display().to_string()));
    }
    Ok(out)
}

/// Parses JSONL; blank lines are skipped.
pub fn parse(text: &str) -> Result<Vec<TraceRequest>, TraceError> {
    let mut out = Vec::new();
    for (i, raw) in text.lines().enumerate() {
        if raw.trim().is_empty() {
            continue;
        }
        let line: Line = serde_json::from_str(raw).map_err(|source| TraceError::Line {
            line: i + 1,
            source,
        })?;
        if !(line.timestamp.is_finite() && line.timestamp >= 0.0) {
            return Err(TraceError::Timestamp {
                line: i + 1,
                timestamp: line.timestamp,
            });
        }
        out.push(TraceRequest {
            timestamp_ms: line.timestamp as u64,
            input_length: line.input_length,
            output_length: line.output_length,
            hash_ids: line.hash_ids,
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_mooncake_lines_and_names_bad_ones() {
        let text = r#"{"timestamp": 0, "input_length": 600, "output_length": 10, "hash_ids": [1, 2]}

{"timestamp": 1500, "input_length": 100, "output_length": 5, "hash_ids": [1], "extra": true}"#;
        let t = parse(text).unwrap();
        assert_eq!(t.len(), 2);
        assert_eq!(t[1].timestamp_ms, 1500);
        assert_eq!(t[0].hash_ids, vec![1, 2]);
        let err = parse("{\"timestamp\": 0}").unwrap_err();
        assert!(err.to_string().contains("line 1"), "{err}");
        let err = parse(r#"{"timestamp": -1, "input_length": 1, "output_length": 1}"#).unwrap_err();
        assert!(matches!(err, TraceError::Timestamp { line: 1, .. }));
    }
}
