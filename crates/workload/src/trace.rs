//! The workload trace: a compact binary file that hands one exact operation sequence to another
//! process (the RocksDB and LMDB peer, `crates/bench/peers/kv_replay.cc`), with [`TraceWriter`],
//! [`TraceReader`] and [`write_workload`]. Reading never panics: every malformed input is a
//! [`TraceError`].
//!
//! # Format, version 1
//! All integers little-endian.
//!
//! Header:
//!
//! | bytes | field | meaning |
//! |---|---|---|
//! | 8 | magic | `KURAWKLD` |
//! | 2 | version | `1` |
//! | 2 | flags | bit 0: sync every write (db_bench `fillsync`); other bits zero |
//! | 8 | seed | the value pool's seed |
//! | 4 | pool_len | the value pool's length in bytes (at most 128 MiB) |
//! | 8 | pool_check | the pool's last 8 bytes as a `u64`, to check a rebuilt pool |
//! | 1 | name_len | |
//! | name_len | name | the workload's name, UTF-8 |
//!
//! The value pool is not stored: it is the little-endian SplitMix64 stream from `seed`,
//! truncated to `pool_len` bytes (see [`ValuePool`]). Then records, each a one-byte code and
//! its operands (`klen`: one byte, 1..=31; `key`: `klen` bytes):
//!
//! | code | record | operands |
//! |---|---|---|
//! | `0x01` | insert | `klen key vlen:u32 voff:u32` |
//! | `0x02` | read | `klen key` |
//! | `0x03` | update | `klen key vlen:u32 voff:u32` |
//! | `0x04` | scan | `klen key count:u64` |
//! | `0x05` | read-modify-write | `klen key vlen:u32 voff:u32` |
//! | `0x06` | delete | `klen key` |
//! | `0x50` (`P`) | phase start | `nlen:u8 name` (UTF-8; `load`, `run`) |
//! | `0x45` (`E`) | end | `ops:u64`, the number of operation records |
//!
//! A write's value is pool bytes `[voff, voff + vlen)`, which must lie inside the pool. The end
//! record is mandatory (a file without it is truncated) and must be the last byte sequence.

use std::io::{self, BufWriter, Read, Write};

use crate::keys::{Key, Value, ValuePool, KEY_CAP, MAX_VALUE_LEN};
use crate::ops::{Op, Workload};

/// The file's first eight bytes.
pub const MAGIC: &[u8; 8] = b"KURAWKLD";

/// The format version this crate writes and reads.
pub const VERSION: u16 = 1;

/// Header flag: every write is synced.
pub const FLAG_SYNC: u16 = 1;

const CODE_INSERT: u8 = 0x01;
const CODE_READ: u8 = 0x02;
const CODE_UPDATE: u8 = 0x03;
const CODE_SCAN: u8 = 0x04;
const CODE_RMW: u8 = 0x05;
const CODE_DELETE: u8 = 0x06;
const CODE_PHASE: u8 = b'P';
const CODE_END: u8 = b'E';

/// A trace that cannot be written or read.
#[derive(Debug, thiserror::Error)]
pub enum TraceError {
    /// The underlying reader or writer failed.
    #[error("trace I/O: {0}")]
    Io(#[from] io::Error),
    /// The file does not start with [`MAGIC`].
    #[error("not a kura workload trace (bad magic)")]
    BadMagic,
    /// A version this crate does not read.
    #[error("unsupported trace version {0} (this build reads version {VERSION})")]
    UnsupportedVersion(u16),
    /// Flag bits this version does not define.
    #[error("unknown trace flags {0:#06x}")]
    UnknownFlags(u16),
    /// The header's pool length is over the limit.
    #[error("value pool of {0} bytes is over the limit")]
    PoolTooLarge(u32),
    /// The file ends inside a record or before the end record.
    #[error("trace truncated at byte {offset}")]
    Truncated {
        /// Where the missing bytes would start.
        offset: u64,
    },
    /// A record code this version does not define.
    #[error("unknown record code {code:#04x} at byte {offset}")]
    UnknownRecord {
        /// The code read.
        code: u8,
        /// Where the record starts.
        offset: u64,
    },
    /// A key length outside `1..=31`.
    #[error("bad key length {len} at byte {offset}")]
    BadKeyLength {
        /// The length read.
        len: u8,
        /// Where the record starts.
        offset: u64,
    },
    /// A value that does not lie inside the pool.
    #[error("value [{value_offset}, +{len}) outside the {pool_len}-byte pool at byte {offset}")]
    ValueOutOfPool {
        /// Its offset in the pool.
        value_offset: u32,
        /// Its length.
        len: u32,
        /// The pool's length.
        pool_len: u32,
        /// Where the record starts.
        offset: u64,
    },
    /// A workload or phase name that is not UTF-8 (reading) or longer than 255 bytes (writing).
    #[error("bad name at byte {offset}: not UTF-8 or longer than 255 bytes")]
    BadName {
        /// Where the name starts (0 when writing).
        offset: u64,
    },
    /// The end record's operation count disagrees with the records read.
    #[error("end record declares {declared} operations, the trace holds {seen}")]
    CountMismatch {
        /// What the end record says.
        declared: u64,
        /// What was read.
        seen: u64,
    },
    /// Bytes after the end record.
    #[error("bytes after the end record at byte {offset}")]
    TrailingBytes {
        /// Where they start.
        offset: u64,
    },
    /// A rebuilt value pool whose check word differs from the header's.
    #[error(
        "rebuilt value pool does not match the trace (check {got:#x}, expected {expected:#x})"
    )]
    PoolMismatch {
        /// The header's check word.
        expected: u64,
        /// The rebuilt pool's.
        got: u64,
    },
}

/// What a trace says about its workload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TraceHeader {
    /// The workload's name.
    pub name: String,
    /// Whether every write is synced.
    pub sync: bool,
    /// The value pool's seed.
    pub seed: u64,
    /// The value pool's length.
    pub pool_len: u32,
    /// The value pool's check word ([`ValuePool::check_word`]).
    pub pool_check: u64,
}

impl TraceHeader {
    /// The header for `workload`.
    pub fn for_workload(workload: &Workload) -> Self {
        let pool = workload.values();
        TraceHeader {
            name: workload.name().to_string(),
            sync: workload.sync(),
            seed: pool.seed(),
            pool_len: pool.len() as u32,
            pool_check: pool.check_word(),
        }
    }

    /// Rebuilds the value pool the trace's values refer to, checking it against the header.
    pub fn values(&self) -> Result<ValuePool, TraceError> {
        let pool = ValuePool::new(self.seed, self.pool_len as usize);
        let got = pool.check_word();
        if got != self.pool_check {
            return Err(TraceError::PoolMismatch {
                expected: self.pool_check,
                got,
            });
        }
        Ok(pool)
    }
}

/// One record of a trace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TraceRecord {
    /// The operations that follow belong to this phase (`load`, `run`).
    Phase(String),
    /// One operation.
    Op(Op),
}

/// Writes a trace: [`TraceWriter::new`] writes the header, then [`TraceWriter::phase`] and
/// [`TraceWriter::op`] append records, and [`TraceWriter::finish`] the end record. Give it a
/// buffered writer.
#[derive(Debug)]
pub struct TraceWriter<W: Write> {
    w: W,
    ops: u64,
}

impl<W: Write> TraceWriter<W> {
    /// Writes `header` to `w`.
    pub fn new(mut w: W, header: &TraceHeader) -> Result<Self, TraceError> {
        let name = short_name(&header.name)?;
        let mut buf = Vec::with_capacity(33 + name.len());
        buf.extend_from_slice(MAGIC);
        buf.extend_from_slice(&VERSION.to_le_bytes());
        let flags = if header.sync { FLAG_SYNC } else { 0 };
        buf.extend_from_slice(&flags.to_le_bytes());
        buf.extend_from_slice(&header.seed.to_le_bytes());
        buf.extend_from_slice(&header.pool_len.to_le_bytes());
        buf.extend_from_slice(&header.pool_check.to_le_bytes());
        buf.push(name.len() as u8);
        buf.extend_from_slice(name);
        w.write_all(&buf)?;
        Ok(TraceWriter { w, ops: 0 })
    }

    /// Starts phase `name` (at most 255 bytes).
    pub fn phase(&mut self, name: &str) -> Result<(), TraceError> {
        let name = short_name(name)?;
        self.w.write_all(&[CODE_PHASE, name.len() as u8])?;
        self.w.write_all(name)?;
        Ok(())
    }

    /// Appends one operation.
    pub fn op(&mut self, op: &Op) -> Result<(), TraceError> {
        let mut buf = [0u8; 2 + KEY_CAP + 8];
        let key = op.key().as_bytes();
        let code = match op {
            Op::Insert { .. } => CODE_INSERT,
            Op::Read { .. } => CODE_READ,
            Op::Update { .. } => CODE_UPDATE,
            Op::Scan { .. } => CODE_SCAN,
            Op::ReadModifyWrite { .. } => CODE_RMW,
            Op::Delete { .. } => CODE_DELETE,
        };
        buf[0] = code;
        buf[1] = key.len() as u8;
        buf[2..2 + key.len()].copy_from_slice(key);
        let mut n = 2 + key.len();
        match op {
            Op::Insert { value, .. }
            | Op::Update { value, .. }
            | Op::ReadModifyWrite { value, .. } => {
                buf[n..n + 4].copy_from_slice(&value.len.to_le_bytes());
                buf[n + 4..n + 8].copy_from_slice(&value.offset.to_le_bytes());
                n += 8;
            }
            Op::Scan { count, .. } => {
                buf[n..n + 8].copy_from_slice(&count.to_le_bytes());
                n += 8;
            }
            Op::Read { .. } | Op::Delete { .. } => {}
        }
        self.w.write_all(&buf[..n])?;
        self.ops += 1;
        Ok(())
    }

    /// Operations written so far.
    pub fn ops(&self) -> u64 {
        self.ops
    }

    /// Writes the end record, flushes, and returns the writer.
    pub fn finish(mut self) -> Result<W, TraceError> {
        self.w.write_all(&[CODE_END])?;
        self.w.write_all(&self.ops.to_le_bytes())?;
        self.w.flush()?;
        Ok(self.w)
    }
}

fn short_name(name: &str) -> Result<&[u8], TraceError> {
    if name.len() > usize::from(u8::MAX) {
        return Err(TraceError::BadName { offset: 0 });
    }
    Ok(name.as_bytes())
}

/// Writes `workload` as a trace to `w` (buffered internally): the header, phase `load` with
/// the load operations (when there are any), phase `run` with the run operations, and the end
/// record. Returns the number of operations written.
pub fn write_workload<W: Write>(w: W, workload: &Workload) -> Result<u64, TraceError> {
    let mut tw = TraceWriter::new(
        BufWriter::with_capacity(1 << 16, w),
        &TraceHeader::for_workload(workload),
    )?;
    if workload.load_len() > 0 {
        tw.phase("load")?;
        for op in workload.load() {
            tw.op(&op)?;
        }
    }
    tw.phase("run")?;
    for op in workload.run() {
        tw.op(&op)?;
    }
    let ops = tw.ops();
    let bw = tw.finish()?;
    bw.into_inner()
        .map_err(|e| TraceError::Io(e.into_error()))?;
    Ok(ops)
}

/// Reads a trace: the header on [`TraceReader::new`], then records by
/// [`TraceReader::next_record`] or iteration. Give it a buffered reader.
#[derive(Debug)]
pub struct TraceReader<R: Read> {
    r: R,
    header: TraceHeader,
    offset: u64,
    ops: u64,
    done: bool,
}

impl<R: Read> TraceReader<R> {
    /// Reads and checks the header.
    pub fn new(r: R) -> Result<Self, TraceError> {
        let mut reader = TraceReader {
            r,
            header: TraceHeader {
                name: String::new(),
                sync: false,
                seed: 0,
                pool_len: 0,
                pool_check: 0,
            },
            offset: 0,
            ops: 0,
            done: false,
        };
        let mut fixed = [0u8; 33];
        reader.read_exact(&mut fixed)?;
        if &fixed[..8] != MAGIC {
            return Err(TraceError::BadMagic);
        }
        let version = u16::from_le_bytes([fixed[8], fixed[9]]);
        if version != VERSION {
            return Err(TraceError::UnsupportedVersion(version));
        }
        let flags = u16::from_le_bytes([fixed[10], fixed[11]]);
        if flags & !FLAG_SYNC != 0 {
            return Err(TraceError::UnknownFlags(flags));
        }
        let pool_len = u32::from_le_bytes([fixed[20], fixed[21], fixed[22], fixed[23]]);
        if pool_len as usize > ValuePool::len_for(MAX_VALUE_LEN) {
            return Err(TraceError::PoolTooLarge(pool_len));
        }
        let mut seed = [0u8; 8];
        seed.copy_from_slice(&fixed[12..20]);
        let mut check = [0u8; 8];
        check.copy_from_slice(&fixed[24..32]);
        let name = reader.read_name(fixed[32])?;
        reader.header = TraceHeader {
            name,
            sync: flags & FLAG_SYNC != 0,
            seed: u64::from_le_bytes(seed),
            pool_len,
            pool_check: u64::from_le_bytes(check),
        };
        Ok(reader)
    }

    /// The header.
    pub fn header(&self) -> &TraceHeader {
        &self.header
    }

    /// Operations read so far.
    pub fn ops(&self) -> u64 {
        self.ops
    }

    fn read_exact(&mut self, buf: &mut [u8]) -> Result<(), TraceError> {
        match self.r.read_exact(buf) {
            Ok(()) => {
                self.offset += buf.len() as u64;
                Ok(())
            }
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => Err(TraceError::Truncated {
                offset: self.offset,
            }),
            Err(e) => Err(TraceError::Io(e)),
        }
    }

    fn read_u8(&mut self) -> Result<u8, TraceError> {
        let mut b = [0u8; 1];
        self.read_exact(&mut b)?;
        Ok(b[0])
    }

    fn read_u32(&mut self) -> Result<u32, TraceError> {
        let mut b = [0u8; 4];
        self.read_exact(&mut b)?;
        Ok(u32::from_le_bytes(b))
    }

    fn read_u64(&mut self) -> Result<u64, TraceError> {
        let mut b = [0u8; 8];
        self.read_exact(&mut b)?;
        Ok(u64::from_le_bytes(b))
    }

    fn read_name(&mut self, len: u8) -> Result<String, TraceError> {
        let offset = self.offset;
        let mut buf = vec![0u8; usize::from(len)];
        self.read_exact(&mut buf)?;
        String::from_utf8(buf).map_err(|_| TraceError::BadName { offset })
    }

    fn read_key(&mut self, record: u64) -> Result<Key, TraceError> {
        let len = self.read_u8()?;
        let mut buf = [0u8; KEY_CAP];
        if len == 0 || usize::from(len) > KEY_CAP {
            return Err(TraceError::BadKeyLength {
                len,
                offset: record,
            });
        }
        self.read_exact(&mut buf[..usize::from(len)])?;
        Key::new(&buf[..usize::from(len)]).ok_or(TraceError::BadKeyLength {
            len,
            offset: record,
        })
    }

    fn read_value(&mut self, record: u64) -> Result<Value, TraceError> {
        let len = self.read_u32()?;
        let value_offset = self.read_u32()?;
        let pool_len = self.header.pool_len;
        if u64::from(value_offset) + u64::from(len) > u64::from(pool_len) {
            return Err(TraceError::ValueOutOfPool {
                value_offset,
                len,
                pool_len,
                offset: record,
            });
        }
        Ok(Value {
            offset: value_offset,
            len,
        })
    }

    /// The next record; `None` after the end record (which is checked, as is the absence of
    /// anything after it).
    pub fn next_record(&mut self) -> Result<Option<TraceRecord>, TraceError> {
        if self.done {
            return Ok(None);
        }
        let record = self.offset;
        let result = self.parse_record(record);
        if !matches!(result, Ok(Some(_))) {
            self.done = true;
        }
        result
    }

    fn parse_record(&mut self, record: u64) -> Result<Option<TraceRecord>, TraceError> {
        let code = self.read_u8()?;
        let op = match code {
            CODE_INSERT => {
                let key = self.read_key(record)?;
                Op::Insert {
                    key,
                    value: self.read_value(record)?,
                }
            }
            CODE_READ => Op::Read {
                key: self.read_key(record)?,
            },
            CODE_UPDATE => {
                let key = self.read_key(record)?;
                Op::Update {
                    key,
                    value: self.read_value(record)?,
                }
            }
            CODE_SCAN => {
                let start = self.read_key(record)?;
                Op::Scan {
                    start,
                    count: self.read_u64()?,
                }
            }
            CODE_RMW => {
                let key = self.read_key(record)?;
                Op::ReadModifyWrite {
                    key,
                    value: self.read_value(record)?,
                }
            }
            CODE_DELETE => Op::Delete {
                key: self.read_key(record)?,
            },
            CODE_PHASE => {
                let len = self.read_u8()?;
                return Ok(Some(TraceRecord::Phase(self.read_name(len)?)));
            }
            CODE_END => {
                let declared = self.read_u64()?;
                if declared != self.ops {
                    return Err(TraceError::CountMismatch {
                        declared,
                        seen: self.ops,
                    });
                }
                let mut extra = [0u8; 1];
                return match self.r.read(&mut extra) {
                    Ok(0) => Ok(None),
                    Ok(_) => Err(TraceError::TrailingBytes {
                        offset: self.offset,
                    }),
                    Err(e) => Err(TraceError::Io(e)),
                };
            }
            other => {
                return Err(TraceError::UnknownRecord {
                    code: other,
                    offset: record,
                })
            }
        };
        self.ops += 1;
        Ok(Some(TraceRecord::Op(op)))
    }
}

impl<R: Read> Iterator for TraceReader<R> {
    type Item = Result<TraceRecord, TraceError>;

    fn next(&mut self) -> Option<Self::Item> {
        self.next_record().transpose()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{db_bench, ycsb};
    use proptest::prelude::*;

    fn trace_of(w: &Workload) -> Vec<u8> {
        let mut buf = Vec::new();
        write_workload(&mut buf, w).expect("write");
        buf
    }

    fn read_all(bytes: &[u8]) -> Result<(TraceHeader, Vec<TraceRecord>), TraceError> {
        let mut r = TraceReader::new(bytes)?;
        let records = r.by_ref().collect::<Result<Vec<_>, _>>()?;
        Ok((r.header().clone(), records))
    }

    #[test]
    fn round_trips_every_workload() {
        let mut workloads: Vec<Workload> = crate::YCSB_WORKLOADS
            .iter()
            .map(|&k| ycsb(k, 200, 500, 100, 3).expect("w"))
            .collect();
        for name in crate::DB_BENCH_WORKLOADS {
            workloads.push(db_bench(name, 100, 300, 4).expect("w"));
        }
        for w in &workloads {
            let bytes = trace_of(w);
            let (header, records) = read_all(&bytes).expect("read");
            assert_eq!(header, TraceHeader::for_workload(w));
            let pool = header.values().expect("pool");
            assert_eq!(pool.as_bytes(), w.values().as_bytes());
            let mut expect = Vec::new();
            if w.load_len() > 0 {
                expect.push(TraceRecord::Phase("load".into()));
                expect.extend(w.load().map(TraceRecord::Op));
            }
            expect.push(TraceRecord::Phase("run".into()));
            expect.extend(w.run().map(TraceRecord::Op));
            assert_eq!(records, expect, "{}", w.name());
        }
    }

    #[test]
    fn trace_is_compact() {
        // A YCSB-A read is 1 + 1 + 23 bytes, an update 8 more.
        let w = ycsb('A', 1000, 10_000, 1000, 1).expect("w");
        let bytes = trace_of(&w);
        assert!(bytes.len() < 11_000 * 34, "{}", bytes.len());
    }

    #[test]
    fn malformed_traces_are_typed_errors() {
        let w = db_bench("fillsync", 10, 100, 1).expect("w");
        let good = trace_of(&w);
        assert!(read_all(&good).expect("good").0.sync);

        let mut bad = good.clone();
        bad[0] = b'X';
        assert!(matches!(read_all(&bad), Err(TraceError::BadMagic)));

        let mut bad = good.clone();
        bad[8] = 9;
        assert!(matches!(
            read_all(&bad),
            Err(TraceError::UnsupportedVersion(9))
        ));

        let mut bad = good.clone();
        bad[10] = 0x82;
        assert!(matches!(read_all(&bad), Err(TraceError::UnknownFlags(_))));

        for cut in [0, 5, 33, 40, good.len() - 1] {
            assert!(
                matches!(read_all(&good[..cut]), Err(TraceError::Truncated { .. })),
                "cut at {cut}"
            );
        }

        let mut bad = good.clone();
        bad.push(0);
        assert!(matches!(
            read_all(&bad),
            Err(TraceError::TrailingBytes { .. })
        ));

        // The first record after the header is the `run` phase; the op after it starts at
        // header + 5.
        let header_len = 33 + w.name().len();
        let first_op = header_len + 5;
        let mut bad = good.clone();
        bad[first_op] = 0x77;
        assert!(matches!(
            read_all(&bad),
            Err(TraceError::UnknownRecord { code: 0x77, .. })
        ));
        let mut bad = good.clone();
        bad[first_op + 1] = 0;
        assert!(matches!(
            read_all(&bad),
            Err(TraceError::BadKeyLength { len: 0, .. })
        ));
        let mut bad = good.clone();
        bad[first_op + 1] = 200;
        assert!(matches!(
            read_all(&bad),
            Err(TraceError::BadKeyLength { len: 200, .. })
        ));
        // Value length (after the 16-byte db_bench key) pushed beyond the pool.
        let mut bad = good.clone();
        let vlen = first_op + 2 + 16;
        bad[vlen..vlen + 4].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(matches!(
            read_all(&bad),
            Err(TraceError::ValueOutOfPool { .. })
        ));
        // End count off by one.
        let mut bad = good.clone();
        let n = bad.len();
        bad[n - 8] ^= 1;
        assert!(matches!(
            read_all(&bad),
            Err(TraceError::CountMismatch { .. })
        ));
        // A phase name that is not UTF-8.
        let mut bad = good.clone();
        bad[header_len + 2] = 0xff;
        assert!(matches!(read_all(&bad), Err(TraceError::BadName { .. })));
        // A pool that does not match its check word.
        let mut header = TraceHeader::for_workload(&w);
        header.pool_check ^= 1;
        assert!(matches!(
            header.values(),
            Err(TraceError::PoolMismatch { .. })
        ));
        let mut header = TraceHeader::for_workload(&w);
        header.name = "x".repeat(300);
        assert!(TraceWriter::new(Vec::new(), &header).is_err());
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

        #[test]
        fn random_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..300)) {
            let _ = read_all(&bytes);
        }

        #[test]
        fn valid_header_then_random_bytes_never_panic(
            tail in proptest::collection::vec(any::<u8>(), 0..300),
        ) {
            let w = db_bench("fillseq", 1, 8, 1).expect("w");
            let mut bytes = Vec::new();
            TraceWriter::new(&mut bytes, &TraceHeader::for_workload(&w)).expect("header");
            bytes.extend_from_slice(&tail);
            let _ = read_all(&bytes);
        }

        #[test]
        fn mutated_traces_never_panic(
            flips in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..8),
        ) {
            let w = ycsb('E', 20, 20, 16, 1).expect("w");
            let mut bytes = trace_of(&w);
            for (at, byte) in flips {
                let i = at.index(bytes.len());
                bytes[i] = byte;
            }
            let _ = read_all(&bytes);
        }
    }
}
