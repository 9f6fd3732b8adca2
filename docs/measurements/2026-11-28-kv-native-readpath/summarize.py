import json, sys, statistics, glob, re
# usage: summ.py before after3 ... ; reads ./<bin>-<run>.json
for b in sys.argv[1:]:
    files = sorted(glob.glob(f'./{b}-*.json'))
    per = {}
    for f in files:
        d = json.load(open(f))
        run = re.search(r'-(\d+)\.json', f).group(1)
        for r in d['ratios']:
            per.setdefault(r['workload'], []).append((run, r['compared']['ratio'], r['compared']['kura']['median'], r['compared']['peer']['median']))
    runs = [re.search(r"-(\d+)\.json", f).group(1) for f in files]
    print(f'== {b}: runs {runs}')
    for w, rows in per.items():
        meds = [x[1]['median'] for x in rows]
        lo = min(x[1]['min'] for x in rows); hi = max(x[1]['max'] for x in rows)
        each = ', '.join(f"r{x[0]} {x[1]['median']:.2f} [{x[1]['min']:.2f}-{x[1]['max']:.2f}] ({x[2]:.0f} vs {x[3]:.0f})" for x in rows)
        print(f'  {w:11s} median of run medians {statistics.median(meds):.2f}, all rounds [{lo:.2f}-{hi:.2f}] :: {each}')
