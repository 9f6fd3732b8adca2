"""Plot `kura bench genome --real` JSON: per tool, the mapping wall time (median with its
min-max), peak RSS, and the mapped, properly-paired and MAPQ >= 20 rates, plus each tool's
agreement with minimap2's placements (real reads have no truth).
Usage: plot_genome_real.py IN.json OUT.png"""
import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main(src, dst):
    with open(src) as f:
        r = json.load(f)
    tools = r["tools"]
    names = [t["tool"] for t in tools]
    colors = {"kura": "tab:blue", "minimap2": "tab:orange", "bwa mem": "tab:green", "bowtie2": "tab:red"}
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.5))
    xs = range(len(tools))
    cs = [colors.get(n, "tab:gray") for n in names]

    ax = axes[0]
    med = [t["seconds"]["median"] for t in tools]
    lo = [t["seconds"]["median"] - t["seconds"]["min"] for t in tools]
    hi = [t["seconds"]["max"] - t["seconds"]["median"] for t in tools]
    ax.bar(xs, med, yerr=[lo, hi], color=cs, capsize=4)
    ax.set_xticks(list(xs), names)
    ax.set_ylabel("seconds (process wall, median, min-max)")
    ax.set_title("mapping time")

    ax = axes[1]
    ax.bar(xs, [t["peak_rss_mib"]["median"] for t in tools], color=cs)
    ax.set_xticks(list(xs), names)
    ax.set_ylabel("MiB")
    ax.set_title("peak RSS")

    ax = axes[2]
    agree = {a["tool"]: a["agree_fraction"] for a in r["versus_minimap2"]}
    series = [
        ("mapped", [t["mapped_fraction"] for t in tools]),
        ("properly paired", [t["properly_paired_fraction"] for t in tools]),
        ("MAPQ >= 20", [t["mapq_ge_20_fraction"] for t in tools]),
        ("agrees with minimap2", [agree.get(n, 1.0 if n == "minimap2" else 0.0) for n in names]),
    ]
    width = 0.8 / len(series)
    for j, (label, ys) in enumerate(series):
        ax.bar([x + (j - 1.5) * width for x in xs], [y * 100 for y in ys], width, label=label)
    ax.set_xticks(list(xs), names)
    ax.set_ylabel("% of primary records")
    lows = [y * 100 for _, ys in series for y in ys]
    ax.set_ylim(max(0, min(lows) - 5), 100.5)
    ax.legend(fontsize=8, loc="lower left")
    ax.set_title("rates (no truth: each tool's own flags)")

    reads = " + ".join(p.split("/")[-1] for p in r["reads"])
    fig.suptitle(f"kura bench genome --real: {reads} ({r['pairs']} pairs), {r['threads']} threads, {r['rounds']} rounds")
    fig.tight_layout()
    fig.savefig(dst, dpi=110)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
