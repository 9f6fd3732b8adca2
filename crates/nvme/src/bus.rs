//! What the driver needs from the hardware path: 32-bit register access to BAR0 and IOMMU
//! mappings for DMA memory. [`crate::vfio`] implements it over a real (or QEMU-emulated) PCI
//! function, [`crate::sim`] in-process. I/O addresses equal virtual addresses on both, so a
//! buffer's pointer is its DMA address once the memory behind it is mapped.

use crate::error::NvmeError;
use std::ptr::NonNull;
use std::sync::Arc;

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
    ptr: NonNull<u8>,
    len: usize,
    bus: Arc<dyn Bus>,
}

// SAFETY: the memory is owned by this value alone; the driver synchronises access to the parts
// the device writes with the completion protocol (phase tags) and volatile reads.
unsafe impl Send for DmaMem {}
// SAFETY: see above; shared access only reads.
unsafe impl Sync for DmaMem {}

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
        std::sync::atomic::fence(std::sync::atomic::Ordering::Acquire);
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

impl Drop for DmaMem {
    fn drop(&mut self) {
        self.bus.unmap_dma(self.ptr.as_ptr() as u64, self.len);
        // SAFETY: the mapping created in `new` with this length.
        unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.len) };
    }
}
