//! Real programs on a `kura mount` (issue 14 item 3), each checked by the program itself and
//! again after a remount:
//! - git: `git init`, `git add -A`, `git commit` of a copied source tree (this repository's
//!   accelfs crate), a second commit, `git gc` (packs, renames, unlinks), `git fsck --full
//!   --strict`, a clean `git status`, and a clone back to the host identical to the source.
//! - sqlite3 with `PRAGMA journal_mode=WAL`: 4000 rows in 20 transactions while a second
//!   sqlite3 process reads through the WAL and its shared-memory index (every count it sees is a
//!   whole number of transactions, never less than the one before), then `PRAGMA
//!   integrity_check` = ok and the row count.
//! - dbench (its client.txt load, 2 clients) for `KURA_DBENCH_SECS` seconds (default 10): exit
//!   status 0 and no failed operation.
//!
//! After unmount `kura fsck` is clean, and after a remount git fsck and sqlite's integrity
//! check pass again.

mod common;

use common::{ok, start_mount, MountGuard};
use std::path::Path;
use std::process::{Command, Output, Stdio};

const TEST: &str = "git_sqlite_and_dbench_work_on_a_mount";

fn show(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// Runs `prog args` in `dir`; it must succeed; its stdout.
fn run(dir: &Path, prog: &str, args: &[&str]) -> String {
    let o = Command::new(prog)
        .args(args)
        .current_dir(dir)
        .env("GIT_AUTHOR_NAME", "kura test")
        .env("GIT_AUTHOR_EMAIL", "test@kura.invalid")
        .env("GIT_COMMITTER_NAME", "kura test")
        .env("GIT_COMMITTER_EMAIL", "test@kura.invalid")
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("HOME", dir)
        .output()
        .unwrap_or_else(|e| panic!("run {prog}: {e}"));
    assert!(
        o.status.success(),
        "{prog} {args:?} in {} failed ({}): {}",
        dir.display(),
        o.status,
        show(&o)
    );
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// Every regular file under `root`, relative, sorted.
fn files(root: &Path) -> Vec<String> {
    let mut out = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).expect("read_dir") {
            let e = e.expect("entry");
            let t = e.file_type().expect("file type");
            if t.is_dir() {
                if e.file_name() != ".git" {
                    stack.push(e.path());
                }
            } else if t.is_file() {
                let rel = e.path().strip_prefix(root).expect("under root").to_owned();
                out.push(rel.to_string_lossy().into_owned());
            }
        }
    }
    out.sort();
    out
}

/// Copies the regular files and directories under `from` to `to`.
fn copy_tree(from: &Path, to: &Path) {
    for rel in files(from) {
        let dst = to.join(&rel);
        std::fs::create_dir_all(dst.parent().expect("parent")).expect("mkdir");
        std::fs::copy(from.join(&rel), &dst).expect("copy");
    }
}

fn git_checks(mnt: &Path, host: &Path) {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("../accelfs");
    let repo = mnt.join("repo");
    copy_tree(&src.join("src"), &repo.join("src"));
    copy_tree(&src.join("tests"), &repo.join("tests"));
    let want = files(&repo);
    assert!(want.len() > 20, "copied only {} files", want.len());
    run(&repo, "git", &["init", "-q", "-b", "main"]);
    run(&repo, "git", &["add", "-A"]);
    run(&repo, "git", &["commit", "-q", "-m", "the accelfs crate"]);
    // A second commit that renames, deletes and changes files.
    run(&repo, "git", &["mv", "src/lib.rs", "src/lib_moved.rs"]);
    run(&repo, "git", &["rm", "-q", &want[0]]);
    std::fs::write(repo.join("NEW"), "a new file\n".repeat(1000)).expect("write");
    run(&repo, "git", &["add", "-A"]);
    run(&repo, "git", &["commit", "-q", "-m", "second"]);
    run(&repo, "git", &["gc", "-q"]);
    run(
        &repo,
        "git",
        &["fsck", "--full", "--strict", "--no-progress"],
    );
    let status = run(&repo, "git", &["status", "--porcelain"]);
    assert!(status.is_empty(), "git status after commit: {status}");
    eprintln!(
        "git: {} files committed twice, gc, fsck --full --strict",
        want.len()
    );
    let count = run(&repo, "git", &["rev-list", "--count", "HEAD"]);
    assert_eq!(count.trim(), "2");
    // A clone on the host holds exactly what the mount holds.
    let clone = host.join("clone");
    run(
        host,
        "git",
        &["clone", "-q", repo.to_str().expect("utf8"), "clone"],
    );
    let (a, b) = (files(&repo), files(&clone));
    assert_eq!(a, b, "files in the clone");
    for rel in &a {
        assert_eq!(
            std::fs::read(repo.join(rel)).expect("read"),
            std::fs::read(clone.join(rel)).expect("read"),
            "{rel} differs in the clone"
        );
    }
}

/// sqlite3 in WAL mode: a writer and a concurrent reader.
fn sqlite_checks(mnt: &Path) {
    const TXNS: usize = 20;
    const ROWS: usize = 200;
    let db = mnt.join("db.sqlite");
    // The writer waits out the readers' short exclusive moments (busy_timeout) instead of
    // failing a statement with "database is locked", as a real application would.
    let mut sql = String::from(
        "PRAGMA busy_timeout=30000;\nPRAGMA journal_mode=WAL;\nCREATE TABLE t(id INTEGER PRIMARY KEY, k TEXT UNIQUE, v BLOB);\n",
    );
    let mode = run(
        mnt,
        "sqlite3",
        &[db.to_str().expect("utf8"), "PRAGMA journal_mode=WAL;"],
    );
    assert_eq!(mode.trim(), "wal", "journal mode");
    for t in 0..TXNS {
        sql.push_str("BEGIN;\n");
        for i in 0..ROWS {
            let n = t * ROWS + i;
            sql.push_str(&format!(
                "INSERT INTO t(k, v) VALUES ('key{n}', randomblob({}));\n",
                1 + n % 3000
            ));
        }
        sql.push_str("COMMIT;\n");
    }
    let mut writer = Command::new("sqlite3")
        .arg(&db)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("sqlite3");
    let mut stdin = writer.stdin.take().expect("stdin");
    let feeder = std::thread::spawn(move || {
        use std::io::Write;
        stdin.write_all(sql.as_bytes()).expect("feed sqlite3");
    });
    // Drained while the writer runs: a writer whose output filled its pipe would block forever.
    let drain = |pipe: Option<Box<dyn std::io::Read + Send>>| {
        std::thread::spawn(move || {
            use std::io::Read;
            let mut text = String::new();
            if let Some(mut pipe) = pipe {
                let _ = pipe.read_to_string(&mut text);
            }
            text
        })
    };
    let out = drain(writer.stdout.take().map(|p| Box::new(p) as _));
    let err = drain(writer.stderr.take().map(|p| Box::new(p) as _));
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(600);
    // The reader: while the writer runs, every count is a whole number of transactions.
    let mut last = 0usize;
    let mut reads = 0;
    loop {
        let done = writer.try_wait().expect("wait").is_some();
        let o = Command::new("sqlite3")
            .arg(&db)
            .arg("SELECT count(*) FROM t;")
            .output()
            .expect("sqlite3 reader");
        let text = show(&o);
        if o.status.success() {
            let n: usize = text
                .trim()
                .parse()
                .unwrap_or_else(|_| panic!("count: {text}"));
            assert_eq!(n % ROWS, 0, "a reader saw part of a transaction: {n}");
            assert!(n >= last, "the count went back from {last} to {n}");
            last = n;
            reads += 1;
        } else {
            // Before the writer created the table the reader finds none; a reader may also
            // meet the writer's exclusive moments (opening or resetting the WAL) and retry.
            assert!(
                text.contains("no such table") || text.contains("database is locked"),
                "reader failed: {text}"
            );
        }
        if done {
            break;
        }
        if std::time::Instant::now() > deadline {
            let _ = writer.kill();
            panic!("the sqlite3 writer ran past 600 s");
        }
    }
    let status = writer.wait().expect("writer");
    let (out, err) = (out.join().expect("stdout"), err.join().expect("stderr"));
    assert!(status.success(), "sqlite3 writer ({status}): {out}{err}");
    feeder.join().expect("feeder");
    assert!(reads > 0, "the reader never read");
    assert_eq!(last, TXNS * ROWS, "the last read after the writer finished");
    eprintln!("sqlite3 WAL: {TXNS} transactions of {ROWS} rows, {reads} concurrent reads");
    sqlite_verify(mnt, TXNS * ROWS);
}

fn sqlite_verify(mnt: &Path, rows: usize) {
    let db = mnt.join("db.sqlite");
    let out = run(
        mnt,
        "sqlite3",
        &[
            db.to_str().expect("utf8"),
            "PRAGMA integrity_check; SELECT count(*), count(DISTINCT k), sum(length(v)) FROM t;",
        ],
    );
    let want_bytes: usize = (0..rows).map(|n| 1 + n % 3000).sum();
    assert_eq!(
        out,
        format!("ok\n{rows}|{rows}|{want_bytes}\n"),
        "integrity check and counts"
    );
}

fn dbench_checks(mnt: &Path) {
    let secs = std::env::var("KURA_DBENCH_SECS").unwrap_or_else(|_| "10".into());
    let dir = mnt.join("dbench");
    std::fs::create_dir(&dir).expect("mkdir");
    let o = Command::new("dbench")
        .args(["-D", dir.to_str().expect("utf8"), "-t", &secs])
        .args(["-c", "/usr/share/dbench/client.txt", "2"])
        .output()
        .expect("dbench");
    let text = show(&o);
    assert!(o.status.success(), "dbench failed ({}): {text}", o.status);
    // dbench 4.00 prints "failed to create barrier semaphore" when semget returns 0, which is a
    // valid ID (the first semaphore set after boot gets it), and then runs normally with it; that
    // line says nothing about the file system, every other failure line does.
    let reported: String = text
        .lines()
        .filter(|l| l.trim() != "failed to create barrier semaphore")
        .collect::<Vec<_>>()
        .join("\n");
    for bad in ["ERROR", "failed", "Child failed"] {
        assert!(!reported.contains(bad), "dbench reported {bad}: {text}");
    }
    assert!(text.contains("Throughput"), "no dbench summary: {text}");
    eprintln!(
        "dbench {secs} s: {}",
        text.lines()
            .find(|l| l.starts_with("Throughput"))
            .unwrap_or_default()
    );
}

fn unmount(server: &mut std::process::Child, mnt: &Path) {
    let status = common::unmount(server, mnt);
    assert!(status.success(), "kura mount exit {status}");
}

#[test]
fn git_sqlite_and_dbench_work_on_a_mount() {
    if let Some(m) = kura_testkit::fuse_unavailable() {
        return m.skip(TEST);
    }
    for (tool, pkg) in [("git", "git"), ("sqlite3", "sqlite3"), ("dbench", "dbench")] {
        if let Some(m) = kura_testkit::missing_tool(tool, pkg) {
            return m.skip(TEST);
        }
    }
    if !Path::new("/usr/share/dbench/client.txt").exists() {
        return kura_testkit::Missing::new(
            "dbench",
            "dbench's load file is missing (apt-get install dbench)",
        )
        .skip(TEST);
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let img = dir.path().join("fs.img");
    ok(&["mkfs", &format!("file:{}?size=2G", img.display())]);
    let spec = format!("file:{}", img.display());
    let mnt = dir.path().join("mnt");
    std::fs::create_dir(&mnt).expect("mkdir");
    let host = dir.path().join("host");
    std::fs::create_dir(&host).expect("mkdir");
    let mut server = start_mount(&spec, &mnt, &[]);
    let _guard = MountGuard(&mnt);

    git_checks(&mnt, &host);
    sqlite_checks(&mnt);
    dbench_checks(&mnt);

    unmount(&mut server, &mnt);
    let report = ok(&["fsck", &spec]);
    assert!(
        report.contains("clean"),
        "fsck after the programs: {report}"
    );

    // Everything the programs left is whole after a remount.
    let mut server = start_mount(&spec, &mnt, &[]);
    let repo = mnt.join("repo");
    run(
        &repo,
        "git",
        &["fsck", "--full", "--strict", "--no-progress"],
    );
    let status = run(&repo, "git", &["status", "--porcelain"]);
    assert!(status.is_empty(), "git status after remount: {status}");
    sqlite_verify(&mnt, 4000);
    unmount(&mut server, &mnt);
    let report = ok(&["fsck", &spec]);
    assert!(report.contains("clean"), "fsck after the remount: {report}");
}
