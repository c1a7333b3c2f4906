#!/usr/bin/env python3
"""Mixed-traffic points of two sweep.sh runs side by side: kvsteer's p50, p90 and hit rate
in BASE and VAR, and sglang_like's (from BASE).
usage: points.py BASE VAR   (names of ../kv-held-2026-12-06/sweep.sh runs)"""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "kv-need-2026-12-06"))
from cmp import load  # noqa: E402

if len(sys.argv) != 3:
    sys.exit(__doc__)
b, v = load(sys.argv[1]), load(sys.argv[2])
print("point          p50 base / var / sglang_like   p90 base / var / sglang_like   hits % base / var / sglang_like")
for key, rate in sorted({(k, r) for (k, r, p) in b if k.startswith("mx")}, key=lambda x: (int(x[0][3:]), x[1])):
    kb, kv, s = b[(key, rate, "kvsteer")], v[(key, rate, "kvsteer")], b[(key, rate, "sglang_like")]
    print(f"{key:6s} {rate:4.0f} rpm  "
          + "   ".join(" / ".join(f"{f * x[m]:5.2f}" for x in (kb, kv, s)) for m, f in
                       (("ttft_p50_s", 1), ("ttft_p90_s", 1), ("cache_hit_rate", 100))))
