//! The proxy process: the "host" that serves every command of a `redirect` device.
//!
//! It runs in a child forked *without exec* from a process that may have many threads, so after
//! the fork it may only do async-signal-safe things: raw system calls (pread, pwrite, fdatasync,
//! fallocate, futex, clock_gettime, prctl, getppid, _exit), plain memory copies and atomics. It
//! allocates nothing, takes no lock, prints nothing and never panics on input: every length
//! and index read from the channel is checked before use. Its buffered I/O lands in its own
//! staging buffer (allocated before the fork) and is then copied into the channel — the copy a
//! host makes when it moves data to an accelerator.

use super::channel::{Channel, Command, OP_DISCARD, OP_FLUSH, OP_READ, OP_WRITE, OP_ZERO};
use std::time::Duration;

/// Everything the proxy needs, prepared before the fork.
pub struct ProxyConfig {
    pub fd: i32,
    pub staging: *mut u8,
    pub staging_len: usize,
    /// Modeled cost per call in ns (0 = no model).
    pub call_ns: u64,
    /// Modeled copy cost in ns per byte (0 = no model).
    pub ns_per_byte: f64,
    pub parent_pid: i32,
}

/// Closes every descriptor above stderr except `keep`.
///
/// # Safety
/// Only in the forked child, which uses no descriptor but `keep` and the standard three.
unsafe fn close_all_but(keep: i32) {
    let close_range = |lo: u32, hi: u32| {
        // SAFETY: close_range takes integers only; the caller owns every descriptor in the range.
        unsafe { libc::syscall(libc::SYS_close_range, lo, hi, 0u32) == 0 }
    };
    let keep = keep.max(0) as u32;
    let below = keep <= 3 || close_range(3, keep - 1);
    let above = close_range(keep + 1, u32::MAX);
    if !(below && above) {
        // Kernels before 5.9 lack close_range: close one by one up to a generous bound.
        for fd in 3..65_536i32 {
            if fd as u32 != keep {
                // SAFETY: closing a descriptor this child owns (EBADF for unused numbers).
                unsafe { libc::close(fd) };
            }
        }
    }
}

/// Serves commands until told to stop or the parent dies. Never returns.
///
/// # Safety
/// Must run in the child right after `fork`, with `chan` and `cfg` set up before the fork.
pub unsafe fn serve(chan: &Channel, cfg: &ProxyConfig) -> ! {
    // SAFETY: prctl/getppid/_exit are async-signal-safe system calls.
    unsafe {
        libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
        if libc::getppid() != cfg.parent_pid {
            libc::_exit(0);
        }
    }
    // The fork copied every descriptor the parent had open at that moment, from any thread:
    // other images included, whose locks (see `backend::file`) would then outlive the devices
    // that took them for as long as this proxy lives.
    // SAFETY: close_range/close are async-signal-safe system calls on descriptors this child owns.
    unsafe { close_all_but(cfg.fd) };
    chan.serve(
        Duration::from_millis(100),
        |index, cmd| serve_one(chan, index, cmd, cfg),
        // SAFETY: getppid is async-signal-safe.
        || unsafe { libc::getppid() } == cfg.parent_pid,
    );
    // SAFETY: async-signal-safe exit, skipping the parent's atexit handlers.
    unsafe { libc::_exit(0) }
}

/// Performs one command; returns 0 or a positive errno.
fn serve_one(chan: &Channel, index: usize, cmd: Command, cfg: &ProxyConfig) -> u32 {
    let Command { op, offset, len } = cmd;
    let len = len as usize;
    let errno = match op {
        OP_READ | OP_WRITE if len > chan.data_capacity() || len > cfg.staging_len => libc::EINVAL,
        OP_READ => {
            let e = transfer(cfg.fd, cfg.staging, len, offset, false);
            if e == 0 {
                // SAFETY: both regions hold at least `len` bytes (checked above) and are distinct
                // mappings, so they cannot overlap; the proxy owns the slot while serving it.
                unsafe { chan.copy_in(index, cfg.staging, len) };
            }
            e
        }
        OP_WRITE => {
            // SAFETY: as for reads.
            unsafe { chan.copy_out(index, cfg.staging, len) };
            transfer(cfg.fd, cfg.staging, len, offset, true)
        }
        // SAFETY: fdatasync on the proxy's own fd.
        OP_FLUSH => errno_of(unsafe { libc::fdatasync(cfg.fd) }),
        OP_ZERO | OP_DISCARD => {
            let mode = if op == OP_ZERO {
                libc::FALLOC_FL_ZERO_RANGE
            } else {
                libc::FALLOC_FL_PUNCH_HOLE
            } | libc::FALLOC_FL_KEEP_SIZE;
            // SAFETY: fallocate on the proxy's own fd with integer arguments.
            match errno_of(unsafe { libc::fallocate(cfg.fd, mode, offset as i64, len as i64) }) {
                0 => 0,
                _ => write_zeroes(cfg, offset, len),
            }
        }
        _ => libc::EINVAL,
    } as u32;
    // The modeled link cost comes on top of the host's real work, as in the paper's measurements.
    model_link(
        cfg,
        now_ns(),
        if op == OP_READ || op == OP_WRITE {
            len
        } else {
            0
        },
    );
    errno
}

/// Spins until the modeled link time of this call has passed since `start`.
fn model_link(cfg: &ProxyConfig, start: u64, bytes: usize) {
    if cfg.call_ns == 0 && cfg.ns_per_byte == 0.0 {
        return;
    }
    let until = start + cfg.call_ns + (bytes as f64 * cfg.ns_per_byte) as u64;
    while now_ns() < until {
        std::hint::spin_loop();
    }
}

/// Monotonic clock in ns (clock_gettime is async-signal-safe).
pub fn now_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: writes one timespec through a valid pointer.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

fn errno_of(rc: i32) -> i32 {
    if rc == 0 {
        0
    } else {
        // SAFETY: reading the thread's errno location.
        unsafe { *libc::__errno_location() }
    }
}

/// pread/pwrite the whole of `len` bytes, retrying short transfers and EINTR.
fn transfer(fd: i32, buf: *mut u8, len: usize, offset: u64, write: bool) -> i32 {
    let mut done = 0usize;
    while done < len {
        // SAFETY: buf..buf+len is the staging buffer (len <= staging_len checked by the caller).
        let n = unsafe {
            let p = buf.add(done);
            let at = (offset + done as u64) as i64;
            if write {
                libc::pwrite(fd, p.cast(), len - done, at)
            } else {
                libc::pread(fd, p.cast(), len - done, at)
            }
        };
        if n > 0 {
            done += n as usize;
        } else if n == 0 {
            return libc::EIO;
        } else {
            let e = errno_of(-1);
            if e != libc::EINTR {
                return e;
            }
        }
    }
    0
}

fn write_zeroes(cfg: &ProxyConfig, offset: u64, len: usize) -> i32 {
    // SAFETY: zeroing the proxy's own staging buffer.
    unsafe { std::ptr::write_bytes(cfg.staging, 0, cfg.staging_len) };
    let mut done = 0usize;
    while done < len {
        let n = (len - done).min(cfg.staging_len);
        let e = transfer(cfg.fd, cfg.staging, n, offset + done as u64, true);
        if e != 0 {
            return e;
        }
        done += n;
    }
    0
}
