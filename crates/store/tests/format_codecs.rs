//! Every structure of docs/kvstore-format.md: encode then decode gives back what was encoded,
//! any single bit flipped in a checksummed structure is refused, and arbitrary bytes never make a
//! decoder panic.

use kura_store::format::frame::{
    decode_ops, encode_frame, encode_frame_into, FrameHeader, FrameKind, Op, ValuePointer,
    FRAME_HEADER,
};
use kura_store::format::manifest::{decode_records, ManifestRecord, RunMeta};
use kura_store::format::page::{
    bloom_add, bloom_hash, bloom_may_contain, decode_filter, decode_index, decode_leaf,
    encode_filter, encode_index, encode_leaf, index_child, leaf_find, Footer, IndexEntry,
    LeafEntry, LeafFind, LeafValue, PagePlace, FILTER_BYTES_PER_PAGE,
};
use kura_store::format::superblock::Superblock;
use kura_store::format::{FormatError, SegRef, MAX_KEY, PAGE_SIZE};
use proptest::collection::vec;
use proptest::prelude::*;

fn seg_ref() -> impl Strategy<Value = SegRef> {
    (any::<u64>(), any::<u64>()).prop_map(|(slot, seg_seq)| SegRef { slot, seg_seq })
}

fn key() -> impl Strategy<Value = Vec<u8>> {
    vec(any::<u8>(), 0..40)
}

fn superblock() -> impl Strategy<Value = Superblock> {
    (
        any::<u64>(),
        any::<[u8; 16]>(),
        20u32..=30,
        1u64..1 << 40,
        0u64..1 << 50,
        0u32..=1024,
        any::<u64>(),
        proptest::option::of(seg_ref()),
    )
        .prop_flat_map(
            |(generation, store_id, shift, slots, seq, inline, lsn, manifest)| {
                let pages = 1u32 << (shift - 12);
                (0..slots, 0..pages, 0..=seq).prop_map(move |(slot, page, start_seq)| Superblock {
                    generation,
                    store_id,
                    segment_shift: shift,
                    slot_count: slots,
                    seg_seq_limit: seq + 1,
                    log_start: SegRef {
                        slot,
                        seg_seq: start_seq,
                    },
                    log_start_page: page,
                    inline_threshold: inline,
                    log_start_lsn: lsn,
                    manifest_head: manifest
                        .map(|m| SegRef {
                            slot: m.slot % slots,
                            ..m
                        })
                        .unwrap_or(SegRef::NONE),
                })
            },
        )
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        (key(), vec(any::<u8>(), 0..300)).prop_map(|(key, value)| Op::Put { key, value }),
        key().prop_map(|key| Op::Delete { key }),
    ]
}

fn manifest_record() -> impl Strategy<Value = ManifestRecord> {
    prop_oneof![
        any::<u64>().prop_map(|next_lsn| ManifestRecord::Checkpoint { next_lsn }),
        (
            any::<u8>(),
            seg_ref(),
            any::<u32>(),
            any::<u64>(),
            any::<u64>(),
            any::<u64>(),
            key(),
            key()
        )
            .prop_map(
                |(level, run, pages, entries, a, b, k1, k2)| ManifestRecord::AddRun(RunMeta {
                    level,
                    run,
                    pages,
                    entries,
                    min_lsn: a.min(b),
                    max_lsn: a.max(b),
                    smallest: k1.clone().min(k2.clone()),
                    largest: k1.max(k2),
                })
            ),
        seg_ref().prop_map(|run| ManifestRecord::RemoveRun { run }),
        (seg_ref(), any::<u32>(), any::<u64>())
            .prop_map(|(segment, page, lsn)| ManifestRecord::LogStart { segment, page, lsn }),
        (seg_ref(), any::<u64>()).prop_map(|(segment, live_bytes)| ManifestRecord::ValueSegment {
            segment,
            live_bytes
        }),
        seg_ref().prop_map(|segment| ManifestRecord::FreeValueSegment { segment }),
    ]
}

fn pointer() -> impl Strategy<Value = ValuePointer> {
    (seg_ref(), any::<u32>(), any::<u32>(), any::<u32>()).prop_map(|(segment, offset, len, crc)| {
        ValuePointer {
            segment,
            offset,
            len,
            crc,
        }
    })
}

/// Sorted leaf entries (key ascending, LSN descending) that fit one page.
fn leaf_entries() -> impl Strategy<Value = Vec<LeafEntry>> {
    vec(
        (
            key(),
            1u64..1000,
            prop_oneof![
                vec(any::<u8>(), 0..128).prop_map(LeafValue::Inline),
                pointer().prop_map(LeafValue::Pointer),
                Just(LeafValue::Tombstone),
            ],
        ),
        0..60,
    )
    .prop_map(|raw| {
        let mut entries: Vec<LeafEntry> = raw
            .into_iter()
            .map(|(key, lsn, value)| LeafEntry { key, lsn, value })
            .collect();
        entries.sort_by(|a, b| a.key.cmp(&b.key).then(b.lsn.cmp(&a.lsn)));
        entries.dedup_by(|b, a| a.key == b.key && a.lsn == b.lsn);
        let mut room = kura_store::format::page::ENTRY_ROOM;
        entries.retain(|e| {
            let fits = e.page_bytes() <= room;
            if fits {
                room -= e.page_bytes();
            }
            fits
        });
        entries
    })
}

fn flip(data: &[u8], bit: usize) -> Vec<u8> {
    let mut out = data.to_vec();
    let bit = bit % (out.len() * 8);
    out[bit / 8] ^= 1 << (bit % 8);
    out
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    #[test]
    fn superblock_round_trips_and_refuses_any_flip(sb in superblock(), bit in any::<usize>()) {
        let page = sb.encode();
        prop_assert_eq!(Superblock::decode(&page), Ok(sb));
        prop_assert!(Superblock::decode(&flip(&page, bit)).is_err());
    }

    #[test]
    fn ops_frame_round_trips_and_refuses_any_flip(
        ops in vec(op(), 1..20), seg_seq in any::<u64>(), tag in any::<u64>(), lsn in 1u64..1 << 60, bit in any::<usize>()
    ) {
        let mut payload = Vec::new();
        for op in &ops {
            op.encode(&mut payload).expect("encodable");
        }
        prop_assert_eq!(payload.len(), ops.iter().map(Op::encoded_len).sum::<usize>());
        let frame = encode_frame(FrameKind::Ops, seg_seq, tag, lsn, ops.len() as u32, None, &payload).expect("frame");
        prop_assert_eq!(frame.len() % PAGE_SIZE, 0);
        let header = FrameHeader::decode(&frame).expect("header");
        prop_assert!(header.check_origin(seg_seq, tag).is_ok());
        prop_assert_eq!(header.first_lsn, lsn);
        prop_assert_eq!(header.pages() * PAGE_SIZE, frame.len());
        // Encoded into a reused buffer holding a longer frame's bytes: the same bytes.
        let mut reused = vec![0xa5u8; frame.len() + 3 * PAGE_SIZE + 17];
        encode_frame_into(FrameKind::Ops, seg_seq, tag, lsn, ops.len() as u32, None, &payload, &mut reused).expect("frame");
        prop_assert_eq!(&reused, &frame);
        let body = header.check_payload(&frame).expect("payload");
        prop_assert_eq!(decode_ops(body, header.count).expect("ops"), ops.clone());
        // A flip in the header or the payload is caught; the zero padding is not covered.
        let covered = (FRAME_HEADER + payload.len()) * 8;
        let damaged = flip(&frame, bit % covered);
        let whole = FrameHeader::decode(&damaged).and_then(|h| {
            h.check_origin(seg_seq, tag)?;
            let body = h.check_payload(&damaged)?;
            decode_ops(body, h.count)
        });
        prop_assert_ne!(whole, Ok(ops));
    }

    #[test]
    fn seal_frames_round_trip(seg_seq in any::<u64>(), tag in any::<u64>(), next in seg_ref()) {
        prop_assume!(next != SegRef::default());
        let frame = encode_frame(FrameKind::Seal, seg_seq, tag, 0, 0, Some(next), &[]).expect("seal");
        prop_assert_eq!(frame.len(), PAGE_SIZE);
        let header = FrameHeader::decode(&frame).expect("header");
        prop_assert_eq!((header.kind, header.next), (FrameKind::Seal, next));
    }

    #[test]
    fn frame_of_another_segment_or_store_is_refused(seg_seq in any::<u64>(), tag in any::<u64>(), other in any::<u64>()) {
        prop_assume!(other != seg_seq && other != tag);
        let frame = encode_frame(FrameKind::Ops, seg_seq, tag, 1, 1, None, &[2, 0, 0, 0, 0]).expect("frame");
        let header = FrameHeader::decode(&frame).expect("header");
        let wrong_segment = matches!(header.check_origin(other, tag), Err(FormatError::WrongSegment { .. }));
        prop_assert!(wrong_segment);
        let foreign = matches!(header.check_origin(seg_seq, other), Err(FormatError::ForeignStore { .. }));
        prop_assert!(foreign);
    }

    #[test]
    fn manifest_records_round_trip(records in vec(manifest_record(), 0..20)) {
        let mut payload = Vec::new();
        for r in &records {
            r.encode(&mut payload).expect("encodable");
        }
        prop_assert_eq!(decode_records(&payload, records.len() as u32), Ok(records));
    }

    #[test]
    fn value_pointer_round_trips(p in pointer()) {
        let mut b = Vec::new();
        p.encode(&mut b);
        prop_assert_eq!(b.len(), ValuePointer::ENCODED_LEN);
        prop_assert_eq!(ValuePointer::decode(&b), Ok(p));
    }

    #[test]
    fn leaf_page_round_trips_and_refuses_any_flip(entries in leaf_entries(), seg_seq in any::<u64>(), page in any::<u32>(), bit in any::<usize>()) {
        let place = PagePlace { seg_seq, page };
        let bytes = encode_leaf(place, &entries).expect("fits");
        prop_assert_eq!(decode_leaf(&bytes, place), Ok(entries));
        prop_assert!(decode_leaf(&flip(&bytes, bit), place).is_err());
        let (other_segment, other_page) = (PagePlace { seg_seq: seg_seq ^ 1, page }, PagePlace { seg_seq, page: page ^ 1 });
        prop_assert!(decode_leaf(&bytes, other_segment).is_err());
        prop_assert!(decode_leaf(&bytes, other_page).is_err());
    }

    #[test]
    fn index_page_round_trips_and_refuses_any_flip(keys in proptest::collection::btree_set(key(), 0..80), seg_seq in any::<u64>(), bit in any::<usize>()) {
        let entries: Vec<IndexEntry> = keys.into_iter().enumerate().map(|(i, key)| IndexEntry { key, child: i as u32 }).collect();
        let place = PagePlace { seg_seq, page: 7 };
        let bytes = encode_index(place, &entries).expect("fits");
        prop_assert_eq!(decode_index(&bytes, place), Ok(entries));
        prop_assert!(decode_index(&flip(&bytes, bit), place).is_err());
        // A leaf decoder refuses an index page (kind check).
        prop_assert!(decode_leaf(&bytes, place).is_err());
    }

    #[test]
    fn filter_and_bloom_round_trip(keys in proptest::collection::btree_set(key(), 1..300), k in 1u8..=10) {
        let m = (keys.len() * 10) as u32;
        let mut bits = vec![0u8; (m as usize).div_ceil(8)];
        for key in &keys {
            bloom_add(&mut bits, m, k, bloom_hash(key));
        }
        let mut pages = Vec::new();
        for (i, chunk) in bits.chunks(FILTER_BYTES_PER_PAGE).enumerate() {
            let place = PagePlace { seg_seq: 3, page: i as u32 };
            pages.push(encode_filter(place, chunk).expect("fits"));
        }
        let mut read = Vec::new();
        for (i, page) in pages.iter().enumerate() {
            read.extend_from_slice(decode_filter(page, PagePlace { seg_seq: 3, page: i as u32 }).expect("filter"));
        }
        for key in &keys {
            prop_assert!(bloom_may_contain(&read, m, k, bloom_hash(key)), "no false negatives");
        }
    }

    #[test]
    fn footer_round_trips(entries in any::<u64>(), leaves in 1u32..100, k in 1u8..=30, a in any::<u64>(), b in any::<u64>(), k1 in key(), k2 in key()) {
        let f = Footer {
            entries,
            leaf_pages: leaves,
            index_root: leaves,
            index_levels: 1,
            bloom_probes: k,
            filter_first: leaves + 1,
            filter_pages: 2,
            filter_bits: 1000,
            min_lsn: a.min(b),
            max_lsn: a.max(b),
            total_pages: leaves + 4,
            smallest: k1.clone().min(k2.clone()),
            largest: k1.max(k2),
        };
        let page = f.encode(9).expect("footer");
        prop_assert_eq!(Footer::decode(&page, PagePlace { seg_seq: 9, page: leaves + 3 }), Ok(f));
    }

    #[test]
    fn arbitrary_bytes_never_panic(data in vec(any::<u8>(), 0..2 * PAGE_SIZE), count in any::<u32>(), seg_seq in any::<u64>(), page in any::<u32>()) {
        let place = PagePlace { seg_seq, page };
        let _ = Superblock::decode(&data);
        let _ = FrameHeader::decode(&data).map(|h| h.check_payload(&data));
        let _ = decode_ops(&data, count);
        let _ = decode_records(&data, count);
        let _ = ValuePointer::decode(&data);
        let _ = decode_leaf(&data, place);
        let _ = decode_index(&data, place);
        let _ = leaf_find(&data, place, &data[..data.len().min(8)], u64::from(count));
        let _ = index_child(&data, place, &data[..data.len().min(8)]);
        let _ = decode_filter(&data, place);
        let _ = Footer::decode(&data, place);
    }

    /// Valid pages with fields rewritten and the CRC fixed up, so the decoders' field checks
    /// (not the CRC) are what meet the damage.
    #[test]
    fn rechecksummed_damage_never_panics(entries in leaf_entries(), at in 4usize..PAGE_SIZE, byte in any::<u8>()) {
        let place = PagePlace { seg_seq: 1, page: 0 };
        let mut bytes = encode_leaf(place, &entries).expect("fits");
        bytes[at] = byte;
        let crc = kura_engine::crc32c::crc32c_skipping(&bytes, 0);
        bytes[..4].copy_from_slice(&crc.to_le_bytes());
        let _ = decode_leaf(&bytes, place);
        let _ = decode_index(&bytes, place);
        for e in &entries {
            let _ = leaf_find(&bytes, place, &e.key, e.lsn);
            let _ = index_child(&bytes, place, &e.key);
        }
        let _ = Footer::decode(&bytes, place);
    }

    /// The searches that decode only what they touch answer what a search over the fully
    /// decoded page answers, for every key of the page, keys between them and every LSN.
    #[test]
    fn page_searches_match_the_decoded_page(entries in leaf_entries(), probes in vec((key(), 0u64..1001), 20)) {
        let place = PagePlace { seg_seq: 3, page: 9 };
        let leaf = encode_leaf(place, &entries).expect("fits");
        let children: Vec<IndexEntry> = entries
            .iter()
            .enumerate()
            .map(|(i, e)| IndexEntry { key: e.key.clone(), child: i as u32 })
            .collect();
        let index = encode_index(place, &children).expect("fits");
        let asked = entries.iter().map(|e| (e.key.clone(), e.lsn)).chain(probes);
        for (key, lsn) in asked {
            let start = entries.partition_point(|e| e.key < key);
            let rest = &entries[start..];
            let expected = match rest.iter().position(|e| e.key != key || e.lsn <= lsn) {
                Some(i) if rest[i].key == key => LeafFind::Found(rest[i].clone()),
                Some(_) => LeafFind::Absent,
                None => LeafFind::Continue,
            };
            prop_assert_eq!(leaf_find(&leaf, place, &key, lsn).expect("valid leaf"), expected);
            let child = children.get(children.partition_point(|c| c.key < key)).map(|c| c.child);
            prop_assert_eq!(index_child(&index, place, &key).expect("valid index"), child);
        }
    }
}

#[test]
fn oversized_keys_are_refused_by_every_encoder() {
    let long = vec![7u8; MAX_KEY + 1];
    let mut out = Vec::new();
    assert!(matches!(
        Op::Delete { key: long.clone() }.encode(&mut out),
        Err(FormatError::TooLarge { .. })
    ));
    let place = PagePlace {
        seg_seq: 0,
        page: 0,
    };
    let entry = LeafEntry {
        key: long.clone(),
        lsn: 1,
        value: LeafValue::Tombstone,
    };
    assert!(encode_leaf(place, &[entry]).is_err());
    assert!(encode_index(
        place,
        &[IndexEntry {
            key: long.clone(),
            child: 0
        }]
    )
    .is_err());
    let run = RunMeta {
        level: 0,
        run: SegRef::default(),
        pages: 1,
        entries: 1,
        min_lsn: 1,
        max_lsn: 1,
        smallest: Vec::new(),
        largest: long,
    };
    assert!(ManifestRecord::AddRun(run).encode(&mut out).is_err());
}

#[test]
fn a_page_that_does_not_fit_is_refused() {
    let entries: Vec<LeafEntry> = (0..10u8)
        .map(|i| LeafEntry {
            key: vec![i; 500],
            lsn: 1,
            value: LeafValue::Tombstone,
        })
        .collect();
    let refused = encode_leaf(
        PagePlace {
            seg_seq: 0,
            page: 0,
        },
        &entries,
    );
    assert!(
        matches!(refused, Err(FormatError::TooLarge { .. })),
        "{refused:?}"
    );
}

#[test]
fn newer_major_versions_are_refused() {
    let sb = Superblock {
        generation: 1,
        store_id: [1; 16],
        segment_shift: 23,
        slot_count: 4,
        seg_seq_limit: 10,
        log_start: SegRef {
            slot: 0,
            seg_seq: 0,
        },
        log_start_page: 0,
        inline_threshold: 128,
        log_start_lsn: 1,
        manifest_head: SegRef::NONE,
    };
    let mut page = sb.encode();
    page[12..14].copy_from_slice(&2u16.to_le_bytes());
    let crc = kura_engine::crc32c::crc32c_skipping(&page, 8);
    page[8..12].copy_from_slice(&crc.to_le_bytes());
    assert_eq!(
        Superblock::decode(&page),
        Err(FormatError::UnsupportedVersion {
            major: 2,
            minor: kura_store::format::superblock::MINOR
        })
    );
}
