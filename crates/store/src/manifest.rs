//! The manifest (format sections 4 and 5): which runs make up the index and where the log
//! starts. Every frame this version writes is a checkpoint restating the whole state, each
//! written and flushed on its own, so the newest valid frame is the state; when a segment is
//! full (and at the first write after open) the next checkpoint goes to page 0 of a fresh
//! segment, the superblock is pointed at it, and the old segment is freed.

use crate::error::StoreError;
use crate::format::frame::{encode_frame, frame_pages, FrameHeader, FrameKind};
use crate::format::manifest::{decode_records, ManifestRecord, RunMeta};
use crate::format::{FormatError, SegRef};
use crate::log::{LogPos, LogStart};
use crate::space::Space;

/// The state the manifest records.
#[derive(Debug, Clone, Default)]
pub(crate) struct ManifestState {
    pub(crate) runs: Vec<RunMeta>,
    pub(crate) log_start: Option<LogStart>,
}

fn corrupt(place: String, source: FormatError) -> StoreError {
    StoreError::Corrupt { place, source }
}

/// Reads the manifest the superblock names: `None` for a store that never flushed. Claims the
/// manifest's segment and every run's segment in `space`.
pub(crate) fn read(space: &mut Space) -> Result<Option<ManifestState>, StoreError> {
    let sb = space.superblock().clone();
    let head = sb.manifest_head;
    if head == SegRef::NONE {
        return Ok(None);
    }
    if head.slot >= sb.slot_count {
        return Err(corrupt(
            "superblock".into(),
            FormatError::BadField {
                what: "manifest head slot",
                value: head.slot,
            },
        ));
    }
    let pps = sb.segment_pages();
    let mut state: Option<ManifestState> = None;
    let mut page = 0u32;
    while page < pps {
        let first = space.segs.read(head.slot, page, 1)?;
        let header = match FrameHeader::decode(&first).and_then(|h| {
            h.check_origin(head.seg_seq, sb.store_tag())?;
            Ok(h)
        }) {
            Ok(h) if h.kind == FrameKind::Manifest => h,
            Ok(_) | Err(_) if state.is_some() => break,
            Ok(h) => {
                return Err(corrupt(
                    format!("manifest segment {} page 0", head.slot),
                    FormatError::BadField {
                        what: "manifest frame kind",
                        value: h.kind as u64,
                    },
                ))
            }
            Err(e) => return Err(corrupt(format!("manifest segment {} page 0", head.slot), e)),
        };
        let pages = header.pages();
        if page as usize + pages > pps as usize {
            if state.is_some() {
                break;
            }
            return Err(corrupt(
                "manifest".into(),
                FormatError::TooLarge {
                    what: "manifest frame",
                    need: pages,
                    room: pps as usize,
                },
            ));
        }
        let frame = if pages == 1 {
            first
        } else {
            space.segs.read(head.slot, page, pages)?
        };
        let records = match header
            .check_payload(&frame)
            .and_then(|p| decode_records(p, header.count))
        {
            Ok(r) => r,
            Err(_) if state.is_some() => break,
            Err(e) => return Err(corrupt(format!("manifest segment {} page 0", head.slot), e)),
        };
        let mut next = state.clone().unwrap_or_default();
        if !matches!(records.first(), Some(ManifestRecord::Checkpoint { .. })) && state.is_none() {
            return Err(corrupt(
                "manifest".into(),
                FormatError::BadField {
                    what: "manifest without a checkpoint",
                    value: 0,
                },
            ));
        }
        for r in records {
            match r {
                ManifestRecord::Checkpoint { .. } => next = ManifestState::default(),
                ManifestRecord::AddRun(meta) => next.runs.push(meta),
                ManifestRecord::RemoveRun { run } => next.runs.retain(|m| m.run != run),
                ManifestRecord::LogStart { segment, page, lsn } => {
                    next.log_start = Some(LogStart {
                        pos: LogPos { seg: segment, page },
                        lsn,
                    })
                }
                // Value segments are not written by this version (values live in runs).
                ManifestRecord::ValueSegment { .. } | ManifestRecord::FreeValueSegment { .. } => {}
            }
        }
        state = Some(next);
        page += pages as u32;
    }
    let state = state.ok_or_else(|| {
        corrupt(
            "manifest".into(),
            FormatError::BadField {
                what: "manifest segment without frames",
                value: head.slot,
            },
        )
    })?;
    space.claim(head.slot);
    for m in &state.runs {
        if m.run.slot >= sb.slot_count || space.is_claimed(m.run.slot) || m.pages == 0 {
            return Err(corrupt(
                "manifest".into(),
                FormatError::BadField {
                    what: "run slot (outside the device, or named twice)",
                    value: m.run.slot,
                },
            ));
        }
        space.claim(m.run.slot);
    }
    Ok(Some(state))
}

/// Appends checkpoints to the manifest.
pub(crate) struct ManifestWriter {
    /// The segment and page the next checkpoint goes to; `None` after open, so the first
    /// checkpoint starts a fresh segment and nothing is appended after frames a crash may have
    /// left half-written.
    pos: Option<LogPos>,
    /// The segment the superblock names as the manifest head (read at open or written since),
    /// freed once a checkpoint in a fresh segment replaces it.
    head: Option<SegRef>,
    store_tag: u64,
    segment_pages: u32,
    written: u64,
}

impl ManifestWriter {
    pub(crate) fn new(head: Option<SegRef>, store_tag: u64, segment_pages: u32) -> Self {
        ManifestWriter {
            pos: None,
            head,
            store_tag,
            segment_pages,
            written: 0,
        }
    }

    pub(crate) fn written(&self) -> u64 {
        self.written
    }

    /// Writes a checkpoint of `runs` and `log_start` and makes it durable: the moment a flush
    /// or compaction takes effect.
    pub(crate) fn record(
        &mut self,
        space: &mut Space,
        next_lsn: u64,
        runs: &[RunMeta],
        log_start: LogStart,
    ) -> Result<(), StoreError> {
        let mut payload = Vec::new();
        let mut records = vec![ManifestRecord::Checkpoint { next_lsn }];
        records.extend(runs.iter().cloned().map(ManifestRecord::AddRun));
        records.push(ManifestRecord::LogStart {
            segment: log_start.pos.seg,
            page: log_start.pos.page,
            lsn: log_start.lsn,
        });
        for r in &records {
            r.encode(&mut payload).map_err(StoreError::Refused)?;
        }
        let pages = frame_pages(payload.len());
        if pages > self.segment_pages as usize {
            return Err(StoreError::Refused(FormatError::TooLarge {
                what: "manifest checkpoint",
                need: payload.len(),
                room: self.segment_pages as usize * crate::format::PAGE_SIZE,
            }));
        }
        let count = records.len() as u32;
        let (at, fresh) = match self.pos {
            Some(p) if p.page as usize + pages <= self.segment_pages as usize => (p, false),
            _ => (
                LogPos {
                    seg: space.allocate()?,
                    page: 0,
                },
                true,
            ),
        };
        let frame = encode_frame(
            FrameKind::Manifest,
            at.seg.seg_seq,
            self.store_tag,
            0,
            count,
            None,
            &payload,
        )
        .map_err(StoreError::Refused)?;
        let written = space
            .segs
            .write(at.seg.slot, at.page, &frame)
            .and_then(|()| space.segs.flush());
        if let Err(e) = written {
            if fresh {
                space.free(at.seg.slot);
            }
            return Err(e);
        }
        self.written += frame.len() as u64;
        if fresh {
            space.set_manifest_head(at.seg)?;
            if let Some(old) = self.head.replace(at.seg) {
                space.free(old.slot);
            }
        }
        self.pos = Some(LogPos {
            seg: at.seg,
            page: at.page + pages as u32,
        });
        Ok(())
    }
}
