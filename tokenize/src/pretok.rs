//! The Qwen2/Qwen3 split regex, hand-coded for plain ASCII text, and the
//! places where a text can be cut without changing its pre-tokenization.
//!
//! The regex (`tokenizer.json`, `pre_tokenizer.pretokenizers[0]`) is
//!
//! ```text
//! (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
//! ```
//!
//! matched leftmost-first (onig), every match a piece (`Isolated`). It matches
//! every character, so the pieces tile the text. On [`is_fast_byte`] text
//! (printable ASCII, `\t`, `\n`, `\r`: the classes `\p{L}`, `\p{N}`, `\s` are
//! unambiguous there) [`split`] reproduces it without a regex engine;
//! `tests/fast_property.rs` checks it against `tokenizers` on random texts.

/// The pattern [`split`] implements; any other pattern takes the slow path.
pub const PATTERN: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// Bytes [`split`] handles: printable ASCII, tab, line feed, carriage return.
/// (`\v`, `\f` and other controls are left to the regex engine: whether they
/// are `\s` is the engine's business.)
pub fn is_fast_byte(b: u8) -> bool {
    matches!(b, b' '..=b'~' | b'\t' | b'\n' | b'\r')
}

fn is_letter(b: u8) -> bool {
    b.is_ascii_alphabetic()
}

fn is_space(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\n' | b'\r')
}

fn is_newline(b: u8) -> bool {
    matches!(b, b'\n' | b'\r')
}

/// `[^\s\p{L}\p{N}]` on fast bytes: printable punctuation and symbols.
fn is_punct(b: u8) -> bool {
    b.is_ascii_graphic() && !b.is_ascii_alphanumeric()
}

/// Whether the pre-tokenization of `text` has a piece boundary at `p` that
/// holds whatever comes before `p - 1` and after `p`, and cutting there
/// changes neither NFC nor the regex pieces of either side. Both bytes around
/// `p` must be fast bytes (ASCII never composes under NFC with a neighbour
/// that is ASCII). A piece containing byte `p - 1` ends at `p` when:
/// - `p - 1` is a letter and `p` is not: only the contraction and
///   `…\p{L}+` alternatives hold letters, and both end at a letter;
/// - `p - 1` is a digit: only `\p{N}` holds digits, one at a time;
/// - `p - 1` is `\r`/`\n` and `p` is printable non-space: the pieces holding
///   a line break end in `[\r\n]*`, `[\r\n]+` or `\s+`.
///
/// No alternative looks behind, and the only look-ahead, `(?!\S)`, is tried
/// at `p` only after whitespace, where the first two rules cannot apply and
/// the third has `\s*[\r\n]+` succeed first with the same end.
pub fn is_boundary(text: &[u8], p: usize) -> bool {
    if p == 0 || p >= text.len() {
        return false;
    }
    let (a, b) = (text[p - 1], text[p]);
    if !is_fast_byte(a) || !is_fast_byte(b) {
        return false;
    }
    (is_letter(a) && !is_letter(b)) || a.is_ascii_digit() || (is_newline(a) && b.is_ascii_graphic())
}

/// Calls `piece` with each regex piece of `text` (all [`is_fast_byte`]), in
/// order.
pub fn split(text: &[u8], mut piece: impl FnMut(&[u8])) {
    let mut i = 0;
    while i < text.len() {
        let end = match_at(text, i);
        debug_assert!(end > i);
        piece(&text[i..end]);
        i = end;
    }
}

/// End of the leftmost-first match starting at `i` (the regex matches
/// something at every position of fast text).
fn match_at(t: &[u8], i: usize) -> usize {
    let at = |k: usize| t.get(k).copied();
    let c = t[i];
    // (?i:'s|'t|'re|'ve|'m|'ll|'d)
    if c == b'\'' {
        let lower = |k| at(k).map(|b: u8| b.to_ascii_lowercase());
        match (lower(i + 1), lower(i + 2)) {
            (Some(b's' | b't' | b'm' | b'd'), _) => return i + 2,
            (Some(b'r' | b'v'), Some(b'e')) | (Some(b'l'), Some(b'l')) => return i + 3,
            _ => {}
        }
    }
    let letters_from = |k: usize| {
        let mut e = k;
        while e < t.len() && is_letter(t[e]) {
            e += 1;
        }
        e
    };
    // [^\r\n\p{L}\p{N}]?\p{L}+
    if is_letter(c) {
        return letters_from(i);
    }
    if !is_newline(c) && !c.is_ascii_digit() && at(i + 1).is_some_and(is_letter) {
        return letters_from(i + 1);
    }
    // \p{N}
    if c.is_ascii_digit() {
        return i + 1;
    }
    // ` ?[^\s\p{L}\p{N}]+[\r\n]*`
    let punct_start = if c == b' ' && at(i + 1).is_some_and(is_punct) {
        Some(i + 1)
    } else if is_punct(c) {
        Some(i)
    } else {
        None
    };
    if let Some(mut e) = punct_start {
        while e < t.len() && is_punct(t[e]) {
            e += 1;
        }
        while e < t.len() && is_newline(t[e]) {
            e += 1;
        }
        return e;
    }
    // c is whitespace here (fast bytes are letters, digits, punct or space).
    let mut run_end = i;
    while run_end < t.len() && is_space(t[run_end]) {
        run_end += 1;
    }
    // \s*[\r\n]+ : up to and including the last line break of the run.
    if let Some(last) = (i..run_end).rev().find(|&k| is_newline(t[k])) {
        return last + 1;
    }
    // \s+(?!\S) : the whole run at the end of text, else all but its last
    // character; a single space before a non-space falls to \s+.
    if run_end == t.len() || run_end - i == 1 {
        run_end
    } else {
        run_end - 1
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pieces(text: &str) -> Vec<&str> {
        let mut out = Vec::new();
        let mut pos = 0;
        split(text.as_bytes(), |p| {
            out.push(&text[pos..pos + p.len()]);
            pos += p.len();
        });
        out
    }

    #[test]
    fn known_splits() {
        assert_eq!(
            pieces("Hello world's  end\n\n  x.\n42"),
            [
                "Hello", " world", "'s", " ", " end", "\n\n", " ", " x", ".\n", "4", "2"
            ]
        );
        assert_eq!(pieces("it'LL 'Re '"), ["it", "'LL", " '", "Re", " '"]);
        assert_eq!(pieces("a \t\r\n  "), ["a", " \t\r\n", "  "]);
        assert_eq!(pieces("\t.x ..."), ["\t", ".x", " ..."]);
    }

    #[test]
    fn boundaries() {
        let t = b"ab c1.\nx\n ";
        let cuts: Vec<usize> = (0..t.len()).filter(|&p| is_boundary(t, p)).collect();
        // after "ab", "c", "1", "\n" before "x", "x" before "\n"
        assert_eq!(cuts, [2, 4, 5, 7, 8]);
    }
}
