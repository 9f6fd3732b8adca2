//! The byte source: chunking, gzip detection, counters, read errors passed on after the data
//! that preceded them, and tiny inputs, in both inline and read-ahead modes.

use kura_genome::source::{ByteSource, SourceOptions};
use std::io::{self, Read};

fn both(data: &[u8], chunk: usize) -> Vec<ByteSource> {
    let opts = SourceOptions { chunk, depth: 2 };
    vec![
        ByteSource::inline(io::Cursor::new(data.to_vec()), opts),
        ByteSource::read_ahead(io::Cursor::new(data.to_vec()), opts).expect("thread"),
    ]
}

#[test]
fn plain_bytes_pass_unchanged_and_are_counted() {
    let data: Vec<u8> = (0..100_000u32).map(|i| (i * 7 % 251) as u8).collect();
    for chunk in [1, 2, 999, 1 << 20] {
        for mut src in both(&data, chunk) {
            let stats = src.stats();
            let mut out = Vec::new();
            src.read_to_end(&mut out).expect("reads");
            assert_eq!(out, data);
            assert_eq!(stats.raw_bytes(), data.len() as u64);
            assert_eq!(stats.bytes(), data.len() as u64);
            assert_eq!(stats.is_gzip(), Some(false));
        }
    }
}

#[test]
fn tiny_inputs_including_a_lone_gzip_magic_byte() {
    for data in [&b""[..], b"\x1f", b"\x8b\x1f", b"x"] {
        for mut src in both(data, 4) {
            let mut out = Vec::new();
            src.read_to_end(&mut out).expect("reads");
            assert_eq!(out, data);
        }
    }
}

/// Yields `good` bytes, then fails.
struct FailsAfter {
    good: usize,
}

impl Read for FailsAfter {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if self.good == 0 {
            return Err(io::Error::other("device gone"));
        }
        let n = buf.len().min(self.good).min(3);
        buf[..n].fill(b'A');
        self.good -= n;
        Ok(n)
    }
}

#[test]
fn read_errors_arrive_after_the_data_before_them() {
    let opts = SourceOptions {
        chunk: 16,
        depth: 2,
    };
    let sources = [
        ByteSource::inline(FailsAfter { good: 40 }, opts),
        ByteSource::read_ahead(FailsAfter { good: 40 }, opts).expect("thread"),
    ];
    for mut src in sources {
        let mut got = 0;
        let mut buf = [0u8; 5];
        let err = loop {
            match src.read(&mut buf) {
                Ok(0) => panic!("an error must not look like the end of input"),
                Ok(n) => got += n,
                Err(e) => break e,
            }
        };
        assert_eq!(got, 40);
        assert_eq!(err.to_string(), "device gone");
        let again = src.read(&mut buf).expect_err("errors are sticky");
        assert_eq!(again.to_string(), "an earlier read from this source failed");
    }
}

#[test]
fn dropping_a_read_ahead_source_early_does_not_hang() {
    let data = vec![b'A'; 10 << 20];
    let mut src = ByteSource::read_ahead(
        io::Cursor::new(data),
        SourceOptions {
            chunk: 4096,
            depth: 1,
        },
    )
    .expect("thread");
    let mut buf = [0u8; 10];
    src.read_exact(&mut buf).expect("reads");
    drop(src);
}
