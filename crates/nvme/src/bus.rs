//! What the driver needs from the hardware path: 32-bit register access to BAR0 and IOMMU
//! mappings for DMA memory. [`crate::vfio`] implements it over a real (or QEMU-emulated) PCI
//! function, [`crate::sim`] in-process. I/O addresses equal virtual addresses on both, so a
//! buffer's pointer is its DMA address once the memory behind it is mapped.
//!
//! # Barriers between the driver and the device
//!
//! The device reads and writes the queues in DMA memory and learns of new work through doorbell
//! registers (MMIO). Rust's fences order memory for other *CPUs*: on aarch64 they become
//! `dmb ish`/`dmb ishld`, which cover the inner shareable domain only, while a DMA master may sit
//! in the outer shareable domain and an MMIO write goes to Device memory. So the two places where
//! the driver's order must hold for the device use the barriers Linux uses there:
//!
//! - [`doorbell_barrier`], before a submission-queue tail doorbell: the entries written to DMA
//!   memory must be visible to the device before the doorbell write reaches it. aarch64:
//!   `dsb st` (Linux's `wmb()`; completes every earlier store, to any memory type, before any
//!   later one is issued. Linux's `writel()` makes do with `dmb oshst`; the stronger one is chosen
//!   here because no ARM hardware was at hand to show the lighter one suffices with VFIO).
//!   Elsewhere: `fence(SeqCst)` as before (on x86-64 stores to write-back memory are not
//!   reordered with a later uncached MMIO store anyway; the fence costs one `mfence` a doorbell).
//! - [`dma_rmb`], after reading a completion's phase tag and before reading the rest of it, and
//!   again before the completion-queue head doorbell: aarch64 `dmb oshld` (Linux's `dma_rmb()`;
//!   orders earlier loads before later loads *and stores*, so the entry is read before the head
//!   write lets the device overwrite it). Elsewhere: `fence(Acquire)` (a compiler barrier on
//!   x86-64, whose loads are not reordered with other loads or later stores).
//!
//! Under `--cfg loom` both are loom's fences (release and acquire) and [`DmaMem`] is made of
//! loom atomics, so the queue pair's model check (`qpair_loom`) shows that the orders hold with
//! these fences and fail without them.

use crate::error::NvmeError;
#[cfg(loom)]
use crate::sync::atomic::Ordering;
#[cfg(not(loom))]
use std::ptr::NonNull;
use std::sync::Arc;

/// Orders the driver's earlier writes to DMA memory before a following doorbell (MMIO) write.
#[inline]
pub fn doorbell_barrier() {
    #[cfg(all(target_arch = "aarch64", not(loom)))]
    // SAFETY: `dsb st` only waits for earlier stores to complete; it changes no register or
    // memory. Without `nomem` the compiler also keeps memory accesses on their side of it.
    unsafe {
        std::arch::asm!("dsb st", options(nostack, preserves_flags))
    };
    #[cfg(not(all(target_arch = "aarch64", not(loom))))]
    crate::sync::atomic::fence(crate::sync::atomic::Ordering::SeqCst);
}

/// Orders earlier reads of device-written DMA memory before later reads and writes.
#[inline]
pub fn dma_rmb() {
    #[cfg(all(target_arch = "aarch64", not(loom)))]
    // SAFETY: `dmb oshld` only orders memory accesses; it changes no register or memory. Without
    // `nomem` the compiler also keeps memory accesses on their side of it.
    unsafe {
        std::arch::asm!("dmb oshld", options(nostack, preserves_flags))
    };
    #[cfg(not(all(target_arch = "aarch64", not(loom))))]
    crate::sync::atomic::fence(crate::sync::atomic::Ordering::Acquire);
}

/// Register and DMA access to one controller.
pub trait Bus: Send + Sync {
    /// Reads a 32-bit register at byte offset `off` of BAR0.
    fn read32(&self, off: u32) -> u32;
    /// Writes a 32-bit register.
    fn write32(&self, off: u32, val: u32);
    /// Makes `len` bytes at `addr` reachable by the device at I/O address `addr`.
    fn map_dma(&self, addr: u64, len: usize) -> Result<(), NvmeError>;
    /// Removes a mapping made by [`Bus::map_dma`].
    fn unmap_dma(&self, addr: u64, len: usize);
    /// Where the controller is, for reports (`0000:00:04.0`, `sim`).
    fn describe(&self) -> String;

    /// Reads a 64-bit register as two 32-bit reads, low half first.
    fn read64(&self, off: u32) -> u64 {
        u64::from(self.read32(off)) | (u64::from(self.read32(off + 4)) << 32)
    }

    /// Writes a 64-bit register as two 32-bit writes, low half first.
    fn write64(&self, off: u32, val: u64) {
        self.write32(off, val as u32);
        self.write32(off + 4, (val >> 32) as u32);
    }
}

/// Page-aligned, zeroed memory owned by the driver (queues, PRP lists, identify data), mapped for
/// DMA for as long as it lives.
pub struct DmaMem {
    #[cfg(not(loom))]
    ptr: NonNull<u8>,
    /// The model's memory: little-endian 32-bit words the model's device thread shares.
    #[cfg(loom)]
    words: ModelWords,
    len: usize,
    bus: Arc<dyn Bus>,
}

// SAFETY: the memory is owned by this value alone; the driver synchronises access to the parts
// the device writes with the completion protocol (phase tags) and volatile reads.
unsafe impl Send for DmaMem {}
// SAFETY: see above; shared access only reads.
unsafe impl Sync for DmaMem {}

#[cfg(not(loom))]
impl DmaMem {
    /// Allocates `len` bytes (rounded up to pages) and maps them through `bus`.
    pub fn new(bus: &Arc<dyn Bus>, len: usize) -> Result<DmaMem, NvmeError> {
        let len = len.max(1).div_ceil(crate::regs::PAGE) * crate::regs::PAGE;
        // SAFETY: an anonymous private mapping with no address hint; the result is checked.
        let raw = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_POPULATE,
                -1,
                0,
            )
        };
        if raw == libc::MAP_FAILED {
            return Err(NvmeError::os(format!("mmap of {len} bytes of DMA memory")));
        }
        let ptr = NonNull::new(raw.cast::<u8>())
            .ok_or_else(|| NvmeError::Invalid("mmap returned null".into()))?;
        if let Err(e) = bus.map_dma(ptr.as_ptr() as u64, len) {
            // SAFETY: unmapping the mapping created just above.
            unsafe { libc::munmap(raw, len) };
            return Err(e);
        }
        Ok(DmaMem {
            ptr,
            len,
            bus: Arc::clone(bus),
        })
    }

    /// The I/O address of byte `off`.
    pub fn iova(&self, off: usize) -> u64 {
        self.ptr.as_ptr() as u64 + off as u64
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Copies `data` to byte `off` (bounds-checked).
    pub fn write(&self, off: usize, data: &[u8]) {
        assert!(off + data.len() <= self.len, "DmaMem write out of bounds");
        // SAFETY: the range lies inside this mapping (checked above); the device does not write
        // the regions the driver writes (SQ entries, PRP lists) while they are being filled.
        unsafe {
            std::ptr::copy_nonoverlapping(data.as_ptr(), self.ptr.as_ptr().add(off), data.len());
        }
    }

    /// Copies bytes at `off` out with volatile reads, since the device may have written them.
    pub fn read_volatile<const N: usize>(&self, off: usize) -> [u8; N] {
        assert!(off + N <= self.len, "DmaMem read out of bounds");
        let mut out = [0u8; N];
        for (i, b) in out.iter_mut().enumerate() {
            // SAFETY: in bounds (checked above) and u8 reads are always valid.
            *b = unsafe { std::ptr::read_volatile(self.ptr.as_ptr().add(off + i)) };
        }
        out
    }

    /// A byte slice view, for data the device finished writing (identify pages).
    pub fn bytes(&self, off: usize, len: usize) -> Vec<u8> {
        assert!(off + len <= self.len, "DmaMem read out of bounds");
        let mut v = vec![0u8; len];
        dma_rmb();
        // SAFETY: in bounds; the command that filled the bytes has completed.
        unsafe { std::ptr::copy_nonoverlapping(self.ptr.as_ptr().add(off), v.as_mut_ptr(), len) };
        v
    }

    /// Zeroes the whole region (queues are reset this way before re-creation).
    pub fn zero(&self) {
        // SAFETY: the whole mapping; callers do this only while the device owns no queue here.
        unsafe { std::ptr::write_bytes(self.ptr.as_ptr(), 0, self.len) };
    }
}

#[cfg(not(loom))]
impl Drop for DmaMem {
    fn drop(&mut self) {
        self.bus.unmap_dma(self.ptr.as_ptr() as u64, self.len);
        // SAFETY: the mapping created in `new` with this length.
        unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.len) };
    }
}

/// The model's DMA memory, shared with the model's device thread.
#[cfg(loom)]
pub(crate) type ModelWords = Arc<Box<[crate::sync::atomic::AtomicU32]>>;

/// The model's DMA memory: the same interface on loom atomics, so that every driver access to
/// the queues is one a weakly ordered load may see stale (whole 32-bit words, the width the model
/// device uses; unaligned writes are not needed by the queues and refused).
#[cfg(loom)]
impl DmaMem {
    pub fn new(bus: &Arc<dyn Bus>, len: usize) -> Result<DmaMem, NvmeError> {
        use crate::sync::atomic::AtomicU32;
        let len = len.max(1).next_multiple_of(4);
        let words: ModelWords = Arc::new((0..len / 4).map(|_| AtomicU32::new(0)).collect());
        bus.map_dma(words.as_ptr() as u64, len)?;
        Ok(DmaMem {
            words,
            len,
            bus: Arc::clone(bus),
        })
    }

    pub fn iova(&self, off: usize) -> u64 {
        self.words.as_ptr() as u64 + off as u64
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The words, for the model's device thread.
    #[cfg(test)]
    pub(crate) fn model_words(&self) -> ModelWords {
        Arc::clone(&self.words)
    }

    pub fn write(&self, off: usize, data: &[u8]) {
        assert!(off + data.len() <= self.len, "DmaMem write out of bounds");
        assert!(
            off.is_multiple_of(4) && data.len().is_multiple_of(4),
            "model DmaMem writes whole words"
        );
        for (i, w) in data.chunks_exact(4).enumerate() {
            self.words[off / 4 + i].store(
                u32::from_le_bytes([w[0], w[1], w[2], w[3]]),
                Ordering::Relaxed,
            );
        }
    }

    pub fn read_volatile<const N: usize>(&self, off: usize) -> [u8; N] {
        assert!(off + N <= self.len, "DmaMem read out of bounds");
        let mut out = [0u8; N];
        self.read_into(off, &mut out);
        out
    }

    fn read_into(&self, off: usize, out: &mut [u8]) {
        let mut word = (usize::MAX, [0u8; 4]);
        for (i, b) in out.iter_mut().enumerate() {
            let at = off + i;
            if word.0 != at / 4 {
                word = (
                    at / 4,
                    self.words[at / 4].load(Ordering::Relaxed).to_le_bytes(),
                );
            }
            *b = word.1[at % 4];
        }
    }

    pub fn bytes(&self, off: usize, len: usize) -> Vec<u8> {
        assert!(off + len <= self.len, "DmaMem read out of bounds");
        dma_rmb();
        let mut v = vec![0u8; len];
        self.read_into(off, &mut v);
        v
    }

    pub fn zero(&self) {
        for w in self.words.iter() {
            w.store(0, Ordering::Relaxed);
        }
    }
}

#[cfg(loom)]
impl Drop for DmaMem {
    fn drop(&mut self) {
        self.bus.unmap_dma(self.iova(0), self.len);
    }
}
