//! The statistics every benchmark reports with: kura's and a peer's points taken in interleaved
//! rounds (A B A B …, [`interleave`]), each side summarised as median and min–max ([`Spread`]),
//! the kura/peer ratio summarised over the rounds' pairs ([`compare`]), and a target judged on
//! that whole range ([`Goal::judge`]): "met" only when the range is wholly on the right side,
//! "not met" when wholly on the wrong side, else "within noise" (as is a single round, which
//! has no range).
//!
//! It also names the file system a benchmark's `--dir` is on ([`fs_name`]), so tables say
//! "xfs" or "tmpfs" when that is what the peer ran on.

use serde::Serialize;
use std::path::Path;

/// Median and min–max of one figure over its rounds.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Spread {
    pub median: f64,
    pub min: f64,
    pub max: f64,
    /// Samples summarised (0: nothing was measured; every field is then 0).
    pub rounds: usize,
}

impl Spread {
    /// Summarises `samples` (NaNs are left out). The median of an even count is the mean of the
    /// middle two.
    pub fn of(samples: &[f64]) -> Spread {
        let mut v: Vec<f64> = samples.iter().copied().filter(|x| !x.is_nan()).collect();
        if v.is_empty() {
            return Spread {
                median: 0.0,
                min: 0.0,
                max: 0.0,
                rounds: 0,
            };
        }
        v.sort_by(f64::total_cmp);
        let n = v.len();
        let median = if n % 2 == 1 {
            v[n / 2]
        } else {
            (v[n / 2 - 1] + v[n / 2]) / 2.0
        };
        Spread {
            median,
            min: v[0],
            max: v[n - 1],
            rounds: n,
        }
    }

    /// `median [min–max]` with `prec` decimals (just the median for a single round).
    pub fn show(&self, prec: usize) -> String {
        if self.rounds <= 1 || self.min == self.max {
            format!("{:.prec$}", self.median)
        } else {
            format!(
                "{:.prec$} [{:.prec$}–{:.prec$}]",
                self.median, self.min, self.max
            )
        }
    }

    /// The same spread with every value multiplied by `k` (`k` ≥ 0), e.g. to percent.
    pub fn scaled(&self, k: f64) -> Spread {
        Spread {
            median: self.median * k,
            min: self.min * k,
            max: self.max * k,
            rounds: self.rounds,
        }
    }
}

/// Where a ratio must lie for its target to be met.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Goal {
    /// The ratio must be at least this.
    AtLeast(f64),
    /// The ratio must be at most this.
    AtMost(f64),
}

/// A target's verdict over a whole range.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    /// Every round is on the right side of the target.
    Met,
    /// Every round is on the wrong side.
    NotMet,
    /// The rounds straddle the target: this run cannot tell.
    WithinNoise,
}

impl Verdict {
    pub fn word(self) -> &'static str {
        match self {
            Verdict::Met => "met",
            Verdict::NotMet => "NOT met",
            Verdict::WithinNoise => "within noise",
        }
    }
}

impl Goal {
    /// Judges `range` (its min and max) against the goal. A single round has no range to judge
    /// by, so it is "within noise" whatever its value.
    pub fn judge(&self, range: &Spread) -> Verdict {
        if range.rounds < 2 {
            return Verdict::WithinNoise;
        }
        let (right_lo, right_hi) = match *self {
            Goal::AtLeast(t) => (range.min >= t, range.max >= t),
            Goal::AtMost(t) => (range.max <= t, range.min <= t),
        };
        if right_lo {
            Verdict::Met
        } else if !right_hi {
            Verdict::NotMet
        } else {
            Verdict::WithinNoise
        }
    }

    /// The target as printed, with the ratio scaled by `k` (100 for percent) and `unit` after.
    pub fn describe(&self, k: f64, unit: &str) -> String {
        match *self {
            Goal::AtLeast(t) => format!("≥ {}{unit}", trim(t * k)),
            Goal::AtMost(t) => format!("≤ {}{unit}", trim(t * k)),
        }
    }
}

fn trim(x: f64) -> String {
    let s = format!("{x:.2}");
    s.trim_end_matches('0').trim_end_matches('.').to_string()
}

/// kura against one peer on one figure, over interleaved rounds.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Compared {
    pub kura: Spread,
    pub peer: Spread,
    /// The ratio of each round's pair (kura's point and the peer's point taken next to it).
    pub ratio: Spread,
    pub verdict: Option<Verdict>,
}

/// Compares kura's samples with the peer's, round by round: `ratio(kura_i, peer_i)` for each
/// pair (a peer sample of 0 gives no ratio for its round), judged against `goal`.
pub fn compare(
    kura: &[f64],
    peer: &[f64],
    ratio: impl Fn(f64, f64) -> f64,
    goal: Option<Goal>,
) -> Compared {
    let ratios: Vec<f64> = kura
        .iter()
        .zip(peer)
        .filter(|(_, &p)| p != 0.0)
        .map(|(&k, &p)| ratio(k, p))
        .collect();
    let ratio = Spread::of(&ratios);
    Compared {
        kura: Spread::of(kura),
        peer: Spread::of(peer),
        ratio,
        verdict: goal.map(|g| g.judge(&ratio)),
    }
}

/// kura / peer.
pub fn quotient(k: f64, p: f64) -> f64 {
    k / p
}

/// How much lower kura's figure is than the peer's, as a fraction: `1 − kura / peer`.
pub fn lower_by(k: f64, p: f64) -> f64 {
    1.0 - k / p
}

/// Runs `rounds` rounds of every side in turn (A B A B …) and returns each side's samples.
pub fn interleave<E>(
    rounds: usize,
    sides: &mut [&mut dyn FnMut(usize) -> Result<f64, E>],
) -> Result<Vec<Vec<f64>>, E> {
    let mut out = vec![Vec::with_capacity(rounds); sides.len()];
    for round in 0..rounds {
        for (side, samples) in sides.iter_mut().zip(out.iter_mut()) {
            samples.push(side(round)?);
        }
    }
    Ok(out)
}

/// Rounds for a benchmark: `--rounds` if given, else 5, or `quick` (1–2) under `--quick`.
pub fn rounds(asked: Option<usize>, quick: bool, quick_rounds: usize) -> usize {
    match asked {
        Some(r) => r.max(1),
        None if quick => quick_rounds.clamp(1, 2),
        None => DEFAULT_ROUNDS,
    }
}

/// Rounds of the headline figures when `--rounds` is not given.
pub const DEFAULT_ROUNDS: usize = 5;

/// The name of a file-system magic number (`statfs.f_type`).
pub fn fs_type_name(magic: i64) -> Option<&'static str> {
    Some(match magic {
        0xEF53 => "ext4",
        0x5846_5342 => "xfs",
        0x9123_683E => "btrfs",
        0x0102_1994 => "tmpfs",
        0x8584_58f6 => "ramfs",
        0x794c_7630 => "overlay",
        0x2FC1_2FC1 => "zfs",
        0xF2F5_2010 => "f2fs",
        0xca45_1a4e => "bcachefs",
        0x6969 => "nfs",
        0xFF53_4D42 => "cifs",
        0xFE53_4D42 => "smb2",
        0x6573_5546 => "fuse",
        0x0102_1997 => "9p",
        0x7371_7368 => "squashfs",
        0x4d44 => "vfat",
        0x2011_BAB0 => "exfat",
        0x5346_544e => "ntfs",
        0x3434 => "nilfs2",
        _ => return None,
    })
}

/// The file system `path` is on, by `statfs(2)`: its name (ext2, ext3 and ext4 share one magic
/// number, told apart by `/proc/mounts` where it lists the mount), else `fs 0xMAGIC`.
pub fn fs_name(path: &Path) -> String {
    match statfs_magic(path) {
        Ok(0xEF53) => ext_flavour(path).unwrap_or_else(|| "ext4".into()),
        Ok(m) => fs_type_name(m).map_or_else(|| format!("fs {m:#x}"), str::to_string),
        Err(e) => format!("unknown fs ({e})"),
    }
}

#[allow(unsafe_code)] // statfs(2) into a local struct
fn statfs_magic(path: &Path) -> std::io::Result<i64> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(path.as_os_str().as_bytes())
        .map_err(|_| std::io::Error::from(std::io::ErrorKind::InvalidInput))?;
    // SAFETY: statfs is plain data that the call fills in.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: `c` is a NUL-terminated path and `st` a valid struct for the call's duration.
    if unsafe { libc::statfs(c.as_ptr(), &mut st) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    #[allow(clippy::unnecessary_cast)] // f_type's width differs between targets
    Ok(st.f_type as i64)
}

/// ext2/ext3/ext4 from the longest mount point in `/proc/mounts` that holds `path`.
fn ext_flavour(path: &Path) -> Option<String> {
    let canon = std::fs::canonicalize(path).ok()?;
    let mounts = std::fs::read_to_string("/proc/mounts").ok()?;
    mounts
        .lines()
        .filter_map(|l| {
            let mut f = l.split(' ');
            let (_, mnt, ty) = (f.next()?, f.next()?, f.next()?);
            Some((mnt.replace("\\040", " "), ty))
        })
        .filter(|(mnt, ty)| ty.starts_with("ext") && canon.starts_with(mnt))
        .max_by_key(|(mnt, _)| mnt.len())
        .map(|(_, ty)| ty.to_string())
}

/// The kernel release, for reports.
pub fn kernel() -> String {
    std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .unwrap_or_default()
        .trim()
        .to_string()
}

/// The CPU model, for reports.
pub fn cpu_model() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|c| {
            c.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .map(|s| s.trim().to_string())
        })
        .unwrap_or_else(|| "unknown".into())
}

/// The first line `tool ARG` prints (stdout, else stderr), e.g. a peer's version.
pub fn tool_version(tool: &str, arg: &str) -> String {
    match std::process::Command::new(tool).arg(arg).output() {
        Ok(o) => {
            let text = if o.stdout.is_empty() {
                o.stderr
            } else {
                o.stdout
            };
            String::from_utf8_lossy(&text)
                .lines()
                .next()
                .unwrap_or("")
                .trim()
                .to_string()
        }
        Err(e) => format!("{tool}: not available ({e})"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spreads_are_median_min_max() {
        let s = Spread::of(&[3.0, 1.0, 2.0, f64::NAN]);
        assert_eq!((s.median, s.min, s.max, s.rounds), (2.0, 1.0, 3.0, 3));
        assert_eq!(Spread::of(&[4.0, 1.0, 2.0, 3.0]).median, 2.5);
        assert_eq!(Spread::of(&[]).rounds, 0);
        assert_eq!(Spread::of(&[2.0]).show(1), "2.0");
        assert_eq!(Spread::of(&[1.0, 2.0, 4.0]).show(1), "2.0 [1.0–4.0]");
        assert_eq!(Spread::of(&[0.5, 0.25]).scaled(100.0).max, 50.0);
    }

    #[test]
    fn a_target_is_met_only_when_the_whole_range_is_on_its_side() {
        let at_least = Goal::AtLeast(1.0);
        assert_eq!(at_least.judge(&Spread::of(&[1.0, 1.2, 1.5])), Verdict::Met);
        assert_eq!(at_least.judge(&Spread::of(&[0.5, 0.9])), Verdict::NotMet);
        assert_eq!(
            at_least.judge(&Spread::of(&[0.9, 1.1])),
            Verdict::WithinNoise
        );
        let at_most = Goal::AtMost(0.03);
        assert_eq!(at_most.judge(&Spread::of(&[0.01, 0.03])), Verdict::Met);
        assert_eq!(at_most.judge(&Spread::of(&[0.04, 0.3])), Verdict::NotMet);
        assert_eq!(
            at_most.judge(&Spread::of(&[-0.2, 0.3])),
            Verdict::WithinNoise
        );
        assert_eq!(at_most.judge(&Spread::of(&[])), Verdict::WithinNoise);
        assert_eq!(
            at_most.judge(&Spread::of(&[0.0])),
            Verdict::WithinNoise,
            "one round has no range"
        );
        assert_eq!(Goal::AtLeast(0.5).describe(100.0, " %"), "≥ 50 %");
        assert_eq!(Goal::AtMost(1.2).describe(1.0, ""), "≤ 1.2");
    }

    #[test]
    fn ratios_pair_each_round_with_its_neighbour() {
        // kura 100, 90, 120 against the peer 50, 100, 60: per-round ratios 2.0, 0.9, 2.0.
        let c = compare(
            &[100.0, 90.0, 120.0],
            &[50.0, 100.0, 60.0],
            quotient,
            Some(Goal::AtLeast(1.0)),
        );
        assert_eq!(c.ratio.median, 2.0);
        assert_eq!(c.ratio.min, 0.9);
        assert_eq!(c.kura.median, 100.0);
        assert_eq!(c.peer.median, 60.0);
        assert_eq!(c.verdict, Some(Verdict::WithinNoise));
        let lower = compare(
            &[10.0, 12.0],
            &[40.0, 30.0],
            lower_by,
            Some(Goal::AtLeast(0.5)),
        );
        assert_eq!(lower.ratio.min, 0.6);
        assert_eq!(lower.ratio.max, 0.75);
        assert_eq!(lower.verdict, Some(Verdict::Met));
        let zero_peer = compare(&[1.0], &[0.0], quotient, None);
        assert_eq!(zero_peer.ratio.rounds, 0);
        assert_eq!(zero_peer.verdict, None);
    }

    #[test]
    fn rounds_interleave_the_sides() {
        let log = std::cell::RefCell::new(Vec::new());
        let mut a = |r: usize| -> Result<f64, ()> {
            log.borrow_mut().push(format!("A{r}"));
            Ok(r as f64)
        };
        let mut b = |r: usize| -> Result<f64, ()> {
            log.borrow_mut().push(format!("B{r}"));
            Ok(10.0 + r as f64)
        };
        let out = interleave(3, &mut [&mut a, &mut b]).unwrap();
        assert_eq!(log.into_inner(), ["A0", "B0", "A1", "B1", "A2", "B2"]);
        assert_eq!(out, vec![vec![0.0, 1.0, 2.0], vec![10.0, 11.0, 12.0]]);
        let mut fail = |_: usize| -> Result<f64, &str> { Err("boom") };
        assert_eq!(interleave(2, &mut [&mut fail]), Err("boom"));
        assert_eq!(rounds(None, false, 2), 5);
        assert_eq!(rounds(None, true, 2), 2);
        assert_eq!(rounds(None, true, 9), 2);
        assert_eq!(rounds(Some(0), true, 2), 1);
        assert_eq!(rounds(Some(7), true, 2), 7);
    }

    #[test]
    fn file_systems_are_named_by_their_magic() {
        assert_eq!(fs_type_name(0x5846_5342), Some("xfs"));
        assert_eq!(fs_type_name(0x0102_1994), Some("tmpfs"));
        assert_eq!(fs_type_name(0x794c_7630), Some("overlay"));
        assert_eq!(fs_type_name(1), None);
        // /proc is always procfs: not in the table, so its magic is shown.
        assert_eq!(fs_name(Path::new("/proc")), "fs 0x9fa0");
        let here = fs_name(&std::env::temp_dir());
        assert!(!here.starts_with("unknown"), "{here}");
        assert!(fs_name(Path::new("/no/such/dir")).starts_with("unknown fs"));
    }
}
