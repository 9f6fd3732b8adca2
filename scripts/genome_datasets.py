#!/usr/bin/env python3
"""Prepare the read sets of the paper's Table 1 (2.1 GB, 7.0 GB and 15 GB of reads) outside CI.

Reads are simulated with pywgsim (PyPI) from the real E. coli K-12 MG1655 genome that Debian's
`ragout-examples` ships, in chunks of a fixed number of pairs, each chunk with its own seed, until
the FASTQ reaches the requested size. The last field of every read name (pywgsim's index) is
rewritten to a global counter so names stay unique across chunks; the true origin, which
`kura genome` scores against, is untouched (`CONTIG|START|END|...|...|idx`, parse with
`rsplit('|', 5)`).

  scripts/genome_datasets.py --out /data/genome --sizes 2.1G            # single-end, 150 bp
  scripts/genome_datasets.py --out /data/genome --sizes 2.1G,7G,15G --paired

Needs: `apt-get install ragout-examples` and `pip install pywgsim` (tqdm optional: progress bars).
"""

import argparse
import gzip
import os
import shutil
import subprocess
import sys
import tempfile

MG1655 = "/usr/share/doc/ragout/examples/E.Coli/references/MG1655-K12.fasta.gz"
PAPER_SIZES = {"small": "2.1G", "medium": "7.0G", "large": "15G"}


def parse_size(text):
    units = {"K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12}
    text = text.strip().upper().rstrip("B")
    if text and text[-1] in units:
        return int(float(text[:-1]) * units[text[-1]])
    return int(text)


class Progress:
    """tqdm when it is installed, a plain percentage line otherwise."""

    def __init__(self, total, label):
        self.total, self.label, self.done = total, label, 0
        try:
            from tqdm import tqdm

            self.bar = tqdm(total=total, unit="B", unit_scale=True, desc=label)
        except ImportError:
            self.bar = None

    def update(self, n):
        self.done += n
        if self.bar is not None:
            self.bar.update(n)
        else:
            pct = min(100.0, 100.0 * self.done / max(1, self.total))
            print(f"\r{self.label}: {pct:5.1f}% ({self.done / 1e9:.2f} GB)", end="", file=sys.stderr)

    def close(self):
        if self.bar is not None:
            self.bar.close()
        else:
            print(file=sys.stderr)


def plain_reference(out_dir):
    """pywgsim wants an uncompressed FASTA."""
    if not os.path.exists(MG1655):
        sys.exit(f"{MG1655} is missing: apt-get install ragout-examples")
    ref = os.path.join(out_dir, "MG1655-K12.fasta")
    if not os.path.exists(ref):
        with gzip.open(MG1655, "rb") as src, open(ref + ".part", "wb") as dst:
            shutil.copyfileobj(src, dst)
        os.replace(ref + ".part", ref)
    return ref


def renumber(src, dst, start):
    """Copies FASTQ records, rewriting each name's last `|` field to a global index."""
    index = start
    with open(src, "rb") as f:
        for i, line in enumerate(f):
            if i % 4 == 0:
                head, _, _ = line.rstrip(b"\n").rpartition(b"|")
                line = head + b"|" + str(index).encode() + b"\n"
                index += 1
            dst.write(line)
    return index


def make(ref, out_dir, size_label, target, args):
    suffix = "pe" if args.paired else "se"
    names = [os.path.join(out_dir, f"reads-{size_label}-{suffix}_{m}.fq") for m in ((1, 2) if args.paired else (1,))]
    if all(os.path.exists(n) for n in names) and not args.force:
        print(f"{', '.join(names)}: already there (--force to redo)")
        return
    outs = [open(n + ".part", "wb") for n in names]
    bar = Progress(target, f"reads {size_label}")
    index, chunk, written = 0, 0, 0
    with tempfile.TemporaryDirectory(dir=out_dir) as tmp:
        r1, r2 = os.path.join(tmp, "r1.fq"), os.path.join(tmp, "r2.fq")
        while written < target:
            cmd = ["pywgsim", "-N", str(args.chunk_pairs), "-1", str(args.length), "-2", str(args.length),
                   "-e", str(args.error), "-r", str(args.mutation), "-S", str(args.seed + chunk), ref, r1, r2]
            subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            before = sum(o.tell() for o in outs)
            next_index = renumber(r1, outs[0], index)
            if args.paired:
                renumber(r2, outs[1], index)
            index = next_index
            chunk += 1
            grew = sum(o.tell() for o in outs) - before
            written += grew
            bar.update(grew)
    bar.close()
    for o, n in zip(outs, names):
        o.close()
        os.replace(n + ".part", n)
    print(f"{', '.join(names)}: {index} reads, {written / 1e9:.2f} GB, {chunk} chunks")


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True, help="output directory (needs the sizes asked for, free)")
    p.add_argument("--sizes", default="2.1G", help="comma-separated FASTQ sizes, or small,medium,large")
    p.add_argument("--paired", action="store_true", help="write both mates (the size counts both files)")
    p.add_argument("--length", type=int, default=150)
    p.add_argument("--error", type=float, default=0.002)
    p.add_argument("--mutation", type=float, default=0.001)
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--chunk-pairs", type=int, default=1_000_000)
    p.add_argument("--force", action="store_true")
    args = p.parse_args()
    if shutil.which("pywgsim") is None:
        sys.exit("pywgsim is missing: pip install pywgsim")
    os.makedirs(args.out, exist_ok=True)
    ref = plain_reference(args.out)
    for label in args.sizes.split(","):
        size = PAPER_SIZES.get(label, label)
        target = parse_size(size)
        free = shutil.disk_usage(args.out).free
        if free < target * 1.05:
            sys.exit(f"{args.out}: {free / 1e9:.1f} GB free, {size} asked")
        make(ref, args.out, size, target, args)


if __name__ == "__main__":
    main()
