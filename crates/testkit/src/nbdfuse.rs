//! An NBD export as a kernel block device on a host whose kernel has no NBD driver: `nbdfuse`
//! shows the export as a file in a FUSE directory and a loop device is attached to that file.
//! The kernel file-system tests over kura's exports share this setup and its teardown.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Runs `cmd args`; its stdout, or an error naming the command with its output.
pub fn run_tool(cmd: &str, args: &[&str]) -> Result<String, String> {
    let o = Command::new(cmd)
        .args(args)
        .output()
        .map_err(|e| format!("{cmd}: {e}"))?;
    if o.status.success() {
        Ok(String::from_utf8_lossy(&o.stdout).into_owned())
    } else {
        Err(format!(
            "{cmd} {args:?}: {}{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        ))
    }
}

/// `nbdfuse` serving one export as a file, with a loop device on it; dropping it detaches the
/// loop device, unmounts the FUSE directory and waits for `nbdfuse`.
pub struct NbdLoop {
    nbdfuse: Child,
    fuse_dir: PathBuf,
    /// The loop device (`/dev/loopN`) over the export.
    pub device: String,
}

impl NbdLoop {
    /// Starts `nbdfuse FUSE_DIR URL` under `dir`, waits up to `limit` for its file and attaches
    /// a loop device. The caller has checked that FUSE, nbdfuse, root and loop devices are here,
    /// so any failure is a test failure (a panic with the tool's words).
    pub fn attach(dir: &Path, url: &str, limit: Duration) -> NbdLoop {
        let fuse_dir = dir.join("fuse");
        std::fs::create_dir(&fuse_dir).expect("mkdir fuse");
        // nbdfuse's stderr goes to a file: read when it fails, and never a pipe it could fill.
        let log = dir.join("nbdfuse.log");
        let stderr = std::fs::File::create(&log).expect("nbdfuse log");
        let mut nbdfuse = Command::new("nbdfuse")
            .arg(&fuse_dir)
            .arg(url)
            .stderr(Stdio::from(stderr))
            .spawn()
            .expect("nbdfuse");
        let image = fuse_dir.join("nbd");
        let start = Instant::now();
        while !image.exists() {
            if let Ok(Some(st)) = nbdfuse.try_wait() {
                let err = std::fs::read_to_string(&log).unwrap_or_default();
                panic!("nbdfuse exited ({st}) although FUSE and the tools are here: {err}");
            }
            assert!(
                start.elapsed() < limit,
                "nbdfuse did not expose {url} within {limit:?}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        let mut attached = NbdLoop {
            nbdfuse,
            fuse_dir,
            device: String::new(),
        };
        let image = image.to_str().expect("utf-8");
        match run_tool("losetup", &["-f", "--show", image]) {
            Ok(l) => attached.device = l.trim().to_string(),
            Err(e) => panic!("losetup failed although root and /dev/loop-control are here: {e}"),
        }
        attached
    }
}

impl Drop for NbdLoop {
    fn drop(&mut self) {
        if !self.device.is_empty() {
            let _ = run_tool("losetup", &["-d", &self.device]);
        }
        if let Some(dir) = self.fuse_dir.to_str() {
            let _ = run_tool("fusermount3", &["-u", dir]);
        }
        let _ = self.nbdfuse.wait();
    }
}
