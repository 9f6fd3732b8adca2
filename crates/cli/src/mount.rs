//! `kura mount SPEC DIR`: AccelFS through FUSE (the fuser crate), so `ls`, `cp`, `diff`,
//! `sha256sum`, `tar` and `ln -s` work on it. Each FUSE request maps to one call of the
//! inode-level API of `kura_accelfs::FileSystem` (files, directories, symbolic links, hard
//! links, FIFOs, sockets, device nodes, extended attributes, owners, nanosecond times,
//! `renameat2` flags, `fallocate`); `fsync` is a journal commit. New inodes record the
//! caller's uid and gid; inodes without a recorded owner (images made before it) show the
//! mount point's owner. Unmounting (`fusermount3 -u DIR`,
//! or SIGINT, SIGTERM or SIGHUP) commits and checkpoints before the command exits 0.
//!
//! On a signal everything written so far is committed first, then the mount is detached: a plain
//! unmount, or a lazy one when a program still has files open there (the session then ends when
//! they close them). A second signal exits at once; the image stays consistent because only
//! journal commits change its metadata, and what the first signal's commit covered is kept. The
//! mount is `nosuid,nodev` and modes are masked to permission bits, since the image's bytes may
//! come from anyone.

use crate::dev::{open_dev, open_dev_read_only};
use anyhow::Context;
use fuser::{
    Errno, FileAttr, FileHandle, FileType as FuseType, Filesystem, FopenFlags, Generation, INodeNo,
    LockOwner, OpenFlags, RenameFlags, ReplyAttr, ReplyCreate, ReplyData, ReplyDirectory,
    ReplyEmpty, ReplyEntry, ReplyStatfs, ReplyWrite, ReplyXattr, Request, TimeOrNow, WriteFlags,
};
use kura_accelfs::{
    Fallocate, FileSystem, FileType, FsError, Metadata, MountOptions, NodeSpec, RenameMode,
    XattrMode,
};
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

#[derive(Debug, clap::Args)]
pub struct MountArgs {
    /// Device spec holding an AccelFS (see `kura specs`), e.g. `file:/tmp/fs.img`.
    spec: String,
    /// Existing empty directory to mount on.
    dir: PathBuf,
    /// Buffer cache budget, e.g. 64M.
    #[arg(long, default_value = "64M")]
    cache: String,
    /// Mount read-only: the image is opened `ro=1` (shared with other readers, refused while a
    /// writer holds it), its journal replayed in memory, and nothing is ever written to it.
    #[arg(long)]
    read_only: bool,
}

/// Attributes the kernel may cache; short because another `kura` process could not change the
/// device under us anyway (the device is opened exclusively by this one), but kept small so
/// `stat` after a write is exact.
const TTL: Duration = Duration::from_secs(1);

struct Fuse {
    fs: FileSystem,
    uid: u32,
    gid: u32,
}

fn errno(e: &FsError) -> Errno {
    Errno::from_i32(e.errno())
}

fn time(ns: u64) -> SystemTime {
    UNIX_EPOCH + Duration::from_nanos(ns)
}

fn ns(t: TimeOrNow) -> u64 {
    let t = match t {
        TimeOrNow::SpecificTime(t) => t,
        TimeOrNow::Now => SystemTime::now(),
    };
    t.duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

/// Linux ABI values the FUSE requests carry (this crate does not link libc).
mod abi {
    pub const S_IFMT: u32 = 0o170_000;
    pub const S_IFREG: u32 = 0o100_000;
    pub const S_IFIFO: u32 = 0o010_000;
    pub const S_IFSOCK: u32 = 0o140_000;
    pub const S_IFCHR: u32 = 0o020_000;
    pub const S_IFBLK: u32 = 0o060_000;
    pub const XATTR_CREATE: i32 = 1;
    pub const XATTR_REPLACE: i32 = 2;
    pub const FALLOC_FL_KEEP_SIZE: i32 = 1;
    pub const FALLOC_FL_PUNCH_HOLE: i32 = 2;
}

fn fuse_type(t: FileType) -> FuseType {
    match t {
        FileType::Directory => FuseType::Directory,
        FileType::File => FuseType::RegularFile,
        FileType::Symlink => FuseType::Symlink,
        FileType::Fifo => FuseType::NamedPipe,
        FileType::Socket => FuseType::Socket,
        FileType::CharDevice => FuseType::CharDevice,
        FileType::BlockDevice => FuseType::BlockDevice,
    }
}

/// The file type in a `mknod` mode, when AccelFS can create it.
fn mknod_type(mode: u32) -> Option<FileType> {
    match mode & abi::S_IFMT {
        abi::S_IFREG | 0 => Some(FileType::File),
        abi::S_IFIFO => Some(FileType::Fifo),
        abi::S_IFSOCK => Some(FileType::Socket),
        abi::S_IFCHR => Some(FileType::CharDevice),
        abi::S_IFBLK => Some(FileType::BlockDevice),
        _ => None,
    }
}

impl Fuse {
    fn attr(&self, m: &Metadata) -> FileAttr {
        let (uid, gid) = m.owner.unwrap_or((self.uid, self.gid));
        FileAttr {
            ino: INodeNo(m.ino),
            size: m.size,
            blocks: m.blocks * u64::from(m.block_size) / 512,
            atime: time(m.atime_ns),
            mtime: time(m.mtime_ns),
            ctime: time(m.ctime_ns),
            crtime: time(m.ctime_ns),
            kind: fuse_type(m.file_type),
            perm: m.mode & 0o7777,
            nlink: if m.is_dir() { 2 } else { m.links },
            uid,
            gid,
            rdev: m.rdev as u32,
            blksize: m.block_size,
            flags: 0,
        }
    }

    /// A new inode's spec with the caller as its owner.
    fn spec(req: &Request, file_type: FileType, mode: u32, umask: u32) -> NodeSpec {
        NodeSpec {
            owner: Some((req.uid(), req.gid())),
            ..NodeSpec::new(file_type, (mode & !umask & 0o7777) as u16)
        }
    }

    fn entry(&self, r: Result<Metadata, FsError>, reply: ReplyEntry) {
        match r {
            Ok(m) => reply.entry(&TTL, &self.attr(&m), Generation(u64::from(m.generation))),
            Err(e) => reply.error(errno(&e)),
        }
    }

    /// A value for `getxattr`/`listxattr`: its size when asked for 0 bytes, `ERANGE` when it
    /// does not fit in `size`.
    fn xattr_reply(v: &[u8], size: u32, reply: ReplyXattr) {
        if size == 0 {
            reply.size(v.len() as u32);
        } else if v.len() > size as usize {
            reply.error(Errno::ERANGE);
        } else {
            reply.data(v);
        }
    }

    /// fsync/fdatasync of one inode: POSIX promises that file's data and metadata, so only its
    /// own dirty data is written (plus the running transaction). A file unlinked while still
    /// open has no name left to find after a crash, yet programs fsync such temporary files and
    /// expect success, so a vanished inode falls back to syncing everything.
    fn sync_one(&self, ino: u64, datasync: bool) -> Result<(), FsError> {
        match self.fs.sync_ino(ino, datasync) {
            Err(FsError::NotFound(_)) => self.fs.sync(),
            other => other,
        }
    }

    fn empty(r: Result<(), FsError>, reply: ReplyEmpty) {
        match r {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(errno(&e)),
        }
    }
}

impl Filesystem for Fuse {
    fn destroy(&mut self) {
        if let Err(e) = self.fs.sync() {
            eprintln!("kura mount: final sync failed: {e}");
        }
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        self.entry(self.fs.lookup(parent.0, name.as_bytes()), reply);
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        match self.fs.metadata_of(ino.0) {
            Ok(m) => reply.attr(&TTL, &self.attr(&m)),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn setattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        _fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        let r = (|| {
            if let Some(size) = size {
                self.fs.set_len_ino(ino.0, size)?;
            }
            if mode.is_some() {
                self.fs
                    .set_attr(ino.0, mode.map(|m| (m & 0o7777) as u16), None)?;
            }
            if uid.is_some() || gid.is_some() {
                // An inode without a recorded owner shows the mount point's: the half of the
                // owner `chown` leaves alone keeps what was shown.
                let (u, g) = self
                    .fs
                    .metadata_of(ino.0)?
                    .owner
                    .unwrap_or((self.uid, self.gid));
                self.fs
                    .set_owner(ino.0, Some(uid.unwrap_or(u)), Some(gid.unwrap_or(g)))?;
            }
            if atime.is_some() || mtime.is_some() {
                self.fs.set_times(ino.0, atime.map(ns), mtime.map(ns))?;
            }
            self.fs.metadata_of(ino.0)
        })();
        match r {
            Ok(m) => reply.attr(&TTL, &self.attr(&m)),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn mkdir(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        reply: ReplyEntry,
    ) {
        let spec = Self::spec(req, FileType::Directory, mode, umask);
        self.entry(self.fs.make_node(parent.0, name.as_bytes(), &spec), reply);
    }

    fn mknod(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        rdev: u32,
        reply: ReplyEntry,
    ) {
        let Some(file_type) = mknod_type(mode) else {
            reply.error(Errno::EINVAL);
            return;
        };
        let spec = NodeSpec {
            rdev: u64::from(rdev),
            ..Self::spec(req, file_type, mode, umask)
        };
        self.entry(self.fs.make_node(parent.0, name.as_bytes(), &spec), reply);
    }

    fn symlink(
        &self,
        req: &Request,
        parent: INodeNo,
        link_name: &OsStr,
        target: &Path,
        reply: ReplyEntry,
    ) {
        let spec = NodeSpec {
            owner: Some((req.uid(), req.gid())),
            ..NodeSpec::symlink(target.as_os_str().as_bytes())
        };
        self.entry(
            self.fs.make_node(parent.0, link_name.as_bytes(), &spec),
            reply,
        );
    }

    fn readlink(&self, _req: &Request, ino: INodeNo, reply: ReplyData) {
        match self.fs.read_link_ino(ino.0) {
            Ok(t) => reply.data(&t),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn link(
        &self,
        _req: &Request,
        ino: INodeNo,
        newparent: INodeNo,
        newname: &OsStr,
        reply: ReplyEntry,
    ) {
        self.entry(
            self.fs.link_in(ino.0, newparent.0, newname.as_bytes()),
            reply,
        );
    }

    fn setxattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        name: &OsStr,
        value: &[u8],
        flags: i32,
        position: u32,
        reply: ReplyEmpty,
    ) {
        let mode = match flags {
            0 => XattrMode::Any,
            abi::XATTR_CREATE => XattrMode::Create,
            abi::XATTR_REPLACE => XattrMode::Replace,
            _ => {
                reply.error(Errno::EINVAL);
                return;
            }
        };
        if position != 0 {
            reply.error(Errno::EINVAL);
            return;
        }
        Self::empty(
            self.fs.set_xattr(ino.0, name.as_bytes(), value, mode),
            reply,
        );
    }

    fn getxattr(&self, _req: &Request, ino: INodeNo, name: &OsStr, size: u32, reply: ReplyXattr) {
        match self.fs.get_xattr(ino.0, name.as_bytes()) {
            Ok(v) => Self::xattr_reply(&v, size, reply),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn listxattr(&self, _req: &Request, ino: INodeNo, size: u32, reply: ReplyXattr) {
        match self.fs.list_xattr(ino.0) {
            Ok(names) => {
                let mut all = Vec::new();
                for n in names {
                    all.extend_from_slice(&n);
                    all.push(0);
                }
                Self::xattr_reply(&all, size, reply)
            }
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn removexattr(&self, _req: &Request, ino: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        Self::empty(self.fs.remove_xattr(ino.0, name.as_bytes()), reply);
    }

    fn fallocate(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        length: u64,
        mode: i32,
        reply: ReplyEmpty,
    ) {
        let mode = match mode {
            0 => Fallocate::Allocate { keep_size: false },
            abi::FALLOC_FL_KEEP_SIZE => Fallocate::Allocate { keep_size: true },
            m if m == abi::FALLOC_FL_PUNCH_HOLE | abi::FALLOC_FL_KEEP_SIZE => Fallocate::PunchHole,
            _ => {
                reply.error(Errno::EOPNOTSUPP);
                return;
            }
        };
        Self::empty(self.fs.fallocate(ino.0, offset, length, mode), reply);
    }

    fn unlink(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        Self::empty(self.fs.remove_in(parent.0, name.as_bytes(), false), reply);
    }

    fn rmdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        Self::empty(self.fs.remove_in(parent.0, name.as_bytes(), true), reply);
    }

    fn rename(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        let mode = if flags.is_empty() {
            RenameMode::Replace
        } else if flags == RenameFlags::RENAME_NOREPLACE {
            RenameMode::NoReplace
        } else if flags == RenameFlags::RENAME_EXCHANGE {
            RenameMode::Exchange
        } else {
            // RENAME_WHITEOUT (overlayfs) and combinations are not supported.
            reply.error(Errno::EINVAL);
            return;
        };
        Self::empty(
            self.fs.rename_in_with(
                parent.0,
                name.as_bytes(),
                newparent.0,
                newname.as_bytes(),
                mode,
            ),
            reply,
        );
    }

    fn read(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        let mut buf = vec![0u8; size as usize];
        match self.fs.read_ino(ino.0, offset, &mut buf) {
            Ok(n) => reply.data(&buf[..n]),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn write(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        data: &[u8],
        _write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        match self.fs.write_ino(ino.0, offset, data) {
            Ok(n) => reply.written(n as u32),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn flush(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        // close() is not a durability point (as on ext4); fsync is.
        reply.ok();
    }

    fn fsync(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        datasync: bool,
        reply: ReplyEmpty,
    ) {
        Self::empty(self.sync_one(ino.0, datasync), reply);
    }

    fn fsyncdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        datasync: bool,
        reply: ReplyEmpty,
    ) {
        Self::empty(self.sync_one(ino.0, datasync), reply);
    }

    fn readdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        let entries = match self.fs.list(ino.0) {
            Ok(e) => e,
            Err(e) => {
                reply.error(errno(&e));
                return;
            }
        };
        let parent = self.fs.metadata_of(ino.0).map_or(ino.0, |m| m.parent);
        let all = [
            (ino.0, FuseType::Directory, b".".to_vec()),
            (parent, FuseType::Directory, b"..".to_vec()),
        ]
        .into_iter()
        .chain(
            entries
                .into_iter()
                .map(|e| (e.ino, fuse_type(e.file_type), e.name)),
        );
        for (i, (ino, kind, name)) in all.enumerate().skip(offset as usize) {
            if reply.add(INodeNo(ino), i as u64 + 1, kind, OsStr::from_bytes(&name)) {
                break;
            }
        }
        reply.ok();
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        let s = self.fs.statfs();
        reply.statfs(
            s.total_blocks,
            s.free_blocks,
            s.free_blocks,
            s.total_inodes,
            s.free_inodes,
            s.block_size,
            255,
            s.block_size,
        );
    }

    fn create(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        _flags: i32,
        reply: ReplyCreate,
    ) {
        let spec = Self::spec(req, FileType::File, mode, umask);
        match self.fs.make_node(parent.0, name.as_bytes(), &spec) {
            Ok(m) => reply.created(
                &TTL,
                &self.attr(&m),
                Generation(u64::from(m.generation)),
                FileHandle(0),
                FopenFlags::empty(),
            ),
            Err(e) => reply.error(errno(&e)),
        }
    }
}

/// Detaches the FUSE mount on `dir`: a plain unmount, else (busy, or `lazy`) a lazy one, which
/// takes the name away at once and ends the session when the last open file there is closed.
fn detach(dir: &Path, lazy: bool) {
    let unmount = |lazy: bool| {
        let mut cmd = std::process::Command::new("fusermount3");
        cmd.arg("-u").arg("-q");
        if lazy {
            cmd.arg("-z");
        }
        cmd.arg(dir)
            .stderr(std::process::Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    };
    if lazy || !unmount(false) {
        unmount(true);
    }
}

/// Mounts and serves until unmounted; then commits and checkpoints.
pub fn run(args: &MountArgs) -> anyhow::Result<()> {
    let cache = kura_engine::spec::parse_size(&args.cache).map_err(anyhow::Error::msg)?;
    let dir_meta = std::fs::metadata(&args.dir)
        .with_context(|| format!("mount point {}", args.dir.display()))?;
    anyhow::ensure!(
        dir_meta.is_dir(),
        "mount point {} is not a directory",
        args.dir.display()
    );
    anyhow::ensure!(
        Path::new("/dev/fuse").exists(),
        "/dev/fuse is missing: FUSE is not available on this machine"
    );
    let opts = MountOptions {
        cache_bytes: cache,
        ..MountOptions::default()
    };
    let fs = if args.read_only {
        FileSystem::mount_read_only(open_dev_read_only(&args.spec)?, opts)
    } else {
        FileSystem::mount(open_dev(&args.spec)?, opts)
    }
    .with_context(|| format!("mounting AccelFS from {}", args.spec))?;
    let fuse = Fuse {
        fs: fs.clone(),
        uid: dir_meta.uid(),
        gid: dir_meta.gid(),
    };
    let mut config = fuser::Config::default();
    config.mount_options = vec![
        fuser::MountOption::FSName(format!("kura:{}", args.spec)),
        fuser::MountOption::Subtype("accelfs".into()),
        fuser::MountOption::DefaultPermissions,
        fuser::MountOption::NoSuid,
        fuser::MountOption::NoDev,
    ];
    if args.read_only {
        config.mount_options.push(fuser::MountOption::RO);
    }
    let session = fuser::spawn_mount(fuse, &args.dir, &config).with_context(|| {
        format!(
            "FUSE mount on {} (needs /dev/fuse and fusermount3 from the fuse3 package)",
            args.dir.display()
        )
    })?;
    let dir = args.dir.clone();
    // The handler lives as long as the process; it holds the file system only until the main
    // thread takes it back for the final commit, so the device (and its lock) is dropped then.
    let committer = std::sync::Arc::new(std::sync::Mutex::new(Some(fs.clone())));
    let handler_fs = std::sync::Arc::clone(&committer);
    let signals = std::sync::atomic::AtomicUsize::new(0);
    ctrlc::set_handler(move || {
        if signals.fetch_add(1, std::sync::atomic::Ordering::SeqCst) > 0 {
            eprintln!("kura mount: second signal: exiting now; the last commit is what remains");
            detach(&dir, true);
            std::process::exit(1);
        }
        eprintln!(
            "kura mount: signal received: committing, then unmounting {}",
            dir.display()
        );
        let held = handler_fs.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(Err(e)) = held.as_ref().map(FileSystem::sync) {
            eprintln!("kura mount: commit before unmount failed: {e}");
        }
        drop(held);
        // Unmounting ends the session loop; the main thread then commits again and exits.
        detach(&dir, false);
    })
    .context("installing the signal handler")?;
    eprintln!(
        "kura: AccelFS from {} mounted on {} (unmount with `fusermount3 -u {}`, Ctrl-C or SIGTERM)",
        args.spec,
        args.dir.display(),
        args.dir.display()
    );
    session.join().context("FUSE session")?;
    committer.lock().unwrap_or_else(|p| p.into_inner()).take();
    fs.unmount().context("final commit at unmount")?;
    eprintln!("kura: {} unmounted cleanly", args.dir.display());
    Ok(())
}
