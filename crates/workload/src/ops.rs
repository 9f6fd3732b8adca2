//! Operations and the workloads that generate them.
//!
//! An [`Op`] is one request to a key-value store; it is `Copy`, holds its key inline and names
//! its value as a window of the workload's [`ValuePool`], so a stream of 10^9 operations
//! allocates nothing per operation. A [`Workload`] is a recipe, not a list: [`Workload::load`]
//! and [`Workload::run`] each return a fresh [`Ops`] iterator that regenerates the same sequence
//! from the seed every time.
//!
//! # db_bench workloads ([`db_bench`])
//! Keys are [`KeyStyle::DbBench`] (16 digits) over `0..num`; every write is `value_len` bytes.
//!
//! | name | load phase | run phase |
//! |---|---|---|
//! | `fillseq` | — | `num` inserts, keys in order |
//! | `fillrandom` | — | `num` inserts, keys uniform in `0..num` (repeats overwrite) |
//! | `fillsync` | — | as `fillrandom`, and [`Workload::sync`] is true: every write synced |
//! | `overwrite` | `fillseq` | `num` updates, keys uniform |
//! | `readrandom` | `fillseq` | `num` reads, keys uniform |
//! | `readseq` | `fillseq` | one [`Op::Scan`] from the first key over all `num` entries |
//! | `deleteseq` | `fillseq` | `num` deletes, keys in order |
//! | `deleterandom` | `fillseq` | `num` deletes, keys uniform |
//!
//! LevelDB's `db_bench` runs `fillsync` with `num / 1000` operations; pass a smaller `num` to
//! match. `readseq` is a single operation: count its `count` entries for throughput.
//!
//! # YCSB core workloads ([`ycsb`], [`YcsbSpec`])
//! Following YCSB's `CoreWorkload` and its `workloads/workload[a-f]` files:
//!
//! | | read | update | insert | scan | read-modify-write | request distribution |
//! |---|---|---|---|---|---|---|
//! | A | 0.50 | 0.50 | | | | zipfian |
//! | B | 0.95 | 0.05 | | | | zipfian |
//! | C | 1.00 | | | | | zipfian |
//! | D | 0.95 | | 0.05 | | | latest |
//! | E | | | 0.05 | 0.95 | | zipfian; scan length uniform in `1..=100` |
//! | F | 0.50 | | | | 0.50 | zipfian |
//!
//! - **Load phase**: `record_count` inserts of records `0..record_count` in order; with hashed
//!   inserts (the default) their keys are the [`fnv64`](crate::keys::fnv64) hashes, so the load
//!   writes all over the key space.
//! - **Run phase**: `operation_count` operations; each picks its kind from the proportions (the
//!   order YCSB's discrete generator uses: read, update, insert, scan, read-modify-write).
//!   Inserts take the next record number (`record_count`, `record_count + 1`, …). Other
//!   operations choose a record by the request distribution — `zipfian` is YCSB's scrambled
//!   zipfian over `record_count + 2 × operation_count × insert_proportion` records, `uniform` is
//!   over the loaded records, `latest` skews toward the newest insert — and, as YCSB does, draw
//!   again while the choice is a record not yet inserted.
//! - **Values**: a record is one value of `value_len` bytes (YCSB's default record is
//!   `fieldcount` 10 × `fieldlength` 100 = [`YCSB_DEFAULT_VALUE_LEN`] bytes, stored by most
//!   key-value bindings as one serialized value). Updates and read-modify-writes rewrite the
//!   whole value (YCSB `writeallfields=true`; its default rewrites one field of ten).
//! - Defaults as in the workload files: 1000 records and 1000 operations
//!   ([`YcsbSpec::core`]); the maximum scan length is 100 for E and YCSB's default 1000 for the
//!   others (which do not scan unless their proportions are changed).

use crate::dist::{ScrambledZipfian, SkewedLatest, Uniform};
use crate::keys::{Key, KeyStyle, Value, ValueChooser, ValuePool, MAX_VALUE_LEN};
use crate::rng::Rng;
use crate::Error;

/// YCSB's default record size: 10 fields of 100 bytes.
pub const YCSB_DEFAULT_VALUE_LEN: usize = 1000;

/// The db_bench workloads [`db_bench`] knows, in db_bench's usual order.
pub const DB_BENCH_WORKLOADS: &[&str] = &[
    "fillseq",
    "fillrandom",
    "fillsync",
    "overwrite",
    "readrandom",
    "readseq",
    "deleteseq",
    "deleterandom",
];

/// The YCSB core workloads [`ycsb`] knows.
pub const YCSB_WORKLOADS: &[char] = &['A', 'B', 'C', 'D', 'E', 'F'];

const LOAD_SALT: u64 = 0x4c4f_4144_0000_0001;
const RUN_SALT: u64 = 0x5255_4e00_0000_0002;

/// What an [`Op`] does, without its operands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum OpKind {
    /// Write a new record.
    Insert,
    /// Read one record.
    Read,
    /// Overwrite an existing record.
    Update,
    /// Read `count` records in key order from a start key.
    Scan,
    /// Read a record, then overwrite it.
    ReadModifyWrite,
    /// Delete one record.
    Delete,
}

impl OpKind {
    /// Every kind, in declaration order.
    pub const ALL: [OpKind; 6] = [
        OpKind::Insert,
        OpKind::Read,
        OpKind::Update,
        OpKind::Scan,
        OpKind::ReadModifyWrite,
        OpKind::Delete,
    ];

    /// A short lower-case name: `insert`, `read`, `update`, `scan`, `rmw`, `delete` (the names
    /// the peer script reports under `by_op`).
    pub fn name(self) -> &'static str {
        match self {
            OpKind::Insert => "insert",
            OpKind::Read => "read",
            OpKind::Update => "update",
            OpKind::Scan => "scan",
            OpKind::ReadModifyWrite => "rmw",
            OpKind::Delete => "delete",
        }
    }
}

/// One request to a key-value store. `Copy`, 48 bytes; value bytes live in the workload's
/// [`ValuePool`] (see [`Op::value`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Op {
    /// Put a new record.
    Insert {
        /// The record's key.
        key: Key,
        /// Its value.
        value: Value,
    },
    /// Get one record.
    Read {
        /// The record's key.
        key: Key,
    },
    /// Put over an existing record.
    Update {
        /// The record's key.
        key: Key,
        /// Its new value.
        value: Value,
    },
    /// Read up to `count` records in key order, starting at the first key `>= start`.
    Scan {
        /// Where the scan starts.
        start: Key,
        /// How many records to read.
        count: u64,
    },
    /// Get a record, then put a new value for it.
    ReadModifyWrite {
        /// The record's key.
        key: Key,
        /// Its new value.
        value: Value,
    },
    /// Delete one record.
    Delete {
        /// The record's key.
        key: Key,
    },
}

impl Op {
    /// What the operation does.
    pub fn kind(&self) -> OpKind {
        match self {
            Op::Insert { .. } => OpKind::Insert,
            Op::Read { .. } => OpKind::Read,
            Op::Update { .. } => OpKind::Update,
            Op::Scan { .. } => OpKind::Scan,
            Op::ReadModifyWrite { .. } => OpKind::ReadModifyWrite,
            Op::Delete { .. } => OpKind::Delete,
        }
    }

    /// The key the operation touches (a scan's start key).
    pub fn key(&self) -> &Key {
        match self {
            Op::Insert { key, .. }
            | Op::Read { key }
            | Op::Update { key, .. }
            | Op::ReadModifyWrite { key, .. }
            | Op::Delete { key } => key,
            Op::Scan { start, .. } => start,
        }
    }

    /// The value it writes, for inserts, updates and read-modify-writes.
    pub fn value_ref(&self) -> Option<Value> {
        match self {
            Op::Insert { value, .. }
            | Op::Update { value, .. }
            | Op::ReadModifyWrite { value, .. } => Some(*value),
            Op::Read { .. } | Op::Scan { .. } | Op::Delete { .. } => None,
        }
    }

    /// The length of the value it writes, if it writes one.
    pub fn value_len(&self) -> Option<usize> {
        self.value_ref().map(|v| v.len())
    }

    /// The bytes it writes, borrowed from `pool` (no copy); `None` when it writes nothing or the
    /// value lies outside `pool`.
    pub fn value<'p>(&self, pool: &'p ValuePool) -> Option<&'p [u8]> {
        pool.get(self.value_ref()?)
    }

    /// Replaces `buf`'s contents with the bytes it writes; returns false (and leaves `buf`
    /// empty) when it writes nothing.
    pub fn value_into(&self, pool: &ValuePool, buf: &mut Vec<u8>) -> bool {
        buf.clear();
        match self.value(pool) {
            Some(bytes) => {
                buf.extend_from_slice(bytes);
                true
            }
            None => false,
        }
    }

    /// True for operations that change the store.
    pub fn is_write(&self) -> bool {
        !matches!(self, Op::Read { .. } | Op::Scan { .. })
    }
}

/// Which record a YCSB operation other than insert touches (`requestdistribution`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RequestDistribution {
    /// Uniform over the loaded records.
    Uniform,
    /// YCSB's scrambled zipfian (θ = 0.99).
    Zipfian,
    /// Skewed toward the most recent insert.
    Latest,
}

/// A YCSB workload's parameters; [`YcsbSpec::core`] gives a core workload's, fields may then
/// be changed before [`YcsbSpec::build`].
#[derive(Debug, Clone, PartialEq)]
pub struct YcsbSpec {
    /// The workload's name (`ycsb-a` …).
    pub name: String,
    /// Records inserted by the load phase (`recordcount`), at least 1.
    pub record_count: u64,
    /// Operations in the run phase (`operationcount`).
    pub operation_count: u64,
    /// Bytes per record value (see the module documentation).
    pub value_len: usize,
    /// The seed every choice derives from.
    pub seed: u64,
    /// `readproportion`.
    pub read_proportion: f64,
    /// `updateproportion`.
    pub update_proportion: f64,
    /// `insertproportion`.
    pub insert_proportion: f64,
    /// `scanproportion`.
    pub scan_proportion: f64,
    /// `readmodifywriteproportion`.
    pub read_modify_write_proportion: f64,
    /// `requestdistribution`.
    pub request_distribution: RequestDistribution,
    /// `maxscanlength`: scan lengths are uniform in `1..=max_scan_length`.
    pub max_scan_length: u64,
    /// `insertorder=hashed` (true, YCSB's default) or `ordered`.
    pub hashed_inserts: bool,
}

impl YcsbSpec {
    /// Core workload `kind` (`A`–`F`, either case) with the defaults of its workload file:
    /// 1000 records, 1000 operations, [`YCSB_DEFAULT_VALUE_LEN`]-byte values, seed 0.
    pub fn core(kind: char) -> Result<Self, Error> {
        let kind = kind.to_ascii_uppercase();
        // (read, update, insert, scan, read-modify-write, distribution)
        let (r, u, i, s, rmw, dist) = match kind {
            'A' => (0.5, 0.5, 0.0, 0.0, 0.0, RequestDistribution::Zipfian),
            'B' => (0.95, 0.05, 0.0, 0.0, 0.0, RequestDistribution::Zipfian),
            'C' => (1.0, 0.0, 0.0, 0.0, 0.0, RequestDistribution::Zipfian),
            'D' => (0.95, 0.0, 0.05, 0.0, 0.0, RequestDistribution::Latest),
            'E' => (0.0, 0.0, 0.05, 0.95, 0.0, RequestDistribution::Zipfian),
            'F' => (0.5, 0.0, 0.0, 0.0, 0.5, RequestDistribution::Zipfian),
            other => return Err(Error::UnknownYcsb(other)),
        };
        Ok(YcsbSpec {
            name: format!("ycsb-{}", kind.to_ascii_lowercase()),
            record_count: 1000,
            operation_count: 1000,
            value_len: YCSB_DEFAULT_VALUE_LEN,
            seed: 0,
            read_proportion: r,
            update_proportion: u,
            insert_proportion: i,
            scan_proportion: s,
            read_modify_write_proportion: rmw,
            request_distribution: dist,
            max_scan_length: if kind == 'E' { 100 } else { 1000 },
            hashed_inserts: true,
        })
    }

    fn weights(&self) -> [(f64, OpKind); 5] {
        [
            (self.read_proportion, OpKind::Read),
            (self.update_proportion, OpKind::Update),
            (self.insert_proportion, OpKind::Insert),
            (self.scan_proportion, OpKind::Scan),
            (self.read_modify_write_proportion, OpKind::ReadModifyWrite),
        ]
    }

    fn validate(&self) -> Result<(), Error> {
        let invalid =
            |name: &'static str, reason: String| Err(Error::InvalidParameter { name, reason });
        if self.record_count == 0 {
            return invalid("record_count", "must be at least 1".into());
        }
        if self
            .record_count
            .checked_add(self.operation_count)
            .is_none()
        {
            return invalid(
                "operation_count",
                "record_count + operation_count overflows".into(),
            );
        }
        check_value_len(self.value_len)?;
        let weights = self.weights();
        if let Some((w, kind)) = weights.iter().find(|(w, _)| !(w.is_finite() && *w >= 0.0)) {
            return invalid(
                "proportion",
                format!(
                    "{} proportion {w} is not a finite non-negative number",
                    kind.name()
                ),
            );
        }
        if weights.iter().map(|(w, _)| w).sum::<f64>() <= 0.0 {
            return invalid("proportion", "all proportions are zero".into());
        }
        if self.max_scan_length == 0 {
            return invalid("max_scan_length", "must be at least 1".into());
        }
        Ok(())
    }

    /// The workload, after checking the parameters.
    pub fn build(self) -> Result<Workload, Error> {
        self.validate()?;
        let style = KeyStyle::Ycsb {
            hashed: self.hashed_inserts,
        };
        Ok(Workload {
            name: self.name.clone(),
            sync: false,
            seed: self.seed,
            value_len: self.value_len,
            loaded_records: self.record_count,
            pool: ValuePool::new(self.seed, ValuePool::len_for(self.value_len)),
            load: Plan::Sequential {
                kind: OpKind::Insert,
                style,
                count: self.record_count,
            },
            run: Plan::Ycsb(Box::new(self)),
        })
    }
}

fn check_value_len(value_len: usize) -> Result<(), Error> {
    if value_len > MAX_VALUE_LEN {
        return Err(Error::InvalidParameter {
            name: "value_len",
            reason: format!("{value_len} bytes is over the {MAX_VALUE_LEN}-byte limit"),
        });
    }
    Ok(())
}

/// YCSB core workload `kind` (`A`–`F`, either case) with `record_count` records loaded,
/// `operation_count` operations run and `value_len`-byte values; everything else as in YCSB's
/// workload file (see the module documentation).
///
/// ```
/// use kura_workload::{ycsb, Op, OpKind};
///
/// let w = ycsb('A', 1_000, 1_000_000, 1024, 42)?; // nothing is generated yet
/// assert_eq!(w.load().count(), 1_000);
/// let mut buf = Vec::new();
/// for op in w.run().take(10) {
///     let key: &[u8] = op.key().as_bytes();
///     match op {
///         Op::Read { .. } => { /* db.get(key) */ }
///         Op::Update { .. } => {
///             let value: &[u8] = op.value(w.values()).expect("updates carry a value");
///             assert_eq!(value.len(), 1024);
///             op.value_into(w.values(), &mut buf); // or copy it out
///         }
///         _ => unreachable!("workload A only reads and updates"),
///     }
///     assert!(key.starts_with(b"user"));
///     assert!(matches!(op.kind(), OpKind::Read | OpKind::Update));
/// }
/// # Ok::<(), kura_workload::Error>(())
/// ```
pub fn ycsb(
    kind: char,
    record_count: u64,
    operation_count: u64,
    value_len: usize,
    seed: u64,
) -> Result<Workload, Error> {
    let mut spec = YcsbSpec::core(kind)?;
    spec.record_count = record_count;
    spec.operation_count = operation_count;
    spec.value_len = value_len;
    spec.seed = seed;
    spec.build()
}

/// The db_bench workload `name` (one of [`DB_BENCH_WORKLOADS`]) over `num` keys with
/// `value_len`-byte values; see the module documentation for each one's phases.
///
/// ```
/// use kura_workload::{db_bench, Op};
///
/// let w = db_bench("fillsync", 100, 256, 7)?;
/// assert!(w.sync());
/// assert_eq!(w.load().count(), 0);
/// assert!(w.run().all(|op| matches!(op, Op::Insert { .. }) && op.value_len() == Some(256)));
///
/// let w = db_bench("readseq", 100, 256, 7)?;
/// assert_eq!(w.load().count(), 100); // fillseq first
/// assert!(matches!(w.run().next(), Some(Op::Scan { count: 100, .. })));
/// # Ok::<(), kura_workload::Error>(())
/// ```
pub fn db_bench(name: &str, num: u64, value_len: usize, seed: u64) -> Result<Workload, Error> {
    if num == 0 {
        return Err(Error::InvalidParameter {
            name: "num",
            reason: "must be at least 1".into(),
        });
    }
    check_value_len(value_len)?;
    let style = KeyStyle::DbBench;
    let fillseq = Plan::Sequential {
        kind: OpKind::Insert,
        style,
        count: num,
    };
    let random = |kind| Plan::Random {
        kind,
        style,
        key_space: num,
        count: num,
    };
    let (load, run) = match name {
        "fillseq" => (Plan::Empty, fillseq),
        "fillrandom" | "fillsync" => (Plan::Empty, random(OpKind::Insert)),
        "overwrite" => (fillseq, random(OpKind::Update)),
        "readrandom" => (fillseq, random(OpKind::Read)),
        "readseq" => (fillseq, Plan::FullScan { style, count: num }),
        "deleteseq" => (
            fillseq,
            Plan::Sequential {
                kind: OpKind::Delete,
                style,
                count: num,
            },
        ),
        "deleterandom" => (fillseq, random(OpKind::Delete)),
        _ => {
            return Err(Error::UnknownDbBench {
                name: name.to_string(),
                known: DB_BENCH_WORKLOADS.join(", "),
            })
        }
    };
    let loaded_records = if matches!(load, Plan::Empty) { 0 } else { num };
    Ok(Workload {
        name: name.to_string(),
        sync: name == "fillsync",
        seed,
        value_len,
        loaded_records,
        pool: ValuePool::new(seed, ValuePool::len_for(value_len)),
        load,
        run,
    })
}

/// How a phase's operations are generated (the recipe behind an [`Ops`]).
#[derive(Debug, Clone)]
enum Plan {
    Empty,
    /// `kind` on records `0..count` in order.
    Sequential {
        kind: OpKind,
        style: KeyStyle,
        count: u64,
    },
    /// `count` times `kind` on a record uniform in `0..key_space`.
    Random {
        kind: OpKind,
        style: KeyStyle,
        key_space: u64,
        count: u64,
    },
    /// One scan from record 0 over `count` records.
    FullScan {
        style: KeyStyle,
        count: u64,
    },
    Ycsb(Box<YcsbSpec>),
}

/// A benchmark workload: a name, flags, a value pool and the recipes of its load and run
/// phases. Cheap to clone (the pool is shared).
#[derive(Debug, Clone)]
pub struct Workload {
    name: String,
    sync: bool,
    seed: u64,
    value_len: usize,
    loaded_records: u64,
    pool: ValuePool,
    load: Plan,
    run: Plan,
}

impl Workload {
    /// The workload's name (`fillseq`, `ycsb-a`, …).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// True when every write should be synced (db_bench `fillsync`).
    pub fn sync(&self) -> bool {
        self.sync
    }

    /// The seed.
    pub fn seed(&self) -> u64 {
        self.seed
    }

    /// The size of every value written.
    pub fn value_len(&self) -> usize {
        self.value_len
    }

    /// How many distinct records the load phase leaves in the store.
    pub fn loaded_records(&self) -> u64 {
        self.loaded_records
    }

    /// The pool every [`Op`]'s value is a window of.
    pub fn values(&self) -> &ValuePool {
        &self.pool
    }

    /// The bytes `op` writes (see [`Op::value`]).
    pub fn value(&self, op: &Op) -> Option<&[u8]> {
        op.value(&self.pool)
    }

    /// The load phase's operations, from the start.
    pub fn load(&self) -> Ops {
        Ops::new(
            &self.load,
            self.value_len,
            self.pool.len(),
            self.seed ^ LOAD_SALT,
        )
    }

    /// The run phase's operations, from the start (generated as if the load phase had run).
    pub fn run(&self) -> Ops {
        Ops::new(
            &self.run,
            self.value_len,
            self.pool.len(),
            self.seed ^ RUN_SALT,
        )
    }

    /// The number of operations in the load phase.
    pub fn load_len(&self) -> u64 {
        plan_len(&self.load)
    }

    /// The number of operations in the run phase.
    pub fn run_len(&self) -> u64 {
        plan_len(&self.run)
    }
}

fn plan_len(plan: &Plan) -> u64 {
    match plan {
        Plan::Empty => 0,
        Plan::Sequential { count, .. } | Plan::Random { count, .. } => *count,
        Plan::FullScan { .. } => 1,
        Plan::Ycsb(spec) => spec.operation_count,
    }
}

/// An iterator over one phase's operations. Its state is O(1) whatever the operation count;
/// starting a `latest` run computes ζ(record_count) once (one `powf` per record, extended by
/// one per insert).
#[derive(Debug, Clone)]
pub struct Ops {
    remaining: u64,
    rng: Rng,
    values: ValueChooser,
    state: State,
}

#[derive(Debug, Clone)]
enum State {
    Empty,
    Sequential {
        next: u64,
        kind: OpKind,
        style: KeyStyle,
    },
    Random {
        kind: OpKind,
        style: KeyStyle,
        key_space: u64,
    },
    FullScan {
        style: KeyStyle,
        count: u64,
    },
    Ycsb(Box<YcsbRun>),
}

#[derive(Debug, Clone)]
struct YcsbRun {
    weights: [(f64, OpKind); 5],
    total_weight: f64,
    chooser: Chooser,
    next_insert: u64,
    scan_len: Uniform,
    style: KeyStyle,
}

#[derive(Debug, Clone)]
enum Chooser {
    Uniform(Uniform),
    Zipfian(ScrambledZipfian),
    Latest(SkewedLatest),
}

impl Ops {
    fn new(plan: &Plan, value_len: usize, pool_len: usize, seed: u64) -> Ops {
        let state = match plan {
            Plan::Empty => State::Empty,
            Plan::Sequential { kind, style, .. } => State::Sequential {
                next: 0,
                kind: *kind,
                style: *style,
            },
            Plan::Random {
                kind,
                style,
                key_space,
                ..
            } => State::Random {
                kind: *kind,
                style: *style,
                key_space: *key_space,
            },
            Plan::FullScan { style, count } => State::FullScan {
                style: *style,
                count: *count,
            },
            Plan::Ycsb(spec) => match YcsbRun::new(spec) {
                Some(run) => State::Ycsb(Box::new(run)),
                // Unreachable after `YcsbSpec::validate`; an empty phase rather than a panic.
                None => State::Empty,
            },
        };
        Ops {
            remaining: if matches!(state, State::Empty) {
                0
            } else {
                plan_len(plan)
            },
            rng: Rng::new(seed),
            values: ValueChooser::new(value_len, pool_len),
            state,
        }
    }

    /// How many operations are left.
    pub fn remaining(&self) -> u64 {
        self.remaining
    }

    fn make(&mut self, kind: OpKind, key: Key) -> Op {
        match kind {
            OpKind::Insert => Op::Insert {
                key,
                value: self.values.next(&mut self.rng),
            },
            OpKind::Update => Op::Update {
                key,
                value: self.values.next(&mut self.rng),
            },
            OpKind::ReadModifyWrite => Op::ReadModifyWrite {
                key,
                value: self.values.next(&mut self.rng),
            },
            OpKind::Read => Op::Read { key },
            OpKind::Delete => Op::Delete { key },
            OpKind::Scan => Op::Scan {
                start: key,
                count: 1,
            },
        }
    }
}

impl YcsbRun {
    fn new(spec: &YcsbSpec) -> Option<YcsbRun> {
        let records = spec.record_count;
        let chooser = match spec.request_distribution {
            RequestDistribution::Uniform => Chooser::Uniform(Uniform::new(0, records - 1).ok()?),
            RequestDistribution::Zipfian => {
                let expected_new =
                    (spec.operation_count as f64 * spec.insert_proportion * 2.0) as u64;
                let max = (records - 1).saturating_add(expected_new);
                Chooser::Zipfian(ScrambledZipfian::new(0, max).ok()?)
            }
            RequestDistribution::Latest => Chooser::Latest(SkewedLatest::new(records - 1).ok()?),
        };
        let weights = spec.weights();
        Some(YcsbRun {
            weights,
            total_weight: weights.iter().map(|(w, _)| w).sum(),
            chooser,
            next_insert: records,
            scan_len: Uniform::new(1, spec.max_scan_length).ok()?,
            style: KeyStyle::Ycsb {
                hashed: spec.hashed_inserts,
            },
        })
    }

    fn choose_kind(&self, rng: &mut Rng) -> OpKind {
        let mut x = rng.next_f64() * self.total_weight;
        let mut last = OpKind::Read;
        for &(w, kind) in &self.weights {
            if w > 0.0 {
                if x < w {
                    return kind;
                }
                x -= w;
                last = kind;
            }
        }
        last
    }

    /// YCSB's `nextKeynum`: a record by the request distribution, drawn again while it is not
    /// yet inserted.
    fn choose_record(&mut self, rng: &mut Rng) -> u64 {
        let last = self.next_insert - 1;
        loop {
            let n = match &mut self.chooser {
                Chooser::Uniform(u) => u.sample(rng),
                Chooser::Zipfian(z) => z.sample(rng),
                Chooser::Latest(l) => l.sample(rng, last),
            };
            if n <= last {
                return n;
            }
        }
    }
}

impl Iterator for Ops {
    type Item = Op;

    fn next(&mut self) -> Option<Op> {
        if self.remaining == 0 {
            return None;
        }
        self.remaining -= 1;
        let op = match &mut self.state {
            State::Empty => return None,
            State::Sequential { next, kind, style } => {
                let (kind, key) = (*kind, style.key(*next));
                *next += 1;
                self.make(kind, key)
            }
            State::Random {
                kind,
                style,
                key_space,
            } => {
                let (kind, style) = (*kind, *style);
                let n = self.rng.below(*key_space);
                self.make(kind, style.key(n))
            }
            State::FullScan { style, count } => Op::Scan {
                start: style.key(0),
                count: *count,
            },
            State::Ycsb(run) => {
                let kind = run.choose_kind(&mut self.rng);
                let style = run.style;
                match kind {
                    OpKind::Insert => {
                        let n = run.next_insert;
                        run.next_insert += 1;
                        self.make(kind, style.key(n))
                    }
                    OpKind::Scan => {
                        let start = style.key(run.choose_record(&mut self.rng));
                        let count = run.scan_len.sample(&mut self.rng);
                        Op::Scan { start, count }
                    }
                    _ => {
                        let key = style.key(run.choose_record(&mut self.rng));
                        self.make(kind, key)
                    }
                }
            }
        };
        Some(op)
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        match usize::try_from(self.remaining) {
            Ok(n) => (n, Some(n)),
            Err(_) => (usize::MAX, None),
        }
    }
}

impl std::iter::FusedIterator for Ops {}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::{BTreeSet, HashMap, HashSet};

    fn mix(w: &Workload) -> HashMap<OpKind, u64> {
        let mut m = HashMap::new();
        for op in w.run() {
            *m.entry(op.kind()).or_insert(0) += 1;
        }
        m
    }

    fn share(m: &HashMap<OpKind, u64>, kind: OpKind, total: u64) -> f64 {
        m.get(&kind).copied().unwrap_or(0) as f64 / total as f64
    }

    #[test]
    fn op_is_small() {
        assert!(
            std::mem::size_of::<Op>() <= 48,
            "{}",
            std::mem::size_of::<Op>()
        );
    }

    #[test]
    fn ycsb_mixes_follow_the_published_proportions() {
        let n = 50_000u64;
        let expect: [(char, &[(OpKind, f64)]); 6] = [
            ('A', &[(OpKind::Read, 0.5), (OpKind::Update, 0.5)]),
            ('B', &[(OpKind::Read, 0.95), (OpKind::Update, 0.05)]),
            ('C', &[(OpKind::Read, 1.0)]),
            ('D', &[(OpKind::Read, 0.95), (OpKind::Insert, 0.05)]),
            ('E', &[(OpKind::Scan, 0.95), (OpKind::Insert, 0.05)]),
            ('F', &[(OpKind::Read, 0.5), (OpKind::ReadModifyWrite, 0.5)]),
        ];
        for (kind, shares) in expect {
            let w = ycsb(kind, 1000, n, 100, 1).expect("workload");
            assert_eq!(w.run_len(), n);
            let m = mix(&w);
            assert_eq!(m.values().sum::<u64>(), n);
            assert_eq!(m.len(), shares.len(), "{kind}: {m:?}");
            for &(op, p) in shares {
                let got = share(&m, op, n);
                // Binomial standard deviation at n = 50 000 is at most 0.0023.
                assert!((got - p).abs() < 0.012, "{kind} {op:?}: {got} vs {p}");
            }
        }
    }

    #[test]
    fn ycsb_touches_only_inserted_records() {
        for kind in YCSB_WORKLOADS {
            let w = ycsb(*kind, 500, 5000, 16, 9).expect("workload");
            let mut present: BTreeSet<Key> = w.load().map(|op| *op.key()).collect();
            assert_eq!(present.len(), 500, "{kind}: hashed keys collide");
            assert_eq!(w.loaded_records(), 500);
            for op in w.run() {
                match op {
                    Op::Insert { key, .. } => assert!(present.insert(key), "{kind}: {key}"),
                    Op::Scan { start, count } => {
                        assert!(present.contains(&start), "{kind}: {start}");
                        assert!((1..=100).contains(&count), "{kind}: {count}");
                    }
                    other => assert!(present.contains(other.key()), "{kind}: {other:?}"),
                }
            }
        }
    }

    #[test]
    fn ycsb_d_reads_the_newest_records() {
        let w = ycsb('D', 10_000, 20_000, 8, 3).expect("workload");
        let mut order: HashMap<Key, u64> = HashMap::new();
        for (i, op) in w.load().enumerate() {
            order.insert(*op.key(), i as u64);
        }
        let (mut newest, mut recent_reads, mut reads) = (9_999u64, 0u64, 0u64);
        for op in w.run() {
            match op {
                Op::Insert { key, .. } => {
                    newest += 1;
                    order.insert(key, newest);
                }
                Op::Read { key } => {
                    reads += 1;
                    recent_reads += u64::from(newest - order[&key] < 100);
                }
                other => panic!("unexpected {other:?}"),
            }
        }
        // The newest 100 of 10 000+ records take about half the reads (theory: 51.8 %).
        let share = recent_reads as f64 / reads as f64;
        assert!(share > 0.45, "{share}");
    }

    #[test]
    fn ycsb_e_scan_lengths_are_uniform_up_to_100() {
        let w = ycsb('E', 1000, 20_000, 8, 5).expect("workload");
        let lens: Vec<u64> = w
            .run()
            .filter_map(|op| match op {
                Op::Scan { count, .. } => Some(count),
                _ => None,
            })
            .collect();
        let mean = lens.iter().sum::<u64>() as f64 / lens.len() as f64;
        assert!((mean - 50.5).abs() < 1.5, "{mean}");
        assert_eq!(lens.iter().min(), Some(&1));
        assert_eq!(lens.iter().max(), Some(&100));
    }

    #[test]
    fn zipfian_requests_are_skewed() {
        let w = ycsb('C', 10_000, 50_000, 8, 2).expect("workload");
        let mut counts: HashMap<Key, u32> = HashMap::new();
        for op in w.run() {
            *counts.entry(*op.key()).or_insert(0) += 1;
        }
        let mut c: Vec<u32> = counts.into_values().collect();
        c.sort_unstable_by(|a, b| b.cmp(a));
        let top1pct: u32 = c.iter().take(100).sum();
        // Theory: the 100 hottest ranks of YCSB's 10^10-item zipfian carry
        // Σ_{i≤100} i^-0.99 / ζ(10^10) ≈ 20 % (21.4 % measured); uniform would give them 1-2 %.
        assert!(f64::from(top1pct) / 50_000.0 > 0.17, "{top1pct}");
    }

    #[test]
    fn workloads_are_deterministic_per_seed() {
        let a: Vec<Op> = ycsb('A', 100, 1000, 64, 1).expect("w").run().collect();
        let b: Vec<Op> = ycsb('a', 100, 1000, 64, 1).expect("w").run().collect();
        let c: Vec<Op> = ycsb('A', 100, 1000, 64, 2).expect("w").run().collect();
        assert_eq!(a, b);
        assert_ne!(a, c);
        let w = db_bench("fillrandom", 100, 64, 1).expect("w");
        assert_eq!(w.run().collect::<Vec<_>>(), w.run().collect::<Vec<_>>());
    }

    #[test]
    fn huge_operation_counts_cost_nothing_up_front() {
        let w = ycsb('B', 1000, 1_000_000_000_000, 1 << 20, 1).expect("workload");
        let mut ops = w.run();
        assert_eq!(ops.remaining(), 1_000_000_000_000);
        for op in ops.by_ref().take(100) {
            if let Some(v) = w.value(&op) {
                assert_eq!(v.len(), 1 << 20);
            }
        }
        assert_eq!(ops.remaining(), 1_000_000_000_000 - 100);
    }

    #[test]
    fn db_bench_phases() {
        let num = 1000u64;
        let seq = db_bench("fillseq", num, 100, 1).expect("w");
        let keys: Vec<Key> = seq.run().map(|op| *op.key()).collect();
        assert_eq!(seq.load_len(), 0);
        assert_eq!(keys.len(), 1000);
        assert!(keys.windows(2).all(|w| w[0] < w[1]));
        assert_eq!(keys[0].as_bytes(), b"0000000000000000");
        assert!(!seq.sync());

        let sync = db_bench("fillsync", num, 100, 1).expect("w");
        assert!(sync.sync());
        let distinct: HashSet<Key> = sync.run().map(|op| *op.key()).collect();
        // num draws from num keys: about 1 - 1/e of them distinct.
        assert!((580..=680).contains(&distinct.len()), "{}", distinct.len());

        for (name, kind) in [
            ("overwrite", OpKind::Update),
            ("readrandom", OpKind::Read),
            ("deleteseq", OpKind::Delete),
            ("deleterandom", OpKind::Delete),
        ] {
            let w = db_bench(name, num, 100, 1).expect("w");
            assert_eq!(w.load().count(), 1000, "{name}");
            assert_eq!(w.loaded_records(), num);
            assert!(w.run().all(|op| op.kind() == kind), "{name}");
            assert_eq!(w.run_len(), num);
        }
        let scan: Vec<Op> = db_bench("readseq", num, 100, 1).expect("w").run().collect();
        assert_eq!(scan.len(), 1);
        assert_eq!(scan[0].key().as_bytes(), b"0000000000000000");
    }

    #[test]
    fn values_have_the_requested_size_and_vary() {
        let w = db_bench("fillrandom", 200, 4096, 1).expect("w");
        let mut buf = Vec::new();
        let mut firsts = HashSet::new();
        for op in w.run() {
            assert!(op.value_into(w.values(), &mut buf));
            assert_eq!(buf.len(), 4096);
            firsts.insert(buf[..8].to_vec());
        }
        assert!(firsts.len() > 190);
        let read = Op::Read {
            key: KeyStyle::DbBench.key(0),
        };
        assert!(!read.value_into(w.values(), &mut buf));
        assert!(buf.is_empty());
        assert!(w.value(&read).is_none());
        assert!(!read.is_write());
        // The largest size the slides use.
        let big = db_bench("fillseq", 4, 1 << 20, 1).expect("w");
        assert!(big
            .run()
            .all(|op| big.value(&op).map(<[u8]>::len) == Some(1 << 20)));
    }

    #[test]
    fn bad_parameters_are_typed_errors() {
        assert!(matches!(
            ycsb('G', 10, 10, 10, 0),
            Err(Error::UnknownYcsb('G'))
        ));
        assert!(matches!(
            db_bench("fillfast", 10, 10, 0),
            Err(Error::UnknownDbBench { .. })
        ));
        assert!(matches!(
            ycsb('A', 0, 10, 10, 0),
            Err(Error::InvalidParameter {
                name: "record_count",
                ..
            })
        ));
        assert!(db_bench("fillseq", 0, 10, 0).is_err());
        assert!(db_bench("fillseq", 10, MAX_VALUE_LEN + 1, 0).is_err());
        let mut spec = YcsbSpec::core('A').expect("spec");
        spec.read_proportion = f64::NAN;
        assert!(spec.clone().build().is_err());
        spec.read_proportion = 0.0;
        spec.update_proportion = 0.0;
        assert!(spec.build().is_err());
    }

    #[test]
    fn custom_spec_uniform_and_ordered() {
        let mut spec = YcsbSpec::core('B').expect("spec");
        spec.request_distribution = RequestDistribution::Uniform;
        spec.hashed_inserts = false;
        spec.record_count = 100;
        spec.operation_count = 20_000;
        let w = spec.build().expect("w");
        let mut counts = [0u32; 100];
        for op in w.run() {
            let digits = std::str::from_utf8(&op.key().as_bytes()[4..]).expect("ascii");
            let n: usize = digits.parse().expect("number");
            counts[n] += 1;
        }
        // Uniform over 100 records: 200 each on average, none starved or hot.
        assert!(
            counts.iter().all(|&c| (120..=280).contains(&c)),
            "{counts:?}"
        );
    }
}
