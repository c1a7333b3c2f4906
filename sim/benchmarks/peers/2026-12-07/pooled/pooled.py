#!/usr/bin/env python3
"""Issue 19's workload targets over every side-by-side run, not one invocation's three.

Reads the `--records` folders of scripts/bench-peers.sh runs (one JSON line per request)
and, for each workload, seed and rate, compares kvsteer's runs with SGLang `cache_aware`'s
runs of the same seed: the median over runs of TTFT p50 and p90, hit rate (cached over
prompt tokens) and throughput (requests over the last finish, per minute), and how often
an invocation's median of three met each target against the SGLang median of the same
invocation. A folder is one invocation; its seed comes from its name (`seedN`).

Only invocations with both routers side by side count; a folder's seed must be in its
name, so multi-turn folders (no seed in the name) are left out.

usage: pooled.py RECORD_DIR...   (each DIR a `records` folder)
"""
import glob
import json
import math
import os
import re
import statistics as st
import sys

TARGETS = ("p50", "p90", "hits", "tput")


def quantile(values, q):
    """Nearest rank, as the bench's summaries (`bench/src/summary.rs`)."""
    v = sorted(values)
    rank = math.ceil(q * len(v))
    return v[min(max(rank, 1), len(v)) - 1]


def run_figures(path):
    rs = [json.loads(line) for line in open(path)]
    ttft = [r["ttft_s"] for r in rs if not r.get("rejected")]
    end = max(r["arrival_s"] + r["e2e_s"] for r in rs)
    prompt = sum(r["prompt_tokens"] for r in rs)
    return {
        "p50": quantile(ttft, 0.5),
        "p90": quantile(ttft, 0.9),
        "hits": 100 * sum(r["cached_tokens"] for r in rs) / prompt,
        "tput": 60 * len(rs) / end,
    }


def median_of(runs):
    return {k: st.median(r[k] for r in runs) for k in TARGETS}


def met(kv, sg):
    """Which within-5 % / hit-rate / throughput targets an invocation's medians meet."""
    return {
        "p50": kv["p50"] <= 1.05 * sg["p50"],
        "p90": kv["p90"] <= 1.05 * sg["p90"],
        "hits": kv["hits"] >= sg["hits"] - 2.0,
        "tput": kv["tput"] >= 0.95 * sg["tput"],
    }


def invocations(dirs):
    """Per side-by-side invocation and point: (workload, seed, rate, {policy: [run figures]}),
    from `records` folders whose parent folder's name holds the seed (`seedN`)."""
    for d in dirs:
        name = os.path.basename(os.path.dirname(os.path.normpath(d)))
        seed = re.search(r"seed(\d)", name)
        if not seed:
            continue
        by = {}
        for path in sorted(glob.glob(os.path.join(d, "*.jsonl"))):
            m = re.match(r"(mixed|shared-prefix)-(kvsteer|sglang_cache_aware)-(\d+)rpm", os.path.basename(path))
            if not m:
                continue
            workload, policy, rate = m.group(1), m.group(2), int(m.group(3))
            by.setdefault((workload, rate), {}).setdefault(policy, []).append(run_figures(path))
        for (workload, rate), pol in by.items():
            if "kvsteer" in pol and "sglang_cache_aware" in pol:  # not a kvsteer-only A/B, say
                yield workload, int(seed.group(1)), rate, pol


def main(dirs):
    if not dirs:
        sys.exit(__doc__)
    points = {}  # (workload, seed, rate) -> {"kv": [...], "sg": [...], "inv": [(kv, sg), ...]}
    for workload, seed, rate, pol in invocations(dirs):
        p = points.setdefault((workload, seed, rate), {"kv": [], "sg": [], "inv": []})
        p["kv"] += pol["kvsteer"]
        p["sg"] += pol["sglang_cache_aware"]
        p["inv"].append((median_of(pol["kvsteer"]), median_of(pol["sglang_cache_aware"])))
    print("workload       seed  rpm  runs kv/sg   p50 kv/sg (s)      p90 kv/sg (s)      hits kv/sg (%)   "
          "tput kv/sg (rpm)   p90 ratio  invocations meeting p50 / p90 / hits / tput")
    for (workload, seed, rate), p in sorted(points.items()):
        kv, sg = median_of(p["kv"]), median_of(p["sg"])
        counts = [sum(met(a, b)[t] for a, b in p["inv"]) for t in TARGETS]
        n = len(p["inv"])
        print(f"{workload:14s} {seed:4d} {rate:4d} {len(p['kv']):5d}/{len(p['sg']):<3d}"
              f"  {kv['p50']:6.2f}/{sg['p50']:<6.2f} {100 * (kv['p50'] / sg['p50'] - 1):+6.1f} %"
              f"  {kv['p90']:6.2f}/{sg['p90']:<6.2f} {100 * (kv['p90'] / sg['p90'] - 1):+6.1f} %"
              f"  {kv['hits']:5.1f}/{sg['hits']:<5.1f} {kv['hits'] - sg['hits']:+5.1f}"
              f"  {kv['tput']:5.1f}/{sg['tput']:<5.1f} {100 * (kv['tput'] / sg['tput'] - 1):+5.1f} %"
              f"  {sg['p90'] / kv['p90']:5.2f}x"
              f"  {' / '.join(f'{c}/{n}' for c in counts)}")


if __name__ == "__main__":
    main(sys.argv[1:])
