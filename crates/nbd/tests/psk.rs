//! TLS-PSK (`kura_nbd::psk`, `serve_tls_psk`) against real libnbd clients (GnuTLS): with the
//! right key `nbdinfo` lists the exports and `nbdcopy` copies an image in and out
//! byte-identically; a client with the wrong key, or an identity the file does not hold, fails
//! in the TLS handshake and prints no export name; a plaintext client is refused as with
//! certificates; the server keeps serving afterwards. Each test skips visibly when its tool is
//! missing or this build has no OpenSSL (`kura_nbd::psk::openssl_available`).

mod common;

use common::{mem_disk, pattern, run_bounded, Raw};
use kura_nbd::protocol::{Opt, Rep};
use kura_nbd::psk::{openssl_available, PskError, PskServer};
use kura_nbd::{bind_loopback, serve_tls_psk, Export, ServeOptions, Server};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::thread;
use std::time::{Duration, Instant};

/// An export name that appears nowhere else in a client's output.
const EXPORT: &str = "vault-7c1e";
const ALICE_KEY: &str = "8f0d6b1c2e3a4f5061728394a5b6c7d8e9f00112233445566778899aabbccdde";
const BOB_KEY: &str = "00112233445566778899aabbccddeeff";
const WRONG_KEY: &str = "ff0d6b1c2e3a4f5061728394a5b6c7d8e9f00112233445566778899aabbccdde";

/// Whether the test can run: OpenSSL in this build and the libnbd `tools` installed.
fn can_run(test: &str, tools: &[&str]) -> bool {
    if !openssl_available() {
        kura_testkit::skip(
            test,
            "openssl",
            "kura-nbd was built without OpenSSL (install libssl-dev and pkg-config)",
        );
        return false;
    }
    for t in tools {
        if let Some(m) = kura_testkit::missing_tool(t, "apt-get install libnbd-bin") {
            m.skip(test);
            return false;
        }
    }
    true
}

/// Key files in a temporary directory.
struct Keys {
    dir: tempfile::TempDir,
}

impl Keys {
    fn new() -> Keys {
        let dir = tempfile::tempdir().expect("temp dir");
        let write = |name: &str, text: String| {
            std::fs::write(dir.path().join(name), text).expect("write key file");
        };
        // The server's file, and one file per client as it would hold only its own key.
        write("server.psk", format!("alice:{ALICE_KEY}\nbob:{BOB_KEY}\n"));
        write("alice.psk", format!("alice:{ALICE_KEY}\n"));
        write("wrong.psk", format!("alice:{WRONG_KEY}\n"));
        write("mallory.psk", format!("mallory:{ALICE_KEY}\n"));
        Keys { dir }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    fn serve(&self, exports: Vec<Export>) -> Server {
        let psk = PskServer::from_file(&self.path("server.psk")).expect("PSK server");
        serve_tls_psk(
            bind_loopback(0).expect("bind"),
            exports,
            ServeOptions::default(),
            psk,
        )
        .expect("serve")
    }

    /// libnbd's URI for `user` with key file `file`, on `path` (`/` or `/EXPORT`).
    fn uri(&self, server: &Server, user: &str, file: &str, path: &str) -> String {
        format!(
            "nbds://{user}@127.0.0.1:{}{path}?tls-psk-file={}",
            server.local_addr().port(),
            self.path(file).display()
        )
    }
}

/// Runs a tool to completion, killing it after a minute.
fn run(cmd: &mut Command) -> Output {
    run_bounded(cmd, Duration::from_secs(60))
}

fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

fn ok(cmd: &mut Command) -> Output {
    let out = run(cmd);
    assert!(out.status.success(), "{cmd:?} failed: {}", text(&out));
    out
}

#[test]
fn nbdinfo_and_nbdcopy_work_with_the_right_key() {
    let test = "nbdinfo_and_nbdcopy_work_with_the_right_key";
    if !can_run(test, &["nbdinfo", "nbdcopy"]) {
        return;
    }
    let keys = Keys::new();
    let size = 8usize << 20;
    let (disk, storage) = mem_disk(size as u64);
    let server = keys.serve(vec![Export::new(EXPORT, disk)]);

    let list =
        ok(Command::new("nbdinfo")
            .arg("--list")
            .arg(keys.uri(&server, "alice", "alice.psk", "/")));
    assert!(text(&list).contains(EXPORT), "{}", text(&list));
    let export = keys.uri(&server, "alice", "alice.psk", &format!("/{EXPORT}"));
    let out = ok(Command::new("nbdinfo").args(["--size", &export]));
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        size.to_string()
    );

    // bob's 16-byte key works too: every identity of the file is accepted.
    std::fs::write(keys.path("bob.psk"), format!("bob:{BOB_KEY}\n")).expect("write");
    let out = ok(Command::new("nbdinfo").arg("--size").arg(keys.uri(
        &server,
        "bob",
        "bob.psk",
        &format!("/{EXPORT}"),
    )));
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        size.to_string()
    );

    let data = pattern(size, 13);
    let src = keys.path("in.img");
    std::fs::write(&src, &data).expect("write image");
    ok(Command::new("nbdcopy").arg(&src).arg(&export));
    assert!(
        *storage.lock().unwrap() == data,
        "the export differs after nbdcopy in"
    );

    let back = keys.path("out.img");
    ok(Command::new("nbdcopy").arg(&export).arg(&back));
    assert!(
        std::fs::read(&back).expect("read copy") == data,
        "nbdcopy out differs"
    );
    drop(server.stop());
}

/// Runs `nbdinfo --list` as `user` with key file `file` and asserts it is refused without
/// learning the export name.
fn assert_refused(keys: &Keys, server: &Server, user: &str, file: &str) {
    let out = run(Command::new("nbdinfo")
        .arg("--list")
        .arg(keys.uri(server, user, file, "/")));
    let all = text(&out);
    assert!(
        !out.status.success(),
        "{user} with {file} was let in: {all}"
    );
    assert!(
        !all.contains(EXPORT),
        "{user} with {file} learned the export: {all}"
    );
    let out = run(Command::new("nbdinfo").arg("--size").arg(keys.uri(
        server,
        user,
        file,
        &format!("/{EXPORT}"),
    )));
    assert!(
        !out.status.success(),
        "{user} opened the export: {}",
        text(&out)
    );
}

#[test]
fn a_wrong_key_or_an_unknown_identity_is_refused_in_the_tls_handshake() {
    let test = "a_wrong_key_or_an_unknown_identity_is_refused_in_the_tls_handshake";
    if !can_run(test, &["nbdinfo"]) {
        return;
    }
    let keys = Keys::new();
    let (disk, _) = mem_disk(1 << 20);
    let server = keys.serve(vec![Export::new(EXPORT, disk)]);
    assert_refused(&keys, &server, "alice", "wrong.psk");
    assert_refused(&keys, &server, "mallory", "mallory.psk");

    // A plaintext client is told TLS is required, with no export name either.
    let mut raw = Raw::connect(server.local_addr());
    raw.greet();
    raw.option(Opt::List, &[]);
    let (h, data) = raw.option_reply().expect("reply to LIST");
    assert_eq!(h.reply, Rep::ErrTlsReqd);
    assert!(!String::from_utf8_lossy(&data).contains(EXPORT));

    // A client that starts TLS and then sends garbage is cut; the server goes on.
    let mut raw = Raw::connect(server.local_addr());
    raw.greet();
    raw.option(Opt::StartTls, &[]);
    let (h, _) = raw.option_reply().expect("reply to STARTTLS");
    assert_eq!(h.reply, Rep::Ack);
    raw.send(&[0x16, 0x03, 0x01, 0x00, 0x05, 1, 2, 3, 4, 5])
        .expect("send garbage");
    let mut rest = Vec::new();
    let _ = std::io::Read::read_to_end(&mut raw.s, &mut rest);
    assert!(!String::from_utf8_lossy(&rest).contains(EXPORT));

    let out =
        ok(Command::new("nbdinfo")
            .arg("--list")
            .arg(keys.uri(&server, "alice", "alice.psk", "/")));
    assert!(
        text(&out).contains(EXPORT),
        "after the refusals: {}",
        text(&out)
    );
    drop(server.stop());
}

#[test]
fn psk_server_setup_errors_are_clear() {
    let dir = tempfile::tempdir().expect("temp dir");
    let bad = dir.path().join("bad.psk");
    std::fs::write(&bad, format!("alice:{ALICE_KEY}\nbob:xyz\n")).expect("write");
    let err = PskServer::from_file(&bad).unwrap_err();
    if openssl_available() {
        let msg = err.to_string();
        assert!(matches!(err, PskError::Line { line: 2, .. }), "{msg}");
        assert!(msg.contains("bad.psk") && msg.contains("line 2"), "{msg}");
        let missing = PskServer::from_file(Path::new("/nonexistent/keys.psk")).unwrap_err();
        assert!(matches!(missing, PskError::Read { .. }), "{missing}");
    } else {
        assert!(matches!(err, PskError::NoOpenSsl), "{err}");
        assert!(err.to_string().contains("install libssl-dev"), "{err}");
    }
}

#[test]
fn qemu_img_reads_the_export_with_its_psk_credentials() {
    let test = "qemu_img_reads_the_export_with_its_psk_credentials";
    if !openssl_available() {
        return kura_testkit::skip(test, "openssl", "kura-nbd was built without OpenSSL");
    }
    if let Some(m) = kura_testkit::missing_tool("qemu-img", "apt-get install qemu-utils") {
        return m.skip(test);
    }
    let keys = Keys::new();
    // QEMU's tls-creds-psk reads keys.psk from a directory.
    std::fs::copy(keys.path("alice.psk"), keys.path("keys.psk")).expect("copy");
    let size = 4usize << 20;
    let (disk, storage) = mem_disk(size as u64);
    *storage.lock().unwrap() = pattern(size, 29);
    let server = keys.serve(vec![Export::new(EXPORT, disk)]);
    let creds = format!(
        "tls-creds-psk,id=tls0,dir={},username=alice,endpoint=client",
        keys.dir.path().display()
    );
    let image = format!(
        "driver=nbd,host=127.0.0.1,port={},export={EXPORT},tls-creds=tls0",
        server.local_addr().port()
    );
    let copy = keys.path("copy.raw");
    ok(Command::new("qemu-img")
        .args([
            "convert",
            "--object",
            &creds,
            "--image-opts",
            &image,
            "-O",
            "raw",
        ])
        .arg(&copy));
    assert!(std::fs::read(&copy).expect("read copy") == pattern(size, 29));
    drop(server.stop());
}

/// Relays one connection from a listener of its own to `server`, after doing the NBD part of
/// the handshake up to an acknowledged `NBD_OPT_STARTTLS` itself, so a plain TLS client
/// (`openssl s_client`) can run the TLS handshake with the server. Returns the relay's port.
fn starttls_relay(server: std::net::SocketAddr) -> u16 {
    let listener = bind_loopback(0).expect("bind relay");
    let port = listener.local_addr().expect("relay address").port();
    thread::spawn(move || {
        let Ok((client, _)) = listener.accept() else {
            return;
        };
        let mut raw = Raw::connect(server);
        raw.greet();
        raw.option(Opt::StartTls, &[]);
        let (h, _) = raw.option_reply().expect("reply to STARTTLS");
        assert_eq!(h.reply, Rep::Ack);
        raw.s.set_read_timeout(None).expect("timeout");
        let pump = |mut from: std::net::TcpStream, mut to: std::net::TcpStream| {
            let _ = std::io::copy(&mut from, &mut to);
            let _ = to.shutdown(std::net::Shutdown::Write);
        };
        let (c2, s2) = (
            client.try_clone().expect("clone"),
            raw.s.try_clone().expect("clone"),
        );
        let up = thread::spawn(move || pump(c2, s2));
        pump(raw.s, client);
        let _ = up.join();
    });
    port
}

#[test]
fn openssl_clients_negotiate_tls_1_2_and_1_3_and_a_wrong_key_fails() {
    let test = "openssl_clients_negotiate_tls_1_2_and_1_3_and_a_wrong_key_fails";
    if !openssl_available() {
        return kura_testkit::skip(test, "openssl", "kura-nbd was built without OpenSSL");
    }
    if let Some(m) = kura_testkit::missing_tool("openssl", "apt-get install openssl") {
        return m.skip(test);
    }
    let keys = Keys::new();
    let (disk, _) = mem_disk(1 << 20);
    let server = keys.serve(vec![Export::new(EXPORT, disk)]);
    // NBD_OPT_LIST, sent over TLS once it is up; the reply names the export.
    let mut list = b"IHAVEOPT".to_vec();
    list.extend(3u32.to_be_bytes());
    list.extend(0u32.to_be_bytes());
    let s_client = |version: &str, key: &str| {
        let port = starttls_relay(server.local_addr());
        let mut child = Command::new("openssl")
            .args(["s_client", "-connect", &format!("127.0.0.1:{port}")])
            .args(["-psk_identity", "alice", "-psk", key, version])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn openssl");
        let mut stdin = child.stdin.take().expect("stdin");
        std::io::Write::write_all(&mut stdin, &list).expect("write");
        // s_client quits at end of input; give the server time to answer first.
        thread::sleep(Duration::from_millis(1500));
        drop(stdin);
        let deadline = Instant::now() + Duration::from_secs(30);
        while child.try_wait().expect("wait").is_none() {
            assert!(Instant::now() < deadline, "openssl s_client hangs");
            thread::sleep(Duration::from_millis(10));
        }
        text(&child.wait_with_output().expect("output"))
    };
    for (version, name) in [("-tls1_2", "TLSv1.2"), ("-tls1_3", "TLSv1.3")] {
        let out = s_client(version, ALICE_KEY);
        assert!(out.contains(&format!("{name}, Cipher is")), "{out}");
        assert!(out.contains(EXPORT), "no export list over {name}: {out}");
        let out = s_client(version, WRONG_KEY);
        assert!(
            !out.contains(EXPORT),
            "a wrong key over {name} listed: {out}"
        );
        assert!(out.contains("alert"), "no TLS alert over {name}: {out}");
    }
    drop(server.stop());
}
