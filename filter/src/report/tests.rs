use super::*;
use proptest::prelude::*;

fn picked() -> ReportTracker {
    let mut t = ReportTracker::default();
    t.pick_sent();
    assert_eq!(t.pick_answered(PickEnd::Steered), None);
    t
}

fn stream_output(at_ms: f64) -> FirstOutput {
    FirstOutput {
        at_ms,
        measured: true,
        alone: true,
    }
}

#[test]
fn requests_without_a_pick_report_nothing() {
    let mut t = ReportTracker::default();
    assert!(!t.wants_response());
    t.response_bytes(1.0);
    t.output(stream_output(1.0));
    assert_eq!(t.flush_first_token(), None);
    assert_eq!(t.end(2.0), None);
    assert_eq!(t.close(3.0), None);
    assert_eq!(t.pick_answered(PickEnd::Abandoned), None);
    assert_eq!(t.state(), ReportState::Idle);
}

#[test]
fn a_stream_reports_first_token_then_done() {
    let mut t = picked();
    t.response_bytes(5.0);
    assert_eq!(t.flush_first_token(), None, "a role-only chunk is no token");
    t.output(stream_output(40.0));
    t.output(stream_output(50.0));
    let first = t.flush_first_token().expect("first token");
    assert_eq!(first.kind, ReportKind::FirstToken);
    assert_eq!(first.elapsed_ms, 40.0);
    assert!(first.ttft_measured);
    assert_eq!(t.flush_first_token(), None);
    let done = t.end(90.0).expect("done");
    assert_eq!(done.kind, ReportKind::Done);
    assert_eq!(done.elapsed_ms, 90.0);
    assert_eq!(done.first_token_ms, Some(40.0), "repeated");
    assert!(done.ttft_measured);
    assert_eq!(t.end(91.0), None);
    assert_eq!(t.close(92.0), None, "closing after done is no cancel");
    assert_eq!(t.state(), ReportState::Finished);
}

#[test]
fn output_and_end_in_one_chunk_make_one_done() {
    let mut t = picked();
    t.response_bytes(30.0);
    t.output(stream_output(30.0));
    let done = t.end(30.0).expect("done");
    assert_eq!(done.kind, ReportKind::Done);
    assert_eq!(done.first_token_ms, Some(30.0));
    assert!(done.ttft_measured);
    assert_eq!(
        t.flush_first_token(),
        None,
        "never after the terminal report"
    );
}

#[test]
fn a_whole_response_carries_its_first_bytes_with_done_unmeasured() {
    let mut t = picked();
    t.response_bytes(70.0);
    t.output(FirstOutput {
        at_ms: 70.0,
        measured: false,
        alone: false,
    });
    assert_eq!(t.flush_first_token(), None, "whole bodies wait for the end");
    t.response_bytes(75.0);
    let done = t.end(80.0).expect("done");
    assert_eq!(done.first_token_ms, Some(70.0));
    assert!(!done.ttft_measured);

    let mut no_output = picked();
    no_output.response_bytes(12.0);
    let done = no_output.end(20.0).expect("done");
    assert_eq!(done.first_token_ms, Some(12.0), "first bytes stand in");
    assert!(!done.ttft_measured);

    let mut bodiless = picked();
    let done = bodiless.end(9.0).expect("done");
    assert_eq!(done.first_token_ms, Some(9.0));
}

#[test]
fn a_pick_outstanding_when_the_stream_goes_is_cancelled() {
    let mut t = ReportTracker::default();
    t.pick_sent();
    assert!(t.is_pending());
    assert!(!t.wants_response());
    let cancel = t.close(0.0).expect("cancel");
    assert_eq!(cancel.kind, ReportKind::Cancelled);
    assert_eq!(t.close(0.0), None);
    assert_eq!(t.pick_answered(PickEnd::Steered), None, "too late");
    assert_eq!(t.state(), ReportState::Finished);
}

#[test]
fn pick_answers_decide_what_is_owed() {
    let mut abandoned = ReportTracker::default();
    abandoned.pick_sent();
    let cancel = abandoned.pick_answered(PickEnd::Abandoned).expect("cancel");
    assert_eq!(cancel.kind, ReportKind::Cancelled);
    assert_eq!(abandoned.close(1.0), None);

    let mut unchosen = ReportTracker::default();
    unchosen.pick_sent();
    assert_eq!(unchosen.pick_answered(PickEnd::Unchosen), None);
    assert_eq!(unchosen.end(1.0), None);
    assert_eq!(unchosen.close(1.0), None);
}

#[test]
fn early_close_is_cancelled_once() {
    let mut before_token = picked();
    assert_eq!(
        before_token.close(3.0).map(|r| r.kind),
        Some(ReportKind::Cancelled)
    );
    assert_eq!(before_token.close(4.0), None);
    assert_eq!(before_token.end(5.0), None);

    let mut after_token = picked();
    after_token.output(stream_output(1.0));
    after_token.flush_first_token().expect("first token");
    let cancel = after_token.close(2.0).expect("cancel");
    assert_eq!(cancel.kind, ReportKind::Cancelled);
    assert_eq!(cancel.first_token_ms, Some(1.0), "repeated");
    assert!(cancel.ttft_measured);
    assert_eq!(after_token.end(3.0), None);

    // Bytes without output: no first token to tell.
    let mut bytes_only = picked();
    bytes_only.response_bytes(1.0);
    let cancel = bytes_only.close(2.0).expect("cancel");
    assert_eq!(cancel.first_token_ms, None);
    assert!(!cancel.ttft_measured);
}

#[test]
fn report_fields() {
    let facts = ResponseFacts {
        upstream: "127.0.0.1:8001".into(),
        status: 200,
    };
    let usage = Usage {
        prompt_tokens: 3,
        completion_tokens: 2,
        cached_tokens: 1,
    };
    let done = Report {
        kind: ReportKind::Done,
        elapsed_ms: 12.5,
        first_token_ms: Some(4.0),
        ttft_measured: true,
    };
    let wire = report_request("p-1", &done, &facts, Some(usage));
    assert_eq!(wire.request_id, "p-1");
    assert_eq!(wire.kind, ReportKind::Done as i32);
    assert_eq!(wire.usage, Some(usage));
    assert_eq!(wire.upstream, "127.0.0.1:8001");
    assert_eq!(wire.elapsed_ms, 12.5);
    assert_eq!(wire.status, 200);
    assert_eq!(wire.first_token_ms, Some(4.0));
    assert!(wire.ttft_measured);

    let first = Report {
        kind: ReportKind::FirstToken,
        elapsed_ms: -1.0,
        first_token_ms: Some(3.0),
        ttft_measured: true,
    };
    let wire = report_request("p-1", &first, &facts, Some(usage));
    assert_eq!(wire.usage, None);
    assert_eq!(wire.elapsed_ms, 0.0);
    assert_eq!(wire.first_token_ms, None, "terminal reports only");
    assert!(wire.ttft_measured);

    let cancel = Report {
        kind: ReportKind::Cancelled,
        elapsed_ms: f64::NAN,
        first_token_ms: Some(1.0),
        ttft_measured: true,
    };
    let wire = report_request("p-1", &cancel, &facts, None);
    assert_eq!(wire.elapsed_ms, 0.0);
    assert_eq!(wire.first_token_ms, Some(1.0));
    assert!(wire.ttft_measured);
    let wire = report_request(
        "p-1",
        &Report {
            first_token_ms: None,
            ..cancel
        },
        &facts,
        None,
    );
    assert_eq!(wire.first_token_ms, None);
    assert!(!wire.ttft_measured, "nothing measured to vouch for");
}

// === properties ===

#[derive(Clone, Copy, Debug)]
enum Event {
    PickSent,
    Answered(PickEnd),
    Bytes,
    Output { measured: bool, alone: bool },
    Flush,
    End,
    Close,
}

fn event() -> impl Strategy<Value = Event> {
    prop_oneof![
        Just(Event::PickSent),
        prop_oneof![
            Just(PickEnd::Steered),
            Just(PickEnd::Unchosen),
            Just(PickEnd::Abandoned)
        ]
        .prop_map(Event::Answered),
        Just(Event::Bytes),
        (any::<bool>(), any::<bool>())
            .prop_map(|(measured, alone)| Event::Output { measured, alone }),
        Just(Event::Flush),
        Just(Event::End),
        Just(Event::Close),
    ]
}

/// Runs `events` (the i-th at time i ms) and returns every report.
fn run(t: &mut ReportTracker, events: &[Event]) -> Vec<Report> {
    let mut out = Vec::new();
    for (i, e) in events.iter().enumerate() {
        let at_ms = i as f64;
        let report = match *e {
            Event::PickSent => {
                t.pick_sent();
                None
            }
            Event::Answered(end) => t.pick_answered(end),
            Event::Bytes => {
                t.response_bytes(at_ms);
                None
            }
            Event::Output { measured, alone } => {
                t.output(FirstOutput {
                    at_ms,
                    measured,
                    alone,
                });
                None
            }
            Event::Flush => t.flush_first_token(),
            Event::End => t.end(at_ms),
            Event::Close => t.close(at_ms),
        };
        out.extend(report);
    }
    out
}

fn is_terminal(r: &Report) -> bool {
    matches!(r.kind, ReportKind::Done | ReportKind::Cancelled)
}

proptest! {
    #[test]
    fn at_most_one_terminal_and_no_first_token_after_it(
        events in prop::collection::vec(event(), 0..24),
    ) {
        let reports = run(&mut ReportTracker::default(), &events);
        prop_assert!(reports.iter().filter(|r| is_terminal(r)).count() <= 1);
        prop_assert!(reports.iter().filter(|r| r.kind == ReportKind::FirstToken).count() <= 1);
        if let Some(end) = reports.iter().position(is_terminal) {
            prop_assert_eq!(end, reports.len() - 1, "nothing after the terminal report");
        }
        // One first token per request: a terminal report after a
        // FIRST_TOKEN repeats it.
        let alone = reports.iter().find(|r| r.kind == ReportKind::FirstToken);
        let end = reports.iter().find(|r| is_terminal(r));
        if let (Some(first), Some(end)) = (alone, end) {
            prop_assert_eq!(end.first_token_ms, Some(first.elapsed_ms));
            prop_assert_eq!(end.ttft_measured, first.ttft_measured);
        }
        if let Some(done) = reports.iter().find(|r| r.kind == ReportKind::Done) {
            prop_assert!(done.first_token_ms.is_some());
        }
        // A FIRST_TOKEN carries its time as elapsed_ms only.
        prop_assert!(reports.iter().all(|r| r.first_token_ms.is_none() || is_terminal(r)));
    }

    #[test]
    fn a_picked_or_pending_request_that_ends_gets_exactly_one_terminal(
        events in prop::collection::vec(event(), 0..24),
        ending in prop_oneof![Just(Event::End), Just(Event::Close)],
    ) {
        let mut t = ReportTracker::default();
        let mut reports = run(&mut t, &events);
        let owed = matches!(
            t.state(),
            ReportState::Pending | ReportState::Picked | ReportState::FirstTokenSent
        );
        let already = reports.iter().any(is_terminal);
        // The host always closes the stream last (on_log / on_done).
        reports.extend(run(&mut t, &[ending, Event::Close]));
        let terminals = reports.iter().filter(|r| is_terminal(r)).count();
        if owed || already {
            prop_assert_eq!(terminals, 1);
        } else {
            prop_assert_eq!(terminals, 0);
        }
        prop_assert!(matches!(
            t.state(),
            ReportState::Finished | ReportState::Idle | ReportState::Unchosen
        ));
    }

    #[test]
    fn a_sent_pick_always_ends_in_one_terminal_or_an_unchosen_answer(
        events in prop::collection::vec(event(), 0..24),
    ) {
        let mut t = ReportTracker::default();
        let mut all = vec![Event::PickSent];
        all.extend(events);
        all.push(Event::Close);
        let reports = run(&mut t, &all);
        let terminals = reports.iter().filter(|r| is_terminal(r)).count();
        let unchosen_first = all.iter().find_map(|e| match e {
            Event::Answered(end) => Some(*end),
            // A response cannot end while the pick is outstanding; a close can.
            Event::Close => Some(PickEnd::Abandoned),
            _ => None,
        }) == Some(PickEnd::Unchosen);
        prop_assert_eq!(terminals, usize::from(!unchosen_first));
    }
}
