//! `fsck`: reads a whole AccelFS and reports every inconsistency it finds (format §10).
//!
//! It never writes. Committed journal transactions that mount would replay are applied in memory
//! first, so it checks the state the next mount will see. Each problem names the block or inode.

use crate::bitmap::Bitmap;
use crate::blockio::BlockIo;
use crate::dir;
use crate::error::{FormatError, FsError};
use crate::extent::{Extent, ExtentMap};
use crate::header::{verify, BlockKind, HEADER_LEN};
use crate::inode::{Inode, Kind, INLINE_EXTENTS, INODE_SIZE};
use crate::journal::{self, JournalArea, JournalSuper};
use crate::layout::{Layout, Superblock, ROOT_INODE};
use kura_engine::{BlockDevice, BlockingIo};
use std::collections::{HashMap, HashSet, VecDeque};

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
) -> Result<(Superblock, BlockIo, Option<String>), FsError> {
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
            let io = BlockIo::new(dev, sb.layout.block_size as usize)?;
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
                let io = BlockIo::new(dev, bs)?;
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
    io: BlockIo,
    note: Option<String>,
) -> Result<(Superblock, BlockIo, Option<String>), FsError> {
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
    io: BlockIo,
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
pub fn fsck(dev: Box<dyn BlockDevice>) -> Result<FsckReport, FsError> {
    let (sb, io, note) = load_superblock(dev)?;
    let l = sb.layout;
    let bs = l.block_size as usize;
    let mut r = FsckReport {
        total_blocks: l.total_blocks,
        ..FsckReport::default()
    };
    r.notes.extend(note.clone());
    if note.is_some() {
        r.problems
            .push("the primary superblock is damaged (the backup is intact)".into());
    }
    let mut rd = Reader {
        io,
        overlay: HashMap::new(),
    };
    if note.is_none() {
        let backup = l.backup_superblock();
        match Superblock::decode(&rd.read(backup)?, backup) {
            Ok(b) if b == sb => {}
            Ok(_) => r.problems.push(format!(
                "the backup superblock (block {backup}) differs from the primary"
            )),
            Err(e) => r.problems.push(format!("backup superblock: {e}")),
        }
    }

    // The journal: replay committed transactions in memory.
    let area = JournalArea {
        start: l.journal_start,
        len: l.journal_len,
    };
    let (first, second) = (rd.read(area.start)?, rd.read(area.start + 1)?);
    for (n, copy) in [(area.start, &first), (area.start + 1, &second)] {
        if let Err(e) = JournalSuper::decode(copy, n) {
            r.notes.push(format!("journal superblock copy in block {n} is unreadable ({e}); the other copy is used — expected only after a crash during a checkpoint"));
        }
    }
    match JournalSuper::newest(area, &first, &second) {
        Ok(js) => {
            let io = &mut rd.io;
            let (txns, _) = journal::scan(js, area, bs, |n| io.read(n))?;
            if !txns.is_empty() {
                r.notes.push(format!(
                    "the journal holds {} committed transaction(s) that mount will replay",
                    txns.len()
                ));
            }
            for t in txns {
                for (target, image) in t.images {
                    if target < l.journal_start + l.journal_len || target >= l.total_blocks {
                        r.problems.push(format!("journal transaction {} writes block {target}, outside the metadata it may touch", t.seq));
                    } else {
                        rd.overlay.insert(target, image);
                    }
                }
            }
        }
        Err(e) => r.problems.push(format!("journal superblock: {e}")),
    }

    let block_bitmap = read_bitmap(
        &mut rd,
        &mut r,
        l.block_bitmap_start,
        l.block_bitmap_len,
        l.total_blocks,
        BlockKind::BlockBitmap,
    )?;
    let inode_bitmap = read_bitmap(
        &mut rd,
        &mut r,
        l.inode_bitmap_start,
        l.inode_bitmap_len,
        l.inode_count,
        BlockKind::InodeBitmap,
    )?;

    // Inodes.
    let per = Layout::inodes_per_block(l.block_size);
    let mut inodes: HashMap<u64, Inode> = HashMap::new();
    for i in 0..l.inode_table_len {
        let n = l.inode_table_start + i;
        let b = rd.read(n)?;
        if let Err(e) = verify(&b, BlockKind::InodeTable, n) {
            r.problems.push(format!("inode table: {e}"));
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
                        r.problems.push("inode 0 is reserved but in use".into());
                    }
                    inodes.insert(ino, inode);
                }
                Ok(_) => {}
                Err(e) => r.problems.push(e.to_string()),
            }
        }
    }
    for ino in 1..l.inode_count {
        let used = inodes.contains_key(&ino);
        if used != inode_bitmap.get(ino) {
            r.problems.push(format!(
                "inode {ino} is {} but marked {} in the inode bitmap",
                if used { "in use" } else { "free" },
                if used { "free" } else { "used" }
            ));
        }
    }
    match inodes.get(&ROOT_INODE) {
        Some(root) if root.kind == Kind::Directory => {}
        _ => r.problems.push("the root inode is not a directory".into()),
    }

    // Block maps: every block claimed once, inside the data region.
    let mut claimed = Bitmap::new(l.total_blocks);
    claimed.set_range(0, l.data_start, true);
    claimed.set(l.backup_superblock(), true);
    let mut maps: HashMap<u64, ExtentMap> = HashMap::new();
    // Who claimed what, for naming the other owner of a block claimed twice: each inode's
    // extent blocks, and the maps of inodes whose claims stopped at a shared block (a per-block
    // owner table would let one crafted inode that maps the whole device fill memory).
    let mut chains: HashMap<u64, Vec<u64>> = HashMap::new();
    let mut stopped: HashMap<u64, ExtentMap> = HashMap::new();
    let mut lookups = 0usize;
    let mut inos: Vec<u64> = inodes.keys().copied().collect();
    inos.sort_unstable();
    for &ino in &inos {
        let inode = &inodes[&ino];
        if let Some(why) = l.inode_problem(ino, inode) {
            r.problems.push(why);
            continue;
        }
        let (map, extent_blocks) = match read_extents(&mut rd, ino, inode, &l) {
            Ok(v) => v,
            Err(e) => {
                r.problems.push(e);
                continue;
            }
        };
        if let Err(e) = map.validate(l.data_start, l.backup_superblock()) {
            r.problems.push(format!("inode {ino}: {e}"));
            continue;
        }
        // The first block claimed twice ends this inode's claims: its map is not trusted any
        // further (nor read as a directory), and every block is then claimed at most once plus
        // once per inode, however many inodes a crafted image points at the same blocks.
        let mut shared = None;
        let blocks = extent_blocks.iter().map(|&b| (b, "extent block")).chain(
            map.extents()
                .iter()
                .flat_map(|e| (e.physical..e.physical + u64::from(e.length)).map(|b| (b, "data"))),
        );
        for (block, what) in blocks {
            if claimed.set(block, true) {
                shared = Some((block, what));
                break;
            }
        }
        chains.insert(ino, extent_blocks.clone());
        if let Some((block, what)) = shared {
            let other = if block < l.data_start || block == l.backup_superblock() {
                "metadata".to_string()
            } else if lookups >= OWNER_LOOKUPS {
                "another inode".to_string()
            } else {
                lookups += 1;
                let covers = |m: &ExtentMap| m.first_mapped_of(&[block]).is_some();
                let mut earlier: Vec<u64> = chains.keys().copied().filter(|&o| o != ino).collect();
                earlier.sort_unstable();
                earlier
                    .into_iter()
                    .find(|o| {
                        chains[o].contains(&block)
                            || maps.get(o).is_some_and(covers)
                            || stopped.get(o).is_some_and(covers)
                    })
                    .map_or("another inode".to_string(), |o| format!("inode {o}"))
            };
            r.problems.push(format!(
                "block {block} ({what} of inode {ino}) is also claimed by {other}; the rest of inode {ino}'s blocks were not checked"
            ));
            stopped.insert(ino, map);
            continue;
        }
        let counted = map.mapped_blocks() + extent_blocks.len() as u64;
        if inode.blocks != counted {
            r.problems.push(format!(
                "inode {ino} says it holds {} blocks but maps {counted}",
                inode.blocks
            ));
        }
        maps.insert(ino, map);
    }
    // One line per block would let a crafted bitmap of a large (sparse) device fill memory
    // with reports: the first few are listed, the rest counted.
    let (mut unmarked, mut leaked) = (0u64, 0u64);
    for b in 0..l.total_blocks {
        match (block_bitmap.get(b), claimed.get(b)) {
            (false, true) => {
                unmarked += 1;
                if unmarked <= LISTED_BLOCKS {
                    r.problems.push(format!(
                        "block {b} is in use but marked free in the block bitmap"
                    ));
                }
            }
            (true, false) => {
                leaked += 1;
                if leaked <= LISTED_BLOCKS {
                    r.problems.push(format!(
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
            r.problems.push(format!(
                "... {} more blocks {what} (not listed), {n} in all",
                n - LISTED_BLOCKS
            ));
        }
    }

    // Directories: entries, link counts, parents, reachability.
    let mut refs: HashMap<u64, u32> = HashMap::new();
    let mut children: HashMap<u64, Vec<u64>> = HashMap::new();
    for &ino in &inos {
        let inode = &inodes[&ino];
        if inode.kind != Kind::Directory {
            r.files += 1;
            continue;
        }
        r.directories += 1;
        let Some(map) = maps.get(&ino) else { continue };
        let mut names = HashSet::new();
        for e in map.extents().to_vec() {
            for k in 0..u64::from(e.length) {
                let n = e.physical + k;
                let entries = match dir::decode_block(&rd.read(n)?, n) {
                    Ok(v) => v,
                    Err(err) => {
                        r.problems.push(format!("directory inode {ino}: {err}"));
                        continue;
                    }
                };
                for entry in entries {
                    let shown = String::from_utf8_lossy(&entry.name).into_owned();
                    if !names.insert(entry.name.clone()) {
                        r.problems
                            .push(format!("directory inode {ino} lists `{shown}` twice"));
                    }
                    match inodes.get(&entry.ino) {
                        None => r.problems.push(format!(
                            "directory inode {ino}: `{shown}` names inode {}, which is not in use",
                            entry.ino
                        )),
                        Some(target) if target.kind != entry.kind => r.problems.push(format!(
                            "directory inode {ino}: `{shown}` says {:?} but inode {} is a {:?}",
                            entry.kind, entry.ino, target.kind
                        )),
                        Some(target) => {
                            *refs.entry(entry.ino).or_default() += 1;
                            children.entry(ino).or_default().push(entry.ino);
                            if target.kind == Kind::Directory && target.parent != ino {
                                r.problems.push(format!("directory inode {} is listed in {ino} but names {} as its parent", entry.ino, target.parent));
                            }
                        }
                    }
                }
            }
        }
    }
    for &ino in &inos {
        if ino == ROOT_INODE {
            if refs.contains_key(&ino) {
                r.problems
                    .push("the root directory is listed inside a directory".into());
            }
            continue;
        }
        let have = refs.get(&ino).copied().unwrap_or(0);
        if have != inodes[&ino].links {
            r.problems.push(format!(
                "inode {ino} has link count {} but {have} directory entries",
                inodes[&ino].links
            ));
        }
    }
    let mut seen = HashSet::from([ROOT_INODE]);
    let mut queue = VecDeque::from([ROOT_INODE]);
    while let Some(d) = queue.pop_front() {
        for &c in children.get(&d).map(Vec::as_slice).unwrap_or(&[]) {
            if seen.insert(c) {
                queue.push_back(c);
            }
        }
    }
    for &ino in &inos {
        if !seen.contains(&ino) {
            r.problems.push(format!(
                "inode {ino} is in use but not reachable from the root (orphan)"
            ));
        }
    }
    r.used_blocks = claimed.count_ones();
    Ok(r)
}

fn read_bitmap(
    rd: &mut Reader,
    r: &mut FsckReport,
    start: u64,
    len: u64,
    bits: u64,
    kind: BlockKind,
) -> Result<Bitmap, FsError> {
    let mut map = Bitmap::new(bits);
    for i in 0..len {
        let n = start + i;
        let b = rd.read(n)?;
        if let Err(e) = map.decode_block(i, &b, kind, n) {
            r.problems.push(format!("{}: {e}", kind.name()));
        }
    }
    Ok(map)
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
