"""Per worker, in each recorded run at one rate: requests, groups, TTFT p90 (s), prefix-cache
hit rate (cached over prompt tokens) and the requests that found their whole prompt cached
(all but its last block, which vLLM never caches: a user asking again). usage: python3 per-worker.py [RATE]
[RECORD_DIR...]   (default 180, and the records/ beside this script)"""
import glob
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "pooled"))
from pooled import quantile  # noqa: E402

BLOCK = 16  # vLLM's block size

rate = sys.argv[1] if len(sys.argv) > 1 else "180"
dirs = sys.argv[2:] or [os.path.join(os.path.dirname(os.path.abspath(__file__)), "records")]
for d in dirs:
    for path in sorted(glob.glob(os.path.join(d, f"*-{rate}rpm-run*.jsonl"))):
        runs = [json.loads(line) for line in open(path)]
        cells = []
        for w in sorted({r["worker"] for r in runs if r.get("worker") is not None}):
            mine = [r for r in runs if r.get("worker") == w]
            ttft = [r["ttft_s"] for r in mine if r.get("ttft_s") is not None]
            p90 = quantile(ttft, 0.9) if ttft else float("nan")
            hits = sum(r["cached_tokens"] for r in mine) / max(1, sum(r["prompt_tokens"] for r in mine))
            groups = len({r["group"] for r in mine})
            whole = sum(1 for r in mine if r["cached_tokens"] >= r["prompt_tokens"] - BLOCK)
            cells.append(f"w{w}: {len(mine)} req, {groups} groups, p90 {p90:.2f} s, hits {100 * hits:.1f} %, "
                         f"whole {whole}")
        name = os.path.basename(path)[len("shared-prefix-"):-len(".jsonl")]
        if len(dirs) > 1:
            name = os.path.join(os.path.relpath(d), name)
        print(f"{name:34} " + "; ".join(cells))
