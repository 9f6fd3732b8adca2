//! RAM disks for the store tests: a store on one, reopened over the same storage.

// Each test binary uses a part of these.
#![allow(dead_code)]

use kura_engine::backend::common::QueueOptions;
use kura_engine::backend::mem::{MemDevice, MemStorage};
use kura_store::{Store, StoreOptions};

/// 1 MiB segments, so small disks hold several and the log crosses segments quickly.
pub const SHIFT: u32 = 20;

pub fn options() -> StoreOptions {
    StoreOptions {
        segment_shift: SHIFT,
        ..StoreOptions::default()
    }
}

/// A RAM disk of `mib` MiB with `block_size`-byte blocks.
pub fn ram_disk(mib: u64, block_size: u32) -> MemDevice {
    MemDevice::new(
        mib << 20,
        QueueOptions {
            block_size,
            ..QueueOptions::default()
        },
    )
}

/// [`options`] with a memtable of `memtable_bytes` and level 0 merged above two runs, so
/// flushes and compactions happen every few writes.
pub fn small_memtable(memtable_bytes: usize) -> StoreOptions {
    StoreOptions {
        memtable_bytes,
        l0_runs: 2,
        ..options()
    }
}

/// The store on `storage`, opened again.
pub fn reopen(storage: &MemStorage) -> Store {
    let dev = MemDevice::with_storage(storage.clone(), QueueOptions::default());
    Store::open(Box::new(dev), options().max_group_bytes).expect("reopen")
}

/// The store on `storage`, opened again with the run-time settings of `opts`.
pub fn reopen_with(storage: &MemStorage, opts: &StoreOptions) -> Store {
    let dev = MemDevice::with_storage(storage.clone(), QueueOptions::default());
    Store::open_with(Box::new(dev), opts).expect("reopen")
}
