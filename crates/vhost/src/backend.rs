//! The vhost-user side of one connection: what `vhost-user-backend` asks of a device (features,
//! configuration space, queues) and the per-virtqueue work: take each descriptor chain off the
//! available ring, decode it, copy write data out of guest memory into a kura buffer and hand
//! the request to the export's driver thread. One thread per virtqueue (`queues_per_thread`);
//! queues the guest never enables stay idle in their thread's epoll.

use crate::blk::{self, Command, Shape, HEADER_LEN, RANGE_LEN, STATUS_IOERR, STATUS_OK};
use crate::driver::{self, gather, scatter, Job, Mem, QueueOrder, Seg, ToDriver, Vring, Work};
use std::io;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::Sender;
use std::sync::{Arc, Mutex, PoisonError};
use vhost::vhost_user::message::{VhostUserProtocolFeatures, VhostUserVirtioFeatures};
use vhost_user_backend::{VhostUserBackend, VringT};
use virtio_queue::QueueOwnedT;
use vm_memory::{GuestAddressSpace, GuestMemoryAtomic};
use vmm_sys_util::epoll::EventSet;
use vmm_sys_util::event::{
    new_event_consumer_and_notifier, EventConsumer, EventFlag, EventNotifier,
};

/// Descriptors per virtqueue the backend accepts (QEMU asks for 128 by default).
pub(crate) const MAX_QUEUE_SIZE: u16 = 1024;

struct Inner {
    shape: Shape,
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
        id: [u8; 20],
        driver: Sender<ToDriver>,
        orders: Vec<Arc<QueueOrder>>,
    ) -> Backend {
        Backend(Arc::new(Inner {
            shape,
            id,
            driver: Mutex::new(driver),
            orders,
            event_idx: AtomicBool::new(false),
            mem: Mutex::new(None),
        }))
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
            let mut readable = Vec::new();
            let mut writable = Vec::new();
            let mut malformed = false;
            for desc in chain {
                let seg = Seg {
                    addr: desc.addr(),
                    len: desc.len(),
                };
                if desc.is_write_only() {
                    writable.push(seg);
                } else if writable.is_empty() {
                    readable.push(seg);
                } else {
                    // The spec puts every device-readable descriptor before the writable ones.
                    malformed = true;
                }
            }
            let seq = order.register();
            let (status, work) = self.decode(&mem, &readable, &mut writable, malformed);
            self.send(Job {
                vring: vring.clone(),
                order: order.clone(),
                seq,
                head,
                mem: mem.clone(),
                status,
                work,
            })?;
        }
        Ok(())
    }

    /// The status byte's address and the work of one chain.
    fn decode(
        &self,
        mem: &Mem,
        readable: &[Seg],
        writable: &mut Vec<Seg>,
        malformed: bool,
    ) -> (Option<vm_memory::GuestAddress>, Work) {
        let refuse = |status| Work::Answer { status, written: 1 };
        // The status byte is the last byte the guest left writable.
        let status = match writable.last_mut() {
            Some(last) if last.len > 0 => {
                last.len -= 1;
                let addr = vm_memory::GuestAddress(last.addr.0.wrapping_add(u64::from(last.len)));
                if last.len == 0 {
                    writable.pop();
                }
                addr
            }
            _ => {
                return (
                    None,
                    Work::Answer {
                        status: STATUS_IOERR,
                        written: 0,
                    },
                )
            }
        };
        if malformed {
            return (Some(status), refuse(STATUS_IOERR));
        }
        let out_total: u64 = readable.iter().map(|s| u64::from(s.len)).sum();
        let in_len: u64 = writable.iter().map(|s| u64::from(s.len)).sum();
        let mut header = [0u8; HEADER_LEN];
        if !gather(mem, readable, 0, &mut header) {
            return (Some(status), refuse(STATUS_IOERR));
        }
        let out_len = out_total - HEADER_LEN as u64;
        let mut range = [0u8; RANGE_LEN];
        let have_range =
            out_len >= RANGE_LEN as u64 && gather(mem, readable, HEADER_LEN as u64, &mut range);
        let shape = &self.0.shape;
        let cmd = blk::decode(
            shape,
            &header,
            out_len,
            in_len,
            have_range.then_some(&range),
        );
        let work = match cmd {
            Err(st) => refuse(st),
            Ok(Command::Read { lba, blocks }) => Work::Read {
                lba,
                blocks,
                into: std::mem::take(writable),
            },
            Ok(Command::Write { lba, blocks }) => {
                // A first step: the data is copied into a kura buffer rather than handed to the
                // device in place in guest memory.
                let mut buf = driver::alloc((blocks * u64::from(shape.block_size)) as usize);
                if gather(mem, readable, HEADER_LEN as u64, &mut buf) {
                    Work::Write { lba, blocks, buf }
                } else {
                    refuse(STATUS_IOERR)
                }
            }
            Ok(Command::Flush) => Work::Flush,
            Ok(Command::GetId) => {
                let n = (in_len as usize).min(self.0.id.len());
                if scatter(mem, writable, &self.0.id[..n]) {
                    Work::Answer {
                        status: STATUS_OK,
                        written: n as u32 + 1,
                    }
                } else {
                    refuse(STATUS_IOERR)
                }
            }
            Ok(Command::Discard { lba, blocks }) => Work::Discard { lba, blocks },
            Ok(Command::WriteZeroes { lba, blocks }) => Work::WriteZeroes { lba, blocks },
        };
        (Some(status), work)
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
        let config = self.0.shape.config();
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
