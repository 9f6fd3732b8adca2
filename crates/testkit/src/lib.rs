//! Test-only helpers for kura's test suites: skips that cannot hide.
//!
//! A test that cannot run on this machine because something it needs is missing calls [`skip`]
//! with its name, the missing *capability* (a short stable name: `nbdinfo`, `io_uring`, `root`,
//! `fuse`, `loop-device`, `nvme-guest`, `rocksdict`, ...) and a reason, and returns. [`skip`]
//!
//! 1. prints `SKIPPED <test>: <capability>: <reason>` to stderr;
//! 2. appends one line, `test<TAB>capability<TAB>reason`, to the skip log: `$KURA_SKIP_LOG` if
//!    set, else `<workspace>/target/kura-skips.log` (opened for append, one write per line, so
//!    parallel test processes do not clobber each other). `scripts/test.sh` clears it before a
//!    run and prints it after, so skips are seen even though the test harness swallows stderr;
//! 3. when the environment variable `CI` is `true` (or `1`), panics, failing the test, unless
//!    the capability is listed in the checked-in allow-list `.ci/allowed-skips` (one
//!    `capability reason` per line, tab or space between, `#` comments).
//!
//! A skip must fire only because the specific capability is missing, never on an arbitrary
//! error: check presence up front ([`which`], [`missing_tool`], [`is_root`],
//! [`fuse_unavailable`], [`loop_unavailable`], [`python_module_missing`]) and treat any failure
//! after that as a test failure.
//!
//! [`skip_in`] is [`skip`] with the environment passed in ([`SkipEnv`]), so the CI rule and the
//! allow-list can be tested without touching process-wide environment variables.
//!
//! Under user-mode emulation (`scripts/aarch64.sh` runs aarch64 test binaries through
//! `qemu-aarch64` with `KURA_EMULATOR=qemu-aarch64`) a skip's capability is prefixed with the
//! emulator's name, e.g. `qemu-aarch64:io_uring`: what qemu-user cannot emulate is allowed under
//! its own name in `.ci/allowed-skips`, while the same capability missing on a native run stays a
//! failure. The variable is honoured only in binaries built for a target other than x86-64, so a
//! stray `KURA_EMULATOR` cannot loosen the native x86-64 run.
#![forbid(unsafe_code)]

mod nbdfuse;
pub use nbdfuse::{run_tool, NbdLoop};

use std::fs::OpenOptions;
use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

/// Where [`skip_in`] logs and what it enforces: the values [`skip`] reads from the environment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SkipEnv {
    /// `CI` is `true` (or `1`): a skip not in the allow-list fails the test.
    pub ci: bool,
    /// The skip log lines are appended to.
    pub log: PathBuf,
    /// The allow-list of capabilities that may be missing under CI.
    pub allow_list: PathBuf,
    /// The user-mode emulator running this binary (`qemu-aarch64`), which prefixes capabilities.
    pub emulator: Option<String>,
}

impl SkipEnv {
    /// `CI`, `KURA_SKIP_LOG` (default `<workspace>/target/kura-skips.log`) and
    /// `<workspace>/.ci/allowed-skips`.
    pub fn from_env() -> SkipEnv {
        let ci = std::env::var("CI")
            .map(|v| is_ci_value(&v))
            .unwrap_or(false);
        let log = std::env::var_os("KURA_SKIP_LOG")
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
            .unwrap_or_else(|| workspace_root().join("target").join("kura-skips.log"));
        SkipEnv {
            ci,
            log,
            allow_list: workspace_root().join(".ci").join("allowed-skips"),
            emulator: emulator_of(std::env::var("KURA_EMULATOR").ok()),
        }
    }
}

/// The emulator named by `KURA_EMULATOR`, honoured only off x86-64 (see the crate docs).
fn emulator_of(var: Option<String>) -> Option<String> {
    if cfg!(target_arch = "x86_64") {
        return None;
    }
    var.map(|v| one_line(&v)).filter(|v| !v.is_empty())
}

/// Whether a value of `CI` means "this is a CI run".
pub fn is_ci_value(v: &str) -> bool {
    v.eq_ignore_ascii_case("true") || v == "1"
}

/// Records that `test` does not run here because `capability` is missing (see the crate docs):
/// prints it, logs it and, under `CI=true`, panics unless the allow-list permits it. The caller
/// returns right after.
pub fn skip(test: &str, capability: &str, reason: &str) {
    skip_with(&SkipEnv::from_env(), test, capability, reason)
}

/// [`skip`] with its environment given: panics where [`skip_in`] refuses.
pub fn skip_with(env: &SkipEnv, test: &str, capability: &str, reason: &str) {
    if let Err(why) = skip_in(env, test, capability, reason) {
        panic!("{why}");
    }
}

/// [`skip`] with its environment given: `Err` says why the skip is refused (CI and the
/// capability is not allowed, or under CI the log or the allow-list cannot be used).
pub fn skip_in(env: &SkipEnv, test: &str, capability: &str, reason: &str) -> Result<(), String> {
    let test = one_line(test);
    let capability = match &env.emulator {
        Some(emulator) => format!("{emulator}:{}", one_line(capability)),
        None => one_line(capability),
    };
    let reason = one_line(reason);
    eprintln!("SKIPPED {test}: {capability}: {reason}");
    let logged = append_line(&env.log, &format!("{test}\t{capability}\t{reason}\n"));
    if !env.ci {
        if let Err(e) = logged {
            eprintln!("warning: cannot log the skip to {}: {e}", env.log.display());
        }
        return Ok(());
    }
    logged.map_err(|e| format!("cannot log the skip to {}: {e}", env.log.display()))?;
    let allowed = read_allow_list(&env.allow_list)?;
    if allowed.iter().any(|a| a.capability == capability) {
        return Ok(());
    }
    Err(format!(
        "{test} would be skipped under CI, which allows no skip for `{capability}` ({reason}): \
         install it (scripts/setup.sh), or if CI cannot have it, list `{capability}` and the \
         reason in {}",
        env.allow_list.display()
    ))
}

/// One entry of the allow-list: a capability CI may lack, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Allowed {
    pub capability: String,
    pub reason: String,
}

/// Parses an allow-list: one `capability reason` per line (tab or spaces between), blank lines
/// and lines starting with `#` ignored. An entry without a reason is an error: every allowed
/// skip says why.
pub fn parse_allow_list(text: &str) -> Result<Vec<Allowed>, String> {
    let mut out = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let (capability, reason) = line
            .split_once(|c: char| c.is_whitespace())
            .map(|(c, r)| (c, r.trim()))
            .unwrap_or((line, ""));
        if reason.is_empty() {
            return Err(format!(
                "allow-list line {}: `{capability}` has no reason",
                n + 1
            ));
        }
        out.push(Allowed {
            capability: capability.to_string(),
            reason: reason.to_string(),
        });
    }
    Ok(out)
}

/// Reads and parses the allow-list at `path`; a missing file is an empty list.
pub fn read_allow_list(path: &Path) -> Result<Vec<Allowed>, String> {
    match std::fs::read_to_string(path) {
        Ok(text) => parse_allow_list(&text).map_err(|e| format!("{}: {e}", path.display())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Vec::new()),
        Err(e) => Err(format!("cannot read {}: {e}", path.display())),
    }
}

fn one_line(s: &str) -> String {
    s.trim()
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect()
}

fn append_line(path: &Path, line: &str) -> std::io::Result<()> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir)?;
    }
    let mut f = OpenOptions::new().create(true).append(true).open(path)?;
    // One write of the whole line: with O_APPEND, lines from parallel processes do not interleave.
    f.write_all(line.as_bytes())
}

/// The workspace root: the nearest directory above this crate whose `Cargo.toml` has a
/// `[workspace]` table.
pub fn workspace_root() -> PathBuf {
    let here = Path::new(env!("CARGO_MANIFEST_DIR"));
    here.ancestors()
        .find(|dir| {
            std::fs::read_to_string(dir.join("Cargo.toml"))
                .is_ok_and(|t| t.lines().any(|l| l.trim() == "[workspace]"))
        })
        .map(Path::to_path_buf)
        .unwrap_or_else(|| here.join("../.."))
}

/// A capability this machine lacks, and why: what a test passes to [`skip`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Missing {
    pub capability: String,
    pub reason: String,
}

impl Missing {
    pub fn new(capability: impl Into<String>, reason: impl Into<String>) -> Missing {
        Missing {
            capability: capability.into(),
            reason: reason.into(),
        }
    }

    /// [`skip`]s `test` for this capability.
    pub fn skip(&self, test: &str) {
        skip(test, &self.capability, &self.reason)
    }
}

/// The executable `tool` on `PATH` (or `tool` itself when it contains a `/`), if there is one.
/// Presence only: whether it then works is for the test to find out.
pub fn which(tool: &str) -> Option<PathBuf> {
    let executable = |p: &Path| {
        std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
    };
    if tool.contains('/') {
        let p = PathBuf::from(tool);
        return executable(&p).then_some(p);
    }
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join(tool))
        .find(|p| executable(p))
}

/// `Some` when `tool` is not on `PATH`; `install` says how to get it (e.g. "apt-get install
/// libnbd-bin"). The capability is the tool's name.
pub fn missing_tool(tool: &str, install: &str) -> Option<Missing> {
    which(tool)
        .is_none()
        .then(|| Missing::new(tool, format!("{tool} is not on PATH ({install})")))
}

/// Whether this process runs with effective user id 0 (from `/proc/self/status`).
pub fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status").is_ok_and(|s| {
        s.lines()
            .find_map(|l| l.strip_prefix("Uid:"))
            .and_then(|ids| ids.split_whitespace().nth(1).map(|e| e == "0"))
            .unwrap_or(false)
    })
}

/// Why FUSE cannot be used here, if it cannot: `/dev/fuse` missing or not openable (capability
/// `fuse`), or `fusermount3` not installed (capability `fusermount3`). Any other error opening
/// `/dev/fuse` panics: it is a failure, not a missing capability.
pub fn fuse_unavailable() -> Option<Missing> {
    match OpenOptions::new().read(true).write(true).open("/dev/fuse") {
        Ok(_) => {}
        Err(e)
            if matches!(
                e.kind(),
                std::io::ErrorKind::NotFound | std::io::ErrorKind::PermissionDenied
            ) || matches!(e.raw_os_error(), Some(6 /* ENXIO */ | 19 /* ENODEV */)) =>
        {
            return Some(Missing::new("fuse", format!("/dev/fuse: {e}")));
        }
        Err(e) => panic!("opening /dev/fuse: {e}"),
    }
    missing_tool("fusermount3", "apt-get install fuse3")
}

/// Why loop devices cannot be attached here, if they cannot: not root (capability `root`),
/// `losetup` missing (`losetup`), or no `/dev/loop-control` (`loop-device`: no loop driver in
/// this kernel or container). When this is `None`, a failing `losetup` is a test failure.
pub fn loop_unavailable() -> Option<Missing> {
    if !is_root() {
        return Some(Missing::new(
            "root",
            "not running as root (attaching loop devices needs it)",
        ));
    }
    if let Some(m) = missing_tool("losetup", "apt-get install util-linux") {
        return Some(m);
    }
    if !Path::new("/dev/loop-control").exists() {
        return Some(Missing::new(
            "loop-device",
            "/dev/loop-control is missing (no loop driver in this kernel or container)",
        ));
    }
    None
}

/// A loop device over an image file, detached when dropped (also when the test fails). Call it
/// only after [`loop_unavailable`] said `None`: then a failing `losetup` panics as a failure.
pub struct LoopDevice {
    path: String,
}

impl LoopDevice {
    /// Creates `image` with `bytes` bytes and attaches the first free loop device to it.
    pub fn attach(image: &Path, bytes: u64) -> LoopDevice {
        std::fs::File::create(image)
            .and_then(|f| f.set_len(bytes))
            .unwrap_or_else(|e| panic!("creating {}: {e}", image.display()));
        let out = Command::new("losetup")
            .args(["--find", "--show"])
            .arg(image)
            .output()
            .unwrap_or_else(|e| panic!("running losetup: {e}"));
        assert!(
            out.status.success(),
            "losetup failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
        LoopDevice {
            path: String::from_utf8_lossy(&out.stdout).trim().to_string(),
        }
    }

    /// The device node, e.g. `/dev/loop3`.
    pub fn path(&self) -> &str {
        &self.path
    }
}

impl Drop for LoopDevice {
    fn drop(&mut self) {
        let _ = Command::new("losetup").arg("-d").arg(&self.path).status();
    }
}

/// Why `python3 -c "import <module>"` cannot work here, if it cannot: `python3` not on `PATH`
/// (capability `python3`) or Python reports `No module named '<module>'` (capability
/// `<module>`; `pip` says how to install it). Any other failure (python3 not starting, the
/// module installed but broken) panics: it is a failure, not a missing capability.
pub fn python_module_missing(module: &str, pip: &str) -> Option<Missing> {
    if let Some(m) = missing_tool("python3", "apt-get install python3") {
        return Some(m);
    }
    let out = Command::new("python3")
        .args(["-c", &format!("import {module}")])
        .output()
        .unwrap_or_else(|e| panic!("python3 is on PATH but does not start: {e}"));
    if out.status.success() {
        return None;
    }
    let stderr = String::from_utf8_lossy(&out.stderr);
    let top = module.split('.').next().unwrap_or(module);
    if stderr.contains(&format!("No module named '{top}'")) {
        return Some(Missing::new(
            module,
            format!("Python module {module} is not installed (python3 -m pip install {pip})"),
        ));
    }
    panic!("python3 -c 'import {module}' failed: {stderr}");
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(dir: &Path, ci: bool, allow: Option<&str>) -> SkipEnv {
        let allow_list = dir.join("allowed-skips");
        if let Some(text) = allow {
            std::fs::write(&allow_list, text).expect("write allow-list");
        }
        SkipEnv {
            ci,
            log: dir.join("target").join("skips.log"),
            allow_list,
            emulator: None,
        }
    }

    fn log(e: &SkipEnv) -> String {
        std::fs::read_to_string(&e.log).expect("skip log")
    }

    #[test]
    fn allow_list_parses_tabs_spaces_and_comments() {
        let list = parse_allow_list(
            "# CI cannot have these\n\nnvme-guest\tno nested virtualisation on the runner\n  \
             fuse   no /dev/fuse in the container # really\n# io_uring only commented out\n",
        )
        .expect("parses");
        assert_eq!(
            list,
            vec![
                Allowed {
                    capability: "nvme-guest".into(),
                    reason: "no nested virtualisation on the runner".into()
                },
                Allowed {
                    capability: "fuse".into(),
                    reason: "no /dev/fuse in the container # really".into()
                },
            ]
        );
        assert_eq!(parse_allow_list("# nothing\n\n").expect("empty"), vec![]);
    }

    #[test]
    fn allow_list_entries_need_a_reason() {
        let e = parse_allow_list("fuse why not\nnbdinfo\n").unwrap_err();
        assert!(e.contains("line 2") && e.contains("nbdinfo"), "{e}");
        assert!(parse_allow_list("nbdinfo   \t\n").is_err());
    }

    #[test]
    fn under_an_emulator_only_the_prefixed_capability_is_allowed() {
        let dir = tempfile::tempdir().expect("tempdir");
        let native = env(
            dir.path(),
            true,
            Some("qemu-aarch64:io_uring qemu-user does not emulate io_uring_setup\n"),
        );
        assert!(
            skip_in(&native, "t1", "io_uring", "ENOSYS").is_err(),
            "a native run stays strict"
        );
        let emulated = SkipEnv {
            emulator: Some("qemu-aarch64".into()),
            ..native
        };
        skip_in(&emulated, "t2", "io_uring", "ENOSYS").expect("allowed under qemu-aarch64");
        assert!(skip_in(&emulated, "t3", "root", "x").is_err());
        assert!(log(&emulated).contains("t2\tqemu-aarch64:io_uring\tENOSYS\n"));
        // KURA_EMULATOR counts only in binaries that are not x86-64.
        let honoured = emulator_of(Some("qemu-aarch64".into()));
        assert_eq!(honoured.is_some(), !cfg!(target_arch = "x86_64"));
        assert_eq!(emulator_of(Some(" ".into())), None);
        assert_eq!(emulator_of(None), None);
    }

    #[test]
    fn outside_ci_a_skip_is_logged_and_passes() {
        let dir = tempfile::tempdir().expect("tempdir");
        let e = env(dir.path(), false, None);
        skip_in(&e, "t1", "nbdinfo", "nbdinfo is not on PATH").expect("allowed outside CI");
        skip_in(&e, "t2", "fuse", "two\nlines\tand a tab").expect("allowed outside CI");
        assert_eq!(
            log(&e),
            "t1\tnbdinfo\tnbdinfo is not on PATH\nt2\tfuse\ttwo lines and a tab\n"
        );
    }

    #[test]
    fn under_ci_a_skip_fails_unless_allowed_and_is_logged_either_way() {
        let dir = tempfile::tempdir().expect("tempdir");
        let e = env(
            dir.path(),
            true,
            Some("# comment\nnvme-guest no KVM on the runner\n"),
        );
        let refused = skip_in(&e, "t1", "nbdinfo", "not installed").unwrap_err();
        assert!(
            refused.contains("t1")
                && refused.contains("nbdinfo")
                && refused.contains("allowed-skips"),
            "{refused}"
        );
        skip_in(&e, "t2", "nvme-guest", "no qemu").expect("listed in the allow-list");
        // A prefix or a commented-out name is not a listing.
        assert!(skip_in(&e, "t3", "nvme", "x").is_err());
        assert!(skip_in(&e, "t4", "comment", "x").is_err());
        let logged = log(&e);
        assert_eq!(logged.lines().count(), 4, "{logged}");
        assert!(
            logged.starts_with("t1\tnbdinfo\tnot installed\n"),
            "{logged}"
        );
    }

    #[test]
    fn under_ci_a_missing_allow_list_allows_nothing_and_a_bad_one_fails() {
        let dir = tempfile::tempdir().expect("tempdir");
        let e = env(dir.path(), true, None);
        assert!(skip_in(&e, "t", "root", "not root").is_err());
        let e = env(dir.path(), true, Some("root\n"));
        let err = skip_in(&e, "t", "root", "not root").unwrap_err();
        assert!(err.contains("no reason"), "{err}");
    }

    #[test]
    #[should_panic(expected = "would be skipped under CI")]
    fn skip_with_panics_under_ci() {
        let dir = tempfile::tempdir().expect("tempdir");
        let e = env(dir.path(), true, Some(""));
        skip_with(&e, "t", "io_uring", "ENOSYS");
    }

    #[test]
    fn parallel_appends_keep_whole_lines() {
        let dir = tempfile::tempdir().expect("tempdir");
        let e = env(dir.path(), false, None);
        std::thread::scope(|s| {
            for t in 0..8 {
                let e = &e;
                s.spawn(move || {
                    for i in 0..50 {
                        skip_in(e, &format!("t{t}"), "cap", &format!("reason {i}")).expect("skip");
                    }
                });
            }
        });
        let logged = log(&e);
        assert_eq!(logged.lines().count(), 400);
        assert!(logged
            .lines()
            .all(|l| l.split('\t').count() == 3 && l.contains("\tcap\treason ")));
    }

    #[test]
    fn ci_values_and_helpers() {
        assert!(is_ci_value("true") && is_ci_value("TRUE") && is_ci_value("1"));
        assert!(!is_ci_value("false") && !is_ci_value("") && !is_ci_value("0"));
        assert!(
            workspace_root().join(".ci").is_dir() || workspace_root().join("Cargo.toml").is_file()
        );
        assert!(which("sh").is_some());
        assert!(which("kura-no-such-tool-anywhere").is_none());
        let m = missing_tool("kura-no-such-tool-anywhere", "nowhere").expect("missing");
        assert_eq!(m.capability, "kura-no-such-tool-anywhere");
        assert!(missing_tool("sh", "coreutils").is_none());
    }
}
