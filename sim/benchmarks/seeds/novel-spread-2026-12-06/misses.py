import json,glob,collections,statistics as st
def load(f):
    d=json.load(open(f)); return {(r['policy'],r['rate_per_min']):r for r in d['runs']}
settings=['default','ns0','ns05','idle']
res=collections.defaultdict(lambda: collections.Counter())
detail=collections.defaultdict(list)
for wl in ['mixed','shared','multi']:
    for seed in range(1,11):
        base=load(f'sim/benchmarks/seeds/novel-spread-2026-12-06/{wl}-default-{seed}.json')
        rates=sorted({r for (p,r) in base})
        sg={r:base[('sglang_like',r)] for r in rates}
        light=sg[rates[0]]['ttft_p90_s']
        for s in settings:
            d=load(f'sim/benchmarks/seeds/novel-spread-2026-12-06/{wl}-{s}-{seed}.json')
            for r in rates:
                k=d[('kvsteer',r)]; g=sg[r]
                c=res[(s,wl)]
                c['points']+=1
                miss=False
                if k['ttft_p50_s']>1.05*g['ttft_p50_s']: c['p50 miss']+=1; miss=True
                if k['ttft_p90_s']>1.05*g['ttft_p90_s']: c['p90 miss']+=1; miss=True
                if k['cache_hit_rate']<g['cache_hit_rate']-0.02: c['hit miss']+=1; miss=True
                if k['throughput_rps']<0.95*g['throughput_rps']: c['thr miss']+=1; miss=True
                c['side misses']+=miss
                if g['ttft_p90_s']>=2*light:
                    c['heavy']+=1
                    if g['ttft_p90_s']>=1.3*k['ttft_p90_s']: c['lead']+=1
                detail[(s,wl,r)].append((k['ttft_p50_s'],k['ttft_p90_s'],k['ttft_p99_s'],k['cache_hit_rate']))
for wl in ['mixed','shared','multi']:
    for s in settings:
        print(wl, s, dict(res[(s,wl)]))
print()
for (s,wl,r),v in sorted(detail.items(), key=lambda x:(x[0][1],x[0][2],x[0][0])):
    print(f"{wl:7} {r:5} {s:8} p50 med {st.median(x[0] for x in v):.3f} p90 med {st.median(x[1] for x in v):.3f} p99 med {st.median(x[2] for x in v):.3f} hits {st.median(x[3] for x in v):.3f}")
print()
for wl in ['mixed','multi','shared']:
  for seed in range(1,11):
    base=load(f'sim/benchmarks/seeds/novel-spread-2026-12-06/{wl}-default-{seed}.json'); rates=sorted({r for (p,r) in base})
    n05=load(f'sim/benchmarks/seeds/novel-spread-2026-12-06/{wl}-ns05-{seed}.json')
    for r in rates:
        g=base[('sglang_like',r)]; k=base[('kvsteer',r)]; h=n05[('kvsteer',r)]
        if abs(k['ttft_p90_s']-h['ttft_p90_s'])>1e-6 or abs(k['ttft_p50_s']-h['ttft_p50_s'])>1e-6:
            print(f"{wl} s{seed} {r:5}: sg {g['ttft_p50_s']:.3f}/{g['ttft_p90_s']:.3f}/{g['cache_hit_rate']:.3f}/{g['throughput_rps']:.3f}  def {k['ttft_p50_s']:.3f}/{k['ttft_p90_s']:.3f}/{k['cache_hit_rate']:.3f}/{k['throughput_rps']:.3f}  ns05 {h['ttft_p50_s']:.3f}/{h['ttft_p90_s']:.3f}/{h['cache_hit_rate']:.3f}/{h['throughput_rps']:.3f}")
