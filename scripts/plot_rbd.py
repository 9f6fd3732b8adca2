"""Plot of `kura bench rbd`: kura against librbd's rbd bench per test, DeLiBA's stack against
pass-through rbd:, and kura serve against qemu-nbd (each as the median kura/peer ratio with its
min-max over the rounds). Usage: python3 plot_rbd.py REPORT.json OUT.png"""
import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

report = json.load(open(sys.argv[1]))
parts = [("interface: kura rbd: / rbd bench", report["interface"]),
         ("DeLiBA stack / pass-through", report["deliba"]),
         ("NBD: kura serve / qemu-nbd", report["nbd"])]
parts = [(t, pts) for t, pts in parts if pts]
fig, axes = plt.subplots(1, len(parts), figsize=(6 * len(parts), 5), squeeze=False)
for ax, (title, pts) in zip(axes[0], parts):
    names = [p["test"] for p in pts]
    med = [p["compared"]["ratio"]["median"] for p in pts]
    lo = [m - p["compared"]["ratio"]["min"] for m, p in zip(med, pts)]
    hi = [p["compared"]["ratio"]["max"] - m for m, p in zip(med, pts)]
    ax.barh(names, med, xerr=[lo, hi], color="tab:blue")
    ax.axvline(1.0, color="black", linewidth=0.8)
    ax.set_title(title)
    ax.set_xlabel("ratio (cold seqread row: fraction lower)")
    ax.tick_params(axis="y", labelsize=7)
fig.tight_layout()
fig.savefig(sys.argv[2], dpi=110)
