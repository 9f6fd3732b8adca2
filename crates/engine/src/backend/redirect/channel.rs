//! The shared-memory channel between the caller and the redirect proxy, and the protocol both
//! sides follow on it.
//!
//! One anonymous shared mapping, made before the fork so both processes see the same pages:
//!
//! ```text
//! header (one page)      sq_tail, sq_head, cq_seq, proxy_sleeping, caller_waiting, sq[N]
//! slot 0 … slot N-1      state, op, offset, len, result, then max_transfer bytes of data
//! ```
//!
//! The caller fills a free slot (copying write data into it), puts its index in the submission
//! ring and publishes `sq_tail` with Release ([`Channel::submit`]). The proxy takes indices in
//! order, performs the command, copies read data into the slot, stores the result, publishes the
//! slot's state with Release and bumps `cq_seq` ([`Channel::serve`]); the caller collects the slot
//! after an Acquire load of its state ([`Channel::take_done`]).
//!
//! Ring positions count modulo `2 * N` (a multiple of N, so `position % N` never jumps, and up
//! to N unread entries are told apart from none). Shutdown sets the top bit of `sq_tail`, so it
//! changes the word the proxy sleeps on and cannot be missed.
//!
//! Each side sleeps on a futex word only after spinning briefly and announcing that it sleeps;
//! announcement and re-check on one side, publication and check for a sleeper on the other, are
//! separated by `fence(SeqCst)`, so at least one side sees the other (the store-buffering shape:
//! with SeqCst fences C11 forbids both loads missing). Every sleep has a timeout, but no wake-up
//! depends on it: `tests/loom_redirect.rs` model-checks these functions with the futex modeled
//! without timeouts, where a lost wake-up is a deadlock.

use crate::sync::atomic::{fence, AtomicU32, AtomicU64, Ordering};
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

/// Set in `sq_tail` by [`Channel::shutdown`]; positions stay below `2 * MAX_SLOTS`.
const SHUTDOWN: u32 = 1 << 31;

/// Checks of a word before a side announces that it sleeps. Under loom a spin is a yield, and a
/// short one is enough to cover the path where the other side answers while we spin.
const SPINS: u32 = if cfg!(loom) { 1 } else { 20_000 };

/// The header page's layout.
#[repr(C)]
struct Header {
    /// Ring position after the last published entry, plus [`SHUTDOWN`] once asked to stop.
    sq_tail: AtomicU32,
    /// Ring position of the next entry the proxy takes (written by the proxy only).
    sq_head: AtomicU32,
    /// Completions so far (wrapping); the word a waiting caller sleeps on.
    cq_seq: AtomicU32,
    proxy_sleeping: AtomicU32,
    caller_waiting: AtomicU32,
    #[cfg(not(loom))]
    _pad: [u32; 11],
    #[cfg(not(loom))]
    sq: [AtomicU32; MAX_SLOTS],
    #[cfg(loom)]
    sq: Box<[AtomicU32]>,
    /// The kernel keys futexes by address; the model needs one wait queue per futex word.
    #[cfg(loom)]
    bells: [model_futex::Bell; 2],
}

/// A slot's fixed fields; its data follows at `SLOT_HEADER`.
#[repr(C)]
struct SlotHeader {
    state: AtomicU32,
    op: AtomicU32,
    offset: AtomicU64,
    len: AtomicU64,
    /// 0, or a positive errno.
    result: AtomicU32,
}

#[cfg(not(loom))]
const _: () = assert!(std::mem::size_of::<Header>() <= HEADER_BYTES);
#[cfg(not(loom))]
const _: () = assert!(std::mem::size_of::<SlotHeader>() <= SLOT_HEADER);

/// A futex word of the header.
#[derive(Clone, Copy)]
enum Word {
    SqTail = 0,
    CqSeq = 1,
}

impl Header {
    fn word(&self, word: Word) -> &AtomicU32 {
        match word {
            Word::SqTail => &self.sq_tail,
            Word::CqSeq => &self.cq_seq,
        }
    }
}

/// The command a slot carries, as the proxy reads it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Command {
    pub op: u32,
    pub offset: u64,
    pub len: u64,
}

/// The mapping, as seen by either process.
#[cfg(not(loom))]
pub struct Channel {
    base: std::ptr::NonNull<u8>,
    len: usize,
    slots: usize,
    slot_bytes: usize,
}

/// The model's channel: the same protocol on loom objects in one process's heap.
#[cfg(loom)]
pub struct Channel {
    header: Header,
    slot_headers: Box<[SlotHeader]>,
    data: Box<[crate::sync::UnsafeCell<Box<[u8]>>]>,
    slots: usize,
    data_bytes: usize,
}

// SAFETY: the mapping is plain shared memory; all cross-process coordination goes through the
// atomics in it, and the caller side is used from one thread at a time (`&mut` on the device).
unsafe impl Send for Channel {}

// SAFETY: shared references reach the channel only through atomics and the unsafe `copy_in` /
// `copy_out`, whose callers own the slot by the protocol; a second thread (the loom model, the
// unit test) is then no different from the second process.
unsafe impl Sync for Channel {}

#[cfg(not(loom))]
impl Channel {
    /// Maps a channel of `slots` slots (at most [`MAX_SLOTS`]) of `data_bytes` each.
    pub fn map(slots: usize, data_bytes: usize) -> std::io::Result<Channel> {
        if slots == 0 || slots > MAX_SLOTS {
            return Err(std::io::Error::from_raw_os_error(libc::EINVAL));
        }
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
        let base = std::ptr::NonNull::new(ptr.cast()).ok_or_else(std::io::Error::last_os_error)?;
        Ok(Channel {
            base,
            len,
            slots,
            slot_bytes,
        })
    }

    fn header(&self) -> &Header {
        // SAFETY: the header page is mapped, zero-initialised (all atomics start at 0) and
        // suitably aligned (page aligned) for the lifetime of `self`.
        unsafe { &*self.base.as_ptr().cast::<Header>() }
    }

    fn slot(&self, index: usize) -> &SlotHeader {
        assert!(index < self.slots);
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
    fn data_ptr(&self, index: usize) -> *mut u8 {
        assert!(index < self.slots);
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

    /// Copies `len` bytes from `src` into slot `index`'s data.
    ///
    /// # Safety
    /// `src` is readable for `len <= data_capacity()` bytes and does not overlap the channel,
    /// and this side owns the slot: the caller between taking it free and submitting it, the
    /// proxy while serving it.
    pub unsafe fn copy_in(&self, index: usize, src: *const u8, len: usize) {
        debug_assert!(len <= self.data_capacity());
        // SAFETY: the caller's contract; the slot's data area holds data_capacity() bytes.
        unsafe { std::ptr::copy_nonoverlapping(src, self.data_ptr(index), len) }
    }

    /// Copies `len` bytes of slot `index`'s data to `dst`.
    ///
    /// # Safety
    /// As for [`Channel::copy_in`], with `dst` writable for `len` bytes.
    pub unsafe fn copy_out(&self, index: usize, dst: *mut u8, len: usize) {
        debug_assert!(len <= self.data_capacity());
        // SAFETY: as for `copy_in`.
        unsafe { std::ptr::copy_nonoverlapping(self.data_ptr(index), dst, len) }
    }

    fn futex_wait(&self, word: Word, expected: u32, timeout: Duration) {
        futex_wait(self.header().word(word), expected, timeout);
    }

    fn futex_wake(&self, word: Word) {
        futex_wake(self.header().word(word));
    }
}

#[cfg(not(loom))]
impl Drop for Channel {
    fn drop(&mut self) {
        // SAFETY: unmapping our own mapping; the proxy has its own mapping of the same pages.
        unsafe {
            libc::munmap(self.base.as_ptr().cast(), self.len);
        }
    }
}

#[cfg(loom)]
impl Channel {
    /// A channel of `slots` slots of `data_bytes` each, on loom's objects.
    pub fn map(slots: usize, data_bytes: usize) -> std::io::Result<Channel> {
        if slots == 0 || slots > MAX_SLOTS {
            return Err(std::io::Error::from_raw_os_error(libc::EINVAL));
        }
        let zero = || AtomicU32::new(0);
        Ok(Channel {
            header: Header {
                sq_tail: zero(),
                sq_head: zero(),
                cq_seq: zero(),
                proxy_sleeping: zero(),
                caller_waiting: zero(),
                sq: (0..slots).map(|_| zero()).collect(),
                bells: [model_futex::Bell::new(), model_futex::Bell::new()],
            },
            slot_headers: (0..slots)
                .map(|_| SlotHeader {
                    state: zero(),
                    op: zero(),
                    offset: AtomicU64::new(0),
                    len: AtomicU64::new(0),
                    result: zero(),
                })
                .collect(),
            data: (0..slots)
                .map(|_| crate::sync::UnsafeCell::new(vec![0u8; data_bytes].into_boxed_slice()))
                .collect(),
            slots,
            data_bytes,
        })
    }

    fn header(&self) -> &Header {
        &self.header
    }

    fn slot(&self, index: usize) -> &SlotHeader {
        &self.slot_headers[index]
    }

    pub fn data_capacity(&self) -> usize {
        self.data_bytes
    }

    /// See the normal build's `copy_in`; loom checks that the protocol ordered this access.
    ///
    /// # Safety
    /// As there.
    pub unsafe fn copy_in(&self, index: usize, src: *const u8, len: usize) {
        self.data[index].with_mut(|d| {
            // SAFETY: the caller's contract; loom panics on an unordered concurrent access.
            unsafe { std::ptr::copy_nonoverlapping(src, (*d).as_mut_ptr(), len) }
        })
    }

    /// See [`Channel::copy_in`].
    ///
    /// # Safety
    /// As there.
    pub unsafe fn copy_out(&self, index: usize, dst: *mut u8, len: usize) {
        self.data[index].with(|d| {
            // SAFETY: as for `copy_in`.
            unsafe { std::ptr::copy_nonoverlapping((*d).as_ptr(), dst, len) }
        })
    }

    fn futex_wait(&self, word: Word, expected: u32, _timeout: Duration) {
        // No timeout in the model: a wake-up that the protocol loses blocks for ever, and loom
        // reports the deadlock.
        self.header.bells[word as usize].wait(self.header.word(word), expected);
    }

    fn futex_wake(&self, word: Word) {
        self.header.bells[word as usize].wake();
    }
}

impl Channel {
    pub fn slots(&self) -> usize {
        self.slots
    }

    /// Ring positions run through `0..2 * slots`.
    fn next_position(&self, position: u32) -> u32 {
        (position + 1) % (2 * self.slots as u32)
    }

    fn ring_index(&self, position: u32) -> usize {
        (position % self.slots as u32) as usize
    }

    // ---- the caller's side -------------------------------------------------------------------

    /// Hands slot `index` (free, its write data already copied in) to the proxy with `cmd`.
    /// The proxy is woken by [`Channel::wake_proxy`] once the batch is complete.
    pub fn submit(&self, index: u32, cmd: Command) {
        let s = self.slot(index as usize);
        s.op.store(cmd.op, Ordering::Relaxed);
        s.offset.store(cmd.offset, Ordering::Relaxed);
        s.len.store(cmd.len, Ordering::Relaxed);
        s.result.store(0, Ordering::Relaxed);
        s.state.store(SUBMITTED, Ordering::Relaxed);
        let h = self.header();
        let tail = h.sq_tail.load(Ordering::Relaxed);
        h.sq[self.ring_index(tail)].store(index, Ordering::Relaxed);
        // Release: the slot's fields, its data and the ring entry before the new tail.
        h.sq_tail.store(self.next_position(tail), Ordering::Release);
    }

    /// Wakes the proxy if it announced that it sleeps; after one or more [`Channel::submit`]s.
    pub fn wake_proxy(&self) {
        let h = self.header();
        // Pairs with the fence in `proxy_sleep`: either it sees the new tail, or we see its flag.
        fence(Ordering::SeqCst);
        if h.proxy_sleeping.load(Ordering::Relaxed) != 0 {
            self.futex_wake(Word::SqTail);
        }
    }

    /// The result of slot `index` (0 or a positive errno) once the proxy is done with it; the
    /// slot is free again from then on, its read data readable until it is submitted again.
    pub fn take_done(&self, index: usize) -> Option<u32> {
        let s = self.slot(index);
        // Acquire: the proxy's result and read data, written before it stored DONE.
        if s.state.load(Ordering::Acquire) != DONE {
            return None;
        }
        let errno = s.result.load(Ordering::Relaxed);
        s.state.store(FREE, Ordering::Relaxed);
        Some(errno)
    }

    /// The completion count, read *before* looking for finished slots: a slot finished after
    /// this read moves the count past it, so [`Channel::wait_completion`] cannot sleep through it.
    pub fn completions(&self) -> u32 {
        // Acquire: a count that includes a completion makes that slot's DONE visible.
        self.header().cq_seq.load(Ordering::Acquire)
    }

    /// Waits until the completion count differs from `seen` (spinning, then sleeping at most
    /// `timeout`); returns whether it did.
    pub fn wait_completion(&self, seen: u32, timeout: Duration) -> bool {
        let h = self.header();
        if spin_until(|| h.cq_seq.load(Ordering::Acquire) != seen, SPINS) {
            return true;
        }
        h.caller_waiting.store(1, Ordering::Relaxed);
        // Pairs with the fence in `serve` after each completion.
        fence(Ordering::SeqCst);
        if h.cq_seq.load(Ordering::Relaxed) == seen {
            self.futex_wait(Word::CqSeq, seen, timeout);
        }
        h.caller_waiting.store(0, Ordering::Relaxed);
        h.cq_seq.load(Ordering::Acquire) != seen
    }

    /// Tells the proxy to exit once it has served what was submitted.
    pub fn shutdown(&self) {
        let h = self.header();
        h.sq_tail.fetch_or(SHUTDOWN, Ordering::Release);
        // The proxy sleeps only while `sq_tail` holds the value it saw, which this just changed.
        self.futex_wake(Word::SqTail);
    }

    // ---- the proxy's side ----------------------------------------------------------------------

    /// Serves submissions in order with `perform(slot, command) -> errno` until
    /// [`Channel::shutdown`] (after serving everything submitted before it) or until
    /// `parent_alive`, asked after each sleep of at most `slice`, says no.
    /// Async-signal-safe if the two closures are: no allocation, no lock.
    pub fn serve(
        &self,
        slice: Duration,
        mut perform: impl FnMut(usize, Command) -> u32,
        mut parent_alive: impl FnMut() -> bool,
    ) {
        let h = self.header();
        let mut head = h.sq_head.load(Ordering::Relaxed);
        loop {
            // Acquire: the ring entry, the slot's fields and data, published before the tail.
            let tail = h.sq_tail.load(Ordering::Acquire);
            if tail & !SHUTDOWN == head {
                if tail & SHUTDOWN != 0 {
                    return;
                }
                if !self.proxy_sleep(head, slice) && !parent_alive() {
                    return;
                }
                continue;
            }
            let index = h.sq[self.ring_index(head)].load(Ordering::Relaxed);
            if (index as usize) < self.slots {
                let slot = self.slot(index as usize);
                let cmd = Command {
                    op: slot.op.load(Ordering::Relaxed),
                    offset: slot.offset.load(Ordering::Relaxed),
                    len: slot.len.load(Ordering::Relaxed),
                };
                let errno = perform(index as usize, cmd);
                slot.result.store(errno, Ordering::Relaxed);
                // Release: the result and the read data before the caller may take the slot.
                slot.state.store(DONE, Ordering::Release);
            }
            head = self.next_position(head);
            h.sq_head.store(head, Ordering::Release);
            h.cq_seq.fetch_add(1, Ordering::Release);
            // Pairs with the fence in `wait_completion`.
            fence(Ordering::SeqCst);
            if h.caller_waiting.load(Ordering::Relaxed) != 0 {
                self.futex_wake(Word::CqSeq);
            }
        }
    }

    /// Waits for the tail to leave `head` (or for shutdown); returns whether it did before
    /// sleeping ran out.
    fn proxy_sleep(&self, head: u32, slice: Duration) -> bool {
        let h = self.header();
        if spin_until(|| h.sq_tail.load(Ordering::Relaxed) != head, SPINS) {
            return true;
        }
        h.proxy_sleeping.store(1, Ordering::Relaxed);
        // Pairs with the fence in `wake_proxy`.
        fence(Ordering::SeqCst);
        if h.sq_tail.load(Ordering::Relaxed) == head {
            self.futex_wait(Word::SqTail, head, slice);
        }
        h.proxy_sleeping.store(0, Ordering::Relaxed);
        h.sq_tail.load(Ordering::Relaxed) != head
    }
}

/// Sleeps while `word` equals `expected`, at most `timeout`. Async-signal-safe (a raw syscall).
#[cfg(not(loom))]
fn futex_wait(word: &AtomicU32, expected: u32, timeout: Duration) {
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
#[cfg(not(loom))]
fn futex_wake(word: &AtomicU32) {
    // SAFETY: FUTEX_WAKE only uses the address as a key.
    unsafe {
        libc::syscall(libc::SYS_futex, word.as_ptr(), libc::FUTEX_WAKE, i32::MAX);
    }
}

/// The kernel's futex as the model sees it: the value check and the queueing happen under one
/// lock that the waker also takes, so a waker that changed the word before waking either is seen
/// by the check or finds the waiter queued.
#[cfg(loom)]
mod model_futex {
    use crate::sync::atomic::{AtomicU32, Ordering};
    use crate::sync::{Condvar, Mutex};

    pub struct Bell {
        lock: Mutex<()>,
        queue: Condvar,
    }

    impl Bell {
        pub fn new() -> Bell {
            Bell {
                lock: Mutex::new(()),
                queue: Condvar::new(),
            }
        }

        pub fn wait(&self, word: &AtomicU32, expected: u32) {
            let guard = self.lock.lock().unwrap_or_else(|p| p.into_inner());
            // The kernel reads the word after a full barrier; SeqCst stands in for it.
            if word.load(Ordering::SeqCst) == expected {
                drop(self.queue.wait(guard));
            }
        }

        pub fn wake(&self) {
            let _guard = self.lock.lock().unwrap_or_else(|p| p.into_inner());
            self.queue.notify_all();
        }
    }
}

/// Spins up to `spins` checks for `ready`, then returns whether it became true.
fn spin_until(mut ready: impl FnMut() -> bool, spins: u32) -> bool {
    for _ in 0..spins {
        if ready() {
            return true;
        }
        crate::sync::hint::spin_loop();
    }
    ready()
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn ring_positions_wrap_without_reusing_an_unread_entry() {
        // 3 slots: positions 0..6, indices continue 0,1,2,0,1,2 across the wrap, and a ring
        // holding all 3 entries unread (tail 3 ahead of head) is not mistaken for an empty one.
        let chan = Channel::map(3, 4096).expect("map");
        let mut p = 0;
        let mut indices = Vec::new();
        for _ in 0..12 {
            indices.push(chan.ring_index(p));
            p = chan.next_position(p);
        }
        assert_eq!(indices, [0, 1, 2, 0, 1, 2, 0, 1, 2, 0, 1, 2]);
        for head in 0..6 {
            let mut tail = head;
            for _ in 0..3 {
                tail = chan.next_position(tail);
                assert_ne!(tail, head);
            }
        }
    }

    #[test]
    fn a_proxy_thread_serves_in_order_and_stops_at_shutdown() {
        let chan = Channel::map(2, 4096).expect("map");
        let served = std::thread::scope(|s| {
            let proxy = s.spawn(|| {
                let mut seen = Vec::new();
                chan.serve(
                    Duration::from_millis(100),
                    |slot, cmd| {
                        seen.push((slot, cmd.offset));
                        cmd.op
                    },
                    || true,
                );
                seen
            });
            let mut free = vec![1u32, 0];
            let mut results = Vec::new();
            for n in 0..100u64 {
                let slot = loop {
                    if let Some(slot) = free.pop() {
                        break slot;
                    }
                    let seen = chan.completions();
                    for index in 0..2 {
                        if let Some(errno) = chan.take_done(index) {
                            results.push(errno);
                            free.push(index as u32);
                        }
                    }
                    if free.is_empty() {
                        chan.wait_completion(seen, Duration::from_millis(100));
                    }
                };
                chan.submit(
                    slot,
                    Command {
                        op: n as u32 % 5,
                        offset: n,
                        len: 0,
                    },
                );
                chan.wake_proxy();
            }
            chan.shutdown();
            let seen = proxy.join().expect("proxy thread");
            for index in 0..2 {
                results.extend(chan.take_done(index));
            }
            assert_eq!(results.len(), 100);
            seen
        });
        let offsets: Vec<u64> = served.iter().map(|&(_, off)| off).collect();
        assert_eq!(offsets, (0..100).collect::<Vec<_>>());
    }
}
