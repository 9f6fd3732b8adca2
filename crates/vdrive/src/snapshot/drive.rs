//! [`SnapshotDrive`]: one version of a snapshot drive as a block device — the writable head, a
//! writable clone, or a read-only view pinned to a snapshot. Every handle shares the volume's
//! child; each keeps its own requests and gets its own completions back.

use super::volume::{Core, Handback, Route, UNMAPPED};
use kura_engine::{
    BlockDevice, Completion, DeviceError, DeviceResult, Geometry, Opcode, Rejected, Request,
};
use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};

pub(crate) type Shared = Arc<Mutex<Core>>;

/// Locks the volume; a panic in another handle leaves state that is still consistent between
/// calls, so the lock is taken over rather than refused.
pub(crate) fn lock(core: &Shared) -> MutexGuard<'_, Core> {
    core.lock().unwrap_or_else(|p| p.into_inner())
}

struct Parent {
    req: Request,
    remaining: usize,
    status: DeviceResult<()>,
}

/// One version of a snapshot drive as a [`BlockDevice`].
pub struct SnapshotDrive {
    core: Shared,
    handle: u64,
    version: u64,
    name: String,
    writable: bool,
    geo: Geometry,
    child_name: String,
    queued: VecDeque<Request>,
    parents: HashMap<u64, Parent>,
    next_parent: u64,
    ready: Vec<Completion>,
    accepted: usize,
}

impl SnapshotDrive {
    /// A handle on version `vi` of the volume (whose counts the caller has already taken).
    pub(crate) fn new(core: Shared, core_ref: &mut Core, vi: usize, writable: bool) -> Self {
        let cgeo = core_ref.child.geometry();
        let handle = core_ref.new_handle();
        let v = &core_ref.versions[vi];
        SnapshotDrive {
            handle,
            version: v.id,
            name: v.name.clone(),
            writable,
            geo: Geometry {
                num_blocks: core_ref.sb.virtual_blocks,
                ..cgeo
            },
            child_name: core_ref.child.describe(),
            queued: VecDeque::new(),
            parents: HashMap::new(),
            next_parent: 1,
            ready: Vec::new(),
            accepted: 0,
            core,
        }
    }

    /// The version this handle reads (and writes, unless read-only).
    pub fn version_name(&self) -> &str {
        &self.name
    }

    /// True for the head and clones; false for a snapshot view.
    pub fn is_writable(&self) -> bool {
        self.writable
    }

    /// The volume this handle belongs to, for snapshot, rollback, clone and delete.
    pub fn volume(&self) -> super::SnapshotVolume {
        super::SnapshotVolume {
            core: self.core.clone(),
        }
    }

    fn finish(&mut self, req: Request, status: DeviceResult<()>) {
        self.ready.push(Completion::of(req, status));
    }

    /// Turns queued requests into child commands.
    fn dispatch(&mut self, core: &mut Core) {
        while let Some(req) = self.queued.pop_front() {
            let Some(vi) = core.version_index(self.version) else {
                let err = DeviceError::Offline {
                    reason: format!("version `{}` was deleted", self.name),
                };
                self.finish(req, Err(err));
                continue;
            };
            if req.op.is_mutation() {
                let check = if self.writable {
                    core.poison.check(req.op)
                } else if req.op == Opcode::Flush {
                    Ok(())
                } else {
                    Err(DeviceError::Unsupported {
                        op: req.op,
                        backend: "a read-only snapshot view",
                    })
                };
                if let Err(e) = check {
                    self.finish(req, Err(e));
                    continue;
                }
            }
            let id = self.next_parent;
            self.next_parent += 1;
            let route = Route {
                handle: self.handle,
                parent: id,
                handback: Handback::Nothing,
            };
            let (op, lba, blocks) = (req.op, req.lba, req.blocks);
            self.parents.insert(
                id,
                Parent {
                    req,
                    remaining: 0,
                    status: Ok(()),
                },
            );
            let before = core.sent_count();
            let status = match op {
                Opcode::Flush if self.writable => core.commit().map_err(|e| e.into_device(op)),
                Opcode::Flush => Ok(()),
                Opcode::Read => self.read(core, vi, route, lba, blocks),
                _ => self.mutate(core, vi, route, op, lba, blocks),
            };
            let sent = core.sent_count() - before;
            if let Some(p) = self.parents.get_mut(&id) {
                p.remaining += sent as usize;
                if let Err(e) = status {
                    p.status = Err(e);
                }
            }
            self.maybe_complete(id);
        }
    }

    fn maybe_complete(&mut self, id: u64) {
        if self.parents.get(&id).is_some_and(|p| p.remaining == 0) {
            if let Some(p) = self.parents.remove(&id) {
                self.finish(p.req, p.status);
            }
        }
    }

    /// Chunk-sized runs of `blocks` blocks at `lba`: (virtual chunk, offset in it, blocks,
    /// offset in the request).
    fn runs(core: &Core, lba: u64, blocks: u64) -> Vec<(usize, u64, u64, u64)> {
        let cb = core.chunk_blocks();
        let mut out = Vec::new();
        let mut at = lba;
        while at < lba + blocks {
            let off = at % cb;
            let n = (cb - off).min(lba + blocks - at);
            out.push(((at / cb) as usize, off, n, at - lba));
            at += n;
        }
        out
    }

    fn read(
        &mut self,
        core: &mut Core,
        vi: usize,
        route: Route,
        lba: u64,
        blocks: u64,
    ) -> DeviceResult<()> {
        let bs = self.geo.block_size as usize;
        let runs = Self::runs(core, lba, blocks);
        for &(vc, _, _, _) in &runs {
            let pc = core.versions[vi].map[vc];
            if pc != UNMAPPED {
                core.settle(pc)?;
            }
        }
        let Some(parent) = self.parents.get_mut(&route.parent) else {
            return Ok(());
        };
        if let [(vc, off, n, _)] = runs.as_slice() {
            let pc = core.versions[vi].map[*vc];
            if pc != UNMAPPED {
                let buf = parent.req.buf.take();
                let req = crate::child_request(Opcode::Read, core.child_lba(pc, *off), *n, buf);
                core.send(
                    Route {
                        handback: Handback::Whole,
                        ..route
                    },
                    req,
                );
                return Ok(());
            }
        }
        for (vc, off, n, at) in runs {
            let pc = core.versions[vi].map[vc];
            let range = at as usize * bs..(at + n) as usize * bs;
            if pc == UNMAPPED {
                if let Some(buf) = parent.req.buf.as_mut() {
                    buf[range].fill(0);
                }
                continue;
            }
            let buf = crate::fanout::scratch(range.len());
            core.send(
                Route {
                    handback: Handback::Scatter(range.start),
                    ..route
                },
                Request::read(0, core.child_lba(pc, off), n, buf),
            );
        }
        Ok(())
    }

    fn mutate(
        &mut self,
        core: &mut Core,
        vi: usize,
        route: Route,
        op: Opcode,
        lba: u64,
        blocks: u64,
    ) -> DeviceResult<()> {
        let bs = self.geo.block_size as usize;
        let cb = core.chunk_blocks();
        let runs = Self::runs(core, lba, blocks);
        let single = runs.len() == 1;
        for (vc, off, n, at) in runs {
            let data = at as usize * bs..(at + n) as usize * bs;
            if op != Opcode::Write {
                if n == cb {
                    core.unmap(vi, vc)?;
                    continue;
                }
                if core.versions[vi].map[vc] == UNMAPPED {
                    continue;
                }
            }
            let caller = self
                .parents
                .get(&route.parent)
                .and_then(|p| p.req.buf.as_ref());
            let fill = |chunk: &mut [u8]| {
                let dst = &mut chunk[off as usize * bs..(off + n) as usize * bs];
                match caller {
                    Some(src) if op == Opcode::Write => dst.copy_from_slice(&src[data.clone()]),
                    _ => dst.fill(0),
                }
            };
            let Some(pc) = core.own_chunk(vi, vc, route, fill)? else {
                continue;
            };
            let target = core.child_lba(pc, off);
            let req = match op {
                Opcode::Write if single => {
                    let buf = self
                        .parents
                        .get_mut(&route.parent)
                        .and_then(|p| p.req.buf.take());
                    core.send(
                        Route {
                            handback: Handback::Whole,
                            ..route
                        },
                        crate::child_request(op, target, n, buf),
                    );
                    continue;
                }
                Opcode::Write => {
                    let mut buf = crate::fanout::scratch(data.len());
                    if let Some(src) = self
                        .parents
                        .get(&route.parent)
                        .and_then(|p| p.req.buf.as_ref())
                    {
                        buf[..data.len()].copy_from_slice(&src[data.clone()]);
                    }
                    Request::write(0, target, n, buf)
                }
                _ => Request::write_zeroes(0, target, n),
            };
            core.send(route, req);
        }
        Ok(())
    }

    /// Takes this handle's completions from the volume's stash.
    fn collect(&mut self, core: &mut Core) {
        let Some(stash) = core.stash.get_mut(&self.handle) else {
            return;
        };
        let got = std::mem::take(stash);
        for (route, done) in got {
            let Some(p) = self.parents.get_mut(&route.parent) else {
                continue;
            };
            match route.handback {
                Handback::Whole => p.req.buf = done.buf,
                Handback::Scatter(at) => {
                    if let (Ok(()), Some(src), Some(dst)) =
                        (&done.status, done.buf.as_ref(), p.req.buf.as_mut())
                    {
                        let len = src.len().min(dst.len() - at);
                        dst[at..at + len].copy_from_slice(&src[..len]);
                    }
                }
                Handback::Nothing => {}
            }
            if let (Err(e), Ok(())) = (&done.status, &p.status) {
                p.status = Err(e.clone());
            }
            p.remaining = p.remaining.saturating_sub(1);
            self.maybe_complete(route.parent);
        }
    }
}

impl BlockDevice for SnapshotDrive {
    fn geometry(&self) -> Geometry {
        self.geo
    }

    fn describe(&self) -> String {
        let opt = match (self.name.as_str(), self.writable) {
            (super::format::HEAD, _) => String::new(),
            (n, true) => format!("?branch={n}"),
            (n, false) => format!("?at={n}"),
        };
        format!("snapshot({}){opt}", self.child_name)
    }

    /// The volume's space (shared by every version's handle), then its child.
    fn stats(&self, out: &mut Vec<kura_engine::DriveStats>) {
        let core = lock(&self.core);
        let space = core.space();
        out.push(
            kura_engine::DriveStats::new("snapshot")
                .with("versions", core.versions.len() as u64)
                .with("data_chunks", space.data_chunks)
                .with("free_chunks", space.free_chunks),
        );
        kura_engine::device::child_stats(&*core.child, out);
    }

    fn submit(&mut self, req: Request) -> Result<(), Rejected> {
        let req = req.admit(&self.geo, self.accepted)?;
        self.accepted += 1;
        self.queued.push_back(req);
        Ok(())
    }

    fn ring_doorbell(&mut self) -> DeviceResult<()> {
        let core = self.core.clone();
        let mut core = lock(&core);
        self.dispatch(&mut core);
        core.ring()
    }

    fn poll(&mut self, out: &mut Vec<Completion>, min_complete: usize) -> DeviceResult<usize> {
        let target = min_complete.min(self.accepted);
        let shared = self.core.clone();
        let mut n = 0;
        loop {
            {
                let mut core = lock(&shared);
                self.dispatch(&mut core);
                self.collect(&mut core);
                let ready = self.ready.len();
                self.accepted -= ready;
                n += ready;
                out.append(&mut self.ready);
                if n >= target {
                    core.ring()?;
                    return Ok(n);
                }
                if !core.busy() {
                    return Err(crate::lost_track("snapshot drive"));
                }
                core.progress(1)?;
            }
            std::thread::yield_now();
        }
    }

    /// From the version's chunk map: an unmapped chunk reads as zeroes (a hole); a mapped one
    /// is the child's answer for its physical chunk (a child that cannot tell counts as data).
    fn allocation(
        &mut self,
        lba: u64,
        blocks: u64,
    ) -> DeviceResult<Option<Vec<kura_engine::Extent>>> {
        kura_engine::device::check_range(&self.geo, lba, blocks)?;
        let core = self.core.clone();
        let mut core = lock(&core);
        let Some(vi) = core.version_index(self.version) else {
            return Err(DeviceError::Offline {
                reason: format!("version `{}` was deleted", self.name),
            });
        };
        let mut out = Vec::new();
        for (vc, off, n, _) in Self::runs(&core, lba, blocks) {
            let pc = core.versions[vi].map[vc];
            if pc == UNMAPPED {
                kura_engine::device::push_extent(&mut out, n, kura_engine::Allocation::Hole);
                continue;
            }
            // Writes still in the volume's queue must land before the child is asked.
            core.settle(pc)?;
            let child_lba = core.child_lba(pc, off);
            let answer = core.child.allocation(child_lba, n)?;
            kura_engine::device::push_child_extents(&mut out, answer, n);
        }
        Ok(Some(out))
    }

    fn in_flight(&self) -> usize {
        self.accepted
    }
}

impl Drop for SnapshotDrive {
    fn drop(&mut self) {
        let mut core = lock(&self.core);
        if !self.parents.is_empty() {
            let _ = core.drain();
        }
        core.stash.remove(&self.handle);
        if let Some(vi) = core.version_index(self.version) {
            let v = &mut core.versions[vi];
            if self.writable {
                v.writer = false;
            } else {
                v.readers = v.readers.saturating_sub(1);
            }
        }
    }
}
