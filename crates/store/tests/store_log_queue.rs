//! The log's own queue: a commit submits its frame and goes on without waiting for the write,
//! and a sync waits for it before its flush. The device here holds every submitted command
//! until its queue is polled, as a real queue may, so what the store waited for is exactly
//! what is on the device: a copy of the RAM disk taken while a frame's write is still held
//! must lack it (the commit did not wait), and a copy taken right after `sync` returned must
//! hold every write (the sync waited for the frame before its flush).

mod common;

use common::{options, ram_disk};
use kura_engine::backend::common::QueueOptions;
use kura_engine::backend::mem::MemDevice;
use kura_engine::{BlockDevice, Completion, DriveStats, Geometry, OpenError, Rejected, Request};
use kura_store::Store;
use std::sync::{Arc, Mutex};

/// Holds submitted commands until `poll`, then runs them on the device below.
struct Held {
    inner: Box<dyn BlockDevice>,
    held: Vec<Request>,
}

impl Held {
    fn new(inner: Box<dyn BlockDevice>) -> Self {
        Held {
            inner,
            held: Vec::new(),
        }
    }
}

impl BlockDevice for Held {
    fn geometry(&self) -> Geometry {
        self.inner.geometry()
    }
    fn describe(&self) -> String {
        format!("held({})", self.inner.describe())
    }
    fn submit(&mut self, req: Request) -> Result<(), Rejected> {
        self.held.push(req);
        Ok(())
    }
    fn ring_doorbell(&mut self) -> kura_engine::DeviceResult<()> {
        Ok(())
    }
    fn poll(&mut self, out: &mut Vec<Completion>, min: usize) -> kura_engine::DeviceResult<usize> {
        for req in self.held.drain(..) {
            self.inner.submit(req).map_err(|r| r.error)?;
        }
        self.inner.poll(out, min)
    }
    fn in_flight(&self) -> usize {
        self.held.len() + self.inner.in_flight()
    }
    fn stats(&self, out: &mut Vec<DriveStats>) {
        self.inner.stats(out)
    }
    fn new_queue(&self) -> Option<Result<Box<dyn BlockDevice>, OpenError>> {
        self.inner
            .new_queue()
            .map(|r| r.map(|q| Box::new(Held::new(q)) as Box<dyn BlockDevice>))
    }
}

fn key(i: u32) -> Vec<u8> {
    format!("key{i:05}").into_bytes()
}

/// The keys a store opened on a copy of `storage` as it is now finds.
fn keys_on_a_copy(storage: &Arc<Mutex<Vec<u8>>>, count: u32) -> usize {
    let image = storage.lock().expect("storage").clone();
    let dev = MemDevice::with_storage(Arc::new(Mutex::new(image)), QueueOptions::default());
    let store = Store::open(Box::new(dev), 1 << 20).expect("open the copy");
    (0..count)
        .filter(|&i| store.get(&key(i)).expect("get").is_some())
        .count()
}

#[test]
fn a_commit_does_not_wait_for_its_frame_and_a_sync_does() {
    let disk = ram_disk(64, 4096);
    let storage = disk.storage();
    let store = Store::create(Box::new(Held::new(Box::new(disk))), &options()).expect("create");
    // 300 KiB of unsynced puts: the first 256 KiB go out as one frame, the rest wait in memory.
    let count = 300;
    let value = vec![0x5a; 1024];
    for i in 0..count {
        store.put(&key(i), &value, false).expect("put");
    }
    assert_eq!(
        keys_on_a_copy(&storage, count),
        0,
        "the frame's write is still held, so a commit waited for it"
    );
    store.sync().expect("sync");
    assert_eq!(
        keys_on_a_copy(&storage, count),
        count as usize,
        "every put is on the device once sync returned"
    );
    store.close().expect("close");
}
