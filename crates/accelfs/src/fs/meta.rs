//! In-memory metadata of a mounted file system: inodes with their extent maps, directories, the
//! inode-table blocks they live in, and the running transaction that collects every metadata
//! block changed since the last commit (format §7).
//!
//! Every mutating operation changes only these structures (and the allocator); `commit` turns
//! them into block images, writes them with the dirty data in one batch, and flushes once.

use super::alloc::Allocator;
use super::cache::Cache;
use super::MountOptions;
use crate::dir::{self, DirEntry};
use crate::error::{FormatError, FsError};
use crate::extent::{Extent, ExtentMap};
use crate::fsdevice::{BatchOp, FsDevice};
use crate::header::{seal, verify, BlockKind, HEADER_LEN};
use crate::inode::{Inode, Kind, INLINE_EXTENTS, INODE_SIZE};
use crate::layout::{Layout, Superblock};
use crate::wal::{Journal, Recovery};
use kura_engine::{BufferPool, IoBuf};
use std::collections::{BTreeSet, HashMap};

/// An inode and its block map.
pub(crate) struct Node {
    pub(crate) inode: Inode,
    pub(crate) map: ExtentMap,
    /// Extent blocks holding the extents past the inline ones, in chain order.
    chain: Vec<u64>,
    /// What each chain block holds on the device (or in the journal) now.
    chain_images: Vec<Vec<u8>>,
    pub(crate) map_dirty: bool,
}

impl Node {
    /// Extent blocks the node holds.
    pub(crate) fn chain_len(&self) -> usize {
        self.chain.len()
    }
}

/// A directory's blocks and a name index.
pub(crate) struct Dir {
    blocks: Vec<DirBlock>,
    index: HashMap<Vec<u8>, usize>,
    dirty: BTreeSet<usize>,
}

struct DirBlock {
    physical: u64,
    entries: Vec<DirEntry>,
    used: usize,
}

impl Dir {
    pub(crate) fn entries(&self) -> impl Iterator<Item = &DirEntry> {
        self.blocks.iter().flat_map(|b| b.entries.iter())
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.index.is_empty()
    }

    pub(crate) fn get(&self, name: &[u8]) -> Option<&DirEntry> {
        let &i = self.index.get(name)?;
        self.blocks[i].entries.iter().find(|e| e.name == name)
    }
}

pub(crate) struct Inner {
    pub(crate) io: FsDevice,
    pub(crate) sb: Superblock,
    pub(crate) bs: usize,
    pub(crate) journal: Journal,
    pub(crate) alloc: Allocator,
    pub(crate) nodes: HashMap<u64, Node>,
    dirty_nodes: BTreeSet<u64>,
    itable: HashMap<u64, Vec<u8>>,
    dirty_itable: BTreeSet<u64>,
    pub(crate) dirs: HashMap<u64, Dir>,
    pub(crate) cache: Cache,
    pub(crate) opts: MountOptions,
    /// Set after a failed commit or flush, or for a read-only mount: nothing more is written.
    pub(crate) read_only: Option<String>,
    /// Mounted with `FileSystem::mount_read_only`: nothing is ever dirty, so `sync` has
    /// nothing to do (rather than failing as after an I/O error).
    pub(crate) mounted_read_only: bool,
    pub(crate) closed: bool,
    /// Per file: where the next read continues a sequential stream.
    pub(crate) next_sequential: HashMap<u64, u64>,
    /// Files whose size or block map changed in the running transaction (fdatasync must
    /// commit for them).
    pub(crate) layout_changed: BTreeSet<u64>,
    pub(crate) commits: u64,
    pub(crate) recovery: Recovery,
}

pub(crate) fn corrupt(msg: String) -> FsError {
    FsError::Format(FormatError::Corrupt(msg))
}

impl Inner {
    pub(crate) fn new(
        io: FsDevice,
        sb: Superblock,
        journal: Journal,
        alloc: Allocator,
        opts: MountOptions,
        recovery: Recovery,
    ) -> Inner {
        let bs = sb.layout.block_size as usize;
        Inner {
            io,
            sb,
            bs,
            journal,
            alloc,
            nodes: HashMap::new(),
            dirty_nodes: BTreeSet::new(),
            itable: HashMap::new(),
            dirty_itable: BTreeSet::new(),
            dirs: HashMap::new(),
            cache: Cache::new(bs, opts.cache_bytes),
            opts,
            read_only: None,
            mounted_read_only: false,
            closed: false,
            next_sequential: HashMap::new(),
            layout_changed: BTreeSet::new(),
            commits: 0,
            recovery,
        }
    }

    pub(crate) fn layout(&self) -> Layout {
        self.sb.layout
    }

    /// A metadata block as committed: the journal's image when its home copy is stale.
    pub(crate) fn read_meta(&mut self, block: u64) -> Result<Vec<u8>, FsError> {
        match self.journal.image(block) {
            Some(b) => Ok(b.to_vec()),
            None => self.io.read(block),
        }
    }

    pub(crate) fn cache_has_dirty(&self, ino: u64) -> bool {
        self.cache.has_dirty(ino)
    }

    /// Refuses writes once the file system has gone read-only or been closed.
    pub(crate) fn writable(&self) -> Result<(), FsError> {
        if let Some(why) = &self.read_only {
            return Err(FsError::ReadOnly(why.clone()));
        }
        if self.closed {
            return Err(FsError::ReadOnly("the file system was unmounted".into()));
        }
        Ok(())
    }

    // ---- inodes -------------------------------------------------------------------------

    fn itable_slot(&self, ino: u64) -> (u64, usize) {
        let per = Layout::inodes_per_block(self.sb.layout.block_size);
        (
            self.sb.layout.inode_table_start + ino / per,
            HEADER_LEN + (ino % per) as usize * INODE_SIZE,
        )
    }

    /// The in-memory copy of inode-table block `block`, read and checked on first use.
    fn itable_block(&mut self, block: u64) -> Result<&mut Vec<u8>, FsError> {
        if !self.itable.contains_key(&block) {
            let b = self.read_meta(block)?;
            verify(&b, BlockKind::InodeTable, block)?;
            self.itable.insert(block, b);
        }
        self.itable
            .get_mut(&block)
            .ok_or_else(|| corrupt(format!("inode-table block {block} vanished")))
    }

    /// Loads inode `ino` (and its extents) if needed.
    pub(crate) fn node(&mut self, ino: u64) -> Result<&mut Node, FsError> {
        if !self.nodes.contains_key(&ino) {
            let node = self.load_node(ino)?;
            self.nodes.insert(ino, node);
        }
        self.nodes
            .get_mut(&ino)
            .ok_or_else(|| corrupt(format!("inode {ino} vanished")))
    }

    fn load_node(&mut self, ino: u64) -> Result<Node, FsError> {
        let l = self.sb.layout;
        if ino == 0 || ino >= l.inode_count {
            return Err(corrupt(format!(
                "inode number {ino} is outside the inode table (0 < ino < {})",
                l.inode_count
            )));
        }
        let (block, at) = self.itable_slot(ino);
        let raw = &self.itable_block(block)?[at..at + INODE_SIZE];
        let inode = Inode::decode(ino, raw).map_err(|e| corrupt(e.to_string()))?;
        if inode.kind == Kind::Free {
            return Ok(Node {
                inode,
                map: ExtentMap::default(),
                chain: Vec::new(),
                chain_images: Vec::new(),
                map_dirty: false,
            });
        }
        // Size and extent count are checked before either is trusted to size a read.
        if let Some(why) = l.inode_problem(ino, &inode) {
            return Err(corrupt(why));
        }
        let count = inode.extent_count as usize;
        let mut extents: Vec<Extent> = inode.inline[..count.min(INLINE_EXTENTS)].to_vec();
        let mut chain = Vec::new();
        let mut seen = std::collections::HashSet::new();
        let mut chain_images = Vec::new();
        let mut next = inode.extent_block;
        while extents.len() < count {
            if next < l.data_start || next >= l.backup_superblock() || !seen.insert(next) {
                return Err(corrupt(format!(
                    "inode {ino}: extent chain points at block {next}, outside the data region or in a loop"
                )));
            }
            let b = self.read_meta(next)?;
            let (more, after) = ExtentMap::decode_block(&b, next)?;
            chain.push(next);
            chain_images.push(b);
            if more.is_empty() {
                break;
            }
            extents.extend(more);
            next = after;
        }
        if extents.len() != count {
            return Err(corrupt(format!(
                "inode {ino} says it has {count} extents but {} were found",
                extents.len()
            )));
        }
        extents.truncate(count);
        let map = ExtentMap::from_extents(extents);
        map.validate(l.data_start, l.backup_superblock())
            .map_err(|e| corrupt(format!("inode {ino}: {e}")))?;
        if let Some(b) = map.first_mapped_of(&chain) {
            return Err(corrupt(format!(
                "inode {ino}: extent block {b} is also one of its data blocks"
            )));
        }
        // Blocks an inode holds are marked in the block bitmap by the same transaction that
        // gave them to it. One marked free could be handed to another file by the allocator,
        // cross-linking the two: refuse the inode instead (fsck names it; repair rebuilds the
        // bitmap). This is the cross-file check that is cheap at load (a word at a time). It
        // cannot catch blocks handed out before the inode is first loaded, nor two inodes
        // claiming the same used blocks: those are fsck's to find.
        let runs = map
            .extents()
            .iter()
            .map(|e| (e.physical, u64::from(e.length)))
            .chain(chain.iter().map(|&b| (b, 1)));
        for (start, len) in runs {
            if !self.alloc.all_taken(start, len) {
                return Err(corrupt(format!(
                    "inode {ino}: its blocks {start}..{} are marked free in the block bitmap",
                    start + len
                )));
            }
        }
        Ok(Node {
            inode,
            map,
            chain,
            chain_images,
            map_dirty: false,
        })
    }

    /// Records that inode `ino` changed in the running transaction.
    pub(crate) fn touch(&mut self, ino: u64) {
        self.dirty_nodes.insert(ino);
    }

    /// Allocates and initialises a new inode of `kind` under `parent`.
    pub(crate) fn new_node(&mut self, kind: Kind, mode: u16, parent: u64) -> Result<u64, FsError> {
        let ino = self
            .alloc
            .alloc_inode()
            .ok_or_else(|| FsError::NoSpace("every inode is in use".into()))?;
        let previous = match self.node(ino) {
            Ok(n) => n.inode.generation,
            Err(e) => {
                self.alloc.free_inode(ino);
                return Err(e);
            }
        };
        let mut inode = Inode::new(kind, mode, parent, crate::mkfs::now_ns());
        inode.generation = previous.wrapping_add(1);
        self.nodes.insert(
            ino,
            Node {
                inode,
                map: ExtentMap::default(),
                chain: Vec::new(),
                chain_images: Vec::new(),
                map_dirty: true,
            },
        );
        self.touch(ino);
        Ok(ino)
    }

    /// Frees an inode and every block it holds (deferred to the commit by the allocator).
    pub(crate) fn free_node(&mut self, ino: u64) -> Result<(), FsError> {
        let node = self.node(ino)?;
        let freed = node.map.truncate(0);
        let chain = std::mem::take(&mut node.chain);
        node.chain_images.clear();
        let generation = node.inode.generation;
        node.inode = Inode::free();
        node.inode.generation = generation;
        node.map_dirty = false;
        for (start, len) in freed {
            self.alloc.free_blocks(start, u64::from(len));
        }
        for b in chain {
            self.alloc.free_blocks(b, 1);
        }
        self.alloc.free_inode(ino);
        self.cache.remove_from(ino, 0);
        self.dirs.remove(&ino);
        self.next_sequential.remove(&ino);
        self.touch(ino);
        Ok(())
    }

    // ---- directories --------------------------------------------------------------------

    /// Loads directory `ino` if needed; `NotADirectory` when it is a file.
    pub(crate) fn dir(&mut self, ino: u64) -> Result<&mut Dir, FsError> {
        if !self.dirs.contains_key(&ino) {
            let d = self.load_dir(ino)?;
            self.dirs.insert(ino, d);
        }
        self.dirs
            .get_mut(&ino)
            .ok_or_else(|| corrupt(format!("directory {ino} vanished")))
    }

    fn load_dir(&mut self, ino: u64) -> Result<Dir, FsError> {
        let bs = self.bs as u64;
        let node = self.node(ino)?;
        if node.inode.kind != Kind::Directory {
            return Err(FsError::NotADirectory(format!("inode {ino}")));
        }
        let nblocks = node.inode.size / bs;
        let mut physical = Vec::new();
        for i in 0..nblocks {
            let p = u32::try_from(i)
                .ok()
                .and_then(|i| node.map.lookup(i))
                .ok_or_else(|| corrupt(format!("directory {ino} has a hole at block {i}")))?;
            physical.push(p.0);
        }
        let mut d = Dir {
            blocks: Vec::new(),
            index: HashMap::new(),
            dirty: BTreeSet::new(),
        };
        // Records are at least 16 bytes, so this bounds the entries of even a legal directory;
        // more entries than inodes cannot all name a different used inode.
        let most = self.sb.layout.inode_count;
        for (i, p) in physical.into_iter().enumerate() {
            let entries = dir::decode_block(&self.read_meta(p)?, p)?;
            if (d.index.len() + entries.len()) as u64 > most {
                return Err(corrupt(format!(
                    "directory {ino} lists more entries than the file system has inodes ({most})"
                )));
            }
            for e in &entries {
                if d.index.insert(e.name.clone(), i).is_some() {
                    return Err(corrupt(format!(
                        "directory {ino} lists {:?} twice",
                        String::from_utf8_lossy(&e.name)
                    )));
                }
            }
            d.blocks.push(DirBlock {
                physical: p,
                used: entries.iter().map(|e| dir::record_len(e.name.len())).sum(),
                entries,
            });
        }
        Ok(d)
    }

    /// Sets up a new, empty directory whose only block is `physical`.
    pub(crate) fn init_empty_dir(&mut self, ino: u64, physical: u64) -> Result<(), FsError> {
        let node = self.node(ino)?;
        node.map_dirty = true;
        self.touch(ino);
        self.dirs.insert(
            ino,
            Dir {
                blocks: vec![DirBlock {
                    physical,
                    entries: Vec::new(),
                    used: 0,
                }],
                index: HashMap::new(),
                dirty: BTreeSet::from([0]),
            },
        );
        Ok(())
    }

    /// Adds `entry` to directory `dir_ino`, growing it by a block when no block has room.
    pub(crate) fn dir_add(&mut self, dir_ino: u64, entry: DirEntry) -> Result<(), FsError> {
        let need = dir::record_len(entry.name.len());
        let cap = dir::capacity(self.bs);
        let d = self.dir(dir_ino)?;
        let slot = d.blocks.iter().position(|b| b.used + need <= cap);
        let i = match slot {
            Some(i) => i,
            None => {
                let goal = d.blocks.last().map_or(0, |b| b.physical + 1);
                let (p, _) = self
                    .alloc
                    .alloc_blocks(goal, 1)
                    .ok_or_else(|| FsError::NoSpace("no block left to grow a directory".into()))?;
                let bs = self.bs as u64;
                let node = self.node(dir_ino)?;
                let logical = (node.inode.size / bs) as u32;
                node.map.insert(logical, 1, p);
                node.inode.size += bs;
                node.map_dirty = true;
                self.touch(dir_ino);
                let d = self.dir(dir_ino)?;
                d.blocks.push(DirBlock {
                    physical: p,
                    entries: Vec::new(),
                    used: 0,
                });
                d.blocks.len() - 1
            }
        };
        let d = self.dir(dir_ino)?;
        d.index.insert(entry.name.clone(), i);
        d.blocks[i].used += need;
        d.blocks[i].entries.push(entry);
        d.dirty.insert(i);
        self.touch_mtime(dir_ino)
    }

    /// Removes `name` from directory `dir_ino`; returns the entry.
    pub(crate) fn dir_remove(&mut self, dir_ino: u64, name: &[u8]) -> Result<DirEntry, FsError> {
        let d = self.dir(dir_ino)?;
        let i = d
            .index
            .remove(name)
            .ok_or_else(|| FsError::NotFound(String::from_utf8_lossy(name).into_owned()))?;
        let b = &mut d.blocks[i];
        let at = b
            .entries
            .iter()
            .position(|e| e.name == name)
            .ok_or_else(|| corrupt(format!("directory {dir_ino} index out of date")))?;
        let e = b.entries.remove(at);
        b.used -= dir::record_len(e.name.len());
        d.dirty.insert(i);
        self.touch_mtime(dir_ino)?;
        Ok(e)
    }

    pub(crate) fn touch_mtime(&mut self, ino: u64) -> Result<(), FsError> {
        let now = crate::mkfs::now_ns();
        let n = self.node(ino)?;
        n.inode.mtime_ns = now;
        n.inode.ctime_ns = now;
        self.touch(ino);
        Ok(())
    }

    // ---- transactions -------------------------------------------------------------------

    /// Metadata blocks the running transaction would write now (an upper estimate).
    fn transaction_estimate(&self) -> usize {
        let chains: usize = self
            .dirty_nodes
            .iter()
            .filter_map(|i| self.nodes.get(i))
            .filter(|n| n.map_dirty)
            .map(|n| n.chain.len() + 1)
            .sum();
        self.dirty_itable.len()
            + self.dirty_nodes.len()
            + self.dirs.values().map(|d| d.dirty.len()).sum::<usize>()
            + self.alloc.dirty_count()
            + chains
    }

    /// Commits first when the running transaction is half way to the journal's limit, so that
    /// the next operation's changes fit into it.
    pub(crate) fn make_transaction_room(&mut self) -> Result<(), FsError> {
        if self.transaction_estimate() * 2 >= self.journal.max_transaction_blocks() {
            self.commit()?;
        }
        Ok(())
    }

    /// Lays out the extent chain of a node whose map changed, allocating or freeing extent
    /// blocks; returns the chain blocks whose contents changed.
    fn layout_chain(&mut self, ino: u64) -> Result<Vec<(u64, Vec<u8>)>, FsError> {
        let bs = self.bs;
        let per = ExtentMap::per_block(bs);
        let node = self.node(ino)?;
        let extents = node.map.extents().to_vec();
        let rest = extents.len().saturating_sub(INLINE_EXTENTS);
        let want = rest.div_ceil(per);
        let mut chain = std::mem::take(&mut node.chain);
        let mut images = std::mem::take(&mut node.chain_images);
        while chain.len() > want {
            if let Some(b) = chain.pop() {
                images.pop();
                self.alloc.free_blocks(b, 1);
            }
        }
        while chain.len() < want {
            let goal = chain.last().map_or(0, |b| b + 1);
            let (b, _) = self
                .alloc
                .alloc_blocks(goal, 1)
                .ok_or_else(|| FsError::NoSpace("no block left for an extent block".into()))?;
            chain.push(b);
            images.push(Vec::new());
        }
        let mut changed = Vec::new();
        for (i, &b) in chain.iter().enumerate() {
            let lo = INLINE_EXTENTS + i * per;
            let hi = (lo + per).min(extents.len());
            let next = chain.get(i + 1).copied().unwrap_or(0);
            let img = ExtentMap::encode_block(&extents[lo..hi], next, bs, b);
            if images[i] != img {
                changed.push((b, img.clone()));
                images[i] = img;
            }
        }
        let node = self.node(ino)?;
        let mut inline = [Extent::EMPTY; INLINE_EXTENTS];
        for (slot, e) in inline.iter_mut().zip(extents.iter()) {
            *slot = *e;
        }
        node.inode.inline = inline;
        node.inode.extent_count = extents.len() as u32;
        node.inode.extent_block = chain.first().copied().unwrap_or(0);
        node.inode.blocks = node.map.mapped_blocks() + chain.len() as u64;
        node.chain = chain;
        node.chain_images = images;
        node.map_dirty = false;
        Ok(changed)
    }

    /// Makes everything durable: dirty data and the running transaction, one batch, one flush.
    pub(crate) fn commit(&mut self) -> Result<(), FsError> {
        if self.mounted_read_only && !self.closed {
            return Ok(());
        }
        self.writable()?;
        let result = self.commit_inner();
        if let Err(e) = &result {
            self.read_only = Some(format!("after an I/O failure: {e}"));
        }
        result
    }

    fn commit_inner(&mut self) -> Result<(), FsError> {
        let mut images = Vec::new();
        let dirty: Vec<u64> = self.dirty_nodes.iter().copied().collect();
        for &ino in &dirty {
            if self.node(ino)?.map_dirty {
                images.extend(self.layout_chain(ino)?);
            }
        }
        for ino in dirty {
            let (block, at) = self.itable_slot(ino);
            let raw = self.node(ino)?.inode.encode();
            self.itable_block(block)?[at..at + INODE_SIZE].copy_from_slice(&raw);
            self.dirty_itable.insert(block);
        }
        for &block in &self.dirty_itable {
            if let Some(t) = self.itable.get_mut(&block) {
                seal(t, BlockKind::InodeTable, block);
                images.push((block, t.clone()));
            }
        }
        for d in self.dirs.values() {
            for &i in &d.dirty {
                let b = &d.blocks[i];
                let img = dir::encode_block(&b.entries, self.bs, b.physical)
                    .ok_or_else(|| corrupt(format!("directory block {} overflowed", b.physical)))?;
                images.push((b.physical, img));
            }
        }
        images.extend(self.alloc.dirty_images(self.bs));
        // Small amounts of dirty data go into the log with the metadata (format §7): an fsync'd
        // small write is then one sequential log write and one flush.
        let dirty = self.cache.take_dirty(None);
        let fits = images.len() + dirty.len() <= self.journal.max_transaction_blocks();
        let data = if !images.is_empty()
            && fits
            && dirty.len() * self.bs <= self.opts.journal_data_bytes
        {
            for (ino, b, buf) in dirty {
                let node = self.node(ino)?;
                if node.inode.kind == Kind::Free {
                    continue;
                }
                let (p, _) = node.map.lookup(b).ok_or_else(|| {
                    corrupt(format!("inode {ino}: cached block {b} has no device block"))
                })?;
                images.push((p, buf.to_vec()));
            }
            Vec::new()
        } else {
            self.placed(dirty)?
        };
        if images.is_empty() && data.is_empty() {
            return self.io.flush();
        }
        if images.is_empty() {
            self.io.batch(data)?;
            return self.io.flush();
        }
        self.journal.commit_with_data(&mut self.io, &images, data)?;
        self.alloc.committed();
        self.alloc.clear_dirty();
        self.dirty_nodes.clear();
        self.dirty_itable.clear();
        for d in self.dirs.values_mut() {
            d.dirty.clear();
        }
        self.layout_changed.clear();
        self.commits += 1;
        Ok(())
    }

    /// Dirty cached blocks (of one file or all) as coalesced writes, marked clean.
    pub(crate) fn dirty_data_ops(&mut self, only: Option<u64>) -> Result<Vec<BatchOp>, FsError> {
        let dirty = self.cache.take_dirty(only);
        self.placed(dirty)
    }

    /// Maps (file, file block, data) to device writes, merging physically contiguous blocks.
    pub(crate) fn placed(
        &mut self,
        blocks: Vec<(u64, u32, IoBuf)>,
    ) -> Result<Vec<BatchOp>, FsError> {
        let mut located = Vec::with_capacity(blocks.len());
        for (ino, b, buf) in blocks {
            let node = self.node(ino)?;
            if node.inode.kind == Kind::Free {
                continue;
            }
            let (p, _) = node.map.lookup(b).ok_or_else(|| {
                corrupt(format!("inode {ino}: cached block {b} has no device block"))
            })?;
            located.push((p, buf));
        }
        let targets: Vec<u64> = located.iter().map(|(p, _)| *p).collect();
        self.before_direct_writes(&targets)?;
        Ok(coalesce(located, self.bs, self.opts.max_command_bytes))
    }

    /// A block whose newest committed contents sit in the journal (a journaled data block) may
    /// not be written home directly: replay, or the next checkpoint, would put the older image
    /// back over the newer data. Such writes first checkpoint the journal, which writes every
    /// pending image home and retires it.
    pub(crate) fn before_direct_writes(&mut self, targets: &[u64]) -> Result<(), FsError> {
        if targets.iter().any(|&b| self.journal.image(b).is_some()) {
            let Inner { journal, io, .. } = self;
            journal.checkpoint(io)?;
        }
        Ok(())
    }

    /// The read-side twin of [`Inner::before_direct_writes`]: a file block whose newest committed
    /// contents sit in the journal (small fsync'd data is journaled, and its cached copy may have
    /// been evicted since) has a stale home copy, so reading it from the device would return old
    /// data. Such reads first checkpoint the journal. `runs` are (first device block, blocks).
    pub(crate) fn before_device_reads(&mut self, runs: &[(u64, u64)]) -> Result<(), FsError> {
        if runs
            .iter()
            .any(|&(start, count)| self.journal.has_image_in(start, count))
        {
            let Inner { journal, io, .. } = self;
            journal.checkpoint(io)?;
        }
        Ok(())
    }

    /// Writes dirty blocks evicted from the cache.
    pub(crate) fn write_victims(&mut self, victims: Vec<(u64, u32, IoBuf)>) -> Result<(), FsError> {
        if victims.is_empty() {
            return Ok(());
        }
        let ops = self.placed(victims)?;
        self.io.batch(ops)?;
        Ok(())
    }
}

/// A buffer for the device to read into, or for data about to be copied in whole: from the
/// registered pool, not zeroed, since every byte is overwritten before anyone looks.
pub(crate) fn io_buffer(len: usize) -> IoBuf {
    BufferPool::global()
        .alloc(len)
        .unwrap_or_else(|_| IoBuf::zeroed(len))
}

/// Sorts writes by device block and merges runs into commands of at most `max_bytes`.
pub(crate) fn coalesce(mut blocks: Vec<(u64, IoBuf)>, bs: usize, max_bytes: usize) -> Vec<BatchOp> {
    blocks.sort_by_key(|(p, _)| *p);
    let mut out: Vec<BatchOp> = Vec::new();
    let mut run: Vec<(u64, IoBuf)> = Vec::new();
    let flush_run = |run: &mut Vec<(u64, IoBuf)>, out: &mut Vec<BatchOp>| {
        if run.len() == 1 {
            if let Some((p, buf)) = run.pop() {
                out.push(BatchOp {
                    write: true,
                    block: p,
                    buf,
                });
            }
        } else if let Some(&(first, _)) = run.first() {
            let mut buf = io_buffer(run.len() * bs);
            for (i, (_, b)) in run.iter().enumerate() {
                buf[i * bs..(i + 1) * bs].copy_from_slice(&b[..bs]);
            }
            out.push(BatchOp {
                write: true,
                block: first,
                buf,
            });
            run.clear();
        }
    };
    for (p, buf) in blocks {
        let continues = run
            .last()
            .is_some_and(|(last, _)| *last + 1 == p && (run.len() + 1) * bs <= max_bytes);
        if !continues {
            flush_run(&mut run, &mut out);
        }
        run.push((p, buf));
    }
    flush_run(&mut run, &mut out);
    out
}
