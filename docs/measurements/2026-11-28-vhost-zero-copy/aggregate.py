#!/usr/bin/env python3
"""Summarises `kura bench vm` runs made with zero copy on and off (one JSON per run).

Usage: aggregate.py RUN.json... > table.md
Each run's mode is read from its own kura serve counters (`vhost zero_copy=1|0`), not from its
file name. Per job and mode: the median [min-max] over runs of the `kura` disk's IOPS, of the
per-run ratios kura/qemu and kura/nbd (QEMU's virtio-blk and kura's NBD export do not use the
vhost path, so they are same-guest, same-moment peers), and of snapshot/qemu and mirror/qemu
(also vhost-user exports).
"""
import json
import re
import statistics
import sys


def mode_of(run):
    for line in run["serve_counters"]:
        m = re.search(r"export kura: vhost zero_copy=(\d)", line)
        if m:
            return "on" if m.group(1) == "1" else "off"
    raise SystemExit("no vhost counters for export kura")


def counters(run, export):
    for line in run["serve_counters"]:
        if f"export {export}: vhost " in line:
            return dict(kv.split("=") for kv in line.split("vhost ", 1)[1].split())
    return {}


def fmt(xs, digits=0):
    xs = sorted(xs)
    f = f"{{:.{digits}f}}"
    return f"{f.format(statistics.median(xs))} [{f.format(xs[0])}–{f.format(xs[-1])}]"


runs = []
for path in sys.argv[1:]:
    with open(path) as f:
        run = json.load(f)
    runs.append((path, mode_of(run), run))

jobs = [j["name"] for j in runs[0][2]["jobs"]]
print("| job | zero copy | runs | kura IOPS | kura/qemu | kura/nbd | snapshot/qemu | mirror/qemu |")
print("|---|---|---|---|---|---|---|---|")
for job in jobs:
    for mode in ("on", "off"):
        cols = {k: [] for k in ("kura", "kq", "kn", "sq", "mq")}
        for _, m, run in runs:
            if m != mode:
                continue
            iops = {s["disk"]: s["iops"] for s in run["samples"] if s["job"] == job}
            cols["kura"].append(iops["kura"])
            cols["kq"].append(iops["kura"] / iops["qemu"])
            cols["kn"].append(iops["kura"] / iops["nbd"])
            cols["sq"].append(iops["snapshot"] / iops["qemu"])
            cols["mq"].append(iops["mirror"] / iops["qemu"])
        if not cols["kura"]:
            continue
        print(
            f"| {job} | {mode} | {len(cols['kura'])} | {fmt(cols['kura'])} | {fmt(cols['kq'], 2)} "
            f"| {fmt(cols['kn'], 2)} | {fmt(cols['sq'], 2)} | {fmt(cols['mq'], 2)} |"
        )
print()
print("Requests of the `kura` export moved in place and copied, per run (all jobs together):")
print()
print("| run | zero copy | zero_copy_reads | copied_reads | zero_copy_writes | copied_writes |")
print("|---|---|---|---|---|---|")
for path, mode, run in runs:
    c = counters(run, "kura")
    print(
        f"| {path} | {mode} | {c.get('zero_copy_reads')} | {c.get('copied_reads')} "
        f"| {c.get('zero_copy_writes')} | {c.get('copied_writes')} |"
    )
