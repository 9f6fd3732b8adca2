//! `kura ingest` end to end as a user runs it: format an image file, serve it over TCP (with a
//! key) and over a Unix socket, send generated records and a directory of files with several
//! connections, stop the server with SIGTERM, then list and read the records back.

use std::io::BufRead;
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

fn kura(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_kura"))
        .args(args)
        .output()
        .expect("run kura")
}

fn ok(args: &[&str]) -> String {
    let out = kura(args);
    assert!(
        out.status.success(),
        "kura {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A running `kura ingest serve` and the address from its banner.
struct Serving {
    child: Child,
    addr: String,
    log: std::sync::mpsc::Receiver<String>,
}

impl Serving {
    fn start(args: &[&str]) -> Serving {
        let mut child = Command::new(env!("CARGO_BIN_EXE_kura"))
            .args(["ingest", "serve"])
            .args(args)
            .stderr(Stdio::piped())
            .spawn()
            .expect("start kura ingest serve");
        let mut stderr = std::io::BufReader::new(child.stderr.take().expect("stderr"));
        let mut line = String::new();
        stderr.read_line(&mut line).expect("banner");
        let addr = line
            .split_whitespace()
            .skip_while(|w| *w != "on")
            .nth(1)
            .unwrap_or_else(|| panic!("no address in {line:?}"))
            .to_string();
        let (tx, log) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut rest = String::new();
            while stderr.read_line(&mut rest).map(|n| n > 0).unwrap_or(false) {
                let _ = tx.send(std::mem::take(&mut rest));
            }
        });
        Serving { child, addr, log }
    }

    /// SIGTERM, then the exit status and the closing line (bounded wait).
    fn stop(mut self) -> (std::process::ExitStatus, String) {
        let status = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()
            .expect("run kill");
        assert!(status.success());
        let start = Instant::now();
        let status = loop {
            if let Some(s) = self.child.try_wait().expect("wait") {
                break s;
            }
            assert!(
                start.elapsed() < Duration::from_secs(60),
                "no exit after SIGTERM"
            );
            std::thread::sleep(Duration::from_millis(20));
        };
        let log: Vec<String> = self.log.try_iter().collect();
        (status, log.concat())
    }
}

impl Drop for Serving {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn format(dir: &Path, size: &str) -> String {
    let image = dir.join("ingest.img");
    let spec = format!("file:{}?size={size}", image.display());
    let out = ok(&["ingest", "format", &spec]);
    assert!(out.contains("index slots"), "{out}");
    format!("file:{}", image.display())
}

fn ls_rows(spec: &str, extra: &[&str]) -> Vec<Vec<String>> {
    let mut args = vec!["ingest", "ls", spec];
    args.extend_from_slice(extra);
    ok(&args)
        .lines()
        .skip(1)
        .map(|l| l.split_whitespace().map(String::from).collect())
        .collect()
}

#[test]
fn tcp_with_a_key_generated_records_over_two_connections_then_sigterm() {
    let dir = tempfile::tempdir().expect("tempdir");
    let spec = format(dir.path(), "64M");
    let key = dir.path().join("key");
    std::fs::write(&key, "0123456789abcdef0123456789abcdef\n").expect("key");
    let key = key.to_str().expect("utf-8");
    // A TCP listener without a key is refused.
    let refused = kura(&["ingest", "serve", &spec, "--listen", "127.0.0.1:0"]);
    assert!(!refused.status.success());
    assert!(String::from_utf8_lossy(&refused.stderr).contains("shared key"));

    let server = Serving::start(&[&spec, "--listen", "127.0.0.1:0", "--key", key, "--qd", "8"]);
    let out = ok(&[
        "ingest",
        "send",
        &server.addr,
        "--key",
        key,
        "--synthetic",
        "300K",
        "--count",
        "12",
        "--conns",
        "2",
    ]);
    assert!(out.contains("12 stored, 12 acknowledged"), "{out}");
    // Without the key the sender is told why.
    let bad = kura(&[
        "ingest",
        "send",
        &server.addr,
        "--synthetic",
        "4K",
        "--count",
        "1",
    ]);
    assert!(!bad.status.success());
    assert!(String::from_utf8_lossy(&bad.stderr).contains("key"));
    let (status, log) = server.stop();
    assert!(status.success(), "exit {status:?}: {log}");
    assert!(
        log.contains("12 records (3686400 bytes) stored this run"),
        "{log}"
    );

    let rows = ls_rows(&spec, &[]);
    assert_eq!(rows.len(), 12);
    // Each connection's seqs 0..6 appear once per connection; every record is 300 KiB.
    let mut seqs: Vec<u64> = rows.iter().map(|r| r[1].parse().expect("seq")).collect();
    seqs.sort_unstable();
    assert_eq!(seqs, (0..6).flat_map(|s| [s, s]).collect::<Vec<u64>>());
    assert!(rows
        .iter()
        .all(|r| r[3] == "307200" && r[4] == "307200" && r[5] == "crc32c"));
    let got = kura(&["ingest", "get", &spec, "0"]);
    assert!(got.status.success());
    assert_eq!(got.stdout.len(), 307_200);
    assert!(!kura(&["ingest", "get", &spec, "12"]).status.success());
}

#[test]
fn a_directory_over_a_unix_socket_reads_back_byte_for_byte() {
    let dir = tempfile::tempdir().expect("tempdir");
    let spec = format(dir.path(), "32M");
    let files = dir.path().join("files");
    std::fs::create_dir(&files).expect("mkdir");
    let contents: Vec<Vec<u8>> = (0..5u32)
        .map(|i| (0..(i * 70_001 + 1)).map(|b| (b * 7 + i) as u8).collect())
        .collect();
    for (i, c) in contents.iter().enumerate() {
        std::fs::write(files.join(format!("f{i}")), c).expect("write");
    }
    let sock = dir.path().join("ingest.sock");
    let listen = format!("unix:{}", sock.display());
    let server = Serving::start(&[&spec, "--listen", &listen, "--order", "out"]);
    let mode = std::os::unix::fs::PermissionsExt::mode(
        &std::fs::metadata(&sock).expect("socket").permissions(),
    );
    assert_eq!(mode & 0o777, 0o600);
    let out = ok(&[
        "ingest",
        "send",
        &listen,
        files.to_str().expect("utf-8"),
        "--batch-acks",
        "--stage",
        "zstd",
    ]);
    assert!(out.contains("5 stored"), "{out}");
    let (status, _) = server.stop();
    assert!(status.success());
    assert!(!sock.exists(), "the socket file is removed at exit");
    let rows = ls_rows(&spec, &[]);
    assert_eq!(rows.len(), 5);
    // The patterned files compress; `get` gives back the original bytes.
    for row in &rows {
        assert_eq!(row[5], "zstd", "{row:?}");
        let (sent, stored): (u64, u64) = (row[3].parse().expect("n"), row[4].parse().expect("n"));
        assert!(sent < 1000 || stored * 10 < sent, "{row:?}");
    }
    for row in rows {
        let seq: usize = row[1].parse().expect("seq");
        let out = dir.path().join("out");
        ok(&[
            "ingest",
            "get",
            &spec,
            &row[0],
            "-o",
            out.to_str().expect("utf-8"),
        ]);
        assert!(
            std::fs::read(&out).expect("read") == contents[seq],
            "record {}",
            row[0]
        );
    }
}

#[test]
fn classify_labels_generated_images_and_ls_filters_by_label() {
    let dir = tempfile::tempdir().expect("tempdir");
    let spec = format(dir.path(), "32M");
    let sock = dir.path().join("s");
    let listen = format!("unix:{}", sock.display());
    let server = Serving::start(&[&spec, "--listen", &listen]);
    let out = ok(&[
        "ingest",
        "send",
        &listen,
        "--stage",
        "classify",
        "--synthetic",
        "60K",
        "--count",
        "20",
    ]);
    assert!(out.contains("20 stored"), "{out}");
    let (status, _) = server.stop();
    assert!(status.success());
    let classes = ["sky", "forest", "sunset", "snow", "night"];
    let rows = ls_rows(&spec, &[]);
    assert_eq!(rows.len(), 20);
    // Record seq i shows a scene of class i % 5; the classifier gets nearly all of them.
    let right = rows
        .iter()
        .filter(|r| r[6] == classes[r[1].parse::<usize>().expect("seq") % 5])
        .count();
    assert!(right >= 18, "{right} of 20 labelled as generated: {rows:?}");
    let mut by_label = 0;
    for class in classes {
        let listed = ls_rows(&spec, &["--label", class]);
        assert!(listed.iter().all(|r| r[6] == class));
        by_label += listed.len();
    }
    assert_eq!(by_label, 20);
    assert!(!kura(&["ingest", "ls", &spec, "--label", "cat"])
        .status
        .success());
}

#[test]
fn an_accelfs_target_with_dev_serves_lists_and_gets() {
    let dir = tempfile::tempdir().expect("tempdir");
    let image = dir.path().join("fs.img");
    let spec = format!("file:{}", image.display());
    ok(&["mkfs", &format!("{spec}?size=64M")]);
    let sock = dir.path().join("s");
    let listen = format!("unix:{}", sock.display());
    let server = Serving::start(&["/ingest", "--dev", &spec, "--listen", &listen]);
    let out = ok(&[
        "ingest",
        "send",
        &listen,
        "--synthetic",
        "200K",
        "--count",
        "6",
        "--conns",
        "2",
    ]);
    assert!(out.contains("6 stored"), "{out}");
    let (status, log) = server.stop();
    assert!(status.success(), "{log}");
    let before = std::fs::read(&image).expect("image");
    let rows = ls_rows("/ingest", &["--dev", &spec]);
    assert_eq!(rows.len(), 6);
    let got = kura(&["ingest", "get", "/ingest", "--dev", &spec, "5"]);
    assert!(got.status.success());
    assert_eq!(got.stdout.len(), 200 << 10);
    // ls and get read an AccelFS target without writing its device.
    assert!(
        std::fs::read(&image).expect("image") == before,
        "ls or get changed the image"
    );
    // The file system is consistent after all of it.
    ok(&["fsck", &spec]);
}
