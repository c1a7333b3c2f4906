"""kvsteer against sglang_like per point, for sweep.sh runs: p50 / p90 / p99 (s), the heavy
lead (sglang_like p90 / kvsteer p90; H marks heavy points), throughput (rpm), hits (%), and the
targets missed. usage: python3 table.py BASE [VARIANT...]"""
import os, sys
# The runs' reader is the 6 Dec comparison script's, as in ../kv-held-2026-12-06/summary.py.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "kv-need-2026-12-06"))
from cmp import load  # noqa: E402
names=sys.argv[1:]
ds=[load(n) for n in names]
base=ds[0]
keys=sorted({(k,r) for (k,r,p) in base})
print("point rate | sg p50/p90/p99 thr hits | " + " | ".join(f"{n}: p50 p90 p99 lead thr hits miss" for n in names))
tot={n:[0,0] for n in names}
for k,r in keys:
    s=base[(k,r,"sglang_like")]
    light=min(rr for (kk,rr) in keys if kk==k)
    heavy=s["ttft_p90_s"]>=2*base[(k,light,"sglang_like")]["ttft_p90_s"]
    row=f"{k:5} {r:4.0f}{'H' if heavy else ' '}| {s['ttft_p50_s']:.2f}/{s['ttft_p90_s']:.2f}/{s['ttft_p99_s']:.1f} {s['throughput_rps']*60:.1f} {100*s['cache_hit_rate']:.1f} |"
    for n,d in zip(names,ds):
        v=d.get((k,r,"kvsteer"))
        if not v: row+=" -- |"; continue
        m=[]
        if v["ttft_p50_s"]>1.05*s["ttft_p50_s"]: m.append("p50")
        if v["ttft_p90_s"]>1.05*s["ttft_p90_s"]: m.append("p90")
        if 100*(v["cache_hit_rate"]-s["cache_hit_rate"])<-2: m.append("hits")
        lead=s["ttft_p90_s"]/v["ttft_p90_s"]
        if heavy and lead<1.3: m.append("LEAD")
        if v["throughput_rps"]<0.95*s["throughput_rps"]: m.append("thr")
        tot[n][0]+=len(m); tot[n][1]+= (heavy and lead>=1.3)
        row+=f" {v['ttft_p50_s']:.2f} {v['ttft_p90_s']:.2f} {v['ttft_p99_s']:.1f} {lead:.2f}x {v['throughput_rps']*60:.1f} {100*v['cache_hit_rate']:.1f} {','.join(m)} |"
    print(row)
print("misses / leads met:", tot)
