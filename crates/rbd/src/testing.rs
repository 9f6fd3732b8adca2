//! A throw-away Ceph cluster for tests and benches: `scripts/ceph/start.sh` in a temporary
//! directory (1 monitor, 1 manager, 3 memstore OSDs on 127.0.0.1, cephx, pool `rbd` of size 3 /
//! min_size 2), stopped by `scripts/ceph/stop.sh` when the [`TestCluster`] is dropped. The script
//! also gets this process's pid as `--owner`, so a watchdog stops the daemons even if the process
//! is killed before `Drop` runs: nothing is left running either way.
//!
//! Also the few cluster chores tests need: `rbd`/`ceph` commands on this cluster, killing and
//! restarting one OSD, stopping the monitor, a keyring with the wrong key; and [`run_checks`],
//! which runs a test binary's named checks on one cluster and collects their failures.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

/// The repository's `scripts/ceph` directory.
pub fn scripts_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/ceph")
}

/// True when the Ceph daemons needed for [`TestCluster::start`] are installed.
pub fn daemons_installed() -> bool {
    ["ceph-mon", "ceph-mgr", "ceph-osd", "ceph", "rbd"]
        .iter()
        .all(|tool| {
            std::env::var_os("PATH").is_some_and(|path| {
                std::env::split_paths(&path).any(|dir| dir.join(tool).is_file())
            })
        })
}

/// A running cluster whose state lives in a temporary directory; stopped on drop.
#[derive(Debug)]
pub struct TestCluster {
    _dir: tempfile::TempDir,
    root: PathBuf,
    conf: PathBuf,
    /// Seconds `start.sh` took (monitor to HEALTH_OK).
    pub start_secs: f64,
}

impl TestCluster {
    /// Starts a cluster (about 12 s). Errors carry the script's log.
    pub fn start() -> Result<TestCluster, String> {
        let dir = tempfile::Builder::new()
            .prefix("kura-ceph")
            .tempdir()
            .map_err(|e| format!("cannot make a temporary directory: {e}"))?;
        let root = dir.path().join("c");
        let t0 = Instant::now();
        let out = Command::new("bash")
            .arg(scripts_dir().join("start.sh"))
            .arg(&root)
            .arg("--owner")
            .arg(std::process::id().to_string())
            .output()
            .map_err(|e| format!("cannot run start.sh: {e}"))?;
        let start_secs = t0.elapsed().as_secs_f64();
        if !out.status.success() {
            let log = std::fs::read_to_string(root.join("start.log")).unwrap_or_default();
            let _ = Command::new("bash")
                .arg(scripts_dir().join("stop.sh"))
                .arg(&root)
                .output();
            return Err(format!(
                "start.sh failed ({}): {}\n{log}",
                out.status,
                String::from_utf8_lossy(&out.stderr)
            ));
        }
        let conf = root.join("ceph.conf");
        Ok(TestCluster {
            _dir: dir,
            root,
            conf,
            start_secs,
        })
    }

    /// The cluster's ceph.conf.
    pub fn conf(&self) -> &Path {
        &self.conf
    }

    /// The directory holding the cluster's state, logs and pid files.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// `rbd:rbd/IMAGE?conf=...` plus `extra` options (each `&k=v` without the `&`).
    pub fn spec(&self, image: &str, extra: &str) -> String {
        let mut s = format!("rbd:rbd/{image}?conf={}", self.conf.display());
        if !extra.is_empty() {
            s.push('&');
            s.push_str(extra);
        }
        s
    }

    /// Runs `rbd -c CONF ARGS`.
    pub fn rbd(&self, args: &[&str]) -> Output {
        self.tool("rbd", args)
    }

    /// Runs `ceph -c CONF ARGS`.
    pub fn ceph(&self, args: &[&str]) -> Output {
        self.tool("ceph", args)
    }

    fn tool(&self, tool: &str, args: &[&str]) -> Output {
        Command::new(tool)
            .arg("-c")
            .arg(&self.conf)
            .args(args)
            .output()
            .unwrap_or_else(|e| panic!("cannot run {tool}: {e}"))
    }

    /// Runs `rbd ARGS` and fails with its stderr unless it succeeds.
    pub fn rbd_ok(&self, args: &[&str]) -> Result<Vec<u8>, String> {
        ok(self.rbd(args), "rbd", args)
    }

    /// Runs `ceph ARGS` and fails with its stderr unless it succeeds.
    pub fn ceph_ok(&self, args: &[&str]) -> Result<Vec<u8>, String> {
        ok(self.ceph(args), "ceph", args)
    }

    /// The pid of daemon `name` (`osd.1`, `mon.a`) from its pid file.
    pub fn pid(&self, name: &str) -> Result<i32, String> {
        let path = self.root.join("run").join(format!("{name}.pid"));
        let text =
            std::fs::read_to_string(&path).map_err(|e| format!("{}: {e}", path.display()))?;
        text.trim()
            .parse()
            .map_err(|_| format!("{}: not a pid: {text}", path.display()))
    }

    /// Kills daemon `name` with `signal` and waits for it to exit.
    pub fn kill(&self, name: &str, signal: &str) -> Result<(), String> {
        let pid = self.pid(name)?;
        let out = Command::new("kill")
            .arg(format!("-{signal}"))
            .arg(pid.to_string())
            .output()
            .map_err(|e| e.to_string())?;
        if !out.status.success() {
            return Err(format!(
                "kill {pid}: {}",
                String::from_utf8_lossy(&out.stderr)
            ));
        }
        let proc_dir = PathBuf::from(format!("/proc/{pid}"));
        let deadline = Instant::now() + Duration::from_secs(30);
        while proc_dir.exists() && !is_zombie(pid) {
            if Instant::now() > deadline {
                return Err(format!(
                    "{name} (pid {pid}) still runs 30 s after SIG{signal}"
                ));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(())
    }

    /// Starts OSD `id` again (after [`TestCluster::kill`]).
    pub fn restart_osd(&self, id: u32) -> Result<(), String> {
        // The daemon forks and keeps running: it must not hold pipes this process waits on.
        let status = Command::new("ceph-osd")
            .arg("-c")
            .arg(&self.conf)
            .arg("-i")
            .arg(id.to_string())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .map_err(|e| e.to_string())?;
        if !status.success() {
            return Err(format!(
                "ceph-osd -i {id} failed ({status}); see {}",
                self.root.join("log").display()
            ));
        }
        Ok(())
    }

    /// Waits until `ceph pg stat` shows every PG active+clean (at most `limit`).
    pub fn wait_clean(&self, limit: Duration) -> Result<(), String> {
        let deadline = Instant::now() + limit;
        loop {
            let out = self.ceph(&["pg", "stat"]);
            let text = String::from_utf8_lossy(&out.stdout).into_owned();
            if all_clean(&text) {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(format!("PGs not all active+clean after {limit:?}: {text}"));
            }
            std::thread::sleep(Duration::from_millis(300));
        }
    }

    /// A keyring for `client.admin` holding a freshly generated (wrong) key.
    pub fn wrong_keyring(&self) -> Result<PathBuf, String> {
        let path = self.root.join("wrong.keyring");
        let out = Command::new("ceph-authtool")
            .arg("--create-keyring")
            .arg(&path)
            .args(["--gen-key", "-n", "client.admin"])
            .output()
            .map_err(|e| e.to_string())?;
        ok(out, "ceph-authtool", &["--create-keyring"])?;
        Ok(path)
    }
}

impl Drop for TestCluster {
    fn drop(&mut self) {
        let _ = Command::new("bash")
            .arg(scripts_dir().join("stop.sh"))
            .arg(&self.root)
            .output();
    }
}

/// True when `ceph pg stat` output says every PG is active+clean.
pub fn all_clean(pg_stat: &str) -> bool {
    let mut words = pg_stat.split_whitespace();
    let (Some(total), Some("pgs:"), Some(clean), Some(state)) =
        (words.next(), words.next(), words.next(), words.next())
    else {
        return false;
    };
    total == clean && state.trim_end_matches(';') == "active+clean"
}

/// Why a test cluster with `rbd:` on it cannot run here, if it cannot: the Ceph daemons and tools
/// are not installed, or librbd cannot be loaded (or this build has no `rbd:`).
pub fn missing() -> Option<&'static str> {
    (!daemons_installed() || crate::librbd_available().is_err())
        .then_some("ceph-mon/ceph-osd/ceph-mgr/rbd or librbd1 not installed")
}

/// One named check on a shared cluster: it passes by returning and fails by panicking.
pub type Check = fn(&TestCluster);

/// Starts one cluster and runs every check on it, in order. A check's panic is caught and
/// collected with the check's name, so one failure does not hide the others; each outcome and
/// its time go to stderr. The cluster is stopped before this returns. `Err` says why the cluster
/// did not start, or names every failed check with its panic message.
pub fn run_checks(checks: &[(&str, Check)]) -> Result<(), String> {
    let cluster = TestCluster::start().map_err(|e| format!("start the test cluster: {e}"))?;
    eprintln!("cluster up in {:.1} s", cluster.start_secs);
    let mut failed = Vec::new();
    for (name, check) in checks {
        let t0 = Instant::now();
        match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| check(&cluster))) {
            Ok(()) => eprintln!("ok   {name} ({:.1} s)", t0.elapsed().as_secs_f64()),
            Err(panic) => {
                let why = panic
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                    .unwrap_or_default();
                eprintln!("FAIL {name}: {why}");
                failed.push(format!("{name}: {why}"));
            }
        }
    }
    drop(cluster);
    if failed.is_empty() {
        Ok(())
    } else {
        Err(format!("failed checks:\n{}", failed.join("\n")))
    }
}

fn is_zombie(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| {
            s.rsplit_once(')')
                .map(|(_, rest)| rest.trim_start().starts_with('Z'))
        })
        .unwrap_or(true)
}

fn ok(out: Output, tool: &str, args: &[&str]) -> Result<Vec<u8>, String> {
    if out.status.success() {
        Ok(out.stdout)
    } else {
        Err(format!(
            "{tool} {} failed ({}): {}",
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stderr)
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pg_stat_lines_are_read() {
        assert!(all_clean(
            "33 pgs: 33 active+clean; 19 B data, 111 KiB used"
        ));
        assert!(!all_clean("33 pgs: 30 active+clean, 3 peering; 19 B data"));
        assert!(!all_clean("33 pgs: 33 active+undersized+degraded; x"));
        assert!(!all_clean(""));
    }
}
