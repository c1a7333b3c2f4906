//! The virtual-time benchmark end to end, on the fast `test` profile.

use clap::Parser;
use kvsteer_bench::cli::config_json;
use kvsteer_bench::{BenchArgs, report, run_virtual};

#[derive(Parser)]
struct Cli {
    #[command(flatten)]
    bench: BenchArgs,
}

fn args(extra: &[&str]) -> BenchArgs {
    let mut argv = vec![
        "bench",
        "--profile",
        "test",
        "--workers",
        "3",
        "--duration-s",
        "60",
        "--rates",
        "60,240",
        "--groups",
        "4",
        "--users-per-group",
        "3",
        "--prefix-tokens",
        "512",
        "--question-tokens",
        "64",
        "--output-tokens",
        "16",
        "--max-context-tokens",
        "1500",
        "--think-s",
        "1",
        "--jobs",
        "2",
    ];
    argv.extend_from_slice(extra);
    Cli::parse_from(argv).bench
}

fn json(extra: &[&str]) -> String {
    let resolved = args(extra).resolve().unwrap();
    let runs = run_virtual(&resolved, false);
    let dir = std::env::temp_dir().join(format!(
        "kvsteer-bench-{}-{}",
        std::process::id(),
        extra.join("_")
    ));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("out.json");
    report::write_json(&path, config_json(&resolved), &runs).unwrap();
    let text = std::fs::read_to_string(&path).unwrap();
    std::fs::remove_dir_all(&dir).ok();
    text
}

#[test]
fn same_seed_same_json_other_seed_differs() {
    let wl = ["--workload", "mixed", "--seed", "5"];
    let a = json(&wl);
    let b = json(&wl);
    assert_eq!(a, b);
    let c = json(&["--workload", "mixed", "--seed", "6"]);
    assert_ne!(a, c);
    let v: serde_json::Value = serde_json::from_str(&a).unwrap();
    let runs = v["runs"].as_array().unwrap();
    // 7 policies × 2 rates, in workload × rate × policy order.
    assert_eq!(runs.len(), 14);
    for key in [
        "workload",
        "policy",
        "rate_per_min",
        "requests",
        "ttft_p50_s",
        "ttft_p90_s",
        "ttft_p99_s",
        "e2e_p50_s",
        "throughput_rps",
        "goodput_rpm",
        "goodput_chat_rpm",
        "cache_hit_rate",
        "imbalance_cov",
    ] {
        assert!(runs.iter().all(|r| r.get(key).is_some()), "missing {key}");
    }
    assert_eq!(runs[0]["policy"], "random");
    assert_eq!(runs[7]["rate_per_min"], 240.0);
}

#[test]
fn the_service_baseline_is_seeded_and_loses_no_request() {
    let flags = [
        "--workload",
        "shared-prefix,multi-turn",
        "--policies",
        "k8s_service,random",
        "--seed",
        "3",
    ];
    assert_eq!(json(&flags), json(&flags));
    let runs = run_virtual(&args(&flags).resolve().unwrap(), false);
    assert_eq!(runs.len(), 2 * 2 * 2);
    for r in &runs {
        assert!(r.requests > 0, "{r:?}");
        assert_eq!(r.completed, r.requests, "{r:?}");
    }
    // Same arrivals, other placements: per connection, not per request.
    let placed = |p: &str| {
        runs.iter()
            .filter(|r| r.policy == p)
            .map(|r| r.requests_per_worker.clone())
            .collect::<Vec<_>>()
    };
    assert_ne!(placed("k8s_service"), placed("random"));
}

#[test]
fn every_request_finishes_and_events_reach_the_index() {
    let mut a = args(&["--workload", "shared-prefix,multi-turn,independent"]);
    a.rates = vec![60.0];
    let runs = run_virtual(&a.resolve().unwrap(), false);
    assert_eq!(runs.len(), 3 * 7);
    for r in &runs {
        assert!(r.requests > 0, "{r:?}");
        assert_eq!(r.completed + r.rejected, r.requests, "{r:?}");
        assert_eq!(r.rejected, 0, "{r:?}");
        assert_eq!(r.kv_event_errors, 0, "{r:?}");
        assert!(r.kv_event_batches > 0, "{r:?}");
    }
    let get = |w: &str, p: &str| {
        runs.iter()
            .find(|r| r.workload == w && r.policy == p && r.rate_per_min == 60.0)
            .unwrap()
    };
    // Cache-aware routing finds the shared prefixes through the KV events.
    assert!(get("shared-prefix", "kvsteer").cache_hit_rate > 0.7);
    assert!(
        get("shared-prefix", "kvsteer").cache_hit_rate
            > get("shared-prefix", "random").cache_hit_rate
    );
    assert!(get("multi-turn", "kvsteer").cache_hit_rate > 0.5);
    // Nothing to share beyond the odd block.
    assert!(get("independent", "kvsteer").cache_hit_rate < 0.05);
}

#[test]
fn bad_flags_are_named() {
    let err = args(&["--policies", "kvsteer,p2c"]).resolve().unwrap_err();
    assert!(err.to_string().contains("p2c"), "{err}");
    let mut a = args(&[]);
    a.profile = "h100".into();
    let err = a.resolve().unwrap_err();
    assert!(err.to_string().contains("h100"), "{err}");
    let err = args(&["--workload", "trace"]).resolve().unwrap_err();
    assert!(err.to_string().contains("--trace"), "{err}");
    let mut a = args(&[]);
    a.rates = vec![60.0, 0.0];
    assert!(a.resolve().is_err());
    let mut a = args(&[]);
    a.workers = 0;
    assert!(a.resolve().is_err());
    // Virtual time is deterministic: repeats are for live runs.
    let err = args(&["--repeats", "3"]).resolve().unwrap_err();
    assert!(err.to_string().contains("--live"), "{err}");
    let err = args(&["--repeats", "0"]).resolve().unwrap_err();
    assert!(err.to_string().contains("at least 1"), "{err}");
    let err = args(&["--before-run", "true"]).resolve().unwrap_err();
    assert!(err.to_string().contains("--live"), "{err}");
}

#[test]
fn a_scoring_file_reaches_the_indexer_policies() {
    let dir = std::env::temp_dir().join(format!("kvsteer-bench-scoring-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let good = dir.join("scoring.yaml");
    std::fs::write(&good, "scoring:\n  prefill_rate_prior: 500\n").unwrap();
    let bad = dir.join("bad.yaml");
    std::fs::write(&bad, "tie_ratio: 3\n").unwrap();
    let good_path = good.to_str().unwrap();
    let default = json(&["--policies", "kvsteer", "--workload", "shared-prefix"]);
    let slow = json(&[
        "--policies",
        "kvsteer",
        "--workload",
        "shared-prefix",
        "--scoring",
        good_path,
    ]);
    assert!(!default.contains("\"scoring\""));
    assert!(slow.contains("\"scoring\""));
    assert!(slow.contains("\"prefill_rate_prior\": 500"), "{slow}");
    // The prior moves the predictions, hence the reported prediction error.
    let error = |text: &str| -> Vec<f64> {
        let v: serde_json::Value = serde_json::from_str(text).unwrap();
        v["runs"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["prediction_error_p50_s"].as_f64().unwrap())
            .collect()
    };
    assert_ne!(error(&default), error(&slow));
    let err = args(&["--scoring", bad.to_str().unwrap()])
        .resolve()
        .unwrap_err();
    assert!(format!("{err:#}").contains("scoring.tie_ratio"), "{err:#}");
    let err = args(&["--scoring", "/nowhere/scoring.yaml"])
        .resolve()
        .unwrap_err();
    assert!(err.to_string().contains("/nowhere/scoring.yaml"), "{err}");
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn a_replayed_placement_reproduces_its_run_and_the_search_keeps_only_gains() {
    use kvsteer_bench::driver::RequestKey;
    use kvsteer_bench::policy::BenchPolicy;
    use kvsteer_bench::search::{Measured, Score, placement_of, search};
    use kvsteer_bench::workload::WorkloadKind;
    use std::sync::Arc;

    let mut a = args(&["--workload", "mixed", "--search-runs", "12"]);
    a.rates = vec![240.0];
    let resolved = a.resolve().unwrap();
    let plan = resolved.plan(WorkloadKind::Mixed, 240.0);
    let kvsteer = kvsteer_bench::run(&plan, &resolved.run_config("kvsteer".parse().unwrap()));
    assert!(!kvsteer.records.is_empty());
    assert_eq!(kvsteer.keys.len(), kvsteer.records.len());
    // The same worker for every planned request gives the same run, session
    // turns included (they are keyed by session and turn, not by id).
    let mut replay_cfg = resolved.run_config(BenchPolicy::Search);
    replay_cfg.placement = Some(Arc::new(placement_of(&kvsteer)));
    let replay = kvsteer_bench::run(&plan, &replay_cfg);
    let fates = |o: &kvsteer_bench::RunOutput| {
        o.records
            .iter()
            .map(|r| (r.worker, r.first_token_at, r.finished_at, r.cached_tokens))
            .collect::<Vec<_>>()
    };
    assert_eq!(fates(&replay), fates(&kvsteer));
    assert_eq!(replay.keys, kvsteer.keys);
    // Another placement is another run.
    let mut moved = placement_of(&kvsteer);
    for w in moved.values_mut() {
        *w = 0;
    }
    replay_cfg.placement = Some(Arc::new(moved));
    let one_worker = kvsteer_bench::run(&plan, &replay_cfg);
    assert!(one_worker.records.iter().all(|r| r.worker == 0));

    let sglang = kvsteer_bench::run(&plan, &resolved.run_config(BenchPolicy::SglangLike));
    let peer = Measured::of(&sglang, 3).unwrap();
    let found = search(&plan, &resolved.run_config(BenchPolicy::Search));
    assert_eq!(found.runs, 12);
    assert_eq!(found.peer, Some(peer));
    let starts = [
        Score::of(&kvsteer, 3, Some(&peer)).unwrap(),
        Score::of(&sglang, 3, Some(&peer)).unwrap(),
    ];
    assert_eq!(starts[1].misses, 0, "the peer meets its own targets");
    let start = found.start_score.unwrap();
    assert!(starts.contains(&start));
    let score = found.score.unwrap();
    // Never worse than the start: fewer misses, or as many and p90 no higher.
    assert!(score.misses <= start.misses);
    assert!(score.misses < start.misses || score.run.p90_s <= start.run.p90_s);
    assert_eq!(Score::of(&found.output, 3, Some(&peer)), found.score);
    // Every planned arrival and session is served (later turns may come or
    // not, as the placement moves their timing).
    let planned = |o: &kvsteer_bench::RunOutput| {
        o.keys
            .iter()
            .filter(|k| matches!(k, RequestKey::Arrival(_) | RequestKey::Turn { turn: 0, .. }))
            .count()
    };
    assert_eq!(planned(&found.output), plan.arrivals.len());
    assert_eq!(planned(&kvsteer), plan.arrivals.len());
    assert!(found.output.records.iter().all(|r| r.finished_at.is_some()));
}
