//! Manifest records (format section 5): the edits to the set of runs, the log start and the
//! value segments, carried in manifest frames.

use super::{narrow, FormatError, Reader, SegRef, MAX_KEY};

/// One manifest edit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ManifestRecord {
    /// The records after it in its frame restate the whole state.
    Checkpoint {
        next_lsn: u64,
    },
    AddRun(RunMeta),
    RemoveRun {
        run: SegRef,
    },
    LogStart {
        segment: SegRef,
        page: u32,
        lsn: u64,
    },
    /// A log segment before the log start that still holds referenced values.
    ValueSegment {
        segment: SegRef,
        live_bytes: u64,
    },
    FreeValueSegment {
        segment: SegRef,
    },
}

/// What the manifest knows of one run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunMeta {
    pub level: u8,
    pub run: SegRef,
    pub pages: u32,
    pub entries: u64,
    pub min_lsn: u64,
    pub max_lsn: u64,
    pub smallest: Vec<u8>,
    pub largest: Vec<u8>,
}

fn put_key(out: &mut Vec<u8>, key: &[u8]) -> Result<(), FormatError> {
    if key.len() > MAX_KEY {
        return Err(FormatError::TooLarge {
            what: "manifest key",
            need: key.len(),
            room: MAX_KEY,
        });
    }
    let len: u16 = narrow("manifest key", key.len(), MAX_KEY)?;
    out.extend_from_slice(&len.to_le_bytes());
    out.extend_from_slice(key);
    Ok(())
}

fn get_key(r: &mut Reader<'_>) -> Result<Vec<u8>, FormatError> {
    let len = r.u16()? as usize;
    if len > MAX_KEY {
        return Err(FormatError::BadField {
            what: "manifest key length",
            value: len as u64,
        });
    }
    Ok(r.bytes(len)?.to_vec())
}

impl ManifestRecord {
    /// Appends the record to a manifest payload.
    pub fn encode(&self, out: &mut Vec<u8>) -> Result<(), FormatError> {
        match self {
            ManifestRecord::Checkpoint { next_lsn } => {
                out.push(1);
                out.extend_from_slice(&next_lsn.to_le_bytes());
            }
            ManifestRecord::AddRun(m) => {
                out.push(2);
                out.push(m.level);
                m.run.put(out);
                out.extend_from_slice(&m.pages.to_le_bytes());
                out.extend_from_slice(&m.entries.to_le_bytes());
                out.extend_from_slice(&m.min_lsn.to_le_bytes());
                out.extend_from_slice(&m.max_lsn.to_le_bytes());
                put_key(out, &m.smallest)?;
                put_key(out, &m.largest)?;
            }
            ManifestRecord::RemoveRun { run } => {
                out.push(3);
                run.put(out);
            }
            ManifestRecord::LogStart { segment, page, lsn } => {
                out.push(4);
                segment.put(out);
                out.extend_from_slice(&page.to_le_bytes());
                out.extend_from_slice(&lsn.to_le_bytes());
            }
            ManifestRecord::ValueSegment {
                segment,
                live_bytes,
            } => {
                out.push(5);
                segment.put(out);
                out.extend_from_slice(&live_bytes.to_le_bytes());
            }
            ManifestRecord::FreeValueSegment { segment } => {
                out.push(6);
                segment.put(out);
            }
        }
        Ok(())
    }

    fn decode_one(r: &mut Reader<'_>) -> Result<ManifestRecord, FormatError> {
        Ok(match r.u8()? {
            1 => ManifestRecord::Checkpoint { next_lsn: r.u64()? },
            2 => {
                let meta = RunMeta {
                    level: r.u8()?,
                    run: SegRef::get(r)?,
                    pages: r.u32()?,
                    entries: r.u64()?,
                    min_lsn: r.u64()?,
                    max_lsn: r.u64()?,
                    smallest: get_key(r)?,
                    largest: get_key(r)?,
                };
                if meta.smallest > meta.largest || meta.min_lsn > meta.max_lsn {
                    return Err(FormatError::BadField {
                        what: "run key or LSN range",
                        value: meta.run.slot,
                    });
                }
                ManifestRecord::AddRun(meta)
            }
            3 => ManifestRecord::RemoveRun {
                run: SegRef::get(r)?,
            },
            4 => ManifestRecord::LogStart {
                segment: SegRef::get(r)?,
                page: r.u32()?,
                lsn: r.u64()?,
            },
            5 => ManifestRecord::ValueSegment {
                segment: SegRef::get(r)?,
                live_bytes: r.u64()?,
            },
            6 => ManifestRecord::FreeValueSegment {
                segment: SegRef::get(r)?,
            },
            tag => {
                return Err(FormatError::BadField {
                    what: "manifest record tag",
                    value: tag.into(),
                })
            }
        })
    }
}

/// Decodes the `count` records of a manifest payload, which must use every byte.
pub fn decode_records(payload: &[u8], count: u32) -> Result<Vec<ManifestRecord>, FormatError> {
    let mut r = Reader::new("manifest payload", payload);
    // Each record takes at least 9 bytes, so a damaged count cannot reserve more than that.
    let mut out = Vec::with_capacity((count as usize).min(payload.len() / 9));
    for _ in 0..count {
        out.push(ManifestRecord::decode_one(&mut r)?);
    }
    r.finish()?;
    Ok(out)
}
