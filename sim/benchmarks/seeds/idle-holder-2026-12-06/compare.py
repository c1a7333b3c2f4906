"""The idle-holder rule against the scoring before it, and each against sglang_like,
on the 6-worker multi-turn sweep in this folder (run from the repository's root)."""
import json, math

DIR = "sim/benchmarks/seeds/idle-holder-2026-12-06"


def load(name, seed):
    with open(f"{DIR}/multi-{name}-{seed}.json") as f:
        return {(r["policy"], r["rate_per_min"]): r for r in json.load(f)["runs"]}


def gm(logs):
    return math.exp(sum(logs) / len(logs))


better = worse = same = 0
p90, p50, lead = [], [], {"idle": [], "default": []}
misses = {"idle": [], "default": []}
for seed in range(1, 6):
    runs = {n: load(n, seed) for n in ("idle", "default")}
    for rate in sorted({r for (_, r) in runs["idle"]}):
        i, d = runs["idle"][("kvsteer", rate)], runs["default"][("kvsteer", rate)]
        if i["ttft_p90_s"] < d["ttft_p90_s"] * 0.99:
            better += 1
        elif i["ttft_p90_s"] > d["ttft_p90_s"] * 1.01:
            worse += 1
        else:
            same += 1
        p90.append(math.log(i["ttft_p90_s"] / d["ttft_p90_s"]))
        p50.append(math.log(i["ttft_p50_s"] / d["ttft_p50_s"]))
        for n, k in (("idle", i), ("default", d)):
            g = runs[n][("sglang_like", rate)]
            lead[n].append(math.log(g["ttft_p90_s"] / k["ttft_p90_s"]))
            for q in ("ttft_p50_s", "ttft_p90_s"):
                if k[q] > g[q] * 1.05:
                    misses[n].append(k[q] / g[q])
print(f"idle against default, p90: better {better}, worse {worse}, within 1 % {same}; "
      f"geometric mean p90 {gm(p90):.3f}, p50 {gm(p50):.3f}")
for n in ("idle", "default"):
    print(f"{n}: p90 lead over sglang_like (geometric mean) {gm(lead[n]):.3f}; "
          f"p50 or p90 > 5 % above sglang_like at {len(misses[n])} points, "
          f"worst {max(misses[n]):.2f}x")
