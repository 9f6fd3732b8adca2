//! The mappers `kura bench genome` runs side by side: kura's own `kura genome index` / `kura
//! genome map`, `minimap2 -ax sr`, `bwa mem` and `bowtie2`, each as child processes whose wall
//! time and peak RSS are their own ([`measured`]), the index built by a separate timed command
//! before any mapping, and every SAM scored by the same code ([`score_sam`]: primary records,
//! correct within 10 bp of the simulated origin, misplaced with MAPQ ≥ 20 counted apart).
//!
//! The MAPQ scales differ (minimap2 and bwa cap at 60, bowtie2 at 42, kura at 60); the same
//! rule (MAPQ ≥ 20) is applied to all and the highest MAPQ each tool wrote is reported beside
//! it, so a reader can see the scale it was applied to.

use anyhow::{bail, Context};
use kura_genome::paths::drop_page_cache;
use kura_genome::truth::{score_sam, ScoreOptions};
use serde::Serialize;
use std::io::BufRead;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// A mapper compared in the genome benches.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum Tool {
    #[serde(rename = "kura")]
    Kura,
    #[serde(rename = "minimap2")]
    Minimap2,
    #[serde(rename = "bwa mem")]
    Bwa,
    #[serde(rename = "bowtie2")]
    Bowtie2,
}

impl Tool {
    /// Every tool, kura first.
    pub const ALL: [Tool; 4] = [Tool::Kura, Tool::Minimap2, Tool::Bwa, Tool::Bowtie2];

    /// Short name (JSON keys, tables, plots).
    pub fn name(self) -> &'static str {
        match self {
            Tool::Kura => "kura",
            Tool::Minimap2 => "minimap2",
            Tool::Bwa => "bwa mem",
            Tool::Bowtie2 => "bowtie2",
        }
    }

    /// The programs the tool needs on PATH and the package that provides them.
    fn programs(self) -> (&'static [&'static str], &'static str) {
        match self {
            Tool::Kura => (&[], ""),
            Tool::Minimap2 => (&["minimap2"], "minimap2"),
            Tool::Bwa => (&["bwa"], "bwa"),
            Tool::Bowtie2 => (&["bowtie2", "bowtie2-build"], "bowtie2"),
        }
    }

    /// `Ok` when the tool can run here, else why not (printed and recorded, never silent).
    pub fn available(self) -> Result<(), String> {
        let (programs, package) = self.programs();
        match programs.iter().find(|p| which(p).is_none()) {
            None => Ok(()),
            Some(p) => Err(format!(
                "{p} is not installed (apt-get install {package}); {} skipped",
                self.name()
            )),
        }
    }

    /// The tool's version line, as it reports it.
    pub fn version(self, kura: &Path) -> String {
        match self {
            Tool::Kura => crate::stats::tool_version(&kura.display().to_string(), "--version"),
            Tool::Minimap2 => crate::stats::tool_version("minimap2", "--version"),
            // `bwa` without arguments prints its usage, with "Version: ..." on the third line.
            Tool::Bwa => Command::new("bwa")
                .output()
                .ok()
                .and_then(|o| {
                    String::from_utf8_lossy(&o.stderr)
                        .lines()
                        .find(|l| l.starts_with("Version"))
                        .map(|l| l.trim().to_string())
                })
                .unwrap_or_else(|| "bwa: version not found".into()),
            Tool::Bowtie2 => crate::stats::tool_version("bowtie2", "--version"),
        }
    }
}

/// The first `tool` on PATH.
pub fn which(tool: &str) -> Option<PathBuf> {
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|d| d.join(tool))
            .find(|p| p.is_file())
    })
}

/// A tool's index of one reference, built by one timed command.
#[derive(Debug, Clone, Serialize)]
pub struct Index {
    pub tool: Tool,
    pub seconds: f64,
    /// User + system CPU seconds of the build (wait4), descendants included.
    pub cpu_seconds: f64,
    pub peak_rss_mib: f64,
    /// Bytes of every file the build wrote.
    pub bytes: u64,
    pub command: String,
    /// What the mapper is given: the index file (kura, minimap2) or prefix (bwa, bowtie2).
    #[serde(skip)]
    pub path: PathBuf,
    #[serde(skip)]
    dir: PathBuf,
}

/// Builds `tool`'s index of `reference` in a directory of its own under `dir`.
pub fn build_index(
    tool: Tool,
    kura: &Path,
    reference: &Path,
    dir: &Path,
    threads: usize,
) -> anyhow::Result<Index> {
    let own = dir.join(format!("index-{}", tool.name().replace(' ', "-")));
    std::fs::create_dir_all(&own).with_context(|| format!("creating {}", own.display()))?;
    let t = threads.to_string();
    let (path, mut cmd) = match tool {
        Tool::Kura => {
            let p = own.join("ref.kgi");
            let mut c = Command::new(kura);
            c.args(["genome", "index"])
                .arg(reference)
                .arg("-o")
                .arg(&p)
                .args(["-t", &t]);
            (p, c)
        }
        Tool::Minimap2 => {
            let p = own.join("ref.mmi");
            let mut c = Command::new("minimap2");
            c.args(["-x", "sr", "-t", &t, "-d"]).arg(&p).arg(reference);
            (p, c)
        }
        // `bwa index` has no threads option.
        Tool::Bwa => {
            let p = own.join("ref");
            let mut c = Command::new("bwa");
            c.args(["index", "-p"]).arg(&p).arg(reference);
            (p, c)
        }
        Tool::Bowtie2 => {
            let p = own.join("ref");
            let mut c = Command::new("bowtie2-build");
            c.args(["--quiet", "--threads", &t]).arg(reference).arg(&p);
            (p, c)
        }
    };
    cmd.stdout(Stdio::null()).stderr(Stdio::null());
    let command = show(&cmd);
    let run = measured(&mut cmd)?;
    Ok(Index {
        tool,
        seconds: run.wall.as_secs_f64(),
        cpu_seconds: run.cpu_seconds,
        peak_rss_mib: run.peak_rss_mib,
        bytes: dir_bytes(&own)?,
        command,
        path,
        dir: own,
    })
}

fn dir_bytes(dir: &Path) -> anyhow::Result<u64> {
    let mut total = 0;
    for e in std::fs::read_dir(dir).with_context(|| format!("listing {}", dir.display()))? {
        total += e?.metadata()?.len();
    }
    Ok(total)
}

/// One mapping run, scored.
#[derive(Debug, Clone, Serialize)]
pub struct Mapped {
    pub seconds: f64,
    /// User + system CPU seconds (wait4), descendants included: on a loaded host the figure
    /// that waiting for a CPU does not inflate.
    pub cpu_seconds: f64,
    pub peak_rss_mib: f64,
    pub command: String,
    /// Primary records (both mates for pairs).
    pub reads: u64,
    pub mapped: u64,
    pub correct: u64,
    pub misplaced_mapq_ge_20: u64,
    /// Pairs whose mates are both correct and flagged proper (paired runs).
    pub proper_right: u64,
    /// The highest MAPQ among the tool's primary records (its scale: 60 or 42).
    pub max_mapq: u8,
}

/// Maps `reads` (one file, or two for pairs) with `tool` from its prebuilt `index` into
/// `out_sam`, with the page cache of the inputs dropped first; returns the run and its command.
pub fn run_mapper(
    index: &Index,
    kura: &Path,
    reads: &[PathBuf],
    out_sam: &Path,
    threads: usize,
) -> anyhow::Result<(Measured, String)> {
    for r in reads {
        drop_page_cache(r)?;
    }
    for e in std::fs::read_dir(&index.dir)? {
        drop_page_cache(&e?.path())?;
    }
    let t = threads.to_string();
    let mut cmd = match index.tool {
        Tool::Kura => {
            let mut c = Command::new(kura);
            c.args(["genome", "map"]).arg(&index.path).args(reads);
            c.args(["-t", &t, "-o"]).arg(out_sam);
            c.stdout(Stdio::null());
            c
        }
        Tool::Minimap2 => {
            let mut c = Command::new("minimap2");
            c.args(["-ax", "sr", "-t", &t]).arg(&index.path).args(reads);
            c.stdout(std::fs::File::create(out_sam)?);
            c
        }
        Tool::Bwa => {
            let mut c = Command::new("bwa");
            c.args(["mem", "-t", &t]).arg(&index.path).args(reads);
            c.stdout(std::fs::File::create(out_sam)?);
            c
        }
        Tool::Bowtie2 => {
            let mut c = Command::new("bowtie2");
            c.args(["-p", &t, "-x"]).arg(&index.path);
            match reads {
                [one] => {
                    c.arg("-U").arg(one);
                }
                // bowtie2's default maximum fragment length (-X 500) is the simulated mean;
                // 1000 keeps the pairs of 500 ± 50 bp concordant, as the others infer it.
                [r1, r2] => {
                    c.args(["-X", "1000", "-1"]).arg(r1).arg("-2").arg(r2);
                }
                _ => bail!("bowtie2: one or two read files, not {}", reads.len()),
            }
            c.stdout(std::fs::File::create(out_sam)?);
            c
        }
    };
    cmd.stderr(Stdio::null());
    let command = show(&cmd);
    Ok((measured(&mut cmd)?, command))
}

/// [`run_mapper`], then the SAM scored against the simulated origins in the read names.
pub fn map(
    index: &Index,
    kura: &Path,
    reads: &[PathBuf],
    out_sam: &Path,
    threads: usize,
) -> anyhow::Result<Mapped> {
    let (run, command) = run_mapper(index, kura, reads, out_sam, threads)?;
    let name = out_sam.display().to_string();
    let open = || -> anyhow::Result<_> {
        Ok(std::io::BufReader::with_capacity(
            1 << 20,
            std::fs::File::open(out_sam).with_context(|| name.clone())?,
        ))
    };
    let score = score_sam(open()?, &name, ScoreOptions::default())?;
    Ok(Mapped {
        seconds: run.wall.as_secs_f64(),
        cpu_seconds: run.cpu_seconds,
        peak_rss_mib: run.peak_rss_mib,
        command,
        reads: score.total,
        mapped: score.mapped,
        correct: score.correct,
        misplaced_mapq_ge_20: score.misplaced_confident,
        proper_right: score.proper_right,
        max_mapq: max_mapq(open()?)?,
    })
}

/// The highest MAPQ of the primary records of SAM text.
fn max_mapq(sam: impl BufRead) -> anyhow::Result<u8> {
    let mut max = 0u8;
    for line in sam.lines() {
        let line = line?;
        if line.starts_with('@') {
            continue;
        }
        let mut f = line.split('\t');
        let flag: u16 = f.nth(1).and_then(|x| x.parse().ok()).unwrap_or(0);
        if flag & 0x904 != 0 {
            continue;
        }
        if let Some(q) = f.nth(2).and_then(|x| x.parse::<u8>().ok()) {
            max = max.max(q);
        }
    }
    Ok(max)
}

/// A command line as it would be typed (program and arguments, space-separated).
pub fn show(cmd: &Command) -> String {
    std::iter::once(cmd.get_program())
        .chain(cmd.get_args())
        .map(|s| s.to_string_lossy().into_owned())
        .collect::<Vec<_>>()
        .join(" ")
}

/// What one child process took.
#[derive(Debug, Clone, Copy)]
pub struct Measured {
    pub wall: Duration,
    pub peak_rss_mib: f64,
    /// User + system CPU time from `wait4`, which includes the descendants the child waited
    /// for (CPU times, unlike the peak RSS, are not inherited across exec).
    pub cpu_seconds: f64,
}

/// Runs a child to completion and measures it.
///
/// The peak is sampled every 2 ms from `/proc`: the sum of `VmHWM` over the child and its live
/// descendants (bowtie2 and bowtie2-build are wrapper scripts around the program doing the
/// work), the highest sum seen. `wait4`'s `ru_maxrss` cannot be used, since a child started by
/// `posix_spawn` (a vfork) inherits this process's peak at exec, so every small child would
/// report at least the benchmark's own RSS. The wall time ends when the child exits (`waitid`
/// with `WNOWAIT`, which leaves it unreaped so its pid stays its own while the sampler stops).
#[allow(unsafe_code)] // waitid(2) and wait4(2) on our own child
pub fn measured(cmd: &mut Command) -> anyhow::Result<Measured> {
    use std::sync::atomic::{AtomicBool, Ordering};
    let t = Instant::now();
    let child = cmd.spawn().with_context(|| format!("starting {cmd:?}"))?;
    let pid = child.id() as libc::pid_t;
    let stop = std::sync::Arc::new(AtomicBool::new(false));
    let sampler = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let mut peak_kb = 0u64;
            while !stop.load(Ordering::Acquire) {
                peak_kb = peak_kb.max(tree_hwm_kb(pid));
                std::thread::sleep(Duration::from_millis(2));
            }
            peak_kb
        })
    };
    // SAFETY: siginfo_t is plain data that waitid fills in.
    let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
    // SAFETY: `pid` is our own child, not yet reaped; `info` is a valid local. WNOWAIT leaves
    // it a zombie, so the pid cannot be reused while the sampler may still read it.
    let rc = unsafe {
        libc::waitid(
            libc::P_PID,
            pid as libc::id_t,
            &mut info,
            libc::WEXITED | libc::WNOWAIT,
        )
    };
    let wall = t.elapsed();
    let waited = std::io::Error::last_os_error();
    stop.store(true, Ordering::Release);
    let peak_kb = sampler.join().unwrap_or(0);
    if rc != 0 {
        bail!("waitid on {cmd:?}: {waited}");
    }
    let mut status = 0;
    // SAFETY: rusage is plain data that wait4 fills in.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: valid pointers to locals for the duration of the call; reaps our own child.
    let rc = unsafe { libc::wait4(pid, &mut status, 0, &mut usage) };
    if rc != pid {
        bail!("wait4 on {cmd:?}: {}", std::io::Error::last_os_error());
    }
    if !libc::WIFEXITED(status) || libc::WEXITSTATUS(status) != 0 {
        bail!("{cmd:?} failed (wait status {status:#x})");
    }
    let secs = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    Ok(Measured {
        wall,
        peak_rss_mib: peak_kb as f64 / 1024.0,
        cpu_seconds: secs(usage.ru_utime) + secs(usage.ru_stime),
    })
}

/// Sum of `VmHWM` (KiB) over `pid` and its live descendants.
fn tree_hwm_kb(pid: libc::pid_t) -> u64 {
    let mut total = 0;
    let mut todo = vec![pid];
    while let Some(p) = todo.pop() {
        total += vm_hwm_kb(p).unwrap_or(0);
        let Ok(tasks) = std::fs::read_dir(format!("/proc/{p}/task")) else {
            continue;
        };
        for task in tasks.flatten() {
            if let Ok(kids) = std::fs::read_to_string(task.path().join("children")) {
                todo.extend(
                    kids.split_whitespace()
                        .filter_map(|k| k.parse::<libc::pid_t>().ok()),
                );
            }
        }
    }
    total
}

/// `VmHWM` of a live process, in KiB.
fn vm_hwm_kb(pid: libc::pid_t) -> Option<u64> {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()?
        .lines()
        .find(|l| l.starts_with("VmHWM:"))?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_child_is_timed_and_its_failure_is_an_error() {
        let m = measured(Command::new("sh").args(["-c", "exit 0"])).unwrap();
        assert!(m.wall > Duration::ZERO);
        assert!(m.peak_rss_mib >= 0.0);
        // A busy child's CPU time is counted (its shell's descendants included).
        let m = measured(Command::new("sh").args([
            "-c",
            "python3 -c 'import time; t = time.process_time(); [0 for _ in iter(lambda: time.process_time() - t > 0.2, True)]'",
        ]))
        .unwrap();
        assert!(m.cpu_seconds >= 0.2, "{m:?}");
        let err = measured(Command::new("sh").args(["-c", "exit 3"])).unwrap_err();
        assert!(err.to_string().contains("failed"), "{err}");
        assert!(measured(&mut Command::new("/no/such/program")).is_err());
    }

    #[test]
    fn a_descendants_memory_counts_toward_the_peak() {
        // A shell whose child holds ~64 MiB: the shell alone is a few MiB.
        let m = measured(Command::new("sh").args([
            "-c",
            "python3 -c 'import time; b = bytearray(64 << 20); time.sleep(0.3)'",
        ]))
        .unwrap();
        assert!(m.peak_rss_mib > 60.0, "{m:?}");
    }

    #[test]
    fn the_highest_primary_mapq_is_found() {
        let sam = "@HD\tVN:1.6\nr\t0\tc\t1\t42\t4M\t*\t0\t0\tACGT\tIIII\n\
                   r\t256\tc\t1\t60\t4M\t*\t0\t0\tACGT\tIIII\n\
                   s\t16\tc\t1\t7\t4M\t*\t0\t0\tACGT\tIIII\n";
        assert_eq!(max_mapq(sam.as_bytes()).unwrap(), 42);
    }

    #[test]
    fn a_missing_tool_says_what_to_install() {
        let (programs, package) = Tool::Bowtie2.programs();
        assert_eq!(programs, &["bowtie2", "bowtie2-build"]);
        assert_eq!(package, "bowtie2");
        assert!(Tool::Kura.available().is_ok());
    }
}
