"""kvsteer's figures per point, base -> variant, with sglang_like's beside them.
usage: python3 cmp.py BASE VARIANT  (names of sweep.sh runs under ${TMPDIR:-/tmp}/kv-need/)"""
import glob, json, os, sys

root = os.path.join(os.environ.get("TMPDIR", "/tmp"), "kv-need")


def load(name):
    out = {}
    for f in sorted(glob.glob(os.path.join(root, name, "*.json"))):
        key = os.path.basename(f)[:-5]
        for r in json.load(open(f))["runs"]:
            out[(key, r["rate_per_min"], r["policy"])] = r
    return out


def main():
    base, var = load(sys.argv[1]), load(sys.argv[2])
    print("point  rate | kvsteer p50, p90, p99 (s), hits (%): base -> variant | sglang_like p50 / p90 / hits")
    for (key, rate, pol), b in sorted(base.items()):
        v, s = var.get((key, rate, pol)), base.get((key, rate, "sglang_like"))
        if pol != "kvsteer" or v is None or s is None:
            continue
        cells = [f"{b[m]:.3f} -> {v[m]:.3f}" for m in ("ttft_p50_s", "ttft_p90_s", "ttft_p99_s")]
        cells.append(f"{100 * b['cache_hit_rate']:.1f} -> {100 * v['cache_hit_rate']:.1f}")
        print(f"{key:5} {rate:4.0f} | " + " | ".join(cells)
              + f" | {s['ttft_p50_s']:.3f} / {s['ttft_p90_s']:.3f} / {100 * s['cache_hit_rate']:.1f}")


if __name__ == "__main__":
    main()
