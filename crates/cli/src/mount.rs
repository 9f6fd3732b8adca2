//! `kura mount SPEC DIR`: AccelFS through FUSE (the fuser crate), so `ls`, `cp`, `diff` and
//! `sha256sum` work on it. Each FUSE request maps to one call of the inode-level API of
//! `kura_accelfs::FileSystem`; `fsync` is a journal commit. Unmounting (`fusermount3 -u DIR`,
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
    ReplyEmpty, ReplyEntry, ReplyStatfs, ReplyWrite, Request, TimeOrNow, WriteFlags,
};
use kura_accelfs::{FileSystem, FileType, FsError, Metadata, MountOptions};
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

impl Fuse {
    fn attr(&self, m: &Metadata) -> FileAttr {
        FileAttr {
            ino: INodeNo(m.ino),
            size: m.size,
            blocks: m.blocks * u64::from(m.block_size) / 512,
            atime: time(m.mtime_ns),
            mtime: time(m.mtime_ns),
            ctime: time(m.ctime_ns),
            crtime: time(m.ctime_ns),
            kind: match m.file_type {
                FileType::Directory => FuseType::Directory,
                FileType::File => FuseType::RegularFile,
            },
            perm: m.mode & 0o7777,
            nlink: if m.is_dir() { 2 } else { m.links },
            uid: self.uid,
            gid: self.gid,
            rdev: 0,
            blksize: m.block_size,
            flags: 0,
        }
    }

    fn entry(&self, r: Result<Metadata, FsError>, reply: ReplyEntry) {
        match r {
            Ok(m) => reply.entry(&TTL, &self.attr(&m), Generation(u64::from(m.generation))),
            Err(e) => reply.error(errno(&e)),
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
        _uid: Option<u32>,
        _gid: Option<u32>,
        size: Option<u64>,
        _atime: Option<TimeOrNow>,
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
            if mode.is_some() || mtime.is_some() {
                self.fs
                    .set_attr(ino.0, mode.map(|m| (m & 0o7777) as u16), mtime.map(ns))?;
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
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        reply: ReplyEntry,
    ) {
        let mode = (mode & !umask & 0o7777) as u16;
        self.entry(
            self.fs
                .create_in(parent.0, name.as_bytes(), FileType::Directory, mode),
            reply,
        );
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
        if flags.bits() != 0 {
            // RENAME_EXCHANGE / RENAME_NOREPLACE are not supported.
            reply.error(Errno::EINVAL);
            return;
        }
        Self::empty(
            self.fs
                .rename_in(parent.0, name.as_bytes(), newparent.0, newname.as_bytes()),
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
        _ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        Self::empty(self.fs.sync(), reply);
    }

    fn fsyncdir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        Self::empty(self.fs.sync(), reply);
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
        .chain(entries.into_iter().map(|e| {
            let kind = match e.file_type {
                FileType::Directory => FuseType::Directory,
                FileType::File => FuseType::RegularFile,
            };
            (e.ino, kind, e.name)
        }));
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
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        _flags: i32,
        reply: ReplyCreate,
    ) {
        let mode = (mode & !umask & 0o7777) as u16;
        match self
            .fs
            .create_in(parent.0, name.as_bytes(), FileType::File, mode)
        {
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
