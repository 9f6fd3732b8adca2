//! Guest memory handed to the device in place: a read's data lands straight in the guest's
//! buffer and a write's data goes to the device from it, with no copy through a pool buffer.
//!
//! A request qualifies when its data is **one** run of guest memory: after the header (writes),
//! the data bytes lie in a single descriptor, inside one guest-memory region, at a host address
//! aligned as the device's `Geometry::buffer_alignment` asks (O_DIRECT: a page).
//! Anything else (data spread over several descriptors, the header and data in one descriptor,
//! a misaligned buffer) is copied through a pool buffer as before. [`single_run`] is that decision
//! on descriptor lengths alone, [`in_place`] adds the memory lookup and alignment.
//!
//! The buffer holds a clone of the `Arc` of the guest-memory map it was taken from: when QEMU
//! replaces the memory table (SET_MEM_TABLE) while the request is in flight, the old mappings
//! stay mapped until the request's buffer is dropped.

use crate::driver::{Mem, Seg};
use kura_engine::{DriveStats, IoBuf};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use vm_memory::{GuestAddress, GuestMemoryBackend};

/// The guest address of `len` bytes that start `skip` bytes into `segs`, when they all lie in
/// one segment; `None` when they are split over segments or the segments are too short.
pub(crate) fn single_run(segs: &[Seg], mut skip: u64, len: u64) -> Option<GuestAddress> {
    if len == 0 {
        return None;
    }
    for seg in segs {
        let seg_len = u64::from(seg.len);
        if skip >= seg_len {
            skip -= seg_len;
            continue;
        }
        // The first segment holding data must hold all of it.
        return (seg_len - skip >= len)
            .then(|| seg.addr.0.checked_add(skip).map(GuestAddress))
            .flatten();
    }
    None
}

/// A buffer over the guest's own memory for the `len` data bytes `skip` bytes into `segs`, or
/// `None` when the request must be copied (see the module docs).
pub(crate) fn in_place(
    mem: &Arc<Mem>,
    segs: &[Seg],
    skip: u64,
    len: usize,
    align: u32,
) -> Option<IoBuf> {
    let addr = single_run(segs, skip, len as u64)?;
    // The length is whole blocks, which the device takes from any buffer (O_DIRECT: the block
    // size is at least the logical block size); only the address is checked.
    let align = usize::try_from(align.max(1)).ok()?;
    // `get_slice` fails unless the whole range lies in one region of this map.
    let slice = mem.get_slice(addr, len).ok()?;
    let ptr = NonNull::new(slice.ptr_guard_mut().as_ptr())?;
    if !(ptr.as_ptr() as usize).is_multiple_of(align) {
        return None;
    }
    let keep: Arc<dyn std::any::Any + Send + Sync> = mem.clone();
    borrow(ptr, len, keep)
}

#[allow(unsafe_code)] // the one place this crate hands guest memory to the engine
fn borrow(
    ptr: NonNull<u8>,
    len: usize,
    keep: Arc<dyn std::any::Any + Send + Sync>,
) -> Option<IoBuf> {
    // SAFETY (`IoBuf::borrowed`'s contract):
    // - mapped: `ptr..ptr + len` is one guest-memory region's range (checked by `get_slice`) of
    //   the map `keep` holds. A `GuestMemoryMmap` unmaps a region only when the last `Arc` of its
    //   region is dropped, and the map holds its regions, so the range stays mapped while the
    //   buffer lives, across any SET_MEM_TABLE (which swaps in a new map and drops only the
    //   frontend's reference to the old one). vhost-user-backend maps guest memory read-write.
    // - exclusive in this process: these bytes are a data buffer of one descriptor chain the
    //   guest gave the device; this crate touches a chain's data only through its one job, which
    //   holds this buffer until the device completes and drops it before the chain is answered
    //   (`driver::finish`), and nothing else of this process reads guest data buffers. A guest
    //   can still give two chains in flight overlapping buffers; then two buffers cover the same
    //   guest bytes. The engine's backends hand such memory only to the kernel (io_uring, pread
    //   and pwrite) or copy it once (`mem:`), so what results is unspecified data in that
    //   guest's own memory, as with a DMA device given overlapping buffers, never in memory of
    //   this process's.
    Some(unsafe { IoBuf::borrowed(ptr, len, keep) })
}

/// How many requests went to the device in place and how many were copied.
#[derive(Debug, Default)]
pub(crate) struct Counters {
    pub zero_copy_reads: AtomicU64,
    pub copied_reads: AtomicU64,
    pub zero_copy_writes: AtomicU64,
    pub copied_writes: AtomicU64,
    /// Of `zero_copy_writes`, those copied after all because the device was swapped for one
    /// that asks for another alignment while they waited.
    pub recopied_writes: AtomicU64,
}

impl Counters {
    pub fn count(counter: &AtomicU64) {
        counter.fetch_add(1, Ordering::Relaxed);
    }

    /// The export's own layer in the stats: `vhost zero_copy=… zero_copy_reads=…`.
    pub fn layer(&self, zero_copy: bool) -> DriveStats {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        DriveStats::new("vhost")
            .with("zero_copy", u64::from(zero_copy))
            .with("zero_copy_reads", get(&self.zero_copy_reads))
            .with("copied_reads", get(&self.copied_reads))
            .with("zero_copy_writes", get(&self.zero_copy_writes))
            .with("copied_writes", get(&self.copied_writes))
            .with("recopied_writes", get(&self.recopied_writes))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use vm_memory::{Bytes, GuestMemoryMmap};

    fn seg(addr: u64, len: u32) -> Seg {
        Seg {
            addr: GuestAddress(addr),
            len,
        }
    }

    #[test]
    fn only_data_in_one_descriptor_is_a_single_run() {
        // Header in its own descriptor, data in the next: the usual Linux layout.
        let w = [seg(0x1000, 16), seg(0x4000, 8192)];
        assert_eq!(single_run(&w, 16, 8192), Some(GuestAddress(0x4000)));
        // Header and data in one descriptor: the data starts 16 bytes in.
        assert_eq!(
            single_run(&[seg(0x4000, 16 + 4096)], 16, 4096),
            Some(GuestAddress(0x4010))
        );
        // Data over two descriptors, even adjacent ones, is not one run.
        let split = [seg(0x1000, 16), seg(0x4000, 4096), seg(0x5000, 4096)];
        assert_eq!(single_run(&split, 16, 8192), None);
        // Too short, or nothing.
        assert_eq!(single_run(&[seg(0x4000, 4096)], 0, 8192), None);
        assert_eq!(single_run(&[], 0, 512), None);
        assert_eq!(single_run(&[seg(0x4000, 4096)], 0, 0), None);
        // An address that would wrap.
        assert_eq!(single_run(&[seg(u64::MAX - 10, 4096)], 16, 512), None);
    }

    #[test]
    fn in_place_needs_one_aligned_run_inside_one_region() {
        let mem = Arc::new(
            GuestMemoryMmap::<()>::from_ranges(&[
                (GuestAddress(0), 0x10000),
                (GuestAddress(0x10000), 0x10000),
            ])
            .unwrap(),
        );
        mem.write_slice(&[9u8; 4096], GuestAddress(0x2000)).unwrap();
        let buf = in_place(&mem, &[seg(0x2000, 4096)], 0, 4096, 4096).expect("aligned run");
        assert!(buf.is_borrowed() && buf.iter().all(|&b| b == 9));
        assert_eq!(Arc::strong_count(&mem), 2, "the buffer keeps the map");
        drop(buf);
        // 512 bytes past a page: fine for 512-byte alignment, not for 4096.
        assert!(in_place(&mem, &[seg(0x2200, 4096)], 0, 4096, 512).is_some());
        assert!(in_place(&mem, &[seg(0x2200, 4096)], 0, 4096, 4096).is_none());
        // Header and data in one descriptor: 16 bytes off any alignment above 16.
        assert!(in_place(&mem, &[seg(0x2000, 16 + 4096)], 16, 4096, 512).is_none());
        // Split over descriptors, or over the two regions, or outside guest memory.
        let split = [seg(0x2000, 2048), seg(0x2800, 2048)];
        assert!(in_place(&mem, &split, 0, 4096, 512).is_none());
        assert!(in_place(&mem, &[seg(0xf000, 8192)], 0, 8192, 512).is_none());
        assert!(in_place(&mem, &[seg(0x40000, 4096)], 0, 4096, 512).is_none());
        assert_eq!(Arc::strong_count(&mem), 1);
    }
}
