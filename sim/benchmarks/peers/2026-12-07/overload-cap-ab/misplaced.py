import json,glob,statistics as st,collections,sys
# usage: python3 misplaced.py DIR...  (bench-peers --records output dirs) per 150-rpm records file: throughput (requests over the last finish),
# each worker's last finish and request count, p50, p90, token hit rate, and requests placed > 5 s worse than the best worker nearby in time
for d in sys.argv[1:]:
  for f in sorted(glob.glob(d+'/records/*150rpm*.jsonl')):
    rs=[json.loads(l) for l in open(f)]
    end=max(r['arrival_s']+r['e2e_s'] for r in rs)
    last=[max([r['arrival_s']+r['e2e_s'] for r in rs if r['worker']==w] or [0]) for w in range(3)]
    bad=collections.Counter(); tot=collections.Counter()
    for r in rs:
        if r['arrival_s']<40: continue
        lv=[st.median(n) for w in range(3) if (n:=[x['ttft_s'] for x in rs if x['worker']==w and abs(x['arrival_s']-r['arrival_s'])<4 and x is not r])]
        if not lv: continue
        kind=('hit' if r['cached_tokens']>0 else 'cold')
        tot[kind]+=1
        if r['ttft_s']>min(lv)+5: bad[kind]+=1
    ttft=sorted(r['ttft_s'] for r in rs)
    p=lambda q: ttft[min(len(ttft)-1,int(q*len(ttft)))]
    hits=sum(r['cached_tokens'] for r in rs)/sum(r['prompt_tokens'] for r in rs)
    print(f"{f.split('/')[-3]+'/'+f.split('/')[-1][:-6]:50} n={len(rs)} tput={len(rs)/end*60:.1f}rpm end={end:.1f} last={[round(x) for x in last]} rpw={[sum(r['worker']==w for r in rs) for w in range(3)]} p50={p(.5):.1f} p90={p(.9):.1f} hits={100*hits:.1f} misplaced hit {bad['hit']}/{tot['hit']} cold {bad['cold']}/{tot['cold']}")
