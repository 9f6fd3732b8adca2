//! `fsck`: reads a whole AccelFS and reports every inconsistency it finds (format §10).
//!
//! It never writes. Committed journal transactions that mount would replay are applied in memory
//! first, so it checks the state the next mount will see. Each problem names the block or inode.

use crate::bitmap::Bitmap;
use crate::dir::{self, DirEntry};
use crate::error::{FormatError, FsError};
use crate::extent::{Extent, ExtentMap};
use crate::fsdevice::FsDevice;
use crate::header::{verify, BlockKind, HEADER_LEN};
use crate::inode::{Inode, Kind, INLINE_EXTENTS, INODE_SIZE};
use crate::journal::{self, JournalArea, JournalSuper};
use crate::layout::{Layout, Superblock, ROOT_INODE};
use kura_engine::{BlockDevice, BlockingIo};
use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};

/// Blocks listed one by one for each kind of block-bitmap mismatch; the rest are counted.
const LISTED_BLOCKS: u64 = 1000;
/// Blocks claimed twice whose other owner is looked for by name (each lookup scans the maps).
const OWNER_LOOKUPS: usize = 100;

/// What fsck found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FsckReport {
    /// Inconsistencies; empty when the file system is clean.
    pub problems: Vec<String>,
    /// Facts worth knowing that are not problems (journal to replay, backup superblock used).
    pub notes: Vec<String>,
    pub files: u64,
    pub directories: u64,
    pub used_blocks: u64,
    pub total_blocks: u64,
}

impl FsckReport {
    pub fn is_clean(&self) -> bool {
        self.problems.is_empty()
    }
}

/// Finds the superblock (primary, else the backup at the end of the device for any valid block
/// size) and views the device in its block size.
pub fn load_superblock(
    dev: Box<dyn BlockDevice>,
) -> Result<(Superblock, FsDevice, Option<String>), FsError> {
    let mut dev = dev;
    let geo = dev.geometry();
    let dbs = geo.block_size as usize;
    let head_len = dbs
        .max(65536)
        .min(geo.capacity_bytes() as usize / dbs * dbs);
    if head_len < 4096 {
        return Err(
            FormatError::NotAccelFs("the device is smaller than one AccelFS block".into()).into(),
        );
    }
    let mut head = vec![0u8; head_len];
    dev.read_blocks(0, &mut head)?;
    let primary_error = match Superblock::decode(&head, 0) {
        Ok(sb) => {
            let io = FsDevice::new(dev, sb.layout.block_size as usize)?;
            return check_fits(sb, io, None);
        }
        Err(e) => e,
    };
    for bs in [4096usize, 8192, 16384, 32768, 65536] {
        if bs < dbs || !bs.is_multiple_of(dbs) {
            continue;
        }
        let blocks = geo.capacity_bytes() / bs as u64;
        if blocks == 0 {
            continue;
        }
        let mut last = vec![0u8; bs];
        let lba = (blocks - 1) * (bs / dbs) as u64;
        if dev.read_blocks(lba, &mut last).is_err() {
            continue;
        }
        if let Ok(sb) = Superblock::decode(&last, blocks - 1) {
            if sb.layout.block_size as usize == bs {
                let io = FsDevice::new(dev, bs)?;
                return check_fits(
                    sb,
                    io,
                    Some(format!(
                        "primary superblock unusable ({primary_error}); using the backup"
                    )),
                );
            }
        }
    }
    Err(primary_error.into())
}

fn check_fits(
    sb: Superblock,
    io: FsDevice,
    note: Option<String>,
) -> Result<(Superblock, FsDevice, Option<String>), FsError> {
    if sb.layout.total_blocks > io.blocks() {
        return Err(FormatError::BadSuperblock(format!(
            "the superblock describes {} blocks but the device holds {}",
            sb.layout.total_blocks,
            io.blocks()
        ))
        .into());
    }
    Ok((sb, io, note))
}

/// Reads blocks with committed journal images laid over them.
struct Reader {
    io: FsDevice,
    overlay: HashMap<u64, Vec<u8>>,
}

impl Reader {
    fn read(&mut self, block: u64) -> Result<Vec<u8>, FsError> {
        match self.overlay.get(&block) {
            Some(b) => Ok(b.clone()),
            None => self.io.read(block),
        }
    }
}

/// Checks the AccelFS on `dev`. `Err` only when it cannot be read as AccelFS at all.
///
/// The passes run in this order, each adding its problems to the report in turn (the order of
/// the report's lines is part of its contract: tests compare them).
pub fn fsck(dev: Box<dyn BlockDevice>) -> Result<FsckReport, FsError> {
    let (sb, io, note) = load_superblock(dev)?;
    let mut c = Checker::new(sb.layout, io);
    c.posix = sb.features & crate::layout::FEATURE_POSIX != 0;
    c.superblocks(&sb, note)?;
    c.journal()?;
    let l = c.l;
    let block_bitmap = c.read_bitmap(
        l.block_bitmap_start,
        l.block_bitmap_len,
        l.total_blocks,
        BlockKind::BlockBitmap,
    )?;
    let inode_bitmap = c.read_bitmap(
        l.inode_bitmap_start,
        l.inode_bitmap_len,
        l.inode_count,
        BlockKind::InodeBitmap,
    )?;
    c.read_inodes()?;
    c.inode_bitmap(&inode_bitmap);
    c.root();
    c.claim_blocks()?;
    c.posix_inodes()?;
    c.block_bitmap(&block_bitmap);
    c.directories()?;
    c.link_counts();
    c.reachability();
    c.report.used_blocks = c.claimed.count_ones();
    Ok(c.report)
}

/// The fsck pass: what has been read so far, and the report being written.
struct Checker {
    l: Layout,
    rd: Reader,
    report: FsckReport,
    /// Inodes in use, by number (the table as the next mount will see it).
    inodes: BTreeMap<u64, Inode>,
    /// Blocks claimed so far: the metadata regions, then each inode's extent and data blocks.
    claimed: Bitmap,
    /// Block maps of inodes whose every block was claimed once (only these are read further).
    maps: HashMap<u64, ExtentMap>,
    /// Who claimed what, for naming the other owner of a block claimed twice: each inode's
    /// extent blocks, and the maps of inodes whose claims stopped at a shared block (a per-block
    /// owner table would let one crafted inode that maps the whole device fill memory).
    chains: HashMap<u64, Vec<u64>>,
    stopped: HashMap<u64, ExtentMap>,
    /// Owner lookups made so far (at most `OWNER_LOOKUPS`).
    lookups: usize,
    /// Directory entries naming each inode.
    refs: HashMap<u64, u32>,
    /// Each directory's entries, by inode.
    children: HashMap<u64, Vec<u64>>,
    /// The image has the `posix` feature.
    posix: bool,
}

impl Checker {
    fn new(l: Layout, io: FsDevice) -> Self {
        let mut claimed = Bitmap::new(l.total_blocks);
        claimed.set_range(0, l.data_start, true);
        claimed.set(l.backup_superblock(), true);
        Checker {
            l,
            rd: Reader {
                io,
                overlay: HashMap::new(),
            },
            report: FsckReport {
                total_blocks: l.total_blocks,
                ..FsckReport::default()
            },
            inodes: BTreeMap::new(),
            claimed,
            maps: HashMap::new(),
            chains: HashMap::new(),
            stopped: HashMap::new(),
            lookups: 0,
            refs: HashMap::new(),
            children: HashMap::new(),
            posix: false,
        }
    }

    // What the `posix` feature adds (format §5): nothing of it on an image without the flag;
    // a slow symbolic link maps exactly its block 0 and its target has no NUL; each
    // extended-attribute block lies in the data region, is claimed once and decodes.
    fn posix_inodes(&mut self) -> Result<(), FsError> {
        let inos: Vec<u64> = self.inodes.keys().copied().collect();
        for ino in inos {
            let inode = self.inodes[&ino].clone();
            if !self.posix
                && (inode.kind.needs_posix()
                    || inode.xattr_block != 0
                    || (inode.kind != Kind::Directory && inode.links > 1))
            {
                self.problem(format!(
                    "inode {ino} uses the posix feature (kind {:?}, {} links, attribute block {}) but the image does not have it",
                    inode.kind, inode.links, inode.xattr_block
                ));
            }
            if inode.kind == Kind::Symlink && !inode.is_fast_symlink() {
                if let Some(map) = self.maps.get(&ino) {
                    let e = map.extents();
                    if e.len() != 1 || e[0].logical != 0 || e[0].length != 1 {
                        self.problem(format!(
                            "symbolic link inode {ino}: its target is not exactly file block 0"
                        ));
                    } else {
                        let b = self.rd.read(e[0].physical)?;
                        if b[..inode.size as usize].contains(&0) {
                            self.problem(format!(
                                "symbolic link inode {ino}: its target contains a NUL byte"
                            ));
                        }
                    }
                }
            }
            let b = inode.xattr_block;
            if b == 0 {
                continue;
            }
            if b < self.l.data_start || b >= self.l.backup_superblock() {
                self.problem(format!(
                    "inode {ino}: extended-attribute block {b} lies outside the data region"
                ));
                continue;
            }
            if self.claimed.set(b, true) {
                let other = self.owner_of(b, ino);
                self.problem(format!(
                    "block {b} (extended attributes of inode {ino}) is also claimed by {other}"
                ));
                continue;
            }
            if let Err(e) = crate::xattr::decode_block(&self.rd.read(b)?, b) {
                self.problem(format!("inode {ino}: {e}"));
            }
        }
        Ok(())
    }

    fn problem(&mut self, what: String) {
        self.report.problems.push(what);
    }

    // Superblocks: a primary found unusable (the backup was loaded instead) is a problem; with a
    // good primary, the backup must decode and match it, or the next loss of block 0 is fatal.
    fn superblocks(&mut self, sb: &Superblock, note: Option<String>) -> Result<(), FsError> {
        self.report.notes.extend(note.clone());
        if note.is_some() {
            self.problem("the primary superblock is damaged (the backup is intact)".into());
            return Ok(());
        }
        let backup = self.l.backup_superblock();
        match Superblock::decode(&self.rd.read(backup)?, backup) {
            Ok(b) if b == *sb => {}
            Ok(_) => self.problem(format!(
                "the backup superblock (block {backup}) differs from the primary"
            )),
            Err(e) => self.problem(format!("backup superblock: {e}")),
        }
        Ok(())
    }

    // The journal: committed transactions are laid over the blocks in memory, so every later
    // pass checks the state the next mount will see. A transaction writing outside the metadata
    // it may touch is a problem and is not laid over.
    fn journal(&mut self) -> Result<(), FsError> {
        let l = self.l;
        let area = JournalArea {
            start: l.journal_start,
            len: l.journal_len,
        };
        let (first, second) = (self.rd.read(area.start)?, self.rd.read(area.start + 1)?);
        for (n, copy) in [(area.start, &first), (area.start + 1, &second)] {
            if let Err(e) = JournalSuper::decode(copy, n) {
                self.report.notes.push(format!("journal superblock copy in block {n} is unreadable ({e}); the other copy is used — expected only after a crash during a checkpoint"));
            }
        }
        match JournalSuper::newest(area, &first, &second) {
            Ok(js) => {
                let io = &mut self.rd.io;
                let (txns, _) = journal::scan(js, area, l.block_size as usize, |n| io.read(n))?;
                if !txns.is_empty() {
                    self.report.notes.push(format!(
                        "the journal holds {} committed transaction(s) that mount will replay",
                        txns.len()
                    ));
                }
                for t in txns {
                    for (target, image) in t.images {
                        if target < l.journal_start + l.journal_len || target >= l.total_blocks {
                            self.problem(format!("journal transaction {} writes block {target}, outside the metadata it may touch", t.seq));
                        } else {
                            self.rd.overlay.insert(target, image);
                        }
                    }
                }
            }
            Err(e) => self.problem(format!("journal superblock: {e}")),
        }
        Ok(())
    }

    // A bitmap's blocks: each must carry a valid header and checksum; a bad block is reported
    // and its bits stay clear, so the comparisons below report what it should have held.
    fn read_bitmap(
        &mut self,
        start: u64,
        len: u64,
        bits: u64,
        kind: BlockKind,
    ) -> Result<Bitmap, FsError> {
        let mut map = Bitmap::new(bits);
        for i in 0..len {
            let n = start + i;
            let b = self.rd.read(n)?;
            if let Err(e) = map.decode_block(i, &b, kind, n) {
                self.problem(format!("{}: {e}", kind.name()));
            }
        }
        Ok(map)
    }

    // The inode table: every block verifies, every slot decodes; the inodes in use are kept for
    // the passes below, and inode 0 (reserved) must be free.
    fn read_inodes(&mut self) -> Result<(), FsError> {
        let l = self.l;
        let per = Layout::inodes_per_block(l.block_size);
        for i in 0..l.inode_table_len {
            let n = l.inode_table_start + i;
            let b = self.rd.read(n)?;
            if let Err(e) = verify(&b, BlockKind::InodeTable, n) {
                self.problem(format!("inode table: {e}"));
                continue;
            }
            for slot in 0..per {
                let ino = i * per + slot;
                if ino >= l.inode_count {
                    break;
                }
                let at = HEADER_LEN + slot as usize * INODE_SIZE;
                match Inode::decode(ino, &b[at..at + INODE_SIZE]) {
                    Ok(inode) if inode.kind != Kind::Free => {
                        if ino == 0 {
                            self.problem("inode 0 is reserved but in use".into());
                        }
                        self.inodes.insert(ino, inode);
                    }
                    Ok(_) => {}
                    Err(e) => self.problem(e.to_string()),
                }
            }
        }
        Ok(())
    }

    // The inode bitmap marks exactly the inodes in use (inode 0 aside), or mount would hand out
    // a live inode or never reuse a free one.
    fn inode_bitmap(&mut self, inode_bitmap: &Bitmap) {
        for ino in 1..self.l.inode_count {
            let used = self.inodes.contains_key(&ino);
            if used != inode_bitmap.get(ino) {
                self.problem(format!(
                    "inode {ino} is {} but marked {} in the inode bitmap",
                    if used { "in use" } else { "free" },
                    if used { "free" } else { "used" }
                ));
            }
        }
    }

    // The root inode exists and is a directory: everything else hangs from it.
    fn root(&mut self) {
        match self.inodes.get(&ROOT_INODE) {
            Some(root) if root.kind == Kind::Directory => {}
            _ => self.problem("the root inode is not a directory".into()),
        }
    }

    // Block maps: each inode's fields are possible, its extent chain reads back, its extents lie
    // in the data region, every block is claimed once (by one inode, never by metadata), and its
    // block count matches what it maps.
    fn claim_blocks(&mut self) -> Result<(), FsError> {
        let l = self.l;
        let inos: Vec<u64> = self.inodes.keys().copied().collect();
        for ino in inos {
            let inode = &self.inodes[&ino];
            if let Some(why) = l.inode_problem(ino, inode) {
                self.problem(why);
                continue;
            }
            let (map, extent_blocks) = match read_extents(&mut self.rd, ino, inode, &l) {
                Ok(v) => v,
                Err(e) => {
                    self.problem(e);
                    continue;
                }
            };
            if let Err(e) = map.validate(l.data_start, l.backup_superblock()) {
                self.problem(format!("inode {ino}: {e}"));
                continue;
            }
            // The first block claimed twice ends this inode's claims: its map is not trusted any
            // further (nor read as a directory), and every block is then claimed at most once plus
            // once per inode, however many inodes a crafted image points at the same blocks.
            let mut shared = None;
            let blocks = extent_blocks.iter().map(|&b| (b, "extent block")).chain(
                map.extents().iter().flat_map(|e| {
                    (e.physical..e.physical + u64::from(e.length)).map(|b| (b, "data"))
                }),
            );
            for (block, what) in blocks {
                if self.claimed.set(block, true) {
                    shared = Some((block, what));
                    break;
                }
            }
            let counted = map.mapped_blocks() + extent_blocks.len() as u64;
            self.chains.insert(ino, extent_blocks);
            if let Some((block, what)) = shared {
                let other = self.owner_of(block, ino);
                self.problem(format!(
                    "block {block} ({what} of inode {ino}) is also claimed by {other}; the rest of inode {ino}'s blocks were not checked"
                ));
                self.stopped.insert(ino, map);
                continue;
            }
            let said = self.inodes[&ino].blocks;
            if said != counted {
                self.problem(format!(
                    "inode {ino} says it holds {said} blocks but maps {counted}"
                ));
            }
            self.maps.insert(ino, map);
        }
        Ok(())
    }

    /// Names who else claims `block` (claimed again by inode `ino`): metadata, the earliest
    /// earlier inode whose extent blocks or map cover it, or just "another inode" once
    /// `OWNER_LOOKUPS` lookups have been spent (each scans every map).
    fn owner_of(&mut self, block: u64, ino: u64) -> String {
        if block < self.l.data_start || block == self.l.backup_superblock() {
            return "metadata".to_string();
        }
        if self.lookups >= OWNER_LOOKUPS {
            return "another inode".to_string();
        }
        self.lookups += 1;
        let covers = |m: &ExtentMap| m.first_mapped_of(&[block]).is_some();
        let mut earlier: Vec<u64> = self.chains.keys().copied().filter(|&o| o != ino).collect();
        earlier.sort_unstable();
        earlier
            .into_iter()
            .find(|o| {
                self.chains[o].contains(&block)
                    || self.maps.get(o).is_some_and(covers)
                    || self.stopped.get(o).is_some_and(covers)
            })
            .map_or("another inode".to_string(), |o| format!("inode {o}"))
    }

    // The block bitmap marks exactly the blocks claimed. One line per block would let a crafted
    // bitmap of a large (sparse) device fill memory with reports: the first few are listed, the
    // rest counted.
    fn block_bitmap(&mut self, block_bitmap: &Bitmap) {
        let (mut unmarked, mut leaked) = (0u64, 0u64);
        for b in 0..self.l.total_blocks {
            match (block_bitmap.get(b), self.claimed.get(b)) {
                (false, true) => {
                    unmarked += 1;
                    if unmarked <= LISTED_BLOCKS {
                        self.problem(format!(
                            "block {b} is in use but marked free in the block bitmap"
                        ));
                    }
                }
                (true, false) => {
                    leaked += 1;
                    if leaked <= LISTED_BLOCKS {
                        self.problem(format!(
                            "block {b} is marked used but nothing uses it (leaked)"
                        ));
                    }
                }
                _ => {}
            }
        }
        for (n, what) in [
            (unmarked, "in use but marked free"),
            (leaked, "marked used but unused"),
        ] {
            if n > LISTED_BLOCKS {
                self.problem(format!(
                    "... {} more blocks {what} (not listed), {n} in all",
                    n - LISTED_BLOCKS
                ));
            }
        }
    }

    // Directories: every block of every trusted directory map decodes, and each entry is checked
    // (below); files and directories are counted here. The entries found feed the link-count and
    // reachability passes.
    fn directories(&mut self) -> Result<(), FsError> {
        let inos: Vec<u64> = self.inodes.keys().copied().collect();
        for ino in inos {
            if self.inodes[&ino].kind != Kind::Directory {
                self.report.files += 1;
                continue;
            }
            self.report.directories += 1;
            let Some(extents) = self.maps.get(&ino).map(|m| m.extents().to_vec()) else {
                continue;
            };
            let mut names = HashSet::new();
            for e in extents {
                for k in 0..u64::from(e.length) {
                    let n = e.physical + k;
                    match dir::decode_block(&self.rd.read(n)?, n) {
                        Ok(entries) => {
                            for entry in entries {
                                self.entry(ino, &entry, &mut names);
                            }
                        }
                        Err(err) => self.problem(format!("directory inode {ino}: {err}")),
                    }
                }
            }
        }
        Ok(())
    }

    /// One entry of directory `ino`: its name is unique in the directory, it names an inode in
    /// use of the kind it says, and a directory it names points back at `ino` as its parent.
    fn entry(&mut self, ino: u64, entry: &DirEntry, names: &mut HashSet<Vec<u8>>) {
        let shown = String::from_utf8_lossy(&entry.name).into_owned();
        if !names.insert(entry.name.clone()) {
            self.problem(format!("directory inode {ino} lists `{shown}` twice"));
        }
        match self.inodes.get(&entry.ino) {
            None => self.problem(format!(
                "directory inode {ino}: `{shown}` names inode {}, which is not in use",
                entry.ino
            )),
            Some(target) if target.kind != entry.kind => {
                let kind = target.kind;
                self.problem(format!(
                    "directory inode {ino}: `{shown}` says {:?} but inode {} is a {kind:?}",
                    entry.kind, entry.ino
                ))
            }
            Some(target) => {
                let (kind, parent) = (target.kind, target.parent);
                *self.refs.entry(entry.ino).or_default() += 1;
                self.children.entry(ino).or_default().push(entry.ino);
                if kind == Kind::Directory && parent != ino {
                    self.problem(format!(
                        "directory inode {} is listed in {ino} but names {parent} as its parent",
                        entry.ino
                    ));
                }
            }
        }
    }

    // Link counts: each inode's count equals the directory entries naming it; the root is named
    // by none (its own `..` is implicit).
    fn link_counts(&mut self) {
        let inos: Vec<u64> = self.inodes.keys().copied().collect();
        for ino in inos {
            if ino == ROOT_INODE {
                if self.refs.contains_key(&ino) {
                    self.problem("the root directory is listed inside a directory".into());
                }
                continue;
            }
            let have = self.refs.get(&ino).copied().unwrap_or(0);
            let links = self.inodes[&ino].links;
            if have != links {
                self.problem(format!(
                    "inode {ino} has link count {links} but {have} directory entries"
                ));
            }
        }
    }

    // Reachability: every inode in use is reached from the root through directory entries; the
    // rest are orphans (space no path can free).
    fn reachability(&mut self) {
        let mut seen = HashSet::from([ROOT_INODE]);
        let mut queue = VecDeque::from([ROOT_INODE]);
        while let Some(d) = queue.pop_front() {
            for &c in self.children.get(&d).map(Vec::as_slice).unwrap_or(&[]) {
                if seen.insert(c) {
                    queue.push_back(c);
                }
            }
        }
        let orphans: Vec<u64> = self
            .inodes
            .keys()
            .copied()
            .filter(|ino| !seen.contains(ino))
            .collect();
        for ino in orphans {
            self.problem(format!(
                "inode {ino} is in use but not reachable from the root (orphan)"
            ));
        }
    }
}

/// An inode's extents (inline, then the extent-block chain) and the extent blocks themselves.
fn read_extents(
    rd: &mut Reader,
    ino: u64,
    inode: &Inode,
    l: &Layout,
) -> Result<(ExtentMap, Vec<u64>), String> {
    let count = inode.extent_count as usize;
    let mut extents: Vec<Extent> = inode.inline[..count.min(INLINE_EXTENTS)].to_vec();
    let mut chain = Vec::new();
    let mut seen = HashSet::new();
    let mut next = inode.extent_block;
    while extents.len() < count {
        if next < l.data_start || next >= l.backup_superblock() || !seen.insert(next) {
            return Err(format!("inode {ino}: extent chain points at block {next}, outside the data region or in a loop"));
        }
        let block = rd.read(next).map_err(|e| format!("inode {ino}: {e}"))?;
        let (more, after) =
            ExtentMap::decode_block(&block, next).map_err(|e| format!("inode {ino}: {e}"))?;
        chain.push(next);
        if more.is_empty() {
            break;
        }
        extents.extend(more);
        next = after;
    }
    if extents.len() != count {
        return Err(format!(
            "inode {ino} says it has {count} extents but {} were found",
            extents.len()
        ));
    }
    let map = ExtentMap::from_extents(extents);
    if let Some(b) = map.first_mapped_of(&chain) {
        return Err(format!(
            "inode {ino}: extent block {b} is also one of its data blocks"
        ));
    }
    Ok((map, chain))
}
