//! The snapshot drive's on-disk encoding: the superblock and the metadata blob (every version's
//! block map), with their checks. Pure functions on bytes, so the decoders can be fuzzed; every
//! byte is described in `docs/snapshot-format.md`.

use super::SnapshotError;
use kura_engine::crc32c::crc32c;

/// First eight bytes of a superblock.
pub const SB_MAGIC: &[u8; 8] = b"KURASNAP";
/// First eight bytes of a metadata blob.
pub const META_MAGIC: &[u8; 8] = b"KSNPMETA";
/// The on-disk format version this code writes and reads.
pub const FORMAT_VERSION: u32 = 1;
/// Bytes of a superblock that carry data (the rest of its block is zero).
pub const SB_BYTES: usize = 76;
/// Bytes of the blob header.
pub const META_HEADER: usize = 32;
/// Fixed bytes of one version record, before its name and entries.
pub const VERSION_FIXED: usize = 14;
/// Bytes of one map entry: virtual chunk and physical chunk.
pub const ENTRY_BYTES: usize = 8;
/// Longest version name.
pub const MAX_NAME: usize = 64;
/// The writable version every drive has: the live head.
pub const HEAD: &str = "head";
/// Largest chunk size accepted.
pub const MAX_CHUNK: u32 = 16 << 20;
/// Blocks before the metadata halves: superblock slots 0 and 1.
pub const SB_SLOTS: u64 = 2;

/// The superblock: where everything is, and which metadata blob is current.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Superblock {
    pub block_size: u32,
    pub chunk_bytes: u32,
    /// Bumped by every metadata commit; selects the slot and the metadata half (`generation % 2`).
    pub generation: u64,
    /// Size of every version, in blocks.
    pub virtual_blocks: u64,
    /// Blocks of each of the two metadata halves.
    pub meta_blocks: u64,
    /// First block of the data area (chunk 0).
    pub data_start: u64,
    pub data_chunks: u64,
    /// Length and CRC-32C of the current blob.
    pub blob_len: u32,
    pub blob_crc: u32,
}

impl Superblock {
    pub fn chunk_blocks(&self) -> u64 {
        u64::from(self.chunk_bytes / self.block_size)
    }

    pub fn virtual_chunks(&self) -> u64 {
        self.virtual_blocks.div_ceil(self.chunk_blocks())
    }

    /// The first block of metadata half `half` (0 or 1).
    pub fn meta_lba(&self, half: u64) -> u64 {
        SB_SLOTS + half * self.meta_blocks
    }

    /// The data area's first block for a given metadata size, aligned to the chunk.
    pub fn data_start_for(meta_blocks: u64, chunk_blocks: u64) -> u64 {
        (SB_SLOTS + 2 * meta_blocks).div_ceil(chunk_blocks) * chunk_blocks
    }

    /// Encodes into one block of `block_size` bytes.
    pub fn encode(&self) -> Vec<u8> {
        let mut b = vec![0u8; self.block_size as usize];
        b[..8].copy_from_slice(SB_MAGIC);
        b[8..12].copy_from_slice(&FORMAT_VERSION.to_le_bytes());
        b[12..16].copy_from_slice(&self.block_size.to_le_bytes());
        b[16..20].copy_from_slice(&self.chunk_bytes.to_le_bytes());
        b[24..32].copy_from_slice(&self.generation.to_le_bytes());
        b[32..40].copy_from_slice(&self.virtual_blocks.to_le_bytes());
        b[40..48].copy_from_slice(&self.meta_blocks.to_le_bytes());
        b[48..56].copy_from_slice(&self.data_start.to_le_bytes());
        b[56..64].copy_from_slice(&self.data_chunks.to_le_bytes());
        b[64..68].copy_from_slice(&self.blob_len.to_le_bytes());
        b[68..72].copy_from_slice(&self.blob_crc.to_le_bytes());
        let c = crc32c(&b[..72]);
        b[72..76].copy_from_slice(&c.to_le_bytes());
        b
    }

    /// Decodes a superblock slot of a child with `child_blocks` blocks of `block_size` bytes.
    /// `Ok(None)` when the slot does not start with the magic (never written, or zeroed).
    pub fn decode(
        b: &[u8],
        block_size: u32,
        child_blocks: u64,
    ) -> Result<Option<Superblock>, SnapshotError> {
        if b.len() < SB_BYTES || &b[..8] != SB_MAGIC {
            return Ok(None);
        }
        let bad = |what: String| SnapshotError::Corrupt { what };
        if crc32c(&b[..72]) != u32_at(b, 72) {
            return Err(bad("superblock checksum mismatch".into()));
        }
        let version = u32_at(b, 8);
        if version != FORMAT_VERSION {
            return Err(bad(format!(
                "superblock format version {version}, this build reads {FORMAT_VERSION}"
            )));
        }
        let sb = Superblock {
            block_size: u32_at(b, 12),
            chunk_bytes: u32_at(b, 16),
            generation: u64_at(b, 24),
            virtual_blocks: u64_at(b, 32),
            meta_blocks: u64_at(b, 40),
            data_start: u64_at(b, 48),
            data_chunks: u64_at(b, 56),
            blob_len: u32_at(b, 64),
            blob_crc: u32_at(b, 68),
        };
        if u32_at(b, 20) != 0 {
            return Err(bad("superblock reserved field is not zero".into()));
        }
        if sb.block_size != block_size {
            return Err(bad(format!(
                "formatted with {}-byte blocks, the device has {block_size}-byte blocks",
                sb.block_size
            )));
        }
        check_chunk(sb.chunk_bytes, block_size).map_err(bad)?;
        let chunk_blocks = sb.chunk_blocks();
        let expected_start = sb
            .meta_blocks
            .checked_mul(2)
            .and_then(|m| m.checked_add(SB_SLOTS + chunk_blocks))
            .map(|_| Superblock::data_start_for(sb.meta_blocks, chunk_blocks));
        if sb.meta_blocks == 0 || expected_start != Some(sb.data_start) {
            return Err(bad(format!(
                "data area starts at block {} but {} metadata blocks put it elsewhere",
                sb.data_start, sb.meta_blocks
            )));
        }
        let end = sb
            .data_chunks
            .checked_mul(chunk_blocks)
            .and_then(|d| d.checked_add(sb.data_start));
        if sb.data_chunks == 0
            || sb.data_chunks >= u64::from(u32::MAX)
            || end.is_none_or(|e| e > child_blocks)
        {
            return Err(bad(format!(
                "{} data chunks do not fit a device of {child_blocks} blocks",
                sb.data_chunks
            )));
        }
        if sb.virtual_blocks == 0 || sb.virtual_blocks.div_ceil(chunk_blocks) >= u64::from(u32::MAX)
        {
            return Err(bad(format!(
                "virtual size of {} blocks is out of range",
                sb.virtual_blocks
            )));
        }
        let room = sb.meta_blocks.saturating_mul(u64::from(block_size));
        if (sb.blob_len as usize) < META_HEADER || u64::from(sb.blob_len) > room {
            return Err(bad(format!(
                "metadata blob of {} bytes does not fit its {room}-byte area",
                sb.blob_len
            )));
        }
        Ok(Some(sb))
    }
}

/// Checks a chunk size against the block size; the message says what is wrong.
pub fn check_chunk(chunk_bytes: u32, block_size: u32) -> Result<(), String> {
    if chunk_bytes < block_size
        || chunk_bytes > MAX_CHUNK
        || !chunk_bytes.is_power_of_two()
        || !chunk_bytes.is_multiple_of(block_size)
    {
        return Err(format!(
            "chunk of {chunk_bytes} bytes must be a power of two from the block size ({block_size}) to {MAX_CHUNK}"
        ));
    }
    Ok(())
}

/// One version as stored: a name, whether it takes writes, and its map entries
/// `(virtual chunk, physical chunk)` in increasing virtual order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VersionRecord {
    pub id: u64,
    pub name: String,
    pub writable: bool,
    pub entries: Vec<(u32, u32)>,
}

/// The decoded metadata blob.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Meta {
    pub generation: u64,
    pub next_id: u64,
    pub versions: Vec<VersionRecord>,
}

/// Encoded size of one version record with `entries` map entries.
pub fn record_bytes(name: &str, entries: u64) -> u64 {
    (VERSION_FIXED + name.len()) as u64 + entries * ENTRY_BYTES as u64
}

/// Checks a version name: 1 to 64 bytes of letters, digits, `.`, `_` and `-`.
pub fn check_name(name: &str) -> Result<(), SnapshotError> {
    let why = if name.is_empty() || name.len() > MAX_NAME {
        Some(format!("must be 1 to {MAX_NAME} bytes long"))
    } else if !name
        .bytes()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'.' | b'_' | b'-'))
    {
        Some("may hold only letters, digits, `.`, `_` and `-`".to_string())
    } else {
        None
    };
    match why {
        Some(why) => Err(SnapshotError::BadName {
            name: name.to_string(),
            why,
        }),
        None => Ok(()),
    }
}

impl Meta {
    /// Encodes the blob (unpadded).
    pub fn encode(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(META_HEADER);
        b.extend_from_slice(META_MAGIC);
        b.extend_from_slice(&self.generation.to_le_bytes());
        b.extend_from_slice(&self.next_id.to_le_bytes());
        b.extend_from_slice(&(self.versions.len() as u32).to_le_bytes());
        b.extend_from_slice(&[0u8; 4]);
        for v in &self.versions {
            b.extend_from_slice(&v.id.to_le_bytes());
            b.push(u8::from(v.writable));
            b.push(v.name.len() as u8);
            b.extend_from_slice(v.name.as_bytes());
            b.extend_from_slice(&(v.entries.len() as u32).to_le_bytes());
            for &(vc, pc) in &v.entries {
                b.extend_from_slice(&vc.to_le_bytes());
                b.extend_from_slice(&pc.to_le_bytes());
            }
        }
        b
    }

    /// Decodes and checks a blob against its superblock: every map entry in range, names valid
    /// and unique, exactly one writable `head`, no physical chunk twice in one version.
    pub fn decode(b: &[u8], sb: &Superblock) -> Result<Meta, SnapshotError> {
        let bad = |what: String| SnapshotError::Corrupt { what };
        if b.len() < META_HEADER || &b[..8] != META_MAGIC {
            return Err(bad("metadata blob has no magic".into()));
        }
        let generation = u64_at(b, 8);
        if generation != sb.generation {
            return Err(bad(format!(
                "metadata blob is generation {generation}, its superblock says {}",
                sb.generation
            )));
        }
        let next_id = u64_at(b, 16);
        let count = u32_at(b, 24) as usize;
        if u32_at(b, 28) != 0 {
            return Err(bad("metadata reserved field is not zero".into()));
        }
        let (vchunks, pchunks) = (sb.virtual_chunks(), sb.data_chunks);
        let mut at = META_HEADER;
        let mut versions: Vec<VersionRecord> = Vec::new();
        let mut seen = vec![u64::MAX; pchunks as usize];
        for _ in 0..count {
            let fixed = b
                .get(at..at + 10)
                .ok_or_else(|| bad("metadata blob ends inside a version record".into()))?;
            let id = u64_at(fixed, 0);
            let flags = fixed[8];
            let name_len = fixed[9] as usize;
            at += 10;
            if flags > 1 {
                return Err(bad(format!("version {id} has unknown flags {flags:#x}")));
            }
            let name = b
                .get(at..at + name_len)
                .and_then(|n| std::str::from_utf8(n).ok())
                .ok_or_else(|| bad(format!("version {id} has an unreadable name")))?
                .to_string();
            at += name_len;
            check_name(&name).map_err(|e| bad(format!("version {id}: {e}")))?;
            if id >= next_id || versions.iter().any(|v| v.id == id || v.name == name) {
                return Err(bad(format!("version `{name}` (id {id}) is a duplicate")));
            }
            let n = b
                .get(at..at + 4)
                .map(|x| u32_at(x, 0) as usize)
                .ok_or_else(|| bad(format!("version `{name}`: blob ends before its map")))?;
            at += 4;
            let list = n
                .checked_mul(ENTRY_BYTES)
                .and_then(|len| b.get(at..at + len))
                .ok_or_else(|| bad(format!("version `{name}`: map of {n} entries is cut off")))?;
            at += n * ENTRY_BYTES;
            let mut entries = Vec::with_capacity(n);
            let mut last = None;
            for e in list.chunks_exact(ENTRY_BYTES) {
                let (vc, pc) = (u32_at(e, 0), u32_at(e, 4));
                if u64::from(vc) >= vchunks || u64::from(pc) >= pchunks {
                    return Err(bad(format!(
                        "version `{name}` maps chunk {vc} to {pc}, out of range ({vchunks} virtual, {pchunks} physical)"
                    )));
                }
                if last.is_some_and(|l| vc <= l) {
                    return Err(bad(format!("version `{name}`: map is not in order")));
                }
                if seen[pc as usize] == id {
                    return Err(bad(format!(
                        "version `{name}` maps physical chunk {pc} twice"
                    )));
                }
                seen[pc as usize] = id;
                last = Some(vc);
                entries.push((vc, pc));
            }
            versions.push(VersionRecord {
                id,
                name,
                writable: flags == 1,
                entries,
            });
        }
        if at != b.len() {
            return Err(bad(format!(
                "metadata blob has {} trailing bytes",
                b.len() - at
            )));
        }
        if !versions.iter().any(|v| v.name == HEAD && v.writable) {
            return Err(bad("metadata has no writable `head` version".into()));
        }
        Ok(Meta {
            generation,
            next_id,
            versions,
        })
    }
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    let mut x = [0u8; 4];
    x.copy_from_slice(&b[at..at + 4]);
    u32::from_le_bytes(x)
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    let mut x = [0u8; 8];
    x.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(x)
}
