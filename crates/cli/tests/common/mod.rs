//! What the CLI's tests share: running the `kura` binary (its output, success and failure
//! checks), and FUSE mounts that are always taken down, even when a test fails.

#![allow(dead_code)]

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
