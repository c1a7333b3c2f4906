#!/usr/bin/env python3
"""Shared prefix past capacity: how often each run moved a group, and what that did.

For every run's records (`--records` of scripts/bench-peers.sh or kvsteer-bench) at one
rate: TTFT p50 / p90, the moves (a request of a group sent to a worker that group had
not been sent to before in the run, after its first worker), prefix misses, the hit
rate, and per worker the requests and their TTFT p50 / p90.

usage: moves.py [--rate RPM] RECORD_DIR...   (default rate 240)
"""
import glob
import json
import os
import sys


def quantile(values, p):
    values = sorted(values)
    return values[min(len(values) - 1, int(p * len(values)))] if values else float("nan")


def run_stats(path):
    records = [json.loads(line) for line in open(path)]
    records.sort(key=lambda r: r["arrival_s"])
    workers = sorted({r["worker"] for r in records})
    seen, moves = {}, 0
    for r in records:
        on = seen.setdefault(r["group"], set())
        if r["worker"] not in on:
            on.add(r["worker"])
            moves += len(on) > 1
    # A request whose group prefix was not cached (the prefix is 4,000 of 5,508 tokens).
    misses = sum(1 for r in records if r["cached_tokens"] < 0.7 * r["prompt_tokens"])
    ttft = [r["ttft_s"] for r in records]
    hits = 100 * sum(r["cached_tokens"] for r in records) / sum(r["prompt_tokens"] for r in records)
    per_worker = []
    for w in workers:
        t = [r["ttft_s"] for r in records if r["worker"] == w]
        per_worker.append(f"{len(t)}: {quantile(t, .5):.2f}/{quantile(t, .9):.1f}")
    return (f"p50 {quantile(ttft, .5):5.2f}  p90 {quantile(ttft, .9):5.1f}  moves {moves:2d}"
            f"  misses {misses:2d}  hits {hits:4.1f}  per worker (n: p50/p90) {'  '.join(per_worker)}")


def main(argv):
    rate = "240"
    if len(argv) > 1 and argv[0] == "--rate":
        rate, argv = argv[1], argv[2:]
    if not argv:
        sys.exit(__doc__)
    for d in argv:
        print(os.path.normpath(d))
        for path in sorted(glob.glob(os.path.join(d, f"*-{rate}rpm*.jsonl"))):
            name = os.path.basename(path).removeprefix("shared-prefix-").removesuffix(".jsonl")
            print(f"  {name:34s} {run_stats(path)}")


if __name__ == "__main__":
    main(sys.argv[1:])
