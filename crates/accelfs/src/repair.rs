//! `fsck --repair` (format §10): brings an AccelFS that fsck finds damaged back to a state fsck
//! accepts, changing as little as it can and saying what it changed.
//!
//! This module owns the offline repair pass. It works on the state the next mount would see: a
//! primary superblock that cannot be used is restored from the backup (and a bad backup from the
//! primary), and committed journal transactions are replayed first. Then, like fsck, it reads
//! every inode and directory: inodes whose own checksum fails are cleared, damaged block maps are
//! cut down to their valid prefix, directory records naming free or mismatched inodes (or a name
//! already listed, or a second link to a directory) are dropped, parent fields and link counts
//! are corrected, inodes that no directory reaches are reattached under `/lost+found` as
//! `#<inode>`, and both bitmaps are rebuilt from what is in use. A block claimed by two owners
//! stays with both and is reported as unrepairable.
//!
//! Repair writes home blocks directly, not through the journal, and flushes once at the end: an
//! interrupted repair may leave the image inconsistent, and running it again finishes the job.
//! Only blocks whose contents change are written, so repairing a clean file system writes nothing.

use crate::bitmap::Bitmap;
use crate::dir::{self, DirEntry};
use crate::error::{FormatError, FsError};
use crate::extent::{Extent, ExtentError, ExtentMap};
use crate::fsck::load_superblock;
use crate::fsdevice::FsDevice;
use crate::header::{seal, verify, BlockKind, HEADER_LEN};
use crate::inode::{Inode, Kind, INLINE_EXTENTS, INODE_SIZE};
use crate::journal::{self, JournalArea, JournalSuper};
use crate::layout::{Layout, Superblock, ROOT_INODE};
use crate::mkfs::now_ns;
use crate::wal::{self, Journal};
use kura_engine::BlockDevice;
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet, VecDeque};

/// The directory orphans are reattached under, in the root.
const LOST_AND_FOUND: &[u8] = b"lost+found";
/// Block or inode numbers listed in one message before it says "…".
const EXAMPLES: usize = 8;
/// Owners of doubly claimed blocks looked up by name (each lookup scans every block map).
const OWNER_LOOKUPS: usize = 64;

/// What `repair` did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RepairReport {
    /// Every change made, each naming the blocks and inodes it touched.
    pub fixed: Vec<String>,
    /// Problems left in place, each naming its blocks or inodes.
    pub unrepairable: Vec<String>,
}

impl RepairReport {
    /// Nothing needed changing and nothing was left broken.
    pub fn is_clean(&self) -> bool {
        self.fixed.is_empty() && self.unrepairable.is_empty()
    }
}

/// Repairs the AccelFS on `dev` in place (the file system must not be mounted). `Err` when the
/// device cannot be read as AccelFS at all or fails; otherwise the report says what changed and
/// what could not be fixed.
pub fn repair(dev: Box<dyn BlockDevice>) -> Result<RepairReport, FsError> {
    repair_with(dev, RepairOptions::default())
}

/// What [`repair_with`] may change beyond what is damaged.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RepairOptions {
    /// Set the `posix` feature flag (format §4) on an image made before it, so that symbolic
    /// links, special files, hard links and extended attributes can be created there.
    pub enable_posix: bool,
}

/// [`repair`], and what `opts` asks for.
pub fn repair_with(
    dev: Box<dyn BlockDevice>,
    opts: RepairOptions,
) -> Result<RepairReport, FsError> {
    let (sb, io, note) = load_superblock(dev)?;
    let mut r = Repairer::new(sb.layout, io);
    r.superblocks(&sb, note)?;
    r.journal()?;
    r.read_inodes()?;
    r.claim_blocks()?;
    r.posix_flag(&sb, opts.enable_posix);
    r.ensure_root();
    r.read_directories()?;
    r.one_entry_per_directory();
    r.reattach_orphans();
    r.fix_link_counts();
    r.write_back()?;
    Ok(r.report)
}

/// One directory block as repair will leave it.
struct DirBlock {
    number: u64,
    entries: Vec<DirEntry>,
    dirty: bool,
}

/// An inode's block map as read: the valid prefix of its extents, its extent-block chain, and
/// what is wrong with it, if anything.
struct LoadedMap {
    extents: Vec<Extent>,
    chain: Vec<u64>,
    problem: Option<String>,
}

/// The repair pass: everything read, and every block it will write.
struct Repairer {
    io: FsDevice,
    l: Layout,
    bs: usize,
    report: RepairReport,
    /// New contents of blocks, written at the end when they differ from the device.
    writes: BTreeMap<u64, Vec<u8>>,
    /// Inodes in use, as they will be written.
    inodes: BTreeMap<u64, Inode>,
    /// Inode slots to rewrite (from `inodes`, or as free when absent there).
    dirty: BTreeSet<u64>,
    /// Inode-table blocks (by index in the table) whose header must be resealed.
    reseal: BTreeSet<u64>,
    maps: HashMap<u64, Vec<Extent>>,
    chains: HashMap<u64, Vec<u64>>,
    /// Extended-attribute blocks claimed, by inode.
    xattr_blocks: HashMap<u64, u64>,
    /// Blocks of an inode that an earlier owner claimed first.
    shared: HashMap<u64, SharedBlocks>,
    /// Blocks in use: metadata regions, the backup superblock, and every inode's blocks.
    claimed: Bitmap,
    dirs: BTreeMap<u64, Vec<DirBlock>>,
    /// `/lost+found` once looked up or created; `Some(None)` when that failed.
    lost_found: Option<Option<u64>>,
    owner_lookups: usize,
    now: u64,
}

/// Blocks an inode shares with an earlier owner, as runs: a crafted image can point many
/// inodes at the whole device, and a set of single blocks would then outgrow memory.
#[derive(Debug, Default)]
struct SharedBlocks {
    /// Start → end of each run.
    runs: BTreeMap<u64, u64>,
}

impl SharedBlocks {
    fn add(&mut self, start: u64, end: u64) {
        match self.runs.range_mut(..=start).next_back() {
            Some((_, e)) if *e == start => *e = end,
            _ => {
                self.runs.insert(start, end);
            }
        }
    }

    fn contains(&self, block: &u64) -> bool {
        self.runs
            .range(..=*block)
            .next_back()
            .is_some_and(|(_, &end)| end > *block)
    }

    fn is_empty(&self) -> bool {
        self.runs.is_empty()
    }

    /// The parts of `start..end` outside every run.
    fn outside(&self, start: u64, end: u64) -> Vec<(u64, u64)> {
        let mut out = Vec::new();
        let mut at = start;
        if let Some((_, &e)) = self.runs.range(..=start).next_back() {
            at = at.max(e);
        }
        for (&s, &e) in self.runs.range(start..end) {
            if s > at {
                out.push((at, s));
            }
            at = at.max(e);
        }
        if at < end {
            out.push((at, end));
        }
        out
    }
}

fn kind_name(kind: Kind) -> &'static str {
    match kind {
        Kind::Free => "free inode",
        Kind::File => "file",
        Kind::Directory => "directory",
        Kind::Symlink => "symbolic link",
        Kind::Fifo => "FIFO",
        Kind::Socket => "socket",
        Kind::CharDevice => "character device",
        Kind::BlockDevice => "block device",
    }
}

/// `numbers` as a short list: the first few, then how many more.
fn examples(numbers: &[u64]) -> String {
    let mut s: Vec<String> = numbers.iter().take(EXAMPLES).map(u64::to_string).collect();
    if numbers.len() > EXAMPLES {
        s.push(format!("and {} more", numbers.len() - EXAMPLES));
    }
    s.join(", ")
}

/// Extent blocks needed to hold `extents` extents beyond those inline.
fn chain_blocks(extents: usize, block_size: usize) -> usize {
    extents
        .saturating_sub(INLINE_EXTENTS)
        .div_ceil(ExtentMap::per_block(block_size))
}

fn mapped_blocks(extents: &[Extent]) -> u64 {
    extents.iter().map(|e| u64::from(e.length)).sum()
}

fn covers(e: &Extent, block: u64) -> bool {
    block >= e.physical && block - e.physical < u64::from(e.length)
}

/// Breadth-first from `start` over `children`, marking what it reaches.
fn reach(children: &HashMap<u64, Vec<u64>>, reached: &mut HashSet<u64>, start: u64) {
    if !reached.insert(start) {
        return;
    }
    let mut queue = VecDeque::from([start]);
    while let Some(d) = queue.pop_front() {
        for &c in children.get(&d).map(Vec::as_slice).unwrap_or(&[]) {
            if reached.insert(c) {
                queue.push_back(c);
            }
        }
    }
}

impl Repairer {
    fn new(l: Layout, io: FsDevice) -> Self {
        let mut claimed = Bitmap::new(l.total_blocks);
        claimed.set_range(0, l.data_start, true);
        claimed.set(l.backup_superblock(), true);
        Repairer {
            io,
            l,
            bs: l.block_size as usize,
            report: RepairReport::default(),
            writes: BTreeMap::new(),
            inodes: BTreeMap::new(),
            dirty: BTreeSet::new(),
            reseal: BTreeSet::new(),
            maps: HashMap::new(),
            chains: HashMap::new(),
            xattr_blocks: HashMap::new(),
            shared: HashMap::new(),
            claimed,
            dirs: BTreeMap::new(),
            lost_found: None,
            owner_lookups: 0,
            now: now_ns(),
        }
    }

    fn fixed(&mut self, what: String) {
        self.report.fixed.push(what);
    }

    fn unrepairable(&mut self, what: String) {
        self.report.unrepairable.push(what);
    }

    /// A block as repair will leave it so far.
    fn read(&mut self, block: u64) -> Result<Vec<u8>, FsError> {
        match self.writes.get(&block) {
            Some(b) => Ok(b.clone()),
            None => self.io.read(block),
        }
    }

    /// The primary superblock from the backup, or the backup from the primary.
    fn superblocks(&mut self, sb: &Superblock, note: Option<String>) -> Result<(), FsError> {
        let backup = self.l.backup_superblock();
        if let Some(why) = note {
            self.writes.insert(0, sb.encode(0));
            self.fixed(format!(
                "block 0: {why}; rewrote the primary superblock from the backup in block {backup}"
            ));
            return Ok(());
        }
        let found = self.io.read(backup)?;
        let why = match Superblock::decode(&found, backup) {
            Ok(b) if b == *sb => return Ok(()),
            Ok(_) => "differed from the primary".to_string(),
            Err(e) => format!("was unusable ({e})"),
        };
        self.writes.insert(backup, sb.encode(backup));
        self.fixed(format!(
            "the backup superblock (block {backup}) {why}; rewrote it from the primary"
        ));
        Ok(())
    }

    /// An image without the `posix` flag whose inodes use it (symbolic links, special files,
    /// hard links, attribute blocks) gets the flag in both superblocks: the least destructive
    /// way to a state fsck accepts, and only a kura that knows the feature writes such inodes.
    fn posix_flag(&mut self, sb: &Superblock, asked: bool) {
        use crate::layout::FEATURE_POSIX;
        if sb.features & FEATURE_POSIX != 0 {
            return;
        }
        let users: Vec<u64> = self
            .inodes
            .iter()
            .filter(|(_, i)| {
                i.kind.needs_posix()
                    || i.xattr_block != 0
                    || (i.kind != Kind::Directory && i.links > 1)
            })
            .map(|(&ino, _)| ino)
            .collect();
        if users.is_empty() && !asked {
            return;
        }
        let upgraded = Superblock {
            features: sb.features | FEATURE_POSIX,
            ..*sb
        };
        let backup = self.l.backup_superblock();
        self.writes.insert(0, upgraded.encode(0));
        self.writes.insert(backup, upgraded.encode(backup));
        self.fixed(if users.is_empty() {
            "enabled the posix feature (symbolic links, special files, hard links, extended attributes) in both superblocks, as asked".to_string()
        } else {
            format!(
                "inodes {} use the posix feature, which the superblock did not list; set its flag in both superblocks",
                examples(&users)
            )
        });
    }

    /// Replay the journal as mount would, so repair sees the state mount will see.
    fn journal(&mut self) -> Result<(), FsError> {
        let area = JournalArea {
            start: self.l.journal_start,
            len: self.l.journal_len,
        };
        match Journal::recover(&mut self.io, area) {
            Ok((_, rec)) => {
                if rec.replayed > 0 {
                    self.fixed(format!(
                        "replayed {} committed journal transaction(s) into {} home block(s)",
                        rec.replayed, rec.blocks_written
                    ));
                }
            }
            Err(FsError::Device(e)) => return Err(FsError::Device(e)),
            Err(e) => self.salvage_journal(area, &e)?,
        }
        // One unreadable journal-superblock copy (a crash during a checkpoint): rewrite it from
        // the other, one generation newer, describing the same log start.
        let first = self.io.read(area.start)?;
        let second = self.io.read(area.start + 1)?;
        let copies = [
            JournalSuper::decode(&first, area.start),
            JournalSuper::decode(&second, area.start + 1),
        ];
        for (bad, good) in [(0usize, 1usize), (1, 0)] {
            let (Err(e), Ok(js)) = (&copies[bad], &copies[good]) else {
                continue;
            };
            let n = area.start + bad as u64;
            let generation = js.generation.checked_add(1).and_then(|g| {
                if area.super_block(g) == n {
                    Some(g)
                } else {
                    g.checked_add(1)
                }
            });
            let Some(generation) = generation else {
                self.unrepairable(format!(
                    "journal superblock copy in block {n} is unreadable ({e}) and the other copy's generation cannot advance"
                ));
                continue;
            };
            let fresh = JournalSuper { generation, ..*js };
            self.io.write(n, &fresh.encode(self.bs, n))?;
            self.io.flush()?;
            self.fixed(format!(
                "journal superblock copy in block {n} was unreadable ({e}); rewrote it from the copy in block {}",
                area.start + good as u64
            ));
        }
        Ok(())
    }

    /// The journal cannot be recovered as it stands: replay what can be replayed, then reset it.
    fn salvage_journal(&mut self, area: JournalArea, why: &FsError) -> Result<(), FsError> {
        let first = self.io.read(area.start)?;
        let second = self.io.read(area.start + 1)?;
        match JournalSuper::newest(area, &first, &second) {
            Ok(js) => {
                let io = &mut self.io;
                let (txns, _) = journal::scan(js, area, self.bs, |n| io.read(n))?;
                let mut dropped = Vec::new();
                let mut written = 0usize;
                for t in &txns {
                    for (target, image) in &t.images {
                        if *target < area.start + area.len
                            || *target >= self.l.total_blocks
                            || image.len() != self.bs
                        {
                            dropped.push(format!(
                                "journal transaction {}: dropped its image for block {target}, which it may not write",
                                t.seq
                            ));
                        } else {
                            self.io.write(*target, image)?;
                            written += 1;
                        }
                    }
                }
                self.io.flush()?;
                self.fixed(format!(
                    "the journal could not be recovered as it stood ({why}); replayed its {} committed transaction(s) into {written} home block(s), without the images listed next, and reset it",
                    txns.len()
                ));
                self.report.fixed.extend(dropped);
            }
            Err(e) => self.fixed(format!(
                "both journal superblocks (blocks {} and {}) were unusable ({e}); reset the journal, losing whatever was committed in it but not yet written home",
                area.start,
                area.start + 1
            )),
        }
        self.io.zero(area.start, area.len)?;
        wal::write_empty_supers(&mut self.io, area, self.bs)?;
        self.io.flush()?;
        Ok(())
    }

    /// Every inode; those that do not decode are cleared.
    fn read_inodes(&mut self) -> Result<(), FsError> {
        let per = Layout::inodes_per_block(self.l.block_size);
        for i in 0..self.l.inode_table_len {
            let n = self.l.inode_table_start + i;
            let b = self.read(n)?;
            let header = verify(&b, BlockKind::InodeTable, n);
            let misdirected = matches!(header, Err(FormatError::Misdirected { .. }));
            if let Err(e) = header {
                self.reseal.insert(i);
                let first = i * per;
                let last = (first + per).min(self.l.inode_count).saturating_sub(1);
                self.fixed(if misdirected {
                    format!("inode table: {e}; resealed it with inodes {first}..={last} cleared, since they are not this block's")
                } else {
                    format!("inode table: {e}; resealed it, keeping each of inodes {first}..={last} whose own checksum holds")
                });
            }
            for slot in 0..per {
                let ino = i * per + slot;
                if ino >= self.l.inode_count {
                    break;
                }
                let at = HEADER_LEN + slot as usize * INODE_SIZE;
                match Inode::decode(ino, &b[at..at + INODE_SIZE]) {
                    _ if misdirected => {
                        self.dirty.insert(ino);
                    }
                    Ok(inode) if inode.kind == Kind::Free => {}
                    Ok(_) if ino == 0 => {
                        self.dirty.insert(0);
                        self.fixed("inode 0 is reserved but was in use; cleared it".into());
                    }
                    Ok(inode) => {
                        self.inodes.insert(ino, inode);
                    }
                    Err(e) => {
                        self.dirty.insert(ino);
                        self.fixed(format!("{e}; cleared it"));
                    }
                }
            }
        }
        Ok(())
    }

    /// An inode's extents (the valid prefix of them), its extent-block chain as read, and what
    /// is wrong with its block map, if anything.
    fn load_map(&mut self, inode: &Inode) -> Result<LoadedMap, FsError> {
        let count = inode.extent_count as usize;
        let mut extents: Vec<Extent> = inode.inline[..count.min(INLINE_EXTENTS)].to_vec();
        let mut chain = Vec::new();
        let mut seen = HashSet::new();
        let mut problem = None;
        let mut next = inode.extent_block;
        while extents.len() < count {
            if next < self.l.data_start || next >= self.l.backup_superblock() || !seen.insert(next)
            {
                problem = Some(format!(
                    "its extent chain points at block {next}, outside the data region or in a loop"
                ));
                break;
            }
            let block = self.read(next)?;
            match ExtentMap::decode_block(&block, next) {
                Ok((more, after)) => {
                    chain.push(next);
                    if more.is_empty() {
                        break;
                    }
                    extents.extend(more);
                    next = after;
                }
                Err(e) => {
                    problem = Some(format!("its extent chain is broken: {e}"));
                    break;
                }
            }
        }
        if problem.is_none() && extents.len() != count {
            problem = Some(format!(
                "it says it has {count} extents but {} were found",
                extents.len()
            ));
        }
        extents.truncate(count);
        let map = ExtentMap::from_extents(extents);
        let bad = map.validate(self.l.data_start, self.l.backup_superblock());
        let mut extents = map.extents().to_vec();
        if let Err(e) = bad {
            let at = match e {
                ExtentError::Empty(i) | ExtentError::Order(i) => i,
                ExtentError::OutOfBounds { index, .. }
                | ExtentError::PhysicalOverlap { index, .. } => index,
            };
            extents.truncate(at);
            problem.get_or_insert(e.to_string());
        }
        Ok(LoadedMap {
            extents,
            chain,
            problem,
        })
    }

    /// Every used inode's block map, checked (cut to its valid prefix when damaged), and
    /// its blocks claimed; a block claimed twice stays with its first owner.
    fn claim_blocks(&mut self) -> Result<(), FsError> {
        let per = ExtentMap::per_block(self.bs);
        let inos: Vec<u64> = self.inodes.keys().copied().collect();
        for ino in inos {
            let Some(inode) = self.inodes.get(&ino).cloned() else {
                continue;
            };
            let LoadedMap {
                mut extents,
                mut chain,
                problem,
            } = self.load_map(&inode)?;
            if let Some(why) = problem {
                // Reuse only chain blocks nobody has claimed and that are not its own data.
                let usable = chain
                    .iter()
                    .take_while(|&&b| !self.claimed.get(b) && !extents.iter().any(|e| covers(e, b)))
                    .count();
                extents.truncate(INLINE_EXTENTS + usable * per);
                chain.truncate(chain_blocks(extents.len(), self.bs));
                let kept = extents.len();
                let blocks = mapped_blocks(&extents);
                self.maps.insert(ino, extents);
                self.chains.insert(ino, chain);
                if let Err(e) = self.write_map(ino) {
                    self.unrepairable(format!("inode {ino}: {e}"));
                }
                self.fixed(format!(
                    "inode {ino}: {why}; kept its first {kept} extent(s) ({blocks} block(s))"
                ));
            } else {
                let counted = mapped_blocks(&extents) + chain.len() as u64;
                self.maps.insert(ino, extents);
                self.chains.insert(ino, chain);
                if inode.blocks != counted {
                    if let Some(i) = self.inodes.get_mut(&ino) {
                        i.blocks = counted;
                    }
                    self.dirty.insert(ino);
                    self.fixed(format!(
                        "inode {ino} said it holds {} blocks but maps {counted}; corrected",
                        inode.blocks
                    ));
                }
            }
            let chain = self.chains.get(&ino).cloned().unwrap_or_default();
            let extents = self.maps.get(&ino).cloned().unwrap_or_default();
            // Whole extents are claimed a word at a time, and blocks claimed before are found
            // as runs: the cost stays linear in the device (not in blocks times inodes) even
            // when a crafted image points every inode at the same blocks.
            let mut twice = Vec::new();
            let mut count = 0u64;
            let mut shared = SharedBlocks::default();
            for b in chain {
                if self.claimed.set(b, true) {
                    count += 1;
                    twice.push(b);
                    shared.add(b, b + 1);
                }
            }
            for e in &extents {
                let (start, end) = (e.physical, e.physical + u64::from(e.length));
                let mut at = start;
                while let Some(first) = self.claimed.first_in(at, end, true) {
                    let after = self.claimed.first_in(first, end, false).unwrap_or(end);
                    count += after - first;
                    twice.extend((first..after).take((EXAMPLES + 1).saturating_sub(twice.len())));
                    shared.add(first, after);
                    at = after;
                }
                self.claimed.set_range(start, end - start, true);
            }
            if count > 0 {
                let owner = self.owner_of(twice[0], ino);
                let mut listed = examples(&twice[..twice.len().min(EXAMPLES)]);
                if count > EXAMPLES as u64 {
                    listed = format!("{listed}, and {} more", count - EXAMPLES as u64);
                }
                self.unrepairable(format!(
                    "inode {ino} uses {count} block(s) claimed before it ({listed}; block {} is also claimed by {owner}); left with both owners",
                    twice[0]
                ));
                self.shared.insert(ino, shared);
            }
            self.fix_impossible_size(ino);
            self.claim_xattrs(ino)?;
            self.check_symlink_target(ino);
        }
        Ok(())
    }

    /// An inode's extended-attribute block is claimed when it lies in the data region, nobody
    /// claimed it before and it decodes; otherwise the inode loses its attributes.
    fn claim_xattrs(&mut self, ino: u64) -> Result<(), FsError> {
        let Some(b) = self
            .inodes
            .get(&ino)
            .map(|i| i.xattr_block)
            .filter(|&b| b != 0)
        else {
            return Ok(());
        };
        let why = if b < self.l.data_start || b >= self.l.backup_superblock() {
            Some("lies outside the data region".to_string())
        } else if self.claimed.get(b) {
            Some("is also claimed by another owner".to_string())
        } else {
            crate::xattr::decode_block(&self.read(b)?, b)
                .err()
                .map(|e| e.to_string())
        };
        match why {
            None => {
                self.claimed.set(b, true);
                self.xattr_blocks.insert(ino, b);
            }
            Some(why) => {
                if let Some(i) = self.inodes.get_mut(&ino) {
                    i.xattr_block = 0;
                }
                self.dirty.insert(ino);
                self.fixed(format!(
                    "inode {ino}: its extended-attribute block {b} {why}; dropped its attributes"
                ));
            }
        }
        Ok(())
    }

    /// A symbolic link whose target block was lost (its block map was cut) is removed: its
    /// directory entries then name a free inode and are dropped.
    fn check_symlink_target(&mut self, ino: u64) {
        let Some(inode) = self.inodes.get(&ino) else {
            return;
        };
        if inode.kind != Kind::Symlink || inode.is_fast_symlink() {
            return;
        }
        let has_target = self
            .maps
            .get(&ino)
            .is_some_and(|m| m.first().is_some_and(|e| e.logical == 0) && m.len() == 1);
        if !has_target {
            self.forget_inode(ino);
            self.fixed(format!(
                "inode {ino}: symbolic link whose target block is lost; removed it"
            ));
        }
    }

    /// A size no file or directory of this layout can have (mount refuses the inode, see
    /// `Layout::inode_problem`) becomes the end of the inode's data.
    fn fix_impossible_size(&mut self, ino: u64) {
        let bs = self.bs as u64;
        let end = self
            .maps
            .get(&ino)
            .and_then(|m| m.last())
            .map_or(0, |e| e.end() * bs);
        let (l, Some(inode)) = (self.l, self.inodes.get_mut(&ino)) else {
            return;
        };
        let impossible = match inode.kind {
            Kind::File => inode.size > l.max_file_bytes(),
            Kind::Directory => {
                !inode.size.is_multiple_of(bs) || inode.size / bs > l.max_dir_blocks()
            }
            Kind::Free
            | Kind::Symlink
            | Kind::Fifo
            | Kind::Socket
            | Kind::CharDevice
            | Kind::BlockDevice => false,
        };
        if impossible {
            let old = inode.size;
            inode.size = end;
            self.dirty.insert(ino);
            self.fixed(format!(
                "inode {ino}: its size {old} was impossible for this file system; set it to {end}, the end of its data"
            ));
        }
    }

    /// Who else claims `block` (for messages).
    fn owner_of(&mut self, block: u64, except: u64) -> String {
        if block < self.l.data_start || block == self.l.backup_superblock() {
            return "metadata".into();
        }
        if self.owner_lookups >= OWNER_LOOKUPS {
            return "another owner".into();
        }
        self.owner_lookups += 1;
        let mut inos: Vec<u64> = self.maps.keys().copied().collect();
        inos.sort_unstable();
        inos.into_iter()
            .filter(|&i| i != except)
            .chain([except])
            .find(|i| {
                self.chains.get(i).is_some_and(|c| c.contains(&block))
                    || self
                        .maps
                        .get(i)
                        .is_some_and(|m| m.iter().any(|e| covers(e, block)))
            })
            .map_or("another owner".into(), |i| {
                if i == except {
                    format!("inode {i} itself")
                } else {
                    format!("inode {i}")
                }
            })
    }

    /// A free data block, now claimed.
    fn alloc_block(&mut self) -> Option<u64> {
        let b = self.claimed.find_clear(self.l.data_start)?;
        if b < self.l.data_start || b >= self.l.backup_superblock() {
            return None;
        }
        self.claimed.set(b, true);
        Some(b)
    }

    /// A free inode number (not 0, not the root).
    fn alloc_inode(&self) -> Option<u64> {
        (ROOT_INODE + 1..self.l.inode_count).find(|i| !self.inodes.contains_key(i))
    }

    /// Writes `maps[ino]` into the inode and its extent-block chain (allocating chain blocks
    /// when it needs more than it has), and the `blocks` field to match.
    fn write_map(&mut self, ino: u64) -> Result<(), String> {
        let per = ExtentMap::per_block(self.bs);
        let extents = self.maps.get(&ino).cloned().unwrap_or_default();
        let count = u32::try_from(extents.len())
            .map_err(|_| format!("{} extents do not fit an inode", extents.len()))?;
        let need = chain_blocks(extents.len(), self.bs);
        let mut chain = self.chains.remove(&ino).unwrap_or_default();
        let mut fresh = Vec::new();
        while chain.len() < need {
            match self.alloc_block() {
                Some(b) => {
                    chain.push(b);
                    fresh.push(b);
                }
                None => {
                    for b in fresh {
                        chain.pop();
                        self.claimed.set(b, false);
                    }
                    self.chains.insert(ino, chain);
                    return Err("no free block for an extent block".into());
                }
            }
        }
        let shared = self.shared.get(&ino);
        for b in chain.drain(need..) {
            if !shared.is_some_and(|s| s.contains(&b)) {
                self.claimed.set(b, false);
            }
        }
        for k in 0..need {
            let lo = INLINE_EXTENTS + k * per;
            let hi = (lo + per).min(extents.len());
            let next = chain.get(k + 1).copied().unwrap_or(0);
            self.writes.insert(
                chain[k],
                ExtentMap::encode_block(&extents[lo..hi], next, self.bs, chain[k]),
            );
        }
        let first = chain.first().copied().unwrap_or(0);
        self.chains.insert(ino, chain);
        let inode = self
            .inodes
            .get_mut(&ino)
            .ok_or_else(|| format!("inode {ino} is not in use"))?;
        inode.inline = [Extent::EMPTY; INLINE_EXTENTS];
        for (slot, e) in inode.inline.iter_mut().zip(&extents) {
            *slot = *e;
        }
        inode.extent_count = count;
        inode.extent_block = first;
        inode.blocks = mapped_blocks(&extents) + need as u64;
        self.dirty.insert(ino);
        Ok(())
    }

    /// Unclaims the blocks `ino` alone owns and clears it.
    fn forget_inode(&mut self, ino: u64) {
        let shared = self.shared.remove(&ino).unwrap_or_default();
        let chain = self.chains.remove(&ino).unwrap_or_default();
        let extents = self.maps.remove(&ino).unwrap_or_default();
        if let Some(b) = self.xattr_blocks.remove(&ino) {
            self.claimed.set(b, false);
        }
        for b in chain {
            if !shared.contains(&b) {
                self.claimed.set(b, false);
            }
        }
        for e in extents {
            for (start, end) in shared.outside(e.physical, e.physical + u64::from(e.length)) {
                self.claimed.set_range(start, end - start, false);
            }
        }
        self.inodes.remove(&ino);
        self.dirty.insert(ino);
    }

    /// A new directory inode `ino` with one empty block; `None` when no block is free.
    fn new_directory(&mut self, ino: u64, mode: u16, parent: u64) -> Option<u64> {
        let block = self.alloc_block()?;
        let Some(empty) = dir::encode_block(&[], self.bs, block) else {
            self.claimed.set(block, false);
            return None;
        };
        let mut inode = Inode::new(Kind::Directory, mode, parent, self.now);
        inode.size = self.bs as u64;
        inode.blocks = 1;
        inode.extent_count = 1;
        inode.inline[0] = Extent {
            logical: 0,
            length: 1,
            physical: block,
        };
        self.maps.insert(ino, vec![inode.inline[0]]);
        self.chains.insert(ino, Vec::new());
        self.inodes.insert(ino, inode);
        self.dirty.insert(ino);
        self.writes.insert(block, empty);
        Some(block)
    }

    /// The root must be a directory; recreate it empty when it is not (what it held
    /// becomes orphaned and goes to `/lost+found`).
    fn ensure_root(&mut self) {
        let kind = self.inodes.get(&ROOT_INODE).map(|i| i.kind);
        if kind == Some(Kind::Directory) {
            return;
        }
        if kind.is_some() {
            match self.alloc_inode() {
                Some(to) => {
                    if let Some(file) = self.inodes.remove(&ROOT_INODE) {
                        self.inodes.insert(to, file);
                    }
                    if let Some(v) = self.maps.remove(&ROOT_INODE) {
                        self.maps.insert(to, v);
                    }
                    if let Some(v) = self.chains.remove(&ROOT_INODE) {
                        self.chains.insert(to, v);
                    }
                    if let Some(s) = self.shared.remove(&ROOT_INODE) {
                        self.shared.insert(to, s);
                    }
                    self.dirty.insert(to);
                    self.dirty.insert(ROOT_INODE);
                    self.fixed(format!(
                        "the root inode {ROOT_INODE} was a regular file; moved it to inode {to}"
                    ));
                }
                None => {
                    self.forget_inode(ROOT_INODE);
                    self.unrepairable(format!(
                        "the root inode {ROOT_INODE} was a regular file and no inode is free to move it to; cleared it, losing its contents"
                    ));
                }
            }
        }
        match self.new_directory(ROOT_INODE, 0o755, ROOT_INODE) {
            Some(block) => self.fixed(format!(
                "the root directory (inode {ROOT_INODE}) was missing; recreated it empty in block {block}"
            )),
            None => self.unrepairable(format!(
                "the root directory (inode {ROOT_INODE}) is missing and no block is free to recreate it"
            )),
        }
    }

    /// Every directory's records; those naming free, mismatched or impossible inodes,
    /// and names listed twice, are dropped. A block that is not a directory block is emptied.
    fn read_directories(&mut self) -> Result<(), FsError> {
        let dir_inos: Vec<u64> = self
            .inodes
            .iter()
            .filter(|(_, i)| i.kind == Kind::Directory)
            .map(|(&n, _)| n)
            .collect();
        for d in dir_inos {
            let extents = self.maps.get(&d).cloned().unwrap_or_default();
            let mut blocks = Vec::new();
            let mut names = HashSet::new();
            for e in extents {
                for n in e.physical..e.physical + u64::from(e.length) {
                    if self.shared.get(&d).is_some_and(|s| s.contains(&n)) {
                        continue;
                    }
                    let raw = self.read(n)?;
                    let (found, damaged) = match dir::decode_block(&raw, n) {
                        Ok(entries) => (entries, false),
                        Err(err @ FormatError::BadChecksum { .. }) => {
                            // Damaged somewhere: keep the records if they still tile the block
                            // and every one is well formed; each is checked like any other.
                            let mut copy = raw.clone();
                            seal(&mut copy, BlockKind::Directory, n);
                            let salvaged = dir::decode_block(&copy, n).unwrap_or_default();
                            self.fixed(format!(
                                "directory inode {d}: block {n} was damaged ({err}); kept the {} record(s) that still decode and resealed it (anything else it named is reattached under /lost+found)",
                                salvaged.len()
                            ));
                            (salvaged, true)
                        }
                        Err(err) => {
                            self.fixed(format!(
                                "directory inode {d}: block {n} was unreadable ({err}); made it an empty directory block (what it named is reattached under /lost+found)"
                            ));
                            blocks.push(DirBlock {
                                number: n,
                                entries: Vec::new(),
                                dirty: true,
                            });
                            continue;
                        }
                    };
                    let listed = found.len();
                    let mut kept = Vec::with_capacity(listed);
                    for entry in found {
                        let why = match self.inodes.get(&entry.ino) {
                            _ if entry.ino == d => Some("names the directory itself".to_string()),
                            _ if entry.ino == ROOT_INODE => {
                                Some("names the root directory".to_string())
                            }
                            None => Some(format!("names inode {}, which is not in use", entry.ino)),
                            Some(t) if t.kind != entry.kind => Some(format!(
                                "says {} but inode {} is a {}",
                                kind_name(entry.kind),
                                entry.ino,
                                kind_name(t.kind)
                            )),
                            Some(_) if names.contains(&entry.name) => {
                                Some("repeats a name listed before".to_string())
                            }
                            Some(_) => None,
                        };
                        match why {
                            Some(why) => {
                                let shown = String::from_utf8_lossy(&entry.name).into_owned();
                                self.fixed(format!(
                                    "directory inode {d}, block {n}: removed `{shown}`, which {why}"
                                ));
                            }
                            None => {
                                names.insert(entry.name.clone());
                                kept.push(entry);
                            }
                        }
                    }
                    let dirty = damaged || kept.len() != listed;
                    blocks.push(DirBlock {
                        number: n,
                        entries: kept,
                        dirty,
                    });
                }
            }
            self.dirs.insert(d, blocks);
        }
        Ok(())
    }

    /// Each directory other than the root is listed exactly once, preferably by the
    /// directory its parent field names, and its parent field names the one that lists it.
    fn one_entry_per_directory(&mut self) {
        let mut incoming: BTreeMap<u64, Vec<(u64, usize, usize)>> = BTreeMap::new();
        for (&d, blocks) in &self.dirs {
            for (bi, b) in blocks.iter().enumerate() {
                for (ei, e) in b.entries.iter().enumerate() {
                    if e.kind == Kind::Directory {
                        incoming.entry(e.ino).or_default().push((d, bi, ei));
                    }
                }
            }
        }
        let mut drop: BTreeSet<(u64, usize, usize)> = BTreeSet::new();
        for (c, recs) in incoming {
            let Some(parent) = self.inodes.get(&c).map(|i| i.parent) else {
                continue;
            };
            let keep = recs.iter().position(|r| r.0 == parent).unwrap_or(0);
            let keep_dir = recs[keep].0;
            for (k, &r) in recs.iter().enumerate() {
                if k == keep {
                    continue;
                }
                drop.insert(r);
                let name = self
                    .dirs
                    .get(&r.0)
                    .and_then(|v| v.get(r.1))
                    .and_then(|b| b.entries.get(r.2))
                    .map(|e| String::from_utf8_lossy(&e.name).into_owned())
                    .unwrap_or_default();
                self.fixed(format!(
                    "directory inode {}: removed `{name}`, a second entry for directory inode {c} (the one in directory inode {keep_dir} stays)",
                    r.0
                ));
            }
            if parent != keep_dir {
                if let Some(i) = self.inodes.get_mut(&c) {
                    i.parent = keep_dir;
                }
                self.dirty.insert(c);
                self.fixed(format!(
                    "directory inode {c}: its parent field said {parent} but directory inode {keep_dir} lists it; corrected"
                ));
            }
        }
        for (d, bi, ei) in drop.into_iter().rev() {
            if let Some(b) = self.dirs.get_mut(&d).and_then(|v| v.get_mut(bi)) {
                if ei < b.entries.len() {
                    b.entries.remove(ei);
                    b.dirty = true;
                }
            }
        }
    }

    /// Inodes the root does not reach go under `/lost+found`: first those no directory
    /// lists, then one directory of each cycle of directories cut off from the root.
    fn reattach_orphans(&mut self) {
        let mut children: HashMap<u64, Vec<u64>> = HashMap::new();
        let mut refs: HashMap<u64, u32> = HashMap::new();
        let mut source: HashMap<u64, u64> = HashMap::new();
        for (&d, blocks) in &self.dirs {
            for e in blocks.iter().flat_map(|b| &b.entries) {
                children.entry(d).or_default().push(e.ino);
                *refs.entry(e.ino).or_default() += 1;
                if e.kind == Kind::Directory {
                    source.insert(e.ino, d);
                }
            }
        }
        let mut reached = HashSet::new();
        if self.dirs.contains_key(&ROOT_INODE) {
            reach(&children, &mut reached, ROOT_INODE);
        }
        let unlisted: Vec<u64> = self
            .inodes
            .keys()
            .copied()
            .filter(|i| *i != ROOT_INODE && !reached.contains(i) && !refs.contains_key(i))
            .collect();
        let mut ok = true;
        for x in unlisted {
            if !self.attach(x) {
                ok = false;
                break;
            }
            reached.extend(self.lost_found.flatten());
            reach(&children, &mut reached, x);
        }
        let cut_off: Vec<u64> = self
            .inodes
            .iter()
            .filter(|(i, n)| n.kind == Kind::Directory && !reached.contains(*i))
            .map(|(&i, _)| i)
            .collect();
        for x in cut_off {
            if !ok {
                break;
            }
            if reached.contains(&x) {
                continue;
            }
            // Climb the listing directories until one repeats: that one is on the cycle, and
            // once it is reattached the climb's whole path (x included) hangs below it.
            let mut y = x;
            let mut seen = HashSet::new();
            let mut on_cycle = false;
            loop {
                if !seen.insert(y) {
                    on_cycle = true;
                    break;
                }
                match source.get(&y) {
                    Some(&p) if !reached.contains(&p) => y = p,
                    _ => break,
                }
            }
            if on_cycle {
                if let Some(&src) = source.get(&y) {
                    self.remove_entries(src, y);
                }
            }
            ok = self.attach(y);
            if ok {
                reached.extend(self.lost_found.flatten());
                reach(&children, &mut reached, y);
            }
        }
        let left: Vec<u64> = self
            .inodes
            .keys()
            .copied()
            .filter(|i| *i != ROOT_INODE && !reached.contains(i))
            .collect();
        for i in left {
            self.unrepairable(format!(
                "inode {i} is in use but not reachable from the root (orphan); left as it is"
            ));
        }
    }

    /// Removes every record of directory `d` naming `target` (a cycle being cut).
    fn remove_entries(&mut self, d: u64, target: u64) {
        let mut removed = Vec::new();
        if let Some(blocks) = self.dirs.get_mut(&d) {
            for b in blocks.iter_mut() {
                let before = b.entries.len();
                b.entries.retain(|e| {
                    if e.ino == target {
                        removed.push((b.number, String::from_utf8_lossy(&e.name).into_owned()));
                        false
                    } else {
                        true
                    }
                });
                if b.entries.len() != before {
                    b.dirty = true;
                }
            }
        }
        for (n, name) in removed {
            self.fixed(format!(
                "directory inode {d}, block {n}: removed `{name}`, which closed a cycle of directories the root does not reach"
            ));
        }
    }

    /// `/lost+found`, created in the root when missing; `None` (reported once) when that fails.
    fn lost_and_found(&mut self) -> Option<u64> {
        if let Some(known) = self.lost_found {
            return known;
        }
        let found = self.find_or_make_lost_and_found();
        let known = match found {
            Ok(ino) => Some(ino),
            Err(why) => {
                self.unrepairable(format!("cannot reattach orphans: {why}"));
                None
            }
        };
        self.lost_found = Some(known);
        known
    }

    fn find_or_make_lost_and_found(&mut self) -> Result<u64, String> {
        let Some(root) = self.dirs.get(&ROOT_INODE) else {
            return Err("there is no root directory".into());
        };
        if let Some(e) = root
            .iter()
            .flat_map(|b| &b.entries)
            .find(|e| e.name == LOST_AND_FOUND)
        {
            return match e.kind {
                Kind::Directory => Ok(e.ino),
                _ => Err(format!("/lost+found is inode {}, not a directory", e.ino)),
            };
        }
        let ino = self
            .alloc_inode()
            .ok_or("no inode is free for /lost+found")?;
        let block = self
            .new_directory(ino, 0o700, ROOT_INODE)
            .ok_or("no block is free for /lost+found")?;
        let entry = DirEntry {
            ino,
            kind: Kind::Directory,
            name: LOST_AND_FOUND.to_vec(),
        };
        if let Err(why) = self.add_entry(ROOT_INODE, entry) {
            self.forget_inode(ino);
            self.writes.remove(&block);
            return Err(format!("cannot list /lost+found in the root: {why}"));
        }
        self.dirs.insert(
            ino,
            vec![DirBlock {
                number: block,
                entries: Vec::new(),
                dirty: true,
            }],
        );
        self.fixed(format!("created /lost+found (inode {ino}, block {block})"));
        Ok(ino)
    }

    /// Lists orphan `x` in `/lost+found` as `#x`; false (reported) when it cannot.
    fn attach(&mut self, x: u64) -> bool {
        let Some(lf) = self.lost_and_found() else {
            return false;
        };
        let Some(kind) = self.inodes.get(&x).map(|i| i.kind) else {
            return true;
        };
        let taken: HashSet<Vec<u8>> = self
            .dirs
            .get(&lf)
            .into_iter()
            .flatten()
            .flat_map(|b| &b.entries)
            .map(|e| e.name.clone())
            .collect();
        let name = (0u64..)
            .map(|k| {
                if k == 0 {
                    format!("#{x}")
                } else {
                    format!("#{x}.{k}")
                }
            })
            .find(|n| !taken.contains(n.as_bytes()))
            .unwrap_or_default();
        let entry = DirEntry {
            ino: x,
            kind,
            name: name.clone().into_bytes(),
        };
        if let Err(why) = self.add_entry(lf, entry) {
            self.unrepairable(format!(
                "inode {x} is reachable from no directory and cannot be listed in /lost+found: {why}"
            ));
            return false;
        }
        if kind == Kind::Directory {
            if let Some(i) = self.inodes.get_mut(&x) {
                i.parent = lf;
            }
            self.dirty.insert(x);
        }
        self.fixed(format!(
            "inode {x} ({}) was reachable from no directory; listed it as /lost+found/{name}",
            kind_name(kind)
        ));
        true
    }

    /// Adds `entry` to directory `d`, in a block with room or in a new block appended to it.
    fn add_entry(&mut self, d: u64, entry: DirEntry) -> Result<(), String> {
        let need = dir::record_len(entry.name.len());
        let cap = dir::capacity(self.bs);
        let blocks = self
            .dirs
            .get_mut(&d)
            .ok_or_else(|| format!("inode {d} is not a directory"))?;
        for b in blocks.iter_mut() {
            let used: usize = b
                .entries
                .iter()
                .map(|e| dir::record_len(e.name.len()))
                .sum();
            if used + need <= cap {
                b.entries.push(entry);
                b.dirty = true;
                return Ok(());
            }
        }
        if self.shared.get(&d).is_some_and(|s| !s.is_empty()) {
            return Err(format!(
                "directory inode {d} is full and shares blocks with another inode"
            ));
        }
        let old = self.maps.get(&d).cloned().unwrap_or_default();
        let logical = old.last().map_or(0, Extent::end);
        let logical = u32::try_from(logical)
            .ok()
            .filter(|&l| l < u32::MAX)
            .ok_or_else(|| format!("directory inode {d} is as large as a file can be"))?;
        let block = self
            .alloc_block()
            .ok_or_else(|| format!("directory inode {d} is full and no block is free"))?;
        let mut map = ExtentMap::from_extents(old.clone());
        map.insert(logical, 1, block);
        self.maps.insert(d, map.extents().to_vec());
        if let Err(why) = self.write_map(d) {
            self.maps.insert(d, old);
            self.claimed.set(block, false);
            return Err(why);
        }
        if let Some(i) = self.inodes.get_mut(&d) {
            i.size = i.size.max((u64::from(logical) + 1) * self.bs as u64);
        }
        if let Some(blocks) = self.dirs.get_mut(&d) {
            blocks.push(DirBlock {
                number: block,
                entries: vec![entry],
                dirty: true,
            });
        }
        self.fixed(format!(
            "directory inode {d}: added block {block} to hold more entries"
        ));
        Ok(())
    }

    /// Every inode's link count equals the records naming it (the root is not listed).
    fn fix_link_counts(&mut self) {
        let mut refs: HashMap<u64, u32> = HashMap::new();
        for e in self.dirs.values().flatten().flat_map(|b| &b.entries) {
            let r = refs.entry(e.ino).or_default();
            *r = r.saturating_add(1);
        }
        let mut fixes = Vec::new();
        for (&ino, inode) in self.inodes.iter_mut() {
            let have = refs.get(&ino).copied().unwrap_or(0);
            // An unlisted inode was reported as an orphan; an in-use inode cannot have 0 links.
            if ino == ROOT_INODE || have == 0 || inode.links == have {
                continue;
            }
            fixes.push(format!(
                "inode {ino} had link count {} but {have} directory entries name it; corrected",
                inode.links
            ));
            inode.links = have;
            self.dirty.insert(ino);
        }
        self.report.fixed.extend(fixes);
    }

    /// Directory blocks, inode-table blocks and both rebuilt bitmaps, then every block
    /// whose contents change is written, and one flush.
    fn write_back(&mut self) -> Result<(), FsError> {
        let bs = self.bs;
        let mut unfit = Vec::new();
        for (d, blocks) in &self.dirs {
            for b in blocks.iter().filter(|b| b.dirty) {
                match dir::encode_block(&b.entries, bs, b.number) {
                    Some(img) => {
                        self.writes.insert(b.number, img);
                    }
                    None => unfit.push(format!(
                        "directory inode {d}: the entries of block {} no longer fit it; left unchanged",
                        b.number
                    )),
                }
            }
        }
        self.report.unrepairable.extend(unfit);

        let per = Layout::inodes_per_block(self.l.block_size);
        let mut table: BTreeSet<u64> = self.dirty.iter().map(|i| i / per).collect();
        table.extend(self.reseal.iter().copied());
        for i in table {
            if i >= self.l.inode_table_len {
                continue;
            }
            let n = self.l.inode_table_start + i;
            let mut b = self.read(n)?;
            for slot in 0..per {
                let ino = i * per + slot;
                if ino >= self.l.inode_count {
                    break;
                }
                if self.dirty.contains(&ino) {
                    let at = HEADER_LEN + slot as usize * INODE_SIZE;
                    let enc = self
                        .inodes
                        .get(&ino)
                        .map_or_else(|| Inode::free().encode(), Inode::encode);
                    b[at..at + INODE_SIZE].copy_from_slice(&enc);
                }
            }
            seal(&mut b, BlockKind::InodeTable, n);
            self.writes.insert(n, b);
        }

        let mut used_inodes = Bitmap::new(self.l.inode_count);
        used_inodes.set(0, true);
        for &ino in self.inodes.keys() {
            used_inodes.set(ino, true);
        }
        let blocks = std::mem::replace(&mut self.claimed, Bitmap::new(0));
        self.write_bitmap(
            &blocks,
            self.l.block_bitmap_start,
            self.l.block_bitmap_len,
            BlockKind::BlockBitmap,
            "block",
        )?;
        self.claimed = blocks;
        self.write_bitmap(
            &used_inodes,
            self.l.inode_bitmap_start,
            self.l.inode_bitmap_len,
            BlockKind::InodeBitmap,
            "inode",
        )?;

        for (n, img) in &self.writes {
            if self.io.read(*n)? != *img {
                self.io.write(*n, img)?;
            }
        }
        self.io.flush()
    }

    /// Queues the blocks of `map` that differ from the device, saying what changed.
    fn write_bitmap(
        &mut self,
        map: &Bitmap,
        start: u64,
        len: u64,
        kind: BlockKind,
        what: &str,
    ) -> Result<(), FsError> {
        let per = Bitmap::bits_per_block(self.bs);
        for i in 0..len {
            let n = start + i;
            let old = self.read(n)?;
            let new = map.encode_block(i, self.bs, kind, n);
            if old == new {
                continue;
            }
            if let Err(e) = verify(&old, kind, n) {
                self.fixed(format!(
                    "{}: {e}; rebuilt it from the {what}s in use",
                    kind.name()
                ));
            } else {
                let first = i * per;
                let (mut now_used, mut now_free) = (Vec::new(), Vec::new());
                for bit in 0..per.min(map.len().saturating_sub(first)) {
                    let was = old[HEADER_LEN + (bit / 8) as usize] & (1 << (bit % 8)) != 0;
                    match (was, map.get(first + bit)) {
                        (false, true) => now_used.push(first + bit),
                        (true, false) => now_free.push(first + bit),
                        _ => {}
                    }
                }
                if !now_used.is_empty() {
                    self.fixed(format!(
                        "{} block {n}: marked {} {what}(s) in use that were marked free: {}",
                        kind.name(),
                        now_used.len(),
                        examples(&now_used)
                    ));
                }
                if !now_free.is_empty() {
                    self.fixed(format!(
                        "{} block {n}: marked {} {what}(s) free that nothing uses: {}",
                        kind.name(),
                        now_free.len(),
                        examples(&now_free)
                    ));
                }
                if now_used.is_empty() && now_free.is_empty() {
                    self.fixed(format!(
                        "{} block {n}: cleared bits past the last {what}",
                        kind.name()
                    ));
                }
            }
            self.writes.insert(n, new);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fsck::fsck;
    use crate::testing::{
        bit_flips, format_ram_disk, fresh_metadata_blocks, ghost_entry_transaction, reopen, BitFlip,
    };
    use kura_engine::backend::mem::MemStorage;

    fn formatted(bytes: u64, block_size: u32) -> (MemStorage, Layout) {
        let (storage, sb) = format_ram_disk(bytes, block_size, 4096);
        (storage, sb.layout)
    }

    fn block(storage: &MemStorage, l: &Layout, n: u64) -> Vec<u8> {
        let bs = l.block_size as usize;
        storage.lock().expect("lock")[n as usize * bs..(n as usize + 1) * bs].to_vec()
    }

    fn put(storage: &MemStorage, l: &Layout, n: u64, data: &[u8]) {
        let bs = l.block_size as usize;
        storage.lock().expect("lock")[n as usize * bs..(n as usize + 1) * bs].copy_from_slice(data);
    }

    fn put_inode(storage: &MemStorage, l: &Layout, ino: u64, inode: &Inode) {
        let per = Layout::inodes_per_block(l.block_size);
        let n = l.inode_table_start + ino / per;
        let mut b = block(storage, l, n);
        let at = HEADER_LEN + (ino % per) as usize * INODE_SIZE;
        b[at..at + INODE_SIZE].copy_from_slice(&inode.encode());
        seal(&mut b, BlockKind::InodeTable, n);
        put(storage, l, n, &b);
    }

    fn read_inode(storage: &MemStorage, l: &Layout, ino: u64) -> Inode {
        let per = Layout::inodes_per_block(l.block_size);
        let b = block(storage, l, l.inode_table_start + ino / per);
        let at = HEADER_LEN + (ino % per) as usize * INODE_SIZE;
        Inode::decode(ino, &b[at..at + INODE_SIZE]).expect("inode decodes")
    }

    /// Sets or clears `bit` of the bitmap starting at block `start`, resealing its block.
    fn set_bit(storage: &MemStorage, l: &Layout, start: u64, kind: BlockKind, bit: u64, on: bool) {
        let per = Bitmap::bits_per_block(l.block_size as usize);
        let n = start + bit / per;
        let i = bit % per;
        let mut b = block(storage, l, n);
        let byte = &mut b[HEADER_LEN + (i / 8) as usize];
        if on {
            *byte |= 1 << (i % 8);
        } else {
            *byte &= !(1 << (i % 8));
        }
        seal(&mut b, kind, n);
        put(storage, l, n, &b);
    }

    fn entries(storage: &MemStorage, l: &Layout, dir: u64) -> Vec<DirEntry> {
        let inode = read_inode(storage, l, dir);
        let mut out = Vec::new();
        for e in &inode.inline[..inode.extent_count as usize] {
            for n in e.physical..e.physical + u64::from(e.length) {
                out.extend(dir::decode_block(&block(storage, l, n), n).expect("directory block"));
            }
        }
        out
    }

    fn file_inode(parent: u64, physical: u64) -> Inode {
        let mut f = Inode::new(Kind::File, 0o644, parent, 1);
        f.size = 100;
        f.blocks = 1;
        f.extent_count = 1;
        f.inline[0] = Extent {
            logical: 0,
            length: 1,
            physical,
        };
        f
    }

    fn dir_inode(parent: u64, physical: u64, bs: u32) -> Inode {
        let mut d = file_inode(parent, physical);
        d.kind = Kind::Directory;
        d.size = u64::from(bs);
        d
    }

    /// Repairs with nothing left unrepairable, then checks fsck is clean without notes and a
    /// second repair finds nothing to do.
    fn repair_until_clean(storage: &MemStorage) -> RepairReport {
        let report = repair(reopen(storage)).expect("repair");
        assert!(report.unrepairable.is_empty(), "{:?}", report.unrepairable);
        let after = fsck(reopen(storage)).expect("fsck");
        assert!(
            after.is_clean(),
            "problems {:?} after {:?}",
            after.problems,
            report.fixed
        );
        assert!(after.notes.is_empty(), "{:?}", after.notes);
        let again = repair(reopen(storage)).expect("second repair");
        assert!(again.is_clean(), "second repair: {again:?}");
        report
    }

    #[test]
    fn a_block_missing_from_the_block_bitmap_is_marked_used() {
        let (storage, l) = formatted(16 << 20, 8192);
        let root_block = l.data_start;
        set_bit(
            &storage,
            &l,
            l.block_bitmap_start,
            BlockKind::BlockBitmap,
            root_block,
            false,
        );
        let before = fsck(reopen(&storage)).expect("fsck");
        assert_eq!(
            before.problems,
            vec![format!(
                "block {root_block} is in use but marked free in the block bitmap"
            )]
        );
        let report = repair_until_clean(&storage);
        assert_eq!(
            report.fixed,
            vec![format!(
                "block bitmap block {}: marked 1 block(s) in use that were marked free: {root_block}",
                l.block_bitmap_start
            )]
        );
    }

    #[test]
    fn a_damaged_primary_superblock_is_restored_from_the_backup() {
        let (storage, l) = formatted(16 << 20, 8192);
        let pristine = block(&storage, &l, 0);
        storage.lock().expect("lock")[60] ^= 0x10;
        let before = fsck(reopen(&storage)).expect("fsck");
        assert!(!before.is_clean());
        let report = repair_until_clean(&storage);
        assert_eq!(report.fixed.len(), 1, "{:?}", report.fixed);
        assert!(
            report.fixed[0].starts_with("block 0:"),
            "{:?}",
            report.fixed
        );
        assert_eq!(block(&storage, &l, 0), pristine);

        // Destroyed outright, and with the backup damaged instead.
        storage.lock().expect("lock")[..8192].fill(0);
        repair_until_clean(&storage);
        assert_eq!(block(&storage, &l, 0), pristine);
        let backup = l.backup_superblock();
        let mut b = block(&storage, &l, backup);
        b[30] ^= 1;
        put(&storage, &l, backup, &b);
        let report = repair_until_clean(&storage);
        assert!(
            report.fixed[0].contains(&format!("backup superblock (block {backup})")),
            "{:?}",
            report.fixed
        );
    }

    #[test]
    fn shared_block_runs_answer_membership_and_complements() {
        let mut s = SharedBlocks::default();
        s.add(10, 12);
        s.add(12, 15);
        s.add(20, 21);
        assert_eq!(s.runs.len(), 2, "adjacent runs merge");
        assert!(s.contains(&10) && s.contains(&14) && s.contains(&20));
        assert!(!s.contains(&15) && !s.contains(&9) && !s.contains(&21));
        assert_eq!(s.outside(0, 30), vec![(0, 10), (15, 20), (21, 30)]);
        assert_eq!(s.outside(11, 13), vec![]);
        assert_eq!(s.outside(13, 22), vec![(15, 20), (21, 22)]);
    }

    #[test]
    fn many_inodes_mapping_the_whole_data_region_and_an_impossible_size_are_bounded() {
        let (storage, l) = formatted(64 << 20, 4096);
        // Inodes 5..69 each map every data block (one extent), unlisted: before, repair walked
        // and recorded every block of every inode; and inode 5 says it is 2^62 bytes long.
        let whole = u32::try_from(l.data_blocks() - 1).expect("small device");
        for ino in 5..69 {
            let mut f = file_inode(ROOT_INODE, l.data_start + 1);
            f.inline[0].length = whole;
            f.blocks = u64::from(whole);
            if ino == 5 {
                f.size = 1 << 62;
            }
            put_inode(&storage, &l, ino, &f);
            set_bit(
                &storage,
                &l,
                l.inode_bitmap_start,
                BlockKind::InodeBitmap,
                ino,
                true,
            );
        }
        let started = std::time::Instant::now();
        let report = repair(reopen(&storage)).expect("repair");
        assert!(
            started.elapsed() < std::time::Duration::from_secs(20),
            "repair took {:?}",
            started.elapsed()
        );
        assert!(
            report
                .unrepairable
                .iter()
                .any(|p| p.contains("left with both owners") && p.contains("more")),
            "{:?}",
            report.unrepairable
        );
        assert!(
            report.fixed.iter().any(|p| p.contains("inode 5: its size")),
            "{:?}",
            report.fixed
        );
    }

    #[test]
    fn an_unreachable_inode_is_reattached_under_lost_and_found() {
        let (storage, l) = formatted(16 << 20, 8192);
        // A valid file, marked used in the inode bitmap, that no directory lists; its data block
        // is not marked in the block bitmap either.
        let data = l.data_start + 5;
        put_inode(&storage, &l, 5, &file_inode(ROOT_INODE, data));
        set_bit(
            &storage,
            &l,
            l.inode_bitmap_start,
            BlockKind::InodeBitmap,
            5,
            true,
        );
        let before = fsck(reopen(&storage)).expect("fsck");
        assert!(
            before
                .problems
                .iter()
                .any(|p| p.contains("inode 5 is in use but not reachable")),
            "{:?}",
            before.problems
        );
        let report = repair_until_clean(&storage);
        assert!(
            report
                .fixed
                .iter()
                .any(|f| f.contains("listed it as /lost+found/#5")),
            "{:?}",
            report.fixed
        );
        let root = entries(&storage, &l, ROOT_INODE);
        assert_eq!(root.len(), 1);
        assert_eq!(root[0].name, LOST_AND_FOUND);
        assert_eq!(root[0].kind, Kind::Directory);
        let lf = entries(&storage, &l, root[0].ino);
        assert_eq!(
            lf,
            vec![DirEntry {
                ino: 5,
                kind: Kind::File,
                name: b"#5".to_vec()
            }]
        );
        assert_eq!(read_inode(&storage, &l, root[0].ino).parent, ROOT_INODE);
    }

    #[test]
    fn a_record_naming_a_free_inode_is_removed() {
        let (storage, l) = formatted(16 << 20, 8192);
        let root_block = l.data_start;
        let ghost = DirEntry {
            ino: 7,
            kind: Kind::File,
            name: b"ghost".to_vec(),
        };
        put(
            &storage,
            &l,
            root_block,
            &dir::encode_block(&[ghost], 8192, root_block).expect("fits"),
        );
        assert!(!fsck(reopen(&storage)).expect("fsck").is_clean());
        let report = repair_until_clean(&storage);
        assert_eq!(
            report.fixed,
            vec![format!("directory inode 1, block {root_block}: removed `ghost`, which names inode 7, which is not in use")]
        );
        assert!(entries(&storage, &l, ROOT_INODE).is_empty());
    }

    #[test]
    fn repairing_a_clean_file_system_changes_nothing() {
        for bs in [4096, 8192, 65536] {
            let (storage, _) = formatted(64 << 20, bs);
            let pristine = storage.lock().expect("lock").clone();
            let report = repair(reopen(&storage)).expect("repair");
            assert!(report.is_clean(), "bs {bs}: {report:?}");
            assert!(
                *storage.lock().expect("lock") == pristine,
                "bs {bs}: bytes changed"
            );
        }
    }

    #[test]
    fn the_journal_is_replayed_before_repairing() {
        let (storage, l) = formatted(16 << 20, 8192);
        for (n, b) in ghost_entry_transaction(&l) {
            put(&storage, &l, n, &b);
        }
        let report = repair_until_clean(&storage);
        assert!(
            report.fixed[0].starts_with("replayed 1 committed journal transaction"),
            "{:?}",
            report.fixed
        );
        assert!(
            report.fixed.iter().any(|f| f.contains("removed `ghost`")),
            "{:?}",
            report.fixed
        );
    }

    #[test]
    fn a_corrupt_inode_is_cleared_and_its_names_and_blocks_freed() {
        let (storage, l) = formatted(16 << 20, 8192);
        let data = l.data_start + 1;
        put_inode(&storage, &l, 3, &file_inode(ROOT_INODE, data));
        set_bit(
            &storage,
            &l,
            l.inode_bitmap_start,
            BlockKind::InodeBitmap,
            3,
            true,
        );
        set_bit(
            &storage,
            &l,
            l.block_bitmap_start,
            BlockKind::BlockBitmap,
            data,
            true,
        );
        let entry = DirEntry {
            ino: 3,
            kind: Kind::File,
            name: b"f".to_vec(),
        };
        put(
            &storage,
            &l,
            l.data_start,
            &dir::encode_block(&[entry], 8192, l.data_start).expect("fits"),
        );
        assert!(fsck(reopen(&storage)).expect("fsck").is_clean());
        // Flip a bit inside inode 3 and reseal its table block: only the inode's CRC fails.
        let n = l.inode_table_start;
        let mut b = block(&storage, &l, n);
        b[HEADER_LEN + 3 * INODE_SIZE + 9] ^= 1;
        seal(&mut b, BlockKind::InodeTable, n);
        put(&storage, &l, n, &b);
        let report = repair_until_clean(&storage);
        assert!(
            report
                .fixed
                .iter()
                .any(|f| f == "inode 3: checksum mismatch; cleared it"),
            "{:?}",
            report.fixed
        );
        assert!(entries(&storage, &l, ROOT_INODE).is_empty());
        let fresh = fsck(reopen(&storage)).expect("fsck");
        assert_eq!(fresh.used_blocks, l.data_start + 2);
    }

    #[test]
    fn a_cycle_of_directories_cut_off_from_the_root_is_reattached_once() {
        let (storage, l) = formatted(16 << 20, 8192);
        let (a, b) = (l.data_start + 1, l.data_start + 2);
        put_inode(&storage, &l, 3, &dir_inode(4, a, 8192));
        put_inode(&storage, &l, 4, &dir_inode(3, b, 8192));
        let to = |ino, name: &[u8]| DirEntry {
            ino,
            kind: Kind::Directory,
            name: name.to_vec(),
        };
        put(
            &storage,
            &l,
            a,
            &dir::encode_block(&[to(4, b"four")], 8192, a).expect("fits"),
        );
        put(
            &storage,
            &l,
            b,
            &dir::encode_block(&[to(3, b"three")], 8192, b).expect("fits"),
        );
        for ino in [3, 4] {
            set_bit(
                &storage,
                &l,
                l.inode_bitmap_start,
                BlockKind::InodeBitmap,
                ino,
                true,
            );
        }
        for n in [a, b] {
            set_bit(
                &storage,
                &l,
                l.block_bitmap_start,
                BlockKind::BlockBitmap,
                n,
                true,
            );
        }
        let before = fsck(reopen(&storage)).expect("fsck");
        assert_eq!(before.problems.len(), 2, "{:?}", before.problems);
        repair_until_clean(&storage);
        let root = entries(&storage, &l, ROOT_INODE);
        let lf = entries(&storage, &l, root[0].ino);
        assert_eq!(lf.len(), 1, "{lf:?}");
        assert_eq!(lf[0].name, b"#3".to_vec());
        assert_eq!(entries(&storage, &l, 3), vec![to(4, b"four")]);
        assert!(entries(&storage, &l, 4).is_empty());
    }

    #[test]
    fn a_missing_root_directory_is_recreated_and_its_children_kept() {
        let (storage, l) = formatted(16 << 20, 8192);
        put_inode(&storage, &l, 2, &file_inode(ROOT_INODE, l.data_start + 1));
        set_bit(
            &storage,
            &l,
            l.inode_bitmap_start,
            BlockKind::InodeBitmap,
            2,
            true,
        );
        put_inode(&storage, &l, ROOT_INODE, &Inode::free());
        let report = repair_until_clean(&storage);
        assert!(
            report
                .fixed
                .iter()
                .any(|f| f.contains("recreated it empty")),
            "{:?}",
            report.fixed
        );
        let root = entries(&storage, &l, ROOT_INODE);
        let lf = entries(&storage, &l, root[0].ino);
        assert_eq!(lf[0].ino, 2);
    }

    #[test]
    fn many_orphans_grow_lost_and_found_beyond_one_block() {
        let (storage, l) = formatted(64 << 20, 4096);
        let mut file = Inode::new(Kind::File, 0o644, ROOT_INODE, 1);
        file.links = 3;
        for ino in 2..700 {
            put_inode(&storage, &l, ino, &file);
        }
        let report = repair_until_clean(&storage);
        assert!(
            report
                .fixed
                .iter()
                .any(|f| f.contains("added block") && f.contains("to hold more entries")),
            "{:?}",
            report.fixed
        );
        let root = entries(&storage, &l, ROOT_INODE);
        let lf = read_inode(&storage, &l, root[0].ino);
        assert!(lf.blocks > 1, "{lf:?}");
        let listed = entries(&storage, &l, root[0].ino);
        assert_eq!(listed.len(), 698);
        assert!(listed
            .iter()
            .all(|e| e.name == format!("#{}", e.ino).into_bytes()));
        assert_eq!(read_inode(&storage, &l, 2).links, 1);
    }

    #[test]
    fn a_directory_block_with_a_bad_checksum_keeps_its_records() {
        let (storage, l) = formatted(16 << 20, 8192);
        let names: [&[u8]; 3] = [b"alpha", b"beta", b"gamma"];
        let mut listed = Vec::new();
        for (k, name) in names.iter().enumerate() {
            let ino = 2 + k as u64;
            put_inode(
                &storage,
                &l,
                ino,
                &Inode::new(Kind::File, 0o644, ROOT_INODE, 1),
            );
            set_bit(
                &storage,
                &l,
                l.inode_bitmap_start,
                BlockKind::InodeBitmap,
                ino,
                true,
            );
            listed.push(DirEntry {
                ino,
                kind: Kind::File,
                name: name.to_vec(),
            });
        }
        let n = l.data_start;
        let mut b = dir::encode_block(&listed, 8192, n).expect("fits");
        put(&storage, &l, n, &b);
        assert!(fsck(reopen(&storage)).expect("fsck").is_clean());
        b[HEADER_LEN + 24 + 12] ^= 0x20; // `beta` becomes `Beta`; the CRC no longer matches
        put(&storage, &l, n, &b);
        let report = repair_until_clean(&storage);
        assert!(
            report.fixed[0].contains("kept the 3 record(s)"),
            "{:?}",
            report.fixed
        );
        listed[1].name = b"Beta".to_vec();
        assert_eq!(entries(&storage, &l, ROOT_INODE), listed);
    }

    #[test]
    fn a_root_inode_that_is_a_file_is_moved_aside_and_the_root_recreated() {
        let (storage, l) = formatted(16 << 20, 8192);
        put_inode(
            &storage,
            &l,
            ROOT_INODE,
            &file_inode(ROOT_INODE, l.data_start),
        );
        let report = repair_until_clean(&storage);
        assert!(
            report
                .fixed
                .iter()
                .any(|f| f.contains("was a regular file; moved it to inode 2")),
            "{:?}",
            report.fixed
        );
        assert_eq!(read_inode(&storage, &l, ROOT_INODE).kind, Kind::Directory);
        let root = entries(&storage, &l, ROOT_INODE);
        let lf = entries(&storage, &l, root[0].ino);
        assert_eq!(lf[0].ino, 2);
        assert_eq!(read_inode(&storage, &l, 2).inline[0].physical, l.data_start);
    }

    #[test]
    fn every_bit_flip_in_metadata_is_repaired_and_none_panics() {
        let (storage, l) = formatted(8 << 20, 4096);
        let pristine = storage.lock().expect("lock").clone();
        let checked = fresh_metadata_blocks(&l);
        for flip in bit_flips(0x0bad_5eed_1234_5678, 200, &checked, 4096) {
            let BitFlip {
                round, block, at, ..
            } = flip;
            flip.apply(&mut storage.lock().expect("lock"), &pristine);
            let report = repair(reopen(&storage))
                .unwrap_or_else(|e| panic!("round {round}: block {block} byte {at}: {e}"));
            assert!(
                report.unrepairable.is_empty(),
                "round {round}: {:?}",
                report.unrepairable
            );
            let after = fsck(reopen(&storage)).expect("fsck");
            assert!(
                after.is_clean() && after.notes.is_empty(),
                "round {round}: flip in block {block} at byte {at}: {:?} {:?} after {:?}",
                after.problems,
                after.notes,
                report.fixed
            );
        }
    }
}
