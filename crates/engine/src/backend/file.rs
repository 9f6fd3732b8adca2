//! Opening what file-based backends stand on: an image file (created on request) or a block device.
//!
//! Shared by `uring`, `sync` and `redirect`: exclusive use (below), sizing (regular files by
//! length, block devices by `BLKGETSIZE64`), the device's own logical block size (`BLKSSZGET`),
//! O_DIRECT with a fallback when the file system refuses it (tmpfs does), and discard /
//! write-zeroes through `fallocate` or the block-device ioctls.
//!
//! Exclusive use: two processes writing one image corrupt it (each caches metadata the other
//! changes), so an open for writing takes `flock(LOCK_EX | LOCK_NB)` and a block device is also
//! opened `O_EXCL` (which the kernel refuses while it is mounted); a read-only open (`ro=1`) takes
//! a shared lock and opens `O_RDONLY`. A refused open names the image and, from `/proc/locks`, the
//! process holding it, and changes nothing. The lock belongs to the open file, so it lasts as
//! long as the device (and a forked `redirect` proxy) keeps the file open. The queue pairs of
//! one device share one `BackingFile` through an `Arc`: its `Drop` unlocks the open file
//! description they all use, so it must run once, when the last of them is dropped.

use crate::error::{Errno, OpenError};
use std::fs::{File, OpenOptions};
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::os::unix::io::AsRawFd;

const BLKGETSIZE64: libc::c_ulong = 0x8008_1272;
const BLKSSZGET: libc::c_ulong = 0x1268;
const BLKZEROOUT: libc::c_ulong = 0x127f;

/// Whether to bypass the page cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DirectMode {
    /// O_DIRECT; fail if the file system refuses it.
    Required,
    /// O_DIRECT when possible, buffered otherwise.
    Preferred,
    /// Buffered I/O through the page cache.
    Off,
}

impl DirectMode {
    /// From an optional `direct=` flag: absent → `default`.
    pub fn from_flag(flag: Option<bool>, default: DirectMode) -> Self {
        match flag {
            Some(true) => DirectMode::Required,
            Some(false) => DirectMode::Off,
            None => default,
        }
    }
}

/// Whether a backend may change its image.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// `O_RDWR` and an exclusive lock: no other process may open the image at the same time.
    ReadWrite,
    /// `O_RDONLY` and a shared lock: other readers may share it, writers may not.
    ReadOnly,
}

impl Access {
    /// From a spec's `ro=` option (absent: read-write).
    pub fn from_spec(spec: &crate::spec::Spec) -> Result<Self, OpenError> {
        Ok(if spec.bool_option("ro")?.unwrap_or(false) {
            Access::ReadOnly
        } else {
            Access::ReadWrite
        })
    }
}

/// An opened image file or block device.
#[derive(Debug)]
pub struct BackingFile {
    pub file: File,
    pub path: String,
    /// Usable bytes.
    pub size: u64,
    pub is_block_device: bool,
    /// The underlying device's logical block size (512 for regular files unless known better).
    pub device_block_size: u32,
    /// True when opened with O_DIRECT.
    pub direct: bool,
    /// How it was opened; mutations of a read-only image are refused before they reach it.
    pub access: Access,
}

impl BackingFile {
    /// Opens the target of a file-backed spec with its `size=` and `ro=` options.
    pub fn open_spec(spec: &crate::spec::Spec, direct: DirectMode) -> Result<Self, OpenError> {
        BackingFile::open(
            spec.require_target()?,
            direct,
            spec.size_option("size")?,
            Access::from_spec(spec)?,
        )
    }

    /// Opens `path` and locks it for `access` (see the module docs). With `create_size`, a
    /// missing file is created with that length and a shorter regular file is grown to it (never
    /// shrunk); a read-only open cannot do either, so there `size=` must already be met.
    pub fn open(
        path: &str,
        direct: DirectMode,
        create_size: Option<u64>,
        access: Access,
    ) -> Result<Self, OpenError> {
        let os = |e: std::io::Error| OpenError::Os {
            path: path.to_string(),
            errno: Errno::from_io(&e),
        };
        let create_size = match (create_size, access) {
            // Read-only, size= can only be met by what is there.
            (Some(size), Access::ReadOnly) => {
                let meta = std::fs::metadata(path).map_err(|e| match e.kind() {
                    std::io::ErrorKind::NotFound => OpenError::Invalid(format!(
                        "{path} does not exist, and a read-only open (ro=1) cannot create it"
                    )),
                    _ => os(e),
                })?;
                if meta.file_type().is_file() && meta.len() < size {
                    return Err(OpenError::Invalid(format!(
                        "{path} holds {} bytes, less than size={size}, and a read-only open \
                         (ro=1) cannot grow it",
                        meta.len()
                    )));
                }
                None
            }
            (size, _) => size,
        };
        // Lock before growing, so that a refused open changes nothing.
        if let Some(size) = create_size {
            let f = OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(false)
                .open(path)
                .map_err(os)?;
            let meta = f.metadata().map_err(os)?;
            if meta.file_type().is_file() && meta.len() < size {
                lock(&f, path, access)?;
                let grown = f.set_len(size).map_err(os);
                // Unlock explicitly rather than at close: a process forked meanwhile (a redirect
                // proxy, a spawned tool before its exec) shares this open file, and closing our
                // copy would leave the lock held, refusing the open below.
                unlock(&f);
                grown?;
            }
        }
        let is_block_node = std::fs::metadata(path)
            .map(|m| m.file_type().is_block_device())
            .unwrap_or(false);
        let open_with = |flags: i32| {
            let exclusive = if is_block_node && access == Access::ReadWrite {
                libc::O_EXCL
            } else {
                0
            };
            OpenOptions::new()
                .read(true)
                .write(access == Access::ReadWrite)
                .custom_flags(flags | exclusive)
                .open(path)
        };
        let busy = |e: std::io::Error| {
            if is_block_node && e.raw_os_error() == Some(libc::EBUSY) {
                OpenError::Locked {
                    path: path.to_string(),
                    holder: "the kernel or another program (it is mounted or opened exclusively)"
                        .into(),
                }
            } else {
                os(e)
            }
        };
        let (file, is_direct) = match direct {
            DirectMode::Off => (open_with(0).map_err(busy)?, false),
            DirectMode::Required => (
                open_with(libc::O_DIRECT).map_err(|e| match e.raw_os_error() {
                    Some(libc::EBUSY) => busy(e),
                    _ => refused_direct(path, e),
                })?,
                true,
            ),
            DirectMode::Preferred => match open_with(libc::O_DIRECT) {
                Ok(f) => (f, true),
                Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
                    (open_with(0).map_err(busy)?, false)
                }
                Err(e) => return Err(busy(e)),
            },
        };
        lock(&file, path, access)?;
        let described = describe(&file, path);
        if described.is_err() {
            unlock(&file);
        }
        let (size, device_block_size, is_block_device) = described?;
        Ok(BackingFile {
            file,
            path: path.to_string(),
            size,
            is_block_device,
            device_block_size,
            direct: is_direct,
            access,
        })
    }

    /// True when opened with `ro=1`.
    pub fn read_only(&self) -> bool {
        self.access == Access::ReadOnly
    }

    /// Buffer alignment the kernel needs for this file.
    pub fn buffer_alignment(&self) -> u32 {
        if self.direct {
            self.device_block_size.max(4096)
        } else {
            1
        }
    }

    /// Checks that the device's block size fits the one asked for and that one block fits.
    pub fn check_block_size(&self, block_size: u32) -> Result<(), OpenError> {
        if block_size < self.device_block_size {
            return Err(OpenError::Invalid(format!(
                "{}: block size {block_size} is smaller than the device's logical block size {}",
                self.path, self.device_block_size
            )));
        }
        if self.size < u64::from(block_size) {
            return Err(OpenError::TooSmall {
                path: self.path.clone(),
                actual: self.size,
                block_size,
            });
        }
        Ok(())
    }

    /// Deallocates the range so that it reads back as zeroes: a punched hole in a file; on a
    /// block device the same call, which the kernel turns into a write-zeroes command that may
    /// unmap (NVMe Write Zeroes with deallocate), or else BLKZEROOUT. A plain BLKDISCARD is not
    /// used: what a discarded range reads back is up to the device (QEMU's NVMe controller keeps
    /// the old data while claiming it reads as zeroes; the guest test caught it).
    pub fn discard(&self, offset: u64, len: u64) -> Result<(), Errno> {
        if self.is_block_device {
            return self
                .fallocate(
                    libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
                    offset,
                    len,
                )
                .or_else(|_| self.zero_range(offset, len));
        }
        self.fallocate(
            libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
            offset,
            len,
        )
        .or_else(|_| self.write_zeroes_by_hand(offset, len))
    }

    /// Makes the range read back as zeroes.
    pub fn zero_range(&self, offset: u64, len: u64) -> Result<(), Errno> {
        if self.is_block_device {
            return self
                .range_ioctl(BLKZEROOUT, offset, len)
                .or_else(|_| self.write_zeroes_by_hand(offset, len));
        }
        self.fallocate(
            libc::FALLOC_FL_ZERO_RANGE | libc::FALLOC_FL_KEEP_SIZE,
            offset,
            len,
        )
        .or_else(|_| self.write_zeroes_by_hand(offset, len))
    }

    /// [`BackingFile::allocation`] for a backend's `BlockDevice::allocation`: the range is
    /// checked against `geo` first, and a failed seek reports as a read error at `lba`.
    pub(crate) fn device_allocation(
        &self,
        geo: &crate::device::Geometry,
        lba: u64,
        blocks: u64,
    ) -> crate::error::DeviceResult<Option<Vec<crate::device::Extent>>> {
        crate::device::check_range(geo, lba, blocks)?;
        self.allocation(geo.block_size, lba, blocks)
            .map_err(|errno| crate::error::DeviceError::Io {
                op: crate::device::Opcode::Read,
                lba,
                errno,
            })
    }

    /// Data and holes of `blocks` blocks of `block_size` bytes at block `lba` of a regular
    /// file, from `SEEK_DATA`/`SEEK_HOLE`; `None` for a block device or a file system without
    /// them. A block with any data byte counts as data, so only whole-block holes are reported
    /// (they read as zeroes). Ranges past the end of the file are holes.
    pub fn allocation(
        &self,
        block_size: u32,
        lba: u64,
        blocks: u64,
    ) -> Result<Option<Vec<crate::device::Extent>>, Errno> {
        use crate::device::{push_extent, Allocation};
        if self.is_block_device {
            return Ok(None);
        }
        let bs = u64::from(block_size.max(1));
        let (start, end) = (lba * bs, (lba + blocks) * bs);
        let mut out = Vec::new();
        let mut pos = start;
        while pos < end {
            let data = match self.seek(pos, libc::SEEK_DATA) {
                Ok(at) => at,
                // No data at or after `pos`: the rest is a hole.
                Err(e) if e.0 == libc::ENXIO => end,
                Err(e) if e.0 == libc::EINVAL => return Ok(None),
                Err(e) => return Err(e),
            };
            // Round the hole's end down to a block: a partial block of data is data.
            let hole_end = (data.min(end) / bs * bs).max(pos);
            push_extent(&mut out, (hole_end - pos) / bs, Allocation::Hole);
            pos = hole_end;
            if pos >= end {
                break;
            }
            let hole = match self.seek(pos, libc::SEEK_HOLE) {
                Ok(at) => at,
                Err(e) if e.0 == libc::ENXIO => end,
                Err(e) => return Err(e),
            };
            let data_end = hole.min(end).div_ceil(bs) * bs;
            let data_end = data_end.max(pos + bs).min(end);
            push_extent(&mut out, (data_end - pos) / bs, Allocation::Data);
            pos = data_end;
        }
        Ok(Some(out))
    }

    fn seek(&self, offset: u64, whence: i32) -> Result<u64, Errno> {
        // SAFETY: lseek on an owned fd with plain integer arguments; it moves the file offset,
        // which no I/O of this crate uses (every read and write is positioned).
        let rc = unsafe { libc::lseek(self.file.as_raw_fd(), offset as i64, whence) };
        if rc < 0 {
            Err(Errno::last())
        } else {
            Ok(rc as u64)
        }
    }

    fn fallocate(&self, mode: i32, offset: u64, len: u64) -> Result<(), Errno> {
        // SAFETY: fallocate on an owned fd with plain integer arguments.
        let rc = unsafe { libc::fallocate(self.file.as_raw_fd(), mode, offset as i64, len as i64) };
        if rc == 0 {
            Ok(())
        } else {
            Err(Errno::last())
        }
    }

    fn range_ioctl(&self, request: libc::c_ulong, offset: u64, len: u64) -> Result<(), Errno> {
        let range: [u64; 2] = [offset, len];
        // SAFETY: BLKZEROOUT reads two u64 (start, length) through the pointer.
        let rc = unsafe { libc::ioctl(self.file.as_raw_fd(), request, range.as_ptr()) };
        if rc == 0 {
            Ok(())
        } else {
            Err(Errno::last())
        }
    }

    fn write_zeroes_by_hand(&self, offset: u64, len: u64) -> Result<(), Errno> {
        let chunk = crate::buffer::IoBuf::heap(len.min(1 << 20) as usize, 4096);
        let mut done = 0;
        while done < len {
            let n = (len - done).min(chunk.len() as u64) as usize;
            pwrite_all(&self.file, &chunk[..n], offset + done)?;
            done += n as u64;
        }
        Ok(())
    }
}

impl Drop for BackingFile {
    fn drop(&mut self) {
        // io_uring drops its references to a registered file asynchronously after the ring is
        // torn down; a lock held until then would refuse the next open of a closed image.
        unlock(&self.file);
    }
}

/// The size, logical block size and kind of an opened image: (bytes, block size, block device).
fn describe(file: &File, path: &str) -> Result<(u64, u32, bool), OpenError> {
    let meta = file.metadata().map_err(|e| OpenError::Os {
        path: path.to_string(),
        errno: Errno::from_io(&e),
    })?;
    let is_block_device = meta.file_type().is_block_device();
    let (size, device_block_size) = if is_block_device {
        let mut bytes: u64 = 0;
        // SAFETY: BLKGETSIZE64 writes one u64 through the pointer, which points at `bytes`.
        if unsafe { libc::ioctl(file.as_raw_fd(), BLKGETSIZE64, &mut bytes) } != 0 {
            return Err(OpenError::Os {
                path: path.into(),
                errno: Errno::last(),
            });
        }
        let mut lbs: libc::c_int = 0;
        // SAFETY: BLKSSZGET writes one int through the pointer, which points at `lbs`.
        if unsafe { libc::ioctl(file.as_raw_fd(), BLKSSZGET, &mut lbs) } != 0 {
            lbs = 512;
        }
        (bytes, lbs.max(512) as u32)
    } else if meta.file_type().is_file() {
        (meta.len(), 512)
    } else {
        return Err(OpenError::Invalid(format!(
            "{path} is neither a regular file nor a block device"
        )));
    };
    Ok((size, device_block_size, is_block_device))
}

/// Drops our lock on `file`'s open file description. Explicit rather than at close: another
/// reference to the description (a registered io_uring file, a child forked meanwhile) would
/// otherwise keep the image locked after we are done with it.
fn unlock(file: &File) {
    // SAFETY: flock on an fd owned by `file`, with integer flags.
    unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_UN) };
}

/// Takes the lock `access` needs on `file`; a lock held by a live process is an error naming it
/// at once. A lock whose holder is gone is waited for, briefly: io_uring releases the registered
/// files of a process that exited (or crashed) from a kernel worker, a little after the exit.
fn lock(file: &File, path: &str, access: Access) -> Result<(), OpenError> {
    const ORPHAN_WAIT: std::time::Duration = std::time::Duration::from_secs(3);
    let how = match access {
        Access::ReadWrite => libc::LOCK_EX,
        Access::ReadOnly => libc::LOCK_SH,
    };
    let start = std::time::Instant::now();
    loop {
        // SAFETY: flock on an fd owned by `file`, with integer flags.
        if unsafe { libc::flock(file.as_raw_fd(), how | libc::LOCK_NB) } == 0 {
            return Ok(());
        }
        let errno = Errno::last();
        match errno.0 {
            libc::EINTR => continue,
            libc::EWOULDBLOCK => {
                let holder = file.metadata().ok().and_then(|m| lock_holder(&m));
                let alive = holder
                    .is_some_and(|pid| std::path::Path::new(&format!("/proc/{pid}")).exists());
                if !alive && start.elapsed() < ORPHAN_WAIT {
                    std::thread::sleep(std::time::Duration::from_millis(10));
                    continue;
                }
                return Err(OpenError::Locked {
                    path: path.to_string(),
                    holder: match holder {
                        Some(pid) if alive => format!("process {pid}{}", process_name(pid)),
                        _ => "another process".to_string(),
                    },
                });
            }
            _ => {
                return Err(OpenError::Os {
                    path: path.to_string(),
                    errno,
                })
            }
        }
    }
}

/// The PID holding a `flock` on the file `meta` describes, from `/proc/locks`.
fn lock_holder(meta: &std::fs::Metadata) -> Option<u32> {
    use std::os::unix::fs::MetadataExt;
    let locks = std::fs::read_to_string("/proc/locks").ok()?;
    let dev = meta.dev();
    let id = format!(
        "{:02x}:{:02x}:{}",
        libc::major(dev),
        libc::minor(dev),
        meta.ino()
    );
    parse_lock_holder(&locks, &id)
}

/// The PID of the first granted FLOCK line of `locks` (the text of `/proc/locks`) on the file
/// named `dev_ino` (`MAJOR:MINOR:INODE`, the first two in hex).
fn parse_lock_holder(locks: &str, dev_ino: &str) -> Option<u32> {
    locks
        .lines()
        .filter(|l| !l.contains("->"))
        .find_map(|line| {
            let f: Vec<&str> = line.split_whitespace().collect();
            // "1: FLOCK  ADVISORY  WRITE 1234 08:01:5678 0 EOF"
            (f.len() >= 6 && f[1] == "FLOCK" && f[5] == dev_ino)
                .then(|| f[4].parse().ok())
                .flatten()
        })
}

/// " (NAME)" from `/proc/PID/comm`, or nothing.
fn process_name(pid: u32) -> String {
    std::fs::read_to_string(format!("/proc/{pid}/comm"))
        .map(|c| format!(" ({})", c.trim()))
        .unwrap_or_default()
}

fn refused_direct(path: &str, e: std::io::Error) -> OpenError {
    if e.raw_os_error() == Some(libc::EINVAL) {
        OpenError::Unavailable {
            backend: "file",
            feature: "O_DIRECT".into(),
            why: format!("the file system holding {path} refuses it; use direct=0 or put the image elsewhere"),
        }
    } else {
        OpenError::Os {
            path: path.to_string(),
            errno: Errno::from_io(&e),
        }
    }
}

/// `pread` until `buf` is full; a read past the end of the file is an error (EIO).
pub fn pread_exact(file: &File, buf: &mut [u8], offset: u64) -> Result<(), Errno> {
    let len = buf.len();
    until_done(len, |done| {
        let rest = &mut buf[done..];
        // SAFETY: the pointer and length describe the writable slice `rest`.
        unsafe {
            libc::pread(
                file.as_raw_fd(),
                rest.as_mut_ptr().cast(),
                rest.len(),
                (offset + done as u64) as i64,
            )
        }
    })
}

/// `pwrite` until all of `buf` is written.
pub fn pwrite_all(file: &File, buf: &[u8], offset: u64) -> Result<(), Errno> {
    until_done(buf.len(), |done| {
        let rest = &buf[done..];
        // SAFETY: the pointer and length describe the readable slice `rest`.
        unsafe {
            libc::pwrite(
                file.as_raw_fd(),
                rest.as_ptr().cast(),
                rest.len(),
                (offset + done as u64) as i64,
            )
        }
    })
}

/// Calls `io(bytes done so far)` — one `pread` or `pwrite` of the rest — until `len` bytes are
/// done: a short transfer goes on, EINTR retries, zero bytes is EIO, any other error is returned.
fn until_done(len: usize, mut io: impl FnMut(usize) -> isize) -> Result<(), Errno> {
    let mut done = 0;
    while done < len {
        match io(done) {
            n if n > 0 => done += n as usize,
            0 => return Err(Errno(libc::EIO)),
            _ => {
                let e = Errno::last();
                if e.0 != libc::EINTR {
                    return Err(e);
                }
            }
        }
    }
    Ok(())
}

/// `fdatasync`.
pub fn datasync(file: &File) -> Result<(), Errno> {
    // SAFETY: fdatasync on an owned fd.
    if unsafe { libc::fdatasync(file.as_raw_fd()) } == 0 {
        Ok(())
    } else {
        Err(Errno::last())
    }
}

/// Evicts a host file (an image, or any input) from the page cache, after writing back what is
/// dirty, so the next read comes from the disk; benchmarks call it before every cold point. No
/// root needed.
pub fn drop_page_cache(path: &std::path::Path) -> std::io::Result<()> {
    let file = File::open(path)?;
    file.sync_all()?;
    // SAFETY: posix_fadvise takes the fd (open for the call) and integers only.
    let rc = unsafe { libc::posix_fadvise(file.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
    if rc != 0 {
        return Err(std::io::Error::from_raw_os_error(rc));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::parse_lock_holder;
    use crate::device::Allocation;
    use crate::BlockingIo;

    /// `file:` (io_uring) and `sync:` report a sparse image's holes from SEEK_DATA/SEEK_HOLE,
    /// partial blocks of data as data, and every reported hole reads as zeroes.
    #[test]
    fn sparse_images_report_holes_that_read_as_zeroes() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sparse.img");
        let f = std::fs::File::create(&path).unwrap();
        f.set_len(4 << 20).unwrap();
        super::pwrite_all(&f, &[7u8; 8192], 1 << 20).unwrap();
        // One byte in the middle of block 768 (a partial block is data).
        super::pwrite_all(&f, &[9u8], (3 << 20) + 100).unwrap();
        drop(f);
        for kind in ["file", "sync"] {
            let mut dev = crate::open(&format!("{kind}:{}?direct=0", path.display())).unwrap();
            let blocks = dev.geometry().num_blocks;
            let Some(extents) = dev.allocation(0, blocks).unwrap() else {
                // A file system without SEEK_DATA: nothing to check beyond "no answer".
                continue;
            };
            assert_eq!(extents.iter().map(|e| e.blocks).sum::<u64>(), blocks);
            let bs = u64::from(dev.geometry().block_size);
            let mut at = 0;
            for e in &extents {
                let covers = |byte: u64| (at * bs..(at + e.blocks) * bs).contains(&byte);
                if e.state == Allocation::Hole {
                    assert!(!covers(1 << 20) && !covers((3 << 20) + 100), "{extents:?}");
                    let mut buf = vec![1u8; (e.blocks * bs) as usize];
                    dev.read_blocks(at, &mut buf).unwrap();
                    assert!(buf.iter().all(|&b| b == 0));
                }
                at += e.blocks;
            }
            let data: u64 = extents
                .iter()
                .filter(|e| e.state == Allocation::Data)
                .map(|e| e.blocks * bs)
                .sum();
            assert!(data < 1 << 20, "{kind}: {data} bytes of data: {extents:?}");
            // A sub-range starting inside the data.
            let first = (1 << 20) / bs + 1;
            let sub = dev.allocation(first, 4).unwrap().unwrap();
            assert_eq!(sub.first().map(|e| e.state), Some(Allocation::Data));
            assert_eq!(sub.iter().map(|e| e.blocks).sum::<u64>(), 4);
            assert!(dev.allocation(blocks, 1).is_err());
            assert!(dev.allocation(0, 0).is_err());
        }
    }

    #[test]
    fn the_holder_of_a_flock_is_found_in_proc_locks() {
        let locks = "1: POSIX  ADVISORY  WRITE 77 08:01:42 0 EOF\n\
                     2: FLOCK  ADVISORY  WRITE 4321 00:2e:1234 0 EOF\n\
                     2: -> FLOCK  ADVISORY  WRITE 99 00:2e:1234 0 EOF\n\
                     3: FLOCK  ADVISORY  READ 555 00:2e:99 0 EOF\n";
        assert_eq!(parse_lock_holder(locks, "00:2e:1234"), Some(4321));
        assert_eq!(parse_lock_holder(locks, "00:2e:99"), Some(555));
        assert_eq!(
            parse_lock_holder(locks, "08:01:42"),
            None,
            "POSIX locks are not ours"
        );
        assert_eq!(parse_lock_holder(locks, "00:2e:7"), None);
    }
}
