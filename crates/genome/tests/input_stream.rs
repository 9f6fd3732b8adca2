//! A large FASTQ stream parsed through the read-ahead source with bounded memory: the process's
//! peak RSS must grow far less than the stream's size. Alone in its own test binary so no other
//! test's allocations blur the measurement. Size: `KURA_STREAM_TEST_MB` (default 64).

use kura_genome::fastq::FastqReader;
use kura_genome::source::{ByteSource, SourceOptions};
use std::io::{self, Read};

/// Generates FASTQ records on the fly (150 bp reads) until `left` bytes have been produced,
/// cutting the final record at a record boundary.
struct Generator {
    record: Vec<u8>,
    pos: usize,
    left: usize,
}

impl Read for Generator {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let mut n = 0;
        while n < buf.len() && (self.left > 0 || self.pos != 0) {
            let take = (self.record.len() - self.pos).min(buf.len() - n);
            buf[n..n + take].copy_from_slice(&self.record[self.pos..self.pos + take]);
            n += take;
            self.left = self.left.saturating_sub(take);
            self.pos = (self.pos + take) % self.record.len();
        }
        Ok(n)
    }
}

fn peak_rss_kib() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

#[test]
fn large_stream_bounded_memory() {
    let mb: usize = std::env::var("KURA_STREAM_TEST_MB")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(64);
    let mut record = b"@read/1\n".to_vec();
    record.extend((0..150).map(|i| b"ACGT"[i % 4]));
    record.extend_from_slice(b"\n+\n");
    record.extend(std::iter::repeat_n(b'I', 150));
    record.push(b'\n');
    let per = record.len();
    let gen = Generator {
        record,
        pos: 0,
        left: mb << 20,
    };
    let Some(before) = peak_rss_kib() else {
        return kura_testkit::skip(
            "large_stream_bounded_memory",
            "proc-vmhwm",
            "no VmHWM in /proc/self/status on this system",
        );
    };
    let opts = SourceOptions {
        chunk: 1 << 20,
        depth: 2,
    };
    let src = ByteSource::read_ahead(gen, opts).expect("thread");
    let stats = src.stats();
    let mut reader = FastqReader::new(src, "gen.fq");
    let mut batch = Vec::new();
    let mut reads = 0;
    let mut bases = 0;
    loop {
        let n = reader.next_batch(&mut batch, 1 << 20).expect("parses");
        if n == 0 {
            break;
        }
        reads += n;
        bases += batch.iter().map(|r| r.seq.len()).sum::<usize>();
    }
    let after = peak_rss_kib().expect("VmHWM readable");
    let grew_mib = (after.saturating_sub(before)) / 1024;
    eprintln!(
        "{mb} MiB streamed: {reads} reads, peak RSS grew {grew_mib} MiB, I/O wait {:?}",
        stats.wait()
    );
    assert_eq!(stats.bytes(), (reads * per) as u64);
    assert_eq!(bases, reads * 150);
    assert!(reads * per >= mb << 20);
    assert!(
        grew_mib < 24,
        "peak RSS grew {grew_mib} MiB while streaming {mb} MiB"
    );
}
