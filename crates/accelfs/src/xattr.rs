//! Extended-attribute blocks (format §5): all of an inode's attributes in one sealed metadata
//! block, records of (name length, value length, name, value), and the rules names and sizes
//! follow (namespaces `user.`, `trusted.`, `security.`; the one-block cap).

use crate::error::FormatError;
use crate::header::{read_u32, seal, verify, write_u32, BlockKind, HEADER_LEN};

/// Longest attribute name in bytes (with its namespace prefix).
pub const MAX_NAME: usize = 255;
/// Longest single value in bytes (Linux's `XATTR_SIZE_MAX` is 64 KiB).
pub const MAX_VALUE: usize = 65535;
/// Header, count and bytes used.
const FIXED: usize = HEADER_LEN + 8;
/// Name length, a zero byte, value length.
const RECORD_FIXED: usize = 4;
/// Namespaces AccelFS stores.
pub const NAMESPACES: [&[u8]; 3] = [b"user.", b"trusted.", b"security."];

/// One attribute: full name (with namespace) and value.
pub type Xattr = (Vec<u8>, Vec<u8>);

/// Why a name or value cannot be stored.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum XattrError {
    #[error("attribute name of {0} bytes is longer than {MAX_NAME}")]
    NameTooLong(usize),
    #[error("attribute name is empty after its namespace, or contains a NUL byte")]
    BadName,
    #[error("attribute namespace not supported (only user., trusted. and security.)")]
    Namespace,
    #[error("attribute value of {0} bytes is longer than {MAX_VALUE}")]
    ValueTooLong(usize),
}

/// Checks that `name` can be stored.
pub fn validate_name(name: &[u8]) -> Result<(), XattrError> {
    if name.len() > MAX_NAME {
        return Err(XattrError::NameTooLong(name.len()));
    }
    let prefix = NAMESPACES
        .iter()
        .find(|p| name.starts_with(p))
        .ok_or(XattrError::Namespace)?;
    if name.len() == prefix.len() || name.contains(&0) {
        return Err(XattrError::BadName);
    }
    Ok(())
}

/// Bytes one record takes.
pub fn record_len(name: &[u8], value: &[u8]) -> usize {
    RECORD_FIXED + name.len() + value.len()
}

/// Bytes of records one block holds: the per-inode cap.
pub fn capacity(block_size: usize) -> usize {
    block_size - FIXED
}

/// Encodes `attrs` into a block stored at `number`; `None` when they do not fit.
pub fn encode_block(attrs: &[Xattr], block_size: usize, number: u64) -> Option<Vec<u8>> {
    let used: usize = attrs.iter().map(|(n, v)| record_len(n, v)).sum();
    if used > capacity(block_size) {
        return None;
    }
    let mut b = vec![0u8; block_size];
    write_u32(&mut b, HEADER_LEN, attrs.len() as u32);
    write_u32(&mut b, HEADER_LEN + 4, used as u32);
    let mut at = FIXED;
    for (n, v) in attrs {
        b[at] = n.len() as u8;
        b[at + 2..at + 4].copy_from_slice(&(v.len() as u16).to_le_bytes());
        at += RECORD_FIXED;
        b[at..at + n.len()].copy_from_slice(n);
        at += n.len();
        b[at..at + v.len()].copy_from_slice(v);
        at += v.len();
    }
    seal(&mut b, BlockKind::Xattrs, number);
    Some(b)
}

/// Decodes the attribute block read from `number`, checking every record.
pub fn decode_block(b: &[u8], number: u64) -> Result<Vec<Xattr>, FormatError> {
    verify(b, BlockKind::Xattrs, number)?;
    let bad =
        |why: String| FormatError::Corrupt(format!("extended-attribute block {number}: {why}"));
    if b.len() < FIXED {
        return Err(bad("shorter than its header".into()));
    }
    let count = read_u32(b, HEADER_LEN) as usize;
    let used = read_u32(b, HEADER_LEN + 4) as usize;
    if used > capacity(b.len()) {
        return Err(bad(format!("{used} bytes used, more than the block holds")));
    }
    let end = FIXED + used;
    let mut out: Vec<Xattr> = Vec::new();
    let mut at = FIXED;
    while at < end {
        if at + RECORD_FIXED > end {
            return Err(bad(format!("record at {at} runs past the bytes used")));
        }
        let name_len = b[at] as usize;
        let value_len = u16::from_le_bytes([b[at + 2], b[at + 3]]) as usize;
        if b[at + 1] != 0 || at + RECORD_FIXED + name_len + value_len > end {
            return Err(bad(format!("record at {at} is malformed")));
        }
        let name = b[at + RECORD_FIXED..at + RECORD_FIXED + name_len].to_vec();
        validate_name(&name).map_err(|e| bad(format!("record at {at}: {e}")))?;
        if out.iter().any(|(n, _)| *n == name) {
            return Err(bad(format!(
                "{:?} is listed twice",
                String::from_utf8_lossy(&name)
            )));
        }
        let v = at + RECORD_FIXED + name_len;
        out.push((name, b[v..v + value_len].to_vec()));
        at = v + value_len;
    }
    if out.len() != count {
        return Err(bad(format!(
            "says it holds {count} attributes but {} were found",
            out.len()
        )));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn names_follow_the_rules() {
        assert_eq!(validate_name(b"user.x"), Ok(()));
        assert_eq!(validate_name(b"security.selinux"), Ok(()));
        assert_eq!(validate_name(b"user."), Err(XattrError::BadName));
        assert_eq!(
            validate_name(b"system.posix_acl_access"),
            Err(XattrError::Namespace)
        );
        let long = [b"user.".as_slice(), &[b'n'; 251]].concat();
        assert_eq!(validate_name(&long), Err(XattrError::NameTooLong(256)));
    }

    #[test]
    fn blocks_round_trip_and_refuse_overflow() {
        let attrs: Vec<Xattr> = (0..20)
            .map(|i| (format!("user.a{i}").into_bytes(), vec![i as u8; i * 7]))
            .collect();
        let b = encode_block(&attrs, 4096, 77).unwrap();
        assert_eq!(decode_block(&b, 77).unwrap(), attrs);
        assert!(decode_block(&b, 78).is_err());
        let big = vec![(b"user.big".to_vec(), vec![1u8; 4096])];
        assert!(encode_block(&big, 4096, 77).is_none());
        let fits = vec![(b"user.big".to_vec(), vec![1u8; capacity(4096) - 12])];
        assert_eq!(
            decode_block(&encode_block(&fits, 4096, 5).unwrap(), 5).unwrap(),
            fits
        );
    }

    proptest! {
        #[test]
        fn decoding_arbitrary_sealed_bytes_never_panics(mut bytes in proptest::collection::vec(any::<u8>(), 4096..=4096)) {
            seal(&mut bytes, BlockKind::Xattrs, 1);
            let _ = decode_block(&bytes, 1);
        }
    }
}
