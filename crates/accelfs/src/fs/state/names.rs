//! Names: directories (their blocks and a name index, loaded on first use, [`Dir`]), path
//! resolution, create (files, directories, symbolic links, FIFOs, sockets, device nodes),
//! hard links, unlink, rmdir, rename (with `RENAME_NOREPLACE` and `RENAME_EXCHANGE`), listing
//! and `readlink`. Every operation checks everything first and changes nothing when it fails.
//!
//! Owns the `dirs` field of [`Mounted`]; directory blocks changed in the running transaction
//! are marked here and encoded by the journal concern at commit.

use super::{corrupt, Mounted};
use crate::dir::{self, validate_name, DirEntry};
use crate::error::FsError;
use crate::fs::path::components;
use crate::fs::{file_type, kind_of, DirEntryInfo, NodeSpec, RenameMode};
use crate::inode::{Kind, INLINE_TARGET, MAX_TARGET};
use crate::layout::ROOT_INODE;
use std::collections::{BTreeSet, HashMap};

/// The setgid permission bit (`S_ISGID`).
const SETGID: u16 = 0o2000;

/// A directory's blocks and a name index.
pub(super) struct Dir {
    pub(super) blocks: Vec<DirBlock>,
    pub(super) index: HashMap<Vec<u8>, usize>,
    pub(super) dirty: BTreeSet<usize>,
}

pub(super) struct DirBlock {
    pub(super) physical: u64,
    pub(super) entries: Vec<DirEntry>,
    pub(super) used: usize,
}

impl Dir {
    pub(super) fn entries(&self) -> impl Iterator<Item = &DirEntry> {
        self.blocks.iter().flat_map(|b| b.entries.iter())
    }

    pub(super) fn is_empty(&self) -> bool {
        self.index.is_empty()
    }

    pub(super) fn get(&self, name: &[u8]) -> Option<&DirEntry> {
        let &i = self.index.get(name)?;
        self.blocks[i].entries.iter().find(|e| e.name == name)
    }
}

impl Mounted {
    /// Loads directory `ino` if needed; `NotADirectory` when it is a file.
    pub(super) fn dir(&mut self, ino: u64) -> Result<&mut Dir, FsError> {
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
    pub(super) fn init_empty_dir(&mut self, ino: u64, physical: u64) -> Result<(), FsError> {
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
    pub(super) fn dir_add(&mut self, dir_ino: u64, entry: DirEntry) -> Result<(), FsError> {
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
    pub(super) fn dir_remove(&mut self, dir_ino: u64, name: &[u8]) -> Result<DirEntry, FsError> {
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

    /// Drops what is loaded of directory `ino` (its inode was freed).
    pub(super) fn forget_dir(&mut self, ino: u64) {
        self.dirs.remove(&ino);
    }

    /// The inode a path names.
    pub(crate) fn resolve(&mut self, path: &str) -> Result<u64, FsError> {
        let mut ino = ROOT_INODE;
        for c in components(path)? {
            ino = self.step(ino, c, path)?;
        }
        Ok(ino)
    }

    /// [`Mounted::resolve`] under the shared state lock: `Some` only when every directory on
    /// the way is in memory and the path resolves; `None` for anything else (not loaded, not
    /// found, a bad path), which the caller redoes under the exclusive lock for the loading or
    /// the exact error.
    pub(crate) fn resolve_loaded(&self, path: &str) -> Option<u64> {
        let mut ino = ROOT_INODE;
        for c in components(path).ok()? {
            let node = self.nodes.get(&ino)?;
            if node.inode.kind != Kind::Directory {
                return None;
            }
            ino = if c == b".." {
                if ino == ROOT_INODE {
                    ROOT_INODE
                } else {
                    node.inode.parent
                }
            } else {
                self.dirs.get(&ino)?.get(c)?.ino
            };
        }
        Some(ino)
    }

    /// [`Mounted::lookup`] under the shared state lock: `None` when the directory is not in
    /// memory (or the name is too long: the exclusive path gives that error).
    pub(crate) fn lookup_loaded(&self, parent: u64, name: &[u8]) -> Option<Option<DirEntry>> {
        if name.len() > dir::MAX_NAME {
            return None;
        }
        Some(self.dirs.get(&parent)?.get(name).cloned())
    }

    /// [`Mounted::list`] under the shared state lock: `None` when the directory is not in
    /// memory.
    pub(crate) fn list_loaded(&self, ino: u64) -> Option<Vec<DirEntryInfo>> {
        Some(Self::entries_sorted(self.dirs.get(&ino)?))
    }

    /// The directory holding the last component of `path`, and that name.
    pub(crate) fn resolve_parent(&mut self, path: &str) -> Result<(u64, Vec<u8>), FsError> {
        let mut parts = components(path)?;
        let name = match parts.pop() {
            Some(n) if n != b".." => n.to_vec(),
            _ => {
                return Err(FsError::Invalid(format!(
                    "{path}: names no entry (the root, `.` or `..`)"
                )))
            }
        };
        let mut ino = ROOT_INODE;
        for c in parts {
            ino = self.step(ino, c, path)?;
        }
        if self.node(ino)?.inode.kind != Kind::Directory {
            return Err(FsError::NotADirectory(path.to_string()));
        }
        Ok((ino, name))
    }

    fn step(&mut self, ino: u64, c: &[u8], path: &str) -> Result<u64, FsError> {
        let node = self.node(ino)?;
        if node.inode.kind != Kind::Directory {
            return Err(FsError::NotADirectory(path.to_string()));
        }
        if c == b".." {
            return Ok(if ino == ROOT_INODE {
                ROOT_INODE
            } else {
                node.inode.parent
            });
        }
        self.dir(ino)?
            .get(c)
            .map(|e| e.ino)
            .ok_or_else(|| FsError::NotFound(path.to_string()))
    }

    pub(crate) fn lookup(&mut self, parent: u64, name: &[u8]) -> Result<Option<DirEntry>, FsError> {
        // No entry can have a longer name; say so (ENAMETOOLONG) rather than "not found", as
        // ext4 and tmpfs do, so a symlink to such a name fails the same way on every file system.
        if name.len() > dir::MAX_NAME {
            return Err(FsError::BadName {
                path: String::from_utf8_lossy(name).into_owned(),
                source: dir::NameError::TooLong(name.len()),
            });
        }
        Ok(self.dir(parent)?.get(name).cloned())
    }

    /// Creates `name` in `parent` as a new file or directory; returns its inode.
    pub(crate) fn create_entry(
        &mut self,
        parent: u64,
        name: &[u8],
        kind: Kind,
        mode: u16,
    ) -> Result<u64, FsError> {
        self.create_node(parent, name, &NodeSpec::new(file_type(kind), mode))
    }

    /// Creates `name` in `parent` as `spec` describes; returns its inode.
    pub(crate) fn create_node(
        &mut self,
        parent: u64,
        name: &[u8],
        spec: &NodeSpec,
    ) -> Result<u64, FsError> {
        self.writable()?;
        let kind = kind_of(spec.file_type);
        let shown = String::from_utf8_lossy(name).into_owned();
        if kind.needs_posix() {
            self.need_posix(&shown)?;
        }
        validate_name(name).map_err(|source| FsError::BadName {
            path: shown.clone(),
            source,
        })?;
        let target = &spec.target;
        if kind == Kind::Symlink
            && (target.is_empty() || target.len() > MAX_TARGET || target.contains(&0))
        {
            return Err(FsError::Invalid(format!(
                "{shown}: a symbolic link's target must be 1 to {MAX_TARGET} bytes without NUL"
            )));
        }
        if self.lookup(parent, name)?.is_some() {
            return Err(FsError::Exists(shown));
        }
        self.make_transaction_room()?;
        // A directory or slow symlink needs an inode and a block; others an inode; the parent
        // maybe a block.
        let slow_link = kind == Kind::Symlink && target.len() > INLINE_TARGET;
        let blocks_needed = if kind == Kind::Directory || slow_link {
            2
        } else {
            1
        };
        if self.alloc.free_block_count() < blocks_needed + 1 {
            return Err(FsError::NoSpace(format!("cannot create {shown}")));
        }
        // A setgid directory gives what is made in it its group, and a new directory its
        // setgid bit too (Linux's BSD group semantics, which ext4 applies at creation).
        let (mut mode, mut owner) = (spec.mode, spec.owner);
        let p = &self.node(parent)?.inode;
        if p.mode & SETGID != 0 {
            if kind == Kind::Directory {
                mode |= SETGID;
            }
            if let (Some((uid, _)), true) = (owner, p.flags & crate::inode::FLAG_OWNER != 0) {
                owner = Some((uid, p.gid));
            }
        }
        let ino = self.new_node(kind, mode, parent)?;
        {
            let node = self.node(ino)?;
            if let Some((uid, gid)) = owner {
                node.inode.flags |= crate::inode::FLAG_OWNER;
                node.inode.uid = uid;
                node.inode.gid = gid;
            }
            if matches!(kind, Kind::CharDevice | Kind::BlockDevice) {
                node.inode.rdev = spec.rdev;
            }
            if kind == Kind::Symlink && !slow_link {
                node.inode.target[..target.len()].copy_from_slice(target);
                node.inode.size = target.len() as u64;
            }
        }
        if slow_link {
            // One block, written through the cache as ordered data; no commit can come between
            // here and the directory entry (write_data could make transaction room).
            if let Err(e) = self.write_step(ino, 0, target, false) {
                self.free_node(ino)?;
                return Err(e);
            }
            self.node(ino)?.inode.size = target.len() as u64;
            self.mark_layout_changed(ino);
        }
        if kind == Kind::Directory {
            let (p, _) = self
                .alloc
                .alloc_blocks(0, 1)
                .ok_or_else(|| FsError::NoSpace(format!("cannot create {shown}")))?;
            let bs = self.bs as u64;
            let node = self.node(ino)?;
            node.map.insert(0, 1, p);
            node.inode.size = bs;
            self.init_empty_dir(ino, p)?;
        }
        self.dir_add(
            parent,
            DirEntry {
                ino,
                kind,
                name: name.to_vec(),
            },
        )?;
        Ok(ino)
    }

    /// Adds the name `new_name` in `new_parent` for inode `ino` (a hard link).
    pub(crate) fn link_entry(
        &mut self,
        ino: u64,
        new_parent: u64,
        new_name: &[u8],
    ) -> Result<(), FsError> {
        self.writable()?;
        let shown = String::from_utf8_lossy(new_name).into_owned();
        validate_name(new_name).map_err(|source| FsError::BadName {
            path: shown.clone(),
            source,
        })?;
        let kind = self.live_node(ino)?.inode.kind;
        if kind == Kind::Directory {
            return Err(FsError::NotPermitted(format!(
                "inode {ino} is a directory, which cannot be hard linked"
            )));
        }
        self.need_posix("link")?;
        if self.node(new_parent)?.inode.kind != Kind::Directory {
            return Err(FsError::NotADirectory(shown));
        }
        if self.lookup(new_parent, new_name)?.is_some() {
            return Err(FsError::Exists(shown));
        }
        if self.live_node(ino)?.inode.links == u32::MAX {
            return Err(FsError::TooManyLinks(format!("inode {ino}")));
        }
        self.make_transaction_room()?;
        if self.alloc.free_block_count() < 1 {
            return Err(FsError::NoSpace(format!("cannot link {shown}")));
        }
        self.dir_add(
            new_parent,
            DirEntry {
                ino,
                kind,
                name: new_name.to_vec(),
            },
        )?;
        let node = self.node(ino)?;
        node.inode.links += 1;
        node.inode.ctime_ns = crate::mkfs::now_ns();
        self.touch(ino);
        Ok(())
    }

    /// Drops one link of inode `ino` whose name was just removed: frees it at the last.
    fn drop_link(&mut self, ino: u64) -> Result<(), FsError> {
        let node = self.node(ino)?;
        if node.inode.kind == Kind::Directory || node.inode.links <= 1 {
            return self.free_node(ino);
        }
        node.inode.links -= 1;
        node.inode.ctime_ns = crate::mkfs::now_ns();
        self.touch(ino);
        Ok(())
    }

    /// The target of symbolic link `ino`.
    pub(crate) fn read_link(&mut self, ino: u64) -> Result<Vec<u8>, FsError> {
        let inode = self.live_node(ino)?.inode.clone();
        if inode.kind != Kind::Symlink {
            return Err(FsError::NotASymlink(format!("inode {ino}")));
        }
        let len = inode.size as usize;
        if inode.is_fast_symlink() {
            return Ok(inode.target[..len].to_vec());
        }
        let mut out = vec![0u8; len];
        let n = self.read_data(ino, 0, &mut out)?;
        if n != len || out.contains(&0) {
            return Err(corrupt(format!(
                "inode {ino}: symbolic link target is damaged"
            )));
        }
        Ok(out)
    }

    /// Removes the entry `name` of `parent`; a directory must be empty.
    pub(crate) fn remove_entry(
        &mut self,
        parent: u64,
        name: &[u8],
        want_dir: bool,
    ) -> Result<(), FsError> {
        self.writable()?;
        let shown = String::from_utf8_lossy(name).into_owned();
        let e = self
            .lookup(parent, name)?
            .ok_or_else(|| FsError::NotFound(shown.clone()))?;
        match (e.kind == Kind::Directory, want_dir) {
            (true, false) => return Err(FsError::IsADirectory(shown)),
            (false, true) => return Err(FsError::NotADirectory(shown)),
            _ => {}
        }
        if e.kind == Kind::Directory && !self.dir(e.ino)?.is_empty() {
            return Err(FsError::NotEmpty(shown));
        }
        self.make_transaction_room()?;
        self.dir_remove(parent, name)?;
        self.drop_link(e.ino)
    }

    /// Moves `parent/name` to `new_parent/new_name`, replacing a file or an empty directory
    /// there (as POSIX rename does), or as `mode` says.
    pub(crate) fn rename_entry(
        &mut self,
        parent: u64,
        name: &[u8],
        new_parent: u64,
        new_name: &[u8],
        mode: RenameMode,
    ) -> Result<(), FsError> {
        self.writable()?;
        let shown = String::from_utf8_lossy(name).into_owned();
        let shown_new = String::from_utf8_lossy(new_name).into_owned();
        validate_name(new_name).map_err(|source| FsError::BadName {
            path: shown_new.clone(),
            source,
        })?;
        let src = self
            .lookup(parent, name)?
            .ok_or_else(|| FsError::NotFound(shown.clone()))?;
        if self.node(new_parent)?.inode.kind != Kind::Directory {
            return Err(FsError::NotADirectory(shown_new));
        }
        if src.kind == Kind::Directory {
            self.check_not_inside(src.ino, new_parent, &shown)?;
        }
        let target = self.lookup(new_parent, new_name)?;
        match (mode, &target) {
            (RenameMode::NoReplace, Some(_)) => return Err(FsError::Exists(shown_new)),
            (RenameMode::Exchange, None) => return Err(FsError::NotFound(shown_new)),
            (RenameMode::Exchange, Some(t)) => {
                let t = t.clone();
                return self.exchange(parent, name, &src, new_parent, new_name, &t);
            }
            _ => {}
        }
        if let Some(t) = &target {
            if t.ino == src.ino {
                return Ok(());
            }
            match (src.kind == Kind::Directory, t.kind == Kind::Directory) {
                (true, false) => return Err(FsError::NotADirectory(shown_new)),
                (false, true) => return Err(FsError::IsADirectory(shown_new)),
                _ => {}
            }
            if t.kind == Kind::Directory && !self.dir(t.ino)?.is_empty() {
                return Err(FsError::NotEmpty(shown_new));
            }
        }
        self.make_transaction_room()?;
        if let Some(t) = target {
            self.dir_remove(new_parent, new_name)?;
            self.drop_link(t.ino)?;
        }
        self.dir_remove(parent, name)?;
        self.dir_add(
            new_parent,
            DirEntry {
                ino: src.ino,
                kind: src.kind,
                name: new_name.to_vec(),
            },
        )?;
        let node = self.node(src.ino)?;
        if src.kind == Kind::Directory {
            node.inode.parent = new_parent;
        }
        node.inode.ctime_ns = crate::mkfs::now_ns();
        self.touch(src.ino);
        Ok(())
    }

    /// Fails when directory `dir` is `at` or one of its ancestors (moving `dir` under `at`
    /// would detach a cycle). The walk up follows on-disk parent fields, which a corrupt image
    /// can point in a cycle: each directory is visited at most once, so the walk ends after at
    /// most as many steps as there are directories on the path (and a cycle is reported, not
    /// followed).
    fn check_not_inside(&mut self, dir: u64, at: u64, shown: &str) -> Result<(), FsError> {
        let start = at;
        let mut at = at;
        let mut seen = std::collections::HashSet::new();
        loop {
            if at == dir {
                return Err(FsError::Invalid(format!(
                    "cannot move directory {shown} inside itself"
                )));
            }
            if at == ROOT_INODE {
                return Ok(());
            }
            if !seen.insert(at) {
                return Err(corrupt(format!(
                    "directory inode {start}: its chain of parent directories loops at inode {at} and never reaches the root"
                )));
            }
            let n = self.node(at)?;
            if n.inode.kind != Kind::Directory {
                return Err(corrupt(format!(
                    "directory inode {start}: its chain of parents reaches inode {at}, which is not a directory"
                )));
            }
            at = n.inode.parent;
        }
    }

    /// `RENAME_EXCHANGE`: `parent/name` (`src`) and `new_parent/new_name` (`dst`) swap inodes.
    fn exchange(
        &mut self,
        parent: u64,
        name: &[u8],
        src: &DirEntry,
        new_parent: u64,
        new_name: &[u8],
        dst: &DirEntry,
    ) -> Result<(), FsError> {
        if src.ino == dst.ino {
            return Ok(());
        }
        if dst.kind == Kind::Directory {
            let shown = String::from_utf8_lossy(new_name).into_owned();
            self.check_not_inside(dst.ino, parent, &shown)?;
        }
        self.make_transaction_room()?;
        self.dir_set(parent, name, dst)?;
        self.dir_set(new_parent, new_name, src)?;
        let now = crate::mkfs::now_ns();
        for (e, holder) in [(src, new_parent), (dst, parent)] {
            let node = self.node(e.ino)?;
            if e.kind == Kind::Directory {
                node.inode.parent = holder;
            }
            node.inode.ctime_ns = now;
            self.touch(e.ino);
        }
        Ok(())
    }

    /// Points the existing entry `name` of `dir_ino` at `to`'s inode and kind.
    fn dir_set(&mut self, dir_ino: u64, name: &[u8], to: &DirEntry) -> Result<(), FsError> {
        let d = self.dir(dir_ino)?;
        let i = *d
            .index
            .get(name)
            .ok_or_else(|| FsError::NotFound(String::from_utf8_lossy(name).into_owned()))?;
        let e = d.blocks[i]
            .entries
            .iter_mut()
            .find(|e| e.name == name)
            .ok_or_else(|| corrupt(format!("directory {dir_ino} index out of date")))?;
        e.ino = to.ino;
        e.kind = to.kind;
        d.dirty.insert(i);
        self.touch_mtime(dir_ino)
    }

    /// Entries of directory `ino`, sorted by name.
    pub(crate) fn list(&mut self, ino: u64) -> Result<Vec<DirEntryInfo>, FsError> {
        Ok(Self::entries_sorted(self.dir(ino)?))
    }

    fn entries_sorted(d: &Dir) -> Vec<DirEntryInfo> {
        let mut out: Vec<DirEntryInfo> = d
            .entries()
            .map(|e| DirEntryInfo {
                name: e.name.clone(),
                ino: e.ino,
                file_type: file_type(e.kind),
            })
            .collect();
        out.sort_by(|a, b| a.name.cmp(&b.name));
        out
    }

    // ---- the directories' part of the running transaction ------------------------------------

    /// Directory blocks changed in the running transaction.
    pub(super) fn dirty_dir_blocks(&self) -> usize {
        self.dirs.values().map(|d| d.dirty.len()).sum::<usize>()
    }

    /// The block images of every directory block changed in the running transaction.
    pub(super) fn dir_images(&self) -> Result<Vec<(u64, Vec<u8>)>, FsError> {
        let mut images = Vec::new();
        for d in self.dirs.values() {
            for &i in &d.dirty {
                let b = &d.blocks[i];
                let img = dir::encode_block(&b.entries, self.bs, b.physical)
                    .ok_or_else(|| corrupt(format!("directory block {} overflowed", b.physical)))?;
                images.push((b.physical, img));
            }
        }
        Ok(images)
    }

    /// The running transaction was committed: no directory block is dirty any more.
    pub(super) fn dirs_committed(&mut self) {
        for d in self.dirs.values_mut() {
            d.dirty.clear();
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::{FileSystem, MkfsOptions, MountOptions};
    use kura_engine::backend::common::QueueOptions;
    use kura_engine::backend::mem::MemDevice;

    #[test]
    fn a_name_longer_than_the_limit_is_too_long_not_missing() {
        let fs = FileSystem::format(
            Box::new(MemDevice::new(8 << 20, QueueOptions::default())),
            MkfsOptions::default(),
            MountOptions::default(),
        )
        .expect("format");
        let long = vec![b'x'; crate::dir::MAX_NAME + 1];
        let e = fs.lookup(1, &long).expect_err("lookup of a 256-byte name");
        assert_eq!(e.errno(), libc::ENAMETOOLONG, "{e}");
        let e = fs
            .lookup(1, b"absent")
            .expect_err("lookup of a missing name");
        assert_eq!(e.errno(), libc::ENOENT, "{e}");
        let e = fs
            .write(&format!("/{}", "y".repeat(256)), b"")
            .expect_err("create");
        assert_eq!(e.errno(), libc::ENAMETOOLONG, "{e}");
        fs.write(&format!("/{}", "y".repeat(255)), b"ok")
            .expect("a 255-byte name");
    }

    #[test]
    fn a_setgid_directory_passes_on_its_group_and_the_bit_to_directories() {
        use crate::{FileType, NodeSpec};
        let fs = FileSystem::format(
            Box::new(MemDevice::new(8 << 20, QueueOptions::default())),
            MkfsOptions::default(),
            MountOptions::default(),
        )
        .expect("format");
        let owned = |t: FileType, mode: u16| NodeSpec {
            owner: Some((1000, 1000)),
            ..NodeSpec::new(t, mode)
        };
        let shared = fs
            .make_node(1, b"shared", &owned(FileType::Directory, 0o775))
            .expect("mkdir");
        fs.set_owner(shared.ino, Some(0), Some(123)).expect("chgrp");
        fs.set_attr(shared.ino, Some(0o2775), None)
            .expect("chmod g+s");
        let f = fs
            .make_node(shared.ino, b"f", &owned(FileType::File, 0o644))
            .expect("create");
        assert_eq!((f.owner, f.mode), (Some((1000, 123)), 0o644));
        let d = fs
            .make_node(shared.ino, b"d", &owned(FileType::Directory, 0o755))
            .expect("mkdir");
        assert_eq!((d.owner, d.mode), (Some((1000, 123)), 0o2755));
        // Without the bit the caller's group stays.
        let plain = fs
            .make_node(1, b"plain", &owned(FileType::File, 0o644))
            .expect("create");
        assert_eq!((plain.owner, plain.mode), (Some((1000, 1000)), 0o644));
    }
}
