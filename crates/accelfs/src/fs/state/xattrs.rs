//! Extended attributes: each inode's attribute block (format §5, [`crate::xattr`]) loaded on
//! first use into its [`super::inodes::Node`], get/list/set/remove with the `setxattr` flag
//! semantics and the one-block cap, and the block images of the running transaction.
//!
//! Owns the `xattrs` and `xattrs_dirty` fields of a node. The attribute block is allocated by
//! the first attribute and freed with the last, at the time of the change, so a commit never
//! has to find space.

use super::{corrupt, Mounted};
use crate::error::FsError;
use crate::fs::XattrMode;
use crate::xattr::{self, Xattr, XattrError};

fn shown(name: &[u8]) -> String {
    String::from_utf8_lossy(name).into_owned()
}

fn name_error(name: &[u8], e: XattrError) -> FsError {
    match e {
        XattrError::NameTooLong(_) => FsError::AttributeNameTooLong(shown(name)),
        XattrError::ValueTooLong(_) => FsError::AttributeTooLarge(shown(name)),
        XattrError::Namespace => FsError::Unsupported(format!("{}: {e}", shown(name))),
        XattrError::BadName => FsError::Invalid(format!("{}: {e}", shown(name))),
    }
}

impl Mounted {
    /// The attributes of `ino`, read from its block on first use.
    fn xattrs(&mut self, ino: u64) -> Result<&mut Vec<Xattr>, FsError> {
        let node = self.live_node(ino)?;
        if node.xattrs.is_none() {
            let block = node.inode.xattr_block;
            let attrs = if block == 0 {
                Vec::new()
            } else {
                xattr::decode_block(&self.read_meta(block)?, block)?
            };
            self.live_node(ino)?.xattrs = Some(attrs);
        }
        self.live_node(ino)?
            .xattrs
            .as_mut()
            .ok_or_else(|| corrupt(format!("inode {ino}: attributes vanished")))
    }

    pub(crate) fn get_xattr(&mut self, ino: u64, name: &[u8]) -> Result<Vec<u8>, FsError> {
        if name.len() > xattr::MAX_NAME {
            return Err(FsError::AttributeNameTooLong(shown(name)));
        }
        self.xattrs(ino)?
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.clone())
            .ok_or_else(|| FsError::NoAttribute(shown(name)))
    }

    pub(crate) fn list_xattr(&mut self, ino: u64) -> Result<Vec<Vec<u8>>, FsError> {
        Ok(self.xattrs(ino)?.iter().map(|(n, _)| n.clone()).collect())
    }

    pub(crate) fn set_xattr(
        &mut self,
        ino: u64,
        name: &[u8],
        value: &[u8],
        mode: XattrMode,
    ) -> Result<(), FsError> {
        self.writable()?;
        self.need_posix("setxattr")?;
        xattr::validate_name(name).map_err(|e| name_error(name, e))?;
        if value.len() > xattr::MAX_VALUE {
            return Err(FsError::AttributeTooLarge(shown(name)));
        }
        self.make_transaction_room()?;
        let cap = xattr::capacity(self.bs);
        let attrs = self.xattrs(ino)?;
        let at = attrs.iter().position(|(n, _)| n == name);
        match (mode, at) {
            (XattrMode::Create, Some(_)) => return Err(FsError::Exists(shown(name))),
            (XattrMode::Replace, None) => return Err(FsError::NoAttribute(shown(name))),
            _ => {}
        }
        let used: usize = attrs
            .iter()
            .enumerate()
            .filter(|(i, _)| Some(*i) != at)
            .map(|(_, (n, v))| xattr::record_len(n, v))
            .sum();
        if used + xattr::record_len(name, value) > cap {
            return Err(FsError::NoSpace(format!(
                "{}: the attributes of an inode must fit in {cap} bytes",
                shown(name)
            )));
        }
        if self.live_node(ino)?.inode.xattr_block == 0 {
            let (b, _) = self
                .alloc
                .alloc_blocks(0, 1)
                .ok_or_else(|| FsError::NoSpace("no block left for extended attributes".into()))?;
            self.live_node(ino)?.inode.xattr_block = b;
        }
        let attrs = self.xattrs(ino)?;
        match at {
            Some(i) => attrs[i].1 = value.to_vec(),
            None => attrs.push((name.to_vec(), value.to_vec())),
        }
        self.xattrs_changed(ino)
    }

    pub(crate) fn remove_xattr(&mut self, ino: u64, name: &[u8]) -> Result<(), FsError> {
        self.writable()?;
        if name.len() > xattr::MAX_NAME {
            return Err(FsError::AttributeNameTooLong(shown(name)));
        }
        self.make_transaction_room()?;
        let attrs = self.xattrs(ino)?;
        let at = attrs
            .iter()
            .position(|(n, _)| n == name)
            .ok_or_else(|| FsError::NoAttribute(shown(name)))?;
        attrs.remove(at);
        if attrs.is_empty() {
            let node = self.live_node(ino)?;
            let b = std::mem::take(&mut node.inode.xattr_block);
            if b != 0 {
                self.alloc.free_blocks(b, 1);
            }
        }
        self.xattrs_changed(ino)
    }

    fn xattrs_changed(&mut self, ino: u64) -> Result<(), FsError> {
        let node = self.live_node(ino)?;
        node.xattrs_dirty = true;
        node.inode.ctime_ns = crate::mkfs::now_ns();
        self.touch(ino);
        Ok(())
    }

    /// The attribute block image of `ino` when its attributes changed in the running
    /// transaction (none when they were all removed: the block was freed).
    pub(super) fn xattr_image(&mut self, ino: u64) -> Result<Option<(u64, Vec<u8>)>, FsError> {
        let bs = self.bs;
        let node = self.node(ino)?;
        if !std::mem::take(&mut node.xattrs_dirty) {
            return Ok(None);
        }
        let block = node.inode.xattr_block;
        match &node.xattrs {
            Some(attrs) if block != 0 && !attrs.is_empty() => {
                let img = xattr::encode_block(attrs, bs, block).ok_or_else(|| {
                    corrupt(format!("inode {ino}: attributes outgrew their block"))
                })?;
                Ok(Some((block, img)))
            }
            _ => Ok(None),
        }
    }
}
