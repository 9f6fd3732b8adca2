"""Sync puts from 1 and from 8 Python threads on one kura.Store.

Each Store call releases the GIL while the store works, so threads wait for their flush
together and the store's group commit gives one flush to several writers: with 8 threads,
groups (log frames) < batches (puts). Were the GIL held through a put, no two threads could be
inside the store at once and every group would hold one put.

    cargo build -p kura-pystore && mkdir -p /tmp/ks && cp target/debug/libkura_store.so /tmp/ks/kura.so
    PYTHONPATH=/tmp/ks python3 crates/pystore/examples/sync_threads.py [DIR]
"""

import os
import sys
import tempfile
import threading
import time

import kura


def run(threads, puts, spec):
    with kura.Store(spec, create=True, segment_size=1 << 20) as db:

        def work(t):
            for i in range(puts // threads):
                db.put(b"t%d-%d" % (t, i), b"x" * 100, sync=True)

        workers = [threading.Thread(target=work, args=(t,)) for t in range(threads)]
        start = time.perf_counter()
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        elapsed = time.perf_counter() - start
        stats = db.stats()
    print(
        f"threads={threads} sync_puts={stats['batches']} groups={stats['groups']} "
        f"flushes={stats['syncs']} seconds={elapsed:.2f} puts_per_s={stats['batches'] / elapsed:.0f}"
    )


def main():
    with tempfile.TemporaryDirectory(dir=sys.argv[1] if len(sys.argv) > 1 else None) as d:
        for threads in (1, 8):
            run(threads, 1600, f"file:{os.path.join(d, f'threads{threads}.img')}?size=256M")


if __name__ == "__main__":
    main()
