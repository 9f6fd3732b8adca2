//! The thread that owns a ublk device's kura [`BlockDevice`] queue pair. A kura device is one
//! queue pair driven from one thread, while a ublk device has a queue per thread (the driver's
//! hardware queues, commands of a queue only accepted from the thread that fetched them), so
//! every queue thread sends its requests here ([`ToDriver::Io`]); this thread keeps the device's
//! queue full (submits up to its depth, holds the rest back, polls, submits more) and hands each
//! completion to the queue that asked, waking that queue's thread through an eventfd its ring
//! polls ([`QueueLink`]). The same pattern as kura-vhost's driver for its virtqueues.
//!
//! A [`ToDriver::Swap`] replaces the device in place (a resize reopens it at its new size) once
//! nothing is in flight, and publishes the new block count for the queues' range checks.

use kura_engine::device::{BlockDevice, Completion, Request};
use kura_engine::DeviceError;
use std::collections::VecDeque;
use std::fs::File;
use std::io::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, Sender, TryRecvError};
use std::sync::Arc;

/// Changes the device in place on an idle queue pair; `Err` says why it could not. The device
/// left in the slot serves on either way (a failed reopen leaves one that fails every request).
pub type Swap = Box<dyn FnOnce(&mut Box<dyn BlockDevice>) -> Result<(), String> + Send>;

pub(crate) enum ToDriver {
    /// A request of ublk queue `queue`; its tag is the queue's tag.
    Io { queue: u16, req: Request },
    /// Swap the device once every request sent before is answered; the answer is the new
    /// capacity in bytes.
    Swap(Swap, Sender<Result<u64, String>>),
}

/// The way back to one queue thread: its completions, and the eventfd its ring waits on.
pub(crate) struct QueueLink {
    pub done: Sender<Completion>,
    pub wake: Arc<File>,
}

/// An eventfd adds the 8-byte counter written to it, in the host's byte order.
#[cfg(target_endian = "little")]
const EVENTFD_ONE: [u8; 8] = 1u64.to_le_bytes();

impl QueueLink {
    fn send(&self, c: Completion) {
        // A queue only stops once nothing of it is in flight, so a send cannot find it gone.
        let _ = self.done.send(c);
        let _ = (&*self.wake).write(&EVENTFD_ONE);
    }
}

/// Device tags carry the queue in the high half, so one queue's tags never meet another's.
fn device_tag(queue: u16, tag: u64) -> u64 {
    (u64::from(queue) << 32) | (tag & 0xffff_ffff)
}

/// Runs until every sender is gone and every request has been answered, then hands the device
/// back. `blocks` is kept at the device's block count.
pub(crate) fn run(
    mut dev: Box<dyn BlockDevice>,
    rx: Receiver<ToDriver>,
    queues: Vec<QueueLink>,
    blocks: Arc<AtomicU64>,
) -> Box<dyn BlockDevice> {
    let mut backlog: VecDeque<Request> = VecDeque::new();
    let mut swaps: VecDeque<(Swap, Sender<Result<u64, String>>)> = VecDeque::new();
    // Requests that came after a pending swap.
    let mut held: VecDeque<Request> = VecDeque::new();
    let mut completions: Vec<Completion> = Vec::new();
    let mut open = true;
    // Set when the queue pair itself failed: every later request is answered with its error.
    let mut broken: Option<DeviceError> = None;
    let answer = |c: Completion| {
        let q = (c.tag >> 32) as usize;
        let tag = c.tag & 0xffff_ffff;
        if let Some(link) = queues.get(q) {
            link.send(Completion { tag, ..c });
        }
    };
    loop {
        let mut incoming = Vec::new();
        if open && dev.in_flight() == 0 && backlog.is_empty() && swaps.is_empty() {
            match rx.recv() {
                Ok(msg) => incoming.push(msg),
                Err(_) => open = false,
            }
        }
        while open {
            match rx.try_recv() {
                Ok(msg) => incoming.push(msg),
                Err(TryRecvError::Empty) => break,
                Err(TryRecvError::Disconnected) => open = false,
            }
        }
        for msg in incoming {
            match msg {
                ToDriver::Io { queue, mut req } => {
                    req.tag = device_tag(queue, req.tag);
                    match &broken {
                        Some(e) => answer(Completion::of(req, Err(e.clone()))),
                        None if swaps.is_empty() => backlog.push_back(req),
                        None => held.push_back(req),
                    }
                }
                ToDriver::Swap(swap, reply) => swaps.push_back((swap, reply)),
            }
        }
        // A swap waits for every request that came before it; those after it wait in `held`.
        if !swaps.is_empty() && backlog.is_empty() && dev.in_flight() == 0 {
            for (swap, reply) in swaps.drain(..) {
                let res = swap(&mut dev).map(|()| dev.geometry());
                let res = res.map(|geo| {
                    blocks.store(geo.num_blocks, Ordering::Release);
                    geo.capacity_bytes()
                });
                let _ = reply.send(res);
            }
            backlog.append(&mut held);
        }
        if !open && dev.in_flight() == 0 && backlog.is_empty() && swaps.is_empty() {
            return dev;
        }
        while let Some(req) = backlog.pop_front() {
            if let Err(rejected) = dev.submit(req) {
                if matches!(rejected.error, DeviceError::QueueFull { .. }) {
                    backlog.push_front(rejected.request);
                    break;
                }
                answer(Completion::of(rejected.request, Err(rejected.error)));
            }
        }
        if dev.in_flight() == 0 {
            continue;
        }
        if let Err(e) = dev.poll(&mut completions, 1) {
            eprintln!("kura ublk: the device's queue failed ({e}); failing every request");
            for req in backlog.drain(..).chain(held.drain(..)) {
                answer(Completion::of(req, Err(e.clone())));
            }
            broken = Some(e);
            // What was in flight is lost with the queue pair and its tags never complete;
            // their ublk requests stay with the kernel until the device is stopped.
            if dev.in_flight() > 0 {
                for (_, reply) in swaps.drain(..) {
                    let _ = reply.send(Err("the device's queue failed".into()));
                }
                return dev;
            }
        }
        for c in completions.drain(..) {
            answer(c);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kura_engine::IoBuf;

    fn link() -> (QueueLink, Receiver<Completion>) {
        let (tx, rx) = std::sync::mpsc::channel();
        let wake = File::options()
            .write(true)
            .open("/dev/null")
            .expect("/dev/null");
        (
            QueueLink {
                done: tx,
                wake: Arc::new(wake),
            },
            rx,
        )
    }

    /// Two queues share one device: each gets back exactly its own requests, under their own
    /// tags, data intact; a swap in between grows the device and publishes its block count.
    #[test]
    fn completions_go_back_to_the_queue_that_sent_them() {
        let dev = kura_engine::open("mem:1M").expect("a memory device");
        let bs = u64::from(dev.geometry().block_size);
        let blocks = Arc::new(AtomicU64::new(dev.geometry().num_blocks));
        let (l0, r0) = link();
        let (l1, r1) = link();
        let (tx, rx) = std::sync::mpsc::channel();
        let b2 = blocks.clone();
        let driver = std::thread::spawn(move || run(dev, rx, vec![l0, l1], b2));
        for (q, tag) in [(0u16, 5u64), (1, 5), (1, 7)] {
            let mut buf = IoBuf::heap(bs as usize, 4096);
            buf.fill(q as u8 + tag as u8);
            let lba = u64::from(q) * 8 + tag;
            tx.send(ToDriver::Io {
                queue: q,
                req: Request::write(tag, lba, 1, buf),
            })
            .unwrap();
        }
        let (reply, answer) = std::sync::mpsc::channel();
        let swap: Swap = Box::new(|slot| {
            *slot = kura_engine::open("mem:2M").map_err(|e| e.to_string())?;
            Ok(())
        });
        tx.send(ToDriver::Swap(swap, reply)).unwrap();
        assert_eq!(answer.recv().unwrap(), Ok(2 << 20));
        assert_eq!(blocks.load(Ordering::Acquire), (2 << 20) / bs);
        let got0: Vec<u64> = r0.try_iter().map(|c| c.tag).collect();
        let mut got1: Vec<(u64, bool)> = r1
            .try_iter()
            .map(|c| (c.tag, c.status.is_ok() && c.buf.is_some()))
            .collect();
        got1.sort();
        assert_eq!(got0, vec![5]);
        assert_eq!(got1, vec![(5, true), (7, true)]);
        drop(tx);
        let dev = driver.join().expect("the driver returns the device");
        assert_eq!(dev.geometry().capacity_bytes(), 2 << 20);
    }
}
