#!/usr/bin/env python3
"""Mixed traffic: when a chat group moves to another worker, and where the groups end up.

For every run's records (`--records` of scripts/bench-peers.sh) of the mixed workload at
one rate: each chat request whose group's previous request went to another worker is a
move; the gap is the time since that previous request. Per run: moves, groups served by
more than one worker, each worker's groups (the worker serving most of a group's requests),
agent turns and requests per worker, and how long after the next one the last worker
served its last request. Then every move and every stay (same worker as the group's
previous request) by gap, with the share of stays that found no cached token.

usage: group-moves.py [--rate R] RECORD_DIR...   (R: 150 by default)
"""
import glob
import json
import os
import sys
from collections import Counter


def main(args):
    rate = 150
    if args[:1] == ["--rate"]:
        rate, args = int(args[1]), args[2:]
    if not args:
        sys.exit(__doc__)
    gaps = {p: {k: Counter() for k in ("move", "stay", "stay_cold")} for p in ("kvsteer", "sglang")}
    for d in args:
        for path in sorted(glob.glob(os.path.join(d, f"mixed-*-{rate}rpm*.jsonl"))):
            policy = "kvsteer" if "-kvsteer-" in path else "sglang"
            rs = sorted((json.loads(line) for line in open(path)), key=lambda r: r["arrival_s"])
            last_at, last_on, per_group = {}, {}, {}
            moves = 0
            for r in rs:
                g = r["group"]
                if g is None:
                    continue
                per_group.setdefault(g, Counter())[r["worker"]] += 1
                if g in last_on:
                    bucket = min(int((r["arrival_s"] - last_at[g]) // 20) * 20, 60)
                    if r["worker"] != last_on[g]:
                        moves += 1
                        gaps[policy]["move"][bucket] += 1
                    else:
                        gaps[policy]["stay"][bucket] += 1
                        if r["cached_tokens"] == 0:
                            gaps[policy]["stay_cold"][bucket] += 1
                last_at[g], last_on[g] = r["arrival_s"], r["worker"]
            workers = sorted({r["worker"] for r in rs})
            homes = Counter(c.most_common(1)[0][0] for c in per_group.values())
            split = sum(1 for c in per_group.values() if len(c) > 1)
            agents = Counter(r["worker"] for r in rs if r["tenant"] == "agent")
            count = Counter(r["worker"] for r in rs)
            end = {}
            for r in rs:
                end[r["worker"]] = max(end.get(r["worker"], 0.0), r["arrival_s"] + r["e2e_s"])
            ends = sorted(end.values())
            last = max(end, key=end.get)
            print(f"{policy:8s} moves {moves:2d}  groups on 2+ workers {split:2d}"
                  f"  groups {[homes[w] for w in workers]}  agent turns {[agents[w] for w in workers]}"
                  f"  requests {[count[w] for w in workers]}  last worker {last} ends"
                  f" {ends[-1] - ends[-2]:4.1f} s after the next  {os.path.normpath(path)}")
    for policy, g in gaps.items():
        print(f"{policy}: a group's request after a gap of (s)  "
              + "  ".join(f"{b}-{b + 20 if b < 60 else ''}: {g['move'][b]} moved, {g['stay'][b]} stayed"
                          f" ({g['stay_cold'][b]} of them with no cached token)"
                          for b in (0, 20, 40, 60)))


if __name__ == "__main__":
    main(sys.argv[1:])
