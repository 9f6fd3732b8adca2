"""Plot a `kura bench io` JSON report: latency by size (the paper's Fig. 5), IOPS by queue depth
with fio overlaid, and sequential bandwidth. Usage: plot_bench.py REPORT.json OUT.png"""
import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def label(backend, modeled):
    return f"{backend} (modeled)" if modeled else backend


def main(src, dst):
    with open(src) as f:
        r = json.load(f)
    fig, axes = plt.subplots(2, 3, figsize=(16, 9))
    ops = ["read", "write", "write+flush"]
    for ax, op in zip(axes[0], ops):
        backends = sorted({(p["backend"], p["modeled"]) for p in r["latency"] if p["op"] == op})
        for backend, modeled in backends:
            pts = sorted((p["bytes"], p["mean_us"]) for p in r["latency"] if p["op"] == op and p["backend"] == backend)
            ax.plot([b / 1024 for b, _ in pts], [m for _, m in pts], marker="o", label=label(backend, modeled),
                    linestyle="--" if modeled else "-")
        if op == "read":
            fio = sorted((f["bytes"], f["mean_lat_us"]) for f in r["fio"] if f["rw"] == "randread" and f["depth"] == 1)
            if fio:
                ax.plot([b / 1024 for b, _ in fio], [m for _, m in fio], marker="x", color="black", label="fio (io_uring)")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_title(f"QD1 {op} latency by size")
        ax.set_xlabel("request size (KiB)")
        ax.set_ylabel("mean latency (µs)")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    for ax, pattern, rw in [(axes[1][0], "read", "randread"), (axes[1][1], "write", "randwrite")]:
        for backend in sorted({t["backend"] for t in r["throughput"] if t["pattern"] == pattern}):
            pts = sorted((t["depth"], t["iops"], t["modeled"]) for t in r["throughput"] if t["pattern"] == pattern and t["backend"] == backend)
            ax.plot([d for d, _, _ in pts], [i for _, i, _ in pts], marker="o", label=label(backend, pts[0][2]))
        fio = sorted((f["depth"], f["iops"]) for f in r["fio"] if f["rw"] == rw and f["bytes"] == 4096)
        if fio:
            ax.plot([d for d, _ in fio], [i for _, i in fio], marker="x", color="black", label="fio (io_uring)")
        ax.set_xscale("log", base=2)
        ax.set_title(f"4 KiB random {pattern} IOPS by queue depth")
        ax.set_xlabel("queue depth")
        ax.set_ylabel("IOPS")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    ax = axes[1][2]
    bars = [(label(t["backend"], t["modeled"]) + " " + t["pattern"], t["mib_per_s"]) for t in r["throughput"] if t["bytes"] == 1 << 20]
    bars += [("fio " + f["rw"], f["mib_per_s"]) for f in r["fio"] if f["bytes"] == 1 << 20 and f["depth"] == 8]
    ax.barh([b for b, _ in bars], [v for _, v in bars], color="tab:blue")
    ax.set_title("1 MiB sequential bandwidth, QD8")
    ax.set_xlabel("MiB/s")
    ax.tick_params(axis="y", labelsize=7)
    null = r.get("null_cmds_per_sec")
    sub = f"kernel {r['kernel']}, {r['cpu']}; {r['fio_status']}"
    if null:
        sub += f"; null device {null / 1e6:.1f} M cmds/s"
    what = "up to {} MiB of each device".format(r["image_bytes"] >> 20) if r["image"] == "devices" \
        else "{} MiB image".format(r["image_bytes"] >> 20)
    title = f"kura bench io ({what})"
    if r.get("label"):
        title += f" [{r['label']}]"
    fig.suptitle(f"{title}\n{sub}", fontsize=10)
    fig.tight_layout()
    fig.savefig(dst, dpi=110)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
