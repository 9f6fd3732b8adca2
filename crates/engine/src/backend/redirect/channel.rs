//! The shared-memory channel between the caller and the redirect proxy.
//!
//! One anonymous shared mapping, made before the fork so both processes see the same pages:
//!
//! ```text
//! header (one page)      sq_tail, sq_head, cq_seq, proxy_sleeping, caller_waiting, shutdown, sq[N]
//! slot 0 … slot N-1      state, op, offset, len, result, then max_transfer bytes of data
//! ```
//!
//! The caller fills a free slot (copying write data into it), puts its index in the submission
//! ring and publishes `sq_tail` with Release. The proxy takes indices in order, performs the
//! system call, copies read data into the slot, stores the result, and publishes the slot's state
//! with Release and bumps `cq_seq`. Each side sleeps on a futex word only after spinning briefly and
//! announcing that it sleeps, so the other side knows to wake it; every sleep has a timeout.

use std::ptr::NonNull;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::Duration;

pub const HEADER_BYTES: usize = 4096;
/// Bytes of a slot before its data.
pub const SLOT_HEADER: usize = 64;
/// Most submission-ring entries the header page holds.
pub const MAX_SLOTS: usize = (HEADER_BYTES - 64) / 4;

pub const FREE: u32 = 0;
pub const SUBMITTED: u32 = 1;
pub const DONE: u32 = 2;

pub const OP_READ: u32 = 1;
pub const OP_WRITE: u32 = 2;
pub const OP_FLUSH: u32 = 3;
pub const OP_ZERO: u32 = 4;
pub const OP_DISCARD: u32 = 5;

/// The header page's layout.
#[repr(C)]
pub struct Header {
    pub sq_tail: AtomicU32,
    pub sq_head: AtomicU32,
    pub cq_seq: AtomicU32,
    pub proxy_sleeping: AtomicU32,
    pub caller_waiting: AtomicU32,
    pub shutdown: AtomicU32,
    _pad: [u32; 10],
    pub sq: [AtomicU32; MAX_SLOTS],
}

/// A slot's fixed fields; its data follows at `SLOT_HEADER`.
#[repr(C)]
pub struct SlotHeader {
    pub state: AtomicU32,
    pub op: AtomicU32,
    pub offset: AtomicU64,
    pub len: AtomicU64,
    /// 0, or a positive errno.
    pub result: AtomicU32,
}

const _: () = assert!(std::mem::size_of::<Header>() <= HEADER_BYTES);
const _: () = assert!(std::mem::size_of::<SlotHeader>() <= SLOT_HEADER);

/// The mapping, as seen by either process.
pub struct Channel {
    base: NonNull<u8>,
    len: usize,
    slots: usize,
    slot_bytes: usize,
}

// SAFETY: the mapping is plain shared memory; all cross-process coordination goes through the
// atomics in it, and the caller side is used from one thread at a time (`&mut` on the device).
unsafe impl Send for Channel {}

impl Channel {
    /// Maps a channel of `slots` slots of `data_bytes` each.
    pub fn map(slots: usize, data_bytes: usize) -> std::io::Result<Channel> {
        let slot_bytes = (SLOT_HEADER + data_bytes).next_multiple_of(4096);
        let len = HEADER_BYTES + slots * slot_bytes;
        // SAFETY: an anonymous shared mapping with no address hint; the result is checked.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error());
        }
        let base = NonNull::new(ptr.cast()).ok_or_else(std::io::Error::last_os_error)?;
        Ok(Channel {
            base,
            len,
            slots,
            slot_bytes,
        })
    }

    pub fn slots(&self) -> usize {
        self.slots
    }

    pub fn header(&self) -> &Header {
        // SAFETY: the header page is mapped, zero-initialised (all atomics start at 0) and
        // suitably aligned (page aligned) for the lifetime of `self`.
        unsafe { &*self.base.as_ptr().cast::<Header>() }
    }

    pub fn slot(&self, index: usize) -> &SlotHeader {
        debug_assert!(index < self.slots);
        // SAFETY: index < slots, so the slot header lies inside the mapping, page aligned.
        unsafe {
            &*self
                .base
                .as_ptr()
                .add(HEADER_BYTES + index * self.slot_bytes)
                .cast::<SlotHeader>()
        }
    }

    /// The data area of slot `index`.
    pub fn data_ptr(&self, index: usize) -> *mut u8 {
        debug_assert!(index < self.slots);
        // SAFETY: inside the mapping, as for `slot`.
        unsafe {
            self.base
                .as_ptr()
                .add(HEADER_BYTES + index * self.slot_bytes + SLOT_HEADER)
        }
    }

    /// Bytes of data one slot holds.
    pub fn data_capacity(&self) -> usize {
        self.slot_bytes - SLOT_HEADER
    }
}

impl Drop for Channel {
    fn drop(&mut self) {
        // SAFETY: unmapping our own mapping; the proxy has its own mapping of the same pages.
        unsafe {
            libc::munmap(self.base.as_ptr().cast(), self.len);
        }
    }
}

/// Sleeps while `word` equals `expected`, at most `timeout`. Async-signal-safe (a raw syscall).
pub fn futex_wait(word: &AtomicU32, expected: u32, timeout: Duration) {
    let ts = libc::timespec {
        tv_sec: timeout.as_secs() as libc::time_t,
        tv_nsec: timeout.subsec_nanos() as libc::c_long,
    };
    // SAFETY: FUTEX_WAIT reads the u32 behind the pointer (valid shared memory) and the timespec.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAIT,
            expected,
            &ts as *const libc::timespec,
        );
    }
}

/// Wakes every waiter on `word`. Async-signal-safe.
pub fn futex_wake(word: &AtomicU32) {
    // SAFETY: FUTEX_WAKE only uses the address as a key.
    unsafe {
        libc::syscall(libc::SYS_futex, word.as_ptr(), libc::FUTEX_WAKE, i32::MAX);
    }
}

/// Spins up to `spins` checks for `ready`, then returns whether it became true.
pub fn spin_until(mut ready: impl FnMut() -> bool, spins: u32) -> bool {
    for _ in 0..spins {
        if ready() {
            return true;
        }
        std::hint::spin_loop();
    }
    ready()
}

/// Loads with Acquire (a shorthand used on both sides).
pub fn acquire(word: &AtomicU32) -> u32 {
    word.load(Ordering::Acquire)
}
