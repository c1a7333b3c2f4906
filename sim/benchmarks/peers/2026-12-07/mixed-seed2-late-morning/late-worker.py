#!/usr/bin/env python3
"""Mixed traffic at 150 rpm: does the worker that ends last get the most prefill?

For every run's records (`--records` of scripts/bench-peers.sh) of the mixed workload at
150 rpm: the spread of prefill (uncached prompt tokens summed per worker, max - min over
the mean), how long after the second-to-last worker the last one served its last request,
the throughput (requests over the last end, per minute), whether the last worker is
the one with the most prefill, and the workers of the run's last two agent turns.

usage: late-worker.py RECORD_DIR...
"""
import glob
import json
import os
import sys


def main(dirs):
    if not dirs:
        sys.exit(__doc__)
    for d in dirs:
        for path in sorted(glob.glob(os.path.join(d, "mixed-*-150rpm*.jsonl"))):
            records = [json.loads(line) for line in open(path)]
            prefill, end = {}, {}
            for r in records:
                w = r["worker"]
                prefill[w] = prefill.get(w, 0) + r["prompt_tokens"] - r["cached_tokens"]
                end[w] = max(end.get(w, 0), r["arrival_s"] + r["e2e_s"])
            mean = sum(prefill.values()) / len(prefill)
            spread = 100 * (max(prefill.values()) - min(prefill.values())) / mean
            ends = sorted(end.values())
            late_by = ends[-1] - ends[-2]
            throughput = 60 * len(records) / ends[-1]
            last = max(end, key=end.get)
            most = last == max(prefill, key=prefill.get)
            agents = sorted((r for r in records if r["tenant"] == "agent"), key=lambda r: r["arrival_s"])
            last_agents = [r["worker"] for r in agents[-2:]]
            policy = "kvsteer" if "-kvsteer-" in path else "sglang"
            print(f"{policy:8s} spread {spread:5.1f} %  last ends {late_by:5.1f} s after the next"
                  f"  {throughput:5.1f} rpm  last has the most prefill: {most!s:5}  last worker"
                  f" {last}, last two agent turns on {last_agents}  {os.path.normpath(path)}")


if __name__ == "__main__":
    main(sys.argv[1:])
