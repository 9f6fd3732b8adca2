//! `kura kv` run as a program: put/get/del/scan, import/export in every line format with binary
//! data, malformed input refused whole, on LevelDB (host directory and AccelFS) and the native
//! store (raw device); a LevelDB made by `kura kv` read back by plyvel.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn kura(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_kura"))
        .args(args)
        .output()
        .expect("running kura")
}

fn ok(args: &[&str]) -> String {
    let o = kura(args);
    assert!(
        o.status.success(),
        "kura {args:?} failed: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8(o.stdout).expect("utf-8 output")
}

/// A store under test: the arguments naming it after the subcommand.
struct Db {
    at: Vec<String>,
}

impl Db {
    fn leveldb_dir(dir: &Path) -> Db {
        Db {
            at: vec![dir.to_str().expect("utf-8 path").to_string()],
        }
    }

    fn leveldb_accelfs(tmp: &Path) -> Db {
        let spec = format!("file:{}?size=64M", tmp.join("fs.img").display());
        ok(&["mkfs", &spec, "--block-size", "4K"]);
        Db {
            at: vec!["--dev".into(), spec, "/db".into()],
        }
    }

    fn native(tmp: &Path) -> Db {
        // Sparse; 1 MiB segments, since every writing command takes a fresh one (see init).
        let spec = format!("file:{}?size=256M", tmp.join("native.img").display());
        let at = vec![
            "--engine".into(),
            "native".into(),
            "--dev".into(),
            spec,
            "/".into(),
        ];
        let db = Db { at };
        db.ok("init", &["--segment-size", "1M"]);
        db
    }

    fn args<'a>(&'a self, cmd: &'a str, rest: &[&'a str]) -> Vec<&'a str> {
        let mut v = vec!["kv", cmd];
        v.extend(self.at.iter().map(String::as_str));
        v.extend_from_slice(rest);
        v
    }

    fn ok(&self, cmd: &str, rest: &[&str]) -> String {
        ok(&self.args(cmd, rest))
    }

    fn run(&self, cmd: &str, rest: &[&str]) -> Output {
        kura(&self.args(cmd, rest))
    }
}

fn leveldb_here(test: &str) -> bool {
    if kura_kv::leveldb_available() {
        return true;
    }
    kura_testkit::skip(test, "libleveldb-dev", "kura was built without LevelDB");
    false
}

fn basics(db: &Db) {
    db.ok("put", &["alpha", "1"]);
    db.ok("put", &["beta", "two words"]);
    db.ok("put", &["gamma", "3"]);
    assert_eq!(db.ok("get", &["beta"]), "two words\n");
    db.ok("put", &["beta", "2"]);
    assert_eq!(db.ok("get", &["beta"]), "2\n");
    db.ok("del", &["beta"]);
    let o = db.run("get", &["beta"]);
    assert_eq!(o.status.code(), Some(1), "absent key: exit 1");
    assert!(String::from_utf8_lossy(&o.stderr).contains("not found"));
    assert!(o.stdout.is_empty());
    assert_eq!(db.ok("scan", &[]), "alpha\t1\ngamma\t3\n");
    // Binary key and value through --hex.
    db.ok("put", &["--hex", "00ff0a", "09805c"]);
    assert_eq!(db.ok("get", &["--hex", "00ff0a"]), "09805c\n");
    assert!(db.ok("check", &[]).contains("ok: 3 keys"));
    assert!(!db.ok("stats", &[]).is_empty());
}

fn scans(db: &Db, tmp: &Path) {
    // One import rather than ten puts: each command is a process that opens the store.
    let tsv: String = (0..10).map(|i| format!("k{i}\tv{i}\n")).collect();
    let file = tmp.join("ten.tsv");
    std::fs::write(&file, tsv).expect("test file I/O");
    db.ok("import", &[file.to_str().expect("utf-8 path")]);
    let keys = |out: String| -> Vec<String> {
        out.lines()
            .map(|l| l.split('\t').next().unwrap_or_default().to_string())
            .collect()
    };
    assert_eq!(
        keys(db.ok("scan", &["--from", "k3", "--to", "k7"])),
        ["k3", "k4", "k5", "k6"]
    );
    assert_eq!(keys(db.ok("scan", &["--limit", "3"])), ["k0", "k1", "k2"]);
    assert_eq!(
        keys(db.ok("scan", &["--reverse", "--limit", "2"])),
        ["k9", "k8"]
    );
    assert_eq!(
        keys(db.ok(
            "scan",
            &["--from", "k3", "--to", "k7", "--reverse", "--limit", "3"]
        )),
        ["k6", "k5", "k4"]
    );
    assert!(db.ok("scan", &["--from", "k9~"]).is_empty());
    assert!(db.ok("scan", &["--limit", "0"]).is_empty());
}

/// Pairs with every byte value, separators and invalid UTF-8 in keys and values.
fn binary_pairs() -> Vec<(Vec<u8>, Vec<u8>)> {
    let mut pairs: Vec<(Vec<u8>, Vec<u8>)> = (0..=255u8)
        .map(|b| (vec![b'b', b], vec![b, b'\t', b'\n', b'\\', 0xc3, b]))
        .collect();
    pairs.push((b"plain".to_vec(), "naïve \\ text".as_bytes().to_vec()));
    pairs.push((b"empty".to_vec(), Vec::new()));
    pairs.sort();
    pairs
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn hex_file(pairs: &[(Vec<u8>, Vec<u8>)]) -> String {
    pairs
        .iter()
        .map(|(k, v)| format!("{}\t{}\n", hex(k), hex(v)))
        .collect()
}

fn import_export(mk: &dyn Fn(&str) -> Db, tmp: &Path) {
    let pairs = binary_pairs();
    let src = tmp.join("in.hex");
    std::fs::write(&src, hex_file(&pairs)).expect("test file I/O");

    // hex in, hex out: the same bytes.
    let a = mk("a");
    a.ok("import", &["--hex", src.to_str().expect("utf-8 path")]);
    assert_eq!(a.ok("export", &["--hex"]), hex_file(&pairs));

    // TSV out of a, into b, out again: identical, and b holds the same pairs.
    let tsv = tmp.join("a.tsv");
    a.ok("export", &[tsv.to_str().expect("utf-8 path")]);
    let tsv_text = std::fs::read(&tsv).expect("test file I/O");
    assert_eq!(
        tsv_text.iter().filter(|&&c| c == b'\n').count(),
        pairs.len()
    );
    let b = mk("b");
    b.ok("import", &[tsv.to_str().expect("utf-8 path")]);
    assert_eq!(b.ok("export", &["--hex"]), hex_file(&pairs));
    assert_eq!(b.ok("export", &[]).into_bytes(), tsv_text);

    // JSON lines: text only without --hex (refused with a pointer to --hex), any bytes with it.
    let o = b.run("export", &["--jsonl"]);
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("--jsonl --hex"));
    let jl = tmp.join("b.jsonl");
    b.ok(
        "export",
        &["--jsonl", "--hex", jl.to_str().expect("utf-8 path")],
    );
    let c = mk("c");
    c.ok(
        "import",
        &["--jsonl", "--hex", jl.to_str().expect("utf-8 path")],
    );
    assert_eq!(c.ok("export", &["--hex"]), hex_file(&pairs));

    let text = tmp.join("text.jsonl");
    std::fs::write(
        &text,
        "{\"key\": \"k1\", \"value\": \"tab\\there\"}\n\n{\"key\": \"k2\", \"value\": \"ü\"}\n",
    )
    .expect("test file I/O");
    let d = mk("d");
    d.ok("import", &["--jsonl", text.to_str().expect("utf-8 path")]);
    assert_eq!(
        d.ok("export", &["--jsonl"]),
        "{\"key\":\"k1\",\"value\":\"tab\\there\"}\n{\"key\":\"k2\",\"value\":\"ü\"}\n"
    );
    assert_eq!(d.ok("scan", &[]), "k1\ttab\\there\nk2\tü\n");
}

fn malformed(db: &Db, tmp: &Path) {
    let cases: [(&str, &[&str], &str); 5] = [
        ("k1\tv1\nk2\tv2\nk3 no tab\n", &[], "line 3"),
        ("k1\tv1\nk2\tv\\q\n", &[], "line 2"),
        ("k1\tv1\nk2\tv2\textra\n", &[], "line 2"),
        ("00\t11\nzz\t11\n", &["--hex"], "line 2"),
        (
            "{\"key\":\"k1\",\"value\":\"v\"}\n{\"key\":1}\n",
            &["--jsonl"],
            "line 2",
        ),
    ];
    for (i, (content, flags, says)) in cases.iter().enumerate() {
        let f = tmp.join(format!("bad{i}"));
        std::fs::write(&f, content).expect("test file I/O");
        let mut args = flags.to_vec();
        args.push(f.to_str().expect("utf-8 path"));
        let o = db.run("import", &args);
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success(), "case {i} imported");
        assert!(err.contains(says), "case {i}: {err}");
        assert!(err.contains("nothing was imported"), "case {i}: {err}");
        assert!(!err.contains("panicked"), "case {i}: {err}");
    }
    // Every case's first line was valid, and none of it went in.
    assert_eq!(db.run("get", &["k1"]).status.code(), Some(1));
    assert_eq!(db.run("get", &["--hex", "00"]).status.code(), Some(1));
}

fn tmp() -> tempfile::TempDir {
    tempfile::tempdir().expect("temp dir")
}

#[test]
fn leveldb_host_dir_put_get_del_scan() {
    if !leveldb_here("leveldb_host_dir_put_get_del_scan") {
        return;
    }
    let t = tmp();
    basics(&Db::leveldb_dir(&t.path().join("db")));
    scans(&Db::leveldb_dir(&t.path().join("db2")), t.path());
    // Reading commands do not create a database at a mistyped path.
    let missing = t.path().join("missing");
    assert!(!Db::leveldb_dir(&missing)
        .run("get", &["k"])
        .status
        .success());
    assert!(!missing.exists());
    assert!(Db::leveldb_dir(&t.path().join("db"))
        .ok("compact", &[])
        .contains("compacted"));
}

#[test]
fn leveldb_on_accelfs_put_get_del_scan() {
    if !leveldb_here("leveldb_on_accelfs_put_get_del_scan") {
        return;
    }
    let t = tmp();
    let db = Db::leveldb_accelfs(t.path());
    basics(&db);
    db.ok("compact", &[]);
    assert!(db.ok("check", &[]).contains("ok: 3 keys"));
}

#[test]
fn native_put_get_del_scan_and_compact() {
    let t = tmp();
    let db = Db::native(t.path());
    basics(&db);
    let other = t.path().join("scans");
    std::fs::create_dir(&other).expect("test file I/O");
    scans(&Db::native(&other), t.path());
    assert!(db.ok("compact", &[]).contains("compacted"));
    // Compaction moved every key into one sorted run, which reads the same.
    let stats = db.ok("stats", &[]);
    assert!(stats.contains("runs per level: [0, 1, 0"), "{stats}");
    assert!(stats.contains("memtable keys: 0"), "{stats}");
    assert!(db.ok("check", &[]).contains("ok: 3 keys"));
    // init refuses to format a store already there.
    assert!(!db.run("init", &[]).status.success());
    // Without init, a blank device is refused with a pointer to init.
    let blank = format!("file:{}?size=64M", t.path().join("blank.img").display());
    let o = kura(&["kv", "get", "--engine", "native", "--dev", &blank, "/", "k"]);
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("kura kv init"));
    let o = kura(&["kv", "get", "--engine", "native", "/", "k"]);
    assert!(String::from_utf8_lossy(&o.stderr).contains("--dev"));
}

/// Scans longer than the page `kura kv` walks the native store in (4096 pairs), forward and
/// reversed, bounded and limited: every page boundary must neither repeat nor drop a key.
#[test]
fn native_scans_cross_pages() {
    let t = tmp();
    let db = Db::native(t.path());
    let keys: Vec<String> = (0..9_000).map(|i| format!("key{i:05}")).collect();
    let tsv: String = keys.iter().map(|k| format!("{k}\tv-{k}\n")).collect();
    let file = t.path().join("many.tsv");
    std::fs::write(&file, &tsv).expect("test file I/O");
    db.ok("import", &[file.to_str().expect("utf-8 path")]);
    let listed = |args: &[&str]| -> Vec<String> {
        db.ok("scan", args)
            .lines()
            .map(|l| l.split('\t').next().unwrap_or_default().to_string())
            .collect()
    };
    assert_eq!(listed(&[]), keys);
    let reversed: Vec<String> = keys.iter().rev().cloned().collect();
    assert_eq!(listed(&["--reverse"]), reversed);
    assert_eq!(
        listed(&["--from", "key00100", "--to", "key08500"]),
        keys[100..8500]
    );
    assert_eq!(
        listed(&[
            "--from",
            "key00100",
            "--to",
            "key08500",
            "--reverse",
            "--limit",
            "5000"
        ]),
        reversed[500..5500]
    );
    assert_eq!(listed(&["--limit", "4096"]), keys[..4096]);
    assert_eq!(db.ok("export", &[]), tsv);
}

#[test]
fn leveldb_import_export_every_format() {
    if !leveldb_here("leveldb_import_export_every_format") {
        return;
    }
    let t = tmp();
    let root = t.path().to_path_buf();
    import_export(&|name| Db::leveldb_dir(&root.join(name)), t.path());
    let db = Db::leveldb_dir(&root.join("bad"));
    malformed(&db, t.path());
}

#[test]
fn native_import_export_every_format() {
    let t = tmp();
    let root = t.path().to_path_buf();
    import_export(
        &|name| {
            let dir: PathBuf = root.join(name);
            std::fs::create_dir(&dir).expect("test file I/O");
            Db::native(&dir)
        },
        t.path(),
    );
    let dir = root.join("bad");
    std::fs::create_dir(&dir).expect("test file I/O");
    malformed(&Db::native(&dir), t.path());
}

#[test]
fn leveldb_made_by_kura_kv_opens_in_plyvel() {
    if !leveldb_here("leveldb_made_by_kura_kv_opens_in_plyvel") {
        return;
    }
    let plyvel = Command::new("python3")
        .args(["-c", "import plyvel"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !plyvel {
        kura_testkit::skip(
            "leveldb_made_by_kura_kv_opens_in_plyvel",
            "plyvel",
            "python3 -c 'import plyvel' fails (scripts/setup.sh installs python3-plyvel)",
        );
        return;
    }
    let t = tmp();
    let pairs = binary_pairs();
    let src = t.path().join("in.hex");
    std::fs::write(&src, hex_file(&pairs)).expect("test file I/O");
    let check = |dir: &Path| {
        let script = "import plyvel, sys\n\
                      db = plyvel.DB(sys.argv[1])\n\
                      for k, v in db: print(k.hex() + '\\t' + v.hex())\n\
                      db.close()\n";
        let o = Command::new("python3")
            .args(["-c", script, dir.to_str().expect("utf-8 path")])
            .output()
            .expect("test file I/O");
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        assert_eq!(
            String::from_utf8(o.stdout).expect("utf-8 output"),
            hex_file(&pairs)
        );
    };
    // Made in a host directory.
    let host = Db::leveldb_dir(&t.path().join("db"));
    host.ok("import", &["--hex", src.to_str().expect("utf-8 path")]);
    check(&t.path().join("db"));
    // Made inside AccelFS and copied out with `kura fs get -r`.
    let fs = Db::leveldb_accelfs(t.path());
    fs.ok("import", &["--hex", src.to_str().expect("utf-8 path")]);
    let out = t.path().join("copied");
    ok(&[
        "fs",
        "get",
        "-r",
        &fs.at[1],
        "/db",
        out.to_str().expect("utf-8 path"),
    ]);
    check(&out);
}
