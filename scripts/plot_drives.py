"""Plot of `kura bench drives`: overhead of each virtual-drive layer against pass-through per
test, NBD export read throughput per server, and the priority isolation latency CDF. Usage: python3 plot_drives.py REPORT.json OUT.png"""
import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

report = json.load(open(sys.argv[1]))
layers = []
tests = []
for p in report["layers"]:
    if p["layer"] not in layers:
        layers.append(p["layer"])
    if p["test"] not in tests:
        tests.append(p["test"])
isolation = report.get("isolation", [])
fig, axes = plt.subplots(1, 3 if isolation else 2, figsize=(22 if isolation else 15, 5))
width = 0.8 / max(1, len(tests))
for i, t in enumerate(tests):
    vals = []
    for layer in layers:
        m = [p for p in report["layers"] if p["layer"] == layer and p["test"] == t]
        vals.append(100.0 * m[0]["overhead"] if m else 0.0)
    axes[0].bar([j + i * width for j in range(len(layers))], vals, width, label=t)
axes[0].axhline(0, color="black", linewidth=0.8)
axes[0].axhline(3, color="red", linestyle="--", linewidth=0.8, label="3 % target")
axes[0].set_xticks([j + width * (len(tests) - 1) / 2 for j in range(len(layers))])
axes[0].set_xticklabels(layers)
axes[0].set_ylabel("overhead vs pass-through (%)")
axes[0].set_title("virtual-drive layer overhead (same backing image)")
axes[0].legend(fontsize=8)
if report["nbd"]:
    axes[1].bar([p["server"] for p in report["nbd"]], [p["mib_per_s"] for p in report["nbd"]])
    axes[1].set_ylabel("MiB/s")
    axes[1].set_title("NBD export, nbdcopy read of the image")
else:
    axes[1].set_axis_off()
    axes[1].text(0.5, 0.5, "NBD comparison not run (see notes)", ha="center", va="center")
if isolation:
    for case in isolation:
        xs = [p[0] for p in case["cdf"]]
        ys = [p[1] for p in case["cdf"]]
        label = "%s (p99 %.0f us)" % (case["case"], case["p99_us"])
        axes[2].plot(xs, ys, label=label)
    axes[2].set_xscale("log")
    axes[2].set_xlabel("foreground 4K QD1 read latency (us)")
    axes[2].set_ylabel("fraction of requests")
    axes[2].set_title("priority isolation: QD32 128K background writes")
    axes[2].legend(fontsize=8, loc="lower right")
fig.tight_layout()
fig.savefig(sys.argv[2], dpi=110)
