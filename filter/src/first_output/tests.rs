use super::*;
use proptest::prelude::*;

const ROLE: &str = "data: {\"id\":\"c\",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"}}]}\n\n";
const CONTENT: &str =
    "data: {\"id\":\"c\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hi\"}}]}\n\n";
const USAGE: &str = "data: {\"id\":\"c\",\"choices\":[],\"usage\":{\"prompt_tokens\":3}}\n\n";
const DONE: &str = "data: [DONE]\n\n";

fn scan_all(bytes: &[u8]) -> Scan {
    FirstOutputScanner::default().push(bytes)
}

#[test]
fn a_role_only_chunk_is_not_output() {
    let mut s = FirstOutputScanner::default();
    assert_eq!(s.push(ROLE.as_bytes()), Scan::Scanning);
    assert_eq!(s.push(CONTENT.as_bytes()), Scan::Output);
    assert_eq!(s.push(b"anything"), Scan::Output, "the answer sticks");
}

#[test]
fn each_kind_of_output_counts() {
    for delta in [
        r#"{"content":"x"}"#,
        r#"{"reasoning":"let me think"}"#,
        r#"{"reasoning_content":"hmm"}"#,
        r#"{"tool_calls":[{"index":0,"id":"call_1","function":{"name":"f","arguments":""}}]}"#,
        r#"{"role":"assistant","content":"both at once"}"#,
    ] {
        let event = format!("data: {{\"choices\":[{{\"index\":0,\"delta\":{delta}}}]}}\n\n");
        assert_eq!(scan_all(event.as_bytes()), Scan::Output, "{delta}");
    }
    let completion = "data: {\"choices\":[{\"index\":0,\"text\":\" the\"}]}\n\n";
    assert_eq!(scan_all(completion.as_bytes()), Scan::Output);
    // Any choice of several.
    let second = "data: {\"choices\":[{\"index\":0,\"delta\":{}},{\"index\":1,\"delta\":{\"content\":\"y\"}}]}\n\n";
    assert_eq!(scan_all(second.as_bytes()), Scan::Output);
}

#[test]
fn empty_or_absent_output_is_not_output() {
    for delta in [
        r#"{}"#,
        r#"{"content":""}"#,
        r#"{"content":null}"#,
        r#"{"reasoning":""}"#,
        r#"{"tool_calls":[]}"#,
        r#"{"role":"assistant"}"#,
    ] {
        let event = format!("data: {{\"choices\":[{{\"index\":0,\"delta\":{delta}}}]}}\n\n");
        assert_eq!(scan_all(event.as_bytes()), Scan::Scanning, "{delta}");
    }
    for other in [
        "data: {\"choices\":[{\"index\":0,\"text\":\"\"}]}\n\n",
        USAGE,
        DONE,
        ": keep-alive\n\n",
        "event: ping\ndata: {}\n\n",
        "data: not json\n\n",
        "data: [1,2]\n\n",
        "\n\n\n",
    ] {
        assert_eq!(scan_all(other.as_bytes()), Scan::Scanning, "{other:?}");
    }
}

#[test]
fn an_event_counts_only_once_it_ends() {
    let mut s = FirstOutputScanner::default();
    let without_blank_line = CONTENT.trim_end();
    assert_eq!(s.push(without_blank_line.as_bytes()), Scan::Scanning);
    assert_eq!(s.push(b"\n"), Scan::Scanning);
    assert_eq!(s.push(b"\n"), Scan::Output);
}

#[test]
fn line_endings_and_multi_line_data() {
    let crlf = CONTENT.replace('\n', "\r\n");
    assert_eq!(scan_all(crlf.as_bytes()), Scan::Output);
    let cr = CONTENT.replace('\n', "\r");
    assert_eq!(scan_all(cr.as_bytes()), Scan::Output);
    let split_json = "data: {\"choices\":\ndata: [{\"delta\":{\"content\":\"a\"}}]}\n\n";
    assert_eq!(scan_all(split_json.as_bytes()), Scan::Output);
    let no_space = "data:{\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\n";
    assert_eq!(scan_all(no_space.as_bytes()), Scan::Output);
    // A field merely starting with "data" is another field.
    let other_field = "datax: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\n";
    assert_eq!(scan_all(other_field.as_bytes()), Scan::Scanning);
}

#[test]
fn a_crlf_split_between_chunks_ends_one_line() {
    let mut s = FirstOutputScanner::default();
    let event = CONTENT.replace('\n', "\r\n");
    let (a, b) = event.split_at(event.len() - 3); // "...}\r" | "\n\r\n"
    assert_eq!(s.push(a.as_bytes()), Scan::Scanning);
    assert_eq!(s.push(b.as_bytes()), Scan::Output);
}

#[test]
fn oversized_events_give_up_with_bounded_memory() {
    let mut s = FirstOutputScanner::with_limit(256);
    let big = format!(
        "data: {{\"choices\":[{{\"delta\":{{\"role\":\"{}\"}}}}]}}",
        "r".repeat(10_000)
    );
    for chunk in big.as_bytes().chunks(100) {
        s.push(chunk);
        assert!(s.held() <= 2 * 256, "held {}", s.held());
    }
    assert_eq!(s.state(), Scan::GaveUp);
    assert_eq!(s.push(CONTENT.as_bytes()), Scan::GaveUp);
    // Many data lines adding up over the limit give up too.
    let mut lines = FirstOutputScanner::with_limit(256);
    for _ in 0..100 {
        lines.push(b"data: xxxxxxxxxx\n");
    }
    assert_eq!(lines.state(), Scan::GaveUp);
    let mut caller = FirstOutputScanner::default();
    caller.give_up();
    assert_eq!(caller.push(CONTENT.as_bytes()), Scan::GaveUp);
}

#[test]
fn event_stream_content_types() {
    assert!(is_event_stream("text/event-stream"));
    assert!(is_event_stream("Text/Event-Stream; charset=utf-8"));
    assert!(!is_event_stream("application/json"));
    assert!(!is_event_stream(""));
}

/// The index of the first event with output, computed on the whole stream.
fn reference(events: &[String]) -> Option<usize> {
    events.iter().position(|e| {
        let data = e
            .lines()
            .filter_map(|l| l.strip_prefix("data: "))
            .collect::<Vec<_>>()
            .join("\n");
        carries_output(data.as_bytes())
    })
}

fn event() -> impl Strategy<Value = String> {
    prop_oneof![
        Just(ROLE.to_owned()),
        Just(CONTENT.to_owned()),
        Just(USAGE.to_owned()),
        Just(DONE.to_owned()),
        Just(": ping\n\n".to_owned()),
        "[a-z ]{0,12}"
            .prop_map(|t| format!("data: {{\"choices\":[{{\"index\":0,\"text\":\"{t}\"}}]}}\n\n")),
        "[a-z]{0,6}".prop_map(|t| format!(
            "data: {{\"choices\":[{{\"index\":0,\"delta\":{{\"reasoning\":\"{t}\"}}}}]}}\n\n"
        )),
    ]
}

proptest! {
    #[test]
    fn any_split_finds_the_same_first_output(
        events in prop::collection::vec(event(), 0..8),
        cuts in prop::collection::vec(any::<prop::sample::Index>(), 0..6),
    ) {
        let stream: String = events.concat();
        let bytes = stream.as_bytes();
        let mut points: Vec<usize> = cuts.iter().map(|i| i.index(bytes.len() + 1)).collect();
        points.sort_unstable();
        let mut s = FirstOutputScanner::default();
        let mut found_at = None;
        let mut from = 0;
        for to in points.into_iter().chain([bytes.len()]) {
            if s.push(&bytes[from..to]) == Scan::Output && found_at.is_none() {
                found_at = Some(to);
            }
            from = to;
        }
        match reference(&events) {
            Some(i) => {
                prop_assert_eq!(s.state(), Scan::Output);
                // Found in the chunk that completed event i, not earlier.
                let end_of_event: usize = events[..=i].iter().map(String::len).sum();
                prop_assert!(found_at.is_some_and(|at| at >= end_of_event));
            }
            None => prop_assert_eq!(s.state(), Scan::Scanning),
        }
    }

    #[test]
    fn arbitrary_bytes_never_panic_and_stay_bounded(
        chunks in prop::collection::vec(prop::collection::vec(any::<u8>(), 0..300), 0..20),
    ) {
        let mut s = FirstOutputScanner::with_limit(512);
        for chunk in &chunks {
            s.push(chunk);
            prop_assert!(s.held() <= 2 * 512);
        }
    }
}

/// vLLM's `/v1/messages` stream: `message_start` and the empty start of a
/// text block are not output; the first `content_block_delta` with text is.
#[test]
fn anthropic_stream_output_is_the_first_content_delta() {
    let start = concat!(
        "event: message_start\n",
        "data: {\"type\":\"message_start\",\"message\":{\"id\":\"chatcmpl-1\",\"type\":\"message\",",
        "\"role\":\"assistant\",\"content\":[],\"model\":\"m\",\"stop_reason\":null,",
        "\"stop_sequence\":null,\"usage\":{\"input_tokens\":9,\"output_tokens\":0}}}\n\n",
        "event: content_block_start\n",
        "data: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"text\",\"text\":\"\"}}\n\n",
        "event: ping\ndata: {\"type\":\"ping\"}\n\n",
        "event: content_block_delta\n",
        "data: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"\"}}\n\n",
    );
    let mut s = FirstOutputScanner::default();
    assert_eq!(s.push(start.as_bytes()), Scan::Scanning);
    let delta = "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"Hi\"}}\n\n";
    assert_eq!(s.push(delta.as_bytes()), Scan::Output);

    for event in [
        r#"{"type":"content_block_delta","index":0,"delta":{"type":"thinking_delta","thinking":"hm"}}"#,
        r#"{"type":"content_block_delta","index":1,"delta":{"type":"input_json_delta","partial_json":"{\"a\""}}"#,
        r#"{"type":"content_block_start","index":1,"content_block":{"type":"tool_use","id":"t","name":"f","input":{}}}"#,
    ] {
        assert_eq!(
            scan_all(format!("data: {event}\n\n").as_bytes()),
            Scan::Output,
            "{event}"
        );
    }
    for event in [
        r#"{"type":"content_block_delta","index":0,"delta":{"type":"signature_delta","signature":"abc"}}"#,
        r#"{"type":"message_delta","delta":{"stop_reason":"end_turn"},"usage":{"input_tokens":9,"output_tokens":3}}"#,
        r#"{"type":"message_stop"}"#,
        r#"{"type":"content_block_start","index":0,"content_block":{"type":"thinking","thinking":""}}"#,
    ] {
        assert_eq!(
            scan_all(format!("data: {event}\n\n").as_bytes()),
            Scan::Scanning,
            "{event}"
        );
    }
}
