#!/usr/bin/env python3
"""Summarises zero_copy_cost's JSON (crates/vhost/src/backend.rs): per device and job, MiB/s with
zero copy on and off, median [min-max] over rounds, and the per-round ratio on/off."""
import json
import statistics
import sys

rows = json.load(open(sys.argv[1]))


def fmt(xs, digits=0):
    xs = sorted(xs)
    f = f"{{:.{digits}f}}"
    return f"{f.format(statistics.median(xs))} [{f.format(xs[0])}–{f.format(xs[-1])}]"


keys = []
for r in rows:
    k = (r["device"], r["job"])
    if k not in keys:
        keys.append(k)
print("| device | job | rounds | zero copy on, MiB/s | off, MiB/s | on/off per round |")
print("|---|---|---|---|---|---|")
for dev, job in keys:
    on = {r["round"]: r["mib_s"] for r in rows if (r["device"], r["job"]) == (dev, job) and r["zero_copy"]}
    off = {r["round"]: r["mib_s"] for r in rows if (r["device"], r["job"]) == (dev, job) and not r["zero_copy"]}
    ratio = [on[k] / off[k] for k in on if k in off]
    print(f"| {dev} | {job} | {len(ratio)} | {fmt(on.values())} | {fmt(off.values())} | {fmt(ratio, 2)} |")
