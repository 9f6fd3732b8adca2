//! Names: directories (their blocks and a name index, loaded on first use, [`Dir`]), path
//! resolution, create, mkdir, unlink, rmdir, rename and listing. Every operation checks
//! everything first and changes nothing when it fails.
//!
//! Owns the `dirs` field of [`Mounted`]; directory blocks changed in the running transaction
//! are marked here and encoded by the journal concern at commit.

use super::{corrupt, Mounted};
use crate::dir::{self, validate_name, DirEntry};
use crate::error::FsError;
use crate::fs::path::components;
use crate::fs::{file_type, DirEntryInfo};
use crate::inode::Kind;
use crate::layout::ROOT_INODE;
use std::collections::{BTreeSet, HashMap};

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
        self.writable()?;
        let shown = String::from_utf8_lossy(name).into_owned();
        validate_name(name).map_err(|source| FsError::BadName {
            path: shown.clone(),
            source,
        })?;
        if self.lookup(parent, name)?.is_some() {
            return Err(FsError::Exists(shown));
        }
        self.make_transaction_room()?;
        // A directory needs an inode and a block; a file an inode; the parent maybe a block.
        let blocks_needed = if kind == Kind::Directory { 2 } else { 1 };
        if self.alloc.free_block_count() < blocks_needed + 1 {
            return Err(FsError::NoSpace(format!("cannot create {shown}")));
        }
        let ino = self.new_node(kind, mode, parent)?;
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
        match (e.kind, want_dir) {
            (Kind::Directory, false) => return Err(FsError::IsADirectory(shown)),
            (Kind::File, true) => return Err(FsError::NotADirectory(shown)),
            _ => {}
        }
        if e.kind == Kind::Directory && !self.dir(e.ino)?.is_empty() {
            return Err(FsError::NotEmpty(shown));
        }
        self.make_transaction_room()?;
        self.dir_remove(parent, name)?;
        self.free_node(e.ino)
    }

    /// Moves `parent/name` to `new_parent/new_name`, replacing a file or an empty directory
    /// there (as POSIX rename does).
    pub(crate) fn rename_entry(
        &mut self,
        parent: u64,
        name: &[u8],
        new_parent: u64,
        new_name: &[u8],
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
            // A directory may not move into its own subtree. The walk up from the new parent
            // follows on-disk parent fields, which a corrupt image can point in a cycle: each
            // directory is visited at most once, so the walk ends after at most as many steps
            // as there are directories on the path (and a cycle is reported, not followed).
            let mut at = new_parent;
            let mut seen = std::collections::HashSet::new();
            loop {
                if at == src.ino {
                    return Err(FsError::Invalid(format!(
                        "cannot move directory {shown} inside itself"
                    )));
                }
                if at == ROOT_INODE {
                    break;
                }
                if !seen.insert(at) {
                    return Err(corrupt(format!(
                        "directory inode {new_parent}: its chain of parent directories loops at inode {at} and never reaches the root"
                    )));
                }
                let n = self.node(at)?;
                if n.inode.kind != Kind::Directory {
                    return Err(corrupt(format!(
                        "directory inode {new_parent}: its chain of parents reaches inode {at}, which is not a directory"
                    )));
                }
                at = n.inode.parent;
            }
        }
        let target = self.lookup(new_parent, new_name)?;
        if let Some(t) = &target {
            if t.ino == src.ino {
                return Ok(());
            }
            match (src.kind, t.kind) {
                (Kind::Directory, Kind::File) => return Err(FsError::NotADirectory(shown_new)),
                (Kind::File, Kind::Directory) => return Err(FsError::IsADirectory(shown_new)),
                _ => {}
            }
            if t.kind == Kind::Directory && !self.dir(t.ino)?.is_empty() {
                return Err(FsError::NotEmpty(shown_new));
            }
        }
        self.make_transaction_room()?;
        if let Some(t) = target {
            self.dir_remove(new_parent, new_name)?;
            self.free_node(t.ino)?;
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
        node.inode.parent = new_parent;
        node.inode.ctime_ns = crate::mkfs::now_ns();
        self.touch(src.ino);
        Ok(())
    }

    /// Entries of directory `ino`, sorted by name.
    pub(crate) fn list(&mut self, ino: u64) -> Result<Vec<DirEntryInfo>, FsError> {
        let mut out: Vec<DirEntryInfo> = self
            .dir(ino)?
            .entries()
            .map(|e| DirEntryInfo {
                name: e.name.clone(),
                ino: e.ino,
                file_type: file_type(e.kind),
            })
            .collect();
        out.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(out)
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
