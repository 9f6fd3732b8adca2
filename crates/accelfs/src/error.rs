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
    /// A metadata structure decodes but says something impossible (bad inode, broken extent
    /// chain, duplicate directory entry).
    #[error("corrupt metadata: {0}")]
    Corrupt(String),
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
    #[error("{0}: no such file or directory")]
    NotFound(String),
    #[error("{0}: already exists")]
    Exists(String),
    #[error("{0}: not a directory")]
    NotADirectory(String),
    #[error("{0}: is a directory")]
    IsADirectory(String),
    #[error("{0}: directory not empty")]
    NotEmpty(String),
    #[error("{path}: invalid name: {source}")]
    BadName {
        path: String,
        source: crate::dir::NameError,
    },
    #[error("no space left on the device: {0}")]
    NoSpace(String),
    #[error("{0}: file too large")]
    FileTooLarge(String),
    /// Nothing is written: the file system was mounted read-only
    /// (`FileSystem::mount_read_only`), or a flush or journal commit failed earlier, so that
    /// nothing that was durable can be damaged. Reads still work. The text says which.
    #[error("file system is read-only: {0}")]
    ReadOnly(String),
    /// The handle was opened without the access the operation needs.
    #[error("{0}")]
    BadHandle(String),
    /// Not allowed for this kind of inode (a hard link to a directory).
    #[error("{0}: operation not permitted")]
    NotPermitted(String),
    /// The image or the file system does not support this (a `posix` feature on an image made
    /// before it, an attribute namespace AccelFS does not store).
    #[error("{0}: not supported")]
    Unsupported(String),
    /// The extended attribute does not exist.
    #[error("{0}: no such attribute")]
    NoAttribute(String),
    /// An extended-attribute name longer than 255 bytes.
    #[error("{0}: attribute name too long")]
    AttributeNameTooLong(String),
    /// An extended-attribute value longer than 64 KiB.
    #[error("{0}: attribute value too large")]
    AttributeTooLarge(String),
    /// `readlink` of something that is not a symbolic link.
    #[error("{0}: not a symbolic link")]
    NotASymlink(String),
    /// The link count would overflow.
    #[error("{0}: too many links")]
    TooManyLinks(String),
}

impl FsError {
    /// The POSIX errno that best describes this error (for FUSE and the CLI's exit codes).
    pub fn errno(&self) -> i32 {
        match self {
            FsError::Device(_) | FsError::Format(_) => libc::EIO,
            FsError::BadName {
                source: crate::dir::NameError::TooLong(_),
                ..
            } => libc::ENAMETOOLONG,
            FsError::Invalid(_) | FsError::BadName { .. } => libc::EINVAL,
            FsError::NotFound(_) => libc::ENOENT,
            FsError::Exists(_) => libc::EEXIST,
            FsError::NotADirectory(_) => libc::ENOTDIR,
            FsError::IsADirectory(_) => libc::EISDIR,
            FsError::NotEmpty(_) => libc::ENOTEMPTY,
            FsError::NoSpace(_) => libc::ENOSPC,
            FsError::FileTooLarge(_) => libc::EFBIG,
            FsError::ReadOnly(_) => libc::EROFS,
            FsError::BadHandle(_) => libc::EBADF,
            FsError::NotPermitted(_) => libc::EPERM,
            FsError::Unsupported(_) => libc::EOPNOTSUPP,
            FsError::NoAttribute(_) => libc::ENODATA,
            FsError::AttributeNameTooLong(_) => libc::ERANGE,
            FsError::AttributeTooLarge(_) => libc::E2BIG,
            FsError::NotASymlink(_) => libc::EINVAL,
            FsError::TooManyLinks(_) => libc::EMLINK,
        }
    }
}
