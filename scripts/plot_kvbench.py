"""Plot of `kura bench kv`: throughput per workload and system (log scale), and p99 latency.
Usage: python3 plot_kvbench.py REPORT.json OUT.png"""
import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

report = json.load(open(sys.argv[1]))
points = report["points"]
systems = []
labels = []
for p in points:
    if p["system"] not in systems:
        systems.append(p["system"])
    label = "%s\n%dB" % (p["workload"], p["value_bytes"])
    if label not in labels:
        labels.append(label)
fig, axes = plt.subplots(2, 1, figsize=(max(10, len(labels) * 1.1), 9))
width = 0.8 / max(1, len(systems))
for i, s in enumerate(systems):
    tput, p99 = [], []
    for label in labels:
        match = [p for p in points if p["system"] == s and "%s\n%dB" % (p["workload"], p["value_bytes"]) == label]
        tput.append(match[0]["ops_per_s"] if match else 0)
        p99.append(match[0]["p99_us"] if match else 0)
    xs = [j + i * width for j in range(len(labels))]
    axes[0].bar(xs, tput, width, label=s)
    axes[1].bar(xs, p99, width, label=s)
for ax, title in zip(axes, ["throughput (ops/s; entries/s for scans)", "p99 latency (µs)"]):
    ax.set_xticks([j + width * (len(systems) - 1) / 2 for j in range(len(labels))])
    ax.set_xticklabels(labels, fontsize=8)
    ax.set_yscale("log")
    ax.set_title(title)
    ax.grid(True, axis="y", which="both", alpha=0.3)
    ax.legend(fontsize=8)
fig.suptitle("kura bench kv: kura-store, LevelDB on AccelFS / host fs / redirect, RocksDB and LMDB (same run)")
fig.tight_layout()
fig.savefig(sys.argv[2], dpi=110)
