"""kura.DB against plyvel on the same work, from Python: what kura's binding costs per call.

Both open a LevelDB database in a host directory (kura.DB through kura-kv's C++ bridge, plyvel
through its Cython one, the same libleveldb underneath); kura.DB's native engine runs the same
work on a file: image for reference. Each round runs every store once, in turn (interleaved, so
machine load hits all alike); the rounds' median and spread are printed, and each kura figure
as a ratio to plyvel's median. Work per round: N puts (one call each, no sync), N gets in random
order, one full forward iteration and one reverse iteration over a prefix holding about a tenth
of the keys.

    cargo build -p kura-pystore && mkdir -p /tmp/ks && cp target/debug/libkura_store.so /tmp/ks/kura.so
    PYTHONPATH=/tmp/ks python3 crates/pystore/examples/db_vs_plyvel.py [N] [ROUNDS]

A debug build of the module measures a debug build: use the pip-installed (release) module
(`pip install ./crates/pystore`) for figures about the released code.
"""

import os
import random
import shutil
import statistics
import sys
import tempfile
import time

import plyvel

import kura


def work(db, keys, order):
    times = {}
    start = time.perf_counter()
    for k in keys:
        db.put(k, k * 4)
    times["put"] = time.perf_counter() - start
    start = time.perf_counter()
    for k in order:
        if db.get(k) is None:
            raise AssertionError(k)
    times["get"] = time.perf_counter() - start
    start = time.perf_counter()
    n = sum(1 for _ in db.iterator())
    times["iterate"] = time.perf_counter() - start
    if n != len(keys):
        raise AssertionError(n)
    start = time.perf_counter()
    sum(1 for _ in db.iterator(prefix=b"k3", reverse=True, include_value=False))
    times["prefix_reverse"] = time.perf_counter() - start
    return times


def main():
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 20000
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 5
    rng = random.Random(1)
    keys = [b"k%08d" % rng.randrange(10**8) for _ in range(n)]
    keys = sorted(set(keys))
    rng.shuffle(keys)
    order = list(keys)
    rng.shuffle(order)
    base = tempfile.mkdtemp(prefix="db_vs_plyvel.")
    stores = {
        "plyvel": lambda r: plyvel.DB(f"{base}/plyvel-{r}", create_if_missing=True),
        "kura.DB leveldb": lambda r: kura.DB(f"{base}/kura-{r}", engine="leveldb", create_if_missing=True),
        "kura.DB native": lambda r: kura.DB(
            "/", engine="native", dev=f"file:{base}/native-{r}.img?size=256M", create_if_missing=True
        ),
    }
    results = {name: [] for name in stores}
    try:
        for r in range(rounds):
            for name, open_db in stores.items():
                db = open_db(r)
                try:
                    results[name].append(work(db, keys, order))
                finally:
                    db.close()
    finally:
        shutil.rmtree(base)
    print(f"keys={len(keys)} rounds={rounds} python={sys.version.split()[0]} module={kura.__file__}")
    print("peer command: plyvel.DB(dir, create_if_missing=True) with the same calls")
    for op in ["put", "get", "iterate", "prefix_reverse"]:
        peer = statistics.median(t[op] for t in results["plyvel"])
        for name in stores:
            ts = [t[op] for t in results[name]]
            med = statistics.median(ts)
            print(
                f"{op:15s} {name:16s} median {med * 1e3:8.1f} ms  spread {min(ts) * 1e3:7.1f}-{max(ts) * 1e3:7.1f} ms"
                f"  x{med / peer:5.2f} of plyvel"
            )


if __name__ == "__main__":
    os.environ.setdefault("PYTHONHASHSEED", "0")
    main()
