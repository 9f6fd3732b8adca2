"""kura.Store, the native store's own API in the kura Python module (crates/pystore), against its
documented behaviour.

Run by tests/python.rs, which builds the extension, copies it as kura.so into a temporary
directory and puts that directory on PYTHONPATH.
"""

import gc
import pathlib
import random
import re
import threading

import pytest

import kura

# 1 MiB segments: small images hold enough of them (every open starts a fresh log segment).
SEGMENT = 1 << 20


@pytest.fixture
def image(tmp_path):
    return tmp_path / "kv.img"


def create(image, size="64M", **options):
    return kura.Store(f"file:{image}?size={size}", create=True, segment_size=SEGMENT, **options)


def reopen(image, **options):
    return kura.Store(f"file:{image}", **options)


def test_round_trip_and_mapping_protocol(image):
    with create(image) as db:
        assert db.get(b"a") is None
        assert db.get(b"a", b"dflt") == b"dflt"
        db.put(b"a", b"1")
        db[b"b"] = b"2"
        db.put(b"c", b"", sync=True)
        assert db.get(b"a") == b"1"
        assert db[b"b"] == b"2"
        assert db[b"c"] == b""
        assert b"a" in db and b"zz" not in db
        with pytest.raises(KeyError):
            db[b"zz"]
        del db[b"b"]
        with pytest.raises(KeyError):
            del db[b"b"]
        assert db.get(b"b") is None
        binary = bytes(range(256))
        db[binary] = binary * 100
        assert db[binary] == binary * 100
        assert not db.closed
        assert "kv.img" in repr(db) and db.spec.startswith("file:")
    assert db.closed and "closed" in repr(db)
    with reopen(image) as db:
        assert db[b"a"] == b"1" and db[b"c"] == b"" and b"b" not in db
        assert db[bytes(range(256))] == bytes(range(256)) * 100
        assert db.stats()["replayed_frames"] > 0


def test_overwrite_and_delete(image):
    with create(image) as db:
        for i in range(50):
            db[b"k"] = b"v%d" % i
        assert db[b"k"] == b"v49"
        db.delete(b"k", sync=True)
        db.delete(b"never-there")
        assert db.get(b"k") is None
        db[b"k"] = b"back"
        db.sync()
    with reopen(image) as db:
        assert db[b"k"] == b"back"
        assert list(db.scan()) == [(b"k", b"back")]


def test_write_batch_is_atomic_and_survives_reopen(image):
    with create(image) as db:
        db[b"gone"] = b"x"
        batch = kura.WriteBatch()
        for i in range(100):
            batch.put(b"key%03d" % i, b"val%d" % i)
        batch.delete(b"gone")
        batch.put(b"key000", b"last wins")
        assert len(batch) == 102
        db.write(batch, sync=True)
        assert len(batch) == 0
        db.write(batch)  # an empty batch writes nothing
    with reopen(image) as db:
        assert db[b"key000"] == b"last wins"
        assert db[b"key099"] == b"val99"
        assert b"gone" not in db
        assert len(list(db.scan())) == 100


def test_write_batch_with_block(image):
    with create(image) as db:
        with db.write_batch(sync=True) as b:
            b.put(b"x", b"1")
            b.put(b"y", b"2")
            assert b"x" not in db
        assert db[b"x"] == b"1" and db[b"y"] == b"2"
        with pytest.raises(RuntimeError):
            with db.write_batch() as b:
                b.delete(b"x")
                raise RuntimeError("the block fails: nothing is written")
        assert db[b"x"] == b"1"
        with pytest.raises(TypeError):
            with kura.WriteBatch():
                pass
        bound = db.write_batch()
    with pytest.raises(kura.ClosedError):
        with bound as b:
            b.put(b"z", b"3")


def test_batches_are_seen_whole_by_concurrent_scans(image):
    """A writer sets ten keys to one value per batch; every scan sees one value in all ten."""
    with create(image) as db:
        keys = [b"group%d" % i for i in range(10)]

        def writer():
            for n in range(500):
                batch = kura.WriteBatch()
                for k in keys:
                    batch.put(k, b"%d" % n)
                db.write(batch)

        t = threading.Thread(target=writer)
        t.start()
        try:
            scans = 0
            while t.is_alive() or scans == 0:
                values = {v for _, v in db.scan(start=b"group", end=b"group~")}
                assert len(values) <= 1, values
                scans += 1
        finally:
            t.join()
        assert {v for _, v in db.scan()} == {b"499"}


def model_scan(model, start, end, reverse, limit):
    keys = sorted(k for k in model if (start is None or k >= start) and (end is None or k < end))
    if reverse:
        keys.reverse()
    if limit is not None:
        keys = keys[:limit]
    return [(k, model[k]) for k in keys]


def test_random_ops_against_a_dict_model_with_reopen(image):
    rng = random.Random(18)
    # Keys share prefixes and hold 0x00 and 0xff bytes, where paging past a key is subtle;
    # enough of them live at once that full scans take several pages.
    pool = sorted({bytes(rng.choice(b"ab\x00\xff") for _ in range(rng.randint(1, 9))) for _ in range(1500)})
    model = {}
    # A small write buffer, so the store flushes into sorted runs and merges levels on the way:
    # reads and scans then go through memtable and runs together.
    small = {"memtable_bytes": 32 << 10, "l0_runs": 2}
    db = create(image, size="96M", **small)

    def check_scan():
        start = rng.choice([None, rng.choice(pool)])
        end = rng.choice([None, rng.choice(pool)])
        reverse = rng.random() < 0.5
        limit = rng.choice([None, 0, 1, 7, 600])
        got = list(db.scan(start=start, end=end, reverse=reverse, limit=limit))
        assert got == model_scan(model, start, end, reverse, limit), (start, end, reverse, limit)

    try:
        for step in range(2000):
            if step == 1000:
                db.close()
                db = reopen(image, **small)
            if step == 1500:
                # Compaction keeps what a live snapshot sees.
                with db.snapshot() as snap:
                    before = dict(model)
                    db.put(pool[0], b"after the snapshot")
                    model[pool[0]] = b"after the snapshot"
                    db.compact()
                    assert list(snap.scan()) == model_scan(before, None, None, False, None)
                    assert snap.get(pool[0]) == before.get(pool[0])
                db.compact()
            op = rng.random()
            key = rng.choice(pool)
            if op < 0.55:
                value = rng.randbytes(rng.randint(0, 64))
                db.put(key, value, sync=rng.random() < 0.05)
                model[key] = value
            elif op < 0.7:
                db.delete(key)
                model.pop(key, None)
            elif op < 0.8:
                batch = kura.WriteBatch()
                for _ in range(rng.randint(1, 20)):
                    k = rng.choice(pool)
                    if rng.random() < 0.7:
                        v = rng.randbytes(rng.randint(0, 32))
                        batch.put(k, v)
                        model[k] = v
                    else:
                        batch.delete(k)
                        model.pop(k, None)
                db.write(batch)
            elif op < 0.95:
                assert db.get(key) == model.get(key)
            else:
                check_scan()
        assert len(model) > 600
        stats = db.stats()
        assert stats["flushes"] > 0 and stats["compactions"] >= 2
        assert sum(stats["runs_per_level"]) > 0 and stats["write_amplification"] > 1
        assert list(db.scan()) == model_scan(model, None, None, False, None)
        assert list(db.scan(reverse=True)) == model_scan(model, None, None, True, None)
        for _ in range(50):
            check_scan()
        db.close()
        db = reopen(image)
        assert list(db.scan()) == model_scan(model, None, None, False, None)
        assert all(db.get(k) == model.get(k) for k in pool)
    finally:
        db.close()


def test_snapshot_isolation(image):
    with create(image) as db:
        for i in range(1000):
            db[b"k%04d" % i] = b"old"
        with db.snapshot() as snap:
            scan = db.scan()  # holds its own snapshot from now
            for i in range(0, 1000, 2):
                db[b"k%04d" % i] = b"new"
            db.delete(b"k0001")
            db[b"later"] = b"x"
            assert snap.get(b"k0000") == b"old"
            assert snap.get(b"k0001") == b"old"
            assert snap.get(b"later") is None and b"later" not in snap
            assert snap.get(b"later", 5) == 5
            assert all(v == b"old" for _, v in snap.scan())
            assert len(list(snap.scan())) == 1000
            assert [k for k, _ in snap.scan(end=b"k0003", reverse=True)] == [b"k0002", b"k0001", b"k0000"]
            assert all(v == b"old" for _, v in scan)
            assert db[b"k0000"] == b"new" and b"k0001" not in db
            assert db.stats()["memtable_versions"] > db.stats()["memtable_keys"]
        with pytest.raises(kura.ClosedError):
            snap.get(b"k0000")
        with pytest.raises(kura.ClosedError):
            snap.scan()
        snap.close()  # again: nothing
        # A scan stopped part way is released when the store closes.
        partial = db.snapshot().scan()
        next(partial)
    with pytest.raises(kura.ClosedError):
        next(partial)


def test_errors(image, tmp_path):
    assert issubclass(kura.ClosedError, kura.Error)
    assert issubclass(kura.CorruptError, kura.Error)
    assert issubclass(kura.FullError, kura.Error)
    db = create(image)
    with pytest.raises(TypeError):
        db.put("text", b"v")
    with pytest.raises(TypeError):
        db.put(b"k", 3)
    with pytest.raises(TypeError):
        db.get(None)
    with pytest.raises(TypeError):
        kura.WriteBatch().put(b"k", "v")
    with pytest.raises(kura.RefusedError):
        db.put(b"k" * 5000, b"v")
    snap = db.snapshot()
    db[b"k"] = b"v"
    db.close()
    db.close()  # again: nothing
    for call in [
        lambda: db.get(b"k"),
        lambda: db.put(b"k", b"v"),
        lambda: db.delete(b"k"),
        lambda: db[b"k"],
        lambda: b"k" in db,
        lambda: db.write(kura.WriteBatch()),
        lambda: db.scan(),
        lambda: db.snapshot(),
        lambda: db.sync(),
        lambda: db.stats(),
        lambda: snap.get(b"k"),
    ]:
        with pytest.raises(kura.ClosedError):
            call()
    with pytest.raises(ValueError):
        kura.Store("nosuchkind:/x")
    with pytest.raises(ValueError):
        kura.Store(f"file:{image}", segment_size=SEGMENT)  # only with create=True
    with pytest.raises(ValueError):
        kura.Store(f"file:{tmp_path}/other.img?size=16M", create=True, segment_size=3 << 20)
    with pytest.raises(OSError):
        kura.Store(f"file:{tmp_path}/missing/none.img")


def test_full_store(tmp_path):
    """A device with room for few segments fills up with a typed error, not a crash."""
    db = kura.Store(f"file:{tmp_path}/small.img?size=4M", create=True, segment_size=SEGMENT)
    with pytest.raises(kura.FullError):
        for i in range(10_000):
            db.put(b"%d" % i, b"x" * 1000)
    # Unsynced writes gathered in memory may still need log room at the final sync.
    try:
        db.close()
    except kura.FullError:
        pass
    assert db.closed


def test_corrupt_image_raises_corrupt_error(image):
    with create(image, size="16M") as db:
        db.put(b"k", b"v", sync=True)
    raw = bytearray(image.read_bytes())
    # Copy A damaged: the store opens on copy B and says so.
    damaged = raw.copy()
    damaged[0:4096] = b"\xa5" * 4096
    image.write_bytes(damaged)
    with reopen(image) as db:
        assert db.damage is not None and "copy A" in db.damage
        assert db[b"k"] == b"v"
    # Both copies damaged: a typed error.
    damaged = bytearray(image.read_bytes())
    damaged[0:8192] = b"\x5a" * 8192
    image.write_bytes(damaged)
    with pytest.raises(kura.CorruptError, match="superblock"):
        reopen(image)
    # A device that never held a store.
    blank = image.parent / "blank.img"
    blank.write_bytes(bytes(4 << 20))
    with pytest.raises(kura.CorruptError, match="create=True"):
        reopen(blank)


def test_a_store_dropped_without_close_syncs_and_releases_the_image(image):
    db = create(image)
    db.put(b"k", b"v")
    del db
    gc.collect()
    with reopen(image) as db:
        assert db[b"k"] == b"v"


def test_second_store_on_one_image_is_refused(image):
    with create(image) as db:
        db[b"k"] = b"v"
        with pytest.raises(kura.LockedError, match="in use"):
            reopen(image)
        assert db[b"k"] == b"v"
    with reopen(image) as db:
        assert db[b"k"] == b"v"


def test_threads_put_concurrently(image):
    threads, per_thread = 8, 250
    with create(image) as db:
        errors = []

        def work(t):
            try:
                for i in range(per_thread):
                    db.put(b"t%d-%04d" % (t, i), b"%d" % (t * i), sync=i % 50 == 0)
                    assert db.get(b"t%d-%04d" % (t, i)) == b"%d" % (t * i)
            except Exception as e:  # reported below, with the thread
                errors.append((t, e))

        workers = [threading.Thread(target=work, args=(t,)) for t in range(threads)]
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        assert errors == []
        stats = db.stats()
        assert stats["batches"] == threads * per_thread
        assert 0 < stats["groups"] <= stats["batches"]
        assert stats["memtable_keys"] == threads * per_thread
    with reopen(image) as db:
        got = dict(db.scan())
        assert len(got) == threads * per_thread
        assert all(got[b"t%d-%04d" % (t, i)] == b"%d" % (t * i) for t in range(threads) for i in range(per_thread))


def test_the_usage_example_in_the_crate_docs_runs(tmp_path, capsys):
    lib = pathlib.Path(__file__).parent.parent / "src" / "lib.rs"
    docs = "\n".join(line[4:] if line.startswith("//! ") else line[3:] for line in lib.read_text().splitlines() if line.startswith("//!"))
    examples = re.findall(r"```python\n(.*?)```", docs, re.S)
    assert len(examples) == 2
    for example in examples:
        if "kura.DB(" in example and not kura.leveldb_available():
            continue
        example = example.replace("/tmp/kv.img", str(tmp_path / "kv.img"))
        example = example.replace("/tmp/kv-leveldb", str(tmp_path / "kv-leveldb"))
        example = example.replace("/tmp/kv-native.img", str(tmp_path / "kv-native.img"))
        exec(compile(example, str(lib), "exec"), {})
        out = capsys.readouterr().out
        assert "(b'fig', b'purple')" in out
        if "kura.DB(" in example:
            assert "[(b'cherry', b'dark'), (b'banana', b'yellow')]" in out
            assert "[b'date']" in out
