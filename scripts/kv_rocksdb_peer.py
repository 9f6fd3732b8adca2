#!/usr/bin/env python3
"""Replay a kura workload trace against RocksDB (the peer of `kura bench kv`).

The trace is the binary format of `crates/workload/src/trace.rs` (version 1): a header naming
the workload, its sync flag and the seed of the value pool, then phase markers (`load`, `run`)
and operations (insert, read, update, scan, read-modify-write, delete), then an end record with
the operation count. Values are windows of a pool of SplitMix64 bytes that this script rebuilds
from the seed, so RocksDB receives exactly the keys and value bytes kura's stores do.

RocksDB is driven through the `rocksdict` PyPI package in raw mode (bytes keys and values), with
compression off and a block cache of `--cache-bytes`. Each operation is timed with
`time.perf_counter_ns`; throughput counts wall time spent executing operations (trace parsing and
value slicing are outside it). Prints one JSON object on stdout:

  {"ops": N, "seconds": S, "ops_per_s": X, "p50_us": ..., "p99_us": ..., "p999_us": ...,
   "by_op": {"read": {"ops": .., "p50_us": .., "p99_us": .., "p999_us": .., "found": ..}, ...},
   "load": {same fields, for the load phase, or null}, "workload": name, "sync": bool, ...}

The top-level figures are the `run` phase's. Scans also report `entries` (records returned) and
`entries_per_s` (entries over the time spent in scans: db_bench `readseq`'s throughput, since
that workload is one scan); reads and read-modify-writes report `found` (keys that existed).

Exit status: 0 on success; 2 for a usage problem, an unreadable or malformed trace, a non-empty
database directory (without --reuse), or rocksdict missing; 1 for an unexpected RocksDB error.

Example:
  python3 scripts/kv_rocksdb_peer.py --trace /tmp/ycsb-a.trace --db /tmp/rocks \
      --cache-bytes 8388608
"""

import argparse
import json
import math
import os
import struct
import sys
import time
from array import array
from itertools import islice

MAGIC = b"KURAWKLD"
VERSION = 1
FLAG_SYNC = 1
KEY_CAP = 31
HEADER_FIXED = struct.Struct("<8sHHQIQB")  # magic, version, flags, seed, pool_len, check, name_len
MAX_POOL = 128 << 20

INSERT, READ, UPDATE, SCAN, RMW, DELETE = 0x01, 0x02, 0x03, 0x04, 0x05, 0x06
PHASE, END = 0x50, 0x45
OP_NAMES = {INSERT: "insert", READ: "read", UPDATE: "update", SCAN: "scan", RMW: "rmw",
            DELETE: "delete"}
WITH_VALUE = (INSERT, UPDATE, RMW)

BATCH = 8192
SCAN_CHUNK = 1024
MASK64 = (1 << 64) - 1


class TraceError(Exception):
    """A malformed trace."""


def die(message, code=2):
    print(f"kv_rocksdb_peer: {message}", file=sys.stderr)
    sys.exit(code)


def read_header(buf):
    """Parse the header; return (header dict, offset of the first record)."""
    if len(buf) < HEADER_FIXED.size:
        raise TraceError("file too short for a trace header")
    magic, version, flags, seed, pool_len, check, name_len = HEADER_FIXED.unpack_from(buf, 0)
    if magic != MAGIC:
        raise TraceError("not a kura workload trace (bad magic)")
    if version != VERSION:
        raise TraceError(f"unsupported trace version {version} (this script reads {VERSION})")
    if flags & ~FLAG_SYNC:
        raise TraceError(f"unknown trace flags {flags:#x}")
    if pool_len > MAX_POOL:
        raise TraceError(f"value pool of {pool_len} bytes is over the limit")
    off = HEADER_FIXED.size
    if len(buf) < off + name_len:
        raise TraceError("trace truncated in the header")
    try:
        name = bytes(buf[off:off + name_len]).decode("utf-8")
    except UnicodeDecodeError as e:
        raise TraceError("workload name is not UTF-8") from e
    header = {"name": name, "sync": bool(flags & FLAG_SYNC), "seed": seed,
              "pool_len": pool_len, "pool_check": check}
    return header, off + name_len


def build_pool(seed, length):
    """The value pool: little-endian SplitMix64 words from `seed`, truncated to `length`."""
    words = (length + 7) // 8
    out = [0] * words
    s = seed
    for i in range(words):
        s = (s + 0x9E3779B97F4A7C15) & MASK64
        z = s
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
        out[i] = z ^ (z >> 31)
    return struct.pack(f"<{words}Q", *out)[:length]


def check_word(pool):
    tail = pool[-8:]
    return int.from_bytes(tail + bytes(8 - len(tail)), "little")


def parse_batches(buf, off, pool_len):
    """Yield lists of up to BATCH records: (code, key, a, b). For writes a = value length,
    b = pool offset; for scans a = count; for phases key = the name. Validates as it goes and
    checks the end record."""
    u8 = buf.__getitem__
    two_u32 = struct.Struct("<II").unpack_from
    one_u64 = struct.Struct("<Q").unpack_from
    n = len(buf)
    ops = 0
    batch = []
    while True:
        if off >= n:
            raise TraceError(f"trace truncated at byte {off} (no end record)")
        start = off
        code = u8(off)
        off += 1
        if code == END:
            if off + 8 > n:
                raise TraceError(f"trace truncated at byte {off}")
            (declared,) = one_u64(buf, off)
            off += 8
            if declared != ops:
                raise TraceError(f"end record declares {declared} operations, trace holds {ops}")
            if off != n:
                raise TraceError(f"bytes after the end record at byte {off}")
            if batch:
                yield batch
            return
        if code == PHASE:
            if off >= n:
                raise TraceError(f"trace truncated at byte {off}")
            ln = u8(off)
            off += 1
            if off + ln > n:
                raise TraceError(f"trace truncated at byte {off}")
            try:
                name = bytes(buf[off:off + ln]).decode("utf-8")
            except UnicodeDecodeError as e:
                raise TraceError(f"phase name at byte {off} is not UTF-8") from e
            off += ln
            batch.append((PHASE, name, 0, 0))
            continue
        if code not in OP_NAMES:
            raise TraceError(f"unknown record code {code:#04x} at byte {start}")
        if off >= n:
            raise TraceError(f"trace truncated at byte {off}")
        klen = u8(off)
        off += 1
        if klen == 0 or klen > KEY_CAP:
            raise TraceError(f"bad key length {klen} at byte {start}")
        if off + klen > n:
            raise TraceError(f"trace truncated at byte {off}")
        key = bytes(buf[off:off + klen])
        off += klen
        a = b = 0
        if code in WITH_VALUE:
            if off + 8 > n:
                raise TraceError(f"trace truncated at byte {off}")
            a, b = two_u32(buf, off)
            off += 8
            if a + b > pool_len:
                raise TraceError(f"value outside the value pool at byte {start}")
        elif code == SCAN:
            if off + 8 > n:
                raise TraceError(f"trace truncated at byte {off}")
            (a,) = one_u64(buf, off)
            off += 8
        ops += 1
        batch.append((code, key, a, b))
        if len(batch) >= BATCH:
            yield batch
            batch = []


def percentile(sorted_ns, p):
    """Nearest-rank percentile of sorted nanosecond samples, in microseconds."""
    if not sorted_ns:
        return 0.0
    idx = max(0, math.ceil(p * len(sorted_ns)) - 1)
    return round(sorted_ns[idx] / 1000.0, 3)


def summarize(phase):
    all_ns = []
    by_op = {}
    for code, lat in sorted(phase["lat"].items()):
        s = sorted(lat)
        all_ns.extend(s)
        entry = {"ops": len(s), "p50_us": percentile(s, 0.50), "p99_us": percentile(s, 0.99),
                 "p999_us": percentile(s, 0.999)}
        if code in (READ, RMW):
            entry["found"] = phase["found"].get(code, 0)
        if code == SCAN:
            busy = sum(s) / 1e9
            entry["entries"] = phase["entries"]
            entry["entries_per_s"] = round(phase["entries"] / busy, 1) if busy > 0 else 0.0
        by_op[OP_NAMES[code]] = entry
    all_ns.sort()
    ops = len(all_ns)
    seconds = phase["ns"] / 1e9
    return {"ops": ops, "seconds": round(seconds, 6),
            "ops_per_s": round(ops / seconds, 1) if seconds > 0 else 0.0,
            "p50_us": percentile(all_ns, 0.50), "p99_us": percentile(all_ns, 0.99),
            "p999_us": percentile(all_ns, 0.999), "by_op": by_op}


def new_phase():
    return {"lat": {}, "found": {}, "entries": 0, "ns": 0}


def replay(db, batches, pool, write_opt):
    """Run every batch against db; return {phase name: raw stats}."""
    now = time.perf_counter_ns
    get, put, delete, items = db.get, db.put, db.delete, db.items
    phases = {}
    cur = phases.setdefault("run", new_phase())
    for batch in batches:
        lat_of = cur["lat"]
        found_of = cur["found"]
        batch_start = now()
        for code, key, a, b in batch:
            if code == PHASE:
                cur["ns"] += now() - batch_start
                cur = phases.setdefault(key, new_phase())
                lat_of, found_of = cur["lat"], cur["found"]
                batch_start = now()
                continue
            if code == READ:
                t0 = now()
                v = get(key)
                t1 = now()
                if v is not None:
                    found_of[READ] = found_of.get(READ, 0) + 1
            elif code == INSERT or code == UPDATE:
                value = pool[b:b + a]
                t0 = now()
                put(key, value, write_opt)
                t1 = now()
            elif code == SCAN:
                # Keys and values are materialized (as a scan must read them) in chunks, so a
                # full-database readseq never holds more than SCAN_CHUNK records at once.
                t0 = now()
                pairs = items(from_key=key)
                got = 0
                while got < a:
                    step = min(a - got, SCAN_CHUNK)
                    n = len(list(islice(pairs, step)))
                    got += n
                    if n < step:
                        break
                del pairs
                t1 = now()
                cur["entries"] += got
            elif code == RMW:
                value = pool[b:b + a]
                t0 = now()
                v = get(key)
                put(key, value, write_opt)
                t1 = now()
                if v is not None:
                    found_of[RMW] = found_of.get(RMW, 0) + 1
            else:  # DELETE
                t0 = now()
                delete(key, write_opt)
                t1 = now()
            lat = lat_of.get(code)
            if lat is None:
                lat = lat_of[code] = array("q")
            lat.append(t1 - t0)
        cur["ns"] += now() - batch_start
    return phases


def rocksdict_version():
    try:
        from importlib.metadata import version
        return version("rocksdict")
    except Exception:
        return None


def main():
    ap = argparse.ArgumentParser(description="Replay a kura workload trace against RocksDB "
                                             "(rocksdict) and print one JSON object.")
    ap.add_argument("--trace", required=True, help="trace file written by kura-workload")
    ap.add_argument("--db", required=True, help="database directory (absent or empty)")
    ap.add_argument("--cache-bytes", type=int, default=8 << 20,
                    help="block cache size in bytes (0 disables it; default 8 MiB)")
    ap.add_argument("--sync", action=argparse.BooleanOptionalAction, default=None,
                    help="sync every write (default: the trace's flag, set for fillsync)")
    ap.add_argument("--write-buffer-bytes", type=int, default=None,
                    help="memtable size in bytes (default: RocksDB's)")
    ap.add_argument("--reuse", action="store_true",
                    help="allow a non-empty --db directory (replay onto existing data)")
    args = ap.parse_args()
    if args.cache_bytes < 0:
        die("--cache-bytes must be >= 0")

    try:
        with open(args.trace, "rb") as f:
            buf = f.read()
    except OSError as e:
        die(f"cannot read trace {args.trace}: {e}")
    try:
        header, first = read_header(buf)
    except TraceError as e:
        die(f"bad trace {args.trace}: {e}")
    if os.path.isdir(args.db) and os.listdir(args.db) and not args.reuse:
        die(f"database directory {args.db} is not empty (pass --reuse to replay onto it)")

    try:
        from rocksdict import (BlockBasedOptions, Cache, DBCompressionType, Options, Rdict,
                               WriteOptions)
    except ImportError as e:
        die(f"rocksdict is not installed ({e}); install it with: python3 -m pip install rocksdict")

    pool = build_pool(header["seed"], header["pool_len"])
    if check_word(pool) != header["pool_check"]:
        die("rebuilt value pool does not match the trace's check word")
    # The trace is parsed in batches of 8192 records while it is replayed (memory stays flat
    # whatever its length); parsing happens between batches, outside the timed region.
    batches = parse_batches(buf, first, header["pool_len"])

    sync = header["sync"] if args.sync is None else args.sync
    opts = Options(raw_mode=True)
    opts.create_if_missing(True)
    opts.set_compression_type(DBCompressionType.none())
    opts.set_bottommost_compression_type(DBCompressionType.none())
    if args.write_buffer_bytes:
        opts.set_write_buffer_size(args.write_buffer_bytes)
    table = BlockBasedOptions()
    if args.cache_bytes > 0:
        table.set_block_cache(Cache(args.cache_bytes))
    else:
        table.disable_cache()
    opts.set_block_based_table_factory(table)
    write_opt = WriteOptions()
    write_opt.sync = sync

    os.makedirs(args.db, exist_ok=True)
    try:
        db = Rdict(args.db, opts)
    except Exception as e:  # rocksdict raises plain exceptions for RocksDB errors
        die(f"cannot open RocksDB at {args.db}: {e}", 1)
    try:
        phases = replay(db, batches, pool, write_opt)
    except TraceError as e:
        die(f"bad trace {args.trace}: {e}")
    except Exception as e:
        die(f"RocksDB error during replay: {e}", 1)
    finally:
        db.close()

    run = summarize(phases.pop("run", new_phase()))
    load = phases.pop("load", None)
    result = dict(run)
    result["load"] = summarize(load) if load is not None else None
    for name, extra in phases.items():
        result[name] = summarize(extra)
    result.update({"engine": "rocksdb", "rocksdict": rocksdict_version(),
                   "workload": header["name"], "sync": sync, "cache_bytes": args.cache_bytes,
                   "value_pool_bytes": header["pool_len"]})
    json.dump(result, sys.stdout)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
