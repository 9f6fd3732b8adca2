"""Plot of `kura bench vm`: fio IOPS inside a QEMU guest (TCG or KVM, as the report's label says) per job and disk (median with
min-max bars), and the ratios kura/virtio-blk, kura/NBD and layer/pass-through per job with the
issue's targets. Usage: python3 plot_vm.py REPORT.json OUT.png"""
import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

report = json.load(open(sys.argv[1]))
jobs = [j["name"] for j in report["jobs"]]
disks = [d["serial"] for d in report["disks"]]
fig, axes = plt.subplots(1, 2, figsize=(16, 5.5))

width = 0.8 / max(1, len(disks))
for i, d in enumerate(disks):
    med, lo, hi = [], [], []
    for j in jobs:
        c = [c for c in report["cells"] if c["job"] == j and c["disk"] == d][0]["iops"]
        med.append(c["median"])
        lo.append(c["median"] - c["min"])
        hi.append(c["max"] - c["median"])
    xs = [k + i * width for k in range(len(jobs))]
    axes[0].bar(xs, med, width, yerr=[lo, hi], capsize=2, label=d)
axes[0].set_yscale("log")
axes[0].set_xticks([k + width * (len(disks) - 1) / 2 for k in range(len(jobs))])
axes[0].set_xticklabels(jobs, rotation=20, fontsize=8)
axes[0].set_ylabel("IOPS in the guest (fio, median, min-max)")
axes[0].set_title("fio in the guest per disk - %s" % report["label"].split(":")[0])
axes[0].legend(fontsize=8)

names = []
for r in report["ratios"]:
    if r["name"] not in names:
        names.append(r["name"])
width = 0.8 / max(1, len(names))
for i, n in enumerate(names):
    med, lo, hi = [], [], []
    for j in jobs:
        r = [r for r in report["ratios"] if r["job"] == j and r["name"] == n][0]["compared"]["ratio"]
        med.append(r["median"])
        lo.append(r["median"] - r["min"])
        hi.append(r["max"] - r["median"])
    xs = [k + i * width for k in range(len(jobs))]
    axes[1].bar(xs, med, width, yerr=[lo, hi], capsize=2, label=n)
axes[1].axhline(1.0, color="black", linewidth=0.8)
axes[1].axhline(1.5, color="red", linestyle="--", linewidth=0.8, label="kura/nbd target 1.5x (4K QD32)")
axes[1].set_yscale("log")
axes[1].set_xticks([k + width * (len(names) - 1) / 2 for k in range(len(jobs))])
axes[1].set_xticklabels(jobs, rotation=20, fontsize=8)
axes[1].set_ylabel("IOPS ratio, same round (median, min-max)")
axes[1].set_title("kura vs peers and layers vs pass-through - %s" % report["label"].split(":")[0])
axes[1].legend(fontsize=8)
fig.suptitle(
    "kura bench vm: %d rounds x %d s per job, %s; QEMU aio=%s"
    % (report["rounds"], report["secs_per_job"], report["label"], report["qemu_aio"]),
    fontsize=9,
)
fig.tight_layout()
fig.savefig(sys.argv[2], dpi=110)
