use super::*;
use kvsteer_proto::v1::{PickStreamRequest, pick_stream_request::Kind};
use prost::Message;

const AGE: Duration = Duration::from_secs(60);

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// Streams with stream 7 open at `t`.
fn open_at(t: Duration) -> PickStreams<u32> {
    let mut s = PickStreams::new(1, AGE);
    assert_eq!(s.stream(), None);
    assert_eq!(s.open_due(t), Some(0));
    s.opening(0, 7, t);
    s.established(7, t);
    s
}

#[test]
fn picks_take_the_unary_call_until_the_indexer_answers_the_headers() {
    let mut s = PickStreams::<u32>::new(1, AGE);
    assert_eq!(s.next_tick(ms(0)), None, "no stream wanted before a pick");
    assert!(s.open_due(ms(0)).is_none());
    assert_eq!(
        s.stream(),
        None,
        "the first pick goes unary and wants a stream"
    );
    assert!(s.open_due(ms(5)).is_some());
    s.opening(0, 3, ms(5));
    assert!(s.open_due(ms(6)).is_none());
    assert_eq!(s.stream(), None, "headers not in yet");
    s.established(4, ms(6));
    assert_eq!(s.stream(), None, "another stream's headers change nothing");
    s.established(3, ms(7));
    assert_eq!(s.stream(), Some(3));
}

#[test]
fn unimplemented_backs_off_long_and_other_failures_double() {
    let mut s = PickStreams::<u32>::new(1, AGE);
    s.stream();
    s.opening(0, 1, ms(0));
    s.closed(1, GrpcStatusCode::Unimplemented as u32, ms(0));
    assert!(s.open_due(RETRY_UNIMPLEMENTED - ms(1)).is_none());
    assert!(s.open_due(RETRY_UNIMPLEMENTED).is_some());

    let mut s = PickStreams::<u32>::new(1, AGE);
    s.stream();
    let mut now = ms(0);
    let mut waits = Vec::new();
    for token in 1..=10 {
        s.opening(0, token, now);
        s.closed(token, 14, now);
        let wait = s.next_tick(now).unwrap();
        waits.push(wait);
        now += wait;
        assert!(s.open_due(now).is_some());
    }
    assert_eq!(waits[0], RETRY_FIRST);
    assert_eq!(waits[1], RETRY_FIRST * 2);
    assert_eq!(waits[2], RETRY_FIRST * 4);
    assert_eq!(*waits.last().unwrap(), RETRY_MAX);
    // Once a stream opens, the back-off starts over.
    s.opening(0, 11, now);
    s.established(11, now);
    s.closed(11, 14, now);
    assert!(
        s.open_due(now).is_some(),
        "an established stream is replaced at once"
    );
    s.opening(0, 12, now);
    s.closed(12, 14, now);
    assert_eq!(s.next_tick(now), Some(RETRY_FIRST));
}

#[test]
fn a_stream_without_headers_is_given_up_after_the_open_timeout() {
    let mut s = PickStreams::<u32>::new(1, AGE);
    s.stream();
    s.opening(0, 5, ms(100));
    assert_eq!(s.next_tick(ms(100)), Some(OPEN_TIMEOUT));
    assert!(s.open_timed_out(ms(100) + OPEN_TIMEOUT - ms(1)).is_empty());
    assert_eq!(s.open_timed_out(ms(100) + OPEN_TIMEOUT), vec![5]);
    assert_eq!(s.stream(), None);
    // Its late close (after the cancel) does not touch the next attempt.
    let retry = ms(100) + OPEN_TIMEOUT + RETRY_FIRST;
    s.closed(5, 1, ms(100) + OPEN_TIMEOUT);
    assert!(s.open_due(retry).is_some());
}

#[test]
fn a_closed_stream_hands_back_only_its_own_picks() {
    let mut s = open_at(ms(0));
    s.sent("a".into(), 10, 7, ms(200));
    s.sent("b".into(), 11, 7, ms(200));
    s.sent("c".into(), 12, 9, ms(200));
    let mut ended: Vec<_> = s
        .closed(7, 14, ms(50))
        .into_iter()
        .map(|(id, w)| (id, w.handle))
        .collect();
    ended.sort();
    assert_eq!(ended, vec![("a".into(), 10), ("b".into(), 11)]);
    assert_eq!(s.stream(), None);
    assert!(s.open_due(ms(50)).is_some());
    assert_eq!(s.answered("c").map(|w| w.handle), Some(12));
    assert!(s.answered("a").is_none());
}

#[test]
fn picks_past_their_deadline_expire_once_and_are_not_answered_after() {
    let mut s = open_at(ms(0));
    s.sent("early".into(), 1, 7, ms(100));
    s.sent("late".into(), 2, 7, ms(300));
    assert_eq!(s.next_tick(ms(10)), Some(PICK_TICK));
    assert!(s.expired(ms(99)).is_empty());
    let gone: Vec<_> = s.expired(ms(100)).into_iter().map(|(id, _)| id).collect();
    assert_eq!(gone, vec!["early".to_string()]);
    assert!(s.expired(ms(150)).is_empty());
    assert!(s.answered("early").is_none());
    assert_eq!(s.forget("late"), Some(7));
    assert_eq!(s.forget("late"), None);
    assert_eq!(
        s.next_tick(ms(150)),
        None,
        "an idle open stream needs no tick"
    );
}

#[test]
fn an_old_stream_is_half_closed_and_replaced_and_still_answers() {
    let mut s = open_at(ms(0));
    s.sent("a".into(), 1, 7, AGE + ms(500));
    assert!(s.rotate_due(AGE - ms(1)).is_empty());
    assert_eq!(s.rotate_due(AGE), vec![7]);
    assert_eq!(s.stream(), None, "unary until the next one opens");
    assert!(s.open_due(AGE).is_some());
    s.opening(0, 8, AGE);
    s.established(8, AGE);
    assert_eq!(s.stream(), Some(8));
    // The old stream's answer still finds its pick.
    assert_eq!(s.answered("a").map(|w| w.token), Some(7));
    // Its end does not disturb the new stream.
    assert!(s.closed(7, 0, AGE + ms(1)).is_empty());
    assert_eq!(s.stream(), Some(8));
}

#[test]
fn a_pick_message_decodes_as_the_stream_request_prost_would_build() {
    let pick = PickRequest {
        request_id: "p-1".into(),
        model: "m".into(),
        tenant: "t".into(),
        max_tokens: Some(9),
        ..Default::default()
    };
    for timeout_ms in [0, 200] {
        let bytes = pick_message(&pick, timeout_ms);
        let built = PickStreamRequest {
            kind: Some(Kind::Pick(pick.clone())),
            timeout_ms,
        };
        assert_eq!(bytes, built.encode_to_vec());
        assert_eq!(PickStreamRequest::decode(bytes.as_slice()).unwrap(), built);
    }
}

#[test]
fn picks_take_the_open_streams_in_turn_and_survive_one_closing() {
    let mut s = PickStreams::<u32>::new(3, AGE);
    assert_eq!(s.stream(), None);
    for (slot, token) in [(0, 10), (1, 11), (2, 12)] {
        assert_eq!(s.open_due(ms(0)), Some(slot));
        s.opening(slot, token, ms(0));
    }
    assert_eq!(s.open_due(ms(0)), None);
    s.established(11, ms(1));
    assert_eq!(s.stream(), Some(11), "the one open stream takes every pick");
    assert_eq!(s.stream(), Some(11));
    s.established(10, ms(1));
    s.established(12, ms(1));
    let turns: Vec<_> = (0..6).filter_map(|_| s.stream()).collect();
    assert_eq!(turns, [12, 10, 11, 12, 10, 11]);
    // One replica goes away: its stream's slot reopens, the others carry on.
    s.closed(10, 14, ms(2));
    assert_eq!(s.open_due(ms(2)), Some(0));
    let turns: Vec<_> = (0..4).filter_map(|_| s.stream()).collect();
    assert_eq!(turns, [12, 11, 12, 11]);
    // Both due at once: one is replaced while the other takes the picks.
    assert_eq!(s.rotate_due(AGE + ms(1)), vec![11]);
    assert_eq!(s.stream(), Some(12));
    assert_eq!(
        s.rotate_due(AGE + ms(2)),
        Vec::<u32>::new(),
        "12 is the last open"
    );
    assert_eq!(s.open_due(AGE + ms(2)), Some(0));
    s.opening(0, 20, AGE + ms(2));
    assert_eq!(
        s.rotate_due(AGE + ms(3)),
        Vec::<u32>::new(),
        "20 not open yet"
    );
    s.established(20, AGE + ms(3));
    assert_eq!(s.rotate_due(AGE + ms(4)), vec![12]);
    assert_eq!(s.stream(), Some(20));
    assert_eq!(s.stream(), Some(20), "the successor alone until 12's opens");
}
