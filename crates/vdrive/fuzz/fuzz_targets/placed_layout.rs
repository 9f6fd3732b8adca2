//! Fuzzes the placed drive's metadata decoder: any bytes as the two header copies and two
//! table copies of a leg of any size give an error or a (header, table) whose every entry names
//! a chunk of the drive, at most once, and which encodes back to bytes that decode to the same.
#![no_main]

use kura_vdrive::placed::layout::{self, Entry};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if data.len() < 12 {
        return;
    }
    let leg_bytes = u64::from_le_bytes(data[..8].try_into().unwrap_or([0; 8])) % (1 << 40);
    let bs = [512u32, 4096][usize::from(data[8] & 1)];
    let rest = &data[9..];
    // Cut the rest in four at positions taken from its length.
    let q = rest.len() / 4;
    let (h0, rest2) = rest.split_at(q);
    let (h1, rest3) = rest2.split_at(q);
    let (t0, t1) = rest3.split_at(q);
    let Ok((h, entries)) = layout::pick([h0, h1], [t0, t1], leg_bytes, bs) else {
        return;
    };
    assert_eq!(entries.len() as u64, h.slots);
    let mut seen = std::collections::HashSet::new();
    for e in entries.iter().flatten() {
        assert!(u64::from(e.chunk) < h.chunks);
        assert!(seen.insert(e.chunk));
    }
    let table = layout::encode_table(&entries, h.table_bytes);
    let mut again = h.clone();
    again.table_crc = kura_engine::crc32c::crc32c(&table);
    let header = layout::encode_header(&again, u64::from(bs).max(4096));
    let (h2, e2) = layout::pick([&header, &[]], [&table, &[]], leg_bytes, bs).expect("re-decodes");
    assert_eq!(h2, again);
    assert_eq!(e2, entries);
    let _: Option<&Entry> = e2.first().and_then(Option::as_ref);
});
