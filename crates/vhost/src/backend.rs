//! The vhost-user side of one connection: what `vhost-user-backend` asks of a device (features,
//! configuration space, queues) and the per-virtqueue work: take each descriptor chain off the
//! available ring, decode it, copy write data out of guest memory into a kura buffer and hand
//! the request to the export's driver thread (a discard or write-zeroes of several ranges as one
//! device request per range). One thread per virtqueue (`queues_per_thread`): vhost-user-backend
//! starts them all when the connection opens, before the guest says which queues it enables, so
//! queues it never enables keep an idle thread in epoll.

use crate::blk::{self, Command, Shape, HEADER_LEN, STATUS_IOERR, STATUS_OK};
use crate::driver::{
    self, gather, scatter, Job, Mem, Parts, QueueOrder, Seg, ToDriver, Vring, Work,
};
use std::io;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::Sender;
use std::sync::{Arc, Mutex, PoisonError};
use vhost::vhost_user::message::{VhostUserProtocolFeatures, VhostUserVirtioFeatures};
use vhost_user_backend::{VhostUserBackend, VringT};
use virtio_queue::QueueOwnedT;
use vm_memory::{GuestAddress, GuestAddressSpace, GuestMemoryAtomic};
use vmm_sys_util::epoll::EventSet;
use vmm_sys_util::event::{
    new_event_consumer_and_notifier, EventConsumer, EventFlag, EventNotifier,
};

/// Descriptors per virtqueue the backend accepts (QEMU asks for 128 by default).
pub(crate) const MAX_QUEUE_SIZE: u16 = 1024;

struct Inner {
    shape: Shape,
    /// The disk's size in blocks now (a swap may change it while connected); `shape.num_blocks`
    /// is not used.
    num_blocks: Arc<std::sync::atomic::AtomicU64>,
    id: [u8; 20],
    driver: Mutex<Sender<ToDriver>>,
    orders: Vec<Arc<QueueOrder>>,
    event_idx: AtomicBool,
    mem: Mutex<Option<GuestMemoryAtomic<Mem>>>,
}

/// The device one vhost-user connection drives.
#[derive(Clone)]
pub(crate) struct Backend(Arc<Inner>);

impl Backend {
    pub fn new(
        shape: Shape,
        num_blocks: Arc<std::sync::atomic::AtomicU64>,
        id: [u8; 20],
        driver: Sender<ToDriver>,
        orders: Vec<Arc<QueueOrder>>,
    ) -> Backend {
        Backend(Arc::new(Inner {
            shape,
            num_blocks,
            id,
            driver: Mutex::new(driver),
            orders,
            event_idx: AtomicBool::new(false),
            mem: Mutex::new(None),
        }))
    }

    /// The shape with the disk's current size: requests are checked, and the config space
    /// answered, against the size after the latest swap.
    fn shape(&self) -> Shape {
        Shape {
            num_blocks: self.0.num_blocks.load(Ordering::Acquire),
            ..self.0.shape
        }
    }

    fn memory(&self) -> Option<Arc<Mem>> {
        let mem = self.0.mem.lock().unwrap_or_else(PoisonError::into_inner);
        mem.as_ref().map(|m| m.memory().into_inner())
    }

    fn send(&self, job: Job) -> io::Result<()> {
        let driver = self.0.driver.lock().unwrap_or_else(PoisonError::into_inner);
        driver
            .send(ToDriver::Job(job))
            .map_err(|_| io::Error::other("the export's driver thread has stopped"))
    }

    /// Takes every available request off `vring` and sends it to the driver.
    fn process(&self, vring: &Vring, order: &Arc<QueueOrder>) -> io::Result<()> {
        let Some(mem) = self.memory() else {
            return Ok(());
        };
        let chains: Vec<_> = vring
            .get_mut()
            .get_queue_mut()
            .iter(mem.clone())
            .map_err(|e| io::Error::other(format!("reading the available ring: {e}")))?
            .collect();
        for chain in chains {
            let head = chain.head_index();
            let descs: Vec<blk::Desc> = chain
                .map(|d| blk::Desc {
                    addr: d.addr().0,
                    len: d.len(),
                    write_only: d.is_write_only(),
                })
                .collect();
            let seq = order.register();
            let (status, works) = self.decode(&mem, &descs);
            // A request of several ranges is answered once every range's device request is.
            let parts = (works.len() > 1).then(|| Arc::new(Parts::new(works.len())));
            for work in works {
                self.send(Job {
                    vring: vring.clone(),
                    order: order.clone(),
                    seq,
                    head,
                    mem: mem.clone(),
                    status,
                    parts: parts.clone(),
                    work,
                })?;
            }
        }
        Ok(())
    }

    /// The status byte's address and the work of one chain (one item per device request).
    fn decode(&self, mem: &Mem, descs: &[blk::Desc]) -> (Option<GuestAddress>, Vec<Work>) {
        let refuse = |status| vec![Work::Answer { status, written: 1 }];
        let segs = |d: &[blk::Desc]| -> Vec<Seg> {
            d.iter()
                .map(|d| Seg {
                    addr: GuestAddress(d.addr),
                    len: d.len,
                })
                .collect()
        };
        let chain = match blk::split_chain(descs) {
            Ok(chain) => chain,
            Err(status) => {
                let answer = match status {
                    Some(_) => refuse(STATUS_IOERR),
                    None => vec![Work::Answer {
                        status: STATUS_IOERR,
                        written: 0,
                    }],
                };
                return (status.map(GuestAddress), answer);
            }
        };
        let status = Some(GuestAddress(chain.status));
        let readable = segs(&chain.readable);
        let mut writable = segs(&chain.writable);
        let mut header = [0u8; HEADER_LEN];
        if !gather(mem, &readable, 0, &mut header) {
            return (status, refuse(STATUS_IOERR));
        }
        let mut ranges = vec![0u8; blk::ranges_len(&header, chain.out_len)];
        if !gather(mem, &readable, HEADER_LEN as u64, &mut ranges) {
            return (status, refuse(STATUS_IOERR));
        }
        let shape = &self.shape();
        let cmd = blk::decode(shape, &header, chain.out_len, chain.in_len, &ranges);
        let work = match cmd {
            Err(st) => refuse(st),
            Ok(Command::Read { lba, blocks }) => vec![Work::Read {
                lba,
                blocks,
                into: std::mem::take(&mut writable),
            }],
            Ok(Command::Write { lba, blocks }) => {
                // A first step: the data is copied into a kura buffer rather than handed to the
                // device in place in guest memory.
                let mut buf = driver::alloc((blocks * u64::from(shape.block_size)) as usize);
                if gather(mem, &readable, HEADER_LEN as u64, &mut buf) {
                    vec![Work::Write { lba, blocks, buf }]
                } else {
                    refuse(STATUS_IOERR)
                }
            }
            Ok(Command::Flush) => vec![Work::Flush],
            Ok(Command::GetId) => {
                let n = (chain.in_len as usize).min(self.0.id.len());
                if scatter(mem, &writable, &self.0.id[..n]) {
                    vec![Work::Answer {
                        status: STATUS_OK,
                        written: n as u32 + 1,
                    }]
                } else {
                    refuse(STATUS_IOERR)
                }
            }
            Ok(Command::Discard(ranges)) => ranges
                .into_iter()
                .map(|(lba, blocks)| Work::Discard { lba, blocks })
                .collect(),
            Ok(Command::WriteZeroes(ranges)) => ranges
                .into_iter()
                .map(|(lba, blocks)| Work::WriteZeroes { lba, blocks })
                .collect(),
        };
        (status, work)
    }
}

impl VhostUserBackend for Backend {
    type Bitmap = ();
    type Vring = Vring;

    fn num_queues(&self) -> usize {
        usize::from(self.0.shape.num_queues)
    }

    fn max_queue_size(&self) -> usize {
        usize::from(MAX_QUEUE_SIZE)
    }

    fn features(&self) -> u64 {
        self.0.shape.features() | VhostUserVirtioFeatures::PROTOCOL_FEATURES.bits()
    }

    fn protocol_features(&self) -> VhostUserProtocolFeatures {
        VhostUserProtocolFeatures::CONFIG | VhostUserProtocolFeatures::MQ
    }

    fn set_event_idx(&self, enabled: bool) {
        self.0.event_idx.store(enabled, Ordering::Relaxed);
    }

    fn get_config(&self, offset: u32, size: u32) -> Vec<u8> {
        let config = self.shape().config();
        let start = (offset as usize).min(config.len());
        let end = start.saturating_add(size as usize).min(config.len());
        let mut out = config[start..end].to_vec();
        // Bytes past what kura fills (fields of newer spec versions) read as zero.
        out.resize(size as usize, 0);
        out
    }

    fn update_memory(&self, mem: GuestMemoryAtomic<Mem>) -> io::Result<()> {
        *self.0.mem.lock().unwrap_or_else(PoisonError::into_inner) = Some(mem);
        Ok(())
    }

    fn queues_per_thread(&self) -> Vec<u64> {
        (0..self.0.shape.num_queues).map(|q| 1u64 << q).collect()
    }

    fn exit_event(&self, _thread_index: usize) -> Option<(EventConsumer, EventNotifier)> {
        new_event_consumer_and_notifier(EventFlag::NONBLOCK).ok()
    }

    fn stop_vring(&self, queue_index: u32) -> io::Result<()> {
        // QEMU reads the ring's position next; answer what was taken off it first.
        if let Some(order) = self.0.orders.get(queue_index as usize) {
            order.wait_idle(crate::DRAIN_WAIT);
        }
        Ok(())
    }

    fn handle_event(
        &self,
        device_event: u16,
        evset: EventSet,
        vrings: &[Vring],
        thread_id: usize,
    ) -> io::Result<()> {
        if evset != EventSet::IN {
            return Err(io::Error::other(format!("unexpected event {evset:?}")));
        }
        // One virtqueue per thread: the thread's index is the queue's.
        let (Some(vring), Some(order)) = (
            vrings.get(usize::from(device_event)),
            self.0.orders.get(thread_id),
        ) else {
            return Err(io::Error::other(format!("no virtqueue {thread_id}")));
        };
        if !self.0.event_idx.load(Ordering::Relaxed) {
            return self.process(vring, order);
        }
        loop {
            vring
                .disable_notification()
                .map_err(|e| io::Error::other(e.to_string()))?;
            self.process(vring, order)?;
            let more = vring
                .enable_notification()
                .map_err(|e| io::Error::other(e.to_string()))?;
            if !more {
                return Ok(());
            }
        }
    }
}
