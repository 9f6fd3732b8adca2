//! Inode metadata: the inodes of the mounted file system with their block maps ([`Node`]), the
//! inode-table blocks they live in, which of them the running transaction changed, and the
//! attributes the API reads and sets (`stat`, `chmod`, `touch`, handle checks).
//!
//! Owns the fields `nodes`, `dirty_nodes`, `dirty_extra`, `itable` and `dirty_itable` of
//! [`Mounted`]; the inode bitmap stays with the allocator. Node fields are visible to the other
//! concerns of the mounted state (the data path maps blocks, the journal lays out extent
//! chains), not outside it.

use super::{corrupt, Mounted};
use crate::error::FsError;
use crate::extent::{Extent, ExtentMap};
use crate::fs::{file_type, Metadata};
use crate::header::{seal, verify, BlockKind, HEADER_LEN};
use crate::inode::{Inode, Kind, INLINE_EXTENTS, INODE_SIZE};
use crate::layout::{Layout, ROOT_INODE};

/// An inode and its block map.
pub(super) struct Node {
    pub(super) inode: Inode,
    pub(super) map: ExtentMap,
    /// Extent blocks holding the extents past the inline ones, in chain order.
    pub(super) chain: Vec<u64>,
    /// What each chain block holds on the device (or in the journal) now.
    pub(super) chain_images: Vec<Vec<u8>>,
    pub(super) map_dirty: bool,
    /// Extended attributes, once loaded (`xattrs.rs`).
    pub(super) xattrs: Option<Vec<crate::xattr::Xattr>>,
    /// The attributes changed in the running transaction.
    pub(super) xattrs_dirty: bool,
    /// What this node adds to `Mounted::dirty_extra` (its [`Node::extra_blocks`] when last
    /// touched in the running transaction; 0 when it is not dirty).
    counted: usize,
}

impl Node {
    /// Extent and attribute blocks a commit may write for this node beyond its inode: the
    /// chain and one more block when its map changed, the attribute block when those changed.
    fn extra_blocks(&self) -> usize {
        (if self.map_dirty {
            self.chain.len() + 1
        } else {
            0
        }) + usize::from(self.xattrs_dirty)
    }
}

impl Mounted {
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
    pub(super) fn node(&mut self, ino: u64) -> Result<&mut Node, FsError> {
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
                xattrs: None,
                xattrs_dirty: false,
                counted: 0,
            });
        }
        if !self.posix
            && (inode.kind.needs_posix()
                || inode.xattr_block != 0
                || (inode.kind != Kind::Directory && inode.links > 1))
        {
            return Err(corrupt(format!(
                "inode {ino} uses the posix feature (kind {:?}, {} links, attribute block {}) on an image without it",
                inode.kind, inode.links, inode.xattr_block
            )));
        }
        if inode.xattr_block != 0
            && (inode.xattr_block < l.data_start || inode.xattr_block >= l.backup_superblock())
        {
            return Err(corrupt(format!(
                "inode {ino}: extended-attribute block {} is outside the data region",
                inode.xattr_block
            )));
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
        if inode.xattr_block != 0
            && (chain.contains(&inode.xattr_block)
                || map.first_mapped_of(&[inode.xattr_block]).is_some())
        {
            return Err(corrupt(format!(
                "inode {ino}: extended-attribute block {} is also one of its other blocks",
                inode.xattr_block
            )));
        }
        if inode.kind == Kind::Symlink && !inode.is_fast_symlink() && map.lookup(0).is_none() {
            return Err(corrupt(format!(
                "inode {ino}: symbolic link without its target block"
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
            .chain(chain.iter().map(|&b| (b, 1)))
            .chain((inode.xattr_block != 0).then_some((inode.xattr_block, 1)));
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
            xattrs: None,
            xattrs_dirty: false,
            counted: 0,
        })
    }

    /// Records that inode `ino` changed in the running transaction, and counts its extent and
    /// attribute blocks in `dirty_extra` afresh: whatever sets `map_dirty` or `xattrs_dirty`
    /// touches the node afterwards, so the count stays what [`Mounted::inode_blocks_estimate`]
    /// would find by walking every dirty node (which made each operation's estimate cost as
    /// much as the transaction was large).
    pub(super) fn touch(&mut self, ino: u64) {
        self.dirty_nodes.insert(ino);
        if let Some(n) = self.nodes.get_mut(&ino) {
            let extra = n.extra_blocks();
            self.dirty_extra = self.dirty_extra - n.counted + extra;
            n.counted = extra;
        }
    }

    /// Allocates and initialises a new inode of `kind` under `parent`.
    pub(super) fn new_node(&mut self, kind: Kind, mode: u16, parent: u64) -> Result<u64, FsError> {
        let ino = self
            .alloc
            .alloc_inode()
            .ok_or_else(|| FsError::NoSpace("every inode is in use".into()))?;
        let (previous, counted) = match self.node(ino) {
            Ok(n) => (n.inode.generation, n.counted),
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
                xattrs: Some(Vec::new()),
                xattrs_dirty: false,
                // What the replaced node counted, so that `touch` replaces it.
                counted,
            },
        );
        self.touch(ino);
        Ok(ino)
    }

    /// Frees an inode and every block it holds (deferred to the commit by the allocator).
    pub(super) fn free_node(&mut self, ino: u64) -> Result<(), FsError> {
        let node = self.node(ino)?;
        let freed = node.map.truncate(0);
        let chain = std::mem::take(&mut node.chain);
        node.chain_images.clear();
        let generation = node.inode.generation;
        let xattr_block = node.inode.xattr_block;
        node.inode = Inode::free();
        node.inode.generation = generation;
        node.map_dirty = false;
        node.xattrs = None;
        node.xattrs_dirty = false;
        if xattr_block != 0 {
            self.alloc.free_blocks(xattr_block, 1);
        }
        for (start, len) in freed {
            self.alloc.free_blocks(start, u64::from(len));
        }
        for b in chain {
            self.alloc.free_blocks(b, 1);
        }
        self.alloc.free_inode(ino);
        self.forget_data(ino);
        self.forget_dir(ino);
        self.touch(ino);
        Ok(())
    }

    pub(super) fn touch_mtime(&mut self, ino: u64) -> Result<(), FsError> {
        let now = crate::mkfs::now_ns();
        let n = self.node(ino)?;
        n.inode.mtime_ns = now;
        n.inode.ctime_ns = now;
        self.touch(ino);
        Ok(())
    }

    /// The inode record of `ino` (loaded if needed).
    pub(crate) fn inode(&mut self, ino: u64) -> Result<&Inode, FsError> {
        Ok(&self.node(ino)?.inode)
    }

    /// Checks that a handle opened on inode `ino` of `generation` still names that file.
    pub(crate) fn check_handle(&mut self, ino: u64, generation: u32) -> Result<(), FsError> {
        let n = self.node(ino)?;
        if n.inode.kind == Kind::Free || n.inode.generation != generation {
            return Err(FsError::NotFound(format!(
                "inode {ino}: the file was removed while open"
            )));
        }
        Ok(())
    }

    /// [`Mounted::check_handle`] under the shared state lock: `None` when the inode is not
    /// loaded yet (loading needs the exclusive lock).
    pub(crate) fn check_loaded_handle(
        &self,
        ino: u64,
        generation: u32,
    ) -> Option<Result<(), FsError>> {
        let n = self.nodes.get(&ino)?;
        Some(
            if n.inode.kind == Kind::Free || n.inode.generation != generation {
                Err(FsError::NotFound(format!(
                    "inode {ino}: the file was removed while open"
                )))
            } else {
                Ok(())
            },
        )
    }

    /// What `stat` tells about inode `ino`, under the shared state lock: `None` when the inode
    /// is not loaded or is free (the exclusive path loads it or reports the error).
    pub(crate) fn loaded_metadata(&self, ino: u64) -> Option<Metadata> {
        let n = self.nodes.get(&ino)?;
        if n.inode.kind == Kind::Free {
            return None;
        }
        Some(self.metadata_of_node(ino, n))
    }

    /// What `stat` tells about inode `ino`.
    pub(crate) fn metadata(&mut self, ino: u64) -> Result<Metadata, FsError> {
        let n = self.node(ino)?;
        if n.inode.kind == Kind::Free {
            return Err(FsError::NotFound(format!("inode {ino}")));
        }
        let n = &self.nodes[&ino];
        Ok(self.metadata_of_node(ino, n))
    }

    fn metadata_of_node(&self, ino: u64, n: &Node) -> Metadata {
        let bs = self.layout().block_size;
        Metadata {
            ino,
            file_type: file_type(n.inode.kind),
            size: n.inode.size,
            blocks: n.map.mapped_blocks() + n.chain.len() as u64,
            block_size: bs,
            links: n.inode.links,
            mode: n.inode.mode,
            mtime_ns: n.inode.mtime_ns,
            ctime_ns: n.inode.ctime_ns,
            atime_ns: if n.inode.atime_ns == 0 {
                n.inode.mtime_ns
            } else {
                n.inode.atime_ns
            },
            generation: n.inode.generation,
            owner: n.inode.owner(),
            rdev: n.inode.rdev,
            parent: if ino == ROOT_INODE {
                ROOT_INODE
            } else {
                n.inode.parent
            },
        }
    }

    /// Changes permission bits and/or the modification time (what `chmod` and `touch` do).
    pub(crate) fn set_attr(
        &mut self,
        ino: u64,
        mode: Option<u16>,
        mtime_ns: Option<u64>,
    ) -> Result<(), FsError> {
        self.writable()?;
        self.make_transaction_room()?;
        let n = self.node(ino)?;
        if n.inode.kind == Kind::Free {
            return Err(FsError::NotFound(format!("inode {ino}")));
        }
        if let Some(m) = mode {
            n.inode.mode = m & 0o7777;
        }
        if let Some(t) = mtime_ns {
            n.inode.mtime_ns = t;
        }
        n.inode.ctime_ns = crate::mkfs::now_ns();
        self.touch(ino);
        Ok(())
    }

    /// Records the owner (`chown`); a field not given keeps its recorded value (0 when none was).
    pub(crate) fn set_owner(
        &mut self,
        ino: u64,
        uid: Option<u32>,
        gid: Option<u32>,
    ) -> Result<(), FsError> {
        self.writable()?;
        self.make_transaction_room()?;
        let n = self.live_node(ino)?;
        if uid.is_none() && gid.is_none() {
            return Ok(());
        }
        n.inode.flags |= crate::inode::FLAG_OWNER;
        if let Some(u) = uid {
            n.inode.uid = u;
        }
        if let Some(g) = gid {
            n.inode.gid = g;
        }
        n.inode.ctime_ns = crate::mkfs::now_ns();
        self.touch(ino);
        Ok(())
    }

    /// Sets access and/or modification time (`utimens`); ctime becomes now.
    pub(crate) fn set_times(
        &mut self,
        ino: u64,
        atime_ns: Option<u64>,
        mtime_ns: Option<u64>,
    ) -> Result<(), FsError> {
        self.writable()?;
        self.make_transaction_room()?;
        let n = self.live_node(ino)?;
        if let Some(t) = atime_ns {
            // 0 means "never recorded" on disk; the first nanosecond is close enough.
            n.inode.atime_ns = t.max(1);
        }
        if let Some(t) = mtime_ns {
            n.inode.mtime_ns = t;
        }
        n.inode.ctime_ns = crate::mkfs::now_ns();
        self.touch(ino);
        Ok(())
    }

    /// Inode `ino`, which must be in use.
    pub(super) fn live_node(&mut self, ino: u64) -> Result<&mut Node, FsError> {
        let n = self.node(ino)?;
        if n.inode.kind == Kind::Free {
            return Err(FsError::NotFound(format!("inode {ino}")));
        }
        Ok(n)
    }

    // ---- the inodes' part of the running transaction ----------------------------------------

    /// Inode-table and extent blocks the running transaction would write now (an upper
    /// estimate): the inode-table blocks, one per dirty inode, and the extent and attribute
    /// blocks counted as nodes were touched (`touch`). Debug builds check that count against
    /// a walk of every dirty node.
    pub(super) fn inode_blocks_estimate(&self) -> usize {
        debug_assert_eq!(
            self.dirty_extra,
            self.dirty_nodes
                .iter()
                .filter_map(|i| self.nodes.get(i))
                .map(Node::extra_blocks)
                .sum::<usize>(),
            "a node's map or attributes changed without a touch after it"
        );
        self.dirty_itable.len() + self.dirty_nodes.len() + self.dirty_extra
    }

    /// The block images of every inode changed in the running transaction: the extent chains
    /// whose contents changed, then the sealed inode-table blocks.
    pub(super) fn inode_images(&mut self) -> Result<Vec<(u64, Vec<u8>)>, FsError> {
        let mut images = Vec::new();
        let dirty: Vec<u64> = self.dirty_nodes.iter().copied().collect();
        for &ino in &dirty {
            if self.node(ino)?.map_dirty {
                images.extend(self.layout_chain(ino)?);
            }
            images.extend(self.xattr_image(ino)?);
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
        Ok(images)
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

    /// The running transaction was committed: no inode is dirty any more.
    pub(super) fn inodes_committed(&mut self) {
        for ino in std::mem::take(&mut self.dirty_nodes) {
            if let Some(n) = self.nodes.get_mut(&ino) {
                n.counted = 0;
            }
        }
        self.dirty_extra = 0;
        self.dirty_itable.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::Node;
    use crate::{Fallocate, FileSystem, MkfsOptions, MountOptions, XattrMode};
    use kura_engine::backend::common::QueueOptions;
    use kura_engine::backend::mem::MemDevice;

    /// `dirty_extra` against a walk of every dirty node, after each kind of change that sets
    /// or clears a node's `map_dirty`, chain or `xattrs_dirty`.
    #[test]
    fn the_counted_extent_and_attribute_blocks_match_a_walk_of_the_dirty_nodes() {
        let fs = FileSystem::format(
            Box::new(MemDevice::new(64 << 20, QueueOptions::default())),
            MkfsOptions::default(),
            MountOptions::default(),
        )
        .expect("format");
        let check = |what: &str| {
            let g = fs.lock();
            let walked: usize = g
                .dirty_nodes
                .iter()
                .filter_map(|i| g.nodes.get(i))
                .map(Node::extra_blocks)
                .sum();
            assert_eq!(g.dirty_extra, walked, "after {what}");
            walked
        };
        // Two files appended block by block in turn: their extents interleave, so each needs
        // an extent chain beyond the inline extents.
        let mut a = fs.create("/a").expect("create a");
        let mut b = fs.create("/b").expect("create b");
        let block = vec![7u8; 4096];
        for _ in 0..200 {
            a.append(&block).expect("append a");
            b.append(&block).expect("append b");
        }
        assert!(check("interleaved appends") > 0);
        fs.sync().expect("sync");
        assert_eq!(check("a sync"), 0);
        assert!(fs
            .lock()
            .nodes
            .get(&a.ino())
            .is_some_and(|n| !n.chain.is_empty()));
        a.write_at(4096 * 500, &block).expect("write past the end");
        check("a write into a hole");
        fs.set_xattr(a.ino(), b"user.k", b"v", XattrMode::Any)
            .expect("set_xattr");
        check("an attribute");
        fs.fallocate(b.ino(), 4096 * 10, 4096 * 20, Fallocate::PunchHole)
            .expect("punch");
        check("a punched hole");
        b.set_len(4096 * 3 + 100).expect("truncate");
        check("a truncation");
        fs.sync().expect("sync");
        assert_eq!(check("a sync"), 0);
        fs.remove_file("/a").expect("remove a");
        check("a removal");
        fs.write("/c", b"small").expect("write c");
        check("a new file");
        fs.sync().expect("sync");
        assert_eq!(check("a sync"), 0);
    }
}
