"""Plot `kura bench genome --matrix` JSON: per cell (reference, error rate, indel rate, mode),
every tool's mapping wall time, peak RSS, correct placements and confidently misplaced reads,
and each reference's index build time and size.
Usage: plot_genome_matrix.py IN.json OUT.png"""
import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main(src, dst):
    with open(src) as f:
        r = json.load(f)
    cells = r["cells"]
    tools = [t["tool"] for t in cells[0]["tools"]] if cells else []
    labels = [
        f"{c['reference']}\n{c['error_rate'] * 100:g}% err {c['indel_rate'] * 100:g}% indel\n{c['mode']}"
        for c in cells
    ]
    fig, axes = plt.subplots(3, 2, figsize=(max(12, 1.6 * len(cells) + 4), 13))
    width = 0.8 / max(1, len(tools))
    colors = {"kura": "tab:blue", "minimap2": "tab:orange", "bwa mem": "tab:green", "bowtie2": "tab:red"}

    def per_tool(ax, key, ylabel, title, frac=False):
        lows = []
        for j, tool in enumerate(tools):
            xs, ys, lo, hi = [], [], [], []
            for i, c in enumerate(cells):
                t = next((t for t in c["tools"] if t["tool"] == tool), None)
                if t is None:
                    continue
                xs.append(i + (j - (len(tools) - 1) / 2) * width)
                if key == "seconds":
                    ys.append(t["seconds"]["median"])
                    lo.append(t["seconds"]["median"] - t["seconds"]["min"])
                    hi.append(t["seconds"]["max"] - t["seconds"]["median"])
                elif frac:
                    ys.append(100.0 * t[key] / max(1, t["reads"]))
                else:
                    ys.append(t[key])
            err = [lo, hi] if key == "seconds" else None
            ax.bar(xs, ys, width, yerr=err, label=tool, color=colors.get(tool))
            if frac and ys:
                lows.append(min(ys))
        if lows:
            # Tools differ by tenths of a percent: start the axis just below the lowest bar.
            ax.set_ylim(max(0.0, min(lows) - 1.0), 100.0)
        ax.set_xticks(range(len(cells)), labels, fontsize=6)
        ax.set_ylabel(ylabel)
        ax.set_title(title, fontsize=9)
        ax.legend(fontsize=7)

    per_tool(axes[0][0], "seconds", "mapping process wall s", f"wall time (median, min-max of {r['rounds']} rounds; lower is better)")
    per_tool(axes[0][1], "peak_rss_mib", "peak RSS MiB", "memory (lower is better)")
    per_tool(axes[1][0], "correct", "correct %", "correct placements (higher is better; axis starts near the lowest)", frac=True)
    per_tool(axes[1][1], "misplaced_mapq_ge_20", "reads", "misplaced with MAPQ >= 20 (lower is better)")
    ax = axes[2][0]
    ratios = [c["kura_vs_minimap2"]["ratio"]["median"] if c.get("kura_vs_minimap2") else 0 for c in cells]
    ax.bar(range(len(cells)), ratios, color=["tab:green" if x <= 0.8 else "tab:red" for x in ratios])
    cpu = [c["kura_vs_minimap2_cpu"]["ratio"]["median"] if c.get("kura_vs_minimap2_cpu") else None for c in cells]
    if any(x is not None for x in cpu):
        ax.plot([i for i, x in enumerate(cpu) if x is not None], [x for x in cpu if x is not None],
                "kD", label="CPU time ratio (user + system)")
    ax.axhline(0.8, color="black", linestyle="--", label="target 0.8x")
    ax.axhline(1.0, color="grey", linestyle=":")
    ax.set_xticks(range(len(cells)), labels, fontsize=6)
    ax.set_ylabel("kura / minimap2 (bars: wall time)")
    ax.set_title("kura against minimap2 per cell (green: target met)", fontsize=9)
    ax.legend(fontsize=7)
    ax = axes[2][1]
    refs = r["references"]
    itools = [i["tool"] for i in refs[0]["indexes"]] if refs else []
    w = 0.8 / max(1, len(itools))
    for j, tool in enumerate(itools):
        xs = [k + (j - (len(itools) - 1) / 2) * w for k in range(len(refs))]
        ys = [next((i["seconds"] for i in ref["indexes"] if i["tool"] == tool), 0) for ref in refs]
        sizes = [next((i["bytes"] for i in ref["indexes"] if i["tool"] == tool), 0) / 2**20 for ref in refs]
        bars = ax.bar(xs, ys, w, label=tool, color=colors.get(tool))
        for b, s in zip(bars, sizes):
            ax.annotate(f"{s:.0f} MiB", (b.get_x() + b.get_width() / 2, b.get_height()), ha="center", va="bottom", fontsize=6)
    ax.set_xticks(range(len(refs)), [ref["name"] for ref in refs], fontsize=8)
    ax.set_ylabel("index build s (label: size on disk)")
    ax.set_title("index build per reference", fontsize=9)
    ax.legend(fontsize=7)
    fig.suptitle(f"kura bench genome --matrix: {r['reads_per_cell']} reads/pairs per cell, {r['threads']} threads; {r['host']}", fontsize=10)
    fig.tight_layout()
    fig.savefig(dst, dpi=100)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
