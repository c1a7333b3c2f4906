#!/usr/bin/env python3
"""The table of scripts/bench-guidellm.sh: GuideLLM's own figures per target
and rate (from its JSON reports, DIR/<target>-<rpm>.json) beside the virtual
twin's (DIR/virtual-twin.json, kvsteer-bench), and DIR/summary.json.

    guidellm-table.py DIR RATES SLO_TTFT_MS
"""

import json
import sys
from pathlib import Path

TARGETS = [("kvsteer", "kvsteer"), ("round_robin", "round_robin")]


def guidellm_row(path: Path, slo_ms: float) -> dict:
    bench = json.loads(path.read_text())["benchmarks"][0]
    m = bench["metrics"]
    ttft = m["time_to_first_token_ms"]["successful"]
    pct = ttft["percentiles"]
    done = bench["requests"]["successful"]
    prompt = sum(r.get("prompt_tokens") or 0 for r in done)
    cached = sum(r.get("cached_tokens") or 0 for r in done)
    # Completed requests per minute over the span from the first request's
    # start to the last one's end (GuideLLM's own rate is a mean of rates).
    starts = [r["info"]["timings"]["request_start"] for r in done]
    ends = [r["info"]["timings"]["request_end"] for r in done]
    span = max(ends) - min(starts) if done else 0.0
    within = sum(1 for r in done if (r.get("time_to_first_token_ms") or 0) <= slo_ms)
    totals = m["request_totals"]
    return {
        "requests": totals["total"],
        "completed": totals["successful"],
        "errored": totals["errored"],
        "ttft_p50_s": pct["p50"] / 1000,
        "ttft_p90_s": pct["p90"] / 1000,
        "ttft_p99_s": pct["p99"] / 1000,
        "throughput_rpm": 60 * len(done) / span if span > 0 else 0.0,
        "cache_hit_rate": cached / prompt if prompt else 0.0,
        # Completed requests with TTFT within the objective (the virtual
        # twin's measure).
        "slo_attainment": within / len(done) if done else 0.0,
        "guidellm_slo_attainment": m.get("slo_attainment"),
    }


def main() -> None:
    out, rates, slo_ms = Path(sys.argv[1]), sys.argv[2].split(","), float(sys.argv[3])
    twin = json.loads((out / "virtual-twin.json").read_text())["runs"]
    summary = []
    print(f"GuideLLM 0.8.1, TTFT objective {slo_ms / 1000:g} s; virtual twin: kvsteer-bench, same sizes")
    print()
    print("| rpm | target | run | requests | TTFT p50 s | p90 s | p99 s | within SLO | cached share | served rpm |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for rpm in rates:
        for name, policy in TARGETS:
            path = out / f"{name}-{rpm}.json"
            live = guidellm_row(path, slo_ms) if path.exists() else None
            virtual = next(
                (r for r in twin if r["policy"] == policy and abs(r["rate_per_min"] - float(rpm)) < 1e-9),
                None,
            )
            summary.append({"rate_per_min": float(rpm), "target": name, "guidellm": live, "virtual": virtual})
            if live:
                print(
                    f"| {rpm} | {name} | GuideLLM, live | {live['completed']}/{live['requests']} | "
                    f"{live['ttft_p50_s']:.3f} | {live['ttft_p90_s']:.3f} | {live['ttft_p99_s']:.3f} | "
                    f"{100 * live['slo_attainment']:.1f} % | {100 * live['cache_hit_rate']:.1f} % | "
                    f"{live['throughput_rpm']:.1f} |"
                )
            if virtual:
                print(
                    f"| {rpm} | {name} | virtual twin | {virtual['completed']}/{virtual['requests']} | "
                    f"{virtual['ttft_p50_s']:.3f} | {virtual['ttft_p90_s']:.3f} | {virtual['ttft_p99_s']:.3f} | "
                    f"{100 * virtual['slo_attainment']:.1f} % | "
                    f"{100 * virtual['cache_hit_rate']:.1f} % | {60 * virtual['throughput_rps']:.1f} |"
                )
    (out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")


if __name__ == "__main__":
    main()
