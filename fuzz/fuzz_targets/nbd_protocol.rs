//! The NBD wire parsers (meta-context requests and structured reply chunks among them), the
//! server's handshake (structured replies and meta contexts too) and its request loop (block
//! status included), and the client's handshake, all on arbitrary bytes: refusals and closed
//! sessions are fine, panics are bugs.
#![no_main]

use kura_nbd::client::negotiate_client;
use kura_nbd::handshake::{negotiate, ExportInfo, HandshakeEnd};
use kura_nbd::protocol::{
    check_request, decode_block_status, decode_client_flags, decode_export_name_reply,
    decode_greeting, decode_meta_context, decode_option_header, decode_option_reply_header,
    decode_server_entry, tx_flags, BlockSizes, ChunkHeader, ExportLimits, Info, InfoRequest,
    MetaRequest, RequestHeader, SimpleReply, MAX_PAYLOAD, REQUEST_LEN,
};
use libfuzzer_sys::fuzz_target;
use std::io::{self, Read, Write};

/// A stream whose reads come from the fuzz input and whose writes are kept.
struct Duplex<'a> {
    input: &'a [u8],
    output: Vec<u8>,
}

impl Read for Duplex<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.input.read(buf)
    }
}

impl Write for Duplex<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.output.extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

fn exports() -> Vec<ExportInfo> {
    let info = |name: &str, size: u64, flags: u16| ExportInfo {
        name: name.into(),
        description: format!("{name} disk"),
        size,
        flags,
        block_sizes: BlockSizes::DEFAULT,
        block_status: true,
    };
    vec![
        info("disk", 1 << 30, tx_flags::HAS_FLAGS | tx_flags::SEND_FLUSH),
        info("ro", 4096, tx_flags::HAS_FLAGS | tx_flags::READ_ONLY),
    ]
}

fuzz_target!(|data: &[u8]| {
    // Every decoder on the raw bytes.
    let _ = decode_greeting(data);
    let _ = decode_client_flags(data, 3);
    let _ = decode_option_header(data);
    let _ = decode_option_reply_header(data);
    let _ = InfoRequest::decode(data);
    if let Ok(info) = Info::decode(data) {
        let _ = Info::decode(&info.encode());
    }
    let _ = decode_server_entry(data);
    let _ = decode_export_name_reply(data);
    let _ = SimpleReply::decode(data);
    if let Ok(m) = MetaRequest::decode(data) {
        assert_eq!(m.encode(), data);
    }
    let _ = ChunkHeader::decode(data);
    let _ = decode_block_status(data);
    let _ = decode_meta_context(data);
    let limits = ExportLimits {
        size: 1 << 30,
        read_only: data.first().is_some_and(|b| b & 1 == 1),
        max_payload: MAX_PAYLOAD,
        block_status: data.first().is_some_and(|b| b & 2 == 2),
    };
    if let Ok(h) = RequestHeader::decode(data) {
        assert_eq!(RequestHeader::decode(&h.encode()), Ok(h));
        let _ = check_request(&h, &limits);
    }

    // The server's side: handshake on the bytes, then the request loop on what is left.
    let exports = exports();
    let mut s = Duplex {
        input: data,
        output: Vec::new(),
    };
    if let Ok(HandshakeEnd::Transmission {
        export,
        block_status,
        ..
    }) = negotiate(&mut s, &exports)
    {
        let e = &exports[export];
        let limits = ExportLimits {
            size: e.size,
            read_only: e.flags & tx_flags::READ_ONLY != 0,
            max_payload: MAX_PAYLOAD,
            block_status,
        };
        let mut head = [0u8; REQUEST_LEN];
        while s.read_exact(&mut head).is_ok() {
            let Ok(h) = RequestHeader::decode(&head) else {
                break;
            };
            if matches!(check_request(&h, &limits), Err(r) if r.fatal) {
                break;
            }
            let skip = h.payload_len() as usize;
            if s.input.len() < skip {
                break;
            }
            s.input = &s.input[skip..];
        }
    }

    // The client's side: the bytes play the server.
    let mut s = Duplex {
        input: data,
        output: Vec::new(),
    };
    let _ = negotiate_client(&mut s, "disk");
});
