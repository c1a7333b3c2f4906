import json, glob, statistics as st, sys
# usage: python3 agent-split.py PEERS_DIR  (sim/benchmarks/peers)
# Every recorded mixed seed-2 150-rpm run of kvsteer (22+ agent requests): the agent
# requests per worker, mean TTFT and throughput (requests over the last finish), split
# by whether one worker holds 14 or more of the agent requests.
rows = []
for f in sorted(glob.glob(sys.argv[1] + '/**/*mixed-kvsteer-150rpm*.jsonl', recursive=True)):
    rs = [json.loads(l) for l in open(f)]
    ag = sorted((sum(r['tenant'] == 'agent' and r['worker'] == w for r in rs) for w in range(3)), reverse=True)
    if sum(ag) < 20:  # seeds 1 and 3 have fewer agent requests
        continue
    end = max(r['arrival_s'] + r['e2e_s'] for r in rs)
    rows.append((ag, st.mean(r['ttft_s'] for r in rs), len(rs) / end * 60, f))
for name, pick in (('one worker >= 14', lambda a: a[0] >= 14), ('spread', lambda a: a[0] < 14)):
    x = [r for r in rows if pick(r[0])]
    print(f"{name}: {len(x)} runs, mean TTFT {min(r[1] for r in x):.2f}-{max(r[1] for r in x):.2f} s, "
          f"{min(r[2] for r in x):.1f}-{max(r[2] for r in x):.1f} rpm")
    for a, m, t, f in x:
        print(f"  {a} {m:.2f} s {t:.1f} rpm {f}")
