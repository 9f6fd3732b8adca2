"""Summarise before-N.json / after-N.json (kura bench kv --json) in this folder.

For each binary, workload and peer: the median over runs of each run's median ratio, the lowest
and highest round ratio over all runs, and each run's median. usage: python3 summarize.py [8x-]
(the argument picks before-8x-N.json / after-8x-N.json, the --data-size 8x runs)
"""
import glob, json, os, re, statistics, sys

here = os.path.dirname(os.path.abspath(__file__))
tag = sys.argv[1] if len(sys.argv) > 1 else ""
rows = {}
for b in ("before", "after"):
    pattern = re.compile(rf"^{b}-{tag}\d+\.json$")
    names = sorted(glob.glob(os.path.join(here, f"{b}-*.json")))
    for f in [n for n in names if pattern.match(os.path.basename(n))]:
        run = re.search(r"-(\d+)\.json$", f).group(1)
        for r in json.load(open(f))["ratios"]:
            peer = r["what"].split("(")[-1].rstrip(")")
            key = (r["workload"], peer)
            rows.setdefault(key, {}).setdefault(b, []).append((run, r["compared"]))
print("| workload | ratio | before: median of runs [min-max of rounds] (per run) | after: same |")
print("|---|---|---|---|")
for (w, peer), by in rows.items():
    cells = []
    for b in ("before", "after"):
        xs = by.get(b, [])
        if not xs:
            cells.append("-")
            continue
        med = statistics.median(c["ratio"]["median"] for _, c in xs)
        lo = min(c["ratio"]["min"] for _, c in xs)
        hi = max(c["ratio"]["max"] for _, c in xs)
        each = " ".join(f"{c['ratio']['median']:.2f}" for _, c in xs)
        cells.append(f"{med:.2f} [{lo:.2f}-{hi:.2f}] ({each})")
    print(f"| {w} | {peer} | {cells[0]} | {cells[1]} |")
