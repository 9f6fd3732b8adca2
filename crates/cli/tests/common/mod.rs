//! What the CLI's tests share: running the `kura` binary (its output, success and failure
//! checks), FUSE mounts that are always taken down, even when a test fails, and `kura serve`
//! processes ([`Serving`]) that are killed when dropped, and the genome steps several tests
//! take (simulate, index and map on an image's AccelFS, the accuracy line), and a fresh AccelFS
//! for a key-value store ([`fresh_db`]).

#![allow(dead_code)]

use std::io::BufRead;
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

pub fn kura(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_kura"))
        .args(args)
        .output()
        .expect("run kura")
}

/// What `kura` printed: its stdout, then its stderr.
pub fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// Runs `kura args`, which must succeed; its output.
pub fn ok_output(args: &[&str]) -> Output {
    let o = kura(args);
    assert!(o.status.success(), "kura {args:?} failed: {}", text(&o));
    o
}

/// Runs `kura args`, which must succeed; its stdout.
pub fn ok(args: &[&str]) -> String {
    String::from_utf8_lossy(&ok_output(args).stdout).into_owned()
}

/// Runs `kura args`, which must succeed; its stdout and stderr ([`text`]).
pub fn ok_text(args: &[&str]) -> String {
    text(&ok_output(args))
}

/// Runs `kura args`, which must fail and say `says`.
pub fn fails(args: &[&str], says: &str) {
    let o = kura(args);
    assert!(!o.status.success(), "kura {args:?} succeeded: {}", text(&o));
    assert!(text(&o).contains(says), "kura {args:?}: {}", text(&o));
}

/// Runs `nbdinfo args`, which must succeed; its stdout.
pub fn nbdinfo_ok(args: &[&str]) -> String {
    let out = Command::new("nbdinfo")
        .args(args)
        .output()
        .expect("nbdinfo");
    assert!(
        out.status.success(),
        "nbdinfo {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

pub fn mounted(dir: &Path) -> bool {
    let mounts = std::fs::read_to_string("/proc/mounts").unwrap_or_default();
    let want = dir.to_string_lossy();
    mounts.lines().any(|l| l.split(' ').nth(1) == Some(&want))
}

/// Unmounts lazily if a test fails while the mount is up, so no stale mount outlives it.
pub struct MountGuard<'a>(pub &'a Path);

impl Drop for MountGuard<'_> {
    fn drop(&mut self) {
        if mounted(self.0) {
            let _ = Command::new("fusermount3")
                .args(["-u", "-z"])
                .arg(self.0)
                .status();
        }
    }
}

/// Starts `kura mount SPEC MNT FLAGS…` and waits until the mount is there.
pub fn start_mount(spec: &str, mnt: &Path, flags: &[&str]) -> Child {
    let mut server = Command::new(env!("CARGO_BIN_EXE_kura"))
        .args(["mount", spec, mnt.to_str().expect("utf8")])
        .args(flags)
        .stderr(Stdio::piped())
        .spawn()
        .expect("start kura mount");
    let start = Instant::now();
    while !mounted(mnt) {
        if let Ok(Some(status)) = server.try_wait() {
            let mut err = String::new();
            if let Some(mut e) = server.stderr.take() {
                use std::io::Read;
                let _ = e.read_to_string(&mut err);
            }
            panic!("kura mount exited ({status}): {err}");
        }
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "mount did not appear"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    server
}

/// Sends `kill -SIG` to `child`.
pub fn signal(child: &Child, sig: &str) {
    let st = Command::new("kill")
        .arg(format!("-{sig}"))
        .arg(child.id().to_string())
        .status()
        .expect("kill");
    assert!(st.success());
}

/// Waits for `child` to exit, killing it (and failing) after `within`.
/// What a child spawned with a piped stderr wrote there (read after it exited), for failure
/// messages.
pub fn stderr_of(child: &mut Child) -> String {
    let mut err = String::new();
    if let Some(mut e) = child.stderr.take() {
        use std::io::Read;
        let _ = e.read_to_string(&mut err);
    }
    err
}

pub fn wait_exit(child: &mut Child, within: Duration) -> std::process::ExitStatus {
    let start = Instant::now();
    loop {
        if let Some(st) = child.try_wait().expect("wait") {
            return st;
        }
        if start.elapsed() > within {
            let _ = child.kill();
            panic!("the child did not exit within {within:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Unmounts the FUSE mount at `mnt` with `fusermount3 -u` (which must succeed) and waits up to
/// two minutes for its `kura mount` process to finish: its exit status.
pub fn unmount(server: &mut Child, mnt: &Path) -> std::process::ExitStatus {
    let st = Command::new("fusermount3")
        .arg("-u")
        .arg(mnt)
        .status()
        .expect("fusermount3");
    assert!(st.success(), "fusermount3 -u");
    wait_exit(server, Duration::from_secs(120))
}

/// A running `kura serve`, killed if it still runs when dropped, and the address from its
/// banner (`nbd://…`, `nbds://…`, or the `nbd+unix://` socket URI).
pub struct Serving {
    pub child: Child,
    pub url: String,
}

impl Serving {
    /// Starts `kura serve args` and reads the address from its banner.
    pub fn start(args: &[&str]) -> Serving {
        let mut child = Command::new(env!("CARGO_BIN_EXE_kura"))
            .arg("serve")
            .args(args)
            .stderr(Stdio::piped())
            .spawn()
            .expect("start kura serve");
        let mut stderr = std::io::BufReader::new(child.stderr.take().expect("stderr"));
        let mut line = String::new();
        stderr.read_line(&mut line).expect("banner");
        let url = line
            .split_whitespace()
            .find(|w| {
                w.starts_with("nbd://") || w.starts_with("nbds://") || w.starts_with("nbd+unix://")
            })
            .unwrap_or_else(|| panic!("no address in {line:?}"))
            .to_string();
        // Keep draining stderr so the server never blocks on a full pipe.
        std::thread::spawn(move || {
            let mut rest = String::new();
            while stderr.read_line(&mut rest).map(|n| n > 0).unwrap_or(false) {}
        });
        Serving { child, url }
    }

    /// The address without its `nbd://` scheme.
    pub fn addr(&self) -> String {
        self.url.trim_start_matches("nbd://").to_string()
    }

    /// Sends `kill -SIG` to the server.
    pub fn signal(&self, sig: &str) {
        signal(&self.child, sig);
    }

    /// Waits for the server to exit, failing after `within`: its exit status.
    pub fn wait(mut self, within: Duration) -> std::process::ExitStatus {
        wait_exit(&mut self.child, within)
    }

    /// SIGTERM, then a wait of up to two minutes: the server drains and flushes its exports.
    pub fn stop(self) -> std::process::ExitStatus {
        self.signal("TERM");
        self.wait(Duration::from_secs(120))
    }
}

impl Drop for Serving {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `kura genome simulate` into `dir`: a 300 kbp genome and `reads` reads, paired when asked.
pub fn simulate(dir: &Path, reads: &str, paired: bool) {
    let d = dir.to_str().expect("utf-8 path");
    let mut args = vec![
        "genome",
        "simulate",
        "-o",
        d,
        "--genome-size",
        "300000",
        "--reads",
        reads,
    ];
    if paired {
        args.push("--paired");
    }
    ok(&args);
}

/// How many reads the accuracy line in `stderr` (of `genome map --score`) says were placed
/// correctly.
pub fn correct_of(stderr: &str) -> u64 {
    let line = stderr
        .lines()
        .find(|l| l.contains("placed correctly"))
        .unwrap_or_else(|| panic!("no accuracy line: {stderr}"));
    line.split_whitespace()
        .nth(1)
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("bad accuracy line: {line}"))
}

/// On the AccelFS at `spec`: puts `dir`'s `reference.fa` and `reads_1.fq` at its root, indexes
/// the reference to `/idx/ref.kgi` and maps the reads to `/out.sam` with `--score`, all with
/// `--dev`: how many reads the accuracy line says were placed correctly.
pub fn index_and_map_on(spec: &str, dir: &Path) -> u64 {
    for f in ["reference.fa", "reads_1.fq"] {
        ok(&[
            "fs",
            "put",
            spec,
            dir.join(f).to_str().expect("utf-8 path"),
            &format!("/{f}"),
        ]);
    }
    ok(&[
        "genome",
        "index",
        "/reference.fa",
        "-o",
        "/idx/ref.kgi",
        "--dev",
        spec,
    ]);
    let o = ok_output(&[
        "genome",
        "map",
        "/idx/ref.kgi",
        "/reads_1.fq",
        "-o",
        "/out.sam",
        "--dev",
        spec,
        "--score",
    ]);
    correct_of(&String::from_utf8_lossy(&o.stderr))
}

/// Formats AccelFS on `spec`, opened through `registry`: where a key-value store at `/db` on it
/// lives, and options that create the store on its first open. `Err` names the spec and the step.
pub fn fresh_db(
    registry: &kura_engine::Registry,
    spec: &str,
) -> Result<(kura_kv::Location, kura_kv::DbOptions), String> {
    use kura_accelfs::fs::{FileSystem, MountOptions};
    let dev = registry.open(spec).map_err(|e| format!("{spec}: {e}"))?;
    FileSystem::format(
        dev,
        kura_accelfs::MkfsOptions::default(),
        MountOptions::default(),
    )
    .and_then(FileSystem::unmount)
    .map_err(|e| format!("mkfs on {spec}: {e}"))?;
    let store = kura_kv::Location::Device {
        spec: spec.to_string(),
        path: "/db".into(),
        registry: registry.clone(),
    };
    let opts = kura_kv::DbOptions {
        create_if_missing: true,
        ..kura_kv::DbOptions::default()
    };
    Ok((store, opts))
}
