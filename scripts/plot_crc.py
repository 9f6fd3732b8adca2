"""Plot `kura bench crc` JSON: CRC32C GiB/s by buffer size per method. Usage: plot_crc.py IN.json OUT.png"""
import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main(src, dst):
    with open(src) as f:
        points = json.load(f)
    fig, ax = plt.subplots(figsize=(8, 5))
    for method in dict.fromkeys(p["method"] for p in points):
        pts = sorted((p["bytes"], p["gib_per_s"]) for p in points if p["method"] == method)
        ax.plot([b for b, _ in pts], [g for _, g in pts], marker="o", label=method)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("buffer size (bytes)")
    ax.set_ylabel("throughput (GiB/s)")
    ax.set_title("CRC32C: table-driven vs crc32 instruction vs vectorized folding")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(dst, dpi=110)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
