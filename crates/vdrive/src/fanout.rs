//! The queue machinery every multi-child drive shares: it owns the child devices ("legs"), the
//! caller's requests while their pieces are in flight, and the completions waiting for `poll`.
//!
//! A drive admits a caller's request as a *parent*, sends any number of *pieces* of it to its legs
//! with [`Fanout::send`], and decides in its completion handler what each finished piece means.
//! Pieces carry tags of their own, so legs may complete them in any order. A leg that refuses a
//! piece with `QueueFull` keeps it in a per-leg backlog that is retried on every call, so a drive
//! never refuses a caller because a child is busy; the caller sees back-pressure only at the
//! drive's own queue depth. A failed flush poisons the drive as the engine contract requires.

use crate::mirror::{LegHealth, LegStatus};
use kura_engine::buffer::POOL_ALIGN;
use kura_engine::poison::FlushPoison;
use kura_engine::{
    BlockDevice, BufferPool, Completion, DeviceError, DeviceResult, DriveStats, Geometry, IoBuf,
    Rejected, Request,
};
use std::collections::{HashMap, VecDeque};

/// One child device and the pieces it has refused for now.
pub(crate) struct Leg {
    pub dev: Box<dyn BlockDevice>,
    backlog: VecDeque<Request>,
}

impl Leg {
    /// Pieces given to this leg and not yet finished.
    pub fn load(&self) -> usize {
        self.dev.in_flight() + self.backlog.len()
    }
}

/// A caller's request while its pieces are in flight.
pub(crate) struct Parent {
    pub req: Request,
    remaining: usize,
    /// Legs whose piece succeeded, in completion order.
    pub ok_legs: Vec<usize>,
    /// Legs whose piece failed, with the error.
    pub failures: Vec<(usize, DeviceError)>,
}

impl Parent {
    /// The first failure, or success.
    pub fn first_status(&mut self) -> DeviceResult<()> {
        match self.failures.drain(..).next() {
            Some((_, e)) => Err(e),
            None => Ok(()),
        }
    }
}

struct PieceSlot<M> {
    parent: usize,
    leg: usize,
    meta: M,
}

/// A finished piece handed to the drive's completion handler.
pub(crate) struct Done<M> {
    pub parent: usize,
    pub leg: usize,
    pub meta: M,
    pub completion: Completion,
}

/// Legs, parents and pieces of one drive.
pub(crate) struct Fanout<M> {
    pub legs: Vec<Leg>,
    parents: HashMap<usize, Parent>,
    next_parent: usize,
    pieces: HashMap<u64, PieceSlot<M>>,
    next_tag: u64,
    /// Pieces a leg refused for a reason other than back-pressure; they finish at the next poll.
    bounced: Vec<Completion>,
    ready: VecDeque<Completion>,
    poison: FlushPoison,
    /// Pieces sent to legs, and of those, how many waited in a leg's backlog.
    pieces_sent: u64,
    backlogged: u64,
}

impl<M> Fanout<M> {
    pub fn new(devs: Vec<Box<dyn BlockDevice>>) -> Self {
        Fanout {
            legs: devs
                .into_iter()
                .map(|dev| Leg {
                    dev,
                    backlog: VecDeque::new(),
                })
                .collect(),
            parents: HashMap::new(),
            next_parent: 0,
            pieces: HashMap::new(),
            next_tag: 1,
            bounced: Vec::new(),
            ready: VecDeque::new(),
            poison: FlushPoison::default(),
            pieces_sent: 0,
            backlogged: 0,
        }
    }

    /// The drive's entry `layer` with the fanout's counters added (caller requests admitted,
    /// pieces sent to legs, pieces that waited in a leg's backlog), then every leg's stack one
    /// level deeper: the body of a fanout drive's [`BlockDevice::stats`].
    pub fn stats(&self, layer: DriveStats, out: &mut Vec<DriveStats>) {
        out.push(
            layer
                .with("requests", self.next_parent as u64)
                .with("pieces", self.pieces_sent)
                .with("backlogged", self.backlogged),
        );
        for leg in &self.legs {
            kura_engine::device::child_stats(&*leg.dev, out);
        }
    }

    /// Caller requests accepted and not yet returned by `poll`.
    pub fn in_flight(&self) -> usize {
        self.parents.len() + self.ready.len()
    }

    /// One leg's device, for inspection; `None` while any request is in flight or when there
    /// is no leg `leg`.
    pub fn idle_leg_mut(&mut self, leg: usize) -> Option<&mut (dyn BlockDevice + 'static)> {
        if self.in_flight() > 0 {
            return None;
        }
        self.legs.get_mut(leg).map(|l| &mut *l.dev)
    }

    /// Every leg's device beside its health and read errors, both indexed by leg.
    pub fn leg_status(&self, health: &[LegHealth], read_errors: &[u64]) -> Vec<LegStatus> {
        self.legs
            .iter()
            .enumerate()
            .map(|(index, l)| LegStatus {
                index,
                device: l.dev.describe(),
                health: health[index].clone(),
                read_errors: read_errors[index],
            })
            .collect()
    }

    /// Admits a caller's request against `geo` and the drive's queue depth. Returns the parent's
    /// id, or `None` when the request was completed at once (the drive is poisoned).
    pub fn admit(&mut self, geo: &Geometry, req: Request) -> Result<Option<usize>, Rejected> {
        let req = req.admit(geo, self.in_flight())?;
        if let Err(e) = self.poison.check(req.op) {
            self.ready.push_back(Completion::of(req, Err(e)));
            return Ok(None);
        }
        let id = self.next_parent;
        self.next_parent = self.next_parent.wrapping_add(1);
        self.parents.insert(
            id,
            Parent {
                req,
                remaining: 0,
                ok_legs: Vec::new(),
                failures: Vec::new(),
            },
        );
        Ok(Some(id))
    }

    pub fn parent_mut(&mut self, id: usize) -> Option<&mut Parent> {
        self.parents.get_mut(&id)
    }

    /// Finishes the caller's request with `status` (observing flush failures for poisoning).
    pub fn complete(&mut self, req: Request, status: DeviceResult<()>) {
        self.poison.observe(req.op, &status);
        self.ready.push_back(Completion::of(req, status));
    }

    /// Finishes parent `id` at once with `status`, with no pieces in flight.
    pub fn complete_parent(&mut self, id: usize, status: DeviceResult<()>) {
        if let Some(p) = self.parents.remove(&id) {
            self.complete(p.req, status);
        }
    }

    /// Sends one piece of parent `id` to `leg`; the piece's tag is assigned here.
    pub fn send(&mut self, id: usize, leg: usize, mut req: Request, meta: M) {
        let Some(parent) = self.parents.get_mut(&id) else {
            return;
        };
        parent.remaining += 1;
        let tag = self.next_tag;
        self.next_tag = self.next_tag.wrapping_add(1);
        req.tag = tag;
        self.pieces_sent += 1;
        self.pieces.insert(
            tag,
            PieceSlot {
                parent: id,
                leg,
                meta,
            },
        );
        let l = &mut self.legs[leg];
        if !l.backlog.is_empty() {
            self.backlogged += 1;
            l.backlog.push_back(req);
            return;
        }
        match l.dev.submit(req) {
            Ok(()) => {}
            Err(r) if matches!(r.error, DeviceError::QueueFull { .. }) => {
                self.backlogged += 1;
                l.backlog.push_back(r.request)
            }
            Err(r) => self.bounced.push(Completion::of(r.request, Err(r.error))),
        }
    }

    /// Sends the whole of parent `id` to `leg`, at `lba` there, as one piece that carries the
    /// parent's own buffer (moved, not copied). The piece's meta is `with_data` when the parent
    /// had a buffer and `without_data` when its command carries none.
    pub fn send_whole(&mut self, id: usize, leg: usize, lba: u64, with_data: M, without_data: M) {
        let Some(parent) = self.parents.get_mut(&id) else {
            return;
        };
        let buf = parent.req.buf.take();
        let meta = if buf.is_some() {
            with_data
        } else {
            without_data
        };
        let req = crate::child_request(parent.req.op, lba, parent.req.blocks, buf);
        self.send(id, leg, req, meta);
    }

    /// Records one finished piece of parent `id`; true when it was the last one in flight.
    pub fn piece_done(&mut self, id: usize, leg: usize, status: DeviceResult<()>) -> bool {
        let Some(p) = self.parents.get_mut(&id) else {
            return false;
        };
        match status {
            Ok(()) => p.ok_legs.push(leg),
            Err(e) => p.failures.push((leg, e)),
        }
        p.remaining = p.remaining.saturating_sub(1);
        p.remaining == 0
    }

    /// Takes parent `id` out once its last piece has finished.
    pub fn take_parent(&mut self, id: usize) -> Option<Parent> {
        self.parents.remove(&id)
    }

    /// Retries every leg's backlog in order, stopping at a leg that is still full.
    fn pump(&mut self) {
        for l in &mut self.legs {
            while let Some(req) = l.backlog.pop_front() {
                match l.dev.submit(req) {
                    Ok(()) => {}
                    Err(r) if matches!(r.error, DeviceError::QueueFull { .. }) => {
                        l.backlog.push_front(r.request);
                        break;
                    }
                    Err(r) => self.bounced.push(Completion::of(r.request, Err(r.error))),
                }
            }
        }
    }

    /// Rings every leg and gathers finished pieces; with `wait`, blocks until at least one piece
    /// has finished. An error means a leg's queue itself broke.
    fn collect(&mut self, wait: bool) -> DeviceResult<Vec<Done<M>>> {
        self.pump();
        for l in &mut self.legs {
            if l.dev.in_flight() > 0 {
                l.dev.ring_doorbell()?;
            }
        }
        let mut got = std::mem::take(&mut self.bounced);
        for l in &mut self.legs {
            if l.dev.in_flight() > 0 {
                l.dev.poll(&mut got, 0)?;
            }
        }
        if got.is_empty() && wait {
            match self.legs.iter_mut().find(|l| l.dev.in_flight() > 0) {
                Some(l) => {
                    l.dev.poll(&mut got, 1)?;
                }
                None => return Err(crate::lost_track("a virtual drive")),
            }
        }
        self.pump();
        Ok(got
            .into_iter()
            .filter_map(|completion| {
                let slot = self.pieces.remove(&completion.tag)?;
                Some(Done {
                    parent: slot.parent,
                    leg: slot.leg,
                    meta: slot.meta,
                    completion,
                })
            })
            .collect())
    }

    /// The body of a drive's `poll`: finishes pieces with `on_done` until `min_complete` caller
    /// requests (clamped to those in flight) have been moved to `out`.
    pub fn poll_with(
        &mut self,
        out: &mut Vec<Completion>,
        min_complete: usize,
        mut on_done: impl FnMut(&mut Self, Done<M>),
    ) -> DeviceResult<usize> {
        let target = min_complete.min(self.in_flight());
        let mut n = 0;
        loop {
            if !self.parents.is_empty() {
                let wait = n + self.ready.len() < target;
                for done in self.collect(wait)? {
                    on_done(self, done);
                }
            }
            n += self.ready.len();
            out.extend(self.ready.drain(..));
            if n >= target {
                return Ok(n);
            }
        }
    }

    /// Rings every leg that has work.
    pub fn ring(&mut self) -> DeviceResult<()> {
        self.pump();
        for l in &mut self.legs {
            if l.dev.in_flight() > 0 {
                l.dev.ring_doorbell()?;
            }
        }
        Ok(())
    }
}

/// An aligned scratch buffer for a piece's share of a caller's data.
pub(crate) fn scratch(len: usize) -> IoBuf {
    BufferPool::global()
        .alloc(len)
        .unwrap_or_else(|_| IoBuf::heap(len, POOL_ALIGN))
}

/// The geometry of a drive over `legs`: their common block size, the smallest max transfer,
/// the largest queue depth and alignment, and `num_blocks` of its own.
pub(crate) fn combined_geometry(legs: &[Geometry], num_blocks: u64) -> Geometry {
    Geometry {
        block_size: legs.first().map_or(4096, |g| g.block_size),
        num_blocks,
        max_transfer: legs.iter().map(|g| g.max_transfer).min().unwrap_or(1 << 20),
        queue_depth: legs
            .iter()
            .map(|g| g.queue_depth)
            .max()
            .unwrap_or(128)
            .min(kura_engine::device::MAX_QUEUE_DEPTH),
        buffer_alignment: legs.iter().map(|g| g.buffer_alignment).max().unwrap_or(1),
    }
}

/// The [`BlockDevice`](kura_engine::BlockDevice) methods of a drive built on a [`Fanout`], which
/// every such drive would otherwise write out the same way: `submit` admits the request as a
/// parent and hands its id to the drive's `fn dispatch(&mut self, id: usize)`, `ring_doorbell`
/// rings every leg that has work, and `in_flight` is the fanout's. Goes inside the
/// `impl BlockDevice` block of a drive with the fields `fan` (its [`Fanout`]) and `geo` (its
/// geometry): `fanout_methods!();`. The drive writes `geometry`, `describe` and `poll` itself.
/// `stats` reports the drive (its kind taken from `describe`) with the fanout's counters, then
/// every leg; with `fanout_methods!(stats = layer)` the drive's `fn layer(&self) -> DriveStats`
/// names its kind and adds counters of its own.
macro_rules! fanout_methods {
    () => {
        crate::fanout::fanout_methods!(@queue);

        fn stats(&self, out: &mut Vec<kura_engine::DriveStats>) {
            let describe = kura_engine::BlockDevice::describe(self);
            let kind = crate::fanout::kind_of(&describe);
            self.fan.stats(kura_engine::DriveStats::new(kind), out);
        }
    };
    (stats = $layer:ident) => {
        crate::fanout::fanout_methods!(@queue);

        fn stats(&self, out: &mut Vec<kura_engine::DriveStats>) {
            self.fan.stats(self.$layer(), out);
        }
    };
    (@queue) => {
        fn submit(&mut self, req: kura_engine::Request) -> Result<(), kura_engine::Rejected> {
            if let Some(id) = self.fan.admit(&self.geo, req)? {
                self.dispatch(id);
            }
            Ok(())
        }

        fn ring_doorbell(&mut self) -> kura_engine::DeviceResult<()> {
            self.fan.ring()
        }

        fn in_flight(&self) -> usize {
            self.fan.in_flight()
        }
    };
}
pub(crate) use fanout_methods;

/// The kind at the head of a spec-like description: `placed` of `placed(a,b)?map=..`.
pub(crate) fn kind_of(describe: &str) -> &str {
    describe
        .split(['(', ':', '?', ' '])
        .next()
        .unwrap_or(describe)
}
