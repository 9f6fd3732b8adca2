"""Plot `kura bench genome` JSON: end-to-end time and peak RSS per system, and kura's stages.
Usage: plot_genome.py IN.json OUT.png"""
import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main(src, dst):
    with open(src) as f:
        r = json.load(f)
    systems = r["systems"]
    names = [s["label"] for s in systems]
    fig, axes = plt.subplots(1, 3, figsize=(16, 5))
    ax = axes[0]
    ax.bar(range(len(systems)), [s["seconds"] for s in systems], color="tab:blue")
    ax.set_xticks(range(len(systems)), names, fontsize=8)
    ax.set_ylabel("end-to-end seconds (lower is better)")
    ax.set_title(f"{r['reads']} reads, {r['threads']} threads")
    ax = axes[1]
    ax.bar(range(len(systems)), [s["peak_rss_mib"] for s in systems], color="tab:orange")
    ax.set_xticks(range(len(systems)), names, fontsize=8)
    ax.set_ylabel("peak RSS (MiB)")
    ax.set_title("memory")
    ax = axes[2]
    kura = [s for s in systems if s["stages"]]
    bottom = [0.0] * len(kura)
    stage_names = [name for name, _ in kura[0]["stages"]] if kura else []
    for i, stage in enumerate(stage_names):
        vals = [dict(s["stages"]).get(stage, 0.0) for s in kura]
        ax.bar(range(len(kura)), vals, bottom=bottom, label=stage, color=plt.cm.tab10(i))
        bottom = [b + v for b, v in zip(bottom, vals)]
    ax.set_xticks(range(len(kura)), [s["label"] for s in kura], fontsize=8)
    ax.set_ylabel("seconds")
    ax.set_title("kura stages per I/O path (Table 2, Fig. 8)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(dst, dpi=110)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
