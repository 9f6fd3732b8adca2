//! `kura serve` at its edges (issue 13): SIGTERM, SIGINT and SIGHUP stop it cleanly (exit 0,
//! every acknowledged write in the image file); export descriptions stay empty unless
//! `--describe`; `--unix` serves on a private socket; `--tls-psk` names a key file's bad line.
//!
//! Timing only bounds "no hang": every wait is many times what the work needs.

mod common;

use common::{nbdinfo_ok, Serving};
use kura_engine::{BlockDevice, BlockingIo};
use std::path::Path;
use std::process::{Command, Output};
use std::thread;
use std::time::{Duration, Instant};

const MIB: usize = 1 << 20;
/// How long a signalled `kura serve` may take to exit.
const EXIT_WITHIN: Duration = Duration::from_secs(60);

fn tool(name: &str) -> bool {
    kura_testkit::which(name).is_some()
}

/// A deterministic fill for block `i`.
fn block(i: usize, len: usize) -> Vec<u8> {
    let mut x = (i as u64 + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

#[test]
fn sigterm_mid_stream_keeps_every_acknowledged_write_and_exits_0() {
    let dir = tempfile::tempdir().expect("tempdir");
    let image = dir.path().join("disk.img");
    let spec = format!("disk=file:{}?size=64M", image.display());
    let server = Serving::start(&[&spec, "--listen", "127.0.0.1:0"]);
    let addr = server.addr();
    const BLOCK: usize = 64 << 10;
    const SLOTS: usize = 64 * MIB / BLOCK;
    let (first_ack, under_way) = std::sync::mpsc::channel();
    let writer = thread::spawn(move || {
        let mut c = kura_nbd::connect(addr.as_str(), "disk").expect("connect");
        let blocks_per = (BLOCK / c.geometry().block_size as usize) as u64;
        let mut acked = 0usize;
        let start = Instant::now();
        // Write i goes to slot i % SLOTS with block(i), round and round until the server goes
        // away (or a minute passes); a write counts only once acknowledged.
        while start.elapsed() < Duration::from_secs(60) {
            let lba = (acked % SLOTS) as u64 * blocks_per;
            if c.write_blocks(lba, &block(acked, BLOCK)).is_err() {
                break;
            }
            acked += 1;
            if acked == 1 {
                let _ = first_ack.send(());
            }
        }
        acked
    });
    // Signal once the stream is under way (the writer keeps going meanwhile).
    under_way
        .recv_timeout(Duration::from_secs(60))
        .expect("the first write is acknowledged");
    thread::sleep(Duration::from_millis(200));
    server.signal("TERM");
    let status = server.wait(EXIT_WITHIN);
    let acked = writer.join().expect("writer");
    assert!(status.success(), "kura serve after SIGTERM: {status:?}");
    println!("{acked} writes of 64 KiB acknowledged before SIGTERM stopped the server");
    assert!(acked > 0, "some writes were acknowledged");
    let disk = std::fs::read(&image).expect("read image");
    for slot in 0..SLOTS.min(acked) {
        // The newest acknowledged write to this slot; the one in flight when the server
        // stopped (write `acked`) may or may not have landed.
        let newest = slot + (acked - 1 - slot) / SLOTS * SLOTS;
        let got = &disk[slot * BLOCK..(slot + 1) * BLOCK];
        let in_flight = acked % SLOTS == slot && got == &block(acked, BLOCK)[..];
        assert!(
            got == &block(newest, BLOCK)[..] || in_flight,
            "slot {slot}: acknowledged write {newest} of {acked} is in the image"
        );
    }
}

#[test]
fn sigint_and_sighup_also_stop_cleanly_and_nbdcopy_data_is_kept() {
    let have_nbdcopy = tool("nbdcopy");
    if !have_nbdcopy {
        kura_testkit::skip(
            "sigint_and_sighup_also_stop_cleanly_and_nbdcopy_data_is_kept (nbdcopy part)",
            "nbdcopy",
            "nbdcopy is not installed (apt-get install libnbd-bin)",
        );
    }
    for sig in ["INT", "HUP", "TERM"] {
        let dir = tempfile::tempdir().expect("tempdir");
        let image = dir.path().join("disk.img");
        let spec = format!("disk=file:{}?size=8M", image.display());
        let server = Serving::start(&[&spec, "--listen", "127.0.0.1:0"]);
        let mut src = Vec::with_capacity(8 * MIB);
        for i in 0..8 {
            src.extend_from_slice(&block(i + 100, MIB));
        }
        if have_nbdcopy {
            let input = dir.path().join("in.bin");
            std::fs::write(&input, &src).expect("write source");
            let out = Command::new("nbdcopy")
                .arg(&input)
                .arg(format!("{}/disk", server.url))
                .output()
                .expect("nbdcopy");
            assert!(
                out.status.success(),
                "nbdcopy: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        server.signal(sig);
        let status = server.wait(EXIT_WITHIN);
        assert!(status.success(), "kura serve after SIG{sig}: {status:?}");
        if have_nbdcopy {
            assert!(
                std::fs::read(&image).expect("image") == src,
                "SIG{sig}: the copied image is intact"
            );
        }
    }
}

fn nbdinfo_list(url: &str) -> Output {
    Command::new("nbdinfo")
        .args(["--list", "--json", url])
        .output()
        .expect("nbdinfo")
}

#[test]
fn descriptions_are_empty_unless_asked_for_and_unix_sockets_are_served() {
    if !tool("nbdinfo") {
        return kura_testkit::skip(
            "descriptions_are_empty_unless_asked_for_and_unix_sockets_are_served",
            "nbdinfo",
            "nbdinfo is not installed (apt-get install libnbd-bin)",
        );
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let image = dir.path().join("private-host-path.img");
    let spec = format!("disk=file:{}?size=4M", image.display());
    for describe in [false, true] {
        let mut args = vec![spec.as_str(), "--listen", "127.0.0.1:0"];
        if describe {
            args.push("--describe");
        }
        let server = Serving::start(&args);
        let out = nbdinfo_list(&server.url);
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(text.contains("\"disk\""), "{text}");
        assert_eq!(
            text.contains("private-host-path"),
            describe,
            "--describe={describe}: {text}"
        );
        server.signal("TERM");
        assert!(server.wait(EXIT_WITHIN).success());
    }

    // --unix: a 0600 socket, served to nbdinfo, removed at exit.
    let sock = dir.path().join("kura.sock");
    let server = Serving::start(&[&spec, "--unix", &sock.display().to_string()]);
    let mode = std::os::unix::fs::PermissionsExt::mode(
        &std::fs::metadata(&sock).expect("socket").permissions(),
    );
    assert_eq!(mode & 0o777, 0o600);
    let info = nbdinfo_ok(&[
        "--json",
        &format!("nbd+unix:///disk?socket={}", sock.display()),
    ]);
    assert!(info.contains("4194304"));
    server.signal("TERM");
    assert!(server.wait(EXIT_WITHIN).success());
    assert!(!Path::new(&sock).exists(), "the socket is removed at exit");
}

#[test]
fn unix_refuses_to_clobber_a_file_and_tls_psk_names_a_bad_key_line() {
    let dir = tempfile::tempdir().expect("tempdir");
    let victim = dir.path().join("notes.txt");
    std::fs::write(&victim, b"keep me").expect("write");
    let out = Command::new(env!("CARGO_BIN_EXE_kura"))
        .args([
            "serve",
            "disk=mem:1M",
            "--unix",
            &victim.display().to_string(),
        ])
        .output()
        .expect("kura serve");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("not a socket"), "{err}");
    assert_eq!(std::fs::read(&victim).expect("read"), b"keep me");

    // A valid file would start a server (crates/nbd/tests/psk.rs tests that); a bad one must
    // stop it at once, naming the line (or, in a build without OpenSSL, saying so).
    let psk = dir.path().join("keys.psk");
    std::fs::write(&psk, "alice:0123456789abcdef0123456789abcdef\nbob:xyz\n").expect("write");
    let out = Command::new(env!("CARGO_BIN_EXE_kura"))
        .args([
            "serve",
            "disk=mem:1M",
            "--tls-psk",
            &psk.display().to_string(),
        ])
        .output()
        .expect("kura serve");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("line 2") || err.contains("built without OpenSSL"),
        "{err}"
    );
}

#[test]
fn tls_psk_lets_the_right_key_in_and_keeps_a_wrong_one_out() {
    const TEST: &str = "tls_psk_lets_the_right_key_in_and_keeps_a_wrong_one_out";
    if !tool("nbdinfo") {
        return kura_testkit::skip(
            TEST,
            "nbdinfo",
            "nbdinfo is not installed (apt-get install libnbd-bin)",
        );
    }
    let dir = tempfile::tempdir().expect("tempdir");
    // A key file with a bad line tells whether this kura has PSK at all, without serving.
    let bad = dir.path().join("bad.psk");
    std::fs::write(&bad, "alice:zz\n").expect("write");
    let probe = Command::new(env!("CARGO_BIN_EXE_kura"))
        .args([
            "serve",
            "disk=mem:1M",
            "--listen",
            "127.0.0.1:0",
            "--tls-psk",
        ])
        .arg(&bad)
        .output()
        .expect("kura serve");
    let err = String::from_utf8_lossy(&probe.stderr);
    if err.contains("built without OpenSSL") {
        return kura_testkit::skip(TEST, "openssl", "this kura was built without libssl-dev");
    }
    assert!(err.contains("line 1"), "{err}");

    let keys = dir.path().join("keys.psk");
    std::fs::write(&keys, format!("alice:{}\n", "5a".repeat(32))).expect("write");
    let wrong = dir.path().join("wrong.psk");
    std::fs::write(&wrong, format!("alice:{}\n", "a5".repeat(32))).expect("write");
    let image = dir.path().join("disk.img");
    let spec = format!("psk-export=file:{}?size=4M", image.display());
    let server = Serving::start(&[
        &spec,
        "--listen",
        "127.0.0.1:0",
        "--tls-psk",
        &keys.display().to_string(),
    ]);
    assert!(server.url.starts_with("nbds://"), "{}", server.url);
    let list = |file: &Path| {
        Command::new("nbdinfo")
            .args([
                "--list",
                "--json",
                &format!(
                    "nbds://alice@{}/?tls-psk-file={}",
                    server.addr().trim_start_matches("nbds://"),
                    file.display()
                ),
            ])
            .output()
            .expect("nbdinfo")
    };
    let good = list(&keys);
    assert!(
        good.status.success(),
        "{}",
        String::from_utf8_lossy(&good.stderr)
    );
    assert!(String::from_utf8_lossy(&good.stdout).contains("psk-export"));
    let refused = list(&wrong);
    let all = format!(
        "{}{}",
        String::from_utf8_lossy(&refused.stdout),
        String::from_utf8_lossy(&refused.stderr)
    );
    assert!(!refused.status.success(), "a wrong key got in: {all}");
    assert!(
        !all.contains("psk-export"),
        "a wrong key learned the export name: {all}"
    );
    server.signal("TERM");
    assert!(server.wait(EXIT_WITHIN).success());
}
