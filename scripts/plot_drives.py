"""Plot of `kura bench drives`: overhead of each virtual-drive layer against pass-through per
test, and NBD export read throughput per server. Usage: python3 plot_drives.py REPORT.json OUT.png"""
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
fig, axes = plt.subplots(1, 2, figsize=(15, 5))
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
fig.tight_layout()
fig.savefig(sys.argv[2], dpi=110)
