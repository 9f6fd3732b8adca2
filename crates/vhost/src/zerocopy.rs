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
//!
//! No two buffers in flight cover the same guest bytes: a guest may hand two requests in flight
//! overlapping data buffers (nothing in virtio forbids it), and two in-place buffers over the
//! same bytes would be two `&mut [u8]` to one place in this process. [`Lent`] records the guest
//! ranges lent out; a request overlapping one is copied instead, and counted as `overlapping`.

use crate::driver::{Mem, Seg};
use kura_engine::{DriveStats, IoBuf};
use std::collections::BTreeMap;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
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

/// The guest ranges lent to the device in place, shared by every queue of one backend: keyed
/// by guest address (stable across SET_MEM_TABLE, unlike host addresses), start to end, never
/// overlapping.
#[derive(Debug, Default)]
pub(crate) struct Lent(Mutex<BTreeMap<u64, u64>>);

impl Lent {
    /// Records `start..start + len` as lent, unless it overlaps a range lent already.
    fn lend(self: &Arc<Self>, start: u64, len: u64) -> Option<Lease> {
        let end = start.checked_add(len)?;
        let mut lent = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        // The ranges are disjoint, so the one starting last before `end` also ends last.
        if lent
            .range(..end)
            .next_back()
            .is_some_and(|(_, &e)| e > start)
        {
            return None;
        }
        lent.insert(start, end);
        Some(Lease {
            lent: self.clone(),
            start,
        })
    }

    /// How many ranges are lent now.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.0.lock().unwrap_or_else(PoisonError::into_inner).len()
    }
}

/// One lent range; returned when the buffer holding it drops.
#[derive(Debug)]
struct Lease {
    lent: Arc<Lent>,
    start: u64,
}

impl Drop for Lease {
    fn drop(&mut self) {
        let mut lent = self.lent.0.lock().unwrap_or_else(PoisonError::into_inner);
        lent.remove(&self.start);
    }
}

/// What an in-place buffer keeps alive: the memory map it points into and its lease.
struct Keep {
    _mem: Arc<Mem>,
    _lease: Lease,
}

/// Why a request was not given in place.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Copy {
    /// Its data is not one aligned run inside one region (see the module docs).
    Shape,
    /// Its data overlaps guest bytes lent to a request still in flight.
    Overlapping,
}

/// A buffer over the guest's own memory for the `len` data bytes `skip` bytes into `segs`, or
/// why the request must be copied (see the module docs).
pub(crate) fn in_place(
    mem: &Arc<Mem>,
    lent: &Arc<Lent>,
    segs: &[Seg],
    skip: u64,
    len: usize,
    align: u32,
) -> Result<IoBuf, Copy> {
    let addr = single_run(segs, skip, len as u64).ok_or(Copy::Shape)?;
    // The length is whole blocks, which the device takes from any buffer (O_DIRECT: the block
    // size is at least the logical block size); only the address is checked.
    let align = usize::try_from(align.max(1)).map_err(|_| Copy::Shape)?;
    // `get_slice` fails unless the whole range lies in one region of this map.
    let slice = mem.get_slice(addr, len).map_err(|_| Copy::Shape)?;
    let ptr = NonNull::new(slice.ptr_guard_mut().as_ptr()).ok_or(Copy::Shape)?;
    if !(ptr.as_ptr() as usize).is_multiple_of(align) {
        return Err(Copy::Shape);
    }
    let lease = lent.lend(addr.0, len as u64).ok_or(Copy::Overlapping)?;
    let keep: Arc<dyn std::any::Any + Send + Sync> = Arc::new(Keep {
        _mem: mem.clone(),
        _lease: lease,
    });
    Ok(borrow(ptr, len, keep))
}

#[allow(unsafe_code)] // the one place this crate hands guest memory to the engine
fn borrow(ptr: NonNull<u8>, len: usize, keep: Arc<dyn std::any::Any + Send + Sync>) -> IoBuf {
    // SAFETY (`IoBuf::borrowed`'s contract):
    // - mapped: `ptr..ptr + len` is one guest-memory region's range (checked by `get_slice`) of
    //   the map `keep` holds. A `GuestMemoryMmap` unmaps a region only when the last `Arc` of its
    //   region is dropped, and the map holds its regions, so the range stays mapped while the
    //   buffer lives, across any SET_MEM_TABLE (which swaps in a new map and drops only the
    //   frontend's reference to the old one). vhost-user-backend maps guest memory read-write.
    // - exclusive in this process: `keep` holds a lease on these guest bytes, and no other lease
    //   overlaps it (`Lent::lend`), so no other in-place buffer covers them while this one
    //   lives, however the guest lays out its requests. The rest of this crate touches guest
    //   data only through vm-memory's volatile copies (`gather`/`scatter`), which make no
    //   references; those, like the guest itself, can change the bytes under the buffer only if
    //   the guest gives overlapping buffers, and then the data is unspecified, as with a DMA
    //   device given them.
    unsafe { IoBuf::borrowed(ptr, len, keep) }
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
    /// Of the copied reads and writes, those that qualified for in place but overlapped guest
    /// bytes lent to a request in flight.
    pub overlapping: AtomicU64,
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
            .with("overlapping", get(&self.overlapping))
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
        let lent = Arc::new(Lent::default());
        let place = |segs: &[Seg], skip, len, align| in_place(&mem, &lent, segs, skip, len, align);
        mem.write_slice(&[9u8; 4096], GuestAddress(0x2000)).unwrap();
        let buf = place(&[seg(0x2000, 4096)], 0, 4096, 4096).expect("aligned run");
        assert!(buf.is_borrowed() && buf.iter().all(|&b| b == 9));
        assert_eq!(Arc::strong_count(&mem), 2, "the buffer keeps the map");
        drop(buf);
        assert_eq!(lent.len(), 0, "dropping the buffer returns its range");
        // 512 bytes past a page: fine for 512-byte alignment, not for 4096.
        assert!(place(&[seg(0x2200, 4096)], 0, 4096, 512).is_ok());
        assert_eq!(
            place(&[seg(0x2200, 4096)], 0, 4096, 4096).err(),
            Some(Copy::Shape)
        );
        // Header and data in one descriptor: 16 bytes off any alignment above 16.
        assert!(place(&[seg(0x2000, 16 + 4096)], 16, 4096, 512).is_err());
        // Split over descriptors, or over the two regions, or outside guest memory.
        let split = [seg(0x2000, 2048), seg(0x2800, 2048)];
        assert!(place(&split, 0, 4096, 512).is_err());
        assert!(place(&[seg(0xf000, 8192)], 0, 8192, 512).is_err());
        assert!(place(&[seg(0x40000, 4096)], 0, 4096, 512).is_err());
        assert_eq!(Arc::strong_count(&mem), 1);
        assert_eq!(lent.len(), 0);
    }

    /// Two buffers in flight never cover the same guest byte, however the ranges overlap; ranges
    /// that only touch are both lent, and a range is free again once its buffer drops.
    #[test]
    fn overlapping_guest_ranges_are_never_lent_twice() {
        let mem =
            Arc::new(GuestMemoryMmap::<()>::from_ranges(&[(GuestAddress(0), 0x40000)]).unwrap());
        let lent = Arc::new(Lent::default());
        let place = |addr, len| in_place(&mem, &lent, &[seg(addr, len as u32)], 0, len, 512);
        let held = place(0x10000, 0x2000).expect("free range");
        for (addr, len) in [
            (0x10000, 0x2000),  // the same bytes
            (0x0f000, 0x2000),  // ends inside
            (0x11e00, 0x1000),  // starts inside
            (0x10800, 0x200),   // within
            (0x0f000, 0x10000), // around
        ] {
            assert_eq!(
                place(addr, len).err(),
                Some(Copy::Overlapping),
                "{addr:#x}+{len:#x}"
            );
        }
        let before = place(0x0f000, 0x1000).expect("ends where the lent range starts");
        let after = place(0x12000, 0x1000).expect("starts where the lent range ends");
        assert_eq!(lent.len(), 3);
        drop(held);
        let again = place(0x10800, 0x200).expect("free once the first buffer dropped");
        drop((before, after, again));
        assert_eq!(lent.len(), 0);
    }

    /// The lease table against a plain model of lent bytes, over random lend/return sequences.
    #[test]
    fn lent_ranges_match_a_byte_model() {
        let lent = Arc::new(Lent::default());
        let mut model = [false; 64];
        let mut leases: Vec<(Lease, u64, u64)> = Vec::new();
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = |n: u64| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state % n
        };
        for _ in 0..20_000 {
            if next(3) == 0 && !leases.is_empty() {
                let (lease, start, len) = leases.swap_remove(next(leases.len() as u64) as usize);
                drop(lease);
                model[start as usize..(start + len) as usize].fill(false);
                continue;
            }
            let start = next(60);
            let len = 1 + next(64 - start);
            let free = !model[start as usize..(start + len) as usize].contains(&true);
            match lent.lend(start, len) {
                Some(lease) => {
                    assert!(free, "{start}+{len} lent over a lent byte");
                    model[start as usize..(start + len) as usize].fill(true);
                    leases.push((lease, start, len));
                }
                None => assert!(!free, "{start}+{len} refused though free"),
            }
        }
    }
}
