"""Per workload: geometric mean of variant/base for kvsteer p50/p90/p99, mean hit change,
and misses against sglang_like (p50 or p90 > +5 %, hits < -2 points; heavy lead < 1.3x
where sglang_like's p90 >= 2x its lightest-rate p90). usage: summary.py BASE VAR [VAR...]  (names of sweep.sh runs)"""
import math, os, sys
from collections import defaultdict
# The runs' reader is the night's comparison script's (../kv-need-2026-12-06/cmp.py).
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "kv-need-2026-12-06"))
from cmp import load  # noqa: E402
def misses(d, key, rate):
    k, s = d[(key, rate, "kvsteer")], d[(key, rate, "sglang_like")]
    light = min(r for (kk, r, p) in d if kk == key)
    sl = d[(key, light, "sglang_like")]
    m = []
    if k["ttft_p50_s"] > 1.05 * s["ttft_p50_s"]: m.append("p50")
    if k["ttft_p90_s"] > 1.05 * s["ttft_p90_s"]: m.append("p90")
    if 100 * (k["cache_hit_rate"] - s["cache_hit_rate"]) < -2: m.append("hits")
    heavy = s["ttft_p90_s"] >= 2 * sl["ttft_p90_s"]
    if heavy and s["ttft_p90_s"] < 1.3 * k["ttft_p90_s"]: m.append("lead")
    return m, heavy
names = sys.argv[1:]
ds = [load(n) for n in names]
base = ds[0]
for wl in ["mt", "mt6", "mx", "sp"]:
    pts = sorted({(k, r) for (k, r, p) in base if k.split("-")[0] == wl})
    for n, d in zip(names, ds):
        g = defaultdict(float); cnt = defaultdict(int); nheavy = 0; hits = 0.0
        for key, rate in pts:
            if (key, rate, "kvsteer") not in d: continue
            b, v = base[(key, rate, "kvsteer")], d[(key, rate, "kvsteer")]
            for m in ("ttft_p50_s", "ttft_p90_s", "ttft_p99_s"):
                g[m] += math.log(v[m] / b[m])
            hits += 100 * (v["cache_hit_rate"] - b["cache_hit_rate"])
            ms, heavy = misses(d, key, rate)
            nheavy += heavy
            for x in ms: cnt[x] += 1
        N = len(pts)
        print(f"{wl:4} {n:10} pts {N:3} | p50 x{math.exp(g['ttft_p50_s']/N):.3f} p90 x{math.exp(g['ttft_p90_s']/N):.3f} p99 x{math.exp(g['ttft_p99_s']/N):.3f} hits {hits/N:+.2f} | misses p50 {cnt['p50']} p90 {cnt['p90']} hits {cnt['hits']} lead {cnt['lead']}/{nheavy}")
