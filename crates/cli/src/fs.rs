//! `kura fs ls|put|get|cat|rm|mkdir|stat|df`: file tools on an AccelFS device without mounting it
//! through the kernel. Commands that change the file system (`put`, `rm`, `mkdir`) mount the
//! device (replaying its journal), do their work and unmount (commit + checkpoint), so the image
//! is clean whenever the command has returned. Inspection (`ls`, `get`, `cat`, `stat`, `df`) opens
//! the image read-only and replays the journal in memory: looking never changes a byte, and it
//! runs beside other readers but not beside a writer such as `kura mount`.
//!
//! `put`, `get` and `rm -r` stop at the next file or chunk on SIGINT, SIGTERM or SIGHUP, keep
//! what is complete (a half-copied file is removed), commit, and say what was kept
//! ([`crate::interrupt`]). `put` leaves chunks of zeroes as holes and `get` writes holes as
//! holes.
//!
//! Like `cp -a`, `put -r` and `get -r` keep symbolic links as links, hard links as links (files
//! that share a host inode share an AccelFS inode, and back), permission bits, owners (`get`
//! sets them only where the host allows: as root), and access and modification times with
//! nanoseconds (not on a host symlink itself, which std cannot set). `put` also copies FIFOs,
//! sockets and device nodes; `get` skips them with a message (creating them on the host needs
//! `mknod`). Extended attributes are copied both ways (host side through rustix's
//! `l{list,get,set}xattr`): `put` copies the namespaces AccelFS keeps (`user.`, `trusted.`,
//! `security.`) and skips others (POSIX ACLs in `system.`) with a message; `get` sets each one
//! the host permits and says which it could not set (e.g. `trusted.` when not root, `user.` on a
//! symlink, which Linux refuses). `stat` lists an inode's attributes.

use crate::dev::{open_dev, open_dev_read_only};
use crate::interrupt::{self, Interrupted};
use anyhow::{bail, Context};
use indicatif::{ProgressBar, ProgressStyle};
use kura_accelfs::{FileSystem, FileType, FsError, Metadata, MountOptions, NodeSpec, XattrMode};
use std::collections::HashMap;
use std::ffi::OsStr;
use std::io::{Read, Write};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};

/// Bytes moved per call when copying: large enough to take the cache bypass.
const CHUNK: usize = 4 << 20;

#[derive(Debug, clap::Subcommand)]
pub enum FsCommand {
    /// List a directory (default `/`).
    Ls {
        spec: String,
        #[arg(default_value = "/")]
        path: String,
        /// Long format: type, size, inode, modification time.
        #[arg(short, long)]
        long: bool,
        /// List subdirectories too.
        #[arg(short = 'R', long)]
        recursive: bool,
    },
    /// Copy a host file (or, with -r, a directory tree) into the file system.
    Put {
        spec: String,
        local: PathBuf,
        /// Destination path; into it when it is an existing directory.
        dest: String,
        #[arg(short, long)]
        recursive: bool,
    },
    /// Copy a file (or, with -r, a directory tree) out to the host.
    Get {
        spec: String,
        src: String,
        /// Host destination; into it when it is an existing directory.
        local: PathBuf,
        #[arg(short, long)]
        recursive: bool,
    },
    /// Write a file's contents to standard output.
    Cat { spec: String, path: String },
    /// Remove a file (or, with -r, a directory tree; an empty directory needs no -r).
    Rm {
        spec: String,
        path: String,
        #[arg(short, long)]
        recursive: bool,
    },
    /// Create a directory.
    Mkdir {
        spec: String,
        path: String,
        /// Create missing parents; no error when it exists.
        #[arg(short, long)]
        parents: bool,
    },
    /// Show an inode's metadata.
    Stat { spec: String, path: String },
    /// Space and inodes used and free.
    Df { spec: String },
}

fn mount(spec: &str) -> anyhow::Result<FileSystem> {
    let dev = open_dev(spec)?;
    FileSystem::mount(dev, MountOptions::default())
        .with_context(|| format!("mounting AccelFS from {spec}"))
}

fn mount_read_only(spec: &str) -> anyhow::Result<FileSystem> {
    let dev = open_dev_read_only(spec)?;
    FileSystem::mount_read_only(dev, MountOptions::default())
        .with_context(|| format!("mounting AccelFS read-only from {spec}"))
}

/// What a long copy or removal has done so far, for the message when it is interrupted.
#[derive(Default)]
struct Done {
    files: u64,
    bytes: u64,
    /// Files with several names already copied: the source inode (host device and inode, or
    /// AccelFS inode) → where its first name went.
    linked: HashMap<(u64, u64), PathBuf>,
}

pub fn run(cmd: FsCommand) -> anyhow::Result<()> {
    let spec = match &cmd {
        FsCommand::Ls { spec, .. }
        | FsCommand::Put { spec, .. }
        | FsCommand::Get { spec, .. }
        | FsCommand::Cat { spec, .. }
        | FsCommand::Rm { spec, .. }
        | FsCommand::Mkdir { spec, .. }
        | FsCommand::Stat { spec, .. }
        | FsCommand::Df { spec } => spec.clone(),
    };
    let inspect = matches!(
        cmd,
        FsCommand::Ls { .. }
            | FsCommand::Get { .. }
            | FsCommand::Cat { .. }
            | FsCommand::Stat { .. }
            | FsCommand::Df { .. }
    );
    // Jobs that write stop cleanly on a signal; the others change nothing, so a signal may
    // simply end them.
    if matches!(
        cmd,
        FsCommand::Put { .. } | FsCommand::Get { .. } | FsCommand::Rm { .. }
    ) {
        interrupt::install()?;
    }
    if inspect {
        // Nothing to commit: dropping a read-only mount writes nothing.
        let fs = mount_read_only(&spec)?;
        return execute(&fs, cmd);
    }
    let fs = mount(&spec)?;
    let result = execute(&fs, cmd);
    let closed = fs.unmount().context("unmounting (final commit)");
    result.and(closed)
}

fn execute(fs: &FileSystem, cmd: FsCommand) -> anyhow::Result<()> {
    match cmd {
        FsCommand::Ls {
            path,
            long,
            recursive,
            ..
        } => ls(fs, &path, long, recursive),
        FsCommand::Put {
            local,
            dest,
            recursive,
            ..
        } => {
            let base = local
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            let dest = match fs.metadata(&dest) {
                Ok(m) if m.is_dir() && !base.is_empty() => join(&dest, &base),
                _ => dest,
            };
            let meta = std::fs::metadata(&local)
                .with_context(|| format!("reading {}", local.display()))?;
            let total = if meta.is_dir() {
                if !recursive {
                    bail!("{} is a directory (use -r)", local.display());
                }
                tree_bytes(&local)?
            } else {
                meta.len()
            };
            let bar = progress(total, "put");
            let mut done = Done::default();
            let copied = put(fs, &local, &dest, &bar, &mut done);
            bar.finish_and_clear();
            // Whatever happened, what was copied completely is committed.
            fs.sync().context("sync")?;
            copied?;
            eprintln!("copied {} into {dest}", human(total));
            Ok(())
        }
        FsCommand::Get {
            src,
            local,
            recursive,
            ..
        } => {
            let m = fs.metadata(&src)?;
            let local = if local.is_dir() {
                let name = src.trim_end_matches('/').rsplit('/').next().unwrap_or("");
                if name.is_empty() {
                    local
                } else {
                    local.join(name)
                }
            } else {
                local
            };
            if m.is_dir() && !recursive {
                bail!("{src} is a directory (use -r)");
            }
            let bar = progress(fs_tree_bytes(fs, &src)?, "get");
            let mut done = Done::default();
            let copied = get(fs, &src, &local, &bar, &mut done);
            bar.finish_and_clear();
            copied
        }
        FsCommand::Cat { path, .. } => {
            let f = fs.open(&path)?;
            let mut out = std::io::stdout().lock();
            let mut buf = vec![0u8; CHUNK];
            let mut at = 0u64;
            loop {
                let n = f.read_at(at, &mut buf)?;
                if n == 0 {
                    break;
                }
                out.write_all(&buf[..n])?;
                at += n as u64;
            }
            out.flush()?;
            Ok(())
        }
        FsCommand::Rm {
            path, recursive, ..
        } => {
            let m = fs.metadata(&path)?;
            if m.is_dir() {
                if recursive {
                    let mut done = Done::default();
                    let removed = remove_tree(fs, &path, &mut done);
                    fs.sync().context("sync")?;
                    removed?;
                } else {
                    fs.remove_dir(&path)?;
                }
            } else {
                fs.remove_file(&path)?;
            }
            Ok(())
        }
        FsCommand::Mkdir { path, parents, .. } => {
            if parents {
                fs.create_dir_all(&path)?;
            } else {
                fs.mkdir(&path)?;
            }
            Ok(())
        }
        FsCommand::Stat { path, .. } => {
            let m = fs.metadata(&path)?;
            println!("  path: {path}");
            println!("  type: {}", kind(&m));
            println!("  size: {} bytes ({})", m.size, human(m.size));
            println!(
                "blocks: {} of {} bytes ({} allocated)",
                m.blocks,
                m.block_size,
                human(m.blocks * u64::from(m.block_size))
            );
            println!(" inode: {} (generation {})", m.ino, m.generation);
            println!("parent: {}", m.parent);
            println!(" links: {}", m.links);
            println!("  mode: {:o}", m.mode);
            if let Some((uid, gid)) = m.owner {
                println!(" owner: uid {uid}, gid {gid}");
            }
            if m.is_symlink() {
                println!("target: {}", String::from_utf8_lossy(&fs.read_link(&path)?));
            }
            if matches!(m.file_type, FileType::CharDevice | FileType::BlockDevice) {
                println!("  rdev: {:#x}", m.rdev);
            }
            println!(" atime: {}", timestamp(m.atime_ns));
            println!(" mtime: {}", timestamp(m.mtime_ns));
            println!(" ctime: {}", timestamp(m.ctime_ns));
            for name in fs.list_xattr(m.ino)? {
                let value = fs.get_xattr(m.ino, &name)?;
                println!(
                    " xattr: {} ({} bytes)",
                    String::from_utf8_lossy(&name),
                    value.len()
                );
            }
            Ok(())
        }
        FsCommand::Df { .. } => {
            let s = fs.statfs();
            let bs = u64::from(s.block_size);
            let used = s.total_blocks - s.free_blocks;
            println!(
                "{:>12} {:>12} {:>12} {:>5} {:>9} {:>9}",
                "size", "used", "free", "use%", "inodes", "ifree"
            );
            println!(
                "{:>12} {:>12} {:>12} {:>4}% {:>9} {:>9}",
                human(s.total_blocks * bs),
                human(used * bs),
                human(s.free_blocks * bs),
                used * 100 / s.total_blocks.max(1),
                s.total_inodes,
                s.free_inodes
            );
            println!(
                "block size {} bytes; used includes the journal ({} at mount: {} transactions replayed)",
                s.block_size,
                if s.recovery.replayed > 0 {
                    "recovered"
                } else {
                    "clean"
                },
                s.recovery.replayed
            );
            Ok(())
        }
    }
}

fn join(dir: &str, name: &str) -> String {
    format!("{}/{name}", dir.trim_end_matches('/'))
}

fn kind(m: &Metadata) -> &'static str {
    match m.file_type {
        FileType::Directory => "directory",
        FileType::File => "file",
        FileType::Symlink => "symbolic link",
        FileType::Fifo => "FIFO",
        FileType::Socket => "socket",
        FileType::CharDevice => "character device",
        FileType::BlockDevice => "block device",
    }
}

/// The `ls -l` type letter.
fn type_letter(t: FileType) -> char {
    match t {
        FileType::Directory => 'd',
        FileType::File => '-',
        FileType::Symlink => 'l',
        FileType::Fifo => 'p',
        FileType::Socket => 's',
        FileType::CharDevice => 'c',
        FileType::BlockDevice => 'b',
    }
}

fn timestamp(ns: u64) -> String {
    format!(
        "{}.{:09} s since the epoch",
        ns / 1_000_000_000,
        ns % 1_000_000_000
    )
}

/// Sizes in binary units with one decimal.
pub fn human(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = bytes as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{bytes} B")
    } else {
        format!("{v:.1} {}", UNITS[u])
    }
}

fn progress(total: u64, what: &str) -> ProgressBar {
    let bar = ProgressBar::new(total);
    bar.set_style(
        ProgressStyle::with_template(
            "{msg} [{bar:40}] {bytes}/{total_bytes} {bytes_per_sec} eta {eta}",
        )
        .unwrap_or_else(|_| ProgressStyle::default_bar())
        .progress_chars("=> "),
    );
    bar.set_message(what.to_string());
    bar
}

fn ls(fs: &FileSystem, path: &str, long: bool, recursive: bool) -> anyhow::Result<()> {
    let m = fs.metadata(path)?;
    if !m.is_dir() {
        print_entry(path, &m, long);
        return Ok(());
    }
    if recursive {
        println!("{path}:");
    }
    let entries = fs.read_dir(path)?;
    let mut subdirs = Vec::new();
    for e in &entries {
        let name = e.name_lossy();
        let child = join(path, &name);
        if long {
            let m = fs.metadata_of(e.ino)?;
            print_entry(&name, &m, true);
        } else {
            println!(
                "{name}{}",
                if e.file_type == FileType::Directory {
                    "/"
                } else {
                    ""
                }
            );
        }
        if e.file_type == FileType::Directory {
            subdirs.push(child);
        }
    }
    if recursive {
        for d in subdirs {
            println!();
            ls(fs, &d, long, true)?;
        }
    }
    Ok(())
}

fn print_entry(name: &str, m: &Metadata, long: bool) {
    if long {
        println!(
            "{} {:o} {:>12} ino {:>6}  {}{}",
            type_letter(m.file_type),
            m.mode,
            m.size,
            m.ino,
            name,
            if m.is_dir() { "/" } else { "" }
        );
    } else {
        println!("{name}");
    }
}

fn tree_bytes(p: &Path) -> anyhow::Result<u64> {
    let m = std::fs::symlink_metadata(p)?;
    if !m.is_dir() {
        return Ok(if m.is_file() { m.len() } else { 0 });
    }
    let mut total = 0;
    for e in std::fs::read_dir(p)? {
        total += tree_bytes(&e?.path())?;
    }
    Ok(total)
}

fn fs_tree_bytes(fs: &FileSystem, p: &str) -> anyhow::Result<u64> {
    let m = fs.metadata(p)?;
    if !m.is_dir() {
        return Ok(if m.is_file() { m.size } else { 0 });
    }
    let mut total = 0;
    for e in fs.read_dir(p)? {
        total += fs_tree_bytes(fs, &join(p, &e.name_lossy()))?;
    }
    Ok(total)
}

fn put(
    fs: &FileSystem,
    local: &Path,
    dest: &str,
    bar: &ProgressBar,
    done: &mut Done,
) -> anyhow::Result<()> {
    let m = std::fs::symlink_metadata(local)?;
    let t = m.file_type();
    if m.is_dir() {
        match fs.mkdir(dest) {
            Ok(()) => {}
            Err(kura_accelfs::FsError::Exists(_)) if fs.metadata(dest)?.is_dir() => {}
            Err(e) => return Err(e.into()),
        }
        let mut children: Vec<_> = std::fs::read_dir(local)?.collect::<Result<_, _>>()?;
        children.sort_by_key(|e| e.file_name());
        for e in children {
            let name = e.file_name();
            let Some(name) = name.to_str() else {
                bail!("{}: file name is not UTF-8", e.path().display());
            };
            put(fs, &e.path(), &join(dest, name), bar, done)?;
        }
        // After the children, whose creation changed the directory's times.
        return put_attributes(fs, dest, local, &m);
    }
    let key = (m.dev(), m.ino());
    if !m.is_dir() && m.nlink() > 1 {
        if let Some(first) = done.linked.get(&key) {
            replace_non_dir(fs, dest)?;
            fs.hard_link(&first.to_string_lossy(), dest)?;
            done.files += 1;
            return Ok(());
        }
    }
    if !m.is_file() {
        replace_non_dir(fs, dest)?;
        if t.is_symlink() {
            let target = std::fs::read_link(local)
                .with_context(|| format!("reading the link {}", local.display()))?;
            fs.symlink(target.as_os_str().as_bytes(), dest)?;
        } else {
            let file_type = if t.is_fifo() {
                FileType::Fifo
            } else if t.is_socket() {
                FileType::Socket
            } else if t.is_char_device() {
                FileType::CharDevice
            } else {
                FileType::BlockDevice
            };
            let spec = NodeSpec {
                rdev: m.rdev(),
                ..NodeSpec::new(file_type, (m.mode() & 0o7777) as u16)
            };
            fs.make_node_at(dest, &spec)?;
        }
        if m.nlink() > 1 {
            done.linked.insert(key, PathBuf::from(dest));
        }
        done.files += 1;
        return put_attributes(fs, dest, local, &m);
    }
    if fs.metadata(dest).is_ok_and(|d| !d.is_file() && !d.is_dir()) {
        replace_non_dir(fs, dest)?;
    }
    let mut src =
        std::fs::File::open(local).with_context(|| format!("opening {}", local.display()))?;
    let f = fs.create(dest)?;
    let mut buf = vec![0u8; CHUNK];
    let mut at = 0u64;
    loop {
        if let Err(stopped) = interrupt::check(String::new) {
            drop(f);
            fs.remove_file(dest)?;
            return Err(Interrupted {
                kept: format!(
                    "{} file(s), {}, copied completely and committed; the partial {dest} was removed",
                    done.files,
                    human(done.bytes)
                ),
                ..stopped
            }
            .into());
        }
        let n = read_full(&mut src, &mut buf)?;
        if n == 0 {
            break;
        }
        // A chunk of zeroes stays a hole: the file is new, so what is not written reads as
        // zeroes, and a sparse image does not fill the file system.
        if buf[..n].iter().any(|&b| b != 0) {
            f.write_at(at, &buf[..n])?;
        }
        at += n as u64;
        bar.inc(n as u64);
    }
    // The size covers a hole at the end too.
    f.set_len(at)?;
    drop(f);
    if m.nlink() > 1 {
        done.linked.insert(key, PathBuf::from(dest));
    }
    done.files += 1;
    done.bytes += at;
    put_attributes(fs, dest, local, &m)
}

/// Removes `dest` when it exists and is not a directory (what `cp` replaces).
fn replace_non_dir(fs: &FileSystem, dest: &str) -> anyhow::Result<()> {
    match fs.metadata(dest) {
        Ok(d) if d.is_dir() => bail!("{dest} is a directory"),
        Ok(_) => Ok(fs.remove_file(dest)?),
        Err(FsError::NotFound(_)) => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// ns since the epoch of a host time (seconds, nanoseconds); 0 before it.
fn host_ns(secs: i64, nsec: i64) -> u64 {
    u64::try_from(secs)
        .ok()
        .and_then(|s| s.checked_mul(1_000_000_000))
        .and_then(|s| s.checked_add(u64::try_from(nsec).unwrap_or(0)))
        .unwrap_or(0)
}

/// The namespaces of extended attributes AccelFS keeps (format §5).
const KEPT_XATTRS: [&[u8]; 3] = [b"user.", b"trusted.", b"security."];

/// Host extended attributes of `local` (a symlink's own), names and values. A host file
/// system without them has none.
fn host_xattrs(local: &Path) -> anyhow::Result<Vec<(Vec<u8>, Vec<u8>)>> {
    use rustix::io::Errno;
    let listed = |buf: &mut Vec<u8>| rustix::fs::llistxattr(local, &mut buf[..]);
    let mut names = vec![0u8; 4096];
    let n = loop {
        match listed(&mut names) {
            Ok(n) => break n,
            Err(Errno::RANGE) => {
                let want = rustix::fs::llistxattr_query(local)?;
                names.resize(want.max(names.len() * 2), 0);
            }
            Err(Errno::NOTSUP) => return Ok(Vec::new()),
            Err(e) => {
                return Err(e).with_context(|| format!("listing the xattrs of {}", local.display()))
            }
        }
    };
    let mut out = Vec::new();
    for name in names[..n].split(|&b| b == 0).filter(|n| !n.is_empty()) {
        let name_os = OsStr::from_bytes(name);
        let mut value = vec![0u8; 4096];
        let len = loop {
            match rustix::fs::lgetxattr(local, name_os, &mut value[..]) {
                Ok(len) => break Some(len),
                Err(Errno::RANGE) => {
                    let want = rustix::fs::lgetxattr_query(local, name_os)?;
                    value.resize(want.max(value.len() * 2), 0);
                }
                // Removed since it was listed.
                Err(Errno::NODATA) => break None,
                Err(e) => {
                    return Err(e).with_context(|| {
                        format!(
                            "reading xattr {} of {}",
                            String::from_utf8_lossy(name),
                            local.display()
                        )
                    })
                }
            }
        };
        if let Some(len) = len {
            value.truncate(len);
            out.push((name.to_vec(), value));
        }
    }
    Ok(out)
}

/// Copies the host file `local`'s extended attributes to inode `ino` (those AccelFS keeps).
fn put_xattrs(fs: &FileSystem, ino: u64, dest: &str, local: &Path) -> anyhow::Result<()> {
    for (name, value) in host_xattrs(local)? {
        let shown = String::from_utf8_lossy(&name);
        if !KEPT_XATTRS.iter().any(|p| name.starts_with(p)) {
            eprintln!(
                "skipping xattr {shown} of {} (AccelFS keeps user., trusted. and security.)",
                local.display()
            );
            continue;
        }
        fs.set_xattr(ino, &name, &value, XattrMode::Any)
            .with_context(|| format!("setting xattr {shown} of {dest}"))?;
    }
    Ok(())
}

/// Sets inode `ino`'s extended attributes on the host copy `local`, each where the host
/// permits it (saying which it could not set).
fn get_xattrs(fs: &FileSystem, ino: u64, local: &Path) -> anyhow::Result<()> {
    use rustix::io::Errno;
    for name in fs.list_xattr(ino)? {
        let value = fs.get_xattr(ino, &name)?;
        let name_os = OsStr::from_bytes(&name);
        match rustix::fs::lsetxattr(local, name_os, &value, rustix::fs::XattrFlags::empty()) {
            Ok(()) => {}
            Err(e @ (Errno::PERM | Errno::ACCESS | Errno::NOTSUP)) => eprintln!(
                "could not set xattr {} of {}: {e}",
                String::from_utf8_lossy(&name),
                local.display()
            ),
            Err(e) => {
                return Err(e).with_context(|| {
                    format!(
                        "setting xattr {} of {}",
                        String::from_utf8_lossy(&name),
                        local.display()
                    )
                })
            }
        }
    }
    Ok(())
}

/// Gives `dest` the host file `local`'s permission bits (not a symlink's), owner, extended
/// attributes and times.
fn put_attributes(
    fs: &FileSystem,
    dest: &str,
    local: &Path,
    m: &std::fs::Metadata,
) -> anyhow::Result<()> {
    let ino = fs.metadata(dest)?.ino;
    put_xattrs(fs, ino, dest, local)?;
    if !m.file_type().is_symlink() {
        fs.set_attr(ino, Some((m.mode() & 0o7777) as u16), None)?;
    }
    fs.set_owner(ino, Some(m.uid()), Some(m.gid()))?;
    fs.set_times(
        ino,
        Some(host_ns(m.atime(), m.atime_nsec())),
        Some(host_ns(m.mtime(), m.mtime_nsec())),
    )?;
    Ok(())
}

/// Gives the host copy `local` of `m` its extended attributes, permission bits, owner (where
/// the host allows) and times; a symlink only its owner and attributes.
fn get_attributes(fs: &FileSystem, local: &Path, m: &Metadata) -> anyhow::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    // Before the mode: setting a user. attribute needs write permission on the file.
    get_xattrs(fs, m.ino, local)?;
    if let Some((uid, gid)) = m.owner {
        match std::os::unix::fs::lchown(local, Some(uid), Some(gid)) {
            Ok(()) => {}
            // As `cp -a` does for a user who may not give files away.
            Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => {}
            Err(e) => return Err(e).with_context(|| format!("chown {}", local.display())),
        }
    }
    if m.is_symlink() {
        return Ok(());
    }
    std::fs::set_permissions(local, std::fs::Permissions::from_mode(u32::from(m.mode)))
        .with_context(|| format!("chmod {}", local.display()))?;
    let time = |ns: u64| std::time::UNIX_EPOCH + std::time::Duration::from_nanos(ns);
    let times = std::fs::FileTimes::new()
        .set_accessed(time(m.atime_ns))
        .set_modified(time(m.mtime_ns));
    std::fs::File::open(local)
        .and_then(|f| f.set_times(times))
        .with_context(|| format!("setting the times of {}", local.display()))
}

fn read_full(src: &mut impl Read, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut got = 0;
    while got < buf.len() {
        match src.read(&mut buf[got..])? {
            0 => break,
            n => got += n,
        }
    }
    Ok(got)
}

/// Copies `src` out to `local`: only the allocated ranges are read and written, so holes stay
/// holes and a file's size costs nothing beyond its data; the host file gets the stated size.
fn get(
    fs: &FileSystem,
    src: &str,
    local: &Path,
    bar: &ProgressBar,
    done: &mut Done,
) -> anyhow::Result<()> {
    use std::os::unix::fs::FileExt;
    let m = fs.metadata(src)?;
    if m.is_dir() {
        std::fs::create_dir_all(local).with_context(|| format!("creating {}", local.display()))?;
        for e in fs.read_dir(src)? {
            let name = e.name_lossy();
            get(fs, &join(src, &name), &local.join(&name), bar, done)?;
        }
        return get_attributes(fs, local, &m);
    }
    let key = (0, m.ino);
    if m.links > 1 {
        if let Some(first) = done.linked.get(&key) {
            remove_host_file(local)?;
            std::fs::hard_link(first, local)
                .with_context(|| format!("linking {}", local.display()))?;
            done.files += 1;
            return Ok(());
        }
    }
    match m.file_type {
        FileType::File => {}
        FileType::Symlink => {
            let target = fs.read_link(src)?;
            remove_host_file(local)?;
            std::os::unix::fs::symlink(OsStr::from_bytes(&target), local)
                .with_context(|| format!("creating the link {}", local.display()))?;
            if m.links > 1 {
                done.linked.insert(key, local.to_path_buf());
            }
            done.files += 1;
            return get_attributes(fs, local, &m);
        }
        _ => {
            eprintln!(
                "skipping {src} ({}: creating one on the host needs mknod)",
                kind(&m)
            );
            return Ok(());
        }
    }
    let f = fs.open(src)?;
    let ranges = f.allocated_ranges()?;
    let out =
        std::fs::File::create(local).with_context(|| format!("creating {}", local.display()))?;
    let mut buf = vec![0u8; CHUNK];
    for range in ranges {
        let end = range.end.min(m.size);
        let mut at = range.start;
        while at < end {
            if let Err(stopped) = interrupt::check(String::new) {
                drop(out);
                let _ = std::fs::remove_file(local);
                return Err(Interrupted {
                    kept: format!(
                        "{} file(s), {}, copied out completely; the partial {} was removed",
                        done.files,
                        human(done.bytes),
                        local.display()
                    ),
                    ..stopped
                }
                .into());
            }
            let want = ((end - at) as usize).min(CHUNK);
            let n = f.read_at(at, &mut buf[..want])?;
            if n == 0 {
                break;
            }
            out.write_all_at(&buf[..n], at)
                .with_context(|| format!("writing {}", local.display()))?;
            at += n as u64;
            bar.inc(n as u64);
        }
    }
    out.set_len(m.size)
        .with_context(|| format!("sizing {}", local.display()))?;
    out.sync_all()?;
    drop(out);
    if m.links > 1 {
        done.linked.insert(key, local.to_path_buf());
    }
    done.files += 1;
    done.bytes += m.size;
    get_attributes(fs, local, &m)
}

/// Removes a host file or symlink at `local` (not a directory) before it is replaced.
fn remove_host_file(local: &Path) -> anyhow::Result<()> {
    match std::fs::symlink_metadata(local) {
        Ok(m) if !m.is_dir() => {
            std::fs::remove_file(local).with_context(|| format!("replacing {}", local.display()))
        }
        _ => Ok(()),
    }
}

fn remove_tree(fs: &FileSystem, path: &str, done: &mut Done) -> anyhow::Result<()> {
    for e in fs.read_dir(path)? {
        interrupt::check(|| {
            format!(
                "{} file(s) removed and committed; {path} and the rest are still there",
                done.files
            )
        })?;
        let child = join(path, &e.name_lossy());
        if e.file_type == FileType::Directory {
            remove_tree(fs, &child, done)?;
        } else {
            fs.remove_file(&child)?;
            done.files += 1;
        }
    }
    fs.remove_dir(path)?;
    Ok(())
}
