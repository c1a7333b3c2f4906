//! Finds the first server-sent event of an OpenAI stream that carries
//! generated output, so the filter times the first token rather than the
//! first byte.
//!
//! vLLM's chat stream may open with a chunk that only names the `role`; that
//! is not output. Output is a choice whose `delta` has a non-empty `content`,
//! `reasoning` (or the older `reasoning_content`) or `tool_calls` (chat), or
//! whose `text` is non-empty (completions). On Anthropic's `/v1/messages`
//! stream (which vLLM converts from its chat stream) `message_start` and
//! `content_block_start` of a text or thinking block are not output; output
//! is a `content_block_delta` with a non-empty `text`, `thinking` or
//! `partial_json`, or the start of a `tool_use` block (vLLM sends the tool's
//! name there). Events may be split anywhere
//! across body chunks; the scanner keeps at most `limit` bytes of the event
//! being read and gives up on a larger one (the caller then reports no
//! measured time rather than a wrong one).

use serde_json::Value;

/// Bytes of one event kept while it is incomplete.
pub const DEFAULT_EVENT_LIMIT: usize = 64 * 1024;

/// What the scanner knows so far.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scan {
    /// No output yet; keep feeding chunks.
    Scanning,
    /// An event with generated output ended in the bytes just pushed.
    Output,
    /// The stream cannot be followed (an event over the limit); stop feeding.
    GaveUp,
}

/// An incremental SSE reader that stops at the first output event.
#[derive(Clone, Debug)]
pub struct FirstOutputScanner {
    state: Scan,
    limit: usize,
    /// The line being read (without its terminator).
    line: Vec<u8>,
    /// `data:` values of the event being read, joined with `\n`.
    data: Vec<u8>,
    /// The event being read has a `data:` line.
    has_data: bool,
    /// The last byte seen was a `\r`: a `\n` right after it ends nothing.
    after_cr: bool,
}

// === impl FirstOutputScanner ===

impl Default for FirstOutputScanner {
    fn default() -> Self {
        Self::with_limit(DEFAULT_EVENT_LIMIT)
    }
}

impl FirstOutputScanner {
    pub fn with_limit(limit: usize) -> Self {
        Self {
            state: Scan::Scanning,
            limit: limit.max(1),
            line: Vec::new(),
            data: Vec::new(),
            has_data: false,
            after_cr: false,
        }
    }

    pub fn state(&self) -> Scan {
        self.state
    }

    /// Bytes held for the incomplete event (bounded by about twice the limit).
    pub fn held(&self) -> usize {
        self.line.len() + self.data.len()
    }

    /// Stops scanning: the caller could not hand over every byte.
    pub fn give_up(&mut self) {
        if self.state == Scan::Scanning {
            self.state = Scan::GaveUp;
        }
        self.release();
    }

    /// Feeds the next bytes of the stream; once the answer is `Output` or
    /// `GaveUp` it stays so and further bytes are ignored.
    pub fn push(&mut self, bytes: &[u8]) -> Scan {
        for &b in bytes {
            if self.state != Scan::Scanning {
                break;
            }
            match b {
                b'\n' if self.after_cr => self.after_cr = false,
                b'\n' | b'\r' => {
                    self.after_cr = b == b'\r';
                    self.end_line();
                }
                _ => {
                    self.after_cr = false;
                    if self.line.len() >= self.limit {
                        self.give_up();
                    } else {
                        self.line.push(b);
                    }
                }
            }
        }
        self.state
    }

    fn end_line(&mut self) {
        let line = std::mem::take(&mut self.line);
        if line.is_empty() {
            self.end_event();
        } else if let Some(value) = field_value(&line, b"data") {
            if self.has_data {
                self.data.push(b'\n');
            }
            self.has_data = true;
            if self.data.len() + value.len() > self.limit {
                self.give_up();
                return;
            }
            self.data.extend_from_slice(value);
        }
        // Comments (`: ...`) and other fields (`event`, `id`, `retry`) say
        // nothing about output.
        self.line = line;
        self.line.clear();
    }

    fn end_event(&mut self) {
        if self.has_data && carries_output(&self.data) {
            self.state = Scan::Output;
            self.release();
            return;
        }
        self.data.clear();
        self.has_data = false;
    }

    fn release(&mut self) {
        self.line = Vec::new();
        self.data = Vec::new();
        self.has_data = false;
    }
}

/// The value of an SSE `field: value` line (one leading space dropped), or
/// `None` for another field. A line that is just the field name has an empty
/// value.
fn field_value<'a>(line: &'a [u8], field: &[u8]) -> Option<&'a [u8]> {
    let rest = line.strip_prefix(field)?;
    match rest.split_first() {
        None => Some(rest),
        Some((b':', value)) => Some(value.strip_prefix(b" ").unwrap_or(value)),
        Some(_) => None,
    }
}

/// Whether one event's data is an OpenAI chunk or an Anthropic event with
/// generated output.
pub fn carries_output(data: &[u8]) -> bool {
    let Ok(Value::Object(chunk)) = serde_json::from_slice::<Value>(data) else {
        return false; // `[DONE]`, keep-alives, or not JSON
    };
    match chunk.get("choices") {
        Some(Value::Array(choices)) => choices.iter().any(choice_has_output),
        _ => anthropic_event_has_output(&chunk),
    }
}

fn anthropic_event_has_output(event: &serde_json::Map<String, Value>) -> bool {
    match event.get("type").and_then(Value::as_str) {
        Some("content_block_delta") => event.get("delta").is_some_and(|delta| {
            non_empty_str(delta.get("text"))
                || non_empty_str(delta.get("thinking"))
                || non_empty_str(delta.get("partial_json"))
        }),
        Some("content_block_start") => event
            .get("content_block")
            .and_then(|b| b.get("type"))
            .is_some_and(|t| t == "tool_use"),
        _ => false,
    }
}

fn choice_has_output(choice: &Value) -> bool {
    if non_empty_str(choice.get("text")) {
        return true; // completions
    }
    let Some(delta) = choice.get("delta") else {
        return false;
    };
    non_empty_str(delta.get("content"))
        || non_empty_str(delta.get("reasoning"))
        || non_empty_str(delta.get("reasoning_content"))
        || matches!(delta.get("tool_calls"), Some(Value::Array(calls)) if !calls.is_empty())
}

fn non_empty_str(value: Option<&Value>) -> bool {
    matches!(value, Some(Value::String(s)) if !s.is_empty())
}

/// Whether a response `content-type` is a server-sent event stream.
pub fn is_event_stream(content_type: &str) -> bool {
    let essence = content_type.split(';').next().unwrap_or_default().trim();
    essence.eq_ignore_ascii_case("text/event-stream")
}

#[cfg(test)]
mod tests;
