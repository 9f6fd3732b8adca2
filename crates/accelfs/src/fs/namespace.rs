//! Names: path resolution, create, mkdir, unlink, rmdir and rename on the in-memory metadata.
//! Every operation checks everything first and changes nothing when it fails.

use super::meta::{corrupt, Inner};
use crate::dir::{validate_name, DirEntry};
use crate::error::FsError;
use crate::inode::Kind;
use crate::layout::ROOT_INODE;

/// Deepest path accepted (format §9).
pub const MAX_DEPTH: usize = 256;

/// Splits a path into checked components (`.` dropped, `..` kept for the walker).
pub(crate) fn components(path: &str) -> Result<Vec<&[u8]>, FsError> {
    let mut out = Vec::new();
    for c in path.split('/') {
        match c {
            "" | "." => {}
            ".." => out.push(c.as_bytes()),
            _ => {
                validate_name(c.as_bytes()).map_err(|source| FsError::BadName {
                    path: path.to_string(),
                    source,
                })?;
                out.push(c.as_bytes());
            }
        }
    }
    if out.len() > MAX_DEPTH {
        return Err(FsError::Invalid(format!(
            "{path}: more than {MAX_DEPTH} path components"
        )));
    }
    if path.as_bytes().contains(&0) {
        return Err(FsError::BadName {
            path: path.replace('\0', "\\0"),
            source: crate::dir::NameError::Nul,
        });
    }
    Ok(out)
}

impl Inner {
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
}
