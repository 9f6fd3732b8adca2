"""Plot `kura bench crush` JSON: CRUSH mappings/s per map (algorithm x OSD count) for each of
kura's mapper modes and crushtool. Usage: plot_crush.py IN.json OUT.png"""
import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main(src, dst):
    with open(src) as f:
        report = json.load(f)
    maps = report["maps"]
    if not maps:
        raise SystemExit("no maps in the report")
    sides = [s["side"] for s in maps[0]["sides"]]
    labels = [f'{m["alg"]}\n{m["osds"]} OSDs' for m in maps]
    width = 0.8 / len(sides)
    fig, ax = plt.subplots(figsize=(max(8, 1.3 * len(maps)), 5.5))
    for i, side in enumerate(sides):
        med, lo, hi = [], [], []
        for m in maps:
            s = next(p["mappings_per_s"] for p in m["sides"] if p["side"] == side)
            med.append(s["median"] / 1e6)
            lo.append((s["median"] - s["min"]) / 1e6)
            hi.append((s["max"] - s["median"]) / 1e6)
        xs = [j + (i - (len(sides) - 1) / 2) * width for j in range(len(maps))]
        hatch = "//" if side.startswith("crushtool") else None
        ax.bar(xs, med, width, yerr=[lo, hi], label=side, hatch=hatch, capsize=2)
    ax.set_xticks(range(len(maps)))
    ax.set_xticklabels(labels, fontsize=8)
    ax.set_yscale("log")
    ax.set_ylabel("mappings per second (millions, log)")
    ax.set_title(
        f'CRUSH rule 0, {report["replicas"]} replicas, {report["inputs"]} inputs: '
        f'kura ({report["threads"]} threads for allT) vs crushtool'
    )
    ax.grid(True, axis="y", which="both", alpha=0.3)
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(dst, dpi=110)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
