//! Frame layouts of the live stream and of the replay protocol.

use bytes::Bytes;

/// The seq frame of the replay end marker (`-1` as i64).
pub(crate) const END_MARKER_SEQ: [u8; 8] = [0xff; 8];

pub(crate) fn seq_frame(seq: u64) -> Bytes {
    Bytes::copy_from_slice(&seq.to_be_bytes())
}

/// An 8-byte big-endian seq frame (live stream and replay replies).
pub(crate) fn parse_seq(frame: &[u8]) -> Option<u64> {
    <[u8; 8]>::try_from(frame).ok().map(u64::from_be_bytes)
}

/// The start seq of a replay request, read like vLLM does: an unsigned
/// big-endian int of whatever length the frame has (empty means 0). Values
/// beyond u64 saturate, which matches "newer than anything buffered".
pub(crate) fn parse_start_seq(frame: &[u8]) -> u64 {
    let first = frame.iter().position(|b| *b != 0).unwrap_or(frame.len());
    let digits = &frame[first..];
    if digits.len() > 8 {
        return u64::MAX;
    }
    digits
        .iter()
        .fold(0u64, |acc, b| (acc << 8) | u64::from(*b))
}

/// One live message: `[topic, seq, payload]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct LiveMessage {
    pub(crate) topic: Bytes,
    pub(crate) seq: u64,
    pub(crate) payload: Bytes,
}

pub(crate) fn parse_live(frames: Vec<Bytes>) -> Result<LiveMessage, String> {
    match <[Bytes; 3]>::try_from(frames) {
        Ok([topic, seq, payload]) => match parse_seq(&seq) {
            Some(seq) => Ok(LiveMessage {
                topic,
                seq,
                payload,
            }),
            None => Err(format!("seq frame has {} bytes, expected 8", seq.len())),
        },
        Err(frames) => Err(format!("{} frames, expected 3", frames.len())),
    }
}

/// One reply message of a replay, as the DEALER receives it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum ReplyMessage {
    Batch { seq: u64, payload: Bytes },
    End,
}

/// Parses `[b"", topic, seq, payload]` (vLLM 0.26+) or `[b"", seq, payload]`
/// (older); the end marker has seq `ffffffffffffffff` and an empty payload.
pub(crate) fn parse_reply(frames: &[Bytes]) -> Result<ReplyMessage, String> {
    let (seq, payload) = match frames {
        [delim, _, seq, payload] if delim.is_empty() => (seq, payload),
        [delim, seq, payload] if delim.is_empty() => (seq, payload),
        _ => {
            return Err(format!(
                "unexpected replay reply with {} frames",
                frames.len()
            ));
        }
    };
    if seq.as_ref() == END_MARKER_SEQ && payload.is_empty() {
        return Ok(ReplyMessage::End);
    }
    match parse_seq(seq) {
        Some(seq) => Ok(ReplyMessage::Batch {
            seq,
            payload: payload.clone(),
        }),
        None => Err(format!("replay seq frame has {} bytes", seq.len())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn start_seq_like_vllm() {
        assert_eq!(parse_start_seq(&[0, 0, 0, 4]), 4);
        assert_eq!(parse_start_seq(&[]), 0);
        assert_eq!(parse_start_seq(&[5, 0, 0, 0, 0, 0, 0, 0]), 5 << 56);
        assert_eq!(parse_start_seq(&[0xff; 8]), u64::MAX);
        assert_eq!(parse_start_seq(&[1; 9]), u64::MAX);
        assert_eq!(parse_start_seq(&[0, 0, 0, 0, 0, 0, 0, 0, 0, 3]), 3);
    }

    #[test]
    fn replies_of_both_versions() {
        let e = Bytes::new();
        let end = [
            e.clone(),
            e.clone(),
            Bytes::from_static(&END_MARKER_SEQ),
            e.clone(),
        ];
        assert_eq!(parse_reply(&end), Ok(ReplyMessage::End));
        let old_end = [e.clone(), Bytes::from_static(&END_MARKER_SEQ), e.clone()];
        assert_eq!(parse_reply(&old_end), Ok(ReplyMessage::End));
        let batch = [
            e.clone(),
            Bytes::from_static(b"t"),
            seq_frame(3),
            Bytes::from_static(b"p"),
        ];
        assert_eq!(
            parse_reply(&batch),
            Ok(ReplyMessage::Batch {
                seq: 3,
                payload: Bytes::from_static(b"p")
            })
        );
        assert!(parse_reply(&[Bytes::from_static(b"x"), seq_frame(1), e]).is_err());
    }

    #[test]
    fn live_frames() {
        let m = parse_live(vec![Bytes::new(), seq_frame(7), Bytes::from_static(b"p")]);
        assert_eq!(m.map(|m| m.seq), Ok(7));
        assert!(parse_live(vec![Bytes::new(), Bytes::from_static(b"1")]).is_err());
        assert!(parse_live(vec![Bytes::new(), Bytes::from_static(b"1"), Bytes::new()]).is_err());
    }
}
