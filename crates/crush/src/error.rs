//! Typed errors for decoding and checking CRUSH maps.

use thiserror::Error;

/// Why a map could not be decoded or used.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum CrushError {
    /// The bytes end before the field.
    #[error("crush map truncated at byte {offset}: need {need} more bytes for {what}")]
    Truncated {
        /// Field being read.
        what: &'static str,
        /// Where it starts.
        offset: usize,
        /// Bytes it needs.
        need: usize,
    },
    /// Not a CRUSH map.
    #[error("bad crush map magic {0:#010x} (expected 0x00010000)")]
    BadMagic(u32),
    /// A count larger than the bytes left could hold, or beyond a sane bound.
    #[error("crush map field {what} = {value} is too large (at most {max} here)")]
    TooLarge {
        /// Field.
        what: &'static str,
        /// Value read.
        value: u64,
        /// The bound it broke.
        max: u64,
    },
    /// A negative count or id where none may be.
    #[error("crush map field {what} = {value} is negative")]
    Negative {
        /// Field.
        what: &'static str,
        /// Value read.
        value: i64,
    },
    /// A bucket algorithm Ceph does not define.
    #[error("bucket at index {index} has unsupported algorithm {alg}")]
    UnknownAlgorithm {
        /// Bucket index.
        index: usize,
        /// Algorithm number.
        alg: u32,
    },
    /// A rule whose ruleset differs from its id (encodings older than Luminous).
    #[error(
        "rule {rule} has ruleset {ruleset}; crush ruleset != rule id, the encoding is too old"
    )]
    RulesetMismatch {
        /// Rule id.
        rule: u32,
        /// Ruleset read.
        ruleset: u8,
    },
    /// A bucket lists a bucket id that does not exist.
    #[error("bucket {bucket} contains item {item}, which is not a bucket in this map")]
    DanglingItem {
        /// Containing bucket.
        bucket: i32,
        /// Missing item.
        item: i32,
    },
    /// The hierarchy loops back on itself.
    #[error("bucket hierarchy has a cycle: bucket {bucket} contains its ancestor {item}")]
    Cycle {
        /// Bucket closing the cycle.
        bucket: i32,
        /// The ancestor it contains.
        item: i32,
    },
    /// Anything else inconsistent.
    #[error("invalid crush map: {0}")]
    Invalid(String),
    /// The text form of a map does not parse or compile.
    #[error("crush map text, line {line} column {column}: {message}")]
    Parse {
        /// Line, from 1.
        line: usize,
        /// Column (characters), from 1.
        column: usize,
        /// What is wrong.
        message: String,
    },
    /// A rule that does not exist.
    #[error("rule {0} does not exist in this map")]
    NoSuchRule(u32),
}
