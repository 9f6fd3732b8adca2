//! Differential POSIX conformance (issue 14 item 3): one seeded random sequence of file-system
//! calls runs on a directory of the host file system (under the system temporary directory; its
//! name, from statfs, is printed) and on a `kura mount` of a fresh image. Every call's return
//! value or errno must agree, and after every call the two trees must agree: each path's kind,
//! permission bits, owner, size, link count, symlink target, contents, `user.*` xattrs (names and
//! values), which paths are hard links of one inode, and each directory's sorted names.
//!
//! The calls: open with O_CREAT/O_EXCL/O_TRUNC/O_APPEND and a write (pwrite at an offset, or
//! write under O_APPEND), truncate (open + ftruncate), rename with no flag, RENAME_NOREPLACE and
//! RENAME_EXCHANGE (renameat2), link, symlink (fast and slow targets, dangling ones, loops),
//! readlink, unlink, mkdir, rmdir, chmod (setuid, setgid and sticky bits included), lchown,
//! utimensat with nanoseconds (following and not following symlinks), mknod of FIFOs and
//! sockets, lsetxattr with XATTR_CREATE/XATTR_REPLACE, lgetxattr, llistxattr, lremovexattr,
//! fallocate (plain, KEEP_SIZE, PUNCH_HOLE|KEEP_SIZE), readdir, stat and lstat. Every open is
//! O_NONBLOCK, so opening a FIFO fails (ENXIO) instead of waiting for a reader. The paths come
//! from a small name space (4 directories × 6 names, which are also directory names), so most
//! calls meet existing names, wrong kinds and missing parents as well as the plain case.
//!
//! Deliberate differences, not compared (each is how AccelFS or FUSE defines it, documented in
//! docs/accelfs-format.md §5 where it is a file-system semantic):
//! - atime: AccelFS has `noatime` semantics (set at creation and by utimens only); ext4 updates
//!   it on reads (relatime). atime is compared only right after an explicit utimensat.
//! - mtime/ctime: compared only right after utimensat set them (creation and writes stamp the
//!   clock, which differs between two runs of one call).
//! - st_blocks and the size of directories: allocation units differ (ext4: 4 KiB blocks and
//!   directory blocks; AccelFS: its block size, directories sized by their entries).
//! - st_nlink of directories: `kura mount` reports 2 for every directory (as many FUSE file
//!   systems do); ext4 counts subdirectories. Non-directories' link counts are compared.
//! - st_ino/st_dev: differ by nature; hard-link identity is compared instead.
//! - xattr values stay far below both size caps (ext4: what fits one 4 KiB block, AccelFS: 8168
//!   bytes), so ENOSPC on attributes is not exercised here (tests/posix.rs covers AccelFS's cap).
//! - Only `user.*` xattrs: the host may carry `security.*` labels that a fresh image does not.
//!
//! `KURA_POSIX_OPS` (calls per seed, default 2500) and `KURA_POSIX_SEED` (a seed or a
//! comma-separated list; default 1,2) make longer runs; each failure names its seed, the call's
//! index and the calls before it.

mod common;

use common::{ok, start_mount, MountGuard};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use rustix::fs::{
    AtFlags, FallocateFlags, Mode, OFlags, RenameFlags, Timestamps, XattrFlags, CWD, UTIME_OMIT,
};
use rustix::io::Errno;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

const DIRS: [&str; 4] = ["", "d/", "d/e/", "f/"];
const NAMES: [&str; 6] = ["a", "b", "c", "d", "e", "f"];
const XNAMES: [&str; 4] = [
    "user.a",
    "user.b",
    "user.long.name.of.an.attribute",
    "user.c",
];

/// `len` bytes counting up from `first`: data that prints short in a failure.
#[derive(Clone, Copy)]
struct Bytes {
    len: usize,
    first: u8,
}

impl Bytes {
    fn get(self) -> Vec<u8> {
        (0..self.len)
            .map(|i| self.first.wrapping_add((i % 251) as u8))
            .collect()
    }
}

impl std::fmt::Debug for Bytes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} bytes from {}", self.len, self.first)
    }
}

/// One file-system call with its arguments, generated before it runs on either tree.
#[derive(Debug, Clone)]
enum Op {
    Open {
        path: String,
        create: bool,
        excl: bool,
        trunc: bool,
        append: bool,
        mode: u32,
        offset: u64,
        data: Bytes,
    },
    Truncate {
        path: String,
        len: u64,
    },
    Rename {
        from: String,
        to: String,
        flags: u32,
    },
    Link {
        from: String,
        to: String,
    },
    Symlink {
        target: String,
        path: String,
    },
    Readlink {
        path: String,
    },
    Unlink {
        path: String,
    },
    Mkdir {
        path: String,
        mode: u32,
    },
    Rmdir {
        path: String,
    },
    /// A FIFO (`fifo`) or a socket node (mknod); device nodes stay out (the mount is `nodev`).
    Mknod {
        path: String,
        fifo: bool,
        mode: u32,
    },
    Chmod {
        path: String,
        mode: u32,
    },
    /// lchown (as root, so any owner may be given).
    Chown {
        path: String,
        uid: Option<u32>,
        gid: Option<u32>,
    },
    Utimens {
        path: String,
        atime: Option<(i64, i64)>,
        mtime: Option<(i64, i64)>,
        nofollow: bool,
    },
    SetXattr {
        path: String,
        name: &'static str,
        value: Bytes,
        flags: u32,
    },
    GetXattr {
        path: String,
        name: &'static str,
    },
    ListXattr {
        path: String,
    },
    RemoveXattr {
        path: String,
        name: &'static str,
    },
    Fallocate {
        path: String,
        mode: u32,
        offset: u64,
        len: u64,
    },
    Readdir {
        dir: String,
    },
    Stat {
        path: String,
        follow: bool,
    },
}

/// A path of the name space; mostly the plain names, so the directories survive a while.
fn path(rng: &mut StdRng) -> String {
    let d = DIRS[rng.gen_range(0..DIRS.len())];
    let n = if rng.gen_bool(0.75) {
        NAMES[rng.gen_range(0..3)]
    } else {
        NAMES[rng.gen_range(0..NAMES.len())]
    };
    format!("{d}{n}")
}

fn dir(rng: &mut StdRng) -> String {
    let d = DIRS[rng.gen_range(0..DIRS.len())];
    if d.is_empty() {
        ".".into()
    } else {
        d.trim_end_matches('/').into()
    }
}

fn bytes(rng: &mut StdRng, max: usize) -> Bytes {
    Bytes {
        len: rng.gen_range(0..=max),
        first: rng.gen(),
    }
}

/// Offsets and lengths around AccelFS's and ext4's block edges, and some far out (holes).
fn offset(rng: &mut StdRng) -> u64 {
    match rng.gen_range(0..4) {
        0 => rng.gen_range(0..64),
        1 => 4096 * rng.gen_range(0..5) + rng.gen_range(0..3),
        2 => 8192 * rng.gen_range(1..4) - rng.gen_range(0..2),
        _ => rng.gen_range(0..40_000),
    }
}

/// Mostly an existing path whose description (from [`snapshot`]) satisfies `want`, so calls
/// meet real entries often; otherwise any path of the name space.
fn pick(rng: &mut StdRng, tree: &BTreeMap<String, String>, want: impl Fn(&str) -> bool) -> String {
    let fits: Vec<&String> = tree
        .iter()
        .filter(|(k, d)| k.as_str() != "." && want(d))
        .map(|(k, _)| k)
        .collect();
    if fits.is_empty() || rng.gen_bool(0.3) {
        path(rng)
    } else {
        fits[rng.gen_range(0..fits.len())].clone()
    }
}

/// The next call, from the host tree as it is now (`tree`, a [`snapshot`]).
fn gen(rng: &mut StdRng, tree: &BTreeMap<String, String>) -> Op {
    match rng.gen_range(0..100) {
        0..=19 => Op::Open {
            path: pick(rng, tree, |_| true),
            create: rng.gen_bool(0.8),
            excl: rng.gen_bool(0.2),
            trunc: rng.gen_bool(0.2),
            append: rng.gen_bool(0.25),
            mode: rng.gen_range(0..=0o7777) | 0o200,
            offset: offset(rng),
            data: {
                let max = if rng.gen_bool(0.2) { 20_000 } else { 300 };
                bytes(rng, max)
            },
        },
        20..=25 => Op::Truncate {
            path: pick(rng, tree, |d| d.starts_with("file")),
            len: offset(rng),
        },
        26..=33 => Op::Rename {
            from: pick(rng, tree, |_| true),
            to: pick(rng, tree, |_| true),
            flags: [0, 0, 1, 2][rng.gen_range(0..4)],
        },
        34..=38 => Op::Link {
            from: pick(rng, tree, |d| !d.starts_with("dir")),
            to: path(rng),
        },
        39..=43 => Op::Symlink {
            target: match rng.gen_range(0..8) {
                0 => "x".repeat(rng.gen_range(85..400)),
                1 => "/nonexistent/kura-posix-diff".into(),
                2 => "../a".into(),
                3 => "d/e".into(),
                _ => NAMES[rng.gen_range(0..NAMES.len())].into(),
            },
            path: path(rng),
        },
        44..=46 => Op::Readlink {
            path: pick(rng, tree, |d| d.starts_with("symlink")),
        },
        47..=51 => Op::Unlink {
            path: pick(rng, tree, |d| !d.starts_with("dir")),
        },
        52..=58 => Op::Mkdir {
            path: path(rng),
            mode: rng.gen_range(0..=0o7777) | 0o700,
        },
        59..=60 => Op::Mknod {
            path: path(rng),
            fifo: rng.gen_bool(0.5),
            mode: rng.gen_range(0..=0o777),
        },
        61 => Op::Rmdir {
            path: pick(rng, tree, |d| d.starts_with("dir")),
        },
        62..=63 => Op::Chmod {
            path: pick(rng, tree, |_| true),
            mode: rng.gen_range(0..=0o7777),
        },
        64 => Op::Chown {
            path: pick(rng, tree, |_| true),
            uid: [None, Some(0), Some(1000)][rng.gen_range(0..3)],
            gid: [None, Some(0), Some(1234)][rng.gen_range(0..3)],
        },
        65..=68 => {
            let t = |rng: &mut StdRng| {
                rng.gen_bool(0.8).then(|| {
                    (
                        rng.gen_range(0..4_000_000_000i64),
                        rng.gen_range(0..1_000_000_000i64),
                    )
                })
            };
            Op::Utimens {
                path: pick(rng, tree, |_| true),
                atime: t(rng),
                mtime: t(rng),
                nofollow: rng.gen_bool(0.3),
            }
        }
        69..=74 => Op::SetXattr {
            path: pick(rng, tree, |d| !d.starts_with("symlink")),
            name: XNAMES[rng.gen_range(0..XNAMES.len())],
            value: bytes(rng, 200),
            flags: [0, 0, 1, 2][rng.gen_range(0..4)],
        },
        75..=77 => Op::GetXattr {
            path: pick(rng, tree, |d| d.contains("xattrs")),
            name: XNAMES[rng.gen_range(0..XNAMES.len())],
        },
        78..=79 => Op::ListXattr {
            path: pick(rng, tree, |_| true),
        },
        80..=82 => Op::RemoveXattr {
            path: pick(rng, tree, |d| d.contains("xattrs")),
            name: XNAMES[rng.gen_range(0..XNAMES.len())],
        },
        83..=88 => Op::Fallocate {
            path: pick(rng, tree, |d| d.starts_with("file")),
            mode: [0, 1, 3][rng.gen_range(0..3)],
            offset: offset(rng),
            len: offset(rng) + 1,
        },
        89..=92 => Op::Readdir { dir: dir(rng) },
        _ => Op::Stat {
            path: pick(rng, tree, |_| true),
            follow: rng.gen_bool(0.5),
        },
    }
}

type Outcome = Result<String, Errno>;

fn kind(mode: u32) -> &'static str {
    match mode & 0o170_000 {
        0o100_000 => "file",
        0o040_000 => "dir",
        0o120_000 => "symlink",
        0o010_000 => "fifo",
        0o140_000 => "socket",
        0o020_000 => "chr",
        0o060_000 => "blk",
        _ => "?",
    }
}

/// What a stat says that both file systems define alike.
fn describe(st: &rustix::fs::Stat) -> String {
    let mode = st.st_mode;
    let k = kind(mode);
    let owner = format!("owner {}:{}", st.st_uid, st.st_gid);
    if k == "dir" {
        format!("{k} mode {:o} {owner}", mode & 0o7777)
    } else {
        format!(
            "{k} mode {:o} {owner} size {} nlink {}",
            mode & 0o7777,
            st.st_size,
            st.st_nlink
        )
    }
}

fn ts((s, ns): (i64, i64)) -> rustix::fs::Timespec {
    rustix::fs::Timespec {
        tv_sec: s,
        tv_nsec: ns,
    }
}

/// Runs `op` in `root`; what it returned.
fn run(root: &Path, op: &Op) -> Outcome {
    let p = |s: &str| root.join(s);
    match op {
        Op::Open {
            path,
            create,
            excl,
            trunc,
            append,
            mode,
            offset,
            data,
        } => {
            let mut flags = OFlags::WRONLY | OFlags::CLOEXEC | OFlags::NONBLOCK;
            for (on, f) in [
                (*create, OFlags::CREATE),
                (*excl, OFlags::EXCL),
                (*trunc, OFlags::TRUNC),
                (*append, OFlags::APPEND),
            ] {
                if on {
                    flags |= f;
                }
            }
            let fd = rustix::fs::openat(CWD, p(path), flags, Mode::from_raw_mode(*mode))?;
            let n = if *append {
                rustix::io::write(&fd, &data.get())?
            } else {
                rustix::io::pwrite(&fd, &data.get(), *offset)?
            };
            Ok(format!("wrote {n}"))
        }
        Op::Truncate { path, len } => {
            let fd = rustix::fs::openat(
                CWD,
                p(path),
                OFlags::WRONLY | OFlags::CLOEXEC | OFlags::NONBLOCK,
                Mode::empty(),
            )?;
            rustix::fs::ftruncate(&fd, *len)?;
            Ok(String::new())
        }
        Op::Rename { from, to, flags } => {
            rustix::fs::renameat_with(
                CWD,
                p(from),
                CWD,
                p(to),
                RenameFlags::from_bits_retain(*flags),
            )?;
            Ok(String::new())
        }
        Op::Link { from, to } => {
            rustix::fs::linkat(CWD, p(from), CWD, p(to), AtFlags::empty())?;
            Ok(String::new())
        }
        Op::Symlink { target, path } => {
            rustix::fs::symlinkat(target.as_str(), CWD, p(path))?;
            Ok(String::new())
        }
        Op::Readlink { path } => {
            let t = rustix::fs::readlinkat(CWD, p(path), Vec::new())?;
            Ok(t.to_string_lossy().into_owned())
        }
        Op::Unlink { path } => {
            rustix::fs::unlinkat(CWD, p(path), AtFlags::empty())?;
            Ok(String::new())
        }
        Op::Mkdir { path, mode } => {
            rustix::fs::mkdirat(CWD, p(path), Mode::from_raw_mode(*mode))?;
            Ok(String::new())
        }
        Op::Rmdir { path } => {
            rustix::fs::unlinkat(CWD, p(path), AtFlags::REMOVEDIR)?;
            Ok(String::new())
        }
        Op::Mknod { path, fifo, mode } => {
            let t = if *fifo {
                rustix::fs::FileType::Fifo
            } else {
                rustix::fs::FileType::Socket
            };
            rustix::fs::mknodat(CWD, p(path), t, Mode::from_raw_mode(*mode), 0)?;
            Ok(String::new())
        }
        Op::Chown { path, uid, gid } => {
            rustix::fs::chownat(
                CWD,
                p(path),
                uid.map(rustix::fs::Uid::from_raw),
                gid.map(rustix::fs::Gid::from_raw),
                AtFlags::SYMLINK_NOFOLLOW,
            )?;
            Ok(String::new())
        }
        Op::Chmod { path, mode } => {
            rustix::fs::chmodat(CWD, p(path), Mode::from_raw_mode(*mode), AtFlags::empty())?;
            Ok(String::new())
        }
        Op::Utimens {
            path,
            atime,
            mtime,
            nofollow,
        } => {
            let omit = rustix::fs::Timespec {
                tv_sec: 0,
                tv_nsec: UTIME_OMIT,
            };
            let times = Timestamps {
                last_access: atime.map_or(omit, ts),
                last_modification: mtime.map_or(omit, ts),
            };
            let flags = if *nofollow {
                AtFlags::SYMLINK_NOFOLLOW
            } else {
                AtFlags::empty()
            };
            rustix::fs::utimensat(CWD, p(path), &times, flags)?;
            // The times just set are defined alike on both; report them.
            let st = rustix::fs::statat(CWD, p(path), flags)?;
            let mut out = String::new();
            if atime.is_some() {
                let _ = write!(out, "atime {}.{:09} ", st.st_atime, st.st_atime_nsec);
            }
            if mtime.is_some() {
                let _ = write!(out, "mtime {}.{:09}", st.st_mtime, st.st_mtime_nsec);
            }
            Ok(out)
        }
        Op::SetXattr {
            path,
            name,
            value,
            flags,
        } => {
            rustix::fs::lsetxattr(
                p(path),
                *name,
                &value.get(),
                XattrFlags::from_bits_retain(*flags),
            )?;
            Ok(String::new())
        }
        Op::GetXattr { path, name } => {
            let mut buf = vec![0u8; 1 << 16];
            let n = rustix::fs::lgetxattr(p(path), *name, &mut buf[..])?;
            Ok(format!("{:?}", &buf[..n]))
        }
        Op::ListXattr { path } => Ok(user_xattrs(&p(path))?
            .into_keys()
            .collect::<Vec<_>>()
            .join(",")),
        Op::RemoveXattr { path, name } => {
            rustix::fs::lremovexattr(p(path), *name)?;
            Ok(String::new())
        }
        Op::Fallocate {
            path,
            mode,
            offset,
            len,
        } => {
            let fd = rustix::fs::openat(
                CWD,
                p(path),
                OFlags::RDWR | OFlags::CLOEXEC | OFlags::NONBLOCK,
                Mode::empty(),
            )?;
            rustix::fs::fallocate(&fd, FallocateFlags::from_bits_retain(*mode), *offset, *len)?;
            Ok(String::new())
        }
        Op::Readdir { dir } => {
            let rd = std::fs::read_dir(p(dir)).map_err(|e| io_errno(&e))?;
            let mut names = Vec::new();
            for e in rd {
                let e = e.map_err(|e| io_errno(&e))?;
                names.push(e.file_name().to_string_lossy().into_owned());
            }
            names.sort();
            Ok(names.join(","))
        }
        Op::Stat { path, follow } => {
            let flags = if *follow {
                AtFlags::empty()
            } else {
                AtFlags::SYMLINK_NOFOLLOW
            };
            Ok(describe(&rustix::fs::statat(CWD, p(path), flags)?))
        }
    }
}

fn io_errno(e: &std::io::Error) -> Errno {
    Errno::from_io_error(e).unwrap_or(Errno::IO)
}

/// The `user.*` extended attributes of `path` (not following a symlink), names to values.
fn user_xattrs(path: &Path) -> Result<BTreeMap<String, Vec<u8>>, Errno> {
    let mut buf = vec![0u8; 1 << 16];
    let n = rustix::fs::llistxattr(path, &mut buf[..])?;
    let mut out = BTreeMap::new();
    for name in buf[..n].split(|&b| b == 0).filter(|n| !n.is_empty()) {
        let name = String::from_utf8_lossy(name).into_owned();
        if !name.starts_with("user.") {
            continue;
        }
        let mut v = vec![0u8; 1 << 16];
        let len = rustix::fs::lgetxattr(path, name.as_str(), &mut v[..])?;
        v.truncate(len);
        out.insert(name, v);
    }
    Ok(out)
}

/// Everything the two trees must agree on, path by path (relative to `root`).
fn snapshot(root: &Path) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    let mut inodes: BTreeMap<u64, String> = BTreeMap::new();
    let mut stack = vec![String::new()];
    while let Some(rel) = stack.pop() {
        let full = if rel.is_empty() {
            root.to_path_buf()
        } else {
            root.join(&rel)
        };
        let st = rustix::fs::statat(CWD, &full, AtFlags::SYMLINK_NOFOLLOW)
            .unwrap_or_else(|e| panic!("lstat {}: {e}", full.display()));
        let mut d = describe(&st);
        if kind(st.st_mode) != "dir" {
            // Hard links: every path of one inode names the first path met with it.
            let first = inodes.entry(st.st_ino).or_insert_with(|| rel.clone());
            if *first != rel {
                let _ = write!(d, " same inode as {first}");
            }
        }
        match kind(st.st_mode) {
            "file" => {
                let data = std::fs::read(&full).expect("read file");
                let _ = write!(d, " contents {:016x}", fingerprint(&data));
            }
            "symlink" => {
                let t = std::fs::read_link(&full).expect("readlink");
                let _ = write!(d, " -> {}", t.display());
            }
            "dir" => {
                let mut names: Vec<String> = std::fs::read_dir(&full)
                    .expect("read_dir")
                    .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
                    .collect();
                names.sort();
                let _ = write!(d, " [{}]", names.join(","));
                for n in names.into_iter().rev() {
                    stack.push(if rel.is_empty() {
                        n
                    } else {
                        format!("{rel}/{n}")
                    });
                }
            }
            _ => {}
        }
        let x = user_xattrs(&full).unwrap_or_else(|e| panic!("xattrs of {}: {e}", full.display()));
        if !x.is_empty() {
            let _ = write!(d, " xattrs {x:?}");
        }
        out.insert(if rel.is_empty() { ".".into() } else { rel }, d);
    }
    out
}

/// A content fingerprint (FNV-1a over the bytes and the length): the contents are compared,
/// not stored twice per call.
fn fingerprint(data: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in data {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h ^ data.len() as u64
}

fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok().map(|v| {
        v.trim()
            .parse()
            .unwrap_or_else(|_| panic!("{name}={v}: not a number"))
    })
}

/// The host file system's name, by statfs's magic number.
fn fs_name(path: &Path) -> String {
    let magic = rustix::fs::statfs(path).map_or(0, |s| s.f_type as u64);
    let name = match magic {
        0xEF53 => "ext4",
        0x0102_1994 => "tmpfs",
        0x5846_5342 => "xfs",
        0x9123_683E => "btrfs",
        0x794c_7630 => "overlayfs",
        _ => "unknown",
    };
    format!("{name} (magic {magic:#x})")
}

/// Runs `ops` calls from `seed` in `host` and `kura`; the first difference, described.
fn differential(seed: u64, ops: u64, host: &Path, kura: &Path) -> Result<(), String> {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut history: Vec<String> = Vec::new();
    // Per call: how many succeeded and how many failed (alike on both), shown at the end.
    let mut counts: BTreeMap<String, (u64, u64)> = BTreeMap::new();
    let mut tree = snapshot(host);
    let start = ["d", "d/e", "f"].map(|d| Op::Mkdir {
        path: d.into(),
        mode: 0o755,
    });
    for i in 0..ops {
        let op = match start.get(i as usize) {
            Some(op) => op.clone(),
            None => gen(&mut rng, &tree),
        };
        let a = run(host, &op);
        let b = run(kura, &op);
        let name: String = format!("{op:?}")
            .chars()
            .take_while(|c| c.is_alphanumeric())
            .collect();
        let tally = counts.entry(name).or_insert((0, 0));
        if a.is_ok() {
            tally.0 += 1;
        } else {
            tally.1 += 1;
        }
        history.push(format!("#{i} {op:?} -> {a:?}"));
        let tail = || history[history.len().saturating_sub(25)..].join("\n");
        if a != b {
            return Err(format!(
                "seed {seed} call #{i} {op:?}: host {a:?}, kura mount {b:?}\ncalls before:\n{}",
                tail()
            ));
        }
        let (sa, sb) = (snapshot(host), snapshot(kura));
        if sa == sb {
            tree = sa;
        } else {
            let mut diff = String::new();
            for k in sa
                .keys()
                .chain(sb.keys())
                .collect::<std::collections::BTreeSet<_>>()
            {
                if sa.get(k) != sb.get(k) {
                    let _ = writeln!(
                        diff,
                        "  {k}: host {:?}\n  {k}: kura {:?}",
                        sa.get(k),
                        sb.get(k)
                    );
                }
            }
            return Err(format!(
                "seed {seed} after call #{i} {op:?} the trees differ:\n{diff}calls before:\n{}",
                tail()
            ));
        }
    }
    let shown: Vec<String> = counts
        .iter()
        .map(|(k, (ok, err))| format!("{k} {ok}/{err}"))
        .collect();
    eprintln!("seed {seed} calls (succeeded/failed): {}", shown.join(", "));
    Ok(())
}

#[test]
fn random_calls_agree_with_the_host_file_system() {
    const TEST: &str = "random_calls_agree_with_the_host_file_system";
    if let Some(m) = kura_testkit::fuse_unavailable() {
        return m.skip(TEST);
    }
    let ops = env_u64("KURA_POSIX_OPS").unwrap_or(2500);
    let seeds: Vec<u64> = match std::env::var("KURA_POSIX_SEED") {
        Ok(v) => v
            .split(',')
            .map(|s| s.trim().parse().expect("KURA_POSIX_SEED: numbers"))
            .collect(),
        Err(_) => vec![1, 2],
    };
    let dir = tempfile::tempdir().expect("tempdir");
    let img = dir.path().join("fs.img");
    ok(&["mkfs", &format!("file:{}?size=256M", img.display())]);
    let spec = format!("file:{}", img.display());
    let mnt = dir.path().join("mnt");
    std::fs::create_dir(&mnt).expect("mkdir");
    let mut server = start_mount(&spec, &mnt, &[]);
    let guard = MountGuard(&mnt);
    let host_base = dir.path().join("host");
    std::fs::create_dir(&host_base).expect("mkdir");
    eprintln!(
        "host side: {} on {}",
        host_base.display(),
        fs_name(&host_base)
    );
    let mut failure = None;
    for &seed in &seeds {
        // Each seed in its own root; `../a` from the root stays inside the seed's directory.
        let roots: Vec<PathBuf> = [&host_base, &mnt]
            .iter()
            .map(|b| b.join(format!("s{seed}")).join("root"))
            .collect();
        for r in &roots {
            std::fs::create_dir_all(r).expect("mkdir root");
        }
        if let Err(e) = differential(seed, ops, &roots[0], &roots[1]) {
            failure = Some(e);
            break;
        }
        eprintln!("seed {seed}: {ops} calls, no difference");
    }
    let status = common::unmount(&mut server, &mnt);
    drop(guard);
    if let Some(e) = failure {
        panic!("{e}");
    }
    assert!(status.success(), "kura mount exit {status}");
    let report = ok(&["fsck", &spec]);
    assert!(report.contains("clean"), "fsck after the run: {report}");
}
