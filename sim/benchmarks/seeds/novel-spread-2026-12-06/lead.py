import json,math
def load(f):
    d=json.load(open(f)); return {(r['policy'],r['rate_per_min']):r for r in d['runs']}
for wl in ['mixed','multi','shared']:
  for s in ['default','ns0','ns05','idle']:
    ratios=[]
    for seed in range(1,11):
        base=load(f'sim/benchmarks/seeds/novel-spread-2026-12-06/{wl}-default-{seed}.json'); rates=sorted({r for (p,r) in base})
        d=load(f'sim/benchmarks/seeds/novel-spread-2026-12-06/{wl}-{s}-{seed}.json')
        light=base[('sglang_like',rates[0])]['ttft_p90_s']
        for r in rates:
            g=base[('sglang_like',r)]
            if g['ttft_p90_s']>=2*light: ratios.append(g['ttft_p90_s']/d[('kvsteer',r)]['ttft_p90_s'])
    gm=math.exp(sum(map(math.log,ratios))/len(ratios))
    print(wl,s,'heavy',len(ratios),'geomean lead %.2f'%gm,'min %.2f'%min(ratios),'>=1.3: %d'%sum(x>=1.3 for x in ratios))
