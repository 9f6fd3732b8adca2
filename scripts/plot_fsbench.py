"""Plot of `kura bench fs`: latency by request size per operation and system, fsync'd appends
per second, and sequential read bandwidth. Usage: python3 plot_fsbench.py REPORT.json OUT.png"""
import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

report = json.load(open(sys.argv[1]))
ops = ["read", "write", "write+sync"]
systems = []
for p in report["latency"]:
    if p["system"] not in systems:
        systems.append(p["system"])
fig, axes = plt.subplots(1, 5, figsize=(24, 4.8))
for ax, op in zip(axes, ops):
    for s in systems:
        pts = sorted((p["bytes"], p["mean_us"]) for p in report["latency"] if p["system"] == s and p["op"] == op)
        if pts:
            ax.plot([b / 1024 for b, _ in pts], [v for _, v in pts], marker="o", label=s)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("request size (KiB)")
    ax.set_ylabel("mean latency (µs)")
    ax.set_title(op)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
names = [n for n, _ in report["appends_per_s"]]
axes[3].bar(names, [v for _, v in report["appends_per_s"]], color="tab:green")
axes[3].set_title("fsync'd 4 KiB appends per second")
axes[3].tick_params(axis="x", labelrotation=20)
names = [n for n, _ in report["seq_read_mib_s"]]
axes[4].bar(names, [v for _, v in report["seq_read_mib_s"]], color="tab:blue")
axes[4].set_title("sequential read of %d MiB (MiB/s)" % (report["seq_bytes"] >> 20))
fig.suptitle("kura bench fs: AccelFS vs raw engine vs ext4 syscalls vs redirect (same disk, same run)")
fig.tight_layout()
fig.savefig(sys.argv[2], dpi=110)
