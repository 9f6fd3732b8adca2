//! Fuzzes the receiving side: any byte stream, cut into frames as the server reads it (header
//! checked before the payload), through the session's rules. Every outcome is a step or a typed
//! error; nothing panics, no payload is read past the limits, and an open record never holds
//! more bytes than it declared.
#![no_main]

use kura_ingest::frame::{Frame, FrameHeader, Limits, HEADER_LEN};
use kura_ingest::session::Session;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&flags, mut rest)) = data.split_first() else {
        return;
    };
    let limits = Limits {
        max_frame: 1 + u32::from(flags) * 16,
        max_record: 1 << 16,
    };
    let mut session = Session::new(limits, flags & 1 == 1);
    while rest.len() >= HEADER_LEN {
        let mut hb = [0u8; HEADER_LEN];
        hb.copy_from_slice(&rest[..HEADER_LEN]);
        let Ok(h) = FrameHeader::parse(&hb, &limits) else {
            return;
        };
        assert!(h.len <= limits.max_frame.max(268));
        if session.admit(&h).is_err() {
            return;
        }
        let Some(payload) = rest.get(HEADER_LEN..HEADER_LEN + h.len as usize) else {
            return;
        };
        // The fuzzer cannot forge CRCs, so the payload is judged with or without its check.
        let _ = h.check(payload);
        let Ok(frame) = Frame::decode(&h, payload) else {
            return;
        };
        let outcome = match &frame {
            Frame::Data(d) => session.data(d.len() as u32).map(|_| ()),
            other => session.control(other).map(|_| ()),
        };
        if let Some(r) = session.open() {
            assert!(r.received <= r.size && r.size <= limits.max_record);
        }
        if outcome.is_err() {
            return;
        }
        rest = &rest[HEADER_LEN + h.len as usize..];
    }
});
