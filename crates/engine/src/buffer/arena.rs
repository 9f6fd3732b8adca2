//! The one memory region the pool reserves up front.
//!
//! Backed by 2 MiB hugepages when the kernel has them reserved, otherwise by ordinary anonymous
//! memory with transparent hugepages requested. Either way it is mapped once and never moved, so
//! io_uring can register it as a single fixed buffer and the data path never pins or maps pages.

use crate::error::Errno;
use std::ptr::NonNull;

const HUGEPAGE: usize = 2 << 20;

/// How the arena's pages are backed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backing {
    /// Explicit 2 MiB hugepages (`MAP_HUGETLB`).
    Hugepages,
    /// Ordinary pages, with transparent hugepages requested.
    Pages,
}

/// An anonymous mapping owned by the pool.
#[derive(Debug)]
pub struct Arena {
    base: NonNull<u8>,
    len: usize,
    backing: Backing,
}

// SAFETY: the arena is plain memory owned by this value; the pool hands out disjoint pieces of it
// under a lock, so moving or sharing the handle between threads is sound.
unsafe impl Send for Arena {}
// SAFETY: see above; `Arena` itself only exposes the base address and length.
unsafe impl Sync for Arena {}

impl Arena {
    /// Maps `len` bytes, trying hugepages first when `len` is a multiple of 2 MiB.
    pub fn map(len: usize, try_hugepages: bool) -> Result<Self, Errno> {
        let huge = if try_hugepages && len.is_multiple_of(HUGEPAGE) {
            mmap_anon(len, libc::MAP_HUGETLB | (21 << libc::MAP_HUGE_SHIFT))
        } else {
            None
        };
        let arena = match huge {
            Some(base) => Arena {
                base,
                len,
                backing: Backing::Hugepages,
            },
            None => {
                let base = mmap_anon(len, 0).ok_or_else(Errno::last)?;
                // SAFETY: `base..base+len` is the mapping just created; madvise only changes
                // paging policy and its failure (THP disabled) is harmless.
                unsafe {
                    libc::madvise(base.as_ptr().cast(), len, libc::MADV_HUGEPAGE);
                }
                Arena {
                    base,
                    len,
                    backing: Backing::Pages,
                }
            }
        };
        arena.exclude_from_fork();
        Ok(arena)
    }

    /// Keeps the arena out of forked children (the redirect proxy never touches it). Without
    /// this, a fork after io_uring pinned the arena copies every pinned page eagerly.
    fn exclude_from_fork(&self) {
        // SAFETY: madvise on this arena's own mapping; failure only costs copy time at fork.
        unsafe {
            libc::madvise(self.base.as_ptr().cast(), self.len, libc::MADV_DONTFORK);
        }
    }

    pub fn base(&self) -> NonNull<u8> {
        self.base
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn backing(&self) -> Backing {
        self.backing
    }
}

fn mmap_anon(len: usize, extra_flags: i32) -> Option<NonNull<u8>> {
    // SAFETY: an anonymous private mapping with no address hint has no preconditions; the result
    // is checked against MAP_FAILED before use.
    let ptr = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | extra_flags,
            -1,
            0,
        )
    };
    if ptr == libc::MAP_FAILED {
        None
    } else {
        NonNull::new(ptr.cast())
    }
}

impl Drop for Arena {
    fn drop(&mut self) {
        // SAFETY: the mapping was created by `map` with this base and length and every buffer
        // carved from it holds an `Arc` to the pool that owns this arena, so none outlives it.
        unsafe {
            libc::munmap(self.base.as_ptr().cast(), self.len);
        }
    }
}
