#!/usr/bin/env python3
"""Each router against itself: how often one invocation's medians of three miss issue 19's
"within 5 %" targets against another invocation of the same router, seed and rate.

Reads the same `--records` folders as ../pooled/pooled.py (one folder per invocation, its
seed in its name; as there, only invocations with both routers side by side count) and,
for each router and point with at least two invocations of three runs or more, compares
every ordered pair of invocations (A against B) with pooled.py's test of a target
(p50 and p90 at most 5 % above, hits at most 2 points below, throughput at most 5 % below).
A router whose invocations differ only by the draw meets its own figures in every pair;
the share of pairs that miss is the floor a one-invocation verdict stands on.

usage: itself.py RECORD_DIR...
"""
import itertools
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "pooled"))
from pooled import TARGETS, invocations, median_of, met  # noqa: E402

ROUTERS = {"kvsteer": "kvsteer", "sglang_cache_aware": "SGLang"}


def main(dirs):
    if not dirs:
        sys.exit(__doc__)
    inv = {}  # (router, workload, seed, rate) -> [medians of one invocation, ...]
    for workload, seed, rate, pol in invocations(dirs):
        for router, runs in pol.items():
            if len(runs) >= 3:
                inv.setdefault((router, workload, seed, rate), []).append(median_of(runs))
    print("router   workload       seed  rpm  invocations  pairs  pairs missing p50 / p90 / hits / tput"
          "   invocation medians p50 (s) | p90 (s) | tput (rpm)")
    for (router, workload, seed, rate), meds in sorted(inv.items()):
        if len(meds) < 2:
            continue
        pairs = list(itertools.permutations(meds, 2))
        miss = [sum(not met(a, b)[t] for a, b in pairs) for t in TARGETS]
        span = " | ".join(
            f"{min(m[k] for m in meds):.2f}-{max(m[k] for m in meds):.2f}" for k in ("p50", "p90", "tput")
        )
        print(f"{ROUTERS[router]:8s} {workload:14s} {seed:4d} {rate:4d} {len(meds):8d} {len(pairs):8d}"
              f"   {' / '.join(f'{c:2d}' for c in miss)}                 {span}")


if __name__ == "__main__":
    main(sys.argv[1:])
