//! DMA-capable data buffers: [`IoBuf`] and the [`BufferPool`] that hands them out.
//!
//! The pool is the paper's DMA buffer allocator: one arena reserved up front (see [`arena`]),
//! carved by a buddy system (see [`buddy`]) into aligned buffers of any size up to the arena,
//! thread-safe and bounded — when the arena is used up, allocation fails (or waits) instead of
//! growing. Backends that can register memory with the kernel (io_uring) register the whole arena
//! once and recognise its buffers by [`IoBuf::pool_slot`].
//!
//! An [`IoBuf`] can also borrow memory someone else owns ([`IoBuf::borrowed`]): a virtual
//! machine's RAM shared with a vhost-user backend, so a guest's request reads or writes its own
//! pages with no copy. Such a buffer is not in any pool: io_uring passes its address to the kernel
//! as an ordinary (unregistered) read or write, the system-call and memory backends use it like a
//! heap buffer, and the NVMe driver, which can only reach DMA-mapped memory, bounces it through a
//! pool buffer (the copy happens there, counted as `bounced`). A caller that wants no copy
//! anywhere checks [`IoBuf::is_borrowed`] on the completion's buffer and the device's
//! `Geometry::buffer_alignment` before choosing it.

pub mod arena;
pub mod buddy;

use crate::error::Errno;
use arena::{Arena, Backing};
use buddy::Buddy;
use std::alloc::Layout;
use std::ops::{Deref, DerefMut};
use std::ptr::NonNull;
// The pool's lock, condition variable and counters come from `crate::sync`, so that
// `tests/loom_pool.rs` model-checks waiting for and freeing buffers; process-wide statics stay std.
use crate::sync::atomic::{AtomicU64, Ordering};
use crate::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// Alignment and smallest block of pool buffers: a page, enough for O_DIRECT on any device.
pub const POOL_ALIGN: usize = 4096;
/// Size of the process-wide pool unless `KURA_POOL_MIB` says otherwise.
pub const DEFAULT_POOL_BYTES: usize = 128 << 20;

static GLOBAL: OnceLock<BufferPool> = OnceLock::new();
static REQUESTED_GLOBAL_BYTES: std::sync::atomic::AtomicUsize =
    std::sync::atomic::AtomicUsize::new(0);

/// Why the pool could not provide a buffer.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PoolError {
    #[error("buffer pool exhausted: {requested} bytes requested, {free} of {capacity} bytes free")]
    Exhausted {
        requested: usize,
        free: usize,
        capacity: usize,
    },
    #[error("buffer of {requested} bytes exceeds the pool's {capacity}-byte arena")]
    TooLarge { requested: usize, capacity: usize },
    #[error("cannot reserve the buffer arena: {0}")]
    Map(Errno),
}

static NEXT_POOL_ID: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

struct PoolShared {
    id: u64,
    arena: Arena,
    buddy: Mutex<Buddy>,
    freed: Condvar,
    peak_used: AtomicU64,
}

/// A bounded, thread-safe allocator of aligned buffers from one pre-reserved arena.
#[derive(Clone)]
pub struct BufferPool {
    shared: Arc<PoolShared>,
}

/// A snapshot of a pool's use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PoolStats {
    pub capacity: usize,
    pub free: usize,
    pub peak_used: usize,
    pub hugepages: bool,
}

impl BufferPool {
    /// Reserves an arena of at least `bytes` (rounded up to a power of two of pages), trying
    /// hugepages first.
    pub fn new(bytes: usize) -> Result<Self, PoolError> {
        let pages = bytes
            .max(POOL_ALIGN)
            .div_ceil(POOL_ALIGN)
            .next_power_of_two();
        let capacity = pages * POOL_ALIGN;
        let arena = Arena::map(capacity, true).map_err(PoolError::Map)?;
        let max_order = pages.trailing_zeros() as u8;
        Ok(BufferPool {
            shared: Arc::new(PoolShared {
                id: NEXT_POOL_ID.fetch_add(1, Ordering::Relaxed),
                arena,
                buddy: Mutex::new(Buddy::new(POOL_ALIGN, max_order)),
                freed: Condvar::new(),
                peak_used: AtomicU64::new(0),
            }),
        })
    }

    /// Asks for a process-wide pool of `bytes` instead of the default, for programs that know
    /// how much I/O they keep in flight (io_uring pins the whole arena, so it counts in the
    /// resident set). `KURA_POOL_MIB` still wins. Returns false when the pool already exists.
    pub fn request_global_bytes(bytes: usize) -> bool {
        REQUESTED_GLOBAL_BYTES.store(bytes, std::sync::atomic::Ordering::Relaxed);
        GLOBAL.get().is_none()
    }

    /// The process-wide pool, created on first use with `KURA_POOL_MIB` MiB, else the size
    /// asked for with [`BufferPool::request_global_bytes`], else 128 MiB.
    pub fn global() -> &'static BufferPool {
        GLOBAL.get_or_init(|| {
            let requested = REQUESTED_GLOBAL_BYTES.load(std::sync::atomic::Ordering::Relaxed);
            let fallback = if requested > 0 {
                requested
            } else {
                DEFAULT_POOL_BYTES
            };
            let bytes = std::env::var("KURA_POOL_MIB")
                .ok()
                .and_then(|v| v.parse::<usize>().ok())
                .map_or(fallback, |mib| mib << 20);
            match BufferPool::new(bytes) {
                Ok(pool) => pool,
                // Without any arena nothing in kura can do I/O; this is the one place where the
                // process cannot go on, and it says why.
                Err(e) => panic!("kura: cannot reserve the global buffer pool: {e}"),
            }
        })
    }

    /// Identifies this pool's arena among registrations.
    pub fn id(&self) -> u64 {
        self.shared.id
    }

    /// The arena's base address and length, for registering it with the kernel once.
    pub fn arena(&self) -> (NonNull<u8>, usize) {
        (self.shared.arena.base(), self.shared.arena.len())
    }

    pub fn stats(&self) -> PoolStats {
        let free = self.lock().free_bytes();
        PoolStats {
            capacity: self.shared.arena.len(),
            free,
            peak_used: self.shared.peak_used.load(Ordering::Relaxed) as usize,
            hugepages: self.shared.arena.backing() == Backing::Hugepages,
        }
    }

    fn lock(&self) -> MutexGuard<'_, Buddy> {
        // A panic while holding this lock cannot leave the free lists half-updated in a way
        // that matters more than losing the process, so a poisoned lock is taken over.
        self.shared.buddy.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A buffer of `len` bytes (aligned to [`POOL_ALIGN`]); contents are whatever the memory held.
    /// Fails at once when the arena has no room.
    pub fn alloc(&self, len: usize) -> Result<IoBuf, PoolError> {
        let mut buddy = self.lock();
        self.try_alloc(&mut buddy, len)
    }

    /// Like [`BufferPool::alloc`] but with every byte zeroed.
    pub fn alloc_zeroed(&self, len: usize) -> Result<IoBuf, PoolError> {
        let mut buf = self.alloc(len)?;
        buf.fill(0);
        Ok(buf)
    }

    /// Waits up to `timeout` for room, for callers that prefer back-pressure to failure.
    pub fn alloc_wait(&self, len: usize, timeout: Duration) -> Result<IoBuf, PoolError> {
        let deadline = Instant::now() + timeout;
        let mut buddy = self.lock();
        loop {
            match self.try_alloc(&mut buddy, len) {
                Err(PoolError::Exhausted { .. }) if Instant::now() < deadline => {
                    let left = deadline.saturating_duration_since(Instant::now());
                    buddy = match self.shared.freed.wait_timeout(buddy, left) {
                        Ok((guard, _)) => guard,
                        Err(p) => p.into_inner().0,
                    };
                }
                other => return other,
            }
        }
    }

    fn try_alloc(&self, buddy: &mut Buddy, len: usize) -> Result<IoBuf, PoolError> {
        let capacity = buddy.capacity();
        let order = buddy.order_for(len).ok_or(PoolError::TooLarge {
            requested: len,
            capacity,
        })?;
        let offset = buddy.alloc(order).ok_or(PoolError::Exhausted {
            requested: len,
            free: buddy.free_bytes(),
            capacity,
        })?;
        let used = (capacity - buddy.free_bytes()) as u64;
        self.shared.peak_used.fetch_max(used, Ordering::Relaxed);
        // SAFETY: the buddy system returned a block inside the arena, so base+offset stays in
        // the same allocation and is non-null.
        let ptr = unsafe { NonNull::new_unchecked(self.shared.arena.base().as_ptr().add(offset)) };
        Ok(IoBuf {
            ptr,
            len,
            cap: buddy.block_size(order),
            owner: Owner::Pool {
                shared: Arc::clone(&self.shared),
                offset,
                order,
            },
        })
    }
}

impl std::fmt::Debug for BufferPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BufferPool")
            .field("id", &self.shared.id)
            .field("stats", &self.stats())
            .finish()
    }
}

enum Owner {
    Pool {
        shared: Arc<PoolShared>,
        offset: usize,
        order: u8,
    },
    Heap(Layout),
    HeapOffset {
        layout: Layout,
        offset: usize,
    },
    /// Memory owned elsewhere; the handle keeps it valid until the buffer is dropped.
    Borrowed(#[allow(dead_code)] std::sync::Arc<dyn std::any::Any + Send + Sync>),
}

/// An aligned data buffer owned by exactly one holder: the caller, or the device while a request
/// carrying it is in flight. Dereferences to its first `len()` bytes.
pub struct IoBuf {
    ptr: NonNull<u8>,
    len: usize,
    cap: usize,
    owner: Owner,
}

// SAFETY: an IoBuf is the sole owner of its bytes (pool blocks are disjoint, heap blocks are its
// own allocation, borrowed memory is this buffer's alone by `IoBuf::borrowed`'s contract and its
// keeper is Send + Sync), so sending it to another thread moves that ownership.
unsafe impl Send for IoBuf {}
// SAFETY: shared references only allow reading the bytes.
unsafe impl Sync for IoBuf {}

impl IoBuf {
    /// A zeroed buffer from the global pool, or from the heap when the pool has no room.
    /// For simple callers; hot paths allocate from a pool explicitly.
    pub fn zeroed(len: usize) -> IoBuf {
        BufferPool::global()
            .alloc_zeroed(len)
            .unwrap_or_else(|_| IoBuf::heap(len, POOL_ALIGN))
    }

    /// A zeroed buffer from the heap with the given alignment (a power of two).
    pub fn heap(len: usize, align: usize) -> IoBuf {
        let cap = len.max(1);
        let layout = match Layout::from_size_align(cap, align.max(1)) {
            Ok(layout) => layout,
            Err(_) => panic!("IoBuf::heap: alignment {align} is not a power of two"),
        };
        // SAFETY: the layout has non-zero size.
        let raw = unsafe { std::alloc::alloc_zeroed(layout) };
        let ptr = NonNull::new(raw).unwrap_or_else(|| std::alloc::handle_alloc_error(layout));
        IoBuf {
            ptr,
            len,
            cap,
            owner: Owner::Heap(layout),
        }
    }

    /// A zeroed heap buffer whose data starts `offset` bytes past a page boundary, for exercising
    /// alignment checks (O_DIRECT refuses such buffers).
    pub fn heap_offset(len: usize, offset: usize) -> IoBuf {
        let layout = match Layout::from_size_align(len + offset + 1, POOL_ALIGN) {
            Ok(layout) => layout,
            Err(_) => panic!("IoBuf::heap_offset: {len} + {offset} bytes overflow"),
        };
        // SAFETY: the layout has non-zero size.
        let raw = unsafe { std::alloc::alloc_zeroed(layout) };
        let base = NonNull::new(raw).unwrap_or_else(|| std::alloc::handle_alloc_error(layout));
        // SAFETY: offset < layout size, so the pointer stays inside the allocation.
        let ptr = unsafe { NonNull::new_unchecked(base.as_ptr().add(offset)) };
        IoBuf {
            ptr,
            len,
            cap: len,
            owner: Owner::HeapOffset { layout, offset },
        }
    }

    /// A buffer holding a copy of `data`.
    pub fn from_slice(data: &[u8]) -> IoBuf {
        let mut buf = IoBuf::zeroed(data.len());
        buf.copy_from_slice(data);
        buf
    }

    /// A buffer over `len` bytes at `ptr` that the buffer does not own: `keep` is held until the
    /// buffer is dropped (after the request carrying it completes, or later if a layer keeps the
    /// buffer), so whatever keeps the memory mapped lives at least that long. Nothing is freed
    /// on drop except `keep`. The capacity is `len`. Backends take it like any buffer (see the
    /// module docs for which copy it anyway).
    ///
    /// # Safety
    ///
    /// For as long as `keep` (the clone this buffer holds) is alive:
    /// - `ptr..ptr + len` must be mapped, readable and writable memory of this process, and
    ///   stay so (dropping `keep` must be the only thing that can allow unmapping it);
    /// - nothing else in this process may create references to those bytes or write them, and
    ///   no other `IoBuf` may cover them, since the buffer hands out `&mut [u8]`.
    ///
    /// Another process writing the memory meanwhile (a guest changing a page under its own
    /// in-flight write, as it could under a DMA device), or this process copying into or out of
    /// it with volatile accesses that make no references (vm-memory's copies of guest memory),
    /// does not make the memory invalid; the bytes a device then reads or writes are
    /// unspecified, as on real hardware, and the engine's backends only pass such a buffer to
    /// the kernel or copy it once.
    pub unsafe fn borrowed(
        ptr: NonNull<u8>,
        len: usize,
        keep: std::sync::Arc<dyn std::any::Any + Send + Sync>,
    ) -> IoBuf {
        IoBuf {
            ptr,
            len,
            cap: len,
            owner: Owner::Borrowed(keep),
        }
    }

    /// True for a buffer made by [`IoBuf::borrowed`]: its bytes are someone else's memory.
    pub fn is_borrowed(&self) -> bool {
        matches!(self.owner, Owner::Borrowed(_))
    }

    /// Usable length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Bytes the buffer can grow to with [`IoBuf::set_len`].
    pub fn capacity(&self) -> usize {
        self.cap
    }

    /// Changes the usable length within the capacity; returns false (and changes nothing) beyond it.
    pub fn set_len(&mut self, len: usize) -> bool {
        if len <= self.cap {
            self.len = len;
            true
        } else {
            false
        }
    }

    pub fn as_ptr(&self) -> *const u8 {
        self.ptr.as_ptr()
    }

    pub fn as_mut_ptr(&mut self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    /// For pool buffers: the pool's id and the buffer's offset in its arena.
    pub fn pool_slot(&self) -> Option<(u64, usize)> {
        match &self.owner {
            Owner::Pool { shared, offset, .. } => Some((shared.id, *offset)),
            Owner::Heap(_) | Owner::HeapOffset { .. } | Owner::Borrowed(_) => None,
        }
    }
}

impl Deref for IoBuf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // SAFETY: ptr..ptr+len lies in memory this buffer owns (len <= cap), initialised at
        // mapping or allocation time, and u8 has no invalid bit patterns.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl DerefMut for IoBuf {
    fn deref_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in `deref`, and `&mut self` guarantees exclusive access.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

/// A copy of the bytes in a buffer of its own, on the heap (never a pool slot or borrowed
/// memory): for holders that share a buffer and copy it only when one of them changes it
/// (`Arc::make_mut`).
impl Clone for IoBuf {
    fn clone(&self) -> IoBuf {
        IoBuf::from_slice(self)
    }
}

impl std::fmt::Debug for IoBuf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IoBuf")
            .field("len", &self.len)
            .field("cap", &self.cap)
            .field("pool_slot", &self.pool_slot())
            .finish()
    }
}

impl Drop for IoBuf {
    fn drop(&mut self) {
        match &self.owner {
            Owner::Pool {
                shared,
                offset,
                order,
            } => {
                let mut buddy = shared.buddy.lock().unwrap_or_else(|p| p.into_inner());
                buddy.free(*offset, *order);
                drop(buddy);
                shared.freed.notify_all();
            }
            Owner::Heap(layout) => {
                // SAFETY: allocated in `IoBuf::heap` with exactly this layout.
                unsafe { std::alloc::dealloc(self.ptr.as_ptr(), *layout) }
            }
            Owner::HeapOffset { layout, offset } => {
                // SAFETY: allocated in `IoBuf::heap_offset` with this layout at ptr - offset.
                unsafe { std::alloc::dealloc(self.ptr.as_ptr().sub(*offset), *layout) }
            }
            // The owner's memory stays; dropping the handle is all this buffer does.
            Owner::Borrowed(_) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buffers_are_aligned_disjoint_and_bounded() {
        let pool = BufferPool::new(1 << 20).unwrap();
        let a = pool.alloc(4096).unwrap();
        let b = pool.alloc(100_000).unwrap();
        assert_eq!(a.as_ptr() as usize % POOL_ALIGN, 0);
        assert_eq!(b.as_ptr() as usize % POOL_ALIGN, 0);
        assert_ne!(a.as_ptr(), b.as_ptr());
        assert!(matches!(
            pool.alloc(1 << 20),
            Err(PoolError::Exhausted { .. })
        ));
        assert!(matches!(
            pool.alloc(2 << 20),
            Err(PoolError::TooLarge { .. })
        ));
        drop((a, b));
        assert_eq!(pool.stats().free, 1 << 20);
        assert!(pool.alloc(1 << 20).is_ok(), "all memory merged back");
    }

    #[test]
    fn sizes_above_two_mib_work() {
        let pool = BufferPool::new(16 << 20).unwrap();
        let mut big = pool.alloc_zeroed(5 << 20).unwrap();
        big[(5 << 20) - 1] = 7;
        assert!(big[..(5 << 20) - 1].iter().all(|&b| b == 0));
    }

    #[test]
    fn alloc_wait_returns_when_another_thread_frees() {
        let pool = BufferPool::new(64 << 10).unwrap();
        let held = pool.alloc(64 << 10).unwrap();
        let p2 = pool.clone();
        let t = std::thread::spawn(move || {
            p2.alloc_wait(4096, Duration::from_secs(10))
                .map(|b| b.len())
        });
        std::thread::sleep(Duration::from_millis(50));
        drop(held);
        assert_eq!(t.join().unwrap(), Ok(4096));
        let _all = pool.alloc(64 << 10).unwrap();
        assert!(matches!(
            pool.alloc_wait(4096, Duration::from_millis(20)),
            Err(PoolError::Exhausted { .. })
        ));
    }

    /// Memory owned outside the engine, as a guest's RAM is: page-aligned, freed only when the
    /// last handle goes.
    struct Outside(IoBuf);

    fn outside(len: usize) -> std::sync::Arc<std::sync::Mutex<Outside>> {
        std::sync::Arc::new(std::sync::Mutex::new(Outside(IoBuf::heap(len, POOL_ALIGN))))
    }

    /// A borrowed buffer over `len` bytes at `offset` in `mem`.
    fn borrow(mem: &std::sync::Arc<std::sync::Mutex<Outside>>, offset: usize, len: usize) -> IoBuf {
        let ptr = {
            let mut g = mem.lock().unwrap();
            assert!(offset + len <= g.0.len());
            // SAFETY: in bounds of the heap block checked above.
            unsafe { NonNull::new_unchecked(g.0.as_mut_ptr().add(offset)) }
        };
        // SAFETY: the heap block lives as long as the `Outside` the clone keeps alive; the tests
        // touch its bytes only through this buffer while it exists (or after it is dropped).
        unsafe { IoBuf::borrowed(ptr, len, mem.clone()) }
    }

    #[test]
    fn a_borrowed_buffer_keeps_its_owner_and_frees_nothing() {
        let mem = outside(8192);
        let weak = std::sync::Arc::downgrade(&mem);
        let mut buf = borrow(&mem, 4096, 4096);
        assert!(buf.is_borrowed() && buf.pool_slot().is_none());
        assert_eq!((buf.len(), buf.capacity()), (4096, 4096));
        assert!(!buf.set_len(4097) && buf.set_len(512));
        buf.fill(0xab);
        drop(mem);
        assert!(
            weak.upgrade().is_some(),
            "the buffer keeps the memory alive"
        );
        drop(buf);
        let mem = weak.upgrade();
        assert!(mem.is_none(), "the last handle was the buffer's");
        assert!(!IoBuf::heap(1, 1).is_borrowed());
        assert!(!BufferPool::new(4096)
            .unwrap()
            .alloc(1)
            .unwrap()
            .is_borrowed());
    }

    #[test]
    fn a_borrowed_buffer_sees_its_owners_bytes() {
        let mem = outside(8192);
        mem.lock().unwrap().0[4096..].fill(7);
        let mut buf = borrow(&mem, 4096, 4096);
        assert!(buf.iter().all(|&b| b == 7));
        buf[..4].copy_from_slice(b"kura");
        drop(buf);
        assert_eq!(&mem.lock().unwrap().0[4096..4100], b"kura");
    }

    /// What a device writes into a borrowed buffer lands in the owner's memory, and a write
    /// from it stores the owner's bytes, on every backend kind that stores data.
    #[test]
    fn backends_read_and_write_borrowed_memory() {
        use crate::{BlockingIo, Request};
        let dir = tempfile::tempdir().unwrap();
        let img = |n: &str| dir.path().join(n).display().to_string();
        let specs = [
            "mem:1M".to_string(),
            format!("sync:{}?size=1M", img("s.img")),
            format!("sync:{}?size=1M&direct=1", img("sd.img")),
            format!("uring:{}?size=1M", img("u.img")),
            format!("uring:{}?size=1M&direct=0", img("ub.img")),
            format!("uring:{}?size=1M&max_transfer=8K", img("us.img")),
        ];
        for spec in &specs {
            let mut dev = match crate::open(spec) {
                Ok(dev) => dev,
                Err(e @ crate::OpenError::Unavailable { .. }) => {
                    eprintln!("SKIP {spec}: {e}");
                    continue;
                }
                Err(e) => panic!("{spec}: {e}"),
            };
            let bs = dev.geometry().block_size as usize;
            let src = outside(8 * bs);
            for (i, b) in src.lock().unwrap().0.iter_mut().enumerate() {
                *b = (i % 251) as u8;
            }
            let done = BlockingIo::run(&mut *dev, Request::write(1, 3, 8, borrow(&src, 0, 8 * bs)))
                .unwrap();
            assert!(done.status.is_ok(), "{spec}: {:?}", done.status);
            assert!(done.buf.as_ref().is_some_and(|b| b.is_borrowed()));
            drop(done);
            let dst = outside(8 * bs);
            let done = BlockingIo::run(&mut *dev, Request::read(2, 3, 8, borrow(&dst, 0, 8 * bs)))
                .unwrap();
            assert!(done.status.is_ok(), "{spec}: {:?}", done.status);
            let back = done.buf.unwrap();
            assert_eq!(
                back.as_ptr(),
                dst.lock().unwrap().0.as_ptr(),
                "{spec}: same memory"
            );
            drop(back);
            assert!(
                dst.lock().unwrap().0[..] == src.lock().unwrap().0[..],
                "{spec}: read back what was written"
            );
        }
    }

    #[test]
    fn pool_is_shared_safely_between_threads() {
        let pool = BufferPool::new(4 << 20).unwrap();
        let threads: Vec<_> = (0..4)
            .map(|t| {
                let pool = pool.clone();
                std::thread::spawn(move || {
                    for i in 0..500 {
                        let mut b = pool
                            .alloc_wait(4096 * (1 + (i % 8)), Duration::from_secs(5))
                            .unwrap();
                        b.fill(t as u8);
                        assert!(b.iter().all(|&x| x == t as u8));
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        assert_eq!(pool.stats().free, 4 << 20);
    }
}
