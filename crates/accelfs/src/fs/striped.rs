//! The state lock's type: a reader-writer lock striped over cache lines, four stripes per core,
//! so that readers on different cores never write the same cache line.
//!
//! Each stripe is a `std` `RwLock<()>` on a 128-byte line of its own. A reader takes the
//! stripe of its thread (threads are numbered once, round robin over the stripes) shared; a
//! writer takes every stripe exclusively, in order. A value behind the lock is therefore read
//! only by threads holding some stripe shared (which no writer can hold meanwhile) and changed
//! only by the one thread holding them all: the rules of a read-write lock, with a reader's
//! cost independent of how many other cores read. A writer pays one uncontended lock per
//! stripe, which the exclusive paths (changes, cache misses) can afford.
//!
//! Why not `crossbeam_utils::sync::ShardedLock`, which is the same idea: it has a fixed 8
//! shards, so at 16 threads two threads share each shard's counter, and on a 16-core machine
//! cached reads then scaled 3-4.6x at 16 threads against 6.8-8.1x at 8 (issue 14). Here the
//! stripes are four per core (a power of two, at most [`MAX_STRIPES`]): with one per core, more
//! reader threads than cores shared stripes, and on 2 cores 8 threads of cached 4 KiB reads of
//! their own files scaled 1.32-1.39x over one thread against 1.84-1.85x with four per core
//! (ext4: 1.70-1.82x); a writer's extra uncontended locks did not slow the metadata storm.
//!
//! Poisoning is not passed on: a panic while holding the lock cannot leave a half-applied
//! change on the device (only commits write metadata), so the state stays usable (as the
//! `RwLock` before this did with `into_inner`).

use std::cell::UnsafeCell;
use std::ops::{Deref, DerefMut};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};

/// Most stripes a lock has (a machine with more cores shares stripes between threads).
pub(crate) const MAX_STRIPES: usize = 64;

/// Stripes per core: more threads than cores (readers preempted and resumed on either core)
/// then rarely share a stripe.
const STRIPES_PER_CORE: usize = 4;

#[repr(align(128))]
struct Stripe(RwLock<()>);

/// A reader-writer lock whose readers lock only their own thread's stripe.
pub(crate) struct StripedRwLock<T> {
    stripes: Box<[Stripe]>,
    value: UnsafeCell<T>,
}

// SAFETY: the stripes give `&T` to any number of threads at once (holding a stripe shared)
// and `&mut T` to one thread at a time (holding every stripe exclusively), never both: the
// same sharing as `std::sync::RwLock<T>`, which is `Sync` exactly when `T: Send + Sync`.
unsafe impl<T: Send + Sync> Sync for StripedRwLock<T> {}

/// Shared access: the reading thread's stripe, held shared.
pub(crate) struct ReadGuard<'a, T> {
    value: &'a T,
    _stripe: RwLockReadGuard<'a, ()>,
}

/// Exclusive access: every stripe, held exclusively.
pub(crate) struct WriteGuard<'a, T> {
    value: &'a mut T,
    _stripes: Vec<RwLockWriteGuard<'a, ()>>,
}

/// This thread's number, which picks its stripe (`% stripes`).
fn thread_number() -> usize {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    thread_local! {
        static NUMBER: usize = NEXT.fetch_add(1, Ordering::Relaxed);
    }
    NUMBER.with(|n| *n)
}

impl<T> StripedRwLock<T> {
    /// A lock with [`STRIPES_PER_CORE`] stripes per core (rounded up to a power of two, at
    /// most [`MAX_STRIPES`]).
    pub(crate) fn new(value: T) -> Self {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        Self::with_stripes(
            value,
            (cores * STRIPES_PER_CORE)
                .next_power_of_two()
                .min(MAX_STRIPES),
        )
    }

    /// A lock with `stripes` stripes (at least one).
    pub(crate) fn with_stripes(value: T, stripes: usize) -> Self {
        StripedRwLock {
            stripes: (0..stripes.max(1))
                .map(|_| Stripe(RwLock::new(())))
                .collect(),
            value: UnsafeCell::new(value),
        }
    }

    /// Shared access, beside other readers; waits while a writer holds (or waits for) this
    /// thread's stripe. Never call it while this thread holds the lock exclusively, or shared
    /// when a writer may be waiting (that could wait for itself).
    pub(crate) fn read(&self) -> ReadGuard<'_, T> {
        let stripe = &self.stripes[thread_number() % self.stripes.len()];
        let guard = stripe.0.read().unwrap_or_else(PoisonError::into_inner);
        // SAFETY: holding a stripe shared means no writer holds every stripe, and none can
        // take them all until `guard` (kept in the returned guard, beside the reference, for
        // the reference's whole life) is released; so nothing mutates the value meanwhile.
        let value = unsafe { &*self.value.get() };
        ReadGuard {
            value,
            _stripe: guard,
        }
    }

    /// Exclusive access: waits for every reader and writer to leave.
    pub(crate) fn write(&self) -> WriteGuard<'_, T> {
        let stripes: Vec<_> = self
            .stripes
            .iter()
            .map(|s| s.0.write().unwrap_or_else(PoisonError::into_inner))
            .collect();
        // SAFETY: every stripe is held exclusively by this thread (in `stripes`, kept in the
        // returned guard for the reference's whole life): no reader holds one, and no other
        // writer can hold them all, so this is the only reference to the value.
        let value = unsafe { &mut *self.value.get() };
        WriteGuard {
            value,
            _stripes: stripes,
        }
    }
}

impl<T> Deref for ReadGuard<'_, T> {
    type Target = T;
    fn deref(&self) -> &T {
        self.value
    }
}

impl<T> Deref for WriteGuard<'_, T> {
    type Target = T;
    fn deref(&self) -> &T {
        self.value
    }
}

impl<T> DerefMut for WriteGuard<'_, T> {
    fn deref_mut(&mut self) -> &mut T {
        self.value
    }
}

#[cfg(test)]
mod tests {
    use super::StripedRwLock;
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

    /// Writers keep two counters equal only while they hold the lock; readers on many threads
    /// (and so on different stripes) must never see them differ, and no increment is lost.
    #[test]
    fn readers_never_see_a_half_done_write_and_writes_are_not_lost() {
        for stripes in [1, 3, 8] {
            let lock = StripedRwLock::with_stripes((0u64, 0u64), stripes);
            let stop = AtomicBool::new(false);
            // Writers start only once every reader is reading, so the readers overlap the writes
            // however the threads are scheduled.
            let reading = AtomicUsize::new(0);
            std::thread::scope(|s| {
                let readers: Vec<_> = (0..4)
                    .map(|_| {
                        s.spawn(|| {
                            let mut first = true;
                            loop {
                                let g = lock.read();
                                assert_eq!(g.0, g.1, "a reader saw a write half done");
                                drop(g);
                                if first {
                                    reading.fetch_add(1, Ordering::SeqCst);
                                    first = false;
                                }
                                if stop.load(Ordering::Relaxed) {
                                    break;
                                }
                            }
                        })
                    })
                    .collect();
                while reading.load(Ordering::SeqCst) < 4 {
                    std::thread::yield_now();
                }
                let writers: Vec<_> = (0..3)
                    .map(|_| {
                        s.spawn(|| {
                            for _ in 0..2000 {
                                let mut g = lock.write();
                                g.0 += 1;
                                std::hint::spin_loop();
                                g.1 += 1;
                            }
                        })
                    })
                    .collect();
                for w in writers {
                    w.join().expect("writer");
                }
                stop.store(true, Ordering::Relaxed);
                for r in readers {
                    r.join().expect("reader");
                }
            });
            assert_eq!(*lock.read(), (6000, 6000), "{stripes} stripes");
        }
    }

    #[test]
    fn a_panic_under_the_lock_leaves_it_usable() {
        let lock = StripedRwLock::with_stripes(1u32, 4);
        let r = std::thread::scope(|s| {
            s.spawn(|| {
                let _g = lock.write();
                panic!("while holding the lock");
            })
            .join()
        });
        assert!(r.is_err());
        *lock.write() += 1;
        assert_eq!(*lock.read(), 2);
    }
}
