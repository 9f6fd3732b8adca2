//! Every kura-store decoder on untrusted bytes: superblock, log frame header and payload, ops,
//! manifest records, value pointer, and the four run page kinds. Each returns a value or a
//! `FormatError` — never a panic. The first 12 bytes choose the count and the page's place.
#![no_main]

use kura_store::format::frame::{decode_ops, FrameHeader, ValuePointer};
use kura_store::format::manifest::decode_records;
use kura_store::format::page::{decode_filter, decode_index, decode_leaf, Footer, PagePlace};
use kura_store::format::superblock::Superblock;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if data.len() < 12 {
        return;
    }
    let count = u32::from_le_bytes([data[0], data[1], data[2], data[3]]);
    let seg_seq = u64::from(u32::from_le_bytes([data[4], data[5], data[6], data[7]]));
    let page = u32::from_le_bytes([data[8], data[9], data[10], data[11]]);
    let bytes = &data[12..];
    let place = PagePlace { seg_seq, page };
    let _ = Superblock::decode(bytes);
    if let Ok(header) = FrameHeader::decode(bytes) {
        let _ = header.check_origin(seg_seq, u64::from(count));
        let _ = header.check_payload(bytes).map(|p| decode_ops(p, header.count));
    }
    let _ = decode_ops(bytes, count);
    let _ = decode_records(bytes, count);
    let _ = ValuePointer::decode(bytes);
    let _ = decode_leaf(bytes, place);
    let _ = decode_index(bytes, place);
    let _ = decode_filter(bytes, place);
    let _ = Footer::decode(bytes, place);
});
