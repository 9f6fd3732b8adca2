//! The vhost-user side of one connection: what `vhost-user-backend` asks of a device (features,
//! configuration space, queues) and the per-virtqueue work: take each descriptor chain off the
//! available ring, decode it, hand write data to the device in place in guest memory when it is
//! one aligned descriptor ([`crate::zerocopy`]) or else copy it into a kura buffer, and hand
//! the request to the export's driver thread (a discard or write-zeroes of several ranges as one
//! device request per range). One thread per virtqueue (`queues_per_thread`): vhost-user-backend
//! starts them all when the connection opens, before the guest says which queues it enables, so
//! queues it never enables keep an idle thread in epoll.

use crate::blk::{self, Command, Shape, HEADER_LEN, STATUS_IOERR, STATUS_OK};
use crate::driver::{
    self, gather, scatter, Job, Mem, Parts, QueueOrder, Seg, ToDriver, Vring, Work, ZeroCopy,
};
use crate::zerocopy::Counters;
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
    zero_copy: ZeroCopy,
    /// The device's buffer alignment when the export started; the driver checks a swapped
    /// device's again.
    align: u32,
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
        zero_copy: ZeroCopy,
        align: u32,
    ) -> Backend {
        Backend(Arc::new(Inner {
            shape,
            num_blocks,
            id,
            driver: Mutex::new(driver),
            orders,
            event_idx: AtomicBool::new(false),
            mem: Mutex::new(None),
            zero_copy,
            align,
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
    fn decode(&self, mem: &Arc<Mem>, descs: &[blk::Desc]) -> (Option<GuestAddress>, Vec<Work>) {
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
                in_place: None,
            }],
            Ok(Command::Write { lba, blocks }) => {
                let len = (blocks * u64::from(shape.block_size)) as usize;
                let zero_copy = &self.0.zero_copy;
                let counters = &zero_copy.counters;
                let direct =
                    zero_copy.in_place(mem, &readable, HEADER_LEN as u64, len, self.0.align);
                if let Some(buf) = direct {
                    Counters::count(&counters.zero_copy_writes);
                    return (status, vec![Work::Write { lba, blocks, buf }]);
                }
                Counters::count(&counters.copied_writes);
                let mut buf = driver::alloc(len);
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

/// A virtqueue in guest memory built by hand, fed to [`Backend::process`] and answered by a
/// driver thread on a real device: the whole request path without a hypervisor.
#[cfg(test)]
mod tests {
    use super::*;
    use crate::zerocopy::Counters;
    use kura_engine::BlockDevice;
    use kura_engine::Request;
    use std::sync::atomic::AtomicU64;
    use std::sync::Mutex;
    use std::time::{Duration, Instant};
    use vm_memory::{Bytes, GuestMemoryMmap};

    const QSIZE: u16 = 128;
    const DESC: u64 = 0x0;
    const AVAIL: u64 = 0x1000;
    const USED: u64 = 0x2000;
    const HEADERS: u64 = 0x3000;
    const STATUS: u64 = 0x3800;
    const NEXT: u16 = 1;
    const WRITE: u16 = 2;

    /// One guest request: its data buffers (guest address, length) and header.
    struct Req {
        write: bool,
        sector: u64,
        /// Data descriptors; the header shares the first one when `header_inline`.
        data: Vec<(u64, u32)>,
        header_inline: bool,
    }

    struct Guest {
        mem: GuestMemoryAtomic<Mem>,
        next_desc: u16,
        avail_idx: u16,
        heads: Vec<u16>,
    }

    impl Guest {
        fn new(bytes: usize) -> Guest {
            let mem = GuestMemoryMmap::<()>::from_ranges(&[(GuestAddress(0), bytes)]).unwrap();
            Guest {
                mem: GuestMemoryAtomic::new(mem),
                next_desc: 0,
                avail_idx: 0,
                heads: Vec::new(),
            }
        }

        fn m(&self) -> Arc<Mem> {
            self.mem.memory().into_inner()
        }

        fn desc(&mut self, addr: u64, len: u32, flags: u16) -> u16 {
            let i = self.next_desc;
            self.next_desc += 1;
            let mut d = [0u8; 16];
            d[..8].copy_from_slice(&addr.to_le_bytes());
            d[8..12].copy_from_slice(&len.to_le_bytes());
            d[12..14].copy_from_slice(&flags.to_le_bytes());
            d[14..16].copy_from_slice(&(i + 1).to_le_bytes());
            self.m()
                .write_slice(&d, GuestAddress(DESC + 16 * u64::from(i)))
                .unwrap();
            i
        }

        /// Puts `req` on the available ring.
        fn push(&mut self, req: &Req) {
            // Header and status slots are reused once a batch of up to 128 is answered.
            let n = self.heads.len() as u64 % 128;
            let header = HEADERS + 16 * n;
            let mut h = [0u8; 16];
            h[..4].copy_from_slice(&(u32::from(req.write)).to_le_bytes());
            h[8..].copy_from_slice(&req.sector.to_le_bytes());
            let data_flags = NEXT | if req.write { 0 } else { WRITE };
            let head = if req.header_inline {
                let (addr, len) = req.data[0];
                assert!(req.write, "an inline header only in a write");
                self.m().write_slice(&h, GuestAddress(addr - 16)).unwrap();
                self.desc(addr - 16, len + 16, NEXT)
            } else {
                self.m().write_slice(&h, GuestAddress(header)).unwrap();
                let head = self.desc(header, 16, NEXT);
                let (addr, len) = req.data[0];
                self.desc(addr, len, data_flags);
                head
            };
            for &(addr, len) in &req.data[1..] {
                self.desc(addr, len, data_flags);
            }
            self.m()
                .write_obj(0xffu8, GuestAddress(STATUS + n))
                .unwrap();
            self.desc(STATUS + n, 1, WRITE);
            let slot = AVAIL + 4 + 2 * u64::from(self.avail_idx % QSIZE);
            self.m().write_obj(head, GuestAddress(slot)).unwrap();
            self.avail_idx += 1;
            self.m()
                .write_obj(self.avail_idx, GuestAddress(AVAIL + 2))
                .unwrap();
            self.heads.push(head);
        }

        fn status(&self, n: usize) -> u8 {
            self.m().read_obj(GuestAddress(STATUS + n as u64)).unwrap()
        }

        fn used_idx(&self) -> u16 {
            self.m().read_obj(GuestAddress(USED + 2)).unwrap()
        }
    }

    fn fill(mem: &Mem, addr: u64, len: u32, seed: u8) -> Vec<u8> {
        let data: Vec<u8> = (0..len).map(|i| (i % 253) as u8 ^ seed).collect();
        mem.write_slice(&data, GuestAddress(addr)).unwrap();
        data
    }

    fn read(mem: &Mem, addr: u64, len: u32) -> Vec<u8> {
        let mut out = vec![0u8; len as usize];
        mem.read_slice(&mut out, GuestAddress(addr)).unwrap();
        out
    }

    /// A backend and its driver thread on a device, with one virtqueue in a fresh guest memory.
    struct Rig {
        backend: Backend,
        vring: Vring,
        order: Arc<QueueOrder>,
        guest: Guest,
        driver: std::thread::JoinHandle<Box<dyn BlockDevice>>,
        counters: Arc<Counters>,
        align: u32,
    }

    impl Rig {
        fn new(spec: &str, zero_copy: bool, guest_bytes: usize) -> Option<Rig> {
            match kura_engine::open(spec) {
                Ok(dev) => Some(Rig::with_device(dev, zero_copy, guest_bytes)),
                Err(e @ kura_engine::OpenError::Unavailable { .. }) => {
                    eprintln!("SKIP {spec}: {e}");
                    None
                }
                Err(e) => panic!("{spec}: {e}"),
            }
        }

        fn with_device(dev: Box<dyn BlockDevice>, zero_copy: bool, guest_bytes: usize) -> Rig {
            let geo = dev.geometry();
            let counters = Arc::new(Counters::default());
            let zc = ZeroCopy::new(zero_copy, counters.clone());
            let (tx, rx) = std::sync::mpsc::channel();
            let driver = {
                let zc = zc.clone();
                std::thread::spawn(move || driver::run(dev, rx, zc))
            };
            let order = Arc::new(QueueOrder::default());
            let backend = Backend::new(
                blk::Shape::new(&geo, false, 1),
                Arc::new(AtomicU64::new(geo.num_blocks)),
                [0; 20],
                tx,
                vec![order.clone()],
                zc,
                geo.buffer_alignment,
            );
            let guest = Guest::new(guest_bytes);
            backend.update_memory(guest.mem.clone()).unwrap();
            let vring = Vring::new(guest.mem.clone(), QSIZE).unwrap();
            vring.set_queue_size(QSIZE);
            vring
                .set_queue_info(DESC, AVAIL, USED)
                .expect("queue addresses");
            vring.set_queue_ready(true);
            Rig {
                backend,
                vring,
                order,
                guest,
                driver,
                counters,
                align: geo.buffer_alignment,
            }
        }

        /// Hands every request pushed so far to the backend and waits until all are answered
        /// and on the used ring.
        fn run(&mut self) {
            self.backend.process(&self.vring, &self.order).unwrap();
            assert!(self.order.wait_idle(Duration::from_secs(30)), "answered");
            // The used ring is written just after the order records the last answer.
            let want = self.guest.avail_idx;
            let deadline = std::time::Instant::now() + Duration::from_secs(10);
            while self.guest.used_idx() != want && std::time::Instant::now() < deadline {
                std::thread::yield_now();
            }
            assert_eq!(self.guest.used_idx(), want);
            self.guest.next_desc = 0;
        }

        /// Stops the driver; [zero-copy writes, copied writes, zero-copy reads, copied reads].
        fn finish(self) -> [u64; 4] {
            let Rig {
                backend,
                vring,
                driver,
                counters,
                ..
            } = self;
            drop((backend, vring));
            drop(driver.join().unwrap());
            let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
            [
                get(&counters.zero_copy_writes),
                get(&counters.copied_writes),
                get(&counters.zero_copy_reads),
                get(&counters.copied_reads),
            ]
        }
    }

    /// Writes and reads back three shapes of request on `spec`: data in one aligned
    /// descriptor, data split over two, and data behind an inline header (16 bytes off a page).
    /// Returns the device's buffer alignment and the counters.
    fn round_trip(spec: &str, zero_copy: bool) -> Option<(u32, [u64; 4])> {
        let mut rig = Rig::new(spec, zero_copy, 1 << 20)?;
        let mem = rig.guest.m();
        // Data at 0x10000 (one page), 0x20000 + 0x30000 (two halves), 0x40010 (inline header).
        let a = fill(&mem, 0x10000, 4096, 1);
        let mut b = fill(&mem, 0x20000, 2048, 2);
        b.extend(fill(&mem, 0x30000, 2048, 3));
        let c = fill(&mem, 0x40010, 4096, 4);
        let shapes = [
            vec![(0x10000, 4096)],
            vec![(0x20000, 2048), (0x30000, 2048)],
            vec![(0x40010, 4096)],
        ];
        for (i, data) in shapes.iter().enumerate() {
            rig.guest.push(&Req {
                write: true,
                sector: 8 * i as u64,
                data: data.clone(),
                header_inline: i == 2,
            });
        }
        rig.run();
        // Read each back into buffers of the same shapes (the third: 16 bytes past a page),
        // fresh memory each.
        let back = [
            vec![(0x50000, 4096)],
            vec![(0x60000, 2048), (0x70000, 2048)],
            vec![(0x80010, 4096)],
        ];
        for (i, data) in back.iter().enumerate() {
            rig.guest.push(&Req {
                write: false,
                sector: 8 * i as u64,
                data: data.clone(),
                header_inline: false,
            });
        }
        rig.run();
        for n in 0..6 {
            assert_eq!(rig.guest.status(n), blk::STATUS_OK, "{spec}: request {n}");
        }
        assert!(read(&mem, 0x50000, 4096) == a, "{spec}: one run read back");
        let mut got = read(&mem, 0x60000, 2048);
        got.extend(read(&mem, 0x70000, 2048));
        assert!(got == b, "{spec}: split read back");
        assert!(
            read(&mem, 0x80010, 4096) == c,
            "{spec}: misaligned read back"
        );
        let align = rig.align;
        Some((align, rig.finish()))
    }

    #[test]
    fn guest_data_goes_in_place_when_one_aligned_descriptor_and_is_copied_otherwise() {
        let dir = tempfile::tempdir().unwrap();
        let specs = [
            "mem:1M".to_string(),
            format!("uring:{}?size=1M", dir.path().join("u.img").display()),
            format!(
                "sync:{}?size=1M&direct=1",
                dir.path().join("s.img").display()
            ),
        ];
        for spec in &specs {
            let Some((align, on)) = round_trip(spec, true) else {
                continue;
            };
            // [zero-copy writes, copied writes, zero-copy reads, copied reads]
            let expected = if align > 16 {
                // The inline header puts the third's data 16 bytes off a page: copied.
                [1, 2, 1, 2]
            } else {
                [2, 1, 2, 1]
            };
            assert_eq!(on, expected, "{spec} (alignment {align})");
            let (_, off) = round_trip(spec, false).unwrap();
            assert_eq!(off, [0, 3, 0, 3], "{spec}: zero copy off copies all");
        }
    }

    /// A device that takes requests and keeps them, and whose queue fails once it holds two:
    /// the failed queue still holds every buffer it was given.
    struct FailingQueue {
        held: Arc<Mutex<Vec<Request>>>,
    }

    impl BlockDevice for FailingQueue {
        fn geometry(&self) -> kura_engine::Geometry {
            kura_engine::Geometry {
                block_size: 512,
                num_blocks: 2048,
                max_transfer: 1 << 20,
                queue_depth: 32,
                buffer_alignment: 4096,
            }
        }
        fn describe(&self) -> String {
            "failing-queue".into()
        }
        fn submit(&mut self, req: Request) -> Result<(), kura_engine::Rejected> {
            self.held.lock().unwrap().push(req);
            Ok(())
        }
        fn ring_doorbell(&mut self) -> kura_engine::DeviceResult<()> {
            Ok(())
        }
        fn poll(
            &mut self,
            _out: &mut Vec<kura_engine::Completion>,
            _min_complete: usize,
        ) -> kura_engine::DeviceResult<usize> {
            // Fails once it holds both of the test's requests, so the driver has decided how
            // each goes (in place or copied) whatever the threads' timing.
            if self.held.lock().unwrap().len() < 2 {
                std::thread::yield_now();
                return Ok(0);
            }
            Err(kura_engine::DeviceError::Offline {
                reason: "the test's queue failed".into(),
            })
        }
        fn in_flight(&self) -> usize {
            self.held.lock().unwrap().len()
        }
    }

    /// When the device's queue fails with requests in flight, a copied read is failed at once
    /// (the device holds only a pool buffer), but a read going in place is left unanswered: the
    /// failed device still holds the guest's buffer and could write it after the guest reused it.
    #[test]
    fn a_failed_queue_never_answers_a_read_whose_guest_buffer_the_device_still_holds() {
        let held = Arc::new(Mutex::new(Vec::new()));
        let dev = Box::new(FailingQueue { held: held.clone() });
        let mut rig = Rig::with_device(dev, true, 1 << 20);
        // First a read split over two descriptors (copied), then one in a single aligned
        // descriptor (in place): answers leave in order, so the first can be answered alone.
        for (i, data) in [
            vec![(0x20000, 2048), (0x30000, 2048)],
            vec![(0x10000, 4096)],
        ]
        .into_iter()
        .enumerate()
        {
            rig.guest.push(&Req {
                write: false,
                sector: 8 * i as u64,
                data,
                header_inline: false,
            });
        }
        rig.backend.process(&rig.vring, &rig.order).unwrap();
        let deadline = Instant::now() + Duration::from_secs(30);
        while rig.guest.used_idx() < 1 && Instant::now() < deadline {
            std::thread::yield_now();
        }
        assert_eq!(rig.guest.used_idx(), 1, "the copied read is answered");
        assert_eq!(rig.guest.status(0), blk::STATUS_IOERR);
        let Rig {
            backend,
            vring,
            driver,
            guest,
            counters,
            ..
        } = rig;
        drop((backend, vring));
        let dev = driver.join().unwrap();
        assert_eq!(
            counters.zero_copy_reads.load(Ordering::Relaxed),
            1,
            "the second read went in place"
        );
        assert_eq!(guest.used_idx(), 1, "the in-place read stays unanswered");
        assert_eq!(guest.status(1), 0xff, "its status byte is untouched");
        assert_eq!(dev.in_flight(), 2, "the device still holds both buffers");
        let borrowed = held
            .lock()
            .unwrap()
            .iter()
            .filter(|r| r.buf.as_ref().is_some_and(|b| b.is_borrowed()))
            .count();
        assert_eq!(borrowed, 1, "one held buffer is guest memory");
    }

    /// A guest may give two requests in flight the same data buffer. Only the first goes in
    /// place; the second is copied (and counted as overlapping), so no two buffers of this
    /// process cover the same guest bytes. The device holds both requests, so the first is
    /// still in flight when the second is decided, whatever the threads' timing.
    #[test]
    fn requests_in_flight_never_share_guest_bytes_in_place() {
        for write in [false, true] {
            let held = Arc::new(Mutex::new(Vec::new()));
            let dev = Box::new(FailingQueue { held: held.clone() });
            let mut rig = Rig::with_device(dev, true, 1 << 20);
            for i in 0..2u64 {
                rig.guest.push(&Req {
                    write,
                    sector: 8 * i,
                    data: vec![(0x10000, 4096)],
                    header_inline: false,
                });
            }
            rig.backend.process(&rig.vring, &rig.order).unwrap();
            let Rig {
                backend,
                vring,
                driver,
                counters,
                ..
            } = rig;
            drop((backend, vring));
            let dev = driver.join().unwrap();
            assert_eq!(dev.in_flight(), 2, "the device holds both requests");
            let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
            let (in_place, copied) = if write {
                (&counters.zero_copy_writes, &counters.copied_writes)
            } else {
                (&counters.zero_copy_reads, &counters.copied_reads)
            };
            assert_eq!(
                (get(in_place), get(copied), get(&counters.overlapping)),
                (1, 1, 1),
                "write={write}: one in place, one copied because it overlapped"
            );
            let borrowed = held
                .lock()
                .unwrap()
                .iter()
                .filter(|r| r.buf.as_ref().is_some_and(|b| b.is_borrowed()))
                .count();
            assert_eq!(
                borrowed, 1,
                "write={write}: one held buffer is guest memory"
            );
        }
    }

    /// The host-side cost of the copy: requests of one size, 32 per batch (each to its own
    /// guest buffer, one aligned descriptor), through backend + driver onto `spec`, zero copy on
    /// and off interleaved. Prints one JSON line per measurement (MiB/s and requests/s), and
    /// writes them all to `KURA_VHOST_ZC_JSON` when set. Nothing is asserted on the figures.
    #[test]
    #[ignore = "a measurement: cargo test --release -p kura-vhost --lib -- --ignored --nocapture zero_copy_cost"]
    fn zero_copy_cost() {
        const BATCH: usize = 32;
        let rounds: usize = std::env::var("KURA_VHOST_ZC_ROUNDS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(5);
        let dir =
            tempfile::tempdir_in(std::env::var("KURA_VHOST_ZC_DIR").unwrap_or(".".into())).unwrap();
        let file = dir.path().join("zc.img");
        let specs = [
            ("null", "null:1G".to_string()),
            (
                "uring-direct",
                format!("uring:{}?size=256M", file.display()),
            ),
        ];
        // Each job moves 128 MiB: 4 KiB requests 32768 times, 1 MiB ones 128 times.
        let jobs = [
            ("read-4k", false, 4096u32),
            ("write-4k", true, 4096),
            ("read-1m", false, 1 << 20),
            ("write-1m", true, 1 << 20),
        ];
        let mut lines = Vec::new();
        for (name, spec) in &specs {
            for &(job, write, bs) in &jobs {
                for round in 0..rounds {
                    let order = if round % 2 == 0 {
                        [true, false]
                    } else {
                        [false, true]
                    };
                    for zc in order {
                        let Some(mut rig) = Rig::new(spec, zc, 64 << 20) else {
                            return;
                        };
                        let total: u64 = 128 << 20;
                        let requests = (total / u64::from(bs)) as usize;
                        let sectors = u64::from(bs) / 512;
                        let span = (256u64 << 20) / u64::from(bs);
                        let start = std::time::Instant::now();
                        let mut done = 0;
                        while done < requests {
                            for i in 0..BATCH.min(requests - done) {
                                let slot = (done + i) % BATCH;
                                rig.guest.push(&Req {
                                    write,
                                    sector: ((done + i) as u64 * 7919 % span) * sectors,
                                    data: vec![(0x100000 + slot as u64 * u64::from(bs), bs)],
                                    header_inline: false,
                                });
                            }
                            rig.run();
                            done += BATCH.min(requests - done);
                        }
                        let secs = start.elapsed().as_secs_f64();
                        let counters = rig.finish();
                        let line = format!(
                            "{{\"device\":\"{name}\",\"job\":\"{job}\",\"round\":{round},\"zero_copy\":{zc},\"requests\":{requests},\"secs\":{secs:.4},\"mib_s\":{:.1},\"iops\":{:.0},\"counters\":{counters:?}}}",
                            (total as f64 / (1 << 20) as f64) / secs,
                            requests as f64 / secs
                        );
                        println!("{line}");
                        lines.push(line);
                    }
                }
            }
        }
        if let Ok(path) = std::env::var("KURA_VHOST_ZC_JSON") {
            std::fs::write(path, format!("[\n{}\n]\n", lines.join(",\n"))).unwrap();
        }
    }
}
