//! The shared state of one snapshot drive: the child device, every version's chunk map, the
//! reference counts that make up the allocator, the metadata commit, and the multiplexer that
//! lets several [`SnapshotDrive`](super::SnapshotDrive) handles (the head, snapshot views,
//! clones) keep commands in flight on the one child at once.

use super::format::{
    check_chunk, check_name, record_bytes, Meta, Superblock, VersionRecord, HEAD, META_HEADER,
    SB_SLOTS,
};
use super::SnapshotError;
use kura_engine::crc32c::crc32c;
use kura_engine::poison::FlushPoison;
use kura_engine::{
    BlockDevice, BlockingIo, Completion, DeviceError, DeviceResult, Opcode, Request,
};
use std::collections::{HashMap, HashSet, VecDeque};

/// A physical chunk no version maps.
pub(crate) const UNMAPPED: u32 = u32::MAX;
/// Reference count of a chunk freed since the last commit: not reusable until the metadata that
/// no longer names it is durable, since a crash would bring the old maps back.
const QUARANTINED: u32 = u32::MAX;

/// How to lay out a new drive.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FormatOptions {
    /// Copy-on-write unit (64 KiB by default).
    pub chunk_bytes: u32,
    /// Size of every version; `None` gives the data area's size (thin: snapshots share that
    /// space with the head, and a full data area fails writes with ENOSPC).
    pub virtual_bytes: Option<u64>,
    /// Metadata room, in full-size maps (8 by default); each writable version reserves one.
    pub maps: u32,
}

impl Default for FormatOptions {
    fn default() -> Self {
        FormatOptions {
            chunk_bytes: 64 << 10,
            virtual_bytes: None,
            maps: 8,
        }
    }
}

/// What a version is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VersionKind {
    /// The live, writable head.
    Head,
    /// A frozen, read-only snapshot.
    Snapshot,
    /// A writable branch made from another version.
    Clone,
}

/// One line of [`SnapshotVolume::list`](super::SnapshotVolume::list).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VersionInfo {
    pub name: String,
    pub kind: VersionKind,
    /// Creation order (the head is 0).
    pub id: u64,
    /// Chunks holding data in this version.
    pub mapped_chunks: u64,
    /// Of those, chunks no other version shares (what deleting it would free).
    pub exclusive_chunks: u64,
}

/// Space of the drive.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SpaceInfo {
    pub chunk_bytes: u32,
    pub virtual_bytes: u64,
    pub data_chunks: u64,
    pub free_chunks: u64,
    pub generation: u64,
}

pub(crate) struct Version {
    pub id: u64,
    pub name: String,
    pub writable: bool,
    /// Virtual chunk → physical chunk or [`UNMAPPED`].
    pub map: Vec<u32>,
    pub readers: u32,
    pub writer: bool,
}

/// Where a child completion goes: which handle, which of its requests, and what its buffer
/// hands back.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Route {
    pub handle: u64,
    pub parent: u64,
    pub handback: Handback,
}

/// What a child command's buffer hands back to the caller's request when it completes.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Handback {
    /// The caller's own buffer; hand it back.
    Whole,
    /// A scratch read buffer to copy into the caller's buffer at this byte offset.
    Scatter(usize),
    /// Nothing to hand back.
    Nothing,
}

pub(crate) struct Core {
    pub child: Box<dyn BlockDevice>,
    pub sb: Superblock,
    pub next_id: u64,
    pub versions: Vec<Version>,
    /// Per physical chunk: how many versions map it, or [`QUARANTINED`].
    refs: Vec<u32>,
    quarantine: Vec<u32>,
    free: u64,
    /// No chunk below this is free: allocation is first-fit, so freed chunks are reused soon
    /// (which keeps the data area compact, and makes the crash tests exercise reuse).
    cursor: usize,
    /// Chunks whose initialising write is in flight (by the write's child tag): commands
    /// touching them wait for it.
    initialising: HashSet<u32>,
    init_tags: HashMap<u64, u32>,
    next_tag: u64,
    routes: HashMap<u64, Route>,
    pub stash: HashMap<u64, Vec<(Route, Completion)>>,
    backlog: VecDeque<Request>,
    next_handle: u64,
    /// Child commands sent so far, so a handle can count the pieces of one request.
    sent: u64,
    /// Commands were sent since the child's doorbell last rang.
    unrung: bool,
    pub poison: FlushPoison,
}

impl Core {
    /// Writes a fresh, empty drive onto `child` and opens it.
    pub fn format(
        mut child: Box<dyn BlockDevice>,
        opts: FormatOptions,
    ) -> Result<Core, SnapshotError> {
        let geo = child.geometry();
        let bs = geo.block_size;
        check_chunk(opts.chunk_bytes, bs).map_err(SnapshotError::Invalid)?;
        if opts.maps == 0 {
            return Err(SnapshotError::Invalid("maps must be at least 1".into()));
        }
        let chunk_blocks = u64::from(opts.chunk_bytes / bs);
        let max_vchunks = match opts.virtual_bytes {
            Some(v) if v == 0 || !v.is_multiple_of(u64::from(bs)) => {
                return Err(SnapshotError::Invalid(format!(
                    "size {v} must be a non-zero multiple of the block size ({bs})"
                )))
            }
            Some(v) => v.div_ceil(u64::from(opts.chunk_bytes)),
            None => geo.num_blocks / chunk_blocks,
        };
        let half_bytes =
            META_HEADER as u64 + u64::from(opts.maps) * record_bytes(&"x".repeat(64), max_vchunks);
        let meta_blocks = half_bytes.div_ceil(u64::from(bs));
        let data_start = Superblock::data_start_for(meta_blocks, chunk_blocks);
        let data_chunks = geo.num_blocks.saturating_sub(data_start) / chunk_blocks;
        if data_chunks == 0
            || data_chunks >= u64::from(u32::MAX)
            || max_vchunks >= u64::from(u32::MAX)
        {
            return Err(SnapshotError::Invalid(format!(
                "a {}-byte device leaves {data_chunks} data chunks of {} bytes after {} metadata blocks",
                geo.capacity_bytes(),
                opts.chunk_bytes,
                data_start
            )));
        }
        let virtual_blocks = match opts.virtual_bytes {
            Some(v) => v / u64::from(bs),
            None => data_chunks * chunk_blocks,
        };
        let sb = Superblock {
            block_size: bs,
            chunk_bytes: opts.chunk_bytes,
            generation: 0,
            virtual_blocks,
            meta_blocks,
            data_start,
            data_chunks,
            blob_len: 0,
            blob_crc: 0,
        };
        let zero = vec![0u8; bs as usize * SB_SLOTS as usize];
        child.write_blocks(0, &zero)?;
        child.flush_all()?;
        let mut core = Core::assemble(
            child,
            sb,
            Meta {
                generation: 0,
                next_id: 1,
                versions: vec![VersionRecord {
                    id: 0,
                    name: HEAD.into(),
                    writable: true,
                    entries: Vec::new(),
                }],
            },
        );
        core.commit()?;
        Ok(core)
    }

    /// Opens the drive on `child`: the newer valid superblock and its metadata.
    pub fn open(mut child: Box<dyn BlockDevice>) -> Result<Core, SnapshotError> {
        let geo = child.geometry();
        if geo.num_blocks < SB_SLOTS {
            return Err(SnapshotError::NotSnapshotDrive {
                device: child.describe(),
            });
        }
        let bs = geo.block_size as usize;
        let mut slots = vec![0u8; bs * SB_SLOTS as usize];
        child.read_blocks(0, &mut slots)?;
        let mut best: Option<Superblock> = None;
        let mut first_err = None;
        let mut magic = false;
        for slot in slots.chunks(bs) {
            match Superblock::decode(slot, geo.block_size, geo.num_blocks) {
                Ok(Some(sb)) => {
                    magic = true;
                    if best.is_none_or(|b| sb.generation > b.generation) {
                        best = Some(sb);
                    }
                }
                Ok(None) => {}
                Err(e) => {
                    magic = true;
                    first_err.get_or_insert(e);
                }
            }
        }
        let Some(sb) = best else {
            return Err(match (magic, first_err) {
                (true, Some(e)) => e,
                _ => SnapshotError::NotSnapshotDrive {
                    device: child.describe(),
                },
            });
        };
        let mut blob = vec![0u8; (sb.blob_len as usize).div_ceil(bs) * bs];
        child.read_blocks(sb.meta_lba(sb.generation % 2), &mut blob)?;
        blob.truncate(sb.blob_len as usize);
        if crc32c(&blob) != sb.blob_crc {
            return Err(SnapshotError::Corrupt {
                what: format!(
                    "metadata blob of generation {} fails its checksum",
                    sb.generation
                ),
            });
        }
        let meta = Meta::decode(&blob, &sb)?;
        Ok(Core::assemble(child, sb, meta))
    }

    fn assemble(child: Box<dyn BlockDevice>, sb: Superblock, meta: Meta) -> Core {
        let vchunks = sb.virtual_chunks() as usize;
        let mut refs = vec![0u32; sb.data_chunks as usize];
        let versions = meta
            .versions
            .into_iter()
            .map(|r| {
                let mut map = vec![UNMAPPED; vchunks];
                for (vc, pc) in r.entries {
                    map[vc as usize] = pc;
                    refs[pc as usize] += 1;
                }
                Version {
                    id: r.id,
                    name: r.name,
                    writable: r.writable,
                    map,
                    readers: 0,
                    writer: false,
                }
            })
            .collect();
        let free = refs.iter().filter(|&&r| r == 0).count() as u64;
        Core {
            child,
            sb,
            next_id: meta.next_id,
            versions,
            refs,
            quarantine: Vec::new(),
            free,
            cursor: 0,
            initialising: HashSet::new(),
            init_tags: HashMap::new(),
            next_tag: 1,
            routes: HashMap::new(),
            stash: HashMap::new(),
            backlog: VecDeque::new(),
            next_handle: 1,
            sent: 0,
            unrung: false,
            poison: FlushPoison::default(),
        }
    }

    pub fn chunk_blocks(&self) -> u64 {
        self.sb.chunk_blocks()
    }

    pub fn version_index(&self, id: u64) -> Option<usize> {
        self.versions.iter().position(|v| v.id == id)
    }

    pub fn find(&self, name: &str) -> Result<usize, SnapshotError> {
        self.versions
            .iter()
            .position(|v| v.name == name)
            .ok_or_else(|| SnapshotError::NoSuchSnapshot {
                name: name.to_string(),
            })
    }

    pub fn sent_count(&self) -> u64 {
        self.sent
    }

    pub fn new_handle(&mut self) -> u64 {
        let h = self.next_handle;
        self.next_handle += 1;
        self.stash.insert(h, Vec::new());
        h
    }

    /// Sends one child command for `route`; a refusal other than back-pressure completes it.
    /// Returns the child tag.
    pub fn send(&mut self, route: Route, mut req: Request) -> u64 {
        let tag = self.next_tag;
        self.next_tag = self.next_tag.wrapping_add(1);
        req.tag = tag;
        self.sent += 1;
        self.unrung = true;
        self.routes.insert(tag, route);
        if self.backlog.is_empty() {
            if let Err(r) = self.child.submit(req) {
                if matches!(r.error, DeviceError::QueueFull { .. }) {
                    self.backlog.push_back(r.request);
                } else {
                    self.deliver(Completion::of(r.request, Err(r.error)));
                }
            }
        } else {
            self.backlog.push_back(req);
        }
        tag
    }

    fn pump(&mut self) {
        while let Some(req) = self.backlog.pop_front() {
            if let Err(r) = self.child.submit(req) {
                if matches!(r.error, DeviceError::QueueFull { .. }) {
                    self.backlog.push_front(r.request);
                    return;
                }
                self.deliver(Completion::of(r.request, Err(r.error)));
            }
        }
    }

    fn deliver(&mut self, done: Completion) {
        if let Some(pc) = self.init_tags.remove(&done.tag) {
            self.initialising.remove(&pc);
        }
        if let Some(route) = self.routes.remove(&done.tag) {
            if let Some(stash) = self.stash.get_mut(&route.handle) {
                stash.push((route, done));
            }
        }
    }

    /// True while child commands are queued here or in flight on the child.
    pub fn busy(&self) -> bool {
        !self.backlog.is_empty() || self.child.in_flight() > 0
    }

    /// Sends what waits, rings the child and collects at least `min` completions if any are due.
    pub fn progress(&mut self, min: usize) -> DeviceResult<()> {
        self.pump();
        self.unrung = false;
        if self.child.in_flight() > 0 {
            let mut got = Vec::new();
            self.child.poll(&mut got, min)?;
            for done in got {
                self.deliver(done);
            }
        } else if !self.backlog.is_empty() {
            self.child.ring_doorbell()?;
        }
        Ok(())
    }

    /// Rings the child if commands were sent since it last was (a doorbell is a system call on
    /// the io_uring backends, so an idle ring is worth skipping).
    pub fn ring(&mut self) -> DeviceResult<()> {
        self.pump();
        if self.unrung && self.child.in_flight() > 0 {
            self.child.ring_doorbell()?;
        }
        self.unrung = false;
        Ok(())
    }

    /// Waits until no child command is in flight (completions go to their handles' stashes).
    pub fn drain(&mut self) -> DeviceResult<()> {
        while self.busy() {
            self.progress(1)?;
        }
        Ok(())
    }

    /// Waits for an initialising write that touches `chunk`, if one is in flight.
    pub fn settle(&mut self, chunk: u32) -> DeviceResult<()> {
        if self.initialising.contains(&chunk) {
            self.drain()?;
        }
        Ok(())
    }

    /// Child LBA of block `off` within physical chunk `pc`.
    pub fn child_lba(&self, pc: u32, off: u64) -> u64 {
        self.sb.data_start + u64::from(pc) * self.chunk_blocks() + off
    }

    fn alloc(&mut self) -> Option<u32> {
        if self.free == 0 {
            return None;
        }
        let at = self.cursor + self.refs[self.cursor..].iter().position(|&r| r == 0)?;
        self.refs[at] = 1;
        self.free -= 1;
        self.cursor = at + 1;
        Some(at as u32)
    }

    fn decref(&mut self, pc: u32) {
        let r = &mut self.refs[pc as usize];
        if *r == 1 {
            *r = QUARANTINED;
            self.quarantine.push(pc);
        } else if *r > 1 && *r != QUARANTINED {
            *r -= 1;
        }
    }

    fn incref(&mut self, pc: u32) {
        self.refs[pc as usize] += 1;
    }

    /// Makes virtual chunk `vc` of version `vi` exclusively its own, so it can be written in
    /// place, and returns its physical chunk. A chunk never written gets a fresh chunk; a
    /// shared one is copied. The new chunk's whole content is written (`fill` lays the
    /// caller's data over the old content, or zeroes); that write goes out as a piece of the
    /// caller's request, so the chunk counts as initialising until it completes. Returns
    /// `Ok(None)` when that write already carried the caller's data.
    pub fn own_chunk(
        &mut self,
        vi: usize,
        vc: usize,
        route: Route,
        fill: impl FnOnce(&mut [u8]),
    ) -> DeviceResult<Option<u32>> {
        let old = self.versions[vi].map[vc];
        if old != UNMAPPED && self.refs[old as usize] == 1 {
            self.settle(old)?;
            return Ok(Some(old));
        }
        let Some(new) = self.alloc() else {
            return Err(DeviceError::Io {
                op: Opcode::Write,
                lba: vc as u64 * self.chunk_blocks(),
                errno: kura_engine::Errno(libc::ENOSPC),
            });
        };
        let bs = self.sb.block_size as usize;
        let chunk_bytes = self.chunk_blocks() as usize * bs;
        let mut buf = crate::fanout::scratch(chunk_bytes);
        if old == UNMAPPED {
            buf[..chunk_bytes].fill(0);
        } else {
            if let Err(e) = self.drain().and_then(|()| {
                self.child
                    .read_blocks(self.child_lba(old, 0), &mut buf[..chunk_bytes])
            }) {
                self.refs[new as usize] = 0;
                self.free += 1;
                self.cursor = self.cursor.min(new as usize);
                return Err(e);
            }
            self.decref(old);
        }
        fill(&mut buf[..chunk_bytes]);
        self.versions[vi].map[vc] = new;
        self.initialising.insert(new);
        let req = Request::write(0, self.child_lba(new, 0), self.chunk_blocks(), buf);
        let tag = self.send(
            Route {
                handback: Handback::Nothing,
                ..route
            },
            req,
        );
        // A refused send has completed already; its chunk is not in flight.
        if self.routes.contains_key(&tag) {
            self.init_tags.insert(tag, new);
        } else {
            self.initialising.remove(&new);
        }
        Ok(None)
    }

    /// Drops virtual chunk `vc` of version `vi` (a whole-chunk discard or write-zeroes).
    pub fn unmap(&mut self, vi: usize, vc: usize) -> DeviceResult<()> {
        let old = self.versions[vi].map[vc];
        if old != UNMAPPED {
            self.settle(old)?;
            self.versions[vi].map[vc] = UNMAPPED;
            self.decref(old);
        }
        Ok(())
    }

    /// Makes every map change durable: waits for the child, flushes data, writes the blob to the
    /// idle metadata half, flushes, writes the superblock slot that names it, flushes. Only then
    /// may quarantined chunks be reused.
    pub fn commit(&mut self) -> Result<(), SnapshotError> {
        self.poison.check(Opcode::Flush)?;
        let done = self.commit_inner();
        if let Err(SnapshotError::Device(e)) = &done {
            self.poison.observe(Opcode::Flush, &Err(e.clone()));
        }
        done
    }

    fn commit_inner(&mut self) -> Result<(), SnapshotError> {
        self.drain()?;
        self.child.flush_all()?;
        let generation = self.sb.generation + 1;
        let meta = Meta {
            generation,
            next_id: self.next_id,
            versions: self
                .versions
                .iter()
                .map(|v| VersionRecord {
                    id: v.id,
                    name: v.name.clone(),
                    writable: v.writable,
                    entries: v
                        .map
                        .iter()
                        .enumerate()
                        .filter(|(_, &p)| p != UNMAPPED)
                        .map(|(vc, &p)| (vc as u32, p))
                        .collect(),
                })
                .collect(),
        };
        let blob = meta.encode();
        let bs = self.sb.block_size as usize;
        let room = self.sb.meta_blocks as usize * bs;
        if blob.len() > room {
            return Err(SnapshotError::MetadataFull {
                needed: blob.len() as u64,
                room: room as u64,
            });
        }
        let mut padded = blob.clone();
        padded.resize(blob.len().div_ceil(bs) * bs, 0);
        let mut sb = self.sb;
        sb.generation = generation;
        sb.blob_len = blob.len() as u32;
        sb.blob_crc = crc32c(&blob);
        self.child
            .write_blocks(sb.meta_lba(generation % 2), &padded)?;
        self.child.flush_all()?;
        self.child.write_blocks(generation % 2, &sb.encode())?;
        self.child.flush_all()?;
        self.sb = sb;
        for pc in std::mem::take(&mut self.quarantine) {
            self.refs[pc as usize] = 0;
            self.free += 1;
            self.cursor = self.cursor.min(pc as usize);
        }
        Ok(())
    }

    /// Fails unless the metadata area holds the maps after adding `extra`: frozen versions at
    /// their size, writable ones at full size (so a commit can never run out of room).
    fn check_room(&self, extra: &[(&str, bool, u64)]) -> Result<(), SnapshotError> {
        let full = self.sb.virtual_chunks();
        let size = |name: &str, writable: bool, mapped: u64| {
            record_bytes(name, if writable { full } else { mapped })
        };
        let needed: u64 = META_HEADER as u64
            + self
                .versions
                .iter()
                .map(|v| size(&v.name, v.writable, mapped(&v.map)))
                .sum::<u64>()
            + extra.iter().map(|&(n, w, m)| size(n, w, m)).sum::<u64>();
        let room = self.sb.meta_blocks * u64::from(self.sb.block_size);
        if needed > room {
            return Err(SnapshotError::MetadataFull { needed, room });
        }
        Ok(())
    }

    fn check_new_name(&self, name: &str) -> Result<(), SnapshotError> {
        check_name(name)?;
        if self.versions.iter().any(|v| v.name == name) {
            return Err(SnapshotError::NameExists {
                name: name.to_string(),
            });
        }
        Ok(())
    }

    /// Adds version `name` with a copy of version `from`'s map.
    pub fn add_version(
        &mut self,
        from: &str,
        name: &str,
        writable: bool,
    ) -> Result<(), SnapshotError> {
        self.check_new_name(name)?;
        let src = self.find(from)?;
        self.check_room(&[(name, writable, mapped(&self.versions[src].map))])?;
        self.drain()?;
        let map = self.versions[src].map.clone();
        for &pc in map.iter().filter(|&&p| p != UNMAPPED) {
            self.incref(pc);
        }
        self.versions.push(Version {
            id: self.next_id,
            name: name.to_string(),
            writable,
            map,
            readers: 0,
            writer: false,
        });
        self.next_id += 1;
        self.commit()
    }

    /// Makes the head's map a copy of version `name`'s.
    pub fn rollback(&mut self, name: &str) -> Result<(), SnapshotError> {
        let src = self.find(name)?;
        let head = self.find(HEAD)?;
        if src == head {
            return Err(SnapshotError::HeadReserved {
                what: "roll the head back to itself",
            });
        }
        self.drain()?;
        let map = self.versions[src].map.clone();
        for &pc in map.iter().filter(|&&p| p != UNMAPPED) {
            self.incref(pc);
        }
        let old = std::mem::replace(&mut self.versions[head].map, map);
        for pc in old.into_iter().filter(|&p| p != UNMAPPED) {
            self.decref(pc);
        }
        self.commit()
    }

    /// Removes version `name` and frees the chunks only it mapped.
    pub fn delete(&mut self, name: &str) -> Result<(), SnapshotError> {
        let i = self.find(name)?;
        let v = &self.versions[i];
        if v.name == HEAD {
            return Err(SnapshotError::HeadReserved {
                what: "delete the head",
            });
        }
        if v.readers > 0 || v.writer {
            return Err(SnapshotError::Busy {
                name: name.to_string(),
            });
        }
        self.drain()?;
        let v = self.versions.remove(i);
        for pc in v.map.into_iter().filter(|&p| p != UNMAPPED) {
            self.decref(pc);
        }
        self.commit()
    }

    pub fn list(&self) -> Vec<VersionInfo> {
        self.versions
            .iter()
            .map(|v| VersionInfo {
                name: v.name.clone(),
                kind: match (v.name == HEAD, v.writable) {
                    (true, _) => VersionKind::Head,
                    (false, true) => VersionKind::Clone,
                    (false, false) => VersionKind::Snapshot,
                },
                id: v.id,
                mapped_chunks: mapped(&v.map),
                exclusive_chunks: v
                    .map
                    .iter()
                    .filter(|&&p| p != UNMAPPED && self.refs[p as usize] == 1)
                    .count() as u64,
            })
            .collect()
    }

    pub fn space(&self) -> SpaceInfo {
        SpaceInfo {
            chunk_bytes: self.sb.chunk_bytes,
            virtual_bytes: self.sb.virtual_blocks * u64::from(self.sb.block_size),
            data_chunks: self.sb.data_chunks,
            free_chunks: self.free,
            generation: self.sb.generation,
        }
    }
}

fn mapped(map: &[u32]) -> u64 {
    map.iter().filter(|&&p| p != UNMAPPED).count() as u64
}
