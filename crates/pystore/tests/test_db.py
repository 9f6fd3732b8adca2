"""kura.DB, plyvel's API over both engines (LevelDB through kura-kv, kura's native store).

Run by tests/python.rs, which copies the extension as kura.so onto PYTHONPATH, formats an AccelFS
image (KURA_TEST_ACCELFS_IMAGE) and sets KURA_TEST_NO_LEVELDB / KURA_TEST_NO_PLYVEL only after
skipping through kura_testkit (so where LevelDB or plyvel is missing, CI fails rather than skips).
"""

import gc
import os
import random
import threading

import pytest

import kura

NO_LEVELDB = bool(os.environ.get("KURA_TEST_NO_LEVELDB"))
NO_PLYVEL = NO_LEVELDB or bool(os.environ.get("KURA_TEST_NO_PLYVEL"))
ACCELFS = os.environ.get("KURA_TEST_ACCELFS_IMAGE")

# "leveldb": a host directory; "leveldb-accelfs": a directory inside the AccelFS image;
# "native": the raw device.
ENGINES = [
    pytest.param("leveldb", marks=pytest.mark.skipif(NO_LEVELDB, reason="no LevelDB (kura_testkit skip logged)")),
    pytest.param(
        "leveldb-accelfs",
        marks=pytest.mark.skipif(NO_LEVELDB or not ACCELFS, reason="no LevelDB or AccelFS image (kura_testkit skip logged)"),
    ),
    "native",
]
needs_plyvel = pytest.mark.skipif(NO_PLYVEL, reason="no plyvel or LevelDB (kura_testkit skip logged)")


class Where:
    """Where one test's database lives, for each engine."""

    def __init__(self, engine, tmp_path, name):
        self.engine = engine
        self.tmp_path = tmp_path
        # Each test gets its own directory inside the shared AccelFS image.
        self.fs_dir = "/" + "".join(c if c.isalnum() else "_" for c in name)

    def open(self, create_if_missing=True, **options):
        if self.engine == "leveldb":
            return kura.DB(str(self.tmp_path / "ldb"), engine="leveldb", create_if_missing=create_if_missing, **options)
        if self.engine == "leveldb-accelfs":
            return kura.DB(self.fs_dir, engine="leveldb", dev=f"file:{ACCELFS}", create_if_missing=create_if_missing, **options)
        spec = f"file:{self.tmp_path / 'native.img'}?size=64M"
        return kura.DB("/", engine="native", dev=spec, create_if_missing=create_if_missing, **options)


@pytest.fixture(params=ENGINES)
def where(request, tmp_path):
    return Where(request.param, tmp_path, request.node.name)


def test_round_trip_and_reopen(where):
    with where.open() as db:
        assert not db.closed
        assert db.get(b"a") is None and db.get(b"a", b"dflt") == b"dflt"
        db.put(b"a", b"1")
        db.put(b"b", b"2", sync=True)
        db.put(b"empty", b"")
        binary = bytes(range(256))
        db.put(binary, binary * 64)
        db.put(b"gone", b"x")
        db.delete(b"gone")
        db.delete(b"gone", sync=True)
        db.delete(b"never-there")
        for i in range(30):
            db.put(b"over", b"%d" % i)
        assert db.get(b"a") == b"1" and db.get(b"b") == b"2" and db.get(b"empty") == b""
        assert db.get(b"gone") is None and db.get(b"over") == b"29"
        assert "kura.DB(" in repr(db) and db.engine in repr(db)
    assert db.closed and "closed" in repr(db)
    db.close()  # twice is fine
    with where.open(create_if_missing=False) as db:
        assert db.get(b"a") == b"1" and db.get(b"empty") == b"" and db.get(b"gone") is None
        assert db.get(bytes(range(256))) == bytes(range(256)) * 64
        assert list(db.iterator(include_value=False)) == sorted([b"a", b"b", b"empty", b"over", bytes(range(256))])


def test_write_batch_plyvel_semantics(where):
    with where.open() as db:
        db.put(b"old", b"x")
        with db.write_batch() as wb:
            wb.put(b"k1", b"v1")
            wb.delete(b"old")
            wb.put(b"k2", b"v2")
            assert len(wb) == 3
            # Nothing is written before the block ends.
            assert db.get(b"k1") is None and db.get(b"old") == b"x"
        assert db.get(b"k1") == b"v1" and db.get(b"k2") == b"v2" and db.get(b"old") is None

        # Without transaction=True a batch is written even when the block raises (as plyvel).
        with pytest.raises(RuntimeError):
            with db.write_batch() as wb:
                wb.put(b"written", b"anyway")
                raise RuntimeError("boom")
        assert db.get(b"written") == b"anyway"

        # With transaction=True it is dropped.
        with pytest.raises(RuntimeError):
            with db.write_batch(transaction=True, sync=True) as wb:
                wb.put(b"dropped", b"x")
                wb.delete(b"k1")
                raise RuntimeError("boom")
        assert db.get(b"dropped") is None and db.get(b"k1") == b"v1"

        wb = db.write_batch(sync=True)
        wb.put(b"later", b"1")
        wb.put(b"cleared", b"1")
        wb.clear()
        wb.put(b"later", b"2")
        wb.write()
        assert len(wb) == 0 and db.get(b"later") == b"2" and db.get(b"cleared") is None
        wb.write()  # empty: nothing to do
    with where.open(create_if_missing=False) as db:
        assert db.get(b"later") == b"2" and db.get(b"written") == b"anyway" and db.get(b"dropped") is None


def test_snapshot_isolation_and_release(where):
    with where.open() as db:
        for i in range(700):  # more than one iterator page
            db.put(b"k%04d" % i, b"v%d" % i)
        snap = db.snapshot()
        db.put(b"k0000", b"changed")
        db.delete(b"k0001")
        db.put(b"new", b"n")
        with db.write_batch() as wb:
            for i in range(700, 800):
                wb.put(b"k%04d" % i, b"late")
        assert snap.get(b"k0000") == b"v0" and snap.get(b"k0001") == b"v1"
        assert snap.get(b"new") is None and snap.get(b"new", b"d") == b"d"
        seen = list(snap.iterator())
        assert seen == [(b"k%04d" % i, b"v%d" % i) for i in range(700)]
        assert list(snap.iterator(reverse=True, include_value=False)) == [b"k%04d" % i for i in reversed(range(700))]
        assert db.get(b"k0000") == b"changed"
        it = snap.iterator(start=b"k0100")
        assert next(it) == (b"k0100", b"v100")
        snap.close()
        snap.close()
        for call in (lambda: snap.get(b"k0000"), lambda: snap.iterator(), lambda: next(it)):
            with pytest.raises(kura.ClosedError):
                call()
        with db.snapshot() as s2:
            assert s2.get(b"k0000") == b"changed"
        with pytest.raises(kura.ClosedError):
            s2.get(b"k0000")
        # Closing the DB releases its snapshots and iterators.
        s3 = db.snapshot()
        it3 = db.iterator()
        assert next(it3) == (b"k0000", b"changed")
    for call in (lambda: s3.get(b"k0000"), lambda: next(it3)):
        with pytest.raises(kura.ClosedError):
            call()


def model_iter(data, reverse=False, start=None, stop=None, include_start=True, include_stop=False, prefix=None, include_key=True, include_value=True):
    """What plyvel yields, computed from a dict."""
    keys = sorted(data)
    if prefix is not None:
        keys = [k for k in keys if k.startswith(prefix)]
    if start is not None:
        keys = [k for k in keys if k > start or (include_start and k == start)]
    if stop is not None:
        keys = [k for k in keys if k < stop or (include_stop and k == stop)]
    if reverse:
        keys.reverse()
    if include_key and include_value:
        return [(k, data[k]) for k in keys]
    return list(keys) if include_key else [data[k] for k in keys]


def random_data(rng, n):
    alphabet = [b"\x00", b"\x01", b"a", b"ab", b"b", b"\xfe", b"\xff"]
    data = {}
    while len(data) < n:
        key = b"".join(rng.choice(alphabet) for _ in range(rng.randint(0, 5))) + b"%d" % rng.randint(0, 9)
        data[key] = bytes(rng.getrandbits(8) for _ in range(rng.randint(0, 20)))
    return data


def compare_with_plyvel(data, cases, plyvel_got, kura_got):
    """kura yields what plyvel does, case by case, except where plyvel 1.5.1 itself departs from
    its documented semantics: a reverse iterator whose range holds exactly one key yields nothing
    when the range's exclusive upper bound is a stored key (seen with start/stop and prefix).
    There kura must give the documented answer. Returns how many cases were such."""
    quirks = 0
    for case, p, k in zip(cases, plyvel_got, kura_got):
        want = model_iter(data, **case)
        assert k == want, case
        if p != want:
            keys = sorted(data)
            one = model_iter(data, **dict(case, include_key=True, include_value=False))
            after = keys[keys.index(one[0]) + 1] if len(one) == 1 and one[0] != keys[-1] else None
            assert case.get("reverse") and len(one) == 1 and p == [] and after is not None, (case, p, want)
            assert case.get("stop") == after or case.get("prefix") is not None, (case, after)
            quirks += 1
    return quirks


def iterator_cases(rng, keys):
    """Argument sets for iterator(): fixed edge cases and random bounds (existing keys and not)."""
    probes = [b"", b"\x00", b"a", b"ab", b"b", b"\xff", b"\xff\xff", b"zz"] + rng.sample(keys, 12)
    cases = [{}, {"reverse": True}, {"include_key": False}, {"include_value": False, "reverse": True}]
    for prefix in [b"", b"a", b"ab", b"\x00", b"\xff", b"\xff\xff", b"nothing"] + [k[:2] for k in rng.sample(keys, 4)]:
        for reverse in (False, True):
            cases.append({"prefix": prefix, "reverse": reverse})
    for _ in range(60):
        case = {"reverse": rng.random() < 0.5}
        if rng.random() < 0.8:
            case["start"] = rng.choice(probes)
            case["include_start"] = rng.random() < 0.5
        if rng.random() < 0.8:
            case["stop"] = rng.choice(probes)
            case["include_stop"] = rng.random() < 0.5
        cases.append(case)
    return cases


def test_iterator_semantics_against_a_model(where):
    rng = random.Random(18)
    data = random_data(rng, 1300)  # pages of 512: ranges cross pages both ways
    with where.open() as db:
        with db.write_batch() as wb:
            for k, v in data.items():
                wb.put(k, v)
        for case in iterator_cases(rng, list(data)):
            assert list(db.iterator(**case)) == model_iter(data, **case), case
        # Iterators see the DB as it was when made, like plyvel's (LevelDB's implicit snapshot).
        it = db.iterator(include_value=False)
        first = next(it)
        db.put(b"\x00\x00late", b"x")
        db.delete(sorted(data)[-1])
        assert [first] + list(it) == sorted(data)
        with db.iterator() as it:
            next(it)
        assert list(it) == []
        with pytest.raises(TypeError):
            db.iterator(include_key=False, include_value=False)
        with pytest.raises(TypeError):
            db.iterator(prefix=b"a", start=b"a")


@needs_plyvel
def test_plyvel_opens_what_kura_wrote_and_iterates_alike(tmp_path):
    import plyvel

    rng = random.Random(7)
    data = random_data(rng, 1100)
    path = str(tmp_path / "interop")
    with kura.DB(path, engine="leveldb", create_if_missing=True) as db:
        with db.write_batch() as wb:
            for k, v in data.items():
                wb.put(k, v)
        db.put(b"synced", b"s", sync=True)
        db.delete(b"synced")
    data_cases = iterator_cases(rng, list(data))
    pdb = plyvel.DB(path)
    try:
        assert dict(pdb.iterator()) == data
        want = [list(pdb.iterator(**case)) for case in data_cases]
        # plyvel writes back; kura must see it.
        pdb.put(b"from-plyvel", b"p")
        pdb.delete(sorted(data)[0])
    finally:
        pdb.close()
    with kura.DB(path, engine="leveldb") as db:
        assert db.get(b"from-plyvel") == b"p" and db.get(sorted(data)[0]) is None
        db.put(sorted(data)[0], data[sorted(data)[0]])
        db.delete(b"from-plyvel")
        got = [list(db.iterator(**case)) for case in data_cases]
    assert compare_with_plyvel(data, data_cases, want, got) <= 3


@needs_plyvel
def test_native_engine_iterates_like_plyvel(tmp_path):
    import plyvel

    rng = random.Random(11)
    data = random_data(rng, 900)
    cases = iterator_cases(rng, list(data))
    pdb = plyvel.DB(str(tmp_path / "peer"), create_if_missing=True)
    try:
        with pdb.write_batch() as wb:
            for k, v in data.items():
                wb.put(k, v)
        want = [list(pdb.iterator(**case)) for case in cases]
        with pdb.snapshot() as snap:
            want_snap = [list(snap.iterator(**case)) for case in cases[:10]]
    finally:
        pdb.close()
    with kura.DB("/", engine="native", dev=f"file:{tmp_path / 'n.img'}?size=64M", create_if_missing=True) as db:
        with db.write_batch() as wb:
            for k, v in data.items():
                wb.put(k, v)
        got = [list(db.iterator(**case)) for case in cases]
        with db.snapshot() as snap:
            got_snap = [list(snap.iterator(**case)) for case in cases[:10]]
    assert compare_with_plyvel(data, cases, want, got) <= 3
    compare_with_plyvel(data, cases[:10], want_snap, got_snap)


def test_errors(where, tmp_path):
    with where.open() as db:
        for bad in (lambda: db.put("str", b"v"), lambda: db.put(b"k", 1), lambda: db.get(None), lambda: db.delete(3)):
            with pytest.raises(TypeError):
                bad()
        # One open handle per database: the engines lock it.
        with pytest.raises(kura.LockedError):
            where.open()
        snap = db.snapshot()
        wb = db.write_batch()
        wb.put(b"k", b"v")
    assert isinstance(kura.LockedError(), kura.Error)
    calls = [
        lambda: db.get(b"k"),
        lambda: db.put(b"k", b"v"),
        lambda: db.delete(b"k"),
        lambda: db.iterator(),
        lambda: db.snapshot(),
        lambda: wb.write(),
        lambda: snap.get(b"k"),
    ]
    for call in calls:
        with pytest.raises(kura.ClosedError):
            call()
    # The lock went with close.
    where.open().close()
    with pytest.raises(TypeError):
        where.open(no_such_option=1)
    with pytest.raises(kura.Error):
        where.open(error_if_exists=True)


def test_open_errors(tmp_path):
    with pytest.raises(ValueError):
        kura.DB(str(tmp_path), engine="rocksdb")
    missing = tmp_path / "missing"
    if not NO_LEVELDB:
        with pytest.raises(kura.NotFoundError):
            kura.DB(str(missing))  # LevelDB is the default engine, as plyvel.DB(path)
        assert not missing.exists(), "a failed open must not create the directory"
        with kura.DB(str(tmp_path / "made"), create_if_missing=True) as db:
            assert db.engine == "leveldb" and db.dev is None
    with pytest.raises(ValueError):
        kura.DB("/", engine="native")  # no dev
    blank = f"file:{tmp_path / 'blank.img'}?size=16M"
    with pytest.raises(ValueError):
        kura.DB("/db", engine="native", dev=blank, create_if_missing=True)
    with pytest.raises(kura.NotFoundError):
        kura.DB("/", engine="native", dev=blank)
    with pytest.raises(ValueError):
        kura.DB("/", engine="native", dev=blank, create_if_missing=True, segment_size=3 << 20)
    with pytest.raises(OSError):
        kura.DB("/", engine="native", dev=f"file:{tmp_path / 'absent.img'}")
    # A device holding something that is not a store is never formatted.
    junk = tmp_path / "junk.img"
    junk.write_bytes(b"precious" * (2 << 20))
    with pytest.raises(kura.CorruptionError):
        kura.DB("/", engine="native", dev=f"file:{junk}", create_if_missing=True)
    assert junk.read_bytes() == b"precious" * (2 << 20)
    with kura.DB("/", engine="native", dev=blank, create_if_missing=True, segment_size=1 << 20, write_buffer_size=1 << 16) as db:
        db.put(b"k", b"v")
    with kura.DB("/", engine="native", dev=blank) as db:
        assert db.get(b"k") == b"v"


@pytest.mark.skipif(NO_LEVELDB, reason="no LevelDB (kura_testkit skip logged)")
def test_leveldb_damage_is_a_corruption_error(tmp_path):
    path = tmp_path / "damaged"
    value = bytes(random.Random(3).getrandbits(8) for _ in range(1000))
    # A small write buffer and no compression: the data goes into table files as written.
    with kura.DB(str(path), engine="leveldb", create_if_missing=True, write_buffer_size=64 << 10, compression=None) as db:
        for i in range(400):
            db.put(b"k%04d" % i, value)
    tables = sorted(path.glob("*.ldb"))
    assert tables, list(path.iterdir())
    for table in tables:
        raw = bytearray(table.read_bytes())
        for at in range(100, len(raw) - 100, 4096):
            raw[at] ^= 0xFF
        table.write_bytes(bytes(raw))
    with pytest.raises(kura.CorruptionError):
        with kura.DB(str(path), engine="leveldb") as db:
            for i in range(400):
                db.get(b"k%04d" % i)
            list(db.iterator())


def test_threads_share_a_db_and_its_snapshots(where):
    with where.open() as db:
        snap = db.snapshot()
        errors = []

        def writer(t):
            try:
                for i in range(200):
                    db.put(b"t%d-%03d" % (t, i), b"%d" % i)
            except Exception as e:  # noqa: BLE001 - reported below
                errors.append(e)

        def reader():
            try:
                for _ in range(20):
                    # A snapshot made on the main thread, read on this one.
                    assert snap.get(b"t0-000") is None
                    assert list(snap.iterator()) == []
            except Exception as e:  # noqa: BLE001
                errors.append(e)

        threads = [threading.Thread(target=writer, args=(t,)) for t in range(4)] + [threading.Thread(target=reader)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert errors == []
        assert len(list(db.iterator())) == 800
        snap.close()


def test_dropped_without_close_lets_go(where):
    db = where.open()
    db.put(b"k", b"v")
    it = db.iterator()
    del db, it
    gc.collect()
    with where.open(create_if_missing=False) as db:
        assert db.get(b"k") == b"v"
        db.put(b"k2", b"v2")
    # An iterator or snapshot keeps its DB open (as in plyvel) until it goes itself.
    it = where.open(create_if_missing=False).iterator()
    assert next(it) == (b"k", b"v")
    with pytest.raises(kura.LockedError):
        where.open()
    assert list(it) == [(b"k2", b"v2")]
    del it
    gc.collect()
    snap = where.open(create_if_missing=False).snapshot()
    gc.collect()
    assert snap.get(b"k2") == b"v2"
    with pytest.raises(kura.LockedError):
        where.open()
    del snap
    gc.collect()
    with where.open(create_if_missing=False) as db:
        assert list(db) == [(b"k", b"v"), (b"k2", b"v2")]


def test_leveldb_engine_reports_availability():
    assert kura.leveldb_available() == (not NO_LEVELDB)
    assert issubclass(kura.UnavailableError, kura.Error)
    assert kura.CorruptionError is kura.CorruptError and kura.IOError is kura.DeviceError
