//! Errors found while decoding on-disk structures: each names the block and what is wrong.

/// A structure on the device does not decode as AccelFS.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum FormatError {
    #[error("block {block}: not a{article} {kind} block (magic {found:#010x}, expected {expected:#010x})", article = if kind.starts_with(['a','e','i','o','u']) { "n" } else { "" })]
    BadMagic {
        block: u64,
        kind: &'static str,
        found: u32,
        expected: u32,
    },
    #[error("block {block} ({kind}): checksum mismatch (stored {stored:#010x}, computed {computed:#010x})")]
    BadChecksum {
        block: u64,
        kind: &'static str,
        stored: u32,
        computed: u32,
    },
    #[error("block {block} ({kind}) says it is block {claims}: a misdirected write")]
    Misdirected {
        block: u64,
        kind: &'static str,
        claims: u64,
    },
    #[error("superblock: {0}")]
    BadSuperblock(String),
    #[error("no AccelFS on this device: {0}")]
    NotAccelFs(String),
}

/// Errors of AccelFS operations.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum FsError {
    /// The device failed or refused a command.
    #[error("device: {0}")]
    Device(#[from] kura_engine::DeviceError),
    /// What is on the device does not decode as AccelFS.
    #[error(transparent)]
    Format(#[from] FormatError),
    /// A parameter or request that cannot work.
    #[error("{0}")]
    Invalid(String),
}
