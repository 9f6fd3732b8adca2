//! Directory blocks (format §6): packed records of (inode, record length, name length, kind,
//! name) tiling the block after its header, and the rules names must follow.

use crate::error::FormatError;
use crate::header::{read_u64, seal, verify, write_u64, BlockKind, HEADER_LEN};
use crate::inode::Kind;

/// Longest name in bytes.
pub const MAX_NAME: usize = 255;
const FIXED: usize = 12;

/// Why a name cannot be a directory entry.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NameError {
    #[error("empty name")]
    Empty,
    #[error("name of {0} bytes is longer than {MAX_NAME}")]
    TooLong(usize),
    #[error("name contains `/`")]
    Slash,
    #[error("name contains a NUL byte")]
    Nul,
    #[error("`.` and `..` are reserved")]
    Reserved,
}

/// Checks that `name` can be stored in a directory.
pub fn validate_name(name: &[u8]) -> Result<(), NameError> {
    match name {
        [] => Err(NameError::Empty),
        b"." | b".." => Err(NameError::Reserved),
        _ if name.len() > MAX_NAME => Err(NameError::TooLong(name.len())),
        _ if name.contains(&b'/') => Err(NameError::Slash),
        _ if name.contains(&0) => Err(NameError::Nul),
        _ => Ok(()),
    }
}

/// One name in a directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DirEntry {
    pub ino: u64,
    pub kind: Kind,
    pub name: Vec<u8>,
}

/// Bytes a record with a name of `name_len` bytes takes (8-byte aligned).
pub fn record_len(name_len: usize) -> usize {
    (FIXED + name_len).next_multiple_of(8)
}

/// Bytes of records one block holds.
pub fn capacity(block_size: usize) -> usize {
    block_size - HEADER_LEN
}

/// Encodes `entries` into a directory block stored at `number`; the last record absorbs the
/// free space. Fails (returns `None`) when they do not fit.
pub fn encode_block(entries: &[DirEntry], block_size: usize, number: u64) -> Option<Vec<u8>> {
    let used: usize = entries.iter().map(|e| record_len(e.name.len())).sum();
    if used > capacity(block_size) {
        return None;
    }
    let mut b = vec![0u8; block_size];
    let mut at = HEADER_LEN;
    for (i, e) in entries.iter().enumerate() {
        let len = if i + 1 == entries.len() {
            block_size - at
        } else {
            record_len(e.name.len())
        };
        write_u64(&mut b, at, e.ino);
        b[at + 8..at + 10].copy_from_slice(&(len as u16).to_le_bytes());
        b[at + 10] = e.name.len() as u8;
        b[at + 11] = e.kind.code() as u8;
        b[at + FIXED..at + FIXED + e.name.len()].copy_from_slice(&e.name);
        at += len;
    }
    if entries.is_empty() {
        // One free record covering the block.
        b[HEADER_LEN + 8..HEADER_LEN + 10]
            .copy_from_slice(&(capacity(block_size) as u16).to_le_bytes());
    }
    seal(&mut b, BlockKind::Directory, number);
    Some(b)
}

/// Decodes a directory block read from `number`, checking every record.
pub fn decode_block(b: &[u8], number: u64) -> Result<Vec<DirEntry>, FormatError> {
    verify(b, BlockKind::Directory, number)?;
    let bad = |at: usize, why: &str| {
        FormatError::BadSuperblock(format!("directory block {number}, offset {at}: {why}"))
    };
    let mut out = Vec::new();
    let mut at = HEADER_LEN;
    while at < b.len() {
        if at + FIXED > b.len() {
            return Err(bad(at, "record header runs past the block"));
        }
        let ino = read_u64(b, at);
        let len = u16::from_le_bytes([b[at + 8], b[at + 9]]) as usize;
        let name_len = b[at + 10] as usize;
        if len < 16 || !len.is_multiple_of(8) || at + len > b.len() {
            return Err(bad(at, &format!("record length {len} is invalid")));
        }
        if ino != 0 {
            if record_len(name_len) > len {
                return Err(bad(at, "name longer than its record"));
            }
            let name = b[at + FIXED..at + FIXED + name_len].to_vec();
            validate_name(&name).map_err(|e| bad(at, &e.to_string()))?;
            let kind = match Kind::from_code(u16::from(b[at + 11])) {
                Some(Kind::Free) | None => {
                    return Err(bad(at, &format!("unknown entry kind {}", b[at + 11])))
                }
                Some(k) => k,
            };
            out.push(DirEntry { ino, kind, name });
        }
        at += len;
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn names_follow_the_rules() {
        assert_eq!(validate_name(b"ok.txt"), Ok(()));
        assert_eq!(validate_name(b""), Err(NameError::Empty));
        assert_eq!(validate_name(b"a/b"), Err(NameError::Slash));
        assert_eq!(validate_name(b"a\0b"), Err(NameError::Nul));
        assert_eq!(validate_name(b".."), Err(NameError::Reserved));
        assert_eq!(validate_name(&[b'x'; 256]), Err(NameError::TooLong(256)));
        assert_eq!(validate_name(&[b'x'; 255]), Ok(()));
    }

    #[test]
    fn blocks_round_trip_and_refuse_overflow() {
        let entries: Vec<DirEntry> = (0..50)
            .map(|i| DirEntry {
                ino: 10 + i,
                kind: if i % 3 == 0 {
                    Kind::Directory
                } else {
                    Kind::File
                },
                name: format!("file-{i}").into_bytes(),
            })
            .collect();
        let b = encode_block(&entries, 4096, 9).unwrap();
        assert_eq!(decode_block(&b, 9).unwrap(), entries);
        assert_eq!(
            decode_block(&encode_block(&[], 4096, 9).unwrap(), 9).unwrap(),
            vec![]
        );
        let many: Vec<DirEntry> = (0..200)
            .map(|i| DirEntry {
                ino: i + 1,
                kind: Kind::File,
                name: vec![b'n'; 40],
            })
            .collect();
        assert!(encode_block(&many, 4096, 9).is_none());
    }

    proptest! {
        #[test]
        fn any_valid_entries_round_trip(names in proptest::collection::vec("[a-zA-Z0-9._-]{1,60}", 0..40)) {
            let entries: Vec<DirEntry> = names.iter().enumerate()
                .filter(|(_, n)| validate_name(n.as_bytes()).is_ok())
                .map(|(i, n)| DirEntry { ino: i as u64 + 2, kind: Kind::File, name: n.clone().into_bytes() })
                .collect();
            if let Some(b) = encode_block(&entries, 8192, 3) {
                prop_assert_eq!(decode_block(&b, 3).unwrap(), entries);
            }
        }

        #[test]
        fn decoding_arbitrary_sealed_bytes_never_panics(mut bytes in proptest::collection::vec(any::<u8>(), 4096..=4096)) {
            seal(&mut bytes, BlockKind::Directory, 1);
            let _ = decode_block(&bytes, 1);
        }
    }
}
